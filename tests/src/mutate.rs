//! Structural mutations of `.pt2` files, for the importer's robustness test
//! (`tests/tests/import_mutations.rs`) and its fuzz target (`compiler/fuzz`).
//!
//! A [`Pt2Parts`] is a `.pt2` read into its members. [`mutate`] applies a
//! seeded, deterministic sequence of mutations to the program JSON
//! (`models/model.json`), the storage configs (`model_weights_config.json`,
//! `model_constants_config.json`) and, rarely, the storage files themselves —
//! numbers made huge, negative or zero, values replaced by another type, keys
//! deleted, lists truncated or reordered, names and op targets swapped for
//! others of the same file, sizes/strides/offsets/dtypes changed — and re-zips
//! the result the way `torch.export.save` does ([`write_stored_zip`]: stored
//! entries, every payload 64-byte aligned). [`compile_bytes`] runs what the
//! CLI runs on such a file: import, the pass pipeline, memory planning,
//! lowering, and loading of the artifact.

use serde_json::{Map, Number, Value};
use std::path::Path;

/// A `.pt2` as its members (names relative to the root folder).
#[derive(Clone, Debug)]
pub struct Pt2Parts {
    pub root: String,
    pub members: Vec<Member>,
}

#[derive(Clone, Debug)]
pub struct Member {
    pub name: String,
    pub content: Content,
}

/// JSON members are kept parsed, so that mutations are structural.
#[derive(Clone, Debug)]
pub enum Content {
    Json(Value),
    Bytes(Vec<u8>),
}

impl Pt2Parts {
    /// Reads every member of a `.pt2` file.
    pub fn read(path: &Path) -> Result<Pt2Parts, String> {
        let archive =
            kiln_compiler::pt2::archive::Archive::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut members = Vec::new();
        for (name, bytes) in archive.members() {
            let content = match name.ends_with(".json").then(|| serde_json::from_slice::<Value>(bytes)) {
                Some(Ok(v)) => Content::Json(v),
                _ => Content::Bytes(bytes.to_vec()),
            };
            members.push(Member { name: name.to_string(), content });
        }
        Ok(Pt2Parts { root: archive.root().to_string(), members })
    }

    /// The program JSON (`models/model.json`), for hand-made edits.
    pub fn program_mut(&mut self) -> Option<&mut Value> {
        self.members.iter_mut().find(|m| m.name == kiln_compiler::pt2::MODEL_JSON).and_then(|m| match &mut m.content {
            Content::Json(v) => Some(v),
            Content::Bytes(_) => None,
        })
    }

    /// The archive's bytes: every member stored, 64-byte aligned.
    pub fn to_zip(&self) -> Vec<u8> {
        let entries: Vec<(String, Vec<u8>)> = self
            .members
            .iter()
            .map(|m| {
                let bytes = match &m.content {
                    Content::Json(v) => serde_json::to_vec(v).expect("a JSON value serialises"),
                    Content::Bytes(b) => b.clone(),
                };
                (format!("{}{}", self.root, m.name), bytes)
            })
            .collect();
        write_stored_zip(&entries)
    }
}

// ------------------------------------------------------------------ the zip

