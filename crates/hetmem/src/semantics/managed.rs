//! ACL managed (unified) memory: the semantics layer.
//!
//! Spec: `aclrtMemAllocManaged`, `aclrtFree`, `aclrtMemset`, `aclrtMemcpy`,
//! `aclrtMemManagedAdvise`, `aclrtMemManagedPrefetchAsync`, `aclrtMemManagedGetAttr(s)`,
//! `aclrtMemManagedRangeAttribute`, streams (`aclrtCreateStream`, `aclrtSynchronizeStream`,
//! `aclrtDestroyStream`), with the constants and rules of the CANN runtime headers.
//!
//! # Residency (decided here, once)
//! - The **managed page** is 2 MiB ([`MANAGED_PAGE_SIZE`]): the unit of allocation rounding,
//!   of advice and prefetch, and of migration. One fault moves one whole page.
//! - A page has no copy until first touched (lazy population), then lives in **one place**:
//!   the host or one device. Host-resident pages are mapped in the managed range; every other
//!   page is absent there, so a host access faults and the fault thread migrates the page to
//!   the host before the access proceeds. Device-side operations ([`Stream`] copies, fills,
//!   prefetches and [`Stream::launch`]ed work) first migrate the pages they touch to the
//!   stream's device.
//! - **Read-mostly** pages may have several copies, all read-only: a read where there is no
//!   copy adds one (host: a write-protected page); a write anywhere first drops every other
//!   copy and makes the written copy the only, writable one.
//! - **Oversubscription**: a device holds at most its capacity (shared with physical memory and
//!   USM allocations). Migrating a page to a full device first evicts that device's least
//!   recently used managed page (pages that prefer the device go last) to the host. Only if
//!   nothing of the device can be evicted does the operation fail with `OutOfDeviceMemory`
//!   (207001).
//! - **Preferred location / accessed-by** follow ACL's eager semantics (see [`Advice`]).
//! - Host-synchronous [`Context::managed_memset`] / [`Context::managed_memcpy`] /
//!   [`Context::managed_write`] / [`Context::managed_read`] are host accesses (pages migrate to
//!   the host); the stream-ordered forms are device accesses on the stream's device. Either
//!   copy may have one plain side (see [`Context::managed_memcpy`], [`Stream::memcpy_async`]).
//!
//! # Locking and pinning
//! One mutex per driver (`state`) guards every residency decision and migration; it is never
//! held while device work or a device copy / fill runs. Such work first migrates its pages
//! under the lock, then **pins** them (a count per page) and drops the lock for the work; the
//! pins drop, under the lock, when it is done. A pinned page's copies never change:
//! - eviction skips it (a device full of pinned pages answers `OutOfDeviceMemory`);
//! - a host fault on it is *deferred*: the fault thread records it and goes on with other
//!   faults; the faulting thread stays blocked until the last pin drops, when the unpinning
//!   thread resolves it (so nothing waits for the fault thread);
//! - prefetches, advice, frees (and context teardown) and device operations that would change
//!   it wait on a condition variable (lock released) for the pins to drop; device work that
//!   needs it exactly where it is (same device, nothing to move) runs alongside.
//!
//! Lock order: `state` -> the in-flight table of [`crate::queue`] (taken by nothing here while
//! `state` is held except through a free). Nothing waits for pins while holding any other
//! lock, and work never runs with `state` held, so the only cycle left is one the caller
//! builds: work that waits for a thread that itself waits for that work's pages.
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
//! rules, device room) before it moves a page, and records advice only once its pages have
//! moved.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::backend::managed::{Fault, FaultSink, FaultThread, ManagedOps, ManagedRange};
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
    pub(crate) fn device(self) -> Option<u32> {
        match self {
            Loc::Device(d) => Some(d),
            _ => None,
        }
    }
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
    /// The `*_ID` answer: only devices and nodes have one.
    pub(crate) fn id_only(self) -> i32 {
        match self {
            Loc::Host => -2,
            other => other.id(),
        }
    }
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

/// Counters of a driver's managed memory ([`Driver::managed_stats`]).
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
    /// Per device, in ordinal order.
    pub devices: Vec<ManagedDeviceStats>,
}

#[derive(Debug, Clone)]
pub(crate) struct Page {
    /// Present in the host range.
    pub(crate) host: bool,
    /// Present but write-protected (a read-mostly copy).
    pub(crate) host_ro: bool,
    /// Slot per device holding a copy.
    pub(crate) slots: Vec<Option<u32>>,
    /// Slot per device still mapped at this page's mirror but not holding its copy any more
    /// (reused as is if the page comes back, taken by another page when the device needs it).
    pub(crate) cached: Vec<Option<u32>>,
    pub(crate) read_mostly: bool,
    pub(crate) preferred: Option<Loc>,
    pub(crate) accessed_by: BTreeSet<Loc>,
    pub(crate) last_prefetch: Option<Loc>,
    /// LRU tick per device.
    pub(crate) tick: Vec<u64>,
    /// Device-side operations using the page right now (launched work, a copy or fill segment)
    /// with the lock dropped: while non-zero the page's residency may not change (see
    /// "Pinning" in the module docs).
    pub(crate) pins: u32,
}

