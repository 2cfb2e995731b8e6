//! OS limit: live mappings up to `vm.max_map_count`, then OUT_OF_HOST_MEMORY, never a crash.
//!
//! Every mapping is one VMA of the process and the kernel caps VMAs at `vm.max_map_count`. These
//! tests drive the process to that cap, so they take one lock and run one at a time, and nothing
//! else runs in this binary.

use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use hetmem::backend::host::{mapping_count, max_map_count};
use hetmem::{
    AccessAttribute, Context, Device, Error, PhysicalMemory, PhysicalMemoryFlags, Reservation,
    Runtime,
};

/// Serialises the tests of this binary: each one exhausts the process-wide VMA limit.
static AT_THE_LIMIT: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    AT_THE_LIMIT.lock().unwrap_or_else(|e| e.into_inner())
}

struct Setup {
    ctx: Context,
    dev: Device,
    page: usize,
    max: usize,
}

fn setup() -> Setup {
    let rt = Runtime::builder()
        .host_devices(1)
        .host_device_memory(64 << 20)
        .build()
        .expect("runtime");
    let dev = rt.driver().device(0).expect("device 0");
    let ctx = rt.driver().create_context().expect("context");
    let page = ctx.query_page_size(&dev, 1).expect("page size");
    assert_eq!(page, 64 << 10, "the base page of the host backend");
    let max = max_map_count().expect("/proc/sys/vm/max_map_count is readable") as usize;
    Setup {
        ctx,
        dev,
        page,
        max,
    }
}

/// A reservation with room for more mappings than the kernel allows.
fn big_reservation(s: &Setup) -> Reservation {
    let want = (s.max + 4096) * s.page;
    let align = s.ctx.query_page_size(&s.dev, want).expect("page size");
    let size = want.div_ceil(align) * align;
    s.ctx.reserve(None, size).expect("reserve room for the limit")
}

/// The access of the `i`-th filler mapping: alternating, so that no two neighbours could ever
/// be merged into one VMA (they map offset 0 of one object, which already prevents merging).
fn filler_access(i: usize) -> AccessAttribute {
    if i % 2 == 0 {
        AccessAttribute::ReadWrite
    } else {
        AccessAttribute::ReadOnly
    }
}

/// Maps page 0 of `phys` at consecutive pages from `from` until a map fails; returns the
/// addresses mapped and the error. The address list is allocated up front so that nothing
/// needs a new VMA for the heap once the limit is near.
fn fill(s: &Setup, r: Reservation, from: usize, phys: PhysicalMemory) -> (Vec<usize>, Error) {
    let mut addrs = Vec::with_capacity(s.max + 64);
    loop {
        let addr = from + addrs.len() * s.page;
        assert!(
            addr + s.page <= r.end(),
            "the reservation ran out before vm.max_map_count ({}) was reached",
            s.max
        );
        match s.ctx.map(addr, s.page, phys, 0, filler_access(addrs.len())) {
            Ok(()) => addrs.push(addr),
            Err(e) => return (addrs, e),
        }
    }
}

fn assert_names_map_limit(e: &Error) {
    assert!(
        matches!(e, Error::OutOfHostMemory(_)),
        "expected OutOfHostMemory at the mapping limit, got {e:?}"
    );
    assert!(
        e.message().contains("vm.max_map_count"),
        "the message should name vm.max_map_count: {e}"
    );
}

/// Writes a distinct value through every read-write filler and reads it back through it and
/// through its read-only neighbour (they alias the same physical page).
fn check_fillers_read_and_write(addrs: &[usize]) {
    for (i, &a) in addrs.iter().enumerate() {
        if filler_access(i) != AccessAttribute::ReadWrite {
            continue;
        }
        let v = 0x5eed_0000_0000_0000u64 | i as u64;
        // SAFETY: `a` is mapped read-write, page-aligned, and 64 KiB long.
        unsafe { (a as *mut u64).write_volatile(v) };
        // SAFETY: as above.
        assert_eq!(unsafe { (a as *const u64).read_volatile() }, v);
        if let Some(&b) = addrs.get(i + 1) {
            // SAFETY: `b` is mapped read-only onto the same physical page.
            assert_eq!(
                unsafe { (b as *const u64).read_volatile() },
                v,
                "alias {b:#x}"
            );
        }
    }
}

