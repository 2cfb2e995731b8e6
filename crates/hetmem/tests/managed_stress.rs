//! Host threads write and read their own bytes of managed memory without pause while pages are
//! migrated under them (prefetches each way, device copies of the range onto itself, read-mostly
//! advice set and unset, evictions from a small device). No write may be lost and no read may
//! see a stale value: every thread checks each value it wrote when it next reads it.

mod common;

/// Why this file runs on the host backend only.
const HOST_ONLY: &str =
    "it races host writes against the host backend's software UVM engine (userfaultfd faults, \
     evictions from a modelled device of 4 pages, and counts them in managed_stats); on cuda \
     the driver migrates cuMemAllocManaged pages itself, the device is the whole GPU (no \
     eviction) and host faults are not seen by hetmem";

use common::runtime_with;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hetmem::{Advice, Location, MANAGED_PAGE_SIZE as PAGE};

const PAGES: usize = 8;
const THREADS: usize = 4;

#[test]
fn host_writes_survive_concurrent_migration() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let rt = runtime_with(2, (4 * PAGE) as u64);
    let ctx = rt.driver().create_context().unwrap();
    let m = ctx.alloc_managed((PAGES * PAGE) as u64, 1).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                let mut last = [0u64; PAGES];
                while !stop.load(Ordering::Relaxed) || n < 200 {
                    for (p, l) in last.iter_mut().enumerate() {
                        // Thread t owns the u64 at offset 4096 * t + 64 * p of page p.
                        let a = (m + p * PAGE + 4096 * t + 64 * p) as *mut u64;
                        // SAFETY: inside the live allocation; only this thread touches it.
                        let got = unsafe { a.read_volatile() };
                        assert_eq!(got, *l, "thread {t} page {p} lost a write");
                        n += 1;
                        *l = n;
                        // SAFETY: as above.
                        unsafe { a.write_volatile(n) };
                    }
                }
                n
            })
        })
        .collect();
    let s0 = ctx.create_stream(&rt.driver().device(0).unwrap()).unwrap();
    let s1 = ctx.create_stream(&rt.driver().device(1).unwrap()).unwrap();
    let t0 = std::time::Instant::now();
    let mut i = 0usize;
    while t0.elapsed() < std::time::Duration::from_millis(1500) {
        let p = m + (i % PAGES) * PAGE;
        let n = 1 + i % 3;
        let len = n.min(PAGES - i % PAGES) * PAGE;
        match i % 6 {
            0 => ctx
                .mem_prefetch(p, len, Location::Device(0), 0, &s0)
                .unwrap(),
            1 => ctx
                .mem_prefetch(m, PAGES * PAGE, Location::Device(1), 0, &s1)
                .unwrap(),
            2 => s0.memcpy_async(p, p, len).unwrap(),
            3 => ctx.mem_prefetch(p, len, Location::Host, 0, &s1).unwrap(),
            4 => ctx
                .mem_advise(p, len, Advice::SetReadMostly, Location::Host)
                .unwrap(),
            _ => ctx
                .mem_advise(p, len, Advice::UnsetReadMostly, Location::Device(1))
                .unwrap(),
        }
        if i.is_multiple_of(4) {
            s0.synchronize().unwrap();
            s1.synchronize().unwrap();
        }
        i += 1;
    }
    s0.synchronize().unwrap();
    s1.synchronize().unwrap();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        assert!(w.join().unwrap() >= 200);
    }
    let st = rt.driver().managed_stats();
    println!("{i} operations; {st:?}");
    assert!(
        st.host_faults > 50 && st.devices[0].pages_to_device > 50,
        "{st:?}"
    );
    assert!(st.devices.iter().all(|d| d.resident_pages <= 4));
}
