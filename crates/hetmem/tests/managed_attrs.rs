//! The range-attribute matrix: every attribute over a uniform range, a mixed range and a
//! half-covered range, after set and after unset, after prefetch to the host and to each
//! device, and on a fresh allocation.
//!
//! On the backend under test (`HETMEM_BACKEND`). The host backend models three devices; on cuda
//! they are the machine's GPUs: the tests that advise or prefetch to devices 1 and 2 need three
//! (a loud not-applicable line where there are fewer), and "each device" is each one there is.

mod common;

use common::{runtime_with, scalars};

use hetmem::managed::{location_type as lt, numa_nodes};
use hetmem::{Advice, Context, Location, RangeAttribute as A, Runtime, MANAGED_PAGE_SIZE as PAGE};

const DEVICES: u32 = 3;

fn setup() -> (Runtime, Context, usize) {
    let rt = runtime_with(DEVICES, 64 << 20);
    let ctx = rt.driver().create_context().unwrap();
    let m = ctx.alloc_managed(2 * PAGE as u64, 1).unwrap();
    (rt, ctx, m)
}

const FRESH: [i32; 7] = [0, -2, lt::INVALID as i32, -2, -2, lt::INVALID as i32, -2];

fn advise(ctx: &Context, p: usize, s: usize, a: Advice, l: Location) {
    ctx.mem_advise(p, s, a, l).unwrap();
}

fn prefetch(rt: &Runtime, ctx: &Context, p: usize, s: usize, l: Location) {
    let st = ctx.create_stream(&rt.driver().device(0).unwrap()).unwrap();
    ctx.mem_prefetch(p, s, l, 0, &st).unwrap();
    st.synchronize().unwrap();
}

#[test]
fn fresh_allocation_answers_no_advice_and_no_prefetch() {
    if common::skip() {
        return;
    }
    let (_rt, ctx, m) = setup();
    assert_eq!(scalars(&ctx, m, 2 * PAGE), FRESH);
    assert_eq!(scalars(&ctx, m + 5, 1), FRESH);
    assert_eq!(
        ctx.managed_accessed_by(m, 2 * PAGE, 3).unwrap(),
        vec![-2, -2, -2]
    );
}

#[test]
fn read_mostly_uniform_half_covered_and_unset() {
    if common::skip() {
        return;
    }
    let (_rt, ctx, m) = setup();
    advise(&ctx, m, PAGE, Advice::SetReadMostly, Location::Host);
    assert_eq!(scalars(&ctx, m, PAGE)[0], 1); // uniform
    assert_eq!(scalars(&ctx, m, 2 * PAGE)[0], 0); // half-covered
    assert_eq!(scalars(&ctx, m + PAGE, PAGE)[0], 0);
    advise(&ctx, m + PAGE, PAGE, Advice::SetReadMostly, Location::Host);
    assert_eq!(scalars(&ctx, m, 2 * PAGE)[0], 1);
    advise(&ctx, m, PAGE, Advice::UnsetReadMostly, Location::Host);
    assert_eq!(scalars(&ctx, m, 2 * PAGE)[0], 0); // mixed
    advise(
        &ctx,
        m + PAGE,
        PAGE,
        Advice::UnsetReadMostly,
        Location::Host,
    );
    assert_eq!(scalars(&ctx, m, 2 * PAGE), FRESH);
}

#[test]
fn preferred_location_device_uniform_half_covered_mixed_and_unset() {
    if common::skip() {
        return;
    }
    let (rt, ctx, m) = setup();
    if common::fewer_devices_than(&rt, DEVICES as usize) {
        return;
    }
    let dev = [0, 1, lt::DEVICE as i32, 1];
    advise(
        &ctx,
        m,
        PAGE,
        Advice::SetPreferredLocation,
        Location::Device(1),
    );
    assert_eq!(scalars(&ctx, m, PAGE)[..4], dev);
    // Half-covered: the second page has no preference.
    assert_eq!(scalars(&ctx, m, 2 * PAGE), FRESH);
    advise(
        &ctx,
        m + PAGE,
        PAGE,
        Advice::SetPreferredLocation,
        Location::Device(1),
    );
    assert_eq!(scalars(&ctx, m, 2 * PAGE)[..4], dev);
    // Mixed: device 1 and device 2.
    let (_rt2, ctx2, m2) = setup();
    advise(
        &ctx2,
        m2,
        PAGE,
        Advice::SetPreferredLocation,
        Location::Device(1),
    );
    advise(
        &ctx2,
        m2 + PAGE,
        PAGE,
        Advice::SetPreferredLocation,
        Location::Device(2),
    );
    assert_eq!(scalars(&ctx2, m2, 2 * PAGE), FRESH);
    assert_eq!(
        scalars(&ctx2, m2 + PAGE, 1)[..4],
        [0, 2, lt::DEVICE as i32, 2]
    );
    advise(
        &ctx,
        m,
        2 * PAGE,
        Advice::UnsetPreferredLocation,
        Location::Host,
    );
    assert_eq!(scalars(&ctx, m, 2 * PAGE), FRESH);
}

