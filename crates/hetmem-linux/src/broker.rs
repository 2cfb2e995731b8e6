//! IPC transport on Linux (every backend): file descriptors over Unix sockets (`SCM_RIGHTS`) and the
//! per-process broker that hands them out.
//!
//! Nothing here knows the spec: hetmem's semantics layer decides what a request
//! means and what to answer; this module only moves bytes and fds, one small function per
//! syscall sequence.
//!
//! | function | syscalls |
//! |---|---|
//! | [`send_fds`] | `sendmsg(2)` with an `SCM_RIGHTS` control message |
//! | [`recv_fds`] | `recvmsg(2)` with `MSG_CMSG_CLOEXEC` |
//! | [`connect_broker`] | `socket(AF_UNIX, SOCK_SEQPACKET \| SOCK_CLOEXEC)`, `connect(2)` to an abstract name, `getsockopt(SO_PEERCRED)` |
//! | [`start_broker`] | `getrandom`, `socket`, `bind` (abstract name), `listen`, then a thread: `accept4`, `getsockopt(SO_PEERCRED)`; per accepted peer of our uid a thread: `recvmsg`, `sendmsg` |
//! | [`fd_identity`] | `fstat(2)` |
//! | [`fd_seals`] | `fcntl(F_GET_SEALS)` |
//! | [`dup_fd`] | `fcntl(F_DUPFD_CLOEXEC)` |
//! | [`sealed_memfd_holding`] | `memfd_create(2)` (`MFD_CLOEXEC \| MFD_ALLOW_SEALING`), `write(2)`, `fcntl(F_ADD_SEALS)` |
//! | [`read_sealed_memfd`] | `fcntl(F_GET_SEALS)`, `fstat(2)`, `pread(2)` |
//!
//! # The broker
//! A process's broker is a `SOCK_SEQPACKET` Unix socket in the abstract namespace named
//! `hetmem-ipc-broker.<pid>.<nonce>` ([`broker_name`]; `<nonce>` is 8 hex digits drawn from
//! `getrandom(2)` when the broker starts, and published in every handle, so nobody can bind the
//! name in advance; a name already taken is retried with a fresh nonce). No file to clean up; it
//! vanishes with the process. An accept thread, started on the first export and living as long
//! as the process, checks each peer's `SO_PEERCRED` right after `accept4`: a peer of another
//! effective uid is dropped at once; a peer of ours is handed to a worker thread of its own
//! (an idle worker, or a new one: at most [`MAX_BROKER_PEERS`] workers, so further peers are
//! answered [`ST_BUSY`] once their request is read, and dropped, while all are busy; each
//! worker waits at most [`REQUEST_TIMEOUT`] for its peer's request, and exits after
//! [`WORKER_IDLE`] with nothing to do), so idle connections never stall other importers.
//! Every other check is the handler's. A broker that fails to start is not remembered: the
//! next export tries again. The exporter is never made ptraceable.
//!
//! A live broker answers every peer of our uid that sends a request in time, so a broker that
//! hangs up before its whole answer is sent is a broker whose process died: [`broker_request`]
//! reports every such failure after the connection is made as [`BrokerError::PeerGone`].
//!
//! The requester ([`connect_broker`]) checks the listener's `SO_PEERCRED` before sending
//! anything: its pid must be the exporter's pid recorded in the handle and its uid our
//! effective uid (else `EPERM`), so a process squatting a vanished exporter's name never sees
//! a handle's token.
//!
//! Wire format (every message one datagram of the seqpacket socket):
//! - request: the 64-byte handle;
//! - reply header: `"HMBR"`, status `u32`, payload length `u64`, fd count `u64` (little endian);
//! - payload: messages of at most [`PAYLOAD_CHUNK`] bytes until the payload length is reached;
//! - fds: messages of one byte carrying at most [`MAX_FDS_PER_MSG`] fds each (`SCM_MAX_FD` is 253).

use std::collections::VecDeque;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::OsError;

