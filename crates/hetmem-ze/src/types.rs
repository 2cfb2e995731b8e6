//! The C types and constants of the Level Zero API that this driver reads or writes, written
//! here from the header facts (`shared/spec/level-zero-facts.md`) and the installed `ze_api.h`
//! (Debian's `libze-dev` 1.8.12, API 1.4). Names are the C names, so that the layout table
//! ([`crate::layout`]) and the C test that checks it against the installed header
//! (`tests/c/ze/layout.c`) name the same things.
//!
//! Values the installed 1.4 header lacks are declared for C in `include/ze_hetmem.h`, each with
//! its source; the provisional one (the range descriptor's stype) lives in one place:
//! [`ZE_STRUCTURE_TYPE_IPC_PHYS_MEM_HANDLE_RANGE_EXT_DESC`].

#![allow(non_camel_case_types, non_snake_case, dead_code)]

use std::ffi::c_void;

pub type ze_result_t = u32;
pub type ze_bool_t = u8;

// ze_result_t (ze_api.h)
pub const ZE_RESULT_SUCCESS: u32 = 0;
pub const ZE_RESULT_NOT_READY: u32 = 1;
pub const ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY: u32 = 0x7000_0002;
pub const ZE_RESULT_ERROR_UNINITIALIZED: u32 = 0x7800_0001;
pub const ZE_RESULT_ERROR_UNSUPPORTED_VERSION: u32 = 0x7800_0002;
pub const ZE_RESULT_ERROR_UNSUPPORTED_FEATURE: u32 = 0x7800_0003;
pub const ZE_RESULT_ERROR_INVALID_ARGUMENT: u32 = 0x7800_0004;
pub const ZE_RESULT_ERROR_INVALID_NULL_HANDLE: u32 = 0x7800_0005;
pub const ZE_RESULT_ERROR_INVALID_NULL_POINTER: u32 = 0x7800_0007;
pub const ZE_RESULT_ERROR_INVALID_SIZE: u32 = 0x7800_0008;
pub const ZE_RESULT_ERROR_INVALID_ENUMERATION: u32 = 0x7800_000c;
pub const ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION: u32 = 0x7800_000d;
pub const ZE_RESULT_ERROR_UNKNOWN: u32 = 0x7fff_fffe;

/// `ZE_MAKE_VERSION(major, minor)`.
pub const fn ze_make_version(major: u32, minor: u32) -> u32 {
    (major << 16) | (minor & 0xffff)
}
/// The API version this driver reports (`zeDriverGetApiVersion`) and the newest DDI table
/// layout it knows (1.18: the range descriptor of the seed pages is a 1.18 extension).
pub const DRIVER_API_VERSION: u32 = ze_make_version(1, 18);

