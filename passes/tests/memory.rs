mod common;
use common::*;
use kiln_ir::{BinaryOp, DType, Dim, EntityRef, Graph, Op, TensorType, UnaryOp, ValueId};
use kiln_passes::{check_plan, plan_memory, MemoryOptions};

#[test]
fn chain_reuses_memory() {
    // x -> relu -> relu -> ... : two buffers suffice once the chain is long.
    let mut g = Graph::new();
    let mut v = g.add_input("x", f32_ty(&[1, 256]));
    for _ in 0..10 {
        v = push(&mut g, Op::Unary(UnaryOp::Relu), vec![v], &[1, 256]);
    }
    g.add_output("y", v);
    let plan = plan_memory(&g, &MemoryOptions::default()).unwrap();
    check_plan(&g, &plan).unwrap();
    assert_eq!(plan.peak_live_bytes, 2 * 1024);
    assert_eq!(plan.arena_bytes, 2 * 1024);
    assert!(g.inputs.iter().chain(&g.outputs).all(|&v| plan.slots[v].is_some()));
}

#[test]
fn constants_get_no_slot_and_outputs_live_to_the_end() {
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[16]));
    let w = const_f32(&mut g, &[16], &[1.0; 16]);
    let a = push(&mut g, Op::Binary(BinaryOp::Mul), vec![x, w], &[16]);
    let b = push(&mut g, Op::Unary(UnaryOp::Exp), vec![a], &[16]);
    let c = push(&mut g, Op::Unary(UnaryOp::Neg), vec![b], &[16]);
    g.add_output("a", a);
    g.add_output("c", c);
    let plan = plan_memory(&g, &MemoryOptions::default()).unwrap();
    check_plan(&g, &plan).unwrap();
    assert!(plan.slots[w].is_none());
    let (sa, sc) = (plan.slots[a].unwrap(), plan.slots[c].unwrap());
    assert!(sa.offset + sa.size <= sc.offset || sc.offset + sc.size <= sa.offset);
    assert!(plan.slots.iter().filter_map(|(_, s)| *s).all(|s| s.offset % 64 == 0));
}

#[test]
fn symbolic_dims_use_upper_bounds_and_unbounded_is_an_error() {
    let mut g = Graph::new();
    let n = g.add_symbol("batch", 1, Some(8));
    let x = g.add_input("x", TensorType::new(DType::F32, vec![Dim::Sym(n), 100.into()]));
    g.add_output("x", x);
    let plan = plan_memory(&g, &MemoryOptions::default()).unwrap();
    assert_eq!(plan.slots[x].unwrap().size, 8 * 100 * 4);

    let mut g = Graph::new();
    let n = g.add_symbol("seq", 1, None);
    let x = g.add_input("tokens", TensorType::new(DType::I64, vec![Dim::mul(Dim::Sym(n), 2.into())]));
    g.add_output("x", x);
    let err = plan_memory(&g, &MemoryOptions::default()).unwrap_err();
    assert_eq!(err.pass, "plan_memory");
    assert!(err.message.contains("seq") && err.message.contains("torch.export.Dim(\"seq\", max=N)"), "{}", err.message);
}

#[test]
fn check_plan_catches_overlap() {
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[16]));
    let y = push(&mut g, Op::Unary(UnaryOp::Neg), vec![x], &[16]);
    g.add_output("y", y);
    let mut plan = plan_memory(&g, &MemoryOptions::default()).unwrap();
    check_plan(&g, &plan).unwrap();
    plan.slots[y] = plan.slots[x];
    assert!(check_plan(&g, &plan).unwrap_err().contains("overlap"));
}

/// A tiny xorshift so the property test needs no dev-dependency.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

fn random_graph(rng: &mut Rng) -> Graph {
    let mut g = Graph::new();
    let sym = g.add_symbol("n", 1, Some(1 + rng.below(16) as i64));
    let mut values: Vec<ValueId> = Vec::new();
    let ty = |rng: &mut Rng| {
        let d = 1 + rng.below(300) as i64;
        if rng.below(4) == 0 {
            TensorType::new(DType::F32, vec![Dim::Sym(sym), d.into()])
        } else {
            f32_ty(&[d])
        }
    };
    for i in 0..1 + rng.below(3) {
        let t = ty(rng);
        values.push(g.add_input(format!("in{i}"), t));
    }
    for _ in 0..rng.below(40) {
        let a = values[rng.below(values.len())];
        let b = values[rng.below(values.len())];
        let t = ty(rng);
        // Types need not be consistent: planning only reads sizes and the schedule.
        let n = g.add_node(Op::Binary(BinaryOp::Add), vec![a, b], vec![t.clone(), t], None);
        values.extend(g.nodes[n].outputs.clone());
    }
    for _ in 0..1 + rng.below(3) {
        let v = values[rng.below(values.len())];
        g.add_output("out", v);
    }
    g
}

