//! `hetmem bench <group>`: each hetmem operation next to the bare syscalls (or driver calls) it
//! needs, measured in the same run, interleaved round by round, reported as medians and ratios.
//!
//! Ratio convention (every group): a field ending in `_ratio` names the operation and size; for a
//! latency it is hetmem's time over the baseline's (lower is better, 1.0 = no overhead).

use std::hint::black_box;
use std::os::fd::OwnedFd;
use std::time::Instant;

use hetmem::{AccessAttribute, Context, Device, PhysicalMemoryFlags, Runtime};
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, MprotectFlags, ProtFlags};

/// Arguments of `hetmem bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Benchmark group: vmm.
    group: String,
    /// Write every figure of the group to this JSON file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Operations per round and size.
    #[arg(long, default_value_t = 256)]
    iters: usize,
    /// Rounds (hetmem and baseline alternate; the median round counts).
    #[arg(long, default_value_t = 7)]
    rounds: usize,
    /// Live mappings during the get-access measurement.
    #[arg(long, default_value_t = 50_000)]
    live_mappings: usize,
}

/// One row of the table: an operation at a size, hetmem vs its baseline, ns per operation.
struct Row {
    op: &'static str,
    size: &'static str,
    key: String,
    hetmem_ns: f64,
    baseline_ns: Option<f64>,
    baseline: &'static str,
    target: Option<&'static str>,
}

pub fn run(args: Args) -> Result<(), String> {
    let rows = match args.group.as_str() {
        "vmm" => bench_vmm(&args)?,
        other => return Err(format!("unknown benchmark group {other:?}; groups: vmm")),
    };
    print_table(&args.group, &rows);
    if let Some(path) = &args.json {
        let mut obj = serde_json::Map::new();
        obj.insert("group".into(), args.group.clone().into());
        obj.insert("iters".into(), args.iters.into());
        obj.insert("rounds".into(), args.rounds.into());
        for r in &rows {
            obj.insert(format!("{}_ns", r.key), r.hetmem_ns.into());
            if let Some(b) = r.baseline_ns {
                obj.insert(format!("{}_baseline_ns", r.key), b.into());
                obj.insert(format!("{}_ratio", r.key), (r.hetmem_ns / b).into());
            }
        }
        let text = serde_json::to_string_pretty(&serde_json::Value::Object(obj))
            .map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn print_table(group: &str, rows: &[Row]) {
    println!(
        "hetmem bench {group} (ns per operation, median of rounds; ratio = hetmem / baseline)"
    );
    println!(
        "{:<22} {:>7} {:>12} {:>12} {:>7}  {:<44} target",
        "operation", "size", "hetmem", "baseline", "ratio", "baseline is"
    );
    for r in rows {
        let (b, ratio) = match r.baseline_ns {
            Some(b) => (format!("{b:.0}"), format!("{:.2}", r.hetmem_ns / b)),
            None => ("-".into(), "-".into()),
        };
        println!(
            "{:<22} {:>7} {:>12.0} {:>12} {:>7}  {:<44} {}",
            r.op,
            r.size,
            r.hetmem_ns,
            b,
            ratio,
            r.baseline,
            r.target.unwrap_or("")
        );
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs `hetmem_round` and `baseline_round` alternately `rounds` times; each returns the ns per
/// operation of one round. Returns the medians.
fn alternate(
    rounds: usize,
    mut hetmem_round: impl FnMut() -> Result<f64, String>,
    mut baseline_round: impl FnMut() -> Result<f64, String>,
) -> Result<(f64, f64), String> {
    let (mut h, mut b) = (Vec::new(), Vec::new());
    // One warm-up round of each, not counted.
    hetmem_round()?;
    baseline_round()?;
    // Alternate which side goes first, so that work the kernel defers (RCU frees of VMAs,
    // page-table teardown) is charged to both sides alike.
    for r in 0..rounds {
        if r % 2 == 0 {
            h.push(hetmem_round()?);
            b.push(baseline_round()?);
        } else {
            b.push(baseline_round()?);
            h.push(hetmem_round()?);
        }
    }
    Ok((median(h), median(b)))
}

fn e2s(e: hetmem::Error) -> String {
    e.to_string()
}

fn raw_memfd(size: usize) -> Result<OwnedFd, String> {
    let fd = rustix::fs::memfd_create("bench", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .map_err(|e| e.to_string())?;
    rustix::fs::ftruncate(&fd, size as u64).map_err(|e| e.to_string())?;
    rustix::fs::fcntl_add_seals(&fd, SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL)
        .map_err(|e| e.to_string())?;
    Ok(fd)
}

/// A raw reservation for the baselines: `mmap(PROT_NONE)` aligned to `align`.
fn raw_reserve(size: usize, align: usize) -> Result<usize, String> {
    // SAFETY: a fresh anonymous mapping; the slack is unmapped at once.
    unsafe {
        let p = rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            size + align,
            ProtFlags::empty(),
            MapFlags::PRIVATE | MapFlags::NORESERVE,
        )
        .map_err(|e| e.to_string())? as usize;
        let start = (p + align - 1) & !(align - 1);
        if start > p {
            rustix::mm::munmap(p as *mut _, start - p).map_err(|e| e.to_string())?;
        }
        let tail = p + size + align - (start + size);
        if tail > 0 {
            rustix::mm::munmap((start + size) as *mut _, tail).map_err(|e| e.to_string())?;
        }
        Ok(start)
    }
}

fn raw_release(addr: usize, size: usize) {
    // SAFETY: a raw reservation of ours.
    unsafe { rustix::mm::munmap(addr as *mut _, size).ok() };
}

fn size_name(s: usize) -> &'static str {
    match s {
        0x10000 => "64KiB",
        0x200000 => "2MiB",
        _ => "?",
    }
}

fn key(op: &str, s: usize) -> String {
    format!("{op}_{}", size_name(s).to_ascii_lowercase())
}

fn bench_vmm(args: &Args) -> Result<Vec<Row>, String> {
    let rt = Runtime::builder()
        .host_devices(1)
        .host_device_memory(8 << 30)
        .build()
        .map_err(e2s)?;
    let dev = rt.driver().device(0).ok_or("no device")?;
    let ctx = rt.driver().create_context().map_err(e2s)?;
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
                    MapFlags::SHARED | MapFlags::FIXED,
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
            op: "map",
            size: size_name(page),
            key: key("map", page),
            hetmem_ns: median(map_h),
            baseline_ns: Some(median(map_b)),
            baseline: "mmap(MAP_SHARED|MAP_FIXED, memfd)",
            target: (page == 2 << 20).then_some("<= 1.3x"),
        },
        Row {
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
                MapFlags::SHARED | MapFlags::FIXED,
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
        op: "get-access",
        size: "64KiB",
        key: format!("get_access_{}k_live", live / 1000),
        hetmem_ns: median(rounds),
        baseline_ns: None,
        baseline: "(absolute; no syscall needed)",
        target: Some("< 1000 ns"),
    })
}
