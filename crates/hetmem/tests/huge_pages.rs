//! 2 MiB pages on the host backend (`backend::host::huge`): physical objects of 2 MiB multiples
//! live on reserved hugetlbfs pages where `vm.nr_hugepages` has free ones (and become shmem at
//! the first use of a piece, `backend::host::hugetlb`), other objects mapped 2 MiB-aligned land
//! in shmem THP folios (one PMD entry per 2 MiB) where shmem THP is enabled, managed memory
//! lives on reserved hugetlbfs pages where `vm.nr_hugepages` has free ones, and all fall back
//! to 4 KiB pages (never failing) where the machine has none or `host_huge_pages(false)` says
//! so. Everything a program sees is the same either way.
//!
//! The tests set the machine's settings they need (`/sys/kernel/mm/transparent_hugepage/
//! shmem_enabled`, `/proc/sys/vm/nr_hugepages`) for their own duration and put the old values
//! back when they end (also on a failure); where they cannot write them (not root, a read-only
//! sysfs) they say so loudly and check only the 4 KiB fallback. One test at a time changes them.

mod common;

use common::{byte, file_not_applicable, stream};
use hetmem::{AccessAttribute, Location, PhysicalMemoryFlags, Runtime, MANAGED_PAGE_SIZE as PAGE};
use hetmem_testkit::loud_once;

const SHMEM_THP: &str = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";
const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

/// One test at a time changes the machine's settings.
static SETTINGS: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

fn host_only() -> bool {
    file_not_applicable(
        "huge pages are the host backend's choice of memory; on cuda the driver maps device \
         memory in its own pages",
    )
}

/// A machine setting changed for a test's duration: the old value comes back on drop.
struct Setting {
    path: &'static str,
    old: String,
}

impl Setting {
    /// Writes `value` to `path` and checks it took; `None` (after a loud line naming why) where
    /// it cannot be written.
    fn set(path: &'static str, value: &str) -> Option<Setting> {
        let raw = std::fs::read_to_string(path).ok()?;
        // A choice file reads `a [b] c`: the old value is the bracketed one.
        let old = match (raw.find('['), raw.find(']')) {
            (Some(a), Some(b)) => raw[a + 1..b].to_string(),
            _ => raw.trim().to_string(),
        };
        if let Err(e) = std::fs::write(path, value) {
            loud_once(format!(
                "NOT RUN (host) huge_pages: cannot write {value:?} to {path} ({e}); only the \
                 4 KiB fallback is checked here (run as root to check 2 MiB pages)"
            ));
            return None;
        }
        Some(Setting { path, old })
    }
}

impl Drop for Setting {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(self.path, &self.old) {
            eprintln!(
                "huge_pages: FAILED to restore {} to {:?}: {e}",
                self.path, self.old
            );
        }
    }
}

/// The `/proc/self/smaps` fields of the mapping containing `addr` (kB values by name).
fn smaps_of(addr: usize) -> std::collections::HashMap<String, u64> {
    let s = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
    let mut out = std::collections::HashMap::new();
    let mut inside = false;
    for line in s.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = head.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                if inside {
                    break;
                }
                inside = a <= addr && addr < b;
                continue;
            }
        }
        if inside {
            if let Some((k, v)) = line.split_once(':') {
                if let Some(n) = v.split_whitespace().next().and_then(|n| n.parse().ok()) {
                    out.insert(k.to_string(), n);
                }
            }
        }
    }
    out
}

fn runtime(huge: bool) -> Runtime {
    Runtime::builder()
        .host_devices(1)
        .host_device_memory(256 << 20)
        .host_huge_pages(huge)
        .build()
        .expect("runtime")
}

