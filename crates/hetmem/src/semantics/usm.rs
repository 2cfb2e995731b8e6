//! Level Zero unified shared memory (USM): the semantics layer.
//!
//! Spec: oneAPI Level Zero 1.18 core "Memory" (`zeMemAllocHost`, `zeMemAllocDevice`,
//! `zeMemAllocShared`, `zeMemFree`, `zeMemGetAllocProperties`, `zeMemGetAddressRange`) and the
//! memory extensions (`ze_relaxed_allocation_limits_ext_desc_t` and its experimental form,
//! `ze_memory_compression_hints_ext_desc_t`, `ze_external_memmap_sysmem_ext_desc_t`).
//!
//! Every rule lives here once; the backend only allocates, frees and answers raw questions.
//!
//! # Allocation rules
//! - size 0 -> `UnsupportedSize`; alignment must be 0 or a power of two, else
//!   `UnsupportedAlignment` (`ze_libapi.cpp`: "`0 != alignment && ...`");
//! - size over the device's `max_alloc_size` (host allocations: device 0's, as the reference
//!   driver does) -> `UnsupportedSize`, unless relaxed limits with MAX_SIZE are chained; even
//!   then a device / shared allocation over the device's whole capacity is `UnsupportedSize`
//!   (reference driver, `ContextImp::allocDeviceMem`);
//! - device and shared allocations (with a device) are charged to that device's capacity, the
//!   same counter physical memory uses (module `capacity`), rounded up to the allocation's
//!   page size; beyond it -> `OutOfDeviceMemory`. Host allocations the OS refuses ->
//!   `OutOfHostMemory`.
//! - the address is aligned to `max(alignment, page size)`; the page size of an allocation is
//!   the page-size query's answer for its size ([`crate::vmm::page_size_for`]).
//!
//! # Free and queries
//! - `zeMemFree` needs the base of a live allocation or import of the calling context; anything
//!   else (interior pointer, unknown pointer, a virtual-memory reservation) -> `InvalidArgument`
//!   (the reference driver's `ContextImp::freeMem`). Null -> `InvalidNullPointer`.
//! - `zeMemGetAllocProperties` never fails for a non-null pointer: an unknown pointer reports
//!   `MemoryType::Unknown` with id 0 (the header: "UNKNOWN: the memory pointed to is of unknown
//!   type"; reference driver answers UNKNOWN and success). Lookups are driver-wide, as the
//!   reference driver's `svmAllocsManager` is.
//! - `zeMemGetAddressRange` of an unknown pointer -> `Unknown` (`ZE_RESULT_ERROR_UNKNOWN`, as
//!   the reference driver's `ContextImp::getMemAddressRange` returns).
//!
//! # Import of system memory (`ze_external_memmap_sysmem_ext_desc_t`)
//! Pointer and size must be multiples of the host page size (the OS page), else
//! `InvalidArgument`; every byte must be mapped and readable, else `InvalidArgument`; read-only
//! memory needs the read-only flag, else `InvalidArgument`, and is then recorded read-only
//! (devices may only read it). An import that overlaps a live import, a USM allocation or a
//! virtual-memory reservation is `InvalidArgument` (the spec leaves it undefined). The returned
//! pointer is the system pointer; freeing releases only the record.

// `usize::is_multiple_of` is stable from Rust 1.87; the workspace's rust-version is 1.85.
#![allow(clippy::manual_is_multiple_of)]

/// The `zeMem*` calls on one driver: each takes the driver's locks.
pub(crate) mod calls;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::backend::{AllocLocation, Backend, RawAllocation};
use crate::error::{Addr, Error, Result};
use crate::semantics::capacity::{Charge, DeviceMemory};
use crate::semantics::vmm::page_size_for;
use crate::spec::IpcHandleTypes;
pub use crate::spec::{
    is_relaxed_limits_stype, relaxed_limits_from_desc, relaxed_max_size_from_raw, CompressionHint,
    MemoryType, RELAXED_LIMITS_EXP_STYPE, RELAXED_LIMITS_EXT_STYPE,
};

