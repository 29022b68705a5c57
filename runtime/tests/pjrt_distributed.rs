//! Several processes (hosts) over one run: the coordination service, the
//! key-value callbacks of `PJRT_Client_Create`, and the global device list,
//! against a fake plugin. The XLA CPU plugin ignores `node_id`/`num_nodes`
//! and the callbacks (`/work/shared/notes/sharding-pjrt.md` §5), so the fake
//! does what the GPU plugin does at client creation: publish this node's
//! devices under a key, then block in `get` until every other node has
//! published — a rendezvous through kiln's store. Two "hosts" are two threads
//! here, one reaching the store over TCP.
#![cfg(feature = "pjrt")]

use kiln_runtime::pjrt::distributed::{
    mesh_assignment, CoordinationService, Distributed, KvError, KvStore, MemoryKvStore, RemoteKvStore, MAX_KEY_BYTES,
};
use kiln_runtime::pjrt::ffi::{self, ArgsStruct};
use kiln_runtime::pjrt::{Client, ClientOptions, Plugin};
use std::ffi::{c_char, c_int, c_void};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

mod fake {
    //! A PJRT plugin with just enough of the table for client creation.
    use super::*;

    /// Devices per node.
    pub const LOCAL: usize = 2;
    /// How long a node waits for the others at creation.
    pub const WAIT_MS: c_int = 3000;

    struct FakeError(String);

    /// Also its own description.
    pub struct FakeDevice {
        pub id: i32,
        pub process: i32,
        kind: String,
    }

    struct FakeClient {
        node: i32,
        /// Owns the devices (never grown once pointers into it are taken).
        _devices: Vec<FakeDevice>,
        all: Vec<*mut ffi::PJRT_Device>,
        local: Vec<*mut ffi::PJRT_Device>,
    }

    fn error(message: String) -> *mut ffi::PJRT_Error {
        Box::into_raw(Box::new(FakeError(message))).cast()
    }

