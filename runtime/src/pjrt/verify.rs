//! The collective verifier: every collective of a StableHLO module checked
//! before the module reaches a plugin. A wrong collective mode is not caught
//! by the XLA CPU plugin's compiler: it aborts the process at execute
//! (`../shared/notes/sharding-pjrt.md`, E26 and E27), so kiln refuses such a
//! module with an error naming the op — at compile time (the StableHLO
//! emitter runs it on every module) and again in the runtime before the
//! plugin compiles a segment (an artifact kiln did not write, or edited).
//! It lives in the runtime, which the compiler depends on, and needs nothing
//! but the text.
//!
//! It reads the module's text (MLIR's generic form, as kiln's emitter prints
//! it), so it checks exactly what the plugin is given, manual regions
//! included. Rules, for `stablehlo.all_reduce`, `all_gather`,
//! `reduce_scatter`, `all_to_all` and `collective_permute`:
//!
//! - **mode**: with several partitions (kiln's SPMD programs) a collective
//!   must carry a `channel_handle` (handle > 0, type 1 = device to device);
//!   with one partition and several replicas `collective_permute` must not
//!   (a channel means cross-partition), nor may another collective carry a
//!   channel without `use_global_device_ids`.
//! - **groups**: `replica_groups` non-empty, every group the same size, every
//!   device of the mode's id space (flattened replica × partition ids,
//!   partitions or replicas) exactly once.
//! - **pairs**: `source_target_pairs` within the devices, no source and no
//!   target twice.
//! - **reductions**: the body of `all_reduce`/`reduce_scatter` takes two
//!   scalars of the operand's element type and returns one of add,
//!   multiply, maximum, minimum, and, or of them.
//! - **shapes**: the dimension attributes in range; `all_to_all`'s split
//!   dimension divisible by `split_count` = the group size, `all_gather`,
//!   `reduce_scatter`, `all_to_all` and `collective_permute` results the
//!   shapes those imply; one operand and one result each (kiln's form: a
//!   variadic collective is refused, not passed unchecked).

/// The collectives the verifier knows; any other `stablehlo` op whose name
/// says it communicates is refused rather than passed unchecked.
const COLLECTIVES: &[&str] = &["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute"];
const UNCHECKED: &[&str] = &["collective_broadcast", "send", "recv", "cross-replica-sum"];

/// How a module will be compiled: its replica and partition counts.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Devices {
    pub replicas: u32,
    pub partitions: u32,
}

/// Checks every collective of `module` (MLIR generic text) for a program
/// compiled over `devices`. The error lists every violation, one per line,
/// each naming the op (its name, its result and its line).
pub fn verify_collectives(module: &str, devices: Devices) -> Result<(), String> {
    if devices.replicas == 0 || devices.partitions == 0 {
        return Err(format!(
            "a module compiled for {} replicas and {} partitions (both must be at least 1)",
            devices.replicas, devices.partitions
        ));
    }
    let mut problems = Vec::new();
    let mut from = 0;
    while let Some(found) = module[from..].find("\"stablehlo.") {
        let start = from + found;
        let name_end = module[start + 1..].find('"').map_or(module.len(), |e| start + 1 + e);
        let name = &module[start + 1 + "stablehlo.".len()..name_end];
        from = name_end + 1;
        if !COLLECTIVES.contains(&name) && !UNCHECKED.contains(&name) {
            continue;
        }
        let line = module[..start].matches('\n').count() + 1;
        let result = result_name(&module[..start]);
        let what = format!("`stablehlo.{name}`{result} (line {line})");
        if UNCHECKED.contains(&name) {
            problems.push(format!("{what}: the verifier does not check this collective; kiln does not emit it"));
            continue;
        }
        match parse_op(&module[name_end + 1..]) {
            Ok(op) => {
                for p in check_op(name, &op, devices) {
                    problems.push(format!("{what}: {p}"));
                }
            }
            Err(e) => problems.push(format!("{what}: cannot read the op: {e}")),
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("collective verifier: {}", problems.join("\n  ")))
    }
}

