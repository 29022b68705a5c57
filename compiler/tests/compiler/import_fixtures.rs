//! Imports every fixture under `tests/fixtures/<model>/{training,aten}.pt2`
//! (written by `tests/fixtures/generate.py`) and checks the signature against
//! its `meta.json` and the op mix against what each flavour should map to.

use kiln_compiler::import::{import_pt2, ImportError, Imported};
use kiln_ir::{DType, Dim, Graph, Op, UnaryOp, ValueDef};
use serde_json::Value;
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

const MODELS: [&str; 6] = ["mlp", "cnn", "transformer", "transformer_mask", "dynamic_mlp", "transformer_dynseq"];

fn import(model: &str, flavour: &str) -> Imported {
    let path = fixtures().join(model).join(format!("{flavour}.pt2"));
    match import_pt2(&path) {
        Ok(i) => i,
        Err(e) => panic!("{}: {e}", path.display()),
    }
}

fn count(g: &Graph, pred: impl Fn(&Op) -> bool) -> usize {
    g.order.iter().filter(|&&n| pred(&g.nodes[n].op)).count()
}

fn dtype_of(name: &str) -> DType {
    match name {
        "float32" => DType::F32,
        "int64" => DType::I64,
        "bool" => DType::Bool,
        other => panic!("fixture dtype {other}"),
    }
}

/// Checks input/output names, dtypes and shapes; dynamic dims must be a
/// symbol with the bounds declared in `meta.json`.
fn check_signature(model: &str, g: &Graph) {
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join(model).join("meta.json")).unwrap()).unwrap();
    let inputs = meta["inputs"].as_array().unwrap();
    assert_eq!(g.inputs.len(), inputs.len(), "{model}: input count");
    for (i, spec) in inputs.iter().enumerate() {
        let v = g.inputs[i];
        let name = spec["name"].as_str().unwrap();
        assert_eq!(g.values[v].name.as_deref(), Some(name), "{model}: input {i} name");
        let ty = g.ty(v);
        assert_eq!(ty.dtype, dtype_of(spec["dtype"].as_str().unwrap()), "{model}: {name} dtype");
        let dynamic = &meta["dynamic"][name];
        for (axis, size) in spec["shape"].as_array().unwrap().iter().enumerate() {
            match dynamic.get(axis.to_string()) {
                Some(d) => {
                    let Dim::Sym(s) = &ty.shape[axis] else {
                        panic!("{model}: {name}[{axis}] should be symbolic, is {:?}", ty.shape[axis])
                    };
                    let sym = &g.symbols[*s];
                    assert_eq!(sym.min, d["min"].as_i64().unwrap(), "{model}: {name}[{axis}] min");
                    assert_eq!(sym.max, d["max"].as_i64(), "{model}: {name}[{axis}] max");
                }
                None => assert_eq!(ty.shape[axis], Dim::Const(size.as_i64().unwrap()), "{model}: {name}[{axis}]"),
            }
        }
    }
    let outputs = meta["outputs"].as_array().unwrap();
    assert_eq!(g.outputs.len(), outputs.len(), "{model}: output count");
    let sym_bounds: Vec<(String, i64)> = meta["dynamic"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|axes| axes.as_object().unwrap().values().map(|d| (d["name"].as_str().unwrap().to_string(), 0)))
        .collect();
    for (i, spec) in outputs.iter().enumerate() {
        let ty = g.ty(g.outputs[i]);
        assert_eq!(g.output_names[i], format!("output_{i}"));
        assert_eq!(ty.dtype, dtype_of(spec["dtype"].as_str().unwrap()), "{model}: output {i} dtype");
        let shape = spec["shape"].as_array().unwrap();
        assert_eq!(ty.rank(), shape.len(), "{model}: output {i} rank");
        if sym_bounds.is_empty() {
            let want: Vec<i64> = shape.iter().map(|d| d.as_i64().unwrap()).collect();
            assert_eq!(ty.static_shape(), Some(want), "{model}: output {i} shape");
        } else {
            // Evaluating the symbolic output shape at the example's sizes gives the example's output shape.
            let input_ty = g.ty(g.inputs[0]).clone();
            let example: Vec<i64> =
                inputs[0]["shape"].as_array().unwrap().iter().map(|d| d.as_i64().unwrap()).collect();
            let binding = |s| {
                let axis = input_ty.shape.iter().position(|d| *d == Dim::Sym(s)).expect("symbol bound by input 0");
                example[axis]
            };
            let got: Vec<i64> = ty.shape.iter().map(|d| d.eval(&binding)).collect();
            let want: Vec<i64> = shape.iter().map(|d| d.as_i64().unwrap()).collect();
            assert_eq!(got, want, "{model}: output {i} symbolic shape");
        }
    }
}

