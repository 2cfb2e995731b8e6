//! Builds and runs the C suite of `tests/c/ze/` (repository root): C programs compiled against
//! `<level_zero/ze_api.h>` (plus `include/ze_hetmem.h` for newer declarations), linked with
//! `-lze_loader` and run with `ZE_ENABLE_ALT_DRIVERS=<libze_hetmem.so>` (or linked with
//! `-lze_hetmem` directly, for the calls the installed loader has no slot for). Every
//! loader-linked program runs twice: plainly, and under the loader's validation layer
//! (`ZE_ENABLE_VALIDATION_LAYER=1 ZE_ENABLE_PARAMETER_VALIDATION=1`) where the loader ships it.
//!
//! Environment (the conventions of `hetmem_testkit`, shared with the ACL C suite):
//! - `HETMEM_TEST_PREBUILT=1`: never run cargo; `libze_hetmem.so` is looked for next to this
//!   test executable and in its parent folder (`scripts/gpu-pack` puts test executables in
//!   `<pack>/tests/` and the cdylibs in `<pack>/`).
//! - `HETMEM_REPO_ROOT`: the repository root (C sources, headers); default the compile-time
//!   root if it holds `tests/c/ze`, else the current directory.
//! - `HETMEM_TEST_TMPDIR`: where the programs are compiled to (its `hetmem-ze-c/`); default
//!   `CARGO_TARGET_TMPDIR/hetmem-ze-c` if it can be created, else
//!   `<temp dir>/hetmem-c-tests/hetmem-ze-c`.
//! - `HETMEM_ZE_SYSROOT`: a folder with `include/level_zero/*.h` and `lib/libze_loader.so*` (and
//!   `libze_validation_layer.so*`), used instead of `/usr/include` and the system loader
//!   (`-I`, `-L`, `-rpath`, and `LD_LIBRARY_PATH` when running: the loader opens the
//!   validation layer by soname).
//! - `HETMEM_BACKEND`: passed to the programs (default `host`); the host backend's two modelled
//!   devices of 256 MiB (`HETMEM_HOST_DEVICES`, `HETMEM_HOST_DEVICE_MEMORY`) are set only there.
//!
//! A check a program cannot apply on this machine (a second device, filling a 139 GiB GPU, ...)
//! is a `NOT APPLICABLE (<backend>) ze/<program>.c <what> [part]: <reason>` line, re-emitted
//! here past the test capture (`scripts/gpu-suite` counts them). On the host backend, with the
//! environment set here, every check of every program applies: a program's not-applicable line
//! there fails the test. The suite's own lines (no loader here, no validation layer, no second
//! set of headers) take the same form, without `[part]` where a whole test could not run.
//!
//! Missing headers, loader or C compiler: a loud `SKIP` line (CI installs them: `.ci/run`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

// `backend()` here is the backend name passed to the programs (`HETMEM_BACKEND`, default host).
use hetmem_testkit::{child_backend as backend, env_set, loud, prebuilt};

fn repo_root() -> PathBuf {
    static R: OnceLock<PathBuf> = OnceLock::new();
    R.get_or_init(|| hetmem_testkit::repo_root("tests/c/ze"))
        .clone()
}

/// `HETMEM_ZE_SYSROOT`, if set: the Level Zero headers and loader to use.
fn sysroot() -> Option<PathBuf> {
    env_set("HETMEM_ZE_SYSROOT").map(PathBuf::from)
}

/// The folder holding `level_zero/`.
fn include_dir() -> PathBuf {
    sysroot().map_or_else(|| PathBuf::from("/usr/include"), |r| r.join("include"))
}

