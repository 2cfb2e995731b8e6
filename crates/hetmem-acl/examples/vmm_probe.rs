//! Cold-cache probe of what the VMM entry points add over hetmem's Rust API (issue 21's sleep
//! path): `aclrtReserveMemAddress`, `aclrtMallocPhysical`, `aclrtMapMem`, `aclrtUnmapMem`,
//! `aclrtFreePhysical`, `aclrtReleaseMemAddress`, 2 MiB shape (one granule per reservation,
//! physical object and mapping).
//!
//! One instance of everything (the entry points of this crate linked in, the Rust calls on the
//! library's own current context), as `hetmem bench acl`'s `_same_instance` rows. Before every
//! call, C or Rust, a buffer larger than L2 is written through (`PROBE_EVICT_MIB`, default 8),
//! so each call meets the caches as a call after a long driver call does. Whole sequences of
//! the six steps run through C and through Rust in turn (C first, then Rust, then C, ...);
//! the printed figure per step is the median C call's time minus the median Rust call's.
//!
//! `cargo run --release -p hetmem-acl --example vmm_probe [iterations]` (sequences per side, default 400).

use std::ffi::c_void;
use std::hint::black_box;
use std::ptr::null_mut;
use std::time::Instant;

use ascendcl::vmm::{self, AclPhysicalMemProp};
use ascendcl::{setup, state};

const STEPS: [&str; 6] = [
    "reserve",
    "malloc_physical",
    "map",
    "unmap",
    "free_physical",
    "release",
];

fn ok(r: i32, what: &str) {
    assert_eq!(r, 0, "{what}: {r}");
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

struct Evict(Vec<u64>);

impl Evict {
    fn run(&mut self) {
        for x in self.0.iter_mut().step_by(8) {
            *x = x.wrapping_add(1);
        }
        black_box(&self.0);
    }
}

fn main() {
    let iters: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(400);
    let mib: usize = std::env::var("PROBE_EVICT_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let mut ev = Evict(vec![0u64; (mib << 20) / 8]);
    unsafe {
        ok(setup::aclInit(null_mut()), "aclInit");
        ok(setup::aclrtSetDevice(0), "aclrtSetDevice");
    }
    let own = state::fast_global()
        .and_then(|g| g.current().cloned())
        .expect("current context");
    let (ctx, dev) = (&own.ctx, &own.dev);
    let prop = AclPhysicalMemProp {
        handle_type: 0,
        allocation_type: 0,
        mem_attr: 0,
        location_id: 0,
        location_type: 1,
        reserve: 0,
    };
    let mut g = 0usize;
    ok(
        unsafe { vmm::aclrtMemGetAllocationGranularity(&prop, 0, &mut g) },
        "granularity",
    );
    // times[side][step]: ns of each call (side 0 C, 1 Rust).
    let mut times: [Vec<Vec<f64>>; 2] = std::array::from_fn(|_| vec![Vec::new(); 6]);
    for i in 0..2 * iters {
        // Whole sequences, C and Rust in turn: each side's calls meet the state its own
        // previous steps left (a call right after the other side's twin met a kernel and
        // driver the twin had just warmed: +-20 us by order on the host backend).
        let c_side = i % 2 == 0;
        let mut c_va: *mut c_void = null_mut();
        let mut c_ph: *mut c_void = null_mut();
        let mut r_va = None;
        let mut r_ph = None;
        for st in 0..6 {
            ev.run();
            let t = Instant::now();
            if c_side {
                let r = unsafe {
                    match st {
                        0 => vmm::aclrtReserveMemAddress(&mut c_va, g, 0, null_mut(), 0),
                        1 => vmm::aclrtMallocPhysical(&mut c_ph, g, &prop, 0),
                        2 => vmm::aclrtMapMem(c_va, g, 0, c_ph, 0),
                        3 => vmm::aclrtUnmapMem(c_va),
                        4 => vmm::aclrtFreePhysical(c_ph),
                        _ => vmm::aclrtReleaseMemAddress(c_va),
                    }
                };
                times[0][st].push(t.elapsed().as_nanos() as f64);
                ok(r, STEPS[st]);
            } else {
                match st {
                    0 => r_va = Some(ctx.reserve(None, g).unwrap()),
                    1 => {
                        r_ph = Some(
                            ctx.create_physical_memory(
                                Some(dev),
                                hetmem::PhysicalMemoryFlags::AllocateOnDevice,
                                g,
                            )
                            .unwrap(),
                        )
                    }
                    2 => ctx
                        .map(
                            r_va.as_ref().unwrap().base,
                            g,
                            r_ph.unwrap(),
                            0,
                            hetmem::AccessAttribute::ReadWrite,
                        )
                        .unwrap(),
                    3 => ctx.unmap(r_va.as_ref().unwrap().base, g).unwrap(),
                    4 => ctx.destroy_physical_memory(r_ph.take().unwrap()).unwrap(),
                    _ => ctx.free_reservation(r_va.take().unwrap()).unwrap(),
                }
                times[1][st].push(t.elapsed().as_nanos() as f64);
            }
        }
    }
    println!(
        "vmm_probe: {iters} sequences per side, {mib} MiB evicted before each call, 2 MiB shape"
    );
    for st in 0..6 {
        let c = median(&mut times[0][st]);
        let r = median(&mut times[1][st]);
        println!(
            "{:<16} added {:>6.0} ns (C {:>7.0}, Rust {:>7.0})",
            STEPS[st],
            c - r,
            c,
            r
        );
    }
    drop(own);
    ok(setup::aclFinalize(), "aclFinalize");
}
