//! `hetmem bench vmm`: Level Zero virtual memory against the bare syscalls it needs.

use std::hint::black_box;
use std::time::Instant;

use hetmem::{AccessAttribute, Context, Device, PhysicalMemoryFlags};
use rustix::mm::{MapFlags, MprotectFlags, ProtFlags};

use super::{
    alternate, e2s, key, median, raw_memfd, raw_release, raw_reserve, size_name, Args, Row, Unit,
};

pub fn bench(args: &Args) -> Result<Vec<Row>, String> {
    let (_rt, dev, ctx) = crate::common::one_device(8 << 30)?;
    let n = args.iters;
    let mut rows = Vec::new();
    let small = ctx.query_page_size(&dev, 1).map_err(e2s)?;
    let large = ctx.query_page_size(&dev, 2 << 20).map_err(e2s)?;
    for page in [small, large] {
        rows.push(reserve_free(&ctx, args, page)?);
        rows.push(create_destroy(&ctx, &dev, args, page)?);
        rows.extend(map_unmap(&ctx, &dev, args, page)?);
        rows.push(set_access(&ctx, &dev, args, page)?);
    }
    rows.push(get_access_live(&ctx, &dev, args.live_mappings, n)?);
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

/// Map `n` pages at distinct addresses, then unmap them, timed separately.
fn map_unmap(ctx: &Context, dev: &Device, args: &Args, page: usize) -> Result<Vec<Row>, String> {
    let n = args.iters;
    // Every other page is left unmapped so that neither side gets merged VMAs.
    let span = 2 * n * page;
    let res = ctx.reserve(None, span).map_err(e2s)?;
    let phys = ctx
        .create_physical_memory(Some(dev), PhysicalMemoryFlags::AllocateOnDevice, page)
        .map_err(e2s)?;
    let raw_base = raw_reserve(span, page)?;
    let fd = raw_memfd(page)?;
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
                    MapFlags::SHARED | MapFlags::FIXED | MapFlags::POPULATE,
                    &fd,
                    0,
                )
                .map_err(|e| e.to_string())?;
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
            baseline: "mmap(SHARED|FIXED|POPULATE, memfd)",
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
