//! Page access attributes without the driver's lock: each reservation's table of per-page
//! attributes, and the index that finds a reservation by address.
//!
//! Spec: oneAPI Level Zero 1.18, "Virtual Mem": `zeVirtualMemSetAccessAttribute` and
//! `zeVirtualMemGetAccessAttribute` "should be lock-free". Here neither takes the driver's
//! `vm` lock, so they never wait for, nor hold up, calls on other reservations, and readers
//! never wait for a writer's syscall.
//!
//! # Design
//! - **Per-page table** ([`ReservationPages`]): one byte per base page (`query_page_size(1)`)
//!   in atomics: unmapped, or mapped with NONE / READWRITE / READONLY. It is a two-level table
//!   (chunks of [`CHUNK`] pages allocated when first mapped), so a 4 TiB reservation costs
//!   only its top level until pages are mapped, and scans skip unallocated chunks. A lookup is
//!   an index, not a tree search: the set-access fast path is a handful of loads and stores.
//! - **Writers exclude each other per page, not per reservation**: each reservation has a
//!   `gate` reader-writer lock. Map, unmap and free hold it exclusive (after the driver's `vm`
//!   write lock) around their OS change and table update, so a set-access never `mprotect`s a
//!   page that an unmap or free is replacing, nor a range after it was released (free marks
//!   the table dead under the gate). Set-access holds it *shared* and claims the pages of its
//!   range with a busy bit in their state byte, across its syscall; setters of disjoint pages
//!   of one reservation thus run at once (the kernel serialises their `mprotect`s anyway, and a
//!   mutex here would add a sleeping hand-off to each). A setter that finds a page claimed
//!   (two set-access calls on one page at once) waits for the gate exclusive and runs alone.
//!   Queue submission holds the gates of the reservations its operands lie in, exclusive,
//!   while it checks their access and records its in-flight references (see
//!   [`crate::queue`]), so a set-access either sees the reference (and waits, as the rule
//!   says) or runs wholly before the check.
//! - **Readers take no lock** on the table: a per-reservation seqlock. A writer bumps the
//!   sequence to odd, stores the page bytes, bumps it to even; a reader reads the sequence,
//!   the bytes, and the sequence again, and retries if they differ or were odd. Writers update
//!   the bytes *after* their syscall, so the section is a few stores and a reader never waits
//!   for an `mprotect`. Every access is atomic, so a racing reader is sound, and a result is
//!   always the table at one instant (never half a set-access).
//! - **The index** ([`ReservationIndex`]): reservations sorted by base, behind a sharded
//!   reader-writer lock (a "big reader" lock). A reader counts itself in its thread's shard
//!   only, each on its own cache line, so readers on different threads touch no common cache
//!   line; reserve and free (already under the `vm` write lock) raise a writer flag and wait
//!   for every shard to empty.
//!   Tables are reference counted, so a reader that found one may use it after a free: it is
//!   then marked dead and answers "not inside a reservation".
//!
//! A set-access racing an unmap or free of the same range (which the spec forbids) is thus
//! ordered one way or the other by the gate: it changes live mapped pages only, or fails as on
//! a range that is not reserved.

use std::cell::UnsafeCell;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{RwLock, RwLockWriteGuard};

use crate::backend::{Backend, Protection};
use crate::error::{Addr, Error, Result};
use crate::semantics::checks::{aligned, nonzero, null_check, size_multiple};
use crate::spec::AccessAttribute;

/// The backend protection that implements an access attribute.
pub(crate) fn protection(a: AccessAttribute) -> Protection {
    match a {
        AccessAttribute::None => Protection::None,
        AccessAttribute::ReadWrite => Protection::ReadWrite,
        AccessAttribute::ReadOnly => Protection::ReadOnly,
    }
}

