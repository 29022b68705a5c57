//! Complex operands of real ops, converted by running the real op's own
//! handler on the parts:
//!
//! - ops linear in their data (views, copies, gathers, scatters, concatenation,
//!   padding, cumulative sums) run once per part, fill values split into
//!   their real and imaginary parts;
//! - bilinear ops (matrix products, `dot`, `outer`, `kron`, `cross`,
//!   convolutions) run once per pair of parts:
//!   `f(a, b) = f(ar, br) − f(ai, bi) + i (f(ar, bi) + f(ai, br))`, and the
//!   `add*` forms add `β·self` to `α·f(a, b)`;
//! - ops that only look at whether an element is nonzero (`any`, `nonzero`,
//!   the logical ops) run on `re ≠ 0 ∨ im ≠ 0`, the norms on `|z|`, a cast to
//!   a real dtype on the real part;
//! - `var`/`std` add the parts' variances (`E|z − μ|² = var re + var im`).

use crate::import::importer::{invalid, output_names, tensor_names, unsupported, Importer, Scalar, COMPLEX_SCOPE, R};
use crate::pt2::program::{Arg, NamedArg, Node};
use kiln_ir::{BinaryOp as B, DType, Dim, Op, ReduceKind, TensorType, UnaryOp as U, ValueId};

use super::fft::{bind_out, cast_parts, mul, operand, Parts};

/// Ops linear in their complex operands, all of them together (views,
/// copies, gathers and scatters, concatenation, cumulative sums), or
/// applied to each part on its own (`nan_to_num`): each part runs through
/// the real op.
pub(super) const PER_PART: &[&str] = &[
    "diag",
    "diagonal",
    "diag_embed",
    "diagflat",
    "linalg_diagonal",
    "tril",
    "triu",
    "roll",
    "rot90",
    "tile",
    "repeat_interleave",
    "take",
    "take_along_dim",
    "gather",
    "fliplr",
    "flipud",
    "ravel",
    "view_as",
    "reshape_as",
    "expand_as",
    "broadcast_to",
    "broadcast_tensors",
    "atleast_1d",
    "atleast_2d",
    "atleast_3d",
    "squeeze_copy",
    "unsqueeze_copy",
    "view_copy",
    "permute_copy",
    "transpose_copy",
    "t_copy",
    "alias_copy",
    "as_strided_copy",
    "diagonal_copy",
    "expand_copy",
    "narrow_copy",
    "unbind_copy",
    "split_with_sizes_copy",
    "unfold_copy",
    "unfold",
    "as_strided",
    "unsafe_chunk",
    "unsafe_split",
    "hsplit",
    "vsplit",
    "dsplit",
    "positive",
    "cumsum",
    "diff",
    "sum_to_size",
    "fft_fftshift",
    "fft_ifftshift",
    "pixel_shuffle",
    "pixel_unshuffle",
    "channel_shuffle",
    "im2col",
    "col2im",
    "mT",
    "numpy_T",
    "trace",
    "nan_to_num",
    "hstack",
    "vstack",
    "dstack",
    "column_stack",
    "block_diag",
    "cartesian_prod",
    "combinations",
    "meshgrid",
    "gradient",
    "zeros_like",
    "empty_like",
    "new_zeros",
    "new_empty",
    "new_empty_strided",
    "masked_select",
    "index_put",
    "_unsafe_index_put",
    "_unsafe_masked_index_put_accumulate",
    "scatter",
    "scatter_add",
    "index_add",
    "index_copy",
    "slice_scatter",
    "select_scatter",
    "diagonal_scatter",
    "as_strided_scatter",
    "masked_scatter",
    "put",
    "cumulative_trapezoid",
    "trapz",
    "trapezoid",
    "lerp",
    "stack",
    "_chunk_cat",
    "resize_as",
    "zero",
];

/// Ops whose second operand only lends its shape: with a real result, a
/// complex `other` is read as its real part (the same shape).
const SHAPE_OF: &[&str] = &["view_as", "reshape_as", "expand_as"];

/// Ops that write a fill value (their argument named here): the real pass
/// writes its real part, the imaginary pass its imaginary part.
const FILL: &[(&str, &str)] = &[
    ("fill", "value"),
    ("masked_fill", "value"),
    ("index_fill", "value"),
    ("full_like", "fill_value"),
    ("new_full", "fill_value"),
    ("constant_pad_nd", "value"),
    ("pad", "value"),
    ("_unsafe_masked_index", "fill"),
    ("scalar_tensor", "s"),
    ("full", "fill_value"),
];

/// Ops that make a tensor without reading one (the complex dtype from the
/// output): the real op makes each part.
const CREATE: &[&str] = &["empty", "empty_permuted", "empty_strided", "zeros", "resize", "detach"];

/// Bilinear ops: (name, first operand, second operand).
const BILINEAR: &[(&str, &str, &str)] = &[
    ("mm", "self", "mat2"),
    ("bmm", "self", "mat2"),
    ("matmul", "self", "other"),
    ("mv", "self", "vec"),
    ("dot", "self", "tensor"),
    ("vdot", "self", "other"),
    ("inner", "self", "other"),
    ("outer", "self", "vec2"),
    ("ger", "self", "vec2"),
    ("kron", "self", "other"),
    ("tensordot", "self", "other"),
    ("cross", "self", "other"),
    ("linalg_cross", "self", "other"),
    ("linalg_vecdot", "x", "y"),
    ("linear", "input", "weight"),
    ("convolution", "input", "weight"),
    ("conv1d", "input", "weight"),
    ("conv2d", "input", "weight"),
    ("conv3d", "input", "weight"),
    ("conv_transpose1d", "input", "weight"),
    ("conv_transpose2d", "input", "weight"),
    ("conv_transpose3d", "input", "weight"),
];

