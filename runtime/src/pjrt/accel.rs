//! The session's accelerator delegate: at session start it compiles (or loads
//! from the cache) every accelerator segment and uploads the weights they
//! read; an `InstrOp::Delegate` instruction then copies its arena arguments to the
//! device, executes, and copies the results back into their arena slots.

use super::api::{Buffer, Client, ClientOptions, Executable, ExecuteLists, Plugin, SpmdLists};
use super::cache::{self, Cache};
use super::distributed::mesh_assignment;
use super::hosts::{self, HostRun, ResultSources};
use super::spmd::PieceLayout;
use super::state::{DeviceStates, SegmentStateUse};
use super::{compile_options, discover};
use crate::device::{AccelInfo, AccelStats, Device, ExecutableCache, SegmentStats, SessionOptions};
use crate::format::{AccelProgram, AccelSegment, DimRef, IndexCheck, MeshDecl, Storage};
use crate::program::Program;
use crate::session::TensorView;
use crate::{Error, Result};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

struct Segment {
    executable: Executable,
    /// Per `@main` argument: the weight's device buffer, uploaded once, or
    /// `None` for an arena tensor uploaded on each call.
    weights: Vec<Option<Buffer>>,
    /// Which arguments and results are state kept on the device.
    states: SegmentStateUse,
    index_checks: Vec<IndexCheck>,
}

/// An SPMD segment (an artifact compiled with a mesh): one executable over
/// every device of the mesh, of which this process executes the partitions
/// on its own devices (all of them in a one-process run).
struct Spmd {
    executable: Executable,
    /// The partitions this process executes, ascending.
    parts: Vec<usize>,
    /// Client device index of each of `parts`.
    devices: Vec<usize>,
    args: Vec<PieceLayout>,
    results: Vec<PieceLayout>,
    /// Per result: the partitions it is read from, and what this process publishes.
    sources: Vec<ResultSources>,
    /// The exchange with the other processes of a multi-process run.
    hosts: Option<HostRun>,
    /// The process executing each partition (0 for all in one process).
    process_of: Vec<u32>,
    /// Per local partition, per argument: the weight piece uploaded once, or `None`.
    weights: Vec<Vec<Option<Buffer>>>,
    /// Reused by every call: one piece on the host, this call's uploads,
    /// the raw lists, the results per partition.
    scratch: Vec<u8>,
    uploaded: Vec<Vec<Buffer>>,
    lists: SpmdLists,
    outputs: Vec<Vec<Buffer>>,
}

/// A shape bucket: the whole program for padded static shapes.
struct Bucket {
    executable: Executable,
    sizes: Vec<u64>,
    /// Plan tensors of the arguments and results (as `AccelSegment`).
    args: Vec<u32>,
    results: Vec<u32>,
    weights: Vec<Option<Buffer>>,
    arg_shapes: Vec<Vec<usize>>,
    result_shapes: Vec<Vec<usize>>,
    index_checks: Vec<IndexCheck>,
    /// Plan symbols whose run values follow the arguments (0-d i64 each).
    true_sizes: Vec<u32>,
}

pub(crate) struct AccelState {
    client: Arc<Client>,
    buckets: Vec<Bucket>,
    /// One padded argument or result on the host (reused).
    pad_scratch: Vec<u8>,
    spmd: Option<Spmd>,
    device_index: usize,
    segments: Vec<Segment>,
    info: AccelInfo,
    stats: AccelStats,
    /// State kept on the device between runs (single-device programs).
    states: DeviceStates,
    /// Reused by every call (empty between calls): the arguments uploaded
    /// for this call, the raw lists, the results.
    uploaded: Vec<Buffer>,
    lists: ExecuteLists,
    outputs: Vec<Buffer>,
}

/// Clients are shared per process: a TPU can be owned by one client only, and
/// creating a client per session would be wasted work elsewhere.
type ClientKey = (std::path::PathBuf, ClientOptions);
static CLIENTS: Mutex<Vec<(ClientKey, Arc<Client>)>> = Mutex::new(Vec::new());

