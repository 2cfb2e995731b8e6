//! One test per rule of USM allocations, their queries, compression hints, relaxed allocation
//! limits and imports of system memory (issue 3, first part), on the backend under test
//! (`HETMEM_BACKEND`). The host backend's devices are the small ones of `setup`; on cuda they
//! are the GPUs, so the rules about a device's capacity and largest allocation use what the
//! device reports, and the ones that fill a small device do not apply there.

mod common;

use common::runtime_with_max_alloc;

use common::ze::{
    INVALID_ARGUMENT, OUT_OF_DEVICE_MEMORY, OUT_OF_HOST_MEMORY, UNSUPPORTED_ALIGNMENT,
    UNSUPPORTED_SIZE,
};

use hetmem::{AccessAttribute, AllocDesc, CompressionHint, Context, Device, MemoryType};
use hetmem::{BackendKind::Cuda, PhysicalMemoryFlags, Runtime};

const MIB: usize = 1 << 20;
const CAPACITY: u64 = 32 << 20;
const MAX_ALLOC: u64 = 8 << 20;
/// The host page size the import rules are stated in (checked against the OS in `host_page`).
const HOST_PAGE: usize = 4096;

fn setup() -> (Runtime, Device, Context) {
    let rt = runtime_with_max_alloc(2, CAPACITY, MAX_ALLOC);
    let dev = rt.driver().device(0).unwrap();
    let ctx = rt.driver().create_context().unwrap();
    (rt, dev, ctx)
}

fn code(r: hetmem::Result<impl std::fmt::Debug>) -> u32 {
    r.expect_err("expected an error").ze_result()
}

#[repr(C, align(4096))]
struct Pages([u8; 2 * HOST_PAGE]);

#[test]
fn host_page_is_4k() {
    if common::skip() {
        return;
    }
    assert_eq!(rustix::param::page_size(), HOST_PAGE);
}

#[test]
fn size_zero_is_unsupported_size() {
    if common::skip() {
        return;
    }
    let (_rt, dev, ctx) = setup();
    assert_eq!(
        code(ctx.alloc_device(&dev, &AllocDesc::new(0))),
        UNSUPPORTED_SIZE
    );
    assert_eq!(code(ctx.alloc_host(&AllocDesc::new(0))), UNSUPPORTED_SIZE);
    assert_eq!(
        code(ctx.alloc_shared(Some(&dev), &AllocDesc::new(0))),
        UNSUPPORTED_SIZE
    );
}

#[test]
fn alignment_not_zero_or_power_of_two_is_unsupported_alignment() {
    if common::skip() {
        return;
    }
    let (rt, dev, ctx) = setup();
    for a in [3, 6, 4097, 3 << 20] {
        let d = AllocDesc::new(4096).alignment(a);
        assert_eq!(code(ctx.alloc_device(&dev, &d)), UNSUPPORTED_ALIGNMENT);
        assert_eq!(code(ctx.alloc_host(&d)), UNSUPPORTED_ALIGNMENT);
        assert_eq!(code(ctx.alloc_shared(None, &d)), UNSUPPORTED_ALIGNMENT);
    }
    assert_eq!(rt.driver().usm_stats().allocations, 0);
}

#[test]
fn address_is_aligned_to_alignment_and_page_size() {
    if common::skip() {
        return;
    }
    let (_rt, dev, ctx) = setup();
    let page = ctx.query_page_size(&dev, 100).unwrap();
    let p = ctx.alloc_device(&dev, &AllocDesc::new(100)).unwrap();
    assert_eq!(p % page, 0);
    let p2 = ctx
        .alloc_host(&AllocDesc::new(100).alignment(4 * MIB))
        .unwrap();
    assert_eq!(p2 % (4 * MIB), 0);
    assert_eq!(ctx.get_allocation_properties(p).unwrap().page_size, page);
}

#[test]
fn size_over_max_alloc_is_unsupported_size_unless_relaxed_max_size() {
    if common::not_applicable_on(Cuda, "allocates more than the largest single allocation with the relaxed flag: 8 MiB of a 32 MiB host device, but on cuda the largest allocation is the GPU's whole memory, so more than it cannot be had") || common::skip() {
        return;
    }
    let (_rt, dev, ctx) = setup();
    let big = MAX_ALLOC as usize + 2 * MIB;
    assert_eq!(
        code(ctx.alloc_device(&dev, &AllocDesc::new(big))),
        UNSUPPORTED_SIZE
    );
    assert_eq!(code(ctx.alloc_host(&AllocDesc::new(big))), UNSUPPORTED_SIZE);
    assert_eq!(
        code(ctx.alloc_shared(Some(&dev), &AllocDesc::new(big))),
        UNSUPPORTED_SIZE
    );
    let relaxed = AllocDesc::new(big).relaxed_max_size(true);
    for p in [
        ctx.alloc_device(&dev, &relaxed).unwrap(),
        ctx.alloc_host(&relaxed).unwrap(),
        ctx.alloc_shared(Some(&dev), &relaxed).unwrap(),
    ] {
        assert_eq!(ctx.get_address_range(p).unwrap(), (p, big));
        ctx.free_memory(p).unwrap();
    }
}

