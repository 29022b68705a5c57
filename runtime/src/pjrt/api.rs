//! Safe wrappers over the PJRT C API: [`Plugin`], [`Client`], [`Executable`],
//! [`Buffer`]. Every plugin error becomes [`Error::Pjrt`] carrying the
//! plugin's own message; nothing here panics on a plugin failure.

use super::distributed::{Distributed, GlobalDevice, KvBridge};
use super::ffi::{self, Api, ApiFn, ApiHead, ArgsStruct, VoidFn};
use crate::{DType, Error, Result};
use std::ffi::{c_char, c_void};
use std::mem::offset_of;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Calls a table entry by name: checks the entry exists in this plugin's
/// table, then passes the args struct.
macro_rules! call {
    ($plugin:expr, $name:ident, $args:expr) => {
        $plugin.call(stringify!($name), offset_of!(Api, $name), $args)
    };
}

/// A loaded PJRT plugin. Plugins are loaded once per process and never
/// unloaded: XLA plugins start threads and register process-wide state that
/// does not survive `dlclose`.
pub struct Plugin {
    path: PathBuf,
    api: *const Api,
    version: (i32, i32),
    /// `None` for a plugin linked into the program ([`Plugin::from_static`]).
    _library: Option<libloading::Library>,
}

// SAFETY: the PJRT C API is thread-safe (clients, executables and buffers may
// be used from any thread); the table pointer is immutable for the process.
unsafe impl Send for Plugin {}
unsafe impl Sync for Plugin {}

static PLUGINS: Mutex<Vec<Arc<Plugin>>> = Mutex::new(Vec::new());

