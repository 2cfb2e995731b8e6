//! One test per rule of Level Zero virtual memory on the host backend (issue 2, section "Level
//! Zero virtual memory"; spec `shared/spec/level-zero-virtual-mem.txt`, result codes from
//! `shared/spec/level-zero-facts.md`).
//!
//! Every test builds its own small runtime (one device of a few MiB) so tests are fast and
//! independent. Rules that push the process to an OS limit (open files, `vm.max_map_count`) or
//! must see every fd and mapping of the process run in a child process: this test binary runs
//! itself again with `HETMEM_CHILD_CASE` set and only `child_case_runner` selected.

mod common;

use common::ze::{
    HANDLE_OBJECT_IN_USE, INVALID_ARGUMENT, INVALID_ENUMERATION, INVALID_NULL_HANDLE,
    INVALID_NULL_POINTER, OUT_OF_DEVICE_MEMORY, OUT_OF_HOST_MEMORY, UNSUPPORTED_ALIGNMENT,
    UNSUPPORTED_SIZE,
};

use hetmem::{
    AccessAttribute, Context, Device, Error, PhysicalMemory, PhysicalMemoryFlags, Reservation,
    Runtime, VmStats,
};

const MIB: usize = 1 << 20;
const TIB: usize = 1 << 40;

use AccessAttribute::{None as NONE, ReadOnly as RO, ReadWrite as RW};

/// Asserts that `$call` failed with `Error::$variant` carrying a message; yields the message.
macro_rules! assert_err {
    ($call:expr, $variant:ident) => {
        match $call {
            Err(Error::$variant(m)) => {
                assert!(!m.is_empty(), "{} has no message", stringify!($variant));
                m
            }
            other => panic!(
                "{}: expected {}, got {:?}",
                stringify!($call),
                stringify!($variant),
                other
            ),
        }
    };
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A runtime, its first device and a context.
struct Env {
    rt: Runtime,
    dev: Device,
    ctx: Context,
}

/// One device of `capacity` bytes.
fn env(capacity: usize) -> Env {
    env_with_devices(1, capacity)
}

fn env_with_devices(devices: u32, capacity: usize) -> Env {
    let rt = common::runtime_with(devices, capacity as u64);
    let dev = rt.driver().device(0).expect("device 0");
    let ctx = rt.driver().create_context().expect("context");
    Env { rt, dev, ctx }
}

impl Env {
    /// The base page, `query_page_size(1)`: the unit of unmap and the access calls.
    fn page(&self) -> usize {
        self.page_for(1)
    }
    fn page_for(&self, size: usize) -> usize {
        self.ctx
            .query_page_size(&self.dev, size)
            .expect("page size")
    }
    fn phys(&self, size: usize) -> PhysicalMemory {
        self.ctx
            .create_physical_memory(Some(&self.dev), PhysicalMemoryFlags::AllocateOnDevice, size)
            .expect("physical memory")
    }
    fn reserve(&self, size: usize) -> Reservation {
        self.ctx.reserve(None, size).expect("reserve")
    }
    fn stats(&self) -> VmStats {
        self.rt.driver().vm_stats()
    }
    /// The word at `a` as the device sees it (a copy on cuda).
    fn read(&self, a: usize) -> u64 {
        common::dev_read(&self.ctx, a)
    }
    /// Writes the word at `a` as the device would (a copy on cuda).
    fn write(&self, a: usize, v: u64) {
        common::dev_write(&self.ctx, a, v)
    }
    /// Attribute of every base page of `r`.
    fn attrs(&self, r: Reservation) -> Vec<AccessAttribute> {
        let p = self.page();
        (r.base..r.end())
            .step_by(p)
            .map(|a| self.ctx.get_access_attribute(a, p).expect("get access").0)
            .collect()
    }
}

use common::{read, write};
use hetmem::BackendKind::Cuda;

/// Whether the device has two page sizes, as on the host backend (64 KiB base pages, 2 MiB pages
/// for sizes from 2 MiB); false, after a loud part-not-applicable line, where it has one (cuda:
/// the driver's granularity, 2 MiB, for every size), so the checks of the second page size do
/// not exist there.
fn two_page_sizes(e: &Env) -> bool {
    e.page_for(2 * MIB) != e.page()
        || !common::part_not_applicable_on(
            Cuda,
            "the checks of a second, larger page size: cuda has one page size (the driver's \
             granularity) for every size",
        )
}

fn os_page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

fn align_up(v: usize, a: usize) -> usize {
    (v + a - 1) & !(a - 1)
}

/// `mmap(MAP_PRIVATE | MAP_ANONYMOUS)` of `len` bytes with `prot`, wherever the kernel likes.
fn mmap_anon(len: usize, prot: i32) -> usize {
    // SAFETY: a fresh anonymous mapping that nothing else refers to.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(
        p,
        libc::MAP_FAILED,
        "mmap: {}",
        std::io::Error::last_os_error()
    );
    p as usize
}

fn munmap(addr: usize, len: usize) {
    // SAFETY: callers unmap only mappings they made themselves.
    let rc = unsafe { libc::munmap(addr as *mut libc::c_void, len) };
    assert_eq!(rc, 0, "munmap: {}", std::io::Error::last_os_error());
}

/// An `align`-aligned address whose `len` bytes were free a moment ago.
fn free_window(ctx: &Context, len: usize, align: usize) -> usize {
    if common::on_cuda() {
        // The GPU driver's address space, not the process's mmap space: a range it handed out
        // and took back.
        let r = ctx
            .reserve(None, (len + align).next_multiple_of(common::page(ctx)))
            .unwrap();
        let base = r.base;
        ctx.free_reservation(r).unwrap();
        return align_up(base, align);
    }
    let p = mmap_anon(len + align, libc::PROT_NONE);
    munmap(p, len + align);
    align_up(p, align)
}

/// Whether `[addr, addr+len)` is free now: on the host claimed with `MAP_FIXED_NOREPLACE`,
/// then released; on cuda reserved with `addr` as the hint (the driver gives it only if free),
/// then freed.
fn range_is_free(ctx: &Context, addr: usize, len: usize) -> bool {
    if common::on_cuda() {
        return match ctx.reserve(Some(addr), len) {
            Ok(r) => {
                let at = r.base;
                ctx.free_reservation(r).unwrap();
                at == addr
            }
            Err(_) => false,
        };
    }
    // SAFETY: FIXED_NOREPLACE never replaces an existing mapping.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return false;
    }
    munmap(p as usize, len);
    p as usize == addr
}

/// One line of `/proc/self/maps`.
#[derive(Debug, Clone)]
struct MapLine {
    start: usize,
    end: usize,
    perms: String,
    path: String,
}

fn read_maps() -> Vec<MapLine> {
    let text = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    text.lines()
        .filter_map(|line| {
            let mut it = line.split_whitespace();
            let (s, e) = it.next()?.split_once('-')?;
            let perms = it.next()?.to_string();
            let path = it.skip(3).collect::<Vec<_>>().join(" ");
            Some(MapLine {
                start: usize::from_str_radix(s, 16).ok()?,
                end: usize::from_str_radix(e, 16).ok()?,
                perms,
                path,
            })
        })
        .collect()
}

fn line_at(maps: &[MapLine], addr: usize) -> Option<MapLine> {
    maps.iter()
        .find(|m| m.start <= addr && addr < m.end)
        .cloned()
}

/// The `/proc/self/maps` line covering `addr`.
fn mapping_at(addr: usize) -> Option<MapLine> {
    line_at(&read_maps(), addr)
}

/// Permissions (`rw-s`, `---p`, ...) of `addr` in `/proc/self/maps`.
fn perms_at(addr: usize) -> String {
    mapping_at(addr).map_or_else(|| "unmapped".to_string(), |m| m.perms)
}

/// Runs `child_case_runner` of this test binary in a new process with `HETMEM_CHILD_CASE=case`
/// and asserts that it ran the case to the end.
fn run_child(case: &str) -> String {
    let out = common::run_test_in_child("child_case_runner", &[(common::CHILD_CASE, case)]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(&format!("CHILD_OK {case}")),
        "child case {case} failed: {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stdout
}

/// The child side of the tests that need a process of their own; does nothing unless
/// `HETMEM_CHILD_CASE` is set.
#[test]
fn child_case_runner() {
    if common::skip() {
        return;
    }
    let Some(case) = common::child_case() else {
        return;
    };
    match case.as_str() {
        "sealed" => child_sealed(),
        "nofile" => child_nofile(),
        "max_map_count" => child_max_map_count(),
        "context_drop" => child_context_drop(),
        "fsize" => child_fsize(),
        other => panic!("unknown child case {other:?}"),
    }
    println!("CHILD_OK {case}");
}

// ---------------------------------------------------------------------------------------------
// zeVirtualMemReserve
// ---------------------------------------------------------------------------------------------

#[test]
fn reserve_size_zero_is_unsupported_size() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let err = e.ctx.reserve(None, 0).unwrap_err();
    assert!(matches!(err, Error::UnsupportedSize(_)), "{err:?}");
    assert_eq!(err.ze_result(), UNSUPPORTED_SIZE);
    assert_err!(
        e.ctx.reserve(Some(free_window(&e.ctx, MIB, MIB)), 0),
        UnsupportedSize
    );
    assert_eq!(e.stats().reservations, 0);
}

#[test]
fn reserve_unaligned_size_is_unsupported_size() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let big = e.page_for(2 * MIB);
    let mut sizes = vec![1, os_page(), p + os_page(), 3 * p - 1, 3 * MIB];
    if two_page_sizes(&e) {
        sizes.push(big + p);
    }
    for size in sizes {
        assert_err!(e.ctx.reserve(None, size), UnsupportedSize);
    }
    assert_eq!(e.stats().reservations, 0);
}

#[test]
fn reserve_is_aligned_to_the_page_size_of_its_size() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    for size in [e.page(), 3 * e.page(), 2 * MIB, 6 * MIB] {
        let r = e.reserve(size);
        assert_eq!(r.size, size);
        assert_eq!(r.base % e.page_for(size), 0, "{r:?}");
        e.ctx.free_reservation(r).unwrap();
    }
}

#[test]
fn reserve_hint_is_honoured_when_free() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    for size in [4 * e.page(), 2 * e.page_for(2 * MIB)] {
        let align = e.page_for(size);
        let mut honoured = false;
        // Another thread of this process may take the window between our look and the call;
        // only then is another address acceptable, so retry.
        for _ in 0..20 {
            let hint = free_window(&e.ctx, size, align);
            let r = e.ctx.reserve(Some(hint), size).unwrap();
            if r.base == hint {
                assert_eq!(r.size, size);
                if common::kernel_maps_apply() {
                    assert_eq!(perms_at(hint), "---p");
                    assert_eq!(perms_at(hint + size - 1), "---p");
                }
                e.ctx.free_reservation(r).unwrap();
                honoured = true;
                break;
            }
            e.ctx.free_reservation(r).unwrap();
            assert!(
                !range_is_free(&e.ctx, hint, size),
                "hint {hint:#x} (size {size:#x}) was free but reserve chose {:#x}",
                r.base
            );
        }
        assert!(honoured, "the hint was never honoured in 20 tries");
    }
}

