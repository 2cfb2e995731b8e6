//! Model-based property test of managed memory: random interleavings of host reads and writes
//! from several threads, host-synchronous memset / memcpy (managed and plain sides), stream
//! fills and copies on several devices (managed and USM sides), prefetches and all six advices
//! to devices, the host, a NUMA node and the current NUMA node, allocation and free of a second
//! allocation, and calls that must be refused (bad sizes, alignments, locations, ranges),
//! against a flat reference memory and a model of residency (with LRU eviction on small
//! devices). After every step: the contents equal the reference (read without migrating);
//! every page lives exactly where the model says; every counter (host faults, pages and bytes
//! to and from the host and each device, evictions, resident pages, allocations) equals the
//! model's; and the READ_MOSTLY, PREFERRED_LOCATION(_TYPE/_ID), LAST_PREFETCH_LOCATION
//! (_TYPE/_ID) and ACCESSED_BY answers, per page and over each allocation, are the model's.

mod common;

/// Why this file runs on the host backend only.
const HOST_ONLY: &str =
    "the reference model is the host engine's residency: LRU eviction from a modelled device of \
     3 pages, read-mostly duplicates on the host and devices, host fault counts, and the advice \
     refusals (a preferred location where copies live elsewhere) and migration counters that \
     follow from them, over two devices; on cuda residency is hetmem's record of its own moves \
     of cuMemAllocManaged pages (no eviction, no duplicates, host loads unseen) and the device \
     is the whole GPU (the contents and attribute rules are managed_rules' and managed_attrs')";

use common::{runtime_with, scalars};

use std::collections::{BTreeMap, BTreeSet};

use hetmem::managed::{current_numa_node, location_type as lt, numa_nodes};
use hetmem::{
    Advice, AllocDesc, Context, Location, RangeAttribute as A, Runtime, Stream,
    MANAGED_PAGE_SIZE as PAGE,
};
use proptest::prelude::*;

/// Pages of the main allocation (always live).
const MAIN: usize = 6;
/// Pages of the extra allocation (freed and allocated again by the ops).
const EXTRA: usize = 2;
/// Pages of the combined index space the ops address: main, then extra.
const PAGES: usize = MAIN + EXTRA;
const DEVICES: usize = 2;
const CAP_PAGES: usize = 3;
/// The USM host buffer that is the plain side of copies.
const PLAIN: usize = 2 * PAGE;

/// A location as an op names it.
#[derive(Debug, Clone, Copy)]
enum TLoc {
    Dev(usize),
    Host,
    /// The first NUMA node of the machine.
    Numa,
    NumaCurrent,
    Invalid,
}

#[derive(Debug, Clone)]
enum Op {
    /// Several threads each read one byte (page, offset).
    HostRead(Vec<(usize, usize)>),
    /// Several threads each write one byte (pages may repeat).
    HostWrite(Vec<(usize, usize, u8)>),
    /// Host-synchronous memset (byte offsets in the combined space).
    HostMemset {
        start: usize,
        len: usize,
        val: u8,
    },
    /// Host-synchronous memcpy between managed ranges.
    HostCopy {
        dst: usize,
        src: usize,
        len: usize,
    },
    /// Host-synchronous memcpy between managed memory and a plain buffer.
    HostCopyPlain {
        off: usize,
        len: usize,
        into_managed: bool,
        val: u8,
    },
    Fill {
        dev: usize,
        start: usize,
        len: usize,
        val: u8,
    },
    Copy {
        dev: usize,
        dst: usize,
        src: usize,
        len: usize,
    },
    /// Stream copy between managed memory and the USM host buffer.
    CopyPlain {
        dev: usize,
        off: usize,
        poff: usize,
        len: usize,
        into_managed: bool,
    },
    Prefetch {
        to: TLoc,
        page: usize,
        n: usize,
    },
    Advise {
        advice: Advice,
        to: TLoc,
        page: usize,
        n: usize,
    },
    AllocExtra,
    FreeExtra,
    /// A call from [`BAD`] that must be refused.
    Bad(usize),
}

const BAD: usize = 16;

fn tloc() -> impl Strategy<Value = TLoc> {
    prop_oneof![
        3 => (0..DEVICES).prop_map(TLoc::Dev),
        1 => Just(TLoc::Host),
        1 => Just(TLoc::Numa),
        1 => Just(TLoc::NumaCurrent),
        1 => Just(TLoc::Invalid),
    ]
}

fn advice() -> impl Strategy<Value = Advice> {
    (0..6u32).prop_map(|v| Advice::from_raw(v).unwrap())
}