impl Plugin {
    /// Loads and initializes the plugin at `path` (or returns the one this
    /// process already loaded from there).
    pub fn load(path: &Path) -> Result<Arc<Plugin>> {
        // A plugin registered by `from_static` is named `static:NAME`.
        if let Some(p) = Plugin::registered(path) {
            return Ok(p);
        }
        let canonical =
            std::fs::canonicalize(path).map_err(|e| Error::Io { path: path.display().to_string(), source: e })?;
        Plugin::register(canonical, |canonical| {
            if canonical.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libtpu")) {
                skip_tpu_metadata_server();
            }
            Plugin::open(canonical)
        })
    }

    /// The plugin registered under exactly `path`, if any.
    pub(crate) fn registered(path: &Path) -> Option<Arc<Plugin>> {
        PLUGINS.lock().unwrap_or_else(|p| p.into_inner()).iter().find(|p| p.path == path).cloned()
    }

    /// The plugin registered under `path`, or the one `open` makes,
    /// initialized and registered (under the registry lock: each plugin is
    /// opened and initialized once per process).
    fn register(path: PathBuf, open: impl FnOnce(PathBuf) -> Result<Plugin>) -> Result<Arc<Plugin>> {
        let mut plugins = PLUGINS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = plugins.iter().find(|p| p.path == path) {
            return Ok(Arc::clone(p));
        }
        let plugin = Arc::new(open(path)?);
        plugin.initialize()?;
        plugins.push(Arc::clone(&plugin));
        Ok(plugin)
    }

    fn open(path: PathBuf) -> Result<Plugin> {
        let fail = |call: &str, message: String| Error::Pjrt {
            call: call.to_string(),
            message: format!("{}: {message}", path.display()),
        };
        // SAFETY: loading a shared library runs its initializers; a PJRT
        // plugin is trusted code by the user's choice of `--device`.
        let library = unsafe { libloading::Library::new(&path) }.map_err(|e| fail("dlopen", e.to_string()))?;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin.
        let get_api = unsafe { library.get::<unsafe extern "C" fn() -> *const Api>(b"GetPjrtApi\0") }
            .map_err(|e| fail("dlsym GetPjrtApi", format!("not a PJRT plugin ({e})")))?;
        // SAFETY: as above.
        let api = unsafe { get_api() };
        let version = check_api(api).map_err(|m| fail("GetPjrtApi", m))?;
        Ok(Plugin { path, api, version, _library: Some(library) })
    }

    /// A plugin linked into this program rather than loaded from a file:
    /// `get_api` is its `GetPjrtApi`. Registered under `static:NAME` (a
    /// second call with the same name returns the first plugin), which
    /// sessions reach as `Device::Pjrt("static:NAME")`.
    ///
    /// # Safety
    /// `get_api` must return a PJRT C API table (or null) that stays valid
    /// for the life of the process, with every entry it fills implementing
    /// the header's contract.
    pub unsafe fn from_static(name: &str, get_api: unsafe extern "C" fn() -> *const c_void) -> Result<Arc<Plugin>> {
        Plugin::register(PathBuf::from(format!("static:{name}")), |path| {
            // SAFETY: the caller's contract.
            let api = unsafe { get_api() }.cast::<Api>();
            let version = check_api(api)
                .map_err(|message| Error::Pjrt { call: "GetPjrtApi".into(), message: format!("{name}: {message}") })?;
            Ok(Plugin { path, api, version, _library: None })
        })
    }

    fn initialize(&self) -> Result<()> {
        let mut args = ffi::PJRT_Plugin_Initialize_Args::new();
        call!(self, PJRT_Plugin_Initialize, &mut args)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The plugin's PJRT C API version (major, minor).
    pub fn api_version(&self) -> (i32, i32) {
        self.version
    }

    fn api(&self) -> &Api {
        // SAFETY: the table lives as long as the library, which `self` keeps.
        // Only fields below `struct_size` are read (`call` checks).
        unsafe { &*self.api }
    }

    /// Whether the table has the entry at `offset` and the plugin fills it
    /// (optional functions: callers fall back when it does not).
    fn implements(&self, offset: usize) -> bool {
        // SAFETY: read only when inside the plugin's table (checked first).
        self.api().has(offset) && unsafe { (*(self.api as *const u8).add(offset).cast::<Option<ApiFn>>()).is_some() }
    }

    /// Calls the table entry at `offset` with `args`.
    fn call<A: ArgsStruct>(&self, name: &'static str, offset: usize, args: &mut A) -> Result<()> {
        let api = self.api();
        if !api.has(offset) {
            return Err(Error::Pjrt {
                call: name.into(),
                message: format!("the plugin's PJRT {}.{} table has no such entry", self.version.0, self.version.1),
            });
        }
        // SAFETY: the entry lies inside the plugin's table (checked above);
        // every entry read this way has the `ApiFn` signature.
        let f = unsafe { *(self.api as *const u8).add(offset).cast::<Option<ApiFn>>() };
        let Some(f) = f else {
            return Err(Error::Pjrt {
                call: name.into(),
                message: "the plugin does not implement this function".into(),
            });
        };
        // SAFETY: `args` is a fully initialised struct of the layout this entry
        // expects, with `struct_size` set; pointers in it outlive the call.
        let err = unsafe { f((args as *mut A).cast::<c_void>()) };
        if err.is_null() {
            Ok(())
        } else {
            Err(self.take_error(name, err))
        }
    }

    /// Turns an owned `PJRT_Error` into an error value and frees it.
    fn take_error(&self, call: &str, err: *mut ffi::PJRT_Error) -> Error {
        let api = self.api();
        let mut message = String::from("(the plugin gave no message)");
        if api.has(offset_of!(Api, PJRT_Error_Message)) {
            if let Some(f) = api.PJRT_Error_Message {
                let mut args = ffi::PJRT_Error_Message_Args::new();
                args.error = err;
                call_void(f, &mut args);
                // SAFETY: the message lives as long as `err`, which is freed below.
                if let Some(m) = unsafe { string_from(args.message, args.message_size) } {
                    message = m;
                }
            }
        }
        if self.version.1 > ffi::HEADER_MINOR && message.contains("size") {
            message.push_str(&format!(
                " (the plugin speaks PJRT C API {}.{}, kiln's binding {}.{}: a newer plugin may expect larger structs)",
                self.version.0,
                self.version.1,
                ffi::HEADER_MAJOR,
                ffi::HEADER_MINOR
            ));
        }
        if api.has(offset_of!(Api, PJRT_Error_Destroy)) {
            if let Some(f) = api.PJRT_Error_Destroy {
                let mut args = ffi::PJRT_Error_Destroy_Args::new();
                args.error = err;
                call_void(f, &mut args);
            }
        }
        Error::Pjrt { call: call.to_string(), message }
    }

    /// Waits for `event`, then frees it.
    fn await_event(&self, call: &'static str, event: *mut ffi::PJRT_Event) -> Result<()> {
        if event.is_null() {
            return Ok(());
        }
        let mut args = ffi::PJRT_Event_Await_Args::new();
        args.event = event;
        let result = call!(self, PJRT_Event_Await, &mut args).map_err(|e| match e {
            Error::Pjrt { message, .. } => Error::Pjrt { call: call.into(), message },
            other => other,
        });
        let mut destroy = ffi::PJRT_Event_Destroy_Args::new();
        destroy.event = event;
        let _ = call!(self, PJRT_Event_Destroy, &mut destroy);
        result
    }
}

/// The table's PJRT version, when kiln's binding can use it.
fn check_api(api: *const Api) -> std::result::Result<(i32, i32), String> {
    if api.is_null() {
        return Err("returned no API table".into());
    }
    // Only the head is read until its size and version are known to be usable.
    // SAFETY: every PJRT table starts with `struct_size`.
    let size = unsafe { (*api.cast::<ApiHead>()).struct_size };
    if size < std::mem::size_of::<ApiHead>() {
        return Err(format!("API table is {size} bytes, too small to hold a version"));
    }
    // SAFETY: the table is at least as large as the head (checked above).
    let v = unsafe { &(*api.cast::<ApiHead>()).pjrt_api_version };
    let version = (v.major_version, v.minor_version);
    if version.0 != ffi::HEADER_MAJOR {
        return Err(format!(
            "PJRT C API {}.{} is incompatible with kiln's binding ({}.{}): major versions differ",
            version.0,
            version.1,
            ffi::HEADER_MAJOR,
            ffi::HEADER_MINOR
        ));
    }
    Ok(version)
}

