//! Host registration and pointer queries: `aclrtHostRegister`, `aclrtHostRegisterV2`,
//! `aclrtHostGetDevicePointer`, `aclrtHostUnregister`, `aclrtHostMemMapCapabilities`,
//! `aclrtPointerGetAttributes`, `aclrtMemGetAddressRange`.
//!
//! Registering host memory is hetmem's import of system memory
//! ([`hetmem::Context::import_system_memory`], Level Zero's `zeMemAllocHost` with an external
//! system-memory descriptor): the range must be whole host (OS) pages of mapped memory, and
//! devices reach it at the same address (the device pointer is the host pointer).

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::state::{self, Ctx};
use crate::{entry, null, out, AclError, Fail, Res};

/// `aclrtPtrAttributes` (28 bytes): location, page size, 4 reserved words.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AclPtrAttributes {
    /// `location.id`.
    pub location_id: u32,
    /// `location.type` (`aclrtMemLocationType`).
    pub location_type: u32,
    /// `pageSize`.
    pub page_size: u32,
    /// `rsv`.
    pub rsv: [u32; 4],
}

/// Registrations of this process: host base -> (context, size).
static REGISTERED: Mutex<BTreeMap<usize, (Arc<Ctx>, usize)>> = Mutex::new(BTreeMap::new());

fn register(ptr: *mut libc::c_void, size: u64, read_only: bool) -> Res<usize> {
    let g = state::fast_global()?;
    if ptr.is_null() {
        return Err(null("ptr"));
    }
    hetmem::acl::check_nonzero(size as usize, "size")?;
    let c = g.current()?;
    let p = c
        .ctx
        .import_system_memory(ptr as usize, size as usize, read_only)?;
    REGISTERED.lock().insert(p, (c.clone(), size as usize));
    Ok(p)
}

/// `aclrtHostRegister`: registers `[ptr, ptr+size)` of host memory (whole host pages of mapped
/// memory) for devices; `*devPtr` is where devices reach it (the same address). `type`
/// MAPPED (0) or READONLY (8: devices only read it).
///
/// Errors (nothing registered): `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer or size
/// 0; `ACL_ERROR_RT_PARAM_INVALID` (107000) for a type that is not one, a range that is not
/// whole pages of mapped memory or that overlaps memory the runtime already knows;
/// `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000) for IOMEMORY (4).
#[no_mangle]
pub unsafe extern "C" fn aclrtHostRegister(
    ptr: *mut libc::c_void,
    size: u64,
    ty: u32,
    dev_ptr: *mut *mut libc::c_void,
) -> AclError {
    entry("aclrtHostRegister", || {
        if dev_ptr.is_null() {
            return Err(null("devPtr"));
        }
        let ro = hetmem::acl_ext::host_register_type(ty)?;
        let p = register(ptr, size, ro)?;
        // SAFETY: non-null out-pointer.
        unsafe { out(dev_ptr, p as *mut libc::c_void) };
        Ok(())
    })
}

/// `aclrtHostRegisterV2`: as [`aclrtHostRegister`] with `ACL_HOST_REG_*` flags (MAPPED 0x2,
/// READONLY 0x8, PINNED 0x10000000; IOMEMORY 0x4 is 207000); `aclrtHostGetDevicePointer`
/// gives the device address.
///
/// Errors: as [`aclrtHostRegister`]; `ACL_ERROR_INVALID_PARAM` (100000) for unknown flag bits.
#[no_mangle]
pub extern "C" fn aclrtHostRegisterV2(ptr: *mut libc::c_void, size: u64, flag: u32) -> AclError {
    entry("aclrtHostRegisterV2", || {
        let ro = hetmem::acl_ext::host_register_flags(flag)?;
        register(ptr, size, ro).map(|_| ())
    })
}

/// `aclrtHostGetDevicePointer`: where devices reach registered host memory `pHost` (any
/// address inside a registration): the same address.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer or `flag` not 0;
/// `ACL_ERROR_RT_PARAM_INVALID` (107000) for an address in no registration.
#[no_mangle]
pub unsafe extern "C" fn aclrtHostGetDevicePointer(
    p_host: *mut libc::c_void,
    p_device: *mut *mut libc::c_void,
    flag: u32,
) -> AclError {
    entry("aclrtHostGetDevicePointer", || {
        state::fast_global()?;
        if p_host.is_null() || p_device.is_null() {
            return Err(null(if p_host.is_null() { "pHost" } else { "pDevice" }));
        }
        hetmem::acl::check_flags_zero(flag as u64)?;
        let a = p_host as usize;
        let hit = REGISTERED
            .lock()
            .range(..=a)
            .next_back()
            .is_some_and(|(b, (_, s))| a < b + s);
        if !hit {
            return Err(hetmem::Error::InvalidArgument(format!(
                "{a:#x} is not inside host memory registered with aclrtHostRegister"
            ))
            .into());
        }
        // SAFETY: non-null out-pointer.
        unsafe { out(p_device, p_host) };
        Ok(())
    })
}

