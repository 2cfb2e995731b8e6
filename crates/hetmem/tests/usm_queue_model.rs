//! Model-based property test of USM allocations together with device queues (issue 3): random
//! sequences of allocate (host / device / shared) / free (every policy, raw descriptors
//! decoded by `FreePolicy::from_desc`) / properties / address range / copy / fill / host
//! write / synchronize run against hetmem and a reference model.
//!
//! The model keeps every live allocation's bytes densely (fresh memory reads zero) and the
//! per-device capacity in use. Copies and fills go through regular command lists executed on
//! one of two queues (devices 0 and 1) or through an immediate list; each submission waits on
//! the previous one's event, so the device-side order equals the program order whichever
//! engine runs it, and the model applies each command at submission. After every
//! synchronize, every live allocation's bytes must equal the model's. A failed call (bad size,
//! alignment, capacity, pointer, pattern, policy, descriptor) must change nothing.

mod common;

use common::runtime_with_max_alloc;

use common::ze::{
    INVALID_ARGUMENT, INVALID_ENUMERATION, INVALID_SIZE, OUT_OF_DEVICE_MEMORY, UNKNOWN,
    UNSUPPORTED_ALIGNMENT, UNSUPPORTED_SIZE,
};

use hetmem::{
    AllocDesc, CommandList, CommandQueue, Context, Device, Event, FreePolicy, MemoryType, Runtime,
};
use proptest::prelude::*;
use proptest::test_runner::Config;
use std::collections::BTreeMap;

const CAPACITY: u64 = 8 << 20;
const MAX_ALLOC: u64 = 4 << 20;
const SIZES: [usize; 8] = [0, 1, 100, 4096, 65536, 65537, 3 << 20, 5 << 20];
const ALIGNS: [usize; 4] = [0, 3, 4096, 1 << 20];
const LENS: [usize; 8] = [0, 1, 7, 64, 4096, 65536, 100_000, 1 << 20];
/// Pattern lengths: every valid one and a few invalid.
const PATTERNS: [usize; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 0, 3, 256];

/// An operand: a pick among live (or, for `dead`, freed) allocations and an offset into it.
#[derive(Debug, Clone, Copy)]
struct Ptr {
    pick: usize,
    offset: usize,
    dead: bool,
}

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
        stype: u32,
        policy: u32,
    },
    Props(Ptr),
    Range(Ptr),
    Copy {
        dst: Ptr,
        src: Ptr,
        len: usize,
        /// Shorten `len` to fit both operands (most of the time), else keep it as drawn.
        fit: bool,
        via: u8,
    },
    Fill {
        dst: Ptr,
        len: usize,
        fit: bool,
        pattern: usize,
        seed: u8,
        via: u8,
    },
    HostWrite {
        pick: usize,
        offset: usize,
        byte: u8,
    },
    Sync,
}

fn ptr() -> impl Strategy<Value = Ptr> {
    (any::<usize>(), any::<usize>(), prop::bool::weighted(0.1))
        .prop_map(|(pick, offset, dead)| Ptr { pick, offset, dead })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..5, 0..SIZES.len(), prop_oneof![6 => Just(0usize), 1 => 0..ALIGNS.len()],
              prop::bool::weighted(0.3)).prop_map(
            |(kind, s, a, relaxed)| Op::Alloc { kind, size: SIZES[s], align: ALIGNS[a], relaxed }
        ),
        2 => (any::<usize>(), prop::bool::weighted(0.1),
              prop_oneof![8 => Just(0x1000a_u32), 3 => Just(0x10009_u32), 1 => Just(0x1_u32)],
              prop_oneof![3 => 0u32..4, 1 => Just(4u32)])
            .prop_map(|(pick, interior, stype, policy)| Op::Free { pick, interior, stype, policy }),
        1 => ptr().prop_map(Op::Props),
        1 => ptr().prop_map(Op::Range),
        5 => (ptr(), ptr(), 0..LENS.len(), prop::bool::weighted(0.8), 0u8..3).prop_map(
            |(dst, src, l, fit, via)| Op::Copy { dst, src, len: LENS[l], fit, via }
        ),
        4 => (ptr(), 0..LENS.len(), prop::bool::weighted(0.8),
              prop_oneof![8 => 0..8usize, 1 => 8..PATTERNS.len()], any::<u8>(), 0u8..3).prop_map(
            |(dst, l, fit, p, seed, via)| Op::Fill {
                dst, len: LENS[l], fit, pattern: PATTERNS[p], seed, via
            }
        ),
        2 => (any::<usize>(), any::<usize>(), any::<u8>())
            .prop_map(|(pick, offset, byte)| Op::HostWrite { pick, offset, byte }),
        1 => Just(Op::Sync),
    ]
}