/// A USM allocation request: the fields of `ze_device_mem_alloc_desc_t` /
/// `ze_host_mem_alloc_desc_t` and every chained extension descriptor of the seed pages
/// (relaxed allocation limits, compression hints, IPC handle types, system-memory import). One
/// value serves host, device and shared allocations alike ([`crate::Context::alloc_host`],
/// [`crate::Context::alloc_device`], [`crate::Context::alloc_shared`]); which options apply
/// where is checked once, by [`check_chain`].
///
/// ```
/// # use hetmem::{AllocDesc, CompressionHint};
/// let d = AllocDesc::new(1 << 20).alignment(4096).compression(CompressionHint::Compressed);
/// assert_eq!(d.size, 1 << 20);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AllocDesc {
    /// Size in bytes; 0 is `UnsupportedSize`.
    pub size: usize,
    /// Alignment in bytes: 0 (none asked) or a power of two.
    pub alignment: usize,
    /// `ze_relaxed_allocation_limits_ext_desc_t` with MAX_SIZE chained: the size may exceed the
    /// device's `max_alloc_size`.
    pub relaxed_max_size: bool,
    /// `ze_memory_compression_hints_ext_desc_t` chained: recorded and reported.
    pub compression: Option<CompressionHint>,
    /// `ze_ipc_mem_handle_type_ext_desc_t` chained: the IPC handle types the memory must
    /// support (recorded on the allocation; a get asking for another type is refused).
    pub ipc_types: Option<IpcHandleTypes>,
    /// `ze_external_memmap_sysmem_ext_desc_t` chained (`zeMemAllocHost` only): the address of
    /// the system memory to import instead of allocating (`size` bytes of it; both multiples
    /// of the host page). The allocation's address is this address.
    pub system_memory: Option<usize>,
    /// The `size` of the system-memory descriptor, when it was given apart from the call's
    /// size ([`AllocDesc::system_memory_sized`]): it must equal [`AllocDesc::size`].
    pub system_memory_size: Option<u64>,
    /// `ZE_HOST_MEM_ALLOC_FLAG_MEM_READ_ONLY` with [`AllocDesc::system_memory`]: the imported
    /// memory may be read-only, and devices get read-only access to it.
    pub read_only: bool,
}

impl AllocDesc {
    /// `size` bytes, no alignment asked, no extensions.
    pub fn new(size: usize) -> AllocDesc {
        AllocDesc {
            size,
            ..AllocDesc::default()
        }
    }
    /// Sets the alignment (0 or a power of two).
    pub fn alignment(mut self, alignment: usize) -> AllocDesc {
        self.alignment = alignment;
        self
    }
    /// Chains relaxed allocation limits with MAX_SIZE.
    pub fn relaxed_max_size(mut self, on: bool) -> AllocDesc {
        self.relaxed_max_size = on;
        self
    }
    /// Chains a compression hint.
    pub fn compression(mut self, hint: CompressionHint) -> AllocDesc {
        self.compression = Some(hint);
        self
    }
    /// Chains IPC handle types the memory must support.
    pub fn ipc_types(mut self, types: IpcHandleTypes) -> AllocDesc {
        self.ipc_types = Some(types);
        self
    }
    /// Chains a system-memory import of `[ptr, ptr + size)`, read-only for devices if
    /// `read_only` (host allocations only).
    pub fn system_memory(mut self, ptr: usize, read_only: bool) -> AllocDesc {
        self.system_memory = Some(ptr);
        self.read_only = read_only;
        self
    }
    /// Chains a system-memory import whose descriptor carries its own `size`
    /// (`ze_external_memmap_sysmem_ext_desc_t::size`), checked against the call's size by
    /// [`check_chain`].
    pub fn system_memory_sized(mut self, ptr: usize, size: u64, read_only: bool) -> AllocDesc {
        self = self.system_memory(ptr, read_only);
        self.system_memory_size = Some(size);
        self
    }
}

