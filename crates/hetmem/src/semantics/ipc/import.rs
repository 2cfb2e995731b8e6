//! Open, import, close and put: `zeMemOpenIpcHandle` ([`open`]), the import of a physical
//! object's handle as a physical object of this context ([`import_physical`],
//! `aclrtMemImportFromShareableHandle`'s route), `zeMemCloseIpcHandle` ([`close`]),
//! `zeMemPutIpcHandle` ([`put`]), `zeMemGetIpcHandleFromFileDescriptorExp`
//! ([`handle_from_fd`]) and context teardown ([`release_context`]); what an open receives
//! ([`material`]: from this process's own export, the fd transport, or the exporter's broker)
//! and the checks of it ([`validate`], [`check_received_fd`]).
//!
//! # Transports
//! - **fd**: a program may send the fd of bytes 0..4 over a Unix socket (`SCM_RIGHTS`) and write
//!   the received number over bytes 0..4. Opening an allocation or physical-object handle then
//!   uses that fd directly (it is recognised by its device and inode numbers; the exporter is
//!   not contacted). On a backend whose fds carry no identity (cuda) the fd of bytes 0..4 is
//!   the export's description instead (a sealed memfd holding the handle, made at export and
//!   closed at its last put): sent alone, it is enough for [`handle_from_fd`] to rebuild the
//!   handle in the receiver, which then opens through the broker (case 5 of
//!   `shared/cases/level-zero.md`).
//! - **bytes only** (a file, a pipe, shared memory): the importer connects to the exporter's
//!   broker ([`crate::semantics::ipc::broker`]), presenting the handle, but only after checking
//!   that the socket's owner (`SO_PEERCRED`) is the exporter's pid of the handle running as our
//!   uid (a process squatting the name of a vanished exporter never sees the token); the
//!   broker checks the peer's uid and the token and answers with the fds (and, for a range,
//!   the piece list, and the size of the memory behind each fd).
//! - **Parts**: the backend exports memory as one or more parts
//!   ([`crate::backend::Backend::export_physical`]): the host one memfd per allocation or
//!   object, the cuda backend one `cuMemExportToShareableHandle` fd per allocation of the
//!   object (per granule where an importer may map a piece of one) or of the USM memory.
//!   Pieces name parts, and the broker's answer gives each
//!   part's size, since a CUDA fd (a descriptor of `/dev/nvidiactl`) has no size or identity
//!   of its own; on such a backend every open goes through the broker (or the export table,
//!   in the exporting process), never the fd transport.
//! - Every fd an open receives (from the broker or through `SCM_RIGHTS`) must be a memfd
//!   sealed against grow and shrink (`F_GET_SEALS` has `F_SEAL_GROW | F_SEAL_SHRINK`) and at
//!   least as large as what the handle maps from it, else `InvalidArgument` and nothing is
//!   mapped: nobody can later shrink the memory under a view.
//!   A range's piece list does not fit in 64 bytes, so range handles always go through the
//!   broker (with either transport); the exporter must be alive to open them.
//! - In the exporting process itself, open looks the export up directly.
//!
//! # Rules
//! - Open: flags over 0x3 -> `InvalidEnumeration`; a malformed, forged, stale or put handle, a
//!   wrong token, or a vanished exporter -> `InvalidArgument` with a message saying which.
//!   Every open maps a fresh view (distinct pointers); the fds it received are closed once
//!   mapped, so an open costs no fd. A range handle's view maps the whole pages and open
//!   returns the pointer of the range's first byte, reporting the range's own size.
//! - Close: null -> `InvalidNullPointer`; not a pointer returned by open in this context ->
//!   `InvalidArgument`. Close (and context teardown) blocks until no queued or running command
//!   references the view (`crate::semantics::queue`), waiting with no lock held.
//! - Put: through any context of the exporting driver (the reference driver keeps its
//!   handles per driver); one put per get ([`crate::semantics::ipc::export`]: gets of the
//!   same memory count on one export). A handle this process did not export, one of another
//!   driver, or one put as often as it was got -> `InvalidArgument`; except a handle that
//!   [`handle_from_fd`] made for memory another process exported, which holds nothing: its
//!   put is `SUCCESS` and changes nothing (the reference driver's answer, see [`put`]).

