//! IPC rules inside one process: range handles (every bullet of the range descriptor), handle
//! types, open / close / put codes, opening in the exporting process, on the backend under test
//! (`HETMEM_BACKEND`). Device memory is read and written through the `dev_*` helpers; ranges
//! are laid out in base pages ([`page`]: 64 KiB on the host backend, 2 MiB on cuda).

mod common;

use common::ze::OUT_OF_DEVICE_MEMORY;

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use common::*;
use hetmem::platform::open_fd_count;
use hetmem::{
    AccessAttribute, AllocDesc, Context, IpcHandle, IpcHandleTypes, IpcProperties,
    PhysicalMemoryFlags,
};

/// Tests that count the process's fds hold this lock for writing (alone); every other test
/// holds it for reading, so no fd comes or goes while a count is compared.
static FDS: RwLock<()> = RwLock::new(());

fn shared() -> RwLockReadGuard<'static, ()> {
    FDS.read().unwrap_or_else(|p| p.into_inner())
}

fn alone() -> RwLockWriteGuard<'static, ()> {
    FDS.write().unwrap_or_else(|p| p.into_inner())
}

/// Runs a call that must fail and checks that it changed nothing: the driver's live exports,
/// open views and typed memory, its virtual-memory and USM counters, and the process's fd
/// count. Returns the error. The caller holds [`alone`].
fn fails_changing_nothing<T: std::fmt::Debug>(
    ctx: &Context,
    call: impl FnOnce() -> hetmem::Result<T>,
) -> hetmem::Error {
    let d = ctx.driver();
    let state = || (d.ipc_stats(), d.vm_stats(), d.usm_stats(), open_fd_count());
    let before = state();
    let err = call().unwrap_err();
    assert_eq!(state(), before, "a failed call changed something: {err}");
    err
}

fn range(size: usize) -> IpcProperties {
    IpcProperties {
        range_size: Some(size),
        ..Default::default()
    }
}

#[test]
fn range_view_has_exactly_the_exporters_bytes_and_reports_its_full_size() {
    if common::skip() {
        return;
    }
    let _g = shared();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let u = page(&ctx);
    let (e, _) = make_range(&ctx);
    dev_fill(&ctx, e.ptr, e.size, 77);
    let h = ctx
        .get_ipc_handle_with_properties(e.ptr, &range(e.size))
        .unwrap();
    assert_eq!(h.kind(), Some(hetmem::IpcHandleKind::Range));
    let p = ctx.open_ipc_handle(&h, 0).unwrap();
    assert_ne!(p, e.ptr);
    assert_eq!(ctx.get_address_range(p).unwrap(), (p, e.size));
    assert_eq!(ctx.get_address_range(p + e.size - 1).unwrap(), (p, e.size));
    assert_eq!(dev_check(&ctx, p, e.size, 77), None);
    // The same memory, not a copy (both views are mapped read-write).
    dev_write(&ctx, p + 3 * u, 0x5eed);
    assert_eq!(dev_read(&ctx, e.ptr + 3 * u), 0x5eed);
    ctx.close_ipc_handle(p).unwrap();
    ctx.put_ipc_handle(&h).unwrap();
    e.destroy(&ctx);
}

/// "The caller may start at an arbitrary offset within a mapped range" and "when ptr begins at
/// an offset within a physical memory object, the returned importer pointer corresponds to
/// ptr": a range that starts and ends inside pages is shared; the importer's pointer is its
/// first byte, `get_address_range` reports exactly the range, the view is the same memory, and
/// close takes that pointer (not the page start below it). A range whose first byte is in an
/// unmapped page is `AddressNotFound` naming that byte.
#[test]
fn range_may_start_and_end_at_any_byte_and_the_importer_pointer_is_its_first_byte() {
    if common::skip() {
        return;
    }
    let _g = shared();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let u = page(&ctx);
    let (e, hole) = make_range(&ctx);
    dev_fill(&ctx, e.ptr, e.size, 31);
    let (start, n) = (e.ptr + u + 100, e.size - 2 * u - 300);
    let h = ctx
        .get_ipc_handle_with_properties(start, &range(n))
        .unwrap();
    assert_eq!(h.size(), Some(n));
    let v = ctx.open_ipc_handle(&h, 0).unwrap();
    assert_eq!(ctx.get_address_range(v).unwrap(), (v, n));
    assert_eq!(ctx.get_address_range(v + n - 1).unwrap(), (v, n));
    assert_eq!(dev_bytes(&ctx, v, 4096), dev_bytes(&ctx, start, 4096));
    assert_eq!(
        dev_bytes(&ctx, v + n - 4096, 4096),
        dev_bytes(&ctx, start + n - 4096, 4096)
    );
    // The same memory, not a copy.
    dev_write(&ctx, v + 8, 0xabcd_ef01);
    assert_eq!(dev_read(&ctx, start + 8), 0xabcd_ef01);
    let err = ctx.close_ipc_handle(v - 100).unwrap_err();
    assert_eq!(err.ze_result(), common::ze::INVALID_ARGUMENT, "{err}");
    ctx.close_ipc_handle(v).unwrap();
    ctx.put_ipc_handle(&h).unwrap();
    // Starting inside the unmapped page: the error names the range's first byte.
    let err = ctx
        .get_ipc_handle_with_properties(hole + 100, &range(64))
        .unwrap_err();
    assert_eq!(err.ze_result(), common::ze::ADDRESS_NOT_FOUND, "{err}");
    assert!(
        err.message().contains(&format!("{:#x}", hole + 100)),
        "{err}"
    );
    e.destroy(&ctx);
}

