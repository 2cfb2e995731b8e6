//! The public module of this family: its types (from the semantics module of the same name,
//! where the rules live) and the calls, as methods of [`crate::Context`] and [`crate::Driver`].

use std::collections::HashMap;

use std::sync::Arc;

use crate::api::runtime::{Context, Device, Driver};
use crate::error::{Addr, Error, Result};
use crate::semantics::inflight::InFlightRef;
pub use crate::semantics::ipc::*;
use crate::semantics::usm::{AllocDesc, MemoryType};
use crate::semantics::vmm::{PhysicalMemory, PhysicalMemoryFlags};

impl Driver {
    /// The state of this process's IPC broker (peers served now, worker threads alive, and
    /// the broker's bounds), for leak checks.
    pub fn ipc_broker_stats(&self) -> BrokerStats {
        self.shared.backend.broker_stats()
    }

    /// The bare transport under [`Context::open_ipc_handle`]: asks process `pid`'s broker
    /// (started with `nonce`, both read from a handle) about the 64 bytes `request`, accepting
    /// at most `max_payload` bytes and `max_fds` shareable handles, and returns the raw answer.
    /// No handle rule is applied (no decoding, no checks of what comes back): this is the
    /// baseline that benchmarks measure opens against, and a probe for tests of the broker.
    pub fn ipc_broker_request(
        &self,
        pid: u32,
        nonce: u32,
        request: &[u8; 64],
        max_payload: usize,
        max_fds: usize,
    ) -> std::result::Result<BrokerAnswer, TransportError> {
        self.shared
            .backend
            .broker_request(pid, nonce, request, max_payload, max_fds)
    }

    /// The name of process `pid`'s IPC broker started with `nonce` (an abstract Unix socket
    /// name on Linux), as error messages give it.
    pub fn ipc_broker_name(&self, pid: u32, nonce: u32) -> String {
        self.shared.backend.broker_name(pid, nonce)
    }

    /// Counters of this driver's IPC state: live exports, open views, and memory with recorded
    /// handle types. Not a Level Zero call. Takes the driver's locks for reading; never fails.
    pub fn ipc_stats(&self) -> IpcStats {
        let d = &self.shared;
        let me = Arc::as_ptr(d) as usize;
        // Lock order: usm before vm before the view table.
        let typed_allocations = d.usm.read().ipc_typed();
        let typed_physical = d.vm.read().ipc_typed();
        let views = IMPORTS.lock().values().filter(|r| r.driver == me).count();
        let exports = EXPORTS.lock().values().filter(|r| r.driver == me).count();
        IpcStats {
            exports,
            views,
            typed_allocations,
            typed_physical,
        }
    }

    /// Most `(physical object, offset, length)` pieces one range handle of this driver carries
    /// ([`crate::RuntimeBuilder::ipc_max_range_pieces`]; default
    /// [`DEFAULT_MAX_RANGE_PIECES`]). Not a Level Zero call.
    pub fn ipc_max_range_pieces(&self) -> usize {
        self.shared.ipc_max_range_pieces
    }
}

impl Context {
    /// `zeMemGetIpcHandle`: a handle for the allocation containing `ptr` (any byte of it; the
    /// view is the allocation's page-rounded size in bytes), or for the whole physical object
    /// mapped at `ptr` in a reservation.
    ///
    /// Errors: `InvalidNullPointer` for null; `InvalidArgument` for a pointer in no allocation
    /// of this context and no mapped page, or in imported system memory; as
    /// [`Context::get_ipc_handle_with_properties`] otherwise. Nothing changes on error.
    pub fn get_ipc_handle(&self, ptr: usize) -> Result<IpcHandle> {
        self.get_ipc_handle_with_properties(ptr, &IpcProperties::default())
    }