#[test]
fn reserve_hint_never_clobbers_an_existing_mapping() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let len = 16 * p;
    // Our own read-write mapping, page-aligned for the library's page so the hint is usable.
    let region = mmap_anon(len + p, libc::PROT_READ | libc::PROT_WRITE);
    let start = align_up(region, p);
    let tags: Vec<usize> = (start..start + len).step_by(os_page()).collect();
    for (i, &a) in tags.iter().enumerate() {
        write(a, 0xC0FF_EE00 + i as u64);
        write(a + os_page() - 8, !(i as u64));
    }
    let size = 4 * p;
    // Inside our mapping, at its start, and partly past its end.
    for hint in [start, start + 4 * p, start + len - 2 * p] {
        let r = e.ctx.reserve(Some(hint), size).unwrap();
        assert_ne!(
            r.base, hint,
            "reserve took a hint that overlaps a live mapping"
        );
        assert!(
            r.end() <= region || r.base >= region + len + p,
            "reservation {r:?} overlaps our mapping [{region:#x}, {:#x})",
            region + len + p
        );
        assert_eq!(
            e.ctx.get_access_attribute(r.base, size).unwrap(),
            (NONE, size)
        );
        e.ctx.free_reservation(r).unwrap();
    }
    assert_eq!(perms_at(start), "rw-p");
    for (i, &a) in tags.iter().enumerate() {
        assert_eq!(
            read(a),
            0xC0FF_EE00 + i as u64,
            "our mapping changed at {a:#x}"
        );
        assert_eq!(read(a + os_page() - 8), !(i as u64));
    }
    write(start, 7);
    assert_eq!(read(start), 7);
    munmap(region, len + p);
}

#[test]
fn reserve_unaligned_hint_gives_an_aligned_reservation() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let size = 4 * e.page();
    let hint = free_window(&e.ctx, 2 * size, e.page()) + os_page();
    let r = e.ctx.reserve(Some(hint), size).unwrap();
    assert_eq!(r.base % e.page(), 0, "{r:?}");
    assert_eq!(r.size, size);
    e.ctx.free_reservation(r).unwrap();
}

#[test]
fn new_reservation_is_inaccessible() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    for size in [4 * e.page(), 4 * MIB] {
        let r = e.reserve(size);
        assert_eq!(
            e.ctx.get_access_attribute(r.base, size).unwrap(),
            (NONE, size)
        );
        assert!(e.attrs(r).iter().all(|&a| a == NONE));
        // The kernel agrees: no access at all, private placeholder.
        if common::kernel_maps_apply() {
            for a in [r.base, r.base + size / 2, r.end() - 1] {
                assert_eq!(perms_at(a), "---p", "at {a:#x}");
            }
        }
        e.ctx.free_reservation(r).unwrap();
    }
}

#[test]
fn reservations_reach_64_tib() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let rs: Vec<Reservation> = (0..64)
        .map(|i| {
            e.ctx
                .reserve(None, TIB)
                .unwrap_or_else(|err| panic!("reservation {i} of 1 TiB: {err}"))
        })
        .collect();
    let s = e.stats();
    assert_eq!(s.reservations, 64);
    assert_eq!(s.reserved_bytes, 64 * TIB);
    // They are usable: map a page at the far end of the last one.
    let p = e.page();
    let last = rs[63];
    let ph = e.phys(p);
    e.ctx.map(last.end() - p, p, ph, 0, RW).unwrap();
    e.write(last.end() - 8, 64);
    assert_eq!(e.read(last.end() - 8), 64);
    for r in rs {
        e.ctx.free_reservation(r).unwrap();
    }
    e.ctx.destroy_physical_memory(ph).unwrap();
    assert_eq!(e.stats().reserved_bytes, 0);
}

#[test]
fn reserve_beyond_the_address_space_is_out_of_host_memory() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let before = e.stats();
    // 1 PiB is more than a 47-bit (128 TiB) user address space.
    let m = assert_err!(e.ctx.reserve(None, 1 << 50), OutOfHostMemory);
    assert!(
        m.contains("address space"),
        "message does not name the limit: {m}"
    );
    assert_eq!(e.stats(), before);
}

// ---------------------------------------------------------------------------------------------
// zeVirtualMemFree
// ---------------------------------------------------------------------------------------------

#[test]
fn free_needs_exact_base_and_size() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let r = e.reserve(4 * p);
    let other = free_window(&e.ctx, 4 * p, p);
    for (ptr, size) in [
        (r.base, r.size - p),
        (r.base, r.size + p),
        (r.base + p, r.size - p),
        (r.base + p, r.size),
        (r.base + 1, r.size),
        (r.base, r.size + 1),
        (other, 4 * p),
    ] {
        let err = e.ctx.free(ptr, size).unwrap_err();
        assert_eq!(
            err.ze_result(),
            INVALID_ARGUMENT,
            "free({ptr:#x}, {size:#x}): {err}"
        );
        assert_eq!(e.stats().reservations, 1);
    }
    if common::kernel_maps_apply() {
        assert_eq!(perms_at(r.base), "---p");
    }
    e.ctx.free(r.base, r.size).unwrap();
    assert_eq!(e.stats().reservations, 0);
    // Twice is no longer a live reservation.
    assert_err!(e.ctx.free(r.base, r.size), InvalidArgument);
}

#[test]
fn free_null_is_invalid_null_pointer_and_size_zero_is_unsupported_size() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let r = e.reserve(e.page());
    assert_err!(e.ctx.free(0, r.size), InvalidNullPointer);
    assert_err!(e.ctx.free(r.base, 0), UnsupportedSize);
    assert_eq!(e.stats().reservations, 1);
    e.ctx.free_reservation(r).unwrap();
}

#[test]
fn free_unmaps_but_physical_objects_survive() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let r = e.reserve(4 * p);
    let ph = e.phys(2 * p);
    e.ctx.map(r.base, 2 * p, ph, 0, RW).unwrap();
    e.ctx.map(r.base + 2 * p, 2 * p, ph, 0, RO).unwrap();
    e.write(r.base, 0x1111);
    e.write(r.base + p + 8, 0x2222);
    let used = e.dev.used_memory();
    e.ctx.free_reservation(r).unwrap();
    let s = e.stats();
    assert_eq!(
        (s.reservations, s.mapped_runs, s.mapped_bytes),
        (0, 0, 0),
        "{s:?}"
    );
    assert_eq!(s.physical_objects, 1);
    assert_eq!(e.dev.used_memory(), used);
    if common::kernel_maps_apply() {
        assert_ne!(perms_at(r.base), "rw-s", "the mapping is still there");
    }
    assert_err!(e.ctx.get_access_attribute(r.base, p), InvalidArgument);
    // The object kept its contents: map it elsewhere and read.
    let r2 = e.reserve(2 * p);
    e.ctx.map(r2.base, 2 * p, ph, 0, RO).unwrap();
    assert_eq!(e.read(r2.base), 0x1111);
    assert_eq!(e.read(r2.base + p + 8), 0x2222);
    e.ctx.unmap(r2.base, 2 * p).unwrap();
    e.ctx.destroy_physical_memory(ph).unwrap();
    e.ctx.free_reservation(r2).unwrap();
    assert_eq!(e.dev.used_memory(), 0);
}

#[test]
fn free_unmaps_only_inside_its_reservation() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let (a, b) = adjacent_reservations(&e, 2 * p);
    let ph = e.phys(4 * p);
    // Contiguous offsets of one object with one access across the boundary: the bookkeeping
    // may see one run, but freeing `a` must leave `b`'s pages mapped.
    e.ctx.map(a.base, 2 * p, ph, 0, RW).unwrap();
    e.ctx.map(b.base, 2 * p, ph, 2 * p, RW).unwrap();
    e.write(b.base, 0xB0B);
    e.ctx.free_reservation(a).unwrap();
    assert_eq!(e.attrs(b), vec![RW, RW]);
    if common::kernel_maps_apply() {
        assert_eq!(perms_at(b.base), "rw-s", "freeing a unmapped b's page");
    }
    assert_eq!(e.read(b.base), 0xB0B);
    let s = e.stats();
    assert_eq!((s.reservations, s.mapped_bytes), (1, 2 * p));
    assert_err!(e.ctx.destroy_physical_memory(ph), HandleObjectInUse);
    e.ctx.unmap(b.base, 2 * p).unwrap();
    e.ctx.destroy_physical_memory(ph).unwrap();
    e.ctx.free_reservation(b).unwrap();
}

// ---------------------------------------------------------------------------------------------
// zeVirtualMemQueryPageSize
// ---------------------------------------------------------------------------------------------

#[test]
fn page_size_is_64k_below_2m_and_2m_from_2m_and_a_multiple_of_os_page() {
    if common::not_applicable_on(Cuda, "the host backend's two page sizes (64 KiB below 2 MiB, 2 MiB from 2 MiB); cuda's page size is the driver's granularity for every size (cuda_backend.rs checks it)") || common::skip() {
        return;
    }
    let e = env_with_devices(2, 16 * MIB);
    for dev in e.rt.driver().devices() {
        for size in [1, os_page(), 64 << 10, (64 << 10) + 1, MIB, 2 * MIB - 1] {
            let page = e.ctx.query_page_size(&dev, size).unwrap();
            assert_eq!(page, 64 << 10, "size {size:#x}");
            assert_eq!(page % os_page(), 0);
        }
        for size in [2 * MIB, 2 * MIB + 1, 3 * MIB, 1 << 30, TIB, usize::MAX] {
            let page = e.ctx.query_page_size(&dev, size).unwrap();
            assert_eq!(page, 2 * MIB, "size {size:#x}");
            assert_eq!(page % os_page(), 0);
        }
    }
}

/// Case 3 of `shared/cases/level-zero.md` (the reference driver's answer; the header lists
/// `UNSUPPORTED_SIZE`): size 0 answers the page size of the smallest allocation.
#[test]
fn page_size_of_size_zero_is_the_smallest_allocations_page_size() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let smallest = e.ctx.query_page_size(&e.dev, 1).unwrap();
    assert_eq!(e.ctx.query_page_size(&e.dev, 0).unwrap(), smallest);
    assert_eq!(smallest, e.page());
}

#[test]
fn device_of_another_driver_is_invalid_null_handle() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let foreign = env(16 * MIB);
    assert_err!(e.ctx.query_page_size(&foreign.dev, 1), InvalidNullHandle);
    assert_err!(
        e.ctx.create_physical_memory(
            Some(&foreign.dev),
            PhysicalMemoryFlags::AllocateOnDevice,
            e.page()
        ),
        InvalidNullHandle
    );
    assert_eq!(foreign.dev.used_memory(), 0);
    assert_eq!(e.dev.used_memory(), 0);
}

// ---------------------------------------------------------------------------------------------
// zePhysicalMemCreate / zePhysicalMemDestroy
// ---------------------------------------------------------------------------------------------

#[test]
fn physical_size_must_be_page_multiple() {
    if common::skip() {
        return;
    }
    let e = env(32 * MIB);
    let p = e.page();
    let big = e.page_for(2 * MIB);
    for flags in [
        PhysicalMemoryFlags::AllocateOnDevice,
        PhysicalMemoryFlags::AllocateOnHost,
    ] {
        let mut bad = vec![0, 1, os_page(), p + os_page(), 3 * p - 1, 3 * MIB];
        let mut good = vec![p, 3 * p, 2 * MIB, 4 * MIB];
        if two_page_sizes(&e) {
            bad.push(big + p);
            good.push(2 * MIB - p);
        }
        for size in bad {
            let err = e
                .ctx
                .create_physical_memory(Some(&e.dev), flags, size)
                .unwrap_err();
            assert_eq!(
                err.ze_result(),
                UNSUPPORTED_SIZE,
                "{flags:?} size {size:#x}"
            );
        }
        assert_eq!(e.stats().physical_objects, 0);
        for size in good {
            let ph = e
                .ctx
                .create_physical_memory(Some(&e.dev), flags, size)
                .unwrap();
            assert_eq!(ph.size, size);
            e.ctx.destroy_physical_memory(ph).unwrap();
        }
    }
}

