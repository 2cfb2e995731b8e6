//! `hetmem bench cuda`: hetmem on the cuda backend against the bare CUDA driver calls that do
//! the same work, in the same run (the baselines call the driver through `cudarc`'s raw `sys`
//! layer directly, not through hetmem). Needs an NVIDIA GPU; elsewhere it says why and stops.
//!
//! Sizes are one granule (2 MiB on an H200): the page size the cuda backend reports.
//!
//! The KV-cache growth rows give the cost per 2 MiB of growing a cache by chunks of
//! [`KV_CHUNK`] granules (one physical object each, created or taken from a pool, mapped whole
//! with its access set: one `cuMemMap` and one `cuMemSetAccess` per chunk) against the naive
//! per-2 MiB `cuMemCreate + cuMemMap + cuMemSetAccess`; the release rows likewise (`unmap` of a
//! chunk, back to the pool or destroyed, against `cuMemUnmap + cuMemRelease` per 2 MiB). Their
//! `*_speedup` JSON fields are baseline / hetmem. The managed row prefetches 1 GiB of managed
//! memory from the host to the GPU against a `cuMemcpyHtoD` of the same bytes from pinned
//! memory. The malloc rows (`copy_malloc2d_64mib`, `copy_d2malloc_64mib`, `fill_malloc_64mib`,
//! each with its `_ratio`) are those of `hetmem bench usm`: a queue's copy or fill with a
//! `malloc`'d operand against the same with pinned USM host memory (target >= 0.9x).

use std::time::Instant;

use cudarc::driver::sys;
use hetmem::{
    AccessAttribute, AllocDesc, BackendKind, Context, Device, Location, PhysicalMemory,
    PhysicalMemoryFlags, Runtime,
};

use super::{alternate, e2s, key, size_name, Args, Row, Unit};

pub(super) fn ok(what: &str, r: sys::CUresult) -> Result<(), String> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what} failed: {r:?}"))
    }
}

pub(super) fn prop() -> sys::CUmemAllocationProp {
    // SAFETY: plain data; all-zero is valid, the fields used are set below.
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes =
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p.location = sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: 0,
    };
    p
}

pub(super) fn rw(flags: sys::CUmemAccess_flags) -> sys::CUmemAccessDesc {
    sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        },
        flags,
    }
}

pub(super) const RW: sys::CUmemAccess_flags =
    sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
const RO: sys::CUmemAccess_flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ;

