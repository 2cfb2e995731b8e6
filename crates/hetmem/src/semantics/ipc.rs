//! Level Zero IPC: handles for allocations, physical memory and whole virtual-address ranges,
//! shared between processes. The semantics layer.
//!
//! Spec: oneAPI Level Zero 1.18 core "Memory" IPC calls (`zeMemGetIpcHandle`,
//! `zeMemGetIpcHandleWithProperties`, `zeMemOpenIpcHandle`, `zeMemCloseIpcHandle`,
//! `zeMemPutIpcHandle`) and the memory extensions `ze_ipc_mem_handle_type_ext_desc_t`
//! (`ZE_extension_ipc_mem_handle_type`) and `ze_ipc_phys_mem_handle_range_ext_desc_t`
//! (`ZE_extension_ipc_phys_mem_handle_range`).
//!
//! # The handle (64 bytes, `ze_ipc_mem_handle_t`)
//! | bytes | field |
//! |---|---|
//! | 0..4 | an fd valid in the exporting process (`i32`, little endian): the allocation's or physical object's shareable handle (host: its memfd); for a range, or memory exported as several parts, the first part's |
//! | 4..8 | magic `"HMIP"` |
//! | 8 | version (3) |
//! | 9 | kind: 1 allocation, 2 physical object, 3 range |
//! | 10 | memory type of the exported memory (`ze_memory_type_t`: 1 host, 2 device, 3 shared) |
//! | 11 | 0 |
//! | 12..16 | exporter pid (`u32`) |
//! | 16..20 | exporter's broker nonce (`u32`, random, non-zero): the broker's socket is named `hetmem-ipc-broker.<pid>.<nonce as 8 hex digits>` |
//! | 20..24 | export id (`u32`, per exporter, non-zero; after 2^32 - 1 exports ids wrap, skipping live ones; a reused id never opens an old handle since the token differs) |
//! | 24..40 | secret random token (`getrandom(2)`) |
//! | 40..48 | size in bytes of the importer's view (`u64`) |
//! | 48..56 | allocation / physical object: `st_ino` of the memfd in bytes 0..4; range: number of (object, offset, length) pieces (`u32`) then 4 zero bytes |
//! | 56..60 | allocation / physical object: `st_dev` of that memfd (`u32`: Linux's `dev_t` is 32 bits: 12 major, 20 minor); range: 0 |
//! | 60..64 | FNV-1a checksum of bytes 4..60 (catches corruption; the token, not the checksum, stops forgery) |
//!
//! All integers little endian.
//!
//! # Transports
//! - **fd**: a program may send the fd of bytes 0..4 over a Unix socket (`SCM_RIGHTS`) and write
//!   the received number over bytes 0..4. Opening an allocation or physical-object handle then
//!   uses that fd directly (it is recognised by its device and inode numbers; the exporter is
//!   not contacted).
//! - **bytes only** (a file, a pipe, shared memory): the importer connects to the exporter's
//!   broker ([`crate::backend::host::ipc`]), presenting the handle, but only after checking that
//!   the socket's owner (`SO_PEERCRED`) is the exporter's pid of the handle running as our uid
//!   (a process squatting the name of a vanished exporter never sees the token); the broker
//!   checks the peer's uid and the token and answers with the fds (and, for a range, the piece
//!   list, and the size of the memory behind each fd).
//! - **Parts**: the backend exports memory as one or more parts
//!   ([`crate::backend::Backend::export_physical`]): the host one memfd per allocation or
//!   object, the cuda backend one `cuMemExportToShareableHandle` fd per granule (one per
//!   allocation for device USM memory). Pieces name parts, and the broker's answer gives each
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
//! - Get: null -> `InvalidNullPointer`; a pointer in no allocation and no mapped page ->
//!   `InvalidArgument`; an import of system memory (no memfd) -> `InvalidArgument`. A pointer
//!   inside an allocation exports the whole allocation; a pointer in a mapped page of a
//!   reservation (or [`crate::Context::get_physical_memory_ipc_handle`]) exports the whole
//!   physical object mapped there. Each get makes a new export that holds the memory until
//!   [`crate::Context::put_ipc_handle`] (or the context goes).
//! - Handle types: DEFAULT (1 << 0) and FABRIC_ACCESSIBLE (1 << 1); bits over 0x3 ->
//!   `InvalidEnumeration`; 0 counts as DEFAULT. The host backend supports DEFAULT only:
//!   FABRIC_ACCESSIBLE -> `UnsupportedFeature` at get and at allocation / physical creation (the
//!   extension's note). Memory created with a handle-type descriptor supports only the types
//!   chained there; asking later for another -> `UnsupportedFeature` (the same note: the driver
//!   cannot provide that handle type for that memory).
//! - Capacity: memory kept alive by a live export, or by a view opened in this process, still
//!   counts against its device's capacity after the memory is destroyed or freed; the
//!   capacity comes back when the last export or view of it is put or closed (each holds the
//!   memory's charge, `crate::semantics::capacity`).
//! - Range (`range_size` set): null -> `InvalidNullPointer`; size 0 -> `InvalidSize`; a range
//!   past the end of the address space -> `InvalidArgument`. The range may start at any byte
//!   and have any size (the spec: "the caller may start at an arbitrary offset within a mapped
//!   range"): its pieces cover the whole pages it touches, the handle carries the bytes of
//!   the first page before it and of the last page after it, and open returns the pointer of
//!   the range's first byte in a view of those pages, reporting the range's own size
//!   (`get_address_range`, queue operands and close use that pointer and size). Then, over
//!   the whole range:
//!   any byte in memory that is not reserved VA (a USM allocation or import of this driver, a
//!   managed allocation of this driver, an IPC view opened in this process) -> `InvalidArgument`
//!   naming it; otherwise any byte not mapped to a physical object (an unmapped page of a
//!   reservation, or an address hetmem does not know at all) -> `AddressNotFound` naming the
//!   first such byte; more than [`Driver::ipc_max_range_pieces`] pieces (a per-driver setting,
//!   [`crate::RuntimeBuilder::ipc_max_range_pieces`]) -> `UnsupportedSize` naming the
//!   limit; a physical object created with handle types that lack the asked ones ->
//!   `UnsupportedFeature`. The list is a snapshot.
//! - Open: flags over 0x3 -> `InvalidEnumeration`; a malformed, forged, stale or put handle, a
//!   wrong token, or a vanished exporter -> `InvalidArgument` with a message saying which.
//!   Every open maps a fresh view (distinct pointers); the fds it received are closed once
//!   mapped, so an open costs no fd. [`crate::Context::get_address_range`] on the returned
//!   pointer reports it and the view's full size; [`crate::Context::get_allocation_properties`]
//!   reports the exported memory's type (byte 10), a fresh id and the view's page size.
//! - Close: null -> `InvalidNullPointer`; not a pointer returned by open in this context ->
//!   `InvalidArgument`. Close (and context teardown) blocks until no queued or running command
//!   references the view (see [`crate::queue`]).
//! - A view is a valid copy / fill operand (source and destination: views are mapped
//!   read-write) for queues of the driver it was opened with, within its size. Put: a handle this process did not export, or already put ->
//!   `InvalidArgument`.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

