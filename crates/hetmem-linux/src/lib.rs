//! The Linux platform layer below hetmem's backends: what every backend running on Linux
//! shares (the host backend and the cuda backend alike): machine facts, NUMA,
//! `/proc/self/maps`, errno translation, futex waits and wakes, the IPC transport
//! ([`broker`]: the per-process broker socket and `SCM_RIGHTS`), the streaming copies of the
//! host's copy engine ([`copy::stream_copy`]) and of the cuda backend's staging
//! ([`copy::stream_copy_any`]), and small named records other processes of the user read
//! ([`records`]). One small function per syscall or file read, each naming it
//! (rustix-style); no policy, and nothing of the specs. hetmem's backends call it and turn
//! its answers into their own types (`hetmem::backend`).

pub mod broker;
pub mod copy;
pub mod records;

pub use rustix::io::Errno;

/// Facts about the machine and the process (for defaults, for `hetmem info`, and for leak
/// checks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformFacts {
    /// Total RAM in bytes (`sysinfo(2)`).
    pub total_ram: u64,
    /// The OS page size in bytes.
    pub page_size: usize,
    /// The soft limit of open files (`RLIMIT_NOFILE`) now in force; `None` if unlimited. The
    /// host backend raises it to the hard limit when it starts.
    pub open_file_limit: Option<u64>,
    /// `vm.max_map_count`, the kernel's cap on mappings per process, if readable.
    pub max_map_count: Option<u64>,
}

/// A failed OS call, classified: host memory or an OS limit on it exhausted (the message names
/// the limit and its value), or anything else (the message names the call and the errno).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OsError {
    /// `ENOMEM`, `EMFILE` / `ENFILE`, `ENOSPC`.
    OutOfHostMemory(String),
    /// Any other errno.
    Unexpected(String),
}

impl std::fmt::Display for OsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OsError::OutOfHostMemory(m) | OsError::Unexpected(m) => f.write_str(m),
        }
    }
}

/// Page protection of process memory, as `/proc/self/maps` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    /// Not readable.
    None,
    /// Readable, not writable.
    ReadOnly,
    /// Readable and writable.
    ReadWrite,
}

/// Total RAM of the machine in bytes (`sysinfo(2)`).
pub fn total_ram() -> u64 {
    let info = rustix::system::sysinfo();
    info.totalram as u64 * info.mem_unit.max(1) as u64
}

/// The OS page size in bytes (`getauxval(AT_PAGESZ)` through rustix).
pub fn os_page_size() -> usize {
    rustix::param::page_size()
}