#[test]
fn physical_beyond_capacity_is_out_of_device_memory() {
    if common::not_applicable_on(Cuda, "models a device of 8 MiB and fills it exactly; a GPU's room is its free memory (tens of GiB), which is not exhausted here (cuda_backend.rs checks running out)") || common::skip() {
        return;
    }
    let e = env(8 * MIB);
    assert_eq!(e.dev.info().capacity, 8 * MIB as u64);
    assert_eq!(e.dev.used_memory(), 0);
    let a = e.phys(4 * MIB);
    assert_eq!(e.dev.used_memory(), 4 * MIB as u64);
    let b = e.phys(2 * MIB);
    assert_eq!(e.dev.used_memory(), 6 * MIB as u64);
    let before = e.stats();
    let err = e
        .ctx
        .create_physical_memory(Some(&e.dev), PhysicalMemoryFlags::AllocateOnDevice, 4 * MIB)
        .unwrap_err();
    assert!(matches!(err, Error::OutOfDeviceMemory(_)), "{err:?}");
    assert_eq!(err.ze_result(), OUT_OF_DEVICE_MEMORY);
    assert_eq!(e.stats(), before);
    assert_eq!(e.dev.used_memory(), 6 * MIB as u64);
    // Exactly the rest fits, then nothing more.
    let c = e.phys(2 * MIB);
    assert_eq!(e.dev.used_memory(), 8 * MIB as u64);
    assert_err!(
        e.ctx.create_physical_memory(
            Some(&e.dev),
            PhysicalMemoryFlags::AllocateOnDevice,
            e.page()
        ),
        OutOfDeviceMemory
    );
    assert_eq!(e.stats().devices[0].used, 8 * MIB as u64);
    // Destroy gives the capacity back.
    e.ctx.destroy_physical_memory(b).unwrap();
    assert_eq!(e.dev.used_memory(), 6 * MIB as u64);
    let d = e.phys(2 * MIB);
    for ph in [a, c, d] {
        e.ctx.destroy_physical_memory(ph).unwrap();
    }
    assert_eq!(e.dev.used_memory(), 0);
}

#[test]
fn physical_capacity_is_per_device() {
    if common::not_applicable_on(Cuda, "models two devices of 4 MiB each and fills them; a GPU's room is its free memory, which is not exhausted here") || common::skip() {
        return;
    }
    let e = env_with_devices(2, 4 * MIB);
    let devs = e.rt.driver().devices();
    let on = |d: &Device, size| {
        e.ctx
            .create_physical_memory(Some(d), PhysicalMemoryFlags::AllocateOnDevice, size)
    };
    let a = on(&devs[0], 4 * MIB).unwrap();
    assert_err!(on(&devs[0], 2 * MIB), OutOfDeviceMemory);
    let b = on(&devs[1], 4 * MIB).unwrap();
    assert_eq!(devs[0].used_memory(), 4 * MIB as u64);
    assert_eq!(devs[1].used_memory(), 4 * MIB as u64);
    e.ctx.destroy_physical_memory(a).unwrap();
    assert_eq!(devs[0].used_memory(), 0);
    assert_eq!(devs[1].used_memory(), 4 * MIB as u64);
    e.ctx.destroy_physical_memory(b).unwrap();
}

#[test]
fn physical_on_host_needs_no_device_and_uses_no_device_capacity() {
    if common::skip() {
        return;
    }
    let e = env(4 * MIB);
    let full = e.phys(4 * MIB);
    let h = e
        .ctx
        .create_physical_memory(None, PhysicalMemoryFlags::AllocateOnHost, 4 * MIB)
        .unwrap();
    let h2 = e
        .ctx
        .create_physical_memory(Some(&e.dev), PhysicalMemoryFlags::AllocateOnHost, 2 * MIB)
        .unwrap();
    assert_eq!(e.dev.used_memory(), 4 * MIB as u64);
    assert_eq!(e.stats().host_physical_bytes, 6 * MIB as u64);
    // Host memory maps like any other.
    let r = e.reserve(4 * MIB);
    e.ctx.map(r.base, 4 * MIB, h, 0, RW).unwrap();
    e.write(r.end() - 8, 99);
    assert_eq!(e.read(r.end() - 8), 99);
    e.ctx.free_reservation(r).unwrap();
    for ph in [full, h, h2] {
        e.ctx.destroy_physical_memory(ph).unwrap();
    }
    assert_eq!(e.stats().host_physical_bytes, 0);
    assert_eq!(e.dev.used_memory(), 0);
}

#[test]
fn physical_on_device_without_a_device_is_invalid_null_handle() {
    if common::skip() {
        return;
    }
    let e = env(4 * MIB);
    let err = e
        .ctx
        .create_physical_memory(None, PhysicalMemoryFlags::AllocateOnDevice, e.page())
        .unwrap_err();
    assert_eq!(err.ze_result(), INVALID_NULL_HANDLE, "{err}");
    assert_eq!(e.stats().physical_objects, 0);
}

#[test]
fn destroy_while_mapped_is_handle_object_in_use_and_changes_nothing() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let r = e.reserve(4 * p);
    let ph = e.phys(2 * p);
    e.ctx.map(r.base, 2 * p, ph, 0, RW).unwrap();
    e.ctx.map(r.base + 2 * p, p, ph, p, RO).unwrap();
    e.write(r.base + p, 0xABCD);
    let before = (e.stats(), e.dev.used_memory(), e.attrs(r));
    let err = e.ctx.destroy_physical_memory(ph).unwrap_err();
    assert!(matches!(err, Error::HandleObjectInUse(_)), "{err:?}");
    assert_eq!(err.ze_result(), HANDLE_OBJECT_IN_USE);
    assert_eq!((e.stats(), e.dev.used_memory(), e.attrs(r)), before);
    // Still mapped and usable.
    assert_eq!(e.read(r.base + 2 * p), 0xABCD);
    e.write(r.base + p, 0xABCE);
    assert_eq!(e.read(r.base + 2 * p), 0xABCE);
    // One page still mapped anywhere is enough to keep it in use.
    e.ctx.unmap(r.base, 2 * p).unwrap();
    assert_err!(e.ctx.destroy_physical_memory(ph), HandleObjectInUse);
    e.ctx.unmap(r.base + 2 * p, p).unwrap();
    e.ctx.destroy_physical_memory(ph).unwrap();
    assert_eq!(e.dev.used_memory(), 0);
    assert_eq!(e.stats().physical_objects, 0);
    e.ctx.free_reservation(r).unwrap();
}

#[test]
fn destroy_of_a_dead_handle_is_invalid_argument() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let ph = e.phys(e.page());
    e.ctx.destroy_physical_memory(ph).unwrap();
    assert_err!(e.ctx.destroy_physical_memory(ph), InvalidArgument);
    let bogus = PhysicalMemory {
        id: u64::MAX,
        size: e.page(),
    };
    assert_err!(e.ctx.destroy_physical_memory(bogus), InvalidArgument);
    assert_eq!(e.dev.used_memory(), 0);
}

#[test]
fn aliases_see_each_others_writes() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let ph = e.phys(2 * p);
    let r1 = e.reserve(2 * p);
    let r2 = e.reserve(2 * p);
    let r3 = e.reserve(p);
    let r4 = e.reserve(4 * p);
    e.ctx.map(r1.base, 2 * p, ph, 0, RW).unwrap();
    e.ctx.map(r2.base, 2 * p, ph, 0, RW).unwrap();
    e.ctx.map(r3.base, p, ph, p, RW).unwrap();
    // Two aliases inside one reservation.
    e.ctx.map(r4.base, 2 * p, ph, 0, RW).unwrap();
    e.ctx.map(r4.base + 2 * p, 2 * p, ph, 0, RO).unwrap();
    e.write(r1.base + 8, 1);
    assert_eq!(e.read(r2.base + 8), 1);
    assert_eq!(e.read(r4.base + 8), 1);
    assert_eq!(e.read(r4.base + 2 * p + 8), 1);
    e.write(r2.base + p, 2);
    assert_eq!(e.read(r1.base + p), 2);
    assert_eq!(e.read(r3.base), 2);
    e.write(r3.base + 16, 3);
    assert_eq!(e.read(r1.base + p + 16), 3);
    assert_eq!(e.read(r4.base + 3 * p + 16), 3);
    e.write(r4.base + 2 * p - 8, 4);
    assert_eq!(e.read(r1.base + 2 * p - 8), 4);
    assert_eq!(e.read(r3.base + p - 8), 4);
    assert_eq!(e.stats().mapped_bytes, 9 * p);
    for r in [r1, r2, r3, r4] {
        e.ctx.free_reservation(r).unwrap();
    }
    e.ctx.destroy_physical_memory(ph).unwrap();
}

#[test]
fn physical_objects_are_sealed_memfds() {
    if common::not_applicable_on(Cuda, "physical memory objects are cuMemCreate allocations on cuda, not sealed memfds of the process") || common::skip() {
        return;
    }
    run_child("sealed");
}

/// The hetmem memfds open in this process: (fd, size).
fn hetmem_memfds() -> Vec<(i32, i64)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd") {
        let entry = entry.expect("fd entry");
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        if target
            .to_string_lossy()
            .starts_with("/memfd:hetmem-physical")
        {
            let fd: i32 = entry.file_name().to_string_lossy().parse().expect("fd");
            // SAFETY: fstat on an fd number of this process into a zeroed struct.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
            out.push((fd, st.st_size));
        }
    }
    out
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn child_sealed() {
    let e = env(16 * MIB);
    assert!(hetmem_memfds().is_empty());
    let a = e.phys(e.page());
    let b = e
        .ctx
        .create_physical_memory(None, PhysicalMemoryFlags::AllocateOnHost, 2 * MIB)
        .unwrap();
    let fds = hetmem_memfds();
    let mut sizes: Vec<i64> = fds.iter().map(|&(_, s)| s).collect();
    sizes.sort();
    assert_eq!(sizes, vec![e.page() as i64, 2 * MIB as i64], "{fds:?}");
    for (fd, size) in fds {
        // SAFETY (all calls below): fcntl / ftruncate / fallocate on a live fd of ours; each
        // must be refused by the seals, so nothing changes.
        let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
        let want = libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
        assert_eq!(seals & want, want, "fd {fd} seals {seals:#x}");
        assert_eq!(unsafe { libc::ftruncate(fd, size * 2) }, -1, "grew fd {fd}");
        assert_eq!(errno(), libc::EPERM);
        assert_eq!(unsafe { libc::ftruncate(fd, 0) }, -1, "shrank fd {fd}");
        assert_eq!(errno(), libc::EPERM);
        assert_eq!(unsafe { libc::fallocate(fd, 0, size, 4096) }, -1);
        assert_eq!(errno(), libc::EPERM);
        assert_eq!(
            unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_WRITE) },
            -1,
            "seals of fd {fd} can still change"
        );
        assert_eq!(errno(), libc::EPERM);
    }
    e.ctx.destroy_physical_memory(a).unwrap();
    e.ctx.destroy_physical_memory(b).unwrap();
    assert!(hetmem_memfds().is_empty(), "destroy left an fd open");
}

