//! The state of one driver that every semantics module works on: the backend, the
//! virtual-memory and USM bookkeeping, the in-flight references of queued work, managed memory;
//! the device-of-driver check ([`DeviceRef`]) and the driver-wide queries of `zeDriver*` /
//! `zeDevice*` (description, devices, used and free memory, pending frees).
//!
//! # Lock order (the one place it is written down)
//!
//! The semantics layer takes every lock of a driver itself; `api/` takes none. When several
//! are held at once they are taken in this order, never the other way:
//!
//! 1. `usm` (the USM allocations and imports; an import checks that it overlaps no reservation);
//! 2. `vm` (reservations, physical memory, mappings);
//! 3. the IPC view table ([`crate::semantics::ipc`]);
//! 4. a reservation's gate ([`crate::semantics::access`]; several in address order);
//! 5. `inflight` (the in-flight references of queued work, [`crate::semantics::inflight`]).
//!
//! `managed` ([`crate::semantics::managed`]) is never held together with `usm` or `vm` (a call
//! that needs both asks `managed` first and lets it go). The completion path of a batch takes
//! only `inflight`, then frees USM memory with no lock held; a call that waits for queued work
//! ([`vm_write_unreferenced`], [`crate::semantics::vmm::calls::set_access`]) waits with no lock
//! held.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::backend::{Backend, DeviceInfo};
use crate::config::BackendConfig;
use crate::error::Result;
use crate::semantics::access::ReservationIndex;
use crate::semantics::capacity::DeviceMemory;
use crate::semantics::inflight::{InFlight, InFlightRef};
use crate::semantics::managed::state::ManagedState;
use crate::semantics::usm::UsmState;
use crate::semantics::vmm::VmState;

#[derive(Debug)]
/// The fields are the semantics layer's alone: `api/` reaches the driver only through the
/// calls of the semantics modules.
pub(crate) struct DriverShared {
    pub(in crate::semantics) config: BackendConfig,
    pub(in crate::semantics) backend: Box<dyn Backend>,
    pub(in crate::semantics) vm: RwLock<VmState>,
    /// `vm`'s reservation page tables, for the access calls, which take no `vm` lock
    /// ([`crate::semantics::access`]).
    pub(in crate::semantics) vm_index: Arc<ReservationIndex>,
    /// USM allocations and imports (lock order: see the module docs).
    pub(in crate::semantics) usm: RwLock<UsmState>,
    /// In-flight references of queued device work to USM allocations ([`crate::queue`]).
    pub(in crate::semantics) inflight: InFlight,
    /// ACL managed memory ([`crate::managed`]); its own lock, never held with `usm` or `vm`.
    pub(in crate::semantics) managed: ManagedState,
    /// [`crate::RuntimeBuilder::ipc_max_range_pieces`].
    pub(in crate::semantics) ipc_max_range_pieces: usize,
    /// The engines of the host-synchronous copies and fills that reach memory the host cannot
    /// ([`crate::semantics::queue::device_sync_op`]), by device ordinal, each made on first
    /// use; one operation at a time.
    pub(in crate::semantics) sync_engines:
        parking_lot::Mutex<std::collections::HashMap<u32, Box<dyn crate::backend::Engine>>>,
    /// The devices' (and sub-devices') capacity counters, shared with `vm`, `usm` and
    /// `managed` (lock-free).
    pub(in crate::semantics) devmem: Arc<DeviceMemory>,
}

impl DriverShared {
    /// The state of a new driver over `backend`: empty bookkeeping, the devices' capacity
    /// counters shared by virtual memory, USM and managed memory.
    pub(crate) fn new(
        config: BackendConfig,
        backend: Box<dyn Backend>,
        ipc_max_range_pieces: usize,
    ) -> DriverShared {
        let devmem = Arc::new(DeviceMemory::new(backend.devices(), config.sub_devices()));
        let vm = VmState::new(backend.as_ref(), devmem.clone());
        let managed = ManagedState::new(devmem.clone());
        let usm = UsmState::new(backend.as_ref(), devmem.clone());
        let vm_index = vm.index.clone();
        DriverShared {
            config,
            backend,
            vm: RwLock::new(vm),
            vm_index,
            usm: RwLock::new(usm),
            inflight: InFlight::default(),
            managed,
            ipc_max_range_pieces,
            sync_engines: parking_lot::Mutex::new(Default::default()),
            devmem,
        }
    }

