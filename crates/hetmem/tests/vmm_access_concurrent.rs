//! Access attributes without the driver's lock (`crate::semantics::access`): set-access and
//! get-access from many threads at once, racing unmap and free, and a model test of the
//! per-page table across its chunk boundaries.
//!
//! Every check ends by comparing what get-access answers with the real protection of each page,
//! read from `/proc/self/maps` (so no page is touched): a mapped page is a shared mapping with
//! the permissions of its attribute, an unmapped page of a reservation a private `---` one. That
//! comparison is the host backend's: on cuda the driver maps device memory in the GPU's address
//! space, and the kernel shows no such lines (the rest runs there, with fewer cases).

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use common::{context_with, Rng};
use hetmem::{AccessAttribute, Context, Error, PhysicalMemory, PhysicalMemoryFlags, Reservation};
use proptest::prelude::*;
use proptest::test_runner::Config;

use AccessAttribute::{None as NONE, ReadOnly as RO, ReadWrite as RW};

const ATTRS: [AccessAttribute; 3] = [NONE, RW, RO];

/// The OS mappings of this process: `(start, end, permissions)`, by start.
fn os_maps() -> Vec<(usize, usize, String)> {
    std::fs::read_to_string("/proc/self/maps")
        .expect("/proc/self/maps")
        .lines()
        .map(|l| {
            let mut f = l.split_whitespace();
            let range = f.next().expect("range");
            let perms = f.next().expect("permissions").to_string();
            let (a, b) = range.split_once('-').expect("a-b");
            (
                usize::from_str_radix(a, 16).expect("hex"),
                usize::from_str_radix(b, 16).expect("hex"),
                perms,
            )
        })
        .collect()
}

/// The permissions of the mapping at `addr` in `maps`.
fn perms_at(maps: &[(usize, usize, String)], addr: usize) -> &str {
    let i = maps.partition_point(|m| m.0 <= addr);
    match i.checked_sub(1).map(|i| &maps[i]) {
        Some((_, end, p)) if addr < *end => p,
        _ => panic!("{addr:#x} is in no mapping of the process"),
    }
}

/// The permissions a page shows: `Some(attribute)` for a mapped page, `None` for unmapped.
fn expected_perms(a: Option<AccessAttribute>) -> &'static str {
    match a {
        Some(NONE) => "---s",
        Some(RW) => "rw-s",
        Some(RO) => "r--s",
        None => "---p",
    }
}

/// Asserts that get-access, page by page and as runs over the whole range, and the OS
/// protection of every page agree with `want` (page index -> `Some(attribute)` if mapped).
/// The OS protection is checked on the host backend only ([`common::kernel_maps_apply`]).
fn assert_table(ctx: &Context, base: usize, page: usize, want: &[Option<AccessAttribute>]) {
    let maps = common::kernel_maps_apply().then(os_maps);
    for (i, w) in want.iter().enumerate() {
        let a = base + i * page;
        let got = ctx.get_access_attribute(a, page).expect("get-access");
        assert_eq!(got, (w.unwrap_or(NONE), page), "page {i}");
        if let Some(maps) = &maps {
            assert_eq!(
                perms_at(maps, a),
                expected_perms(*w),
                "OS protection of page {i}"
            );
        }
    }
    // Runs: each answer is the attribute at its start and the length of pages that share it.
    let mut i = 0;
    while i < want.len() {
        let (a, len) = ctx
            .get_access_attribute(base + i * page, (want.len() - i) * page)
            .expect("get-access run");
        let eff = |w: &Option<AccessAttribute>| w.unwrap_or(NONE);
        let n = want[i..].iter().take_while(|w| eff(w) == a).count();
        assert_eq!(eff(&want[i]), a, "run at page {i}");
        assert_eq!(len, n * page, "run at page {i}");
        i += n;
    }
}

fn setup(pages_phys: usize) -> (hetmem::Runtime, Context, PhysicalMemory, usize) {
    let (rt, ctx) = context_with(1, 64 << 20);
    let dev = rt.driver().device(0).expect("device");
    let page = ctx.query_page_size(&dev, 1).expect("page size");
    let phys = ctx
        .create_physical_memory(
            Some(&dev),
            PhysicalMemoryFlags::AllocateOnDevice,
            pages_phys * page,
        )
        .expect("physical memory");
    (rt, ctx, phys, page)
}