#[test]
fn random_graphs_plan_without_conflicts() {
    let mut rng = Rng(0x9E3779B97F4A7C15);
    let mut ratio_sum = 0.0;
    for case in 0..300 {
        let g = random_graph(&mut rng);
        let plan = plan_memory(&g, &MemoryOptions::default()).unwrap();
        if let Err(e) = check_plan(&g, &plan) {
            panic!("case {case}: {e}");
        }
        assert!(plan.arena_bytes >= plan.peak_live_bytes, "case {case}");
        if plan.peak_live_bytes > 0 {
            ratio_sum += plan.arena_bytes as f64 / plan.peak_live_bytes as f64;
        }
    }
    // Greedy best-fit should stay close to the lower bound on average.
    assert!(ratio_sum / 300.0 < 1.5, "mean arena/peak {}", ratio_sum / 300.0);
}

#[test]
fn realistic_mlp_chain_report() {
    // batch (<= 32) x 784 -> 512 -> 512 -> 10, with residual-free relu chain, as the
    // pipeline leaves it: matmul + add + relu per layer.
    let mut g = Graph::new();
    let n = g.add_symbol("batch", 1, Some(32));
    let row = |d: i64| TensorType::new(DType::F32, vec![Dim::Sym(n), d.into()]);
    let mut x = g.add_input("x", row(784));
    for (i, (k, m)) in [(784, 512), (512, 512), (512, 10)].into_iter().enumerate() {
        let w = const_f32(&mut g, &[k, m], &vec![0.0; (k * m) as usize]);
        let b = const_f32(&mut g, &[m], &vec![0.0; m as usize]);
        let mm = g.push(Op::MatMul, vec![x, w], row(m), None);
        x = g.push(Op::Binary(BinaryOp::Add), vec![mm, b], row(m), None);
        if i < 2 {
            x = g.push(Op::Unary(UnaryOp::Relu), vec![x], row(m), None);
        }
    }
    g.add_output("logits", x);
    let plan = plan_memory(&g, &MemoryOptions::default()).unwrap();
    check_plan(&g, &plan).unwrap();
    let naive: u64 = plan.slots.iter().filter_map(|(_, s)| *s).map(|s| s.size).sum();
    println!("mlp: arena {} B, peak live {} B, no reuse {} B", plan.arena_bytes, plan.peak_live_bytes, naive);
    assert!(plan.arena_bytes >= plan.peak_live_bytes);
    assert!(plan.arena_bytes <= plan.peak_live_bytes * 5 / 4);
    assert!(plan.arena_bytes < naive / 2);
}

#[test]
fn reshapes_of_activations_share_their_input_slot() {
    // x -> relu -> reshape -> reshape -> relu: the reshapes are views of the
    // first relu's buffer, which must then live until the last reshape's use.
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[4, 64]));
    let a = push(&mut g, Op::Unary(UnaryOp::Relu), vec![x], &[4, 64]);
    let r1 = push(&mut g, Op::Reshape { shape: vec![Dim::Const(256)] }, vec![a], &[256]);
    let r2 = push(&mut g, Op::Reshape { shape: vec![Dim::Const(16), Dim::Const(16)] }, vec![r1], &[16, 16]);
    let b = push(&mut g, Op::Unary(UnaryOp::Relu), vec![r2], &[16, 16]);
    g.add_output("y", b);
    let plan = plan_memory(&g, &MemoryOptions::default()).unwrap();
    check_plan(&g, &plan).unwrap();
    assert_eq!(plan.slots[a], plan.slots[r1]);
    assert_eq!(plan.slots[a], plan.slots[r2]);
    let (sa, sb) = (plan.slots[a].unwrap(), plan.slots[b].unwrap());
    assert!(
        sa.offset + sa.size <= sb.offset || sb.offset + sb.size <= sa.offset,
        "the view's buffer is read by the last relu"
    );
    // Without aliasing every reshape gets a buffer of its own.
    let unaliased = plan_memory(&g, &MemoryOptions { alias_reshapes: false, ..MemoryOptions::default() }).unwrap();
    check_plan(&g, &unaliased).unwrap();
    assert_ne!(unaliased.slots[a], unaliased.slots[r1]);
    assert!(plan.arena_bytes <= unaliased.arena_bytes);
}

