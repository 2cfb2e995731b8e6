//! Contexts (`zeContextCreate`, `zeContextDestroy`): a context is an owner tag on the objects
//! made in it; its teardown releases them all, in the lock order of
//! [`crate::semantics::driver`]: managed allocations, then USM memory (what queued work of
//! another context's queues still references goes when that work finishes, as DEFER_FREE
//! does), then, once no queued work uses them, its reservations and physical memory, then its
//! IPC exports and views ([`crate::semantics::ipc`]).

use crate::semantics::driver::{vm_write_unreferenced, DriverShared};

/// A fresh context id (`zeContextCreate`).
pub(crate) fn create() -> u64 {
    crate::semantics::capacity::fresh_id()
}

/// Releases everything context `id` owns (`zeContextDestroy`, the drop of its last handle).
/// Waits (no lock held) until no queued work uses its reservations or views.
pub(crate) fn teardown(d: &DriverShared, id: u64) {
    d.managed.release_context(id);
    // Taken out under the write lock, so no new submission can reference it from here on.
    let taken = {
        let mut usm = d.usm.write();
        let taken = usm.take_context(id);
        taken.iter().for_each(|p| d.inflight.retiring(p));
        taken
    };
    for p in taken {
        if let Some(p) = d.inflight.defer_or_return(p) {
            d.inflight.finish(p, d.backend.as_ref());
        }
    }
    vm_write_unreferenced(d, |vm| vm.reservations_of(id)).release_context(d.backend.as_ref(), id);
    crate::semantics::ipc::release_context(d, id);
}