/// `β·self + α·(product)`: (name, the product's op, its operands).
const ADD_BILINEAR: &[(&str, &str, &str, &str)] = &[
    ("addmm", "mm", "mat1", "mat2"),
    ("addmv", "mv", "mat", "vec"),
    ("addr", "outer", "vec1", "vec2"),
    ("baddbmm", "bmm", "batch1", "batch2"),
    ("addbmm", "bmm", "batch1", "batch2"),
];

/// Ops that see only whether each element is nonzero.
const TRUTH: &[&str] = &[
    "any",
    "all",
    "count_nonzero",
    "nonzero",
    "nonzero_static",
    "argwhere",
    "logical_not",
    "logical_and",
    "logical_or",
    "logical_xor",
];

/// Converts `n` if it is one of the ops here; `None` when it is not.
pub(super) fn convert(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> Option<R<()>> {
    // The trapezoid rules are bilinear in (y, x) when x is complex too.
    if matches!(name, "trapz" | "trapezoid" | "cumulative_trapezoid") {
        let x_complex = matches!(imp.arg(n, "x"), Some(Arg::Tensor(t)) if imp.complex(t).is_some());
        if x_complex {
            return Some(bilinear_op(imp, n, name, overload, "y", "x"));
        }
    }
    if SHAPE_OF.contains(&name) && !complex_output(imp, n) {
        return Some(on_real_operands(imp, n, name, overload, real_part));
    }
    if PER_PART.contains(&name) || CREATE.contains(&name) {
        return Some(per_part(imp, n, name, overload, None));
    }
    if let Some(&(_, arg)) = FILL.iter().find(|(op, _)| *op == name) {
        return Some(per_part(imp, n, name, overload, Some(arg)));
    }
    if let Some(&(_, a, b)) = BILINEAR.iter().find(|(op, ..)| *op == name) {
        return Some(bilinear_op(imp, n, name, overload, a, b));
    }
    if name == "einsum" {
        return Some(match imp.arg(n, "tensors") {
            Some(Arg::Tensors(ts)) if ts.len() == 2 => bilinear_op(imp, n, name, overload, "tensors.0", "tensors.1"),
            Some(Arg::Tensors(ts)) if ts.len() == 1 => per_part(imp, n, name, overload, None),
            _ => unsupported(format!("`einsum` of three or more operands with a complex one; {COMPLEX_SCOPE}")),
        });
    }
    if name == "linalg_multi_dot" {
        return Some(match imp.arg(n, "tensors") {
            Some(Arg::Tensors(ts)) if ts.len() == 2 => bilinear_op(imp, n, name, overload, "tensors.0", "tensors.1"),
            _ => unsupported(format!(
                "`linalg_multi_dot` of other than two operands with a complex one; {COMPLEX_SCOPE}"
            )),
        });
    }
    if let Some(&(_, product, a, b)) = ADD_BILINEAR.iter().find(|(op, ..)| *op == name) {
        return Some(add_bilinear(imp, n, name, product, a, b));
    }
    if TRUTH.contains(&name) {
        return Some(on_real_operands(imp, n, name, overload, nonzero));
    }
    Some(match name {
        "ones_like" | "new_ones" => ones(imp, n),
        "mH" | "matrix_H" | "adjoint" => adjoint(imp, n, overload),
        // torch casts a complex value to bool by `z ≠ 0`, to other real
        // dtypes by its real part.
        "_to_copy" | "to" | "type_as" if complex_output(imp, n) => per_part(imp, n, name, overload, None),
        "_to_copy" | "to" | "type_as" if bool_output(imp, n) => on_real_operands(imp, n, name, overload, nonzero),
        "_to_copy" | "to" | "type_as" => on_real_operands(imp, n, name, overload, real_part),
        "sym_size" | "sym_numel" => on_real_operands(imp, n, name, overload, real_part),
        "_assert_tensor_metadata" => Ok(()),
        "copy" => copy(imp, n),
        "dropout" | "alpha_dropout" | "feature_dropout" | "feature_alpha_dropout" => eval_dropout(imp, n, name),
        "ones" => ones(imp, n),
        "linalg_vector_norm" | "norm" | "frobenius_norm" => on_real_operands(imp, n, name, overload, modulus),
        "linalg_matrix_norm" | "linalg_norm" if abs_norm(imp, n, name) => {
            on_real_operands(imp, n, name, overload, modulus)
        }
        "var" | "std" | "var_mean" | "std_mean" => variance(imp, n, name, overload),
        "addcmul" | "addcdiv" => addc(imp, n, name),
        "dist" | "l1_loss" => of_distance(imp, n, name, overload),
        "pairwise_distance" | "triplet_margin_loss" => distances(imp, n, name, overload),
        "renorm" => renorm(imp, n),
        // A softmax to a real dtype reads the real part (the cast comes first).
        "softmax" | "_softmax" | "log_softmax" | "_log_softmax" if !complex_output(imp, n) => {
            on_real_operands(imp, n, name, overload, real_part)
        }
        "linspace" | "logspace" => spaced(imp, n, name, overload),
        _ => return None,
    })
}

/// `copy(self, src)`: src's values in self's shape.
fn copy(imp: &mut Importer, n: &Node) -> R<()> {
    let src = imp.tensor_name(n, "src")?.to_string();
    let z = operand(imp, &src)?;
    bind_out(imp, n, z)
}

/// Dropout outside training is the identity; in training its random mask
/// would have to be shared by both parts (not done).
fn eval_dropout(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let key = if imp.arg(n, "input").is_some() { "input" } else { "self" };
    let p = imp.float(n, "p", None)?;
    if imp.bool(n, "train", false)? && p != 0.0 {
        return unsupported(format!("`{name}` of a complex value in training mode; {COMPLEX_SCOPE}"));
    }
    let x = imp.tensor_name(n, key)?.to_string();
    let z = operand(imp, &x)?;
    bind_out(imp, n, z)
}

fn bool_output(imp: &Importer, n: &Node) -> bool {
    n.outputs.iter().flat_map(output_names).any(|o| imp.is_bool_meta(&o))
}

fn complex_output(imp: &Importer, n: &Node) -> bool {
    n.outputs.iter().flat_map(output_names).any(|o| imp.is_complex_meta(&o))
}

// ----------------------------------------------------------------- per part

/// The fill argument `arg` of `n` split into (real pass, imaginary pass).
fn split_fill(n: &Node, arg: &str) -> (Node, Node) {
    let (mut re, mut im) = (n.clone(), n.clone());
    for (m, imag) in [(&mut re, false), (&mut im, true)] {
        for a in &mut m.inputs {
            if a.name != arg {
                continue;
            }
            a.arg = match a.arg {
                Arg::Complex(r, i) => Arg::Float(if imag { i } else { r }),
                Arg::Int(_) | Arg::Float(_) | Arg::Bool(_) if imag => Arg::Float(0.0),
                ref other => other.clone(),
            };
        }
    }
    (re, im)
}

/// Runs the real op on each part: every complex operand is bound to its
/// real (then imaginary) part under its own name, every complex output is
/// typed as its part. Real tensor operands stay as they are (indices,
/// masks, a real `x` of `trapz`). With `fill`, the fill argument is split.
pub(super) fn per_part(imp: &mut Importer, n: &Node, name: &str, overload: &str, fill: Option<&str>) -> R<()> {
    let mut inputs: Vec<(String, (ValueId, ValueId))> = Vec::new();
    for a in &n.inputs {
        let names: Vec<&str> = tensor_names(&a.arg).collect();
        let complex: Vec<(String, (ValueId, ValueId))> =
            names.iter().filter_map(|t| imp.complex(t).map(|p| (t.to_string(), p))).collect();
        if matches!(a.arg, Arg::Tensors(_)) && !complex.is_empty() && complex.len() != names.len() {
            return unsupported(format!("`{name}` of complex and real tensors together; {COMPLEX_SCOPE}"));
        }
        inputs.extend(complex);
    }
    // Real tensor operands go to both passes unchanged. In the ops listed
    // here torch requires every data operand to have the complex dtype (an
    // exported graph casts a real one first), so the real ones are what
    // both parts share: indices, masks, `trapz`'s `x`, `lerp`'s weight.
    let outs: Vec<String> = n.outputs.iter().flat_map(output_names).collect();
    let mut out_types = Vec::new();
    for o in &outs {
        match imp.part_type(o) {
            Ok(t) => out_types.push(t),
            Err(_) => return unsupported(format!("`{name}` of a complex value with a real result; {COMPLEX_SCOPE}")),
        }
    }
    if inputs.is_empty() && fill.is_none() && !CREATE.contains(&name) {
        return unsupported(format!("`{name}` making a complex value; {COMPLEX_SCOPE}"));
    }
    let (node_re, node_im) = match fill {
        Some(arg) => split_fill(n, arg),
        None => (n.clone(), n.clone()),
    };
    let mut results: Vec<[Option<ValueId>; 2]> = vec![[None, None]; outs.len()];
    for (imag, m) in [(false, &node_re), (true, &node_im)] {
        for (t, (re, im)) in &inputs {
            let v = if imag { *im } else { *re };
            let ty = imp.ty(v).clone();
            imp.bind_part(t, v, ty);
        }
        for (o, ty) in outs.iter().zip(&out_types) {
            imp.set_part_type(o, ty.clone());
        }
        let converted = super::dispatch(imp, m, name, overload);
        for (i, o) in outs.iter().enumerate() {
            results[i][imag as usize] = imp.value(o).ok();
            imp.unbind(o);
        }
        for (t, _) in &inputs {
            imp.unbind(t);
        }
        converted?;
    }
    for (o, r) in outs.iter().zip(results) {
        if let [Some(re), Some(im)] = r {
            imp.bind_complex(o, re, im);
        }
    }
    Ok(())
}

/// `ones_like`/`new_ones` of a complex tensor: ones and zeros.
fn ones(imp: &mut Importer, n: &Node) -> R<()> {
    let out = single_output(n)?;
    let ty = imp.part_type(&out)?;
    let re = imp.push_typed(Op::Full { value: 1.0, dtype: ty.dtype, shape: ty.shape.clone() }, Vec::new(), ty.clone());
    bind_out(imp, n, Parts { re, im: None })
}

/// `mH`: the transpose of the last two dims, conjugated.
fn adjoint(imp: &mut Importer, n: &Node, overload: &str) -> R<()> {
    let mut m = n.clone();
    m.target = "torch.ops.aten.mT.default".to_string();
    per_part(imp, &m, "mT", overload, None)?;
    let out = single_output(n)?;
    let Some((re, im)) = imp.complex(&out) else {
        return invalid("`mH` of a complex value lost its parts");
    };
    let neg = imp.push(Op::Unary(U::Neg), vec![im])?;
    imp.bind_complex(&out, re, neg);
    Ok(())
}

fn single_output(n: &Node) -> R<String> {
    match n.outputs.first() {
        Some(Arg::Tensor(t)) if n.outputs.len() == 1 => Ok(t.clone()),
        _ => invalid("expected a single tensor output"),
    }
}

// ---------------------------------------------------------------- bilinear

/// `n` with tensor argument `arg` renamed to `to` (or set to `None`).
fn with_arg(n: &mut Node, arg: &str, to: Arg) {
    match n.inputs.iter_mut().find(|a| a.name == arg) {
        Some(a) => a.arg = to,
        None => n.inputs.push(NamedArg { name: arg.to_string(), arg: to }),
    }
}

/// Runs the real op `m` (its target and scalar arguments as the caller
/// edited them) with tensor arguments replaced by values: each `(arg, v)`
/// binds `v` under a temporary name for the call; `list.i` replaces
/// element `i` of tensor-list argument `list` (`tensors.1`). With `outs`,
/// the outputs are typed as given (`None`: as the program declares), and
/// their values are returned and unbound again; without, they stay bound
/// as the node's own results (a real result of complex operands).
pub(super) fn dispatch_with(
    imp: &mut Importer,
    m: &Node,
    (name, overload): (&str, &str),
    args: &[(&str, ValueId)],
    outs: Option<&[Option<TensorType>]>,
) -> R<Vec<Option<ValueId>>> {
    let mut node = m.clone();
    let mut temps = Vec::new();
    for (i, &(arg, v)) in args.iter().enumerate() {
        let temp = format!("__kiln_real_arg{i}");
        let element = arg.split_once('.').and_then(|(list, i)| Some((list, i.parse::<usize>().ok()?)));
        match element {
            Some((list, i)) => {
                let slot = node.inputs.iter_mut().find(|a| a.name == list).and_then(|a| match &mut a.arg {
                    Arg::Tensors(ts) => ts.get_mut(i),
                    _ => None,
                });
                match slot {
                    Some(t) => *t = temp.clone(),
                    None => return invalid(format!("`{name}` has no operand {arg}")),
                }
            }
            None => with_arg(&mut node, arg, Arg::Tensor(temp.clone())),
        }
        let ty = imp.ty(v).clone();
        imp.bind_part(&temp, v, ty);
        temps.push(temp);
    }
    let names: Vec<String> = node.outputs.iter().flat_map(output_names).collect();
    if let Some(outs) = outs {
        for (o, ty) in names.iter().zip(outs) {
            if let Some(ty) = ty {
                imp.set_part_type(o, ty.clone());
            }
        }
    }
    let converted = super::dispatch(imp, &node, name, overload);
    let mut results = Vec::new();
    if outs.is_some() {
        for o in &names {
            results.push(imp.value(o).ok());
            imp.unbind(o);
        }
    }
    for t in &temps {
        imp.unbind(t);
    }
    converted?;
    Ok(results)
}

/// The complex product `f(a, b)` of bilinear real op `m` (its operands
/// `a_arg`/`b_arg`, its single output typed `ty`): the real op run on each
/// pair of parts that exists. `conj_a` conjugates `a` first (`vdot`,
/// `vecdot`).
fn bilinear(
    imp: &mut Importer,
    m: &Node,
    (name, overload): (&str, &str),
    (a, b): (Parts, Parts),
    (a_arg, b_arg): (&str, &str),
    ty: &TensorType,
) -> R<Parts> {
    let run = |imp: &mut Importer, x: ValueId, y: ValueId| -> R<ValueId> {
        let outs = [Some(ty.clone())];
        match dispatch_with(imp, m, (name, overload), &[(a_arg, x), (b_arg, y)], Some(&outs))?.first() {
            Some(&Some(v)) => Ok(v),
            _ => invalid(format!("`{name}` gave no result")),
        }
    };
    let (re, im) = match (a.im, b.im) {
        (Some(ai), Some(bi)) => {
            let rr = run(imp, a.re, b.re)?;
            let ii = run(imp, ai, bi)?;
            let ri = run(imp, a.re, bi)?;
            let ir = run(imp, ai, b.re)?;
            (imp.push(Op::Binary(B::Sub), vec![rr, ii])?, imp.push(Op::Binary(B::Add), vec![ri, ir])?)
        }
        (Some(ai), None) => (run(imp, a.re, b.re)?, run(imp, ai, b.re)?),
        (None, Some(bi)) => (run(imp, a.re, b.re)?, run(imp, a.re, bi)?),
        (None, None) => {
            return unsupported(format!("`{name}` of real operands with a complex result; {COMPLEX_SCOPE}"))
        }
    };
    Ok(Parts { re, im: Some(im) })
}

fn tensor_operand(imp: &mut Importer, n: &Node, arg: &str, dtype: DType, conj: bool) -> R<Parts> {
    let name = match arg.strip_prefix("tensors.") {
        Some(i) => match (imp.arg(n, "tensors"), i.parse::<usize>()) {
            (Some(Arg::Tensors(ts)), Ok(i)) if i < ts.len() => ts[i].clone(),
            _ => return invalid(format!("missing operand {arg}")),
        },
        None => imp.tensor_name(n, arg)?.to_string(),
    };
    let z = operand(imp, &name)?;
    let mut z = cast_parts(imp, z, dtype);
    if conj {
        if let Some(im) = z.im {
            z.im = Some(imp.push(Op::Unary(U::Neg), vec![im])?);
        }
    }
    Ok(z)
}

/// The type bilinear products of complex64 values run in: f64, so that
/// `ar·br − ai·bi` keeps f32's bits after its cancellation. (torch's own
/// complex convolutions use Gauss's three-product trick in f32, whose
/// cancellation costs more: kiln's results are the closer to the exact
/// ones, within torch's tolerance of torch's.)
fn work_type(ty: TensorType) -> TensorType {
    match ty.dtype {
        DType::F32 => TensorType::new(DType::F64, ty.shape),
        _ => ty,
    }
}

/// A bilinear op with a complex operand; a `bias` (linear layers,
/// convolutions) is left out of the products and added once.
fn bilinear_op(imp: &mut Importer, n: &Node, name: &str, overload: &str, a_arg: &str, b_arg: &str) -> R<()> {
    let out = single_output(n)?;
    let ty = work_type(imp.part_type(&out)?);
    let conj = matches!(name, "vdot" | "linalg_vecdot");
    let a = tensor_operand(imp, n, a_arg, ty.dtype, conj)?;
    let b = tensor_operand(imp, n, b_arg, ty.dtype, false)?;
    let mut m = n.clone();
    let bias = match imp.arg(n, "bias") {
        Some(Arg::Tensor(t)) => Some(t.clone()),
        _ => None,
    };
    if bias.is_some() {
        with_arg(&mut m, "bias", Arg::None);
    }
    let mut z = bilinear(imp, &m, (name, overload), (a, b), (a_arg, b_arg), &ty)?;
    if let Some(bias) = bias {
        let bz = operand(imp, &bias)?;
        let bz = cast_parts(imp, bz, ty.dtype);
        // A convolution's bias is per channel (dim 1); a linear layer's is
        // the last dim, where it broadcasts as it is.
        let bz = if name == "linear" { bz } else { per_channel(imp, bz, ty.rank())? };
        z = add(imp, z, bz)?;
    }
    bind_out(imp, n, z)
}

/// A `[C]` bias reshaped to `[C, 1, …]` for an output of rank `rank`.
fn per_channel(imp: &mut Importer, z: Parts, rank: usize) -> R<Parts> {
    let c = imp.ty(z.re).shape.first().cloned().unwrap_or(Dim::Const(1));
    let shape: Vec<Dim> =
        std::iter::once(c).chain(std::iter::repeat_n(Dim::Const(1), rank.saturating_sub(2))).collect();
    let re = imp.push(Op::Reshape { shape: shape.clone() }, vec![z.re])?;
    let im = match z.im {
        Some(im) => Some(imp.push(Op::Reshape { shape }, vec![im])?),
        None => None,
    };
    Ok(Parts { re, im })
}

fn add(imp: &mut Importer, x: Parts, y: Parts) -> R<Parts> {
    let re = imp.push(Op::Binary(B::Add), vec![x.re, y.re])?;
    let im = match (x.im, y.im) {
        (Some(a), Some(b)) => Some(imp.push(Op::Binary(B::Add), vec![a, b])?),
        (a, b) => a.or(b),
    };
    Ok(Parts { re, im })
}

/// A scalar argument (`alpha`, `beta`, `value`), complex or real.
fn scalar_parts(imp: &mut Importer, n: &Node, arg: &str, default: f64, dtype: DType) -> R<(Parts, bool)> {
    Ok(match imp.arg(n, arg) {
        Some(&Arg::Complex(re, im)) => (
            Parts {
                re: imp.scalar_const(Scalar::Float(re), dtype),
                im: Some(imp.scalar_const(Scalar::Float(im), dtype)),
            },
            re == 0.0 && im == 0.0,
        ),
        Some(Arg::None) | None => {
            (Parts { re: imp.scalar_const(Scalar::Float(default), dtype), im: None }, default == 0.0)
        }
        Some(_) => {
            let s = imp.scalar(n, arg)?;
            (Parts { re: imp.scalar_const(s, dtype), im: None }, s.as_f64() == 0.0)
        }
    })
}

/// `addmm`/`addmv`/`addr`/`baddbmm`/`addbmm`: `β·self + α·product` (self
/// ignored when β is 0, as torch does).
fn add_bilinear(imp: &mut Importer, n: &Node, name: &str, product: &str, a_arg: &str, b_arg: &str) -> R<()> {
    let out = single_output(n)?;
    let ty = work_type(imp.part_type(&out)?);
    let a = tensor_operand(imp, n, a_arg, ty.dtype, false)?;
    let b = tensor_operand(imp, n, b_arg, ty.dtype, false)?;
    // The product's type: the output's, or [batch] + the output's for addbmm.
    let mut pty = ty.clone();
    if name == "addbmm" {
        let batch = imp.ty(a.re).shape.first().cloned().unwrap_or(Dim::Const(1));
        pty.shape.insert(0, batch);
    }
    const PRODUCT: &str = "__kiln_complex_product";
    let m = Node {
        target: format!("torch.ops.aten.{product}.default"),
        inputs: vec![
            // Replaced by the parts in `bilinear`.
            NamedArg { name: "self".into(), arg: Arg::None },
            NamedArg { name: second_operand(product).into(), arg: Arg::None },
        ],
        outputs: vec![Arg::Tensor(PRODUCT.into())],
        name: n.name.clone(),
        stack_trace: n.stack_trace.clone(),
        path: n.path.clone(),
    };
    let mut p = bilinear(imp, &m, (product, "default"), (a, b), ("self", second_operand(product)), &pty)?;
    if name == "addbmm" {
        let sum = |imp: &mut Importer, v: ValueId| {
            imp.push(Op::Reduce { kind: ReduceKind::Sum, axes: vec![0], keep_dims: false }, vec![v])
        };
        p = Parts {
            re: sum(imp, p.re)?,
            im: match p.im {
                Some(im) => Some(sum(imp, im)?),
                None => None,
            },
        };
    }
    let (alpha, _) = scalar_parts(imp, n, "alpha", 1.0, ty.dtype)?;
    let (beta, beta_zero) = scalar_parts(imp, n, "beta", 1.0, ty.dtype)?;
    let mut z = mul(imp, p, alpha)?;
    if !beta_zero {
        let s = tensor_operand(imp, n, "self", ty.dtype, false)?;
        let s = mul(imp, s, beta)?;
        z = add(imp, s, z)?;
    }
    bind_out(imp, n, z)
}

fn second_operand(product: &str) -> &'static str {
    match product {
        "mv" => "vec",
        "outer" => "vec2",
        _ => "mat2",
    }
}