/// The sysroot's `lib/` files whose names start with `prefix`, sorted.
fn sysroot_libs(prefix: &str) -> Vec<PathBuf> {
    let Some(r) = sysroot() else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = std::fs::read_dir(r.join("lib"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(prefix))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Whether the system's dynamic linker cache knows a library whose name matches `pattern`.
fn ldconfig_has(pattern: &str) -> bool {
    Command::new("sh")
        .args([
            "-c",
            &format!("PATH=$PATH:/sbin:/usr/sbin ldconfig -p | grep -q '{pattern}'"),
        ])
        .status()
        .is_ok_and(|s| s.success())
}

/// Why the suite cannot run here, if it cannot.
fn missing() -> Option<String> {
    let header = include_dir().join("level_zero/ze_api.h");
    if !header.exists() {
        return Some(match sysroot() {
            Some(r) => format!(
                "{} is missing (HETMEM_ZE_SYSROOT={} must hold include/level_zero/)",
                header.display(),
                r.display()
            ),
            None => format!(
                "{} is missing (apt-get install libze-dev)",
                header.display()
            ),
        });
    }
    match sysroot() {
        Some(r) => {
            if sysroot_libs("libze_loader.so").is_empty() {
                return Some(format!(
                    "{}/lib/libze_loader.so* is missing (HETMEM_ZE_SYSROOT)",
                    r.display()
                ));
            }
        }
        None => {
            if !ldconfig_has("libze_loader.so ") {
                return Some(
                    "libze_loader.so is missing (apt-get install libze1 libze-dev)".into(),
                );
            }
        }
    }
    if Command::new("cc").arg("--version").output().is_err() {
        return Some("no C compiler (cc)".into());
    }
    None
}

fn skip_reason() -> Option<&'static str> {
    static R: OnceLock<Option<String>> = OnceLock::new();
    R.get_or_init(|| {
        let r = missing();
        if let Some(why) = &r {
            // Past the test harness's capture, so the skip shows in a passing run too.
            let _ = std::io::Write::write_fmt(
                &mut std::io::stderr(),
                format_args!("\n*** SKIP hetmem-ze C suite: {why} ***\n"),
            );
            let _ = std::io::Write::write_all(&mut std::io::stderr(), b"\n");
        }
        r
    })
    .as_deref()
}

/// The driver library: with `HETMEM_TEST_PREBUILT=1` the one next to this executable or in its
/// parent folder; otherwise that of this build (built by `cargo test` with the crate's lib
/// target; built here if it is missing).
fn driver_lib() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        // The newest copy in the test executable's folder and its parent
        // (hetmem_testkit::prebuilt_dirs).
        let dirs = hetmem_testkit::prebuilt_dirs();
        let deps = dirs[0].clone();
        let profile = dirs.get(1).expect("profile dir").clone();
        let find = || {
            [
                profile.join("libze_hetmem.so"),
                deps.join("libze_hetmem.so"),
            ]
            .into_iter()
            .filter(|p| p.exists())
            .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        };
        if let Some(p) = find() {
            return p.canonicalize().unwrap();
        }
        assert!(
            !prebuilt(),
            "HETMEM_TEST_PREBUILT=1: no libze_hetmem.so in {} or {} (scripts/gpu-pack puts it \
             in the parent folder of the tests)",
            deps.display(),
            profile.display()
        );
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut c = Command::new(cargo);
        c.current_dir(repo_root())
            .args(["build", "-p", "hetmem-ze", "--lib"]);
        if profile.file_name().is_some_and(|n| n == "release") {
            c.arg("--release");
        }
        let st = c.status().expect("cargo build -p hetmem-ze");
        assert!(st.success(), "building libze_hetmem.so failed");
        find()
            .expect("libze_hetmem.so after cargo build")
            .canonicalize()
            .unwrap()
    })
    .clone()
}

/// Where the programs are compiled to (see the module docs).
fn out_dir() -> PathBuf {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let d = hetmem_testkit::test_tmpdir("hetmem-ze-c", || {
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("hetmem-ze-c")
        });
        d.canonicalize().unwrap_or(d)
    })
    .clone()
}

