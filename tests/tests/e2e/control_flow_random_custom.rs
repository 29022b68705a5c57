//! `torch.cond`, random ops, custom ops and `x[mask] = values` with a mask
//! given at run time (fixtures from `tests/fixtures/generate_extras.py`), in
//! both IR flavours.

use kiln_compiler::import::{import_pt2, import_pt2_with, CustomOpContext, ImportError, ImportOptions};
use kiln_compiler::{compile_file, CompileOptions};
use kiln_ir::{BinaryOp, Op, ReduceKind, UnaryOp, ValueId};
use kiln_runtime::{DType, Program, SessionOptions, Tensor, TensorView};
use kiln_tests::{assert_outputs_close, fixture_dir, load_fixture, read_numbered, run_session, temp_path, FLAVOURS};
use std::sync::Arc;

fn run(session: &mut kiln_runtime::Session, inputs: &[Tensor]) -> Vec<Tensor> {
    run_session(session, inputs).expect("run")
}

fn compare(what: &str, got: &[Tensor], want: &[Tensor]) {
    assert_outputs_close(what, got, want, 1e-4, 1e-5);
}

// ------------------------------------------------------------------ torch.cond

#[test]
fn cond_takes_each_branch_like_pytorch() {
    let dir = fixture_dir("control_flow");
    for flavour in FLAVOURS {
        let program = load_fixture("control_flow", flavour);
        let mut session = program.session().expect("session");
        let (x, want) = (read_numbered(&dir, "input"), read_numbered(&dir, "output"));
        let (alt_x, alt_want) = (read_numbered(&dir, "alt_input"), read_numbered(&dir, "alt_output"));
        compare(&format!("{flavour} true branch"), &run(&mut session, &x), &want);
        compare(&format!("{flavour} false branch"), &run(&mut session, &alt_x), &alt_want);
        compare(&format!("{flavour} true branch again"), &run(&mut session, &x), &want);
    }
}

#[test]
fn cond_imports_both_branches_and_selects_with_where() {
    let g = import_pt2(&fixture_dir("control_flow").join("training.pt2")).expect("import").graph;
    let wheres = g.order.iter().filter(|&&n| matches!(g.nodes[n].op, Op::Where)).count();
    assert_eq!(wheres, 2, "one Where per cond output");
    let ops: Vec<&Op> = g.order.iter().map(|&n| &g.nodes[n].op).collect();
    assert!(ops.iter().any(|o| matches!(o, Op::Unary(UnaryOp::Sin))), "true branch missing");
    assert!(ops.iter().any(|o| matches!(o, Op::Unary(UnaryOp::Cos))), "false branch missing");
}

// `while_loop` (control_flow/while_loop.pt2 included): tests/while_loop.rs.

// ------------------------------------------------------------------ random ops

fn f64s(t: &Tensor) -> Vec<f64> {
    let n = t.data.len() / t.dtype.size_bytes();
    (0..n)
        .map(|i| {
            let b = &t.data[i * t.dtype.size_bytes()..(i + 1) * t.dtype.size_bytes()];
            match t.dtype {
                DType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
                DType::F64 => f64::from_le_bytes(b.try_into().unwrap()),
                DType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
                other => panic!("unexpected dtype {other}"),
            }
        })
        .collect()
}

fn mean_var(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    (mean, v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n)
}

fn assert_near(what: &str, got: f64, want: f64, tol: f64) {
    assert!((got - want).abs() <= tol, "{what}: {got} is not within {tol} of {want}");
}

