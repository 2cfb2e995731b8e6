//! Model-based property test of managed memory: random interleavings of host reads and writes
//! from several threads, device fills and copies on several devices, prefetches and advice,
//! against a flat reference memory and a model of residency (with LRU eviction on small
//! devices). After every step: the contents equal the reference (read without migrating), every
//! page lives exactly where the model says, and the host-fault counter moved by exactly the
//! model's prediction.

use std::collections::BTreeSet;

use hetmem::{Advice, Context, Location, Runtime, Stream, MANAGED_PAGE_SIZE as PAGE};
use proptest::prelude::*;

const PAGES: usize = 6;
const DEVICES: usize = 2;
const CAP_PAGES: usize = 3;
const SIZE: usize = PAGES * PAGE;

#[derive(Debug, Clone)]
enum Op {
    /// Several threads each read one byte (all reads: the fault count does not depend on the
    /// order).
    HostRead(Vec<(usize, usize)>),
    /// Several threads each write one byte (pages may repeat).
    HostWrite(Vec<(usize, usize, u8)>),
    Fill {
        dev: usize,
        start: usize,
        len: usize,
        val: u8,
    },
    Copy {
        dev: usize,
        dst: usize,
        src: usize,
        len: usize,
    },
    Prefetch {
        to: Option<usize>,
        page: usize,
        n: usize,
    },
    SetReadMostly {
        page: usize,
        n: usize,
    },
    UnsetReadMostly {
        to: Option<usize>,
        page: usize,
        n: usize,
    },
    /// `None`: the host. May be refused (pages mapped elsewhere, or the range too big).
    SetPreferred {
        to: Option<usize>,
        page: usize,
        n: usize,
    },
    UnsetPreferred {
        page: usize,
        n: usize,
    },
    SetAccessedBy {
        to: Option<usize>,
        page: usize,
        n: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let off = 0..PAGE;
    let page = 0..PAGES;
    prop_oneof![
        prop::collection::vec((page.clone(), off.clone()), 1..5).prop_map(Op::HostRead),
        prop::collection::vec((page.clone(), off.clone(), any::<u8>()), 1..5)
            .prop_map(Op::HostWrite),
        (0..DEVICES, 0..SIZE, 1..3 * PAGE, any::<u8>()).prop_map(|(dev, start, len, val)| {
            Op::Fill {
                dev,
                start,
                len: len.min(SIZE - start),
                val,
            }
        }),
        (0..DEVICES, 0..SIZE, 0..SIZE, 1..2 * PAGE).prop_map(|(dev, dst, src, len)| {
            let len = len.min(SIZE - dst).min(SIZE - src);
            Op::Copy { dev, dst, src, len }
        }),
        (prop::option::of(0..DEVICES), page.clone(), 1..PAGES).prop_map(|(to, page, n)| {
            Op::Prefetch {
                to,
                page,
                n: n.min(PAGES - page),
            }
        }),
        (page.clone(), 1..3usize).prop_map(|(page, n)| Op::SetReadMostly {
            page,
            n: n.min(PAGES - page)
        }),
        (prop::option::of(0..DEVICES), page.clone(), 1..3usize).prop_map(|(to, page, n)| {
            Op::UnsetReadMostly {
                to,
                page,
                n: n.min(PAGES - page),
            }
        }),
        (prop::option::of(0..DEVICES), page.clone(), 1..5usize).prop_map(|(to, page, n)| {
            Op::SetPreferred {
                to,
                page,
                n: n.min(PAGES - page),
            }
        }),
        (page.clone(), 1..3usize).prop_map(|(page, n)| Op::UnsetPreferred {
            page,
            n: n.min(PAGES - page)
        }),
        (prop::option::of(0..DEVICES), page, 1..3usize).prop_map(|(to, page, n)| {
            Op::SetAccessedBy {
                to,
                page,
                n: n.min(PAGES - page),
            }
        }),
    ]
}

/// The model of one page: where its copies are.
#[derive(Debug, Clone, Default)]
struct MPage {
    host: Option<bool>, // Some(read_only)
    devs: [bool; DEVICES],
    tick: [u64; DEVICES],
    rm: bool,
    /// `Some(None)`: prefers the host; `Some(Some(d))`: device d.
    preferred: Option<Option<usize>>,
    accessed_by: BTreeSet<Option<usize>>,
}

#[derive(Debug, Default)]
struct Model {
    pages: Vec<MPage>,
    tick: u64,
    faults: u64,
}

impl Model {
    fn copies(&self, p: usize) -> usize {
        let pg = &self.pages[p];
        pg.host.is_some() as usize + pg.devs.iter().filter(|&&x| x).count()
    }
    fn ensure_host(&mut self, p: usize, write: bool) -> bool {
        let pg = &mut self.pages[p];
        if let Some(ro) = pg.host {
            if write && ro {
                pg.devs = [false; DEVICES];
                pg.host = Some(false);
                return true;
            }
            return false;
        }
        let exclusive = write || !pg.rm;
        pg.host = Some(!exclusive);
        if exclusive {
            pg.devs = [false; DEVICES];
        }
        true
    }
    fn take_slot(&mut self, d: usize, keep: &[usize]) {
        loop {
            let used = self.pages.iter().filter(|p| p.devs[d]).count();
            if used < CAP_PAGES {
                return;
            }
            let candidates = |skip_preferring: bool| {
                (0..PAGES)
                    .filter(|&p| self.pages[p].devs[d] && !keep.contains(&p))
                    .filter(|&p| !skip_preferring || self.pages[p].preferred != Some(Some(d)))
                    .min_by_key(|&p| self.pages[p].tick[d])
            };
            let victim = candidates(true)
                .or_else(|| candidates(false))
                .expect("a page to evict");
            if self.copies(victim) == 1 {
                self.pages[victim].host = Some(false);
            }
            self.pages[victim].devs[d] = false;
        }
    }
    fn ensure_device(&mut self, p: usize, d: usize, write: bool, keep: &[usize]) {
        let exclusive = write || !self.pages[p].rm;
        if !self.pages[p].devs[d] {
            self.take_slot(d, keep);
            let pg = &mut self.pages[p];
            if pg.host == Some(false) && !exclusive {
                pg.host = Some(true);
            }
            pg.devs[d] = true;
        }
        let pg = &mut self.pages[p];
        if exclusive {
            pg.host = None;
            for e in 0..DEVICES {
                if e != d {
                    pg.devs[e] = false;
                }
            }
        }
        self.tick += 1;
        self.pages[p].tick[d] = self.tick;
    }
    fn ensure_at(&mut self, p: usize, to: Option<usize>, write: bool) {
        match to {
            Some(d) => self.ensure_device(p, d, write, &[p]),
            None => {
                self.ensure_host(p, write);
            }
        }
    }
    /// Device operation over operands (byte offset, write), in page segments as the runtime
    /// cuts them.
    fn device_op(&mut self, d: usize, ops: &[(usize, bool)], len: usize, backward: bool) {
        let mut cuts = vec![0, len];
        for &(a, _) in ops {
            let mut c = PAGE - a % PAGE;
            while c < len {
                cuts.push(c);
                c += PAGE;
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        let mut segs: Vec<usize> = cuts[..cuts.len() - 1].to_vec();
        if backward {
            segs.reverse();
        }
        for s in segs {
            let keep: Vec<usize> = ops.iter().map(|&(a, _)| (a + s) / PAGE).collect();
            for (i, &(_, w)) in ops.iter().enumerate() {
                if !w {
                    self.ensure_device(keep[i], d, false, &keep);
                }
            }
            for (i, &(_, w)) in ops.iter().enumerate() {
                if w {
                    self.ensure_device(keep[i], d, true, &keep);
                }
            }
        }
    }
}

struct Sut {
    rt: Runtime,
    ctx: Context,
    streams: Vec<Stream>,
    base: usize,
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let rt = Runtime::builder()
        .host_devices(DEVICES as u32)
        .host_device_memory((CAP_PAGES * PAGE) as u64)
        .build()
        .unwrap();
    let ctx = rt.driver().create_context().unwrap();
    let base = ctx.alloc_managed(SIZE as u64, 1).unwrap();
    let streams = (0..DEVICES as u32)
        .map(|d| ctx.create_stream(&rt.driver().device(d).unwrap()).unwrap())
        .collect();
    let sut = Sut {
        rt,
        ctx,
        streams,
        base,
    };
    let mut reference = vec![0u8; SIZE];
    let mut model = Model {
        pages: vec![MPage::default(); PAGES],
        ..Default::default()
    };
    let mut peek = vec![0u8; SIZE];
    for (step, op) in ops.into_iter().enumerate() {
        let before = sut.rt.driver().managed_stats().host_faults;
        let b = sut.base;
        match &op {
            Op::HostRead(reads) => {
                let hs: Vec<_> = reads
                    .iter()
                    .map(|&(p, o)| {
                        let a = b + p * PAGE + o;
                        // SAFETY: inside the live allocation.
                        std::thread::spawn(move || unsafe { (a as *const u8).read_volatile() })
                    })
                    .collect();
                for (h, &(p, o)) in hs.into_iter().zip(reads) {
                    prop_assert_eq!(h.join().unwrap(), reference[p * PAGE + o], "step {}", step);
                }
                let pages: BTreeSet<usize> = reads.iter().map(|r| r.0).collect();
                for p in pages {
                    model.faults += model.ensure_host(p, false) as u64;
                }
            }
            Op::HostWrite(writes) => {
                // One byte per thread; a byte written by two threads keeps the last in order.
                let mut last = std::collections::BTreeMap::new();
                for &(p, o, v) in writes {
                    last.insert((p, o), v);
                }
                let hs: Vec<_> = last
                    .iter()
                    .map(|(&(p, o), &v)| {
                        let a = b + p * PAGE + o;
                        // SAFETY: inside the live allocation; distinct bytes per thread.
                        std::thread::spawn(move || unsafe { (a as *mut u8).write_volatile(v) })
                    })
                    .collect();
                for h in hs {
                    h.join().unwrap();
                }
                for (&(p, o), &v) in &last {
                    reference[p * PAGE + o] = v;
                }
                let pages: BTreeSet<usize> = last.keys().map(|k| k.0).collect();
                for p in pages {
                    model.faults += model.ensure_host(p, true) as u64;
                }
            }
            &Op::Fill {
                dev,
                start,
                len,
                val,
            } => {
                sut.streams[dev].memset_async(b + start, val, len).unwrap();
                sut.streams[dev].synchronize().unwrap();
                reference[start..start + len].fill(val);
                model.device_op(dev, &[(start, true)], len, false);
            }
            &Op::Copy { dev, dst, src, len } => {
                sut.streams[dev]
                    .memcpy_async(b + dst, b + src, len)
                    .unwrap();
                sut.streams[dev].synchronize().unwrap();
                reference.copy_within(src..src + len, dst);
                model.device_op(
                    dev,
                    &[(dst, true), (src, false)],
                    len,
                    dst > src && dst < src + len,
                );
            }
            &Op::Prefetch { to, page, n } => {
                let loc = to.map_or(Location::Host, |d| Location::Device(d as u32));
                sut.ctx
                    .mem_prefetch(b + page * PAGE, n * PAGE, loc, 0, &sut.streams[0])
                    .unwrap();
                sut.streams[0].synchronize().unwrap();
                for p in page..page + n {
                    model.ensure_at(p, to, false);
                }
            }
            &Op::SetReadMostly { page, n } => {
                sut.ctx
                    .mem_advise(
                        b + page * PAGE,
                        n * PAGE,
                        Advice::SetReadMostly,
                        Location::Host,
                    )
                    .unwrap();
                for p in page..page + n {
                    let pg = &mut model.pages[p];
                    pg.rm = true;
                    pg.host = Some(true);
                }
            }
            Op::SetPreferred { .. } => {} // applied and checked below, with its refusal rules
            &Op::UnsetPreferred { page, n } => {
                sut.ctx
                    .mem_advise(
                        b + page * PAGE,
                        n * PAGE,
                        Advice::UnsetPreferredLocation,
                        Location::Host,
                    )
                    .unwrap();
                for p in page..page + n {
                    model.pages[p].preferred = None;
                }
            }
            &Op::SetAccessedBy { to, page, n } => {
                let loc = to.map_or(Location::Host, |d| Location::Device(d as u32));
                sut.ctx
                    .mem_advise(b + page * PAGE, n * PAGE, Advice::SetAccessedBy, loc)
                    .unwrap();
                for p in page..page + n {
                    model.pages[p].accessed_by.insert(to);
                    if model.pages[p].preferred == Some(to) {
                        model.ensure_at(p, to, false);
                    }
                }
            }
            &Op::UnsetReadMostly { to, page, n } => {
                let loc = to.map_or(Location::Invalid, |d| Location::Device(d as u32));
                sut.ctx
                    .mem_advise(b + page * PAGE, n * PAGE, Advice::UnsetReadMostly, loc)
                    .unwrap();
                for p in page..page + n {
                    if model.pages[p].rm {
                        model.pages[p].rm = false;
                        if model.copies(p) > 0 {
                            model.ensure_at(p, to, true);
                        }
                    }
                }
            }
        }
        if let Op::SetPreferred { to, page, n } = op {
            let range: Vec<usize> = (page..page + n).collect();
            let refused = range.iter().any(|&p| {
                let pg = &model.pages[p];
                !pg.rm
                    && match to {
                        None => pg.devs.iter().any(|&x| x),
                        Some(d) => pg.host.is_some() || (0..DEVICES).any(|e| e != d && pg.devs[e]),
                    }
            });
            // The whole range must fit on the device at once.
            let too_big = to.is_some() && n > CAP_PAGES;
            let loc = to.map_or(Location::Host, |d| Location::Device(d as u32));
            let r =
                sut.ctx
                    .mem_advise(b + page * PAGE, n * PAGE, Advice::SetPreferredLocation, loc);
            prop_assert_eq!(
                r.is_err(),
                refused || too_big,
                "step {} {:?}: {:?}",
                step,
                op,
                r
            );
            if r.is_ok() {
                for &p in &range {
                    model.pages[p].preferred = Some(to);
                    match to {
                        None if !model.pages[p].rm => {
                            model.ensure_host(p, false);
                        }
                        Some(d) => model.ensure_device(p, d, false, &range),
                        None => {}
                    }
                }
            }
        }
        let st = sut.rt.driver().managed_stats();
        prop_assert_eq!(
            st.host_faults - before,
            {
                let f = model.faults;
                model.faults = 0;
                f
            },
            "host faults at step {} {:?}",
            step,
            op
        );
        sut.ctx.managed_peek(b, &mut peek).unwrap();
        prop_assert!(
            peek == reference,
            "contents differ after step {} {:?}",
            step,
            op
        );
        for (p, mp) in model.pages.iter().enumerate() {
            let r = sut.ctx.managed_residency(b + p * PAGE);
            let want_devs: Vec<u32> = (0..DEVICES)
                .filter(|&d| mp.devs[d])
                .map(|d| d as u32)
                .collect();
            match r {
                None => prop_assert!(
                    mp.host.is_none() && want_devs.is_empty(),
                    "page {} step {}",
                    p,
                    step
                ),
                Some(r) => {
                    prop_assert_eq!(
                        r.host,
                        mp.host.is_some(),
                        "page {} host, step {} {:?}",
                        p,
                        step,
                        op
                    );
                    prop_assert_eq!(
                        r.host_read_only,
                        mp.host == Some(true),
                        "page {} ro, step {} {:?}",
                        p,
                        step,
                        op
                    );
                    prop_assert_eq!(
                        r.devices,
                        want_devs,
                        "page {} devices, step {} {:?}",
                        p,
                        step,
                        op
                    );
                }
            }
        }
        for (p, mp) in model.pages.iter().enumerate() {
            let pref = sut
                .ctx
                .managed_attr_i32(
                    hetmem::RangeAttribute::PreferredLocation,
                    b + p * PAGE,
                    PAGE,
                )
                .unwrap();
            let want = match mp.preferred {
                None => -2,
                Some(None) => -1,
                Some(Some(d)) => d as i32,
            };
            prop_assert_eq!(pref, want, "page {} preferred, step {}", p, step);
            let mut ab = sut.ctx.managed_accessed_by(b + p * PAGE, PAGE, 4).unwrap();
            ab.retain(|&x| x != -2);
            ab.sort_unstable();
            let mut want: Vec<i32> = mp
                .accessed_by
                .iter()
                .map(|l| l.map_or(-1, |d| d as i32))
                .collect();
            want.sort_unstable();
            prop_assert_eq!(ab, want, "page {} accessed-by, step {}", p, step);
        }
        for d in 0..DEVICES {
            let want = model.pages.iter().filter(|p| p.devs[d]).count() as u64;
            prop_assert_eq!(st.devices[d].resident_pages, want);
            prop_assert_eq!(
                sut.rt.driver().device(d as u32).unwrap().used_memory(),
                want * PAGE as u64
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn managed_memory_matches_a_flat_memory_and_the_residency_model(
        ops in prop::collection::vec(op(), 1..24)
    ) {
        run(ops)?;
    }
}

/// The example, as a fixed sequence: prefetch N pages to a device, then touch them
/// from the host: exactly N host faults.
#[test]
fn prefetch_then_touch_gives_exactly_n_faults_in_the_model() {
    run(vec![
        Op::HostWrite(vec![(0, 1, 1), (1, 2, 2), (2, 3, 3)]),
        Op::Prefetch {
            to: Some(1),
            page: 0,
            n: 3,
        },
        Op::HostRead(vec![(0, 1), (1, 2), (2, 3), (0, 5), (2, 9)]),
    ])
    .unwrap();
}