fn call_void<A: ArgsStruct>(f: VoidFn, args: &mut A) {
    // SAFETY: as in `Plugin::call`.
    unsafe { f((args as *mut A).cast::<c_void>()) }
}

/// Copies a (pointer, length) string out of the plugin.
///
/// # Safety
/// `ptr` must be null or point to `len` readable bytes.
unsafe fn string_from(ptr: *const c_char, len: usize) -> Option<String> {
    if ptr.is_null() {
        return None;
    }
    let bytes = std::slice::from_raw_parts(ptr.cast::<u8>(), len);
    Some(String::from_utf8_lossy(bytes).into_owned())
}

/// libtpu asks the cloud metadata server for its configuration unless told not
/// to, retrying for minutes where there is none; kiln never lets it.
fn skip_tpu_metadata_server() {
    // Called under the plugin registry lock, before libtpu is loaded, so no
    // thread of ours is reading the environment concurrently.
    std::env::set_var("TPU_SKIP_MDS_QUERY", "1");
}

/// Options for [`Client::create`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientOptions {
    /// Number of devices the XLA CPU plugin exposes (`cpu_device_count`);
    /// ignored (not sent) when `None`.
    pub cpu_device_count: Option<u32>,
    /// This process's place in a run over several processes (hosts): sends
    /// `node_id`/`num_nodes` and the key-value callbacks (see
    /// [`super::distributed`]). `None`: a single-process client.
    pub distributed: Option<Distributed>,
}

/// One addressable device of a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Position among the client's addressable devices.
    pub index: usize,
    /// The plugin's global device id (what a device assignment names).
    pub id: i32,
    /// E.g. `cpu`, `TPU v5 lite`, `NVIDIA H100 80GB HBM3`.
    pub kind: String,
}

/// A PJRT client: the plugin's view of its devices.
pub struct Client {
    plugin: Arc<Plugin>,
    raw: *mut ffi::PJRT_Client,
    platform_name: String,
    platform_version: String,
    devices: Vec<*mut ffi::PJRT_Device>,
    device_info: Vec<DeviceInfo>,
    process_index: i32,
    global_devices: Vec<GlobalDevice>,
    /// What the plugin's key-value callbacks point at; outlives the raw
    /// client (dropped after `Drop::drop` destroys it).
    _kv: Option<Box<KvBridge>>,
}

// SAFETY: see `Plugin`; PJRT clients are thread-safe.
unsafe impl Send for Client {}
unsafe impl Sync for Client {}

impl Client {
    pub fn create(plugin: &Arc<Plugin>, options: &ClientOptions) -> Result<Arc<Client>> {
        fn int64(name: &'static str, value: i64) -> ffi::PJRT_NamedValue {
            let mut v = ffi::PJRT_NamedValue::new();
            v.name = name.as_ptr().cast();
            v.name_size = name.len();
            v.value_type = ffi::PJRT_NamedValue_kInt64;
            v.value = value;
            v.value_size = 1;
            v
        }
        let mut named = Vec::new();
        if let Some(n) = options.cpu_device_count {
            named.push(int64("cpu_device_count", i64::from(n)));
        }
        let mut args = ffi::PJRT_Client_Create_Args::new();
        let mut kv = None;
        if let Some(d) = &options.distributed {
            d.validate().map_err(Error::Device)?;
            named.push(int64("node_id", i64::from(d.node_id)));
            named.push(int64("num_nodes", i64::from(d.num_nodes)));
            let name = plugin.path().file_stem().map_or_else(|| "plugin".into(), |s| s.to_string_lossy().into_owned());
            let bridge = KvBridge::new(Arc::clone(&d.store), &name);
            bridge.install(&mut args);
            kv = Some(bridge);
        }
        args.create_options = named.as_ptr();
        args.num_options = named.len();
        call!(plugin, PJRT_Client_Create, &mut args)?;
        if args.client.is_null() {
            return Err(Error::Pjrt { call: "PJRT_Client_Create".into(), message: "returned no client".into() });
        }
        // From here on `client` owns the raw pointer and frees it on error.
        let mut client = Client {
            plugin: Arc::clone(plugin),
            raw: args.client,
            platform_name: String::new(),
            platform_version: String::new(),
            devices: Vec::new(),
            device_info: Vec::new(),
            process_index: 0,
            global_devices: Vec::new(),
            _kv: kv,
        };
        let mut name = ffi::PJRT_Client_PlatformName_Args::new();
        name.client = client.raw;
        call!(plugin, PJRT_Client_PlatformName, &mut name)?;
        // SAFETY: owned by the client, which is alive.
        client.platform_name = unsafe { string_from(name.platform_name, name.platform_name_size) }.unwrap_or_default();
        let mut version = ffi::PJRT_Client_PlatformVersion_Args::new();
        version.client = client.raw;
        call!(plugin, PJRT_Client_PlatformVersion, &mut version)?;
        // SAFETY: as above.
        client.platform_version =
            unsafe { string_from(version.platform_version, version.platform_version_size) }.unwrap_or_default();
        let mut devs = ffi::PJRT_Client_AddressableDevices_Args::new();
        devs.client = client.raw;
        call!(plugin, PJRT_Client_AddressableDevices, &mut devs)?;
        if devs.num_addressable_devices > 0 && devs.addressable_devices.is_null() {
            return Err(Error::Pjrt {
                call: "PJRT_Client_AddressableDevices".into(),
                message: "returned a null device list".into(),
            });
        }
        for i in 0..devs.num_addressable_devices {
            // SAFETY: the plugin returned `num_addressable_devices` entries (non-null list checked).
            let device = unsafe { *devs.addressable_devices.add(i) };
            let info = client.describe(i, client.description(device)?)?;
            client.devices.push(device);
            client.device_info.push(info);
        }
        client.read_topology()?;
        Ok(Arc::new(client))
    }

