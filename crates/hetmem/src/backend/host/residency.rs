//! The host backend's residency engine: a software UVM driver over `userfaultfd(2)`
//! ([`super::managed`], through the private [`super::managed_ops::ManagedOps`]), implementing
//! [`ManagedResidency`] the way a GPU driver's unified memory does in hardware.
//!
//! # Residency
//! - The **managed page** is 2 MiB ([`PAGE`], the page size the semantics layer asks for): the
//!   unit of migration. One fault moves one whole page.
//! - A page has no copy until first touched (lazy population), then lives in **one place**:
//!   the host or one device. Host-resident pages are mapped in the managed range; every other
//!   page is absent there, so a host access faults and the fault thread migrates the page to
//!   the host before the access proceeds. Device-side operations (copies, fills, prefetches and
//!   prepared work) first migrate the pages they touch to their device, where they are reached
//!   through the device's *mirror* of the range.
//! - **Read-mostly** pages may have several copies, all read-only: a read where there is no
//!   copy adds one (host: a write-protected page); a write anywhere first drops every other
//!   copy and makes the written copy the only, writable one.
//! - **Oversubscription**: a device holds at most its capacity (shared with physical memory and
//!   USM allocations, through [`DeviceRoom`]). Migrating a page to a full device first evicts
//!   that device's least recently used managed page (pages that prefer the device go last) to
//!   the host. Only if nothing of the device can be evicted does the operation fail
//!   ([`ResidencyError::DeviceFull`]).
//!
//! # Staging ahead (the sequential-fault prefetcher)
//! A host fault that moves a page from a device costs the copy of its 2 MiB and the install of
//! its 512 page-table entries (`UFFDIO_CONTINUE`, about a third of the copy). The install runs
//! on the platform's mapper thread while the fault thread copies the next bytes
//! ([`ManagedOps::host_install_overlapped`]: the faulting page in pieces, so its waiter does
//! not wait for both in full), and when host faults on an allocation come in address order
//! (this fault is on the page after the previous one, as in a sequential walk) the fault
//! thread also copies the *next* page's bytes to the host while this page is being installed:
//! that page is **staged** ([`Page::staged`]). Its own fault then has only the install left,
//! which again overlaps the staging of the page after it, so a sequential walk runs at the
//! speed of the copy alone. This is the role NVIDIA's UVM driver gives its prefetcher (migrate
//! what an access pattern will fault on next), kept to what the ACL rules allow: a staged page
//! does **not** move. It stays where it is (on its device, charged to the device's room,
//! counted there) until its own host fault, which is still one fault and one page moved in
//! every counter; only the copy happened earlier. Anything that could change the device copy
//! (pinned work, a device-side operation, a move) discards the staged bytes, which are then
//! copied again at the fault. Random-order faults stage nothing.
//!
//! # Locking and pinning
//! One mutex per driver (`state`) guards every residency decision and migration; it is never
//! held while device work or a device copy / fill runs. Such work first migrates its pages
//! under the lock, then **pins** them (a count per page) and drops the lock for the work; the
//! pins drop, under the lock, when it is done. A pinned page's copies never change:
//! - eviction skips it (a device full of pinned pages answers `DeviceFull`);
//! - a host fault on it is *deferred*: the fault thread records it and goes on with other
//!   faults; the faulting thread stays blocked until the last pin drops, when the unpinning
//!   thread resolves it (so nothing waits for the fault thread);
//! - prefetches, advice, frees (and shutdown) and device operations that would change it wait
//!   on a condition variable (lock released) for the pins to drop; device work that needs it
//!   exactly where it is (same device, nothing to move) runs alongside.
//!
//! The semantics layer never holds its own lock while calling a method of this engine that
//! waits, and `state` is never held while taking the semantics layer's lock, so the only cycle
//! left is one the caller builds: work that waits for a thread that itself waits for that
//! work's pages.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, MutexGuard};

use super::managed_ops::{Fault, FaultSink, FaultThread, HostSource, ManagedOps, ManagedRange};
use crate::backend::managed::{
    DeviceOperand, DeviceRoom, ManagedDeviceStats, ManagedResidency, ManagedStats, PageView, Place,
    Residency, ResidencyAdvice, ResidencyError, WorkBuffer,
};

/// Formats an address as `0x…` for messages (the backend keeps off the spec layer's types).
struct Addr(usize);

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

type Result<T> = std::result::Result<T, ResidencyError>;

