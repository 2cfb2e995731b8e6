//! Shared by the `hetmem` command's tests (`mod common;` in each file): the `hetmem` executable
//! to run and how, the backend the suite runs on, what `hetmem info` says about it, and the
//! loud lines of tests (or parts) that cannot apply there or cannot run on this machine.
//!
//! The backend comes from `HETMEM_BACKEND` (`host`, the default, or `cuda`), as in the hetmem
//! crate's tests; it is passed to every `hetmem` child, so each scene and command runs on it.
//! A test that cannot apply to that backend, or a part of one, prints one loud
//! `NOT APPLICABLE (<backend>) <test>[ [part]]: <reason>` line past the test harness's capture;
//! a test that cannot run on this machine at all (the backend cannot start: cuda without an
//! NVIDIA driver or GPU) prints one `SKIPPED (<backend>) <test>: <reason>` line. Nothing is
//! skipped silently. What applies is decided from what the runtime answers (`hetmem info`:
//! its backend, devices, page sizes, whether `HETMEM_HOST_*` shape its devices), not from the
//! backend's name alone.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

// ---------------------------------------------------------------------------------------------
// The executable

/// The `hetmem` executable the tests run: `$HETMEM_CLI_BIN` if set; else, with
/// `HETMEM_TEST_PREBUILT=1` (test executables carried to another machine by `scripts/gpu-pack`,
/// which puts `hetmem` at `<pack>/hetmem` and the tests in `<pack>/tests/`), a `hetmem` next to
/// the running test executable or in its parent folder ([`hetmem_testkit::find_prebuilt`]);
/// else the one cargo built with the tests.
///
/// Panics when `HETMEM_TEST_PREBUILT=1` and neither place has one (naming both).
pub fn hetmem_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("HETMEM_CLI_BIN") {
            return PathBuf::from(p);
        }
        if hetmem_testkit::prebuilt() {
            return hetmem_testkit::find_prebuilt("hetmem").unwrap_or_else(|| {
                panic!(
                    "HETMEM_TEST_PREBUILT=1 but no hetmem executable in {} or its parent folder \
                     (scripts/gpu-pack puts it next to tests/); set HETMEM_CLI_BIN to its path",
                    hetmem_testkit::prebuilt_dirs()[0].display()
                )
            });
        }
        PathBuf::from(env!("CARGO_BIN_EXE_hetmem"))
    })
    .clone()
}

