//! Level Zero virtual memory: the semantics layer.
//!
//! Spec: oneAPI Level Zero 1.18, "Virtual Mem" (`zeVirtualMemReserve`, `zeVirtualMemFree`,
//! `zeVirtualMemQueryPageSize`, `zePhysicalMemCreate`, `zePhysicalMemDestroy`, `zeVirtualMemMap`,
//! `zeVirtualMemUnmap`, `zeVirtualMemSetAccessAttribute`, `zeVirtualMemGetAccessAttribute`).
//!
//! Every rule of those pages lives here, once: validation, the choice of error code, and the
//! bookkeeping of reservations, mappings, per-page access attributes and device capacity. The
//! backend only performs raw operations that were already validated.
//!
//! # Page sizes
//! [`page_size_for`] implements the page-size query: 64 KiB for sizes below 2 MiB and 2 MiB from
//! 2 MiB up, never smaller than the device's mapping granularity (the OS page on the host backend,
//! 2 MiB on CUDA). The rules that use it:
//! - reservation and physical-object sizes must be a multiple of `page_size_for(size)`;
//! - a map's address, size and physical offset must be multiples of `page_size_for(size)`;
//! - unmap and the access-attribute calls work on *base pages*, `page_size_for(1)` (64 KiB on
//!   the host backend): any base-page-aligned sub-range of mapped pages.
//!
//! # Error codes (beyond those each function lists)
//! Null pointers give `InvalidNullPointer`; size 0 gives `UnsupportedSize` (except in the
//! page-size query, below); an access value over
//! READONLY gives `InvalidEnumeration`; ranges outside this context's reservations give
//! `InvalidArgument`. A failed call changes nothing.
//!
//! `zeVirtualMemFree` with a null pointer is `InvalidNullPointer` and with size 0
//! `UnsupportedSize`, before the exact-base-and-size check: a deliberate deviation from the
//! issue's "anything but an existing reservation's exact base and size is INVALID_ARGUMENT",
//! following the codes the header lists for that call (`nullptr == ptr`, `0 == size`). Every
//! other mismatch (unknown pointer, interior pointer, wrong size, another context's
//! reservation) is `InvalidArgument`.
//!
//! # The reference driver's answers where the header's list differs (deliberate choices)
//! Programs written for Level Zero follow Intel's compute-runtime, the production driver, where
//! its answer and the 1.4 header's error list differ; hetmem answers as that driver does:
//! - `zeVirtualMemQueryPageSize` with size 0 is `SUCCESS` and answers the page size of the
//!   smallest allocation (`page_size_for(min_page, 1)`: 64 KiB on the host backend, 2 MiB on
//!   CUDA). The header lists `ZE_RESULT_ERROR_UNSUPPORTED_SIZE` for `0 == size`, and the
//!   loader's validation layer (`ZE_ENABLE_PARAMETER_VALIDATION=1`) returns that code itself
//!   before the driver is called; the driver does not answer differently under the layer.
//! - `zeVirtualMemUnmap` of a base-page-aligned range inside one reservation unmaps the pages
//!   of it that are mapped and leaves the others unmapped: a range that is already unmapped,
//!   or was never mapped, is `SUCCESS` and changes nothing (programs unmap the first mapping,
//!   then every mapping in a loop, the first one twice). The header's text asks for a mapped
//!   range and lists `ZE_RESULT_ERROR_INVALID_ARGUMENT`; a range outside every reservation of
//!   the context (or across two) stays `InvalidArgument`.
//!
//! # Queued device work
//! Queued copies and fills may use mapped pages ([`crate::queue`]); each submitted batch holds a
//! reference on the reservation (by base) of every such operand until it has finished. Unmap,
//! free and set-access on a reservation, and context teardown, **block** until no queued or
//! running command references the reservation (Level Zero leaves this undefined; waiting, like
//! `zeMemFreeExt` BLOCKING, means the engine never touches a page unmapped or protected under
//! it). The wait holds no lock, so other calls and the engines go on; calls on other
//! reservations and map never wait. `zePhysicalMemDestroy` of an object in use is already
//! refused: it is mapped, so `HandleObjectInUse`.
//!
//! # Access attributes
//! Per-page attributes live in each reservation's page table ([`crate::semantics::access`]),
//! not in the mapped runs: set-access and get-access take no `vm` lock (the spec asks them to
//! be lock-free). Map, unmap and free change a reservation's table under its gate, after the
//! `vm` write lock; set-access takes only the gate, and checks the in-flight references of
//! queued work under it ([`calls::set_access`]).

