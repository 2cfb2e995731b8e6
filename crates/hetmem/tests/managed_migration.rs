//! Fault-driven migration of managed memory on the host backend: host faults through
//! userfaultfd, device-side operations, read-mostly copies, oversubscription, counters, leaks.

mod common;

/// Why this file runs on the host backend only.
const HOST_ONLY: &str =
    "fault-driven migration is the host backend's software UVM engine (userfaultfd host faults \
     and their counts, read-mostly host copies and write-protect faults, LRU eviction from a \
     small modelled device, the engine's threads and fds); on cuda managed memory is \
     cuMemAllocManaged and the driver migrates pages itself, with none of these mechanics or \
     counters";

use common::{byte, context_with, output_text, run_test_in_child, task_count};

use std::sync::{Arc, Barrier};

use hetmem::{Advice, Context, Location, Runtime, MANAGED_PAGE_SIZE as PAGE};

fn setup(devices: u32, cap: u64) -> (Runtime, Context) {
    context_with(devices, cap)
}

fn put(p: usize, v: u8) {
    // SAFETY: as above.
    unsafe { (p as *mut u8).write_volatile(v) }
}

#[test]
fn fresh_pages_are_populated_lazily_on_first_host_touch() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let (rt, ctx) = setup(1, 64 << 20);
    let m = ctx.alloc_managed(3 << 20, 1).unwrap(); // rounds to 4 MiB
    assert_eq!(rt.driver().managed_stats().bytes, 4 << 20);
    assert_eq!(ctx.managed_residency(m), None);
    put(m + 5, 7);
    assert_eq!(byte(m + 5), 7);
    let s = rt.driver().managed_stats();
    assert_eq!(s.host_faults, 1);
    assert_eq!(s.host_resident_pages, 1);
    assert_eq!(ctx.managed_residency(m + PAGE), None);
    assert_eq!(byte(m + PAGE + 1), 0);
    assert_eq!(rt.driver().managed_stats().host_faults, 2);
}

#[test]
fn prefetch_n_pages_to_a_device_then_host_touch_gives_exactly_n_faults() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let (rt, ctx) = setup(2, 64 << 20);
    let n = 8;
    let m = ctx.alloc_managed((n * PAGE) as u64, 1).unwrap();
    for i in 0..n {
        ctx.managed_memset(m + i * PAGE, i as u8 + 1, PAGE).unwrap();
    }
    let dev = rt.driver().device(1).unwrap();
    let s = ctx.create_stream(&dev).unwrap();
    ctx.mem_prefetch(m, n * PAGE, Location::Device(1), 0, &s)
        .unwrap();
    s.synchronize().unwrap();
    let before = rt.driver().managed_stats();
    assert_eq!(before.devices[1].resident_pages, n as u64);
    assert_eq!(before.host_resident_pages, 0);
    assert_eq!(before.devices[1].pages_to_device, n as u64);
    for i in 0..n {
        for off in [0, 4096, PAGE - 1] {
            assert_eq!(byte(m + i * PAGE + off), i as u8 + 1);
        }
    }
    let after = rt.driver().managed_stats();
    assert_eq!(after.host_faults - before.host_faults, n as u64);
    assert_eq!(after.pages_to_host - before.pages_to_host, n as u64);
    assert_eq!(
        after.bytes_to_host - before.bytes_to_host,
        (n * PAGE) as u64
    );
    assert_eq!(after.devices[1].pages_from_device, n as u64);
    assert_eq!(after.devices[1].resident_pages, 0);
    assert_eq!(ctx.managed_residency(m).unwrap().devices, Vec::<u32>::new());
}

