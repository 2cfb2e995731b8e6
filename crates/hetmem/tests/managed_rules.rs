//! One test per allocation / advise / prefetch / get-attr rule and error of ACL managed memory,
//! on the backend under test (`HETMEM_BACKEND`; managed memory is host-reachable on both).
//!
//! On cuda managed memory is `cuMemAllocManaged` and the residency `managed_residency` reports
//! is the backend's record of where hetmem last moved or used each page (CUDA has no query):
//! the host engine's own mechanics (read-only host copies of read-mostly pages, host fault
//! counts, device room charged to `used_memory`, the 3 TiB process total) are not applicable
//! there, each with its reason. The tests that name device 1 use the last device (device 1 of
//! the host backend's two; the one GPU on a machine of one) where any second device does.

mod common;

use common::{attr, byte, context_with, output_text, run_test_in_child, runtime_with, stream};

use hetmem::managed::{current_numa_node, location_type};
use hetmem::{
    Advice, BackendKind::Cuda, Context, Error, Location, RangeAttribute, Runtime, Stream,
    MANAGED_PAGE_SIZE as PAGE,
};

const TIB: u64 = 1 << 40;

/// The last device's ordinal (1 on the host backend's two devices; 0 with one GPU).
fn last(rt: &Runtime) -> u32 {
    rt.driver().device_list().len() as u32 - 1
}

/// Whether the host fault counts apply (the host backend's userfaultfd engine counts them);
/// elsewhere false after a loud line.
fn host_faults_apply() -> bool {
    !common::part_not_applicable_on(
        Cuda,
        "the host fault counts: they are the host engine's (userfaultfd); on cuda the driver \
         migrates on fault and hetmem counts none",
    )
}

/// Whether fresh managed memory reads zero (the host engine zero-fills pages on first touch);
/// elsewhere false after a loud line. The spec does not ask it: aclrtMallocManaged memory "is
/// not initialized".
fn fresh_is_zero() -> bool {
    !common::part_not_applicable_on(
        Cuda,
        "fresh managed memory reading zero: the host engine zero-fills, but aclrtMemAllocManaged \
         memory is not initialized (spec), and cuMemAllocManaged promises nothing",
    )
}

fn setup() -> (Runtime, Context) {
    context_with(2, 64 << 20)
}

fn code<T: std::fmt::Debug>(r: hetmem::Result<T>) -> u32 {
    r.unwrap_err().acl_error()
}

// ---- allocation ----

#[test]
fn alloc_rounds_size_up_to_2_mib_and_aligns_to_2_mib() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    for (ask, got) in [
        (1u64, PAGE),
        (PAGE as u64, PAGE),
        (PAGE as u64 + 1, 2 * PAGE),
    ] {
        let before = rt.driver().managed_stats().bytes;
        let m = ctx.alloc_managed(ask, 1).unwrap();
        assert_eq!(m % PAGE, 0);
        assert_eq!(rt.driver().managed_stats().bytes - before, got as u64);
        // The whole rounded size is usable.
        ctx.managed_memset(m, 1, got).unwrap();
    }
}

#[test]
fn alloc_flag_other_than_attach_global_is_invalid_param() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    for flag in [0, 2, 3, 0x8000_0000] {
        let e = ctx.alloc_managed(PAGE as u64, flag).unwrap_err();
        assert_eq!(e.acl_error(), 100_000);
        assert!(e.message().contains(&format!("{flag:#x}")), "{e}");
    }
    assert_eq!(rt.driver().managed_stats().allocations, 0);
}

#[test]
fn alloc_of_more_than_3_tib_at_once_is_param_invalid() {
    if common::skip() {
        return;
    }
    let (_rt, ctx) = setup();
    assert_eq!(code(ctx.alloc_managed(3 * TIB + 1, 1)), 107_000);
    assert_eq!(code(ctx.alloc_managed(u64::MAX, 1)), 107_000);
}

/// The 3 TiB limit is per process: run alone in a child so other tests' allocations do not
/// count.
#[test]
fn alloc_past_3_tib_in_total_is_a_memory_allocation_error() {
    if common::not_applicable_on(
        Cuda,
        "allocates 3 TiB of managed memory in all; cuda refuses managed memory past the GPU's \
         free memory (cuMemGetInfo, about 139 GiB), since more can hang the GPU",
    ) || common::skip()
    {
        return;
    }
    let out = run_test_in_child("limit_child", &[("HETMEM_MANAGED_LIMIT_CHILD", "1")]);
    let text = output_text(&out);
    assert!(
        out.status.success() && text.contains("limit child ok"),
        "{text}"
    );
}

