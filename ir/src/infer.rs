//! Output types of every op from its operands' types, with torch semantics.
//!
//! Symbolic dimensions are handled by three questions: are two dims provably
//! equal, provably different, or unknown ([`dims_equal`])? Inference trusts
//! the source program where it cannot decide (e.g. a matmul's `K` of `s0`
//! against `s1`) and reports only what is definitely wrong.
//!
//! Broadcasting ([`broadcast_shapes`]) pairs trailing dims: equal → that dim;
//! one is `1` → the other; symbolic against a static dim other than 1 → the
//! static one (the program was valid, so the symbol must equal it at run
//! time); two different static dims, or two symbolic dims not provably equal,
//! are errors (torch.export would have specialised or guarded them equal).

use crate::{DType, Dim, Op, PoolKind, PrimaryMap, ScanKind, Symbol, SymbolId, TensorType, UnaryOp};
use std::collections::BTreeMap;

/// A dim as a polynomial: monomial (sorted atom indices) → coefficient. Atoms
/// are symbols and, opaquely, `//` and `%` subexpressions.
type Poly = BTreeMap<Vec<usize>, i64>;

fn poly(d: &Dim, atoms: &mut Vec<Dim>) -> Poly {
    let atom = |d: &Dim, atoms: &mut Vec<Dim>| {
        let i = atoms.iter().position(|a| a == d).unwrap_or_else(|| {
            atoms.push(d.clone());
            atoms.len() - 1
        });
        Poly::from([(vec![i], 1)])
    };
    let mut p = match d {
        Dim::Const(c) => Poly::from([(vec![], *c)]),
        Dim::Sym(_) | Dim::FloorDiv(..) | Dim::Mod(..) => atom(d, atoms),
        Dim::Add(a, b) => {
            let mut p = poly(a, atoms);
            for (m, c) in poly(b, atoms) {
                let e = p.entry(m).or_insert(0);
                *e = e.wrapping_add(c);
            }
            p
        }
        Dim::Mul(a, b) => {
            let (pa, pb) = (poly(a, atoms), poly(b, atoms));
            let mut p = Poly::new();
            for (ma, ca) in &pa {
                for (mb, cb) in &pb {
                    let mut m: Vec<usize> = ma.iter().chain(mb).copied().collect();
                    m.sort_unstable();
                    let e = p.entry(m).or_insert(0);
                    *e = e.wrapping_add(ca.wrapping_mul(*cb));
                }
            }
            p
        }
    };
    p.retain(|_, c| *c != 0);
    p
}

/// `Some(true)` when `a == b` for every binding of the symbols, `Some(false)`
/// when they differ for every binding within the symbols' ranges, `None` when
/// it depends on the binding or cannot be decided.
pub fn dims_equal(a: &Dim, b: &Dim, symbols: &PrimaryMap<SymbolId, Symbol>) -> Option<bool> {
    if a == b {
        return Some(true);
    }
    let mut atoms = vec![];
    let pa = poly(a, &mut atoms);
    let pb = poly(b, &mut atoms);
    if pa == pb {
        return Some(true);
    }
    if symbols_valid(a, symbols) && symbols_valid(b, symbols) {
        // a - b: when every term has the same sign and one is strictly
        // positive (each atom >= 1), the difference cannot be zero.
        let mut diff = pa;
        for (m, c) in pb {
            let e = diff.entry(m).or_insert(0);
            *e = e.wrapping_sub(c);
        }
        diff.retain(|_, c| *c != 0);
        let atom_low: Vec<i64> = atoms.iter().map(|d| d.bounds(symbols).0).collect();
        let strictly_positive = |m: &Vec<usize>| m.iter().all(|&i| atom_low[i] >= 1);
        let nonneg = |m: &Vec<usize>| m.iter().all(|&i| atom_low[i] >= 0);
        let same_sign = diff.values().all(|&c| c > 0) || diff.values().all(|&c| c < 0);
        if same_sign && diff.keys().all(nonneg) && diff.keys().any(strictly_positive) {
            return Some(false);
        }
        let (alo, ahi) = a.bounds(symbols);
        let (blo, bhi) = b.bounds(symbols);
        if ahi.is_some_and(|h| h < blo) || bhi.is_some_and(|h| h < alo) {
            return Some(false);
        }
    }
    None
}

fn symbols_valid(d: &Dim, symbols: &PrimaryMap<SymbolId, Symbol>) -> bool {
    let mut used = vec![];
    d.collect_symbols(&mut used);
    used.iter().all(|s| symbols.is_valid(*s))
}

/// Equality of dims without symbol bounds (for [`broadcast_shapes`]).
fn same_dim(a: &Dim, b: &Dim) -> bool {
    dims_equal(a, b, &PrimaryMap::new()) == Some(true)
}