#[test]
fn reshape_of_a_constant_is_not_aliased() {
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[4]));
    let w = const_f32(&mut g, &[2, 2], &[1.0; 4]);
    let r = push(&mut g, Op::Reshape { shape: vec![Dim::Const(4)] }, vec![w], &[4]);
    let y = push(&mut g, Op::Binary(BinaryOp::Add), vec![x, r], &[4]);
    g.add_output("y", y);
    let plan = plan_memory(&g, &MemoryOptions::default()).unwrap();
    check_plan(&g, &plan).unwrap();
    assert!(plan.slots[w].is_none());
    assert!(plan.slots[r].is_some());
}

#[test]
fn a_loop_gets_a_region_apart_from_everything_live_across_it() {
    // (i, a, b) -> (i + 1, b, -a): `b` moves to position 1 unchanged.
    let g = kiln_ir::text::parse(
        r#"graph {
  input %0 "a": f32[16]
  input %1 "n": i64[]
  const %2: i64[] = [0]
  %3: i64[], %4: f32[16], %5: f32[16] = while{carried=3, cond=graph {
    input %0: i64[]
    input %1: f32[16]
    input %2: f32[16]
    input %3: i64[]
    %4: bool[] = lt(%0, %3)
    output %4
  }, body=graph {
    input %0: i64[]
    input %1: f32[16]
    input %2: f32[16]
    input %3: i64[]
    const %4: i64[] = [1]
    %5: i64[] = add(%0, %4)
    %6: f32[16] = neg(%1)
    %7: f32[16] = reshape{shape=[16]}(%2)
    output %5
    output %2
    output %6
  }}(%2, %0, %0, %1)
  %6: f32[16] = exp(%5)
  output %6 "y"
}
"#,
    )
    .unwrap();
    let mut plan = plan_memory(&g, &MemoryOptions::default()).unwrap();
    check_plan(&g, &plan).unwrap();
    let (&n, lp) = plan.loops.iter().next().expect("one loop");
    // Nested inputs are the parent's slots; the body's own values are planned
    // from the region's start, the swap slot after them.
    let Op::While { body, .. } = &g.nodes[n].op else { unreachable!() };
    assert!(body.inputs.iter().all(|&v| lp.body.slots[v].is_none()));
    // The reshape of a carried value is not a view of the parent's slot.
    let reshaped = body.nodes[body.order[2]].outputs[0];
    assert!(lp.body.slots[reshaped].is_some());
    assert_eq!(lp.swap.iter().map(Option::is_some).collect::<Vec<_>>(), [false, true, false]);
    let swap = lp.swap[1].unwrap();
    assert!(swap.offset >= lp.body.arena_bytes && swap.offset + swap.size <= lp.size);
    assert_eq!(swap.size, 64);
    let region = (lp.offset, lp.offset + lp.size);
    for &v in g.inputs.iter().chain(&g.nodes[n].outputs) {
        let s = plan.slots[v].unwrap();
        assert!(s.offset + s.size <= region.0 || region.1 <= s.offset, "{v} overlaps the loop's region");
    }
    // A region moved onto a value live across the loop is caught.
    let a = plan.slots[g.inputs[0]].unwrap();
    plan.loops.get_mut(&n).unwrap().offset = a.offset;
    let err = check_plan(&g, &plan).unwrap_err();
    assert!(err.contains("overlap while both live"), "{err}");
}

/// A graph over a `[4, 2]` state `s` (input `%2`, with `%0` a row and
/// `%1` its position): `body` defines the values from `%3` on, `outputs`
/// lists the program's results, then the state's update `update`.
fn state_graph(body: &str, outputs: &str, update: &str) -> Graph {
    let k = outputs.matches("output").count();
    let src = format!(
        "graph {{
  input %0 \"row\": f32[1, 2] {{origin=\"row\"}}
  input %1 \"pos\": i64[1] {{origin=\"pos\"}}
  input %2 \"s\": f32[4, 2] {{origin=\"s\"}}
{body}
{outputs}
  output {update} \"state s\"
  state \"s\" input 2 output {k} = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
}}"
    );
    kiln_ir::text::parse(&src).unwrap_or_else(|e| panic!("{e}\n{src}"))
}

fn in_place() -> MemoryOptions {
    MemoryOptions { state_in_place: true, ..MemoryOptions::default() }
}

const WRITE_ROW: &str = "  %3: f32[4, 2] = index_put{axis=0, accumulate=false}(%2, %0, %1)";

