//! The IPC handle's wire format: the 64 bytes of `ze_ipc_mem_handle_t` ([`IpcHandle`], encoded
//! and decoded here, with its checksum), the broker's answer (the part sizes and the piece
//! list, [`serialize`] / [`deserialize`]) and its status codes, and the cutting of exported
//! memory into pieces ([`whole_pieces`], [`run_pieces`]). Pure functions of bytes: no state,
//! no lock, no backend.
//!
//! # The handle (64 bytes, `ze_ipc_mem_handle_t`)
//! | bytes | field |
//! |---|---|
//! | 0..4 | an fd valid in the exporting process (`i32`, little endian): on a backend whose shareable fds identify their memory (host), the allocation's or physical object's shareable handle (its memfd; for a range, or memory exported as several parts, the first part's); on one whose fds do not (cuda), the export's description: a sealed memfd holding these 64 bytes with -1 in bytes 0..4 (`crate::semantics::ipc::export::register`) |
//! | 4..8 | magic `"HMIP"` |
//! | 8 | version (3) |
//! | 9 | kind: 1 allocation, 2 physical object, 3 range |
//! | 10 | memory type of the exported memory (`ze_memory_type_t`: 1 host, 2 device, 3 shared) |
//! | 11 | 0; 1 for a handle `zeMemGetIpcHandleFromFileDescriptorExp` made in a process that did not export the memory (it holds nothing there: its put is `SUCCESS` and changes nothing; its open asks the exporter with byte 11 cleared) |
//! | 12..16 | exporter pid (`u32`) |
//! | 16..20 | exporter's broker nonce (`u32`, random, non-zero): the broker's socket is named `hetmem-ipc-broker.<pid>.<nonce as 8 hex digits>` |
//! | 20..24 | export id (`u32`, per exporter, non-zero; after 2^32 - 1 exports ids wrap, skipping live ones; a reused id never opens an old handle since the token differs) |
//! | 24..40 | secret random token (`getrandom(2)`) |
//! | 40..48 | size in bytes of the importer's view (`u64`) |
//! | 48..56 | allocation / physical object: `st_ino` of the memfd in bytes 0..4; range: number of (object, offset, length) pieces (`u32`) then 4 zero bytes |
//! | 56..60 | allocation / physical object: `st_dev` of that memfd (`u32`: Linux's `dev_t` is 32 bits: 12 major, 20 minor); range: 0 |
//! | 60..64 | FNV-1a checksum of bytes 4..60 (catches corruption; the token, not the checksum, stops forgery) |
//!
//! All integers little endian. A malformed handle (magic, version, checksum, kind) is
//! `InvalidArgument` at [`decode`].

use crate::backend::SharedPart;
use crate::error::{Error, Result};
use crate::semantics::usm::MemoryType;
use crate::spec::IpcHandleKind;

/// `ZE_MAX_IPC_HANDLE_SIZE`: the size in bytes of `ze_ipc_mem_handle_t` (64).
pub const IPC_HANDLE_SIZE: usize = 64;
pub(crate) const MAGIC: &[u8; 4] = b"HMIP";
/// 3 since the broker's answer carries the size of each shared part (see [`serialize`]).
pub(crate) const VERSION: u8 = 3;
/// The default of [`crate::RuntimeBuilder::ipc_max_range_pieces`]: most `(physical object,
/// offset, length)` pieces one range handle carries (1 << 20, a 24 MiB piece list).
pub const DEFAULT_MAX_RANGE_PIECES: usize = 1 << 20;

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
    /// Byte 11: made by `zeMemGetIpcHandleFromFileDescriptorExp` in a process that is not the
    /// exporter (holds nothing there).
    pub(crate) from_fd: bool,
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
    d[11] = h.from_fd as u8;
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
    if c != fnv1a(&d[4..60]) || !(1..=3).contains(&d[10]) || d[11] > 1 {
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
        from_fd: d[11] == 1,
    })
}

/// One piece of a view: `len` bytes of object `obj` (an index into the fds) from `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) obj: u32,
    pub(crate) offset: u64,
    pub(crate) len: u64,
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
            from_fd: false,
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
