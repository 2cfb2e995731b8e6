//! An `aclrtMapMem` racing an `aclrtReleaseMemAddress` of the same reservation leaves no record
//! of a mapping that is gone: whatever the interleaving, once both have returned (the
//! reservation released) the library holds no mapping record, and `aclrtUnmapMem` of the
//! address answers 107000. (A map reaching hetmem after the release took the reservation out
//! but before hetmem's free unmapped it used to file a record that outlived the mapping.)

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::Barrier;

use ascendcl::vmm::{self, AclPhysicalMemProp};
use ascendcl::*;

fn ok(r: i32, what: &str) {
    assert_eq!(r, 0, "{what}");
}

#[test]
fn a_map_racing_a_release_leaves_no_stale_mapping_record() {
    std::env::set_var("HETMEM_HOST_DEVICES", "1");
    std::env::set_var("HETMEM_HOST_DEVICE_MEMORY", "64M");
    let p = AclPhysicalMemProp {
        handle_type: 0,
        allocation_type: 0,
        mem_attr: 0,
        location_id: 0,
        location_type: 1,
        reserve: 0,
    };
    unsafe {
        ok(setup::aclInit(null_mut()), "aclInit");
        ok(setup::aclrtSetDevice(0), "set device");
        let mut g = 0usize;
        ok(vmm::aclrtMemGetAllocationGranularity(&p, 0, &mut g), "gran");
        let mut ph: *mut c_void = null_mut();
        ok(vmm::aclrtMallocPhysical(&mut ph, g, &p, 0), "malloc");
        let phv = ph as usize;
        let go = Barrier::new(2);
        let (mut mapped, mut stale) = (0usize, 0usize);
        let rounds = 10_000;
        for i in 0..rounds {
            let mut va: *mut c_void = null_mut();
            ok(
                vmm::aclrtReserveMemAddress(&mut va, g, 0, null_mut(), 0),
                "reserve",
            );
            let vav = va as usize;
            std::thread::scope(|s| {
                let m = s.spawn(|| {
                    go.wait();
                    // Spread over the release's span (a no-access map populates nothing, so
                    // it is as short as the release).
                    let t = std::time::Instant::now();
                    let lag = std::time::Duration::from_nanos((i as u64 * 7919) % 30_000);
                    while t.elapsed() < lag {
                        std::hint::spin_loop();
                    }
                    access::aclrtMemMapNoAccess(vav as *mut c_void, g, 0, phv as *mut c_void, 0)
                });
                go.wait();
                ok(vmm::aclrtReleaseMemAddress(va), "release");
                let r = m.join().unwrap();
                assert!(r == 0 || r == 107000, "map answered {r}");
                mapped += usize::from(r == 0);
            });
            if !vmm::VMM.lock().mappings.is_empty() {
                stale += 1;
                // What the record claims is gone: unmap answers as hetmem finds it.
                let _ = vmm::aclrtUnmapMem(va);
                vmm::VMM.lock().mappings.clear();
            }
        }
        eprintln!("{mapped} of {rounds} racing maps succeeded; {stale} left a record");
        ok(vmm::aclrtFreePhysical(ph), "free (nothing maps it)");
        ok(setup::aclFinalize(), "aclFinalize");
        assert_eq!(stale, 0, "a map racing a release left a stale record");
    }
}
