//! Export: the handles of `zeMemGetIpcHandle` / `zeMemGetIpcHandleWithProperties` for an
//! allocation ([`get`]), a physical memory object ([`physical`]) and a whole virtual-address
//! range of several physical objects ([`range`], `ze_ipc_phys_mem_handle_range_ext_desc_t`),
//! the registration of each export ([`register`]: its fds, token and id in the export table,
//! the broker started), and physical memory created with handle types
//! ([`create_physical_with_types`]).
//!
//! # Rules
//! - Get: null -> `InvalidNullPointer`; a pointer in no allocation and no mapped page ->
//!   `InvalidArgument`; an import of system memory (no memfd) -> `InvalidArgument`. A pointer
//!   inside an allocation exports the whole allocation (of this context, else
//!   `InvalidArgument`); a pointer in a mapped page of a reservation exports the mapping there
//!   (the longest run of pages around it mapped contiguously from one physical object, inside
//!   its reservation): the whole physical object if the mapping is all of it from offset 0
//!   (as `Context::get_physical_memory_ipc_handle` does), else a range handle of the mapping,
//!   whose importer sees the bytes the exporter sees there (the mapped offset respected).
//!   One export per memory: the first get of an allocation, physical object or mapping makes
//!   an export that holds the memory; every later get of the same memory returns the same
//!   handle and counts on that export, each `Context::put_ipc_handle` counts one down, and the
//!   last put (or the context going) releases it (the reference driver's refcounted handles:
//!   get N times, put N times, every put `SUCCESS`). Handle types:
//!   [`crate::semantics::ipc::handle_types`].
//! - Range (`range_size` set): null -> `InvalidNullPointer`; size 0 -> `InvalidSize`; a range
//!   past the end of the address space -> `InvalidArgument`. The range may start at any byte
//!   and have any size (the spec: "the caller may start at an arbitrary offset within a mapped
//!   range"): its pieces cover the whole pages it touches, the handle carries the bytes of
//!   the first page before it and of the last page after it. Then, over the whole range:
//!   any byte in memory that is not reserved VA (a managed allocation of this driver, an IPC
//!   view opened in this process, a USM allocation or import of this driver; asked in that
//!   order) -> `InvalidArgument` naming it; otherwise any byte not mapped to a physical object
//!   (an unmapped page of a reservation, or an address hetmem does not know at all) ->
//!   `AddressNotFound` naming the first such byte; more than `Driver::ipc_max_range_pieces`
//!   pieces (a per-driver setting, `RuntimeBuilder::ipc_max_range_pieces`) ->
//!   `UnsupportedSize` naming the limit; a physical object of another context ->
//!   `InvalidArgument`; one created with handle types that lack the asked ones ->
//!   `UnsupportedFeature`. The list is a snapshot. Nothing changes on error (no export, no fd,
//!   no broker traffic).
//! - Lock order: `managed` (alone, first), then `usm` -> `vm` -> the view table; the backend's
//!   exports are made under `vm` (read), the export table taken after it is dropped.

use crate::backend::ipc::{AsFd, OwnedFd};
use std::collections::HashMap;
use std::sync::Arc;

use crate::backend::{PhysicalLocation, RawPhysical, SharedPart};
use crate::error::{Addr, Error, Result};
use crate::semantics::capacity::Charge;
use crate::semantics::checks::null_check;
use crate::semantics::driver::{DeviceRef, DriverShared};
use crate::semantics::ipc::broker::start_broker;
use crate::semantics::ipc::format::{encode, run_pieces, whole_pieces, Decoded, IpcHandle, Piece};
use crate::semantics::ipc::handle_types::check_asked;
use crate::semantics::ipc::registry::{
    driver_id, fresh_export_id, own_pid, ExportRec, Source, EXPORTS,
};
use crate::semantics::ipc::views::{mapping_granularity, view_overlapping};
use crate::semantics::usm::MemoryType;
use crate::semantics::vmm::{PhysicalMemory, PhysicalMemoryFlags};
use crate::spec::{IpcHandleKind, IpcHandleTypes, IpcProperties};

/// The memory type a physical object's location reports.
pub(crate) fn location_type(loc: PhysicalLocation) -> MemoryType {
    match loc {
        PhysicalLocation::Device(_) => MemoryType::Device,
        PhysicalLocation::Host => MemoryType::Host,
    }
}