/// The containment rule of the range calls: `found` is the reservation `(base, size,
/// context)` starting at or before `ptr`, if any; the result is its base if it belongs to
/// `context` and wholly contains `[ptr, ptr+size)`. `InvalidArgument` otherwise, naming why.
pub(crate) fn containing(
    found: Option<(usize, usize, u64)>,
    context: u64,
    ptr: usize,
    size: usize,
) -> Result<usize> {
    let end = ptr.checked_add(size).ok_or_else(|| {
        Error::InvalidArgument(format!("range {} + {size:#x} overflows", Addr(ptr)))
    })?;
    match found {
        Some((b, s, c)) if c == context && end <= b + s && ptr < b + s => Ok(b),
        Some((b, s, c)) if c == context && ptr < b + s => Err(Error::InvalidArgument(format!(
            "range [{}, {}) runs past the end of reservation [{}, {})",
            Addr(ptr),
            Addr(end),
            Addr(b),
            Addr(b + s)
        ))),
        _ => Err(not_inside(ptr, end)),
    }
}

fn not_inside(ptr: usize, end: usize) -> Error {
    Error::InvalidArgument(format!(
        "range [{}, {}) is not inside a reservation of this context",
        Addr(ptr),
        Addr(end)
    ))
}

/// Base pages per chunk of a page table.
pub(crate) const CHUNK: usize = 1024;

/// Page state: not mapped (reads as NONE).
pub(crate) const UNMAPPED: u8 = 0;

/// A byte of 1 in every byte of a word.
const ONES: u64 = 0x0101_0101_0101_0101;

/// The page state of a mapped page with attribute `a`.
fn state_of(a: AccessAttribute) -> u8 {
    a as u8 + 1
}

/// The attribute a page in state `s` reads as (unmapped pages are NONE).
pub(crate) fn attr_of(s: u8) -> AccessAttribute {
    match s {
        2 => AccessAttribute::ReadWrite,
        3 => AccessAttribute::ReadOnly,
        _ => AccessAttribute::None,
    }
}

/// [`CHUNK`] pages: their states, one byte each, eight to a word (so a scan or a store over
/// many pages is a few word operations); and one busy bit each, sixty-four to a word, which
/// a set-access holding the gate shared sets over its pages while it changes them.
struct Chunk {
    states: [AtomicU64; CHUNK / 8],
    busy: [AtomicU64; CHUNK / 64],
}

/// One reservation's per-page states (see the module docs): written under `gate` inside the
/// seqlock, read by anyone.
pub(crate) struct ReservationPages {
    pub(crate) base: usize,
    pub(crate) size: usize,
    pub(crate) context: u64,
    /// The base page: the unit of the table (a power of two).
    page: usize,
    /// `log2(page)`.
    shift: u32,
    /// Held exclusive by whoever changes which pages are mapped (map, unmap, free) and by queue
    /// submission while it checks access and records its references; shared by set-access,
    /// which claims its pages (their busy bits) so that setters on other pages run at once.
    gate: RwLock<()>,
    /// The seqlock: odd while a writer stores page states.
    seq: AtomicU64,
    /// False once freed.
    live: AtomicBool,
    chunks: Box<[OnceLock<Box<Chunk>>]>,
}

impl std::fmt::Debug for ReservationPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReservationPages")
            .field("base", &format_args!("{}", Addr(self.base)))
            .field("size", &self.size)
            .field("context", &self.context)
            .field("live", &self.live.load(Ordering::Relaxed))
            .finish()
    }
}

/// Splits page range `[i, j)` into its pieces within one word of `per` pages each:
/// `(word index overall, first bit, last bit + 1)` in units of pages, in order.
fn word_pieces(i: usize, j: usize, per: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    let mut k = i;
    std::iter::from_fn(move || {
        (k < j).then(|| {
            let w = k / per;
            let stop = j.min((w + 1) * per);
            let piece = (w, k % per, stop - w * per);
            k = stop;
            piece
        })
    })
}

