//! Level Zero memory (`zeMemAlloc*`, `zeMemFree`, properties, address ranges) and its
//! extensions (relaxed limits, compression hints, system-memory import). The rules are in the
//! semantics module of the same name; the calls are methods of [`crate::Context`].

pub use crate::semantics::usm::*;

use crate::api::runtime::{Context, Device};
use crate::error::Result;
use crate::semantics::usm::calls;

impl Context {
    /// Allocates device memory on `device` (`zeMemAllocDevice`). The address is aligned to
    /// `max(desc.alignment, page size)`, the page size being [`Context::query_page_size`] for
    /// the size; the rounded-up size is charged to the device's capacity (shared with physical
    /// memory). On the host backend device memory is host-accessible (a sealed memfd).
    ///
    /// Errors: `UnsupportedSize` for size 0, or over the device's `max_alloc_size` without
    /// `relaxed_max_size`, or over its whole capacity; `UnsupportedAlignment` unless the
    /// alignment is 0 or a power of two; `OutOfDeviceMemory` beyond the remaining capacity;
    /// `InvalidNullHandle` for a device of another driver; `OutOfHostMemory` if the OS refuses;
    /// for the chained options, `InvalidArgument` for a system-memory import (host only) and
    /// `UnsupportedFeature` for IPC handle types the backend cannot provide (none today:
    /// DEFAULT and FABRIC_ACCESSIBLE are both provided, within one machine).
    pub fn alloc_device(&self, device: &Device, desc: &AllocDesc) -> Result<usize> {
        calls::alloc_device(self.d(), self.id(), device.dref(), desc)
    }

    /// Allocates host memory reachable by every device (`zeMemAllocHost`). Alignment and page
    /// size as [`Context::alloc_device`]; no device capacity is charged.
    ///
    /// With [`AllocDesc::system_memory`] chained it imports that memory instead, as
    /// [`Context::import_system_memory`] (same errors).
    ///
    /// Errors: `UnsupportedSize` for size 0 or over device 0's `max_alloc_size` without
    /// `relaxed_max_size`; `UnsupportedAlignment`; `OutOfHostMemory` if the OS refuses;
    /// `UnsupportedFeature` for IPC handle types the backend cannot provide.
    pub fn alloc_host(&self, desc: &AllocDesc) -> Result<usize> {
        calls::alloc_host(self.d(), self.id(), desc)
    }

    /// Allocates shared memory, reachable from the host and every device (`zeMemAllocShared`),
    /// associated with and charged to `device` if given (no device: nothing charged, limits of
    /// device 0).
    ///
    /// Errors: as [`Context::alloc_device`].
    pub fn alloc_shared(&self, device: Option<&Device>, desc: &AllocDesc) -> Result<usize> {
        calls::alloc_shared(self.d(), self.id(), device.map(Device::dref), desc)
    }

    /// Imports system memory `[ptr, ptr+size)` (`zeMemAllocHost` with
    /// `ze_external_memmap_sysmem_ext_desc_t`; `read_only` is `ZE_HOST_MEM_ALLOC_FLAG_MEM_READ_ONLY`).
    /// Returns `ptr` itself. Heap, stack and static memory all work. Read-only memory needs
    /// `read_only`, and an import made with it is read-only for devices
    /// ([`AllocationProperties::read_only`]). [`Context::free_memory`] releases the record only;
    /// the memory and its contents stay.
    ///
    /// Errors: `UnsupportedSize` for size 0; `InvalidArgument` if `ptr` or `size` is not a
    /// multiple of the host (OS) page, the range is not wholly mapped readable memory, it is
    /// read-only and `read_only` is not set, or it overlaps a live import, allocation,
    /// virtual-memory reservation, IPC view opened in this process ([`Context::open_ipc_handle`])
    /// or managed allocation of this driver.
    pub fn import_system_memory(&self, ptr: usize, size: usize, read_only: bool) -> Result<usize> {
        calls::import_system_memory(self.d(), self.id(), ptr, size, read_only)
    }

    /// Frees an allocation or releases an import (`zeMemFree`, free now). `ptr` must be the
    /// base of a live allocation or import of this context. Device capacity comes back at once
    /// (while an IPC export of it is live, or a view of it open in this process: when the last
    /// of those is put or closed);
    /// if queued work still references the memory, the memory itself goes when that work
    /// finishes ([`crate::semantics::queue::FreePolicy::Immediate`]).
    ///
    /// Errors: `InvalidNullPointer` for null; `InvalidArgument` for anything else that is not
    /// such a base (interior or unknown pointers, other contexts' allocations).
    pub fn free_memory(&self, ptr: usize) -> Result<()> {
        // Free now, but never under queued work (see `FreePolicy::Immediate`).
        calls::free(self.d(), self.id(), ptr, crate::spec::FreePolicy::Immediate)
    }

    /// Properties of the memory at `ptr` (`zeMemGetAllocProperties`), for any pointer:
    /// inside a USM allocation or import, its type, id, page size, device and hint; inside a
    /// mapped page of a virtual-memory reservation, `Device` with the physical object's device
    /// (or `Host` for host physical memory), the physical object's id and page size (the
    /// reference driver of this era answers UNKNOWN there; the issue asks for the object's
    /// type); otherwise `Unknown` with id 0, page size 0, no device (the header's answer for
    /// unknown memory).
    ///
    /// Errors: `InvalidNullPointer` for null.
    pub fn get_allocation_properties(&self, ptr: usize) -> Result<AllocationProperties> {
        calls::allocation_properties(self.d(), ptr)
    }

    /// Base and size in bytes of the allocation, import or virtual-memory reservation that
    /// contains `ptr` (`zeMemGetAddressRange`); the size is the size asked at allocation.
    ///
    /// Errors: `InvalidNullPointer` for null; `Unknown` (`ZE_RESULT_ERROR_UNKNOWN`) for a
    /// pointer in none of them, as the reference driver answers.
    pub fn get_address_range(&self, ptr: usize) -> Result<(usize, usize)> {
        calls::address_range(self.d(), ptr)
    }
}
