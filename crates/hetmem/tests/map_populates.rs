//! On the host backend a readable map fills the page table of its whole range in the call
//! (`MAP_POPULATE`): the mapping is resident before anything touches it, so first accesses do not
//! fault. A map with access NONE populates nothing. Checked with the kernel's own count of the
//! mapping's resident pages (`Rss` in `/proc/self/smaps`, with `*_Hugetlb` for reserved huge
//! pages). An IPC view is the exception: its
//! page table fills on first touch (it shows memory its exporter owns).

mod common;

/// Why this file runs on the host backend only.
const HOST_ONLY: &str =
    "it checks that a readable map populates the page table of its host VMA (MAP_POPULATE, Rss \
     in /proc/self/smaps); on cuda device memory is mapped by cuMemMap in the GPU's page \
     tables, makes no host VMA and cannot be touched by the host";

use hetmem::{AccessAttribute, PhysicalMemoryFlags, Runtime};

/// `Rss` in KiB of the mapping (VMA) that starts at `addr`, from `/proc/self/smaps`.
fn rss_kib(addr: usize) -> Option<u64> {
    // Pages of a hugetlbfs object (reserved huge pages) count as `Shared_Hugetlb` /
    // `Private_Hugetlb`, not `Rss`.
    smaps_kib(addr, &["Rss:", "Shared_Hugetlb:", "Private_Hugetlb:"])
}

/// The sum of `fields` (kB) of the mapping starting at `addr` in `/proc/self/smaps`: the fields
/// after its header line, up to its `VmFlags:` (each entry's last).
fn smaps_kib(addr: usize, fields: &[&str]) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let head = format!("{addr:x}-");
    let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head));
    lines.next()?;
    let kib = |v: &str| -> u64 { v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0) };
    let mut total = 0;
    for l in lines.take_while(|l| !l.starts_with("VmFlags:")) {
        for f in fields {
            if let Some(v) = l.strip_prefix(f) {
                total += kib(v);
            }
        }
    }
    Some(total)
}

#[test]
fn readable_map_is_resident_at_once_and_access_none_is_not() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let rt = Runtime::builder()
        .host_devices(1)
        .host_device_memory(64 << 20)
        .build()
        .unwrap();
    let dev = rt.driver().device(0).unwrap();
    let ctx = rt.driver().create_context().unwrap();
    let page = ctx.query_page_size(&dev, 2 << 20).unwrap();
    assert_eq!(page, 2 << 20);
    let r = ctx.reserve(None, 3 * page).unwrap();
    let objs: Vec<_> = (0..3)
        .map(|_| {
            ctx.create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, page)
                .unwrap()
        })
        .collect();
    let kib = (page / 1024) as u64;
    for (i, access) in [
        AccessAttribute::ReadWrite,
        AccessAttribute::ReadOnly,
        AccessAttribute::None,
    ]
    .into_iter()
    .enumerate()
    {
        let a = r.base + i * page;
        ctx.map(a, page, objs[i], 0, access).unwrap();
        let want = if access == AccessAttribute::None {
            0
        } else {
            kib
        };
        assert_eq!(
            rss_kib(a),
            Some(want),
            "resident KiB of a fresh {access:?} mapping at {a:#x}"
        );
    }
    // Written data is there, and a remap of the same object finds it resident again.
    // SAFETY: the first page is mapped read-write and only this test uses it.
    unsafe { (r.base as *mut u64).write_volatile(0x5eed) };
    ctx.unmap(r.base, page).unwrap();
    ctx.map(r.base, page, objs[0], 0, AccessAttribute::ReadWrite)
        .unwrap();
    assert_eq!(rss_kib(r.base), Some(kib));
    // SAFETY: as above.
    assert_eq!(unsafe { (r.base as *const u64).read_volatile() }, 0x5eed);
    ctx.free_reservation(r).unwrap();
    for p in objs {
        ctx.destroy_physical_memory(p).unwrap();
    }
}

/// An IPC view is mapped without filling its page table (`Backend::map_view`): right after open
/// nothing of the view's mapping is resident, although the exported memory is (the exporter's
/// readable map populated it); each page comes in on first touch with the exporter's data, and
/// a write through the view reaches the exporter's mapping.
#[test]
fn an_ipc_view_fills_its_page_table_on_first_touch_not_at_open() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let rt = Runtime::builder()
        .host_devices(1)
        .host_device_memory(64 << 20)
        .build()
        .unwrap();
    let dev = rt.driver().device(0).unwrap();
    let ctx = rt.driver().create_context().unwrap();
    let page = ctx.query_page_size(&dev, 2 << 20).unwrap();
    let kib = (page / 1024) as u64;
    let r = ctx.reserve(None, page).unwrap();
    let obj = ctx
        .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, page)
        .unwrap();
    ctx.map(r.base, page, obj, 0, AccessAttribute::ReadWrite)
        .unwrap();
    assert_eq!(rss_kib(r.base), Some(kib), "the exporter's map is resident");
    let words = page / 4096;
    for i in 0..words {
        // SAFETY: mapped read-write, only this test uses it.
        unsafe { ((r.base + i * 4096) as *mut u64).write_volatile(0x5eed_0000 + i as u64) };
    }
    let h = ctx.get_physical_memory_ipc_handle(obj, None).unwrap();
    let v = ctx.open_ipc_handle(&h, 0).unwrap();
    assert_eq!(
        rss_kib(v),
        Some(0),
        "a fresh view at {v:#x} is not populated"
    );
    for i in [0, 100, words - 1] {
        // SAFETY: the view is mapped read-write for `page` bytes.
        let got = unsafe { ((v + i * 4096) as *const u64).read_volatile() };
        assert_eq!(got, 0x5eed_0000 + i as u64, "page {i} of the view");
    }
    let touched = rss_kib(v).unwrap();
    // Where the exporter's memory is one 2 MiB shmem THP folio (shmem THP enabled), the first
    // touch maps all of it with one entry.
    let pmd = smaps_kib(v, &["ShmemPmdMapped:", "FilePmdMapped:"]).unwrap();
    assert!(
        touched > 0 && (touched < kib || pmd == kib),
        "after touching 3 pages the view has {touched} KiB resident (of {kib}; {pmd} KiB \
         PMD-mapped)"
    );
    // SAFETY: as above.
    unsafe { ((v + 200 * 4096) as *mut u64).write_volatile(0xfeed) };
    // SAFETY: the exporter's mapping of the same memory.
    assert_eq!(
        unsafe { ((r.base + 200 * 4096) as *const u64).read_volatile() },
        0xfeed
    );
    ctx.close_ipc_handle(v).unwrap();
    ctx.put_ipc_handle(&h).unwrap();
    ctx.free_reservation(r).unwrap();
    ctx.destroy_physical_memory(obj).unwrap();
}
