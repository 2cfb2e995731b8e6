//! Managed memory on the host backend, over `userfaultfd(2)`.
//!
//! | operation | syscalls |
//! |---|---|
//! | set-up | `userfaultfd(O_CLOEXEC \| O_NONBLOCK)` (with `UFFD_USER_MODE_ONLY` when the plain call is refused), `ioctl(UFFDIO_API)`; per device a `memfd_create` + `ftruncate` of its capacity (sparse: device memory) |
//! | reserve | `memfd_create` + `ftruncate` (the host backing, sparse), `mmap(MAP_SHARED)` of it twice: the managed range (registered with `ioctl(UFFDIO_REGISTER, MISSING \| MINOR \| WP)`) and a private alias; a `PROT_NONE` placeholder mirror per device |
//! | release | `ioctl(UFFDIO_UNREGISTER)`, `munmap`, `close` |
//! | device map / unmap / discard | `mmap(MAP_SHARED \| MAP_FIXED \| MAP_POPULATE, memfd, slot)` / placeholder `mmap` / `fallocate(PUNCH_HOLE)` |
//! | host install | `memcpy` into the backing through the alias, `ioctl(UFFDIO_CONTINUE)` (`UFFDIO_CONTINUE_MODE_WP` for read-only); a fault's install copies in pieces while the mapper thread maps the pieces copied |
//! | host stage | `memcpy` into the backing through the alias (no mapping: the page stays absent) |
//! | host drop | `madvise(MADV_DONTNEED)` of the managed range (its page-table entries only) |
//! | host protect | `ioctl(UFFDIO_WRITEPROTECT)` |
//! | host wake | `ioctl(UFFDIO_WAKE)` |
//! | fault thread | `poll(2)` on the userfaultfd and an `eventfd(2)`, `read(2)` of `struct uffd_msg` (for 100 us after a fault, `read(2)` again at once instead of `poll(2)`) |
//! | mapper thread | `ioctl(UFFDIO_CONTINUE)` of the pieces and pages an install hands it, so that the copy of the next piece runs meanwhile; `sched_setaffinity(2)` keeps it off the queuing thread's core |
//!
//! No signal handler is installed: host faults on absent pages block the faulting thread in the
//! kernel until the fault thread resolves them.
//!
//! Host memory of a managed allocation is a memfd (shmem): the managed range maps it, and a
//! page is *host-resident* exactly when its page-table entries are present there. Migrating a
//! page away zaps those entries (`MADV_DONTNEED` on a shared mapping frees no memory), so the
//! next host access is a userfaultfd *minor* fault (or a *missing* fault for a page never
//! touched); migrating it back copies the bytes into the backing through the alias and maps
//! them with `UFFDIO_CONTINUE`, with no page allocation. The backing thus keeps the host memory
//! of every page touched once (a host staging area, as a pinned host buffer would), and a
//! migration costs one copy of the bytes plus the page-table update.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use rustix::event::{EventfdFlags, PollFd, PollFlags};
use rustix::fs::FallocateFlags;
use rustix::mm::{Advice, MapFlags, ProtFlags, UserfaultfdFlags};

use super::managed_ops::{
    Fault, FaultSink, FaultThread, HostSource, ManagedOps, ManagedRange, INSTALL_CHUNK,
};
use super::{os_error, reserve_placeholder};
use crate::backend::DeviceInfo;
use crate::backend::{HalError, Result};
use hetmem_linux::copy::stream_copy;

// The userfaultfd ABI (include/uapi/linux/userfaultfd.h). `_IOWR(0xAA, nr, T)` numbers are the
// x86_64 / aarch64 values (asm-generic ioctl encoding).
//
// Why not the bytecodealliance `userfaultfd` crate (0.9, which does cover minor faults,
// UFFDIO_CONTINUE, write-protect and user-mode-only with its `linux5_13` feature): its
// `userfaultfd-sys` 0.6 generates its bindings with bindgen when it is built, which needs
// libclang (and the kernel's uapi headers) on every machine that builds hetmem. On this
// project's machines `cargo build` of it fails with "Unable to find libclang" (checked on
// 2026-12-01), so taking it would add a compiler toolchain to CI and to every user's set-up for
// six ioctls. The numbers below are the published ABI, checked by the managed tests, which
// exercise every one of them.
const UFFD_API: u64 = 0xAA;
const UFFD_USER_MODE_ONLY: u32 = 1;
const UFFDIO_API: u64 = 0xC018_AA3F;
const UFFDIO_REGISTER: u64 = 0xC020_AA00;
const UFFDIO_UNREGISTER: u64 = 0x8010_AA01;
const UFFDIO_WAKE: u64 = 0x8010_AA02;
const UFFDIO_CONTINUE: u64 = 0xC020_AA07;
const UFFDIO_WRITEPROTECT: u64 = 0xC018_AA06;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFDIO_REGISTER_MODE_WP: u64 = 2;
const UFFDIO_REGISTER_MODE_MINOR: u64 = 4;
const UFFDIO_CONTINUE_MODE_WP: u64 = 2;
const UFFD_FEATURE_MINOR_HUGETLBFS: u64 = 1 << 9;
const UFFD_FEATURE_MINOR_SHMEM: u64 = 1 << 10;
const UFFD_FEATURE_WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1;
const UFFD_FEATURE_PAGEFAULT_FLAG_WP: u64 = 1;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_PAGEFAULT_FLAG_WRITE: u64 = 1;
const UFFD_PAGEFAULT_FLAG_WP: u64 = 2;
/// `_UFFDIO_WRITEPROTECT` bit in `uffdio_register.ioctls`.
const IOCTL_WRITEPROTECT_BIT: u64 = 1 << 6;

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioContinue {
    range: UffdioRange,
    mode: u64,
    mapped: i64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}
