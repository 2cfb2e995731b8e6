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

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::backend::{AllocLocation, Backend, RawAllocation};
use crate::capacity::{Charge, DeviceMemory};
use crate::error::{Addr, Error, Result};
use crate::vmm::page_size_for;

/// `ze_memory_type_t`: what kind of memory a pointer points into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum MemoryType {
    /// `ZE_MEMORY_TYPE_UNKNOWN` (0): not memory this driver knows.
    #[default]
    Unknown = 0,
    /// `ZE_MEMORY_TYPE_HOST` (1): `zeMemAllocHost`.
    Host = 1,
    /// `ZE_MEMORY_TYPE_DEVICE` (2): `zeMemAllocDevice`, or device physical memory mapped in a
    /// virtual-memory reservation.
    Device = 2,
    /// `ZE_MEMORY_TYPE_SHARED` (3): `zeMemAllocShared`.
    Shared = 3,
    /// `ZE_MEMORY_TYPE_HOST_IMPORTED` (4): imported system memory.
    HostImported = 4,
}

/// `ze_memory_compression_hints_ext_flag_t`, one of its two flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompressionHint {
    /// `ZE_MEMORY_COMPRESSION_HINTS_EXT_FLAG_COMPRESSED` (1 << 0).
    Compressed,
    /// `ZE_MEMORY_COMPRESSION_HINTS_EXT_FLAG_UNCOMPRESSED` (1 << 1).
    Uncompressed,
}

impl CompressionHint {
    /// Decodes the descriptor's flags, which must be exactly one flag ("Must be set to one of
    /// the ze_memory_compression_hints_ext_flag_t"). Anything else (0, both bits, other bits) is
    /// `UnsupportedEnumeration`, the reference driver's answer (`prepareL0StructuresLookupTable`).
    pub fn from_raw(flags: u32) -> Result<CompressionHint> {
        match flags {
            1 => Ok(CompressionHint::Compressed),
            2 => Ok(CompressionHint::Uncompressed),
            _ => Err(Error::UnsupportedEnumeration(format!(
                "compression hint flags {flags:#x} are not exactly one of COMPRESSED (0x1) or \
                 UNCOMPRESSED (0x2)"
            ))),
        }
    }

    /// The C flag value.
    pub fn raw(self) -> u32 {
        match self {
            CompressionHint::Compressed => 1,
            CompressionHint::Uncompressed => 2,
        }
    }
}

/// `ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXT_DESC` (0x10016), the extension form.
pub const RELAXED_LIMITS_EXT_STYPE: u32 = 0x10016;
/// `ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC` (0x00020001), the experimental form
/// (same layout: `stype`, `pNext`, `flags`).
pub const RELAXED_LIMITS_EXP_STYPE: u32 = 0x0002_0001;

/// Whether a descriptor chained on an allocation descriptor is relaxed allocation limits, in
/// either form ([`RELAXED_LIMITS_EXT_STYPE`] or [`RELAXED_LIMITS_EXP_STYPE`]); its flags then go
/// to [`relaxed_max_size_from_raw`].
pub fn is_relaxed_limits_stype(stype: u32) -> bool {
    stype == RELAXED_LIMITS_EXT_STYPE || stype == RELAXED_LIMITS_EXP_STYPE
}

/// Decodes `ze_relaxed_allocation_limits_ext_flags_t` (and the experimental form): returns
/// whether MAX_SIZE (1 << 0) is set. Bits over 0x1 are `InvalidEnumeration`; a chained
/// descriptor without MAX_SIZE is `InvalidArgument` (reference driver, `allocHostMem`).
///
/// **flags = 0** is `InvalidArgument`, not "no relaxation": the spec's field text ("must be 0
/// (default) or a valid combination") is the generic wording of every flags field, but the
/// reference driver (intel/compute-runtime: `ContextImp::allocHostMem`,
/// `ContextImp::allocSharedMem`, and `prepareL0StructuresLookupTable` for device allocations)
/// answers a chained relaxed-limits descriptor without `MAX_SIZE` with
/// `ZE_RESULT_ERROR_INVALID_ARGUMENT`. To ask for no relaxation, chain no descriptor.
pub fn relaxed_max_size_from_raw(flags: u32) -> Result<bool> {
    match flags {
        1 => Ok(true),
        0 => Err(Error::InvalidArgument(
            "relaxed allocation limits flags 0x0 lack MAX_SIZE (0x1); chain no descriptor for \
             no relaxation"
                .into(),
        )),
        _ => Err(Error::InvalidEnumeration(format!(
            "relaxed allocation limits flags {flags:#x} exceed 0x1"
        ))),
    }
}

