//! `hetmem demo` end to end: the built binary on the real trace, on a synthetic stream, under
//! memory pressure, and on bad input. Small model shapes keep these fast where the point is not
//! the real shape.
//!
//! Each runs on the suite's backend (`HETMEM_BACKEND`, see `common`): on the host backend with
//! two modelled devices of the size each test gives; on cuda on the machine's GPUs, where those
//! `HETMEM_HOST_*` settings do not apply, so the checks that need a device of a given small size
//! or the host backend's 64 KiB pages say they are not applicable there.

mod common;

use std::path::PathBuf;
use std::process::Output;

/// Where the Azure conversation trace lies below `shared/`.
const CONV: &str = "shared/data/azure-llm-inference-2023/conv.csv";

/// The Azure conversation trace in `shared/`, found by walking up from this crate, else from
/// the current directory (a copy of the repository elsewhere, where prebuilt tests run from
/// its root).
fn conv_trace() -> Option<PathBuf> {
    let mut starts = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR"))];
    starts.extend(std::env::current_dir().ok());
    starts
        .iter()
        .flat_map(|s| s.ancestors())
        .map(|d| d.join(CONV))
        .find(|p| p.is_file())
}

/// Runs `hetmem demo --scene kv-cache ARGS` on the suite's backend: on the host backend with
/// `device_memory` per device (2 devices), on cuda on the machine's GPUs. The other scenes have
/// tests of their own.
fn demo(args: &[&str], device_memory: &str) -> Output {
    let all: Vec<&str> = ["demo", "--scene", "kv-cache"]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    let env = [
        ("HETMEM_HOST_DEVICES", "2"),
        ("HETMEM_HOST_DEVICE_MEMORY", device_memory),
    ];
    common::hetmem(&all, &env).0
}

/// True (after a loud not-applicable line naming `what` and the runtime's devices) when the
/// runtime's devices are not the ones `HETMEM_HOST_*` model (`hetmem info`): the checks of
/// `what` need devices of a size the test chooses. `part`: only those checks, not the test.
fn devices_not_modelled(what: &str, part: bool) -> bool {
    let info = common::info_ok();
    if info.modelled {
        return false;
    }
    let reason = format!(
        "{what}: it needs devices of the size the test sets (HETMEM_HOST_DEVICE_MEMORY, the \
         host backend's modelled devices); this runtime's devices are the machine's: {}",
        info.describe()
    );
    if part {
        common::part_not_applicable(&reason)
    } else {
        common::not_applicable(&reason)
    }
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The number after `label` on the line that starts with it, e.g. `requests:     500 served`.
fn figure(stdout: &str, label: &str, after: &str) -> u64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} line in:\n{stdout}"));
    let rest = &line[line.find(after).expect("marker") + after.len()..];
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',')
        .filter(|c| *c != ',')
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no number after {after:?} in {line:?}"))
}

fn assert_verified(o: &Output) -> String {
    let (out, err) = text(o);
    assert!(o.status.success(), "exit {:?}\n{out}\n{err}", o.status);
    let last = out.lines().last().unwrap_or("");
    assert!(last.starts_with("verification: OK ("), "{out}");
    assert!(figure(&out, "verification:", "OK (") > 0, "{out}");
    out
}

#[test]
fn demo_replays_first_500_conversation_trace_requests_and_verifies_every_tag() {
    if common::skip() {
        return;
    }
    let Some(trace) = conv_trace() else {
        common::skipped(&format!(
            "{CONV} not found above the crate or the current directory"
        ));
        return;
    };
    let o = demo(
        &[
            "--trace",
            trace.to_str().unwrap(),
            "--requests",
            "500",
            "--layers",
            "2",
        ],
        "256M",
    );
    let out = assert_verified(&o);
    assert_eq!(figure(&out, "requests:", "requests:"), 500, "{out}");
    assert!(
        out.contains(
            "Azure LLM inference trace 2023 (CC-BY 4.0), Patel et al., Splitwise, ISCA 2024"
        ),
        "attribution missing:\n{out}"
    );
    // The first 500 requests hold 467,684 prompt and 132,536 generated tokens.
    assert_eq!(figure(&out, "tokens:", "tokens:"), 600_220, "{out}");
}

#[test]
fn demo_synthetic_stream_with_tiny_request_count_verifies() {
    if common::skip() {
        return;
    }
    let o = demo(
        &["--requests", "3", "--layers", "2", "--max-context", "2048"],
        "256M",
    );
    let out = assert_verified(&o);
    assert_eq!(figure(&out, "requests:", "requests:"), 3, "{out}");
    assert!(out.contains("synthetic"), "{out}");
}

