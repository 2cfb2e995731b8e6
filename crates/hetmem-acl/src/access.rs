//! Access and handles of ACL virtual memory beyond [`crate::vmm`]: `aclrtMemSetAccess`,
//! `aclrtMemGetAccess`, `aclrtMemMapNoAccess`, `aclrtMemRetainAllocationHandle`,
//! `aclrtMemGetAllocationPropertiesFromHandle`.
//!
//! Access goes through the rules of `zeVirtualMemSetAccessAttribute`
//! ([`hetmem::Context::acl_set_access`], decoded by [`hetmem::acl_vmm`]): one access per page,
//! for every device. A retained handle is the same `aclrtDrvMemHandle` value as the one mapped
//! there (as CUDA's `cuMemRetainAllocationHandle` answers): each retain is one more
//! `aclrtFreePhysical` the handle takes before the physical memory goes.

use std::sync::Arc;

use crate::state::{self, Ctx};
use crate::vmm::AclPhysicalMemProp;
use crate::{entry, null, out, AclError, Fail, Res};

/// `aclrtMemAccessDesc` (24 bytes): flags, location, 12 reserved bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AclMemAccessDesc {
    /// `aclrtMemAccessFlags`.
    pub flags: u32,
    /// `location.id`.
    pub location_id: u32,
    /// `location.type`.
    pub location_type: u32,
    /// `rsv`.
    pub rsv: [u8; 12],
}

/// `aclrtMemLocation` (8 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AclMemLocation {
    /// `id`.
    pub id: u32,
    /// `type`.
    pub ty: u32,
}

/// The context of the reservation holding `va`.
fn reservation_ctx(va: usize) -> Res<Arc<Ctx>> {
    let reg = crate::vmm::VMM.lock();
    reg.reservations
        .range(..=va)
        .next_back()
        .filter(|(b, r)| va < *b + r.r.size)
        .map(|(_, r)| r.ctx.clone())
        .ok_or_else(|| {
            hetmem::Error::InvalidArgument(format!(
                "{va:#x} is not inside a reservation of aclrtReserveMemAddress"
            ))
            .into()
        })
}

/// `aclrtMemSetAccess`: gives the mapped pages of `[virPtr, virPtr+size)` the access `desc[0
/// .. count]` asks (NONE, READ, READWRITE), for the devices they name (one access for every
/// device: descriptors asking different access are refused), as `zeVirtualMemSetAccessAttribute`
/// does: READ faults on writes (an `aclrtMemcpy` into it fails), NONE on any access.
///
/// Errors (nothing changes): `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer or count 0;
/// `ACL_ERROR_RT_PARAM_INVALID` (107000) for flags that are not an `aclrtMemAccessFlags`, a
/// location that is not a device, a range not inside one reservation or not aligned to the
/// page; `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000) for different access per device.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemSetAccess(
    vir_ptr: *mut libc::c_void,
    size: usize,
    desc: *const AclMemAccessDesc,
    count: usize,
) -> AclError {
    entry("aclrtMemSetAccess", || {
        state::fast_global()?;
        if vir_ptr.is_null() || desc.is_null() {
            return Err(null(if desc.is_null() { "desc" } else { "virPtr" }));
        }
        hetmem::acl::check_nonzero(count, "count")?;
        hetmem::acl::check_nonzero(size, "size")?;
        // SAFETY: an array of `count` descriptors (the caller's contract).
        let d = unsafe { std::slice::from_raw_parts(desc, count) };
        let descs: Vec<hetmem::acl_vmm::AccessDesc> = d
            .iter()
            .map(|d| hetmem::acl_vmm::AccessDesc {
                flags: d.flags,
                location_type: d.location_type,
                location_id: d.location_id,
            })
            .collect();
        let va = vir_ptr as usize;
        let c = reservation_ctx(va)?;
        Ok(c.ctx.acl_set_access(va, size, &descs)?)
    })
}

