//! Small wrappers over the CUDA driver API calls the cuda backend makes, one per call, each
//! naming the driver function (its documentation in the CUDA Driver API reference). The driver
//! library is loaded at run time by `cudarc` (`dynamic-loading`), so this builds and links on
//! machines without it; [`load`] says why the driver cannot be used before anything else is
//! called.

use std::ffi::{c_void, CStr};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use cudarc::driver::sys;

use crate::backend::HalError;

pub(crate) use sys::{CUcontext, CUdevice, CUdeviceptr, CUmemGenericAllocationHandle};

/// What the granularity and location queries and `cuMemCreate` are told.
pub(crate) fn allocation_prop(
    location: sys::CUmemLocation,
    posix_fd: bool,
) -> sys::CUmemAllocationProp {
    // SAFETY: the struct is plain data for which all-zero bytes are valid (null pointer, zero
    // flags); the fields that matter are set below.
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = if posix_fd {
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    } else {
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
    };
    p.location = location;
    p
}

/// The location of device `ordinal`'s memory (`CU_MEM_LOCATION_TYPE_DEVICE`).
pub(crate) fn device_location(ordinal: u32) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: ordinal as i32,
    }
}

/// The location of host memory on NUMA node `node` (`CU_MEM_LOCATION_TYPE_HOST_NUMA`: the
/// plain `CU_MEM_LOCATION_TYPE_HOST` is refused by `cuMemCreate` on driver 580).
pub(crate) fn host_numa_location(node: u32) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA,
        id: node as i32,
    }
}

/// Whether the driver library can be loaded (tried once).
fn driver_present() -> bool {
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: only tries to open the library.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// The name and number of a driver result (`cuGetErrorName`; the number alone where there is
/// no driver to ask).
pub(crate) fn error_name(r: sys::CUresult) -> String {
    if !driver_present() {
        return format!("CUDA error {}", r as u32);
    }
    let mut p: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string or fails.
    let ok = unsafe { sys::cuGetErrorName(r, &mut p) } == sys::CUresult::CUDA_SUCCESS;
    if ok && !p.is_null() {
        // SAFETY: the driver's error names are static, NUL-terminated strings.
        let s = unsafe { CStr::from_ptr(p) }.to_string_lossy();
        format!("{s} ({})", r as u32)
    } else {
        format!("CUDA error {}", r as u32)
    }
}

/// Turns a driver result into the backend's error, naming the call: out of memory is
/// device or host memory as `device_memory` says, `CUDA_ERROR_NOT_SUPPORTED` is
/// [`HalError::Unsupported`], the sticky errors that leave the context unusable are
/// [`HalError::DeviceLost`].
pub(crate) fn check(what: &str, r: sys::CUresult, device_memory: bool) -> Result<(), HalError> {
    use sys::CUresult as R;
    if r == R::CUDA_SUCCESS {
        return Ok(());
    }
    let m = format!("{what} failed: {}", error_name(r));
    Err(match r {
        R::CUDA_ERROR_OUT_OF_MEMORY if device_memory => HalError::OutOfDeviceMemory(m),
        R::CUDA_ERROR_OUT_OF_MEMORY => HalError::OutOfHostMemory(m),
        R::CUDA_ERROR_NOT_SUPPORTED => HalError::Unsupported(m),
        R::CUDA_ERROR_ILLEGAL_ADDRESS
        | R::CUDA_ERROR_LAUNCH_FAILED
        | R::CUDA_ERROR_ECC_UNCORRECTABLE
        | R::CUDA_ERROR_HARDWARE_STACK_ERROR
        | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
        | R::CUDA_ERROR_MISALIGNED_ADDRESS
        | R::CUDA_ERROR_INVALID_ADDRESS_SPACE
        | R::CUDA_ERROR_INVALID_PC
        | R::CUDA_ERROR_CONTEXT_IS_DESTROYED => HalError::DeviceLost(m),
        _ => HalError::Unexpected(m),
    })
}

/// Loads the driver library and initialises it (`cuInit(0)`), returning the driver version
/// (`cuDriverGetVersion`, e.g. 13000 for CUDA 13.0) and the device count
/// (`cuDeviceGetCount`). `Err` says why the cuda backend cannot run here: no `libcuda.so`
/// (no NVIDIA driver installed), a driver that lacks a function this backend calls, `cuInit`
/// failing (no GPU, or the kernel module not loaded), or no device.
pub(crate) fn load() -> Result<(i32, i32), String> {
    if !driver_present() {
        return Err(
            "no CUDA driver library (libcuda.so) was found: the NVIDIA driver is not \
             installed on this machine"
                .into(),
        );
    }
    // cudarc panics on a missing symbol: an old driver. Turn that into the reason.
    let r = std::panic::catch_unwind(|| {
        // SAFETY: cuInit takes flags 0; the out-pointers are valid.
        unsafe {
            let r = sys::cuInit(0);
            if r != sys::CUresult::CUDA_SUCCESS {
                return Err(format!(
                    "cuInit(0) failed: {} (no usable NVIDIA GPU, or its kernel module is not loaded)",
                    error_name(r)
                ));
            }
            let mut v = 0;
            check("cuDriverGetVersion", sys::cuDriverGetVersion(&mut v), false)
                .map_err(|e| e.to_string())?;
            let mut n = 0;
            check("cuDeviceGetCount", sys::cuDeviceGetCount(&mut n), false)
                .map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("the CUDA driver reports no device".into());
            }
            Ok((v, n))
        }
    });
    match r {
        Ok(r) => r,
        Err(p) => Err(format!(
            "the CUDA driver lacks a function the cuda backend needs (driver too old?): {}",
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
    }
}

/// `cuDeviceGet`.
pub(crate) fn device(ordinal: i32) -> Result<CUdevice, HalError> {
    let mut d = 0;
    // SAFETY: valid out-pointer.
    check(
        "cuDeviceGet",
        unsafe { sys::cuDeviceGet(&mut d, ordinal) },
        false,
    )?;
    Ok(d)
}

/// `cuDeviceGetName`.
pub(crate) fn device_name(d: CUdevice) -> String {
    let mut buf = [0 as std::ffi::c_char; 256];
    // SAFETY: the buffer holds 256 chars, as told.
    if unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), 256, d) } != sys::CUresult::CUDA_SUCCESS {
        return "unknown CUDA device".into();
    }
    // SAFETY: the driver NUL-terminates the name inside the buffer.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// `cuDeviceTotalMem`.