pub use crate::backend::ipc::{BrokerAnswer, BrokerStats, TransportError};
use crate::backend::ipc::{BrokerHandler, BrokerReply};
use crate::backend::{Backend, Protection, RawPhysical, SharedPart};
use crate::error::{Error, Result};
use crate::semantics::capacity::Charge;
use crate::semantics::driver::DriverShared;
use crate::semantics::inflight::InFlightRef;
use crate::semantics::usm::MemoryType;
pub use crate::spec::{
    IpcHandleKind, IpcHandleTypes, IpcProperties, IPC_MEMORY_FLAG_BIAS_CACHED,
    IPC_MEMORY_FLAG_BIAS_UNCACHED,
};

/// `ZE_MAX_IPC_HANDLE_SIZE`: the size in bytes of `ze_ipc_mem_handle_t` (64).
pub const IPC_HANDLE_SIZE: usize = 64;
pub(crate) const MAGIC: &[u8; 4] = b"HMIP";
/// 3 since the broker's answer carries the size of each shared part (see [`serialize`]).
pub(crate) const VERSION: u8 = 3;
/// The default of [`crate::RuntimeBuilder::ipc_max_range_pieces`]: most `(physical object,
/// offset, length)` pieces one range handle carries (1 << 20, a 24 MiB piece list).
pub const DEFAULT_MAX_RANGE_PIECES: usize = 1 << 20;

/// The types every backend of this build supports: DEFAULT only (no fabric).
pub(crate) const SUPPORTED_TYPES: IpcHandleTypes = IpcHandleTypes::DEFAULT;

/// Checks handle types chained at the creation of memory (an allocation or a physical object)
/// against what this build's backends support.
///
/// Errors: `UnsupportedFeature` for FABRIC_ACCESSIBLE, naming the flags.
pub fn check_new_handle_types(asked: IpcHandleTypes) -> Result<()> {
    check_handle_types(asked, SUPPORTED_TYPES, None)
}

/// Checks handle types asked at creation (allocation, physical memory) or at get against what
/// the backend supports (`supported`) and, at get, what the memory was created with
/// (`created`; `None`: no descriptor was chained at creation, any supported type goes).
/// Spec: the note of `ze_ipc_mem_handle_type_ext_desc_t` (memory extensions): a type the driver
/// cannot provide for that memory is `ZE_RESULT_ERROR_UNSUPPORTED_FEATURE`.
///
/// Errors: `UnsupportedFeature` naming the flags asked and those supported / created.
pub fn check_handle_types(
    asked: IpcHandleTypes,
    supported: IpcHandleTypes,
    created: Option<IpcHandleTypes>,
) -> Result<()> {
    if !supported.contains(asked) {
        return Err(Error::UnsupportedFeature(format!(
            "IPC handle type flags {:#x}: FABRIC_ACCESSIBLE handles are not supported by this \
             backend (supported: {:#x}, DEFAULT)",
            asked.raw(),
            supported.raw()
        )));
    }
    if let Some(c) = created {
        if !c.contains(asked) {
            return Err(Error::UnsupportedFeature(format!(
                "IPC handle type flags {:#x} were not requested when the memory was created \
                 (it was created with {:#x})",
                asked.raw(),
                c.raw()
            )));
        }
    }
    Ok(())
}

