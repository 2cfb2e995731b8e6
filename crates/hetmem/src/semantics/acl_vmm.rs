//! ACL virtual memory rules that Level Zero does not have: the access descriptors of
//! `aclrtMemSetAccess` / `aclrtMemGetAccess` (decoded onto the page access attributes of
//! [`crate::semantics::vmm`], the rules of `zeVirtualMemSetAccessAttribute`), and the lookup of
//! the physical object mapped at an address (`aclrtMemRetainAllocationHandle`).
//!
//! # Access descriptors
//! `aclrtMemAccessDesc { flags; location { id; type }; }`: `flags` is
//! `ACL_RT_MEM_ACCESS_FLAGS_NONE` (0), `_READ` (1) or `_READWRITE` (3) (anything else:
//! `UnsupportedEnumeration`, 107000); the location
//! must be a device (`ACL_MEM_LOCATION_TYPE_DEVICE`, 1) of the driver (else `InvalidArgument`,
//! 107000, naming it). hetmem keeps one access attribute per page for every device of the
//! driver (as Level Zero's access attribute is), so descriptors of one call that ask different
//! access for different devices are refused (`UnsupportedFeature`, 207000, saying why); the
//! same access for several devices is one access. A count of 0 is `InvalidSize` (100000).

use crate::error::{Addr, Error, Result};
use crate::semantics::driver::DriverShared;
use crate::semantics::vmm::{PhysicalMemory, VmState};
use crate::spec::AccessAttribute;

/// `ACL_RT_MEM_ACCESS_FLAGS_NONE`.
pub const ACL_RT_MEM_ACCESS_FLAGS_NONE: u32 = 0x0;
/// `ACL_RT_MEM_ACCESS_FLAGS_READ`.
pub const ACL_RT_MEM_ACCESS_FLAGS_READ: u32 = 0x1;
/// `ACL_RT_MEM_ACCESS_FLAGS_READWRITE`.
pub const ACL_RT_MEM_ACCESS_FLAGS_READWRITE: u32 = 0x3;
/// `ACL_MEM_LOCATION_TYPE_DEVICE`.
pub const ACL_MEM_LOCATION_TYPE_DEVICE: u32 = 1;

/// One `aclrtMemAccessDesc` as its raw fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessDesc {
    /// `aclrtMemAccessFlags`.
    pub flags: u32,
    /// `location.type` (`aclrtMemLocationType`).
    pub location_type: u32,
    /// `location.id`: the device id.
    pub location_id: u32,
}

/// The page access attribute of `aclrtMemAccessFlags` `flags`.
///
/// Errors: `UnsupportedEnumeration` (107000) for a value that is not NONE (0), READ (1) or
/// READWRITE (3).
pub fn access_of_flags(flags: u32) -> Result<AccessAttribute> {
    match flags {
        ACL_RT_MEM_ACCESS_FLAGS_NONE => Ok(AccessAttribute::None),
        ACL_RT_MEM_ACCESS_FLAGS_READ => Ok(AccessAttribute::ReadOnly),
        ACL_RT_MEM_ACCESS_FLAGS_READWRITE => Ok(AccessAttribute::ReadWrite),
        f => Err(Error::UnsupportedEnumeration(format!(
            "flags {f:#x} is not an aclrtMemAccessFlags (NONE 0x0, READ 0x1, READWRITE 0x3)"
        ))),
    }
}

/// The `aclrtMemAccessFlags` of a page access attribute.
pub fn flags_of_access(a: AccessAttribute) -> u32 {
    match a {
        AccessAttribute::None => ACL_RT_MEM_ACCESS_FLAGS_NONE,
        AccessAttribute::ReadOnly => ACL_RT_MEM_ACCESS_FLAGS_READ,
        AccessAttribute::ReadWrite => ACL_RT_MEM_ACCESS_FLAGS_READWRITE,
    }
}

