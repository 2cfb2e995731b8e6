//! The state of managed memory: the records every ACL rule of the family reads and writes.
//!
//! - [`ManagedState`]: one per driver, made with the driver; its [`Core`] is made on the first
//!   managed call (the platform check happens then: `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000)
//!   where the backend has no managed residency, the message saying why).
//! - [`Core`]: the residency backend (reached only from the semantics layer), the device count,
//!   and one mutex over [`State`]: the live allocations ([`Alloc`], each with one [`PageAdvice`]
//!   per 2 MiB page: what the eight range attributes answer) and the stream operations queued on
//!   each ([`QueuedHold`]: `aclrtFree` of managed memory waits until none is left).
//! - [`Loc`]: a resolved ACL location, as the attributes give it back and as the backend's
//!   [`Place`].
//! - The 2 MiB managed page ([`MANAGED_PAGE_SIZE`]), the 3 TiB process limit
//!   ([`MAX_MANAGED_PER_PROCESS`]) and the process-wide count it is checked against.
//! - The device accounting the residency backend charges device pages to ([`DeviceRoom`] over
//!   [`DeviceMemory`]).
//!
//! The rules that read these records are in [`crate::semantics::managed::rules`]; the calls in
//! the files the [module docs](crate::semantics::managed) list.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{Condvar, Mutex};

use crate::backend::managed::{DeviceRoom, ManagedResidency, Place};
use crate::error::{AclCode, Error, Result};
use crate::semantics::capacity::DeviceMemory;
use crate::spec::location_type;

/// The managed page: allocation rounding, advice / prefetch granularity and migration unit
/// (2 MiB).
pub const MANAGED_PAGE_SIZE: usize = 2 << 20;
/// Most managed memory one process may hold at once (3 TiB).
pub const MAX_MANAGED_PER_PROCESS: u64 = 3 << 40;

/// Managed bytes allocated in this process (all drivers), for the 3 TiB limit.
pub(in crate::semantics) static PROCESS_MANAGED: AtomicU64 = AtomicU64::new(0);

pub(in crate::semantics) const PAGE: usize = MANAGED_PAGE_SIZE;

/// A resolved place: the host (optionally a NUMA node, for the attribute answers) or a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(in crate::semantics) enum Loc {
    Device(u32),
    Host,
    Numa(u32),
}

impl Loc {
    /// The id the attribute queries give: device id, -1 host, node id.
    pub(in crate::semantics) fn id(self) -> i32 {
        match self {
            Loc::Device(d) => d as i32,
            Loc::Host => -1,
            Loc::Numa(n) => n as i32,
        }
    }
    pub(in crate::semantics) fn ty(self) -> u32 {
        match self {
            Loc::Device(_) => location_type::DEVICE,
            Loc::Host => location_type::HOST,
            Loc::Numa(_) => location_type::HOST_NUMA,
        }
    }
    /// The place the backend moves pages to.
    pub(in crate::semantics) fn place(self) -> Place {
        match self {
            Loc::Device(d) => Place::Device(d),
            Loc::Host => Place::Host,
            Loc::Numa(n) => Place::HostNuma(n),
        }
    }
    /// The `*_ID` answer: only devices and nodes have one.
    pub(in crate::semantics) fn id_only(self) -> i32 {
        match self {
            Loc::Host => -2,
            other => other.id(),
        }
    }
}

/// The ACL bookkeeping of one managed page: what the range attributes answer.
#[derive(Debug, Clone, Default)]
pub(in crate::semantics) struct PageAdvice {
    pub(in crate::semantics) read_mostly: bool,
    pub(in crate::semantics) preferred: Option<Loc>,
    pub(in crate::semantics) accessed_by: BTreeSet<Loc>,
    /// The last prefetch requested (recorded when queued, not when run).
    pub(in crate::semantics) last_prefetch: Option<Loc>,
}