/// `ze_ipc_mem_handle_t`: 64 bytes, passed by value, self-describing (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IpcHandle {
    /// The raw bytes.
    pub data: [u8; IPC_HANDLE_SIZE],
}

impl std::fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        match decode(self) {
            Ok(h) => write!(
                f,
                "IpcHandle({:?}, pid {}, export {}, {} bytes, fd {})",
                h.kind,
                h.pid,
                h.id,
                h.size,
                self.fd()
            ),
            Err(_) => f.write_str("IpcHandle(<malformed>)"),
        }
    }
}

impl IpcHandle {
    /// The handle from its 64 bytes.
    pub fn from_bytes(data: [u8; IPC_HANDLE_SIZE]) -> IpcHandle {
        IpcHandle { data }
    }
    /// The 64 bytes.
    pub fn as_bytes(&self) -> &[u8; IPC_HANDLE_SIZE] {
        &self.data
    }
    /// The fd number in bytes 0..4 (little endian; valid in the exporter, or wherever it was
    /// sent and rewritten). Never fails; meaningless for bytes that are not a handle.
    pub fn fd(&self) -> i32 {
        i32::from_le_bytes(self.data[..4].try_into().expect("4 bytes"))
    }
    /// Writes fd number `fd` over bytes 0..4 (after receiving the exporter's fd with
    /// `SCM_RIGHTS`); the rest of the handle (and its checksum, which skips bytes 0..4) is
    /// unchanged.
    pub fn set_fd(&mut self, fd: i32) {
        self.data[..4].copy_from_slice(&fd.to_le_bytes());
    }
    /// The kind, or `None` for bytes that are not a valid handle.
    pub fn kind(&self) -> Option<IpcHandleKind> {
        decode(self).ok().map(|h| h.kind)
    }
    /// The exporting process's pid, or `None` for bytes that are not a valid handle.
    pub fn exporter_pid(&self) -> Option<u32> {
        decode(self).ok().map(|h| h.pid)
    }
    /// The exporter's broker nonce (bytes 16..20; the broker's socket is
    /// [`crate::Driver::ipc_broker_name`]`(pid, nonce)`), or `None` for bytes that are
    /// not a valid handle.
    pub fn broker_nonce(&self) -> Option<u32> {
        decode(self).ok().map(|h| h.nonce)
    }
    /// Size in bytes of the view an open gives (for a range handle the range's size, whatever
    /// its first byte's offset in its page), or `None` for bytes that are not a valid handle.
    pub fn size(&self) -> Option<usize> {
        decode(self)
            .ok()
            .map(|h| h.size.saturating_sub(h.lead as u64 + h.tail as u64) as usize)
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Decoded {
    pub(crate) kind: IpcHandleKind,
    pub(crate) mem: MemoryType,
    pub(crate) pid: u32,
    pub(crate) nonce: u32,
    pub(crate) id: u32,
    pub(crate) token: [u8; 16],
    pub(crate) size: u64,
    /// Allocation / physical object: the memfd's `st_ino` (0 for a range).
    pub(crate) ino: u64,
    /// Allocation / physical object: the memfd's `st_dev` (0 for a range).
    pub(crate) dev: u32,
    /// Pieces (1 unless a range).
    pub(crate) pieces: u32,
    /// Range: bytes of the first page before the range's first byte (the range may start at
    /// any byte; its pieces cover whole pages). 0 otherwise.
    pub(crate) lead: u32,
    /// Range: bytes of the last page after the range's last byte. 0 otherwise.
    pub(crate) tail: u32,
}

pub(crate) fn fnv1a(b: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &x in b {
        h ^= x as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

pub(crate) fn encode(fd: i32, h: &Decoded) -> IpcHandle {
    let mut d = [0u8; IPC_HANDLE_SIZE];
    d[..4].copy_from_slice(&fd.to_le_bytes());
    d[4..8].copy_from_slice(MAGIC);
    d[8] = VERSION;
    d[9] = h.kind as u8;
    d[10] = h.mem as u8;
    d[12..16].copy_from_slice(&h.pid.to_le_bytes());
    d[16..20].copy_from_slice(&h.nonce.to_le_bytes());
    d[20..24].copy_from_slice(&h.id.to_le_bytes());
    d[24..40].copy_from_slice(&h.token);
    d[40..48].copy_from_slice(&h.size.to_le_bytes());
    if h.kind == IpcHandleKind::Range {
        d[48..52].copy_from_slice(&h.pieces.to_le_bytes());
        d[52..56].copy_from_slice(&h.lead.to_le_bytes());
        d[56..60].copy_from_slice(&h.tail.to_le_bytes());
    } else {
        d[48..56].copy_from_slice(&h.ino.to_le_bytes());
        d[56..60].copy_from_slice(&h.dev.to_le_bytes());
    }
    let c = fnv1a(&d[4..60]);
    d[60..64].copy_from_slice(&c.to_le_bytes());
    IpcHandle { data: d }
}

pub(crate) fn decode(h: &IpcHandle) -> Result<Decoded> {
    let d = &h.data;
    let bad = |why: &str| {
        Err(Error::InvalidArgument(format!(
            "not a hetmem IPC handle: {why}"
        )))
    };
    if &d[4..8] != MAGIC {
        return bad("bytes 4..8 are not the magic \"HMIP\"");
    }
    if d[8] != VERSION {
        return bad(&format!("version {} is not {VERSION}", d[8]));
    }
    let c = u32::from_le_bytes(d[60..64].try_into().expect("4"));
    if c != fnv1a(&d[4..60]) || !(1..=3).contains(&d[10]) || d[11] != 0 {
        return bad("checksum mismatch (corrupted or forged bytes)");
    }
    let kind = match d[9] {
        1 => IpcHandleKind::Allocation,
        2 => IpcHandleKind::Physical,
        3 => IpcHandleKind::Range,
        k => return bad(&format!("kind {k} is not 1, 2 or 3")),
    };
    let u64at = |i: usize| u64::from_le_bytes(d[i..i + 8].try_into().expect("8"));
    let u32at = |i: usize| u32::from_le_bytes(d[i..i + 4].try_into().expect("4"));
    let mem = match d[10] {
        1 => MemoryType::Host,
        2 => MemoryType::Device,
        _ => MemoryType::Shared,
    };
    let range = kind == IpcHandleKind::Range;
    Ok(Decoded {
        kind,
        mem,
        pid: u32at(12),
        nonce: u32at(16),
        id: u32at(20),
        token: d[24..40].try_into().expect("16"),
        size: u64at(40),
        ino: if range { 0 } else { u64at(48) },
        dev: if range { 0 } else { u32at(56) },
        pieces: if range { u32at(48) } else { 1 },
        lead: if range { u32at(52) } else { 0 },
        tail: if range { u32at(56) } else { 0 },
    })
}

/// One piece of a view: `len` bytes of object `obj` (an index into the fds) from `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) obj: u32,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

#[derive(Debug)]
pub(crate) struct ExportRec {
    pub(crate) token: [u8; 16],
    pub(crate) kind: IpcHandleKind,
    /// The memory type the handle reports (byte 10).
    pub(crate) mem: MemoryType,
    pub(crate) context: u64,
    /// The exporting driver (`Arc::as_ptr` of its shared state; its contexts keep it alive
    /// while the export lives).
    pub(crate) driver: usize,
    pub(crate) size: u64,
    pub(crate) fds: Arc<[OwnedFd]>,
    /// Bytes behind each fd (the exported parts' sizes).
    pub(crate) sizes: Arc<[u64]>,
    pub(crate) pieces: Arc<[Piece]>,
    /// The device capacity of the exported memory: held while the export lives, even once
    /// the memory is destroyed or freed (`crate::semantics::capacity`).
    pub(crate) capacity: Arc<[Arc<Charge>]>,
}

/// A view opened in this process, keyed in [`IMPORTS`] by the pointer open returned.
#[derive(Debug, Clone)]
pub(crate) struct ImportRec {
    /// Bytes from the returned pointer (a range handle's size).
    pub(crate) size: usize,
    /// What open mapped: whole pages from `map_base` (at or below the returned pointer: a
    /// range may start at any byte of its first page), `map_size` bytes.
    pub(crate) map_base: usize,
    pub(crate) map_size: usize,
    pub(crate) context: u64,
    /// The opening driver (`Arc::as_ptr` of its shared state; unique while the view lives,
    /// since the context, which keeps the driver alive, closes its views at teardown).
    pub(crate) driver: usize,
    pub(crate) mem: MemoryType,
    pub(crate) id: u64,
    pub(crate) page_size: usize,
    /// The device capacity of the viewed memory when it is this process's own (empty for
    /// memory of another process): held until the view is closed (`crate::semantics::capacity`).
    #[expect(
        dead_code,
        reason = "held, never read: dropping it gives the capacity back"
    )]
    pub(crate) capacity: Arc<[Arc<Charge>]>,
}

/// Exports of this process (export id -> record); read by the broker thread.
pub(crate) static EXPORTS: Mutex<BTreeMap<u32, ExportRec>> = Mutex::new(BTreeMap::new());
/// The next export id to try (ids are `u32`, non-zero, wrapping; see the module docs).
pub(crate) static NEXT_EXPORT: AtomicU32 = AtomicU32::new(1);
/// Views opened in this process (returned pointer -> record).
pub(crate) static IMPORTS: Mutex<BTreeMap<usize, ImportRec>> = Mutex::new(BTreeMap::new());

pub(crate) fn own_pid() -> u32 {
    std::process::id()
}

/// Longest refusal message an importer accepts from a broker, in bytes.
pub(crate) const REFUSAL_MAX: usize = 4096;

/// Broker status codes (the semantics of a refusal).
pub(crate) const ST_OK: u32 = 0;
pub(crate) const ST_UNKNOWN: u32 = 1;
pub(crate) const ST_TOKEN: u32 = 2;

/// The broker's answer: the view size, the bytes behind each fd, then the pieces (all `u64`,
/// little endian: `size, n_parts, part sizes..., n_pieces, (obj, offset, len)...`).
pub(crate) fn serialize(size: u64, sizes: &[u64], pieces: &[Piece]) -> Vec<u8> {
    let mut v = Vec::with_capacity(24 + sizes.len() * 8 + pieces.len() * 24);
    v.extend_from_slice(&size.to_le_bytes());
    v.extend_from_slice(&(sizes.len() as u64).to_le_bytes());
    for s in sizes {
        v.extend_from_slice(&s.to_le_bytes());
    }
    v.extend_from_slice(&(pieces.len() as u64).to_le_bytes());
    for p in pieces {
        v.extend_from_slice(&(p.obj as u64).to_le_bytes());
        v.extend_from_slice(&p.offset.to_le_bytes());
        v.extend_from_slice(&p.len.to_le_bytes());
    }
    v
}

/// What [`serialize`] wrote: `(view size, part sizes, pieces)`, or `None` for bytes that are
/// not exactly that.
pub(crate) fn deserialize(b: &[u8]) -> Option<(u64, Vec<u64>, Vec<Piece>)> {
    let u =
        |i: usize| -> Option<u64> { Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?)) };
    let size = u(0)?;
    let parts = usize::try_from(u(8)?).ok()?;
    let at_pieces = 16usize.checked_add(parts.checked_mul(8)?)?;
    if at_pieces > b.len() {
        return None;
    }
    let sizes = (0..parts)
        .map(|i| u(16 + i * 8))
        .collect::<Option<Vec<u64>>>()?;
    let n = usize::try_from(u(at_pieces)?).ok()?;
    if b.len() != at_pieces.checked_add(8)?.checked_add(n.checked_mul(24)?)? {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let at = at_pieces + 8 + i * 24;
        out.push(Piece {
            obj: u32::try_from(u(at)?).ok()?,
            offset: u(at + 8)?,
            len: u(at + 16)?,
        });
    }
    Some((size, sizes, out))
}

