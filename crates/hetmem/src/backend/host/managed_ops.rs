//! The raw page operations under the host backend's residency engine
//! ([`super::residency`]): what `userfaultfd(2)` ([`super::managed`]) offers, so that the engine
//! can keep each managed page resident in one place and move it on demand. A private detail of
//! the host backend: a GPU backend implements [`crate::backend::managed::ManagedResidency`]
//! directly over its driver's unified memory and has no use for these.
//!
//! The model: a managed allocation is a host virtual range whose host-resident pages are mapped
//! and whose other pages are not, so that a host access to them raises a *fault event* that the
//! platform delivers to a [`FaultSink`]; for every device there is a *mirror* range of the same
//! size, through which device-side operations reach the pages resident on that device (device
//! memory comes in *slots* of one managed page each). Nothing here decides where a page lives:
//! the engine does, and calls these operations in the order its protocol needs.

use std::sync::Arc;

use crate::backend::Result;

/// A host page fault on managed memory, as delivered by the platform (`struct uffd_msg`,
/// `UFFD_EVENT_PAGEFAULT`). The faulting thread is blocked until the page is made accessible
/// (an install, an unprotect or a [`ManagedOps::host_wake`] over its address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// The faulting address (page-aligned by the platform).
    pub addr: usize,
    /// A write access (`UFFD_PAGEFAULT_FLAG_WRITE`).
    pub write: bool,
    /// A write to a write-protected page (`UFFD_PAGEFAULT_FLAG_WP`).
    pub write_protect: bool,
}

/// Where the bytes of a host install come from ([`ManagedOps::host_install_overlapped`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostSource {
    /// Copied from this address (a device's mirror page), `len` bytes.
    Copy(usize),
    /// Already in the host memory behind the page ([`ManagedOps::host_stage`]).
    Staged,
}

/// The piece of a managed page that [`ManagedOps::host_install_overlapped`] copies and maps at a
/// time on the host backend (512 KiB: a quarter of a 2 MiB page, a multiple of 16 KiB for
/// `stream_copy`'s interleaved loop).
pub const INSTALL_CHUNK: usize = 512 << 10;

/// Receives fault events on the platform's fault-handling thread.
pub trait FaultSink: Send + Sync {
    /// Handles one fault: must leave the page accessible for the access (or wake the thread so
    /// it retries and faults again).
    fn fault(&self, fault: Fault);
}

/// The address ranges of one managed allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedRange {
    /// The host range (the pointer the application uses).
    pub host: usize,
    /// One mirror range per device, same size: device `d` reaches a page resident on it at
    /// `mirrors[d] + (addr - host)`.
    pub mirrors: Vec<usize>,
    /// Size in bytes.
    pub size: usize,
}

/// Stops and joins a fault-handling thread when dropped.
pub trait FaultThread: Send + Sync + std::fmt::Debug {}

/// The raw managed-memory operations. Every argument has been validated by the semantics layer;
/// addresses and lengths are multiples of the managed page size it chose (a multiple of the OS
/// page). Operations on the host range never fault themselves.
pub trait ManagedOps: Send + Sync + std::fmt::Debug {
    /// The host's NUMA nodes, ascending (as [`crate::backend::Backend::numa_nodes`]).
    fn numa_nodes(&self) -> Vec<u32>;

    /// The NUMA node of the calling thread's CPU (as
    /// [`crate::backend::Backend::current_numa_node`]).
    fn current_numa_node(&self) -> u32;

    /// Reserves a host range of `size` bytes aligned to `align`, all pages absent (accesses
    /// fault to the sink), and a mirror range per device, all unmapped.
    ///
    /// CUDA: `cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL)`. Host: `mmap(MAP_PRIVATE |
    /// MAP_ANONYMOUS | MAP_NORESERVE)`, `madvise(MADV_NOHUGEPAGE)`, `ioctl(UFFDIO_REGISTER,
    /// MISSING | WP)`, and a `PROT_NONE` placeholder per device.
    fn reserve(&self, size: usize, align: usize) -> Result<ManagedRange>;

    /// Releases a range made by [`ManagedOps::reserve`] (device slots were unmapped before).
    ///
    /// CUDA: `cuMemFree`. Host: `ioctl(UFFDIO_UNREGISTER)`, `munmap(2)` of the host range and
    /// the mirrors.
    ///
    /// # Safety
    /// `range` is live and not used again.
    unsafe fn release(&self, range: &ManagedRange);