#[derive(Clone, Copy, PartialEq)]
enum Link {
    /// `-lze_loader`: through the official loader.
    Loader,
    /// `-lze_hetmem`: the library directly.
    Direct,
}

/// Generates `ddi_slots.h` from the installed `ze_ddi.h`: every table with its getter and every
/// slot with the function it must hold, in declaration order.
fn ddi_slots_header() -> PathBuf {
    ddi_slots_header_from(&include_dir().join("level_zero/ze_ddi.h"), &out_dir())
}

fn ddi_slots_header_from(ddi: &Path, dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(ddi).expect("ze_ddi.h");
    let mut out =
        String::from("/* generated by crates/hetmem-ze/tests/c_suite.rs from ze_ddi.h */\n");
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i].trim();
        if let Some(rest) = l.strip_prefix("typedef struct _") {
            if rest.ends_with("_dditable_t") && rest.starts_with("ze_") && rest != "ze_dditable_t" {
                let ty = rest.to_string();
                let mut slots = Vec::new();
                i += 1;
                while !lines[i].trim_start().starts_with('}') {
                    let f: Vec<&str> = lines[i].split_whitespace().collect();
                    if f.len() == 2 && f[0].starts_with("ze_pfn") {
                        let func = format!(
                            "ze{}",
                            f[0].trim_start_matches("ze_pfn").trim_end_matches("_t")
                        );
                        slots.push((f[1].trim_end_matches(';').to_string(), func));
                    }
                    i += 1;
                }
                // The getter declared after the table.
                let mut j = i;
                let getter = loop {
                    let t = lines[j].trim();
                    if t.starts_with("zeGet") && t.ends_with("ProcAddrTable(") {
                        break t.trim_end_matches('(').to_string();
                    }
                    j += 1;
                };
                out += &format!("TABLE_BEGIN({ty}, {getter})\n");
                for (field, func) in slots {
                    out += &format!("SLOT({ty}, {field}, {func})\n");
                }
                out += "TABLE_END\n";
            }
        }
        i += 1;
    }
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("ddi_slots.h");
    // Written aside and renamed: tests run in parallel, and another may be compiling with it.
    let tmp = dir.join(format!(
        "ddi_slots.h.{}.{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&tmp, out).unwrap();
    std::fs::rename(&tmp, &p).unwrap();
    p
}

/// Compiles `tests/c/ze/<name>.c`; returns the program.
fn build(name: &str, link: Link) -> PathBuf {
    build_with(name, link, None)
}

/// As [`build`], against the headers under `extra` (a directory holding `level_zero/`)
/// before the system's (or the sysroot's).
fn build_with(name: &str, link: Link, extra: Option<&Path>) -> PathBuf {
    let src = repo_root().join("tests/c/ze").join(format!("{name}.c"));
    let exe = out_dir().join(format!(
        "{name}-{}{}",
        if link == Link::Loader {
            "loader"
        } else {
            "direct"
        },
        if extra.is_some() { "-extra" } else { "" }
    ));
    let lib = driver_lib();
    let libdir = lib.parent().unwrap();
    let gen = match extra {
        None => ddi_slots_header(),
        Some(x) => ddi_slots_header_from(&x.join("level_zero/ze_ddi.h"), &out_dir().join("extra")),
    };
    let mut c = Command::new("cc");
    c.args([
        "-std=gnu11",
        "-O1",
        "-g",
        "-Wall",
        "-Werror",
        "-Wno-unused-function",
    ]);
    if let Some(x) = extra {
        c.arg(format!("-I{}", x.display()));
    }
    if sysroot().is_some() {
        c.arg(format!("-I{}", include_dir().display()));
    }
    c.arg(format!(
        "-I{}",
        repo_root().join("crates/hetmem-ze/include").display()
    ))
    .arg(format!("-I{}", repo_root().join("tests/c/ze").display()))
    .arg(format!("-I{}", gen.parent().unwrap().display()))
    .arg(&src)
    .arg("-o")
    .arg(&exe);
    match link {
        Link::Loader => match sysroot() {
            None => {
                c.args(["-lze_loader", "-ldl", "-lpthread"]);
            }
            Some(r) => {
                let lib = r.join("lib");
                // -lze_loader needs the unversioned name; a sysroot may hold only the soname.
                let loader = if lib.join("libze_loader.so").exists() {
                    "-lze_loader".to_string()
                } else {
                    let so = sysroot_libs("libze_loader.so");
                    format!(
                        "-l:{}",
                        so[0]
                            .file_name()
                            .unwrap()
                            .to_str()
                            .expect("UTF-8 file name")
                    )
                };
                c.arg(format!("-L{}", lib.display()))
                    .arg(loader)
                    .arg(format!("-Wl,-rpath,{}", lib.display()))
                    .args(["-ldl", "-lpthread"]);
            }
        },
        Link::Direct => {
            c.arg(format!("-L{}", libdir.display()))
                .arg("-lze_hetmem")
                .arg(format!("-Wl,-rpath,{}", libdir.display()))
                .args(["-ldl", "-lpthread"]);
        }
    }
    let o = c.output().expect("cc");
    assert!(
        o.status.success(),
        "compiling {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    exe
}

fn validation_layer_present() -> bool {
    match sysroot() {
        Some(_) => !sysroot_libs("libze_validation_layer.so").is_empty(),
        None => ldconfig_has("libze_validation_layer.so"),
    }
}

/// Runs a program with the suite's environment; fails the test on a non-zero exit, and on the
/// host backend on any not-applicable line (there every check applies).
fn run(exe: &Path, validation: bool, env: &[(&str, &str)]) {
    let backend = backend();
    let mut c = Command::new(exe);
    c.env("ZE_ENABLE_ALT_DRIVERS", driver_lib())
        .env_remove("HETMEM_HOST_MAX_ALLOC")
        .env_remove("HETMEM_HOST_SUBDEVICES");
    // HETMEM_BACKEND, and the host backend's two devices of 256 MiB only there.
    for v in hetmem_testkit::HOST_DEVICE_VARS {
        c.env_remove(v);
    }
    c.envs(hetmem_testkit::child_backend_env());
    // The folder of the driver chosen above first: cargo's LD_LIBRARY_PATH (target/release
    // before target/release/deps) outranks a program's rpath, and would load a stale copy
    // of libze_hetmem.so into the directly linked programs. Then the sysroot's loader.
    let mut path = driver_lib().parent().unwrap().as_os_str().to_owned();
    if let Some(r) = sysroot() {
        path.push(":");
        path.push(r.join("lib"));
    }
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    c.env("LD_LIBRARY_PATH", path);
    c.env_remove("ZE_ENABLE_VALIDATION_LAYER")
        .env_remove("ZE_ENABLE_PARAMETER_VALIDATION")
        .env_remove("HETMEM_ZE_VALIDATION")
        .env_remove("ZE_ENABLE_LOADER_INTERCEPT")
        // fd 0 is /dev/null: direct.c asks the driver about fd 0 (a descriptor of no memory).
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    if validation {
        c.env("ZE_ENABLE_VALIDATION_LAYER", "1")
            .env("ZE_ENABLE_PARAMETER_VALIDATION", "1")
            .env("HETMEM_ZE_VALIDATION", "1");
    }
    let mut child = c.spawn().expect("spawn C test");
    // Read while it runs: a program writing more than a pipe holds must not block.
    let reader = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            r.read_to_end(&mut b).ok();
            String::from_utf8_lossy(&b).into_owned()
        })
    };
    let out_t = reader(Box::new(child.stdout.take().unwrap()));
    let err_t = reader(Box::new(child.stderr.take().unwrap()));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > Duration::from_secs(180) {
            child.kill().ok();
            child.wait().ok();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // A forked child of the program (ipc.c) may hold the pipes a little longer.
    let out = out_t.join().unwrap_or_default();
    let err = err_t.join().unwrap_or_default();
    println!(
        "{}{}:\n{out}{err}",
        exe.display(),
        if validation {
            " (validation layer)"
        } else {
            ""
        }
    );
    let na = hetmem_testkit::reemit_not_applicable(&out);
    let Some(status) = status else {
        panic!("{} timed out after 180 s:\n{out}\n{err}", exe.display());
    };
    assert!(
        backend != "host" || na.is_empty(),
        "{}: on the host backend with two devices of 256 MiB every check applies, yet:\n{}",
        exe.display(),
        na.join("\n")
    );
    assert!(
        status.success(),
        "{} {}failed ({status}):\n{out}\n{err}",
        exe.display(),
        if validation {
            "under the validation layer "
        } else {
            ""
        }
    );
}