    /// `zeMemGetIpcHandleWithProperties`: as [`Context::get_ipc_handle`], with the chained
    /// handle-type descriptor and / or range descriptor (`props.range_size`: the handle then
    /// captures every physical object mapped along `[ptr, ptr+size)`, in address order; the
    /// importer's view is `size` bytes and starts at the byte `ptr` names).
    ///
    /// Errors: `InvalidNullPointer` for null; `InvalidEnumeration` / `UnsupportedFeature` for
    /// handle types (FABRIC_ACCESSIBLE is not supported on the host backend; a type not asked
    /// at creation); `InvalidArgument` for a pointer in no allocation of this context and no
    /// mapped page, or imported system memory. With a range (any start byte, any size: the
    /// handle shares the whole pages it touches and the importer's pointer is that of the
    /// range's first byte): `InvalidSize` for size 0, `InvalidArgument` for a range past the
    /// end of the address space or if memory that is not reserved VA overlaps the range (a
    /// USM allocation or import, a managed allocation, an opened IPC view),
    /// `AddressNotFound` naming the first byte not mapped to a physical object (an unmapped
    /// page of a reservation, or an address hetmem does not know), `UnsupportedSize` past
    /// [`Driver::ipc_max_range_pieces`] pieces, `UnsupportedFeature` if a physical object in
    /// the range was created with handle types that do not include the asked ones. Nothing
    /// changes on error (no export, no fd, no broker traffic).
    ///
    /// Units: `ptr` is an address, `props.range_size` bytes; the handle's view size
    /// ([`IpcHandle::size`]) is the allocation's page-rounded span, the whole physical object,
    /// or exactly the range size.
    pub fn get_ipc_handle_with_properties(
        &self,
        ptr: usize,
        props: &IpcProperties,
    ) -> Result<IpcHandle> {
        if ptr == 0 {
            return Err(Error::InvalidNullPointer("IPC pointer is null".into()));
        }
        let asked = props.handle_types.unwrap_or(IpcHandleTypes::DEFAULT);
        check_handle_types(asked, SUPPORTED_TYPES, None)?;
        if let Some(size) = props.range_size {
            return self.export_range(ptr, size, asked);
        }
        let drv = self.driver();
        let d = &drv.shared;
        let usm = d.usm.read();
        if let Some((_, span, kind, _, ctx, raw)) = usm.ipc_source(ptr) {
            if ctx != self.id() {
                return Err(Error::InvalidArgument(format!(
                    "{} is an allocation of another context",
                    Addr(ptr)
                )));
            }
            let Some(raw) = raw.filter(|_| kind != MemoryType::HostImported) else {
                return Err(Error::InvalidArgument(format!(
                    "{} is imported system memory, which has no shareable memory object",
                    Addr(ptr)
                )));
            };
            check_handle_types(asked, SUPPORTED_TYPES, usm.ipc_types(ptr))?;
            let parts = d.backend.export_allocation(raw)?;
            let capacity = usm.ipc_charge(ptr).into_iter().collect();
            drop(usm);
            let pieces = whole_pieces(&parts, span as u64);
            return register(
                d.backend.as_ref(),
                Arc::as_ptr(d) as usize,
                self.id(),
                IpcHandleKind::Allocation,
                kind,
                span,
                parts,
                pieces,
                1,
                (0, 0),
                capacity,
            );
        }
        drop(usm);
        let phys = d.vm.read().pointer_info(ptr).and_then(|v| v.mapped);
        match phys {
            Some((id, _, _)) => self.export_physical(id, asked),
            None => Err(Error::InvalidArgument(format!(
                "{} is in no allocation of this context and no mapped page of a reservation",
                Addr(ptr)
            ))),
        }
    }