/// Maps a 4 MiB object at a 2 MiB-aligned address, then its second half again in 64 KiB
/// pieces elsewhere; checks the bytes agree both ways; returns the PMD-mapped kB of the first
/// mapping.
fn map_and_check(rt: &Runtime) -> u64 {
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device(0).unwrap();
    let size = 4 << 20;
    let res = ctx.reserve(None, 2 * size).unwrap();
    let phys = ctx
        .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, size)
        .unwrap();
    assert_eq!(res.base % (2 << 20), 0);
    ctx.map(res.base, size, phys, 0, AccessAttribute::ReadWrite)
        .unwrap();
    for off in (0..size).step_by(4096) {
        // SAFETY: mapped read-write just above.
        unsafe { ((res.base + off) as *mut u8).write_volatile((off / 4096) as u8) };
    }
    let m = smaps_of(res.base);
    let pmd = m.get("ShmemPmdMapped").copied().unwrap_or(0)
        + m.get("FilePmdMapped").copied().unwrap_or(0);
    // The second half through 64 KiB maps (any base-page piece of an object maps, huge or not).
    let piece = 64 << 10;
    for k in 0..(size / 2) / piece {
        let off = size / 2 + k * piece;
        ctx.map(
            res.base + size + k * piece,
            piece,
            phys,
            off,
            AccessAttribute::ReadWrite,
        )
        .unwrap();
    }
    for off in (size / 2..size).step_by(4096) {
        assert_eq!(
            byte(res.base + size + off - size / 2),
            (off / 4096) as u8,
            "+{off:#x}"
        );
    }
    // SAFETY: mapped read-write.
    unsafe { ((res.base + size) as *mut u8).write_volatile(0xee) };
    assert_eq!(
        byte(res.base + size / 2),
        0xee,
        "one object seen through both mappings"
    );
    ctx.unmap(res.base, size + size / 2).unwrap();
    ctx.destroy_physical_memory(phys).unwrap();
    ctx.free_reservation(res).unwrap();
    pmd
}

#[test]
fn physical_objects_map_in_2mib_folios_with_shmem_thp_and_in_4kib_pages_without() {
    if host_only() {
        return;
    }
    let _one = SETTINGS.lock();
    // Off: 4 KiB pages whatever the machine offers.
    assert_eq!(map_and_check(&runtime(false)), 0, "huge pages off");
    let rt_off = runtime(false);
    assert!(
        rt_off
            .driver()
            .page_kinds()
            .unwrap()
            .contains("HETMEM_HOST_HUGE_PAGES=off"),
        "{:?}",
        rt_off.driver().page_kinds()
    );
    // No reserved huge pages for the THP checks (objects would take them first).
    let Some(_pool) = Setting::set(NR_HUGEPAGES, "0") else {
        return;
    };
    if hugetlb_count("nr_hugepages") != 0 {
        loud_once(format!(
            "NOT RUN (host) huge_pages: {} reserved huge pages are in use elsewhere; shmem THP \
             for physical objects is not checked",
            hugetlb_count("nr_hugepages")
        ));
        return;
    }
    {
        let Some(_thp) = Setting::set(SHMEM_THP, "advise") else {
            return;
        };
        let rt = runtime(true);
        let kinds = rt.driver().page_kinds().unwrap();
        assert!(kinds.contains("2 MiB shmem THP"), "{kinds}");
        let pmd = map_and_check(&rt);
        assert!(
            pmd >= 2048,
            "a 2 MiB-aligned map with shmem THP on is PMD-mapped (got {pmd} kB)"
        );
    }
    {
        // THP off on the machine: 4 KiB pages, the map as before.
        let Some(_thp) = Setting::set(SHMEM_THP, "never") else {
            return;
        };
        let rt = runtime(true);
        assert!(rt.driver().page_kinds().unwrap().contains("is never"));
        assert_eq!(map_and_check(&rt), 0, "shmem THP never");
    }
}

