//! IPC of device memory by key (`aclrtIpcMemGetExportKey`, `aclrtIpcMemSetImportPid`,
//! `aclrtIpcMemImportByKey`, `aclrtIpcMemClose`) and the process id other processes whitelist
//! (`aclrtDeviceGetBareTgid`).
//!
//! An export is a hetmem IPC handle of the whole allocation ([`hetmem::Context::get_ipc_handle`]
//! on an `aclrtMalloc` pointer); an import opens it as a view ([`hetmem::Context::open_ipc_handle`],
//! Level Zero's `zeMemOpenIpcHandle`), so the importer reads and writes the exporter's bytes.
//! The key is a NUL-terminated string `hmipc.<exporter pid>.<n>` (at most 32 bytes with the
//! NUL) naming a record of the exporter, `hetmem-acl-ipckey.<pid>.<n>`, written and read as
//! the shareable-handle records are ([`hetmem::Driver::acl_write_record`]: the same format, the
//! same safety: created fresh, never through a link, mode 0600, read only when owned by our
//! uid, gone at the exporter's exit). It carries
//! the export flags and the pid list of `aclrtIpcMemSetImportPid`: unless exported with
//! `ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION`, only the exporter and the listed pids
//! import ([`hetmem::acl_vmm::check_import_pid`]). `aclrtIpcMemClose(key)` in the exporter ends
//! the export (the file goes, the handle is put: the key stops working; views already open stay
//! valid until closed); in an importer it closes that process's view of the key.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::state::{self, Ctx};
use crate::{entry, null, out, AclError, Fail, Res};

/// `ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION`.
pub const IPC_EXPORT_FLAG_DISABLE_PID_VALIDATION: u64 = 0x1;
/// `ACL_RT_IPC_MEM_IMPORT_FLAG_ENABLE_PEER_ACCESS` (every device reaches a view here).
pub const IPC_IMPORT_FLAG_ENABLE_PEER_ACCESS: u64 = 0x1;
/// The longest key with its NUL.
pub const KEY_LEN: usize = 32;

#[derive(Debug)]
struct Export {
    ctx: Arc<Ctx>,
    handle: hetmem::IpcHandle,
    flags: u64,
    record: String,
}

#[derive(Debug)]
struct Import {
    ctx: Arc<Ctx>,
    ptr: usize,
}

/// Exports of this process by key.
static EXPORTS: Mutex<Option<HashMap<String, Export>>> = Mutex::new(None);
/// Views opened in this process by key.
static IMPORTS: Mutex<Option<HashMap<String, Import>>> = Mutex::new(None);
static NEXT_KEY: AtomicU32 = AtomicU32::new(1);

/// The name of the record of key `hmipc.<pid>.<n>`.
fn key_record(pid: u32, n: u32) -> String {
    format!("hetmem-acl-ipckey.{pid}.{n}")
}