/// Numpy/torch broadcasting of two shapes (see the module doc for symbolic dims).
pub fn broadcast_shapes(a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>, String> {
    let rank = a.len().max(b.len());
    let at = |s: &[Dim], i: usize| if i + s.len() >= rank { s[i + s.len() - rank].clone() } else { Dim::Const(1) };
    (0..rank)
        .map(|i| {
            let (x, y) = (at(a, i), at(b, i));
            match (x.as_const(), y.as_const()) {
                _ if same_dim(&x, &y) => Ok(x),
                (Some(1), _) => Ok(y),
                (_, Some(1)) => Ok(x),
                (Some(p), Some(q)) => Err(format!("cannot broadcast dimension {p} with {q}")),
                (Some(_), None) => Ok(x),
                (None, Some(_)) => Ok(y),
                (None, None) => {
                    Err(format!("cannot broadcast symbolic dimensions {x:?} and {y:?}: not provably equal"))
                }
            }
        })
        .collect()
}

fn rank_at_least(what: &str, t: &TensorType, r: usize) -> Result<(), String> {
    if t.rank() < r {
        return Err(format!("{what} needs rank >= {r}, got rank {}", t.rank()));
    }
    Ok(())
}

fn same_dtype(what: &str, a: &TensorType, b: &TensorType) -> Result<(), String> {
    if a.dtype != b.dtype {
        return Err(format!("{what}: dtypes differ ({} vs {})", a.dtype, b.dtype));
    }
    Ok(())
}

fn axis_ok(axis: usize, rank: usize) -> Result<(), String> {
    if axis >= rank {
        return Err(format!("axis {axis} out of range for rank {rank}"));
    }
    Ok(())
}

/// Errors when `a` and `b` are provably different.
fn must_match(what: &str, a: &Dim, b: &Dim, symbols: &PrimaryMap<SymbolId, Symbol>) -> Result<(), String> {
    if dims_equal(a, b, symbols) == Some(false) {
        let (a, b) = (a.display(symbols), b.display(symbols));
        return Err(format!("{what}: {a} != {b}"));
    }
    Ok(())
}

/// `in + 2*pad - dil*(k-1) - 1`, the numerator of the conv/pool size formula.
fn window_span(input: &Dim, k: &Dim, pad: i64, dil: i64) -> Dim {
    // Saturating: hostile attributes must give an error later, not overflow here.
    let shift = pad.saturating_mul(2).saturating_add(dil.saturating_sub(1));
    match k.as_const() {
        Some(k) => plus(input.clone(), shift.saturating_sub(dil.saturating_mul(k))),
        None => Dim::add(plus(input.clone(), shift), Dim::mul(k.clone(), Dim::Const(-dil))),
    }
}

/// `d + c`, folding `c` into a constant `d` ends with so that chains of
/// offsets stay one term: `((x + -2) + 1)` becomes `(x + -1)`.
fn plus(d: Dim, c: i64) -> Dim {
    match d {
        _ if c == 0 => d,
        Dim::Add(a, b) if b.is_static() => plus(*a, b.as_const().unwrap_or(0).saturating_add(c)),
        // floor(a / s) + c == floor((a + c*s) / s) for s > 0.
        Dim::FloorDiv(a, s) if s.as_const().is_some_and(|s| s > 0) => {
            let step = s.as_const().unwrap_or(1);
            Dim::floor_div(plus(*a, c.saturating_mul(step)), *s)
        }
        d => Dim::add(d, Dim::Const(c)),
    }
}

fn positive(what: &str, v: &[i64]) -> Result<(), String> {
    match v.iter().find(|&&x| x < 1) {
        Some(x) => Err(format!("{what} must be >= 1, got {x}")),
        None => Ok(()),
    }
}

fn lengths_match(n: usize, attrs: &[(&str, usize)]) -> Result<(), String> {
    match attrs.iter().find(|(_, l)| *l != n) {
        Some((name, l)) => Err(format!("`{name}` has {l} entries, expected {n}")),
        None => Ok(()),
    }
}

/// Output types of `op` applied to operands of types `inputs`.
pub fn infer_types(
    symbols: &PrimaryMap<SymbolId, Symbol>,
    op: &Op,
    inputs: &[&TensorType],
) -> Result<Vec<TensorType>, String> {
    let (lo, hi) = op.operand_count();
    if inputs.len() < lo || inputs.len() > hi {
        return Err(format!("`{}` takes {lo}..={hi} operands, got {}", op.name(), inputs.len()));
    }
    if let Op::BindDim { symbol } = op {
        if !symbols.is_valid(*symbol) {
            return Err(format!("bind_dim of unknown symbol {symbol}"));
        }
        let count = inputs[0];
        if count.rank() != 0 || !count.dtype.is_int() {
            return Err(format!("bind_dim needs a 0-d integer operand, got {}[{} dims]", count.dtype, count.rank()));
        }
        return Ok(Vec::new());
    }
    if let Op::Assert { .. } = op {
        return Ok(Vec::new());
    }
    if let Op::While { carried, cond, body } = op {
        return while_types(symbols, *carried, cond, body, inputs);
    }
    if let Op::LinearSplit { epilogue, columns } = op {
        return linear_split_types(symbols, epilogue, columns, inputs);
    }
    infer_one(symbols, op, inputs).map(|t| vec![t])
}

/// [`Op::LinearSplit`]: the fused linear's `[.., N]` result cut into
/// `[.., columns[i]]` pieces (`N` their sum, at least two, at most the
/// instruction's output limit; no residual).
fn linear_split_types(
    symbols: &PrimaryMap<SymbolId, Symbol>,
    epilogue: &crate::Epilogue,
    columns: &[i64],
    ins: &[&TensorType],
) -> Result<Vec<TensorType>, String> {
    let max = crate::LINEAR_SPLIT_MAX as usize;
    if columns.len() < 2 || columns.len() > max || columns.iter().any(|&c| c <= 0) {
        return Err(format!("linear_split takes 2..={max} positive column counts, got {columns:?}"));
    }
    if epilogue.residual != crate::Residual::None {
        return Err("linear_split has no residual".into());
    }
    let whole = fused_epilogue(symbols, &Op::Linear, epilogue, ins)?;
    let total = columns.iter().try_fold(0i64, |a, &c| a.checked_add(c)).ok_or("linear_split: too many columns")?;
    let last = whole.rank() - 1;
    must_match("linear_split columns", &whole.shape[last], &Dim::Const(total), symbols)?;
    Ok(columns
        .iter()
        .map(|&c| {
            let mut shape = whole.shape.clone();
            shape[last] = Dim::Const(c);
            TensorType::new(whole.dtype, shape)
        })
        .collect())
}

/// [`Op::While`]: both nested graphs take the operands' types as inputs;
/// `cond` gives one 1-element bool and `body` the carried types back, so the
/// carried values keep their types across iterations.
fn while_types(
    symbols: &PrimaryMap<SymbolId, Symbol>,
    carried: usize,
    cond: &crate::Graph,
    body: &crate::Graph,
    inputs: &[&TensorType],
) -> Result<Vec<TensorType>, String> {
    let same = |a: &TensorType, b: &TensorType| {
        a.dtype == b.dtype
            && a.rank() == b.rank()
            && a.shape.iter().zip(&b.shape).all(|(x, y)| dims_equal(x, y, symbols) == Some(true))
    };
    let show = |t: &TensorType| {
        let dims: Vec<String> = t.shape.iter().map(|d| d.display(symbols).to_string()).collect();
        format!("{}[{}]", t.dtype, dims.join(", "))
    };
    for (what, g) in [("cond", cond), ("body", body)] {
        if g.inputs.len() != inputs.len() {
            return Err(format!(
                "while: `{what}` takes {} inputs, the loop has {} operands",
                g.inputs.len(),
                inputs.len()
            ));
        }
        for (i, (&v, want)) in g.inputs.iter().zip(inputs).enumerate() {
            let got = &g.values.get(v).ok_or_else(|| format!("while: `{what}` input {i} is undefined"))?.ty;
            if !same(got, want) {
                return Err(format!("while: `{what}` input {i} is {}, the operand is {}", show(got), show(want)));
            }
        }
    }
    let ty_of = |g: &crate::Graph, v| g.values.get(v).map(|d: &crate::ValueData| d.ty.clone());
    match cond.outputs.as_slice() {
        [p] => match ty_of(cond, *p) {
            Some(t) if t.dtype == DType::Bool && t.numel().as_const() == Some(1) => {}
            Some(t) => return Err(format!("while: `cond` must return one 1-element bool, returns {}", show(&t))),
            None => return Err("while: `cond` returns an undefined value".into()),
        },
        outs => return Err(format!("while: `cond` must return one value, returns {}", outs.len())),
    }
    if body.outputs.len() != carried {
        return Err(format!("while: `body` returns {} values for {carried} carried values", body.outputs.len()));
    }
    for (i, (&v, want)) in body.outputs.iter().zip(inputs).enumerate() {
        let got = ty_of(body, v).ok_or_else(|| format!("while: `body` output {i} is undefined"))?;
        if !same(&got, want) {
            return Err(format!(
                "while: carried value {i} changes type in the loop: it enters as {}, `body` returns {}",
                show(want),
                show(&got)
            ));
        }
    }
    Ok(inputs[..carried].iter().map(|t| (*t).clone()).collect())
}

fn infer_one(symbols: &PrimaryMap<SymbolId, Symbol>, op: &Op, ins: &[&TensorType]) -> Result<TensorType, String> {
    let x = ins[..].first().copied();
    let same = |x: Option<&TensorType>| x.cloned().ok_or_else(|| "missing operand".to_string());
    match op {
        Op::Unary(UnaryOp::Not) => Ok(TensorType::new(DType::Bool, same(x)?.shape)),
        Op::Unary(_) | Op::Clamp { .. } => same(x),
        Op::Cast { to } => Ok(TensorType::new(*to, same(x)?.shape)),
        Op::Binary(b) => {
            let (a, c) = (ins[0], ins[1]);
            same_dtype(op.name(), a, c)?;
            let shape = broadcast_shapes(&a.shape, &c.shape)?;
            Ok(TensorType::new(if b.is_comparison() { DType::Bool } else { a.dtype }, shape))
        }
        Op::Where => {
            let (c, a, b) = (ins[0], ins[1], ins[2]);
            if c.dtype != DType::Bool {
                return Err(format!("where: condition must be bool, got {}", c.dtype));
            }
            same_dtype("where", a, b)?;
            let shape = broadcast_shapes(&broadcast_shapes(&c.shape, &a.shape)?, &b.shape)?;
            Ok(TensorType::new(a.dtype, shape))
        }
        Op::MatMul => matmul(symbols, ins[0], ins[1]),
        Op::GroupedMatMul => {
            let (x, w, offs) = (ins[0], ins[1], ins[2]);
            if x.rank() != 2 || w.rank() != 3 || offs.rank() != 1 {
                return Err(format!(
                    "grouped_matmul takes x[S, K], w[E, K, N], offs[E]; got ranks {}, {}, {}",
                    x.rank(),
                    w.rank(),
                    offs.rank()
                ));
            }
            same_dtype("grouped_matmul", x, w)?;
            if !matches!(offs.dtype, DType::I32 | DType::I64) {
                return Err(format!("grouped_matmul offsets must be i32 or i64, got {}", offs.dtype));
            }
            Ok(TensorType::new(x.dtype, vec![x.shape[0].clone(), w.shape[2].clone()]))
        }
        Op::Linear => {
            let (x, w) = (ins[0], ins[1]);
            rank_at_least("linear input", x, 1)?;
            if w.rank() != 2 {
                return Err(format!("linear weight must have rank 2, got {}", w.rank()));
            }
            same_dtype("linear", x, w)?;
            must_match("linear in_features", &x.shape[x.rank() - 1], &w.shape[1], symbols)?;
            if let Some(b) = ins.get(2) {
                if b.rank() != 1 {
                    return Err(format!("linear bias must have rank 1, got {}", b.rank()));
                }
                must_match("linear bias length", &b.shape[0], &w.shape[0], symbols)?;
            }
            let mut shape = x.shape.clone();
            let last = shape.len() - 1;
            shape[last] = w.shape[0].clone();
            Ok(TensorType::new(x.dtype, shape))
        }
        Op::QuantLinear { bits, group, zero_points, dynamic, asymmetric, act_scale, act_zero_point } => {
            static_activations(*dynamic, *act_scale, *act_zero_point)?;
            if *asymmetric && !*dynamic {
                return Err("quant_linear asymmetric needs dynamic activations".into());
            }
            // Static activations need the weights dynamic ones need.
            quant_linear(symbols, ins, *bits, *group, *zero_points, *dynamic || act_scale.is_some())
        }
        Op::QuantConv {
            stride,
            padding,
            dilation,
            groups,
            epilogue,
            layout,
            dynamic,
            asymmetric,
            act_scale,
            act_zero_point,
            out_quant,
            res_quant,
        } => {
            static_activations(*dynamic, *act_scale, *act_zero_point)?;
            if *asymmetric && !*dynamic {
                return Err("quant_conv asymmetric needs dynamic activations".into());
            }
            let int8_acts = *dynamic || act_scale.is_some();
            let has_residual = epilogue.residual != crate::Residual::None;
            // int8 residuals: a dense, channels-last layer with int8
            // activations (the integer kernel's store) reads an i8 residual
            // and may give an i8 result with it.
            let int8_residual_ok = int8_acts && *groups == 1 && *layout == crate::Layout::ChannelsLast;
            let residual_i8 = has_residual && ins.last().is_some_and(|r| r.dtype == DType::I8);
            match res_quant {
                Some(q) if !q.is_valid() => {
                    return Err(format!(
                        "quant_conv res_scale {} / res_zero_point {} out of range",
                        q.scale, q.zero_point
                    ))
                }
                Some(_) if !(residual_i8 && int8_residual_ok) => {
                    return Err("quant_conv res_scale needs an i8 residual, a dense channels-last layer and int8 \
                                activations"
                        .into())
                }
                None if residual_i8 => return Err("an i8 quant_conv residual needs res_scale".into()),
                _ => {}
            }
            // int8 activations between layers: an i8 input is already
            // quantized with the static parameters; an i8 result needs the
            // integer kernel's channels-last store and no residual.
            if ins[0].dtype == DType::I8 && act_scale.is_none() {
                return Err("quant_conv takes an i8 input only with static activations (act_scale)".into());
            }
            if let Some(q) = out_quant {
                if !q.is_valid() {
                    return Err(format!(
                        "quant_conv out_scale {} / out_zero_point {} out of range",
                        q.scale, q.zero_point
                    ));
                }
                if !int8_acts || *layout != crate::Layout::ChannelsLast || (has_residual && *groups != 1) {
                    return Err(
                        "an i8 quant_conv result needs int8 activations, channels-last and no residual unless dense"
                            .into(),
                    );
                }
            }
            let conv = Op::Conv {
                stride: stride.clone(),
                padding: padding.clone(),
                dilation: dilation.clone(),
                groups: *groups,
            };
            let static_acts = act_scale.is_some();
            let out_dtype = if out_quant.is_some() { DType::I8 } else { DType::F32 };
            let result = match layout {
                crate::Layout::ChannelsFirst => quant_conv(symbols, &conv, epilogue, ins, int8_acts, static_acts),
                crate::Layout::ChannelsLast => {
                    // The channels-first convolution of the same tensors.
                    if stride.len() != 2 || ins[0].rank() != 4 {
                        return Err("a channels-last quant_conv is 2-d: input [N, H, W, C]".into());
                    }
                    // After the scales.
                    let residual = epilogue.residual_operand().map(|i| i + 1);
                    channels_last(ins, residual, |refs| {
                        quant_conv(symbols, &conv, epilogue, refs, int8_acts, static_acts)
                    })
                }
            }?;
            Ok(TensorType::new(out_dtype, result.shape))
        }
        Op::Conv { stride, padding, dilation, groups } => {
            let (x, w) = (ins[0], ins[1]);
            let n = stride.len();
            lengths_match(n, &[("padding", padding.len()), ("dilation", dilation.len())])?;
            positive("conv stride", stride)?;
            positive("conv dilation", dilation)?;
            positive("conv groups", &[*groups])?;
            if x.rank() != n + 2 || w.rank() != n + 2 {
                return Err(format!(
                    "conv{n}d needs input and weight of rank {}, got {} and {}",
                    n + 2,
                    x.rank(),
                    w.rank()
                ));
            }
            same_dtype("conv", x, w)?;
            must_match(
                "conv input channels",
                &x.shape[1],
                &Dim::mul(w.shape[1].clone(), Dim::Const(*groups)),
                symbols,
            )?;
            if let Some(b) = ins.get(2) {
                if b.rank() != 1 {
                    return Err(format!("conv bias must have rank 1, got {}", b.rank()));
                }
                must_match("conv bias length", &b.shape[0], &w.shape[0], symbols)?;
            }
            let mut shape = vec![x.shape[0].clone(), w.shape[0].clone()];
            for i in 0..n {
                let span = window_span(&x.shape[2 + i], &w.shape[2 + i], padding[i], dilation[i]);
                shape.push(plus(Dim::floor_div(span, Dim::Const(stride[i])), 1));
            }
            Ok(TensorType::new(x.dtype, shape))
        }
        Op::ConvFused { stride, padding, dilation, groups, epilogue, layout } => {
            let conv = Op::Conv {
                stride: stride.clone(),
                padding: padding.clone(),
                dilation: dilation.clone(),
                groups: *groups,
            };
            match layout {
                crate::Layout::ChannelsFirst => fused_epilogue(symbols, &conv, epilogue, ins),
                crate::Layout::ChannelsLast => {
                    // The channels-first convolution of the same tensors,
                    // viewed `[N, C, H, W]`.
                    if stride.len() != 2 || ins.iter().take(1).any(|x| x.rank() != 4) {
                        return Err("a channels-last conv_fused is 2-d: input [N, H, W, C]".into());
                    }
                    channels_last(ins, epilogue.residual_operand(), |refs| {
                        fused_epilogue(symbols, &conv, epilogue, refs)
                    })
                }
            }
        }
        Op::LinearFused { epilogue } => fused_epilogue(symbols, &Op::Linear, epilogue, ins),
        // Several results: `infer_types` answers for it.
        Op::LinearSplit { .. } => Err("linear_split has several results".into()),
        Op::BatchNorm { .. } => {
            let x = ins[0];
            rank_at_least("batch_norm input", x, 2)?;
            for (i, p) in ins[1..].iter().enumerate() {
                if p.rank() != 1 {
                    return Err(format!("batch_norm parameter {} must have rank 1, got {}", i + 1, p.rank()));
                }
                must_match("batch_norm channels", &p.shape[0], &x.shape[1], symbols)?;
            }
            Ok(x.clone())
        }
        Op::LayerNorm { normalized_rank, .. } | Op::RmsNorm { normalized_rank, .. } => {
            let x = ins[0];
            if *normalized_rank > x.rank() {
                return Err(format!("layer_norm over {normalized_rank} dims of a rank-{} input", x.rank()));
            }
            let normalized = &x.shape[x.rank() - normalized_rank..];
            for p in &ins[1..] {
                if p.rank() != *normalized_rank {
                    return Err(format!("layer_norm parameter rank {} != normalized_rank {normalized_rank}", p.rank()));
                }
                for (a, b) in p.shape.iter().zip(normalized) {
                    must_match("layer_norm parameter shape", a, b, symbols)?;
                }
            }
            Ok(x.clone())
        }
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            axis_ok(*axis, ins[0].rank())?;
            Ok(ins[0].clone())
        }
        Op::Reduce { axes, keep_dims, .. } => reduce(ins[0], ins[0].dtype, axes, *keep_dims),
        Op::ArgMax { axis, keep_dims } => reduce(ins[0], DType::I64, &[*axis], *keep_dims),
        Op::Pool { layout: crate::Layout::ChannelsLast, kernel, .. } => {
            if kernel.len() != 2 || ins[0].rank() != 4 {
                return Err("a channels-last pool is 2-d: input [N, H, W, C]".into());
            }
            let mut nchw = op.clone();
            if let Op::Pool { layout, .. } = &mut nchw {
                *layout = crate::Layout::ChannelsFirst;
            }
            channels_last(ins, None, |refs| infer_one(symbols, &nchw, refs))
        }
        Op::Pool { kind, kernel, stride, padding, dilation, ceil_mode, .. } => {
            let x = ins[0];
            let n = kernel.len();
            lengths_match(n, &[("stride", stride.len()), ("padding", padding.len()), ("dilation", dilation.len())])?;
            positive("pool kernel", kernel)?;
            positive("pool stride", stride)?;
            positive("pool dilation", dilation)?;
            if *kind == PoolKind::Avg && dilation.iter().any(|&d| d != 1) {
                return Err("avg_pool has no dilation".to_string());
            }
            rank_at_least("pool input", x, n)?;
            let lead = x.rank() - n;
            let mut shape = x.shape[..lead].to_vec();
            for i in 0..n {
                shape.push(pool_dim(&x.shape[lead + i], kernel[i], stride[i], padding[i], dilation[i], *ceil_mode)?);
            }
            // The indices variant yields torch's i64 flat indices.
            let dtype = if *kind == PoolKind::ArgMax { DType::I64 } else { x.dtype };
            Ok(TensorType::new(dtype, shape))
        }
        Op::AdaptiveAvgPool { output } => {
            let x = ins[0];
            rank_at_least("adaptive_avg_pool input", x, output.len())?;
            positive("adaptive_avg_pool output size", output)?;
            let lead = x.rank() - output.len();
            let mut shape = x.shape[..lead].to_vec();
            shape.extend(output.iter().map(|&o| Dim::Const(o)));
            Ok(TensorType::new(x.dtype, shape))
        }
        Op::Attention { .. } => {
            let (q, k, v) = (ins[0], ins[1], ins[2]);
            for (name, t) in [("query", q), ("key", k), ("value", v)] {
                rank_at_least(&format!("attention {name}"), t, 2)?;
            }
            same_dtype("attention query/key", q, k)?;
            same_dtype("attention query/value", q, v)?;
            let (rq, rk, rv) = (q.rank(), k.rank(), v.rank());
            must_match("attention embedding (query vs key)", &q.shape[rq - 1], &k.shape[rk - 1], symbols)?;
            must_match("attention source length (key vs value)", &k.shape[rk - 2], &v.shape[rv - 2], symbols)?;
            let batch = broadcast_shapes(&q.shape[..rq - 2], &k.shape[..rk - 2])?;
            let mut shape = broadcast_shapes(&batch, &v.shape[..rv - 2])?;
            if let Some(m) = ins.get(3) {
                if m.dtype != DType::Bool && m.dtype != q.dtype {
                    return Err(format!("attention mask must be bool or {}, got {}", q.dtype, m.dtype));
                }
                let mut scores = shape.clone();
                scores.extend([q.shape[rq - 2].clone(), k.shape[rk - 2].clone()]);
                broadcast_shapes(&scores, &m.shape).map_err(|e| format!("attention mask: {e}"))?;
            }
            shape.extend([q.shape[rq - 2].clone(), v.shape[rv - 1].clone()]);
            Ok(TensorType::new(q.dtype, shape))
        }
        Op::Reshape { shape } => {
            let x = ins[0];
            if let Some(d) = shape.iter().find(|d| d.as_const().is_some_and(|c| c < 0)) {
                return Err(format!("reshape to a negative dimension {d:?}"));
            }
            let target = TensorType::new(x.dtype, shape.clone());
            must_match("reshape element count", &x.numel(), &target.numel(), symbols)?;
            Ok(target)
        }
        Op::Expand { shape } => {
            let x = ins[0];
            if x.rank() > shape.len() {
                return Err(format!("expand of rank {} to rank {}", x.rank(), shape.len()));
            }
            let lead = shape.len() - x.rank();
            for (d, t) in x.shape.iter().zip(&shape[lead..]) {
                if d.as_const() != Some(1) {
                    must_match("expand of a non-1 dimension", d, t, symbols)?;
                }
            }
            Ok(TensorType::new(x.dtype, shape.clone()))
        }
        Op::Permute { perm } => {
            let x = ins[0];
            check_permutation(perm, x.rank())?;
            Ok(TensorType::new(x.dtype, perm.iter().map(|&p| x.shape[p].clone()).collect()))
        }
        Op::Slice { axis, start, end, step } => {
            let x = ins[0];
            axis_ok(*axis, x.rank())?;
            let mut shape = x.shape.clone();
            shape[*axis] = slice_len(&x.shape[*axis], *start, *end, *step, symbols)?;
            Ok(TensorType::new(x.dtype, shape))
        }
        Op::Concat { axis } => {
            let first = ins[0];
            axis_ok(*axis, first.rank())?;
            let mut shape = first.shape.clone();
            for t in &ins[1..] {
                same_dtype("concat", first, t)?;
                if t.rank() != first.rank() {
                    return Err(format!("concat of rank {} and rank {}", first.rank(), t.rank()));
                }
                for (i, (a, b)) in first.shape.iter().zip(&t.shape).enumerate() {
                    if i != *axis {
                        must_match(&format!("concat dimension {i}"), a, b, symbols)?;
                    }
                }
                shape[*axis] = Dim::add(shape[*axis].clone(), t.shape[*axis].clone());
            }
            Ok(TensorType::new(first.dtype, shape))
        }
        Op::Gather { axis } => {
            let (data, idx) = (ins[0], ins[1]);
            axis_ok(*axis, data.rank())?;
            if !idx.dtype.is_int() {
                return Err(format!("gather indices must be integers, got {}", idx.dtype));
            }
            let mut shape = data.shape[..*axis].to_vec();
            shape.extend(idx.shape.iter().cloned());
            shape.extend(data.shape[axis + 1..].iter().cloned());
            Ok(TensorType::new(data.dtype, shape))
        }
        Op::Full { dtype, shape, .. } => Ok(TensorType::new(*dtype, shape.clone())),
        Op::Arange { len, dtype, .. } => Ok(TensorType::new(*dtype, vec![len.clone()])),
        Op::Random { dist, dtype, shape, .. } => {
            let ok = match dist {
                crate::RandomDist::Uniform { .. } | crate::RandomDist::Normal { .. } => dtype.is_float(),
                crate::RandomDist::Int { .. } => *dtype != DType::Bool,
                crate::RandomDist::Perm => dtype.is_int() && shape.len() == 1,
            };
            if !ok {
                return Err(format!("{}: cannot produce {} with {} dims", op.name(), dtype, shape.len()));
            }
            Ok(TensorType::new(*dtype, shape.clone()))
        }
        Op::CumSum { axis } => {
            axis_ok(*axis, ins[0].rank())?;
            Ok(ins[0].clone())
        }
        Op::Scan { axis, kind } => {
            axis_ok(*axis, ins[0].rank())?;
            let x = ins[0];
            match kind {
                ScanKind::ArgMax | ScanKind::ArgMin => Ok(TensorType::new(DType::I64, x.shape.clone())),
                ScanKind::LogSumExp if !x.dtype.is_float() => {
                    Err(format!("scan logsumexp needs a float input, got {}", x.dtype))
                }
                _ => Ok(x.clone()),
            }
        }
        Op::ArgMin { axis, keep_dims } => reduce(ins[0], DType::I64, &[*axis], *keep_dims),
        Op::Sort { axis, k, indices, .. } => {
            let x = ins[0];
            axis_ok(*axis, x.rank())?;
            if let (Some(k), Some(n)) = (k.as_const(), x.shape[*axis].as_const()) {
                if k < 0 || k > n {
                    return Err(format!("sort: k = {k} outside 0..={n}"));
                }
            }
            let mut shape = x.shape.clone();
            shape[*axis] = k.clone();
            Ok(TensorType::new(if *indices { DType::I64 } else { x.dtype }, shape))
        }
        Op::Pad { lo, hi, interior, .. } => {
            let x = ins[0];
            lengths_match(x.rank(), &[("lo", lo.len()), ("hi", hi.len()), ("interior", interior.len())])?;
            let mut shape = Vec::with_capacity(x.rank());
            for (i, d) in x.shape.iter().enumerate() {
                if interior[i] < 0 {
                    return Err(format!("pad: negative interior padding {}", interior[i]));
                }
                // d + lo + hi + interior * (d - 1), for d >= 1.
                let grown = if interior[i] == 0 {
                    d.clone()
                } else {
                    plus(Dim::mul(d.clone(), Dim::Const(interior[i].saturating_add(1))), -interior[i])
                };
                shape.push(plus(grown, lo[i].saturating_add(hi[i])));
            }
            Ok(TensorType::new(x.dtype, shape))
        }
        Op::Flip { axes } => {
            for &a in axes {
                axis_ok(a, ins[0].rank())?;
            }
            Ok(ins[0].clone())
        }
        Op::Upsample { size, scales, .. } => {
            let x = ins[0];
            rank_at_least("upsample", x, size.len() + 2)?;
            if !scales.is_empty() {
                lengths_match(size.len(), &[("scales", scales.len())])?;
            }
            let mut shape = x.shape[..x.rank() - size.len()].to_vec();
            shape.extend(size.iter().cloned());
            Ok(TensorType::new(x.dtype, shape))
        }
        Op::GatherElements { axis } => {
            let (data, index) = (ins[0], ins[1]);
            axis_ok(*axis, data.rank())?;
            elements_index("gather_elements", data, index, data, Some(*axis))?;
            Ok(TensorType::new(data.dtype, index.shape.clone()))
        }
        Op::ScatterElements { axis, .. } => {
            let (data, index, src) = (ins[0], ins[1], ins[2]);
            axis_ok(*axis, data.rank())?;
            same_dtype("scatter_elements", data, src)?;
            elements_index("scatter_elements", data, index, data, Some(*axis))?;
            elements_index("scatter_elements", data, index, src, None)?;
            Ok(data.clone())
        }
        Op::IndexGather { axis } => index_gather(symbols, *axis, ins[0], &ins[1..]),
        Op::IndexPut { axis, .. } => {
            let (data, values) = (ins[0], ins[1]);
            same_dtype("index_put", data, values)?;
            let want = index_gather(symbols, *axis, data, &ins[2..])?;
            if values.rank() != want.rank() {
                return Err(format!(
                    "index_put: values of rank {}, the indexed positions have rank {}",
                    values.rank(),
                    want.rank()
                ));
            }
            for (a, b) in values.shape.iter().zip(&want.shape) {
                must_match("index_put values", a, b, symbols)?;
            }
            Ok(data.clone())
        }
        Op::NonZero { count } => {
            if !symbols.is_valid(*count) {
                return Err(format!("nonzero count is unknown symbol {count}"));
            }
            Ok(TensorType::new(DType::I64, vec![Dim::Sym(*count), Dim::Const(ins[0].rank() as i64)]))
        }
        Op::BindDim { .. } => Err("bind_dim has no result".into()),
        Op::Assert { .. } => Err("assert has no result".into()),
        Op::Linalg { op, complex, .. } => linalg_type(*op, *complex, ins),
        Op::While { .. } => Err("while has one result per carried value".into()),
        Op::Fused { program } => {
            let dtypes: Vec<DType> = ins.iter().map(|t| t.dtype).collect();
            let types = kiln_isa::register_types(program, &dtypes).map_err(|e| format!("fused: {e}"))?;
            let shape = ins.iter().try_fold(Vec::new(), |acc, t| broadcast_shapes(&acc, &t.shape))?;
            Ok(TensorType::new(types[types.len() - 1], shape))
        }
    }
}