    /// This process's index and every device of the run (its own and other
    /// processes'), where the plugin reports them; else one process owning
    /// the addressable devices.
    fn read_topology(&mut self) -> Result<()> {
        if self.plugin.implements(offset_of!(Api, PJRT_Client_ProcessIndex)) {
            let mut p = ffi::PJRT_Client_ProcessIndex_Args::new();
            p.client = self.raw;
            call!(self.plugin, PJRT_Client_ProcessIndex, &mut p)?;
            self.process_index = p.process_index;
        }
        let local = |c: &Client| -> Vec<GlobalDevice> {
            c.device_info
                .iter()
                .map(|d| GlobalDevice {
                    id: d.id,
                    process_index: c.process_index,
                    addressable: Some(d.index),
                    kind: d.kind.clone(),
                })
                .collect()
        };
        if !self.plugin.implements(offset_of!(Api, PJRT_Client_Devices)) {
            self.global_devices = local(self);
            return Ok(());
        }
        let mut all = ffi::PJRT_Client_Devices_Args::new();
        all.client = self.raw;
        call!(self.plugin, PJRT_Client_Devices, &mut all)?;
        if all.num_devices > 0 && all.devices.is_null() {
            return Err(Error::Pjrt {
                call: "PJRT_Client_Devices".into(),
                message: "returned a null device list".into(),
            });
        }
        let has_process = self.plugin.implements(offset_of!(Api, PJRT_DeviceDescription_ProcessIndex));
        let mut global = Vec::with_capacity(all.num_devices);
        for i in 0..all.num_devices {
            // SAFETY: the plugin returned `num_devices` entries (non-null list checked).
            let device = unsafe { *all.devices.add(i) };
            let addressable = self.devices.iter().position(|&d| d == device);
            let description = self.description(device)?;
            let info = self.describe(i, description)?;
            let process_index = if has_process {
                let mut p = ffi::PJRT_DeviceDescription_ProcessIndex_Args::new();
                p.device_description = description;
                call!(self.plugin, PJRT_DeviceDescription_ProcessIndex, &mut p)?;
                p.process_index
            } else {
                self.process_index
            };
            global.push(GlobalDevice { id: info.id, process_index, addressable, kind: info.kind });
        }
        self.global_devices = global;
        Ok(())
    }

    /// This process's index among the run's processes (0 in a
    /// single-process client).
    pub fn process_index(&self) -> i32 {
        self.process_index
    }

    /// Every device of the run, this process's and other processes'
    /// (`PJRT_Client_Devices`); [`Self::devices`] are the addressable ones.
    pub fn global_devices(&self) -> &[GlobalDevice] {
        &self.global_devices
    }

    /// `device`'s description (owned by the client).
    fn description(&self, device: *mut ffi::PJRT_Device) -> Result<*mut ffi::PJRT_DeviceDescription> {
        let mut d = ffi::PJRT_Device_GetDescription_Args::new();
        d.device = device;
        call!(self.plugin, PJRT_Device_GetDescription, &mut d)?;
        Ok(d.device_description)
    }

