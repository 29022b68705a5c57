//! `#[repr(C)]` mirror of the subset of `pjrt_c_api.h` that kiln uses,
//! written by hand from the header shipped in the `xla-cpu-pjrt` 0.0.1 wheel
//! (PJRT C API 0.81).
//!
//! Versioning rules this module relies on (see `/work/shared/notes/pjrt-mlir.md`):
//! - fields are only ever appended, to the function table and to every args
//!   struct, so a prefix of a newer struct is an older struct;
//! - a plugin rejects an args struct whose `struct_size` is *smaller* than its
//!   own, and ignores the tail of a larger one. Every struct here therefore
//!   carries its full 0.81 size, and a plugin newer than 0.81 may refuse calls
//!   whose structs grew since (it says so in its error message);
//! - the function table is never copied: it is read in place through the
//!   plugin's pointer, and each entry is used only when the plugin's
//!   `struct_size` says the entry exists ([`Api::has`]).

#![allow(non_snake_case, non_camel_case_types, non_upper_case_globals, dead_code)]

use std::ffi::{c_char, c_int, c_void};

/// The header these structs were written from.
pub const HEADER_MAJOR: i32 = 0;
pub const HEADER_MINOR: i32 = 81;

/// Opaque plugin objects.
pub enum PJRT_Error {}
pub enum PJRT_Client {}
pub enum PJRT_Device {}
pub enum PJRT_DeviceDescription {}
pub enum PJRT_Memory {}
pub enum PJRT_Executable {}
pub enum PJRT_LoadedExecutable {}
pub enum PJRT_Buffer {}
pub enum PJRT_Event {}
pub enum PJRT_SerializedExecutable {}

/// Every function in the table but two takes its args struct and returns an
/// owned error (null on success).
pub type ApiFn = unsafe extern "C" fn(*mut c_void) -> *mut PJRT_Error;
/// `PJRT_Error_Destroy` and `PJRT_Error_Message` return nothing.
pub type VoidFn = unsafe extern "C" fn(*mut c_void);

/// All args structs start with their size and an extension chain (unused here).
pub trait ArgsStruct: Sized {
    /// A zeroed struct (null pointers, zero sizes: "not set" in PJRT) with
    /// `struct_size` filled in.
    fn new() -> Self;
}

macro_rules! pjrt_struct {
    ($(#[$m:meta])* $name:ident { $($field:ident : $ty:ty),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        pub struct $name {
            pub struct_size: usize,
            pub extension_start: *mut c_void,
            $(pub $field: $ty,)*
        }
        impl ArgsStruct for $name {
            fn new() -> Self {
                // SAFETY: every field is an integer, a raw pointer or an
                // `Option` of a function pointer, for all of which zero is valid.
                let mut s: $name = unsafe { std::mem::zeroed() };
                s.struct_size = std::mem::size_of::<$name>();
                s
            }
        }
    };
}

pjrt_struct!(PJRT_Api_Version { major_version: c_int, minor_version: c_int });

/// The head of `PJRT_Api` up to the version, readable before anything else is
/// known about the plugin.
#[repr(C)]
pub struct ApiHead {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub pjrt_api_version: PJRT_Api_Version,
}

