//! Sub-devices (case 12 of `shared/cases/level-zero.md`): a host backend configured with
//! sub-devices (`host_subdevices(n)`, `HETMEM_HOST_SUBDEVICES`) gives each device `n`
//! sub-devices, each with its share of the root's capacity and its own queues; memory made on
//! a sub-device is charged to it and to its root, memory made on the root to the root alone;
//! a sub-device's free memory is the smaller of its share's and its root's. On cuda there are
//! none (the driver says why).

mod common;

use hetmem::{AllocDesc, BackendKind::Cuda, PhysicalMemoryFlags, Runtime};

const M: u64 = 1 << 20;

/// Two devices of 256 MiB, each split in two (on cuda: the GPUs, with no sub-devices).
fn runtime() -> Runtime {
    common::builder()
        .host_devices(2)
        .host_device_memory(256 * M)
        .host_subdevices(2)
        .build()
        .expect("runtime")
}

#[test]
fn each_device_has_its_sub_devices_with_a_share_and_its_root() {
    if common::skip() {
        return;
    }
    let rt = runtime();
    let drv = rt.driver();
    if common::on_cuda() {
        assert_eq!(drv.sub_devices_per_device(), 0);
        assert!(drv.devices().iter().all(|d| d.sub_devices().is_empty()));
        let why = drv.sub_devices_note().expect("cuda says why it has none");
        assert!(why.contains("MIG"), "{why}");
        common::part_not_applicable_on(
            Cuda,
            "the sub-devices themselves: a CUDA GPU has no Level Zero sub-devices \
             (Driver::sub_devices_note says why)",
        );
        return;
    }
    assert_eq!(drv.sub_devices_per_device(), 2);
    assert!(drv.sub_devices_note().is_none());
    assert_eq!(
        drv.devices().len(),
        2,
        "sub-devices are not devices of the driver"
    );
    for d in drv.devices() {
        assert_eq!(d.sub_device_id(), None);
        assert_eq!(d.root_device(), None);
        assert_eq!(d.capacity(), 256 * M);
        let subs = d.sub_devices();
        assert_eq!(subs.len(), 2);
        for (k, s) in subs.iter().enumerate() {
            assert_eq!(s.sub_device_id(), Some(k as u32));
            assert_eq!(s.ordinal(), d.ordinal());
            assert_eq!(s.root_device().as_ref(), Some(&d));
            assert_ne!(s, &d);
            assert_eq!(s.capacity(), 128 * M);
            assert_eq!(s.max_alloc_size(), d.max_alloc_size().min(128 * M));
            assert!(s.sub_devices().is_empty(), "no sub-sub-devices");
            assert_eq!(s.free_memory().unwrap(), 128 * M);
        }
        assert_ne!(subs[0], subs[1]);
    }
}

