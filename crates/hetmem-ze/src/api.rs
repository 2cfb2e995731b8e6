//! The implemented `ze*` functions: handles, descriptors and `pNext` chains in, `ze_result_t`
//! out, over hetmem's safe Rust API. Every spec rule is hetmem's; what is decided here is only
//! how C values become Rust values (null pointers, enum ranges of C fields, the chain walk).

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{c_char, c_void};
use std::sync::Arc;

use hetmem::{
    AccessAttribute, AllocDesc, CommandListDesc, CommandQueueDesc, CompressionHint, Event, FlagSet,
    FreePolicy, IpcHandle, IpcHandleTypes, IpcProperties, MemoryAdvice, MemoryType,
    PhysicalMemoryFlags, SyncStatus,
};

use crate::rt::{self, fail, guard, ze, Kind, Obj, ZeResult};
use crate::types::*;

type H = *mut c_void;

const OK: ZeResult = Ok(ZE_RESULT_SUCCESS);

fn null_ptr(what: &str) -> u32 {
    fail(
        ZE_RESULT_ERROR_INVALID_NULL_POINTER,
        format!("{what} is null"),
    )
}

/// `&mut *p`, or `INVALID_NULL_POINTER` naming `what`.
unsafe fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T, u32> {
    p.as_mut().ok_or_else(|| null_ptr(what))
}

/// `&*p`, or `INVALID_NULL_POINTER` naming `what`.
unsafe fn inp<'a, T>(p: *const T, what: &str) -> Result<&'a T, u32> {
    p.as_ref().ok_or_else(|| null_ptr(what))
}

fn sync(s: SyncStatus) -> ZeResult {
    Ok(s.ze_result())
}

/// The whole body of a call that is one method of one handle: looks `h` up with `get`, runs
/// `f` on the object and answers `SUCCESS` or `f`'s error code.
fn on<T>(
    get: impl FnOnce(H) -> Result<T, u32>,
    h: H,
    f: impl FnOnce(&T) -> hetmem::Result<()>,
) -> ze_result_t {
    guard(|| {
        f(&get(h)?).map_err(ze)?;
        OK
    })
}

/// [`on`] for a wait or a query: answers the [`SyncStatus`] (`SUCCESS` or `NOT_READY`).
fn on_sync<T>(
    get: impl FnOnce(H) -> Result<T, u32>,
    h: H,
    f: impl FnOnce(&T) -> hetmem::Result<SyncStatus>,
) -> ze_result_t {
    guard(|| sync(f(&get(h)?).map_err(ze)?))
}

/// The whole body of a device property query: checks `hDevice`, then fills `*p` (null:
/// `INVALID_NULL_POINTER` naming `what`) with `f`.
unsafe fn device_out<T>(
    hDevice: H,
    p: *mut T,
    what: &str,
    f: impl FnOnce(&hetmem::Device, &mut T),
) -> ze_result_t {
    guard(|| {
        let d = rt::device(hDevice)?;
        f(&d, out(p, what)?);
        OK
    })
}

/// The whole body of a destroy: checks `h` with `get`, then removes it and everything made
/// from it.
fn destroy<T>(get: impl FnOnce(H) -> Result<T, u32>, h: H) -> ze_result_t {
    guard(|| {
        get(h)?;
        rt::remove_tree(h as u64);
        OK
    })
}

/// The count protocol of `zeDriverGet`, `zeDeviceGet`, …: `*pCount == 0` or no array asks for
/// the number; otherwise up to `*pCount` items are written and `*pCount` becomes the number
/// written.
unsafe fn fill_count<T>(
    p_count: *mut u32,
    out_arr: *mut T,
    n: usize,
    mut item: impl FnMut(usize, &mut T),
) -> ZeResult {
    let count = out(p_count, "pCount")?;
    if *count == 0 || out_arr.is_null() {
        *count = n as u32;
        return OK;
    }
    let k = (*count as usize).min(n);
    for i in 0..k {
        item(i, &mut *out_arr.add(i));
    }
    *count = k as u32;
    OK
}

fn copy_str(dst: &mut [u8], s: &str) {
    dst.fill(0);
    let b = s.as_bytes();
    let n = b.len().min(dst.len() - 1);
    dst[..n].copy_from_slice(&b[..n]);
}

/// The extension structures chained on a descriptor, decoded.
#[derive(Default)]
struct Chain {
    relaxed: Option<bool>,
    compression: Option<CompressionHint>,
    ipc_types: Option<IpcHandleTypes>,
    sysmem: Option<(usize, u64)>,
    range: Option<usize>,
}

/// Which chained structures a call accepts.
#[derive(Clone, Copy)]
struct Accept {
    alloc: bool,
    ipc_types: bool,
    sysmem: bool,
    range: bool,
}

/// Walks a `pNext` chain (at most 64 links: a cycle is `INVALID_ARGUMENT`). A structure the
/// call does not take is `UNSUPPORTED_ENUMERATION` naming its stype (the reference driver's
/// answer for a chained descriptor it does not know); the decoding of each structure's fields
/// is hetmem's.
unsafe fn walk(mut p: *const c_void, accept: Accept) -> Result<Chain, u32> {
    let mut c = Chain::default();
    for _ in 0..64 {
        if p.is_null() {
            return Ok(c);
        }
        let base = &*(p as *const ze_base_desc_t);
        match base.stype {
            ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXT_DESC
            | ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC
                if accept.alloc =>
            {
                let d = &*(p as *const ze_relaxed_allocation_limits_ext_desc_t);
                c.relaxed =
                    Some(hetmem::usm::relaxed_limits_from_desc(d.stype, d.flags).map_err(ze)?);
            }
            ZE_STRUCTURE_TYPE_MEMORY_COMPRESSION_HINTS_EXT_DESC if accept.alloc => {
                let d = &*(p as *const ze_memory_compression_hints_ext_desc_t);
                c.compression = Some(CompressionHint::from_raw(d.flags).map_err(ze)?);
            }
            ZE_STRUCTURE_TYPE_IPC_MEM_HANDLE_TYPE_EXT_DESC if accept.ipc_types => {
                let d = &*(p as *const ze_ipc_mem_handle_type_ext_desc_t);
                c.ipc_types = Some(IpcHandleTypes::from_raw(d.typeFlags).map_err(ze)?);
            }
            ZE_STRUCTURE_TYPE_EXTERNAL_MEMMAP_SYSMEM_EXT_DESC if accept.sysmem => {
                let d = &*(p as *const ze_external_memmap_sysmem_ext_desc_t);
                c.sysmem = Some((d.pSystemMemory as usize, d.size));
            }
            ZE_STRUCTURE_TYPE_IPC_PHYS_MEM_HANDLE_RANGE_EXT_DESC if accept.range => {
                let d = &*(p as *const ze_ipc_phys_mem_handle_range_ext_desc_t);
                c.range = Some(d.size);
            }
            s => {
                return Err(fail(
                    ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION,
                    format!("chained structure with stype {s:#x} is not supported by this call"),
                ))
            }
        }
        p = base.pNext;
    }
    Err(fail(
        ZE_RESULT_ERROR_INVALID_ARGUMENT,
        "pNext chain longer than 64 structures (a cycle?)",
    ))
}