/// Decodes a chained relaxed-limits descriptor the way the C ABI will: from its raw `stype` and
/// `flags`, through `hetmem::usm::relaxed_limits_from_desc`, into `AllocDesc`.
#[test]
fn relaxed_limits_descriptor_in_extension_and_experimental_forms_needs_max_size() {
    if common::skip() {
        return;
    }
    use hetmem::usm::{
        relaxed_limits_from_desc, RELAXED_LIMITS_EXP_STYPE, RELAXED_LIMITS_EXT_STYPE,
    };
    let (rt, dev, ctx) = setup();
    let big = dev.info().max_alloc_size as usize + 2 * MIB;
    assert_eq!(RELAXED_LIMITS_EXT_STYPE, 0x10016);
    assert_eq!(RELAXED_LIMITS_EXP_STYPE, 0x0002_0001);
    let allocate = !common::part_not_applicable_on(
        Cuda,
        "the allocations past the largest single allocation: on cuda that is the GPU's whole \
         memory, so more than it cannot be had",
    );
    for stype in [0x10016u32, 0x0002_0001] {
        // MAX_SIZE: the size may exceed the largest single allocation, on every kind.
        let relaxed = relaxed_limits_from_desc(stype, 1).unwrap();
        assert!(relaxed, "{stype:#x}");
        let d = AllocDesc::new(big).relaxed_max_size(relaxed);
        let ps = if allocate {
            vec![
                ctx.alloc_device(&dev, &d).unwrap(),
                ctx.alloc_host(&d).unwrap(),
                ctx.alloc_shared(Some(&dev), &d).unwrap(),
            ]
        } else {
            vec![]
        };
        for p in ps {
            assert_eq!(ctx.get_address_range(p).unwrap(), (p, big));
            ctx.free_memory(p).unwrap();
        }
        // flags 0 (no MAX_SIZE): INVALID_ARGUMENT, as the reference driver answers; the
        // message names the value. Other bits: INVALID_ENUMERATION.
        let e = relaxed_limits_from_desc(stype, 0).unwrap_err();
        assert_eq!(e.ze_result(), INVALID_ARGUMENT, "{stype:#x}");
        assert!(e.to_string().contains("0x0"), "{e}");
        for bad in [2u32, 3, 0x8000_0001] {
            let e = relaxed_limits_from_desc(stype, bad).unwrap_err();
            assert_eq!(e.ze_result(), 0x7800_000c, "{stype:#x} {bad:#x}");
            assert!(e.to_string().contains(&format!("{bad:#x}")), "{e}");
        }
    }
    // Any other stype is not this descriptor: UNSUPPORTED_ENUMERATION, naming the stype.
    for other in [0u32, 0x15, 0x16, 0x10009, 0x1000a, 0x10017, 0x0002_0002] {
        let e = relaxed_limits_from_desc(other, 1).unwrap_err();
        assert_eq!(e.ze_result(), 0x7800_000d, "{other:#x}");
        assert!(e.to_string().contains(&format!("{other:#x}")), "{e}");
    }
    // Without the descriptor the limit holds; nothing leaked above.
    assert_eq!(
        code(ctx.alloc_device(&dev, &AllocDesc::new(big))),
        UNSUPPORTED_SIZE
    );
    assert_eq!(rt.driver().usm_stats().allocations, 0);
}

#[test]
fn relaxed_size_over_whole_capacity_is_unsupported_size() {
    if common::skip() {
        return;
    }
    let (_rt, dev, ctx) = setup();
    let d = AllocDesc::new(dev.info().capacity as usize + 2 * MIB).relaxed_max_size(true);
    assert_eq!(code(ctx.alloc_device(&dev, &d)), UNSUPPORTED_SIZE);
}

