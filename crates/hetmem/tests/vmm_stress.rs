//! Concurrency: 8 threads share one context and run 10,000 mixed virtual-memory operations
//! each; afterwards no mapping, fd or byte of capacity is left behind.
//!
//! Each thread keeps an exact model of its own reservations, physical objects and contents and
//! checks every answer about them against it. Threads also race on shared objects: they read
//! other threads' reservations (which may vanish at any time), try to destroy a physical object
//! that stays mapped (always `HandleObjectInUse`), and compete to map into the same pages of a
//! shared reservation (exactly one map of a page wins; the others get `InvalidArgument`).
//!
//! The whole-process figures (`/proc/self/maps`, `/proc/self/fd`) are taken around the run, so
//! this test is alone in its binary.

mod common;

use common::{runtime_with, Rng};

use std::collections::BTreeMap;
use std::sync::{Barrier, Mutex};
use std::time::Instant;

use hetmem::platform::{mapping_count, open_fd_count};
use hetmem::{
    AccessAttribute, Context, Device, Error, PhysicalMemory, PhysicalMemoryFlags, Reservation,
    VmStats,
};

const THREADS: usize = 8;
const OPS: usize = 10_000;
/// Operations per thread of the warm-up run, which lets the C library settle its per-thread
/// arenas and cached thread stacks before the address space is counted.
const WARMUP_OPS: usize = 300;
const SEED: u64 = 0x4845_544d_454d_0002;
/// Pages of the contended reservation that threads compete for.
const SLOTS: usize = 16;
/// Pages of the reservation kept mapped for the whole run.
const PINNED_PAGES: usize = 4;
const MAX_OWN_RESERVATIONS: usize = 6;
const MAX_OWN_OBJECTS: usize = 6;
const MAX_RESERVATION_PAGES: usize = 8;
const MAX_OBJECT_PAGES: usize = 4;

/// A random access attribute.
fn random_access(rng: &mut Rng) -> AccessAttribute {
    [
        AccessAttribute::None,
        AccessAttribute::ReadWrite,
        AccessAttribute::ReadOnly,
    ][rng.below(3)]
}

/// The value kept in page `k` of the pinned object.
fn pinned_value(k: usize) -> u64 {
    0x5049_4e4e_4544_0000 | k as u64
}

/// Objects that every thread touches.
struct Shared {
    ctx: Context,
    devs: Vec<Device>,
    page: usize,
    /// Mapped read-write over all of `pinned` for the whole run; nobody writes it.
    pinned_phys: PhysicalMemory,
    pinned: Reservation,
    /// Pages that threads claim by mapping into them.
    contended: Reservation,
    /// Each thread's live reservations, for the others to race on.
    published: Vec<Mutex<Vec<Reservation>>>,
    /// Whether a page never written reads zero (device memory is zero-filled on the host
    /// backend; nothing in the spec requires it, and on cuda it is not).
    fresh_reads_zero: bool,
}

impl Shared {
    fn new(ctx: &Context, devs: &[Device], fresh_reads_zero: bool) -> Shared {
        let page = ctx.query_page_size(&devs[0], 1).expect("page size");
        let pinned_phys = ctx
            .create_physical_memory(
                Some(&devs[0]),
                PhysicalMemoryFlags::AllocateOnDevice,
                PINNED_PAGES * page,
            )
            .expect("create pinned");
        let pinned = ctx.reserve(None, PINNED_PAGES * page).expect("reserve");
        ctx.map(
            pinned.base,
            pinned.size,
            pinned_phys,
            0,
            AccessAttribute::ReadWrite,
        )
        .expect("map pinned");
        for k in 0..PINNED_PAGES {
            // The pinned range is mapped read-write.
            common::dev_write(ctx, pinned.base + k * page, pinned_value(k));
        }
        let contended = ctx.reserve(None, SLOTS * page).expect("reserve");
        Shared {
            ctx: ctx.clone(),
            devs: devs.to_vec(),
            page,
            pinned_phys,
            pinned,
            contended,
            published: (0..THREADS).map(|_| Mutex::new(Vec::new())).collect(),
            fresh_reads_zero,
        }
    }