fn op() -> impl Strategy<Value = Op> {
    let end = PAGES * PAGE;
    let off = 0..PAGE;
    let page = 0..PAGES;
    let span = (0..end, 1..3 * PAGE).prop_map(move |(s, l)| (s, l.min(end - s)));
    prop_oneof![
        1 => prop::collection::vec((page.clone(), off.clone()), 1..5).prop_map(Op::HostRead),
        1 => prop::collection::vec((page.clone(), off, any::<u8>()), 1..5).prop_map(Op::HostWrite),
        1 => (span.clone(), any::<u8>())
            .prop_map(|((start, len), val)| Op::HostMemset { start, len, val }),
        1 => (0..end, 0..end, 1..2 * PAGE).prop_map(move |(dst, src, len)| Op::HostCopy {
            dst,
            src,
            len: len.min(end - dst).min(end - src),
        }),
        1 => (0..end, 1..PLAIN, any::<bool>(), any::<u8>()).prop_map(
            move |(off, len, into_managed, val)| Op::HostCopyPlain {
                off,
                len: len.min(end - off),
                into_managed,
                val
            }
        ),
        1 => (0..DEVICES, span, any::<u8>())
            .prop_map(|(dev, (start, len), val)| Op::Fill { dev, start, len, val }),
        1 => (0..DEVICES, 0..end, 0..end, 1..2 * PAGE).prop_map(move |(dev, dst, src, len)| {
            Op::Copy {
                dev,
                dst,
                src,
                len: len.min(end - dst).min(end - src),
            }
        }),
        1 => (0..DEVICES, 0..end, 0..PLAIN, 1..PLAIN, any::<bool>()).prop_map(
            move |(dev, off, poff, len, into_managed)| Op::CopyPlain {
                dev,
                off,
                poff,
                len: len.min(end - off).min(PLAIN - poff),
                into_managed,
            }
        ),
        2 => (tloc(), page.clone(), 1..4usize).prop_map(|(to, page, n)| Op::Prefetch {
            to,
            page,
            n: n.min(PAGES - page),
        }),
        4 => (advice(), tloc(), page, 1..5usize).prop_map(|(advice, to, page, n)| {
            Op::Advise {
                advice,
                to,
                page,
                n: n.min(PAGES - page),
            }
        }),
        1 => Just(Op::AllocExtra),
        1 => Just(Op::FreeExtra),
        1 => (0..BAD).prop_map(Op::Bad),
    ]
}

/// A resolved location, ordered as the library orders ACCESSED_BY answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum MLoc {
    Dev(usize),
    Host,
    Numa(u32),
}

impl MLoc {
    fn dev(self) -> Option<usize> {
        match self {
            MLoc::Dev(d) => Some(d),
            _ => None,
        }
    }
    fn id(self) -> i32 {
        match self {
            MLoc::Dev(d) => d as i32,
            MLoc::Host => -1,
            MLoc::Numa(n) => n as i32,
        }
    }
    fn ty(self) -> i32 {
        (match self {
            MLoc::Dev(_) => lt::DEVICE,
            MLoc::Host => lt::HOST,
            MLoc::Numa(_) => lt::HOST_NUMA,
        }) as i32
    }
    fn id_only(self) -> i32 {
        match self {
            MLoc::Host => -2,
            l => l.id(),
        }
    }
}

impl TLoc {
    fn location(self) -> Location {
        match self {
            TLoc::Dev(d) => Location::Device(d as u32),
            TLoc::Host => Location::Host,
            TLoc::Numa => Location::HostNuma(numa_nodes()[0]),
            TLoc::NumaCurrent => Location::HostNumaCurrent,
            TLoc::Invalid => Location::Invalid,
        }
    }
    /// What the library resolves it to (`None`: INVALID, refused where a place is needed).
    fn resolve(self) -> Option<MLoc> {
        match self {
            TLoc::Dev(d) => Some(MLoc::Dev(d)),
            TLoc::Host => Some(MLoc::Host),
            TLoc::Numa => Some(MLoc::Numa(numa_nodes()[0])),
            TLoc::NumaCurrent => Some(MLoc::Numa(current_numa_node())),
            TLoc::Invalid => None,
        }
    }
}

/// The model of one page.
#[derive(Debug, Clone, Default)]
struct MPage {
    host: Option<bool>, // Some(read_only)
    devs: [bool; DEVICES],
    tick: [u64; DEVICES],
    rm: bool,
    preferred: Option<MLoc>,
    accessed_by: BTreeSet<MLoc>,
    last_prefetch: Option<MLoc>,
}

/// Counters the model predicts (cumulative, pages).
#[derive(Debug, Clone, Default, PartialEq)]
struct MStats {
    to_host: u64,
    from_host: u64,
    dev_to: [u64; DEVICES],
    dev_from: [u64; DEVICES],
    evictions: [u64; DEVICES],
}

#[derive(Debug, Default)]
struct Model {
    pages: Vec<MPage>,
    tick: u64,
    /// Host faults predicted for this step (reads before writes), and how many fewer the order
    /// of a memcpy's accesses may give (a write first).
    faults: u64,
    slack: u64,
    stats: MStats,
    extra_live: bool,
}

