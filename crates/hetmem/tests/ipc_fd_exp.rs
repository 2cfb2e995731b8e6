//! `zeMemGetIpcHandleFromFileDescriptorExp` ([`hetmem::Context::ipc_handle_from_fd`]): the
//! handle of an fd round-trips to the export's own handle, an fd-only handle opens the same
//! bytes, and bad fds are refused without changing anything.

mod common;

/// Why the fd transport's tests do not apply on cuda.
const NO_FD_TRANSPORT: &str =
    "on cuda every shareable fd is a descriptor of the same device file (/dev/nvidiactl), with \
     no identity to trace it back to its memory: ipc_handle_from_fd of an open shareable fd is \
     UNSUPPORTED_FEATURE there and handles open only through the exporter's broker";

use hetmem::{AllocDesc, BackendKind, Error, Runtime};

fn rt() -> Runtime {
    common::builder()
        .host_devices(1)
        .host_device_memory(64 << 20)
        .build()
        .unwrap()
}

#[test]
fn fd_of_an_export_gives_back_that_export_and_opens_the_same_memory() {
    if common::not_applicable_on(BackendKind::Cuda, NO_FD_TRANSPORT) || common::skip() {
        return;
    }
    let rt = rt();
    let dev = rt.driver().device(0).unwrap();
    let ctx = rt.driver().create_context().unwrap();
    let p = ctx.alloc_device(&dev, &AllocDesc::new(1 << 20)).unwrap();
    unsafe { (p as *mut u32).write(0xfeed_beef) };
    let h = ctx.get_ipc_handle(p).unwrap();
    let again = ctx.ipc_handle_from_fd(h.fd()).unwrap();
    assert_eq!(again, h, "an export's own fd maps back to its handle");
    let v = ctx.open_ipc_handle(&again, 0).unwrap();
    assert_eq!(unsafe { (v as *const u32).read() }, 0xfeed_beef);
    ctx.close_ipc_handle(v).unwrap();
    ctx.put_ipc_handle(&h).unwrap();
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