use crate::backend::ipc::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use crate::backend::{Backend, PhysicalLocation, SharedPart};
use crate::error::{Addr, Error, Result};
use crate::semantics::checks::{check_device, null_check};
use crate::semantics::driver::DriverShared;
use crate::semantics::inflight::InFlightRef;
use crate::semantics::ipc::broker::{ask, start_broker};
use crate::semantics::ipc::format::{
    decode, deserialize, encode, Decoded, IpcHandle, Piece, REFUSAL_MAX, ST_OK,
};
use crate::semantics::ipc::registry::{driver_id, own_pid, token_eq, ImportRec, EXPORTS, IMPORTS};
use crate::semantics::ipc::views::{map_view, mapping_granularity, Material};
use crate::semantics::usm::MemoryType;
use crate::semantics::vmm::PhysicalMemory;
use crate::spec::{IpcHandleKind, IPC_MEMORY_FLAG_BIAS_CACHED, IPC_MEMORY_FLAG_BIAS_UNCACHED};

/// Checks a shareable handle an open received (from a broker or through `SCM_RIGHTS`) before
/// anything is mapped from it ([`Backend::check_shareable`]: on the host, a memfd sealed
/// against grow and shrink, of at least `need` bytes).
/// Errors: `InvalidArgument` saying what is wrong.
pub(crate) fn check_received_fd(
    backend: &dyn Backend,
    fd: BorrowedFd<'_>,
    need: u64,
) -> Result<()> {
    backend
        .check_shareable(fd, need)
        .map_err(|why| Error::InvalidArgument(format!("{why}; refusing to map it")))
}

pub(crate) fn dup_all(backend: &dyn Backend, fds: &[OwnedFd]) -> Result<Vec<OwnedFd>> {
    fds.iter()
        .map(|f| Ok(backend.dup_shareable(f.as_fd())?))
        .collect()
}

