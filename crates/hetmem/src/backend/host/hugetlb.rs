//! Physical objects on reserved hugetlbfs pages, and the split that a piece of one needs.
//!
//! Where `vm.nr_hugepages` has free 2 MiB pages, a physical object whose size is a multiple of
//! 2 MiB is a hugetlbfs memfd ([`create`](HugetlbObjects::create): `memfd_create(MFD_HUGETLB |
//! MFD_HUGE_2MB | MFD_ALLOW_SEALING)`, `ftruncate`, `fallocate` of the whole size, the seals of
//! every object); where too few are free, `fallocate` fails and the object is a shmem memfd as
//! before (no creation fails for it). Reserved pages stay reserved when an object goes: the next
//! object takes them again, already backed by the machine. Shmem THP folios go back to the page
//! allocator, and a virtual machine that reports free memory to its host (the project's VM does)
//! pays its host again for every fresh one (4.4-7 ms per 2 MiB measured there, against 0.1-0.4
//! ms for a reserved page used before; `hetmem demo`'s KV scene spends nearly all its time so).
//!
//! A hugetlbfs mapping maps, unmaps and protects whole 2 MiB pages only; the specification lets
//! any base-page piece (64 KiB) of an object be mapped, unmapped and protected. So the first
//! operation that needs a piece of a hugetlbfs object **splits** it, once: a map of a piece of
//! it, an unmap or protect that cuts one of its mappings inside a 2 MiB page, or an IPC export
//! (an importer may map a piece, and sees this memory ever after). The split copies its bytes
//! into a new sealed shmem memfd, makes every mapping of it again at the same addresses with the
//! same protection from the new memfd (`mmap(MAP_FIXED | MAP_POPULATE)`), and gives the new
//! memfd the object's fd number (`dup3`), so the semantics layer's handle stays valid; from then
//! on the object is shmem like any other. A split costs a copy of the object and a map per
//! mapping of it; if one of them fails (no memory), the mappings made so far go back to the
//! hugetlbfs object and the call fails with nothing changed.
//!
//! For that the backend keeps the mappings of its hugetlbfs objects, with their protections,
//! under one lock; while no hugetlbfs object is live, map, unmap, protect and release look at
//! one atomic and nothing else.
//!
//! A split is not atomic for a thread writing the object through one of its mappings while
//! another thread's call splits it (a host thread, or a device engine's worker thread): such a
//! write can be lost, as in the cuda backend's split of host memory.

use std::collections::BTreeMap;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use rustix::mm::{MapFlags, ProtFlags};

use super::{map_shared_fixed, os_error, prot_flags, sealed_memfd};
use crate::backend::{Protection, Result};

/// 2 MiB: the hugetlbfs page.
const HUGE: usize = super::huge::HUGE;

/// A mapping (or the part of one with one protection) of a hugetlbfs object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    end: usize,
    fd: i32,
    /// Offset in the object of the piece's start.
    offset: usize,
    prot: Protection,
}

#[derive(Debug, Default)]
struct State {
    /// Live hugetlbfs objects: fd number -> size.
    objects: BTreeMap<i32, usize>,
    /// Their mappings by start address (never overlapping).
    pieces: BTreeMap<usize, Piece>,
}

/// The host backend's hugetlbfs objects and their mappings (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct HugetlbObjects {
    /// Live hugetlbfs objects; 0: nothing to look up.
    live: AtomicUsize,
    state: Mutex<State>,
}

/// Whether `a` cuts `[s, e)` at a point that is not a 2 MiB boundary.
fn cuts(s: usize, e: usize, a: usize) -> bool {
    s < a && a < e && !a.is_multiple_of(HUGE)
}

/// The populate flag of a map with `prot` (none for an inaccessible one, as every map).
fn populate(prot: Protection) -> MapFlags {
    if prot == Protection::None {
        MapFlags::empty()
    } else {
        MapFlags::POPULATE
    }
}