// ze_structure_type_t: in the installed 1.4 header
pub const ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES: u32 = 0x1;
pub const ZE_STRUCTURE_TYPE_DRIVER_IPC_PROPERTIES: u32 = 0x2;
pub const ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES: u32 = 0x3;
pub const ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES: u32 = 0x7;
pub const ZE_STRUCTURE_TYPE_CONTEXT_DESC: u32 = 0xd;
pub const ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC: u32 = 0xe;
pub const ZE_STRUCTURE_TYPE_COMMAND_LIST_DESC: u32 = 0xf;
pub const ZE_STRUCTURE_TYPE_EVENT_POOL_DESC: u32 = 0x10;
pub const ZE_STRUCTURE_TYPE_EVENT_DESC: u32 = 0x11;
pub const ZE_STRUCTURE_TYPE_FENCE_DESC: u32 = 0x12;
pub const ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC: u32 = 0x15;
pub const ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC: u32 = 0x16;
pub const ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES: u32 = 0x17;
pub const ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC: u32 = 0x20;
pub const ZE_STRUCTURE_TYPE_DRIVER_MEMORY_FREE_EXT_PROPERTIES: u32 = 0x10009;
pub const ZE_STRUCTURE_TYPE_MEMORY_FREE_EXT_DESC: u32 = 0x1000a;
pub const ZE_STRUCTURE_TYPE_MEMORY_COMPRESSION_HINTS_EXT_DESC: u32 = 0x1000b;
pub const ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC: u32 = 0x0002_0001;
// ze_structure_type_t: newer than the installed header (facts file, API 1.17 header)
pub const ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXT_DESC: u32 = 0x10016;
pub const ZE_STRUCTURE_TYPE_EXTERNAL_MEMMAP_SYSMEM_EXT_DESC: u32 = 0x0002_0037;
pub const ZE_STRUCTURE_TYPE_IPC_MEM_HANDLE_TYPE_EXT_DESC: u32 = 0x0002_003d;
pub const ZE_STRUCTURE_TYPE_PHYSICAL_MEM_PROPERTIES: u32 = 0x0002_0040;
/// **Provisional.** The v1.18 range descriptor's stype was in no published header when this was
/// written; 0x00020049 is the first value after the last stype of the 1.17 header, so it
/// collides with no published stype. The one place this value lives in Rust (C:
/// `include/ze_hetmem.h`).
pub const ZE_STRUCTURE_TYPE_IPC_PHYS_MEM_HANDLE_RANGE_EXT_DESC: u32 = 0x0002_0049;
/// `ze_init_driver_type_desc_t` (API 1.10; value from the 1.12 header of Debian trixie's
/// `libze-dev` 1.20.6).
pub const ZE_STRUCTURE_TYPE_INIT_DRIVER_TYPE_DESC: u32 = 0x0002_0021;
/// `ze_device_readonly_memory_ext_properties_t`, chained on `zeDeviceGetProperties` (API 1.17,
/// `ZE_extension_virtual_mem_readonly_properties`; newer than the 1.4 header). The value is
/// `shared/cases/level-zero.md`'s (case 2): the extension's published source
/// (`level-zero-spec` `scripts/core/virtualMemReadOnlyProperties.yml`) gives the layout and
/// the enum but not the stype's number, and no header of 1.14 or later was among the sources
/// reachable here.
pub const ZE_STRUCTURE_TYPE_DEVICE_READONLY_MEMORY_EXT_PROPERTIES: u32 = 0x10015;
/// `ze_device_memory_ext_properties_t`, chained on `zeDeviceGetMemoryProperties`
/// (`ZE_extension_device_memory_properties`, API 1.4: in the installed header).
pub const ZE_STRUCTURE_TYPE_DEVICE_MEMORY_EXT_PROPERTIES: u32 = 0x1000e;
/// `ze_bandwidth_unit_t`: the unit of a bandwidth is unknown (with a bandwidth of 0: unknown).
pub const ZE_BANDWIDTH_UNIT_UNKNOWN: u32 = 0;
/// `ze_device_readonly_memory_capability_t`: READONLY pages are enforced on device accesses
/// (0 is NONE, "has no effect").
pub const ZE_DEVICE_READONLY_MEMORY_CAPABILITY_ENFORCED: u32 = 2;

