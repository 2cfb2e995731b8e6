//! `hetmem bench vmm`: Level Zero virtual memory against the bare syscalls it needs.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

use hetmem::{AccessAttribute, Context, Device, PhysicalMemoryFlags, Reservation};
use rustix::mm::{MapFlags, MprotectFlags, ProtFlags};

use super::{
    alternate, e2s, json_extra, key, median, raw_hugetlb_memfd, raw_memfd, raw_release,
    raw_reserve, size_name, Args, HugeKind, Row, Unit,
};

pub fn bench(args: &Args) -> Result<Vec<Row>, String> {
    let (_rt, dev, ctx) = crate::common::one_device_pages(8 << 30, false)?;
    let n = args.iters;
    let mut rows = Vec::new();
    let small = ctx.query_page_size(&dev, 1).map_err(e2s)?;
    let large = ctx.query_page_size(&dev, 2 << 20).map_err(e2s)?;
    for page in [small, large] {
        rows.push(reserve_free(&ctx, args, page)?);
        rows.push(create_destroy(&ctx, &dev, args, page)?);
        rows.extend(map_unmap(&ctx, &dev, args, page, None)?);
        rows.push(set_access(&ctx, &dev, args, page)?);
    }
    // Map and unmap of 2 MiB pages in 2 MiB pages (reserved hugetlbfs pages, else shmem THP
    // folios), against the same raw sequence.
    match super::physical_huge_kind(1) {
        Ok(kind) => {
            let (_rt2, dev2, ctx2) = crate::common::one_device_pages(8 << 30, true)?;
            for r in map_unmap(&ctx2, &dev2, args, large, Some(kind))? {
                rows.push(Row {
                    op: leak(format!("{} {}", r.op, kind.mark())),
                    key: format!("{}{}", r.key, kind.key_suffix()),
                    ..r
                });
            }
        }
        Err(why) => println!("2 MiB-page rows not run: {why}"),
    }
    rows.push(get_access_live(&ctx, &dev, args.live_mappings, n)?);
    rows.extend(multi_thread(&ctx, &dev, args)?);
    Ok(rows)
}

fn reserve_free(ctx: &Context, args: &Args, page: usize) -> Result<Row, String> {
    let n = args.iters;
    let (h, b) = alternate(
        args.rounds,
        || {
            let t = Instant::now();
            for _ in 0..n {
                let r = ctx.reserve(None, page).map_err(e2s)?;
                ctx.free_reservation(r).map_err(e2s)?;
            }
            Ok(t.elapsed().as_nanos() as f64 / n as f64)
        },
        || {
            let t = Instant::now();
            for _ in 0..n {
                // The same sequence hetmem needs: an aligned PROT_NONE range (mmap of size +
                // alignment, munmap of the slack), then munmap.
                let p = raw_reserve(page, page)?;
                raw_release(black_box(p), page);
            }
            Ok(t.elapsed().as_nanos() as f64 / n as f64)
        },
    )?;
    Ok(Row {
        unit: Unit::Ns,
        op: "reserve+free",
        size: size_name(page),
        key: key("reserve_free", page),
        hetmem_ns: h,
        baseline_ns: Some(b),
        baseline: "aligned mmap(PROT_NONE) + munmap",
        target: None,
    })
}

fn create_destroy(ctx: &Context, dev: &Device, args: &Args, page: usize) -> Result<Row, String> {
    let n = args.iters;
    let (h, b) = alternate(
        args.rounds,
        || {
            let t = Instant::now();
            for _ in 0..n {
                let p = ctx
                    .create_physical_memory(Some(dev), PhysicalMemoryFlags::AllocateOnDevice, page)
                    .map_err(e2s)?;
                ctx.destroy_physical_memory(p).map_err(e2s)?;
            }
            Ok(t.elapsed().as_nanos() as f64 / n as f64)
        },
        || {
            let t = Instant::now();
            for _ in 0..n {
                drop(black_box(raw_memfd(page)?));
            }
            Ok(t.elapsed().as_nanos() as f64 / n as f64)
        },
    )?;
    Ok(Row {
        unit: Unit::Ns,
        op: "create+destroy",
        size: size_name(page),
        key: key("create_destroy", page),
        hetmem_ns: h,
        baseline_ns: Some(b),
        baseline: "memfd_create+ftruncate+F_ADD_SEALS+close",
        target: None,
    })
}

