//! The inputs of `shared/cases/managed.md`, each a test that keeps its answer, on the backend
//! under test (`HETMEM_BACKEND`; managed memory is host-reachable on both backends).

mod common;

use common::{attr, context_with};

use hetmem::{Advice, Context, Location, RangeAttribute, Runtime, ACL_RT_MEM_ATTACH_GLOBAL};

const MIB: usize = 1 << 20;

fn setup() -> (Runtime, Context) {
    context_with(2, 64 << 20)
}

/// Case 1: size 0 -> 100000, and no pointer is produced.
#[test]
fn case1_alloc_size_0_is_invalid_param() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let e = ctx.alloc_managed(0, ACL_RT_MEM_ATTACH_GLOBAL).unwrap_err();
    assert_eq!(e.acl_error(), 100_000, "{e}");
    assert_eq!(rt.driver().managed_stats().allocations, 0);
}

/// Case 2: prefetch of ordinary device memory -> 107000; nothing migrates; the next valid
/// prefetch on the same stream succeeds.
#[test]
fn case2_prefetch_of_device_memory_is_param_invalid_and_stream_stays_usable() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let dev = rt.driver().device(0).unwrap();
    let plain = ctx
        .alloc_device(&dev, &hetmem::AllocDesc::new(4 * MIB))
        .unwrap();
    let m = ctx.alloc_managed(4 << 20, 1).unwrap();
    let s = ctx.create_stream(&dev).unwrap();
    let before = rt.driver().managed_stats();
    let e = ctx
        .mem_prefetch(plain, 4 * MIB, Location::Device(0), 0, &s)
        .unwrap_err();
    assert_eq!(e.acl_error(), 107_000, "{e}");
    s.synchronize().unwrap();
    assert_eq!(rt.driver().managed_stats(), before);
    ctx.mem_prefetch(m, 4 * MIB, Location::Device(0), 0, &s)
        .unwrap();
    s.synchronize().unwrap();
    assert_eq!(rt.driver().managed_stats().devices[0].resident_pages, 2);
}

/// Case 3: prefetch with size 0 -> 100000; then a valid call on the same stream succeeds.
#[test]
fn case3_prefetch_size_0_is_invalid_param_then_valid_call_succeeds() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    if common::fewer_devices_than(&rt, 2) {
        return;
    }
    let dev = rt.driver().device(1).unwrap();
    let m = ctx.alloc_managed(4 << 20, 1).unwrap();
    let s = ctx.create_stream(&dev).unwrap();
    let e = ctx
        .mem_prefetch(m, 0, Location::Device(1), 0, &s)
        .unwrap_err();
    assert_eq!(e.acl_error(), 100_000, "{e}");
    ctx.mem_prefetch(m, 2 * MIB, Location::Device(1), 0, &s)
        .unwrap();
    s.synchronize().unwrap();
    assert_eq!(ctx.managed_residency(m).unwrap().devices, vec![1]);
}

/// Case 4: a fresh 4 MiB allocation: PREFERRED_LOCATION -2, its type INVALID (0),
/// LAST_PREFETCH_LOCATION -2.
#[test]
fn case4_fresh_allocation_answers_minus2_and_invalid() {
    if common::skip() {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(4 << 20, 1).unwrap();
    assert_eq!(
        attr(&ctx, RangeAttribute::PreferredLocation, m, 4 * MIB),
        -2
    );
    assert_eq!(
        attr(&ctx, RangeAttribute::PreferredLocationType, m, 4 * MIB),
        0
    );
    assert_eq!(
        attr(&ctx, RangeAttribute::LastPrefetchLocation, m, 4 * MIB),
        -2
    );
}

/// Case 5: SET_PREFERRED_LOCATION to device id = number of devices -> 107000, nothing changed.
#[test]
fn case5_preferred_location_one_past_last_device_is_param_invalid() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let m = ctx.alloc_managed(4 << 20, 1).unwrap();
    let n = rt.driver().devices().len() as u32;
    let e = ctx
        .mem_advise(
            m,
            4 * MIB,
            Advice::SetPreferredLocation,
            Location::Device(n),
        )
        .unwrap_err();
    assert_eq!(e.acl_error(), 107_000, "{e}");
    assert!(e.message().contains(&n.to_string()));
    assert_eq!(
        attr(&ctx, RangeAttribute::PreferredLocation, m, 4 * MIB),
        -2
    );
    assert_eq!(ctx.managed_residency(m), None);
}

/// Case 6: SET_READ_MOSTLY with 3 MiB -> 107000, nothing changed; with 2 MiB it succeeds and
/// READ_MOSTLY reads 1 over the first 2 MiB and 0 over all 4 MiB.
#[test]
fn case6_read_mostly_size_must_be_a_multiple_of_2_mib() {
    if common::skip() {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(4 << 20, 1).unwrap();
    let e = ctx
        .mem_advise(m, 3 * MIB, Advice::SetReadMostly, Location::Host)
        .unwrap_err();
    assert_eq!(e.acl_error(), 107_000, "{e}");
    assert_eq!(attr(&ctx, RangeAttribute::ReadMostly, m, 2 * MIB), 0);
    ctx.mem_advise(m, 2 * MIB, Advice::SetReadMostly, Location::Host)
        .unwrap();
    assert_eq!(attr(&ctx, RangeAttribute::ReadMostly, m, 2 * MIB), 1);
    assert_eq!(attr(&ctx, RangeAttribute::ReadMostly, m, 4 * MIB), 0);
}

/// Case 7: GetAttr READ_MOSTLY with dataSize 8 -> 107000; with 4 -> success.
#[test]
fn case7_read_mostly_data_size_must_be_4() {
    if common::skip() {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(4 << 20, 1).unwrap();
    let mut b8 = [0u8; 8];
    let e = ctx
        .managed_get_attr(RangeAttribute::ReadMostly, m, 4 * MIB, &mut b8)
        .unwrap_err();
    assert_eq!(e.acl_error(), 107_000, "{e}");
    let mut b4 = [0xffu8; 4];
    ctx.managed_get_attr(RangeAttribute::ReadMostly, m, 4 * MIB, &mut b4)
        .unwrap();
    assert_eq!(i32::from_ne_bytes(b4), 0);
}

/// Case 8: SET_ACCESSED_BY device 0 keeps an earlier SET_READ_MOSTLY; prefetching clears
/// neither.
#[test]
fn case8_accessed_by_and_prefetch_keep_read_mostly() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let m = ctx.alloc_managed(4 << 20, 1).unwrap();
    ctx.mem_advise(m, 4 * MIB, Advice::SetReadMostly, Location::Host)
        .unwrap();
    ctx.mem_advise(m, 4 * MIB, Advice::SetAccessedBy, Location::Device(0))
        .unwrap();
    assert_eq!(attr(&ctx, RangeAttribute::ReadMostly, m, 4 * MIB), 1);
    assert_eq!(ctx.managed_accessed_by(m, 4 * MIB, 2).unwrap(), vec![0, -2]);
    let s = ctx.create_stream(&rt.driver().device(0).unwrap()).unwrap();
    ctx.mem_prefetch(m, 4 * MIB, Location::Device(0), 0, &s)
        .unwrap();
    s.synchronize().unwrap();
    assert_eq!(attr(&ctx, RangeAttribute::ReadMostly, m, 4 * MIB), 1);
    assert_eq!(ctx.managed_accessed_by(m, 4 * MIB, 2).unwrap(), vec![0, -2]);
    assert_eq!(
        attr(&ctx, RangeAttribute::LastPrefetchLocation, m, 4 * MIB),
        0
    );
}
