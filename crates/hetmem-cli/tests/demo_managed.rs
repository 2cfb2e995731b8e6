//! `hetmem demo --scene managed` end to end: the built binary processes a working set 4x one
//! device in chunks with prefetch, and checks its results itself (non-zero exit otherwise).

mod common;

#[test]
fn managed_scene_processes_a_working_set_larger_than_the_device_and_verifies_it() {
    let (o, out, err) = common::hetmem(&["demo", "--scene", "managed"], &[]);
    assert!(o.status.success(), "exit {:?}\n{out}\n{err}", o.status);
    assert!(
        out.contains("a 256 MiB working set on a device of 64 MiB"),
        "{out}"
    );
    assert!(out.contains("0 wrong;"), "{out}");
    assert!(out.contains("verified: every element correct"), "{out}");
    // The attribute answers: a fresh range has no advice, the lookup table is read-mostly and
    // accessed by device 0, the last chunk was prefetched to device 0, the array is mixed.
    let l = |what: &str| {
        out.lines()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what:?} in\n{out}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(
        l("fresh array:").contains("READ_MOSTLY 0 PREFERRED_LOCATION -2 LAST_PREFETCH_LOCATION -2")
    );
    assert!(l("lookup table (advised):").contains("READ_MOSTLY 1"));
    assert!(l("lookup table (advised):").contains("ACCESSED_BY [0, -2]"));
    assert!(l("last chunk:").contains("LAST_PREFETCH_LOCATION 0 (type 1)"));
    assert!(l("first chunk (prefetched to host):").contains("LAST_PREFETCH_LOCATION -1 (type 2)"));
    assert!(l("whole array (mixed):").contains("LAST_PREFETCH_LOCATION -2 (type 0)"));
    assert!(l("after 16 chunks on the device:").contains("resident: device 32 pages"));
}
