//! Model-based property test of USM allocations on the backend under test (`HETMEM_BACKEND`).
//!
//! Random sequences of allocate (device / host / shared) / free / properties / address range /
//! write / read run against hetmem and a simple reference model: a map of live allocations
//! (base, size, type, device, id, page size) with sparse contents (fresh memory reads zero) and
//! per-device usage. The model decides each step's outcome before the library runs it; a failed
//! call must change nothing (live set, usage, stats).
//!
//! The model's device capacity and largest allocation are what the devices report (the host
//! backend's small ones of `run`; on cuda the GPU's memory, which these sizes never fill), and
//! the device-1 allocations need a second device. Contents are read and written through the
//! `dev_*` helpers (the runtime's own copies on cuda, where the host cannot reach device
//! memory); fresh memory reading zero is a host-backend check (cuda does not zero-fill and the
//! spec does not ask it). On cuda fewer cases run, each step's check reading each allocation's
//! written span with one copy.

mod common;

use common::{dev_bytes, dev_put, on_host, runtime_with_max_alloc};

use std::collections::BTreeMap;

use hetmem::{AllocDesc, Context, Device, MemoryType};
use proptest::prelude::*;
use proptest::test_runner::Config;

const CAPACITY: u64 = 8 << 20;
const MAX_ALLOC: u64 = 4 << 20;
const SIZES: [usize; 8] = [0, 1, 100, 4096, 65536, 65537, 2 << 20, 5 << 20];
const ALIGNS: [usize; 5] = [0, 1, 3, 4096, 1 << 20];

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        kind: u8,
        size: usize,
        align: usize,
        relaxed: bool,
    },
    Free {
        pick: usize,
        interior: bool,
    },
    Props {
        pick: usize,
        offset: usize,
    },
    Range {
        pick: usize,
        offset: usize,
    },
    Write {
        pick: usize,
        offset: usize,
        byte: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..4, 0..SIZES.len(), 0..ALIGNS.len(), any::<bool>()).prop_map(|(kind, s, a, relaxed)| Op::Alloc {
            kind,
            size: SIZES[s],
            align: ALIGNS[a],
            relaxed
        }),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(pick, interior)| Op::Free { pick, interior }),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(pick, offset)| Op::Props { pick, offset }),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(pick, offset)| Op::Range { pick, offset }),
        3 => (any::<usize>(), any::<usize>(), any::<u8>()).prop_map(|(pick, offset, byte)| Op::Write { pick, offset, byte }),
    ]
}

#[derive(Debug)]
struct Rec {
    size: usize,
    kind: MemoryType,
    device: Option<u32>,
    id: u64,
    page: usize,
    charged: u64,
    contents: BTreeMap<usize, u8>,
}

struct Model {
    live: BTreeMap<usize, Rec>,
    used: Vec<u64>,
}

fn page_for(ctx: &Context, dev: &Device, size: usize) -> usize {
    ctx.query_page_size(dev, size).unwrap()
}