/// The rule: set-access and get-access may run from many threads at once, on one reservation or
/// on many, and the attributes they leave are those of the calls in some order: each thread's
/// own pages end as its own sequence of calls left them (a model per thread), a range that
/// several threads set whole at once ends with one of their attributes on every page, get-access
/// never answers half of a set-access, and the OS protection agrees with every answer.
#[test]
fn concurrent_set_and_get_access_from_threads_end_as_the_model_says() {
    if common::skip() {
        return;
    }
    const THREADS: usize = 8;
    /// Pages per thread; every fourth is left unmapped (set-access skips it, it stays NONE).
    const OWN: usize = 16;
    /// Pages that the contending threads set whole.
    const COMMON: usize = 8;
    const CALLS: usize = 400;
    let (_rt, ctx, phys, page) = setup(1);
    let ctx = Arc::new(ctx);
    let span = THREADS * OWN + COMMON;
    let size = span.next_multiple_of(32) * page;
    let shared = ctx.reserve(None, size).expect("reserve");
    let own: Vec<Reservation> = (0..THREADS)
        .map(|_| ctx.reserve(None, OWN * page).expect("reserve"))
        .collect();
    let mapped = |i: usize| i % 4 != 3;
    // Threads 0..THREADS/2 work on their pages of the shared reservation, the others on their
    // own reservations.
    let region = |t: usize| {
        if t < THREADS / 2 {
            shared.base + t * OWN * page
        } else {
            own[t].base
        }
    };
    for t in 0..THREADS {
        for i in (0..OWN).filter(|&i| mapped(i)) {
            ctx.map(region(t) + i * page, page, phys, 0, RW)
                .expect("map");
        }
    }
    let common = shared.base + THREADS * OWN * page;
    for i in 0..COMMON {
        ctx.map(common + i * page, page, phys, 0, RW).expect("map");
    }
    let barrier = Barrier::new(THREADS);
    let models: Vec<Vec<Option<AccessAttribute>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (ctx, barrier) = (&ctx, &barrier);
                let base = region(t);
                s.spawn(move || {
                    let mut rng = Rng(0x5eed ^ t as u64);
                    let mut model: Vec<Option<AccessAttribute>> =
                        (0..OWN).map(|i| mapped(i).then_some(RW)).collect();
                    barrier.wait();
                    for _ in 0..CALLS {
                        match rng.below(4) {
                            0 => {
                                // Every thread sets the common range whole; odd threads
                                // only READONLY / NONE, even ones READWRITE / NONE, so a torn
                                // answer would show two attributes.
                                let a = if rng.below(2) == 0 {
                                    NONE
                                } else if t % 2 == 0 {
                                    RW
                                } else {
                                    RO
                                };
                                ctx.set_access_attribute(common, COMMON * page, a)
                                    .expect("set-access, common range");
                                let (_, len) = ctx
                                    .get_access_attribute(common, COMMON * page)
                                    .expect("get-access, common range");
                                assert_eq!(len, COMMON * page, "the common range is uniform");
                            }
                            1 => {
                                // Any page of any thread: a well-formed answer.
                                let i = rng.below(span);
                                let n = 1 + rng.below(span - i);
                                let (_, len) = ctx
                                    .get_access_attribute(shared.base + i * page, n * page)
                                    .expect("get-access, anywhere");
                                assert!(len > 0 && len <= n * page && len % page == 0);
                            }
                            _ => {
                                let i = rng.below(OWN);
                                let n = 1 + rng.below(OWN - i);
                                let a = ATTRS[rng.below(3)];
                                ctx.set_access_attribute(base + i * page, n * page, a)
                                    .expect("set-access, own pages");
                                for m in model[i..i + n].iter_mut().flatten() {
                                    *m = a;
                                }
                                // Nobody else changes these pages: the answer is the model's.
                                let j = rng.below(OWN);
                                let (got, len) = ctx
                                    .get_access_attribute(base + j * page, (OWN - j) * page)
                                    .expect("get-access, own pages");
                                let eff = |m: &Option<AccessAttribute>| m.unwrap_or(NONE);
                                let want = eff(&model[j]);
                                let run = model[j..].iter().take_while(|m| eff(m) == want).count();
                                assert_eq!((got, len), (want, run * page), "thread {t}");
                            }
                        }
                    }
                    model
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    for (t, model) in models.iter().enumerate() {
        assert_table(&ctx, region(t), page, model);
    }
    let (last, len) = ctx.get_access_attribute(common, COMMON * page).unwrap();
    assert_eq!(len, COMMON * page, "the common range ends uniform");
    assert_table(&ctx, common, page, &[Some(last); COMMON]);
    for r in own.into_iter().chain([shared]) {
        ctx.free_reservation(r).unwrap();
    }
    ctx.destroy_physical_memory(phys).unwrap();
    let s = ctx.driver().vm_stats();
    assert_eq!(
        (s.reservations, s.mapped_runs, s.physical_objects),
        (0, 0, 0)
    );
}

/// The caller must not race set-access with unmap or free of the same range (the spec leaves it
/// undefined), but the library must stay sound: every racing set-access either finds the pages
/// mapped and protects only them, or fails with `InvalidArgument` (not reserved), and never
/// changes the protection of a range after it was unmapped or released (which the next mmap of
/// the process, a new reservation here, may reuse). Afterwards the table and the OS agree.
#[test]
fn set_access_racing_unmap_and_free_of_the_same_range_stays_safe() {
    if common::skip() {
        return;
    }
    const PAGES: usize = 16;
    const SETTERS: usize = 3;
    // Fewer on cuda, where every map and unmap is a driver call.
    let rounds = if common::on_cuda() { 60 } else { 300 };
    let (_rt, ctx, phys, page) = setup(1);
    let at = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..SETTERS {
            let (ctx, at, stop) = (&ctx, &at, &stop);
            s.spawn(move || {
                let mut rng = Rng(0xace ^ t as u64);
                while !stop.load(Ordering::Relaxed) {
                    let base = at.load(Ordering::Relaxed);
                    if base == 0 {
                        std::thread::yield_now();
                        continue;
                    }
                    let i = rng.below(PAGES);
                    let n = 1 + rng.below(PAGES - i);
                    let r = if rng.below(4) == 0 {
                        ctx.get_access_attribute(base + i * page, n * page)
                            .map(|_| ())
                    } else {
                        ctx.set_access_attribute(base + i * page, n * page, ATTRS[rng.below(3)])
                    };
                    match r {
                        Ok(()) | Err(Error::InvalidArgument(_)) => {}
                        Err(e) => panic!("set/get racing unmap and free: {e:?}"),
                    }
                }
            });
        }
        let mut rng = Rng(0xf4ee);
        for _ in 0..rounds {
            let r = ctx.reserve(None, PAGES * page).expect("reserve");
            for i in 0..PAGES {
                ctx.map(r.base + i * page, page, phys, 0, RW).expect("map");
            }
            at.store(r.base, Ordering::Relaxed);
            std::thread::yield_now();
            let i = rng.below(PAGES);
            let n = 1 + rng.below(PAGES - i);
            ctx.unmap(r.base + i * page, n * page).expect("unmap");
            std::thread::yield_now();
            ctx.free_reservation(r).expect("free");
        }
        // One reservation left live, with setters still racing its unmaps.
        let r = ctx.reserve(None, PAGES * page).expect("reserve");
        for i in 0..PAGES {
            ctx.map(r.base + i * page, page, phys, 0, RW).expect("map");
        }
        at.store(r.base, Ordering::Relaxed);
        for i in (0..PAGES).step_by(3) {
            std::thread::yield_now();
            ctx.unmap(r.base + i * page, page).expect("unmap");
        }
        stop.store(true, Ordering::Relaxed);
        at.store(r.base, Ordering::Relaxed);
    });
    // The last reservation: its table and the OS agree, page by page.
    let base = at.load(Ordering::Relaxed);
    let want: Vec<Option<AccessAttribute>> = (0..PAGES)
        .map(|i| {
            let (a, _) = ctx.get_access_attribute(base + i * page, page).unwrap();
            (i % 3 != 0).then_some(a)
        })
        .collect();
    assert_table(&ctx, base, page, &want);
    ctx.free(base, PAGES * page).unwrap();
    ctx.destroy_physical_memory(phys).unwrap();
    let s = ctx.driver().vm_stats();
    assert_eq!(
        (s.reservations, s.mapped_runs, s.physical_objects),
        (0, 0, 0)
    );
}