/// Checks a location of an access call: a device below `devices`.
///
/// Errors: `InvalidArgument` (107000) for another location type or a device id out of range.
pub fn check_location(location_type: u32, location_id: u32, devices: usize) -> Result<()> {
    if location_type != ACL_MEM_LOCATION_TYPE_DEVICE {
        return Err(Error::InvalidArgument(format!(
            "location type {location_type} is not ACL_MEM_LOCATION_TYPE_DEVICE (1): access is \
             set and read for devices"
        )));
    }
    if location_id as usize >= devices {
        return Err(Error::InvalidArgument(format!(
            "location id {location_id} is not a device (the driver has {devices})"
        )));
    }
    Ok(())
}

/// The one access attribute `descs` ask (see the module docs).
///
/// Errors: `InvalidSize` (100000) for no descriptor; those of [`access_of_flags`] and
/// [`check_location`] (naming the bad value); `UnsupportedFeature` (207000) for
/// descriptors asking different access.
pub fn access_of_descs(descs: &[AccessDesc], devices: usize) -> Result<AccessAttribute> {
    if descs.is_empty() {
        return Err(Error::InvalidSize(
            "count is 0 (no access descriptor)".into(),
        ));
    }
    let mut access = None;
    for (i, d) in descs.iter().enumerate() {
        let a = access_of_flags(d.flags)?;
        check_location(d.location_type, d.location_id, devices)?;
        match access {
            None => access = Some(a),
            Some(prev) if prev != a => {
                return Err(Error::UnsupportedFeature(format!(
                    "desc[{i}] asks {a:?} for device {} while an earlier descriptor asks \
                     {prev:?}: hetmem keeps one access per page for every device",
                    d.location_id
                )))
            }
            Some(_) => {}
        }
    }
    Ok(access.expect("at least one descriptor"))
}

/// `aclrtMemSetAccess` in context `context` of driver `d`: the one access `descs` ask
/// ([`access_of_descs`]), set by `zeVirtualMemSetAccessAttribute`'s rules.
pub(crate) fn set_access(
    d: &DriverShared,
    context: u64,
    ptr: usize,
    size: usize,
    descs: &[AccessDesc],
) -> Result<()> {
    let access = access_of_descs(descs, crate::semantics::driver::devices(d).len())?;
    crate::semantics::vmm::calls::set_access(d, context, ptr, size, access)
}

/// `aclrtMemGetAccess` in context `context` of driver `d`: the flags of the base page holding
/// `ptr`, for the device the location names ([`check_location`]).
pub(crate) fn get_access(
    d: &DriverShared,
    context: u64,
    ptr: usize,
    location_type: u32,
    location_id: u32,
) -> Result<u32> {
    check_location(
        location_type,
        location_id,
        crate::semantics::driver::devices(d).len(),
    )?;
    let page = d.vm.read().base_page();
    let (a, _) = crate::semantics::vmm::calls::get_access(d, context, ptr - ptr % page, page)?;
    Ok(flags_of_access(a))
}

/// `aclrtMemRetainAllocationHandle` on driver `d`: the physical object mapped at `ptr`.
pub(crate) fn physical_memory_at(d: &DriverShared, ptr: usize) -> Result<PhysicalMemory> {
    let vm = d.vm.read();
    let id = physical_at(&vm, ptr)?;
    let (_, size, _, _) = vm.physical_raw(id).expect("a mapped object is live");
    Ok(PhysicalMemory { id, size })
}

/// The physical object mapped at `ptr` (any context's), its id.
///
/// Errors: `InvalidNullPointer` for 0; `InvalidArgument` (107000) for an address in no
/// reservation or in an unmapped page.
pub(crate) fn physical_at(vm: &VmState, ptr: usize) -> Result<u64> {
    if ptr == 0 {
        return Err(Error::InvalidNullPointer("virPtr is null".into()));
    }
    match vm.pointer_info(ptr) {
        Some(p) => p.mapped.map(|(id, _, _)| id).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{} is in a reservation but its page is not mapped",
                Addr(ptr)
            ))
        }),
        None => Err(Error::InvalidArgument(format!(
            "{} is not in a reservation (aclrtReserveMemAddress)",
            Addr(ptr)
        ))),
    }
}
