//! The host backend: virtual devices on any Linux machine, with real virtual memory.
//!
//! Each raw operation is one function over one or two syscalls (through `rustix`):
//!
//! | operation | syscalls |
//! |---|---|
//! | reserve | `mmap(PROT_NONE, MAP_PRIVATE \| MAP_ANONYMOUS \| MAP_NORESERVE [\| MAP_FIXED_NOREPLACE])` of the exact size where the kernel aligns it (page alignment; 2 MiB multiples up to 2 MiB alignment), else of size + alignment and `munmap` of the slack |
//! | release | `munmap(2)` |
//! | create physical | `memfd_create(2)`, `ftruncate(2)`, `fcntl(F_ADD_SEALS)`; of a 2 MiB multiple while reserved huge pages are free, `memfd_create(MFD_HUGETLB \| MFD_HUGE_2MB)`, `ftruncate`, `fallocate(2)`, `F_ADD_SEALS` ([`hugetlb`]) |
//! | destroy physical | `close(2)` |
//! | map | `mmap(MAP_SHARED \| MAP_FIXED \| MAP_POPULATE, memfd, offset)` (no `MAP_POPULATE` for access NONE); with shmem THP, a 2 MiB-aligned map is `mmap(MAP_SHARED \| MAP_FIXED)`, `madvise(MADV_HUGEPAGE)`, `madvise(MADV_POPULATE_READ)` ([`huge`]); a piece of a hugetlbfs object splits it into shmem first ([`hugetlb`]) |
//! | map an IPC view | `mmap(MAP_SHARED \| MAP_FIXED, memfd, offset)` (filled on first touch, never huge-advised or populated) |
//! | unmap | `mmap(PROT_NONE, MAP_FIXED \| MAP_NORESERVE)` (the placeholder comes back) |
//! | protect | `mprotect(2)` |
//! | alloc (USM) | `memfd_create`, `ftruncate`, `F_ADD_SEALS`, placeholder `mmap`, `mmap(MAP_SHARED \| MAP_FIXED)` |
//! | free alloc | `munmap(2)`, `close(2)` |
//! | host protection | reads `/proc/self/maps` |
//! | register / unregister host | nothing (devices are threads of this process) |
//! | export physical / allocation (IPC) | `fcntl(F_DUPFD_CLOEXEC)` |
//! | import physical (IPC) | nothing (takes the fd) |
//! | create engine | `std::thread::spawn` of a worker that runs copies (`memmove`), fills (`memset`) and waits in order ([`engine`]) |
//!
//! A physical object is its own memfd, sealed against grow and shrink (and against further seal
//! changes), so that nobody holding the fd can change its size under a mapping.
//!
//! # What map costs
//! A readable map fills the page table of the whole range in the call (`MAP_POPULATE`), as a GPU
//! driver writes the page-table entries of `zeVirtualMemMap`: the first access to a mapped page
//! never faults. The kernel maps the object's pages already in memory in batches (fault-around)
//! and allocates (zeroes) the ones never touched, so map costs time in proportion to the range
//! (on a 2-core VM, about 0.25 ms per 2 MiB of 4 KiB pages against about 1.5-2 ms for faulting
//! them in one by one on first write; `hetmem bench kv`), and the memory is resident from the
//! map on. A map with access NONE populates nothing (nothing may touch it), and neither does
//! the map of an IPC view (`Backend::map_view`): it shows memory its exporter owns, which
//! populating would allocate whole and cost 512 page-table entries per 2 MiB at every open
//! (most of `hetmem bench ipc`'s time when views were populated, issue 23).

pub(crate) mod engine;
pub(crate) mod huge;
mod hugetlb;
pub(crate) mod managed;
mod managed_ops;
mod residency;

// The Linux platform layer shared with every backend on Linux.
pub(crate) use super::platform::{
    current_numa_node, numa_nodes, os_error, os_page_size, raise_fd_limit,
};
use hetmem_linux::broker as ipc;

use std::os::fd::{AsFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, MprotectFlags, ProtFlags};

use super::{
    AllocLocation, Backend, DeviceInfo, PhysicalLocation, Protection, RawAllocation, RawPhysical,
    SharedPart,
};
use crate::backend::{HalError, Result};

