//! Symbolic dimensions.
//!
//! A dimension is an integer expression over the graph's symbols (`s0`, `s1`, ...),
//! each of which has an inclusive range. Dynamic shapes from `torch.export` arrive
//! as such expressions; memory planning uses their upper bounds and the runtime
//! evaluates them once per call.

use crate::PrimaryMap;
use crate::SymbolId;
use std::fmt;

/// A shape symbol: a dimension only known at run time, with inclusive bounds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    pub name: String,
    pub min: i64,
    /// `None` when unbounded (torch's `max_val: null` / int_oo).
    pub max: Option<i64>,
}

/// An integer expression for one dimension.
///
/// Build with [`Dim::add`], [`Dim::mul`], [`Dim::floor_div`]: they fold constants so
/// that a fully static dimension is always `Dim::Const`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    Const(i64),
    Sym(SymbolId),
    Add(Box<Dim>, Box<Dim>),
    Mul(Box<Dim>, Box<Dim>),
    FloorDiv(Box<Dim>, Box<Dim>),
    Mod(Box<Dim>, Box<Dim>),
}

impl From<i64> for Dim {
    fn from(v: i64) -> Dim {
        Dim::Const(v)
    }
}

impl Dim {
    pub fn as_const(&self) -> Option<i64> {
        match self {
            Dim::Const(v) => Some(*v),
            _ => None,
        }
    }

    pub fn is_static(&self) -> bool {
        self.as_const().is_some()
    }

    // An associated constructor that simplifies, not an operator: `Dim::add(a, b)`.
    #[allow(clippy::should_implement_trait)]
    pub fn add(a: Dim, b: Dim) -> Dim {
        match (a.as_const(), b.as_const()) {
            (Some(x), Some(y)) => Dim::Const(x.saturating_add(y)),
            (Some(0), None) => b,
            (None, Some(0)) => a,
            _ => Dim::Add(Box::new(a), Box::new(b)),
        }
    }

    // An associated constructor that simplifies, not an operator: `Dim::mul(a, b)`.
    #[allow(clippy::should_implement_trait)]
    pub fn mul(a: Dim, b: Dim) -> Dim {
        match (a.as_const(), b.as_const()) {
            (Some(x), Some(y)) => Dim::Const(x.saturating_mul(y)),
            (Some(1), None) => b,
            (None, Some(1)) => a,
            (Some(0), _) | (_, Some(0)) => Dim::Const(0),
            _ => Dim::Mul(Box::new(a), Box::new(b)),
        }
    }

    pub fn floor_div(a: Dim, b: Dim) -> Dim {
        match (a.as_const(), b.as_const()) {
            // i64::MIN / -1 saturates, like the other constant folds.
            (Some(x), Some(y)) if y != 0 => Dim::Const(x.checked_div_euclid(y).unwrap_or(i64::MAX)),
            (None, Some(1)) => a,
            _ => Dim::FloorDiv(Box::new(a), Box::new(b)),
        }
    }

    pub fn modulo(a: Dim, b: Dim) -> Dim {
        match (a.as_const(), b.as_const()) {
            (Some(x), Some(y)) if y != 0 => Dim::Const(x.checked_rem_euclid(y).unwrap_or(0)),
            (None, Some(1)) => Dim::Const(0),
            _ => Dim::Mod(Box::new(a), Box::new(b)),
        }
    }

    /// Evaluates with the given symbol values. Division by zero yields 0 (the
    /// runtime rejects such bindings before they reach a kernel).
    pub fn eval(&self, sym: &impl Fn(SymbolId) -> i64) -> i64 {
        match self {
            Dim::Const(v) => *v,
            Dim::Sym(s) => sym(*s),
            Dim::Add(a, b) => a.eval(sym).saturating_add(b.eval(sym)),
            Dim::Mul(a, b) => a.eval(sym).saturating_mul(b.eval(sym)),
            Dim::FloorDiv(a, b) => {
                let d = b.eval(sym);
                if d == 0 {
                    0
                } else {
                    a.eval(sym).checked_div_euclid(d).unwrap_or(i64::MAX)
                }
            }
            Dim::Mod(a, b) => {
                let d = b.eval(sym);
                if d == 0 {
                    0
                } else {
                    a.eval(sym).checked_rem_euclid(d).unwrap_or(0)
                }
            }
        }
    }

