//! Built-in lowerings of library custom ops that real models call, registered
//! through the same extension point users have ([`ImportOptions`]'s custom
//! ops): `ImportOptions::default()` holds them, and registering the same name
//! replaces one. `kiln ops --custom` lists them.

use super::custom::{CustomOpContext, ImportOptions};
use kiln_ir::{Op, ValueId};

/// A built-in lowering: the op it lowers and what it becomes.
pub struct Builtin {
    /// `namespace::name`, as registered.
    pub name: &'static str,
    pub note: &'static str,
    lower: fn(&mut CustomOpContext<'_, '_>) -> Result<Vec<ValueId>, String>,
}

/// Every built-in lowering, in registration order.
pub const BUILTINS: &[Builtin] = &[Builtin {
    name: "transformers::grouped_mm_fallback",
    note: "Hugging Face MoE experts (`grouped_mm_fallback(input[S, K], weight[E, K, N], offs[E])`): \
           one grouped GEMM, a packed GEMM per expert's block of rows",
    lower: grouped_mm_fallback,
}];

/// Registers every built-in on `options`.
pub(crate) fn register_all(options: &mut ImportOptions) {
    for b in BUILTINS {
        options.register_custom_op(b.name, b.lower);
    }
}

/// `transformers::grouped_mm_fallback(Tensor input, Tensor weight, Tensor offs) -> Tensor`:
/// rows sorted by expert, `offs` the cumulative row counts per expert.
fn grouped_mm_fallback(ctx: &mut CustomOpContext<'_, '_>) -> Result<Vec<ValueId>, String> {
    let x = ctx.input_tensor("input")?;
    let w = ctx.input_tensor("weight")?;
    let offs = ctx.input_tensor("offs")?;
    Ok(vec![ctx.push(Op::GroupedMatMul, vec![x, w, offs])?])
}
