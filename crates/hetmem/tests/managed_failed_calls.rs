//! A failed managed call changes nothing: every advice, and prefetch, whose eager step cannot
//! get device memory (the device is full of USM allocations) fails with 207001 and leaves every
//! attribute, the residency of every page, the contents and the counters as they were; the next
//! valid call works. Bad sizes for the ACCESSED_BY convenience give an error, never a panic.

mod common;

/// Why the tests of a full device do not apply on cuda.
const NO_DEVICE_ROOM: &str =
    "it fills a small modelled device (6 pages) with USM allocations so that the host engine's \
     eager migration finds no device room (207001) or must evict managed pages; on cuda the \
     device is the whole GPU (its free memory, ~139 GiB, far too much to fill) and the driver \
     places and evicts cuMemAllocManaged pages itself, with no device-room accounting";

use common::{context_with, stream};

use hetmem::{
    Advice, AllocDesc, BackendKind, Context, Location, RangeAttribute as A, Residency, Runtime,
    MANAGED_PAGE_SIZE as PAGE,
};

const CAP_PAGES: usize = 6;

fn setup() -> (Runtime, Context) {
    context_with(2, (CAP_PAGES * PAGE) as u64)
}

/// Fills what is left of device `d` with USM device allocations of one page each (the last
/// one smaller); returns them.
fn fill_with_usm(rt: &Runtime, ctx: &Context, d: u32) -> Vec<usize> {
    let dev = rt.driver().device(d).unwrap();
    let mut v = Vec::new();
    loop {
        let left = (CAP_PAGES * PAGE) as u64 - dev.used_memory();
        if left == 0 {
            break;
        }
        let n = (left as usize).min(PAGE);
        v.push(ctx.alloc_device(&dev, &AllocDesc::new(n)).unwrap());
    }
    assert_eq!(dev.used_memory(), (CAP_PAGES * PAGE) as u64);
    v
}

/// Everything observable about `[m, m + pages*PAGE)`: the eight attributes over the whole
/// range and per page, residency and contents of each page, and the driver's counters.
#[derive(Debug, PartialEq)]
struct Snapshot {
    attrs: Vec<[i32; 7]>,
    accessed_by: Vec<Vec<i32>>,
    residency: Vec<Option<Residency>>,
    contents: Vec<u8>,
    stats: hetmem::ManagedStats,
    used: Vec<u64>,
}

fn snapshot(rt: &Runtime, ctx: &Context, m: usize, pages: usize) -> Snapshot {
    let mut ranges = vec![(m, pages * PAGE)];
    ranges.extend((0..pages).map(|i| (m + i * PAGE, PAGE)));
    let a = |x, p, s| ctx.managed_attr_i32(x, p, s).unwrap();
    let mut contents = vec![0u8; pages * PAGE];
    ctx.managed_peek(m, &mut contents).unwrap();
    Snapshot {
        attrs: ranges
            .iter()
            .map(|&(p, s)| {
                [
                    a(A::ReadMostly, p, s),
                    a(A::PreferredLocation, p, s),
                    a(A::PreferredLocationType, p, s),
                    a(A::PreferredLocationId, p, s),
                    a(A::LastPrefetchLocation, p, s),
                    a(A::LastPrefetchLocationType, p, s),
                    a(A::LastPrefetchLocationId, p, s),
                ]
            })
            .collect(),
        accessed_by: ranges
            .iter()
            .map(|&(p, s)| ctx.managed_accessed_by(p, s, 4).unwrap())
            .collect(),
        residency: (0..pages)
            .map(|i| ctx.managed_residency(m + i * PAGE))
            .collect(),
        contents,
        stats: rt.driver().managed_stats(),
        used: rt
            .driver()
            .device_list()
            .iter()
            .map(|d| d.used_memory())
            .collect(),
    }
}

fn frees(ctx: &Context, usm: Vec<usize>) {
    for p in usm {
        ctx.free_memory(p).unwrap();
    }
}

