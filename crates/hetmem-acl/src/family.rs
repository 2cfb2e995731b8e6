//! Device and stream calls beyond [`crate::setup`] and [`crate::stream`] that the published
//! examples make: `aclrtResetDeviceForce`, `aclrtDestroyStreamForce`, `aclrtLaunchHostFunc`,
//! `aclrtLaunchCallback`.

use crate::state;
use crate::{entry, AclError};

/// `aclrtResetDeviceForce`: resets device `deviceId` whatever the number of `aclrtSetDevice`
/// calls made for it (CANN: one call after one or more `aclrtSetDevice` releases the device's
/// resources): its default context and everything made in it go, after their streams' work
/// (as `aclrtResetDevice` at count 0). Memory shared with other holders (imports, exports,
/// views of other contexts) stays valid for them.
///
/// Errors: `ACL_ERROR_RT_PARAM_INVALID` (107000) for an id that is not a device, or a device
/// with no default context (never set, or already reset: a second `aclrtResetDeviceForce`,
/// as CANN's threads example shows).
#[no_mangle]
pub extern "C" fn aclrtResetDeviceForce(device_id: i32) -> AclError {
    entry("aclrtResetDeviceForce", || {
        crate::setup::reset_device(device_id, true)
    })
}

/// `aclrtDestroyStreamForce`: destroys `stream` without waiting for its queued work (CANN:
/// "discard all tasks"): work not yet started is discarded, releasing what it held (the
/// memory it referenced can be freed at once, and is then correct for every other holder);
/// work already running finishes first. See [`crate::stream::AclStream::discard_queued`].
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for NULL (the default stream is not destroyed);
/// `ACL_ERROR_RT_PARAM_INVALID` (107000) for a handle that is not a live stream.
#[no_mangle]
pub extern "C" fn aclrtDestroyStreamForce(stream: *mut libc::c_void) -> AclError {
    entry("aclrtDestroyStreamForce", || {
        let g = state::fast_global()?;
        let h = stream as usize;
        let s = g
            .reg
            .lock()
            .remove::<crate::stream::AclStream>(h)
            .ok_or_else(|| state::bad_handle("stream", h))?;
        s.discard_queued();
        drop(s);
        Ok(())
    })
}

/// A C callback and its argument, run on a stream's engine.
struct HostCall(unsafe extern "C" fn(*mut libc::c_void), usize);

impl HostCall {
    fn run(self) {
        // SAFETY: the C caller's function with the argument it gave (its contract).
        unsafe { (self.0)(self.1 as *mut libc::c_void) }
    }
}

fn launch_host(stream: *mut libc::c_void, call: HostCall) -> crate::Res {
    let g = state::fast_global()?;
    let s = g.stream(stream as usize)?;
    Ok(s.managed()?.launch(&[], move |_| call.run())?)
}

/// `aclrtLaunchHostFunc`: runs `fn(args)` on the host when `stream` (NULL: the default stream)
/// reaches this point; later work of the stream waits for it to return.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null function; `ACL_ERROR_RT_PARAM_INVALID`
/// (107000) for a stream that is not live; `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000) where
/// streams run plain-memory work only (no managed memory here: the message says why).
#[no_mangle]
pub extern "C" fn aclrtLaunchHostFunc(
    stream: *mut libc::c_void,
    func: Option<unsafe extern "C" fn(*mut libc::c_void)>,
    args: *mut libc::c_void,
) -> AclError {
    entry("aclrtLaunchHostFunc", || {
        let f = func.ok_or_else(|| crate::null("fn"))?;
        launch_host(stream, HostCall(f, args as usize))
    })
}

/// `aclrtLaunchCallback`: as [`aclrtLaunchHostFunc`] with `blockType`
/// `ACL_CALLBACK_NO_BLOCK` (0) or `ACL_CALLBACK_BLOCK` (1): the callback runs in stream order on
/// the stream's engine in both cases (no `aclrtSubscribeReport` thread is needed), and later
/// work waits for it.
///
/// Errors: as [`aclrtLaunchHostFunc`]; `ACL_ERROR_RT_PARAM_INVALID` (107000) for another
/// `blockType`.
#[no_mangle]
pub extern "C" fn aclrtLaunchCallback(
    func: Option<unsafe extern "C" fn(*mut libc::c_void)>,
    user_data: *mut libc::c_void,
    block_type: u32,
    stream: *mut libc::c_void,
) -> AclError {
    entry("aclrtLaunchCallback", || {
        let f = func.ok_or_else(|| crate::null("fn"))?;
        if block_type > 1 {
            return Err(hetmem::Error::UnsupportedEnumeration(format!(
                "blockType {block_type} is not ACL_CALLBACK_NO_BLOCK (0) or ACL_CALLBACK_BLOCK (1)"
            ))
            .into());
        }
        launch_host(stream, HostCall(f, user_data as usize))
    })
}