/// The host backend.
#[derive(Debug)]
pub(crate) struct HostBackend {
    devices: Vec<DeviceInfo>,
    /// The page kinds taken for 2 MiB-and-larger memory ([`huge`]).
    huge: huge::HugePages,
    /// Physical objects on reserved hugetlbfs pages and their mappings ([`hugetlb`]).
    hugetlb: hugetlb::HugetlbObjects,
}

impl HostBackend {
    /// Makes the backend with `devices` virtual devices of `device_memory` bytes each, whose
    /// largest single allocation is `max_alloc_size` bytes, and raises the open-file limit to
    /// its hard limit (every physical object is a memfd). `huge_pages`: take 2 MiB pages where
    /// the machine offers them ([`huge`]). The runtime builder validated the values (at least
    /// one device, non-zero sizes).
    pub(crate) fn new(
        devices: u32,
        device_memory: u64,
        max_alloc_size: u64,
        huge_pages: bool,
    ) -> HostBackend {
        debug_assert!(devices > 0 && device_memory > 0);
        raise_fd_limit();
        let page = os_page_size();
        let devices = (0..devices)
            .map(|i| DeviceInfo {
                name: format!("hetmem host device {i}"),
                capacity: device_memory,
                max_alloc_size: max_alloc_size.min(device_memory),
                min_page_size: page,
            })
            .collect();
        HostBackend {
            devices,
            huge: huge::HugePages::probe(huge_pages),
            hugetlb: hugetlb::HugetlbObjects::default(),
        }
    }
}

fn prot_flags(p: Protection) -> ProtFlags {
    match p {
        Protection::None => ProtFlags::empty(),
        Protection::ReadWrite => ProtFlags::READ | ProtFlags::WRITE,
        Protection::ReadOnly => ProtFlags::READ,
    }
}

fn mprotect_flags(p: Protection) -> MprotectFlags {
    match p {
        Protection::None => MprotectFlags::empty(),
        Protection::ReadWrite => MprotectFlags::READ | MprotectFlags::WRITE,
        Protection::ReadOnly => MprotectFlags::READ,
    }
}

const PLACEHOLDER: MapFlags = MapFlags::PRIVATE.union(MapFlags::NORESERVE);

/// Puts the inaccessible placeholder back over `[addr, addr+size)`:
/// `mmap(PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED)`. The range stays
/// reserved and its pages lose their memory.
///
/// # Safety
/// `[addr, addr+size)` belongs to the caller (its own placeholder or mapping).
pub(crate) unsafe fn restore_placeholder(addr: usize, size: usize) -> rustix::io::Result<()> {
    // SAFETY: forwarded contract.
    unsafe {
        rustix::mm::mmap_anonymous(
            addr as *mut _,
            size,
            ProtFlags::empty(),
            PLACEHOLDER | MapFlags::FIXED,
        )
    }
    .map(|_| ())
}

/// Maps `[offset, offset+size)` of `fd` at `addr` read-write or as `prot` says:
/// `mmap(addr, size, prot, MAP_SHARED | MAP_FIXED | extra, fd, offset)`.
///
/// # Safety
/// `[addr, addr+size)` belongs to the caller (its own placeholder or mapping), which MAP_FIXED
/// replaces.
pub(crate) unsafe fn map_shared_fixed<Fd: std::os::fd::AsFd>(
    addr: usize,
    size: usize,
    prot: ProtFlags,
    extra: MapFlags,
    fd: Fd,
    offset: u64,
) -> rustix::io::Result<()> {
    // SAFETY: forwarded contract.
    unsafe {
        rustix::mm::mmap(
            addr as *mut _,
            size,
            prot,
            MapFlags::SHARED | MapFlags::FIXED | extra,
            fd,
            offset,
        )
    }
    .map(|_| ())
}

/// The boundary Linux (6.7 on) places anonymous mappings whose length is a multiple of it at
/// (a PMD: its transparent huge page size with 4 KiB pages).
const PMD: usize = 2 << 20;

