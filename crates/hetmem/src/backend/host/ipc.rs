//! IPC transport of the host backend: file descriptors over Unix sockets (`SCM_RIGHTS`) and the
//! per-process broker that hands them out.
//!
//! Nothing here knows the spec: the semantics layer ([`crate::ipc`]) decides what a request
//! means and what to answer; this module only moves bytes and fds, one small function per
//! syscall sequence.
//!
//! | function | syscalls |
//! |---|---|
//! | [`send_fds`] | `sendmsg(2)` with an `SCM_RIGHTS` control message |
//! | [`recv_fds`] | `recvmsg(2)` with `MSG_CMSG_CLOEXEC` |
//! | [`connect_broker`] | `socket(AF_UNIX, SOCK_SEQPACKET \| SOCK_CLOEXEC)`, `connect(2)` to an abstract name |
//! | [`start_broker`] | `socket`, `bind` (abstract name), `listen`, then a thread: `accept4`, `getsockopt(SO_PEERCRED)`, `recvmsg`, `sendmsg` |
//! | [`fd_identity`] | `fstat(2)` |
//! | [`dup_fd`] | `fcntl(F_DUPFD_CLOEXEC)` |
//!
//! # The broker
//! A process's broker is a `SOCK_SEQPACKET` Unix socket in the abstract namespace named
//! `hetmem-ipc-broker.<pid>` (no file to clean up; it vanishes with the process), served by one
//! thread started on the first export and living as long as the process. It accepts only peers
//! with the same effective uid (`SO_PEERCRED`); every other check is the handler's. The exporter
//! is never made ptraceable.
//!
//! Wire format (every message one datagram of the seqpacket socket):
//! - request: the 64-byte handle;
//! - reply header: `"HMBR"`, status `u32`, payload length `u64`, fd count `u64` (little endian);
//! - payload: messages of at most [`PAYLOAD_CHUNK`] bytes until the payload length is reached;
//! - fds: messages of one byte carrying at most [`MAX_FDS_PER_MSG`] fds each (`SCM_MAX_FD` is 253).

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustix::io::Errno;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

/// Most fds sent in one message (the kernel's `SCM_MAX_FD` is 253).
pub const MAX_FDS_PER_MSG: usize = 250;
/// Largest payload message in bytes (well under the default socket buffer).
pub const PAYLOAD_CHUNK: usize = 32 << 10;
const REPLY_MAGIC: &[u8; 4] = b"HMBR";
/// How long the broker waits on a slow peer before dropping it.
const PEER_TIMEOUT: Duration = Duration::from_secs(5);

/// Sends `payload` (at least one byte) with `fds` attached: `sendmsg(2)` + `SCM_RIGHTS`.
pub fn send_fds(sock: BorrowedFd<'_>, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), Errno> {
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len().max(1)))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(Errno::NOBUFS);
    }
    rustix::net::sendmsg(
        sock,
        &[IoSlice::new(payload)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// Receives one message into `buf` and up to `max_fds` fds: `recvmsg(2)` with
/// `MSG_CMSG_CLOEXEC`. Returns the bytes received (0 at end of stream) and the fds.
pub fn recv_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    max_fds: usize,
) -> Result<(usize, Vec<OwnedFd>), Errno> {
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(max_fds.max(1)))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(
        sock,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = m {
            fds.extend(it);
        }
    }
    Ok((msg.bytes, fds))
}

/// The abstract socket name of process `pid`'s broker.
pub fn broker_name(pid: u32) -> String {
    format!("hetmem-ipc-broker.{pid}")
}

fn seqpacket() -> Result<OwnedFd, Errno> {
    rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
}