#[test]
fn preferred_location_host_and_numa_uniform_and_mixed() {
    if common::skip() {
        return;
    }
    let (_rt, ctx, m) = setup();
    advise(
        &ctx,
        m,
        2 * PAGE,
        Advice::SetPreferredLocation,
        Location::Host,
    );
    assert_eq!(
        scalars(&ctx, m, 2 * PAGE)[..4],
        [0, -1, lt::HOST as i32, -2]
    );
    let node = numa_nodes()[0];
    advise(
        &ctx,
        m + PAGE,
        PAGE,
        Advice::SetPreferredLocation,
        Location::HostNuma(node),
    );
    // Mixed host / NUMA node.
    assert_eq!(scalars(&ctx, m, 2 * PAGE), FRESH);
    assert_eq!(
        scalars(&ctx, m + PAGE, PAGE)[..4],
        [0, node as i32, lt::HOST_NUMA as i32, node as i32]
    );
    advise(
        &ctx,
        m,
        PAGE,
        Advice::SetPreferredLocation,
        Location::HostNuma(node),
    );
    assert_eq!(
        scalars(&ctx, m, 2 * PAGE)[..4],
        [0, node as i32, lt::HOST_NUMA as i32, node as i32]
    );
}

#[test]
fn accessed_by_lists_ids_set_over_the_whole_range_padded_or_truncated() {
    if common::skip() {
        return;
    }
    let (rt, ctx, m) = setup();
    if common::fewer_devices_than(&rt, DEVICES as usize) {
        return;
    }
    advise(
        &ctx,
        m,
        2 * PAGE,
        Advice::SetAccessedBy,
        Location::Device(2),
    );
    advise(
        &ctx,
        m,
        2 * PAGE,
        Advice::SetAccessedBy,
        Location::Device(0),
    );
    advise(&ctx, m, 2 * PAGE, Advice::SetAccessedBy, Location::Host);
    // Uniform: all three, extra slots -2.
    assert_eq!(
        ctx.managed_accessed_by(m, 2 * PAGE, 5).unwrap(),
        vec![0, 2, -1, -2, -2]
    );
    // Truncated: as many as fit, each one of the set.
    let two = ctx.managed_accessed_by(m, 2 * PAGE, 2).unwrap();
    assert!(
        two.iter().all(|x| [0, 2, -1].contains(x)) && two[0] != two[1],
        "{two:?}"
    );
    // Half-covered: device 1 only on the first page is not listed over both.
    advise(&ctx, m, PAGE, Advice::SetAccessedBy, Location::Device(1));
    assert_eq!(
        ctx.managed_accessed_by(m, 2 * PAGE, 4).unwrap(),
        vec![0, 2, -1, -2]
    );
    assert_eq!(
        ctx.managed_accessed_by(m, PAGE, 4).unwrap(),
        vec![0, 1, 2, -1]
    );
    // Mixed after an unset on one page.
    advise(
        &ctx,
        m + PAGE,
        PAGE,
        Advice::UnsetAccessedBy,
        Location::Device(2),
    );
    assert_eq!(
        ctx.managed_accessed_by(m, 2 * PAGE, 3).unwrap(),
        vec![0, -1, -2]
    );
    // Unset everywhere.
    for l in [
        Location::Device(0),
        Location::Device(1),
        Location::Device(2),
        Location::Host,
    ] {
        advise(&ctx, m, 2 * PAGE, Advice::UnsetAccessedBy, l);
    }
    assert_eq!(
        ctx.managed_accessed_by(m, 2 * PAGE, 2).unwrap(),
        vec![-2, -2]
    );
    // ACCESSED_BY never moved the other attributes.
    assert_eq!(scalars(&ctx, m, 2 * PAGE), FRESH);
}