impl Page {
    pub(crate) fn new(devices: usize) -> Page {
        Page {
            host: false,
            host_ro: false,
            slots: vec![None; devices],
            cached: vec![None; devices],
            read_mostly: false,
            preferred: None,
            accessed_by: BTreeSet::new(),
            last_prefetch: None,
            tick: vec![0; devices],
            pins: 0,
        }
    }
    pub(crate) fn on_device(&self) -> Option<u32> {
        self.slots
            .iter()
            .position(|s| s.is_some())
            .map(|d| d as u32)
    }
    pub(crate) fn copies(&self) -> usize {
        self.host as usize + self.slots.iter().filter(|s| s.is_some()).count()
    }
    /// Whether [`Core::ensure_device`]`(d, write)` would leave the copies as they are (the
    /// page is already usable there): the only change allowed on a pinned page.
    pub(crate) fn ready_on(&self, d: u32, write: bool) -> bool {
        if self.slots[d as usize].is_none() {
            return false;
        }
        let exclusive = write || !self.read_mostly;
        !exclusive || self.copies() == 1
    }
}

#[derive(Debug)]
pub(crate) struct Alloc {
    pub(crate) range: ManagedRange,
    pub(crate) ctx: u64,
    pub(crate) pages: Vec<Page>,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) allocs: BTreeMap<usize, Alloc>,
    /// Per device: (tick, page address) of resident pages, oldest first.
    pub(crate) lru: Vec<BTreeSet<(u64, usize)>>,
    pub(crate) free_slots: Vec<Vec<u32>>,
    pub(crate) next_slot: Vec<u32>,
    /// Per device: cached slots (slot -> page address), see [`Page::cached`].
    pub(crate) cached: Vec<BTreeMap<u32, usize>>,
    pub(crate) tick: u64,
    pub(crate) stats: ManagedStats,
    /// Host faults on pinned pages, waiting for the pin to drop: page -> a write was seen.
    pub(crate) deferred: BTreeMap<usize, bool>,
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
        self.core.unpinned.notify_all();
    }
}

/// The managed-memory core of one driver: state, the platform's operations and the fault sink.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) ops: Arc<dyn ManagedOps>,
    pub(crate) devmem: Arc<DeviceMemory>,
    pub(crate) state: Mutex<State>,
    /// Signalled (with `state`) whenever a page's pin count drops or a queued stream
    /// operation's [`QueuedHold`] is released.
    pub(crate) unpinned: Condvar,
}

/// Per-driver managed memory: made on the first allocation (the platform check happens then).
#[derive(Debug)]
pub(crate) struct ManagedState {
    pub(crate) devmem: Arc<DeviceMemory>,
    pub(crate) core: OnceLock<std::result::Result<Started, String>>,
    pub(crate) init: Mutex<()>,
}

/// The core and the fault thread that feeds it (stopped first on drop).
pub(crate) type Started = (Arc<Core>, Box<dyn FaultThread>);

pub(crate) const PAGE: usize = MANAGED_PAGE_SIZE;

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
                let r = backend.managed().and_then(|ops| {
                    let n = self.devmem.len();
                    let core = Arc::new(Core {
                        ops: ops.clone(),
                        devmem: self.devmem.clone(),
                        unpinned: Condvar::new(),
                        state: Mutex::new(State {
                            lru: vec![BTreeSet::new(); n],
                            free_slots: vec![Vec::new(); n],
                            next_slot: vec![0; n],
                            cached: vec![BTreeMap::new(); n],
                            stats: ManagedStats {
                                devices: vec![ManagedDeviceStats::default(); n],
                                ..Default::default()
                            },
                            ..Default::default()
                        }),
                    });
                    let t = ops
                        .start_fault_thread(core.clone())
                        .map_err(|e| e.to_string())?;
                    Ok((core, t))
                });
                let _ = self.core.set(r);
            }
        }
        match self.core.get() {
            Some(Ok((c, _))) => Ok(c),
            Some(Err(why)) => Err(Error::Acl(
                AclCode::RtFeatureNotSupport,
                format!("managed memory is not available: {why}"),
            )),
            None => unreachable!("set above"),
        }
    }

    pub(crate) fn existing(&self) -> Option<&Arc<Core>> {
        match self.core.get() {
            Some(Ok((c, _))) => Some(c),
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
        (b + a.range.size > start).then_some((b, b + a.range.size))
    }

    /// Frees every managed allocation of context `ctx` (context destruction).
    pub(crate) fn release_context(&self, ctx: u64) {
        if let Some(c) = self.existing() {
            let mut st = c.state.lock();
            let bases: Vec<(usize, usize)> = st
                .allocs
                .iter()
                .filter(|(_, a)| a.ctx == ctx)
                .map(|(&b, a)| (b, a.range.size))
                .collect();
            for (b, size) in bases {
                // Work running on it finishes first; gone meanwhile: nothing to do.
                if c.wait_pins(&mut st, &[(b, size, None, false)]).is_ok() {
                    c.free_locked(&mut st, b);
                }
            }
        }
    }
}