/// Builds a loader-linked program and runs it plainly and under the validation layer.
fn loader_suite(name: &str) {
    loader_suite_env(name, &[]);
}

/// Whether the suite cannot run here; if so, says for program `name`, in the not-applicable
/// form `scripts/gpu-suite` counts.
fn skipped(name: &str) -> bool {
    let Some(why) = skip_reason() else {
        return false;
    };
    loud(&format!(
        "NOT APPLICABLE ({}) ze/{name}.c: {why}",
        backend()
    ));
    true
}

fn loader_suite_env(name: &str, env: &[(&str, &str)]) {
    if skipped(name) {
        return;
    }
    let exe = build(name, Link::Loader);
    run(&exe, false, env);
    if validation_layer_present() {
        run(&exe, true, env);
    } else {
        loud(&format!(
            "NOT APPLICABLE ({}) ze/{name}.c the run under the loader's validation layer [part]: \
             libze_validation_layer.so is not in {}",
            backend(),
            sysroot().map_or_else(
                || "the dynamic linker's cache".to_string(),
                |r| format!("{}/lib", r.display())
            )
        ));
    }
}

fn direct_suite(name: &str) {
    if skipped(name) {
        return;
    }
    let exe = build(name, Link::Direct);
    run(&exe, false, &[]);
}