// flags and enums
pub const ZE_INIT_FLAG_GPU_ONLY: u32 = 1 << 0;
pub const ZE_INIT_FLAG_VPU_ONLY: u32 = 1 << 1;
pub const ZE_INIT_DRIVER_TYPE_FLAG_GPU: u32 = 1 << 0;
pub const ZE_INIT_DRIVER_TYPE_FLAG_NPU: u32 = 1 << 1;
pub const ZE_DEVICE_TYPE_GPU: u32 = 1;
pub const ZE_DEVICE_PROPERTY_FLAG_INTEGRATED: u32 = 1 << 0;
pub const ZE_DEVICE_PROPERTY_FLAG_SUBDEVICE: u32 = 1 << 1;
pub const ZE_IPC_PROPERTY_FLAG_MEMORY: u32 = 1 << 0;
pub const ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE: u32 = 1 << 0;
pub const ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY: u32 = 1 << 1;
pub const ZE_MEMORY_ACCESS_CAP_FLAG_RW: u32 = 1 << 0;
pub const ZE_MEMORY_ACCESS_CAP_FLAG_ATOMIC: u32 = 1 << 1;
pub const ZE_MEMORY_ACCESS_CAP_FLAG_CONCURRENT: u32 = 1 << 2;
pub const ZE_MEMORY_ACCESS_CAP_FLAG_CONCURRENT_ATOMIC: u32 = 1 << 3;
pub const ZE_DEVICE_P2P_PROPERTY_FLAG_ACCESS: u32 = 1 << 0;
pub const ZE_DEVICE_P2P_PROPERTY_FLAG_ATOMICS: u32 = 1 << 1;
pub const ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS: u32 = 1;
pub const ZE_FENCE_FLAG_SIGNALED: u32 = 1 << 0;
/// `ZE_HOST_MEM_ALLOC_FLAG_MEM_READ_ONLY`: **inferred** as `ZE_BIT(4)`, the bit after
/// `ZE_HOST_MEM_ALLOC_FLAG_BIAS_INITIAL_PLACEMENT` (`ZE_BIT(3)`, the last of the 1.4 header);
/// the flag is named by the external-memmap extension (1.14) but its value was not found in a
/// published header here.
pub const ZE_HOST_MEM_ALLOC_FLAG_MEM_READ_ONLY: u32 = 1 << 4;
/// Every `ze_host_mem_alloc_flag_t` bit known (BIAS_CACHED .. MEM_READ_ONLY).
pub const HOST_MEM_ALLOC_FLAGS_ALL: u32 = 0x1f;
/// Every `ze_device_mem_alloc_flag_t` bit known (BIAS_CACHED | BIAS_UNCACHED |
/// BIAS_INITIAL_PLACEMENT).
pub const DEVICE_MEM_ALLOC_FLAGS_ALL: u32 = 0x7;

pub const ZE_MAX_DRIVER_UUID_SIZE: usize = 16;
pub const ZE_MAX_DEVICE_UUID_SIZE: usize = 16;
pub const ZE_MAX_DEVICE_NAME: usize = 256;
pub const ZE_MAX_EXTENSION_NAME: usize = 256;
pub const ZE_MAX_IPC_HANDLE_SIZE: usize = 64;
pub const ZE_SUBGROUPSIZE_COUNT: usize = 8;
pub const ZE_MAX_NATIVE_KERNEL_UUID_SIZE: usize = 16;

/// The common head of every descriptor / property structure.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ze_base_desc_t {
    pub stype: u32,
    pub pNext: *const c_void,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ze_driver_uuid_t {
    pub id: [u8; ZE_MAX_DRIVER_UUID_SIZE],
}

#[repr(C)]
pub struct ze_driver_properties_t {
    pub stype: u32,
    pub pNext: *mut c_void,
    pub uuid: ze_driver_uuid_t,
    pub driverVersion: u32,
}

#[repr(C)]
pub struct ze_driver_ipc_properties_t {
    pub stype: u32,
    pub pNext: *mut c_void,
    pub flags: u32,
}

#[repr(C)]
pub struct ze_driver_extension_properties_t {
    pub name: [u8; ZE_MAX_EXTENSION_NAME],
    pub version: u32,
}

#[repr(C)]
pub struct ze_driver_memory_free_ext_properties_t {
    pub stype: u32,
    pub pNext: *mut c_void,
    pub freePolicies: u32,
}

/// Chained on `ze_device_properties_t` (the properties base, then one enum).
#[repr(C)]
pub struct ze_device_readonly_memory_ext_properties_t {
    pub stype: u32,
    pub pNext: *mut c_void,
    pub readonlyCapability: u32,
}

/// Chained on `ze_device_memory_properties_t` (1.4 header).
#[repr(C)]
pub struct ze_device_memory_ext_properties_t {
    pub stype: u32,
    pub pNext: *mut c_void,
    /// `ze_device_memory_ext_type_t` (HBM 0, ..., DDR5 6, ...).
    pub r#type: u32,
    pub physicalSize: u64,
    pub readBandwidth: u32,
    pub writeBandwidth: u32,
    /// `ze_bandwidth_unit_t`.
    pub bandwidthUnit: u32,
}