#[test]
fn demo_at_64k_pages_on_one_device_verifies() {
    if common::skip() {
        return;
    }
    let info = common::info_ok();
    if info.dev0().small_page != "64 KiB"
        && common::not_applicable(&format!(
            "--page-size 64K: the page-size query of this runtime answers {} for small sizes \
             and {} from 2 MiB (hetmem info, {} backend), never 64 KiB; 64 KiB pages are the \
             host backend's",
            info.dev0().small_page,
            info.dev0().large_page,
            info.backend
        ))
    {
        return;
    }
    let o = demo(
        &[
            "--requests",
            "4",
            "--layers",
            "2",
            "--max-context",
            "2048",
            "--page-size",
            "64K",
            "--devices",
            "1",
        ],
        "256M",
    );
    let out = assert_verified(&o);
    assert!(out.contains("page 64 KiB"), "{out}");
    assert!(out.contains("layers 0-1 on device 0"), "{out}");
}

#[test]
fn demo_out_of_device_memory_preempts_and_still_verifies() {
    if common::skip() {
        return;
    }
    // 16 pages of 2 MiB per device, one layer per device: 8 slots cannot all grow at once.
    let o = demo(
        &[
            "--requests",
            "40",
            "--layers",
            "2",
            "--max-context",
            "4096",
            "--batch-slots",
            "8",
        ],
        "32M",
    );
    let out = assert_verified(&o);
    assert_eq!(figure(&out, "requests:", "requests:"), 40, "{out}");
    if devices_not_modelled(
        "the preemption check (devices of 32 MiB, 16 pages of 2 MiB each, so that 8 slots \
         cannot all grow at once)",
        true,
    ) {
        return;
    }
    assert!(
        figure(&out, "requests:", "clipped to 4,096 tokens, ") > 0,
        "no preemption under pressure:\n{out}"
    );
}

#[test]
fn demo_request_too_big_to_fit_alone_is_an_error_naming_its_size() {
    if common::skip()
        || devices_not_modelled(
            "a request too big for a device (devices of 4 MiB, 2 pages of 2 MiB, for a request \
             of 5 pages)",
            false,
        )
    {
        return;
    }
    let dir = std::env::temp_dir().join(format!("hetmem-demo-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("big.csv");
    std::fs::write(
        &trace,
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,5000,10\n",
    )
    .unwrap();
    // 2 pages of 2 MiB per device; the request needs 5 per buffer.
    let o = demo(&["--trace", trace.to_str().unwrap(), "--layers", "2"], "4M");
    std::fs::remove_dir_all(&dir).ok();
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(
        err.contains("does not fit even alone") && err.contains("5000 prompt + 10 output"),
        "{err}"
    );
    assert!(err.contains("out of device memory"), "{err}");
}

#[test]
fn demo_page_size_the_query_does_not_answer_is_rejected() {
    if common::skip() {
        return;
    }
    let o = demo(&["--page-size", "12345", "--requests", "1"], "256M");
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{out}");
    // The error offers what the page-size query answers (hetmem info).
    let d = common::info_ok().dev0();
    let offered = format!("{} or {}", d.small_page, d.large_page);
    assert!(
        err.contains("--page-size 12345") && err.contains(&offered),
        "{offered:?} not in {err}"
    );
    if common::on_host() {
        assert!(err.contains("64 KiB or 2 MiB"), "{err}");
    }
    assert!(!out.contains("verification"), "{out}");
}

#[test]
fn demo_missing_trace_file_is_rejected() {
    let o = demo(&["--trace", "/nonexistent/hetmem/trace.csv"], "256M");
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("cannot read trace /nonexistent/hetmem/trace.csv"),
        "{err}"
    );
}

#[test]
fn demo_token_too_small_for_the_tag_is_rejected() {
    let o = demo(
        &[
            "--kv-heads",
            "1",
            "--head-dim",
            "2",
            "--bytes-per-element",
            "2",
        ],
        "256M",
    );
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("8-byte tag"), "{err}");
}

/// A temporary directory of this test process, removed by the caller.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hetmem-demo-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The served count of a progress line: `progress: 3/12 requests served, ...`.
fn served_of(line: &str) -> (u64, u64) {
    let rest = line.strip_prefix("progress: ").expect("progress line");
    let (a, b) = rest.split_once('/').expect("a/b");
    let b = b.split_whitespace().next().unwrap();
    let n = |s: &str| s.replace(',', "").parse::<u64>().unwrap();
    (n(a), n(b))
}

#[test]
fn demo_progress_on_a_pipe_is_plain_lines_counting_up_to_every_request() {
    if common::skip() {
        return;
    }
    // stderr is a pipe here: plain lines, not a bar. Interval 0: a line whenever requests finish.
    let o = demo(
        &[
            "--requests",
            "12",
            "--layers",
            "2",
            "--max-context",
            "2048",
            "--progress-interval",
            "0",
        ],
        "256M",
    );
    let out = assert_verified(&o);
    let (_, err) = text(&o);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("progress: "))
        .collect();
    assert!(lines.len() >= 2, "{err}");
    assert!(
        !err.contains('\r') && !err.contains('\x1b'),
        "terminal codes on a pipe:\n{err:?}"
    );
    let served: Vec<(u64, u64)> = lines.iter().map(|l| served_of(l)).collect();
    assert!(served.iter().all(|&(_, total)| total == 12), "{err}");
    assert!(served.windows(2).all(|w| w[0].0 <= w[1].0), "{err}");
    assert!(
        served[..served.len() - 1].iter().all(|&(s, _)| s >= 1),
        "{err}"
    );
    for l in &lines {
        assert!(
            l.contains(" tokens/s, physical ") && l.contains(" elapsed, "),
            "{l}"
        );
    }
    let last = lines.last().unwrap();
    assert_eq!(served_of(last).0, 12, "{err}");
    assert!(last.ends_with("done"), "{last}");
    assert!(lines[0].contains("left"), "{}", lines[0]);
    // The report on stdout has none of it.
    assert!(!out.contains("progress"), "{out}");
}