#[test]
fn ten_thousand_live_physical_objects() {
    if common::not_applicable_on(Cuda, "10,000 objects of one page are 640 MiB on the host backend but 20 GiB of GPU memory on cuda (2 MiB pages), more than this suite asks a GPU for") || common::skip() {
        return;
    }
    let e = env(1 << 30);
    let p = e.page();
    let objs: Vec<PhysicalMemory> = (0..10_000)
        .map(|i| {
            e.ctx
                .create_physical_memory(Some(&e.dev), PhysicalMemoryFlags::AllocateOnDevice, p)
                .unwrap_or_else(|err| panic!("physical object {i}: {err}"))
        })
        .collect();
    assert_eq!(e.stats().physical_objects, 10_000);
    assert_eq!(e.dev.used_memory(), 10_000 * p as u64);
    // Every one is real memory: map the first and the last and write through them.
    let r = e.reserve(2 * p);
    e.ctx.map(r.base, p, objs[0], 0, RW).unwrap();
    e.ctx.map(r.base + p, p, objs[9_999], 0, RW).unwrap();
    e.write(r.base, 1);
    e.write(r.base + p, 2);
    assert_eq!((e.read(r.base), e.read(r.base + p)), (1, 2));
    e.ctx.free_reservation(r).unwrap();
    for ph in objs {
        e.ctx.destroy_physical_memory(ph).unwrap();
    }
    assert_eq!(e.stats().physical_objects, 0);
    assert_eq!(e.dev.used_memory(), 0);
}

#[test]
fn open_file_limit_is_out_of_host_memory_naming_rlimit_nofile() {
    if common::not_applicable_on(Cuda, "each physical object is an fd of the process on the host backend (a memfd), so RLIMIT_NOFILE bounds them; cuda objects are driver allocations, not fds") || common::skip() {
        return;
    }
    run_child("nofile");
}

fn child_nofile() {
    let lim = libc::rlimit {
        rlim_cur: 64,
        rlim_max: 64,
    };
    // SAFETY: lowers this child's own fd limit (soft and hard, so the runtime cannot raise it).
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    let e = env(64 * MIB);
    let p = e.page();
    let mut live = Vec::new();
    let err = loop {
        match e
            .ctx
            .create_physical_memory(Some(&e.dev), PhysicalMemoryFlags::AllocateOnDevice, p)
        {
            Ok(ph) => live.push(ph),
            Err(err) => break err,
        }
        assert!(live.len() <= 64, "more objects than the fd limit allows");
    };
    assert!(!live.is_empty());
    match &err {
        Error::OutOfHostMemory(m) => assert!(m.contains("RLIMIT_NOFILE"), "{m}"),
        other => panic!("expected OutOfHostMemory, got {other:?}"),
    }
    assert_eq!(err.ze_result(), OUT_OF_HOST_MEMORY);
    // The failed call changed nothing, and the runtime keeps working.
    assert_eq!(e.stats().physical_objects, live.len());
    assert_eq!(e.dev.used_memory(), (live.len() * p) as u64);
    e.ctx.destroy_physical_memory(live.pop().unwrap()).unwrap();
    live.push(e.phys(p));
    for ph in live {
        e.ctx.destroy_physical_memory(ph).unwrap();
    }
    assert_eq!(e.dev.used_memory(), 0);
}

// ---------------------------------------------------------------------------------------------
// zeVirtualMemMap
// ---------------------------------------------------------------------------------------------

#[test]
fn map_applies_the_requested_access() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let r = e.reserve(3 * p);
    let ph = e.phys(3 * p);
    e.ctx.map(r.base, p, ph, 0, RW).unwrap();
    e.ctx.map(r.base + p, p, ph, p, RO).unwrap();
    e.ctx.map(r.base + 2 * p, p, ph, 2 * p, NONE).unwrap();
    assert_eq!(e.attrs(r), vec![RW, RO, NONE]);
    if common::kernel_maps_apply() {
        let maps = read_maps();
        let at = |a| line_at(&maps, a).expect("mapped");
        assert_eq!(at(r.base).perms, "rw-s");
        assert_eq!(at(r.base + p).perms, "r--s");
        assert_eq!(at(r.base + 2 * p).perms, "---s");
        assert!(
            at(r.base).path.contains("memfd:hetmem-physical"),
            "{:?}",
            at(r.base)
        );
    }
    assert_eq!(e.stats().mapped_bytes, 3 * p);
    e.ctx.free_reservation(r).unwrap();
    e.ctx.destroy_physical_memory(ph).unwrap();
}

#[test]
fn map_outside_reservation_is_invalid_argument() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let r = e.reserve(4 * p);
    let ph = e.phys(2 * p);
    // Our own mapping, not a reservation: must stay as it is.
    let region = mmap_anon(3 * p, libc::PROT_READ | libc::PROT_WRITE);
    let mine = align_up(region, p);
    write(mine, 0x5151);
    let before = e.stats();
    for (ptr, size) in [
        (mine, p),
        (r.base + 3 * p, 2 * p),
        (r.base - p, 2 * p),
        (r.base - p, p),
        (r.end(), p),
    ] {
        let err = e.ctx.map(ptr, size, ph, 0, RW).unwrap_err();
        assert_eq!(
            err.ze_result(),
            INVALID_ARGUMENT,
            "map({ptr:#x}, {size:#x}): {err}"
        );
    }
    assert_eq!(e.stats(), before);
    assert_eq!(e.attrs(r), vec![NONE; 4]);
    assert_eq!(perms_at(mine), "rw-p");
    assert_eq!(read(mine), 0x5151);
    munmap(region, 3 * p);
    e.ctx.free_reservation(r).unwrap();
    e.ctx.destroy_physical_memory(ph).unwrap();
}

/// Two reservations of `each` bytes, the second starting where the first ends.
fn adjacent_reservations(e: &Env, each: usize) -> (Reservation, Reservation) {
    for _ in 0..20 {
        let w = free_window(&e.ctx, 2 * each, e.page_for(each));
        let a = e.ctx.reserve(Some(w), each).unwrap();
        let b = e.ctx.reserve(Some(w + each), each).unwrap();
        if a.base == w && b.base == w + each {
            return (a, b);
        }
        e.ctx.free_reservation(a).unwrap();
        e.ctx.free_reservation(b).unwrap();
    }
    panic!("could not place two adjacent reservations in 20 tries");
}

#[test]
fn map_across_two_reservations_is_invalid_argument() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let (a, b) = adjacent_reservations(&e, 2 * p);
    let ph = e.phys(4 * p);
    let before = e.stats();
    assert_err!(e.ctx.map(a.end() - p, 2 * p, ph, 0, RW), InvalidArgument);
    assert_err!(e.ctx.map(a.base, 4 * p, ph, 0, RW), InvalidArgument);
    assert_eq!(e.stats(), before);
    assert_eq!(e.attrs(a), vec![NONE; 2]);
    assert_eq!(e.attrs(b), vec![NONE; 2]);
    // Each side alone is fine.
    e.ctx.map(a.end() - p, p, ph, 0, RW).unwrap();
    e.ctx.map(b.base, p, ph, p, RW).unwrap();
    e.ctx.free_reservation(a).unwrap();
    e.ctx.free_reservation(b).unwrap();
    e.ctx.destroy_physical_memory(ph).unwrap();
}

#[test]
fn map_unaligned_address_is_unsupported_alignment() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let r = e.reserve(8 * MIB);
    let small = e.phys(2 * p);
    let big = e.phys(2 * MIB);
    assert_err!(
        e.ctx.map(r.base + os_page(), p, small, 0, RW),
        UnsupportedAlignment
    );
    assert_err!(e.ctx.map(r.base + 1, p, small, 0, RW), UnsupportedAlignment);
    // A 2 MiB map needs a 2 MiB-aligned address, 64 KiB is not enough.
    if two_page_sizes(&e) {
        assert_err!(
            e.ctx.map(r.base + p, 2 * MIB, big, 0, RW),
            UnsupportedAlignment
        );
    }
    assert_eq!(e.stats().mapped_bytes, 0);
    e.ctx.map(r.base + 2 * MIB, 2 * MIB, big, 0, RW).unwrap();
    // A base-page-aligned address (not 2 MiB-aligned on the host backend) is enough for a
    // base-page map.
    e.ctx.map(r.base + 4 * MIB + p, p, small, 0, RW).unwrap();
    e.ctx.free_reservation(r).unwrap();
    e.ctx.destroy_physical_memory(small).unwrap();
    e.ctx.destroy_physical_memory(big).unwrap();
}

#[test]
fn map_unaligned_offset_is_unsupported_alignment() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let r = e.reserve(4 * MIB);
    let ph = e.phys(4 * MIB);
    assert_err!(
        e.ctx.map(r.base, p, ph, os_page(), RW),
        UnsupportedAlignment
    );
    if two_page_sizes(&e) {
        assert_err!(e.ctx.map(r.base, 2 * MIB, ph, p, RW), UnsupportedAlignment);
    }
    assert_eq!(e.stats().mapped_bytes, 0);
    e.ctx.map(r.base, p, ph, p, RW).unwrap();
    e.ctx
        .map(r.base + 2 * MIB, 2 * MIB, ph, 2 * MIB, RW)
        .unwrap();
    e.ctx.free_reservation(r).unwrap();
    e.ctx.destroy_physical_memory(ph).unwrap();
}

#[test]
fn map_unaligned_size_is_unsupported_size() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let r = e.reserve(8 * MIB);
    let ph = e.phys(4 * MIB);
    let mut sizes = vec![0, 1, os_page(), p + os_page(), 3 * MIB];
    if two_page_sizes(&e) {
        sizes.push(2 * MIB + p);
    }
    for size in sizes {
        let err = e.ctx.map(r.base, size, ph, 0, RW).unwrap_err();
        assert_eq!(err.ze_result(), UNSUPPORTED_SIZE, "size {size:#x}: {err}");
    }
    assert_eq!(e.stats().mapped_bytes, 0);
    e.ctx.free_reservation(r).unwrap();
    e.ctx.destroy_physical_memory(ph).unwrap();
}

#[test]
fn map_null_pointer_is_invalid_null_pointer() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let ph = e.phys(e.page());
    assert_err!(e.ctx.map(0, e.page(), ph, 0, RW), InvalidNullPointer);
    assert_eq!(e.stats().mapped_bytes, 0);
}

#[test]
fn map_overlapping_is_invalid_argument() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let r = e.reserve(4 * p);
    let a = e.phys(2 * p);
    let b = e.phys(4 * p);
    e.ctx.map(r.base + p, 2 * p, a, 0, RW).unwrap();
    e.write(r.base + p, 0x77);
    let before = (e.stats(), e.attrs(r));
    for (ptr, size) in [
        (r.base, 2 * p),
        (r.base + 2 * p, 2 * p),
        (r.base + p, 2 * p),
        (r.base + p, p),
        (r.base, 4 * p),
    ] {
        let err = e.ctx.map(ptr, size, b, 0, RO).unwrap_err();
        assert_eq!(
            err.ze_result(),
            INVALID_ARGUMENT,
            "map({ptr:#x}, {size:#x}): {err}"
        );
        assert_eq!((e.stats(), e.attrs(r)), before);
    }
    assert_eq!(e.read(r.base + p), 0x77);
    // The free neighbours on both sides map fine.
    e.ctx.map(r.base, p, b, 0, RO).unwrap();
    e.ctx.map(r.base + 3 * p, p, b, p, RO).unwrap();
    assert_eq!(e.attrs(r), vec![RO, RW, RW, RO]);
    e.ctx.free_reservation(r).unwrap();
    e.ctx.destroy_physical_memory(a).unwrap();
    e.ctx.destroy_physical_memory(b).unwrap();
}

