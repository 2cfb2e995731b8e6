//! `aclrtMemManagedPrefetchAsync`: one walk down, checked and recorded when queued, run in
//! order on the stream.
//!
//! In order: `flags` ([`check_prefetch_flags`], 100000), the platform, the stream of this
//! driver (107000), then under the state lock the pointer / size / range / alignment rules of
//! advice ([`check_advise_args`]) and the location ([`Core::resolve`]); then
//! LAST_PREFETCH_LOCATION is recorded at once (it records requests, not completion) and the
//! prefetch is queued with a hold on its allocation (a free waits until it has run). When the
//! stream reaches it the backend migrates the pages (`ManagedResidency::prefetch`); a device
//! that cannot take a single page is `ACL_ERROR_RT_MEMORY_ALLOCATION` (207001), reported by
//! the stream's synchronize.

use std::sync::Arc;

use crate::error::{AclCode, Error, Result};
use crate::semantics::driver::DriverShared;
use crate::semantics::managed::rules::{check_advise_args, check_prefetch_flags, residency_error};
use crate::semantics::managed::state::{Core, QueuedHold};
use crate::semantics::managed::stream::ManagedStream;
use crate::spec::Location;

/// `aclrtMemManagedPrefetchAsync` of `[ptr, ptr+size)` to `location` on `stream` (see
/// `Context::mem_prefetch`).
pub(crate) fn prefetch(
    d: &DriverShared,
    ptr: usize,
    size: usize,
    location: Location,
    flags: u32,
    stream: &ManagedStream,
) -> Result<()> {
    check_prefetch_flags(flags)?;
    let core = d.managed.core(d.backend.as_ref())?;
    if !Arc::ptr_eq(core, stream.core()) {
        return Err(Error::Acl(
            AclCode::RtParamInvalid,
            "the stream belongs to another driver".into(),
        ));
    }
    let (loc, hold) = {
        let mut st = core.state.lock();
        check_advise_args(core, &st, ptr, size)?;
        let loc = core.resolve(location, "a prefetch")?;
        for p in core.advice_mut(&mut st, ptr, size) {
            p.last_prefetch = Some(loc);
        }
        (loc, QueuedHold::take(core, &mut st, &[ptr]))
    };
    stream.enqueue(hold, move |c: &Core| {
        c.res
            .prefetch(ptr, size, loc.place())
            .map_err(residency_error)
    });
    Ok(())
}