/// `addcmul`/`addcdiv`: `self + value · t1 ∘ t2`.
fn addc(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let out = single_output(n)?;
    let ty = imp.part_type(&out)?;
    let s = tensor_operand(imp, n, "self", ty.dtype, false)?;
    let t1 = tensor_operand(imp, n, "tensor1", ty.dtype, false)?;
    let t2 = tensor_operand(imp, n, "tensor2", ty.dtype, false)?;
    let t = if name == "addcmul" { mul(imp, t1, t2)? } else { super::fft::div(imp, t1, t2)? };
    let (value, _) = scalar_parts(imp, n, "value", 1.0, ty.dtype)?;
    let t = mul(imp, t, value)?;
    let z = add(imp, s, t)?;
    bind_out(imp, n, z)
}

// ------------------------------------------------------- real-valued views

/// `re ≠ 0 ∨ im ≠ 0`.
fn nonzero(imp: &mut Importer, z: Parts) -> R<ValueId> {
    let zero = imp.scalar_const(Scalar::Float(0.0), imp.ty(z.re).dtype);
    let r = imp.push(Op::Binary(B::Ne), vec![z.re, zero])?;
    match z.im {
        Some(im) => {
            let i = imp.push(Op::Binary(B::Ne), vec![im, zero])?;
            imp.push(Op::Binary(B::Or), vec![r, i])
        }
        None => Ok(r),
    }
}

