//! `zeMemGetIpcHandleFromFileDescriptorExp` ([`hetmem::Context::ipc_handle_from_fd`]): the
//! handle of an fd round-trips to the export's own handle, an fd-only handle opens the same
//! bytes, bad fds are refused without changing anything, and (case 5 of
//! shared/cases/level-zero.md) in another process that received the fd alone over
//! `SCM_RIGHTS`, the handle rebuilt from it opens the exporter's bytes and its put succeeds.

mod common;

use std::os::fd::AsRawFd;

use common::*;

/// Why the host's fd transport (an fd-only handle of the memfd itself) does not apply on cuda.
const NO_FD_TRANSPORT: &str =
    "on cuda every shareable fd is a descriptor of the same device file (/dev/nvidiactl), with \
     no identity to trace it back to its memory: the fd of a handle is the export's description \
     there, and handles open only through the exporter's broker";

use hetmem::{AllocDesc, BackendKind, Error, Runtime};

fn rt() -> Runtime {
    common::builder()
        .host_devices(1)
        .host_device_memory(64 << 20)
        .build()
        .unwrap()
}

/// The children of this binary: `export` (a device allocation) and `export_mapped` (physical
/// memory mapped in a reservation, got through its VA) hold the pattern of [`EXPORTED_SEED`],
/// write the handle to `FILE`, send only the fd `zeMemGetFileDescriptorFromIpcHandleExp`
/// gives (bytes 0..4) over the socket `SOCK`, say `@ready`, wait for a line, then check the
/// word the importer wrote at offset 64 (`@wrote <hex>`), put and free.
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
    let e = match case.as_str() {
        "export" => make_alloc(&ctx),
        "export_mapped" => make_physical(&ctx),
        other => panic!("unknown child case {other}"),
    };
    dev_fill(&ctx, e.ptr, e.size, EXPORTED_SEED);
    let h = ctx.get_ipc_handle(e.ptr).unwrap();
    std::fs::write(env("FILE"), h.as_bytes()).unwrap();
    {
        use std::os::fd::AsFd;
        let s = std::os::unix::net::UnixStream::connect(env("SOCK")).unwrap();
        // SAFETY: the handle's fd is open in this process until put.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(h.fd()) };
        send_fds(s.as_fd(), b"x", &[fd]).unwrap();
    }
    println!("@ready");
    let _ = read_stdin_line();
    println!("@wrote {:x}", dev_read(&ctx, e.ptr + 64));
    ctx.put_ipc_handle(&h).unwrap();
    e.destroy(&ctx);
}

/// Case 5 of shared/cases/level-zero.md: an IPC handle from a file descriptor, in another
/// process. The exporter (a child) gets the handle of device USM, and of physical memory
/// mapped in a reservation, and sends the fd of `zeMemGetFileDescriptorFromIpcHandleExp` alone
/// (no 64 bytes); here `ipc_handle_from_fd` -> a handle that opens to the exporter's bytes
/// (written back, seen by the exporter), closes, and puts `Ok` (it holds nothing here: the
/// reference driver's answer; a second put too), on both backends (cuda: the fd is the
/// export's description).
#[test]
fn case_5_handle_from_an_fd_received_by_another_process_opens_and_puts() {
    if common::skip() {
        return;
    }
    let rt = rt();
    let ctx = rt.driver().create_context().unwrap();
    for case in ["export", "export_mapped"] {
        let (mut c, fd, file) = spawn_exporter_sending_fd(case);
        let h = ctx.ipc_handle_from_fd(fd.as_raw_fd()).unwrap();
        assert_eq!(h.fd(), fd.as_raw_fd(), "{case}: the fd in bytes 0..4");
        let sent = read_handle(&file.display().to_string());
        assert_eq!(h.size(), sent.size(), "{case}: the exporter's view size");
        let v = ctx.open_ipc_handle(&h, 0).unwrap();
        // What the exporter filled (make_alloc: 1 MiB; make_physical: 2 MiB); the view may be
        // larger (cuda rounds device USM up to its 2 MiB granule).
        let filled = if case == "export" { 1 << 20 } else { 2 << 20 };
        assert!(sent.size().unwrap() >= filled, "{case}: {:?}", sent.size());
        assert_eq!(
            dev_check(&ctx, v, filled, EXPORTED_SEED),
            None,
            "{case}: the exporter's bytes"
        );
        dev_write(&ctx, v + 64, 0x5eed_0005);
        ctx.close_ipc_handle(v).unwrap();
        let stats = rt.driver().ipc_stats();
        ctx.put_ipc_handle(&h).unwrap();
        ctx.put_ipc_handle(&h).unwrap();
        assert_eq!(
            rt.driver().ipc_stats(),
            stats,
            "{case}: the put changed nothing"
        );
        c.say("go");
        assert_eq!(
            c.line(),
            "wrote 5eed0005",
            "{case}: the exporter sees the write"
        );
        c.finish();
        let _ = std::fs::remove_file(&file);
    }
    // Bytes that are not a handle are still refused by put.
    let junk = hetmem::IpcHandle::from_bytes([0x11; 64]);
    assert_eq!(
        ctx.put_ipc_handle(&junk).unwrap_err().ze_result(),
        0x7800_0004
    );
}

