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
//! Then the sleep-mode VMM rows ([`super::acl_vmm`]): reserve, allocate physical, map, unmap,
//! free physical, release, per 2 MiB and per 1 GiB of 32 MiB chunks, C against Rust and, on the
//! cuda backend (`HETMEM_BACKEND=cuda`; the host backend otherwise), against the bare CUDA
//! driver calls.
//!
//! The entry points are called through `libascendcl.so` itself (`dlopen` of the library next to
//! the `hetmem` executable, or `$HETMEM_ACL_LIB`), as a C program calls them; where no shared
//! object is found they are called as functions of the library's rlib linked into `hetmem`
//! (the same code). The table says which.

use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::Instant;

use ascendcl::managed::AclMemManagedLocation;
use ascendcl::vmm::AclPhysicalMemProp;
use hetmem::{AccessAttribute, Advice, Location, PhysicalMemoryFlags, RangeAttribute, Runtime};

use super::{alternate, e2s, json_extra, Args, Row, Unit};

const PAGE: usize = 2 << 20;

type Loc = AclMemManagedLocation;

/// The entry points the benchmark calls, from the shared object or the rlib.
pub(super) struct Api {
    from: String,
    pub(super) init: unsafe extern "C" fn(*const libc::c_char) -> i32,
    pub(super) finalize: extern "C" fn() -> i32,
    pub(super) set_device: extern "C" fn(i32) -> i32,
    pub(super) create_stream: unsafe extern "C" fn(*mut *mut c_void) -> i32,
    pub(super) destroy_stream: extern "C" fn(*mut c_void) -> i32,
    pub(super) sync_stream: extern "C" fn(*mut c_void) -> i32,
    pub(super) alloc_managed: unsafe extern "C" fn(*mut *mut c_void, u64, u32) -> i32,
    pub(super) memset: extern "C" fn(*mut c_void, usize, i32, usize) -> i32,
    pub(super) free: extern "C" fn(*mut c_void) -> i32,
    pub(super) get_attr: unsafe extern "C" fn(u32, *const c_void, usize, *mut c_void, usize) -> i32,
    pub(super) advise: extern "C" fn(*const c_void, u64, u32, Loc) -> i32,
    pub(super) prefetch: extern "C" fn(*const c_void, usize, Loc, u32, *mut c_void) -> i32,
    pub(super) reserve:
        unsafe extern "C" fn(*mut *mut c_void, usize, usize, *mut c_void, u64) -> i32,
    pub(super) release: extern "C" fn(*mut c_void) -> i32,
    pub(super) malloc_physical:
        unsafe extern "C" fn(*mut *mut c_void, usize, *const AclPhysicalMemProp, u64) -> i32,
    pub(super) free_physical: extern "C" fn(*mut c_void) -> i32,
    pub(super) map: extern "C" fn(*mut c_void, usize, usize, *mut c_void, u64) -> i32,
    pub(super) unmap: extern "C" fn(*mut c_void) -> i32,
    pub(super) granularity: unsafe extern "C" fn(*const AclPhysicalMemProp, u32, *mut usize) -> i32,
    pub(super) recent: extern "C" fn() -> *const libc::c_char,
}

/// A symbol's address as the function pointer type `F`.
///
/// # Safety
/// `p` is the address of a function whose signature is `F`.
unsafe fn fn_ptr<F: Copy>(p: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: same size (checked); the caller vouches for the signature.
    unsafe { std::mem::transmute_copy(&p) }
}

