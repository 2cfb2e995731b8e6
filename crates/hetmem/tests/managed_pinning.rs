//! Launched device work and device copies run without the managed-memory lock: their pages are
//! pinned on the device meanwhile (see "Locking and pinning" in `hetmem::managed`). Host faults
//! elsewhere are not stalled, calls that would move pinned pages wait instead of deadlocking,
//! a host access to a pinned page sees the work's result, and contents stay right under
//! concurrent launches and host faults. Also: `aclrtMemcpy` / `aclrtMemcpyAsync` with one plain
//! (non-managed) side.

mod common;

/// Why the pinning tests do not apply on cuda.
const PINNING: &str =
    "pinning managed pages on the device while launched work runs (and the host faults, moves \
     and frees that wait for it) is the host backend's software UVM engine (userfaultfd, its \
     managed lock and fault counts); on cuda the driver migrates cuMemAllocManaged pages on \
     access and hetmem pins nothing";

use common::runtime_with;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::Duration;

use hetmem::{AllocDesc, BackendKind, Location, Runtime, MANAGED_PAGE_SIZE as PAGE};

fn runtime(device_pages: usize) -> Runtime {
    runtime_with(2, (device_pages * PAGE) as u64)
}

/// Runs `f` on a thread and returns its result, or panics if it has not finished within
/// `secs` (a deadlock; the thread is left behind and the test process fails).
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        tx.send(f()).ok();
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{what} did not finish within {secs} s (deadlock)"))
}

/// A gate for launched work: the work blocks on the receiver until the test sends (or drops).
fn gate() -> (std::sync::mpsc::Sender<()>, Receiver<()>) {
    channel()
}

#[test]
fn host_fault_on_another_allocation_is_not_stalled_by_launched_work() {
    if common::not_applicable_on(BackendKind::Cuda, PINNING) || common::skip() {
        return;
    }
    let rt = runtime(8);
    let ctx = rt.driver().create_context().unwrap();
    let s0 = ctx.create_stream(&rt.driver().device(0).unwrap()).unwrap();
    let s1 = ctx.create_stream(&rt.driver().device(1).unwrap()).unwrap();
    let a = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    let b = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    ctx.managed_memset(b, 3, PAGE).unwrap();
    ctx.mem_prefetch(b, PAGE, Location::Device(0), 0, &s0)
        .unwrap();
    s0.synchronize().unwrap();
    let (started_tx, started) = channel::<()>();
    let (go, go_rx) = gate();
    s1.launch(&[(a, 4096, true)], move |_| {
        started_tx.send(()).ok();
        go_rx.recv().ok(); // the work runs until the test lets it go
    })
    .unwrap();
    started.recv().unwrap();
    let faults = rt.driver().managed_stats().host_faults;
    let t = std::time::Instant::now();
    // The host touches `b` (on device 0) while the work on `a` runs: a fault, resolved now.
    let v = within(5, "a host fault during launched work", move || {
        // SAFETY: inside the live allocation.
        unsafe { (b as *const u8).read_volatile() }
    });
    let took = t.elapsed();
    assert_eq!(v, 3);
    assert_eq!(rt.driver().managed_stats().host_faults, faults + 1);
    // The work is still running (it waits for `go`); the fault did not wait for it.
    assert!(took < Duration::from_millis(500), "the fault took {took:?}");
    go.send(()).unwrap();
    s1.synchronize().unwrap();
}

#[test]
fn calls_on_other_memory_during_launched_work_that_waits_for_the_host_finish() {
    if common::not_applicable_on(BackendKind::Cuda, PINNING) || common::skip() {
        return;
    }
    let rt = runtime(8);
    let ctx = rt.driver().create_context().unwrap();
    let d0 = rt.driver().device(0).unwrap();
    let s = ctx.create_stream(&d0).unwrap();
    let s2 = ctx.create_stream(&d0).unwrap();
    let pinned = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    let other = ctx.alloc_managed((2 * PAGE) as u64, 1).unwrap();
    ctx.managed_memset(other, 9, 2 * PAGE).unwrap();
    let (go, go_rx) = gate();
    // The work waits for the host, which meanwhile uses other managed memory.
    s.launch(&[(pinned, PAGE, true)], move |_| {
        go_rx.recv().ok();
    })
    .unwrap();
    let ctx2 = ctx.clone();
    within(
        10,
        "managed calls while work waits for the host",
        move || {
            ctx2.mem_prefetch(other, PAGE, Location::Device(0), 0, &s2)
                .unwrap();
            s2.synchronize().unwrap();
            s2.memset_async(other + PAGE, 4, PAGE).unwrap();
            s2.synchronize().unwrap();
            let mut b = vec![0u8; 2 * PAGE];
            ctx2.managed_read(other, &mut b).unwrap();
            assert!(b[..PAGE].iter().all(|&x| x == 9));
            assert!(b[PAGE..].iter().all(|&x| x == 4));
            let fresh = ctx2.alloc_managed(PAGE as u64, 1).unwrap();
            ctx2.free_managed(fresh).unwrap();
        },
    );
    go.send(()).unwrap();
    s.synchronize().unwrap();
    // The reviewer's case: empty work waiting on the host, a prefetch queued behind it, the
    // range freed before the prefetch runs. The free waits for the queued prefetch (issue 11,
    // item 3: it used to report 107000 at synchronize), so the host lets the work go from
    // another thread and the synchronize succeeds.
    let m3 = ctx.alloc_managed((4 * PAGE) as u64, 1).unwrap();
    let (go, go_rx) = gate();
    s.launch(&[], move |_| {
        go_rx.recv().ok();
    })
    .unwrap();
    ctx.mem_prefetch(m3, 4 * PAGE, Location::Device(0), 0, &s)
        .unwrap();
    let opener = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        go.send(()).unwrap();
    });
    ctx.free_managed(m3).unwrap();
    opener.join().unwrap();
    s.synchronize().unwrap();
    assert!(!ctx.is_managed(m3));
}

