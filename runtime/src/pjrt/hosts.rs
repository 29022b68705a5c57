//! Per-host execution of a sharded segment whose mesh spans several
//! processes: which partitions this process executes, the launch check (every
//! process runs the same program as its n-th distributed session), and the
//! exchange of result pieces through the coordination store, so that every
//! process returns the full outputs.
//!
//! Keys are scoped to one session and one call:
//! `kiln/run/{session}/launch/{node}` holds each process's program
//! fingerprint; `kiln/run/{session}/call/{c}/result/{k}/part/{p}` holds
//! partition `p`'s piece of result `k` in call `c` (row-major bytes), put by
//! the process that executed `p` and read (blocking, with a timeout) by the
//! others. `{session}` is the user's session name, else the session's
//! creation index in its process. Every key is put for the exact number of
//! processes that read it ([`KvStore::put_for_readers`]; each process derives
//! the counts from the same placement), so kiln's service drops it after its
//! last read and a long-running service holds only pieces in flight.

use super::distributed::{KvError, KvStore};
use super::spmd::PieceLayout;
use crate::{Error, Result};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Distributed sessions created so far, per (store, node): the n-th session
/// of every process is the same launch (processes create their sessions in
/// the same order, as they issue collectives in the same order). The weak
/// reference keeps a dropped store's address from being reused while its
/// entry lives; dead entries are pruned.
type SessionCounters = Vec<(std::sync::Weak<dyn KvStore>, u32, u64)>;
static SESSIONS: Mutex<SessionCounters> = Mutex::new(Vec::new());

fn next_session(store: &Arc<dyn KvStore>, node: u32) -> u64 {
    let mut s = SESSIONS.lock().unwrap_or_else(|p| p.into_inner());
    s.retain(|e| e.0.strong_count() > 0);
    if let Some(e) = s.iter_mut().find(|e| std::ptr::addr_eq(e.0.as_ptr(), Arc::as_ptr(store)) && e.1 == node) {
        e.2 += 1;
        return e.2;
    }
    s.push((Arc::downgrade(store), node, 0));
    0
}

/// Where one result comes from in this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ResultSources {
    /// Partitions whose pieces make the result, each with whether this
    /// process executed it (else the piece is fetched from the store).
    pub reads: Vec<(usize, bool)>,
    /// Local partitions whose pieces this process publishes for the others.
    pub publish: Vec<usize>,
}

/// One distributed session of this process.
pub(crate) struct HostRun {
    store: Arc<dyn KvStore>,
    node: u32,
    prefix: String,
    timeout: Duration,
    calls: u64,
    /// Per result: where its bytes come from.
    pub sources: Vec<ResultSources>,
    /// Per result and partition: how many other processes read that
    /// partition's piece from the store.
    readers: Vec<Vec<u32>>,
}

/// A session name usable in store keys.
pub(crate) fn check_session_name(name: &str) -> std::result::Result<(), String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || name.len() > 128 || !name.chars().all(ok) {
        return Err(format!(
            "session name `{name}`: use 1 to 128 ASCII letters, digits, `-`, `_` or `.` (it names store keys)"
        ));
    }
    Ok(())
}