#[repr(C)]
pub struct ze_init_driver_type_desc_t {
    pub stype: u32,
    pub pNext: *const c_void,
    pub flags: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ze_device_uuid_t {
    pub id: [u8; ZE_MAX_DEVICE_UUID_SIZE],
}

#[repr(C)]
pub struct ze_device_properties_t {
    pub stype: u32,
    pub pNext: *mut c_void,
    pub r#type: u32,
    pub vendorId: u32,
    pub deviceId: u32,
    pub flags: u32,
    pub subdeviceId: u32,
    pub coreClockRate: u32,
    pub maxMemAllocSize: u64,
    pub maxHardwareContexts: u32,
    pub maxCommandQueuePriority: u32,
    pub numThreadsPerEU: u32,
    pub physicalEUSimdWidth: u32,
    pub numEUsPerSubslice: u32,
    pub numSubslicesPerSlice: u32,
    pub numSlices: u32,
    pub timerResolution: u64,
    pub timestampValidBits: u32,
    pub kernelTimestampValidBits: u32,
    pub uuid: ze_device_uuid_t,
    pub name: [u8; ZE_MAX_DEVICE_NAME],
}

#[repr(C)]
pub struct ze_device_compute_properties_t {
    pub stype: u32,
    pub pNext: *mut c_void,
    pub maxTotalGroupSize: u32,
    pub maxGroupSizeX: u32,
    pub maxGroupSizeY: u32,
    pub maxGroupSizeZ: u32,
    pub maxGroupCountX: u32,
    pub maxGroupCountY: u32,
    pub maxGroupCountZ: u32,
    pub maxSharedLocalMemory: u32,
    pub numSubGroupSizes: u32,
    pub subGroupSizes: [u32; ZE_SUBGROUPSIZE_COUNT],
}

#[repr(C)]
pub struct ze_native_kernel_uuid_t {
    pub id: [u8; ZE_MAX_NATIVE_KERNEL_UUID_SIZE],
}

#[repr(C)]
pub struct ze_device_module_properties_t {
    pub stype: u32,
    pub pNext: *mut c_void,
    pub spirvVersionSupported: u32,
    pub flags: u32,
    pub fp16flags: u32,
    pub fp32flags: u32,
    pub fp64flags: u32,
    pub maxArgumentsSize: u32,
    pub printfBufferSize: u32,
    pub nativeKernelSupported: ze_native_kernel_uuid_t,
}

#[repr(C)]
pub struct ze_command_queue_group_properties_t {
    pub stype: u32,
    pub pNext: *mut c_void,
    pub flags: u32,
    pub maxMemoryFillPatternSize: usize,
    pub numQueues: u32,
}

#[repr(C)]
pub struct ze_device_memory_properties_t {
    pub stype: u32,
    pub pNext: *mut c_void,
    pub flags: u32,
    pub maxClockRate: u32,
    pub maxBusWidth: u32,
    pub totalSize: u64,
    pub name: [u8; ZE_MAX_DEVICE_NAME],
}

#[repr(C)]
pub struct ze_device_memory_access_properties_t {
    pub stype: u32,
    pub pNext: *mut c_void,
    pub hostAllocCapabilities: u32,
    pub deviceAllocCapabilities: u32,
    pub sharedSingleDeviceAllocCapabilities: u32,
    pub sharedCrossDeviceAllocCapabilities: u32,
    pub sharedSystemAllocCapabilities: u32,
}

#[repr(C)]
pub struct ze_device_cache_properties_t {
    pub stype: u32,
    pub pNext: *mut c_void,
    pub flags: u32,
    pub cacheSize: usize,
}

#[repr(C)]
pub struct ze_device_image_properties_t {
    pub stype: u32,
    pub pNext: *mut c_void,
    pub maxImageDims1D: u32,
    pub maxImageDims2D: u32,
    pub maxImageDims3D: u32,
    pub maxImageBufferSize: u64,
    pub maxImageArraySlices: u32,
    pub maxSamplers: u32,
    pub maxReadImageArgs: u32,
    pub maxWriteImageArgs: u32,
}

#[repr(C)]
pub struct ze_device_external_memory_properties_t {
    pub stype: u32,
    pub pNext: *mut c_void,
    pub memoryAllocationImportTypes: u32,
    pub memoryAllocationExportTypes: u32,
    pub imageImportTypes: u32,
    pub imageExportTypes: u32,
}

#[repr(C)]
pub struct ze_device_p2p_properties_t {
    pub stype: u32,
    pub pNext: *mut c_void,
    pub flags: u32,
}

#[repr(C)]
pub struct ze_context_desc_t {
    pub stype: u32,
    pub pNext: *const c_void,
    pub flags: u32,
}

#[repr(C)]
pub struct ze_command_queue_desc_t {
    pub stype: u32,
    pub pNext: *const c_void,
    pub ordinal: u32,
    pub index: u32,
    pub flags: u32,
    pub mode: u32,
    pub priority: u32,
}

#[repr(C)]
pub struct ze_command_list_desc_t {
    pub stype: u32,
    pub pNext: *const c_void,
    pub commandQueueGroupOrdinal: u32,
    pub flags: u32,
}

#[repr(C)]
pub struct ze_event_pool_desc_t {
    pub stype: u32,
    pub pNext: *const c_void,
    pub flags: u32,
    pub count: u32,
}

#[repr(C)]
pub struct ze_event_desc_t {
    pub stype: u32,
    pub pNext: *const c_void,
    pub index: u32,
    pub signal: u32,
    pub wait: u32,
}

#[repr(C)]
pub struct ze_fence_desc_t {
    pub stype: u32,
    pub pNext: *const c_void,
    pub flags: u32,
}

#[repr(C)]
pub struct ze_device_mem_alloc_desc_t {
    pub stype: u32,
    pub pNext: *const c_void,
    pub flags: u32,
    pub ordinal: u32,
}

#[repr(C)]
pub struct ze_host_mem_alloc_desc_t {
    pub stype: u32,
    pub pNext: *const c_void,
    pub flags: u32,
}

#[repr(C)]
pub struct ze_memory_allocation_properties_t {
    pub stype: u32,
    pub pNext: *mut c_void,
    pub r#type: u32,
    pub id: u64,
    pub pageSize: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ze_ipc_mem_handle_t {
    pub data: [u8; ZE_MAX_IPC_HANDLE_SIZE],
}

#[repr(C)]
pub struct ze_physical_mem_desc_t {
    pub stype: u32,
    pub pNext: *const c_void,
    pub flags: u32,
    pub size: usize,
}

#[repr(C)]
pub struct ze_memory_free_ext_desc_t {
    pub stype: u32,
    pub pNext: *const c_void,
    pub freePolicy: u32,
}

#[repr(C)]
pub struct ze_relaxed_allocation_limits_exp_desc_t {
    pub stype: u32,
    pub pNext: *const c_void,
    pub flags: u32,
}

#[repr(C)]
pub struct ze_memory_compression_hints_ext_desc_t {
    pub stype: u32,
    pub pNext: *const c_void,
    pub flags: u32,
}

// Newer than the installed header (declared for C in include/ze_hetmem.h).

#[repr(C)]
pub struct ze_relaxed_allocation_limits_ext_desc_t {
    pub stype: u32,
    pub pNext: *const c_void,
    pub flags: u32,
}

#[repr(C)]
pub struct ze_external_memmap_sysmem_ext_desc_t {
    pub stype: u32,
    pub pNext: *const c_void,
    pub pSystemMemory: *mut c_void,
    pub size: u64,
}

#[repr(C)]
pub struct ze_ipc_mem_handle_type_ext_desc_t {
    pub stype: u32,
    pub pNext: *const c_void,
    pub typeFlags: u32,
}

#[repr(C)]
pub struct ze_ipc_phys_mem_handle_range_ext_desc_t {
    pub stype: u32,
    pub pNext: *const c_void,
    pub size: usize,
}

#[repr(C)]
pub struct ze_physical_mem_properties_t {
    pub stype: u32,
    pub pNext: *mut c_void,
    pub id: u64,
    pub size: u64,
}

/// One entry of a DDI table: a function pointer, `NULL` when absent.
pub type ze_pfn_t = *const c_void;