#[test]
fn range_handle_is_a_snapshot_of_the_mappings_at_export() {
    if common::skip() {
        return;
    }
    let _g = shared();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let dev = ctx.driver().device(0).unwrap();
    let u = page(&ctx);
    let (e, _) = make_range(&ctx);
    dev_fill(&ctx, e.ptr, e.size, 9);
    let h = ctx
        .get_ipc_handle_with_properties(e.ptr, &range(e.size))
        .unwrap();
    let before = ctx.open_ipc_handle(&h, 0).unwrap();
    // Remap the second reservation's first 8 pages to a fresh object with other bytes.
    let r1 = e.reservations[1];
    ctx.unmap(r1.base, 8 * u).unwrap();
    let fresh = ctx
        .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, 8 * u)
        .unwrap();
    ctx.map(r1.base, 8 * u, fresh, 0, AccessAttribute::ReadWrite)
        .unwrap();
    dev_fill(&ctx, r1.base, 8 * u, 1);
    let after = ctx.open_ipc_handle(&h, 0).unwrap();
    for v in [before, after] {
        assert_eq!(
            dev_check(&ctx, v, e.size, 9),
            None,
            "both views show the objects exported"
        );
    }
    ctx.close_ipc_handle(before).unwrap();
    ctx.close_ipc_handle(after).unwrap();
    ctx.put_ipc_handle(&h).unwrap();
    ctx.unmap(r1.base, 8 * u).unwrap();
    ctx.destroy_physical_memory(fresh).unwrap();
    // The rest of the teardown: map back nothing, objects 3 is unmapped already.
    for r in &e.reservations {
        ctx.free_reservation(*r).unwrap();
    }
    for o in &e.objects {
        ctx.destroy_physical_memory(*o).unwrap();
    }
}

#[test]
fn range_with_a_hole_is_address_not_found() {
    if common::skip() {
        return;
    }
    let _g = alone();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let u = page(&ctx);
    let (e, hole) = make_range(&ctx);
    // Warm up: the broker's socket exists from the first export on.
    let warm = ctx.get_ipc_handle(e.ptr).unwrap();
    ctx.put_ipc_handle(&warm).unwrap();
    let err = fails_changing_nothing(&ctx, || {
        ctx.get_ipc_handle_with_properties(e.ptr, &range(e.size + u))
    });
    assert_eq!(err.ze_result(), 0x7800_0021);
    assert!(err.message().contains(&format!("{hole:#x}")), "{err}");
    // A hole in the middle: unmap one page of the second reservation.
    let mid = e.reservations[1].base + 2 * u;
    ctx.unmap(mid, u).unwrap();
    let err = fails_changing_nothing(&ctx, || {
        ctx.get_ipc_handle_with_properties(e.ptr, &range(e.size))
    });
    assert_eq!(err.ze_result(), 0x7800_0021);
    assert!(err.message().contains(&format!("{mid:#x}")), "{err}");
    // Outside any reservation too.
    let r = ctx.reserve(None, 4 * u).unwrap();
    let err = fails_changing_nothing(&ctx, || {
        ctx.get_ipc_handle_with_properties(r.base, &range(u))
    });
    assert_eq!(err.ze_result(), 0x7800_0021);
    ctx.free_reservation(r).unwrap();
    e.destroy(&ctx);
}

#[test]
fn range_size_0_is_invalid_size_and_null_is_invalid_null_pointer() {
    if common::skip() {
        return;
    }
    let _g = alone();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let (e, _) = make_range(&ctx);
    let err = fails_changing_nothing(&ctx, || {
        ctx.get_ipc_handle_with_properties(e.ptr, &range(0))
    });
    assert_eq!(err.ze_result(), 0x7800_0008);
    let err = fails_changing_nothing(&ctx, || {
        ctx.get_ipc_handle_with_properties(0, &range(page(&ctx)))
    });
    assert_eq!(err.ze_result(), 0x7800_0007);
    let err = fails_changing_nothing(&ctx, || ctx.get_ipc_handle(0));
    assert_eq!(err.ze_result(), 0x7800_0007);
    e.destroy(&ctx);
}

#[test]
fn range_including_a_usm_allocation_is_invalid_argument() {
    if common::skip() {
        return;
    }
    let _g = alone();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let dev = ctx.driver().device(0).unwrap();
    for p in [
        ctx.alloc_device(&dev, &AllocDesc::new(4 * K64)).unwrap(),
        ctx.alloc_host(&AllocDesc::new(4 * K64)).unwrap(),
        ctx.alloc_shared(Some(&dev), &AllocDesc::new(4 * K64))
            .unwrap(),
    ] {
        let err = fails_changing_nothing(&ctx, || {
            ctx.get_ipc_handle_with_properties(p, &range(page(&ctx)))
        });
        assert_eq!(err.ze_result(), 0x7800_0004, "{err}");
        assert!(err.message().contains("USM"), "{err}");
        ctx.free_memory(p).unwrap();
    }
}

