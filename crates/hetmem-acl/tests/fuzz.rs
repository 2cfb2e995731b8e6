//! Fuzz of the C entry points (proptest, bounded): random sequences of calls with random
//! handles (live, destroyed, of another kind, made up, NULL), pointers (live, interior, freed,
//! reserved but unmapped, unmapped, NULL), sizes and enumeration values. Every call must answer
//! a documented code (never the internal-error code of a caught panic, never a crash), and after
//! each sequence `aclFinalize` releases everything: the devices' capacity is whole again and
//! ordinary calls work (no sticky error).
//!
//! Out-pointers are always valid or NULL and plain-memory copies stay inside their buffers:
//! those are the caller's side of the contract (the library cannot check them, as ACL cannot).

use std::ffi::c_void;

use ascendcl::managed::AclMemManagedLocation;
use ascendcl::vmm::AclPhysicalMemProp;
use ascendcl::*;
use proptest::prelude::*;

const MIB: usize = 1 << 20;

/// Every code a call may answer here.
const CODES: [i32; 9] = [
    0, 100_000, 100_001, 100_002, 107_000, 107_002, 107_008, 207_000, 207_001,
];

#[derive(Debug, Clone)]
enum Op {
    SetDevice(i32),
    ResetDevice(i32),
    CreateContext(i32),
    DestroyContext(u8),
    SetCurrentContext(u8),
    Malloc(usize, u32),
    MallocHost(usize),
    Free(u8, usize),
    FreeHost(u8),
    Memset(u8, usize, u8),
    Memcpy(u8, u8, usize, u32),
    AllocManaged(u64, u32),
    Advise(u8, usize, usize, u32, u32, i32),
    Prefetch(u8, usize, usize, u32, i32, u32, u8),
    GetAttr(u32, u8, usize, usize, usize),
    GetAttrs(u8, u8, usize),
    CreateStream,
    DestroyStream(u8),
    SyncStream(u8),
    MemsetAsync(u8, usize, u8),
    MemcpyAsync(u8, u8, usize, u8),
    CreateEvent,
    DestroyEvent(u8),
    Record(u8, u8),
    Wait(u8, u8),
    SyncEvent(u8),
    Query(u8),
    Reserve(usize, usize),
    Release(u8),
    MallocPhysical(usize, u32, u32, u32),
    FreePhysical(u8),
    Map(u8, usize, usize, u8),
    Unmap(u8),
    Export(u8, u32, u64),
    Import(u8, i32),
    Granularity(u32, u32),
    SyncDevice,
    GetLastError(u32),
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        1 => Just(0usize),
        1 => Just(1),
        1 => Just(4095),
        4 => Just(2 * MIB),
        1 => Just(3 * MIB),
        3 => Just(4 * MIB),
        1 => Just(usize::MAX),
        1 => Just(1usize << 50),
        2 => 0usize..(8 * MIB),
    ]
}

fn offset() -> impl Strategy<Value = usize> {
    prop_oneof![4 => Just(0usize), 1 => Just(2 * MIB), 1 => size()]
}

