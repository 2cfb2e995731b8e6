//! Managed (unified) memory residency: the operations a platform's unified-memory driver offers,
//! below the ACL rules of the semantics layer ([`crate::managed`]).
//!
//! The cut is the one the CUDA driver draws: a managed range is allocated once
//! (`cuMemAllocManaged`) and from then on the *driver* decides where each page lives, migrating
//! pages on access by either side, on request (`cuMemPrefetchAsync`), and following advice
//! (`cuMemAdvise`). The semantics layer above checks every argument, chooses every error code,
//! rounds sizes, enforces the process limit, keeps the advice bookkeeping that the eight range
//! attributes are answered from, orders work on streams and makes a free wait for the stream
//! work queued on the memory. This trait moves pages and bytes, nothing else.
//!
//! The host backend implements it with a software UVM driver over `userfaultfd(2)`: a residency
//! engine with pages, per-device slots, LRU eviction, pins and host-fault resolution
//! (`backend/host/residency.rs`). A cuda backend maps each method onto one or two driver
//! calls, named in each method's docs.
//!
//! # Where the driver's answers and ACL's differ
//! The range attributes are answered by the semantics layer from its own bookkeeping, never by
//! asking the backend: the driver's answers differ from ACL's.
//! - `ACCESSED_BY`: `cuMemRangeGetAttribute(CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY)` leaves the
//!   slots past the last device unwritten; ACL pads them with -2, and lists the host (-1) and
//!   NUMA nodes too.
//! - A prefetch to a host NUMA node: the driver reports `LAST_PREFETCH_LOCATION` as -1 (the
//!   host); ACL answers the node id (and type HOST_NUMA).
//! - Numbering: ACL advice values 0..=5 are `CUmem_advise` 1..=6; the range attributes ACL
//!   4 / 5 / 6 (preferred type, preferred id, last prefetch) are CUDA's 5 / 6 / 4
//!   (`CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE` = 5, `..._PREFERRED_LOCATION_ID` = 6,
//!   `..._LAST_PREFETCH_LOCATION` = 4). The semantics layer decodes ACL's values; the backend
//!   gets [`ResidencyAdvice`] and [`Place`], never a raw number.
//!
//! # Contract
//! Every argument has been validated by the semantics layer: ranges lie inside one live managed
//! allocation, sizes and pointers of [`ManagedResidency::prefetch`] / [`ManagedResidency::advise`]
//! are multiples of the page size given to [`crate::backend::Backend::managed`], devices and
//! NUMA nodes exist. The backend still answers [`ResidencyError::NotManaged`] for a range that
//! was freed by another thread after the check (the semantics layer does not hold its lock while
//! a backend call waits).

use crate::backend::{HalError, Result};

/// Where a managed page is moved to or preferred: the semantics layer's resolved location.
///
/// CUDA: a `CUmemLocation` (`CU_MEM_LOCATION_TYPE_HOST`, `..._HOST_NUMA` with the node id,
/// `..._DEVICE` with the ordinal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Place {
    /// Host memory.
    Host,
    /// Host memory on NUMA node `n` (the host backend treats it as [`Place::Host`]).
    HostNuma(u32),
    /// Device `d`.
    Device(u32),
}

impl Place {
    /// The device, if this is one.
    pub fn device(self) -> Option<u32> {
        match self {
            Place::Device(d) => Some(d),
            _ => None,
        }
    }
}

/// Advice that changes residency or residency policy, as [`ManagedResidency::advise`] gets it
/// (the ACL advice after the semantics layer's checks; locations resolved).
///
/// CUDA: `cuMemAdvise_v2(ptr, size, advice, location)` with `CU_MEM_ADVISE_SET_READ_MOSTLY` (1),
/// `..._UNSET_READ_MOSTLY` (2), `..._SET_PREFERRED_LOCATION` (3), `..._UNSET_PREFERRED_LOCATION`
/// (4), `..._SET_ACCESSED_BY` (5), `..._UNSET_ACCESSED_BY` (6); the eager steps ACL asks for
/// (populating pages at once) as a `cuMemPrefetchAsync_v2` to the place followed by
/// `cuStreamSynchronize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResidencyAdvice {
    /// Every page gets a read-only host copy at once (besides any device copy); from now on a
    /// read anywhere may add a read-only copy, a write collapses the copies to the writer's.
    SetReadMostly,
    /// The copies of read-mostly pages collapse to one, writable, at the place; the pages are
    /// no longer read-mostly.
    UnsetReadMostly(Place),
    /// Pages not read-mostly are populated at the place at once (read-mostly pages get a
    /// read-only copy on a device place); pages preferring a device are evicted from it last.
    /// The `check` of [`ManagedResidency::advise`] decides first whether the pages' residency
    /// allows it.
    SetPreferredLocation(Place),
    /// Forgets the preference.
    UnsetPreferredLocation,
    /// Pages whose preferred location is the same place are populated (mapped) there at once.
    SetAccessedBy(Place),
    /// Nothing moves (the host backend keeps no mappings for other processors).
    UnsetAccessedBy(Place),
}