/// Connects to process `pid`'s broker: `socket(AF_UNIX, SOCK_SEQPACKET)` + `connect(2)`.
/// `ECONNREFUSED` means no such broker (the process is gone or never exported).
pub fn connect_broker(pid: u32) -> Result<OwnedFd, Errno> {
    let s = seqpacket()?;
    let addr = SocketAddrUnix::new_abstract_name(broker_name(pid).as_bytes())?;
    rustix::net::connect(&s, &addr)?;
    rustix::net::sockopt::set_socket_timeout(
        &s,
        rustix::net::sockopt::Timeout::Recv,
        Some(PEER_TIMEOUT),
    )?;
    Ok(s)
}

/// What a broker answers to one request (the handler's side).
#[derive(Debug, Default)]
pub struct BrokerReply {
    /// 0 for success; anything else is the handler's error code.
    pub status: u32,
    /// Bytes for the requester (an error message when `status != 0`).
    pub payload: Vec<u8>,
    /// Fds to pass, shared with the handler's own records so that no duplicate is made (a
    /// `dup` that grows the fd table of a threaded process waits for an RCU grace period).
    pub fds: Option<Arc<[OwnedFd]>>,
}

/// What a broker answered (the requester's side): the fds are the requester's own.
#[derive(Debug, Default)]
pub struct BrokerAnswer {
    /// 0 for success; anything else is the handler's error code.
    pub status: u32,
    /// The handler's bytes.
    pub payload: Vec<u8>,
    /// The fds received.
    pub fds: Vec<OwnedFd>,
}

/// The handler a broker runs for each request: the 64 request bytes and the peer's pid.
pub type BrokerHandler = Arc<dyn Fn(&[u8; 64], u32) -> BrokerReply + Send + Sync>;

static BROKER: OnceLock<Result<(), Errno>> = OnceLock::new();

/// Starts this process's broker once (later calls return the first call's result): binds the
/// abstract name of [`broker_name`]`(getpid())`, listens, and serves requests with `handler` on
/// a thread named `hetmem-ipc-broker` for the rest of the process's life.
pub fn start_broker(handler: impl FnOnce() -> BrokerHandler) -> Result<(), Errno> {
    *BROKER.get_or_init(|| {
        let handler = handler();
        let s = seqpacket()?;
        let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
        let addr = SocketAddrUnix::new_abstract_name(broker_name(pid).as_bytes())?;
        rustix::net::bind(&s, &addr)?;
        rustix::net::listen(&s, 128)?;
        std::thread::Builder::new()
            .name("hetmem-ipc-broker".into())
            .spawn(move || serve(s, handler))
            .map_err(|_| Errno::AGAIN)?;
        Ok(())
    })
}