// ---------------------------------------------------------------------------------------------
// Model test of the page table

/// Pages of the model's reservation: past two chunks of the table (1,024 pages each), and a
/// multiple of the 2 MiB page size.
const TABLE_PAGES: usize = 2080;

/// Page indices where the table's chunks meet, and its ends: most operations start near one.
const EDGES: [usize; 5] = [0, 1023, 1024, 2047, 2048];

#[derive(Debug, Clone)]
enum Op {
    Map(usize),
    Unmap(usize, usize),
    Set(usize, usize, AccessAttribute),
    Get(usize, usize),
}

fn page_index() -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => (0..EDGES.len(), 0usize..6).prop_map(|(e, d)| (EDGES[e] + d).saturating_sub(3)),
        1 => 0..TABLE_PAGES,
    ]
}

fn range() -> impl Strategy<Value = (usize, usize)> {
    (
        page_index(),
        prop_oneof![3 => 1usize..8, 1 => 1usize..TABLE_PAGES],
    )
        .prop_map(|(i, n)| {
            let i = i.min(TABLE_PAGES - 1);
            (i, n.min(TABLE_PAGES - i))
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => page_index().prop_map(|i| Op::Map(i.min(TABLE_PAGES - 1))),
        1 => range().prop_map(|(i, n)| Op::Unmap(i, n)),
        4 => (range(), 0usize..3).prop_map(|((i, n), a)| Op::Set(i, n, ATTRS[a])),
        2 => range().prop_map(|(i, n)| Op::Get(i, n)),
    ]
}

/// Runs `ops` on one reservation of [`TABLE_PAGES`] pages (each map is one page of one
/// physical page at offset 0, so no two mappings join) against a plain vector.
fn run_table_model(ops: &[Op]) {
    let (_rt, ctx, phys, page) = setup(1);
    let r = ctx.reserve(None, TABLE_PAGES * page).expect("reserve");
    let mut model: Vec<Option<AccessAttribute>> = vec![None; TABLE_PAGES];
    let at = |i: usize| r.base + i * page;
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Map(i) => {
                let got = ctx.map(at(i), page, phys, 0, RO);
                if model[i].is_some() {
                    assert!(
                        matches!(got, Err(Error::InvalidArgument(_))),
                        "{step}: {got:?}"
                    );
                } else {
                    got.unwrap_or_else(|e| panic!("{step}: map: {e}"));
                    model[i] = Some(RO);
                }
            }
            Op::Unmap(i, n) => {
                // Unmapped pages of the range stay unmapped (case 4 of
                // shared/cases/level-zero.md, the reference driver's answer).
                let got = ctx.unmap(at(i), n * page);
                got.unwrap_or_else(|e| panic!("{step}: unmap: {e}"));
                model[i..i + n].fill(None);
            }
            Op::Set(i, n, a) => {
                ctx.set_access_attribute(at(i), n * page, a)
                    .unwrap_or_else(|e| panic!("{step}: set-access: {e}"));
                for m in model[i..i + n].iter_mut().flatten() {
                    *m = a;
                }
            }
            Op::Get(i, n) => {
                let got = ctx
                    .get_access_attribute(at(i), n * page)
                    .expect("get-access");
                let eff = |m: &Option<AccessAttribute>| m.unwrap_or(NONE);
                let want = eff(&model[i]);
                let run = model[i..i + n]
                    .iter()
                    .take_while(|m| eff(m) == want)
                    .count();
                assert_eq!(got, (want, run * page), "{step}: {op:?}");
            }
        }
        let mapped = model.iter().filter(|m| m.is_some()).count();
        assert_eq!(
            ctx.driver().vm_stats().mapped_runs,
            mapped,
            "{step}: one run per map"
        );
    }
    assert_table(&ctx, r.base, page, &model);
    ctx.free_reservation(r).unwrap();
    ctx.destroy_physical_memory(phys).unwrap();
}