/// The mask of units `[a, b)` of a word of `per` units of `64 / per` bits.
fn unit_mask(a: usize, b: usize, per: usize) -> u64 {
    let bits = 64 / per;
    let hi = if b * bits >= 64 {
        u64::MAX
    } else {
        (1u64 << (b * bits)) - 1
    };
    hi & !((1u64 << (a * bits)) - 1)
}

impl ReservationPages {
    /// The table of a new reservation: every page unmapped.
    pub(crate) fn new(base: usize, size: usize, context: u64, page: usize) -> Self {
        debug_assert!(page.is_power_of_two());
        let chunks = (size / page).div_ceil(CHUNK);
        ReservationPages {
            base,
            size,
            context,
            page,
            shift: page.trailing_zeros(),
            gate: RwLock::new(()),
            seq: AtomicU64::new(0),
            live: AtomicBool::new(true),
            chunks: (0..chunks).map(|_| OnceLock::new()).collect(),
        }
    }

    fn chunk(&self, i: usize) -> Option<&Chunk> {
        self.chunks[i / CHUNK].get().map(|c| &**c)
    }

    /// The state of page `i`.
    #[inline]
    pub(crate) fn state(&self, i: usize) -> u8 {
        match self.chunk(i) {
            Some(c) => {
                let w = c.states[(i % CHUNK) / 8].load(Ordering::Relaxed);
                (w >> ((i % 8) * 8)) as u8
            }
            None => UNMAPPED,
        }
    }

    /// The first page from `i` (at most `limit`) whose state `s` has `(s ^ pattern) & mask`
    /// non-zero (patterns and masks are bytes repeated over a word). Skips unallocated chunks
    /// (all UNMAPPED) in one step and tests eight pages per word.
    #[inline]
    fn scan(&self, i: usize, limit: usize, pattern: u64, mask: u64) -> usize {
        let unmapped_matches = pattern & mask == 0;
        let mut j = i;
        while j < limit {
            let cend = limit.min((j / CHUNK + 1) * CHUNK);
            let Some(c) = self.chunk(j) else {
                if !unmapped_matches {
                    return j;
                }
                j = cend;
                continue;
            };
            while j < cend {
                let wend = cend.min((j / 8 + 1) * 8);
                let w = c.states[(j % CHUNK) / 8].load(Ordering::Relaxed);
                // Bytes from page j on; those shifted in at the top are zeros (match).
                let x = ((w ^ pattern) & mask) >> ((j % 8) * 8);
                if x != 0 {
                    let k = j + x.trailing_zeros() as usize / 8;
                    if k < wend {
                        return k;
                    }
                }
                j = wend;
            }
        }
        limit
    }

    /// The end (page index, at most `limit`) of the run from page `i` of pages in state `s`.
    #[inline]
    pub(crate) fn run_end(&self, i: usize, limit: usize, s: u8) -> usize {
        self.scan(i, limit, ONES * s as u64, u64::MAX)
    }

    /// The end (page index, at most `limit`) of the run from page `i` of pages that read as
    /// `a` (unmapped pages read as NONE).
    fn run_end_reading(&self, i: usize, limit: usize, a: AccessAttribute) -> usize {
        match a {
            // States 0 (unmapped) and 1 (NONE): every bit but the lowest is clear.
            AccessAttribute::None => self.scan(i, limit, 0, ONES * 0xfe),
            a => self.run_end(i, limit, state_of(a)),
        }
    }

    /// Page index of address `a` (inside the reservation).
    #[inline]
    pub(crate) fn index(&self, a: usize) -> usize {
        (a - self.base) >> self.shift
    }

    /// The base page.
    pub(crate) fn page(&self) -> usize {
        self.page
    }

