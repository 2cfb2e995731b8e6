//! The host backend's sequential-fault prefetcher: when host faults on managed memory come in
//! address order, the bytes of the next page are staged (copied to the host) while the faulting
//! page's page-table entries are installed, and that page's own fault then only maps them. These
//! tests check that staging changes nothing a program can see: every page still faults once and
//! counts as moved at its own fault, residency, device room and attributes are untouched until
//! then, staging stops at the allocation's end, skips pages it must not copy, and a device write
//! after staging is never lost. Speed is the benchmark's business (`hetmem bench managed`).

mod common;

use common::{byte, context_with, scalars, stream, Rng};

use hetmem::{Advice, Context, Location, Runtime, MANAGED_PAGE_SIZE as PAGE};

/// `n` managed pages, page `i` filled with `i + 1`, all prefetched to device 0.
/// Staging is a mechanism of the host backend's software UVM engine: on another backend this
/// file says so once, loudly, and every test returns.
fn host_engine_only() -> bool {
    common::file_not_applicable(
        "staging is a mechanism of the host backend's software UVM engine (userfaultfd); on \
         cuda the driver migrates managed pages itself",
    )
}

fn pages_on_device(rt: &Runtime, ctx: &Context, n: usize) -> usize {
    let m = ctx.alloc_managed((n * PAGE) as u64, 1).unwrap();
    for i in 0..n {
        ctx.managed_memset(m + i * PAGE, i as u8 + 1, PAGE).unwrap();
    }
    let s = stream(rt, ctx, 0);
    ctx.mem_prefetch(m, n * PAGE, Location::Device(0), 0, &s)
        .unwrap();
    s.synchronize().unwrap();
    m
}

fn put(p: usize, v: u8) {
    // SAFETY: the tests pass addresses inside live managed allocations.
    unsafe { (p as *mut u8).write_volatile(v) }
}

#[test]
fn a_walk_in_order_stages_each_next_page_and_every_page_still_faults_once() {
    if host_engine_only() {
        return;
    }
    let (rt, ctx) = context_with(1, 64 << 20);
    let n = 8;
    let m = pages_on_device(&rt, &ctx, n);
    let before = rt.driver().managed_stats();
    for i in 0..n {
        for off in [0, 4096, PAGE / 2, PAGE - 1] {
            assert_eq!(byte(m + i * PAGE + off), i as u8 + 1, "page {i} +{off:#x}");
        }
    }
    let after = rt.driver().managed_stats();
    // Faults 0 and 1 build the history; faults 1..n-2 each stage the page after them; the last
    // fault has no page after it in the allocation.
    assert_eq!(after.pages_staged - before.pages_staged, (n - 2) as u64);
    assert_eq!(
        after.staged_installs - before.staged_installs,
        (n - 2) as u64
    );
    assert_eq!(after.host_faults - before.host_faults, n as u64);
    assert_eq!(after.pages_to_host - before.pages_to_host, n as u64);
    assert_eq!(
        after.bytes_to_host - before.bytes_to_host,
        (n * PAGE) as u64
    );
    assert_eq!(after.devices[0].pages_from_device, n as u64);
    assert_eq!(after.devices[0].resident_pages, 0);
    assert_eq!(after.host_resident_pages, n as u64);
}

#[test]
fn a_staged_page_stays_on_its_device_with_counters_room_and_attributes_unchanged() {
    if host_engine_only() {
        return;
    }
    let (rt, ctx) = context_with(1, 64 << 20);
    let n = 4;
    let m = pages_on_device(&rt, &ctx, n);
    let dev = rt.driver().device(0).unwrap();
    let used = dev.used_memory();
    let attrs = scalars(&ctx, m + 2 * PAGE, PAGE);
    let before = rt.driver().managed_stats();
    assert_eq!(byte(m), 1);
    assert_eq!(byte(m + PAGE), 2); // in order: page 2 is staged
    let st = rt.driver().managed_stats();
    assert_eq!(st.pages_staged - before.pages_staged, 1);
    assert_eq!(st.staged_installs, before.staged_installs);
    // Page 2 has not moved: still on the device only, charged there, not counted as moved.
    let r = ctx.managed_residency(m + 2 * PAGE).unwrap();
    assert_eq!(r.devices, vec![0]);
    assert!(!r.host);
    assert_eq!(st.pages_to_host - before.pages_to_host, 2);
    assert_eq!(st.host_resident_pages - before.host_resident_pages, 2);
    assert_eq!(st.devices[0].resident_pages, (n - 2) as u64);
    assert_eq!(dev.used_memory(), used - 2 * PAGE as u64);
    assert_eq!(scalars(&ctx, m + 2 * PAGE, PAGE), attrs);
    // Its fault then moves it, from the staged bytes.
    assert_eq!(byte(m + 2 * PAGE + 77), 3);
    let st = rt.driver().managed_stats();
    assert_eq!(st.staged_installs - before.staged_installs, 1);
    assert_eq!(st.pages_to_host - before.pages_to_host, 3);
    assert_eq!(dev.used_memory(), used - 3 * PAGE as u64);
    assert_eq!(scalars(&ctx, m + 2 * PAGE, PAGE), attrs);
}

