//! Builds and runs the C programs of `tests/c/acl/` (repository root) against this crate's
//! headers and `libascendcl.so`, as an ACL user would: `cc prog.c -I include -L dir
//! -lascendcl`.
//!
//! The library is (re)built with `cargo build -p hetmem-acl` in the profile of the running
//! test (a no-op when it is up to date), so the tests work from a clean clone. On a machine
//! without cargo (a GPU machine running the executables `scripts/gpu-pack` packed),
//! `HETMEM_TEST_PREBUILT=1` uses the `libascendcl.so` found next to the test executable or in
//! its parent folder instead, and never runs cargo.
//!
//! Environment of the runner:
//! - `HETMEM_REPO_ROOT`: the repository root (C sources, headers); default the root this file
//!   was compiled in if it still exists, else the current directory.
//! - `HETMEM_TEST_TMPDIR`: where the programs are compiled to; default `acl-c-tests` beside the
//!   library if it can be made, else `hetmem-c-tests` in the system's temporary folder.
//! - `HETMEM_BACKEND`: the backend the programs run on (default `host`), passed to them; the
//!   host backend's variables (two devices of 256 MiB) are set only for `host`.
//!
//! A program exits 0 on success, 77 when it cannot run at all here (after printing a whole-program
//! `NOT APPLICABLE` line), anything else on failure. Every `NOT APPLICABLE (<backend>) ...` line a
//! program prints (a check or the whole program that does not apply, with the reason) is
//! re-emitted on the test's stderr past the harness's capture, where `scripts/gpu-suite` counts
//! it.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The backend the programs run on (`HETMEM_BACKEND`, default `host`).
pub fn backend() -> String {
    std::env::var("HETMEM_BACKEND")
        .ok()
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| "host".into())
}

/// Whether to use prebuilt libraries and never run cargo (`HETMEM_TEST_PREBUILT=1`).
pub fn prebuilt() -> bool {
    std::env::var("HETMEM_TEST_PREBUILT").is_ok_and(|v| v == "1")
}

/// The repository root: `HETMEM_REPO_ROOT`, else the root this file was compiled in if it
/// exists, else the current directory.
pub fn root() -> PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let dir = match std::env::var_os("HETMEM_REPO_ROOT").filter(|v| !v.is_empty()) {
            Some(r) => PathBuf::from(r),
            None => {
                let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
                if built.join("tests/c/acl").is_dir() {
                    built
                } else {
                    std::env::current_dir().expect("the current directory")
                }
            }
        };
        assert!(
            dir.join("tests/c/acl").is_dir(),
            "{dir:?} is not the repository root (no tests/c/acl): run from the repository root \
             or set HETMEM_REPO_ROOT"
        );
        dir.canonicalize().unwrap_or(dir)
    })
    .clone()
}

/// The profile directory of the running test (`target/release` or `target/debug`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test>
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// The prebuilt `libascendcl.so`'s folder: the test executable's own, or its parent.
fn prebuilt_lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let own = exe.parent().unwrap().to_path_buf();
    let candidates: Vec<PathBuf> = [Some(own.clone()), own.parent().map(Path::to_path_buf)]
        .into_iter()
        .flatten()
        .collect();
    candidates
        .iter()
        .find(|d| d.join("libascendcl.so").is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "HETMEM_TEST_PREBUILT=1 but no libascendcl.so in {candidates:?} (scripts/gpu-pack \
                 puts it in the parent of the tests folder)"
            )
        })
}

/// The directory holding an up-to-date `libascendcl.so`.
pub fn lib_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if prebuilt() {
            return prebuilt_lib_dir();
        }
        let dir = profile_dir();
        let release = dir.file_name().is_some_and(|n| n == "release");
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "-p", "hetmem-acl", "--lib"]);
        if release {
            cmd.arg("--release");
        }
        let st = cmd
            .current_dir(root())
            .status()
            .expect("running cargo build -p hetmem-acl");
        assert!(st.success(), "cargo build -p hetmem-acl failed");
        assert!(
            dir.join("libascendcl.so").exists(),
            "no libascendcl.so in {dir:?} after the build"
        );
        dir
    })
    .clone()
}

/// Where the programs are compiled to (see the module docs).
fn out_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(d) = std::env::var_os("HETMEM_TEST_TMPDIR").filter(|v| !v.is_empty()) {
            let d = PathBuf::from(d);
            std::fs::create_dir_all(&d)
                .unwrap_or_else(|e| panic!("HETMEM_TEST_TMPDIR {d:?} cannot be made: {e}"));
            return d;
        }
        let beside = lib_dir().join("acl-c-tests");
        if std::fs::create_dir_all(&beside).is_ok() {
            return beside;
        }
        let tmp = std::env::temp_dir().join("hetmem-c-tests");
        std::fs::create_dir_all(&tmp).unwrap_or_else(|e| panic!("{tmp:?} cannot be made: {e}"));
        tmp
    })
    .clone()
}

