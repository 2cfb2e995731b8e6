//! `hetmem demo --scene ipc` end to end: a trainer process publishes its tensors with one range
//! handle, a server process opens it, checksums every tensor and compares the time against
//! per-tensor handles; the trainer checks the checksums (a mismatch exits non-zero).

mod common;

#[test]
fn ipc_scene_shares_weights_between_two_processes_with_one_range_handle() {
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
    // The server learnt the size from the handle alone.
    assert!(out.contains("size 0x12180000), no size sent"), "{out}");
    let trainer = out.lines().find(|l| l.starts_with("trainer (pid")).unwrap();
    let server = out.lines().find(|l| l.starts_with("server (pid")).unwrap();
    assert_ne!(
        trainer.split(')').next(),
        server.split(')').next(),
        "two processes"
    );
}