    /// A handle for the whole physical memory object `phys` (`phys.size` bytes; the importer's
    /// view is the whole object, whether or not it is mapped anywhere).
    ///
    /// Spec: Level Zero 1.18 has no IPC call that takes a `ze_physical_mem_handle_t` (the
    /// handle is used by `zePhysicalMemGetProperties`, `zePhysicalMemDestroy` and
    /// `zeVirtualMemMap` only); this is issue 4's "IPC handle for a physical memory object",
    /// with the rules of `zeMemGetIpcHandleWithProperties` on a pointer into a mapping of the
    /// object (which exports the same thing) and the handle-type descriptor
    /// `ze_ipc_mem_handle_type_ext_desc_t` (memory extensions; chained at `zePhysicalMemCreate`,
    /// see [`Context::create_physical_memory_with_ipc_types`]). The spec's nearest route is
    /// `zePhysicalMemGetProperties` with `ze_external_memory_export_fd_t` plus
    /// `zeMemGetIpcHandleFromFileDescriptorExp`.
    ///
    /// Errors: `InvalidArgument` for an object that is not live in this context;
    /// `InvalidEnumeration` / `UnsupportedFeature` for handle types as
    /// [`Context::get_ipc_handle_with_properties`] (FABRIC_ACCESSIBLE; a type not chained at
    /// creation). Nothing changes on error.
    pub fn get_physical_memory_ipc_handle(
        &self,
        phys: PhysicalMemory,
        handle_types: Option<IpcHandleTypes>,
    ) -> Result<IpcHandle> {
        let asked = handle_types.unwrap_or(IpcHandleTypes::DEFAULT);
        check_handle_types(asked, SUPPORTED_TYPES, None)?;
        self.export_physical(phys.id, asked)
    }

