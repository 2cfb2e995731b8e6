//! `hetmem bench acl`, the sleep-mode rows: the virtual-memory path an LLM server's sleep-mode
//! allocator takes through ACL, one step at a time: `aclrtReserveMemAddress`,
//! `aclrtMallocPhysical`, `aclrtMapMem` (sleep: `aclrtUnmapMem`, `aclrtFreePhysical`), and at the
//! end `aclrtReleaseMemAddress`. Two shapes:
//!
//! - **2 MiB**: `n` allocations of one granule each (a reservation, a physical object and a
//!   mapping apiece); each step's figure is ns per allocation (one call).
//! - **1 GiB of 32 MiB chunks**: one reservation of 1 GiB holding 32 physical objects of 32 MiB,
//!   each mapped whole; each step's figure is ns per 1 GiB (1 call for reserve and release, 32
//!   for the others).
//!
//! Every round runs the same work through the library's C entry points and through hetmem's
//! Rust API (the same calls the library makes) **call by call, interleaved**: call `i` of a
//! step through C, then call `i` through Rust (the other way round for odd `i` and odd
//! rounds), each call timed alone, so both sides meet the same driver and kernel state (the
//! other side's objects of the step live beside their own). Timing each side as one block of
//! calls instead made the C side look 300-500 ns slower per reserve, unmap and release on an
//! H200; where the blocks ran in turn, each side met the driver state the other had left. What
//! the C entry points add is their own work beyond the Rust calls: the thread's current
//! context, the property and size checks, the handle registry (a `perf` profile of a tight
//! `aclrtReserveMemAddress` + `aclrtReleaseMemAddress` loop on the host backend, 2026-12-03,
//! put the library's own symbols at about 7.5% of a 3.3 us pair, about 125 ns a call, which
//! the paired medians of the 2 MiB reserve row agree with). On the cuda backend the bare
//! CUDA driver calls (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap` + `cuMemSetAccess`,
//! `cuMemUnmap`, `cuMemRelease`, `cuMemAddressFree`: what hetmem's cuda backend calls for
//! these steps) run too, as one block per step in their own turn; the median round counts.
//!
//! Rows: `acl_vmm_<step>_<shape>` (C over Rust, medians of the rounds; target: at most 150 ns
//! added per C call, its JSON fields `<key>_added_ns_per_call`: over every counted call, its
//! paired difference (the C call's time minus the Rust call's beside it), the median of those
//! where C went first and of those where Rust went first, averaged; and
//! `<key>_added_noise_ns_per_call`, the half-width of those medians' 95% confidence intervals,
//! combined)
//! and, on cuda, `acl_vmm_<step>_<shape>_vs_driver` (C
//! over the bare driver calls).
//!
//! The C side runs `libascendcl.so`, which holds a copy of hetmem of its own, and the Rust
//! side this executable's copy, each with its own runtime: a call of one side meets caches that
//! the other side's call (other code, other state) has just filled. A C program has one copy.
//! So the same rows run once more with one instance of everything,
//! `acl_vmm_<step>_<shape>_same_instance`: the C entry points of the library linked into this
//! executable (no `dlopen`), and the Rust calls made on that library's own current context
//! (the hetmem context its C calls use), so that the two sides differ only by the library's
//! own work (the entry point, its checks, the thread's current context, the handle registry).

use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::Instant;

use cudarc::driver::sys;
use hetmem::{AccessAttribute, Context, Device, PhysicalMemory, PhysicalMemoryFlags, Reservation};

use super::acl::{acl, Api};
use super::cuda::{ok, rw, RW};
use super::{e2s, json_extra, median, Row, Unit};
use ascendcl::vmm::AclPhysicalMemProp;

/// The target of every C-over-Rust row.
pub const TARGET: &str = "<= 150 ns/call added";
/// Bytes per chunk of the 1 GiB shape.
const CHUNK: usize = 32 << 20;
/// Bytes of the large shape.
const GIB: usize = 1 << 30;

