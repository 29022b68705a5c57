//! Compaction: a copy of the graph holding only what is live.
//!
//! Passes delete by leaving the schedule and never free arena slots, so ids stay
//! valid while they run. Once they are done, [`compact`] renumbers into fresh
//! arenas without dead nodes, unused constants or their values — what the artifact
//! writer and the filetests' printed expectations want to see. Names and value
//! attributes go along with each value.

use crate::{live_consts, verify_graph};
use kiln_ir::{Graph, Op, Region, SecondaryMap, ValueId};

pub fn compact(g: &Graph) -> Result<Graph, String> {
    verify_graph(g)?;
    // Inputs and outputs keep their positions, so the state slots stay valid.
    let mut new = Graph {
        symbols: g.symbols.clone(),
        locs: g.locs.clone(),
        states: g.states.clone(),
        mesh: g.mesh.clone(),
        complex_inputs: g.complex_inputs.clone(),
        complex_outputs: g.complex_outputs.clone(),
        ..Graph::default()
    };
    let mut map: SecondaryMap<ValueId, Option<ValueId>> = SecondaryMap::new();
    // Every operand was checked to be defined before its use, so lookups succeed.
    let lookup =
        |map: &SecondaryMap<ValueId, Option<ValueId>>, v: ValueId| map[v].ok_or_else(|| format!("{v} is not defined"));
    for &v in &g.inputs {
        let nv = new.add_input(String::new(), g.ty(v).clone());
        new.values[nv].name = g.values[v].name.clone();
        new.values[nv].attrs = g.values[v].attrs.clone();
        map[v] = Some(nv);
    }
    for c in live_consts(g) {
        let data = &g.consts[c];
        let v = data.value;
        let nv = new.add_const(g.values[v].name.clone(), g.ty(v).clone(), data.bytes.clone());
        new.values[nv].attrs = g.values[v].attrs.clone();
        map[v] = Some(nv);
    }
    for &n in &g.order {
        let node = &g.nodes[n];
        let inputs = node.inputs.iter().map(|&v| lookup(&map, v)).collect::<Result<Vec<_>, _>>()?;
        let types = node.outputs.iter().map(|&v| g.ty(v).clone()).collect();
        let op = match &node.op {
            // A loop's nested graphs are compacted too.
            Op::While { carried, cond, body } => {
                Op::While { carried: *carried, cond: Region::new(compact(cond)?), body: Region::new(compact(body)?) }
            }
            op => op.clone(),
        };
        let nn = new.add_node(op, inputs, types, node.loc);
        for (&old, &nv) in node.outputs.iter().zip(&new.nodes[nn].outputs.clone()) {
            new.values[nv].name = g.values[old].name.clone();
            new.values[nv].attrs = g.values[old].attrs.clone();
            map[old] = Some(nv);
        }
    }
    for (&o, name) in g.outputs.iter().zip(&g.output_names) {
        new.add_output(name.clone(), lookup(&map, o)?);
    }
    Ok(new)
}