#[test]
fn map_past_end_of_physical_is_invalid_argument() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let r = e.reserve(4 * p);
    let ph = e.phys(2 * p);
    for (size, offset) in [
        (3 * p, 0),
        (2 * p, p),
        (p, 2 * p),
        (p, 100 * p),
        (p, usize::MAX & !(p - 1)),
    ] {
        let err = e.ctx.map(r.base, size, ph, offset, RW).unwrap_err();
        assert_eq!(
            err.ze_result(),
            INVALID_ARGUMENT,
            "size {size:#x} offset {offset:#x}: {err}"
        );
    }
    assert_eq!(e.stats().mapped_bytes, 0);
    assert_eq!(e.attrs(r), vec![NONE; 4]);
    e.ctx.map(r.base, p, ph, p, RW).unwrap();
    e.ctx.free_reservation(r).unwrap();
    e.ctx.destroy_physical_memory(ph).unwrap();
}

#[test]
fn live_mappings_reach_vm_max_map_count_then_out_of_host_memory_naming_it() {
    if common::not_applicable_on(Cuda, "each mapping is a kernel VMA of the process on the host backend, so vm.max_map_count bounds them; cuda maps device memory in the GPU's page tables") || common::skip() {
        return;
    }
    let out = run_child("max_map_count");
    eprintln!(
        "{}",
        out.lines().find(|l| l.contains("mapped")).unwrap_or("")
    );
}

fn child_max_map_count() {
    let max: usize = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .expect("vm.max_map_count")
        .trim()
        .parse()
        .expect("a number");
    let e = env(64 * MIB);
    let p = e.page();
    let ph = e.phys(p);
    let block = e.phys(4 * p);
    let size = align_up((max + 64) * p, e.page_for(MIB << 10));
    let n = size / p;
    let r = e.reserve(size);
    // A 4-page mapping first (one VMA), to split at the limit below.
    e.ctx.map(r.base, 4 * p, block, 0, RW).unwrap();
    write(r.base + p, 0x600D);
    let vmas_before = read_maps().len();
    // Every other page maps offset 0 of one object, so no two mappings merge into one VMA.
    let mut ok = 4;
    let err = loop {
        match e.ctx.map(r.base + ok * p, p, ph, 0, RW) {
            Ok(()) => ok += 1,
            Err(err) => break err,
        }
        assert!(ok < n, "mapped {n} pages without reaching vm.max_map_count");
    };
    let failed_page = e.ctx.get_access_attribute(r.base + ok * p, p);
    let stats = e.stats();
    // At the limit, calls that must split a VMA fail and change nothing.
    let set = e.ctx.set_access_attribute(r.base + p, p, RO);
    let unmap = e.ctx.unmap(r.base + p, p);
    let block_attr = e.ctx.get_access_attribute(r.base, 4 * p);
    let stats_after = e.stats();
    write(r.base + p + 8, 0x600E);
    let words = (read(r.base + p), read(r.base + p + 8));
    // Get far below the limit before doing anything that might need a new mapping.
    e.ctx.free_reservation(r).unwrap();
    for (what, res) in [("map", Err(err)), ("set access", set), ("unmap", unmap)] {
        match res {
            Err(Error::OutOfHostMemory(m)) => {
                assert!(m.contains("vm.max_map_count"), "{what}: {m}")
            }
            other => panic!("{what} at the limit: expected OutOfHostMemory, got {other:?}"),
        }
    }
    assert!(
        vmas_before + ok + 16 >= max,
        "only {ok} mappings live with {vmas_before} VMAs before, limit {max}"
    );
    assert_eq!(stats.mapped_bytes, ok * p);
    assert_eq!(stats.mapped_runs, ok - 3);
    assert_eq!(stats_after, stats);
    assert_eq!(failed_page, Ok((NONE, p)));
    assert_eq!(block_attr, Ok((RW, 4 * p)));
    assert_eq!(words, (0x600D, 0x600E));
    e.ctx.destroy_physical_memory(ph).unwrap();
    e.ctx.destroy_physical_memory(block).unwrap();
    let s = e.stats();
    assert_eq!(
        (s.reservations, s.mapped_runs, s.physical_objects),
        (0, 0, 0)
    );
    println!("mapped {ok} live pages before vm.max_map_count = {max} stopped the next one");
}

// ---------------------------------------------------------------------------------------------
// zeVirtualMemUnmap
// ---------------------------------------------------------------------------------------------

#[test]
fn unmap_sub_range_reverts_to_none_and_stays_reserved() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let r = e.reserve(4 * p);
    let ph = e.phys(4 * p);
    e.ctx.map(r.base, 4 * p, ph, 0, RW).unwrap();
    for i in 0..4 {
        e.write(r.base + i * p, 10 + i as u64);
    }
    e.ctx.unmap(r.base + p, 2 * p).unwrap();
    assert_eq!(e.attrs(r), vec![RW, NONE, NONE, RW]);
    if common::kernel_maps_apply() {
        let maps = read_maps();
        let at = |a| line_at(&maps, a).map(|m| m.perms).unwrap_or_default();
        assert_eq!(at(r.base), "rw-s");
        assert_eq!(
            at(r.base + p),
            "---p",
            "the hole is not a placeholder again"
        );
        assert_eq!(at(r.base + 3 * p - 1), "---p");
        assert_eq!(at(r.base + 3 * p), "rw-s");
    }
    assert_eq!(e.read(r.base), 10);
    assert_eq!(e.read(r.base + 3 * p), 13);
    let s = e.stats();
    assert_eq!(
        (s.reservations, s.mapped_bytes, s.mapped_runs),
        (1, 2 * p, 2)
    );
    // Still reserved: the hole maps again, and the object kept the bytes.
    e.ctx.map(r.base + p, 2 * p, ph, p, RO).unwrap();
    assert_eq!(e.read(r.base + p), 11);
    assert_eq!(e.read(r.base + 2 * p), 12);
    assert_eq!(e.attrs(r), vec![RW, RO, RO, RW]);
    e.ctx.free_reservation(r).unwrap();
    e.ctx.destroy_physical_memory(ph).unwrap();
}

#[test]
fn unmap_may_span_several_mappings() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let r = e.reserve(4 * p);
    let a = e.phys(2 * p);
    let b = e.phys(2 * p);
    e.ctx.map(r.base, 2 * p, a, 0, RW).unwrap();
    e.ctx.map(r.base + 2 * p, 2 * p, b, 0, RO).unwrap();
    e.write(r.base, 5);
    e.ctx.unmap(r.base + p, 2 * p).unwrap();
    assert_eq!(e.attrs(r), vec![RW, NONE, NONE, RO]);
    assert_eq!(e.read(r.base), 5);
    assert_err!(e.ctx.destroy_physical_memory(a), HandleObjectInUse);
    assert_err!(e.ctx.destroy_physical_memory(b), HandleObjectInUse);
    e.ctx.unmap(r.base, p).unwrap();
    e.ctx.unmap(r.base + 3 * p, p).unwrap();
    assert_eq!(e.stats().mapped_bytes, 0);
    e.ctx.destroy_physical_memory(a).unwrap();
    e.ctx.destroy_physical_memory(b).unwrap();
    e.ctx.free_reservation(r).unwrap();
}

#[test]
fn unmap_works_on_64k_base_pages_inside_a_2m_mapping() {
    if common::not_applicable_on(Cuda, "64 KiB base pages inside a 2 MiB page exist only on the host backend; on cuda the base page is the 2 MiB page") || common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let big = e.page_for(2 * MIB);
    let r = e.reserve(big);
    let ph = e.phys(big);
    e.ctx.map(r.base, big, ph, 0, RW).unwrap();
    let pages = big / p;
    for i in 0..pages {
        e.write(r.base + i * p, i as u64);
    }
    e.ctx.unmap(r.base + p, p).unwrap();
    assert_eq!(e.ctx.get_access_attribute(r.base, big).unwrap(), (RW, p));
    assert_eq!(
        e.ctx.get_access_attribute(r.base + p, big - p).unwrap(),
        (NONE, p)
    );
    assert_eq!(
        e.ctx
            .get_access_attribute(r.base + 2 * p, big - 2 * p)
            .unwrap(),
        (RW, big - 2 * p)
    );
    for i in (0..pages).filter(|&i| i != 1) {
        assert_eq!(e.read(r.base + i * p), i as u64);
    }
    e.ctx.map(r.base + p, p, ph, p, RW).unwrap();
    assert_eq!(e.read(r.base + p), 1);
    assert_eq!(e.ctx.get_access_attribute(r.base, big).unwrap(), (RW, big));
    e.ctx.free_reservation(r).unwrap();
    e.ctx.destroy_physical_memory(ph).unwrap();
}

/// Case 4 of `shared/cases/level-zero.md` (the reference driver's answer; the header lists
/// `INVALID_ARGUMENT`): inside a reservation, unmapping pages that are not mapped succeeds and
/// changes nothing; a partly mapped range unmaps its mapped pages only.
#[test]
fn unmap_of_unmapped_pages_inside_a_reservation_succeeds_and_changes_nothing() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let r = e.reserve(4 * p);
    let ph = e.phys(2 * p);
    let before = (e.stats(), e.attrs(r));
    e.ctx.unmap(r.base, p).unwrap();
    e.ctx.unmap(r.base, 4 * p).unwrap();
    assert_eq!(
        (e.stats(), e.attrs(r)),
        before,
        "never mapped: nothing changes"
    );
    e.ctx.map(r.base + p, p, ph, 0, RW).unwrap();
    e.ctx.map(r.base + 3 * p, p, ph, p, RO).unwrap();
    e.write(r.base + p, 9);
    let before = (e.stats(), e.attrs(r));
    // The unmapped page 0 only: nothing changes.
    e.ctx.unmap(r.base, p).unwrap();
    e.ctx.unmap(r.base + 2 * p, p).unwrap();
    assert_eq!((e.stats(), e.attrs(r)), before);
    assert_eq!(e.read(r.base + p), 9);
    // Partly mapped: the mapped page goes, the others stay unmapped.
    e.ctx.unmap(r.base, 3 * p).unwrap();
    assert_eq!(e.attrs(r), vec![NONE, NONE, NONE, RO]);
    assert_err!(e.ctx.destroy_physical_memory(ph), HandleObjectInUse);
    // Twice, as programs unmap their first mapping again in a loop over all of them.
    e.ctx.unmap(r.base + p, p).unwrap();
    e.ctx.unmap(r.base, 4 * p).unwrap();
    assert_eq!(e.attrs(r), vec![NONE; 4]);
    assert_eq!(e.stats().mapped_bytes, 0);
    // The bytes stayed in the object.
    e.ctx.map(r.base, p, ph, 0, RW).unwrap();
    assert_eq!(e.read(r.base), 9);
    e.ctx.unmap(r.base, p).unwrap();
    e.ctx.free_reservation(r).unwrap();
    e.ctx.destroy_physical_memory(ph).unwrap();
}

#[test]
fn unmap_unaligned_is_unsupported_alignment_or_size() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let r = e.reserve(4 * p);
    let ph = e.phys(4 * p);
    e.ctx.map(r.base, 4 * p, ph, 0, RW).unwrap();
    assert_err!(e.ctx.unmap(r.base + os_page(), p), UnsupportedAlignment);
    assert_err!(e.ctx.unmap(r.base, os_page()), UnsupportedSize);
    assert_err!(e.ctx.unmap(r.base, p + 1), UnsupportedSize);
    assert_err!(e.ctx.unmap(r.base, 0), UnsupportedSize);
    assert_err!(e.ctx.unmap(0, p), InvalidNullPointer);
    assert_eq!(e.attrs(r), vec![RW; 4]);
    assert_eq!(e.stats().mapped_bytes, 4 * p);
    e.ctx.free_reservation(r).unwrap();
    e.ctx.destroy_physical_memory(ph).unwrap();
}