/// The six steps: the C entry point, the key part, the driver calls of the baseline.
const STEPS: [(&str, &str, &str); 6] = [
    ("aclrtReserveMemAddress", "reserve", "cuMemAddressReserve"),
    ("aclrtMallocPhysical", "malloc_physical", "cuMemCreate"),
    ("aclrtMapMem", "map", "cuMemMap + cuMemSetAccess"),
    ("aclrtUnmapMem", "unmap", "cuMemUnmap"),
    ("aclrtFreePhysical", "free_physical", "cuMemRelease"),
    ("aclrtReleaseMemAddress", "release", "cuMemAddressFree"),
];

/// One way of doing the six steps.
trait Side {
    type Va;
    type Ph;
    fn reserve(&self, size: usize) -> Result<Self::Va, String>;
    fn base(va: &Self::Va) -> usize;
    fn create(&self, size: usize) -> Result<Self::Ph, String>;
    fn map(&self, addr: usize, size: usize, ph: &Self::Ph) -> Result<(), String>;
    fn unmap(&self, addr: usize, size: usize) -> Result<(), String>;
    fn destroy(&self, ph: Self::Ph) -> Result<(), String>;
    fn release(&self, va: Self::Va, size: usize) -> Result<(), String>;
}

/// `regions` reservations of `reserve` bytes, each filled with physical objects of `chunk`
/// bytes mapped side by side.
#[derive(Clone, Copy)]
struct Shape {
    regions: usize,
    reserve: usize,
    chunk: usize,
}

impl Shape {
    fn per_region(self) -> usize {
        self.reserve / self.chunk
    }
}

/// One round of the six steps; ns per region for each.
fn round<S: Side>(s: &S, sh: Shape) -> Result<[f64; 6], String> {
    let k = sh.per_region();
    let mut vas = Vec::with_capacity(sh.regions);
    let mut phs = Vec::with_capacity(sh.regions * k);
    let mut out = [0.0; 6];
    let per = |t: Instant| t.elapsed().as_nanos() as f64 / sh.regions as f64;
    let t = Instant::now();
    for _ in 0..sh.regions {
        vas.push(s.reserve(sh.reserve)?);
    }
    out[0] = per(t);
    let t = Instant::now();
    for _ in 0..sh.regions * k {
        phs.push(s.create(sh.chunk)?);
    }
    out[1] = per(t);
    let t = Instant::now();
    for (i, ph) in phs.iter().enumerate() {
        s.map(S::base(&vas[i / k]) + (i % k) * sh.chunk, sh.chunk, ph)?;
    }
    out[2] = per(t);
    let t = Instant::now();
    for i in 0..phs.len() {
        s.unmap(S::base(&vas[i / k]) + (i % k) * sh.chunk, sh.chunk)?;
    }
    out[3] = per(t);
    let t = Instant::now();
    for ph in phs {
        s.destroy(ph)?;
    }
    out[4] = per(t);
    let t = Instant::now();
    for va in vas {
        s.release(va, sh.reserve)?;
    }
    out[5] = per(t);
    Ok(out)
}