/// Map `n` pages at distinct addresses, then unmap them, timed separately. `huge`: the runtime
/// takes 2 MiB pages of that kind, and so does the raw sequence: a hugetlbfs memfd mapped with
/// `MAP_POPULATE` (reserved pages), or shmem advised and populated as the map does THP folios
/// (`mmap`, `madvise(MADV_HUGEPAGE)`, `madvise(MADV_POPULATE_READ)`).
fn map_unmap(
    ctx: &Context,
    dev: &Device,
    args: &Args,
    page: usize,
    huge: Option<HugeKind>,
) -> Result<Vec<Row>, String> {
    let n = args.iters;
    let thp = huge == Some(HugeKind::Thp);
    // Every other page is left unmapped so that neither side gets merged VMAs.
    let span = 2 * n * page;
    let res = ctx.reserve(None, span).map_err(e2s)?;
    let phys = ctx
        .create_physical_memory(Some(dev), PhysicalMemoryFlags::AllocateOnDevice, page)
        .map_err(e2s)?;
    let raw_base = raw_reserve(span, page)?;
    let fd = if huge == Some(HugeKind::Hugetlb) {
        raw_hugetlb_memfd(page)?
    } else {
        raw_memfd(page)?
    };
    let mut map_h = Vec::new();
    let mut map_b = Vec::new();
    let mut unmap_h = Vec::new();
    let mut unmap_b = Vec::new();
    let hetmem_phase = || -> Result<(f64, f64), String> {
        let t = Instant::now();
        for i in 0..n {
            ctx.map(
                res.base + 2 * i * page,
                page,
                phys,
                0,
                AccessAttribute::ReadWrite,
            )
            .map_err(e2s)?;
        }
        let m = t.elapsed().as_nanos() as f64 / n as f64;
        let t = Instant::now();
        for i in 0..n {
            ctx.unmap(res.base + 2 * i * page, page).map_err(e2s)?;
        }
        Ok((m, t.elapsed().as_nanos() as f64 / n as f64))
    };
    let raw_phase = || -> Result<(f64, f64), String> {
        let t = Instant::now();
        for i in 0..n {
            // SAFETY: inside our raw reservation.
            unsafe {
                rustix::mm::mmap(
                    (raw_base + 2 * i * page) as *mut _,
                    page,
                    ProtFlags::READ | ProtFlags::WRITE,
                    // The host backend's map populates the page table (MAP_POPULATE).
                    if thp {
                        MapFlags::SHARED | MapFlags::FIXED
                    } else {
                        MapFlags::SHARED | MapFlags::FIXED | MapFlags::POPULATE
                    },
                    &fd,
                    0,
                )
                .map_err(|e| e.to_string())?;
                if thp {
                    let a = (raw_base + 2 * i * page) as *mut _;
                    rustix::mm::madvise(a, page, rustix::mm::Advice::LinuxHugepage)
                        .map_err(|e| e.to_string())?;
                    rustix::mm::madvise(a, page, rustix::mm::Advice::LinuxPopulateRead)
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        let m = t.elapsed().as_nanos() as f64 / n as f64;
        let t = Instant::now();
        for i in 0..n {
            // SAFETY: inside our raw reservation.
            unsafe {
                rustix::mm::mmap_anonymous(
                    (raw_base + 2 * i * page) as *mut _,
                    page,
                    ProtFlags::empty(),
                    MapFlags::PRIVATE | MapFlags::NORESERVE | MapFlags::FIXED,
                )
                .map_err(|e| e.to_string())?;
            }
        }
        Ok((m, t.elapsed().as_nanos() as f64 / n as f64))
    };
    // Round 0 is a warm-up; the side that goes first alternates.
    for round in 0..=args.rounds {
        let ((mh, uh), (mb, ub)) = if round % 2 == 0 {
            let h = hetmem_phase()?;
            (h, raw_phase()?)
        } else {
            let b = raw_phase()?;
            (hetmem_phase()?, b)
        };
        if round > 0 {
            map_h.push(mh);
            unmap_h.push(uh);
            map_b.push(mb);
            unmap_b.push(ub);
        }
    }
    ctx.free_reservation(res).map_err(e2s)?;
    ctx.destroy_physical_memory(phys).map_err(e2s)?;
    raw_release(raw_base, span);
    Ok(vec![
        Row {
            unit: Unit::Ns,
            op: "map",
            size: size_name(page),
            key: key("map", page),
            hetmem_ns: median(map_h),
            baseline_ns: Some(median(map_b)),
            baseline: match huge {
                Some(HugeKind::Thp) => "mmap(SHARED|FIXED) + MADV_HUGEPAGE + MADV_POPULATE_READ",
                Some(HugeKind::Hugetlb) => "mmap(SHARED|FIXED|POPULATE, hugetlbfs memfd)",
                None => "mmap(SHARED|FIXED|POPULATE, memfd)",
            },
            target: (page == 2 << 20).then_some("<= 1.3x"),
        },
        Row {
            unit: Unit::Ns,
            op: "unmap",
            size: size_name(page),
            key: key("unmap", page),
            hetmem_ns: median(unmap_h),
            baseline_ns: Some(median(unmap_b)),
            baseline: "mmap(PROT_NONE, MAP_FIXED)",
            target: (page == 2 << 20).then_some("<= 1.3x"),
        },
    ])
}

fn set_access(ctx: &Context, dev: &Device, args: &Args, page: usize) -> Result<Row, String> {
    let n = args.iters;
    let span = 2 * n * page;
    let res = ctx.reserve(None, span).map_err(e2s)?;
    let phys = ctx
        .create_physical_memory(Some(dev), PhysicalMemoryFlags::AllocateOnDevice, page)
        .map_err(e2s)?;
    let raw_base = raw_reserve(span, page)?;
    let fd = raw_memfd(page)?;
    for i in 0..n {
        ctx.map(
            res.base + 2 * i * page,
            page,
            phys,
            0,
            AccessAttribute::ReadWrite,
        )
        .map_err(e2s)?;
        // SAFETY: inside our raw reservation.
        unsafe {
            rustix::mm::mmap(
                (raw_base + 2 * i * page) as *mut _,
                page,
                ProtFlags::READ | ProtFlags::WRITE,
                // Populated as the host backend's map leaves its range: mprotect then rewrites
                // every page-table entry of the range on both sides.
                MapFlags::SHARED | MapFlags::FIXED | MapFlags::POPULATE,
                &fd,
                0,
            )
            .map_err(|e| e.to_string())?;
        }
    }
    let mut flip = false;
    let mut flip_raw = false;
    let (h, b) = alternate(
        args.rounds,
        || {
            flip = !flip;
            let a = if flip {
                AccessAttribute::ReadOnly
            } else {
                AccessAttribute::ReadWrite
            };
            let t = Instant::now();
            for i in 0..n {
                ctx.set_access_attribute(res.base + 2 * i * page, page, a)
                    .map_err(e2s)?;
            }
            Ok(t.elapsed().as_nanos() as f64 / n as f64)
        },
        || {
            flip_raw = !flip_raw;
            let a = if flip_raw {
                MprotectFlags::READ
            } else {
                MprotectFlags::READ | MprotectFlags::WRITE
            };
            let t = Instant::now();
            for i in 0..n {
                // SAFETY: our own raw mapping.
                unsafe {
                    rustix::mm::mprotect((raw_base + 2 * i * page) as *mut _, page, a)
                        .map_err(|e| e.to_string())?
                };
            }
            Ok(t.elapsed().as_nanos() as f64 / n as f64)
        },
    )?;
    ctx.free_reservation(res).map_err(e2s)?;
    ctx.destroy_physical_memory(phys).map_err(e2s)?;
    raw_release(raw_base, span);
    Ok(Row {
        unit: Unit::Ns,
        op: "set-access",
        size: size_name(page),
        key: key("set_access", page),
        hetmem_ns: h,
        baseline_ns: Some(b),
        baseline: "mprotect",
        target: (page == 2 << 20).then_some("<= 1.3x"),
    })
}

/// get-access at random mapped pages while `live` mappings exist.
fn get_access_live(ctx: &Context, dev: &Device, live: usize, n: usize) -> Result<Row, String> {
    let page = ctx.query_page_size(dev, 1).map_err(e2s)?;
    // Adjacent pages all mapping offset 0 of one object: the kernel cannot merge them, so each
    // is its own VMA (gaps would cost a second, placeholder VMA per mapping).
    let large = ctx.query_page_size(dev, live * page).map_err(e2s)?;
    let span = (live * page).div_ceil(large) * large;
    let res = ctx.reserve(None, span).map_err(e2s)?;
    let phys = ctx
        .create_physical_memory(Some(dev), PhysicalMemoryFlags::AllocateOnDevice, page)
        .map_err(e2s)?;
    for i in 0..live {
        let a = if i % 2 == 0 {
            AccessAttribute::ReadWrite
        } else {
            AccessAttribute::ReadOnly
        };
        ctx.map(res.base + i * page, page, phys, 0, a)
            .map_err(|e| format!("mapping {i} of {live} for the get-access benchmark: {e}"))?;
    }
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rounds = Vec::new();
    let calls = n.max(10_000);
    for _ in 0..7 {
        let t = Instant::now();
        for _ in 0..calls {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x % live as u64) as usize;
            black_box(
                ctx.get_access_attribute(res.base + i * page, page)
                    .map_err(e2s)?,
            );
        }
        rounds.push(t.elapsed().as_nanos() as f64 / calls as f64);
    }
    ctx.free_reservation(res).map_err(e2s)?;
    ctx.destroy_physical_memory(phys).map_err(e2s)?;
    Ok(Row {
        unit: Unit::Ns,
        op: "get-access",
        size: "64KiB",
        key: format!("get_access_{}k_live", live / 1000),
        hetmem_ns: median(rounds),
        baseline_ns: None,
        baseline: "(absolute; no syscall needed)",
        target: Some("< 1000 ns"),
    })
}

/// Thread counts of the multi-thread rows.
const MT_THREADS: [usize; 4] = [1, 2, 4, 8];
/// Mapped pages per thread in the multi-thread rows (every other page of its span, as the
/// single-thread row, so that no two mappings share a VMA).
const MT_PAGES: usize = 32;

/// Runs `op(thread, i)` for `i` in `0..n` on `threads` threads started together; returns the
/// wall time per `i` (the time of one operation of every thread at once) in ns: from the first
/// thread's start to the last one's end, each read by the threads themselves (thread start-up
/// is not timed, and a descheduled main thread cannot shorten the span).
fn run_threads(
    threads: usize,
    n: usize,
    op: impl Fn(usize, usize) -> Result<(), String> + Sync,
) -> Result<f64, String> {
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, op) = (&barrier, &op);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    (0..n).try_for_each(|i| op(t, i))?;
                    Ok::<_, String>((start, Instant::now()))
                })
            })
            .collect();
        let mut span: Option<(Instant, Instant)> = None;
        for h in handles {
            let (a, b) = h
                .join()
                .map_err(|_| "a benchmark thread panicked".to_string())??;
            span = Some(span.map_or((a, b), |(x, y)| (x.min(a), y.max(b))));
        }
        let (a, b) = span.expect("at least one thread");
        Ok((b - a).as_nanos() as f64 / n as f64)
    })
}

