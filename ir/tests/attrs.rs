//! Per-value attributes: their text form, what the verifier checks, and that
//! replace-all-uses hands them to the replacement.

use kiln_ir::text::{parse, print};
use kiln_ir::verify::verify;
use kiln_ir::*;

const WITH_ATTRS: &str = "\
graph {
  input %0 \"x\": f32[2, 3] {origin=\"x\"}
  input %1: f32[2, 3]
  const %2 \"fc.weight\": f32[3, 2] {origin=\"fc.weight\"} = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
  %3: f32[2, 2] = matmul(%0, %2)
  %4 \"h\": f32[2, 3] {origin=\"encoder.layers.0.\\\"q\\\"\"} = neg(%1)
  %5: f32[2, 3] = relu(%4)
  output %3 \"y\"
}
";

#[test]
fn attributes_print_after_the_type_and_parse_back() {
    let g = parse(WITH_ATTRS).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(print(&g), WITH_ATTRS);
    let origin = |v: ValueId| g.values[v].attrs.origin.as_deref();
    assert_eq!(origin(g.inputs[0]), Some("x"));
    assert_eq!(origin(g.inputs[1]), None);
    let w = g.consts.values().next().unwrap().value;
    assert_eq!(origin(w), Some("fc.weight"));
    let (h, r) = (g.nodes[g.order[1]].outputs[0], g.nodes[g.order[2]].outputs[0]);
    assert_eq!(origin(h), Some("encoder.layers.0.\"q\""));
    assert_eq!(g.values[h].name.as_deref(), Some("h"));
    assert_eq!(origin(r), None);
    // Each result of a node line has its own.
    let multi = "graph {\n  input %0: f32[2]\n  %1: f32[2] {origin=\"a\"}, %2 \"b\": f32[2] = neg(%0)\n}\n";
    let g = parse(multi).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(print(&g), multi);
}

#[test]
fn no_attributes_print_nothing() {
    let mut g = Graph::new();
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[2]));
    assert!(g.values[x].attrs.is_empty());
    g.add_output("y", x);
    assert_eq!(print(&g), "graph {\n  input %0 \"x\": f32[2]\n  output %0 \"y\"\n}\n");
}

fn parse_err(src: &str) -> String {
    match parse(src) {
        Ok(g) => panic!("parsed:\n{}", print(&g)),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_attributes_are_parse_errors() {
    let cases: &[(&str, &str)] = &[
        (
            "graph {\n  input %0: f32[2] {layout=\"nchw\"}\n}",
            "2:21: unknown value attribute `layout` (known: origin, sharding)",
        ),
        (
            "graph {\n  input %0: f32[2] {origin=\"a\", origin=\"b\"}\n}",
            "2:33: value attribute `origin` is given twice",
        ),
        ("graph {\n  input %0: f32[2] {origin=\"\"}\n}", "2:28: value attribute `origin` must not be empty"),
        (
            "graph {\n  input %0: f32[2] {origin=x}\n}",
            "2:28: expected a string for value attribute `origin`, found `x`",
        ),
        ("graph {\n  input %0: f32[2] {origin=\"a\" origin=\"b\"}\n}", "2:32: expected `}`, found `origin`"),
        ("graph {\n  const %0: f32[1] = {origin=\"a\"} [1.0]\n}", "2:22: expected `[`, found `{`"),
    ];
    for (src, expected) in cases {
        assert_eq!(&parse_err(src), expected, "for\n{src}");
    }
}

fn errors(g: &Graph) -> Vec<String> {
    verify(g).err().map(|e| e.errors).unwrap_or_default()
}

#[test]
fn verifier_checks_origins() {
    let mut g = parse(WITH_ATTRS).unwrap();
    assert_eq!(verify(&g), Ok(()));
    let (x, y) = (g.inputs[0], g.inputs[1]);
    g.values[y].attrs = ValueAttrs::with_origin("x");
    let w = g.consts.values().next().unwrap().value;
    g.values[w].attrs.origin = Some(String::new());
    let h = g.nodes[g.order[2]].outputs[0];
    g.values[h].attrs.origin = Some(String::new());
    assert_eq!(
        errors(&g),
        [
            "constant c0 (v2, `fc.weight`): its origin is empty (absent is `None`)",
            "input 1 (v1): origin `x` is already input 0's",
            "relu (n2): result 0 (v5): its origin is empty (absent is `None`)",
        ]
    );
    // Constants may share an origin: a weight and a folded copy of it.
    let mut g = parse(WITH_ATTRS).unwrap();
    let c = g.add_const(None, TensorType::fixed(DType::F32, &[]), ConstBytes::owned(1f32.to_le_bytes().to_vec()));
    g.values[c].attrs = ValueAttrs::with_origin("fc.weight");
    g.values[x].attrs = ValueAttrs::default();
    assert_eq!(verify(&g), Ok(()));
}

#[test]
fn replace_all_uses_hands_attributes_to_the_replacement() {
    let mut g = Graph::new();
    let ty = TensorType::fixed(DType::F32, &[2]);
    let x = g.add_input("x", ty.clone());
    let a = g.push(Op::Unary(UnaryOp::Neg), vec![x], ty.clone(), None);
    let b = g.push(Op::Unary(UnaryOp::Neg), vec![a], ty.clone(), None);
    let c = g.push(Op::Unary(UnaryOp::Relu), vec![b], ty.clone(), None);
    g.add_output("y", c);
    g.values[b].attrs = ValueAttrs::with_origin("b");
    // `b` (whose producer is dropped) is replaced by `x`, which has no attributes.
    g.order.remove(1);
    g.replace_all_uses(b, x);
    assert_eq!(g.nodes[g.order[1]].inputs, [x]);
    assert_eq!(g.values[x].attrs, ValueAttrs::with_origin("b"));
    // A replacement that has its own attributes keeps them; chains resolve to the end.
    g.values[c].attrs = ValueAttrs::with_origin("c");
    let mut map = SecondaryMap::new();
    map[a] = Some(c);
    map[c] = Some(x);
    g.values[a].attrs = ValueAttrs::with_origin("a");
    g.replace_uses(&map);
    assert_eq!(g.values[x].attrs, ValueAttrs::with_origin("b"));
    assert_eq!(g.values[c].attrs, ValueAttrs::with_origin("c"));
}
