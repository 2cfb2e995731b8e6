//! Set-up calls: `aclInit`, `aclFinalize`, `aclrtGetVersion`, devices and contexts.
//!
//! As in ACL, the current context is per thread: `aclrtSetDevice(d)` makes device `d`'s
//! default context current on the calling thread (creating it on the first call; each call
//! counts, and `aclrtResetDevice` releases the default context and everything made in it when
//! the count drops to 0); `aclrtCreateContext` makes a new context current;
//! `aclrtSetCurrentContext` switches. The current device is the current context's device.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::state::{self, global, Ctx, Global, Registry};
use crate::{entry, null, out, AclError, Fail, Res};

/// The library's version: that of the CANN runtime headers whose calls it follows (1.17.0).
pub const VERSION: (i32, i32, i32) = (1, 17, 0);

/// `aclInit`: starts the library with the runtime chosen by the environment
/// (`HETMEM_BACKEND`, `HETMEM_HOST_DEVICES`, `HETMEM_HOST_DEVICE_MEMORY`,
/// `HETMEM_HOST_MAX_ALLOC`). `configPath` may be NULL or `""`; another path must name a
/// readable file (its contents are not used).
///
/// Errors: `ACL_ERROR_REPEAT_INITIALIZE` (100002) while initialised; `ACL_ERROR_INVALID_FILE`
/// (100003) for an unreadable configuration file; the runtime's error for a bad environment
/// (`InvalidArgument`, 107000, naming the variable).
#[no_mangle]
pub unsafe extern "C" fn aclInit(config_path: *const libc::c_char) -> AclError {
    entry("aclInit", || {
        if !config_path.is_null() {
            // SAFETY: a NUL-terminated string (the caller's contract).
            let p = unsafe { std::ffi::CStr::from_ptr(config_path) }.to_string_lossy();
            if !p.is_empty() {
                hetmem::platform::check_readable(&p).map_err(|e| {
                    Fail::new(
                        crate::ACL_ERROR_INVALID_FILE,
                        format!("configuration file {p:?} cannot be read: {e}"),
                    )
                })?;
            }
        }
        if state::global().is_ok() {
            return Err(Fail::new(
                crate::ACL_ERROR_REPEAT_INITIALIZE,
                "aclInit was already called (call aclFinalize first)",
            ));
        }
        let rt = hetmem::Runtime::from_env()?;
        if !state::install(
            Global {
                rt,
                reg: Mutex::new(Registry::default()),
            },
            crate::vmm::open,
        ) {
            return Err(Fail::new(
                crate::ACL_ERROR_REPEAT_INITIALIZE,
                "aclInit was already called (by another thread)",
            ));
        }
        Ok(())
    })
}

/// `aclFinalize`: waits for every stream's work, then releases everything made since `aclInit`
/// (contexts and all they own, streams, events, physical handles and their exports). Handles
/// given out before stay invalid forever (they are never reused). `aclInit` may follow.
///
/// Errors: `ACL_ERROR_UNINITIALIZE` (100001) if not initialised.
#[no_mangle]
pub extern "C" fn aclFinalize() -> AclError {
    entry("aclFinalize", || {
        // The instance, its registry and the VMM registry are taken out in one hold of each.
        let (_g, (reg, vmm)) = state::take(|g| {
            let reg = std::mem::take(&mut *g.reg.lock());
            let vmm = crate::vmm::close(reg.contexts.values());
            (reg, vmm)
        })
        .ok_or_else(|| Fail::new(crate::ACL_ERROR_UNINITIALIZE, "aclFinalize without aclInit"))?;
        teardown(reg, vmm);
        state::set_current(None);
        Ok(())
    })
}

/// Releases what a registry holds, outside any lock: streams first (their work finishes),
/// exports, then reservations, physical handles and contexts.
pub(crate) fn teardown(mut reg: Registry, vmm: crate::vmm::Taken) {
    for c in reg.contexts.values() {
        c.alive.store(false, std::sync::atomic::Ordering::Release);
    }
    for c in reg.contexts.values() {
        c.ctx.acl_ipc_forget_keys();
    }
    for o in reg.objects.values() {
        o.quiesce();
    }
    for (_, c) in reg.contexts.iter() {
        if let Some(s) = c.default_stream.lock().take() {
            s.quiesce();
        }
    }
    for (_, o) in reg.objects.drain() {
        o.release();
    }
    // Physical handles' exports end as they drop.
    drop(vmm);
    drop(reg);
}