/// What opening `handle` maps: from this process's own export, from the fd in bytes 0..4, or
/// from the exporter's broker. `max_pieces` is the opening driver's
/// [`Driver::ipc_max_range_pieces`]: a range handle claiming more is `UnsupportedSize`, and the
/// broker's answer is bounded by the pieces the handle claims.
pub(crate) fn material(
    backend: &dyn Backend,
    h: &Decoded,
    handle: &IpcHandle,
    max_pieces: usize,
) -> Result<Material> {
    if h.pid == own_pid() {
        let ex = EXPORTS.lock();
        let rec = ex.get(&h.id).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "export {} of this process does not exist (it was put, its context was \
                 destroyed, or it never existed)",
                h.id
            ))
        })?;
        if !token_eq(&rec.token, &h.token) {
            return Err(Error::InvalidArgument(format!(
                "wrong token for export {} of this process",
                h.id
            )));
        }
        if rec.kind != h.kind || rec.size != h.size {
            return Err(Error::InvalidArgument(format!(
                "handle of export {} does not match the export (kind or size altered)",
                h.id
            )));
        }
        return Ok(Material {
            size: rec.size as usize,
            fds: dup_all(backend, &rec.fds)?,
            sizes: rec.sizes.to_vec(),
            pieces: rec.pieces.to_vec(),
            capacity: rec.capacity.clone(),
            own: true,
        });
    }
    // The fd transport: bytes 0..4 hold an fd of ours that is the exported memfd itself.
    let fd = handle.fd();
    if h.kind != IpcHandleKind::Range && fd >= 0 && backend.shareable_fds_have_identity() {
        // SAFETY: only duplicated; an fd number that is not open fails.
        let b = unsafe { BorrowedFd::borrow_raw(fd) };
        // Duplicated first, and only the duplicate inspected and mapped: the number in the
        // handle may be an fd of another thread of this process (the exporter's number means
        // nothing here unless the fd was sent), which that thread may close at any moment (an
        // importer thread closing the fd its own open received through the broker, with the
        // same identity, made the dup after the check fail with EBADF). A number that is not
        // open, or is not the memory, is not the fd transport: the broker answers.
        let own = backend.dup_shareable(b).ok();
        let matched = own.filter(|d| {
            backend
                .shareable_identity(d.as_fd())
                .is_some_and(|id| id.ino == h.ino && id.dev == h.dev as u64)
        });
        if let Some(d) = matched {
            check_received_fd(backend, d.as_fd(), h.size)?;
            return Ok(Material {
                size: h.size as usize,
                fds: vec![d],
                sizes: vec![h.size],
                pieces: vec![Piece {
                    obj: 0,
                    offset: 0,
                    len: h.size,
                }],
                capacity: Arc::new([]),
                own: false,
            });
        }
    }
    // The bytes-only transport: ask the exporter's broker.
    if h.pieces as usize > max_pieces {
        return Err(Error::UnsupportedSize(format!(
            "the handle claims {} pieces; this driver opens range handles of at most \
             {max_pieces} (RuntimeBuilder::ipc_max_range_pieces)",
            h.pieces
        )));
    }
    // The answer is bounded by what the handle claims (a refusal's message by 4 KiB): at most
    // one piece (and one part) per page of the view, and for a range at least its runs (the
    // exporter's backend may cut runs at its parts' boundaries: at most one per granule on
    // a GPU).
    let page = mapping_granularity(backend) as u64;
    let per_page = h.size.div_ceil(page) as usize;
    let pieces = if h.kind == IpcHandleKind::Range {
        per_page.max(h.pieces as usize).max(1)
    } else {
        per_page.clamp(1, max_pieces)
    };
    // A handle rebuilt from an fd here is marked (byte 11); the exporter knows its own bytes.
    let request = if h.from_fd {
        encode(
            handle.fd(),
            &Decoded {
                from_fd: false,
                ..*h
            },
        )
        .data
    } else {
        handle.data
    };
    let reply = ask(
        backend,
        h.pid,
        h.nonce,
        &request,
        (24 + 32 * pieces).max(REFUSAL_MAX),
        pieces,
    )?;
    if reply.status != ST_OK {
        return Err(Error::InvalidArgument(format!(
            "process {} refused the handle: {}",
            h.pid,
            String::from_utf8_lossy(&reply.payload)
        )));
    }
    let (size, sizes, pieces) = deserialize(&reply.payload).ok_or_else(|| {
        Error::InvalidArgument(format!("malformed piece list from process {}", h.pid))
    })?;
    // A range's runs may come cut into more pieces, never fewer (the tiling is checked by
    // `validate`).
    let claimed = if h.kind == IpcHandleKind::Range {
        h.pieces as usize
    } else {
        1
    };
    if size != h.size || pieces.len() < claimed || sizes.len() != reply.fds.len() {
        return Err(Error::InvalidArgument(format!(
            "process {} described a view of {size:#x} bytes in {} pieces over {} parts and sent \
             {} fds, the handle says {:#x} bytes in {claimed}",
            h.pid,
            pieces.len(),
            sizes.len(),
            reply.fds.len(),
            h.size,
        )));
    }
    Ok(Material {
        size: size as usize,
        fds: reply.fds,
        sizes,
        pieces,
        capacity: Arc::new([]),
        own: false,
    })
}

