//! IPC across real processes: the test binary re-executes itself as the other process
//! (`HETMEM_CHILD_CASE` selects what the child does; without it the child test returns at once;
//! the harness is `common::Proc`).
//! The two processes talk over the child's stdin / stdout lines, never sleeps.
//!
//! Covered: allocations, physical objects and a range of 3 reservations and 7 objects (non-zero
//! offsets, starting mid-object), each over both transports (an fd sent with `SCM_RIGHTS` and
//! written over bytes 0..4; the 64 bytes alone through a file); writes seen both ways; 2,000
//! opens in another process; forged token, put and stale handles through the broker; the
//! exporter gone before open (error) and after open (the view stays valid).
//!
//! On the backend under test (`HETMEM_BACKEND`), children included (they inherit it). Device
//! memory is read and written through the `dev_*` helpers. On cuda the fd transport (an fd
//! received with `SCM_RIGHTS` written over bytes 0..4) does not apply: a CUDA shareable fd
//! carries no identity the importer could check, so cuda handles travel as bytes, their fds
//! through the exporter's broker only.

mod common;

use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::{UnixListener, UnixStream};

use common::*;
use hetmem::platform::open_fd_count;
use hetmem::{Context, IpcHandle};

/// The child: one of the cases below, selected by `HETMEM_CHILD_CASE`.
#[test]
fn child_case_runner() {
    if common::skip() {
        return;
    }
    let Some(case) = child_case() else {
        return;
    };
    // `PIECES`: the child driver's range-piece limit.
    let rt = match env("PIECES").parse::<usize>() {
        Ok(n) => common::builder()
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
            let wait = env("WAIT") == "1";
            let line = child_export_alloc(&ctx, wait);
            if wait {
                assert_eq!(line, "exit");
            }
        }
        // Exports a 1 MiB allocation (KIND=alloc) or the range of `make_range` (KIND=range),
        // writes the handle to FILE, says @ready and serves opens until it is killed.
        "export_until_killed" => {
            let (e, h) = if env("KIND") == "range" {
                let (e, _) = make_range(&ctx);
                let props = hetmem::IpcProperties {
                    range_size: Some(e.size),
                    ..Default::default()
                };
                let h = ctx.get_ipc_handle_with_properties(e.ptr, &props).unwrap();
                (e, h)
            } else {
                let e = make_alloc(&ctx);
                let h = ctx.get_ipc_handle(e.ptr).unwrap();
                (e, h)
            };
            std::fs::write(env("FILE"), h.as_bytes()).unwrap();
            println!("@ready");
            // Killed while waiting here.
            let _ = read_stdin_line();
            ctx.put_ipc_handle(&h).unwrap();
            e.destroy(&ctx);
        }
        // Listens under a broker name of this process, says @ready with its pid and nonce,
        // accepts one requester, goes as far as PHASE in answering it and exits.
        "broker_dies" => fake_broker_that_dies(&env("PHASE")),
        other => panic!("unknown case {other}"),
    }
}

/// The nonce of the fake broker of `broker_dies`.
const FAKE_NONCE: u32 = 0x5eed_0001;

/// A broker that dies after accepting, at `phase`: `accept` (before reading the request),
/// `request` (after reading it), `head` (after the reply header announcing one piece and one
/// fd), `payload` (after the piece list, before the fd).
fn fake_broker_that_dies(phase: &str) -> ! {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let pid = std::process::id();
    let l = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    let name = runtime().driver().ipc_broker_name(pid, FAKE_NONCE);
    rustix::net::bind(
        &l,
        &SocketAddrUnix::new_abstract_name(name.as_bytes()).unwrap(),
    )
    .unwrap();
    rustix::net::listen(&l, 8).unwrap();
    println!("@ready {pid}");
    let c = rustix::net::accept(&l).unwrap();
    if phase != "accept" {
        let mut req = [0u8; 64];
        assert_eq!(recv_fds(c.as_fd(), &mut req, 1).unwrap().0, 64);
    }
    if phase == "head" || phase == "payload" {
        // The reply header: magic, status 0, payload of one piece, one fd.
        let mut head = Vec::new();
        head.extend_from_slice(b"HMBR");
        head.extend_from_slice(&0u32.to_le_bytes());
        head.extend_from_slice(&(16u64 + 24).to_le_bytes());
        head.extend_from_slice(&1u64.to_le_bytes());
        send_fds(c.as_fd(), &head, &[]).unwrap();
    }
    if phase == "payload" {
        let mut piece = Vec::new();
        for v in [1u64 << 20, 1, 0, 0, 1 << 20] {
            piece.extend_from_slice(&v.to_le_bytes());
        }
        send_fds(c.as_fd(), &piece, &[]).unwrap();
    }
    std::process::exit(0);
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
    // The bytes the exporter wrote: its view's size, which is the handle's except for an
    // allocation smaller than a page on cuda (the handle's view is the page-rounded span).
    let used: usize = env("SIZE").parse().unwrap();
    assert!(used <= size);
    assert_eq!(dev_check(ctx, p, used, seed), None, "exporter's pattern");
    dev_fill(ctx, p, used, seed + 1);
    println!("@written");
    assert_eq!(read_stdin_line(), "check");
    assert_eq!(
        dev_check(ctx, p, used, seed + 2),
        None,
        "exporter's second pattern"
    );
    ctx.close_ipc_handle(p).unwrap();
    drop(received);
    println!("@ok");
}

