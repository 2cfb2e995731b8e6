//! The C test programs of `tests/c/acl/`, compiled against `crates/hetmem-acl/include` and
//! linked with `-lascendcl`, each run as its own process on the backend `HETMEM_BACKEND` names
//! (see `common`; a check that cannot apply there says so in a `NOT APPLICABLE` line).

mod common;

/// Header test: struct sizes and offsets, enum values, error codes against the published
/// header's numbers.
#[test]
fn c_header_layout_matches_the_published_acl_headers() {
    let out = common::run_ok("header_layout");
    assert!(out.contains("header layout ok"), "{out}");
}

/// The managed-memory cases of `cases/managed.md`, in C.
#[test]
fn c_managed_cases_of_the_cases_file() {
    common::run_managed("managed_cases");
}

/// The eight cases of `cases/acl.md`, in C (`tests/c/acl/acl_cases.c`, one `case N ok` line
/// each): 1 the recent error message is read once; 2 `aclrtDeviceGetBareTgid`; 3 imported
/// physical memory counts against the device until the last import is freed (on the host
/// backend a device of 64 MiB, filled); 4 `aclrtDestroyStreamForce` discards queued work and
/// `aclrtResetDeviceForce` resets at once, other holders' memory staying correct; 5
/// `aclrtMemSetAccess` / `aclrtMemGetAccess`; 6 `aclrtIpcMem*` between processes, a process
/// off the pid list refused, the key dead after close; 7 `aclrtMemRetainAllocationHandle` and
/// `aclrtMemGetAllocationPropertiesFromHandle`; 8 `aclrtGetCurrentContext` without one answers
/// 107002 with `*ctx == NULL`.
#[test]
fn c_acl_cases_of_the_cases_file() {
    let out = if common::backend() == "host" {
        common::passed(
            "acl_cases",
            common::run_env(
                "acl_cases",
                &[],
                &[
                    ("HETMEM_HOST_DEVICES", "2"),
                    ("HETMEM_HOST_DEVICE_MEMORY", "64M"),
                ],
            ),
        )
    } else {
        common::run_ok("acl_cases")
    };
    for n in 1..=8 {
        assert!(out.contains(&format!("case {n} ok")), "case {n}:\n{out}");
    }
    assert!(out.contains("acl cases ok"), "{out}");
}

/// The calls beyond the core families (`tests/c/acl/family.c`): allocation and free variants,
/// 2-D and batch copies, 32-bit fills, host registration, pointer attributes, V2 and fabric
/// shareable handles, value write / wait, event flags, and the declared calls answering 207000
/// with their reason.
#[test]
fn c_family_beyond_the_core_calls() {
    let out = common::run_ok("family");
    assert!(out.contains("family ok"), "{out}");
}

/// Set-up calls, per-thread current device and context, error codes and messages, stale and
/// foreign handles, no sticky error.
#[test]
fn c_setup_contexts_errors_and_handles() {
    let out = common::run_ok("setup_errors");
    assert!(out.contains("setup and errors ok"), "{out}");
}

/// Memory calls (every `aclrtMemMallocPolicy`, every `aclrtMemcpyKind`, each error), streams and
/// events ordering work across streams.
#[test]
fn c_memory_streams_and_events() {
    let out = common::run_ok("memory_streams");
    assert!(out.contains("memory and streams ok"), "{out}");
}

/// The eight range attributes over mixed ranges, every `dataSize` rule, `GetAttrs`, advice and
/// prefetch argument errors.
#[test]
fn c_managed_range_attributes_over_mixed_ranges() {
    common::run_managed("managed_attrs");
}

/// ACL virtual memory across real processes: reserve, map, export to a second process (and a
/// process not on the pid list, refused), sleep (unmap, free physical) and wake (re-create,
/// re-map at the same address), and every argument error of the virtual-memory calls.
#[test]
fn c_vmm_export_sleep_and_wake_across_processes() {
    let out = common::run_ok("vmm_sleep_wake");
    assert!(
        out.contains("vmm sleep and wake across processes ok"),
        "{out}"
    );
}

/// Without userfaultfd (a seccomp filter refuses it), managed calls answer 207000 saying why
/// and streams, events and device memory keep working.
#[test]
fn c_without_userfaultfd_managed_is_unsupported_and_the_rest_works() {
    let out = common::run_ok("managed_unsupported");
    assert!(out.contains("managed unsupported ok"), "{out}");
}

/// Managed memory used with streams, device memory, virtual memory and several threads: data
/// stays right through faults, stream copies, fills and prefetches.
#[test]
fn c_managed_memory_with_streams_threads_and_virtual_memory() {
    common::run_managed("managed_streams");
}