#[test]
fn a_state_update_is_written_in_its_storage_when_nothing_reads_the_old_value_after() {
    use kiln_passes::memory::StateWrite;
    // index_put on the old value: in place; the view of the update shares it.
    let body = format!("{WRITE_ROW}\n  %4: f32[8] = reshape{{shape=[8]}}(%3)\n  %5: f32[8] = neg(%4)");
    let g = state_graph(&body, "  output %5 \"y\"", "%3");
    let plan = plan_memory(&g, &in_place()).unwrap();
    check_plan(&g, &plan).unwrap();
    let (u, view) = (ValueId::new(3), ValueId::new(4));
    assert!(matches!(plan.state_writes[..], [Some(StateWrite::InPlace { .. })]), "{:?}", plan.state_writes);
    assert_eq!((plan.state_values[u], plan.state_values[view]), (Some(0), Some(0)));
    assert_eq!((plan.slots[u], plan.slots[view]), (None, None));
    // Nor does the old value, read where it lies.
    assert_eq!(plan.slots[ValueId::new(2)], None);
    let copied = plan_memory(&g, &MemoryOptions::default()).unwrap();
    assert!(copied.state_writes.is_empty() && copied.slots[u].is_some());
    assert!(plan.arena_bytes < copied.arena_bytes, "{} vs {}", plan.arena_bytes, copied.arena_bytes);
    // A producer that does not read the old value, scheduled after its last
    // reader, writes there directly.
    let body = "  %3: f32[4, 2] = neg(%2)\n  %4: f32[4, 2] = exp(%3)";
    let g = state_graph(body, "  output %3 \"y\"", "%4");
    let plan = plan_memory(&g, &in_place()).unwrap();
    check_plan(&g, &plan).unwrap();
    assert!(matches!(plan.state_writes[..], [Some(StateWrite::Direct { .. })]), "{:?}", plan.state_writes);
    assert_eq!(plan.state_values[ValueId::new(4)], Some(0));
}

#[test]
fn a_state_update_keeps_its_copy_when_the_old_value_is_needed_later() {
    let read_after = format!("{WRITE_ROW}\n  %4: f32[4, 2] = neg(%2)");
    for (body, outputs, update) in [
        // The old value read after the update.
        (read_after.as_str(), "  output %4 \"y\"", "%3"),
        // The old value returned.
        (WRITE_ROW, "  output %2 \"old\"", "%3"),
        // The update also returned to the caller.
        (WRITE_ROW, "  output %3 \"new\"", "%3"),
        // The old value read by the update other than as the data updated in place.
        ("  %3: f32[4, 2] = add(%2, %2)", "", "%3"),
        // The state unchanged.
        ("", "", "%2"),
    ] {
        let g = state_graph(body, outputs, update);
        let plan = plan_memory(&g, &in_place()).unwrap();
        check_plan(&g, &plan).unwrap();
        assert_eq!(plan.state_writes, [None], "{body} / {outputs}");
        // A returned old value keeps the slot its copy is returned from.
        if g.outputs.contains(&ValueId::new(2)) {
            assert!(plan.slots[ValueId::new(2)].is_some());
        }
        assert!(plan.state_values.iter().all(|(_, k)| k.is_none()), "{body} / {outputs}");
    }
}

#[test]
fn check_plan_refuses_a_state_write_the_graph_does_not_allow() {
    use kiln_passes::memory::StateWrite;
    let g = state_graph(WRITE_ROW, "", "%3");
    let mut plan = plan_memory(&g, &in_place()).unwrap();
    check_plan(&g, &plan).unwrap();
    let n = plan.state_writes[0].expect("in place").node();
    plan.state_writes[0] = Some(StateWrite::Direct { node: n });
    assert!(check_plan(&g, &plan).unwrap_err().contains("the graph allows"));
    // The same plan for a graph that reads the old value afterwards.
    let plan = plan_memory(&g, &in_place()).unwrap();
    let later = state_graph(&format!("{WRITE_ROW}\n  %4: f32[4, 2] = neg(%2)"), "  output %4 \"y\"", "%3");
    let err = check_plan(&later, &plan).unwrap_err();
    assert!(err.contains("reads the old value after the update"), "{err}");
}