fn client_for(device: &Device, plugin: &Arc<Plugin>, options: ClientOptions) -> Result<Arc<Client>> {
    let mut clients = CLIENTS.lock().unwrap_or_else(|p| p.into_inner());
    let key = (plugin.path().to_path_buf(), options);
    if let Some((_, c)) = clients.iter().find(|(k, _)| *k == key) {
        return Ok(Arc::clone(c));
    }
    if key.1.distributed.is_some() {
        // Creation is a rendezvous with the other processes (it blocks until
        // they publish): never under the lock, which another node's client
        // in this process may need first.
        drop(clients);
        let client = Client::create(plugin, &key.1).map_err(|e| explain_client_error(device, plugin.path(), e))?;
        let mut clients = CLIENTS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, c)) = clients.iter().find(|(k, _)| *k == key) {
            return Ok(Arc::clone(c));
        }
        clients.push((key, Arc::clone(&client)));
        return Ok(client);
    }
    let client = Client::create(plugin, &key.1).map_err(|e| explain_client_error(device, plugin.path(), e))?;
    clients.push((key, Arc::clone(&client)));
    Ok(client)
}

/// libtpu on a machine without a TPU fails client creation with NotFound
/// ("TPU initialization failed: No jellyfish device found."); say it plainly.
fn explain_client_error(device: &Device, plugin: &Path, e: Error) -> Error {
    match e {
        Error::Pjrt { message, .. }
            if matches!(device, Device::Tpu)
                || plugin.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libtpu")) =>
        {
            if message.contains("No jellyfish device") || message.contains("TPU initialization failed") {
                Error::Device(format!("no TPU device on this machine ({} says: {message})", plugin.display()))
            } else {
                Error::Pjrt { call: "PJRT_Client_Create".into(), message }
            }
        }
        other => other,
    }
}

impl AccelState {
    pub(crate) fn new(program: &Program, options: &SessionOptions) -> Result<AccelState> {
        let Some(path) = discover::plugin_path(&options.device)? else {
            return Err(Error::Device("the CPU device has no accelerator delegate".into()));
        };
        let plugin = Plugin::load(&path)?;
        let empty = AccelProgram::default();
        let accel = program.accel().unwrap_or(&empty);
        // A plugin named by path (the XLA CPU plugin) is asked for as many
        // devices as the mesh has, unless the caller chose a count.
        let mesh_devices = accel.mesh.as_ref().map(|m| m.size().min(u64::from(u32::MAX)) as u32);
        let cpu_device_count = match (&options.device, options.pjrt_cpu_device_count) {
            (_, Some(n)) => Some(n),
            (Device::Pjrt(_), None) => mesh_devices,
            _ => None,
        };
        let distributed = options.distributed.clone();
        let client = client_for(&options.device, &plugin, ClientOptions { cpu_device_count, distributed })?;
        if let Some(mesh) = &accel.mesh {
            return AccelState::new_spmd(program, options, client, accel, mesh);
        }
        let device = client.devices().get(options.device_index).cloned().ok_or_else(|| {
            Error::Device(format!(
                "device index {} is out of range: {} ({}) has {} addressable devices",
                options.device_index,
                client.platform_name(),
                path.display(),
                client.devices().len()
            ))
        })?;
        let cache_dir = match &options.cache {
            ExecutableCache::Default => cache::default_dir(),
            ExecutableCache::Dir(d) => Some(d.clone()),
            ExecutableCache::Off => None,
        };
        let cache = cache_dir.map(Cache::new);
        let mut info = AccelInfo {
            plugin: plugin.path().to_path_buf(),
            api_version: plugin.api_version(),
            platform_name: client.platform_name().to_string(),
            platform_version: client.platform_version().to_string(),
            device_id: device.id,
            device_kind: device.kind.clone(),
            cache_dir: cache.as_ref().map(|c| c.dir().to_path_buf()),
            ..AccelInfo::default()
        };
        let options_proto = compile_options::single_device(i64::from(device.id));
        let (states, mut state_uses) = DeviceStates::plan(program.plan(), accel);
        let mut segments = Vec::with_capacity(accel.segments.len());
        let loader = SegmentLoader {
            program,
            client: &client,
            cache: cache.as_ref(),
            options_proto: &options_proto,
            device_index: options.device_index,
        };
        for (i, seg) in accel.segments.iter().enumerate() {
            let (executable, weights) = loader.load(seg, &format!("accelerator segment {i}"), &mut info)?;
            let states = std::mem::take(&mut state_uses[i]);
            segments.push(Segment { executable, weights, states, index_checks: seg.index_checks.clone() });
        }
        let mut buckets = Vec::with_capacity(accel.buckets.len());
        for (i, b) in accel.buckets.iter().enumerate() {
            let seg = &b.segment;
            let (executable, weights) = loader.load(seg, &format!("shape bucket {i}"), &mut info)?;
            // Validation bounded every padded shape.
            let usizes = |s: &[Vec<u64>]| s.iter().map(|d| d.iter().map(|&v| v as usize).collect()).collect();
            buckets.push(Bucket {
                executable,
                sizes: b.sizes.clone(),
                args: seg.args.clone(),
                results: seg.results.clone(),
                weights,
                arg_shapes: usizes(&b.arg_shapes),
                result_shapes: usizes(&b.result_shapes),
                index_checks: seg.index_checks.clone(),
                true_sizes: b.true_sizes.clone(),
            });
        }
        info.segments = segments.len();
        info.buckets = buckets.len();
        info.partitions = 1;
        Ok(AccelState {
            client,
            stats: AccelStats {
                segments: vec![SegmentStats::default(); segments.len()],
                buckets: vec![SegmentStats::default(); buckets.len()],
                ..AccelStats::default()
            },
            buckets,
            pad_scratch: Vec::new(),
            spmd: None,
            device_index: options.device_index,
            segments,
            info,
            states,
            uploaded: Vec::new(),
            lists: ExecuteLists::default(),
            outputs: Vec::new(),
        })
    }