#[test]
fn memory_on_a_sub_device_counts_against_it_and_its_root_and_the_roots_against_the_whole() {
    if common::not_applicable_on(Cuda, "a CUDA GPU has no sub-devices") || common::skip() {
        return;
    }
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let root = rt.driver().device(0).unwrap();
    let subs = root.sub_devices();
    let (s0, s1) = (&subs[0], &subs[1]);
    // Device memory on sub-device 1: its share and the root.
    let a = ctx
        .alloc_device(s1, &AllocDesc::new((100 * M) as usize))
        .unwrap();
    assert_eq!(s1.used_memory(), 100 * M);
    assert_eq!(root.used_memory(), 100 * M);
    assert_eq!(s0.used_memory(), 0);
    assert_eq!(s1.free_memory().unwrap(), 28 * M);
    // The allocation says which sub-device it is on.
    let p = ctx.get_allocation_properties(a).unwrap();
    assert_eq!((p.device, p.sub_device), (Some(0), Some(1)));
    // Over sub-device 1's share: out of its memory, though the root has room; nothing charged.
    let e = ctx
        .alloc_device(s1, &AllocDesc::new((64 * M) as usize))
        .unwrap_err();
    assert_eq!(e.ze_result(), common::ze::OUT_OF_DEVICE_MEMORY, "{e}");
    assert!(e.to_string().contains("sub-device 1 of device 0"), "{e}");
    assert_eq!((s1.used_memory(), root.used_memory()), (100 * M, 100 * M));
    // More than a sub-device's whole share at once: unsupported size (its limits are its own).
    let e = ctx
        .alloc_device(
            s0,
            &AllocDesc::new((129 * M) as usize).relaxed_max_size(true),
        )
        .unwrap_err();
    assert_eq!(e.ze_result(), common::ze::UNSUPPORTED_SIZE, "{e}");
    // Physical memory on sub-device 0: charged the same way.
    let page = ctx.query_page_size(s0, 2 << 20).unwrap();
    let ph = ctx
        .create_physical_memory(Some(s0), PhysicalMemoryFlags::AllocateOnDevice, page)
        .unwrap();
    assert_eq!(s0.used_memory(), page as u64);
    assert_eq!(root.used_memory(), 100 * M + page as u64);
    // The root's own memory counts against the whole root, not against a sub-device, and
    // leaves the sub-devices only what is left of the root.
    let b = ctx
        .alloc_device(&root, &AllocDesc::new((120 * M) as usize))
        .unwrap();
    assert_eq!(s0.used_memory(), page as u64);
    assert_eq!(root.used_memory(), 220 * M + page as u64);
    assert_eq!(s0.free_memory().unwrap(), 36 * M - page as u64);
    let e = ctx
        .alloc_device(s0, &AllocDesc::new((40 * M) as usize))
        .unwrap_err();
    assert_eq!(e.ze_result(), common::ze::OUT_OF_DEVICE_MEMORY, "{e}");
    assert!(e.to_string().contains("device 0 has"), "{e}");
    assert_eq!(
        s0.used_memory(),
        page as u64,
        "the refused charge was rolled back"
    );
    // Device 1 is untouched.
    assert_eq!(rt.driver().device(1).unwrap().used_memory(), 0);
    ctx.free_memory(a).unwrap();
    ctx.free_memory(b).unwrap();
    ctx.destroy_physical_memory(ph).unwrap();
    assert_eq!(
        (root.used_memory(), s0.used_memory(), s1.used_memory()),
        (0, 0, 0)
    );
}

#[test]
fn a_sub_devices_queues_copy_and_fill_its_memory() {
    if common::not_applicable_on(Cuda, "a CUDA GPU has no sub-devices") || common::skip() {
        return;
    }
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let root = rt.driver().device(1).unwrap();
    let s = &root.sub_devices()[1];
    let n = 1 << 20;
    let d = ctx.alloc_device(s, &AllocDesc::new(n)).unwrap();
    let h = ctx.alloc_host(&AllocDesc::new(n)).unwrap();
    // An immediate list and a queue of the sub-device, each its own.
    let list = ctx.create_immediate_command_list(s).unwrap();
    list.append_memory_fill(d, &[0x5a, 0xa5], n, None, &[])
        .unwrap();
    list.host_synchronize(u64::MAX).unwrap();
    let q = ctx.create_command_queue(s).unwrap();
    let l2 = ctx.create_command_list(s).unwrap();
    l2.append_memory_copy(h, d, n, None, &[]).unwrap();
    l2.close().unwrap();
    q.execute_command_lists(&[&l2], None).unwrap();
    q.synchronize(u64::MAX).unwrap();
    assert_eq!(common::byte(h), 0x5a);
    assert_eq!(common::byte(h + 1), 0xa5);
    assert_eq!(common::byte(h + n - 1), 0xa5);
    ctx.free_memory(d).unwrap();
    ctx.free_memory(h).unwrap();
}

#[test]
fn sub_device_counts_other_than_0_or_2_to_16_are_refused_naming_the_value() {
    if common::not_applicable_on(
        Cuda,
        "host_subdevices shapes the host backend's devices only",
    ) || common::skip()
    {
        return;
    }
    for n in [1, 17] {
        let e = common::builder()
            .host_devices(1)
            .host_device_memory(256 * M)
            .host_subdevices(n)
            .build()
            .expect_err("refused");
        assert_eq!(e.ze_result(), common::ze::INVALID_ARGUMENT, "{e}");
        assert!(
            e.to_string().contains(&format!("host_subdevices({n})")),
            "{e}"
        );
    }
    // Shares under 2 MiB.
    let e = common::builder()
        .host_devices(1)
        .host_device_memory(6 * M)
        .host_subdevices(4)
        .build()
        .expect_err("1.5 MiB shares");
    assert_eq!(e.ze_result(), common::ze::INVALID_ARGUMENT, "{e}");
    // 0: none.
    let rt = common::builder()
        .host_devices(1)
        .host_device_memory(64 * M)
        .host_subdevices(0)
        .build()
        .unwrap();
    assert!(rt.driver().device(0).unwrap().sub_devices().is_empty());
}
