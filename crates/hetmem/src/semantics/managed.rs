//! ACL managed (unified) memory: the semantics layer.
//!
//! Spec: `aclrtMemAllocManaged`, `aclrtFree`, `aclrtMemset`, `aclrtMemcpy`,
//! `aclrtMemManagedAdvise`, `aclrtMemManagedPrefetchAsync`, `aclrtMemManagedGetAttr(s)`,
//! `aclrtMemManagedRangeAttribute`, streams (`aclrtCreateStream`, `aclrtSynchronizeStream`,
//! `aclrtDestroyStream`), with the constants and rules of the CANN runtime headers.
//!
//! # The cut
//! This module keeps every ACL rule: argument checks and their order, the error codes, the
//! 2 MiB rounding, the 3 TiB process limit, the advice bookkeeping the eight range attributes
//! are answered from (preferred location, accessed-by list, read-mostly, last prefetch
//! location: hetmem's own record, never the driver's answer, see
//! [`crate::backend::managed`]), the stream ordering, and "a free waits for the stream work
//! queued on the memory" ([`QueuedHold`]). Where pages live, and moving them, is the
//! backend's ([`ManagedResidency`]): on CUDA the driver's unified memory, on the host backend
//! a residency engine over `userfaultfd(2)` (pages, device slots, LRU eviction, pins, host
//! faults, read-mostly copies) that plays the part of a software UVM driver.
//!
//! # Residency (as the backends provide it)
//! - The **managed page** is 2 MiB ([`MANAGED_PAGE_SIZE`]): the unit of allocation rounding,
//!   of advice and prefetch, and of migration (given to the backend when it starts).
//! - A page has no copy until first touched, then lives in one place (read-mostly pages may
//!   have several read-only copies); a host access migrates it to the host, device-side
//!   operations ([`Stream`] copies, fills, prefetches and [`Stream::launch`]ed work) to the
//!   stream's device. A full device evicts its least recently used managed page (pages that
//!   prefer the device last); only a device full of other memory or of pages in use by running
//!   work answers `ACL_ERROR_RT_MEMORY_ALLOCATION` (207001).
//! - **Preferred location / accessed-by** follow ACL's eager semantics (see [`Advice`]).
//! - Host-synchronous [`Context::managed_memset`] / [`Context::managed_memcpy`] /
//!   [`Context::managed_write`] / [`Context::managed_read`] are host accesses (pages migrate to
//!   the host); the stream-ordered forms are device accesses on the stream's device. Either
//!   copy may have one plain side (see [`Context::managed_memcpy`], [`Stream::memcpy_async`]).
//!
//! # Locking
//! One mutex per driver (`state`) guards this module's bookkeeping (allocations, advice,
//! queued holds). It is held only briefly: never while a backend call that may wait runs
//! (advice, prefetch, free, device work, host access), and the backend never takes it, so work
//! running on the device (its pages pinned by the backend) can make managed calls of its own.
//! A call checks its arguments under the lock, drops it for the backend's part, and records
//! its advice under it again once the backend has succeeded.
//!
//! # Errors
//! Every refusal of these calls is an [`Error::Acl`] whose [`AclCode`] the rule chose (read it
//! with [`Error::acl_error`]): null pointers, size 0 and bad flag values are API-layer errors,
//! `ACL_ERROR_INVALID_PARAM` (100000). Out-of-range enumeration values, bad device or NUMA ids,
//! refused advice, a size that is not a multiple of 2 MiB or over 3 TiB, a bad `dataSize` and a
//! range not inside one managed allocation are `ACL_ERROR_RT_PARAM_INVALID` (107000). A pointer
//! that is not 2 MiB-aligned where alignment is required is `ACL_ERROR_RT_ADDR_UNALIGNED`
//! (107008). A platform without userfaultfd is `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000);
//! memory exhaustion `ACL_ERROR_RT_MEMORY_ALLOCATION` (207001). Checks run in
//! that order: pointer, size, range, alignment, enumerations, locations. A failed call changes
//! nothing and leaves later calls working: each call decides every refusal (arguments, advice
//! rules through the backend's `check`, device room in the backend) before a page moves, and
//! records advice only once its pages have moved.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{Condvar, Mutex};

