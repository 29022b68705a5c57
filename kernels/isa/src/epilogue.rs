//! What a fused convolution or linear applies to each output element after
//! its dot product, while the tile is in registers (the IR's `ConvFused` /
//! `LinearFused`, the plan's calls of the same names, the GEMM store step).
//!
//! The order is fixed: `v += bias[channel]`, then the residual and the
//! activation in the order [`Residual`] says. Each step is the computation
//! of the unfused op it replaces (the activation runs the same kernel-table
//! function as the unfused unary or clamp kernel), so a fused result equals
//! the unfused graph's wherever those functions are elementwise-exact.

use crate::UnaryOp;

/// An activation a fused epilogue applies.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Activation {
    Relu,
    Sigmoid,
    Silu,
    /// GELU with erf (torch's default).
    Gelu,
    /// GELU's tanh approximation.
    GeluTanh,
    /// `clamp(v, min, max)` (ReLU6 is `min = 0, max = 6`); either bound may
    /// be absent, as in `Op::Clamp`.
    Clamp {
        min: Option<f64>,
        max: Option<f64>,
    },
    /// `v · sigmoid(v)`: SiLU as Core ATen decomposes it (`mul(x,
    /// sigmoid(x))`), rounded as those two ops are — the sigmoid, then one
    /// product — where [`Activation::Silu`] divides once (`v / (1 + e^-v)`).
    MulSigmoid,
    /// `v · clamp(v + 3, 0, 6) / 6`: hardswish as torch computes it (and
    /// as Core ATen and kiln's importer decompose it), one exact operation
    /// after another.
    Hardswish,
    /// `0.5·v · (1 + tanh(√(2/π)·(v + 0.044715·(v·v·v))))`: GELU's tanh
    /// form as GPT-2's `gelu_new` writes it (Hugging Face's
    /// `NewGELUActivation`, its `pow(x, 3)` imported as `(x·x)·x`), each
    /// step rounded to f32 in this order — the half, the cube, its scaling,
    /// the sum with `v`, the product with `√(2/π)`, the tanh kernel, the
    /// `+ 1`, the last product — with the constants of [`gelu_tanh_chain`]. Equal in
    /// value to [`Activation::GeluTanh`], which computes the more accurate
    /// `v·σ(2z)` and so other bits.
    GeluTanhChain,
}

/// The f32 constants of [`Activation::GeluTanhChain`]: the Python floats of
/// `gelu_new`, `HALF * x * (ONE + tanh(SQRT_2_OVER_PI * (x + CUBIC *
/// x³)))`, rounded to f32 as torch (and kiln's importer) rounds a scalar
/// operand of an f32 tensor op.
pub mod gelu_tanh_chain {
    pub const HALF: f32 = 0.5;
    /// `0.044715`.
    pub const CUBIC: f32 = crate::math::GELU_TANH_CUBIC;
    /// `math.sqrt(2.0 / math.pi)`, 0.7978845608028654 in f64.
    pub const SQRT_2_OVER_PI: f32 = crate::math::SQRT_2_OVER_PI;
    pub const ONE: f32 = 1.0;
}

impl Activation {
    /// The activations that are one unary op.
    pub const UNARY: [Activation; 5] =
        [Activation::Relu, Activation::Sigmoid, Activation::Silu, Activation::Gelu, Activation::GeluTanh];

    /// The unary op this activation computes (None for a clamp).
    pub fn unary_op(self) -> Option<UnaryOp> {
        Some(match self {
            Activation::Relu => UnaryOp::Relu,
            Activation::Sigmoid => UnaryOp::Sigmoid,
            Activation::Silu => UnaryOp::Silu,
            Activation::Gelu => UnaryOp::Gelu,
            Activation::GeluTanh => UnaryOp::GeluTanh,
            Activation::Clamp { .. } | Activation::MulSigmoid | Activation::Hardswish | Activation::GeluTanhChain => {
                return None
            }
        })
    }

    /// The activation computing `op`, if `op` is one.
    pub fn from_unary(op: UnaryOp) -> Option<Activation> {
        Activation::UNARY.into_iter().find(|a| a.unary_op() == Some(op))
    }

