//! A refused `aclrtFreePhysical` (the memory still mapped) changes nothing, whatever another
//! thread does meanwhile: an `aclrtResetDevice` on another thread during refused frees tears
//! the handle down with its context (107000 afterwards, as every object made in the context),
//! and leaves nothing of the context in the registry. (A free that took the handle out of the
//! registry while it asked hetmem, and put it back when refused, left 62 of 300 handles live
//! after their context's reset.)

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};

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
fn a_handle_of_a_reset_context_is_not_live() {
    std::env::set_var("HETMEM_HOST_DEVICES", "1");
    std::env::set_var("HETMEM_HOST_DEVICE_MEMORY", "256M");
    let mut resurrected = 0;
    let trials = 300;
    unsafe {
        ok(setup::aclInit(null_mut()), "aclInit");
        for _ in 0..trials {
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
            let started = AtomicBool::new(false);
            let stop = AtomicBool::new(false);
            std::thread::scope(|s| {
                s.spawn(|| {
                    started.store(true, Ordering::Release);
                    while !stop.load(Ordering::Relaxed) {
                        // Refused while mapped, then 107000 as a dead handle: both 107000.
                        assert_eq!(vmm::aclrtFreePhysical(phv as *mut c_void), 107000);
                    }
                });
                while !started.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                for _ in 0..200 {
                    std::hint::spin_loop();
                }
                ok(setup::aclrtResetDevice(0), "reset device");
                std::thread::sleep(std::time::Duration::from_micros(200));
                stop.store(true, Ordering::Relaxed);
            });
            let mut q = prop();
            if access::aclrtMemGetAllocationPropertiesFromHandle(ph, &mut q) == 0 {
                resurrected += 1;
            }
        }
        let left = state::global().unwrap().reg.lock().objects.len();
        eprintln!("{resurrected} of {trials} handles live after their context's reset; {left} objects left in the registry");
        ok(setup::aclFinalize(), "aclFinalize");
    }
    assert_eq!(
        resurrected, 0,
        "a physical handle outlived its context's reset"
    );
}