/// One page of an advised range as the `check` of [`ManagedResidency::advise`] sees it, after
/// work using the range has finished and before anything moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageView {
    /// The page's address.
    pub addr: usize,
    /// Advised read-mostly (as the backend applied it).
    pub read_mostly: bool,
    /// Has a host copy.
    pub host: bool,
    /// The lowest device holding a copy, if any.
    pub device: Option<u32>,
}

/// Where one managed page has copies ([`crate::Context::managed_residency`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Residency {
    /// Present on the host.
    pub host: bool,
    /// The host copy is a read-only (read-mostly) copy.
    pub host_read_only: bool,
    /// Devices holding a copy.
    pub devices: Vec<u32>,
}

/// Counters of one device's managed memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ManagedDeviceStats {
    /// Pages copied onto the device (from the host or another device).
    pub pages_to_device: u64,
    /// Bytes copied onto the device.
    pub bytes_to_device: u64,
    /// Pages copied off the device (to the host or another device).
    pub pages_from_device: u64,
    /// Bytes copied off the device.
    pub bytes_from_device: u64,
    /// Pages evicted to the host because the device was full.
    pub evictions: u64,
    /// Managed pages (copies) resident on the device now.
    pub resident_pages: u64,
}

/// Counters of a driver's managed memory ([`crate::Driver::managed_stats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ManagedStats {
    /// Live managed allocations.
    pub allocations: u64,
    /// Bytes of live managed allocations (rounded to 2 MiB).
    pub bytes: u64,
    /// Host faults that made a page accessible (migration, population, write-unprotect): one
    /// per page and resolution, however many threads faulted on it.
    pub host_faults: u64,
    /// Fault events read from the platform (several threads on one page give several).
    pub fault_events: u64,
    /// Pages copied to the host (host faults, prefetches, evictions, advice).
    pub pages_to_host: u64,
    /// Bytes copied to the host.
    pub bytes_to_host: u64,
    /// Pages copied from the host to a device.
    pub pages_from_host: u64,
    /// Bytes copied from the host to a device.
    pub bytes_from_host: u64,
    /// Pages present on the host now.
    pub host_resident_pages: u64,
    /// Pages whose bytes the host backend copied to the host ahead of their own host fault,
    /// while resolving the fault on the page before them when host faults came in address order
    /// (its sequential-fault prefetcher, see `backend::host::residency`). Such a page stays
    /// where it is, and is counted as moved, only when its own fault comes; a device write to
    /// it meanwhile discards the staged bytes. 0 on other backends.
    pub pages_staged: u64,
    /// Host installs (almost always the staged page's own fault; also a prefetch or advice that
    /// brought it to the host first) that found their bytes staged ahead
    /// ([`ManagedStats::pages_staged`]): only the page-table update was left to do.
    pub staged_installs: u64,
    /// Per device, in ordinal order.
    pub devices: Vec<ManagedDeviceStats>,
}

/// Why a residency operation failed. The semantics layer chooses the spec code for each.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResidencyError {
    /// The platform refused (a mapping, an ioctl, a driver call).
    #[error(transparent)]
    Platform(#[from] HalError),
    /// The device cannot take the pages: full of memory that is not an evictable managed page
    /// (the message names the device and its use). CUDA: `CUDA_ERROR_OUT_OF_MEMORY` from a
    /// prefetch or advice.
    #[error("{0}")]
    DeviceFull(String),
    /// The range is not (any more) inside one live managed allocation: freed by another
    /// thread after the semantics layer checked it.
    #[error("{0}")]
    NotManaged(String),
    /// The `check` of [`ManagedResidency::advise`] refused; nothing moved.
    #[error("{0}")]
    Refused(String),
    /// A broken invariant of the backend (the copies of a read-mostly page differ).
    #[error("{0}")]
    Broken(String),
}

/// `Result` of a residency operation.
pub type ResidencyResult<T> = std::result::Result<T, ResidencyError>;

