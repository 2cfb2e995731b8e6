//! OS limit: live physical objects, one memfd each, up to the open-file limit.
//!
//! Both tests depend on the process-wide `RLIMIT_NOFILE` (one lowers it), so they take one lock
//! and run one at a time, and nothing else runs in this binary.

mod common;

/// Why this file runs on the host backend only.
const HOST_ONLY: &str =
    "a host-backend physical object is one memfd, so live objects are bounded by RLIMIT_NOFILE \
     (ten thousand objects, then the lowered open-file limit); on cuda a physical object is a \
     cuMemCreate allocation of the GPU that holds no fd of this process, and ten thousand of \
     its 2 MiB granules would be 20 GiB of GPU memory";

use common::runtime_with;

use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use hetmem::platform::open_fd_count;
use hetmem::{AccessAttribute, Error, PhysicalMemory, PhysicalMemoryFlags};

/// Serialises the tests of this binary: both depend on the open-file limit.
static FD_LIMIT: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    common::lock(&FD_LIMIT)
}

const OBJECTS: usize = 10_240;

fn nofile() -> libc::rlimit {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    lim
}

fn set_nofile(lim: libc::rlimit) {
    // SAFETY: setrlimit reads one rlimit.
    assert_eq!(
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) },
        0,
        "setrlimit(RLIMIT_NOFILE)"
    );
}

/// Puts the open-file limit back when dropped, even if the test fails.
struct RestoreLimit(libc::rlimit);

impl Drop for RestoreLimit {
    fn drop(&mut self) {
        // SAFETY: setrlimit reads one rlimit.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &self.0) };
    }
}

#[test]
fn ten_thousand_live_physical_objects() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let _g = lock();
    let rt = runtime_with(2, 1 << 30);
    let lim = nofile();
    assert!(
        lim.rlim_cur >= (OBJECTS + 64) as u64,
        "the runtime raises the soft open-file limit to the hard one, {}; {OBJECTS} objects \
         need more (raise the hard limit, `ulimit -Hn`)",
        lim.rlim_cur
    );
    let devs = rt.driver().devices();
    let ctx = rt.driver().create_context().expect("context");
    let page = ctx.query_page_size(&devs[0], 1).expect("page size");
    assert_eq!(page, 64 << 10);
    let fds_before = open_fd_count();

    let t = Instant::now();
    let objs: Vec<PhysicalMemory> = (0..OBJECTS)
        .map(|i| {
            // Spread over both devices and host memory.
            let (dev, flags) = match i % 3 {
                0 => (Some(&devs[0]), PhysicalMemoryFlags::AllocateOnDevice),
                1 => (Some(&devs[1]), PhysicalMemoryFlags::AllocateOnDevice),
                _ => (None, PhysicalMemoryFlags::AllocateOnHost),
            };
            ctx.create_physical_memory(dev, flags, page)
                .unwrap_or_else(|e| panic!("physical object {i}: {e}"))
        })
        .collect();
    let created_in = t.elapsed();
    let fds_live = open_fd_count();
    eprintln!(
        "{OBJECTS} objects created in {created_in:?}; fds {fds_before} -> {fds_live} \
         (soft limit {})",
        lim.rlim_cur
    );
    assert_eq!(fds_live, fds_before + OBJECTS, "one fd per object");
    let stats = rt.driver().vm_stats();
    assert_eq!(stats.physical_objects, OBJECTS);
    // Object i went to slot i % 3: device 0, device 1, host.
    let in_slot = |k: usize| ((OBJECTS + 2 - k) / 3 * page) as u64;
    assert_eq!(devs[0].used_memory(), in_slot(0));
    assert_eq!(devs[1].used_memory(), in_slot(1));
    assert_eq!(stats.host_physical_bytes, in_slot(2));
    let ids: std::collections::HashSet<u64> = objs.iter().map(|p| p.id).collect();
    assert_eq!(ids.len(), OBJECTS, "handles are distinct");

    // A few of them, first, middle and last, work: each is its own memory.
    let pick = [0, 1, 2, OBJECTS / 2, OBJECTS - 2, OBJECTS - 1];
    let r = ctx.reserve(None, pick.len() * page).expect("reserve");
    for (k, &i) in pick.iter().enumerate() {
        let a = r.base + k * page;
        ctx.map(a, page, objs[i], 0, AccessAttribute::ReadWrite)
            .expect("map");
        // SAFETY: `a` is mapped read-write.
        unsafe { (a as *mut u64).write_volatile(i as u64 + 1) };
    }
    for (k, &i) in pick.iter().enumerate() {
        // SAFETY: as above.
        let v = unsafe { ((r.base + k * page) as *const u64).read_volatile() };
        assert_eq!(v, i as u64 + 1, "object {i}");
    }
    ctx.free_reservation(r).expect("free");

    let t = Instant::now();
    for p in objs {
        ctx.destroy_physical_memory(p).expect("destroy");
    }
    eprintln!("destroyed in {:?}", t.elapsed());
    assert_eq!(open_fd_count(), fds_before, "every fd is closed");
    let stats = rt.driver().vm_stats();
    assert_eq!(stats.physical_objects, 0);
    assert_eq!(stats.host_physical_bytes, 0);
    assert!(devs.iter().all(|d| d.used_memory() == 0));
}

