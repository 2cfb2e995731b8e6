//! IPC of device memory by key (`aclrtIpcMemGetExportKey`, `aclrtIpcMemSetImportPid`,
//! `aclrtIpcMemImportByKey`, `aclrtIpcMemClose`) and the process id other processes whitelist
//! (`aclrtDeviceGetBareTgid`).
//!
//! The rules, the key format, the records and this process's tables of exports and views are
//! hetmem's (`semantics::acl::ipc_key`, through [`hetmem::Context::acl_ipc_export_key`],
//! [`hetmem::Driver::acl_ipc_set_import_pids`], [`hetmem::Context::acl_ipc_import_key`],
//! [`hetmem::Driver::acl_ipc_close_key`]); the pid whitelist is the one shareable handles follow
//! ([`hetmem::acl::check_import_pid`]). This file decodes the C arguments and writes the
//! answers. A context's keys end when it goes (`aclrtResetDevice`, `aclrtDestroyContext`,
//! `aclFinalize`: [`hetmem::Context::acl_ipc_forget_keys`]).

use crate::state;
use crate::{entry, null, out, AclError, Res};

pub use hetmem::acl::{
    IPC_EXPORT_FLAG_DISABLE_PID_VALIDATION, IPC_IMPORT_FLAG_ENABLE_PEER_ACCESS, KEY_LEN,
};

/// The key C passed.
///
/// # Safety
/// `key` is NULL or a NUL-terminated string.
unsafe fn key_arg(key: *const libc::c_char) -> Res<String> {
    if key.is_null() {
        return Err(null("key"));
    }
    // SAFETY: the caller's contract.
    let k = unsafe { std::ffi::CStr::from_ptr(key) };
    Ok(k.to_string_lossy().into_owned())
}

/// `aclrtDeviceGetBareTgid`: the id of the calling process as other processes name it in
/// `aclrtMemSetPidToShareableHandle` / `aclrtIpcMemSetImportPid` (the pid the imports of this
/// library check, [`hetmem::acl::own_pid`]). May be called before `aclInit`.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer.
#[no_mangle]
pub unsafe extern "C" fn aclrtDeviceGetBareTgid(pid: *mut i32) -> AclError {
    entry("aclrtDeviceGetBareTgid", || {
        if pid.is_null() {
            return Err(null("pid"));
        }
        // SAFETY: non-null out-pointer.
        unsafe { out(pid, hetmem::acl::own_pid() as i32) };
        Ok(())
    })
}

/// `aclrtIpcMemGetExportKey`: exports the device allocation at `devPtr` (the pointer
/// `aclrtMalloc` returned; `size` bytes of it, 0 < `size` <= its size; the whole allocation is
/// shared) and writes its key (NUL-terminated, at most [`KEY_LEN`] bytes) to `key[len]`.
///
/// Errors (nothing exported): `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer, size 0,
/// `len` too small for the key, or flags other than DEFAULT (0) / DISABLE_PID_VALIDATION (1);
/// `ACL_ERROR_RT_PARAM_INVALID` (107000) for a pointer that is not the start of a device
/// allocation of the current context or a size past its end.
#[no_mangle]
pub unsafe extern "C" fn aclrtIpcMemGetExportKey(
    dev_ptr: *mut libc::c_void,
    size: usize,
    key: *mut libc::c_char,
    len: usize,
    flags: u64,
) -> AclError {
    entry("aclrtIpcMemGetExportKey", || {
        let g = state::fast_global()?;
        if dev_ptr.is_null() || key.is_null() {
            return Err(null(if key.is_null() { "key" } else { "devPtr" }));
        }
        let c = g.current()?;
        let k = c
            .ctx
            .acl_ipc_export_key(dev_ptr as usize, size, flags, len)?;
        // SAFETY: `key` has room for `len` >= k.len() + 1 bytes (checked by the export).
        unsafe {
            std::ptr::copy_nonoverlapping(k.as_ptr(), key as *mut u8, k.len());
            *key.add(k.len()) = 0;
        }
        Ok(())
    })
}

/// `aclrtIpcMemSetImportPid`: the processes (by pid) that may import `key` (exported by this
/// process without DISABLE_PID_VALIDATION); replaces the previous list.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer or `num` 0;
/// `ACL_ERROR_RT_PARAM_INVALID` (107000) for a key this process did not export (or closed).
#[no_mangle]
pub unsafe extern "C" fn aclrtIpcMemSetImportPid(
    key: *const libc::c_char,
    pid: *const i32,
    num: usize,
) -> AclError {
    entry("aclrtIpcMemSetImportPid", || {
        let g = state::fast_global()?;
        // SAFETY: NULL or a NUL-terminated string (the caller's contract).
        let k = unsafe { key_arg(key) }?;
        if pid.is_null() {
            return Err(null("pid"));
        }
        hetmem::acl::check_pid_count(num)?;
        // SAFETY: an array of `num` pids (the caller's contract; the count is checked).
        let pids = unsafe { std::slice::from_raw_parts(pid, num) };
        Ok(g.rt.driver().acl_ipc_set_import_pids(&k, pids)?)
    })
}

/// `aclrtIpcMemImportByKey`: opens the memory `key` shares (exported by another process or
/// this one) in the current context and writes its address to `*devPtr`: the exporter's bytes,
/// read and written through `aclrtMemcpy` / `aclrtMemset` and streams. It stays valid until
/// `aclrtIpcMemClose(key)` here, even after the exporter closes its key.
///
/// Errors (`*devPtr` unchanged): `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer or flags
/// other than DEFAULT (0) / ENABLE_PEER_ACCESS (1); `ACL_ERROR_RT_PARAM_INVALID` (107000) for a
/// key that is not one, was closed by its exporter or whose exporter is gone, a process not on
/// the key's pid list, or a key already imported here.
#[no_mangle]
pub unsafe extern "C" fn aclrtIpcMemImportByKey(
    dev_ptr: *mut *mut libc::c_void,
    key: *const libc::c_char,
    flags: u64,
) -> AclError {
    entry("aclrtIpcMemImportByKey", || {
        let g = state::fast_global()?;
        if dev_ptr.is_null() {
            return Err(null("devPtr"));
        }
        // SAFETY: NULL or a NUL-terminated string (the caller's contract).
        let k = unsafe { key_arg(key) }?;
        let c = g.current()?;
        let ptr = c.ctx.acl_ipc_import_key(&k, flags)?;
        // SAFETY: non-null out-pointer.
        unsafe { out(dev_ptr, ptr as *mut libc::c_void) };
        Ok(())
    })
}

/// `aclrtIpcMemClose`: in the process that exported `key`, ends the export (the key stops
/// working for later imports; open views stay valid); in a process that imported it, closes
/// its view (waiting for stream work using it).
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for NULL; `ACL_ERROR_RT_PARAM_INVALID` (107000)
/// for a key this process neither exported nor imported (or already closed).
#[no_mangle]
pub unsafe extern "C" fn aclrtIpcMemClose(key: *const libc::c_char) -> AclError {
    entry("aclrtIpcMemClose", || {
        let g = state::fast_global()?;
        // SAFETY: NULL or a NUL-terminated string (the caller's contract).
        let k = unsafe { key_arg(key) }?;
        Ok(g.rt.driver().acl_ipc_close_key(&k)?)
    })
}