/// Exports `e`, hands it to a child over `transport` ("fd" or "bytes"), and checks that writes
/// go both ways.
fn share_both_ways(ctx: &Context, e: &common::Exported, h: IpcHandle, transport: &str) {
    assert!(
        transport == "bytes" || fd_transport_applies(),
        "the fd transport on {}",
        backend().name()
    );
    let seed = 1000u64;
    dev_fill(ctx, e.ptr, e.size, seed);
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
            ("SIZE", e.size.to_string()),
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
        dev_check(ctx, e.ptr, e.size, seed + 1),
        None,
        "importer's writes seen by the exporter"
    );
    dev_fill(ctx, e.ptr, e.size, seed + 2);
    child.say("check");
    assert_eq!(child.line(), "ok");
    child.finish();
    ctx.put_ipc_handle(&h).unwrap();
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&sock);
}

/// Whether the fd transport applies (the host backend); elsewhere false after a loud line.
fn fd_transport_applies() -> bool {
    !common::part_not_applicable_on(
        hetmem::BackendKind::Cuda,
        "the fd transport (an fd received with SCM_RIGHTS written over bytes 0..4): a CUDA \
         shareable fd carries no identity the importer could check, so cuda handles travel as \
         the 64 bytes, their fds through the exporter's broker",
    )
}

/// The transports of this backend: the fd one (where it applies) and the bytes alone.
fn transports() -> Vec<&'static str> {
    if fd_transport_applies() {
        vec!["fd", "bytes"]
    } else {
        vec!["bytes"]
    }
}

#[test]
fn allocation_shared_both_ways_over_fd_and_bytes() {
    if common::skip() {
        return;
    }
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let e = make_alloc(&ctx);
    for t in transports() {
        let h = ctx.get_ipc_handle(e.ptr).unwrap();
        share_both_ways(&ctx, &e, h, t);
    }
    e.destroy(&ctx);
}

#[test]
fn physical_object_shared_both_ways_over_fd_and_bytes() {
    if common::skip() {
        return;
    }
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let e = make_physical(&ctx);
    let h = ctx
        .get_physical_memory_ipc_handle(e.objects[0], None)
        .unwrap();
    share_both_ways(&ctx, &e, h, transports()[0]);
    // Through a mapped VA of the object.
    let h = ctx.get_ipc_handle(e.ptr + K64).unwrap();
    share_both_ways(&ctx, &e, h, "bytes");
    e.destroy(&ctx);
}