    /// Stores state `s` for pages `[i, j)`. Writers only, inside [`Self::write`] (which
    /// excludes every other writer, so a word's read-modify-write loses nothing), holding
    /// `gate` exclusive or shared with the pages claimed.
    fn store(&self, i: usize, j: usize, s: u8) {
        // Pages of one word of an allocated chunk (a set-access of up to eight base pages).
        if i < j && i / 8 == (j - 1) / 8 {
            if let Some(c) = self.chunk(i) {
                let word = &c.states[(i % CHUNK) / 8];
                let m = unit_mask(i % 8, (j - 1) % 8 + 1, 8);
                let old = word.load(Ordering::Relaxed);
                word.store((old & !m) | ((ONES * s as u64) & m), Ordering::Release);
                return;
            }
        }
        for (w, a, b) in word_pieces(i, j, 8) {
            let slot = &self.chunks[w * 8 / CHUNK];
            let c = match slot.get() {
                Some(c) => c,
                // Unmapping pages of a chunk never mapped: nothing to store.
                None if s == UNMAPPED => continue,
                None => slot.get_or_init(|| {
                    Box::new(Chunk {
                        states: [const { AtomicU64::new(0) }; CHUNK / 8],
                        busy: [const { AtomicU64::new(0) }; CHUNK / 64],
                    })
                }),
            };
            let word = &c.states[w % (CHUNK / 8)];
            let m = unit_mask(a, b, 8);
            let old = word.load(Ordering::Relaxed);
            // Release: a setter that claims these pages next sees the states.
            word.store((old & !m) | ((ONES * s as u64) & m), Ordering::Release);
        }
    }

    /// Runs `f` as one seqlock write section (the caller holds `gate`). Setters of disjoint
    /// pages may hold the gate together, so the odd sequence is taken with a compare-exchange
    /// (a spin lock over a few stores, never over a syscall).
    fn write(&self, f: impl FnOnce()) {
        let mut spins = 0u32;
        let s = loop {
            let s = self.seq.load(Ordering::Relaxed);
            if s & 1 == 0
                && self
                    .seq
                    .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                break s;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        };
        // Orders the odd sequence before the stores of `f` (a reader that sees any of them
        // then sees the sequence move).
        fence(Ordering::Release);
        f();
        self.seq.store(s + 2, Ordering::Release);
    }

