//! `hetmem bench ze`: the cost of a Level Zero call made by a C program through the official
//! loader and `libze_hetmem.so`, against the same operation through hetmem's Rust API, in the
//! same run (rounds alternate).
//!
//! The loader (`libze_loader.so.1`) is opened with `dlopen` after `ZE_ENABLE_ALT_DRIVERS` is set
//! to the driver library: `$HETMEM_ZE_LIB`, else `libze_hetmem.so` next to this executable (or
//! in its `deps/`). The entry points are the loader's exports, exactly what a C program linked
//! with `-lze_loader` calls. Operations: map + unmap of 2 MiB, set-access of 2 MiB, get-access,
//! device allocate + free of 64 KiB, IPC get + open + close (+ put). Ratio: loader path time /
//! Rust time (lower is better); `<key>_added_ns` in `--json` is the difference per call
//! (target: at most 150 ns added per call).

use std::ffi::{c_void, CString};
use std::path::PathBuf;
use std::time::Instant;

use hetmem::{AccessAttribute, AllocDesc, PhysicalMemoryFlags};

use super::{alternate, e2s, json_extra, Args, Row, Unit};

type H = *mut c_void;
const M2: usize = 2 << 20;
const K64: usize = 64 << 10;

#[repr(C)]
#[derive(Clone, Copy)]
struct IpcHandle {
    data: [u8; 64],
}

/// The `ze*` entry points of the loader.
struct Ze {
    reserve: unsafe extern "C" fn(H, *const c_void, usize, *mut H) -> u32,
    phys_create: unsafe extern "C" fn(H, H, *const PhysDesc, *mut H) -> u32,
    map: unsafe extern "C" fn(H, *const c_void, usize, H, usize, u32) -> u32,
    unmap: unsafe extern "C" fn(H, *const c_void, usize) -> u32,
    set_access: unsafe extern "C" fn(H, *const c_void, usize, u32) -> u32,
    get_access: unsafe extern "C" fn(H, *const c_void, usize, *mut u32, *mut usize) -> u32,
    alloc_device: unsafe extern "C" fn(H, *const DevDesc, usize, usize, H, *mut H) -> u32,
    free: unsafe extern "C" fn(H, H) -> u32,
    ipc_get: unsafe extern "C" fn(H, *const c_void, *mut IpcHandle) -> u32,
    ipc_open: unsafe extern "C" fn(H, H, IpcHandle, u32, *mut H) -> u32,
    ipc_close: unsafe extern "C" fn(H, *const c_void) -> u32,
    ipc_put: unsafe extern "C" fn(H, IpcHandle) -> u32,
    ctx: H,
    dev: H,
}

#[repr(C)]
struct PhysDesc {
    stype: u32,
    next: *const c_void,
    flags: u32,
    size: usize,
}

#[repr(C)]
struct DevDesc {
    stype: u32,
    next: *const c_void,
    flags: u32,
    ordinal: u32,
}

fn driver_lib() -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var("HETMEM_ZE_LIB") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = exe.parent().ok_or("no exe dir")?;
    for p in [
        dir.join("libze_hetmem.so"),
        dir.join("deps/libze_hetmem.so"),
    ] {
        if p.exists() {
            return p.canonicalize().map_err(|e| e.to_string());
        }
    }
    Err(
        "libze_hetmem.so not found next to hetmem (cargo build --release -p hetmem-ze, or set \
         HETMEM_ZE_LIB)"
            .into(),
    )
}

fn ck(r: u32, what: &str) -> Result<(), String> {
    if r == 0 {
        Ok(())
    } else {
        Err(format!("{what} returned {r:#x}"))
    }
}

unsafe fn sym<T>(lib: *mut c_void, name: &str) -> Result<T, String> {
    let c = CString::new(name).unwrap();
    let p = libc::dlsym(lib, c.as_ptr());
    if p.is_null() {
        return Err(format!("{name} is not in libze_loader.so.1"));
    }
    Ok(std::mem::transmute_copy(&p))
}