/// Decodes a raw relaxed-allocation-limits descriptor chained on an allocation descriptor
/// (`ze_relaxed_allocation_limits_ext_desc_t` or its experimental form
/// `ze_relaxed_allocation_limits_exp_desc_t`; same layout: `stype`, `pNext`, `flags`) from its
/// `stype` and `flags` fields, for the C ABI; the result goes to
/// [`AllocDesc::relaxed_max_size`].
///
/// - `stype` must be [`RELAXED_LIMITS_EXT_STYPE`] (0x10016) or [`RELAXED_LIMITS_EXP_STYPE`]
///   (0x00020001) ([`is_relaxed_limits_stype`]); any other is `UnsupportedEnumeration`, the
///   reference driver's answer for a chained descriptor it does not know
///   (`prepareL0StructuresLookupTable`);
/// - then the flags as [`relaxed_max_size_from_raw`]: `1` (MAX_SIZE) -> `Ok(true)`; `0` ->
///   `InvalidArgument` (see there: the reference driver's answer, not "no relaxation"); bits
///   over 0x1 -> `InvalidEnumeration`.
///
/// ```
/// use hetmem::usm::relaxed_limits_from_desc;
/// assert_eq!(relaxed_limits_from_desc(0x10016, 1), Ok(true));
/// assert_eq!(relaxed_limits_from_desc(0x0002_0001, 1), Ok(true));
/// assert!(relaxed_limits_from_desc(0x10016, 0).is_err());
/// ```
pub fn relaxed_limits_from_desc(stype: u32, flags: u32) -> Result<bool> {
    if !is_relaxed_limits_stype(stype) {
        return Err(Error::UnsupportedEnumeration(format!(
            "descriptor stype {stype:#x} is neither \
             ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXT_DESC ({RELAXED_LIMITS_EXT_STYPE:#x}) \
             nor its experimental form ({RELAXED_LIMITS_EXP_STYPE:#x})"
        )));
    }
    relaxed_max_size_from_raw(flags)
}

/// A USM allocation request: the fields of `ze_device_mem_alloc_desc_t` /
/// `ze_host_mem_alloc_desc_t` and the chained extension descriptors that matter here. One type
/// serves host, device and shared allocations.
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
struct AllocRec {
    /// Size as asked (the address range's size).
    size: usize,
    /// Bytes the backend allocated (a page multiple); 0 for imports.
    span: usize,
    kind: MemoryType,
    device: Option<u32>,
    id: u64,
    page_size: usize,
    compression: Option<CompressionHint>,
    read_only: bool,
    context: u64,
    /// Backend handle; `None` for imports.
    raw: Option<RawAllocation>,
    /// The capacity charged to `device` (device and shared allocations with a device), shared
    /// with the IPC exports of the allocation.
    charge: Option<Arc<Charge>>,
    /// IPC handle types chained at allocation (`ze_ipc_mem_handle_type_ext_desc_t`), if any;
    /// set by [`crate::ipc`] and gone with the record.
    ipc_types: Option<crate::ipc::IpcHandleTypes>,
}

impl AllocRec {
    /// The address span the record occupies (for overlap checks).
    fn extent(&self) -> usize {
        self.size.max(self.span)
    }
}

/// An allocation or import taken out of the bookkeeping ([`UsmState::take_for_free`]) whose
/// memory (and device capacity, unless given back early) is still held.
#[derive(Debug)]
pub(crate) struct PendingFree {
    ptr: usize,
    rec: AllocRec,
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
    allocs: BTreeMap<usize, AllocRec>,
    devmem: Arc<DeviceMemory>,
    max_alloc: Vec<u64>,
    min_page: Vec<usize>,
    host_page: usize,
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

    fn device_index(&self, ordinal: u32) -> Result<usize> {
        let i = ordinal as usize;
        if i >= self.max_alloc.len() {
            return Err(Error::InvalidNullHandle(format!(
                "device {ordinal} does not exist ({} devices)",
                self.max_alloc.len()
            )));
        }
        Ok(i)
    }

    /// `zeMemAllocDevice` / `zeMemAllocHost` / `zeMemAllocShared`: see the module docs.
    pub(crate) fn alloc(
        &mut self,
        backend: &dyn Backend,
        context: u64,
        location: AllocLocation,
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
        let max = self.max_alloc.get(limit_dev).copied().unwrap_or(u64::MAX);
        if !desc.relaxed_max_size && size as u64 > max {
            return Err(Error::UnsupportedSize(format!(
                "size {size:#x} exceeds the largest single allocation {max:#x} of device \
                 {limit_dev} (chain relaxed allocation limits with MAX_SIZE to allow it)"
            )));
        }
        if let Some(i) = device {
            let cap = self.devmem.capacity(i);
            if size as u64 > cap {
                return Err(Error::UnsupportedSize(format!(
                    "size {size:#x} exceeds the whole capacity {cap:#x} of device {i}"
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
            .map(|i| self.devmem.charge(i, span as u64))
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
    fn find(&self, ptr: usize) -> Option<(usize, &AllocRec)> {
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
        types: crate::ipc::IpcHandleTypes,
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
    pub(crate) fn ipc_types(&self, ptr: usize) -> Option<crate::ipc::IpcHandleTypes> {
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