    /// Maps device `device`'s memory slot `slot` (one page of `len` bytes) at mirror address
    /// `mirror_addr`, read-write, page tables populated. The slot's contents are whatever was
    /// last written to it (zeros for a slot never used or discarded since).
    ///
    /// CUDA: `cuMemMap` of a physical chunk. Host: `mmap(MAP_SHARED | MAP_FIXED |
    /// MAP_POPULATE)` of the device's memfd at `slot * len`.
    ///
    /// # Safety
    /// `mirror_addr` is an unmapped page of a live mirror of `device`; `slot` is free.
    unsafe fn device_map(
        &self,
        device: u32,
        mirror_addr: usize,
        slot: u32,
        len: usize,
    ) -> Result<()>;

    /// Unmaps a mirror page mapped by [`ManagedOps::device_map`]; the slot keeps its memory
    /// and contents (device memory stays with the device, to be reused).
    ///
    /// CUDA: `cuMemUnmap`. Host: `mmap(PROT_NONE, MAP_FIXED)` over the mirror page.
    ///
    /// # Safety
    /// The page is mapped there; nothing uses it any more.
    unsafe fn device_unmap(&self, device: u32, mirror_addr: usize, len: usize);

    /// Gives the memory of an unmapped slot back to the platform; it reads as zeros when used
    /// again.
    ///
    /// CUDA: nothing (the chunk is reused). Host: `fallocate(FALLOC_FL_PUNCH_HOLE)`.
    fn device_discard(&self, device: u32, slot: u32, len: usize);

    /// Sets `len` bytes at `addr` (a mapped mirror range) to zero.
    ///
    /// CUDA: `cuMemsetD8`. Host: `memset`.
    ///
    /// # Safety
    /// The range is mapped and writable.
    unsafe fn zero(&self, addr: usize, len: usize);

    /// Makes the absent host page `[addr, addr+len)` present with the bytes at `src` (zeros if
    /// `None`), write-protected if `read_only` (a later write faults with `write_protect`), and
    /// wakes the threads waiting on it.
    ///
    /// CUDA: `cuMemcpy` into host pages of the range. Host: `memcpy` into the host memfd through
    /// its alias, then `ioctl(UFFDIO_CONTINUE)` (mode `UFFDIO_CONTINUE_MODE_WP` when read-only).
    ///
    /// # Safety
    /// The page is absent; `src` is readable for `len` bytes and not inside the host range.
    unsafe fn host_install(
        &self,
        addr: usize,
        src: Option<usize>,
        len: usize,
        read_only: bool,
    ) -> Result<()>;

    /// Installs many absent host pages at once, writable: `pages[i] = (addr, src)` as
    /// [`ManagedOps::host_install`] with `Some(src)`, each `len` bytes. A platform may overlap
    /// the copies with the page-table updates. Default: one install after the other.
    ///
    /// Host: the calling thread copies page `i + 1` into the backing while the helper thread
    /// maps page `i` (`ioctl(UFFDIO_CONTINUE)`).
    ///
    /// # Safety
    /// As [`ManagedOps::host_install`], for every page.
    unsafe fn host_install_batch(&self, pages: &[(usize, usize)], len: usize) -> Result<()> {
        for &(addr, src) in pages {
            // SAFETY: forwarded contract.
            unsafe { self.host_install(addr, Some(src), len, false)? };
        }
        Ok(())
    }

    /// Copies `len` bytes from `src` into the host memory behind the absent host page
    /// `[addr, addr+len)` without making it present ("stages" it): host accesses still fault, and
    /// a later [`ManagedOps::host_install_overlapped`] with [`HostSource::Staged`] only has the
    /// page-table update left to do. The staged bytes are the page's only if nothing writes the
    /// source before that install (the caller's bookkeeping).
    ///
    /// CUDA: no equivalent (the driver migrates). Host: a streaming copy into the host memfd
    /// through its alias mapping.
    ///
    /// # Safety
    /// The page is absent on the host and nothing else uses its host memory until it is
    /// installed; `src` is readable for `len` bytes and not inside the host range.
    unsafe fn host_stage(&self, addr: usize, src: usize, len: usize);