unsafe fn load() -> Result<Ze, String> {
    let lib = driver_lib()?;
    std::env::set_var("ZE_ENABLE_ALT_DRIVERS", &lib);
    std::env::set_var("HETMEM_BACKEND", "host");
    std::env::set_var("HETMEM_HOST_DEVICES", "1");
    std::env::set_var("HETMEM_HOST_DEVICE_MEMORY", "2G");
    let name = CString::new("libze_loader.so.1").unwrap();
    let l = libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
    if l.is_null() {
        return Err("libze_loader.so.1 cannot be loaded (apt-get install libze1)".into());
    }
    let init: unsafe extern "C" fn(u32) -> u32 = sym(l, "zeInit")?;
    let driver_get: unsafe extern "C" fn(*mut u32, *mut H) -> u32 = sym(l, "zeDriverGet")?;
    let device_get: unsafe extern "C" fn(H, *mut u32, *mut H) -> u32 = sym(l, "zeDeviceGet")?;
    let ctx_create: unsafe extern "C" fn(H, *const [u64; 3], *mut H) -> u32 =
        sym(l, "zeContextCreate")?;
    let ext: unsafe extern "C" fn(H, *const libc::c_char, *mut *mut c_void) -> u32 =
        sym(l, "zeDriverGetExtensionFunctionAddress")?;
    ck(init(0), "zeInit")?;
    let (mut drv, mut dev, mut ctx): (H, H, H) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    let mut n = 1;
    ck(driver_get(&mut n, &mut drv), "zeDriverGet")?;
    n = 1;
    ck(device_get(drv, &mut n, &mut dev), "zeDeviceGet")?;
    let desc: [u64; 3] = [0xd, 0, 0]; // ze_context_desc_t {CONTEXT_DESC, NULL, 0}
    ck(ctx_create(drv, &desc, &mut ctx), "zeContextCreate")?;
    let put_name = CString::new("zeMemPutIpcHandle").unwrap();
    let mut put: *mut c_void = std::ptr::null_mut();
    ck(
        ext(drv, put_name.as_ptr(), &mut put),
        "zeDriverGetExtensionFunctionAddress",
    )?;
    Ok(Ze {
        reserve: sym(l, "zeVirtualMemReserve")?,
        phys_create: sym(l, "zePhysicalMemCreate")?,
        map: sym(l, "zeVirtualMemMap")?,
        unmap: sym(l, "zeVirtualMemUnmap")?,
        set_access: sym(l, "zeVirtualMemSetAccessAttribute")?,
        get_access: sym(l, "zeVirtualMemGetAccessAttribute")?,
        alloc_device: sym(l, "zeMemAllocDevice")?,
        free: sym(l, "zeMemFree")?,
        ipc_get: sym(l, "zeMemGetIpcHandle")?,
        ipc_open: sym(l, "zeMemOpenIpcHandle")?,
        ipc_close: sym(l, "zeMemCloseIpcHandle")?,
        ipc_put: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(H, IpcHandle) -> u32>(put),
        ctx,
        dev,
    })
}

fn per_op(iters: usize, mut f: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    let t = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    Ok(t.elapsed().as_nanos() as f64 / iters as f64)
}

fn row(op: &'static str, size: &'static str, key: &str, c: f64, rust: f64) -> Row {
    json_extra(&format!("{key}_added_ns"), c - rust);
    Row {
        op,
        size,
        key: key.to_string(),
        unit: Unit::Ns,
        hetmem_ns: c,
        baseline_ns: Some(rust),
        baseline: "the same call through hetmem's Rust API",
        target: Some("<= +150 ns"),
    }
}

