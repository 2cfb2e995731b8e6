//! `hetmem bench acl`: the cost the ACL C library (`libascendcl.so`, crate `hetmem-acl`) adds
//! to a call. Each operation goes through the library's C entry points (argument decoding,
//! handle registry, per-thread context, the panic guard) and, as the baseline in the same run,
//! through the same hetmem Rust calls on a runtime of the same configuration:
//! `aclrtMemManagedGetAttr` (READ_MOSTLY of 2 MiB), `aclrtMemManagedAdvise`
//! (SET_ACCESSED_BY host on 2 MiB), `aclrtMemManagedPrefetchAsync` of 2 MiB plus
//! `aclrtSynchronizeStream` (alternately to device 0 and to the host, so a page moves each
//! time), and `aclrtMapMem` + `aclrtUnmapMem` of 2 MiB. Target: at most 150 ns added per call
//! (`<op>_added_ns` in the JSON).
//!
//! The entry points are called as Rust functions of the library's rlib (the same code a C
//! program reaches through the PLT of the shared object).

use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::Instant;

use ascendcl::managed::AclMemManagedLocation;
use ascendcl::vmm::AclPhysicalMemProp;
use hetmem::{AccessAttribute, Advice, Location, PhysicalMemoryFlags, RangeAttribute, Runtime};

use super::{alternate, e2s, json_extra, Args, Row, Unit};

const PAGE: usize = 2 << 20;

fn acl(r: i32, what: &str) -> Result<(), String> {
    if r == 0 {
        return Ok(());
    }
    // SAFETY: the library's NUL-terminated message of this thread.
    let m = unsafe { std::ffi::CStr::from_ptr(ascendcl::aclGetRecentErrMsg()) };
    Err(format!("{what} answered {r}: {}", m.to_string_lossy()))
}

/// ns per operation of `n` runs of `f`.
fn per_op(n: usize, mut f: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    let t = Instant::now();
    for _ in 0..n {
        f()?;
    }
    Ok(t.elapsed().as_nanos() as f64 / n as f64)
}