/// Compiles `tests/c/acl/<name>.c` (plus `extra` flags) into the output folder; returns the
/// executable.
pub fn build(name: &str, extra: &[&str]) -> PathBuf {
    let lib = lib_dir();
    let src = root().join("tests/c/acl").join(format!("{name}.c"));
    let exe = out_dir().join(name);
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(root().join("crates/hetmem-acl/include"))
        .arg("-I")
        .arg(root().join("tests/c/acl"))
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .args(extra)
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lascendcl", "-lpthread"])
        .output()
        .expect("running cc");
    assert!(
        out.status.success(),
        "compiling {src:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// What a program did.
pub enum Outcome {
    /// Exit 0; its stdout.
    Passed(String),
    /// Exit 77; its whole-program `NOT APPLICABLE` line.
    Skipped(String),
}

/// Writes `line` on the process's stderr, past the test harness's capture (so that it shows in
/// a passing run too, where `scripts/gpu-suite` reads it).
pub fn loud(line: &str) {
    let mut e = std::io::stderr();
    let _ = e.write_fmt(format_args!("{line}\n"));
    let _ = e.flush();
}

/// The `NOT APPLICABLE` lines of a program's stdout.
pub fn not_applicable(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| l.starts_with("NOT APPLICABLE ("))
        .collect()
}

/// Prints a `SKIPPED (<backend>) <test>: <why>` line past the capture: a test that cannot run
/// at all on this machine.
pub fn skipped(test: &str, why: &str) {
    loud(&format!("SKIPPED ({}) {test}: {why}", backend()));
}

/// The `HETMEM_*` variables a program runs with on the current backend: `HETMEM_BACKEND`, and
/// for the host backend two devices of 256 MiB each.
pub fn backend_env() -> Vec<(&'static str, String)> {
    let b = backend();
    let mut env = vec![("HETMEM_BACKEND", b.clone())];
    if b == "host" {
        env.push(("HETMEM_HOST_DEVICES", "2".into()));
        env.push(("HETMEM_HOST_DEVICE_MEMORY", "256M".into()));
    }
    env
}

/// Builds and runs `name` with `args` on the current backend ([`backend_env`]); panics with its
/// output on failure.
pub fn run(name: &str, args: &[&str]) -> Outcome {
    let env = backend_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    run_env(name, args, &env)
}

/// As [`run`], with exactly the `HETMEM_*` variables of `env`.
pub fn run_env(name: &str, args: &[&str], env: &[(&str, &str)]) -> Outcome {
    let exe = build(name, &[]);
    let mut cmd = Command::new(&exe);
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("HETMEM_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("running the C program");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let na = not_applicable(&stdout);
    for l in &na {
        loud(l);
    }
    match out.status.code() {
        Some(0) => Outcome::Passed(stdout),
        Some(77) => {
            let whole = na
                .iter()
                .find(|l| !l.contains(" [part]:"))
                .unwrap_or_else(|| {
                    panic!(
                        "{name} exited 77 (not applicable) without a whole-program NOT \
                         APPLICABLE line:\n--- stdout\n{stdout}--- stderr\n{stderr}"
                    )
                })
                .to_string();
            Outcome::Skipped(whole)
        }
        _ => panic!(
            "{name} {args:?} failed ({:?}):\n--- stdout\n{stdout}--- stderr\n{stderr}",
            out.status
        ),
    }
}

/// Runs `name` and requires it to pass (not skip); returns its stdout.
pub fn run_ok(name: &str) -> String {
    passed(name, run(name, &[]))
}

/// The stdout of a program that must have passed.
pub fn passed(name: &str, o: Outcome) -> String {
    match o {
        Outcome::Passed(s) => s,
        Outcome::Skipped(why) => panic!("{name} skipped where it must run: {why}"),
    }
}

/// Runs `name`, whose managed-memory checks need managed memory; where it is unavailable (the
/// host backend without userfaultfd) the program's whole-program line says so (re-emitted past
/// the capture by [`run_env`]).
pub fn run_managed(name: &str) {
    match run(name, &[]) {
        Outcome::Passed(s) => assert!(s.contains("ok"), "{name} printed no ok line:\n{s}"),
        Outcome::Skipped(why) => assert!(
            why.contains("managed memory is unavailable"),
            "{name} was not applicable for another reason than managed memory: {why}"
        ),
    }
}