#[test]
fn many_threads_faulting_the_same_page_migrate_it_once() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let (rt, ctx) = setup(1, 64 << 20);
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    ctx.managed_memset(m, 0x5a, PAGE).unwrap();
    let s = ctx.create_stream(&rt.driver().device(0).unwrap()).unwrap();
    for round in 0..20u8 {
        ctx.mem_prefetch(m, PAGE, Location::Device(0), 0, &s)
            .unwrap();
        s.synchronize().unwrap();
        let before = rt.driver().managed_stats().host_faults;
        let b = Arc::new(Barrier::new(8));
        let hs: Vec<_> = (0..8)
            .map(|t| {
                let b = b.clone();
                std::thread::spawn(move || {
                    b.wait();
                    byte(m + t * 4096 * 7)
                })
            })
            .collect();
        for h in hs {
            let v = h.join().unwrap();
            assert!(v == 0x5a || v == round, "round {round}: {v}");
        }
        assert_eq!(
            rt.driver().managed_stats().host_faults - before,
            1,
            "round {round} {:?}",
            ctx.managed_residency(m)
        );
        // A write after the read-back, to be seen on the next round.
        ctx.managed_memset(m, 0x5a, 1).unwrap();
    }
}

#[test]
fn threads_writing_different_pages_that_live_on_devices_all_land() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let (rt, ctx) = setup(2, 64 << 20);
    let n = 16;
    let m = ctx.alloc_managed((n * PAGE) as u64, 1).unwrap();
    let s0 = ctx.create_stream(&rt.driver().device(0).unwrap()).unwrap();
    let s1 = ctx.create_stream(&rt.driver().device(1).unwrap()).unwrap();
    s0.memset_async(m, 1, n / 2 * PAGE).unwrap();
    s1.memset_async(m + n / 2 * PAGE, 2, n / 2 * PAGE).unwrap();
    s0.synchronize().unwrap();
    s1.synchronize().unwrap();
    let hs: Vec<_> = (0..n)
        .map(|i| {
            std::thread::spawn(move || {
                let p = m + i * PAGE;
                let want = if i < n / 2 { 1 } else { 2 };
                assert_eq!(byte(p + 100), want);
                put(p + 100, 10 + i as u8);
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    for i in 0..n {
        assert_eq!(byte(m + i * PAGE + 100), 10 + i as u8);
        assert_eq!(byte(m + i * PAGE + 101), if i < n / 2 { 1 } else { 2 });
    }
    assert_eq!(rt.driver().managed_stats().host_faults, n as u64);
}

#[test]
fn device_copy_migrates_both_operands_to_the_stream_device() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let (rt, ctx) = setup(2, 64 << 20);
    let a = ctx.alloc_managed(4 << 20, 1).unwrap();
    let b = ctx.alloc_managed(4 << 20, 1).unwrap();
    let data: Vec<u8> = (0..4 << 20).map(|i| (i * 7 % 251) as u8).collect();
    ctx.managed_write(a, &data).unwrap();
    let s = ctx.create_stream(&rt.driver().device(1).unwrap()).unwrap();
    s.memcpy_async(b + 1, a + 3, (4 << 20) - 3).unwrap();
    s.synchronize().unwrap();
    for p in [a, a + PAGE, b, b + PAGE] {
        assert_eq!(ctx.managed_residency(p).unwrap().devices, vec![1]);
        assert!(!ctx.managed_residency(p).unwrap().host);
    }
    let mut out = vec![0u8; 4 << 20];
    ctx.managed_read(b, &mut out).unwrap();
    assert_eq!(&out[1..(4 << 20) - 2], &data[3..]);
}

#[test]
fn overlapping_device_copy_behaves_as_memmove() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let (rt, ctx) = setup(1, 64 << 20);
    let a = ctx.alloc_managed(8 << 20, 1).unwrap();
    let data: Vec<u8> = (0..8 << 20).map(|i| (i % 253) as u8).collect();
    ctx.managed_write(a, &data).unwrap();
    let s = ctx.create_stream(&rt.driver().device(0).unwrap()).unwrap();
    s.memcpy_async(a + PAGE + 5, a, 5 << 20).unwrap();
    s.synchronize().unwrap();
    let mut want = data.clone();
    want.copy_within(0..5 << 20, PAGE + 5);
    let mut out = vec![0u8; 8 << 20];
    ctx.managed_read(a, &mut out).unwrap();
    assert!(out == want);
}

#[test]
fn read_mostly_pages_are_duplicated_and_a_host_write_invalidates_device_copies() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let (rt, ctx) = setup(2, 64 << 20);
    let m = ctx.alloc_managed(2 << 20, 1).unwrap();
    ctx.managed_memset(m, 9, PAGE).unwrap();
    ctx.mem_advise(m, PAGE, Advice::SetReadMostly, Location::Host)
        .unwrap();
    let r = ctx.managed_residency(m).unwrap();
    assert!(r.host && r.host_read_only);
    for d in 0..2 {
        let s = ctx.create_stream(&rt.driver().device(d).unwrap()).unwrap();
        ctx.mem_prefetch(m, PAGE, Location::Device(d), 0, &s)
            .unwrap();
        s.synchronize().unwrap();
    }
    let r = ctx.managed_residency(m).unwrap();
    assert_eq!(r.devices, vec![0, 1]);
    assert!(r.host && r.host_read_only);
    let f0 = rt.driver().managed_stats().host_faults;
    assert_eq!(byte(m + 77), 9); // a read of the host copy: no fault
    assert_eq!(rt.driver().managed_stats().host_faults, f0);
    put(m + 77, 10); // a write: one write-protect fault, device copies dropped
    assert_eq!(rt.driver().managed_stats().host_faults, f0 + 1);
    let r = ctx.managed_residency(m).unwrap();
    assert_eq!(r.devices, Vec::<u32>::new());
    assert!(r.host && !r.host_read_only);
    // A device write on a read-mostly page: the host copy goes, the device's is the only one.
    let s = ctx.create_stream(&rt.driver().device(0).unwrap()).unwrap();
    s.memset_async(m + 1, 11, 1).unwrap();
    s.synchronize().unwrap();
    let r = ctx.managed_residency(m).unwrap();
    assert_eq!((r.host, r.devices.clone()), (false, vec![0]));
    // A host read then makes a read-only copy, keeping the device's.
    assert_eq!(byte(m + 1), 11);
    assert_eq!(byte(m + 77), 10);
    let r = ctx.managed_residency(m).unwrap();
    assert_eq!((r.host, r.host_read_only, r.devices), (true, true, vec![0]));
}