#[test]
fn unmap_outside_reservation_is_invalid_argument() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let r = e.reserve(2 * p);
    let ph = e.phys(2 * p);
    e.ctx.map(r.base, 2 * p, ph, 0, RW).unwrap();
    assert_err!(e.ctx.unmap(r.base + p, 2 * p), InvalidArgument);
    assert_err!(e.ctx.unmap(r.base - p, 2 * p), InvalidArgument);
    assert_err!(e.ctx.unmap(free_window(&e.ctx, p, p), p), InvalidArgument);
    assert_eq!(e.attrs(r), vec![RW; 2]);
    e.ctx.free_reservation(r).unwrap();
    e.ctx.destroy_physical_memory(ph).unwrap();
}

// ---------------------------------------------------------------------------------------------
// zeVirtualMemSetAccessAttribute / zeVirtualMemGetAccessAttribute
// ---------------------------------------------------------------------------------------------

#[test]
fn set_access_is_per_page_not_per_reservation() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let r = e.reserve(4 * p);
    let ph = e.phys(4 * p);
    e.ctx.map(r.base, 4 * p, ph, 0, RW).unwrap();
    e.ctx.set_access_attribute(r.base + p, p, RO).unwrap();
    assert_eq!(e.attrs(r), vec![RW, RO, RW, RW]);
    assert_eq!(e.ctx.get_access_attribute(r.base, 4 * p).unwrap(), (RW, p));
    assert_eq!(
        e.ctx.get_access_attribute(r.base + p, 3 * p).unwrap(),
        (RO, p)
    );
    assert_eq!(
        e.ctx.get_access_attribute(r.base + 2 * p, 2 * p).unwrap(),
        (RW, 2 * p)
    );
    e.ctx.set_access_attribute(r.base + 3 * p, p, NONE).unwrap();
    assert_eq!(e.attrs(r), vec![RW, RO, RW, NONE]);
    if common::kernel_maps_apply() {
        let maps = read_maps();
        let at = |a| line_at(&maps, a).map(|m| m.perms).unwrap_or_default();
        assert_eq!(
            [
                at(r.base),
                at(r.base + p),
                at(r.base + 2 * p),
                at(r.base + 3 * p)
            ],
            ["rw-s", "r--s", "rw-s", "---s"]
        );
    }
    // The whole range back to one attribute.
    e.ctx.set_access_attribute(r.base, 4 * p, RW).unwrap();
    assert_eq!(
        e.ctx.get_access_attribute(r.base, 4 * p).unwrap(),
        (RW, 4 * p)
    );
    e.write(r.base + 3 * p, 3);
    assert_eq!(e.read(r.base + 3 * p), 3);
    e.ctx.free_reservation(r).unwrap();
    e.ctx.destroy_physical_memory(ph).unwrap();
}

#[test]
fn set_access_leaves_unmapped_pages_none() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let r = e.reserve(4 * p);
    let ph = e.phys(2 * p);
    e.ctx.map(r.base + p, 2 * p, ph, 0, RW).unwrap();
    e.ctx.set_access_attribute(r.base, 4 * p, RO).unwrap();
    assert_eq!(e.attrs(r), vec![NONE, RO, RO, NONE]);
    if common::kernel_maps_apply() {
        assert_eq!(perms_at(r.base), "---p");
        assert_eq!(perms_at(r.base + p), "r--s");
        assert_eq!(perms_at(r.base + 3 * p), "---p");
    }
    assert_eq!(e.stats().mapped_bytes, 2 * p);
    e.ctx.free_reservation(r).unwrap();
    e.ctx.destroy_physical_memory(ph).unwrap();
}

#[test]
fn get_access_out_size_is_run_length_capped_at_size() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let r = e.reserve(8 * p);
    assert_eq!(
        e.ctx.get_access_attribute(r.base, 8 * p).unwrap(),
        (NONE, 8 * p)
    );
    let a = e.phys(2 * p);
    let b = e.phys(2 * p);
    let c = e.phys(p);
    // Pages: RW RW | RW RW | none | RO | none none   (| = different objects)
    e.ctx.map(r.base, 2 * p, a, 0, RW).unwrap();
    e.ctx.map(r.base + 2 * p, 2 * p, b, 0, RW).unwrap();
    e.ctx.map(r.base + 5 * p, p, c, 0, RO).unwrap();
    let get = |off: usize, size: usize| e.ctx.get_access_attribute(r.base + off, size).unwrap();
    assert_eq!(
        get(0, 8 * p),
        (RW, 4 * p),
        "a run crosses mappings of equal access"
    );
    assert_eq!(get(0, 3 * p), (RW, 3 * p), "capped at size");
    assert_eq!(get(0, p), (RW, p));
    assert_eq!(get(p, 7 * p), (RW, 3 * p));
    assert_eq!(get(4 * p, 4 * p), (NONE, p));
    assert_eq!(get(5 * p, 3 * p), (RO, p));
    assert_eq!(get(6 * p, 2 * p), (NONE, 2 * p));
    // A mapped NONE page followed by unmapped pages: one NONE run.
    e.ctx.set_access_attribute(r.base + 3 * p, p, NONE).unwrap();
    assert_eq!(get(3 * p, 5 * p), (NONE, 2 * p));
    assert_eq!(get(0, 8 * p), (RW, 3 * p));
    e.ctx.set_access_attribute(r.base + 5 * p, p, NONE).unwrap();
    assert_eq!(get(3 * p, 5 * p), (NONE, 5 * p));
    e.ctx.free_reservation(r).unwrap();
    for ph in [a, b, c] {
        e.ctx.destroy_physical_memory(ph).unwrap();
    }
}

#[test]
fn access_over_readonly_is_invalid_enumeration() {
    if common::skip() {
        return;
    }
    assert_eq!(AccessAttribute::from_raw(0), Ok(NONE));
    assert_eq!(AccessAttribute::from_raw(1), Ok(RW));
    assert_eq!(AccessAttribute::from_raw(2), Ok(RO));
    assert_eq!((NONE as u32, RW as u32, RO as u32), (0, 1, 2));
    for v in [3, 4, 0x7fff_ffff, u32::MAX] {
        let err = AccessAttribute::from_raw(v).unwrap_err();
        assert!(matches!(err, Error::InvalidEnumeration(_)), "{v}: {err:?}");
        assert_eq!(err.ze_result(), INVALID_ENUMERATION);
    }
}

#[test]
fn access_calls_unaligned_are_unsupported_alignment_or_size() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let r = e.reserve(4 * p);
    let ph = e.phys(4 * p);
    e.ctx.map(r.base, 4 * p, ph, 0, RW).unwrap();
    assert_err!(
        e.ctx.set_access_attribute(r.base + os_page(), p, RO),
        UnsupportedAlignment
    );
    assert_err!(
        e.ctx.set_access_attribute(r.base, os_page(), RO),
        UnsupportedSize
    );
    assert_err!(e.ctx.set_access_attribute(r.base, 0, RO), UnsupportedSize);
    assert_err!(e.ctx.set_access_attribute(0, p, RO), InvalidNullPointer);
    assert_err!(
        e.ctx.get_access_attribute(r.base + os_page(), p),
        UnsupportedAlignment
    );
    assert_err!(
        e.ctx.get_access_attribute(r.base, os_page()),
        UnsupportedSize
    );
    assert_err!(e.ctx.get_access_attribute(r.base, 0), UnsupportedSize);
    assert_err!(e.ctx.get_access_attribute(0, p), InvalidNullPointer);
    assert_eq!(e.attrs(r), vec![RW; 4]);
    e.ctx.free_reservation(r).unwrap();
    e.ctx.destroy_physical_memory(ph).unwrap();
}

#[test]
fn access_calls_outside_reservation_are_invalid_argument() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let r = e.reserve(2 * p);
    let ph = e.phys(2 * p);
    e.ctx.map(r.base, 2 * p, ph, 0, RW).unwrap();
    let elsewhere = free_window(&e.ctx, p, p);
    for (ptr, size) in [(r.base + p, 2 * p), (r.base - p, 2 * p), (elsewhere, p)] {
        assert_err!(e.ctx.set_access_attribute(ptr, size, RO), InvalidArgument);
        assert_err!(e.ctx.get_access_attribute(ptr, size), InvalidArgument);
    }
    assert_eq!(e.attrs(r), vec![RW; 2]);
    e.ctx.free_reservation(r).unwrap();
    e.ctx.destroy_physical_memory(ph).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Every call: failures change nothing, codes, threads
// ---------------------------------------------------------------------------------------------

/// Everything a call could change, seen from outside: counters, capacity, per-page attributes,
/// kernel permissions and the first word of every readable page of `rs`.
#[derive(Debug, PartialEq)]
struct Snapshot {
    stats: VmStats,
    used: u64,
    attrs: Vec<AccessAttribute>,
    perms: Vec<String>,
    words: Vec<Option<u64>>,
}

fn snapshot(e: &Env, rs: &[Reservation]) -> Snapshot {
    let p = e.page();
    let maps = if common::kernel_maps_apply() {
        read_maps()
    } else {
        Vec::new()
    };
    let mut s = Snapshot {
        stats: e.stats(),
        used: e.dev.used_memory(),
        attrs: Vec::new(),
        perms: Vec::new(),
        words: Vec::new(),
    };
    for r in rs {
        for a in (r.base..r.end()).step_by(p) {
            let attr = e.ctx.get_access_attribute(a, p).expect("get access").0;
            s.attrs.push(attr);
            s.perms
                .push(line_at(&maps, a).map(|m| m.perms).unwrap_or_default());
            s.words.push((attr != NONE).then(|| e.read(a)));
        }
    }
    s
}

type Call<'a> = (&'static str, u32, Box<dyn Fn() -> hetmem::Result<()> + 'a>);

