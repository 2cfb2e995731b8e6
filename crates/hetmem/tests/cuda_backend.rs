//! The spec's rules on the cuda backend, on a real GPU: virtual memory (reserve, page size,
//! physical memory on the device and on the host, map at offsets, unmap pieces, access
//! attributes), USM allocations, imports of system memory, queues and free policies. Device
//! memory is checked through the device itself (copies on a queue into host memory), never
//! through a host pointer, since the host cannot reach it.
//!
//! Where no CUDA driver or GPU is present (CI), the runtime must refuse the cuda backend with
//! `Uninitialized` and the reason; every GPU test then prints a `SKIPPED (cuda)` line with that
//! reason and passes. On the GPU machine: `../shared/tools/gpu-bins`, then run
//! `.device-bin/tests/cuda_backend-test` there.

use hetmem::{
    AccessAttribute, AllocDesc, BackendKind, Context, Error, FreePolicy, MemoryType,
    PhysicalMemoryFlags, Runtime,
};

/// Prints `line` on the test process's stderr past the test harness's capture, so that a skip
/// shows in every run's output, passed or not.
fn loud(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The cuda runtime, or `None` after printing why it cannot start here.
fn cuda(test: &str) -> Option<Runtime> {
    match Runtime::builder().backend(BackendKind::Cuda).build() {
        Ok(rt) => Some(rt),
        Err(e) => {
            assert!(
                matches!(e, Error::Uninitialized(_)),
                "the cuda backend failed with something other than Uninitialized: {e:?}"
            );
            loud(&format!("SKIPPED (cuda) {test}: {}", e.message()));
            None
        }
    }
}

/// Reads `n` bytes at `src` (any memory the device reaches) through a copy on an immediate
/// command list of device 0 into host USM memory.
fn read_back(ctx: &Context, rt: &Runtime, src: usize, n: usize) -> Vec<u8> {
    let dev = rt.driver().device_ref(0).unwrap();
    let host = ctx.alloc_host(&AllocDesc::new(n)).unwrap();
    let list = ctx.create_immediate_command_list(dev).unwrap();
    list.append_memory_copy(host, src, n, None, &[]).unwrap();
    list.host_synchronize(u64::MAX).unwrap();
    // SAFETY: host USM memory of n bytes, written by the finished copy.
    let out = unsafe { std::slice::from_raw_parts(host as *const u8, n) }.to_vec();
    ctx.free_memory(host).unwrap();
    out
}

/// Fills `n` bytes at `dst` with `pattern` on device 0 and waits.
fn fill(ctx: &Context, rt: &Runtime, dst: usize, pattern: &[u8], n: usize) {
    let dev = rt.driver().device_ref(0).unwrap();
    let list = ctx.create_immediate_command_list(dev).unwrap();
    list.append_memory_fill(dst, pattern, n, None, &[]).unwrap();
    list.host_synchronize(u64::MAX).unwrap();
}

#[test]
fn without_a_driver_the_cuda_backend_is_uninitialized_with_the_reason() {
    match Runtime::builder().backend(BackendKind::Cuda).build() {
        Ok(rt) => {
            // A GPU is here: the backend must describe it.
            assert_eq!(rt.driver().backend_kind(), BackendKind::Cuda);
            assert!(
                rt.driver().describe().contains("CUDA driver API"),
                "{}",
                rt.driver().describe()
            );
            assert!(!rt.driver().device_list().is_empty());
        }
        Err(e) => {
            assert_eq!(e.ze_result(), 0x7800_0001, "{e:?}");
            assert!(
                e.message().contains("cuda backend cannot start"),
                "{}",
                e.message()
            );
            loud(&format!("SKIPPED (cuda): {}", e.message()));
        }
    }
}

#[test]
fn page_size_is_the_driver_granularity_and_reservations_follow_it() {
    let Some(rt) = cuda("page size") else { return };
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device_ref(0).unwrap();
    let page = ctx.query_page_size(dev, 1).unwrap();
    assert!(page.is_power_of_two() && page >= 64 << 10, "{page}");
    assert_eq!(dev.info().min_page_size, page);
    // A reservation is aligned to the page size and can be freed.
    let r = ctx.reserve(None, 4 * page).unwrap();
    assert_eq!(r.base % page, 0);
    // Unaligned sizes are refused before the driver is asked.
    let e = ctx.reserve(None, page + 1).unwrap_err();
    assert_eq!(
        e.ze_result(),
        0x7800_0009, /* UNSUPPORTED_SIZE */
        "{e}"
    );
    ctx.free_reservation(r).unwrap();
}

#[test]
fn device_physical_memory_maps_at_offsets_and_holds_what_the_device_writes() {
    let Some(rt) = cuda("map at offsets") else {
        return;
    };
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device_ref(0).unwrap();
    let page = ctx.query_page_size(dev, 1).unwrap();
    let r = ctx.reserve(None, 8 * page).unwrap();
    let phys = ctx
        .create_physical_memory(Some(dev), PhysicalMemoryFlags::AllocateOnDevice, 4 * page)
        .unwrap();
    // Pages 1..3 of the object at the start of the reservation (a non-zero offset, which the
    // driver's own cuMemMap refuses), and page 0 of it at page 5.
    ctx.map(r.base, 3 * page, phys, page, AccessAttribute::ReadWrite)
        .unwrap();
    ctx.map(r.base + 5 * page, page, phys, 0, AccessAttribute::ReadWrite)
        .unwrap();
    fill(&ctx, &rt, r.base, &[0xA1], 3 * page);
    fill(
        &ctx,
        &rt,
        r.base + 5 * page,
        &[1, 2, 3, 4, 5, 6, 7, 8],
        page,
    );
    let got = read_back(&ctx, &rt, r.base + page - 4, 8);
    assert_eq!(got, [0xA1; 8]);
    let got = read_back(&ctx, &rt, r.base + 5 * page + 6, 4);
    assert_eq!(got, [7, 8, 1, 2]);
    // Unmapping the middle page of the first mapping leaves its neighbours mapped and intact.
    ctx.unmap(r.base + page, page).unwrap();
    assert_eq!(read_back(&ctx, &rt, r.base, 4), [0xA1; 4]);
    assert_eq!(read_back(&ctx, &rt, r.base + 2 * page, 4), [0xA1; 4]);
    // Mapping it again at the same object offset sees the bytes written before (same memory).
    ctx.map(
        r.base + page,
        page,
        phys,
        2 * page,
        AccessAttribute::ReadWrite,
    )
    .unwrap();
    assert_eq!(read_back(&ctx, &rt, r.base + page, 4), [0xA1; 4]);
    // A page mapped twice through two addresses is one page of memory.
    fill(&ctx, &rt, r.base + 2 * page, &[0x5C], 16);
    ctx.map(
        r.base + 6 * page,
        page,
        phys,
        3 * page,
        AccessAttribute::ReadWrite,
    )
    .unwrap();
    assert_eq!(read_back(&ctx, &rt, r.base + 6 * page, 4), [0x5C; 4]);
    for (s, n) in [(0, 3), (5, 2)] {
        ctx.unmap(r.base + s * page, n * page).unwrap();
    }
    ctx.destroy_physical_memory(phys).unwrap();
    ctx.free_reservation(r).unwrap();
}

/// A physical object mapped whole is one driver allocation (the fast path); the first
/// operation on a piece of it (here: an unmap of one page of one of two mappings, then a
/// protect of one page of the other) splits it into granules. Both mappings keep every byte
/// written before the split and stay one memory afterwards.
#[test]
fn a_piece_of_a_whole_mapping_is_split_off_without_losing_contents_or_sharing() {
    let Some(rt) = cuda("split on a piece") else {
        return;
    };
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device_ref(0).unwrap();
    let page = ctx.query_page_size(dev, 1).unwrap();
    let (a, b) = (
        ctx.reserve(None, 4 * page).unwrap(),
        ctx.reserve(None, 4 * page).unwrap(),
    );
    let phys = ctx
        .create_physical_memory(Some(dev), PhysicalMemoryFlags::AllocateOnDevice, 4 * page)
        .unwrap();
    ctx.map(a.base, 4 * page, phys, 0, AccessAttribute::ReadWrite)
        .unwrap();
    ctx.map(b.base, 4 * page, phys, 0, AccessAttribute::ReadWrite)
        .unwrap();
    for i in 0..4u8 {
        fill(&ctx, &rt, a.base + i as usize * page, &[0x10 + i], page);
    }
    // Through the other mapping: the same bytes.
    for i in 0..4u8 {
        let at = b.base + i as usize * page + page - 8;
        assert_eq!(read_back(&ctx, &rt, at, 8), [0x10 + i; 8], "page {i}");
    }
    // Unmap page 1 of mapping A: the allocation is split, both mappings re-made.
    ctx.unmap(a.base + page, page).unwrap();
    for i in [0u8, 2, 3] {
        assert_eq!(
            read_back(&ctx, &rt, a.base + i as usize * page, 8),
            [0x10 + i; 8],
            "A page {i} after the split"
        );
    }
    for i in 0..4u8 {
        assert_eq!(
            read_back(&ctx, &rt, b.base + i as usize * page, 8),
            [0x10 + i; 8],
            "B page {i} after the split"
        );
    }
    // Still one memory: a write through B shows through A.
    fill(&ctx, &rt, b.base + 3 * page, &[0xEE], 16);
    assert_eq!(read_back(&ctx, &rt, a.base + 3 * page, 16), [0xEE; 16]);
    // Page 1 mapped again from the object holds what was written before.
    ctx.map(a.base + page, page, phys, page, AccessAttribute::ReadWrite)
        .unwrap();
    assert_eq!(read_back(&ctx, &rt, a.base + page, 8), [0x11; 8]);
    // A protect of one page of B (already granules) leaves its neighbours writable.
    ctx.set_access_attribute(b.base + 2 * page, page, AccessAttribute::ReadOnly)
        .unwrap();
    fill(&ctx, &rt, b.base + page, &[0x77], 8);
    assert_eq!(read_back(&ctx, &rt, a.base + page, 8), [0x77; 8]);
    assert_eq!(read_back(&ctx, &rt, b.base + 2 * page, 8), [0x12; 8]);
    // Unmapped everywhere, the object can be destroyed.
    ctx.unmap(a.base, 4 * page).unwrap();
    ctx.unmap(b.base, 4 * page).unwrap();
    ctx.destroy_physical_memory(phys).unwrap();
    ctx.free_reservation(a).unwrap();
    ctx.free_reservation(b).unwrap();
}

#[test]
fn access_attributes_are_recorded_per_page_and_set_by_the_driver() {
    let Some(rt) = cuda("access attributes") else {
        return;
    };
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device_ref(0).unwrap();
    let page = ctx.query_page_size(dev, 1).unwrap();
    let r = ctx.reserve(None, 4 * page).unwrap();
    let phys = ctx
        .create_physical_memory(Some(dev), PhysicalMemoryFlags::AllocateOnDevice, 4 * page)
        .unwrap();
    ctx.map(r.base, 4 * page, phys, 0, AccessAttribute::ReadWrite)
        .unwrap();
    ctx.set_access_attribute(r.base + page, page, AccessAttribute::ReadOnly)
        .unwrap();
    ctx.set_access_attribute(r.base + 2 * page, page, AccessAttribute::None)
        .unwrap();
    assert_eq!(
        ctx.get_access_attribute(r.base, page).unwrap(),
        (AccessAttribute::ReadWrite, page)
    );
    assert_eq!(
        ctx.get_access_attribute(r.base + page, 3 * page).unwrap(),
        (AccessAttribute::ReadOnly, page)
    );
    assert_eq!(
        ctx.get_access_attribute(r.base + 2 * page, page).unwrap(),
        (AccessAttribute::None, page)
    );
    // The read-only page is still readable by the device, and a device write into it is
    // refused (the driver also refuses one: cuMemsetD8 into a PROT_READ mapping answers
    // CUDA_ERROR_INVALID_VALUE, measured): nothing changes and the context stays usable.
    let before = read_back(&ctx, &rt, r.base + page, 16);
    let list = ctx.create_immediate_command_list(dev).unwrap();
    let e = list
        .append_memory_fill(r.base + page, &[0xAB], 16, None, &[])
        .unwrap_err();
    assert_eq!(
        e.ze_result(),
        0x7800_0004, /* INVALID_ARGUMENT */
        "{e}"
    );
    assert!(e.message().contains("ReadOnly"), "{e}");
    assert_eq!(read_back(&ctx, &rt, r.base + page, 16), before);
    fill(&ctx, &rt, r.base, &[0x3C], 16);
    assert_eq!(read_back(&ctx, &rt, r.base, 16), [0x3C; 16]);
    // Read-write again: writable.
    ctx.set_access_attribute(r.base, 4 * page, AccessAttribute::ReadWrite)
        .unwrap();
    fill(&ctx, &rt, r.base + 2 * page, &[9], 8);
    assert_eq!(read_back(&ctx, &rt, r.base + 2 * page, 8), [9; 8]);
    // A reserved range only partly mapped takes the attribute on its mapped pages (the
    // driver is asked only for those), as on every backend.
    ctx.unmap(r.base + 3 * page, page).unwrap();
    ctx.set_access_attribute(r.base + 2 * page, 2 * page, AccessAttribute::ReadOnly)
        .unwrap();
    assert_eq!(
        ctx.get_access_attribute(r.base + 2 * page, page).unwrap().0,
        AccessAttribute::ReadOnly
    );
    assert_eq!(read_back(&ctx, &rt, r.base + 2 * page, 8), [9; 8]);
    // Unaligned sizes are refused and change nothing.
    let e = ctx
        .set_access_attribute(r.base, page / 2, AccessAttribute::None)
        .unwrap_err();
    assert!(e.ze_result() >= 0x7800_0000, "{e}");
    assert_eq!(
        ctx.get_access_attribute(r.base, page).unwrap().0,
        AccessAttribute::ReadWrite
    );
    ctx.unmap(r.base, 3 * page).unwrap();
    ctx.destroy_physical_memory(phys).unwrap();
    ctx.free_reservation(r).unwrap();
}

#[test]
fn host_physical_memory_is_reachable_from_the_host_and_the_device() {
    let Some(rt) = cuda("host physical memory") else {
        return;
    };
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device_ref(0).unwrap();
    let page = ctx.query_page_size(dev, 1).unwrap();
    let r = ctx.reserve(None, 2 * page).unwrap();
    let phys = match ctx.create_physical_memory(None, PhysicalMemoryFlags::AllocateOnHost, page) {
        Ok(p) => p,
        Err(e) => {
            // A driver without host physical memory must say so as UNSUPPORTED_FEATURE.
            assert_eq!(e.ze_result(), 0x7800_0003, "{e}");
            loud(&format!(
                "NOT APPLICABLE (cuda) host physical memory: {}",
                e.message()
            ));
            return;
        }
    };
    ctx.map(r.base, page, phys, 0, AccessAttribute::ReadWrite)
        .unwrap();
    // SAFETY: host physical memory mapped read-write for the host too.
    unsafe { std::ptr::write_bytes(r.base as *mut u8, 0x3E, 64) };
    assert_eq!(read_back(&ctx, &rt, r.base, 64), [0x3E; 64]);
    fill(&ctx, &rt, r.base + 64, &[0x44], 64);
    // SAFETY: as above; the fill has finished.
    let host = unsafe { std::slice::from_raw_parts((r.base + 64) as *const u8, 64) };
    assert_eq!(host, [0x44; 64]);
    ctx.unmap(r.base, page).unwrap();
    ctx.destroy_physical_memory(phys).unwrap();
    ctx.free_reservation(r).unwrap();
}

#[test]
fn usm_allocations_of_every_kind_answer_their_properties_and_hold_data() {
    let Some(rt) = cuda("usm") else { return };
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device_ref(0).unwrap();
    let d = ctx.alloc_device(dev, &AllocDesc::new(3 << 20)).unwrap();
    let h = ctx.alloc_host(&AllocDesc::new(1 << 20)).unwrap();
    let s = ctx
        .alloc_shared(Some(dev), &AllocDesc::new(1 << 20))
        .unwrap();
    for (p, t) in [
        (d, MemoryType::Device),
        (h, MemoryType::Host),
        (s, MemoryType::Shared),
    ] {
        let props = ctx.get_allocation_properties(p + 100).unwrap();
        assert_eq!(props.memory_type, t, "{p:#x}");
        assert_eq!(ctx.get_address_range(p + 100).unwrap().0, p);
    }
    // Device memory holds what the device writes; host and shared memory are reachable from
    // the host as well.
    fill(&ctx, &rt, d, &[1, 2, 3, 4], 3 << 20);
    assert_eq!(read_back(&ctx, &rt, d + (3 << 20) - 4, 4), [1, 2, 3, 4]);
    // SAFETY: host and shared USM memory are host-accessible, 1 MiB each.
    unsafe {
        std::ptr::write_bytes(h as *mut u8, 0x11, 1 << 20);
        std::ptr::write_bytes(s as *mut u8, 0x22, 1 << 20);
    }
    let list = ctx.create_immediate_command_list(dev).unwrap();
    list.append_memory_copy(d, h, 1 << 20, None, &[]).unwrap();
    list.append_memory_copy(s + 16, d + 8, 8, None, &[])
        .unwrap();
    list.host_synchronize(u64::MAX).unwrap();
    // SAFETY: as above; the copies have finished.
    let got = unsafe { std::slice::from_raw_parts(s as *const u8, 32) };
    assert_eq!(&got[..16], [0x22; 16]);
    assert_eq!(&got[16..24], [0x11; 8]);
    for p in [d, h, s] {
        ctx.free_memory(p).unwrap();
    }
    // Freed memory is unknown.
    assert_eq!(
        ctx.get_allocation_properties(d).unwrap().memory_type,
        MemoryType::Unknown
    );
}

#[test]
fn imported_system_memory_is_reachable_by_the_device_and_read_only_stays_unchanged() {
    let Some(rt) = cuda("system memory import") else {
        return;
    };
    let ctx = rt.driver().create_context().unwrap();
    let n = 4 << 20;
    let mut buf = vec![0u8; n + 4096];
    let base = (buf.as_mut_ptr() as usize).next_multiple_of(4096);
    // SAFETY: inside buf.
    unsafe { std::ptr::write_bytes(base as *mut u8, 0x6B, n) };
    let p = ctx.import_system_memory(base, n, false).unwrap();
    assert_eq!(p, base);
    assert_eq!(
        ctx.get_allocation_properties(base).unwrap().memory_type,
        MemoryType::HostImported
    );
    assert_eq!(read_back(&ctx, &rt, base + n - 8, 8), [0x6B; 8]);
    fill(&ctx, &rt, base, &[0x10], 32);
    assert_eq!(&buf[base - buf.as_ptr() as usize..][..32], [0x10; 32]);
    // Importing the same memory twice is refused (it is imported already).
    assert!(ctx.import_system_memory(base, n, false).is_err());
    ctx.free_memory(base).unwrap();
    // After the release it can be imported again, read-only this time.
    ctx.import_system_memory(base, n, true).unwrap();
    assert_eq!(read_back(&ctx, &rt, base, 4), [0x10; 4]);
    ctx.free_memory(base).unwrap();
}

#[test]
fn blocking_free_waits_for_queued_gpu_work_that_uses_the_memory() {
    let Some(rt) = cuda("free policies") else {
        return;
    };
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device_ref(0).unwrap();
    let big = 256 << 20;
    let src = ctx.alloc_device(dev, &AllocDesc::new(big)).unwrap();
    let dst = ctx.alloc_device(dev, &AllocDesc::new(big)).unwrap();
    let q = ctx.create_command_queue(dev).unwrap();
    let list = ctx.create_command_list(dev).unwrap();
    let gate = ctx.create_event().unwrap();
    list.append_wait_on_events(&[&gate]).unwrap();
    list.append_memory_fill(src, &[0x77], big, None, &[])
        .unwrap();
    list.append_memory_copy(dst, src, big, None, &[]).unwrap();
    list.close().unwrap();
    q.execute_command_lists(&[&list], None).unwrap();
    // The work is held by the gate: a blocking free of its memory must wait for it.
    let opener = {
        let gate = gate.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            gate.host_signal().unwrap();
        })
    };
    let t = std::time::Instant::now();
    ctx.free_memory_ext(src, FreePolicy::Blocking).unwrap();
    assert!(
        t.elapsed() >= std::time::Duration::from_millis(150),
        "the blocking free returned before the queued work could run: {:?}",
        t.elapsed()
    );
    opener.join().unwrap();
    q.synchronize(u64::MAX).unwrap();
    assert_eq!(read_back(&ctx, &rt, dst + big - 4, 4), [0x77; 4]);
    ctx.free_memory(dst).unwrap();
}

