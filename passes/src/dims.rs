//! Constant folding of shape arithmetic.
//!
//! Dimension expressions can become static after other rewrites (a symbol pinned by
//! `min == max`, `(s0 * 4) // 4` after a reshape round trip, a parsed `(2 * 3)` that
//! never went through `Dim`'s folding constructors). [`simplify_dim`] rebuilds an
//! expression bottom-up through those constructors plus a few exact identities, and
//! [`simplify_shapes`] applies it to every type and shape attribute of the graph.

use crate::Changed;
use kiln_ir::PrimaryMap;
use kiln_ir::{Dim, EntityRef, Graph, Op, Symbol, SymbolId, TensorType};

/// An equivalent, simpler expression; static whenever the bounds pin it.
pub fn simplify_dim(d: &Dim, symbols: &PrimaryMap<SymbolId, Symbol>) -> Dim {
    let simple = match d {
        Dim::Const(_) => return d.clone(),
        Dim::Sym(s) => match symbols.get(*s) {
            Some(sym) if sym.max == Some(sym.min) => Dim::Const(sym.min),
            _ => d.clone(),
        },
        Dim::Add(a, b) => Dim::add(simplify_dim(a, symbols), simplify_dim(b, symbols)),
        Dim::Mul(a, b) => Dim::mul(simplify_dim(a, symbols), simplify_dim(b, symbols)),
        Dim::FloorDiv(a, b) => {
            let (a, b) = (simplify_dim(a, symbols), simplify_dim(b, symbols));
            match cancel_factor(&a, &b) {
                Some(q) => q,
                None => Dim::floor_div(a, b),
            }
        }
        Dim::Mod(a, b) => {
            let (a, b) = (simplify_dim(a, symbols), simplify_dim(b, symbols));
            // `(x * c) % c == 0` exactly, for any non-zero c.
            match cancel_factor(&a, &b) {
                Some(_) => Dim::Const(0),
                None => Dim::modulo(a, b),
            }
        }
    };
    pin_by_bounds(simple, symbols)
}

/// `x` when `a` is `x * b` or `b * x` with `b` a non-zero constant.
fn cancel_factor(a: &Dim, b: &Dim) -> Option<Dim> {
    let c = b.as_const().filter(|&c| c != 0)?;
    match a {
        Dim::Mul(x, y) if y.as_const() == Some(c) => Some((**x).clone()),
        Dim::Mul(x, y) if x.as_const() == Some(c) => Some((**y).clone()),
        _ => None,
    }
}

/// Interval arithmetic is sound, so equal lower and upper bounds fix the value.
fn pin_by_bounds(d: Dim, symbols: &PrimaryMap<SymbolId, Symbol>) -> Dim {
    let mut syms = Vec::new();
    d.collect_symbols(&mut syms);
    // `Dim::bounds` indexes the symbol table; a dangling symbol must not panic here.
    if syms.iter().any(|s| s.index() >= symbols.len()) {
        return d;
    }
    match d.bounds(symbols) {
        (lo, Some(hi)) if lo == hi && !d.is_static() => Dim::Const(lo),
        _ => d,
    }
}

fn simplify_all(dims: &mut [Dim], symbols: &PrimaryMap<SymbolId, Symbol>) -> bool {
    let mut changed = false;
    for d in dims {
        let s = simplify_dim(d, symbols);
        if s != *d {
            *d = s;
            changed = true;
        }
    }
    changed
}

fn simplify_type(ty: &mut TensorType, symbols: &PrimaryMap<SymbolId, Symbol>) -> bool {
    simplify_all(&mut ty.shape, symbols)
}

/// Simplifies every value's shape and every shape-carrying attribute.
pub(crate) fn simplify_shapes(g: &mut Graph) -> Changed {
    let symbols = &g.symbols;
    let mut changed = false;
    for (_, v) in g.values.iter_mut() {
        changed |= simplify_type(&mut v.ty, symbols);
    }
    for &n in &g.order {
        changed |= match &mut g.nodes[n].op {
            Op::Reshape { shape } | Op::Expand { shape } | Op::Full { shape, .. } | Op::Random { shape, .. } => {
                simplify_all(shape, symbols)
            }
            Op::Arange { len, .. } => simplify_all(std::slice::from_mut(len), symbols),
            _ => false,
        };
    }
    Changed::from(changed)
}