/// CRC-32 (IEEE), as zip stores it.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// A zip of stored (uncompressed) entries laid out like torch's
/// `PyTorchStreamWriter`: each local header is padded with an `FB` extra
/// field so that its payload starts at a multiple of 64, CRC and sizes are
/// zero in the local header and follow the data in a descriptor (flag bit 3),
/// and the end of the central directory has Zip64 records.
pub fn write_stored_zip(entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    fn u16le(out: &mut Vec<u8>, v: u16) {
        out.extend_from_slice(&v.to_le_bytes());
    }
    fn u32le(out: &mut Vec<u8>, v: u32) {
        out.extend_from_slice(&v.to_le_bytes());
    }
    fn u64le(out: &mut Vec<u8>, v: u64) {
        out.extend_from_slice(&v.to_le_bytes());
    }
    const FLAGS: u16 = 0x0808; // data descriptor, UTF-8 names
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data) in entries {
        let offset = out.len();
        let crc = crc32(data);
        let size = u32::try_from(data.len()).expect("fixture members are small");
        // Local header (30 bytes) + name + extra field (4-byte header + padding).
        let unpadded = offset + 30 + name.len() + 4;
        let pad = (64 - unpadded % 64) % 64;
        u32le(&mut out, 0x0403_4b50);
        u16le(&mut out, 20);
        u16le(&mut out, FLAGS);
        u16le(&mut out, 0); // stored
        u16le(&mut out, 0); // time
        u16le(&mut out, 0x21); // date: 1980-01-01
        u32le(&mut out, 0);
        u32le(&mut out, 0);
        u32le(&mut out, 0);
        u16le(&mut out, name.len() as u16);
        u16le(&mut out, (4 + pad) as u16);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"FB");
        u16le(&mut out, pad as u16);
        out.resize(out.len() + pad, b'Z');
        debug_assert_eq!(out.len() % 64, 0);
        out.extend_from_slice(data);
        u32le(&mut out, 0x0807_4b50);
        u32le(&mut out, crc);
        u32le(&mut out, size);
        u32le(&mut out, size);

        u32le(&mut central, 0x0201_4b50);
        u16le(&mut central, 20);
        u16le(&mut central, 20);
        u16le(&mut central, FLAGS);
        u16le(&mut central, 0);
        u16le(&mut central, 0);
        u16le(&mut central, 0x21);
        u32le(&mut central, crc);
        u32le(&mut central, size);
        u32le(&mut central, size);
        u16le(&mut central, name.len() as u16);
        u16le(&mut central, 0); // extra
        u16le(&mut central, 0); // comment
        u16le(&mut central, 0); // disk
        u16le(&mut central, 0); // internal attributes
        u32le(&mut central, 0); // external attributes
        u32le(&mut central, u32::try_from(offset).expect("fixtures are small"));
        central.extend_from_slice(name.as_bytes());
    }
    let cd_offset = out.len();
    out.extend_from_slice(&central);
    let zip64_eocd = out.len();
    let n = entries.len() as u64;
    // Zip64 end of central directory record.
    u32le(&mut out, 0x0606_4b50);
    u64le(&mut out, 44);
    u16le(&mut out, 45);
    u16le(&mut out, 45);
    u32le(&mut out, 0);
    u32le(&mut out, 0);
    u64le(&mut out, n);
    u64le(&mut out, n);
    u64le(&mut out, central.len() as u64);
    u64le(&mut out, cd_offset as u64);
    // Zip64 locator.
    u32le(&mut out, 0x0706_4b50);
    u32le(&mut out, 0);
    u64le(&mut out, zip64_eocd as u64);
    u32le(&mut out, 1);
    // End of central directory.
    u32le(&mut out, 0x0605_4b50);
    u16le(&mut out, 0);
    u16le(&mut out, 0);
    u16le(&mut out, n as u16);
    u16le(&mut out, n as u16);
    u32le(&mut out, central.len() as u32);
    u32le(&mut out, cd_offset as u32);
    u16le(&mut out, 0);
    out
}

// ------------------------------------------------------------ the generator

/// The mutations' choices: splitmix64 (small, fast, the same sequence on
/// every platform), optionally read first from a tape of bytes — the fuzz
/// target's input, so that libFuzzer's byte-level edits steer the
/// structural mutations.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
    tape: Vec<u8>,
    pos: usize,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed ^ 0x5DEE_CE66_D1CE_4E5B, tape: Vec::new(), pos: 0 }
    }

    /// Choices read from `tape` (8 bytes each), then from a generator seeded by it.
    pub fn from_tape(tape: &[u8]) -> Rng {
        let seed = tape.iter().fold(0u64, |h, &b| h.rotate_left(5) ^ b as u64);
        Rng { tape: tape.to_vec(), ..Rng::new(seed) }
    }

    pub fn next_u64(&mut self) -> u64 {
        if let Some(bytes) = self.tape.get(self.pos..self.pos + 8) {
            self.pos += 8;
            return u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
        }
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        (!items.is_empty()).then(|| &items[self.below(items.len())])
    }
}