/// Checks that every option chained on `desc` applies to an allocation at `location`: a
/// system-memory import (`ze_external_memmap_sysmem_ext_desc_t`) goes on `zeMemAllocHost`
/// only (the extension: "may be passed to zeMemAllocHost, via the pNext member of
/// ze_host_mem_alloc_desc_t").
///
/// The descriptor names the memory, so the call's size must agree with the descriptor's
/// ([`AllocDesc::system_memory_sized`]).
///
/// Errors: `InvalidArgument` naming the descriptor and the call it was chained to, or both
/// sizes when they differ.
pub fn check_chain(location: AllocLocation, desc: &AllocDesc) -> Result<()> {
    if let Some(sys) = desc.system_memory_size {
        if sys != desc.size as u64 {
            return Err(Error::InvalidArgument(format!(
                "size {:#x} differs from the system-memory descriptor's size {sys:#x}",
                desc.size
            )));
        }
    }
    if let (Some(ptr), AllocLocation::Device(_) | AllocLocation::Shared(_)) =
        (desc.system_memory, location)
    {
        return Err(Error::InvalidArgument(format!(
            "a system-memory import of {} is chained to a {} allocation; it applies to \
             zeMemAllocHost only",
            Addr(ptr),
            if matches!(location, AllocLocation::Device(_)) {
                "device"
            } else {
                "shared"
            }
        )));
    }
    Ok(())
}

/// `ze_memory_allocation_properties_t` (and the device of `zeMemGetAllocProperties`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AllocationProperties {
    /// The kind of memory.
    pub memory_type: MemoryType,
    /// Unique id of the allocation, import or physical object (never reused); 0 for unknown
    /// memory.
    pub id: u64,
    /// Page size in bytes of the allocation; 0 for unknown memory.
    pub page_size: usize,
    /// The device the memory belongs to (`phDevice`), if any.
    pub device: Option<u32>,
    /// The sub-device of `device` it was made on, if any (`phDevice` is then that
    /// sub-device).
    pub sub_device: Option<u32>,
    /// The compression hint the allocation was made with.
    pub compression: Option<CompressionHint>,
    /// Devices may only read it (an import of read-only memory).
    pub read_only: bool,
}

/// Counters of the driver's USM bookkeeping, for leak checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UsmStats {
    /// Live host / device / shared allocations.
    pub allocations: usize,
    /// Bytes of them as asked.
    pub allocated_bytes: usize,
    /// Live imports of system memory.
    pub imports: usize,
    /// Bytes imported.
    pub imported_bytes: usize,
}

#[derive(Debug)]
pub(crate) struct AllocRec {
    /// Size as asked (the address range's size).
    pub(crate) size: usize,
    /// Bytes the backend allocated (a page multiple); 0 for imports.
    pub(crate) span: usize,
    pub(crate) kind: MemoryType,
    pub(crate) device: Option<u32>,
    /// The sub-device of `device` it was made on (and is charged to), if any.
    pub(crate) sub_device: Option<u32>,
    pub(crate) id: u64,
    pub(crate) page_size: usize,
    pub(crate) compression: Option<CompressionHint>,
    pub(crate) read_only: bool,
    pub(crate) context: u64,
    /// Backend handle; `None` for imports.
    pub(crate) raw: Option<RawAllocation>,
    /// The capacity charged to `device` (device and shared allocations with a device), shared
    /// with the IPC exports of the allocation.
    pub(crate) charge: Option<Arc<Charge>>,
    /// IPC handle types chained at allocation (`ze_ipc_mem_handle_type_ext_desc_t`), if any;
    /// set by [`crate::ipc`] and gone with the record.
    pub(crate) ipc_types: Option<crate::spec::IpcHandleTypes>,
}

impl AllocRec {
    /// The address span the record occupies (for overlap checks).
    pub(crate) fn extent(&self) -> usize {
        self.size.max(self.span)
    }
}

