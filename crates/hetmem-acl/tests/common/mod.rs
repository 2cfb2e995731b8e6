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
//! Environment of the runner (the conventions of `hetmem_testkit`, shared with the Level Zero C
//! suite):
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

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

// `backend()` is the backend name the programs run on (`HETMEM_BACKEND`, default `host`),
// passed to them unparsed; `loud` writes a line past the harness's capture.
#[allow(unused_imports)]
pub use hetmem_testkit::{child_backend as backend, loud, prebuilt};

/// The repository root: `HETMEM_REPO_ROOT`, else the root this file was compiled in if it
/// holds `tests/c/acl`, else the current directory ([`hetmem_testkit::repo_root`]).
pub fn root() -> PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let dir = hetmem_testkit::repo_root("tests/c/acl");
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

/// The prebuilt `libascendcl.so`'s folder: the test executable's own, or its parent
/// ([`hetmem_testkit::find_prebuilt`]).
fn prebuilt_lib_dir() -> PathBuf {
    let lib = hetmem_testkit::find_prebuilt("libascendcl.so").unwrap_or_else(|| {
        panic!(
            "HETMEM_TEST_PREBUILT=1 but no libascendcl.so in {:?} (scripts/gpu-pack puts it in \
             the parent of the tests folder)",
            hetmem_testkit::prebuilt_dirs()
        )
    });
    lib.parent().expect("the library's folder").to_path_buf()
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
    DIR.get_or_init(|| hetmem_testkit::test_tmpdir("", || lib_dir().join("acl-c-tests")))
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

/// Prints a `SKIPPED (<backend>) <test>: <why>` line past the capture: a test that cannot run
/// at all on this machine.
pub fn skipped(test: &str, why: &str) {
    loud(&format!("SKIPPED ({}) {test}: {why}", backend()));
}

/// Builds and runs `name` with `args` on the current backend (the `HETMEM_*` variables of
/// [`hetmem_testkit::child_backend_env`]: `HETMEM_BACKEND`, and for the host backend two devices
/// of 256 MiB each); panics with its output on failure.
pub fn run(name: &str, args: &[&str]) -> Outcome {
    let env = hetmem_testkit::child_backend_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    run_env(name, args, &env)
}

/// As [`run`], with exactly the `HETMEM_*` variables of `env`.
pub fn run_env(name: &str, args: &[&str], env: &[(&str, &str)]) -> Outcome {
    let exe = build(name, &[]);
    let mut cmd = Command::new(&exe);
    cmd.args(args);
    hetmem_testkit::clear_hetmem_env(&mut cmd);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("running the C program");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let na = hetmem_testkit::reemit_not_applicable(&stdout);
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
