//! Which page kind the host backend uses for 2 MiB-and-larger memory, and why.
//!
//! A 2 MiB page mapped in 4 KiB pages costs 512 page-table entries on every map and unmap
//! (about 170 us for a populated object on the project's 2-core VM), one 2 MiB entry costs one
//! (about 13-15 us). The host backend takes 2 MiB pages where the machine offers them:
//!
//! - **Physical objects** (`zePhysicalMemCreate`) of 2 MiB multiples are hugetlbfs memfds
//!   where reserved huge pages (`vm.nr_hugepages`) are free for the whole object, one PMD entry
//!   per 2 MiB mapped; the first use of a piece of one (or its IPC export) makes it shmem
//!   ([`super::hugetlb`]). Other objects are memfds (shmem), mapped in pieces of any base-page
//!   multiple as before; where shmem transparent huge pages are enabled for 2 MiB
//!   (`/sys/kernel/mm/transparent_hugepage/shmem_enabled`, or its `hugepages-2048kB` override,
//!   set to `always`, `within_size`, `advise` or `force`), a map whose address and object
//!   offset are 2 MiB-aligned and that covers at least one 2 MiB page is made with
//!   `madvise(MADV_HUGEPAGE)` and populated by `madvise(MADV_POPULATE_READ)` instead of
//!   `MAP_POPULATE`, so the kernel allocates and maps the object's memory in 2 MiB folios (one
//!   PMD entry each). Where no 2 MiB folio is free the kernel uses 4 KiB pages: no map fails
//!   for it.
//! - **Managed memory**: the host backing of a managed allocation (whose pages are always
//!   whole 2 MiB units) is a hugetlbfs memfd (`memfd_create(MFD_HUGETLB | MFD_HUGE_2MB)`)
//!   where reserved huge pages (`vm.nr_hugepages`) are free for the whole allocation, so a
//!   migration's install is one `UFFDIO_CONTINUE` of one 2 MiB entry; otherwise shmem as before
//!   (the allocation never fails for it).
//!
//! `HETMEM_HOST_HUGE_PAGES=off` (or `RuntimeBuilder::host_huge_pages(false)`) keeps every page
//! at 4 KiB whatever the machine offers.

use crate::backend::Result;

/// 2 MiB: the huge page size the host backend uses.
pub(crate) const HUGE: usize = 2 << 20;

/// What the machine offers and what the backend takes of it (read once, at start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HugePages {
    /// Huge pages are allowed by the configuration.
    pub(crate) allowed: bool,
    /// The effective shmem THP mode for 2 MiB folios (`never` when unreadable).
    pub(crate) shmem_thp: String,
    /// `vm.nr_hugepages` (2 MiB) and how many of them were free at start.
    pub(crate) hugetlb_total: u64,
    pub(crate) hugetlb_free: u64,
}

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The selected value of a sysfs choice file (`a [b] c` -> `b`).
fn selected(s: &str) -> Option<String> {
    let a = s.find('[')?;
    let b = s[a..].find(']')?;
    Some(s[a + 1..a + b].to_string())
}

const THP: &str = "/sys/kernel/mm/transparent_hugepage";
const HUGETLB: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";

/// The effective shmem THP mode for 2 MiB folios: the `hugepages-2048kB` override unless it is
/// `inherit`, else the global `shmem_enabled`.
pub(crate) fn shmem_thp_mode() -> String {
    let per =
        read_trim(&format!("{THP}/hugepages-2048kB/shmem_enabled")).and_then(|s| selected(&s));
    match per.as_deref() {
        Some(m) if m != "inherit" => m.to_string(),
        _ => read_trim(&format!("{THP}/shmem_enabled"))
            .and_then(|s| selected(&s))
            .unwrap_or_else(|| "never".into()),
    }
}