/// Checks every output of the `random` fixture (see generate_extras.py) for
/// shape, dtype, range and distribution statistics.
fn check_random_outputs(what: &str, out: &[Tensor]) {
    assert_eq!(out.len(), 11, "{what}");
    let expect = |i: usize, dtype: DType, shape: &[usize]| {
        assert_eq!((out[i].dtype, out[i].shape.as_slice()), (dtype, shape), "{what}: output {i}");
        f64s(&out[i])
    };
    let uniform = |name: &str, v: &[f64], lo: f64, hi: f64| {
        assert!(v.iter().all(|&x| lo <= x && x < hi), "{what}: {name} outside [{lo}, {hi})");
        let (m, var) = mean_var(v);
        assert_near(&format!("{what}: {name} mean"), m, (lo + hi) / 2.0, 0.03 * (hi - lo));
        assert_near(&format!("{what}: {name} variance"), var, (hi - lo).powi(2) / 12.0, 0.1 * (hi - lo).powi(2) / 12.0);
    };
    let normal = |name: &str, v: &[f64], mean: f64, std: f64| {
        let (m, var) = mean_var(v);
        assert_near(&format!("{what}: {name} mean"), m, mean, 0.08 * std);
        assert_near(&format!("{what}: {name} variance"), var, std * std, 0.1 * std * std);
        let within_2sd = v.iter().filter(|&&x| (x - mean).abs() < 2.0 * std).count() as f64 / v.len() as f64;
        assert_near(&format!("{what}: {name} P(|z| < 2)"), within_2sd, 0.9545, 0.02);
    };
    uniform("rand", &expect(0, DType::F32, &[64, 64]), 0.0, 1.0);
    normal("randn (f64)", &expect(1, DType::F64, &[64, 64]), 0.0, 1.0);
    uniform("rand_like", &expect(2, DType::F32, &[64, 64]), 0.0, 1.0);
    normal("randn_like", &expect(3, DType::F32, &[64, 64]), 0.0, 1.0);
    let ints = expect(4, DType::I64, &[4096]);
    assert!(ints.iter().all(|&x| (3.0..10.0).contains(&x) && x.fract() == 0.0), "{what}: randint outside [3, 10)");
    for k in 3..10 {
        let freq = ints.iter().filter(|&&x| x == k as f64).count() as f64 / ints.len() as f64;
        assert_near(&format!("{what}: randint P({k})"), freq, 1.0 / 7.0, 0.03);
    }
    let mut perm = expect(5, DType::I64, &[100]);
    assert_ne!(perm, (0..100).map(f64::from).collect::<Vec<_>>(), "{what}: randperm is the identity");
    perm.sort_by(f64::total_cmp);
    assert_eq!(perm, (0..100).map(f64::from).collect::<Vec<_>>(), "{what}: randperm is not a permutation");
    let bern = expect(6, DType::F32, &[64, 64]);
    assert!(bern.iter().all(|&x| x == 0.0 || x == 1.0), "{what}: bernoulli values");
    assert_near(&format!("{what}: bernoulli rate"), mean_var(&bern).0, 0.3, 0.03);
    let drop = expect(7, DType::F32, &[64, 64]);
    let scale = 1.0f32 / 0.75;
    assert!(drop.iter().all(|&x| x == 0.0 || x as f32 == scale), "{what}: dropout values (x = 1) must be 0 or 1/(1-p)");
    let dropped = drop.iter().filter(|&&x| x == 0.0).count() as f64 / drop.len() as f64;
    assert_near(&format!("{what}: dropout rate"), dropped, 0.25, 0.03);
    uniform("uniform_(-2, 3)", &expect(8, DType::F32, &[64, 64]), -2.0, 3.0);
    normal("normal_(1, 2)", &expect(9, DType::F32, &[64, 64]), 1.0, 2.0);
    normal("normal(x, 0.5)", &expect(10, DType::F32, &[64, 64]), 1.0, 0.5);
    // Different ops draw different numbers, even with one distribution and shape.
    assert_ne!(out[0].data, out[2].data, "{what}: rand and rand_like drew the same numbers");
}

#[test]
fn random_ops_have_torch_distributions() {
    let x = read_numbered(&fixture_dir("random"), "input");
    for flavour in FLAVOURS {
        let program = load_fixture("random", flavour);
        let mut session = program.session().expect("session");
        let first = run(&mut session, &x);
        check_random_outputs(&format!("{flavour} run 1"), &first);
        let second = run(&mut session, &x);
        check_random_outputs(&format!("{flavour} run 2"), &second);
        assert_ne!(first[0].data, second[0].data, "{flavour}: each run must draw new numbers");
    }
}