fn real_part(_: &mut Importer, z: Parts) -> R<ValueId> {
    Ok(z.re)
}

/// `|z|`, in the parts' dtype.
fn modulus(imp: &mut Importer, z: Parts) -> R<ValueId> {
    let Some(im) = z.im else { return imp.push(Op::Unary(U::Abs), vec![z.re]) };
    // Through f64 so that f32 parts neither overflow nor lose their last bit.
    let dtype = imp.ty(z.re).dtype;
    let (re, im) = (imp.cast(z.re, DType::F64), imp.cast(im, DType::F64));
    let rr = imp.push(Op::Binary(B::Mul), vec![re, re])?;
    let ii = imp.push(Op::Binary(B::Mul), vec![im, im])?;
    let s = imp.push(Op::Binary(B::Add), vec![rr, ii])?;
    let r = imp.push(Op::Unary(U::Sqrt), vec![s])?;
    Ok(imp.cast(r, dtype))
}

/// Whether a matrix norm of `n` is a function of `|z|` alone: every order
/// but the nuclear and spectral ones (those need singular values).
fn abs_norm(imp: &Importer, n: &Node, name: &str) -> bool {
    let spectral = |a: Option<&Arg>| match a {
        Some(Arg::Str(s)) => s == "nuc",
        Some(Arg::Int(p)) => p.abs() == 2,
        Some(Arg::Float(p)) => p.abs() == 2.0,
        _ => false,
    };
    if name == "linalg_matrix_norm" {
        return !spectral(imp.arg(n, "ord"));
    }
    // linalg_norm: a vector norm unless it has two dims (or none on a 2-d
    // input with an order).
    let two_dims = match imp.arg(n, "dim") {
        Some(Arg::Ints(d)) => d.len() == 2,
        _ => false,
    };
    let ord = imp.arg(n, "ord");
    !(spectral(ord) && (two_dims || !matches!(imp.arg(n, "dim"), Some(Arg::Int(_)) | Some(Arg::Ints(_)))))
        && !matches!(ord, Some(Arg::Str(s)) if s == "nuc")
}

