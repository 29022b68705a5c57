//! Large constants inside loop regions become loop operands.
//!
//! The emitter writes a region's constants inline (`dense<…>`), which for a
//! weight used inside a `while_loop` body would put its bytes in the
//! StableHLO text, compiled into every executable and never shared with the
//! weights section. [`hoist_loop_constants`] moves every constant of more
//! than `max_inline` elements out of the regions: it becomes a constant of
//! the enclosing graph passed as a read-only loop operand (an input of both
//! regions, which take every operand), so the segment takes it as a weight
//! argument, uploaded once. Nested loops hoist level by level to the top.

use kiln_ir::{ConstBytes, Graph, Op, TensorType, ValueId};

/// Hoists the large constants of every loop region of `g` (see the module
/// doc); returns how many constants moved into `g` itself.
pub fn hoist_loop_constants(g: &mut Graph, max_inline: usize) -> usize {
    let loops: Vec<_> = g.order.iter().copied().filter(|&n| matches!(g.nodes[n].op, Op::While { .. })).collect();
    let mut moved = 0;
    for n in loops {
        let Op::While { cond, body, .. } = &mut g.nodes[n].op else { continue };
        hoist_loop_constants(&mut cond.0, max_inline);
        hoist_loop_constants(&mut body.0, max_inline);
        let large: Vec<(usize, ValueId, TensorType, ConstBytes, Option<String>)> = [&*cond.0, &*body.0]
            .into_iter()
            .enumerate()
            .flat_map(|(r, region)| {
                let used = region.use_counts();
                region
                    .consts
                    .iter()
                    .filter(move |(_, c)| used[c.value] > 0)
                    .filter(move |(_, c)| {
                        region.ty(c.value).static_shape().is_some_and(|s| s.iter().product::<i64>() > max_inline as i64)
                    })
                    .map(move |(_, c)| {
                        let v = c.value;
                        (r, v, region.ty(v).clone(), c.bytes.clone(), region.values[v].name.clone())
                    })
            })
            .collect();
        for (r, v, ty, bytes, name) in large {
            let label = name.clone().unwrap_or_else(|| format!("loop_const_{moved}"));
            let Op::While { cond, body, .. } = &mut g.nodes[n].op else { continue };
            for (k, region) in [&mut cond.0, &mut body.0].into_iter().enumerate() {
                let input = region.add_input(label.clone(), ty.clone());
                if k == r {
                    region.replace_all_uses(v, input);
                }
            }
            let outer = g.add_const(name, ty, bytes);
            g.nodes[n].inputs.push(outer);
            moved += 1;
        }
    }
    moved
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_body_constant_becomes_a_loop_operand() {
        let text = include_str!("../../tests/compiler/stablehlo_support/loop_weight.kir");
        let mut g = kiln_ir::text::parse(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(hoist_loop_constants(&mut g, 64), 1);
        kiln_ir::verify::verify(&g).unwrap_or_else(|e| panic!("{e}"));
        let Some(Op::While { cond, body, .. }) = g.order.iter().map(|&n| &g.nodes[n].op).next() else {
            panic!("no loop")
        };
        let n = g.order[0];
        assert_eq!(g.nodes[n].inputs.len(), 4);
        assert_eq!((cond.inputs.len(), body.inputs.len()), (4, 4));
        // Only the small constant stays in the body; the large one is the
        // top graph's constant now.
        let body_consts: Vec<usize> =
            body.consts.iter().filter(|(_, c)| body.use_counts()[c.value] > 0).map(|(_, c)| c.bytes.len()).collect();
        assert_eq!(body_consts, vec![8]);
        assert!(g.const_of(*g.nodes[n].inputs.last().unwrap()).is_some_and(|c| c.bytes.len() == 320));
    }
}