/// The device-memory accounting a residency backend charges its device pages to: the semantics
/// layer's, shared with physical memory and USM allocations, so that a device holds at most its
/// capacity in all. CUDA: the driver accounts its own memory; a cuda backend may ignore this.
pub trait DeviceRoom: Send + Sync + std::fmt::Debug {
    /// Number of devices.
    fn devices(&self) -> usize;
    /// Charges `bytes` to device `d` if they fit in what is left; false (nothing charged) if not.
    fn take(&self, d: u32, bytes: u64) -> bool;
    /// Gives back `bytes` charged with [`DeviceRoom::take`].
    fn give_back(&self, d: u32, bytes: u64);
    /// Bytes of device `d` in use (everything, not only managed pages).
    fn used(&self, d: u32) -> u64;
    /// Capacity of device `d` in bytes.
    fn capacity(&self, d: u32) -> u64;
}

/// One side of a device-side copy ([`ManagedResidency::device_copy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceOperand {
    /// The address the application uses.
    pub addr: usize,
    /// Managed memory (the backend makes it resident on the device first); else memory the
    /// driver knows (a USM allocation, an import, an IPC view, mapped virtual memory), used in
    /// place and held live by the caller.
    pub managed: bool,
}

/// A buffer of device work ([`ManagedResidency::prepare`]): `(ptr, len, write)`, any alignment,
/// inside one managed allocation.
pub type WorkBuffer = (usize, usize, bool);

/// Managed residency as a unified-memory driver offers it. Made once per driver by
/// [`crate::backend::Backend::managed`]; every method may be called from any thread.
///
/// Blocking: a method that moves pages waits, inside the backend and with no lock of the
/// caller's held, until device work using them ([`ManagedResidency::prepare`] ..
/// [`ManagedResidency::release`]) has finished, unless the work needs them exactly where they
/// are. Host accesses to such pages wait too.
pub trait ManagedResidency: Send + Sync + std::fmt::Debug {
    /// The host's NUMA nodes, ascending (as [`crate::backend::Backend::numa_nodes`]).
    fn numa_nodes(&self) -> Vec<u32>;

    /// The NUMA node of the calling thread's CPU (as
    /// [`crate::backend::Backend::current_numa_node`]).
    fn current_numa_node(&self) -> u32;

    /// Allocates a managed range of `size` bytes aligned to `align` (both multiples of the
    /// page size) and returns its base: reachable from the host and every device, no page
    /// populated (fresh pages read zero when first touched).
    ///
    /// CUDA: `cuMemAllocManaged(&ptr, size, CU_MEM_ATTACH_GLOBAL)` (the driver aligns to at
    /// least 2 MiB on the architectures that migrate on fault). Host: a host range registered
    /// with the userfaultfd plus a mirror range per device.
    fn allocate(&self, size: usize, align: usize) -> Result<usize>;

    /// Frees a range made by [`ManagedResidency::allocate`], after device work using it has
    /// finished (waited for here); its pages leave every device. The semantics layer has
    /// already waited for the stream work queued on it.
    ///
    /// CUDA: `cuMemFree` (after `cuStreamSynchronize` of the streams holding work on it).
    ///
    /// # Safety
    /// `base` is the base of a live range; no host thread uses the range any more.
    unsafe fn free(&self, base: usize);

    /// Migrates `[ptr, ptr+size)` to `to` (page-aligned), in the caller's stream order (the
    /// semantics layer runs it when the stream reaches it): read-mostly pages get a read-only
    /// copy there, keeping the others; fresh pages are populated there. A prefetch larger than
    /// the device leaves its last pages there.
    ///
    /// Errors: [`ResidencyError::DeviceFull`] with nothing moved if the device cannot take even
    /// one page.
    ///
    /// CUDA: `cuMemPrefetchAsync_v2(ptr, size, location, 0, stream)` (`cuMemPrefetchAsync`
    /// with `CU_DEVICE_CPU` / the ordinal on drivers before 12.2), then `cuStreamSynchronize`
    /// where the caller needs completion.
    fn prefetch(&self, ptr: usize, size: usize, to: Place) -> ResidencyResult<()>;

    /// Applies residency advice to `[ptr, ptr+size)` (page-aligned). Once work using the
    /// range has finished, `check` sees every page's residency before anything moves and may
    /// refuse ([`ResidencyError::Refused`], nothing changed); then the backend decides whether
    /// the device has room (else [`ResidencyError::DeviceFull`], nothing changed), moves pages
    /// and records the policy. Only a platform failure in the middle can leave pages moved (a
    /// `SetReadMostly` takes its read-only copies back).
    ///
    /// CUDA: `cuMemAdvise_v2` (see [`ResidencyAdvice`]); `check` gets the driver's view from
    /// `cuMemRangeGetAttributes`; the eager population as `cuMemPrefetchAsync_v2` +
    /// `cuStreamSynchronize`.
    fn advise(
        &self,
        ptr: usize,
        size: usize,
        advice: ResidencyAdvice,
        check: &mut dyn FnMut(&[PageView]) -> std::result::Result<(), String>,
    ) -> ResidencyResult<()>;