    /// Runs `f` until it saw no concurrent write section: a consistent snapshot.
    fn read<T>(&self, mut f: impl FnMut() -> T) -> T {
        let mut spins = 0u32;
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                let v = f();
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == s1 {
                    return v;
                }
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // The writer may be preempted inside its (short) section.
                std::thread::yield_now();
            }
        }
    }

    /// The gate, exclusive: no set-access is in progress or starts until it is dropped. Map,
    /// unmap and free take it (after the `vm` write lock) around their OS change and table
    /// update; queue submission around its access check and references.
    pub(crate) fn exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.gate.write()
    }

    /// Claims pages `[i, j)` for a set-access holding the gate shared: true if none was
    /// claimed by another (then all are ours); false (and nothing claimed) otherwise. Pages
    /// of unallocated chunks are unmapped, so a set-access never changes them.
    fn claim(&self, i: usize, j: usize) -> bool {
        for (w, a, b) in word_pieces(i, j, 64) {
            let Some(c) = self.chunks[w * 64 / CHUNK].get() else {
                continue;
            };
            let m = unit_mask(a, b, 64);
            let old = c.busy[w % (CHUNK / 64)].fetch_or(m, Ordering::Acquire);
            if old & m != 0 {
                // Give back the bits this call set, then every earlier word.
                c.busy[w % (CHUNK / 64)].fetch_and(!(m & !old), Ordering::Release);
                self.unclaim(i, w * 64);
                return false;
            }
        }
        true
    }

    /// Gives up the claims on pages `[i, j)`.
    fn unclaim(&self, i: usize, j: usize) {
        for (w, a, b) in word_pieces(i, j, 64) {
            if let Some(c) = self.chunks[w * 64 / CHUNK].get() {
                c.busy[w % (CHUNK / 64)].fetch_and(!unit_mask(a, b, 64), Ordering::Release);
            }
        }
    }

    /// Whether the reservation is still live (not freed).
    pub(crate) fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// Map (`Some(access)`) or unmap (`None`) of `[start, end)`; the caller holds `gate` and
    /// has made the OS change.
    pub(crate) fn set_mapped(&self, start: usize, end: usize, access: Option<AccessAttribute>) {
        let s = access.map_or(UNMAPPED, state_of);
        let (i, j) = (self.index(start), self.index(end));
        self.write(|| self.store(i, j, s));
    }

    /// Free: the table is dead from now on (the caller holds `gate`).
    pub(crate) fn kill(&self) {
        self.write(|| self.live.store(false, Ordering::Relaxed));
    }

    /// `zeVirtualMemSetAccessAttribute` on a range validated against this table: with the
    /// gate shared and the range's pages claimed, or (if another setter holds some of them)
    /// with the gate exclusive. `referenced()` tells whether queued work references the
    /// reservation; it is asked under the gate, and then nothing changes
    /// ([`SetOutcome::Referenced`]: the caller waits and tries again).
    pub(crate) fn set_access(
        &self,
        backend: &dyn Backend,
        ptr: usize,
        size: usize,
        access: AccessAttribute,
        referenced: impl Fn() -> bool,
    ) -> Result<SetOutcome> {
        let (i0, lim) = (self.index(ptr), self.index(ptr + size));
        {
            let _shared = self.gate.read();
            if !self.is_live() {
                return Err(ReservationIndex::freed(ptr, size));
            }
            if referenced() {
                return Ok(SetOutcome::Referenced);
            }
            if self.claim(i0, lim) {
                return self
                    .protect_claimed(backend, ptr, size, access)
                    .map(|()| SetOutcome::Done);
            }
        }
        // Another set-access is changing some of these pages: wait for every setter.
        let _exclusive = self.gate.write();
        if !self.is_live() {
            return Err(ReservationIndex::freed(ptr, size));
        }
        if referenced() {
            return Ok(SetOutcome::Referenced);
        }
        self.protect_claimed(backend, ptr, size, access)
            .map(|()| SetOutcome::Done)
    }

    /// Protects the mapped pages of `[ptr, ptr+size)` whose attribute differs, in runs of one
    /// old attribute, then records the new one and gives up the claims (the caller holds the
    /// gate exclusive, or shared with the pages claimed). If a protect fails, every run
    /// changed so far is put back and nothing is recorded (a failed call changes nothing).
    fn protect_claimed(
        &self,
        backend: &dyn Backend,
        ptr: usize,
        size: usize,
        access: AccessAttribute,
    ) -> Result<()> {
        let new = state_of(access);
        let (i0, lim) = (self.index(ptr), self.index(ptr + size));
        // Fast path: every page mapped with one attribute (one protect, no rollback list).
        let s0 = self.state(i0);
        if s0 != UNMAPPED && self.run_end(i0, lim, s0) == lim {
            if s0 == new {
                self.unclaim(i0, lim);
                return Ok(());
            }
            // SAFETY: every page of [ptr, ptr+size) is mapped, and stays so under the gate.
            if let Err(err) = unsafe { backend.protect(ptr, size, protection(access)) } {
                // mprotect may have changed part of the range before failing: put it back.
                // SAFETY: same mapped range.
                unsafe { backend.protect(ptr, size, protection(attr_of(s0))).ok() };
                self.unclaim(i0, lim);
                return Err(err.into());
            }
            self.write(|| self.store(i0, lim, new));
            self.unclaim(i0, lim);
            return Ok(());
        }
        // Runs of mapped pages with one old attribute other than `access`, as page indices.
        let mut runs: Vec<(usize, usize, u8)> = Vec::new();
        let mut i = i0;
        while i < lim {
            let s = self.state(i);
            let j = self.run_end(i, lim, s);
            if s != UNMAPPED && s != new {
                runs.push((i, j, s));
            }
            i = j;
        }
        let addr = |i: usize| self.base + i * self.page;
        for (k, &(i, j, _)) in runs.iter().enumerate() {
            // SAFETY: [addr(i), addr(j)) is mapped, and stays so under the gate.
            if let Err(err) =
                unsafe { backend.protect(addr(i), (j - i) * self.page, protection(access)) }
            {
                // The failing run may be partly changed too: put it back with the others.
                for &(i, j, old) in &runs[..=k] {
                    // SAFETY: same mapped runs, put back as they were.
                    unsafe {
                        backend
                            .protect(addr(i), (j - i) * self.page, protection(attr_of(old)))
                            .ok()
                    };
                }
                self.unclaim(i0, lim);
                return Err(err.into());
            }
        }
        if !runs.is_empty() {
            self.write(|| {
                for &(i, j, _) in &runs {
                    self.store(i, j, new)
                }
            });
        }
        self.unclaim(i0, lim);
        Ok(())
    }

    /// `zeVirtualMemGetAccessAttribute` on a validated range: the attribute of the page at
    /// `ptr` and the length from `ptr` (capped at `size`) of pages that share it (unmapped
    /// pages are NONE), from one consistent snapshot; `None` if the reservation was freed.
    pub(crate) fn access_run(&self, ptr: usize, size: usize) -> Option<(AccessAttribute, usize)> {
        let (i0, lim) = (self.index(ptr), self.index(ptr + size));
        self.read(|| {
            if !self.live.load(Ordering::Relaxed) {
                return None;
            }
            let a = attr_of(self.state(i0));
            let j = self.run_end_reading(i0, lim, a);
            Some((a, (j - i0) * self.page))
        })
    }
}

