//! ACL calls that belong to no other family: the ACL argument rules
//! ([`crate::semantics::acl`], re-exported here: sizes, counts, flags, the physical memory
//! property, reservation alignment, which free takes which memory) and ACL shareable handles
//! (`aclrtMemExportToShareableHandle`, `aclrtMemSetPidToShareableHandle`,
//! `aclrtMemImportFromShareableHandle`), whose rules and records are in
//! `semantics::acl::shareable`.

pub use crate::semantics::acl::{
    advice_location, check_attribute_count, check_count, check_export_flags, check_flags_zero,
    check_free_kind, check_nonzero, check_physical_prop, check_pid_count, check_reserve_alignment,
    check_vmm_size, ACL_VMM_GRANULARITY_BASIS, MAX_ATTRIBUTES, MAX_PIDS,
};

use crate::error::Result;
use crate::semantics::acl::shareable;
use crate::{Context, Device, Driver, IpcHandle, PhysicalMemory};

/// The number of this process's shareable exports ([`Context::acl_export_shareable`]) that have
/// not ended: 0 once every exported handle was freed (a leak check).
pub fn live_shareable_exports() -> usize {
    shareable::live_exports()
}

impl Context {
    /// `aclrtMemExportToShareableHandle`: a shareable value (`u64`, `pid << 32 | n`) for
    /// physical memory object `mem` of this context, which a process of the same user imports
    /// with [`Context::acl_import_shareable`]. One export per object; it lasts until
    /// [`Context::acl_unexport_shareable`] (or this process's exit). `flags`:
    /// `ACL_RT_VMM_EXPORT_FLAG_DEFAULT` (0) or `DISABLE_PID_VALIDATION` (1: any process may
    /// import; otherwise only this one and those [`Driver::acl_set_shareable_pids`] names).
    ///
    /// Errors: `InvalidEnumeration` (100000) for other flags; `InvalidArgument` (107000) for an
    /// object already exported, or the errors of [`Context::get_physical_memory_ipc_handle`];
    /// `OutOfHostMemory` if its record cannot be written. Nothing changes on error.
    pub fn acl_export_shareable(&self, mem: PhysicalMemory, flags: u64) -> Result<u64> {
        shareable::export(self.d(), self.id(), mem, flags)
    }

    /// `aclrtMemImportFromShareableHandle`: the physical memory behind `shareable` (exported by
    /// any process of this user, this one included) as an object of this context on `device`,
    /// to map with [`Context::map`] and destroy with [`Context::destroy_physical_memory`]. It
    /// stays valid after the exporter frees its object or exits.
    ///
    /// Errors: `InvalidArgument` (107000) for a value that was never exported or whose export
    /// ended, a calling process not on the exporter's pid list, or an exporter that is gone;
    /// the errors of [`Context::import_physical_memory`].
    pub fn acl_import_shareable(&self, shareable: u64, device: &Device) -> Result<PhysicalMemory> {
        shareable::import(
            self.d(),
            self.id(),
            shareable,
            (&device.shared, device.ordinal()),
        )
    }

    /// Ends the export of `mem` made by [`Context::acl_export_shareable`], if any: its record
    /// goes and its IPC handle is put (importers keep what they imported). Never fails; nothing
    /// happens for an object that is not exported.
    pub fn acl_unexport_shareable(&self, mem: PhysicalMemory) {
        shareable::unexport(self.d(), mem)
    }
}

impl Driver {
    /// `aclrtMemSetPidToShareableHandle`: the processes (by pid) that may import `shareable`,
    /// exported by this process (without `DISABLE_PID_VALIDATION`); replaces the previous list.
    ///
    /// Errors: `InvalidSize` (100000) for 0 or more than [`MAX_PIDS`] pids;
    /// `InvalidArgument` (107000) for a value this process did not export (or whose export
    /// ended); `OutOfHostMemory` if the record cannot be written.
    pub fn acl_set_shareable_pids(&self, shareable: u64, pids: &[i32]) -> Result<()> {
        shareable::set_pids(&self.shared, shareable, pids)
    }

    /// Writes `(flags, handle, pids)` as this process's record `name` (the format of the
    /// shareable-handle records; ACL's IPC keys use it), read by processes of the same user
    /// with [`Driver::acl_read_record`]; it goes with [`Driver::acl_remove_record`] or at this
    /// process's exit.
    ///
    /// Errors: `OutOfHostMemory` naming the file if it cannot be written.
    pub fn acl_write_record(
        &self,
        name: &str,
        flags: u64,
        handle: &IpcHandle,
        pids: &[i32],
    ) -> Result<()> {
        shareable::write_record(&self.shared, name, flags, handle, pids)
    }

    /// `(flags, handle, pids)` of record `name` (written by a process of this user), for the
    /// import of `what`.
    ///
    /// Errors: `InvalidArgument` (107000), naming `what`, for a record that cannot be read
    /// (never written, removed, another user's) or is malformed.
    pub fn acl_read_record(&self, name: &str, what: &str) -> Result<(u64, IpcHandle, Vec<i32>)> {
        shareable::read_record(&self.shared, name, what)
    }

    /// Removes this process's record `name` (nothing if there is none).
    pub fn acl_remove_record(&self, name: &str) {
        shareable::remove_record(&self.shared, name)
    }
}