#[test]
fn random_ops_are_reproducible_per_seed() {
    let x = read_numbered(&fixture_dir("random"), "input");
    let program: Arc<Program> = load_fixture("random", "aten");
    let mut a = program.session().expect("session");
    let mut b = program.session().expect("session");
    let (a1, a2) = (run(&mut a, &x), run(&mut a, &x));
    assert_eq!(a1, run(&mut b, &x), "two sessions with the default seed draw the same first run");
    assert_eq!(a2, run(&mut b, &x), "... and the same second run");
    a.set_seed(0);
    assert_eq!(a1, run(&mut a, &x), "set_seed restarts the sequence");
    let mut c = program.session_with(&SessionOptions { seed: 7, ..SessionOptions::default() }).expect("session");
    let c1 = run(&mut c, &x);
    assert_ne!(a1[0].data, c1[0].data, "another seed draws other numbers");
    a.set_seed(7);
    assert_eq!(c1, run(&mut a, &x), "set_seed(7) matches SessionOptions::seed = 7");
}

// ------------------------------------------------------------------ custom ops

/// `mylib::fused_rmsnorm(Tensor x, Tensor weight, float eps=1e-6)` on kiln IR.
fn fused_rmsnorm(ctx: &mut CustomOpContext) -> Result<Vec<ValueId>, String> {
    let x = ctx.input_tensor("x")?;
    let weight = ctx.input_tensor("weight")?;
    let eps = ctx.float_arg("eps")?.unwrap_or(1e-6);
    let (rank, dtype) = (ctx.ty(x).rank(), ctx.ty(x).dtype);
    let sq = ctx.push(Op::Binary(BinaryOp::Mul), vec![x, x])?;
    let ms = ctx.push(Op::Reduce { kind: ReduceKind::Mean, axes: vec![rank - 1], keep_dims: true }, vec![sq])?;
    let eps = ctx.scalar(eps, dtype);
    let ms = ctx.push(Op::Binary(BinaryOp::Add), vec![ms, eps])?;
    let inv = ctx.push(Op::Unary(UnaryOp::Rsqrt), vec![ms])?;
    let y = ctx.push(Op::Binary(BinaryOp::Mul), vec![x, inv])?;
    Ok(vec![ctx.push(Op::Binary(BinaryOp::Mul), vec![y, weight])?])
}

#[test]
fn unregistered_custom_op_is_reported_with_what_the_file_knows() {
    for flavour in FLAVOURS {
        let path = fixture_dir("custom_op").join(format!("{flavour}.pt2"));
        let err = import_pt2(&path).expect_err("no lowering registered");
        assert!(matches!(err, ImportError::Unsupported(_)), "{err}");
        let err = err.to_string();
        assert!(err.contains("mylib.fused_rmsnorm.default"), "{err}");
        assert!(err.contains("`mylib::fused_rmsnorm.default(Tensor x, Tensor weight, float eps) -> Tensor`"), "{err}");
        assert!(err.contains("stores no schema"), "{err}");
        assert!(err.contains("generate_extras.py:"), "no Python line in: {err}");
        assert!(err.contains("with_custom_op(\"mylib::fused_rmsnorm\""), "{err}");
    }
}

#[test]
fn registered_custom_op_lowering_matches_pytorch() {
    let dir = fixture_dir("custom_op");
    let (x, want) = (read_numbered(&dir, "input"), read_numbered(&dir, "output"));
    let options = ImportOptions::default().with_custom_op("mylib::fused_rmsnorm", fused_rmsnorm);
    for flavour in FLAVOURS {
        let tmp = temp_path("custom_op");
        let opts = CompileOptions::default().with_import(options.clone());
        compile_file(&dir.join(format!("{flavour}.pt2")), &tmp, &opts).unwrap_or_else(|e| panic!("{flavour}: {e}"));
        let program = Program::load(&tmp).expect("load");
        std::fs::remove_file(&tmp).ok();
        let mut session = program.session().expect("session");
        compare(&format!("custom_op/{flavour}"), &run(&mut session, &x), &want);
    }
}

