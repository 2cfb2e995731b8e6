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
            .streams
            .remove(&h)
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