/// Shared by the element-wise gather and scatter ops: `index` is an integer
/// tensor of `data`'s rank, no larger than `bound` on any axis (`data` off
/// `axis` when `skip_axis`).
/// A fused conv's or linear's result: the plain op's, on f32, with the
/// operands the epilogue's flags say and a residual shaped like the result.
/// `[N, H, W, C]` viewed as `[N, C, H, W]` (rank-4 types; others as they are).
/// A channels-last convolution's type: `infer` (the channels-first rule)
/// on its operands with the input and the residual (operand `residual`)
/// viewed `[N, C, H, W]`, the result viewed back `[N, H, W, C]`.
fn channels_last(
    ins: &[&TensorType],
    residual: Option<usize>,
    infer: impl FnOnce(&[&TensorType]) -> Result<TensorType, String>,
) -> Result<TensorType, String> {
    let nchw: Vec<TensorType> = ins
        .iter()
        .enumerate()
        .map(|(i, t)| if i == 0 || Some(i) == residual { to_nchw(t) } else { (*t).clone() })
        .collect();
    let refs: Vec<&TensorType> = nchw.iter().collect();
    Ok(to_nhwc(&infer(&refs)?))
}

fn to_nchw(t: &TensorType) -> TensorType {
    match &t.shape[..] {
        [n, h, w, c] => TensorType::new(t.dtype, vec![n.clone(), c.clone(), h.clone(), w.clone()]),
        _ => t.clone(),
    }
}

