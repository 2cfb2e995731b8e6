//! Fuzz of the C entry points (proptest): random sequences of calls with random handles (live,
//! destroyed, of the wrong kind, null, made up), sizes, flags, enum values and memory pointers.
//! Out-pointers are valid or null (a C caller's contract). Checked after every call: no panic
//! reached the boundary (`ZE_RESULT_ERROR_UNKNOWN` from the guard, or the panic hook), the
//! result is a `ze_result_t` the driver documents; at the end, after everything made was
//! destroyed, the driver's live handles, device capacity, the process's fds and mappings are
//! back where they started.
//!
//! Bounded here (`HETMEM_ZE_FUZZ_CASES`, default 300 sequences of up to 60 calls); run longer
//! by hand with a larger value. The number of calls made is printed.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use proptest::prelude::*;
use ze_hetmem::api::*;
use ze_hetmem::types::*;

type H = *mut c_void;

static PANICKED: AtomicBool = AtomicBool::new(false);
static CALLS: AtomicU64 = AtomicU64::new(0);

const KNOWN: &[u32] = &[
    0,
    1,
    0x7000_0002,
    0x7000_0003,
    0x7800_0001,
    0x7800_0002,
    0x7800_0003,
    0x7800_0004,
    0x7800_0005,
    0x7800_0006,
    0x7800_0007,
    0x7800_0008,
    0x7800_0009,
    0x7800_000a,
    0x7800_000c,
    0x7800_000d,
    0x7800_0021,
    0x7fff_fffe, // ERROR_UNKNOWN: documented for zeMemGetAddressRange of unknown memory
];

#[derive(Debug, Clone)]
enum Op {
    AllocHost(u8, u8),
    AllocDevice(u8, u8, u8, u8),
    AllocShared(u8, u8),
    Free(u8, u8),
    FreeExt(u8, u8, u8, u32),
    Props(u8, u8),
    Range(u8, u8),
    IpcGetOpenClose(u8, u8),
    Reserve(u8, u8),
    VFree(u8, u8, u8),
    PhysCreate(u8, u8, u32),
    PhysDestroy(u8, u8),
    Map(u8, u8, u8, u8, u32),
    Unmap(u8, u8, u8),
    SetAccess(u8, u8, u8, u32),
    GetAccess(u8, u8, u8),
    ContextCreate,
    ContextDestroy(u8),
    QueueCreate(u8, u8, u32),
    ListCreate(u8, u8, bool),
    Copy(u8, u8, u8, u8),
    Fill(u8, u8, u8, u8),
    Close(u8),
    Execute(u8, u8),
    Sync(u8),
    Destroy(u8),
    PoolEvent(u8, u32),
    EventCall(u8, u8),
}

fn op() -> impl Strategy<Value = Op> {
    let b = any::<u8>;
    prop_oneof![
        (b(), b()).prop_map(|(a, c)| Op::AllocHost(a, c)),
        (b(), b(), b(), b()).prop_map(|(a, c, d, e)| Op::AllocDevice(a, c, d, e)),
        (b(), b()).prop_map(|(a, c)| Op::AllocShared(a, c)),
        (b(), b()).prop_map(|(a, c)| Op::Free(a, c)),
        (b(), b(), b(), any::<u32>()).prop_map(|(a, c, d, e)| Op::FreeExt(a, c, d, e)),
        (b(), b()).prop_map(|(a, c)| Op::Props(a, c)),
        (b(), b()).prop_map(|(a, c)| Op::Range(a, c)),
        (b(), b()).prop_map(|(a, c)| Op::IpcGetOpenClose(a, c)),
        (b(), b()).prop_map(|(a, c)| Op::Reserve(a, c)),
        (b(), b(), b()).prop_map(|(a, c, d)| Op::VFree(a, c, d)),
        (b(), b(), any::<u32>()).prop_map(|(a, c, d)| Op::PhysCreate(a, c, d)),
        (b(), b()).prop_map(|(a, c)| Op::PhysDestroy(a, c)),
        (b(), b(), b(), b(), 0u32..5).prop_map(|(a, c, d, e, f)| Op::Map(a, c, d, e, f)),
        (b(), b(), b()).prop_map(|(a, c, d)| Op::Unmap(a, c, d)),
        (b(), b(), b(), 0u32..5).prop_map(|(a, c, d, e)| Op::SetAccess(a, c, d, e)),
        (b(), b(), b()).prop_map(|(a, c, d)| Op::GetAccess(a, c, d)),
        Just(Op::ContextCreate),
        b().prop_map(Op::ContextDestroy),
        (b(), b(), 0u32..4).prop_map(|(a, c, d)| Op::QueueCreate(a, c, d)),
        (b(), b(), any::<bool>()).prop_map(|(a, c, d)| Op::ListCreate(a, c, d)),
        (b(), b(), b(), b()).prop_map(|(a, c, d, e)| Op::Copy(a, c, d, e)),
        (b(), b(), b(), b()).prop_map(|(a, c, d, e)| Op::Fill(a, c, d, e)),
        b().prop_map(Op::Close),
        (b(), b()).prop_map(|(a, c)| Op::Execute(a, c)),
        b().prop_map(Op::Sync),
        b().prop_map(Op::Destroy),
        (b(), 0u32..6).prop_map(|(a, c)| Op::PoolEvent(a, c)),
        (b(), b()).prop_map(|(a, c)| Op::EventCall(a, c)),
    ]
}