/// 48 cases on the host backend; 12 on cuda, where every map and set-access is a driver call.
fn cases() -> u32 {
    if common::on_cuda() {
        12
    } else {
        48
    }
}

proptest! {
    #![proptest_config(Config { cases: cases(), ..Config::default() })]

    /// The per-page table (two levels, chunks of 1,024 pages) answers as a plain vector of
    /// pages does, across its chunk boundaries, and the OS protection agrees at the end.
    #[test]
    fn access_table_matches_a_page_vector_across_chunks(ops in prop::collection::vec(op(), 1..60)) {
        if common::skip() {
            return Ok(());
        }
        run_table_model(&ops);
    }
}

/// Sets over ranges that start in one chunk of the table and end in the next, mapped and
/// not, read back whole.
#[test]
fn set_and_get_across_a_chunk_boundary() {
    if common::skip() {
        return;
    }
    run_table_model(&[
        Op::Map(1022),
        Op::Map(1023),
        Op::Map(1024),
        Op::Map(1026),
        Op::Set(1000, 100, RW),
        Op::Get(1020, 10),
        Op::Get(1022, 3),
        Op::Set(1023, 2, NONE),
        Op::Get(1022, 8),
        Op::Unmap(1023, 2),
        Op::Get(1022, 8),
        Op::Set(0, TABLE_PAGES, RO),
        Op::Get(0, TABLE_PAGES),
    ]);
}
