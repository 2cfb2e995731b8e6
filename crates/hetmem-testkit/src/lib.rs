//! Test support shared by the workspace's tests (a `[dev-dependencies]` entry of the crates that
//! use it; never published):
//!
//! - the backend under test (`HETMEM_BACKEND`) and the loud lines of a test, or part of one,
//!   that cannot apply there or cannot run on this machine: `NOT APPLICABLE (<backend>)
//!   <test>[ [part]]: <reason>` and `SKIPPED (<backend>) <test>: <reason>`, written past the test
//!   harness's capture so that every run shows them and `scripts/gpu-suite` counts them;
//! - the environment conventions of the harnesses that run other programs (the C programs of
//!   `tests/c`, the `hetmem` command): `HETMEM_TEST_PREBUILT`, `HETMEM_REPO_ROOT`,
//!   `HETMEM_TEST_TMPDIR`, the `HETMEM_*` variables a child runs with, and the re-emission of
//!   the `NOT APPLICABLE` lines a child prints.
//!
//! What only one crate's tests need stays in that crate's `tests/common`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use hetmem::BackendKind;

// ---------------------------------------------------------------------------------------------
// The backend under test

/// The backend the Rust tests run on: `HETMEM_BACKEND` parsed as the runtime parses it
/// (`host`, `cuda`), default host when the variable is unset. Read once per process; panics
/// (naming `HETMEM_BACKEND`) on a value that names no backend.
pub fn backend() -> BackendKind {
    static B: OnceLock<BackendKind> = OnceLock::new();
    *B.get_or_init(|| match std::env::var("HETMEM_BACKEND") {
        Ok(v) => BackendKind::parse(&v).expect("HETMEM_BACKEND"),
        Err(_) => BackendKind::Host,
    })
}

/// Whether [`backend`] is the host backend.
pub fn on_host() -> bool {
    backend() == BackendKind::Host
}

/// Whether [`backend`] is the cuda backend.
pub fn on_cuda() -> bool {
    backend() == BackendKind::Cuda
}

// ---------------------------------------------------------------------------------------------
// Loud lines

/// Writes `line` and a newline to the process's stderr directly, past the test harness's
/// capture (which catches only `print!` and `eprint!`), so that it shows in every run's output,
/// passed or not.
pub fn loud(line: &str) {
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "{line}");
    let _ = e.flush();
}

/// [`loud`], once per process for each distinct `line` (a proptest runs its body many times;
/// several tests may ask the same).
pub fn loud_once(line: String) {
    static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if !seen.contains(&line) {
        loud(&line);
        seen.push(line);
    }
}

/// The name of the running test without its module path (libtest names each test's thread
/// after the test); `?` on a thread with no name.
pub fn test_name() -> String {
    let t = std::thread::current();
    let n = t.name().unwrap_or("?");
    n.rsplit("::").next().unwrap_or(n).to_string()
}

/// True on backend `kind` after one loud `NOT APPLICABLE (<kind>) <test><part>: <reason>` line
/// ([`loud_once`]); false, printing nothing, on any other backend.
fn not_applicable_line(kind: BackendKind, part: &str, reason: &str) -> bool {
    if backend() != kind {
        return false;
    }
    loud_once(format!(
        "NOT APPLICABLE ({}) {}{part}: {reason}",
        kind.name(),
        test_name()
    ));
    true
}

/// True on backend `kind` after one loud `NOT APPLICABLE (<kind>) <test>: <reason>` line (once
/// per process; `<test>` is [`test_name`]): the whole test cannot apply there, for the reason
/// given, which must be a real difference of the backend. False, printing nothing, on any other
/// backend.
pub fn not_applicable_on(kind: BackendKind, reason: &str) -> bool {
    not_applicable_line(kind, "", reason)
}

/// True on backend `kind` after one loud `NOT APPLICABLE (<kind>) <test> [part]: <reason>` line
/// (once per process): the test runs, but the checks this guards (named in the reason) cannot
/// apply there. False, printing nothing, on any other backend.
pub fn part_not_applicable_on(kind: BackendKind, reason: &str) -> bool {
    not_applicable_line(kind, " [part]", reason)
}

/// One loud `SKIPPED (<kind>) <test>: <reason>` line (once per process; `<test>` is
/// [`test_name`]): the test needs backend `kind` and it cannot start on this machine (a missing
/// driver, GPU, input or library; not a difference of the backend).
pub fn skipped_for(kind: BackendKind, reason: &str) {
    loud_once(format!(
        "SKIPPED ({}) {}: {reason}",
        kind.name(),
        test_name()
    ));
}

/// [`skipped_for`] the backend under test ([`backend`]).
pub fn skipped(reason: &str) {
    skipped_for(backend(), reason);
}

// ---------------------------------------------------------------------------------------------
// The environment of harnesses that run other programs
//
// `scripts/gpu-pack` carries the test executables to a machine with no Rust toolchain: it puts
// them in `<pack>/tests/`, and the cdylibs (`libze_hetmem.so`, `libascendcl.so`) and the
// `hetmem` command in `<pack>/`, the parent folder of the tests as `target/<profile>` is of
// `target/<profile>/deps`. `scripts/gpu-suite` runs them with `HETMEM_TEST_PREBUILT=1`.

