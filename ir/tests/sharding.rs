//! Meshes and shardings in the text form and the verifier; replace-all-uses
//! hands a sharding to the replacement.

use kiln_ir::text::{parse, print};
use kiln_ir::verify::verify;
use kiln_ir::*;

const SHARDED: &str = "\
graph {
  mesh [data=2, model=2] devices [0, 2, 1, 3]
  input %0 \"x\": f32[4, 8] {origin=\"x\", sharding=[{data}, {}]}
  const %1 \"fc.weight\": f32[8, 4] {origin=\"fc.weight\", sharding=[{}, {model}]} = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0, 18.0, 19.0, 20.0, 21.0, 22.0, 23.0, 24.0, 25.0, 26.0, 27.0, 28.0, 29.0, 30.0, 31.0]
  %2: f32[4, 4] {sharding=[{data}, {model}]} = matmul(%0, %1)
  %3: f32[4, 4] {sharding=[{data, model}, {}] sum{}} = relu(%2)
  %4: f32[4] {sharding=[{}] sum{data, model}} = reduce_sum{axes=[0], keep_dims=false}(%3)
  output %4 \"y\"
}
";

#[test]
fn mesh_and_shardings_print_and_parse_back() {
    let g = parse(SHARDED).unwrap_or_else(|e| panic!("{e}"));
    let mesh = g.mesh.as_ref().expect("mesh");
    assert_eq!(mesh.to_string(), "data=2, model=2");
    assert_eq!(mesh.devices, [0, 2, 1, 3]);
    let x = g.values[g.inputs[0]].attrs.sharding.clone().expect("x is sharded");
    assert_eq!(x, Sharding::split(2, 0, "data"));
    let last = g.values[g.outputs[0]].attrs.sharding.clone().expect("y is sharded");
    assert_eq!(last.partial, ["data", "model"]);
    // An empty `sum{}` is no partial sum: it prints without it.
    let canonical = SHARDED.replace(" sum{}}", "}");
    assert_eq!(print(&g), canonical);
    assert_eq!(print(&parse(&canonical).unwrap_or_else(|e| panic!("{e}"))), canonical);
    verify(&g).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn the_verifier_checks_shardings_against_mesh_and_type() {
    let src = "\
graph {
  mesh [data=2, data=0] devices [1, 1]
  input %0: f32[3, 8] {sharding=[{data}, {model}, {}]}
  %1: f32[3, 8] {sharding=[{data}, {data}]} = relu(%0)
  output %1
}
";
    let g = parse(src).unwrap_or_else(|e| panic!("{e}"));
    let err = verify(&g).expect_err("bad mesh and shardings").to_string();
    for want in [
        "mesh: mesh axis `data` has size 0",
        "mesh: mesh axis `data` is named twice",
        "mesh: the mesh has 0 devices but lists 2",
        "mesh: the mesh lists a device twice",
        "input 0 (v0): sharding [{data}, {model}, {}] has 3 dims but the value has rank 2",
        "input 0 (v0): sharding [{data}, {model}, {}] names axis `model`, which the mesh (data=2, data=0) lacks",
        "result 0 (v1): sharding [{data}, {data}] uses axis `data` twice",
    ] {
        assert!(err.contains(want), "missing `{want}` in:\n{err}");
    }
    let no_mesh = "graph {\n  input %0: f32[4] {sharding=[{data}]}\n  output %0\n}\n";
    let err = verify(&parse(no_mesh).unwrap_or_else(|e| panic!("{e}"))).expect_err("no mesh").to_string();
    assert_eq!(err, "input 0 (v0): has sharding [{data}] but the graph has no mesh");
    let indivisible = "graph {\n  mesh [data=2]\n  input %0: f32[3] {sharding=[{data}]}\n  output %0\n}\n";
    let err = verify(&parse(indivisible).unwrap_or_else(|e| panic!("{e}"))).expect_err("3 / 2").to_string();
    assert!(err.contains("splits dim 0 (size 3) into 2 pieces, which do not divide it"), "{err}");
}

#[test]
fn bad_sharding_text_is_a_parse_error() {
    for (src, want) in [
        ("graph {\n  mesh [a=2]\n  mesh [b=2]\n}", "3:3: the graph declares a mesh twice"),
        ("graph {\n  mesh [a=-1]\n}", "2:11: a mesh axis size is a u32"),
        ("graph {\n  input %0: f32[2] {sharding=[data]}\n}", "2:31: expected `{`, found `data`"),
        (
            "graph {\n  input %0: f32[2] {sharding=[{}], sharding=[{}]}\n}",
            "2:36: value attribute `sharding` is given twice",
        ),
    ] {
        match parse(src) {
            Ok(g) => panic!("parsed:\n{}", print(&g)),
            Err(e) => assert_eq!(e.to_string(), want),
        }
    }
}

#[test]
fn a_replacement_inherits_the_sharding() {
    let src = "\
graph {
  mesh [data=2]
  input %0: f32[4] {sharding=[{data}]}
  %1: f32[4] {sharding=[{data}]} = neg(%0)
  %2: f32[4] = neg(%1)
  %3: f32[4] = relu(%2)
  output %3
}
";
    let mut g = parse(src).unwrap_or_else(|e| panic!("{e}"));
    let (one, two) = (g.nodes[g.order[0]].outputs[0], g.nodes[g.order[1]].outputs[0]);
    g.replace_all_uses(one, two);
    assert_eq!(g.values[two].attrs.sharding, Some(Sharding::split(1, 0, "data")));
}
