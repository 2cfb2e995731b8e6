//! IPC across real processes: the test binary re-executes itself as the other process
//! (`HETMEM_IPC_CASE` selects what the child does; without it the child test returns at once).
//! The two processes talk over the child's stdin / stdout lines, never sleeps.
//!
//! Covered: allocations, physical objects and a range of 3 reservations and 7 objects (non-zero
//! offsets, starting mid-object), each over both transports (an fd sent with `SCM_RIGHTS` and
//! written over bytes 0..4; the 64 bytes alone through a file); writes seen both ways; 2,000
//! opens in another process; forged token, put and stale handles through the broker; the
//! exporter gone before open (error) and after open (the view stays valid).

mod ipc_common;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use hetmem::platform::open_fd_count;
use hetmem::{Context, IpcHandle};
use ipc_common::*;

const CASE: &str = "HETMEM_IPC_CASE";

fn temp(name: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("hetmem-ipc-{}-{n}-{name}", std::process::id()))
}

struct Proc {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl Proc {
    fn spawn(case: &str, env: &[(&str, String)]) -> Proc {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.args(["--exact", "child", "--nocapture", "--test-threads=1", "-q"])
            .env(CASE, case)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.spawn().expect("spawn child");
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Proc { child, stdin, out }
    }
    /// The next line the child printed that starts with `@` (the harness prints others).
    fn line(&mut self) -> String {
        loop {
            let mut l = String::new();
            if self.out.read_line(&mut l).unwrap() == 0 {
                panic!("child ended early: {:?}", self.child.wait());
            }
            if let Some(m) = l.strip_prefix('@') {
                return m.trim().to_string();
            }
        }
    }
    fn say(&mut self, s: &str) {
        writeln!(self.stdin, "{s}").unwrap();
        self.stdin.flush().unwrap();
    }
    fn finish(mut self) {
        drop(self.stdin);
        let st = self.child.wait().unwrap();
        assert!(st.success(), "child failed: {st}");
    }
}

fn read_stdin_line() -> String {
    let mut l = String::new();
    std::io::stdin().read_line(&mut l).unwrap();
    l.trim().to_string()
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

fn read_handle(path: &str) -> IpcHandle {
    let b = std::fs::read(path).unwrap();
    IpcHandle::from_bytes(b.try_into().expect("64 bytes"))
}

/// The child: one of the cases below, selected by `HETMEM_IPC_CASE`.
#[test]
fn child() {
    let Ok(case) = std::env::var(CASE) else {
        return;
    };
    // `PIECES`: the child driver's range-piece limit.
    let rt = match env("PIECES").parse::<usize>() {
        Ok(n) => hetmem::Runtime::builder()
            .host_devices(1)
            .host_device_memory(256 << 20)
            .ipc_max_range_pieces(n)
            .build()
            .unwrap(),
        Err(_) => runtime(),
    };
    let ctx = rt.driver().create_context().unwrap();
    match case.as_str() {
        "import" => child_import(&ctx),
        "many" => {
            let h = read_handle(&env("FILE"));
            let before = open_fd_count();
            let mut ptrs = std::collections::HashSet::new();
            for _ in 0..2000 {
                assert!(ptrs.insert(ctx.open_ipc_handle(&h, 0).unwrap()));
            }
            for &p in &ptrs {
                ctx.close_ipc_handle(p).unwrap();
            }
            println!(
                "@ok {} {}",
                ptrs.len(),
                open_fd_count() as i64 - before as i64
            );
        }
        "open_error" => {
            let h = read_handle(&env("FILE"));
            match ctx.open_ipc_handle(&h, 0) {
                Ok(p) => println!("@opened {p:#x}"),
                Err(e) => println!("@err {:#x} {}", e.ze_result(), e.message()),
            }
        }
        "export_and_exit" => {
            let e = make_alloc(&ctx);
            fill(e.ptr, e.size, 0xabcd);
            let h = ctx.get_ipc_handle(e.ptr).unwrap();
            std::fs::write(env("FILE"), h.as_bytes()).unwrap();
            if !env("SOCK").is_empty() {
                let s = UnixStream::connect(env("SOCK")).unwrap();
                // SAFETY: the handle's fd is open in this process until put.
                let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(h.fd()) };
                send_fds(s.as_fd(), b"x", &[fd]).unwrap();
            }
            println!("@ready");
            if env("WAIT") == "1" {
                assert_eq!(read_stdin_line(), "exit");
            }
            ctx.put_ipc_handle(&h).unwrap();
            e.destroy(&ctx);
        }
        other => panic!("unknown case {other}"),
    }
}

fn child_import(ctx: &Context) {
    let mut h = read_handle(&env("FILE"));
    let mut received = None;
    if !env("SOCK").is_empty() {
        let s = UnixStream::connect(env("SOCK")).unwrap();
        let mut b = [0u8; 1];
        let (_, mut fds) = recv_fds(s.as_fd(), &mut b, 1).unwrap();
        let fd = fds.pop().expect("an fd");
        h.set_fd(fd.as_raw_fd());
        received = Some(fd);
    }
    let seed: u64 = env("SEED").parse().unwrap();
    let p = ctx.open_ipc_handle(&h, 0).unwrap();
    let size = h.size().unwrap();
    assert_eq!(ctx.get_address_range(p).unwrap(), (p, size));
    assert_eq!(check(p, size, seed), None, "exporter's pattern");
    fill(p, size, seed + 1);
    println!("@written");
    assert_eq!(read_stdin_line(), "check");
    assert_eq!(check(p, size, seed + 2), None, "exporter's second pattern");
    ctx.close_ipc_handle(p).unwrap();
    drop(received);
    println!("@ok");
}

/// Exports `e`, hands it to a child over `transport` ("fd" or "bytes"), and checks that writes
/// go both ways.
fn share_both_ways(ctx: &Context, e: &ipc_common::Exported, h: IpcHandle, transport: &str) {
    let seed = 1000u64;
    fill(e.ptr, e.size, seed);
    let file = temp("handle");
    std::fs::write(&file, h.as_bytes()).unwrap();
    let sock = temp("sock");
    let listener = (transport == "fd").then(|| UnixListener::bind(&sock).unwrap());
    let mut child = Proc::spawn(
        "import",
        &[
            ("FILE", file.display().to_string()),
            (
                "SOCK",
                if transport == "fd" {
                    sock.display().to_string()
                } else {
                    String::new()
                },
            ),
            ("SEED", seed.to_string()),
        ],
    );
    if let Some(l) = &listener {
        let (conn, _) = l.accept().unwrap();
        // SAFETY: the handle's fd is open in this process until put.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(h.fd()) };
        send_fds(conn.as_fd(), b"x", &[fd]).unwrap();
    }
    assert_eq!(child.line(), "written");
    assert_eq!(
        check(e.ptr, e.size, seed + 1),
        None,
        "importer's writes seen by the exporter"
    );
    fill(e.ptr, e.size, seed + 2);
    child.say("check");
    assert_eq!(child.line(), "ok");
    child.finish();
    ctx.put_ipc_handle(&h).unwrap();
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&sock);
}