#[test]
fn beyond_capacity_is_out_of_device_memory() {
    if common::not_applicable_on(Cuda, "fills a host device of 32 MiB; a GPU's room is its free memory (tens of GiB), which is not exhausted here (cuda_backend.rs checks running out)") || common::skip() {
        return;
    }
    let (rt, dev, ctx) = setup();
    let d = AllocDesc::new(MAX_ALLOC as usize);
    let a: Vec<usize> = (0..4)
        .map(|_| ctx.alloc_device(&dev, &d).unwrap())
        .collect();
    assert_eq!(dev.used_memory(), CAPACITY);
    assert_eq!(code(ctx.alloc_device(&dev, &d)), OUT_OF_DEVICE_MEMORY);
    assert_eq!(code(ctx.alloc_shared(Some(&dev), &d)), OUT_OF_DEVICE_MEMORY);
    // The other device is untouched, and host allocations need no device capacity.
    let dev1 = rt.driver().device(1).unwrap();
    ctx.alloc_device(&dev1, &d).unwrap();
    ctx.alloc_host(&d).unwrap();
    assert_eq!(rt.driver().usm_stats().allocations, 6);
    ctx.free_memory(a[0]).unwrap();
    ctx.alloc_device(&dev, &d).unwrap();
}

#[test]
fn physical_memory_and_device_allocations_share_capacity() {
    if common::not_applicable_on(Cuda, "fills a host device of 32 MiB; a GPU's room is its free memory (tens of GiB), which is not exhausted here (cuda_backend.rs checks running out)") || common::skip() {
        return;
    }
    let (_rt, dev, ctx) = setup();
    let phys = ctx
        .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, 24 * MIB)
        .unwrap();
    let a = ctx.alloc_device(&dev, &AllocDesc::new(8 * MIB)).unwrap();
    assert_eq!(dev.used_memory(), CAPACITY);
    assert_eq!(
        code(ctx.alloc_device(&dev, &AllocDesc::new(1))),
        OUT_OF_DEVICE_MEMORY
    );
    assert_eq!(
        code(ctx.create_physical_memory(
            Some(&dev),
            PhysicalMemoryFlags::AllocateOnDevice,
            2 * MIB
        )),
        OUT_OF_DEVICE_MEMORY
    );
    ctx.free_memory(a).unwrap();
    ctx.destroy_physical_memory(phys).unwrap();
    assert_eq!(dev.used_memory(), 0);
}

#[test]
fn device_capacity_is_charged_in_pages_of_the_allocation() {
    if common::skip() {
        return;
    }
    let (_rt, dev, ctx) = setup();
    let page = ctx.query_page_size(&dev, 100).unwrap();
    let p = ctx.alloc_device(&dev, &AllocDesc::new(100)).unwrap();
    assert_eq!(dev.used_memory(), page as u64);
    ctx.free_memory(p).unwrap();
    assert_eq!(dev.used_memory(), 0);
}

#[test]
fn host_allocation_the_os_refuses_is_out_of_host_memory() {
    if common::skip() {
        return;
    }
    let (_rt, _dev, ctx) = setup();
    let d = AllocDesc::new(1 << 50).relaxed_max_size(true);
    assert_eq!(code(ctx.alloc_host(&d)), OUT_OF_HOST_MEMORY);
}

#[test]
fn allocations_are_readable_and_writable_from_the_host() {
    if common::skip() {
        return;
    }
    let (_rt, dev, ctx) = setup();
    // Device memory as the device sees it (on cuda the host cannot reach it); host and shared
    // memory from the host on every backend.
    let d = ctx.alloc_device(&dev, &AllocDesc::new(3 * MIB)).unwrap();
    let fresh = common::dev_bytes(&ctx, d, 3 * MIB);
    assert!(fresh.iter().all(|&b| b == 0), "fresh memory is zero");
    common::dev_put(&ctx, d, &[1]);
    common::dev_put(&ctx, d + 3 * MIB - 1, &[2]);
    assert_eq!(
        (
            common::dev_byte(&ctx, d),
            common::dev_byte(&ctx, d + 3 * MIB - 1)
        ),
        (1, 2)
    );
    for p in [
        ctx.alloc_host(&AllocDesc::new(3 * MIB)).unwrap(),
        ctx.alloc_shared(Some(&dev), &AllocDesc::new(3 * MIB))
            .unwrap(),
        ctx.alloc_shared(None, &AllocDesc::new(3 * MIB)).unwrap(),
    ] {
        // SAFETY: a live 3 MiB read-write allocation the host reaches.
        let s = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, 3 * MIB) };
        assert!(s.iter().all(|&b| b == 0), "fresh memory is zero");
        s[0] = 1;
        s[3 * MIB - 1] = 2;
        assert_eq!((s[0], s[3 * MIB - 1]), (1, 2));
    }
}