impl Drop for ManagedState {
    fn drop(&mut self) {
        if let Some(Ok((c, t))) = self.core.take() {
            // Stop the fault thread first (it holds the core), then free what is left.
            drop(t);
            let mut st = c.state.lock();
            let bases: Vec<usize> = st.allocs.keys().copied().collect();
            for b in bases {
                c.free_locked(&mut st, b);
            }
        }
    }
}

impl FaultSink for Core {
    fn fault(&self, f: Fault) {
        let mut st = self.state.lock();
        st.stats.fault_events += 1;
        let page = f.addr & !(PAGE - 1);
        if self.find(&st, page).is_none() {
            drop(st);
            // Freed meanwhile: let the thread retry (it then faults on unmapped memory).
            self.ops.host_wake(page, PAGE);
            return;
        }
        let write = f.write || f.write_protect;
        if self.page_ref(&st, page).pins > 0 {
            // Device work uses the page: the faulting thread stays blocked until the last pin
            // drops ([`Core::unpin`] resolves it then); this thread goes on with other faults.
            *st.deferred.entry(page).or_insert(false) |= write;
            return;
        }
        self.resolve_fault(&mut st, page, write);
    }
}

/// One operand of a device-side operation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DevOperand {
    pub(crate) addr: usize,
    pub(crate) write: bool,
    /// Managed memory (migrated to the device); else memory the driver knows (a USM
    /// allocation, an import, an IPC view, mapped virtual memory), used in place and held in
    /// flight by the caller.
    pub(crate) managed: bool,
}

impl Core {
    /// Makes `page` accessible on the host for a faulting thread (and wakes it).
    pub(crate) fn resolve_fault(&self, st: &mut State, page: usize, write: bool) {
        match self.ensure_host(st, page, write) {
            Ok(true) => st.stats.host_faults += 1,
            Ok(false) => self.ops.host_wake(page, PAGE),
            Err(e) => {
                tracing::error!("managed fault at {page:#x} could not be resolved: {e}");
                self.ops.host_wake(page, PAGE);
            }
        }
    }

    /// Pins `pages` (one count each; duplicates count twice): their residency stays as it is
    /// until [`Core::unpin`].
    pub(crate) fn pin(&self, st: &mut State, pages: &[usize]) {
        for &a in pages {
            self.page_mut(st, a).pins += 1;
        }
    }

    /// Drops one pin of each of `pages`; host faults deferred on a page whose last pin this
    /// was are resolved now; waiters for pins are woken.
    pub(crate) fn unpin(&self, st: &mut State, pages: &[usize]) {
        for &a in pages {
            if self.find(st, a).is_none() {
                continue; // never expected: a free waits for pins
            }
            let p = self.page_mut(st, a);
            p.pins -= 1;
            if p.pins == 0 {
                if let Some(write) = st.deferred.remove(&a) {
                    self.resolve_fault(st, a, write);
                }
            }
        }
        self.unpinned.notify_all();
    }

    /// Waits (the lock released meanwhile) until every page of every `ranges` entry
    /// (`(ptr, len, device, write)`) is unpinned, or pinned but already usable as the caller
    /// needs (`device`: [`Page::ready_on`]; `None`: any pin blocks). Checks the ranges are
    /// live managed memory each time round.
    pub(crate) fn wait_pins(
        &self,
        st: &mut MutexGuard<'_, State>,
        ranges: &[(usize, usize, Option<u32>, bool)],
    ) -> Result<()> {
        loop {
            for &(p, l, _, _) in ranges {
                self.check_range(st, p, l)?;
            }
            let busy = ranges.iter().any(|&(p, l, d, w)| {
                pages_of(p, l).any(|a| {
                    let pg = self.page_ref(st, a);
                    pg.pins > 0 && !d.is_some_and(|d| pg.ready_on(d, w))
                })
            });
            if !busy {
                return Ok(());
            }
            self.unpinned.wait(st);
        }
    }