    fn release(self) {
        self.ctx.free_reservation(self.contended).expect("free");
        self.ctx.free_reservation(self.pinned).expect("free");
        self.ctx
            .destroy_physical_memory(self.pinned_phys)
            .expect("destroy once unmapped");
    }
}

/// One page of a reservation mapped to page `page` of physical object `phys`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PageMap {
    phys: u64,
    page: usize,
    access: AccessAttribute,
}

struct OwnRes {
    r: Reservation,
    pages: Vec<Option<PageMap>>,
}

struct OwnPhys {
    h: PhysicalMemory,
    /// The last value written at the start of each page (0: never written).
    content: Vec<u64>,
    /// Pages of this object mapped anywhere.
    mapped: usize,
}

/// How often each kind of operation ran, and how often a race was lost.
#[derive(Debug, Default, Clone)]
struct Counts {
    ops: [usize; 13],
    writes_checked: usize,
    reads_checked: usize,
    claims_won: usize,
    claims_lost: usize,
    foreign_gone: usize,
}

struct Worker<'a> {
    id: usize,
    sh: &'a Shared,
    rng: Rng,
    res: Vec<OwnRes>,
    phys: BTreeMap<u64, OwnPhys>,
    /// Contended slots this thread won.
    claims: BTreeMap<usize, PageMap>,
    next_tag: u64,
    n: Counts,
}

fn expect_invalid_argument<T: std::fmt::Debug>(what: &str, r: Result<T, Error>) {
    match r {
        Err(Error::InvalidArgument(_)) => {}
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    }
}

