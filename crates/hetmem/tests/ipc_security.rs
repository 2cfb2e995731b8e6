//! IPC security and robustness rules, across real processes where the rule is cross-process
//! (the test binary re-executes itself; `HETMEM_CHILD_CASE` selects the child's part).
//!
//! - the importer checks the broker's `SO_PEERCRED` before sending a token: a process squatting
//!   a vanished exporter's broker name gets nothing and the open fails;
//! - a broker that fails to start is not remembered: the next export starts it;
//! - idle connections to the broker do not stall a real importer, and a flood is bounded;
//! - the fd transport recognises the received fd by device and inode;
//! - `import_system_memory` refuses IPC views and managed memory;
//! - range handles: memory that is not reserved VA -> `InvalidArgument`, holes ->
//!   `AddressNotFound`.

mod common;

use common::ze::{ADDRESS_NOT_FOUND, INVALID_ARGUMENT};

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use common::*;
use hetmem::platform::open_fd_count;
use hetmem::IpcProperties;
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};

/// The tests count process-wide things (fds, exports, broker peers): one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    lock(&SERIAL)
}

#[test]
fn child_case_runner() {
    if common::skip() {
        return;
    }
    let Some(case) = child_case() else {
        return;
    };
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    match case.as_str() {
        // Exports a 1 MiB allocation (pattern EXPORTED_SEED), writes the handle to FILE, sends its fd
        // to SOCK if given, says @ready and exits when told.
        "export" => {
            child_export_alloc(&ctx, true);
        }
        // Opens the handle in FILE (bytes only) and checks the pattern.
        "import" => {
            let h = read_handle(&env("FILE"));
            let t = Instant::now();
            let p = ctx.open_ipc_handle(&h, 0).unwrap();
            let took = t.elapsed();
            assert_eq!(dev_check(&ctx, p, 1 << 20, EXPORTED_SEED), None);
            ctx.close_ipc_handle(p).unwrap();
            println!("@ok {}", took.as_millis());
        }
        // The first export finds no fd for the broker's socket; the second (limit restored)
        // starts it.
        "broker_start_fails" => {
            let e = make_alloc(&ctx);
            let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
            let highest = std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|d| d.ok()?.file_name().to_str()?.parse::<u64>().ok())
                .max()
                .unwrap();
            rustix::process::setrlimit(
                rustix::process::Resource::Nofile,
                rustix::process::Rlimit {
                    current: Some(highest + 16),
                    maximum: lim.maximum,
                },
            )
            .unwrap();
            // Fill every free fd slot, then free one: room for the export's dup only, so the
            // broker's socket() gets EMFILE.
            let mut fillers = Vec::new();
            while let Ok(f) = std::fs::File::open("/dev/null") {
                fillers.push(f);
            }
            fillers.pop();
            let first = ctx.get_ipc_handle(e.ptr);
            drop(fillers);
            rustix::process::setrlimit(rustix::process::Resource::Nofile, lim).unwrap();
            let err = first.unwrap_err();
            assert!(err.message().contains("IPC broker"), "{err}");
            assert!(err.message().contains("tries again"), "{err}");
            assert_eq!(hetmem::ipc::live_exports(), 0);
            let h = ctx
                .get_ipc_handle(e.ptr)
                .expect("the failure was not cached");
            let p = ctx.open_ipc_handle(&h, 0).unwrap();
            ctx.close_ipc_handle(p).unwrap();
            ctx.put_ipc_handle(&h).unwrap();
            e.destroy(&ctx);
            println!("@ok");
        }
        other => panic!("unknown case {other}"),
    }
}

/// Binds the abstract name `name` as a squatter would, listening.
fn squat(name: &str) -> OwnedFd {
    let s = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    let addr = SocketAddrUnix::new_abstract_name(name.as_bytes()).unwrap();
    rustix::net::bind(&s, &addr).expect("the vanished exporter's name is free");
    rustix::net::listen(&s, 4).unwrap();
    s
}

