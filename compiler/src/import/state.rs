//! Buffers the program mutates become session state (`kiln_ir::StateSlot`),
//! and a program writing into its input is refused.
//!
//! Both IR flavours say it differently. Core ATen lists `buffer_mutation`
//! outputs: the value a buffer holds after the call. Training IR keeps the
//! in-place ops (`add_`, `index_copy_`, `copy_` into the buffer), which the
//! importer functionalises by rebinding the buffer's name: a buffer whose
//! name ends the conversion bound to another value was mutated. Either way
//! the buffer, bound as a constant while the nodes were converted, becomes a
//! graph input (its current value, kept by the session) and its new value a
//! graph output; the constant's bytes are the state's initial value.
//! Parameters and buffers never written stay constants (shared weights).
//!
//! A user input written in place (`user_input_mutation`, or an in-place op
//! on an input placeholder in training IR) would be a write the caller cannot
//! see: it is reported as unsupported, naming the input.

use super::error::Problem;
use super::importer::Importer;
use crate::pt2::program::OutputSpec;
use kiln_ir::{StateSlot, ValueAttrs, ValueId};

/// A parameter, buffer or lifted constant bound as a constant, or a user
/// input, with the value its name was first bound to.
pub(crate) struct Bound {
    /// The program's placeholder name (`b_count`).
    pub arg: String,
    /// Fully-qualified name (`count`); the input's name for user inputs.
    pub fqn: String,
    pub value: ValueId,
}

impl Importer<'_> {
    /// Whether program name `name` is a parameter, buffer, constant or user
    /// input placeholder: storage whose value after the call is observable
    /// (state, or a write into an input), so writes through its aliases
    /// must reach it.
    pub(crate) fn is_module_storage(&self, name: &str) -> bool {
        self.scope.prefix.is_empty()
            && self.weight_bindings.iter().chain(&self.user_input_bindings).any(|b| b.arg == name)
    }

    /// After every node was converted: turns mutated buffers into state
    /// slots and reports inputs written in place.
    pub(crate) fn bind_state(&mut self) {
        let program = &self.file.program;
        // (fqn, new value), in the program's order.
        let mut updates: Vec<(String, ValueId)> = Vec::new();
        for spec in &program.output_specs {
            let OutputSpec::Other { kind, arg, target } = spec else { continue };
            match kind.as_str() {
                "buffer_mutation" => match self.scope.env.get(arg) {
                    Some(&v) => updates.push((target.clone(), v)),
                    None => self.state_problem(target, format!("its new value `{arg}` is not produced by any node")),
                },
                "user_input_mutation" => self.input_written(target),
                _ => {}
            }
        }
        // Training IR: in-place writes rebound the buffer's name.
        let weights = std::mem::take(&mut self.weight_bindings);
        for b in &weights {
            let now = self.scope.env.get(&b.arg).copied();
            if now.is_some_and(|v| v != b.value) && !updates.iter().any(|(fqn, _)| *fqn == b.fqn) {
                updates.push((b.fqn.clone(), now.unwrap_or(b.value)));
            }
        }
        let inputs = std::mem::take(&mut self.user_input_bindings);
        for b in &inputs {
            if self.scope.env.get(&b.arg).is_some_and(|&v| v != b.value) {
                self.input_written(&b.fqn);
            }
        }
        for (fqn, update) in updates {
            match weights.iter().find(|b| b.fqn == fqn) {
                Some(b) => self.make_state(b, update),
                None => self.state_problem(&fqn, "it is not a parameter or buffer of the program".into()),
            }
        }
    }

    /// Buffer `b`, a constant so far, becomes state: a graph input read
    /// wherever the constant was, and `update` its next value.
    fn make_state(&mut self, b: &Bound, update: ValueId) {
        let Some(init) = self.g.const_of(b.value).map(|c| c.bytes.clone()) else {
            // A weight that failed to load is a stand-in input, already reported.
            return;
        };
        let ty = self.g.ty(b.value).clone();
        let current = self.g.add_input(b.fqn.clone(), ty);
        self.g.values[current].attrs = ValueAttrs::with_origin(b.fqn.clone());
        self.g.replace_all_uses(b.value, current);
        let update = if update == b.value { current } else { update };
        let output = self.g.outputs.len();
        self.g.add_output(format!("state {}", b.fqn), update);
        let input = self.g.inputs.len() - 1;
        self.g.states.push(StateSlot { name: b.fqn.clone(), input, output, init });
    }

    fn input_written(&mut self, input: &str) {
        self.problems.push(Problem {
            what: "user input mutation".into(),
            node: input.to_string(),
            at: None,
            reason: Some(format!(
                "the program writes into its input `{input}` in place; kiln does not make that write visible to \
                 the caller, so it refuses the program (write to a copy, or return the new value)"
            )),
        });
    }

    fn state_problem(&mut self, buffer: &str, reason: String) {
        self.problems.push(Problem {
            what: "buffer mutation".into(),
            node: buffer.to_string(),
            at: None,
            reason: Some(reason),
        });
    }
}
