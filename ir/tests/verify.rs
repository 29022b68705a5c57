//! The verifier accepts valid graphs and reports every broken invariant.

use kiln_ir::text::parse;
use kiln_ir::verify::verify;
use kiln_ir::*;

const VALID: &str = r#"
graph {
  sym batch in [1, 64]
  sym seq in [1, inf]
  input %0 "x": f32[batch, seq, 16]
  input %1 "ids": i64[seq]
  const %2 "w": f32[8, 16] = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
  const %3 "one": f32[] = [1.0]
  %4: f32[batch, seq, 8] = linear(%0, %2) @"linear" "File \"m.py\", line 3, in forward"
  %5: f32[batch, seq, 8] = add(%4, %3)
  %6: bool[batch, seq, 8] = gt(%5, %3)
  %7: f32[batch, seq, 8] = where(%6, %5, %4)
  %8: f32[seq, batch, 8] = permute{perm=[1, 0, 2]}(%7)
  %9: f32[(seq + -1), batch, 8] = slice{axis=0, start=1, end=max, step=1}(%8)
  %10: f32[batch, seq, 16] = gather{axis=1}(%0, %1)
  %11: f32[batch, 1, 16] = reduce_sum{axes=[1], keep_dims=true}(%10)
  %12: f32[batch, seq, 8] = attention{causal=true}(%4, %5, %7)
  %13: f32[(batch * seq), 8] = reshape{shape=[(seq * batch), 8]}(%12)
  output %9 "sliced"
  output %11 "summed"
  output %13 "flat"
}
"#;

fn valid() -> Graph {
    parse(VALID).unwrap_or_else(|e| panic!("{e}"))
}

fn errors(g: &Graph) -> Vec<String> {
    verify(g).err().map(|e| e.errors).unwrap_or_default()
}

#[test]
fn valid_graph_passes() {
    assert_eq!(verify(&valid()), Ok(()));
}

#[test]
fn filetest_inputs_verify() {
    let src =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/filetests/identity_mlp.kir")).unwrap();
    let input = src.split("; expect:").next().unwrap();
    assert_eq!(verify(&parse(input).unwrap()), Ok(()));
}

#[test]
fn wrong_result_types_are_reported_with_the_node() {
    let mut g = valid();
    let linear = g.order[0];
    let out = g.nodes[linear].outputs[0];
    g.values[out].ty = TensorType::new(DType::F16, g.values[out].ty.shape.clone());
    let errs = errors(&g);
    assert!(errs.iter().any(|e| e.starts_with("linear (n0) from `linear` at m.py:3: result 0 (v4) has type f16[batch, seq, 8], but the op gives f32[batch, seq, 8]")), "{errs:#?}");
    // The dtype change ripples into `add`, which now mixes f16 and f32.
    assert!(errs.iter().any(|e| e.contains("add (n1): add: dtypes differ")), "{errs:#?}");

    let mut g = valid();
    let slice = g.order[5];
    let out = g.nodes[slice].outputs[0];
    g.values[out].ty.shape[2] = Dim::Const(9);
    assert_eq!(
        errors(&g),
        vec![
            "slice (n5): result 0 (v9) has type f32[(seq + -1), batch, 9], but the op gives f32[(seq + -1), batch, 8]"
        ]
    );
    // Undecidable symbolic comparisons pass: `seq` could be 5.
    g.values[out].ty.shape[2] = Dim::Const(8);
    g.values[out].ty.shape[0] = Dim::Const(5);
    assert_eq!(verify(&g), Ok(()));
}

#[test]
fn every_broken_invariant_is_collected() {
    let mut g = valid();
    let (n_add, n_gt, n_perm, n_reduce) = (g.order[1], g.order[2], g.order[4], g.order[7]);
    // Schedule: `gt` before `add`, and `add` twice.
    g.order.swap(1, 2);
    g.order.push(n_add);
    // Attributes.
    g.nodes[n_perm].op = Op::Permute { perm: vec![0, 0, 2] };
    g.nodes[n_reduce].op = Op::Reduce { kind: ReduceKind::Sum, axes: vec![3], keep_dims: true };
    // Operand count.
    g.nodes[n_gt].inputs.push(ValueId::from_u32(0));
    // Constants, outputs, symbols, ids.
    let w = g.consts.keys().next().unwrap();
    g.consts[w].bytes = ConstBytes::owned(vec![0; 12]);
    g.output_names.pop();
    g.outputs.push(ValueId::from_u32(999));
    g.symbols[SymbolId::from_u32(1)].min = -1;
    g.order.push(NodeId::from_u32(77));
    let errs = errors(&g);
    let expected = [
        "symbol `seq` (s1): invalid range [-1, inf]",
        "constant c0 (v2, `w`): 12 bytes, but shape [8, 16] of f32 needs 512",
        "gt (n2): operand 0 (v5) is used before it is defined: its producer comes later in the order",
        "gt (n2): takes 2..=2 operands, has 3",
        "permute (n4): [0, 0, 2] is not a permutation of 0..3",
        "reduce_sum (n7): axis 3 out of range for rank 3",
        "add (n1): appears more than once in the order",
        "order: node n77 is out of range (10 nodes)",
        "4 outputs but 2 output names",
        "output 3: v999 is out of range",
    ];
    for e in expected {
        assert!(errs.iter().any(|x| x == e), "missing `{e}` in {errs:#?}");
    }
    assert_eq!(errs.len(), expected.len(), "{errs:#?}");
    let text = verify(&g).unwrap_err().to_string();
    assert_eq!(text.lines().count(), expected.len());
}