/// `[N, C, H, W]` viewed as `[N, H, W, C]`.
fn to_nhwc(t: &TensorType) -> TensorType {
    match &t.shape[..] {
        [n, c, h, w] => TensorType::new(t.dtype, vec![n.clone(), h.clone(), w.clone(), c.clone()]),
        _ => t.clone(),
    }
}

fn fused_epilogue(
    symbols: &PrimaryMap<SymbolId, Symbol>,
    op: &Op,
    epilogue: &crate::Epilogue,
    ins: &[&TensorType],
) -> Result<TensorType, String> {
    let name = op.name();
    if ins.len() != epilogue.operand_count() {
        return Err(format!(
            "{name} with this epilogue takes {} operands, got {}",
            epilogue.operand_count(),
            ins.len()
        ));
    }
    if ins[0].dtype != DType::F32 {
        return Err(format!("a fused {name} computes f32, got {}", ins[0].dtype));
    }
    let plain = 2 + usize::from(epilogue.bias);
    let out = infer_one(symbols, op, &ins[..plain])?;
    if let Some(r) = epilogue.residual_operand().map(|i| ins[i]) {
        if r.dtype != out.dtype || r.rank() != out.rank() {
            return Err(format!("{name} residual {} must have the result's type", r.dtype));
        }
        for (a, b) in r.shape.iter().zip(&out.shape) {
            must_match(&format!("{name} residual dim"), a, b, symbols)?;
        }
    }
    Ok(out)
}

