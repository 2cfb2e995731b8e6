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
//! # Errors (ACL codes through [`Error::acl_error`])
//! Null pointers, size 0 and bad flag values are API-layer errors, 100000
//! (`InvalidNullPointer`, `InvalidSize`, `InvalidEnumeration`). Out-of-range enumeration values
//! (`UnsupportedEnumeration`), bad device or NUMA ids and refused advice (`InvalidArgument`), a
//! size that is not a multiple of 2 MiB or over 3 TiB, a bad `dataSize` (`UnsupportedSize`), and
//! a range not inside one managed allocation (`AddressNotFound`) are 107000. A pointer that is
//! not 2 MiB-aligned where alignment is required is 107008 (`UnsupportedAlignment`). A platform
//! without userfaultfd is 207000 (`UnsupportedFeature`); memory exhaustion 207001. Checks run in
//! that order: pointer, size, range, alignment, enumerations, locations. A failed call changes
//! nothing and leaves later calls working: each call decides every refusal (arguments, advice
//! rules, device room) before it moves a page, and records advice only once its pages have
//! moved.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::backend::managed::{Fault, FaultSink, FaultThread, ManagedOps, ManagedRange};
use crate::capacity::DeviceMemory;
use crate::driver::{Context, Device, Driver};
use crate::error::{Addr, Error, Result};
use crate::queue::CommandQueue;

/// The managed page: allocation rounding, advice / prefetch granularity and migration unit
/// (2 MiB).
pub const MANAGED_PAGE_SIZE: usize = 2 << 20;
/// Most managed memory one process may hold at once (3 TiB).
pub const MAX_MANAGED_PER_PROCESS: u64 = 3 << 40;
/// `ACL_RT_MEM_ATTACH_GLOBAL`, the only flag `aclrtMemAllocManaged` accepts.
pub const ACL_RT_MEM_ATTACH_GLOBAL: u32 = 0x01;

/// Managed bytes allocated in this process (all drivers), for the 3 TiB limit.
static PROCESS_MANAGED: AtomicU64 = AtomicU64::new(0);

/// `aclrtMemManagedAdviseType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Advice {
    /// `SET_READ_MOSTLY` (0): the location is ignored; every page gets a read-only host copy
    /// at once (besides any device copy).
    SetReadMostly,
    /// `UNSET_READ_MOSTLY` (1): the copies collapse to one, writable, at the location (INVALID
    /// means the host).
    UnsetReadMostly,
    /// `SET_PREFERRED_LOCATION` (2). To the host (or a NUMA node), pages not read-mostly: fails
    /// if any is on a device, else every page is populated on the host at once. To device `d`:
    /// fails if any page not read-mostly is on the host or another device, else they are
    /// populated on `d` at once. Read-mostly pages: to the host nothing moves; to a device they
    /// get a read-only copy there. Pages preferring a device are evicted from it last.
    SetPreferredLocation,
    /// `UNSET_PREFERRED_LOCATION` (3): forgets the preference (location ignored).
    UnsetPreferredLocation,
    /// `SET_ACCESSED_BY` (4): records the location; pages whose preferred location is the same
    /// place are populated (mapped) there at once.
    SetAccessedBy,
    /// `UNSET_ACCESSED_BY` (5): removes the location from the record.
    UnsetAccessedBy,
}

impl Advice {
    /// From the ACL value 0..=5.
    ///
    /// Errors: `UnsupportedEnumeration` (107000) for any other value.
    pub fn from_raw(v: u32) -> Result<Advice> {
        Ok(match v {
            0 => Advice::SetReadMostly,
            1 => Advice::UnsetReadMostly,
            2 => Advice::SetPreferredLocation,
            3 => Advice::UnsetPreferredLocation,
            4 => Advice::SetAccessedBy,
            5 => Advice::UnsetAccessedBy,
            _ => {
                return Err(Error::UnsupportedEnumeration(format!(
                    "advice {v} is not an aclrtMemManagedAdviseType (0..=5)"
                )))
            }
        })
    }
    /// The ACL value (`aclrtMemManagedAdviseType`, 0..=5).
    pub fn raw(self) -> u32 {
        self as u32
    }
}

/// `aclrtMemManagedLocation`: where advice or a prefetch points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Location {
    /// `ACL_MEM_LOCATIONTYPE_INVALID` (0): only meaningful for `UNSET_READ_MOSTLY` (the host).
    Invalid,
    /// `ACL_MEM_LOCATIONTYPE_DEVICE` (1) with the device id.
    Device(u32),
    /// `ACL_MEM_LOCATIONTYPE_HOST` (2); the id is ignored.
    Host,
    /// `ACL_MEM_LOCATIONTYPE_HOST_NUMA` (3) with a NUMA node id of this machine.
    HostNuma(u32),
    /// `ACL_MEM_LOCATIONTYPE_HOST_NUMA_CURRENT` (4): the calling thread's NUMA node, resolved
    /// when the call is made.
    HostNumaCurrent,
}

/// `aclrtMemManagedLocationType` values.
pub mod location_type {
    /// `ACL_MEM_LOCATIONTYPE_INVALID`.
    pub const INVALID: u32 = 0;
    /// `ACL_MEM_LOCATIONTYPE_DEVICE`.
    pub const DEVICE: u32 = 1;
    /// `ACL_MEM_LOCATIONTYPE_HOST`.
    pub const HOST: u32 = 2;
    /// `ACL_MEM_LOCATIONTYPE_HOST_NUMA`.
    pub const HOST_NUMA: u32 = 3;
    /// `ACL_MEM_LOCATIONTYPE_HOST_NUMA_CURRENT`.
    pub const HOST_NUMA_CURRENT: u32 = 4;
}

impl Location {
    /// From `struct aclrtMemManagedLocation { type; id; }`. The id is only read for DEVICE and
    /// HOST_NUMA; whether it names a real device / node is checked by the call that uses it.
    ///
    /// Errors: `UnsupportedEnumeration` (107000) for a type over 4; `InvalidArgument` (107000)
    /// for a negative id of DEVICE / HOST_NUMA.
    pub fn from_raw(ty: u32, id: i32) -> Result<Location> {
        let nonneg = |what: &str| {
            u32::try_from(id)
                .map_err(|_| Error::InvalidArgument(format!("{what} id {id} is negative")))
        };
        Ok(match ty {
            location_type::INVALID => Location::Invalid,
            location_type::DEVICE => Location::Device(nonneg("device")?),
            location_type::HOST => Location::Host,
            location_type::HOST_NUMA => Location::HostNuma(nonneg("NUMA node")?),
            location_type::HOST_NUMA_CURRENT => Location::HostNumaCurrent,
            _ => {
                return Err(Error::UnsupportedEnumeration(format!(
                    "location type {ty} is not an aclrtMemManagedLocationType (0..=4)"
                )))
            }
        })
    }
}

/// `aclrtMemManagedRangeAttribute` (values 1..=8; see the English summary of the spec page).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RangeAttribute {
    /// 1: 1 if every page of the range is read-mostly, else 0. dataSize 4.
    ReadMostly = 1,
    /// 2: the device / NUMA id every page prefers, -1 if all prefer the host, else -2.
    PreferredLocation = 2,
    /// 3: the ids (device, -1 host, NUMA node) advised `SET_ACCESSED_BY` over the whole range;
    /// extra slots -2, a short buffer gets as many as fit. dataSize a non-zero multiple of 4.
    AccessedBy = 3,
    /// 4: the location type every page prefers, else INVALID. dataSize 4.
    PreferredLocationType = 4,
    /// 5: the device / NUMA id every page prefers, else -2. dataSize 4.
    PreferredLocationId = 5,
    /// 6: where the whole range was last prefetched (requested): id, -1 host, else -2.
    LastPrefetchLocation = 6,
    /// 7: the type of the last prefetch location shared by every page, else INVALID.
    LastPrefetchLocationType = 7,
    /// 8: the id of the last prefetch location shared by every page, else -2.
    LastPrefetchLocationId = 8,
}