#[test]
fn mappings_up_to_vm_max_map_count_then_out_of_host_memory() {
    let _g = lock();
    let s = setup();
    let phys = s
        .ctx
        .create_physical_memory(Some(&s.dev), PhysicalMemoryFlags::AllocateOnDevice, s.page)
        .expect("create");
    let r = big_reservation(&s);
    let vmas_before = mapping_count();

    let t = Instant::now();
    let (addrs, err) = fill(&s, r, r.base, phys);
    let fill_time = t.elapsed();
    let n = addrs.len();
    let vmas_at_limit = mapping_count();
    eprintln!(
        "vm.max_map_count {}; process VMAs before {vmas_before}, at the limit {vmas_at_limit}; \
         {n} live mappings reached in {fill_time:?}; error: {err}",
        s.max
    );
    assert_names_map_limit(&err);
    assert!(
        n <= s.max && n + 1000 >= s.max,
        "live mappings {n} should be within 1,000 of vm.max_map_count {}",
        s.max
    );
    assert_eq!(s.ctx.driver().vm_stats().mapped_runs, n);
    assert!(
        vmas_at_limit + 8 >= s.max,
        "the process should be at the VMA limit: {vmas_at_limit} of {}",
        s.max
    );

    // The failed range stays reserved and inaccessible; every earlier mapping still works.
    let failed = r.base + n * s.page;
    assert_eq!(
        s.ctx.get_access_attribute(failed, s.page),
        Ok((AccessAttribute::None, s.page))
    );
    assert_eq!(
        s.ctx.get_access_attribute(r.base, 2 * s.page),
        Ok((AccessAttribute::ReadWrite, s.page))
    );
    check_fillers_read_and_write(&addrs);
    // Trying again fails the same way and changes nothing.
    let again = s
        .ctx
        .map(failed, s.page, phys, 0, filler_access(n))
        .expect_err("still at the limit");
    assert_names_map_limit(&again);
    assert_eq!(s.ctx.driver().vm_stats().mapped_runs, n);

    // Unmapping everything gives every VMA back, and the limit can be reached again.
    for &a in &addrs {
        s.ctx.unmap(a, s.page).expect("unmap at the limit");
    }
    assert_eq!(
        s.ctx.get_access_attribute(r.base, r.size),
        Ok((AccessAttribute::None, r.size))
    );
    assert_eq!(s.ctx.driver().vm_stats().mapped_runs, 0);
    assert_eq!(
        mapping_count(),
        vmas_before,
        "the placeholders should merge back into one VMA"
    );
    let (again, err) = fill(&s, r, r.base, phys);
    assert_names_map_limit(&err);
    assert!(
        again.len().abs_diff(n) <= 8,
        "the second fill reached {} mappings, the first {n}",
        again.len()
    );
    check_fillers_read_and_write(&again);

    // Freeing the reservation at the limit unmaps everything; the object survives.
    s.ctx.free_reservation(r).expect("free at the limit");
    assert_eq!(s.ctx.driver().vm_stats().mapped_runs, 0);
    s.ctx.destroy_physical_memory(phys).expect("destroy");
    assert_eq!(s.dev.used_memory(), 0);
}

/// Maps a 3-page object at the start of a reservation, then fills the rest up to the limit.
fn three_pages_then_limit(s: &Setup) -> (Reservation, PhysicalMemory, PhysicalMemory, Vec<usize>) {
    let big = s
        .ctx
        .create_physical_memory(
            Some(&s.dev),
            PhysicalMemoryFlags::AllocateOnDevice,
            3 * s.page,
        )
        .expect("create 3 pages");
    let small = s
        .ctx
        .create_physical_memory(Some(&s.dev), PhysicalMemoryFlags::AllocateOnDevice, s.page)
        .expect("create 1 page");
    let r = big_reservation(s);
    s.ctx
        .map(r.base, 3 * s.page, big, 0, AccessAttribute::ReadWrite)
        .expect("map 3 pages");
    let (addrs, err) = fill(s, r, r.base + 3 * s.page, small);
    assert_names_map_limit(&err);
    (r, big, small, addrs)
}