/// Raises the soft limit of open files (`RLIMIT_NOFILE`) to the hard limit, so that many
/// physical objects (one memfd each) can be live at once (`getrlimit(2)`, `setrlimit(2)`).
/// Returns the limit now in force.
pub fn raise_fd_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut lim = getrlimit(Resource::Nofile);
    if lim.current != lim.maximum {
        lim.current = lim.maximum;
        let _ = setrlimit(Resource::Nofile, lim);
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// Reads the [`PlatformFacts`] of this machine and process (`sysinfo(2)`, the page size,
/// `getrlimit(RLIMIT_NOFILE)`, `/proc/sys/vm/max_map_count`). Changes nothing.
pub fn platform_facts() -> PlatformFacts {
    PlatformFacts {
        total_ram: total_ram(),
        page_size: os_page_size(),
        open_file_limit: fd_limit(),
        max_map_count: max_map_count(),
    }
}

/// The soft limit of open files now in force (`getrlimit(RLIMIT_NOFILE)`); `None` if unlimited.
pub fn fd_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// `vm.max_map_count`, the kernel's cap on mappings (VMAs) per process
/// (`/proc/sys/vm/max_map_count`).
pub fn max_map_count() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Translates an errno from `what` into an [`OsError`] naming the limit that was hit.
pub fn os_error(what: &str, e: Errno) -> OsError {
    match e {
        Errno::NOMEM => OsError::OutOfHostMemory(format!(
            "{what} failed with ENOMEM: the address space (RLIMIT_AS {}), RAM, or the mapping \
             limit vm.max_map_count ({}) is exhausted",
            rustix::process::getrlimit(rustix::process::Resource::As)
                .current
                .map_or("unlimited".to_string(), |v| v.to_string()),
            max_map_count().map_or("unknown".to_string(), |v| v.to_string())
        )),
        Errno::MFILE | Errno::NFILE => OsError::OutOfHostMemory(format!(
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
        Errno::NOSPC => OsError::OutOfHostMemory(format!("{what} failed with ENOSPC")),
        other => OsError::Unexpected(format!("{what} failed: {other}")),
    }
}

/// The NUMA nodes of this machine (`/sys/devices/system/node/node<N>`), ascending; `[0]` if
/// none listed. The ids `ACL_MEM_LOCATIONTYPE_HOST_NUMA` accepts. Never fails.
pub fn numa_nodes() -> Vec<u32> {
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

/// Nanoseconds of the system's monotonic clock (`clock_gettime(2)`, `CLOCK_MONOTONIC`): the
/// host timestamp of `zeDeviceGetGlobalTimestamps`. Never fails.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Whether the file at `path` can be opened for reading (`open(2)`, closed at once); `Err` is
/// the OS's reason.
pub fn check_readable(path: &str) -> Result<(), String> {
    std::fs::File::open(path)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The NUMA node of the CPU the calling thread runs on (`getcpu(2)`); 0 if unknown. What
/// `ACL_MEM_LOCATIONTYPE_HOST_NUMA_CURRENT` resolves to when a call is made. Never fails.
pub fn current_numa_node() -> u32 {
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
pub fn open_fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Number of mappings (lines of `/proc/self/maps`) of this process.
pub fn mapping_count() -> usize {
    std::fs::read_to_string("/proc/self/maps").map_or(0, |s| s.lines().count())
}

/// The weakest protection over `[addr, addr+size)` of this process, from `/proc/self/maps`:
/// `None` if any byte is unmapped, `Some(Protection::None)` if any page is unreadable,
/// `Some(ReadOnly)` if any is unwritable, else `Some(ReadWrite)`.
///
/// Asked of the kernel one mapping at a time with `ioctl(PROCMAP_QUERY)` on
/// `/proc/self/maps` (Linux 6.11 and later: [`host_protection_by_query`]), else read from the
/// file's text ([`host_protection_from_text`]). The text costs about 0.2 us per mapping of the
/// process (230 us for 1,000 mappings on the project's machine), paid by every queued copy with
/// a `malloc`'d operand; the query costs an `open`, one `ioctl` per mapping the range
/// spans and a `close`.
pub fn host_protection(addr: usize, size: usize) -> Option<Protection> {
    use std::sync::atomic::Ordering::Relaxed;
    // Set once the kernel answered that it has no `PROCMAP_QUERY`: later calls read the text
    // at once instead of paying an open and a failing ioctl first.
    static NO_QUERY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !NO_QUERY.load(Relaxed) {
        match host_protection_by_query(addr, size) {
            Ok(p) => return p,
            Err(Errno::NOTTY) => NO_QUERY.store(true, Relaxed),
            // Another failure (out of fds, say) may pass: the text answers this time.
            Err(_) => {}
        }
    }
    host_protection_from_text(addr, size)
}

/// `struct procmap_query` of `linux/fs.h` (Linux 6.11), the argument of `PROCMAP_QUERY`.
#[repr(C)]
#[derive(Debug, Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `PROCMAP_QUERY`: `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: rustix::ioctl::Opcode =
    rustix::ioctl::opcode::read_write::<ProcmapQuery>(b'f', 17);
/// `PROCMAP_QUERY_VMA_READABLE` / `_WRITABLE` of `vma_flags`.
const VMA_READABLE: u64 = 0x01;
const VMA_WRITABLE: u64 = 0x02;

/// [`host_protection`] by `ioctl(PROCMAP_QUERY)` on `/proc/self/maps` (`open(2)`, one
/// `ioctl(2)` per mapping from `addr` on, `close(2)`): `Err` with the errno where the kernel
/// has no such ioctl (`ENOTTY` before Linux 6.11) or `/proc` cannot be opened.
pub fn host_protection_by_query(addr: usize, size: usize) -> Result<Option<Protection>, Errno> {
    use rustix::fs::{Mode, OFlags};
    let Some(end) = addr.checked_add(size) else {
        return Ok(None);
    };
    let maps = rustix::fs::open(
        "/proc/self/maps",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut at = addr;
    let mut prot = Protection::ReadWrite;
    loop {
        let mut q = ProcmapQuery {
            size: std::mem::size_of::<ProcmapQuery>() as u64,
            query_addr: at as u64,
            ..ProcmapQuery::default()
        };
        // SAFETY: PROCMAP_QUERY reads and updates one `struct procmap_query`, which `q` is
        // (its layout, its size in `size`); flags 0 ask for the mapping covering `query_addr`;
        // name and build-id sizes 0 ask for no buffer.
        let r = unsafe {
            rustix::ioctl::ioctl(
                &maps,
                rustix::ioctl::Updater::<PROCMAP_QUERY, ProcmapQuery>::new(&mut q),
            )
        };
        match r {
            Ok(()) => {}
            // In the kernel's half of the address space the text lists what the query does
            // not see: x86-64's `[vsyscall]` page (a gate area, not a mapping of the process's
            // tree).
            Err(Errno::NOENT) if (at as isize) < 0 => {
                return Ok(host_protection_from_text(at, end - at).map(|p| weakest(prot, p)));
            }
            // No mapping covers `at`.
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e),
        }
        if q.vma_flags & VMA_READABLE == 0 {
            prot = Protection::None;
        } else if q.vma_flags & VMA_WRITABLE == 0 && prot == Protection::ReadWrite {
            prot = Protection::ReadOnly;
        }
        if q.vma_end as usize <= at {
            // Never from a working kernel; do not loop on one that answers so.
            return Err(Errno::INVAL);
        }
        at = q.vma_end as usize;
        if at >= end {
            return Ok(Some(prot));
        }
    }
}

/// The weaker of two protections.
fn weakest(a: Protection, b: Protection) -> Protection {
    use Protection::*;
    match (a, b) {
        (None, _) | (_, None) => None,
        (ReadOnly, _) | (_, ReadOnly) => ReadOnly,
        _ => ReadWrite,
    }
}

/// [`host_protection`] from the text of `/proc/self/maps` (read whole).
pub fn host_protection_from_text(addr: usize, size: usize) -> Option<Protection> {
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

/// Sleeps while `word` holds `expected` (`futex(2)` `FUTEX_WAIT_PRIVATE`, no timeout): returns
/// at once if it does not, when [`futex_wake`] wakes it, or spuriously (a signal), so the
/// caller re-checks what it waits for.
pub fn futex_wait(word: &std::sync::atomic::AtomicU32, expected: u32) {
    use rustix::thread::futex;
    let _ = futex::wait(word, futex::Flags::PRIVATE, expected, None);
}

/// Wakes up to `n` threads sleeping in [`futex_wait`] on `word` (`futex(2)`
/// `FUTEX_WAKE_PRIVATE`; `n` above `i32::MAX` wakes `i32::MAX`, that is all of them).
pub fn futex_wake(word: &std::sync::atomic::AtomicU32, n: u32) {
    use rustix::thread::futex;
    let _ = futex::wake(word, futex::Flags::PRIVATE, n.min(i32::MAX as u32));
}

/// Starts this process's IPC broker ([`broker::start_broker`]), the failure classified.
pub fn start_broker(make_handler: &dyn Fn() -> broker::BrokerHandler) -> Result<u32, OsError> {
    broker::start_broker(make_handler).map_err(|e| {
        let mut m = os_error("starting the IPC broker socket", e);
        if e == Errno::ADDRINUSE {
            if let OsError::Unexpected(t) = &mut m {
                t.push_str(": every name tried was already bound by another socket");
            }
        }
        m
    })
}

/// 16 random bytes (`getrandom(2)`), the failure classified.
pub fn random_token() -> Result<[u8; 16], OsError> {
    broker::random_token().map_err(|e| os_error("getrandom(2) for an IPC token", e))
}

/// A close-on-exec duplicate of `fd` (`fcntl(F_DUPFD_CLOEXEC)`), the failure classified.
pub fn dup(fd: std::os::fd::BorrowedFd<'_>, what: &str) -> Result<std::os::fd::OwnedFd, OsError> {
    broker::dup_fd(fd).map_err(|e| os_error(&format!("fcntl(F_DUPFD_CLOEXEC) of {what}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Failures carry the limit they hit.
    #[test]
    fn os_errors_name_the_limit() {
        match os_error("mmap", Errno::MFILE) {
            OsError::OutOfHostMemory(m) => assert!(m.contains("RLIMIT_NOFILE"), "{m}"),
            e => panic!("EMFILE gave {e:?}"),
        }
        match os_error("mmap", Errno::NOMEM) {
            OsError::OutOfHostMemory(m) => assert!(m.contains("vm.max_map_count"), "{m}"),
            e => panic!("ENOMEM gave {e:?}"),
        }
        assert!(matches!(
            os_error("x", Errno::INVAL),
            OsError::Unexpected(_)
        ));
    }

    /// `/proc/self/maps` answers for our own mappings: a readable stack variable is mapped,
    /// a page below `vm.mmap_min_addr` is not.
    #[test]
    fn host_protection_reads_our_own_mappings() {
        let x = 5u64;
        let p = &x as *const u64 as usize;
        assert_eq!(host_protection(p, 8), Some(Protection::ReadWrite));
        assert_eq!(host_protection(0x4000, 4096), None);
    }

    /// The kernel's query and the text of `/proc/self/maps` give the same answers, and the
    /// right ones: over one read-write, read-only or inaccessible mapping, over a range that
    /// spans mappings of different protections (the weakest wins), into a hole, from a hole,
    /// past the end of the address space. Where the kernel has no `PROCMAP_QUERY` the query
    /// says so (and `host_protection` reads the text).
    #[test]
    fn the_query_and_the_text_of_the_mappings_agree() {
        use rustix::mm::{mmap_anonymous, mprotect, munmap, MapFlags, MprotectFlags, ProtFlags};
        let pg = os_page_size();
        // SAFETY: a fresh private mapping of 5 pages, then its own pages re-protected and one
        // unmapped; nothing else uses it; unmapped at the end.
        let base = unsafe {
            let p = mmap_anonymous(
                std::ptr::null_mut(),
                5 * pg,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
            .unwrap();
            mprotect(p.byte_add(pg), pg, MprotectFlags::READ).unwrap();
            mprotect(p.byte_add(2 * pg), pg, MprotectFlags::empty()).unwrap();
            munmap(p.byte_add(4 * pg), pg).unwrap();
            p as usize
        };
        // Pages: 0 rw, 1 r, 2 none, 3 rw, 4 hole (unless something else got mapped there).
        let hole = host_protection_from_text(base + 4 * pg, 1).is_none();
        let x = 5u64;
        let stack = &x as *const u64 as usize;
        let cases: Vec<(usize, usize, Option<Protection>)> = vec![
            (base, pg, Some(Protection::ReadWrite)),
            (base + 8, 16, Some(Protection::ReadWrite)),
            (base + pg, pg, Some(Protection::ReadOnly)),
            (base, 2 * pg, Some(Protection::ReadOnly)),
            (base + 2 * pg, 1, Some(Protection::None)),
            (base, 4 * pg, Some(Protection::None)),
            (base + 3 * pg, pg, Some(Protection::ReadWrite)),
            (stack, 8, Some(Protection::ReadWrite)),
            (0x4000, 4096, None),
            (usize::MAX - 10, 100, None),
        ];
        let query_works = host_protection_by_query(stack, 8).is_ok();
        if !query_works {
            println!("NOTE: this kernel has no PROCMAP_QUERY; only the text is checked");
        }
        for (addr, size, want) in cases {
            assert_eq!(
                host_protection_from_text(addr, size),
                want,
                "{addr:#x}+{size:#x}"
            );
            if query_works {
                assert_eq!(
                    host_protection_by_query(addr, size),
                    Ok(want),
                    "{addr:#x}+{size:#x}"
                );
            }
            assert_eq!(host_protection(addr, size), want, "{addr:#x}+{size:#x}");
        }
        if hole {
            for (addr, size) in [(base + 3 * pg, 2 * pg), (base + 4 * pg, 1), (base, 5 * pg)] {
                assert_eq!(host_protection_from_text(addr, size), None);
                assert_eq!(host_protection(addr, size), None);
                if query_works {
                    assert_eq!(host_protection_by_query(addr, size), Ok(None));
                }
            }
        }
        // SAFETY: our mapping's four mapped pages, unused now.
        unsafe { munmap(base as *mut _, 4 * pg).unwrap() };
    }

    /// Over every mapping the text lists (x86-64's `[vsyscall]` page included, which the
    /// query alone does not see), and its first byte, [`host_protection`] and the query give
    /// the text's answer.
    #[test]
    fn the_query_and_the_text_agree_over_every_mapping_listed() {
        let text = std::fs::read_to_string("/proc/self/maps").unwrap();
        let query_works = host_protection_by_query(&text as *const _ as usize, 1).is_ok();
        let mut checked = 0;
        for line in text.lines() {
            let range = line.split_whitespace().next().unwrap();
            let (s, e) = range.split_once('-').unwrap();
            let s = usize::from_str_radix(s, 16).unwrap();
            let e = usize::from_str_radix(e, 16).unwrap();
            for (addr, size) in [(s, e - s), (s, 1)] {
                let want = host_protection_from_text(addr, size);
                if want.is_none() {
                    // Unmapped since the listing (another test's mapping): nothing to compare.
                    continue;
                }
                assert_eq!(host_protection(addr, size), want, "{line}");
                if query_works {
                    assert_eq!(host_protection_by_query(addr, size), Ok(want), "{line}");
                }
                checked += 1;
            }
        }
        assert!(checked > 4, "only {checked} mappings checked");
    }
}