/// One round of the six steps through two sides at once, call by call (see the module docs):
/// ns per region for each side and step. `flip`: `b` goes first on even calls. Each call's
/// paired difference (`a`'s time minus `b`'s, ns) is pushed to `diffs[step][0]` where `a` went
/// first, else to `diffs[step][1]`.
fn paired<A: Side, B: Side>(
    a: &A,
    b: &B,
    sh: Shape,
    flip: bool,
    diffs: &mut [[Vec<f64>; 2]],
) -> Result<[[f64; 6]; 2], String> {
    let k = sh.per_region();
    let (mut va_a, mut va_b) = (
        Vec::with_capacity(sh.regions),
        Vec::with_capacity(sh.regions),
    );
    let (mut ph_a, mut ph_b) = (Vec::new(), Vec::new());
    let mut out = [[0.0f64; 6]; 2];
    // Runs call `i` of step `st` on both sides, each timed alone, in the order of the turn.
    let mut both = |st: usize,
                    i: usize,
                    fa: &mut dyn FnMut() -> Result<(), String>,
                    fb: &mut dyn FnMut() -> Result<(), String>|
     -> Result<(), String> {
        let a_first = i.is_multiple_of(2) != flip;
        let mut ns = [0.0f64; 2];
        for turn in 0..2 {
            let side = if (turn == 0) == a_first { 0 } else { 1 };
            let t = Instant::now();
            if side == 0 {
                fa()?
            } else {
                fb()?
            }
            ns[side] = t.elapsed().as_nanos() as f64;
            out[side][st] += ns[side];
        }
        diffs[st][usize::from(!a_first)].push(ns[0] - ns[1]);
        Ok(())
    };
    for i in 0..sh.regions {
        both(
            0,
            i,
            &mut || a.reserve(sh.reserve).map(|v| va_a.push(v)),
            &mut || b.reserve(sh.reserve).map(|v| va_b.push(v)),
        )?;
    }
    for i in 0..sh.regions * k {
        both(
            1,
            i,
            &mut || a.create(sh.chunk).map(|p| ph_a.push(p)),
            &mut || b.create(sh.chunk).map(|p| ph_b.push(p)),
        )?;
    }
    let at = |base: usize, i: usize| base + (i % k) * sh.chunk;
    for i in 0..sh.regions * k {
        let (aa, ab) = (at(A::base(&va_a[i / k]), i), at(B::base(&va_b[i / k]), i));
        both(2, i, &mut || a.map(aa, sh.chunk, &ph_a[i]), &mut || {
            b.map(ab, sh.chunk, &ph_b[i])
        })?;
    }
    for i in 0..sh.regions * k {
        let (aa, ab) = (at(A::base(&va_a[i / k]), i), at(B::base(&va_b[i / k]), i));
        both(3, i, &mut || a.unmap(aa, sh.chunk), &mut || {
            b.unmap(ab, sh.chunk)
        })?;
    }
    let (mut pa, mut pb) = (ph_a.into_iter(), ph_b.into_iter());
    for i in 0..sh.regions * k {
        let (x, y) = (pa.next().expect("one each"), pb.next().expect("one each"));
        let (mut x, mut y) = (Some(x), Some(y));
        both(
            4,
            i,
            &mut || a.destroy(x.take().expect("once")),
            &mut || b.destroy(y.take().expect("once")),
        )?;
    }
    let (mut ra, mut rb) = (va_a.into_iter(), va_b.into_iter());
    for i in 0..sh.regions {
        let (mut x, mut y) = (ra.next(), rb.next());
        both(
            5,
            i,
            &mut || a.release(x.take().expect("once"), sh.reserve),
            &mut || b.release(y.take().expect("once"), sh.reserve),
        )?;
    }
    for side in &mut out {
        for v in side.iter_mut() {
            *v /= sh.regions as f64;
        }
    }
    Ok(out)
}

/// The mean of the medians of the two orders' rounds (one order's alone if the other has
/// none).
fn order_balanced([a, b]: [Vec<f64>; 2]) -> f64 {
    match (a.is_empty(), b.is_empty()) {
        (false, false) => (median(a) + median(b)) / 2.0,
        (false, true) => median(a),
        (true, false) => median(b),
        (true, true) => f64::NAN,
    }
}

/// The median of `d` and the half-width of its distribution-free 95% confidence interval
/// (order statistics n/2 -+ 0.98 sqrt(n)); NaN for no values. Sorts `d`.
fn median_ci(d: &mut [f64]) -> (f64, f64) {
    if d.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    d.sort_by(|a, b| a.total_cmp(b));
    let n = d.len();
    let h = (0.98 * (n as f64).sqrt()).ceil() as usize;
    let (lo, hi) = ((n / 2).saturating_sub(h), (n / 2 + h).min(n - 1));
    (d[n / 2], (d[hi] - d[lo]) / 2.0)
}

/// The library's C entry points.
struct C<'a> {
    api: &'a Api,
    prop: AclPhysicalMemProp,
}