#[test]
fn allocation_shared_both_ways_over_fd_and_bytes() {
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let e = make_alloc(&ctx);
    for t in ["fd", "bytes"] {
        let h = ctx.get_ipc_handle(e.ptr).unwrap();
        share_both_ways(&ctx, &e, h, t);
    }
    e.destroy(&ctx);
}

#[test]
fn physical_object_shared_both_ways_over_fd_and_bytes() {
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let e = make_physical(&ctx);
    let h = ctx
        .get_physical_memory_ipc_handle(e.objects[0], None)
        .unwrap();
    share_both_ways(&ctx, &e, h, "fd");
    // Through a mapped VA of the object.
    let h = ctx.get_ipc_handle(e.ptr + K64).unwrap();
    share_both_ways(&ctx, &e, h, "bytes");
    e.destroy(&ctx);
}

#[test]
fn range_of_3_reservations_and_7_objects_shared_both_ways_over_fd_and_bytes() {
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let (e, _) = make_range(&ctx);
    for t in ["fd", "bytes"] {
        let props = hetmem::IpcProperties {
            range_size: Some(e.size),
            ..Default::default()
        };
        let h = ctx.get_ipc_handle_with_properties(e.ptr, &props).unwrap();
        assert_eq!(h.size(), Some(e.size));
        share_both_ways(&ctx, &e, h, t);
    }
    e.destroy(&ctx);
}

#[test]
fn two_thousand_opens_in_another_process_give_unique_pointers_and_no_fd_leak() {
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let e = make_alloc(&ctx);
    let h = ctx.get_ipc_handle(e.ptr).unwrap();
    let file = temp("handle");
    std::fs::write(&file, h.as_bytes()).unwrap();
    let mut c = Proc::spawn("many", &[("FILE", file.display().to_string())]);
    assert_eq!(c.line(), "ok 2000 0");
    c.finish();
    ctx.put_ipc_handle(&h).unwrap();
    e.destroy(&ctx);
    let _ = std::fs::remove_file(&file);
}

/// Opens `h` in a child and returns its `(code, message)`.
fn open_in_child(h: &IpcHandle) -> (u32, String) {
    let file = temp("handle");
    std::fs::write(&file, h.as_bytes()).unwrap();
    let mut c = Proc::spawn("open_error", &[("FILE", file.display().to_string())]);
    let l = c.line();
    c.finish();
    let _ = std::fs::remove_file(&file);
    let rest = l
        .strip_prefix("err ")
        .unwrap_or_else(|| panic!("expected an error, got {l}"));
    let (code, msg) = rest.split_once(' ').unwrap();
    (
        u32::from_str_radix(code.trim_start_matches("0x"), 16).unwrap(),
        msg.to_string(),
    )
}