/// An allocation or import taken out of the bookkeeping ([`UsmState::take_for_free`]) whose
/// memory (and device capacity, unless given back early) is still held.
#[derive(Debug)]
pub(crate) struct PendingFree {
    pub(crate) ptr: usize,
    pub(crate) rec: AllocRec,
}

impl PendingFree {
    /// The allocation's id.
    pub(crate) fn id(&self) -> u64 {
        self.rec.id
    }

    /// Drops the allocation's hold on the device capacity now (free-now semantics), before
    /// the memory goes; the capacity comes back unless an IPC export or view still holds it
    /// (`crate::capacity`).
    pub(crate) fn give_back_capacity(&mut self) {
        self.rec.charge = None;
    }

    /// Releases the memory (and the capacity still charged).
    pub(crate) fn finish(self, backend: &dyn Backend) {
        let r = self.rec;
        match r.raw {
            // SAFETY: the record was the only owner of this live allocation, and the caller
            // guarantees no queued work references it any more.
            Some(raw) => unsafe { backend.free_alloc(self.ptr, r.span, raw) },
            // SAFETY: registered at import; the memory itself stays.
            None => unsafe { backend.unregister_host(self.ptr, r.size) },
        }
        // The record's charge goes with it.
    }
}

/// The bookkeeping of one driver's USM allocations and imports. Guarded by the driver's lock.
#[derive(Debug)]
pub(crate) struct UsmState {
    pub(crate) allocs: BTreeMap<usize, AllocRec>,
    pub(crate) devmem: Arc<DeviceMemory>,
    pub(crate) max_alloc: Vec<u64>,
    pub(crate) min_page: Vec<usize>,
    pub(crate) host_page: usize,
}

impl UsmState {
    pub(crate) fn new(backend: &dyn Backend, devmem: Arc<DeviceMemory>) -> UsmState {
        let d = backend.devices();
        UsmState {
            allocs: BTreeMap::new(),
            devmem,
            max_alloc: d.iter().map(|d| d.max_alloc_size).collect(),
            min_page: d.iter().map(|d| d.min_page_size).collect(),
            host_page: backend.host_page_size(),
        }
    }

    pub(crate) fn device_index(&self, ordinal: u32) -> Result<usize> {
        let i = ordinal as usize;
        if i >= self.max_alloc.len() {
            return Err(Error::InvalidNullHandle(format!(
                "device {ordinal} does not exist ({} devices)",
                self.max_alloc.len()
            )));
        }
        Ok(i)
    }

