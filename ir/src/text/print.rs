//! Graph → text. Never panics, even on graphs the verifier would reject, because
//! printing a broken graph is how its bug gets reported.

use super::elements::format_elements;
use super::lexer::quote;
use super::ops::format_attrs;
use crate::{Graph, Mesh, SecondaryMap, TensorType, ValueAttrs, ValueId};
use std::fmt::Write;

pub(super) fn print_graph(g: &Graph, max_const_elems: Option<usize>) -> String {
    let names = number_values(g);
    let value = |v: ValueId| match names[v] {
        Some(n) => format!("%{n}"),
        // Not defined by anything printed: keep the raw id so the dump stays
        // informative (the parser rejects it, as it should).
        None => format!("%{v}"),
    };
    let named = |v: ValueId| -> String {
        let mut s = value(v);
        if let Some(Some(name)) = g.values.get(v).map(|d| &d.name) {
            s.push(' ');
            s.push_str(&quote(name));
        }
        s
    };
    // The type, then the value's attributes when it has any.
    let ty = |v: ValueId| match g.values.get(v) {
        Some(d) if d.attrs.is_empty() => format_type(g, &d.ty),
        Some(d) => format!("{} {}", format_type(g, &d.ty), format_value_attrs(&d.attrs)),
        None => "?".to_string(),
    };

    let mut out = String::from("graph {\n");
    if let Some(mesh) = &g.mesh {
        let _ = writeln!(out, "  {}", format_mesh(mesh));
    }
    for (_, sym) in g.symbols.iter() {
        let max = sym.max.map_or("inf".to_string(), |m| m.to_string());
        let _ = writeln!(out, "  sym {} in [{}, {max}]", sym.name, sym.min);
    }
    // A complex boundary position: `as c64` after its real type.
    let complex = |v: ValueId, yes: bool| match g.values.get(v).and_then(|d| d.ty.dtype.complex_of()) {
        Some(c) if yes => format!(" as {c}"),
        _ => String::new(),
    };
    for (i, &v) in g.inputs.iter().enumerate() {
        let _ = writeln!(out, "  input {}: {}{}", named(v), ty(v), complex(v, g.is_complex_input(i)));
    }
    for (_, c) in g.consts.iter() {
        let v = c.value;
        let elems = match g.values.get(v) {
            Some(d) => format_elements(d.ty.dtype, c.bytes.as_bytes()),
            None => vec![],
        };
        let total = elems.len();
        let shown = match max_const_elems {
            Some(k) if total > k => format!("{}, ... ({total} elements)", elems[..k].join(", ")),
            _ => elems.join(", "),
        };
        let _ = writeln!(out, "  const {}: {} = [{shown}]", named(v), ty(v));
    }
    for &n in &g.order {
        let Some(node) = g.nodes.get(n) else {
            let _ = writeln!(out, "  ; {n} is out of range");
            continue;
        };
        let results: Vec<String> = node.outputs.iter().map(|&v| format!("{}: {}", named(v), ty(v))).collect();
        let results = if results.is_empty() { "_".to_string() } else { results.join(", ") };
        let attrs = format_attrs(&node.op, &g.symbols);
        let attrs = if attrs.is_empty() { String::new() } else { format!("{{{}}}", attrs.join(", ")) };
        let operands: Vec<String> = node.inputs.iter().map(|&v| value(v)).collect();
        let _ = write!(out, "  {results} = {}{attrs}({})", node.op.name(), operands.join(", "));
        if let Some(loc) = node.loc.and_then(|l| g.locs.get(l)) {
            let _ = write!(out, " @{}", quote(&loc.node_name));
            if let Some(trace) = &loc.stack_trace {
                let _ = write!(out, " {}", quote(trace));
            }
        }
        out.push('\n');
    }
    for (i, &v) in g.outputs.iter().enumerate() {
        let name = g.output_names.get(i).map_or(String::new(), |n| format!(" {}", quote(n)));
        let _ = writeln!(out, "  output {}{name}{}", value(v), complex(v, g.is_complex_output(i)));
    }
    for st in &g.states {
        let dtype = g.inputs.get(st.input).and_then(|&v| g.values.get(v)).map(|d| d.ty.dtype);
        let elems = dtype.map_or_else(Vec::new, |d| format_elements(d, st.init.as_bytes()));
        let _ = writeln!(
            out,
            "  state {} input {} output {} = [{}]",
            quote(&st.name),
            st.input,
            st.output,
            elems.join(", ")
        );
    }
    out.push_str("}\n");
    out
}

/// Canonical value numbers, in print order: inputs, constants, node outputs.
fn number_values(g: &Graph) -> SecondaryMap<ValueId, Option<u32>> {
    let mut names: SecondaryMap<ValueId, Option<u32>> = SecondaryMap::new();
    let mut next = 0u32;
    let mut name = |v: ValueId| {
        if names[v].is_none() {
            names[v] = Some(next);
            next += 1;
        }
    };
    g.inputs.iter().for_each(|&v| name(v));
    g.consts.values().for_each(|c| name(c.value));
    for &n in &g.order {
        if let Some(node) = g.nodes.get(n) {
            node.outputs.iter().for_each(|&v| name(v));
        }
    }
    names
}

pub(super) fn format_type(g: &Graph, ty: &TensorType) -> String {
    let dims: Vec<String> = ty.shape.iter().map(|d| d.display(&g.symbols).to_string()).collect();
    format!("{}[{}]", ty.dtype, dims.join(", "))
}

/// `{origin="fc.weight"}`: the attributes that are set, in a fixed order.
fn format_value_attrs(attrs: &ValueAttrs) -> String {
    let mut items = Vec::new();
    if let Some(origin) = &attrs.origin {
        items.push(format!("origin={}", quote(origin)));
    }
    if let Some(sharding) = &attrs.sharding {
        items.push(format!("sharding={sharding}"));
    }
    format!("{{{}}}", items.join(", "))
}

/// `mesh [data=2, model=2]`, then `devices [3, 2, 1, 0]` when the order is not
/// the identity.
fn format_mesh(mesh: &Mesh) -> String {
    let mut s = format!("mesh [{mesh}]");
    if !mesh.devices.is_empty() {
        let ids: Vec<String> = mesh.devices.iter().map(u32::to_string).collect();
        s.push_str(&format!(" devices [{}]", ids.join(", ")));
    }
    s
}