#[test]
fn an_importer_refuses_a_range_handle_of_more_pieces_than_its_driver_carries() {
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let (e, _) = make_range(&ctx);
    let props = hetmem::IpcProperties {
        range_size: Some(e.size),
        ..Default::default()
    };
    let h = ctx.get_ipc_handle_with_properties(e.ptr, &props).unwrap();
    let file = temp("handle");
    std::fs::write(&file, h.as_bytes()).unwrap();
    for pieces in [6, 7] {
        let mut c = Proc::spawn(
            "open_error",
            &[
                ("FILE", file.display().to_string()),
                ("PIECES", pieces.to_string()),
            ],
        );
        let l = c.line();
        c.finish();
        if pieces == 6 {
            assert!(l.starts_with("err 0x78000009"), "{l}");
            assert!(l.contains("7 pieces") && l.contains("at most 6"), "{l}");
        } else {
            assert!(l.starts_with("opened"), "{l}");
        }
    }
    let _ = std::fs::remove_file(&file);
    ctx.put_ipc_handle(&h).unwrap();
    e.destroy(&ctx);
}

/// FNV-1a over bytes 4..60 into 60..64: the checksum catches corruption, not forgery.
fn reseal(h: &mut IpcHandle) {
    let mut x: u32 = 0x811c_9dc5;
    for &b in &h.data[4..60] {
        x ^= b as u32;
        x = x.wrapping_mul(0x0100_0193);
    }
    h.data[60..64].copy_from_slice(&x.to_le_bytes());
}

#[test]
fn forged_token_put_and_stale_handles_are_refused_by_the_broker() {
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let e = make_alloc(&ctx);
    let h = ctx.get_ipc_handle(e.ptr).unwrap();
    let mut forged = h;
    forged.data[30] ^= 1;
    forged.set_fd(-1);
    reseal(&mut forged);
    let (code, msg) = open_in_child(&forged);
    assert_eq!(code, 0x7800_0004);
    assert!(msg.contains("wrong token"), "{msg}");
    // Another export id that never existed.
    let mut stale = h;
    stale.data[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
    stale.set_fd(-1);
    reseal(&mut stale);
    let (code, msg) = open_in_child(&stale);
    assert_eq!(code, 0x7800_0004);
    assert!(msg.contains("does not exist"), "{msg}");
    // Corrupted bytes.
    let mut bad = h;
    bad.data[45] ^= 0xff;
    assert_eq!(open_in_child(&bad).0, 0x7800_0004);
    // Put.
    ctx.put_ipc_handle(&h).unwrap();
    let (code, msg) = open_in_child(&h);
    assert_eq!(code, 0x7800_0004);
    assert!(msg.contains("does not exist"), "{msg}");
    e.destroy(&ctx);
}

#[test]
fn exporter_gone_before_open_is_an_error_but_an_fd_received_before_still_opens() {
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let file = temp("handle");
    let sock = temp("sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let mut c = Proc::spawn(
        "export_and_exit",
        &[
            ("FILE", file.display().to_string()),
            ("SOCK", sock.display().to_string()),
        ],
    );
    let (conn, _) = listener.accept().unwrap();
    let mut b = [0u8; 1];
    let (_, mut fds) = recv_fds(conn.as_fd(), &mut b, 1).unwrap();
    let fd = fds.pop().unwrap();
    assert_eq!(c.line(), "ready");
    c.finish();
    let h = read_handle(&file.display().to_string());
    // The 64 bytes alone: nobody serves them any more.
    let mut bytes_only = h;
    bytes_only.set_fd(-1);
    let e = ctx.open_ipc_handle(&bytes_only, 0).unwrap_err();
    assert_eq!(e.ze_result(), 0x7800_0004);
    assert!(e.message().contains("is gone"), "{e}");
    // The fd received while the exporter lived carries the memory itself.
    let mut with_fd = h;
    with_fd.set_fd(fd.as_raw_fd());
    let p = ctx.open_ipc_handle(&with_fd, 0).unwrap();
    assert_eq!(check(p, 1 << 20, 0xabcd), None);
    ctx.close_ipc_handle(p).unwrap();
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&sock);
}

#[test]
fn view_stays_valid_after_the_exporter_frees_and_exits() {
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let file = temp("handle");
    let mut c = Proc::spawn(
        "export_and_exit",
        &[("FILE", file.display().to_string()), ("WAIT", "1".into())],
    );
    assert_eq!(c.line(), "ready");
    let h = read_handle(&file.display().to_string());
    let p = ctx.open_ipc_handle(&h, 0).unwrap();
    c.say("exit");
    c.finish();
    assert_eq!(check(p, 1 << 20, 0xabcd), None);
    fill(p, 1 << 20, 5);
    assert_eq!(check(p, 1 << 20, 5), None);
    ctx.close_ipc_handle(p).unwrap();
    let _ = std::fs::remove_file(&file);
}
