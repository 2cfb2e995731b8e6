//! The USM calls of one driver (`zeMemAllocDevice`, `zeMemAllocHost`, `zeMemAllocShared`, the
//! system-memory import, `zeMemFree`, `zeMemFreeExt`, `zeMemGetAllocProperties`,
//! `zeMemGetAddressRange`): each takes the driver's locks in the order of
//! [`crate::semantics::driver`] and applies the rules of [`crate::semantics::usm`] (the
//! bookkeeping), [`crate::semantics::inflight`] (the free policies under queued work) and the
//! IPC views and reservations an import or a lookup must see. `crate::Context`'s methods are
//! one call each into here.

use crate::backend::{AllocLocation, PhysicalLocation};
use crate::error::{Addr, Error, Result};
use crate::semantics::driver::{DeviceRef, DriverShared};
use crate::semantics::usm::{check_chain, AllocDesc, AllocationProperties, MemoryType, UsmStats};
use crate::spec::FreePolicy;

/// `zeMemAllocDevice` on `device` (checked to be of this driver).
pub(crate) fn alloc_device(
    d: &DriverShared,
    context: u64,
    device: DeviceRef<'_>,
    desc: &AllocDesc,
) -> Result<usize> {
    let (ordinal, sub) = d.device_slot(device)?;
    alloc(d, context, AllocLocation::Device(ordinal), sub, desc)
}

/// `zeMemAllocHost` (or, with `desc.system_memory`, the system-memory import).
pub(crate) fn alloc_host(d: &DriverShared, context: u64, desc: &AllocDesc) -> Result<usize> {
    alloc(d, context, AllocLocation::Host, None, desc)
}

/// `zeMemAllocShared`, associated with `device` (checked to be of this driver) if given.
pub(crate) fn alloc_shared(
    d: &DriverShared,
    context: u64,
    device: Option<DeviceRef<'_>>,
    desc: &AllocDesc,
) -> Result<usize> {
    let slot = device.map(|dev| d.device_slot(dev)).transpose()?;
    alloc(
        d,
        context,
        AllocLocation::Shared(slot.map(|s| s.0)),
        slot.and_then(|s| s.1),
        desc,
    )
}

/// One allocation with every option `desc` chains: the chain is checked ([`check_chain`],
/// then the IPC handle types) before anything is made; a system-memory import goes to
/// [`import_system_memory`]; handle types are recorded under the same hold of the USM lock as
/// the allocation, so no get can see it without them. `sub` is the sub-device of the
/// location's device the memory is made on, if any (charged with its root).
fn alloc(
    d: &DriverShared,
    context: u64,
    location: AllocLocation,
    sub: Option<u32>,
    desc: &AllocDesc,
) -> Result<usize> {
    check_chain(location, desc)?;
    if let Some(t) = desc.ipc_types {
        crate::semantics::ipc::check_new_handle_types(t)?;
    }
    if let Some(ptr) = desc.system_memory {
        let p = import_system_memory(d, context, ptr, desc.size, desc.read_only)?;
        if let Some(t) = desc.ipc_types {
            d.usm.write().set_ipc_types(context, p, t);
        }
        return Ok(p);
    }
    let mut usm = d.usm.write();
    let p = usm.alloc(d.backend.as_ref(), context, location, sub, desc)?;
    if let Some(t) = desc.ipc_types {
        usm.set_ipc_types(context, p, t);
    }
    Ok(p)
}