pub fn bench(args: &Args) -> Result<Vec<Row>, String> {
    let rt = Runtime::builder()
        .backend(BackendKind::Cuda)
        .build()
        .map_err(e2s)?;
    let dev = rt.driver().device(0).ok_or("no device")?;
    let ctx = rt.driver().create_context().map_err(e2s)?;
    let page = ctx.query_page_size(&dev, 1).map_err(e2s)?;
    // The baselines run on this thread in device 0's primary context.
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        let mut d = 0;
        ok("cuDeviceGet", sys::cuDeviceGet(&mut d, 0))?;
        let mut c = std::ptr::null_mut();
        ok(
            "cuDevicePrimaryCtxRetain",
            sys::cuDevicePrimaryCtxRetain(&mut c, d),
        )?;
        ok("cuCtxSetCurrent", sys::cuCtxSetCurrent(c))?;
    }
    let n = args.iters;
    let p = prop();
    let per = |t: Instant| t.elapsed().as_nanos() as f64 / n as f64;
    let mut rows = Vec::new();

    // reserve + free
    let (h, b) = alternate(
        args.rounds,
        || {
            let t = Instant::now();
            for _ in 0..n {
                let r = ctx.reserve(None, page).map_err(e2s)?;
                ctx.free_reservation(r).map_err(e2s)?;
            }
            Ok(per(t))
        },
        || {
            let t = Instant::now();
            for _ in 0..n {
                let mut a = 0;
                // SAFETY: reserve then free the same range.
                unsafe {
                    ok(
                        "cuMemAddressReserve",
                        sys::cuMemAddressReserve(&mut a, page, page, 0, 0),
                    )?;
                    ok("cuMemAddressFree", sys::cuMemAddressFree(a, page))?;
                }
            }
            Ok(per(t))
        },
    )?;
    rows.push(row(
        "reserve+free",
        page,
        "reserve_free",
        h,
        b,
        "cuMemAddressReserve + cuMemAddressFree",
    ));

    // create + destroy physical memory
    let (h, b) = alternate(
        args.rounds,
        || {
            let t = Instant::now();
            for _ in 0..n {
                let ph = ctx
                    .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, page)
                    .map_err(e2s)?;
                ctx.destroy_physical_memory(ph).map_err(e2s)?;
            }
            Ok(per(t))
        },
        || {
            let t = Instant::now();
            for _ in 0..n {
                let mut hd = 0;
                // SAFETY: create then release one allocation.
                unsafe {
                    ok("cuMemCreate", sys::cuMemCreate(&mut hd, page, &p, 0))?;
                    ok("cuMemRelease", sys::cuMemRelease(hd))?;
                }
            }
            Ok(per(t))
        },
    )?;
    rows.push(row(
        "create+destroy",
        page,
        "create_destroy",
        h,
        b,
        "cuMemCreate + cuMemRelease",
    ));

    // map, set-access, unmap: n granules of one reservation, every other one mapped.
    let span = 2 * n * page;
    let res = ctx.reserve(None, span).map_err(e2s)?;
    let phys = ctx
        .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, page)
        .map_err(e2s)?;
    let mut raw_va = 0;
    let mut raw_h = 0;
    // SAFETY: a reservation and an allocation for the baseline.
    unsafe {
        ok(
            "cuMemAddressReserve",
            sys::cuMemAddressReserve(&mut raw_va, span, page, 0, 0),
        )?;
        ok("cuMemCreate", sys::cuMemCreate(&mut raw_h, page, &p, 0))?;
    }
    let (mut mh, mut mb, mut uh, mut ub, mut sh, mut sb) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for round in 0..=args.rounds {
        let hetmem = || -> Result<(f64, f64, f64), String> {
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
            let m = per(t);
            let t = Instant::now();
            for i in 0..n {
                let a = if i % 2 == 0 {
                    AccessAttribute::ReadOnly
                } else {
                    AccessAttribute::ReadWrite
                };
                ctx.set_access_attribute(res.base + 2 * i * page, page, a)
                    .map_err(e2s)?;
            }
            let s = per(t);
            let t = Instant::now();
            for i in 0..n {
                ctx.unmap(res.base + 2 * i * page, page).map_err(e2s)?;
            }
            Ok((m, s, per(t)))
        };
        let bare = || -> Result<(f64, f64, f64), String> {
            let t = Instant::now();
            for i in 0..n {
                let a = raw_va + (2 * i * page) as u64;
                // SAFETY: an unmapped granule of our reservation.
                unsafe {
                    ok("cuMemMap", sys::cuMemMap(a, page, 0, raw_h, 0))?;
                    ok("cuMemSetAccess", sys::cuMemSetAccess(a, page, &rw(RW), 1))?;
                }
            }
            let m = per(t);
            let t = Instant::now();
            for i in 0..n {
                let a = raw_va + (2 * i * page) as u64;
                let f = if i % 2 == 0 { RO } else { RW };
                // SAFETY: a mapped granule.
                unsafe { ok("cuMemSetAccess", sys::cuMemSetAccess(a, page, &rw(f), 1))? };
            }
            let s = per(t);
            let t = Instant::now();
            for i in 0..n {
                let a = raw_va + (2 * i * page) as u64;
                // SAFETY: a mapped granule, unused.
                unsafe { ok("cuMemUnmap", sys::cuMemUnmap(a, page))? };
            }
            Ok((m, s, per(t)))
        };
        let (x, y) = if round % 2 == 0 {
            let x = hetmem()?;
            (x, bare()?)
        } else {
            let y = bare()?;
            (hetmem()?, y)
        };
        if round > 0 {
            mh.push(x.0);
            sh.push(x.1);
            uh.push(x.2);
            mb.push(y.0);
            sb.push(y.1);
            ub.push(y.2);
        }
    }
    use super::median;
    rows.push(row(
        "map",
        page,
        "map",
        median(mh),
        median(mb),
        "cuMemMap + cuMemSetAccess",
    ));
    rows.push(row(
        "set-access",
        page,
        "set_access",
        median(sh),
        median(sb),
        "cuMemSetAccess",
    ));
    rows.push(row(
        "unmap",
        page,
        "unmap",
        median(uh),
        median(ub),
        "cuMemUnmap",
    ));
    ctx.destroy_physical_memory(phys).map_err(e2s)?;
    ctx.free_reservation(res).map_err(e2s)?;
    // SAFETY: the baseline's objects, all unmapped.
    unsafe {
        let _ = sys::cuMemRelease(raw_h);
        let _ = sys::cuMemAddressFree(raw_va, span);
    }

    // Device allocation + free, against the same driver sequence, and against cuMemAlloc.
    let (h, b) = alternate(
        args.rounds,
        || {
            let t = Instant::now();
            for _ in 0..n {
                let a = ctx.alloc_device(&dev, &AllocDesc::new(page)).map_err(e2s)?;
                ctx.free_memory(a).map_err(e2s)?;
            }
            Ok(per(t))
        },
        || {
            let t = Instant::now();
            for _ in 0..n {
                let (mut hd, mut a) = (0, 0);
                // SAFETY: the same sequence as the cuda backend's device allocation, undone.
                unsafe {
                    ok("cuMemCreate", sys::cuMemCreate(&mut hd, page, &p, 0))?;
                    ok(
                        "cuMemAddressReserve",
                        sys::cuMemAddressReserve(&mut a, page, page, 0, 0),
                    )?;
                    ok("cuMemMap", sys::cuMemMap(a, page, 0, hd, 0))?;
                    ok("cuMemSetAccess", sys::cuMemSetAccess(a, page, &rw(RW), 1))?;
                    ok("cuMemUnmap", sys::cuMemUnmap(a, page))?;
                    ok("cuMemAddressFree", sys::cuMemAddressFree(a, page))?;
                    ok("cuMemRelease", sys::cuMemRelease(hd))?;
                }
            }
            Ok(per(t))
        },
    )?;
    rows.push(row(
        "alloc+free device",
        page,
        "alloc_free_device",
        h,
        b,
        "cuMemCreate+Reserve+Map+SetAccess, undone",
    ));
    let (_, b2) = alternate(
        args.rounds,
        || Ok(0.0),
        || {
            let t = Instant::now();
            for _ in 0..n {
                let mut a = 0;
                // SAFETY: allocate then free.
                unsafe {
                    ok("cuMemAlloc", sys::cuMemAlloc_v2(&mut a, page))?;
                    ok("cuMemFree", sys::cuMemFree_v2(a))?;
                }
            }
            Ok(per(t))
        },
    )?;
    rows.push(row(
        "alloc+free device",
        page,
        "alloc_free_device_vs_cumemalloc",
        h,
        b2,
        "cuMemAlloc + cuMemFree (not exportable)",
    ));

    rows.push(small_copies(args, &ctx, &dev)?);
    rows.extend(kv_growth(args, &ctx, &dev, page, &p)?);
    rows.push(managed_prefetch(args, &ctx, &dev)?);

    // Device-to-device copy bandwidth through a command list against cuMemcpyAsync.
    let big = 1usize << 30;
    let src = ctx.alloc_device(&dev, &AllocDesc::new(big)).map_err(e2s)?;
    let dst = ctx.alloc_device(&dev, &AllocDesc::new(big)).map_err(e2s)?;
    let list = ctx.create_immediate_command_list(&dev).map_err(e2s)?;
    let mut stream = std::ptr::null_mut();
    // SAFETY: a stream for the baseline.
    unsafe { ok("cuStreamCreate", sys::cuStreamCreate(&mut stream, 1))? };
    let reps = 8;
    let gib = (big * reps) as f64 / (1u64 << 30) as f64;
    let (h, b) = alternate(
        args.rounds,
        || {
            let t = Instant::now();
            for _ in 0..reps {
                list.append_memory_copy(dst, src, big, None, &[])
                    .map_err(e2s)?;
            }
            list.host_synchronize(u64::MAX).map_err(e2s)?;
            Ok(gib / t.elapsed().as_secs_f64())
        },
        || {
            let t = Instant::now();
            // SAFETY: both ranges are live device memory of `big` bytes.
            unsafe {
                for _ in 0..reps {
                    ok(
                        "cuMemcpyAsync",
                        sys::cuMemcpyAsync(dst as u64, src as u64, big, stream),
                    )?;
                }
                ok("cuStreamSynchronize", sys::cuStreamSynchronize(stream))?;
            }
            Ok(gib / t.elapsed().as_secs_f64())
        },
    )?;
    rows.push(Row {
        unit: Unit::GiBps,
        op: "copy device->device",
        size: "1 GiB",
        key: "copy_d2d_1g".into(),
        hetmem_ns: h,
        baseline_ns: Some(b),
        baseline: "cuMemcpyAsync + cuStreamSynchronize",
        target: None,
    });
    // SAFETY: the baseline's stream, idle.
    unsafe {
        let _ = sys::cuStreamDestroy_v2(stream);
    }
    ctx.free_memory(src).map_err(e2s)?;
    ctx.free_memory(dst).map_err(e2s)?;

    // Plain system memory as an operand (Level Zero case 1): the `bench usm` malloc rows at
    // 64 MiB, the USM side pinned host memory (`cuMemHostAlloc`).
    let size = 64usize << 20;
    let host = ctx.alloc_host(&AllocDesc::new(size)).map_err(e2s)?;
    let devp = ctx.alloc_device(&dev, &AllocDesc::new(size)).map_err(e2s)?;
    // SAFETY: a live host allocation of `size` bytes, touched as the malloc side is.
    unsafe { std::ptr::write_bytes(host as *mut u8, 3, size) };
    let q = ctx.create_command_queue(&dev).map_err(e2s)?;
    rows.extend(super::usm::malloc_rows(
        &ctx, &dev, &q, args, host, devp, size, 16,
    )?);
    drop(q);
    ctx.free_memory(host).map_err(e2s)?;
    ctx.free_memory(devp).map_err(e2s)?;
    Ok(rows)
}

