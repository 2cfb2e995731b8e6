//! The state of one driver that every semantics module works on: the backend, the
//! virtual-memory and USM bookkeeping, the in-flight references of queued work, managed memory.
//! Lock order: `usm` before `vm` before a reservation's gate
//! ([`crate::semantics::access`]) before `inflight`; `managed` is never held with either.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::backend::Backend;
use crate::config::BackendConfig;
use crate::error::Result;
use crate::semantics::access::{ReservationIndex, SetOutcome};
use crate::semantics::inflight::InFlightRef;
use crate::semantics::usm::UsmState;
use crate::semantics::vmm::{AccessAttribute, VmState};

#[derive(Debug)]
pub(crate) struct DriverShared {
    pub(crate) config: BackendConfig,
    pub(crate) backend: Box<dyn Backend>,
    pub(crate) vm: RwLock<VmState>,
    /// `vm`'s reservation page tables, for the access calls, which take no `vm` lock
    /// ([`crate::semantics::access`]).
    pub(crate) vm_index: Arc<ReservationIndex>,
    /// USM allocations and imports. Lock order: `usm` before `vm` when both are held (an
    /// import checks that it overlaps no reservation); never take `usm` while holding `vm`.
    pub(crate) usm: RwLock<UsmState>,
    /// In-flight references of queued device work to USM allocations ([`crate::queue`]).
    pub(crate) inflight: crate::semantics::inflight::InFlight,
    /// ACL managed memory ([`crate::managed`]); its own lock, never held with `usm` or `vm`.
    pub(crate) managed: crate::semantics::managed::state::ManagedState,
    /// [`RuntimeBuilder::ipc_max_range_pieces`].
    pub(crate) ipc_max_range_pieces: usize,
    /// The engines of the host-synchronous copies and fills that reach memory the host cannot
    /// ([`crate::semantics::queue::device_sync_op`]), by device ordinal, each made on first
    /// use; one operation at a time.
    pub(crate) sync_engines:
        parking_lot::Mutex<std::collections::HashMap<u32, Box<dyn crate::backend::Engine>>>,
}

/// Takes the driver's `vm` write lock once no queued or running work references any of the
/// reservations `bases` lists (computed under the lock). While one is referenced, drops the
/// lock, waits for it (no lock held, so engines and unrelated calls go on) and tries again.
/// Under the write lock no submission can take a new reference (they check under the read
/// lock), so the returned guard may change those reservations safely.
pub(crate) fn vm_write_unreferenced(
    d: &DriverShared,
    bases: impl Fn(&VmState) -> Vec<usize>,
) -> parking_lot::RwLockWriteGuard<'_, VmState> {
    loop {
        let vm = d.vm.write();
        // Fast path: no in-flight work references any reservation.
        if d.inflight.reservations.load(Ordering::Acquire) == 0 {
            return vm;
        }
        let busy = bases(&vm)
            .into_iter()
            .map(InFlightRef::Reservation)
            .find(|&r| d.inflight.is_referenced_ref(r));
        match busy {
            None => return vm,
            Some(r) => {
                drop(vm);
                d.inflight.wait_unreferenced_ref(r);
            }
        }
    }
}

/// The base of the reservation containing `ptr`, if any (for [`vm_write_unreferenced`]).
pub(crate) fn reservation_at(vm: &VmState, ptr: usize) -> Vec<usize> {
    vm.pointer_info(ptr)
        .map(|i| i.reservation.0)
        .into_iter()
        .collect()
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
