//! Functionalisation of in-place writes through views, the way torch's own
//! functionalisation pass does it (training IR keeps `y[:, 0] = 0`,
//! `y.t()[2].mul_(2)` as in-place ops on views of `y`).
//!
//! Every view a node makes is recorded with its direct base and the view op
//! with its parameters ([`ViewStep`]). An in-place op computes the view's new
//! value functionally; [`Importer::write_inplace`] then rebuilds the base by
//! walking the chain of views back to the root storage, applying at each step
//! the inverse ("scatter") of the view op — `select` → `select_scatter`,
//! `slice` → `slice_scatter`, `permute` → the inverse permutation, a reshape →
//! a reshape back, `diagonal` → `diagonal_scatter` — rebinds the root's name
//! to the result, and re-derives from it every other view of the same storage
//! that is read later (views of views in creation order, parents first), so
//! later reads see the write. Views nobody reads again are left stale: they
//! cost nothing and DCE would drop them anyway.
//!
//! What cannot be expressed fails at compile time: a write through `expand`
//! (torch refuses it too) or `as_strided`, and a read, after a write, of a view
//! whose relation to its base kiln does not know (`as_strided`, or a
//! `reshape`/`contiguous` torch may have made as a copy). Writes nobody
//! observes through another alias are always fine: the mutated name is simply
//! rebound.

use super::importer::{dim_at, invalid, unsupported, Importer, R};
use super::ops::{diagonal_scatter_value, diagonal_value, select_scatter_value, slice_scatter_value, slice_value};
use kiln_ir::{DType, Dim, EntityRef, Op, TensorType, ValueId};
use std::collections::{HashMap, HashSet};

/// How a view is computed from its direct base.
#[derive(Clone, Debug)]
pub(crate) enum ViewStep {
    /// Same elements, same shape (`alias`, `detach`, the result of an in-place
    /// op, a reshape or permute that changes nothing).
    Identity,
    /// A reshape to the view's own shape (`view`, `unsqueeze`, `flatten`, ...).
    Reshape,
    /// `permute` and its spellings (`t`, `transpose`, `movedim`).
    Permute(Vec<usize>),
    /// `slice`/`narrow`/a `split` piece; bounds normalised as the forward
    /// slice used them. `end: None`: a symbolic end (the view's length is its
    /// type's).
    Slice { axis: usize, start: i64, end: Option<i64>, step: i64 },
    /// `select`/an `unbind` piece.
    Select { axis: usize, index: i64 },
    /// `diagonal(offset, dim1, dim2)`.
    Diagonal { offset: i64, dim1: usize, dim2: usize },
    /// `expand`: re-derivable, but not writable (several elements share one).
    Expand,
    /// A view kiln can neither write through nor re-derive; the text names
    /// it as a noun phrase ("an `as_strided` view").
    Opaque(String),
}

impl ViewStep {
    /// A noun phrase for error messages ("an expand").
    fn describe(&self) -> String {
        match self {
            ViewStep::Identity => "an alias".into(),
            ViewStep::Reshape => "a reshape".into(),
            ViewStep::Permute(p) => format!("a permute {p:?}"),
            ViewStep::Slice { axis, .. } => format!("a slice of dim {axis}"),
            ViewStep::Select { axis, index } => format!("a select({axis}, {index})"),
            ViewStep::Diagonal { .. } => "a diagonal".into(),
            ViewStep::Expand => "an expand".into(),
            ViewStep::Opaque(what) => what.clone(),
        }
    }
}

struct View {
    base: String,
    step: ViewStep,
    /// Creation order: a view is always made after its base.
    order: usize,
}

/// The views of the graph being converted (program names → how they were made).
#[derive(Default)]
pub(crate) struct ViewTable {
    views: HashMap<String, View>,
    next: usize,
}

