//! The `hetmem` command as a new user meets it (issue 23, "The CLI, tried as a new user would"),
//! each through the built binary:
//! - `--plot` / `--json` paths are checked before any work (a long replay is not thrown away at
//!   its end because the folder is missing);
//! - progress: the first line one second in, the time left from the share of requests served;
//! - a count option given 0, a negative number or text says it must be a positive count,
//!   naming the option and the value;
//! - a configuration value the runtime changes (`HETMEM_HOST_MAX_ALLOC` above a device,
//!   `HETMEM_HOST_DEVICES` splitting memory below a device's minimum) is reported by
//!   `hetmem info` and warned about;
//! - trace rows of 0 prompt (or 0 output) tokens are counted and reported, and served as they
//!   are, not as 1 token;
//! - generated folders (`scripts/gpu-pack`'s `.gpu/`, the README examples' `out/`) are ignored
//!   by git.
//!
//! Trace data: the Azure LLM inference trace 2023 (CC-BY 4.0), Patel et al., "Splitwise",
//! ISCA 2024, read from `shared/data/azure-llm-inference-2023/` where a test uses it; the
//! zero-token rows are a small file the test writes, since the real traces have none.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::hetmem;

/// A temporary folder of this test process (removed by the caller).
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hetmem-new-user-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `hetmem ARGS` as [`common::hetmem`] does, but kills it after `limit`: returns the exit
/// code (`None` when it was killed), stdout, stderr and the time it took.
fn hetmem_within(
    args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> (Option<i32>, String, String, Duration) {
    let mut c = Command::new(common::hetmem_bin());
    c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    hetmem_testkit::clear_hetmem_env(&mut c);
    if let Some(b) = std::env::var_os("HETMEM_BACKEND") {
        c.env("HETMEM_BACKEND", b);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let start = Instant::now();
    let mut child = c.spawn().expect("run hetmem");
    let code = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s.code();
        }
        if start.elapsed() > limit {
            child.kill().ok();
            child.wait().ok();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = start.elapsed();
    let read = |r: Option<&mut dyn std::io::Read>| {
        let mut s = String::new();
        if let Some(r) = r {
            r.read_to_string(&mut s).ok();
        }
        s
    };
    let out = read(child.stdout.as_mut().map(|r| r as _));
    let err = read(child.stderr.as_mut().map(|r| r as _));
    (code, out, err, took)
}

// ---------------------------------------------------------------------------------------------
// Output paths

#[test]
fn plot_or_json_in_a_missing_folder_fails_before_the_replay_naming_the_path() {
    if common::skip() {
        return;
    }
    let dir = temp_dir("paths");
    let missing = dir.join("no-such-folder");
    let json = missing.join("kv.json");
    let svg = missing.join("kv.svg");
    // 200,000 requests take many minutes: the refusal must come before any of them.
    let long = ["demo", "--scene", "kv-cache", "--requests", "200000"];
    for (opt, path) in [("--json", &json), ("--plot", &svg)] {
        let args: Vec<&str> = long
            .iter()
            .copied()
            .chain([opt, path.to_str().unwrap()])
            .collect();
        let (code, out, err, took) = hetmem_within(&args, &[], Duration::from_secs(60));
        assert_eq!(
            code,
            Some(1),
            "{opt}: still running or wrong exit after {took:?}\n{err}"
        );
        assert!(
            err.contains(&format!(
                "{opt} {}: the folder {} does not exist",
                path.display(),
                missing.display()
            )),
            "{err}"
        );
        assert!(err.contains("nothing was run"), "{err}");
        assert!(!out.contains("hetmem demo:"), "the replay started:\n{out}");
        assert!(!err.contains("progress:"), "the replay started:\n{err}");
    }
    // A folder where a file is wanted, and the same file for both.
    let (code, _, err, _) = hetmem_within(
        &[
            "demo",
            "--requests",
            "200000",
            "--plot",
            dir.to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!("--plot {}: that is a folder", dir.display())),
        "{err}"
    );
    let same = dir.join("same.out");
    let s = same.to_str().unwrap();
    let (code, _, err, _) = hetmem_within(
        &[&long[..], &["--plot", s, "--json", s]].concat(),
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!("--plot and --json both name {s}")),
        "{err}"
    );
    assert!(!same.exists(), "a refused run wrote {s}");
    // `bench --json` too: before the group runs (the table would be its first output).
    let (code, out, err, _) = hetmem_within(
        &["bench", "vmm", "--json", json.to_str().unwrap()],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        err.contains(&format!("--json {}: the folder", json.display())),
        "{err}"
    );
    assert!(!out.contains("hetmem bench vmm"), "the group ran:\n{out}");
    std::fs::remove_dir_all(&dir).ok();
}

// ---------------------------------------------------------------------------------------------
// Progress

/// The seconds of a duration as the progress line prints it: `2.4 s`, `12 s`, `3 min 05 s`,
/// `1 h 02 min`.
fn secs_of(s: &str) -> f64 {
    let w: Vec<&str> = s.split_whitespace().collect();
    match w.as_slice() {
        [v, "s"] => v.parse().unwrap(),
        [m, "min", v, "s"] => m.parse::<f64>().unwrap() * 60.0 + v.parse::<f64>().unwrap(),
        [h, "h", m, "min"] => h.parse::<f64>().unwrap() * 3600.0 + m.parse::<f64>().unwrap() * 60.0,
        _ => panic!("not a duration: {s:?}"),
    }
}

/// A progress line's `(served, requests, elapsed s, time left s)`; time left `None` when the
/// line says it is not known yet or the run is done.
fn parse_progress(l: &str) -> (u64, u64, f64, Option<f64>) {
    let rest = l.strip_prefix("progress: ").expect("a progress line");
    let (a, b) = rest.split_once('/').unwrap();
    let n = |s: &str| s.replace(',', "").parse::<u64>().unwrap();
    let total = b.split_whitespace().next().unwrap();
    let fields: Vec<&str> = rest.split(", ").collect();
    let elapsed = fields
        .iter()
        .find_map(|f| f.strip_suffix(" elapsed"))
        .unwrap_or_else(|| panic!("no elapsed in {l:?}"));
    let left = fields
        .iter()
        .find_map(|f| {
            f.strip_prefix("about ")
                .and_then(|f| f.strip_suffix(" left"))
        })
        .map(secs_of);
    (n(a), n(total), secs_of(elapsed), left)
}

#[test]
fn progress_time_left_is_the_time_so_far_scaled_by_the_share_of_requests_left() {
    if common::skip() {
        return;
    }
    // Interval 0: a line whenever a request finishes, each with its own figures.
    let (o, out, err) = hetmem(
        &[
            "demo",
            "--scene",
            "kv-cache",
            "--requests",
            "24",
            "--layers",
            "2",
            "--max-context",
            "2048",
            "--progress-interval",
            "0",
        ],
        &[
            ("HETMEM_HOST_DEVICES", "2"),
            ("HETMEM_HOST_DEVICE_MEMORY", "256M"),
        ],
    );
    assert!(o.status.success(), "{out}\n{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("progress: "))
        .collect();
    let mut checked = 0;
    for l in &lines {
        let (served, n, elapsed, left) = parse_progress(l);
        assert_eq!(n, 24, "{l}");
        if l.ends_with("done") {
            assert_eq!(served, 24, "{l}");
            continue;
        }
        if served == 0 {
            assert!(
                l.ends_with("time left unknown until a request is served"),
                "{l}"
            );
            continue;
        }
        let left = left.unwrap_or_else(|| panic!("no time left in {l:?}"));
        // Printed to a tenth of a second (whole seconds from a minute on): both figures come
        // from the same instant, so the rule holds up to their rounding.
        let share = (n - served) as f64 / served as f64;
        let expect = elapsed * share;
        let slack = 0.05 * share + 0.05 + if expect >= 59.0 { 1.0 + share } else { 0.0 };
        assert!(
            (left - expect).abs() <= slack + 1e-9,
            "{l}: {left} s left, the share rule gives {elapsed} x {share:.3} = {expect:.3} s"
        );
        checked += 1;
    }
    assert!(checked >= 1, "no line with a time left to check:\n{err}");
}

#[test]
fn progress_first_line_comes_one_second_into_a_long_replay_not_after_the_interval() {
    if common::skip() {
        return;
    }
    // An interval of a minute: before, the first line came a minute in (or at the end).
    let mut c = Command::new(common::hetmem_bin());
    c.args([
        "demo",
        "--scene",
        "kv-cache",
        "--requests",
        "3000",
        "--layers",
        "4",
        "--max-context",
        "4096",
        "--progress-interval",
        "60",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    hetmem_testkit::clear_hetmem_env(&mut c);
    if let Some(b) = std::env::var_os("HETMEM_BACKEND") {
        c.env("HETMEM_BACKEND", b);
    }
    c.env("HETMEM_HOST_DEVICES", "2")
        .env("HETMEM_HOST_DEVICE_MEMORY", "1G");
    let start = Instant::now();
    let mut child = c.spawn().expect("run hetmem");
    let mut first = None;
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.starts_with("progress: ") {
            first = Some((line, start.elapsed()));
            break;
        }
    }
    // Enough seen: the rest of the replay is not needed.
    child.kill().ok();
    child.wait().ok();
    let (line, at) = first.expect("no progress line at all");
    let (served, n, elapsed, _) = parse_progress(&line);
    assert_eq!(n, 3000, "{line}");
    if line.ends_with("done") {
        // The whole replay took under a second: nothing to show before its end.
        assert!(elapsed < 1.0, "{line}");
        common::part_not_applicable(&format!(
            "the first line one second in: 3,000 requests took {elapsed} s here ({line})"
        ));
        return;
    }
    assert!(
        (1.0..=2.5).contains(&elapsed),
        "first line {elapsed} s into the replay (wanted about 1 s): {line}"
    );
    assert!(served < n, "{line}");
    assert!(
        at < Duration::from_secs(30),
        "first line {at:?} after the start of the command: {line}"
    );
}

// ---------------------------------------------------------------------------------------------
// Count options

#[test]
fn count_options_given_zero_negative_or_text_say_they_must_be_a_positive_count() {
    let cases: &[(&[&str], &str, &str, &str)] = &[
        (&["demo"], "--requests", "-3", "a positive count"),
        (&["demo"], "--requests", "0", "a positive count"),
        (&["demo"], "--requests", "many", "a positive count"),
        (&["demo"], "--layers", "-1", "a positive count"),
        (&["demo"], "--batch-slots", "0", "a positive count"),
        (&["demo"], "--devices", "-2", "a positive count"),
        (&["demo"], "--kv-heads", "1.5", "a positive count"),
        (&["demo"], "--max-context", "1", "a count of at least 2"),
        (
            &["demo"],
            "--progress-interval",
            "-1",
            "a number of seconds",
        ),
        (&["bench", "vmm"], "--rounds", "0", "a positive count"),
        (&["bench", "vmm"], "--iters", "-5", "a positive count"),
    ];
    for (cmd, opt, v, want) in cases {
        let args: Vec<&str> = cmd.iter().copied().chain([*opt, *v]).collect();
        let (o, out, err) = hetmem(&args, &[]);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {out}\n{err}");
        assert!(
            err.contains(&format!("invalid value '{v}' for '{opt} ")),
            "{args:?} does not name the option and the value:\n{err}"
        );
        assert!(err.contains(&format!("must be {want}")), "{args:?}:\n{err}");
        assert!(!err.contains("unexpected argument"), "{args:?}:\n{err}");
        assert_eq!(out, "", "{args:?} ran");
    }
    // The range is in the message.
    let (_, _, err) = hetmem(&["demo", "--requests", "-3"], &[]);
    assert!(
        err.contains("must be a positive count, a whole number from 1 to 10,000,000"),
        "{err}"
    );
    // A seed may be 0 but not negative; it is named too.
    let (o, _, err) = hetmem(&["demo", "--seed", "-3"], &[]);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("invalid value '-3' for '--seed "), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Adjusted configuration values

/// The configuration line of `hetmem info` that starts with `var=`.
fn config_line<'a>(out: &'a str, var: &str) -> &'a str {
    out.lines()
        .map(str::trim)
        .find(|l| l.starts_with(&format!("{var}=")))
        .unwrap_or_else(|| panic!("no {var} line in\n{out}"))
}

#[test]
fn max_alloc_above_the_device_is_reported_by_info_and_warned_about() {
    if common::skip() {
        return;
    }
    let env = [
        ("HETMEM_HOST_DEVICE_MEMORY", "1G"),
        ("HETMEM_HOST_MAX_ALLOC", "10G"),
    ];
    let (o, out, err) = hetmem(&["info"], &env);
    assert!(o.status.success(), "{out}\n{err}");
    // The builder records it as data, whichever front reports it.
    let rt = hetmem::Runtime::builder()
        .host_device_memory(1 << 30)
        .host_max_alloc_size(10 << 30)
        .build()
        .unwrap();
    let c = rt.driver().host_config().unwrap();
    assert_eq!(c.max_alloc_size, 1 << 30);
    assert_eq!(c.adjustments.len(), 1, "{:?}", c.adjustments);
    let a = &c.adjustments[0];
    assert_eq!(
        (a.field, a.asked, a.used, a.setting.as_str()),
        (
            "max_alloc_size",
            10 << 30,
            1 << 30,
            "host_max_alloc_size(10737418240)"
        )
    );
    // In range: nothing adjusted, nothing said.
    let ok = hetmem::Runtime::builder()
        .host_device_memory(1 << 30)
        .host_max_alloc_size(1 << 29)
        .build()
        .unwrap();
    assert_eq!(ok.driver().host_config().unwrap().adjustments, vec![]);
    if !common::info_ok().modelled {
        common::part_not_applicable(
            "info's HETMEM_HOST_MAX_ALLOC line and warning: HETMEM_HOST_* shape the host \
             backend's modelled devices only; this runtime's are the machine's",
        );
        assert!(!err.contains("warning"), "{err}");
        return;
    }
    assert!(
        err.contains(
            "hetmem: warning: HETMEM_HOST_MAX_ALLOC=10G: max_alloc_size 10737418240 bytes is \
             more than a device's memory (1073741824 bytes); using 1073741824 bytes"
        ),
        "{err}"
    );
    assert_eq!(
        config_line(&out, "HETMEM_HOST_MAX_ALLOC"),
        "HETMEM_HOST_MAX_ALLOC=1073741824 (env: 10G; adjusted from 10737418240 bytes: more \
         than a device's memory (1073741824 bytes))"
    );
    assert!(out.contains("largest single allocation 1 GiB"), "{out}");
    // The same warning where the demo starts its runtime from the environment.
    let (o, out, err) = hetmem(
        &[
            "demo",
            "--scene",
            "kv-cache",
            "--requests",
            "1",
            "--layers",
            "2",
            "--quiet",
        ],
        &env,
    );
    assert!(o.status.success(), "{out}\n{err}");
    assert!(
        err.contains("hetmem: warning: HETMEM_HOST_MAX_ALLOC=10G"),
        "{err}"
    );
    // And none when nothing is adjusted.
    let (_, _, err) = hetmem(&["info"], &[("HETMEM_HOST_MAX_ALLOC", "64M")]);
    assert!(!err.contains("warning"), "{err}");
}

#[test]
fn host_devices_splitting_memory_below_a_device_minimum_is_reported_by_info_and_warned_about() {
    if common::skip() {
        return;
    }
    if !common::info_ok().modelled {
        common::not_applicable(
            "HETMEM_HOST_DEVICES shapes the host backend's modelled devices only; this \
             runtime's are the machine's",
        );
        return;
    }
    // Enough devices that the default memory (a quarter of RAM) split between them is below
    // 64 MiB each, whatever this machine's RAM.
    let quarter = hetmem::platform::facts().total_ram / 4;
    let n = quarter / (64 << 20) + 2;
    let ns = n.to_string();
    let (o, out, err) = hetmem(&["info"], &[("HETMEM_HOST_DEVICES", &ns)]);
    assert!(o.status.success(), "{err}");
    let warn = err
        .lines()
        .find(|l| l.starts_with("hetmem: warning: "))
        .unwrap_or_else(|| panic!("no warning:\n{err}"));
    assert!(
        warn.starts_with(&format!(
            "hetmem: warning: HETMEM_HOST_DEVICES={n}: device_memory "
        )),
        "{warn}"
    );
    assert!(
        warn.contains(&format!("split {n} ways, below the 67108864 byte minimum")),
        "{warn}"
    );
    assert!(warn.ends_with("using 67108864 bytes"), "{warn}");
    let l = config_line(&out, "HETMEM_HOST_DEVICE_MEMORY");
    assert!(
        l.starts_with("HETMEM_HOST_DEVICE_MEMORY=67108864 (env: unset"),
        "{l}"
    );
    assert!(
        l.contains(&format!("adjusted by HETMEM_HOST_DEVICES={n} from ")),
        "{l}"
    );
    // Setting the memory too: it is taken as given, nothing adjusted.
    let (_, out, err) = hetmem(
        &["info"],
        &[
            ("HETMEM_HOST_DEVICES", &ns),
            ("HETMEM_HOST_DEVICE_MEMORY", "64M"),
        ],
    );
    assert!(!err.contains("warning"), "{err}");
    assert!(
        !config_line(&out, "HETMEM_HOST_DEVICE_MEMORY").contains("adjusted"),
        "{out}"
    );
}

// ---------------------------------------------------------------------------------------------
// Trace rows of 0 tokens

#[test]
fn trace_rows_of_zero_prompt_or_output_tokens_are_counted_reported_and_served_as_they_are() {
    if common::skip() {
        return;
    }
    let dir = temp_dir("zero");
    let (trace, json) = (dir.join("zero.csv"), dir.join("r.json"));
    // (prompt, output): request 1 and 3 have 0 prompt tokens, 2 and 3 have 0 output tokens.
    let rows = [(374u64, 44u64), (0, 109), (12, 0), (0, 0), (20, 5)];
    let mut csv = String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n");
    for (p, g) in rows {
        csv.push_str(&format!("2023-11-16 18:15:46.6805900,{p},{g}\n"));
    }
    std::fs::write(&trace, csv).unwrap();
    let (o, out, err) = hetmem(
        &[
            "demo",
            "--scene",
            "kv-cache",
            "--trace",
            trace.to_str().unwrap(),
            "--layers",
            "2",
            "--quiet",
            "--json",
            json.to_str().unwrap(),
        ],
        &[
            ("HETMEM_HOST_DEVICES", "2"),
            ("HETMEM_HOST_DEVICE_MEMORY", "256M"),
        ],
    );
    let j: Option<serde_json::Value> = std::fs::read_to_string(&json)
        .ok()
        .map(|t| serde_json::from_str(&t).unwrap());
    std::fs::remove_dir_all(&dir).ok();
    assert!(o.status.success(), "{out}\n{err}");
    assert!(
        out.lines().last().unwrap().starts_with("verification: OK"),
        "{out}"
    );
    let line = out
        .lines()
        .find(|l| l.starts_with("trace rows:"))
        .unwrap_or_else(|| panic!("no trace rows line:\n{out}"));
    assert_eq!(
        line,
        "trace rows:   2 with 0 prompt tokens (requests 1, 3; served with an empty prompt, not \
         as 1 token); 2 with 0 output tokens (requests 2, 3; served as the prompt alone)"
    );
    // Served as they are: the prompt tokens are the trace's sum, not with a 1 for each 0.
    let (prompt, generated): (u64, u64) = (
        rows.iter().map(|r| r.0).sum(),
        rows.iter().map(|r| r.1).sum(),
    );
    assert!(
        out.contains(&format!(
            "tokens:       {} ({prompt} prompt + {generated} generated;",
            prompt + generated
        )),
        "{out}"
    );
    assert!(out.contains("requests:     5 served"), "{out}");
    let j = j.expect("no JSON written");
    assert_eq!(j["trace_rows_zero_prompt"], 2, "{j}");
    assert_eq!(j["trace_rows_zero_output"], 2, "{j}");
    assert_eq!(j["prompt_tokens"], prompt, "{j}");
}

#[test]
fn a_trace_without_zero_rows_reports_none_with_its_attribution() {
    if common::skip() {
        return;
    }
    let Some(conv) = [PathBuf::from(env!("CARGO_MANIFEST_DIR"))]
        .into_iter()
        .chain(std::env::current_dir().ok())
        .flat_map(|s| {
            s.ancestors()
                .map(|d| d.join("shared/data/azure-llm-inference-2023/conv.csv"))
                .collect::<Vec<_>>()
        })
        .find(|p| p.is_file())
    else {
        common::skipped("the Azure conversation trace is not in shared/data");
        return;
    };
    // The first 40 rows' zero counts, from the file itself.
    let text = std::fs::read_to_string(&conv).unwrap();
    let rows: Vec<(u64, u64)> = text
        .lines()
        .skip(1)
        .take(40)
        .map(|l| {
            let f: Vec<&str> = l.trim().split(',').collect();
            (f[1].parse().unwrap(), f[2].parse().unwrap())
        })
        .collect();
    let zp = rows.iter().filter(|r| r.0 == 0).count();
    let dir = temp_dir("conv");
    let json = dir.join("r.json");
    let (o, out, err) = hetmem(
        &[
            "demo",
            "--scene",
            "kv-cache",
            "--trace",
            conv.to_str().unwrap(),
            "--requests",
            "40",
            "--layers",
            "2",
            "--quiet",
            "--json",
            json.to_str().unwrap(),
        ],
        &[
            ("HETMEM_HOST_DEVICES", "2"),
            ("HETMEM_HOST_DEVICE_MEMORY", "512M"),
        ],
    );
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap_or_default())
            .unwrap_or_default();
    std::fs::remove_dir_all(&dir).ok();
    assert!(o.status.success(), "{out}\n{err}");
    assert!(
        out.contains("attribution:  Azure LLM inference trace 2023 (CC-BY 4.0)"),
        "{out}"
    );
    assert_eq!(out.contains("trace rows:"), zp > 0, "{out}");
    assert_eq!(j["trace_rows_zero_prompt"], zp, "{j}");
    assert_eq!(
        j["prompt_tokens"],
        rows.iter().map(|r| r.0).sum::<u64>(),
        "{j}"
    );
}

// ---------------------------------------------------------------------------------------------
// Generated folders

#[test]
fn generated_folders_are_ignored_by_git_and_readme_examples_write_under_one() {
    let root = hetmem_testkit::repo_root("scripts");
    let ignore = std::fs::read_to_string(root.join(".gitignore"))
        .unwrap_or_else(|e| panic!("{}: {e}", root.join(".gitignore").display()));
    for entry in ["/.gpu/", "/out/", "/target"] {
        assert!(
            ignore.lines().any(|l| l.trim() == entry),
            "{entry} missing from .gitignore:\n{ignore}"
        );
    }
    // What README's examples write with --plot / --json (the placeholders FILE aside).
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    // Across lines: an example may wrap between the option and its path.
    let words: Vec<&str> = readme.split_whitespace().collect();
    let written: Vec<&str> = words
        .windows(2)
        .filter(|p| (p[0] == "--plot" || p[0] == "--json") && !p[1].contains("FILE"))
        .map(|p| p[1].trim_end_matches(|c| "`*.,;)".contains(c)))
        .collect();
    assert!(!written.is_empty(), "no --plot / --json example in README");
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(&root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.code().is_some())
    };
    let in_git = git(&["rev-parse", "--is-inside-work-tree"]).is_some_and(|o| o.status.success());
    let gpu = [
        ".gpu/tests.tar.zst",
        ".gpu/tests.tar.xz",
        ".gpu/MANIFEST",
        ".gpu/stage/hetmem",
    ];
    if !in_git {
        common::part_not_applicable(&format!(
            "git check-ignore of {gpu:?} and README's outputs {written:?}: {} is not a git \
             checkout here (the .gitignore entries were checked as text)",
            root.display()
        ));
        for p in &written {
            assert!(
                p.starts_with("out/") || p.starts_with("docs/"),
                "README example writes {p}, outside out/"
            );
        }
        return;
    }
    for p in gpu {
        let o = git(&["check-ignore", "-q", p]).unwrap();
        assert!(
            o.status.success(),
            "{p} (scripts/gpu-pack's output) is not ignored by git"
        );
    }
    for p in &written {
        // Under an ignored folder, or a figure the repository keeps (docs/).
        let ignored = git(&["check-ignore", "-q", p]).unwrap().status.success();
        let tracked = git(&["ls-files", "--error-unmatch", p])
            .unwrap()
            .status
            .success();
        assert!(
            ignored || tracked,
            "README example writes {p}: neither ignored by git nor a tracked file"
        );
        if tracked {
            assert!(Path::new(p).starts_with("docs"), "{p}");
        }
    }
}