/// A count of the machine's 2 MiB hugetlb pool (`nr_hugepages`, `free_hugepages`, ...).
fn hugetlb_count(name: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/kernel/mm/hugepages/hugepages-2048kB/{name}"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The permissions field of `/proc/self/maps` for the mapping containing `addr` (`rw-s`, ...).
fn perms_of(addr: usize) -> String {
    let s = std::fs::read_to_string("/proc/self/maps").expect("maps");
    for line in s.lines() {
        let mut it = line.split_whitespace();
        let (range, perms) = (it.next().unwrap(), it.next().unwrap());
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (
            usize::from_str_radix(a, 16).unwrap(),
            usize::from_str_radix(b, 16).unwrap(),
        );
        if a <= addr && addr < b {
            return perms.to_string();
        }
    }
    panic!("{addr:#x} is not mapped")
}

/// Physical objects of 2 MiB multiples take reserved hugetlbfs pages (one 2 MiB page-table
/// entry each, `KernelPageSize` 2048 kB), whole-page maps, unmaps and protects keep them
/// there, and the first call on a piece (a 64 KiB protect, a 64 KiB map) makes the object
/// shmem with every mapping re-made in place: same bytes, same protections, one object seen
/// through all of them. The pool's pages come back when the object goes; with more asked than
/// are free, the object is shmem from the start (never a failure).
#[test]
fn physical_objects_take_reserved_huge_pages_and_a_piece_makes_them_shmem_in_place() {
    if host_only() {
        return;
    }
    let _one = SETTINGS.lock();
    let have = hugetlb_count("nr_hugepages");
    let Some(_pool) = Setting::set(NR_HUGEPAGES, &(have + 8).to_string()) else {
        return;
    };
    let free = hugetlb_count("free_hugepages");
    if free < 4 {
        loud_once(format!(
            "NOT RUN (host) huge_pages: only {free} reserved huge pages free after asking for 8 \
             more; hugetlbfs physical objects are not checked"
        ));
        return;
    }
    let rt = runtime(true);
    let kinds = rt.driver().page_kinds().unwrap();
    assert!(kinds.contains("hugetlbfs pages for sizes"), "{kinds}");
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device(0).unwrap();
    let size = 4 << 20;
    let res = ctx.reserve(None, 4 * size).unwrap();
    let (a, b) = (res.base, res.base + size);
    let phys = ctx
        .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, size)
        .unwrap();
    assert_eq!(
        hugetlb_count("free_hugepages"),
        free - 2,
        "its two pages taken"
    );
    ctx.map(a, size, phys, 0, AccessAttribute::ReadWrite)
        .unwrap();
    ctx.map(b, size, phys, 0, AccessAttribute::ReadWrite)
        .unwrap();
    assert_eq!(smaps_of(a)["KernelPageSize"], 2048, "hugetlbfs");
    for off in (0..size).step_by(4096) {
        // SAFETY: mapped read-write just above.
        unsafe { ((a + off) as *mut u8).write_volatile((off / 4096) as u8 | 1) };
    }
    assert_eq!(byte(b + size - 4096), ((size - 4096) / 4096) as u8 | 1);
    // Whole 2 MiB pages: still hugetlbfs.
    ctx.set_access_attribute(b + (2 << 20), 2 << 20, AccessAttribute::ReadOnly)
        .unwrap();
    assert_eq!(smaps_of(b)["KernelPageSize"], 2048);
    assert_eq!(perms_of(b + (2 << 20)), "r--s");
    ctx.unmap(a + (2 << 20), 2 << 20).unwrap();
    assert_eq!(smaps_of(a)["KernelPageSize"], 2048);
    // A 64 KiB piece: the object becomes shmem, every mapping in place.
    let piece = 64 << 10;
    ctx.set_access_attribute(b + piece, piece, AccessAttribute::ReadOnly)
        .unwrap();
    for at in [a, b, b + (2 << 20)] {
        assert_eq!(smaps_of(at)["KernelPageSize"], 4, "shmem at {at:#x}");
    }
    assert_eq!(perms_of(b), "rw-s");
    assert_eq!(perms_of(b + piece), "r--s");
    assert_eq!(perms_of(b + 2 * piece), "rw-s");
    assert_eq!(perms_of(b + (2 << 20)), "r--s", "the earlier protect kept");
    assert_eq!(
        ctx.get_access_attribute(b + (2 << 20), piece).unwrap().0,
        AccessAttribute::ReadOnly
    );
    for off in (0..size).step_by(4096) {
        assert_eq!(byte(b + off), (off / 4096) as u8 | 1, "+{off:#x}");
        if off < (2 << 20) {
            assert_eq!(byte(a + off), (off / 4096) as u8 | 1, "+{off:#x}");
        }
    }
    // SAFETY: mapped read-write.
    unsafe { (a as *mut u8).write_volatile(0x5a) };
    assert_eq!(byte(b), 0x5a, "one object through both mappings");
    assert_eq!(
        hugetlb_count("free_hugepages"),
        free,
        "its pages back in the pool"
    );
    // A 64 KiB map of a fresh hugetlbfs object: shmem before it maps.
    let p2 = ctx
        .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, 2 << 20)
        .unwrap();
    let c = res.base + 2 * size;
    ctx.map(c, 2 << 20, p2, 0, AccessAttribute::ReadWrite)
        .unwrap();
    // SAFETY: mapped read-write.
    unsafe { ((c + 3 * piece) as *mut u8).write_volatile(0x77) };
    ctx.map(
        c + (2 << 20),
        piece,
        p2,
        3 * piece,
        AccessAttribute::ReadWrite,
    )
    .unwrap();
    assert_eq!(byte(c + (2 << 20)), 0x77);
    assert_eq!(smaps_of(c)["KernelPageSize"], 4);
    // An IPC export: shmem first (an importer may map any piece, and sees this memory).
    let p3 = ctx
        .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, 2 << 20)
        .unwrap();
    let e = res.base + 3 * size;
    ctx.map(e, 2 << 20, p3, 0, AccessAttribute::ReadWrite)
        .unwrap();
    assert_eq!(smaps_of(e)["KernelPageSize"], 2048);
    // SAFETY: mapped read-write.
    unsafe { ((e + 5 * 4096) as *mut u8).write_volatile(0x33) };
    let h = ctx.get_physical_memory_ipc_handle(p3, None).unwrap();
    assert_eq!(smaps_of(e)["KernelPageSize"], 4, "shmem once exported");
    let v = ctx.open_ipc_handle(&h, 0).unwrap();
    assert_eq!(byte(v + 5 * 4096), 0x33);
    // SAFETY: the view is mapped read-write.
    unsafe { ((v + 9 * 4096) as *mut u8).write_volatile(0x44) };
    assert_eq!(
        byte(e + 9 * 4096),
        0x44,
        "the view and the exporter share one memory"
    );
    ctx.close_ipc_handle(v).unwrap();
    ctx.unmap(e, 2 << 20).unwrap();
    ctx.unmap(a, 2 << 20).unwrap();
    ctx.unmap(b, size).unwrap();
    ctx.destroy_physical_memory(phys).unwrap();
    ctx.free_reservation(res).unwrap();
    ctx.destroy_physical_memory(p2).unwrap();
    ctx.put_ipc_handle(&h).ok();
    ctx.destroy_physical_memory(p3).unwrap();
    assert_eq!(
        hugetlb_count("free_hugepages"),
        free,
        "every page back in the pool"
    );
    // More than are free: shmem, never a failure.
    let free = hugetlb_count("free_hugepages");
    if free > 64 {
        loud_once(format!(
            "NOT RUN (host) huge_pages: {free} reserved huge pages are free; the fallback past \
             the pool is not checked"
        ));
        return;
    }
    let big = (free as usize + 1) * (2 << 20);
    let rt = Runtime::builder()
        .host_devices(1)
        .host_device_memory(big as u64 + (64 << 20))
        .host_huge_pages(true)
        .build()
        .unwrap();
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device(0).unwrap();
    let res = ctx.reserve(None, big).unwrap();
    let phys = ctx
        .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, big)
        .unwrap();
    assert_eq!(hugetlb_count("free_hugepages"), free, "none taken");
    ctx.map(res.base, big, phys, 0, AccessAttribute::ReadWrite)
        .unwrap();
    assert_ne!(smaps_of(res.base)["KernelPageSize"], 2048);
    ctx.unmap(res.base, big).unwrap();
    ctx.destroy_physical_memory(phys).unwrap();
    ctx.free_reservation(res).unwrap();
}