#[test]
fn free_of_memory_in_use_by_launched_work_waits_for_it() {
    if common::not_applicable_on(BackendKind::Cuda, PINNING) || common::skip() {
        return;
    }
    let rt = runtime(8);
    let ctx = rt.driver().create_context().unwrap();
    let s = ctx.create_stream(&rt.driver().device(0).unwrap()).unwrap();
    let m = ctx.alloc_managed((2 * PAGE) as u64, 1).unwrap();
    ctx.managed_memset(m, 1, 2 * PAGE).unwrap();
    let (started_tx, started) = channel::<()>();
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let (go, go_rx) = gate();
    s.launch(&[(m, 2 * PAGE, true)], move |b| {
        started_tx.send(()).ok();
        go_rx.recv().ok();
        // SAFETY: the buffer is the work's, on the device, for its duration.
        unsafe { std::ptr::write_bytes(b[0].ptr, 5, b[0].len) };
        d2.store(true, Ordering::SeqCst);
    })
    .unwrap();
    started.recv().unwrap();
    let ctx2 = ctx.clone();
    let freer = std::thread::spawn(move || {
        ctx2.free_managed(m).unwrap();
    });
    go.send(()).unwrap();
    freer.join().unwrap();
    // The free returned only after the work had written its whole buffer.
    assert!(done.load(Ordering::SeqCst));
    s.synchronize().unwrap();
    assert_eq!(rt.driver().managed_stats().allocations, 0);
    assert_eq!(rt.driver().managed_stats().devices[0].resident_pages, 0);
}

#[test]
fn host_access_to_a_page_in_use_by_launched_work_waits_and_sees_its_result() {
    if common::not_applicable_on(BackendKind::Cuda, PINNING) || common::skip() {
        return;
    }
    let rt = runtime(8);
    let ctx = rt.driver().create_context().unwrap();
    let s = ctx.create_stream(&rt.driver().device(0).unwrap()).unwrap();
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    ctx.managed_memset(m, 1, PAGE).unwrap();
    let events = rt.driver().managed_stats().fault_events;
    let (started_tx, started) = channel::<()>();
    let drv = rt.driver().clone();
    s.launch(&[(m, PAGE, true)], move |b| {
        started_tx.send(()).ok();
        // Wait until the host's fault on the page has arrived (and been deferred).
        while drv.managed_stats().fault_events == events {
            std::thread::yield_now();
        }
        // SAFETY: the buffer is the work's for its duration.
        unsafe { std::ptr::write_bytes(b[0].ptr, 0xAB, b[0].len) };
    })
    .unwrap();
    started.recv().unwrap();
    let v = within(10, "a host read of a pinned page", move || {
        // SAFETY: inside the live allocation.
        unsafe { ((m + 12345) as *const u8).read_volatile() }
    });
    assert_eq!(v, 0xAB, "the host read ran before the work's writes");
    s.synchronize().unwrap();
    let mut b = vec![0u8; PAGE];
    ctx.managed_read(m, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0xAB));
}