#[test]
fn range_with_more_pieces_than_the_limit_is_unsupported_size_naming_it() {
    if common::skip() {
        return;
    }
    let _g = alone();
    assert_eq!(
        runtime().driver().ipc_max_range_pieces(),
        hetmem::ipc::DEFAULT_MAX_RANGE_PIECES
    );
    assert_eq!(hetmem::ipc::DEFAULT_MAX_RANGE_PIECES, 1 << 20);
    let rt = common::builder()
        .host_devices(1)
        .host_device_memory(256 << 20)
        .ipc_max_range_pieces(6)
        .build()
        .unwrap();
    assert_eq!(rt.driver().ipc_max_range_pieces(), 6);
    let ctx = rt.driver().create_context().unwrap();
    let (e, _) = make_range(&ctx);
    let err = fails_changing_nothing(&ctx, || {
        ctx.get_ipc_handle_with_properties(e.ptr, &range(e.size))
    });
    assert_eq!(err.ze_result(), 0x7800_0009);
    assert!(
        err.message().contains("7 mapped pieces") && err.message().contains("at most 6"),
        "{err}"
    );
    // Six pieces fit; the limit is the driver's own: another driver still takes seven.
    let six = e.size - 7 * page(&ctx);
    let h = ctx
        .get_ipc_handle_with_properties(e.ptr, &range(six))
        .unwrap();
    ctx.put_ipc_handle(&h).unwrap();
    let other = runtime();
    let octx = other.driver().create_context().unwrap();
    let (e2, _) = make_range(&octx);
    let h = octx
        .get_ipc_handle_with_properties(e2.ptr, &range(e2.size))
        .unwrap();
    octx.put_ipc_handle(&h).unwrap();
    e2.destroy(&octx);
    e.destroy(&ctx);
}

/// Case 11 of shared/cases/level-zero.md: FABRIC_ACCESSIBLE handles. The type is supported on
/// every backend within one machine: chained at `zeMemAllocDevice` / `zeMemAllocHost` /
/// `zePhysicalMemCreate` and asked at get (also with the range descriptor), the handle opens
/// and shows the exporter's bytes. Memory created with one type and asked for the other is
/// `UnsupportedFeature`, changing nothing; a get without a handle-type descriptor asks no
/// type; bits over 0x3 are `InvalidEnumeration`. (Across processes: `tests/c/ze/cases_ipc11.c`.)
#[test]
fn fabric_accessible_handles_are_supported_and_types_not_chained_at_creation_are_unsupported_feature(
) {
    if common::skip() {
        return;
    }
    let _g = alone();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let dev = ctx.driver().device(0).unwrap();
    let (def, fabric) = (IpcHandleTypes::DEFAULT, IpcHandleTypes::FABRIC_ACCESSIBLE);
    let ask = |t| IpcProperties {
        handle_types: Some(t),
        ..Default::default()
    };
    // Opens h in this process, checks the bytes, writes one back through the view.
    let round_trip = |h: &IpcHandle, ptr: usize, size: usize, seed: u64| {
        let v = ctx.open_ipc_handle(h, 0).unwrap();
        assert_eq!(dev_check(&ctx, v, size, seed), None);
        dev_write(&ctx, v, 0xfab);
        assert_eq!(dev_read(&ctx, ptr), 0xfab);
        ctx.close_ipc_handle(v).unwrap();
    };
    // Memory created without types: FABRIC asked at get works.
    let e = make_alloc(&ctx);
    dev_fill(&ctx, e.ptr, e.size, 11);
    let h = ctx
        .get_ipc_handle_with_properties(e.ptr, &ask(fabric))
        .unwrap();
    round_trip(&h, e.ptr, 8, 11);
    ctx.put_ipc_handle(&h).unwrap();
    e.destroy(&ctx);
    // A device allocation created FABRIC: got FABRIC (and with no descriptor), not DEFAULT.
    let p = ctx
        .alloc_device_with_ipc_types(&dev, &AllocDesc::new(K64), fabric)
        .unwrap();
    dev_fill(&ctx, p, K64, 12);
    let h = ctx.get_ipc_handle_with_properties(p, &ask(fabric)).unwrap();
    round_trip(&h, p, K64, 12);
    let err = fails_changing_nothing(&ctx, || ctx.get_ipc_handle_with_properties(p, &ask(def)));
    assert_eq!(err.ze_result(), 0x7800_0003, "{err}");
    assert!(
        err.message().contains("0x1") && err.message().contains("0x2"),
        "{err}"
    );
    let h2 = ctx.get_ipc_handle(p).unwrap();
    assert_eq!(h2, h, "one export, whatever the type asked");
    ctx.put_ipc_handle(&h2).unwrap();
    ctx.put_ipc_handle(&h).unwrap();
    ctx.free_memory(p).unwrap();
    // Created DEFAULT, asked FABRIC: refused, nothing exported.
    let p = ctx
        .alloc_device_with_ipc_types(&dev, &AllocDesc::new(K64), def)
        .unwrap();
    let err = fails_changing_nothing(&ctx, || ctx.get_ipc_handle_with_properties(p, &ask(fabric)));
    assert_eq!(err.ze_result(), 0x7800_0003, "{err}");
    let h = ctx.get_ipc_handle_with_properties(p, &ask(def)).unwrap();
    ctx.put_ipc_handle(&h).unwrap();
    ctx.free_memory(p).unwrap();
    // Host memory created FABRIC (the cuda backend may have no shareable handle for host
    // memory: its get then says so, as for DEFAULT).
    let p = ctx
        .alloc_host_with_ipc_types(&AllocDesc::new(K64), fabric)
        .unwrap();
    dev_fill(&ctx, p, K64, 13);
    match ctx.get_ipc_handle_with_properties(p, &ask(fabric)) {
        Ok(h) => {
            round_trip(&h, p, K64, 13);
            ctx.put_ipc_handle(&h).unwrap();
        }
        Err(e) if common::on_cuda() && e.ze_result() == 0x7800_0003 => {
            assert_eq!(
                ctx.get_ipc_handle(p).unwrap_err().ze_result(),
                0x7800_0003,
                "host memory is not exportable at all there: {e}"
            );
        }
        Err(e) => panic!("FABRIC get of FABRIC host memory: {e}"),
    }
    ctx.free_memory(p).unwrap();
    // Physical memory created FABRIC: its own handle, a mapping of it, a range over it.
    let size = 2 << 20;
    let o = ctx
        .create_physical_memory_with_ipc_types(
            Some(&dev),
            PhysicalMemoryFlags::AllocateOnDevice,
            size,
            fabric,
        )
        .unwrap();
    let r = ctx.reserve(None, size).unwrap();
    ctx.map(r.base, size, o, 0, AccessAttribute::ReadWrite)
        .unwrap();
    dev_fill(&ctx, r.base, size, 14);
    let h = ctx.get_physical_memory_ipc_handle(o, Some(fabric)).unwrap();
    round_trip(&h, r.base, size, 14);
    ctx.put_ipc_handle(&h).unwrap();
    dev_fill(&ctx, r.base, size, 15);
    let h = ctx
        .get_ipc_handle_with_properties(r.base, &ask(fabric))
        .unwrap();
    round_trip(&h, r.base, size, 15);
    ctx.put_ipc_handle(&h).unwrap();
    let props = IpcProperties {
        handle_types: Some(fabric),
        range_size: Some(size),
    };
    dev_fill(&ctx, r.base, size, 16);
    let h = ctx.get_ipc_handle_with_properties(r.base, &props).unwrap();
    assert_eq!(h.kind(), Some(hetmem::IpcHandleKind::Range));
    round_trip(&h, r.base, size, 16);
    ctx.put_ipc_handle(&h).unwrap();
    let err = fails_changing_nothing(&ctx, || ctx.get_physical_memory_ipc_handle(o, Some(def)));
    assert_eq!(err.ze_result(), 0x7800_0003, "{err}");
    let err = fails_changing_nothing(&ctx, || {
        ctx.get_ipc_handle_with_properties(
            r.base,
            &IpcProperties {
                handle_types: Some(def),
                range_size: Some(size),
            },
        )
    });
    assert_eq!(err.ze_result(), 0x7800_0003, "{err}");
    ctx.unmap(r.base, size).unwrap();
    ctx.free_reservation(r).unwrap();
    ctx.destroy_physical_memory(o).unwrap();
    assert_eq!(
        IpcHandleTypes::from_raw(4).unwrap_err().ze_result(),
        0x7800_000c
    );
}