    /// Inclusive (lower, upper) bounds by interval arithmetic. Dimensions are
    /// non-negative, which keeps `+`, `*` and `//` monotone. `None` upper = unbounded.
    pub fn bounds(&self, symbols: &PrimaryMap<SymbolId, Symbol>) -> (i64, Option<i64>) {
        match self {
            Dim::Const(v) => (*v, Some(*v)),
            Dim::Sym(s) => (symbols[*s].min, symbols[*s].max),
            Dim::Add(a, b) => {
                let (al, ah) = a.bounds(symbols);
                let (bl, bh) = b.bounds(symbols);
                (al.saturating_add(bl), ah.zip(bh).map(|(x, y)| x.saturating_add(y)))
            }
            Dim::Mul(a, b) => {
                let (al, ah) = a.bounds(symbols);
                let (bl, bh) = b.bounds(symbols);
                // A negative constant factor (sympy's `-1*s` in `s0 - s1`) swaps the ends.
                match (a.as_const(), b.as_const()) {
                    (Some(k), _) if k < 0 => (bh.map_or(i64::MIN, |h| k.saturating_mul(h)), Some(k.saturating_mul(bl))),
                    (_, Some(k)) if k < 0 => (ah.map_or(i64::MIN, |h| k.saturating_mul(h)), Some(k.saturating_mul(al))),
                    _ => (al.saturating_mul(bl), ah.zip(bh).map(|(x, y)| x.saturating_mul(y))),
                }
            }
            Dim::FloorDiv(a, b) => {
                let (al, ah) = a.bounds(symbols);
                let (bl, bh) = b.bounds(symbols);
                let lo = match bh {
                    Some(bh) if bh > 0 => al.div_euclid(bh),
                    _ => 0,
                };
                let hi = ah.map(|ah| if bl > 0 { ah.div_euclid(bl) } else { ah });
                (lo, hi)
            }
            Dim::Mod(_, b) => {
                let (_, bh) = b.bounds(symbols);
                (0, bh.map(|h| h.saturating_sub(1).max(0)))
            }
        }
    }

    /// Appends the symbols this dimension mentions.
    pub fn collect_symbols(&self, out: &mut Vec<SymbolId>) {
        match self {
            Dim::Const(_) => {}
            Dim::Sym(s) => {
                if !out.contains(s) {
                    out.push(*s)
                }
            }
            Dim::Add(a, b) | Dim::Mul(a, b) | Dim::FloorDiv(a, b) | Dim::Mod(a, b) => {
                a.collect_symbols(out);
                b.collect_symbols(out);
            }
        }
    }

    /// Displays the expression with the symbols' names, in the IR's text syntax.
    pub fn display<'a>(&'a self, symbols: &'a PrimaryMap<SymbolId, Symbol>) -> DimDisplay<'a> {
        DimDisplay { dim: self, symbols }
    }
}

pub struct DimDisplay<'a> {
    dim: &'a Dim,
    symbols: &'a PrimaryMap<SymbolId, Symbol>,
}

impl fmt::Display for DimDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_dim(self.dim, self.symbols, f)
    }
}

fn write_dim(d: &Dim, symbols: &PrimaryMap<SymbolId, Symbol>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let bin = |f: &mut fmt::Formatter<'_>, a: &Dim, op: &str, b: &Dim| -> fmt::Result {
        f.write_str("(")?;
        write_dim(a, symbols, f)?;
        write!(f, " {op} ")?;
        write_dim(b, symbols, f)?;
        f.write_str(")")
    };
    match d {
        Dim::Const(v) => write!(f, "{v}"),
        Dim::Sym(s) => match symbols.get(*s) {
            Some(sym) => f.write_str(&sym.name),
            None => write!(f, "{s}"),
        },
        Dim::Add(a, b) => bin(f, a, "+", b),
        Dim::Mul(a, b) => bin(f, a, "*", b),
        Dim::FloorDiv(a, b) => bin(f, a, "//", b),
        Dim::Mod(a, b) => bin(f, a, "%", b),
    }
}
