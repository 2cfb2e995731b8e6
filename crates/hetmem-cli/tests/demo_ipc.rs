//! `hetmem demo --scene ipc` end to end: a trainer process publishes its tensors with one range
//! handle, a server process opens it, checksums every tensor and compares the time against
//! per-tensor handles; the trainer checks the checksums (a mismatch exits non-zero). On the
//! suite's backend; each tensor takes whole base pages of it (`hetmem info`: 64 KiB on the host
//! backend, 2 MiB on cuda), which sets the size of the range.

mod common;

#[test]
fn ipc_scene_shares_weights_between_two_processes_with_one_range_handle() {
    if common::skip() {
        return;
    }
    let (o, out, err) = common::hetmem(&["demo", "--scene", "ipc"], &[]);
    assert!(o.status.success(), "exit {:?}\n{out}\n{err}", o.status);
    assert!(out.contains("72 tensors"), "{out}");
    assert!(out.contains("published: 1 range handle (64 bytes"), "{out}");
    assert!(out.contains("server: range handle:"), "{out}");
    assert!(out.contains("server: 72 tensor handles:"), "{out}");
    assert!(out.contains("all 72 checksums match"), "{out}");
    // The open-only speedup is labelled, and the end-to-end figure is printed next to it.
    assert!(out.contains("open alone"), "{out}");
    assert!(
        out.contains("end to end (open + checksum every byte"),
        "{out}"
    );
    // The server learnt the size from the handle alone: 24 layers of an 8 MiB and a 4 MiB
    // tensor and 24 norms of 64 KiB, each rounded up to the base page.
    let page = common::parse_human(&common::info_ok().dev0().small_page).expect("base page");
    let size: u64 = [8u64 << 20, 4 << 20, 64 << 10]
        .iter()
        .map(|t| 24 * t.next_multiple_of(page))
        .sum();
    assert!(
        out.contains(&format!("size {size:#x}), no size sent")),
        "{size:#x} not in\n{out}"
    );
    if common::on_host() {
        assert!(out.contains("size 0x12180000), no size sent"), "{out}");
    }
    let trainer = out.lines().find(|l| l.starts_with("trainer (pid")).unwrap();
    let server = out.lines().find(|l| l.starts_with("server (pid")).unwrap();
    assert_ne!(
        trainer.split(')').next(),
        server.split(')').next(),
        "two processes"
    );
}
