//! The backend's side of IPC: the types of the transport operations of
//! [`Backend`](super::Backend) (a per-process broker that hands shareable handles to importers,
//! and the checks and identity of a shareable handle).
//!
//! The handle format, every rule about what a request means and what to answer, and every error
//! code live in the semantics layer (`crate::semantics::ipc`: the format in `format.rs`, the
//! broker's answers in `broker.rs`); a backend only moves bytes and
//! shareable handles (POSIX file descriptors on both the host and the CUDA backend:
//! a memfd, or what `cuMemExportToShareableHandle(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)`
//! returns).

use super::HalError;

pub use hetmem_linux::broker::{BrokerAnswer, BrokerHandler, BrokerReply};
/// The shareable handles of every backend are file descriptors (a sealed memfd on the host, a
/// `cuMemExportToShareableHandle` POSIX fd on CUDA): the layers above hold, borrow and number
/// them by these types, named from here (only the backend layer names `std::os`).
pub use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

/// Why a broker request failed, as far as the transport can tell.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// The exporting process is gone: no broker serves its name, or the connection ended
    /// before the whole answer came (it died while answering).
    #[error("the exporting process is gone")]
    PeerGone,
    /// The broker's name is served by a process other than the exporter (another pid, or
    /// another user): nothing was sent to it. Carries the name.
    #[error("the broker name {0:?} is served by another process")]
    Impostor(String),
    /// The answer broke the wire format or exceeded the bounds the requester set.
    #[error("malformed broker answer: {0}")]
    Protocol(String),
    /// A local failure (out of file descriptors, a socket call refused).
    #[error("{0}")]
    Local(HalError),
}

/// One part of exported memory: a shareable handle (an fd owned by the holder) and the bytes
/// of memory it holds (a multiple of the backend's page size).
#[derive(Debug)]
pub struct SharedPart {
    /// The shareable handle.
    pub fd: std::os::fd::OwnedFd,
    /// Bytes of memory behind it.
    pub size: u64,
}

/// Identity of a shareable handle: the same memory gives the same identity in every process
/// (host: `st_dev` and `st_ino` of the memfd; CUDA: those of the exported fd), with the size
/// of the memory behind it in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ShareableIdentity {
    /// The file system device (`st_dev`).
    pub dev: u64,
    /// The inode (`st_ino`).
    pub ino: u64,
    /// Bytes of memory behind the handle (`st_size`).
    pub size: u64,
}

/// The state of this process's broker, for leak checks and `hetmem info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BrokerStats {
    /// Peers handed to a worker and not yet finished (waiting for it or being served).
    pub peers_active: usize,
    /// Connections the broker has accepted and dealt with (served, refused busy, or dropped as a
    /// stranger's) since the process started: once it has grown by the number of connections a
    /// test made, `peers_active` counts every one of them still unfinished.
    pub connections_dispatched: u64,
    /// Worker threads alive now (idle ones exit after `worker_idle`).
    pub workers: usize,
    /// Most peers served at once; further connections are dropped until one finishes.
    pub max_peers: usize,
    /// How long an idle worker stays before it exits.
    pub worker_idle: std::time::Duration,
}