/// ` %5` for `%5 = "stablehlo…"`, or nothing.
fn result_name(before: &str) -> String {
    let line = before.rsplit('\n').next().unwrap_or("");
    match line.trim().strip_suffix('=') {
        Some(r) if r.trim().starts_with('%') => format!(" {}", r.trim()),
        _ => String::new(),
    }
}

/// One collective op as text: its region (the reduction body), attributes,
/// operand and result types.
#[derive(Debug, Default)]
struct OpText {
    region: Option<String>,
    attrs: Vec<(String, String)>,
    operands: Vec<TensorType>,
    results: Vec<TensorType>,
}

#[derive(Clone, Debug, PartialEq)]
struct TensorType {
    shape: Vec<i64>,
    elem: String,
}

/// Parses `(%operands) ({region})? {attrs} : (types) -> type(s)` at the
/// start of `s` (right after the quoted op name).
fn parse_op(s: &str) -> Result<OpText, String> {
    let mut op = OpText::default();
    let mut rest = s.trim_start();
    if !rest.starts_with('(') {
        return Err("no operand list".into());
    }
    rest = rest[matching(rest)? + 1..].trim_start();
    if rest.starts_with("({") {
        let end = matching(rest)?;
        op.region = Some(rest[1..end].to_string());
        rest = rest[end + 1..].trim_start();
    }
    if rest.starts_with('{') {
        let end = matching(rest)?;
        op.attrs = split_top(&rest[1..end])
            .into_iter()
            .map(|item| match item.split_once('=') {
                Some((k, v)) => (k.trim().to_string(), v.trim().to_string()),
                None => (item.trim().to_string(), String::new()),
            })
            .collect();
        rest = rest[end + 1..].trim_start();
    }
    let rest = rest.strip_prefix(':').ok_or("no type signature")?.trim_start();
    if !rest.starts_with('(') {
        return Err("no operand types".into());
    }
    let end = matching(rest)?;
    op.operands = split_top(&rest[1..end]).iter().map(|t| tensor_type(t)).collect::<Result<_, _>>()?;
    let results = rest[end + 1..].trim_start().strip_prefix("->").ok_or("no result types")?.trim_start();
    op.results = if results.starts_with('(') {
        let end = matching(results)?;
        split_top(&results[1..end]).iter().map(|t| tensor_type(t)).collect::<Result<_, _>>()?
    } else {
        let end = results.find('>').ok_or("unterminated result type")?;
        vec![tensor_type(&results[..=end])?]
    };
    Ok(op)
}

/// The index of the bracket closing the one `s` starts with (quotes and
/// every bracket kind nest).
fn matching(s: &str) -> Result<usize, String> {
    let mut depth = 0i32;
    let mut quoted = false;
    let mut prev = ' ';
    for (i, c) in s.char_indices() {
        if quoted {
            if c == '"' && prev != '\\' {
                quoted = false;
            }
        } else {
            match c {
                '"' => quoted = true,
                '(' | '[' | '{' | '<' => depth += 1,
                ')' | ']' | '}' => depth -= 1,
                // `->` is an arrow, not a bracket.
                '>' if prev != '-' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                return Ok(i);
            }
        }
        prev = c;
    }
    Err("unbalanced brackets".into())
}

/// `s` split at its top-level commas.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut depth, mut quoted, mut prev, mut cur) = (0i32, false, ' ', String::new());
    for c in s.chars() {
        if quoted {
            quoted = !(c == '"' && prev != '\\');
        } else {
            match c {
                '"' => quoted = true,
                '(' | '[' | '{' | '<' => depth += 1,
                ')' | ']' | '}' => depth -= 1,
                '>' if prev != '-' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(std::mem::take(&mut cur).trim().to_string());
                    prev = c;
                    continue;
                }
                _ => {}
            }
        }
        cur.push(c);
        prev = c;
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// `tensor<8x16xf32>`, `tensor<f32>`.
fn tensor_type(t: &str) -> Result<TensorType, String> {
    let body = t
        .trim()
        .strip_prefix("tensor<")
        .and_then(|b| b.strip_suffix('>'))
        .ok_or(format!("`{t}` is not a tensor type"))?;
    let mut parts: Vec<&str> = body.split('x').collect();
    let elem = parts.pop().unwrap_or_default().to_string();
    let shape = parts
        .iter()
        .map(|d| d.parse::<i64>().map_err(|_| format!("`{t}` has a dynamic or bad dim")))
        .collect::<Result<_, _>>()?;
    Ok(TensorType { shape, elem })
}

