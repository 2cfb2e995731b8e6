//! `hetmem demo --scene free-policies` end to end: the built binary shows the three free
//! policies of `zeMemFreeExt` on a queued 512 MiB copy, with its times and the device capacity
//! over time, and checks each promise itself (a broken one exits non-zero). On the suite's
//! backend: a host device of 1 GiB, or the GPU on cuda (the scene writes and reads the new
//! allocation through device copies there).

mod common;

/// Parses the milliseconds at the start of a timeline line (`    12.345 ms  device used ...`).
fn ms_of(line: &str) -> f64 {
    line.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no time in {line:?}"))
}

/// The timeline line of `section` that ends with `what`, its runs of spaces made single.
fn line(out: &str, section: &str, what: &str) -> String {
    let start = out
        .find(section)
        .unwrap_or_else(|| panic!("no {section:?} in\n{out}"));
    let l = out[start..]
        .lines()
        .find(|l| l.trim_end().ends_with(what))
        .unwrap_or_else(|| panic!("no {what:?} line after {section:?} in\n{out}"));
    l.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn free_policies_scene_shows_blocking_defer_and_free_now_on_a_queued_512mib_copy() {
    if common::skip() {
        return;
    }
    let (o, out, err) = common::hetmem(&["demo", "--scene", "free-policies"], &[]);
    assert!(o.status.success(), "exit {:?}\n{out}\n{err}", o.status);
    assert!(out.contains("queued 512 MiB copy host -> device"), "{out}");
    assert!(out.contains("supports policies 0x3"), "{out}");

    // BLOCKING: returned after the copy's event, with the capacity back.
    assert!(
        out.contains("the copy's event was signalled when the free returned"),
        "{out}"
    );
    let b = line(&out, "BLOCKING_FREE", "free returned");
    assert!(b.contains("device used 0 B"), "{b}");

    // DEFER: returned at once with the capacity held, which came back after the gate opened.
    let d = line(&out, "DEFER_FREE", "free returned; pointer already invalid");
    assert!(d.contains("device used 512 MiB"), "{d}");
    let opened = ms_of(&line(&out, "DEFER_FREE", "gate opened: the copy runs"));
    let released = ms_of(&line(&out, "DEFER_FREE", "capacity released"));
    assert!(
        released >= opened,
        "capacity back before the copy ran\n{out}"
    );
    assert!(
        line(&out, "DEFER_FREE", "capacity released").contains("device used 0 B"),
        "{out}"
    );

    // Free now: capacity back at once, the new allocation disjoint and intact.
    let f = line(&out, "free now (policy 0)", "free returned");
    assert!(f.contains("device used 0 B"), "{f}");
    assert!(out.contains(": disjoint"), "{out}");
    assert!(out.contains("are intact after the copy"), "{out}");
    assert!(
        out.lines()
            .last()
            .unwrap_or("")
            .starts_with("free policies: OK"),
        "{out}"
    );
}