#[test]
fn properties_report_type_device_unique_id_and_page_size() {
    if common::skip() {
        return;
    }
    let (rt, dev, ctx) = setup();
    if common::fewer_devices_than(&rt, 2) {
        return;
    }
    let dev1 = rt.driver().device(1).unwrap();
    let d = ctx.alloc_device(&dev1, &AllocDesc::new(5 * MIB)).unwrap();
    let h = ctx.alloc_host(&AllocDesc::new(100)).unwrap();
    let s = ctx.alloc_shared(Some(&dev), &AllocDesc::new(100)).unwrap();
    let pd = ctx.get_allocation_properties(d + 4 * MIB).unwrap();
    let ph = ctx.get_allocation_properties(h + 99).unwrap();
    let ps = ctx.get_allocation_properties(s).unwrap();
    assert_eq!((pd.memory_type, pd.device), (MemoryType::Device, Some(1)));
    assert_eq!((ph.memory_type, ph.device), (MemoryType::Host, None));
    assert_eq!((ps.memory_type, ps.device), (MemoryType::Shared, Some(0)));
    assert_eq!(pd.page_size, ctx.query_page_size(&dev1, 5 * MIB).unwrap());
    assert_eq!(ps.page_size, ctx.query_page_size(&dev, 100).unwrap());
    let ids = [pd.id, ph.id, ps.id];
    assert!(ids.iter().all(|&i| i != 0));
    assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]);
    // Ids are never reused.
    ctx.free_memory(h).unwrap();
    let h2 = ctx.alloc_host(&AllocDesc::new(100)).unwrap();
    assert!(!ids.contains(&ctx.get_allocation_properties(h2).unwrap().id));
}

/// Every combination the extension allows: COMPRESSED and UNCOMPRESSED, each on a device and
/// on a host allocation, decoded from the raw flags as the C ABI will; each is recorded and
/// shown by the properties of any pointer into the allocation.
#[test]
fn compression_hints_compressed_and_uncompressed_on_device_and_host_are_recorded_in_properties() {
    if common::skip() {
        return;
    }
    let (rt, dev, ctx) = setup();
    let n = 3 * MIB;
    for (raw, hint) in [
        (1u32, CompressionHint::Compressed),
        (2, CompressionHint::Uncompressed),
    ] {
        assert_eq!(CompressionHint::from_raw(raw).unwrap(), hint);
        assert_eq!(hint.raw(), raw);
        let d = AllocDesc::new(n).compression(CompressionHint::from_raw(raw).unwrap());
        for (kind, p) in [
            (MemoryType::Device, ctx.alloc_device(&dev, &d).unwrap()),
            (MemoryType::Host, ctx.alloc_host(&d).unwrap()),
        ] {
            for at in [p, p + n / 2, p + n - 1] {
                let props = ctx.get_allocation_properties(at).unwrap();
                assert_eq!(props.memory_type, kind, "{hint:?}");
                assert_eq!(props.compression, Some(hint), "{hint:?} {kind:?}");
            }
            let shown = format!("{:?}", ctx.get_allocation_properties(p).unwrap());
            assert!(shown.contains(&format!("{hint:?}")), "{shown}");
            // The memory behaves as any other (device memory written as the device would).
            common::dev_put(&ctx, p, &vec![0xA5; n]);
            assert_eq!(common::dev_byte(&ctx, p + n - 1), 0xA5);
            ctx.free_memory(p).unwrap();
        }
    }
    // No hint chained: none recorded.
    let p = ctx.alloc_device(&dev, &AllocDesc::new(n)).unwrap();
    assert_eq!(ctx.get_allocation_properties(p).unwrap().compression, None);
    ctx.free_memory(p).unwrap();
    assert_eq!(rt.driver().usm_stats().allocations, 0);
}

/// Both flags at once (and no flag, or an unknown bit) is not one of the flags: the reference
/// driver's ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION; no allocation is made.
#[test]
fn compression_hints_invalid_combination_is_unsupported_enumeration() {
    if common::skip() {
        return;
    }
    let (rt, _dev, _ctx) = setup();
    for bad in [3u32, 0, 4, 0x8000_0000] {
        let e = CompressionHint::from_raw(bad).unwrap_err();
        assert_eq!(e.ze_result(), 0x7800_000d, "{bad:#x}");
        assert!(e.to_string().contains(&format!("{bad:#x}")), "{e}");
    }
    assert_eq!(rt.driver().usm_stats().allocations, 0);
}