/// Runs `hetmem` ([`hetmem_bin`]) with `args`: every inherited `HETMEM_` variable removed
/// except `HETMEM_BACKEND` (the suite's backend, passed on when set), then `env` set (a test
/// that sets its own `HETMEM_BACKEND` keeps it). Returns how it ended with its stdout and
/// stderr as text.
pub fn hetmem(args: &[&str], env: &[(&str, &str)]) -> (Output, String, String) {
    let mut c = Command::new(hetmem_bin());
    c.args(args);
    hetmem_testkit::clear_hetmem_env(&mut c);
    if let Some(b) = std::env::var_os("HETMEM_BACKEND") {
        c.env("HETMEM_BACKEND", b);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().expect("run hetmem");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    (o, out, err)
}

// ---------------------------------------------------------------------------------------------
// The backend under test and the loud lines

// `hetmem_testkit`'s, shared with the hetmem crate's tests (the same variable, the same lines);
// re-exported here under the names the test files use. (Each test binary uses a part of them.)
#[allow(unused_imports)]
pub use hetmem_testkit::{
    backend, loud, not_applicable_on, on_cuda, on_host, part_not_applicable_on, skipped,
    skipped_for, test_name,
};

/// [`not_applicable_on`] the suite's backend: for a decision already made from what the
/// runtime answers. Always true.
pub fn not_applicable(reason: &str) -> bool {
    not_applicable_on(backend(), reason)
}

/// [`part_not_applicable_on`] the suite's backend: for a decision already made from what the
/// runtime answers. Always true.
pub fn part_not_applicable(reason: &str) -> bool {
    part_not_applicable_on(backend(), reason)
}

/// The first line of a test that needs the suite's backend running: true (the test returns
/// and passes) after one loud `SKIPPED (<backend>) <test>: <reason>` line where `hetmem info`
/// says that backend cannot start on this machine. Any other failure of `hetmem info` fails
/// the test.
pub fn skip() -> bool {
    match info() {
        Ok(_) => false,
        Err(why) => {
            skipped(&why);
            true
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What the runtime says: `hetmem info` on the suite's backend

/// One device line of `hetmem info`, its figures as printed.
#[derive(Debug, Clone)]
pub struct InfoDevice {
    /// e.g. `256 MiB`.
    pub capacity: String,
    /// e.g. `64 MiB`.
    pub max_alloc: String,
    /// The page-size query's answer for 1 byte, e.g. `64 KiB`.
    pub small_page: String,
    /// The page-size query's answer for 2 MiB, e.g. `2 MiB`.
    pub large_page: String,
    /// Bytes.
    pub granularity: u64,
}

/// What `hetmem info` says on the suite's backend with no `HETMEM_HOST_*` setting.
#[derive(Debug, Clone)]
pub struct Info {
    /// The backend line (`host`, `cuda`).
    pub backend: String,
    pub devices: Vec<InfoDevice>,
    /// Whether the runtime models its devices from `HETMEM_HOST_*` (it prints them under
    /// `configuration:`): the host backend's devices; on cuda they are the machine's GPUs.
    pub modelled: bool,
    /// The whole output.
    pub text: String,
}

impl Info {
    /// The first device (every runtime has one).
    pub fn dev0(&self) -> &InfoDevice {
        &self.devices[0]
    }

    /// `(count, device 0's capacity)` in words, for reasons: e.g. `1 device(s), device 0 of
    /// 139.8 GiB (hetmem info, cuda backend)`.
    pub fn describe(&self) -> String {
        format!(
            "{} device(s), device 0 of {} (hetmem info, {} backend)",
            self.devices.len(),
            self.dev0().capacity,
            self.backend
        )
    }
}

/// The field after `key` up to the next `,` (or the end) in `line`.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let rest = &line[line
        .find(key)
        .unwrap_or_else(|| panic!("no {key:?} in {line:?}"))
        + key.len()..];
    rest.split(',').next().unwrap_or("").trim()
}

/// Parses one device line of `hetmem info` (`[0] <name>: capacity 256 MiB, largest single
/// allocation 64 MiB, page sizes 64 KiB (< 2 MiB) / 2 MiB (>= 2 MiB), granularity 65536 B`).
pub fn parse_device_line(l: &str) -> InfoDevice {
    let pages = field(l, "page sizes ");
    let small = pages.split(" (< 2 MiB)").next().unwrap_or("").trim();
    let large = pages
        .split(" / ")
        .nth(1)
        .and_then(|s| s.split(" (>= 2 MiB)").next())
        .unwrap_or("")
        .trim();
    InfoDevice {
        capacity: field(l, "capacity ").to_string(),
        max_alloc: field(l, "largest single allocation ").to_string(),
        small_page: small.to_string(),
        large_page: large.to_string(),
        granularity: field(l, "granularity ")
            .trim_end_matches(" B")
            .parse()
            .unwrap_or_else(|_| panic!("no granularity in {l:?}")),
    }
}

/// Parses the output of `hetmem info`.
pub fn parse_info(text: &str) -> Info {
    let backend = text
        .lines()
        .find_map(|l| l.strip_prefix("backend:"))
        .unwrap_or_else(|| panic!("no backend line in\n{text}"))
        .trim()
        .to_string();
    let devices = text
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('[') && l.contains(": capacity "))
        .map(parse_device_line)
        .collect::<Vec<_>>();
    assert!(!devices.is_empty(), "no device line in\n{text}");
    let modelled = text
        .lines()
        .any(|l| l.trim_start().starts_with("HETMEM_HOST_DEVICES="));
    Info {
        backend,
        devices,
        modelled,
        text: text.to_string(),
    }
}

/// `hetmem info` on the suite's backend (asked once per process). `Err` with the reason when
/// that backend cannot start on this machine; panics on any other failure.
pub fn info() -> Result<&'static Info, String> {
    static INFO: OnceLock<Result<Info, String>> = OnceLock::new();
    INFO.get_or_init(|| {
        let (o, out, err) = hetmem(&["info"], &[]);
        if o.status.success() {
            return Ok(parse_info(&out));
        }
        assert!(
            err.contains("cannot start on this machine"),
            "hetmem info failed on the {} backend for another reason than the backend not \
             starting:\n{out}\n{err}",
            backend().name()
        );
        Err(err.trim().to_string())
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// [`info`] for a test that has already passed [`skip`].
pub fn info_ok() -> &'static Info {
    info().expect("hetmem info (the test checks skip() first)")
}

/// Whether `printed` is a form the `hetmem` command may print byte count `b` in, by its rule
/// written out here rather than by a copy of its code: the largest binary unit (`B`, `KiB`,
/// `MiB`, `GiB`, `TiB`) of which `b` is at least one; the whole count of units where `b` is a
/// multiple of it (`64 KiB`, `512 B`), else the count to one decimal, rounded to the nearest
/// tenth (`2.9 GiB`; either neighbour on an exact half).
pub fn shows_bytes(printed: &str, b: u64) -> bool {
    let Some((n, unit)) = printed.trim().split_once(' ') else {
        return false;
    };
    let Some(shift) = unit_shift(unit) else {
        return false;
    };
    let largest = [40, 30, 20, 10]
        .into_iter()
        .find(|&s| b >= 1 << s)
        .unwrap_or(0);
    if shift != largest {
        return false;
    }
    let u = 1u64 << shift;
    match n.split_once('.') {
        None => n.parse::<u64>().is_ok_and(|n| n.checked_mul(u) == Some(b)),
        Some((whole, tenth)) => {
            if b.is_multiple_of(u) || tenth.len() != 1 {
                return false;
            }
            // Tenths of a unit: |10 b / u - d| <= 1/2, in integers.
            let Ok(d) = format!("{whole}{tenth}").parse::<u128>() else {
                return false;
            };
            2 * (10 * b as u128).abs_diff(d * u as u128) <= u as u128
        }
    }
}

/// The power of two of a unit the `hetmem` command prints (`B` 0, `KiB` 10, ... `TiB` 40).
fn unit_shift(unit: &str) -> Option<u32> {
    Some(match unit {
        "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        "TiB" => 40,
        _ => return None,
    })
}

/// Parses a byte count as the `hetmem` command prints it, in the whole forms of
/// [`shows_bytes`] (`64 KiB`, `2 MiB`, `512 B`). `None` for a decimal or an unknown unit.
pub fn parse_human(s: &str) -> Option<u64> {
    let (n, unit) = s.trim().split_once(' ')?;
    let n: u64 = n.parse().ok()?;
    n.checked_mul(1 << unit_shift(unit)?)
}