#[test]
fn oversubscription_evicts_least_recently_used_pages_and_keeps_contents() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let cap = 4 * PAGE as u64;
    let (rt, ctx) = setup(1, cap);
    let n = 16;
    let m = ctx.alloc_managed((n * PAGE) as u64, 1).unwrap();
    for i in 0..n {
        ctx.managed_memset(m + i * PAGE, i as u8, PAGE).unwrap();
    }
    let dev = rt.driver().device(0).unwrap();
    let s = ctx.create_stream(&dev).unwrap();
    ctx.mem_prefetch(m, n * PAGE, Location::Device(0), 0, &s)
        .unwrap();
    s.synchronize().unwrap();
    let st = rt.driver().managed_stats();
    assert_eq!(st.devices[0].resident_pages, 4);
    assert_eq!(st.devices[0].evictions, (n - 4) as u64);
    assert!(dev.used_memory() <= cap);
    // The last four prefetched are the ones left.
    for i in 0..n {
        let r = ctx.managed_residency(m + i * PAGE).unwrap();
        assert_eq!(r.devices.is_empty(), i < n - 4, "page {i}");
    }
    // A device fill of the whole range streams through the 4-page device.
    s.memset_async(m, 0xee, n * PAGE).unwrap();
    s.synchronize().unwrap();
    for i in 0..n {
        assert_eq!(byte(m + i * PAGE + 3), 0xee);
    }
    // Launched work over 3 pages sees them contiguous on the device.
    s.launch(&[(m + PAGE, 3 * PAGE, true)], |b| {
        // SAFETY: the buffer is resident on the device for the duration of the work.
        unsafe { std::ptr::write_bytes(b[0].ptr, 0x42, b[0].len) };
    })
    .unwrap();
    s.synchronize().unwrap();
    assert_eq!(byte(m + PAGE), 0x42);
    assert_eq!(byte(m + 4 * PAGE - 1), 0x42);
    assert_eq!(byte(m + 4 * PAGE), 0xee);
}

#[test]
fn launched_work_larger_than_the_device_reports_out_of_device_memory() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let (rt, ctx) = setup(1, 2 * PAGE as u64);
    let m = ctx.alloc_managed((4 * PAGE) as u64, 1).unwrap();
    let s = ctx.create_stream(&rt.driver().device(0).unwrap()).unwrap();
    s.launch(&[(m, 4 * PAGE, false)], |_| panic!("must not run"))
        .unwrap();
    let e = s.synchronize().unwrap_err();
    assert_eq!(e.acl_error(), 207_001, "{e}");
    // The stream stays usable.
    s.memset_async(m, 1, PAGE).unwrap();
    s.synchronize().unwrap();
    assert_eq!(byte(m), 1);
}

