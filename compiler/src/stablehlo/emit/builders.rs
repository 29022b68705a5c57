//! Single StableHLO ops on `T` values: elementwise ops with numpy
//! broadcasting, compare/select, constants, convert, reshape, broadcast and
//! transpose. Each checks what MLIR's generic form would not (shapes that do
//! not broadcast, element counts), so a bad node fails with a reason instead
//! of an unverifiable module.

use super::text::{arr, broadcast_shapes, literal, numel, type_text};
use super::{err, EmitError, Emitter, T};
use kiln_ir::{ConstData, DType, Graph};

impl<'c, 'a> Emitter<'c, 'a> {
    pub(super) fn unary(&self, name: &str, x: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        self.op(&format!("stablehlo.{name}"), &[x], &x.shape.clone(), x.dt, &[])
    }

    /// Elementwise binary op; operands are broadcast to a common shape.
    pub(super) fn binary(&self, name: &str, a: &T<'c, 'a>, b: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        let shape = broadcast_shapes(&a.shape, &b.shape)
            .ok_or_else(|| err(format!("shapes {:?} and {:?} do not broadcast", a.shape, b.shape)))?;
        let (a, b) = (self.bcast(a, &shape)?, self.bcast(b, &shape)?);
        self.op(&format!("stablehlo.{name}"), &[&a, &b], &shape, a.dt, &[])
    }

    pub(super) fn compare(&self, dir: &str, a: &T<'c, 'a>, b: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        let shape = broadcast_shapes(&a.shape, &b.shape).ok_or_else(|| err("compare operands do not broadcast"))?;
        let (a, b) = (self.bcast(a, &shape)?, self.bcast(b, &shape)?);
        let kind = match a.dt {
            d if d.is_float() => "FLOAT",
            DType::U8 | DType::Bool => "UNSIGNED",
            _ => "SIGNED",
        };
        self.op(
            "stablehlo.compare",
            &[&a, &b],
            &shape,
            DType::Bool,
            &[
                ("comparison_direction", format!("#stablehlo<comparison_direction {dir}>")),
                ("compare_type", format!("#stablehlo<comparison_type {kind}>")),
            ],
        )
    }

    pub(super) fn select(&self, c: &T<'c, 'a>, a: &T<'c, 'a>, b: &T<'c, 'a>) -> Result<T<'c, 'a>, EmitError> {
        let shape = broadcast_shapes(
            &c.shape,
            &broadcast_shapes(&a.shape, &b.shape).ok_or_else(|| err("select operands do not broadcast"))?,
        )
        .ok_or_else(|| err("select operands do not broadcast"))?;
        let (c, a, b) = (self.bcast(c, &shape)?, self.bcast(a, &shape)?, self.bcast(b, &shape)?);
        self.op("stablehlo.select", &[&c, &a, &b], &shape, a.dt, &[])
    }

    /// A constant splat of `shape`.
    pub(super) fn splat(&self, value: f64, shape: &[i64], dt: DType) -> Result<T<'c, 'a>, EmitError> {
        let text = format!("dense<{}> : {}", literal(value, dt), type_text(shape, dt));
        self.op("stablehlo.constant", &[], shape, dt, &[("value", text)])
    }

    pub(super) fn scalar(&self, value: f64, dt: DType) -> Result<T<'c, 'a>, EmitError> {
        self.splat(value, &[], dt)
    }

    /// A graph constant written into the program.
    pub(super) fn inline_const(&self, g: &Graph, c: &ConstData) -> Result<T<'c, 'a>, EmitError> {
        let ty = g.ty(c.value);
        let shape = ty.static_shape().ok_or_else(|| err("constant with a dynamic shape"))?;
        let bytes = c.bytes.as_bytes();
        if ty.dtype == DType::Bool {
            // Hex data for i1 is bit-packed in MLIR; spell booleans out and reshape.
            let items: Vec<&str> = bytes.iter().map(|&b| if b != 0 { "true" } else { "false" }).collect();
            let flat = [items.len() as i64];
            let text = format!("dense<[{}]> : {}", items.join(", "), type_text(&flat, DType::Bool));
            let t = self.op("stablehlo.constant", &[], &flat, DType::Bool, &[("value", text)])?;
            return self.reshape(&t, &shape);
        }
        if bytes.len() as i64 != numel(&shape) * ty.dtype.size_bytes() as i64 {
            return Err(err(format!("constant {} has {} bytes for shape {shape:?}", c.value, bytes.len())));
        }
        if bytes.is_empty() {
            return self.splat(0.0, &shape, ty.dtype);
        }
        let hex: String = bytes.iter().map(|b| format!("{b:02X}")).collect();
        let text = format!("dense<\"0x{hex}\"> : {}", type_text(&shape, ty.dtype));
        self.op("stablehlo.constant", &[], &shape, ty.dtype, &[("value", text)])
    }

    pub(super) fn convert(&self, x: &T<'c, 'a>, to: DType) -> Result<T<'c, 'a>, EmitError> {
        if x.dt == to {
            return Ok(x.clone());
        }
        self.op("stablehlo.convert", &[x], &x.shape.clone(), to, &[])
    }

    pub(super) fn reshape(&self, x: &T<'c, 'a>, shape: &[i64]) -> Result<T<'c, 'a>, EmitError> {
        if x.shape == shape {
            return Ok(x.clone());
        }
        if numel(&x.shape) != numel(shape) {
            return Err(err(format!("reshape {:?} -> {shape:?} changes the element count", x.shape)));
        }
        self.op("stablehlo.reshape", &[x], shape, x.dt, &[])
    }

    /// Numpy-style broadcast (right-aligned) of `x` to `shape`.
    pub(super) fn bcast(&self, x: &T<'c, 'a>, shape: &[i64]) -> Result<T<'c, 'a>, EmitError> {
        if x.shape == shape {
            return Ok(x.clone());
        }
        let r = shape.len();
        if x.shape.len() > r {
            return Err(err(format!("cannot broadcast {:?} to {shape:?}", x.shape)));
        }
        let dims: Vec<i64> = (r - x.shape.len()..r).map(|d| d as i64).collect();
        self.bcast_dims(x, shape, &dims)
    }

    /// `broadcast_in_dim`: operand dim `i` becomes result dim `dims[i]`.
    pub(super) fn bcast_dims(&self, x: &T<'c, 'a>, shape: &[i64], dims: &[i64]) -> Result<T<'c, 'a>, EmitError> {
        for (i, &d) in dims.iter().enumerate() {
            let ok = d >= 0 && (d as usize) < shape.len() && (x.shape[i] == 1 || x.shape[i] == shape[d as usize]);
            if !ok {
                return Err(err(format!("cannot broadcast {:?} to {shape:?} along {dims:?}", x.shape)));
            }
        }
        self.op("stablehlo.broadcast_in_dim", &[x], shape, x.dt, &[("broadcast_dimensions", arr(dims))])
    }

    pub(super) fn transpose(&self, x: &T<'c, 'a>, perm: &[i64]) -> Result<T<'c, 'a>, EmitError> {
        let shape: Vec<i64> = perm.iter().map(|&p| x.shape.get(p as usize).copied().unwrap_or(0)).collect();
        self.op("stablehlo.transpose", &[x], &shape, x.dt, &[("permutation", arr(perm))])
    }
}
