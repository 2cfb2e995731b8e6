//! OS limit: 64 TiB of live reservations on the host backend.
//!
//! Half of the 128 TiB user address space of x86-64 (47-bit) Linux is reserved at once, so this
//! test is alone in its binary.

mod common;

/// Why this file runs on the host backend only.
const HOST_ONLY: &str =
    "it holds 64 TiB of host address space as PROT_NONE mmaps and checks them in \
     /proc/self/maps; on cuda a reservation is a cuMemAddressReserve range of the GPU's unified \
     virtual address space, which the kernel does not show and the driver sizes itself";

use common::runtime_with;

use std::time::Instant;

use hetmem::{AccessAttribute, Reservation};

const TIB: usize = 1 << 40;

/// The `(start, end, perms)` of each line of `/proc/self/maps`.
fn maps() -> Vec<(usize, usize, String)> {
    let text = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    text.lines()
        .map(|l| {
            let mut f = l.split_whitespace();
            let (a, b) = f.next().expect("range").split_once('-').expect("start-end");
            let perms = f.next().expect("perms").to_string();
            (
                usize::from_str_radix(a, 16).expect("hex"),
                usize::from_str_radix(b, 16).expect("hex"),
                perms,
            )
        })
        .collect()
}

/// Bytes of `r` that the kernel has as inaccessible private mappings (`---p`).
fn kernel_reserved_bytes(maps: &[(usize, usize, String)], r: Reservation) -> usize {
    maps.iter()
        .filter(|(_, _, p)| p == "---p")
        .map(|&(a, b, _)| b.min(r.end()).saturating_sub(a.max(r.base)))
        .sum()
}

#[test]
fn reservations_reach_64_tib() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let rt = runtime_with(1, 64 << 20);
    let dev = rt.driver().device(0).expect("device 0");
    let ctx = rt.driver().create_context().expect("context");
    let size = 4 * TIB;
    let page = ctx.query_page_size(&dev, size).expect("page size");
    assert_eq!(size % page, 0);

    let t = Instant::now();
    let mut rs: Vec<Reservation> = (0..16)
        .map(|i| {
            ctx.reserve(None, size)
                .unwrap_or_else(|e| panic!("reservation {i} of 4 TiB: {e}"))
        })
        .collect();
    let took = t.elapsed();

    // All live, as the driver counts them and as the kernel maps them.
    let stats = rt.driver().vm_stats();
    assert_eq!(stats.reservations, 16);
    assert_eq!(stats.reserved_bytes, 64 * TIB);
    let m = maps();
    for r in &rs {
        assert_eq!(r.size, size);
        assert_eq!(r.base % page, 0, "{:#x} is aligned to {page:#x}", r.base);
        assert_eq!(
            ctx.get_access_attribute(r.base, r.size),
            Ok((AccessAttribute::None, r.size)),
            "a new reservation is inaccessible"
        );
        assert_eq!(
            kernel_reserved_bytes(&m, *r),
            r.size,
            "the kernel holds all of [{:#x}, {:#x})",
            r.base,
            r.end()
        );
    }
    // Distinct and disjoint.
    rs.sort_by_key(|r| r.base);
    for w in rs.windows(2) {
        assert!(
            w[0].end() <= w[1].base,
            "[{:#x}, {:#x}) overlaps [{:#x}, {:#x})",
            w[0].base,
            w[0].end(),
            w[1].base,
            w[1].end()
        );
    }
    eprintln!(
        "16 x 4 TiB reserved in {took:?}, from {:#x} to {:#x}",
        rs[0].base,
        rs[15].end()
    );

    for r in rs.iter().copied() {
        ctx.free_reservation(r).expect("free");
    }
    let stats = rt.driver().vm_stats();
    assert_eq!((stats.reservations, stats.reserved_bytes), (0, 0));
    let m = maps();
    for r in &rs {
        assert_eq!(
            kernel_reserved_bytes(&m, *r),
            0,
            "[{:#x}, {:#x}) went back to the kernel",
            r.base,
            r.end()
        );
    }
}