    /// `zeMemAllocDevice` / `zeMemAllocHost` / `zeMemAllocShared`: see the module docs. On
    /// sub-device `sub` of the location's device, the limits are the sub-device's (its share,
    /// [`crate::semantics::capacity`]) and the charge is the sub-device's and its root's.
    pub(crate) fn alloc(
        &mut self,
        backend: &dyn Backend,
        context: u64,
        location: AllocLocation,
        sub: Option<u32>,
        desc: &AllocDesc,
    ) -> Result<usize> {
        let device = match location {
            AllocLocation::Device(d) | AllocLocation::Shared(Some(d)) => {
                Some(self.device_index(d)?)
            }
            AllocLocation::Host | AllocLocation::Shared(None) => None,
        };
        let size = desc.size;
        if size == 0 {
            return Err(Error::UnsupportedSize("allocation size is 0".into()));
        }
        if desc.alignment != 0 && !desc.alignment.is_power_of_two() {
            return Err(Error::UnsupportedAlignment(format!(
                "alignment {:#x} is neither 0 nor a power of two",
                desc.alignment
            )));
        }
        // Host allocations (and shared ones without a device) use device 0's limits.
        let limit_dev = device.unwrap_or(0);
        let sub = device.and(sub);
        // Named only when refusing (no formatting on the allocation path).
        let what = || match sub {
            Some(s) => format!("sub-device {s} of device {limit_dev}"),
            None => format!("device {limit_dev}"),
        };
        let mut max = self.max_alloc.get(limit_dev).copied().unwrap_or(u64::MAX);
        if sub.is_some() {
            max = max.min(self.devmem.slot_capacity(limit_dev, sub));
        }
        if !desc.relaxed_max_size && size as u64 > max {
            return Err(Error::UnsupportedSize(format!(
                "size {size:#x} exceeds the largest single allocation {max:#x} of {} \
                 (chain relaxed allocation limits with MAX_SIZE to allow it)",
                what()
            )));
        }
        if let Some(i) = device {
            let cap = self.devmem.slot_capacity(i, sub);
            if size as u64 > cap {
                return Err(Error::UnsupportedSize(format!(
                    "size {size:#x} exceeds the whole capacity {cap:#x} of {}",
                    what()
                )));
            }
        }
        let min_page = match device {
            Some(i) => self.min_page[i],
            None => self
                .min_page
                .iter()
                .copied()
                .max()
                .unwrap_or(self.host_page),
        };
        let page = page_size_for(min_page, size);
        let span = size.checked_next_multiple_of(page).ok_or_else(|| {
            Error::UnsupportedSize(format!(
                "size {size:#x} overflows when rounded to {page:#x}"
            ))
        })?;
        let align = desc.alignment.max(page);
        let charge = device
            .map(|i| self.devmem.charge_on(i, sub, span as u64))
            .transpose()?;
        // On error the charge is dropped, so given back.
        let (addr, raw) = backend.alloc(location, span, align)?;
        let kind = match location {
            AllocLocation::Device(_) => MemoryType::Device,
            AllocLocation::Host => MemoryType::Host,
            AllocLocation::Shared(_) => MemoryType::Shared,
        };
        self.allocs.insert(
            addr,
            AllocRec {
                size,
                span,
                kind,
                device: device.map(|i| i as u32),
                sub_device: sub,
                id: self.devmem.next_id(),
                page_size: page,
                compression: desc.compression,
                read_only: false,
                context,
                raw: Some(raw),
                charge,
                ipc_types: None,
            },
        );
        Ok(addr)
    }

    /// The last live allocation or import that overlaps `[start, end)`, as `(base, end)`.
    pub(crate) fn overlapping(&self, start: usize, end: usize) -> Option<(usize, usize)> {
        let (&b, r) = self.allocs.range(..end).next_back()?;
        (b + r.extent() > start).then_some((b, b + r.extent()))
    }

    /// `zeMemAllocHost` with `ze_external_memmap_sysmem_ext_desc_t`: see the module docs.
    /// `not_system` names the memory overlapping `[ptr, ptr+size)` that is not system memory
    /// (a virtual-memory reservation, an opened IPC view, a managed allocation), if any.
    pub(crate) fn import(
        &mut self,
        backend: &dyn Backend,
        context: u64,
        ptr: usize,
        size: usize,
        read_only: bool,
        not_system: impl FnOnce(usize, usize) -> Option<String>,
    ) -> Result<usize> {
        if size == 0 {
            return Err(Error::UnsupportedSize("import size is 0".into()));
        }
        let page = self.host_page;
        if ptr == 0 || ptr % page != 0 {
            return Err(Error::InvalidArgument(format!(
                "system memory pointer {} is not aligned to the {page:#x}-byte host page",
                Addr(ptr)
            )));
        }
        if size % page != 0 {
            return Err(Error::InvalidArgument(format!(
                "import size {size:#x} is not a multiple of the {page:#x}-byte host page"
            )));
        }
        let end = ptr.checked_add(size).ok_or_else(|| {
            Error::InvalidArgument(format!("range {} + {size:#x} overflows", Addr(ptr)))
        })?;
        if let Some((s, e)) = self.overlapping(ptr, end) {
            return Err(Error::InvalidArgument(format!(
                "[{}, {}) overlaps the live allocation or import [{}, {})",
                Addr(ptr),
                Addr(end),
                Addr(s),
                Addr(e)
            )));
        }
        if let Some(what) = not_system(ptr, end) {
            return Err(Error::InvalidArgument(format!(
                "[{}, {}) overlaps {what}, which is not system memory",
                Addr(ptr),
                Addr(end)
            )));
        }
        match backend.query_host_protection(ptr, size) {
            None => {
                return Err(Error::InvalidArgument(format!(
                    "[{}, {}) is not wholly mapped system memory",
                    Addr(ptr),
                    Addr(end)
                )))
            }
            Some(crate::backend::Protection::None) => {
                return Err(Error::InvalidArgument(format!(
                    "[{}, {}) has pages that cannot be read, so cannot be imported",
                    Addr(ptr),
                    Addr(end)
                )))
            }
            Some(crate::backend::Protection::ReadOnly) if !read_only => {
                return Err(Error::InvalidArgument(format!(
                    "[{}, {}) is read-only memory; import it with the read-only flag",
                    Addr(ptr),
                    Addr(end)
                )))
            }
            Some(_) => {}
        }
        backend.register_host(ptr, size, read_only)?;
        self.allocs.insert(
            ptr,
            AllocRec {
                size,
                span: 0,
                kind: MemoryType::HostImported,
                device: None,
                sub_device: None,
                id: self.devmem.next_id(),
                page_size: page,
                compression: None,
                read_only,
                context,
                raw: None,
                charge: None,
                ipc_types: None,
            },
        );
        Ok(ptr)
    }