#[test]
fn importer_checks_broker_peercred_so_a_name_squatter_never_receives_the_token() {
    if common::skip() {
        return;
    }
    let _serial = serial();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let file = temp("handle");
    let mut c = Proc::spawn("export", &[("FILE", file.display().to_string())]);
    assert_eq!(c.line(), "ready");
    let mut h = read_handle(&file.display().to_string());
    c.say("exit");
    c.finish();
    h.set_fd(-1);
    let name = rt
        .driver()
        .ipc_broker_name(h.exporter_pid().unwrap(), h.broker_nonce().unwrap());
    // This process (same uid, another pid) takes the vanished exporter's name.
    let listener = squat(&name);
    let squatter = std::thread::spawn(move || {
        let conn = rustix::net::accept_with(&listener, SocketFlags::CLOEXEC).unwrap();
        let mut b = [0u8; 64];
        // The importer hangs up without sending: 0 bytes.
        recv_fds(conn.as_fd(), &mut b, 1).map(|(n, _)| n)
    });
    let e = ctx.open_ipc_handle(&h, 0).unwrap_err();
    assert_eq!(e.ze_result(), INVALID_ARGUMENT, "{e}");
    assert!(e.message().contains("SO_PEERCRED"), "{e}");
    assert_eq!(squatter.join().unwrap(), Ok(0), "the squatter got bytes");
    assert_eq!(hetmem::ipc::open_views(), 0);
    let _ = std::fs::remove_file(&file);
}

#[test]
fn broker_start_failure_is_not_cached_and_the_next_export_starts_it() {
    if common::not_applicable_on(
        hetmem::BackendKind::Cuda,
        "it leaves exactly one free fd slot, the one the host export's memfd dup takes, so that \
         the broker's socket() alone fails with EMFILE; on cuda the export's fd comes from \
         cuMemExportToShareableHandle and the driver opens descriptors of its own, so that \
         arrangement cannot be made",
    ) || common::skip()
    {
        return;
    }
    let _serial = serial();
    let mut c = Proc::spawn("broker_start_fails", &[]);
    assert_eq!(c.line(), "ok");
    c.finish();
}

#[test]
fn idle_broker_connections_do_not_stall_a_real_importer_and_a_flood_is_bounded() {
    if common::skip() {
        return;
    }
    let _serial = serial();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let e = make_alloc(&ctx);
    dev_fill(&ctx, e.ptr, e.size, EXPORTED_SEED);
    let h = ctx.get_ipc_handle(e.ptr).unwrap();
    let (pid, nonce) = (h.exporter_pid().unwrap(), h.broker_nonce().unwrap());
    let drv = rt.driver();
    let name = drv.ipc_broker_name(pid, nonce);
    let stats = || drv.ipc_broker_stats();
    let (max_peers, worker_idle) = (stats().max_peers, stats().worker_idle);
    let fds0 = open_fd_count();
    // Eight peers connect and never send (the old broker waited 5 s on each in turn).
    let idle: Vec<OwnedFd> = (0..8).map(|_| connect_abstract(&name).unwrap()).collect();
    let file = temp("handle");
    std::fs::write(&file, h.as_bytes()).unwrap();
    let t = Instant::now();
    let mut c = Proc::spawn("import", &[("FILE", file.display().to_string())]);
    let l = c.line();
    c.finish();
    assert!(l.starts_with("ok"), "{l}");
    let open_ms: u64 = l[3..].parse().unwrap();
    assert!(
        open_ms < 900,
        "the importer's open took {open_ms} ms behind 8 idle connections"
    );
    assert!(t.elapsed() < Duration::from_secs(10));
    drop(idle);
    // Every connection made so far (the idle ones, then the importer's, accepted in that order)
    // was dealt with before the importer got its answer.
    let dispatched0 = stats().connections_dispatched;
    // A flood: the broker serves at most max_peers peers at once.
    let flood: Vec<OwnedFd> = (0..max_peers + 16)
        .filter_map(|_| connect_abstract(&name).ok())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while stats().peers_active < max_peers.min(flood.len()) && Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert!(stats().peers_active <= max_peers);
    let made = flood.len() as u64;
    drop(flood);
    // Peer threads end when their peer hangs up (or after the request timeout). The count is
    // read once the broker has accepted every flood connection: before that a momentary 0
    // between two waves of the backlog would not mean that the flood is over.
    let deadline = Instant::now() + Duration::from_secs(10);
    let finished = || {
        let s = stats();
        s.connections_dispatched >= dispatched0 + made && s.peers_active == 0
    };
    while !finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let s = stats();
    assert_eq!(
        s.connections_dispatched - dispatched0,
        made,
        "flood connections the broker has dealt with"
    );
    assert_eq!(s.peers_active, 0, "peers still being served");
    // Idle workers exit after worker_idle: no thread stays behind.
    let deadline = Instant::now() + worker_idle + Duration::from_secs(3);
    while stats().workers > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(stats().workers, 0, "broker worker threads left running");
    assert_eq!(open_fd_count(), fds0, "fds left open");
    ctx.put_ipc_handle(&h).unwrap();
    e.destroy(&ctx);
    let _ = std::fs::remove_file(&file);
}