#[test]
fn open_file_limit_gives_out_of_host_memory_naming_the_limit() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let _g = lock();
    // The runtime raises the soft limit to the hard one; lower it afterwards.
    let rt = runtime_with(1, 1 << 30);
    let dev = rt.driver().device(0).expect("device 0");
    let ctx = rt.driver().create_context().expect("context");
    let page = ctx.query_page_size(&dev, 1).expect("page size");

    let original = nofile();
    let _restore = RestoreLimit(original);
    let open = open_fd_count() as u64;
    let lowered = open + 50;
    set_nofile(libc::rlimit {
        rlim_cur: lowered,
        rlim_max: original.rlim_max,
    });
    // New fds take the lowest free numbers, so exactly the free numbers below the limit can
    // be used (inherited fds may sit above it).
    let free_below = (0..lowered as i32)
        // SAFETY: F_GETFD only asks whether the number is open.
        .filter(|&fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1)
        .count();

    let fds_before = open_fd_count();
    let mut objs = Vec::with_capacity(1000);
    let err = loop {
        assert!(objs.len() < 1000, "no failure below the lowered limit");
        match ctx.create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, page) {
            Ok(p) => objs.push(p),
            Err(e) => break e,
        }
    };
    eprintln!(
        "soft limit {lowered} with {open} fds open ({free_below} free numbers below it): {} \
         objects, then {err}",
        objs.len()
    );
    assert!(
        matches!(err, Error::OutOfHostMemory(_)),
        "expected OutOfHostMemory, got {err:?}"
    );
    assert!(
        err.message().contains("RLIMIT_NOFILE"),
        "the message should name RLIMIT_NOFILE: {err}"
    );
    assert_eq!(
        objs.len(),
        free_below,
        "every free fd number below the limit {lowered} is used, then the failure"
    );
    // The failure leaked nothing and counted nothing.
    assert_eq!(
        rt.driver().vm_stats().physical_objects,
        objs.len(),
        "the failed create left no object"
    );
    assert_eq!(dev.used_memory(), (objs.len() * page) as u64);

    for p in objs.drain(..) {
        ctx.destroy_physical_memory(p).expect("destroy");
    }
    assert_eq!(open_fd_count(), fds_before, "every fd is closed");
    assert_eq!(dev.used_memory(), 0);

    // With the limit back, objects can be made again.
    set_nofile(original);
    let p = ctx
        .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, page)
        .expect("create after the limit is restored");
    ctx.destroy_physical_memory(p).expect("destroy");
    assert_eq!(open_fd_count(), fds_before);
    assert_eq!(rt.driver().vm_stats().physical_objects, 0);
}