/// A managed allocation of `n` pages, filled page by page, moved to device 0 and back by host
/// faults; returns its smaps `KernelPageSize` (kB) and checks every byte and fault count.
fn managed_round_trip(rt: &Runtime, n: usize) -> u64 {
    let ctx = rt.driver().create_context().unwrap();
    let m = ctx.alloc_managed((n * PAGE) as u64, 1).unwrap();
    let kernel_page = smaps_of(m)["KernelPageSize"];
    for i in 0..n {
        ctx.managed_memset(m + i * PAGE, i as u8 + 1, PAGE).unwrap();
    }
    let s = stream(rt, &ctx, 0);
    for round in 0..2 {
        ctx.mem_prefetch(m, n * PAGE, Location::Device(0), 0, &s)
            .unwrap();
        s.synchronize().unwrap();
        let before = rt.driver().managed_stats();
        // Random-ish order on round 1, in order on round 0 (the staging path).
        for k in 0..n {
            let i = if round == 0 { k } else { (k * 5 + 3) % n };
            for off in [0, 4096, PAGE / 2, PAGE - 1] {
                assert_eq!(byte(m + i * PAGE + off), i as u8 + 1, "page {i} +{off:#x}");
            }
        }
        let after = rt.driver().managed_stats();
        assert_eq!(
            after.host_faults - before.host_faults,
            n as u64,
            "round {round}"
        );
        assert_eq!(after.pages_to_host - before.pages_to_host, n as u64);
    }
    // A host write, moved to the device and read back there.
    // SAFETY: inside the live allocation, host-resident now.
    unsafe { ((m + PAGE + 7) as *mut u8).write_volatile(0x77) };
    ctx.mem_prefetch(m, n * PAGE, Location::Device(0), 0, &s)
        .unwrap();
    s.synchronize().unwrap();
    ctx.mem_prefetch(m, n * PAGE, Location::Host, 0, &s)
        .unwrap();
    s.synchronize().unwrap();
    assert_eq!(byte(m + PAGE + 7), 0x77);
    assert_eq!(byte(m + PAGE + 8), 2);
    ctx.free_managed(m).unwrap();
    kernel_page
}