/// `(exporter pid, n)` of a key string.
fn parse_key(key: &str) -> Res<(u32, u32)> {
    let bad = || -> Fail {
        hetmem::Error::InvalidArgument(format!(
            "key {key:?} is not a key of aclrtIpcMemGetExportKey (hmipc.<pid>.<n>)"
        ))
        .into()
    };
    let rest = key.strip_prefix("hmipc.").ok_or_else(bad)?;
    let (p, n) = rest.split_once('.').ok_or_else(bad)?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(p) || !digits(n) {
        return Err(bad());
    }
    Ok((p.parse().map_err(|_| bad())?, n.parse().map_err(|_| bad())?))
}

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
/// library check, `getpid()`). May be called before `aclInit`.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer.
#[no_mangle]
pub unsafe extern "C" fn aclrtDeviceGetBareTgid(pid: *mut i32) -> AclError {
    entry("aclrtDeviceGetBareTgid", || {
        if pid.is_null() {
            return Err(null("pid"));
        }
        // SAFETY: non-null out-pointer.
        unsafe { out(pid, hetmem::acl_vmm::own_pid() as i32) };
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
        hetmem::acl::check_nonzero(size, "size")?;
        hetmem::acl_vmm::check_ipc_export_flags(flags)?;
        let c = g.current()?;
        let p = dev_ptr as usize;
        let kind = c.ctx.get_allocation_properties(p)?.memory_type;
        let (base, asize) = c.ctx.get_address_range(p).unwrap_or((0, 0));
        hetmem::acl_vmm::check_ipc_export_range(p, size, base, asize, kind)?;
        let pid = hetmem::acl_vmm::own_pid();
        let n = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
        let k = format!("hmipc.{pid}.{n}");
        if k.len() + 1 > len {
            return Err(hetmem::Error::InvalidSize(format!(
                "len {len} is too small for the key ({} bytes with its NUL; {KEY_LEN} suffice)",
                k.len() + 1
            ))
            .into());
        }
        let h = c.ctx.get_ipc_handle(p)?;
        let record = key_record(pid, n);
        if let Err(e) = g.rt.driver().acl_write_record(&record, flags, &h, &[]) {
            let _ = c.ctx.put_ipc_handle(&h);
            return Err(e.into());
        }
        EXPORTS.lock().get_or_insert_with(HashMap::new).insert(
            k.clone(),
            Export {
                ctx: c,
                handle: h,
                flags,
                record,
            },
        );
        // SAFETY: `key` has room for `len` >= k.len() + 1 bytes (checked).
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
        // SAFETY: an array of `num` pids (the caller's contract).
        let pids = unsafe { std::slice::from_raw_parts(pid, num) };
        let ex = EXPORTS.lock();
        let e = ex.as_ref().and_then(|m| m.get(&k)).ok_or_else(|| {
            Fail::from(hetmem::Error::InvalidArgument(format!(
                "key {k:?} was not exported by this process (or it was closed)"
            )))
        })?;
        Ok(g.rt
            .driver()
            .acl_write_record(&e.record, e.flags, &e.handle, pids)?)
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
        hetmem::acl_vmm::check_ipc_import_flags(flags)?;
        let c = g.current()?;
        let (exporter, n) = parse_key(&k)?;
        if IMPORTS.lock().as_ref().is_some_and(|m| m.contains_key(&k)) {
            return Err(hetmem::Error::InvalidArgument(format!(
                "key {k:?} is already imported in this process (aclrtIpcMemClose it first)"
            ))
            .into());
        }
        let (xflags, h, pids) =
            g.rt.driver()
                .acl_read_record(&key_record(exporter, n), &format!("key {k:?}"))?;
        hetmem::acl_vmm::check_import_pid(
            exporter,
            hetmem::acl_vmm::own_pid(),
            &pids,
            xflags & IPC_EXPORT_FLAG_DISABLE_PID_VALIDATION != 0,
            &format!("key {k:?}"),
        )?;
        let ptr = c.ctx.open_ipc_handle(&h, 0)?;
        let mut im = IMPORTS.lock();
        let m = im.get_or_insert_with(HashMap::new);
        if m.contains_key(&k) {
            // Another thread imported it meanwhile: keep one view.
            drop(im);
            let _ = c.ctx.close_ipc_handle(ptr);
            return Err(hetmem::Error::InvalidArgument(format!(
                "key {k:?} is already imported in this process (aclrtIpcMemClose it first)"
            ))
            .into());
        }
        m.insert(k, Import { ctx: c, ptr });
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
        state::fast_global()?;
        // SAFETY: NULL or a NUL-terminated string (the caller's contract).
        let k = unsafe { key_arg(key) }?;
        let import = IMPORTS.lock().as_mut().and_then(|m| m.remove(&k));
        if let Some(i) = import {
            if let Err(e) = i.ctx.ctx.close_ipc_handle(i.ptr) {
                IMPORTS.lock().get_or_insert_with(HashMap::new).insert(k, i);
                return Err(e.into());
            }
            return Ok(());
        }
        let export = EXPORTS.lock().as_mut().and_then(|m| m.remove(&k));
        match export {
            Some(e) => {
                e.ctx.ctx.driver().acl_remove_record(&e.record);
                // A context destroyed meanwhile has put its exports already.
                let _ = e.ctx.ctx.put_ipc_handle(&e.handle);
                Ok(())
            }
            None => Err(hetmem::Error::InvalidArgument(format!(
                "key {k:?} is neither exported nor imported by this process (or was closed)"
            ))
            .into()),
        }
    })
}

/// Ends every export and import of the contexts in `handles` (their context is going:
/// `aclrtResetDevice`, `aclrtDestroyContext`, `aclFinalize`); `None`: all of them.
pub(crate) fn forget_contexts(handles: Option<&[usize]>) {
    let hit = |c: &Arc<Ctx>| handles.is_none_or(|h| h.contains(&c.handle));
    let gone: Vec<Export> = {
        let mut ex = EXPORTS.lock();
        match ex.as_mut() {
            Some(m) => {
                let keys: Vec<String> = m
                    .iter()
                    .filter(|(_, e)| hit(&e.ctx))
                    .map(|(k, _)| k.clone())
                    .collect();
                keys.iter().filter_map(|k| m.remove(k)).collect()
            }
            None => Vec::new(),
        }
    };
    for e in gone {
        e.ctx.ctx.driver().acl_remove_record(&e.record);
        let _ = e.ctx.ctx.put_ipc_handle(&e.handle);
    }
    let closed: Vec<Import> = {
        let mut im = IMPORTS.lock();
        match im.as_mut() {
            Some(m) => {
                let keys: Vec<String> = m
                    .iter()
                    .filter(|(_, i)| hit(&i.ctx))
                    .map(|(k, _)| k.clone())
                    .collect();
                keys.iter().filter_map(|k| m.remove(k)).collect()
            }
            None => Vec::new(),
        }
    };
    for i in closed {
        let _ = i.ctx.ctx.close_ipc_handle(i.ptr);
    }
}