/// Two streams on two devices launch work that adds 1 to every byte of their own pages (and
/// copies them around), while host threads write and check their own words in other pages
/// and read the launched pages: every host value and every final byte is what a flat memory
/// would hold.
#[test]
fn contents_stay_right_under_concurrent_launches_and_host_faults() {
    if common::not_applicable_on(BackendKind::Cuda, PINNING) || common::skip() {
        return;
    }
    const DEV_PAGES: usize = 4; // per stream
    const HOST_PAGES: usize = 4;
    const LAUNCHES: usize = 40;
    let rt = runtime(6);
    let ctx = rt.driver().create_context().unwrap();
    let m = ctx
        .alloc_managed(((2 * DEV_PAGES + HOST_PAGES) * PAGE) as u64, 1)
        .unwrap();
    ctx.managed_memset(m, 0, (2 * DEV_PAGES + HOST_PAGES) * PAGE)
        .unwrap();
    let hostbase = m + 2 * DEV_PAGES * PAGE;
    let stop = Arc::new(AtomicBool::new(false));
    let checks = Arc::new(AtomicU64::new(0));
    let hosts: Vec<_> = (0..2)
        .map(|t| {
            let stop = stop.clone();
            let checks = checks.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                let mut last = [0u64; HOST_PAGES];
                while !stop.load(Ordering::Relaxed) || n < 100 {
                    for (p, l) in last.iter_mut().enumerate() {
                        let a = (hostbase + p * PAGE + 4096 * t) as *mut u64;
                        // SAFETY: inside the live allocation; only this thread uses the word.
                        let got = unsafe { a.read_volatile() };
                        assert_eq!(got, *l, "host thread {t} page {p} lost a write");
                        n += 1;
                        *l = n;
                        // SAFETY: as above.
                        unsafe { a.write_volatile(n) };
                    }
                    // Read a word of a launched page: its count only grows.
                    let w = (m + (n as usize % (2 * DEV_PAGES)) * PAGE) as *const u8;
                    // SAFETY: inside the live allocation.
                    let v = unsafe { w.read_volatile() };
                    assert!(v as usize <= LAUNCHES, "page count {v} past {LAUNCHES}");
                    checks.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let streams: Vec<_> = (0..2u32)
        .map(|d| ctx.create_stream(&rt.driver().device(d).unwrap()).unwrap())
        .collect();
    for _ in 0..LAUNCHES {
        for (k, s) in streams.iter().enumerate() {
            let base = m + k * DEV_PAGES * PAGE;
            s.launch(&[(base, DEV_PAGES * PAGE, true)], |b| {
                // SAFETY: the buffer is the work's, on the device, for its duration.
                let buf = unsafe { std::slice::from_raw_parts_mut(b[0].ptr, b[0].len) };
                for x in buf.iter_mut().step_by(512) {
                    *x += 1;
                }
            })
            .unwrap();
            // A device copy of the first page onto itself (no change of contents).
            s.memcpy_async(base, base, PAGE).unwrap();
        }
    }
    for s in &streams {
        s.synchronize().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for h in hosts {
        h.join().unwrap();
    }
    assert!(checks.load(Ordering::Relaxed) > 0);
    let mut b = vec![0u8; 2 * DEV_PAGES * PAGE];
    ctx.managed_read(m, &mut b).unwrap();
    for (i, &x) in b.iter().enumerate() {
        let want = if i % 512 == 0 { LAUNCHES as u8 } else { 0 };
        assert_eq!(x, want, "byte {i:#x}");
    }
}

#[test]
fn host_memcpy_copies_between_managed_and_plain_memory_both_ways() {
    if common::skip() {
        return;
    }
    let rt = runtime(8);
    let ctx = rt.driver().create_context().unwrap();
    let d0 = rt.driver().device(0).unwrap();
    let s = ctx.create_stream(&d0).unwrap();
    let m = ctx.alloc_managed((2 * PAGE) as u64, 1).unwrap();
    ctx.mem_prefetch(m, 2 * PAGE, Location::Device(0), 0, &s)
        .unwrap();
    s.synchronize().unwrap();
    // Plain heap memory -> managed (on a device: migrates to the host).
    let src: Vec<u8> = (0..3 * 4096).map(|i| (i * 7 % 251) as u8).collect();
    ctx.managed_memcpy(m + 100, src.as_ptr() as usize, src.len())
        .unwrap();
    assert!(ctx.managed_residency(m).unwrap().host);
    // Managed -> plain heap memory.
    let mut back = vec![0u8; src.len()];
    ctx.managed_memcpy(back.as_mut_ptr() as usize, m + 100, back.len())
        .unwrap();
    assert_eq!(back, src);
    // USM device and host memory on either side (device memory the host cannot reach, as on
    // cuda, is copied by its device).
    let hv = ctx.alloc_host(&AllocDesc::new(1 << 20)).unwrap();
    let dv = ctx.alloc_device(&d0, &AllocDesc::new(1 << 20)).unwrap();
    ctx.managed_memcpy(dv, m + 100, src.len()).unwrap();
    ctx.managed_memcpy(m + PAGE, dv, src.len()).unwrap();
    ctx.managed_memcpy(hv, m + PAGE, src.len()).unwrap();
    // SAFETY: the host allocation is live and holds src.len() bytes.
    let got = unsafe { std::slice::from_raw_parts(hv as *const u8, src.len()) };
    assert_eq!(got, &src[..]);
    ctx.free_memory(dv).unwrap();
    ctx.free_memory(hv).unwrap();
}

#[test]
fn host_memcpy_with_an_unmapped_or_unwritable_plain_side_is_107000() {
    if common::skip() {
        return;
    }
    let rt = runtime(8);
    let ctx = rt.driver().create_context().unwrap();
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    let pg = 4096usize;
    // SAFETY: a fresh read-only anonymous mapping of our own.
    let ro = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * pg,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    } as usize;
    assert_ne!(ro, libc::MAP_FAILED as usize);
    // SAFETY: our mapping: its second page becomes inaccessible.
    unsafe { libc::mprotect((ro + pg) as *mut _, pg, libc::PROT_NONE) };
    ctx.managed_write(m, &[5u8; 64]).unwrap();
    let e = ctx.managed_memcpy(ro, m, 16).unwrap_err();
    assert_eq!(e.acl_error(), 107_000, "{e}");
    let e = ctx.managed_memcpy(m, ro + pg - 8, 16).unwrap_err();
    assert_eq!(e.acl_error(), 107_000, "{e}");
    assert!(e.to_string().contains(&format!("{:#x}", ro + pg)), "{e}");
    // Read-only memory is a fine source.
    ctx.managed_memcpy(m, ro, 16).unwrap();
    let mut b = [1u8; 16];
    ctx.managed_read(m, &mut b).unwrap();
    assert_eq!(b, [0u8; 16]);
    // Neither side managed.
    let mut x = [0u8; 8];
    let y = [1u8; 8];
    let e = ctx
        .managed_memcpy(x.as_mut_ptr() as usize, y.as_ptr() as usize, 8)
        .unwrap_err();
    assert_eq!(e.acl_error(), 107_000);
    assert_eq!(x, [0u8; 8]);
    // SAFETY: our own mapping.
    unsafe { libc::munmap(ro as *mut _, 2 * pg) };
}

#[test]
fn stream_memcpy_copies_between_managed_and_usm_memory_on_the_streams_device() {
    if common::skip() {
        return;
    }
    let rt = runtime(8);
    if common::fewer_devices_than(&rt, 2) {
        return;
    }
    let ctx = rt.driver().create_context().unwrap();
    let d1 = rt.driver().device(1).unwrap();
    let s = ctx.create_stream(&d1).unwrap();
    let m = ctx.alloc_managed((2 * PAGE) as u64, 1).unwrap();
    let data: Vec<u8> = (0..PAGE + 4096).map(|i| (i % 253) as u8).collect();
    ctx.managed_write(m, &data).unwrap();
    let dv = ctx.alloc_device(&d1, &AllocDesc::new(4 << 20)).unwrap();
    let hv = ctx.alloc_host(&AllocDesc::new(4 << 20)).unwrap();
    // Managed -> USM device: the managed pages move to device 1.
    s.memcpy_async(dv, m, data.len()).unwrap();
    // USM device -> managed (second page onwards), USM host <- managed.
    s.memcpy_async(m + PAGE + 4096, dv, 4096).unwrap();
    s.memcpy_async(hv, m, data.len()).unwrap();
    s.synchronize().unwrap();
    let r = ctx.managed_residency(m).unwrap();
    assert_eq!((r.host, r.devices.clone()), (false, vec![1]));
    // SAFETY: the host allocation is live and holds data.len() bytes.
    let got = unsafe { std::slice::from_raw_parts(hv as *const u8, data.len()) };
    assert_eq!(got, &data[..]);
    let mut b = vec![0u8; 4096];
    ctx.managed_read(m + PAGE + 4096, &mut b).unwrap();
    assert_eq!(&b[..], &data[..4096]);
    // Plain memory the driver does not know (a heap buffer): 107000, nothing queued.
    let heap = vec![0u8; 4096];
    let e = s.memcpy_async(m, heap.as_ptr() as usize, 4096).unwrap_err();
    assert_eq!(e.acl_error(), 107_000, "{e}");
    // Neither side managed.
    let e = s.memcpy_async(dv, hv, 4096).unwrap_err();
    assert_eq!(e.acl_error(), 107_000, "{e}");
    s.synchronize().unwrap();
    // The in-flight references were released: the frees go through at once.
    ctx.free_memory(dv).unwrap();
    ctx.free_memory(hv).unwrap();
    assert_eq!(rt.driver().pending_frees(), 0);
}