pub(crate) fn total_mem(d: CUdevice) -> Result<u64, HalError> {
    let mut b = 0usize;
    // SAFETY: valid out-pointer.
    check(
        "cuDeviceTotalMem",
        unsafe { sys::cuDeviceTotalMem_v2(&mut b, d) },
        false,
    )?;
    Ok(b as u64)
}

/// `cuDeviceGetAttribute`.
pub(crate) fn attribute(d: CUdevice, a: sys::CUdevice_attribute) -> i32 {
    let mut v = 0;
    // SAFETY: valid out-pointer.
    if unsafe { sys::cuDeviceGetAttribute(&mut v, a, d) } != sys::CUresult::CUDA_SUCCESS {
        return 0;
    }
    v
}

/// `cuDeviceCanAccessPeer`.
pub(crate) fn can_access_peer(d: CUdevice, peer: CUdevice) -> bool {
    let mut v = 0;
    // SAFETY: valid out-pointer.
    let r = unsafe { sys::cuDeviceCanAccessPeer(&mut v, d, peer) };
    r == sys::CUresult::CUDA_SUCCESS && v != 0
}

/// `cuDevicePrimaryCtxRetain`.
pub(crate) fn primary_context(d: CUdevice) -> Result<CUcontext, HalError> {
    let mut c = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    check(
        "cuDevicePrimaryCtxRetain",
        unsafe { sys::cuDevicePrimaryCtxRetain(&mut c, d) },
        false,
    )?;
    Ok(c)
}

