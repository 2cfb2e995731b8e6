//! `hetmem demo` end to end: the built binary on the real trace, on a synthetic stream, under
//! memory pressure, and on bad input. Small model shapes keep these fast where the point is not
//! the real shape.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

/// The Azure conversation trace in `shared/`, found by walking up from this crate.
fn conv_trace() -> Option<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|d| d.join("shared/data/azure-llm-inference-2023/conv.csv"))
        .find(|p| p.is_file())
}

/// Runs `hetmem demo --scene kv-cache ARGS` on the host backend with `device_memory` per device
/// (2 devices). The other scenes have tests of their own.
fn demo(args: &[&str], device_memory: &str) -> Output {
    let all: Vec<&str> = ["demo", "--scene", "kv-cache"]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    let env = [
        ("HETMEM_BACKEND", "host"),
        ("HETMEM_HOST_DEVICES", "2"),
        ("HETMEM_HOST_DEVICE_MEMORY", device_memory),
    ];
    common::hetmem(&all, &env).0
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
    let Some(trace) = conv_trace() else {
        println!(
            "skipped: shared/data/azure-llm-inference-2023/conv.csv not found above the crate"
        );
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
    assert!(
        figure(&out, "requests:", "clipped to 4,096 tokens, ") > 0,
        "no preemption under pressure:\n{out}"
    );
}

#[test]
fn demo_request_too_big_to_fit_alone_is_an_error_naming_its_size() {
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
    let o = demo(&["--page-size", "12345", "--requests", "1"], "256M");
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(
        err.contains("--page-size 12345") && err.contains("64 KiB or 2 MiB"),
        "{err}"
    );
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
