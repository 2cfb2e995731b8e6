//! The Linux platform layer (the `hetmem-linux` crate, below every backend: one wrapper per
//! syscall or file read) in the backend's own terms: its classified OS errors become
//! [`HalError`]s, its protections [`Protection`]s, its broker failures [`TransportError`]s.
//! The host and the cuda backend both call these; nothing here calls the OS itself.

use std::os::fd::{BorrowedFd, OwnedFd};

use super::ipc::{BrokerAnswer, BrokerHandler, BrokerStats, ShareableIdentity, TransportError};
use super::{HalError, Protection, Result};

pub(crate) use hetmem_linux::broker::broker_name;
pub(crate) use hetmem_linux::{
    check_readable, current_numa_node, futex_wait, futex_wake, mapping_count, monotonic_ns,
    numa_nodes, open_fd_count, os_page_size, platform_facts, raise_fd_limit, total_ram, Errno,
};

impl From<hetmem_linux::OsError> for HalError {
    fn from(e: hetmem_linux::OsError) -> HalError {
        match e {
            hetmem_linux::OsError::OutOfHostMemory(m) => HalError::OutOfHostMemory(m),
            hetmem_linux::OsError::Unexpected(m) => HalError::Unexpected(m),
        }
    }
}

/// Translates an errno from `what` into a backend error naming the limit that was hit.
pub(crate) fn os_error(what: &str, e: Errno) -> HalError {
    hetmem_linux::os_error(what, e).into()
}

/// The weakest protection over `[addr, addr+size)` of this process (`/proc/self/maps`):
/// `None` if any byte is unmapped.
pub(crate) fn host_protection(addr: usize, size: usize) -> Option<Protection> {
    hetmem_linux::host_protection(addr, size).map(|p| match p {
        hetmem_linux::Protection::None => Protection::None,
        hetmem_linux::Protection::ReadOnly => Protection::ReadOnly,
        hetmem_linux::Protection::ReadWrite => Protection::ReadWrite,
    })
}

/// [`crate::backend::Backend::start_broker`] on Linux.
pub(crate) fn start_broker(make_handler: &dyn Fn() -> BrokerHandler) -> Result<u32> {
    Ok(hetmem_linux::start_broker(make_handler)?)
}

/// [`crate::backend::Backend::broker_request`] on Linux.
pub(crate) fn broker_request(
    pid: u32,
    nonce: u32,
    request: &[u8; 64],
    max_payload: usize,
    max_fds: usize,
) -> std::result::Result<BrokerAnswer, TransportError> {
    use hetmem_linux::broker::BrokerError as B;
    hetmem_linux::broker::broker_request(pid, nonce, request, max_payload, max_fds).map_err(|e| {
        match e {
            B::PeerGone => TransportError::PeerGone,
            B::Impostor(n) => TransportError::Impostor(n),
            B::Protocol(m) => TransportError::Protocol(m),
            B::Local(e) => TransportError::Local(e.into()),
        }
    })
}

/// [`crate::backend::Backend::broker_stats`] on Linux.
pub(crate) fn broker_stats() -> BrokerStats {
    use hetmem_linux::broker as b;
    BrokerStats {
        peers_active: b::broker_peers_active(),
        connections_dispatched: b::broker_connections_dispatched(),
        workers: b::broker_workers(),
        max_peers: b::MAX_BROKER_PEERS,
        worker_idle: b::WORKER_IDLE,
    }
}

/// [`crate::backend::Backend::random_token`] on Linux (`getrandom(2)`).
pub(crate) fn random_token() -> Result<[u8; 16]> {
    Ok(hetmem_linux::random_token()?)
}

/// [`crate::backend::Backend::shareable_identity`] on Linux (`fstat(2)`).
pub(crate) fn shareable_identity(fd: BorrowedFd<'_>) -> Option<ShareableIdentity> {
    hetmem_linux::broker::fd_identity(fd).map(|(dev, ino, size)| ShareableIdentity {
        dev,
        ino,
        size,
    })
}

/// The major device number of `fd` if it is a character device (`fstat(2)`); `Err` says why
/// it cannot be inspected.
pub(crate) fn char_device_major(fd: BorrowedFd<'_>) -> std::result::Result<Option<u32>, String> {
    hetmem_linux::broker::char_device_major(fd).map_err(|e| format!("fstat: {e}"))
}

/// A close-on-exec duplicate of `fd` (`fcntl(F_DUPFD_CLOEXEC)`); `what` names it in errors.
pub(crate) fn dup(fd: BorrowedFd<'_>, what: &str) -> Result<OwnedFd> {
    Ok(hetmem_linux::dup(fd, what)?)
}

/// [`crate::backend::Backend::write_record`] on Linux ([`hetmem_linux::records::write`]); a
/// failure is `OutOfHostMemory` naming the file (the space of `/dev/shm` is host memory).
pub(crate) fn write_record(name: &str, bytes: &[u8]) -> Result<()> {
    hetmem_linux::records::write(name, bytes)
        .map_err(|e| HalError::OutOfHostMemory(format!("writing {e}")))
}

/// [`crate::backend::Backend::read_record`] on Linux ([`hetmem_linux::records::read`]).
pub(crate) fn read_record(name: &str) -> std::result::Result<Vec<u8>, String> {
    hetmem_linux::records::read(name)
}

/// [`crate::backend::Backend::remove_record`] on Linux ([`hetmem_linux::records::remove`]).
pub(crate) fn remove_record(name: &str) {
    hetmem_linux::records::remove(name)
}

/// [`crate::backend::Backend::describe_export`] on Linux: a memfd holding `bytes`, sealed
/// against every change (`hetmem_linux::broker::sealed_memfd_holding`).
pub(crate) fn sealed_bytes(bytes: &[u8]) -> Result<OwnedFd> {
    hetmem_linux::broker::sealed_memfd_holding("hetmem-ipc-description", bytes).map_err(|e| {
        os_error(
            "memfd_create / write / F_ADD_SEALS of an export's description",
            e,
        )
    })
}

/// [`crate::backend::Backend::read_description`] on Linux
/// (`hetmem_linux::broker::read_sealed_memfd`).
pub(crate) fn read_sealed(fd: BorrowedFd<'_>, max: usize) -> std::result::Result<Vec<u8>, String> {
    hetmem_linux::broker::read_sealed_memfd(fd, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Failures of the OS carry the limit they hit, as the backend's own error kind, and are
    /// converted to the spec error in one place.
    #[test]
    fn os_errors_name_the_limit_and_stay_backend_errors() {
        match os_error("mmap", Errno::MFILE) {
            HalError::OutOfHostMemory(m) => assert!(m.contains("RLIMIT_NOFILE"), "{m}"),
            e => panic!("EMFILE gave {e:?}"),
        }
        assert!(matches!(
            os_error("x", Errno::INVAL),
            HalError::Unexpected(_)
        ));
        let e: crate::Error = HalError::OutOfHostMemory("m".into()).into();
        assert_eq!(e.ze_result(), 0x7000_0002);
        let e: crate::Error = HalError::Unsupported("m".into()).into();
        assert_eq!(e.ze_result(), 0x7800_0003);
    }
}