/// What a broker answers to one request (the handler's side).
#[derive(Debug, Default)]
pub struct BrokerReply {
    /// 0 for success; anything else is the handler's own code.
    pub status: u32,
    /// Bytes for the requester (an error message when `status != 0`).
    pub payload: Vec<u8>,
    /// Shareable handles to pass, shared with the handler's own records so that none is
    /// duplicated for the send.
    pub fds: Option<std::sync::Arc<[OwnedFd]>>,
}

/// What a broker answered (the requester's side); the handles are the requester's own.
#[derive(Debug, Default)]
pub struct BrokerAnswer {
    /// 0 for success; anything else is the handler's code.
    pub status: u32,
    /// The handler's bytes.
    pub payload: Vec<u8>,
    /// The handles received.
    pub fds: Vec<OwnedFd>,
}

/// The handler a broker runs for each request: the 64 request bytes and the requester's pid.
pub type BrokerHandler = std::sync::Arc<dyn Fn(&[u8; 64], u32) -> BrokerReply + Send + Sync>;

/// Why a broker request failed, as far as the transport can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrokerError {
    /// The exporting process is gone: no broker serves its name, or the connection ended
    /// before the whole answer came (it died while answering).
    PeerGone,
    /// The broker's name is served by a process other than the exporter (another pid, or
    /// another user): nothing was sent to it. Carries the name.
    Impostor(String),
    /// The answer broke the wire format or exceeded the bounds the requester set.
    Protocol(String),
    /// A local failure (out of file descriptors, a socket call refused).
    Local(OsError),
}

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
/// How long a requester waits on a slow broker, and the broker on a slow reader.
const PEER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the broker waits for a connected peer's request before dropping it.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// Most peers the broker serves at once; further connections are answered [`ST_BUSY`] and
/// dropped until one finishes.
pub const MAX_BROKER_PEERS: usize = 64;
/// The status a broker answers when every worker is busy (its message says so).
pub const ST_BUSY: u32 = u32::MAX - 2;

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

/// The abstract socket name of process `pid`'s broker started with `nonce`.
pub fn broker_name(pid: u32, nonce: u32) -> String {
    format!("hetmem-ipc-broker.{pid}.{nonce:08x}")
}

fn seqpacket() -> Result<OwnedFd, Errno> {
    rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
}

/// Connects to process `pid`'s broker (started with `nonce`): `socket(AF_UNIX,
/// SOCK_SEQPACKET)` + `connect(2)`, then `getsockopt(SO_PEERCRED)`: the listener must be
/// process `pid` running as our effective uid, else `EPERM` (nothing was sent).
/// `ECONNREFUSED` means no such broker (the process is gone or never exported).
pub fn connect_broker(pid: u32, nonce: u32) -> Result<OwnedFd, Errno> {
    let s = seqpacket()?;
    let addr = SocketAddrUnix::new_abstract_name(broker_name(pid, nonce).as_bytes())?;
    rustix::net::connect(&s, &addr)?;
    let cred = rustix::net::sockopt::socket_peercred(&s)?;
    if cred.pid.as_raw_nonzero().get() as u32 != pid || cred.uid != rustix::process::geteuid() {
        return Err(Errno::PERM);
    }
    rustix::net::sockopt::set_socket_timeout(
        &s,
        rustix::net::sockopt::Timeout::Recv,
        Some(PEER_TIMEOUT),
    )?;
    Ok(s)
}

/// `(pid, nonce)` of the broker running in this process (the pid tells a forked child that
/// the broker is its parent's). Only a started broker is recorded: a failure is retried.
static BROKER: Mutex<Option<(u32, u32)>> = Mutex::new(None);
/// Names tried before giving up when each is already taken.
const BIND_ATTEMPTS: usize = 8;