use crate::backend::managed::{
    DeviceRoom, ManagedResidency, PageView, Place, ResidencyAdvice, ResidencyError,
};
pub use crate::backend::managed::{ManagedDeviceStats, ManagedStats, Residency};
use crate::semantics::capacity::DeviceMemory;

use crate::error::{AclCode, Addr, Error, Result};
pub use crate::spec::{location_type, Advice, Location, RangeAttribute, ACL_RT_MEM_ATTACH_GLOBAL};

/// The managed page: allocation rounding, advice / prefetch granularity and migration unit
/// (2 MiB).
pub const MANAGED_PAGE_SIZE: usize = 2 << 20;
/// Most managed memory one process may hold at once (3 TiB).
pub const MAX_MANAGED_PER_PROCESS: u64 = 3 << 40;

/// Managed bytes allocated in this process (all drivers), for the 3 TiB limit.
pub(crate) static PROCESS_MANAGED: AtomicU64 = AtomicU64::new(0);

/// A resolved place: the host (optionally a NUMA node, for the attribute answers) or a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Loc {
    Device(u32),
    Host,
    Numa(u32),
}

impl Loc {
    /// The id the attribute queries give: device id, -1 host, node id.
    pub(crate) fn id(self) -> i32 {
        match self {
            Loc::Device(d) => d as i32,
            Loc::Host => -1,
            Loc::Numa(n) => n as i32,
        }
    }
    pub(crate) fn ty(self) -> u32 {
        match self {
            Loc::Device(_) => location_type::DEVICE,
            Loc::Host => location_type::HOST,
            Loc::Numa(_) => location_type::HOST_NUMA,
        }
    }
    /// The place the backend moves pages to.
    pub(crate) fn place(self) -> Place {
        match self {
            Loc::Device(d) => Place::Device(d),
            Loc::Host => Place::Host,
            Loc::Numa(n) => Place::HostNuma(n),
        }
    }
    /// The `*_ID` answer: only devices and nodes have one.
    pub(crate) fn id_only(self) -> i32 {
        match self {
            Loc::Host => -2,
            other => other.id(),
        }
    }
}

/// The ACL bookkeeping of one managed page: what the range attributes answer.
#[derive(Debug, Clone, Default)]
pub(crate) struct PageAdvice {
    pub(crate) read_mostly: bool,
    pub(crate) preferred: Option<Loc>,
    pub(crate) accessed_by: BTreeSet<Loc>,
    /// The last prefetch requested (recorded when queued, not when run).
    pub(crate) last_prefetch: Option<Loc>,
}

/// One live managed allocation.
#[derive(Debug)]
pub(crate) struct Alloc {
    /// Bytes (a multiple of 2 MiB).
    pub(crate) size: usize,
    /// The context that allocated it.
    pub(crate) ctx: u64,
    pub(crate) pages: Vec<PageAdvice>,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    /// Live allocations by base.
    pub(crate) allocs: BTreeMap<usize, Alloc>,
    /// Stream operations queued and not yet run, per managed allocation (base -> count; no
    /// entry for 0): a free of the allocation waits until its count is 0 ([`QueuedHold`]).
    pub(crate) queued: BTreeMap<usize, usize>,
}

/// One queued stream operation's hold on the managed allocations it references, taken when
/// it is queued (under the state lock, with the range checks) and released when it has run
/// (or is dropped unrun): `Context::free_managed` waits until no hold on its allocation is
/// left, so work queued before a free runs on live memory.
#[derive(Debug)]
pub(crate) struct QueuedHold {
    core: Arc<Core>,
    bases: Vec<usize>,
}