#[test]
fn an_elementwise_update_reading_the_old_value_once_runs_in_place() {
    use kiln_passes::memory::StateWrite;
    // A filter-like `s * row` (the row broadcast), the old value at either
    // operand, and a unary op: each written over the old value, no slot.
    for body in [
        "  %3: f32[4, 2] = mul(%2, %0)",
        "  %3: f32[4, 2] = sub(%0, %2)",
        "  %3: f32[4, 2] = neg(%2)",
        "  %3: f32[4, 2] = neg(%2)\n  %4: f32[4, 2] = add(%3, %0)\n  %5: f32[4, 2] = exp(%3)",
    ] {
        let g = state_graph(body, "", "%3");
        let plan = plan_memory(&g, &in_place()).unwrap();
        check_plan(&g, &plan).unwrap();
        let Some(StateWrite::InPlace { node }) = plan.state_writes[0] else {
            panic!("{body}: {:?}", plan.state_writes)
        };
        assert_eq!(g.nodes[node].outputs, [ValueId::new(3)], "{body}");
        assert_eq!((plan.state_values[ValueId::new(3)], plan.slots[ValueId::new(3)]), (Some(0), None), "{body}");
    }
    // The old value read after the elementwise update: the copy stays.
    let g = state_graph("  %3: f32[4, 2] = mul(%2, %0)\n  %4: f32[4, 2] = neg(%2)", "  output %4 \"y\"", "%3");
    let plan = plan_memory(&g, &in_place()).unwrap();
    check_plan(&g, &plan).unwrap();
    assert_eq!(plan.state_writes, [None]);
}

/// `MemoryOptions::row_prologues` (native code): the operands of an add
/// feeding a layer norm stay live through the norm, so the norm's result
/// never takes their slots (a row function computing the add reads them
/// while it writes); without it the planner reuses a dead operand's slot.
#[test]
fn row_prologues_keep_the_operands_of_a_norms_input_live() {
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[4, 64]));
    let a = push(&mut g, Op::Unary(UnaryOp::Relu), vec![x], &[4, 64]);
    let b = push(&mut g, Op::Unary(UnaryOp::Neg), vec![x], &[4, 64]);
    let s = push(&mut g, Op::Binary(BinaryOp::Add), vec![a, b], &[4, 64]);
    let y = push(&mut g, Op::LayerNorm { normalized_rank: 1, eps: 1e-5 }, vec![s], &[4, 64]);
    g.add_output("y", y);
    let overlaps = |p: &kiln_passes::MemoryPlan, u: ValueId, v: ValueId| {
        let (su, sv) = (p.slots[u].unwrap(), p.slots[v].unwrap());
        su.offset < sv.offset + sv.size && sv.offset < su.offset + su.size
    };
    let plain = plan_memory(&g, &MemoryOptions::default()).unwrap();
    check_plan(&g, &plain).unwrap();
    assert!(overlaps(&plain, y, a) || overlaps(&plain, y, b), "the planner no longer reuses a dead slot here");
    let kept = plan_memory(&g, &MemoryOptions { row_prologues: true, ..MemoryOptions::default() }).unwrap();
    check_plan(&g, &kept).unwrap();
    for v in [x, a, b] {
        assert!(!overlaps(&kept, y, v), "the norm's result shares a slot with an operand of its input's add");
    }
}

/// `MemoryOptions::row_epilogues` (native code): the operands of a layer
/// norm (and of the add computing its input) stay live through the add
/// reading the norm's result, so the add's result never takes their slots
/// (a row function computing the add as its epilogue reads them while it
/// writes); without it the planner reuses a dead operand's slot.
#[test]
fn row_epilogues_keep_the_operands_of_a_norm_live_through_its_epilogue() {
    let mut g = Graph::new();
    let x = g.add_input("x", f32_ty(&[4, 64]));
    let a = push(&mut g, Op::Unary(UnaryOp::Relu), vec![x], &[4, 64]);
    let b = push(&mut g, Op::Unary(UnaryOp::Neg), vec![x], &[4, 64]);
    let s = push(&mut g, Op::Binary(BinaryOp::Add), vec![a, b], &[4, 64]);
    let y = push(&mut g, Op::LayerNorm { normalized_rank: 1, eps: 1e-5 }, vec![s], &[4, 64]);
    let z = push(&mut g, Op::Binary(BinaryOp::Mul), vec![y, x], &[4, 64]);
    g.add_output("z", z);
    let overlaps = |p: &kiln_passes::MemoryPlan, u: ValueId, v: ValueId| {
        let (su, sv) = (p.slots[u].unwrap(), p.slots[v].unwrap());
        su.offset < sv.offset + sv.size && sv.offset < su.offset + su.size
    };
    let prologues = MemoryOptions { row_prologues: true, ..MemoryOptions::default() };
    let plain = plan_memory(&g, &prologues).unwrap();
    check_plan(&g, &plain).unwrap();
    assert!([a, b, s].iter().any(|&v| overlaps(&plain, z, v)), "the planner no longer reuses a dead slot here");
    let kept = plan_memory(&g, &MemoryOptions { row_epilogues: true, ..prologues }).unwrap();
    check_plan(&g, &kept).unwrap();
    for v in [x, a, b, s, y] {
        assert!(!overlaps(&kept, z, v), "the epilogue's result shares a slot with an operand of its row function");
    }
}