fn op() -> impl Strategy<Value = Op> {
    let small = || prop_oneof![Just(-1i32), 0i32..4, Just(i32::MAX)];
    let e = || prop_oneof![9 => 0u32..10, 1 => Just(u32::MAX), 1 => Just(0x100u32), 1 => Just(0x1000u32)];
    prop_oneof![
        small().prop_map(Op::SetDevice),
        small().prop_map(Op::ResetDevice),
        small().prop_map(Op::CreateContext),
        any::<u8>().prop_map(Op::DestroyContext),
        any::<u8>().prop_map(Op::SetCurrentContext),
        (size(), e()).prop_map(|(s, p)| Op::Malloc(s, p)),
        size().prop_map(Op::MallocHost),
        (any::<u8>(), 0usize..8192).prop_map(|(a, o)| Op::Free(a, o)),
        any::<u8>().prop_map(Op::FreeHost),
        (any::<u8>(), size(), any::<u8>()).prop_map(|(a, s, v)| Op::Memset(a, s, v)),
        (any::<u8>(), any::<u8>(), size(), e()).prop_map(|(a, b, s, k)| Op::Memcpy(a, b, s, k)),
        (
            prop_oneof![
                Just(0u64),
                Just(1),
                Just(4 << 20),
                Just(u64::MAX),
                0u64..(9 << 20)
            ],
            prop_oneof![Just(1u32), e()]
        )
            .prop_map(|(s, f)| Op::AllocManaged(s, f)),
        (any::<u8>(), offset(), size(), e(), e(), small())
            .prop_map(|(a, o, s, adv, t, id)| Op::Advise(a, o, s, adv, t, id)),
        (
            any::<u8>(),
            offset(),
            size(),
            e(),
            small(),
            prop_oneof![Just(0u32), e()],
            any::<u8>()
        )
            .prop_map(|(a, o, s, t, id, f, st)| Op::Prefetch(a, o, s, t, id, f, st)),
        (
            e(),
            any::<u8>(),
            offset(),
            size(),
            prop_oneof![3 => Just(4usize), 1 => 0usize..=64]
        )
            .prop_map(|(at, a, o, s, d)| Op::GetAttr(at, a, o, s, d)),
        (any::<u8>(), 0u8..10, size()).prop_map(|(a, n, s)| Op::GetAttrs(a, n, s)),
        Just(Op::CreateStream),
        any::<u8>().prop_map(Op::DestroyStream),
        any::<u8>().prop_map(Op::SyncStream),
        (any::<u8>(), size(), any::<u8>()).prop_map(|(a, s, st)| Op::MemsetAsync(a, s, st)),
        (any::<u8>(), any::<u8>(), size(), any::<u8>())
            .prop_map(|(a, b, s, st)| Op::MemcpyAsync(a, b, s, st)),
        Just(Op::CreateEvent),
        any::<u8>().prop_map(Op::DestroyEvent),
        (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Op::Record(a, b)),
        (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Op::Wait(a, b)),
        any::<u8>().prop_map(Op::SyncEvent),
        any::<u8>().prop_map(Op::Query),
        (
            size(),
            prop_oneof![Just(0usize), Just(3), Just(4096), Just(1 << 30)]
        )
            .prop_map(|(s, a)| Op::Reserve(s, a)),
        any::<u8>().prop_map(Op::Release),
        (size(), e(), e(), prop_oneof![Just(0u32), e()])
            .prop_map(|(s, t, id, f)| Op::MallocPhysical(s, t, id, f)),
        any::<u8>().prop_map(Op::FreePhysical),
        (any::<u8>(), size(), offset(), any::<u8>()).prop_map(|(v, s, o, h)| Op::Map(v, s, o, h)),
        any::<u8>().prop_map(Op::Unmap),
        (any::<u8>(), e(), prop_oneof![Just(0u64), Just(1), Just(7)])
            .prop_map(|(h, t, f)| Op::Export(h, t, f)),
        (any::<u8>(), small()).prop_map(|(h, d)| Op::Import(h, d)),
        (e(), e()).prop_map(|(o, d)| Op::Granularity(o, d)),
        Just(Op::SyncDevice),
        e().prop_map(Op::GetLastError),
    ]
}

/// What the sequence has made (and destroyed: kept to be passed again).
#[derive(Default)]
struct World {
    contexts: Vec<usize>,
    streams: Vec<usize>,
    events: Vec<usize>,
    phys: Vec<usize>,
    shareable: Vec<u64>,
    /// (pointer, size, kind: 0 device, 1 host, 2 managed, 3 reserved VA)
    mem: Vec<(usize, usize, u8)>,
    mappings: Vec<usize>,
}

impl World {
    fn handle(&self, list: &[usize], pick: u8, other: &[usize]) -> usize {
        match pick % 8 {
            0 => 0,
            1 => 0xdead_beef0,
            2 => other.first().copied().unwrap_or(0x1230),
            3 => pick as usize * 0x1000 + 1,
            _ if list.is_empty() => 0x77,
            _ => list[pick as usize % list.len()],
        }
    }
    /// A pointer for a call that checks its memory: live, interior, freed or made up.
    fn ptr(&self, pick: u8) -> usize {
        match pick % 8 {
            0 => 0,
            1 => 0x7ead_0000_0000, // nothing mapped there
            _ if self.mem.is_empty() => 0x10,
            3 | 4 => {
                // The latest managed allocation or reservation, if any (their calls need them).
                let want = if pick % 8 == 3 { 2 } else { 3 };
                self.mem
                    .iter()
                    .rev()
                    .find(|m| m.2 == want)
                    .map_or(0x20, |m| m.0)
            }
            n => {
                let (p, s, _) = self.mem[pick as usize % self.mem.len()];
                if n == 2 {
                    p + s / 2 // interior
                } else {
                    p
                }
            }
        }
    }
    /// A pointer for the managed calls: mostly the latest managed allocation.
    fn mptr(&self, pick: u8) -> usize {
        if pick.is_multiple_of(4) {
            return self.ptr(pick / 4);
        }
        self.mem
            .iter()
            .rev()
            .find(|m| m.2 == 2)
            .map_or(0x30, |m| m.0)
    }
    /// A pointer and a size that stays inside plain memory (managed and unmapped memory are
    /// checked by the library, so any size goes there).
    fn region(&self, pick: u8, want: usize) -> (usize, usize) {
        let p = self.ptr(pick);
        match self.mem.iter().find(|m| m.0 <= p && p < m.0 + m.1) {
            Some(&(b, s, kind)) if kind == 0 || kind == 1 => (p, want.min(b + s - p)),
            _ => (p, want),
        }
    }
}