/// `struct uffd_msg` (32 bytes): event, padding, then the page-fault arm of the union.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdMsg {
    event: u8,
    _r1: u8,
    _r2: u16,
    _r3: u32,
    flags: u64,
    address: u64,
    _feat: u64,
}

/// `ioctl(fd, req, arg)`; the error as an errno.
///
/// # Safety
/// `arg` points to the structure `req` expects, valid for reads and writes.
unsafe fn uffd_ioctl<T>(fd: &OwnedFd, req: u64, arg: &mut T) -> rustix::io::Result<()> {
    // SAFETY: the caller passes the structure matching `req`; the fd is a live userfaultfd.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg as *mut T) };
    if r == 0 {
        Ok(())
    } else {
        Err(
            rustix::io::Errno::from_io_error(&std::io::Error::last_os_error())
                .unwrap_or(rustix::io::Errno::IO),
        )
    }
}

/// Why managed memory cannot work here, or the userfaultfd ready for use.
/// Also says whether user mode only was needed and whether minor faults on hugetlbfs work.
fn open_userfaultfd() -> std::result::Result<(OwnedFd, bool, bool), String> {
    let flags = UserfaultfdFlags::CLOEXEC | UserfaultfdFlags::NONBLOCK;
    // SAFETY: creating the fd has no effect on memory by itself.
    let (fd, user_only) = match unsafe { rustix::mm::userfaultfd(flags) } {
        Ok(fd) => (fd, false),
        Err(e1) => {
            let f = flags | UserfaultfdFlags::from_bits_retain(UFFD_USER_MODE_ONLY);
            // SAFETY: as above.
            match unsafe { rustix::mm::userfaultfd(f) } {
                Ok(fd) => (fd, true),
                Err(e2) => {
                    let sysctl = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd")
                        .map(|s| s.trim().to_string())
                        .unwrap_or_else(|_| "unknown".into());
                    return Err(format!(
                        "userfaultfd(2) is not available: {e1} (and {e2} with UFFD_USER_MODE_ONLY); \
                         managed memory needs it to migrate pages on host faults (run as root, \
                         with CAP_SYS_PTRACE, or set vm.unprivileged_userfaultfd=1; it is {sysctl}; \
                         a seccomp sandbox may also refuse the call)"
                    ));
                }
            }
        }
    };
    // Minor faults on hugetlbfs too where the kernel has them (hugetlbfs backings); a kernel
    // without refuses the whole request, and is asked again without it.
    let base = UFFD_FEATURE_MINOR_SHMEM | UFFD_FEATURE_WP_HUGETLBFS_SHMEM;
    let mut api = UffdioApi::default();
    for features in [base | UFFD_FEATURE_MINOR_HUGETLBFS, base] {
        api = UffdioApi {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API takes a uffdio_api.
        match unsafe { uffd_ioctl(&fd, UFFDIO_API, &mut api) } {
            Ok(()) => break,
            Err(e) if features == base => return Err(format!("ioctl(UFFDIO_API) failed: {e}")),
            Err(_) => {}
        }
    }
    let need =
        UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_MINOR_SHMEM | UFFD_FEATURE_WP_HUGETLBFS_SHMEM;
    if api.features & need != need {
        return Err(format!(
            "this kernel's userfaultfd lacks minor faults or write protection on shmem \
             (features {:#x}, need {need:#x}), which managed memory needs to migrate pages \
             and to keep read-mostly copies",
            api.features
        ));
    }
    Ok((
        fd,
        user_only,
        api.features & UFFD_FEATURE_MINOR_HUGETLBFS != 0,
    ))
}

/// The host backend's managed-memory operations: one userfaultfd for the whole driver and one
/// sparse memfd of each device's capacity as that device's memory.
#[derive(Debug)]
pub struct HostManaged {
    uffd: OwnedFd,
    /// Host backing of each live range, by host base.
    backing: parking_lot::Mutex<std::collections::BTreeMap<usize, Backing>>,
    /// Device memory: slot `s` of device `d` is bytes `[s * page, (s+1) * page)` of `pools[d]`.
    pools: Vec<OwnedFd>,
    /// The mapper thread, one user at a time.
    mapper: parking_lot::Mutex<Mapper>,
    /// Host backings are tried on hugetlbfs first ([`super::huge`]).
    hugetlb: bool,
}

/// The helper thread that maps (`UFFDIO_CONTINUE`) host pages whose bytes another thread has
/// put in the backing, so that the copy of the next bytes overlaps the page-table update of
/// these. The thread that queued the jobs maps the ones the helper has not taken yet itself
/// when it has nothing else to do ([`Mapper::finish`]): on a machine whose other cores are busy
/// the install is never slower than doing both halves on one thread.
///
/// The helper is kept off the core of the thread that queues its jobs (its affinity is every CPU
/// the process may use but that one, updated when the queuing thread is seen on another core):
/// woken on the queuing thread's own core, it would stop the copy it is meant to overlap with
/// until its mapping is done (measured on the 2-core host under load: a wake-up of the helper
/// cost the queuing thread 100-150 us, as long as the mapping itself).
#[derive(Debug)]
struct Mapper {
    queue: Arc<MapQueue>,
    thread: Option<JoinHandle<()>>,
    /// The CPUs the process may use when the helper started, if more than one.
    cpus: Option<rustix::thread::CpuSet>,
}

/// The jobs of a [`Mapper`] and their outcome.
#[derive(Debug, Default)]
struct MapQueue {
    state: parking_lot::Mutex<MapState>,
    /// Jobs queued and not finished (taken or not), read without the lock by `finish`.
    outstanding: std::sync::atomic::AtomicUsize,
    /// The helper's thread id, once it runs (0 before).
    helper_tid: std::sync::atomic::AtomicI32,
    /// The CPU the helper's affinity leaves out (`usize::MAX`: none).
    avoid_cpu: std::sync::atomic::AtomicUsize,
    /// Signalled when a job is queued or the thread is to stop.
    work: parking_lot::Condvar,
    /// Signalled when the helper finishes the last job outstanding.
    idle: parking_lot::Condvar,
}

#[derive(Debug, Default)]
struct MapState {
    /// `(addr, len, read_only)` to map, in order.
    jobs: std::collections::VecDeque<(usize, usize, bool)>,
    /// The first error since the last [`Mapper::finish`].
    failed: Option<HalError>,
    stop: bool,
}

impl Mapper {
    /// Starts the thread over its own descriptor of the userfaultfd.
    fn start(uffd: &OwnedFd) -> std::result::Result<Mapper, String> {
        let fd = uffd
            .try_clone()
            .map_err(|e| format!("dup of the userfaultfd: {e}"))?;
        let queue = Arc::new(MapQueue {
            avoid_cpu: std::sync::atomic::AtomicUsize::new(usize::MAX),
            ..MapQueue::default()
        });
        let cpus = rustix::thread::sched_getaffinity(None)
            .ok()
            .filter(|c| c.count() > 1);
        let q = queue.clone();
        let thread = std::thread::Builder::new()
            .name("hetmem-uffd-map".into())
            .spawn(move || {
                q.helper_tid.store(
                    rustix::thread::gettid().as_raw_nonzero().get(),
                    Ordering::Release,
                );
                let mut st = q.state.lock();
                loop {
                    let Some((addr, len, read_only)) = st.jobs.pop_front() else {
                        if st.stop {
                            return;
                        }
                        q.work.wait(&mut st);
                        continue;
                    };
                    // SAFETY: the queuing thread put the bytes in the backing and the entries
                    // are absent (the contract of the install that queued the job).
                    let r = parking_lot::MutexGuard::unlocked(&mut st, || unsafe {
                        continue_range(&fd, addr, len, read_only)
                    });
                    if let Err(e) = r {
                        st.failed.get_or_insert(e);
                    }
                    if q.outstanding.fetch_sub(1, Ordering::AcqRel) == 1 {
                        q.idle.notify_all();
                    }
                }
            })
            .map_err(|e| format!("spawning the page-mapping thread: {e}"))?;
        Ok(Mapper {
            queue,
            thread: Some(thread),
            cpus,
        })
    }

    /// Keeps the helper off the calling thread's core (see [`Mapper`]): sets its affinity to
    /// the process's CPUs but this one, when this is not the core it already avoids. Best
    /// effort: a refused `sched_setaffinity(2)` leaves it as it was.
    fn keep_off_this_cpu(&self) {
        let Some(cpus) = &self.cpus else { return };
        let q = &self.queue;
        let cpu = rustix::thread::sched_getcpu();
        if q.avoid_cpu.load(Ordering::Relaxed) == cpu {
            return;
        }
        let Some(tid) = rustix::thread::Pid::from_raw(q.helper_tid.load(Ordering::Acquire)) else {
            return;
        };
        let mut set = *cpus;
        set.unset(cpu);
        if set.count() > 0 && rustix::thread::sched_setaffinity(Some(tid), &set).is_ok() {
            q.avoid_cpu.store(cpu, Ordering::Relaxed);
        }
    }

    /// Queues `[addr, addr+len)` to be mapped.
    fn send(&self, addr: usize, len: usize, read_only: bool) {
        let mut st = self.queue.state.lock();
        st.jobs.push_back((addr, len, read_only));
        self.queue.outstanding.fetch_add(1, Ordering::AcqRel);
        drop(st);
        self.keep_off_this_cpu();
        self.queue.work.notify_one();
    }

    /// Maps the jobs the helper has not taken on `uffd` (this thread), waits for those it has,
    /// and returns the first error of all the jobs queued since the last call.
    ///
    /// # Safety
    /// As [`continue_range`] for every job queued.
    unsafe fn finish(&self, uffd: &OwnedFd) -> Result<()> {
        let q = &self.queue;
        let mut st = q.state.lock();
        loop {
            if let Some((addr, len, read_only)) = st.jobs.pop_front() {
                // SAFETY: forwarded contract.
                let r = parking_lot::MutexGuard::unlocked(&mut st, || unsafe {
                    continue_range(uffd, addr, len, read_only)
                });
                if let Err(e) = r {
                    st.failed.get_or_insert(e);
                }
                q.outstanding.fetch_sub(1, Ordering::AcqRel);
            } else if q.outstanding.load(Ordering::Acquire) > 0 {
                // The helper's last job in hand: a part of one page's entries, shorter than a
                // sleep and its wake-up.
                let done = parking_lot::MutexGuard::unlocked(&mut st, || {
                    spin_until(FINISH_SPIN, || q.outstanding.load(Ordering::Acquire) == 0)
                });
                if !done && q.outstanding.load(Ordering::Acquire) > 0 && st.jobs.is_empty() {
                    q.idle.wait(&mut st);
                }
            } else {
                return st.failed.take().map_or(Ok(()), Err);
            }
        }
    }
}

/// How long [`Mapper::finish`] waits running for the helper's last job before it sleeps.
const FINISH_SPIN: std::time::Duration = std::time::Duration::from_micros(50);

/// Spins until `done()` or `limit` passed; whether `done()` came true.
fn spin_until(limit: std::time::Duration, done: impl Fn() -> bool) -> bool {
    let t = std::time::Instant::now();
    loop {
        for _ in 0..64 {
            if done() {
                return true;
            }
            std::hint::spin_loop();
        }
        if t.elapsed() >= limit {
            return done();
        }
    }
}

impl Drop for Mapper {
    fn drop(&mut self) {
        self.queue.state.lock().stop = true;
        self.queue.work.notify_all();
        if let Some(t) = self.thread.take() {
            t.join().ok();
        }
    }
}

impl HostManaged {
    /// Opens the userfaultfd and the device memfds. Err: why managed memory is unavailable.
    /// `hugetlb`: back managed allocations with reserved 2 MiB hugetlbfs pages while enough are
    /// free (and the kernel's userfaultfd handles minor faults there), else with shmem.
    pub fn new(devices: &[DeviceInfo], hugetlb: bool) -> std::result::Result<HostManaged, String> {
        // user_mode_only: only user-mode faults are handled (kernel accesses to absent pages
        // then fail with EFAULT).
        let (uffd, user_mode_only, minor_hugetlbfs) = open_userfaultfd()?;
        tracing::debug!(
            user_mode_only,
            minor_hugetlbfs,
            "userfaultfd opened for managed memory"
        );
        let mut pools = Vec::new();
        for (i, d) in devices.iter().enumerate() {
            let fd = super::sized_memfd("hetmem-managed-device", d.capacity)
                .map_err(|e| format!("device {i}'s managed memory: {e}"))?;
            pools.push(fd);
        }
        let mapper = parking_lot::Mutex::new(Mapper::start(&uffd)?);
        Ok(HostManaged {
            uffd,
            backing: Default::default(),
            pools,
            mapper,
            hugetlb: hugetlb && minor_hugetlbfs,
        })
    }

    /// The alias address of host address `addr` (inside a live range).
    fn alias(&self, addr: usize) -> usize {
        self.alias_kind(addr).0
    }

    /// The alias address of host address `addr` and whether its range is on hugetlbfs.
    fn alias_kind(&self, addr: usize) -> (usize, bool) {
        let b = self.backing.lock();
        let (&base, bk) = b.range(..=addr).next_back().expect("a live managed range");
        (bk.alias + (addr - base), bk.huge)
    }

    /// The host range and its alias over `fd` (each over its own placeholder aligned to
    /// `align`), registered with the userfaultfd. Err: the first failure, nothing left mapped.
    fn map_backing(&self, fd: &OwnedFd, size: usize, align: usize) -> Result<(usize, usize)> {
        let mut made: Vec<usize> = Vec::new();
        let cleanup = |made: &[usize], e: HalError| {
            for &m in made {
                // SAFETY: our own fresh mappings, unknown to anyone else.
                unsafe { rustix::mm::munmap(m as *mut _, size).ok() };
            }
            e
        };
        for _ in 0..2 {
            // SAFETY: a fresh placeholder chosen by the kernel, replacing nothing.
            let at = match unsafe { reserve_placeholder(None, size, align) } {
                Ok(a) => a,
                Err(e) => return Err(cleanup(&made, e)),
            };
            made.push(at);
            // SAFETY: MAP_FIXED over the placeholder we just made; the memfd is `size` long.
            let r = unsafe {
                super::map_shared_fixed(
                    at,
                    size,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::empty(),
                    fd,
                    0,
                )
            };
            if let Err(e) = r {
                return Err(cleanup(&made, os_error("mmap of managed host memory", e)));
            }
        }
        let (host, alias) = (made[0], made[1]);
        let mut reg = UffdioRegister {
            range: Self::range(host, size),
            mode: UFFDIO_REGISTER_MODE_MISSING
                | UFFDIO_REGISTER_MODE_MINOR
                | UFFDIO_REGISTER_MODE_WP,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER takes a uffdio_register.
        if let Err(e) = unsafe { uffd_ioctl(&self.uffd, UFFDIO_REGISTER, &mut reg) } {
            return Err(cleanup(
                &made,
                os_error("ioctl(UFFDIO_REGISTER) of a managed range", e),
            ));
        }
        if reg.ioctls & IOCTL_WRITEPROTECT_BIT == 0 {
            let mut r = Self::range(host, size);
            // SAFETY: UFFDIO_UNREGISTER takes a uffdio_range; the range is ours.
            unsafe { uffd_ioctl(&self.uffd, UFFDIO_UNREGISTER, &mut r).ok() };
            return Err(cleanup(
                &made,
                HalError::Unexpected(
                    "UFFDIO_REGISTER did not grant UFFDIO_WRITEPROTECT on shmem".into(),
                ),
            ));
        }
        Ok((host, alias))
    }

    /// [`continue_range`] on this driver's userfaultfd.
    ///
    /// # Safety
    /// As [`continue_range`].
    unsafe fn continue_range(&self, addr: usize, len: usize, read_only: bool) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { continue_range(&self.uffd, addr, len, read_only) }
    }

    fn range(addr: usize, len: usize) -> UffdioRange {
        UffdioRange {
            start: addr as u64,
            len: len as u64,
        }
    }
}

impl ManagedOps for HostManaged {
    fn numa_nodes(&self) -> Vec<u32> {
        super::numa_nodes()
    }

    fn current_numa_node(&self) -> u32 {
        super::current_numa_node()
    }

    fn reserve(&self, size: usize, align: usize) -> Result<ManagedRange> {
        // hugetlbfs first where reserved huge pages may be free: its first mapping reserves
        // the whole allocation's pages, and fails (ENOMEM) when too few are free; then shmem.
        let mut huge = None;
        if self.hugetlb && size.is_multiple_of(super::huge::HUGE) {
            if let Ok(fd) = super::huge::hugetlb_memfd("hetmem-managed-host", size as u64) {
                match self.map_backing(&fd, size, align.max(super::huge::HUGE)) {
                    Ok(m) => huge = Some((fd, m)),
                    Err(e) => tracing::debug!("managed allocation on 4 KiB pages: {e}"),
                }
            }
        }
        let (fd, (host, alias), is_huge) = match huge {
            Some((fd, m)) => (fd, m, true),
            None => {
                let fd = super::sized_memfd("hetmem-managed-host", size as u64)?;
                let m = self.map_backing(&fd, size, align)?;
                (fd, m, false)
            }
        };
        let mut made = vec![host, alias];
        for _ in &self.pools {
            // SAFETY: a fresh placeholder chosen by the kernel.
            match unsafe { reserve_placeholder(None, size, align) } {
                Ok(m) => made.push(m),
                Err(e) => {
                    let mut r = Self::range(host, size);
                    // SAFETY: UFFDIO_UNREGISTER takes a uffdio_range; the ranges are ours.
                    unsafe {
                        uffd_ioctl(&self.uffd, UFFDIO_UNREGISTER, &mut r).ok();
                        for &m in &made {
                            rustix::mm::munmap(m as *mut _, size).ok();
                        }
                    }
                    return Err(e);
                }
            }
        }
        self.backing.lock().insert(
            host,
            Backing {
                _fd: fd,
                alias,
                huge: is_huge,
            },
        );
        Ok(ManagedRange {
            host,
            mirrors: made[2..].to_vec(),
            size,
        })
    }

    unsafe fn release(&self, range: &ManagedRange) {
        let mut r = Self::range(range.host, range.size);
        // SAFETY: UFFDIO_UNREGISTER takes a uffdio_range (this also wakes any waiter).
        unsafe { uffd_ioctl(&self.uffd, UFFDIO_UNREGISTER, &mut r).ok() };
        let bk = self.backing.lock().remove(&range.host);
        // SAFETY: the caller gives up the ranges, which are ours; the memfd closes with `bk`.
        unsafe {
            rustix::mm::munmap(range.host as *mut _, range.size).ok();
            if let Some(bk) = &bk {
                rustix::mm::munmap(bk.alias as *mut _, range.size).ok();
            }
            for &m in &range.mirrors {
                rustix::mm::munmap(m as *mut _, range.size).ok();
            }
        }
    }

    unsafe fn device_map(
        &self,
        device: u32,
        mirror_addr: usize,
        slot: u32,
        len: usize,
    ) -> Result<()> {
        let fd = &self.pools[device as usize];
        // SAFETY: the mirror page is an unmapped page of our own placeholder.
        unsafe {
            rustix::mm::mmap(
                mirror_addr as *mut _,
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED | MapFlags::FIXED | MapFlags::POPULATE,
                fd,
                slot as u64 * len as u64,
            )
        }
        .map(|_| ())
        .map_err(|e| os_error("mmap(MAP_SHARED | MAP_FIXED) of a device slot", e))
    }

    unsafe fn device_unmap(&self, _device: u32, mirror_addr: usize, len: usize) {
        // SAFETY: the mirror page is ours; the placeholder comes back over it.
        unsafe { super::restore_placeholder(mirror_addr, len).ok() };
    }

    fn device_discard(&self, device: u32, slot: u32, len: usize) {
        rustix::fs::fallocate(
            &self.pools[device as usize],
            FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
            slot as u64 * len as u64,
            len as u64,
        )
        .ok();
    }

    unsafe fn host_install(
        &self,
        addr: usize,
        src: Option<usize>,
        len: usize,
        read_only: bool,
    ) -> Result<()> {
        let alias = self.alias(addr);
        // SAFETY: the alias maps the backing read-write and is never registered, so this does
        // not fault to us; the host range's entries for it are absent (caller), so no thread
        // sees the bytes change.
        unsafe {
            match src {
                Some(s) => stream_copy(alias, s, len),
                None => std::ptr::write_bytes(alias as *mut u8, 0, len),
            }
        }
        // SAFETY: the bytes are in the backing now; the entries are absent (caller).
        unsafe { self.continue_range(addr, len, read_only) }
    }

    unsafe fn host_install_batch(&self, pages: &[(usize, usize)], len: usize) -> Result<()> {
        // Pipeline: this thread copies page i + 1 into the backing while the mapper maps page i.
        let mapper = self.mapper.lock();
        for &(addr, src) in pages {
            let alias = self.alias(addr);
            // SAFETY: as in `host_install`: the alias is not registered and the host entries
            // are absent; `src` is readable (caller).
            unsafe { stream_copy(alias, src, len) };
            mapper.send(addr, len, false);
        }
        // SAFETY: every page queued is in the backing and its entries are absent (caller).
        unsafe { mapper.finish(&self.uffd) }
    }

    unsafe fn host_stage(&self, addr: usize, src: usize, len: usize) {
        let alias = self.alias(addr);
        // SAFETY: the alias maps the backing and is never registered; the host entries of the
        // page are absent and nothing else uses its backing (caller); `src` is readable.
        unsafe { stream_copy(alias, src, len) };
    }

    unsafe fn host_install_overlapped(
        &self,
        addr: usize,
        src: HostSource,
        len: usize,
        ahead: Option<(usize, usize)>,
    ) -> Result<()> {
        let (alias, huge) = self.alias_kind(addr);
        if huge {
            // One 2 MiB entry to install: nothing worth overlapping (and a hugetlbfs page
            // cannot be mapped in pieces). Copy, map, then stage the next page.
            if let HostSource::Copy(src) = src {
                // SAFETY: as in `host_install`.
                unsafe { stream_copy(alias, src, len) };
            }
            // SAFETY: the bytes are in the backing; the entries are absent (caller).
            let r = unsafe { self.continue_range(addr, len, false) };
            if r.is_ok() {
                if let Some((b, bsrc)) = ahead {
                    // SAFETY: forwarded contract of `host_stage`.
                    unsafe { self.host_stage(b, bsrc, len) };
                }
            }
            return r;
        }
        let mapper = self.mapper.lock();
        match src {
            HostSource::Staged => mapper.send(addr, len, false),
            HostSource::Copy(src) => {
                for (o, chunk) in install_pieces(len) {
                    // SAFETY: as in `host_install`: the alias is not registered and the host
                    // entries are absent; `src` is readable (caller).
                    unsafe { stream_copy(alias + o, src + o, chunk) };
                    mapper.send(addr + o, chunk, false);
                }
            }
        }
        if let Some((b, bsrc)) = ahead {
            // SAFETY: forwarded contract of `host_stage`.
            unsafe { self.host_stage(b, bsrc, len) };
        }
        // SAFETY: every piece queued is in the backing (staged or just copied) and its entries
        // are absent (caller).
        let r = unsafe { mapper.finish(&self.uffd) };
        if r.is_err() {
            // Leave the page absent, as it was: the device keeps its bytes.
            // SAFETY: our own page; its bytes are kept elsewhere (caller).
            unsafe { self.host_drop(addr, len).ok() };
        }
        r
    }

    unsafe fn host_evict_batch(&self, pages: &[(usize, usize)], len: usize) -> Result<()> {
        if pages.len() < 2 {
            for &(addr, dst) in pages {
                // SAFETY: forwarded contract.
                unsafe { self.host_evict_to(addr, dst, len)? };
            }
            return Ok(());
        }
        // Pipeline: the helper zaps page i + 1 while this thread copies page i (each page is
        // zapped before its bytes are read, so no host write can land after its copy).
        let (tx, rx) = std::sync::mpsc::channel::<Result<()>>();
        std::thread::scope(|scope| {
            scope.spawn(move || {
                for &(addr, _) in pages {
                    // SAFETY: forwarded contract (present page of ours; bytes kept in the backing).
                    let r = unsafe { self.host_drop(addr, len) };
                    let failed = r.is_err();
                    if tx.send(r).is_err() || failed {
                        return;
                    }
                }
            });
            for &(addr, dst) in pages {
                match rx.recv() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(e),
                    Err(_) => {
                        return Err(HalError::Unexpected(
                            "the page-zapping thread stopped".into(),
                        ))
                    }
                }
                let alias = self.alias(addr);
                // SAFETY: the page's host entries are gone; the alias maps the backing; `dst` is
                // writable and does not overlap it (caller).
                unsafe { stream_copy(dst, alias, len) };
            }
            Ok(())
        })
    }

    unsafe fn host_drop(&self, addr: usize, len: usize) -> Result<()> {
        // SAFETY: our own present pages; their bytes are kept elsewhere (caller).
        unsafe { rustix::mm::madvise(addr as *mut _, len, Advice::LinuxDontNeed) }
            .map_err(|e| os_error("madvise(MADV_DONTNEED) of a managed page", e))
    }

    unsafe fn host_evict_to(&self, addr: usize, dst: usize, len: usize) -> Result<()> {
        // SAFETY: forwarded contract: zap the entries first, so no host write can land after
        // the copy; the backing keeps the bytes.
        unsafe { self.host_drop(addr, len)? };
        let alias = self.alias(addr);
        // SAFETY: the alias is mapped over the backing; `dst` is writable and does not
        // overlap it (caller).
        unsafe { stream_copy(dst, alias, len) };
        Ok(())
    }

    unsafe fn host_protect(&self, addr: usize, len: usize, read_only: bool) -> Result<()> {
        let mut w = UffdioWriteprotect {
            range: Self::range(addr, len),
            mode: if read_only {
                UFFDIO_WRITEPROTECT_MODE_WP
            } else {
                0
            },
        };
        loop {
            // SAFETY: UFFDIO_WRITEPROTECT takes a uffdio_writeprotect.
            match unsafe { uffd_ioctl(&self.uffd, UFFDIO_WRITEPROTECT, &mut w) } {
                Ok(()) => return Ok(()),
                Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    return Err(os_error(
                        &format!("ioctl(UFFDIO_WRITEPROTECT) at {addr:#x}"),
                        e,
                    ))
                }
            }
        }
    }

    fn host_wake(&self, addr: usize, len: usize) {
        let mut r = Self::range(addr, len);
        // SAFETY: UFFDIO_WAKE takes a uffdio_range.
        unsafe { uffd_ioctl(&self.uffd, UFFDIO_WAKE, &mut r).ok() };
    }

    unsafe fn zero(&self, addr: usize, len: usize) {
        // SAFETY: mapped and writable (caller).
        unsafe { std::ptr::write_bytes(addr as *mut u8, 0, len) };
    }

    unsafe fn copy(&self, dst: usize, src: usize, len: usize) {
        if dst.abs_diff(src) >= len {
            // SAFETY: both ranges are accessible (caller) and do not overlap.
            unsafe { stream_copy(dst, src, len) };
        } else {
            // SAFETY: both ranges are present and accessible (caller); memmove allows overlap.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
        }
    }

    fn start_fault_thread(&self, sink: Arc<dyn FaultSink>) -> Result<Box<dyn FaultThread>> {
        let uffd = self.uffd.try_clone().map_err(|e| {
            os_error(
                "dup of the userfaultfd",
                rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO),
            )
        })?;
        let stop =
            rustix::event::eventfd(0, EventfdFlags::CLOEXEC).map_err(|e| os_error("eventfd", e))?;
        let stop2 = stop.try_clone().map_err(|e| {
            os_error(
                "dup of an eventfd",
                rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO),
            )
        })?;
        let thread = std::thread::Builder::new()
            .name("hetmem-uffd".into())
            .spawn(move || fault_loop(uffd, stop2, sink))
            .map_err(|e| HalError::OutOfHostMemory(format!("spawning the fault thread: {e}")))?;
        Ok(Box::new(HostFaultThread {
            stop,
            thread: parking_lot::Mutex::new(Some(thread)),
        }))
    }
}