#[derive(Debug)]
struct Rec {
    kind: MemoryType,
    device: Option<u32>,
    id: u64,
    page: usize,
    /// Bytes charged to `device` (0 for host memory and shared memory without a device).
    charged: u64,
    bytes: Vec<u8>,
}

struct Model {
    live: BTreeMap<usize, Rec>,
    /// Bases freed (for stale-pointer operands).
    dead: Vec<usize>,
    used: [u64; 2],
    /// Capacity freed with DEFER since the last synchronize: back by the next one.
    deferred: [u64; 2],
}

impl Model {
    /// The live allocation containing `[p, p+len)` (an empty range needs `p` inside), as
    /// `(base, offset)`.
    fn contains(&self, p: usize, len: usize) -> Option<(usize, usize)> {
        let (&b, r) = self.live.range(..=p).next_back()?;
        let off = p - b;
        (off < r.bytes.len() && off + len <= r.bytes.len()).then_some((b, off))
    }

    /// Bytes from `p` to the end of the live allocation containing it (0 if none).
    fn room(&self, p: usize) -> usize {
        self.contains(p, 0)
            .map_or(0, |(b, off)| self.live[&b].bytes.len() - off)
    }

    /// Resolves an operand to an address.
    fn addr(&self, p: Ptr) -> usize {
        if p.dead && !self.dead.is_empty() {
            return self.dead[p.pick % self.dead.len()] + p.offset % 4096;
        }
        if self.live.is_empty() {
            return 0x1000; // never an allocation
        }
        let (&b, r) = self.live.iter().nth(p.pick % self.live.len()).unwrap();
        // Mostly inside; sometimes a little past the end (rejected unless the length is 0).
        b + p.offset % (r.bytes.len() + r.bytes.len() / 8 + 1)
    }
}

struct Engines {
    queues: [CommandQueue; 2],
    imm: CommandList,
    devs: Vec<Device>,
    /// The event the next submission waits on: the previous submission's.
    last: Option<Event>,
}

impl Engines {
    /// Submits one command through `via` (0, 1: a regular list on that device's queue; 2: the
    /// immediate list), chained after the previous submission. Returns the append's result;
    /// on failure nothing is submitted and the chain is unchanged.
    fn submit(
        &mut self,
        ctx: &Context,
        via: u8,
        f: impl Fn(&CommandList, &Event, &[&Event]) -> hetmem::Result<()>,
    ) -> hetmem::Result<()> {
        let ev = ctx.create_event().unwrap();
        let wait: Vec<&Event> = self.last.iter().collect();
        match via {
            2 => f(&self.imm, &ev, &wait)?,
            q => {
                let l = ctx
                    .create_command_list(&self.devs[q as usize % self.devs.len()])
                    .unwrap();
                f(&l, &ev, &wait)?;
                l.close().unwrap();
                self.queues[q as usize]
                    .execute_command_lists(&[&l], None)
                    .unwrap();
            }
        }
        self.last = Some(ev);
        Ok(())
    }

    fn sync(&mut self) {
        for q in &self.queues {
            assert_eq!(q.synchronize(u64::MAX).unwrap(), hetmem::SyncStatus::Ready);
        }
        assert_eq!(
            self.imm.host_synchronize(u64::MAX).unwrap(),
            hetmem::SyncStatus::Ready
        );
        self.last = None;
    }
}