#[test]
fn failed_calls_change_nothing() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let ctx = &e.ctx;
    let dev = &e.dev;
    let r1 = e.reserve(8 * p);
    let r2 = e.reserve(4 * p);
    let pa = e.phys(4 * p);
    let pb = e.phys(2 * p);
    ctx.map(r1.base, 4 * p, pa, 0, RW).unwrap();
    for i in 0..4 {
        e.write(r1.base + i * p, 100 + i as u64);
    }
    ctx.map(r1.base + 5 * p, 2 * p, pb, 0, RO).unwrap();
    ctx.set_access_attribute(r1.base + p, p, RO).unwrap();
    ctx.map(r2.base, p, pa, 2 * p, RW).unwrap();
    // Another context of the same driver, with things of its own.
    let ctx2 = e.rt.driver().create_context().unwrap();
    let q = ctx2
        .create_physical_memory(Some(dev), PhysicalMemoryFlags::AllocateOnDevice, p)
        .unwrap();
    let r3 = ctx2.reserve(None, 2 * p).unwrap();
    ctx2.map(r3.base, p, q, 0, RW).unwrap();

    let bogus = PhysicalMemory {
        id: u64::MAX,
        size: p,
    };
    // More than the device has: its capacity on the host backend (objects live already); on
    // cuda a page multiple past it, which no GPU can give.
    let cap = dev.info().capacity as usize;
    let cap = if common::on_host() {
        cap
    } else {
        cap.next_multiple_of(p) + p
    };
    let dev_mem = PhysicalMemoryFlags::AllocateOnDevice;
    let host_mem = PhysicalMemoryFlags::AllocateOnHost;
    let unit = |r: hetmem::Result<Reservation>| r.map(|_| ());
    let calls: Vec<Call> = vec![
        (
            "reserve 0",
            UNSUPPORTED_SIZE,
            Box::new(|| unit(ctx.reserve(None, 0))),
        ),
        (
            "reserve unaligned",
            UNSUPPORTED_SIZE,
            Box::new(|| unit(ctx.reserve(None, p + 4096))),
        ),
        (
            "reserve 1 PiB",
            OUT_OF_HOST_MEMORY,
            Box::new(|| unit(ctx.reserve(None, 1 << 50))),
        ),
        (
            "free short",
            INVALID_ARGUMENT,
            Box::new(|| ctx.free(r1.base, r1.size - p)),
        ),
        (
            "free long",
            INVALID_ARGUMENT,
            Box::new(|| ctx.free(r1.base, r1.size + p)),
        ),
        (
            "free inner",
            INVALID_ARGUMENT,
            Box::new(|| ctx.free(r1.base + p, p)),
        ),
        (
            "free null",
            INVALID_NULL_POINTER,
            Box::new(|| ctx.free(0, p)),
        ),
        (
            "free 0",
            UNSUPPORTED_SIZE,
            Box::new(|| ctx.free(r1.base, 0)),
        ),
        (
            "create 4 KiB",
            UNSUPPORTED_SIZE,
            Box::new(|| {
                ctx.create_physical_memory(Some(dev), dev_mem, 4096)
                    .map(|_| ())
            }),
        ),
        (
            "create 0",
            UNSUPPORTED_SIZE,
            Box::new(|| {
                ctx.create_physical_memory(Some(dev), dev_mem, 0)
                    .map(|_| ())
            }),
        ),
        (
            "create beyond capacity",
            OUT_OF_DEVICE_MEMORY,
            Box::new(|| {
                ctx.create_physical_memory(Some(dev), dev_mem, cap)
                    .map(|_| ())
            }),
        ),
        (
            "create device memory without device",
            INVALID_NULL_HANDLE,
            Box::new(|| ctx.create_physical_memory(None, dev_mem, p).map(|_| ())),
        ),
        (
            "create host unaligned",
            UNSUPPORTED_SIZE,
            Box::new(|| {
                ctx.create_physical_memory(None, host_mem, p + 4096)
                    .map(|_| ())
            }),
        ),
        (
            "destroy mapped a",
            HANDLE_OBJECT_IN_USE,
            Box::new(|| ctx.destroy_physical_memory(pa)),
        ),
        (
            "destroy mapped b",
            HANDLE_OBJECT_IN_USE,
            Box::new(|| ctx.destroy_physical_memory(pb)),
        ),
        (
            "destroy bogus",
            INVALID_ARGUMENT,
            Box::new(|| ctx.destroy_physical_memory(bogus)),
        ),
        (
            "map overlap",
            INVALID_ARGUMENT,
            Box::new(|| ctx.map(r1.base + 3 * p, 2 * p, pb, 0, RW)),
        ),
        (
            "map past reservation",
            INVALID_ARGUMENT,
            Box::new(|| ctx.map(r1.base + 7 * p, 2 * p, pb, 0, RW)),
        ),
        (
            "map unaligned ptr",
            UNSUPPORTED_ALIGNMENT,
            Box::new(|| ctx.map(r1.base + 4 * p + 4096, p, pb, 0, RW)),
        ),
        (
            "map unaligned size",
            UNSUPPORTED_SIZE,
            Box::new(|| ctx.map(r1.base + 4 * p, 4096, pb, 0, RW)),
        ),
        (
            "map unaligned offset",
            UNSUPPORTED_ALIGNMENT,
            Box::new(|| ctx.map(r1.base + 4 * p, p, pb, 4096, RW)),
        ),
        (
            "map past object",
            INVALID_ARGUMENT,
            Box::new(|| ctx.map(r1.base + 4 * p, p, pb, 2 * p, RW)),
        ),
        (
            "map null",
            INVALID_NULL_POINTER,
            Box::new(|| ctx.map(0, p, pb, 0, RW)),
        ),
        (
            "map 0",
            UNSUPPORTED_SIZE,
            Box::new(|| ctx.map(r1.base + 4 * p, 0, pb, 0, RW)),
        ),
        (
            "map bogus object",
            INVALID_ARGUMENT,
            Box::new(|| ctx.map(r1.base + 4 * p, p, bogus, 0, RW)),
        ),
        (
            "map other context's object",
            INVALID_ARGUMENT,
            Box::new(|| ctx.map(r1.base + 4 * p, p, q, 0, RW)),
        ),
        // Unmap of unmapped (or partly mapped) pages inside a reservation succeeds (case 4):
        // unmap_of_unmapped_pages_inside_a_reservation_succeeds_and_changes_nothing.
        (
            "unmap unaligned ptr",
            UNSUPPORTED_ALIGNMENT,
            Box::new(|| ctx.unmap(r1.base + 4096, p)),
        ),
        (
            "unmap unaligned size",
            UNSUPPORTED_SIZE,
            Box::new(|| ctx.unmap(r1.base, 4096)),
        ),
        (
            "unmap null",
            INVALID_NULL_POINTER,
            Box::new(|| ctx.unmap(0, p)),
        ),
        (
            "unmap 0",
            UNSUPPORTED_SIZE,
            Box::new(|| ctx.unmap(r1.base, 0)),
        ),
        (
            "unmap past reservation",
            INVALID_ARGUMENT,
            Box::new(|| ctx.unmap(r1.base + 6 * p, 4 * p)),
        ),
        (
            "set unaligned ptr",
            UNSUPPORTED_ALIGNMENT,
            Box::new(|| ctx.set_access_attribute(r1.base + 4096, p, NONE)),
        ),
        (
            "set unaligned size",
            UNSUPPORTED_SIZE,
            Box::new(|| ctx.set_access_attribute(r1.base, 4096, NONE)),
        ),
        (
            "set null",
            INVALID_NULL_POINTER,
            Box::new(|| ctx.set_access_attribute(0, p, NONE)),
        ),
        (
            "set 0",
            UNSUPPORTED_SIZE,
            Box::new(|| ctx.set_access_attribute(r1.base, 0, NONE)),
        ),
        (
            "set past reservation",
            INVALID_ARGUMENT,
            Box::new(|| ctx.set_access_attribute(r1.base + 6 * p, 4 * p, NONE)),
        ),
        (
            "get unaligned",
            UNSUPPORTED_ALIGNMENT,
            Box::new(|| ctx.get_access_attribute(r1.base + 4096, p).map(|_| ())),
        ),
        (
            "get past reservation",
            INVALID_ARGUMENT,
            Box::new(|| ctx.get_access_attribute(r1.base + 6 * p, 4 * p).map(|_| ())),
        ),
        (
            "other context: free",
            INVALID_ARGUMENT,
            Box::new(|| ctx2.free(r1.base, r1.size)),
        ),
        (
            "other context: unmap",
            INVALID_ARGUMENT,
            Box::new(|| ctx2.unmap(r1.base, p)),
        ),
        (
            "other context: set access",
            INVALID_ARGUMENT,
            Box::new(|| ctx2.set_access_attribute(r1.base, p, NONE)),
        ),
        (
            "other context: map",
            INVALID_ARGUMENT,
            Box::new(|| ctx2.map(r1.base + 4 * p, p, q, 0, RW)),
        ),
        (
            "other context: destroy",
            INVALID_ARGUMENT,
            Box::new(|| ctx2.destroy_physical_memory(pa)),
        ),
    ];
    let rs = [r1, r2, r3];
    let before = snapshot(&e, &rs[..2]);
    let r3_before = ctx2.get_access_attribute(r3.base, r3.size).unwrap();
    for (what, code, call) in &calls {
        let err = call().expect_err(what);
        assert_eq!(err.ze_result(), *code, "{what}: {err}");
        assert_eq!(snapshot(&e, &rs[..2]), before, "{what} changed something");
        assert_eq!(
            ctx2.get_access_attribute(r3.base, r3.size).unwrap(),
            r3_before
        );
    }
    assert_eq!(before.attrs[..8], [RW, RO, RW, RW, NONE, RO, RO, NONE]);
}

#[test]
fn error_values_match_ze_result_t() {
    if common::skip() {
        return;
    }
    let s = String::new;
    let table = [
        (
            Error::OutOfHostMemory(s()),
            0x7000_0002,
            "OUT_OF_HOST_MEMORY",
        ),
        (
            Error::OutOfDeviceMemory(s()),
            0x7000_0003,
            "OUT_OF_DEVICE_MEMORY",
        ),
        (Error::Uninitialized(s()), 0x7800_0001, "UNINITIALIZED"),
        (
            Error::UnsupportedFeature(s()),
            0x7800_0003,
            "UNSUPPORTED_FEATURE",
        ),
        (Error::InvalidArgument(s()), 0x7800_0004, "INVALID_ARGUMENT"),
        (
            Error::InvalidNullHandle(s()),
            0x7800_0005,
            "INVALID_NULL_HANDLE",
        ),
        (
            Error::HandleObjectInUse(s()),
            0x7800_0006,
            "HANDLE_OBJECT_IN_USE",
        ),
        (
            Error::InvalidNullPointer(s()),
            0x7800_0007,
            "INVALID_NULL_POINTER",
        ),
        (Error::InvalidSize(s()), 0x7800_0008, "INVALID_SIZE"),
        (Error::UnsupportedSize(s()), 0x7800_0009, "UNSUPPORTED_SIZE"),
        (
            Error::UnsupportedAlignment(s()),
            0x7800_000a,
            "UNSUPPORTED_ALIGNMENT",
        ),
        (
            Error::InvalidEnumeration(s()),
            0x7800_000c,
            "INVALID_ENUMERATION",
        ),
        (
            Error::UnsupportedEnumeration(s()),
            0x7800_000d,
            "UNSUPPORTED_ENUMERATION",
        ),
        (
            Error::AddressNotFound(s()),
            0x7800_0021,
            "ADDRESS_NOT_FOUND",
        ),
        (Error::Unknown(s()), 0x7fff_fffe, "UNKNOWN"),
    ];
    for (err, value, name) in table {
        assert_eq!(err.ze_result(), value, "{name}");
        assert_eq!(err.ze_name(), format!("ZE_RESULT_ERROR_{name}"));
    }
    // And errors from real calls carry those values.
    let e = env(4 * MIB);
    assert_eq!(e.ctx.reserve(None, 0).unwrap_err().ze_result(), 0x7800_0009);
    assert_eq!(
        e.ctx.free(0, e.page()).unwrap_err().ze_result(),
        0x7800_0007
    );
    let r = e.reserve(e.page());
    let ph = e.phys(e.page());
    assert_eq!(
        e.ctx
            .map(r.base + 4096, e.page(), ph, 0, RW)
            .unwrap_err()
            .ze_result(),
        0x7800_000a
    );
    assert_eq!(
        e.ctx
            .map(r.base, e.page(), ph, e.page(), RW)
            .unwrap_err()
            .ze_result(),
        0x7800_0004
    );
    // More than the device has (a 4 MiB device on the host backend; past the GPU's capacity on
    // cuda).
    let beyond = if common::on_host() {
        8 * MIB
    } else {
        (e.dev.info().capacity as usize).next_multiple_of(e.page()) + e.page()
    };
    assert_eq!(e.phys_err(beyond).ze_result(), 0x7000_0003);
    e.ctx.map(r.base, e.page(), ph, 0, RW).unwrap();
    assert_eq!(
        e.ctx.destroy_physical_memory(ph).unwrap_err().ze_result(),
        0x7800_0006
    );
    assert_eq!(
        AccessAttribute::from_raw(3).unwrap_err().ze_result(),
        0x7800_000c
    );
    e.ctx.free_reservation(r).unwrap();
}