impl Side for C<'_> {
    type Va = usize;
    type Ph = *mut c_void;
    fn reserve(&self, size: usize) -> Result<usize, String> {
        let mut va: *mut c_void = null_mut();
        // SAFETY: a valid out-pointer; no hint.
        let r = unsafe { (self.api.reserve)(&mut va, size, 0, null_mut(), 0) };
        acl(self.api, r, "aclrtReserveMemAddress")?;
        Ok(va as usize)
    }
    fn base(va: &usize) -> usize {
        *va
    }
    fn create(&self, size: usize) -> Result<*mut c_void, String> {
        let mut ph: *mut c_void = null_mut();
        // SAFETY: a valid out-pointer and property struct.
        let r = unsafe { (self.api.malloc_physical)(&mut ph, size, &self.prop, 0) };
        acl(self.api, r, "aclrtMallocPhysical")?;
        Ok(ph)
    }
    fn map(&self, addr: usize, size: usize, ph: &*mut c_void) -> Result<(), String> {
        let r = (self.api.map)(addr as *mut c_void, size, 0, *ph, 0);
        acl(self.api, r, "aclrtMapMem")
    }
    fn unmap(&self, addr: usize, _size: usize) -> Result<(), String> {
        acl(
            self.api,
            (self.api.unmap)(addr as *mut c_void),
            "aclrtUnmapMem",
        )
    }
    fn destroy(&self, ph: *mut c_void) -> Result<(), String> {
        acl(self.api, (self.api.free_physical)(ph), "aclrtFreePhysical")
    }
    fn release(&self, va: usize, _size: usize) -> Result<(), String> {
        acl(
            self.api,
            (self.api.release)(va as *mut c_void),
            "aclrtReleaseMemAddress",
        )
    }
}

/// hetmem's Rust API: the calls the library makes for each step.
struct Rust<'a> {
    ctx: &'a Context,
    dev: &'a Device,
}

impl Side for Rust<'_> {
    type Va = Reservation;
    type Ph = PhysicalMemory;
    fn reserve(&self, size: usize) -> Result<Reservation, String> {
        self.ctx.reserve(None, size).map_err(e2s)
    }
    fn base(va: &Reservation) -> usize {
        va.base
    }
    fn create(&self, size: usize) -> Result<PhysicalMemory, String> {
        self.ctx
            .create_physical_memory(Some(self.dev), PhysicalMemoryFlags::AllocateOnDevice, size)
            .map_err(e2s)
    }
    fn map(&self, addr: usize, size: usize, ph: &PhysicalMemory) -> Result<(), String> {
        self.ctx
            .map(addr, size, *ph, 0, AccessAttribute::ReadWrite)
            .map_err(e2s)
    }
    fn unmap(&self, addr: usize, size: usize) -> Result<(), String> {
        self.ctx.unmap(addr, size).map_err(e2s)
    }
    fn destroy(&self, ph: PhysicalMemory) -> Result<(), String> {
        self.ctx.destroy_physical_memory(ph).map_err(e2s)
    }
    fn release(&self, va: Reservation, _size: usize) -> Result<(), String> {
        self.ctx.free_reservation(va).map_err(e2s)
    }
}

/// The bare CUDA driver calls, in device 0's primary context (current on this thread);
/// `cuMemCreate` is told what hetmem's cuda backend tells it (pinned, device 0, POSIX-fd
/// shareable).
struct Driver {
    align: usize,
    prop: sys::CUmemAllocationProp,
}