#[test]
fn every_fixture_imports_with_its_signature() {
    for model in MODELS {
        for (flavour, verifier) in [("training", "TRAINING"), ("aten", "ATEN")] {
            let imported = import(model, flavour);
            assert_eq!(imported.ir_flavour, verifier, "{model}/{flavour}");
            assert_eq!(imported.schema_version.0, 8);
            assert!(imported.torch_version.as_deref().unwrap_or("").starts_with("2.15"));
            let g = &imported.graph;
            check_signature(model, g);
            if let Err(e) = kiln_ir::verify::verify(g) {
                panic!("{model}/{flavour}: imported graph fails verification:\n{e}");
            }
            // Every node carries its source location.
            assert!(g.order.iter().all(|&n| g.nodes[n].loc.is_some()), "{model}/{flavour}: node without location");
        }
    }
}

#[test]
fn mlp_ops_map_as_expected() {
    let t = import("mlp", "training").graph;
    assert_eq!(count(&t, |o| *o == Op::Linear), 3);
    assert_eq!(count(&t, |o| *o == Op::Unary(UnaryOp::Relu)), 1); // relu_ functionalised
    assert_eq!(count(&t, |o| *o == Op::Unary(UnaryOp::Gelu)), 1);
    assert_eq!(count(&t, |o| matches!(o, Op::Binary(kiln_ir::BinaryOp::Add))), 1); // add_
    let a = import("mlp", "aten").graph;
    assert_eq!(count(&a, |o| *o == Op::MatMul), 3); // addmm → MatMul + Add
    assert_eq!(count(&a, |o| matches!(o, Op::Permute { .. })), 3);
    assert_eq!(count(&a, |o| matches!(o, Op::Binary(kiln_ir::BinaryOp::Add))), 4);
    // Weights are views into the file, typed as the graph says.
    let w = a.consts.values().find(|c| a.values[c.value].name.as_deref() == Some("fc1.weight")).unwrap();
    assert_eq!(w.bytes.len(), 32 * 16 * 4);
    assert_eq!(a.ty(w.value).static_shape(), Some(vec![32, 16]));
}

#[test]
fn cnn_ops_map_as_expected() {
    for flavour in ["training", "aten"] {
        let g = import("cnn", flavour).graph;
        assert_eq!(count(&g, |o| matches!(o, Op::Conv { .. })), 2, "{flavour}");
        assert_eq!(count(&g, |o| matches!(o, Op::BatchNorm { .. })), 2, "{flavour}");
        assert_eq!(count(&g, |o| matches!(o, Op::Pool { kind: kiln_ir::PoolKind::Max, .. })), 1, "{flavour}");
        assert_eq!(count(&g, |o| *o == Op::Clamp { min: Some(0.0), max: Some(6.0) }), 1, "{flavour}: relu6/hardtanh");
        let mut conv2 = g.order.iter().filter_map(|&n| match &g.nodes[n].op {
            Op::Conv { stride, padding, dilation, groups } => {
                Some((stride.clone(), padding.clone(), dilation.clone(), *groups))
            }
            _ => None,
        });
        assert_eq!(conv2.next_back(), Some((vec![2, 2], vec![2, 2], vec![2, 2], 2)), "{flavour}: conv2 attributes");
        // Non-persistent buffer and tensor constant come from data/constants.
        for fqn in ["mean", "inv_std", "bn1.running_var"] {
            assert!(
                g.consts.values().any(|c| g.values[c.value].name.as_deref() == Some(fqn)),
                "{flavour}: const {fqn}"
            );
        }
    }
    let t = import("cnn", "training").graph;
    assert_eq!(count(&t, |o| matches!(o, Op::AdaptiveAvgPool { .. })), 1);
    assert_eq!(count(&t, |o| *o == Op::Linear), 1);
    let a = import("cnn", "aten").graph;
    assert_eq!(count(&a, |o| matches!(o, Op::Reduce { kind: kiln_ir::ReduceKind::Mean, keep_dims: true, .. })), 1);
}