/// The system-memory import (`ze_external_memmap_sysmem_ext_desc_t`): refused over a live
/// import or allocation (the USM rules), a reservation, an opened IPC view or a managed
/// allocation of this driver.
pub(crate) fn import_system_memory(
    d: &DriverShared,
    context: u64,
    ptr: usize,
    size: usize,
    read_only: bool,
) -> Result<usize> {
    // The managed lock is never held with usm or vm: ask first.
    let managed = ptr
        .checked_add(size)
        .and_then(|end| d.managed.overlapping(ptr, end));
    let mut usm = d.usm.write();
    // Lock order: usm, then vm, then the IPC view table.
    usm.import(d.backend.as_ref(), context, ptr, size, read_only, |s, e| {
        let range = |(a, b): (usize, usize)| format!("[{}, {})", Addr(a), Addr(b));
        if let Some(m) = managed {
            Some(format!("the managed allocation {}", range(m)))
        } else if d.vm.read().reservation_overlaps(s, e) {
            Some("a virtual-memory reservation".into())
        } else {
            crate::semantics::ipc::view_overlapping(s, e)
                .map(|v| format!("the opened IPC view {}", range(v)))
        }
    })
}

/// `zeMemFreeExt` with `policy` (`zeMemFree` is [`FreePolicy::Immediate`]): the record is
/// taken out under the USM write lock, so from there no new submission can reference it (they
/// check and take references under the read lock); the memory goes as the policy says
/// ([`crate::semantics::inflight`]).
pub(crate) fn free(d: &DriverShared, context: u64, ptr: usize, policy: FreePolicy) -> Result<()> {
    let mut p = {
        let mut usm = d.usm.write();
        let p = usm.take_for_free(context, ptr)?;
        // Until its memory is gone, no submission takes it for plain system memory.
        d.inflight.retiring(&p);
        p
    };
    match policy {
        FreePolicy::Blocking => {
            d.inflight.wait_unreferenced(p.id());
            d.inflight.finish(p, d.backend.as_ref());
        }
        FreePolicy::Immediate | FreePolicy::Defer => {
            if policy == FreePolicy::Immediate {
                p.give_back_capacity();
            }
            if let Some(p) = d.inflight.defer_or_return(p) {
                d.inflight.finish(p, d.backend.as_ref());
            }
        }
    }
    Ok(())
}

/// `zeMemGetAllocProperties`: a USM allocation or import, an opened IPC view, a mapped page of
/// a reservation (the physical object's type, id and page size), else `Unknown`.
pub(crate) fn allocation_properties(d: &DriverShared, ptr: usize) -> Result<AllocationProperties> {
    crate::semantics::checks::null_check(ptr, "pointer")?;
    if let Some(p) = d.usm.read().properties(ptr) {
        return Ok(p);
    }
    if let Some(p) = crate::semantics::ipc::opened_properties(ptr) {
        return Ok(p);
    }
    let vm = d.vm.read().pointer_info(ptr);
    Ok(match vm.and_then(|v| v.mapped) {
        Some((id, loc, page_size)) => {
            let (memory_type, device) = match loc {
                PhysicalLocation::Device(dev) => (MemoryType::Device, Some(dev)),
                PhysicalLocation::Host => (MemoryType::Host, None),
            };
            AllocationProperties {
                memory_type,
                id,
                page_size,
                device,
                ..AllocationProperties::default()
            }
        }
        None => AllocationProperties::default(),
    })
}

/// `zeMemGetAddressRange`: the allocation, import, opened IPC view or reservation containing
/// `ptr`.
///
/// Errors: `InvalidNullPointer` for null; `Unknown` for a pointer in none of them.
pub(crate) fn address_range(d: &DriverShared, ptr: usize) -> Result<(usize, usize)> {
    crate::semantics::checks::null_check(ptr, "pointer")?;
    if let Some(r) = d.usm.read().address_range(ptr) {
        return Ok(r);
    }
    if let Some(r) = crate::semantics::ipc::opened_range(ptr) {
        return Ok(r);
    }
    d.vm.read()
        .pointer_info(ptr)
        .map(|v| v.reservation)
        .ok_or_else(|| {
            Error::Unknown(format!(
                "{} is not inside an allocation, import or reservation",
                Addr(ptr)
            ))
        })
}

/// The counters of the driver's USM allocations and imports (all contexts).
pub(crate) fn stats(d: &DriverShared) -> UsmStats {
    d.usm.read().stats()
}