/// A call's answer as this call's result (its message taken as ours).
fn inner(code: AclError) -> crate::Res {
    if code == 0 {
        return Ok(());
    }
    // SAFETY: the library's NUL-terminated message of this thread.
    let m = unsafe { std::ffi::CStr::from_ptr(crate::aclGetRecentErrMsg()) };
    Err(crate::Fail::new(code, m.to_string_lossy().into_owned()))
}

/// Checks that `[addr, addr+8)` is memory the runtime knows (device, host or managed memory,
/// mapped virtual memory) for a value call.
fn check_value_memory(c: &state::Ctx, addr: usize) -> crate::Res {
    if c.ctx.is_managed(addr) {
        return Ok(());
    }
    let a = c.ctx.get_allocation_properties(addr)?;
    if a.memory_type == hetmem::MemoryType::Unknown {
        return Err(hetmem::Error::InvalidArgument(format!(
            "devAddr {addr:#x} is not memory the runtime knows"
        ))
        .into());
    }
    Ok(())
}

/// `aclrtValueWrite`: writes the 64-bit `value` at `devAddr` (8-byte aligned device, host,
/// managed or mapped memory) when `stream` (NULL: the default stream) reaches this point.
///
/// Errors (nothing queued): `ACL_ERROR_INVALID_PARAM` (100000) for NULL or `flag` not 0;
/// `ACL_ERROR_RT_ADDR_UNALIGNED` (107008) for an address not 8-byte aligned;
/// `ACL_ERROR_RT_PARAM_INVALID` (107000) for memory the runtime does not know or a stream
/// that is not live; `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000) where streams run
/// plain-memory work only. A write that fails when it runs (the memory freed meanwhile) is
/// skipped.
#[no_mangle]
pub extern "C" fn aclrtValueWrite(
    dev_addr: *mut libc::c_void,
    value: u64,
    flag: u32,
    stream: *mut libc::c_void,
) -> AclError {
    entry("aclrtValueWrite", || {
        let g = state::fast_global()?;
        let a = dev_addr as usize;
        if a == 0 {
            return Err(crate::null("devAddr"));
        }
        hetmem::acl_ext::check_value_args(a, Some(flag))?;
        let s = g.stream(stream as usize)?;
        check_value_memory(&s.ctx, a)?;
        let ctx = s.ctx.clone();
        Ok(s.managed()?.launch(&[], move |_| {
            let v = value;
            // SAFETY: the C caller's memory (checked known when queued).
            let _ = unsafe { ctx.ctx.host_memcpy(a, &v as *const u64 as usize, 8) };
        })?)
    })
}

/// `aclrtValueWait`: later work of `stream` (NULL: the default stream) waits until the
/// 64-bit value at `devAddr` satisfies `flag` against `value`: `ACL_STREAM_WAIT_VALUE_GEQ`
/// (0) `>=`, `EQ` (1) `==`, `AND` (2) `& value != 0`, `NOR` (3) `!(cur | value) != 0`
/// ([`hetmem::acl_ext::ValueWait`]). The stream polls the value (every 50 us).
///
/// Errors (nothing queued): as [`aclrtValueWrite`]; `ACL_ERROR_RT_PARAM_INVALID` (107000) for
/// another flag. A wait whose memory goes meanwhile ends.
#[no_mangle]
pub extern "C" fn aclrtValueWait(
    dev_addr: *mut libc::c_void,
    value: u64,
    flag: u32,
    stream: *mut libc::c_void,
) -> AclError {
    entry("aclrtValueWait", || {
        let g = state::fast_global()?;
        let a = dev_addr as usize;
        if a == 0 {
            return Err(crate::null("devAddr"));
        }
        let cond = hetmem::acl_ext::ValueWait::from_raw(flag)?;
        hetmem::acl_ext::check_value_args(a, None)?;
        let s = g.stream(stream as usize)?;
        check_value_memory(&s.ctx, a)?;
        let ctx = s.ctx.clone();
        Ok(s.managed()?.launch(&[], move |_| loop {
            let mut cur = 0u64;
            // SAFETY: the C caller's memory (checked known when queued).
            let r = unsafe { ctx.ctx.host_memcpy(&mut cur as *mut u64 as usize, a, 8) };
            if r.is_err() || cond.satisfied(cur, value) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        })?)
    })
}