    /// The text form's name (`clamp`'s bounds are separate attributes).
    pub fn name(self) -> &'static str {
        match (self, self.unary_op()) {
            (_, Some(op)) => op.name(),
            (Activation::MulSigmoid, None) => "mul_sigmoid",
            (Activation::Hardswish, None) => "hardswish",
            (Activation::GeluTanhChain, None) => "gelu_tanh_chain",
            _ => "clamp",
        }
    }

    /// The activation of a text-form name other than `clamp` (whose bounds
    /// are attributes of their own).
    pub fn from_name(name: &str) -> Option<Activation> {
        match name {
            "mul_sigmoid" => Some(Activation::MulSigmoid),
            "hardswish" => Some(Activation::Hardswish),
            "gelu_tanh_chain" => Some(Activation::GeluTanhChain),
            _ => UnaryOp::from_name(name).and_then(Activation::from_unary),
        }
    }
}

/// Where a fused epilogue adds its residual operand (a tensor shaped like
/// the output).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum Residual {
    #[default]
    None,
    /// `v = activation(v + residual)` (ResNet's `relu(bn(conv(x)) + x)`).
    BeforeActivation,
    /// `v = activation(v) + residual`.
    AfterActivation,
}

impl Residual {
    pub fn name(self) -> &'static str {
        match self {
            Residual::None => "none",
            Residual::BeforeActivation => "before",
            Residual::AfterActivation => "after",
        }
    }

    pub fn from_name(name: &str) -> Option<Residual> {
        [Residual::None, Residual::BeforeActivation, Residual::AfterActivation].into_iter().find(|r| r.name() == name)
    }
}

/// A fused convolution's or linear's epilogue. The call's operands are
/// `(x, w [, bias] [, residual])`: the flags say which are present.
#[derive(Copy, Clone, Debug, PartialEq, Default)]
pub struct Epilogue {
    pub bias: bool,
    pub activation: Option<Activation>,
    pub residual: Residual,
}

impl Epilogue {
    /// The operand count of a call with this epilogue.
    pub fn operand_count(&self) -> usize {
        2 + usize::from(self.bias) + usize::from(self.residual != Residual::None)
    }

    /// The residual's operand index, if there is one.
    pub fn residual_operand(&self) -> Option<usize> {
        (self.residual != Residual::None).then(|| 2 + usize::from(self.bias))
    }

    /// The bias's operand index, if there is one.
    pub fn bias_operand(&self) -> Option<usize> {
        self.bias.then_some(2)
    }
}

/// On disk an epilogue is one tuple: `(bias, kind, bounds, min, max,
/// residual)` — kind 0 no activation, else 1 + the unary op's code for the
/// unary ones, `u16::MAX` clamp (bounds: bit 0 a min, bit 1 a max, as f64
/// bits), `u16::MAX - 1` `mul_sigmoid`, `u16::MAX - 2` `hardswish` (both
/// since format 0.17), `u16::MAX - 3` `gelu_tanh_chain` (since 0.20);
/// residual 0 none, 1 before, 2 after the activation.
#[cfg(feature = "serde")]
mod epilogue_serde {
    use super::{Activation, Epilogue, Residual};
    use crate::UnaryOp;
    use serde::de::{self, SeqAccess, Visitor};
    use serde::ser::SerializeTuple;

    const CLAMP: u16 = u16::MAX;
    const MUL_SIGMOID: u16 = u16::MAX - 1;
    const HARDSWISH: u16 = u16::MAX - 2;
    const GELU_TANH_CHAIN: u16 = u16::MAX - 3;
    type Row = (bool, u16, u16, u64, u64, u16);

    fn row(e: &Epilogue) -> Row {
        let (kind, bounds, min, max) = match e.activation {
            None => (0, 0, 0.0, 0.0),
            Some(Activation::Clamp { min, max }) => {
                let bounds = u16::from(min.is_some()) | u16::from(max.is_some()) << 1;
                (CLAMP, bounds, min.unwrap_or(0.0), max.unwrap_or(0.0))
            }
            Some(Activation::MulSigmoid) => (MUL_SIGMOID, 0, 0.0, 0.0),
            Some(Activation::Hardswish) => (HARDSWISH, 0, 0.0, 0.0),
            Some(Activation::GeluTanhChain) => (GELU_TANH_CHAIN, 0, 0.0, 0.0),
            Some(a) => (1 + a.unary_op().map_or(0, UnaryOp::code), 0, 0.0, 0.0),
        };
        let residual = match e.residual {
            Residual::None => 0,
            Residual::BeforeActivation => 1,
            Residual::AfterActivation => 2,
        };
        (e.bias, kind, bounds, min.to_bits(), max.to_bits(), residual)
    }