impl HostRun {
    /// Records this process's launch of the program `fingerprint` (its
    /// executable's identity: module and compile options) and checks every
    /// other process launched the same one; fails naming the process that
    /// launched another program or did not start within `timeout`.
    /// `process_of[p]`: the process executing partition `p`. `name`: the
    /// session's name, the same in every process (else sessions pair by
    /// creation order).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        store: Arc<dyn KvStore>,
        node: u32,
        num_nodes: u32,
        process_of: &[u32],
        results: &[PieceLayout],
        fingerprint: &str,
        timeout: Duration,
        name: Option<&str>,
    ) -> Result<HostRun> {
        let session = match name {
            Some(n) => {
                check_session_name(n).map_err(Error::Device)?;
                format!("`{n}`")
            }
            None => next_session(&store, node).to_string(),
        };
        let prefix = format!("kiln/run/{}/", name.map_or_else(|| session.clone(), str::to_string));
        let kv = |e: KvError| Error::Device(format!("distributed session {session}: {e}"));
        store
            .put_for_readers(&format!("{prefix}launch/{node}"), fingerprint.as_bytes(), num_nodes.saturating_sub(1))
            .map_err(kv)?;
        for other in (0..num_nodes).filter(|&o| o != node) {
            let theirs = match store.get(&format!("{prefix}launch/{other}"), timeout) {
                Ok(v) => v,
                Err(KvError::Timeout { .. }) => {
                    return Err(Error::Device(format!(
                        "process {other} did not start distributed session {session} within {timeout:?}: every \
                         process of the run must create the same sessions in the same order"
                    )))
                }
                Err(e) => return Err(kv(e)),
            };
            if theirs != fingerprint.as_bytes() {
                return Err(Error::Device(format!(
                    "process {other} launched a different program as distributed session {session} (executable \
                     {}, this process {fingerprint}): every process must run the same artifact with the same mesh",
                    String::from_utf8_lossy(&theirs)
                )));
            }
        }
        let sources = plan_sources(node, num_nodes, process_of, results);
        let readers = count_readers(node, num_nodes, process_of, results);
        Ok(HostRun { store, node, prefix, timeout, calls: 0, sources, readers })
    }

    /// Starts a call: the keys of its pieces.
    pub(crate) fn begin_call(&mut self) -> u64 {
        self.calls += 1;
        self.calls - 1
    }

    fn key(&self, call: u64, k: usize, p: usize) -> String {
        format!("{}call/{call}/result/{k}/part/{p}", self.prefix)
    }

    /// Publishes partition `p`'s piece of result `k` for the other processes.
    pub(crate) fn publish(&self, call: u64, k: usize, p: usize, piece: &[u8]) -> Result<()> {
        let readers = self.readers.get(k).and_then(|r| r.get(p)).copied().unwrap_or(0);
        self.store.put_for_readers(&self.key(call, k, p), piece, readers).map_err(|e| {
            Error::Device(format!("result {k}: cannot publish partition {p}'s piece (process {}): {e}", self.node))
        })
    }

    /// Reads partition `p`'s piece of result `k` (executed by `process`) into
    /// `piece`, waiting for it at most the session's timeout.
    pub(crate) fn fetch(&self, call: u64, k: usize, p: usize, process: u32, piece: &mut [u8]) -> Result<()> {
        let got = self.store.get(&self.key(call, k, p), self.timeout).map_err(|e| match e {
            KvError::Timeout { timeout, .. } => Error::Device(format!(
                "result {k}: partition {p}'s piece from process {process} did not arrive within {timeout:?} \
                 (the result is split across processes; is process {process} running the same calls?)"
            )),
            other => Error::Device(format!("result {k}: partition {p}'s piece from process {process}: {other}")),
        })?;
        if got.len() != piece.len() {
            return Err(Error::Device(format!(
                "result {k}: process {process} sent {} bytes for partition {p}'s piece, expected {}",
                got.len(),
                piece.len()
            )));
        }
        piece.copy_from_slice(&got);
        Ok(())
    }
}

/// Per result and partition: how many processes other than `node` fetch that
/// partition's piece from the store (what every process plans for itself).
fn count_readers(node: u32, num_nodes: u32, process_of: &[u32], results: &[PieceLayout]) -> Vec<Vec<u32>> {
    let mut readers: Vec<Vec<u32>> = results.iter().map(|_| vec![0; process_of.len()]).collect();
    for other in (0..num_nodes).filter(|&n| n != node) {
        for (k, sources) in plan_sources(other, num_nodes, process_of, results).iter().enumerate() {
            for &(p, local) in &sources.reads {
                if !local {
                    if let Some(r) = readers[k].get_mut(p) {
                        *r += 1;
                    }
                }
            }
        }
    }
    readers
}