impl State {
    /// The piece with the last start before `b`: the only one that can reach into `[a, b)`
    /// from its end (pieces never overlap), so none overlaps `[a, b)` unless it ends past `a`.
    fn last_before(&self, b: usize) -> Option<(usize, Piece)> {
        self.pieces.range(..b).next_back().map(|(&s, &p)| (s, p))
    }

    /// Starts of the pieces overlapping `[a, b)`.
    fn overlapping(&self, a: usize, b: usize) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .pieces
            .range(..a)
            .next_back()
            .filter(|(_, p)| p.end > a)
            .map(|(&s, _)| s)
            .into_iter()
            .collect();
        v.extend(self.pieces.range(a..b).map(|(&s, _)| s));
        v
    }

    /// Cuts the pieces at `at` (a 2 MiB boundary or a piece's edge), so that no piece spans it.
    fn cut_at(&mut self, at: usize) {
        let Some((&s, &p)) = self.pieces.range(..at).next_back() else {
            return;
        };
        if p.end > at {
            self.pieces.insert(s, Piece { end: at, ..p });
            self.pieces.insert(
                at,
                Piece {
                    offset: p.offset + (at - s),
                    ..p
                },
            );
        }
    }

    /// Forgets the pieces inside `[a, b)`, cutting those that stick out.
    fn forget(&mut self, a: usize, b: usize) {
        self.cut_at(a);
        self.cut_at(b);
        for s in self.overlapping(a, b) {
            self.pieces.remove(&s);
        }
    }

    /// Objects with a piece that `[a, b)` cuts inside a 2 MiB page.
    fn cut_objects(&self, a: usize, b: usize) -> Vec<i32> {
        let mut fds: Vec<i32> = self
            .overlapping(a, b)
            .into_iter()
            .filter_map(|s| {
                let p = self.pieces[&s];
                (cuts(s, p.end, a) || cuts(s, p.end, b)).then_some(p.fd)
            })
            .collect();
        fds.sort_unstable();
        fds.dedup();
        fds
    }
}