    fn from_row((bias, kind, bounds, min, max, residual): Row) -> Result<Epilogue, String> {
        let activation = match kind {
            0 => None,
            CLAMP if bounds <= 3 => Some(Activation::Clamp {
                min: (bounds & 1 != 0).then(|| f64::from_bits(min)),
                max: (bounds & 2 != 0).then(|| f64::from_bits(max)),
            }),
            CLAMP => return Err(format!("unknown clamp bounds {bounds}")),
            MUL_SIGMOID => Some(Activation::MulSigmoid),
            HARDSWISH => Some(Activation::Hardswish),
            GELU_TANH_CHAIN => Some(Activation::GeluTanhChain),
            k => {
                let op = UnaryOp::from_code(k - 1).map_err(|e| e.to_string())?;
                Some(Activation::from_unary(op).ok_or_else(|| format!("`{op}` is no epilogue activation"))?)
            }
        };
        let residual = match residual {
            0 => Residual::None,
            1 => Residual::BeforeActivation,
            2 => Residual::AfterActivation,
            r => return Err(format!("unknown residual position {r}")),
        };
        Ok(Epilogue { bias, activation, residual })
    }

    impl serde::Serialize for Epilogue {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let (a, b, c, d, e, f) = row(self);
            let mut t = s.serialize_tuple(6)?;
            t.serialize_element(&a)?;
            t.serialize_element(&b)?;
            t.serialize_element(&c)?;
            t.serialize_element(&d)?;
            t.serialize_element(&e)?;
            t.serialize_element(&f)?;
            t.end()
        }
    }

    impl<'de> serde::Deserialize<'de> for Epilogue {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Epilogue, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Epilogue;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("an epilogue (bias, activation, bounds, min, max, residual)")
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Epilogue, A::Error> {
                    let missing = || de::Error::custom("truncated epilogue");
                    let row: Row = (
                        seq.next_element()?.ok_or_else(missing)?,
                        seq.next_element()?.ok_or_else(missing)?,
                        seq.next_element()?.ok_or_else(missing)?,
                        seq.next_element()?.ok_or_else(missing)?,
                        seq.next_element()?.ok_or_else(missing)?,
                        seq.next_element()?.ok_or_else(missing)?,
                    );
                    from_row(row).map_err(de::Error::custom)
                }
            }
            d.deserialize_tuple(6, V)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operand_positions_follow_the_flags() {
        let e = Epilogue { bias: true, activation: None, residual: Residual::AfterActivation };
        assert_eq!((e.operand_count(), e.bias_operand(), e.residual_operand()), (4, Some(2), Some(3)));
        let e = Epilogue { bias: false, activation: Some(Activation::Relu), residual: Residual::BeforeActivation };
        assert_eq!((e.operand_count(), e.bias_operand(), e.residual_operand()), (3, None, Some(2)));
        assert_eq!(Epilogue::default().operand_count(), 2);
    }

    #[test]
    fn activations_map_to_their_unary_ops() {
        for a in Activation::UNARY {
            assert_eq!(Activation::from_unary(a.unary_op().unwrap()), Some(a));
        }
        assert_eq!(Activation::from_unary(UnaryOp::Exp), None);
        assert_eq!(Activation::Clamp { min: Some(0.0), max: None }.name(), "clamp");
        assert_eq!(Residual::from_name("before"), Some(Residual::BeforeActivation));
        let chain = Activation::GeluTanhChain;
        assert_eq!((chain.unary_op(), Activation::from_name(chain.name())), (None, Some(chain)));
    }

    /// The chain's constants are `gelu_new`'s Python floats rounded to f32
    /// (what the pattern compares the graph's scalars with).
    #[test]
    fn gelu_tanh_chain_constants_are_the_python_floats_in_f32() {
        use gelu_tanh_chain::*;
        let sqrt_2_over_pi = (2.0 / std::f64::consts::PI).sqrt();
        assert_eq!(sqrt_2_over_pi, 0.7978845608028654);
        assert_eq!(SQRT_2_OVER_PI, sqrt_2_over_pi as f32);
        assert_eq!(CUBIC, 0.044715f64 as f32);
        assert_eq!((HALF, ONE), (0.5f64 as f32, 1.0f64 as f32));
    }
}