#[test]
fn limit_child() {
    if common::skip() {
        return;
    }
    if std::env::var_os("HETMEM_MANAGED_LIMIT_CHILD").is_none() {
        return;
    }
    let rt = runtime_with(1, 64 << 20);
    let ctx = rt.driver().create_context().unwrap();
    let a = ctx.alloc_managed(2 * TIB, 1).unwrap();
    let b = ctx.alloc_managed(TIB - PAGE as u64, 1).unwrap();
    let c = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    let e = ctx.alloc_managed(1, 1).unwrap_err();
    assert_eq!(e.acl_error(), 207_001, "{e}");
    assert!(e.message().contains("3 TiB"), "{e}");
    ctx.free_managed(c).unwrap();
    let c = ctx.alloc_managed(1, 1).unwrap();
    for p in [a, b, c] {
        ctx.free_managed(p).unwrap();
    }
    println!("limit child ok");
}

#[test]
fn free_needs_the_base_of_a_live_managed_allocation() {
    if common::skip() {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(2 * PAGE as u64, 1).unwrap();
    assert_eq!(code(ctx.free_managed(0)), 100_000);
    assert_eq!(code(ctx.free_managed(m + PAGE)), 107_000);
    assert_eq!(code(ctx.free_managed(0x1000)), 107_000);
    ctx.free_managed(m).unwrap();
    assert_eq!(code(ctx.free_managed(m)), 107_000);
    assert!(!ctx.is_managed(m));
}

#[test]
fn free_by_another_context_is_param_invalid() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let other = rt.driver().create_context().unwrap();
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    assert_eq!(code(other.free_managed(m)), 107_000);
    ctx.free_managed(m).unwrap();
}

#[test]
fn freeing_gives_device_capacity_back() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let m = ctx.alloc_managed(4 * PAGE as u64, 1).unwrap();
    let s = stream(&rt, &ctx, 0);
    ctx.mem_prefetch(m, 4 * PAGE, Location::Device(0), 0, &s)
        .unwrap();
    s.synchronize().unwrap();
    let dev = rt.driver().device(0).unwrap();
    let room = !common::part_not_applicable_on(
        Cuda,
        "the device capacity managed pages hold (used_memory): the device room is the host \
         engine's; on cuda the driver accounts managed memory itself",
    );
    if room {
        assert_eq!(dev.used_memory(), 4 * PAGE as u64);
    }
    ctx.free_managed(m).unwrap();
    if room {
        assert_eq!(dev.used_memory(), 0);
    }
    assert_eq!(rt.driver().managed_stats().devices[0].resident_pages, 0);
}

// ---- error mapping ----

#[test]
fn every_error_variant_maps_to_an_acl_code() {
    if common::skip() {
        return;
    }
    let s = String::new;
    let cases = [
        (Error::InvalidNullPointer(s()), 100_000),
        (Error::InvalidSize(s()), 100_000),
        (Error::InvalidEnumeration(s()), 100_000),
        (Error::InvalidArgument(s()), 107_000),
        (Error::UnsupportedEnumeration(s()), 107_000),
        (Error::UnsupportedSize(s()), 107_000),
        (Error::AddressNotFound(s()), 107_000),
        (Error::InvalidNullHandle(s()), 107_000),
        (Error::HandleObjectInUse(s()), 107_000),
        (Error::UnsupportedAlignment(s()), 107_008),
        (Error::UnsupportedFeature(s()), 207_000),
        (Error::Uninitialized(s()), 207_000),
        (Error::OutOfHostMemory(s()), 207_001),
        (Error::OutOfDeviceMemory(s()), 207_001),
        (Error::Unknown(s()), 507_899),
    ];
    for (e, v) in cases {
        assert_eq!(e.acl_error(), v, "{}", e.ze_name());
    }
}

// ---- enumerations and locations ----

#[test]
fn advice_values_outside_0_to_5_are_param_invalid() {
    if common::skip() {
        return;
    }
    for v in 0..6 {
        assert_eq!(Advice::from_raw(v).unwrap().raw(), v);
    }
    assert_eq!(code(Advice::from_raw(6)), 107_000);
    assert_eq!(code(Advice::from_raw(u32::MAX)), 107_000);
}

#[test]
fn attribute_values_outside_1_to_8_are_param_invalid() {
    if common::skip() {
        return;
    }
    for v in 1..=8 {
        assert_eq!(RangeAttribute::from_raw(v).unwrap() as u32, v);
    }
    assert_eq!(code(RangeAttribute::from_raw(0)), 107_000);
    assert_eq!(code(RangeAttribute::from_raw(9)), 107_000);
}

