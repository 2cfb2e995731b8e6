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
//! | 0..4 | an fd valid in the exporting process (`i32`, little endian): the allocation's or physical object's memfd; for a range, the first object's |
//! | 4..8 | magic `"HMIP"` |
//! | 8 | version (2) |
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
//!   list).
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
//! - Range (`range_size` set): null -> `InvalidNullPointer`; size 0 -> `InvalidSize`;
//!   `ptr` / size not multiples of the OS page -> `UnsupportedAlignment` / `UnsupportedSize`
//!   (the spec is silent; mappings are page-granular); then, over the whole range:
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

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::backend::host::ipc as transport;
use crate::backend::{AllocLocation, Backend, Protection, RawPhysical};
use crate::driver::{Context, Device, Driver, DriverShared};
use crate::error::{Addr, Error, Result};
use crate::queue::InFlightRef;
use crate::usm::{AllocDesc, MemoryType};
use crate::vmm::{PhysicalMemory, PhysicalMemoryFlags};

/// `ZE_MAX_IPC_HANDLE_SIZE`: the size in bytes of `ze_ipc_mem_handle_t` (64).
pub const IPC_HANDLE_SIZE: usize = 64;
const MAGIC: &[u8; 4] = b"HMIP";
const VERSION: u8 = 2;
/// The default of [`crate::RuntimeBuilder::ipc_max_range_pieces`]: most `(physical object,
/// offset, length)` pieces one range handle carries (1 << 20, a 24 MiB piece list).
pub const DEFAULT_MAX_RANGE_PIECES: usize = 1 << 20;

/// `ze_ipc_memory_flags_t` bits (the `flags` of `zeMemOpenIpcHandle`):
/// `ZE_IPC_MEMORY_FLAG_BIAS_CACHED`.
pub const IPC_MEMORY_FLAG_BIAS_CACHED: u32 = 1 << 0;
/// `ZE_IPC_MEMORY_FLAG_BIAS_UNCACHED`.
pub const IPC_MEMORY_FLAG_BIAS_UNCACHED: u32 = 1 << 1;

/// What a handle shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum IpcHandleKind {
    /// A host / device / shared allocation (`zeMemGetIpcHandle` on a USM pointer).
    Allocation = 1,
    /// One physical memory object (a mapped VA, or the object itself).
    Physical = 2,
    /// A VA range of several physical objects (`ze_ipc_phys_mem_handle_range_ext_desc_t`).
    Range = 3,
}

/// `ze_ipc_mem_handle_type_flags_t`, the `typeFlags` of `ze_ipc_mem_handle_type_ext_desc_t`
/// (memory extensions, `ZE_extension_ipc_mem_handle_type`): which handle types memory must
/// support, or which type a get asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcHandleTypes(u32);

impl IpcHandleTypes {
    /// `ZE_IPC_MEM_HANDLE_TYPE_FLAG_DEFAULT` (1 << 0): an fd-backed handle for this node.
    pub const DEFAULT: IpcHandleTypes = IpcHandleTypes(1);
    /// `ZE_IPC_MEM_HANDLE_TYPE_FLAG_FABRIC_ACCESSIBLE` (1 << 1): shareable over a fabric.
    pub const FABRIC_ACCESSIBLE: IpcHandleTypes = IpcHandleTypes(2);

    /// Decodes the C flags (`typeFlags`): bits over 0x3 are `InvalidEnumeration` naming the
    /// value; 0 is taken as DEFAULT (the spec is silent; zero-initialised descriptors are
    /// common).
    pub fn from_raw(v: u32) -> Result<IpcHandleTypes> {
        match v {
            0 => Ok(IpcHandleTypes::DEFAULT),
            1..=3 => Ok(IpcHandleTypes(v)),
            _ => Err(Error::InvalidEnumeration(format!(
                "IPC handle type flags {v:#x} exceed DEFAULT | FABRIC_ACCESSIBLE (0x3)"
            ))),
        }
    }
    /// The C flags.
    pub fn raw(self) -> u32 {
        self.0
    }
    /// Whether every type of `other` is in `self`.
    pub fn contains(self, other: IpcHandleTypes) -> bool {
        self.0 & other.0 == other.0
    }
}