#[test]
fn unset_read_mostly_to_a_full_device_fails_and_changes_nothing() {
    if common::not_applicable_on(BackendKind::Cuda, NO_DEVICE_ROOM) || common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let m = ctx.alloc_managed(2 * PAGE as u64, 1).unwrap();
    ctx.managed_memset(m, 7, 2 * PAGE).unwrap();
    ctx.mem_advise(m, 2 * PAGE, Advice::SetReadMostly, Location::Host)
        .unwrap();
    ctx.mem_advise(m, 2 * PAGE, Advice::SetAccessedBy, Location::Device(1))
        .unwrap();
    let usm = fill_with_usm(&rt, &ctx, 0);
    let before = snapshot(&rt, &ctx, m, 2);
    let e = ctx
        .mem_advise(m, 2 * PAGE, Advice::UnsetReadMostly, Location::Device(0))
        .unwrap_err();
    assert_eq!(e.acl_error(), 207_001, "{e}");
    assert!(e.message().contains("device 0"), "{e}");
    assert_eq!(snapshot(&rt, &ctx, m, 2), before);
    assert_eq!(before.attrs[0][0], 1, "still read-mostly");
    // One page of room is enough: the second page evicts the first.
    ctx.free_memory(usm[0]).unwrap();
    ctx.mem_advise(m, 2 * PAGE, Advice::UnsetReadMostly, Location::Device(0))
        .unwrap();
    assert_eq!(ctx.managed_attr_i32(A::ReadMostly, m, 2 * PAGE).unwrap(), 0);
    let r = ctx.managed_residency(m + PAGE).unwrap();
    assert_eq!((r.host, r.devices), (false, vec![0]));
    frees(&ctx, usm[1..].to_vec());
}

#[test]
fn set_accessed_by_a_full_preferred_device_fails_and_changes_nothing() {
    if common::not_applicable_on(BackendKind::Cuda, NO_DEVICE_ROOM) || common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let m = ctx.alloc_managed(2 * PAGE as u64, 1).unwrap();
    ctx.mem_advise(
        m,
        2 * PAGE,
        Advice::SetPreferredLocation,
        Location::Device(0),
    )
    .unwrap();
    // Host writes bring both pages back to the host.
    ctx.managed_memset(m, 3, 2 * PAGE).unwrap();
    assert_eq!(ctx.managed_residency(m).unwrap().devices, Vec::<u32>::new());
    let usm = fill_with_usm(&rt, &ctx, 0);
    let before = snapshot(&rt, &ctx, m, 2);
    let e = ctx
        .mem_advise(m, 2 * PAGE, Advice::SetAccessedBy, Location::Device(0))
        .unwrap_err();
    assert_eq!(e.acl_error(), 207_001, "{e}");
    assert_eq!(snapshot(&rt, &ctx, m, 2), before);
    assert_eq!(before.accessed_by[0], vec![-2; 4]);
    frees(&ctx, usm);
    ctx.mem_advise(m, 2 * PAGE, Advice::SetAccessedBy, Location::Device(0))
        .unwrap();
    assert_eq!(
        ctx.managed_accessed_by(m, 2 * PAGE, 2).unwrap(),
        vec![0, -2]
    );
    assert_eq!(ctx.managed_residency(m).unwrap().devices, vec![0]);
}

#[test]
fn set_preferred_location_to_a_full_device_fails_and_changes_nothing() {
    if common::not_applicable_on(BackendKind::Cuda, NO_DEVICE_ROOM) || common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let m = ctx.alloc_managed(3 * PAGE as u64, 1).unwrap();
    // Page 0 read-mostly (would get a read-only copy on the device), pages 1-2 fresh.
    ctx.managed_memset(m, 9, PAGE).unwrap();
    ctx.mem_advise(m, PAGE, Advice::SetReadMostly, Location::Host)
        .unwrap();
    let usm = fill_with_usm(&rt, &ctx, 1);
    let before = snapshot(&rt, &ctx, m, 3);
    for (p, n) in [(m, 3), (m, 1), (m + PAGE, 2)] {
        let e = ctx
            .mem_advise(
                p,
                n * PAGE,
                Advice::SetPreferredLocation,
                Location::Device(1),
            )
            .unwrap_err();
        assert_eq!(e.acl_error(), 207_001, "{e}");
        assert_eq!(snapshot(&rt, &ctx, m, 3), before);
    }
    frees(&ctx, usm);
    ctx.mem_advise(
        m,
        3 * PAGE,
        Advice::SetPreferredLocation,
        Location::Device(1),
    )
    .unwrap();
    assert_eq!(
        ctx.managed_attr_i32(A::PreferredLocation, m, 3 * PAGE)
            .unwrap(),
        1
    );
}