    /// What the fake gives the caller's callbacks to build its errors with.
    unsafe extern "C" fn callback_error(code: c_int, message: *const c_char, len: usize) -> *mut ffi::PJRT_Error {
        let text = String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(message.cast::<u8>(), len) });
        error(format!("code {code}: {text}"))
    }
    static CALLBACK_ERROR: ffi::PJRT_CallbackError = Some(callback_error);

    unsafe fn take_error(e: *mut ffi::PJRT_Error) -> String {
        unsafe { Box::from_raw(e.cast::<FakeError>()) }.0
    }

    unsafe extern "C" fn error_destroy(args: *mut c_void) {
        let args = unsafe { &mut *args.cast::<ffi::PJRT_Error_Destroy_Args>() };
        drop(unsafe { Box::from_raw(args.error.cast::<FakeError>()) });
    }

    unsafe extern "C" fn error_message(args: *mut c_void) {
        let args = unsafe { &mut *args.cast::<ffi::PJRT_Error_Message_Args>() };
        let e = unsafe { &*args.error.cast::<FakeError>() };
        args.message = e.0.as_ptr().cast();
        args.message_size = e.0.len();
    }

    unsafe extern "C" fn ok(_: *mut c_void) -> *mut ffi::PJRT_Error {
        std::ptr::null_mut()
    }

    /// `get` through the caller's callback; the value copied out, then freed
    /// with the caller's deleter.
    unsafe fn kv_get(create: &ffi::PJRT_Client_Create_Args, key: &str) -> Result<String, String> {
        let mut a = ffi::PJRT_KeyValueGetCallback_Args::new();
        a.key = key.as_ptr().cast();
        a.key_size = key.len();
        a.timeout_in_ms = WAIT_MS;
        a.callback_error = &CALLBACK_ERROR;
        a.user_arg = create.kv_get_user_arg;
        let e = unsafe { (create.kv_get_callback.expect("checked"))(&mut a) };
        if !e.is_null() {
            return Err(unsafe { take_error(e) });
        }
        let v = unsafe { std::slice::from_raw_parts(a.value.cast::<u8>(), a.value_size) };
        let v = String::from_utf8_lossy(v).into_owned();
        unsafe { (a.value_deleter_callback.expect("a deleter with the value"))(a.value) };
        Ok(v)
    }

    unsafe fn kv_try_get(create: &ffi::PJRT_Client_Create_Args, key: &str) -> Result<String, String> {
        let mut a = ffi::PJRT_KeyValueTryGetCallback_Args::new();
        a.key = key.as_ptr().cast();
        a.key_size = key.len();
        a.callback_error = &CALLBACK_ERROR;
        a.user_arg = create.kv_try_get_user_arg;
        let e = unsafe { (create.kv_try_get_callback.expect("checked"))(&mut a) };
        if !e.is_null() {
            return Err(unsafe { take_error(e) });
        }
        let v = String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(a.value.cast::<u8>(), a.value_size) })
            .into_owned();
        unsafe { (a.value_deleter_callback.expect("a deleter with the value"))(a.value) };
        Ok(v)
    }

    unsafe fn kv_put(create: &ffi::PJRT_Client_Create_Args, key: &str, value: &str) -> Result<(), String> {
        let mut a = ffi::PJRT_KeyValuePutCallback_Args::new();
        a.key = key.as_ptr().cast();
        a.key_size = key.len();
        a.value = value.as_ptr().cast();
        a.value_size = value.len();
        a.callback_error = &CALLBACK_ERROR;
        a.user_arg = create.kv_put_user_arg;
        let e = unsafe { (create.kv_put_callback.expect("checked"))(&mut a) };
        if e.is_null() {
            Ok(())
        } else {
            Err(unsafe { take_error(e) })
        }
    }

    fn option(create: &ffi::PJRT_Client_Create_Args, name: &str) -> Option<i64> {
        (0..create.num_options).find_map(|i| {
            let v = unsafe { &*create.create_options.add(i) };
            let n = unsafe { std::slice::from_raw_parts(v.name.cast::<u8>(), v.name_size) };
            (n == name.as_bytes() && v.value_type == ffi::PJRT_NamedValue_kInt64).then_some(v.value)
        })
    }

    unsafe extern "C" fn client_create(args: *mut c_void) -> *mut ffi::PJRT_Error {
        let create = unsafe { &mut *args.cast::<ffi::PJRT_Client_Create_Args>() };
        let (Some(node), Some(nodes)) = (option(create, "node_id"), option(create, "num_nodes")) else {
            return error("the fake plugin needs node_id and num_nodes".into());
        };
        // As the GPU plugin: no store unless all three callbacks are set.
        if create.kv_get_callback.is_none() || create.kv_put_callback.is_none() || create.kv_try_get_callback.is_none()
        {
            return error("the fake plugin needs all three key-value callbacks".into());
        }
        let mine = format!("devices/{node}");
        let result = (|| unsafe {
            match kv_try_get(create, &mine) {
                Err(e) if e.starts_with("code 5:") => {}
                other => return Err(format!("try_get of an unset key gave {other:?}")),
            }
            kv_put(create, &mine, &LOCAL.to_string())?;
            if kv_try_get(create, &mine)? != LOCAL.to_string() {
                return Err("try_get does not read back a put".into());
            }
            let mut counts = Vec::new();
            for other in 0..nodes {
                let n: usize = kv_get(create, &format!("devices/{other}"))?.parse().map_err(|e| format!("{e}"))?;
                counts.push(n);
            }
            Ok(counts)
        })();
        let counts = match result {
            Ok(c) => c,
            Err(e) => return error(format!("node {node}: {e}")),
        };
        let mut devices = Vec::new();
        for (p, &n) in counts.iter().enumerate() {
            for i in 0..n {
                let id = (p * 10 + i) as i32;
                devices.push(FakeDevice { id, process: p as i32, kind: format!("fake v1 (host {p})") });
            }
        }
        let ptr = |d: &FakeDevice| (d as *const FakeDevice).cast_mut().cast::<ffi::PJRT_Device>();
        let all: Vec<_> = devices.iter().map(ptr).collect();
        let local: Vec<_> = devices.iter().filter(|d| i64::from(d.process) == node).map(ptr).collect();
        let client = FakeClient { node: node as i32, _devices: devices, all, local };
        create.client = Box::into_raw(Box::new(client)).cast();
        std::ptr::null_mut()
    }

    unsafe extern "C" fn client_destroy(args: *mut c_void) -> *mut ffi::PJRT_Error {
        let args = unsafe { &mut *args.cast::<ffi::PJRT_Client_Destroy_Args>() };
        drop(unsafe { Box::from_raw(args.client.cast::<FakeClient>()) });
        std::ptr::null_mut()
    }

    fn client<'a>(raw: *mut ffi::PJRT_Client) -> &'a FakeClient {
        unsafe { &*raw.cast::<FakeClient>() }
    }

    unsafe extern "C" fn platform_name(args: *mut c_void) -> *mut ffi::PJRT_Error {
        let args = unsafe { &mut *args.cast::<ffi::PJRT_Client_PlatformName_Args>() };
        args.platform_name = "fake".as_ptr().cast();
        args.platform_name_size = 4;
        std::ptr::null_mut()
    }

    unsafe extern "C" fn platform_version(args: *mut c_void) -> *mut ffi::PJRT_Error {
        let args = unsafe { &mut *args.cast::<ffi::PJRT_Client_PlatformVersion_Args>() };
        args.platform_version = "0".as_ptr().cast();
        args.platform_version_size = 1;
        std::ptr::null_mut()
    }

    unsafe extern "C" fn process_index(args: *mut c_void) -> *mut ffi::PJRT_Error {
        let args = unsafe { &mut *args.cast::<ffi::PJRT_Client_ProcessIndex_Args>() };
        args.process_index = client(args.client).node;
        std::ptr::null_mut()
    }

    unsafe extern "C" fn devices(args: *mut c_void) -> *mut ffi::PJRT_Error {
        let args = unsafe { &mut *args.cast::<ffi::PJRT_Client_Devices_Args>() };
        let c = client(args.client);
        args.devices = c.all.as_ptr();
        args.num_devices = c.all.len();
        std::ptr::null_mut()
    }

    unsafe extern "C" fn addressable_devices(args: *mut c_void) -> *mut ffi::PJRT_Error {
        let args = unsafe { &mut *args.cast::<ffi::PJRT_Client_AddressableDevices_Args>() };
        let c = client(args.client);
        args.addressable_devices = c.local.as_ptr();
        args.num_addressable_devices = c.local.len();
        std::ptr::null_mut()
    }

    fn device<'a>(raw: *mut ffi::PJRT_DeviceDescription) -> &'a FakeDevice {
        unsafe { &*raw.cast::<FakeDevice>() }
    }

    unsafe extern "C" fn get_description(args: *mut c_void) -> *mut ffi::PJRT_Error {
        let args = unsafe { &mut *args.cast::<ffi::PJRT_Device_GetDescription_Args>() };
        args.device_description = args.device.cast();
        std::ptr::null_mut()
    }

    unsafe extern "C" fn description_id(args: *mut c_void) -> *mut ffi::PJRT_Error {
        let args = unsafe { &mut *args.cast::<ffi::PJRT_DeviceDescription_Id_Args>() };
        args.id = device(args.device_description).id;
        std::ptr::null_mut()
    }

    unsafe extern "C" fn description_kind(args: *mut c_void) -> *mut ffi::PJRT_Error {
        let args = unsafe { &mut *args.cast::<ffi::PJRT_DeviceDescription_Kind_Args>() };
        let d = device(args.device_description);
        args.device_kind = d.kind.as_ptr().cast();
        args.device_kind_size = d.kind.len();
        std::ptr::null_mut()
    }

    unsafe extern "C" fn description_process(args: *mut c_void) -> *mut ffi::PJRT_Error {
        let args = unsafe { &mut *args.cast::<ffi::PJRT_DeviceDescription_ProcessIndex_Args>() };
        args.process_index = device(args.device_description).process;
        std::ptr::null_mut()
    }

    // Execution, enough for a session over a sharded artifact: every
    // executable computes one output, the elementwise f32 sum of its
    // arguments (the pieces each partition holds); buffers are host bytes.

    /// Per execute call: (node, partitions executed).
    pub static EXECUTED: std::sync::Mutex<Vec<(i32, usize)>> = std::sync::Mutex::new(Vec::new());

    struct FakeExe {
        node: i32,
    }

    struct FakeBuffer {
        data: Vec<u8>,
    }

    unsafe extern "C" fn compile(args: *mut c_void) -> *mut ffi::PJRT_Error {
        let args = unsafe { &mut *args.cast::<ffi::PJRT_Client_Compile_Args>() };
        let node = client(args.client).node;
        args.executable = Box::into_raw(Box::new(FakeExe { node })).cast();
        std::ptr::null_mut()
    }

    /// The loaded executable is its own executable (destroying that is a no-op).
    unsafe extern "C" fn get_executable(args: *mut c_void) -> *mut ffi::PJRT_Error {
        let args = unsafe { &mut *args.cast::<ffi::PJRT_LoadedExecutable_GetExecutable_Args>() };
        args.executable = args.loaded_executable.cast();
        std::ptr::null_mut()
    }

    unsafe extern "C" fn num_outputs(args: *mut c_void) -> *mut ffi::PJRT_Error {
        let args = unsafe { &mut *args.cast::<ffi::PJRT_Executable_NumOutputs_Args>() };
        args.num_outputs = 1;
        std::ptr::null_mut()
    }

    unsafe extern "C" fn loaded_destroy(args: *mut c_void) -> *mut ffi::PJRT_Error {
        let args = unsafe { &mut *args.cast::<ffi::PJRT_LoadedExecutable_Destroy_Args>() };
        drop(unsafe { Box::from_raw(args.executable.cast::<FakeExe>()) });
        std::ptr::null_mut()
    }

    unsafe extern "C" fn from_host(args: *mut c_void) -> *mut ffi::PJRT_Error {
        let args = unsafe { &mut *args.cast::<ffi::PJRT_Client_BufferFromHostBuffer_Args>() };
        if args.buffer_type != ffi::PJRT_Buffer_Type_F32 {
            return error("the fake plugin holds f32 only".into());
        }
        let dims = unsafe { std::slice::from_raw_parts(args.dims, args.num_dims) };
        let bytes = dims.iter().product::<i64>() as usize * 4;
        let data = unsafe { std::slice::from_raw_parts(args.data.cast::<u8>(), bytes) }.to_vec();
        args.buffer = Box::into_raw(Box::new(FakeBuffer { data })).cast();
        args.done_with_host_buffer = std::ptr::null_mut();
        std::ptr::null_mut()
    }

    unsafe extern "C" fn to_host(args: *mut c_void) -> *mut ffi::PJRT_Error {
        let args = unsafe { &mut *args.cast::<ffi::PJRT_Buffer_ToHostBuffer_Args>() };
        let b = unsafe { &*args.src.cast::<FakeBuffer>() };
        if args.dst.is_null() {
            args.dst_size = b.data.len();
        } else {
            unsafe { std::slice::from_raw_parts_mut(args.dst.cast::<u8>(), args.dst_size) }.copy_from_slice(&b.data);
        }
        args.event = std::ptr::null_mut();
        std::ptr::null_mut()
    }

    unsafe extern "C" fn buffer_destroy(args: *mut c_void) -> *mut ffi::PJRT_Error {
        let args = unsafe { &mut *args.cast::<ffi::PJRT_Buffer_Destroy_Args>() };
        drop(unsafe { Box::from_raw(args.buffer.cast::<FakeBuffer>()) });
        std::ptr::null_mut()
    }

    unsafe extern "C" fn execute(args: *mut c_void) -> *mut ffi::PJRT_Error {
        let args = unsafe { &mut *args.cast::<ffi::PJRT_LoadedExecutable_Execute_Args>() };
        let exe = unsafe { &*args.executable.cast::<FakeExe>() };
        EXECUTED.lock().unwrap_or_else(|p| p.into_inner()).push((exe.node, args.num_devices));
        for d in 0..args.num_devices {
            let list = unsafe { std::slice::from_raw_parts(*args.argument_lists.add(d), args.num_args) };
            let mut sum: Vec<f32> = Vec::new();
            for &b in list {
                let b = unsafe { &*b.cast::<FakeBuffer>() };
                let v: Vec<f32> =
                    b.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
                if sum.is_empty() {
                    sum = v;
                } else if sum.len() != v.len() {
                    return error("the fake plugin adds arguments of one size".into());
                } else {
                    sum.iter_mut().zip(v).for_each(|(s, x)| *s += x);
                }
            }
            let data = sum.iter().flat_map(|x| x.to_le_bytes()).collect();
            let out = Box::into_raw(Box::new(FakeBuffer { data })).cast();
            unsafe { *(*args.output_lists.add(d)) = out };
        }
        std::ptr::null_mut()
    }

    struct Table(ffi::Api);
    // SAFETY: the table is immutable once built; its one pointer is null.
    unsafe impl Sync for Table {}
    unsafe impl Send for Table {}
    static TABLE: OnceLock<Table> = OnceLock::new();

    pub unsafe extern "C" fn get_api() -> *const c_void {
        let t = TABLE.get_or_init(|| {
            // SAFETY: every field is an integer, a null pointer or `None`.
            let mut api: ffi::Api = unsafe { std::mem::zeroed() };
            api.struct_size = std::mem::size_of::<ffi::Api>();
            api.pjrt_api_version.struct_size = std::mem::size_of::<ffi::PJRT_Api_Version>();
            api.pjrt_api_version.major_version = 0;
            api.pjrt_api_version.minor_version = 81;
            api.PJRT_Error_Destroy = Some(error_destroy);
            api.PJRT_Error_Message = Some(error_message);
            api.PJRT_Plugin_Initialize = Some(ok);
            api.PJRT_Client_Create = Some(client_create);
            api.PJRT_Client_Destroy = Some(client_destroy);
            api.PJRT_Client_PlatformName = Some(platform_name);
            api.PJRT_Client_PlatformVersion = Some(platform_version);
            api.PJRT_Client_ProcessIndex = Some(process_index);
            api.PJRT_Client_Devices = Some(devices);
            api.PJRT_Client_AddressableDevices = Some(addressable_devices);
            api.PJRT_Device_GetDescription = Some(get_description);
            api.PJRT_DeviceDescription_Id = Some(description_id);
            api.PJRT_DeviceDescription_Kind = Some(description_kind);
            api.PJRT_DeviceDescription_ProcessIndex = Some(description_process);
            api.PJRT_Client_Compile = Some(compile);
            api.PJRT_LoadedExecutable_GetExecutable = Some(get_executable);
            api.PJRT_Executable_NumOutputs = Some(num_outputs);
            api.PJRT_Executable_Destroy = Some(ok);
            api.PJRT_LoadedExecutable_Destroy = Some(loaded_destroy);
            api.PJRT_Client_BufferFromHostBuffer = Some(from_host);
            api.PJRT_Buffer_ToHostBuffer = Some(to_host);
            api.PJRT_Buffer_Destroy = Some(buffer_destroy);
            api.PJRT_LoadedExecutable_Execute = Some(execute);
            Table(api)
        });
        (&t.0 as *const ffi::Api).cast()
    }
}