/// `zeMemGetIpcHandleWithProperties` (and `zeMemGetIpcHandle`, with default properties) in
/// context `context` of driver `d`: the allocation containing `ptr`, the physical object
/// mapped at `ptr`, or with `props.range_size` the range from `ptr` ([`range`]).
///
/// Errors: see the module docs.
pub(crate) fn get(
    d: &DriverShared,
    context: u64,
    ptr: usize,
    props: &IpcProperties,
) -> Result<IpcHandle> {
    null_check(ptr, "IPC pointer")?;
    // No handle-type descriptor: no type asked (the memory's handle, whatever its types).
    let asked = props.handle_types;
    check_asked(asked, None)?;
    if let Some(size) = props.range_size {
        return range(d, context, ptr, size, asked);
    }
    let usm = d.usm.read();
    if let Some((_, span, kind, uid, ctx, raw)) = usm.ipc_source(ptr) {
        if ctx != context {
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
        check_asked(asked, usm.ipc_types(ptr))?;
        let source = Source::Allocation(uid);
        if let Some(h) = EXPORTS.lock().reuse(source) {
            return Ok(h);
        }
        let parts = d.backend.export_allocation(raw)?;
        let capacity = usm.ipc_charge(ptr).into_iter().collect();
        drop(usm);
        let pieces = whole_pieces(&parts, span as u64);
        return register(
            d,
            context,
            IpcHandleKind::Allocation,
            kind,
            span,
            parts,
            pieces,
            1,
            (0, 0),
            capacity,
            Some(source),
        );
    }
    drop(usm);
    let mapping = {
        let vm = d.vm.read();
        vm.mapping_at(ptr)
            .map(|(start, len, id, offset)| (start, len, id, offset, vm.physical_raw(id)))
    };
    match mapping {
        // The whole object, from its first byte: the object's own export.
        Some((_, len, id, 0, Some((_, size, _, _)))) if len == size => {
            export_physical(d, context, id, asked)
        }
        Some((start, len, id, offset, _)) => {
            export_mapping(d, context, start, len, id, offset, asked)
        }
        None => Err(Error::InvalidArgument(format!(
            "{} is in no allocation of this context and no mapped page of a reservation",
            Addr(ptr)
        ))),
    }
}

/// The export of a mapping that is not its whole object from offset 0 (`len` bytes at VA
/// `start`, of physical object `id` from `offset`): a range handle of the mapping, so that the
/// importer sees the bytes the exporter sees there (case 8 of `shared/cases/level-zero.md`;
/// the reference driver since 2026, and the range extension's text for range handles). Gets of
/// the same mapping count on one export.
fn export_mapping(
    d: &DriverShared,
    context: u64,
    start: usize,
    len: usize,
    id: u64,
    offset: usize,
    asked: Option<IpcHandleTypes>,
) -> Result<IpcHandle> {
    {
        let vm = d.vm.read();
        match vm.physical_raw(id) {
            Some((_, _, ctx, _)) if ctx == context => {}
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "{} maps physical memory {id}, which is not a live object of this context",
                    Addr(start)
                )))
            }
        }
        check_asked(asked, vm.physical_ipc_types(id))?;
    }
    let source = Source::Mapping {
        phys: id,
        offset: offset as u64,
        len: len as u64,
    };
    if let Some(h) = EXPORTS.lock().reuse(source) {
        return Ok(h);
    }
    range_of(d, context, start, len, asked, Some(source))
}

/// `Context::get_physical_memory_ipc_handle`: a handle for the whole physical object `id` of
/// context `context` (the importer's view is the whole object, mapped anywhere or not).
///
/// Errors: `InvalidArgument` for an object that is not live in this context;
/// `UnsupportedFeature` for a handle type asked that was not chained at creation.
pub(crate) fn physical(
    d: &DriverShared,
    context: u64,
    id: u64,
    handle_types: Option<IpcHandleTypes>,
) -> Result<IpcHandle> {
    check_asked(handle_types, None)?;
    export_physical(d, context, id, handle_types)
}