/// Starts this process's broker unless it runs already, and returns its nonce: binds the
/// abstract name [`broker_name`]`(getpid(), nonce)` with a random non-zero nonce (another
/// nonce if the name is taken, `BIND_ATTEMPTS` times), listens, and serves requests with
/// `handler` on a thread named `hetmem-ipc-broker` for the rest of the process's life.
/// A failure is returned (with the last errno) and not remembered; the next call tries again.
pub fn start_broker(handler: &dyn Fn() -> BrokerHandler) -> Result<u32, Errno> {
    let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
    let mut b = BROKER.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((p, nonce)) = *b {
        if p == pid {
            return Ok(nonce);
        }
    }
    let s = seqpacket()?;
    let mut last = Errno::ADDRINUSE;
    let mut bound = None;
    for _ in 0..BIND_ATTEMPTS {
        let r = random_token()?;
        let nonce = u32::from_le_bytes(r[..4].try_into().expect("4 bytes")).max(1);
        let addr = SocketAddrUnix::new_abstract_name(broker_name(pid, nonce).as_bytes())?;
        match rustix::net::bind(&s, &addr) {
            Ok(()) => {
                bound = Some(nonce);
                break;
            }
            Err(e) => last = e,
        }
    }
    let Some(nonce) = bound else { return Err(last) };
    rustix::net::listen(&s, 128)?;
    let handler = handler();
    std::thread::Builder::new()
        .name("hetmem-ipc-broker".into())
        .spawn(move || serve(s, handler))
        .map_err(|_| Errno::AGAIN)?;
    *b = Some((pid, nonce));
    Ok(nonce)
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
        // Strangers are dropped at once, before anything is read.
        let cred = match rustix::net::sockopt::socket_peercred(&conn) {
            Ok(c) if c.uid == me => c,
            _ => {
                drop(conn);
                CONNECTIONS_DISPATCHED.fetch_add(1, Ordering::AcqRel);
                continue;
            }
        };
        // Bounded: a flood of peers of our uid cannot exhaust threads or fds.
        let peer = cred.pid.as_raw_nonzero().get() as u32;
        dispatch(conn, peer, &handler);
        CONNECTIONS_DISPATCHED.fetch_add(1, Ordering::AcqRel);
    }
}

/// The broker's worker pool: peers waiting for a worker, and the workers' counts.
struct Pool {
    queue: VecDeque<(OwnedFd, u32)>,
    /// Workers alive (at most [`MAX_BROKER_PEERS`]).
    workers: usize,
    /// Workers waiting for a peer.
    idle: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    queue: VecDeque::new(),
    workers: 0,
    idle: 0,
});
static POOL_CV: Condvar = Condvar::new();
/// How long a worker with nothing to do stays before it exits.
pub const WORKER_IDLE: Duration = Duration::from_secs(2);

fn pool() -> std::sync::MutexGuard<'static, Pool> {
    POOL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Hands an accepted peer to an idle worker, or to a new one (at most [`MAX_BROKER_PEERS`]);