/// The `zeVirtualMem*` / `zePhysicalMem*` calls on one driver: each takes the driver's locks.
pub(crate) mod calls;

use std::collections::HashMap;
use std::sync::Arc;

use crate::backend::{Backend, PhysicalLocation, RawPhysical};
use crate::error::{Addr, Error, Result};
use crate::semantics::access::protection;
use crate::semantics::access::{ReservationIndex, ReservationPages, UNMAPPED};
use crate::semantics::capacity::{Charge, DeviceMemory};
use crate::semantics::checks::{aligned, nonzero, null_check, size_multiple};
use crate::semantics::ranges::{RangeMap, Splittable};
pub use crate::spec::{AccessAttribute, PhysicalMemoryFlags};

/// Whether device work is refused where a page is READONLY: always. Queued copies and fills
/// whose destination has a READONLY page are refused at append (`InvalidArgument`, see
/// [`crate::semantics::access`]), on every backend, so Level Zero's
/// `ze_device_readonly_memory_ext_properties_t::readonlyCapability` is ENFORCED.
pub const DEVICE_WRITES_TO_READONLY_REFUSED: bool = true;

/// 64 KiB, the page size the query answers below 2 MiB.
pub const PAGE_64K: usize = 64 << 10;
/// 2 MiB, the page size the query answers from 2 MiB up.
pub const PAGE_2M: usize = 2 << 20;

/// The page size for an allocation of `size` bytes on a device whose mapping granularity is
/// `min_page`: 64 KiB below 2 MiB, 2 MiB from 2 MiB up, and never less than `min_page`.
///
/// Implements `zeVirtualMemQueryPageSize` (the reference driver's rule).
pub fn page_size_for(min_page: usize, size: usize) -> usize {
    let rule = if size < PAGE_2M { PAGE_64K } else { PAGE_2M };
    rule.max(min_page)
}

/// A reserved virtual address range (`zeVirtualMemReserve`'s result): base address and size in
/// bytes. A plain description; free it with [`crate::Context::free`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reservation {
    /// First byte, aligned to the page size of `size`.
    pub base: usize,
    /// Size in bytes, a multiple of the page size of `size`.
    pub size: usize,
}

impl Reservation {
    /// The base as a pointer.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base as *mut u8
    }
    /// One past the last byte.
    pub fn end(&self) -> usize {
        self.base + self.size
    }
}

/// A physical memory object handle (`ze_physical_mem_handle_t`): an id unique for the life of
/// the driver, never reused, plus the object's size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PhysicalMemory {
    /// Unique id (never 0).
    pub id: u64,
    /// Size in bytes.
    pub size: usize,
}

/// A mapped run of pages: which physical object, at which offset. The pages' access
/// attributes are in their reservation's table ([`ReservationPages`]), which the access calls
/// read and write without the driver's lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mapped {
    pub phys: u64,
    pub offset: usize,
}

impl Splittable for Mapped {
    fn shifted(&self, delta: usize) -> Self {
        Mapped {
            offset: self.offset + delta,
            ..self.clone()
        }
    }
    fn joins(&self, len: usize, next: &Self) -> bool {
        self.phys == next.phys && self.offset + len == next.offset
    }
}

#[derive(Debug)]
pub(crate) struct ReservationRec {
    pub(crate) size: usize,
    pub(crate) context: u64,
    /// Its page table, also in [`VmState::index`].
    pub(crate) pages: Arc<ReservationPages>,
}

#[derive(Debug)]
pub(crate) struct PhysicalRec {
    pub(crate) raw: RawPhysical,
    pub(crate) size: usize,
    pub(crate) location: PhysicalLocation,
    pub(crate) context: u64,
    /// Bytes of this object mapped anywhere right now.
    pub(crate) mapped: usize,
    /// The device capacity it holds (device memory only), shared with the IPC exports of it.
    pub(crate) charge: Option<Arc<Charge>>,
    /// IPC handle types chained at creation (`ze_ipc_mem_handle_type_ext_desc_t`), if any;
    /// set by [`crate::ipc`] and gone with the record.
    pub(crate) ipc_types: Option<crate::spec::IpcHandleTypes>,
    /// Imported from an export ([`VmState::insert_imported`]): it holds the exported
    /// object's charge when that object is this process's own (else nothing: the exporter's
    /// process counts it), never a charge of its own.
    pub(crate) imported: bool,
}

/// Per-device figures of the semantics layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceUsage {
    /// Bytes of physical memory (and, later, allocations) counted against the capacity.
    pub used: u64,
    /// The capacity.
    pub capacity: u64,
}