#[test]
fn demo_quiet_writes_nothing_on_stderr_and_the_same_report() {
    if common::skip() {
        return;
    }
    let args = ["--requests", "5", "--layers", "2", "--max-context", "2048"];
    let quiet = demo(&[&args[..], &["--quiet"]].concat(), "256M");
    let loud = demo(&args, "256M");
    let (q_out, q_err) = (assert_verified(&quiet), text(&quiet).1);
    let l_out = assert_verified(&loud);
    assert_eq!(q_err, "", "stderr with --quiet");
    assert!(text(&loud).1.contains("progress: 5/5 requests served"));
    // Same report, line by line, apart from the measured times.
    let labels = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| !l.starts_with("map:") && !l.starts_with("unmap:"))
            .filter(|l| !l.starts_with("throughput:") && !l.starts_with("time:"))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(labels(&q_out), labels(&l_out));
}

#[test]
fn demo_with_a_trace_replays_all_of_it_unless_requests_limits_it() {
    if common::skip() {
        return;
    }
    let dir = temp_dir("whole");
    let trace = dir.join("t.csv");
    let mut csv = String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n");
    // More than the synthetic stream's default of 64 requests.
    for i in 0..70 {
        csv.push_str(&format!(
            "2023-11-16 18:15:46.6805900,{},{}\n",
            10 + i,
            1 + i % 5
        ));
    }
    std::fs::write(&trace, csv).unwrap();
    let t = trace.to_str().unwrap();
    let all = demo(&["--trace", t, "--layers", "2", "--quiet"], "256M");
    let some = demo(
        &["--trace", t, "--layers", "2", "--quiet", "--requests", "9"],
        "256M",
    );
    std::fs::remove_dir_all(&dir).ok();
    let out = assert_verified(&all);
    assert_eq!(figure(&out, "requests:", "requests:"), 70, "{out}");
    assert!(out.contains("70 requests of"), "{out}");
    let out = assert_verified(&some);
    assert_eq!(figure(&out, "requests:", "requests:"), 9, "{out}");
}

#[test]
fn demo_json_holds_the_reports_figures_and_plot_draws_both_panels() {
    if common::skip() {
        return;
    }
    let dir = temp_dir("json");
    let (json, svg) = (dir.join("r.json"), dir.join("p.svg"));
    let o = demo(
        &[
            "--requests",
            "6",
            "--layers",
            "2",
            "--max-context",
            "2048",
            "--quiet",
            "--json",
            json.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
        "256M",
    );
    let out = assert_verified(&o);
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let plot = std::fs::read_to_string(&svg).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let num = |k: &str| {
        j[k].as_f64()
            .unwrap_or_else(|| panic!("no number {k:?} in {j}"))
    };
    assert_eq!(num("requests_served"), 6.0);
    assert_eq!(num("tokens"), figure(&out, "tokens:", "tokens:") as f64);
    assert_eq!(num("steps"), figure(&out, "tokens:", "in ") as f64);
    assert_eq!(num("map_calls"), figure(&out, "map:", "us (") as f64);
    assert_eq!(
        num("tags_checked"),
        figure(&out, "verification:", "OK (") as f64
    );
    assert_eq!(j["verified"], serde_json::Value::Bool(true));
    for k in [
        "peak_physical_bytes",
        "peak_mapped_bytes",
        "preallocate_max_context_bytes",
        "fragmentation_at_peak_pct",
        "fragmentation_avg_pct",
        "map_p50_us",
        "map_p99_us",
        "unmap_p50_us",
        "unmap_p99_us",
        "tokens_per_s",
        "requests_per_s",
        "wall_s",
    ] {
        assert!(num(k) > 0.0, "{k} in {j}");
    }
    assert!(plot.starts_with("<svg"), "{}", &plot[..plot.len().min(200)]);
    for label in [
        "KV-cache memory over the replay",
        "physical memory mapped by hetmem",
        "bytes the live tokens need",
        "max context pre-allocated for each busy slot",
        "map / unmap latency",
    ] {
        assert!(plot.contains(label), "{label:?} missing from the plot");
    }
    // Four lines in panel 1, two in panel 2.
    assert!(plot.matches("<polyline").count() >= 6, "{plot}");
}