/// Everything made so far (live or not: destroyed ones stay to be reused as stale handles).
#[derive(Default)]
struct Pools {
    ctx: Vec<H>,
    dev: Vec<H>,
    ptr: Vec<usize>,
    phys: Vec<H>,
    queue: Vec<H>,
    list: Vec<H>,
    pool: Vec<H>,
    event: Vec<H>,
}

const BOGUS: usize = 0x7777_0000_0000_1234;

fn pick<T: Copy>(v: &[T], i: u8, null: T, bogus: T) -> T {
    match i % 8 {
        0 => null,
        1 => bogus,
        _ if v.is_empty() => null,
        _ => v[i as usize % v.len()],
    }
}

fn size(i: u8) -> usize {
    [0, 1, 4096, 65536, 2 << 20, 4 << 20, 12345, usize::MAX / 2][i as usize % 8]
}

fn check(r: u32, what: &str) {
    CALLS.fetch_add(1, Ordering::Relaxed);
    assert!(!PANICKED.load(Ordering::SeqCst), "a panic reached {what}");
    assert!(KNOWN.contains(&r), "{what} returned {r:#x}");
}

unsafe fn run(p: &mut Pools, op: &Op) {
    let ctx = |i: u8, p: &Pools| pick(&p.ctx, i, std::ptr::null_mut(), BOGUS as H);
    let dev = |i: u8, p: &Pools| pick(&p.dev, i, std::ptr::null_mut(), BOGUS as H);
    let ptr = |i: u8, p: &Pools| {
        let base = pick(&p.ptr, i, 0, BOGUS);
        if i % 16 == 15 {
            base.wrapping_add(4096)
        } else {
            base
        }
    };
    let mut out: H = std::ptr::null_mut();
    let hd = ze_host_mem_alloc_desc_t {
        stype: ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC,
        pNext: std::ptr::null(),
        flags: 0,
    };
    let dd = |flags: u32| ze_device_mem_alloc_desc_t {
        stype: ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC,
        pNext: std::ptr::null(),
        flags,
        ordinal: 0,
    };
    match *op {
        Op::AllocHost(c, s) => {
            let r = zeMemAllocHost(ctx(c, p), &hd, size(s), 0, &mut out);
            check(r, "zeMemAllocHost");
            if r == 0 {
                p.ptr.push(out as usize);
            }
        }
        Op::AllocDevice(c, d, s, f) => {
            let desc = dd(f as u32 % 10);
            let r = zeMemAllocDevice(
                ctx(c, p),
                &desc,
                size(s),
                [0, 3, 4096][f as usize % 3],
                dev(d, p),
                &mut out,
            );
            check(r, "zeMemAllocDevice");
            if r == 0 {
                p.ptr.push(out as usize);
            }
        }
        Op::AllocShared(c, s) => {
            let desc = dd(0);
            let r = zeMemAllocShared(ctx(c, p), &desc, &hd, size(s), 0, dev(s, p), &mut out);
            check(r, "zeMemAllocShared");
            if r == 0 {
                p.ptr.push(out as usize);
            }
        }
        Op::Free(c, i) => check(zeMemFree(ctx(c, p), ptr(i, p) as H), "zeMemFree"),
        Op::FreeExt(c, i, st, pol) => {
            let d = ze_memory_free_ext_desc_t {
                stype: if st % 4 == 0 {
                    0x12345
                } else {
                    ZE_STRUCTURE_TYPE_MEMORY_FREE_EXT_DESC
                },
                pNext: std::ptr::null(),
                freePolicy: pol % 6,
            };
            let dp = if st % 7 == 0 {
                std::ptr::null()
            } else {
                &d as *const _
            };
            check(zeMemFreeExt(ctx(c, p), dp, ptr(i, p) as H), "zeMemFreeExt")
        }
        Op::Props(c, i) => {
            let mut pr = std::mem::zeroed::<ze_memory_allocation_properties_t>();
            let mut d: H = std::ptr::null_mut();
            check(
                zeMemGetAllocProperties(ctx(c, p), ptr(i, p) as *const c_void, &mut pr, &mut d),
                "props",
            )
        }
        Op::Range(c, i) => {
            let mut b: H = std::ptr::null_mut();
            let mut s = 0usize;
            check(
                zeMemGetAddressRange(ctx(c, p), ptr(i, p) as *const c_void, &mut b, &mut s),
                "range",
            )
        }
        Op::IpcGetOpenClose(c, i) => {
            let mut h = ze_ipc_mem_handle_t { data: [0; 64] };
            let r = zeMemGetIpcHandle(ctx(c, p), ptr(i, p) as *const c_void, &mut h);
            check(r, "zeMemGetIpcHandle");
            if i % 3 == 0 {
                h.data[30] ^= 1; // forged
            }
            let d = p.dev.first().copied().unwrap_or(std::ptr::null_mut());
            let r2 = zeMemOpenIpcHandle(ctx(c, p), d, h, 0, &mut out);
            check(r2, "zeMemOpenIpcHandle");
            if r2 == 0 {
                check(zeMemCloseIpcHandle(ctx(c, p), out), "zeMemCloseIpcHandle");
            }
            if r == 0 {
                check(zeMemPutIpcHandle(ctx(c, p), h), "zeMemPutIpcHandle");
            }
        }
        Op::Reserve(c, s) => {
            let r = zeVirtualMemReserve(ctx(c, p), std::ptr::null(), size(s), &mut out);
            check(r, "zeVirtualMemReserve");
            if r == 0 {
                p.ptr.push(out as usize);
            }
        }
        Op::VFree(c, i, s) => check(
            zeVirtualMemFree(ctx(c, p), ptr(i, p) as *const c_void, size(s)),
            "vfree",
        ),
        Op::PhysCreate(c, s, f) => {
            let d = ze_physical_mem_desc_t {
                stype: ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC,
                pNext: std::ptr::null(),
                flags: f % 5,
                size: size(s),
            };
            let r = zePhysicalMemCreate(ctx(c, p), dev(s, p), &d, &mut out);
            check(r, "zePhysicalMemCreate");
            if r == 0 {
                p.phys.push(out);
            }
        }
        Op::PhysDestroy(c, i) => {
            let ph = pick(&p.phys, i, std::ptr::null_mut(), BOGUS as H);
            check(zePhysicalMemDestroy(ctx(c, p), ph), "zePhysicalMemDestroy")
        }
        Op::Map(c, i, s, ph, a) => {
            let h = pick(&p.phys, ph, std::ptr::null_mut(), BOGUS as H);
            check(
                zeVirtualMemMap(ctx(c, p), ptr(i, p) as *const c_void, size(s), h, 0, a),
                "map",
            )
        }
        Op::Unmap(c, i, s) => check(
            zeVirtualMemUnmap(ctx(c, p), ptr(i, p) as *const c_void, size(s)),
            "unmap",
        ),
        Op::SetAccess(c, i, s, a) => check(
            zeVirtualMemSetAccessAttribute(ctx(c, p), ptr(i, p) as *const c_void, size(s), a),
            "set access",
        ),
        Op::GetAccess(c, i, s) => {
            let mut a = 0u32;
            let mut o = 0usize;
            check(
                zeVirtualMemGetAccessAttribute(
                    ctx(c, p),
                    ptr(i, p) as *const c_void,
                    size(s),
                    &mut a,
                    &mut o,
                ),
                "get access",
            )
        }
        Op::ContextCreate => {
            let mut drv: H = std::ptr::null_mut();
            let mut n = 1u32;
            check(zeDriverGet(&mut n, &mut drv), "zeDriverGet");
            let d = ze_context_desc_t {
                stype: ZE_STRUCTURE_TYPE_CONTEXT_DESC,
                pNext: std::ptr::null(),
                flags: 0,
            };
            let r = zeContextCreate(drv, &d, &mut out);
            check(r, "zeContextCreate");
            if r == 0 {
                p.ctx.push(out);
            }
        }
        Op::ContextDestroy(c) => check(zeContextDestroy(ctx(c, p)), "zeContextDestroy"),
        Op::QueueCreate(c, d, mode) => {
            let desc = ze_command_queue_desc_t {
                stype: ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                pNext: std::ptr::null(),
                ordinal: 0,
                index: 0,
                flags: 0,
                mode,
                priority: 0,
            };
            let r = zeCommandQueueCreate(ctx(c, p), dev(d, p), &desc, &mut out);
            check(r, "zeCommandQueueCreate");
            if r == 0 {
                p.queue.push(out);
            }
        }
        Op::ListCreate(c, d, immediate) => {
            let r = if immediate {
                let desc = ze_command_queue_desc_t {
                    stype: ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                    pNext: std::ptr::null(),
                    ordinal: 0,
                    index: 0,
                    flags: 0,
                    mode: (d % 3) as u32,
                    priority: 0,
                };
                zeCommandListCreateImmediate(ctx(c, p), dev(d, p), &desc, &mut out)
            } else {
                let desc = ze_command_list_desc_t {
                    stype: ZE_STRUCTURE_TYPE_COMMAND_LIST_DESC,
                    pNext: std::ptr::null(),
                    commandQueueGroupOrdinal: 0,
                    flags: 0,
                };
                zeCommandListCreate(ctx(c, p), dev(d, p), &desc, &mut out)
            };
            check(r, "command list create");
            if r == 0 {
                p.list.push(out);
            }
        }
        Op::Copy(l, a, b, s) => {
            let lh = pick(&p.list, l, std::ptr::null_mut(), BOGUS as H);
            let r = zeCommandListAppendMemoryCopy(
                lh,
                ptr(a, p) as H,
                ptr(b, p) as *const c_void,
                size(s).min(4096),
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
            );
            check(r, "copy")
        }
        Op::Fill(l, a, ps, s) => {
            let lh = pick(&p.list, l, std::ptr::null_mut(), BOGUS as H);
            let pat = [0xabu8; 256];
            let r = zeCommandListAppendMemoryFill(
                lh,
                ptr(a, p) as H,
                pat.as_ptr().cast(),
                [0usize, 1, 3, 4, 128, 256, usize::MAX][ps as usize % 7],
                size(s).min(4096),
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
            );
            check(r, "fill")
        }
        Op::Close(l) => check(
            zeCommandListClose(pick(&p.list, l, std::ptr::null_mut(), BOGUS as H)),
            "close",
        ),
        Op::Execute(q, l) => {
            let qh = pick(&p.queue, q, std::ptr::null_mut(), BOGUS as H);
            let mut lh = pick(&p.list, l, std::ptr::null_mut(), BOGUS as H);
            check(
                zeCommandQueueExecuteCommandLists(qh, 1, &mut lh, std::ptr::null_mut()),
                "execute",
            )
        }
        Op::Sync(q) => {
            let qh = pick(&p.queue, q, std::ptr::null_mut(), BOGUS as H);
            check(zeCommandQueueSynchronize(qh, 2_000_000_000), "sync");
            let lh = pick(&p.list, q, std::ptr::null_mut(), BOGUS as H);
            check(zeCommandListHostSynchronize(lh, 2_000_000_000), "list sync")
        }
        Op::Destroy(i) => match i % 4 {
            0 => check(
                zeCommandQueueDestroy(pick(&p.queue, i / 4, std::ptr::null_mut(), BOGUS as H)),
                "queue destroy",
            ),
            1 => check(
                zeCommandListDestroy(pick(&p.list, i / 4, std::ptr::null_mut(), BOGUS as H)),
                "list destroy",
            ),
            2 => check(
                zeEventDestroy(pick(&p.event, i / 4, std::ptr::null_mut(), BOGUS as H)),
                "event destroy",
            ),
            _ => check(
                zeEventPoolDestroy(pick(&p.pool, i / 4, std::ptr::null_mut(), BOGUS as H)),
                "pool destroy",
            ),
        },
        Op::PoolEvent(c, idx) => {
            let d = ze_event_pool_desc_t {
                stype: ZE_STRUCTURE_TYPE_EVENT_POOL_DESC,
                pNext: std::ptr::null(),
                flags: 1,
                count: 4,
            };
            let r = zeEventPoolCreate(ctx(c, p), &d, 0, std::ptr::null_mut(), &mut out);
            check(r, "pool create");
            if r == 0 {
                p.pool.push(out);
            }
            let ph = pick(&p.pool, c, std::ptr::null_mut(), BOGUS as H);
            let ed = ze_event_desc_t {
                stype: ZE_STRUCTURE_TYPE_EVENT_DESC,
                pNext: std::ptr::null(),
                index: idx,
                signal: 0,
                wait: 0,
            };
            let r = zeEventCreate(ph, &ed, &mut out);
            check(r, "event create");
            if r == 0 {
                p.event.push(out);
            }
        }
        Op::EventCall(e, k) => {
            let eh = pick(&p.event, e, std::ptr::null_mut(), BOGUS as H);
            let r = match k % 4 {
                0 => zeEventHostSignal(eh),
                1 => zeEventHostReset(eh),
                2 => zeEventQueryStatus(eh),
                _ => zeEventHostSynchronize(eh, 1000),
            };
            check(r, "event op")
        }
    }
}