/// Where each result's bytes come from on process `node`: a replicated
/// result from this process's first partition (else partition 0's process);
/// a split one piece by piece, from a local partition holding the piece, else
/// fetched from the owner's process. A local owner's piece is published when
/// another process holds no replica of it (every process returns whole outputs), and a
/// replicated result's partition 0 when some process executes none.
pub(crate) fn plan_sources(
    node: u32,
    num_nodes: u32,
    process_of: &[u32],
    results: &[PieceLayout],
) -> Vec<ResultSources> {
    let local = |p: usize| process_of.get(p) == Some(&node);
    let idle = (0..num_nodes).any(|n| !process_of.contains(&n));
    results
        .iter()
        .map(|layout| {
            if layout.whole {
                let p = (0..process_of.len()).find(|&p| local(p)).unwrap_or(0);
                let publish = if idle && local(0) { vec![0] } else { Vec::new() };
                ResultSources { reads: vec![(p, local(p))], publish }
            } else {
                // Each distinct piece from a local partition holding it when
                // there is one (a replica of the owner's), else the owner's.
                let reads: Vec<(usize, bool)> = layout
                    .owners
                    .iter()
                    .map(|&o| {
                        (0..process_of.len())
                            .find(|&p| local(p) && layout.starts[p] == layout.starts[o])
                            .map_or((o, false), |p| (p, true))
                    })
                    .collect();
                // A local owner's piece, for the processes holding no replica of it.
                let lacks = |n: u32, o: usize| {
                    !(0..process_of.len()).any(|p| process_of[p] == n && layout.starts[p] == layout.starts[o])
                };
                let publish = layout
                    .owners
                    .iter()
                    .copied()
                    .filter(|&o| local(o) && (0..num_nodes).any(|n| n != node && lacks(n, o)))
                    .collect();
                ResultSources { reads, publish }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{DimRef, MeshAxisDecl, MeshDecl, Storage, TensorDecl, TensorSharding};
    use crate::pjrt::distributed::{CoordinationService, KvError, MemoryKvStore, RemoteKvStore};
    use crate::DType;
    use std::time::Instant;

    fn layout(mesh: &[u32], shape: &[u64], dims: Vec<Vec<u32>>) -> PieceLayout {
        let mesh = MeshDecl {
            axes: mesh.iter().enumerate().map(|(i, &size)| MeshAxisDecl { name: format!("a{i}"), size }).collect(),
            devices: vec![],
        };
        let decl = TensorDecl {
            dtype: DType::F32,
            shape: shape.iter().map(|&d| DimRef::Static(d)).collect(),
            storage: Storage::Arena { offset: 0, max_bytes: 0 },
        };
        PieceLayout::new(&mesh, &decl, &TensorSharding { dims }).unwrap_or_else(|e| panic!("{e}"))
    }

    /// What one process does with its partitions' result pieces (here: cut
    /// from the whole result, as the device would return them): the
    /// assembly loop of `Spmd::assemble` with `HostRun` in it.
    fn assemble(
        run: &mut HostRun,
        results: &[PieceLayout],
        whole: &[Vec<u8>],
        process_of: &[u32],
    ) -> Result<Vec<Vec<u8>>> {
        let call = run.begin_call();
        let mut out = Vec::new();
        for (k, layout) in results.iter().enumerate() {
            let mut dst = vec![0u8; whole[k].len()];
            let mut piece = vec![0u8; layout.piece_bytes()];
            let sources = run.sources[k].clone();
            for &p in &sources.publish {
                layout.split(p, &whole[k], &mut piece);
                run.publish(call, k, p, &piece)?;
            }
            for &(p, local) in &sources.reads {
                if local {
                    layout.split(p, &whole[k], &mut piece);
                } else {
                    run.fetch(call, k, p, process_of[p], &mut piece)?;
                }
                if layout.whole {
                    dst.copy_from_slice(&piece);
                } else {
                    layout.place(p, &piece, &mut dst);
                }
            }
            out.push(dst);
        }
        Ok(out)
    }

    /// Two processes of a `[2, 2]` mesh (partitions 0–1 on process 0, 2–3 on
    /// 1): a result split over axis 0 (each process owns half), one split
    /// over both axes, one replicated, one split over axis 1 only (every
    /// process holds all of it). Both return every result whole, equal to
    /// the single-process assembly, over the TCP service for process 1.
    #[test]
    fn two_processes_assemble_every_result_whole() {
        let results = vec![
            layout(&[2, 2], &[4, 3], vec![vec![0], vec![]]),
            layout(&[2, 2], &[4, 2], vec![vec![0], vec![1]]),
            layout(&[2, 2], &[5], vec![vec![]]),
            layout(&[2, 2], &[2, 4], vec![vec![], vec![1]]),
        ];
        let whole: Vec<Vec<u8>> = results
            .iter()
            .enumerate()
            .map(|(k, l)| (0..l.full.iter().product::<usize>() * 4).map(|i| (i * 7 + k) as u8).collect())
            .collect();
        let process_of = [0u32, 0, 1, 1];
        let service = CoordinationService::start("127.0.0.1:0").expect("service");
        let stores: [Arc<dyn KvStore>; 2] =
            [Arc::clone(service.store()) as Arc<dyn KvStore>, Arc::new(RemoteKvStore::new(service.addr()))];
        let handles: Vec<_> = stores
            .into_iter()
            .enumerate()
            .map(|(node, store)| {
                let (results, whole) = (results.clone(), whole.clone());
                std::thread::spawn(move || {
                    let t = Duration::from_secs(20);
                    let mut run = HostRun::start(store, node as u32, 2, &process_of, &results, "exe-A", t, None)?;
                    // Two calls: keys are call-scoped.
                    assemble(&mut run, &results, &whole, &process_of)?;
                    let out = assemble(&mut run, &results, &whole, &process_of)?;
                    Ok::<_, Error>((run.sources.clone(), out))
                })
            })
            .collect();
        for (node, h) in handles.into_iter().enumerate() {
            let (sources, out) = h.join().expect("thread").unwrap_or_else(|e| panic!("process {node}: {e}"));
            assert_eq!(out, whole, "process {node}");
            let fetched: Vec<usize> = sources.iter().map(|s| s.reads.iter().filter(|r| !r.1).count()).collect();
            // Result 0: half fetched; 1: two of four; 2: replicated; 3: whole on each process.
            assert_eq!(fetched, [1, 2, 0, 0], "process {node}");
            let published: Vec<usize> = sources.iter().map(|s| s.publish.len()).collect();
            assert_eq!(published, [1, 2, 0, 0], "process {node}");
        }
        // Every piece and launch record was put for its readers and is gone.
        assert_eq!(service.store().keys(), Vec::<String>::new());
    }

    /// Three processes of a `[3]` mesh and a replicated result: pieces of a
    /// split result are read by both other processes, so each stays until
    /// its second read; named sessions pair regardless of creation order.
    #[test]
    fn pieces_read_by_several_processes_stay_until_their_last_read() {
        let results = vec![layout(&[3], &[6], vec![vec![0]])];
        let whole = vec![(0..24u8).collect::<Vec<u8>>()];
        let process_of = [0u32, 1, 2];
        let store = Arc::new(MemoryKvStore::new());
        let handles: Vec<_> = (0..3u32)
            .map(|node| {
                let (results, whole, store) = (results.clone(), whole.clone(), Arc::clone(&store) as Arc<dyn KvStore>);
                std::thread::spawn(move || {
                    // Node 1 first creates (and drops) an unnamed session: a named one still pairs.
                    if node == 1 {
                        let t = Duration::from_millis(1);
                        let _ = HostRun::start(Arc::clone(&store), 1, 3, &process_of, &results, "x", t, None);
                    }
                    let t = Duration::from_secs(20);
                    let mut run = HostRun::start(store, node, 3, &process_of, &results, "exe", t, Some("decode-1"))?;
                    // Its own piece is read by the two others.
                    assert_eq!(run.readers[0][node as usize], 2);
                    assemble(&mut run, &results, &whole, &process_of)
                })
            })
            .collect();
        for (node, h) in handles.into_iter().enumerate() {
            let out = h.join().expect("thread").unwrap_or_else(|e| panic!("process {node}: {e}"));
            assert_eq!(out, whole, "process {node}");
        }
        // Node 1's abandoned unnamed session left its launch record (nobody read it).
        assert_eq!(store.keys(), ["kiln/run/0/launch/1"]);
        let err = HostRun::start(store, 0, 3, &process_of, &results, "exe", Duration::ZERO, Some("a/b"))
            .err()
            .expect("bad name")
            .to_string();
        assert!(err.contains("session name `a/b`"), "{err}");
    }

    #[test]
    fn a_store_drops_a_counted_key_after_its_last_read() {
        let service = CoordinationService::start("127.0.0.1:0").expect("service");
        let remote = RemoteKvStore::new(service.addr());
        remote.put_for_readers("k", b"v", 2).expect("put");
        remote.put_for_readers("nobody", b"v", 0).expect("put");
        remote.put("kept", b"w").expect("put");
        assert_eq!(remote.try_get("k").expect("first read"), b"v");
        assert_eq!(service.store().keys(), ["k", "kept"]);
        assert_eq!(remote.get("k", Duration::from_secs(1)).expect("second read"), b"v");
        assert_eq!(remote.try_get("k"), Err(KvError::NotFound("k".into())));
        assert_eq!(remote.try_get("kept").expect("uncounted"), b"w");
        assert_eq!(remote.try_get("kept").expect("uncounted"), b"w");
        assert_eq!(service.store().keys(), ["kept"]);
    }

    #[test]
    fn a_different_program_on_a_peer_is_refused() {
        let store: Arc<dyn KvStore> = Arc::new(MemoryKvStore::new());
        let results = vec![layout(&[2], &[2], vec![vec![0]])];
        let peer = {
            let (store, results) = (Arc::clone(&store), results.clone());
            std::thread::spawn(move || {
                HostRun::start(store, 1, 2, &[0, 1], &results, "exe-B", Duration::from_secs(10), None).map(drop)
            })
        };
        let err = HostRun::start(store, 0, 2, &[0, 1], &results, "exe-A", Duration::from_secs(10), None)
            .err()
            .expect("mismatch")
            .to_string();
        assert!(err.contains("process 1 launched a different program") && err.contains("exe-B"), "{err}");
        let err = peer.join().expect("thread").expect_err("mismatch").to_string();
        assert!(err.contains("process 0 launched a different program") && err.contains("exe-A"), "{err}");
    }

    #[test]
    fn a_missing_peer_times_out_naming_it() {
        let store: Arc<dyn KvStore> = Arc::new(MemoryKvStore::new());
        let results = vec![layout(&[2], &[2], vec![vec![0]])];
        let t = Instant::now();
        let err = HostRun::start(Arc::clone(&store), 0, 2, &[0, 1], &results, "exe", Duration::from_millis(200), None)
            .err()
            .expect("no peer")
            .to_string();
        assert!(err.contains("process 1 did not start distributed session"), "{err}");
        assert!(t.elapsed() >= Duration::from_millis(200));
        // A peer that launched but never delivers its piece of a split result.
        store.put("kiln/run/1/launch/1", b"exe").expect("put");
        let mut run =
            HostRun::start(store, 0, 2, &[0, 1], &results, "exe", Duration::from_millis(200), None).expect("start");
        let whole = vec![vec![1u8; 8]];
        let err = assemble(&mut run, &results, &whole, &[0, 1]).expect_err("no piece").to_string();
        assert!(err.contains("result 0: partition 1's piece from process 1 did not arrive"), "{err}");
    }
}