/// Runs the real op with each complex operand replaced by `f` of its parts
/// (the outputs are real).
fn on_real_operands(
    imp: &mut Importer,
    n: &Node,
    name: &str,
    overload: &str,
    f: fn(&mut Importer, Parts) -> R<ValueId>,
) -> R<()> {
    if complex_output(imp, n) {
        return unsupported(format!("`{name}` of a complex value with a complex result; {COMPLEX_SCOPE}"));
    }
    let mut args: Vec<(String, ValueId)> = Vec::new();
    for a in &n.inputs {
        let tensors: Vec<(String, &str)> = match &a.arg {
            Arg::Tensor(t) => vec![(a.name.clone(), t.as_str())],
            Arg::Tensors(ts) => ts.iter().enumerate().map(|(i, t)| (format!("{}.{i}", a.name), t.as_str())).collect(),
            _ => Vec::new(),
        };
        for (key, t) in tensors {
            if let Some((re, im)) = imp.complex(t) {
                args.push((key, f(imp, Parts { re, im: Some(im) })?));
            }
        }
    }
    let args: Vec<(&str, ValueId)> = args.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    dispatch_with(imp, n, (name, overload), &args, None).map(drop)
}

/// `dist(a, b, p)` and `l1_loss(a, b)`: functions of `|a − b|`, run as the
/// real op of `|a − b|` and zero.
fn of_distance(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    let (first, second) = if name == "dist" { ("self", "other") } else { ("self", "target") };
    let a = operand(imp, imp.tensor_name(n, first)?)?;
    let b = operand(imp, imp.tensor_name(n, second)?)?;
    let dtype = imp.ty(a.re).dtype;
    let b = cast_parts(imp, b, dtype);
    let neg = Parts {
        re: imp.push(Op::Unary(U::Neg), vec![b.re])?,
        im: match b.im {
            Some(im) => Some(imp.push(Op::Unary(U::Neg), vec![im])?),
            None => None,
        },
    };
    let d = add(imp, a, neg)?;
    let d = modulus(imp, d)?;
    let zero = imp.scalar_const(Scalar::Float(0.0), imp.ty(d).dtype);
    dispatch_with(imp, n, (name, overload), &[(first, d), (second, zero)], None).map(drop)
}