    fn describe(&self, index: usize, description: *mut ffi::PJRT_DeviceDescription) -> Result<DeviceInfo> {
        let mut id = ffi::PJRT_DeviceDescription_Id_Args::new();
        id.device_description = description;
        call!(self.plugin, PJRT_DeviceDescription_Id, &mut id)?;
        let mut kind = ffi::PJRT_DeviceDescription_Kind_Args::new();
        kind.device_description = description;
        call!(self.plugin, PJRT_DeviceDescription_Kind, &mut kind)?;
        // SAFETY: owned by the device description, which lives as long as the client.
        let kind = unsafe { string_from(kind.device_kind, kind.device_kind_size) }.unwrap_or_default();
        Ok(DeviceInfo { index, id: id.id, kind })
    }

    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.plugin
    }

    /// `cpu`, `tpu`, `cuda`, …
    pub fn platform_name(&self) -> &str {
        &self.platform_name
    }

    /// Human-readable plugin/platform version (part of the executable cache key).
    pub fn platform_version(&self) -> &str {
        &self.platform_version
    }

    pub fn devices(&self) -> &[DeviceInfo] {
        &self.device_info
    }

    fn device_at(&self, index: usize) -> Result<*mut ffi::PJRT_Device> {
        self.devices.get(index).copied().ok_or_else(|| {
            Error::Device(format!(
                "device index {index} is out of range: the {} client has {} addressable devices",
                self.platform_name,
                self.devices.len()
            ))
        })
    }

    /// Compiles StableHLO text (`format = "mlir"`) with a serialized
    /// `CompileOptionsProto` (see [`super::compile_options`]).
    pub fn compile(self: &Arc<Self>, mlir: &str, compile_options: &[u8]) -> Result<Executable> {
        const FORMAT: &str = "mlir";
        let mut program = ffi::PJRT_Program::new();
        // The plugin only reads the code for this format ("in" direction).
        program.code = mlir.as_ptr().cast_mut().cast();
        program.code_size = mlir.len();
        program.format = FORMAT.as_ptr().cast();
        program.format_size = FORMAT.len();
        let mut args = ffi::PJRT_Client_Compile_Args::new();
        args.client = self.raw;
        args.program = &program;
        args.compile_options = compile_options.as_ptr().cast();
        args.compile_options_size = compile_options.len();
        call!(self.plugin, PJRT_Client_Compile, &mut args)?;
        Executable::wrap(self, args.executable, "PJRT_Client_Compile")
    }

    /// Loads an executable produced by [`Executable::serialize`] with the same
    /// plugin version.
    pub fn deserialize(self: &Arc<Self>, bytes: &[u8], compile_options: &[u8]) -> Result<Executable> {
        let mut args = ffi::PJRT_Executable_DeserializeAndLoad_Args::new();
        args.client = self.raw;
        args.serialized_executable = bytes.as_ptr().cast();
        args.serialized_executable_size = bytes.len();
        args.overridden_serialized_compile_options = compile_options.as_ptr().cast();
        args.overridden_serialized_compile_options_size = compile_options.len();
        call!(self.plugin, PJRT_Executable_DeserializeAndLoad, &mut args)?;
        Executable::wrap(self, args.loaded_executable, "PJRT_Executable_DeserializeAndLoad")
    }

    /// Copies a row-major host tensor to addressable device `device_index`.
    /// The plugin copies during the call, so `data` may change afterwards.
    pub fn buffer_from_host(
        self: &Arc<Self>,
        dtype: DType,
        shape: &[usize],
        data: &[u8],
        device_index: usize,
    ) -> Result<Buffer> {
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if numel.and_then(|n| n.checked_mul(dtype.size_bytes())) != Some(data.len()) {
            return Err(Error::Shape(format!("{} bytes do not hold a {dtype} tensor of shape {shape:?}", data.len())));
        }
        // On the stack: a session's steady state allocates nothing on the host.
        let mut dims = [0i64; crate::MAX_RANK];
        let dims = dims
            .get_mut(..shape.len())
            .ok_or_else(|| Error::Shape(format!("rank {} exceeds {}", shape.len(), crate::MAX_RANK)))?;
        for (d, &s) in dims.iter_mut().zip(shape) {
            *d = s as i64;
        }
        let mut args = ffi::PJRT_Client_BufferFromHostBuffer_Args::new();
        args.client = self.raw;
        args.data = data.as_ptr().cast();
        args.buffer_type = buffer_type(dtype);
        args.dims = dims.as_ptr();
        args.num_dims = dims.len();
        args.host_buffer_semantics = ffi::PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
        args.device = self.device_at(device_index)?;
        call!(self.plugin, PJRT_Client_BufferFromHostBuffer, &mut args)?;
        let buffer = Buffer::wrap(self, args.buffer, "PJRT_Client_BufferFromHostBuffer")?;
        self.plugin.await_event("PJRT_Client_BufferFromHostBuffer (transfer)", args.done_with_host_buffer)?;
        Ok(buffer)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_Client_Destroy_Args::new();
        args.client = self.raw;
        let _ = call!(self.plugin, PJRT_Client_Destroy, &mut args);
    }
}