#[test]
fn layout_and_ddi_tables_match_the_installed_headers() {
    direct_suite("layout");
}

/// The same layout and DDI-table check against a second, newer set of headers, when
/// `HETMEM_ZE_EXTRA_HEADERS` names a directory holding `level_zero/` (e.g. Debian trixie's
/// `libze-dev` 1.20.6, API 1.12, unpacked with `apt-get download libze-dev` + `dpkg-deb -x`).
#[test]
fn layout_and_ddi_tables_match_extra_headers() {
    let Some(dir) = std::env::var_os("HETMEM_ZE_EXTRA_HEADERS") else {
        loud(&format!(
            "NOT APPLICABLE ({}) ze/layout.c against a second set of headers: \
             HETMEM_ZE_EXTRA_HEADERS is not set (a folder holding a newer level_zero/)",
            backend()
        ));
        return;
    };
    if skipped("layout") {
        return;
    }
    let exe = build_with("layout", Link::Direct, Some(Path::new(&dir)));
    run(&exe, false, &[]);
}

#[test]
fn driver_device_context() {
    loader_suite("driver");
}

#[test]
fn memory_allocations_and_queries() {
    loader_suite("memory");
}

#[test]
fn virtual_and_physical_memory() {
    loader_suite("vm");
}

/// Cases 3 and 4 of `shared/cases/level-zero.md`: the page size for size 0, and unmap where
/// nothing is mapped (the reference driver's answers).
#[test]
fn cases_3_4_page_size_of_zero_and_unmap_of_unmapped() {
    loader_suite("cases_vm");
}

/// Case 2 of `shared/cases/level-zero.md`: the read-only capability chained on the device
/// properties (ENFORCED), and enforced.
#[test]
fn case_2_readonly_capability_enforced() {
    loader_suite("cases_props");
}