impl Model {
    fn copies(&self, p: usize) -> usize {
        let pg = &self.pages[p];
        pg.host.is_some() as usize + pg.devs.iter().filter(|&&x| x).count()
    }
    fn first_dev(&self, p: usize) -> Option<usize> {
        (0..DEVICES).find(|&d| self.pages[p].devs[d])
    }
    fn ensure_host(&mut self, p: usize, write: bool) -> bool {
        if let Some(ro) = self.pages[p].host {
            if write && ro {
                let pg = &mut self.pages[p];
                pg.devs = [false; DEVICES];
                pg.host = Some(false);
                return true;
            }
            return false;
        }
        if let Some(d) = self.first_dev(p) {
            self.stats.to_host += 1;
            self.stats.dev_from[d] += 1;
        }
        let pg = &mut self.pages[p];
        let exclusive = write || !pg.rm;
        pg.host = Some(!exclusive);
        if exclusive {
            pg.devs = [false; DEVICES];
        }
        true
    }
    fn take_slot(&mut self, d: usize, keep: &[usize]) {
        loop {
            let used = self.pages.iter().filter(|p| p.devs[d]).count();
            if used < CAP_PAGES {
                return;
            }
            let candidates = |skip_preferring: bool| {
                (0..PAGES)
                    .filter(|&p| self.pages[p].devs[d] && !keep.contains(&p))
                    .filter(|&p| !skip_preferring || self.pages[p].preferred != Some(MLoc::Dev(d)))
                    .min_by_key(|&p| self.pages[p].tick[d])
            };
            let victim = candidates(true)
                .or_else(|| candidates(false))
                .expect("a page to evict");
            if self.copies(victim) == 1 {
                self.pages[victim].host = Some(false);
                self.stats.to_host += 1;
                self.stats.dev_from[d] += 1;
                self.stats.evictions[d] += 1;
            }
            self.pages[victim].devs[d] = false;
        }
    }
    fn ensure_device(&mut self, p: usize, d: usize, write: bool, keep: &[usize]) {
        let exclusive = write || !self.pages[p].rm;
        if !self.pages[p].devs[d] {
            self.take_slot(d, keep);
            if self.pages[p].host.is_some() {
                self.stats.from_host += 1;
                self.stats.dev_to[d] += 1;
            } else if let Some(e) = self.first_dev(p) {
                self.stats.dev_from[e] += 1;
                self.stats.dev_to[d] += 1;
            }
            let pg = &mut self.pages[p];
            if pg.host == Some(false) && !exclusive {
                pg.host = Some(true);
            }
            pg.devs[d] = true;
        }
        let pg = &mut self.pages[p];
        if exclusive {
            pg.host = None;
            for e in 0..DEVICES {
                if e != d {
                    pg.devs[e] = false;
                }
            }
        }
        self.tick += 1;
        self.pages[p].tick[d] = self.tick;
    }
    fn ensure_at(&mut self, p: usize, to: MLoc, write: bool) {
        match to.dev() {
            Some(d) => self.ensure_device(p, d, write, &[p]),
            None => {
                self.ensure_host(p, write);
            }
        }
    }
    /// Device operation over operands (byte offset modulo nothing, write, managed), in page
    /// segments as the runtime cuts them; plain operands only cut.
    fn device_op(&mut self, d: usize, ops: &[(usize, bool, bool)], len: usize, backward: bool) {
        let mut cuts = vec![0, len];
        for &(a, _, _) in ops {
            let mut c = PAGE - a % PAGE;
            while c < len {
                cuts.push(c);
                c += PAGE;
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        let mut segs: Vec<usize> = cuts[..cuts.len() - 1].to_vec();
        if backward {
            segs.reverse();
        }
        let managed: Vec<(usize, bool)> = ops
            .iter()
            .filter(|o| o.2)
            .map(|&(a, w, _)| (a, w))
            .collect();
        for s in segs {
            let keep: Vec<usize> = managed.iter().map(|&(a, _)| (a + s) / PAGE).collect();
            for (i, &(_, w)) in managed.iter().enumerate() {
                if !w {
                    self.ensure_device(keep[i], d, false, &keep);
                }
            }
            for (i, &(_, w)) in managed.iter().enumerate() {
                if w {
                    self.ensure_device(keep[i], d, true, &keep);
                }
            }
        }
    }
    fn live(&self, p: usize) -> bool {
        p < MAIN || self.extra_live
    }
    /// Whether `[off, off+len)` of the combined space lies in one live allocation.
    fn valid(&self, off: usize, len: usize) -> bool {
        let (a, b) = (off / PAGE, (off + len - 1) / PAGE);
        (a < MAIN) == (b < MAIN) && self.live(a)
    }
    fn pages_of(off: usize, len: usize) -> std::ops::RangeInclusive<usize> {
        off / PAGE..=(off + len - 1) / PAGE
    }
    /// The model of a refused or accepted advice: `Err(code)` if refused (nothing changes).
    fn advise(&mut self, advice: Advice, to: TLoc, range: &[usize]) -> Result<(), u32> {
        match advice {
            Advice::SetReadMostly => {
                for &p in range {
                    match self.pages[p].host {
                        Some(_) => self.pages[p].host = Some(true),
                        None => {
                            if let Some(d) = self.first_dev(p) {
                                self.stats.to_host += 1;
                                self.stats.dev_from[d] += 1;
                            }
                            self.pages[p].host = Some(true);
                        }
                    }
                    self.pages[p].rm = true;
                }
            }
            Advice::UnsetReadMostly => {
                let loc = to.resolve().unwrap_or(MLoc::Host);
                for &p in range {
                    if self.pages[p].rm {
                        if self.copies(p) > 0 {
                            self.ensure_at(p, loc, true);
                        }
                        self.pages[p].rm = false;
                    }
                }
            }
            Advice::SetPreferredLocation => {
                let loc = to.resolve().ok_or(107_000u32)?;
                let refused = range.iter().any(|&p| {
                    let pg = &self.pages[p];
                    !pg.rm
                        && match loc.dev() {
                            None => pg.devs.iter().any(|&x| x),
                            Some(d) => {
                                pg.host.is_some() || (0..DEVICES).any(|e| e != d && pg.devs[e])
                            }
                        }
                });
                if refused {
                    return Err(107_000);
                }
                // The whole range must fit on the device at once.
                if loc.dev().is_some() && range.len() > CAP_PAGES {
                    return Err(207_001);
                }
                for &p in range {
                    match loc.dev() {
                        None if !self.pages[p].rm => {
                            self.ensure_host(p, false);
                        }
                        Some(d) => self.ensure_device(p, d, false, range),
                        None => {}
                    }
                }
                for &p in range {
                    self.pages[p].preferred = Some(loc);
                }
            }
            Advice::UnsetPreferredLocation => {
                for &p in range {
                    self.pages[p].preferred = None;
                }
            }
            Advice::SetAccessedBy => {
                let loc = to.resolve().ok_or(107_000u32)?;
                for &p in range {
                    if self.pages[p]
                        .preferred
                        .is_some_and(|pl| pl.dev() == loc.dev())
                    {
                        self.ensure_at(p, loc, false);
                    }
                    self.pages[p].accessed_by.insert(loc);
                }
            }
            Advice::UnsetAccessedBy => {
                let loc = to.resolve().ok_or(107_000u32)?;
                for &p in range {
                    self.pages[p].accessed_by.remove(&loc);
                }
            }
        }
        Ok(())
    }
    /// The eight attribute answers the model gives for `pages` (ACCESSED_BY in 4 slots).
    fn attrs(&self, pages: std::ops::Range<usize>) -> ([i32; 7], Vec<i32>) {
        let ps: Vec<&MPage> = self.pages[pages].iter().collect();
        let uniform = |f: &dyn Fn(&MPage) -> Option<MLoc>| {
            let v = f(ps[0])?;
            ps.iter().all(|p| f(p) == Some(v)).then_some(v)
        };
        let pref = uniform(&|p| p.preferred);
        let last = uniform(&|p| p.last_prefetch);
        let mut set = ps[0].accessed_by.clone();
        for p in &ps[1..] {
            set = set.intersection(&p.accessed_by).copied().collect();
        }
        let mut ab: Vec<i32> = set.iter().map(|l| l.id()).collect();
        ab.resize(4, -2);
        ab.truncate(4);
        (
            [
                ps.iter().all(|p| p.rm) as i32,
                pref.map_or(-2, MLoc::id),
                pref.map_or(lt::INVALID as i32, MLoc::ty),
                pref.map_or(-2, MLoc::id_only),
                last.map_or(-2, MLoc::id),
                last.map_or(lt::INVALID as i32, MLoc::ty),
                last.map_or(-2, MLoc::id_only),
            ],
            ab,
        )
    }
}

struct Sut {
    rt: Runtime,
    ctx: Context,
    streams: Vec<Stream>,
    base: usize,
    extra: usize,
    plain: usize,
}

impl Sut {
    /// The address of byte `off` of the combined space (a freed extra allocation keeps its
    /// old, no longer managed, address).
    fn addr(&self, off: usize) -> usize {
        if off < MAIN * PAGE {
            self.base + off
        } else {
            self.extra + off - MAIN * PAGE
        }
    }
}

/// Runs refused call `i`; returns (what, the ACL code it gave, the code it must give).
fn bad_call(sut: &Sut, i: usize) -> (&'static str, u32, u32) {
    let b = sut.base;
    let c = &sut.ctx;
    let s = &sut.streams[i % DEVICES];
    let code = |r: hetmem::Result<()>| r.map_or_else(|e| e.acl_error(), |()| 0);
    match i {
        0 => (
            "advise unaligned",
            code(c.mem_advise(b + 4096, PAGE, Advice::SetReadMostly, Location::Host)),
            107_008,
        ),
        1 => (
            "advise size not 2 MiB",
            code(c.mem_advise(b, PAGE + 1, Advice::SetAccessedBy, Location::Host)),
            107_000,
        ),
        2 => (
            "advise size 0",
            code(c.mem_advise(b, 0, Advice::UnsetReadMostly, Location::Host)),
            100_000,
        ),
        3 => (
            "preferred bad device",
            code(c.mem_advise(
                b,
                PAGE,
                Advice::SetPreferredLocation,
                Location::Device(DEVICES as u32),
            )),
            107_000,
        ),
        4 => (
            "unset accessed-by bad NUMA node",
            code(c.mem_advise(
                b,
                PAGE,
                Advice::UnsetAccessedBy,
                Location::HostNuma(1 << 20),
            )),
            107_000,
        ),
        5 => (
            "prefetch flags",
            code(c.mem_prefetch(b, PAGE, Location::Device(0), 1, s)),
            100_000,
        ),
        6 => (
            "prefetch bad device",
            code(c.mem_prefetch(b, PAGE, Location::Device(9), 0, s)),
            107_000,
        ),
        7 => (
            "prefetch past the end",
            code(c.mem_prefetch(b + PAGE, MAIN * PAGE, Location::Host, 0, s)),
            107_000,
        ),
        8 => (
            "get-attr dataSize 3",
            code(c.managed_get_attr(A::ReadMostly, b, PAGE, &mut [0u8; 3])),
            107_000,
        ),
        9 => (
            "accessed-by 0 slots",
            code(c.managed_accessed_by(b, PAGE, 0).map(drop)),
            107_000,
        ),
        10 => (
            "alloc size 0",
            code(c.alloc_managed(0, 1).map(drop)),
            100_000,
        ),
        11 => (
            "alloc flag 0",
            code(c.alloc_managed(PAGE as u64, 0).map(drop)),
            100_000,
        ),
        12 => ("free interior", code(c.free_managed(b + PAGE)), 107_000),
        13 => (
            "host memset past the end",
            code(c.managed_memset(b + MAIN * PAGE - 1, 0, 2)),
            107_000,
        ),
        14 => (
            "stream memset past the end",
            code(s.memset_async(b + MAIN * PAGE - 1, 0, 2)),
            107_000,
        ),
        15 => (
            "host memcpy from unmapped memory",
            code(c.managed_memcpy(b, 0x1000, 16)),
            107_000,
        ),
        _ => unreachable!(),
    }
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let rt = runtime_with(DEVICES as u32, (CAP_PAGES * PAGE) as u64);
    let ctx = rt.driver().create_context().unwrap();
    let base = ctx.alloc_managed((MAIN * PAGE) as u64, 1).unwrap();
    let extra = ctx.alloc_managed((EXTRA * PAGE) as u64, 1).unwrap();
    let plain = ctx
        .alloc_host(&AllocDesc {
            relaxed_max_size: true,
            ..AllocDesc::new(PLAIN)
        })
        .unwrap();
    let streams = (0..DEVICES as u32)
        .map(|d| ctx.create_stream(&rt.driver().device(d).unwrap()).unwrap())
        .collect();
    let mut sut = Sut {
        rt,
        ctx,
        streams,
        base,
        extra,
        plain,
    };
    // SAFETY: the USM host buffer is live for the whole run and only this thread (or a
    // synchronized stream) touches it.
    let plain_mem =
        |sut: &Sut| unsafe { std::slice::from_raw_parts(sut.plain as *const u8, PLAIN) };
    // SAFETY: as above.
    unsafe { std::ptr::write_bytes(plain as *mut u8, 0, PLAIN) };
    let mut reference = vec![0u8; PAGES * PAGE];
    let mut plain_ref = vec![0u8; PLAIN];
    let mut model = Model {
        pages: vec![MPage::default(); PAGES],
        extra_live: true,
        ..Default::default()
    };
    for (step, op) in ops.into_iter().enumerate() {
        let before = sut.rt.driver().managed_stats();
        // The code the call gave and the one the model expects (0: success).
        let mut codes = (0u32, 0u32);
        let code = |r: hetmem::Result<()>| r.map_or_else(|e| e.acl_error(), |()| 0);
        match &op {
            Op::HostRead(reads) => {
                let reads: Vec<_> = reads.iter().filter(|r| model.live(r.0)).copied().collect();
                let hs: Vec<_> = reads
                    .iter()
                    .map(|&(p, o)| {
                        let a = sut.addr(p * PAGE + o);
                        // SAFETY: inside a live allocation.
                        std::thread::spawn(move || unsafe { (a as *const u8).read_volatile() })
                    })
                    .collect();
                for (h, &(p, o)) in hs.into_iter().zip(&reads) {
                    prop_assert_eq!(h.join().unwrap(), reference[p * PAGE + o], "step {}", step);
                }
                let pages: BTreeSet<usize> = reads.iter().map(|r| r.0).collect();
                for p in pages {
                    model.faults += model.ensure_host(p, false) as u64;
                }
            }
            Op::HostWrite(writes) => {
                // One byte per thread; a byte written by two threads keeps the last in order.
                let mut last = BTreeMap::new();
                for &(p, o, v) in writes.iter().filter(|w| model.live(w.0)) {
                    last.insert((p, o), v);
                }
                let hs: Vec<_> = last
                    .iter()
                    .map(|(&(p, o), &v)| {
                        let a = sut.addr(p * PAGE + o);
                        // SAFETY: inside a live allocation; distinct bytes per thread.
                        std::thread::spawn(move || unsafe { (a as *mut u8).write_volatile(v) })
                    })
                    .collect();
                for h in hs {
                    h.join().unwrap();
                }
                for (&(p, o), &v) in &last {
                    reference[p * PAGE + o] = v;
                }
                let pages: BTreeSet<usize> = last.keys().map(|k| k.0).collect();
                for p in pages {
                    model.faults += model.ensure_host(p, true) as u64;
                }
            }
            &Op::HostMemset { start, len, val } => {
                // A dead allocation's old address may be reused by other mappings: skipped.
                if model.live(start / PAGE) && model.live((start + len - 1) / PAGE) {
                    codes.0 = code(sut.ctx.managed_memset(sut.addr(start), val, len));
                    if model.valid(start, len) {
                        reference[start..start + len].fill(val);
                        for p in Model::pages_of(start, len) {
                            model.faults += model.ensure_host(p, true) as u64;
                        }
                    } else {
                        codes.1 = 107_000;
                    }
                }
            }
            &Op::HostCopy { dst, src, len } => {
                let ends = [dst, dst + len - 1, src, src + len - 1];
                if ends.iter().all(|&o| model.live(o / PAGE)) {
                    codes.0 = code(sut.ctx.managed_memcpy(sut.addr(dst), sut.addr(src), len));
                    if model.valid(dst, len) && model.valid(src, len) {
                        reference.copy_within(src..src + len, dst);
                        let d: BTreeSet<usize> = Model::pages_of(dst, len).collect();
                        let s: BTreeSet<usize> = Model::pages_of(src, len).collect();
                        for &p in d.union(&s) {
                            // A page both read and written: reading first may fault twice
                            // (a read-only copy, then the write) where writing first faults once.
                            if d.contains(&p)
                                && s.contains(&p)
                                && model.pages[p].rm
                                && model.pages[p].host.is_none()
                            {
                                model.slack += 1;
                            }
                            if s.contains(&p) {
                                model.faults += model.ensure_host(p, false) as u64;
                            }
                            if d.contains(&p) {
                                model.faults += model.ensure_host(p, true) as u64;
                            }
                        }
                    } else {
                        codes.1 = 107_000;
                    }
                }
            }
            &Op::HostCopyPlain {
                off,
                len,
                into_managed,
                val,
            } => {
                if model.live(off / PAGE) && model.live((off + len - 1) / PAGE) {
                    let buf = vec![val; len];
                    let mut out = vec![0u8; len];
                    codes.0 = code(if into_managed {
                        sut.ctx
                            .managed_memcpy(sut.addr(off), buf.as_ptr() as usize, len)
                    } else {
                        sut.ctx
                            .managed_memcpy(out.as_mut_ptr() as usize, sut.addr(off), len)
                    });
                    if model.valid(off, len) {
                        if into_managed {
                            reference[off..off + len].fill(val);
                        } else {
                            prop_assert!(out == reference[off..off + len], "step {}", step);
                        }
                        for p in Model::pages_of(off, len) {
                            model.faults += model.ensure_host(p, into_managed) as u64;
                        }
                    } else {
                        codes.1 = 107_000;
                    }
                }
            }
            &Op::Fill {
                dev,
                start,
                len,
                val,
            } => {
                codes.0 = code(sut.streams[dev].memset_async(sut.addr(start), val, len));
                sut.streams[dev].synchronize().unwrap();
                if model.valid(start, len) {
                    reference[start..start + len].fill(val);
                    model.device_op(dev, &[(start, true, true)], len, false);
                } else {
                    codes.1 = 107_000;
                }
            }
            &Op::Copy { dev, dst, src, len } => {
                let (da, sa) = (sut.addr(dst), sut.addr(src));
                codes.0 = code(sut.streams[dev].memcpy_async(da, sa, len));
                sut.streams[dev].synchronize().unwrap();
                if model.valid(dst, len) && model.valid(src, len) {
                    reference.copy_within(src..src + len, dst);
                    model.device_op(
                        dev,
                        &[(dst, true, true), (src, false, true)],
                        len,
                        da > sa && da < sa + len,
                    );
                } else {
                    codes.1 = 107_000;
                }
            }
            &Op::CopyPlain {
                dev,
                off,
                poff,
                len,
                into_managed,
            } => {
                let (m, p) = (sut.addr(off), sut.plain + poff);
                let (dst, src) = if into_managed { (m, p) } else { (p, m) };
                codes.0 = code(sut.streams[dev].memcpy_async(dst, src, len));
                sut.streams[dev].synchronize().unwrap();
                if model.valid(off, len) {
                    if into_managed {
                        reference[off..off + len].copy_from_slice(&plain_ref[poff..poff + len]);
                    } else {
                        plain_ref[poff..poff + len].copy_from_slice(&reference[off..off + len]);
                    }
                    let poff_abs = (sut.plain + poff) % PAGE;
                    let o = [(off, into_managed, true), (poff_abs, !into_managed, false)];
                    let o = if into_managed { o } else { [o[1], o[0]] };
                    model.device_op(dev, &o, len, false);
                } else {
                    codes.1 = 107_000;
                }
            }
            &Op::Prefetch { to, page, n } => {
                let (p, s) = (sut.addr(page * PAGE), n * PAGE);
                codes.0 = code(
                    sut.ctx
                        .mem_prefetch(p, s, to.location(), 0, &sut.streams[0]),
                );
                sut.streams[0].synchronize().unwrap();
                match to.resolve() {
                    _ if !model.valid(page * PAGE, s) => codes.1 = 107_000,
                    None => codes.1 = 107_000,
                    Some(loc) => {
                        for q in page..page + n {
                            model.pages[q].last_prefetch = Some(loc);
                        }
                        for q in page..page + n {
                            model.ensure_at(q, loc, false);
                        }
                    }
                }
            }
            &Op::Advise {
                advice,
                to,
                page,
                n,
            } => {
                let (p, s) = (sut.addr(page * PAGE), n * PAGE);
                codes.0 = code(sut.ctx.mem_advise(p, s, advice, to.location()));
                if !model.valid(page * PAGE, s) {
                    codes.1 = 107_000;
                } else {
                    let range: Vec<usize> = (page..page + n).collect();
                    codes.1 = model.advise(advice, to, &range).err().unwrap_or(0);
                }
            }
            Op::AllocExtra => {
                if !model.extra_live {
                    sut.extra = sut.ctx.alloc_managed((EXTRA * PAGE) as u64, 1).unwrap();
                    model.extra_live = true;
                    reference[MAIN * PAGE..].fill(0);
                }
            }
            Op::FreeExtra => {
                codes.0 = code(sut.ctx.free_managed(sut.extra));
                if model.extra_live {
                    model.extra_live = false;
                    for p in MAIN..PAGES {
                        model.pages[p] = MPage::default();
                    }
                } else {
                    codes.1 = 107_000;
                }
            }
            &Op::Bad(i) => {
                let (what, got, want) = bad_call(&sut, i);
                sut.streams[i % DEVICES].synchronize().unwrap();
                prop_assert_eq!(got, want, "step {} {}", step, what);
                prop_assert_eq!(
                    &sut.rt.driver().managed_stats(),
                    &before,
                    "step {} {} changed the counters",
                    step,
                    what
                );
            }
        }
        prop_assert_eq!(codes.0, codes.1, "step {} {:?}", step, op);
        let st = sut.rt.driver().managed_stats();
        let faults = st.host_faults - before.host_faults;
        prop_assert!(
            faults <= model.faults && faults + model.slack >= model.faults,
            "host faults at step {} {:?}: {} for a model's {} (-{})",
            step,
            op,
            faults,
            model.faults,
            model.slack
        );
        model.faults = 0;
        model.slack = 0;
        // Every counter.
        let live_pages: Vec<usize> = (0..PAGES).filter(|&p| model.live(p)).collect();
        let m = &model.stats;
        let got = MStats {
            to_host: st.pages_to_host,
            from_host: st.pages_from_host,
            dev_to: [0, 1].map(|d| st.devices[d].pages_to_device),
            dev_from: [0, 1].map(|d| st.devices[d].pages_from_device),
            evictions: [0, 1].map(|d| st.devices[d].evictions),
        };
        prop_assert_eq!(&got, m, "counters at step {} {:?}", step, op);
        let p = PAGE as u64;
        prop_assert_eq!(st.bytes_to_host, m.to_host * p);
        prop_assert_eq!(st.bytes_from_host, m.from_host * p);
        for d in 0..DEVICES {
            prop_assert_eq!(st.devices[d].bytes_to_device, m.dev_to[d] * p);
            prop_assert_eq!(st.devices[d].bytes_from_device, m.dev_from[d] * p);
            let want = model.pages.iter().filter(|p| p.devs[d]).count() as u64;
            prop_assert_eq!(st.devices[d].resident_pages, want);
            prop_assert_eq!(
                sut.rt.driver().device(d as u32).unwrap().used_memory(),
                want * PAGE as u64
            );
        }
        prop_assert_eq!(
            st.host_resident_pages,
            model.pages.iter().filter(|p| p.host.is_some()).count() as u64
        );
        prop_assert_eq!(st.allocations, 1 + model.extra_live as u64);
        prop_assert_eq!(
            st.bytes,
            ((MAIN + EXTRA * model.extra_live as usize) * PAGE) as u64
        );
        // Contents.
        let mut peek = vec![0u8; PAGES * PAGE];
        sut.ctx
            .managed_peek(sut.base, &mut peek[..MAIN * PAGE])
            .unwrap();
        if model.extra_live {
            sut.ctx
                .managed_peek(sut.extra, &mut peek[MAIN * PAGE..])
                .unwrap();
        } else {
            peek[MAIN * PAGE..].copy_from_slice(&reference[MAIN * PAGE..]);
        }
        prop_assert!(
            peek == reference,
            "contents differ after step {} {:?}",
            step,
            op
        );
        prop_assert!(
            plain_mem(&sut) == &plain_ref[..],
            "plain buffer, step {}",
            step
        );
        // Residency.
        for &p in &live_pages {
            let mp = &model.pages[p];
            let r = sut.ctx.managed_residency(sut.addr(p * PAGE));
            let want_devs: Vec<u32> = (0..DEVICES)
                .filter(|&d| mp.devs[d])
                .map(|d| d as u32)
                .collect();
            match r {
                None => prop_assert!(
                    mp.host.is_none() && want_devs.is_empty(),
                    "page {} step {} {:?}",
                    p,
                    step,
                    op
                ),
                Some(r) => {
                    prop_assert_eq!(r.host, mp.host.is_some(), "page {} host, step {}", p, step);
                    prop_assert_eq!(r.host_read_only, mp.host == Some(true), "page {} ro", p);
                    prop_assert_eq!(r.devices, want_devs, "page {} devices, step {}", p, step);
                }
            }
        }
        // Attributes: per page and over each live allocation.
        let mut ranges: Vec<std::ops::Range<usize>> =
            live_pages.iter().map(|&p| p..p + 1).collect();
        ranges.push(0..MAIN);
        if model.extra_live {
            ranges.push(MAIN..PAGES);
        }
        for r in ranges {
            let (a, s) = (sut.addr(r.start * PAGE), r.len() * PAGE);
            let (want, want_ab) = model.attrs(r.clone());
            prop_assert_eq!(
                scalars(&sut.ctx, a, s),
                want,
                "pages {:?} step {} {:?}",
                r,
                step,
                op
            );
            prop_assert_eq!(
                sut.ctx.managed_accessed_by(a, s, 4).unwrap(),
                want_ab,
                "accessed-by of pages {:?} step {} {:?}",
                r,
                step,
                op
            );
        }
    }
    for s in &sut.streams {
        s.synchronize().unwrap();
    }
    sut.ctx.free_memory(sut.plain).unwrap();
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn managed_memory_matches_a_flat_memory_and_the_residency_model(
        ops in prop::collection::vec(op(), 1..28)
    ) {
        if common::file_not_applicable(HOST_ONLY) {
            return Ok(());
        }
        run(ops)?;
    }
}

/// The example, as a fixed sequence: prefetch N pages to a device, then touch them
/// from the host: exactly N host faults.
#[test]
fn prefetch_then_touch_gives_exactly_n_faults_in_the_model() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    run(vec![
        Op::HostWrite(vec![(0, 1, 1), (1, 2, 2), (2, 3, 3)]),
        Op::Prefetch {
            to: TLoc::Dev(1),
            page: 0,
            n: 3,
        },
        Op::HostRead(vec![(0, 1), (1, 2), (2, 3), (0, 5), (2, 9)]),
    ])
    .unwrap();
}

/// Every location type, every advice and the refused calls in one fixed sequence (so each
/// is exercised whatever the random cases draw).
#[test]
fn every_advice_location_and_refused_call_follows_the_model() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let mut ops = vec![Op::HostMemset {
        start: 0,
        len: PAGES * PAGE,
        val: 7,
    }];
    for (i, to) in [
        TLoc::Dev(0),
        TLoc::Dev(1),
        TLoc::Host,
        TLoc::Numa,
        TLoc::NumaCurrent,
        TLoc::Invalid,
    ]
    .into_iter()
    .enumerate()
    {
        for v in 0..6 {
            ops.push(Op::Advise {
                advice: Advice::from_raw(v).unwrap(),
                to,
                page: i % PAGES,
                n: 1 + v as usize % 3,
            });
        }
        ops.push(Op::Prefetch { to, page: i, n: 2 });
    }
    ops.extend((0..BAD).map(Op::Bad));
    ops.extend([
        Op::FreeExtra,
        Op::FreeExtra,
        Op::HostCopy {
            dst: 0,
            src: PAGE / 2,
            len: PAGE,
        },
        Op::AllocExtra,
        Op::CopyPlain {
            dev: 1,
            off: MAIN * PAGE - 10,
            poff: 0,
            len: 100,
            into_managed: true,
        },
        Op::CopyPlain {
            dev: 0,
            off: PAGE - 10,
            poff: 5,
            len: 100,
            into_managed: false,
        },
        Op::HostCopyPlain {
            off: 3,
            len: 10,
            into_managed: false,
            val: 0,
        },
    ]);
    run(ops).unwrap();
}
