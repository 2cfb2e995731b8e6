//! Level Zero virtual memory (`zeVirtualMem*`, `zePhysicalMem*`): reservations, physical
//! memory, mappings, access attributes. The rules are in the semantics module of the same name;
//! the calls are methods of [`crate::Context`].

pub use crate::semantics::vmm::*;

use crate::api::runtime::{Context, Device};
use crate::error::Result;
use crate::semantics::vmm::calls;

impl Context {
    /// Reserves `size` bytes of virtual address space (`zeVirtualMemReserve`).
    ///
    /// `start_hint`: where to try first; used when page-aligned and free, otherwise another
    /// address is chosen (an existing mapping of the process is never replaced). The result is
    /// aligned to [`Context::query_page_size`]`(size)`, and its pages are inaccessible (NONE).
    ///
    /// Errors: `UnsupportedSize` if `size` is 0 or not a multiple of the page size for `size`;
    /// `OutOfHostMemory` if the address space (or `vm.max_map_count`) is exhausted.
    pub fn reserve(&self, start_hint: Option<usize>, size: usize) -> Result<Reservation> {
        calls::reserve(self.d(), self.id(), start_hint, size)
    }

    /// Frees a reservation (`zeVirtualMemFree`): unmaps whatever is mapped in it (the physical
    /// objects survive) and releases the range. Blocks until no queued or running command
    /// references the reservation (see "Virtual memory and IPC views in flight" in
    /// [`crate::queue`]).
    ///
    /// Errors: `InvalidNullPointer` for null; `UnsupportedSize` for 0; `InvalidArgument` unless
    /// `(ptr, size)` is exactly the base and size of a live reservation of this context.
    pub fn free(&self, ptr: usize, size: usize) -> Result<()> {
        calls::free(self.d(), self.id(), ptr, size)
    }

    /// Frees `r` (see [`Context::free`]).
    pub fn free_reservation(&self, r: Reservation) -> Result<()> {
        self.free(r.base, r.size)
    }

    /// The page size for aligning reservations and physical memory of `size` bytes on `device`
    /// (`zeVirtualMemQueryPageSize`): 64 KiB below 2 MiB, 2 MiB from 2 MiB up, never below the
    /// device's granularity (a multiple of the OS page size).
    ///
    /// Size 0 answers the smallest allocation's page size (the reference driver; the header
    /// lists `UnsupportedSize`, see [`crate::semantics::vmm`]).
    ///
    /// Errors: `InvalidNullHandle` for a device of another driver.
    pub fn query_page_size(&self, device: &Device, size: usize) -> Result<usize> {
        calls::query_page_size(self.d(), device.dref(), size)
    }

    /// The granularity of ACL virtual memory on `device` (`aclrtMemGetAllocationGranularity`,
    /// MINIMUM and RECOMMENDED alike): the page size for 2 MiB (2 MiB on the host backend).
    /// Reservations, physical memory and mappings of the ACL calls are multiples of it
    /// ([`crate::acl::check_vmm_size`]), so the size it reports is the size that is accepted.
    ///
    /// Errors: `InvalidNullHandle` for a device of another driver.
    pub fn acl_granularity(&self, device: &Device) -> Result<usize> {
        self.query_page_size(device, crate::acl::ACL_VMM_GRANULARITY_BASIS)
    }

    /// Creates a physical memory object of `size` bytes (`zePhysicalMemCreate`) on `device`
    /// (`AllocateOnDevice`, counted against its capacity) or in host memory (`AllocateOnHost`,
    /// device optional).
    ///
    /// Errors: `UnsupportedSize` if `size` is 0 or not a multiple of the page size for `size`;
    /// `InvalidNullHandle` for device memory without a device; `OutOfDeviceMemory` beyond the
    /// device's remaining capacity; `OutOfHostMemory` if the OS refuses (open-file limit).
    pub fn create_physical_memory(
        &self,
        device: Option<&Device>,
        flags: PhysicalMemoryFlags,
        size: usize,
    ) -> Result<PhysicalMemory> {
        calls::create_physical(self.d(), self.id(), device.map(Device::dref), flags, size)
    }