fn serve(listener: OwnedFd, handler: BrokerHandler) {
    let me = rustix::process::geteuid();
    loop {
        let conn = match rustix::net::accept_with(&listener, SocketFlags::CLOEXEC) {
            Ok(c) => c,
            Err(Errno::INTR) | Err(Errno::CONNABORTED) => continue,
            Err(e) => {
                tracing::warn!("hetmem IPC broker: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let _ = serve_one(conn.as_fd(), me, &handler);
    }
}

fn serve_one(
    conn: BorrowedFd<'_>,
    me: rustix::process::Uid,
    handler: &BrokerHandler,
) -> Result<(), Errno> {
    use rustix::net::sockopt::{set_socket_timeout, socket_peercred, Timeout};
    set_socket_timeout(conn, Timeout::Recv, Some(PEER_TIMEOUT))?;
    set_socket_timeout(conn, Timeout::Send, Some(PEER_TIMEOUT))?;
    let cred = socket_peercred(conn)?;
    let mut req = [0u8; 64];
    let (n, stray) = recv_fds(conn, &mut req, 1)?;
    drop(stray);
    let reply = if cred.uid != me {
        BrokerReply {
            status: u32::MAX,
            payload: format!(
                "peer uid {} is not the exporter's uid {}",
                cred.uid.as_raw(),
                me.as_raw()
            )
            .into_bytes(),
            fds: None,
        }
    } else if n != 64 {
        BrokerReply {
            status: u32::MAX - 1,
            payload: format!("request of {n} bytes, not a 64-byte handle").into_bytes(),
            fds: None,
        }
    } else {
        handler(&req, cred.pid.as_raw_nonzero().get() as u32)
    };
    send_reply(conn, &reply)
}

fn send_reply(conn: BorrowedFd<'_>, r: &BrokerReply) -> Result<(), Errno> {
    let mut head = Vec::with_capacity(24);
    head.extend_from_slice(REPLY_MAGIC);
    head.extend_from_slice(&r.status.to_le_bytes());
    head.extend_from_slice(&(r.payload.len() as u64).to_le_bytes());
    let fds: &[OwnedFd] = r.fds.as_deref().unwrap_or(&[]);
    head.extend_from_slice(&(fds.len() as u64).to_le_bytes());
    send_fds(conn, &head, &[])?;
    for chunk in r.payload.chunks(PAYLOAD_CHUNK) {
        send_fds(conn, chunk, &[])?;
    }
    for chunk in fds.chunks(MAX_FDS_PER_MSG) {
        let b: Vec<BorrowedFd<'_>> = chunk.iter().map(|f| f.as_fd()).collect();
        send_fds(conn, &[0], &b)?;
    }
    Ok(())
}

/// Asks process `pid`'s broker about `request` (a 64-byte handle) and collects the whole reply.
/// `max_payload` and `max_fds` bound what the requester accepts (a broker announcing more is
/// refused with `EMSGSIZE`).
pub fn broker_request(
    pid: u32,
    request: &[u8; 64],
    max_payload: usize,
    max_fds: usize,
) -> Result<BrokerAnswer, Errno> {
    let s = connect_broker(pid)?;
    send_fds(s.as_fd(), request, &[])?;
    let mut head = [0u8; 24];
    let (n, _) = recv_fds(s.as_fd(), &mut head, 1)?;
    if n != 24 || &head[..4] != REPLY_MAGIC {
        return Err(Errno::PROTO);
    }
    let status = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes"));
    let plen = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes")) as usize;
    let nfds = u64::from_le_bytes(head[16..24].try_into().expect("8 bytes")) as usize;
    if plen > max_payload || nfds > max_fds {
        return Err(Errno::MSGSIZE);
    }
    let mut payload = vec![0u8; plen];
    let mut at = 0;
    while at < plen {
        let want = (plen - at).min(PAYLOAD_CHUNK);
        let (n, _) = recv_fds(s.as_fd(), &mut payload[at..at + want], 1)?;
        if n == 0 {
            return Err(Errno::PROTO);
        }
        at += n;
    }
    let mut fds = Vec::with_capacity(nfds);
    while fds.len() < nfds {
        let mut b = [0u8; 1];
        let (n, got) = recv_fds(s.as_fd(), &mut b, MAX_FDS_PER_MSG)?;
        if n == 0 || got.is_empty() {
            return Err(Errno::PROTO);
        }
        fds.extend(got);
    }
    fds.truncate(nfds);
    Ok(BrokerAnswer {
        status,
        payload,
        fds,
    })
}

/// `(st_dev, st_ino, st_size)` of an fd: `fstat(2)`. `None` if the fd is not open.
pub fn fd_identity(fd: BorrowedFd<'_>) -> Option<(u64, u64, u64)> {
    let st = rustix::fs::fstat(fd).ok()?;
    Some((st.st_dev as u64, st.st_ino as u64, st.st_size as u64))
}

/// A close-on-exec duplicate of `fd`: `fcntl(F_DUPFD_CLOEXEC)`.
pub fn dup_fd(fd: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
    rustix::io::fcntl_dupfd_cloexec(fd, 0)
}

/// 16 random bytes from the kernel: `getrandom(2)`.
pub fn random_token() -> Result<[u8; 16], Errno> {
    let mut t = [0u8; 16];
    let mut got = 0;
    while got < 16 {
        got += rustix::rand::getrandom(&mut t[got..], rustix::rand::GetRandomFlags::empty())?;
    }
    Ok(t)
}
