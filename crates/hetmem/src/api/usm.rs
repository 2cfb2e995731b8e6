//! Level Zero memory (`zeMemAlloc*`, `zeMemFree`, properties, address ranges) and its
//! extensions (relaxed limits, compression hints, system-memory import). The rules are in the
//! semantics module of the same name; the calls are methods of [`crate::Context`].

pub use crate::semantics::usm::*;

use crate::api::runtime::{Context, Device};
use crate::backend::AllocLocation;
use crate::error::{Error, Result};

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
    /// `UnsupportedFeature` for IPC handle types the backend cannot provide (FABRIC_ACCESSIBLE).
    pub fn alloc_device(&self, device: &Device, desc: &AllocDesc) -> Result<usize> {
        self.check_device(device)?;
        self.alloc(AllocLocation::Device(device.ordinal()), desc)
    }

    /// One allocation with every option `desc` chains: the chain is checked
    /// ([`check_chain`], then the IPC handle types) before anything is made; a system-memory
    /// import goes to [`Context::import_system_memory`]; handle types are recorded under the
    /// same hold of the USM lock as the allocation, so no get can see it without them.
    fn alloc(&self, location: AllocLocation, desc: &AllocDesc) -> Result<usize> {
        check_chain(location, desc)?;
        if let Some(t) = desc.ipc_types {
            crate::semantics::ipc::check_new_handle_types(t)?;
        }
        let d = self.d();
        if let Some(ptr) = desc.system_memory {
            let p = self.import_system_memory(ptr, desc.size, desc.read_only)?;
            if let Some(t) = desc.ipc_types {
                d.usm.write().set_ipc_types(self.id(), p, t);
            }
            return Ok(p);
        }
        let mut usm = d.usm.write();
        let p = usm.alloc(d.backend.as_ref(), self.id(), location, desc)?;
        if let Some(t) = desc.ipc_types {
            usm.set_ipc_types(self.id(), p, t);
        }
        Ok(p)
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
        self.alloc(AllocLocation::Host, desc)
    }

    /// Allocates shared memory, reachable from the host and every device (`zeMemAllocShared`),
    /// associated with and charged to `device` if given (no device: nothing charged, limits of
    /// device 0).
    ///
    /// Errors: as [`Context::alloc_device`].
    pub fn alloc_shared(&self, device: Option<&Device>, desc: &AllocDesc) -> Result<usize> {
        if let Some(dev) = device {
            self.check_device(dev)?;
        }
        self.alloc(AllocLocation::Shared(device.map(|x| x.ordinal())), desc)
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
        let d = self.d();
        // The managed lock is never held with usm or vm: ask first.
        let managed = ptr
            .checked_add(size)
            .and_then(|end| d.managed.overlapping(ptr, end));
        let mut usm = d.usm.write();
        // Lock order: usm, then vm, then the IPC view table.
        usm.import(
            d.backend.as_ref(),
            self.id(),
            ptr,
            size,
            read_only,
            |s, e| {
                let range = |(a, b): (usize, usize)| {
                    format!("[{}, {})", crate::error::Addr(a), crate::error::Addr(b))
                };
                if let Some(m) = managed {
                    Some(format!("the managed allocation {}", range(m)))
                } else if d.vm.read().reservation_overlaps(s, e) {
                    Some("a virtual-memory reservation".into())
                } else {
                    crate::semantics::ipc::view_overlapping(s, e)
                        .map(|v| format!("the opened IPC view {}", range(v)))
                }
            },
        )
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
        self.free_memory_ext(ptr, crate::semantics::queue::FreePolicy::Immediate)
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
        if ptr == 0 {
            return Err(Error::InvalidNullPointer("pointer is null".into()));
        }
        let d = self.d();
        if let Some(p) = d.usm.read().properties(ptr) {
            return Ok(p);
        }
        if let Some(p) = crate::semantics::ipc::opened_properties(ptr) {
            return Ok(p);
        }
        let vm = d.vm.read().pointer_info(ptr);
        Ok(match vm.and_then(|v| v.mapped) {
            Some((id, loc, page_size)) => {
                let (memory_type, device) = match loc {
                    crate::backend::PhysicalLocation::Device(dev) => {
                        (MemoryType::Device, Some(dev))
                    }
                    crate::backend::PhysicalLocation::Host => (MemoryType::Host, None),
                };
                AllocationProperties {
                    memory_type,
                    id,
                    page_size,
                    device,
                    ..AllocationProperties::default()
                }
            }
            None => AllocationProperties::default(),
        })
    }

    /// Base and size in bytes of the allocation, import or virtual-memory reservation that
    /// contains `ptr` (`zeMemGetAddressRange`); the size is the size asked at allocation.
    ///
    /// Errors: `InvalidNullPointer` for null; `Unknown` (`ZE_RESULT_ERROR_UNKNOWN`) for a
    /// pointer in none of them, as the reference driver answers.
    pub fn get_address_range(&self, ptr: usize) -> Result<(usize, usize)> {
        if ptr == 0 {
            return Err(Error::InvalidNullPointer("pointer is null".into()));
        }
        let d = self.d();
        if let Some(r) = d.usm.read().address_range(ptr) {
            return Ok(r);
        }
        if let Some(r) = crate::semantics::ipc::opened_range(ptr) {
            return Ok(r);
        }
        d.vm.read()
            .pointer_info(ptr)
            .map(|v| v.reservation)
            .ok_or_else(|| {
                Error::Unknown(format!(
                    "{} is not inside an allocation, import or reservation",
                    crate::error::Addr(ptr)
                ))
            })
    }
}
