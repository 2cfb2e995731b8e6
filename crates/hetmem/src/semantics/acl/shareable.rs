//! ACL shareable handles: the rules of `aclrtMemExportToShareableHandle`,
//! `aclrtMemSetPidToShareableHandle` and `aclrtMemImportFromShareableHandle` (one export per
//! physical memory object, the export flags, the pid whitelist), the exports of this process,
//! and the record format a shareable handle stands for.
//!
//! ACL's shareable handle is a `uint64_t` that another process imports. A hetmem IPC handle is
//! 64 bytes carrying a secret token, so it cannot travel inside 64 bits: the exporter writes it,
//! with the export flags and the pid whitelist, to a record of its own (the backend's
//! [`crate::backend::Backend::write_record`]: on Linux the file
//! `/dev/shm/hetmem-acl-shareable.<pid>.<n>`, mode 0600, so only processes of the same user read
//! it), and the `uint64_t` is `pid << 32 | n` (`n` counts this process's exports from 1). The
//! importer reads the record and opens the handle through hetmem's IPC transport (the exporter's
//! broker checks the token). The record goes when the export ends ([`unexport`]: the C library
//! calls it at `aclrtFreePhysical` of the exported handle, `aclrtResetDevice` /
//! `aclrtDestroyContext` of its context and `aclFinalize`) and at the exporter's exit. Unless
//! exported with `ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION`, only the exporter and the
//! processes `aclrtMemSetPidToShareableHandle` names may import. The pid list is honoured by
//! this import; it is not a security boundary against another process of the same user (the
//! record and hetmem's IPC broker admit any process of the exporter's uid, which is the
//! boundary).
//!
//! Record layout (little endian): magic `HMACLSH1` (8 bytes), flags (`u64`), the IPC handle
//! (64 bytes), the pid count (`u32`), the pids (`i32` each).
//!
//! The exports of this process are one table behind one lock, taken before any driver lock
//! (an export asks the IPC layer for its handle while holding it) and never inside one.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::semantics::acl::{check_export_flags, check_import_pid, check_pid_count, own_pid};
use crate::semantics::driver::DriverShared;
use crate::semantics::ipc::export::physical as export_physical;
use crate::semantics::ipc::format::IpcHandle;
use crate::semantics::ipc::import::{import_physical, put};
use crate::semantics::vmm::PhysicalMemory;
use crate::spec::ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION;

const RECORD_MAGIC: &[u8; 8] = b"HMACLSH1";
/// Bytes of a record before its pids.
const RECORD_HEAD: usize = 8 + 8 + 64 + 4;

/// One export: the physical memory object and the IPC handle it was exported with.
#[derive(Debug)]
struct Export {
    mem: u64,
    handle: IpcHandle,
    flags: u64,
}

/// The exports of this process, by shareable value and by physical memory object.
#[derive(Debug)]
struct Exports {
    by_value: BTreeMap<u64, Export>,
    by_mem: BTreeMap<u64, u64>,
}

static EXPORTS: Mutex<Exports> = Mutex::new(Exports {
    by_value: BTreeMap::new(),
    by_mem: BTreeMap::new(),
});
/// The `n` of the next shareable value (`pid << 32 | n`), from 1.
static NEXT: AtomicU32 = AtomicU32::new(1);

/// The number of shareable exports of this process that have not ended.
pub(crate) fn live_exports() -> usize {
    EXPORTS.lock().by_value.len()
}

/// The name of shareable handle `shareable`'s record: `hetmem-acl-shareable.<pid>.<n>`.
pub(crate) fn record_name(shareable: u64) -> String {
    format!(
        "hetmem-acl-shareable.{}.{}",
        shareable >> 32,
        shareable & 0xffff_ffff
    )
}