#[test]
fn device_memory_runs_out_cleanly_and_nothing_is_lost() {
    let Some(rt) = cuda("out of memory") else {
        return;
    };
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device_ref(0).unwrap();
    let cap = dev.info().capacity as usize;
    let used_before = dev.used_memory();
    // More than the device has: refused before or by the driver, with nothing kept.
    let e = ctx
        .alloc_device(dev, &AllocDesc::new(cap + (2 << 20)))
        .unwrap_err();
    assert!(
        [0x7000_0003, 0x7800_0008, 0x7800_0009].contains(&e.ze_result()),
        "{e}"
    );
    assert_eq!(dev.used_memory(), used_before);
    // And the device still works.
    let p = ctx.alloc_device(dev, &AllocDesc::new(2 << 20)).unwrap();
    fill(&ctx, &rt, p, &[5], 16);
    assert_eq!(read_back(&ctx, &rt, p, 16), [5; 16]);
    ctx.free_memory(p).unwrap();
}

// ---------------------------------------------------------------------------------------------
// ACL managed memory on the GPU (cuMemAllocManaged, cuMemAdvise, cuMemPrefetchAsync). The range
// attributes must answer exactly as on the host backend and as the ACL page says.

#[test]
fn managed_memory_allocates_in_2mib_moves_on_prefetch_and_answers_every_attribute() {
    use hetmem::{Advice, Location, RangeAttribute as A};
    let Some(rt) = cuda("managed memory") else {
        return;
    };
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device_ref(0).unwrap();
    // Size 0 is ACL_ERROR_INVALID_PARAM; 3 MiB rounds to 4 MiB.
    let e = ctx.alloc_managed(0, 1).unwrap_err();
    assert_eq!(e.acl_error(), 100000, "{e}");
    let p = ctx.alloc_managed(3 << 20, 1).unwrap();
    assert_eq!(p % (2 << 20), 0);
    let size = 4 << 20;
    // Fresh: nothing advised.
    assert_eq!(
        ctx.managed_attr_i32(A::PreferredLocation, p, size).unwrap(),
        -2
    );
    assert_eq!(
        ctx.managed_attr_i32(A::PreferredLocationType, p, size)
            .unwrap(),
        0
    );
    assert_eq!(
        ctx.managed_attr_i32(A::LastPrefetchLocation, p, size)
            .unwrap(),
        -2
    );
    // Host writes, a prefetch to the device, device work, and a host read back.
    ctx.managed_memset(p, 0x2A, size).unwrap();
    let s = ctx.create_stream(dev).unwrap();
    ctx.mem_prefetch(p, size, Location::Device(0), 0, &s)
        .unwrap();
    s.synchronize().unwrap();
    assert_eq!(
        ctx.managed_attr_i32(A::LastPrefetchLocation, p, size)
            .unwrap(),
        0
    );
    assert_eq!(
        ctx.managed_attr_i32(A::LastPrefetchLocationType, p, size)
            .unwrap(),
        1
    );
    s.memset_async(p + 4096, 0x55, 8192).unwrap();
    s.synchronize().unwrap();
    let mut out = vec![0u8; 4];
    ctx.managed_read(p + 4096 - 2, &mut out).unwrap();
    assert_eq!(out, [0x2A, 0x2A, 0x55, 0x55]);
    // A prefetch to the host's NUMA node is answered with the node and its type (the driver
    // itself would say -1).
    let node = hetmem::platform::current_numa_node() as i32;
    ctx.mem_prefetch(p, 2 << 20, Location::HostNuma(node as u32), 0, &s)
        .unwrap();
    s.synchronize().unwrap();
    assert_eq!(
        ctx.managed_attr_i32(A::LastPrefetchLocationType, p, 2 << 20)
            .unwrap(),
        3
    );
    assert_eq!(
        ctx.managed_attr_i32(A::LastPrefetchLocationId, p, 2 << 20)
            .unwrap(),
        node
    );
    // Advice: read-mostly on half, preferred location device 0 on the other half, accessed by
    // device 0 over all of it (padded with -2).
    ctx.mem_advise(p, 2 << 20, Advice::SetReadMostly, Location::Device(0))
        .unwrap();
    assert_eq!(ctx.managed_attr_i32(A::ReadMostly, p, 2 << 20).unwrap(), 1);
    assert_eq!(ctx.managed_attr_i32(A::ReadMostly, p, size).unwrap(), 0);
    ctx.mem_advise(
        p + (2 << 20),
        2 << 20,
        Advice::SetPreferredLocation,
        Location::Device(0),
    )
    .unwrap();
    assert_eq!(
        ctx.managed_attr_i32(A::PreferredLocation, p + (2 << 20), 2 << 20)
            .unwrap(),
        0
    );
    ctx.mem_advise(p, size, Advice::SetAccessedBy, Location::Device(0))
        .unwrap();
    assert_eq!(ctx.managed_accessed_by(p, size, 3).unwrap(), [0, -2, -2]);
    // Accessed-by must not clear read-mostly (case 8 of shared/cases/managed.md).
    assert_eq!(ctx.managed_attr_i32(A::ReadMostly, p, 2 << 20).unwrap(), 1);
    // Bytes survived every move.
    ctx.managed_read(p + size - 4, &mut out).unwrap();
    assert_eq!(out, [0x2A; 4]);
    // A device id past the last is refused with 107000 and changes nothing.
    let n = rt.driver().device_list().len() as u32;
    let e = ctx
        .mem_advise(
            p,
            2 << 20,
            Advice::SetPreferredLocation,
            Location::Device(n),
        )
        .unwrap_err();
    assert_eq!(e.acl_error(), 107000, "{e}");
    ctx.free_managed(p).unwrap();
    assert!(!ctx.is_managed(p));
}