#[test]
fn range_of_3_reservations_and_7_objects_shared_both_ways_over_fd_and_bytes() {
    if common::skip() {
        return;
    }
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let (e, _) = make_range(&ctx);
    for t in transports() {
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
    if common::skip() {
        return;
    }
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
    if common::skip() {
        return;
    }
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

#[test]
fn forged_token_put_and_stale_handles_are_refused_by_the_broker() {
    if common::skip() {
        return;
    }
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
    if common::skip() {
        return;
    }
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let (c, fd, file) = if fd_transport_applies() {
        let (c, fd, file) = spawn_exporter_sending_fd("export_and_exit");
        (c, Some(fd), file)
    } else {
        let file = temp("handle");
        let mut c = Proc::spawn("export_and_exit", &[("FILE", file.display().to_string())]);
        assert_eq!(c.line(), "ready");
        (c, None, file)
    };
    c.finish();
    let h = read_handle(&file.display().to_string());
    // The 64 bytes alone: nobody serves them any more.
    let mut bytes_only = h;
    bytes_only.set_fd(-1);
    let e = ctx.open_ipc_handle(&bytes_only, 0).unwrap_err();
    assert_eq!(e.ze_result(), 0x7800_0004);
    assert!(e.message().contains("is gone"), "{e}");
    // The fd received while the exporter lived carries the memory itself.
    if let Some(fd) = fd {
        let mut with_fd = h;
        with_fd.set_fd(fd.as_raw_fd());
        let p = ctx.open_ipc_handle(&with_fd, 0).unwrap();
        assert_eq!(dev_check(&ctx, p, 1 << 20, EXPORTED_SEED), None);
        ctx.close_ipc_handle(p).unwrap();
    }
    let _ = std::fs::remove_file(&file);
}

/// The message of an open whose exporter is gone, whatever the moment it went.
fn assert_exporter_gone(e: &hetmem::Error, pid: u32) {
    assert_eq!(e.ze_result(), 0x7800_0004, "{e}");
    assert!(
        e.message()
            .contains(&format!("the exporting process {pid} is gone")),
        "{e}"
    );
}

#[test]
fn an_exporter_dying_after_accepting_the_request_is_the_exporter_gone_error() {
    if common::skip() {
        return;
    }
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let e = make_alloc(&ctx);
    let real = ctx.get_ipc_handle(e.ptr).unwrap();
    for phase in ["accept", "request", "head", "payload"] {
        let mut c = Proc::spawn("broker_dies", &[("PHASE", phase.into())]);
        let pid: u32 = c.line().strip_prefix("ready ").unwrap().parse().unwrap();
        // The real handle's bytes, naming the fake broker's process and name.
        let mut h = real;
        h.data[12..16].copy_from_slice(&pid.to_le_bytes());
        h.data[16..20].copy_from_slice(&FAKE_NONCE.to_le_bytes());
        h.set_fd(-1);
        reseal(&mut h);
        let t = std::time::Instant::now();
        let err = ctx.open_ipc_handle(&h, 0).unwrap_err();
        assert!(
            t.elapsed() < std::time::Duration::from_secs(2),
            "{phase}: the open took {:?}",
            t.elapsed()
        );
        assert_exporter_gone(&err, pid);
        c.finish();
    }
    ctx.put_ipc_handle(&real).unwrap();
    e.destroy(&ctx);
}

#[test]
fn an_exporter_killed_at_random_moments_during_opens_is_always_the_exporter_gone_error() {
    if common::skip() {
        return;
    }
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let start = std::time::Instant::now();
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
        | 1;
    let mut rounds = 0;
    let mut failed = 0;
    // Bounded: 40 rounds or 20 s, whichever comes first (at least 5 rounds).
    while rounds < 40 && (rounds < 5 || start.elapsed() < std::time::Duration::from_secs(20)) {
        let file = temp("handle");
        let kind = if rounds % 2 == 0 { "alloc" } else { "range" };
        let mut c = Proc::spawn(
            "export_until_killed",
            &[("FILE", file.display().to_string()), ("KIND", kind.into())],
        );
        assert_eq!(c.line(), "ready");
        let h = read_handle(&file.display().to_string());
        let pid = h.exporter_pid().unwrap();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = std::time::Duration::from_micros(seed % 3000);
        // Each importer opens (and closes) until its first failure: once the exporter is
        // dead every open fails, so each ends.
        let errors: Vec<(hetmem::Error, std::time::Duration)> = std::thread::scope(|s| {
            let importers: Vec<_> = (0..3)
                .map(|_| {
                    s.spawn(|| loop {
                        let t = std::time::Instant::now();
                        match ctx.open_ipc_handle(&h, 0) {
                            Ok(p) => ctx.close_ipc_handle(p).unwrap(),
                            Err(e) => break (e, t.elapsed()),
                        }
                    })
                })
                .collect();
            std::thread::sleep(delay);
            c.kill();
            importers.into_iter().map(|t| t.join().unwrap()).collect()
        });
        for (e, took) in &errors {
            assert_exporter_gone(e, pid);
            assert!(
                *took < std::time::Duration::from_secs(2),
                "a failed open took {took:?}: {e}"
            );
        }
        failed += errors.len();
        rounds += 1;
        let _ = std::fs::remove_file(&file);
    }
    assert_eq!(failed, 3 * rounds, "each importer ends with one failure");
}

#[test]
fn view_stays_valid_after_the_exporter_frees_and_exits() {
    if common::skip() {
        return;
    }
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
    assert_eq!(dev_check(&ctx, p, 1 << 20, EXPORTED_SEED), None);
    dev_fill(&ctx, p, 1 << 20, 5);
    assert_eq!(dev_check(&ctx, p, 1 << 20, 5), None);
    ctx.close_ipc_handle(p).unwrap();
    let _ = std::fs::remove_file(&file);
}