/// `cuCtxSetCurrent`: makes `c` the calling thread's context (the calls that allocate or
/// create streams act on it). Cheap: a thread-local store in the driver.
pub(crate) fn set_current(c: CUcontext) -> Result<(), HalError> {
    // SAFETY: `c` is a retained primary context.
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(c) }, false)
}

/// `cuMemGetAllocationGranularity(CU_MEM_ALLOC_GRANULARITY_MINIMUM)` for memory at `loc`.
pub(crate) fn granularity(loc: sys::CUmemLocation) -> Result<usize, HalError> {
    let prop = allocation_prop(loc, true);
    let mut g = 0usize;
    // SAFETY: valid pointers.
    check(
        "cuMemGetAllocationGranularity",
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        },
        false,
    )?;
    Ok(g)
}

/// `cuMemAddressReserve(&ptr, size, align, hint, 0)`.
pub(crate) fn address_reserve(size: usize, align: usize, hint: usize) -> Result<usize, HalError> {
    let mut p: CUdeviceptr = 0;
    // SAFETY: valid out-pointer; reserving address space changes no existing mapping.
    check(
        "cuMemAddressReserve",
        unsafe { sys::cuMemAddressReserve(&mut p, size, align, hint as CUdeviceptr, 0) },
        false,
    )?;
    Ok(p as usize)
}

/// `cuMemAddressFree`.
///
/// # Safety
/// `[addr, addr+size)` is exactly one reservation with nothing mapped inside.
pub(crate) unsafe fn address_free(addr: usize, size: usize) -> Result<(), HalError> {
    // SAFETY: forwarded contract.
    check(
        "cuMemAddressFree",
        unsafe { sys::cuMemAddressFree(addr as CUdeviceptr, size) },
        false,
    )
}

/// `cuMemCreate(&handle, size, prop, 0)` with a POSIX-fd shareable handle type.
pub(crate) fn mem_create(
    size: usize,
    loc: sys::CUmemLocation,
) -> Result<CUmemGenericAllocationHandle, HalError> {
    let prop = allocation_prop(loc, true);
    let mut h = 0;
    let device = loc.type_ == sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    // SAFETY: valid pointers.
    check(
        "cuMemCreate",
        unsafe { sys::cuMemCreate(&mut h, size, &prop, 0) },
        device,
    )?;
    Ok(h)
}

/// `cuMemRelease`. The memory lives on while any mapping of it does.
///
/// # Safety
/// `h` came from [`mem_create`] and is not used again.
pub(crate) unsafe fn mem_release(h: CUmemGenericAllocationHandle) {
    // SAFETY: forwarded contract.
    let _ = unsafe { sys::cuMemRelease(h) };
}

/// `cuMemMap(addr, size, 0, h, 0)`: the whole allocation `h` (the driver maps an allocation
/// only whole, at offset 0: `CUDA_ERROR_NOT_SUPPORTED` otherwise).
///
/// # Safety
/// `[addr, addr+size)` is reserved and unmapped; `size` is `h`'s size.
pub(crate) unsafe fn mem_map(
    addr: usize,
    size: usize,
    h: CUmemGenericAllocationHandle,
) -> Result<(), HalError> {
    // SAFETY: forwarded contract.
    check(
        "cuMemMap",
        unsafe { sys::cuMemMap(addr as CUdeviceptr, size, 0, h, 0) },
        false,
    )
}

/// `cuMemUnmap` of one whole mapping.
///
/// # Safety
/// `[addr, addr+size)` is exactly one or more whole mappings; nothing uses them any more.
pub(crate) unsafe fn mem_unmap(addr: usize, size: usize) -> Result<(), HalError> {
    // SAFETY: forwarded contract.
    check(
        "cuMemUnmap",
        unsafe { sys::cuMemUnmap(addr as CUdeviceptr, size) },
        false,
    )
}