#[test]
fn open_in_the_exporting_process_gives_a_new_view_of_the_same_bytes() {
    if common::skip() {
        return;
    }
    let _g = shared();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    for e in [make_alloc(&ctx), make_physical(&ctx)] {
        dev_fill(&ctx, e.ptr, e.size, 3);
        let h = ctx.get_ipc_handle(e.ptr).unwrap();
        let a = ctx.open_ipc_handle(&h, 1).unwrap();
        let b = ctx.open_ipc_handle(&h, 2).unwrap();
        assert!(a != b && a != e.ptr && b != e.ptr);
        assert_eq!(dev_check(&ctx, a, e.size, 3), None);
        dev_fill(&ctx, b, e.size, 4);
        assert_eq!(dev_check(&ctx, e.ptr, e.size, 4), None);
        ctx.close_ipc_handle(a).unwrap();
        ctx.close_ipc_handle(b).unwrap();
        ctx.put_ipc_handle(&h).unwrap();
        e.destroy(&ctx);
    }
}

#[test]
fn get_on_unknown_or_imported_memory_is_invalid_argument() {
    if common::skip() {
        return;
    }
    let _g = shared();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let local = Box::new([0u8; 8]);
    let err = ctx.get_ipc_handle(local.as_ptr() as usize).unwrap_err();
    assert_eq!(err.ze_result(), 0x7800_0004);
    // Reserved but unmapped VA.
    let r = ctx.reserve(None, 4 * page(&ctx)).unwrap();
    assert_eq!(
        ctx.get_ipc_handle(r.base).unwrap_err().ze_result(),
        0x7800_0004
    );
    ctx.free_reservation(r).unwrap();
    // Imported system memory has no memfd.
    let page = hetmem::platform::page_size();
    let mut v = vec![0u8; 4 * page];
    let at = (v.as_mut_ptr() as usize).next_multiple_of(page);
    let p = ctx.import_system_memory(at, page, false).unwrap();
    assert_eq!(ctx.get_ipc_handle(p).unwrap_err().ze_result(), 0x7800_0004);
    ctx.free_memory(p).unwrap();
}