    /// Prepares `buffers` for device work on `device`: every page migrates there (written
    /// buffers exclusively) and stays there, pinned, until [`ManagedResidency::release`];
    /// returns the address through which the device reaches each buffer (contiguous). The
    /// whole working set must fit in the device next to the pages other prepared work holds
    /// ([`ResidencyError::DeviceFull`] otherwise). Host faults on pinned pages wait for the
    /// release.
    ///
    /// CUDA: a check only: the device pointer is the managed pointer and the driver faults
    /// pages in on access. The cuda backend runs no kernels, so the work
    /// ([`crate::managed::Stream::launch`]) is a host function there and the pages it touches
    /// migrate to the host: [`ManagedResidency::release`] records them there.
    fn prepare(&self, device: u32, buffers: &[WorkBuffer]) -> ResidencyResult<Vec<usize>>;

    /// Ends device work prepared with [`ManagedResidency::prepare`] (the same `buffers`): the
    /// pins drop and host faults deferred on them are resolved. CUDA: nothing (the stream
    /// orders the work).
    fn release(&self, buffers: &[WorkBuffer]);

    /// Copies `len` bytes from `src` to `dst` (`memmove` semantics) on device `device`, one
    /// side or both managed: managed pages migrate to the device first (the destination
    /// exclusively); a copy larger than the device goes in page segments.
    ///
    /// CUDA: `cuMemcpyAsync(dst, src, len, stream)` on the stream (the driver migrates), with
    /// `cuStreamSynchronize` where the caller needs completion.
    fn device_copy(
        &self,
        device: u32,
        dst: DeviceOperand,
        src: DeviceOperand,
        len: usize,
    ) -> ResidencyResult<()>;

    /// Sets `len` bytes of managed memory at `ptr` to `value` on device `device` (the pages
    /// migrate there first, exclusively; in page segments).
    ///
    /// CUDA: `cuMemsetD8Async(ptr, value, len, stream)`.
    fn device_fill(&self, device: u32, ptr: usize, value: u8, len: usize) -> ResidencyResult<()>;

    /// Host-synchronous copy of `len` bytes from `src` to `dst` (`memmove` semantics) by the
    /// calling thread: a host access, managed pages migrate to the host (on fault).
    ///
    /// CUDA: `cuMemcpy` (host access of managed memory; the driver migrates on fault), after
    /// the semantics layer's synchronization.
    ///
    /// # Safety
    /// Managed sides lie inside live managed ranges; other sides are mapped process memory with
    /// the access needed; no lock of the caller is held (the access may fault and wait).
    unsafe fn host_copy(&self, dst: usize, src: usize, len: usize);

    /// Host-synchronous fill of `len` bytes at `ptr` (inside a live managed range) with `value`.
    ///
    /// CUDA: `cuMemsetD8` (then `cuCtxSynchronize`).
    ///
    /// # Safety
    /// As [`ManagedResidency::host_copy`].
    unsafe fn host_fill(&self, ptr: usize, value: u8, len: usize);

    /// Reads `out.len()` bytes at `src` from wherever each page lives now, migrating nothing
    /// (never-touched pages read zero). [`ResidencyError::Broken`] if the copies of a
    /// read-mostly page differ.
    ///
    /// CUDA: `cuMemcpy` to a host buffer (the driver may migrate; a debugging aid only).
    fn peek(&self, src: usize, out: &mut [u8]) -> ResidencyResult<()>;

    /// Where the page holding `addr` has copies now; `None` if `addr` is not managed or the
    /// page was never touched. For statistics and tests.
    ///
    /// CUDA: no exact query; `cuMemRangeGetAttribute(CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION)`
    /// on the page and the backend's own record.
    fn residency(&self, addr: usize) -> Option<Residency>;

    /// The counters of the backend's managed memory (allocations, faults, migrations).
    ///
    /// CUDA: the backend's own counters (the driver has none it reports besides profiling).
    fn stats(&self) -> ManagedStats;

    /// Stops host-fault handling and frees every range left (the driver is going away).
    /// Idempotent.
    ///
    /// CUDA: `cuMemFree` of every range left.
    fn shutdown(&self);
}