impl QueuedHold {
    /// Holds the allocations containing `addrs` (each inside a live allocation, checked by the
    /// caller under the same hold of `st`; duplicates count once).
    pub(crate) fn take(core: &Arc<Core>, st: &mut State, addrs: &[usize]) -> QueuedHold {
        let mut bases: Vec<usize> = addrs
            .iter()
            .filter_map(|&a| core.find(st, a).map(|(b, _)| b))
            .collect();
        bases.sort_unstable();
        bases.dedup();
        for &b in &bases {
            *st.queued.entry(b).or_insert(0) += 1;
        }
        QueuedHold {
            core: core.clone(),
            bases,
        }
    }
}

impl Drop for QueuedHold {
    fn drop(&mut self) {
        let mut st = self.core.state.lock();
        for b in &self.bases {
            if let Some(n) = st.queued.get_mut(b) {
                *n -= 1;
                if *n == 0 {
                    st.queued.remove(b);
                }
            }
        }
        drop(st);
        self.core.released.notify_all();
    }
}

/// The managed memory of one driver: the ACL bookkeeping and the backend's residency.
#[derive(Debug)]
pub(crate) struct Core {
    /// Where pages live and how they move.
    pub(crate) res: Arc<dyn ManagedResidency>,
    /// Number of devices (the ids a DEVICE location accepts).
    pub(crate) devices: usize,
    pub(crate) state: Mutex<State>,
    /// Signalled (with `state`) whenever a queued stream operation's [`QueuedHold`] is
    /// released.
    pub(crate) released: Condvar,
}

/// Per-driver managed memory: made on the first allocation (the platform check happens then).
#[derive(Debug)]
pub(crate) struct ManagedState {
    pub(crate) devmem: Arc<DeviceMemory>,
    pub(crate) core: OnceLock<std::result::Result<Arc<Core>, String>>,
    pub(crate) init: Mutex<()>,
}

pub(crate) const PAGE: usize = MANAGED_PAGE_SIZE;

/// The semantics layer's device accounting, as the residency backend charges device pages.
impl DeviceRoom for DeviceMemory {
    fn devices(&self) -> usize {
        self.len()
    }
    fn take(&self, d: u32, bytes: u64) -> bool {
        DeviceMemory::take(self, d as usize, bytes).is_ok()
    }
    fn give_back(&self, d: u32, bytes: u64) {
        DeviceMemory::give_back(self, d as usize, bytes)
    }
    fn used(&self, d: u32) -> u64 {
        DeviceMemory::used(self, d as usize)
    }
    fn capacity(&self, d: u32) -> u64 {
        DeviceMemory::capacity(self, d as usize)
    }
}

/// The spec error for a residency failure: the backend says what happened, this layer
/// chooses the code.
pub(crate) fn residency_error(e: ResidencyError) -> Error {
    match e {
        ResidencyError::Platform(h) => h.into(),
        ResidencyError::DeviceFull(m) => Error::Acl(AclCode::RtMemoryAllocation, m),
        ResidencyError::NotManaged(m) | ResidencyError::Refused(m) => {
            Error::Acl(AclCode::RtParamInvalid, m)
        }
        ResidencyError::Broken(m) => Error::Acl(AclCode::RtDrvInternalError, m),
    }
}

impl ManagedState {
    pub(crate) fn new(devmem: Arc<DeviceMemory>) -> ManagedState {
        ManagedState {
            devmem,
            core: OnceLock::new(),
            init: Mutex::new(()),
        }
    }