#[test]
fn managed_memory_beyond_what_the_gpu_has_free_is_refused_before_the_driver_is_asked() {
    let Some(rt) = cuda("managed oversubscription") else {
        return;
    };
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device_ref(0).unwrap();
    let too_much = (dev.info().capacity + (2 << 30)).next_multiple_of(2 << 20);
    let e = ctx.alloc_managed(too_much, 1).unwrap_err();
    assert_eq!(e.acl_error(), 207001, "{e}");
    assert!(e.message().contains("free"), "{e}");
    // Nothing was kept: a small allocation still works.
    let p = ctx.alloc_managed(2 << 20, 1).unwrap();
    ctx.free_managed(p).unwrap();
}

// ---------------------------------------------------------------------------------------------
// IPC on the GPU: a real second process (this test binary re-run with one test selected).

/// The variable that makes a run of [`ipc_between_two_processes_shares_gpu_memory`] the
/// importer: hex of the handles' bytes, in order (range, allocation, physical object).
const IPC_CHILD: &str = "HETMEM_CUDA_IPC_CHILD";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// The importer's side: opens the range handle (four pages over two physical objects: one
/// mapped whole, one split by a map at an offset), checks the exporter's bytes through the
/// device, writes into page 2; opens the device allocation's handle and checks it; imports the
/// physical object handle and maps only its page 1 at offset 1; then closes everything.
fn ipc_importer(handles: &str) {
    let rt = cuda("ipc importer").expect("the exporter found a GPU");
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device_ref(0).unwrap();
    let page = ctx.query_page_size(dev, 1).unwrap();
    let b = unhex(handles);
    let h = |i: usize| hetmem::IpcHandle::from_bytes(b[64 * i..64 * (i + 1)].try_into().unwrap());
    let view = ctx.open_ipc_handle(&h(0), 0).unwrap();
    for (i, v) in [0x21u8, 0x22, 0x23, 0x24].into_iter().enumerate() {
        assert_eq!(
            read_back(&ctx, &rt, view + i * page + page - 8, 8),
            [v; 8],
            "range view page {i}"
        );
    }
    fill(&ctx, &rt, view + 2 * page, &[0x99], 64);
    ctx.close_ipc_handle(view).unwrap();
    let a = ctx.open_ipc_handle(&h(1), 0).unwrap();
    assert_eq!(read_back(&ctx, &rt, a, 8), [0x42; 8]);
    ctx.close_ipc_handle(a).unwrap();
    // The physical object (4 pages): page 1 of it mapped alone, at offset 1.
    let phys = ctx.import_physical_memory(&h(2), dev).unwrap();
    let r = ctx.reserve(None, page).unwrap();
    ctx.map(r.base, page, phys, page, AccessAttribute::ReadWrite)
        .unwrap();
    assert_eq!(read_back(&ctx, &rt, r.base, 8), [0x22; 8]);
    ctx.unmap(r.base, page).unwrap();
    ctx.destroy_physical_memory(phys).unwrap();
    ctx.free_reservation(r).unwrap();
}