fn elements_index(
    what: &str,
    data: &TensorType,
    index: &TensorType,
    bound: &TensorType,
    skip_axis: Option<usize>,
) -> Result<(), String> {
    if !index.dtype.is_int() {
        return Err(format!("{what}: index must be integers, got {}", index.dtype));
    }
    if index.rank() != data.rank() || bound.rank() != data.rank() {
        return Err(format!("{what}: index rank {} differs from rank {}", index.rank(), bound.rank()));
    }
    for (d, (i, b)) in index.shape.iter().zip(&bound.shape).enumerate() {
        if Some(d) == skip_axis {
            continue;
        }
        if let (Some(i), Some(b)) = (i.as_const(), b.as_const()) {
            if i > b {
                return Err(format!("{what}: index dimension {d} is {i}, larger than {b}"));
            }
        }
    }
    Ok(())
}

/// The result of [`Op::IndexGather`]: `data.shape[..axis] ++ B ++ data.shape[axis+k..]`.
fn index_gather(
    symbols: &PrimaryMap<SymbolId, Symbol>,
    axis: usize,
    data: &TensorType,
    indices: &[&TensorType],
) -> Result<TensorType, String> {
    let k = indices.len();
    if axis + k > data.rank() {
        return Err(format!("{k} index tensors from axis {axis} exceed rank {}", data.rank()));
    }
    let first = indices[0];
    for t in indices {
        if !t.dtype.is_int() {
            return Err(format!("index tensors must be integers, got {}", t.dtype));
        }
        if t.rank() != first.rank() {
            return Err(format!("index tensors of rank {} and {} (broadcast them first)", first.rank(), t.rank()));
        }
        for (a, b) in first.shape.iter().zip(&t.shape) {
            must_match("index tensor shapes", a, b, symbols)?;
        }
    }
    let mut shape = data.shape[..axis].to_vec();
    shape.extend(first.shape.iter().cloned());
    shape.extend(data.shape[axis + k..].iter().cloned());
    Ok(TensorType::new(data.dtype, shape))
}