    /// The session state of an artifact compiled with `mesh`: its one
    /// segment compiled for every device of the mesh, weight pieces uploaded
    /// to their devices.
    fn new_spmd(
        program: &Program,
        options: &SessionOptions,
        client: Arc<Client>,
        accel: &AccelProgram,
        mesh: &MeshDecl,
    ) -> Result<AccelState> {
        let n = mesh.size() as usize;
        let have = client.devices().len();
        let axes: Vec<String> = mesh.axes.iter().map(|a| format!("{}={}", a.name, a.size)).collect();
        if client.global_devices().len() < n {
            return Err(Error::Device(format!(
                "the program is sharded over {n} devices (mesh {}) but {} ({}) has {have} addressable devices",
                axes.join(", "),
                client.platform_name(),
                client.plugin().path().display()
            )));
        }
        // Device by partition: the mesh's order, else every process's devices in turn.
        let named: Vec<i32> = mesh.devices.iter().map(|&d| d as i32).collect();
        let placed = mesh_assignment(n, &named, client.global_devices()).map_err(|m| {
            Error::Device(format!("{m} ({}, {})", client.platform_name(), client.plugin().path().display()))
        })?;
        let mut parts = Vec::with_capacity(n);
        let mut devices = Vec::with_capacity(n);
        for (p, d) in placed.iter().enumerate() {
            match d.addressable {
                Some(i) => {
                    parts.push(p);
                    devices.push(i);
                }
                None if options.distributed.is_none() => {
                    return Err(Error::Device(format!(
                        "partition {p} of mesh {} runs on device {} of process {}, and this is process {}: \
                         a run over several processes needs `SessionOptions::distributed` (README, \
                         \"Several hosts\")",
                        axes.join(", "),
                        d.id,
                        d.process_index,
                        client.process_index()
                    )))
                }
                None => {}
            }
        }
        let [seg]: &[AccelSegment; 1] = accel
            .segments
            .as_slice()
            .try_into()
            .map_err(|_| Error::Plan("a sharded program has exactly one accelerator segment".into()))?;
        let cache_dir = match &options.cache {
            ExecutableCache::Default => cache::default_dir(),
            ExecutableCache::Dir(d) => Some(d.clone()),
            ExecutableCache::Off => None,
        };
        let cache = cache_dir.map(Cache::new);
        let first = &placed[parts.first().copied().unwrap_or(0)];
        let mut info = AccelInfo {
            plugin: client.plugin().path().to_path_buf(),
            api_version: client.plugin().api_version(),
            platform_name: client.platform_name().to_string(),
            platform_version: client.platform_version().to_string(),
            device_id: first.id,
            device_kind: first.kind.clone(),
            partitions: n,
            segments: 1,
            cache_dir: cache.as_ref().map(|c| c.dir().to_path_buf()),
            ..AccelInfo::default()
        };
        let shardy = seg.mlir.contains("sdy.mesh");
        let proto = compile_options::spmd(&placed.iter().map(|d| i64::from(d.id)).collect::<Vec<_>>(), shardy);
        let partitions = u32::try_from(n).unwrap_or(u32::MAX);
        let executable = load_or_compile(&client, cache.as_ref(), &seg.mlir, &proto, partitions, &mut info)?;
        if executable.num_outputs() != seg.results.len() {
            return Err(Error::Plan(format!(
                "the sharded segment returns {} results but the plan expects {}",
                executable.num_outputs(),
                seg.results.len()
            )));
        }
        let tensors = &program.plan().tensors;
        let layout = |t: u32, s| PieceLayout::new(mesh, &tensors[t as usize], s);
        let args = seg.args.iter().zip(&seg.arg_shardings).map(|(&t, s)| layout(t, s)).collect::<Result<Vec<_>>>()?;
        let results =
            seg.results.iter().zip(&seg.result_shardings).map(|(&t, s)| layout(t, s)).collect::<Result<Vec<_>>>()?;
        // The exchange only when the mesh reaches other processes' devices: a
        // plugin that makes every device addressable in every process (the
        // XLA CPU plugin ignores `num_nodes`) runs the whole mesh here.
        let spanning = options.distributed.as_ref().filter(|_| parts.len() < n);
        let process_of: Vec<u32> = match spanning {
            None => vec![0; n],
            Some(d) => placed
                .iter()
                .map(|g| if g.addressable.is_some() { d.node_id } else { g.process_index.max(0) as u32 })
                .collect(),
        };
        let (sources, hosts) = match spanning {
            None => (hosts::plan_sources(0, 1, &process_of, &results), None),
            Some(d) => {
                // The executable's identity: every process compiles the same module with the same options.
                let fingerprint = cache::key(&[seg.mlir.as_bytes(), &proto]);
                let run = HostRun::start(
                    std::sync::Arc::clone(&d.store),
                    d.node_id,
                    d.num_nodes,
                    &process_of,
                    &results,
                    &fingerprint,
                    d.timeout,
                    d.session.as_deref(),
                )?;
                (run.sources.clone(), Some(run))
            }
        };
        let mut scratch = Vec::new();
        let mut weights = Vec::with_capacity(parts.len());
        for (&p, &device) in parts.iter().zip(&devices) {
            let mut mine = Vec::with_capacity(seg.args.len());
            for (&t, piece) in seg.args.iter().zip(&args) {
                mine.push(upload_weight_piece(program, &client, device, t, piece, p, &mut scratch)?);
            }
            weights.push(mine);
        }
        let largest = args.iter().chain(&results).map(PieceLayout::piece_bytes).max().unwrap_or(0);
        scratch.clear();
        scratch.resize(largest, 0);
        let local = parts.len();
        let spmd = Spmd {
            executable,
            parts,
            devices,
            args,
            results,
            sources,
            hosts,
            process_of,
            weights,
            scratch,
            uploaded: (0..local).map(|_| Vec::new()).collect(),
            lists: SpmdLists::default(),
            outputs: Vec::new(),
        };
        Ok(AccelState {
            client,
            buckets: Vec::new(),
            pad_scratch: Vec::new(),
            spmd: Some(spmd),
            device_index: options.device_index,
            segments: Vec::new(),
            info,
            stats: AccelStats { segments: vec![SegmentStats::default()], ..AccelStats::default() },
            states: DeviceStates::default(),
            uploaded: Vec::new(),
            lists: ExecuteLists::default(),
            outputs: Vec::new(),
        })
    }