/// `pairwise_distance(x1, x2, p, eps)` and `triplet_margin_loss(anchor,
/// positive, negative, margin, p, eps)`: p-norms of `|u − v + eps|` (eps on
/// the real part, as torch adds a real scalar), run as the real op of those
/// magnitudes against zero with `eps = 0` — the same abs/pow/sum/pow torch
/// decomposes them into.
fn distances(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    let eps = imp.float(n, "eps", Some(1e-6))?;
    let magnitude = |imp: &mut Importer, u: &str, v: &str| -> R<ValueId> {
        let a = operand(imp, imp.tensor_name(n, u)?)?;
        let b = operand(imp, imp.tensor_name(n, v)?)?;
        let dtype = imp.ty(a.re).dtype;
        let (a, b) = (cast_parts(imp, a, dtype), cast_parts(imp, b, dtype));
        let d = sub(imp, a, b)?;
        let re = imp.with_scalar(B::Add, d.re, eps)?;
        modulus(imp, Parts { re, im: d.im })
    };
    let mut m = n.clone();
    with_arg(&mut m, "eps", Arg::Float(0.0));
    if name == "pairwise_distance" {
        let d = magnitude(imp, "x1", "x2")?;
        let zero = imp.scalar_const(Scalar::Float(0.0), imp.ty(d).dtype);
        return dispatch_with(imp, &m, (name, overload), &[("x1", d), ("x2", zero)], None).map(drop);
    }
    // ‖0 − (−d)‖ = ‖d‖ exactly; `swap`'s distance between positive and
    // negative is not a difference of these two.
    if imp.bool(n, "swap", false)? {
        return unsupported(format!("`{name}` with swap=True of complex values; {COMPLEX_SCOPE}"));
    }
    let d_ap = magnitude(imp, "anchor", "positive")?;
    let d_an = magnitude(imp, "anchor", "negative")?;
    let neg_ap = imp.push(Op::Unary(U::Neg), vec![d_ap])?;
    let neg_an = imp.push(Op::Unary(U::Neg), vec![d_an])?;
    let zero = imp.scalar_const(Scalar::Float(0.0), imp.ty(d_ap).dtype);
    let args = [("anchor", zero), ("positive", neg_ap), ("negative", neg_an)];
    dispatch_with(imp, &m, (name, overload), &args, None).map(drop)
}