/// The pieces `(offset, len)` a host install of `len` bytes copies and hands to the mapper one
/// after the other: [`INSTALL_CHUNK`]s, then halving ones down to a sixteenth of it, so that what
/// the faulting thread waits for after the last copy (the mapping of the last piece) is short.
/// `len` itself when it is not a multiple of [`INSTALL_CHUNK`].
fn install_pieces(len: usize) -> impl Iterator<Item = (usize, usize)> {
    let last = INSTALL_CHUNK / 16;
    let pieced = len.is_multiple_of(INSTALL_CHUNK) && len > INSTALL_CHUNK;
    let mut o = 0;
    std::iter::from_fn(move || {
        if o >= len {
            return None;
        }
        let left = len - o;
        let n = if !pieced {
            left
        } else if left > INSTALL_CHUNK {
            INSTALL_CHUNK
        } else {
            (left / 2).max(last)
        };
        o += n;
        Some((o - n, n))
    })
}

/// Maps the absent host pages `[addr, addr+len)` of a range registered on `uffd` from the
/// backing and wakes their waiters (`ioctl(UFFDIO_CONTINUE)`, see `ioctl_userfaultfd(2)`;
/// `UFFDIO_CONTINUE_MODE_WP` when read-only). Continues after a partial mapping (`EAGAIN`,
/// `EINTR`). Errors: `HalError` naming the ioctl, the range and how far it got.
///
/// # Safety
/// The bytes are in the backing and the host entries are absent.
unsafe fn continue_range(uffd: &OwnedFd, addr: usize, len: usize, read_only: bool) -> Result<()> {
    let mut done = 0usize;
    while done < len {
        let mut c = UffdioContinue {
            range: HostManaged::range(addr + done, len - done),
            mode: if read_only {
                UFFDIO_CONTINUE_MODE_WP
            } else {
                0
            },
            mapped: 0,
        };
        // SAFETY: UFFDIO_CONTINUE takes a uffdio_continue; the pages are in the backing.
        let r = unsafe { uffd_ioctl(uffd, UFFDIO_CONTINUE, &mut c) };
        if c.mapped > 0 {
            done += c.mapped as usize;
        }
        match r {
            Ok(()) => {}
            // Interrupted part-way: continue after `mapped`.
            Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(os_error(
                    &format!(
                        "ioctl(UFFDIO_CONTINUE) of {len:#x} bytes at {addr:#x} (after {done:#x})"
                    ),
                    e,
                ))
            }
        }
    }
    Ok(())
}