/// IPC on the GPU between two processes: a range handle over two physical objects (one
/// still one allocation until the export splits it), a device allocation's handle and a
/// physical object's handle, all opened by a second process, which sees the exporter's bytes
/// and whose write the exporter sees. On the cuda backend the fds are descriptors of
/// `/dev/nvidiactl` and travel through the exporter's broker.
#[test]
fn ipc_between_two_processes_shares_gpu_memory() {
    if let Ok(handles) = std::env::var(IPC_CHILD) {
        ipc_importer(&handles);
        return;
    }
    let Some(rt) = cuda("ipc between two processes") else {
        return;
    };
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device_ref(0).unwrap();
    let page = ctx.query_page_size(dev, 1).unwrap();
    let r = ctx.reserve(None, 4 * page).unwrap();
    let big = ctx
        .create_physical_memory(Some(dev), PhysicalMemoryFlags::AllocateOnDevice, 4 * page)
        .unwrap();
    let small = ctx
        .create_physical_memory(Some(dev), PhysicalMemoryFlags::AllocateOnDevice, page)
        .unwrap();
    // Pages 0..3 of the range: `big` whole would not fit; map its first three pages (a piece:
    // the map splits it) and `small` after them.
    ctx.map(r.base, 3 * page, big, 0, AccessAttribute::ReadWrite)
        .unwrap();
    ctx.map(
        r.base + 3 * page,
        page,
        small,
        0,
        AccessAttribute::ReadWrite,
    )
    .unwrap();
    for (i, v) in [0x21u8, 0x22, 0x23, 0x24].into_iter().enumerate() {
        fill(&ctx, &rt, r.base + i * page, &[v], page);
    }
    let range = ctx
        .get_ipc_handle_with_properties(
            r.base,
            &hetmem::IpcProperties {
                range_size: Some(4 * page),
                ..Default::default()
            },
        )
        .unwrap();
    let alloc = ctx.alloc_device(dev, &AllocDesc::new(page)).unwrap();
    fill(&ctx, &rt, alloc, &[0x42], page);
    let ah = ctx.get_ipc_handle(alloc).unwrap();
    let ph = ctx.get_physical_memory_ipc_handle(big, None).unwrap();
    // The fd of a handle is the export's description on this backend (case 5 of
    // shared/cases/level-zero.md): the handle comes back from it; a cuda shareable fd (a
    // descriptor of /dev/nvidiactl, no description) is refused, saying why.
    assert_eq!(ctx.ipc_handle_from_fd(range.fd()).unwrap(), range);
    assert_eq!(ctx.ipc_handle_from_fd(ah.fd()).unwrap(), ah);
    let nvidiactl = std::fs::File::open("/dev/nvidiactl").unwrap();
    let e = ctx
        .ipc_handle_from_fd(std::os::fd::AsRawFd::as_raw_fd(&nvidiactl))
        .unwrap_err();
    assert_eq!(
        e.ze_result(),
        0x7800_0004, /* INVALID_ARGUMENT */
        "{e}"
    );
    assert!(e.message().contains("description"), "{e}");
    let handles = [range, ah, ph]
        .iter()
        .map(|h| hex(h.as_bytes()))
        .collect::<String>();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "ipc_between_two_processes_shares_gpu_memory",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(IPC_CHILD, handles)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the importer failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The importer's write through its view is in our memory.
    assert_eq!(read_back(&ctx, &rt, r.base + 2 * page, 64), [0x99; 64]);
    assert_eq!(read_back(&ctx, &rt, r.base + 2 * page + 64, 8), [0x23; 8]);
    for h in [range, ah, ph] {
        ctx.put_ipc_handle(&h).unwrap();
    }
    ctx.free_memory(alloc).unwrap();
    ctx.unmap(r.base, 4 * page).unwrap();
    ctx.destroy_physical_memory(big).unwrap();
    ctx.destroy_physical_memory(small).unwrap();
    ctx.free_reservation(r).unwrap();
}

