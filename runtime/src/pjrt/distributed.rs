//! Several processes (hosts) driving one set of devices: the key-value store
//! PJRT plugins exchange their topology through, a small coordination service
//! that serves it over TCP, the bridge from kiln's store to the C callbacks of
//! `PJRT_Client_Create`, and where each partition of a mesh runs.
//!
//! What a plugin needs from its caller for a multi-process client (GPU plugin
//! source, PJRT C API 0.81 header; `/work/shared/notes/sharding-pjrt.md` §5):
//! `node_id` and `num_nodes` create options, and all three key-value callbacks
//! (get, try-get, put) — the GPU plugin builds no store unless all three are
//! set. Each process creates its client with its own `node_id`; the plugin
//! publishes its local devices under keys of its choosing and blocks in `get`
//! until every other process has published, so client creation is a
//! rendezvous. The XLA CPU plugin ignores all of it (verified: one process,
//! its own devices), so this module is tested against a fake plugin
//! (`runtime/tests/pjrt_distributed.rs`).

use super::ffi;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest key the service stores (plugins use short, structured keys).
pub const MAX_KEY_BYTES: usize = 4096;
/// Largest value the service stores: a serialized topology is kilobytes;
/// the bound keeps a bad peer from making the service allocate without limit.
pub const MAX_VALUE_BYTES: usize = 64 << 20;

/// Why a key-value operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    #[error("key `{key}` did not appear within {timeout:?}")]
    Timeout { key: String, timeout: Duration },
    #[error("key `{0}` is not set")]
    NotFound(String),
    #[error("key-value store: {0}")]
    Store(String),
}

/// A key-value store every process of a multi-process run reaches: what the
/// plugin's callbacks read and write. Implementations are thread-safe; `get`
/// blocks until the key is set or `timeout` passes.
pub trait KvStore: Send + Sync {
    fn put(&self, key: &str, value: &[u8]) -> Result<(), KvError>;
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, KvError>;
    /// The value if the key is set now ([`KvError::NotFound`] otherwise).
    fn try_get(&self, key: &str) -> Result<Vec<u8>, KvError>;
    /// Sets `key` for exactly `readers` reads: the store drops it after the
    /// `readers`-th successful `get`/`try_get`, so per-call traffic does not
    /// pile up in a long-running service. A store that cannot count (the
    /// default) keeps the key like `put`.
    fn put_for_readers(&self, key: &str, value: &[u8], readers: u32) -> Result<(), KvError> {
        let _ = readers;
        self.put(key, value)
    }
}

fn check_sizes(key: &str, value_len: usize) -> Result<(), KvError> {
    if key.len() > MAX_KEY_BYTES {
        return Err(KvError::Store(format!("key of {} bytes (at most {MAX_KEY_BYTES})", key.len())));
    }
    if value_len > MAX_VALUE_BYTES {
        return Err(KvError::Store(format!("value of {value_len} bytes (at most {MAX_VALUE_BYTES})")));
    }
    Ok(())
}

/// An in-process store: the one behind [`CoordinationService`], and enough
/// for several clients of one process.
#[derive(Default)]
pub struct MemoryKvStore {
    map: Mutex<HashMap<String, Entry>>,
    changed: Condvar,
}

/// A stored value and, when it was put for a number of readers, how many
/// reads it has left.
struct Entry {
    value: Vec<u8>,
    reads_left: Option<u32>,
}

impl MemoryKvStore {
    pub fn new() -> MemoryKvStore {
        MemoryKvStore::default()
    }

    /// The keys set so far, sorted (for diagnostics and tests).
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.lock().keys().cloned().collect();
        keys.sort();
        keys
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // A panic while holding the lock leaves a consistent map (inserts are atomic).
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn insert(&self, key: &str, value: &[u8], reads_left: Option<u32>) -> Result<(), KvError> {
        check_sizes(key, value.len())?;
        let mut map = self.lock();
        if reads_left == Some(0) {
            // Nobody will read it.
            map.remove(key);
        } else {
            map.insert(key.to_string(), Entry { value: value.to_vec(), reads_left });
        }
        drop(map);
        self.changed.notify_all();
        Ok(())
    }
}

