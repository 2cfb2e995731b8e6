//! OS limit: live mappings up to `vm.max_map_count`, then OUT_OF_HOST_MEMORY, never a crash.
//!
//! Every mapping is one VMA of the process and the kernel caps VMAs at `vm.max_map_count`. These
//! tests drive the process to that cap, so they take one lock and run one at a time, and nothing
//! else runs in this binary.

mod common;

/// Why this file runs on the host backend only.
const HOST_ONLY: &str =
    "these tests drive the process to vm.max_map_count, the kernel's cap on its VMAs: every \
     host-backend mapping is an mmap of a memfd, one VMA each; on cuda a map is cuMemMap into \
     the GPU's address space and makes no host VMA, so the limit they exercise does not exist \
     there";

use common::runtime_with;

use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use hetmem::platform::mapping_count;

fn max_map_count() -> Option<u64> {
    hetmem::platform::facts().max_map_count
}
use hetmem::{
    AccessAttribute, Context, Device, Error, PhysicalMemory, PhysicalMemoryFlags, Reservation,
};

/// Serialises the tests of this binary: each one exhausts the process-wide VMA limit.
static AT_THE_LIMIT: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    common::lock(&AT_THE_LIMIT)
}

struct Setup {
    ctx: Context,
    dev: Device,
    page: usize,
    max: usize,
}

fn setup() -> Setup {
    let rt = runtime_with(1, 64 << 20);
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
    s.ctx
        .reserve(None, size)
        .expect("reserve room for the limit")
}