    pub(crate) fn core(&self, backend: &dyn crate::backend::Backend) -> Result<&Arc<Core>> {
        if self.core.get().is_none() {
            let _g = self.init.lock();
            if self.core.get().is_none() {
                let room: Arc<dyn DeviceRoom> = self.devmem.clone();
                let r = backend.managed(PAGE, room).map(|res| {
                    Arc::new(Core {
                        res,
                        devices: self.devmem.len(),
                        state: Mutex::new(State::default()),
                        released: Condvar::new(),
                    })
                });
                let _ = self.core.set(r);
            }
        }
        match self.core.get() {
            Some(Ok(c)) => Ok(c),
            Some(Err(why)) => Err(Error::Acl(
                AclCode::RtFeatureNotSupport,
                format!("managed memory is not available: {why}"),
            )),
            None => unreachable!("set above"),
        }
    }

    pub(crate) fn existing(&self) -> Option<&Arc<Core>> {
        match self.core.get() {
            Some(Ok(c)) => Some(c),
            _ => None,
        }
    }

    /// `(base, end)` of a managed allocation of this driver (its host range) overlapping
    /// `[start, end)`, if any: memory that is neither system memory nor reserved VA (asked by
    /// imports and IPC range handles). Takes the managed lock: never call with `usm` or `vm`
    /// held.
    pub(crate) fn overlapping(&self, start: usize, end: usize) -> Option<(usize, usize)> {
        let c = self.existing()?;
        let st = c.state.lock();
        let (&b, a) = st.allocs.range(..end).next_back()?;
        (b + a.size > start).then_some((b, b + a.size))
    }

    /// Frees every managed allocation of context `ctx` (context destruction); work running on
    /// them finishes first (the backend waits for it).
    pub(crate) fn release_context(&self, ctx: u64) {
        if let Some(c) = self.existing() {
            let bases: Vec<usize> = {
                let mut st = c.state.lock();
                let bases: Vec<usize> = st
                    .allocs
                    .iter()
                    .filter(|(_, a)| a.ctx == ctx)
                    .map(|(&b, _)| b)
                    .collect();
                for &b in &bases {
                    c.forget(&mut st, b);
                }
                bases
            };
            for b in bases {
                // SAFETY: out of the table: nothing of this layer reaches it any more.
                unsafe { c.res.free(b) };
            }
        }
    }
}

impl Drop for ManagedState {
    fn drop(&mut self) {
        if let Some(Ok(c)) = self.core.take() {
            // The backend stops its fault handling and frees what is left.
            c.res.shutdown();
            let mut st = c.state.lock();
            let bases: Vec<usize> = st.allocs.keys().copied().collect();
            for b in bases {
                c.forget(&mut st, b);
            }
        }
    }
}

impl Core {
    /// `(base, page index)` of the live allocation holding `addr`.
    pub(crate) fn find(&self, st: &State, addr: usize) -> Option<(usize, usize)> {
        let (&base, a) = st.allocs.range(..=addr).next_back()?;
        (addr < base + a.size).then_some((base, (addr - base) / PAGE))
    }

