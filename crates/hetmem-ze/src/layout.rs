//! The layout table: `sizeof` / `offsetof` of every C structure written in [`crate::types`]
//! and the value of every constant, by the C spelling, for the C test that checks them against
//! the installed `ze_api.h` and `include/ze_hetmem.h` (`tests/c/ze/layout.c`).

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, CString};
use std::mem::{offset_of, size_of};
use std::sync::OnceLock;

use crate::types::*;

/// One entry: `"sizeof(T)"`, `"offsetof(T,field)"` or a constant's name, and its value.
#[repr(C)]
pub struct HetmemLayoutEntry {
    pub name: *const c_char,
    pub value: u64,
}

struct Table(Vec<HetmemLayoutEntry>);
// SAFETY: the names are leaked, immutable C strings.
unsafe impl Send for Table {}
unsafe impl Sync for Table {}

macro_rules! layout {
    (sizes: [$($t:ident { $($f:ident),* }),* $(,)?], consts: [$($c:ident),* $(,)?]) => {{
        let mut v: Vec<(String, u64)> = Vec::new();
        $(
            v.push((format!("sizeof({})", stringify!($t)), size_of::<$t>() as u64));
            $( v.push((format!("offsetof({},{})", stringify!($t), stringify!($f).trim_start_matches("r#")), offset_of!($t, $f) as u64)); )*
        )*
        $( v.push((stringify!($c).to_string(), $c as u64)); )*
        v
    }};
}