// ------------------------------------------------------------ the mutations

/// One step of a path into a JSON value.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    Key(String),
    Index(usize),
}

fn show_path(path: &[Step]) -> String {
    let mut s = String::new();
    for step in path {
        match step {
            Step::Key(k) if s.is_empty() => s.push_str(k),
            Step::Key(k) => {
                s.push('.');
                s.push_str(k);
            }
            Step::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

fn get_mut<'v>(mut v: &'v mut Value, path: &[Step]) -> Option<&'v mut Value> {
    for step in path {
        v = match step {
            Step::Key(k) => v.get_mut(k.as_str())?,
            Step::Index(i) => v.get_mut(*i)?,
        };
    }
    Some(v)
}

fn get<'v>(mut v: &'v Value, path: &[Step]) -> Option<&'v Value> {
    for step in path {
        v = match step {
            Step::Key(k) => v.get(k.as_str())?,
            Step::Index(i) => v.get(*i)?,
        };
    }
    Some(v)
}

/// Keys the importer never reads: mutating them tests nothing.
const IGNORED_KEYS: [&str; 11] = [
    "kind",
    "layout",
    "device",
    "requires_grad",
    "module_call_graph",
    "is_single_tensor_return",
    "is_hop_single_tensor_return",
    "custom_obj_values",
    "sym_bool_values",
    "sym_float_values",
    "is_param",
];