/// answers [`ST_BUSY`] and drops it when every worker is busy (so that a hang-up always means
/// that the broker's process is gone).
///
/// A peer handed on counts in [`broker_peers_active`] from here (under the pool's lock) until
/// its worker is done with it, so that a count of 0 after [`broker_connections_dispatched`]
/// has passed every connection made means that all of them are finished.
fn dispatch(conn: OwnedFd, peer: u32, handler: &BrokerHandler) {
    let mut q = pool();
    if q.idle > q.queue.len() {
        q.queue.push_back((conn, peer));
        PEERS_ACTIVE.fetch_add(1, Ordering::AcqRel);
        POOL_CV.notify_one();
        return;
    }
    if q.workers >= MAX_BROKER_PEERS {
        drop(q);
        refuse_busy(conn.as_fd());
        return;
    }
    q.workers += 1;
    q.queue.push_back((conn, peer));
    PEERS_ACTIVE.fetch_add(1, Ordering::AcqRel);
    let h = handler.clone();
    let spawned = std::thread::Builder::new()
        .name("hetmem-ipc-peer".into())
        .spawn(move || worker(h));
    if spawned.is_err() {
        q.workers -= 1;
        q.queue.pop_back();
        PEERS_ACTIVE.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long the accept thread waits for the request of a peer it refuses as busy.
const BUSY_REQUEST_WAIT: Duration = Duration::from_millis(50);

/// Reads the request (waiting at most [`BUSY_REQUEST_WAIT`]: a requester sends it right
/// after connecting) and answers [`ST_BUSY`]. The request is read first because a Unix socket
/// closed with unread data resets its peer, whose answer would then be lost.
fn refuse_busy(conn: BorrowedFd<'_>) {
    use rustix::net::sockopt::{set_socket_timeout, Timeout};
    let wait = Some(BUSY_REQUEST_WAIT);
    if set_socket_timeout(conn, Timeout::Send, wait).is_ok()
        && set_socket_timeout(conn, Timeout::Recv, wait).is_ok()
        && recv_fds(conn, &mut [0u8; 64], 1).is_ok()
    {
        let reply = BrokerReply {
            status: ST_BUSY,
            payload: format!(
                "its IPC broker is serving {MAX_BROKER_PEERS} peers already; try again"
            )
            .into_bytes(),
            fds: None,
        };
        let _ = send_reply(conn, &reply);
    }
}

fn worker(handler: BrokerHandler) {
    loop {
        let mut q = pool();
        q.idle += 1;
        let deadline = std::time::Instant::now() + WORKER_IDLE;
        let (conn, peer) = loop {
            if let Some(x) = q.queue.pop_front() {
                q.idle -= 1;
                break x;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                q.idle -= 1;
                q.workers -= 1;
                return;
            }
            q = POOL_CV
                .wait_timeout(q, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        };
        drop(q);
        let _ = serve_one(conn.as_fd(), peer, &handler);
        drop(conn);
        PEERS_ACTIVE.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Number of broker peers handed to a worker and not yet finished: waiting for their worker or
/// being served (for leak checks).
pub fn broker_peers_active() -> usize {
    PEERS_ACTIVE.load(Ordering::Acquire)
}
static PEERS_ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// Number of connections the broker has accepted and dealt with since the process started:
/// handed to a worker (and counted in [`broker_peers_active`] from then), refused busy, or
/// dropped as a stranger's. A caller that made `n` connections knows that the broker has seen
/// them all once this has grown by `n` (with no other peers about).
pub fn broker_connections_dispatched() -> u64 {
    CONNECTIONS_DISPATCHED.load(Ordering::Acquire)
}
static CONNECTIONS_DISPATCHED: AtomicU64 = AtomicU64::new(0);

/// Number of broker worker threads alive now (idle ones exit after [`WORKER_IDLE`]).
pub fn broker_workers() -> usize {
    pool().workers
}

fn serve_one(conn: BorrowedFd<'_>, peer: u32, handler: &BrokerHandler) -> Result<(), Errno> {
    use rustix::net::sockopt::{set_socket_timeout, Timeout};
    set_socket_timeout(conn, Timeout::Recv, Some(REQUEST_TIMEOUT))?;
    set_socket_timeout(conn, Timeout::Send, Some(PEER_TIMEOUT))?;
    let mut req = [0u8; 64];
    let (n, stray) = recv_fds(conn, &mut req, 1)?;
    drop(stray);
    let reply = if n != 64 {
        BrokerReply {
            status: u32::MAX - 1,
            payload: format!("request of {n} bytes, not a 64-byte handle").into_bytes(),
            fds: None,
        }
    } else {
        handler(&req, peer)
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

/// Asks process `pid`'s broker (started with `nonce`) about `request` (a 64-byte handle) and
/// collects the whole reply. The request is sent only to a broker that [`connect_broker`]
/// verified. `max_payload` and `max_fds` bound what the requester accepts.
///
/// Failures are classified for the semantics layer: no broker under the name
/// (`ECONNREFUSED`, `ENOENT`), or a connection that ends or breaks before the whole answer came
/// (end of stream, `ECONNRESET`, `EPIPE`: the exporter died while answering) is
/// [`BrokerError::PeerGone`]; a listener that is not the exporter (`SO_PEERCRED`) is
/// [`BrokerError::Impostor`]; a malformed or oversized answer is
/// [`BrokerError::Protocol`]; anything else is local ([`BrokerError::Local`]).
pub fn broker_request(
    pid: u32,
    nonce: u32,
    request: &[u8; 64],
    max_payload: usize,
    max_fds: usize,
) -> Result<BrokerAnswer, BrokerError> {
    let s = connect_broker(pid, nonce).map_err(|e| match e {
        Errno::CONNREFUSED | Errno::NOENT => BrokerError::PeerGone,
        Errno::PERM => BrokerError::Impostor(broker_name(pid, nonce)),
        e => local("connecting to the IPC broker", e),
    })?;
    // After connect, an error of the conversation means the peer went away.
    let broken = |e: Errno| match e {
        Errno::CONNRESET | Errno::PIPE | Errno::CONNABORTED | Errno::NOTCONN => {
            BrokerError::PeerGone
        }
        Errno::AGAIN => {
            BrokerError::Protocol(format!("no answer within {} s", PEER_TIMEOUT.as_secs()))
        }
        e => local("talking to the IPC broker", e),
    };
    send_fds(s.as_fd(), request, &[]).map_err(broken)?;
    let mut head = [0u8; 24];
    let (n, _) = recv_fds(s.as_fd(), &mut head, 1).map_err(broken)?;
    if n == 0 {
        return Err(BrokerError::PeerGone);
    }
    if n != 24 || &head[..4] != REPLY_MAGIC {
        return Err(BrokerError::Protocol(format!(
            "a reply header of {n} bytes without the magic"
        )));
    }
    let status = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes"));
    let plen = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes")) as usize;
    let nfds = u64::from_le_bytes(head[16..24].try_into().expect("8 bytes")) as usize;
    if plen > max_payload || nfds > max_fds {
        return Err(BrokerError::Protocol(format!(
            "the broker announces {plen} bytes and {nfds} fds, at most {max_payload} and \
             {max_fds} are accepted"
        )));
    }
    let mut payload = vec![0u8; plen];
    let mut at = 0;
    while at < plen {
        let want = (plen - at).min(PAYLOAD_CHUNK);
        let (n, _) = recv_fds(s.as_fd(), &mut payload[at..at + want], 1).map_err(broken)?;
        if n == 0 {
            return Err(BrokerError::PeerGone);
        }
        at += n;
    }
    let mut fds = Vec::with_capacity(nfds);
    while fds.len() < nfds {
        let mut b = [0u8; 1];
        let (n, got) = recv_fds(s.as_fd(), &mut b, MAX_FDS_PER_MSG).map_err(broken)?;
        if n == 0 {
            return Err(BrokerError::PeerGone);
        }
        if got.is_empty() {
            return Err(BrokerError::Protocol("an fd message without fds".into()));
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

fn local(what: &str, e: Errno) -> BrokerError {
    BrokerError::Local(crate::os_error(what, e))
}

/// `(st_dev, st_ino, st_size)` of an fd: `fstat(2)`. `None` if the fd is not open.
pub fn fd_identity(fd: BorrowedFd<'_>) -> Option<(u64, u64, u64)> {
    let st = rustix::fs::fstat(fd).ok()?;
    Some((st.st_dev as u64, st.st_ino as u64, st.st_size as u64))
}

/// The major device number of `fd` if it is a character device, else `None`: `fstat(2)`
/// (`S_ISCHR(st_mode)`, `major(st_rdev)`). Errors: those of `fstat` (`EBADF` for an fd that is
/// not open).
pub fn char_device_major(fd: BorrowedFd<'_>) -> Result<Option<u32>, Errno> {
    let st = rustix::fs::fstat(fd)?;
    let chr =
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::CharacterDevice;
    Ok(chr.then(|| rustix::fs::major(st.st_rdev)))
}

/// The seals of an fd: `fcntl(F_GET_SEALS)`. `EINVAL` for an fd that is not a memfd (or
/// another file that supports sealing).
pub fn fd_seals(fd: BorrowedFd<'_>) -> Result<rustix::fs::SealFlags, Errno> {
    rustix::fs::fcntl_get_seals(fd)
}

/// A close-on-exec duplicate of `fd`: `fcntl(F_DUPFD_CLOEXEC)`.
pub fn dup_fd(fd: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
    rustix::io::fcntl_dupfd_cloexec(fd, 0)
}

/// A memfd named `name` holding exactly `bytes`, sealed against every change
/// (`F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL`), so whoever receives it reads
/// the same bytes forever: `memfd_create(2)` with `MFD_CLOEXEC | MFD_ALLOW_SEALING`,
/// `write(2)` (repeated until all is written), `fcntl(2)` `F_ADD_SEALS`. Errors: those of the
/// three calls (`EMFILE`, `ENOMEM`, ...).
pub fn sealed_memfd_holding(name: &str, bytes: &[u8]) -> Result<OwnedFd, Errno> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    let mut done = 0;
    while done < bytes.len() {
        match rustix::io::write(&fd, &bytes[done..]) {
            Ok(0) => return Err(Errno::IO),
            Ok(n) => done += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    rustix::fs::fcntl_add_seals(
        &fd,
        SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
    )?;
    Ok(fd)
}

/// The bytes of a memfd that [`sealed_memfd_holding`] made (or any memfd sealed the same way):
/// `fcntl(2)` `F_GET_SEALS` (it must have `F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK`, so the
/// bytes cannot change), `fstat(2)` (its size, at most `max`), `pread(2)` from offset 0.
/// `Err` says what is wrong: not a memfd, not sealed, too large, or the call that failed.
pub fn read_sealed_memfd(fd: BorrowedFd<'_>, max: usize) -> Result<Vec<u8>, String> {
    use rustix::fs::SealFlags;
    let seals = rustix::fs::fcntl_get_seals(fd)
        .map_err(|e| format!("not a sealable memfd (F_GET_SEALS: {e})"))?;
    let need = SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK;
    if !seals.contains(need) {
        return Err(format!(
            "a memfd not sealed against write, grow and shrink (seals {:#x})",
            seals.bits()
        ));
    }
    let size = rustix::fs::fstat(fd)
        .map_err(|e| format!("fstat: {e}"))?
        .st_size as u64;
    if size > max as u64 {
        return Err(format!("a memfd of {size} bytes, more than {max}"));
    }
    let mut b = vec![0u8; size as usize];
    let mut done = 0;
    while done < b.len() {
        match rustix::io::pread(fd, &mut b[done..], done as u64) {
            Ok(0) => return Err(format!("pread: end of file at {done} of {size} bytes")),
            Ok(n) => done += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(format!("pread: {e}")),
        }
    }
    Ok(b)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// A sealed memfd reads back its bytes; one that can still be written, or is larger than
    /// asked, or a pipe, is refused saying why.
    #[test]
    fn sealed_memfd_reads_back_and_unsealed_or_large_ones_are_refused() {
        let fd = sealed_memfd_holding("t", b"hello").unwrap();
        assert_eq!(read_sealed_memfd(fd.as_fd(), 64).unwrap(), b"hello");
        assert!(read_sealed_memfd(fd.as_fd(), 4)
            .unwrap_err()
            .contains("more than 4"));
        assert!(
            rustix::io::write(&fd, b"x").is_err(),
            "sealed against write"
        );
        let open = rustix::fs::memfd_create("u", rustix::fs::MemfdFlags::ALLOW_SEALING).unwrap();
        assert!(read_sealed_memfd(open.as_fd(), 64)
            .unwrap_err()
            .contains("not sealed"));
        let (r, _w) = rustix::pipe::pipe().unwrap();
        assert!(read_sealed_memfd(r.as_fd(), 64)
            .unwrap_err()
            .contains("F_GET_SEALS"));
    }

    /// `/dev/null` is character device 1:3; a pipe is no device; a closed fd is `EBADF`.
    #[test]
    fn char_device_major_tells_devices_from_other_files() {
        let null = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(char_device_major(null.as_fd()), Ok(Some(1)));
        let (r, _w) = rustix::pipe::pipe().unwrap();
        assert_eq!(char_device_major(r.as_fd()), Ok(None));
        // SAFETY: only inspected; a number far above any open fd.
        let closed = unsafe { BorrowedFd::borrow_raw(1 << 20) };
        assert_eq!(char_device_major(closed), Err(Errno::BADF));
    }
}