#[test]
fn free_needs_the_base_of_a_live_allocation() {
    if common::skip() {
        return;
    }
    let (rt, dev, ctx) = setup();
    let p = ctx.alloc_device(&dev, &AllocDesc::new(MIB)).unwrap();
    assert_eq!(code(ctx.free_memory(0)), 0x7800_0007);
    assert_eq!(code(ctx.free_memory(p + 8)), INVALID_ARGUMENT);
    let stack = 0u64;
    assert_eq!(
        code(ctx.free_memory(&stack as *const u64 as usize)),
        INVALID_ARGUMENT
    );
    let other = rt.driver().create_context().unwrap();
    assert_eq!(code(other.free_memory(p)), INVALID_ARGUMENT);
    ctx.free_memory(p).unwrap();
    assert_eq!(code(ctx.free_memory(p)), INVALID_ARGUMENT);
    assert_eq!(rt.driver().usm_stats().allocations, 0);
    assert_eq!(dev.used_memory(), 0);
}

#[test]
fn unknown_pointer_properties_are_unknown_with_id_0() {
    if common::skip() {
        return;
    }
    let (_rt, _dev, ctx) = setup();
    let x = 5u32;
    let p = ctx
        .get_allocation_properties(&x as *const u32 as usize)
        .unwrap();
    assert_eq!(p.memory_type, MemoryType::Unknown);
    assert_eq!((p.id, p.device, p.page_size), (0, None, 0));
    assert_eq!(code(ctx.get_allocation_properties(0)), 0x7800_0007);
}

#[test]
fn address_range_of_interior_pointer_is_base_and_size() {
    if common::skip() {
        return;
    }
    let (_rt, dev, ctx) = setup();
    let p = ctx
        .alloc_device(&dev, &AllocDesc::new(3 * MIB + 5))
        .unwrap();
    assert_eq!(ctx.get_address_range(p).unwrap(), (p, 3 * MIB + 5));
    assert_eq!(
        ctx.get_address_range(p + 3 * MIB + 4).unwrap(),
        (p, 3 * MIB + 5)
    );
}

#[test]
fn address_range_of_unknown_pointer_is_error_unknown() {
    if common::skip() {
        return;
    }
    let (_rt, dev, ctx) = setup();
    let p = ctx.alloc_device(&dev, &AllocDesc::new(100)).unwrap();
    assert_eq!(code(ctx.get_address_range(p + 100)), 0x7fff_fffe);
    let x = 1u8;
    assert_eq!(
        code(ctx.get_address_range(&x as *const u8 as usize)),
        0x7fff_fffe
    );
}

#[test]
fn virtual_memory_mapping_reports_its_physical_objects_device() {
    if common::skip() {
        return;
    }
    let (rt, _dev, ctx) = setup();
    if common::fewer_devices_than(&rt, 2) {
        return;
    }
    let dev1 = rt.driver().device(1).unwrap();
    let page = ctx.query_page_size(&dev1, 2 * MIB).unwrap();
    let r = ctx.reserve(None, 2 * page).unwrap();
    let phys = ctx
        .create_physical_memory(Some(&dev1), PhysicalMemoryFlags::AllocateOnDevice, page)
        .unwrap();
    ctx.map(r.base, page, phys, 0, AccessAttribute::ReadWrite)
        .unwrap();
    let p = ctx.get_allocation_properties(r.base + 7).unwrap();
    assert_eq!(p.memory_type, MemoryType::Device);
    assert_eq!((p.device, p.id, p.page_size), (Some(1), phys.id, page));
    // The unmapped half is no memory; the range is the reservation.
    let q = ctx.get_allocation_properties(r.base + page).unwrap();
    assert_eq!(q.memory_type, MemoryType::Unknown);
    assert_eq!(
        ctx.get_address_range(r.base + page + 1).unwrap(),
        (r.base, r.size)
    );
    // Ids of allocations never collide with physical objects'.
    let a = ctx.alloc_host(&AllocDesc::new(10)).unwrap();
    assert_ne!(ctx.get_allocation_properties(a).unwrap().id, phys.id);
    // A reservation cannot be freed as USM memory.
    assert_eq!(code(ctx.free_memory(r.base)), INVALID_ARGUMENT);
}

fn check_import(ctx: &Context, ptr: usize, size: usize) {
    // SAFETY: callers pass writable memory of `size` bytes.
    unsafe { std::ptr::write_bytes(ptr as *mut u8, 0xab, size) };
    assert_eq!(ctx.import_system_memory(ptr, size, false).unwrap(), ptr);
    let p = ctx.get_allocation_properties(ptr + size - 1).unwrap();
    assert_eq!(p.memory_type, MemoryType::HostImported);
    assert!(p.id != 0 && !p.read_only);
    assert_eq!(p.page_size, HOST_PAGE);
    assert_eq!(ctx.get_address_range(ptr + 1).unwrap(), (ptr, size));
    ctx.free_memory(ptr).unwrap();
    // SAFETY: the memory is still ours and still mapped.
    let s = unsafe { std::slice::from_raw_parts(ptr as *const u8, size) };
    assert!(s.iter().all(|&b| b == 0xab), "contents survive free");
    assert_eq!(
        ctx.get_allocation_properties(ptr).unwrap().memory_type,
        MemoryType::Unknown
    );
}