/// The types every backend of this build supports: DEFAULT only (no fabric).
const SUPPORTED_TYPES: IpcHandleTypes = IpcHandleTypes::DEFAULT;

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
            asked.0, supported.0
        )));
    }
    if let Some(c) = created {
        if !c.contains(asked) {
            return Err(Error::UnsupportedFeature(format!(
                "IPC handle type flags {:#x} were not requested when the memory was created \
                 (it was created with {:#x})",
                asked.0, c.0
            )));
        }
    }
    Ok(())
}

/// The chained descriptors of `zeMemGetIpcHandleWithProperties`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IpcProperties {
    /// `ze_ipc_mem_handle_type_ext_desc_t` chained: the handle type asked.
    pub handle_types: Option<IpcHandleTypes>,
    /// `ze_ipc_phys_mem_handle_range_ext_desc_t` chained: the size in bytes of the range
    /// starting at `ptr`.
    pub range_size: Option<usize>,
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
    /// [`crate::backend::host::ipc::broker_name`]`(pid, nonce)`), or `None` for bytes that are
    /// not a valid handle.
    pub fn broker_nonce(&self) -> Option<u32> {
        decode(self).ok().map(|h| h.nonce)
    }
    /// Size in bytes of the view an open maps, or `None` for bytes that are not a valid handle.
    pub fn size(&self) -> Option<usize> {
        decode(self).ok().map(|h| h.size as usize)
    }
}

#[derive(Debug, Clone, Copy)]
struct Decoded {
    kind: IpcHandleKind,
    mem: MemoryType,
    pid: u32,
    nonce: u32,
    id: u32,
    token: [u8; 16],
    size: u64,
    /// Allocation / physical object: the memfd's `st_ino` (0 for a range).
    ino: u64,
    /// Allocation / physical object: the memfd's `st_dev` (0 for a range).
    dev: u32,
    /// Pieces (1 unless a range).
    pieces: u32,
}

fn fnv1a(b: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &x in b {
        h ^= x as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

fn encode(fd: i32, h: &Decoded) -> IpcHandle {
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
    } else {
        d[48..56].copy_from_slice(&h.ino.to_le_bytes());
        d[56..60].copy_from_slice(&h.dev.to_le_bytes());
    }
    let c = fnv1a(&d[4..60]);
    d[60..64].copy_from_slice(&c.to_le_bytes());
    IpcHandle { data: d }
}

fn decode(h: &IpcHandle) -> Result<Decoded> {
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
    })
}

/// One piece of a view: `len` bytes of object `obj` (an index into the fds) from `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    obj: u32,
    offset: u64,
    len: u64,
}

#[derive(Debug)]
struct ExportRec {
    token: [u8; 16],
    kind: IpcHandleKind,
    context: u64,
    /// The exporting driver (`Arc::as_ptr` of its shared state; its contexts keep it alive
    /// while the export lives).
    driver: usize,
    size: u64,
    fds: Arc<[OwnedFd]>,
    pieces: Arc<[Piece]>,
}

#[derive(Debug, Clone, Copy)]
struct ImportRec {
    size: usize,
    context: u64,
    /// The opening driver (`Arc::as_ptr` of its shared state; unique while the view lives,
    /// since the context, which keeps the driver alive, closes its views at teardown).
    driver: usize,
    mem: MemoryType,
    id: u64,
    page_size: usize,
}

/// Exports of this process (export id -> record); read by the broker thread.
static EXPORTS: Mutex<BTreeMap<u32, ExportRec>> = Mutex::new(BTreeMap::new());
/// The next export id to try (ids are `u32`, non-zero, wrapping; see the module docs).
static NEXT_EXPORT: AtomicU32 = AtomicU32::new(1);
/// Views opened in this process (base -> record).
static IMPORTS: Mutex<BTreeMap<usize, ImportRec>> = Mutex::new(BTreeMap::new());

fn own_pid() -> u32 {
    rustix::process::getpid().as_raw_nonzero().get() as u32
}

/// Longest refusal message an importer accepts from a broker, in bytes.
const REFUSAL_MAX: usize = 4096;

/// Broker status codes (the semantics of a refusal).
const ST_OK: u32 = 0;
const ST_UNKNOWN: u32 = 1;
const ST_TOKEN: u32 = 2;