#[test]
fn prefetch_to_a_full_device_fails_at_synchronize_and_moves_nothing() {
    if common::not_applicable_on(BackendKind::Cuda, NO_DEVICE_ROOM) || common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let m = ctx.alloc_managed(2 * PAGE as u64, 1).unwrap();
    ctx.managed_memset(m, 4, 2 * PAGE).unwrap();
    let s = stream(&rt, &ctx, 0);
    let usm = fill_with_usm(&rt, &ctx, 0);
    let before = snapshot(&rt, &ctx, m, 2);
    ctx.mem_prefetch(m, 2 * PAGE, Location::Device(0), 0, &s)
        .unwrap();
    let e = s.synchronize().unwrap_err();
    assert_eq!(e.acl_error(), 207_001, "{e}");
    let mut after = snapshot(&rt, &ctx, m, 2);
    // LAST_PREFETCH_LOCATION records the request (the spec), nothing else moved.
    for a in &mut after.attrs {
        assert_eq!(a[4..], [0, 1, 0]);
        a[4..].copy_from_slice(&before.attrs[0][4..]);
    }
    assert_eq!(after, before);
    frees(&ctx, usm);
    ctx.mem_prefetch(m, 2 * PAGE, Location::Device(0), 0, &s)
        .unwrap();
    s.synchronize().unwrap();
    assert_eq!(ctx.managed_residency(m + PAGE).unwrap().devices, vec![0]);
}

#[test]
fn a_full_device_that_holds_managed_pages_evicts_them_instead_of_failing() {
    if common::not_applicable_on(BackendKind::Cuda, NO_DEVICE_ROOM) || common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let other = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    let m = ctx.alloc_managed(2 * PAGE as u64, 1).unwrap();
    let s = stream(&rt, &ctx, 0);
    s.memset_async(other, 1, PAGE).unwrap();
    s.synchronize().unwrap();
    ctx.managed_memset(m, 2, 2 * PAGE).unwrap();
    ctx.mem_advise(m, 2 * PAGE, Advice::SetReadMostly, Location::Host)
        .unwrap();
    let usm = fill_with_usm(&rt, &ctx, 0);
    ctx.mem_advise(m, 2 * PAGE, Advice::UnsetReadMostly, Location::Device(0))
        .unwrap();
    assert_eq!(rt.driver().managed_stats().devices[0].evictions, 2);
    let r = ctx.managed_residency(other).unwrap();
    assert_eq!((r.host, r.devices), (true, vec![]));
    let mut b = vec![0u8; PAGE];
    ctx.managed_peek(other, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 1));
    frees(&ctx, usm);
}

#[test]
fn set_read_mostly_needs_no_device_room() {
    if common::not_applicable_on(BackendKind::Cuda, NO_DEVICE_ROOM) || common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let m = ctx.alloc_managed(2 * PAGE as u64, 1).unwrap();
    let s = stream(&rt, &ctx, 0);
    s.memset_async(m, 5, 2 * PAGE).unwrap();
    s.synchronize().unwrap();
    let usm = fill_with_usm(&rt, &ctx, 0);
    ctx.mem_advise(m, 2 * PAGE, Advice::SetReadMostly, Location::Device(0))
        .unwrap();
    let r = ctx.managed_residency(m).unwrap();
    assert_eq!((r.host, r.host_read_only, r.devices), (true, true, vec![0]));
    frees(&ctx, usm);
}

