//! `hetmem bench cuda`: hetmem on the cuda backend against the bare CUDA driver calls that do
//! the same work, in the same run (the baselines call the driver through `cudarc`'s raw `sys`
//! layer directly, not through hetmem). Needs an NVIDIA GPU; elsewhere it says why and stops.
//!
//! Sizes are one granule (2 MiB on an H200): the page size the cuda backend reports.

use std::time::Instant;

use cudarc::driver::sys;
use hetmem::{AccessAttribute, AllocDesc, BackendKind, PhysicalMemoryFlags, Runtime};

use super::{alternate, e2s, key, size_name, Args, Row, Unit};

fn ok(what: &str, r: sys::CUresult) -> Result<(), String> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what} failed: {r:?}"))
    }
}

fn prop() -> sys::CUmemAllocationProp {
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

fn rw(flags: sys::CUmemAccess_flags) -> sys::CUmemAccessDesc {
    sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        },
        flags,
    }
}

const RW: sys::CUmemAccess_flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
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