/// Checks a C flags field with hetmem's decoder of its flag set.
fn flags(set: FlagSet, v: u32) -> Result<u32, u32> {
    set.check(v).map_err(ze)
}

/// Walks an output structure's `pNext` chain (at most 64 links), calling `f` with each
/// structure's stype and address: the call fills the structures it answers and leaves every
/// other one (and the chain) as the caller wrote it.
unsafe fn each_chained(mut next: *mut c_void, mut f: impl FnMut(u32, *mut c_void)) {
    for _ in 0..64 {
        if next.is_null() {
            return;
        }
        let b = &*(next as *const ze_base_desc_t);
        f(b.stype, next);
        next = b.pNext as *mut c_void;
    }
}

fn handle_out(p: *mut H, h: u64) {
    // SAFETY: checked non-null by the caller.
    unsafe { *p = h as H };
}

// ---------------------------------------------------------------------------------------------
// Driver

#[no_mangle]
pub unsafe extern "C" fn zeInit(flags: u32) -> ze_result_t {
    guard(|| {
        self::flags(FlagSet::Init, flags)?;
        if flags == ZE_INIT_FLAG_VPU_ONLY {
            return Err(fail(
                ZE_RESULT_ERROR_UNINITIALIZED,
                "hetmem devices are GPUs; VPU_ONLY finds none",
            ));
        }
        rt::init()
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeInitDrivers(
    pCount: *mut u32,
    phDrivers: *mut H,
    desc: *mut ze_init_driver_type_desc_t,
) -> ze_result_t {
    guard(|| {
        out(pCount, "pCount")?;
        let d = inp(desc, "desc")?;
        if d.flags == 0 {
            return Err(fail(
                ZE_RESULT_ERROR_INVALID_ENUMERATION,
                "desc->flags is 0 (no driver type asked)",
            ));
        }
        rt::init()?;
        let s = rt::state()?;
        let n = usize::from(d.flags & ZE_INIT_DRIVER_TYPE_FLAG_GPU != 0);
        fill_count(pCount, phDrivers, n, |_, o| *o = s.driver as H)
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeDriverGet(pCount: *mut u32, phDrivers: *mut H) -> ze_result_t {
    guard(|| {
        let s = rt::state()?;
        fill_count(pCount, phDrivers, 1, |_, o| *o = s.driver as H)
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeDriverGetApiVersion(hDriver: H, version: *mut u32) -> ze_result_t {
    guard(|| {
        rt::driver(hDriver)?;
        *out(version, "version")? = DRIVER_API_VERSION;
        OK
    })
}

/// The driver's uuid: "hetmem-ze" and the crate version.
fn driver_uuid() -> [u8; 16] {
    let mut u = [0u8; 16];
    u[..9].copy_from_slice(b"hetmem-ze");
    u[12] = 0;
    u[13] = 1;
    u
}

#[no_mangle]
pub unsafe extern "C" fn zeDriverGetProperties(
    hDriver: H,
    pDriverProperties: *mut ze_driver_properties_t,
) -> ze_result_t {
    guard(|| {
        rt::driver(hDriver)?;
        let p = out(pDriverProperties, "pDriverProperties")?;
        p.uuid.id = driver_uuid();
        p.driverVersion = ze_make_version(0, 1);
        // Chained output structures: the free-policy properties are filled, others left alone.
        let mut next = p.pNext;
        for _ in 0..64 {
            if next.is_null() {
                break;
            }
            let b = &*(next as *const ze_base_desc_t);
            if b.stype == ZE_STRUCTURE_TYPE_DRIVER_MEMORY_FREE_EXT_PROPERTIES {
                let f = &mut *(next as *mut ze_driver_memory_free_ext_properties_t);
                f.freePolicies = rt::state()?.runtime.driver().memory_free_policies();
            }
            next = b.pNext as *mut c_void;
        }
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeDriverGetIpcProperties(
    hDriver: H,
    pIpcProperties: *mut ze_driver_ipc_properties_t,
) -> ze_result_t {
    guard(|| {
        rt::driver(hDriver)?;
        out(pIpcProperties, "pIpcProperties")?.flags = ZE_IPC_PROPERTY_FLAG_MEMORY;
        OK
    })
}

/// The extensions this driver implements, with their versions (all 1.0).
pub const EXTENSIONS: &[(&str, u32)] = &[
    ("ZE_extension_memory_free_policies", ze_make_version(1, 0)),
    (
        "ZE_extension_memory_compression_hints",
        ze_make_version(1, 0),
    ),
    (
        "ZE_extension_relaxed_allocation_limits",
        ze_make_version(1, 0),
    ),
    (
        "ZE_experimental_relaxed_allocation_limits",
        ze_make_version(1, 0),
    ),
    ("ZE_extension_external_memmap_sysmem", ze_make_version(1, 0)),
    ("ZE_extension_ipc_mem_handle_type", ze_make_version(1, 0)),
    (
        "ZE_extension_ipc_phys_mem_handle_range",
        ze_make_version(1, 0),
    ),
];

#[no_mangle]
pub unsafe extern "C" fn zeDriverGetExtensionProperties(
    hDriver: H,
    pCount: *mut u32,
    pExtensionProperties: *mut ze_driver_extension_properties_t,
) -> ze_result_t {
    guard(|| {
        rt::driver(hDriver)?;
        fill_count(pCount, pExtensionProperties, EXTENSIONS.len(), |i, o| {
            copy_str(&mut o.name, EXTENSIONS[i].0);
            o.version = EXTENSIONS[i].1;
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeDriverGetLastErrorDescription(
    hDriver: H,
    ppString: *mut *const c_char,
) -> ze_result_t {
    guard(|| {
        rt::driver(hDriver)?;
        *out(ppString, "ppString")? = rt::last_error_ptr();
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeDriverGetDefaultContext(hDriver: H) -> H {
    let r = std::panic::catch_unwind(|| -> Option<u64> {
        let s = rt::driver(hDriver).ok()?;
        let h = s
            .default_context
            .get_or_init(|| match s.runtime.driver().create_context() {
                Ok(c) => rt::insert(Kind::Context, Obj::Context(c), 0),
                Err(_) => 0,
            });
        Some(*h)
    });
    r.ok().flatten().unwrap_or(0) as H
}

// ---------------------------------------------------------------------------------------------
// Device

#[no_mangle]
pub unsafe extern "C" fn zeDeviceGet(
    hDriver: H,
    pCount: *mut u32,
    phDevices: *mut H,
) -> ze_result_t {
    guard(|| {
        let s = rt::driver(hDriver)?;
        fill_count(pCount, phDevices, s.devices.len(), |i, o| {
            *o = s.devices[i] as H
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeDeviceGetSubDevices(
    hDevice: H,
    pCount: *mut u32,
    phSubdevices: *mut H,
) -> ze_result_t {
    guard(|| {
        let subs = rt::device(hDevice)?.sub_devices();
        fill_count(pCount, phSubdevices, subs.len(), |i, o| {
            *o = rt::handle_of(&subs[i]) as H
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeDeviceGetRootDevice(hDevice: H, phRootDevice: *mut H) -> ze_result_t {
    guard(|| {
        let root = rt::device(hDevice)?.root_device();
        // A root device belongs to no root device: null.
        *out(phRootDevice, "phRootDevice")? = root.map_or(0, |r| rt::handle_of(&r)) as H;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeDeviceGetProperties(
    hDevice: H,
    pDeviceProperties: *mut ze_device_properties_t,
) -> ze_result_t {
    device_out(hDevice, pDeviceProperties, "pDeviceProperties", |d, p| {
        let info = d.info();
        p.r#type = ZE_DEVICE_TYPE_GPU;
        p.vendorId = 0;
        p.deviceId = d.ordinal();
        p.flags = ZE_DEVICE_PROPERTY_FLAG_INTEGRATED;
        p.subdeviceId = 0;
        if let Some(s) = d.sub_device_id() {
            p.flags |= ZE_DEVICE_PROPERTY_FLAG_SUBDEVICE;
            p.subdeviceId = s;
        }
        p.coreClockRate = 1000;
        p.maxMemAllocSize = d.max_alloc_size();
        p.maxHardwareContexts = 64;
        p.maxCommandQueuePriority = 2;
        p.numThreadsPerEU = 1;
        p.physicalEUSimdWidth = 1;
        p.numEUsPerSubslice = 1;
        p.numSubslicesPerSlice = 1;
        p.numSlices = 1;
        p.timerResolution = 1;
        p.timestampValidBits = 64;
        p.kernelTimestampValidBits = 64;
        let mut u = driver_uuid();
        u[14..16].copy_from_slice(&(d.ordinal() as u16).to_le_bytes());
        // A sub-device's uuid: its root's, with its index + 1 in byte 11.
        u[11] = d.sub_device_id().map_or(0, |s| s as u8 + 1);
        p.uuid.id = u;
        match d.sub_device_id() {
            Some(s) => copy_str(&mut p.name, &format!("{} sub-device {s}", info.name)),
            None => copy_str(&mut p.name, &info.name),
        }
        // Chained properties this driver answers; others are left as they are.
        each_chained(p.pNext, |stype, next| {
            if stype == ZE_STRUCTURE_TYPE_DEVICE_READONLY_MEMORY_EXT_PROPERTIES {
                let r = &mut *(next as *mut ze_device_readonly_memory_ext_properties_t);
                if hetmem::vmm::DEVICE_WRITES_TO_READONLY_REFUSED {
                    r.readonlyCapability = ZE_DEVICE_READONLY_MEMORY_CAPABILITY_ENFORCED;
                }
            }
        });
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeDeviceGetComputeProperties(
    hDevice: H,
    p: *mut ze_device_compute_properties_t,
) -> ze_result_t {
    device_out(hDevice, p, "pComputeProperties", |_, p| {
        p.maxTotalGroupSize = 1;
        p.maxGroupSizeX = 1;
        p.maxGroupSizeY = 1;
        p.maxGroupSizeZ = 1;
        p.maxGroupCountX = 1;
        p.maxGroupCountY = 1;
        p.maxGroupCountZ = 1;
        p.maxSharedLocalMemory = 0;
        p.numSubGroupSizes = 1;
        p.subGroupSizes = [1, 0, 0, 0, 0, 0, 0, 0];
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeDeviceGetModuleProperties(
    hDevice: H,
    p: *mut ze_device_module_properties_t,
) -> ze_result_t {
    device_out(hDevice, p, "pModuleProperties", |_, p| {
        // No kernels run on hetmem devices: no SPIR-V version, no native kernels.
        p.spirvVersionSupported = 0;
        p.flags = 0;
        p.fp16flags = 0;
        p.fp32flags = 0;
        p.fp64flags = 0;
        p.maxArgumentsSize = 0;
        p.printfBufferSize = 0;
        p.nativeKernelSupported.id = [0; 16];
    })
}

/// Queues of the one queue group (each queue has its own engine).
pub use hetmem::QUEUES_PER_GROUP;

#[no_mangle]
pub unsafe extern "C" fn zeDeviceGetCommandQueueGroupProperties(
    hDevice: H,
    pCount: *mut u32,
    p: *mut ze_command_queue_group_properties_t,
) -> ze_result_t {
    guard(|| {
        rt::device(hDevice)?;
        fill_count(pCount, p, 1, |_, o| {
            o.flags = ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE
                | ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY;
            o.maxMemoryFillPatternSize = hetmem::MAX_FILL_PATTERN_SIZE;
            o.numQueues = QUEUES_PER_GROUP;
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeDeviceGetMemoryProperties(
    hDevice: H,
    pCount: *mut u32,
    p: *mut ze_device_memory_properties_t,
) -> ze_result_t {
    guard(|| {
        let d = rt::device(hDevice)?;
        // A sub-device's memory is its share of its root's.
        let cap = d.capacity();
        fill_count(pCount, p, 1, |_, o| {
            o.flags = 0;
            o.maxClockRate = 0;
            o.maxBusWidth = 64;
            o.totalSize = cap;
            copy_str(&mut o.name, "hetmem device memory (host RAM)");
            // Chained: the memory extension's physical size (the device's capacity); its
            // design bandwidths are not known (0, unit UNKNOWN) and its memory type is not
            // known either, so `type` is left as the caller wrote it. Others: untouched.
            each_chained(o.pNext, |stype, next| {
                if stype == ZE_STRUCTURE_TYPE_DEVICE_MEMORY_EXT_PROPERTIES {
                    let m = &mut *(next as *mut ze_device_memory_ext_properties_t);
                    m.physicalSize = cap;
                    m.readBandwidth = 0;
                    m.writeBandwidth = 0;
                    m.bandwidthUnit = ZE_BANDWIDTH_UNIT_UNKNOWN;
                }
            });
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeDeviceGetMemoryAccessProperties(
    hDevice: H,
    p: *mut ze_device_memory_access_properties_t,
) -> ze_result_t {
    device_out(hDevice, p, "pMemAccessProperties", |_, p| {
        let all = ZE_MEMORY_ACCESS_CAP_FLAG_RW
            | ZE_MEMORY_ACCESS_CAP_FLAG_ATOMIC
            | ZE_MEMORY_ACCESS_CAP_FLAG_CONCURRENT
            | ZE_MEMORY_ACCESS_CAP_FLAG_CONCURRENT_ATOMIC;
        p.hostAllocCapabilities = all;
        p.deviceAllocCapabilities = all;
        p.sharedSingleDeviceAllocCapabilities = all;
        p.sharedCrossDeviceAllocCapabilities = all;
        // Plain system memory as a queue operand (copies and fills), read and written.
        p.sharedSystemAllocCapabilities = if hetmem::queue::SYSTEM_MEMORY_IN_QUEUES {
            ZE_MEMORY_ACCESS_CAP_FLAG_RW
        } else {
            0
        };
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeDeviceGetCacheProperties(
    hDevice: H,
    pCount: *mut u32,
    p: *mut ze_device_cache_properties_t,
) -> ze_result_t {
    guard(|| {
        rt::device(hDevice)?;
        fill_count(pCount, p, 0, |_, _| {})
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeDeviceGetImageProperties(
    hDevice: H,
    p: *mut ze_device_image_properties_t,
) -> ze_result_t {
    device_out(hDevice, p, "pImageProperties", |_, p| {
        // No image support: every limit is 0.
        p.maxImageDims1D = 0;
        p.maxImageDims2D = 0;
        p.maxImageDims3D = 0;
        p.maxImageBufferSize = 0;
        p.maxImageArraySlices = 0;
        p.maxSamplers = 0;
        p.maxReadImageArgs = 0;
        p.maxWriteImageArgs = 0;
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeDeviceGetExternalMemoryProperties(
    hDevice: H,
    p: *mut ze_device_external_memory_properties_t,
) -> ze_result_t {
    device_out(hDevice, p, "pExternalMemoryProperties", |_, p| {
        p.memoryAllocationImportTypes = 0;
        p.memoryAllocationExportTypes = 0;
        p.imageImportTypes = 0;
        p.imageExportTypes = 0;
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeDeviceGetP2PProperties(
    hDevice: H,
    hPeerDevice: H,
    p: *mut ze_device_p2p_properties_t,
) -> ze_result_t {
    guard(|| {
        rt::device(hDevice)?;
        rt::device(hPeerDevice)?;
        out(p, "pP2PProperties")?.flags =
            ZE_DEVICE_P2P_PROPERTY_FLAG_ACCESS | ZE_DEVICE_P2P_PROPERTY_FLAG_ATOMICS;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeDeviceCanAccessPeer(
    hDevice: H,
    hPeerDevice: H,
    value: *mut ze_bool_t,
) -> ze_result_t {
    guard(|| {
        rt::device(hDevice)?;
        rt::device(hPeerDevice)?;
        // Every device's memory is host memory: every device reaches every other's.
        *out(value, "value")? = 1;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeDeviceGetStatus(hDevice: H) -> ze_result_t {
    guard(|| {
        rt::device(hDevice)?;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeDeviceGetGlobalTimestamps(
    hDevice: H,
    hostTimestamp: *mut u64,
    deviceTimestamp: *mut u64,
) -> ze_result_t {
    guard(|| {
        rt::device(hDevice)?;
        let h = out(hostTimestamp, "hostTimestamp")?;
        let d = out(deviceTimestamp, "deviceTimestamp")?;
        // One clock: the device timer is the host's CLOCK_MONOTONIC, in ns (timerResolution 1).
        let now = hetmem::platform::monotonic_ns();
        *h = now;
        *d = now;
        OK
    })
}

// ---------------------------------------------------------------------------------------------
// Context

#[no_mangle]
pub unsafe extern "C" fn zeContextCreate(
    hDriver: H,
    desc: *const ze_context_desc_t,
    phContext: *mut H,
) -> ze_result_t {
    zeContextCreateEx(hDriver, desc, 0, std::ptr::null_mut(), phContext)
}

#[no_mangle]
pub unsafe extern "C" fn zeContextCreateEx(
    hDriver: H,
    desc: *const ze_context_desc_t,
    numDevices: u32,
    phDevices: *mut H,
    phContext: *mut H,
) -> ze_result_t {
    guard(|| {
        let s = rt::driver(hDriver)?;
        let d = inp(desc, "desc")?;
        out(phContext, "phContext")?;
        flags(FlagSet::Context, d.flags)?;
        if numDevices > 0 && phDevices.is_null() {
            return Err(fail(
                ZE_RESULT_ERROR_INVALID_SIZE,
                format!("phDevices is null with numDevices {numDevices}"),
            ));
        }
        for i in 0..numDevices as usize {
            rt::device(*phDevices.add(i))?;
        }
        let c = s.runtime.driver().create_context().map_err(ze)?;
        handle_out(phContext, rt::insert(Kind::Context, Obj::Context(c), 0));
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeContextDestroy(hContext: H) -> ze_result_t {
    destroy(rt::context, hContext)
}

#[no_mangle]
pub unsafe extern "C" fn zeContextGetStatus(hContext: H) -> ze_result_t {
    guard(|| {
        rt::context(hContext)?;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeContextSystemBarrier(hContext: H, hDevice: H) -> ze_result_t {
    guard(|| {
        rt::context(hContext)?;
        rt::device(hDevice)?;
        OK
    })
}

/// Memory is always resident on hetmem devices: the residency calls check their arguments and
/// do nothing.
#[no_mangle]
pub unsafe extern "C" fn zeContextMakeMemoryResident(
    hContext: H,
    hDevice: H,
    ptr: *mut c_void,
    _size: usize,
) -> ze_result_t {
    guard(|| {
        rt::context(hContext)?;
        rt::device(hDevice)?;
        if ptr.is_null() {
            return Err(null_ptr("ptr"));
        }
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeContextEvictMemory(
    hContext: H,
    hDevice: H,
    ptr: *mut c_void,
    size: usize,
) -> ze_result_t {
    zeContextMakeMemoryResident(hContext, hDevice, ptr, size)
}

// ---------------------------------------------------------------------------------------------
// Memory

const ALLOC_DEVICE: Accept = Accept {
    alloc: true,
    ipc_types: true,
    sysmem: false,
    range: false,
};
const ALLOC_HOST: Accept = Accept {
    alloc: true,
    ipc_types: true,
    sysmem: true,
    range: false,
};
const ALLOC_SHARED: Accept = Accept {
    alloc: true,
    ipc_types: false,
    sysmem: false,
    range: false,
};

fn alloc_desc(size: usize, alignment: usize, c: &Chain) -> AllocDesc {
    let mut d = AllocDesc::new(size)
        .alignment(alignment)
        .relaxed_max_size(c.relaxed.unwrap_or(false));
    if let Some(h) = c.compression {
        d = d.compression(h);
    }
    d
}

#[no_mangle]
pub unsafe extern "C" fn zeMemAllocDevice(
    hContext: H,
    device_desc: *const ze_device_mem_alloc_desc_t,
    size: usize,
    alignment: usize,
    hDevice: H,
    pptr: *mut *mut c_void,
) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        let dev = rt::device(hDevice)?;
        let dd = inp(device_desc, "device_desc")?;
        out(pptr, "pptr")?;
        flags(FlagSet::DeviceAlloc, dd.flags)?;
        let c = walk(dd.pNext, ALLOC_DEVICE)?;
        let desc = alloc_desc(size, alignment, &c);
        let p = match c.ipc_types {
            Some(t) => ctx.alloc_device_with_ipc_types(&dev, &desc, t),
            None => ctx.alloc_device(&dev, &desc),
        }
        .map_err(ze)?;
        *pptr = p as *mut c_void;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeMemAllocHost(
    hContext: H,
    host_desc: *const ze_host_mem_alloc_desc_t,
    size: usize,
    alignment: usize,
    pptr: *mut *mut c_void,
) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        let hd = inp(host_desc, "host_desc")?;
        out(pptr, "pptr")?;
        flags(FlagSet::HostAlloc, hd.flags)?;
        let c = walk(hd.pNext, ALLOC_HOST)?;
        let p = if let Some((sys, sys_size)) = c.sysmem {
            let read_only = hd.flags & ZE_HOST_MEM_ALLOC_FLAG_MEM_READ_ONLY != 0;
            let desc = AllocDesc::new(size).system_memory_sized(sys, sys_size, read_only);
            ctx.alloc_host(&desc)
        } else {
            let desc = alloc_desc(size, alignment, &c);
            match c.ipc_types {
                Some(t) => ctx.alloc_host_with_ipc_types(&desc, t),
                None => ctx.alloc_host(&desc),
            }
        }
        .map_err(ze)?;
        *pptr = p as *mut c_void;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeMemAllocShared(
    hContext: H,
    device_desc: *const ze_device_mem_alloc_desc_t,
    host_desc: *const ze_host_mem_alloc_desc_t,
    size: usize,
    alignment: usize,
    hDevice: H,
    pptr: *mut *mut c_void,
) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        let dev = if hDevice.is_null() {
            None
        } else {
            Some(rt::device(hDevice)?)
        };
        let dd = inp(device_desc, "device_desc")?;
        let hd = inp(host_desc, "host_desc")?;
        out(pptr, "pptr")?;
        flags(FlagSet::DeviceAlloc, dd.flags)?;
        flags(FlagSet::HostAlloc, hd.flags)?;
        let c1 = walk(dd.pNext, ALLOC_SHARED)?;
        let c2 = walk(hd.pNext, ALLOC_SHARED)?;
        let c = Chain {
            relaxed: c1.relaxed.or(c2.relaxed),
            compression: c1.compression.or(c2.compression),
            ..Chain::default()
        };
        let p = ctx
            .alloc_shared(dev.as_ref(), &alloc_desc(size, alignment, &c))
            .map_err(ze)?;
        *pptr = p as *mut c_void;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeMemFree(hContext: H, ptr: *mut c_void) -> ze_result_t {
    guard(|| {
        rt::context(hContext)?
            .free_memory(ptr as usize)
            .map_err(ze)?;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeMemFreeExt(
    hContext: H,
    pMemFreeDesc: *const ze_memory_free_ext_desc_t,
    ptr: *mut c_void,
) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        let d = inp(pMemFreeDesc, "pMemFreeDesc")?;
        let policy = FreePolicy::from_desc(d.stype, d.freePolicy).map_err(ze)?;
        ctx.free_memory_ext(ptr as usize, policy).map_err(ze)?;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeMemGetAllocProperties(
    hContext: H,
    ptr: *const c_void,
    pMemAllocProperties: *mut ze_memory_allocation_properties_t,
    phDevice: *mut H,
) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        let p = out(pMemAllocProperties, "pMemAllocProperties")?;
        let a = ctx.get_allocation_properties(ptr as usize).map_err(ze)?;
        p.r#type = a.memory_type as u32;
        p.id = a.id;
        p.pageSize = a.page_size as u64;
        if !phDevice.is_null() {
            *phDevice = a
                .device
                .map(|o| rt::device_handle(o, a.sub_device))
                .unwrap_or(0) as H;
        }
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeMemGetAddressRange(
    hContext: H,
    ptr: *const c_void,
    pBase: *mut *mut c_void,
    pSize: *mut usize,
) -> ze_result_t {
    guard(|| {
        let (b, s) = rt::context(hContext)?
            .get_address_range(ptr as usize)
            .map_err(ze)?;
        if !pBase.is_null() {
            *pBase = b as *mut c_void;
        }
        if !pSize.is_null() {
            *pSize = s;
        }
        OK
    })
}

fn to_c(h: &IpcHandle) -> ze_ipc_mem_handle_t {
    ze_ipc_mem_handle_t { data: h.data }
}

/// A `ze_physical_mem_handle_t` passed as the pointer of `zeMemGetIpcHandle*` (case 7 of
/// `shared/cases/level-zero.md`; the reference driver accepts it, to share physical memory
/// before it is mapped anywhere): the object a live physical-memory handle names. Handles are
/// `(kind << 48) | serial` ([`rt`]), never a user-space address, so no pointer is taken for one.
fn physical_as_pointer(ptr: *const c_void) -> Option<hetmem::PhysicalMemory> {
    if ptr as u64 >> 48 != Kind::Physical as u64 {
        return None;
    }
    rt::physical(ptr as H).ok()
}

#[no_mangle]
pub unsafe extern "C" fn zeMemGetIpcHandle(
    hContext: H,
    ptr: *const c_void,
    pIpcHandle: *mut ze_ipc_mem_handle_t,
) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        let o = out(pIpcHandle, "pIpcHandle")?;
        let h = match physical_as_pointer(ptr) {
            Some(p) => ctx.get_physical_memory_ipc_handle(p, None),
            None => ctx.get_ipc_handle(ptr as usize),
        };
        *o = to_c(&h.map_err(ze)?);
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeMemGetIpcHandleWithProperties(
    hContext: H,
    ptr: *const c_void,
    pNext: *mut c_void,
    pIpcHandle: *mut ze_ipc_mem_handle_t,
) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        let o = out(pIpcHandle, "pIpcHandle")?;
        let c = walk(
            pNext,
            Accept {
                alloc: false,
                ipc_types: true,
                sysmem: false,
                range: true,
            },
        )?;
        let props = IpcProperties {
            handle_types: c.ipc_types,
            range_size: c.range,
        };
        let h = match physical_as_pointer(ptr).filter(|_| c.range.is_none()) {
            Some(p) => ctx.get_physical_memory_ipc_handle(p, c.ipc_types),
            None => ctx.get_ipc_handle_with_properties(ptr as usize, &props),
        };
        *o = to_c(&h.map_err(ze)?);
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeMemOpenIpcHandle(
    hContext: H,
    hDevice: H,
    handle: ze_ipc_mem_handle_t,
    flags: u32,
    pptr: *mut *mut c_void,
) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        rt::device(hDevice)?;
        let o = out(pptr, "pptr")?;
        let p = ctx
            .open_ipc_handle(&IpcHandle::from_bytes(handle.data), flags)
            .map_err(ze)?;
        *o = p as *mut c_void;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeMemCloseIpcHandle(hContext: H, ptr: *const c_void) -> ze_result_t {
    guard(|| {
        rt::context(hContext)?
            .close_ipc_handle(ptr as usize)
            .map_err(ze)?;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeMemPutIpcHandle(
    hContext: H,
    handle: ze_ipc_mem_handle_t,
) -> ze_result_t {
    guard(|| {
        rt::context(hContext)?
            .put_ipc_handle(&IpcHandle::from_bytes(handle.data))
            .map_err(ze)?;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeMemGetIpcHandleFromFileDescriptorExp(
    hContext: H,
    handle: u64,
    pIpcHandle: *mut ze_ipc_mem_handle_t,
) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        let o = out(pIpcHandle, "pIpcHandle")?;
        let fd = i32::try_from(handle).map_err(|_| {
            fail(
                ZE_RESULT_ERROR_INVALID_ARGUMENT,
                format!("file descriptor {handle} does not fit an int"),
            )
        })?;
        *o = to_c(&ctx.ipc_handle_from_fd(fd).map_err(ze)?);
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeMemGetFileDescriptorFromIpcHandleExp(
    hContext: H,
    ipcHandle: ze_ipc_mem_handle_t,
    pHandle: *mut u64,
) -> ze_result_t {
    guard(|| {
        rt::context(hContext)?;
        let o = out(pHandle, "pHandle")?;
        let h = IpcHandle::from_bytes(ipcHandle.data);
        if h.kind().is_none() {
            return Err(fail(
                ZE_RESULT_ERROR_INVALID_ARGUMENT,
                "the 64 bytes are not a hetmem IPC handle",
            ));
        }
        *o = h.fd() as u32 as u64;
        OK
    })
}

// ---------------------------------------------------------------------------------------------
// Virtual and physical memory

fn access(v: u32) -> Result<AccessAttribute, u32> {
    AccessAttribute::from_raw(v).map_err(ze)
}

#[no_mangle]
pub unsafe extern "C" fn zeVirtualMemReserve(
    hContext: H,
    pStart: *const c_void,
    size: usize,
    pptr: *mut *mut c_void,
) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        let o = out(pptr, "pptr")?;
        let hint = (!pStart.is_null()).then_some(pStart as usize);
        *o = ctx.reserve(hint, size).map_err(ze)?.as_ptr() as *mut c_void;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeVirtualMemFree(
    hContext: H,
    ptr: *const c_void,
    size: usize,
) -> ze_result_t {
    guard(|| {
        rt::context(hContext)?
            .free(ptr as usize, size)
            .map_err(ze)?;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeVirtualMemQueryPageSize(
    hContext: H,
    hDevice: H,
    size: usize,
    pagesize: *mut usize,
) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        let dev = rt::device(hDevice)?;
        let o = out(pagesize, "pagesize")?;
        *o = ctx.query_page_size(&dev, size).map_err(ze)?;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zePhysicalMemCreate(
    hContext: H,
    hDevice: H,
    desc: *const ze_physical_mem_desc_t,
    phPhysicalMemory: *mut H,
) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        let dev = if hDevice.is_null() {
            None
        } else {
            Some(rt::device(hDevice)?)
        };
        let d = inp(desc, "desc")?;
        out(phPhysicalMemory, "phPhysicalMemory")?;
        let flags = PhysicalMemoryFlags::from_raw(d.flags).map_err(ze)?;
        let c = walk(
            d.pNext,
            Accept {
                alloc: false,
                ipc_types: true,
                sysmem: false,
                range: false,
            },
        )?;
        let p = match c.ipc_types {
            Some(t) => ctx.create_physical_memory_with_ipc_types(dev.as_ref(), flags, d.size, t),
            None => ctx.create_physical_memory(dev.as_ref(), flags, d.size),
        }
        .map_err(ze)?;
        handle_out(
            phPhysicalMemory,
            rt::insert(Kind::Physical, Obj::Physical(p), hContext as u64),
        );
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zePhysicalMemDestroy(hContext: H, hPhysicalMemory: H) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        let p = rt::physical(hPhysicalMemory)?;
        ctx.destroy_physical_memory(p).map_err(ze)?;
        rt::remove_tree(hPhysicalMemory as u64);
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zePhysicalMemGetProperties(
    hContext: H,
    hPhysicalMemory: H,
    pMemProperties: *mut ze_physical_mem_properties_t,
) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        let p = rt::physical(hPhysicalMemory)?;
        let o = out(pMemProperties, "pMemProperties")?;
        let props = ctx.physical_memory_properties(&p).map_err(ze)?;
        o.id = props.id;
        o.size = props.size as u64;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeVirtualMemMap(
    hContext: H,
    ptr: *const c_void,
    size: usize,
    hPhysicalMemory: H,
    offset: usize,
    access_: u32,
) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        let p = rt::physical(hPhysicalMemory)?;
        let a = access(access_)?;
        ctx.map(ptr as usize, size, p, offset, a).map_err(ze)?;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeVirtualMemUnmap(
    hContext: H,
    ptr: *const c_void,
    size: usize,
) -> ze_result_t {
    guard(|| {
        rt::context(hContext)?
            .unmap(ptr as usize, size)
            .map_err(ze)?;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeVirtualMemSetAccessAttribute(
    hContext: H,
    ptr: *const c_void,
    size: usize,
    access_: u32,
) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        let a = access(access_)?;
        ctx.set_access_attribute(ptr as usize, size, a)
            .map_err(ze)?;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeVirtualMemGetAccessAttribute(
    hContext: H,
    ptr: *const c_void,
    size: usize,
    access_: *mut u32,
    outSize: *mut usize,
) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        let a = out(access_, "access")?;
        let s = out(outSize, "outSize")?;
        let (attr, len) = ctx.get_access_attribute(ptr as usize, size).map_err(ze)?;
        *a = attr as u32;
        *s = len;
        OK
    })
}

// ---------------------------------------------------------------------------------------------
// Command queues and lists

/// Decodes a queue descriptor with hetmem's decoder ([`CommandQueueDesc::from_raw`]).
fn queue_desc(d: &ze_command_queue_desc_t) -> Result<CommandQueueDesc, u32> {
    CommandQueueDesc::from_raw(d.ordinal, d.index, d.flags, d.mode, d.priority).map_err(ze)
}

#[no_mangle]
pub unsafe extern "C" fn zeCommandQueueCreate(
    hContext: H,
    hDevice: H,
    desc: *const ze_command_queue_desc_t,
    phCommandQueue: *mut H,
) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        let dev = rt::device(hDevice)?;
        let d = inp(desc, "desc")?;
        out(phCommandQueue, "phCommandQueue")?;
        let qd = queue_desc(d)?;
        let synchronous = qd.is_synchronous();
        let q = ctx.create_command_queue_with(&dev, &qd).map_err(ze)?;
        let obj = Obj::Queue(Arc::new(rt::QueueObj {
            queue: q,
            synchronous,
        }));
        handle_out(
            phCommandQueue,
            rt::insert(Kind::Queue, obj, hContext as u64),
        );
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeCommandQueueDestroy(hCommandQueue: H) -> ze_result_t {
    destroy(rt::queue, hCommandQueue)
}

#[no_mangle]
pub unsafe extern "C" fn zeCommandQueueExecuteCommandLists(
    hCommandQueue: H,
    numCommandLists: u32,
    phCommandLists: *mut H,
    hFence: H,
) -> ze_result_t {
    guard(|| {
        let q = rt::queue(hCommandQueue)?;
        if phCommandLists.is_null() {
            return Err(null_ptr("phCommandLists"));
        }
        let mut lists = Vec::with_capacity(numCommandLists as usize);
        for i in 0..numCommandLists as usize {
            lists.push(rt::list(*phCommandLists.add(i))?);
        }
        let fence = if hFence.is_null() {
            None
        } else {
            Some(rt::fence(hFence)?)
        };
        let refs: Vec<&hetmem::CommandList> = lists.iter().map(|l| &l.list).collect();
        q.queue
            .execute_command_lists(&refs, fence.as_deref())
            .map_err(ze)?;
        if q.synchronous {
            q.queue.synchronize(u64::MAX).map_err(ze)?;
        }
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeCommandQueueSynchronize(hCommandQueue: H, timeout: u64) -> ze_result_t {
    on_sync(rt::queue, hCommandQueue, |q| q.queue.synchronize(timeout))
}

#[no_mangle]
pub unsafe extern "C" fn zeCommandListCreate(
    hContext: H,
    hDevice: H,
    desc: *const ze_command_list_desc_t,
    phCommandList: *mut H,
) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        let dev = rt::device(hDevice)?;
        let d = inp(desc, "desc")?;
        out(phCommandList, "phCommandList")?;
        let ld = CommandListDesc::from_raw(d.commandQueueGroupOrdinal, d.flags).map_err(ze)?;
        let l = ctx.create_command_list_with(&dev, &ld).map_err(ze)?;
        let obj = Obj::List(Arc::new(rt::ListObj {
            list: l,
            synchronous: false,
        }));
        handle_out(phCommandList, rt::insert(Kind::List, obj, hContext as u64));
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeCommandListCreateImmediate(
    hContext: H,
    hDevice: H,
    altdesc: *const ze_command_queue_desc_t,
    phCommandList: *mut H,
) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        let dev = rt::device(hDevice)?;
        let d = inp(altdesc, "altdesc")?;
        out(phCommandList, "phCommandList")?;
        let qd = queue_desc(d)?;
        let synchronous = qd.is_synchronous();
        let l = ctx
            .create_immediate_command_list_with(&dev, &qd)
            .map_err(ze)?;
        let obj = Obj::List(Arc::new(rt::ListObj {
            list: l,
            synchronous,
        }));
        handle_out(phCommandList, rt::insert(Kind::List, obj, hContext as u64));
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeCommandListDestroy(hCommandList: H) -> ze_result_t {
    destroy(rt::list, hCommandList)
}

#[no_mangle]
pub unsafe extern "C" fn zeCommandListClose(hCommandList: H) -> ze_result_t {
    on(rt::list, hCommandList, |l| l.list.close())
}

#[no_mangle]
pub unsafe extern "C" fn zeCommandListReset(hCommandList: H) -> ze_result_t {
    on(rt::list, hCommandList, |l| l.list.reset())
}

#[no_mangle]
pub unsafe extern "C" fn zeCommandListHostSynchronize(
    hCommandList: H,
    timeout: u64,
) -> ze_result_t {
    on_sync(rt::list, hCommandList, |l| l.list.host_synchronize(timeout))
}

/// The signal event and the wait list of an append.
unsafe fn events(signal: H, num: u32, waits: *mut H) -> Result<(Option<Event>, Vec<Event>), u32> {
    let s = if signal.is_null() {
        None
    } else {
        Some(rt::event(signal)?.event.clone())
    };
    if num > 0 && waits.is_null() {
        return Err(fail(
            ZE_RESULT_ERROR_INVALID_SIZE,
            format!("phWaitEvents is null with numWaitEvents {num}"),
        ));
    }
    let mut w = Vec::with_capacity(num as usize);
    for i in 0..num as usize {
        w.push(rt::event(*waits.add(i))?.event.clone());
    }
    Ok((s, w))
}

/// Runs an append; a synchronous immediate list waits for it.
fn appended(l: &rt::ListObj, r: hetmem::Result<()>) -> ZeResult {
    r.map_err(ze)?;
    if l.synchronous {
        l.list.host_synchronize(u64::MAX).map_err(ze)?;
    }
    OK
}

#[no_mangle]
pub unsafe extern "C" fn zeCommandListAppendMemoryCopy(
    hCommandList: H,
    dstptr: *mut c_void,
    srcptr: *const c_void,
    size: usize,
    hSignalEvent: H,
    numWaitEvents: u32,
    phWaitEvents: *mut H,
) -> ze_result_t {
    guard(|| {
        let l = rt::list(hCommandList)?;
        let (s, w) = events(hSignalEvent, numWaitEvents, phWaitEvents)?;
        let w: Vec<&Event> = w.iter().collect();
        appended(
            &l,
            l.list
                .append_memory_copy(dstptr as usize, srcptr as usize, size, s.as_ref(), &w),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeCommandListAppendMemoryFill(
    hCommandList: H,
    ptr: *mut c_void,
    pattern: *const c_void,
    pattern_size: usize,
    size: usize,
    hSignalEvent: H,
    numWaitEvents: u32,
    phWaitEvents: *mut H,
) -> ze_result_t {
    guard(|| {
        let l = rt::list(hCommandList)?;
        if pattern.is_null() {
            return Err(null_ptr("pattern"));
        }
        let (s, w) = events(hSignalEvent, numWaitEvents, phWaitEvents)?;
        let w: Vec<&Event> = w.iter().collect();
        // Only a pattern of a size hetmem can accept is read from C; any other size is passed
        // as a stand-in of MAX + 1 bytes, which hetmem refuses with its own message.
        let pat: Vec<u8> = if pattern_size <= hetmem::MAX_FILL_PATTERN_SIZE {
            std::slice::from_raw_parts(pattern as *const u8, pattern_size).to_vec()
        } else {
            vec![0; hetmem::MAX_FILL_PATTERN_SIZE + 1]
        };
        appended(
            &l,
            l.list
                .append_memory_fill(ptr as usize, &pat, size, s.as_ref(), &w),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeCommandListAppendBarrier(
    hCommandList: H,
    hSignalEvent: H,
    numWaitEvents: u32,
    phWaitEvents: *mut H,
) -> ze_result_t {
    guard(|| {
        let l = rt::list(hCommandList)?;
        let (s, w) = events(hSignalEvent, numWaitEvents, phWaitEvents)?;
        let w: Vec<&Event> = w.iter().collect();
        appended(&l, l.list.append_barrier(s.as_ref(), &w))
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeCommandListAppendMemoryRangesBarrier(
    hCommandList: H,
    numRanges: u32,
    pRangeSizes: *const usize,
    pRanges: *mut *const c_void,
    hSignalEvent: H,
    numWaitEvents: u32,
    phWaitEvents: *mut H,
) -> ze_result_t {
    guard(|| {
        if numRanges > 0 && (pRangeSizes.is_null() || pRanges.is_null()) {
            return Err(null_ptr("pRangeSizes / pRanges"));
        }
        // Queues are in order and memory is coherent: a ranges barrier is a barrier.
        let r = zeCommandListAppendBarrier(hCommandList, hSignalEvent, numWaitEvents, phWaitEvents);
        if r == ZE_RESULT_SUCCESS {
            OK
        } else {
            Err(r)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeCommandListAppendSignalEvent(hCommandList: H, hEvent: H) -> ze_result_t {
    guard(|| {
        let l = rt::list(hCommandList)?;
        let e = rt::event(hEvent)?;
        appended(&l, l.list.append_signal_event(&e.event))
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeCommandListAppendWaitOnEvents(
    hCommandList: H,
    numEvents: u32,
    phEvents: *mut H,
) -> ze_result_t {
    guard(|| {
        let l = rt::list(hCommandList)?;
        if phEvents.is_null() {
            return Err(null_ptr("phEvents"));
        }
        let (_, w) = events(std::ptr::null_mut(), numEvents, phEvents)?;
        let w: Vec<&Event> = w.iter().collect();
        appended(&l, l.list.append_wait_on_events(&w))
    })
}

/// Prefetch and advice are hints: memory is always where every device reaches it. They check
/// their arguments and do nothing.
#[no_mangle]
pub unsafe extern "C" fn zeCommandListAppendMemoryPrefetch(
    hCommandList: H,
    ptr: *const c_void,
    _size: usize,
) -> ze_result_t {
    guard(|| {
        rt::list(hCommandList)?;
        if ptr.is_null() {
            return Err(null_ptr("ptr"));
        }
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeCommandListAppendMemAdvise(
    hCommandList: H,
    hDevice: H,
    ptr: *const c_void,
    _size: usize,
    advice: u32,
) -> ze_result_t {
    guard(|| {
        rt::list(hCommandList)?;
        rt::device(hDevice)?;
        if ptr.is_null() {
            return Err(null_ptr("ptr"));
        }
        MemoryAdvice::from_raw(advice).map_err(ze)?;
        OK
    })
}

// ---------------------------------------------------------------------------------------------
// Events and fences

#[no_mangle]
pub unsafe extern "C" fn zeEventPoolCreate(
    hContext: H,
    desc: *const ze_event_pool_desc_t,
    numDevices: u32,
    phDevices: *mut H,
    phEventPool: *mut H,
) -> ze_result_t {
    guard(|| {
        let ctx = rt::context(hContext)?;
        let d = inp(desc, "desc")?;
        out(phEventPool, "phEventPool")?;
        flags(FlagSet::EventPool, d.flags)?;
        if numDevices > 0 && phDevices.is_null() {
            return Err(fail(
                ZE_RESULT_ERROR_INVALID_SIZE,
                format!("phDevices is null with numDevices {numDevices}"),
            ));
        }
        for i in 0..numDevices as usize {
            rt::device(*phDevices.add(i))?;
        }
        let p = ctx.create_event_pool(d.count).map_err(ze)?;
        handle_out(
            phEventPool,
            rt::insert(
                Kind::EventPool,
                Obj::EventPool(Arc::new(p)),
                hContext as u64,
            ),
        );
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeEventPoolDestroy(hEventPool: H) -> ze_result_t {
    guard(|| {
        rt::pool(hEventPool)?;
        for ev in rt::events_of_pool(hEventPool as u64) {
            ev.event.check_destroy().map_err(ze)?;
        }
        rt::remove_tree(hEventPool as u64);
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeEventCreate(
    hEventPool: H,
    desc: *const ze_event_desc_t,
    phEvent: *mut H,
) -> ze_result_t {
    guard(|| {
        let p = rt::pool(hEventPool)?;
        let d = inp(desc, "desc")?;
        out(phEvent, "phEvent")?;
        flags(FlagSet::EventScope, d.signal)?;
        flags(FlagSet::EventScope, d.wait)?;
        let ev = p.create_event(d.index).map_err(ze)?;
        let obj = Obj::Event(Arc::new(rt::EventObj {
            event: ev,
            pool: hEventPool as u64,
        }));
        handle_out(phEvent, rt::insert(Kind::Event, obj, hEventPool as u64));
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeEventDestroy(hEvent: H) -> ze_result_t {
    on(rt::event, hEvent, |e| {
        e.event.check_destroy()?;
        rt::remove_tree(hEvent as u64);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeEventHostSignal(hEvent: H) -> ze_result_t {
    on(rt::event, hEvent, |e| e.event.host_signal())
}

#[no_mangle]
pub unsafe extern "C" fn zeEventHostSynchronize(hEvent: H, timeout: u64) -> ze_result_t {
    on_sync(rt::event, hEvent, |e| e.event.host_synchronize(timeout))
}

#[no_mangle]
pub unsafe extern "C" fn zeEventQueryStatus(hEvent: H) -> ze_result_t {
    on_sync(rt::event, hEvent, |e| e.event.query_status())
}

#[no_mangle]
pub unsafe extern "C" fn zeEventHostReset(hEvent: H) -> ze_result_t {
    on(rt::event, hEvent, |e| e.event.host_reset())
}

#[no_mangle]
pub unsafe extern "C" fn zeFenceCreate(
    hCommandQueue: H,
    desc: *const ze_fence_desc_t,
    phFence: *mut H,
) -> ze_result_t {
    guard(|| {
        let q = rt::queue(hCommandQueue)?;
        let d = inp(desc, "desc")?;
        out(phFence, "phFence")?;
        let fl = flags(FlagSet::Fence, d.flags)?;
        let f = q
            .queue
            .create_fence(fl & ZE_FENCE_FLAG_SIGNALED != 0)
            .map_err(ze)?;
        handle_out(
            phFence,
            rt::insert(Kind::Fence, Obj::Fence(Arc::new(f)), hCommandQueue as u64),
        );
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn zeFenceDestroy(hFence: H) -> ze_result_t {
    destroy(rt::fence, hFence)
}

#[no_mangle]
pub unsafe extern "C" fn zeFenceHostSynchronize(hFence: H, timeout: u64) -> ze_result_t {
    on_sync(rt::fence, hFence, |f| f.host_synchronize(timeout))
}

#[no_mangle]
pub unsafe extern "C" fn zeFenceQueryStatus(hFence: H) -> ze_result_t {
    on_sync(rt::fence, hFence, |f| f.query_status())
}

#[no_mangle]
pub unsafe extern "C" fn zeFenceReset(hFence: H) -> ze_result_t {
    on(rt::fence, hFence, |f| f.reset())
}

/// hetmem's memory type in C (`ze_memory_type_t`).
pub fn memory_type_c(t: MemoryType) -> u32 {
    t as u32
}