pub fn bench(args: &Args) -> Result<Vec<Row>, String> {
    // SAFETY: the loader's entry points, called with valid arguments.
    let ze = unsafe { load()? };
    let (_rt, dev, ctx) = crate::common::one_device(2 << 30)?;
    let n = args.iters;
    let mut rows = Vec::new();
    unsafe {
        // One reservation and one 2 MiB physical object on each side.
        let mut cr: H = std::ptr::null_mut();
        ck(
            (ze.reserve)(ze.ctx, std::ptr::null(), 2 * M2, &mut cr),
            "reserve",
        )?;
        let pd = PhysDesc {
            stype: 0x20,
            next: std::ptr::null(),
            flags: 0,
            size: M2,
        };
        let mut cp: H = std::ptr::null_mut();
        ck(
            (ze.phys_create)(ze.ctx, ze.dev, &pd, &mut cp),
            "zePhysicalMemCreate",
        )?;
        let rr = ctx.reserve(None, 2 * M2).map_err(e2s)?;
        let rp = ctx
            .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, M2)
            .map_err(e2s)?;
        let rw = AccessAttribute::ReadWrite as u32;

        let (c, r) = alternate(
            args.rounds,
            || {
                per_op(n, || {
                    ck((ze.map)(ze.ctx, cr, M2, cp, 0, rw), "map")?;
                    ck((ze.unmap)(ze.ctx, cr, M2), "unmap")
                })
            },
            || {
                per_op(n, || {
                    ctx.map(rr.base, M2, rp, 0, AccessAttribute::ReadWrite)
                        .map_err(e2s)?;
                    ctx.unmap(rr.base, M2).map_err(e2s)
                })
            },
        )?;
        rows.push(row("map+unmap", "2MiB", "map_unmap_2mib", c, r));

        ck((ze.map)(ze.ctx, cr, M2, cp, 0, rw), "map")?;
        ctx.map(rr.base, M2, rp, 0, AccessAttribute::ReadWrite)
            .map_err(e2s)?;
        let mut flip = false;
        let mut flip2 = false;
        let (c, r) = alternate(
            args.rounds,
            || {
                per_op(n, || {
                    flip = !flip;
                    ck(
                        (ze.set_access)(ze.ctx, cr, M2, if flip { 2 } else { 1 }),
                        "set access",
                    )
                })
            },
            || {
                per_op(n, || {
                    flip2 = !flip2;
                    let a = if flip2 {
                        AccessAttribute::ReadOnly
                    } else {
                        AccessAttribute::ReadWrite
                    };
                    ctx.set_access_attribute(rr.base, M2, a).map_err(e2s)
                })
            },
        )?;
        rows.push(row("set-access", "2MiB", "set_access_2mib", c, r));

        let (c, r) = alternate(
            args.rounds,
            || {
                per_op(n, || {
                    let (mut a, mut s) = (0u32, 0usize);
                    ck(
                        (ze.get_access)(ze.ctx, cr, 2 * M2, &mut a, &mut s),
                        "get access",
                    )
                })
            },
            || {
                per_op(n, || {
                    ctx.get_access_attribute(rr.base, 2 * M2)
                        .map(|_| ())
                        .map_err(e2s)
                })
            },
        )?;
        rows.push(row("get-access", "4MiB", "get_access", c, r));

        let dd = DevDesc {
            stype: 0x15,
            next: std::ptr::null(),
            flags: 0,
            ordinal: 0,
        };
        let (c, r) = alternate(
            args.rounds,
            || {
                per_op(n, || {
                    let mut p: H = std::ptr::null_mut();
                    ck(
                        (ze.alloc_device)(ze.ctx, &dd, K64, 0, ze.dev, &mut p),
                        "alloc",
                    )?;
                    ck((ze.free)(ze.ctx, p), "free")
                })
            },
            || {
                per_op(n, || {
                    let p = ctx.alloc_device(&dev, &AllocDesc::new(K64)).map_err(e2s)?;
                    ctx.free_memory(p).map_err(e2s)
                })
            },
        )?;
        rows.push(row("alloc+free device", "64KiB", "alloc_free_64kib", c, r));

        let mut cbuf: H = std::ptr::null_mut();
        ck(
            (ze.alloc_device)(ze.ctx, &dd, K64, 0, ze.dev, &mut cbuf),
            "alloc",
        )?;
        let rbuf = ctx.alloc_device(&dev, &AllocDesc::new(K64)).map_err(e2s)?;
        let (c, r) = alternate(
            args.rounds,
            || {
                per_op(n, || {
                    let mut h = IpcHandle { data: [0; 64] };
                    ck((ze.ipc_get)(ze.ctx, cbuf, &mut h), "ipc get")?;
                    let mut v: H = std::ptr::null_mut();
                    ck((ze.ipc_open)(ze.ctx, ze.dev, h, 0, &mut v), "ipc open")?;
                    ck((ze.ipc_close)(ze.ctx, v), "ipc close")?;
                    ck((ze.ipc_put)(ze.ctx, h), "ipc put")
                })
            },
            || {
                per_op(n, || {
                    let h = ctx.get_ipc_handle(rbuf).map_err(e2s)?;
                    let v = ctx.open_ipc_handle(&h, 0).map_err(e2s)?;
                    ctx.close_ipc_handle(v).map_err(e2s)?;
                    ctx.put_ipc_handle(&h).map_err(e2s)
                })
            },
        )?;
        rows.push(row("ipc get+open+close+put", "64KiB", "ipc_64kib", c, r));
    }
    Ok(rows)
}