pub fn bench(args: &Args) -> Result<Vec<Row>, String> {
    let iters = args.iters.max(16);
    let rounds = args.rounds.max(3);
    // The library reads its configuration from the environment at aclInit.
    std::env::set_var("HETMEM_BACKEND", "host");
    std::env::set_var("HETMEM_HOST_DEVICES", "1");
    std::env::set_var("HETMEM_HOST_DEVICE_MEMORY", "256M");
    std::env::remove_var("HETMEM_HOST_MAX_ALLOC");
    let rt = Runtime::from_env().map_err(e2s)?;
    let dev = rt.driver().device(0).ok_or("no device")?;
    let ctx = rt.driver().create_context().map_err(e2s)?;
    let stream = ctx.create_stream(&dev).map_err(e2s)?;
    let m = ctx.alloc_managed(PAGE as u64, 1).map_err(e2s)?;
    ctx.managed_memset(m, 1, PAGE).map_err(e2s)?;
    let page = ctx.query_page_size(&dev, PAGE).map_err(e2s)?;
    let r = ctx.reserve(None, page).map_err(e2s)?;
    let phys = ctx
        .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, page)
        .map_err(e2s)?;

    // SAFETY (every block below): the C entry points with valid out-pointers and arguments.
    let (s, am, va, ph) = unsafe {
        acl(ascendcl::setup::aclInit(std::ptr::null()), "aclInit")?;
        acl(ascendcl::setup::aclrtSetDevice(0), "aclrtSetDevice")?;
        let mut s: *mut c_void = null_mut();
        acl(
            ascendcl::stream::aclrtCreateStream(&mut s),
            "aclrtCreateStream",
        )?;
        let mut am: *mut c_void = null_mut();
        acl(
            ascendcl::managed::aclrtMemAllocManaged(&mut am, PAGE as u64, 1),
            "aclrtMemAllocManaged",
        )?;
        acl(
            ascendcl::memory::aclrtMemset(am, PAGE, 1, PAGE),
            "aclrtMemset",
        )?;
        let mut va: *mut c_void = null_mut();
        acl(
            ascendcl::vmm::aclrtReserveMemAddress(&mut va, page, 0, null_mut(), 0),
            "aclrtReserveMemAddress",
        )?;
        let prop = AclPhysicalMemProp {
            handle_type: 0,
            allocation_type: 0,
            mem_attr: 0,
            location_id: 0,
            location_type: 1,
            reserve: 0,
        };
        let mut ph: *mut c_void = null_mut();
        acl(
            ascendcl::vmm::aclrtMallocPhysical(&mut ph, page, &prop, 0),
            "aclrtMallocPhysical",
        )?;
        (s, am, va, ph)
    };
    let host = AclMemManagedLocation { ty: 2, id: 0 };
    let dev0 = AclMemManagedLocation { ty: 1, id: 0 };

    let mut rows = Vec::new();
    let mut row = |op: &'static str, key: &str, (c, rust): (f64, f64)| {
        json_extra(&format!("{key}_added_ns"), c - rust);
        rows.push(Row {
            op,
            size: "2MiB",
            key: key.into(),
            unit: Unit::Ns,
            hetmem_ns: c,
            baseline_ns: Some(rust),
            baseline: "the same hetmem Rust call",
            target: Some("<= 150 ns added"),
        });
    };

    let mut buf = [0u8; 4];
    row(
        "aclrtMemManagedGetAttr",
        "get_attr_2mib",
        alternate(
            rounds,
            || {
                per_op(iters * 8, || {
                    let mut v = 0i32;
                    // SAFETY: valid pointers; 4-byte buffer.
                    let r = unsafe {
                        ascendcl::managed::aclrtMemManagedGetAttr(
                            1,
                            am,
                            PAGE,
                            &mut v as *mut i32 as *mut c_void,
                            4,
                        )
                    };
                    acl(r, "aclrtMemManagedGetAttr")
                })
            },
            || {
                per_op(iters * 8, || {
                    ctx.managed_get_attr(RangeAttribute::ReadMostly, m, PAGE, &mut buf)
                        .map_err(e2s)
                })
            },
        )?,
    );
    row(
        "aclrtMemManagedAdvise",
        "advise_2mib",
        alternate(
            rounds,
            || {
                per_op(iters * 8, || {
                    acl(
                        ascendcl::managed::aclrtMemManagedAdvise(am, PAGE as u64, 4, host),
                        "aclrtMemManagedAdvise",
                    )
                })
            },
            || {
                per_op(iters * 8, || {
                    ctx.mem_advise(m, PAGE, Advice::SetAccessedBy, Location::Host)
                        .map_err(e2s)
                })
            },
        )?,
    );
    let mut flip = false;
    let mut flip_rust = false;
    row(
        "prefetch + sync",
        "prefetch_2mib",
        alternate(
            rounds,
            || {
                per_op(iters, || {
                    flip = !flip;
                    let to = if flip { dev0 } else { host };
                    acl(
                        ascendcl::managed::aclrtMemManagedPrefetchAsync(am, PAGE, to, 0, s),
                        "aclrtMemManagedPrefetchAsync",
                    )?;
                    acl(
                        ascendcl::stream::aclrtSynchronizeStream(s),
                        "aclrtSynchronizeStream",
                    )
                })
            },
            || {
                per_op(iters, || {
                    flip_rust = !flip_rust;
                    let to = if flip_rust {
                        Location::Device(0)
                    } else {
                        Location::Host
                    };
                    ctx.mem_prefetch(m, PAGE, to, 0, &stream).map_err(e2s)?;
                    stream.synchronize().map_err(e2s)
                })
            },
        )?,
    );
    row(
        "aclrtMapMem + UnmapMem",
        "map_unmap_2mib",
        alternate(
            rounds,
            || {
                per_op(iters, || {
                    acl(
                        ascendcl::vmm::aclrtMapMem(va, page, 0, ph, 0),
                        "aclrtMapMem",
                    )?;
                    acl(ascendcl::vmm::aclrtUnmapMem(va), "aclrtUnmapMem")
                })
            },
            || {
                per_op(iters, || {
                    ctx.map(r.base, page, phys, 0, AccessAttribute::ReadWrite)
                        .map_err(e2s)?;
                    ctx.unmap(r.base, page).map_err(e2s)
                })
            },
        )?,
    );

    acl(ascendcl::vmm::aclrtFreePhysical(ph), "aclrtFreePhysical")?;
    acl(
        ascendcl::vmm::aclrtReleaseMemAddress(va),
        "aclrtReleaseMemAddress",
    )?;
    acl(ascendcl::memory::aclrtFree(am), "aclrtFree")?;
    acl(
        ascendcl::stream::aclrtDestroyStream(s),
        "aclrtDestroyStream",
    )?;
    acl(ascendcl::setup::aclFinalize(), "aclFinalize")?;
    ctx.free_reservation(r).map_err(e2s)?;
    ctx.destroy_physical_memory(phys).map_err(e2s)?;
    ctx.free_managed(m).map_err(e2s)?;
    for r in &rows {
        println!(
            "{}: {:.0} ns added per call",
            r.op,
            r.hetmem_ns - r.baseline_ns.unwrap_or(0.0)
        );
    }
    Ok(rows)
}