/// `PJRT_Api` as of 0.81. Only entries below the plugin's `struct_size` exist.
#[repr(C)]
pub struct Api {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub pjrt_api_version: PJRT_Api_Version,
    pub PJRT_Error_Destroy: Option<VoidFn>,
    pub PJRT_Error_Message: Option<VoidFn>,
    pub PJRT_Error_GetCode: Option<ApiFn>,
    pub PJRT_Plugin_Initialize: Option<ApiFn>,
    pub PJRT_Plugin_Attributes: Option<ApiFn>,
    pub PJRT_Event_Destroy: Option<ApiFn>,
    pub PJRT_Event_IsReady: Option<ApiFn>,
    pub PJRT_Event_Error: Option<ApiFn>,
    pub PJRT_Event_Await: Option<ApiFn>,
    pub PJRT_Event_OnReady: Option<ApiFn>,
    pub PJRT_Client_Create: Option<ApiFn>,
    pub PJRT_Client_Destroy: Option<ApiFn>,
    pub PJRT_Client_PlatformName: Option<ApiFn>,
    pub PJRT_Client_ProcessIndex: Option<ApiFn>,
    pub PJRT_Client_PlatformVersion: Option<ApiFn>,
    pub PJRT_Client_Devices: Option<ApiFn>,
    pub PJRT_Client_AddressableDevices: Option<ApiFn>,
    pub PJRT_Client_LookupDevice: Option<ApiFn>,
    pub PJRT_Client_LookupAddressableDevice: Option<ApiFn>,
    pub PJRT_Client_AddressableMemories: Option<ApiFn>,
    pub PJRT_Client_Compile: Option<ApiFn>,
    pub PJRT_Client_DefaultDeviceAssignment: Option<ApiFn>,
    pub PJRT_Client_BufferFromHostBuffer: Option<ApiFn>,
    pub PJRT_DeviceDescription_Id: Option<ApiFn>,
    pub PJRT_DeviceDescription_ProcessIndex: Option<ApiFn>,
    pub PJRT_DeviceDescription_Attributes: Option<ApiFn>,
    pub PJRT_DeviceDescription_Kind: Option<ApiFn>,
    pub PJRT_DeviceDescription_DebugString: Option<ApiFn>,
    pub PJRT_DeviceDescription_ToString: Option<ApiFn>,
    pub PJRT_Device_GetDescription: Option<ApiFn>,
    pub PJRT_Device_IsAddressable: Option<ApiFn>,
    pub PJRT_Device_LocalHardwareId: Option<ApiFn>,
    pub PJRT_Device_AddressableMemories: Option<ApiFn>,
    pub PJRT_Device_DefaultMemory: Option<ApiFn>,
    pub PJRT_Device_MemoryStats: Option<ApiFn>,
    pub PJRT_Memory_Id: Option<ApiFn>,
    pub PJRT_Memory_Kind: Option<ApiFn>,
    pub PJRT_Memory_DebugString: Option<ApiFn>,
    pub PJRT_Memory_ToString: Option<ApiFn>,
    pub PJRT_Memory_AddressableByDevices: Option<ApiFn>,
    pub PJRT_Executable_Destroy: Option<ApiFn>,
    pub PJRT_Executable_Name: Option<ApiFn>,
    pub PJRT_Executable_NumReplicas: Option<ApiFn>,
    pub PJRT_Executable_NumPartitions: Option<ApiFn>,
    pub PJRT_Executable_NumOutputs: Option<ApiFn>,
    pub PJRT_Executable_SizeOfGeneratedCodeInBytes: Option<ApiFn>,
    pub PJRT_Executable_GetCostAnalysis: Option<ApiFn>,
    pub PJRT_Executable_OutputMemoryKinds: Option<ApiFn>,
    pub PJRT_Executable_OptimizedProgram: Option<ApiFn>,
    pub PJRT_Executable_Serialize: Option<ApiFn>,
    pub PJRT_LoadedExecutable_Destroy: Option<ApiFn>,
    pub PJRT_LoadedExecutable_GetExecutable: Option<ApiFn>,
    pub PJRT_LoadedExecutable_AddressableDevices: Option<ApiFn>,
    pub PJRT_LoadedExecutable_Delete: Option<ApiFn>,
    pub PJRT_LoadedExecutable_IsDeleted: Option<ApiFn>,
    pub PJRT_LoadedExecutable_Execute: Option<ApiFn>,
    pub PJRT_Executable_DeserializeAndLoad: Option<ApiFn>,
    pub PJRT_LoadedExecutable_Fingerprint: Option<ApiFn>,
    pub PJRT_Buffer_Destroy: Option<ApiFn>,
    pub PJRT_Buffer_ElementType: Option<ApiFn>,
    pub PJRT_Buffer_Dimensions: Option<ApiFn>,
    pub PJRT_Buffer_UnpaddedDimensions: Option<ApiFn>,
    pub PJRT_Buffer_DynamicDimensionIndices: Option<ApiFn>,
    pub PJRT_Buffer_GetMemoryLayout: Option<ApiFn>,
    pub PJRT_Buffer_OnDeviceSizeInBytes: Option<ApiFn>,
    pub PJRT_Buffer_Device: Option<ApiFn>,
    pub PJRT_Buffer_Memory: Option<ApiFn>,
    pub PJRT_Buffer_Delete: Option<ApiFn>,
    pub PJRT_Buffer_IsDeleted: Option<ApiFn>,
    pub PJRT_Buffer_CopyToDevice: Option<ApiFn>,
    pub PJRT_Buffer_ToHostBuffer: Option<ApiFn>,
    pub PJRT_Buffer_IsOnCpu: Option<ApiFn>,
    pub PJRT_Buffer_ReadyEvent: Option<ApiFn>,
    pub PJRT_Buffer_UnsafePointer: Option<ApiFn>,
    pub PJRT_Buffer_IncreaseExternalReferenceCount: Option<ApiFn>,
    pub PJRT_Buffer_DecreaseExternalReferenceCount: Option<ApiFn>,
    pub PJRT_Buffer_OpaqueDeviceMemoryDataPointer: Option<ApiFn>,
    pub PJRT_CopyToDeviceStream_Destroy: Option<ApiFn>,
    pub PJRT_CopyToDeviceStream_AddChunk: Option<ApiFn>,
    pub PJRT_CopyToDeviceStream_TotalBytes: Option<ApiFn>,
    pub PJRT_CopyToDeviceStream_GranuleSize: Option<ApiFn>,
    pub PJRT_CopyToDeviceStream_CurrentBytes: Option<ApiFn>,
    pub PJRT_TopologyDescription_Create: Option<ApiFn>,
    pub PJRT_TopologyDescription_Destroy: Option<ApiFn>,
    pub PJRT_TopologyDescription_PlatformName: Option<ApiFn>,
    pub PJRT_TopologyDescription_PlatformVersion: Option<ApiFn>,
    pub PJRT_TopologyDescription_GetDeviceDescriptions: Option<ApiFn>,
    pub PJRT_TopologyDescription_Serialize: Option<ApiFn>,
    pub PJRT_TopologyDescription_Attributes: Option<ApiFn>,
    pub PJRT_Compile: Option<ApiFn>,
    pub PJRT_Executable_OutputElementTypes: Option<ApiFn>,
    pub PJRT_Executable_OutputDimensions: Option<ApiFn>,
    pub PJRT_Buffer_CopyToMemory: Option<ApiFn>,
    pub PJRT_Client_CreateViewOfDeviceBuffer: Option<ApiFn>,
    pub PJRT_Executable_Fingerprint: Option<ApiFn>,
    pub PJRT_Client_TopologyDescription: Option<ApiFn>,
    pub PJRT_Executable_GetCompiledMemoryStats: Option<ApiFn>,
    pub PJRT_Memory_Kind_Id: Option<ApiFn>,
    pub PJRT_ExecuteContext_Create: Option<ApiFn>,
    pub PJRT_ExecuteContext_Destroy: Option<ApiFn>,
    pub PJRT_Buffer_CopyRawToHost: Option<ApiFn>,
    pub PJRT_AsyncHostToDeviceTransferManager_Destroy: Option<ApiFn>,
    pub PJRT_AsyncHostToDeviceTransferManager_TransferData: Option<ApiFn>,
    pub PJRT_Client_CreateBuffersForAsyncHostToDevice: Option<ApiFn>,
    pub PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer: Option<ApiFn>,
    pub PJRT_AsyncHostToDeviceTransferManager_Device: Option<ApiFn>,
    pub PJRT_AsyncHostToDeviceTransferManager_BufferCount: Option<ApiFn>,
    pub PJRT_AsyncHostToDeviceTransferManager_BufferSize: Option<ApiFn>,
    pub PJRT_AsyncHostToDeviceTransferManager_SetBufferError: Option<ApiFn>,
    pub PJRT_AsyncHostToDeviceTransferManager_AddMetadata: Option<ApiFn>,
    pub PJRT_Client_DmaMap: Option<ApiFn>,
    pub PJRT_Client_DmaUnmap: Option<ApiFn>,
    pub PJRT_Client_CreateUninitializedBuffer: Option<ApiFn>,
    pub PJRT_Client_UpdateGlobalProcessInfo: Option<ApiFn>,
    pub PJRT_TopologyDescription_Deserialize: Option<ApiFn>,
    pub PJRT_Client_CreateAliasBuffer: Option<ApiFn>,
    pub PJRT_Client_FulfillAliasBuffer: Option<ApiFn>,
    pub PJRT_LoadedExecutable_GetDeviceAssignment: Option<ApiFn>,
}