/// One live managed allocation.
#[derive(Debug)]
pub(in crate::semantics) struct Alloc {
    /// Bytes (a multiple of 2 MiB).
    pub(in crate::semantics) size: usize,
    /// The context that allocated it.
    pub(in crate::semantics) ctx: u64,
    pub(in crate::semantics) pages: Vec<PageAdvice>,
}

#[derive(Debug, Default)]
pub(in crate::semantics) struct State {
    /// Live allocations by base.
    pub(in crate::semantics) allocs: BTreeMap<usize, Alloc>,
    /// Stream operations queued and not yet run, per managed allocation (base -> count; no
    /// entry for 0): a free of the allocation waits until its count is 0 ([`QueuedHold`]).
    pub(in crate::semantics) queued: BTreeMap<usize, usize>,
}

/// One queued stream operation's hold on the managed allocations it references, taken when
/// it is queued (under the state lock, with the range checks) and released when it has run
/// (or is dropped unrun): a managed free ([`crate::semantics::managed::alloc::free`]) waits
/// until no hold on its allocation is left, so work queued before a free runs on live memory.
#[derive(Debug)]
pub(in crate::semantics) struct QueuedHold {
    core: Arc<Core>,
    bases: Vec<usize>,
}

impl QueuedHold {
    /// Holds the allocations containing `addrs` (each inside a live allocation, checked by the
    /// caller under the same hold of `st`; duplicates count once).
    pub(in crate::semantics) fn take(
        core: &Arc<Core>,
        st: &mut State,
        addrs: &[usize],
    ) -> QueuedHold {
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
pub(in crate::semantics) struct Core {
    /// Where pages live and how they move: reached only from the semantics layer.
    pub(in crate::semantics) res: Arc<dyn ManagedResidency>,
    /// Number of devices (the ids a DEVICE location accepts).
    pub(in crate::semantics) devices: usize,
    pub(in crate::semantics) state: Mutex<State>,
    /// Signalled (with `state`) whenever a queued stream operation's [`QueuedHold`] is
    /// released.
    pub(in crate::semantics) released: Condvar,
}

/// Per-driver managed memory: made on the first allocation (the platform check happens then).
#[derive(Debug)]
pub(crate) struct ManagedState {
    devmem: Arc<DeviceMemory>,
    core: OnceLock<std::result::Result<Arc<Core>, String>>,
    init: Mutex<()>,
}

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

impl ManagedState {
    pub(crate) fn new(devmem: Arc<DeviceMemory>) -> ManagedState {
        ManagedState {
            devmem,
            core: OnceLock::new(),
            init: Mutex::new(()),
        }
    }

    /// The driver's managed memory, made on the first call (`backend.managed`).
    ///
    /// Errors: `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000) where the platform has no managed
    /// residency (the message says why), on this and every later call.
    pub(in crate::semantics) fn core(
        &self,
        backend: &dyn crate::backend::Backend,
    ) -> Result<&Arc<Core>> {
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

    /// The driver's managed memory if it has been made (never makes it).
    pub(in crate::semantics) fn existing(&self) -> Option<&Arc<Core>> {
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
    pub(in crate::semantics) fn find(&self, st: &State, addr: usize) -> Option<(usize, usize)> {
        let (&base, a) = st.allocs.range(..=addr).next_back()?;
        (addr < base + a.size).then_some((base, (addr - base) / PAGE))
    }

    /// The advice records of the pages of `[ptr, ptr+size)` (inside one live allocation), or
    /// nothing if it went meanwhile.
    pub(in crate::semantics) fn advice_mut<'a>(
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

    /// Takes allocation `base` out of the table (its memory stays until the backend frees it).
    pub(in crate::semantics) fn forget(&self, st: &mut State, base: usize) {
        if let Some(a) = st.allocs.remove(&base) {
            PROCESS_MANAGED.fetch_sub(a.size as u64, Ordering::AcqRel);
        }
    }
}
