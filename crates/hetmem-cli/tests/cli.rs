//! The `hetmem` command itself (issue 2): `hetmem info` prints the backend, driver, devices,
//! page sizes and the configuration in force; `hetmem bench <group> --json FILE` writes every
//! figure with `*_ratio` fields; bad input gives a clear error and a non-zero exit.
//!
//! Every `hetmem` here runs with the suite's `HETMEM_BACKEND` (see `common`). `info` reports
//! that backend's runtime; the benchmark groups other than `cuda` set up the host backend
//! themselves (their baselines are host system calls), and `cuda` always the GPU, so those
//! tests are the same on every backend.

mod common;

use common::hetmem;

#[test]
fn info_prints_backend_driver_devices_page_sizes_and_configuration() {
    if common::skip() {
        return;
    }
    let (o, out, err) = hetmem(
        &["info"],
        &[
            ("HETMEM_HOST_DEVICES", "3"),
            ("HETMEM_HOST_DEVICE_MEMORY", "256M"),
            ("HETMEM_HOST_MAX_ALLOC", "64M"),
        ],
    );
    assert!(o.status.success(), "exit {:?}\n{out}\n{err}", o.status);
    let line = |start: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(start))
            .unwrap_or_else(|| panic!("no line starting {start:?} in\n{out}"))
            .trim()
            .to_string()
    };
    // What the runtime says with the same settings, on the suite's backend.
    let rt = hetmem::Runtime::builder()
        .backend(common::backend())
        .host_devices(3)
        .host_device_memory(256 << 20)
        .host_max_alloc_size(64 << 20)
        .build()
        .expect("runtime");
    let drv = rt.driver();
    let ctx = drv.create_context().expect("context");
    assert!(
        line("backend:").ends_with(common::backend().name()),
        "{out}"
    );
    assert!(!line("driver:").trim_end().ends_with("driver:"), "{out}");
    // Case 11: the handle types the driver offers, as the runtime answers them.
    let types = line("IPC handle types:");
    assert!(
        types.starts_with(&format!(
            "IPC handle types: {:#x} (DEFAULT, FABRIC_ACCESSIBLE;",
            drv.ipc_handle_types().raw()
        )),
        "{types}"
    );
    let n = drv.devices().len();
    assert!(line("devices:").ends_with(&format!(" {n}")), "{out}");
    for d in drv.devices() {
        let l = line(&format!("[{}]", d.ordinal()));
        let i = d.info();
        let page = |size: usize| ctx.query_page_size(&d, size).unwrap() as u64;
        // Each figure as printed, checked against the runtime's bytes by the printing rule
        // (`common::shows_bytes`), not by a copy of the command's formatting code.
        let shown = common::parse_device_line(&l);
        for (what, printed, bytes) in [
            ("capacity", &shown.capacity, i.capacity),
            (
                "largest single allocation",
                &shown.max_alloc,
                i.max_alloc_size,
            ),
            ("page size (< 2 MiB)", &shown.small_page, page(1)),
            ("page size (>= 2 MiB)", &shown.large_page, page(2 << 20)),
        ] {
            assert!(
                common::shows_bytes(printed, bytes),
                "{what} {printed:?} is not {bytes} B as the command prints it: {l}"
            );
        }
        assert!(
            l.contains(&format!(
                "page sizes {} (< 2 MiB) / {} (>= 2 MiB)",
                shown.small_page, shown.large_page
            )),
            "{l}"
        );
        assert!(
            l.ends_with(&format!("granularity {} B", i.min_page_size)),
            "{l}"
        );
    }
    assert!(
        out.lines()
            .all(|l| !l.trim_start().starts_with(&format!("[{n}]"))),
        "{out}"
    );
    line("configuration:");
    match std::env::var("HETMEM_BACKEND") {
        Ok(v) => assert_eq!(line("HETMEM_BACKEND="), format!("HETMEM_BACKEND={v}")),
        Err(_) => assert!(line("HETMEM_BACKEND=").contains("unset"), "{out}"),
    }
    // The HETMEM_HOST_* lines are the configuration of a runtime they shape, and only that.
    let shaped = drv.host_config().is_some();
    for var in [
        "HETMEM_HOST_DEVICES=",
        "HETMEM_HOST_DEVICE_MEMORY=",
        "HETMEM_HOST_MAX_ALLOC=",
    ] {
        assert_eq!(
            out.lines().any(|l| l.trim_start().starts_with(var)),
            shaped,
            "{var} in\n{out}"
        );
    }
    if !shaped {
        common::part_not_applicable(&format!(
            "the host settings' figures (3 devices of 256 MiB, largest allocation 64 MiB, page \
             sizes 64 KiB / 2 MiB, the HETMEM_HOST_* lines with their values): HETMEM_HOST_* \
             shape the host backend's modelled devices only; this runtime's are the machine's \
             ({n} device(s), no host configuration)"
        ));
        return;
    }
    assert!(line("devices:").ends_with(" 3"), "{out}");
    for i in 0..3 {
        let d = line(&format!("[{i}]"));
        assert!(d.contains("capacity 256 MiB"), "{d}");
        assert!(d.contains("largest single allocation 64 MiB"), "{d}");
        assert!(
            d.contains("page sizes 64 KiB (< 2 MiB) / 2 MiB (>= 2 MiB)"),
            "{d}"
        );
    }
    assert!(
        out.lines().all(|l| !l.trim_start().starts_with("[3]")),
        "{out}"
    );
    assert!(line("HETMEM_HOST_DEVICES=").starts_with("HETMEM_HOST_DEVICES=3 (env: 3)"));
    assert!(line("HETMEM_HOST_DEVICE_MEMORY=")
        .starts_with("HETMEM_HOST_DEVICE_MEMORY=268435456 (env: 256M)"));
    assert!(line("HETMEM_HOST_MAX_ALLOC=").starts_with("HETMEM_HOST_MAX_ALLOC=67108864 (env: 64M)"));
}

