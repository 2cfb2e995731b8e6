//! `aclrtMemAllocManaged` and `aclrtFree` of managed memory, and the queries over the live
//! allocations of a driver: whether a pointer is managed (the "inside managed memory" check,
//! as a query of hetmem's own) and the residency counters.
//!
//! Allocation: the argument rules ([`check_alloc_args`]), the platform check (the driver's
//! [`Core`](crate::semantics::managed::state::Core) made on first use), the 3 TiB process
//! limit, then the backend's range, then the record. A free waits for the stream work queued
//! on the allocation ([`QueuedHold`](crate::semantics::managed::state::QueuedHold)), takes it
//! out of the table, then lets the backend free it once work running on it has finished.

use std::sync::atomic::Ordering;

pub use crate::backend::managed::{ManagedDeviceStats, ManagedStats};
use crate::error::{AclCode, Addr, Error, Result};
use crate::semantics::driver::DriverShared;
use crate::semantics::managed::rules::{check_alloc_args, check_null};
use crate::semantics::managed::state::{
    Alloc, PageAdvice, MAX_MANAGED_PER_PROCESS, PAGE, PROCESS_MANAGED,
};

/// `aclrtMemAllocManaged` of `size` bytes with `flag` for context `ctx` (see
/// `Context::alloc_managed`): the base of the new allocation.
pub(crate) fn allocate(d: &DriverShared, ctx: u64, size: u64, flag: u32) -> Result<usize> {
    let rounded = check_alloc_args(size, flag)?;
    let core = d.managed.core(d.backend.as_ref())?;
    PROCESS_MANAGED
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
            u.checked_add(rounded)
                .filter(|&n| n <= MAX_MANAGED_PER_PROCESS)
        })
        .map_err(|u| {
            Error::Acl(
                AclCode::RtMemoryAllocation,
                format!(
                    "the process holds {u:#x} bytes of managed memory; {rounded:#x} more would \
                     pass the 3 TiB limit"
                ),
            )
        })?;
    let base = match core.res.allocate(rounded as usize, PAGE) {
        Ok(b) => b,
        Err(e) => {
            PROCESS_MANAGED.fetch_sub(rounded, Ordering::AcqRel);
            return Err(e.into());
        }
    };
    core.state.lock().allocs.insert(
        base,
        Alloc {
            size: rounded as usize,
            ctx,
            pages: vec![PageAdvice::default(); rounded as usize / PAGE],
        },
    );
    Ok(base)
}

/// `aclrtFree` of managed memory of context `ctx` (see `Context::free_managed`): `ptr` must be
/// the base of a live allocation of `ctx`; stream work queued on it runs first, then the
/// backend frees it once work running on it has finished.
pub(crate) fn free(d: &DriverShared, ctx: u64, ptr: usize) -> Result<()> {
    check_null(ptr, "pointer")?;
    let core = d.managed.core(d.backend.as_ref())?;
    let mut st = core.state.lock();
    let size = match st.allocs.get(&ptr) {
        Some(a) if a.ctx == ctx => a.size,
        _ => {
            return Err(Error::Acl(
                AclCode::RtParamInvalid,
                format!(
                    "{} is not the base of a managed allocation of this context",
                    Addr(ptr)
                ),
            ))
        }
    };
    // Stream work queued on the allocation runs first (the state lock is released while
    // waiting).
    while st.queued.contains_key(&ptr) {
        core.released.wait(&mut st);
        match st.allocs.get(&ptr) {
            Some(a) if a.ctx == ctx && a.size == size => {}
            _ => {
                return Err(Error::Acl(
                    AclCode::RtParamInvalid,
                    format!(
                        "{} was freed by another thread while this free waited",
                        Addr(ptr)
                    ),
                ))
            }
        }
    }
    // Out of the table: no more work can be queued on it. Then the backend frees it, once
    // work running on it has finished (its pages are pinned there).
    core.forget(&mut st, ptr);
    drop(st);
    // SAFETY: `ptr` was the base of a live allocation, now out of the table.
    unsafe { core.res.free(ptr) };
    Ok(())
}

/// Whether the byte at `ptr` is inside a live managed allocation of the driver (any context);
/// false before the first managed allocation.
pub(crate) fn is_managed(d: &DriverShared, ptr: usize) -> bool {
    d.managed
        .existing()
        .is_some_and(|c| c.find(&c.state.lock(), ptr).is_some())
}

/// The residency counters of the driver's managed memory (all zero, one entry per device,
/// before the first managed allocation).
pub(crate) fn stats(d: &DriverShared) -> ManagedStats {
    match d.managed.existing() {
        Some(c) => c.res.stats(),
        None => ManagedStats {
            devices: vec![ManagedDeviceStats::default(); d.backend.devices().len()],
            ..Default::default()
        },
    }
}