impl Api {
    /// Whether the plugin's table is long enough to hold the entry at `offset`.
    pub fn has(&self, offset: usize) -> bool {
        offset + std::mem::size_of::<usize>() <= self.struct_size
    }
}

pub const PJRT_NamedValue_kString: c_int = 0;
pub const PJRT_NamedValue_kInt64: c_int = 1;
pub const PJRT_NamedValue_kInt64List: c_int = 2;
pub const PJRT_NamedValue_kFloat: c_int = 3;
pub const PJRT_NamedValue_kBool: c_int = 4;

pjrt_struct!(PJRT_NamedValue {
    name: *const c_char,
    name_size: usize,
    value_type: c_int,
    // The C union of string pointer / int64 / int64 array pointer / float / bool:
    // 8 bytes, 8-aligned; only `kInt64` is used here.
    value: i64,
    value_size: usize,
});

pjrt_struct!(PJRT_Error_Destroy_Args { error: *mut PJRT_Error });
pjrt_struct!(PJRT_Error_Message_Args { error: *const PJRT_Error, message: *const c_char, message_size: usize });
pjrt_struct!(PJRT_Error_GetCode_Args { error: *const PJRT_Error, code: c_int });
pub const PJRT_Error_Code_NOT_FOUND: c_int = 5;

