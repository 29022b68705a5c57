//! Built-in lowerings of library custom ops that real models call, registered
//! through the same extension point users have ([`ImportOptions`]'s custom
//! ops): `ImportOptions::default()` holds them, and registering the same name
//! replaces one. `kiln ops --custom` lists them.

use super::custom::{CustomOpContext, ImportOptions};
use kiln_ir::{BinaryOp as B, DType, Dim, Op, ValueId};

/// A built-in lowering: the op it lowers and what it becomes.
pub struct Builtin {
    /// `namespace::name`, as registered.
    pub name: &'static str,
    pub note: &'static str,
    lower: fn(&mut CustomOpContext<'_, '_>) -> Result<Vec<ValueId>, String>,
}

/// Every built-in lowering, in registration order.
pub const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "transformers::grouped_mm_fallback",
        note: "Hugging Face MoE experts (`grouped_mm_fallback(input[S, K], weight[E, K, N], offs[E])`): \
               one grouped GEMM, a packed GEMM per expert's block of rows (f32; f16/bf16 through f32; \
               f64 as a masked sum of per-expert products); rows past the last offset are zero",
        lower: grouped_mm_fallback,
    },
    Builtin {
        name: "torch_nn::_linear_cross_entropy_batch_chunked",
        note: "`F.linear_cross_entropy(.., options=..)`'s chunked op: `cross_entropy(linear(input, w, b), \
               target, ..)` in one piece (logits in the input's dtype, softmax and reduction in f32, f64 for \
               f64); class indices or probabilities, class weights, ignore_index; mean or sum; the gradient \
               outputs only when autograd did not ask for them (empty)",
        lower: linear_cross_entropy,
    },
    Builtin {
        name: "torch_nn::_linear_cross_entropy_batch_chunked_no_reduction",
        note: "its `reduction='none'` form: the per-row losses",
        lower: linear_cross_entropy_rows,
    },
];

/// `torch_nn::_linear_cross_entropy_batch_chunked(..) -> (loss, grad_input,
/// grad_linear_weight, grad_linear_bias)`: the loss, and the gradients as
/// the empty tensors the op returns when no gradient was asked for (a
/// program that asks for them trains, which kiln does not).
fn linear_cross_entropy(ctx: &mut CustomOpContext<'_, '_>) -> Result<Vec<ValueId>, String> {
    let (imp, n) = ctx.parts();
    let loss = crate::import::ops::composite::linear_cross_entropy(imp, n, false).map_err(CustomOpContext::message)?;
    let mut out = vec![loss];
    for i in 1..ctx.output_count() {
        let ty = ctx.output_type(i)?;
        if ty.shape.iter().any(|d| d.as_const() != Some(0)) {
            return Err(
                "linear_cross_entropy's gradients were asked for (a training program): kiln computes the loss only"
                    .into(),
            );
        }
        out.push(ctx.push_typed(Op::Full { value: 0.0, dtype: ty.dtype, shape: ty.shape.clone() }, vec![], ty)?);
    }
    Ok(out)
}

/// `torch_nn::_linear_cross_entropy_batch_chunked_no_reduction(..) -> loss[N]`.
fn linear_cross_entropy_rows(ctx: &mut CustomOpContext<'_, '_>) -> Result<Vec<ValueId>, String> {
    let (imp, n) = ctx.parts();
    let loss = crate::import::ops::composite::linear_cross_entropy(imp, n, true).map_err(CustomOpContext::message)?;
    Ok(vec![loss])
}

/// Registers every built-in on `options`.
pub(crate) fn register_all(options: &mut ImportOptions) {
    for b in BUILTINS {
        options.register_custom_op(b.name, b.lower);
    }
}

