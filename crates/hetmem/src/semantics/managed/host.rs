//! Host accesses of managed memory, by the calling thread: host-synchronous `aclrtMemset`
//! ([`memset`]) and `aclrtMemcpy` between managed memory and a host buffer ([`write`],
//! [`read`]), whose pages migrate to the host; and the two inspections that move nothing
//! ([`peek`]: the bytes wherever each page lives; [`residency`]: where a page lives).
//!
//! Rules: a null pointer is `ACL_ERROR_INVALID_PARAM` (100000); the range must lie inside one
//! managed allocation ([`Core::check_range`], 107000); `ACL_ERROR_RT_FEATURE_NOT_SUPPORT`
//! (207000) where managed memory is unavailable. No lock is held during the access.

use std::sync::Arc;

pub use crate::backend::managed::Residency;
use crate::error::Result;
use crate::semantics::driver::DriverShared;
use crate::semantics::managed::rules::{check_null, residency_error};
use crate::semantics::managed::state::Core;

/// The driver's managed memory once `[ptr, ptr+count)` is checked to lie inside one live
/// managed allocation (pointer, then platform, then range).
fn check_host_range(d: &DriverShared, ptr: usize, count: usize) -> Result<&Arc<Core>> {
    check_null(ptr, "pointer")?;
    let core = d.managed.core(d.backend.as_ref())?;
    let st = core.state.lock();
    core.check_range(&st, ptr, count)?;
    Ok(core)
}

/// Host-synchronous `aclrtMemset` of `count` bytes at `ptr` (managed) to `value`.
pub(crate) fn memset(d: &DriverShared, ptr: usize, value: u8, count: usize) -> Result<()> {
    let core = check_host_range(d, ptr, count)?;
    // SAFETY: the range is inside a live managed allocation. No lock is held here.
    unsafe { core.res.host_fill(ptr, value, count) };
    Ok(())
}

/// Host-synchronous `aclrtMemcpy` of `data` into managed memory at `dst`.
pub(crate) fn write(d: &DriverShared, dst: usize, data: &[u8]) -> Result<()> {
    let core = check_host_range(d, dst, data.len())?;
    // SAFETY: the range is inside a live managed allocation; `data` is readable (and copy
    // allows overlap anyway).
    unsafe { core.res.host_copy(dst, data.as_ptr() as usize, data.len()) };
    Ok(())
}

/// Host-synchronous `aclrtMemcpy` of managed memory at `src` into `out`.
pub(crate) fn read(d: &DriverShared, src: usize, out: &mut [u8]) -> Result<()> {
    let core = check_host_range(d, src, out.len())?;
    // SAFETY: the range is inside a live managed allocation; `out` is writable.
    unsafe {
        core.res
            .host_copy(out.as_mut_ptr() as usize, src, out.len())
    };
    Ok(())
}

/// The bytes of managed memory at `src` from wherever each page lives now, without migrating
/// anything or counting a fault.
///
/// Errors: as [`read`]; the backend's (a read-mostly page whose copies differ:
/// `ACL_ERROR_RT_DRV_INTERNAL_ERROR`, through [`residency_error`]).
pub(crate) fn peek(d: &DriverShared, src: usize, out: &mut [u8]) -> Result<()> {
    check_null(src, "pointer")?;
    let core = d.managed.core(d.backend.as_ref())?;
    core.check_range(&core.state.lock(), src, out.len())?;
    core.res.peek(src, out).map_err(residency_error)
}

/// Where the page holding `ptr` lives now; `None` if `ptr` is not managed or the page has
/// never been touched.
pub(crate) fn residency(d: &DriverShared, ptr: usize) -> Option<Residency> {
    d.managed.existing()?.res.residency(ptr)
}