/// Checks that the parts are whole pages, that the pieces tile `size` bytes and lie inside
/// their parts (so no mapping can reach past a part's end), and each received fd with the
/// backend ([`Backend::check_shareable`]: on the host, a sealed memfd of at least its part's
/// size) unless they are dups of this process's own export (`Material::own`: our backend made
/// them from our own memory, sealed and sized as the export says).
pub(crate) fn validate(backend: &dyn Backend, m: &Material) -> Result<()> {
    let page = mapping_granularity(backend) as u64;
    if m.sizes.len() != m.fds.len() {
        return Err(Error::InvalidArgument(format!(
            "{} part sizes for {} fds",
            m.sizes.len(),
            m.fds.len()
        )));
    }
    // Seals first: once GROW | SHRINK are set, the sizes read below cannot change.
    for (i, fd) in m.fds.iter().enumerate() {
        let psize = m.sizes[i];
        if psize == 0 || !psize.is_multiple_of(page) {
            return Err(Error::InvalidArgument(format!(
                "part {i} is said to hold {psize:#x} bytes, not a non-zero multiple of the \
                 {page:#x}-byte page"
            )));
        }
        if !m.own {
            check_received_fd(backend, fd.as_fd(), psize)?;
        }
    }
    let mut total: u64 = 0;
    for p in &m.pieces {
        let osize = *m.sizes.get(p.obj as usize).ok_or_else(|| {
            Error::InvalidArgument(format!("piece names object {} of {}", p.obj, m.fds.len()))
        })?;
        let end = p.offset.checked_add(p.len);
        if p.len == 0
            || !p.offset.is_multiple_of(page)
            || !p.len.is_multiple_of(page)
            || end.is_none_or(|e| e > osize)
        {
            return Err(Error::InvalidArgument(format!(
                "piece [{:#x}, +{:#x}) of object {} does not fit its {osize:#x} bytes",
                p.offset, p.len, p.obj
            )));
        }
        total += p.len;
    }
    if total != m.size as u64 {
        return Err(Error::InvalidArgument(format!(
            "pieces cover {total:#x} bytes, the view is {:#x}",
            m.size
        )));
    }
    Ok(())
}

/// Context teardown: closes the context's open views (waiting, with no lock held, for queued
/// work that still uses one) and puts its exports.
pub(crate) fn release_context(d: &DriverShared, context: u64) {
    let backend = d.backend.as_ref();
    let views: Vec<(usize, usize)> = loop {
        let mut im = IMPORTS.lock();
        let keys: Vec<usize> = im
            .iter()
            .filter(|(_, r)| r.context == context)
            .map(|(&b, _)| b)
            .collect();
        if let Some(&b) = keys
            .iter()
            .find(|&&b| d.inflight.is_referenced_ref(InFlightRef::View(b)))
        {
            drop(im);
            d.inflight.wait_unreferenced_ref(InFlightRef::View(b));
            continue;
        }
        break keys
            .into_iter()
            .map(|b| {
                let r = im.remove(&b).expect("listed");
                (r.map_base, r.map_size)
            })
            .collect();
    };
    for (b, s) in views {
        // SAFETY: a view we mapped; the context is gone, so nobody uses it.
        unsafe { backend.release_mapped(b, s, &[(b, b + s)]).ok() };
    }
    let gone = EXPORTS.lock().remove_context(context);
    drop(gone);
}

/// `zeMemOpenIpcHandle` in context `context` of driver `d`: maps what `handle` shares into a
/// fresh view of this process, aligned to the driver's page size for its size, and returns
/// the pointer of its first byte (a range's first byte). Errors: see the module docs; nothing
/// changes on error (no view, no fd kept).
pub(crate) fn open(
    d: &DriverShared,
    context: u64,
    handle: &IpcHandle,
    flags: u32,
) -> Result<usize> {
    if flags > (IPC_MEMORY_FLAG_BIAS_CACHED | IPC_MEMORY_FLAG_BIAS_UNCACHED) {
        return Err(Error::InvalidEnumeration(format!(
            "IPC memory flags {flags:#x} exceed BIAS_CACHED | BIAS_UNCACHED (0x3)"
        )));
    }
    let h = decode(handle)?;
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
            context,
            driver: driver_id(d),
            mem: h.mem,
            id: crate::semantics::capacity::fresh_id(),
            page_size: align,
            capacity,
        },
    );
    Ok(base + lead)
}