pub(crate) fn check_permutation(perm: &[usize], rank: usize) -> Result<(), String> {
    let mut seen = vec![false; perm.len()];
    let ok = perm.len() == rank && perm.iter().all(|&p| p < rank && !std::mem::replace(&mut seen[p], true));
    if !ok {
        return Err(format!("{perm:?} is not a permutation of 0..{rank}"));
    }
    Ok(())
}

fn reduce(x: &TensorType, dtype: DType, axes: &[usize], keep_dims: bool) -> Result<TensorType, String> {
    for &a in axes {
        axis_ok(a, x.rank())?;
    }
    let shape = (0..x.rank())
        .filter_map(|i| match (axes.contains(&i), keep_dims) {
            (false, _) => Some(x.shape[i].clone()),
            (true, true) => Some(Dim::Const(1)),
            (true, false) => None,
        })
        .collect();
    Ok(TensorType::new(dtype, shape))
}

fn matmul(symbols: &PrimaryMap<SymbolId, Symbol>, a: &TensorType, b: &TensorType) -> Result<TensorType, String> {
    if a.rank() == 0 || b.rank() == 0 {
        return Err("matmul operands must have rank >= 1".to_string());
    }
    same_dtype("matmul", a, b)?;
    // torch.matmul: a rank-1 lhs gains a leading 1, a rank-1 rhs a trailing 1,
    // and those unit dims are dropped from the result.
    let sa: Vec<Dim> = if a.rank() == 1 { vec![Dim::Const(1), a.shape[0].clone()] } else { a.shape.clone() };
    let sb: Vec<Dim> = if b.rank() == 1 { vec![b.shape[0].clone(), Dim::Const(1)] } else { b.shape.clone() };
    let (ra, rb) = (sa.len(), sb.len());
    must_match("matmul inner dimension", &sa[ra - 1], &sb[rb - 2], symbols)?;
    let mut shape = broadcast_shapes(&sa[..ra - 2], &sb[..rb - 2])?;
    if a.rank() > 1 {
        shape.push(sa[ra - 2].clone());
    }
    if b.rank() > 1 {
        shape.push(sb[rb - 1].clone());
    }
    Ok(TensorType::new(a.dtype, shape))
}

/// Output size of one pooled dimension, torch's formula:
/// `floor_or_ceil((in + 2p - d(k-1) - 1) / s) + 1`, where in ceil mode the
/// last window must start inside the input or left padding.
fn pool_dim(input: &Dim, k: i64, s: i64, p: i64, d: i64, ceil_mode: bool) -> Result<Dim, String> {
    let span = window_span(input, &Dim::Const(k), p, d);
    if let Some(span) = span.as_const() {
        let windows = span.div_euclid(s).saturating_add((ceil_mode && span.rem_euclid(s) != 0) as i64);
        let mut out = windows.saturating_add(1);
        let input = input.as_const().unwrap_or(0);
        if ceil_mode && (out - 1).saturating_mul(s) >= input.saturating_add(p) {
            out -= 1;
        }
        return Ok(Dim::Const(out));
    }
    if !ceil_mode {
        return Ok(plus(Dim::floor_div(span, Dim::Const(s)), 1));
    }
    // The last-window correction never fires when s + p <= d(k-1) + 1, so the
    // plain ceiling is exact there; elsewhere it depends on the binding.
    if s.saturating_add(p) > d.saturating_mul(k - 1).saturating_add(1) {
        return Err(
            "ceil_mode pooling of a symbolic dimension with stride + padding > window is not expressible".to_string()
        );
    }
    let ceil = Dim::floor_div(plus(span, s - 1), Dim::Const(s));
    Ok(plus(ceil, 1))
}