/// Case 12 (sub-devices): `hetmem info` lists each device's sub-devices with their shares and
/// the `HETMEM_HOST_SUBDEVICES` line; on cuda it says why there are none.
#[test]
fn info_shows_sub_devices_and_their_setting() {
    if common::skip() {
        return;
    }
    let (o, out, err) = hetmem(
        &["info"],
        &[
            ("HETMEM_HOST_DEVICES", "2"),
            ("HETMEM_HOST_DEVICE_MEMORY", "256M"),
            ("HETMEM_HOST_SUBDEVICES", "2"),
        ],
    );
    assert!(o.status.success(), "exit {:?}\n{out}\n{err}", o.status);
    let lines = |start: &str| -> Vec<String> {
        out.lines()
            .map(str::trim)
            .filter(|l| l.starts_with(start))
            .map(String::from)
            .collect()
    };
    let note = lines("sub-devices:");
    assert_eq!(note.len(), 1, "{out}");
    let rt = hetmem::Runtime::builder()
        .backend(common::backend())
        .host_devices(2)
        .host_device_memory(256 << 20)
        .host_subdevices(2)
        .build()
        .expect("runtime");
    let drv = rt.driver();
    if drv.host_config().is_none() {
        // cuda: none, and why.
        assert!(drv.devices().iter().all(|d| d.sub_devices().is_empty()));
        let why = drv
            .sub_devices_note()
            .expect("a reason on a backend without sub-devices");
        assert_eq!(note[0], format!("sub-devices: {why}"), "{out}");
        assert!(why.contains("MIG"), "{why}");
        assert!(lines("sub-device ").is_empty(), "{out}");
        common::part_not_applicable(
            "the sub-device lines (2 per device, 128 MiB each): a CUDA GPU has no Level Zero \
             sub-devices (the sub-devices line says why)",
        );
        return;
    }
    assert_eq!(note[0], "sub-devices: 2 per device", "{out}");
    let subs = lines("sub-device ");
    assert_eq!(subs.len(), 4, "{out}");
    for (k, l) in subs.iter().enumerate() {
        assert!(
            l.starts_with(&format!(
                "sub-device {}: capacity 128 MiB (its share of device {})",
                k % 2,
                k / 2
            )),
            "{l}"
        );
    }
    assert!(
        lines("HETMEM_HOST_SUBDEVICES=")[0].starts_with("HETMEM_HOST_SUBDEVICES=2 (env: 2)"),
        "{out}"
    );
    // Unset: none, and the line says how to get them.
    let (o, out, _) = hetmem(&["info"], &[]);
    assert!(o.status.success());
    assert!(
        out.contains("sub-devices: none (HETMEM_HOST_SUBDEVICES=N"),
        "{out}"
    );
}