fn release(s: &Setup, r: Reservation, objs: &[PhysicalMemory]) {
    s.ctx.free_reservation(r).expect("free at the limit");
    for &p in objs {
        s.ctx.destroy_physical_memory(p).expect("destroy");
    }
    assert_eq!(s.dev.used_memory(), 0);
    assert_eq!(s.ctx.driver().vm_stats().mapped_runs, 0);
}

#[test]
fn set_access_at_the_map_limit_fails_cleanly() {
    let _g = lock();
    let s = setup();
    let t = Instant::now();
    let (r, big, small, addrs) = three_pages_then_limit(&s);
    let mid = r.base + s.page;
    // SAFETY: the middle page is mapped read-write.
    unsafe { (mid as *mut u64).write_volatile(7) };

    // Read-only on the middle page would split the VMA in three: no VMA is left for that.
    let err = s
        .ctx
        .set_access_attribute(mid, s.page, AccessAttribute::ReadOnly)
        .expect_err("a split at the limit");
    assert_names_map_limit(&err);
    assert_eq!(
        s.ctx.get_access_attribute(r.base, 3 * s.page),
        Ok((AccessAttribute::ReadWrite, 3 * s.page)),
        "a failed set-access changes nothing"
    );
    // Still writable in the kernel too (a write to a read-only page would kill the test).
    // SAFETY: the middle page is mapped read-write.
    unsafe { (mid as *mut u64).write_volatile(8) };
    // SAFETY: as above.
    assert_eq!(unsafe { (mid as *const u64).read_volatile() }, 8);

    // A change of a whole VMA needs no new one, so it still works at the limit.
    s.ctx
        .set_access_attribute(r.base, 3 * s.page, AccessAttribute::ReadOnly)
        .expect("whole-mapping set-access at the limit");
    assert_eq!(
        s.ctx.get_access_attribute(r.base, 4 * s.page),
        Ok((AccessAttribute::ReadOnly, 3 * s.page))
    );
    // SAFETY: read-only pages can be read.
    assert_eq!(unsafe { (mid as *const u64).read_volatile() }, 8);
    eprintln!(
        "{} filler mappings at the limit; test took {:?}",
        addrs.len(),
        t.elapsed()
    );
    release(&s, r, &[big, small]);
}

#[test]
fn unmap_at_the_map_limit_that_splits_a_vma_fails_cleanly() {
    let _g = lock();
    let s = setup();
    let t = Instant::now();
    let (r, big, small, addrs) = three_pages_then_limit(&s);
    let mid = r.base + s.page;

    // Unmapping the middle page puts a placeholder between two halves: one VMA too many.
    let err = s.ctx.unmap(mid, s.page).expect_err("a split at the limit");
    assert_names_map_limit(&err);
    assert_eq!(
        s.ctx.get_access_attribute(r.base, 3 * s.page),
        Ok((AccessAttribute::ReadWrite, 3 * s.page)),
        "a failed unmap changes nothing"
    );
    for p in 0..3 {
        let a = r.base + p * s.page;
        // SAFETY: the three pages are still mapped read-write.
        unsafe { (a as *mut u64).write_volatile(p as u64 + 1) };
        // SAFETY: as above.
        assert_eq!(unsafe { (a as *const u64).read_volatile() }, p as u64 + 1);
    }
    // Unmapping a whole filler needs no new VMA, and frees room for the split.
    let last = *addrs.last().expect("fillers");
    s.ctx.unmap(last, s.page).expect("unmap a whole mapping");
    s.ctx.unmap(mid, s.page).expect("the split fits now");
    assert_eq!(
        s.ctx.get_access_attribute(r.base, 3 * s.page),
        Ok((AccessAttribute::ReadWrite, s.page))
    );
    assert_eq!(
        s.ctx.get_access_attribute(mid, 2 * s.page),
        Ok((AccessAttribute::None, s.page))
    );
    eprintln!(
        "{} filler mappings at the limit; test took {:?}",
        addrs.len(),
        t.elapsed()
    );
    release(&s, r, &[big, small]);
}