/// The runtime table (`zer*`): through the loader where it routes them, else fetched from the
/// driver as a loader does (Debian's loader 1.8.12 has no `zer` symbol).
#[test]
fn runtime_table_zer_default_context_and_identifiers() {
    loader_suite("zer");
}

/// Case 5 of `shared/cases/level-zero.md`: an IPC handle rebuilt from a file descriptor received
/// alone (`SCM_RIGHTS`) in another process opens the exporter's bytes; close and put succeed.
#[test]
fn case_5_ipc_handle_from_a_file_descriptor_in_another_process() {
    loader_suite("cases_ipc5");
}

/// Case 6 of `shared/cases/level-zero.md`: get an allocation's (and mapped physical memory's)
/// IPC handle N times, put it N times, through any context of the driver; 8 threads at once.
#[test]
fn case_6_ipc_get_many_put_many() {
    loader_suite("cases_ipc6");
}

/// Case 7 of `shared/cases/level-zero.md`: a physical memory handle as the pointer of
/// `zeMemGetIpcHandle(WithProperties)` (memory mapped nowhere), opened in a child.
#[test]
fn case_7_ipc_physical_memory_handle_as_the_pointer() {
    loader_suite("cases_ipc7");
}

/// Case 8 of `shared/cases/level-zero.md`: the IPC handle of a mapping at an offset shares the
/// mapped pages of the object, not its first ones.
#[test]
fn case_8_ipc_of_a_mapping_at_an_offset() {
    loader_suite("cases_ipc8");
}

/// Case 9 of `shared/cases/level-zero.md`: host USM (plain, cached, uncached; 4 KiB to 8 MiB)
/// exported with `zeMemGetIpcHandle`, opened in a child that reads the bytes through the
/// pointer and a queue copy and writes one back.
#[test]
fn case_9_ipc_host_usm() {
    loader_suite("cases_ipc9");
}

/// Case 11 of `shared/cases/level-zero.md`: FABRIC_ACCESSIBLE handles of device and host USM,
/// of physical memory (its handle as the pointer) and of a mapped range, opened in a child; a
/// type the memory was not created with is refused, bits over 0x3 are invalid.
#[test]
fn case_11_ipc_fabric_accessible_handles() {
    loader_suite("cases_ipc11");
}

/// Case 12: sub-devices on the host backend (`HETMEM_HOST_SUBDEVICES=2`): enumeration, shares
/// of the capacity, the root, memory, physical memory and queues on a sub-device, IPC opened
/// in a child on its sub-device. Not applicable where the driver has none (cuda).
#[test]
fn case_12_sub_devices() {
    loader_suite_env("cases_subdevices", &[("HETMEM_HOST_SUBDEVICES", "2")]);
}

/// Case 1 of `shared/cases/level-zero.md`: malloc and stack memory as operands of copies and
/// fills, the capability reported, unmapped ranges refused.
#[test]
fn case_1_system_memory_in_queue_operations() {
    loader_suite("cases_sysmem");
}

/// Case 10 of `shared/cases/level-zero.md`: host physical memory (a null device) at every page
/// size the query answers, mapped, filled and copied through on a queue.
#[test]
fn case_10_host_physical_memory_mapped_filled_and_copied() {
    loader_suite("cases_hostphys");
}

#[test]
fn queues_lists_events_fences_and_free_policies() {
    loader_suite("queue");
}

#[test]
fn ipc_across_processes() {
    loader_suite("ipc");
}

#[test]
fn direct_link_reaches_the_newer_calls() {
    direct_suite("direct");
}

#[test]
fn concurrent_calls_from_many_threads() {
    loader_suite("threads");
}

#[test]
fn loader_intercept_mode_translates_handles() {
    loader_suite_env("intercept", &[("ZE_ENABLE_LOADER_INTERCEPT", "1")]);
}

#[test]
fn leak_check_of_thousands_of_calls() {
    loader_suite("leak");
}