/// Counters of the whole driver's virtual memory, for checks and `hetmem info`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VmStats {
    /// Live reservations.
    pub reservations: usize,
    /// Bytes reserved.
    pub reserved_bytes: usize,
    /// Live physical objects.
    pub physical_objects: usize,
    /// Mapped runs (each at least one OS mapping).
    pub mapped_runs: usize,
    /// Bytes mapped.
    pub mapped_bytes: usize,
    /// Usage of each device.
    pub devices: Vec<DeviceUsage>,
    /// Bytes of host physical memory.
    pub host_physical_bytes: u64,
}

/// What [`VmState::pointer_info`] finds at an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VmPointer {
    /// `(base, size)` of the reservation containing the address.
    pub reservation: (usize, usize),
    /// `(physical id, location, page size of the object)` if the address's page is mapped.
    pub mapped: Option<(u64, PhysicalLocation, usize)>,
}

/// The bookkeeping of one driver's virtual memory. Guarded by the driver's lock.
#[derive(Debug)]
pub(crate) struct VmState {
    pub(crate) reservations: std::collections::BTreeMap<usize, ReservationRec>,
    pub(crate) mapped: RangeMap<Mapped>,
    pub(crate) physical: HashMap<u64, PhysicalRec>,
    /// Device capacity and ids, shared with the USM state ([`crate::usm`]).
    pub(crate) devmem: Arc<DeviceMemory>,
    pub(crate) min_page: Vec<usize>,
    pub(crate) host_used: u64,
    /// The reservations' page tables by base, for the access calls, which take no `vm` lock
    /// ([`crate::semantics::access`]). Written here, under the `vm` write lock.
    pub(crate) index: Arc<ReservationIndex>,
}

impl VmState {
    pub(crate) fn new(backend: &dyn Backend, devmem: Arc<DeviceMemory>) -> VmState {
        let d = backend.devices();
        let min_page: Vec<usize> = d.iter().map(|d| d.min_page_size).collect();
        let floor = min_page.iter().copied().max().unwrap_or(4096);
        VmState {
            reservations: Default::default(),
            mapped: RangeMap::new(),
            physical: HashMap::new(),
            devmem,
            min_page,
            host_used: 0,
            index: Arc::new(ReservationIndex::new(page_size_for(floor, 1))),
        }
    }

    /// The driver-wide page size for `size`: the strictest over all devices.
    pub(crate) fn page_size(&self, size: usize) -> usize {
        let floor = self.min_page.iter().copied().max().unwrap_or(4096);
        page_size_for(floor, size)
    }

    /// The base page: the unit of unmap and access attributes.
    pub(crate) fn base_page(&self) -> usize {
        self.page_size(1)
    }

    pub(crate) fn device_index(&self, ordinal: u32) -> Result<usize> {
        let i = ordinal as usize;
        if i >= self.devmem.len() {
            return Err(Error::InvalidNullHandle(format!(
                "device {ordinal} does not exist ({} devices)",
                self.devmem.len()
            )));
        }
        Ok(i)
    }

    /// `zeVirtualMemQueryPageSize`. Size 0 answers the page size of the smallest allocation,
    /// `page_size_for(min_page, 1)` (the reference driver; see the module docs).
    pub(crate) fn query_page_size(&self, device: u32, size: usize) -> Result<usize> {
        let i = self.device_index(device)?;
        Ok(page_size_for(self.min_page[i], size.max(1)))
    }

    /// The reservation of `context` that wholly contains `[ptr, ptr+size)`.
    pub(crate) fn containing_reservation(
        &self,
        context: u64,
        ptr: usize,
        size: usize,
    ) -> Result<usize> {
        let found = self.reservations.range(..=ptr).next_back();
        crate::semantics::access::containing(
            found.map(|(&b, r)| (b, r.size, r.context)),
            context,
            ptr,
            size,
        )
    }

    pub(crate) fn check_base_aligned(&self, ptr: usize, size: usize) -> Result<()> {
        let page = self.base_page();
        aligned(ptr, page, "address")?;
        size_multiple(size, page, "size")
    }

    /// `zeVirtualMemReserve`. `hint` 0 means none.
    pub(crate) fn reserve(
        &mut self,
        backend: &dyn Backend,
        context: u64,
        hint: usize,
        size: usize,
    ) -> Result<Reservation> {
        nonzero(size, "reservation size")?;
        let page = self.page_size(size);
        size_multiple(size, page, "reservation size")?;
        if size.checked_add(page).is_none() {
            return Err(Error::UnsupportedSize(format!(
                "reservation size {size:#x} exceeds the address space"
            )));
        }
        let hint = (hint != 0 && hint.is_multiple_of(page)).then_some(hint);
        // SAFETY: the backend only creates a new placeholder; it never replaces a mapping.
        let base = unsafe { backend.reserve(hint, size, page)? };
        let pages = Arc::new(ReservationPages::new(base, size, context, self.base_page()));
        self.index.insert(pages.clone());
        self.reservations.insert(
            base,
            ReservationRec {
                size,
                context,
                pages,
            },
        );
        Ok(Reservation { base, size })
    }