fn loc(ty: u32, id: i32) -> AclMemManagedLocation {
    AclMemManagedLocation { ty, id }
}

fn prop_of(ty: u32, id: u32) -> AclPhysicalMemProp {
    AclPhysicalMemProp {
        handle_type: 0,
        allocation_type: 0,
        mem_attr: 0,
        location_id: id,
        location_type: ty % 3,
        reserve: 0,
    }
}

unsafe fn apply(w: &mut World, op: &Op) -> i32 {
    let mut out_ptr: *mut c_void = std::ptr::null_mut();
    match *op {
        Op::SetDevice(d) => setup::aclrtSetDevice(d),
        Op::ResetDevice(d) => {
            let r = setup::aclrtResetDevice(d);
            if r == 0 {
                w.forget_memory();
            }
            r
        }
        Op::CreateContext(d) => {
            let r = setup::aclrtCreateContext(&mut out_ptr, d);
            if r == 0 {
                w.contexts.push(out_ptr as usize);
            }
            r
        }
        Op::DestroyContext(p) => {
            let r = setup::aclrtDestroyContext(w.handle(&w.contexts, p, &w.streams) as *mut c_void);
            if r == 0 {
                w.forget_memory();
            }
            r
        }
        Op::SetCurrentContext(p) => {
            setup::aclrtSetCurrentContext(w.handle(&w.contexts, p, &w.events) as *mut c_void)
        }
        Op::Malloc(s, pol) => {
            let r = memory::aclrtMalloc(&mut out_ptr, s, pol);
            if r == 0 {
                w.mem.push((out_ptr as usize, s, 0));
            }
            r
        }
        Op::MallocHost(s) => {
            let s = s.min(64 * MIB);
            let r = memory::aclrtMallocHost(&mut out_ptr, s);
            if r == 0 {
                w.mem.push((out_ptr as usize, s, 1));
            }
            r
        }
        Op::Free(a, off) => {
            let p = if off % 3 == 0 {
                w.ptr(a) + off
            } else {
                w.ptr(a)
            };
            let r = memory::aclrtFree(p as *mut c_void);
            w.forget(r, p);
            r
        }
        Op::FreeHost(a) => {
            let p = w.ptr(a);
            let r = memory::aclrtFreeHost(p as *mut c_void);
            w.forget(r, p);
            r
        }
        Op::Memset(a, s, v) => {
            let (p, n) = w.region(a, s);
            memory::aclrtMemset(p as *mut c_void, n, v as i32, n)
        }
        Op::Memcpy(a, b, s, k) => {
            let (d, n) = w.region(a, s);
            let (src, n) = w.region(b, n);
            let (d, n) = w.region_for(d, n);
            memory::aclrtMemcpy(d as *mut c_void, n, src as *const c_void, n, k)
        }
        Op::AllocManaged(s, f) => {
            let r = managed::aclrtMemAllocManaged(&mut out_ptr, s, f);
            if r == 0 {
                w.mem.push((out_ptr as usize, s as usize, 2));
            }
            r
        }
        Op::Advise(a, o, s, adv, t, id) => managed::aclrtMemManagedAdvise(
            w.mptr(a).wrapping_add(o % (4 * MIB)) as *const c_void,
            s as u64,
            adv,
            loc(t, id),
        ),
        Op::Prefetch(a, o, s, t, id, f, st) => managed::aclrtMemManagedPrefetchAsync(
            w.mptr(a).wrapping_add(o % (4 * MIB)) as *const c_void,
            s,
            loc(t, id),
            f,
            w.handle(&w.streams, st, &w.contexts) as *mut c_void,
        ),
        Op::GetAttr(at, a, o, s, d) => {
            let mut buf = [0u8; 64];
            managed::aclrtMemManagedGetAttr(
                at,
                w.mptr(a).wrapping_add(o % (4 * MIB)) as *const c_void,
                s,
                buf.as_mut_ptr() as *mut c_void,
                d,
            )
        }
        Op::GetAttrs(a, n, s) => {
            let attrs: Vec<u32> = (1..=n as u32).collect();
            let mut bufs = vec![[0u8; 16]; n as usize];
            let ptrs: Vec<*mut c_void> = bufs
                .iter_mut()
                .map(|b| b.as_mut_ptr() as *mut c_void)
                .collect();
            let sizes: Vec<usize> = (0..n as usize).map(|i| 4 * (1 + i % 2)).collect();
            managed::aclrtMemManagedGetAttrs(
                attrs.as_ptr(),
                n as usize,
                w.mptr(a) as *const c_void,
                s,
                ptrs.as_ptr(),
                sizes.as_ptr(),
            )
        }
        Op::CreateStream => {
            let r = stream::aclrtCreateStream(&mut out_ptr);
            if r == 0 {
                w.streams.push(out_ptr as usize);
            }
            r
        }
        Op::DestroyStream(p) => {
            stream::aclrtDestroyStream(w.handle(&w.streams, p, &w.events) as *mut c_void)
        }
        Op::SyncStream(p) => {
            stream::aclrtSynchronizeStream(w.handle(&w.streams, p, &w.phys) as *mut c_void)
        }
        Op::MemsetAsync(a, s, st) => {
            let (p, n) = w.region(a, s);
            memory::aclrtMemsetAsync(
                p as *mut c_void,
                n,
                7,
                n,
                w.handle(&w.streams, st, &w.events) as *mut c_void,
            )
        }
        Op::MemcpyAsync(a, b, s, st) => {
            let (d, n) = w.region(a, s);
            let (src, n) = w.region(b, n);
            let (d, n) = w.region_for(d, n);
            memory::aclrtMemcpyAsync(
                d as *mut c_void,
                n,
                src as *const c_void,
                n,
                4,
                w.handle(&w.streams, st, &w.contexts) as *mut c_void,
            )
        }
        Op::CreateEvent => {
            let r = stream::aclrtCreateEvent(&mut out_ptr);
            if r == 0 {
                w.events.push(out_ptr as usize);
            }
            r
        }
        Op::DestroyEvent(p) => {
            stream::aclrtDestroyEvent(w.handle(&w.events, p, &w.streams) as *mut c_void)
        }
        Op::Record(e, s) => stream::aclrtRecordEvent(
            w.handle(&w.events, e, &w.streams) as *mut c_void,
            w.handle(&w.streams, s, &w.events) as *mut c_void,
        ),
        Op::Wait(s, e) => stream::aclrtStreamWaitEvent(
            w.handle(&w.streams, s, &w.events) as *mut c_void,
            w.handle(&w.events, e, &w.streams) as *mut c_void,
        ),
        Op::SyncEvent(e) => {
            stream::aclrtSynchronizeEvent(w.handle(&w.events, e, &w.phys) as *mut c_void)
        }
        Op::Query(e) => {
            let mut st = 0u32;
            stream::aclrtQueryEventStatus(
                w.handle(&w.events, e, &w.contexts) as *mut c_void,
                &mut st,
            )
        }
        Op::Reserve(s, a) => {
            let r = vmm::aclrtReserveMemAddress(&mut out_ptr, s, a, std::ptr::null_mut(), 0);
            if r == 0 {
                w.mem.push((out_ptr as usize, s, 3));
            }
            r
        }
        Op::Release(a) => {
            let p = w.ptr(a);
            let r = vmm::aclrtReleaseMemAddress(p as *mut c_void);
            w.forget(r, p);
            r
        }
        Op::MallocPhysical(s, t, id, f) => {
            let prop = prop_of(t, id);
            let r = vmm::aclrtMallocPhysical(&mut out_ptr, s, &prop, f as u64);
            if r == 0 {
                w.phys.push(out_ptr as usize);
            }
            r
        }
        Op::FreePhysical(h) => {
            vmm::aclrtFreePhysical(w.handle(&w.phys, h, &w.events) as *mut c_void)
        }
        Op::Map(v, s, o, h) => {
            let va = w.ptr(v);
            let r = vmm::aclrtMapMem(
                va as *mut c_void,
                s,
                o % (4 * MIB),
                w.handle(&w.phys, h, &w.streams) as *mut c_void,
                0,
            );
            if r == 0 {
                w.mappings.push(va);
            }
            r
        }
        Op::Unmap(v) => {
            let va = match w.mappings.get(v as usize % w.mappings.len().max(1)) {
                Some(&m) if v % 2 == 0 => m,
                _ => w.ptr(v),
            };
            vmm::aclrtUnmapMem(va as *mut c_void)
        }
        Op::Export(h, t, f) => {
            let mut s = 0u64;
            let r = vmm::aclrtMemExportToShareableHandle(
                w.handle(&w.phys, h, &w.events) as *mut c_void,
                t,
                f,
                &mut s,
            );
            if r == 0 {
                w.shareable.push(s);
            }
            r
        }
        Op::Import(h, d) => {
            let s = match w.shareable.get(h as usize % w.shareable.len().max(1)) {
                Some(&s) if h % 2 == 0 => s,
                _ => (h as u64) << 32 | 5,
            };
            let r = vmm::aclrtMemImportFromShareableHandle(s, d, &mut out_ptr);
            if r == 0 {
                w.phys.push(out_ptr as usize);
            }
            r
        }
        Op::Granularity(o, d) => {
            let prop = prop_of(1, d);
            let mut g = 0usize;
            vmm::aclrtMemGetAllocationGranularity(&prop, o, &mut g)
        }
        Op::SyncDevice => stream::aclrtSynchronizeDevice(),
        Op::GetLastError(l) => {
            let r = aclrtGetLastError(l);
            if CODES.contains(&r) {
                0
            } else {
                r
            }
        }
    }
}