/// Length of `x[start:end:step]` along a dimension of size `dim`, Python
/// semantics (negative indices count from the end, both clamped to `[0, dim]`).
fn slice_len(
    dim: &Dim,
    start: i64,
    end: i64,
    step: i64,
    symbols: &PrimaryMap<SymbolId, Symbol>,
) -> Result<Dim, String> {
    if step < 1 {
        return Err(format!("slice step must be >= 1, got {step}"));
    }
    if let Some(n) = dim.as_const() {
        let clamp = |i: i64| if i < 0 { i.saturating_add(n).max(0) } else { i.min(n) };
        let (b, e) = (clamp(start), clamp(end));
        let len = if e > b { (e - b - 1) / step + 1 } else { 0 };
        return Ok(Dim::Const(len));
    }
    // Positions as `coef * dim + offset`, coef in {0, 1}.
    let (lo, hi) = if symbols_valid(dim, symbols) { dim.bounds(symbols) } else { (0, None) };
    let start_pos = if start < 0 { (1, start) } else { (0, start) };
    let end_pos = if end < 0 {
        (1, end)
    } else if hi.is_some_and(|h| end >= h) || end == i64::MAX {
        (1, 0)
    } else if end <= lo {
        (0, end)
    } else {
        return Err(format!("slice end {end} may or may not exceed the symbolic dimension {}", dim.display(symbols)));
    };
    let offset = end_pos.1.saturating_sub(start_pos.1);
    match end_pos.0 - start_pos.0 {
        0 => Ok(Dim::Const(if offset > 0 { (offset - 1) / step + 1 } else { 0 })),
        // ceil((dim + offset) / step), assuming the range is non-empty.
        1 => Ok(Dim::floor_div(plus(dim.clone(), offset.saturating_add(step - 1)), Dim::Const(step))),
        _ => Err(format!("slice from {start} to {end} of a symbolic dimension is not expressible")),
    }
}

#[cfg(test)]
mod tests;

/// [`Op::Linalg`]: the result of `op` on `[.., m, n]` matrices.
fn linalg_type(op: crate::LinalgOp, complex: bool, ins: &[&TensorType]) -> Result<TensorType, String> {
    use crate::LinalgOp as L;
    if complex {
        // The real op's type on the operands without their (re, im) dim;
        // complex-valued results get it back.
        let stripped = ins
            .iter()
            .map(|t| {
                if !matches!(t.dtype, DType::F32 | DType::F64) {
                    return Ok((*t).clone());
                }
                match t.shape.split_last() {
                    Some((Dim::Const(2), rest)) => Ok(TensorType::new(t.dtype, rest.to_vec())),
                    _ => Err(format!("complex linalg {}: an operand without a trailing (re, im) dim", op.name())),
                }
            })
            .collect::<Result<Vec<_>, String>>()?;
        let refs: Vec<&TensorType> = stripped.iter().collect();
        let mut t = linalg_type(op, false, &refs)?;
        if matches!(t.dtype, DType::F32 | DType::F64) && !matches!(op, L::LogAbsDet | L::EigvalsH | L::SvdS) {
            t.shape.push(Dim::Const(2));
        }
        return Ok(t);
    }
    let a = ins[0];
    let r = a.rank();
    if r < 2 || !matches!(a.dtype, DType::F32 | DType::F64) {
        return Err(format!("linalg {}: needs f32/f64 matrices, got {}[{} dims]", op.name(), a.dtype, r));
    }
    let batch = a.shape[..r - 2].to_vec();
    let (m, n) = (a.shape[r - 2].clone(), a.shape[r - 1].clone());
    let with = |tail: &[Dim]| [batch.as_slice(), tail].concat();
    let square = !matches!(
        op,
        L::QrQ
            | L::QrR
            | L::QrQComplete
            | L::QrRComplete
            | L::LuFactor
            | L::LuPivots
            | L::LuInfo
            | L::PivotsToPermutation
            | L::Geqrf
            | L::GeqrfTau
            | L::HouseholderProduct
    ) && !op.is_svd();
    if square && m.as_const().zip(n.as_const()).is_some_and(|(m, n)| m != n) {
        return Err(format!("linalg {}: needs square matrices, got {m:?}x{n:?}", op.name()));
    }
    let rhs = || {
        let b = ins.get(1).ok_or_else(|| format!("linalg {}: needs a right-hand side", op.name()))?;
        if b.dtype != a.dtype || b.rank() + 1 < r || b.shape[..r - 2] != a.shape[..r - 2] {
            return Err(format!(
                "linalg {}: right-hand side {}[{} dims] does not match the matrices' batch",
                op.name(),
                b.dtype,
                b.rank()
            ));
        }
        Ok(TensorType::new(a.dtype, b.shape.clone()))
    };
    let kmin = m.as_const().zip(n.as_const()).map(|(m, n)| Dim::Const(m.min(n)));
    let k = || kmin.clone().ok_or_else(|| format!("linalg {}: needs static matrix sizes", op.name()));
    Ok(match op {
        L::Det | L::SignDet | L::LogAbsDet => TensorType::new(a.dtype, batch),
        L::Inv | L::LuFactor | L::Cholesky | L::LdlFactor => a.clone(),
        L::LdlPivots => TensorType::new(DType::I32, with(&[n])),
        L::LdlInfo => TensorType::new(DType::I32, batch),
        L::LdlSolve => {
            let (p, b) = match (ins.get(1), ins.get(2)) {
                (Some(p), Some(b)) => (p, b),
                _ => return Err("linalg ldl_solve: needs (LD, pivots, B)".to_string()),
            };
            if !matches!(p.dtype, DType::I32 | DType::I64) || p.rank() + 1 != r {
                return Err(format!("linalg ldl_solve: pivots {}[{} dims]", p.dtype, p.rank()));
            }
            if b.dtype != a.dtype || b.rank() != r || b.shape[..r - 2] != a.shape[..r - 2] {
                return Err(format!("linalg ldl_solve: right-hand side {}[{} dims]", b.dtype, b.rank()));
            }
            (*b).clone()
        }
        L::LuPivots => TensorType::new(DType::I32, with(&[k()?])),
        L::EigvalsH => TensorType::new(a.dtype, with(&[n])),
        L::EigvecsH => a.clone(),
        L::Geqrf => a.clone(),
        L::GeqrfTau => TensorType::new(a.dtype, with(&[k()?])),
        L::HouseholderProduct => {
            let tau = ins.get(1).ok_or_else(|| "linalg householder_product: needs tau".to_string())?;
            if tau.dtype != a.dtype || tau.rank() + 1 != r {
                return Err(format!("linalg householder_product: tau {}[{} dims]", tau.dtype, tau.rank()));
            }
            a.clone()
        }
        L::PivotsToPermutation => {
            let p = ins.get(1).ok_or_else(|| "linalg pivots_to_permutation: needs the pivots".to_string())?;
            if !matches!(p.dtype, DType::I32 | DType::I64) || p.rank() + 1 != r {
                return Err(format!("linalg pivots_to_permutation: pivots {}[{} dims]", p.dtype, p.rank()));
            }
            TensorType::new(a.dtype, with(&[m.clone(), m]))
        }
        L::SvdS => TensorType::new(a.dtype, with(&[k()?])),
        L::SvdU => TensorType::new(a.dtype, with(&[m, k()?])),
        L::SvdVh => TensorType::new(a.dtype, with(&[k()?, n])),
        L::SvdUFull => TensorType::new(a.dtype, with(&[m.clone(), m])),
        L::SvdVhFull => TensorType::new(a.dtype, with(&[n.clone(), n])),
        L::LuInfo | L::CholeskyInfo => TensorType::new(DType::I32, batch),
        L::Solve | L::TriangularSolve | L::CholeskySolve => rhs()?,
        L::QrQ => TensorType::new(a.dtype, with(&[m, k()?])),
        L::QrR => TensorType::new(a.dtype, with(&[k()?, n])),
        L::QrQComplete => TensorType::new(a.dtype, with(&[m.clone(), m])),
        L::QrRComplete => TensorType::new(a.dtype, with(&[m, n])),
    })
}

