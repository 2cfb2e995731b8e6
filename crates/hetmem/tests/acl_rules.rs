//! One test per ACL argument rule of the semantics layer (`hetmem::acl`, the decoders of
//! `hetmem::spec`): the answers the C library (`libascendcl.so`) gives, from Rust.
//!
//! On the backend under test (`HETMEM_BACKEND`): the rules are the semantics layer's; the one
//! test with a runtime asks the ACL granularity, 2 MiB on both backends (the host backend's
//! 2 MiB page; cuda's VMM granularity).

mod common;

use common::context_with;
use hetmem::acl;
use hetmem::spec::{
    GranularityOption, MallocPolicy, MemAllocationType, MemAttr, MemHandleType, MemcpyKind,
    PhysLocationType,
};
use hetmem::{Advice, Location, MemoryType};

fn code<T: std::fmt::Debug>(r: hetmem::Result<T>) -> u32 {
    r.unwrap_err().acl_error()
}

fn msg<T: std::fmt::Debug>(r: hetmem::Result<T>) -> String {
    r.unwrap_err().message().to_string()
}

#[test]
fn size_zero_is_invalid_param_naming_the_argument() {
    if common::skip() {
        return;
    }
    assert_eq!(code(acl::check_nonzero(0, "size")), 100_000);
    assert!(msg(acl::check_nonzero(0, "size")).contains("size is 0"));
    acl::check_nonzero(1, "size").unwrap();
}

#[test]
fn attribute_count_zero_is_invalid_param_and_over_2_pow_20_is_param_invalid() {
    if common::skip() {
        return;
    }
    assert_eq!(code(acl::check_attribute_count(0)), 100_000);
    assert!(msg(acl::check_attribute_count(0)).contains("numAttributes is 0"));
    assert_eq!(code(acl::check_attribute_count((1 << 20) + 1)), 107_000);
    assert!(msg(acl::check_attribute_count((1 << 20) + 1)).contains("1048577"));
    acl::check_attribute_count(1).unwrap();
    acl::check_attribute_count(1 << 20).unwrap();
}

#[test]
fn advice_location_is_ignored_by_set_read_mostly_and_unset_preferred_location() {
    if common::skip() {
        return;
    }
    for a in [Advice::SetReadMostly, Advice::UnsetPreferredLocation] {
        assert_eq!(acl::advice_location(a, 99, -5).unwrap(), Location::Invalid);
        assert_eq!(acl::advice_location(a, 1, 1).unwrap(), Location::Device(1));
    }
    for a in [
        Advice::UnsetReadMostly,
        Advice::SetPreferredLocation,
        Advice::SetAccessedBy,
        Advice::UnsetAccessedBy,
    ] {
        assert_eq!(code(acl::advice_location(a, 99, 0)), 107_000);
        assert!(msg(acl::advice_location(a, 99, 0)).contains("99"));
        assert_eq!(code(acl::advice_location(a, 1, -1)), 107_000);
        assert_eq!(acl::advice_location(a, 2, 7).unwrap(), Location::Host);
    }
}

#[test]
fn count_over_dest_max_is_invalid_param() {
    if common::skip() {
        return;
    }
    assert_eq!(code(acl::check_count(5, 4, "destMax")), 100_000);
    let m = msg(acl::check_count(5, 4, "destMax"));
    assert!(m.contains("destMax 0x4") && m.contains("count 0x5"), "{m}");
    acl::check_count(4, 4, "destMax").unwrap();
    acl::check_count(0, 0, "maxCount").unwrap();
}

#[test]
fn malloc_policy_is_0_to_7_with_the_three_extra_bits() {
    if common::skip() {
        return;
    }
    for p in [0, 7, 0x100, 0x1000, 0x10_0000, 0x1001, 0x10_1107] {
        assert_eq!(MallocPolicy::from_raw(p).unwrap().raw(), p);
    }
    for p in [8, 0xff, 0x200, 0x8000_0000] {
        assert_eq!(code(MallocPolicy::from_raw(p)), 107_000);
        assert!(msg(MallocPolicy::from_raw(p)).contains(&format!("{p:#x}")));
    }
}

#[test]
fn memcpy_kind_is_0_to_7() {
    if common::skip() {
        return;
    }
    for k in 0..=7 {
        assert_eq!(MemcpyKind::from_raw(k).unwrap().raw(), k);
    }
    assert_eq!(code(MemcpyKind::from_raw(8)), 107_000);
    assert!(msg(MemcpyKind::from_raw(8)).contains("kind 8"));
}

#[test]
fn mem_attr_is_0_to_17() {
    if common::skip() {
        return;
    }
    assert_eq!(MemAttr::from_raw(17, "attr").unwrap().raw(), 17);
    assert_eq!(code(MemAttr::from_raw(18, "attr")), 107_000);
    assert!(msg(MemAttr::from_raw(18, "memAttr")).contains("memAttr 18"));
}