#[test]
fn open_flags_over_3_are_invalid_enumeration_and_malformed_bytes_invalid_argument() {
    if common::skip() {
        return;
    }
    let _g = shared();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let e = make_alloc(&ctx);
    let h = ctx.get_ipc_handle(e.ptr).unwrap();
    assert_eq!(
        ctx.open_ipc_handle(&h, 4).unwrap_err().ze_result(),
        0x7800_000c
    );
    let zero = IpcHandle::from_bytes([0; 64]);
    let err = ctx.open_ipc_handle(&zero, 0).unwrap_err();
    assert_eq!(err.ze_result(), 0x7800_0004);
    assert!(err.message().contains("magic"), "{err}");
    ctx.put_ipc_handle(&h).unwrap();
    e.destroy(&ctx);
}

#[test]
fn put_twice_put_of_another_drivers_handle_and_open_after_put_are_invalid_argument() {
    if common::skip() {
        return;
    }
    let _g = shared();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let rt2 = runtime();
    let foreign = rt2.driver().create_context().unwrap();
    let e = make_alloc(&ctx);
    let h = ctx.get_ipc_handle(e.ptr).unwrap();
    // A context of another driver (runtime) of this process: not its export.
    assert_eq!(
        foreign.put_ipc_handle(&h).unwrap_err().ze_result(),
        0x7800_0004
    );
    let view = ctx.open_ipc_handle(&h, 0).unwrap();
    ctx.put_ipc_handle(&h).unwrap();
    assert_eq!(ctx.put_ipc_handle(&h).unwrap_err().ze_result(), 0x7800_0004);
    let err = ctx.open_ipc_handle(&h, 0).unwrap_err();
    assert_eq!(err.ze_result(), 0x7800_0004);
    assert!(err.message().contains("put"), "{err}");
    // A view opened before the put stays valid, also after the memory is freed.
    dev_fill(&ctx, e.ptr, e.size, 8);
    e.destroy(&ctx);
    assert_eq!(dev_check(&ctx, view, 1 << 20, 8), None);
    ctx.close_ipc_handle(view).unwrap();
}

/// Case 6 of `shared/cases/level-zero.md`: gets of one memory count on one export (the same
/// handle each time), every put of them `SUCCESS`, through any context of the driver; a get
/// after the last put makes a new export; opens work until the last put.
#[test]
fn get_n_times_put_n_times_through_any_context_of_the_driver() {
    if common::skip() {
        return;
    }
    let _g = shared();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let other = rt.driver().create_context().unwrap();
    for kind in ["allocation", "physical object"] {
        let e = match kind {
            "allocation" => make_alloc(&ctx),
            _ => make_physical(&ctx),
        };
        dev_fill(&ctx, e.ptr, e.size, 21);
        let before = rt.driver().ipc_stats().exports;
        for n in 1..=8 {
            let hs: Vec<IpcHandle> = (0..n).map(|_| ctx.get_ipc_handle(e.ptr).unwrap()).collect();
            assert!(
                hs.iter().all(|h| h == &hs[0]),
                "{kind}: one handle per memory"
            );
            assert_eq!(
                rt.driver().ipc_stats().exports,
                before + 1,
                "{kind}: one export"
            );
            for (i, h) in hs.iter().enumerate() {
                // The last put goes through the other context of the same driver.
                let through = if i == n - 1 { &other } else { &ctx };
                let v = ctx.open_ipc_handle(h, 0).unwrap();
                assert_eq!(dev_check(&ctx, v, 1 << 20, 21), None, "{kind}");
                ctx.close_ipc_handle(v).unwrap();
                through.put_ipc_handle(h).unwrap();
            }
            assert_eq!(rt.driver().ipc_stats().exports, before, "{kind}: n = {n}");
            assert_eq!(
                ctx.open_ipc_handle(&hs[0], 0).unwrap_err().ze_result(),
                0x7800_0004,
                "{kind}: opened after the last put"
            );
            assert_eq!(
                ctx.put_ipc_handle(&hs[0]).unwrap_err().ze_result(),
                0x7800_0004,
                "{kind}: one put more than gets"
            );
        }
        // A get after the last put: a new export, a new handle.
        let h = ctx.get_ipc_handle(e.ptr).unwrap();
        let v = ctx.open_ipc_handle(&h, 0).unwrap();
        assert_eq!(dev_check(&ctx, v, 1 << 20, 21), None);
        ctx.close_ipc_handle(v).unwrap();
        ctx.put_ipc_handle(&h).unwrap();
        e.destroy(&ctx);
    }
}

#[test]
fn close_of_null_or_unknown_pointers_and_other_contexts_views() {
    if common::skip() {
        return;
    }
    let _g = shared();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let other = rt.driver().create_context().unwrap();
    assert_eq!(
        ctx.close_ipc_handle(0).unwrap_err().ze_result(),
        0x7800_0007
    );
    let e = make_alloc(&ctx);
    assert_eq!(
        ctx.close_ipc_handle(e.ptr).unwrap_err().ze_result(),
        0x7800_0004
    );
    let h = ctx.get_ipc_handle(e.ptr).unwrap();
    let v = ctx.open_ipc_handle(&h, 0).unwrap();
    assert_eq!(
        other.close_ipc_handle(v).unwrap_err().ze_result(),
        0x7800_0004
    );
    assert_eq!(
        ctx.close_ipc_handle(v + K64).unwrap_err().ze_result(),
        0x7800_0004
    );
    ctx.close_ipc_handle(v).unwrap();
    assert_eq!(
        ctx.close_ipc_handle(v).unwrap_err().ze_result(),
        0x7800_0004
    );
    ctx.put_ipc_handle(&h).unwrap();
    e.destroy(&ctx);
}