/// The managed page: migration unit (2 MiB).
pub(crate) const PAGE: usize = 2 << 20;

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
    /// The preferred place (advice): pages preferring a device are evicted from it last, and
    /// `SetAccessedBy` populates pages preferring the same place.
    preferred: Option<Place>,
    /// LRU tick per device.
    tick: Vec<u64>,
    /// Device-side operations using the page right now (launched work, a copy or fill segment)
    /// with the lock dropped: while non-zero the page's residency may not change (see
    /// "Pinning" in the module docs).
    pins: u32,
    /// The host memory behind this absent page holds its bytes, copied there ahead of its host
    /// fault by the sequential-fault prefetcher ("Staging ahead" in the module docs): the page
    /// is on one device only, and nothing has been able to write it since. Cleared by anything
    /// that may change the page's copies or let a device write them.
    staged: bool,
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
            tick: vec![0; devices],
            pins: 0,
            staged: false,
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
    pages: Vec<Page>,
    /// The page a host fault in address order comes to next: the one after the page of the
    /// last host fault on this allocation (`usize::MAX` before the first).
    next_fault: usize,
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

/// The residency engine of one driver: state, the platform's operations and the fault sink.
#[derive(Debug)]
struct Core {
    ops: Arc<dyn ManagedOps>,
    room: Arc<dyn DeviceRoom>,
    state: Mutex<State>,
    /// Signalled (with `state`) whenever a page's pin count drops.
    unpinned: Condvar,
}

/// One operand of a device-side operation.
#[derive(Debug, Clone, Copy)]
struct DevOperand {
    addr: usize,
    write: bool,
    /// Managed memory (migrated to the device); else memory the driver knows, used in place
    /// and held live by the caller.
    managed: bool,
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
        let ahead = self.stage_candidate(&mut st, page);
        self.resolve_fault(&mut st, page, write, ahead);
    }
}

