//! `hetmem bench kv`: the two steps a growable KV cache repeats, per 2 MiB page, against the bare
//! syscall sequences that do the same work.
//!
//! - grow: take a physical object from a pool, map it read-write at the next page of a slot,
//!   and write the first bytes of every OS page of it (what tagging or filling new tokens does).
//!   Baselines: `mmap(MAP_SHARED | MAP_FIXED)` of a memfd, then the same writes (each OS page
//!   faults in on its first write); and `mmap(MAP_SHARED | MAP_FIXED | MAP_POPULATE)`, then the
//!   same writes (the page table filled in one call).
//! - release: unmap the page and return the object to the pool. Baseline:
//!   `mmap(PROT_NONE, MAP_FIXED)` over it (the host backend's unmap).
//!
//! Every row runs with 4 KiB pages, then with 2 MiB pages where the machine has them: reserved
//! hugetlbfs pages (rows marked `2M hugetlb`, keys ending `_hugetlb`), where `vm.nr_hugepages`
//! has free pages for both sides (hetmem's objects are hugetlbfs memfds then, and the raw
//! memfds are too: `MFD_HUGETLB`, pages allocated by `fallocate`); or 2 MiB shmem THP folios
//! (rows marked `2M`, keys ending `_huge`) where no pages are reserved and shmem THP is
//! enabled: hetmem's map then advises and populates (`madvise(MADV_HUGEPAGE)`,
//! `madvise(MADV_POPULATE_READ)`), and so do the baselines (the faulting one advises only).
//! Each runs against its own raw sequence.
//!
//! Both sides map contiguous pages of one reservation (a slot growing), objects and memfds are
//! populated before the rounds (a pool's objects have been used before), and the rounds
//! alternate which side goes first.
//!
//! The first touch interleaves the sides, 2 MiB by 2 MiB (hetmem's object 0, memfd 0, hetmem's
//! object 1, ...), so that neither side's memory is touched in one block before the other's.
//! On the project's 2-core VM, two identical copies of the raw sequence differ by that alone
//! (`docs/probes/kv-first-touch.c`): the copy whose memory was touched first in one block
//! released 1.10-1.36x and grew 1.04-1.26x slower than the other in every run, whichever copy
//! it was; with the first touch interleaved they read 0.89-1.06x (release) and 0.96-1.12x
//! (grow), noise of a loaded machine. The warm-up round used to touch hetmem's pool first, which
//! put that difference on hetmem's side of every ratio here (release 1.25-1.66x, grow against
//! populate 1.02-1.52x, with the same syscalls on both sides; 0.97-1.01x and 1.01-1.10x with the
//! first touch interleaved).

use std::time::Instant;

use hetmem::{AccessAttribute, PhysicalMemory, PhysicalMemoryFlags, Runtime};
use rustix::mm::{Advice, MapFlags, ProtFlags};

use super::{
    e2s, key, median, raw_hugetlb_memfd, raw_memfd, raw_release, raw_reserve, size_name, Args,
    HugeKind, Row, Unit,
};

const PAGE: usize = 2 << 20;

/// Writes one word at the start of every OS page of `[addr, addr+len)`.
///
/// # Safety
/// The range is mapped read-write and nobody else uses it.
unsafe fn first_writes(addr: usize, len: usize, os_page: usize) {
    for off in (0..len).step_by(os_page) {
        // SAFETY: forwarded contract.
        unsafe { ((addr + off) as *mut u64).write_volatile(off as u64 | 1) };
    }
}

/// Both page kinds: 4 KiB pages (the plain keys), then 2 MiB pages where the machine has them:
/// reserved hugetlbfs pages (keys ending `_hugetlb`), or shmem THP folios (`_huge`).
pub fn bench(args: &Args) -> Result<Vec<Row>, String> {
    let mut rows = pass(args, None)?;
    match super::physical_huge_kind(args.iters.max(1) as u64) {
        Ok(kind) => {
            for r in pass(args, Some(kind))? {
                rows.push(Row {
                    op: super::leak(format!("{} {}", r.op, kind.mark())),
                    key: format!("{}{}", r.key, kind.key_suffix()),
                    ..r
                });
            }
        }
        Err(why) => println!("2 MiB-page rows not run: {why}"),
    }
    Ok(rows)
}