impl Api {
    /// The rlib's functions.
    fn linked() -> Api {
        use ascendcl::{managed as m, memory as mem, setup as st, stream as s, vmm as v};
        Api {
            from: "the library's rlib (no libascendcl.so found)".into(),
            init: st::aclInit,
            finalize: st::aclFinalize,
            set_device: st::aclrtSetDevice,
            create_stream: s::aclrtCreateStream,
            destroy_stream: s::aclrtDestroyStream,
            sync_stream: s::aclrtSynchronizeStream,
            alloc_managed: m::aclrtMemAllocManaged,
            memset: mem::aclrtMemset,
            free: mem::aclrtFree,
            get_attr: m::aclrtMemManagedGetAttr,
            advise: m::aclrtMemManagedAdvise,
            prefetch: m::aclrtMemManagedPrefetchAsync,
            reserve: v::aclrtReserveMemAddress,
            release: v::aclrtReleaseMemAddress,
            malloc_physical: v::aclrtMallocPhysical,
            free_physical: v::aclrtFreePhysical,
            map: v::aclrtMapMem,
            unmap: v::aclrtUnmapMem,
            granularity: v::aclrtMemGetAllocationGranularity,
            recent: ascendcl::aclGetRecentErrMsg,
        }
    }

    /// The shared object's functions: `$HETMEM_ACL_LIB`, else `libascendcl.so` beside the
    /// executable; `None` if there is none.
    fn shared() -> Option<Api> {
        let path = std::env::var_os("HETMEM_ACL_LIB")
            .map(std::path::PathBuf::from)
            .or_else(|| {
                let p = std::env::current_exe()
                    .ok()?
                    .with_file_name("libascendcl.so");
                p.exists().then_some(p)
            })?;
        let c = std::ffi::CString::new(path.to_string_lossy().as_bytes()).ok()?;
        // SAFETY: dlopen of a path; the handle is kept for the process's life (never closed).
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return None;
        }
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: a NUL-terminated symbol name looked up in the handle above.
                let p = unsafe { libc::dlsym(h, concat!($name, "\0").as_ptr() as *const _) };
                if p.is_null() {
                    return None;
                }
                // SAFETY: the symbol is the C entry point of that name, whose signature the
                // field's type is (the library's headers).
                unsafe { fn_ptr(p) }
            }};
        }
        Some(Api {
            from: format!("{} (dlopen)", path.display()),
            init: sym!("aclInit"),
            finalize: sym!("aclFinalize"),
            set_device: sym!("aclrtSetDevice"),
            create_stream: sym!("aclrtCreateStream"),
            destroy_stream: sym!("aclrtDestroyStream"),
            sync_stream: sym!("aclrtSynchronizeStream"),
            alloc_managed: sym!("aclrtMemAllocManaged"),
            memset: sym!("aclrtMemset"),
            free: sym!("aclrtFree"),
            get_attr: sym!("aclrtMemManagedGetAttr"),
            advise: sym!("aclrtMemManagedAdvise"),
            prefetch: sym!("aclrtMemManagedPrefetchAsync"),
            reserve: sym!("aclrtReserveMemAddress"),
            release: sym!("aclrtReleaseMemAddress"),
            malloc_physical: sym!("aclrtMallocPhysical"),
            free_physical: sym!("aclrtFreePhysical"),
            map: sym!("aclrtMapMem"),
            unmap: sym!("aclrtUnmapMem"),
            granularity: sym!("aclrtMemGetAllocationGranularity"),
            recent: sym!("aclGetRecentErrMsg"),
        })
    }
}