#[test]
fn every_advice_refused_for_its_arguments_changes_nothing() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    if common::fewer_devices_than(&rt, 2) {
        return;
    }
    let m = ctx.alloc_managed(4 * PAGE as u64, 1).unwrap();
    let s = stream(&rt, &ctx, 1);
    ctx.managed_memset(m, 1, 4 * PAGE).unwrap();
    ctx.mem_advise(m, PAGE, Advice::SetReadMostly, Location::Host)
        .unwrap();
    ctx.mem_advise(m + PAGE, PAGE, Advice::SetPreferredLocation, Location::Host)
        .unwrap();
    ctx.mem_advise(m, 2 * PAGE, Advice::SetAccessedBy, Location::Device(1))
        .unwrap();
    ctx.mem_prefetch(m + 2 * PAGE, 2 * PAGE, Location::Device(1), 0, &s)
        .unwrap();
    s.synchronize().unwrap();
    let before = snapshot(&rt, &ctx, m, 4);
    let all = [
        Advice::SetReadMostly,
        Advice::UnsetReadMostly,
        Advice::SetPreferredLocation,
        Advice::UnsetPreferredLocation,
        Advice::SetAccessedBy,
        Advice::UnsetAccessedBy,
    ];
    for adv in all {
        for (p, n, loc, code) in [
            (0, PAGE, Location::Device(1), 100_000),
            (m, 0, Location::Device(1), 100_000),
            (m, PAGE + 1, Location::Device(1), 107_000),
            (m + 4096, PAGE, Location::Device(1), 107_008),
            (m + 3 * PAGE, 2 * PAGE, Location::Device(1), 107_000),
        ] {
            let e = ctx.mem_advise(p, n, adv, loc).unwrap_err();
            assert_eq!(e.acl_error(), code, "{adv:?} {p:#x} {n:#x}: {e}");
            assert_eq!(snapshot(&rt, &ctx, m, 4), before, "{adv:?}");
        }
    }
    for adv in [
        Advice::UnsetReadMostly,
        Advice::SetPreferredLocation,
        Advice::SetAccessedBy,
        Advice::UnsetAccessedBy,
    ] {
        for loc in [Location::Device(2), Location::HostNuma(1 << 20)] {
            let e = ctx.mem_advise(m, 4 * PAGE, adv, loc).unwrap_err();
            assert_eq!(e.acl_error(), 107_000, "{adv:?} {loc:?}: {e}");
            assert_eq!(snapshot(&rt, &ctx, m, 4), before, "{adv:?} {loc:?}");
        }
    }
    // Refused by the preferred-location rules: page 2 is on device 1, page 1 on the host.
    for loc in [Location::Host, Location::Device(0)] {
        let e = ctx
            .mem_advise(m, 4 * PAGE, Advice::SetPreferredLocation, loc)
            .unwrap_err();
        assert_eq!(e.acl_error(), 107_000, "{loc:?}: {e}");
        assert_eq!(snapshot(&rt, &ctx, m, 4), before, "{loc:?}");
    }
    // No sticky state: a valid call works.
    ctx.mem_advise(m, 4 * PAGE, Advice::UnsetAccessedBy, Location::Device(1))
        .unwrap();
    assert_eq!(ctx.managed_accessed_by(m, PAGE, 1).unwrap(), vec![-2]);
}

#[test]
fn prefetch_refused_for_its_arguments_queues_and_records_nothing() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let m = ctx.alloc_managed(2 * PAGE as u64, 1).unwrap();
    ctx.managed_memset(m, 1, 2 * PAGE).unwrap();
    let s = stream(&rt, &ctx, 0);
    // A device that does not exist (device 2 on the host backend's two).
    let absent = rt.driver().device_list().len() as u32;
    let before = snapshot(&rt, &ctx, m, 2);
    for (p, n, loc, flags, code) in [
        (m, 2 * PAGE, Location::Device(0), 1, 100_000),
        (0, PAGE, Location::Device(0), 0, 100_000),
        (m, 0, Location::Device(0), 0, 100_000),
        (m, 4096, Location::Device(0), 0, 107_000),
        (m + 4096, PAGE, Location::Device(0), 0, 107_008),
        (m + PAGE, 2 * PAGE, Location::Device(0), 0, 107_000),
        (m, PAGE, Location::Device(absent), 0, 107_000),
        (m, PAGE, Location::Invalid, 0, 107_000),
        (m, PAGE, Location::HostNuma(1 << 20), 0, 107_000),
    ] {
        let e = ctx.mem_prefetch(p, n, loc, flags, &s).unwrap_err();
        assert_eq!(e.acl_error(), code, "{p:#x} {n:#x} {loc:?} {flags}: {e}");
        s.synchronize().unwrap();
        assert_eq!(snapshot(&rt, &ctx, m, 2), before, "{loc:?}");
    }
}

#[test]
fn accessed_by_with_absurd_slot_counts_is_an_error_not_a_panic() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    // Device 1 on the host backend (two devices); on cuda the last GPU.
    let d = rt.driver().device_list().len() as u32 - 1;
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    ctx.mem_advise(m, PAGE, Advice::SetAccessedBy, Location::Device(d))
        .unwrap();
    for slots in [
        0,
        usize::MAX,
        usize::MAX / 4,
        usize::MAX / 4 + 1,
        Context::MAX_ACCESSED_BY_SLOTS + 1,
    ] {
        let e = ctx.managed_accessed_by(m, PAGE, slots).unwrap_err();
        assert_eq!(e.acl_error(), 107_000, "{slots}: {e}");
        assert!(e.message().contains(&slots.to_string()), "{e}");
    }
    let v = ctx
        .managed_accessed_by(m, PAGE, Context::MAX_ACCESSED_BY_SLOTS)
        .unwrap();
    assert_eq!(v.len(), Context::MAX_ACCESSED_BY_SLOTS);
    assert_eq!(v[0], d as i32);
    assert!(v[1..].iter().all(|&x| x == -2));
    // Larger answers go into the caller's own buffer.
    let mut big = vec![0u8; 8 * Context::MAX_ACCESSED_BY_SLOTS];
    ctx.managed_get_attr(A::AccessedBy, m, PAGE, &mut big)
        .unwrap();
    assert_eq!(i32::from_ne_bytes(big[..4].try_into().unwrap()), d as i32);
    assert_eq!(
        i32::from_ne_bytes(big[big.len() - 4..].try_into().unwrap()),
        -2
    );
    // dataSize rules of the general call.
    for n in [0, 3, 5] {
        let mut b = vec![0u8; n];
        let e = ctx
            .managed_get_attr(A::AccessedBy, m, PAGE, &mut b)
            .unwrap_err();
        assert_eq!(e.acl_error(), 107_000, "{n}");
    }
    // Sizes of the range that overflow or run past managed memory.
    for (p, s) in [(m, usize::MAX), (usize::MAX, 1), (m + 1, usize::MAX - m)] {
        let e = ctx.managed_accessed_by(p, s, 1).unwrap_err();
        assert_eq!(e.acl_error(), 107_000, "{p:#x} {s:#x}: {e}");
    }
}