/// `Context::import_physical_memory` in context `context` of driver `d`: the physical object a
/// physical-object handle shares, as a physical object of this context on device `device`
/// (given as its driver and ordinal) if the exported memory was device memory, else host
/// memory. An import of this process's own memory holds that memory's device charge, so it
/// counts against the device until the last import and export of it are gone (cases/acl.md
/// case 3); an import of another process's memory is charged to no capacity here.
///
/// Errors: `InvalidNullHandle` for a device of another driver; `InvalidArgument` for bytes
/// that are not a handle, a handle of an allocation or a range, a handle that was put, a wrong
/// token, a vanished exporter, received parts this backend cannot import, or parts that are
/// not the object's whole parts in order. Nothing changes on error.
pub(crate) fn import_physical(
    d: &DriverShared,
    context: u64,
    handle: &IpcHandle,
    device: (&DriverShared, u32),
) -> Result<PhysicalMemory> {
    check_device(d, device.0, device.1)?;
    let h = decode(handle)?;
    if h.kind != IpcHandleKind::Physical {
        return Err(Error::InvalidArgument(format!(
            "the handle shares {:?}, not one physical memory object",
            h.kind
        )));
    }
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
        .map(|(fd, size)| SharedPart { fd, size })
        .collect();
    let raw = d.backend.import_physical(parts)?;
    let location = match h.mem {
        MemoryType::Device => PhysicalLocation::Device(device.1),
        _ => PhysicalLocation::Host,
    };
    // This process's own memory: the import holds its charge (`crate::semantics::capacity`).
    let charge = m.capacity.first().cloned();
    let phys =
        d.vm.write()
            .insert_imported(raw, context, location, size, charge);
    Ok(phys)
}