/// The host backing of one managed range.
#[derive(Debug)]
struct Backing {
    _fd: OwnedFd,
    alias: usize,
    /// On hugetlbfs (2 MiB pages).
    huge: bool,
}

#[derive(Debug)]
struct HostFaultThread {
    stop: OwnedFd,
    thread: parking_lot::Mutex<Option<JoinHandle<()>>>,
}

impl FaultThread for HostFaultThread {}

impl Drop for HostFaultThread {
    fn drop(&mut self) {
        rustix::io::write(&self.stop, &1u64.to_ne_bytes()).ok();
        if let Some(t) = self.thread.lock().take() {
            t.join().ok();
        }
    }
}

/// How long the fault thread keeps reading the userfaultfd after it resolved a fault before it
/// sleeps in `poll(2)` (see [`fault_loop`]).
const FAULT_SPIN: std::time::Duration = std::time::Duration::from_micros(100);

fn fault_loop(uffd: OwnedFd, stop: OwnedFd, sink: Arc<dyn FaultSink>) {
    // One message per read: a fault resolved by an earlier one wakes every thread waiting on
    // the page, and the kernel then drops their unread messages; messages read in a batch
    // would stay behind as stale faults and migrate the page again after it moved on.
    let mut msgs = [UffdMsg::default(); 1];
    // For FAULT_SPIN after a fault is resolved the thread reads again at once (the fd is
    // non-blocking) instead of sleeping in poll: a thread walking managed memory faults again
    // soon after it is woken, and a sleep and wake-up of this thread is on that fault's path.
    // Measured on the 2-core VM, random-order faults on 2 MiB hugetlbfs pages (where the whole
    // install runs before the faulting thread is woken, so each fault waited for this thread's
    // wake-up): 1 GiB walked at 7.84-7.91 GiB/s against 7.11-7.35 sleeping after each fault.
    // The stop eventfd is only seen in poll, at most FAULT_SPIN after the last fault. Between
    // reads it yields the core (`sched_yield(2)`): a faulting thread woken on this core would
    // otherwise wait for the spin to end (bench managed's p99 fault latency on 2 MiB pages went
    // from 0.7x to 1.9x a 2 MiB memcpy's with a spin that did not yield).
    let mut resolved_at: Option<std::time::Instant> = None;
    loop {
        let spinning = resolved_at.is_some_and(|t| t.elapsed() < FAULT_SPIN);
        if !spinning {
            resolved_at = None;
            let mut fds = [
                PollFd::new(&uffd, PollFlags::IN),
                PollFd::new(&stop, PollFlags::IN),
            ];
            match rustix::event::poll(&mut fds, None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return,
            }
            if !fds[1].revents().is_empty() {
                return;
            }
        }
        let n = {
            // SAFETY: UffdMsg is plain old data; the byte view covers exactly the array.
            let buf = unsafe {
                std::slice::from_raw_parts_mut(
                    msgs.as_mut_ptr() as *mut u8,
                    std::mem::size_of_val(&msgs),
                )
            };
            match rustix::io::read(uffd.as_fd(), buf) {
                Ok(n) => n / std::mem::size_of::<UffdMsg>(),
                Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => {
                    if spinning {
                        // Let the faulting thread run if it was woken on this core.
                        std::thread::yield_now();
                    }
                    continue;
                }
                Err(_) => return,
            }
        };
        for m in &msgs[..n] {
            if m.event == UFFD_EVENT_PAGEFAULT {
                sink.fault(Fault {
                    addr: m.address as usize,
                    write: m.flags & UFFD_PAGEFAULT_FLAG_WRITE != 0,
                    write_protect: m.flags & UFFD_PAGEFAULT_FLAG_WP != 0,
                });
            }
        }
        if n > 0 {
            resolved_at = Some(std::time::Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_pieces_cover_the_page_and_end_small() {
        let len = 2 << 20;
        let pieces: Vec<_> = install_pieces(len).collect();
        let mut o = 0;
        for &(off, n) in &pieces {
            assert_eq!(off, o, "pieces follow each other");
            assert!(
                n.is_multiple_of(16 << 10),
                "{n:#x}: stream_copy's interleaved loop"
            );
            o += n;
        }
        assert_eq!(o, len);
        assert_eq!(pieces.first().unwrap().1, INSTALL_CHUNK);
        assert_eq!(pieces.last().unwrap().1, INSTALL_CHUNK / 16);
        assert!(pieces.len() <= 10);
        assert_eq!(install_pieces(4096).collect::<Vec<_>>(), vec![(0, 4096)]);
        assert_eq!(
            install_pieces(INSTALL_CHUNK).collect::<Vec<_>>(),
            vec![(0, INSTALL_CHUNK)]
        );
    }
}