/// The pieces of a view of `size` bytes made of `parts` whole, in order (an allocation's or a
/// physical object's export: the last part may hold more than the view needs).
pub(crate) fn whole_pieces(parts: &[SharedPart], size: u64) -> Vec<Piece> {
    let mut left = size;
    let mut out = Vec::with_capacity(parts.len());
    for (i, p) in parts.iter().enumerate() {
        if left == 0 {
            break;
        }
        let len = p.size.min(left);
        out.push(Piece {
            obj: i as u32,
            offset: 0,
            len,
        });
        left -= len;
    }
    out
}

/// The pieces for `len` bytes from `offset` of an object exported as parts of `sizes` bytes
/// (in order), the first of which is fd `first` of the export: one piece per part the run
/// touches, offsets relative to that part.
pub(crate) fn run_pieces(sizes: &[u64], first: u32, offset: u64, len: u64) -> Vec<Piece> {
    let mut out = Vec::new();
    let (mut at, end) = (offset, offset + len);
    let mut start = 0u64;
    for (i, &sz) in sizes.iter().enumerate() {
        let (ps, pe) = (start, start + sz);
        start = pe;
        if pe <= at || at >= end {
            continue;
        }
        let take = pe.min(end) - at;
        out.push(Piece {
            obj: first + i as u32,
            offset: at - ps,
            len: take,
        });
        at += take;
    }
    out
}