fn serialize(size: u64, pieces: &[Piece]) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + pieces.len() * 24);
    v.extend_from_slice(&size.to_le_bytes());
    v.extend_from_slice(&(pieces.len() as u64).to_le_bytes());
    for p in pieces {
        v.extend_from_slice(&(p.obj as u64).to_le_bytes());
        v.extend_from_slice(&p.offset.to_le_bytes());
        v.extend_from_slice(&p.len.to_le_bytes());
    }
    v
}

fn deserialize(b: &[u8]) -> Option<(u64, Vec<Piece>)> {
    let u =
        |i: usize| -> Option<u64> { Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?)) };
    let size = u(0)?;
    let n = u(8)? as usize;
    if b.len() != 16 + n.checked_mul(24)? {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let at = 16 + i * 24;
        out.push(Piece {
            obj: u32::try_from(u(at)?).ok()?,
            offset: u(at + 8)?,
            len: u(at + 16)?,
        });
    }
    Some((size, out))
}

/// The broker's handler: checks the export id and token, answers with dups of the fds.
fn serve_request(req: &[u8; 64], _peer_pid: u32) -> transport::BrokerReply {
    let refuse = |status: u32, msg: String| transport::BrokerReply {
        status,
        payload: msg.into_bytes(),
        fds: None,
    };
    let h = match decode(&IpcHandle { data: *req }) {
        Ok(h) => h,
        Err(e) => return refuse(ST_UNKNOWN, e.message().to_string()),
    };
    let (fds, size, pieces) = {
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
        (rec.fds.clone(), rec.size, rec.pieces.clone())
    };
    // Sent after the lock is dropped; a concurrent put leaves these fds open until sent.
    transport::BrokerReply {
        status: ST_OK,
        payload: serialize(size, &pieces),
        fds: Some(fds),
    }
}

/// Constant-time comparison of tokens.
fn token_eq(a: &[u8; 16], b: &[u8; 16]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Starts (or finds) this process's broker; returns its nonce. A failure is not remembered.
fn start_broker() -> Result<u32> {
    transport::start_broker(|| Arc::new(serve_request)).map_err(|e| {
        Error::Unknown(format!(
            "could not start the IPC broker socket \"hetmem-ipc-broker.{}.<random>\" ({e}{}); \
             the next export tries again",
            own_pid(),
            if e == rustix::io::Errno::ADDRINUSE {
                ": every name tried was already bound by another socket"
            } else {
                ""
            }
        ))
    })
}

/// Checks an fd an open received (from a broker or through `SCM_RIGHTS`) before anything is
/// mapped from it: a memfd sealed against grow and shrink, of at least `need` bytes.
/// Errors: `InvalidArgument` saying what is wrong.
fn check_received_fd(fd: BorrowedFd<'_>, need: u64) -> Result<()> {
    use rustix::fs::SealFlags;
    let seals = transport::fd_seals(fd).map_err(|e| {
        Error::InvalidArgument(format!(
            "a received fd is not a sealable memfd (F_GET_SEALS: {e}); refusing to map it"
        ))
    })?;
    if !seals.contains(SealFlags::GROW | SealFlags::SHRINK) {
        return Err(Error::InvalidArgument(format!(
            "a received memfd is not sealed against grow and shrink (seals {:#x}); refusing to \
             map it",
            seals.bits()
        )));
    }
    let (_, _, size) = transport::fd_identity(fd).ok_or_else(|| {
        Error::InvalidArgument("a received fd cannot be inspected (fstat failed)".into())
    })?;
    if size < need {
        return Err(Error::InvalidArgument(format!(
            "a received memfd holds {size:#x} bytes, the handle maps {need:#x}"
        )));
    }
    Ok(())
}

/// A fresh export id: non-zero, not live (wraps after 2^32 - 1).
fn fresh_export_id(live: &BTreeMap<u32, ExportRec>) -> u32 {
    loop {
        let id = NEXT_EXPORT.fetch_add(1, Ordering::Relaxed);
        if id != 0 && !live.contains_key(&id) {
            return id;
        }
    }
}

/// Registers an export of `context` of driver `driver` (its `DriverShared` address) and makes
/// its handle.
#[allow(clippy::too_many_arguments)]
fn register(
    driver: usize,
    context: u64,
    kind: IpcHandleKind,
    mem: MemoryType,
    size: usize,
    fds: Vec<OwnedFd>,
    pieces: Vec<Piece>,
) -> Result<IpcHandle> {
    let nonce = start_broker()?;
    let token = transport::random_token()
        .map_err(|e| Error::Unknown(format!("getrandom for an IPC token failed: {e}")))?;
    let first = fds.first().expect("an export has an fd");
    let (dev, ino, _) = transport::fd_identity(first.as_fd()).unwrap_or_default();
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
        pieces: pieces.len() as u32,
    };
    ex.insert(
        id,
        ExportRec {
            token,
            kind,
            context,
            driver,
            size: size as u64,
            fds: fds.into(),
            pieces: pieces.into(),
        },
    );
    Ok(encode(fd, &h))
}

