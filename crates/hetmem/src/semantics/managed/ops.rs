//! Host-synchronous `aclrtMemcpy` / `aclrtMemset` by the calling thread over any memory:
//! [`memcpy`] with a managed side (the pages migrate to the host, or to the device that copies
//! when the plain side is device memory the host cannot reach), and [`host_memcpy`] /
//! [`host_memset`] over any two kinds of memory (managed memory goes to [`memcpy`] /
//! [`crate::semantics::managed::host::memset`]).
//!
//! Rules: null pointers are `ACL_ERROR_INVALID_PARAM` (100000). A plain side must not
//! overflow or run into managed memory ([`check_plain_overlap`], 107000) and must be process
//! memory mapped readable (`src`) / writable (`dst`) for the whole range
//! ([`check_process_memory`], 107000), unless it is device memory of this driver that the host
//! cannot reach (the cuda backend's device allocations, mappings and views): that side is
//! checked as a queue operand ([`crate::semantics::queue::check_operand`], its refusal as
//! 107000 through [`operand_error`]), held in flight against frees, and the copy or fill is done
//! by the device that owns it (`ManagedResidency::device_copy` with a managed side, else
//! [`crate::semantics::queue::device_sync_op`]).

use crate::backend::EngineOp;
use crate::error::Result;
use crate::semantics::driver::DriverShared;
use crate::semantics::managed::alloc::is_managed;
use crate::semantics::managed::host;
use crate::semantics::managed::rules::{
    check_null, check_plain_overlap, check_process_memory, neither_managed, operand_error,
};
use crate::semantics::managed::stream::device_copy;
use crate::semantics::queue::{check_operand, device_sync_op, hold, owning_device, Operand};
use std::sync::Arc;

/// Host-synchronous `aclrtMemcpy` of `count` bytes with at least one managed side (see
/// `Context::managed_memcpy`).
pub(crate) fn memcpy(d: &Arc<DriverShared>, dst: usize, src: usize, count: usize) -> Result<()> {
    check_null(dst, "pointer")?;
    check_null(src, "pointer")?;
    let core = d.managed.core(d.backend.as_ref())?;
    // A plain side that is not process memory mapped with the access needed, with why.
    let mut unreachable = None;
    let (dm, sm) = {
        let st = core.state.lock();
        let dm = core.find(&st, dst).is_some();
        let sm = core.find(&st, src).is_some();
        if !dm && !sm {
            return Err(neither_managed(dst, src));
        }
        for (p, managed, write) in [(dst, dm, true), (src, sm, false)] {
            if managed {
                core.check_range(&st, p, count)?;
            } else {
                check_plain_overlap(p, count, |end| {
                    st.allocs.range(p..end).next().map(|(&b, _)| b)
                })?;
                if let Err(e) = check_process_memory(d.backend.as_ref(), p, count, write) {
                    unreachable = Some((p, write, e));
                }
            }
        }
        (dm, sm)
    };
    if let Some((p, write, host_err)) = unreachable {
        // Not process memory: device memory of this driver is copied by a device.
        match device_side(d, p, count, write) {
            None => return Err(host_err),
            Some(Err(e)) => return Err(e),
            Some(Ok(())) => {}
        }
        let _held = hold(
            d,
            Operand {
                ptr: p,
                size: count,
                write,
            },
        )
        .map_err(operand_error)?;
        let device = owning_device(d, p).unwrap_or(0);
        return device_copy(core.res.as_ref(), device, (dst, dm), (src, sm), count);
    }
    // SAFETY: managed sides are inside live managed allocations (no lock is held here);
    // plain sides are mapped with the access needed.
    unsafe { core.res.host_copy(dst, src, count) };
    Ok(())
}

/// A plain (not managed) side of a host copy: no overflow, no managed byte, mapped with
/// the access needed.
fn check_plain(d: &DriverShared, p: usize, count: usize, write: bool) -> Result<()> {
    check_plain_overlap(p, count, |end| {
        d.managed.overlapping(p, end).map(|(b, _)| b)
    })?;
    if count == 0 {
        return Ok(());
    }
    check_process_memory(d.backend.as_ref(), p, count, write)
}