    /// Destroys a physical memory object (`zePhysicalMemDestroy`). Its device capacity comes
    /// back at once, or, while an IPC export of it is live (or a view of it open in this
    /// process), when the last of those is put or closed.
    ///
    /// Errors: `HandleObjectInUse` while any page of it is mapped (nothing changes);
    /// `InvalidArgument` for a handle that is not live in this context.
    pub fn destroy_physical_memory(&self, phys: PhysicalMemory) -> Result<()> {
        calls::destroy_physical(self.d(), self.id(), phys.id)
    }

    /// The properties of a physical memory object of this context
    /// (`zePhysicalMemGetProperties`): its id and size.
    ///
    /// Errors: `InvalidArgument` for an object that is not live in this context (destroyed,
    /// or made in another context).
    pub fn physical_memory_properties(&self, phys: &PhysicalMemory) -> Result<PhysicalMemory> {
        calls::physical_properties(self.d(), self.id(), phys.id)
    }

    /// Maps `[offset, offset+size)` of `phys` at `ptr` with `access` (`zeVirtualMemMap`).
    /// One physical object may be mapped at several addresses at once; aliases share bytes.
    ///
    /// Errors: `InvalidNullPointer` for null `ptr`; `UnsupportedSize` if `size` is 0 or not a
    /// multiple of the page size for `size`; `UnsupportedAlignment` if `ptr` or `offset` is not
    /// aligned to it; `InvalidArgument` if the range is not inside one reservation of this
    /// context, overlaps a mapping, or `offset+size` is past the end of `phys`.
    pub fn map(
        &self,
        ptr: usize,
        size: usize,
        phys: PhysicalMemory,
        offset: usize,
        access: AccessAttribute,
    ) -> Result<()> {
        calls::map(self.d(), self.id(), ptr, size, phys.id, offset, access)
    }

    /// Unmaps `[ptr, ptr+size)` (`zeVirtualMemUnmap`): the mapped pages of any
    /// base-page-aligned range inside one reservation; pages of it not mapped stay so (nothing
    /// mapped: success, nothing changes). The pages revert to NONE and stay reserved. Blocks until no queued or
    /// running command references the reservation (see [`crate::queue`]).
    ///
    /// Errors: `UnsupportedAlignment` / `UnsupportedSize` if `ptr` / `size` is not a multiple of
    /// the base page (`query_page_size(1)`); `InvalidArgument` if the range is outside one
    /// reservation.
    pub fn unmap(&self, ptr: usize, size: usize) -> Result<()> {
        calls::unmap(self.d(), self.id(), ptr, size)
    }

    /// Sets the access attribute of the mapped pages of `[ptr, ptr+size)`
    /// (`zeVirtualMemSetAccessAttribute`). Per page: a sub-range of a mapping can differ from the
    /// rest. READONLY faults on write and NONE on any access. Unmapped pages of the range have no
    /// memory and stay NONE. Blocks, as [`Context::unmap`] does, until no queued or running
    /// command references the reservation.
    ///
    /// Errors: as [`Context::unmap`] for alignment and range.
    pub fn set_access_attribute(
        &self,
        ptr: usize,
        size: usize,
        access: AccessAttribute,
    ) -> Result<()> {
        calls::set_access(self.d(), self.id(), ptr, size, access)
    }

    /// The access attribute of the page at `ptr`, and the length in bytes from `ptr` (capped at
    /// `size`) of pages that share it (`zeVirtualMemGetAccessAttribute`). Unmapped pages read
    /// NONE.
    ///
    /// Errors: as [`Context::unmap`] for alignment and range.
    pub fn get_access_attribute(
        &self,
        ptr: usize,
        size: usize,
    ) -> Result<(AccessAttribute, usize)> {
        calls::get_access(self.d(), self.id(), ptr, size)
    }
}