impl World {
    /// Freed memory is never used again: its addresses may be reused by anything (a thread's
    /// stack), which a copy into it would corrupt. (The library refuses unmapped memory; it
    /// cannot know memory that someone else mapped there since.)
    fn forget(&mut self, r: i32, p: usize) {
        if r == 0 {
            self.mem.retain(|m| m.0 != p);
        }
    }
    fn forget_memory(&mut self) {
        self.mem.clear();
        self.mappings.clear();
    }
    /// Keeps a copy's destination inside plain memory too.
    fn region_for(&self, d: usize, n: usize) -> (usize, usize) {
        match self.mem.iter().find(|m| m.0 <= d && d < m.0 + m.1) {
            Some(&(b, s, kind)) if kind == 0 || kind == 1 => (d, n.min(b + s - d)),
            _ => (d, n),
        }
    }
}

/// Whether every device's memory is all free again (each device the runtime has: the two
/// modelled ones on the host backend, the machine's GPUs on cuda).
fn capacity_whole() -> bool {
    unsafe {
        let mut n = 0u32;
        assert_eq!(setup::aclrtGetDeviceCount(&mut n), 0);
        assert!(n >= 1);
        let mut whole = true;
        for d in 0..n as i32 {
            assert_eq!(setup::aclrtSetDevice(d), 0);
            let (mut f, mut t) = (0usize, 0usize);
            assert_eq!(memory::aclrtGetMemInfo(1, &mut f, &mut t), 0);
            whole &= f == t;
        }
        whole
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        max_shrink_iters: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Random sequences of entry-point calls: documented codes only, no crash, and
    /// `aclFinalize` leaves nothing behind.
    #[test]
    fn random_calls_answer_documented_codes_and_leave_nothing_behind(
        ops in proptest::collection::vec(op(), 1..60),
        first_device in prop_oneof![1 => Just(-1i32), 6 => 0i32..2],
    ) {
        std::env::set_var("HETMEM_HOST_DEVICES", "2");
        std::env::set_var("HETMEM_HOST_DEVICE_MEMORY", "128M");
        unsafe {
            let r = setup::aclInit(std::ptr::null());
            prop_assert!(r == 0 || r == ACL_ERROR_REPEAT_INITIALIZE);
            let _ = setup::aclrtSetDevice(first_device);
            let mut w = World::default();
            for op in &ops {
                let r = apply(&mut w, op);
                if std::env::var_os("FUZZ_TRACE").is_some() {
                    eprintln!("{op:?} -> {r}");
                }
                prop_assert!(
                    CODES.contains(&r),
                    "{:?} answered {} ({})",
                    op,
                    r,
                    std::ffi::CStr::from_ptr(aclGetRecentErrMsg()).to_string_lossy()
                );
            }
            prop_assert_eq!(setup::aclFinalize(), 0);
            // Everything went with aclFinalize; a fresh start sees whole devices and works.
            prop_assert_eq!(setup::aclInit(std::ptr::null()), 0);
            prop_assert!(capacity_whole());
            let mut p: *mut c_void = std::ptr::null_mut();
            prop_assert_eq!(memory::aclrtMalloc(&mut p, MIB, 0), 0);
            prop_assert_eq!(memory::aclrtFree(p), 0);
            prop_assert_eq!(setup::aclFinalize(), 0);
        }
    }
}