    fn export_physical(&self, id: u64, asked: IpcHandleTypes) -> Result<IpcHandle> {
        let drv = self.driver();
        let d = &drv.shared;
        let vm = d.vm.read();
        let (raw, size, loc) = match vm.physical_raw(id) {
            Some((raw, size, ctx, loc)) if ctx == self.id() => (raw, size, loc),
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "physical memory {id} is not a live object of this context"
                )))
            }
        };
        check_handle_types(asked, SUPPORTED_TYPES, vm.physical_ipc_types(id))?;
        let parts = d.backend.export_physical(raw)?;
        let capacity = vm.physical_charge(id).into_iter().collect();
        drop(vm);
        let pieces = whole_pieces(&parts, size as u64);
        register(
            d.backend.as_ref(),
            Arc::as_ptr(d) as usize,
            self.id(),
            IpcHandleKind::Physical,
            location_type(loc),
            size,
            parts,
            pieces,
            1,
            (0, 0),
            capacity,
        )
    }

    /// The range export of [`Context::get_ipc_handle_with_properties`]; `asked` has passed the
    /// backend check and is checked against every object's types here.
    fn export_range(&self, ptr: usize, size: usize, asked: IpcHandleTypes) -> Result<IpcHandle> {
        if size == 0 {
            return Err(Error::InvalidSize("IPC range size is 0".into()));
        }
        let page = mapping_granularity(self.driver_shared().backend.as_ref());
        let end = ptr.checked_add(size).ok_or_else(|| {
            Error::InvalidArgument(format!("IPC range {} + {size:#x} overflows", Addr(ptr)))
        })?;
        // The range may start and end at any byte ("an arbitrary offset within a mapped
        // range"); what travels is the whole pages it touches, with the bytes before and after.
        let first = ptr / page * page;
        let last = end.checked_next_multiple_of(page).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "IPC range {} + {size:#x} ends in the last page of the address space",
                Addr(ptr)
            ))
        })?;
        let lead = (ptr - first) as u32;
        let tail = (last - end) as u32;
        let drv = self.driver();
        let d = &drv.shared;
        // Memory that is not reserved VA: managed (its lock is never held with usm or vm, so
        // asked first), IPC views, USM allocations and imports -> InvalidArgument.
        if let Some((s, e)) = d.managed.overlapping(ptr, end) {
            return Err(Error::InvalidArgument(format!(
                "IPC range [{}, {}) includes the managed allocation [{}, {}); range handles \
                 cover reserved VA mapped to physical memory only",
                Addr(ptr),
                Addr(end),
                Addr(s),
                Addr(e)
            )));
        }
        // Lock order: usm before vm before the view table.
        let usm = d.usm.read();
        if let Some((s, e)) = view_overlapping(ptr, end) {
            return Err(Error::InvalidArgument(format!(
                "IPC range [{}, {}) includes the opened IPC view [{}, {}); range handles cover \
                 reserved VA mapped to physical memory only",
                Addr(ptr),
                Addr(end),
                Addr(s),
                Addr(e)
            )));
        }
        if let Some((s, e)) = usm.overlapping(ptr, end) {
            return Err(Error::InvalidArgument(format!(
                "IPC range [{}, {}) includes the USM allocation [{}, {}); range handles cover \
                 reserved VA mapped to physical memory only",
                Addr(ptr),
                Addr(end),
                Addr(s),
                Addr(e)
            )));
        }
        let vm = d.vm.read();
        drop(usm);
        let runs = vm.mapped_pieces(first, last).map_err(|hole| {
            Error::AddressNotFound(format!(
                "IPC range [{}, {}) is not fully mapped: {} is not mapped to physical memory",
                Addr(ptr),
                Addr(end),
                Addr(hole.clamp(ptr, end - 1))
            ))
        })?;
        let limit = d.ipc_max_range_pieces;
        let run_count = runs.len();
        if runs.len() > limit {
            return Err(Error::UnsupportedSize(format!(
                "IPC range [{}, {}) has {} mapped pieces; a range handle carries at most {limit}",
                Addr(ptr),
                Addr(end),
                runs.len()
            )));
        }
        // Each object is exported once, as parts (one on the host, one per granule on a GPU);
        // `index` maps it to its first part and its parts' sizes.
        let mut index: HashMap<u64, (u32, std::ops::Range<usize>)> = HashMap::new();
        let mut mem = MemoryType::Device;
        let mut parts: Vec<crate::backend::SharedPart> = Vec::new();
        let mut part_sizes: Vec<u64> = Vec::new();
        let mut capacity = Vec::new();
        let mut pieces = Vec::with_capacity(runs.len());
        for (phys, offset, len) in runs {
            let (first, sizes) = match index.get(&phys) {
                Some(x) => x.clone(),
                None => {
                    let raw = match vm.physical_raw(phys) {
                        Some((raw, _, ctx, loc)) if ctx == self.id() => {
                            if parts.is_empty() {
                                mem = location_type(loc);
                            }
                            raw
                        }
                        _ => {
                            return Err(Error::InvalidArgument(format!(
                                "IPC range [{}, {}) maps physical memory {phys} of another \
                                 context",
                                Addr(ptr),
                                Addr(end)
                            )))
                        }
                    };
                    check_handle_types(asked, SUPPORTED_TYPES, vm.physical_ipc_types(phys))
                        .map_err(|e| {
                            Error::UnsupportedFeature(format!(
                                "IPC range [{}, {}) maps physical memory {phys}: {}",
                                Addr(ptr),
                                Addr(end),
                                e.message()
                            ))
                        })?;
                    let exported = d.backend.export_physical(raw)?;
                    capacity.extend(vm.physical_charge(phys));
                    let first = parts.len() as u32;
                    let sizes = part_sizes.len()..part_sizes.len() + exported.len();
                    part_sizes.extend(exported.iter().map(|p| p.size));
                    parts.extend(exported);
                    index.insert(phys, (first, sizes.clone()));
                    (first, sizes)
                }
            };
            pieces.extend(run_pieces(
                &part_sizes[sizes],
                first,
                offset as u64,
                len as u64,
            ));
        }
        drop(vm);
        // Only the parts a piece names travel; the others are closed here.
        let mut used = vec![false; parts.len()];
        for p in &pieces {
            used[p.obj as usize] = true;
        }
        let mut renumber = vec![0u32; parts.len()];
        let mut kept = Vec::with_capacity(parts.len());
        for (i, (part, u)) in parts.into_iter().zip(used).enumerate() {
            if u {
                renumber[i] = kept.len() as u32;
                kept.push(part);
            }
        }
        for p in &mut pieces {
            p.obj = renumber[p.obj as usize];
        }
        register(
            d.backend.as_ref(),
            Arc::as_ptr(d) as usize,
            self.id(),
            IpcHandleKind::Range,
            mem,
            last - first,
            kept,
            pieces,
            run_count,
            (lead, tail),
            capacity,
        )
    }

    /// `zeMemOpenIpcHandle`: maps what `handle` shares into a fresh range of this process and
    /// returns its start. Works in any process of the exporter's uid, the exporter included;
    /// every call gives a new pointer. `flags` are `ze_ipc_memory_flags_t` (BIAS_CACHED,
    /// BIAS_UNCACHED: accepted, no effect on the host backend). The view stays valid until
    /// [`Context::close_ipc_handle`], even if the exporter frees the memory or exits.
    ///
    /// Units: the view is the handle's size in bytes ([`IpcHandle::size`]), aligned to the
    /// driver's page size for that size.
    ///
    /// Errors: `InvalidEnumeration` for flags over 0x3; `InvalidArgument` for bytes that are
    /// not a handle, a handle that was put or whose context is gone, a wrong token, a vanished
    /// exporter (for a handle the fd transport cannot serve), a received fd that is not a
    /// sealed memfd large enough; `UnsupportedSize` for a range handle claiming more pieces
    /// than this driver's [`Driver::ipc_max_range_pieces`]; `OutOfHostMemory` if the OS
    /// refuses. Nothing changes on error (no view, no fd kept).
    pub fn open_ipc_handle(&self, handle: &IpcHandle, flags: u32) -> Result<usize> {
        if flags > (IPC_MEMORY_FLAG_BIAS_CACHED | IPC_MEMORY_FLAG_BIAS_UNCACHED) {
            return Err(Error::InvalidEnumeration(format!(
                "IPC memory flags {flags:#x} exceed BIAS_CACHED | BIAS_UNCACHED (0x3)"
            )));
        }
        let h = decode(handle)?;
        let drv = self.driver();
        let d = &drv.shared;
        let m = material(d.backend.as_ref(), &h, handle, d.ipc_max_range_pieces)?;
        validate(d.backend.as_ref(), &m)?;
        // A range starting or ending inside a page: the view maps the whole pages, the range is
        // what lies between the bytes before and after it.
        let (lead, tail) = (h.lead as usize, h.tail as usize);
        if lead + tail >= m.size {
            return Err(Error::InvalidArgument(format!(
                "the handle trims {lead:#x} + {tail:#x} bytes off a view of {:#x}",
                m.size
            )));
        }
        let align = d.vm.read().page_size(m.size);
        let map_size = m.size;
        let capacity = m.capacity.clone();
        let base = map_view(d.backend.as_ref(), align, m)?;
        IMPORTS.lock().insert(
            base + lead,
            ImportRec {
                size: map_size - lead - tail,
                map_base: base,
                map_size,
                context: self.id(),
                driver: Arc::as_ptr(d) as usize,
                mem: h.mem,
                id: crate::semantics::capacity::fresh_id(),
                page_size: align,
                capacity,
            },
        );
        Ok(base + lead)
    }

    /// Imports the physical memory object a physical-object handle shares (from
    /// [`Context::get_physical_memory_ipc_handle`], in this or another process) as a physical
    /// object of this context, to be mapped with [`Context::map`] wherever the caller reserved
    /// address space and released with [`Context::destroy_physical_memory`] (ACL's
    /// `aclrtMemImportFromShareableHandle`, CUDA's `cuMemImportFromShareableHandle`; Level
    /// Zero has no such call). The object is `handle.size()` bytes, on `device` if the exported
    /// memory was device memory (else host memory), and is charged to no capacity (the
    /// exporter's object is). It stays valid, and so do its mappings, after the exporter
    /// destroys its object or exits. Transports as [`Context::open_ipc_handle`] (the exporter
    /// must be alive unless the handle's fd is valid here).
    ///
    /// Errors: `InvalidArgument` for bytes that are not a handle, a handle of an allocation or
    /// a range (not one physical object), a handle that was put, a wrong token, a vanished
    /// exporter, a received shareable handle this backend cannot import or too small;
    /// `InvalidNullHandle` for a device of another driver; `OutOfHostMemory` if the OS refuses.
    /// Nothing changes on error.
    pub fn import_physical_memory(
        &self,
        handle: &IpcHandle,
        device: &Device,
    ) -> Result<PhysicalMemory> {
        self.check_device(device)?;
        let h = decode(handle)?;
        if h.kind != IpcHandleKind::Physical {
            return Err(Error::InvalidArgument(format!(
                "the handle shares {:?}, not one physical memory object",
                h.kind
            )));
        }
        let d = self.driver_shared();
        let m = material(d.backend.as_ref(), &h, handle, d.ipc_max_range_pieces)?;
        validate(d.backend.as_ref(), &m)?;
        let size = m.size;
        // A physical object travels as its parts, whole and in order.
        let whole = m.pieces.len() == m.fds.len()
            && m.pieces
                .iter()
                .enumerate()
                .all(|(i, p)| p.obj as usize == i && p.offset == 0);
        if !whole || m.fds.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "the export of a physical object must be its {} parts whole and in order",
                m.fds.len()
            )));
        }
        let parts = m
            .fds
            .into_iter()
            .zip(m.sizes)
            .map(|(fd, size)| crate::backend::SharedPart { fd, size })
            .collect();
        let raw = d.backend.import_physical(parts)?;
        let location = match h.mem {
            MemoryType::Device => crate::backend::PhysicalLocation::Device(device.ordinal()),
            _ => crate::backend::PhysicalLocation::Host,
        };
        let phys = d.vm.write().insert_imported(raw, self.id(), location, size);
        Ok(phys)
    }

    /// `zeMemCloseIpcHandle`: unmaps the view that [`Context::open_ipc_handle`] returned at
    /// `ptr`. No fd stays open for a view, so nothing else is released. Blocks until no queued
    /// or running copy or fill references the view (waiting with no lock held).
    ///
    /// Errors: `InvalidNullPointer` for null; `InvalidArgument` for a pointer that is not the
    /// start of an open view of this context (interior pointers, closed views, other
    /// contexts' views, any other memory). Nothing changes on error.
    pub fn close_ipc_handle(&self, ptr: usize) -> Result<()> {
        if ptr == 0 {
            return Err(Error::InvalidNullPointer("pointer to close is null".into()));
        }
        let drv = self.driver();
        let inflight = &drv.shared.inflight;
        let mut im = loop {
            let im = IMPORTS.lock();
            match im.get(&ptr) {
                Some(r) if r.context == self.id() => {}
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "{} is not a pointer returned by open_ipc_handle in this context",
                        Addr(ptr)
                    )))
                }
            }
            if !inflight.is_referenced_ref(InFlightRef::View(ptr)) {
                break im;
            }
            drop(im);
            inflight.wait_unreferenced_ref(InFlightRef::View(ptr));
        };
        let r = im.get(&ptr).expect("checked under this lock");
        let (base, size) = (r.map_base, r.map_size);
        // SAFETY: the whole view we mapped at open.
        unsafe {
            drv.shared
                .backend
                .release_mapped(base, size, &[(base, base + size)])?
        };
        im.remove(&ptr);
        Ok(())
    }

    /// `zeMemPutIpcHandle`: releases what the export of `handle` holds (its fds; the memory
    /// goes once nothing else holds it). Views already opened stay valid; later opens fail.
    ///
    /// Errors: `InvalidArgument` for bytes that are not a handle (forged, corrupted), a handle
    /// exported by another process or context, one already put, or one whose context is gone.
    /// Nothing changes on error.
    pub fn put_ipc_handle(&self, handle: &IpcHandle) -> Result<()> {
        let h = decode(handle)?;
        if h.pid != own_pid() {
            return Err(Error::InvalidArgument(format!(
                "handle was exported by process {}, not this one ({})",
                h.pid,
                own_pid()
            )));
        }
        let mut ex = EXPORTS.lock();
        match ex.get(&h.id) {
            Some(r) if r.context == self.id() && token_eq(&r.token, &h.token) => {}
            Some(_) => {
                return Err(Error::InvalidArgument(format!(
                    "export {} belongs to another context or the token is wrong",
                    h.id
                )))
            }
            None => {
                return Err(Error::InvalidArgument(format!(
                    "export {} was already put or never existed",
                    h.id
                )))
            }
        }
        let rec = ex.remove(&h.id).expect("checked");
        drop(ex);
        drop(rec);
        Ok(())
    }

    /// `zeMemGetIpcHandleFromFileDescriptorExp`: the IPC handle for the memory behind `fd`, a
    /// file descriptor of this process (as `zeMemGetFileDescriptorFromIpcHandleExp` gave it, or
    /// as received from another process with `SCM_RIGHTS`).
    ///
    /// If `fd` is the shareable handle of a live export of this context (same identity as the
    /// export's first handle), the handle is that export's, with `fd` in bytes 0..4. Otherwise
    /// the handle describes the memory behind `fd` alone: kind allocation, memory type device,
    /// no exporter (pid 0, so opening it never contacts a broker), view size the memory's size;
    /// opening it maps `fd` through the fd transport (see the module docs), which checks it
    /// again.
    ///
    /// Errors: `InvalidArgument` for a negative fd, an fd that is not open, not a shareable
    /// handle this backend imports (on the host: a memfd sealed against grow and shrink), or
    /// empty; `UnsupportedFeature` on a backend whose fds carry no identity (cuda: see
    /// `Backend::shareable_fds_have_identity`). Nothing changes (no fd is kept or closed).
    pub fn ipc_handle_from_fd(&self, fd: i32) -> Result<IpcHandle> {
        if fd < 0 {
            return Err(Error::InvalidArgument(format!(
                "file descriptor {fd} is negative"
            )));
        }
        let backend = self.driver_shared().backend.as_ref();
        if !backend.shareable_fds_have_identity() {
            // SAFETY: only inspected; a number that is not open fails.
            check_received_fd(
                backend,
                unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
                1,
            )?;
            return Err(Error::UnsupportedFeature(format!(
                "the {} backend's shareable handles cannot be traced back to their memory from \
                 the fd alone (every one is a descriptor of the same device file); open the \
                 IPC handle itself instead",
                backend.name()
            )));
        }
        // SAFETY: only inspected (identity, checks); a number that is not open fails.
        let b = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let id = backend
            .shareable_identity(b)
            .ok_or_else(|| Error::InvalidArgument(format!("file descriptor {fd} is not open")))?;
        check_received_fd(backend, b, 1)?;
        let dev32 = u32::try_from(id.dev).map_err(|_| {
            Error::InvalidArgument(format!(
                "st_dev {:#x} of fd {fd} does not fit 32 bits",
                id.dev
            ))
        })?;
        {
            let ex = EXPORTS.lock();
            for (&eid, rec) in ex.iter() {
                if rec.kind == IpcHandleKind::Range || rec.context != self.id() {
                    continue;
                }
                let first = rec.fds.first().expect("an export has an fd");
                let same = backend
                    .shareable_identity(std::os::fd::AsFd::as_fd(first))
                    .is_some_and(|f| f.dev == id.dev && f.ino == id.ino);
                if same {
                    let nonce = start_broker(backend)?;
                    return Ok(encode(
                        fd,
                        &Decoded {
                            kind: rec.kind,
                            mem: rec.mem,
                            pid: own_pid(),
                            nonce,
                            id: eid,
                            token: rec.token,
                            size: rec.size,
                            ino: id.ino,
                            dev: dev32,
                            pieces: 1,
                            lead: 0,
                            tail: 0,
                        },
                    ));
                }
            }
        }
        Ok(encode(
            fd,
            &Decoded {
                kind: IpcHandleKind::Allocation,
                mem: MemoryType::Device,
                pid: 0,
                nonce: 0,
                id: 0,
                token: [0; 16],
                size: id.size,
                ino: id.ino,
                dev: dev32,
                pieces: 1,
                lead: 0,
                tail: 0,
            },
        ))
    }

    /// `zeMemAllocDevice` with `ze_ipc_mem_handle_type_ext_desc_t` chained: the same as
    /// [`Context::alloc_device`] with [`AllocDesc::ipc_types`] set, recording the handle types
    /// the memory must support.
    ///
    /// The types are kept on the allocation's record (under the same lock as the allocation,
    /// so no get can see it without them) and go with it ([`IpcStats::typed_allocations`]).
    /// Units, alignment: as [`Context::alloc_device`].
    ///
    /// Errors: as [`Context::alloc_device`]; `UnsupportedFeature` for FABRIC_ACCESSIBLE (not
    /// supported on the host backend), before anything is allocated (decode C flags with
    /// [`IpcHandleTypes::from_raw`]: `InvalidEnumeration` over 0x3).
    pub fn alloc_device_with_ipc_types(
        &self,
        device: &Device,
        desc: &AllocDesc,
        types: IpcHandleTypes,
    ) -> Result<usize> {
        self.alloc_device(device, &desc.ipc_types(types))
    }

    /// `zeMemAllocHost` with `ze_ipc_mem_handle_type_ext_desc_t` chained: as
    /// [`Context::alloc_host`] (units, alignment), recording the handle types on the
    /// allocation's record as [`Context::alloc_device_with_ipc_types`] does.
    ///
    /// Errors: as [`Context::alloc_host`]; `UnsupportedFeature` for FABRIC_ACCESSIBLE, before
    /// anything is allocated.
    pub fn alloc_host_with_ipc_types(
        &self,
        desc: &AllocDesc,
        types: IpcHandleTypes,
    ) -> Result<usize> {
        self.alloc_host(&desc.ipc_types(types))
    }

    /// `zePhysicalMemCreate` with `ze_ipc_mem_handle_type_ext_desc_t` chained: as
    /// [`Context::create_physical_memory`], recording the handle types on the object's record
    /// (under the same lock; they go with the object, [`IpcStats::typed_physical`]). Units:
    /// `size` in bytes, as [`Context::create_physical_memory`].
    ///
    /// Errors: as [`Context::create_physical_memory`]; `UnsupportedFeature` for
    /// FABRIC_ACCESSIBLE, before anything is created.
    pub fn create_physical_memory_with_ipc_types(
        &self,
        device: Option<&Device>,
        flags: PhysicalMemoryFlags,
        size: usize,
        types: IpcHandleTypes,
    ) -> Result<PhysicalMemory> {
        check_handle_types(types, SUPPORTED_TYPES, None)?;
        if let Some(dev) = device {
            self.check_device(dev)?;
        }
        let d = self.driver_shared();
        let mut vm = d.vm.write();
        let p = vm.create_physical(
            d.backend.as_ref(),
            self.id(),
            device.map(|x| x.ordinal()),
            flags,
            size,
        )?;
        vm.set_physical_ipc_types(self.id(), p.id, types);
        Ok(p)
    }
}