#[test]
fn import_of_heap_memory_returns_the_system_pointer_and_reports_host_imported() {
    if common::skip() {
        return;
    }
    let (rt, _dev, ctx) = setup();
    let layout = std::alloc::Layout::from_size_align(4 * HOST_PAGE, HOST_PAGE).unwrap();
    // SAFETY: non-zero size.
    let p = unsafe { std::alloc::alloc(layout) };
    assert!(!p.is_null());
    check_import(&ctx, p as usize, 4 * HOST_PAGE);
    assert_eq!(rt.driver().usm_stats().imports, 0);
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(p, layout) };
}

#[test]
fn import_of_stack_memory_works() {
    if common::skip() {
        return;
    }
    let (_rt, _dev, ctx) = setup();
    let mut buf = Pages([0; 2 * HOST_PAGE]);
    check_import(&ctx, buf.0.as_mut_ptr() as usize, 2 * HOST_PAGE);
    assert_eq!(buf.0[5], 0xab);
}

static mut STATIC_RW: Pages = Pages([0; 2 * HOST_PAGE]);
static STATIC_RO: Pages = Pages([7; 2 * HOST_PAGE]);

#[test]
fn import_of_static_memory_works() {
    if common::skip() {
        return;
    }
    let (_rt, _dev, ctx) = setup();
    let p = std::ptr::addr_of_mut!(STATIC_RW) as usize;
    check_import(&ctx, p, 2 * HOST_PAGE);
}

#[test]
fn import_of_unaligned_pointer_or_size_is_invalid_argument() {
    if common::skip() {
        return;
    }
    let (_rt, _dev, ctx) = setup();
    let mut buf = Pages([0; 2 * HOST_PAGE]);
    let p = buf.0.as_mut_ptr() as usize;
    assert_eq!(
        code(ctx.import_system_memory(p + 8, HOST_PAGE, false)),
        INVALID_ARGUMENT
    );
    assert_eq!(
        code(ctx.import_system_memory(p, HOST_PAGE + 8, false)),
        INVALID_ARGUMENT
    );
    assert_eq!(
        code(ctx.import_system_memory(p, 0, false)),
        UNSUPPORTED_SIZE
    );
}

#[test]
fn import_of_read_only_memory_needs_the_read_only_flag() {
    if common::skip() {
        return;
    }
    let (_rt, _dev, ctx) = setup();
    // SAFETY: a fresh private anonymous read-only page.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            HOST_PAGE,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let p = p as usize;
    assert_eq!(
        code(ctx.import_system_memory(p, HOST_PAGE, false)),
        INVALID_ARGUMENT
    );
    assert_eq!(ctx.import_system_memory(p, HOST_PAGE, true).unwrap(), p);
    let props = ctx.get_allocation_properties(p).unwrap();
    assert_eq!(props.memory_type, MemoryType::HostImported);
    assert!(props.read_only, "recorded read-only for devices");
    ctx.free_memory(p).unwrap();
    // Read-only static data (.rodata) likewise.
    let s = std::ptr::addr_of!(STATIC_RO) as usize;
    assert_eq!(
        code(ctx.import_system_memory(s, HOST_PAGE, false)),
        INVALID_ARGUMENT
    );
    assert!(ctx.import_system_memory(s, HOST_PAGE, true).is_ok());
    ctx.free_memory(s).unwrap();
    // SAFETY: the page mapped above.
    unsafe { libc::munmap(p as *mut _, HOST_PAGE) };
}

#[test]
fn import_of_writable_memory_with_read_only_flag_is_recorded_read_only() {
    if common::skip() {
        return;
    }
    let (_rt, _dev, ctx) = setup();
    let mut buf = Pages([0; 2 * HOST_PAGE]);
    let p = buf.0.as_mut_ptr() as usize;
    ctx.import_system_memory(p, HOST_PAGE, true).unwrap();
    assert!(ctx.get_allocation_properties(p).unwrap().read_only);
    ctx.free_memory(p).unwrap();
}