fn buffer_type(dtype: DType) -> std::ffi::c_int {
    match dtype {
        DType::F32 => ffi::PJRT_Buffer_Type_F32,
        DType::F64 => ffi::PJRT_Buffer_Type_F64,
        DType::F16 => ffi::PJRT_Buffer_Type_F16,
        DType::BF16 => ffi::PJRT_Buffer_Type_BF16,
        DType::I8 => ffi::PJRT_Buffer_Type_S8,
        DType::U8 => ffi::PJRT_Buffer_Type_U8,
        DType::I16 => ffi::PJRT_Buffer_Type_S16,
        DType::I32 => ffi::PJRT_Buffer_Type_S32,
        DType::I64 => ffi::PJRT_Buffer_Type_S64,
        DType::Bool => ffi::PJRT_Buffer_Type_PRED,
        // A plan's tensors are never complex (the boundary's complex values
        // are f32/f64 pairs); mapped for completeness.
        DType::C64 => ffi::PJRT_Buffer_Type_C64,
        DType::C128 => ffi::PJRT_Buffer_Type_C128,
    }
}

/// A compiled program loaded on a client's devices.
pub struct Executable {
    client: Arc<Client>,
    raw: *mut ffi::PJRT_LoadedExecutable,
    num_outputs: usize,
}

// SAFETY: see `Plugin`.
unsafe impl Send for Executable {}
unsafe impl Sync for Executable {}

impl Executable {
    fn wrap(client: &Arc<Client>, raw: *mut ffi::PJRT_LoadedExecutable, call: &str) -> Result<Executable> {
        if raw.is_null() {
            return Err(Error::Pjrt { call: call.into(), message: "returned no executable".into() });
        }
        let mut exe = Executable { client: Arc::clone(client), raw, num_outputs: 0 };
        exe.num_outputs = exe.with_executable(|plugin, e| {
            let mut args = ffi::PJRT_Executable_NumOutputs_Args::new();
            args.executable = e;
            call!(plugin, PJRT_Executable_NumOutputs, &mut args)?;
            Ok(args.num_outputs)
        })?;
        Ok(exe)
    }

    /// Runs `f` on the (unloaded) executable behind this one, then frees that handle.
    fn with_executable<T>(&self, f: impl FnOnce(&Plugin, *mut ffi::PJRT_Executable) -> Result<T>) -> Result<T> {
        let plugin = &self.client.plugin;
        let mut get = ffi::PJRT_LoadedExecutable_GetExecutable_Args::new();
        get.loaded_executable = self.raw;
        call!(plugin, PJRT_LoadedExecutable_GetExecutable, &mut get)?;
        if get.executable.is_null() {
            return Err(Error::Pjrt {
                call: "PJRT_LoadedExecutable_GetExecutable".into(),
                message: "returned null".into(),
            });
        }
        let result = f(plugin, get.executable);
        let mut destroy = ffi::PJRT_Executable_Destroy_Args::new();
        destroy.executable = get.executable;
        let _ = call!(plugin, PJRT_Executable_Destroy, &mut destroy);
        result
    }

    pub fn num_outputs(&self) -> usize {
        self.num_outputs
    }

    /// The plugin's serialized form (for the executable cache).
    pub fn serialize(&self) -> Result<Vec<u8>> {
        self.with_executable(|plugin, e| {
            let mut args = ffi::PJRT_Executable_Serialize_Args::new();
            args.executable = e;
            call!(plugin, PJRT_Executable_Serialize, &mut args)?;
            // SAFETY: the bytes live until the deleter runs, below.
            let bytes = (!args.serialized_bytes.is_null()).then(|| {
                unsafe { std::slice::from_raw_parts(args.serialized_bytes.cast::<u8>(), args.serialized_bytes_size) }
                    .to_vec()
            });
            if let Some(deleter) = args.serialized_executable_deleter {
                // SAFETY: the plugin's own deleter for the object it returned.
                unsafe { deleter(args.serialized_executable) };
            }
            bytes.ok_or_else(|| Error::Pjrt {
                call: "PJRT_Executable_Serialize".into(),
                message: "returned no bytes".into(),
            })
        })
    }

    /// Runs on the device(s) chosen at compile time; `args` in `@main`'s order.
    pub fn execute(&self, args: &[&Buffer]) -> Result<Vec<Buffer>> {
        let keep: Vec<i64> = (0..args.len() as i64).collect();
        self.execute_donating(args, &keep)
    }

    /// [`Executable::execute`] letting the executable take over (donate)
    /// every argument that its module aliases to a result
    /// (`tf.aliasing_output`), except those at indices `keep`: a donated
    /// argument's memory becomes that result and the argument is deleted
    /// ([`Buffer::is_deleted`]).
    pub fn execute_donating(&self, args: &[&Buffer], keep: &[i64]) -> Result<Vec<Buffer>> {
        let mut lists = ExecuteLists::default();
        let mut outputs = Vec::new();
        self.execute_into(args.iter().map(|b| b.raw), keep, &mut lists, &mut outputs)?;
        Ok(outputs)
    }