/// Whether this kernel placed the last exact-size reservation tried at the alignment asked
/// (see [`reserve_placeholder`]); once it did not, the exact try is skipped for alignments
/// above the page.
static EXACT_ALIGNS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Reserves inaccessible address space: `mmap(PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS |
/// MAP_NORESERVE)`, with `MAP_FIXED_NOREPLACE` at `hint` when given (never replaces a mapping).
/// Without a hint, where the kernel places the exact size at the alignment anyway (any size
/// for page alignment; a multiple of 2 MiB for alignments up to 2 MiB, which Linux 6.7 on
/// aligns to 2 MiB), that one call; otherwise over-allocating by `align` and `munmap`-ing the
/// slack to align the start.
///
/// # Safety
/// Edits the process address space; never touches existing mappings.
pub(crate) unsafe fn reserve_placeholder(
    hint: Option<usize>,
    size: usize,
    align: usize,
) -> Result<usize> {
    if let Some(h) = hint {
        if h % align == 0 {
            // SAFETY: FIXED_NOREPLACE fails rather than replacing anything.
            match unsafe {
                rustix::mm::mmap_anonymous(
                    h as *mut _,
                    size,
                    ProtFlags::empty(),
                    PLACEHOLDER | MapFlags::FIXED_NOREPLACE,
                )
            } {
                Ok(p) if p as usize == h => return Ok(h),
                Ok(p) => {
                    // A kernel without FIXED_NOREPLACE treats it as a hint; give it back.
                    // SAFETY: p is the mapping we just made.
                    unsafe { rustix::mm::munmap(p, size).ok() };
                }
                Err(_) => {}
            }
        }
    }
    use std::sync::atomic::Ordering::Relaxed;
    let page = os_page_size();
    if align <= page || (align <= PMD && size.is_multiple_of(PMD) && EXACT_ALIGNS.load(Relaxed)) {
        // SAFETY: a fresh anonymous mapping chosen by the kernel.
        let p = unsafe {
            rustix::mm::mmap_anonymous(std::ptr::null_mut(), size, ProtFlags::empty(), PLACEHOLDER)
        }
        .map_err(|e| os_error("mmap(PROT_NONE) for a reservation", e))? as usize;
        if p.is_multiple_of(align) {
            return Ok(p);
        }
        EXACT_ALIGNS.store(false, Relaxed);
        // SAFETY: the mapping we just made; nobody else knows of it.
        unsafe { rustix::mm::munmap(p as *mut _, size).ok() };
    }
    let total = size.checked_add(align).ok_or_else(|| {
        HalError::OutOfHostMemory(format!("no address range of {size:#x} + {align:#x} bytes"))
    })?;
    // SAFETY: a fresh anonymous mapping chosen by the kernel.
    let p = unsafe {
        rustix::mm::mmap_anonymous(std::ptr::null_mut(), total, ProtFlags::empty(), PLACEHOLDER)
    }
    .map_err(|e| os_error("mmap(PROT_NONE) for a reservation", e))? as usize;
    let start = (p + align - 1) & !(align - 1);
    let head = start - p;
    let tail = total - head - size;
    // SAFETY: the slack is part of the mapping we just made and nobody else knows of it.
    unsafe {
        if head > 0 {
            rustix::mm::munmap(p as *mut _, head).ok();
        }
        if tail > 0 {
            rustix::mm::munmap((start + size) as *mut _, tail).ok();
        }
    }
    Ok(start)
}

/// Creates a sealed memfd of `size` bytes: [`sized_memfd`], then
/// `fcntl(F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL)`.
pub(crate) fn sealed_memfd(size: usize) -> Result<OwnedFd> {
    let fd = sized_memfd("hetmem-physical", size as u64)?;
    rustix::fs::fcntl_add_seals(&fd, SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL)
        .map_err(|e| os_error("fcntl(F_ADD_SEALS)", e))?;
    Ok(fd)
}

/// Creates a memfd of `size` bytes, not yet sealed: `memfd_create(MFD_CLOEXEC |
/// MFD_ALLOW_SEALING)`, then `ftruncate` (after checking `RLIMIT_FSIZE`, which would otherwise
/// kill the process with `SIGXFSZ`).
pub(crate) fn sized_memfd(name: &str, size: u64) -> Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .map_err(|e| os_error("memfd_create", e))?;
    check_file_size(size)?;
    rustix::fs::ftruncate(&fd, size).map_err(|e| os_error("ftruncate(memfd)", e))?;
    Ok(fd)
}