#[test]
fn location_type_over_4_is_param_invalid() {
    if common::skip() {
        return;
    }
    assert_eq!(code(Location::from_raw(5, 0)), 107_000);
    assert_eq!(Location::from_raw(1, 1).unwrap(), Location::Device(1));
    assert_eq!(Location::from_raw(2, -7).unwrap(), Location::Host);
    assert_eq!(
        Location::from_raw(4, -7).unwrap(),
        Location::HostNumaCurrent
    );
    assert_eq!(code(Location::from_raw(1, -1)), 107_000);
    assert_eq!(code(Location::from_raw(3, -1)), 107_000);
}

#[test]
fn numa_node_that_does_not_exist_is_param_invalid_and_changes_nothing() {
    if common::skip() {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    let e = ctx
        .mem_advise(
            m,
            PAGE,
            Advice::SetPreferredLocation,
            Location::HostNuma(4096),
        )
        .unwrap_err();
    assert_eq!(e.acl_error(), 107_000);
    assert!(e.message().contains("4096"), "{e}");
    assert_eq!(attr(&ctx, RangeAttribute::PreferredLocation, m, PAGE), -2);
}

#[test]
fn host_numa_location_uses_real_node_ids() {
    if common::skip() {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    let node = hetmem::managed::numa_nodes()[0];
    ctx.mem_advise(
        m,
        PAGE,
        Advice::SetPreferredLocation,
        Location::HostNuma(node),
    )
    .unwrap();
    assert_eq!(
        attr(&ctx, RangeAttribute::PreferredLocationType, m, PAGE),
        location_type::HOST_NUMA as i32
    );
    assert_eq!(
        attr(&ctx, RangeAttribute::PreferredLocationId, m, PAGE),
        node as i32
    );
    assert_eq!(
        attr(&ctx, RangeAttribute::PreferredLocation, m, PAGE),
        node as i32
    );
}

#[test]
fn host_numa_current_resolves_to_the_calling_threads_node() {
    if common::skip() {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    ctx.mem_advise(
        m,
        PAGE,
        Advice::SetPreferredLocation,
        Location::HostNumaCurrent,
    )
    .unwrap();
    assert_eq!(
        attr(&ctx, RangeAttribute::PreferredLocationType, m, PAGE),
        location_type::HOST_NUMA as i32
    );
    assert_eq!(
        attr(&ctx, RangeAttribute::PreferredLocationId, m, PAGE),
        current_numa_node() as i32
    );
    assert!(hetmem::managed::numa_nodes().contains(&current_numa_node()));
}

// ---- advise: arguments ----

#[test]
fn advise_null_pointer_or_size_0_is_invalid_param() {
    if common::skip() {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    assert_eq!(
        code(ctx.mem_advise(0, PAGE, Advice::SetReadMostly, Location::Host)),
        100_000
    );
    assert_eq!(
        code(ctx.mem_advise(m, 0, Advice::SetReadMostly, Location::Host)),
        100_000
    );
}

#[test]
fn advise_size_not_a_multiple_of_2_mib_or_over_3_tib_is_param_invalid() {
    if common::skip() {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(4 * PAGE as u64, 1).unwrap();
    for size in [1, 4096, PAGE + 4096, 3 * TIB as usize + PAGE] {
        let e = ctx
            .mem_advise(m, size, Advice::SetReadMostly, Location::Host)
            .unwrap_err();
        assert_eq!(e.acl_error(), 107_000, "{size:#x}: {e}");
    }
    assert_eq!(attr(&ctx, RangeAttribute::ReadMostly, m, PAGE), 0);
}

#[test]
fn advise_pointer_not_aligned_to_2_mib_is_addr_unaligned() {
    if common::skip() {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(4 * PAGE as u64, 1).unwrap();
    let e = ctx
        .mem_advise(m + 4096, PAGE, Advice::SetReadMostly, Location::Host)
        .unwrap_err();
    assert_eq!(e.acl_error(), 107_008, "{e}");
    assert_eq!(attr(&ctx, RangeAttribute::ReadMostly, m, 4 * PAGE), 0);
}

#[test]
fn advise_outside_managed_memory_is_param_invalid() {
    if common::skip() {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(2 * PAGE as u64, 1).unwrap();
    let heap = vec![0u8; 4 * PAGE];
    let aligned = (heap.as_ptr() as usize + PAGE - 1) & !(PAGE - 1);
    assert_eq!(
        code(ctx.mem_advise(aligned, PAGE, Advice::SetReadMostly, Location::Host)),
        107_000
    );
    // Running past the end of the allocation.
    assert_eq!(
        code(ctx.mem_advise(m + PAGE, 2 * PAGE, Advice::SetReadMostly, Location::Host)),
        107_000
    );
    assert_eq!(attr(&ctx, RangeAttribute::ReadMostly, m, 2 * PAGE), 0);
}

#[test]
fn advise_bad_device_id_is_param_invalid_for_every_advice_that_reads_the_location() {
    if common::skip() {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    for adv in [
        Advice::SetPreferredLocation,
        Advice::SetAccessedBy,
        Advice::UnsetAccessedBy,
        Advice::UnsetReadMostly,
    ] {
        let e = ctx
            .mem_advise(m, PAGE, adv, Location::Device(2))
            .unwrap_err();
        assert_eq!(e.acl_error(), 107_000, "{adv:?}");
    }
    assert_eq!(ctx.managed_residency(m), None);
}

#[test]
fn advise_invalid_location_type_is_param_invalid_except_where_it_means_the_host() {
    if common::skip() {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    for adv in [
        Advice::SetPreferredLocation,
        Advice::SetAccessedBy,
        Advice::UnsetAccessedBy,
    ] {
        assert_eq!(
            code(ctx.mem_advise(m, PAGE, adv, Location::Invalid)),
            107_000
        );
    }
    ctx.mem_advise(m, PAGE, Advice::SetReadMostly, Location::Invalid)
        .unwrap();
    ctx.mem_advise(m, PAGE, Advice::UnsetReadMostly, Location::Invalid)
        .unwrap();
    ctx.mem_advise(m, PAGE, Advice::UnsetPreferredLocation, Location::Invalid)
        .unwrap();
}

// ---- advise: semantics ----

#[test]
fn set_read_mostly_makes_a_read_only_host_copy_at_once() {
    if common::not_applicable_on(
        Cuda,
        "read-only host copies of read-mostly pages beside a device copy, and host fault \
         counts, are the host engine's residency; CUDA duplicates read-mostly pages itself and \
         tells nobody where (hetmem's record holds one place per page)",
    ) || common::skip()
    {
        return;
    }
    let (rt, ctx) = setup();
    let m = ctx.alloc_managed(2 * PAGE as u64, 1).unwrap();
    let s = stream(&rt, &ctx, 1);
    s.memset_async(m, 3, PAGE).unwrap();
    s.synchronize().unwrap();
    ctx.mem_advise(m, 2 * PAGE, Advice::SetReadMostly, Location::Device(9))
        .unwrap();
    let r0 = ctx.managed_residency(m).unwrap();
    assert_eq!(
        (r0.host, r0.host_read_only, r0.devices),
        (true, true, vec![1])
    );
    let r1 = ctx.managed_residency(m + PAGE).unwrap();
    assert_eq!((r1.host, r1.host_read_only), (true, true));
    let f = rt.driver().managed_stats().host_faults;
    assert_eq!(byte(m + 10), 3);
    assert_eq!(byte(m + PAGE + 10), 0);
    assert_eq!(rt.driver().managed_stats().host_faults, f);
}

#[test]
fn unset_read_mostly_keeps_one_copy_at_the_location() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    ctx.managed_memset(m, 5, PAGE).unwrap();
    ctx.mem_advise(m, PAGE, Advice::SetReadMostly, Location::Host)
        .unwrap();
    let s = stream(&rt, &ctx, 0);
    ctx.mem_prefetch(m, PAGE, Location::Device(0), 0, &s)
        .unwrap();
    s.synchronize().unwrap();
    assert_eq!(ctx.managed_residency(m).unwrap().devices, vec![0]);
    ctx.mem_advise(m, PAGE, Advice::UnsetReadMostly, Location::Device(0))
        .unwrap();
    let r = ctx.managed_residency(m).unwrap();
    assert_eq!((r.host, r.devices), (false, vec![0]));
    assert_eq!(attr(&ctx, RangeAttribute::ReadMostly, m, PAGE), 0);
    assert_eq!(byte(m + 9), 5);
    // INVALID means the host.
    ctx.mem_advise(m, PAGE, Advice::SetReadMostly, Location::Host)
        .unwrap();
    ctx.mem_prefetch(m, PAGE, Location::Device(0), 0, &s)
        .unwrap();
    s.synchronize().unwrap();
    ctx.mem_advise(m, PAGE, Advice::UnsetReadMostly, Location::Invalid)
        .unwrap();
    let r = ctx.managed_residency(m).unwrap();
    assert_eq!((r.host, r.host_read_only, r.devices), (true, false, vec![]));
}

#[test]
fn set_preferred_location_host_fails_while_a_page_is_on_a_device() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let m = ctx.alloc_managed(2 * PAGE as u64, 1).unwrap();
    let s = stream(&rt, &ctx, 0);
    s.memset_async(m + PAGE, 1, 1).unwrap();
    s.synchronize().unwrap();
    let e = ctx
        .mem_advise(m, 2 * PAGE, Advice::SetPreferredLocation, Location::Host)
        .unwrap_err();
    assert_eq!(e.acl_error(), 107_000);
    assert!(e.message().contains("device 0"), "{e}");
    assert_eq!(
        attr(&ctx, RangeAttribute::PreferredLocation, m, 2 * PAGE),
        -2
    );
    assert_eq!(ctx.managed_residency(m), None);
}

#[test]
fn set_preferred_location_host_populates_the_host_at_once() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let m = ctx.alloc_managed(2 * PAGE as u64, 1).unwrap();
    ctx.mem_advise(m, 2 * PAGE, Advice::SetPreferredLocation, Location::Host)
        .unwrap();
    assert!(ctx.managed_residency(m).unwrap().host);
    assert!(ctx.managed_residency(m + PAGE).unwrap().host);
    let f = rt.driver().managed_stats().host_faults;
    if fresh_is_zero() {
        assert_eq!(byte(m + PAGE + 1), 0);
    }
    if host_faults_apply() {
        assert_eq!(rt.driver().managed_stats().host_faults, f);
    }
    assert_eq!(
        attr(&ctx, RangeAttribute::PreferredLocation, m, 2 * PAGE),
        -1
    );
}

#[test]
fn set_preferred_location_device_fails_while_mapped_on_host_or_another_device() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    if common::fewer_devices_than(&rt, 2) {
        return;
    }
    let m = ctx.alloc_managed(2 * PAGE as u64, 1).unwrap();
    ctx.managed_memset(m, 1, 1).unwrap();
    assert_eq!(
        code(ctx.mem_advise(
            m,
            2 * PAGE,
            Advice::SetPreferredLocation,
            Location::Device(0)
        )),
        107_000
    );
    let s = stream(&rt, &ctx, 1);
    ctx.mem_prefetch(m, PAGE, Location::Device(1), 0, &s)
        .unwrap();
    s.synchronize().unwrap();
    assert_eq!(
        code(ctx.mem_advise(
            m,
            2 * PAGE,
            Advice::SetPreferredLocation,
            Location::Device(0)
        )),
        107_000
    );
    assert_eq!(
        attr(&ctx, RangeAttribute::PreferredLocation, m, 2 * PAGE),
        -2
    );
    assert_eq!(ctx.managed_residency(m + PAGE), None);
    // To the device it is on: fine, and the untouched page is allocated there at once.
    ctx.mem_advise(
        m,
        2 * PAGE,
        Advice::SetPreferredLocation,
        Location::Device(1),
    )
    .unwrap();
    assert_eq!(ctx.managed_residency(m + PAGE).unwrap().devices, vec![1]);
    assert_eq!(
        attr(&ctx, RangeAttribute::PreferredLocation, m, 2 * PAGE),
        1
    );
}

#[test]
fn set_preferred_location_device_larger_than_the_device_is_a_memory_error() {
    if common::not_applicable_on(
        Cuda,
        "prefers 128 MiB on a host device of 64 MiB; a GPU's room is its free memory (tens of \
         GiB), which is not exhausted here",
    ) || common::skip()
    {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(64 * PAGE as u64, 1).unwrap();
    let e = ctx
        .mem_advise(
            m,
            64 * PAGE,
            Advice::SetPreferredLocation,
            Location::Device(0),
        )
        .unwrap_err();
    assert_eq!(e.acl_error(), 207_001, "{e}");
    assert_eq!(ctx.managed_residency(m), None);
}

#[test]
fn set_preferred_location_on_read_mostly_pages_copies_to_a_device_and_leaves_the_host() {
    if common::not_applicable_on(
        Cuda,
        "read-only host copies of read-mostly pages beside a device copy are the host engine's \
         residency; CUDA duplicates read-mostly pages itself and tells nobody where (hetmem's \
         record holds one place per page)",
    ) || common::skip()
    {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    ctx.managed_memset(m, 8, PAGE).unwrap();
    ctx.mem_advise(m, PAGE, Advice::SetReadMostly, Location::Host)
        .unwrap();
    ctx.mem_advise(m, PAGE, Advice::SetPreferredLocation, Location::Device(1))
        .unwrap();
    let r = ctx.managed_residency(m).unwrap();
    assert_eq!(
        (r.host, r.host_read_only, r.devices.clone()),
        (true, true, vec![1])
    );
    ctx.mem_advise(m, PAGE, Advice::SetPreferredLocation, Location::Host)
        .unwrap();
    let r2 = ctx.managed_residency(m).unwrap();
    assert_eq!(r2, r);
    assert_eq!(attr(&ctx, RangeAttribute::PreferredLocation, m, PAGE), -1);
}

#[test]
fn set_accessed_by_where_the_range_prefers_to_live_maps_it_there() {
    if common::skip() {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    // No preference: only recorded.
    ctx.mem_advise(m, PAGE, Advice::SetAccessedBy, Location::Device(0))
        .unwrap();
    assert_eq!(ctx.managed_residency(m), None);
    ctx.mem_advise(m, PAGE, Advice::UnsetAccessedBy, Location::Device(0))
        .unwrap();
    assert_eq!(ctx.managed_accessed_by(m, PAGE, 1).unwrap(), vec![-2]);
    // Preferred device 0 (allocated there at once), then the host pulls it over; accessed-by
    // device 0 maps it back on device 0 ahead of use.
    ctx.mem_advise(m, PAGE, Advice::SetPreferredLocation, Location::Device(0))
        .unwrap();
    assert_eq!(ctx.managed_residency(m).unwrap().devices, vec![0]);
    ctx.managed_memset(m, 7, 1).unwrap();
    assert_eq!(ctx.managed_residency(m).unwrap().devices, Vec::<u32>::new());
    ctx.mem_advise(m, PAGE, Advice::SetAccessedBy, Location::Device(0))
        .unwrap();
    if !common::part_not_applicable_on(
        Cuda,
        "accessed-by moving a page back to the preferred device ahead of use: CUDA's \
         SET_ACCESSED_BY maps the pages for the device where they are, without migrating them",
    ) {
        let r = ctx.managed_residency(m).unwrap();
        assert_eq!((r.host, r.devices), (false, vec![0]));
    }
    assert_eq!(ctx.managed_accessed_by(m, PAGE, 1).unwrap(), vec![0]);
    assert_eq!(byte(m), 7);
    // Accessed by the host where the host is preferred: populated on the host.
    let n = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    ctx.mem_advise(n, PAGE, Advice::SetAccessedBy, Location::Host)
        .unwrap();
    assert_eq!(ctx.managed_residency(n), None);
    assert_eq!(ctx.managed_accessed_by(n, PAGE, 2).unwrap(), vec![-1, -2]);
}

#[test]
fn unset_preferred_location_forgets_the_preference() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    ctx.mem_advise(
        m,
        PAGE,
        Advice::SetPreferredLocation,
        Location::Device(last(&rt)),
    )
    .unwrap();
    ctx.mem_advise(
        m,
        PAGE,
        Advice::UnsetPreferredLocation,
        Location::Device(77),
    )
    .unwrap();
    assert_eq!(attr(&ctx, RangeAttribute::PreferredLocation, m, PAGE), -2);
    assert_eq!(
        attr(&ctx, RangeAttribute::PreferredLocationType, m, PAGE),
        0
    );
}

#[test]
fn failed_advice_leaves_later_calls_working() {
    if common::skip() {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    for _ in 0..3 {
        assert!(ctx
            .mem_advise(m + 1, PAGE, Advice::SetReadMostly, Location::Host)
            .is_err());
        assert!(ctx
            .mem_advise(m, PAGE, Advice::SetAccessedBy, Location::Device(5))
            .is_err());
    }
    ctx.mem_advise(m, PAGE, Advice::SetReadMostly, Location::Host)
        .unwrap();
    assert_eq!(attr(&ctx, RangeAttribute::ReadMostly, m, PAGE), 1);
}

// ---- prefetch ----

#[test]
fn prefetch_flags_must_be_0() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    let s = stream(&rt, &ctx, 0);
    let e = ctx
        .mem_prefetch(m, PAGE, Location::Device(0), 1, &s)
        .unwrap_err();
    assert_eq!(e.acl_error(), 100_000);
    assert_eq!(
        attr(&ctx, RangeAttribute::LastPrefetchLocation, m, PAGE),
        -2
    );
}

#[test]
fn prefetch_argument_errors_record_nothing_and_keep_the_stream_usable() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let m = ctx.alloc_managed(2 * PAGE as u64, 1).unwrap();
    let s = stream(&rt, &ctx, 0);
    let d0 = Location::Device(0);
    assert_eq!(code(ctx.mem_prefetch(0, PAGE, d0, 0, &s)), 100_000);
    assert_eq!(code(ctx.mem_prefetch(m, PAGE + 1, d0, 0, &s)), 107_000);
    assert_eq!(code(ctx.mem_prefetch(m + 4096, PAGE, d0, 0, &s)), 107_008);
    assert_eq!(code(ctx.mem_prefetch(m, 4 * PAGE, d0, 0, &s)), 107_000);
    assert_eq!(
        code(ctx.mem_prefetch(m, PAGE, Location::Device(2), 0, &s)),
        107_000
    );
    assert_eq!(
        code(ctx.mem_prefetch(m, PAGE, Location::Invalid, 0, &s)),
        107_000
    );
    s.synchronize().unwrap();
    assert_eq!(
        attr(&ctx, RangeAttribute::LastPrefetchLocation, m, 2 * PAGE),
        -2
    );
    assert_eq!(ctx.managed_residency(m), None);
    ctx.mem_prefetch(m, 2 * PAGE, d0, 0, &s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(ctx.managed_residency(m).unwrap().devices, vec![0]);
}

#[test]
fn prefetch_is_stream_ordered_and_records_the_request_before_it_runs() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    let d = last(&rt);
    let s = stream(&rt, &ctx, d);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    // Work that holds the stream until released: the prefetch behind it has not run yet.
    s.launch(&[], move |_| {
        rx.lock().unwrap().recv().ok();
    })
    .unwrap();
    ctx.mem_prefetch(m, PAGE, Location::Device(d), 0, &s)
        .unwrap();
    assert_eq!(
        attr(&ctx, RangeAttribute::LastPrefetchLocation, m, PAGE),
        d as i32
    );
    assert_eq!(
        attr(&ctx, RangeAttribute::LastPrefetchLocationType, m, PAGE),
        location_type::DEVICE as i32
    );
    assert_eq!(ctx.managed_residency(m), None);
    tx.send(()).unwrap();
    s.synchronize().unwrap();
    assert_eq!(ctx.managed_residency(m).unwrap().devices, vec![d]);
}

#[test]
fn prefetch_to_the_host_migrates_pages_back() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let m = ctx.alloc_managed(2 * PAGE as u64, 1).unwrap();
    let s = stream(&rt, &ctx, 0);
    s.memset_async(m, 4, 2 * PAGE).unwrap();
    ctx.mem_prefetch(m, 2 * PAGE, Location::Host, 0, &s)
        .unwrap();
    s.synchronize().unwrap();
    let f = rt.driver().managed_stats().host_faults;
    assert_eq!(byte(m), 4);
    assert_eq!(byte(m + 2 * PAGE - 1), 4);
    if host_faults_apply() {
        assert_eq!(rt.driver().managed_stats().host_faults, f);
    }
    assert_eq!(
        attr(&ctx, RangeAttribute::LastPrefetchLocation, m, 2 * PAGE),
        -1
    );
}

// ---- get-attr ----

#[test]
fn get_attr_null_pointer_or_size_0_is_invalid_param() {
    if common::skip() {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    let mut b = [0u8; 4];
    assert_eq!(
        code(ctx.managed_get_attr(RangeAttribute::ReadMostly, 0, 4, &mut b)),
        100_000
    );
    assert_eq!(
        code(ctx.managed_get_attr(RangeAttribute::ReadMostly, m, 0, &mut b)),
        100_000
    );
}

#[test]
fn get_attr_has_no_alignment_rule_but_needs_managed_memory() {
    if common::skip() {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(2 * PAGE as u64, 1).unwrap();
    ctx.mem_advise(m + PAGE, PAGE, Advice::SetReadMostly, Location::Host)
        .unwrap();
    assert_eq!(attr(&ctx, RangeAttribute::ReadMostly, m + PAGE + 3, 5), 1);
    assert_eq!(attr(&ctx, RangeAttribute::ReadMostly, m + PAGE - 1, 2), 0);
    let mut b = [0u8; 4];
    assert_eq!(
        code(ctx.managed_get_attr(RangeAttribute::ReadMostly, m + PAGE, 2 * PAGE, &mut b)),
        107_000
    );
    assert_eq!(
        code(ctx.managed_get_attr(RangeAttribute::ReadMostly, 0x10000, 4, &mut b)),
        107_000
    );
}

#[test]
fn get_attr_data_size_rules() {
    if common::skip() {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    for a in RangeAttribute::ALL {
        for n in [0usize, 1, 2, 3, 4, 5, 8, 12] {
            let mut b = vec![0u8; n];
            let ok = if a == RangeAttribute::AccessedBy {
                n > 0 && n % 4 == 0
            } else {
                n == 4
            };
            let r = ctx.managed_get_attr(a, m, PAGE, &mut b);
            assert_eq!(r.is_ok(), ok, "{a:?} dataSize {n}");
            if let Err(e) = r {
                assert_eq!(e.acl_error(), 107_000);
            }
        }
    }
}

#[test]
fn get_attrs_checks_every_data_size_before_writing_any() {
    if common::skip() {
        return;
    }
    let (_rt, ctx) = setup();
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    let mut a = [0x77u8; 4];
    let mut b = [0x77u8; 8];
    let e = ctx
        .managed_get_attrs(
            &[
                RangeAttribute::ReadMostly,
                RangeAttribute::PreferredLocation,
            ],
            m,
            PAGE,
            &mut [&mut a, &mut b],
        )
        .unwrap_err();
    assert_eq!(e.acl_error(), 107_000);
    assert_eq!(a, [0x77; 4]);
    let mut c = [0x77u8; 12];
    ctx.managed_get_attrs(
        &[
            RangeAttribute::PreferredLocation,
            RangeAttribute::AccessedBy,
        ],
        m,
        PAGE,
        &mut [&mut a, &mut c],
    )
    .unwrap();
    assert_eq!(i32::from_ne_bytes(a), -2);
    assert!(c
        .chunks(4)
        .all(|x| i32::from_ne_bytes(x.try_into().unwrap()) == -2));
    assert_eq!(code(ctx.managed_get_attrs(&[], m, PAGE, &mut [])), 100_000);
}

// ---- memset / memcpy ----

#[test]
fn host_memset_and_memcpy_work_across_pages_and_allocations() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let a = ctx.alloc_managed(3 * PAGE as u64, 1).unwrap();
    let b = ctx.alloc_managed(3 * PAGE as u64, 1).unwrap();
    if !fresh_is_zero() {
        // The byte before the copy is checked to be 0: cleared as the spec asks.
        ctx.managed_memset(b, 0, 3 * PAGE).unwrap();
    }
    let s = stream(&rt, &ctx, 0);
    s.memset_async(a, 6, 3 * PAGE).unwrap();
    s.synchronize().unwrap();
    ctx.managed_memset(a + PAGE - 2, 9, 4).unwrap();
    ctx.managed_memcpy(b + 1, a + PAGE - 3, PAGE).unwrap();
    let mut out = vec![0u8; 8];
    ctx.managed_read(b, &mut out).unwrap();
    assert_eq!(out, [0, 6, 9, 9, 9, 9, 6, 6]);
    assert_eq!(code(ctx.managed_memset(a + 2 * PAGE, 0, PAGE + 1)), 107_000);
    assert_eq!(code(ctx.managed_memset(0, 0, 1)), 100_000);
    // Plain host memory is a valid side (aclrtMemcpy host <-> managed); unmapped memory is not.
    let heap = [0u8; 64];
    ctx.managed_memcpy(a, heap.as_ptr() as usize, 64).unwrap();
    assert_eq!(byte(a + 63), 0);
    assert_eq!(code(ctx.managed_memcpy(a, 4096, 64)), 107_000);
}

#[test]
fn stream_memcpy_outside_managed_memory_is_param_invalid() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let a = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    let s = stream(&rt, &ctx, 0);
    let heap = [0u8; 64];
    assert_eq!(code(s.memcpy_async(a, heap.as_ptr() as usize, 64)), 107_000);
    assert_eq!(code(s.memset_async(a + 1, 0, PAGE)), 107_000);
    assert_eq!(code(s.memcpy_async(0, a, 1)), 100_000);
    s.synchronize().unwrap();
}

#[test]
fn work_queued_on_memory_freed_before_it_runs_reports_at_synchronize() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = setup();
    let a = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    let s = stream(&rt, &ctx, 0);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    s.launch(&[], move |_| {
        rx.lock().unwrap().recv().ok();
    })
    .unwrap();
    s.memset_async(a, 1, PAGE).unwrap();
    // Issue 11 item 3: the free waits for the fill queued on it (it used to run on freed memory
    // and report 107000 at synchronize); the gate opens from another thread.
    let opener = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        tx.send(()).unwrap();
    });
    ctx.free_managed(a).unwrap();
    opener.join().unwrap();
    s.synchronize().unwrap();
    // Work queued after the free is refused when queued.
    assert_eq!(s.memset_async(a, 1, PAGE).unwrap_err().acl_error(), 107_000);
    s.synchronize().unwrap();
}

#[test]
fn managed_types_are_send_and_sync() {
    if common::skip() {
        return;
    }
    fn check<T: Send + Sync>() {}
    check::<Stream>();
    check::<hetmem::ManagedStats>();
    check::<Context>();
    // Streams are usable from other threads.
    let (rt, ctx) = setup();
    let m = ctx.alloc_managed(PAGE as u64, 1).unwrap();
    let s = std::sync::Arc::new(stream(&rt, &ctx, last(&rt)));
    let s2 = s.clone();
    std::thread::spawn(move || {
        s2.memset_async(m, 4, PAGE).unwrap();
        s2.synchronize().unwrap();
    })
    .join()
    .unwrap();
    assert_eq!(byte(m + 1), 4);
}