#[test]
fn custom_op_registration_accepts_overload_and_dotted_names() {
    let path = fixture_dir("custom_op").join("training.pt2");
    for name in ["mylib::fused_rmsnorm.default", "torch.ops.mylib.fused_rmsnorm", "mylib.fused_rmsnorm"] {
        let options = ImportOptions::default().with_custom_op(name, fused_rmsnorm);
        import_pt2_with(&path, &options).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let other = ImportOptions::default().with_custom_op("mylib::fused_rmsnorm.other_overload", fused_rmsnorm);
    assert!(import_pt2_with(&path, &other).is_err(), "an other overload's lowering must not apply");
}

#[test]
fn bad_custom_op_lowerings_are_reported_not_trusted() {
    let path = fixture_dir("custom_op").join("training.pt2");
    let failing = ImportOptions::default()
        .with_custom_op("mylib::fused_rmsnorm", |_: &mut CustomOpContext| Err("eps must be positive".into()));
    let err = import_pt2_with(&path, &failing).expect_err("lowering fails").to_string();
    assert!(err.contains("lowering of `mylib::fused_rmsnorm` failed: eps must be positive"), "{err}");
    let wrong_shape = ImportOptions::default().with_custom_op("mylib::fused_rmsnorm", |ctx: &mut CustomOpContext| {
        let x = ctx.input_tensor("x")?;
        Ok(vec![ctx.push(Op::Reduce { kind: ReduceKind::Sum, axes: vec![0], keep_dims: false }, vec![x])?])
    });
    let err = import_pt2_with(&path, &wrong_shape).expect_err("wrong shape").to_string();
    assert!(err.contains("but the program declares"), "{err}");
    let too_many = ImportOptions::default().with_custom_op("mylib::fused_rmsnorm", |ctx: &mut CustomOpContext| {
        let x = ctx.input_tensor("x")?;
        Ok(vec![x, x])
    });
    let err = import_pt2_with(&path, &too_many).expect_err("two values for one output").to_string();
    assert!(err.contains("returned 2 values for 1 tensor outputs"), "{err}");
    let missing = ImportOptions::default()
        .with_custom_op("mylib::fused_rmsnorm", |ctx: &mut CustomOpContext| Ok(vec![ctx.input_tensor("no_such_arg")?]));
    let err = import_pt2_with(&path, &missing).expect_err("unknown argument").to_string();
    assert!(err.contains("no_such_arg"), "{err}");
}

// ------------------------------------------------------------------ index_put with a run-time mask

fn bool_mask(bits: &[bool]) -> Tensor {
    Tensor { dtype: DType::Bool, shape: vec![bits.len()], data: bits.iter().map(|&b| b as u8).collect() }
}

#[test]
fn masked_index_put_places_rows_and_refuses_a_count_mismatch() {
    let dir = fixture_dir("index_put_mask");
    let (inputs, want) = (read_numbered(&dir, "input"), read_numbered(&dir, "output"));
    let (x, v) = (inputs[0].to_f32().expect("x f32"), inputs[2].to_f32().expect("v f32"));
    for flavour in FLAVOURS {
        let program = load_fixture("index_put_mask", flavour);
        let mut session = program.session().expect("session");
        compare(&format!("{flavour} fixture mask"), &run(&mut session, &inputs), &want);
        // Another mask with three true positions: rows 0, 1, 2 of v go to rows 1, 3, 4 of x.
        let mask = bool_mask(&[false, true, false, true, true]);
        let got = run(&mut session, &[inputs[0].clone(), mask, inputs[2].clone()]);
        let got = got[0].to_f32().expect("f32 output");
        for (row, from) in [(0, None), (1, Some(0)), (2, None), (3, Some(1)), (4, Some(2))] {
            let expect: Vec<f32> = match from {
                Some(r) => v[r * 4..r * 4 + 4].to_vec(),
                None => x[row * 4..row * 4 + 4].to_vec(),
            };
            assert_eq!(&got[row * 4..row * 4 + 4], expect.as_slice(), "{flavour}: row {row}");
        }
        // torch raises when the count differs from v's 3 rows; kiln must not use a prefix.
        for bits in [[true, true, false, false, false], [true, true, true, true, false], [false; 5]] {
            let ins = [inputs[0].clone(), bool_mask(&bits), inputs[2].clone()];
            let views: Vec<TensorView<'_>> = ins.iter().map(Tensor::view).collect();
            let err = session.run(&views).map(|_| ()).expect_err("count mismatch must fail").to_string();
            assert!(err.contains("number of true positions"), "{flavour} {bits:?}: {err}");
        }
        // The session still works after the refused runs.
        compare(&format!("{flavour} fixture mask again"), &run(&mut session, &inputs), &want);
    }
}