    pub(crate) fn page_ref<'a>(&self, st: &'a State, addr: usize) -> &'a Page {
        let (base, i) = self.find(st, addr).expect("page of a live allocation");
        &st.allocs[&base].pages[i]
    }

    pub(crate) fn find(&self, st: &State, addr: usize) -> Option<(usize, usize)> {
        let (&base, a) = st.allocs.range(..=addr).next_back()?;
        (addr < base + a.range.size).then_some((base, (addr - base) / PAGE))
    }

    pub(crate) fn page_mut<'a>(&self, st: &'a mut State, addr: usize) -> &'a mut Page {
        let (base, i) = self.find(st, addr).expect("page of a live allocation");
        &mut st.allocs.get_mut(&base).expect("live").pages[i]
    }

    pub(crate) fn page(&self, st: &State, addr: usize) -> Page {
        let (base, i) = self.find(st, addr).expect("page of a live allocation");
        st.allocs[&base].pages[i].clone()
    }

    pub(crate) fn mirror(&self, st: &State, addr: usize, d: u32) -> usize {
        let (base, _) = self.find(st, addr).expect("live");
        st.allocs[&base].range.mirrors[d as usize] + (addr - base)
    }

    pub(crate) fn touch(&self, st: &mut State, addr: usize, d: u32) {
        st.tick += 1;
        let t = st.tick;
        let p = self.page_mut(st, addr);
        let old = std::mem::replace(&mut p.tick[d as usize], t);
        st.lru[d as usize].remove(&(old, addr));
        st.lru[d as usize].insert((t, addr));
    }

    /// Drops device `d`'s copy of `addr`: its capacity comes back at once; the slot stays
    /// mapped at the page's mirror as a cached slot ([`Page::cached`]).
    pub(crate) fn drop_device_copy(&self, st: &mut State, addr: usize, d: u32) {
        let p = self.page_mut(st, addr);
        let Some(slot) = p.slots[d as usize].take() else {
            return;
        };
        p.cached[d as usize] = Some(slot);
        let t = p.tick[d as usize];
        st.cached[d as usize].insert(slot, addr);
        st.lru[d as usize].remove(&(t, addr));
        self.devmem.give_back(d as usize, PAGE as u64);
        st.stats.devices[d as usize].resident_pages -= 1;
    }

    /// Unmaps `addr`'s cached slot on `d`, if any, and makes it free.
    pub(crate) fn uncache(&self, st: &mut State, addr: usize, d: u32) {
        let m = self.mirror(st, addr, d);
        if let Some(slot) = self.page_mut(st, addr).cached[d as usize].take() {
            st.cached[d as usize].remove(&slot);
            // SAFETY: the slot is mapped at the mirror page and holds no live copy.
            unsafe { self.ops.device_unmap(d, m, PAGE) };
            st.free_slots[d as usize].push(slot);
        }
    }

    pub(crate) fn drop_host_copy(&self, st: &mut State, addr: usize) -> Result<()> {
        let p = self.page_mut(st, addr);
        if p.host {
            // SAFETY: the page is present; another copy holds its bytes (caller).
            unsafe { self.ops.host_drop(addr, PAGE)? };
            let p = self.page_mut(st, addr);
            p.host = false;
            p.host_ro = false;
            st.stats.host_resident_pages -= 1;
        }
        Ok(())
    }

    /// A slot on device `d` for page `addr`, evicting the device's least recently used page
    /// (not in `keep`) if it is full. Returns the slot and whether it is already mapped at the
    /// page's mirror (the page's own cached slot).
    pub(crate) fn take_slot(
        &self,
        st: &mut State,
        addr: usize,
        d: u32,
        keep: &[usize],
    ) -> Result<(u32, bool)> {
        let di = d as usize;
        loop {
            if self.devmem.take(di, PAGE as u64).is_ok() {
                if let Some(s) = self.page_mut(st, addr).cached[di].take() {
                    st.cached[di].remove(&s);
                    return Ok((s, true));
                }
                if let Some(s) = st.free_slots[di].pop() {
                    return Ok((s, false));
                }
                if (st.next_slot[di] as u64 + 1) * PAGE as u64 <= self.devmem.capacity(di) {
                    st.next_slot[di] += 1;
                    return Ok((st.next_slot[di] - 1, false));
                }
                // Every slot is in use or cached: take a cached one from its page.
                let owner = st.cached[di].first_key_value().map(|(_, &a)| a);
                let Some(owner) = owner else {
                    self.devmem.give_back(di, PAGE as u64);
                    return Err(Error::Acl(
                        AclCode::RtMemoryAllocation,
                        format!("device {d} has no managed memory slot left"),
                    ));
                };
                self.uncache(st, owner, d);
                let s = st.free_slots[di].pop().expect("just freed");
                return Ok((s, false));
            }
            // Evict: least recently used, pages preferring `d` last; never a pinned page (work
            // is using it).
            let pick = |prefer_skip: bool, st: &State| {
                st.lru[d as usize].iter().map(|&(_, a)| a).find(|&a| {
                    if keep.contains(&a) {
                        return false;
                    }
                    let p = self.page_ref(st, a);
                    p.pins == 0 && (!prefer_skip || p.preferred != Some(Loc::Device(d)))
                })
            };
            let victim = pick(true, st).or_else(|| pick(false, st));
            let Some(v) = victim else {
                return Err(Error::Acl(
                    AclCode::RtMemoryAllocation,
                    format!(
                        "device {d} is full ({:#x} of {:#x} bytes used) and holds no managed page \
                     that can be evicted (pages in use by running work stay)",
                        self.devmem.used(d as usize),
                        self.devmem.capacity(d as usize)
                    ),
                ));
            };
            let p = self.page(st, v);
            if p.copies() == 1 {
                // The only copy: move it to the host.
                self.install_host_from(st, v, Some(d), false)?;
                st.stats.devices[d as usize].evictions += 1;
            }
            self.drop_device_copy(st, v, d);
        }
    }

    /// Installs a host copy of absent page `addr` from device `from` (zeros if `None`).
    pub(crate) fn install_host_from(
        &self,
        st: &mut State,
        addr: usize,
        from: Option<u32>,
        read_only: bool,
    ) -> Result<()> {
        let src = from.map(|d| self.mirror(st, addr, d));
        // SAFETY: the page is absent on the host (caller); the source mirror page is mapped.
        unsafe { self.ops.host_install(addr, src, PAGE, read_only)? };
        self.note_host_install(st, addr, from, read_only);
        Ok(())
    }

    /// Bookkeeping of a host copy of `addr` installed from device `from` (zeros if `None`).
    pub(crate) fn note_host_install(
        &self,
        st: &mut State,
        addr: usize,
        from: Option<u32>,
        read_only: bool,
    ) {
        if let Some(d) = from {
            st.stats.pages_to_host += 1;
            st.stats.bytes_to_host += PAGE as u64;
            st.stats.devices[d as usize].pages_from_device += 1;
            st.stats.devices[d as usize].bytes_from_device += PAGE as u64;
        }
        st.stats.host_resident_pages += 1;
        let p = self.page_mut(st, addr);
        p.host = true;
        p.host_ro = read_only;
    }

    /// Prefetch of `[ptr, ptr+size)` to device `d`, with the same decisions, in the same order,
    /// as [`Core::ensure_device`] page by page; pages that only move (writable on the host, no
    /// other copy) have their bookkeeping done at once and their bytes moved in batches, so the
    /// platform can overlap page-table updates with copies. A batch is flushed before any
    /// eviction (a victim is never a page whose bytes have not arrived) and at the end. Fails
    /// with nothing moved if `d` cannot take a single page ([`Core::check_room_one_by_one`]).
    pub(crate) fn prefetch_to_device(
        &self,
        st: &mut State,
        ptr: usize,
        size: usize,
        d: u32,
    ) -> Result<()> {
        let di = d as usize;
        // A device that cannot take even one page fails the prefetch before anything moves.
        let pages: Vec<usize> = (ptr..ptr + size).step_by(PAGE).collect();
        self.check_room_one_by_one(st, d, &pages, "a prefetch")?;
        let mut pending: Vec<(usize, usize)> = Vec::new();
        let flush = |pending: &mut Vec<(usize, usize)>| -> Result<()> {
            // SAFETY: every pending page is present on the host and its mirror page is mapped.
            let r = unsafe { self.ops.host_evict_batch(pending, PAGE) };
            pending.clear();
            r.map_err(Error::from)
        };
        for a in (ptr..ptr + size).step_by(PAGE) {
            let p = self.page(st, a);
            let movable = p.host && !p.host_ro && !p.read_mostly && p.on_device().is_none();
            if !movable {
                flush(&mut pending)?;
                self.ensure_device(st, a, d, false, &[a])?;
                continue;
            }
            if self.devmem.used(di) + PAGE as u64 > self.devmem.capacity(di) {
                flush(&mut pending)?; // an eviction may follow
            }
            let mut keep: Vec<usize> = pending.iter().map(|&(x, _)| x).collect();
            keep.push(a);
            let (slot, mapped) = match self.take_slot(st, a, d, &keep) {
                Ok(x) => x,
                Err(_) if !pending.is_empty() => {
                    flush(&mut pending)?;
                    self.take_slot(st, a, d, &[a])?
                }
                Err(e) => return Err(e),
            };
            let m = self.mirror(st, a, d);
            if !mapped {
                // SAFETY: the mirror page is unmapped and the slot free.
                if let Err(e) = unsafe { self.ops.device_map(d, m, slot, PAGE) } {
                    st.free_slots[di].push(slot);
                    self.devmem.give_back(di, PAGE as u64);
                    flush(&mut pending)?;
                    return Err(e.into());
                }
            }
            let pg = self.page_mut(st, a);
            pg.host = false;
            pg.host_ro = false;
            pg.slots[di] = Some(slot);
            st.stats.host_resident_pages -= 1;
            st.stats.devices[di].resident_pages += 1;
            st.stats.pages_from_host += 1;
            st.stats.bytes_from_host += PAGE as u64;
            st.stats.devices[di].pages_to_device += 1;
            st.stats.devices[di].bytes_to_device += PAGE as u64;
            self.touch(st, a, d);
            pending.push((a, m));
        }
        flush(&mut pending)
    }

    /// Prefetch of `[ptr, ptr+size)` to the host: pages that only move (not read-mostly, on one
    /// device) go in one batch, so the platform can overlap their copies with the page-table
    /// updates; the others one by one.
    pub(crate) fn prefetch_to_host(&self, st: &mut State, ptr: usize, size: usize) -> Result<()> {
        let mut batch: Vec<(usize, usize, u32)> = Vec::new();
        for a in (ptr..ptr + size).step_by(PAGE) {
            let p = self.page(st, a);
            if !p.host && !p.read_mostly {
                if let Some(d) = p.on_device() {
                    batch.push((a, self.mirror(st, a, d), d));
                    continue;
                }
            }
            self.ensure_host(st, a, false)?;
        }
        let pairs: Vec<(usize, usize)> = batch.iter().map(|&(a, m, _)| (a, m)).collect();
        // SAFETY: every page is absent on the host and its source mirror page is mapped.
        if let Err(e) = unsafe { self.ops.host_install_batch(&pairs, PAGE) } {
            // Some pages may be mapped already: take them back (the device keeps the bytes).
            for &(a, _, _) in &batch {
                // SAFETY: our own pages; their bytes stay on the device.
                unsafe { self.ops.host_drop(a, PAGE).ok() };
            }
            return Err(e.into());
        }
        for (a, _, d) in batch {
            self.note_host_install(st, a, Some(d), false);
            self.drop_device_copy(st, a, d);
        }
        Ok(())
    }

    /// Makes `addr`'s page accessible on the host for reading (and writing if `write`).
    /// Returns whether anything changed.
    pub(crate) fn ensure_host(&self, st: &mut State, addr: usize, write: bool) -> Result<bool> {
        let p = self.page(st, addr);
        let exclusive = write || !p.read_mostly;
        if p.host {
            if write && p.host_ro {
                for d in 0..p.slots.len() as u32 {
                    self.drop_device_copy(st, addr, d);
                }
                // SAFETY: present page of ours; unprotecting wakes the writers.
                unsafe { self.ops.host_protect(addr, PAGE, false)? };
                self.page_mut(st, addr).host_ro = false;
                return Ok(true);
            }
            return Ok(false);
        }
        let from = p.on_device();
        self.install_host_from(st, addr, from, !exclusive)?;
        if exclusive {
            for d in 0..p.slots.len() as u32 {
                self.drop_device_copy(st, addr, d);
            }
        }
        Ok(true)
    }

    /// Makes `addr`'s page resident on device `d` (read, or write if `write`), keeping the
    /// pages in `keep` from eviction. Returns whether anything changed.
    pub(crate) fn ensure_device(
        &self,
        st: &mut State,
        addr: usize,
        d: u32,
        write: bool,
        keep: &[usize],
    ) -> Result<bool> {
        let p = self.page(st, addr);
        let exclusive = write || !p.read_mostly;
        let mut changed = false;
        if p.slots[d as usize].is_none() {
            let (slot, mapped) = self.take_slot(st, addr, d, keep)?;
            let m = self.mirror(st, addr, d);
            if !mapped {
                // SAFETY: the mirror page is unmapped (no copy or cached slot on d) and the
                // slot is free.
                if let Err(e) = unsafe { self.ops.device_map(d, m, slot, PAGE) } {
                    st.free_slots[d as usize].push(slot);
                    self.devmem.give_back(d as usize, PAGE as u64);
                    return Err(e.into());
                }
            }
            // The page may have changed while making room (an eviction never touches `keep`,
            // and `addr` is in `keep`), so re-read it.
            let p = self.page(st, addr);
            if p.host {
                if exclusive {
                    // The host copy goes first (host accesses fault and wait for the lock),
                    // then its bytes move: no host write can land after the copy.
                    // SAFETY: present page of ours; the mirror page is mapped.
                    unsafe { self.ops.host_evict_to(addr, m, PAGE)? };
                    let pg = self.page_mut(st, addr);
                    pg.host = false;
                    pg.host_ro = false;
                    st.stats.host_resident_pages -= 1;
                } else {
                    if !p.host_ro {
                        // A read-mostly page keeps its host copy read-only from now on.
                        // SAFETY: present page of ours.
                        unsafe { self.ops.host_protect(addr, PAGE, true)? };
                        self.page_mut(st, addr).host_ro = true;
                    }
                    // SAFETY: both pages are present; the host page cannot change (protected).
                    unsafe { self.ops.copy(m, addr, PAGE) };
                }
                st.stats.pages_from_host += 1;
                st.stats.bytes_from_host += PAGE as u64;
                st.stats.devices[d as usize].pages_to_device += 1;
                st.stats.devices[d as usize].bytes_to_device += PAGE as u64;
            } else if let Some(e) = p.on_device() {
                let src = self.mirror(st, addr, e);
                // SAFETY: both mirror pages are mapped.
                unsafe { self.ops.copy(m, src, PAGE) };
                st.stats.devices[e as usize].pages_from_device += 1;
                st.stats.devices[e as usize].bytes_from_device += PAGE as u64;
                st.stats.devices[d as usize].pages_to_device += 1;
                st.stats.devices[d as usize].bytes_to_device += PAGE as u64;
            } else {
                // A fresh page: a reused slot holds an earlier page's bytes.
                // SAFETY: the mirror page was just mapped.
                unsafe { self.ops.zero(m, PAGE) };
            }
            self.page_mut(st, addr).slots[d as usize] = Some(slot);
            st.stats.devices[d as usize].resident_pages += 1;
            changed = true;
        }
        if exclusive {
            let p = self.page(st, addr);
            if p.host {
                self.drop_host_copy(st, addr)?;
                changed = true;
            }
            for e in 0..p.slots.len() as u32 {
                if e != d && p.slots[e as usize].is_some() {
                    self.drop_device_copy(st, addr, e);
                    changed = true;
                }
            }
        }
        self.touch(st, addr, d);
        Ok(changed)
    }

    /// Pages device `d` can take now, one after the other, without failing: its free capacity
    /// plus the managed pages [`Core::take_slot`] may evict (unpinned, outside `keep`).
    pub(crate) fn room_pages(&self, st: &State, d: u32, keep: std::ops::Range<usize>) -> u64 {
        let di = d as usize;
        let free = self
            .devmem
            .capacity(di)
            .saturating_sub(self.devmem.used(di))
            / PAGE as u64;
        let evictable = st.lru[di]
            .iter()
            .filter(|&&(_, a)| !keep.contains(&a) && self.page_ref(st, a).pins == 0)
            .count() as u64;
        free + evictable
    }

    /// Before an operation that brings `pages` to device `d` one at a time (each keeping only
    /// itself from eviction, as a prefetch does): fails, with nothing changed, if one of them
    /// would need a slot that `d` cannot give. Once one page has a slot, every later page can
    /// evict it (or another unpinned page), so room for one is room for all.
    ///
    /// Errors: `ACL_ERROR_RT_MEMORY_ALLOCATION` (207001) naming `what`, the device and its use.
    pub(crate) fn check_room_one_by_one(
        &self,
        st: &State,
        d: u32,
        pages: &[usize],
        what: &str,
    ) -> Result<()> {
        let need = pages
            .iter()
            .any(|&a| self.page_ref(st, a).slots[d as usize].is_none());
        if need && self.room_pages(st, d, 0..0) == 0 {
            return Err(Error::Acl(
                AclCode::RtMemoryAllocation,
                format!(
                "{what} to device {d}: the device is full ({:#x} of {:#x} bytes used) and holds \
                 no managed page that can be evicted",
                self.devmem.used(d as usize),
                self.devmem.capacity(d as usize)
            ),
            ));
        }
        Ok(())
    }

    /// Takes back the read-only host copies a failed `SET_READ_MOSTLY` made: `(page, true)`
    /// was installed (dropped again; another copy holds its bytes), `(page, false)` was only
    /// write-protected (made writable again). The caller restores the counters.
    pub(crate) fn undo_read_only_copies(&self, st: &mut State, done: &[(usize, bool)]) {
        for &(a, installed) in done {
            // SAFETY: present pages of ours; an installed copy duplicates a device copy.
            let r = unsafe {
                if installed {
                    self.ops.host_drop(a, PAGE)
                } else {
                    self.ops.host_protect(a, PAGE, false)
                }
            };
            if let Err(e) = r {
                tracing::error!("undoing SET_READ_MOSTLY at {a:#x}: {e}");
                continue;
            }
            let p = self.page_mut(st, a);
            p.host_ro = false;
            if installed {
                p.host = false;
            }
        }
    }

    /// Moves or copies `addr`'s page to `loc` as a prefetch / advice does.
    pub(crate) fn ensure_at(
        &self,
        st: &mut State,
        addr: usize,
        loc: Loc,
        write: bool,
    ) -> Result<()> {
        match loc {
            Loc::Device(d) => self.ensure_device(st, addr, d, write, &[addr]).map(|_| ()),
            Loc::Host | Loc::Numa(_) => self.ensure_host(st, addr, write).map(|_| ()),
        }
    }

    /// Gives the memory of every free slot back to the platform (after a free: the device
    /// holds only what live pages use).
    pub(crate) fn discard_free_slots(&self, st: &mut State) {
        for (d, slots) in st.free_slots.iter().enumerate() {
            for &s in slots {
                self.ops.device_discard(d as u32, s, PAGE);
            }
        }
    }

    pub(crate) fn free_locked(&self, st: &mut State, base: usize) {
        let Some(a) = st.allocs.get(&base) else {
            return;
        };
        let n = a.pages.len();
        let devices = st.lru.len() as u32;
        for i in 0..n {
            let addr = base + i * PAGE;
            for d in 0..devices {
                self.drop_device_copy(st, addr, d);
                self.uncache(st, addr, d);
            }
            let p = self.page_mut(st, addr);
            if p.host {
                p.host = false;
                st.stats.host_resident_pages -= 1;
            }
        }
        let a = st.allocs.remove(&base).expect("live");
        st.stats.allocations -= 1;
        st.stats.bytes -= a.range.size as u64;
        PROCESS_MANAGED.fetch_sub(a.range.size as u64, Ordering::AcqRel);
        // SAFETY: the allocation is out of the table; no copy is mapped on any mirror.
        unsafe { self.ops.release(&a.range) };
        self.discard_free_slots(st);
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
            Some((&b, a)) if ptr < b + a.range.size && end <= b + a.range.size => Ok(()),
            Some((&b, a)) if ptr < b + a.range.size => Err(Error::Acl(
                AclCode::RtParamInvalid,
                format!(
                    "[{}, {}) runs past the end {} of the managed allocation at {}",
                    Addr(ptr),
                    Addr(end),
                    Addr(b + a.range.size),
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
                if (d as usize) < self.devmem.len() {
                    Ok(Loc::Device(d))
                } else {
                    Err(Error::Acl(
                        AclCode::RtParamInvalid,
                        format!(
                            "device id {d} is not a device (there are {})",
                            self.devmem.len()
                        ),
                    ))
                }
            }
            Location::Host => Ok(Loc::Host),
            Location::HostNuma(n) => {
                let nodes = self.ops.numa_nodes();
                if nodes.contains(&n) {
                    Ok(Loc::Numa(n))
                } else {
                    Err(Error::Acl(
                        AclCode::RtParamInvalid,
                        format!("NUMA node {n} does not exist (nodes: {nodes:?})"),
                    ))
                }
            }
            Location::HostNumaCurrent => Ok(Loc::Numa(self.ops.current_numa_node())),
        }
    }

    /// Executes a device-side operation on device `d`: `f` gets, per operand, the address
    /// through which device `d` reaches it, once every page of every managed operand is on
    /// `d`. Operands are processed in page-aligned segments (`seg` bytes at once, forward or
    /// backward when `backward`), so an operation larger than the device still completes. Each
    /// segment's pages are migrated under the lock, then pinned, and `f` runs with the lock
    /// dropped (host faults and other streams go on meanwhile); a segment waits for pinned
    /// pages it would have to move.
    pub(crate) fn device_op(
        &self,
        d: u32,
        ops: &[DevOperand],
        len: usize,
        backward: bool,
        mut f: impl FnMut(&[usize], usize, usize),
    ) -> Result<()> {
        let mut st = self.state.lock();
        for o in ops.iter().filter(|o| o.managed) {
            self.check_range(&st, o.addr, len)?;
        }
        // Segment boundaries: every page boundary of every operand.
        let mut cuts = vec![0, len];
        for o in ops {
            let mut c = PAGE - o.addr % PAGE;
            while c < len {
                cuts.push(c);
                c += PAGE;
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        let segs: Vec<(usize, usize)> = cuts.windows(2).map(|w| (w[0], w[1])).collect();
        let order: Box<dyn Iterator<Item = &(usize, usize)>> = if backward {
            Box::new(segs.iter().rev())
        } else {
            Box::new(segs.iter())
        };
        let mut addrs = vec![0usize; ops.len()];
        for &(s, e) in order {
            let managed: Vec<&DevOperand> = ops.iter().filter(|o| o.managed).collect();
            let keep: Vec<usize> = managed.iter().map(|o| (o.addr + s) & !(PAGE - 1)).collect();
            let want: Vec<(usize, usize, Option<u32>, bool)> = managed
                .iter()
                .map(|o| (o.addr + s, e - s, Some(d), o.write))
                .collect();
            self.wait_pins(&mut st, &want)?;
            // Write operands last, so a read of the same page never undoes the write's
            // exclusivity.
            for o in managed.iter().filter(|o| !o.write) {
                self.ensure_device(&mut st, (o.addr + s) & !(PAGE - 1), d, false, &keep)?;
            }
            for o in managed.iter().filter(|o| o.write) {
                self.ensure_device(&mut st, (o.addr + s) & !(PAGE - 1), d, true, &keep)?;
            }
            for (i, o) in ops.iter().enumerate() {
                addrs[i] = if o.managed {
                    self.mirror(&st, o.addr + s, d)
                } else {
                    o.addr + s
                };
            }
            self.pin(&mut st, &keep);
            MutexGuard::unlocked(&mut st, || f(&addrs, s, e - s));
            self.unpin(&mut st, &keep);
        }
        Ok(())
    }
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

/// The managed-page addresses `[ptr, ptr+len)` overlaps (none for `len` 0).
pub(crate) fn pages_of(ptr: usize, len: usize) -> impl Iterator<Item = usize> {
    let first = ptr & !(PAGE - 1);
    let end = ptr + len;
    (first..end).step_by(PAGE)
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

impl Core {
    /// A device copy on `d`; each side `(address, managed)`.
    pub(crate) fn device_copy(
        &self,
        d: u32,
        dst: (usize, bool),
        src: (usize, bool),
        count: usize,
    ) -> Result<()> {
        let o = [
            DevOperand {
                addr: dst.0,
                write: true,
                managed: dst.1,
            },
            DevOperand {
                addr: src.0,
                write: false,
                managed: src.1,
            },
        ];
        let backward = dst.0 > src.0 && dst.0 < src.0 + count;
        self.device_op(d, &o, count, backward, |a, _, n| {
            // SAFETY: managed segments are mapped on `d` and pinned there; the other side is
            // live memory the driver knows, held in flight by the caller; memmove.
            unsafe { std::ptr::copy(a[1] as *const u8, a[0] as *mut u8, n) }
        })
    }
}

/// Where one managed page has copies ([`Context::managed_residency`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Residency {
    /// Present on the host.
    pub host: bool,
    /// The host copy is a read-only (read-mostly) copy.
    pub host_read_only: bool,
    /// Devices holding a copy.
    pub devices: Vec<u32>,
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
    let pages: &[Page] = &st.allocs[&base].pages[i0..=i1];
    let uniform = |f: &dyn Fn(&Page) -> Option<Loc>| -> Option<Loc> {
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