/// `aclrtMemGetAccess`: the `aclrtMemAccessFlags` (NONE 0, READ 1, READWRITE 3) of the page
/// at `virPtr` for the device `*location` names (unmapped pages: NONE).
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer; `ACL_ERROR_RT_PARAM_INVALID`
/// (107000) for a location that is not a device or an address in no reservation.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemGetAccess(
    vir_ptr: *mut libc::c_void,
    location: *const AclMemLocation,
    flag: *mut u64,
) -> AclError {
    entry("aclrtMemGetAccess", || {
        state::fast_global()?;
        if vir_ptr.is_null() || location.is_null() || flag.is_null() {
            return Err(null(if vir_ptr.is_null() {
                "virPtr"
            } else if location.is_null() {
                "location"
            } else {
                "flag"
            }));
        }
        // SAFETY: non-null, the caller's struct.
        let l = unsafe { location.read_unaligned() };
        let va = vir_ptr as usize;
        let c = reservation_ctx(va)?;
        let f = c.ctx.acl_get_access(va, l.ty, l.id)?;
        // SAFETY: non-null out-pointer.
        unsafe { out(flag, f as u64) };
        Ok(())
    })
}

/// `aclrtMemMapNoAccess`: maps as `aclrtMapMem` does, with access NONE (any access faults
/// until `aclrtMemSetAccess` grants it).
///
/// Errors: those of `aclrtMapMem`.
#[no_mangle]
pub extern "C" fn aclrtMemMapNoAccess(
    vir_ptr: *mut libc::c_void,
    size: usize,
    offset: usize,
    handle: *mut libc::c_void,
    flags: u64,
) -> AclError {
    entry("aclrtMemMapNoAccess", || {
        crate::vmm::map_mem(
            vir_ptr,
            size,
            offset,
            handle,
            flags,
            hetmem::AccessAttribute::None,
        )
    })
}

/// `aclrtMemRetainAllocationHandle`: the physical handle mapped at `virPtr` (any address in a
/// mapped page), retained: the handle then takes one more `aclrtFreePhysical` before its
/// memory goes (the first frees only give back retains).
///
/// Errors (`*handle` unchanged): `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer;
/// `ACL_ERROR_RT_PARAM_INVALID` (107000) for an address in no reservation or in an unmapped
/// page.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemRetainAllocationHandle(
    vir_ptr: *mut libc::c_void,
    handle: *mut *mut libc::c_void,
) -> AclError {
    entry("aclrtMemRetainAllocationHandle", || {
        state::fast_global()?;
        if vir_ptr.is_null() || handle.is_null() {
            return Err(null(if handle.is_null() { "handle" } else { "virPtr" }));
        }
        let va = vir_ptr as usize;
        let c = reservation_ctx(va)?;
        let mem = c.ctx.physical_memory_at(va)?;
        let h = {
            let reg = crate::vmm::VMM.lock();
            let found = reg.all_phys().find(|p| p.mem == mem);
            let p = found.ok_or_else(|| {
                Fail::from(hetmem::Error::InvalidArgument(format!(
                    "the physical memory mapped at {va:#x} has no handle of this library"
                )))
            })?;
            // Counted under the registry lock: a concurrent aclrtFreePhysical of the last
            // reference either sees this retain or has taken the handle out already.
            p.retains.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            p.handle
        };
        // SAFETY: non-null out-pointer.
        unsafe { out(handle, h as *mut libc::c_void) };
        Ok(())
    })
}

/// `aclrtMemGetAllocationPropertiesFromHandle`: the properties physical handle `handle` was
/// made with (`aclrtMallocPhysical`'s `prop`), or, for an imported handle, DEVICE location of
/// the importing device, handle type NONE, PINNED, `ACL_HBM_MEM_HUGE`.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer; `ACL_ERROR_RT_PARAM_INVALID`
/// (107000) for a handle that is not live.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemGetAllocationPropertiesFromHandle(
    handle: *mut libc::c_void,
    prop: *mut AclPhysicalMemProp,
) -> AclError {
    entry("aclrtMemGetAllocationPropertiesFromHandle", || {
        state::fast_global()?;
        if prop.is_null() {
            return Err(null("prop"));
        }
        let p = crate::vmm::VMM.lock().phys_or_fail(handle as usize)?.prop;
        // SAFETY: non-null out-pointer.
        unsafe { out(prop, p) };
        Ok(())
    })
}