/// `(name, value)` of every entry.
pub fn entries() -> Vec<(String, u64)> {
    layout! {
        sizes: [
            ze_driver_properties_t { stype, pNext, uuid, driverVersion },
            ze_driver_ipc_properties_t { flags },
            ze_driver_extension_properties_t { name, version },
            ze_driver_memory_free_ext_properties_t { freePolicies },
            ze_device_properties_t { r#type, vendorId, deviceId, flags, subdeviceId, coreClockRate,
                maxMemAllocSize, maxHardwareContexts, maxCommandQueuePriority, numThreadsPerEU,
                physicalEUSimdWidth, numEUsPerSubslice, numSubslicesPerSlice, numSlices,
                timerResolution, timestampValidBits, kernelTimestampValidBits, uuid, name },
            ze_device_compute_properties_t { maxTotalGroupSize, maxSharedLocalMemory,
                numSubGroupSizes, subGroupSizes },
            ze_device_module_properties_t { spirvVersionSupported, maxArgumentsSize,
                printfBufferSize, nativeKernelSupported },
            ze_command_queue_group_properties_t { flags, maxMemoryFillPatternSize, numQueues },
            ze_device_memory_properties_t { flags, maxClockRate, maxBusWidth, totalSize, name },
            ze_device_memory_access_properties_t { hostAllocCapabilities, deviceAllocCapabilities,
                sharedSingleDeviceAllocCapabilities, sharedCrossDeviceAllocCapabilities,
                sharedSystemAllocCapabilities },
            ze_device_cache_properties_t { flags, cacheSize },
            ze_device_image_properties_t { maxImageDims1D, maxImageBufferSize, maxWriteImageArgs },
            ze_device_external_memory_properties_t { memoryAllocationImportTypes, imageExportTypes },
            ze_device_p2p_properties_t { flags },
            ze_context_desc_t { stype, pNext, flags },
            ze_command_queue_desc_t { ordinal, index, flags, mode, priority },
            ze_command_list_desc_t { commandQueueGroupOrdinal, flags },
            ze_event_pool_desc_t { flags, count },
            ze_event_desc_t { index, signal, wait },
            ze_fence_desc_t { flags },
            ze_device_mem_alloc_desc_t { flags, ordinal },
            ze_host_mem_alloc_desc_t { flags },
            ze_memory_allocation_properties_t { r#type, id, pageSize },
            ze_ipc_mem_handle_t { data },
            ze_physical_mem_desc_t { flags, size },
            ze_memory_free_ext_desc_t { freePolicy },
            ze_relaxed_allocation_limits_exp_desc_t { flags },
            ze_memory_compression_hints_ext_desc_t { flags },
            ze_relaxed_allocation_limits_ext_desc_t { flags },
            ze_external_memmap_sysmem_ext_desc_t { pSystemMemory, size },
            ze_ipc_mem_handle_type_ext_desc_t { typeFlags },
            ze_ipc_phys_mem_handle_range_ext_desc_t { size },
            ze_physical_mem_properties_t { id, size },
            ze_init_driver_type_desc_t { flags },
            ze_device_readonly_memory_ext_properties_t { stype, pNext, readonlyCapability },
            ze_device_memory_ext_properties_t { stype, pNext, r#type, physicalSize, readBandwidth,
                writeBandwidth, bandwidthUnit },
        ],
        consts: [
            ZE_RESULT_SUCCESS, ZE_RESULT_NOT_READY, ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY,
            ZE_RESULT_ERROR_UNINITIALIZED, ZE_RESULT_ERROR_UNSUPPORTED_VERSION,
            ZE_RESULT_ERROR_UNSUPPORTED_FEATURE, ZE_RESULT_ERROR_INVALID_ARGUMENT,
            ZE_RESULT_ERROR_INVALID_NULL_HANDLE, ZE_RESULT_ERROR_INVALID_NULL_POINTER,
            ZE_RESULT_ERROR_INVALID_SIZE, ZE_RESULT_ERROR_INVALID_ENUMERATION,
            ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION, ZE_RESULT_ERROR_UNKNOWN,
            ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES, ZE_STRUCTURE_TYPE_DRIVER_IPC_PROPERTIES,
            ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES, ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES,
            ZE_STRUCTURE_TYPE_CONTEXT_DESC,
            ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, ZE_STRUCTURE_TYPE_COMMAND_LIST_DESC,
            ZE_STRUCTURE_TYPE_EVENT_POOL_DESC, ZE_STRUCTURE_TYPE_EVENT_DESC,
            ZE_STRUCTURE_TYPE_FENCE_DESC, ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC,
            ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC, ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES,
            ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, ZE_STRUCTURE_TYPE_DRIVER_MEMORY_FREE_EXT_PROPERTIES,
            ZE_STRUCTURE_TYPE_MEMORY_FREE_EXT_DESC, ZE_STRUCTURE_TYPE_MEMORY_COMPRESSION_HINTS_EXT_DESC,
            ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC,
            ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXT_DESC,
            ZE_STRUCTURE_TYPE_EXTERNAL_MEMMAP_SYSMEM_EXT_DESC,
            ZE_STRUCTURE_TYPE_IPC_MEM_HANDLE_TYPE_EXT_DESC, ZE_STRUCTURE_TYPE_PHYSICAL_MEM_PROPERTIES,
            ZE_STRUCTURE_TYPE_IPC_PHYS_MEM_HANDLE_RANGE_EXT_DESC,
            ZE_STRUCTURE_TYPE_INIT_DRIVER_TYPE_DESC,
            ZE_STRUCTURE_TYPE_DEVICE_READONLY_MEMORY_EXT_PROPERTIES,
            ZE_DEVICE_READONLY_MEMORY_CAPABILITY_ENFORCED,
            ZE_STRUCTURE_TYPE_DEVICE_MEMORY_EXT_PROPERTIES, ZE_BANDWIDTH_UNIT_UNKNOWN,
            ZE_INIT_FLAG_GPU_ONLY, ZE_INIT_FLAG_VPU_ONLY, ZE_DEVICE_TYPE_GPU,
            ZE_DEVICE_PROPERTY_FLAG_INTEGRATED, ZE_DEVICE_PROPERTY_FLAG_SUBDEVICE,
            ZE_IPC_PROPERTY_FLAG_MEMORY,
            ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE, ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY,
            ZE_MEMORY_ACCESS_CAP_FLAG_RW, ZE_MEMORY_ACCESS_CAP_FLAG_CONCURRENT_ATOMIC,
            ZE_DEVICE_P2P_PROPERTY_FLAG_ACCESS, ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS,
            ZE_FENCE_FLAG_SIGNALED, ZE_HOST_MEM_ALLOC_FLAG_MEM_READ_ONLY,
            ZE_MAX_DEVICE_NAME, ZE_MAX_EXTENSION_NAME, ZE_MAX_IPC_HANDLE_SIZE,
        ]
    }
}

static TABLE: OnceLock<Table> = OnceLock::new();

/// The layout table for C: `*count` entries at the returned address (never freed).
#[no_mangle]
pub unsafe extern "C" fn hetmemZeLayout(count: *mut u32) -> *const HetmemLayoutEntry {
    let Ok(t) = std::panic::catch_unwind(|| TABLE.get_or_init(table)) else {
        return std::ptr::null();
    };
    if !count.is_null() {
        *count = t.0.len() as u32;
    }
    t.0.as_ptr()
}

fn table() -> Table {
    {
        Table(
            entries()
                .into_iter()
                .map(|(n, v)| HetmemLayoutEntry {
                    name: CString::new(n).expect("no NUL").into_raw(),
                    value: v,
                })
                .collect(),
        )
    }
}

/// Live handles in the registry (leak checks from C).
#[no_mangle]
pub extern "C" fn hetmemZeLiveHandles() -> u64 {
    crate::rt::guard(|| Ok(crate::rt::live_handles() as u32)) as u64
}