impl Side for Driver {
    type Va = u64;
    type Ph = sys::CUmemGenericAllocationHandle;
    fn reserve(&self, size: usize) -> Result<u64, String> {
        let mut a = 0;
        // SAFETY: a valid out-pointer; reserving address space changes no mapping.
        ok("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut a, size, self.align, 0, 0)
        })?;
        Ok(a)
    }
    fn base(va: &u64) -> usize {
        *va as usize
    }
    fn create(&self, size: usize) -> Result<Self::Ph, String> {
        let mut h = 0;
        // SAFETY: valid pointers.
        ok("cuMemCreate", unsafe {
            sys::cuMemCreate(&mut h, size, &self.prop, 0)
        })?;
        Ok(h)
    }
    fn map(&self, addr: usize, size: usize, ph: &Self::Ph) -> Result<(), String> {
        // SAFETY: an unmapped piece of our reservation, the allocation's whole size.
        unsafe {
            ok("cuMemMap", sys::cuMemMap(addr as u64, size, 0, *ph, 0))?;
            ok(
                "cuMemSetAccess",
                sys::cuMemSetAccess(addr as u64, size, &rw(RW), 1),
            )
        }
    }
    fn unmap(&self, addr: usize, size: usize) -> Result<(), String> {
        // SAFETY: one whole mapping of ours, unused.
        ok("cuMemUnmap", unsafe { sys::cuMemUnmap(addr as u64, size) })
    }
    fn destroy(&self, ph: Self::Ph) -> Result<(), String> {
        // SAFETY: our allocation, unmapped.
        ok("cuMemRelease", unsafe { sys::cuMemRelease(ph) })
    }
    fn release(&self, va: u64, size: usize) -> Result<(), String> {
        // SAFETY: our reservation, nothing mapped in it.
        ok("cuMemAddressFree", unsafe {
            sys::cuMemAddressFree(va, size)
        })
    }
}

/// Makes device 0's primary context current on this thread, for the driver baseline.
fn driver_context() -> Result<(), String> {
    // SAFETY: plain driver calls with valid out-pointers (the cuda backend initialized it).
    unsafe {
        let mut d = 0;
        ok("cuDeviceGet", sys::cuDeviceGet(&mut d, 0))?;
        let mut c = null_mut();
        ok(
            "cuDevicePrimaryCtxRetain",
            sys::cuDevicePrimaryCtxRetain(&mut c, d),
        )?;
        ok("cuCtxSetCurrent", sys::cuCtxSetCurrent(c))
    }
}