fn run(ops: Vec<Op>) {
    let rt = runtime_with_max_alloc(2, CAPACITY, MAX_ALLOC);
    let devs = rt.driver().devices();
    // What the devices report: the host backend's are the ones asked for above.
    let capacity = devs[0].info().capacity;
    let max_alloc = devs[0].info().max_alloc_size;
    if on_host() {
        assert_eq!((capacity, max_alloc), (CAPACITY, MAX_ALLOC));
    }
    let ctx = rt.driver().create_context().unwrap();
    let mut m = Model {
        live: BTreeMap::new(),
        used: vec![0; devs.len()],
    };
    for (i, op) in ops.into_iter().enumerate() {
        let bases: Vec<usize> = m.live.keys().copied().collect();
        let pick = |p: usize| (!bases.is_empty()).then(|| bases[p % bases.len()]);
        match op {
            Op::Alloc {
                kind,
                size,
                align,
                relaxed,
            } => {
                let desc = AllocDesc::new(size)
                    .alignment(align)
                    .relaxed_max_size(relaxed);
                let (mt, dev) = match kind {
                    0 => (MemoryType::Device, Some(0u32)),
                    // Device 1 where there is one (the host backend's two; one GPU: device 0).
                    1 => (MemoryType::Device, Some(devs.len() as u32 - 1)),
                    2 => (MemoryType::Host, None),
                    _ => (MemoryType::Shared, Some(0)),
                };
                let page = if size == 0 {
                    0
                } else {
                    page_for(&ctx, &devs[dev.unwrap_or(0) as usize], size)
                };
                let span = if size == 0 {
                    0
                } else {
                    size.div_ceil(page) * page
                } as u64;
                let expect: Result<(), u32> = if size == 0 {
                    Err(0x7800_0009)
                } else if align != 0 && !align.is_power_of_two() {
                    Err(0x7800_000a)
                } else if (!relaxed && size as u64 > max_alloc)
                    || (dev.is_some() && size as u64 > capacity)
                {
                    Err(0x7800_0009)
                } else if let Some(d) = dev.filter(|_| mt != MemoryType::Host) {
                    if m.used[d as usize] + span > capacity {
                        Err(0x7000_0003)
                    } else {
                        Ok(())
                    }
                } else {
                    Ok(())
                };
                let got = match mt {
                    MemoryType::Device => ctx.alloc_device(&devs[dev.unwrap() as usize], &desc),
                    MemoryType::Host => ctx.alloc_host(&desc),
                    _ => ctx.alloc_shared(Some(&devs[0]), &desc),
                };
                match (expect, got) {
                    (Ok(()), Ok(p)) => {
                        assert_eq!(p % page.max(align), 0, "step {i}: alignment");
                        let props = ctx.get_allocation_properties(p).unwrap();
                        assert!(
                            m.live.values().all(|r| r.id != props.id),
                            "step {i}: id reused"
                        );
                        let charged = if mt == MemoryType::Host { 0 } else { span };
                        if let (Some(d), true) = (dev, charged > 0) {
                            m.used[d as usize] += charged;
                        }
                        m.live.insert(
                            p,
                            Rec {
                                size,
                                kind: mt,
                                device: if mt == MemoryType::Host { None } else { dev },
                                id: props.id,
                                page,
                                charged,
                                contents: BTreeMap::new(),
                            },
                        );
                    }
                    (Err(c), Err(e)) => assert_eq!(e.ze_result(), c, "step {i}: {e}"),
                    (e, g) => panic!("step {i}: expected {e:?}, got {g:?}"),
                }
            }
            Op::Free { pick: p, interior } => match pick(p) {
                Some(b) => {
                    let r = &m.live[&b];
                    if interior && r.size > 1 {
                        assert_eq!(ctx.free_memory(b + 1).unwrap_err().ze_result(), 0x7800_0004);
                    } else {
                        ctx.free_memory(b).unwrap();
                        let r = m.live.remove(&b).unwrap();
                        if let Some(d) = r.device.filter(|_| r.charged > 0) {
                            m.used[d as usize] -= r.charged;
                        }
                    }
                }
                None => {
                    let x = 0u8;
                    let e = ctx.free_memory(&x as *const u8 as usize).unwrap_err();
                    assert_eq!(e.ze_result(), 0x7800_0004);
                }
            },
            Op::Props { pick: p, offset } => {
                if let Some(b) = pick(p) {
                    let r = &m.live[&b];
                    let props = ctx.get_allocation_properties(b + offset % r.size).unwrap();
                    assert_eq!(
                        (props.memory_type, props.device, props.id, props.page_size),
                        (r.kind, r.device, r.id, r.page),
                        "step {i}"
                    );
                }
            }
            Op::Range { pick: p, offset } => {
                if let Some(b) = pick(p) {
                    let r = &m.live[&b];
                    assert_eq!(
                        ctx.get_address_range(b + offset % r.size).unwrap(),
                        (b, r.size)
                    );
                }
            }
            Op::Write {
                pick: p,
                offset,
                byte,
            } => {
                if let Some(b) = pick(p) {
                    let r = m.live.get_mut(&b).unwrap();
                    let o = offset % r.size;
                    // Inside a live read-write allocation.
                    dev_put(&ctx, b + o, &[byte]);
                    r.contents.insert(o, byte);
                }
            }
        }
        // Invariants after every step.
        for (d, dev) in devs.iter().enumerate() {
            assert_eq!(dev.used_memory(), m.used[d], "step {i}: device {d} usage");
        }
        let s = rt.driver().usm_stats();
        assert_eq!(s.allocations, m.live.len(), "step {i}");
        assert_eq!(
            s.allocated_bytes,
            m.live.values().map(|r| r.size).sum::<usize>()
        );
        for (&b, r) in &m.live {
            // Written bytes read back (one read of the written span); a few unwritten ones
            // read zero on the host backend.
            if let (Some((&lo, _)), Some((&hi, _))) =
                (r.contents.first_key_value(), r.contents.last_key_value())
            {
                let got = dev_bytes(&ctx, b + lo, hi + 1 - lo);
                for (&o, &v) in &r.contents {
                    assert_eq!(got[o - lo], v, "step {i}");
                }
            }
            if on_host() {
                for o in [0, r.size / 2, r.size - 1] {
                    if !r.contents.contains_key(&o) {
                        // SAFETY: inside a live allocation (host memory on this backend).
                        assert_eq!(unsafe { *((b + o) as *const u8) }, 0, "step {i}");
                    }
                }
            }
        }
    }
    drop(ctx);
    assert_eq!(rt.driver().usm_stats(), hetmem::UsmStats::default());
    assert!(devs.iter().all(|d| d.used_memory() == 0));
}

/// 512 cases on the host backend; 32 on cuda, where every read and write is a device copy.
fn cases() -> u32 {
    if on_host() {
        512
    } else {
        32
    }
}

proptest! {
    #![proptest_config(Config { cases: cases(), failure_persistence: None, ..Config::default() })]

    #[test]
    fn usm_matches_the_reference_model(ops in proptest::collection::vec(op(), 1..60)) {
        if common::skip() {
            return Ok(());
        }
        if !on_host() {
            common::part_not_applicable_on(
                hetmem::BackendKind::Cuda,
                "fresh memory reading zero: cuda does not zero-fill device memory, and the spec \
                 does not ask it",
            );
        }
        run(ops);
    }
}
