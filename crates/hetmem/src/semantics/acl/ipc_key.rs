//! ACL IPC of device memory by key: the rules and this process's tables of
//! `aclrtIpcMemGetExportKey`, `aclrtIpcMemSetImportPid`, `aclrtIpcMemImportByKey` and
//! `aclrtIpcMemClose`.
//!
//! An export is a hetmem IPC handle of the whole allocation ([`crate::semantics::ipc::export`]
//! on an `aclrtMalloc` pointer); an import opens it as a view ([`crate::semantics::ipc::import`],
//! Level Zero's `zeMemOpenIpcHandle`), so the importer reads and writes the exporter's bytes.
//! The key is a NUL-terminated string `hmipc.<exporter pid>.<n>` (at most [`KEY_LEN`] bytes
//! with the NUL; `n` counts this process's keys from 1) naming a record of the exporter,
//! `hetmem-acl-ipckey.<pid>.<n>`, written and read as the shareable-handle records are
//! ([`crate::semantics::acl::shareable`]: the same format, the same safety: created fresh, never
//! through a link, mode 0600, read only when owned by our uid, gone at the exporter's exit). It
//! carries the export flags and the pid list of `aclrtIpcMemSetImportPid`: unless exported with
//! `ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION`, only the exporter and the listed pids
//! import ([`crate::semantics::acl::check_import_pid`], the rule shareable handles follow).
//! `aclrtIpcMemClose(key)` in the exporter ends the export (the record goes, the handle is put:
//! the key stops working; views already open stay valid until closed); in an importer it closes
//! that process's view of the key.
//!
//! The tables (exports and views by key, each entry tagged with its driver and context) are
//! process-wide, each behind its own lock, never held across another table's lock; the export
//! table's is held while its record is written, no driver lock is held under either.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;

use crate::error::{Addr, Error, Result};
use crate::semantics::acl::shareable::{read_record, remove_record, write_record};
use crate::semantics::acl::{check_import_pid, check_pid_count};
use crate::semantics::driver::DriverShared;
use crate::semantics::ipc::format::IpcHandle;
use crate::semantics::ipc::registry::{driver_id, own_pid};
use crate::semantics::ipc::{export, import};
use crate::spec::{IpcProperties, MemoryType};

/// `ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION`.
pub const IPC_EXPORT_FLAG_DISABLE_PID_VALIDATION: u64 = 0x1;
/// `ACL_RT_IPC_MEM_IMPORT_FLAG_ENABLE_PEER_ACCESS` (every device reaches a view here).
pub const IPC_IMPORT_FLAG_ENABLE_PEER_ACCESS: u64 = 0x1;
/// The longest key with its NUL.
pub const KEY_LEN: usize = 32;

#[derive(Debug)]
struct Export {
    driver: usize,
    context: u64,
    handle: IpcHandle,
    flags: u64,
    record: String,
}