/// Variable `name` of the environment when it is set to something other than the empty string.
pub fn env_set(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// `HETMEM_TEST_PREBUILT=1`: the libraries and executables a test runs were built elsewhere
/// (`scripts/gpu-pack`); look for them with [`find_prebuilt`] and never run cargo.
pub fn prebuilt() -> bool {
    env_set("HETMEM_TEST_PREBUILT").is_some_and(|v| v == "1")
}

/// The folders where a prebuilt file is looked for, in order: the running test executable's
/// own folder (`target/<profile>/deps`, `<pack>/tests`), then its parent folder
/// (`target/<profile>`, `<pack>`) where there is one.
pub fn prebuilt_dirs() -> Vec<PathBuf> {
    let exe = std::env::current_exe().expect("the test executable's path");
    let here = exe.parent().expect("the test executable's folder");
    std::iter::successors(Some(here), |d| d.parent())
        .take(2)
        .map(Path::to_path_buf)
        .collect()
}

/// The file `name` (`libascendcl.so`, `hetmem`) in the first of [`prebuilt_dirs`] that holds
/// one, if any.
pub fn find_prebuilt(name: &str) -> Option<PathBuf> {
    prebuilt_dirs()
        .into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The repository root (the C sources and headers the harnesses compile): `HETMEM_REPO_ROOT`
/// when set (non-empty); else the root these tests were compiled in, if it still holds the
/// folder `marker` (e.g. `tests/c/ze`); else the current directory (a packed test executable
/// runs from the repository root).
pub fn repo_root(marker: &str) -> PathBuf {
    if let Some(r) = std::env::var_os("HETMEM_REPO_ROOT").filter(|v| !v.is_empty()) {
        return PathBuf::from(r);
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if built.join(marker).is_dir() {
        built
    } else {
        std::env::current_dir().expect("the current directory")
    }
}

/// A folder for what a harness writes (compiled C programs), made if missing:
/// `$HETMEM_TEST_TMPDIR/<sub>` when `HETMEM_TEST_TMPDIR` is set (non-empty; panics if it cannot
/// be made); else `default()` if it can be made; else `<temp dir>/hetmem-c-tests/<sub>`
/// (panics if it cannot be made). An empty `sub` is the folder itself.
pub fn test_tmpdir(sub: &str, default: impl FnOnce() -> PathBuf) -> PathBuf {
    let under = |d: PathBuf| if sub.is_empty() { d } else { d.join(sub) };
    if let Some(t) = std::env::var_os("HETMEM_TEST_TMPDIR").filter(|v| !v.is_empty()) {
        let d = under(PathBuf::from(t));
        std::fs::create_dir_all(&d)
            .unwrap_or_else(|e| panic!("HETMEM_TEST_TMPDIR: creating {}: {e}", d.display()));
        return d;
    }
    let d = default();
    if std::fs::create_dir_all(&d).is_ok() {
        return d;
    }
    let d = under(std::env::temp_dir().join("hetmem-c-tests"));
    std::fs::create_dir_all(&d)
        .unwrap_or_else(|e| panic!("creating {} (no folder to write to): {e}", d.display()));
    d
}

/// The backend name a child program is told to run on: `HETMEM_BACKEND` as set (non-empty),
/// passed on unparsed (the child's runtime parses it); else `host`.
pub fn child_backend() -> String {
    env_set("HETMEM_BACKEND").unwrap_or_else(|| "host".into())
}

/// The host-backend variables [`child_backend_env`] sets on host, which shape its modelled
/// devices: a harness that keeps the rest of its environment removes them elsewhere.
pub const HOST_DEVICE_VARS: [&str; 2] = ["HETMEM_HOST_DEVICES", "HETMEM_HOST_DEVICE_MEMORY"];

/// The `HETMEM_*` variables a C program of the suites runs with: `HETMEM_BACKEND` set to
/// [`child_backend`], and on `host` two modelled devices of 256 MiB
/// (`HETMEM_HOST_DEVICES=2`, `HETMEM_HOST_DEVICE_MEMORY=256M`).
pub fn child_backend_env() -> Vec<(&'static str, String)> {
    let b = child_backend();
    let mut env = vec![("HETMEM_BACKEND", b.clone())];
    if b == "host" {
        env.push((HOST_DEVICE_VARS[0], "2".into()));
        env.push((HOST_DEVICE_VARS[1], "256M".into()));
    }
    env
}

/// Removes from `c`'s environment every `HETMEM_*` variable this process has, so that the child
/// runs with only those the caller sets next.
pub fn clear_hetmem_env(c: &mut Command) {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("HETMEM_") {
            c.env_remove(k);
        }
    }
}

/// The lines of a child's output that start `NOT APPLICABLE (`, in order.
pub fn not_applicable_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.starts_with("NOT APPLICABLE ("))
        .collect()
}

/// [`not_applicable_lines`] of a child's output, each written again with [`loud`] (every one,
/// as printed, in order) so that it shows past this test's capture; returns them.
pub fn reemit_not_applicable(text: &str) -> Vec<&str> {
    let na = not_applicable_lines(text);
    for l in &na {
        loud(l);
    }
    na
}
