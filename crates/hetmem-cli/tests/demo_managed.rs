//! `hetmem demo --scene managed` end to end: the built binary processes a managed array in
//! chunks on a device with prefetch, and checks its results itself (non-zero exit otherwise).
//! On the host backend the working set is 4x one modelled device, so pages are evicted and
//! faulted back; on cuda the scene runs on the GPU, where managed memory is never
//! oversubscribed: the attribute answers are the same, the eviction checks do not apply, and
//! the counters are hetmem's record of the pages it moved.

mod common;

#[test]
fn managed_scene_processes_a_working_set_larger_than_the_device_and_verifies_it() {
    if common::skip() {
        return;
    }
    let (o, out, err) = common::hetmem(&["demo", "--scene", "managed"], &[]);
    assert!(o.status.success(), "exit {:?}\n{out}\n{err}", o.status);
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
    let info = common::info_ok();
    if info.modelled {
        // A working set 4x the device: 32 of its pages fill the 64 MiB device.
        assert!(
            out.contains("a 256 MiB working set on a device of 64 MiB"),
            "{out}"
        );
        assert!(l("after 16 chunks on the device:").contains("resident: device 32 pages"));
        return;
    }
    common::part_not_applicable(&format!(
        "the eviction checks (a 256 MiB working set on a device of 64 MiB, 32 pages resident \
         after the 16 chunks): the working set is 4x a device the host backend models \
         (HETMEM_HOST_*); this runtime's devices are the machine's ({}), and managed memory on a \
         GPU is never oversubscribed (asking for more than it has free can hang it)",
        info.describe()
    ));
    assert_eq!(
        info.backend, "cuda",
        "a backend of neither kind:\n{}",
        info.text
    );
    // The GPU variant: its header and the line saying why eviction does not apply.
    assert!(
        l("managed memory:").contains("a 256 MiB array and a 2 MiB lookup table on GPU 0"),
        "{out}"
    );
    assert!(
        l("eviction:").starts_with("eviction: not applicable on a GPU:"),
        "{out}"
    );
    // hetmem's record: the host wrote the 128 array pages and the table; the device work used
    // all 129 pages; the first chunk's 8 pages came back by prefetch and the other 120 when
    // the host read the array back.
    assert!(
        l("after host initialisation:").ends_with("resident: device 0 pages, host 129 pages"),
        "{out}"
    );
    let after = l("after 16 chunks on the device:");
    assert!(after.contains("to device 129 pages (258 MiB)"), "{after}");
    assert!(after.contains("to host 0 pages (0 B)"), "{after}");
    assert!(
        after.ends_with("resident: device 129 pages, host 0 pages"),
        "{after}"
    );
    let back = l("after the host read it back:");
    assert!(back.contains("to host 128 pages (256 MiB)"), "{back}");
    assert!(
        back.ends_with("resident: device 1 pages, host 128 pages"),
        "{back}"
    );
    assert!(
        l("host read-back:").contains(
            "67108864 elements, 0 wrong; 120 pages moved to the host in hetmem's record for 120 \
             array pages that were on the device"
        ),
        "{out}"
    );
}