fn count_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// What each open fd refers to, for a failure message: its link, and for a Unix socket its
/// line of `/proc/self/net/unix` (which names a bound or connected path).
fn fd_targets() -> Vec<String> {
    let unix = std::fs::read_to_string("/proc/self/net/unix").unwrap_or_default();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| {
            let t = std::fs::read_link(e.path())
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let inode = t
                .strip_prefix("socket:[")
                .and_then(|x| x.strip_suffix(']'))
                .map(str::to_string);
            let line = inode.and_then(|i| {
                unix.lines()
                    .find(|l| l.split_whitespace().nth(6) == Some(i.as_str()))
                    .map(|l| format!(" ({})", l.split_whitespace().collect::<Vec<_>>().join(" ")))
            });
            format!(
                "{}: {t}{}",
                e.file_name().to_string_lossy(),
                line.unwrap_or_default()
            )
        })
        .collect()
}

#[test]
fn random_calls_never_crash_panic_or_leak() {
    // The suite's backend (HETMEM_BACKEND, the host backend by default); on the host backend
    // two modelled devices of 256 MiB.
    let backend = std::env::var("HETMEM_BACKEND").unwrap_or_else(|_| "host".into());
    if backend == "host" {
        std::env::set_var("HETMEM_HOST_DEVICES", "2");
        std::env::set_var("HETMEM_HOST_DEVICE_MEMORY", "256M");
        std::env::remove_var("HETMEM_HOST_MAX_ALLOC");
    }
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |i| {
        PANICKED.store(true, Ordering::SeqCst);
        prev(i)
    }));
    unsafe {
        assert_eq!(zeInit(0), 0);
        let mut drv: H = std::ptr::null_mut();
        let mut n = 1u32;
        assert_eq!(zeDriverGet(&mut n, &mut drv), 0);
        let mut nd = 0u32;
        assert_eq!(zeDeviceGet(drv, &mut nd, std::ptr::null_mut()), 0);
        assert!(nd >= 1);
        let mut devs = vec![std::ptr::null_mut(); nd as usize];
        assert_eq!(zeDeviceGet(drv, &mut nd, devs.as_mut_ptr()), 0);
        // Warm-up: the first export starts the process's IPC broker (one socket for the life
        // of the process), which is not a leak.
        {
            let mut p = Pools {
                dev: devs.to_vec(),
                ..Pools::default()
            };
            run(&mut p, &Op::ContextCreate);
            run(&mut p, &Op::AllocHost(2, 2));
            run(&mut p, &Op::IpcGetOpenClose(2, 2));
            // Every other kind of call once as well: a GPU driver opens some descriptors of
            // its own on a process's first use of a feature (device or shared memory, an
            // export of device memory, streams and events) and keeps them.
            for o in [
                Op::AllocDevice(1, 1, 1, 1),
                Op::AllocShared(1, 1),
                Op::IpcGetOpenClose(1, 1),
                Op::Reserve(1, 1),
                Op::PhysCreate(1, 1, 0),
                Op::Map(1, 1, 1, 1, 0),
                Op::QueueCreate(1, 1, 0),
                Op::ListCreate(1, 1, true),
                Op::Copy(1, 1, 1, 1),
                Op::Fill(1, 1, 1, 1),
                Op::ListCreate(1, 1, false),
                Op::Copy(1, 1, 1, 1),
                Op::Close(1),
                Op::Execute(1, 1),
                Op::Sync(1),
                Op::PoolEvent(1, 0),
                Op::EventCall(1, 1),
            ] {
                run(&mut p, &o);
            }
            // And one export that surely succeeds on every backend (device memory: host memory
            // has no shareable handle on cuda), so the broker runs before the count.
            let dd = ze_device_mem_alloc_desc_t {
                stype: ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC,
                pNext: std::ptr::null(),
                flags: 0,
                ordinal: 0,
            };
            let mut a: H = std::ptr::null_mut();
            assert_eq!(zeMemAllocDevice(p.ctx[0], &dd, 4096, 0, devs[0], &mut a), 0);
            let mut ih = ze_ipc_mem_handle_t {
                data: [0; ZE_MAX_IPC_HANDLE_SIZE],
            };
            assert_eq!(zeMemGetIpcHandle(p.ctx[0], a, &mut ih), 0);
            assert_eq!(zeMemPutIpcHandle(p.ctx[0], ih), 0);
            assert_eq!(zeMemFree(p.ctx[0], a), 0);
            for c in p.ctx.clone() {
                let _ = zeContextDestroy(c);
            }
        }
        let live0 = ze_hetmem::rt::live_handles();
        let fds0 = count_fds();
        let cases: u32 = std::env::var("HETMEM_ZE_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(300);
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases,
            failure_persistence: None,
            ..ProptestConfig::default()
        });
        runner
            .run(&prop::collection::vec(op(), 1..60), |ops| {
                let mut p = Pools {
                    dev: devs.to_vec(),
                    ..Pools::default()
                };
                // Each sequence starts with a context so that calls reach the semantics.
                run(&mut p, &Op::ContextCreate);
                for o in &ops {
                    run(&mut p, o);
                }
                // Destroy every context: everything made in them goes.
                for c in p.ctx.clone() {
                    let _ = zeContextDestroy(c);
                }
                prop_assert_eq!(ze_hetmem::rt::live_handles(), live0, "live handles leaked");
                Ok(())
            })
            .unwrap();
        let calls = CALLS.load(Ordering::Relaxed);
        println!("fuzz: {cases} sequences, {calls} calls into the C entry points");
        assert!(!PANICKED.load(Ordering::SeqCst));
        // The IPC broker's server side closes a connection on its own thread, after the
        // client has its answer (broker-only on cuda): give it a moment to settle.
        let settle = std::time::Instant::now();
        while count_fds() != fds0 && settle.elapsed() < std::time::Duration::from_secs(2) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(
            count_fds(),
            fds0,
            "fds leaked; open now: {:?}",
            fd_targets()
        );
        // Device capacity is all back: two maximal allocations (half a device each) fill each
        // device.
        let ctx = {
            let d = ze_context_desc_t {
                stype: ZE_STRUCTURE_TYPE_CONTEXT_DESC,
                pNext: std::ptr::null(),
                flags: 0,
            };
            let mut c: H = std::ptr::null_mut();
            assert_eq!(zeContextCreate(drv, &d, &mut c), 0);
            c
        };
        let dd = ze_device_mem_alloc_desc_t {
            stype: ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC,
            pNext: std::ptr::null(),
            flags: 0,
            ordinal: 0,
        };
        for (i, &d) in devs.iter().enumerate() {
            let mut mp: ze_device_memory_properties_t = std::mem::zeroed();
            mp.stype = ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES;
            let mut n = 1u32;
            assert_eq!(zeDeviceGetMemoryProperties(d, &mut n, &mut mp), 0);
            let total = mp.totalSize;
            if total > 1 << 30 {
                // Past the test harness's capture, so the line shows in a passing run too.
                let _ = std::io::Write::write_fmt(
                    &mut std::io::stderr(),
                    format_args!(
                        "NOT APPLICABLE ({backend}) random_calls_never_crash_panic_or_leak \
                         [part]: device {i}'s capacity all back (two allocations of half of \
                         it): device memory is {:.1} GiB, filling it is not done in a test \
                         (needs <= 1 GiB)\n",
                        total as f64 / (1u64 << 30) as f64
                    ),
                );
                continue;
            }
            let half = (total / 2) as usize;
            let (mut a, mut b): (H, H) = (std::ptr::null_mut(), std::ptr::null_mut());
            assert_eq!(zeMemAllocDevice(ctx, &dd, half, 0, d, &mut a), 0);
            assert_eq!(zeMemAllocDevice(ctx, &dd, half, 0, d, &mut b), 0);
        }
        assert_eq!(zeContextDestroy(ctx), 0);
    }
}
