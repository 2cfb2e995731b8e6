//! Builds and runs the C programs of `tests/c/acl/` (repository root) against this crate's
//! headers and `libascendcl.so`, as an ACL user would: `cc prog.c -I include -L dir
//! -lascendcl`.
//!
//! The library is (re)built with `cargo build -p hetmem-acl` in the profile of the running
//! test (a no-op when it is up to date), so the tests work from a clean clone. A program exits
//! 0 on success, 77 after printing `SKIP: <reason>` when the machine cannot run it (managed
//! memory where userfaultfd is refused), anything else on failure.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The profile directory of the running test (`target/release` or `target/debug`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test>
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// The directory holding an up-to-date `libascendcl.so`.
pub fn lib_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
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

/// Compiles `tests/c/acl/<name>.c` (plus `extra` flags) into the profile directory; returns
/// the executable.
pub fn build(name: &str, extra: &[&str]) -> PathBuf {
    let lib = lib_dir();
    let src = root().join("tests/c/acl").join(format!("{name}.c"));
    let out_dir = lib.join("acl-c-tests");
    std::fs::create_dir_all(&out_dir).unwrap();
    let exe = out_dir.join(name);
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
    /// Exit 77; the reason it printed.
    Skipped(String),
}

/// Builds and runs `name` with `args`, two host devices of 256 MiB each; panics with its
/// output on failure.
pub fn run(name: &str, args: &[&str]) -> Outcome {
    run_env(
        name,
        args,
        &[
            ("HETMEM_BACKEND", "host"),
            ("HETMEM_HOST_DEVICES", "2"),
            ("HETMEM_HOST_DEVICE_MEMORY", "256M"),
        ],
    )
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
    match out.status.code() {
        Some(0) => Outcome::Passed(stdout),
        Some(77) => {
            let why = stdout
                .lines()
                .find(|l| l.starts_with("SKIP:"))
                .unwrap_or("SKIP: (no reason printed)")
                .to_string();
            eprintln!("{name}: {why}");
            Outcome::Skipped(why)
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

/// Runs `name`; a skip (managed memory unavailable) is reported on stderr, not hidden.
pub fn run_managed(name: &str) {
    match run(name, &[]) {
        Outcome::Passed(s) => assert!(s.contains("ok"), "{name} printed no ok line:\n{s}"),
        Outcome::Skipped(why) => {
            // Past the test harness's capture, so the skip shows in a passing run too.
            let _ = std::io::Write::write_fmt(
                &mut std::io::stderr(),
                format_args!("SKIPPED {name}: {why}"),
            );
            let _ = std::io::Write::write_all(&mut std::io::stderr(), b"\n");
            assert!(
                why.contains("userfaultfd") || why.contains("managed"),
                "{why}"
            );
        }
    }
}