/// [`Op::QuantLinear`]'s static activation parameters: a positive finite
/// f32 scale and an int8 zero point.
fn static_activations(dynamic: bool, scale: Option<f64>, zero_point: i64) -> Result<(), String> {
    let Some(s) = scale else {
        return if zero_point == 0 { Ok(()) } else { Err("quant_linear act_zero_point needs act_scale".into()) };
    };
    if dynamic {
        return Err("quant_linear cannot be both dynamic and static".into());
    }
    if !(s.is_finite() && s > 0.0 && (s as f32) as f64 == s && (-128..=127).contains(&zero_point)) {
        return Err(format!("quant_linear act_scale {s} / act_zero_point {zero_point} out of range"));
    }
    Ok(())
}

/// [`Op::QuantConv`]'s operands: an i8 weight, f32 scales `[Cout]`, then
/// [`Op::Conv`]'s rules on the weight's shape.
fn quant_conv(
    symbols: &PrimaryMap<SymbolId, Symbol>,
    conv: &Op,
    epilogue: &crate::Epilogue,
    ins: &[&TensorType],
    int8_acts: bool,
    static_acts: bool,
) -> Result<TensorType, String> {
    let want = 3 + usize::from(epilogue.bias) + usize::from(epilogue.residual != crate::Residual::None);
    if ins.len() != want {
        return Err(format!("quant_conv with epilogue {epilogue:?} takes {want} operands, got {}", ins.len()));
    }
    let (x, w, scales) = (ins[0], ins[1], ins[2]);
    if !matches!(x.dtype, DType::F32 | DType::I8) || w.dtype != DType::I8 {
        return Err(format!("quant_conv takes an f32 (or i8) input and an i8 weight, got {} and {}", x.dtype, w.dtype));
    }
    let Some(cout) = w.shape.first().and_then(|d| d.as_const()) else {
        return Err("quant_conv weight must have a static output-channel dim".into());
    };
    if scales.dtype != DType::F32 || scales.static_shape().as_deref() != Some(&[cout][..]) {
        return Err(format!("quant_conv scales must be f32[{cout}], got {}{:?}", scales.dtype, scales.shape));
    }
    let bias = ins.get(3).filter(|_| epilogue.bias);
    if bias.is_some_and(|b| b.dtype != DType::F32) {
        return Err("quant_conv bias must be f32".into());
    }
    if let Op::Conv { groups, stride, .. } = conv {
        // Depthwise (one input channel per group, one output channel per
        // group, 2-d) takes static int8 activations too.
        let depthwise = static_acts
            && stride.len() == 2
            && w.shape.get(1).and_then(|d| d.as_const()) == Some(1)
            && cout == *groups
            && x.shape.get(1).and_then(|d| d.as_const()) == Some(*groups);
        if int8_acts && *groups != 1 && !depthwise {
            return Err(format!(
                "quant_conv with int8 activations must be dense (or depthwise with static ones), got {groups} groups"
            ));
        }
    }
    let wf = TensorType::new(DType::F32, w.shape.clone());
    let xf = TensorType::new(DType::F32, x.shape.clone());
    let mut float_ins: Vec<&TensorType> = vec![&xf, &wf];
    float_ins.extend(bias.copied());
    let out = infer_one(symbols, conv, &float_ins)?;
    if epilogue.residual != crate::Residual::None {
        let r = ins[3 + usize::from(epilogue.bias)];
        // An i8 residual is checked against `res_quant` by the caller.
        if !matches!(r.dtype, DType::F32 | DType::I8) || r.rank() != out.rank() {
            return Err("quant_conv residual must be shaped like its result".into());
        }
        for (a, b) in r.shape.iter().zip(&out.shape) {
            must_match("quant_conv residual", a, b, symbols)?;
        }
    }
    Ok(out)
}

/// [`Op::QuantLinear`]'s operands against its attributes (see its doc).
fn quant_linear(
    symbols: &PrimaryMap<SymbolId, Symbol>,
    ins: &[&TensorType],
    bits: u8,
    group: usize,
    zero_points: bool,
    dynamic: bool,
) -> Result<TensorType, String> {
    let (x, w, scales) = (ins[0], ins[1], ins[2]);
    rank_at_least("quant_linear input", x, 1)?;
    if x.dtype != DType::F32 {
        return Err(format!("quant_linear input must be f32, got {}", x.dtype));
    }
    let per_byte = match (bits, w.dtype) {
        (8, DType::I8) => 1,
        (4, DType::U8) => 2,
        _ => return Err(format!("quant_linear with {bits}-bit weights cannot store them as {}", w.dtype)),
    };
    let (Some(ws), Some(ss)) = (w.static_shape(), scales.static_shape()) else {
        return Err("quant_linear weights and scales must have static shapes".into());
    };
    let [n, bytes] = ws[..] else { return Err(format!("quant_linear weight must have rank 2, got {}", ws.len())) };
    let k = bytes * per_byte;
    if group == 0 || k % group as i64 != 0 {
        return Err(format!("quant_linear group {group} does not divide in_features {k}"));
    }
    must_match("quant_linear in_features", &x.shape[x.rank() - 1], &Dim::Const(k), symbols)?;
    let groups = [n, k / group as i64];
    if scales.dtype != DType::F32 || ss != groups {
        return Err(format!("quant_linear scales must be f32{groups:?}, got {}{ss:?}", scales.dtype));
    }
    let mut rest = ins[3..].iter();
    if zero_points {
        match rest.next() {
            Some(z) if z.dtype == DType::I8 && z.static_shape().as_deref() == Some(&groups[..]) => {}
            _ => return Err(format!("quant_linear zero points must be i8{groups:?}")),
        }
    }
    if let Some(b) = rest.next() {
        if b.dtype != DType::F32 || b.rank() != 1 {
            return Err("quant_linear bias must be 1-d f32".into());
        }
        must_match("quant_linear bias length", &b.shape[0], &Dim::Const(n), symbols)?;
    }
    if rest.next().is_some() {
        return Err("quant_linear has too many operands for its zero_points flag".into());
    }
    if dynamic && (bits != 8 || group as i64 != k || zero_points) {
        return Err("int8 activations (dynamic or static) need symmetric per-channel int8 weights".into());
    }
    let mut shape = x.shape.clone();
    let last = shape.len() - 1;
    shape[last] = Dim::Const(n);
    Ok(TensorType::new(DType::F32, shape))
}