impl Importer<'_> {
    /// Records that program value `view` is a view of `base` made by `step`.
    /// The table stays a forest: a record that would close a cycle (a name
    /// reused as its own base, which torch's SSA names never are) is dropped,
    /// so that every walk to a root ends.
    pub fn record_view(&mut self, view: &str, base: &str, step: ViewStep) {
        let mut name = base;
        while name != view {
            match self.scope.views.views.get(name) {
                Some(v) => name = &v.base,
                None => break,
            }
        }
        if name == view {
            return;
        }
        let order = self.scope.views.next;
        self.scope.views.next += 1;
        self.scope.views.views.insert(view.to_string(), View { base: base.to_string(), step, order });
    }

    /// Forgets that `view` is a view: the `*_copy` form of a view op puts
    /// the view's value into new storage, which no write through its input
    /// (or into it) may reach.
    pub fn forget_view(&mut self, view: &str) {
        self.scope.views.views.remove(view);
    }

    /// The storage `name` is a view of (itself when it is not a view).
    fn view_root<'a>(&'a self, mut name: &'a str) -> &'a str {
        while let Some(v) = self.scope.views.views.get(name) {
            name = &v.base;
        }
        name
    }

    /// Whether a write into `mutated` is seen by nothing but its own name:
    /// no other view of its storage, and not a parameter's, buffer's or
    /// input's storage (whose final value is the state's next one).
    pub fn write_is_private(&self, mutated: &str) -> bool {
        let root = self.view_root(mutated);
        root == mutated
            && !self.is_module_storage(root)
            && !self.scope.views.views.keys().any(|name| name != mutated && self.view_root(name) == root)
    }

    /// Functionalises an in-place op that wrote `result` into `mutated`: the
    /// write is propagated to the storage `mutated` views and to every other
    /// view of it read later (see the module docs).
    pub fn write_inplace(&mut self, mutated: &str, result: ValueId) -> R<()> {
        if self.value(mutated).ok() == Some(result) {
            return Ok(()); // `detach_` and the like: nothing changed.
        }
        let root = self.view_root(mutated).to_string();
        let mut group: Vec<(&str, &View)> = self
            .scope
            .views
            .views
            .iter()
            .filter(|(name, _)| self.view_root(name) == root)
            .map(|(n, v)| (n.as_str(), v))
            .collect();
        group.sort_by_key(|(_, v)| v.order);
        let observers: Vec<String> = group
            .iter()
            .map(|(name, _)| *name)
            .chain(std::iter::once(root.as_str()))
            // A parameter's, buffer's or input's storage is also observed
            // after the last node: its final value is the state's next one.
            .filter(|&name| {
                name != mutated && (self.read_later(name) || (name == root && self.is_module_storage(name)))
            })
            .map(str::to_string)
            .collect();
        if observers.is_empty() {
            self.bind_name(mutated, result);
            return Ok(());
        }
        // Views to re-derive: those read later and the views they are made from.
        let mut stale: HashSet<String> = HashSet::new();
        for name in &observers {
            let mut name = name.as_str();
            while let Some(v) = self.scope.views.views.get(name) {
                if name != mutated {
                    stale.insert(name.to_string());
                }
                name = &v.base;
            }
        }
        let rederive: Vec<(String, String, ViewStep)> = group
            .iter()
            .filter(|(name, _)| stale.contains(*name))
            .map(|(name, v)| (name.to_string(), v.base.clone(), v.step.clone()))
            .collect();

        // Back to the root: each base gets the new view scattered into it.
        let mut value = result;
        let mut name = mutated.to_string();
        while let Some(v) = self.scope.views.views.get(&name) {
            let (base, step) = (v.base.clone(), v.step.clone());
            // A complex base is a pair of values, not one to scatter into.
            if self.complex(&base).is_some() {
                return unsupported(format!(
                    "in-place update of `{mutated}` writes through `{name}`, {} of the complex `{base}`, which kiln cannot scatter back",
                    step.describe()
                ));
            }
            let old_base = self.value(&base)?;
            value = match scatter_into(self, &step, old_base, value)? {
                Some(v) => v,
                None => {
                    return unsupported(format!(
                        "in-place update of `{mutated}` writes through `{name}`, {} of `{base}`, which kiln cannot scatter back; `{}` reads the storage afterwards",
                        step.describe(),
                        observers[0],
                    ))
                }
            };
            self.bind_name(&base, value);
            name = base;
        }
        self.bind_name(mutated, result);

        for (view, base, step) in rederive {
            let parent = self.value(&base)?;
            let ty = self.type_of(&view)?;
            match derive(self, &step, parent, ty)? {
                Some(v) => self.bind_name(&view, v),
                None => {
                    return unsupported(format!(
                        "`{view}` ({} of `{base}`) is read after an in-place update of `{mutated}`; kiln cannot re-derive it from the updated storage",
                        step.describe()
                    ))
                }
            }
        }
        Ok(())
    }
}