/// What [`ReservationPages::set_access`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SetOutcome {
    /// Done (the attributes are set).
    Done,
    /// Queued work references the reservation: nothing changed.
    Referenced,
}

/// Reader counters of the index's lock, one cache line each: as many as the threads the
/// benchmarks run (8). Readers of different shards share no line; a writer reads every shard.
const SHARDS: usize = 8;

#[repr(align(128))]
struct Shard(AtomicUsize);

/// Every reservation's page table by base, behind a sharded reader-writer lock (a "big
/// reader" lock; see the module docs): a reader counts itself in its thread's shard, a writer
/// raises `writer` and waits until every shard is empty. A writer thus costs one atomic
/// read-modify-write and a load per shard (a `parking_lot` lock per shard cost reserve + free
/// two compare-exchanges per shard each, about 0.7 us in all on `bench vmm`).
pub(crate) struct ReservationIndex {
    shards: [Shard; SHARDS],
    /// Set while a writer holds (or waits for) the index.
    writer: AtomicBool,
    /// Sorted by base: a binary search finds the one containing an address in a few dozen
    /// instructions (a `BTreeMap` range search took about 150, measured with callgrind, on
    /// every set and get); reserve and free pay a move of the entries after theirs (16 bytes
    /// each), small beside their `mmap` / `munmap` for the thousands of reservations a
    /// process holds.
    map: UnsafeCell<Vec<Arc<ReservationPages>>>,
    /// The base page (`query_page_size(1)`): the unit of the access calls.
    base_page: usize,
}

// SAFETY: `map` is read only while its reader is counted in a shard with no writer in, and
// written only by the one writer once every shard is empty (see `with_read` / `with_write`),
// so a write never overlaps a read or another write; its contents are `Send + Sync`.
unsafe impl Sync for ReservationIndex {}

impl std::fmt::Debug for ReservationIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReservationIndex")
            .field("base_page", &self.base_page)
            .finish_non_exhaustive()
    }
}

