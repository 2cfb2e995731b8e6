//! A refused `aclrtFreePhysical` (the memory still mapped) changes nothing, so a call on the
//! same handle from another thread sees a live handle whatever the interleaving. (A free that
//! took the handle out of the registry while it asked hetmem, and put it back when refused,
//! made 771,000 of 13.7 million lookups on the other thread answer 107000.)

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use ascendcl::vmm::AclPhysicalMemProp;
use ascendcl::*;

fn ok(r: i32, what: &str) {
    assert_eq!(r, 0, "{what}");
}

fn prop() -> AclPhysicalMemProp {
    AclPhysicalMemProp {
        handle_type: 0,
        allocation_type: 0,
        mem_attr: 0,
        location_id: 0,
        location_type: 1,
        reserve: 0,
    }
}

#[test]
fn a_refused_free_on_one_thread_leaves_the_handle_live_for_another() {
    std::env::set_var("HETMEM_HOST_DEVICES", "1");
    std::env::set_var("HETMEM_HOST_DEVICE_MEMORY", "64M");
    unsafe {
        ok(setup::aclInit(null_mut()), "aclInit");
        ok(setup::aclrtSetDevice(0), "set device");
        let p = prop();
        let mut g = 0usize;
        ok(vmm::aclrtMemGetAllocationGranularity(&p, 0, &mut g), "gran");
        let mut va: *mut c_void = null_mut();
        ok(
            vmm::aclrtReserveMemAddress(&mut va, g, 0, null_mut(), 0),
            "reserve",
        );
        let mut ph: *mut c_void = null_mut();
        ok(
            vmm::aclrtMallocPhysical(&mut ph, g, &p, 0),
            "malloc physical",
        );
        ok(vmm::aclrtMapMem(va, g, 0, ph, 0), "map");
        let phv = ph as usize;
        let stop = AtomicBool::new(false);
        let frees = AtomicUsize::new(0);
        let (mut calls, mut lost) = (0usize, 0usize);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    // Refused: the memory is mapped (nothing changes).
                    assert_eq!(vmm::aclrtFreePhysical(phv as *mut c_void), 107000);
                    frees.fetch_add(1, Ordering::Relaxed);
                }
            });
            let t = std::time::Instant::now();
            while t.elapsed() < std::time::Duration::from_secs(2) {
                let mut q = prop();
                let r =
                    access::aclrtMemGetAllocationPropertiesFromHandle(phv as *mut c_void, &mut q);
                calls += 1;
                if r != 0 {
                    lost += 1;
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
        eprintln!(
            "{lost} of {calls} lookups of a live handle refused while {} refused frees ran",
            frees.load(Ordering::Relaxed)
        );
        ok(vmm::aclrtUnmapMem(va), "unmap");
        ok(vmm::aclrtFreePhysical(ph), "free");
        ok(vmm::aclrtReleaseMemAddress(va), "release");
        ok(setup::aclFinalize(), "aclFinalize");
        assert_eq!(
            lost, 0,
            "a live physical handle was not found while a refused free ran"
        );
    }
}