#[test]
fn managed_memory_migrates_on_hugetlbfs_pages_while_reserved_ones_are_free() {
    if host_only() {
        return;
    }
    let _one = SETTINGS.lock();
    let rt_off = runtime(false);
    assert_eq!(managed_round_trip(&rt_off, 4), 4, "huge pages off: 4 KiB");
    let have: u64 = std::fs::read_to_string(NR_HUGEPAGES)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let Some(_pool) = Setting::set(NR_HUGEPAGES, &(have + 6).to_string()) else {
        return;
    };
    let rt = runtime(true);
    let kinds = rt.driver().page_kinds().unwrap();
    assert!(kinds.contains("hugetlbfs"), "{kinds}");
    assert_eq!(
        managed_round_trip(&rt, 4),
        2048,
        "4 pages on 2 MiB hugetlbfs pages"
    );
    // More than are free: 4 KiB pages, never a failure (checked where the pool is small: past
    // 64 free pages the allocation would outgrow the modelled device).
    let free = hugetlb_count("free_hugepages");
    if free > 64 {
        loud_once(format!(
            "NOT RUN (host) huge_pages: {free} reserved huge pages are free; the managed \
             fallback past the pool is not checked"
        ));
        return;
    }
    assert_eq!(
        managed_round_trip(&rt, free as usize + 1),
        4,
        "{} pages with {free} free huge pages fall back to 4 KiB",
        free + 1
    );
}

/// The fd numbers open in this process now (not the one the listing itself used, closed by
/// the time each is checked).
fn open_fds() -> std::collections::BTreeSet<i32> {
    let listed: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|d| d.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    listed
        .into_iter()
        .filter(|n| std::fs::read_link(format!("/proc/self/fd/{n}")).is_ok())
        .collect()
}