/// One read of `key`: its value, dropping the entry on its last counted read.
fn read_once(map: &mut HashMap<String, Entry>, key: &str) -> Option<Vec<u8>> {
    let entry = map.get_mut(key)?;
    match &mut entry.reads_left {
        Some(1) => map.remove(key).map(|e| e.value),
        Some(n) => {
            *n -= 1;
            Some(entry.value.clone())
        }
        None => Some(entry.value.clone()),
    }
}

impl KvStore for MemoryKvStore {
    fn put(&self, key: &str, value: &[u8]) -> Result<(), KvError> {
        self.insert(key, value, None)
    }

    fn put_for_readers(&self, key: &str, value: &[u8], readers: u32) -> Result<(), KvError> {
        self.insert(key, value, Some(readers))
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, KvError> {
        let deadline = Instant::now() + timeout;
        let mut map = self.lock();
        loop {
            if let Some(v) = read_once(&mut map, key) {
                return Ok(v);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(KvError::Timeout { key: key.to_string(), timeout });
            }
            map = self.changed.wait_timeout(map, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    fn try_get(&self, key: &str) -> Result<Vec<u8>, KvError> {
        read_once(&mut self.lock(), key).ok_or_else(|| KvError::NotFound(key.to_string()))
    }
}

// The wire protocol, one request per connection (coordination traffic is a
// handful of calls per client creation):
//   request:  op u8 ('P' put, 'R' put for readers, 'G' get, 'T' try-get),
//             key length u32 LE, key, then for 'P' value length u32 LE and
//             value, for 'R' readers u32 LE then the value as for 'P', for
//             'G' timeout ms u32 LE;
//   response: status u8 (0 ok, 1 not found, 2 timeout, 3 error), length u32
//             LE, then the value (ok) or a UTF-8 message (error).
const OP_PUT: u8 = b'P';
const OP_PUT_FOR_READERS: u8 = b'R';
const OP_GET: u8 = b'G';
const OP_TRY_GET: u8 = b'T';
const ST_OK: u8 = 0;
const ST_NOT_FOUND: u8 = 1;
const ST_TIMEOUT: u8 = 2;
const ST_ERROR: u8 = 3;
/// How long a peer may take to send its request once connected.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

/// Reads a length-prefixed field of at most `max` bytes (checked before
/// allocating).
fn read_field(r: &mut impl Read, max: usize, what: &str) -> std::io::Result<Vec<u8>> {
    let len = read_u32(r)? as usize;
    if len > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{what} of {len} bytes (at most {max})"),
        ));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

fn write_response(w: &mut impl Write, status: u8, body: &[u8]) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(5 + body.len());
    out.push(status);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
    w.write_all(&out)
}

/// Serves a [`MemoryKvStore`] over TCP to the other processes of a run
/// (started by one of them, typically node 0, at an address all can reach).
/// Stops when dropped.
pub struct CoordinationService {
    addr: SocketAddr,
    store: Arc<MemoryKvStore>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    /// Requests being handled: dropping the service waits for them (up to
    /// [`DRAIN_TIMEOUT`]) so that a put this process has already seen gets
    /// its answer before the process exits — node 1's last report to node 0
    /// otherwise raced node 0's exit ("failed to fill whole buffer").
    in_flight: Arc<AtomicUsize>,
}

/// How long a dropped service waits for requests still being answered (a
/// blocking get from a peer may never end; a put answers in microseconds).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

impl CoordinationService {
    /// Listens at `addr` (port 0: any free port; see [`Self::addr`]).
    pub fn start(addr: impl ToSocketAddrs) -> std::io::Result<CoordinationService> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let store = Arc::new(MemoryKvStore::new());
        let stop = Arc::new(AtomicBool::new(false));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let (s, st, busy) = (Arc::clone(&store), Arc::clone(&stop), Arc::clone(&in_flight));
        let accept =
            std::thread::Builder::new().name("kiln-coordination".into()).spawn(move || serve(listener, s, st, busy))?;
        Ok(CoordinationService { addr, store, stop, accept: Some(accept), in_flight })
    }

    /// The address it listens at.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The store it serves (this process may use it directly).
    pub fn store(&self) -> &Arc<MemoryKvStore> {
        &self.store
    }
}

impl Drop for CoordinationService {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop; it sees `stop` and returns.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        while self.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn serve(listener: TcpListener, store: Arc<MemoryKvStore>, stop: Arc<AtomicBool>, in_flight: Arc<AtomicUsize>) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(conn) = conn else { continue };
        let store = Arc::clone(&store);
        // Counted before the thread exists, so a drop right after this
        // request's put became visible still waits for its answer.
        in_flight.fetch_add(1, Ordering::SeqCst);
        let busy = Arc::clone(&in_flight);
        // One thread per request: a blocking get must not hold up a put.
        let spawned = std::thread::Builder::new().name("kiln-coordination-conn".into()).spawn(move || {
            let _ = handle(conn, &store);
            busy.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn handle(mut conn: TcpStream, store: &MemoryKvStore) -> std::io::Result<()> {
    conn.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    let mut op = [0u8; 1];
    conn.read_exact(&mut op)?;
    let key = match String::from_utf8(read_field(&mut conn, MAX_KEY_BYTES, "key")?) {
        Ok(k) => k,
        Err(_) => return write_response(&mut conn, ST_ERROR, b"the key is not UTF-8"),
    };
    let result = match op[0] {
        OP_PUT => {
            let value = read_field(&mut conn, MAX_VALUE_BYTES, "value")?;
            store.put(&key, &value).map(|()| Vec::new())
        }
        OP_PUT_FOR_READERS => {
            let readers = read_u32(&mut conn)?;
            let value = read_field(&mut conn, MAX_VALUE_BYTES, "value")?;
            store.put_for_readers(&key, &value, readers).map(|()| Vec::new())
        }
        OP_GET => {
            let ms = read_u32(&mut conn)?;
            store.get(&key, Duration::from_millis(u64::from(ms)))
        }
        OP_TRY_GET => store.try_get(&key),
        other => return write_response(&mut conn, ST_ERROR, format!("unknown request {other:#04x}").as_bytes()),
    };
    match result {
        Ok(v) => write_response(&mut conn, ST_OK, &v),
        Err(KvError::NotFound(_)) => write_response(&mut conn, ST_NOT_FOUND, &[]),
        Err(KvError::Timeout { .. }) => write_response(&mut conn, ST_TIMEOUT, &[]),
        Err(KvError::Store(m)) => write_response(&mut conn, ST_ERROR, m.as_bytes()),
    }?;
    conn.shutdown(Shutdown::Write)
}

/// A [`KvStore`] reached through a [`CoordinationService`] at `addr`.
#[derive(Clone, Debug)]
pub struct RemoteKvStore {
    addr: SocketAddr,
    /// How long to keep retrying the first connection (the service's process
    /// may start later than this one).
    pub connect_timeout: Duration,
}

impl RemoteKvStore {
    pub fn new(addr: SocketAddr) -> RemoteKvStore {
        RemoteKvStore { addr, connect_timeout: Duration::from_secs(60) }
    }

    fn connect(&self) -> Result<TcpStream, KvError> {
        let deadline = Instant::now() + self.connect_timeout;
        loop {
            match TcpStream::connect_timeout(&self.addr, Duration::from_secs(2)) {
                Ok(s) => return Ok(s),
                Err(e) if Instant::now() >= deadline => {
                    return Err(KvError::Store(format!("cannot reach the coordination service at {}: {e}", self.addr)))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// One request: `op`, `key`, then `tail` (already encoded); waits at most
    /// `wait` (plus slack) for the answer.
    fn request(&self, op: u8, key: &str, tail: &[u8], wait: Duration) -> Result<Vec<u8>, KvError> {
        let io = |e: std::io::Error| KvError::Store(format!("coordination service at {}: {e}", self.addr));
        let mut conn = self.connect()?;
        conn.set_read_timeout(Some(wait + REQUEST_TIMEOUT)).map_err(io)?;
        let mut req = Vec::with_capacity(5 + key.len() + tail.len());
        req.push(op);
        req.extend_from_slice(&(key.len() as u32).to_le_bytes());
        req.extend_from_slice(key.as_bytes());
        req.extend_from_slice(tail);
        conn.write_all(&req).map_err(io)?;
        let mut status = [0u8; 1];
        conn.read_exact(&mut status).map_err(io)?;
        let body = read_field(&mut conn, MAX_VALUE_BYTES.max(MAX_KEY_BYTES), "answer").map_err(io)?;
        match status[0] {
            ST_OK => Ok(body),
            ST_NOT_FOUND => Err(KvError::NotFound(key.to_string())),
            ST_TIMEOUT => Err(KvError::Timeout { key: key.to_string(), timeout: wait }),
            ST_ERROR => Err(KvError::Store(String::from_utf8_lossy(&body).into_owned())),
            other => Err(KvError::Store(format!("coordination service answered status {other}"))),
        }
    }
}

impl KvStore for RemoteKvStore {
    fn put(&self, key: &str, value: &[u8]) -> Result<(), KvError> {
        check_sizes(key, value.len())?;
        let mut tail = (value.len() as u32).to_le_bytes().to_vec();
        tail.extend_from_slice(value);
        self.request(OP_PUT, key, &tail, Duration::ZERO).map(drop)
    }

    fn put_for_readers(&self, key: &str, value: &[u8], readers: u32) -> Result<(), KvError> {
        check_sizes(key, value.len())?;
        let mut tail = readers.to_le_bytes().to_vec();
        tail.extend_from_slice(&(value.len() as u32).to_le_bytes());
        tail.extend_from_slice(value);
        self.request(OP_PUT_FOR_READERS, key, &tail, Duration::ZERO).map(drop)
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, KvError> {
        check_sizes(key, 0)?;
        let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        self.request(OP_GET, key, &ms.to_le_bytes(), timeout)
    }

    fn try_get(&self, key: &str) -> Result<Vec<u8>, KvError> {
        check_sizes(key, 0)?;
        self.request(OP_TRY_GET, key, &[], Duration::ZERO)
    }
}

/// This process's place in a multi-process run, given to
/// [`super::ClientOptions::distributed`].
#[derive(Clone)]
pub struct Distributed {
    /// This process, `0..num_nodes`.
    pub node_id: u32,
    pub num_nodes: u32,
    /// Reached by every process ([`CoordinationService`] on one of them,
    /// [`RemoteKvStore`] on the others, or any store of the user's).
    pub store: Arc<dyn KvStore>,
    /// How long a session waits for a peer's launch record or result piece
    /// ([`Self::new`]: 300 s). Client creation waits as long as the plugin
    /// chooses.
    pub timeout: Duration,
    /// The session's name, the same in every process and unique among the
    /// run's live sessions: it pairs the sessions of the processes. `None`
    /// ([`Self::new`]): the n-th distributed session of each process pairs
    /// with the n-th of the others, so every process must create them in the
    /// same order.
    pub session: Option<String>,
}

impl std::fmt::Debug for Distributed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Distributed {{ node_id: {}, num_nodes: {} }}", self.node_id, self.num_nodes)
    }
}

/// The same process and the same store (clients are cached by options; the
/// session name is not part of a client's identity).
impl PartialEq for Distributed {
    fn eq(&self, other: &Self) -> bool {
        self.node_id == other.node_id
            && self.num_nodes == other.num_nodes
            && self.timeout == other.timeout
            && std::ptr::addr_eq(Arc::as_ptr(&self.store), Arc::as_ptr(&other.store))
    }
}
impl Eq for Distributed {}

impl Distributed {
    /// Node `node_id` of `num_nodes`, reaching `store`, with the default timeout.
    pub fn new(node_id: u32, num_nodes: u32, store: Arc<dyn KvStore>) -> Distributed {
        Distributed { node_id, num_nodes, store, timeout: Duration::from_secs(300), session: None }
    }

    /// Checks `node_id < num_nodes` and the session name.
    pub fn validate(&self) -> Result<(), String> {
        if self.num_nodes == 0 || self.node_id >= self.num_nodes {
            return Err(format!("node_id {} is not below num_nodes {}", self.node_id, self.num_nodes));
        }
        self.session.as_deref().map_or(Ok(()), super::hosts::check_session_name)
    }
}

/// What the three callbacks of `PJRT_Client_Create` reach: the store, and the
/// prefix that keeps this plugin's keys apart from another plugin's (the
/// header makes that the caller's job). Boxed and owned by the client.
pub(crate) struct KvBridge {
    store: Arc<dyn KvStore>,
    prefix: String,
}

impl KvBridge {
    pub(crate) fn new(store: Arc<dyn KvStore>, plugin_name: &str) -> Box<KvBridge> {
        Box::new(KvBridge { store, prefix: format!("kiln/{plugin_name}/") })
    }

    fn key(&self, key: *const c_char, len: usize) -> Option<String> {
        if key.is_null() && len > 0 {
            return None;
        }
        // SAFETY: the plugin passes `len` readable bytes (null only with 0).
        let bytes = if len == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(key.cast::<u8>(), len) } };
        Some(format!("{}{}", self.prefix, String::from_utf8_lossy(bytes)))
    }

    /// Fills the three callback slots of `args`, pointing at `self`.
    pub(crate) fn install(&self, args: &mut ffi::PJRT_Client_Create_Args) {
        let me = (self as *const KvBridge).cast_mut().cast::<c_void>();
        args.kv_get_callback = Some(kv_get);
        args.kv_get_user_arg = me;
        args.kv_put_callback = Some(kv_put);
        args.kv_put_user_arg = me;
        args.kv_try_get_callback = Some(kv_try_get);
        args.kv_try_get_user_arg = me;
    }
}

/// `PJRT_Error_Code` values the callbacks report.
const CODE_NOT_FOUND: c_int = 5;
const CODE_DEADLINE_EXCEEDED: c_int = 4;
const CODE_INVALID_ARGUMENT: c_int = 3;
const CODE_UNAVAILABLE: c_int = 14;

/// Turns a store error into the plugin's error through its `callback_error`.
///
/// # Safety
/// `callback_error` is null or points to the plugin's `PJRT_CallbackError`.
unsafe fn report(callback_error: *const ffi::PJRT_CallbackError, code: c_int, message: &str) -> *mut ffi::PJRT_Error {
    match callback_error.as_ref().and_then(|f| *f) {
        Some(f) => f(code, message.as_ptr().cast(), message.len()),
        // The header has the plugin always pass one; without it there is no
        // error object the plugin could free, and a get leaves its value
        // null (what the plugin reads as empty).
        None => std::ptr::null_mut(),
    }
}

fn kv_error_code(e: &KvError) -> c_int {
    match e {
        KvError::NotFound(_) => CODE_NOT_FOUND,
        KvError::Timeout { .. } => CODE_DEADLINE_EXCEEDED,
        KvError::Store(_) => CODE_UNAVAILABLE,
    }
}

/// A value handed to the plugin: length-prefixed so the deleter (which gets
/// only the pointer) can free it.
fn leak_value(v: Vec<u8>) -> (*mut c_char, usize) {
    let len = v.len();
    let mut buf = Vec::with_capacity(8 + len);
    buf.extend_from_slice(&(len as u64).to_le_bytes());
    buf.extend_from_slice(&v);
    let boxed: Box<[u8]> = buf.into_boxed_slice();
    let base = Box::into_raw(boxed).cast::<u8>();
    // SAFETY: the allocation is 8 + len bytes.
    (unsafe { base.add(8) }.cast::<c_char>(), len)
}

unsafe extern "C" fn free_value(value: *mut c_char) {
    if value.is_null() {
        return;
    }
    // SAFETY: `value` came from `leak_value`: 8 bytes of length precede it.
    unsafe {
        let base = value.cast::<u8>().sub(8);
        let len = u64::from_le_bytes(std::ptr::read(base.cast::<[u8; 8]>())) as usize;
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(base, 8 + len)));
    }
}

/// Runs `f` with the bridge behind `user_arg`, turning a panic into an error
/// (nothing unwinds into the plugin).
///
/// # Safety
/// `user_arg` is the pointer [`KvBridge::install`] gave the plugin.
unsafe fn with_bridge(
    user_arg: *mut c_void,
    callback_error: *const ffi::PJRT_CallbackError,
    f: impl FnOnce(&KvBridge) -> Result<(), (c_int, String)>,
) -> *mut ffi::PJRT_Error {
    let Some(bridge) = user_arg.cast::<KvBridge>().cast_const().as_ref() else {
        return report(callback_error, CODE_INVALID_ARGUMENT, "kiln key-value callback without its store");
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(bridge))) {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err((code, message))) => report(callback_error, code, &message),
        Err(_) => report(callback_error, CODE_UNAVAILABLE, "kiln's key-value store panicked"),
    }
}

unsafe extern "C" fn kv_get(args: *mut ffi::PJRT_KeyValueGetCallback_Args) -> *mut ffi::PJRT_Error {
    // SAFETY: the plugin passes a valid args struct.
    let args = unsafe { &mut *args };
    let timeout = Duration::from_millis(args.timeout_in_ms.max(0) as u64);
    // SAFETY: `user_arg` is ours (installed with the callback).
    unsafe {
        with_bridge(args.user_arg, args.callback_error, |b| {
            let key = b.key(args.key, args.key_size).ok_or((CODE_INVALID_ARGUMENT, "null key".to_string()))?;
            let v = b.store.get(&key, timeout).map_err(|e| (kv_error_code(&e), e.to_string()))?;
            (args.value, args.value_size) = leak_value(v);
            args.value_deleter_callback = Some(free_value);
            Ok(())
        })
    }
}

unsafe extern "C" fn kv_try_get(args: *mut ffi::PJRT_KeyValueTryGetCallback_Args) -> *mut ffi::PJRT_Error {
    // SAFETY: as `kv_get`.
    let args = unsafe { &mut *args };
    // SAFETY: as `kv_get`.
    unsafe {
        with_bridge(args.user_arg, args.callback_error, |b| {
            let key = b.key(args.key, args.key_size).ok_or((CODE_INVALID_ARGUMENT, "null key".to_string()))?;
            let v = b.store.try_get(&key).map_err(|e| (kv_error_code(&e), e.to_string()))?;
            (args.value, args.value_size) = leak_value(v);
            args.value_deleter_callback = Some(free_value);
            Ok(())
        })
    }
}

unsafe extern "C" fn kv_put(args: *mut ffi::PJRT_KeyValuePutCallback_Args) -> *mut ffi::PJRT_Error {
    // SAFETY: as `kv_get`.
    let args = unsafe { &mut *args };
    // SAFETY: as `kv_get`.
    unsafe {
        with_bridge(args.user_arg, args.callback_error, |b| {
            let key = b.key(args.key, args.key_size).ok_or((CODE_INVALID_ARGUMENT, "null key".to_string()))?;
            let value = if args.value_size == 0 {
                &[][..]
            } else if args.value.is_null() {
                return Err((CODE_INVALID_ARGUMENT, "null value".to_string()));
            } else {
                // SAFETY: the plugin passes `value_size` readable bytes.
                std::slice::from_raw_parts(args.value.cast::<u8>(), args.value_size)
            };
            b.store.put(&key, value).map_err(|e| (kv_error_code(&e), e.to_string()))
        })
    }
}

/// A device of the whole run, as [`super::Client::global_devices`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GlobalDevice {
    /// The plugin's global device id.
    pub id: i32,
    /// The process (node) that owns it.
    pub process_index: i32,
    /// Its position among this process's addressable devices, when it is one.
    pub addressable: Option<usize>,
    pub kind: String,
}

/// Which device runs each partition of a mesh of `partitions` devices:
/// the mesh's own device order when it names one (`named`), else every
/// process's devices in turn (by process index, each process's in the
/// plugin's order) — so each process holds a contiguous block of partitions,
/// as jax and XLA place them; in one process, the client's first devices.
/// Fails when there are too few devices or the mesh names an unknown one.
pub fn mesh_assignment(
    partitions: usize,
    named: &[i32],
    devices: &[GlobalDevice],
) -> Result<Vec<GlobalDevice>, String> {
    if !named.is_empty() {
        if named.len() != partitions {
            return Err(format!("the mesh names {} devices for {partitions} partitions", named.len()));
        }
        return named
            .iter()
            .map(|id| {
                devices
                    .iter()
                    .find(|d| d.id == *id)
                    .cloned()
                    .ok_or_else(|| format!("the mesh names device {id}, which the run lacks"))
            })
            .collect();
    }
    if devices.len() < partitions {
        return Err(format!("the program is sharded over {partitions} devices but the run has {}", devices.len()));
    }
    let mut order: Vec<&GlobalDevice> = devices.iter().collect();
    order.sort_by_key(|d| d.process_index);
    Ok(order.into_iter().take(partitions).cloned().collect())
}