#[test]
fn info_with_a_bad_sub_device_count_fails_naming_the_value() {
    for (v, says) in [
        ("1", "HETMEM_HOST_SUBDEVICES=1"),
        ("17", "HETMEM_HOST_SUBDEVICES=17"),
        ("two", "HETMEM_HOST_SUBDEVICES=\"two\""),
    ] {
        let (o, out, err) = hetmem(
            &["info", "--backend", "host"],
            &[("HETMEM_HOST_SUBDEVICES", v)],
        );
        assert_eq!(o.status.code(), Some(1), "{v} accepted:\n{out}");
        assert!(err.contains(says), "{v}: {err}");
        assert!(!out.contains("devices:"), "{out}");
    }
}

#[test]
fn info_with_host_device_memory_0_fails_naming_the_value() {
    let (o, out, err) = hetmem(&["info"], &[("HETMEM_HOST_DEVICE_MEMORY", "0")]);
    assert!(!o.status.success(), "0-byte devices accepted:\n{out}");
    assert_eq!(o.status.code(), Some(1));
    assert!(err.contains("HETMEM_HOST_DEVICE_MEMORY=\"0\""), "{err}");
    assert!(!out.contains("devices:"), "{out}");
}

#[test]
fn bench_vmm_json_writes_every_ratio_finite_and_positive_including_2mib_map_unmap_set_access() {
    let dir = std::env::temp_dir().join(format!("hetmem-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("vmm.json");
    let _ = std::fs::remove_file(&file);
    let (o, out, err) = hetmem(
        &[
            "bench",
            "vmm",
            "--iters",
            "4",
            "--rounds",
            "1",
            "--live-mappings",
            "200",
            "--json",
            file.to_str().unwrap(),
        ],
        &[],
    );
    assert!(o.status.success(), "exit {:?}\n{out}\n{err}", o.status);
    assert!(out.contains("hetmem bench vmm"), "no table:\n{out}");
    let text = std::fs::read_to_string(&file).expect("the JSON file");
    std::fs::remove_dir_all(&dir).ok();
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let obj = v.as_object().expect("a JSON object");
    assert_eq!(obj["group"], "vmm");
    assert_eq!(obj["iters"], 4);
    assert_eq!(obj["rounds"], 1);
    let ratios: Vec<(&String, f64)> = obj
        .iter()
        .filter(|(k, _)| k.ends_with("_ratio"))
        .map(|(k, v)| {
            (
                k,
                v.as_f64()
                    .unwrap_or_else(|| panic!("{k} = {v} is not a number")),
            )
        })
        .collect();
    for want in [
        "map_2mib_ratio",
        "unmap_2mib_ratio",
        "set_access_2mib_ratio",
    ] {
        assert!(
            ratios.iter().any(|(k, _)| k.as_str() == want),
            "no {want} in\n{text}"
        );
    }
    assert!(ratios.len() >= 9, "too few ratios in\n{text}");
    for (k, r) in &ratios {
        assert!(r.is_finite() && *r > 0.0, "{k} = {r}");
        // Each ratio is hetmem's figure over the baseline's, both written next to it.
        let stem = k.trim_end_matches("_ratio");
        let h = obj[&format!("{stem}_ns")].as_f64().expect("hetmem figure");
        let b = obj[&format!("{stem}_baseline_ns")]
            .as_f64()
            .expect("baseline figure");
        assert!(
            (h / b - r).abs() <= 1e-9 * r.max(1.0),
            "{k}: {h} / {b} != {r}"
        );
    }
}

/// `bench cuda` measures every cuda-backend operation against the bare driver calls; without
/// a GPU it fails at once, saying why, with nothing written.
#[test]
fn bench_cuda_writes_ratios_on_a_gpu_and_says_why_not_elsewhere() {
    let dir = std::env::temp_dir().join(format!("hetmem-bench-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("cuda.json");
    let j = json.to_str().unwrap();
    let (o, out, err) = hetmem(
        &[
            "bench", "cuda", "--iters", "8", "--rounds", "1", "--json", j,
        ],
        &[],
    );
    if !o.status.success() {
        assert_eq!(o.status.code(), Some(1), "{out}\n{err}");
        assert!(err.contains("the cuda backend cannot start"), "{err}");
        assert!(!json.exists(), "a JSON file was written for a failed run");
        // The GPU this bench needs is missing here, whatever backend the suite runs on.
        common::skipped_for(
            hetmem::BackendKind::Cuda,
            &format!("hetmem bench cuda: {}", err.trim()),
        );
    } else {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        for k in [
            "map_2mib_ratio",
            "unmap_2mib_ratio",
            "set_access_2mib_ratio",
            "copy_d2d_1g_ratio",
        ] {
            let r = v[k].as_f64().unwrap_or_else(|| panic!("no {k} in {v}"));
            assert!(r.is_finite() && r > 0.0, "{k} = {r}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_unknown_group_fails_listing_every_group() {
    let (o, out, err) = hetmem(&["bench", "nosuch"], &[]);
    assert_eq!(o.status.code(), Some(1), "{out}\n{err}");
    assert!(err.contains("unknown benchmark group \"nosuch\""), "{err}");
    let listed = err
        .split("groups: ")
        .nth(1)
        .unwrap_or_else(|| panic!("no group list in {err}"))
        .trim();
    let mut groups: Vec<&str> = listed.split(", ").collect();
    groups.sort_unstable();
    assert_eq!(
        groups,
        ["acl", "cuda", "ipc", "kv", "managed", "usm", "vmm", "ze"],
        "{err}"
    );
}

#[test]
fn bench_ze_json_has_a_finite_ratio_and_added_ns_per_operation() {
    // The library is looked for next to the hetmem executable (as the bench itself does).
    let exe = common::hetmem_bin();
    let dir = exe.parent().unwrap();
    let have_lib =
        dir.join("libze_hetmem.so").exists() || dir.join("deps/libze_hetmem.so").exists();
    // Installed (ldconfig knows it) or on LD_LIBRARY_PATH (scripts/gpu-suite puts the packed
    // loader there): where dlopen finds it.
    let on_path = std::env::var_os("LD_LIBRARY_PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("libze_loader.so.1").exists()));
    let have_loader = on_path
        || std::process::Command::new("sh")
            .args([
                "-c",
                "PATH=$PATH:/sbin:/usr/sbin ldconfig -p | grep -q 'libze_loader.so.1 '",
            ])
            .status()
            .is_ok_and(|s| s.success());
    if !have_lib || !have_loader {
        common::skipped(if have_lib {
            "hetmem bench ze: libze_loader.so.1 is not installed"
        } else {
            "hetmem bench ze: libze_hetmem.so is not next to the hetmem executable (not built)"
        });
        return;
    }
    let json = std::env::temp_dir().join(format!("hetmem-bench-ze-{}.json", std::process::id()));
    let (o, out, err) = hetmem(
        &[
            "bench",
            "ze",
            "--iters",
            "16",
            "--rounds",
            "1",
            "--json",
            json.to_str().unwrap(),
        ],
        &[],
    );
    assert!(o.status.success(), "{out}\n{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).ok();
    for k in [
        "map_unmap_2mib",
        "set_access_2mib",
        "get_access",
        "alloc_free_64kib",
        "ipc_64kib",
    ] {
        let r = v[format!("{k}_ratio")]
            .as_f64()
            .unwrap_or_else(|| panic!("no {k}_ratio in {v}"));
        assert!(r.is_finite() && r > 0.0, "{k}_ratio = {r}");
        assert!(
            v[format!("{k}_added_ns")]
                .as_f64()
                .is_some_and(f64::is_finite),
            "{k}_added_ns"
        );
    }
}

#[test]
fn bench_acl_json_has_a_ratio_and_the_added_ns_of_each_c_entry_point() {
    let dir = std::env::temp_dir().join(format!("hetmem-bench-acl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("acl.json");
    let (o, out, err) = hetmem(
        &[
            "bench",
            "acl",
            "--iters",
            "16",
            "--rounds",
            "3",
            "--json",
            json.to_str().unwrap(),
        ],
        &[],
    );
    if !o.status.success() && err.contains("userfaultfd") {
        common::skipped(&format!(
            "hetmem bench acl: managed memory unavailable here: {}",
            err.trim()
        ));
        return;
    }
    assert!(o.status.success(), "{out}\n{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for op in [
        "get_attr_2mib",
        "advise_2mib",
        "prefetch_2mib",
        "map_unmap_2mib",
    ] {
        let r = v[format!("{op}_ratio")].as_f64().unwrap_or(f64::NAN);
        assert!(r.is_finite() && r > 0.0, "{op}_ratio = {r}");
        assert!(
            v[format!("{op}_added_ns")].is_f64(),
            "{op}_added_ns missing"
        );
        assert!(out.contains("added per call"), "{out}");
    }
    // The sleep-mode VMM rows: each step at both shapes, C over Rust with the added ns per call
    // against the stated target; on cuda also C over the bare driver calls.
    let cuda = out.contains("backend: cuda");
    for step in [
        "reserve",
        "malloc_physical",
        "map",
        "unmap",
        "free_physical",
        "release",
    ] {
        for shape in ["2mib", "1gib_32mib"] {
            let k = format!("acl_vmm_{step}_{shape}");
            let r = v[format!("{k}_ratio")].as_f64().unwrap_or(f64::NAN);
            assert!(r.is_finite() && r > 0.0, "{k}_ratio = {r}");
            for f in [
                "_ns",
                "_baseline_ns",
                "_added_ns_per_call",
                "_added_noise_ns_per_call",
            ] {
                assert!(
                    v[format!("{k}{f}")].as_f64().is_some_and(f64::is_finite),
                    "{k}{f} missing in {v}"
                );
            }
            assert_eq!(
                v[format!("{k}_vs_driver_ratio")].is_f64(),
                cuda,
                "{k}_vs_driver_ratio on cuda only"
            );
        }
    }
    assert!(out.contains("target <= 150 ns added"), "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bench_kv_json_writes_grow_and_release_ratios_against_the_bare_syscalls() {
    let dir = std::env::temp_dir().join(format!("hetmem-cli-kv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("kv.json");
    let (o, out, err) = hetmem(
        &[
            "bench",
            "kv",
            "--iters",
            "4",
            "--rounds",
            "1",
            "--json",
            file.to_str().unwrap(),
        ],
        &[],
    );
    assert!(o.status.success(), "exit {:?}\n{out}\n{err}", o.status);
    assert!(out.contains("hetmem bench kv"), "no table:\n{out}");
    assert!(
        out.contains("mmap(MAP_FIXED) memfd + first writes"),
        "{out}"
    );
    let text = std::fs::read_to_string(&file).expect("the JSON file");
    std::fs::remove_dir_all(&dir).ok();
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(v["group"], "kv");
    for stem in ["grow_2mib", "grow_vs_populate_2mib", "release_2mib"] {
        let r = v[format!("{stem}_ratio")]
            .as_f64()
            .unwrap_or_else(|| panic!("no {stem}_ratio in\n{text}"));
        let h = v[format!("{stem}_ns")].as_f64().expect("hetmem figure");
        let b = v[format!("{stem}_baseline_ns")]
            .as_f64()
            .expect("baseline figure");
        assert!(r.is_finite() && r > 0.0 && h > 0.0 && b > 0.0, "{text}");
        assert!(
            (h / b - r).abs() <= 1e-9 * r.max(1.0),
            "{stem}: {h} / {b} != {r}"
        );
    }
}