/// A split that fails at its last step, the `dup3` that gives the new shmem object the
/// object's fd number (here: `RLIMIT_NOFILE` lowered below that number after the object was
/// made), puts every mapping back on the hugetlbfs object: the call fails with
/// OUT_OF_HOST_MEMORY naming the limit, and nothing changed (the protection, the page kind,
/// and one object behind every mapping, old and new). With the limit back, the same call
/// splits.
#[test]
fn a_split_refused_at_its_dup3_leaves_every_mapping_on_the_object() {
    if host_only() {
        return;
    }
    let _one = SETTINGS.lock();
    let have = hugetlb_count("nr_hugepages");
    let Some(_pool) = Setting::set(NR_HUGEPAGES, &(have + 4).to_string()) else {
        return;
    };
    let free = hugetlb_count("free_hugepages");
    if free < 2 {
        loud_once(format!(
            "NOT RUN (host) huge_pages: only {free} reserved huge pages free after asking for 4 \
             more; the failed split is not checked"
        ));
        return;
    }
    let rt = runtime(true);
    let ctx = rt.driver().create_context().unwrap();
    let dev = rt.driver().device(0).unwrap();
    let huge = 2 << 20;
    let res = ctx.reserve(None, 3 * huge).unwrap();
    let (a, b, c) = (res.base, res.base + huge, res.base + 2 * huge);
    // A free number below the object's, for the split's new memfd.
    let spare = std::fs::File::open("/dev/null").unwrap();
    let before = open_fds();
    let phys = ctx
        .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, huge)
        .unwrap();
    let made: Vec<i32> = open_fds().difference(&before).copied().collect();
    assert_eq!(made.len(), 1, "the object's one fd: {made:?}");
    let object_fd = made[0];
    ctx.map(a, huge, phys, 0, AccessAttribute::ReadWrite)
        .unwrap();
    ctx.map(b, huge, phys, 0, AccessAttribute::ReadWrite)
        .unwrap();
    assert_eq!(smaps_of(a)["KernelPageSize"], 2048, "hugetlbfs");
    for off in (0..huge).step_by(4096) {
        // SAFETY: mapped read-write just above.
        unsafe { ((a + off) as *mut u8).write_volatile((off / 4096) as u8 | 1) };
    }
    drop(spare);
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(object_fd as u64),
            maximum: lim.maximum,
        },
    )
    .unwrap();
    let piece = 64 << 10;
    let refused = ctx.set_access_attribute(a + piece, piece, AccessAttribute::ReadOnly);
    rustix::process::setrlimit(rustix::process::Resource::Nofile, lim).unwrap();
    let e = refused.expect_err("the split's dup3 onto a number past the limit");
    assert_eq!(e.ze_result(), common::ze::OUT_OF_HOST_MEMORY, "{e}");
    assert!(e.message().contains("RLIMIT_NOFILE"), "{e}");
    assert_eq!(
        ctx.get_access_attribute(a + piece, piece).unwrap().0,
        AccessAttribute::ReadWrite
    );
    assert_eq!(perms_of(a + piece), "rw-s");
    for at in [a, b] {
        assert_eq!(
            smaps_of(at)["KernelPageSize"],
            2048,
            "still hugetlbfs at {at:#x}"
        );
    }
    // One object behind every mapping: the old two and one made now.
    // SAFETY: mapped read-write.
    unsafe { ((a + 7 * 4096) as *mut u8).write_volatile(0x5a) };
    ctx.map(c, huge, phys, 0, AccessAttribute::ReadWrite)
        .unwrap();
    for at in [b, c] {
        assert_eq!(
            byte(at + 7 * 4096),
            0x5a,
            "the write through a, seen at {at:#x}"
        );
        assert_eq!(byte(at + 9 * 4096), 9 | 1);
    }
    // With the limit back the same call splits, every mapping in place.
    ctx.set_access_attribute(a + piece, piece, AccessAttribute::ReadOnly)
        .unwrap();
    assert_eq!(perms_of(a + piece), "r--s");
    for at in [a, b, c] {
        assert_eq!(smaps_of(at)["KernelPageSize"], 4, "shmem at {at:#x}");
        assert_eq!(byte(at + 7 * 4096), 0x5a);
    }
    // SAFETY: mapped read-write.
    unsafe { (c as *mut u8).write_volatile(0x66) };
    assert_eq!(byte(a), 0x66, "one object after the split");
    for at in [a, b, c] {
        ctx.unmap(at, huge).unwrap();
    }
    ctx.destroy_physical_memory(phys).unwrap();
    ctx.free_reservation(res).unwrap();
    assert_eq!(
        hugetlb_count("free_hugepages"),
        free,
        "its page back in the pool"
    );
}