    /// [`Executable::execute`] with caller-owned lists, reused across calls so
    /// that a session's steady state allocates nothing on the host: `args`
    /// are the argument buffers in order; `outputs` receives the results.
    pub(crate) fn execute_into(
        &self,
        args: impl Iterator<Item = *mut ffi::PJRT_Buffer>,
        keep: &[i64],
        lists: &mut ExecuteLists,
        outputs: &mut Vec<Buffer>,
    ) -> Result<()> {
        let plugin = &self.client.plugin;
        lists.args.clear();
        lists.args.extend(args);
        lists.outs.clear();
        lists.outs.resize(self.num_outputs, std::ptr::null_mut());
        let arg_list: *const *mut ffi::PJRT_Buffer = lists.args.as_ptr();
        let out_list: *mut *mut ffi::PJRT_Buffer = lists.outs.as_mut_ptr();
        let mut done: *mut ffi::PJRT_Event = std::ptr::null_mut();
        let mut options = ffi::PJRT_ExecuteOptions::new();
        options.non_donatable_input_indices = keep.as_ptr();
        options.num_non_donatable_input_indices = keep.len();
        let mut exec = ffi::PJRT_LoadedExecutable_Execute_Args::new();
        exec.executable = self.raw;
        exec.options = &mut options;
        exec.argument_lists = &arg_list;
        exec.num_devices = 1;
        exec.num_args = lists.args.len();
        exec.output_lists = &out_list;
        exec.device_complete_events = &mut done;
        let executed = call!(plugin, PJRT_LoadedExecutable_Execute, &mut exec);
        lists.args.clear();
        executed?;
        // Wrap every output first so all are freed whatever fails next.
        outputs.clear();
        let mut first_error = None;
        for &raw in &lists.outs {
            match Buffer::wrap(&self.client, raw, "PJRT_LoadedExecutable_Execute") {
                Ok(b) => outputs.push(b),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        lists.outs.clear();
        plugin.await_event("PJRT_LoadedExecutable_Execute (device completion)", done)?;
        match first_error {
            Some(e) => {
                outputs.clear();
                Err(e)
            }
            None => Ok(()),
        }
    }
}

impl Executable {
    /// Runs an SPMD executable on all its devices in one call (launching them
    /// one by one would deadlock in the first collective): `args[p]` are the
    /// argument buffers of partition `p`, on that partition's device; on
    /// success `outputs[p]` holds its results. The lists are reused between
    /// calls for their capacity.
    pub(crate) fn execute_partitioned(&self, lists: &mut SpmdLists, outputs: &mut Vec<Vec<Buffer>>) -> Result<()> {
        let plugin = &self.client.plugin;
        let n = lists.args.len();
        let num_args = lists.args.first().map_or(0, Vec::len);
        if lists.args.iter().any(|a| a.len() != num_args) {
            return Err(Error::Plan("partitions have different argument counts".into()));
        }
        lists.outs.resize_with(n, Vec::new);
        for o in &mut lists.outs {
            o.clear();
            o.resize(self.num_outputs, std::ptr::null_mut());
        }
        lists.arg_ptrs.clear();
        lists.arg_ptrs.extend(lists.args.iter().map(|a| a.as_ptr()));
        lists.out_ptrs.clear();
        lists.out_ptrs.extend(lists.outs.iter_mut().map(|o| o.as_mut_ptr()));
        lists.events.clear();
        lists.events.resize(n, std::ptr::null_mut());
        let mut options = ffi::PJRT_ExecuteOptions::new();
        let mut exec = ffi::PJRT_LoadedExecutable_Execute_Args::new();
        exec.executable = self.raw;
        exec.options = &mut options;
        exec.argument_lists = lists.arg_ptrs.as_ptr();
        exec.num_devices = n;
        exec.num_args = num_args;
        exec.output_lists = lists.out_ptrs.as_ptr();
        exec.device_complete_events = lists.events.as_mut_ptr();
        let executed = call!(plugin, PJRT_LoadedExecutable_Execute, &mut exec);
        lists.arg_ptrs.clear();
        lists.out_ptrs.clear();
        executed?;
        // Wrap every output first so all are freed whatever fails next.
        outputs.resize_with(n, Vec::new);
        let mut first_error = None;
        for (p, outs) in lists.outs.iter_mut().enumerate() {
            outputs[p].clear();
            for &raw in outs.iter() {
                match Buffer::wrap(&self.client, raw, "PJRT_LoadedExecutable_Execute") {
                    Ok(b) => outputs[p].push(b),
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            outs.clear();
        }
        for &event in &lists.events {
            if let Err(e) = plugin.await_event("PJRT_LoadedExecutable_Execute (device completion)", event) {
                first_error.get_or_insert(e);
            }
        }
        lists.events.clear();
        match first_error {
            Some(e) => {
                outputs.iter_mut().for_each(Vec::clear);
                Err(e)
            }
            None => Ok(()),
        }
    }
}

/// The raw lists of a partitioned execute call: `args[p]` is filled by the
/// caller; the rest is scratch, empty between calls.
#[derive(Default)]
pub(crate) struct SpmdLists {
    pub(crate) args: Vec<Vec<*mut ffi::PJRT_Buffer>>,
    outs: Vec<Vec<*mut ffi::PJRT_Buffer>>,
    arg_ptrs: Vec<*const *mut ffi::PJRT_Buffer>,
    out_ptrs: Vec<*mut *mut ffi::PJRT_Buffer>,
    events: Vec<*mut ffi::PJRT_Event>,
}

// SAFETY: as `ExecuteLists`: the caller clears `args` after each call and the
// rest is cleared before `execute_partitioned` returns.
unsafe impl Send for SpmdLists {}

/// The raw argument and result lists of one execute call, kept between calls
/// for their capacity; empty between calls.
#[derive(Default)]
pub(crate) struct ExecuteLists {
    args: Vec<*mut ffi::PJRT_Buffer>,
    outs: Vec<*mut ffi::PJRT_Buffer>,
}

// SAFETY: the lists hold no pointer between calls (both are cleared before
// `execute_into` returns); only their capacity moves between threads.
unsafe impl Send for ExecuteLists {}

impl Drop for Executable {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_LoadedExecutable_Destroy_Args::new();
        args.executable = self.raw;
        let _ = call!(self.client.plugin, PJRT_LoadedExecutable_Destroy, &mut args);
    }
}

/// An array on a device.
pub struct Buffer {
    client: Arc<Client>,
    raw: *mut ffi::PJRT_Buffer,
}

// SAFETY: see `Plugin`.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

impl Buffer {
    /// The plugin's handle, for argument lists (valid while `self` lives).
    pub(crate) fn raw(&self) -> *mut ffi::PJRT_Buffer {
        self.raw
    }

    fn wrap(client: &Arc<Client>, raw: *mut ffi::PJRT_Buffer, call: &str) -> Result<Buffer> {
        if raw.is_null() {
            return Err(Error::Pjrt { call: call.into(), message: "returned no buffer".into() });
        }
        Ok(Buffer { client: Arc::clone(client), raw })
    }

    /// Bytes the buffer occupies on the host (row-major, dense).
    pub fn host_size(&self) -> Result<usize> {
        let mut args = ffi::PJRT_Buffer_ToHostBuffer_Args::new();
        args.src = self.raw;
        call!(self.client.plugin, PJRT_Buffer_ToHostBuffer, &mut args)?;
        Ok(args.dst_size)
    }

    /// Copies the buffer into `dst`, which must be exactly its host size.
    pub fn to_host(&self, dst: &mut [u8]) -> Result<()> {
        let needed = self.host_size()?;
        if needed != dst.len() {
            return Err(Error::Pjrt {
                call: "PJRT_Buffer_ToHostBuffer".into(),
                message: format!("device buffer holds {needed} bytes, its destination {}", dst.len()),
            });
        }
        let mut args = ffi::PJRT_Buffer_ToHostBuffer_Args::new();
        args.src = self.raw;
        args.dst = dst.as_mut_ptr().cast();
        args.dst_size = dst.len();
        call!(self.client.plugin, PJRT_Buffer_ToHostBuffer, &mut args)?;
        // `dst` stays borrowed until the copy has finished.
        self.client.plugin.await_event("PJRT_Buffer_ToHostBuffer (transfer)", args.event)
    }

    /// Whether the buffer was deleted: an argument an execution took over
    /// (donated, see [`Executable::execute_donating`]) is.
    pub fn is_deleted(&self) -> Result<bool> {
        let mut args = ffi::PJRT_Buffer_IsDeleted_Args::new();
        args.buffer = self.raw;
        call!(self.client.plugin, PJRT_Buffer_IsDeleted, &mut args)?;
        Ok(args.is_deleted)
    }

    /// The address of the buffer's memory on its device, as an integer: two
    /// buffers with the same address share memory (an updated state written
    /// where its old value lay).
    pub fn device_address(&self) -> Result<usize> {
        let mut args = ffi::PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args::new();
        args.buffer = self.raw;
        call!(self.client.plugin, PJRT_Buffer_OpaqueDeviceMemoryDataPointer, &mut args)?;
        Ok(args.device_memory_ptr as usize)
    }

    /// Dimensions as the device reports them.
    pub fn dims(&self) -> Result<Vec<i64>> {
        let mut args = ffi::PJRT_Buffer_Dimensions_Args::new();
        args.buffer = self.raw;
        call!(self.client.plugin, PJRT_Buffer_Dimensions, &mut args)?;
        if args.num_dims == 0 || args.dims.is_null() {
            return Ok(Vec::new());
        }
        // SAFETY: owned by the buffer, alive here.
        Ok(unsafe { std::slice::from_raw_parts(args.dims, args.num_dims) }.to_vec())
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_Buffer_Destroy_Args::new();
        args.buffer = self.raw;
        let _ = call!(self.client.plugin, PJRT_Buffer_Destroy, &mut args);
    }
}