/// `dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>` (or a splat) as rows.
fn dense_rows(text: &str) -> Result<Vec<Vec<i64>>, String> {
    let (value, ty) = text.split_once(':').ok_or(format!("`{text}` has no type"))?;
    let ty = tensor_type(ty)?;
    let [rows, cols] = ty.shape[..] else { return Err(format!("`{text}` is not a 2-d table")) };
    let inner = value
        .trim()
        .strip_prefix("dense<")
        .and_then(|v| v.strip_suffix('>'))
        .ok_or(format!("`{text}` is not dense"))?;
    let numbers: Vec<i64> = inner
        .split(['[', ']', ','])
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| n.parse::<i64>().map_err(|_| format!("`{n}` in `{text}` is not an integer")))
        .collect::<Result<_, _>>()?;
    let numbers =
        if numbers.len() == 1 && rows * cols != 1 { vec![numbers[0]; (rows * cols) as usize] } else { numbers };
    if numbers.len() as i64 != rows * cols {
        return Err(format!("`{text}` holds {} numbers, its type {}", numbers.len(), rows * cols));
    }
    Ok(numbers.chunks(cols.max(1) as usize).map(<[i64]>::to_vec).take(rows as usize).collect())
}

fn attr<'o>(op: &'o OpText, key: &str) -> Option<&'o str> {
    op.attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// `3 : i64` → 3.
fn int_attr(op: &OpText, key: &str) -> Result<i64, String> {
    let v = attr(op, key).ok_or(format!("no `{key}`"))?;
    v.split(':').next().unwrap_or("").trim().parse().map_err(|_| format!("`{key} = {v}` is not an integer"))
}

/// The id space a collective's groups or pairs name, and its size.
fn id_space(name: &str, op: &OpText, d: Devices, problems: &mut Vec<String>) -> (&'static str, i64) {
    let channel = attr(op, "channel_handle");
    let global = attr(op, "use_global_device_ids").is_some();
    if let Some(ch) = channel {
        let field = |f: &str| {
            ch.split(['<', ',', '>'])
                .filter_map(|kv| kv.split_once('='))
                .find(|(k, _)| k.trim() == f)
                .and_then(|(_, v)| v.trim().parse::<i64>().ok())
        };
        match (field("handle"), field("type")) {
            (Some(h), Some(1)) if h > 0 => {}
            _ => problems.push(format!("channel handle `{ch}` must have handle > 0 and type = 1 (device to device)")),
        }
    }
    if d.partitions > 1 && channel.is_none() {
        problems.push(format!(
            "no channel_handle in a program over {} partitions: the op would run cross-replica (the plugin aborts at execute)",
            d.partitions
        ));
    }
    if d.partitions == 1 && d.replicas > 1 && channel.is_some() {
        if name == "collective_permute" {
            problems.push(format!(
                "a channel_handle over {} replicas and one partition makes the permute cross-partition (the plugin aborts at execute)",
                d.replicas
            ));
        } else if !global {
            problems.push(
                "a channel_handle without use_global_device_ids over one partition groups partitions of one".into(),
            );
        }
    }
    if global && channel.is_none() {
        problems.push("use_global_device_ids needs a channel_handle".into());
    }
    match (channel.is_some(), global) {
        (true, true) => ("flattened device", i64::from(d.replicas) * i64::from(d.partitions)),
        (true, false) => ("partition", i64::from(d.partitions)),
        _ => ("replica", i64::from(d.replicas)),
    }
}