fn row(op: &'static str, page: usize, k: &str, h: f64, b: f64, baseline: &'static str) -> Row {
    Row {
        unit: Unit::Ns,
        op,
        size: size_name(page),
        key: key(k, page),
        hetmem_ns: h,
        baseline_ns: Some(b),
        baseline,
        target: None,
    }
}

/// Granules per physical chunk on the KV-cache growth path (32 MiB on an H200).
pub const KV_CHUNK: usize = 16;

/// The KV-cache growth and release rows (see the module docs).
fn kv_growth(
    args: &Args,
    ctx: &Context,
    dev: &Device,
    page: usize,
    p: &sys::CUmemAllocationProp,
) -> Result<Vec<Row>, String> {
    let chunks = 32; // 512 granules: 1 GiB on an H200
    let chunk = KV_CHUNK * page;
    let granules = chunks * KV_CHUNK;
    let span = chunks * chunk;
    let res = ctx.reserve(None, span).map_err(e2s)?;
    let mut pool: Vec<PhysicalMemory> = Vec::new();
    for _ in 0..chunks {
        pool.push(
            ctx.create_physical_memory(Some(dev), PhysicalMemoryFlags::AllocateOnDevice, chunk)
                .map_err(e2s)?,
        );
    }
    let mut raw_va = 0;
    // SAFETY: a reservation for the baseline.
    unsafe {
        ok(
            "cuMemAddressReserve",
            sys::cuMemAddressReserve(&mut raw_va, span, page, 0, 0),
        )?;
    }
    let per = |t: Instant| t.elapsed().as_nanos() as f64 / granules as f64;
    // Growth then release, per 2 MiB: with chunks created on the way, from the pool, and naive.
    let created = |ctx: &Context| -> Result<(f64, f64), String> {
        let t = Instant::now();
        let mut objs = Vec::with_capacity(chunks);
        for i in 0..chunks {
            let ph = ctx
                .create_physical_memory(Some(dev), PhysicalMemoryFlags::AllocateOnDevice, chunk)
                .map_err(e2s)?;
            ctx.map(
                res.base + i * chunk,
                chunk,
                ph,
                0,
                AccessAttribute::ReadWrite,
            )
            .map_err(e2s)?;
            objs.push(ph);
        }
        let g = per(t);
        let t = Instant::now();
        for (i, ph) in objs.into_iter().enumerate() {
            ctx.unmap(res.base + i * chunk, chunk).map_err(e2s)?;
            ctx.destroy_physical_memory(ph).map_err(e2s)?;
        }
        Ok((g, per(t)))
    };
    let pooled = |ctx: &Context, pool: &[PhysicalMemory]| -> Result<(f64, f64), String> {
        let t = Instant::now();
        for (i, &ph) in pool.iter().enumerate() {
            ctx.map(
                res.base + i * chunk,
                chunk,
                ph,
                0,
                AccessAttribute::ReadWrite,
            )
            .map_err(e2s)?;
        }
        let g = per(t);
        let t = Instant::now();
        for i in 0..pool.len() {
            ctx.unmap(res.base + i * chunk, chunk).map_err(e2s)?;
        }
        Ok((g, per(t)))
    };
    let naive = || -> Result<(f64, f64), String> {
        let t = Instant::now();
        let mut hs = Vec::with_capacity(granules);
        for i in 0..granules {
            let a = raw_va + (i * page) as u64;
            let mut h = 0;
            // SAFETY: one granule created and mapped into an unmapped part of our reservation.
            unsafe {
                ok("cuMemCreate", sys::cuMemCreate(&mut h, page, p, 0))?;
                ok("cuMemMap", sys::cuMemMap(a, page, 0, h, 0))?;
                ok("cuMemSetAccess", sys::cuMemSetAccess(a, page, &rw(RW), 1))?;
            }
            hs.push(h);
        }
        let g = per(t);
        let t = Instant::now();
        for (i, h) in hs.into_iter().enumerate() {
            // SAFETY: mapped above, unused.
            unsafe {
                ok(
                    "cuMemUnmap",
                    sys::cuMemUnmap(raw_va + (i * page) as u64, page),
                )?;
                ok("cuMemRelease", sys::cuMemRelease(h))?;
            }
        }
        Ok((g, per(t)))
    };
    let (mut cg, mut cr, mut pg, mut pr, mut ng, mut nr) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for round in 0..=args.rounds.max(3) {
        let order: [u8; 3] = match round % 3 {
            0 => [0, 1, 2],
            1 => [1, 2, 0],
            _ => [2, 0, 1],
        };
        for k in order {
            let (g, r) = match k {
                0 => created(ctx)?,
                1 => pooled(ctx, &pool)?,
                _ => naive()?,
            };
            if round > 0 {
                let (gv, rv) = match k {
                    0 => (&mut cg, &mut cr),
                    1 => (&mut pg, &mut pr),
                    _ => (&mut ng, &mut nr),
                };
                gv.push(g);
                rv.push(r);
            }
        }
    }
    for ph in pool {
        ctx.destroy_physical_memory(ph).map_err(e2s)?;
    }
    ctx.free_reservation(res).map_err(e2s)?;
    // SAFETY: the baseline's reservation, empty.
    unsafe {
        let _ = sys::cuMemAddressFree(raw_va, span);
    }
    use super::median;
    let (cg, cr, pg, pr, ng, nr) = (
        median(cg),
        median(cr),
        median(pg),
        median(pr),
        median(ng),
        median(nr),
    );
    let kv = |op, k: &str, h: f64, b: f64, baseline, target| {
        super::json_extra(&format!("{}_speedup", key(k, page)), b / h);
        Row {
            unit: Unit::Ns,
            op,
            size: size_name(page),
            key: key(k, page),
            hetmem_ns: h,
            baseline_ns: Some(b),
            baseline,
            target,
        }
    };
    Ok(vec![
        kv(
            "kv grow (new chunk)",
            "kv_grow_created",
            cg,
            ng,
            "cuMemCreate+cuMemMap+cuMemSetAccess per 2MiB",
            Some("<= 0.125 (8x)"),
        ),
        kv(
            "kv grow (pooled)",
            "kv_grow_pooled",
            pg,
            ng,
            "cuMemCreate+cuMemMap+cuMemSetAccess per 2MiB",
            Some("<= 0.125 (8x)"),
        ),
        kv(
            "kv release (destroy)",
            "kv_release_destroyed",
            cr,
            nr,
            "cuMemUnmap+cuMemRelease per 2MiB",
            None,
        ),
        kv(
            "kv release (to pool)",
            "kv_release_pooled",
            pr,
            nr,
            "cuMemUnmap+cuMemRelease per 2MiB",
            None,
        ),
    ])
}

