//! The virtual-memory calls of one driver (`zeVirtualMemReserve`, `zeVirtualMemFree`,
//! `zeVirtualMemQueryPageSize`, `zePhysicalMemCreate`, `zePhysicalMemDestroy`,
//! `zePhysicalMemGetProperties`, `zeVirtualMemMap`, `zeVirtualMemUnmap`,
//! `zeVirtualMemSetAccessAttribute`, `zeVirtualMemGetAccessAttribute`): each takes the driver's
//! locks in the order of [`crate::semantics::driver`] and applies the rules of
//! [`crate::semantics::vmm`] (the bookkeeping) and [`crate::semantics::access`] (the per-page
//! attributes). `crate::Context`'s methods are one call each into here.

use std::sync::atomic::Ordering;

use crate::error::Result;
use crate::semantics::access::SetOutcome;
use crate::semantics::driver::{reservation_at, vm_write_unreferenced, DeviceRef, DriverShared};
use crate::semantics::inflight::InFlightRef;
use crate::semantics::vmm::{
    AccessAttribute, PhysicalMemory, PhysicalMemoryFlags, Reservation, VmStats,
};

/// `zeVirtualMemReserve` (rules: [`crate::semantics::vmm`]).
pub(crate) fn reserve(
    d: &DriverShared,
    context: u64,
    start_hint: Option<usize>,
    size: usize,
) -> Result<Reservation> {
    d.vm.write()
        .reserve(d.backend.as_ref(), context, start_hint.unwrap_or(0), size)
}

/// `zeVirtualMemFree`: once no queued work references the reservation
/// ([`vm_write_unreferenced`]).
pub(crate) fn free(d: &DriverShared, context: u64, ptr: usize, size: usize) -> Result<()> {
    let mut vm = vm_write_unreferenced(d, |vm| reservation_at(vm, ptr));
    vm.free(d.backend.as_ref(), context, ptr, size)
}

/// `zeVirtualMemQueryPageSize` for `device` (checked to be of this driver).
pub(crate) fn query_page_size(
    d: &DriverShared,
    device: DeviceRef<'_>,
    size: usize,
) -> Result<usize> {
    let ordinal = d.device_ordinal(device)?;
    d.vm.read().query_page_size(ordinal, size)
}

/// `zePhysicalMemCreate` on `device` (checked to be of this driver) or in host memory.
pub(crate) fn create_physical(
    d: &DriverShared,
    context: u64,
    device: Option<DeviceRef<'_>>,
    flags: PhysicalMemoryFlags,
    size: usize,
) -> Result<PhysicalMemory> {
    let slot = device.map(|dev| d.device_slot(dev)).transpose()?;
    d.vm.write().create_physical(
        d.backend.as_ref(),
        context,
        slot.map(|s| s.0),
        slot.and_then(|s| s.1),
        flags,
        size,
    )
}

/// `zePhysicalMemDestroy`.
pub(crate) fn destroy_physical(d: &DriverShared, context: u64, id: u64) -> Result<()> {
    d.vm.write()
        .destroy_physical(d.backend.as_ref(), context, id)
}

/// `zePhysicalMemGetProperties`: the id and size of live physical object `id` of `context`.
pub(crate) fn physical_properties(
    d: &DriverShared,
    context: u64,
    id: u64,
) -> Result<PhysicalMemory> {
    let vm = d.vm.read();
    let p = vm.physical_of(context, id)?;
    Ok(PhysicalMemory { id, size: p.size })
}

/// `zeVirtualMemMap`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn map(
    d: &DriverShared,
    context: u64,
    ptr: usize,
    size: usize,
    phys: u64,
    offset: usize,
    access: AccessAttribute,
) -> Result<()> {
    d.vm.write()
        .map(d.backend.as_ref(), context, ptr, size, phys, offset, access)
}

/// `zeVirtualMemUnmap`: once no queued work references the reservation
/// ([`vm_write_unreferenced`]).
pub(crate) fn unmap(d: &DriverShared, context: u64, ptr: usize, size: usize) -> Result<()> {
    let mut vm = vm_write_unreferenced(d, |vm| reservation_at(vm, ptr));
    vm.unmap(d.backend.as_ref(), context, ptr, size)
}

/// `zeVirtualMemSetAccessAttribute` without the `vm` lock ([`crate::semantics::access`]): finds
/// and validates the range, takes its reservation's gate (shared), and protects its mapped
/// pages. While queued or running work references the reservation, drops the gate, waits for
/// it (no lock held) and starts again. Submissions record their references under the gates
/// (exclusive) of the reservations they use, so under ours no new reference to it can appear;
/// if none is recorded driver-wide, ours has none (the fast path).
pub(crate) fn set_access(
    d: &DriverShared,
    context: u64,
    ptr: usize,
    size: usize,
    access: AccessAttribute,
) -> Result<()> {
    loop {
        let pages = d.vm_index.find(context, ptr, size)?;
        let busy = InFlightRef::Reservation(pages.base);
        let referenced = || {
            d.inflight.reservations.load(Ordering::Acquire) != 0
                && d.inflight.is_referenced_ref(busy)
        };
        match pages.set_access(d.backend.as_ref(), ptr, size, access, referenced)? {
            SetOutcome::Done => return Ok(()),
            SetOutcome::Referenced => d.inflight.wait_unreferenced_ref(busy),
        }
    }
}

/// `zeVirtualMemGetAccessAttribute`, without the `vm` lock ([`crate::semantics::access`]).
pub(crate) fn get_access(
    d: &DriverShared,
    context: u64,
    ptr: usize,
    size: usize,
) -> Result<(AccessAttribute, usize)> {
    d.vm_index.get_access(context, ptr, size)
}

/// The counters of the driver's virtual memory (all contexts).
pub(crate) fn stats(d: &DriverShared) -> VmStats {
    d.vm.read().stats()
}
