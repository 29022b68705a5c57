//! Where a session runs: [`Device`] and [`SessionOptions`]. Always compiled,
//! so the API is the same with or without the `pjrt` feature; without it,
//! any device but [`Device::Cpu`] is refused when a session starts.

use crate::Error;
use std::path::PathBuf;
use std::str::FromStr;

/// The device a session runs accelerator segments on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// kiln's own CPU kernels (the only device for plans without accelerator segments).
    #[default]
    Cpu,
    /// A TPU through `libtpu.so`.
    Tpu,
    /// An NVIDIA GPU through the XLA CUDA PJRT plugin.
    Gpu,
    /// Any PJRT plugin, by path (e.g. the XLA CPU plugin).
    Pjrt(PathBuf),
}

impl FromStr for Device {
    type Err = Error;

    /// `cpu`, `tpu`, `gpu` or `pjrt:PATH`.
    fn from_str(s: &str) -> Result<Device, Error> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "tpu" => Ok(Device::Tpu),
            "gpu" | "cuda" => Ok(Device::Gpu),
            _ => match s.strip_prefix("pjrt:") {
                Some(path) if !path.is_empty() => Ok(Device::Pjrt(PathBuf::from(path))),
                _ => Err(Error::Device(format!("unknown device `{s}`: expected cpu, tpu, gpu or pjrt:PATH"))),
            },
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Tpu => f.write_str("tpu"),
            Device::Gpu => f.write_str("gpu"),
            Device::Pjrt(p) => write!(f, "pjrt:{}", p.display()),
        }
    }
}

/// Where compiled accelerator executables are cached between sessions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ExecutableCache {
    /// `$XDG_CACHE_HOME/kiln`, else `~/.cache/kiln`; off when neither is known.
    #[default]
    Default,
    Dir(PathBuf),
    Off,
}

/// The default [`SessionOptions::max_arena_bytes`]: 8 GiB.
pub const DEFAULT_MAX_ARENA_BYTES: u64 = 8 << 30;

/// Options for [`crate::Program::session_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    pub device: Device,
    /// Which of the plugin's addressable devices runs the segments.
    pub device_index: usize,
    /// Devices the XLA CPU plugin should expose (its `cpu_device_count`
    /// client option); not sent when `None`.
    pub pjrt_cpu_device_count: Option<u32>,
    pub cache: ExecutableCache,
    /// Seed of the generator behind random ops (`rand`, `randn`, dropout in
    /// training mode, ...). Fixed (0) by default so that runs are
    /// reproducible; every run of a session draws new numbers, and two
    /// sessions with the same seed draw the same sequence.
    pub seed: u64,
    /// The most activation memory (the plan's arena) a session may take; a
    /// larger plan is refused when the session is created, before anything
    /// is allocated. An artifact is untrusted: this keeps a hostile or
    /// mistaken one from taking the machine.
    pub max_arena_bytes: u64,
    /// Threads the session's kernels split their work over (1: the calling
    /// thread only). Sessions with the same count share one process-wide
    /// pool; results are bit-identical whatever the count. Default:
    /// [`default_threads`].
    pub threads: usize,
    /// Whether, during a run, the pool's idle threads spin for the run's
    /// next parallel job instead of parking (as ONNX Runtime's
    /// `allow_spinning`): saves a wake-up (a context switch each) per job.
    /// They never spin between runs, and back off for a while when a
    /// spinning thread finds it lost its core (the machine is
    /// oversubscribed, where spinning would only slow everyone). Default
    /// true; false parks them after every job.
    pub spin: bool,
    /// Whether the session may run the artifact's native code (its native
    /// section, `kiln compile --target x86_64|aarch64`). An artifact with
    /// native code is code: refuse it (false) for artifacts from a channel
    /// you do not trust; native calls then run their portable fused
    /// programs. Default true.
    pub allow_native_code: bool,
    /// This process's place in a run over several processes (hosts): its
    /// client is created with `node_id`/`num_nodes` and the store, and a
    /// sharded artifact's partitions on other processes' devices are
    /// executed by those processes, result pieces exchanged through the
    /// store (README, "Several hosts"). `None`: one process.
    #[cfg(feature = "pjrt")]
    pub distributed: Option<crate::pjrt::distributed::Distributed>,
}