    /// `zeVirtualMemFree`: unmaps whatever is mapped inside, then releases the range.
    pub(crate) fn free(
        &mut self,
        backend: &dyn Backend,
        context: u64,
        ptr: usize,
        size: usize,
    ) -> Result<()> {
        null_check(ptr, "reservation pointer")?;
        nonzero(size, "free size")?;
        let pages = match self.reservations.get(&ptr) {
            Some(r) if r.context == context && r.size == size => r.pages.clone(),
            Some(r) if r.context == context => {
                return Err(Error::InvalidArgument(format!(
                    "size {size:#x} is not the size {:#x} of the reservation at {}",
                    r.size,
                    Addr(ptr)
                )))
            }
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "{} is not the base of a reservation of this context",
                    Addr(ptr)
                )))
            }
        };
        // Clipped: a run may continue into an adjacent reservation (runs coalesce across them).
        let pieces: Vec<(usize, usize)> = self
            .mapped
            .overlapping(ptr, ptr + size)
            .map(|(s, e)| (s.max(ptr), e.end.min(ptr + size)))
            .collect();
        // No set-access is inside the range from here until it is marked dead.
        let gate = pages.exclusive();
        // SAFETY: an exact live reservation, and `pieces` are all its mapped runs.
        unsafe { backend.release_mapped(ptr, size, &pieces)? };
        pages.kill();
        drop(gate);
        self.index.remove(ptr);
        for (s, e) in self.mapped.remove(ptr, ptr + size) {
            if let Some(p) = self.physical.get_mut(&e.value.phys) {
                p.mapped -= e.end - s;
            }
        }
        self.reservations.remove(&ptr);
        Ok(())
    }

    /// Unmaps `[start, end)` which is fully mapped, updating physical-object counts.
    pub(crate) fn unmap_run(
        &mut self,
        backend: &dyn Backend,
        start: usize,
        end: usize,
    ) -> Result<()> {
        let pages = self.pages_at(start);
        let _gate = pages.exclusive();
        // SAFETY: every page of [start, end) is mapped (checked by the callers).
        unsafe { backend.unmap(start, end - start)? };
        pages.set_mapped(start, end, None);
        for (s, e) in self.mapped.remove(start, end) {
            if let Some(p) = self.physical.get_mut(&e.value.phys) {
                p.mapped -= e.end - s;
            }
        }
        Ok(())
    }

    /// `zePhysicalMemCreate`. `device` is required for device memory and ignored for host
    /// memory; device memory on sub-device `sub` of it is charged to the sub-device and its
    /// root ([`crate::semantics::capacity`]).
    pub(crate) fn create_physical(
        &mut self,
        backend: &dyn Backend,
        context: u64,
        device: Option<u32>,
        sub: Option<u32>,
        flags: PhysicalMemoryFlags,
        size: usize,
    ) -> Result<PhysicalMemory> {
        nonzero(size, "physical memory size")?;
        let location = match flags {
            PhysicalMemoryFlags::AllocateOnHost => PhysicalLocation::Host,
            PhysicalMemoryFlags::AllocateOnDevice => {
                let d = device.ok_or_else(|| {
                    Error::InvalidNullHandle("device memory needs a device, got null".into())
                })?;
                PhysicalLocation::Device(d)
            }
        };
        let page = match location {
            PhysicalLocation::Device(d) => {
                page_size_for(self.min_page[self.device_index(d)?], size)
            }
            PhysicalLocation::Host => self.page_size(size),
        };
        size_multiple(size, page, "physical memory size")?;
        if location == PhysicalLocation::Host {
            let cap = backend.host_capacity();
            let free = cap.saturating_sub(self.host_used);
            if size as u64 > free {
                return Err(Error::OutOfHostMemory(format!(
                    "host physical memory has {free:#x} bytes free of {cap:#x} (host RAM); \
                     {size:#x} asked"
                )));
            }
        }
        let charge = match location {
            PhysicalLocation::Device(d) => {
                Some(self.devmem.charge_on(d as usize, sub, size as u64)?)
            }
            PhysicalLocation::Host => None,
        };
        // On error the charge is dropped, so given back.
        let raw = backend.create_physical(location, size)?;
        let id = self.devmem.next_id();
        if location == PhysicalLocation::Host {
            self.host_used += size as u64;
        }
        self.physical.insert(
            id,
            PhysicalRec {
                raw,
                size,
                location,
                context,
                mapped: 0,
                charge,
                imported: false,
                ipc_types: None,
            },
        );
        Ok(PhysicalMemory { id, size })
    }

    /// Records `raw`, imported from an IPC export of a physical object (of this or another
    /// process), as a physical object of `context`: mappable and destroyable like any other.
    /// `charge` is the exported object's device charge when the export is this process's own
    /// (`crate::semantics::capacity`): the import holds it, so memory that is alive through an
    /// import in this process counts against its device until the last import (and export)
    /// of it goes; an import of another process's memory holds none (that process counts it).
    pub(crate) fn insert_imported(
        &mut self,
        raw: RawPhysical,
        context: u64,
        location: PhysicalLocation,
        size: usize,
        charge: Option<Arc<Charge>>,
    ) -> PhysicalMemory {
        let id = self.devmem.next_id();
        self.physical.insert(
            id,
            PhysicalRec {
                raw,
                size,
                location,
                context,
                mapped: 0,
                charge,
                ipc_types: None,
                imported: true,
            },
        );
        PhysicalMemory { id, size }
    }

    pub(crate) fn physical_of(&self, context: u64, id: u64) -> Result<&PhysicalRec> {
        match self.physical.get(&id) {
            Some(p) if p.context == context => Ok(p),
            _ => Err(Error::InvalidArgument(format!(
                "physical memory handle {id} is not a live object of this context"
            ))),
        }
    }

    /// `zePhysicalMemDestroy`: `HandleObjectInUse` while any page of it is mapped.
    pub(crate) fn destroy_physical(
        &mut self,
        backend: &dyn Backend,
        context: u64,
        id: u64,
    ) -> Result<()> {
        let p = self.physical_of(context, id)?;
        if p.mapped > 0 {
            return Err(Error::HandleObjectInUse(format!(
                "physical memory {id} still has {:#x} bytes mapped",
                p.mapped
            )));
        }
        let p = self.physical.remove(&id).expect("checked");
        // Device capacity comes back with the record's charge, unless an IPC export or view
        // still holds it (`crate::semantics::capacity`); an imported object gives back only
        // the exported object's charge it held, if that was the last holder.
        if p.location == PhysicalLocation::Host && !p.imported {
            self.host_used -= p.size as u64;
        }
        // SAFETY: the object is not mapped and is forgotten here.
        unsafe { backend.destroy_physical(p.raw) };
        Ok(())
    }

    /// `zeVirtualMemMap`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn map(
        &mut self,
        backend: &dyn Backend,
        context: u64,
        ptr: usize,
        size: usize,
        phys: u64,
        offset: usize,
        access: AccessAttribute,
    ) -> Result<()> {
        null_check(ptr, "map address")?;
        nonzero(size, "map size")?;
        let page = self.page_size(size);
        size_multiple(size, page, "map size")?;
        aligned(ptr, page, "map address")?;
        aligned(offset, page, "physical offset")?;
        let p = self.physical_of(context, phys)?;
        let (raw, phys_size) = (p.raw, p.size);
        if offset.checked_add(size).is_none_or(|e| e > phys_size) {
            return Err(Error::InvalidArgument(format!(
                "offset {offset:#x} + size {size:#x} is past the end of physical memory {phys} \
                 ({:#x} bytes)",
                phys_size
            )));
        }
        let base = self.containing_reservation(context, ptr, size)?;
        if let Some((s, e)) = self.mapped.last_overlap(ptr, ptr + size) {
            return Err(Error::InvalidArgument(format!(
                "range [{}, {}) overlaps the mapping [{}, {})",
                Addr(ptr),
                Addr(ptr + size),
                Addr(s),
                Addr(e.end)
            )));
        }
        let pages = self.reservations[&base].pages.clone();
        let gate = pages.exclusive();
        // SAFETY: validated: inside a reservation, unmapped, within the object.
        unsafe { backend.map(ptr, size, raw, offset, protection(access))? };
        pages.set_mapped(ptr, ptr + size, Some(access));
        drop(gate);
        self.physical.get_mut(&phys).expect("checked").mapped += size;
        self.mapped.insert(ptr, ptr + size, Mapped { phys, offset });
        self.mapped.join_neighbours(ptr);
        Ok(())
    }

    /// `zeVirtualMemUnmap`: the mapped pages of a base-page-aligned range inside one
    /// reservation are unmapped; pages of it that are not mapped stay so (a range with
    /// nothing mapped succeeds and changes nothing).
    pub(crate) fn unmap(
        &mut self,
        backend: &dyn Backend,
        context: u64,
        ptr: usize,
        size: usize,
    ) -> Result<()> {
        null_check(ptr, "unmap address")?;
        nonzero(size, "unmap size")?;
        self.check_base_aligned(ptr, size)?;
        let base = self.containing_reservation(context, ptr, size)?;
        // Fast path: exactly one whole mapped run.
        if let Some(phys) = self
            .mapped
            .get_exact(ptr)
            .filter(|e| e.end == ptr + size)
            .map(|e| e.value.phys)
        {
            let pages = self.reservations[&base].pages.clone();
            let _gate = pages.exclusive();
            // SAFETY: [ptr, ptr+size) is one mapped run.
            unsafe { backend.unmap(ptr, size)? };
            pages.set_mapped(ptr, ptr + size, None);
            self.mapped.remove_exact(ptr);
            if let Some(p) = self.physical.get_mut(&phys) {
                p.mapped -= size;
            }
            return Ok(());
        }
        if self.mapped.first_gap(ptr, ptr + size).is_none() {
            // Removing pages never makes two runs adjacent, so nothing to coalesce.
            return self.unmap_run(backend, ptr, ptr + size);
        }
        // Pages of the range that are not mapped stay so (the reference driver's answer, see
        // the module docs): only the mapped pieces are unmapped, each clipped to the range.
        let pieces: Vec<(usize, usize)> = self
            .mapped
            .overlapping(ptr, ptr + size)
            .map(|(s, e)| (s.max(ptr), e.end.min(ptr + size)))
            .collect();
        for (s, e) in pieces {
            self.unmap_run(backend, s, e)?;
        }
        Ok(())
    }

    /// Bases of the reservations of `context` (teardown waits for in-flight work on them).
    pub(crate) fn reservations_of(&self, context: u64) -> Vec<usize> {
        self.reservations
            .iter()
            .filter(|(_, r)| r.context == context)
            .map(|(&b, _)| b)
            .collect()
    }

    /// Everything of `context` goes: mappings, reservations, physical objects.
    pub(crate) fn release_context(&mut self, backend: &dyn Backend, context: u64) {
        let bases: Vec<(usize, usize)> = self
            .reservations
            .iter()
            .filter(|(_, r)| r.context == context)
            .map(|(&b, r)| (b, r.size))
            .collect();
        for (b, s) in bases {
            if let Err(e) = self.free(backend, context, b, s) {
                tracing::warn!("freeing reservation {} at context teardown: {e}", Addr(b));
            }
        }
        let ids: Vec<u64> = self
            .physical
            .iter()
            .filter(|(_, p)| p.context == context)
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            if let Err(e) = self.destroy_physical(backend, context, id) {
                tracing::warn!("destroying physical memory {id} at context teardown: {e}");
            }
        }
    }

    /// The page table of the reservation containing `addr`, which the caller knows exists.
    pub(crate) fn pages_at(&self, addr: usize) -> Arc<ReservationPages> {
        let (_, r) = self
            .reservations
            .range(..=addr)
            .next_back()
            .expect("inside a reservation");
        r.pages.clone()
    }

    /// The page tables of the reservations containing any of `addrs`, by base, once each:
    /// queue submission holds their gates while it checks access and records its references
    /// (see [`crate::semantics::access`]).
    pub(crate) fn gates_for(
        &self,
        addrs: impl IntoIterator<Item = usize>,
    ) -> Vec<Arc<ReservationPages>> {
        let mut v: Vec<Arc<ReservationPages>> = addrs
            .into_iter()
            .filter_map(|a| {
                let (&b, r) = self.reservations.range(..=a).next_back()?;
                (a < b + r.size).then(|| r.pages.clone())
            })
            .collect();
        v.sort_unstable_by_key(|p| p.base);
        v.dedup_by_key(|p| p.base);
        v
    }

    /// Mapped runs as counted before access attributes left [`Mapped`]: maximal runs of one
    /// physical object at consecutive offsets *and* one access attribute.
    fn mapped_runs(&self) -> usize {
        let mut runs = 0;
        for (s, e) in self.mapped.iter() {
            runs += 1;
            let mut prev = UNMAPPED;
            let mut at = s;
            while at < e.end {
                let p = self.pages_at(at);
                let stop = e.end.min(p.base + p.size);
                let (mut i, lim) = (p.index(at), p.index(stop));
                while i < lim {
                    let st = p.state(i);
                    if prev != UNMAPPED && st != prev {
                        runs += 1;
                    }
                    prev = st;
                    i = p.run_end(i, lim, st);
                }
                at = stop;
            }
        }
        runs
    }

    pub(crate) fn stats(&self) -> VmStats {
        VmStats {
            reservations: self.reservations.len(),
            reserved_bytes: self.reservations.values().map(|r| r.size).sum(),
            physical_objects: self.physical.len(),
            mapped_runs: self.mapped_runs(),
            mapped_bytes: self.mapped.iter().map(|(s, e)| e.end - s).sum(),
            devices: (0..self.devmem.len())
                .map(|i| DeviceUsage {
                    used: self.devmem.used(i),
                    capacity: self.devmem.capacity(i),
                })
                .collect(),
            host_physical_bytes: self.host_used,
        }
    }

    /// What lies at `ptr`, for `zeMemGetAllocProperties` / `zeMemGetAddressRange` (any context):
    /// the reservation containing it and, if its page is mapped, the physical object there.
    pub(crate) fn pointer_info(&self, ptr: usize) -> Option<VmPointer> {
        let (&base, r) = self.reservations.range(..=ptr).next_back()?;
        if ptr >= base + r.size {
            return None;
        }
        let mapped = self.mapped.get(ptr).and_then(|(_, e)| {
            let p = self.physical.get(&e.value.phys)?;
            Some((e.value.phys, p.location, self.page_size(p.size)))
        });
        Some(VmPointer {
            reservation: (base, r.size),
            mapped,
        })
    }

    /// IPC ([`crate::ipc`]): the backend handle, size, context and location of physical
    /// object `id`.
    pub(crate) fn physical_raw(
        &self,
        id: u64,
    ) -> Option<(RawPhysical, usize, u64, PhysicalLocation)> {
        self.physical
            .get(&id)
            .map(|p| (p.raw, p.size, p.context, p.location))
    }

    /// IPC ([`crate::ipc`]): the device capacity physical object `id` holds (none for host
    /// memory), for an export of it to hold too.
    pub(crate) fn physical_charge(&self, id: u64) -> Option<Arc<Charge>> {
        self.physical.get(&id)?.charge.clone()
    }

    /// IPC ([`crate::ipc`]): the handle types chained at the creation of physical object `id`.
    pub(crate) fn physical_ipc_types(&self, id: u64) -> Option<crate::spec::IpcHandleTypes> {
        self.physical.get(&id)?.ipc_types
    }

    /// IPC ([`crate::ipc`]): records the handle types chained at the creation of physical
    /// object `id` (of `context`); false if there is none.
    pub(crate) fn set_physical_ipc_types(
        &mut self,
        context: u64,
        id: u64,
        types: crate::spec::IpcHandleTypes,
    ) -> bool {
        match self.physical.get_mut(&id) {
            Some(p) if p.context == context => {
                p.ipc_types = Some(types);
                true
            }
            _ => false,
        }
    }

    /// IPC ([`crate::ipc`]): live physical objects with recorded handle types.
    pub(crate) fn ipc_typed(&self) -> usize {
        self.physical
            .values()
            .filter(|p| p.ipc_types.is_some())
            .count()
    }

    /// IPC ([`crate::ipc`]): the mapping at `ptr`, as `(start, length, physical id, offset
    /// into the object)`: the longest run of pages around `ptr` mapped contiguously from one
    /// physical object (whatever map calls made it), inside the reservation of `ptr`; `None`
    /// if the page of `ptr` is not mapped.
    pub(crate) fn mapping_at(&self, ptr: usize) -> Option<(usize, usize, u64, usize)> {
        let (s, e) = self.mapped.get(ptr)?;
        let (&base, r) = self.reservations.range(..=ptr).next_back()?;
        let (lo, hi) = (base, base + r.size);
        let (phys, offset) = (e.value.phys, e.value.offset);
        let (mut start, mut off, mut end) = (s, offset, e.end);
        while start > lo {
            match self.mapped.get(start - 1) {
                Some((ps, pe))
                    if pe.end == start
                        && pe.value.joins(start - ps, &Mapped { phys, offset: off }) =>
                {
                    off = pe.value.offset;
                    start = ps;
                }
                _ => break,
            }
        }
        while end < hi {
            match self.mapped.get(end) {
                Some((ns, ne))
                    if ns == end
                        && ne.value.phys == phys
                        && ne.value.offset == off + (end - start) =>
                {
                    end = ne.end;
                }
                _ => break,
            }
        }
        let (cs, ce) = (start.max(lo), end.min(hi));
        Some((cs, ce - cs, phys, off + (cs - start)))
    }

    /// IPC range export ([`crate::ipc`]): the mapped runs along `[start, end)` clipped to it, in
    /// address order, as `(physical id, offset into the object, length)`; `Err(addr)` names the
    /// first byte of `[start, end)` that is not mapped.
    pub(crate) fn mapped_pieces(
        &self,
        start: usize,
        end: usize,
    ) -> std::result::Result<Vec<(u64, usize, usize)>, usize> {
        let mut out = Vec::new();
        let mut at = start;
        for (s, e) in self.mapped.overlapping(start, end) {
            if s > at {
                return Err(at);
            }
            let stop = e.end.min(end);
            out.push((e.value.phys, e.value.offset + (at - s), stop - at));
            at = stop;
            if at >= end {
                return Ok(out);
            }
        }
        Err(at)
    }

    /// Whether any reservation overlaps `[start, end)` (imports of system memory must not).
    pub(crate) fn reservation_overlaps(&self, start: usize, end: usize) -> bool {
        matches!(self.reservations.range(..end).next_back(), Some((&b, r)) if b + r.size > start)
    }

    /// Device-side access check for queued copies and fills ([`crate::queue`]): `None` if `ptr`
    /// is in no reservation; otherwise `Some(Err(why))` unless `[ptr, end)` lies in that one
    /// reservation and every page of it is mapped with an access that allows reading (and
    /// writing if `write`). An empty range checks the page at `ptr`.
    pub(crate) fn check_device_access(
        &self,
        ptr: usize,
        end: usize,
        write: bool,
    ) -> Option<std::result::Result<(), String>> {
        let (&base, r) = self.reservations.range(..=ptr).next_back()?;
        let rend = base + r.size;
        if ptr >= rend {
            return None;
        }
        if end > rend {
            return Some(Err(format!(
                "[{}, {}) runs past the end {} of its reservation",
                Addr(ptr),
                Addr(end),
                Addr(rend)
            )));
        }
        let end = end.max(ptr + 1);
        // Read under the reservation's gate when the caller records references (queue
        // submission), so no set-access changes them until then.
        let p = &r.pages;
        let (mut i, lim) = (p.index(ptr), p.index(end - 1) + 1);
        while i < lim {
            let st = p.state(i);
            let at = (p.base + i * p.page()).max(ptr);
            if st == UNMAPPED {
                return Some(Err(format!("page at {} is not mapped", Addr(at))));
            }
            let access = crate::semantics::access::attr_of(st);
            let ok = match access {
                AccessAttribute::None => false,
                AccessAttribute::ReadOnly => !write,
                AccessAttribute::ReadWrite => true,
            };
            if !ok {
                return Some(Err(format!(
                    "page at {} has access {:?}, which does not allow {}",
                    Addr(at),
                    access,
                    if write { "writing" } else { "reading" }
                )));
            }
            i = p.run_end(i, lim, st);
        }
        Some(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_size_rule_64k_below_2m_and_2m_from_2m() {
        assert_eq!(page_size_for(4096, 1), PAGE_64K);
        assert_eq!(page_size_for(4096, PAGE_2M - 1), PAGE_64K);
        assert_eq!(page_size_for(4096, PAGE_2M), PAGE_2M);
        assert_eq!(page_size_for(4096, 1 << 40), PAGE_2M);
        // A device with 2 MiB granularity (CUDA) never answers less than 2 MiB.
        assert_eq!(page_size_for(PAGE_2M, 4096), PAGE_2M);
    }

    #[test]
    fn access_attribute_over_readonly_is_invalid_enumeration() {
        assert_eq!(AccessAttribute::from_raw(2), Ok(AccessAttribute::ReadOnly));
        assert_eq!(
            AccessAttribute::from_raw(3).unwrap_err().ze_result(),
            0x7800_000c
        );
    }

    #[test]
    fn physical_flags_over_0x3_are_invalid_enumeration() {
        assert_eq!(
            PhysicalMemoryFlags::from_raw(0),
            Ok(PhysicalMemoryFlags::AllocateOnDevice)
        );
        assert_eq!(
            PhysicalMemoryFlags::from_raw(2),
            Ok(PhysicalMemoryFlags::AllocateOnHost)
        );
        assert_eq!(
            PhysicalMemoryFlags::from_raw(4).unwrap_err().ze_result(),
            0x7800_000c
        );
        assert_eq!(
            PhysicalMemoryFlags::from_raw(3).unwrap_err().ze_result(),
            0x7800_0004
        );
    }
}