#[test]
fn staging_stops_at_the_end_of_the_allocation() {
    if host_engine_only() {
        return;
    }
    let (rt, ctx) = context_with(1, 64 << 20);
    let a = pages_on_device(&rt, &ctx, 3);
    let b = pages_on_device(&rt, &ctx, 3);
    let before = rt.driver().managed_stats();
    for i in 0..3 {
        assert_eq!(byte(a + i * PAGE), i as u8 + 1);
    }
    // Page 2 of `a` was staged at fault 1; fault 2 has no next page in `a`.
    let st = rt.driver().managed_stats();
    assert_eq!(st.pages_staged - before.pages_staged, 1);
    // Whatever follows `a` in memory (`b` may), nothing of it was staged: `b`'s first fault
    // copies its bytes.
    for i in 0..3 {
        assert_eq!(
            ctx.managed_residency(b + i * PAGE).unwrap().devices,
            vec![0]
        );
    }
    assert_eq!(byte(b), 1);
    let st2 = rt.driver().managed_stats();
    assert_eq!(st2.staged_installs, st.staged_installs);
    assert_eq!(st2.pages_staged, st.pages_staged);
}

#[test]
fn random_order_faults_stage_only_after_an_in_order_pair_and_read_the_right_bytes() {
    if host_engine_only() {
        return;
    }
    let (rt, ctx) = context_with(1, 128 << 20);
    let n = 32;
    let m = pages_on_device(&rt, &ctx, n);
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = Rng(13);
    for i in (1..n).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let pairs = order.windows(2).filter(|w| w[1] == w[0] + 1).count() as u64;
    let before = rt.driver().managed_stats();
    for &i in &order {
        assert_eq!(byte(m + i * PAGE + 4095), i as u8 + 1, "page {i}");
        put(m + i * PAGE + 4095, 0xee);
    }
    let st = rt.driver().managed_stats();
    assert_eq!(st.host_faults - before.host_faults, n as u64);
    assert_eq!(st.pages_to_host - before.pages_to_host, n as u64);
    assert!(st.pages_staged - before.pages_staged <= pairs);
    for i in 0..n {
        let mut out = [0u8; 3];
        ctx.managed_read(m + i * PAGE + 4094, &mut out).unwrap();
        assert_eq!(out, [i as u8 + 1, 0xee, i as u8 + 1], "page {i}");
    }
}

/// A device write to a staged page (a fill, a copy, launched work, a move to another device)
/// discards the staged bytes: the host then reads what the device wrote.
#[test]
fn device_writes_after_staging_are_never_lost() {
    if host_engine_only() {
        return;
    }
    let (rt, ctx) = context_with(2, 64 << 20);
    let s0 = stream(&rt, &ctx, 0);
    let s1 = stream(&rt, &ctx, 1);
    let src = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    ctx.managed_memset(src, 0x77, PAGE).unwrap();
    for case in 0..4u8 {
        let n = 4;
        let m = pages_on_device(&rt, &ctx, n);
        assert_eq!(byte(m), 1);
        let staged = rt.driver().managed_stats().pages_staged;
        assert_eq!(byte(m + PAGE), 2);
        assert_eq!(
            rt.driver().managed_stats().pages_staged,
            staged + 1,
            "case {case}"
        );
        let p2 = m + 2 * PAGE;
        let want = match case {
            0 => {
                s0.memset_async(p2 + 100, 0x40, 10).unwrap();
                0x40
            }
            1 => {
                s0.memcpy_async(p2 + 100, src, 10).unwrap();
                0x77
            }
            2 => {
                s0.launch(&[(p2, PAGE, true)], |b| {
                    // SAFETY: the buffer is the page, mapped on the device while the work runs.
                    unsafe { b[0].ptr.add(100).write_bytes(0x41, 10) }
                })
                .unwrap();
                0x41
            }
            _ => {
                // Moved to another device, then written there.
                ctx.mem_prefetch(p2, PAGE, Location::Device(1), 0, &s1)
                    .unwrap();
                s1.memset_async(p2 + 100, 0x42, 10).unwrap();
                0x42
            }
        };
        s0.synchronize().unwrap();
        s1.synchronize().unwrap();
        let installs = rt.driver().managed_stats().staged_installs;
        assert_eq!(byte(p2 + 100), want, "case {case}");
        assert_eq!(byte(p2 + 109), want, "case {case}");
        assert_eq!(byte(p2 + 110), 3, "case {case}");
        assert_eq!(byte(p2 + 99), 3, "case {case}");
        // The stale staged bytes were not used.
        assert_eq!(
            rt.driver().managed_stats().staged_installs,
            installs,
            "case {case}"
        );
        ctx.free_managed(m).unwrap();
    }
}