#[derive(Debug)]
struct Import {
    driver: usize,
    context: u64,
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
///
/// Errors: `InvalidArgument` (107000) for a string that is not `hmipc.<pid>.<n>`.
fn parse_key(key: &str) -> Result<(u32, u32)> {
    let bad = || {
        Error::InvalidArgument(format!(
            "key {key:?} is not a key of aclrtIpcMemGetExportKey (hmipc.<pid>.<n>)"
        ))
    };
    let rest = key.strip_prefix("hmipc.").ok_or_else(bad)?;
    let (p, n) = rest.split_once('.').ok_or_else(bad)?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(p) || !digits(n) {
        return Err(bad());
    }
    Ok((p.parse().map_err(|_| bad())?, n.parse().map_err(|_| bad())?))
}

/// `flags` of `aclrtIpcMemGetExportKey`: `ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT` (0) or
/// `_DISABLE_PID_VALIDATION` (1); else `InvalidEnumeration` (100000).
pub fn check_export_flags(flags: u64) -> Result<()> {
    if flags > IPC_EXPORT_FLAG_DISABLE_PID_VALIDATION {
        return Err(Error::InvalidEnumeration(format!(
            "flags {flags:#x} are not ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT (0) or \
             DISABLE_PID_VALIDATION (1)"
        )));
    }
    Ok(())
}

/// `flags` of `aclrtIpcMemImportByKey`: `ACL_RT_IPC_MEM_IMPORT_FLAG_DEFAULT` (0) or
/// `_ENABLE_PEER_ACCESS` (1: every device reaches a view here already); else
/// `InvalidEnumeration` (100000).
pub fn check_import_flags(flags: u64) -> Result<()> {
    if flags > IPC_IMPORT_FLAG_ENABLE_PEER_ACCESS {
        return Err(Error::InvalidEnumeration(format!(
            "flags {flags:#x} are not ACL_RT_IPC_MEM_IMPORT_FLAG_DEFAULT (0) or \
             ENABLE_PEER_ACCESS (1)"
        )));
    }
    Ok(())
}

/// What `aclrtIpcMemGetExportKey(ptr, size)` shares: `ptr` must be the start of a device
/// allocation (`base`, `alloc_size` and `memory_type` of what contains it) and `size` within
/// it; the whole allocation is exported.
///
/// Errors: `InvalidArgument` (107000) naming the pointer or the size.
pub fn check_export_range(
    ptr: usize,
    size: usize,
    base: usize,
    alloc_size: usize,
    memory_type: MemoryType,
) -> Result<()> {
    if memory_type != MemoryType::Device || base != ptr {
        return Err(Error::InvalidArgument(format!(
            "{} is not the start of device memory of aclrtMalloc ({:?} memory at {})",
            Addr(ptr),
            memory_type,
            Addr(base)
        )));
    }
    if size > alloc_size {
        return Err(Error::InvalidArgument(format!(
            "size {size:#x} runs past the end of the allocation at {} ({alloc_size:#x} bytes)",
            Addr(ptr)
        )));
    }
    Ok(())
}

/// `aclrtIpcMemGetExportKey` in context `context` of driver `d`: exports the device allocation
/// starting at `ptr` (`size` bytes of it, 0 < `size` <= its size; the whole allocation is
/// shared) and returns its key (without the NUL), which must fit the caller's `len` bytes with
/// its NUL.
///
/// Errors (nothing exported): `InvalidSize` (100000) for size 0 or a `len` too small for the
/// key; `InvalidEnumeration` (100000) for other flags ([`check_export_flags`]);
/// `InvalidArgument` (107000) for a pointer that is not the start of a device allocation or a
/// size past its end ([`check_export_range`]); the errors of the IPC export; `OutOfHostMemory`
/// if the record cannot be written.
pub(crate) fn export_key(
    d: &DriverShared,
    context: u64,
    ptr: usize,
    size: usize,
    flags: u64,
    len: usize,
) -> Result<String> {
    crate::semantics::acl::check_nonzero(size, "size")?;
    check_export_flags(flags)?;
    let kind = crate::semantics::usm::calls::allocation_properties(d, ptr)?.memory_type;
    let (base, asize) = crate::semantics::usm::calls::address_range(d, ptr).unwrap_or((0, 0));
    check_export_range(ptr, size, base, asize, kind)?;
    let pid = own_pid();
    let n = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
    let key = format!("hmipc.{pid}.{n}");
    if key.len() + 1 > len {
        return Err(Error::InvalidSize(format!(
            "len {len} is too small for the key ({} bytes with its NUL; {KEY_LEN} suffice)",
            key.len() + 1
        )));
    }
    let handle = export::get(d, context, ptr, &IpcProperties::default())?;
    let record = key_record(pid, n);
    if let Err(e) = write_record(d, &record, flags, &handle, &[]) {
        let _ = import::put(d, &handle);
        return Err(e);
    }
    EXPORTS.lock().get_or_insert_with(HashMap::new).insert(
        key.clone(),
        Export {
            driver: driver_id(d),
            context,
            handle,
            flags,
            record,
        },
    );
    Ok(key)
}

/// `aclrtIpcMemSetImportPid` on driver `d`: the processes (by pid) that may import `key`
/// (exported by this process without DISABLE_PID_VALIDATION); replaces the previous list.
///
/// Errors: `InvalidSize` (100000) for 0 or more than [`crate::semantics::acl::MAX_PIDS`] pids;
/// `InvalidArgument` (107000) for a key this process (this driver) did not export or closed;
/// `OutOfHostMemory` if the record cannot be written.
pub(crate) fn set_import_pids(d: &DriverShared, key: &str, pids: &[i32]) -> Result<()> {
    check_pid_count(pids.len())?;
    let ex = EXPORTS.lock();
    let e = ex
        .as_ref()
        .and_then(|m| m.get(key))
        .filter(|e| e.driver == driver_id(d))
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "key {key:?} was not exported by this process (or it was closed)"
            ))
        })?;
    write_record(d, &e.record, e.flags, &e.handle, pids)
}

/// `aclrtIpcMemImportByKey` in context `context` of driver `d`: opens the memory `key` shares
/// (exported by another process or this one) and returns the view's address. It stays valid
/// until [`close_key`] here, even after the exporter closes its key.
///
/// Errors (nothing opened): `InvalidEnumeration` (100000) for other flags
/// ([`check_import_flags`]); `InvalidArgument` (107000) for a key that is not one, was closed
/// by its exporter or whose exporter is gone, a process not on the key's pid list
/// ([`crate::semantics::acl::check_import_pid`]), or a key already imported here; the errors of
/// the IPC open.
pub(crate) fn import_key(d: &DriverShared, context: u64, key: &str, flags: u64) -> Result<usize> {
    check_import_flags(flags)?;
    let (exporter, n) = parse_key(key)?;
    let again = || {
        Error::InvalidArgument(format!(
            "key {key:?} is already imported in this process (aclrtIpcMemClose it first)"
        ))
    };
    if IMPORTS.lock().as_ref().is_some_and(|m| m.contains_key(key)) {
        return Err(again());
    }
    let what = format!("key {key:?}");
    let (xflags, handle, pids) = read_record(d, &key_record(exporter, n), &what)?;
    check_import_pid(
        exporter,
        own_pid(),
        &pids,
        xflags & IPC_EXPORT_FLAG_DISABLE_PID_VALIDATION != 0,
        &what,
    )?;
    let ptr = import::open(d, context, &handle, 0)?;
    let mut im = IMPORTS.lock();
    let m = im.get_or_insert_with(HashMap::new);
    if m.contains_key(key) {
        // Another thread imported it meanwhile: keep one view.
        drop(im);
        let _ = import::close(d, context, ptr);
        return Err(again());
    }
    m.insert(
        key.to_string(),
        Import {
            driver: driver_id(d),
            context,
            ptr,
        },
    );
    Ok(ptr)
}