/// `base` with `src` written where `step` views it; `None` when the view is
/// not writable.
fn scatter_into(imp: &mut Importer, step: &ViewStep, base: ValueId, src: ValueId) -> R<Option<ValueId>> {
    let base_ty = imp.ty(base).clone();
    let src = imp.cast(src, base_ty.dtype);
    Ok(Some(match step {
        ViewStep::Identity => src,
        ViewStep::Reshape => reshape_to(imp, src, base_ty.shape),
        ViewStep::Permute(perm) => {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            imp.push_typed(Op::Permute { perm: inverse }, vec![src], base_ty)
        }
        &ViewStep::Slice { axis, start, step, .. } => slice_scatter_value(imp, base, src, axis, start, step)?,
        &ViewStep::Select { axis, index } => select_scatter_value(imp, base, src, axis, index)?,
        &ViewStep::Diagonal { offset, dim1, dim2 } => diagonal_scatter_value(imp, base, src, offset, dim1, dim2)?,
        ViewStep::Expand | ViewStep::Opaque(_) => return Ok(None),
    }))
}

/// The view `step` of `base` again, of type `ty`; `None` when kiln cannot
/// re-derive it.
fn derive(imp: &mut Importer, step: &ViewStep, base: ValueId, ty: TensorType) -> R<Option<ValueId>> {
    Ok(Some(match step {
        ViewStep::Identity => base,
        ViewStep::Reshape => reshape_to(imp, base, ty.shape),
        ViewStep::Permute(perm) => imp.push_typed(Op::Permute { perm: perm.clone() }, vec![base], ty),
        &ViewStep::Slice { axis, start, end: Some(end), step } => slice_value(imp, base, axis, start, end, step, ty),
        &ViewStep::Slice { axis, start, end: None, step } => {
            // A symbolic end: the positions `start + step * i` for the view's length.
            let len = dim_at(&ty, axis, "a sliced view")?;
            let idx = imp.push_typed(
                Op::Arange { start: start as f64, step: step as f64, len: len.clone(), dtype: DType::I64 },
                Vec::new(),
                TensorType::new(DType::I64, vec![len]),
            );
            imp.push_typed(Op::Gather { axis }, vec![base, idx], ty)
        }
        &ViewStep::Select { axis, index } => {
            let mut shape = imp.ty(base).shape.clone();
            match shape.get_mut(axis) {
                Some(d) => *d = Dim::Const(1),
                None => return invalid(format!("a select of dim {axis} of a rank-{} tensor", shape.len())),
            }
            let end = if index == -1 { i64::MAX } else { index.saturating_add(1) };
            let s = imp.push_typed(
                Op::Slice { axis, start: index, end, step: 1 },
                vec![base],
                TensorType::new(ty.dtype, shape),
            );
            reshape_to(imp, s, ty.shape)
        }
        &ViewStep::Diagonal { offset, dim1, dim2 } => diagonal_value(imp, base, offset, dim1, dim2, &ty)?,
        ViewStep::Expand => {
            if imp.ty(base).shape == ty.shape {
                base
            } else {
                imp.push_typed(Op::Expand { shape: ty.shape.clone() }, vec![base], ty)
            }
        }
        ViewStep::Opaque(_) => return Ok(None),
    }))
}

fn reshape_to(imp: &mut Importer, v: ValueId, shape: Vec<Dim>) -> ValueId {
    let ty = imp.ty(v).clone();
    if ty.shape == shape {
        return v;
    }
    imp.push_typed(Op::Reshape { shape: shape.clone() }, vec![v], TensorType::new(ty.dtype, shape))
}

/// Whether torch's tensor is contiguous (its `is_contiguous()`: row-major
/// strides, size-1 dims ignored, empty tensors always), from its `sizes` and
/// `strides`; `None` when that cannot be decided. Symbolic strides are
/// compared by evaluating both sides at a few symbol values.
pub(crate) fn torch_contiguous(imp: &mut Importer, name: &str) -> Option<bool> {
    let tensor_values = imp.scope.tensor_values;
    let meta = tensor_values.get(name)?;
    let sizes = meta.sizes.iter().map(|s| imp.sym_expr(s).ok()).collect::<Option<Vec<Dim>>>()?;
    let strides = meta.strides.iter().map(|s| imp.sym_expr(s).ok()).collect::<Option<Vec<Dim>>>()?;
    if sizes.len() != strides.len() {
        return None;
    }
    if sizes.iter().any(|d| d.as_const() == Some(0)) {
        return Some(true);
    }
    let mut expected = Dim::Const(1);
    for (size, stride) in sizes.iter().zip(&strides).rev() {
        if size.as_const() != Some(1) {
            let samples: [fn(kiln_ir::SymbolId) -> i64; 3] =
                [|s| 7 + 2 * s.index() as i64, |s| 13 + 3 * s.index() as i64, |s| 29 + 5 * s.index() as i64];
            if samples.iter().any(|f| stride.eval(f) != expected.eval(f)) {
                return Some(false);
            }
        }
        expected = Dim::mul(expected, size.clone());
    }
    Some(true)
}