#[test]
fn import_of_unmapped_or_inaccessible_memory_is_invalid_argument() {
    if common::skip() {
        return;
    }
    let (_rt, _dev, ctx) = setup();
    // SAFETY: a fresh PROT_NONE mapping, unmapped again for the second half of the test.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * HOST_PAGE,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    } as usize;
    assert_eq!(
        code(ctx.import_system_memory(p, HOST_PAGE, true)),
        INVALID_ARGUMENT
    );
    // SAFETY: our own mapping.
    unsafe { libc::munmap(p as *mut _, 2 * HOST_PAGE) };
    // Unmapped memory: a page below `vm.mmap_min_addr` (64 KiB by default), where nothing is
    // ever mapped. (The range just unmapped would do only until another test thread of this
    // process maps something there, which made this test fail now and then.)
    assert_eq!(
        code(ctx.import_system_memory(4 * HOST_PAGE, HOST_PAGE, true)),
        INVALID_ARGUMENT
    );
}

#[test]
fn import_overlapping_a_live_import_or_allocation_is_invalid_argument() {
    if common::skip() {
        return;
    }
    let (rt, dev, ctx) = setup();
    let mut buf = Pages([0; 2 * HOST_PAGE]);
    let p = buf.0.as_mut_ptr() as usize;
    ctx.import_system_memory(p + HOST_PAGE, HOST_PAGE, false)
        .unwrap();
    assert_eq!(
        code(ctx.import_system_memory(p, 2 * HOST_PAGE, false)),
        INVALID_ARGUMENT
    );
    let other = rt.driver().create_context().unwrap();
    assert_eq!(
        code(other.import_system_memory(p + HOST_PAGE, HOST_PAGE, false)),
        INVALID_ARGUMENT
    );
    // The page before is free to import.
    ctx.import_system_memory(p, HOST_PAGE, false).unwrap();
    let a = ctx.alloc_device(&dev, &AllocDesc::new(HOST_PAGE)).unwrap();
    assert_eq!(
        code(ctx.import_system_memory(a, HOST_PAGE, false)),
        INVALID_ARGUMENT
    );
    let r = ctx.reserve(None, 2 * MIB).unwrap();
    assert_eq!(
        code(ctx.import_system_memory(r.base, HOST_PAGE, true)),
        INVALID_ARGUMENT
    );
    assert_eq!(rt.driver().usm_stats().imports, 2);
}

/// The inode of the file mapped at `addr` (`/proc/self/maps`), if a file is.
fn vma_inode(addr: usize) -> Option<u64> {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    maps.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (a, b) = f.first()?.split_once('-')?;
        let (a, b) = (
            usize::from_str_radix(a, 16).ok()?,
            usize::from_str_radix(b, 16).ok()?,
        );
        let inode: u64 = f.get(4)?.parse().ok()?;
        (a <= addr && addr < b && inode != 0).then_some(inode)
    })
}

/// Whether any mapping of the process is of the file with inode `inode`.
fn inode_mapped(inode: u64) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    maps.lines()
        .any(|l| l.split_whitespace().nth(4) == Some(&inode.to_string()))
}

#[test]
fn context_teardown_frees_its_allocations_and_imports() {
    if common::skip() {
        return;
    }
    let (rt, dev, ctx) = setup();
    let mut buf = Pages([0; 2 * HOST_PAGE]);
    let keep = rt.driver().create_context().unwrap();
    let k = keep.alloc_host(&AllocDesc::new(10)).unwrap();
    let d = ctx.alloc_device(&dev, &AllocDesc::new(MIB)).unwrap();
    let sh = ctx.alloc_shared(Some(&dev), &AllocDesc::new(MIB)).unwrap();
    ctx.import_system_memory(buf.0.as_mut_ptr() as usize, HOST_PAGE, false)
        .unwrap();
    // The files behind the two allocations' mappings (the process's mapping count would move
    // with any test running beside this one).
    let backing = if common::on_host() {
        [d, sh].map(|p| vma_inode(p).expect("a host-backend allocation is a mapping"))
    } else {
        [0; 2]
    };
    drop(ctx);
    let s = rt.driver().usm_stats();
    assert_eq!((s.allocations, s.imports), (1, 0));
    assert_eq!(dev.used_memory(), 0);
    if !common::part_not_applicable_on(
        Cuda,
        "the check that teardown removes mappings of the process: on cuda device and shared \
         memory are the driver's, not mappings the runtime made",
    ) {
        for inode in backing {
            assert!(!inode_mapped(inode), "memfd inode {inode} is still mapped");
        }
    }
    buf.0[0] = 1; // the imported memory is still ours
    assert_eq!(std::hint::black_box(&buf).0[0], 1);
    keep.free_memory(k).unwrap();
    assert_eq!(rt.driver().usm_stats(), hetmem::UsmStats::default());
}