/// The checked group size, or `None` when the groups are wrong.
fn check_groups(op: &OpText, kind: &str, n: i64, problems: &mut Vec<String>) -> Option<i64> {
    let Some(text) = attr(op, "replica_groups") else {
        problems.push("no replica_groups".into());
        return None;
    };
    let groups = match dense_rows(text) {
        Ok(g) => g,
        Err(e) => {
            problems.push(format!("replica_groups: {e}"));
            return None;
        }
    };
    let before = problems.len();
    let size = groups.first().map_or(0, Vec::len);
    if groups.is_empty() || size == 0 {
        problems.push("replica_groups is empty".into());
        return None;
    }
    if groups.iter().any(|g| g.len() != size) {
        problems.push(format!("replica groups of different sizes {groups:?}"));
    }
    let mut seen = vec![0u32; n.max(0) as usize];
    for &id in groups.iter().flatten() {
        match seen.get_mut(id as usize).filter(|_| id >= 0) {
            Some(count) => *count += 1,
            None => problems.push(format!("{kind} id {id} in replica_groups is outside 0..{n}")),
        }
    }
    let twice: Vec<usize> = (0..seen.len()).filter(|&i| seen[i] > 1).collect();
    let missing: Vec<usize> = (0..seen.len()).filter(|&i| seen[i] == 0).collect();
    if !twice.is_empty() {
        problems.push(format!("{kind} ids {twice:?} appear in replica_groups more than once"));
    }
    if !missing.is_empty() {
        problems.push(format!("{kind} ids {missing:?} appear in no replica group (every one of 0..{n} must, once)"));
    }
    (problems.len() == before).then_some(size as i64)
}

/// The reduction body: two scalar arguments of `elem`, one combiner of both,
/// returned.
fn check_reduction(op: &OpText, elem: &str) -> Result<(), String> {
    let region = op.region.as_deref().ok_or("no reduction body")?;
    let args_at = region.find("^bb0(").ok_or("the reduction body has no block arguments")?;
    let args_text = &region[args_at + 4..];
    let args_end = matching(args_text)?;
    let args: Vec<(String, String)> = split_top(&args_text[1..args_end])
        .iter()
        .filter_map(|a| a.split_once(':').map(|(n, t)| (n.trim().to_string(), t.trim().to_string())))
        .collect();
    let scalar = format!("tensor<{elem}>");
    if args.len() != 2 || args.iter().any(|(_, t)| *t != scalar) {
        return Err(format!("the reduction body must take two {scalar} arguments, it takes {args:?}"));
    }
    let body = &args_text[args_end + 1..];
    let ops: Vec<&str> =
        body.lines().map(str::trim).filter(|l| l.contains("\"stablehlo.") || l.contains("\"func.")).collect();
    let [combine, ret] = ops[..] else {
        return Err(format!("the reduction body must be one combining op and a return, it has {} ops", ops.len()));
    };
    let (result, rhs) = combine.split_once('=').ok_or("the combining op has no result")?;
    let name = rhs.trim().split('"').nth(1).unwrap_or("");
    const COMBINERS: &[&str] = &[
        "stablehlo.add",
        "stablehlo.multiply",
        "stablehlo.maximum",
        "stablehlo.minimum",
        "stablehlo.and",
        "stablehlo.or",
    ];
    if !COMBINERS.contains(&name) {
        return Err(format!("the reduction body combines with `{name}`, not one of {COMBINERS:?}"));
    }
    let operands_at = rhs.find("\"(").ok_or("the combining op has no operands")? + 1;
    let operands = &rhs[operands_at..];
    let operands: Vec<String> = split_top(&operands[1..matching(operands)?]);
    let mut want: Vec<&str> = args.iter().map(|(n, _)| n.as_str()).collect();
    let mut got: Vec<&str> = operands.iter().map(String::as_str).collect();
    want.sort_unstable();
    got.sort_unstable();
    if want != got {
        return Err(format!("`{name}` in the reduction body must combine both arguments {want:?}, it takes {got:?}"));
    }
    let returned = ret.split_once("\"(").and_then(|(_, r)| r.split(')').next()).unwrap_or("");
    if !ret.contains("stablehlo.return") || returned.trim() != result.trim() {
        return Err(format!("the reduction body must return `{}`", result.trim()));
    }
    Ok(())
}

