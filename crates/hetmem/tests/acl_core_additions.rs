//! Rules of the two calls added for the ACL C library: `Context::host_memcpy` /
//! `Context::host_memset` (host-synchronous `aclrtMemcpy` / `aclrtMemset` of any memory) and
//! `Context::import_physical_memory` (`aclrtMemImportFromShareableHandle`).

mod common;

use hetmem::{AccessAttribute, AllocDesc, PhysicalMemoryFlags, Runtime};

/// `Context::host_memcpy` on buffers this test owns (or deliberately bad ones the call refuses
/// before touching them).
fn memcpy(ctx: &hetmem::Context, dst: usize, src: usize, n: usize) -> hetmem::Result<()> {
    // SAFETY: every destination is memory this test owns and holds no reference into while
    // the call runs; refused ranges are never touched.
    unsafe { ctx.host_memcpy(dst, src, n) }
}

/// `Context::host_memset`, as [`memcpy`].
fn memset(ctx: &hetmem::Context, ptr: usize, v: u8, n: usize) -> hetmem::Result<()> {
    // SAFETY: as in `memcpy`.
    unsafe { ctx.host_memset(ptr, v, n) }
}

fn rt() -> Runtime {
    common::builder()
        .host_devices(2)
        .host_device_memory(64 << 20)
        .build()
        .unwrap()
}

#[test]
fn host_memcpy_copies_between_plain_host_memory_and_device_allocations() {
    if common::skip() {
        return;
    }
    let rt = rt();
    let dev = rt.driver().device(0).unwrap();
    let ctx = rt.driver().create_context().unwrap();
    let d = ctx.alloc_device(&dev, &AllocDesc::new(1 << 20)).unwrap();
    let src: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let mut back = vec![0u8; 4096];
    memcpy(&ctx, d, src.as_ptr() as usize, 4096).unwrap();
    memcpy(&ctx, back.as_mut_ptr() as usize, d, 4096).unwrap();
    assert_eq!(back, src);
    memset(&ctx, d + 100, 0xab, 10).unwrap();
    memcpy(&ctx, back.as_mut_ptr() as usize, d, 4096).unwrap();
    assert!(back[100..110].iter().all(|&b| b == 0xab));
    assert_eq!(back[99], src[99]);
    assert_eq!(back[110], src[110]);
    // count 0 copies nothing but still needs pointers.
    memcpy(&ctx, d, src.as_ptr() as usize, 0).unwrap();
    ctx.free_memory(d).unwrap();
}

#[test]
fn host_memcpy_rejects_null_unmapped_and_read_only_destinations() {
    if common::skip() {
        return;
    }
    let rt = rt();
    let ctx = rt.driver().create_context().unwrap();
    let buf = [1u8; 64];
    let e = memcpy(&ctx, 0, buf.as_ptr() as usize, 8).unwrap_err();
    assert_eq!(e.acl_error(), 100_000, "{e}");
    let e = memset(&ctx, 0, 0, 8).unwrap_err();
    assert_eq!(e.acl_error(), 100_000, "{e}");
    // A reservation with nothing mapped is not readable process memory.
    let r = ctx.reserve(None, 2 << 20).unwrap();
    let mut out = vec![0u8; 64];
    // The host backend checks the host's access to the page (device memory is process memory
    // there); on cuda a side the host cannot reach is checked as the device copy's operand.
    let (unreadable, unwritable) = if common::on_host() {
        ("readable", "writable")
    } else {
        ("is not mapped", "does not allow writing")
    };
    let e = memcpy(&ctx, out.as_mut_ptr() as usize, r.base, 64).unwrap_err();
    assert_eq!(e.acl_error(), 107_000, "{e}");
    assert!(e.message().contains(unreadable), "{e}");
    // Read-only mapped memory is not a destination; nothing is written.
    let dev = rt.driver().device(0).unwrap();
    let p = ctx
        .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, 2 << 20)
        .unwrap();
    ctx.map(r.base, 2 << 20, p, 0, AccessAttribute::ReadOnly)
        .unwrap();
    let before = common::dev_byte(&ctx, r.base);
    if common::on_host() {
        // Device memory is zero-filled on the host backend (nothing requires it on cuda).
        assert_eq!(before, 0);
    }
    let e = memset(&ctx, r.base, 5, 16).unwrap_err();
    assert_eq!(e.acl_error(), 107_000, "{e}");
    assert!(e.message().contains(unwritable), "{e}");
    assert_eq!(common::dev_byte(&ctx, r.base), before);
    // Overflow is refused, not wrapped.
    let e = memset(&ctx, usize::MAX - 4, 0, 16).unwrap_err();
    assert_eq!(e.acl_error(), 107_000, "{e}");
    ctx.free_reservation(r).unwrap();
    ctx.destroy_physical_memory(p).unwrap();
}