#[test]
fn a_broker_with_every_worker_busy_answers_busy_instead_of_hanging_up() {
    if common::skip() {
        return;
    }
    let _serial = serial();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let e = make_alloc(&ctx);
    let h = ctx.get_ipc_handle(e.ptr).unwrap();
    let (pid, nonce) = (h.exporter_pid().unwrap(), h.broker_nonce().unwrap());
    let drv = rt.driver();
    let name = drv.ipc_broker_name(pid, nonce);
    let max_peers = drv.ipc_broker_stats().max_peers;
    let peers_active = || drv.ipc_broker_stats().peers_active;
    let request = || {
        drv.ipc_broker_request(pid, nonce, h.as_bytes(), 4096, 1)
            .unwrap()
    };
    // Every worker waits on a peer that never sends (each for at most the request timeout, so
    // a slow machine may need another round); a request then is answered busy or, if a worker
    // came free, served: never hung up on, which would read as "the exporter is gone".
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut busy = None;
    while busy.is_none() && Instant::now() < deadline {
        let idle: Vec<OwnedFd> = (0..max_peers)
            .map(|_| connect_abstract(&name).unwrap())
            .collect();
        let full = Instant::now() + Duration::from_secs(5);
        while peers_active() < max_peers && Instant::now() < full {
            std::thread::yield_now();
        }
        let r = request();
        let text = String::from_utf8_lossy(&r.payload).into_owned();
        match r.status {
            0 => assert_eq!(r.fds.len(), 1),
            // The busy answer: a refusal that says why.
            _ if text.contains("peers already") => busy = Some(text),
            s => panic!("status {s}: {text}"),
        }
        drop(idle);
    }
    let msg = busy.expect("no busy answer with every worker taken");
    assert!(msg.contains(&format!("serving {max_peers} peers")), "{msg}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while peers_active() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    // Served again once a worker is free.
    let r = request();
    assert_eq!(r.status, 0);
    assert_eq!(r.fds.len(), 1);
    ctx.put_ipc_handle(&h).unwrap();
    e.destroy(&ctx);
}

#[test]
fn fd_transport_matches_the_received_fd_by_device_and_inode() {
    if common::not_applicable_on(
        hetmem::BackendKind::Cuda,
        "the fd transport maps a received memfd recognised by device and inode; on cuda every \
         shareable fd is a descriptor of the same device file, with no identity, so handles \
         open only through the exporter's broker",
    ) || common::skip()
    {
        return;
    }
    let _serial = serial();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let (mut c, fd, file) = spawn_exporter_sending_fd("export");
    c.say("exit");
    c.finish();
    let mut h = read_handle(&file.display().to_string());
    h.set_fd(fd.as_raw_fd());
    // Same inode, another device number: not the exported memfd, so the (gone) broker is asked.
    let mut other_dev = h;
    other_dev.data[56] ^= 1;
    reseal(&mut other_dev);
    let e = ctx.open_ipc_handle(&other_dev, 0).unwrap_err();
    assert_eq!(e.ze_result(), INVALID_ARGUMENT);
    assert!(e.message().contains("is gone"), "{e}");
    // Device and inode match: the fd itself is mapped.
    let p = ctx.open_ipc_handle(&h, 0).unwrap();
    assert_eq!(check(p, 1 << 20, EXPORTED_SEED), None);
    ctx.close_ipc_handle(p).unwrap();
    let _ = std::fs::remove_file(&file);
}

#[test]
fn import_system_memory_over_an_ipc_view_or_managed_memory_is_invalid_argument() {
    if common::skip() {
        return;
    }
    let _serial = serial();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let e = make_alloc(&ctx);
    let h = ctx.get_ipc_handle(e.ptr).unwrap();
    let v = ctx.open_ipc_handle(&h, 0).unwrap();
    for (p, s) in [(v, 4096), (v + 8192, 4096), (v - 4096, 8192)] {
        let err = ctx.import_system_memory(p, s, false).unwrap_err();
        assert_eq!(err.ze_result(), INVALID_ARGUMENT, "{err}");
        assert!(err.message().contains("IPC view"), "{err}");
    }
    ctx.close_ipc_handle(v).unwrap();
    ctx.put_ipc_handle(&h).unwrap();
    match ctx.alloc_managed(4 << 20, 1) {
        Ok(m) => {
            let err = ctx.import_system_memory(m + 4096, 4096, false).unwrap_err();
            assert_eq!(err.ze_result(), INVALID_ARGUMENT, "{err}");
            assert!(err.message().contains("managed allocation"), "{err}");
            ctx.free_managed(m).unwrap();
        }
        Err(err) => assert_eq!(err.ze_result(), 0x7800_0003, "{err}"),
    }
    assert_eq!(ctx.driver().usm_stats().imports, 0);
    e.destroy(&ctx);
}

#[test]
fn range_handle_over_memory_that_is_not_reserved_va_is_invalid_argument_holes_address_not_found() {
    if common::skip() {
        return;
    }
    let _serial = serial();
    let rt = runtime();
    let ctx = rt.driver().create_context().unwrap();
    let range = |p: usize, s: usize| {
        ctx.get_ipc_handle_with_properties(
            p,
            &IpcProperties {
                range_size: Some(s),
                ..Default::default()
            },
        )
    };
    // The unit of range handles: the OS page on the host backend, the 2 MiB granule on cuda.
    let unit = if common::on_host() { 4096 } else { page(&ctx) };
    // A USM allocation, an IPC view, managed memory: InvalidArgument.
    let e = make_alloc(&ctx);
    assert_eq!(
        range(e.ptr, unit).unwrap_err().ze_result(),
        INVALID_ARGUMENT
    );
    let h = ctx.get_ipc_handle(e.ptr).unwrap();
    let v = ctx.open_ipc_handle(&h, 0).unwrap();
    let err = range(v, unit.max(1 << 20)).unwrap_err();
    assert_eq!(err.ze_result(), INVALID_ARGUMENT, "{err}");
    assert!(err.message().contains("IPC view"), "{err}");
    ctx.close_ipc_handle(v).unwrap();
    ctx.put_ipc_handle(&h).unwrap();
    if let Ok(m) = ctx.alloc_managed(2 << 20, 1) {
        let err = range(m, 2 << 20).unwrap_err();
        assert_eq!(err.ze_result(), INVALID_ARGUMENT, "{err}");
        assert!(err.message().contains("managed allocation"), "{err}");
        ctx.free_managed(m).unwrap();
    }
    // Holes: an unmapped page of a reservation, and memory hetmem does not know (the heap).
    let (r, hole) = make_range(&ctx);
    let err = range(r.ptr, hole + page(&ctx) - r.ptr).unwrap_err();
    assert_eq!(err.ze_result(), ADDRESS_NOT_FOUND, "{err}");
    let heap = vec![0u8; 4 * unit];
    let p = (heap.as_ptr() as usize).next_multiple_of(unit);
    assert_eq!(range(p, unit).unwrap_err().ze_result(), ADDRESS_NOT_FOUND);
    assert_eq!(hetmem::ipc::live_exports(), 0);
    r.destroy(&ctx);
    e.destroy(&ctx);
}
