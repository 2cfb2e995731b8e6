//! IPC leaks, in a binary of its own because it counts the whole process's fds and mappings:
//! 2,000 opens of one handle give 2,000 pointers, and after closing them (and putting the
//! handles, or dropping the context) fds, mappings, exports and views are back where they were.

mod common;

use std::collections::HashSet;

use common::*;
use hetmem::ipc::{live_exports, open_views};
use hetmem::platform::open_fd_count;
use hetmem::IpcProperties;

/// Mappings of memfds (every view of an opened handle is one or more); the process's other
/// mappings (C library arenas, thread stacks) come and go on their own.
fn memfd_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("/memfd:"))
        .count()
}

/// Inaccessible private mappings of exactly `size` bytes (the placeholder a view of that size
/// would leave behind).
fn placeholders_of(size: usize) -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| {
            let mut f = l.split_whitespace();
            let (r, p) = (f.next().unwrap(), f.next().unwrap());
            let (a, b) = r.split_once('-').unwrap();
            let n = usize::from_str_radix(b, 16).unwrap() - usize::from_str_radix(a, 16).unwrap();
            p == "---p" && n == size
        })
        .count()
}

#[test]
fn two_thousand_opens_give_unique_pointers_and_closing_them_returns_every_fd_and_mapping() {
    if common::skip() {
        return;
    }
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    // The process's fd count and its memfd mappings are the host backend's: there every export
    // is a memfd and every view maps it. On cuda a view is the driver's import and mapping in
    // the GPU's address space, and the driver opens and keeps descriptors of its own.
    let host_facts = !common::part_not_applicable_on(
        hetmem::BackendKind::Cuda,
        "the counts of this process's fds and memfd mappings (host-backend facts: a cuda view \
         is the driver's import and GPU mapping, and the driver keeps descriptors of its own)",
    );
    // Fewer opens on cuda, where each one is a driver import and mapping of a 2 MiB granule.
    let opens = if common::on_cuda() { 200 } else { 2000 };
    let at_start = open_fd_count();
    let (e, _) = make_range(&ctx);
    let a = make_alloc(&ctx);
    // Warm up: the broker thread and its socket exist from the first export on.
    let warm = ctx.get_ipc_handle(a.ptr).unwrap();
    ctx.put_ipc_handle(&warm).unwrap();
    let (fds, maps) = (open_fd_count(), memfd_mappings());
    let h = ctx.get_ipc_handle(a.ptr).unwrap();
    let props = IpcProperties {
        range_size: Some(e.size),
        ..Default::default()
    };
    let hr = ctx.get_ipc_handle_with_properties(e.ptr, &props).unwrap();
    let mut ptrs = HashSet::new();
    for _ in 0..opens {
        assert!(
            ptrs.insert(ctx.open_ipc_handle(&h, 0).unwrap()),
            "a repeated pointer"
        );
    }
    for _ in 0..50 {
        assert!(
            ptrs.insert(ctx.open_ipc_handle(&hr, 0).unwrap()),
            "a repeated pointer"
        );
    }
    assert_eq!(open_views(), opens + 50);
    if host_facts {
        assert!(
            memfd_mappings() >= maps + opens + 50,
            "every view is a memfd mapping"
        );
    }
    for p in &ptrs {
        ctx.close_ipc_handle(*p).unwrap();
    }
    ctx.put_ipc_handle(&h).unwrap();
    ctx.put_ipc_handle(&hr).unwrap();
    assert_eq!((open_views(), live_exports()), (0, 0));
    if host_facts {
        assert_eq!(open_fd_count(), fds, "fds back");
        assert_eq!(memfd_mappings(), maps, "memfd mappings back");
        assert_eq!(placeholders_of(1 << 20), 0, "no view's placeholder left");
    }
    // Dropping a context closes its views and puts its exports.
    let other = rt.driver().create_context().unwrap();
    let h2 = other.get_ipc_handle(a.ptr).unwrap_err();
    assert_eq!(h2.ze_result(), 0x7800_0004, "another context's allocation");
    let p2 = make_physical(&other);
    let h2 = other.get_ipc_handle(p2.ptr).unwrap();
    let _v = other.open_ipc_handle(&h2, 0).unwrap();
    assert_eq!((open_views(), live_exports()), (1, 1));
    drop(p2);
    drop(other);
    assert_eq!((open_views(), live_exports()), (0, 0));
    e.destroy(&ctx);
    a.destroy(&ctx);
    // Only the broker's listening socket stays, for the life of the process.
    if host_facts {
        assert_eq!(open_fd_count(), at_start + 1, "fds back after teardown");
    }
}