/// The broker's handler: checks the export id and token, answers with dups of the fds.
pub(crate) fn serve_request(req: &[u8; 64], _peer_pid: u32) -> BrokerReply {
    let refuse = |status: u32, msg: String| BrokerReply {
        status,
        payload: msg.into_bytes(),
        fds: None,
    };
    let h = match decode(&IpcHandle { data: *req }) {
        Ok(h) => h,
        Err(e) => return refuse(ST_UNKNOWN, e.message().to_string()),
    };
    let (fds, size, sizes, pieces) = {
        let ex = EXPORTS.lock();
        let Some(rec) = ex.get(&h.id).filter(|_| h.pid == own_pid()) else {
            return refuse(
                ST_UNKNOWN,
                format!(
                "export {} of process {} does not exist (it was put, its context was destroyed, \
                 or it never existed)",
                h.id, h.pid
            ),
            );
        };
        if !token_eq(&rec.token, &h.token) {
            return refuse(ST_TOKEN, format!("wrong token for export {}", h.id));
        }
        (
            rec.fds.clone(),
            rec.size,
            rec.sizes.clone(),
            rec.pieces.clone(),
        )
    };
    // Sent after the lock is dropped; a concurrent put leaves these fds open until sent.
    BrokerReply {
        status: ST_OK,
        payload: serialize(size, &sizes, &pieces),
        fds: Some(fds),
    }
}