#[test]
fn eight_threads_export_open_close_and_put_concurrently() {
    if common::skip() {
        return;
    }
    let _g = shared();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let shared = make_alloc(&ctx);
    dev_fill(&ctx, shared.ptr, shared.size, 11);
    let h = ctx.get_ipc_handle(shared.ptr).unwrap();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let ctx = ctx.clone();
            s.spawn(move || {
                let own = make_alloc(&ctx);
                dev_fill(&ctx, own.ptr, own.size, 100 + t);
                for _ in 0..25 {
                    let mine = ctx.get_ipc_handle(own.ptr).unwrap();
                    let a = ctx.open_ipc_handle(&mine, 0).unwrap();
                    let b = ctx.open_ipc_handle(&h, 0).unwrap();
                    assert_eq!(dev_check(&ctx, a, own.size, 100 + t), None);
                    assert_eq!(dev_check(&ctx, b, shared.size, 11), None);
                    ctx.close_ipc_handle(a).unwrap();
                    ctx.close_ipc_handle(b).unwrap();
                    ctx.put_ipc_handle(&mine).unwrap();
                }
                own.destroy(&ctx);
            });
        }
    });
    ctx.put_ipc_handle(&h).unwrap();
    shared.destroy(&ctx);
}

#[test]
fn properties_of_an_opened_view_report_the_exported_memory_type() {
    if common::skip() {
        return;
    }
    let _g = shared();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let host = ctx.alloc_host(&AllocDesc::new(K64)).unwrap();
    let (e, _) = make_range(&ctx);
    let props = range(e.size);
    let mut cases = vec![(
        ctx.get_ipc_handle_with_properties(e.ptr, &props).unwrap(),
        hetmem::MemoryType::Device,
    )];
    // Host USM is exportable on both backends (cuda: cuMemCreate at a host NUMA node, case 9).
    cases.insert(
        0,
        (ctx.get_ipc_handle(host).unwrap(), hetmem::MemoryType::Host),
    );
    for (h, t) in cases {
        let v = ctx.open_ipc_handle(&h, 0).unwrap();
        let p = ctx.get_allocation_properties(v + K64 / 2).unwrap();
        assert_eq!(p.memory_type, t);
        assert_ne!(p.id, 0);
        ctx.close_ipc_handle(v).unwrap();
        assert_eq!(
            ctx.get_allocation_properties(v).unwrap().memory_type,
            hetmem::MemoryType::Unknown,
            "closed"
        );
        ctx.put_ipc_handle(&h).unwrap();
    }
    ctx.free_memory(host).unwrap();
    e.destroy(&ctx);
}

#[test]
fn handle_types_chained_at_creation_go_with_the_memory_and_do_not_accumulate() {
    if common::skip() {
        return;
    }
    let _g = shared();
    let rt = runtime();
    let d = rt.driver();
    let ctx = d.create_context().unwrap();
    let dev = d.device(0).unwrap();
    // One base page (64 KiB on the host backend, 2 MiB on cuda).
    let u = page(&ctx);
    let default = IpcHandleTypes::DEFAULT;
    let asked = IpcProperties {
        handle_types: Some(default),
        ..Default::default()
    };
    for i in 0..300 {
        let a = ctx
            .alloc_device_with_ipc_types(&dev, &AllocDesc::new(K64), default)
            .unwrap();
        let h = ctx
            .alloc_host_with_ipc_types(&AllocDesc::new(K64), default)
            .unwrap();
        let o = ctx
            .create_physical_memory_with_ipc_types(
                Some(&dev),
                PhysicalMemoryFlags::AllocateOnDevice,
                u,
                default,
            )
            .unwrap();
        let s = d.ipc_stats();
        assert_eq!((s.typed_allocations, s.typed_physical), (2, 1), "cycle {i}");
        if i % 50 == 0 {
            // The recorded types are checked at get, for allocations, objects and ranges.
            let r = ctx.reserve(None, u).unwrap();
            ctx.map(r.base, u, o, 0, AccessAttribute::ReadWrite)
                .unwrap();
            let handles = [
                ctx.get_ipc_handle_with_properties(a, &asked).unwrap(),
                ctx.get_physical_memory_ipc_handle(o, Some(default))
                    .unwrap(),
                ctx.get_ipc_handle_with_properties(
                    r.base,
                    &IpcProperties {
                        range_size: Some(u),
                        ..asked
                    },
                )
                .unwrap(),
            ];
            for x in &handles {
                ctx.put_ipc_handle(x).unwrap();
            }
            ctx.free_reservation(r).unwrap();
        }
        ctx.free_memory(a).unwrap();
        ctx.free_memory(h).unwrap();
        ctx.destroy_physical_memory(o).unwrap();
        let s = d.ipc_stats();
        assert_eq!((s.typed_allocations, s.typed_physical), (0, 0), "cycle {i}");
    }
    // Context teardown takes them too.
    let other = d.create_context().unwrap();
    other
        .alloc_host_with_ipc_types(&AllocDesc::new(K64), default)
        .unwrap();
    other
        .create_physical_memory_with_ipc_types(
            None,
            PhysicalMemoryFlags::AllocateOnHost,
            u,
            default,
        )
        .unwrap();
    assert_eq!(d.ipc_stats().typed_allocations, 1);
    drop(other);
    assert_eq!(d.ipc_stats(), hetmem::ipc::IpcStats::default());
}