#[test]
fn read_mostly_and_pinned_pages_are_not_staged() {
    if host_engine_only() {
        return;
    }
    let (rt, ctx) = context_with(1, 64 << 20);
    let n = 4;
    let m = pages_on_device(&rt, &ctx, n);
    // Page 2 read-mostly with its only copy on the device (a device write dropped the host's).
    ctx.mem_advise(m + 2 * PAGE, PAGE, Advice::SetReadMostly, Location::Host)
        .unwrap();
    let s = stream(&rt, &ctx, 0);
    s.memset_async(m + 2 * PAGE + 1, 3, 1).unwrap();
    s.synchronize().unwrap();
    let r = ctx.managed_residency(m + 2 * PAGE).unwrap();
    assert!(!r.host && r.devices == vec![0]);
    let before = rt.driver().managed_stats();
    assert_eq!(byte(m), 1);
    assert_eq!(byte(m + PAGE), 2);
    assert_eq!(
        rt.driver().managed_stats().pages_staged,
        before.pages_staged
    );
    // Launched work holding page 3 while the host walks up to it: not staged either.
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (in_tx, in_rx) = std::sync::mpsc::channel::<()>();
    s.launch(&[(m + 3 * PAGE, PAGE, true)], move |b| {
        in_tx.send(()).unwrap();
        go_rx.recv().unwrap();
        // SAFETY: the buffer is the page, mapped on the device while the work runs.
        unsafe { b[0].ptr.write(0x55) }
    })
    .unwrap();
    in_rx.recv().unwrap();
    assert_eq!(byte(m + 2 * PAGE), 3); // in order after page 1; page 3 is pinned
    assert_eq!(
        rt.driver().managed_stats().pages_staged,
        before.pages_staged
    );
    go_tx.send(()).unwrap();
    s.synchronize().unwrap();
    assert_eq!(byte(m + 3 * PAGE), 0x55);
    assert_eq!(byte(m + 3 * PAGE + 1), 4);
}

/// Threads walking their own allocations in order at once, with devices writing pages ahead of
/// them: every byte read is the last one written.
#[test]
fn concurrent_walks_with_device_writes_ahead_read_the_last_bytes_written() {
    if host_engine_only() {
        return;
    }
    let (rt, ctx) = context_with(2, 256 << 20);
    let n = 12;
    let allocs: Vec<usize> = (0..3).map(|_| pages_on_device(&rt, &ctx, n)).collect();
    let ctx = std::sync::Arc::new(ctx);
    let rt = std::sync::Arc::new(rt);
    let hs: Vec<_> = allocs
        .iter()
        .enumerate()
        .map(|(t, &m)| {
            let (ctx, rt) = (ctx.clone(), rt.clone());
            std::thread::spawn(move || {
                let s = stream(&rt, &ctx, (t % 2) as u32);
                for i in 0..n {
                    let want_8 = if i > 0 && (i - 1) % 3 == 0 {
                        0xc0 + (i - 1) as u8
                    } else {
                        i as u8 + 1
                    };
                    assert_eq!(byte(m + i * PAGE), i as u8 + 1, "thread {t} page {i}");
                    assert_eq!(byte(m + i * PAGE + 8), want_8, "thread {t} page {i}");
                    // The device writes the next page, which this fault may have staged, before
                    // the walk gets there.
                    if i + 1 < n && i % 3 == 0 {
                        s.memset_async(m + (i + 1) * PAGE + 8, 0xc0 + i as u8, 1)
                            .unwrap();
                        s.synchronize().unwrap();
                    }
                    put(m + i * PAGE + 9, 0xd0);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    for &m in &allocs {
        for i in 0..n {
            assert_eq!(byte(m + i * PAGE + 9), 0xd0);
            assert_eq!(byte(m + i * PAGE + 10), i as u8 + 1);
        }
    }
    let st = rt.driver().managed_stats();
    assert!(st.pages_staged > 0);
}