impl RangeAttribute {
    /// From the ACL value 1..=8.
    ///
    /// Errors: `UnsupportedEnumeration` (107000) for any other value.
    pub fn from_raw(v: u32) -> Result<RangeAttribute> {
        use RangeAttribute::*;
        Ok(match v {
            1 => ReadMostly,
            2 => PreferredLocation,
            3 => AccessedBy,
            4 => PreferredLocationType,
            5 => PreferredLocationId,
            6 => LastPrefetchLocation,
            7 => LastPrefetchLocationType,
            8 => LastPrefetchLocationId,
            _ => {
                return Err(Error::UnsupportedEnumeration(format!(
                    "attribute {v} is not an aclrtMemManagedRangeAttribute (1..=8)"
                )))
            }
        })
    }
    /// All eight, in value order.
    pub const ALL: [RangeAttribute; 8] = [
        RangeAttribute::ReadMostly,
        RangeAttribute::PreferredLocation,
        RangeAttribute::AccessedBy,
        RangeAttribute::PreferredLocationType,
        RangeAttribute::PreferredLocationId,
        RangeAttribute::LastPrefetchLocation,
        RangeAttribute::LastPrefetchLocationType,
        RangeAttribute::LastPrefetchLocationId,
    ];
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

/// A resolved place: the host (optionally a NUMA node, for the attribute answers) or a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Loc {
    Device(u32),
    Host,
    Numa(u32),
}