/// The export of physical object `id`; `asked` has passed the backend check.
fn export_physical(
    d: &DriverShared,
    context: u64,
    id: u64,
    asked: Option<IpcHandleTypes>,
) -> Result<IpcHandle> {
    let vm = d.vm.read();
    let (raw, size, loc) = match vm.physical_raw(id) {
        Some((raw, size, ctx, loc)) if ctx == context => (raw, size, loc),
        _ => {
            return Err(Error::InvalidArgument(format!(
                "physical memory {id} is not a live object of this context"
            )))
        }
    };
    check_asked(asked, vm.physical_ipc_types(id))?;
    let source = Source::Physical(id);
    if let Some(h) = EXPORTS.lock().reuse(source) {
        return Ok(h);
    }
    // No covered ranges: the importer may map any piece of the object.
    let parts = d.backend.export_physical(raw, &[])?;
    let capacity = vm.physical_charge(id).into_iter().collect();
    drop(vm);
    let pieces = whole_pieces(&parts, size as u64);
    register(
        d,
        context,
        IpcHandleKind::Physical,
        location_type(loc),
        size,
        parts,
        pieces,
        1,
        (0, 0),
        capacity,
        Some(source),
    )
}

/// The range export of [`get`] (`ze_ipc_phys_mem_handle_range_ext_desc_t`): every physical
/// object mapped along `[ptr, ptr+size)`, in address order; `asked` has passed the backend
/// check and is checked against every object's types here. Errors: see the module docs.
pub(crate) fn range(
    d: &DriverShared,
    context: u64,
    ptr: usize,
    size: usize,
    asked: Option<IpcHandleTypes>,
) -> Result<IpcHandle> {
    range_of(d, context, ptr, size, asked, None)
}

/// [`range`], registered with `source` (a mapping's export, counted per get) or without (an
/// explicit range handle: each get its own export).
fn range_of(
    d: &DriverShared,
    context: u64,
    ptr: usize,
    size: usize,
    asked: Option<IpcHandleTypes>,
    source: Option<Source>,
) -> Result<IpcHandle> {
    if size == 0 {
        return Err(Error::InvalidSize("IPC range size is 0".into()));
    }
    let page = mapping_granularity(d.backend.as_ref());
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
    // The objects in order of first appearance, each with every run of it in the range:
    // checked first (nothing is exported unless all pass), then each exported once with its
    // runs, which tell the backend what the importer will map (on a GPU an allocation that
    // every run touching it covers whole travels whole, else as one part per granule).
    let mut mem = MemoryType::Device;
    let mut objects: Vec<(u64, RawPhysical)> = Vec::new();
    let mut covered: Vec<Vec<(usize, usize)>> = Vec::new();
    let mut at: HashMap<u64, usize> = HashMap::new();
    for &(phys, offset, len) in &runs {
        if let Some(&i) = at.get(&phys) {
            covered[i].push((offset, len));
            continue;
        }
        let raw = match vm.physical_raw(phys) {
            Some((raw, _, ctx, loc)) if ctx == context => {
                if objects.is_empty() {
                    mem = location_type(loc);
                }
                raw
            }
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "IPC range [{}, {}) maps physical memory {phys} of another context",
                    Addr(ptr),
                    Addr(end)
                )))
            }
        };
        check_asked(asked, vm.physical_ipc_types(phys)).map_err(|e| {
            Error::UnsupportedFeature(format!(
                "IPC range [{}, {}) maps physical memory {phys}: {}",
                Addr(ptr),
                Addr(end),
                e.message()
            ))
        })?;
        at.insert(phys, objects.len());
        objects.push((phys, raw));
        covered.push(vec![(offset, len)]);
    }
    // `index` maps each object to its first part and its parts' sizes.
    let mut index: HashMap<u64, (u32, std::ops::Range<usize>)> = HashMap::new();
    let mut parts: Vec<crate::backend::SharedPart> = Vec::new();
    let mut part_sizes: Vec<u64> = Vec::new();
    let mut capacity = Vec::new();
    for (&(phys, raw), covered) in objects.iter().zip(&covered) {
        let exported = d.backend.export_physical(raw, covered)?;
        capacity.extend(vm.physical_charge(phys));
        let first = parts.len() as u32;
        let sizes = part_sizes.len()..part_sizes.len() + exported.len();
        part_sizes.extend(exported.iter().map(|p| p.size));
        parts.extend(exported);
        index.insert(phys, (first, sizes));
    }
    let mut pieces = Vec::with_capacity(runs.len());
    for (phys, offset, len) in runs {
        let (first, sizes) = index[&phys].clone();
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
        d,
        context,
        IpcHandleKind::Range,
        mem,
        last - first,
        kept,
        pieces,
        run_count,
        (lead, tail),
        capacity,
        source,
    )
}