/// `cuMemSetAccess(addr, size, desc, n)`: one call for the whole range and every location.
///
/// # Safety
/// `[addr, addr+size)` consists of whole mappings.
pub(crate) unsafe fn set_access(
    addr: usize,
    size: usize,
    desc: &[sys::CUmemAccessDesc],
) -> Result<(), HalError> {
    // SAFETY: forwarded contract; `desc` is a valid array of `desc.len()` entries.
    check(
        "cuMemSetAccess",
        unsafe { sys::cuMemSetAccess(addr as CUdeviceptr, size, desc.as_ptr(), desc.len()) },
        false,
    )
}

/// `cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)`: a
/// new fd (owned by the caller) that another process can import the allocation from.
pub(crate) fn export_fd(h: CUmemGenericAllocationHandle) -> Result<OwnedFd, HalError> {
    let mut fd: std::ffi::c_int = -1;
    // SAFETY: for the POSIX-fd type the driver writes an int through the pointer.
    check(
        "cuMemExportToShareableHandle",
        unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut std::ffi::c_int).cast(),
                h,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        },
        false,
    )?;
    if fd < 0 {
        return Err(HalError::Unexpected(format!(
            "cuMemExportToShareableHandle returned fd {fd}"
        )));
    }
    // SAFETY: a fresh fd the driver made for us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `cuMemImportFromShareableHandle(&h, fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)`: the
/// allocation behind an fd from [`export_fd`] (of any process). The fd stays the caller's.
pub(crate) fn import_fd(fd: BorrowedFd<'_>) -> Result<CUmemGenericAllocationHandle, HalError> {
    let mut h = 0;
    // SAFETY: for the POSIX-fd type the driver takes the fd number as the pointer value.
    check(
        "cuMemImportFromShareableHandle",
        unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut h,
                fd.as_raw_fd() as isize as *mut c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        },
        false,
    )?;
    Ok(h)
}

/// `cuMemGetAllocationPropertiesFromHandle`: where the allocation `h` lives.
pub(crate) fn allocation_location(
    h: CUmemGenericAllocationHandle,
) -> Result<sys::CUmemLocation, HalError> {
    // SAFETY: plain data, all-zero valid; the driver fills it.
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer; `h` is a live handle of ours.
    check(
        "cuMemGetAllocationPropertiesFromHandle",
        unsafe { sys::cuMemGetAllocationPropertiesFromHandle(&mut p, h) },
        false,
    )?;
    Ok(p.location)
}

/// `cuCtxSynchronize`: waits until every stream of the calling thread's current context has
/// finished its work.
pub(crate) fn ctx_synchronize() -> Result<(), HalError> {
    // SAFETY: no arguments.
    check(
        "cuCtxSynchronize",
        unsafe { sys::cuCtxSynchronize() },
        false,
    )
}

/// `cuMemcpyDtoD(dst, src, size)`: a copy between device-accessible ranges, finished when it
/// returns (for device memory the call is synchronous with respect to the host).
///
/// # Safety
/// Both ranges are mapped and accessible to the current context's device for `size` bytes.
pub(crate) unsafe fn memcpy_dtod(dst: usize, src: usize, size: usize) -> Result<(), HalError> {
    // SAFETY: forwarded contract.
    check(
        "cuMemcpyDtoD",
        unsafe { sys::cuMemcpyDtoD_v2(dst as CUdeviceptr, src as CUdeviceptr, size) },
        false,
    )?;
    ctx_synchronize()
}

/// `cuMemHostAlloc(&p, size, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP)`: pinned
/// host memory every context can reach at the same address.
pub(crate) fn host_alloc(size: usize) -> Result<usize, HalError> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    check(
        "cuMemHostAlloc",
        unsafe { sys::cuMemHostAlloc(&mut p, size, 0x1 | 0x2) },
        false,
    )?;
    Ok(p as usize)
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `p` came from [`host_alloc`] and nothing uses it any more.
pub(crate) unsafe fn host_free(p: usize) {
    // SAFETY: forwarded contract.
    let _ = unsafe { sys::cuMemFreeHost(p as *mut c_void) };
}

/// `cuMemGetInfo` in the current context: `(free, total)` bytes of its device.
pub(crate) fn mem_get_info() -> Result<(usize, usize), HalError> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers.
    check(
        "cuMemGetInfo",
        unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) },
        true,
    )?;
    Ok((free, total))
}