fn check_op(name: &str, op: &OpText, d: Devices) -> Vec<String> {
    let mut problems = Vec::new();
    let (kind, n) = id_space(name, op, d, &mut problems);
    // StableHLO gives these two no flattened-id mode: their ids are
    // partitions (with a channel) or replicas.
    if matches!(name, "all_to_all" | "collective_permute") && attr(op, "use_global_device_ids").is_some() {
        problems.push(format!("{name} takes no use_global_device_ids"));
    }
    let (Some(x), Some(y)) = (op.operands.first(), op.results.first()) else {
        return vec!["a collective takes one operand and returns one result".into()];
    };
    if op.operands.len() != 1 || op.results.len() != 1 {
        problems.push(format!(
            "{} operands and {} results (kiln emits one of each)",
            op.operands.len(),
            op.results.len()
        ));
    }
    if x.elem != y.elem {
        problems.push(format!("operand element type {} but result {}", x.elem, y.elem));
    }
    let rank = x.shape.len() as i64;
    let dim = |key: &str, problems: &mut Vec<String>| -> Option<usize> {
        match int_attr(op, key) {
            Ok(v) if (0..rank).contains(&v) => Some(v as usize),
            Ok(v) => {
                problems.push(format!("{key} {v} is outside the operand's {rank} dims"));
                None
            }
            Err(e) => {
                problems.push(e);
                None
            }
        }
    };
    let expect = |shape: Vec<i64>, problems: &mut Vec<String>| {
        if y.shape != shape {
            problems.push(format!("result shape {:?}, expected {shape:?} from operand {:?}", y.shape, x.shape));
        }
    };
    if name == "collective_permute" {
        match attr(op, "source_target_pairs").map(dense_rows) {
            None => problems.push("no source_target_pairs".into()),
            Some(Err(e)) => problems.push(format!("source_target_pairs: {e}")),
            Some(Ok(pairs)) => {
                let (mut sources, mut targets) = (Vec::new(), Vec::new());
                for p in &pairs {
                    let &[s, t] = &p[..] else {
                        problems.push(format!("pair {p:?} is not [source, target]"));
                        continue;
                    };
                    for id in [s, t] {
                        if !(0..n).contains(&id) {
                            problems.push(format!("{kind} id {id} in source_target_pairs is outside 0..{n}"));
                        }
                    }
                    if sources.contains(&s) {
                        problems.push(format!("source {s} appears twice in source_target_pairs"));
                    }
                    if targets.contains(&t) {
                        problems.push(format!("target {t} appears twice in source_target_pairs"));
                    }
                    sources.push(s);
                    targets.push(t);
                }
            }
        }
        expect(x.shape.clone(), &mut problems);
        return problems;
    }
    let group = check_groups(op, kind, n, &mut problems);
    match name {
        "all_reduce" | "reduce_scatter" => {
            if let Err(e) = check_reduction(op, &x.elem) {
                problems.push(e);
            }
            if name == "all_reduce" {
                expect(x.shape.clone(), &mut problems);
            } else if let (Some(dm), Some(g)) = (dim("scatter_dimension", &mut problems), group) {
                if x.shape[dm] % g != 0 {
                    problems.push(format!(
                        "scatter dimension {dm} of size {} is not divisible by the group size {g}",
                        x.shape[dm]
                    ));
                } else {
                    let mut s = x.shape.clone();
                    s[dm] /= g;
                    expect(s, &mut problems);
                }
            }
        }
        "all_gather" => {
            if let (Some(dm), Some(g)) = (dim("all_gather_dim", &mut problems), group) {
                let mut s = x.shape.clone();
                s[dm] *= g;
                expect(s, &mut problems);
            }
        }
        "all_to_all" => {
            let (split, concat) = (dim("split_dimension", &mut problems), dim("concat_dimension", &mut problems));
            let count = int_attr(op, "split_count");
            if let Err(e) = &count {
                problems.push(e.clone());
            }
            if let (Some(sd), Some(cd), Ok(c), Some(g)) = (split, concat, count, group) {
                if c != g {
                    problems.push(format!("split_count {c} differs from the group size {g}"));
                } else if c <= 0 || x.shape[sd] % c != 0 {
                    problems.push(format!(
                        "split dimension {sd} of size {} is not divisible by split_count {c}",
                        x.shape[sd]
                    ));
                } else {
                    let mut s = x.shape.clone();
                    s[sd] /= c;
                    s[cd] *= c;
                    expect(s, &mut problems);
                }
            }
        }
        _ => {}
    }
    problems
}

#[cfg(test)]
mod tests;