pjrt_struct!(PJRT_Plugin_Initialize_Args {});

pjrt_struct!(PJRT_Event_Destroy_Args { event: *mut PJRT_Event });
pjrt_struct!(PJRT_Event_Await_Args { event: *mut PJRT_Event });

/// Builds the plugin's error for a failed callback (`PJRT_Error_Code`, message).
pub type PJRT_CallbackError = Option<unsafe extern "C" fn(c_int, *const c_char, usize) -> *mut PJRT_Error>;
/// Frees a value a get callback returned.
pub type PJRT_KeyValueGetCallback_ValueDeleter = Option<unsafe extern "C" fn(*mut c_char)>;

pjrt_struct!(PJRT_KeyValueGetCallback_Args {
    key: *const c_char,
    key_size: usize,
    timeout_in_ms: c_int,
    callback_error: *const PJRT_CallbackError,
    user_arg: *mut c_void,
    value: *mut c_char,
    value_size: usize,
    value_deleter_callback: PJRT_KeyValueGetCallback_ValueDeleter,
});
pjrt_struct!(PJRT_KeyValueTryGetCallback_Args {
    key: *const c_char,
    key_size: usize,
    callback_error: *const PJRT_CallbackError,
    user_arg: *mut c_void,
    value: *mut c_char,
    value_size: usize,
    value_deleter_callback: PJRT_KeyValueGetCallback_ValueDeleter,
});
pjrt_struct!(PJRT_KeyValuePutCallback_Args {
    key: *const c_char,
    key_size: usize,
    value: *const c_char,
    value_size: usize,
    callback_error: *const PJRT_CallbackError,
    user_arg: *mut c_void,
});
pub type PJRT_KeyValueGetCallback = Option<unsafe extern "C" fn(*mut PJRT_KeyValueGetCallback_Args) -> *mut PJRT_Error>;
pub type PJRT_KeyValueTryGetCallback =
    Option<unsafe extern "C" fn(*mut PJRT_KeyValueTryGetCallback_Args) -> *mut PJRT_Error>;
pub type PJRT_KeyValuePutCallback = Option<unsafe extern "C" fn(*mut PJRT_KeyValuePutCallback_Args) -> *mut PJRT_Error>;