impl Core {
    /// Makes `page` accessible on the host for a faulting thread (and wakes it), staging page
    /// `ahead` meanwhile if the install moves `page` from a device.
    fn resolve_fault(&self, st: &mut State, page: usize, write: bool, ahead: Option<usize>) {
        match self.ensure_host_ahead(st, page, write, ahead) {
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
            let p = self.page_mut(st, a);
            p.pins += 1;
            // Pinned work may write the device copy: bytes staged from it are stale.
            p.staged = false;
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
                    self.resolve_fault(st, a, write, None);
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
        p.staged = false;
        let Some(slot) = p.slots[d as usize].take() else {
            return;
        };
        p.cached[d as usize] = Some(slot);
        let t = p.tick[d as usize];
        st.cached[d as usize].insert(slot, addr);
        st.lru[d as usize].remove(&(t, addr));
        self.room.give_back(d, PAGE as u64);
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
            if self.room.take(d, PAGE as u64) {
                if let Some(s) = self.page_mut(st, addr).cached[di].take() {
                    st.cached[di].remove(&s);
                    return Ok((s, true));
                }
                if let Some(s) = st.free_slots[di].pop() {
                    return Ok((s, false));
                }
                if (st.next_slot[di] as u64 + 1) * PAGE as u64 <= self.room.capacity(d) {
                    st.next_slot[di] += 1;
                    return Ok((st.next_slot[di] - 1, false));
                }
                // Every slot is in use or cached: take a cached one from its page.
                let owner = st.cached[di].first_key_value().map(|(_, &a)| a);
                let Some(owner) = owner else {
                    self.room.give_back(d, PAGE as u64);
                    return Err(ResidencyError::DeviceFull(format!(
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
                    p.pins == 0 && (!prefer_skip || p.preferred != Some(Place::Device(d)))
                })
            };
            let victim = pick(true, st).or_else(|| pick(false, st));
            let Some(v) = victim else {
                return Err(ResidencyError::DeviceFull(format!(
                    "device {d} is full ({:#x} of {:#x} bytes used) and holds no managed page \
                     that can be evicted (pages in use by running work stay)",
                    self.room.used(d),
                    self.room.capacity(d)
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
        p.staged = false;
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
            r.map_err(ResidencyError::from)
        };
        for a in (ptr..ptr + size).step_by(PAGE) {
            let p = self.page(st, a);
            let movable = p.host && !p.host_ro && !p.read_mostly && p.on_device().is_none();
            if !movable {
                flush(&mut pending)?;
                self.ensure_device(st, a, d, false, &[a])?;
                continue;
            }
            if self.room.used(d) + PAGE as u64 > self.room.capacity(d) {
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
                    self.room.give_back(d, PAGE as u64);
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
    fn ensure_host(&self, st: &mut State, addr: usize, write: bool) -> Result<bool> {
        self.ensure_host_ahead(st, addr, write, None)
    }

    /// [`Core::ensure_host`]; when that moves the page from a device (its only copy, or a
    /// write), `ahead` (a page [`Core::stage_candidate`] chose) is staged while the page's
    /// page-table entries are installed, and the page's own bytes come from its staged copy if
    /// it has one.
    fn ensure_host_ahead(
        &self,
        st: &mut State,
        addr: usize,
        write: bool,
        ahead: Option<usize>,
    ) -> Result<bool> {
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
        match from {
            Some(d) if exclusive => {
                let src = if p.staged {
                    HostSource::Staged
                } else {
                    HostSource::Copy(self.mirror(st, addr, d))
                };
                let ahead = ahead.and_then(|b| {
                    let bd = self.page_ref(st, b).on_device()?;
                    Some((b, self.mirror(st, b, bd)))
                });
                // SAFETY: the page is absent on the host and its source mirror page mapped (or
                // its bytes staged, unchanged since); `ahead` is absent on the host, on one
                // device only (its mirror page mapped) and nothing uses its host memory.
                unsafe { self.ops.host_install_overlapped(addr, src, PAGE, ahead)? };
                if src == HostSource::Staged {
                    st.stats.staged_installs += 1;
                }
                self.note_host_install(st, addr, from, false);
                if let Some((b, _)) = ahead {
                    self.page_mut(st, b).staged = true;
                    st.stats.pages_staged += 1;
                }
            }
            _ => self.install_host_from(st, addr, from, !exclusive)?,
        }
        if exclusive {
            for d in 0..p.slots.len() as u32 {
                self.drop_device_copy(st, addr, d);
            }
        }
        Ok(true)
    }

    /// The sequential-fault prefetcher's decision on a host fault on `page` (not yet resolved):
    /// the page to stage ahead, if any. A fault comes *in order* when it is on the page after
    /// the allocation's last host fault; then the page after it is staged if it is inside the
    /// allocation, lives on one device only (not read-mostly, not on the host), is not in use
    /// by device work and is not staged already. Records `page` as the allocation's last fault.
    ///
    /// One page ahead is enough: staging runs on the fault thread while the mapper thread
    /// installs the faulting page, so the next page is ready as soon as the copy (the slower
    /// half) is done; a wider window would only queue more copies behind the same one.
    fn stage_candidate(&self, st: &mut State, page: usize) -> Option<usize> {
        let (base, _) = self.find(st, page)?;
        let a = st.allocs.get_mut(&base).expect("live");
        let in_order = a.next_fault == page;
        a.next_fault = page + PAGE;
        let next = page + PAGE;
        if !in_order || next >= base + a.range.size {
            return None;
        }
        let p = self.page_ref(st, next);
        (!p.host && !p.read_mostly && !p.staged && p.pins == 0 && p.copies() == 1).then_some(next)
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
        // The page changes or is used on a device: bytes staged for it may go stale.
        self.page_mut(st, addr).staged = false;
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
                    self.room.give_back(d, PAGE as u64);
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
    fn room_pages(&self, st: &State, d: u32, keep: std::ops::Range<usize>) -> u64 {
        let di = d as usize;
        let free = self.room.capacity(d).saturating_sub(self.room.used(d)) / PAGE as u64;
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
    fn check_room_one_by_one(&self, st: &State, d: u32, pages: &[usize], what: &str) -> Result<()> {
        let need = pages
            .iter()
            .any(|&a| self.page_ref(st, a).slots[d as usize].is_none());
        if need && self.room_pages(st, d, 0..0) == 0 {
            return Err(ResidencyError::DeviceFull(format!(
                "{what} to device {d}: the device is full ({:#x} of {:#x} bytes used) and holds \
                 no managed page that can be evicted",
                self.room.used(d),
                self.room.capacity(d)
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
    fn ensure_at(&self, st: &mut State, addr: usize, loc: Place, write: bool) -> Result<()> {
        match loc {
            Place::Device(d) => self.ensure_device(st, addr, d, write, &[addr]).map(|_| ()),
            Place::Host | Place::HostNuma(_) => self.ensure_host(st, addr, write).map(|_| ()),
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
        // SAFETY: the allocation is out of the table; no copy is mapped on any mirror.
        unsafe { self.ops.release(&a.range) };
        self.discard_free_slots(st);
    }

    /// Checks `[ptr, ptr+size)` lies inside one live allocation.
    fn check_range(&self, st: &State, ptr: usize, size: usize) -> Result<()> {
        let end = ptr.checked_add(size).ok_or_else(|| {
            ResidencyError::NotManaged(format!("{} + {size:#x} overflows", Addr(ptr)))
        })?;
        match st.allocs.range(..=ptr).next_back() {
            Some((&b, a)) if ptr < b + a.range.size && end <= b + a.range.size => Ok(()),
            Some((&b, a)) if ptr < b + a.range.size => Err(ResidencyError::NotManaged(format!(
                "[{}, {}) runs past the end {} of the managed allocation at {}",
                Addr(ptr),
                Addr(end),
                Addr(b + a.range.size),
                Addr(b)
            ))),
            _ => Err(ResidencyError::NotManaged(format!(
                "{} is not inside managed memory",
                Addr(ptr)
            ))),
        }
    }

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

/// The managed-page addresses `[ptr, ptr+len)` overlaps (none for `len` 0).
fn pages_of(ptr: usize, len: usize) -> impl Iterator<Item = usize> {
    let first = ptr & !(PAGE - 1);
    let end = ptr + len;
    (first..end).step_by(PAGE)
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

impl Core {
    /// Residency advice (see [`ManagedResidency::advise`]): waits for work using the range,
    /// lets `check` refuse, decides device room, then moves pages, then records the policy.
    fn advise(
        &self,
        ptr: usize,
        size: usize,
        advice: ResidencyAdvice,
        check: &mut dyn FnMut(&[PageView]) -> std::result::Result<(), String>,
    ) -> Result<()> {
        let mut st = self.state.lock();
        // Advice may move any page of the range: wait for work using them.
        self.wait_pins(&mut st, &[(ptr, size, None, false)])?;
        let pages: Vec<usize> = (ptr..ptr + size).step_by(PAGE).collect();
        let views: Vec<PageView> = pages
            .iter()
            .map(|&a| {
                let p = self.page_ref(&st, a);
                PageView {
                    addr: a,
                    read_mostly: p.read_mostly,
                    host: p.host,
                    device: p.on_device(),
                }
            })
            .collect();
        check(&views).map_err(ResidencyError::Refused)?;
        // Every arm first checks device room, then moves pages, then changes the policy once
        // every move has succeeded: a refused call changes nothing.
        match advice {
            ResidencyAdvice::SetReadMostly => {
                // The read-only host copies first; if the platform refuses one, the copies
                // made so far are taken back and the counters restored.
                let stats = st.stats.clone();
                let mut done: Vec<(usize, bool)> = Vec::new();
                for &a in &pages {
                    let p = self.page(&st, a);
                    let r = if p.host {
                        if p.host_ro {
                            Ok(())
                        } else {
                            // SAFETY: present page of ours.
                            unsafe { self.ops.host_protect(a, PAGE, true) }
                                .map(|()| {
                                    self.page_mut(&mut st, a).host_ro = true;
                                    done.push((a, false));
                                })
                                .map_err(ResidencyError::from)
                        }
                    } else {
                        self.install_host_from(&mut st, a, p.on_device(), true)
                            .map(|()| done.push((a, true)))
                    };
                    if let Err(e) = r {
                        self.undo_read_only_copies(&mut st, &done);
                        st.stats = stats;
                        return Err(e);
                    }
                }
                for &a in &pages {
                    self.page_mut(&mut st, a).read_mostly = true;
                }
            }
            ResidencyAdvice::UnsetReadMostly(loc) => {
                let todo: Vec<usize> = pages
                    .iter()
                    .copied()
                    .filter(|&a| {
                        let p = self.page_ref(&st, a);
                        p.read_mostly && p.copies() > 0
                    })
                    .collect();
                if let Place::Device(d) = loc {
                    self.check_room_one_by_one(&st, d, &todo, "UNSET_READ_MOSTLY")?;
                }
                for &a in &todo {
                    self.ensure_at(&mut st, a, loc, true)?;
                }
                for &a in &pages {
                    self.page_mut(&mut st, a).read_mostly = false;
                }
            }
            ResidencyAdvice::SetPreferredLocation(loc) => {
                if let Place::Device(d) = loc {
                    // Every page of the range ends up on the device at once (none of them can be
                    // evicted for another): the pages not there yet must fit in the device's
                    // free capacity plus the managed pages of other ranges it may evict.
                    let di = d as usize;
                    let need = pages
                        .iter()
                        .filter(|&&a| self.page_ref(&st, a).slots[di].is_none())
                        .count() as u64;
                    let room = self.room_pages(&st, d, ptr..ptr + size);
                    if need > room {
                        return Err(ResidencyError::DeviceFull(format!(
                            "SET_PREFERRED_LOCATION to device {d}: {need} pages of the range are \
                             not on the device and it has room for {room} (its other memory, USM \
                             allocations and pages in use by running work, stays)"
                        )));
                    }
                }
                for &a in &pages {
                    let rm = self.page_ref(&st, a).read_mostly;
                    match loc {
                        Place::Host | Place::HostNuma(_) if !rm => {
                            self.ensure_host(&mut st, a, false)?;
                        }
                        Place::Device(d) => {
                            self.ensure_device(&mut st, a, d, false, &pages)?;
                        }
                        _ => {}
                    }
                }
                for &a in &pages {
                    self.page_mut(&mut st, a).preferred = Some(loc);
                }
            }
            ResidencyAdvice::UnsetPreferredLocation => {
                for &a in &pages {
                    self.page_mut(&mut st, a).preferred = None;
                }
            }
            ResidencyAdvice::SetAccessedBy(loc) => {
                // Pages preferring the same place are populated (mapped) there at once.
                let todo: Vec<usize> = pages
                    .iter()
                    .copied()
                    .filter(|&a| {
                        self.page_ref(&st, a)
                            .preferred
                            .is_some_and(|pl| pl.device() == loc.device())
                    })
                    .collect();
                if let Place::Device(d) = loc {
                    self.check_room_one_by_one(&st, d, &todo, "SET_ACCESSED_BY")?;
                }
                for &a in &todo {
                    self.ensure_at(&mut st, a, loc, false)?;
                }
            }
            ResidencyAdvice::UnsetAccessedBy(_) => {}
        }
        Ok(())
    }
}

/// The pages `buffers` overlap, each once.
fn work_pages(buffers: &[WorkBuffer]) -> Vec<usize> {
    let mut keep: Vec<usize> = buffers
        .iter()
        .flat_map(|&(p, l, _)| pages_of(p, l))
        .collect();
    keep.sort_unstable();
    keep.dedup();
    keep
}

/// The host backend's [`ManagedResidency`]: the engine and the fault thread that feeds it
/// (stopped first on shutdown).
#[derive(Debug)]
pub(crate) struct HostResidency {
    core: Arc<Core>,
    thread: Mutex<Option<Box<dyn FaultThread>>>,
}

impl HostResidency {
    /// Starts the engine over `ops`, charging device pages to `room`, and its fault thread.
    /// Err: why managed memory is unavailable.
    pub(crate) fn start(
        ops: Arc<dyn ManagedOps>,
        room: Arc<dyn DeviceRoom>,
    ) -> std::result::Result<HostResidency, String> {
        let n = room.devices();
        let core = Arc::new(Core {
            ops: ops.clone(),
            room,
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
        Ok(HostResidency {
            core,
            thread: Mutex::new(Some(t)),
        })
    }
}

impl Drop for HostResidency {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl ManagedResidency for HostResidency {
    fn numa_nodes(&self) -> Vec<u32> {
        self.core.ops.numa_nodes()
    }

    fn current_numa_node(&self) -> u32 {
        self.core.ops.current_numa_node()
    }

    fn allocate(&self, size: usize, align: usize) -> crate::backend::Result<usize> {
        let c = &self.core;
        let range = c.ops.reserve(size, align)?;
        let base = range.host;
        let n = c.room.devices();
        let mut st = c.state.lock();
        st.stats.allocations += 1;
        st.stats.bytes += size as u64;
        st.allocs.insert(
            base,
            Alloc {
                pages: vec![Page::new(n); size / PAGE],
                next_fault: usize::MAX,
                range,
            },
        );
        Ok(base)
    }

    unsafe fn free(&self, base: usize) {
        let c = &self.core;
        let mut st = c.state.lock();
        let Some(size) = st.allocs.get(&base).map(|a| a.range.size) else {
            return;
        };
        // Work running on it finishes first (its pages are pinned).
        if c.wait_pins(&mut st, &[(base, size, None, false)]).is_ok() {
            c.free_locked(&mut st, base);
        }
    }

    fn prefetch(&self, ptr: usize, size: usize, to: Place) -> Result<()> {
        let c = &self.core;
        let mut st = c.state.lock();
        c.wait_pins(&mut st, &[(ptr, size, to.device(), false)])?;
        match to.device() {
            None => c.prefetch_to_host(&mut st, ptr, size),
            Some(d) => c.prefetch_to_device(&mut st, ptr, size, d),
        }
    }

    fn advise(
        &self,
        ptr: usize,
        size: usize,
        advice: ResidencyAdvice,
        check: &mut dyn FnMut(&[PageView]) -> std::result::Result<(), String>,
    ) -> Result<()> {
        self.core.advise(ptr, size, advice, check)
    }

    fn prepare(&self, device: u32, buffers: &[WorkBuffer]) -> Result<Vec<usize>> {
        let c = &self.core;
        let mut st = c.state.lock();
        let want: Vec<(usize, usize, Option<u32>, bool)> = buffers
            .iter()
            .map(|&(p, l, w)| (p, l, Some(device), w))
            .collect();
        c.wait_pins(&mut st, &want)?;
        let keep = work_pages(buffers);
        for &(p, l, w) in buffers {
            for a in pages_of(p, l) {
                c.ensure_device(&mut st, a, device, w, &keep)?;
            }
        }
        let addrs = buffers
            .iter()
            .map(|&(p, _, _)| c.mirror(&st, p, device))
            .collect();
        c.pin(&mut st, &keep);
        Ok(addrs)
    }

    fn release(&self, buffers: &[WorkBuffer]) {
        let keep = work_pages(buffers);
        let c = &self.core;
        let mut st = c.state.lock();
        c.unpin(&mut st, &keep);
    }

    fn device_copy(
        &self,
        device: u32,
        dst: DeviceOperand,
        src: DeviceOperand,
        len: usize,
    ) -> Result<()> {
        self.core.device_copy(
            device,
            (dst.addr, dst.managed),
            (src.addr, src.managed),
            len,
        )
    }

    fn device_fill(&self, device: u32, ptr: usize, value: u8, len: usize) -> Result<()> {
        let o = [DevOperand {
            addr: ptr,
            write: true,
            managed: true,
        }];
        self.core.device_op(device, &o, len, false, |a, _, n| {
            // SAFETY: the mirror segment is mapped on `device` and its page pinned there.
            unsafe { std::ptr::write_bytes(a[0] as *mut u8, value, n) }
        })
    }

    unsafe fn host_copy(&self, dst: usize, src: usize, len: usize) {
        // SAFETY: managed sides are inside live managed ranges (absent pages fault and migrate;
        // no lock is held here); plain sides are mapped with the access needed (caller).
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) }
    }

    unsafe fn host_fill(&self, ptr: usize, value: u8, len: usize) {
        // SAFETY: inside a live managed range (mapped read-write; absent pages fault and are
        // migrated by the fault thread). No lock is held here (caller).
        unsafe { std::ptr::write_bytes(ptr as *mut u8, value, len) }
    }

    fn peek(&self, src: usize, out: &mut [u8]) -> Result<()> {
        let c = &self.core;
        let st = c.state.lock();
        c.check_range(&st, src, out.len())?;
        let mut at = 0;
        while at < out.len() {
            let a = src + at;
            let page = a & !(PAGE - 1);
            let n = (page + PAGE - a).min(out.len() - at);
            let p = c.page(&st, page);
            let mut sources: Vec<usize> = Vec::new();
            if p.host {
                sources.push(a);
            }
            for (d, s) in p.slots.iter().enumerate() {
                if s.is_some() {
                    sources.push(c.mirror(&st, a, d as u32));
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
                    return Err(ResidencyError::Broken(format!(
                        "the copies of read-mostly page {} differ",
                        Addr(page)
                    )));
                }
            }
            at += n;
        }
        Ok(())
    }

    fn residency(&self, addr: usize) -> Option<Residency> {
        let c = &self.core;
        let st = c.state.lock();
        c.find(&st, addr)?;
        let p = c.page_ref(&st, addr & !(PAGE - 1));
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

    fn stats(&self) -> ManagedStats {
        self.core.state.lock().stats.clone()
    }

    fn shutdown(&self) {
        // Stop the fault thread first (it holds the core), then free what is left.
        let t = self.thread.lock().take();
        if t.is_none() {
            return;
        }
        drop(t);
        let c = &self.core;
        let mut st = c.state.lock();
        let bases: Vec<usize> = st.allocs.keys().copied().collect();
        for b in bases {
            c.free_locked(&mut st, b);
        }
    }
}
