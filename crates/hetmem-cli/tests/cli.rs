//! The `hetmem` command itself (issue 2): `hetmem info` prints the backend, driver, devices,
//! page sizes and the configuration in force; `hetmem bench <group> --json FILE` writes every
//! figure with `*_ratio` fields; bad input gives a clear error and a non-zero exit.

use std::process::{Command, Output};

/// Runs the built `hetmem` with `args`, every inherited `HETMEM_` variable removed and `env`
/// set.
fn hetmem(args: &[&str], env: &[(&str, &str)]) -> (Output, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hetmem"));
    c.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("HETMEM_") {
            c.env_remove(k);
        }
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().expect("run hetmem");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    (o, out, err)
}

#[test]
fn info_prints_backend_driver_devices_page_sizes_and_configuration() {
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
    assert!(line("backend:").ends_with("host"), "{out}");
    assert!(!line("driver:").trim_end().ends_with("driver:"), "{out}");
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
    line("configuration:");
    assert!(line("HETMEM_BACKEND=").contains("unset"), "{out}");
    assert!(line("HETMEM_HOST_DEVICES=").starts_with("HETMEM_HOST_DEVICES=3 (env: 3)"));
    assert!(line("HETMEM_HOST_DEVICE_MEMORY=")
        .starts_with("HETMEM_HOST_DEVICE_MEMORY=268435456 (env: 256M)"));
    assert!(line("HETMEM_HOST_MAX_ALLOC=").starts_with("HETMEM_HOST_MAX_ALLOC=67108864 (env: 64M)"));
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
    assert_eq!(groups, ["ipc", "kv", "managed", "usm", "vmm"], "{err}");
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