/// Pages that running work has pinned on a device cannot be evicted: they are not room. A
/// preferred location, an UNSET_READ_MOSTLY or a prefetch to a device full of them fails at
/// once with nothing changed, instead of moving part of the range first.
#[test]
fn a_device_full_of_pages_in_use_by_running_work_fails_advice_and_prefetch_cleanly() {
    if common::not_applicable_on(BackendKind::Cuda, NO_DEVICE_ROOM) || common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let busy = ctx.alloc_managed((CAP_PAGES * PAGE) as u64, 1).unwrap();
    let m = ctx.alloc_managed(2 * PAGE as u64, 1).unwrap();
    ctx.managed_memset(m, 6, 2 * PAGE).unwrap();
    ctx.mem_advise(m, 2 * PAGE, Advice::SetReadMostly, Location::Host)
        .unwrap();
    let s0 = stream(&rt, &ctx, 0);
    let (started_tx, started) = std::sync::mpsc::channel();
    let (release, gate) = std::sync::mpsc::channel::<()>();
    s0.launch(&[(busy, CAP_PAGES * PAGE, true)], move |_| {
        started_tx.send(()).unwrap();
        gate.recv().ok();
    })
    .unwrap();
    started.recv().unwrap();
    assert_eq!(
        rt.driver().managed_stats().devices[0].resident_pages,
        CAP_PAGES as u64
    );
    let before = snapshot(&rt, &ctx, m, 2);
    // The pages are read-mostly: SET_PREFERRED_LOCATION may put copies of them on the
    // device, but the device has no room at all.
    for (p, n) in [(m, 2), (m + PAGE, 1)] {
        let e = ctx
            .mem_advise(
                p,
                n * PAGE,
                Advice::SetPreferredLocation,
                Location::Device(0),
            )
            .unwrap_err();
        assert_eq!(e.acl_error(), 207_001, "{e}");
        assert!(e.message().contains("running work"), "{e}");
        assert_eq!(snapshot(&rt, &ctx, m, 2), before);
    }
    let e = ctx
        .mem_advise(m + PAGE, PAGE, Advice::UnsetReadMostly, Location::Device(0))
        .unwrap_err();
    assert_eq!(e.acl_error(), 207_001, "{e}");
    assert_eq!(snapshot(&rt, &ctx, m, 2), before);
    let s1 = stream(&rt, &ctx, 1);
    ctx.mem_prefetch(m, 2 * PAGE, Location::Device(0), 0, &s1)
        .unwrap();
    assert_eq!(s1.synchronize().unwrap_err().acl_error(), 207_001);
    let mut after = snapshot(&rt, &ctx, m, 2);
    for a in &mut after.attrs {
        a[4..].copy_from_slice(&before.attrs[0][4..]);
    }
    assert_eq!(after, before);
    release.send(()).unwrap();
    s0.synchronize().unwrap();
    // With the work done its pages can be evicted: the same calls work.
    ctx.mem_advise(m, 2 * PAGE, Advice::UnsetReadMostly, Location::Device(0))
        .unwrap();
    ctx.mem_advise(
        m,
        2 * PAGE,
        Advice::SetPreferredLocation,
        Location::Device(0),
    )
    .unwrap();
    assert_eq!(ctx.managed_residency(m).unwrap().devices, vec![0]);
    assert_eq!(ctx.managed_residency(m + PAGE).unwrap().devices, vec![0]);
}