/// Managed memory prefetched host -> GPU (1 GiB, resident on the host first) against a
/// `cuMemcpyHtoD` of 1 GiB from pinned host memory, in GiB/s.
fn managed_prefetch(args: &Args, ctx: &Context, dev: &Device) -> Result<Row, String> {
    let size = 1usize << 30;
    let m = ctx.alloc_managed(size as u64, 1).map_err(e2s)?;
    let s = ctx.create_stream(dev).map_err(e2s)?;
    let (mut pinned, mut dptr) = (std::ptr::null_mut(), 0);
    // SAFETY: pinned host memory and device memory for the baseline.
    unsafe {
        ok("cuMemAllocHost", sys::cuMemAllocHost_v2(&mut pinned, size))?;
        ok("cuMemAlloc", sys::cuMemAlloc_v2(&mut dptr, size))?;
        std::ptr::write_bytes(pinned as *mut u8, 3, size);
    }
    let gib = size as f64 / (1u64 << 30) as f64;
    let r = alternate(
        args.rounds.max(3),
        || {
            // Back on the host first (not timed), then to the GPU.
            ctx.mem_prefetch(m, size, Location::Host, 0, &s)
                .map_err(e2s)?;
            s.synchronize().map_err(e2s)?;
            let t = Instant::now();
            ctx.mem_prefetch(m, size, Location::Device(0), 0, &s)
                .map_err(e2s)?;
            s.synchronize().map_err(e2s)?;
            Ok(gib / t.elapsed().as_secs_f64())
        },
        || {
            let t = Instant::now();
            // SAFETY: both buffers are ours and `size` long.
            unsafe { ok("cuMemcpyHtoD", sys::cuMemcpyHtoD_v2(dptr, pinned, size))? };
            Ok(gib / t.elapsed().as_secs_f64())
        },
    );
    // SAFETY: the baseline's buffers, idle.
    unsafe {
        let _ = sys::cuMemFreeHost(pinned);
        let _ = sys::cuMemFree_v2(dptr);
    }
    ctx.free_managed(m).map_err(e2s)?;
    let (h, b) = r?;
    Ok(Row {
        unit: Unit::GiBps,
        op: "managed prefetch h->d",
        size: "1 GiB",
        key: "managed_prefetch_to_device_1g".into(),
        hetmem_ns: h,
        baseline_ns: Some(b),
        baseline: "cuMemcpyHtoD from pinned memory",
        target: Some(">= 0.8"),
    })
}