/// Runs in a child process (the counts are process-wide, and other tests run in parallel).
#[test]
fn no_fds_mappings_or_threads_leak() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let out = run_test_in_child("leak_child", &[("HETMEM_MANAGED_LEAK_CHILD", "1")]);
    let text = output_text(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("leak child ok"), "{text}");
}

#[test]
fn leak_child() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    if std::env::var_os("HETMEM_MANAGED_LEAK_CHILD").is_none() {
        return;
    }
    // The first round warms up what the process keeps once (glibc's cache of thread stacks).
    let mut before = None;
    for _ in 0..6 {
        let (rt, ctx) = setup(2, 64 << 20);
        let m = ctx.alloc_managed((4 * PAGE) as u64, 1).unwrap();
        let s = ctx.create_stream(&rt.driver().device(1).unwrap()).unwrap();
        put(m, 1);
        ctx.mem_prefetch(m, 4 * PAGE, Location::Device(1), 0, &s)
            .unwrap();
        s.synchronize().unwrap();
        assert_eq!(byte(m), 1);
        let m2 = ctx.alloc_managed(PAGE as u64, 1).unwrap();
        ctx.free_managed(m2).unwrap();
        // m is freed by dropping the context.
        drop((s, ctx, rt));
        before.get_or_insert((
            hetmem::platform::open_fd_count(),
            hetmem::platform::mapping_count(),
            task_count(),
        ));
    }
    let (fds, maps, th) = before.unwrap();
    assert_eq!(hetmem::platform::open_fd_count(), fds);
    assert_eq!(hetmem::platform::mapping_count(), maps);
    assert_eq!(task_count(), th);
    println!("leak child ok");
}

#[test]
fn launched_work_that_panics_is_reported_and_the_stream_stays_usable() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let (rt, ctx) = setup(1, 64 << 20);
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    let s = ctx.create_stream(&rt.driver().device(0).unwrap()).unwrap();
    s.launch(&[(m, PAGE, true)], |_| panic!("device work failed"))
        .unwrap();
    let e = s.synchronize().unwrap_err();
    assert!(
        matches!(
            e,
            hetmem::Error::Acl(hetmem::AclCode::RtDrvInternalError, _)
        ),
        "{e}"
    );
    assert_eq!(e.acl_error(), 507_899, "{e}");
    s.memset_async(m, 2, PAGE).unwrap();
    s.synchronize().unwrap();
    assert_eq!(byte(m + 5), 2);
    // The managed lock was released: host faults still resolve.
    put(m, 3);
    assert_eq!(byte(m), 3);
}

/// The kernel writing into managed memory that lives on a device (here `read(2)` from a pipe)
/// faults through userfaultfd like a user access: the page migrates and the call succeeds.
#[test]
fn kernel_accesses_to_device_resident_pages_migrate_them() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let (rt, ctx) = setup(1, 64 << 20);
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    ctx.managed_memset(m, 1, PAGE).unwrap();
    let s = ctx.create_stream(&rt.driver().device(0).unwrap()).unwrap();
    ctx.mem_prefetch(m, PAGE, Location::Device(0), 0, &s)
        .unwrap();
    s.synchronize().unwrap();
    let (r, w) = rustix::pipe::pipe().unwrap();
    rustix::io::write(&w, b"hello managed").unwrap();
    let before = rt.driver().managed_stats().host_faults;
    // SAFETY: the destination is inside the live managed allocation.
    let buf = unsafe { std::slice::from_raw_parts_mut((m + 100) as *mut u8, 13) };
    assert_eq!(rustix::io::read(&r, buf).unwrap(), 13);
    assert_eq!(rt.driver().managed_stats().host_faults, before + 1);
    let mut out = [0u8; 15];
    ctx.managed_read(m + 99, &mut out).unwrap();
    assert_eq!(&out, b"\x01hello managed\x01");
}