/// This thread's shard: threads take shards round-robin as they first ask.
fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    // During thread-local teardown, any shard will do.
    SHARD.try_with(|s| *s).unwrap_or(0)
}

/// Spins a little, then yields (the other side may be preempted, on a loaded machine).
fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

struct ReadUnlock<'a>(&'a AtomicUsize);
impl Drop for ReadUnlock<'_> {
    fn drop(&mut self) {
        // Release: the writer that sees the shard empty sees this reader's reads done.
        self.0.fetch_sub(1, Ordering::Release);
    }
}

struct WriteUnlock<'a>(&'a AtomicBool);
impl Drop for WriteUnlock<'_> {
    fn drop(&mut self) {
        // Release: a reader that sees no writer sees the writer's changes.
        self.0.store(false, Ordering::Release);
    }
}

impl ReservationIndex {
    /// The index of a driver whose base page is `base_page`, a power of two (every page size
    /// is: the OS page, 64 KiB, 2 MiB).
    pub(crate) fn new(base_page: usize) -> Self {
        assert!(
            base_page.is_power_of_two(),
            "the base page {base_page:#x} is not a power of two"
        );
        ReservationIndex {
            shards: [const { Shard(AtomicUsize::new(0)) }; SHARDS],
            writer: AtomicBool::new(false),
            map: UnsafeCell::new(Vec::new()),
            base_page,
        }
    }

    fn with_read<T>(&self, f: impl FnOnce(&[Arc<ReservationPages>]) -> T) -> T {
        let count = &self.shards[shard_index()].0;
        let mut spins = 0;
        loop {
            // Count in, then look for a writer: with the writer's raise-then-look (both
            // sequentially consistent) one of the two sees the other.
            count.fetch_add(1, Ordering::SeqCst);
            if !self.writer.load(Ordering::SeqCst) {
                break;
            }
            count.fetch_sub(1, Ordering::Release);
            while self.writer.load(Ordering::Relaxed) {
                backoff(&mut spins);
            }
        }
        let _unlock = ReadUnlock(count);
        // SAFETY: counted in with no writer in; a writer waits for this shard to empty.
        f(unsafe { &*self.map.get() })
    }

    fn with_write<T>(&self, f: impl FnOnce(&mut Vec<Arc<ReservationPages>>) -> T) -> T {
        let mut spins = 0;
        // Writers are already serialised by the `vm` write lock; the exchange makes it so
        // whatever the caller.
        while self
            .writer
            .compare_exchange_weak(false, true, Ordering::SeqCst, Ordering::Relaxed)
            .is_err()
        {
            backoff(&mut spins);
        }
        let _unlock = WriteUnlock(&self.writer);
        for s in &self.shards {
            // Readers that counted in before the raise finish; later ones back off.
            while s.0.load(Ordering::SeqCst) != 0 {
                backoff(&mut spins);
            }
        }
        // SAFETY: the one writer, and every shard empty with no reader able to count in.
        f(unsafe { &mut *self.map.get() })
    }

    /// Records a new reservation (under the `vm` write lock).
    pub(crate) fn insert(&self, pages: Arc<ReservationPages>) {
        self.with_write(|m| {
            let i = m.partition_point(|r| r.base < pages.base);
            m.insert(i, pages)
        });
    }

    /// Forgets a freed reservation (under the `vm` write lock).
    pub(crate) fn remove(&self, base: usize) {
        self.with_write(|m| {
            let i = m.partition_point(|r| r.base < base);
            if m.get(i).is_some_and(|r| r.base == base) {
                m.remove(i);
            }
        });
    }