/// `ftruncate` past `RLIMIT_FSIZE` raises `SIGXFSZ`, which kills the process: refuses a file of
/// `size` bytes first (`getrlimit(2)`).
pub(crate) fn check_file_size(size: u64) -> Result<()> {
    if let Some(limit) = rustix::process::getrlimit(rustix::process::Resource::Fsize).current {
        if size > limit {
            return Err(HalError::OutOfHostMemory(format!(
                "{size:#x} bytes exceed the file-size limit RLIMIT_FSIZE ({limit}) that memfd \
                 memory is subject to"
            )));
        }
    }
    Ok(())
}

/// `mmap(addr, size, prot, MAP_SHARED | MAP_FIXED | extra, memfd, phys_offset)` of physical
/// object `raw` over our placeholder; on failure the placeholder is put back.
///
/// # Safety
/// As [`Backend::map`]: `[addr, addr+size)` is an unmapped part of one of our reservations.
unsafe fn map_memfd(
    addr: usize,
    size: usize,
    raw: RawPhysical,
    phys_offset: usize,
    prot: Protection,
    extra: MapFlags,
) -> Result<()> {
    // SAFETY: the fd is alive while the semantics layer holds the object.
    let fd = unsafe { BorrowedFd::borrow_raw(raw.0 as i32) };
    // SAFETY: [addr, addr+size) is an unmapped part of one of our reservations, so MAP_FIXED
    // replaces only our own placeholder.
    let r =
        unsafe { map_shared_fixed(addr, size, prot_flags(prot), extra, fd, phys_offset as u64) };
    match r {
        Ok(_) => Ok(()),
        Err(e) => {
            // A failed MAP_FIXED may have dropped the placeholder; put it back so the range
            // stays reserved.
            // SAFETY: same range, still ours.
            unsafe { restore_placeholder(addr, size).ok() };
            Err(os_error("mmap(MAP_FIXED) of a physical object", e))
        }
    }
}