#[test]
fn definitions_and_symbols_are_checked() {
    let mut g = valid();
    // A result claimed by another node, an input whose def is wrong, a dropped producer.
    let first = g.order[0];
    let stolen = g.nodes[g.order[1]].outputs[0];
    g.nodes[first].outputs.push(stolen);
    g.values[g.inputs[1]].def = ValueDef::Input(0);
    let gt = g.order[2];
    g.order.retain(|&n| n != gt); // drop `gt`: `where` loses its operand
    g.values[g.inputs[0]].ty.shape.push(Dim::Sym(SymbolId::from_u32(9)));
    let errs = errors(&g);
    for e in [
        "input 1 (v1): defined as Input(0), not Input(1)",
        "input 0 (v0): mentions symbol s9, which does not exist",
        "linear (n0) from `linear` at m.py:3: result 1 (v5) is defined as Node { node: n1, index: 0 }, not by this node",
        "where (n3): operand 0 (v6) is used before it is defined: its producer is not in the order",
    ] {
        assert!(errs.iter().any(|x| x == e), "missing `{e}` in {errs:#?}");
    }
}

/// `(i, a, b) -> (i + 1, b, body_b)` over `f32[3]` values, with `body_b`'s
/// line and the condition's result type given.
fn loop_text(body_b: &str, cond_ty: &str) -> String {
    format!(
        r#"graph {{
  input %0 "a": f32[3]
  input %1 "n": i64[]
  const %2: i64[] = [0]
  %3: i64[], %4: f32[3], %5: f32[3] = while{{carried=3, cond=graph {{
    input %0: i64[]
    input %1: f32[3]
    input %2: f32[3]
    input %3: i64[]
    %4: {cond_ty} = lt(%0, %3)
    output %4
  }}, body=graph {{
    input %0: i64[]
    input %1: f32[3]
    input %2: f32[3]
    input %3: i64[]
    const %4: i64[] = [1]
    %5: i64[] = add(%0, %4)
    {body_b}
    output %5
    output %2
    output %6
  }}}}(%2, %0, %0, %1)
  output %5 "b"
}}
"#
    )
}

#[test]
fn loops_verify_their_nested_graphs_and_carried_types() {
    let ok = parse(&loop_text("%6: f32[3] = neg(%1)", "bool[]")).unwrap();
    verify(&ok).unwrap();
    // A carried value that changes shape in the body.
    let g = parse(&loop_text("%6: f32[1] = reduce_sum{axes=[0], keep_dims=true}(%1)", "bool[]")).unwrap();
    let errors = verify(&g).unwrap_err().to_string();
    assert!(
        errors.contains("carried value 2 changes type in the loop: it enters as f32[3], `body` returns f32[1]"),
        "{errors}"
    );
    // A broken nested graph is reported through the loop.
    let g = parse(&loop_text("%6: f32[3] = neg(%1)", "f32[]")).unwrap();
    let errors = verify(&g).unwrap_err().to_string();
    assert!(errors.contains("`cond`: lt"), "{errors}");
    assert!(errors.contains("`cond` must return one 1-element bool"), "{errors}");
}

const COMPLEX: &str = r#"
graph {
  input %0 "z": f32[3, 2] as c64
  input %1 "x": f32[3]
  %2: f32[3, 2] = neg(%0)
  output %2 "y" as c64
  output %1 "x"
}
"#;

/// Complex boundary positions: printed and parsed as `as c64`, and checked.
#[test]
fn complex_boundary_round_trips_and_is_checked() {
    let g = parse(COMPLEX).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((g.complex_inputs.clone(), g.complex_outputs.clone()), (vec![0], vec![0]));
    assert_eq!(verify(&g), Ok(()));
    let printed = text::print(&g);
    assert!(printed.contains("f32[3, 2] as c64") && printed.contains("\"y\" as c64"), "{printed}");
    let again = parse(&printed).unwrap();
    assert_eq!((again.complex_inputs, again.complex_outputs), (vec![0], vec![0]));
    // Not f32 pairs, twice, out of range, and a complex value in the graph.
    let mut bad = g.clone();
    bad.complex_inputs = vec![1, 1, 5];
    let v = bad.inputs[0];
    bad.values[v].ty.dtype = DType::C64;
    let errs = errors(&bad).join("\n");
    for want in [
        "complex input 1: its value is",
        "complex input 1: listed twice",
        "complex input 5: no such input",
        "has dtype c64; complex values exist only at the program's boundary",
    ] {
        assert!(errs.contains(want), "missing `{want}` in:\n{errs}");
    }
    // `as` must name the complex type over the value's dtype.
    let err = parse(&COMPLEX.replace("f32[3, 2] as c64", "f32[3, 2] as c128")).unwrap_err().to_string();
    assert!(err.contains("a complex view needs c64 over f32 or c128 over f64"), "{err}");
}