#[test]
fn fd_of_an_export_gives_back_that_export_and_opens_the_same_memory() {
    if common::skip() {
        return;
    }
    let rt = rt();
    let dev = rt.driver().device(0).unwrap();
    let ctx = rt.driver().create_context().unwrap();
    let p = ctx.alloc_device(&dev, &AllocDesc::new(1 << 20)).unwrap();
    dev_write(&ctx, p, 0xfeed_beef);
    let h = ctx.get_ipc_handle(p).unwrap();
    let again = ctx.ipc_handle_from_fd(h.fd()).unwrap();
    assert_eq!(again, h, "an export's own fd maps back to its handle");
    let v = ctx.open_ipc_handle(&again, 0).unwrap();
    assert_eq!(dev_read(&ctx, v), 0xfeed_beef);
    ctx.close_ipc_handle(v).unwrap();
    // The exporter's own handle: its put counts the one get down, a second is refused.
    ctx.put_ipc_handle(&again).unwrap();
    assert_eq!(ctx.put_ipc_handle(&h).unwrap_err().ze_result(), 0x7800_0004);
    ctx.free_memory(p).unwrap();
}

#[test]
fn fd_only_handle_opens_through_the_fd_transport() {
    if common::not_applicable_on(BackendKind::Cuda, NO_FD_TRANSPORT) || common::skip() {
        return;
    }
    let rt = rt();
    let dev = rt.driver().device(0).unwrap();
    let ctx = rt.driver().create_context().unwrap();
    let other = rt.driver().create_context().unwrap();
    let p = ctx.alloc_device(&dev, &AllocDesc::new(1 << 20)).unwrap();
    unsafe { (p as *mut u32).write(77) };
    let h = ctx.get_ipc_handle(p).unwrap();
    // Another context has no export of this fd: it gets an fd-only handle.
    let dup = unsafe { libc::dup(h.fd()) };
    let fdonly = other.ipc_handle_from_fd(dup).unwrap();
    assert_eq!(fdonly.fd(), dup);
    assert_eq!(fdonly.exporter_pid(), Some(0));
    assert_eq!(fdonly.size(), h.size());
    let v = other.open_ipc_handle(&fdonly, 0).unwrap();
    assert_eq!(unsafe { (v as *const u32).read() }, 77);
    other.close_ipc_handle(v).unwrap();
    // It holds nothing: its put is Ok and leaves the export alone.
    let stats = rt.driver().ipc_stats();
    other.put_ipc_handle(&fdonly).unwrap();
    assert_eq!(rt.driver().ipc_stats(), stats);
    unsafe { libc::close(dup) };
    ctx.put_ipc_handle(&h).unwrap();
    ctx.free_memory(p).unwrap();
}

#[test]
fn bad_fds_are_invalid_argument() {
    if common::skip() {
        return;
    }
    let rt = rt();
    let ctx = rt.driver().create_context().unwrap();
    assert!(matches!(
        ctx.ipc_handle_from_fd(-1),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        ctx.ipc_handle_from_fd(1 << 29),
        Err(Error::InvalidArgument(_))
    ));
    // An open fd that is not a sealed memfd (stdin-like pipe).
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    assert!(matches!(
        ctx.ipc_handle_from_fd(fds[0]),
        Err(Error::InvalidArgument(_))
    ));
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
}