impl Backend for HostBackend {
    fn name(&self) -> &'static str {
        "host"
    }

    fn describe(&self) -> String {
        format!(
            "hetmem host backend (Linux {}; memfd physical memory, mmap/mprotect mappings; \
             {} virtual devices)",
            rustix::system::uname().release().to_string_lossy(),
            self.devices.len()
        )
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    fn page_kinds(&self) -> Option<String> {
        Some(self.huge.describe())
    }

    unsafe fn reserve(&self, hint: Option<usize>, size: usize, align: usize) -> Result<usize> {
        // SAFETY: forwarded contract.
        unsafe { reserve_placeholder(hint, size, align) }
    }

    unsafe fn release(&self, addr: usize, size: usize) -> Result<()> {
        // SAFETY: the caller guarantees this is exactly one of our reservations.
        unsafe { rustix::mm::munmap(addr as *mut _, size) }
            .map_err(|e| os_error("munmap of a reservation", e))
    }

    unsafe fn release_mapped(
        &self,
        addr: usize,
        size: usize,
        _mapped: &[(usize, usize)],
    ) -> Result<()> {
        // One munmap drops the mappings with the placeholder. A map that splits the end of a
        // placeholder may take the process one VMA past vm.max_map_count, and from then on the
        // kernel refuses every mmap, our placeholder-based unmap included; munmap of whole VMAs
        // needs no new one, so a process at the limit can usually free its way out. (Where the
        // kernel merged this placeholder with a neighbouring reservation's, the munmap must split
        // a VMA, which is refused at the limit: the free then fails cleanly, changing nothing.)
        // SAFETY: the caller guarantees this is exactly one of our reservations; its mappings
        // go with it.
        self.hugetlb
            .release(addr, size, || unsafe { self.release(addr, size) })
    }

    fn create_physical(&self, _location: PhysicalLocation, size: usize) -> Result<RawPhysical> {
        // Reserved 2 MiB pages where they are free ([`hugetlb`]), else shmem.
        if self.huge.hugetlb_objects() && size.is_multiple_of(huge::HUGE) {
            if let Some(fd) = self.hugetlb.create(size) {
                return Ok(RawPhysical(fd.into_raw_fd() as u64));
            }
        }
        Ok(RawPhysical(sealed_memfd(size)?.into_raw_fd() as u64))
    }

    unsafe fn destroy_physical(&self, raw: RawPhysical) {
        self.hugetlb.destroyed(raw.0 as i32);
        // SAFETY: the caller passes ownership of an fd made by create_physical.
        drop(unsafe { OwnedFd::from_raw_fd(raw.0 as i32) });
    }

    unsafe fn map(
        &self,
        addr: usize,
        size: usize,
        raw: RawPhysical,
        phys_offset: usize,
        prot: Protection,
    ) -> Result<()> {
        // Fill the page table now (see "What map costs" above). A failure to populate (no
        // memory) is not an error of mmap; the pages then fault in on first touch as usual.
        let populate = if prot == Protection::None {
            MapFlags::empty()
        } else {
            MapFlags::POPULATE
        };
        // SAFETY: the fd is alive while the semantics layer holds the object.
        let fd = unsafe { BorrowedFd::borrow_raw(raw.0 as i32) };
        // A hugetlbfs object, in whole 2 MiB pages (a piece of one splits it first: [`hugetlb`]).
        // SAFETY: forwarded contract.
        if let Some(r) = unsafe { self.hugetlb.map(addr, size, fd, phys_offset, prot) } {
            return r;
        }
        // 2 MiB folios where shmem THP is on and the map can hold one (see [`huge`]).
        let huge = self.huge.thp_maps()
            && prot != Protection::None
            && size >= huge::HUGE
            && addr.is_multiple_of(huge::HUGE)
            && phys_offset.is_multiple_of(huge::HUGE);
        // SAFETY: [addr, addr+size) is an unmapped part of one of our reservations, so MAP_FIXED
        // replaces only our own placeholder.
        let r = unsafe {
            if huge {
                huge::map_huge(addr, size, prot_flags(prot), fd, phys_offset as u64)
            } else {
                map_shared_fixed(
                    addr,
                    size,
                    prot_flags(prot),
                    populate,
                    fd,
                    phys_offset as u64,
                )
            }
        };
        match r {
            Ok(_) => Ok(()),
            Err(e) => {
                // A failed MAP_FIXED may have dropped the placeholder; put it back so the range
                // stays reserved.
                // SAFETY: same range, still ours.
                unsafe { restore_placeholder(addr, size).ok() };
                Err(os_error("mmap(MAP_FIXED) of a physical object", e))
            }
        }
    }

    unsafe fn map_view(
        &self,
        addr: usize,
        size: usize,
        raw: RawPhysical,
        phys_offset: usize,
        prot: Protection,
    ) -> Result<()> {
        // No MAP_POPULATE: a view's pages fault in on first touch (see `Backend::map_view`).
        // SAFETY: forwarded contract.
        unsafe { map_memfd(addr, size, raw, phys_offset, prot, MapFlags::empty()) }
    }

    unsafe fn unmap(&self, addr: usize, size: usize) -> Result<()> {
        // SAFETY: the range is mapped pages of our own reservation (a hugetlbfs object's
        // mapping cut inside a 2 MiB page is split first: [`hugetlb`]).
        unsafe {
            self.hugetlb.change(addr, size, None, || {
                restore_placeholder(addr, size)
                    .map_err(|e| os_error("mmap(PROT_NONE, MAP_FIXED) to unmap", e))
            })
        }
    }

    fn alloc(
        &self,
        _location: AllocLocation,
        size: usize,
        align: usize,
    ) -> Result<(usize, RawAllocation)> {
        let fd = sealed_memfd(size)?;
        // SAFETY: a fresh placeholder chosen by the kernel; replaces nothing.
        let addr = unsafe { reserve_placeholder(None, size, align)? };
        // SAFETY: MAP_FIXED over our own fresh placeholder; the memfd is `size` bytes.
        let r = unsafe {
            map_shared_fixed(
                addr,
                size,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::empty(),
                &fd,
                0,
            )
        };
        if let Err(e) = r {
            // SAFETY: the placeholder (or what is left of it) is ours.
            unsafe { rustix::mm::munmap(addr as *mut _, size).ok() };
            return Err(os_error("mmap(MAP_SHARED | MAP_FIXED) of an allocation", e));
        }
        Ok((addr, RawAllocation(fd.into_raw_fd() as u64)))
    }

    unsafe fn free_alloc(&self, addr: usize, size: usize, raw: RawAllocation) {
        // SAFETY: the caller passes one live allocation of ours and gives up the memory.
        unsafe {
            rustix::mm::munmap(addr as *mut _, size).ok();
            drop(OwnedFd::from_raw_fd(raw.0 as i32));
        }
    }

    fn register_host(&self, _addr: usize, _size: usize, _read_only: bool) -> Result<()> {
        Ok(())
    }

    unsafe fn unregister_host(&self, _addr: usize, _size: usize) {}

    fn create_engine(&self, device: u32) -> Result<Box<dyn super::Engine>> {
        Ok(Box::new(engine::HostEngine::new(device)?))
    }

    fn create_sync(&self) -> Result<std::sync::Arc<dyn super::EngineSync>> {
        Ok(std::sync::Arc::new(super::sync::FlagSync::default()))
    }

    unsafe fn protect(&self, addr: usize, size: usize, prot: Protection) -> Result<()> {
        // SAFETY: the range is mapped pages of our own reservation (a hugetlbfs object's
        // mapping cut inside a 2 MiB page is split first: [`hugetlb`]).
        unsafe {
            self.hugetlb.change(addr, size, Some(prot), || {
                rustix::mm::mprotect(addr as *mut _, size, mprotect_flags(prot))
                    .map_err(|e| os_error("mprotect", e))
            })
        }
    }

    fn managed(
        &self,
        page_size: usize,
        room: std::sync::Arc<dyn super::managed::DeviceRoom>,
    ) -> std::result::Result<std::sync::Arc<dyn super::managed::ManagedResidency>, String> {
        if page_size != residency::PAGE {
            return Err(format!(
                "the host residency engine migrates pages of {:#x} bytes, not {page_size:#x}",
                residency::PAGE
            ));
        }
        let ops = std::sync::Arc::new(managed::HostManaged::new(
            &self.devices,
            self.huge.hugetlb_managed(),
        )?);
        Ok(std::sync::Arc::new(residency::HostResidency::start(
            ops, room,
        )?))
    }

    fn export_physical(
        &self,
        raw: RawPhysical,
        _covered: &[(usize, usize)],
    ) -> Result<Vec<SharedPart>> {
        // An importer may map any piece, and sees this memory from now on: a hugetlbfs object
        // becomes shmem first ([`hugetlb`]).
        self.hugetlb.before_export(raw.0 as i32)?;
        // SAFETY: the fd is alive while the semantics layer holds the object (it holds its lock).
        Ok(vec![memfd_part(
            unsafe { BorrowedFd::borrow_raw(raw.0 as i32) },
            "a physical object",
        )?])
    }

    fn export_allocation(&self, raw: RawAllocation) -> Result<Vec<SharedPart>> {
        // SAFETY: the fd is alive while the semantics layer holds the allocation.
        Ok(vec![memfd_part(
            unsafe { BorrowedFd::borrow_raw(raw.0 as i32) },
            "an allocation",
        )?])
    }

    fn import_physical(&self, parts: Vec<SharedPart>) -> Result<RawPhysical> {
        let n = parts.len();
        let mut it = parts.into_iter();
        match (it.next(), n) {
            (Some(p), 1) => Ok(RawPhysical(p.fd.into_raw_fd() as u64)),
            _ => Err(HalError::Unsupported(format!(
                "the host backend imports a physical object from exactly one memfd, not {n}"
            ))),
        }
    }

    fn check_shareable(&self, fd: BorrowedFd<'_>, need: u64) -> std::result::Result<(), String> {
        check_sealed_memfd(fd, need)
    }
}