// Case 1 of `shared/cases/ipc.md`: memory kept alive by live IPC exports still counts against
// the device's capacity.

const M2: usize = 2 << 20;

/// A driver with one device of 64 MiB (32 objects of 2 MiB).
fn runtime_64m() -> hetmem::Runtime {
    runtime_with(1, 64 << 20)
}

/// Creates 2 MiB of device memory, exports it through route `i % 3` (physical handles: the
/// object itself, a mapped VA, a range over the mapping; allocations: device, shared with a
/// device, device freed with DEFER), then destroys or frees the memory, 200 times while every
/// export stays alive; checks that creation fails with `OutOfDeviceMemory` once the device is
/// full and that `used` always counts the memory the exports hold. Returns the exports.
fn export_and_destroy_200_times(ctx: &Context, physical: bool) -> Vec<IpcHandle> {
    let dev = ctx.driver().device(0).unwrap();
    let mut handles = Vec::new();
    for i in 0..200 {
        let made = if physical {
            ctx.create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, M2)
                .map(|o| {
                    let r = ctx.reserve(None, M2).unwrap();
                    ctx.map(r.base, M2, o, 0, AccessAttribute::ReadWrite)
                        .unwrap();
                    let h = match i % 3 {
                        0 => ctx.get_physical_memory_ipc_handle(o, None).unwrap(),
                        1 => ctx.get_ipc_handle(r.base + K64).unwrap(),
                        _ => ctx
                            .get_ipc_handle_with_properties(r.base, &range(M2))
                            .unwrap(),
                    };
                    ctx.free_reservation(r).unwrap();
                    ctx.destroy_physical_memory(o).unwrap();
                    h
                })
        } else {
            let desc = AllocDesc::new(M2);
            match i % 3 {
                1 => ctx.alloc_shared(Some(&dev), &desc),
                _ => ctx.alloc_device(&dev, &desc),
            }
            .map(|p| {
                let h = ctx.get_ipc_handle(p).unwrap();
                match i % 3 {
                    2 => ctx.free_memory_ext(p, hetmem::FreePolicy::Defer).unwrap(),
                    _ => ctx.free_memory(p).unwrap(),
                }
                h
            })
        };
        match made {
            Ok(h) => handles.push(h),
            Err(e) => {
                assert_eq!(e.ze_result(), OUT_OF_DEVICE_MEMORY, "creation {i}: {e}");
                assert_eq!(handles.len(), 32, "creation {i} failed with room left: {e}");
            }
        }
        assert_eq!(
            dev.used_memory(),
            (handles.len() * M2) as u64,
            "after creation {i}, {} exports hold {} MiB",
            handles.len(),
            handles.len() * 2
        );
    }
    assert_eq!(handles.len(), 32, "the device holds 32 objects of 2 MiB");
    handles
}

/// Puts the handles one by one: each put gives back its 2 MiB, the last one all of it.
fn put_all_giving_capacity_back(ctx: &Context, handles: Vec<IpcHandle>) {
    let dev = ctx.driver().device(0).unwrap();
    let n = handles.len();
    for (i, h) in handles.iter().enumerate() {
        ctx.put_ipc_handle(h).unwrap();
        assert_eq!(
            dev.used_memory(),
            ((n - i - 1) * M2) as u64,
            "after put {i}"
        );
    }
}

#[test]
fn physical_memory_destroyed_while_exported_counts_against_the_device_until_the_last_put() {
    if common::not_applicable_on(
        hetmem::BackendKind::Cuda,
        "fills a host device of 64 MiB with 32 exported objects and expects OUT_OF_DEVICE_MEMORY; \
         a GPU's room is its free memory (tens of GiB), which is not exhausted here",
    ) || common::skip()
    {
        return;
    }
    let _g = shared();
    let rt = runtime_64m();
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device(0).unwrap();
    let handles = export_and_destroy_200_times(&ctx, true);
    assert_eq!(rt.driver().vm_stats().physical_objects, 0);
    put_all_giving_capacity_back(&ctx, handles);
    // The whole device is free again.
    let o = ctx
        .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, 64 << 20)
        .unwrap();
    ctx.destroy_physical_memory(o).unwrap();
    assert_eq!(dev.used_memory(), 0);
}

#[test]
fn usm_allocations_freed_while_exported_count_against_the_device_until_the_last_put() {
    if common::not_applicable_on(
        hetmem::BackendKind::Cuda,
        "fills a host device of 64 MiB with 32 exported objects and expects OUT_OF_DEVICE_MEMORY; \
         a GPU's room is its free memory (tens of GiB), which is not exhausted here (and shared \
         USM on cuda cannot be exported)",
    ) || common::skip()
    {
        return;
    }
    let _g = shared();
    let rt = runtime_64m();
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device(0).unwrap();
    let handles = export_and_destroy_200_times(&ctx, false);
    assert_eq!(rt.driver().usm_stats().allocations, 0);
    put_all_giving_capacity_back(&ctx, handles);
    for _ in 0..2 {
        let p = ctx.alloc_device(&dev, &AllocDesc::new(32 << 20)).unwrap();
        ctx.free_memory(p).unwrap();
    }
    assert_eq!(dev.used_memory(), 0);
}

// Case 3 of `shared/cases/acl.md`: memory imported in the same process counts against its
// device while the import lives (the original destroyed, its export put), through
// `Context::import_physical_memory` (ACL's `aclrtMemImportFromShareableHandle`) and through
// `Context::open_ipc_handle` (Level Zero's `zeMemOpenIpcHandle`).