#[test]
fn last_prefetch_location_after_prefetch_to_the_host_and_to_each_device() {
    if common::skip() {
        return;
    }
    let (rt, ctx, m) = setup();
    prefetch(&rt, &ctx, m, 2 * PAGE, Location::Host);
    assert_eq!(scalars(&ctx, m, 2 * PAGE)[4..], [-1, lt::HOST as i32, -2]);
    for d in 0..rt.driver().device_list().len() as u32 {
        prefetch(&rt, &ctx, m, 2 * PAGE, Location::Device(d));
        assert_eq!(
            scalars(&ctx, m, 2 * PAGE)[4..],
            [d as i32, lt::DEVICE as i32, d as i32]
        );
        assert_eq!(ctx.managed_residency(m).unwrap().devices, vec![d]);
        // Prefetch is not advice.
        assert_eq!(scalars(&ctx, m, 2 * PAGE)[..4], FRESH[..4]);
    }
    let node = numa_nodes()[0];
    prefetch(&rt, &ctx, m, 2 * PAGE, Location::HostNuma(node));
    assert_eq!(
        scalars(&ctx, m, 2 * PAGE)[4..],
        [node as i32, lt::HOST_NUMA as i32, node as i32]
    );
    assert!(ctx.managed_residency(m).unwrap().host);
}

#[test]
fn last_prefetch_location_mixed_and_half_covered() {
    if common::skip() {
        return;
    }
    let (rt, ctx, m) = setup();
    if common::fewer_devices_than(&rt, DEVICES as usize) {
        return;
    }
    prefetch(&rt, &ctx, m, PAGE, Location::Device(1));
    // Half-covered.
    assert_eq!(scalars(&ctx, m, 2 * PAGE)[4..], FRESH[4..]);
    assert_eq!(scalars(&ctx, m, PAGE)[4..], [1, lt::DEVICE as i32, 1]);
    // Mixed: device 1 and device 2; device 1 and the host.
    prefetch(&rt, &ctx, m + PAGE, PAGE, Location::Device(2));
    assert_eq!(scalars(&ctx, m, 2 * PAGE)[4..], FRESH[4..]);
    prefetch(&rt, &ctx, m + PAGE, PAGE, Location::Host);
    assert_eq!(scalars(&ctx, m, 2 * PAGE)[4..], FRESH[4..]);
    assert_eq!(
        scalars(&ctx, m + PAGE, PAGE)[4..],
        [-1, lt::HOST as i32, -2]
    );
}

#[test]
fn get_attrs_answers_all_eight_at_once_like_get_attr() {
    if common::skip() {
        return;
    }
    let (rt, ctx, m) = setup();
    if common::fewer_devices_than(&rt, DEVICES as usize) {
        return;
    }
    advise(&ctx, m, 2 * PAGE, Advice::SetReadMostly, Location::Host);
    advise(
        &ctx,
        m,
        2 * PAGE,
        Advice::SetPreferredLocation,
        Location::Device(2),
    );
    advise(
        &ctx,
        m,
        2 * PAGE,
        Advice::SetAccessedBy,
        Location::Device(2),
    );
    prefetch(&rt, &ctx, m, 2 * PAGE, Location::Device(1));
    let mut bufs: Vec<Vec<u8>> = A::ALL
        .iter()
        .map(|&a| vec![0u8; if a == A::AccessedBy { 8 } else { 4 }])
        .collect();
    let mut refs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
    ctx.managed_get_attrs(&A::ALL, m, 2 * PAGE, &mut refs)
        .unwrap();
    let v: Vec<i32> = bufs
        .iter()
        .flat_map(|b| {
            b.chunks(4)
                .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
        })
        .collect();
    assert_eq!(
        v,
        vec![1, 2, 2, -2, lt::DEVICE as i32, 2, 1, lt::DEVICE as i32, 1]
    );
    // Read-mostly: prefetch and preferred device made copies; the host keeps its own.
    if !common::part_not_applicable_on(
        hetmem::BackendKind::Cuda,
        "the read-mostly copies on the host (read-only) and on devices 1 and 2 at once: they are \
         the host engine's residency; CUDA duplicates read-mostly pages itself and tells nobody \
         where (hetmem's record holds one place per page)",
    ) {
        let r = ctx.managed_residency(m).unwrap();
        assert_eq!(
            (r.host, r.host_read_only, r.devices),
            (true, true, vec![1, 2])
        );
    }
}