/// `aclrtGetVersion`: writes 1, 17, 0. May be called before `aclInit`.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetVersion(
    major: *mut i32,
    minor: *mut i32,
    patch: *mut i32,
) -> AclError {
    entry("aclrtGetVersion", || {
        if major.is_null() || minor.is_null() || patch.is_null() {
            return Err(null("a version pointer"));
        }
        // SAFETY: non-null out-pointers (checked).
        unsafe {
            out(major, VERSION.0);
            out(minor, VERSION.1);
            out(patch, VERSION.2);
        }
        Ok(())
    })
}

/// `aclrtGetDeviceCount`: the number of devices of the runtime (`HETMEM_HOST_DEVICES` on the
/// host backend).
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetDeviceCount(count: *mut u32) -> AclError {
    entry("aclrtGetDeviceCount", || {
        let g = state::fast_global()?;
        if count.is_null() {
            return Err(null("count"));
        }
        // SAFETY: non-null out-pointer.
        unsafe { out(count, g.rt.driver().devices().len() as u32) };
        Ok(())
    })
}

/// `aclrtGetRunMode`: `ACL_HOST` (1): the program runs on the host, next to the devices.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetRunMode(mode: *mut u32) -> AclError {
    entry("aclrtGetRunMode", || {
        global()?;
        if mode.is_null() {
            return Err(null("runMode"));
        }
        // SAFETY: non-null out-pointer.
        unsafe { out(mode, 1u32) };
        Ok(())
    })
}

fn new_ctx(g: &state::G, dev: hetmem::Device, default: bool) -> Res<Arc<Ctx>> {
    let ctx = g.rt.driver().create_context()?;
    let gran = ctx.acl_granularity(&dev)?;
    Ok(Arc::new(Ctx {
        global: g.arc(),
        handle: state::fresh_handle(1),
        gran,
        dev,
        ctx,
        default,
        default_stream: Mutex::new(None),
        alive: std::sync::atomic::AtomicBool::new(true),
    }))
}

/// `aclrtSetDevice`: makes device `deviceId`'s default context current on the calling thread,
/// creating it on the device's first call (each call is counted for `aclrtResetDevice`).
///
/// Errors: `ACL_ERROR_RT_PARAM_INVALID` (107000) for an id that is not a device (negative or
/// not below `aclrtGetDeviceCount`).
#[no_mangle]
pub extern "C" fn aclrtSetDevice(device_id: i32) -> AclError {
    entry("aclrtSetDevice", || {
        let g = state::fast_global()?;
        let dev = g.device(device_id as i64)?;
        let ord = dev.ordinal();
        let mut reg = g.reg.lock();
        let c = match reg.defaults.get_mut(&ord) {
            Some((h, n)) => {
                *n += 1;
                let h = *h;
                reg.contexts[&h].clone()
            }
            None => {
                let c = new_ctx(&g, dev, true)?;
                let h = c.handle;
                reg.contexts.insert(h, c.clone());
                reg.defaults.insert(ord, (h, 1));
                c
            }
        };
        drop(reg);
        state::set_current(Some(&c));
        Ok(())
    })
}

/// `aclrtResetDevice`: undoes one `aclrtSetDevice(deviceId)`; the last one releases the
/// device's default context and everything made in it (its streams, events, memory,
/// reservations, physical handles), after its streams' work has finished. Threads whose current context it
/// was have none afterwards (`ACL_ERROR_RT_CONTEXT_NULL`).
///
/// Errors: `ACL_ERROR_RT_PARAM_INVALID` (107000) for an id that is not a device, or a device
/// that `aclrtSetDevice` has not been called for (or was reset as many times).
#[no_mangle]
pub extern "C" fn aclrtResetDevice(device_id: i32) -> AclError {
    entry("aclrtResetDevice", || reset_device(device_id, false))
}

/// `aclrtResetDevice` (`force` false: one `aclrtSetDevice` undone) and `aclrtResetDeviceForce`
/// (`force` true: the count drops to 0 at once, CANN's rule).
pub(crate) fn reset_device(device_id: i32, force: bool) -> Res {
    {
        let g = state::fast_global()?;
        let ord = g.device(device_id as i64)?.ordinal();
        let mut reg = g.reg.lock();
        let Some((h, n)) = reg.defaults.get_mut(&ord) else {
            return Err(hetmem::Error::InvalidArgument(format!(
                "device {device_id} has no default context to reset (aclrtSetDevice was not \
                 called for it, or it was reset as many times{})",
                if force {
                    ", or aclrtResetDeviceForce already reset it"
                } else {
                    ""
                }
            ))
            .into());
        };
        *n = if force { 0 } else { *n - 1 };
        if *n > 0 {
            return Ok(());
        }
        let h = *h;
        reg.defaults.remove(&ord);
        let (removed, vmm) = remove_context(&mut reg, h);
        drop(reg);
        if state::current_handle() == h {
            state::set_current(None);
        }
        teardown(removed, vmm);
        Ok(())
    }
}

