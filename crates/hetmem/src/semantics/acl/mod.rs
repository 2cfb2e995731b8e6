//! The argument rules of the ACL calls that are not a family's own state (managed memory,
//! virtual memory and allocations keep theirs in `semantics::managed`, `semantics::vmm` and
//! `semantics::usm`): size 0, counts, flags, the property structure of physical memory, the
//! reservation alignment, the free of the right kind of memory and the location an advice
//! reads. The C library (`hetmem-acl`) calls these and nothing else decides, so a Rust caller
//! and a C caller get the same answer for the same arguments. Enumerations are decoded in
//! [`crate::spec`]. The pid whitelist of every ACL import ([`check_import_pid`]) is here, once:
//! shareable handles ([`shareable`]: one export per object, this process's exports) and IPC
//! keys ([`ipc_key`]: the key format, this process's key exports and views) both call it.

pub(crate) mod ipc_key;
pub(crate) mod shareable;

use crate::error::{Addr, Error, Result};
use crate::spec::{
    Advice, Location, MemAllocationType, MemAttr, MemHandleType, MemoryType, PhysLocationType,
    ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION,
};

/// The most attributes one `aclrtMemManagedGetAttrs` asks.
pub const MAX_ATTRIBUTES: usize = 1 << 20;
/// The size whose page size is the granularity of ACL virtual memory (2 MiB): the
/// granularity is the page size hetmem answers for it (`Context::acl_granularity`).
pub const ACL_VMM_GRANULARITY_BASIS: usize = 2 << 20;
/// The most pids one `aclrtMemSetPidToShareableHandle` names.
pub const MAX_PIDS: usize = 1 << 16;

/// Size 0 (`what` names the argument): `ACL_ERROR_INVALID_PARAM` (100000, `InvalidSize`), the
/// API-layer check of every ACL call that takes a size (`aclrtMalloc`, `aclrtMallocHost`,
/// `aclrtMemManagedAdvise`, `aclrtMemManagedPrefetchAsync`, `aclrtReserveMemAddress`,
/// `aclrtMallocPhysical`, `aclrtMapMem`).
pub fn check_nonzero(size: usize, what: &str) -> Result<()> {
    if size == 0 {
        return Err(Error::InvalidSize(format!("{what} is 0")));
    }
    Ok(())
}

/// `numAttributes` of `aclrtMemManagedGetAttrs`: 0 is `InvalidSize` (100000); over
/// [`MAX_ATTRIBUTES`] `UnsupportedSize` (107000).
pub fn check_attribute_count(n: usize) -> Result<()> {
    check_nonzero(n, "numAttributes")?;
    if n > MAX_ATTRIBUTES {
        return Err(Error::UnsupportedSize(format!(
            "numAttributes {n} is more than there are attributes to ask (at most {MAX_ATTRIBUTES})"
        )));
    }
    Ok(())
}

/// The location of an advice from `aclrtMemManagedLocation { type; id; }`: `SET_READ_MOSTLY`
/// and `UNSET_PREFERRED_LOCATION` ignore it (any value is accepted, read as
/// [`Location::Invalid`] when it does not decode); every other advice decodes it
/// ([`Location::from_raw`], 107000 when it does not).
pub fn advice_location(advice: Advice, ty: u32, id: i32) -> Result<Location> {
    match advice {
        Advice::SetReadMostly | Advice::UnsetPreferredLocation => {
            Ok(Location::from_raw(ty, id).unwrap_or(Location::Invalid))
        }
        _ => Location::from_raw(ty, id),
    }
}

/// `count` bytes into a destination of `max` bytes (`destMax` of `aclrtMemcpy`, `maxCount` of
/// `aclrtMemset`, named by `what`): over it is `InvalidSize` (100000).
pub fn check_count(count: usize, max: usize, what: &str) -> Result<()> {
    if count > max {
        return Err(Error::InvalidSize(format!(
            "count {count:#x} exceeds {what} {max:#x}"
        )));
    }
    Ok(())
}

/// Which free takes memory of type `ty` at `ptr`: `aclrtFree` (`host == false`) takes device
/// memory (and managed memory, decided before this), `aclrtFreeHost` (`host == true`) takes
/// host memory of `aclrtMallocHost`; the other is `InvalidArgument` (107000).
pub fn check_free_kind(ptr: usize, ty: MemoryType, host: bool) -> Result<()> {
    match (host, ty == MemoryType::Host) {
        (false, true) => Err(Error::InvalidArgument(format!(
            "{} is host memory of aclrtMallocHost; free it with aclrtFreeHost",
            Addr(ptr)
        ))),
        (true, false) => Err(Error::InvalidArgument(format!(
            "{} is not host memory of aclrtMallocHost ({ty:?})",
            Addr(ptr)
        ))),
        _ => Ok(()),
    }
}