/// What an open needs: the view size, the objects' fds and the pieces.
struct Material {
    size: usize,
    fds: Vec<OwnedFd>,
    pieces: Vec<Piece>,
}

fn dup_all(fds: &[OwnedFd]) -> Result<Vec<OwnedFd>> {
    fds.iter()
        .map(|f| {
            transport::dup_fd(f.as_fd()).map_err(|e| {
                Error::OutOfHostMemory(format!("fcntl(F_DUPFD_CLOEXEC) for an IPC open: {e}"))
            })
        })
        .collect()
}

/// What opening `handle` maps: from this process's own export, from the fd in bytes 0..4, or
/// from the exporter's broker. `max_pieces` is the opening driver's
/// [`Driver::ipc_max_range_pieces`]: a range handle claiming more is `UnsupportedSize`, and the
/// broker's answer is bounded by the pieces the handle claims.
fn material(h: &Decoded, handle: &IpcHandle, max_pieces: usize) -> Result<Material> {
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
            fds: dup_all(&rec.fds)?,
            pieces: rec.pieces.to_vec(),
        });
    }
    // The fd transport: bytes 0..4 hold an fd of ours that is the exported memfd itself.
    let fd = handle.fd();
    if h.kind != IpcHandleKind::Range && fd >= 0 {
        // SAFETY: only inspected (fstat, F_GET_SEALS) and duplicated; an fd number that is not
        // open fails.
        let b = unsafe { BorrowedFd::borrow_raw(fd) };
        if let Some((dev, ino, _)) = transport::fd_identity(b) {
            if ino == h.ino && dev == h.dev as u64 {
                check_received_fd(b, h.size)?;
                let d = dup_all(std::slice::from_ref(&transport::dup_fd(b).map_err(
                    |e| {
                        Error::OutOfHostMemory(format!(
                            "fcntl(F_DUPFD_CLOEXEC) for an IPC open: {e}"
                        ))
                    },
                )?))?;
                return Ok(Material {
                    size: h.size as usize,
                    fds: d,
                    pieces: vec![Piece {
                        obj: 0,
                        offset: 0,
                        len: h.size,
                    }],
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
    // The answer is bounded by what the handle claims (a refusal's message by 4 KiB).
    let pieces = (h.pieces as usize).max(1);
    let reply = transport::broker_request(
        h.pid,
        h.nonce,
        &handle.data,
        (16 + 24 * pieces).max(REFUSAL_MAX),
        pieces,
    )
    .map_err(|e| {
        if e == rustix::io::Errno::PERM {
            Error::InvalidArgument(format!(
                "the socket named {:?} is not served by the exporting process {} running \
                     as our uid (SO_PEERCRED): the exporter is gone and another process holds \
                     its name; nothing was sent to it",
                transport::broker_name(h.pid, h.nonce),
                h.pid
            ))
        } else if e == rustix::io::Errno::CONNREFUSED || e == rustix::io::Errno::NOENT {
            Error::InvalidArgument(format!(
                "the exporting process {} is gone (no IPC broker answers): the handle \
                     cannot be opened any more",
                h.pid
            ))
        } else {
            Error::InvalidArgument(format!("the IPC broker of process {} failed: {e}", h.pid))
        }
    })?;
    if reply.status != ST_OK {
        return Err(Error::InvalidArgument(format!(
            "process {} refused the handle: {}",
            h.pid,
            String::from_utf8_lossy(&reply.payload)
        )));
    }
    let (size, pieces) = deserialize(&reply.payload).ok_or_else(|| {
        Error::InvalidArgument(format!("malformed piece list from process {}", h.pid))
    })?;
    if size != h.size || pieces.len() != h.pieces as usize {
        return Err(Error::InvalidArgument(format!(
            "process {} described a view of {size:#x} bytes in {} pieces, the handle says \
             {:#x} bytes in {}",
            h.pid,
            pieces.len(),
            h.size,
            h.pieces
        )));
    }
    Ok(Material {
        size: size as usize,
        fds: reply.fds,
        pieces,
    })
}

/// Checks that the pieces tile `size` bytes and lie inside their objects (so no mapping can
/// reach past an object's end).
fn validate(m: &Material) -> Result<()> {
    let page = crate::backend::host::os_page_size() as u64;
    let mut total: u64 = 0;
    // Seals first: once GROW | SHRINK are set, the sizes read below cannot change.
    for (i, fd) in m.fds.iter().enumerate() {
        let need = m
            .pieces
            .iter()
            .filter(|p| p.obj as usize == i)
            .map(|p| p.offset.saturating_add(p.len))
            .max()
            .unwrap_or(0);
        check_received_fd(fd.as_fd(), need)?;
    }
    for p in &m.pieces {
        let fd = m.fds.get(p.obj as usize).ok_or_else(|| {
            Error::InvalidArgument(format!("piece names object {} of {}", p.obj, m.fds.len()))
        })?;
        let (_, _, osize) = transport::fd_identity(fd.as_fd()).unwrap_or_default();
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
fn map_view(backend: &dyn Backend, align: usize, m: Material) -> Result<usize> {
    // SAFETY: a fresh placeholder chosen by the backend; replaces nothing.
    let base = unsafe { backend.reserve(None, m.size, align)? };
    let mut raws: Vec<RawPhysical> = Vec::with_capacity(m.fds.len());
    let mut result = Ok(());
    for fd in m.fds {
        match backend.import_physical(fd) {
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
        return Err(e);
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

/// `(base, end)` of a view opened in this process (any context, any driver) that overlaps
/// `[start, end)`: memory that is neither system memory nor reserved VA of this process.
pub(crate) fn view_overlapping(start: usize, end: usize) -> Option<(usize, usize)> {
    let im = IMPORTS.lock();
    let (&b, r) = im.range(..end).next_back()?;
    (b + r.size > start).then_some((b, b + r.size))
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
fn location_type(loc: crate::backend::PhysicalLocation) -> MemoryType {
    match loc {
        crate::backend::PhysicalLocation::Device(_) => MemoryType::Device,
        crate::backend::PhysicalLocation::Host => MemoryType::Host,
    }
}

/// The table of views opened in this process, locked, as seen by the queues of one driver.
/// Queue operand checks ([`crate::queue`]) hold it while they take their in-flight references,
/// so no close can slip in between (lock order: usm, vm, this table, the in-flight table).
pub(crate) struct Views<'a> {
    table: parking_lot::MutexGuard<'a, BTreeMap<usize, ImportRec>>,
    driver: usize,
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
            .map(|b| (b, im.remove(&b).expect("listed").size))
            .collect();
    };
    for (b, s) in views {
        // SAFETY: a view we mapped; the context is gone, so nobody uses it.
        unsafe { backend.release_mapped(b, s, &[(b, b + s)]).ok() };
    }
    EXPORTS.lock().retain(|_, r| r.context != context);
}

/// Number of live exports of this process, all drivers (handles got and not put), for leak
/// checks. Per driver: [`Driver::ipc_stats`].
pub fn live_exports() -> usize {
    EXPORTS.lock().len()
}

/// Number of views opened in this process and not closed, all drivers, for leak checks. Per
/// driver: [`Driver::ipc_stats`].
pub fn open_views() -> usize {
    IMPORTS.lock().len()
}

/// Counters of one driver's IPC state ([`Driver::ipc_stats`]), for checks and leak tests.
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

impl Driver {
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
    /// mapped page, or imported system memory. With a range: `InvalidSize` for size 0,
    /// `UnsupportedAlignment` / `UnsupportedSize` for a pointer / size that is not a multiple
    /// of the OS page, `InvalidArgument` if memory that is not reserved VA overlaps the range (a
    /// USM allocation or import, a managed allocation, an opened IPC view),
    /// `AddressNotFound` naming the first byte not mapped to a physical object (an unmapped
    /// page of a reservation, or an address hetmem does not know), `UnsupportedSize` past
    /// [`Driver::ipc_max_range_pieces`] pieces, `UnsupportedFeature` if a physical object in
    /// the range was created with handle types that do not include the asked ones. Nothing
    /// changes on error (no export, no fd, no broker traffic).
    ///
    /// Units: `ptr` is an address, `props.range_size` bytes; the handle's view size is the
    /// allocation's page-rounded span, the whole physical object, or exactly the range size.
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
            let fd = d.backend.export_allocation(raw)?;
            drop(usm);
            return register(
                Arc::as_ptr(d) as usize,
                self.id(),
                IpcHandleKind::Allocation,
                kind,
                span,
                vec![fd],
                vec![Piece {
                    obj: 0,
                    offset: 0,
                    len: span as u64,
                }],
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
        let fd = d.backend.export_physical(raw)?;
        drop(vm);
        register(
            Arc::as_ptr(d) as usize,
            self.id(),
            IpcHandleKind::Physical,
            location_type(loc),
            size,
            vec![fd],
            vec![Piece {
                obj: 0,
                offset: 0,
                len: size as u64,
            }],
        )
    }

    /// The range export of [`Context::get_ipc_handle_with_properties`]; `asked` has passed the
    /// backend check and is checked against every object's types here.
    fn export_range(&self, ptr: usize, size: usize, asked: IpcHandleTypes) -> Result<IpcHandle> {
        if size == 0 {
            return Err(Error::InvalidSize("IPC range size is 0".into()));
        }
        let page = crate::backend::host::os_page_size();
        if !ptr.is_multiple_of(page) {
            return Err(Error::UnsupportedAlignment(format!(
                "IPC range start {} is not a multiple of the {page:#x}-byte page",
                Addr(ptr)
            )));
        }
        if !size.is_multiple_of(page) {
            return Err(Error::UnsupportedSize(format!(
                "IPC range size {size:#x} is not a multiple of the {page:#x}-byte page"
            )));
        }
        let end = ptr.checked_add(size).ok_or_else(|| {
            Error::InvalidArgument(format!("IPC range {} + {size:#x} overflows", Addr(ptr)))
        })?;
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
        let runs = vm.mapped_pieces(ptr, end).map_err(|hole| {
            Error::AddressNotFound(format!(
                "IPC range [{}, {}) is not fully mapped: {} is not mapped to physical memory",
                Addr(ptr),
                Addr(end),
                Addr(hole)
            ))
        })?;
        let limit = d.ipc_max_range_pieces;
        if runs.len() > limit {
            return Err(Error::UnsupportedSize(format!(
                "IPC range [{}, {}) has {} mapped pieces; a range handle carries at most {limit}",
                Addr(ptr),
                Addr(end),
                runs.len()
            )));
        }
        let mut index: HashMap<u64, u32> = HashMap::new();
        let mut mem = MemoryType::Device;
        let mut fds = Vec::new();
        let mut pieces = Vec::with_capacity(runs.len());
        for (phys, offset, len) in runs {
            let obj = match index.get(&phys) {
                Some(&i) => i,
                None => {
                    let raw = match vm.physical_raw(phys) {
                        Some((raw, _, ctx, loc)) if ctx == self.id() => {
                            if fds.is_empty() {
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
                    fds.push(d.backend.export_physical(raw)?);
                    let i = (fds.len() - 1) as u32;
                    index.insert(phys, i);
                    i
                }
            };
            pieces.push(Piece {
                obj,
                offset: offset as u64,
                len: len as u64,
            });
        }
        drop(vm);
        register(
            Arc::as_ptr(d) as usize,
            self.id(),
            IpcHandleKind::Range,
            mem,
            size,
            fds,
            pieces,
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
        let m = material(&h, handle, d.ipc_max_range_pieces)?;
        validate(&m)?;
        let align = d.vm.read().page_size(m.size);
        let size = m.size;
        let base = map_view(d.backend.as_ref(), align, m)?;
        IMPORTS.lock().insert(
            base,
            ImportRec {
                size,
                context: self.id(),
                driver: Arc::as_ptr(d) as usize,
                mem: h.mem,
                id: crate::capacity::fresh_id(),
                page_size: align,
            },
        );
        Ok(base)
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
    /// exporter, a received fd that is not a sealed memfd large enough; `InvalidNullHandle`
    /// for a device of another driver; `OutOfHostMemory` if the OS refuses. Nothing changes
    /// on error.
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
        let drv = self.driver();
        let d = &drv.shared;
        let m = material(&h, handle, d.ipc_max_range_pieces)?;
        validate(&m)?;
        let size = m.size;
        let fd =
            m.fds.into_iter().next().ok_or_else(|| {
                Error::InvalidArgument("the export carries no memory object".into())
            })?;
        let raw = d.backend.import_physical(fd)?;
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
        let rec = *im.get(&ptr).expect("checked under this lock");
        // SAFETY: the whole view we mapped at open.
        unsafe {
            drv.shared
                .backend
                .release_mapped(ptr, rec.size, &[(ptr, ptr + rec.size)])?
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

    /// `zeMemAllocDevice` with `ze_ipc_mem_handle_type_ext_desc_t` chained: as
    /// [`Context::alloc_device`], recording the handle types the memory must support.
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
        check_handle_types(types, SUPPORTED_TYPES, None)?;
        self.check_device(device)?;
        self.alloc_typed(AllocLocation::Device(device.ordinal()), desc, types)
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
        check_handle_types(types, SUPPORTED_TYPES, None)?;
        self.alloc_typed(AllocLocation::Host, desc, types)
    }

    /// Allocates and records the handle types under one hold of the USM lock.
    fn alloc_typed(
        &self,
        location: AllocLocation,
        desc: &AllocDesc,
        types: IpcHandleTypes,
    ) -> Result<usize> {
        let d = self.driver_shared();
        let mut usm = d.usm.write();
        let p = usm.alloc(d.backend.as_ref(), self.id(), location, desc)?;
        usm.set_ipc_types(self.id(), p, types);
        Ok(p)
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
        // An allocation handle carries the memfd's device and inode instead of a piece count.
        let a = Decoded {
            kind: IpcHandleKind::Allocation,
            ino: 0x1234_5678_9abc,
            dev: 0x0010_0001,
            pieces: 1,
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

    fn memfd(size: u64, seals: rustix::fs::SealFlags) -> OwnedFd {
        use rustix::fs::MemfdFlags;
        let fd =
            rustix::fs::memfd_create("t", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&fd, size).unwrap();
        if !seals.is_empty() {
            rustix::fs::fcntl_add_seals(&fd, seals).unwrap();
        }
        fd
    }

    #[test]
    fn received_fd_must_be_a_memfd_sealed_against_grow_and_shrink_and_large_enough() {
        use rustix::fs::SealFlags;
        let ok = memfd(
            1 << 16,
            SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
        );
        assert!(check_received_fd(ok.as_fd(), 1 << 16).is_ok());
        let e = check_received_fd(ok.as_fd(), (1 << 16) + 1).unwrap_err();
        assert_eq!(e.ze_result(), 0x7800_0004, "{e}");
        assert!(e.message().contains("holds"), "{e}");
        for seals in [SealFlags::empty(), SealFlags::GROW, SealFlags::SHRINK] {
            let f = memfd(1 << 16, seals);
            let e = check_received_fd(f.as_fd(), 1 << 16).unwrap_err();
            assert_eq!(e.ze_result(), 0x7800_0004, "{seals:?}");
            assert!(e.message().contains("not sealed"), "{e}");
        }
        // Not a memfd at all: a pipe.
        let (r, _w) = rustix::pipe::pipe().unwrap();
        let e = check_received_fd(r.as_fd(), 1).unwrap_err();
        assert_eq!(e.ze_result(), 0x7800_0004);
        assert!(e.message().contains("not a sealable memfd"), "{e}");
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
        let b = serialize(0x30000, &p);
        assert_eq!(deserialize(&b), Some((0x30000, p)));
        assert_eq!(deserialize(&b[..b.len() - 1]), None);
    }
}
