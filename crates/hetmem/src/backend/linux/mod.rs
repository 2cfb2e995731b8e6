//! The Linux platform layer: what every backend running on Linux shares (the host backend and
//! the cuda backend alike): machine facts, NUMA, `/proc/self/maps`, errno translation, and the
//! IPC transport ([`broker`]: the per-process broker socket and `SCM_RIGHTS`). One small
//! function per syscall or file read, each naming it.

pub(crate) mod broker;

use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::io::Errno;

use super::ipc::{BrokerAnswer, BrokerHandler, BrokerStats, ShareableIdentity, TransportError};
use super::{HalError, Protection, Result};

/// Total RAM of the machine in bytes (`sysinfo(2)`).
pub(crate) fn total_ram() -> u64 {
    let info = rustix::system::sysinfo();
    info.totalram as u64 * info.mem_unit.max(1) as u64
}

/// The OS page size in bytes (`getauxval(AT_PAGESZ)` through rustix).
pub(crate) fn os_page_size() -> usize {
    rustix::param::page_size()
}

/// Raises the soft limit of open files (`RLIMIT_NOFILE`) to the hard limit, so that many
/// physical objects (one memfd each) can be live at once (`getrlimit(2)`, `setrlimit(2)`).
/// Returns the limit now in force.
pub(crate) fn raise_fd_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut lim = getrlimit(Resource::Nofile);
    if lim.current != lim.maximum {
        lim.current = lim.maximum;
        let _ = setrlimit(Resource::Nofile, lim);
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// Reads the [`PlatformFacts`](crate::backend::PlatformFacts) of this machine and process (`sysinfo(2)`,
/// the page size, `getrlimit(RLIMIT_NOFILE)`, `/proc/sys/vm/max_map_count`). Changes nothing.
pub(crate) fn platform_facts() -> crate::backend::PlatformFacts {
    crate::backend::PlatformFacts {
        total_ram: total_ram(),
        page_size: os_page_size(),
        open_file_limit: fd_limit(),
        max_map_count: max_map_count(),
    }
}

/// The soft limit of open files now in force (`getrlimit(RLIMIT_NOFILE)`); `None` if unlimited.
pub(crate) fn fd_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// `vm.max_map_count`, the kernel's cap on mappings (VMAs) per process
/// (`/proc/sys/vm/max_map_count`).
pub(crate) fn max_map_count() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Translates an errno from `what` into a hetmem error naming the limit that was hit.
pub(crate) fn os_error(what: &str, e: Errno) -> HalError {
    match e {
        Errno::NOMEM => HalError::OutOfHostMemory(format!(
            "{what} failed with ENOMEM: the address space (RLIMIT_AS {}), RAM, or the mapping \
             limit vm.max_map_count ({}) is exhausted",
            rustix::process::getrlimit(rustix::process::Resource::As)
                .current
                .map_or("unlimited".to_string(), |v| v.to_string()),
            max_map_count().map_or("unknown".to_string(), |v| v.to_string())
        )),
        Errno::MFILE | Errno::NFILE => HalError::OutOfHostMemory(format!(
            "{what} failed with {}: the open-file limit RLIMIT_NOFILE ({}) is reached",
            if e == Errno::MFILE {
                "EMFILE"
            } else {
                "ENFILE"
            },
            rustix::process::getrlimit(rustix::process::Resource::Nofile)
                .current
                .map_or("unlimited".to_string(), |v| v.to_string())
        )),
        Errno::NOSPC => HalError::OutOfHostMemory(format!("{what} failed with ENOSPC")),
        other => HalError::Unexpected(format!("{what} failed: {other}")),
    }
}

/// The NUMA nodes of this machine (`/sys/devices/system/node/node<N>`), ascending; `[0]` if
/// none listed. The ids `ACL_MEM_LOCATIONTYPE_HOST_NUMA` accepts. Never fails.
pub(crate) fn numa_nodes() -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir("/sys/devices/system/node")
        .map(|d| {
            d.filter_map(|e| {
                let n = e.ok()?.file_name().into_string().ok()?;
                n.strip_prefix("node")?.parse().ok()
            })
            .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    if v.is_empty() {
        v.push(0);
    }
    v
}

/// The NUMA node of the CPU the calling thread runs on (`getcpu(2)`); 0 if unknown. What
/// `ACL_MEM_LOCATIONTYPE_HOST_NUMA_CURRENT` resolves to when a call is made. Never fails.
pub(crate) fn current_numa_node() -> u32 {
    let mut cpu: libc::c_uint = 0;
    let mut node: libc::c_uint = 0;
    // SAFETY: getcpu writes two unsigned ints through valid pointers; the cache arg may be null.
    let r = unsafe {
        libc::syscall(
            libc::SYS_getcpu,
            &mut cpu as *mut libc::c_uint,
            &mut node as *mut libc::c_uint,
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    if r == 0 {
        node
    } else {
        0
    }
}

/// Number of open file descriptors of this process (entries of `/proc/self/fd`).
pub(crate) fn open_fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Number of mappings (lines of `/proc/self/maps`) of this process.
pub(crate) fn mapping_count() -> usize {
    std::fs::read_to_string("/proc/self/maps").map_or(0, |s| s.lines().count())
}

/// The weakest protection over `[addr, addr+size)` of this process, from `/proc/self/maps`:
/// `None` if any byte is unmapped, `Some(Protection::None)` if any page is unreadable,
/// `Some(ReadOnly)` if any is unwritable, else `Some(ReadWrite)`.
pub(crate) fn host_protection(addr: usize, size: usize) -> Option<Protection> {
    let end = addr.checked_add(size)?;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let mut at = addr;
    let mut prot = Protection::ReadWrite;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let Some((s, e)) = range.split_once('-') else {
            continue;
        };
        let (Ok(s), Ok(e)) = (usize::from_str_radix(s, 16), usize::from_str_radix(e, 16)) else {
            continue;
        };
        if e <= at {
            continue;
        }
        if s > at {
            // A hole before this mapping (lines are sorted by address).
            return None;
        }
        let p = perms.as_bytes();
        if p.first() != Some(&b'r') {
            prot = Protection::None;
        } else if p.get(1) != Some(&b'w') && prot == Protection::ReadWrite {
            prot = Protection::ReadOnly;
        }
        at = e;
        if at >= end {
            return Some(prot);
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------
// The IPC transport operations of [`crate::backend::Backend`], the same on every Linux backend.

/// [`crate::backend::Backend::start_broker`] on Linux ([`broker::start_broker`]).
pub(crate) fn start_broker(make_handler: &dyn Fn() -> BrokerHandler) -> Result<u32> {
    broker::start_broker(make_handler).map_err(|e| {
        let mut m = os_error("starting the IPC broker socket", e);
        if e == Errno::ADDRINUSE {
            if let HalError::Unexpected(t) = &mut m {
                t.push_str(": every name tried was already bound by another socket");
            }
        }
        m
    })
}

/// [`crate::backend::Backend::broker_request`] on Linux ([`broker::broker_request`]).
pub(crate) fn broker_request(
    pid: u32,
    nonce: u32,
    request: &[u8; 64],
    max_payload: usize,
    max_fds: usize,
) -> std::result::Result<BrokerAnswer, TransportError> {
    broker::broker_request(pid, nonce, request, max_payload, max_fds)
}

/// [`crate::backend::Backend::broker_stats`] on Linux.
pub(crate) fn broker_stats() -> BrokerStats {
    BrokerStats {
        peers_active: broker::broker_peers_active(),
        workers: broker::broker_workers(),
        max_peers: broker::MAX_BROKER_PEERS,
        worker_idle: broker::WORKER_IDLE,
    }
}

/// [`crate::backend::Backend::random_token`] on Linux (`getrandom(2)`).
pub(crate) fn random_token() -> Result<[u8; 16]> {
    broker::random_token().map_err(|e| os_error("getrandom(2) for an IPC token", e))
}

/// [`crate::backend::Backend::shareable_identity`] on Linux (`fstat(2)`).
pub(crate) fn shareable_identity(fd: BorrowedFd<'_>) -> Option<ShareableIdentity> {
    broker::fd_identity(fd).map(|(dev, ino, size)| ShareableIdentity { dev, ino, size })
}

/// [`crate::backend::Backend::dup_shareable`] on Linux (`fcntl(F_DUPFD_CLOEXEC)`).
pub(crate) fn dup_shareable(fd: BorrowedFd<'_>) -> Result<OwnedFd> {
    broker::dup_fd(fd).map_err(|e| os_error("fcntl(F_DUPFD_CLOEXEC) of a shareable handle", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Backend failures carry the limit they hit, as the backend's own error kind.
    #[test]
    fn os_errors_name_the_limit_and_stay_backend_errors() {
        match os_error("mmap", Errno::MFILE) {
            HalError::OutOfHostMemory(m) => assert!(m.contains("RLIMIT_NOFILE"), "{m}"),
            e => panic!("EMFILE gave {e:?}"),
        }
        match os_error("mmap", Errno::NOMEM) {
            HalError::OutOfHostMemory(m) => assert!(m.contains("vm.max_map_count"), "{m}"),
            e => panic!("ENOMEM gave {e:?}"),
        }
        assert!(matches!(
            os_error("x", Errno::INVAL),
            HalError::Unexpected(_)
        ));
        // The one conversion to the spec error.
        let e: crate::Error = HalError::OutOfHostMemory("m".into()).into();
        assert_eq!(e.ze_result(), 0x7000_0002);
        let e: crate::Error = HalError::Unsupported("m".into()).into();
        assert_eq!(e.ze_result(), 0x7800_0003);
    }
}