/// The variable that makes a run of [`a_range_over_whole_allocations_shares_them_whole`] the
/// importer: hex of the handles' bytes (the range, then the physical object).
const IPC_WHOLE_CHILD: &str = "HETMEM_CUDA_IPC_WHOLE_CHILD";

/// The importer's side of [`a_range_over_whole_allocations_shares_them_whole`]: opens the
/// range (five pages over two objects, each one allocation) and checks the exporter's bytes,
/// writes into page 1; imports the physical object handle (three pages, sent as one
/// allocation), maps it whole and checks it, and is refused a map of one page of it.
fn ipc_whole_importer(handles: &str) {
    let rt = cuda("ipc whole importer").expect("the exporter found a GPU");
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device_ref(0).unwrap();
    let page = ctx.query_page_size(dev, 1).unwrap();
    let b = unhex(handles);
    let h = |i: usize| hetmem::IpcHandle::from_bytes(b[64 * i..64 * (i + 1)].try_into().unwrap());
    let view = ctx.open_ipc_handle(&h(0), 0).unwrap();
    for i in 0..5u8 {
        assert_eq!(
            read_back(&ctx, &rt, view + i as usize * page + page - 8, 8),
            [0x31 + i; 8],
            "range view page {i}"
        );
    }
    fill(&ctx, &rt, view + page, &[0x99], 64);
    ctx.close_ipc_handle(view).unwrap();
    let phys = ctx.import_physical_memory(&h(1), dev).unwrap();
    let r = ctx.reserve(None, 3 * page).unwrap();
    // A piece of an allocation received whole cannot be mapped alone.
    let e = ctx
        .map(r.base, page, phys, page, AccessAttribute::ReadWrite)
        .unwrap_err();
    assert!(matches!(e, Error::UnsupportedFeature(_)), "{e:?}");
    assert!(e.message().contains("imported whole"), "{e}");
    ctx.map(r.base, 3 * page, phys, 0, AccessAttribute::ReadWrite)
        .unwrap();
    assert_eq!(read_back(&ctx, &rt, r.base + 2 * page, 8), [0x33; 8]);
    ctx.unmap(r.base, 3 * page).unwrap();
    ctx.destroy_physical_memory(phys).unwrap();
    ctx.free_reservation(r).unwrap();
}