    /// Makes the absent host page `[addr, addr+len)` present and writable with the bytes of
    /// `src`, as [`ManagedOps::host_install`] does, overlapping the copy with the page-table
    /// update; with `ahead = Some((b, bsrc))`, also stages page `b` from `bsrc`
    /// ([`ManagedOps::host_stage`]) while the page-table update of `addr` runs. On an error the
    /// page is absent again (threads that ran on a part already mapped fault again; what they
    /// wrote there is lost, the source keeping the page's bytes) and `b` is not staged.
    ///
    /// Host: the page is copied in [`INSTALL_CHUNK`] pieces (the last few smaller, down to a
    /// sixteenth of one) by the calling thread while a helper thread maps each piece copied
    /// (`ioctl(UFFDIO_CONTINUE)`), so the faulting thread waits for one copy and the mapping of
    /// the last (small) piece rather than for both in full; a staged
    /// page is mapped by the helper while this thread copies `b`. Pieces the helper has not
    /// taken when the copies are done (its core busy elsewhere) are mapped by the calling
    /// thread.
    ///
    /// # Safety
    /// As [`ManagedOps::host_install`] for `addr` (with [`HostSource::Staged`]: staged since,
    /// and the source unchanged), and as [`ManagedOps::host_stage`] for `ahead`.
    unsafe fn host_install_overlapped(
        &self,
        addr: usize,
        src: HostSource,
        len: usize,
        ahead: Option<(usize, usize)>,
    ) -> Result<()>;

    /// Makes the present host page `[addr, addr+len)` absent; its bytes are gone.
    ///
    /// Host: `madvise(MADV_DONTNEED)`.
    ///
    /// # Safety
    /// The page is present and its bytes are kept elsewhere (or not needed).
    unsafe fn host_drop(&self, addr: usize, len: usize) -> Result<()>;

    /// Makes the present host page `[addr, addr+len)` absent and copies the bytes it held to
    /// `dst`. Host accesses from the moment it is absent fault (and wait for the sink); the
    /// bytes copied are the last the host could write.
    ///
    /// CUDA: `cuMemcpy` to the device, then unmapping on the host. Host: `madvise(MADV_DONTNEED)`
    /// of the managed range, then `memcpy` from the backing through the alias.
    ///
    /// # Safety
    /// The page is present; `dst` is mapped, writable and outside the host range.
    unsafe fn host_evict_to(&self, addr: usize, dst: usize, len: usize) -> Result<()>;

    /// Evicts many present host pages at once: `pages[i] = (addr, dst)` as
    /// [`ManagedOps::host_evict_to`], each `len` bytes. A platform may overlap the page-table
    /// updates with the copies. Default: one after the other.
    ///
    /// Host: a helper thread zaps page `i + 1` while this thread copies page `i`.
    ///
    /// # Safety
    /// As [`ManagedOps::host_evict_to`], for every page.
    unsafe fn host_evict_batch(&self, pages: &[(usize, usize)], len: usize) -> Result<()> {
        for &(addr, dst) in pages {
            // SAFETY: forwarded contract.
            unsafe { self.host_evict_to(addr, dst, len)? };
        }
        Ok(())
    }

    /// Write-protects (`read_only`) or unprotects the present host page `[addr, addr+len)`;
    /// unprotecting wakes the threads waiting on it. While protected, writes fault with
    /// `write_protect` and wait.
    ///
    /// Host: `ioctl(UFFDIO_WRITEPROTECT)`.
    ///
    /// # Safety
    /// The page is present.
    unsafe fn host_protect(&self, addr: usize, len: usize, read_only: bool) -> Result<()>;

    /// Wakes the threads waiting on `[addr, addr+len)` so they retry the access.
    ///
    /// Host: `ioctl(UFFDIO_WAKE)`.
    fn host_wake(&self, addr: usize, len: usize);

    /// Copies `len` bytes from `src` to `dst` (may overlap: `memmove`). Used between the host
    /// range and mirrors and between mirrors.
    ///
    /// CUDA: `cuMemcpy`. Host: `memmove`.
    ///
    /// # Safety
    /// Both ranges are mapped (present), readable / writable, and do not fault.
    unsafe fn copy(&self, dst: usize, src: usize, len: usize);

    /// Starts the thread that reads fault events and hands them to `sink`, one at a time.
    /// Dropping the returned handle stops and joins it.
    ///
    /// Host: a thread `poll(2)`-ing the userfaultfd and an eventfd, `read(2)` of `uffd_msg`.
    fn start_fault_thread(&self, sink: Arc<dyn FaultSink>) -> Result<Box<dyn FaultThread>>;
}