/// `cuMemAllocManaged(&p, size, CU_MEM_ATTACH_GLOBAL)`.
pub(crate) fn alloc_managed(size: usize) -> Result<usize, HalError> {
    let mut p: CUdeviceptr = 0;
    // SAFETY: valid out-pointer.
    check(
        "cuMemAllocManaged",
        unsafe { sys::cuMemAllocManaged(&mut p, size, 1) },
        true,
    )?;
    Ok(p as usize)
}

/// `cuMemFree`.
///
/// # Safety
/// `p` came from [`alloc_managed`] and nothing uses it any more.
pub(crate) unsafe fn mem_free(p: usize) {
    // SAFETY: forwarded contract.
    let _ = unsafe { sys::cuMemFree_v2(p as CUdeviceptr) };
}

/// `cuMemHostRegister(p, size, PORTABLE | DEVICEMAP [| READ_ONLY])`.
pub(crate) fn host_register(addr: usize, size: usize, read_only: bool) -> Result<(), HalError> {
    let flags = 0x1 | 0x2 | if read_only { 0x8 } else { 0 };
    // SAFETY: the range is mapped memory of this process (checked by the caller); registering
    // pins it and does not change its contents.
    check(
        "cuMemHostRegister",
        unsafe { sys::cuMemHostRegister_v2(addr as *mut c_void, size, flags) },
        false,
    )
}

/// `cuMemHostUnregister`.
///
/// # Safety
/// `addr` was registered and no device work uses it any more.
pub(crate) unsafe fn host_unregister(addr: usize) {
    // SAFETY: forwarded contract.
    let _ = unsafe { sys::cuMemHostUnregister(addr as *mut c_void) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use sys::CUresult as R;

    /// The one place driver results become backend errors: out of memory names device or host
    /// memory as the call says, NOT_SUPPORTED is Unsupported, sticky errors are a lost device,
    /// and every message names the call. (Needs no driver: the codes are plain values.)
    #[test]
    fn driver_results_become_backend_errors_naming_the_call() {
        assert_eq!(check("cuX", R::CUDA_SUCCESS, true), Ok(()));
        let kind = |r, dev| match check("cuMemCreate", r, dev).unwrap_err() {
            HalError::OutOfDeviceMemory(m) => ("device", m),
            HalError::OutOfHostMemory(m) => ("host", m),
            HalError::Unsupported(m) => ("unsupported", m),
            HalError::DeviceLost(m) => ("lost", m),
            HalError::Unexpected(m) => ("unexpected", m),
        };
        assert_eq!(kind(R::CUDA_ERROR_OUT_OF_MEMORY, true).0, "device");
        assert_eq!(kind(R::CUDA_ERROR_OUT_OF_MEMORY, false).0, "host");
        assert_eq!(kind(R::CUDA_ERROR_NOT_SUPPORTED, true).0, "unsupported");
        assert_eq!(kind(R::CUDA_ERROR_ILLEGAL_ADDRESS, true).0, "lost");
        let (k, m) = kind(R::CUDA_ERROR_INVALID_VALUE, true);
        assert_eq!(k, "unexpected");
        assert!(m.starts_with("cuMemCreate failed: "), "{m}");
        assert!(m.contains("1"), "{m}");
    }

    /// The allocation properties ask for pinned memory with a POSIX-fd shareable handle at the
    /// location given, and the host location is a NUMA node (plain HOST is refused by
    /// cuMemCreate on driver 580).
    #[test]
    fn allocation_properties_and_locations_are_what_cumemcreate_needs() {
        let p = allocation_prop(device_location(3), true);
        assert_eq!(
            p.type_,
            sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED
        );
        assert_eq!(
            p.requestedHandleTypes,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        );
        assert_eq!(p.location.id, 3);
        assert_eq!(
            p.location.type_,
            sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
        );
        let h = host_numa_location(1);
        assert_eq!(
            h.type_,
            sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA
        );
        assert_eq!(h.id, 1);
    }
}
