//! `free_managed` with stream work still queued on the allocation: the free waits until the
//! work has run (no lock held meanwhile), so the stream's synchronize succeeds.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::{context_with, stream};
use hetmem::{Location, MANAGED_PAGE_SIZE as PAGE};

#[test]
fn free_managed_waits_for_queued_stream_work_on_the_allocation() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = context_with(2, 64 << 20);
    let Ok(m) = ctx.alloc_managed(4 * PAGE as u64, 1) else {
        // Past the test harness's capture, so the skip shows in a passing run too.
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!("SKIP: managed memory unavailable here"),
        );
        let _ = std::io::Write::write_all(&mut std::io::stderr(), b"\n");
        return;
    };
    let s = stream(&rt, &ctx, 0);
    // Work that cannot run until the test lets it: the prefetch and fill behind it stay queued.
    let (go_tx, go_rx) = mpsc::channel::<()>();
    s.launch(&[(m, PAGE, false)], move |_| {
        go_rx.recv().unwrap();
    })
    .unwrap();
    ctx.mem_prefetch(m, 4 * PAGE, Location::Device(0), 0, &s)
        .unwrap();
    s.memset_async(m, 0x5a, 4 * PAGE).unwrap();
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::scope(|sc| {
        sc.spawn(|| done_tx.send(ctx.free_managed(m)).unwrap());
        // The free is waiting: nothing has run yet, so it must not have returned.
        assert!(done_rx.recv_timeout(Duration::from_millis(300)).is_err());
        // No lock is held while it waits: other managed calls proceed.
        assert!(ctx.is_managed(m));
        let other = ctx.alloc_managed(PAGE as u64, 1).unwrap();
        ctx.free_managed(other).unwrap();
        go_tx.send(()).unwrap();
        done_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the free returns once the work has run")
            .unwrap();
    });
    s.synchronize().unwrap();
    assert!(!ctx.is_managed(m));
    // After the free, queueing work on it is refused at once.
    assert_eq!(s.memset_async(m, 1, PAGE).unwrap_err().acl_error(), 107_000);
    assert_eq!(rt.driver().managed_stats().allocations, 0);
}

#[test]
fn free_managed_with_queued_work_from_four_threads_always_synchronizes() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = context_with(2, 64 << 20);
    if ctx
        .alloc_managed(PAGE as u64, 1)
        .map(|p| ctx.free_managed(p))
        .is_err()
    {
        // Past the test harness's capture, so the skip shows in a passing run too.
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!("SKIP: managed memory unavailable here"),
        );
        let _ = std::io::Write::write_all(&mut std::io::stderr(), b"\n");
        return;
    }
    // Two devices on the host backend; on cuda the machine's GPUs.
    let devices = rt.driver().device_list().len() as u32;
    std::thread::scope(|sc| {
        for t in 0..4u32 {
            let (rt, ctx) = (&rt, &ctx);
            let d = t % devices;
            sc.spawn(move || {
                let s = stream(rt, ctx, d);
                for _ in 0..10 {
                    let m = ctx.alloc_managed(2 * PAGE as u64, 1).unwrap();
                    ctx.mem_prefetch(m, 2 * PAGE, Location::Device(d), 0, &s)
                        .unwrap();
                    s.memset_async(m, 1, 2 * PAGE).unwrap();
                    ctx.mem_prefetch(m, 2 * PAGE, Location::Host, 0, &s)
                        .unwrap();
                    ctx.free_managed(m).unwrap();
                    s.synchronize().unwrap();
                }
            });
        }
    });
    assert_eq!(rt.driver().managed_stats().allocations, 0);
}