/// The record of an export (see the module docs for the layout).
pub(crate) fn encode(flags: u64, handle: &IpcHandle, pids: &[i32]) -> Vec<u8> {
    let mut b = Vec::with_capacity(RECORD_HEAD + 4 * pids.len());
    b.extend_from_slice(RECORD_MAGIC);
    b.extend_from_slice(&flags.to_le_bytes());
    b.extend_from_slice(handle.as_bytes());
    b.extend_from_slice(&(pids.len() as u32).to_le_bytes());
    for p in pids {
        b.extend_from_slice(&p.to_le_bytes());
    }
    b
}

/// `(flags, handle, pids)` of record `b` of `name`; `Err` says what is wrong with it.
pub(crate) fn decode(
    name: &str,
    b: &[u8],
) -> std::result::Result<(u64, IpcHandle, Vec<i32>), String> {
    if b.len() < RECORD_HEAD || &b[..8] != RECORD_MAGIC {
        return Err(format!("{name} is not a shareable handle file"));
    }
    let flags = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
    let mut raw = [0u8; 64];
    raw.copy_from_slice(&b[16..80]);
    let n = u32::from_le_bytes(b[80..84].try_into().expect("4 bytes")) as usize;
    if b.len() != RECORD_HEAD + 4 * n {
        return Err(format!("{name} is truncated"));
    }
    let pids = b[RECORD_HEAD..]
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    Ok((flags, IpcHandle::from_bytes(raw), pids))
}

/// Writes record `name` (see the module docs for the layout): this process's, read by
/// processes of its user, gone when removed or at this process's exit. ACL's IPC keys
/// (`aclrtIpcMemGetExportKey`) are records of the same format under their own names.
///
/// Errors: `OutOfHostMemory` naming the file if it cannot be written (the backend's error,
/// converted).
pub(crate) fn write_record(
    d: &DriverShared,
    name: &str,
    flags: u64,
    handle: &IpcHandle,
    pids: &[i32],
) -> Result<()> {
    d.backend
        .write_record(name, &encode(flags, handle, pids))
        .map_err(Error::from)
}

/// `(flags, handle, pids)` of record `name`, for the import of `what` (named in the errors).
///
/// Errors: `InvalidArgument` (107000) for a record that cannot be read (never written,
/// removed, another user's) or is malformed.
pub(crate) fn read_record(
    d: &DriverShared,
    name: &str,
    what: &str,
) -> Result<(u64, IpcHandle, Vec<i32>)> {
    let bad = |why: String| Error::InvalidArgument(format!("{what} cannot be imported: {why}"));
    let b = d.backend.read_record(name).map_err(|e| {
        bad(format!(
            "{e} (not exported, or its physical memory was freed)"
        ))
    })?;
    decode(name, &b).map_err(bad)
}

/// Removes record `name` of this process (nothing if there is none).
pub(crate) fn remove_record(d: &DriverShared, name: &str) {
    d.backend.remove_record(name)
}

fn write(
    d: &DriverShared,
    shareable: u64,
    flags: u64,
    handle: &IpcHandle,
    pids: &[i32],
) -> Result<()> {
    write_record(d, &record_name(shareable), flags, handle, pids)
}

/// `aclrtMemExportToShareableHandle`: exports physical memory object `mem` of context
/// `context` (its IPC handle made by `zeMemGetIpcHandle`'s rules for physical memory,
/// [`crate::semantics::ipc::export::physical`]) as a shareable value (`pid << 32 | n`), with
/// `flags` `ACL_RT_VMM_EXPORT_FLAG_DEFAULT` (0) or `DISABLE_PID_VALIDATION` (1) and an empty
/// pid list.
///
/// Errors: `InvalidEnumeration` (100000) for other flags ([`check_export_flags`]);
/// `InvalidArgument` (107000) for an object already exported (one shareable handle per
/// object), naming the value it has, or not of this context; `OutOfHostMemory` if the record
/// cannot be written. Nothing changes on error.
pub(crate) fn export(
    d: &DriverShared,
    context: u64,
    mem: PhysicalMemory,
    flags: u64,
) -> Result<u64> {
    check_export_flags(flags)?;
    let mut ex = EXPORTS.lock();
    if let Some(s) = ex.by_mem.get(&mem.id) {
        return Err(Error::InvalidArgument(format!(
            "physical memory object {} is already exported as {s:#x} (one shareable handle per \
             handle)",
            mem.id
        )));
    }
    let handle = export_physical(d, context, mem.id, None)?;
    let s = (own_pid() as u64) << 32 | NEXT.fetch_add(1, Ordering::Relaxed) as u64;
    if let Err(e) = write(d, s, flags, &handle, &[]) {
        let _ = put(d, &handle);
        return Err(e);
    }
    ex.by_mem.insert(mem.id, s);
    ex.by_value.insert(
        s,
        Export {
            mem: mem.id,
            handle,
            flags,
        },
    );
    Ok(s)
}