/// `zeMemCloseIpcHandle` in context `context` of driver `d`: unmaps the view open returned at
/// `ptr`, once no queued or running work references it (waiting with no lock held).
///
/// Errors: `InvalidNullPointer` for null; `InvalidArgument` for a pointer that is not the
/// start of an open view of this context. Nothing changes on error.
pub(crate) fn close(d: &DriverShared, context: u64, ptr: usize) -> Result<()> {
    null_check(ptr, "pointer to close")?;
    let inflight = &d.inflight;
    let mut im = loop {
        let im = IMPORTS.lock();
        match im.get(&ptr) {
            Some(r) if r.context == context => {}
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
        d.backend
            .release_mapped(base, size, &[(base, base + size)])?
    };
    im.remove(&ptr);
    Ok(())
}

/// `zeMemPutIpcHandle` through any context of driver `d`: one get of the export of `handle`
/// is returned; the last put releases what the export holds (its fds; the memory goes once
/// nothing else holds it). Views already opened stay valid.
///
/// A handle that `zeMemGetIpcHandleFromFileDescriptorExp` made in a process that did not
/// export the memory ([`handle_from_fd`]: byte 11 set) holds nothing, so its put is `Ok` and
/// changes nothing: the reference driver's answer (compute-runtime's
/// `ContextImp::putIpcMemHandle` looks the handle up among its own exports and answers
/// `ZE_RESULT_SUCCESS` when it is not one: nothing to release), which programs that rebuild a
/// handle from a received fd and put it follow (case 5 of `shared/cases/level-zero.md`). The
/// 1.18 header lists no code for it.
///
/// Errors: `InvalidArgument` for bytes that are not a handle, any other handle exported by
/// another process or driver, one whose gets were all put already, or one whose context is
/// gone. Nothing changes on error.
pub(crate) fn put(d: &DriverShared, handle: &IpcHandle) -> Result<()> {
    let h = decode(handle)?;
    if h.from_fd {
        return Ok(());
    }
    if h.pid != own_pid() {
        return Err(Error::InvalidArgument(format!(
            "handle was exported by process {}, not this one ({})",
            h.pid,
            own_pid()
        )));
    }
    let mut ex = EXPORTS.lock();
    match ex.get(&h.id) {
        Some(r) if r.driver == driver_id(d) && token_eq(&r.token, &h.token) => {}
        Some(_) => {
            return Err(Error::InvalidArgument(format!(
                "export {} belongs to another driver or the token is wrong",
                h.id
            )))
        }
        None => {
            return Err(Error::InvalidArgument(format!(
                "export {} was already put as often as it was got, or never existed",
                h.id
            )))
        }
    }
    let last = ex.put(h.id);
    drop(ex);
    // The last put's fds close here, with no lock held.
    drop(last);
    Ok(())
}

/// `zeMemGetIpcHandleFromFileDescriptorExp` in context `context` of driver `d`: the handle for
/// the fd that `zeMemGetFileDescriptorFromIpcHandleExp` gave (bytes 0..4 of a handle), in the
/// exporting process or in another one that received it (`SCM_RIGHTS`), with `fd` in bytes
/// 0..4.
///
/// - On a backend whose shareable fds identify their memory (host: a memfd): the handle of
///   the live export of this context whose first shareable handle is the memory behind `fd`;
///   or else a handle describing that memory alone (kind allocation, memory type device, pid
///   0: opening it never contacts a broker and maps `fd` through the fd transport, which
///   checks it again).
/// - On one whose fds do not (cuda: every one is a descriptor of `/dev/nvidiactl`), the fd is
///   the export's description (a sealed memfd holding its handle,
///   `crate::semantics::ipc::export::register`): the handle read back from it, which opens
///   through the exporter's broker as any handle does.
///
/// A handle made here for memory another process exported is marked so (byte 11): it holds
/// nothing, and its put is `Ok` ([`put`]: the reference driver's answer).
///
/// Errors: `InvalidArgument` for a negative fd, an fd that is not open, not a shareable
/// handle this backend imports (on the host: a memfd sealed against grow and shrink), or
/// empty; on a backend without fd identity, an fd that is not an export's description (a
/// sealed memfd of 64 bytes that decode as a hetmem handle). Nothing changes (no fd is kept
/// or closed).
pub(crate) fn handle_from_fd(d: &DriverShared, context: u64, fd: i32) -> Result<IpcHandle> {
    if fd < 0 {
        return Err(Error::InvalidArgument(format!(
            "file descriptor {fd} is negative"
        )));
    }
    let backend = d.backend.as_ref();
    if !backend.shareable_fds_have_identity() {
        // SAFETY: only read (seals, size, bytes); a number that is not open fails.
        let b = unsafe { BorrowedFd::borrow_raw(fd) };
        let bytes = backend
            .read_description(b, crate::semantics::ipc::format::IPC_HANDLE_SIZE)
            .map_err(|why| {
                Error::InvalidArgument(format!(
                    "file descriptor {fd} is not the description of a hetmem IPC export ({why});                      on the {} backend it must be the fd zeMemGetFileDescriptorFromIpcHandleExp                      gave",
                    backend.name()
                ))
            })?;
        let data: [u8; 64] = bytes.try_into().map_err(|b: Vec<u8>| {
            Error::InvalidArgument(format!(
                "file descriptor {fd} holds {} bytes, not the 64 of an IPC handle",
                b.len()
            ))
        })?;
        let mut h = decode(&IpcHandle { data })?;
        // The exporter's own export: its handle itself (its put counts it down).
        h.from_fd = h.pid != own_pid();
        return Ok(encode(fd, &h));
    }
    // SAFETY: only inspected (identity, checks); a number that is not open fails.
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
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
            if rec.kind == IpcHandleKind::Range || rec.context != context {
                continue;
            }
            let first = rec.fds.first().expect("an export has an fd");
            let same = backend
                .shareable_identity(first.as_fd())
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
                        from_fd: false,
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
            from_fd: true,
        },
    ))
}