    /// `zeMemFreeExt`, first half: takes the allocation or import at `ptr` (the base of a live
    /// one of `context`, as `zeMemFree` needs) out of the bookkeeping, so the pointer is
    /// invalid at once, and returns it with its memory and capacity still held; the caller
    /// releases them with [`PendingFree::finish`] once no work references them.
    pub(crate) fn take_for_free(&mut self, context: u64, ptr: usize) -> Result<PendingFree> {
        if ptr == 0 {
            return Err(Error::InvalidNullPointer("pointer to free is null".into()));
        }
        match self.allocs.get(&ptr) {
            Some(r) if r.context == context => {}
            Some(_) => {
                return Err(Error::InvalidArgument(format!(
                    "{} is an allocation of another context",
                    Addr(ptr)
                )))
            }
            None => {
                return Err(Error::InvalidArgument(format!(
                    "{} is not the base of a live allocation or import",
                    Addr(ptr)
                )))
            }
        }
        let rec = self.allocs.remove(&ptr).expect("checked");
        Ok(PendingFree { ptr, rec })
    }

    /// The record containing `ptr` (`base <= ptr < base + size`).
    pub(crate) fn find(&self, ptr: usize) -> Option<(usize, &AllocRec)> {
        let (&b, r) = self.allocs.range(..=ptr).next_back()?;
        (ptr < b + r.size).then_some((b, r))
    }

    /// Properties of the allocation or import containing `ptr`, if any.
    pub(crate) fn properties(&self, ptr: usize) -> Option<AllocationProperties> {
        let (_, r) = self.find(ptr)?;
        Some(AllocationProperties {
            memory_type: r.kind,
            id: r.id,
            page_size: r.page_size,
            device: r.device,
            sub_device: r.sub_device,
            compression: r.compression,
            read_only: r.read_only,
        })
    }

    /// Queue operand checks ([`crate::queue`]): `(base, size, id, read_only)` of the allocation
    /// or import containing `ptr`, in one lookup.
    pub(crate) fn operand_info(&self, ptr: usize) -> Option<(usize, usize, u64, bool)> {
        self.find(ptr).map(|(b, r)| (b, r.size, r.id, r.read_only))
    }

    /// `(base, size)` of the allocation or import containing `ptr`, if any.
    pub(crate) fn address_range(&self, ptr: usize) -> Option<(usize, usize)> {
        self.find(ptr).map(|(b, r)| (b, r.size))
    }

    /// IPC ([`crate::ipc`]): the allocation or import containing `ptr` as `(base, span in
    /// bytes, kind, id, context, backend handle)` (no handle for imports of system memory).
    pub(crate) fn ipc_source(
        &self,
        ptr: usize,
    ) -> Option<(usize, usize, MemoryType, u64, u64, Option<RawAllocation>)> {
        let (b, r) = self.find(ptr)?;
        Some((b, r.span, r.kind, r.id, r.context, r.raw))
    }