/// `aclrtMemSetPidToShareableHandle`: the processes (by pid) that may import `shareable`
/// (exported by this process); replaces the previous list.
///
/// Errors: `InvalidSize` (100000) for an empty list or one of more than
/// [`crate::semantics::acl::MAX_PIDS`]; `InvalidArgument` (107000) for a value this process did
/// not export (or whose export ended); `OutOfHostMemory` if the record cannot be written.
pub(crate) fn set_pids(d: &DriverShared, shareable: u64, pids: &[i32]) -> Result<()> {
    check_pid_count(pids.len())?;
    let ex = EXPORTS.lock();
    let e = ex.by_value.get(&shareable).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "shareable handle {shareable:#x} was not exported by this process (or its export \
             ended)"
        ))
    })?;
    write(d, shareable, e.flags, &e.handle, pids)
}

/// `aclrtMemImportFromShareableHandle`: the physical memory behind `shareable` as an object of
/// context `context` on `device` ([`crate::semantics::ipc::import::import_physical`]), once the
/// calling process is found allowed to import it ([`check_import_pid`]: the exporter itself,
/// a process on its pid list, or anyone for an export without pid validation).
///
/// Errors: `InvalidArgument` (107000) for a value whose record cannot be read (never exported,
/// its export ended, another user's) or is malformed, or a process not on the pid list; the
/// errors of the physical import.
pub(crate) fn import(
    d: &DriverShared,
    context: u64,
    shareable: u64,
    device: (&DriverShared, u32),
) -> Result<PhysicalMemory> {
    let (flags, handle, pids) = read_record(
        d,
        &record_name(shareable),
        &format!("shareable handle {shareable:#x}"),
    )?;
    check_import_pid(
        (shareable >> 32) as u32,
        own_pid(),
        &pids,
        flags & ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION != 0,
        &format!("shareable handle {shareable:#x}"),
    )?;
    import_physical(d, context, &handle, device)
}

/// Ends the export of `mem`, if any: its record goes and its IPC handle
/// is put (importers keep what they imported). Never fails.
pub(crate) fn unexport(d: &DriverShared, mem: PhysicalMemory) {
    let e = {
        let mut ex = EXPORTS.lock();
        let Some(s) = ex.by_mem.remove(&mem.id) else {
            return;
        };
        ex.by_value.remove(&s).map(|e| (s, e))
    };
    if let Some((s, e)) = e {
        debug_assert_eq!(e.mem, mem.id);
        remove_record(d, &record_name(s));
        let _ = put(d, &e.handle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_decodes_to_what_was_encoded_and_a_damaged_one_is_refused() {
        let h = IpcHandle::from_bytes([7; 64]);
        let b = encode(1, &h, &[3, -4]);
        let (f, h2, pids) = decode("r", &b).unwrap();
        assert_eq!((f, h2.as_bytes(), pids), (1, h.as_bytes(), vec![3, -4]));
        assert!(decode("r", &b[..b.len() - 1])
            .unwrap_err()
            .contains("truncated"));
        let mut bad = b.clone();
        bad[0] = b'X';
        assert!(decode("r", &bad)
            .unwrap_err()
            .contains("not a shareable handle file"));
        assert_eq!(record_name(5 << 32 | 9), "hetmem-acl-shareable.5.9");
    }
}