#[test]
fn transformer_ops_map_as_expected() {
    let t = import("transformer", "training").graph;
    assert_eq!(count(&t, |o| *o == Op::Attention { causal: true, scale: None }), 1);
    assert_eq!(count(&t, |o| matches!(o, Op::LayerNorm { normalized_rank: 1, .. })), 3);
    assert_eq!(count(&t, |o| *o == Op::Unary(UnaryOp::GeluTanh)), 1);
    assert_eq!(count(&t, |o| matches!(o, Op::Gather { axis: 0 })), 2); // embedding + pos[arange]
    assert_eq!(count(&t, |o| matches!(o, Op::Slice { .. })), 3); // split into q, k, v
    let a = import("transformer", "aten").graph;
    assert_eq!(count(&a, |o| matches!(o, Op::Attention { .. })), 0);
    assert_eq!(count(&a, |o| matches!(o, Op::Softmax { axis: 3 })), 1);
    assert_eq!(count(&a, |o| *o == Op::MatMul), 7);
    assert_eq!(count(&a, |o| matches!(o, Op::Where)), 2);

    let m = import("transformer_mask", "training").graph;
    let attn: Vec<_> = m.order.iter().filter(|&&n| matches!(m.nodes[n].op, Op::Attention { .. })).collect();
    assert_eq!(attn.len(), 2);
    assert!(attn.iter().any(|&&n| m.nodes[n].inputs.len() == 4 && m.ty(m.nodes[n].inputs[3]).dtype == DType::Bool));
    // Tied weights: two names, one storage in the file.
    let bytes_of = |fqn: &str| {
        let c = m.consts.values().find(|c| m.values[c.value].name.as_deref() == Some(fqn)).unwrap();
        c.bytes.as_bytes().as_ptr()
    };
    assert_eq!(bytes_of("tok.weight"), bytes_of("head.weight"));
}

#[test]
fn dynamic_shapes_stay_symbolic() {
    let g = import("transformer_dynseq", "aten").graph;
    let seq = g.symbol_by_name("s27").expect("symbol from range_constraints");
    assert_eq!((g.symbols[seq].min, g.symbols[seq].max), (2, Some(16)));
    // Arange over the sequence length and reshapes to `2 * seq` rows.
    assert!(g.order.iter().any(|&n| matches!(&g.nodes[n].op, Op::Arange { len: Dim::Sym(s), .. } if *s == seq)));
    assert!(g.order.iter().any(
        |&n| matches!(&g.nodes[n].op, Op::Reshape { shape } if shape[0] == Dim::mul(Dim::Const(2), Dim::Sym(seq)))
    ));
    let d = import("dynamic_mlp", "training").graph;
    assert!(
        count(&d, |o| matches!(o, Op::Softmax { axis: 1 })) == 1
            && count(&d, |o| matches!(o, Op::LogSoftmax { axis: 1 })) == 1
    );
    assert!(matches!(d.ty(d.outputs[0]).shape[0], Dim::Sym(_)));
}

#[test]
fn unsupported_ops_are_all_listed_with_their_lines() {
    let path = fixtures().join("unsupported/two_unsupported.pt2");
    let err = import_pt2(&path).expect_err("linalg_eigvals and f32 matrix_exp are not supported");
    let ImportError::Unsupported(list) = &err else { panic!("expected Unsupported, got {err}") };
    assert_eq!(list.0.len(), 2, "{err}");
    let text = err.to_string();
    let line_of = |marker: &str| {
        let src = std::fs::read_to_string(fixtures().join("generate_unsupported.py")).unwrap();
        src.lines().position(|l| l.contains(marker)).unwrap() + 1
    };
    let eigvals = "aten.linalg_eigvals.default (node linalg_eigvals) at ".to_string();
    let matrix_exp = "aten.linalg_matrix_exp.default (node linalg_matrix_exp) at ".to_string();
    for (what, marker) in [(eigvals, "UNSUPPORTED-1"), (matrix_exp, "UNSUPPORTED-2")] {
        let line = text.lines().find(|l| l.contains(&what)).unwrap_or_else(|| panic!("{what} missing from:\n{text}"));
        // `path:line`, then the reason.
        assert!(line.contains(&format!("generate_unsupported.py:{}: ", line_of(marker))), "{line}");
    }
}

#[test]
fn graph_inputs_and_constants_are_distinct() {
    let g = import("transformer_mask", "aten").graph;
    for &v in &g.inputs {
        assert!(matches!(g.values[v].def, ValueDef::Input(_)));
    }
    assert!(g.consts.len() >= 19);
}