/// `aclrtPhysicalMemProp` (`handleType`, `allocationType`, `memAttr`, `location.type`): each
/// decoded in turn ([`MemHandleType`], [`MemAllocationType`], [`MemAttr`],
/// [`PhysLocationType`]); the first out of range is `UnsupportedEnumeration` (107000). Returns
/// where the memory lives (the device id is checked by the call that uses it).
pub fn check_physical_prop(
    handle_type: u32,
    allocation_type: u32,
    mem_attr: u32,
    location_type: u32,
) -> Result<PhysLocationType> {
    MemHandleType::from_raw(handle_type)?;
    MemAllocationType::from_raw(allocation_type)?;
    MemAttr::from_raw(mem_attr, "memAttr")?;
    PhysLocationType::from_raw(location_type)
}

/// `alignment` of `aclrtReserveMemAddress`: 0, or a power of two up to `granularity` (every
/// reservation is aligned to it); else `InvalidArgument` (107000).
pub fn check_reserve_alignment(alignment: usize, granularity: usize) -> Result<()> {
    if alignment != 0 && (!alignment.is_power_of_two() || alignment > granularity) {
        return Err(Error::InvalidArgument(format!(
            "alignment {alignment:#x} is not 0 or a power of two up to the granularity \
             {granularity:#x}"
        )));
    }
    Ok(())
}

/// `size` of `aclrtReserveMemAddress`, `aclrtMallocPhysical` and `aclrtMapMem` against the
/// granularity `aclrtMemGetAllocationGranularity` reports: 0 is `InvalidSize` (100000, as
/// [`check_nonzero`]); a size that is not a multiple of it is `UnsupportedSize` (107000).
pub fn check_vmm_size(size: usize, granularity: usize) -> Result<()> {
    check_nonzero(size, "size")?;
    if granularity != 0 && !size.is_multiple_of(granularity) {
        return Err(Error::UnsupportedSize(format!(
            "size {size:#x} is not a multiple of the granularity {granularity:#x} \
             (aclrtMemGetAllocationGranularity)"
        )));
    }
    Ok(())
}

/// Flags that must be 0 (`aclrtMallocPhysical`, `aclrtMapMem`): else `InvalidEnumeration`
/// (100000).
pub fn check_flags_zero(flags: u64) -> Result<()> {
    if flags != 0 {
        return Err(Error::InvalidEnumeration(format!(
            "flags {flags:#x} must be 0"
        )));
    }
    Ok(())
}

/// Flags of `aclrtMemExportToShareableHandle`: `ACL_RT_VMM_EXPORT_FLAG_DEFAULT` (0) or
/// `DISABLE_PID_VALIDATION` (1); else `InvalidEnumeration` (100000).
pub fn check_export_flags(flags: u64) -> Result<()> {
    if flags > ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION {
        return Err(Error::InvalidEnumeration(format!(
            "flags {flags:#x} are not ACL_RT_VMM_EXPORT_FLAG_DEFAULT (0) or \
             DISABLE_PID_VALIDATION (1)"
        )));
    }
    Ok(())
}

/// `pidNum` of `aclrtMemSetPidToShareableHandle`: 1 to [`MAX_PIDS`]; else `InvalidSize`
/// (100000).
pub fn check_pid_count(n: usize) -> Result<()> {
    if n == 0 || n > MAX_PIDS {
        return Err(Error::InvalidSize(format!(
            "pidNum {n} is not 1 to {MAX_PIDS}"
        )));
    }
    Ok(())
}

/// The id of this process as importers' pid lists name it (`aclrtDeviceGetBareTgid`): the
/// pid every import check ([`check_import_pid`]) compares.
pub fn own_pid() -> u32 {
    crate::semantics::ipc::registry::own_pid()
}

/// The whitelist rule of every ACL import (`aclrtMemImportFromShareableHandle`,
/// `aclrtIpcMemImportByKey`) of memory exported by process `exporter`: the exporter itself, an
/// export made with DISABLE_PID_VALIDATION (`disabled`), or a process on the pid list
/// (`aclrtMemSetPidToShareableHandle`, `aclrtIpcMemSetImportPid`) may import. `what` names the
/// key or handle.
///
/// Errors: `InvalidArgument` (107000) naming the process and the list.
pub fn check_import_pid(
    exporter: u32,
    me: u32,
    pids: &[i32],
    disabled: bool,
    what: &str,
) -> Result<()> {
    if disabled || exporter == me || pids.contains(&(me as i32)) {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "process {me} is not on the pid list of {what} (the exporter, process {exporter}, \
         named {pids:?})"
    )))
}