pjrt_struct!(PJRT_Client_Create_Args {
    create_options: *const PJRT_NamedValue,
    num_options: usize,
    kv_get_callback: PJRT_KeyValueGetCallback,
    kv_get_user_arg: *mut c_void,
    kv_put_callback: PJRT_KeyValuePutCallback,
    kv_put_user_arg: *mut c_void,
    client: *mut PJRT_Client,
    kv_try_get_callback: PJRT_KeyValueTryGetCallback,
    kv_try_get_user_arg: *mut c_void,
});
pjrt_struct!(PJRT_Client_ProcessIndex_Args { client: *mut PJRT_Client, process_index: c_int });
pjrt_struct!(PJRT_Client_Devices_Args { client: *mut PJRT_Client, devices: *const *mut PJRT_Device, num_devices: usize });
pjrt_struct!(PJRT_DeviceDescription_ProcessIndex_Args {
    device_description: *mut PJRT_DeviceDescription,
    process_index: c_int,
});
pjrt_struct!(PJRT_Client_Destroy_Args { client: *mut PJRT_Client });
pjrt_struct!(PJRT_Client_PlatformName_Args { client: *mut PJRT_Client, platform_name: *const c_char, platform_name_size: usize });
pjrt_struct!(PJRT_Client_PlatformVersion_Args {
    client: *mut PJRT_Client,
    platform_version: *const c_char,
    platform_version_size: usize,
});
pjrt_struct!(PJRT_Client_AddressableDevices_Args {
    client: *mut PJRT_Client,
    addressable_devices: *const *mut PJRT_Device,
    num_addressable_devices: usize,
});

pjrt_struct!(PJRT_Program { code: *mut c_char, code_size: usize, format: *const c_char, format_size: usize });
pjrt_struct!(PJRT_Client_Compile_Args {
    client: *mut PJRT_Client,
    program: *const PJRT_Program,
    compile_options: *const c_char,
    compile_options_size: usize,
    executable: *mut PJRT_LoadedExecutable,
});

pub const PJRT_HostBufferSemantics_kImmutableOnlyDuringCall: c_int = 0;

pjrt_struct!(PJRT_Client_BufferFromHostBuffer_Args {
    client: *mut PJRT_Client,
    data: *const c_void,
    buffer_type: c_int,
    dims: *const i64,
    num_dims: usize,
    byte_strides: *const i64,
    num_byte_strides: usize,
    host_buffer_semantics: c_int,
    device: *mut PJRT_Device,
    memory: *mut PJRT_Memory,
    device_layout: *mut c_void,
    done_with_host_buffer: *mut PJRT_Event,
    buffer: *mut PJRT_Buffer,
});

pjrt_struct!(PJRT_DeviceDescription_Id_Args { device_description: *mut PJRT_DeviceDescription, id: c_int });
pjrt_struct!(PJRT_DeviceDescription_Kind_Args {
    device_description: *mut PJRT_DeviceDescription,
    device_kind: *const c_char,
    device_kind_size: usize,
});
pjrt_struct!(PJRT_Device_GetDescription_Args { device: *mut PJRT_Device, device_description: *mut PJRT_DeviceDescription });

pjrt_struct!(PJRT_Executable_Destroy_Args { executable: *mut PJRT_Executable });
pjrt_struct!(PJRT_Executable_NumOutputs_Args { executable: *mut PJRT_Executable, num_outputs: usize });
pjrt_struct!(PJRT_Executable_Serialize_Args {
    executable: *const PJRT_Executable,
    serialized_bytes: *const c_char,
    serialized_bytes_size: usize,
    serialized_executable: *mut PJRT_SerializedExecutable,
    serialized_executable_deleter: Option<unsafe extern "C" fn(*mut PJRT_SerializedExecutable)>,
});
pjrt_struct!(PJRT_Executable_DeserializeAndLoad_Args {
    client: *mut PJRT_Client,
    serialized_executable: *const c_char,
    serialized_executable_size: usize,
    loaded_executable: *mut PJRT_LoadedExecutable,
    overridden_serialized_compile_options: *const c_char,
    overridden_serialized_compile_options_size: usize,
});
pjrt_struct!(PJRT_LoadedExecutable_Destroy_Args { executable: *mut PJRT_LoadedExecutable });
pjrt_struct!(PJRT_LoadedExecutable_GetExecutable_Args {
    loaded_executable: *mut PJRT_LoadedExecutable,
    executable: *mut PJRT_Executable,
});
pjrt_struct!(PJRT_ExecuteOptions {
    send_callbacks: *mut c_void,
    recv_callbacks: *mut c_void,
    num_send_ops: usize,
    num_recv_ops: usize,
    launch_id: c_int,
    non_donatable_input_indices: *const i64,
    num_non_donatable_input_indices: usize,
    context: *mut c_void,
    call_location: *const c_char,
    num_tasks: usize,
    task_ids: *mut c_int,
    incarnation_ids: *mut i64,
});
pjrt_struct!(PJRT_LoadedExecutable_Execute_Args {
    executable: *mut PJRT_LoadedExecutable,
    options: *mut PJRT_ExecuteOptions,
    argument_lists: *const *const *mut PJRT_Buffer,
    num_devices: usize,
    num_args: usize,
    output_lists: *const *mut *mut PJRT_Buffer,
    device_complete_events: *mut *mut PJRT_Event,
    execute_device: *mut PJRT_Device,
});