#[test]
fn imported_physical_memory_maps_the_same_bytes_and_outlives_the_exported_object() {
    if common::skip() {
        return;
    }
    let rt = rt();
    let dev = rt.driver().device(0).unwrap();
    let ctx = rt.driver().create_context().unwrap();
    let page = ctx.query_page_size(&dev, 2 << 20).unwrap();
    let p = ctx
        .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, page)
        .unwrap();
    let used = dev.used_memory();
    let h = ctx.get_physical_memory_ipc_handle(p, None).unwrap();
    let imp = ctx.import_physical_memory(&h, &dev).unwrap();
    assert_eq!(imp.size, page);
    assert_ne!(imp.id, p.id);
    assert_eq!(
        dev.used_memory(),
        used,
        "an import is charged to no capacity"
    );
    let a = ctx.reserve(None, page).unwrap();
    let b = ctx.reserve(None, page).unwrap();
    ctx.map(a.base, page, p, 0, AccessAttribute::ReadWrite)
        .unwrap();
    ctx.map(b.base, page, imp, 0, AccessAttribute::ReadWrite)
        .unwrap();
    common::dev_put(&ctx, a.base + 77, &[0x5a]);
    assert_eq!(common::dev_byte(&ctx, b.base + 77), 0x5a);
    // The exporter's object goes; the import and its mapping stay.
    ctx.unmap(a.base, page).unwrap();
    ctx.destroy_physical_memory(p).unwrap();
    ctx.put_ipc_handle(&h).unwrap();
    assert_eq!(common::dev_byte(&ctx, b.base + 77), 0x5a);
    // The import of this process's own memory holds its charge (cases/acl.md case 3): the
    // page still counts while the import lives, and comes back when it goes.
    assert_eq!(dev.used_memory(), used, "the import holds the page");
    ctx.unmap(b.base, page).unwrap();
    let before = dev.used_memory();
    ctx.destroy_physical_memory(imp).unwrap();
    assert_eq!(dev.used_memory(), before - page as u64);
    ctx.free_reservation(a).unwrap();
    ctx.free_reservation(b).unwrap();
}

#[test]
fn import_physical_memory_refuses_allocation_handles_and_put_handles() {
    if common::skip() {
        return;
    }
    let rt = rt();
    let dev = rt.driver().device(0).unwrap();
    let ctx = rt.driver().create_context().unwrap();
    let d = ctx.alloc_device(&dev, &AllocDesc::new(2 << 20)).unwrap();
    let h = ctx.get_ipc_handle(d).unwrap();
    let before = rt.driver().vm_stats().physical_objects;
    let e = ctx.import_physical_memory(&h, &dev).unwrap_err();
    assert_eq!(e.acl_error(), 107_000, "{e}");
    assert!(
        e.message().contains("not one physical memory object"),
        "{e}"
    );
    let p = ctx
        .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, 2 << 20)
        .unwrap();
    let hp = ctx.get_physical_memory_ipc_handle(p, None).unwrap();
    ctx.put_ipc_handle(&hp).unwrap();
    let e = ctx.import_physical_memory(&hp, &dev).unwrap_err();
    assert_eq!(e.acl_error(), 107_000, "{e}");
    assert_eq!(rt.driver().vm_stats().physical_objects, before + 1);
}