impl Env {
    fn phys_err(&self, size: usize) -> Error {
        self.ctx
            .create_physical_memory(Some(&self.dev), PhysicalMemoryFlags::AllocateOnDevice, size)
            .unwrap_err()
    }
}

#[test]
fn calls_are_thread_safe() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let ctx = e.ctx.clone();
            let dev = e.dev.clone();
            s.spawn(move || {
                for i in 0..200u64 {
                    let r = ctx.reserve(None, 2 * p).unwrap();
                    let ph = ctx
                        .create_physical_memory(
                            Some(&dev),
                            PhysicalMemoryFlags::AllocateOnDevice,
                            p,
                        )
                        .unwrap();
                    ctx.map(r.base + p, p, ph, 0, RW).unwrap();
                    common::dev_write(&ctx, r.base + p, (t << 32) | i);
                    ctx.set_access_attribute(r.base + p, p, RO).unwrap();
                    assert_eq!(common::dev_read(&ctx, r.base + p), (t << 32) | i);
                    assert_eq!(ctx.get_access_attribute(r.base, 2 * p).unwrap(), (NONE, p));
                    assert_eq!(ctx.get_access_attribute(r.base + p, p).unwrap(), (RO, p));
                    ctx.unmap(r.base + p, p).unwrap();
                    ctx.destroy_physical_memory(ph).unwrap();
                    ctx.free_reservation(r).unwrap();
                }
            });
        }
    });
    let s = e.stats();
    assert_eq!(
        (s.reservations, s.physical_objects, s.mapped_runs),
        (0, 0, 0)
    );
    assert_eq!(e.dev.used_memory(), 0);
}

// ---------------------------------------------------------------------------------------------
// Contexts
// ---------------------------------------------------------------------------------------------

#[test]
fn reservation_of_one_context_is_invalid_in_another() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let other = e.rt.driver().create_context().unwrap();
    let r = e.reserve(4 * p);
    let pa = e.phys(p);
    e.ctx.map(r.base, p, pa, 0, RW).unwrap();
    e.write(r.base, 42);
    let pb = other
        .create_physical_memory(Some(&e.dev), PhysicalMemoryFlags::AllocateOnDevice, p)
        .unwrap();
    let before = e.stats();
    assert_err!(other.free(r.base, r.size), InvalidArgument);
    assert_err!(other.map(r.base + p, p, pb, 0, RW), InvalidArgument);
    assert_err!(other.unmap(r.base, p), InvalidArgument);
    assert_err!(other.set_access_attribute(r.base, p, RO), InvalidArgument);
    assert_err!(other.get_access_attribute(r.base, p), InvalidArgument);
    assert_eq!(e.stats(), before);
    assert_eq!(e.attrs(r), vec![RW, NONE, NONE, NONE]);
    assert_eq!(e.read(r.base), 42);
    e.ctx.free_reservation(r).unwrap();
    e.ctx.destroy_physical_memory(pa).unwrap();
    other.destroy_physical_memory(pb).unwrap();
}

#[test]
fn physical_memory_of_one_context_is_invalid_in_another() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let other = e.rt.driver().create_context().unwrap();
    let pa = e.phys(p);
    let r_other = other.reserve(None, p).unwrap();
    assert_err!(other.destroy_physical_memory(pa), InvalidArgument);
    assert_err!(other.map(r_other.base, p, pa, 0, RW), InvalidArgument);
    assert_eq!(e.stats().physical_objects, 1);
    assert_eq!(e.dev.used_memory(), p as u64);
    // Still good in its own context.
    let r = e.reserve(p);
    e.ctx.map(r.base, p, pa, 0, RW).unwrap();
    e.ctx.free_reservation(r).unwrap();
    e.ctx.destroy_physical_memory(pa).unwrap();
    other.free_reservation(r_other).unwrap();
}

#[test]
fn dropping_a_context_releases_everything() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let p = e.page();
    let driver = e.rt.driver().clone();
    let a = driver.create_context().unwrap();
    let b = driver.create_context().unwrap();
    let ra = a.reserve(None, 8 * p).unwrap();
    let rb = b.reserve(None, 2 * p).unwrap();
    let pd = a
        .create_physical_memory(Some(&e.dev), PhysicalMemoryFlags::AllocateOnDevice, 4 * p)
        .unwrap();
    let ph = a
        .create_physical_memory(None, PhysicalMemoryFlags::AllocateOnHost, 2 * p)
        .unwrap();
    let pb = b
        .create_physical_memory(Some(&e.dev), PhysicalMemoryFlags::AllocateOnDevice, p)
        .unwrap();
    a.map(ra.base, 4 * p, pd, 0, RW).unwrap();
    a.map(ra.base + 5 * p, 2 * p, ph, 0, RO).unwrap();
    a.reserve(None, 2 * MIB).unwrap();
    let _unmapped = a
        .create_physical_memory(Some(&e.dev), PhysicalMemoryFlags::AllocateOnDevice, p)
        .unwrap();
    b.map(rb.base, p, pb, 0, RW).unwrap();
    e.write(rb.base, 31);
    // A clone keeps the context alive.
    let a2 = a.clone();
    drop(a);
    let s = driver.vm_stats();
    assert_eq!((s.reservations, s.physical_objects), (3, 4));
    assert_eq!(
        a2.get_access_attribute(ra.base, 8 * p).unwrap(),
        (RW, 4 * p)
    );
    drop(a2);
    let s = driver.vm_stats();
    assert_eq!(
        (
            s.reservations,
            s.physical_objects,
            s.mapped_runs,
            s.mapped_bytes
        ),
        (1, 1, 1, p)
    );
    assert_eq!(e.dev.used_memory(), p as u64);
    assert_eq!(s.host_physical_bytes, 0);
    // The other context is untouched.
    assert_eq!(e.read(rb.base), 31);
    assert_eq!(b.get_access_attribute(rb.base, 2 * p).unwrap(), (RW, p));
    drop(b);
    let s = driver.vm_stats();
    assert_eq!(
        (
            s.reservations,
            s.reserved_bytes,
            s.physical_objects,
            s.mapped_runs,
            s.mapped_bytes
        ),
        (0, 0, 0, 0, 0)
    );
    assert_eq!(s.host_physical_bytes, 0);
    assert_eq!(e.dev.used_memory(), 0);
}

#[test]
fn dropping_a_context_closes_its_fds_and_mappings() {
    if common::not_applicable_on(Cuda, "counts the memfds of /proc/self/fd and the lines of /proc/self/maps a context leaves; cuda device memory is neither") || common::skip() {
        return;
    }
    run_child("context_drop");
}

fn child_context_drop() {
    let e = env(16 * MIB);
    let p = e.page();
    assert!(hetmem_memfds().is_empty());
    let ctx = e.rt.driver().create_context().unwrap();
    let r = ctx.reserve(None, 8 * p).unwrap();
    let pd = ctx
        .create_physical_memory(Some(&e.dev), PhysicalMemoryFlags::AllocateOnDevice, 2 * p)
        .unwrap();
    let ph = ctx
        .create_physical_memory(None, PhysicalMemoryFlags::AllocateOnHost, p)
        .unwrap();
    ctx.map(r.base, 2 * p, pd, 0, RW).unwrap();
    ctx.map(r.base + 3 * p, p, ph, 0, RO).unwrap();
    write(r.base, 1);
    assert_eq!(hetmem_memfds().len(), 2);
    assert!(mapping_at(r.base).unwrap().path.contains("hetmem-physical"));
    drop(ctx);
    assert!(hetmem_memfds().is_empty(), "context drop left memfds open");
    let left: Vec<MapLine> = read_maps()
        .into_iter()
        .filter(|m| m.start < r.end() && r.base < m.end || m.path.contains("hetmem-physical"))
        .collect();
    assert!(left.is_empty(), "context drop left mappings: {left:?}");
    assert_eq!(e.stats().reservations, 0);
    assert_eq!(e.dev.used_memory(), 0);
}

// ---------------------------------------------------------------------------------------------
// Found by review: handles across drivers, OS limits that must not kill, absurd sizes.
// ---------------------------------------------------------------------------------------------

#[test]
fn physical_handle_of_another_driver_is_invalid_argument_and_changes_nothing() {
    if common::skip() {
        return;
    }
    let a = env(16 * MIB);
    let b = env(16 * MIB);
    let page = a.ctx.query_page_size(&a.dev, 2 * MIB).unwrap();
    let pa = a
        .ctx
        .create_physical_memory(Some(&a.dev), PhysicalMemoryFlags::AllocateOnDevice, page)
        .unwrap();
    let pb = b
        .ctx
        .create_physical_memory(Some(&b.dev), PhysicalMemoryFlags::AllocateOnDevice, page)
        .unwrap();
    assert_ne!(pa.id, pb.id, "ids are unique across drivers");
    assert_err!(b.ctx.destroy_physical_memory(pa), InvalidArgument);
    let r = b.ctx.reserve(None, page).unwrap();
    assert_err!(
        b.ctx.map(r.base, page, pa, 0, AccessAttribute::ReadWrite),
        InvalidArgument
    );
    assert_eq!(b.dev.used_memory(), page as u64);
    assert_eq!(a.dev.used_memory(), page as u64);
    b.ctx.destroy_physical_memory(pb).unwrap();
    a.ctx.destroy_physical_memory(pa).unwrap();
}

#[test]
fn host_physical_memory_beyond_host_ram_is_out_of_host_memory() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    let huge = 1usize << 46; // 64 TiB, more than any test machine's RAM
    let m = assert_err!(
        e.ctx
            .create_physical_memory(None, PhysicalMemoryFlags::AllocateOnHost, huge),
        OutOfHostMemory
    );
    assert!(m.contains("0x400000000000"), "{m}");
    assert_err!(
        e.ctx.create_physical_memory(
            None,
            PhysicalMemoryFlags::AllocateOnHost,
            0xffff_ffff_ffe0_0000
        ),
        OutOfHostMemory
    );
    assert_eq!(e.stats().physical_objects, 0);
    assert_eq!(e.stats().host_physical_bytes, 0);
}

#[test]
fn reserve_larger_than_the_address_space_is_decided_by_the_semantics_layer() {
    if common::skip() {
        return;
    }
    let e = env(16 * MIB);
    // Overflows size + alignment: rejected before the backend is asked.
    let m = assert_err!(e.ctx.reserve(None, 0xffff_ffff_ffe0_0000), UnsupportedSize);
    assert!(m.contains("0xffffffffffe00000"), "{m}");
    // Fits the arithmetic but not the address space: the OS says no.
    assert_err!(e.ctx.reserve(None, 1 << 62), OutOfHostMemory);
    assert_eq!(e.stats().reservations, 0);
}

#[test]
fn file_size_limit_is_out_of_host_memory_not_sigxfsz() {
    if common::not_applicable_on(Cuda, "RLIMIT_FSIZE bounds the memfds behind host-backend physical memory; cuda physical memory is not a file") || common::skip() {
        return;
    }
    let out = run_child("fsize");
    assert!(out.contains("RLIMIT_FSIZE"), "{out}");
}

fn child_fsize() {
    let lim = libc::rlimit {
        rlim_cur: 1 << 20,
        rlim_max: 1 << 20,
    };
    // SAFETY: lowers this child's own file-size limit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &lim) }, 0);
    let e = env(64 * MIB);
    let page = e.ctx.query_page_size(&e.dev, 2 * MIB).unwrap();
    let m = assert_err!(
        e.ctx
            .create_physical_memory(Some(&e.dev), PhysicalMemoryFlags::AllocateOnDevice, page),
        OutOfHostMemory
    );
    assert_eq!(e.dev.used_memory(), 0);
    println!("{m}");
}