/// Constant-time comparison of tokens.
pub(crate) fn token_eq(a: &[u8; 16], b: &[u8; 16]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Starts (or finds) this process's broker; returns its nonce. A failure is not remembered.
pub(crate) fn start_broker(backend: &dyn Backend) -> Result<u32> {
    let handler = || -> BrokerHandler { Arc::new(serve_request) };
    backend.start_broker(&handler).map_err(|e| {
        Error::Unknown(format!(
            "could not start the IPC broker of process {} ({e}); the next export tries again",
            own_pid()
        ))
    })
}

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

/// A fresh export id: non-zero, not live (wraps after 2^32 - 1).
pub(crate) fn fresh_export_id(live: &BTreeMap<u32, ExportRec>) -> u32 {
    loop {
        let id = NEXT_EXPORT.fetch_add(1, Ordering::Relaxed);
        if id != 0 && !live.contains_key(&id) {
            return id;
        }
    }
}

/// Registers an export of `context` of driver `driver` (its `DriverShared` address) and makes
/// its handle. A range handle claims `runs` pieces (the mapped runs of the range, the count
/// [`crate::Driver::ipc_max_range_pieces`] limits, the same on every backend); `pieces` may cut
/// them further at the backend's part boundaries.
#[allow(clippy::too_many_arguments)]
pub(crate) fn register(
    backend: &dyn Backend,
    driver: usize,
    context: u64,
    kind: IpcHandleKind,
    mem: MemoryType,
    size: usize,
    parts: Vec<SharedPart>,
    pieces: Vec<Piece>,
    runs: usize,
    (lead, tail): (u32, u32),
    capacity: Vec<Arc<Charge>>,
) -> Result<IpcHandle> {
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
    let fd = std::os::fd::AsRawFd::as_raw_fd(first);
    let mut ex = EXPORTS.lock();
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
    };
    ex.insert(
        id,
        ExportRec {
            token,
            kind,
            mem,
            context,
            driver,
            size: size as u64,
            fds: fds.into(),
            sizes: sizes.into(),
            pieces: pieces.into(),
            capacity: capacity.into(),
        },
    );
    Ok(encode(fd, &h))
}

/// What an open needs: the view size, the objects' fds and the pieces, plus the device
/// capacity the view holds (that of this process's own memory only).
pub(crate) struct Material {
    pub(crate) size: usize,
    pub(crate) fds: Vec<OwnedFd>,
    /// Bytes behind each fd, as the exporter said.
    pub(crate) sizes: Vec<u64>,
    pub(crate) pieces: Vec<Piece>,
    pub(crate) capacity: Arc<[Arc<Charge>]>,
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
        });
    }
    // The fd transport: bytes 0..4 hold an fd of ours that is the exported memfd itself.
    let fd = handle.fd();
    if h.kind != IpcHandleKind::Range && fd >= 0 && backend.shareable_fds_have_identity() {
        // SAFETY: only inspected (fstat, F_GET_SEALS) and duplicated; an fd number that is not
        // open fails.
        let b = unsafe { BorrowedFd::borrow_raw(fd) };
        if let Some(id) = backend.shareable_identity(b) {
            if id.ino == h.ino && id.dev == h.dev as u64 {
                check_received_fd(backend, b, h.size)?;
                return Ok(Material {
                    size: h.size as usize,
                    fds: vec![backend.dup_shareable(b)?],
                    sizes: vec![h.size],
                    pieces: vec![Piece {
                        obj: 0,
                        offset: 0,
                        len: h.size,
                    }],
                    capacity: Arc::new([]),
                });
            }
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
    // exporter's backend may cut runs at its parts' boundaries: one per granule on a GPU).
    let page = mapping_granularity(backend) as u64;
    let per_page = h.size.div_ceil(page) as usize;
    let pieces = if h.kind == IpcHandleKind::Range {
        per_page.max(h.pieces as usize).max(1)
    } else {
        per_page.clamp(1, max_pieces)
    };
    let reply = backend
        .broker_request(
            h.pid,
            h.nonce,
            &handle.data,
            (24 + 32 * pieces).max(REFUSAL_MAX),
            pieces,
        )
        .map_err(|e| match e {
            TransportError::PeerGone => Error::InvalidArgument(format!(
                "the exporting process {} is gone (no IPC broker answers, or it died while \
                 answering): the handle cannot be opened any more",
                h.pid
            )),
            TransportError::Impostor(name) => Error::InvalidArgument(format!(
                "the socket named {name:?} is not served by the exporting process {} running \
                 as our uid (SO_PEERCRED): the exporter is gone and another process holds its \
                 name; nothing was sent to it",
                h.pid
            )),
            TransportError::Protocol(m) => Error::InvalidArgument(format!(
                "the IPC broker of process {} answered out of protocol: {m}",
                h.pid
            )),
            TransportError::Local(e) => e.into(),
        })?;
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
    })
}

/// The smallest unit a range handle's pieces are cut in: the finest mapping granularity of the
/// backend's devices (the OS page on the host backend, 2 MiB on a GPU).
pub(crate) fn mapping_granularity(backend: &dyn Backend) -> usize {
    backend
        .devices()
        .iter()
        .map(|d| d.min_page_size)
        .min()
        .unwrap_or_else(|| backend.host_page_size())
}

/// Checks that the parts are whole pages, that the pieces tile `size` bytes and lie inside
/// their parts (so no mapping can reach past a part's end), and each received fd with the
/// backend ([`Backend::check_shareable`]: on the host, a sealed memfd of at least its part's
/// size).
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
        check_received_fd(backend, fd.as_fd(), psize)?;
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