    /// The access calls' checks, in the order the other range calls make them: null, size 0,
    /// base-page alignment, then one live reservation of `context` wholly containing the
    /// range; runs `f` on its table under the shard's shared lock.
    fn with_containing<T>(
        &self,
        context: u64,
        ptr: usize,
        size: usize,
        f: impl FnOnce(&Arc<ReservationPages>) -> T,
    ) -> Result<T> {
        null_check(ptr, "address")?;
        nonzero(size, "size")?;
        aligned(ptr, self.base_page, "address")?;
        size_multiple(size, self.base_page, "size")?;
        self.with_read(|m| {
            // The last reservation starting at or before `ptr`.
            let found = m[..m.partition_point(|r| r.base <= ptr)].last();
            containing(
                found.map(|r| (r.base, r.size, r.context)),
                context,
                ptr,
                size,
            )?;
            Ok(f(found.expect("found")))
        })
    }

    /// The validated reservation table containing `[ptr, ptr+size)` (see
    /// [`Self::with_containing`]), for `zeVirtualMemSetAccessAttribute`.
    pub(crate) fn find(
        &self,
        context: u64,
        ptr: usize,
        size: usize,
    ) -> Result<Arc<ReservationPages>> {
        self.with_containing(context, ptr, size, Arc::clone)
    }

    /// The error for a range whose reservation was freed after it was found.
    pub(crate) fn freed(ptr: usize, size: usize) -> Error {
        not_inside(ptr, ptr + size)
    }

    /// `zeVirtualMemGetAccessAttribute`: no lock but this thread's index shard.
    pub(crate) fn get_access(
        &self,
        context: u64,
        ptr: usize,
        size: usize,
    ) -> Result<(AccessAttribute, usize)> {
        self.with_containing(context, ptr, size, |r| r.access_run(ptr, size))?
            .ok_or_else(|| Self::freed(ptr, size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: usize = 64 << 10;

    fn table(pages: usize) -> ReservationPages {
        let t = ReservationPages::new(1 << 40, pages * P, 1, P);
        t.set_mapped(t.base, t.base + pages * P, Some(AccessAttribute::ReadWrite));
        t
    }

    #[test]
    fn a_failed_claim_leaves_nothing_claimed() {
        let t = table(2 * CHUNK);
        assert!(t.claim(3, 70));
        // Overlaps page 69 only, and spans a word and a chunk boundary.
        assert!(!t.claim(69, CHUNK + 5));
        assert!(
            t.claim(70, CHUNK + 5),
            "the failed claim gave back what it took"
        );
        assert!(!t.claim(0, 4));
        t.unclaim(3, 70);
        t.unclaim(70, CHUNK + 5);
        assert!(t.claim(0, 2 * CHUNK), "everything was given back");
    }

    #[test]
    fn word_scans_and_stores_agree_with_pages() {
        let t = table(2 * CHUNK);
        let ro = state_of(AccessAttribute::ReadOnly);
        t.write(|| t.store(5, 13, ro));
        t.write(|| t.store(CHUNK - 1, CHUNK + 2, UNMAPPED));
        for i in 0..2 * CHUNK {
            let want = match i {
                5..13 => ro,
                _ if (CHUNK - 1..CHUNK + 2).contains(&i) => UNMAPPED,
                _ => state_of(AccessAttribute::ReadWrite),
            };
            assert_eq!(t.state(i), want, "page {i}");
        }
        assert_eq!(t.run_end(5, 100, ro), 13);
        assert_eq!(t.run_end(0, 100, t.state(0)), 5);
        assert_eq!(t.run_end(13, 2 * CHUNK, t.state(13)), CHUNK - 1);
        assert_eq!(
            t.run_end_reading(CHUNK - 1, 2 * CHUNK, AccessAttribute::None),
            CHUNK + 2
        );
        // Unallocated chunks read as unmapped, in one step.
        let big = ReservationPages::new(1 << 40, 64 * CHUNK * P, 1, P);
        assert_eq!(
            big.run_end_reading(7, 64 * CHUNK, AccessAttribute::None),
            64 * CHUNK
        );
        assert_eq!(
            big.run_end(7, 64 * CHUNK, state_of(AccessAttribute::None)),
            7
        );
    }
}