/// `aclrtIpcMemClose` on driver `d`: in the process that exported `key`, ends the export (the
/// key stops working for later imports; open views stay valid); in a process that imported it,
/// closes its view (waiting for queued work using it).
///
/// Errors: `InvalidArgument` (107000) for a key this process (this driver) neither exported nor
/// imported (or already closed); the errors of the IPC close (then the view stays).
pub(crate) fn close_key(d: &DriverShared, key: &str) -> Result<()> {
    let me = driver_id(d);
    let import = {
        let mut im = IMPORTS.lock();
        match im.as_mut() {
            Some(m) if m.get(key).is_some_and(|i| i.driver == me) => m.remove(key),
            _ => None,
        }
    };
    if let Some(i) = import {
        if let Err(e) = import::close(d, i.context, i.ptr) {
            IMPORTS
                .lock()
                .get_or_insert_with(HashMap::new)
                .insert(key.to_string(), i);
            return Err(e);
        }
        return Ok(());
    }
    let export = {
        let mut ex = EXPORTS.lock();
        match ex.as_mut() {
            Some(m) if m.get(key).is_some_and(|e| e.driver == me) => m.remove(key),
            _ => None,
        }
    };
    match export {
        Some(e) => {
            remove_record(d, &e.record);
            // A context destroyed meanwhile has put its exports already.
            let _ = import::put(d, &e.handle);
            Ok(())
        }
        None => Err(Error::InvalidArgument(format!(
            "key {key:?} is neither exported nor imported by this process (or was closed)"
        ))),
    }
}

/// Ends every key export and closes every key view of context `context` of driver `d` (the
/// context is going: `aclrtResetDevice`, `aclrtDestroyContext`, `aclFinalize`). Never fails.
pub(crate) fn forget_context(d: &DriverShared, context: u64) {
    let me = driver_id(d);
    let gone: Vec<Export> = {
        let mut ex = EXPORTS.lock();
        match ex.as_mut() {
            Some(m) => {
                let keys: Vec<String> = m
                    .iter()
                    .filter(|(_, e)| e.driver == me && e.context == context)
                    .map(|(k, _)| k.clone())
                    .collect();
                keys.iter().filter_map(|k| m.remove(k)).collect()
            }
            None => Vec::new(),
        }
    };
    for e in gone {
        remove_record(d, &e.record);
        let _ = import::put(d, &e.handle);
    }
    let closed: Vec<Import> = {
        let mut im = IMPORTS.lock();
        match im.as_mut() {
            Some(m) => {
                let keys: Vec<String> = m
                    .iter()
                    .filter(|(_, i)| i.driver == me && i.context == context)
                    .map(|(k, _)| k.clone())
                    .collect();
                keys.iter().filter_map(|k| m.remove(k)).collect()
            }
            None => Vec::new(),
        }
    };
    for i in closed {
        let _ = import::close(d, i.context, i.ptr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_parses_to_its_pid_and_number_and_anything_else_is_refused() {
        assert_eq!(parse_key("hmipc.12.7").unwrap(), (12, 7));
        for bad in [
            "",
            "hmipc.",
            "hmipc.12",
            "hmipc.12.",
            "hmipc.a.1",
            "xx.1.2",
            "hmipc.1.2.3",
        ] {
            let e = parse_key(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{bad:?}: {e:?}");
        }
        assert_eq!(key_record(5, 9), "hetmem-acl-ipckey.5.9");
    }

    #[test]
    fn the_flags_and_the_range_of_an_export_are_checked() {
        assert!(check_export_flags(1).is_ok());
        assert!(matches!(
            check_export_flags(2),
            Err(Error::InvalidEnumeration(_))
        ));
        assert!(check_import_flags(1).is_ok());
        assert!(matches!(
            check_import_flags(2),
            Err(Error::InvalidEnumeration(_))
        ));
        assert!(check_export_range(0x1000, 0x10, 0x1000, 0x20, MemoryType::Device).is_ok());
        for (p, s, b, t) in [
            (0x1010, 0x10, 0x1000, MemoryType::Device),
            (0x1000, 0x30, 0x1000, MemoryType::Device),
            (0x1000, 0x10, 0x1000, MemoryType::Host),
        ] {
            assert!(matches!(
                check_export_range(p, s, b, 0x20, t),
                Err(Error::InvalidArgument(_))
            ));
        }
    }
}