impl HugetlbObjects {
    /// A hugetlbfs object of `size` bytes (a multiple of 2 MiB), its pages allocated now, or
    /// `None` where too few reserved pages are free (or hugetlbfs refuses): the caller makes a
    /// shmem object then. `memfd_create(MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB |
    /// MFD_HUGE_2MB)`, `ftruncate`, `fallocate(0, size)`, `fcntl(F_ADD_SEALS, F_SEAL_GROW |
    /// F_SEAL_SHRINK | F_SEAL_SEAL)`.
    pub(crate) fn create(&self, size: usize) -> Option<OwnedFd> {
        use rustix::fs::{FallocateFlags, MemfdFlags, SealFlags};
        debug_assert!(size.is_multiple_of(HUGE) && size > 0);
        // Past RLIMIT_FSIZE, ftruncate would kill the process: the shmem path refuses it.
        super::check_file_size(size as u64).ok()?;
        let fd = rustix::fs::memfd_create(
            "hetmem-physical-huge",
            MemfdFlags::CLOEXEC
                | MemfdFlags::ALLOW_SEALING
                | MemfdFlags::HUGETLB
                | MemfdFlags::HUGE_2MB,
        )
        .ok()?;
        rustix::fs::ftruncate(&fd, size as u64).ok()?;
        // Allocates every page now: a later map never finds the pool empty (and never takes
        // SIGBUS on a touch), and an object that cannot have them all is shmem from the start.
        rustix::fs::fallocate(&fd, FallocateFlags::empty(), 0, size as u64).ok()?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL)
            .ok()?;
        use std::os::fd::AsRawFd;
        let mut st = self.state.lock();
        st.objects.insert(fd.as_raw_fd(), size);
        self.live.fetch_add(1, Ordering::Relaxed);
        Some(fd)
    }

    /// Forgets object `fd` before it is closed (it is mapped nowhere).
    pub(crate) fn destroyed(&self, fd: i32) {
        if self.live.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut st = self.state.lock();
        if st.objects.remove(&fd).is_some() {
            self.live.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Whether any hugetlbfs object is live (the atomic only).
    fn any(&self) -> bool {
        self.live.load(Ordering::Relaxed) != 0
    }

    /// Maps `[offset, offset+size)` of object `fd` at `addr` if it is a hugetlbfs object and
    /// the map is whole 2 MiB pages: `Some(result)`. `None`: a shmem object, to be mapped as
    /// such (a hugetlbfs object that a piece map needs is split first; a failed split is
    /// `Some(Err)`).
    ///
    /// # Safety
    /// As [`crate::backend::Backend::map`].
    pub(crate) unsafe fn map(
        &self,
        addr: usize,
        size: usize,
        fd: BorrowedFd<'_>,
        offset: usize,
        prot: Protection,
    ) -> Option<Result<()>> {
        use std::os::fd::AsRawFd;
        if !self.any() {
            return None;
        }
        let n = fd.as_raw_fd();
        let mut st = self.state.lock();
        st.objects.get(&n)?;
        if !(addr.is_multiple_of(HUGE) && size.is_multiple_of(HUGE) && offset.is_multiple_of(HUGE))
        {
            // SAFETY: forwarded contract (the lock is held).
            return match unsafe { self.split(&mut st, n) } {
                Ok(()) => None,
                Err(e) => Some(Err(e)),
            };
        }
        // SAFETY: [addr, addr+size) is an unmapped part of one of our reservations.
        let r = unsafe {
            map_shared_fixed(
                addr,
                size,
                prot_flags(prot),
                populate(prot),
                fd,
                offset as u64,
            )
        };
        Some(match r {
            Ok(()) => {
                st.pieces.insert(
                    addr,
                    Piece {
                        end: addr + size,
                        fd: n,
                        offset,
                        prot,
                    },
                );
                Ok(())
            }
            Err(e) => {
                // SAFETY: same range, still ours.
                unsafe { super::restore_placeholder(addr, size).ok() };
                Err(os_error(
                    "mmap(MAP_FIXED) of a hugetlbfs physical object",
                    e,
                ))
            }
        })
    }

    /// Runs `op` (an unmap or a protect of `[addr, addr+size)`, to `prot` for a protect), after
    /// splitting every hugetlbfs object one of whose mappings the range cuts inside a 2 MiB
    /// page, and records what it did to the mappings of hugetlbfs objects.
    ///
    /// # Safety
    /// Every page of the range is mapped; `op` changes only the range.
    pub(crate) unsafe fn change(
        &self,
        addr: usize,
        size: usize,
        prot: Option<Protection>,
        op: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        if !self.any() {
            return op();
        }
        let end = addr + size;
        let mut st = self.state.lock();
        let (s, p) = match st.last_before(end) {
            Some(last) if last.1.end > addr => last,
            _ => {
                // No mapping of a hugetlbfs object here, and none can appear while the range
                // stays mapped (a split only removes them): the lock is not needed.
                drop(st);
                return op();
            }
        };
        if s == addr && p.end == end {
            // Exactly one piece (a page unmapped or protected whole): nothing to cut.
            op()?;
            match prot {
                None => {
                    st.pieces.remove(&s);
                }
                Some(prot) => {
                    st.pieces.insert(s, Piece { prot, ..p });
                }
            }
            return Ok(());
        }
        for fd in st.cut_objects(addr, end) {
            // SAFETY: forwarded contract (the lock is held).
            unsafe { self.split(&mut st, fd)? };
        }
        op()?;
        match prot {
            None => st.forget(addr, end),
            Some(prot) => {
                st.cut_at(addr);
                st.cut_at(end);
                for s in st.overlapping(addr, end) {
                    st.pieces.get_mut(&s).expect("listed").prot = prot;
                }
            }
        }
        Ok(())
    }

    /// Runs `op` (the release of the reservation `[addr, addr+size)` with what is mapped in
    /// it) and forgets the mappings inside.
    pub(crate) fn release(
        &self,
        addr: usize,
        size: usize,
        op: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        if !self.any() {
            return op();
        }
        let mut st = self.state.lock();
        if st
            .last_before(addr + size)
            .is_none_or(|(_, p)| p.end <= addr)
        {
            drop(st);
            return op();
        }
        op()?;
        st.forget(addr, addr + size);
        Ok(())
    }

    /// An IPC export of object `fd`: split first if it is a hugetlbfs object (the importer may
    /// map any piece of it, and both processes must see one memory ever after).
    pub(crate) fn before_export(&self, fd: i32) -> Result<()> {
        if !self.any() {
            return Ok(());
        }
        let mut st = self.state.lock();
        if st.objects.contains_key(&fd) {
            // SAFETY: the object's mappings are all recorded (the lock is held).
            unsafe { self.split(&mut st, fd)? };
        }
        Ok(())
    }

    /// Splits hugetlbfs object `fd` (see the module docs): its bytes into a new sealed shmem
    /// memfd (`mmap` of both, a copy, `munmap`), every recorded mapping made again from it
    /// (`mmap(MAP_SHARED | MAP_FIXED [| MAP_POPULATE])`), then `dup3` of it onto `fd`. On
    /// failure of a map or of the `dup3` the mappings already made again are made from `fd` as
    /// before, and nothing has changed.
    ///
    /// # Safety
    /// Called with the lock held (`st`); every mapping of the object is recorded in `st`.
    unsafe fn split(&self, st: &mut State, fd: i32) -> Result<()> {
        let size = st.objects[&fd];
        // SAFETY: a live object's fd, owned by the semantics layer while we hold the lock.
        let old = unsafe { BorrowedFd::borrow_raw(fd) };
        let new = sealed_memfd(size)?;
        // SAFETY: fresh mappings chosen by the kernel of the two objects' whole sizes; the
        // source is read while the destination, ours alone, is written.
        unsafe {
            let src = rustix::mm::mmap(
                std::ptr::null_mut(),
                size,
                ProtFlags::READ,
                MapFlags::SHARED,
                old,
                0,
            )
            .map_err(|e| os_error("mmap of a hugetlbfs object to split it", e))?;
            let dst = match rustix::mm::mmap(
                std::ptr::null_mut(),
                size,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &new,
                0,
            ) {
                Ok(d) => d,
                Err(e) => {
                    rustix::mm::munmap(src, size).ok();
                    return Err(os_error("mmap of a split's shmem object", e));
                }
            };
            hetmem_linux::copy::stream_copy(dst as usize, src as usize, size);
            rustix::mm::munmap(src, size).ok();
            rustix::mm::munmap(dst, size).ok();
        }
        let mine: Vec<(usize, Piece)> = st
            .pieces
            .iter()
            .filter(|(_, p)| p.fd == fd)
            .map(|(&s, &p)| (s, p))
            .collect();
        // Makes `done`'s mappings from the hugetlbfs object again, as they were. Its pages are
        // the object's own (allocated by its fallocate), so only page tables are asked for.
        let restore = |done: &[(usize, Piece)]| {
            for &(s, p) in done {
                // SAFETY: [s, p.end) is a recorded mapping of the object, whole 2 MiB pages;
                // MAP_FIXED replaces what the split made there.
                let r = unsafe {
                    map_shared_fixed(
                        s,
                        p.end - s,
                        prot_flags(p.prot),
                        populate(p.prot),
                        old,
                        p.offset as u64,
                    )
                };
                if let Err(e) = r {
                    tracing::error!(
                        addr = s,
                        "host: a failed split could not map its hugetlbfs object back ({e}); \
                         the mapping shows the unfinished shmem copy"
                    );
                }
            }
        };
        for (k, &(s, p)) in mine.iter().enumerate() {
            // SAFETY: [s, p.end) is a recorded mapping of the object; MAP_FIXED replaces it.
            let r = unsafe {
                map_shared_fixed(
                    s,
                    p.end - s,
                    prot_flags(p.prot),
                    populate(p.prot),
                    new.as_fd(),
                    p.offset as u64,
                )
            };
            if let Err(e) = r {
                restore(&mine[..=k]);
                return Err(os_error(
                    "mmap(MAP_FIXED) while splitting a hugetlbfs object",
                    e,
                ));
            }
        }
        // SAFETY: `fd` is the object's number, owned by the semantics layer; dup3 replaces the
        // file it names atomically and the number stays theirs (never closed here).
        let mut target = ManuallyDrop::new(unsafe { OwnedFd::from_raw_fd(fd) });
        if let Err(e) = rustix::io::dup3(&new, &mut target, rustix::io::DupFlags::CLOEXEC) {
            // Every mapping goes back to the object the number still names.
            restore(&mine);
            // Both numbers are open, so EBADF means that `fd` is at or past RLIMIT_NOFILE
            // (lowered since the object was made).
            let e = if e == rustix::io::Errno::BADF {
                rustix::io::Errno::MFILE
            } else {
                e
            };
            return Err(os_error(
                &format!("dup3 of a split's shmem object onto the object's fd {fd}"),
                e,
            ));
        }
        for (s, _) in mine {
            st.pieces.remove(&s);
        }
        st.objects.remove(&fd);
        self.live.fetch_sub(1, Ordering::Relaxed);
        tracing::debug!(
            fd,
            size,
            "host: split a hugetlbfs physical object into shmem"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(end: usize, fd: i32, offset: usize) -> Piece {
        Piece {
            end,
            fd,
            offset,
            prot: Protection::ReadWrite,
        }
    }

    #[test]
    fn a_range_cuts_a_piece_only_inside_it_and_off_a_2mib_boundary() {
        let (s, e) = (4 * HUGE, 8 * HUGE);
        assert!(!cuts(s, e, s) && !cuts(s, e, e), "its edges");
        assert!(!cuts(s, e, 5 * HUGE), "a 2 MiB boundary inside");
        assert!(cuts(s, e, 5 * HUGE + (64 << 10)), "64 KiB into a page");
        assert!(
            !cuts(s, e, 3 * HUGE + 4096) && !cuts(s, e, 9 * HUGE + 4096),
            "outside"
        );
    }

    #[test]
    fn cutting_and_forgetting_keep_the_offsets_of_what_is_left() {
        let mut st = State::default();
        st.pieces.insert(0, piece(4 * HUGE, 7, 2 * HUGE));
        st.pieces.insert(6 * HUGE, piece(8 * HUGE, 9, 0));
        assert_eq!(st.overlapping(HUGE, 7 * HUGE), vec![0, 6 * HUGE]);
        assert_eq!(st.overlapping(4 * HUGE, 6 * HUGE), Vec::<usize>::new());
        assert_eq!(st.cut_objects(HUGE, 7 * HUGE), Vec::<i32>::new());
        assert_eq!(st.cut_objects(HUGE + 4096, 7 * HUGE), vec![7]);
        assert_eq!(st.cut_objects(0, 7 * HUGE - 4096), vec![9]);
        st.forget(HUGE, 2 * HUGE);
        assert_eq!(st.pieces[&0], piece(HUGE, 7, 2 * HUGE));
        assert_eq!(st.pieces[&(2 * HUGE)], piece(4 * HUGE, 7, 4 * HUGE));
        assert!(!st.pieces.contains_key(&HUGE));
        st.forget(0, 8 * HUGE);
        assert!(st.pieces.is_empty());
    }
}