/// `(nr_hugepages, free_hugepages)` of the 2 MiB hugetlb pool (0 where there is none).
pub(crate) fn hugetlb_counts() -> (u64, u64) {
    let n = |f: &str| {
        read_trim(&format!("{HUGETLB}/{f}"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    };
    (n("nr_hugepages"), n("free_hugepages"))
}

impl HugePages {
    /// Reads the machine's settings.
    pub(crate) fn probe(allowed: bool) -> HugePages {
        let (hugetlb_total, hugetlb_free) = hugetlb_counts();
        HugePages {
            allowed,
            shmem_thp: shmem_thp_mode(),
            hugetlb_total,
            hugetlb_free,
        }
    }

    /// Physical objects are mapped with `MADV_HUGEPAGE` (shmem THP enabled for 2 MiB).
    pub(crate) fn thp_maps(&self) -> bool {
        self.allowed
            && matches!(
                self.shmem_thp.as_str(),
                "always" | "within_size" | "advise" | "force"
            )
    }

    /// Managed backings try hugetlbfs first (reserved huge pages exist).
    pub(crate) fn hugetlb_managed(&self) -> bool {
        self.allowed && self.hugetlb_total > 0
    }

    /// Physical objects of 2 MiB multiples try hugetlbfs first (reserved huge pages exist;
    /// [`super::hugetlb`]).
    pub(crate) fn hugetlb_objects(&self) -> bool {
        self.allowed && self.hugetlb_total > 0
    }

    /// One line for `hetmem info`: which page kind each kind of memory uses, and why.
    pub(crate) fn describe(&self) -> String {
        if !self.allowed {
            return "4 KiB pages for all memory (HETMEM_HOST_HUGE_PAGES=off)".into();
        }
        let rest = if self.thp_maps() {
            format!(
                "2 MiB shmem THP folios where a map is 2 MiB-aligned (shmem_enabled={}; 4 KiB \
                 where none is free)",
                self.shmem_thp
            )
        } else {
            format!(
                "4 KiB pages (shmem THP for 2 MiB is {}: set \
                 /sys/kernel/mm/transparent_hugepage/shmem_enabled to advise for 2 MiB folios)",
                self.shmem_thp
            )
        };
        let phys = if self.hugetlb_objects() {
            format!(
                "physical objects: 2 MiB hugetlbfs pages for sizes of 2 MiB multiples while \
                 reserved ones are free (vm.nr_hugepages={}, {} free at start; an object \
                 becomes shmem at the first use of a piece of it or its IPC export), else {rest}",
                self.hugetlb_total, self.hugetlb_free
            )
        } else {
            format!("physical objects: {rest}")
        };
        let managed = if self.hugetlb_managed() {
            format!(
                "managed memory: 2 MiB hugetlbfs pages while reserved ones are free \
                 (vm.nr_hugepages={}, {} free at start; 4 KiB shmem otherwise)",
                self.hugetlb_total, self.hugetlb_free
            )
        } else {
            "managed memory: 4 KiB pages (vm.nr_hugepages=0: no reserved 2 MiB pages)".into()
        };
        format!("{phys}; {managed}")
    }
}

/// Maps `[offset, offset+size)` of `fd` at `addr` with `prot` in 2 MiB folios where the kernel
/// has them: `mmap(MAP_SHARED | MAP_FIXED)` (no populate), `madvise(MADV_HUGEPAGE)`, then
/// `madvise(MADV_POPULATE_READ)` to fill the page table in the call as `MAP_POPULATE` would.
/// A failed populate (no memory) is not an error, as with `MAP_POPULATE`: the pages then fault
/// in on first touch.
///
/// # Safety
/// As [`super::map_shared_fixed`].
pub(crate) unsafe fn map_huge(
    addr: usize,
    size: usize,
    prot: rustix::mm::ProtFlags,
    fd: std::os::fd::BorrowedFd<'_>,
    offset: u64,
) -> rustix::io::Result<()> {
    use rustix::mm::{madvise, Advice, MapFlags};
    // SAFETY: forwarded contract.
    unsafe { super::map_shared_fixed(addr, size, prot, MapFlags::empty(), fd, offset)? };
    // SAFETY: our own fresh mapping.
    unsafe {
        madvise(addr as *mut _, size, Advice::LinuxHugepage).ok();
        madvise(addr as *mut _, size, Advice::LinuxPopulateRead).ok();
    }
    Ok(())
}

/// A hugetlbfs memfd of `size` bytes (a multiple of 2 MiB):
/// `memfd_create(MFD_CLOEXEC | MFD_HUGETLB | MFD_HUGE_2MB)`, `ftruncate`. Its pages are
/// reserved by the first shared mapping (which fails with `ENOMEM` when too few are free).
pub(crate) fn hugetlb_memfd(name: &str, size: u64) -> Result<std::os::fd::OwnedFd> {
    use rustix::fs::MemfdFlags;
    let fd = rustix::fs::memfd_create(
        name,
        MemfdFlags::CLOEXEC | MemfdFlags::HUGETLB | MemfdFlags::HUGE_2MB,
    )
    .map_err(|e| super::os_error("memfd_create(MFD_HUGETLB | MFD_HUGE_2MB)", e))?;
    rustix::fs::ftruncate(&fd, size)
        .map_err(|e| super::os_error("ftruncate(hugetlbfs memfd)", e))?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selected_choice_is_the_bracketed_one() {
        assert_eq!(
            selected("always within_size advise [never] deny force").as_deref(),
            Some("never")
        );
        assert_eq!(
            selected("always [inherit] within_size advise never").as_deref(),
            Some("inherit")
        );
        assert_eq!(selected("none"), None);
    }

    #[test]
    fn off_uses_no_huge_pages_whatever_the_machine() {
        let h = HugePages {
            allowed: false,
            shmem_thp: "always".into(),
            hugetlb_total: 10,
            hugetlb_free: 10,
        };
        assert!(!h.thp_maps() && !h.hugetlb_managed());
        assert!(
            h.describe().contains("HETMEM_HOST_HUGE_PAGES=off"),
            "{}",
            h.describe()
        );
        let on = HugePages { allowed: true, ..h };
        assert!(on.thp_maps() && on.hugetlb_managed());
        let never = HugePages {
            shmem_thp: "never".into(),
            hugetlb_total: 0,
            ..on
        };
        assert!(!never.thp_maps() && !never.hugetlb_managed());
        assert!(
            never.describe().contains("vm.nr_hugepages=0"),
            "{}",
            never.describe()
        );
    }
}