impl<'a> Worker<'a> {
    fn new(id: usize, sh: &'a Shared, seed: u64) -> Worker<'a> {
        Worker {
            id,
            sh,
            rng: Rng(seed ^ (id as u64).wrapping_mul(0x1000_0000_01b3)),
            res: Vec::new(),
            phys: BTreeMap::new(),
            claims: BTreeMap::new(),
            next_tag: 1,
            n: Counts::default(),
        }
    }

    fn ctx(&self) -> &Context {
        &self.sh.ctx
    }

    fn page(&self) -> usize {
        self.sh.page
    }

    fn tag(&mut self) -> u64 {
        self.next_tag += 1;
        ((self.id as u64 + 1) << 48) | self.next_tag
    }

    fn publish(&self) {
        *self.sh.published[self.id].lock().unwrap() = self.res.iter().map(|o| o.r).collect();
    }

    fn run(mut self, ops: usize) -> Counts {
        for _ in 0..ops {
            let k = match self.rng.below(100) {
                0..=7 => 0,
                8..=12 => 1,
                13..=20 => 2,
                21..=25 => 3,
                26..=41 => 4,
                42..=51 => 5,
                52..=59 => 6,
                60..=69 => 7,
                70..=81 => 8,
                82..=86 => 9,
                87..=90 => 10,
                91..=96 => 11,
                _ => 12,
            };
            self.n.ops[k] += 1;
            match k {
                0 => self.reserve(),
                1 => self.free(),
                2 => self.create(),
                3 => self.destroy(),
                4 => self.map(),
                5 => self.unmap(),
                6 => self.set_access(),
                7 => self.get_access(),
                8 => self.write_read(),
                9 => self.race_foreign_reservation(),
                10 => self.race_pinned(),
                11 => self.contend(),
                _ => self.bad_frees(),
            }
        }
        self.finish();
        self.n
    }

    fn reserve(&mut self) {
        if self.res.len() >= MAX_OWN_RESERVATIONS {
            return self.free();
        }
        let page = self.page();
        let size = (1 + self.rng.below(MAX_RESERVATION_PAGES)) * page;
        // Sometimes ask for an address that is taken: another one must be chosen.
        let hint = (self.rng.below(4) == 0).then_some(self.sh.pinned.base);
        let r = self.ctx().reserve(hint, size).expect("reserve");
        assert_eq!(r.size, size);
        assert_eq!(r.base % page, 0);
        let taken = [self.sh.pinned, self.sh.contended]
            .into_iter()
            .chain(self.res.iter().map(|o| o.r));
        for t in taken {
            assert!(
                r.end() <= t.base || t.end() <= r.base,
                "new reservation [{:#x}, {:#x}) overlaps a live one at {:#x}",
                r.base,
                r.end(),
                t.base
            );
        }
        assert_eq!(
            self.ctx().get_access_attribute(r.base, r.size),
            Ok((AccessAttribute::None, r.size))
        );
        self.res.push(OwnRes {
            r,
            pages: vec![None; size / page],
        });
        self.publish();
    }

    fn free(&mut self) {
        if self.res.is_empty() {
            return self.reserve();
        }
        let i = self.rng.below(self.res.len());
        let r = self.res[i].r;
        expect_invalid_argument(
            "free with the wrong size",
            self.ctx().free(r.base, r.size + self.page()),
        );
        self.ctx().free(r.base, r.size).expect("free");
        let gone = self.res.swap_remove(i);
        for pm in gone.pages.into_iter().flatten() {
            self.phys.get_mut(&pm.phys).expect("mapped object").mapped -= 1;
        }
        self.publish();
    }

    fn create(&mut self) {
        if self.phys.len() >= MAX_OWN_OBJECTS {
            return self.destroy();
        }
        let pages = 1 + self.rng.below(MAX_OBJECT_PAGES);
        let (dev, flags) = match self.rng.below(3) {
            0 => (
                Some(&self.sh.devs[0]),
                PhysicalMemoryFlags::AllocateOnDevice,
            ),
            1 => (
                // Device 1 of the host backend's two (on cuda, the last GPU).
                Some(&self.sh.devs[1 % self.sh.devs.len()]),
                PhysicalMemoryFlags::AllocateOnDevice,
            ),
            _ => (None, PhysicalMemoryFlags::AllocateOnHost),
        };
        let h = self
            .ctx()
            .create_physical_memory(dev, flags, pages * self.page())
            .expect("create");
        self.phys.insert(
            h.id,
            OwnPhys {
                h,
                content: vec![0; pages],
                mapped: 0,
            },
        );
    }

    fn pick_phys(&mut self) -> Option<u64> {
        let n = self.phys.len();
        (n > 0).then(|| *self.phys.keys().nth(self.rng.below(n)).expect("in range"))
    }

    fn destroy(&mut self) {
        let Some(id) = self.pick_phys() else {
            return self.create();
        };
        let p = &self.phys[&id];
        match (self.ctx().destroy_physical_memory(p.h), p.mapped) {
            (Ok(()), 0) => {
                self.phys.remove(&id);
            }
            (Err(Error::HandleObjectInUse(_)), m) if m > 0 => {}
            (r, m) => panic!("destroy of object {id} with {m} pages mapped: {r:?}"),
        }
    }

    fn map(&mut self) {
        if self.res.is_empty() {
            return self.reserve();
        }
        let Some(id) = self.pick_phys() else {
            return self.create();
        };
        let page = self.page();
        let i = self.rng.below(self.res.len());
        let o = &self.res[i];
        let s = self.rng.below(o.pages.len());
        let want = (1 + self.rng.below(MAX_OBJECT_PAGES)).min(self.phys[&id].content.len());
        let len = o.pages[s..]
            .iter()
            .take(want)
            .take_while(|p| p.is_none())
            .count();
        if len == 0 {
            // Mapping over a mapped page is refused.
            let r = self.ctx().map(
                o.r.base + s * page,
                page,
                self.phys[&id].h,
                0,
                AccessAttribute::ReadWrite,
            );
            return expect_invalid_argument("map over a mapping", r);
        }
        let off = self.rng.below(self.phys[&id].content.len() - len + 1);
        let access = random_access(&mut self.rng);
        self.ctx()
            .map(
                o.r.base + s * page,
                len * page,
                self.phys[&id].h,
                off * page,
                access,
            )
            .expect("map");
        for k in 0..len {
            self.res[i].pages[s + k] = Some(PageMap {
                phys: id,
                page: off + k,
                access,
            });
        }
        self.phys.get_mut(&id).expect("live").mapped += len;
    }

    /// A reservation and a mapped page in it, if any.
    fn pick_mapped(&mut self) -> Option<(usize, usize)> {
        if self.res.is_empty() {
            return None;
        }
        let i = self.rng.below(self.res.len());
        let o = &self.res[i];
        let start = self.rng.below(o.pages.len());
        (0..o.pages.len())
            .map(|k| (start + k) % o.pages.len())
            .find(|&p| o.pages[p].is_some())
            .map(|p| (i, p))
    }

    fn unmap(&mut self) {
        let Some((i, s)) = self.pick_mapped() else {
            return self.map();
        };
        let page = self.page();
        let o = &self.res[i];
        let mapped_run = o.pages[s..].iter().take_while(|p| p.is_some()).count();
        // A range running into an unmapped page unmaps its mapped pages, the others stay
        // unmapped (case 4 of shared/cases/level-zero.md, the reference driver's answer).
        let into_hole = s + mapped_run < o.pages.len() && self.rng.below(5) == 0;
        let len = if into_hole {
            mapped_run + 1
        } else {
            1 + self.rng.below(mapped_run)
        };
        self.ctx()
            .unmap(o.r.base + s * page, len * page)
            .expect("unmap");
        for k in s..s + len {
            if let Some(pm) = self.res[i].pages[k].take() {
                self.phys.get_mut(&pm.phys).expect("live").mapped -= 1;
            } else {
                assert!(into_hole && k == s + len - 1, "page {k} was mapped");
            }
        }
    }

    fn set_access(&mut self) {
        if self.res.is_empty() {
            return self.reserve();
        }
        let page = self.page();
        let i = self.rng.below(self.res.len());
        let pages = self.res[i].pages.len();
        let s = self.rng.below(pages);
        let len = 1 + self.rng.below(pages - s);
        let access = random_access(&mut self.rng);
        let base = self.res[i].r.base;
        self.ctx()
            .set_access_attribute(base + s * page, len * page, access)
            .expect("set access");
        for pm in self.res[i].pages[s..s + len].iter_mut().flatten() {
            pm.access = access;
        }
    }

    fn get_access(&mut self) {
        if self.res.is_empty() {
            return self.reserve();
        }
        let page = self.page();
        let i = self.rng.below(self.res.len());
        let o = &self.res[i];
        let s = self.rng.below(o.pages.len());
        let len = 1 + self.rng.below(o.pages.len() - s);
        let attr = |p: &Option<PageMap>| p.map_or(AccessAttribute::None, |m| m.access);
        let first = attr(&o.pages[s]);
        let run = o.pages[s..s + len]
            .iter()
            .take_while(|p| attr(p) == first)
            .count();
        assert_eq!(
            self.ctx()
                .get_access_attribute(o.r.base + s * page, len * page),
            Ok((first, run * page)),
            "thread {} get-access of pages {s}..{} of [{:#x}, {:#x})",
            self.id,
            s + len,
            o.r.base,
            o.r.end()
        );
    }

    /// Every address (own reservations and claims) where page `page` of `phys` is readable.
    fn readable_aliases(&self, phys: u64, page: usize) -> Vec<usize> {
        let ps = self.page();
        let own = self.res.iter().flat_map(|o| {
            o.pages
                .iter()
                .enumerate()
                .filter_map(move |(k, pm)| pm.map(|m| (o.r.base + k * ps, m)))
        });
        let claimed = self
            .claims
            .iter()
            .map(|(&slot, &m)| (self.sh.contended.base + slot * ps, m));
        own.chain(claimed)
            .filter(|(_, m)| m.phys == phys && m.page == page && m.access != AccessAttribute::None)
            .map(|(a, _)| a)
            .collect()
    }

    /// Asserts the attribute the driver reports for the page at `addr` before touching it, so a
    /// model error fails an assertion instead of faulting.
    fn check_attr(&self, addr: usize, want: AccessAttribute) {
        assert_eq!(
            self.ctx().get_access_attribute(addr, self.page()),
            Ok((want, self.page())),
            "thread {} page {addr:#x}",
            self.id
        );
    }

    /// Writes a fresh tag at both ends of the page at `addr` (mapped read-write to `pm`) and
    /// reads it back through every readable alias.
    fn write_and_check(&mut self, addr: usize, pm: PageMap) {
        let tag = self.tag();
        let last = self.page() - 8;
        // The page at `addr` is mapped read-write (checked against the driver).
        common::dev_write(self.ctx(), addr, tag);
        common::dev_write(self.ctx(), addr + last, !tag);
        self.phys.get_mut(&pm.phys).expect("live").content[pm.page] = tag;
        self.n.writes_checked += 1;
        for a in self.readable_aliases(pm.phys, pm.page) {
            // Every alias is mapped readable.
            let (x, y) = (
                common::dev_read(self.ctx(), a),
                common::dev_read(self.ctx(), a + last),
            );
            assert_eq!((x, y), (tag, !tag), "thread {} alias {a:#x}", self.id);
        }
    }

    fn write_read(&mut self) {
        let Some((i, p)) = self.pick_mapped() else {
            return self.map();
        };
        let addr = self.res[i].r.base + p * self.page();
        let pm = self.res[i].pages[p].expect("mapped");
        self.check_attr(addr, pm.access);
        match pm.access {
            AccessAttribute::ReadWrite => self.write_and_check(addr, pm),
            AccessAttribute::ReadOnly => {
                // The page is mapped read-only.
                let v = common::dev_read(self.ctx(), addr);
                let want = self.phys[&pm.phys].content[pm.page];
                // A page never written holds zero on the host backend only.
                if want != 0 || self.sh.fresh_reads_zero {
                    assert_eq!(v, want, "thread {}", self.id);
                    self.n.reads_checked += 1;
                }
            }
            AccessAttribute::None => {}
        }
    }

    /// Reads another thread's reservation, which that thread may free at any moment.
    fn race_foreign_reservation(&mut self) {
        let other = (self.id + 1 + self.rng.below(THREADS - 1)) % THREADS;
        let list = self.sh.published[other].lock().unwrap().clone();
        if list.is_empty() {
            return;
        }
        let r = list[self.rng.below(list.len())];
        match self.ctx().get_access_attribute(r.base, r.size) {
            Ok((_, len)) => assert!(
                len > 0 && len <= r.size && len % self.page() == 0,
                "run {len:#x} of {:#x}",
                r.size
            ),
            // Freed meanwhile (its range may even belong to someone else now).
            Err(Error::InvalidArgument(_)) => self.n.foreign_gone += 1,
            Err(e) => panic!("get-access of a foreign reservation: {e:?}"),
        }
        // The contended reservation is always live, whatever is mapped in it.
        let c = self.sh.contended;
        let (_, len) = self
            .ctx()
            .get_access_attribute(c.base, c.size)
            .expect("contended get-access");
        assert!(len > 0 && len <= c.size);
    }

    /// Calls on the pinned object, which stays mapped for the whole run.
    fn race_pinned(&mut self) {
        let page = self.page();
        let pinned = self.sh.pinned;
        let k = self.rng.below(PINNED_PAGES);
        match self.rng.below(3) {
            0 => match self.ctx().destroy_physical_memory(self.sh.pinned_phys) {
                Err(Error::HandleObjectInUse(_)) => {}
                other => panic!("destroy of a mapped shared object: {other:?}"),
            },
            1 => {
                if let Some(id) = self.pick_phys() {
                    let r = self.ctx().map(
                        pinned.base + k * page,
                        page,
                        self.phys[&id].h,
                        0,
                        AccessAttribute::ReadWrite,
                    );
                    expect_invalid_argument("map over the pinned mapping", r);
                }
            }
            _ => {
                assert_eq!(
                    self.ctx().get_access_attribute(pinned.base, pinned.size),
                    Ok((AccessAttribute::ReadWrite, pinned.size))
                );
                // The pinned range is mapped read-write for the whole run.
                let v = common::dev_read(self.ctx(), pinned.base + k * page);
                assert_eq!(v, pinned_value(k));
            }
        }
    }

    /// Claims a slot of the contended reservation by mapping into it, or checks and gives back
    /// one this thread holds.
    fn contend(&mut self) {
        let page = self.page();
        let slot = self.rng.below(SLOTS);
        let addr = self.sh.contended.base + slot * page;
        if let Some(pm) = self.claims.get(&slot).copied() {
            self.check_attr(addr, AccessAttribute::ReadWrite);
            // This thread's map holds the slot, read-write.
            let v = common::dev_read(self.ctx(), addr);
            assert_eq!(
                v, self.phys[&pm.phys].content[pm.page],
                "thread {} slot {slot}: someone else's map replaced ours",
                self.id
            );
            self.write_and_check(addr, pm);
            self.ctx().unmap(addr, page).expect("unmap own slot");
            self.claims.remove(&slot);
            self.phys.get_mut(&pm.phys).expect("live").mapped -= 1;
            return;
        }
        let Some(id) = self.pick_phys() else {
            return self.create();
        };
        let off = self.rng.below(self.phys[&id].content.len());
        match self.ctx().map(
            addr,
            page,
            self.phys[&id].h,
            off * page,
            AccessAttribute::ReadWrite,
        ) {
            Ok(()) => {
                let pm = PageMap {
                    phys: id,
                    page: off,
                    access: AccessAttribute::ReadWrite,
                };
                self.claims.insert(slot, pm);
                self.phys.get_mut(&id).expect("live").mapped += 1;
                self.n.claims_won += 1;
                self.write_and_check(addr, pm);
            }
            // Another thread holds the slot.
            Err(Error::InvalidArgument(_)) => self.n.claims_lost += 1,
            Err(e) => panic!("claim of slot {slot}: {e:?}"),
        }
    }

    /// Frees of shared reservations with a wrong base or size are refused.
    fn bad_frees(&mut self) {
        let page = self.page();
        let (c, p) = (self.sh.contended, self.sh.pinned);
        expect_invalid_argument(
            "free with the wrong size",
            self.ctx().free(c.base, c.size + page),
        );
        expect_invalid_argument(
            "free inside a reservation",
            self.ctx().free(p.base + page, page),
        );
    }

    /// Gives everything back; each call must succeed.
    fn finish(&mut self) {
        let page = self.page();
        for (slot, pm) in std::mem::take(&mut self.claims) {
            self.ctx()
                .unmap(self.sh.contended.base + slot * page, page)
                .expect("unmap claim");
            self.phys.get_mut(&pm.phys).expect("live").mapped -= 1;
        }
        for o in std::mem::take(&mut self.res) {
            self.ctx().free_reservation(o.r).expect("free");
            for pm in o.pages.into_iter().flatten() {
                self.phys.get_mut(&pm.phys).expect("live").mapped -= 1;
            }
        }
        self.publish();
        for (_, p) in std::mem::take(&mut self.phys) {
            assert_eq!(p.mapped, 0);
            self.ctx().destroy_physical_memory(p.h).expect("destroy");
        }
    }
}

/// Runs `ops` operations on each of `THREADS` threads around freshly made shared objects, and
/// releases the shared objects afterwards.
fn run(ctx: &Context, devs: &[Device], ops: usize, seed: u64) -> Vec<Counts> {
    let fresh_reads_zero = !common::part_not_applicable_on(
        hetmem::BackendKind::Cuda,
        "pages never written read zero: cuda device memory is not zero-filled, and nothing in \
         the spec requires it",
    );
    let sh = Shared::new(ctx, devs, fresh_reads_zero);
    let start = Barrier::new(THREADS);
    let counts = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|id| {
                let (sh, start) = (&sh, &start);
                s.spawn(move || {
                    start.wait();
                    Worker::new(id, sh, seed).run(ops)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a worker panicked"))
            .collect()
    });
    sh.release();
    counts
}

fn assert_all_zero(stats: &VmStats) {
    assert_eq!(
        (
            stats.reservations,
            stats.reserved_bytes,
            stats.physical_objects,
            stats.mapped_runs,
            stats.mapped_bytes,
            stats.host_physical_bytes,
        ),
        (0, 0, 0, 0, 0, 0),
        "{stats:?}"
    );
    assert!(stats.devices.iter().all(|d| d.used == 0), "{stats:?}");
}

#[test]
fn concurrent_mixed_operations_leak_nothing() {
    if common::skip() {
        return;
    }
    let rt = runtime_with(2, 256 << 20);
    let devs = rt.driver().devices();
    let ctx = rt.driver().create_context().expect("context");
    let page = ctx.query_page_size(&devs[0], 1).expect("page size");
    if common::on_host() {
        assert_eq!(page, 64 << 10);
    }
    // Fewer operations on cuda, where every write and read is a device copy.
    let ops = if common::on_cuda() { OPS / 10 } else { OPS };

    // Warm up so the C library has its per-thread arenas and cached stacks; then count.
    run(&ctx, &devs, WARMUP_OPS.min(ops), !SEED);
    assert_all_zero(&rt.driver().vm_stats());
    let maps_before = mapping_count();
    let fds_before = open_fd_count();

    let t = Instant::now();
    let counts = run(&ctx, &devs, ops, SEED);
    let took = t.elapsed();
    let total: usize = counts.iter().map(|c| c.ops.iter().sum::<usize>()).sum();
    assert_eq!(total, THREADS * ops);
    let sum = |f: fn(&Counts) -> usize| counts.iter().map(f).sum::<usize>();
    eprintln!(
        "{total} operations on {THREADS} threads in {took:?} (seed {SEED:#x}): {} writes and {} \
         reads checked; contended slots won {} / lost {}; foreign reservations gone {} times; \
         ops per kind {:?}",
        sum(|c| c.writes_checked),
        sum(|c| c.reads_checked),
        sum(|c| c.claims_won),
        sum(|c| c.claims_lost),
        sum(|c| c.foreign_gone),
        counts.iter().fold([0; 13], |mut a, c| {
            a.iter_mut().zip(c.ops).for_each(|(x, y)| *x += y);
            a
        })
    );
    // The run checked what it claims to: writes went through and races happened.
    assert!(sum(|c| c.writes_checked) > 1000 * ops / OPS);
    assert!(sum(|c| c.claims_won) > 100 * ops / OPS);

    // Nothing is left: capacity, bookkeeping, fds and mappings are as before.
    assert!(devs.iter().all(|d| d.used_memory() == 0));
    assert_all_zero(&rt.driver().vm_stats());
    if !common::part_not_applicable_on(
        hetmem::BackendKind::Cuda,
        "the whole-process counts of fds and mappings: on the host backend every one is \
         hetmem's (memfds, mmaps); on cuda the driver opens descriptors and maps memory of its \
         own as it pleases",
    ) {
        assert_eq!(open_fd_count(), fds_before, "leaked fds");
        assert_eq!(mapping_count(), maps_before, "leaked mappings");
    }
}