/// Maps the material into a fresh reservation; returns its base.
pub(crate) fn map_view(backend: &dyn Backend, align: usize, m: Material) -> Result<usize> {
    // SAFETY: a fresh placeholder chosen by the backend; replaces nothing.
    let base = unsafe { backend.reserve(None, m.size, align)? };
    let mut raws: Vec<RawPhysical> = Vec::with_capacity(m.fds.len());
    let mut result = Ok(());
    for (fd, size) in m.fds.into_iter().zip(m.sizes) {
        match backend.import_physical(vec![SharedPart { fd, size }]) {
            Ok(r) => raws.push(r),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let mut at = base;
    if result.is_ok() {
        for p in &m.pieces {
            // SAFETY: [at, at+len) is an unmapped part of our fresh reservation, and the piece
            // lies inside its object (validated).
            let r = unsafe {
                backend.map(
                    at,
                    p.len as usize,
                    raws[p.obj as usize],
                    p.offset as usize,
                    Protection::ReadWrite,
                )
            };
            if let Err(e) = r {
                result = Err(e);
                break;
            }
            at += p.len as usize;
        }
    }
    for r in raws {
        // SAFETY: imported above; the mappings keep the memory, the handle is not used again.
        unsafe { backend.destroy_physical(r) };
    }
    if let Err(e) = result {
        // SAFETY: our reservation, mapped in [base, at).
        unsafe { backend.release_mapped(base, m.size, &[(base, at)]).ok() };
        return Err(e.into());
    }
    Ok(base)
}

/// `(base, size)` of a view opened in this process that contains `ptr`
/// (`zeMemGetAddressRange` on an opened pointer).
pub(crate) fn opened_range(ptr: usize) -> Option<(usize, usize)> {
    let im = IMPORTS.lock();
    let (&b, r) = im.range(..=ptr).next_back()?;
    (ptr < b + r.size).then_some((b, r.size))
}

/// `(base, end)` of what a view opened in this process (any context, any driver) mapped, if it
/// overlaps `[start, end)`: memory that is neither system memory nor reserved VA of this
/// process.
pub(crate) fn view_overlapping(start: usize, end: usize) -> Option<(usize, usize)> {
    let im = IMPORTS.lock();
    // The views are disjoint and keyed in address order; a view's mapping may begin below its
    // key (by less than a page), so the first view at or above `end` may overlap too.
    let extent = |(_, r): (&usize, &ImportRec)| (r.map_base, r.map_base + r.map_size);
    let before = im.range(..end).next_back().map(extent);
    let after = im.range(end..).next().map(extent);
    [before, after]
        .into_iter()
        .flatten()
        .find(|&(b, e)| b < end && e > start)
}

/// Properties of a view opened in this process that contains `ptr`
/// (`zeMemGetAllocProperties` on an opened pointer): the exported memory's type, an id of the
/// view (unique, never reused), the view's page size; no device.
pub(crate) fn opened_properties(ptr: usize) -> Option<crate::usm::AllocationProperties> {
    let im = IMPORTS.lock();
    let (&b, r) = im.range(..=ptr).next_back()?;
    (ptr < b + r.size).then(|| crate::usm::AllocationProperties {
        memory_type: r.mem,
        id: r.id,
        page_size: r.page_size,
        ..Default::default()
    })
}

/// The memory type a physical object's location reports.
pub(crate) fn location_type(loc: crate::backend::PhysicalLocation) -> MemoryType {
    match loc {
        crate::backend::PhysicalLocation::Device(_) => MemoryType::Device,
        crate::backend::PhysicalLocation::Host => MemoryType::Host,
    }
}

/// The table of views opened in this process, locked, as seen by the queues of one driver.
/// Queue operand checks ([`crate::queue`]) hold it while they take their in-flight references,
/// so no close can slip in between (lock order: usm, vm, this table, the in-flight table).
pub(crate) struct Views<'a> {
    pub(crate) table: parking_lot::MutexGuard<'a, BTreeMap<usize, ImportRec>>,
    pub(crate) driver: usize,
}

impl Views<'_> {
    /// `(base, size)` of a view of this driver that contains `ptr`.
    pub(crate) fn range(&self, ptr: usize) -> Option<(usize, usize)> {
        let (&b, r) = self.table.range(..=ptr).next_back()?;
        (ptr < b + r.size && r.driver == self.driver).then_some((b, r.size))
    }
}

/// Locks the view table for the queues of driver `d`.
pub(crate) fn views(d: &DriverShared) -> Views<'static> {
    Views {
        table: IMPORTS.lock(),
        driver: d as *const DriverShared as usize,
    }
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
    EXPORTS.lock().retain(|_, r| r.context != context);
}

/// Number of live exports of this process, all drivers (handles got and not put), for leak
/// checks. Per driver: [`crate::Driver::ipc_stats`].
pub fn live_exports() -> usize {
    EXPORTS.lock().len()
}

/// Number of views opened in this process and not closed, all drivers, for leak checks. Per
/// driver: [`crate::Driver::ipc_stats`].
pub fn open_views() -> usize {
    IMPORTS.lock().len()
}

