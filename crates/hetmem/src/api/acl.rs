//! ACL calls that belong to no other family: the ACL argument rules
//! ([`crate::semantics::acl`], re-exported here: sizes, counts, flags, the physical memory
//! property, reservation alignment, which free takes which memory) and ACL shareable handles
//! (`aclrtMemExportToShareableHandle`, `aclrtMemSetPidToShareableHandle`,
//! `aclrtMemImportFromShareableHandle`), whose rules and records are in
//! `semantics::acl::shareable`, and ACL IPC keys (`aclrtIpcMemGetExportKey`,
//! `aclrtIpcMemSetImportPid`, `aclrtIpcMemImportByKey`, `aclrtIpcMemClose`), whose rules,
//! key format and tables are in `semantics::acl::ipc_key`. Both imports follow one pid
//! whitelist ([`check_import_pid`]).

pub use crate::semantics::acl::ipc_key::{
    check_export_flags as check_ipc_export_flags, check_export_range as check_ipc_export_range,
    check_import_flags as check_ipc_import_flags, IPC_EXPORT_FLAG_DISABLE_PID_VALIDATION,
    IPC_IMPORT_FLAG_ENABLE_PEER_ACCESS, KEY_LEN,
};
pub use crate::semantics::acl::{
    advice_location, check_attribute_count, check_count, check_export_flags, check_flags_zero,
    check_free_kind, check_nonzero, check_physical_prop, check_pid_count, check_reserve_alignment,
    check_vmm_size, ACL_VMM_GRANULARITY_BASIS, MAX_ATTRIBUTES, MAX_PIDS,
};
pub use crate::semantics::acl::{check_import_pid, own_pid};

use crate::error::Result;
use crate::semantics::acl::{ipc_key, shareable};
use crate::{Context, Device, Driver, PhysicalMemory};

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

    /// `aclrtIpcMemGetExportKey`: exports the device allocation starting at `ptr` (`size` bytes
    /// of it, 0 < `size` <= its size; the whole allocation is shared) and returns its key
    /// (`hmipc.<pid>.<n>`, without the NUL), which must fit `len` bytes with its NUL (at most
    /// [`KEY_LEN`]). A process of the same user opens it with [`Context::acl_ipc_import_key`]:
    /// this one, those [`Driver::acl_ipc_set_import_pids`] names, or any with `flags`
    /// `ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION` (1; else DEFAULT, 0). It lasts until
    /// [`Driver::acl_ipc_close_key`], [`Context::acl_ipc_forget_keys`] or this process's exit.
    ///
    /// Errors (nothing exported): `InvalidSize` (100000) for size 0 or a `len` too small;
    /// `InvalidEnumeration` (100000) for other flags; `InvalidArgument` (107000) for a pointer
    /// that is not the start of a device allocation or a size past its end; the errors of
    /// [`Context::get_ipc_handle`]; `OutOfHostMemory` if its record cannot be written.
    pub fn acl_ipc_export_key(
        &self,
        ptr: usize,
        size: usize,
        flags: u64,
        len: usize,
    ) -> Result<String> {
        ipc_key::export_key(self.d(), self.id(), ptr, size, flags, len)
    }

    /// `aclrtIpcMemImportByKey`: opens the memory `key` shares (exported by a process of this
    /// user, this one included) as a view in this context and returns its address (the
    /// exporter's bytes, as [`Context::open_ipc_handle`]). It stays valid until
    /// [`Driver::acl_ipc_close_key`] here, even after the exporter closes its key. `flags`:
    /// `ACL_RT_IPC_MEM_IMPORT_FLAG_DEFAULT` (0) or `_ENABLE_PEER_ACCESS` (1).
    ///
    /// Errors (nothing opened): `InvalidEnumeration` (100000) for other flags;
    /// `InvalidArgument` (107000) for a key that is not one, was closed or whose exporter is
    /// gone, a calling process not on the key's pid list, or a key already imported in this
    /// process; the errors of [`Context::open_ipc_handle`].
    pub fn acl_ipc_import_key(&self, key: &str, flags: u64) -> Result<usize> {
        ipc_key::import_key(self.d(), self.id(), key, flags)
    }

    /// Ends every key export and closes every key view made in this context (before the
    /// context goes: `aclrtResetDevice`, `aclrtDestroyContext`, `aclFinalize`). Never fails.
    pub fn acl_ipc_forget_keys(&self) {
        ipc_key::forget_context(self.d(), self.id())
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

    /// `aclrtIpcMemSetImportPid`: the processes (by pid) that may import `key`, exported by
    /// this process (without `DISABLE_PID_VALIDATION`) through this driver; replaces the
    /// previous list.
    ///
    /// Errors: `InvalidSize` (100000) for 0 or more than [`MAX_PIDS`] pids;
    /// `InvalidArgument` (107000) for a key this driver did not export (or closed);
    /// `OutOfHostMemory` if the record cannot be written.
    pub fn acl_ipc_set_import_pids(&self, key: &str, pids: &[i32]) -> Result<()> {
        ipc_key::set_import_pids(&self.shared, key, pids)
    }

    /// `aclrtIpcMemClose`: for a key this driver exported, ends the export (later imports are
    /// refused; open views stay valid); for one it imported, closes the view (waiting for
    /// queued work using it).
    ///
    /// Errors: `InvalidArgument` (107000) for a key this driver neither exported nor imported
    /// (or already closed); the errors of [`Context::close_ipc_handle`] (the view stays).
    pub fn acl_ipc_close_key(&self, key: &str) -> Result<()> {
        ipc_key::close_key(&self.shared, key)
    }
}