/// Registers an export of context `context` of driver `d` and makes
/// its handle. A range handle claims `runs` pieces (the mapped runs of the range, the count
/// [`crate::Driver::ipc_max_range_pieces`] limits, the same on every backend); `pieces` may cut
/// them further at the backend's part boundaries. With a `source`, a get of the same memory
/// that registered first (another thread, between our look-up and here) wins: its export is
/// counted and returned, and `parts` are closed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn register(
    d: &DriverShared,
    context: u64,
    kind: IpcHandleKind,
    mem: MemoryType,
    size: usize,
    parts: Vec<SharedPart>,
    pieces: Vec<Piece>,
    runs: usize,
    (lead, tail): (u32, u32),
    capacity: Vec<Arc<Charge>>,
    source: Option<Source>,
) -> Result<IpcHandle> {
    let backend = d.backend.as_ref();
    let nonce = start_broker(backend)?;
    let token = backend.random_token()?;
    let (fds, sizes): (Vec<OwnedFd>, Vec<u64>) = parts.into_iter().map(|p| (p.fd, p.size)).unzip();
    let first = fds.first().expect("an export has an fd");
    // The fd transport recognises a single memfd by its identity; parts that have none (or
    // several parts) go through the broker only.
    let id = if backend.shareable_fds_have_identity() && fds.len() == 1 {
        backend
            .shareable_identity(first.as_fd())
            .unwrap_or_default()
    } else {
        Default::default()
    };
    let (dev, ino) = (id.dev, id.ino);
    let dev = u32::try_from(dev).map_err(|_| {
        Error::Unknown(format!(
            "st_dev {dev:#x} of an exported memfd does not fit 32 bits"
        ))
    })?;
    let describe = !backend.shareable_fds_have_identity();
    let mut fd = crate::backend::ipc::AsRawFd::as_raw_fd(first);
    let mut ex = EXPORTS.lock();
    if let Some(h) = source.and_then(|s| ex.reuse(s)) {
        drop(ex);
        return Ok(h);
    }
    let id = fresh_export_id(&ex);
    let h = Decoded {
        kind,
        mem,
        pid: own_pid(),
        nonce,
        id,
        token,
        size: size as u64,
        ino,
        dev,
        pieces: runs as u32,
        lead,
        tail,
        from_fd: false,
    };
    // Where the fds carry no identity, bytes 0..4 are the export's description instead: a
    // sealed memfd holding the handle (with -1 for the fd), from which
    // `zeMemGetIpcHandleFromFileDescriptorExp` rebuilds it in any process
    // (`crate::semantics::ipc::import::handle_from_fd`); made under the lock, since it holds
    // the export id.
    let description = if describe {
        let desc = backend.describe_export(encode(-1, &h).as_bytes())?;
        fd = crate::backend::ipc::AsRawFd::as_raw_fd(&desc);
        Some(desc)
    } else {
        None
    };
    let handle = encode(fd, &h);
    ex.insert(
        id,
        ExportRec {
            token,
            kind,
            mem,
            context,
            driver: driver_id(d),
            size: size as u64,
            fds: fds.into(),
            sizes: sizes.into(),
            pieces: pieces.into(),
            capacity: capacity.into(),
            source,
            refs: 1,
            handle,
            description,
        },
    );
    Ok(handle)
}

/// `zePhysicalMemCreate` with `ze_ipc_mem_handle_type_ext_desc_t` chained
/// (`Context::create_physical_memory_with_ipc_types`): the handle types are checked before
/// anything is created, then the object is created in context `context` (on device `device`,
/// given as its driver and ordinal, or on the host) and its types recorded under the same
/// `vm` lock.
///
/// Errors: `InvalidNullHandle` for a device of
/// another driver; as `zePhysicalMemCreate` otherwise.
pub(crate) fn create_physical_with_types(
    d: &DriverShared,
    context: u64,
    device: Option<DeviceRef<'_>>,
    flags: PhysicalMemoryFlags,
    size: usize,
    types: IpcHandleTypes,
) -> Result<PhysicalMemory> {
    crate::semantics::ipc::handle_types::check_new_handle_types(types)?;
    let slot = device.map(|dev| d.device_slot(dev)).transpose()?;
    let mut vm = d.vm.write();
    let p = vm.create_physical(
        d.backend.as_ref(),
        context,
        slot.map(|s| s.0),
        slot.and_then(|s| s.1),
        flags,
        size,
    )?;
    vm.set_physical_ipc_types(context, p.id, types);
    Ok(p)
}

/// `Driver::ipc_max_range_pieces`: most pieces one range handle of driver `d` carries.
pub(crate) fn max_range_pieces(d: &DriverShared) -> usize {
    d.ipc_max_range_pieces
}
