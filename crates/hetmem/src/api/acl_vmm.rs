//! The ACL virtual-memory calls Level Zero has no counterpart for, as methods of
//! [`crate::Context`]: one call each onto `crate::semantics::acl_vmm`, where the rules are.

use crate::api::runtime::Context;
use crate::error::Result;
use crate::semantics::acl_vmm::{self, AccessDesc};
use crate::semantics::vmm::PhysicalMemory;

impl Context {
    /// `aclrtMemSetAccess`: sets the access `descs` ask (one access for every device: see
    /// `hetmem::acl_vmm`) on the mapped pages of `[ptr, ptr+size)`, by the rules of
    /// [`Context::set_access_attribute`] (`zeVirtualMemSetAccessAttribute`: page-aligned range
    /// inside one reservation; waits for queued work using the reservation).
    ///
    /// Errors: those of [`acl_vmm::access_of_descs`] (nothing changes), then those of
    /// [`Context::set_access_attribute`].
    pub fn acl_set_access(&self, ptr: usize, size: usize, descs: &[AccessDesc]) -> Result<()> {
        acl_vmm::set_access(self.d(), self.id(), ptr, size, descs)
    }

    /// `aclrtMemGetAccess`: the `aclrtMemAccessFlags` of the page at `ptr` for device
    /// `location_id` (every device has the page's one access), by the rules of
    /// [`Context::get_access_attribute`] over one base page (`query_page_size(1)`) from `ptr`
    /// rounded down to it.
    ///
    /// Errors: those of [`acl_vmm::check_location`]; those of
    /// [`Context::get_access_attribute`] (an address in no reservation).
    pub fn acl_get_access(&self, ptr: usize, location_type: u32, location_id: u32) -> Result<u32> {
        acl_vmm::get_access(self.d(), self.id(), ptr, location_type, location_id)
    }

    /// `aclrtMemRetainAllocationHandle`: the physical object mapped at `ptr` (a mapped page of
    /// any reservation of the driver), as made or imported; the caller keeps its own count of
    /// retains.
    ///
    /// Errors: `InvalidNullPointer` for 0; `InvalidArgument` for an address in no reservation
    /// or in an unmapped page.
    pub fn physical_memory_at(&self, ptr: usize) -> Result<PhysicalMemory> {
        acl_vmm::physical_memory_at(self.d(), ptr)
    }
}