/// Set-access and get-access from 1, 2, 4 and 8 threads at once, each thread on its own
/// reservation (`own`) or all on one (`shared`, each thread on its own pages). Set-access is
/// measured against as many threads doing bare `mprotect` on the same layout (the ratio);
/// get-access, which needs no syscall, absolutely, with its throughput over one thread's
/// (`_speedup` in the JSON; the machine's cores bound it).
fn multi_thread(ctx: &Context, dev: &Device, args: &Args) -> Result<Vec<Row>, String> {
    let page = ctx.query_page_size(dev, 1).map_err(e2s)?;
    let max_t = *MT_THREADS.iter().max().expect("thread counts");
    // Every page is visited an even number of times per round (toggling RO / RW), so every
    // call changes the attribute and each round starts where the last ended.
    let n = args.iters.div_ceil(2 * MT_PAGES) * 2 * MT_PAGES;
    let gets = (n * 32).max(8192);
    let span = 2 * MT_PAGES * page;
    let phys = ctx
        .create_physical_memory(Some(dev), PhysicalMemoryFlags::AllocateOnDevice, page)
        .map_err(e2s)?;
    let fd = raw_memfd(page)?;
    let own: Vec<Reservation> = (0..max_t)
        .map(|_| ctx.reserve(None, span).map_err(e2s))
        .collect::<Result<_, _>>()?;
    let shared = ctx.reserve(None, max_t * span).map_err(e2s)?;
    let own_raw: Vec<usize> = (0..max_t)
        .map(|_| raw_reserve(span, page))
        .collect::<Result<_, _>>()?;
    let shared_raw = raw_reserve(max_t * span, page)?;
    let mut hetmem_bases: Vec<usize> = own.iter().map(|r| r.base).collect();
    hetmem_bases.extend((0..max_t).map(|t| shared.base + t * span));
    let mut raw_bases = own_raw.clone();
    raw_bases.extend((0..max_t).map(|t| shared_raw + t * span));
    for (&h, &r) in hetmem_bases.iter().zip(&raw_bases) {
        for i in 0..MT_PAGES {
            ctx.map(h + 2 * i * page, page, phys, 0, AccessAttribute::ReadWrite)
                .map_err(e2s)?;
            // SAFETY: inside our raw reservation.
            unsafe {
                rustix::mm::mmap(
                    (r + 2 * i * page) as *mut _,
                    page,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::SHARED | MapFlags::FIXED | MapFlags::POPULATE,
                    &fd,
                    0,
                )
                .map_err(|e| e.to_string())?;
            }
        }
    }
    let addr = |base: usize, i: usize| base + 2 * (i % MT_PAGES) * page;
    let read_only = |i: usize| (i / MT_PAGES).is_multiple_of(2);
    let mut rows = Vec::new();
    for (mode, bases, raws) in [
        ("own", &hetmem_bases[..max_t], &raw_bases[..max_t]),
        ("shared", &hetmem_bases[max_t..], &raw_bases[max_t..]),
    ] {
        let mut get_1t = None;
        for threads in MT_THREADS {
            let (h, b) = alternate(
                args.rounds,
                || {
                    run_threads(threads, n, |t, i| {
                        let a = if read_only(i) {
                            AccessAttribute::ReadOnly
                        } else {
                            AccessAttribute::ReadWrite
                        };
                        ctx.set_access_attribute(addr(bases[t], i), page, a)
                            .map_err(e2s)
                    })
                },
                || {
                    run_threads(threads, n, |t, i| {
                        let a = if read_only(i) {
                            MprotectFlags::READ
                        } else {
                            MprotectFlags::READ | MprotectFlags::WRITE
                        };
                        // SAFETY: our own raw mapping.
                        unsafe { rustix::mm::mprotect(addr(raws[t], i) as *mut _, page, a) }
                            .map_err(|e| e.to_string())
                    })
                },
            )?;
            let size = size_name(page);
            rows.push(Row {
                unit: Unit::Ns,
                op: leak(format!("set-access {threads}t {mode}")),
                size,
                key: format!("set_access_{threads}t_{mode}_{}", size.to_ascii_lowercase()),
                hetmem_ns: h,
                baseline_ns: Some(b),
                baseline: "mprotect from as many threads",
                target: Some("<= 1.1x"),
            });
            let mut rounds = Vec::new();
            for _ in 0..=args.rounds {
                rounds.push(run_threads(threads, gets, |t, i| {
                    black_box(
                        ctx.get_access_attribute(addr(bases[t], i), page)
                            .map_err(e2s)?,
                    );
                    Ok(())
                })?);
            }
            // The first round warms up.
            rounds.remove(0);
            let g = median(rounds);
            let get_key = format!("get_access_{threads}t_{mode}");
            let one = *get_1t.get_or_insert(g);
            // Calls per second of all threads over one thread's.
            json_extra(&format!("{get_key}_speedup"), threads as f64 * one / g);
            rows.push(Row {
                unit: Unit::Ns,
                op: leak(format!("get-access {threads}t {mode}")),
                size,
                key: get_key,
                hetmem_ns: g,
                baseline_ns: None,
                baseline: "(absolute: wall ns per call of every thread)",
                target: None,
            });
        }
    }
    for r in own.into_iter().chain([shared]) {
        ctx.free_reservation(r).map_err(e2s)?;
    }
    ctx.destroy_physical_memory(phys).map_err(e2s)?;
    for r in own_raw {
        raw_release(r, span);
    }
    raw_release(shared_raw, max_t * span);
    Ok(rows)
}

/// A row name made at run time (the table holds `&'static str`; a handful per run).
use super::leak;