/// A range handle over physical objects each mapped whole sends each allocation whole (no
/// split into granules), and an allocation so shared is never split afterwards: a piece of it
/// can no longer be unmapped, protected or shared alone (`UnsupportedFeature`, nothing
/// changed), a physical object handle of it sends it whole, and the importer's writes land in
/// the exporter's memory (the two processes still share one allocation).
#[test]
fn a_range_over_whole_allocations_shares_them_whole() {
    if let Ok(handles) = std::env::var(IPC_WHOLE_CHILD) {
        ipc_whole_importer(&handles);
        return;
    }
    let Some(rt) = cuda("a range over whole allocations") else {
        return;
    };
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device_ref(0).unwrap();
    let page = ctx.query_page_size(dev, 1).unwrap();
    let r = ctx.reserve(None, 5 * page).unwrap();
    let a = ctx
        .create_physical_memory(Some(dev), PhysicalMemoryFlags::AllocateOnDevice, 3 * page)
        .unwrap();
    let b = ctx
        .create_physical_memory(Some(dev), PhysicalMemoryFlags::AllocateOnDevice, 2 * page)
        .unwrap();
    ctx.map(r.base, 3 * page, a, 0, AccessAttribute::ReadWrite)
        .unwrap();
    ctx.map(
        r.base + 3 * page,
        2 * page,
        b,
        0,
        AccessAttribute::ReadWrite,
    )
    .unwrap();
    for i in 0..5u8 {
        fill(&ctx, &rt, r.base + i as usize * page, &[0x31 + i], page);
    }
    let range = ctx
        .get_ipc_handle_with_properties(
            r.base,
            &hetmem::IpcProperties {
                range_size: Some(5 * page),
                ..Default::default()
            },
        )
        .unwrap();
    // `a` went whole: a piece of its mapping cannot be unmapped or protected any more, and a
    // range of a piece of it cannot be exported; nothing changed.
    let e = ctx.unmap(r.base + page, page).unwrap_err();
    assert!(matches!(e, Error::UnsupportedFeature(_)), "{e:?}");
    assert!(e.message().contains("shared whole"), "{e}");
    let e = ctx
        .set_access_attribute(r.base + page, page, AccessAttribute::ReadOnly)
        .unwrap_err();
    assert!(matches!(e, Error::UnsupportedFeature(_)), "{e:?}");
    let e = ctx
        .get_ipc_handle_with_properties(
            r.base + page,
            &hetmem::IpcProperties {
                range_size: Some(page),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(matches!(e, Error::UnsupportedFeature(_)), "{e:?}");
    for i in 0..5u8 {
        assert_eq!(
            read_back(&ctx, &rt, r.base + i as usize * page + page - 8, 8),
            [0x31 + i; 8],
            "page {i} after the refusals"
        );
    }
    // Its physical object handle sends it whole too (its importer maps only all of it).
    let ph = ctx.get_physical_memory_ipc_handle(a, None).unwrap();
    let handles = [range, ph]
        .iter()
        .map(|h| hex(h.as_bytes()))
        .collect::<String>();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_range_over_whole_allocations_shares_them_whole",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(IPC_WHOLE_CHILD, handles)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the importer failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The importer's write through its view is in our memory.
    assert_eq!(read_back(&ctx, &rt, r.base + page, 64), [0x99; 64]);
    assert_eq!(read_back(&ctx, &rt, r.base + page + 64, 8), [0x32; 8]);
    for h in [range, ph] {
        ctx.put_ipc_handle(&h).unwrap();
    }
    // Whole, everything still works.
    ctx.unmap(r.base, 5 * page).unwrap();
    ctx.destroy_physical_memory(a).unwrap();
    ctx.destroy_physical_memory(b).unwrap();
    ctx.free_reservation(r).unwrap();
}

/// ACL's host-synchronous `aclrtMemset` / `aclrtMemcpy` (`Context::host_memset` /
/// `host_memcpy`) on GPU memory the host cannot reach: the device fills and copies, from and to
/// plain (pageable) host memory; a side the driver does not know, or a READONLY page as the
/// destination, is refused with nothing written.
#[test]
fn host_synchronous_memset_and_memcpy_reach_device_memory_through_the_device() {
    let Some(rt) = cuda("host-synchronous memset and memcpy") else {
        return;
    };
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device_ref(0).unwrap();
    let page = ctx.query_page_size(dev, 1).unwrap();
    let d = ctx.alloc_device(dev, &AllocDesc::new(3 << 20)).unwrap();
    // SAFETY: device memory of this context; nothing else uses it.
    unsafe { ctx.host_memset(d, 0x5a, 3 << 20) }.unwrap();
    assert_eq!(read_back(&ctx, &rt, d + (3 << 20) - 8, 8), [0x5a; 8]);
    let src: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let mut back = vec![0u8; 4096];
    // SAFETY: `src` and `back` are ours; `d` is device memory of this context.
    unsafe {
        ctx.host_memcpy(d + 100, src.as_ptr() as usize, src.len())
            .unwrap();
        ctx.host_memcpy(back.as_mut_ptr() as usize, d + 100, back.len())
            .unwrap();
    }
    assert_eq!(back, src);
    // Device to device, both sides device memory.
    let e = ctx.alloc_device(dev, &AllocDesc::new(page)).unwrap();
    // SAFETY: as above.
    unsafe { ctx.host_memcpy(e, d + 100, 4096) }.unwrap();
    assert_eq!(read_back(&ctx, &rt, e, 4096), src);
    // Past the end of the allocation: refused, nothing written.
    // SAFETY: refused before anything runs.
    let err = unsafe { ctx.host_memset(e + page - 8, 1, 16) }.unwrap_err();
    assert!(err.message().contains("runs past"), "{err}");
    // A READONLY mapping as the destination: refused; as the source: copied.
    let r = ctx.reserve(None, page).unwrap();
    let phys = ctx
        .create_physical_memory(Some(dev), PhysicalMemoryFlags::AllocateOnDevice, page)
        .unwrap();
    ctx.map(r.base, page, phys, 0, AccessAttribute::ReadWrite)
        .unwrap();
    fill(&ctx, &rt, r.base, &[0x31], 64);
    ctx.set_access_attribute(r.base, page, AccessAttribute::ReadOnly)
        .unwrap();
    // SAFETY: refused before anything runs.
    let err = unsafe { ctx.host_memset(r.base, 9, 64) }.unwrap_err();
    assert!(err.message().contains("ReadOnly"), "{err}");
    assert_eq!(read_back(&ctx, &rt, r.base, 8), [0x31; 8]);
    let mut eight = [0u8; 8];
    // SAFETY: `eight` is ours; the source is a readable mapping of this context.
    unsafe { ctx.host_memcpy(eight.as_mut_ptr() as usize, r.base, 8) }.unwrap();
    assert_eq!(eight, [0x31; 8]);
    ctx.unmap(r.base, page).unwrap();
    ctx.destroy_physical_memory(phys).unwrap();
    ctx.free_reservation(r).unwrap();
    ctx.free_memory(e).unwrap();
    ctx.free_memory(d).unwrap();
}

/// ACL's host-synchronous `aclrtMemcpy` between managed memory and GPU memory the host cannot
/// reach (`Context::host_memcpy` with one managed side): the device copies, the managed pages
/// are then on the device in hetmem's record, and the bytes arrive both ways; a device side
/// past its allocation is refused with nothing copied.
#[test]
fn host_synchronous_memcpy_between_managed_and_device_memory_goes_through_the_device() {
    use hetmem::RangeAttribute;
    let Some(rt) = cuda("host-synchronous memcpy between managed and device memory") else {
        return;
    };
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device_ref(0).unwrap();
    let m = ctx.alloc_managed(2 << 20, 1).unwrap();
    let d = ctx.alloc_device(dev, &AllocDesc::new(2 << 20)).unwrap();
    // SAFETY: `m` is a live managed allocation of 2 MiB, host-accessible.
    let host = unsafe { std::slice::from_raw_parts_mut(m as *mut u8, 4096) };
    for (i, b) in host.iter_mut().enumerate() {
        *b = (i * 13) as u8;
    }
    let want: Vec<u8> = host.to_vec();
    // SAFETY: both are live allocations of this context, nothing else uses them.
    unsafe { ctx.host_memcpy(d + 64, m, 4096) }.unwrap();
    assert_eq!(read_back(&ctx, &rt, d + 64, 4096), want);
    fill(&ctx, &rt, d, &[0xc3], 4096);
    // SAFETY: as above.
    unsafe { ctx.host_memcpy(m + 8192, d, 4096) }.unwrap();
    assert_eq!(
        ctx.managed_attr_i32(RangeAttribute::LastPrefetchLocation, m, 2 << 20)
            .unwrap(),
        -2,
        "a copy is not a prefetch"
    );
    // SAFETY: `m` is live managed memory; the device copy has finished.
    let back = unsafe { std::slice::from_raw_parts((m + 8192) as *const u8, 4096) };
    assert!(back.iter().all(|&b| b == 0xc3));
    // A device side running past its allocation: refused, nothing copied.
    // SAFETY: refused before anything runs.
    let err = unsafe { ctx.host_memcpy(d + (2 << 20) - 8, m, 64) }.unwrap_err();
    assert!(err.message().contains("runs past"), "{err}");
    ctx.free_memory(d).unwrap();
    ctx.free_managed(m).unwrap();
}

/// Stream work (`Stream::launch`) on the cuda backend is a host function in stream order: it
/// sees what the device wrote before it, its writes are what the device reads after it, and
/// hetmem's record puts the pages it used on the host afterwards (the driver migrated them).
#[test]
fn launched_stream_work_runs_in_order_on_the_host_and_is_recorded_there() {
    use hetmem::Location;
    let Some(rt) = cuda("launched stream work") else {
        return;
    };
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device_ref(0).unwrap();
    let m = ctx.alloc_managed(4 << 20, 1).unwrap();
    let s = ctx.create_stream(dev).unwrap();
    ctx.mem_prefetch(m, 4 << 20, Location::Device(0), 0, &s)
        .unwrap();
    s.memset_async(m, 0x21, 4096).unwrap();
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicU8::new(0));
    let seen2 = seen.clone();
    s.launch(&[(m, 4096, true)], move |b| {
        // SAFETY: the buffer is 4096 bytes of live managed memory.
        let buf = unsafe { std::slice::from_raw_parts_mut(b[0].ptr, b[0].len) };
        seen2.store(buf[4095], std::sync::atomic::Ordering::SeqCst);
        buf[0] = 0x42;
    })
    .unwrap();
    s.synchronize().unwrap();
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 0x21);
    let r = ctx.managed_residency(m).unwrap();
    assert!(r.host && r.devices.is_empty(), "{r:?}");
    // The device's copy after it reads what it wrote.
    s.memcpy_async(m + (2 << 20), m, 8).unwrap();
    s.synchronize().unwrap();
    // SAFETY: live managed memory; the stream is idle.
    let copied = unsafe { std::slice::from_raw_parts((m + (2 << 20)) as *const u8, 8) };
    assert_eq!(copied, [0x42, 0x21, 0x21, 0x21, 0x21, 0x21, 0x21, 0x21]);
    ctx.free_managed(m).unwrap();
}