/// The default thread count: `KILN_NUM_THREADS` when set to a positive
/// number, else the machine's available parallelism.
pub fn default_threads() -> usize {
    let from_env = std::env::var("KILN_NUM_THREADS").ok().and_then(|v| v.trim().parse::<usize>().ok());
    match from_env {
        Some(n) if n > 0 => n.min(kiln_kernels::MAX_THREADS),
        _ => std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

impl Default for SessionOptions {
    fn default() -> SessionOptions {
        SessionOptions {
            device: Device::default(),
            device_index: 0,
            pjrt_cpu_device_count: None,
            cache: ExecutableCache::default(),
            seed: 0,
            max_arena_bytes: DEFAULT_MAX_ARENA_BYTES,
            threads: default_threads(),
            spin: true,
            allow_native_code: true,
            #[cfg(feature = "pjrt")]
            distributed: None,
        }
    }
}

impl SessionOptions {
    pub fn with_device(device: Device) -> SessionOptions {
        SessionOptions { device, ..SessionOptions::default() }
    }

    /// The default options with `threads` threads.
    pub fn with_threads(threads: usize) -> SessionOptions {
        SessionOptions { threads, ..SessionOptions::default() }
    }
}

/// What a session's accelerator delegate moved and ran since the session
/// started: per segment (indexed like `AccelProgram::segments`), and the
/// downloads made when the caller read state kept on the device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccelStats {
    pub segments: Vec<SegmentStats>,
    /// Per shape bucket (`AccelProgram::buckets`): the runs it took.
    pub buckets: Vec<SegmentStats>,
    /// Runs that executed the plan's instructions (none fitted a bucket).
    pub plan_runs: u64,
    /// Reads of device-resident state ([`crate::Session::state`]).
    pub state_downloads: u64,
    pub state_download_bytes: u64,
}

/// One segment's calls and host↔device traffic. `execute_time` runs from the
/// execute call to the device's completion event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SegmentStats {
    pub calls: u64,
    pub uploads: u64,
    pub upload_bytes: u64,
    pub upload_time: std::time::Duration,
    pub execute_time: std::time::Duration,
    pub downloads: u64,
    pub download_bytes: u64,
    pub download_time: std::time::Duration,
    /// Of `uploads`: copies of a state kept on the device (its first run, and
    /// after `set_state` / `reset_state`); a steady decode step makes none.
    pub state_uploads: u64,
    pub state_upload_bytes: u64,
    /// State buffers the executable took over (donated), each updated
    /// where it lay on the device instead of into a new buffer.
    pub donated_states: u64,
}

impl AccelStats {
    /// Bytes copied host→device and device→host by all segments so far.
    pub fn total_bytes(&self) -> (u64, u64) {
        self.segments.iter().fold((0, 0), |(up, down), s| (up + s.upload_bytes, down + s.download_bytes))
    }
}

/// What a session's accelerator delegate did at start-up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccelInfo {
    pub plugin: PathBuf,
    /// The plugin's PJRT C API version.
    pub api_version: (i32, i32),
    pub platform_name: String,
    pub platform_version: String,
    /// The addressable device running the segments: its global id and kind.
    pub device_id: i32,
    pub device_kind: String,
    /// Devices an SPMD program runs on at once (1 without a mesh).
    pub partitions: usize,
    pub segments: usize,
    /// Shape buckets compiled (or loaded) for this session.
    pub buckets: usize,
    /// Segments compiled by the plugin in this session.
    pub compiled: usize,
    /// Segments loaded from the executable cache.
    pub cache_hits: usize,
    pub cache_dir: Option<PathBuf>,
    /// Why an executable could not be written to the cache (not fatal).
    pub cache_write_errors: Vec<String>,
}