/// `aclrtCreateEventWithFlag`: as `aclrtCreateEvent`; every `ACL_EVENT_*` flag but IPC makes
/// the same event (records complete in stream order; timestamps are not kept).
///
/// Errors: those of `aclrtCreateEvent`; `ACL_ERROR_INVALID_PARAM` (100000) for unknown bits;
/// `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000) for `ACL_EVENT_IPC`.
#[no_mangle]
pub unsafe extern "C" fn aclrtCreateEventWithFlag(
    event: *mut *mut libc::c_void,
    flag: u32,
) -> AclError {
    entry("aclrtCreateEventWithFlag", || {
        hetmem::acl_ext::check_event_flags(flag)?;
        // SAFETY: the caller's out-pointer (checked there).
        inner(unsafe { crate::stream::aclrtCreateEvent(event) })
    })
}

/// `aclrtCreateEventExWithFlag`: as [`aclrtCreateEventWithFlag`] (every event here may be
/// recorded again).
#[no_mangle]
pub unsafe extern "C" fn aclrtCreateEventExWithFlag(
    event: *mut *mut libc::c_void,
    flag: u32,
) -> AclError {
    entry("aclrtCreateEventExWithFlag", || {
        hetmem::acl_ext::check_event_flags(flag)?;
        // SAFETY: the caller's out-pointer (checked there).
        inner(unsafe { crate::stream::aclrtCreateEvent(event) })
    })
}

/// `aclrtMemManagedPrefetchBatchAsync`: `count` prefetches (`ptrs[i]`, `sizes[i]` bytes) in
/// order on `stream`, each to `prefetchLocs[k]` for the indexes from `prefetchLocIdxs[k]` to
/// the next one's (the last to the end), each as `aclrtMemManagedPrefetchAsync` queues it.
///
/// Errors (argument errors before any prefetch): `ACL_ERROR_INVALID_PARAM` (100000) for a
/// null array, 0 prefetches or locations, or flags other than 0; `ACL_ERROR_RT_PARAM_INVALID`
/// (107000) for bad indexes; then the first prefetch's error that could not be queued.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn aclrtMemManagedPrefetchBatchAsync(
    ptrs: *const *const libc::c_void,
    sizes: *const usize,
    count: usize,
    prefetch_locs: *const crate::managed::AclMemManagedLocation,
    prefetch_loc_idxs: *const usize,
    num_prefetch_locs: usize,
    flags: u64,
    stream: *mut libc::c_void,
) -> AclError {
    entry("aclrtMemManagedPrefetchBatchAsync", || {
        state::fast_global()?;
        for (p, what) in [
            (ptrs as usize, "ptrs"),
            (sizes as usize, "sizes"),
            (prefetch_locs as usize, "prefetchLocs"),
            (prefetch_loc_idxs as usize, "prefetchLocIdxs"),
        ] {
            if p == 0 {
                return Err(crate::null(what));
            }
        }
        hetmem::acl::check_flags_zero(flags)?;
        // SAFETY: `num_prefetch_locs` indexes (the caller's contract).
        let idx = unsafe { std::slice::from_raw_parts(prefetch_loc_idxs, num_prefetch_locs) };
        hetmem::acl_ext::check_batch(count, idx)?;
        let mut k = 0;
        for i in 0..count {
            while k + 1 < idx.len() && idx[k + 1] <= i {
                k += 1;
            }
            // SAFETY: `count` entries and `num_prefetch_locs` locations (the caller's contract).
            let (p, s, l) = unsafe { (*ptrs.add(i), *sizes.add(i), prefetch_locs.add(k).read()) };
            inner(crate::managed::aclrtMemManagedPrefetchAsync(
                p, s, l, 0, stream,
            ))?;
        }
        Ok(())
    })
}