fn fake_plugin() -> Arc<Plugin> {
    // SAFETY: `fake::get_api` returns a static table honouring the header for
    // the entries it fills.
    unsafe { Plugin::from_static("fake-multihost", fake::get_api) }.expect("the fake plugin loads")
}

fn options(node_id: u32, num_nodes: u32, store: Arc<dyn KvStore>) -> ClientOptions {
    ClientOptions { distributed: Some(Distributed::new(node_id, num_nodes, store)), ..ClientOptions::default() }
}

#[test]
fn two_hosts_meet_through_the_coordination_service() {
    let plugin = fake_plugin();
    let service = CoordinationService::start("127.0.0.1:0").expect("coordination service");
    let addr = service.addr();
    // Host 1 reaches the store over TCP and waits in `get` for host 0.
    let host1 = {
        let plugin = Arc::clone(&plugin);
        std::thread::spawn(move || Client::create(&plugin, &options(1, 2, Arc::new(RemoteKvStore::new(addr)))))
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(!host1.is_finished(), "host 1 must wait for host 0 to publish");
    let store: Arc<dyn KvStore> = Arc::clone(service.store()) as Arc<dyn KvStore>;
    let host0 = Client::create(&plugin, &options(0, 2, store)).expect("host 0");
    let host1 = host1.join().expect("host 1 thread").expect("host 1");

    for (p, client) in [(0, &host0), (1, &host1)] {
        assert_eq!(client.process_index(), p);
        let local: Vec<i32> = client.devices().iter().map(|d| d.id).collect();
        assert_eq!(local, [p * 10, p * 10 + 1], "host {p}'s addressable devices");
        let global: Vec<(i32, i32, Option<usize>)> =
            client.global_devices().iter().map(|d| (d.id, d.process_index, d.addressable)).collect();
        let at = |proc: i32, i: usize| if proc == p { Some(i) } else { None };
        assert_eq!(global, [(0, 0, at(0, 0)), (1, 0, at(0, 1)), (10, 1, at(1, 0)), (11, 1, at(1, 1))], "host {p}");
    }
    // The plugin's keys are kept apart from other plugins' under its name.
    let keys = service.store().keys();
    assert_eq!(keys, ["kiln/static:fake-multihost/devices/0", "kiln/static:fake-multihost/devices/1"]);

    // A mesh over both hosts: partitions 0-1 on host 0, 2-3 on host 1.
    let placed = mesh_assignment(4, &[], host1.global_devices()).expect("4 devices");
    let on_host1: Vec<usize> =
        placed.iter().enumerate().filter(|(_, d)| d.addressable.is_some()).map(|(p, _)| p).collect();
    assert_eq!(placed.iter().map(|d| d.id).collect::<Vec<_>>(), [0, 1, 10, 11]);
    assert_eq!(on_host1, [2, 3]);
    let named = mesh_assignment(2, &[11, 0], host1.global_devices()).expect("named devices");
    assert_eq!(named.iter().map(|d| (d.id, d.process_index)).collect::<Vec<_>>(), [(11, 1), (0, 0)]);
    let err = mesh_assignment(8, &[], host1.global_devices()).expect_err("too few devices");
    assert!(err.contains("sharded over 8 devices but the run has 4"), "{err}");
    let err = mesh_assignment(2, &[0, 7], host1.global_devices()).expect_err("unknown device");
    assert!(err.contains("device 7"), "{err}");
}

#[test]
fn a_missing_host_fails_creation_with_the_key_it_waited_for() {
    let plugin = fake_plugin();
    let store: Arc<dyn KvStore> = Arc::new(MemoryKvStore::new());
    let start = Instant::now();
    let err = Client::create(&plugin, &options(0, 2, store)).err().expect("host 1 never comes");
    let text = err.to_string();
    assert!(text.contains("devices/1") && text.contains("did not appear"), "{text}");
    assert!(start.elapsed() >= Duration::from_millis(fake::WAIT_MS as u64 - 100), "get must block until its timeout");
}

#[test]
fn bad_node_ids_and_missing_options_are_errors() {
    let plugin = fake_plugin();
    let store: Arc<dyn KvStore> = Arc::new(MemoryKvStore::new());
    let err = Client::create(&plugin, &options(2, 2, store)).err().expect("node 2 of 2");
    assert!(err.to_string().contains("node_id 2 is not below num_nodes 2"), "{err}");
    let err = Client::create(&plugin, &ClientOptions::default()).err().expect("no distributed options");
    assert!(err.to_string().contains("needs node_id and num_nodes"), "{err}");
}

#[test]
fn the_coordination_service_stores_blocks_and_bounds() {
    let service = CoordinationService::start("127.0.0.1:0").expect("service");
    let remote = RemoteKvStore::new(service.addr());
    assert_eq!(remote.try_get("a"), Err(KvError::NotFound("a".into())));
    let t = Instant::now();
    assert!(matches!(remote.get("a", Duration::from_millis(150)), Err(KvError::Timeout { .. })));
    assert!(t.elapsed() >= Duration::from_millis(150));
    // A get waiting on another connection sees a later put.
    let waiter = {
        let remote = remote.clone();
        std::thread::spawn(move || remote.get("b", Duration::from_secs(10)))
    };
    std::thread::sleep(Duration::from_millis(100));
    remote.put("b", b"\x00\xffvalue").expect("put");
    assert_eq!(waiter.join().expect("thread").expect("get"), b"\x00\xffvalue");
    assert_eq!(remote.try_get("b").expect("set"), b"\x00\xffvalue");
    remote.put("b", b"").expect("overwrite with empty");
    assert_eq!(remote.get("b", Duration::ZERO).expect("empty value"), b"");

    // Bounds: refused before anything is sent or allocated.
    let long = "k".repeat(MAX_KEY_BYTES + 1);
    assert!(matches!(remote.put(&long, b"v"), Err(KvError::Store(_))));
    // A peer speaking garbage, or announcing a 2 GiB value, gets nothing
    // allocated and the service keeps serving.
    for junk in [&b"Z\x01\x00\x00\x00k"[..], &b"P\x01\x00\x00\x00k\x00\x00\x00\x80"[..], &b"G\xff\xff\xff\xff"[..]] {
        let mut s = TcpStream::connect(service.addr()).expect("connect");
        s.write_all(junk).expect("send");
        s.shutdown(std::net::Shutdown::Write).expect("half-close");
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        assert!(answer.is_empty() || answer[0] == 3, "junk {junk:?} answered {answer:?}");
    }
    remote.put("c", b"still serving").expect("put after junk");
    assert_eq!(remote.try_get("c").expect("get after junk"), b"still serving");
    drop(service);
    let mut gone = RemoteKvStore::new(remote_addr_of_closed());
    gone.connect_timeout = Duration::from_millis(200);
    assert!(matches!(gone.try_get("a"), Err(KvError::Store(m)) if m.contains("cannot reach")));
}

/// Dropping the service (node 0's process ending) waits for a request it is
/// still answering, so a peer's last put is answered before the process can
/// exit; a request that never ends is given up after the drain bound.
#[test]
fn dropping_the_service_waits_for_requests_in_flight() {
    let service = CoordinationService::start("127.0.0.1:0").expect("service");
    let remote = RemoteKvStore::new(service.addr());
    // A get that is answered (a timeout) 600 ms after it arrives.
    let waiter = std::thread::spawn(move || remote.get("never", Duration::from_millis(600)));
    std::thread::sleep(Duration::from_millis(150));
    let t = Instant::now();
    drop(service);
    // The drop returned after the answer was written (≈ 450 ms here), not at
    // once, and the peer got its answer instead of a closed connection.
    assert!(t.elapsed() >= Duration::from_millis(300), "drop returned after {:?}", t.elapsed());
    assert!(matches!(waiter.join().expect("thread"), Err(KvError::Timeout { .. })));
}

/// An address nothing listens at (a port bound, then released).
fn remote_addr_of_closed() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

/// Sessions over a sharded artifact, one per "host": `y = x + b` on a mesh
/// `x=4` (partitions 0–1 on host 0's devices, 2–3 on host 1's), every
/// tensor split over rows, so each host computes half of `y` and fetches the
/// other half from the store.
mod sessions {
    use super::*;
    use kiln_runtime::format::*;
    use kiln_runtime::{Device, ExecutableCache, Program, SessionOptions, Tensor};

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn x_values() -> Vec<f32> {
        (0..12).map(|i| i as f32 * 0.5 - 2.0).collect()
    }

    fn b_values() -> Vec<f32> {
        (0..12).map(|i| (i * i) as f32 - 7.0).collect()
    }

    /// The artifact; `variant` changes the module's text (another program).
    pub fn add_artifact(variant: &str) -> Vec<u8> {
        let mut weights = WeightsBuilder::new();
        let b = weights.push(&f32s(&b_values()));
        let t = |storage| TensorDecl { dtype: DType::F32, shape: vec![DimRef::Static(4), DimRef::Static(3)], storage };
        let plan = Plan {
            symbols: vec![],
            exprs: vec![],
            tensors: vec![
                t(Storage::Arena { offset: 0, max_bytes: 48 }),
                t(b),
                t(Storage::Arena { offset: 64, max_bytes: 48 }),
            ],
            inputs: vec![IoDecl { name: "x".into(), tensor: 0, complex: false }],
            outputs: vec![IoDecl { name: "y".into(), tensor: 2, complex: false }],
            instrs: vec![Instr {
                op: InstrOp::Delegate { segment: 0 },
                inputs: vec![0, 1],
                outputs: vec![2],
                origin: "segment 0".into(),
            }],
            arena_bytes: 128,
            peak_live_bytes: 128,
            states: vec![],
        };
        let rows = || TensorSharding { dims: vec![vec![0], vec![]] };
        let s = r#"{sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}"#;
        let mlir = format!(
            r#"module {{
  "sdy.mesh"() {{sym_name = "mesh", mesh = #sdy.mesh<["x"=4]>}} : () -> ()
  func.func @main(%x: tensor<4x3xf32> {s}, %b: tensor<4x3xf32> {s}) -> (tensor<4x3xf32> {s}) {{
    %0 = "stablehlo.add"(%x, %b) : (tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<4x3xf32>
    "func.return"(%0) : (tensor<4x3xf32>) -> (){variant}
  }}
}}
"#
        );
        let accel = AccelProgram {
            segments: vec![AccelSegment {
                mlir,
                args: vec![0, 1],
                results: vec![2],
                ops: vec!["add".into()],
                arg_shardings: vec![rows(), rows()],
                result_shardings: vec![rows()],
                index_checks: vec![],
            }],
            cpu_fallbacks: vec![],
            mesh: Some(MeshDecl { axes: vec![MeshAxisDecl { name: "x".into(), size: 4 }], devices: vec![] }),
            buckets: vec![],
            estimate: None,
        };
        let mut writer = ArtifactWriter::new(&plan, weights, &Metadata::default()).expect("writer");
        writer.add_accel(&accel).expect("accel");
        writer.to_bytes()
    }

    fn options(node: u32, store: Arc<dyn KvStore>, timeout: Duration) -> SessionOptions {
        SessionOptions {
            device: Device::Pjrt("static:fake-multihost".into()),
            cache: ExecutableCache::Off,
            distributed: Some(Distributed { timeout, ..Distributed::new(node, 2, store) }),
            ..SessionOptions::default()
        }
    }

    /// Runs the artifact twice in one session; the first run's `y`.
    pub fn run(artifact: &[u8], opts: &SessionOptions) -> Result<Vec<u8>, kiln_runtime::Error> {
        let program = Program::from_bytes(artifact)?;
        let mut session = program.session_with(opts)?;
        let x = Tensor::from_f32(&[4, 3], &x_values());
        let first = session.run(&[x.view()])?.to_tensors();
        let again = session.run(&[x.view()])?.to_tensors();
        assert_eq!(first[0].data, again[0].data, "a second run gives the same bytes");
        Ok(first[0].data.clone())
    }

    #[test]
    fn two_hosts_each_execute_their_partitions_and_return_the_whole_output() {
        fake_plugin();
        let service = CoordinationService::start("127.0.0.1:0").expect("service");
        let artifact = add_artifact("");
        let stores: [Arc<dyn KvStore>; 2] =
            [Arc::clone(service.store()) as Arc<dyn KvStore>, Arc::new(RemoteKvStore::new(service.addr()))];
        let hosts: Vec<_> = stores
            .into_iter()
            .enumerate()
            .map(|(node, store)| {
                let artifact = artifact.clone();
                std::thread::spawn(move || run(&artifact, &options(node as u32, store, Duration::from_secs(20))))
            })
            .collect();
        let expected: Vec<f32> = x_values().iter().zip(b_values()).map(|(x, b)| x + b).collect();
        let results: Vec<_> = hosts.into_iter().map(|h| h.join().expect("thread")).collect();
        for (node, y) in results.into_iter().enumerate().rev() {
            let y = y.unwrap_or_else(|e| panic!("host {node}: {e}"));
            assert_eq!(y, f32s(&expected), "host {node}");
        }
        // Each host executed its own two partitions, once per run.
        let executed = fake::EXECUTED.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for node in [0, 1] {
            assert_eq!(executed.iter().filter(|e| **e == (node, 2)).count(), 2, "host {node}: {executed:?}");
        }
        // Each host published its half of `y` for each run, put for the one
        // other host: every piece (and launch record) is gone after its read.
        let keys: Vec<String> = service.store().keys().into_iter().filter(|k| k.starts_with("kiln/run/")).collect();
        assert_eq!(keys, Vec::<String>::new());

        // One process over the XLA CPU plugin's four devices runs the same
        // artifact to the same bytes (when the plugin is at hand).
        if let Some(plugin) = std::env::var_os("KILN_TEST_XLA_CPU_PLUGIN").filter(|v| !v.is_empty()) {
            let opts = SessionOptions {
                device: Device::Pjrt(plugin.into()),
                cache: ExecutableCache::Off,
                ..SessionOptions::default()
            };
            let y = run(&artifact, &opts).unwrap_or_else(|e| panic!("one process: {e}"));
            assert_eq!(y, f32s(&expected), "one process on the XLA CPU plugin");
        }
    }

    /// A plugin that ignores `num_nodes` (the XLA CPU plugin) gives node 1
    /// every device: it runs the whole mesh with no launch check or exchange.
    #[test]
    fn a_plugin_giving_every_process_all_devices_runs_the_mesh_locally() {
        let Some(plugin) = std::env::var_os("KILN_TEST_XLA_CPU_PLUGIN").filter(|v| !v.is_empty()) else {
            eprintln!("skipping: set KILN_TEST_XLA_CPU_PLUGIN to run this test");
            return;
        };
        let store = Arc::new(MemoryKvStore::new());
        let opts = SessionOptions {
            device: Device::Pjrt(plugin.into()),
            ..options(1, Arc::clone(&store) as Arc<dyn KvStore>, Duration::from_millis(100))
        };
        let y = run(&add_artifact(""), &opts).unwrap_or_else(|e| panic!("{e}"));
        let expected: Vec<f32> = x_values().iter().zip(b_values()).map(|(x, b)| x + b).collect();
        assert_eq!(y, f32s(&expected));
        assert!(store.keys().iter().all(|k| !k.starts_with("kiln/run/")), "{:?}", store.keys());
    }

    #[test]
    fn hosts_running_different_programs_are_refused() {
        fake_plugin();
        let store: Arc<dyn KvStore> = Arc::new(MemoryKvStore::new());
        let hosts: Vec<_> = ["", "\n    // another program"]
            .into_iter()
            .enumerate()
            .map(|(node, variant)| {
                let (artifact, store) = (add_artifact(variant), Arc::clone(&store));
                std::thread::spawn(move || run(&artifact, &options(node as u32, store, Duration::from_secs(20))))
            })
            .collect();
        let results: Vec<_> = hosts.into_iter().map(|h| h.join().expect("thread")).collect();
        for (node, r) in results.into_iter().enumerate().rev() {
            let err = r.expect_err("different programs").to_string();
            let other = 1 - node;
            assert!(err.contains(&format!("process {other} launched a different program")), "host {node}: {err}");
        }
    }

    #[test]
    fn a_host_that_never_starts_its_session_times_out() {
        let plugin = fake_plugin();
        let store: Arc<dyn KvStore> = Arc::new(MemoryKvStore::new());
        // Host 1 creates its client (the rendezvous) but no session.
        let host1 = {
            let (plugin, store) = (Arc::clone(&plugin), Arc::clone(&store));
            std::thread::spawn(move || Client::create(&plugin, &super::options(1, 2, store)))
        };
        let started = Instant::now();
        let err = run(&add_artifact(""), &options(0, store, Duration::from_millis(300)))
            .expect_err("host 1 never starts")
            .to_string();
        assert!(err.contains("process 1 did not start distributed session 0 within 300ms"), "{err}");
        assert!(started.elapsed() >= Duration::from_millis(300));
        host1.join().expect("thread").expect("host 1's client");
    }
}