/// The headers declare exactly what the library exports: every `acl*` function of
/// `include/acl/*.h` is a dynamic symbol of `libascendcl.so`, and the library exports nothing
/// else.
#[test]
fn headers_declare_exactly_the_exported_symbols() {
    let lib = common::lib_dir().join("libascendcl.so");
    let out = match std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
    {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            common::skipped(
                "headers_declare_exactly_the_exported_symbols",
                "nm (binutils) is not installed",
            );
            return;
        }
        r => r.expect("running nm (binutils)"),
    };
    assert!(out.status.success(), "nm failed on {lib:?}");
    let mut exported: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect();
    exported.sort();
    let mut declared: Vec<String> = Vec::new();
    for h in ["acl.h", "acl_base.h", "acl_rt.h"] {
        let text =
            std::fs::read_to_string(common::root().join("crates/hetmem-acl/include/acl").join(h))
                .unwrap();
        for line in text.lines().filter(|l| l.contains("ACL_FUNC_VISIBILITY")) {
            if let Some(name) = line
                .split('(')
                .next()
                .and_then(|head| head.split_whitespace().last())
            {
                if name.starts_with("acl") || name.starts_with("*acl") {
                    declared.push(name.trim_start_matches('*').to_string());
                }
            }
        }
    }
    declared.sort();
    assert_eq!(declared.len(), 111, "{declared:?}");
    assert_eq!(exported, declared);
}

/// `HETMEM_BACKEND` and the host-device variables choose the backend, the device count and
/// each device's memory; a bad value makes `aclInit` fail naming it, and changes nothing.
/// `HETMEM_BACKEND=cuda` starts the cuda backend where the CUDA driver and a GPU are (every GPU
/// with its memory), and is refused naming cuda where they are not: whichever of the two this
/// machine is, the other one is reported not applicable.
#[test]
fn c_environment_chooses_backend_devices_and_capacity() {
    let out = common::passed(
        "env_config",
        common::run_env(
            "env_config",
            &[],
            &[
                ("HETMEM_HOST_DEVICES", "3"),
                ("HETMEM_HOST_DEVICE_MEMORY", "96M"),
            ],
        ),
    );
    assert!(out.contains("init 0"), "{out}");
    assert!(out.contains("devices 3"), "{out}");
    for d in 0..3 {
        assert!(
            out.contains(&format!("device {d} total {}", 96 << 20)),
            "{out}"
        );
    }
    let out = common::passed(
        "env_config",
        common::run_env("env_config", &[], &[("HETMEM_HOST_DEVICES", "many")]),
    );
    assert!(
        out.contains("init 107000") && out.contains("HETMEM_HOST_DEVICES"),
        "{out}"
    );
    let out = common::passed(
        "env_config",
        common::run_env("env_config", &[], &[("HETMEM_BACKEND", "cuda")]),
    );
    let na = |what: &str, why: &str| {
        common::loud(&format!(
            "NOT APPLICABLE ({}) tests/c/acl/env_config.c {what} [part]: {why}",
            common::backend()
        ))
    };
    if out.contains("init 0 ") {
        // The cuda backend started: every device it reports has memory.
        let n: usize = out
            .lines()
            .find_map(|l| l.strip_prefix("devices "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no device count:\n{out}"));
        assert!(n >= 1, "{out}");
        for d in 0..n {
            let total: u64 = out
                .lines()
                .find_map(|l| l.strip_prefix(&format!("device {d} total ")))
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or_else(|| panic!("no total for device {d}:\n{out}"));
            assert!(total > 0, "{out}");
        }
        na(
            "HETMEM_BACKEND=cuda is refused without a GPU",
            &format!(
                "the cuda backend started here ({n} device{}), so its refusal cannot be seen",
                if n == 1 { "" } else { "s" }
            ),
        );
    } else {
        assert!(out.contains("init 207000") && out.contains("cuda"), "{out}");
        let why = out.lines().next().unwrap_or("").trim();
        na(
            "HETMEM_BACKEND=cuda starts on a GPU",
            &format!("the cuda backend cannot start here ({why})"),
        );
    }
}

/// Eight threads at once: per-thread devices, streams, events recorded by one thread ordering
/// another's stream, managed and virtual memory churn, and a context destroyed under a thread
/// (its later calls fail cleanly, its memory goes).
#[test]
fn c_threads_share_events_and_contexts_safely() {
    let out = common::run_ok("threads");
    assert!(out.contains("threads ok"), "{out}");
}

/// The shareable-handle file is created fresh (`O_EXCL | O_NOFOLLOW`): a symlink planted at its
/// predictable name is never written through.
#[test]
fn c_shareable_handle_export_never_writes_through_a_planted_symlink() {
    let out = common::run_ok("share_file_links");
    assert!(out.contains("share file links ok"), "{out}");
}

/// Physical handles and the VMM calls across the library's life (`tests/c/acl/vmm_handles.c`):
/// every VMM call answers 100001 before `aclInit` and after `aclFinalize` (before its argument
/// checks); a handle of an earlier instance, a freed handle whose slot a new one took, and a
/// handle with any one bit flipped are 107000 everywhere; a release with a mapping in it
/// succeeds and takes its own mappings' records along, and only those (with more records than
/// granules and fewer).
#[test]
fn c_vmm_handles_unknown_across_life_cycle_and_reuse() {
    let out = common::run_ok("vmm_handles");
    assert!(out.contains("vmm handles ok"), "{out}");
}