pub(super) fn acl(api: &Api, r: i32, what: &str) -> Result<(), String> {
    if r == 0 {
        return Ok(());
    }
    // SAFETY: the library's NUL-terminated message of this thread.
    let m = unsafe { std::ffi::CStr::from_ptr((api.recent)()) };
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
    // The library reads its configuration from the environment at aclInit: the host backend
    // unless `HETMEM_BACKEND=cuda` is set (then the sleep-mode rows get the driver baseline).
    let cuda = std::env::var("HETMEM_BACKEND").is_ok_and(|b| b.trim().eq_ignore_ascii_case("cuda"));
    if cuda {
        std::env::set_var("HETMEM_BACKEND", "cuda");
    } else {
        std::env::set_var("HETMEM_BACKEND", "host");
        std::env::set_var("HETMEM_HOST_DEVICES", "1");
        // Room for the sleep-mode rows' 1 GiB (each side holds it in turn).
        std::env::set_var("HETMEM_HOST_DEVICE_MEMORY", "4G");
        std::env::remove_var("HETMEM_HOST_MAX_ALLOC");
    }
    println!("backend: {}", if cuda { "cuda" } else { "host" });
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

    let api = Api::shared().unwrap_or_else(Api::linked);
    println!("C entry points from {}", api.from);
    // SAFETY (every block below): the C entry points with valid out-pointers and arguments.
    let (s, am, va, ph) = unsafe {
        acl(&api, (api.init)(std::ptr::null()), "aclInit")?;
        acl(&api, (api.set_device)(0), "aclrtSetDevice")?;
        let mut s: *mut c_void = null_mut();
        acl(&api, (api.create_stream)(&mut s), "aclrtCreateStream")?;
        let mut am: *mut c_void = null_mut();
        acl(
            &api,
            (api.alloc_managed)(&mut am, PAGE as u64, 1),
            "aclrtMemAllocManaged",
        )?;
        acl(&api, (api.memset)(am, PAGE, 1, PAGE), "aclrtMemset")?;
        let mut va: *mut c_void = null_mut();
        acl(
            &api,
            (api.reserve)(&mut va, page, 0, null_mut(), 0),
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
            &api,
            (api.malloc_physical)(&mut ph, page, &prop, 0),
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
            baseline: "the same hetmem Rust call(s)",
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
                        (api.get_attr)(1, am, PAGE, &mut v as *mut i32 as *mut c_void, 4)
                    };
                    acl(&api, r, "aclrtMemManagedGetAttr")
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
                        &api,
                        (api.advise)(am, PAGE as u64, 4, host),
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
                        &api,
                        (api.prefetch)(am, PAGE, to, 0, s),
                        "aclrtMemManagedPrefetchAsync",
                    )?;
                    acl(&api, (api.sync_stream)(s), "aclrtSynchronizeStream")
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
                    acl(&api, (api.map)(va, page, 0, ph, 0), "aclrtMapMem")?;
                    acl(&api, (api.unmap)(va), "aclrtUnmapMem")
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

    acl(&api, (api.free_physical)(ph), "aclrtFreePhysical")?;
    acl(&api, (api.release)(va), "aclrtReleaseMemAddress")?;
    let sleep = super::acl_vmm::rows(&api, &ctx, &dev, cuda, iters.min(128), rounds, false)?;
    acl(&api, (api.free)(am), "aclrtFree")?;
    acl(&api, (api.destroy_stream)(s), "aclrtDestroyStream")?;
    acl(&api, (api.finalize)(), "aclFinalize")?;
    // The sleep-mode rows once more with one instance of everything: the C entry points of the
    // library linked into this executable, and the Rust calls on that library's own current
    // context (see `acl_vmm`'s docs: the rows above pit two copies of hetmem against each
    // other, each with its own state).
    let linked = Api::linked();
    // SAFETY: the C entry points with a null configuration path.
    acl(
        &linked,
        unsafe { (linked.init)(std::ptr::null()) },
        "aclInit",
    )?;
    acl(&linked, (linked.set_device)(0), "aclrtSetDevice")?;
    let own = ascendcl::state::fast_global()
        .and_then(|g| g.current().cloned())
        .map_err(|f| f.msg)?;
    let same = super::acl_vmm::rows(
        &linked,
        &own.ctx,
        &own.dev,
        cuda,
        iters.min(128),
        rounds,
        true,
    )?;
    drop(own);
    acl(&linked, (linked.finalize)(), "aclFinalize")?;
    ctx.free_reservation(r).map_err(e2s)?;
    ctx.destroy_physical_memory(phys).map_err(e2s)?;
    ctx.free_managed(m).map_err(e2s)?;
    for r in &rows {
        println!(
            "{}: {:.0} ns added per call (target <= 150 ns)",
            r.op,
            r.hetmem_ns - r.baseline_ns.unwrap_or(0.0)
        );
    }
    rows.extend(sleep);
    rows.extend(same);
    Ok(rows)
}