/// `transformers::grouped_mm_fallback(Tensor input, Tensor weight, Tensor offs) -> Tensor`:
/// rows sorted by expert, `offs` the cumulative row counts per expert; the
/// reference (transformers/integrations/moe.py) zero-fills its output and
/// runs one `torch.mm` per expert's block, so rows past the last offset are
/// zero. f16/bf16 go through the f32 kernel and are rounded once at the end,
/// as torch's CPU `mm` accumulates them in f32; f64 (no grouped f64 kernel)
/// is a masked sum of one f64 product per expert.
fn grouped_mm_fallback(ctx: &mut CustomOpContext<'_, '_>) -> Result<Vec<ValueId>, String> {
    let x = ctx.input_tensor("input")?;
    let w = ctx.input_tensor("weight")?;
    let offs = ctx.input_tensor("offs")?;
    let (xt, wt) = (ctx.ty(x).dtype, ctx.ty(w).dtype);
    if xt != wt {
        return Err(format!(
            "grouped_mm_fallback: input is {xt} but weight is {wt} (transformers casts them to one dtype)"
        ));
    }
    match xt {
        DType::F32 => Ok(vec![ctx.push(Op::GroupedMatMul, vec![x, w, offs])?]),
        DType::F16 | DType::BF16 => {
            let (x, w) = (ctx.cast(x, DType::F32), ctx.cast(w, DType::F32));
            let y = ctx.push(Op::GroupedMatMul, vec![x, w, offs])?;
            Ok(vec![ctx.cast(y, xt)])
        }
        DType::F64 => grouped_by_masks(ctx, x, w, offs),
        other => Err(format!(
            "grouped_mm_fallback of {other} is not supported (kiln's grouped GEMM takes f32, f64, f16 and bf16)"
        )),
    }
}

/// `grouped_mm_fallback` as `Σₑ where(offs[e-1] ≤ r < offs[e], x·w[e], 0)`:
/// exact per row (each row is in one block) at E times the GEMM work, for
/// dtypes the grouped kernel does not take. Offsets that decrease fail the
/// run, as the grouped kernel's check does.
fn grouped_by_masks(
    ctx: &mut CustomOpContext<'_, '_>,
    x: ValueId,
    w: ValueId,
    offs: ValueId,
) -> Result<Vec<ValueId>, String> {
    let (xt, wt) = (ctx.ty(x).clone(), ctx.ty(w).clone());
    if xt.rank() != 2 || wt.rank() != 3 || ctx.ty(offs).rank() != 1 {
        return Err(format!(
            "grouped_mm_fallback takes input[S, K], weight[E, K, N], offs[E]; got ranks {}, {}",
            xt.rank(),
            wt.rank()
        ));
    }
    let Some(experts) = wt.shape[0].as_const() else {
        return Err("grouped_mm_fallback of f64 needs a static number of experts".to_string());
    };
    let (k, n) = (wt.shape[1].clone(), wt.shape[2].clone());
    let rows = ctx.push(Op::Arange { start: 0.0, step: 1.0, len: xt.shape[0].clone(), dtype: DType::I64 }, vec![])?;
    let rows = ctx.push(Op::Reshape { shape: vec![xt.shape[0].clone(), Dim::Const(1)] }, vec![rows])?;
    let offs = ctx.cast(offs, DType::I64);
    let zero = ctx.scalar(0.0, xt.dtype);
    let mut start = ctx.scalar(0.0, DType::I64);
    let (mut sum, mut ok) = (None, None);
    for e in 0..experts {
        let end = ctx.push(Op::Slice { axis: 0, start: e, end: e + 1, step: 1 }, vec![offs])?;
        let ordered = ctx.push(Op::Binary(B::Ge), vec![end, start])?;
        ok = Some(match ok {
            Some(prev) => ctx.push(Op::Binary(B::And), vec![prev, ordered])?,
            None => ordered,
        });
        let after = ctx.push(Op::Binary(B::Ge), vec![rows, start])?;
        let before = ctx.push(Op::Binary(B::Lt), vec![rows, end])?;
        let mine = ctx.push(Op::Binary(B::And), vec![after, before])?;
        let we = ctx.push(Op::Slice { axis: 0, start: e, end: e + 1, step: 1 }, vec![w])?;
        let we = ctx.push(Op::Reshape { shape: vec![k.clone(), n.clone()] }, vec![we])?;
        let product = ctx.push(Op::MatMul, vec![x, we])?;
        let term = ctx.push(Op::Where, vec![mine, product, zero])?;
        sum = Some(match sum {
            Some(prev) => ctx.push(Op::Binary(B::Add), vec![prev, term])?,
            None => term,
        });
        start = end;
    }
    let (Some(sum), Some(ok)) = (sum, ok) else {
        return Err("grouped_mm_fallback with no experts".to_string());
    };
    let ok = ctx.push(Op::Reshape { shape: vec![] }, vec![ok])?;
    let message = "grouped_mm_fallback: offsets must be non-negative and non-decreasing".to_string();
    let loc = ctx.location();
    ctx.graph().add_node(Op::Assert { message }, vec![ok], Vec::new(), loc);
    Ok(vec![sum])
}