/// The access of the `i`-th filler mapping: alternating, so that no two neighbours could ever
/// be merged into one VMA (they map offset 0 of one object, which already prevents merging).
fn filler_access(i: usize) -> AccessAttribute {
    match i % 2 {
        0 => AccessAttribute::ReadWrite,
        _ => AccessAttribute::ReadOnly,
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

/// Number of VMAs (lines of `/proc/self/maps`) that overlap `r`: exact, unlike the process
/// total, which moves whenever the test harness starts a thread.
fn vmas_in(r: Reservation) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    maps.lines()
        .filter(|l| {
            let range = l.split(' ').next().unwrap_or("");
            let (a, b) = range.split_once('-').expect("start-end");
            let a = usize::from_str_radix(a, 16).expect("hex");
            let b = usize::from_str_radix(b, 16).expect("hex");
            a < r.end() && b > r.base
        })
        .count()
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

/// A small reservation holding `SPARE_MAPPINGS` separate mappings (about twice as many VMAs):
/// freeing it at the limit gives VMAs back to the process.
fn spare(s: &Setup, phys: PhysicalMemory) -> Reservation {
    let r = s
        .ctx
        .reserve(None, 4 * SPARE_MAPPINGS * s.page)
        .expect("reserve spare");
    for i in 0..SPARE_MAPPINGS {
        s.ctx
            .map(
                r.base + 2 * i * s.page,
                s.page,
                phys,
                0,
                AccessAttribute::ReadWrite,
            )
            .expect("map spare");
    }
    r
}

const SPARE_MAPPINGS: usize = 16;

#[test]
fn mappings_up_to_vm_max_map_count_then_out_of_host_memory() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let _g = lock();
    let s = setup();
    let phys = s
        .ctx
        .create_physical_memory(Some(&s.dev), PhysicalMemoryFlags::AllocateOnDevice, s.page)
        .expect("create");
    let r = big_reservation(&s);
    assert_eq!(vmas_in(r), 1, "a new reservation is one placeholder VMA");
    let vmas_reserved = mapping_count();
    let spare = spare(&s, phys);

    let t = Instant::now();
    let (addrs, err) = fill(&s, r, r.base, phys);
    let fill_time = t.elapsed();
    let n = addrs.len();
    let vmas_at_limit = mapping_count();
    eprintln!(
        "vm.max_map_count {}; /proc/self/maps lines: {vmas_reserved} before, {vmas_at_limit} at \
         the limit; {n} live mappings (+{SPARE_MAPPINGS} spare) reached in {fill_time:?}; {err}",
        s.max
    );
    assert_names_map_limit(&err);
    assert!(
        n <= s.max && n + 1000 >= s.max,
        "live mappings {n} should be within 1,000 of vm.max_map_count {}",
        s.max
    );
    assert_eq!(
        s.ctx.driver().vm_stats().mapped_runs,
        n + SPARE_MAPPINGS,
        "one mapped run per map"
    );
    assert_eq!(
        vmas_in(r),
        n + 1,
        "one VMA per mapping, plus the placeholder left"
    );
    // The kernel counts every line of /proc/self/maps but [vsyscall]; it may let the count go
    // one past the cap (a map that splits a placeholder's end is not checked).
    assert!(
        vmas_at_limit + 8 >= s.max && vmas_at_limit <= s.max + 2,
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
    assert_eq!(s.ctx.driver().vm_stats().mapped_runs, n + SPARE_MAPPINGS);

    // Past the cap the kernel refuses every mmap, and unmap puts the placeholder back with
    // one; so an unmap may fail here too, and then it changes nothing.
    let last = addrs[n - 1];
    let unmap_at_limit = s.ctx.unmap(last, s.page);
    match &unmap_at_limit {
        Ok(()) => assert_eq!(
            s.ctx.get_access_attribute(last, s.page),
            Ok((AccessAttribute::None, s.page))
        ),
        Err(e) => {
            assert_names_map_limit(e);
            assert_eq!(
                s.ctx.get_access_attribute(last, s.page),
                Ok((filler_access(n - 1), s.page))
            );
        }
    }
    eprintln!("unmap of a whole mapping at the limit: {unmap_at_limit:?}");

    // Freeing needs no new VMA, so it works at the limit and makes room; then every mapping
    // can be unmapped, the placeholders merge back, and the limit can be reached again.
    s.ctx.free_reservation(spare).expect("free at the limit");
    for &a in &addrs {
        if s.ctx.get_access_attribute(a, s.page).expect("get").0 != AccessAttribute::None {
            s.ctx.unmap(a, s.page).expect("unmap below the limit");
        }
    }
    assert_eq!(
        s.ctx.get_access_attribute(r.base, r.size),
        Ok((AccessAttribute::None, r.size))
    );
    assert_eq!(s.ctx.driver().vm_stats().mapped_runs, 0);
    assert_eq!(
        vmas_in(r),
        1,
        "every VMA should be back: the placeholders merge into one"
    );
    let t = Instant::now();
    let (again, err) = fill(&s, r, r.base, phys);
    eprintln!(
        "second fill: {} live mappings in {:?}",
        again.len(),
        t.elapsed()
    );
    assert_names_map_limit(&err);
    assert!(
        again.len() + 8 >= n && again.len() <= n + 3 * SPARE_MAPPINGS,
        "the second fill reached {} mappings, the first {n} (+{SPARE_MAPPINGS} spare)",
        again.len()
    );
    check_fillers_read_and_write(&again);

    // Freeing the reservation at the limit unmaps everything; the object survives.
    s.ctx.free_reservation(r).expect("free at the limit");
    assert_eq!(s.ctx.driver().vm_stats().mapped_runs, 0);
    s.ctx.destroy_physical_memory(phys).expect("destroy");
    assert_eq!(s.dev.used_memory(), 0);
}

/// At the limit: a 3-page read-write mapping at the start of a reservation, a spare reservation
/// (to free room later), and fillers up to the cap.
struct AtLimit {
    r: Reservation,
    spare: Reservation,
    objs: [PhysicalMemory; 2],
    fillers: usize,
}

fn three_pages_then_limit(s: &Setup) -> AtLimit {
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
    let spare = spare(s, small);
    s.ctx
        .map(r.base, 3 * s.page, big, 0, AccessAttribute::ReadWrite)
        .expect("map 3 pages");
    let (addrs, err) = fill(s, r, r.base + 3 * s.page, small);
    assert_names_map_limit(&err);
    AtLimit {
        r,
        spare,
        objs: [big, small],
        fillers: addrs.len(),
    }
}

fn release(s: &Setup, l: AtLimit) {
    s.ctx.free_reservation(l.r).expect("free at the limit");
    for p in l.objs {
        s.ctx.destroy_physical_memory(p).expect("destroy");
    }
    assert_eq!(s.dev.used_memory(), 0);
    assert_eq!(s.ctx.driver().vm_stats().mapped_runs, 0);
}

fn write_read(addr: usize, v: u64) {
    // SAFETY: callers pass a page mapped read-write.
    unsafe { (addr as *mut u64).write_volatile(v) };
    // SAFETY: as above.
    assert_eq!(unsafe { (addr as *const u64).read_volatile() }, v);
}

#[test]
fn set_access_at_the_map_limit_fails_cleanly() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let _g = lock();
    let s = setup();
    let t = Instant::now();
    let l = three_pages_then_limit(&s);
    let (r, page) = (l.r, s.page);
    let mid = r.base + page;
    write_read(mid, 7);

    // Read-only on the middle page would split the VMA in three: no VMA is left for that.
    let err = s
        .ctx
        .set_access_attribute(mid, page, AccessAttribute::ReadOnly)
        .expect_err("a split at the limit");
    assert_names_map_limit(&err);
    assert_eq!(
        s.ctx.get_access_attribute(r.base, 3 * page),
        Ok((AccessAttribute::ReadWrite, 3 * page)),
        "a failed set-access changes nothing"
    );
    // Still writable in the kernel too (a write to a read-only page would kill the test).
    write_read(mid, 8);

    // A change of a whole VMA needs no new one, so it works at the limit.
    s.ctx
        .set_access_attribute(r.base, 3 * page, AccessAttribute::ReadOnly)
        .expect("whole-mapping set-access at the limit");
    assert_eq!(
        s.ctx.get_access_attribute(r.base, 4 * page),
        Ok((AccessAttribute::ReadOnly, 3 * page))
    );
    // SAFETY: read-only pages can be read.
    assert_eq!(unsafe { (mid as *const u64).read_volatile() }, 8);
    s.ctx
        .set_access_attribute(r.base, 3 * page, AccessAttribute::ReadWrite)
        .expect("and back");

    // With room made, the split works.
    s.ctx.free_reservation(l.spare).expect("free at the limit");
    s.ctx
        .set_access_attribute(mid, page, AccessAttribute::ReadOnly)
        .expect("the split fits now");
    assert_eq!(
        s.ctx.get_access_attribute(r.base, 3 * page),
        Ok((AccessAttribute::ReadWrite, page))
    );
    assert_eq!(
        s.ctx.get_access_attribute(mid, 2 * page),
        Ok((AccessAttribute::ReadOnly, page))
    );
    eprintln!(
        "{} filler mappings at the limit; test took {:?}",
        l.fillers,
        t.elapsed()
    );
    release(&s, l);
}

#[test]
fn unmap_at_the_map_limit_that_splits_a_vma_fails_cleanly() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let _g = lock();
    let s = setup();
    let t = Instant::now();
    let l = three_pages_then_limit(&s);
    let (r, page) = (l.r, s.page);
    let mid = r.base + page;

    // Unmapping the middle page puts a placeholder between two halves: no VMA is left for that.
    let err = s.ctx.unmap(mid, page).expect_err("a split at the limit");
    assert_names_map_limit(&err);
    assert_eq!(
        s.ctx.get_access_attribute(r.base, 3 * page),
        Ok((AccessAttribute::ReadWrite, 3 * page)),
        "a failed unmap changes nothing"
    );
    for p in 0..3 {
        write_read(r.base + p * page, p as u64 + 1);
    }

    // With room made, the split works.
    s.ctx.free_reservation(l.spare).expect("free at the limit");
    s.ctx.unmap(mid, page).expect("the split fits now");
    assert_eq!(
        s.ctx.get_access_attribute(r.base, 3 * page),
        Ok((AccessAttribute::ReadWrite, page))
    );
    assert_eq!(
        s.ctx.get_access_attribute(mid, 2 * page),
        Ok((AccessAttribute::None, page))
    );
    write_read(r.base + 2 * page, 3);
    eprintln!(
        "{} filler mappings at the limit; test took {:?}",
        l.fillers,
        t.elapsed()
    );
    release(&s, l);
}