/// ACL's read-mostly rule on the GPU: a range advised read-mostly may then be given a device
/// as its preferred location (a read-only copy goes there), although its pages are on the host;
/// without read-mostly the same advice on host pages is refused with 107000.
#[test]
fn read_mostly_pages_take_a_device_preferred_location_and_others_on_the_host_do_not() {
    use hetmem::{Advice, Location};
    let Some(rt) = cuda("read-mostly and preferred location") else {
        return;
    };
    let ctx = rt.driver().create_context().unwrap();
    let m = ctx.alloc_managed(4 << 20, 1).unwrap();
    ctx.mem_advise(m, 2 << 20, Advice::SetReadMostly, Location::Host)
        .unwrap();
    ctx.mem_advise(
        m,
        2 << 20,
        Advice::SetPreferredLocation,
        Location::Device(0),
    )
    .unwrap();
    // The second page: put on the host, not read-mostly.
    ctx.mem_advise(
        m + (2 << 20),
        2 << 20,
        Advice::SetPreferredLocation,
        Location::Host,
    )
    .unwrap();
    let e = ctx
        .mem_advise(
            m + (2 << 20),
            2 << 20,
            Advice::SetPreferredLocation,
            Location::Device(0),
        )
        .unwrap_err();
    assert_eq!(e.acl_error(), 107000, "{e}");
    assert!(e.message().contains("mapped on the host"), "{e}");
    ctx.free_managed(m).unwrap();
}