impl Loc {
    fn device(self) -> Option<u32> {
        match self {
            Loc::Device(d) => Some(d),
            _ => None,
        }
    }
    /// The id the attribute queries give: device id, -1 host, node id.
    fn id(self) -> i32 {
        match self {
            Loc::Device(d) => d as i32,
            Loc::Host => -1,
            Loc::Numa(n) => n as i32,
        }
    }
    fn ty(self) -> u32 {
        match self {
            Loc::Device(_) => location_type::DEVICE,
            Loc::Host => location_type::HOST,
            Loc::Numa(_) => location_type::HOST_NUMA,
        }
    }
    /// The `*_ID` answer: only devices and nodes have one.
    fn id_only(self) -> i32 {
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
struct Page {
    /// Present in the host range.
    host: bool,
    /// Present but write-protected (a read-mostly copy).
    host_ro: bool,
    /// Slot per device holding a copy.
    slots: Vec<Option<u32>>,
    /// Slot per device still mapped at this page's mirror but not holding its copy any more
    /// (reused as is if the page comes back, taken by another page when the device needs it).
    cached: Vec<Option<u32>>,
    read_mostly: bool,
    preferred: Option<Loc>,
    accessed_by: BTreeSet<Loc>,
    last_prefetch: Option<Loc>,
    /// LRU tick per device.
    tick: Vec<u64>,
    /// Device-side operations using the page right now (launched work, a copy or fill segment)
    /// with the lock dropped: while non-zero the page's residency may not change (see
    /// "Pinning" in the module docs).
    pins: u32,
}

impl Page {
    fn new(devices: usize) -> Page {
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
    fn on_device(&self) -> Option<u32> {
        self.slots
            .iter()
            .position(|s| s.is_some())
            .map(|d| d as u32)
    }
    fn copies(&self) -> usize {
        self.host as usize + self.slots.iter().filter(|s| s.is_some()).count()
    }
    /// Whether [`Core::ensure_device`]`(d, write)` would leave the copies as they are (the
    /// page is already usable there): the only change allowed on a pinned page.
    fn ready_on(&self, d: u32, write: bool) -> bool {
        if self.slots[d as usize].is_none() {
            return false;
        }
        let exclusive = write || !self.read_mostly;
        !exclusive || self.copies() == 1
    }
}

#[derive(Debug)]
struct Alloc {
    range: ManagedRange,
    ctx: u64,
    pages: Vec<Page>,
}

#[derive(Debug, Default)]
struct State {
    allocs: BTreeMap<usize, Alloc>,
    /// Per device: (tick, page address) of resident pages, oldest first.
    lru: Vec<BTreeSet<(u64, usize)>>,
    free_slots: Vec<Vec<u32>>,
    next_slot: Vec<u32>,
    /// Per device: cached slots (slot -> page address), see [`Page::cached`].
    cached: Vec<BTreeMap<u32, usize>>,
    tick: u64,
    stats: ManagedStats,
    /// Host faults on pinned pages, waiting for the pin to drop: page -> a write was seen.
    deferred: BTreeMap<usize, bool>,
}

/// The managed-memory core of one driver: state, the platform's operations and the fault sink.
#[derive(Debug)]
struct Core {
    ops: Arc<dyn ManagedOps>,
    devmem: Arc<DeviceMemory>,
    state: Mutex<State>,
    /// Signalled (with `state`) whenever a page's pin count drops.
    unpinned: Condvar,
}

/// Per-driver managed memory: made on the first allocation (the platform check happens then).
#[derive(Debug)]
pub(crate) struct ManagedState {
    devmem: Arc<DeviceMemory>,
    core: OnceLock<std::result::Result<Started, String>>,
    init: Mutex<()>,
}

/// The core and the fault thread that feeds it (stopped first on drop).
type Started = (Arc<Core>, Box<dyn FaultThread>);

const PAGE: usize = MANAGED_PAGE_SIZE;

impl ManagedState {
    pub(crate) fn new(devmem: Arc<DeviceMemory>) -> ManagedState {
        ManagedState {
            devmem,
            core: OnceLock::new(),
            init: Mutex::new(()),
        }
    }

    fn core(&self, backend: &dyn crate::backend::Backend) -> Result<&Arc<Core>> {
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
            Some(Err(why)) => Err(Error::UnsupportedFeature(format!(
                "managed memory is not available: {why}"
            ))),
            None => unreachable!("set above"),
        }
    }

    fn existing(&self) -> Option<&Arc<Core>> {
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
struct DevOperand {
    addr: usize,
    write: bool,
    /// Managed memory (migrated to the device); else memory the driver knows (a USM
    /// allocation, an import, an IPC view, mapped virtual memory), used in place and held in
    /// flight by the caller.
    managed: bool,
}

impl Core {
    /// Makes `page` accessible on the host for a faulting thread (and wakes it).
    fn resolve_fault(&self, st: &mut State, page: usize, write: bool) {
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
    fn pin(&self, st: &mut State, pages: &[usize]) {
        for &a in pages {
            self.page_mut(st, a).pins += 1;
        }
    }

    /// Drops one pin of each of `pages`; host faults deferred on a page whose last pin this
    /// was are resolved now; waiters for pins are woken.
    fn unpin(&self, st: &mut State, pages: &[usize]) {
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
    fn wait_pins(
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

    fn page_ref<'a>(&self, st: &'a State, addr: usize) -> &'a Page {
        let (base, i) = self.find(st, addr).expect("page of a live allocation");
        &st.allocs[&base].pages[i]
    }

    fn find(&self, st: &State, addr: usize) -> Option<(usize, usize)> {
        let (&base, a) = st.allocs.range(..=addr).next_back()?;
        (addr < base + a.range.size).then_some((base, (addr - base) / PAGE))
    }

    fn page_mut<'a>(&self, st: &'a mut State, addr: usize) -> &'a mut Page {
        let (base, i) = self.find(st, addr).expect("page of a live allocation");
        &mut st.allocs.get_mut(&base).expect("live").pages[i]
    }

    fn page(&self, st: &State, addr: usize) -> Page {
        let (base, i) = self.find(st, addr).expect("page of a live allocation");
        st.allocs[&base].pages[i].clone()
    }

    fn mirror(&self, st: &State, addr: usize, d: u32) -> usize {
        let (base, _) = self.find(st, addr).expect("live");
        st.allocs[&base].range.mirrors[d as usize] + (addr - base)
    }

    fn touch(&self, st: &mut State, addr: usize, d: u32) {
        st.tick += 1;
        let t = st.tick;
        let p = self.page_mut(st, addr);
        let old = std::mem::replace(&mut p.tick[d as usize], t);
        st.lru[d as usize].remove(&(old, addr));
        st.lru[d as usize].insert((t, addr));
    }

    /// Drops device `d`'s copy of `addr`: its capacity comes back at once; the slot stays
    /// mapped at the page's mirror as a cached slot ([`Page::cached`]).
    fn drop_device_copy(&self, st: &mut State, addr: usize, d: u32) {
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
    fn uncache(&self, st: &mut State, addr: usize, d: u32) {
        let m = self.mirror(st, addr, d);
        if let Some(slot) = self.page_mut(st, addr).cached[d as usize].take() {
            st.cached[d as usize].remove(&slot);
            // SAFETY: the slot is mapped at the mirror page and holds no live copy.
            unsafe { self.ops.device_unmap(d, m, PAGE) };
            st.free_slots[d as usize].push(slot);
        }
    }

    fn drop_host_copy(&self, st: &mut State, addr: usize) -> Result<()> {
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
    fn take_slot(
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
                    return Err(Error::OutOfDeviceMemory(format!(
                        "device {d} has no managed memory slot left"
                    )));
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
                return Err(Error::OutOfDeviceMemory(format!(
                    "device {d} is full ({:#x} of {:#x} bytes used) and holds no managed page \
                     that can be evicted (pages in use by running work stay)",
                    self.devmem.used(d as usize),
                    self.devmem.capacity(d as usize)
                )));
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
    fn install_host_from(
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
    fn note_host_install(&self, st: &mut State, addr: usize, from: Option<u32>, read_only: bool) {
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
    fn prefetch_to_device(&self, st: &mut State, ptr: usize, size: usize, d: u32) -> Result<()> {
        let di = d as usize;
        // A device that cannot take even one page fails the prefetch before anything moves.
        let pages: Vec<usize> = (ptr..ptr + size).step_by(PAGE).collect();
        self.check_room_one_by_one(st, d, &pages, "a prefetch")?;
        let mut pending: Vec<(usize, usize)> = Vec::new();
        let flush = |pending: &mut Vec<(usize, usize)>| -> Result<()> {
            // SAFETY: every pending page is present on the host and its mirror page is mapped.
            let r = unsafe { self.ops.host_evict_batch(pending, PAGE) };
            pending.clear();
            r
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
                    return Err(e);
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
    fn prefetch_to_host(&self, st: &mut State, ptr: usize, size: usize) -> Result<()> {
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
            return Err(e);
        }
        for (a, _, d) in batch {
            self.note_host_install(st, a, Some(d), false);
            self.drop_device_copy(st, a, d);
        }
        Ok(())
    }

    /// Makes `addr`'s page accessible on the host for reading (and writing if `write`).
    /// Returns whether anything changed.
    fn ensure_host(&self, st: &mut State, addr: usize, write: bool) -> Result<bool> {
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
    fn ensure_device(
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
                    return Err(e);
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
    fn room_pages(&self, st: &State, d: u32, keep: std::ops::Range<usize>) -> u64 {
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
    /// Errors: `OutOfDeviceMemory` (207001) naming `what`, the device and its use.
    fn check_room_one_by_one(&self, st: &State, d: u32, pages: &[usize], what: &str) -> Result<()> {
        let need = pages
            .iter()
            .any(|&a| self.page_ref(st, a).slots[d as usize].is_none());
        if need && self.room_pages(st, d, 0..0) == 0 {
            return Err(Error::OutOfDeviceMemory(format!(
                "{what} to device {d}: the device is full ({:#x} of {:#x} bytes used) and holds \
                 no managed page that can be evicted",
                self.devmem.used(d as usize),
                self.devmem.capacity(d as usize)
            )));
        }
        Ok(())
    }

    /// Takes back the read-only host copies a failed `SET_READ_MOSTLY` made: `(page, true)`
    /// was installed (dropped again; another copy holds its bytes), `(page, false)` was only
    /// write-protected (made writable again). The caller restores the counters.
    fn undo_read_only_copies(&self, st: &mut State, done: &[(usize, bool)]) {
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
    fn ensure_at(&self, st: &mut State, addr: usize, loc: Loc, write: bool) -> Result<()> {
        match loc {
            Loc::Device(d) => self.ensure_device(st, addr, d, write, &[addr]).map(|_| ()),
            Loc::Host | Loc::Numa(_) => self.ensure_host(st, addr, write).map(|_| ()),
        }
    }

    /// Gives the memory of every free slot back to the platform (after a free: the device
    /// holds only what live pages use).
    fn discard_free_slots(&self, st: &mut State) {
        for (d, slots) in st.free_slots.iter().enumerate() {
            for &s in slots {
                self.ops.device_discard(d as u32, s, PAGE);
            }
        }
    }

    fn free_locked(&self, st: &mut State, base: usize) {
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
    fn check_range(&self, st: &State, ptr: usize, size: usize) -> Result<()> {
        let end = ptr.checked_add(size).ok_or_else(|| {
            Error::AddressNotFound(format!("{} + {size:#x} overflows", Addr(ptr)))
        })?;
        match st.allocs.range(..=ptr).next_back() {
            Some((&b, a)) if ptr < b + a.range.size && end <= b + a.range.size => Ok(()),
            Some((&b, a)) if ptr < b + a.range.size => Err(Error::AddressNotFound(format!(
                "[{}, {}) runs past the end {} of the managed allocation at {}",
                Addr(ptr),
                Addr(end),
                Addr(b + a.range.size),
                Addr(b)
            ))),
            _ => Err(Error::AddressNotFound(format!(
                "{} is not inside managed memory",
                Addr(ptr)
            ))),
        }
    }

    fn resolve(&self, loc: Location, what: &str) -> Result<Loc> {
        match loc {
            Location::Invalid => Err(Error::InvalidArgument(format!(
                "location type INVALID is not allowed for {what}"
            ))),
            Location::Device(d) => {
                if (d as usize) < self.devmem.len() {
                    Ok(Loc::Device(d))
                } else {
                    Err(Error::InvalidArgument(format!(
                        "device id {d} is not a device (there are {})",
                        self.devmem.len()
                    )))
                }
            }
            Location::Host => Ok(Loc::Host),
            Location::HostNuma(n) => {
                let nodes = numa_nodes();
                if nodes.contains(&n) {
                    Ok(Loc::Numa(n))
                } else {
                    Err(Error::InvalidArgument(format!(
                        "NUMA node {n} does not exist (nodes: {nodes:?})"
                    )))
                }
            }
            Location::HostNumaCurrent => Ok(Loc::Numa(current_numa_node())),
        }
    }

    /// Executes a device-side operation on device `d`: `f` gets, per operand, the address
    /// through which device `d` reaches it, once every page of every managed operand is on
    /// `d`. Operands are processed in page-aligned segments (`seg` bytes at once, forward or
    /// backward when `backward`), so an operation larger than the device still completes. Each
    /// segment's pages are migrated under the lock, then pinned, and `f` runs with the lock
    /// dropped (host faults and other streams go on meanwhile); a segment waits for pinned
    /// pages it would have to move.
    fn device_op(
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

/// Checks `[ptr, ptr+len)` is mapped in this process, readable (and writable if `write`),
/// from `/proc/self/maps`.
///
/// Errors: `AddressNotFound` naming the first byte that is not.
fn check_process_memory(ptr: usize, len: usize, write: bool) -> Result<()> {
    let end = ptr + len;
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| Error::Unknown(format!("reading /proc/self/maps: {e}")))?;
    let mut at = ptr;
    for line in maps.lines() {
        if at >= end {
            break;
        }
        let mut f = line.split_whitespace();
        let (Some(r), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let Some((a, b)) = r.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else {
            continue;
        };
        if b <= at {
            continue;
        }
        let ok = perms.starts_with('r') && (!write || perms.as_bytes().get(1) == Some(&b'w'));
        if a > at || !ok {
            break;
        }
        at = b;
    }
    if at < end {
        return Err(Error::AddressNotFound(format!(
            "{} is not {} process memory (in [{}, {}))",
            Addr(at),
            if write { "writable" } else { "readable" },
            Addr(ptr),
            Addr(end)
        )));
    }
    Ok(())
}

/// The managed-page addresses `[ptr, ptr+len)` overlaps (none for `len` 0).
fn pages_of(ptr: usize, len: usize) -> impl Iterator<Item = usize> {
    let first = ptr & !(PAGE - 1);
    let end = ptr + len;
    (first..end).step_by(PAGE)
}

/// Checks pointer / size / alignment of an advise or prefetch (see the module docs).
fn check_advise_args(core: &Core, st: &State, ptr: usize, size: usize) -> Result<()> {
    if ptr == 0 {
        return Err(Error::InvalidNullPointer("pointer is null".into()));
    }
    if size == 0 {
        return Err(Error::InvalidSize("size is 0".into()));
    }
    if size as u64 > MAX_MANAGED_PER_PROCESS || !size.is_multiple_of(PAGE) {
        return Err(Error::UnsupportedSize(format!(
            "size {size:#x} is not a multiple of 2 MiB in (0, 3 TiB]"
        )));
    }
    core.check_range(st, ptr, size)?;
    if !ptr.is_multiple_of(PAGE) {
        return Err(Error::UnsupportedAlignment(format!(
            "pointer {} is not aligned to 2 MiB",
            Addr(ptr)
        )));
    }
    Ok(())
}

/// An in-order stream on one device (`aclrtStream`), on the device queue machinery
/// ([`CommandQueue`]): prefetches, copies, fills and launched work run in submission order, on
/// the device's engine. Dropping it (`aclrtDestroyStream`) waits for its work.
#[derive(Debug)]
pub struct Stream {
    queue: CommandQueue,
    core: Arc<Core>,
    error: Arc<Mutex<Option<Error>>>,
}

/// One buffer of [`Stream::launch`]ed work: the device address of `[ptr, ptr+len)`.
#[derive(Debug, Clone, Copy)]
pub struct DeviceBuffer {
    /// Where the device reaches the buffer (valid only during the work).
    pub ptr: *mut u8,
    /// Bytes.
    pub len: usize,
}

impl Stream {
    /// The device the stream runs on.
    pub fn device(&self) -> &Device {
        self.queue.device()
    }

    fn dev(&self) -> u32 {
        self.queue.device().ordinal()
    }

    fn enqueue(&self, f: impl FnOnce(&Core) -> Result<()> + Send + 'static) {
        let core = self.core.clone();
        let err = self.error.clone();
        self.queue.submit_host(Box::new(move || {
            if let Err(e) = f(&core) {
                err.lock().get_or_insert(e);
            }
        }));
    }

    /// Waits for everything submitted before (`aclrtSynchronizeStream`).
    ///
    /// Errors: the first error of the work since the last synchronize (e.g. `OutOfDeviceMemory`
    /// when a device full of non-managed memory could not take a page, or `AddressNotFound` for
    /// memory freed before its work ran); the stream stays usable.
    pub fn synchronize(&self) -> Result<()> {
        self.queue.synchronize(u64::MAX)?;
        match self.error.lock().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Stream-ordered `aclrtMemcpyAsync` of `count` bytes (overlap behaves as `memmove`),
    /// executed by the stream's device. Each side is either managed memory (the range inside
    /// one managed allocation; its pages migrate to the stream's device first, as any device
    /// access) or memory the driver knows, used in place: a USM allocation or import, an
    /// opened IPC view, or mapped virtual memory with the access the copy needs (the rules of
    /// [`crate::queue`]), held in flight until the copy has run. At least one side must be
    /// managed (a copy between two USM ranges is a command list's job).
    ///
    /// Errors (nothing queued): `InvalidNullPointer` (100000); `AddressNotFound` (107000) for
    /// a managed range running past its allocation or when neither side is managed memory;
    /// `InvalidArgument` (107000) for a non-managed side that is not memory the driver knows
    /// (or read-only memory as the destination).
    pub fn memcpy_async(&self, dst: usize, src: usize, count: usize) -> Result<()> {
        if dst == 0 || src == 0 {
            return Err(Error::InvalidNullPointer("pointer is null".into()));
        }
        let (dm, sm) = {
            let st = self.core.state.lock();
            let dm = self.core.find(&st, dst).is_some();
            let sm = self.core.find(&st, src).is_some();
            if !dm && !sm {
                return Err(Error::AddressNotFound(format!(
                    "neither {} nor {} is inside managed memory",
                    Addr(dst),
                    Addr(src)
                )));
            }
            if dm {
                self.core.check_range(&st, dst, count)?;
            }
            if sm {
                self.core.check_range(&st, src, count)?;
            }
            (dm, sm)
        };
        // The plain side (at most one), held in flight until the copy has run.
        let held = match (dm, sm) {
            (false, _) => Some(self.queue.hold_operand(dst, count, true)?),
            (_, false) => Some(self.queue.hold_operand(src, count, false)?),
            _ => None,
        };
        let d = self.dev();
        self.enqueue(move |c| {
            let r = c.device_copy(d, (dst, dm), (src, sm), count);
            drop(held);
            r
        });
        Ok(())
    }

    /// Stream-ordered `aclrtMemsetAsync`: `count` bytes at `ptr` (inside one managed
    /// allocation; any alignment) set to `value`, by the stream's device (the pages migrate
    /// there first). Run-time errors (e.g. `OutOfDeviceMemory` when the device is full of
    /// pages in use by running work) are reported by [`Stream::synchronize`].
    ///
    /// Errors (nothing queued): `InvalidNullPointer` (100000); `AddressNotFound` (107000) for
    /// a range not inside one managed allocation.
    pub fn memset_async(&self, ptr: usize, value: u8, count: usize) -> Result<()> {
        if ptr == 0 {
            return Err(Error::InvalidNullPointer("pointer is null".into()));
        }
        self.core.check_range(&self.core.state.lock(), ptr, count)?;
        let d = self.dev();
        self.enqueue(move |c| {
            let o = [DevOperand {
                addr: ptr,
                write: true,
                managed: true,
            }];
            c.device_op(d, &o, count, false, |a, _, n| {
                // SAFETY: the mirror segment is mapped on `d` and its page pinned there.
                unsafe { std::ptr::write_bytes(a[0] as *mut u8, value, n) }
            })
        });
        Ok(())
    }

    /// Launches device work (what `aclrtLaunchKernel` runs; hetmem's stand-in for a kernel)
    /// that uses `buffers` (`(ptr, len, write)` in bytes, any alignment, each inside one managed
    /// allocation): when the stream reaches it, every page of every buffer is migrated to the
    /// stream's device (written buffers exclusively) and **pinned** there, then `work` runs on
    /// the device's engine, with no lock held, with the device address of each buffer,
    /// contiguous; the pins drop when it returns. The whole working set must fit in the device
    /// next to the pages other running work has pinned there. `work` stands for a device
    /// kernel: it must reach managed memory only through the buffers it is given.
    ///
    /// While `work` runs (see "Pinning" in the module docs): host faults and other managed
    /// calls on other pages proceed; a host access to one of its pages waits until `work`
    /// returns (the fault thread keeps serving other faults); prefetches, advice, frees and
    /// device operations that would move its pages wait too, while other work that needs its
    /// pages where they are (same device, no change) runs alongside. So `work` must not wait
    /// for a host thread that touches its own buffers through the managed pointer, nor call
    /// hetmem functions that move them (each would wait for the other).
    ///
    /// Errors (nothing queued): `InvalidNullPointer`; `AddressNotFound`. At run time (reported
    /// by [`Stream::synchronize`]): `OutOfDeviceMemory` if the buffers do not fit in the device
    /// together (`work` does not run); `Unknown` if `work` panicked (the stream stays usable).
    pub fn launch(
        &self,
        buffers: &[(usize, usize, bool)],
        work: impl FnOnce(&[DeviceBuffer]) + Send + 'static,
    ) -> Result<()> {
        {
            let st = self.core.state.lock();
            for &(p, l, _) in buffers {
                if p == 0 {
                    return Err(Error::InvalidNullPointer("buffer pointer is null".into()));
                }
                self.core.check_range(&st, p, l)?;
            }
        }
        let d = self.dev();
        let bufs = buffers.to_vec();
        self.enqueue(move |c| {
            let mut st = c.state.lock();
            let want: Vec<(usize, usize, Option<u32>, bool)> =
                bufs.iter().map(|&(p, l, w)| (p, l, Some(d), w)).collect();
            c.wait_pins(&mut st, &want)?;
            let mut keep: Vec<usize> = bufs.iter().flat_map(|&(p, l, _)| pages_of(p, l)).collect();
            keep.sort_unstable();
            keep.dedup();
            for &(p, l, w) in &bufs {
                for a in pages_of(p, l) {
                    c.ensure_device(&mut st, a, d, w, &keep)?;
                }
            }
            let dev: Vec<DeviceBuffer> = bufs
                .iter()
                .map(|&(p, l, _)| DeviceBuffer {
                    ptr: c.mirror(&st, p, d) as *mut u8,
                    len: l,
                })
                .collect();
            c.pin(&mut st, &keep);
            let r = MutexGuard::unlocked(&mut st, || {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || work(&dev)))
            });
            c.unpin(&mut st, &keep);
            r.map_err(|_| Error::Unknown("launched device work panicked".into()))
        });
        Ok(())
    }
}

impl Core {
    /// A device copy on `d`; each side `(address, managed)`.
    fn device_copy(
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

impl Context {
    fn managed(&self) -> Result<&Arc<Core>> {
        let d = self.driver_shared();
        d.managed.core(d.backend.as_ref())
    }

    /// Allocates `size` bytes of managed memory (`aclrtMemAllocManaged`), rounded up to a
    /// multiple of 2 MiB, 2 MiB-aligned, reachable from the host and every device. Pages are
    /// populated on first touch (contents not initialised; fresh pages read zero here).
    ///
    /// Errors: `InvalidEnumeration` (100000) unless `flag` is [`ACL_RT_MEM_ATTACH_GLOBAL`];
    /// `InvalidSize` (100000) for 0; `UnsupportedSize` (107000) over 3 TiB; `OutOfHostMemory`
    /// (207001) if the process would hold over 3 TiB of managed memory or the OS refuses;
    /// `UnsupportedFeature` (207000) where the platform cannot migrate on faults (the message
    /// says why).
    pub fn alloc_managed(&self, size: u64, flag: u32) -> Result<usize> {
        if flag != ACL_RT_MEM_ATTACH_GLOBAL {
            return Err(Error::InvalidEnumeration(format!(
                "flag {flag:#x} is not ACL_RT_MEM_ATTACH_GLOBAL (0x1)"
            )));
        }
        if size == 0 {
            return Err(Error::InvalidSize("managed allocation of size 0".into()));
        }
        if size > MAX_MANAGED_PER_PROCESS {
            return Err(Error::UnsupportedSize(format!(
                "size {size:#x} exceeds the 3 TiB of managed memory a process may allocate"
            )));
        }
        let rounded = size.div_ceil(PAGE as u64) * PAGE as u64;
        let core = self.managed()?;
        PROCESS_MANAGED
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(rounded)
                    .filter(|&n| n <= MAX_MANAGED_PER_PROCESS)
            })
            .map_err(|u| {
                Error::OutOfHostMemory(format!(
                    "the process holds {u:#x} bytes of managed memory; {rounded:#x} more would \
                     pass the 3 TiB limit"
                ))
            })?;
        let range = match core.ops.reserve(rounded as usize, PAGE) {
            Ok(r) => r,
            Err(e) => {
                PROCESS_MANAGED.fetch_sub(rounded, Ordering::AcqRel);
                return Err(e);
            }
        };
        let base = range.host;
        let n = core.devmem.len();
        let mut st = core.state.lock();
        st.stats.allocations += 1;
        st.stats.bytes += rounded;
        st.allocs.insert(
            base,
            Alloc {
                pages: vec![Page::new(n); rounded as usize / PAGE],
                range,
                ctx: self.id(),
            },
        );
        Ok(base)
    }

    /// Frees managed memory (`aclrtFree`): `ptr` must be the base of a live managed allocation
    /// of this context. Its pages leave every device at once. Stream work queued on it and not
    /// yet run reports `AddressNotFound` at synchronize.
    ///
    /// Errors (nothing freed): `InvalidNullPointer` (100000); `AddressNotFound` (107000) for any
    /// other pointer (interior, unknown, freed, another context's); `UnsupportedFeature`
    /// (207000) where managed memory is unavailable.
    pub fn free_managed(&self, ptr: usize) -> Result<()> {
        if ptr == 0 {
            return Err(Error::InvalidNullPointer("pointer is null".into()));
        }
        let core = self.managed()?;
        let mut st = core.state.lock();
        let size = match st.allocs.get(&ptr) {
            Some(a) if a.ctx == self.id() => a.range.size,
            _ => {
                return Err(Error::AddressNotFound(format!(
                    "{} is not the base of a managed allocation of this context",
                    Addr(ptr)
                )))
            }
        };
        // Work running on the allocation finishes first (its pages are pinned).
        core.wait_pins(&mut st, &[(ptr, size, None, false)])?;
        core.free_locked(&mut st, ptr);
        Ok(())
    }

    /// Whether the byte at `ptr` is inside a live managed allocation of this driver (any
    /// context): the "pointer inside managed memory" check of `aclrtMemManagedAdvise`,
    /// `aclrtMemManagedPrefetchAsync` and `aclrtMemManagedGetAttr` (107000 when false), as a
    /// query of hetmem's own (the spec has no call for it). Any alignment; never fails (false
    /// before the first managed allocation).
    pub fn is_managed(&self, ptr: usize) -> bool {
        let d = self.driver_shared();
        d.managed
            .existing()
            .is_some_and(|c| c.find(&c.state.lock(), ptr).is_some())
    }

    /// Host-synchronous `aclrtMemset`: sets `count` bytes at `ptr` (inside one managed
    /// allocation; any alignment, `count` 0 allowed) to `value` from the calling thread; the
    /// pages migrate to the host.
    ///
    /// Errors (nothing written): `InvalidNullPointer` (100000); `AddressNotFound` (107000) for a
    /// range not inside one managed allocation (or overflowing); `UnsupportedFeature` (207000)
    /// where managed memory is unavailable.
    pub fn managed_memset(&self, ptr: usize, value: u8, count: usize) -> Result<()> {
        self.check_host_range(ptr, count)?;
        // SAFETY: the range is inside a live managed allocation (mapped read-write; absent
        // pages fault and are migrated by the fault thread). No lock is held here.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, value, count) };
        Ok(())
    }

    /// Host-synchronous `aclrtMemcpy` of `count` bytes (overlap behaves as `memmove`) by the
    /// calling thread, a host access: managed pages migrate to the host. Each side is managed
    /// memory (inside one managed allocation) or plain process memory that is mapped readable
    /// (`src`) / writable (`dst`) for the whole range, checked against `/proc/self/maps`: host
    /// buffers, USM host / device / shared allocations, imports (on this backend device memory
    /// is process memory). At least one side must be managed.
    ///
    /// Errors (nothing copied): `InvalidNullPointer` (100000); `AddressNotFound` (107000) for a
    /// managed range running past its allocation, a plain range that is not mapped with the
    /// access needed or runs into managed memory, or when neither side is managed.
    pub fn managed_memcpy(&self, dst: usize, src: usize, count: usize) -> Result<()> {
        if dst == 0 || src == 0 {
            return Err(Error::InvalidNullPointer("pointer is null".into()));
        }
        let core = self.managed()?;
        {
            let st = core.state.lock();
            let dm = core.find(&st, dst).is_some();
            let sm = core.find(&st, src).is_some();
            if !dm && !sm {
                return Err(Error::AddressNotFound(format!(
                    "neither {} nor {} is inside managed memory",
                    Addr(dst),
                    Addr(src)
                )));
            }
            for (p, managed, write) in [(dst, dm, true), (src, sm, false)] {
                if managed {
                    core.check_range(&st, p, count)?;
                } else {
                    let end = p.checked_add(count).ok_or_else(|| {
                        Error::AddressNotFound(format!("{} + {count:#x} overflows", Addr(p)))
                    })?;
                    if let Some((&b, _)) = st.allocs.range(p..end).next() {
                        return Err(Error::AddressNotFound(format!(
                            "[{}, {}) runs into the managed allocation at {}",
                            Addr(p),
                            Addr(end),
                            Addr(b)
                        )));
                    }
                    check_process_memory(p, count, write)?;
                }
            }
        }
        // SAFETY: managed sides are inside live managed allocations (absent pages fault and
        // migrate; no lock is held here); plain sides are mapped with the access needed.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, count) };
        Ok(())
    }

    /// Host-synchronous `aclrtMemcpy` of `count` bytes between any two kinds of memory (overlap
    /// behaves as `memmove`), by the calling thread. If either side is managed memory this is
    /// [`Context::managed_memcpy`]. Otherwise each side must be plain process memory mapped
    /// readable (`src`) / writable (`dst`) for the whole range, checked against
    /// `/proc/self/maps`: host buffers, USM host / device / shared allocations, imports, mapped
    /// virtual memory, opened IPC views (on this backend device memory is process memory). A
    /// `count` of 0 copies nothing (the pointers are still checked for null). Works where
    /// managed memory is unavailable.
    ///
    /// Errors (nothing copied): `InvalidNullPointer` (100000); `AddressNotFound` (107000) for a
    /// range that is not mapped with the access needed, runs into managed memory or overflows;
    /// as [`Context::managed_memcpy`] when a side is managed.
    pub fn host_memcpy(&self, dst: usize, src: usize, count: usize) -> Result<()> {
        if dst == 0 || src == 0 {
            return Err(Error::InvalidNullPointer("pointer is null".into()));
        }
        if self.is_managed(dst) || self.is_managed(src) {
            return self.managed_memcpy(dst, src, count);
        }
        self.check_plain(src, count, false)?;
        self.check_plain(dst, count, true)?;
        // SAFETY: both ranges are mapped with the access needed (checked); memmove.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, count) };
        Ok(())
    }

    /// Host-synchronous `aclrtMemset` of `count` bytes at `ptr` to `value`, any memory: managed
    /// memory as [`Context::managed_memset`], otherwise plain process memory mapped writable
    /// for the whole range (as [`Context::host_memcpy`]).
    ///
    /// Errors (nothing written): `InvalidNullPointer` (100000); `AddressNotFound` (107000) for a
    /// range not mapped writable, running into managed memory or overflowing; as
    /// [`Context::managed_memset`] when `ptr` is managed.
    pub fn host_memset(&self, ptr: usize, value: u8, count: usize) -> Result<()> {
        if ptr == 0 {
            return Err(Error::InvalidNullPointer("pointer is null".into()));
        }
        if self.is_managed(ptr) {
            return self.managed_memset(ptr, value, count);
        }
        self.check_plain(ptr, count, true)?;
        // SAFETY: the range is mapped writable (checked).
        unsafe { std::ptr::write_bytes(ptr as *mut u8, value, count) };
        Ok(())
    }

    /// A plain (not managed) side of a host copy: no overflow, no managed byte, mapped with
    /// the access needed.
    fn check_plain(&self, p: usize, count: usize, write: bool) -> Result<()> {
        let end = p
            .checked_add(count)
            .ok_or_else(|| Error::AddressNotFound(format!("{} + {count:#x} overflows", Addr(p))))?;
        if let Some((b, _)) = self.driver_shared().managed.overlapping(p, end) {
            return Err(Error::AddressNotFound(format!(
                "[{}, {}) runs into the managed allocation at {}",
                Addr(p),
                Addr(end),
                Addr(b)
            )));
        }
        if count == 0 {
            return Ok(());
        }
        check_process_memory(p, count, write)
    }

    /// Host-synchronous copy of `data` into managed memory at `dst` (`aclrtMemcpy`,
    /// host-to-managed).
    ///
    /// Errors: as [`Context::managed_memset`].
    pub fn managed_write(&self, dst: usize, data: &[u8]) -> Result<()> {
        self.check_host_range(dst, data.len())?;
        // SAFETY: the range is inside a live managed allocation; `data` is not inside it
        // (a slice cannot alias memory we are about to write through a raw pointer safely,
        // and copy allows overlap anyway).
        unsafe { std::ptr::copy(data.as_ptr(), dst as *mut u8, data.len()) };
        Ok(())
    }

    /// Host-synchronous copy of managed memory at `src` into `out` (`aclrtMemcpy`,
    /// managed-to-host).
    ///
    /// Errors: as [`Context::managed_memset`].
    pub fn managed_read(&self, src: usize, out: &mut [u8]) -> Result<()> {
        self.check_host_range(src, out.len())?;
        // SAFETY: the range is inside a live managed allocation.
        unsafe { std::ptr::copy(src as *const u8, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn check_host_range(&self, ptr: usize, count: usize) -> Result<()> {
        if ptr == 0 {
            return Err(Error::InvalidNullPointer("pointer is null".into()));
        }
        let core = self.managed()?;
        let st = core.state.lock();
        core.check_range(&st, ptr, count)
    }

    /// Applies advice to `[ptr, ptr+size)` (`aclrtMemManagedAdvise`); see [`Advice`] for what
    /// each does. `location` is ignored by `SET_READ_MOSTLY` and `UNSET_PREFERRED_LOCATION`;
    /// `UNSET_READ_MOSTLY` takes INVALID as the host.
    ///
    /// Errors (nothing changed): `InvalidNullPointer` / `InvalidSize` (100000) for null / 0;
    /// `UnsupportedSize` (107000) for a size that is not a multiple of 2 MiB or over 3 TiB;
    /// `AddressNotFound` (107000) unless the range is inside one managed allocation;
    /// `UnsupportedAlignment` (107008) for a pointer not 2 MiB-aligned; `InvalidArgument`
    /// (107000) for an INVALID location where one is needed, a device id that is not a device, a
    /// NUMA node that does not exist, or a preferred location refused because pages are mapped
    /// elsewhere; `OutOfDeviceMemory` (207001) if the device an eager step needs cannot take
    /// the pages (`SET_PREFERRED_LOCATION`: the whole range at once, next to the device's
    /// other memory and pages in use by running work; `UNSET_READ_MOSTLY` / `SET_ACCESSED_BY`
    /// to a device: not even one page, the device being full of memory that is not an
    /// evictable managed page); `UnsupportedFeature` (207000) where managed memory is
    /// unavailable. Every refusal is decided before any page moves or any advice is recorded.
    /// Only a failure of the platform itself in the middle (the OS refusing a mapping) can
    /// leave pages moved; the advice is then still not recorded, `SET_READ_MOSTLY` takes its
    /// read-only copies back, and no data is lost.
    ///
    /// `ptr` and `size` in bytes, both multiples of 2 MiB ([`MANAGED_PAGE_SIZE`]).
    pub fn mem_advise(
        &self,
        ptr: usize,
        size: usize,
        advice: Advice,
        location: Location,
    ) -> Result<()> {
        let core = self.managed()?;
        let mut st = core.state.lock();
        check_advise_args(core, &st, ptr, size)?;
        // Advice may move any page of the range: wait for work using them.
        core.wait_pins(&mut st, &[(ptr, size, None, false)])?;
        let pages: Vec<usize> = (ptr..ptr + size).step_by(PAGE).collect();
        // Every call below first checks everything that can be refused (arguments, the
        // preferred-location rules, device room), then moves pages, then changes the advice
        // bookkeeping once every move has succeeded: a refused call changes nothing.
        match advice {
            Advice::SetReadMostly => {
                // The read-only host copies first; if the platform refuses one, the copies
                // made so far are taken back and the counters restored.
                let stats = st.stats.clone();
                let mut done: Vec<(usize, bool)> = Vec::new();
                for &a in &pages {
                    let p = core.page(&st, a);
                    let r = if p.host {
                        if p.host_ro {
                            Ok(())
                        } else {
                            // SAFETY: present page of ours.
                            unsafe { core.ops.host_protect(a, PAGE, true) }.map(|()| {
                                core.page_mut(&mut st, a).host_ro = true;
                                done.push((a, false));
                            })
                        }
                    } else {
                        core.install_host_from(&mut st, a, p.on_device(), true)
                            .map(|()| done.push((a, true)))
                    };
                    if let Err(e) = r {
                        core.undo_read_only_copies(&mut st, &done);
                        st.stats = stats;
                        return Err(e);
                    }
                }
                for &a in &pages {
                    core.page_mut(&mut st, a).read_mostly = true;
                }
            }
            Advice::UnsetReadMostly => {
                let loc = match location {
                    Location::Invalid => Loc::Host,
                    l => core.resolve(l, "UNSET_READ_MOSTLY")?,
                };
                let todo: Vec<usize> = pages
                    .iter()
                    .copied()
                    .filter(|&a| {
                        let p = core.page_ref(&st, a);
                        p.read_mostly && p.copies() > 0
                    })
                    .collect();
                if let Loc::Device(d) = loc {
                    core.check_room_one_by_one(&st, d, &todo, "UNSET_READ_MOSTLY")?;
                }
                for &a in &todo {
                    core.ensure_at(&mut st, a, loc, true)?;
                }
                for &a in &pages {
                    core.page_mut(&mut st, a).read_mostly = false;
                }
            }
            Advice::SetPreferredLocation => {
                let loc = core.resolve(location, "SET_PREFERRED_LOCATION")?;
                // Validate every page first: a refused call changes nothing.
                for &a in &pages {
                    let p = core.page_ref(&st, a);
                    if p.read_mostly {
                        continue;
                    }
                    match loc {
                        Loc::Host | Loc::Numa(_) => {
                            if let Some(d) = p.on_device() {
                                return Err(Error::InvalidArgument(format!(
                                    "SET_PREFERRED_LOCATION to the host: page {} is mapped on \
                                     device {d}",
                                    Addr(a)
                                )));
                            }
                        }
                        Loc::Device(d) => {
                            if p.host {
                                return Err(Error::InvalidArgument(format!(
                                    "SET_PREFERRED_LOCATION to device {d}: page {} is mapped on \
                                     the host",
                                    Addr(a)
                                )));
                            }
                            if let Some(e) = p.on_device().filter(|&e| e != d) {
                                return Err(Error::InvalidArgument(format!(
                                    "SET_PREFERRED_LOCATION to device {d}: page {} is mapped on \
                                     device {e}",
                                    Addr(a)
                                )));
                            }
                        }
                    }
                }
                if let Loc::Device(d) = loc {
                    // Every page of the range ends up on the device at once (none of them can be
                    // evicted for another): the pages not there yet must fit in the device's
                    // free capacity plus the managed pages of other ranges it may evict.
                    let di = d as usize;
                    let need = pages
                        .iter()
                        .filter(|&&a| core.page_ref(&st, a).slots[di].is_none())
                        .count() as u64;
                    let room = core.room_pages(&st, d, ptr..ptr + size);
                    if need > room {
                        return Err(Error::OutOfDeviceMemory(format!(
                            "SET_PREFERRED_LOCATION to device {d}: {need} pages of the range are \
                             not on the device and it has room for {room} (its other memory, USM \
                             allocations and pages in use by running work, stays)"
                        )));
                    }
                }
                for &a in &pages {
                    let rm = core.page_ref(&st, a).read_mostly;
                    match loc {
                        Loc::Host | Loc::Numa(_) if !rm => {
                            core.ensure_host(&mut st, a, false)?;
                        }
                        Loc::Device(d) => {
                            core.ensure_device(&mut st, a, d, false, &pages)?;
                        }
                        _ => {}
                    }
                }
                for &a in &pages {
                    core.page_mut(&mut st, a).preferred = Some(loc);
                }
            }
            Advice::UnsetPreferredLocation => {
                for &a in &pages {
                    core.page_mut(&mut st, a).preferred = None;
                }
            }
            Advice::SetAccessedBy => {
                let loc = core.resolve(location, "SET_ACCESSED_BY")?;
                let place = |l: Loc| l.device();
                // Pages preferring the same place are populated (mapped) there at once.
                let todo: Vec<usize> = pages
                    .iter()
                    .copied()
                    .filter(|&a| {
                        core.page_ref(&st, a)
                            .preferred
                            .is_some_and(|pl| place(pl) == place(loc))
                    })
                    .collect();
                if let Loc::Device(d) = loc {
                    core.check_room_one_by_one(&st, d, &todo, "SET_ACCESSED_BY")?;
                }
                for &a in &todo {
                    core.ensure_at(&mut st, a, loc, false)?;
                }
                for &a in &pages {
                    core.page_mut(&mut st, a).accessed_by.insert(loc);
                }
            }
            Advice::UnsetAccessedBy => {
                let loc = core.resolve(location, "UNSET_ACCESSED_BY")?;
                for &a in &pages {
                    core.page_mut(&mut st, a).accessed_by.remove(&loc);
                }
            }
        }
        Ok(())
    }

    /// Prefetches `[ptr, ptr+size)` to `location` in order on `stream`
    /// (`aclrtMemManagedPrefetchAsync`): when the stream reaches it, every page is migrated
    /// there (read-mostly pages get a read-only copy there, keeping the others; fresh pages are
    /// populated there). `LAST_PREFETCH_LOCATION` records the request at once.
    ///
    /// Errors (nothing queued or recorded): `InvalidEnumeration` (100000) unless `flags` is 0;
    /// then as [`Context::mem_advise`] for pointer, size, range and alignment; `InvalidArgument`
    /// (107000) for an INVALID location, a bad device id or NUMA node; `InvalidArgument` for a
    /// stream of another driver. At run time (reported by [`Stream::synchronize`]):
    /// `OutOfDeviceMemory` (207001) if the device cannot take a single page (full of memory
    /// that is not an evictable managed page): nothing moves, `LAST_PREFETCH_LOCATION` keeps
    /// the request (it records requests, not completion); `AddressNotFound` if the memory was
    /// freed before the prefetch ran.
    ///
    /// `ptr` and `size` in bytes, both multiples of 2 MiB ([`MANAGED_PAGE_SIZE`]). A prefetch
    /// larger than the device leaves its last pages there (earlier ones are evicted).
    pub fn mem_prefetch(
        &self,
        ptr: usize,
        size: usize,
        location: Location,
        flags: u32,
        stream: &Stream,
    ) -> Result<()> {
        if flags != 0 {
            return Err(Error::InvalidEnumeration(format!(
                "prefetch flags {flags:#x} must be 0"
            )));
        }
        let core = self.managed()?;
        if !Arc::ptr_eq(core, &stream.core) {
            return Err(Error::InvalidArgument(
                "the stream belongs to another driver".into(),
            ));
        }
        let loc = {
            let mut st = core.state.lock();
            check_advise_args(core, &st, ptr, size)?;
            let loc = core.resolve(location, "a prefetch")?;
            for a in (ptr..ptr + size).step_by(PAGE) {
                core.page_mut(&mut st, a).last_prefetch = Some(loc);
            }
            loc
        };
        stream.enqueue(move |c| {
            let mut st = c.state.lock();
            c.wait_pins(&mut st, &[(ptr, size, loc.device(), false)])?;
            match loc.device() {
                None => c.prefetch_to_host(&mut st, ptr, size),
                Some(d) => c.prefetch_to_device(&mut st, ptr, size, d),
            }
        });
        Ok(())
    }

    /// One attribute of `[ptr, ptr+size)` into `data` (`aclrtMemManagedGetAttr`), as native
    /// 32-bit integers; `data.len()` is `dataSize`. Every page the range overlaps counts; see
    /// [`RangeAttribute`] for the answers.
    ///
    /// Errors: `InvalidNullPointer` (100000) for a null pointer; `InvalidSize` (100000) for size
    /// 0; `UnsupportedSize` (107000) over 3 TiB or for a `dataSize` its attribute does not
    /// allow (4, or a non-zero multiple of 4 for ACCESSED_BY); `AddressNotFound` (107000)
    /// unless the range is inside one managed allocation (or `ptr + size` overflows);
    /// `UnsupportedFeature` (207000) where managed memory is unavailable. Nothing is written on
    /// error. `size` in bytes, no alignment rule; any `dataSize` allowed is written in full
    /// (ACCESSED_BY padded with -2), without allocating.
    pub fn managed_get_attr(
        &self,
        attribute: RangeAttribute,
        ptr: usize,
        size: usize,
        data: &mut [u8],
    ) -> Result<()> {
        let core = self.managed()?;
        let st = core.state.lock();
        get_attr_locked(core, &st, attribute, ptr, size, data)
    }

    /// Several attributes at once (`aclrtMemManagedGetAttrs`): `data[i]` receives
    /// `attributes[i]`. All are checked before any is written.
    ///
    /// Errors: `InvalidSize` (100000) for no attribute or a count mismatch; then as
    /// [`Context::managed_get_attr`] for each.
    pub fn managed_get_attrs(
        &self,
        attributes: &[RangeAttribute],
        ptr: usize,
        size: usize,
        data: &mut [&mut [u8]],
    ) -> Result<()> {
        if attributes.is_empty() || attributes.len() != data.len() {
            return Err(Error::InvalidSize(format!(
                "{} attributes and {} data buffers",
                attributes.len(),
                data.len()
            )));
        }
        let core = self.managed()?;
        let st = core.state.lock();
        for (a, d) in attributes.iter().zip(data.iter()) {
            check_data_size(*a, d.len())?;
        }
        for (a, d) in attributes.iter().zip(data.iter_mut()) {
            get_attr_locked(core, &st, *a, ptr, size, d)?;
        }
        Ok(())
    }

    /// One 4-byte attribute as an `i32` (a convenience over [`Context::managed_get_attr`] with
    /// `dataSize` 4, `aclrtMemManagedGetAttr`). For ACCESSED_BY it gives the first slot (-2 if
    /// none). `size` in bytes, no alignment rule.
    ///
    /// Errors: as [`Context::managed_get_attr`]: `InvalidNullPointer` / `InvalidSize` (100000)
    /// for a null pointer / size 0; `UnsupportedSize` (107000) over 3 TiB; `AddressNotFound`
    /// (107000) unless the range is inside one managed allocation; `UnsupportedFeature`
    /// (207000) where managed memory is unavailable.
    pub fn managed_attr_i32(
        &self,
        attribute: RangeAttribute,
        ptr: usize,
        size: usize,
    ) -> Result<i32> {
        let mut b = [0u8; 4];
        self.managed_get_attr(attribute, ptr, size, &mut b)?;
        Ok(i32::from_ne_bytes(b))
    }

    /// Most `slots` [`Context::managed_accessed_by`] answers (1 Mi entries, 4 MiB); larger
    /// buffers go through [`Context::managed_get_attr`], which writes the caller's buffer.
    pub const MAX_ACCESSED_BY_SLOTS: usize = 1 << 20;

    /// ACCESSED_BY of `[ptr, ptr+size)` (`aclrtMemManagedGetAttr` with `dataSize` = `slots` *
    /// 4): the ids (device id, -1 host, NUMA node id) advised over the whole range, in `slots`
    /// entries, padded with -2 or truncated. `size` in bytes, no alignment rule.
    ///
    /// Errors: `UnsupportedSize` (107000) for `slots` 0 (dataSize 0) or over
    /// [`Context::MAX_ACCESSED_BY_SLOTS`] (use [`Context::managed_get_attr`] with a buffer of
    /// your own for more); then as [`Context::managed_attr_i32`].
    pub fn managed_accessed_by(&self, ptr: usize, size: usize, slots: usize) -> Result<Vec<i32>> {
        if slots == 0 || slots > Self::MAX_ACCESSED_BY_SLOTS {
            return Err(Error::UnsupportedSize(format!(
                "{slots} ACCESSED_BY slots: 1 to {} are answered here (dataSize a non-zero \
                 multiple of 4; larger buffers through managed_get_attr)",
                Self::MAX_ACCESSED_BY_SLOTS
            )));
        }
        let mut b = vec![0u8; slots * 4];
        self.managed_get_attr(RangeAttribute::AccessedBy, ptr, size, &mut b)?;
        Ok(b.chunks(4)
            .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Creates an in-order stream on `device` (`aclrtCreateStream` after `aclrtSetDevice`).
    ///
    /// Errors: `InvalidNullHandle` for a device of another driver; `UnsupportedFeature` (207000)
    /// where managed memory is unavailable; `OutOfHostMemory` if the engine cannot start.
    pub fn create_stream(&self, device: &Device) -> Result<Stream> {
        let core = self.managed()?.clone();
        Ok(Stream {
            queue: self.create_command_queue(device)?,
            core,
            error: Arc::default(),
        })
    }

    /// Reads `out.len()` bytes of managed memory at `src` from wherever each page lives now,
    /// without migrating anything or counting a fault (for tests, debuggers and demos; the
    /// host-synchronous read is [`Context::managed_read`]). A page that has never been touched
    /// reads as zeros.
    ///
    /// Errors: `InvalidNullPointer`; `AddressNotFound` (107000) for a range not inside one
    /// managed allocation; `Unknown` if the copies of a read-mostly page differ (a broken
    /// invariant, never expected).
    pub fn managed_peek(&self, src: usize, out: &mut [u8]) -> Result<()> {
        if src == 0 {
            return Err(Error::InvalidNullPointer("pointer is null".into()));
        }
        let core = self.managed()?;
        let st = core.state.lock();
        core.check_range(&st, src, out.len())?;
        let mut at = 0;
        while at < out.len() {
            let a = src + at;
            let page = a & !(PAGE - 1);
            let n = (page + PAGE - a).min(out.len() - at);
            let p = core.page(&st, page);
            let mut sources: Vec<usize> = Vec::new();
            if p.host {
                sources.push(a);
            }
            for (d, s) in p.slots.iter().enumerate() {
                if s.is_some() {
                    sources.push(core.mirror(&st, a, d as u32));
                }
            }
            let dst = &mut out[at..at + n];
            match sources.first() {
                // SAFETY: present host pages and mapped mirror pages do not fault, and cannot
                // change or go while the lock is held (host writers to a page with other
                // copies are write-protected).
                Some(&s0) => unsafe {
                    std::ptr::copy_nonoverlapping(s0 as *const u8, dst.as_mut_ptr(), n)
                },
                None => dst.fill(0),
            }
            for &s in sources.iter().skip(1) {
                // SAFETY: as above.
                let other = unsafe { std::slice::from_raw_parts(s as *const u8, n) };
                if other != &*dst {
                    return Err(Error::Unknown(format!(
                        "the copies of read-mostly page {} differ",
                        Addr(page)
                    )));
                }
            }
            at += n;
        }
        Ok(())
    }

    /// Where the page holding `ptr` lives now: the host, devices with a copy. For tests and
    /// demos; `None` if `ptr` is not managed or the page has never been touched.
    pub fn managed_residency(&self, ptr: usize) -> Option<Residency> {
        let core = self.driver_shared().managed.existing()?;
        let st = core.state.lock();
        core.find(&st, ptr)?;
        let p = core.page(&st, ptr & !(PAGE - 1));
        (p.copies() > 0).then(|| Residency {
            host: p.host,
            host_read_only: p.host_ro,
            devices: p
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.is_some())
                .map(|(d, _)| d as u32)
                .collect(),
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

fn check_data_size(attribute: RangeAttribute, n: usize) -> Result<()> {
    let ok = match attribute {
        RangeAttribute::AccessedBy => n > 0 && n.is_multiple_of(4),
        _ => n == 4,
    };
    if ok {
        Ok(())
    } else {
        Err(Error::UnsupportedSize(format!(
            "dataSize {n} is not allowed for {attribute:?} ({})",
            if attribute == RangeAttribute::AccessedBy {
                "a non-zero multiple of 4"
            } else {
                "must be 4"
            }
        )))
    }
}

fn get_attr_locked(
    core: &Core,
    st: &State,
    attribute: RangeAttribute,
    ptr: usize,
    size: usize,
    data: &mut [u8],
) -> Result<()> {
    if ptr == 0 {
        return Err(Error::InvalidNullPointer("pointer is null".into()));
    }
    if size == 0 {
        return Err(Error::InvalidSize("size is 0".into()));
    }
    if size as u64 > MAX_MANAGED_PER_PROCESS {
        return Err(Error::UnsupportedSize(format!(
            "size {size:#x} exceeds 3 TiB"
        )));
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

impl Driver {
    /// Counters of the driver's managed memory: faults, pages and bytes migrated each way, per
    /// device (hetmem's own query; ACL has no call for it). All zero before the first managed
    /// allocation. Never fails.
    pub fn managed_stats(&self) -> ManagedStats {
        match self.shared.managed.existing() {
            Some(c) => c.state.lock().stats.clone(),
            None => ManagedStats {
                devices: vec![ManagedDeviceStats::default(); self.shared.backend.devices().len()],
                ..Default::default()
            },
        }
    }
}