/// The sleep-mode rows (see the module docs). `cuda`: the backend is cuda (adds the driver
/// baseline). `n`: allocations of the 2 MiB shape per round.
pub fn rows(
    api: &Api,
    ctx: &Context,
    dev: &Device,
    cuda: bool,
    n: usize,
    rounds: usize,
    same_instance: bool,
) -> Result<Vec<Row>, String> {
    let prop = AclPhysicalMemProp {
        handle_type: 0,
        allocation_type: 0,
        mem_attr: 0,
        location_id: 0,
        location_type: 1,
        reserve: 0,
    };
    let mut gran = 0usize;
    // SAFETY: valid property struct and out-pointer.
    let r = unsafe { (api.granularity)(&prop, 0, &mut gran) };
    acl(api, r, "aclrtMemGetAllocationGranularity")?;
    let rust_gran = ctx.acl_granularity(dev).map_err(e2s)?;
    if gran != rust_gran || !CHUNK.is_multiple_of(gran) {
        return Err(format!(
            "granularity: the C library answers {gran}, hetmem {rust_gran}; the 1 GiB shape \
             needs one that divides 32 MiB"
        ));
    }
    let c = C { api, prop };
    let rust = Rust { ctx, dev };
    let drv = Driver {
        align: gran,
        prop: super::cuda::prop(),
    };
    if cuda {
        driver_context()?;
    }
    // The same-instance rows leave the driver's calls out (the other rows have them).
    let cuda_driver = cuda && !same_instance;
    let suffix = if same_instance { "_same_instance" } else { "" };
    let baseline = if same_instance {
        "the same Rust calls, on the library's own context"
    } else {
        "the same hetmem Rust call(s)"
    };
    let shapes = [
        (
            "2MiB",
            "2mib",
            Shape {
                regions: n,
                reserve: gran,
                chunk: gran,
            },
        ),
        (
            "1GiB/32MiB",
            "1gib_32mib",
            Shape {
                regions: 1,
                reserve: GIB,
                chunk: CHUNK,
            },
        ),
    ];
    let sides = if cuda_driver { 3 } else { 2 };
    let mut rows = Vec::new();
    let mut lines = Vec::new();
    for (size, tag, sh) in shapes {
        // figures[side][step][round % 2]: one value per counted round, by the round's order
        // (the order of each pair turns with the round); diffs[step]: C - Rust per call.
        let mut figures = vec![vec![[Vec::new(), Vec::new()]; 6]; sides];
        let mut diffs = vec![[Vec::new(), Vec::new()]; 6];
        let mut warm = vec![[Vec::new(), Vec::new()]; 6];
        for rd in 0..=rounds {
            // The driver's block goes before or after the interleaved pair, turn by turn.
            let mut got: Vec<(usize, [f64; 6])> = Vec::with_capacity(sides);
            for j in 0..sides - 1 {
                if j == rd % (sides - 1) {
                    let d = if rd > 0 { &mut diffs } else { &mut warm };
                    let [fc, fr] = paired(&c, &rust, sh, rd % 2 == 1, d)?;
                    got.push((0, fc));
                    got.push((1, fr));
                } else {
                    got.push((2, round(&drv, sh)?));
                }
            }
            if rd > 0 {
                for (side, f) in got {
                    for (st, v) in f.into_iter().enumerate() {
                        figures[side][st][rd % 2].push(v);
                    }
                }
            }
        }
        // The added time per call: for each order (C first, Rust first) the median of its
        // calls' paired differences, then the mean of the two (whichever call goes second
        // meets warmer caches: the two orders' medians differ by that, in opposite
        // directions). The noise: half the width of the distribution-free 95% confidence
        // interval of each median (order statistics n/2 -+ 0.98 sqrt(n)), combined.
        let added: Vec<(f64, f64)> = diffs
            .iter_mut()
            .map(|orders| {
                let [(m0, h0), (m1, h1)] = orders.each_mut().map(|d| median_ci(d));
                ((m0 + m1) / 2.0, (h0 * h0 + h1 * h1).sqrt() / 2.0)
            })
            .collect();
        // Each side's figure per step: the mean of its medians over the rounds of each order.
        // A plain median would take the side of the order with more rounds, which for a step
        // of one call a round (reserve and release of the 1 GiB shape) is most of the figure:
        // the first call of a pair took 4-9 us more there (host backend, 2026-12-03), which
        // made C read 0.55-0.73x of Rust in one build and 1.2-1.5x in the next.
        let med: Vec<Vec<f64>> = figures
            .into_iter()
            .map(|s| s.into_iter().map(order_balanced).collect())
            .collect();
        for (st, (entry, part, driver)) in STEPS.into_iter().enumerate() {
            let calls = if st == 0 || st == 5 {
                1
            } else {
                sh.per_region()
            };
            let key = format!("acl_vmm_{part}_{tag}{suffix}");
            let (cn, rn) = (med[0][st], med[1][st]);
            let (added, noise) = added[st];
            json_extra(&format!("{key}_added_ns_per_call"), added);
            json_extra(&format!("{key}_added_noise_ns_per_call"), noise);
            lines.push(format!(
                "{entry} {size}{label}: C {cn:.0} ns, Rust {rn:.0} ns per {unit} ({calls} call{s}): \
                 {added:+.0} ns per call, noise +-{noise:.0} (target <= 150 ns added: {verdict})",
                unit = if tag == "2mib" { "allocation" } else { "1 GiB" },
                label = if same_instance { " (same instance)" } else { "" },
                s = if calls == 1 { "" } else { "s" },
                verdict = if added <= 150.0 {
                    "met"
                } else if added - noise <= 150.0 {
                    "within noise"
                } else {
                    "NOT MET"
                },
            ));
            rows.push(Row {
                op: entry,
                size,
                key: key.clone(),
                unit: Unit::Ns,
                hetmem_ns: cn,
                baseline_ns: Some(rn),
                baseline,
                target: Some(TARGET),
            });
            if cuda_driver {
                rows.push(Row {
                    op: entry,
                    size,
                    key: format!("{key}_vs_driver"),
                    unit: Unit::Ns,
                    hetmem_ns: cn,
                    baseline_ns: Some(med[2][st]),
                    baseline: driver,
                    target: None,
                });
            }
        }
    }
    for l in lines {
        println!("{l}");
    }
    Ok(rows)
}