/// `PROT_NONE` mappings over the pages of operands that lie in no live allocation (freed ones,
/// or the never-mapped 0x1000), for one step: plain system memory is an operand of Level Zero
/// copies and fills where it is mapped with the access needed, so a freed range the process
/// has since mapped again (its own heap) would be accepted, and written. Under a guard the
/// range is mapped with no access, so the model's answer (`InvalidArgument`) is certain.
struct Guards(Vec<(usize, usize)>);

impl Guards {
    /// Guards the pages of `[a, a + max(len, 1))` for each `a`; `None` where one of them is
    /// mapped (a deferred free still holding it, or memory of the process): the step is skipped
    /// then. Pages below the lowest address a mapping may take (0x1000) need no guard.
    fn over(addrs: &[usize], len: usize) -> Option<Guards> {
        let mut g = Guards(Vec::new());
        let mut ranges: Vec<(usize, usize)> = addrs
            .iter()
            .map(|&a| (a & !4095, (a + len.max(1)).next_multiple_of(4096)))
            .collect();
        ranges.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::new();
        for (s, e) in ranges {
            match merged.last_mut() {
                Some(l) if s <= l.1 => l.1 = l.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        for (s, e) in merged {
            // SAFETY: MAP_FIXED_NOREPLACE never replaces a mapping; it fails if any is there.
            let p = unsafe {
                libc::mmap(
                    s as *mut _,
                    e - s,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM) {
                    continue; // below mmap_min_addr: never mapped
                }
                return None;
            }
            g.0.push((s, e - s));
            if p as usize != s {
                return None; // an old kernel took it as a hint
            }
        }
        Some(g)
    }
}

impl Drop for Guards {
    fn drop(&mut self) {
        for &(a, n) in &self.0 {
            // SAFETY: our own guard mappings.
            unsafe { libc::munmap(a as *mut _, n) };
        }
    }
}

fn code<T: std::fmt::Debug>(r: hetmem::Result<T>) -> u32 {
    r.expect_err("expected an error").ze_result()
}

/// Checks every live allocation's bytes, the capacity and the counters against the model.
fn check_all(rt: &Runtime, ctx: &Context, m: &mut Model, step: usize) {
    for (&b, r) in &m.live {
        // A live read-write allocation of this size; no work is in flight. Read as the device
        // sees it (on cuda the host cannot reach device memory).
        let real = common::dev_bytes(ctx, b, r.bytes.len());
        if real != r.bytes[..] {
            let at = real.iter().zip(&r.bytes).position(|(a, b)| a != b).unwrap();
            panic!(
                "step {step}: allocation {b:#x} differs at offset {at}: {} vs model {}",
                real[at], r.bytes[at]
            );
        }
    }
    assert_eq!(rt.driver().pending_frees(), 0, "step {step}");
    m.deferred = [0; 2];
    for (i, d) in rt.driver().devices().iter().enumerate() {
        assert_eq!(d.used_memory(), m.used[i], "step {step}: device {i} usage");
    }
}

fn run(ops: Vec<Op>) {
    let rt = runtime_with_max_alloc(2, CAPACITY, MAX_ALLOC);
    let devs = rt.driver().devices();
    // The host backend's two devices of CAPACITY bytes, allocations of at most MAX_ALLOC; on
    // cuda the machine's GPUs, as large as they are (never filled here). Devices 0 and 1 of
    // the ops are device `d % devices`.
    let (capacity, max_alloc) = (devs[0].info().capacity, devs[0].info().max_alloc_size);
    if common::on_host() {
        assert_eq!((capacity, max_alloc), (CAPACITY, MAX_ALLOC));
    }
    let on = |d: u32| d % devs.len() as u32;
    // Fresh memory reads zero on the host backend; on cuda nothing requires it, and the model
    // starts from what a fresh allocation holds.
    let fresh_reads_zero = !common::part_not_applicable_on(
        hetmem::BackendKind::Cuda,
        "fresh allocations read zero: cuda device memory is not zero-filled, and nothing in the \
         spec requires it (the model starts from what a fresh allocation holds)",
    );
    let ctx = rt.driver().create_context().unwrap();
    let mut eng = Engines {
        queues: [
            ctx.create_command_queue(&devs[0]).unwrap(),
            ctx.create_command_queue(&devs[on(1) as usize]).unwrap(),
        ],
        imm: ctx.create_immediate_command_list(&devs[0]).unwrap(),
        devs: devs.clone(),
        last: None,
    };
    let mut m = Model {
        live: BTreeMap::new(),
        dead: Vec::new(),
        used: [0; 2],
        deferred: [0; 2],
    };
    for (i, op) in ops.into_iter().enumerate() {
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
                // (type, device charged, device for limits)
                let (mt, dev) = match kind {
                    0 => (MemoryType::Device, Some(0u32)),
                    1 => (MemoryType::Device, Some(on(1))),
                    2 => (MemoryType::Host, None),
                    3 => (MemoryType::Shared, Some(on(1))),
                    _ => (MemoryType::Shared, None),
                };
                let limits = &devs[dev.unwrap_or(0) as usize];
                let page = if size == 0 {
                    0
                } else {
                    ctx.query_page_size(limits, size).unwrap()
                };
                let span = if size == 0 {
                    0
                } else {
                    size.div_ceil(page) * page
                } as u64;
                // Some(code): must fail; None: must succeed; `maybe`: either (capacity that a
                // deferred free has not given back yet).
                let mut maybe = false;
                let expect = if size == 0 {
                    Some(UNSUPPORTED_SIZE)
                } else if align != 0 && !align.is_power_of_two() {
                    Some(UNSUPPORTED_ALIGNMENT)
                } else if (!relaxed && size as u64 > max_alloc)
                    || (dev.is_some() && size as u64 > capacity)
                {
                    Some(UNSUPPORTED_SIZE)
                } else if let Some(d) = dev {
                    let (u, late) = (m.used[d as usize], m.deferred[d as usize]);
                    if u + span > capacity {
                        Some(OUT_OF_DEVICE_MEMORY)
                    } else {
                        maybe = u + late + span > capacity;
                        None
                    }
                } else {
                    None
                };
                let got = match (mt, dev) {
                    (MemoryType::Device, Some(d)) => ctx.alloc_device(&devs[d as usize], &desc),
                    (MemoryType::Host, _) => ctx.alloc_host(&desc),
                    (_, d) => ctx.alloc_shared(d.map(|d| &devs[d as usize]), &desc),
                };
                match (expect, got) {
                    (None, Ok(p)) => {
                        assert_eq!(p % page.max(align), 0, "step {i}: alignment");
                        let props = ctx.get_allocation_properties(p).unwrap();
                        assert!(
                            m.live.values().all(|r| r.id != props.id),
                            "step {i}: id reused"
                        );
                        if let Some(d) = dev {
                            m.used[d as usize] += span;
                        }
                        m.dead.retain(|&x| x != p);
                        let bytes = if fresh_reads_zero {
                            vec![0; size]
                        } else {
                            common::dev_bytes(&ctx, p, size)
                        };
                        m.live.insert(
                            p,
                            Rec {
                                kind: mt,
                                device: dev,
                                id: props.id,
                                page,
                                charged: if dev.is_some() { span } else { 0 },
                                bytes,
                            },
                        );
                    }
                    (None, Err(e)) if maybe && e.ze_result() == OUT_OF_DEVICE_MEMORY => {}
                    (Some(c), Err(e)) => assert_eq!(e.ze_result(), c, "step {i}: {e}"),
                    (e, g) => panic!("step {i}: expected {e:?}, got {g:?}"),
                }
            }
            Op::Free {
                pick,
                interior,
                stype,
                policy,
            } => {
                let decoded = FreePolicy::from_desc(stype, policy);
                if policy > 3 {
                    assert_eq!(code(decoded), INVALID_ENUMERATION, "step {i}");
                } else if stype != 0x1000a && stype != 0x10009 {
                    assert_eq!(code(decoded), INVALID_ARGUMENT, "step {i}");
                } else {
                    let policy = decoded.unwrap();
                    let target = if m.live.is_empty() {
                        None
                    } else {
                        m.live.keys().nth(pick % m.live.len()).copied()
                    };
                    match target {
                        Some(b) if interior && m.live[&b].bytes.len() > 1 => {
                            assert_eq!(
                                code(ctx.free_memory_ext(b + 1, policy)),
                                INVALID_ARGUMENT,
                                "step {i}"
                            );
                        }
                        Some(b) => {
                            ctx.free_memory_ext(b, policy).unwrap();
                            let r = m.live.remove(&b).unwrap();
                            if let Some(d) = r.device.filter(|_| r.charged > 0) {
                                m.used[d as usize] -= r.charged;
                                if policy == FreePolicy::Defer {
                                    m.deferred[d as usize] += r.charged;
                                }
                            }
                            m.dead.push(b);
                            // Freed at once: a second free is refused.
                            assert_eq!(code(ctx.free_memory(b)), INVALID_ARGUMENT);
                        }
                        None => {
                            let x = 0u8;
                            let e = ctx.free_memory_ext(&x as *const u8 as usize, policy);
                            assert_eq!(code(e), INVALID_ARGUMENT, "step {i}");
                        }
                    }
                }
            }
            Op::Props(p) => {
                let a = m.addr(p);
                let props = ctx.get_allocation_properties(a).unwrap();
                match m.contains(a, 0) {
                    Some((b, _)) => {
                        let r = &m.live[&b];
                        assert_eq!(
                            (props.memory_type, props.device, props.id, props.page_size),
                            (r.kind, r.device, r.id, r.page),
                            "step {i}"
                        );
                    }
                    None => {
                        assert_eq!(props.memory_type, MemoryType::Unknown, "step {i}");
                        assert_eq!((props.id, props.page_size), (0, 0), "step {i}");
                    }
                }
            }
            Op::Range(p) => {
                let a = m.addr(p);
                match m.contains(a, 0) {
                    Some((b, _)) => assert_eq!(
                        ctx.get_address_range(a).unwrap(),
                        (b, m.live[&b].bytes.len()),
                        "step {i}"
                    ),
                    None => assert_eq!(code(ctx.get_address_range(a)), UNKNOWN, "step {i}"),
                }
            }
            Op::Copy {
                dst,
                src,
                len,
                fit,
                via,
            } => {
                let (d, s) = (m.addr(dst), m.addr(src));
                let len = if fit {
                    len.min(m.room(d)).min(m.room(s))
                } else {
                    len
                };
                let (md, ms) = (m.contains(d, len), m.contains(s, len));
                let outside: Vec<usize> = [(d, md.is_none()), (s, ms.is_none())]
                    .iter()
                    .filter(|o| o.1)
                    .map(|o| o.0)
                    .collect();
                let Some(_guards) = Guards::over(&outside, len) else {
                    continue;
                };
                let got = eng.submit(&ctx, via, |l, ev, w| {
                    l.append_memory_copy(d, s, len, Some(ev), w)
                });
                match (md, ms) {
                    (Some((db, doff)), Some((sb, soff))) => {
                        got.unwrap_or_else(|e| panic!("step {i}: {e}"));
                        // memmove semantics: read the source first.
                        let tmp = m.live[&sb].bytes[soff..soff + len].to_vec();
                        m.live.get_mut(&db).unwrap().bytes[doff..doff + len].copy_from_slice(&tmp);
                    }
                    _ => assert_eq!(code(got), INVALID_ARGUMENT, "step {i}"),
                }
            }
            Op::Fill {
                dst,
                len,
                fit,
                pattern,
                seed,
                via,
            } => {
                let d = m.addr(dst);
                let len = if fit { len.min(m.room(d)) } else { len };
                let pat: Vec<u8> = (0..pattern)
                    .map(|k| seed.wrapping_add(k as u8).wrapping_mul(31))
                    .collect();
                let contained = m.contains(d, len);
                let outside: Vec<usize> = contained.is_none().then_some(d).into_iter().collect();
                let Some(_guards) = Guards::over(&outside, len) else {
                    continue;
                };
                let got = eng.submit(&ctx, via, |l, ev, w| {
                    l.append_memory_fill(d, &pat, len, Some(ev), w)
                });
                if !(pattern.is_power_of_two() && pattern <= 128) {
                    assert_eq!(code(got), INVALID_SIZE, "step {i}");
                } else if let Some((db, off)) = contained {
                    got.unwrap_or_else(|e| panic!("step {i}: {e}"));
                    let bytes = &mut m.live.get_mut(&db).unwrap().bytes[off..off + len];
                    for (k, b) in bytes.iter_mut().enumerate() {
                        *b = pat[k % pattern];
                    }
                } else {
                    assert_eq!(code(got), INVALID_ARGUMENT, "step {i}");
                }
            }
            Op::HostWrite { pick, offset, byte } => {
                if !m.live.is_empty() {
                    // The host may touch the memory only once the devices are done with it.
                    eng.sync();
                    let n = m.live.len();
                    let (&b, r) = m.live.iter_mut().nth(pick % n).unwrap();
                    let o = offset % r.bytes.len();
                    // Inside a live read-write allocation; no work in flight.
                    common::dev_put(&ctx, b + o, &[byte]);
                    r.bytes[o] = byte;
                }
            }
            Op::Sync => {
                eng.sync();
                check_all(&rt, &ctx, &mut m, i);
            }
        }
        // After every step: the bookkeeping and the capacity (a deferred free may still hold
        // capacity until the work that references it finishes).
        let s = rt.driver().usm_stats();
        assert_eq!(s.allocations, m.live.len(), "step {i}");
        assert_eq!(
            s.allocated_bytes,
            m.live.values().map(|r| r.bytes.len()).sum::<usize>(),
            "step {i}"
        );
        for (k, d) in devs.iter().enumerate() {
            let u = d.used_memory();
            assert!(
                u >= m.used[k] && u <= m.used[k] + m.deferred[k],
                "step {i}: device {k} uses {u:#x}, model {:#x} (+{:#x} deferred)",
                m.used[k],
                m.deferred[k]
            );
        }
    }
    eng.sync();
    check_all(&rt, &ctx, &mut m, usize::MAX);
    drop(eng);
    drop(ctx);
    assert_eq!(rt.driver().usm_stats(), hetmem::UsmStats::default());
    assert_eq!(rt.driver().pending_frees(), 0);
    assert!(devs.iter().all(|d| d.used_memory() == 0));
}