/// For a side the host cannot reach: `None` if it is not memory of this driver (or the
/// backend's device memory is host-accessible, as on the host backend:
/// [`crate::backend::Backend::device_memory_host_accessible`]), else whether a device can
/// reach it with the access needed, as a queue operand is checked (the error names what
/// is wrong: past the end, a page not mapped, a READONLY page for a write).
fn device_side(d: &DriverShared, p: usize, count: usize, write: bool) -> Option<Result<()>> {
    if d.backend.device_memory_host_accessible() {
        return None;
    }
    let usm = d.usm.read();
    let vm = d.vm.read();
    let views = crate::semantics::ipc::views::views(d);
    let known =
        usm.operand_info(p).is_some() || vm.pointer_info(p).is_some() || views.range(p).is_some();
    known.then(|| {
        check_operand(
            d,
            &usm,
            &vm,
            &views,
            Operand {
                ptr: p,
                size: count,
                write,
            },
            crate::semantics::queue::OperandRule::Acl,
        )
        .map(|_| ())
        .map_err(operand_error)
    })
}

/// Host-synchronous `aclrtMemcpy` of `count` bytes between any two kinds of memory (see
/// `Context::host_memcpy`).
///
/// # Safety
/// The caller guarantees that `dst` may be written and that nothing writes `src` meanwhile
/// (the checks only prove the memory is mapped).
pub(crate) unsafe fn host_memcpy(
    d: &Arc<DriverShared>,
    dst: usize,
    src: usize,
    count: usize,
) -> Result<()> {
    check_null(dst, "pointer")?;
    check_null(src, "pointer")?;
    if is_managed(d, dst) || is_managed(d, src) {
        return memcpy(d, dst, src, count);
    }
    let s = check_plain(d, src, count, false);
    let t = check_plain(d, dst, count, true);
    if let (Ok(()), Ok(())) = (&s, &t) {
        // SAFETY: both ranges are mapped with the access needed (checked); memmove.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, count) };
        return Ok(());
    }
    // A side the host cannot reach may be device memory of this driver (the cuda
    // backend's): the device copies.
    let mut device_sides = Vec::new();
    for (r, p, write) in [(s, src, false), (t, dst, true)] {
        if let Err(host_err) = r {
            match device_side(d, p, count, write) {
                None => return Err(host_err),
                Some(Err(e)) => return Err(e),
                Some(Ok(())) => {}
            }
            device_sides.push(Operand {
                ptr: p,
                size: count,
                write,
            });
        }
    }
    device_sync_op(
        d,
        &device_sides,
        EngineOp::Copy {
            dst,
            src,
            size: count,
        },
    )
}

/// Host-synchronous `aclrtMemset` of `count` bytes at `ptr` to `value`, any memory (see
/// `Context::host_memset`).
///
/// # Safety
/// As [`host_memcpy`]: the caller guarantees `[ptr, ptr + count)` may be written.
pub(crate) unsafe fn host_memset(
    d: &Arc<DriverShared>,
    ptr: usize,
    value: u8,
    count: usize,
) -> Result<()> {
    check_null(ptr, "pointer")?;
    if is_managed(d, ptr) {
        return host::memset(d, ptr, value, count);
    }
    if let Err(host_err) = check_plain(d, ptr, count, true) {
        // Device memory the host cannot reach (the cuda backend's): the device fills.
        match device_side(d, ptr, count, true) {
            None => return Err(host_err),
            Some(Err(e)) => return Err(e),
            Some(Ok(())) => {}
        }
        return device_sync_op(
            d,
            &[Operand {
                ptr,
                size: count,
                write: true,
            }],
            EngineOp::Fill {
                ptr,
                pattern: vec![value],
                size: count,
            },
        );
    }
    // SAFETY: the range is mapped writable (checked).
    unsafe { std::ptr::write_bytes(ptr as *mut u8, value, count) };
    Ok(())
}