/// Copies per batch in the small-copy row.
const SMALL_COPIES: usize = 1024;

/// [`SMALL_COPIES`] copies of 8 bytes from host USM memory to scattered places of one device
/// allocation on an immediate command list, then one `host_synchronize` (what the KV-cache demo
/// does for its tags), against as many `cuMemcpyAsync` on one stream and one
/// `cuStreamSynchronize`; ns per copy.
fn small_copies(args: &Args, ctx: &Context, dev: &Device) -> Result<Row, String> {
    let n = SMALL_COPIES;
    let stride = 4096usize;
    let host = ctx.alloc_host(&AllocDesc::new(n * 8)).map_err(e2s)?;
    let dst = ctx
        .alloc_device(dev, &AllocDesc::new(n * stride))
        .map_err(e2s)?;
    let list = ctx.create_immediate_command_list(dev).map_err(e2s)?;
    let mut stream = std::ptr::null_mut();
    // SAFETY: a stream for the baseline.
    unsafe { ok("cuStreamCreate", sys::cuStreamCreate(&mut stream, 1))? };
    let rounds = args.iters.clamp(1, 16);
    let r = alternate(
        args.rounds,
        || {
            let t = Instant::now();
            for _ in 0..rounds {
                for i in 0..n {
                    list.append_memory_copy(dst + i * stride, host + i * 8, 8, None, &[])
                        .map_err(e2s)?;
                }
                list.host_synchronize(u64::MAX).map_err(e2s)?;
            }
            Ok(t.elapsed().as_nanos() as f64 / (rounds * n) as f64)
        },
        || {
            let t = Instant::now();
            // SAFETY: both ranges are live: host USM memory (pinned) and device memory.
            unsafe {
                for _ in 0..rounds {
                    for i in 0..n {
                        ok(
                            "cuMemcpyAsync",
                            sys::cuMemcpyAsync(
                                (dst + i * stride) as u64,
                                (host + i * 8) as u64,
                                8,
                                stream,
                            ),
                        )?;
                    }
                    ok("cuStreamSynchronize", sys::cuStreamSynchronize(stream))?;
                }
            }
            Ok(t.elapsed().as_nanos() as f64 / (rounds * n) as f64)
        },
    );
    // SAFETY: the baseline's stream, idle.
    unsafe {
        let _ = sys::cuStreamDestroy_v2(stream);
    }
    drop(list);
    ctx.free_memory(dst).map_err(e2s)?;
    ctx.free_memory(host).map_err(e2s)?;
    let (h, b) = r?;
    Ok(Row {
        unit: Unit::Ns,
        op: "copy 8 B host->device x1024",
        size: "8 B",
        key: "copy_small_h2d_batch".into(),
        hetmem_ns: h,
        baseline_ns: Some(b),
        baseline: "cuMemcpyAsync x1024 + cuStreamSynchronize",
        target: None,
    })
}