#[test]
fn free_takes_device_memory_and_free_host_takes_host_memory() {
    if common::skip() {
        return;
    }
    acl::check_free_kind(0x1000, MemoryType::Device, false).unwrap();
    acl::check_free_kind(0x1000, MemoryType::Host, true).unwrap();
    assert_eq!(
        code(acl::check_free_kind(0x1000, MemoryType::Host, false)),
        107_000
    );
    assert!(msg(acl::check_free_kind(0x1000, MemoryType::Host, false)).contains("aclrtFreeHost"));
    assert_eq!(
        code(acl::check_free_kind(0x1000, MemoryType::Device, true)),
        107_000
    );
    assert!(msg(acl::check_free_kind(0x1000, MemoryType::Device, true)).contains("0x1000"));
}

#[test]
fn physical_prop_checks_handle_type_allocation_type_mem_attr_and_location_type() {
    if common::skip() {
        return;
    }
    assert_eq!(
        acl::check_physical_prop(0, 0, 0, 1).unwrap(),
        PhysLocationType::Device
    );
    assert_eq!(
        acl::check_physical_prop(2, 0, 17, 0).unwrap(),
        PhysLocationType::Host
    );
    for (args, needle) in [
        ((1, 0, 0, 1), "handleType 1"),
        ((0, 1, 0, 1), "allocationType 1"),
        ((0, 0, 18, 1), "memAttr 18"),
        ((0, 0, 0, 2), "location.type 2"),
    ] {
        let r = acl::check_physical_prop(args.0, args.1, args.2, args.3);
        assert_eq!(r.clone().unwrap_err().acl_error(), 107_000);
        assert!(msg(r).contains(needle), "{needle}");
    }
    assert_eq!(MemHandleType::from_raw(2).unwrap(), MemHandleType::Posix);
    assert_eq!(
        MemAllocationType::from_raw(0).unwrap(),
        MemAllocationType::Pinned
    );
}

#[test]
fn granularity_option_is_minimum_or_recommended() {
    if common::skip() {
        return;
    }
    assert_eq!(
        GranularityOption::from_raw(0).unwrap(),
        GranularityOption::Minimum
    );
    assert_eq!(
        GranularityOption::from_raw(1).unwrap(),
        GranularityOption::Recommended
    );
    assert_eq!(code(GranularityOption::from_raw(2)), 107_000);
}

#[test]
fn reserve_alignment_is_0_or_a_power_of_two_up_to_the_granularity() {
    if common::skip() {
        return;
    }
    let g = 2 << 20;
    for a in [0, 1, 4096, g] {
        acl::check_reserve_alignment(a, g).unwrap();
    }
    for a in [3, 2 * g, 0x3000] {
        assert_eq!(code(acl::check_reserve_alignment(a, g)), 107_000);
        assert!(msg(acl::check_reserve_alignment(a, g)).contains(&format!("{a:#x}")));
    }
}

#[test]
fn vmm_size_is_nonzero_and_a_multiple_of_the_reported_granularity() {
    if common::skip() {
        return;
    }
    let (rt, ctx) = context_with(1, 64 << 20);
    let dev = rt.driver().device(0).unwrap();
    let g = ctx.acl_granularity(&dev).unwrap();
    assert_eq!(g, 2 << 20);
    acl::check_vmm_size(g, g).unwrap();
    acl::check_vmm_size(3 * g, g).unwrap();
    // Size 0: one code for reserve, physical memory and map.
    assert_eq!(code(acl::check_vmm_size(0, g)), 100_000);
    assert!(msg(acl::check_vmm_size(0, g)).contains("size is 0"));
    // 64 KiB, a page size hetmem has, is not the granularity the ACL calls report.
    assert_eq!(code(acl::check_vmm_size(64 << 10, g)), 107_000);
    assert!(msg(acl::check_vmm_size(64 << 10, g)).contains("granularity"));
    assert_eq!(code(acl::check_vmm_size(g + 4096, g)), 107_000);
}

#[test]
fn flags_must_be_zero() {
    if common::skip() {
        return;
    }
    acl::check_flags_zero(0).unwrap();
    assert_eq!(code(acl::check_flags_zero(1)), 100_000);
    assert!(msg(acl::check_flags_zero(0x10)).contains("0x10"));
}

#[test]
fn export_flags_are_default_or_disable_pid_validation() {
    if common::skip() {
        return;
    }
    acl::check_export_flags(0).unwrap();
    acl::check_export_flags(1).unwrap();
    assert_eq!(code(acl::check_export_flags(2)), 100_000);
    assert!(msg(acl::check_export_flags(7)).contains("0x7"));
}

#[test]
fn pid_count_is_1_to_65536() {
    if common::skip() {
        return;
    }
    acl::check_pid_count(1).unwrap();
    acl::check_pid_count(1 << 16).unwrap();
    assert_eq!(code(acl::check_pid_count(0)), 100_000);
    assert_eq!(code(acl::check_pid_count((1 << 16) + 1)), 100_000);
    assert!(msg(acl::check_pid_count(70000)).contains("70000"));
}