fn sub(imp: &mut Importer, x: Parts, y: Parts) -> R<Parts> {
    let neg = Parts {
        re: imp.push(Op::Unary(U::Neg), vec![y.re])?,
        im: match y.im {
            Some(im) => Some(imp.push(Op::Unary(U::Neg), vec![im])?),
            None => None,
        },
    };
    add(imp, x, neg)
}

/// `renorm(self, p, dim, maxnorm)`: the real op's factor, from the slices'
/// norms of `|z|`, scales both parts.
fn renorm(imp: &mut Importer, n: &Node) -> R<()> {
    let z = operand(imp, imp.tensor_name(n, "self")?)?;
    let r = modulus(imp, z)?;
    let factor = super::export_ir::renorm_factor(imp, n, r)?;
    let scale = |imp: &mut Importer, v: ValueId| imp.push(Op::Binary(B::Mul), vec![v, factor]);
    let re = scale(imp, z.re)?;
    let im = match z.im {
        Some(im) => Some(scale(imp, im)?),
        None => None,
    };
    bind_out(imp, n, Parts { re, im })
}

/// `linspace`/`logspace` of real ends with a complex dtype: the real op's
/// values and a zero imaginary part (a negative base would make complex
/// powers).
fn spaced(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    let complex_end = ["start", "end"].into_iter().any(|k| {
        matches!(imp.arg(n, k), Some(Arg::Tensor(t)) if imp.complex(t).is_some())
            || matches!(imp.arg(n, k), Some(Arg::Complex(..)))
    });
    if complex_end {
        return unsupported(format!("`{name}` between complex ends; {COMPLEX_SCOPE}"));
    }
    if name == "logspace" && imp.float(n, "base", Some(10.0))? < 0.0 {
        return unsupported(format!("`logspace` with a negative base and a complex dtype; {COMPLEX_SCOPE}"));
    }
    let out = single_output(n)?;
    let ty = imp.part_type(&out)?;
    let mut m = n.clone();
    with_arg(&mut m, "dtype", Arg::None);
    let re = match dispatch_with(imp, &m, (name, overload), &[], Some(&[Some(ty)]))?.first() {
        Some(&Some(v)) => v,
        _ => return invalid(format!("`{name}` gave no result")),
    };
    bind_out(imp, n, Parts { re, im: None })
}

