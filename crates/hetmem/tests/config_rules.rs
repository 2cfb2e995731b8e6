//! One test per configuration rule of the runtime builder and `Runtime::from_env` (issue 2,
//! "Object model"): bad values are refused with `InvalidArgument` naming them, never a runtime
//! with 0-byte devices.
//!
//! The environment cases run in real child processes (this test binary, one test, selected by
//! `HETMEM_CONFIG_CHILD`), so no test changes the environment of a process running others.
//!
//! On the backend under test (`HETMEM_BACKEND`, passed on to the children). The `host_*`
//! settings shape the host backend's devices only and are ignored on cuda (its devices are the
//! GPUs): the rules that `build` applies to them are not applicable there, while the ones
//! `from_env` applies to the variables' values (before any backend starts) are.

mod common;

use common::ze::INVALID_ARGUMENT;

use hetmem::{BackendKind::Cuda, Runtime};

/// Why the host device settings' checks do not apply on cuda.
const HOST_SETTINGS_ONLY: &str = "the host backend's device settings (count, memory, largest \
    allocation) are checked by its build; on cuda they are ignored, the devices being the GPUs";

const CHILD: &str = "HETMEM_CONFIG_CHILD";

/// Runs test `name` of this binary in a child with `env` set (and every other `HETMEM_`
/// variable removed); panics with its output unless it succeeds.
fn in_child(name: &str, env: &[(&str, &str)]) {
    let mut c = common::test_in_child(name);
    for (k, _) in std::env::vars() {
        if k.starts_with("HETMEM_") {
            c.env_remove(k);
        }
    }
    c.env("HETMEM_BACKEND", common::backend().name());
    c.env(CHILD, "1");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let text = common::output_text(&out);
    assert!(out.status.success(), "child {name} failed:\n{text}");
    assert!(text.contains("1 passed"), "child ran no test:\n{text}");
}

#[test]
fn host_device_memory_0_from_the_builder_is_invalid_argument() {
    if common::not_applicable_on(Cuda, HOST_SETTINGS_ONLY) || common::skip() {
        return;
    }
    let e = Runtime::builder()
        .host_devices(2)
        .host_device_memory(0)
        .build()
        .expect_err("0-byte devices must be refused");
    assert_eq!(e.ze_result(), INVALID_ARGUMENT);
    assert!(e.to_string().contains("0 bytes"), "{e}");
    // A largest single allocation of 0 is refused the same way.
    let e = Runtime::builder()
        .host_devices(1)
        .host_device_memory(64 << 20)
        .host_max_alloc_size(0)
        .build()
        .expect_err("a 0-byte largest allocation must be refused");
    assert_eq!(e.ze_result(), INVALID_ARGUMENT);
    assert!(e.to_string().contains("0 bytes"), "{e}");
    // The smallest sensible configuration still works.
    let rt = Runtime::builder()
        .host_devices(1)
        .host_device_memory(64 << 20)
        .build()
        .unwrap();
    assert_eq!(rt.driver().devices()[0].info().capacity, 64 << 20);
}

#[test]
fn hetmem_host_device_memory_0_from_env_is_invalid_argument_naming_the_value() {
    if common::skip() {
        return;
    }
    if std::env::var_os(CHILD).is_none() {
        for v in ["0", "0M", "0G"] {
            in_child(
                "hetmem_host_device_memory_0_from_env_is_invalid_argument_naming_the_value",
                &[("HETMEM_HOST_DEVICE_MEMORY", v)],
            );
        }
        return;
    }
    let v = std::env::var("HETMEM_HOST_DEVICE_MEMORY").unwrap();
    let e = Runtime::from_env().expect_err("0-byte devices must be refused");
    assert_eq!(e.ze_result(), INVALID_ARGUMENT);
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("HETMEM_HOST_DEVICE_MEMORY={v:?}")),
        "{msg}"
    );
}

#[test]
fn hetmem_host_device_memory_not_a_size_is_invalid_argument_naming_the_value() {
    if common::skip() {
        return;
    }
    if std::env::var_os(CHILD).is_none() {
        in_child(
            "hetmem_host_device_memory_not_a_size_is_invalid_argument_naming_the_value",
            &[("HETMEM_HOST_DEVICE_MEMORY", "lots")],
        );
        in_child(
            "hetmem_host_device_memory_not_a_size_is_invalid_argument_naming_the_value",
            &[("HETMEM_HOST_DEVICE_MEMORY", "64M")],
        );
        return;
    }
    let v = std::env::var("HETMEM_HOST_DEVICE_MEMORY").unwrap();
    if v == "64M" {
        if common::part_not_applicable_on(Cuda, HOST_SETTINGS_ONLY) {
            Runtime::from_env().unwrap();
            return;
        }
        // A valid value is taken as given.
        let rt = Runtime::from_env().unwrap();
        for d in rt.driver().devices() {
            assert_eq!(d.info().capacity, 64 << 20);
        }
        return;
    }
    let e = Runtime::from_env().expect_err("not a size");
    assert_eq!(e.ze_result(), INVALID_ARGUMENT);
    assert!(
        e.to_string().contains("HETMEM_HOST_DEVICE_MEMORY=\"lots\""),
        "{e}"
    );
}

#[test]
fn host_device_count_0_is_invalid_argument_decided_by_the_builder() {
    if common::not_applicable_on(Cuda, HOST_SETTINGS_ONLY) || common::skip() {
        return;
    }
    let e = Runtime::builder().host_devices(0).build().unwrap_err();
    assert_eq!(e.ze_result(), INVALID_ARGUMENT, "{e}");
    assert!(e.message().contains("device count is 0"), "{e}");
}

/// Devices are the driver's own stable objects (`zeDeviceGet` hands out the same handles every
/// time): every clone of the driver, and every context's driver, gives the same addresses.
#[test]
fn devices_are_stable_objects_of_their_driver() {
    if common::skip() {
        return;
    }
    let rt = common::builder()
        .host_devices(3)
        .host_device_memory(64 << 20)
        .build()
        .unwrap();
    let drv = rt.driver();
    let ctx = drv.create_context().unwrap();
    let other = ctx.driver();
    // Three host devices as asked; on cuda the GPUs there are.
    let n = drv.device_list().len();
    if common::on_host() {
        assert_eq!(n, 3);
    }
    assert!(n > 0);
    for (i, d) in drv.device_list().iter().enumerate() {
        assert_eq!(d.ordinal(), i as u32);
        assert!(std::ptr::eq(d, drv.device_ref(i as u32).unwrap()));
        assert!(std::ptr::eq(d, other.device_ref(i as u32).unwrap()));
        assert_eq!(drv.device(i as u32).as_ref(), Some(d));
    }
    assert!(drv.device_ref(n as u32).is_none());
    // Another runtime's devices are other objects, unequal.
    let rt2 = common::builder().host_devices(1).build().unwrap();
    assert_ne!(rt2.driver().device_ref(0), drv.device_ref(0));
}