/// 256 cases on the host backend; 16 on cuda, where every check of contents is a device copy.
fn cases() -> u32 {
    if common::on_cuda() {
        16
    } else {
        256
    }
}

proptest! {
    #![proptest_config(Config { cases: cases(), failure_persistence: None, ..Config::default() })]

    #[test]
    fn usm_copies_fills_and_free_policies_match_the_reference_model(
        ops in proptest::collection::vec(op(), 1..100)
    ) {
        if common::skip() {
            return Ok(());
        }
        run(ops);
    }
}

/// A fixed sequence that the random ones may miss: free-now, blocking and deferred frees of
/// memory that queued copies still read, then a synchronize and the contents check.
#[test]
fn frees_of_every_policy_under_queued_copies_match_the_model() {
    if common::skip() {
        return;
    }
    use Op::*;
    let p = |pick| Ptr {
        pick,
        offset: 0,
        dead: false,
    };
    let mut ops = Vec::new();
    for k in 0..3u8 {
        ops.push(Alloc {
            kind: k,
            size: 65536,
            align: 0,
            relaxed: false,
        });
    }
    ops.push(Fill {
        dst: p(0),
        len: 65536,
        fit: false,
        pattern: 4,
        seed: 9,
        via: 0,
    });
    for (policy, via) in [(0u32, 1u8), (1, 2), (2, 0)] {
        ops.push(Alloc {
            kind: 0,
            size: 65536,
            align: 0,
            relaxed: false,
        });
        ops.push(Copy {
            dst: p(1),
            src: p(0),
            len: 65536,
            fit: false,
            via,
        });
        ops.push(Free {
            pick: 0,
            interior: false,
            stype: 0x10009,
            policy,
        });
    }
    ops.push(Sync);
    run(ops);
}