/// `var`/`std` (and their `_mean` forms) of a complex tensor: the variance
/// is `var re + var im` (the same correction), `std` its root; the mean is
/// complex.
fn variance(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    let x = imp.tensor_name(n, "self")?.to_string();
    let Some((re, im)) = imp.complex(&x) else {
        return unsupported(format!("`{name}` of a real value with a complex result; {COMPLEX_SCOPE}"));
    };
    let outs: Vec<String> = n.outputs.iter().flat_map(output_names).collect();
    let with_mean = name.ends_with("_mean");
    if outs.len() != 1 + with_mean as usize {
        return invalid(format!("`{name}` has {} outputs", outs.len()));
    }
    let var_ty = imp.type_of(&outs[0])?;
    let mean_ty = if with_mean { Some(imp.part_type(&outs[1])?) } else { None };
    let target = if with_mean { "var_mean" } else { "var" };
    let temp_outs = ["__kiln_complex_var", "__kiln_complex_mean"];
    let mut m = n.clone();
    m.target = format!("torch.ops.aten.{target}.{overload}");
    m.outputs = temp_outs[..outs.len()].iter().map(|t| Arg::Tensor(t.to_string())).collect();
    let types = [Some(var_ty.clone()), mean_ty];
    let mut parts = Vec::new();
    for p in [re, im] {
        let r = dispatch_with(imp, &m, (target, overload), &[("self", p)], Some(&types[..outs.len()]))?;
        match (r.first().copied().flatten(), r.get(1).copied().flatten()) {
            (Some(var), mean) if mean.is_some() == with_mean => parts.push((var, mean)),
            _ => return invalid(format!("`{target}` gave no result")),
        }
    }
    let mut var = imp.push(Op::Binary(B::Add), vec![parts[0].0, parts[1].0])?;
    if name.starts_with("std") {
        var = imp.push(Op::Unary(U::Sqrt), vec![var])?;
    }
    let var = imp.cast(var, var_ty.dtype);
    imp.bind(n, 0, var)?;
    if let (Some(mr), Some(mi)) = (parts[0].1, parts[1].1) {
        imp.bind_complex(&outs[1], mr, mi);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_values_split_into_parts() {
        let n = Node {
            target: "torch.ops.aten.fill.Scalar".into(),
            inputs: vec![
                NamedArg { name: "self".into(), arg: Arg::Tensor("x".into()) },
                NamedArg { name: "value".into(), arg: Arg::Complex(2.0, -3.0) },
            ],
            outputs: vec![Arg::Tensor("y".into())],
            name: "fill".into(),
            stack_trace: None,
            path: String::new(),
        };
        let (re, im) = split_fill(&n, "value");
        assert_eq!(re.inputs[1].arg, Arg::Float(2.0));
        assert_eq!(im.inputs[1].arg, Arg::Float(-3.0));
        let mut real = n.clone();
        real.inputs[1].arg = Arg::Int(5);
        let (re, im) = split_fill(&real, "value");
        assert_eq!(re.inputs[1].arg, Arg::Int(5));
        assert_eq!(im.inputs[1].arg, Arg::Float(0.0));
    }
}