    /// IPC ([`crate::ipc`]): the device capacity the allocation containing `ptr` holds (none
    /// for host memory and imports), for an export of it to hold too.
    pub(crate) fn ipc_charge(&self, ptr: usize) -> Option<Arc<Charge>> {
        self.find(ptr)?.1.charge.clone()
    }

    /// IPC ([`crate::ipc`]): records the handle types chained at the allocation at `base`
    /// (of `context`); false if there is none.
    pub(crate) fn set_ipc_types(
        &mut self,
        context: u64,
        base: usize,
        types: crate::spec::IpcHandleTypes,
    ) -> bool {
        match self.allocs.get_mut(&base) {
            Some(r) if r.context == context => {
                r.ipc_types = Some(types);
                true
            }
            _ => false,
        }
    }

    /// IPC ([`crate::ipc`]): the handle types chained at the allocation containing `ptr`.
    pub(crate) fn ipc_types(&self, ptr: usize) -> Option<crate::spec::IpcHandleTypes> {
        self.find(ptr)?.1.ipc_types
    }

    /// IPC ([`crate::ipc`]): live allocations with recorded handle types.
    pub(crate) fn ipc_typed(&self) -> usize {
        self.allocs
            .values()
            .filter(|r| r.ipc_types.is_some())
            .count()
    }

    /// Context teardown, first half: takes every allocation and import of `context` out of the
    /// bookkeeping (their pointers are invalid at once) and returns them with memory and
    /// capacity still held. The caller releases each with [`PendingFree::finish`] once no
    /// queued work references it (deferred like [`crate::queue::FreePolicy::Defer`]), since
    /// queues of other contexts may still be copying from or into them.
    pub(crate) fn take_context(&mut self, context: u64) -> Vec<PendingFree> {
        let bases: Vec<usize> = self
            .allocs
            .iter()
            .filter(|(_, r)| r.context == context)
            .map(|(&b, _)| b)
            .collect();
        bases
            .into_iter()
            .map(|ptr| PendingFree {
                ptr,
                rec: self.allocs.remove(&ptr).expect("listed"),
            })
            .collect()
    }

    pub(crate) fn stats(&self) -> UsmStats {
        let mut s = UsmStats::default();
        for r in self.allocs.values() {
            if r.kind == MemoryType::HostImported {
                s.imports += 1;
                s.imported_bytes += r.size;
            } else {
                s.allocations += 1;
                s.allocated_bytes += r.size;
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_hint_is_exactly_one_flag() {
        assert_eq!(
            CompressionHint::from_raw(1),
            Ok(CompressionHint::Compressed)
        );
        assert_eq!(
            CompressionHint::from_raw(2),
            Ok(CompressionHint::Uncompressed)
        );
        for bad in [0, 3, 4, 0x8000_0000] {
            assert_eq!(
                CompressionHint::from_raw(bad).unwrap_err().ze_result(),
                0x7800_000d,
                "{bad:#x}"
            );
        }
        assert_eq!(CompressionHint::Uncompressed.raw(), 2);
    }

    #[test]
    fn relaxed_limits_need_max_size_and_no_other_bits() {
        assert_eq!(relaxed_max_size_from_raw(1), Ok(true));
        assert_eq!(
            relaxed_max_size_from_raw(0).unwrap_err().ze_result(),
            0x7800_0004
        );
        assert_eq!(
            relaxed_max_size_from_raw(2).unwrap_err().ze_result(),
            0x7800_000c
        );
    }

    #[test]
    fn memory_type_c_values() {
        assert_eq!(MemoryType::Unknown as u32, 0);
        assert_eq!(MemoryType::Host as u32, 1);
        assert_eq!(MemoryType::Device as u32, 2);
        assert_eq!(MemoryType::Shared as u32, 3);
        assert_eq!(MemoryType::HostImported as u32, 4);
    }
}