/// 200 times on a 64 MiB device: 2 MiB physical object, exported, imported here (`view`:
/// opened as a view instead), the export put and the object destroyed, the import kept. Once
/// 64 MiB is held creation fails with `OUT_OF_DEVICE_MEMORY` and `used` always counts what the
/// imports hold; each import closed or destroyed gives back its 2 MiB.
fn import_destroy_original_200_times(view: bool) {
    let _g = shared();
    let rt = runtime_64m();
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device(0).unwrap();
    let mut imports = Vec::new();
    let mut views = Vec::new();
    for i in 0..200 {
        match ctx.create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, M2) {
            Ok(o) => {
                let h = ctx.get_physical_memory_ipc_handle(o, None).unwrap();
                if view {
                    views.push(ctx.open_ipc_handle(&h, 0).unwrap());
                } else {
                    imports.push(ctx.import_physical_memory(&h, &dev).unwrap());
                }
                ctx.put_ipc_handle(&h).unwrap();
                ctx.destroy_physical_memory(o).unwrap();
            }
            Err(e) => {
                assert_eq!(e.ze_result(), OUT_OF_DEVICE_MEMORY, "creation {i}: {e}");
                assert_eq!(
                    imports.len() + views.len(),
                    32,
                    "creation {i} failed with room left"
                );
            }
        }
        let held = imports.len() + views.len();
        assert_eq!(
            dev.used_memory(),
            (held * M2) as u64,
            "after creation {i}, {held} imports hold {} MiB",
            held * 2
        );
        assert_eq!(dev.free_memory().unwrap(), (64 << 20) - (held * M2) as u64);
    }
    assert_eq!(imports.len() + views.len(), 32);
    let n = 32;
    for (i, p) in imports.into_iter().enumerate() {
        ctx.destroy_physical_memory(p).unwrap();
        assert_eq!(
            dev.used_memory(),
            ((n - i - 1) * M2) as u64,
            "after destroy {i}"
        );
    }
    for (i, v) in views.into_iter().enumerate() {
        ctx.close_ipc_handle(v).unwrap();
        assert_eq!(
            dev.used_memory(),
            ((n - i - 1) * M2) as u64,
            "after close {i}"
        );
    }
    assert_eq!(dev.used_memory(), 0);
}

#[test]
fn physical_memory_imported_here_counts_against_the_device_until_the_last_import_goes() {
    if common::not_applicable_on(
        hetmem::BackendKind::Cuda,
        "fills a host device of 64 MiB with 32 imported objects and expects OUT_OF_DEVICE_MEMORY; \
         a GPU's room is its free memory (tens of GiB), which is not exhausted here",
    ) || common::skip()
    {
        return;
    }
    import_destroy_original_200_times(false);
}

#[test]
fn physical_memory_opened_here_as_a_view_counts_against_the_device_until_the_last_close() {
    if common::not_applicable_on(
        hetmem::BackendKind::Cuda,
        "fills a host device of 64 MiB with 32 opened objects and expects OUT_OF_DEVICE_MEMORY; \
         a GPU's room is its free memory (tens of GiB), which is not exhausted here",
    ) || common::skip()
    {
        return;
    }
    import_destroy_original_200_times(true);
}

#[test]
fn capacity_of_memory_exported_twice_and_opened_here_comes_back_with_the_last_put_or_close() {
    if common::skip() {
        return;
    }
    let _g = shared();
    let rt = runtime_64m();
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device(0).unwrap();
    for kind in ["allocation", "physical object"] {
        let e = match kind {
            "allocation" => make_alloc(&ctx),
            _ => make_physical(&ctx),
        };
        let bytes = dev.used_memory();
        assert!(bytes > 0);
        let h1 = ctx.get_ipc_handle(e.ptr).unwrap();
        let h2 = ctx.get_ipc_handle(e.ptr).unwrap();
        let v = ctx.open_ipc_handle(&h1, 0).unwrap();
        dev_fill(&ctx, e.ptr, e.size, 9);
        e.destroy(&ctx);
        assert_eq!(dev.used_memory(), bytes, "two exports and a view hold it");
        ctx.put_ipc_handle(&h1).unwrap();
        assert_eq!(dev.used_memory(), bytes, "an export and a view hold it");
        ctx.put_ipc_handle(&h2).unwrap();
        assert_eq!(dev.used_memory(), bytes, "the view holds it");
        assert_eq!(
            dev_check(&ctx, v, 1 << 20, 9),
            None,
            "the view still has the memory"
        );
        ctx.close_ipc_handle(v).unwrap();
        assert_eq!(dev.used_memory(), 0, "{kind}: the last close gives it back");
    }
}

#[test]
fn capacity_held_by_exports_comes_back_when_their_context_is_destroyed() {
    if common::skip() {
        return;
    }
    let _g = shared();
    let rt = runtime_64m();
    let dev = rt.driver().device(0).unwrap();
    let ctx = rt.driver().create_context().unwrap();
    let e = make_physical(&ctx);
    let _h = ctx.get_ipc_handle(e.ptr).unwrap();
    let _v = ctx.open_ipc_handle(&_h, 0).unwrap();
    e.destroy(&ctx);
    assert_eq!(dev.used_memory(), M2 as u64);
    drop(ctx);
    assert_eq!(dev.used_memory(), 0);
}