/// Moves context `h` and everything made in it out of `reg` and the VMM registry (to be torn
/// down outside the locks).
fn remove_context(reg: &mut Registry, h: usize) -> (Registry, crate::vmm::Taken) {
    let mut out = Registry::default();
    if let Some(c) = reg.contexts.remove(&h) {
        out.contexts.insert(h, c);
    }
    let objects: Vec<usize> = reg
        .objects
        .iter()
        .filter(|(_, o)| o.ctx().handle == h)
        .map(|(&k, _)| k)
        .collect();
    for k in objects {
        let o = reg.objects.remove(&k).expect("listed");
        out.objects.insert(k, o);
    }
    let vmm = crate::vmm::take_contexts(out.contexts.values());
    (out, vmm)
}

/// `aclrtGetDevice`: the calling thread's current device.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer; `ACL_ERROR_RT_CONTEXT_NULL`
/// (107002) without a current context.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetDevice(device_id: *mut i32) -> AclError {
    entry("aclrtGetDevice", || {
        let g = state::fast_global()?;
        if device_id.is_null() {
            return Err(null("deviceId"));
        }
        let c = g.current()?;
        // SAFETY: non-null out-pointer.
        unsafe { out(device_id, c.dev.ordinal() as i32) };
        Ok(())
    })
}

/// `aclrtCreateContext`: a new context on device `deviceId`, made current on the calling
/// thread.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer; `ACL_ERROR_RT_PARAM_INVALID`
/// (107000) for an id that is not a device.
#[no_mangle]
pub unsafe extern "C" fn aclrtCreateContext(
    context: *mut *mut libc::c_void,
    device_id: i32,
) -> AclError {
    entry("aclrtCreateContext", || {
        let g = state::fast_global()?;
        if context.is_null() {
            return Err(null("context"));
        }
        let dev = g.device(device_id as i64)?;
        let c = new_ctx(&g, dev, false)?;
        let h = c.handle;
        g.reg.lock().contexts.insert(h, c.clone());
        state::set_current(Some(&c));
        // SAFETY: non-null out-pointer.
        unsafe { out(context, h as *mut libc::c_void) };
        Ok(())
    })
}

/// `aclrtDestroyContext`: releases a context made by `aclrtCreateContext` and everything made
/// in it (streams, events, memory, reservations, physical handles; after its streams' work). Threads whose current context it was have none afterwards.
///
/// Errors: `ACL_ERROR_RT_PARAM_INVALID` (107000) for a handle that is not a live context, or a
/// device's default context (released by `aclrtResetDevice`).
#[no_mangle]
pub extern "C" fn aclrtDestroyContext(context: *mut libc::c_void) -> AclError {
    entry("aclrtDestroyContext", || {
        let g = state::fast_global()?;
        let h = context as usize;
        let c = g.context(h)?;
        if c.default {
            return Err(hetmem::Error::InvalidArgument(format!(
                "context {h:#x} is the default context of device {}; aclrtResetDevice releases it",
                c.dev.ordinal()
            ))
            .into());
        }
        let (removed, vmm) = remove_context(&mut g.reg.lock(), h);
        if state::current_handle() == h {
            state::set_current(None);
        }
        teardown(removed, vmm);
        Ok(())
    })
}

/// `aclrtSetCurrentContext`: makes `context` current on the calling thread (and its device the
/// current device).
///
/// Errors: `ACL_ERROR_RT_PARAM_INVALID` (107000) for a handle that is not a live context
/// (`ACL_ERROR_INVALID_PARAM` for NULL).
#[no_mangle]
pub extern "C" fn aclrtSetCurrentContext(context: *mut libc::c_void) -> AclError {
    entry("aclrtSetCurrentContext", || {
        let g = state::fast_global()?;
        let c = g.context(context as usize)?;
        state::set_current(Some(&c));
        Ok(())
    })
}

/// `aclrtGetCurrentContext`: the calling thread's current context.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer; `ACL_ERROR_RT_CONTEXT_NULL`
/// (107002) without one (none set yet, or its device reset), with `*context` set to NULL.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetCurrentContext(context: *mut *mut libc::c_void) -> AclError {
    entry("aclrtGetCurrentContext", || {
        let g = state::fast_global()?;
        if context.is_null() {
            return Err(null("context"));
        }
        let c = g.current().inspect_err(|_| {
            // The documented error with `*context` NULL: a caller testing `!ctx` afterwards
            // reads no garbage.
            // SAFETY: non-null out-pointer.
            unsafe { out(context, std::ptr::null_mut()) };
        })?;
        // SAFETY: non-null out-pointer.
        unsafe { out(context, c.handle as *mut libc::c_void) };
        Ok(())
    })
}