pjrt_struct!(PJRT_Buffer_Destroy_Args { buffer: *mut PJRT_Buffer });
pjrt_struct!(PJRT_Buffer_ToHostBuffer_Args {
    src: *mut PJRT_Buffer,
    host_layout: *mut c_void,
    dst: *mut c_void,
    dst_size: usize,
    event: *mut PJRT_Event,
});
pjrt_struct!(PJRT_Buffer_ElementType_Args { buffer: *mut PJRT_Buffer, element_type: c_int });
pjrt_struct!(PJRT_Buffer_Dimensions_Args { buffer: *mut PJRT_Buffer, dims: *const i64, num_dims: usize });
pjrt_struct!(PJRT_Buffer_IsDeleted_Args { buffer: *mut PJRT_Buffer, is_deleted: bool });
pjrt_struct!(PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args { buffer: *mut PJRT_Buffer, device_memory_ptr: *mut c_void });

/// `PJRT_Buffer_Type` values used by kiln's dtypes.
pub const PJRT_Buffer_Type_PRED: c_int = 1;
pub const PJRT_Buffer_Type_S8: c_int = 2;
pub const PJRT_Buffer_Type_S16: c_int = 3;
pub const PJRT_Buffer_Type_S32: c_int = 4;
pub const PJRT_Buffer_Type_S64: c_int = 5;
pub const PJRT_Buffer_Type_U8: c_int = 6;
pub const PJRT_Buffer_Type_F16: c_int = 10;
pub const PJRT_Buffer_Type_F32: c_int = 11;
pub const PJRT_Buffer_Type_F64: c_int = 12;
pub const PJRT_Buffer_Type_BF16: c_int = 13;
pub const PJRT_Buffer_Type_C64: c_int = 14;
pub const PJRT_Buffer_Type_C128: c_int = 15;

/// Sizes and offsets as gcc computes them from the 0.81 header (`sizeof` and
/// `*_STRUCT_SIZE` agree for these).
const _: () = {
    assert!(std::mem::size_of::<PJRT_Client_Create_Args>() == 88);
    assert!(std::mem::size_of::<PJRT_NamedValue>() == 56);
    assert!(std::mem::size_of::<PJRT_Client_BufferFromHostBuffer_Args>() == 120);
    assert!(std::mem::size_of::<PJRT_LoadedExecutable_Execute_Args>() == 80);
    assert!(std::mem::size_of::<PJRT_ExecuteOptions>() == 112);
    assert!(std::mem::size_of::<PJRT_Executable_Serialize_Args>() == 56);
    assert!(std::mem::size_of::<PJRT_Buffer_ToHostBuffer_Args>() == 56);
    assert!(std::mem::size_of::<PJRT_Client_Compile_Args>() == 56);
    assert!(std::mem::size_of::<PJRT_Program>() == 48);
    assert!(std::mem::size_of::<Api>() == 984);
    assert!(std::mem::offset_of!(Api, PJRT_Executable_DeserializeAndLoad) == 488);
    assert!(std::mem::size_of::<PJRT_Executable_DeserializeAndLoad_Args>() == 64);
    assert!(std::mem::size_of::<ApiHead>() == 40);
    assert!(std::mem::size_of::<PJRT_KeyValueGetCallback_Args>() == 80);
    assert!(std::mem::size_of::<PJRT_KeyValueTryGetCallback_Args>() == 72);
    assert!(std::mem::size_of::<PJRT_KeyValuePutCallback_Args>() == 64);
    assert!(std::mem::size_of::<PJRT_Client_Devices_Args>() == 40);
};