/// A duplicate of the memfd `fd` of `what` as one exported part of its whole size
/// (`fcntl(F_DUPFD_CLOEXEC)`, `fstat(2)`).
fn memfd_part(fd: BorrowedFd<'_>, what: &str) -> Result<SharedPart> {
    let dup = super::platform::dup(fd, what)?;
    let (_, _, size) = ipc::fd_identity(dup.as_fd())
        .ok_or_else(|| HalError::Unexpected(format!("fstat of the memfd of {what} failed")))?;
    Ok(SharedPart { fd: dup, size })
}

/// Checks that `fd` is a memfd sealed against grow and shrink of at least `need` bytes
/// (`fcntl(F_GET_SEALS)`, `fstat(2)`): what the host backend imports. `Err` says what is wrong.
fn check_sealed_memfd(fd: BorrowedFd<'_>, need: u64) -> std::result::Result<(), String> {
    let seals = ipc::fd_seals(fd)
        .map_err(|e| format!("a received fd is not a sealable memfd (F_GET_SEALS: {e})"))?;
    if !seals.contains(SealFlags::GROW | SealFlags::SHRINK) {
        return Err(format!(
            "a received memfd is not sealed against grow and shrink (seals {:#x})",
            seals.bits()
        ));
    }
    let (_, _, size) =
        ipc::fd_identity(fd).ok_or("a received fd cannot be inspected (fstat failed)")?;
    if size < need {
        return Err(format!(
            "a received memfd holds {size:#x} bytes, the handle maps {need:#x}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// A reservation starts at its alignment whichever way it is made: the exact size where the
    /// kernel aligns it (any size at the page, 2 MiB multiples up to 2 MiB), else over-allocating
    /// (64 KiB, 4 MiB alignments; and every alignment once the exact try is off).
    #[test]
    fn reservations_are_aligned_on_the_exact_and_the_over_allocating_path() {
        let page = os_page_size();
        let cases = [
            (page, page),
            (5 * page, page),
            (PMD, PMD),
            (3 * PMD, PMD),
            (PMD, 64 << 10),
            (64 << 10, 64 << 10),
            (3 * (64 << 10), 64 << 10),
            (2 * PMD, 2 * PMD),
        ];
        for exact in [true, false] {
            if !exact {
                EXACT_ALIGNS.store(false, std::sync::atomic::Ordering::Relaxed);
            }
            for (size, align) in cases {
                for _ in 0..4 {
                    // SAFETY: a fresh placeholder, released below.
                    let p = unsafe { reserve_placeholder(None, size, align) }.unwrap();
                    assert_eq!(p % align, 0, "{size:#x} bytes at {align:#x}: {p:#x}");
                    // SAFETY: the placeholder just made.
                    unsafe { rustix::mm::munmap(p as *mut _, size) }.unwrap();
                }
            }
        }
        EXACT_ALIGNS.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn memfd(size: u64, seals: SealFlags) -> OwnedFd {
        let fd =
            rustix::fs::memfd_create("t", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&fd, size).unwrap();
        if !seals.is_empty() {
            rustix::fs::fcntl_add_seals(&fd, seals).unwrap();
        }
        fd
    }

    /// An IPC open maps only a memfd sealed against grow and shrink and large enough; the
    /// semantics layer turns the refusal into `InvalidArgument` with the reason.
    #[test]
    fn received_fd_must_be_a_memfd_sealed_against_grow_and_shrink_and_large_enough() {
        let b = HostBackend::new(1, 64 << 20, 32 << 20, false);
        let ok = memfd(
            1 << 16,
            SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
        );
        assert!(crate::semantics::ipc::import::check_received_fd(&b, ok.as_fd(), 1 << 16).is_ok());
        let e = crate::semantics::ipc::import::check_received_fd(&b, ok.as_fd(), (1 << 16) + 1)
            .unwrap_err();
        assert_eq!(e.ze_result(), 0x7800_0004, "{e}");
        assert!(e.message().contains("holds"), "{e}");
        for seals in [SealFlags::empty(), SealFlags::GROW, SealFlags::SHRINK] {
            let f = memfd(1 << 16, seals);
            let e = crate::semantics::ipc::import::check_received_fd(&b, f.as_fd(), 1 << 16)
                .unwrap_err();
            assert_eq!(e.ze_result(), 0x7800_0004, "{seals:?}");
            assert!(e.message().contains("not sealed"), "{e}");
        }
        // Not a memfd at all: a pipe.
        let (r, _w) = rustix::pipe::pipe().unwrap();
        let e = crate::semantics::ipc::import::check_received_fd(&b, r.as_fd(), 1).unwrap_err();
        assert_eq!(e.ze_result(), 0x7800_0004);
        assert!(e.message().contains("not a sealable memfd"), "{e}");
    }
}