/// Counters of one driver's IPC state ([`crate::Driver::ipc_stats`]), for checks and leak tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IpcStats {
    /// Live exports of the driver's contexts: handles got (`zeMemGetIpcHandle*`) and not put
    /// (`zeMemPutIpcHandle`) while their context lives.
    pub exports: usize,
    /// Views opened (`zeMemOpenIpcHandle`) in the driver's contexts and not closed.
    pub views: usize,
    /// Live allocations created with a handle-type descriptor chained (their types are kept on
    /// the allocation's record and go with it).
    pub typed_allocations: usize,
    /// Live physical memory objects created with a handle-type descriptor chained.
    pub typed_physical: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Decoded {
        Decoded {
            kind: IpcHandleKind::Range,
            mem: MemoryType::Device,
            pid: 1234,
            nonce: 0xfeed,
            id: 77,
            token: [9; 16],
            size: 1 << 20,
            ino: 0,
            dev: 0,
            pieces: 3,
            lead: 0x1000,
            tail: 0x800,
        }
    }

    #[test]
    fn handle_round_trips_and_keeps_the_fd_in_the_first_four_bytes() {
        let h = encode(17, &sample());
        assert_eq!(h.fd(), 17);
        let d = decode(&h).unwrap();
        assert_eq!(
            (d.kind, d.pid, d.nonce, d.id, d.size, d.pieces),
            (IpcHandleKind::Range, 1234, 0xfeed, 77, 1 << 20, 3)
        );
        // A range handle carries the bytes before and after the range in its end pages; its
        // size is the range's.
        assert_eq!((d.lead, d.tail), (0x1000, 0x800));
        assert_eq!(h.size(), Some((1 << 20) - 0x1800));
        // An allocation handle carries the memfd's device and inode instead of a piece count.
        let a = Decoded {
            kind: IpcHandleKind::Allocation,
            ino: 0x1234_5678_9abc,
            dev: 0x0010_0001,
            pieces: 1,
            lead: 0,
            tail: 0,
            ..sample()
        };
        let d = decode(&encode(5, &a)).unwrap();
        assert_eq!((d.ino, d.dev, d.pieces), (0x1234_5678_9abc, 0x0010_0001, 1));
        let mut h2 = h;
        h2.set_fd(99);
        assert_eq!(h2.fd(), 99);
        assert!(decode(&h2).is_ok(), "the fd is not covered by the checksum");
    }

    #[test]
    fn any_altered_byte_after_the_fd_is_rejected() {
        let h = encode(3, &sample());
        for i in 4..64 {
            let mut b = h;
            b.data[i] ^= 0x40;
            let e = decode(&b).unwrap_err();
            assert_eq!(e.ze_result(), 0x7800_0004, "byte {i}");
        }
        assert!(decode(&IpcHandle::from_bytes([0; 64])).is_err());
    }

    #[test]
    fn handle_types_fabric_is_unsupported_and_bits_over_3_are_invalid_enumeration() {
        assert_eq!(
            IpcHandleTypes::from_raw(4).unwrap_err().ze_result(),
            0x7800_000c
        );
        assert_eq!(
            IpcHandleTypes::from_raw(0).unwrap(),
            IpcHandleTypes::DEFAULT
        );
        let e = check_handle_types(IpcHandleTypes::FABRIC_ACCESSIBLE, SUPPORTED_TYPES, None);
        assert_eq!(e.unwrap_err().ze_result(), 0x7800_0003);
        // A backend with fabric support: asking for a type not chained at creation fails.
        let both = IpcHandleTypes::from_raw(3).unwrap();
        let e = check_handle_types(
            IpcHandleTypes::FABRIC_ACCESSIBLE,
            both,
            Some(IpcHandleTypes::DEFAULT),
        );
        assert_eq!(e.unwrap_err().ze_result(), 0x7800_0003);
        assert!(check_handle_types(IpcHandleTypes::DEFAULT, both, Some(both)).is_ok());
    }

    #[test]
    fn piece_list_round_trips_and_rejects_truncation() {
        let p = vec![
            Piece {
                obj: 0,
                offset: 0x10000,
                len: 0x20000,
            },
            Piece {
                obj: 2,
                offset: 0,
                len: 0x10000,
            },
        ];
        let sizes = vec![0x40000, 0x10000, 0x10000];
        let b = serialize(0x30000, &sizes, &p);
        assert_eq!(deserialize(&b), Some((0x30000, sizes.clone(), p.clone())));
        assert_eq!(deserialize(&b[..b.len() - 1]), None);
        let mut longer = b.clone();
        longer.push(0);
        assert_eq!(deserialize(&longer), None);
        // A part count that points past the end is refused, not read out of bounds.
        let mut lying = b.clone();
        lying[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(deserialize(&lying), None);
        assert_eq!(
            deserialize(&serialize(0, &[], &[])),
            Some((0, vec![], vec![]))
        );
    }

    /// An object exported as several parts (a GPU's granules) is cut at part boundaries, with
    /// offsets relative to each part; one part (the host's memfd) keeps the run as it is.
    #[test]
    fn runs_are_cut_into_pieces_at_part_boundaries() {
        let g = 0x20_0000u64;
        assert_eq!(
            run_pieces(&[4 * g], 5, g, 2 * g),
            vec![Piece {
                obj: 5,
                offset: g,
                len: 2 * g
            }]
        );
        assert_eq!(
            run_pieces(&[g, g, g, g], 3, g, 2 * g),
            vec![
                Piece {
                    obj: 4,
                    offset: 0,
                    len: g
                },
                Piece {
                    obj: 5,
                    offset: 0,
                    len: g
                }
            ]
        );
        // Parts of unequal size, a run starting inside one and ending inside another.
        assert_eq!(
            run_pieces(&[2 * g, 2 * g], 0, g, 2 * g),
            vec![
                Piece {
                    obj: 0,
                    offset: g,
                    len: g
                },
                Piece {
                    obj: 1,
                    offset: 0,
                    len: g
                }
            ]
        );
    }
}