/// One pass with 4 KiB pages (`huge` None) or 2 MiB pages of `huge`'s kind: hetmem's objects
/// and the raw memfds alike (hugetlbfs memfds with their pages allocated, mapped with
/// `MAP_POPULATE`; or shmem advised `MADV_HUGEPAGE`).
fn pass(args: &Args, huge: Option<HugeKind>) -> Result<Vec<Row>, String> {
    let n = args.iters.max(1);
    let os_page = rustix::param::page_size();
    let hugetlb = huge == Some(HugeKind::Hugetlb);
    let thp = huge == Some(HugeKind::Thp);
    let rt = Runtime::builder()
        .host_devices(1)
        .host_device_memory(((n * PAGE) as u64).max(64 << 20))
        .host_huge_pages(huge.is_some())
        .build()
        .map_err(e2s)?;
    let dev = rt.driver().device(0).ok_or("no device")?;
    let ctx = rt.driver().create_context().map_err(e2s)?;
    let page = ctx.query_page_size(&dev, n * PAGE).map_err(e2s)?;
    if page != PAGE {
        return Err(format!(
            "the page-size query answers {page} bytes for {n} x 2 MiB; this group measures \
             2 MiB pages"
        ));
    }
    let res = ctx.reserve(None, n * PAGE).map_err(e2s)?;
    let raw_base = raw_reserve(n * PAGE, PAGE)?;
    // Objects and memfds made in turn: hugetlbfs ones take (and zero) their pages when made,
    // so this interleaves their memory as the first touch below does the others'.
    let free_before = super::hugetlb_free();
    let mut pool: Vec<PhysicalMemory> = Vec::with_capacity(n);
    let mut fds = Vec::with_capacity(n);
    for i in 0..n {
        for k in 0..2 {
            if (k + i) % 2 == 0 {
                pool.push(
                    ctx.create_physical_memory(
                        Some(&dev),
                        PhysicalMemoryFlags::AllocateOnDevice,
                        PAGE,
                    )
                    .map_err(e2s)?,
                );
            } else {
                fds.push(if hugetlb {
                    raw_hugetlb_memfd(PAGE)?
                } else {
                    raw_memfd(PAGE)?
                });
            }
        }
    }
    if hugetlb && super::hugetlb_free() + 2 * n as u64 > free_before {
        return Err(format!(
            "hetmem's {n} objects and the raw memfds did not all take reserved 2 MiB pages \
             ({free_before} free before, {} after)",
            super::hugetlb_free()
        ));
    }

    let hetmem_phase = |pool: &mut Vec<PhysicalMemory>| -> Result<(f64, f64), String> {
        let mut taken = Vec::with_capacity(n);
        let t = Instant::now();
        for i in 0..n {
            let phys = pool.pop().ok_or("pool empty")?;
            let addr = res.base + i * PAGE;
            ctx.map(addr, PAGE, phys, 0, AccessAttribute::ReadWrite)
                .map_err(e2s)?;
            // SAFETY: just mapped read-write; ours alone.
            unsafe { first_writes(addr, PAGE, os_page) };
            taken.push(phys);
        }
        let grow = t.elapsed().as_nanos() as f64 / n as f64;
        let t = Instant::now();
        for i in (0..n).rev() {
            ctx.unmap(res.base + i * PAGE, PAGE).map_err(e2s)?;
            pool.push(taken.pop().expect("one per page"));
        }
        Ok((grow, t.elapsed().as_nanos() as f64 / n as f64))
    };
    // The raw grow of page `i`: map memfd `i` there (populated or not), then the first writes.
    let raw_grow = |i: usize, populate: bool| -> Result<(), String> {
        // THP folios: the advice before any touch, then the populate as hetmem's map does.
        let extra = if populate && !thp {
            MapFlags::POPULATE
        } else {
            MapFlags::empty()
        };
        let addr = raw_base + i * PAGE;
        // SAFETY: inside our raw reservation; MAP_FIXED replaces our own placeholder.
        unsafe {
            rustix::mm::mmap(
                addr as *mut _,
                PAGE,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED | MapFlags::FIXED | extra,
                &fds[i],
                0,
            )
            .map_err(|e| e.to_string())?;
            if thp {
                rustix::mm::madvise(addr as *mut _, PAGE, Advice::LinuxHugepage)
                    .map_err(|e| e.to_string())?;
                if populate {
                    rustix::mm::madvise(addr as *mut _, PAGE, Advice::LinuxPopulateRead)
                        .map_err(|e| e.to_string())?;
                }
            }
            first_writes(addr, PAGE, os_page);
        }
        Ok(())
    };
    // The raw release of page `i`: the placeholder back over it.
    let raw_release_page = |i: usize| -> Result<(), String> {
        // SAFETY: inside our raw reservation.
        unsafe {
            rustix::mm::mmap_anonymous(
                (raw_base + i * PAGE) as *mut _,
                PAGE,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE | MapFlags::FIXED,
            )
        }
        .map(|_| ())
        .map_err(|e| e.to_string())
    };
    let raw_phase = |populate: bool| -> Result<(f64, f64), String> {
        let t = Instant::now();
        for i in 0..n {
            raw_grow(i, populate)?;
        }
        let grow = t.elapsed().as_nanos() as f64 / n as f64;
        let t = Instant::now();
        for i in (0..n).rev() {
            raw_release_page(i)?;
        }
        Ok((grow, t.elapsed().as_nanos() as f64 / n as f64))
    };

    // First touch, the two sides interleaved 2 MiB by 2 MiB (see the module docs).
    for (i, phys) in pool.iter().enumerate() {
        let addr = res.base + i * PAGE;
        ctx.map(addr, PAGE, *phys, 0, AccessAttribute::ReadWrite)
            .map_err(e2s)?;
        // SAFETY: just mapped read-write; ours alone.
        unsafe { first_writes(addr, PAGE, os_page) };
        ctx.unmap(addr, PAGE).map_err(e2s)?;
        raw_grow(i, true)?;
        raw_release_page(i)?;
    }

    let (mut grow_h, mut release_h) = (Vec::new(), Vec::new());
    let (mut grow_b, mut release_b, mut grow_p) = (Vec::new(), Vec::new(), Vec::new());
    // Round 0 is a warm-up; the order rotates.
    for round in 0..=args.rounds {
        let mut h = (0.0, 0.0);
        let mut b = (0.0, 0.0);
        let mut p = (0.0, 0.0);
        for k in 0..3 {
            match (round + k) % 3 {
                0 => h = hetmem_phase(&mut pool)?,
                1 => b = raw_phase(false)?,
                _ => p = raw_phase(true)?,
            }
        }
        if round > 0 {
            grow_h.push(h.0);
            release_h.push(h.1);
            grow_b.push(b.0);
            release_b.push(b.1);
            grow_p.push(p.0);
        }
    }
    ctx.free_reservation(res).map_err(e2s)?;
    for p in pool {
        ctx.destroy_physical_memory(p).map_err(e2s)?;
    }
    raw_release(raw_base, n * PAGE);
    let grow = median(grow_h);
    Ok(vec![
        Row {
            unit: Unit::Ns,
            op: "grow (map+1st write)",
            size: size_name(PAGE),
            key: key("grow", PAGE),
            hetmem_ns: grow,
            baseline_ns: Some(median(grow_b)),
            baseline: match huge {
                Some(HugeKind::Thp) => "mmap(MAP_FIXED) + MADV_HUGEPAGE + first writes",
                Some(HugeKind::Hugetlb) => "mmap(MAP_FIXED) hugetlbfs memfd + first writes",
                None => "mmap(MAP_FIXED) memfd + first writes",
            },
            target: None,
        },
        Row {
            unit: Unit::Ns,
            op: "grow (map+1st write)",
            size: size_name(PAGE),
            key: key("grow_vs_populate", PAGE),
            hetmem_ns: grow,
            baseline_ns: Some(median(grow_p)),
            baseline: match huge {
                Some(HugeKind::Thp) => "mmap + MADV_HUGEPAGE + MADV_POPULATE_READ + writes",
                Some(HugeKind::Hugetlb) => "mmap(MAP_FIXED|MAP_POPULATE) hugetlbfs + writes",
                None => "mmap(MAP_FIXED|MAP_POPULATE) + writes",
            },
            target: Some("<= 1.05x"),
        },
        Row {
            unit: Unit::Ns,
            op: "release (unmap)",
            size: size_name(PAGE),
            key: key("release", PAGE),
            hetmem_ns: median(release_h),
            baseline_ns: Some(median(release_b)),
            baseline: "mmap(PROT_NONE, MAP_FIXED)",
            target: Some("<= 1.05x"),
        },
    ])
}