    /// The advice records of the pages of `[ptr, ptr+size)` (inside one live allocation), or
    /// nothing if it went meanwhile.
    pub(crate) fn advice_mut<'a>(
        &self,
        st: &'a mut State,
        ptr: usize,
        size: usize,
    ) -> &'a mut [PageAdvice] {
        let Some((base, i0)) = self.find(st, ptr) else {
            return &mut [];
        };
        let a = st.allocs.get_mut(&base).expect("live");
        let i1 = (i0 + size.div_ceil(PAGE)).min(a.pages.len());
        &mut a.pages[i0..i1]
    }

    /// Allocates `rounded` bytes (checked and rounded by [`check_alloc_args`]) of managed
    /// memory for context `ctx`: the 3 TiB process limit, then the backend's range, then the
    /// record.
    pub(crate) fn allocate(&self, ctx: u64, rounded: u64) -> Result<usize> {
        PROCESS_MANAGED
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(rounded)
                    .filter(|&n| n <= MAX_MANAGED_PER_PROCESS)
            })
            .map_err(|u| {
                Error::Acl(
                    AclCode::RtMemoryAllocation,
                    format!(
                    "the process holds {u:#x} bytes of managed memory; {rounded:#x} more would \
                     pass the 3 TiB limit"
                ),
                )
            })?;
        let base = match self.res.allocate(rounded as usize, PAGE) {
            Ok(b) => b,
            Err(e) => {
                PROCESS_MANAGED.fetch_sub(rounded, Ordering::AcqRel);
                return Err(e.into());
            }
        };
        self.state.lock().allocs.insert(
            base,
            Alloc {
                size: rounded as usize,
                ctx,
                pages: vec![PageAdvice::default(); rounded as usize / PAGE],
            },
        );
        Ok(base)
    }

    /// `aclrtMemManagedAdvise` once the driver has managed memory (see
    /// [`Context::mem_advise`](crate::Context::mem_advise)): the argument checks, the location,
    /// the preferred-location rule (as the backend's `check`), then the backend's part, then
    /// the advice record.
    pub(crate) fn advise(
        &self,
        ptr: usize,
        size: usize,
        advice: Advice,
        location: Location,
    ) -> Result<()> {
        {
            let st = self.state.lock();
            check_advise_args(self, &st, ptr, size)?;
        }
        // The location, then the backend's part: it waits for work using the range, lets the
        // preferred-location rule below refuse, decides device room, and moves pages. Advice
        // is recorded here only once it has succeeded: a refused call changes nothing.
        let (radv, loc) = match advice {
            Advice::SetReadMostly => (ResidencyAdvice::SetReadMostly, None),
            Advice::UnsetReadMostly => {
                let loc = match location {
                    Location::Invalid => Loc::Host,
                    l => self.resolve(l, "UNSET_READ_MOSTLY")?,
                };
                (ResidencyAdvice::UnsetReadMostly(loc.place()), Some(loc))
            }
            Advice::SetPreferredLocation => {
                let loc = self.resolve(location, "SET_PREFERRED_LOCATION")?;
                (
                    ResidencyAdvice::SetPreferredLocation(loc.place()),
                    Some(loc),
                )
            }
            Advice::UnsetPreferredLocation => (ResidencyAdvice::UnsetPreferredLocation, None),
            Advice::SetAccessedBy => {
                let loc = self.resolve(location, "SET_ACCESSED_BY")?;
                (ResidencyAdvice::SetAccessedBy(loc.place()), Some(loc))
            }
            Advice::UnsetAccessedBy => {
                let loc = self.resolve(location, "UNSET_ACCESSED_BY")?;
                (ResidencyAdvice::UnsetAccessedBy(loc.place()), Some(loc))
            }
        };
        // SET_PREFERRED_LOCATION is refused (107000) when a page that is not read-mostly is
        // mapped elsewhere: on a device for the host, on the host or another device for a
        // device. Checked on every page before anything moves.
        let mut check = |pages: &[PageView]| -> std::result::Result<(), String> {
            let Some(loc) = loc.filter(|_| advice == Advice::SetPreferredLocation) else {
                return Ok(());
            };
            for p in pages.iter().filter(|p| !p.read_mostly) {
                match loc {
                    Loc::Host | Loc::Numa(_) => {
                        if let Some(d) = p.device {
                            return Err(format!(
                                "SET_PREFERRED_LOCATION to the host: page {} is mapped on \
                                 device {d}",
                                Addr(p.addr)
                            ));
                        }
                    }
                    Loc::Device(d) => {
                        if p.host {
                            return Err(format!(
                                "SET_PREFERRED_LOCATION to device {d}: page {} is mapped on \
                                 the host",
                                Addr(p.addr)
                            ));
                        }
                        if let Some(e) = p.device.filter(|&e| e != d) {
                            return Err(format!(
                                "SET_PREFERRED_LOCATION to device {d}: page {} is mapped on \
                                 device {e}",
                                Addr(p.addr)
                            ));
                        }
                    }
                }
            }
            Ok(())
        };
        self.res
            .advise(ptr, size, radv, &mut check)
            .map_err(residency_error)?;
        let mut st = self.state.lock();
        for p in self.advice_mut(&mut st, ptr, size) {
            match (advice, loc) {
                (Advice::SetReadMostly, _) => p.read_mostly = true,
                (Advice::UnsetReadMostly, _) => p.read_mostly = false,
                (Advice::SetPreferredLocation, l) => p.preferred = l,
                (Advice::UnsetPreferredLocation, _) => p.preferred = None,
                (Advice::SetAccessedBy, Some(l)) => {
                    p.accessed_by.insert(l);
                }
                (Advice::UnsetAccessedBy, Some(l)) => {
                    p.accessed_by.remove(&l);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// `aclrtFree` of managed memory of context `ctx` (see
    /// [`Context::free_managed`](crate::Context::free_managed)): `ptr` must be the base of a
    /// live allocation of `ctx`; stream work queued on it runs first, then the backend frees
    /// it once work running on it has finished.
    pub(crate) fn free(&self, ctx: u64, ptr: usize) -> Result<()> {
        let mut st = self.state.lock();
        let size = match st.allocs.get(&ptr) {
            Some(a) if a.ctx == ctx => a.size,
            _ => {
                return Err(Error::Acl(
                    AclCode::RtParamInvalid,
                    format!(
                        "{} is not the base of a managed allocation of this context",
                        Addr(ptr)
                    ),
                ))
            }
        };
        // Stream work queued on the allocation runs first (the state lock is released while
        // waiting).
        while st.queued.contains_key(&ptr) {
            self.released.wait(&mut st);
            match st.allocs.get(&ptr) {
                Some(a) if a.ctx == ctx && a.size == size => {}
                _ => {
                    return Err(Error::Acl(
                        AclCode::RtParamInvalid,
                        format!(
                            "{} was freed by another thread while this free waited",
                            Addr(ptr)
                        ),
                    ))
                }
            }
        }
        // Out of the table: no more work can be queued on it. Then the backend frees it, once
        // work running on it has finished (its pages are pinned there).
        self.forget(&mut st, ptr);
        drop(st);
        // SAFETY: `ptr` was the base of a live allocation, now out of the table.
        unsafe { self.res.free(ptr) };
        Ok(())
    }

    /// Takes allocation `base` out of the table (its memory stays until the backend frees it).
    pub(crate) fn forget(&self, st: &mut State, base: usize) {
        if let Some(a) = st.allocs.remove(&base) {
            PROCESS_MANAGED.fetch_sub(a.size as u64, Ordering::AcqRel);
        }
    }

    /// Checks `[ptr, ptr+size)` lies inside one live allocation.
    pub(crate) fn check_range(&self, st: &State, ptr: usize, size: usize) -> Result<()> {
        let end = ptr.checked_add(size).ok_or_else(|| {
            Error::Acl(
                AclCode::RtParamInvalid,
                format!("{} + {size:#x} overflows", Addr(ptr)),
            )
        })?;
        match st.allocs.range(..=ptr).next_back() {
            Some((&b, a)) if ptr < b + a.size && end <= b + a.size => Ok(()),
            Some((&b, a)) if ptr < b + a.size => Err(Error::Acl(
                AclCode::RtParamInvalid,
                format!(
                    "[{}, {}) runs past the end {} of the managed allocation at {}",
                    Addr(ptr),
                    Addr(end),
                    Addr(b + a.size),
                    Addr(b)
                ),
            )),
            _ => Err(Error::Acl(
                AclCode::RtParamInvalid,
                format!("{} is not inside managed memory", Addr(ptr)),
            )),
        }
    }

    pub(crate) fn resolve(&self, loc: Location, what: &str) -> Result<Loc> {
        match loc {
            Location::Invalid => Err(Error::Acl(
                AclCode::RtParamInvalid,
                format!("location type INVALID is not allowed for {what}"),
            )),
            Location::Device(d) => {
                if (d as usize) < self.devices {
                    Ok(Loc::Device(d))
                } else {
                    Err(Error::Acl(
                        AclCode::RtParamInvalid,
                        format!("device id {d} is not a device (there are {})", self.devices),
                    ))
                }
            }
            Location::Host => Ok(Loc::Host),
            Location::HostNuma(n) => {
                let nodes = self.res.numa_nodes();
                if nodes.contains(&n) {
                    Ok(Loc::Numa(n))
                } else {
                    Err(Error::Acl(
                        AclCode::RtParamInvalid,
                        format!("NUMA node {n} does not exist (nodes: {nodes:?})"),
                    ))
                }
            }
            Location::HostNumaCurrent => Ok(Loc::Numa(self.res.current_numa_node())),
        }
    }
}

/// The argument checks of `aclrtMemAllocManaged`, in the spec's order (flag, size 0, size over
/// 3 TiB), and the 2 MiB rounding: the size to allocate.
pub(crate) fn check_alloc_args(size: u64, flag: u32) -> Result<u64> {
    if flag != ACL_RT_MEM_ATTACH_GLOBAL {
        return Err(Error::Acl(
            AclCode::InvalidParam,
            format!("flag {flag:#x} is not ACL_RT_MEM_ATTACH_GLOBAL (0x1)"),
        ));
    }
    if size == 0 {
        return Err(Error::Acl(
            AclCode::InvalidParam,
            "managed allocation of size 0".into(),
        ));
    }
    if size > MAX_MANAGED_PER_PROCESS {
        return Err(Error::Acl(
            AclCode::RtParamInvalid,
            format!("size {size:#x} exceeds the 3 TiB of managed memory a process may allocate"),
        ));
    }
    Ok(size.div_ceil(PAGE as u64) * PAGE as u64)
}

/// Checks `[ptr, ptr+len)` is mapped in this process, readable (and writable if `write`)
/// ([`Backend::query_host_protection`](crate::backend::Backend::query_host_protection)).
///
/// Errors: `AddressNotFound` naming the first byte that is not.
pub(crate) fn check_process_memory(
    backend: &dyn crate::backend::Backend,
    ptr: usize,
    len: usize,
    write: bool,
) -> Result<()> {
    use crate::backend::Protection;
    let ok = |a: usize, n: usize| match backend.query_host_protection(a, n) {
        Some(Protection::ReadWrite) => true,
        Some(Protection::ReadOnly) => !write,
        Some(Protection::None) | None => false,
    };
    let end = ptr + len;
    if len == 0 || ok(ptr, len) {
        return Ok(());
    }
    // The error path only: find the first page that is not.
    let page = backend.host_page_size();
    let mut at = ptr;
    while at < end {
        let next = ((at / page) + 1) * page;
        if !ok(at, next.min(end) - at) {
            break;
        }
        at = next;
    }
    Err(Error::Acl(
        AclCode::RtParamInvalid,
        format!(
            "{} is not {} process memory (in [{}, {}))",
            Addr(at.min(end)),
            if write { "writable" } else { "readable" },
            Addr(ptr),
            Addr(end)
        ),
    ))
}

/// Checks pointer / size / alignment of an advise or prefetch (see the module docs).
pub(crate) fn check_advise_args(core: &Core, st: &State, ptr: usize, size: usize) -> Result<()> {
    if ptr == 0 {
        return Err(Error::Acl(AclCode::InvalidParam, "pointer is null".into()));
    }
    if size == 0 {
        return Err(Error::Acl(AclCode::InvalidParam, "size is 0".into()));
    }
    if size as u64 > MAX_MANAGED_PER_PROCESS || !size.is_multiple_of(PAGE) {
        return Err(Error::Acl(
            AclCode::RtParamInvalid,
            format!("size {size:#x} is not a multiple of 2 MiB in (0, 3 TiB]"),
        ));
    }
    core.check_range(st, ptr, size)?;
    if !ptr.is_multiple_of(PAGE) {
        return Err(Error::Acl(
            AclCode::RtAddrUnaligned,
            format!("pointer {} is not aligned to 2 MiB", Addr(ptr)),
        ));
    }
    Ok(())
}

pub(crate) fn check_data_size(attribute: RangeAttribute, n: usize) -> Result<()> {
    let ok = match attribute {
        RangeAttribute::AccessedBy => n > 0 && n.is_multiple_of(4),
        _ => n == 4,
    };
    if ok {
        Ok(())
    } else {
        Err(Error::Acl(
            AclCode::RtParamInvalid,
            format!(
                "dataSize {n} is not allowed for {attribute:?} ({})",
                if attribute == RangeAttribute::AccessedBy {
                    "a non-zero multiple of 4"
                } else {
                    "must be 4"
                }
            ),
        ))
    }
}

pub(crate) fn get_attr_locked(
    core: &Core,
    st: &State,
    attribute: RangeAttribute,
    ptr: usize,
    size: usize,
    data: &mut [u8],
) -> Result<()> {
    if ptr == 0 {
        return Err(Error::Acl(AclCode::InvalidParam, "pointer is null".into()));
    }
    if size == 0 {
        return Err(Error::Acl(AclCode::InvalidParam, "size is 0".into()));
    }
    if size as u64 > MAX_MANAGED_PER_PROCESS {
        return Err(Error::Acl(
            AclCode::RtParamInvalid,
            format!("size {size:#x} exceeds 3 TiB"),
        ));
    }
    check_data_size(attribute, data.len())?;
    core.check_range(st, ptr, size)?;
    let first = ptr & !(PAGE - 1);
    // The range lies in one allocation (checked): its pages, borrowed, not copied.
    let (base, i0) = core.find(st, first).expect("checked range");
    let i1 = (ptr + size - 1 - base) / PAGE;
    let pages: &[PageAdvice] = &st.allocs[&base].pages[i0..=i1];
    let uniform = |f: &dyn Fn(&PageAdvice) -> Option<Loc>| -> Option<Loc> {
        let v = f(&pages[0])?;
        pages.iter().all(|p| f(p) == Some(v)).then_some(v)
    };
    let put = |data: &mut [u8], v: i32| data[..4].copy_from_slice(&v.to_ne_bytes());
    use RangeAttribute::*;
    match attribute {
        ReadMostly => put(data, pages.iter().all(|p| p.read_mostly) as i32),
        PreferredLocation => put(data, uniform(&|p| p.preferred).map_or(-2, Loc::id)),
        PreferredLocationType => put(
            data,
            uniform(&|p| p.preferred).map_or(location_type::INVALID, Loc::ty) as i32,
        ),
        PreferredLocationId => put(data, uniform(&|p| p.preferred).map_or(-2, Loc::id_only)),
        LastPrefetchLocation => put(data, uniform(&|p| p.last_prefetch).map_or(-2, Loc::id)),
        LastPrefetchLocationType => put(
            data,
            uniform(&|p| p.last_prefetch).map_or(location_type::INVALID, Loc::ty) as i32,
        ),
        LastPrefetchLocationId => put(data, uniform(&|p| p.last_prefetch).map_or(-2, Loc::id_only)),
        AccessedBy => {
            let mut set = pages[0].accessed_by.clone();
            for p in &pages[1..] {
                set = set.intersection(&p.accessed_by).copied().collect();
            }
            let ids: Vec<i32> = set.iter().map(|l| l.id()).collect();
            for (i, c) in data.chunks_mut(4).enumerate() {
                c.copy_from_slice(&ids.get(i).copied().unwrap_or(-2).to_ne_bytes());
            }
        }
    }
    Ok(())
}