/// Every path in `v`, skipping node metadata other than the stack trace
/// (module stacks and provenance strings are never read by the importer)
/// and the [`IGNORED_KEYS`].
fn collect_paths(v: &Value, path: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    out.push(path.clone());
    match v {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(Step::Index(i));
                collect_paths(item, path, out);
                path.pop();
            }
        }
        Value::Object(map) => {
            let in_metadata = matches!(path.last(), Some(Step::Key(k)) if k == "metadata");
            for (k, item) in map {
                if (in_metadata && k != "stack_trace") || IGNORED_KEYS.contains(&k.as_str()) {
                    continue;
                }
                path.push(Step::Key(k.clone()));
                collect_paths(item, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

fn last_key(path: &[Step]) -> Option<&str> {
    path.iter().rev().find_map(|s| match s {
        Step::Key(k) => Some(k.as_str()),
        Step::Index(_) => None,
    })
}

/// Whether `path` lies inside a tensor's metadata (sizes, strides, offset, dtype).
fn in_tensor_meta(path: &[Step]) -> bool {
    path.iter().any(|s| {
        matches!(s, Step::Key(k) if matches!(k.as_str(), "sizes" | "strides" | "storage_offset" | "dtype" | "tensor_meta"))
    }) || path.iter().any(|s| matches!(s, Step::Key(k) if k == "tensor_values"))
}

/// Whether `path` lies inside a node's inputs (the op's arguments).
fn in_node_inputs(path: &[Step]) -> bool {
    path.iter().any(|s| matches!(s, Step::Key(k) if k == "inputs"))
}

const UNION_TAGS: [&str; 18] = [
    "as_none",
    "as_tensor",
    "as_tensors",
    "as_int",
    "as_ints",
    "as_float",
    "as_floats",
    "as_bool",
    "as_bools",
    "as_string",
    "as_sym_int",
    "as_sym_ints",
    "as_scalar_type",
    "as_optional_tensors",
    "as_expr",
    "as_name",
    "as_graph",
    "as_sym_bool",
];

/// A number a hostile file might hold instead of `v`.
fn hostile_number(rng: &mut Rng, v: &Number) -> Value {
    let old = v.as_i64().unwrap_or(1);
    let choices: [i64; 24] = [
        0,
        1,
        -1,
        2,
        3,
        -2,
        7,
        31,
        64,
        255,
        (1 << 31) - 1,
        1 << 31,
        1 << 32,
        (1 << 53) + 1,
        1 << 62,
        i64::MAX,
        i64::MIN,
        i64::MIN + 1,
        old.wrapping_add(1),
        old.wrapping_sub(1),
        old.wrapping_neg(),
        old.wrapping_mul(1000),
        old.wrapping_mul(1 << 20),
        old / 2,
    ];
    match rng.below(30) {
        0 => Value::from(u64::MAX),
        1 => Value::from(1e300),
        2 => Value::from(-0.5),
        3 => Value::from(0.5),
        4 => Value::from(old as f64 + 0.25),
        _ => Value::from(choices[rng.below(choices.len())]),
    }
}

/// A value of some other kind than `v`.
fn other_kind(rng: &mut Rng, v: &Value) -> Value {
    let options = [
        Value::Null,
        Value::from(0),
        Value::from(-1),
        Value::from(true),
        Value::from(""),
        Value::from("x"),
        Value::Array(Vec::new()),
        Value::Array(vec![Value::from(1), Value::from(2)]),
        Value::Object(Map::new()),
        serde_json::json!({"as_int": 1}),
        serde_json::json!({"as_tensor": {"name": "x"}}),
        serde_json::json!({"as_none": true}),
    ];
    loop {
        let o = &options[rng.below(options.len())];
        if std::mem::discriminant(o) != std::mem::discriminant(v) || rng.chance(20) {
            return o.clone();
        }
    }
}

/// Applies one mutation to `doc`, returning what it did (`None` when the
/// chosen kind has nothing to act on; the caller retries).
fn mutate_json(rng: &mut Rng, doc: &mut Value) -> Option<String> {
    let mut paths = Vec::new();
    collect_paths(doc, &mut Vec::new(), &mut paths);
    let numbers: Vec<&Vec<Step>> =
        paths.iter().filter(|p| matches!(get(doc, p), Some(Value::Number(_)))).collect::<Vec<_>>();
    let kind = rng.below(100);
    let path: Vec<Step> = match kind {
        // Numbers in an op's arguments: axes, sizes, strides, counts.
        0..=24 => {
            let args: Vec<&&Vec<Step>> = numbers.iter().filter(|p| in_node_inputs(p)).collect();
            (**rng.pick(&args)?).clone()
        }
        // Numbers in declared tensor types and storage configs.
        25..=39 => {
            let meta: Vec<&&Vec<Step>> = numbers.iter().filter(|p| in_tensor_meta(p)).collect();
            (**rng.pick(&meta)?).clone()
        }
        // The rank of a declared type or storage view.
        40..=49 => {
            let shapes: Vec<&Vec<Step>> = paths
                .iter()
                .filter(|p| matches!(p.last(), Some(Step::Key(k)) if k == "sizes" || k == "strides"))
                .collect();
            (*rng.pick(&shapes)?).clone()
        }
        // Any number.
        50..=55 => (*rng.pick(&numbers)?).clone(),
        _ => rng.pick(&paths)?.clone(),
    };
    let where_ = show_path(&path);
    let before = get(doc, &path)?.clone();
    let after = match (kind, &before) {
        (0..=39 | 50..=55, Value::Number(n)) => hostile_number(rng, n),
        (40..=49 | 56..=63, Value::Array(items)) if !items.is_empty() => {
            let mut items = items.clone();
            match rng.below(5) {
                0 => items.clear(),
                1 => {
                    items.remove(rng.below(items.len()));
                }
                2 => {
                    let i = rng.below(items.len());
                    items.insert(i, items[i].clone());
                }
                3 => {
                    let (i, j) = (rng.below(items.len()), rng.below(items.len()));
                    items.swap(i, j);
                }
                _ => items.truncate(rng.below(items.len())),
            }
            Value::Array(items)
        }
        (64..=71, Value::Object(map)) if !map.is_empty() => {
            let mut map = map.clone();
            let keys: Vec<String> = map.keys().cloned().collect();
            let key = keys[rng.below(keys.len())].clone();
            if key.starts_with("as_") && rng.chance(60) {
                // Another member of the union, same payload.
                let payload = map.remove(&key).unwrap_or(Value::Null);
                map.insert(UNION_TAGS[rng.below(UNION_TAGS.len())].to_string(), payload);
            } else if rng.chance(70) {
                map.remove(&key);
            } else {
                map.insert(key, Value::Null);
            }
            Value::Object(map)
        }
        // A string replaced by another string found under the same key: value
        // names, op targets, path names.
        (72..=83, Value::String(_)) => {
            let key = last_key(&path);
            let same: Vec<&Vec<Step>> =
                paths.iter().filter(|p| last_key(p) == key && matches!(get(doc, p), Some(Value::String(_)))).collect();
            match rng.pick(&same).and_then(|p| get(doc, p)) {
                Some(v) if rng.chance(90) => v.clone(),
                _ => Value::from(["", "x", "aten.nope.default", "torch.ops.aten.add.Tensor"][rng.below(4)]),
            }
        }
        (84..=86, Value::Bool(b)) => Value::Bool(!b),
        // A subtree replaced by another one found under the same key.
        (87..=93, _) => {
            let key = last_key(&path);
            let same: Vec<&Vec<Step>> = paths.iter().filter(|p| last_key(p) == key && **p != path).collect();
            get(doc, rng.pick(&same)?)?.clone()
        }
        (94..=99, v) => other_kind(rng, v),
        _ => return None,
    };
    let line = format!("{where_}: {} -> {}", brief(&before), brief(&after));
    *get_mut(doc, &path)? = after;
    Some(line)
}

fn brief(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 {
        format!("{}…", s.chars().take(57).collect::<String>())
    } else {
        s
    }
}

/// Applies `count` seeded mutations to `parts`; returns the mutated parts and
/// one line per mutation saying what changed where.
pub fn mutate(parts: &Pt2Parts, seed: u64, count: usize) -> (Pt2Parts, Vec<String>) {
    mutate_with(parts, &mut Rng::new(seed), count)
}

/// [`mutate`] with the choices taken from `rng`.
pub fn mutate_with(parts: &Pt2Parts, rng: &mut Rng, count: usize) -> (Pt2Parts, Vec<String>) {
    let mut out = parts.clone();
    let mut log = Vec::new();
    let json: Vec<usize> =
        (0..out.members.len()).filter(|&i| matches!(out.members[i].content, Content::Json(_))).collect();
    let model = out.members.iter().position(|m| m.name == kiln_compiler::pt2::MODEL_JSON);
    let storages: Vec<usize> = (0..out.members.len())
        .filter(|&i| {
            let m = &out.members[i];
            matches!(m.content, Content::Bytes(_))
                && (m.name.starts_with(kiln_compiler::pt2::WEIGHTS_DIR)
                    || m.name.starts_with(kiln_compiler::pt2::CONSTANTS_DIR))
        })
        .collect();
    let mut attempts = 0;
    while log.len() < count && attempts < count * 20 {
        attempts += 1;
        let roll = rng.below(100);
        if roll < 4 {
            // A storage file cut short (or emptied: "all zeros" to torch).
            let Some(&i) = rng.pick(&storages) else { continue };
            let member = &mut out.members[i];
            let Content::Bytes(bytes) = &mut member.content else { continue };
            let len = if rng.chance(50) { 0 } else { rng.below(bytes.len().max(1)) };
            log.push(format!("{}: truncated from {} to {len} bytes", member.name, bytes.len()));
            bytes.truncate(len);
            continue;
        }
        // Mostly the program; otherwise any JSON member (the storage configs).
        let i = match model {
            Some(m) if roll < 75 => m,
            _ => match rng.pick(&json) {
                Some(&i) => i,
                None => continue,
            },
        };
        let member = &mut out.members[i];
        let Content::Json(doc) = &mut member.content else { continue };
        if let Some(line) = mutate_json(rng, doc) {
            log.push(format!("{}: {line}", member.name));
        }
    }
    (out, log)
}

// ---------------------------------------------------------------- the run

/// Compiles a `.pt2` held in memory the way `kiln compile` does, and loads
/// the artifact. `Err` carries the first failure (expected for most mutated
/// files); a panic anywhere is the bug the callers look for.
pub fn compile_bytes(bytes: &[u8]) -> Result<(), String> {
    use kiln_compiler::{compile_graph, import, pt2, CompileOptions};
    let file = pt2::Pt2File::from_bytes(bytes).map_err(|e| format!("open: {e}"))?;
    let imported = import::import_file(&file).map_err(|e| format!("import: {e}"))?;
    let metadata = kiln_runtime::format::Metadata {
        producer: "kiln-tests mutate".into(),
        source: "mutated.pt2".into(),
        target: "cpu".into(),
        torch_version: imported.torch_version.clone().unwrap_or_default(),
    };
    let (writer, _) =
        compile_graph(imported.graph, &CompileOptions::default(), metadata).map_err(|e| format!("compile: {e}"))?;
    kiln_runtime::Program::from_bytes(&writer.to_bytes()).map_err(|e| format!("load: {e}"))?;
    Ok(())
}

/// The `.pt2` files the mutations start from: every fixture, the first
/// case of each conformance op, and every dynamic-shape conformance case.
pub fn corpus() -> Vec<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    collect_pt2(&root.join("fixtures"), &mut files);
    collect_pt2(&root.join("conformance").join("dynamic"), &mut files);
    if let Ok(ops) = std::fs::read_dir(root.join("conformance").join("cases")) {
        let mut ops: Vec<_> = ops.flatten().map(|e| e.path()).collect();
        ops.sort();
        for op in ops {
            let mut cases = Vec::new();
            collect_pt2(&op, &mut cases);
            files.extend(cases.into_iter().next());
        }
    }
    files
}

fn collect_pt2(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            collect_pt2(&p, out);
        } else if p.extension().is_some_and(|e| e == "pt2") {
            out.push(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn rezipped_fixture_compiles_unchanged() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/mlp/aten.pt2");
        let parts = Pt2Parts::read(&path).unwrap();
        let bytes = parts.to_zip();
        compile_bytes(&bytes).unwrap();
        // Same members, same payloads, aligned like torch's.
        let again = kiln_compiler::pt2::archive::Archive::from_bytes(&bytes).unwrap();
        let original = kiln_compiler::pt2::archive::Archive::open(&path).unwrap();
        assert_eq!(again.members().count(), original.members().count());
        for (name, payload) in original.members() {
            let range = again.range(name).unwrap();
            assert_eq!(range.start % 64, 0, "{name} is not 64-byte aligned");
            if !name.ends_with(".json") {
                assert_eq!(again.bytes(name).unwrap(), payload, "{name}");
            }
        }
    }

    #[test]
    fn mutations_are_deterministic() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/mlp/aten.pt2");
        let parts = Pt2Parts::read(&path).unwrap();
        let (a, log_a) = mutate(&parts, 7, 3);
        let (b, log_b) = mutate(&parts, 7, 3);
        assert_eq!(log_a, log_b);
        assert_eq!(log_a.len(), 3);
        assert_eq!(a.to_zip(), b.to_zip());
    }
}