    pub(crate) fn info(&self) -> &AccelInfo {
        &self.info
    }

    /// Runs segment `segment` on `args` (in `@main`'s order; weight arguments
    /// are ignored in favour of their device copies) and writes result `k`
    /// into `results[k]`, whose length is the result's exact size.
    pub(crate) fn run(&mut self, segment: u32, args: &[TensorView<'_>], results: &mut [&mut [u8]]) -> Result<()> {
        if let Some(spmd) = &mut self.spmd {
            let Some(stats) = self.stats.segments.first_mut() else {
                return Err(Error::Plan("a sharded program has exactly one accelerator segment".into()));
            };
            return spmd.run(&self.client, args, results, stats);
        }
        // Validation proved the index; checked again rather than indexed so a
        // mismatch between plan and delegate can never panic.
        let (Some(seg), Some(stats)) =
            (self.segments.get(segment as usize), self.stats.segments.get_mut(segment as usize))
        else {
            return Err(Error::Plan(format!("accelerator segment {segment} does not exist")));
        };
        check_indices(&seg.index_checks, args)?;
        stats.calls += 1;
        let started = Instant::now();
        let uploaded = &mut self.uploaded;
        uploaded.clear();
        for ((arg, weight), state) in args.iter().zip(&seg.weights).zip(&seg.states.args) {
            if weight.is_some() {
                continue;
            }
            // State on the device is uploaded once, then stays there.
            let slot = match state {
                Some(k) => match &mut self.states.states[*k].current {
                    Some(_) => continue,
                    empty => empty,
                },
                None => {
                    uploaded.push(self.client.buffer_from_host(arg.dtype, arg.shape, arg.data, self.device_index)?);
                    stats.uploads += 1;
                    stats.upload_bytes += arg.data.len() as u64;
                    continue;
                }
            };
            *slot = Some(self.client.buffer_from_host(arg.dtype, arg.shape, arg.data, self.device_index)?);
            stats.uploads += 1;
            stats.upload_bytes += arg.data.len() as u64;
            stats.state_uploads += 1;
            stats.state_upload_bytes += arg.data.len() as u64;
        }
        let executing = Instant::now();
        stats.upload_time += executing - started;
        let mut fresh = uploaded.iter();
        let device_states = &self.states.states;
        let operands = seg
            .weights
            .iter()
            .zip(&seg.states.args)
            .filter_map(|(w, state)| match (w, state) {
                (Some(w), _) => Some(w),
                (None, Some(k)) => device_states[*k].current.as_ref(),
                (None, None) => fresh.next(),
            })
            .map(Buffer::raw);
        let executed = seg.executable.execute_into(operands, &seg.states.keep, &mut self.lists, &mut self.outputs);
        // The arguments' device buffers are freed now, not at the next call.
        uploaded.clear();
        // A donated state's buffer is gone (its update lies where it was),
        // whether or not the execution succeeded.
        for k in seg.states.args.iter().flatten() {
            if self.states.states[*k].donate && self.states.take_donated(*k)? {
                stats.donated_states += 1;
            }
        }
        let copying = Instant::now();
        stats.execute_time += copying - executing;
        executed?;
        let mut copied = Ok(());
        for (k, (out, dst)) in self.outputs.drain(..).zip(results.iter_mut()).enumerate() {
            if copied.is_ok() && seg.states.to_host.get(k).copied().unwrap_or(true) {
                copied = out.to_host(dst).map_err(|e| match e {
                    Error::Pjrt { call, message } => {
                        Error::Pjrt { call, message: format!("result {k} of segment {segment}: {message}") }
                    }
                    other => other,
                });
                stats.downloads += 1;
                stats.download_bytes += dst.len() as u64;
            }
            // The next value of a device state stays there, for the next run.
            if let Some(&Some(s)) = seg.states.results.get(k) {
                self.states.states[s].pending = Some(out);
            }
        }
        stats.download_time += copying.elapsed();
        copied
    }

    /// What the segments ran and copied so far.
    pub(crate) fn stats(&self) -> AccelStats {
        let (state_downloads, state_download_bytes) = self.states.downloads();
        AccelStats {
            segments: self.stats.segments.clone(),
            buckets: self.stats.buckets.clone(),
            plan_runs: self.stats.plan_runs,
            state_downloads,
            state_download_bytes,
        }
    }

    /// The shape bucket a run with symbol values `sym_vals` takes, if any
    /// fits; otherwise counts a run of the plan.
    pub(crate) fn bucket_for(&mut self, sym_vals: &[u64]) -> Option<usize> {
        let picked = super::buckets::pick(self.buckets.iter().map(|b| b.sizes.as_slice()), sym_vals);
        if picked.is_none() {
            self.stats.plan_runs += 1;
        }
        picked
    }

    /// The plan tensors bucket `b` reads and writes.
    pub(crate) fn bucket_tensors(&self, b: usize) -> (&[u32], &[u32]) {
        self.buckets.get(b).map_or((&[], &[]), |b| (b.args.as_slice(), b.results.as_slice()))
    }

    /// Runs bucket `b`: each non-weight argument zero-padded to the
    /// bucket's shape and uploaded, then the true sizes its masks read
    /// (from the run's symbol values `sym_vals`), one execute, each result
    /// copied back and sliced to its run shape (`results[k]`: the run's
    /// shape and slot).
    pub(crate) fn run_bucket(
        &mut self,
        b: usize,
        sym_vals: &[u64],
        args: &[TensorView<'_>],
        results: &mut [kiln_kernels::TensorMut<'_>],
    ) -> Result<()> {
        let (Some(bucket), Some(stats)) = (self.buckets.get(b), self.stats.buckets.get_mut(b)) else {
            return Err(Error::Plan(format!("shape bucket {b} does not exist")));
        };
        check_indices(&bucket.index_checks, args)?;
        stats.calls += 1;
        let started = Instant::now();
        let uploaded = &mut self.uploaded;
        uploaded.clear();
        for ((arg, weight), padded) in args.iter().zip(&bucket.weights).zip(&bucket.arg_shapes) {
            if weight.is_some() {
                continue;
            }
            let elem = arg.dtype.size_bytes();
            let bytes = padded.iter().product::<usize>() * elem;
            self.pad_scratch.resize(bytes, 0);
            super::buckets::pad(arg.data, arg.shape, padded, elem, &mut self.pad_scratch)?;
            uploaded.push(self.client.buffer_from_host(arg.dtype, padded, &self.pad_scratch, self.device_index)?);
            stats.uploads += 1;
            stats.upload_bytes += bytes as u64;
        }
        let tensors = uploaded.len();
        for &s in &bucket.true_sizes {
            // Validation bounded the index; sizes are far below i64::MAX.
            let size = sym_vals.get(s as usize).copied().unwrap_or(0) as i64;
            let bytes = size.to_le_bytes();
            uploaded.push(self.client.buffer_from_host(kiln_kernels::DType::I64, &[], &bytes, self.device_index)?);
            stats.uploads += 1;
            stats.upload_bytes += bytes.len() as u64;
        }
        let executing = Instant::now();
        stats.upload_time += executing - started;
        let (fresh, sizes) = uploaded.split_at(tensors);
        let mut fresh = fresh.iter();
        let operands =
            bucket.weights.iter().filter_map(|w| w.as_ref().or_else(|| fresh.next())).chain(sizes).map(Buffer::raw);
        let executed = bucket.executable.execute_into(operands, &[], &mut self.lists, &mut self.outputs);
        uploaded.clear();
        let copying = Instant::now();
        stats.execute_time += copying - executing;
        executed?;
        let mut copied = Ok(());
        for (k, (out, dst)) in self.outputs.drain(..).zip(results.iter_mut()).enumerate() {
            let Some(padded) = bucket.result_shapes.get(k).filter(|_| copied.is_ok()) else { continue };
            let elem = dst.dtype.size_bytes();
            self.pad_scratch.resize(padded.iter().product::<usize>() * elem, 0);
            copied = out
                .to_host(&mut self.pad_scratch)
                .and_then(|()| super::buckets::slice(&self.pad_scratch, padded, dst.shape, elem, dst.data))
                .map_err(|e| match e {
                    Error::Pjrt { call, message } => {
                        Error::Pjrt { call, message: format!("result {k} of shape bucket {b}: {message}") }
                    }
                    other => other,
                });
            stats.downloads += 1;
            stats.download_bytes += self.pad_scratch.len() as u64;
        }
        stats.download_time += copying.elapsed();
        copied
    }

    /// The states kept on the device (see [`DeviceStates`]).
    pub(crate) fn device_states(&self) -> &DeviceStates {
        &self.states
    }

    pub(crate) fn device_states_mut(&mut self) -> &mut DeviceStates {
        &mut self.states
    }
}

/// The CPU kernels' error for the first index out of `[-dim, dim)` in a
/// checked argument (the device would clamp or skip it). The instruction
/// index is the caller's to fill in.
fn check_indices(checks: &[IndexCheck], args: &[TensorView<'_>]) -> Result<()> {
    for c in checks {
        let Some(arg) = args.get(c.arg as usize) else { continue };
        let dim = i64::try_from(c.dim).unwrap_or(i64::MAX);
        let bad = match arg.dtype {
            kiln_kernels::DType::I64 => arg
                .data
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
                .find(|&i| i < -dim || i >= dim),
            kiln_kernels::DType::I32 => arg
                .data
                .chunks_exact(4)
                .map(|b| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .find(|&i| i < -dim || i >= dim),
            _ => None,
        };
        if let Some(i) = bad {
            return Err(Error::Kernel {
                index: 0,
                origin: c.origin.clone(),
                source: kiln_kernels::KernelError::Shape {
                    kernel: c.kernel.name(),
                    detail: c.kernel.out_of_range(i, c.dim),
                },
            });
        }
    }
    Ok(())
}

/// What loading a segment (or a shape bucket's program) on one device needs.
struct SegmentLoader<'a> {
    program: &'a Program,
    client: &'a Arc<Client>,
    cache: Option<&'a Cache>,
    options_proto: &'a [u8],
    device_index: usize,
}

impl SegmentLoader<'_> {
    /// `seg`'s executable (compiled, or from the cache), checked to return
    /// the plan's result count, and its weight arguments uploaded; errors
    /// name `what` ("accelerator segment 3", "shape bucket 1").
    fn load(&self, seg: &AccelSegment, what: &str, info: &mut AccelInfo) -> Result<(Executable, Vec<Option<Buffer>>)> {
        let context = |e: Error| match e {
            Error::Pjrt { call, message } => Error::Pjrt { call: format!("{call} ({what})"), message },
            other => other,
        };
        let executable =
            load_or_compile(self.client, self.cache, &seg.mlir, self.options_proto, 1, info).map_err(context)?;
        if executable.num_outputs() != seg.results.len() {
            return Err(Error::Plan(format!(
                "{what} returns {} results but the plan expects {}",
                executable.num_outputs(),
                seg.results.len()
            )));
        }
        let weights = seg
            .args
            .iter()
            .map(|&t| upload_weight(self.program, self.client, self.device_index, t).map_err(context))
            .collect::<Result<Vec<_>>>()?;
        Ok((executable, weights))
    }
}

/// The executable of `mlir` compiled with `options` over `partitions`
/// devices (one replica), from the cache when it holds one. The module's
/// collectives are checked first: a wrong mode would abort the process.
fn load_or_compile(
    client: &Arc<Client>,
    cache: Option<&Cache>,
    mlir: &str,
    options: &[u8],
    partitions: u32,
    info: &mut AccelInfo,
) -> Result<Executable> {
    check_collectives(mlir, partitions)?;
    let key = cache::key(&[
        client.plugin().path().as_os_str().as_encoded_bytes(),
        client.platform_name().as_bytes(),
        client.platform_version().as_bytes(),
        options,
        mlir.as_bytes(),
    ]);
    if let Some(cache) = cache {
        if let Some(bytes) = cache.load(&key) {
            // A stale or foreign file just means compiling again.
            if let Ok(exe) = client.deserialize(&bytes, options) {
                info.cache_hits += 1;
                return Ok(exe);
            }
        }
    }
    let exe = client.compile(mlir, options)?;
    info.compiled += 1;
    if let Some(cache) = cache {
        let stored = exe.serialize().and_then(|bytes| {
            cache.store(&key, &bytes).map_err(|e| Error::Io { path: cache.path(&key).display().to_string(), source: e })
        });
        if let Err(e) = stored {
            info.cache_write_errors.push(e.to_string());
        }
    }
    Ok(exe)
}

/// The collective verifier's refusal as a plan error (nothing reaches the
/// plugin).
fn check_collectives(mlir: &str, partitions: u32) -> Result<()> {
    super::verify::verify_collectives(mlir, super::verify::Devices { replicas: 1, partitions })
        .map_err(|e| Error::Plan(format!("refused before compiling on the plugin: {e}")))
}

fn upload_weight(program: &Program, client: &Arc<Client>, device_index: usize, t: u32) -> Result<Option<Buffer>> {
    // Indices were validated at load.
    let decl = &program.plan().tensors[t as usize];
    let Storage::Weight { offset, bytes } = decl.storage else { return Ok(None) };
    // Weights have static shapes (validated).
    let shape: Vec<usize> =
        decl.shape.iter().map(|d| if let DimRef::Static(v) = d { *v as usize } else { 0 }).collect();
    let data = &program.weights()[offset as usize..(offset + bytes) as usize];
    client.buffer_from_host(decl.dtype, &shape, data, device_index).map(Some)
}

impl Spmd {
    /// Splits the arena arguments into their pieces on every device, runs all
    /// partitions in one call, and assembles each result from the pieces of
    /// the partitions that own them.
    fn run(
        &mut self,
        client: &Arc<Client>,
        args: &[TensorView<'_>],
        results: &mut [&mut [u8]],
        stats: &mut SegmentStats,
    ) -> Result<()> {
        stats.calls += 1;
        let started = Instant::now();
        for (i, (&p, &device)) in self.parts.iter().zip(&self.devices).enumerate() {
            self.uploaded[i].clear();
            for ((arg, layout), weight) in args.iter().zip(&self.args).zip(&self.weights[i]) {
                if weight.is_some() {
                    continue;
                }
                let buffer = if layout.whole {
                    client.buffer_from_host(arg.dtype, arg.shape, arg.data, device)?
                } else {
                    let piece = &mut self.scratch[..layout.piece_bytes()];
                    layout.split(p, arg.data, piece);
                    client.buffer_from_host(arg.dtype, &layout.local, piece, device)?
                };
                stats.uploads += 1;
                stats.upload_bytes += if layout.whole { arg.data.len() } else { layout.piece_bytes() } as u64;
                self.uploaded[i].push(buffer);
            }
        }
        // The lists keep their capacity between calls: no allocation after the first.
        self.lists.args.resize_with(self.devices.len(), Vec::new);
        for ((weights, uploaded), list) in self.weights.iter().zip(&self.uploaded).zip(&mut self.lists.args) {
            let mut fresh = uploaded.iter();
            list.clear();
            list.extend(weights.iter().filter_map(|w| w.as_ref().or_else(|| fresh.next())).map(Buffer::raw));
        }
        let executing = Instant::now();
        stats.upload_time += executing - started;
        // A process that executes no partition only assembles.
        let executed = if self.parts.is_empty() {
            Ok(())
        } else {
            self.executable.execute_partitioned(&mut self.lists, &mut self.outputs)
        };
        self.lists.args.iter_mut().for_each(Vec::clear);
        self.uploaded.iter_mut().for_each(Vec::clear);
        let copying = Instant::now();
        stats.execute_time += copying - executing;
        executed?;
        let copied = self.assemble(results, stats);
        self.outputs.iter_mut().for_each(Vec::clear);
        stats.download_time += copying.elapsed();
        copied
    }

    /// Copies each result into `results[k]`: a replicated one from one
    /// partition, a split one piece by piece from the partitions that hold
    /// them — this process's downloaded, the others' fetched from the store
    /// after this process published the pieces they lack.
    fn assemble(&mut self, results: &mut [&mut [u8]], stats: &mut SegmentStats) -> Result<()> {
        let call = self.hosts.as_mut().map_or(0, HostRun::begin_call);
        for (k, ((layout, dst), sources)) in self.results.iter().zip(results.iter_mut()).zip(&self.sources).enumerate()
        {
            let context = |e: Error| match e {
                Error::Pjrt { call, message } => {
                    Error::Pjrt { call, message: format!("result {k} of the sharded segment: {message}") }
                }
                other => other,
            };
            let bytes = layout.piece_bytes();
            let parts = &self.parts;
            let outputs = &self.outputs;
            let download = |p: usize, piece: &mut [u8], stats: &mut SegmentStats| -> Result<()> {
                let out = parts
                    .iter()
                    .position(|&q| q == p)
                    .and_then(|i| outputs.get(i))
                    .and_then(|o| o.get(k))
                    .ok_or_else(|| Error::Plan(format!("partition {p} returned no result {k}")))?;
                out.to_host(piece).map_err(context)?;
                stats.downloads += 1;
                stats.download_bytes += piece.len() as u64;
                Ok(())
            };
            if let Some(run) = &self.hosts {
                for &p in &sources.publish {
                    let piece = &mut self.scratch[..bytes];
                    download(p, piece, stats)?;
                    run.publish(call, k, p, piece)?;
                }
            }
            for &(p, local) in &sources.reads {
                let piece = &mut self.scratch[..bytes];
                match (&self.hosts, local) {
                    (_, true) => download(p, piece, stats)?,
                    (Some(run), false) => run.fetch(call, k, p, self.process_of.get(p).copied().unwrap_or(0), piece)?,
                    (None, false) => return Err(Error::Plan(format!("partition {p} of result {k} is not local"))),
                }
                if layout.whole {
                    dst.copy_from_slice(piece);
                } else {
                    layout.place(p, piece, dst);
                }
            }
        }
        Ok(())
    }
}

/// Uploads partition `p`'s piece of weight tensor `t` (its whole bytes when
/// it is replicated); `None` for an arena tensor.
fn upload_weight_piece(
    program: &Program,
    client: &Arc<Client>,
    device_index: usize,
    t: u32,
    layout: &PieceLayout,
    p: usize,
    scratch: &mut Vec<u8>,
) -> Result<Option<Buffer>> {
    let decl = &program.plan().tensors[t as usize];
    let Storage::Weight { offset, bytes } = decl.storage else { return Ok(None) };
    let data = &program.weights()[offset as usize..(offset + bytes) as usize];
    if layout.whole {
        return client.buffer_from_host(decl.dtype, &layout.full, data, device_index).map(Some);
    }
    scratch.clear();
    scratch.resize(layout.piece_bytes(), 0);
    layout.split(p, data, scratch);
    client.buffer_from_host(decl.dtype, &layout.local, scratch, device_index).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The runtime checks a segment's collectives before the plugin sees it:
    /// the module verified on 4 devices passes for 4 partitions, is refused
    /// for 2 (its groups name devices 2 and 3) and without its channels.
    #[test]
    fn segments_are_verified_before_the_plugin_compiles_them() {
        let module = include_str!("verify/manual_sdy.mlir");
        assert!(check_collectives(module, 4).is_ok());
        let refused = |m: &str, p: u32| match check_collectives(m, p) {
            Err(Error::Plan(e)) => e,
            other => panic!("not refused: {other:?}"),
        };
        let e = refused(module, 2);
        assert!(e.starts_with("refused before compiling on the plugin: collective verifier:"), "{e}");
        assert!(e.contains("id 2 in replica_groups is outside 0..2"), "{e}");
        let no_channel = module
            .replace(", channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids", "");
        assert!(refused(&no_channel, 4).contains("`stablehlo.all_reduce` %y (line 10): no channel_handle"));
    }
}