/// `aclrtHostUnregister`: ends the registration starting at `ptr` (the memory and its
/// contents stay the caller's).
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for NULL; `ACL_ERROR_RT_PARAM_INVALID` (107000)
/// for anything but the start of a registration.
#[no_mangle]
pub extern "C" fn aclrtHostUnregister(ptr: *mut libc::c_void) -> AclError {
    entry("aclrtHostUnregister", || {
        state::fast_global()?;
        let p = ptr as usize;
        if p == 0 {
            return Err(null("ptr"));
        }
        let (c, size) = REGISTERED.lock().remove(&p).ok_or_else(|| {
            Fail::from(hetmem::Error::InvalidArgument(format!(
                "{p:#x} is not the start of host memory registered with aclrtHostRegister"
            )))
        })?;
        if let Err(e) = c.ctx.free_memory(p) {
            REGISTERED.lock().insert(p, (c, size));
            return Err(e.into());
        }
        Ok(())
    })
}

/// `aclrtHostMemMapCapabilities`: whether host memory can be registered for device `deviceId`
/// and hardware `hacType` (0..=9): `ACL_RT_HOST_MEM_MAP_SUPPORTED` (1) for every one (hetmem
/// registers host memory for every device).
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer; `ACL_ERROR_RT_PARAM_INVALID`
/// (107000) for a device or `hacType` that is not one.
#[no_mangle]
pub unsafe extern "C" fn aclrtHostMemMapCapabilities(
    device_id: u32,
    hac_type: u32,
    capabilities: *mut u32,
) -> AclError {
    entry("aclrtHostMemMapCapabilities", || {
        let g = state::fast_global()?;
        if capabilities.is_null() {
            return Err(null("capabilities"));
        }
        g.device(device_id as i64)?;
        if hac_type > 9 {
            return Err(hetmem::Error::UnsupportedEnumeration(format!(
                "hacType {hac_type} is not an aclrtHacType (0..=9)"
            ))
            .into());
        }
        // SAFETY: non-null out-pointer.
        unsafe { out(capabilities, 1u32) };
        Ok(())
    })
}

/// `aclrtPointerGetAttributes`: where the memory at `ptr` lives: DEVICE with its device for
/// device memory and mapped virtual memory of a device, HOST for host allocations and
/// registered host memory, MANAGED for managed memory, UNREGISTERED for memory the runtime does
/// not know (page size 0); `pageSize` is the page size of the memory.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer.
#[no_mangle]
pub unsafe extern "C" fn aclrtPointerGetAttributes(
    ptr: *const libc::c_void,
    attributes: *mut AclPtrAttributes,
) -> AclError {
    entry("aclrtPointerGetAttributes", || {
        let g = state::fast_global()?;
        if ptr.is_null() || attributes.is_null() {
            return Err(null(if ptr.is_null() { "ptr" } else { "attributes" }));
        }
        let c = g.current()?;
        let p = ptr as usize;
        let (ty, id, page) = if c.ctx.is_managed(p) {
            (3u32, 0u32, hetmem::managed::MANAGED_PAGE_SIZE as u32)
        } else {
            let a = c.ctx.get_allocation_properties(p)?;
            match a.memory_type {
                hetmem::MemoryType::Device | hetmem::MemoryType::Shared => {
                    (1, a.device.unwrap_or(0), a.page_size as u32)
                }
                hetmem::MemoryType::Host | hetmem::MemoryType::HostImported => {
                    (0, 0, a.page_size as u32)
                }
                _ => (2, 0, 0),
            }
        };
        // SAFETY: non-null out-pointer.
        unsafe {
            out(
                attributes,
                AclPtrAttributes {
                    location_id: id,
                    location_type: ty,
                    page_size: page,
                    rsv: [0; 4],
                },
            )
        };
        Ok(())
    })
}

/// `aclrtMemGetAddressRange`: base and size of the memory block containing `ptr` (a device or
/// host allocation, registered host memory, a reservation of `aclrtReserveMemAddress`).
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null `ptr`; `ACL_ERROR_RT_PARAM_INVALID`
/// (107000) for memory the runtime does not know. `pbase` / `psize` may be NULL.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemGetAddressRange(
    ptr: *mut libc::c_void,
    pbase: *mut *mut libc::c_void,
    psize: *mut usize,
) -> AclError {
    entry("aclrtMemGetAddressRange", || {
        let g = state::fast_global()?;
        if ptr.is_null() {
            return Err(null("ptr"));
        }
        let c = g.current()?;
        let (b, s) = c.ctx.get_address_range(ptr as usize).map_err(|_| {
            Fail::from(hetmem::Error::InvalidArgument(format!(
                "{:#x} is in no allocation or reservation of the runtime",
                ptr as usize
            )))
        })?;
        if !pbase.is_null() {
            // SAFETY: non-null out-pointer.
            unsafe { out(pbase, b as *mut libc::c_void) };
        }
        if !psize.is_null() {
            // SAFETY: non-null out-pointer.
            unsafe { out(psize, s) };
        }
        Ok(())
    })
}