/// One descriptor carries every chained option: a system-memory import chained to
/// `zeMemAllocHost` imports (the pointer comes back, `HOST_IMPORTED`), the same chained to a
/// device or shared allocation is `InvalidArgument` and changes nothing.
#[test]
fn system_memory_import_chained_on_the_allocation_descriptor_applies_to_host_allocations_only() {
    if common::skip() {
        return;
    }
    let (rt, dev, ctx) = setup();
    let mut pages = Box::new(Pages([7; 2 * HOST_PAGE]));
    let ptr = pages.0.as_mut_ptr() as usize;
    let desc = AllocDesc::new(2 * HOST_PAGE).system_memory(ptr, false);
    let before = rt.driver().usm_stats();
    let e = ctx.alloc_device(&dev, &desc).unwrap_err();
    assert_eq!(e.ze_result(), INVALID_ARGUMENT, "{e}");
    assert!(e.message().contains("zeMemAllocHost only"), "{e}");
    assert_eq!(code(ctx.alloc_shared(Some(&dev), &desc)), INVALID_ARGUMENT);
    assert_eq!(
        rt.driver().usm_stats(),
        before,
        "a refused chain allocates nothing"
    );
    let p = ctx.alloc_host(&desc).unwrap();
    assert_eq!(p, ptr, "the import keeps the system address");
    let props = ctx.get_allocation_properties(p).unwrap();
    assert_eq!(props.memory_type, MemoryType::HostImported);
    ctx.free_memory(p).unwrap();
    assert_eq!(
        pages.0[HOST_PAGE], 7,
        "the memory stays after the import is released"
    );
}

/// IPC handle types chained on the descriptor apply to shared allocations as to host and
/// device ones (case 11 of shared/cases/level-zero.md): FABRIC_ACCESSIBLE is accepted and
/// recorded, so a get asking for DEFAULT is refused; DEFAULT is recorded, so a get asking for
/// FABRIC_ACCESSIBLE is refused.
#[test]
fn ipc_handle_types_chained_on_the_allocation_descriptor_apply_to_shared_allocations_too() {
    if common::skip() {
        return;
    }
    use hetmem::{IpcHandleTypes, IpcProperties};
    let (rt, dev, ctx) = setup();
    let fabric = IpcHandleTypes::FABRIC_ACCESSIBLE;
    let ask = |t| IpcProperties {
        handle_types: Some(t),
        ..Default::default()
    };
    for (made, other) in [
        (IpcHandleTypes::DEFAULT, fabric),
        (fabric, IpcHandleTypes::DEFAULT),
    ] {
        let p = ctx
            .alloc_shared(Some(&dev), &AllocDesc::new(MIB).ipc_types(made))
            .unwrap();
        if common::on_cuda() {
            // Shared USM memory is cuMemAllocManaged memory there, which the driver has no
            // shareable handle for: the get says so, and nothing is exported.
            let stats = rt.driver().ipc_stats();
            assert_eq!(
                code(ctx.get_ipc_handle_with_properties(p, &ask(made))),
                0x7800_0003
            );
            assert_eq!(rt.driver().ipc_stats(), stats);
        } else {
            let h = ctx.get_ipc_handle_with_properties(p, &ask(made)).unwrap();
            ctx.put_ipc_handle(&h).unwrap();
        }
        let stats = rt.driver().ipc_stats();
        assert_eq!(
            code(ctx.get_ipc_handle_with_properties(p, &ask(other))),
            0x7800_0003,
            "created with {made:?}, asked for {other:?}"
        );
        assert_eq!(rt.driver().ipc_stats(), stats, "nothing exported");
        ctx.free_memory(p).unwrap();
    }
}

/// `Device::free_memory`: on the host backend the modelled capacity less what is in use; on a
/// GPU the driver's count (never more than the capacity). Either way a device allocation
/// takes at least its size from it and its free gives it back.
#[test]
fn free_memory_drops_by_an_allocation_and_comes_back_on_its_free() {
    if common::skip() {
        return;
    }
    let rt = common::runtime_with(1, 256 << 20);
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device(0).unwrap();
    let size = 64 << 20;
    let before = dev.free_memory().unwrap();
    assert!(before <= dev.info().capacity);
    if common::on_host() {
        assert_eq!(before, dev.info().capacity - dev.used_memory());
    }
    let p = ctx.alloc_device(&dev, &AllocDesc::new(size)).unwrap();
    let during = dev.free_memory().unwrap();
    assert!(
        during + size as u64 <= before,
        "{during:#x} + {size:#x} > {before:#x}"
    );
    ctx.free_memory(p).unwrap();
    let after = dev.free_memory().unwrap();
    if common::on_host() {
        assert_eq!(after, before);
    } else {
        // The driver may keep a little for itself; the allocation itself is back.
        assert!(
            after >= during + size as u64,
            "{after:#x} < {during:#x} + {size:#x}"
        );
    }
}
