//! Hostile `.pt2` files never make the compiler panic or allocate absurdly.
//!
//! Each case takes a file of the corpus (`kiln_tests::mutate::corpus`: the
//! fixtures and conformance cases), applies one to three seeded structural
//! mutations to its program JSON, storage configs or storage files, re-zips
//! it like torch and compiles it in memory (import, passes, memory plan,
//! lowering, load). The compile may succeed or fail with an error; a panic,
//! an attempt to allocate more than [`ALLOCATION_CAP`] bytes at once, or a
//! case running past [`CASE_TIME_LIMIT`] fails the test naming the file, the
//! seed and the mutations.
//!
//! `KILN_MUTATIONS=20000 cargo test -p kiln-tests --test import_mutations`
//! runs more cases than CI's default 400 (`KILN_MUTATIONS=A..B` runs cases A
//! to B); the seed is the case number, so a failure reproduces alone.

use kiln_tests::mutate::{compile_bytes, corpus, mutate, Pt2Parts};
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The most one allocation may ask for: far beyond anything the committed
/// fixtures need, far below what a size taken from a hostile file asks for.
const ALLOCATION_CAP: usize = 1 << 30;

/// Far beyond the slowest case (a real model: well under a second).
const CASE_TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Refuses allocations above the cap (recording the size), so that a
/// fallible reserve fails and an infallible one aborts with the case named.
struct Capped;
static OVERSIZED: AtomicUsize = AtomicUsize::new(0);
static CURRENT_CASE: AtomicU64 = AtomicU64::new(u64::MAX);

fn refuse(size: usize) -> *mut u8 {
    OVERSIZED.store(size, Ordering::SeqCst);
    let mut msg = [0u8; 128];
    let mut cursor = std::io::Cursor::new(&mut msg[..]);
    let case = CURRENT_CASE.load(Ordering::SeqCst);
    let _ = writeln!(cursor, "import_mutations: case {case} asked for {size} bytes at once");
    let n = cursor.position() as usize;
    let _ = std::io::stderr().write_all(&msg[..n]);
    std::ptr::null_mut()
}

unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOCATION_CAP {
            return refuse(layout.size());
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOCATION_CAP {
            return refuse(layout.size());
        }
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > ALLOCATION_CAP {
            return refuse(new_size);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Capped = Capped;

std::thread_local! {
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

#[test]
fn hostile_pt2_files_compile_or_fail_without_panicking() {
    // `N` runs cases 0..N; `A..B` resumes a long run at case A.
    let range: std::ops::Range<u64> =
        std::env::var("KILN_MUTATIONS").ok().map_or(0..400, |v| match v.split_once("..") {
            Some((a, b)) => a.parse().unwrap_or(0)..b.parse().unwrap_or(0),
            None => 0..v.parse().unwrap_or(400),
        });
    let cases = range.end.saturating_sub(range.start);
    let files = corpus();
    assert!(files.len() > 100, "the corpus is the fixtures and conformance cases; found {}", files.len());
    let mut parsed: Vec<Option<Pt2Parts>> = vec![None; files.len()];
    std::panic::set_hook(Box::new(|info| {
        let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{msg}{at}")));
    }));
    let started = std::time::Instant::now();
    let mut failures = Vec::new();
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for case in range {
        // Walk the corpus in a scrambled but fixed order.
        let index = (case.wrapping_mul(0x9E37_79B9) % files.len() as u64) as usize;
        let file = &files[index];
        let parts = match &parsed[index] {
            Some(p) => p,
            None => parsed[index].insert(Pt2Parts::read(file).unwrap_or_else(|e| panic!("corpus file: {e}"))),
        };
        let (mutated, log) = mutate(parts, case, 1 + (case % 3) as usize);
        let bytes = mutated.to_zip();
        CURRENT_CASE.store(case, Ordering::SeqCst);
        OVERSIZED.store(0, Ordering::SeqCst);
        // On a thread of its own, so that a case that never ends (a loop a
        // hostile file makes endless) fails the test instead of hanging it.
        let (send, receive) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| compile_bytes(&bytes)));
            let _ = send.send(result.map_err(|_| LAST_PANIC.with(|p| p.borrow_mut().take()).unwrap_or_default()));
        });
        let result = receive.recv_timeout(CASE_TIME_LIMIT);
        let describe = || {
            let rel = file.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap_or(file);
            format!("case {case} ({}), mutations:\n      {}", rel.display(), log.join("\n      "))
        };
        let Ok(result) = result else {
            failures.push(format!("{}\n    did not finish within {CASE_TIME_LIMIT:?}", describe()));
            break;
        };
        CURRENT_CASE.store(u64::MAX, Ordering::SeqCst);
        match result {
            Ok(outcome) => {
                let key = match &outcome {
                    Ok(()) => "compiled".to_string(),
                    Err(e) => e.split(':').next().unwrap_or("").to_string(),
                };
                *outcomes.entry(key).or_default() += 1;
                let oversized = OVERSIZED.load(Ordering::SeqCst);
                if oversized > 0 {
                    failures.push(format!("{}\n    asked for {oversized} bytes at once", describe()));
                }
            }
            Err(panic) => failures.push(format!("{}\n    panicked: {panic}", describe())),
        }
    }
    let _ = std::panic::take_hook();
    eprintln!("{cases} mutated files in {:.1?}: {outcomes:?}", started.elapsed());
    assert!(failures.is_empty(), "{} of {cases} mutated files failed:\n  {}", failures.len(), failures.join("\n  "));
}

/// `add` of `[2^31, 1]` and `[5]` declared `[5, 5]`: the declared type
/// contradicts the broadcast (`[2^31, 5]`), which once planned a 16 GiB
/// arena for a graph whose types said 100 bytes.
#[test]
fn a_declared_type_contradicting_the_op_is_an_error_naming_the_node() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("conformance/cases/add/f32_1/aten.pt2");
    let mut parts = Pt2Parts::read(&path).unwrap();
    let set_sizes = |parts: &mut Pt2Parts, sizes: [(&str, &[i64]); 3]| {
        let values = &mut parts.program_mut().unwrap()["graph_module"]["graph"]["tensor_values"];
        for (name, dims) in sizes {
            let dims: Vec<serde_json::Value> = dims.iter().map(|&d| serde_json::json!({ "as_int": d })).collect();
            values[name]["sizes"] = serde_json::Value::Array(dims);
        }
    };
    set_sizes(&mut parts, [("tensors_0", &[1 << 31, 1]), ("tensors_1", &[5]), ("add", &[5, 5])]);
    let err = compile_bytes(&parts.to_zip()).unwrap_err();
    assert!(err.contains("node add") && err.contains("contradicts") && err.contains("f32[5, 5]"), "{err}");
    assert!(err.contains("gives f32[2147483648, 5]"), "{err}");
    // The same shapes declared as torch infers them compile.
    set_sizes(&mut parts, [("tensors_0", &[1 << 31, 1]), ("tensors_1", &[5]), ("add", &[1 << 31, 5])]);
    compile_bytes(&parts.to_zip()).unwrap();
    // Beyond what kiln plans memory for.
    set_sizes(&mut parts, [("tensors_0", &[1 << 40, 1]), ("tensors_1", &[5]), ("add", &[1 << 40, 5])]);
    let err = compile_bytes(&parts.to_zip()).unwrap_err();
    assert!(err.contains("kiln plans memory for at most"), "{err}");
}