    /// The ordinal of `device` if it is a device of this driver: the one device-of-driver
    /// check of every call that takes a device ([`crate::semantics::checks::check_device`]).
    ///
    /// Errors: `InvalidNullHandle` for a device of another driver.
    pub(crate) fn device_ordinal(&self, device: DeviceRef<'_>) -> Result<u32> {
        crate::semantics::checks::check_device(self, device.driver, device.ordinal)
    }

    /// [`DriverShared::device_ordinal`], with the sub-device `device` names, if any: where
    /// memory made on it is charged ([`crate::semantics::capacity`]). The backend works on
    /// the ordinal (a sub-device's work is its root's).
    ///
    /// Errors: `InvalidNullHandle` for a device of another driver.
    pub(crate) fn device_slot(&self, device: DeviceRef<'_>) -> Result<(u32, Option<u32>)> {
        Ok((self.device_ordinal(device)?, device.sub))
    }
}

/// A device as a call names it: its driver, its ordinal and, for a sub-device, its index
/// among its root's sub-devices (what a `crate::Device` holds). Checked against the driver of
/// the call by [`DriverShared::device_ordinal`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceRef<'a> {
    pub(crate) driver: &'a DriverShared,
    pub(crate) ordinal: u32,
    /// Sub-device `sub` of device `ordinal`; `None` for the (root) device itself.
    pub(crate) sub: Option<u32>,
}

/// The backend and the settings in force.
pub(crate) fn config(d: &DriverShared) -> &BackendConfig {
    &d.config
}

/// The backend's description (platform, versions).
/// The backend's page kinds and why (`Driver::page_kinds`).
pub(crate) fn page_kinds(d: &DriverShared) -> Option<String> {
    d.backend.page_kinds()
}

pub(crate) fn describe(d: &DriverShared) -> String {
    d.backend.describe()
}

/// The backend's descriptions of the devices, in ordinal order (`zeDeviceGet`).
pub(crate) fn devices(d: &DriverShared) -> &[DeviceInfo] {
    d.backend.devices()
}

/// Sub-devices of every device of this driver (0: none; [`crate::semantics::capacity`]).
pub(crate) fn sub_devices(d: &DriverShared) -> u32 {
    d.devmem.sub_devices
}

/// Why this driver's devices have no sub-devices where that is the platform's nature, not a
/// setting (the backend's words; `None` where sub-devices are configured, as on the host
/// backend).
pub(crate) fn sub_devices_note(d: &DriverShared) -> Option<String> {
    d.backend.sub_devices_note()
}

/// Capacity in bytes of device `ordinal`, or of its sub-device `sub` (its share).
pub(crate) fn capacity(d: &DriverShared, ordinal: u32, sub: Option<u32>) -> u64 {
    d.devmem.slot_capacity(ordinal as usize, sub)
}

/// The largest single allocation of device `ordinal` (the backend's), or of its sub-device
/// `sub` (the same, at most the sub-device's share).
pub(crate) fn max_alloc_size(d: &DriverShared, ordinal: u32, sub: Option<u32>) -> u64 {
    let max = devices(d)[ordinal as usize].max_alloc_size;
    match sub {
        None => max,
        Some(_) => max.min(capacity(d, ordinal, sub)),
    }
}

/// Bytes of device `ordinal`'s capacity in use now (physical memory and USM alike, its
/// sub-devices' included), or of its sub-device `sub`'s share.
pub(crate) fn used_memory(d: &DriverShared, ordinal: u32, sub: Option<u32>) -> u64 {
    d.devmem.slot_used(ordinal as usize, sub)
}

/// Bytes free on device `ordinal` now: the backend's answer (`cuMemGetInfo`) where it has one,
/// else the modelled capacity less [`used_memory`]; on sub-device `sub`, the smaller of its
/// share's free bytes and its root's.
///
/// Errors: a driver that cannot answer (`Unknown`, naming the call).
pub(crate) fn free_memory(d: &DriverShared, ordinal: u32, sub: Option<u32>) -> Result<u64> {
    let i = ordinal as usize;
    let root = match d.backend.device_free_memory(ordinal)? {
        Some(free) => free,
        None => d.devmem.slot_free(i, None),
    };
    Ok(match sub {
        None => root,
        Some(_) => d.devmem.slot_free(i, sub).min(root),
    })
}

/// Frees waiting for queued work to finish (for leak checks).
pub(crate) fn pending_frees(d: &DriverShared) -> usize {
    d.inflight.pending_frees()
}

/// Threads blocked now in a call that waits for queued work to let go of memory.
pub(crate) fn in_flight_waiters(d: &DriverShared) -> u64 {
    d.inflight.waiters()
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
