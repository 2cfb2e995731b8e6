//! The broker: what this process's broker answers to an importer's request ([`serve_request`]:
//! a decodable handle of a live export of ours with the right token gets the export's fds, its
//! parts' sizes and its piece list; anything else a refusal naming why), starting it once per
//! process ([`start_broker`], before any handle names its nonce), and asking another process's
//! broker ([`ask`], whose transport failures become `InvalidArgument` messages saying which:
//! a vanished exporter, an impostor holding its name, an answer out of protocol). The socket,
//! its peer checks (`SO_PEERCRED`) and the `SCM_RIGHTS` transfer are the backend's
//! ([`crate::backend::ipc`], `hetmem_linux::broker`).

use std::sync::Arc;

use crate::backend::ipc::{BrokerAnswer, BrokerHandler, BrokerReply, BrokerStats, TransportError};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::semantics::driver::DriverShared;
use crate::semantics::ipc::format::{decode, serialize, IpcHandle, ST_OK, ST_TOKEN, ST_UNKNOWN};
use crate::semantics::ipc::registry::{own_pid, token_eq, EXPORTS};

/// The broker's handler: checks the export id and token, answers with dups of the fds.
pub(crate) fn serve_request(req: &[u8; 64], _peer_pid: u32) -> BrokerReply {
    let refuse = |status: u32, msg: String| BrokerReply {
        status,
        payload: msg.into_bytes(),
        fds: None,
    };
    let h = match decode(&IpcHandle { data: *req }) {
        Ok(h) => h,
        Err(e) => return refuse(ST_UNKNOWN, e.message().to_string()),
    };
    let (fds, size, sizes, pieces) = {
        let ex = EXPORTS.lock();
        let Some(rec) = ex.get(&h.id).filter(|_| h.pid == own_pid()) else {
            return refuse(
                ST_UNKNOWN,
                format!(
                "export {} of process {} does not exist (it was put, its context was destroyed, \
                 or it never existed)",
                h.id, h.pid
            ),
            );
        };
        if !token_eq(&rec.token, &h.token) {
            return refuse(ST_TOKEN, format!("wrong token for export {}", h.id));
        }
        (
            rec.fds.clone(),
            rec.size,
            rec.sizes.clone(),
            rec.pieces.clone(),
        )
    };
    // Sent after the lock is dropped; a concurrent put leaves these fds open until sent.
    BrokerReply {
        status: ST_OK,
        payload: serialize(size, &sizes, &pieces),
        fds: Some(fds),
    }
}

/// Starts (or finds) this process's broker; returns its nonce. A failure is not remembered.
pub(crate) fn start_broker(backend: &dyn Backend) -> Result<u32> {
    let handler = || -> BrokerHandler { Arc::new(serve_request) };
    backend.start_broker(&handler).map_err(|e| {
        Error::Unknown(format!(
            "could not start the IPC broker of process {} ({e}); the next export tries again",
            own_pid()
        ))
    })
}

/// Asks process `pid`'s broker (started with `nonce`) to open `request` (a handle's 64 bytes),
/// accepting at most `max_payload` bytes and `max_fds` fds; the answer's status is not looked
/// at here.
///
/// Errors: `InvalidArgument` for a vanished exporter, a name served by another process, an
/// answer out of protocol (each message says which); a local failure as the backend's error.
pub(crate) fn ask(
    backend: &dyn Backend,
    pid: u32,
    nonce: u32,
    request: &[u8; 64],
    max_payload: usize,
    max_fds: usize,
) -> Result<BrokerAnswer> {
    backend
        .broker_request(pid, nonce, request, max_payload, max_fds)
        .map_err(|e| match e {
            TransportError::PeerGone => Error::InvalidArgument(format!(
                "the exporting process {pid} is gone (no IPC broker answers, or it died while \
                 answering): the handle cannot be opened any more"
            )),
            TransportError::Impostor(name) => Error::InvalidArgument(format!(
                "the socket named {name:?} is not served by the exporting process {pid} running \
                 as our uid (SO_PEERCRED): the exporter is gone and another process holds its \
                 name; nothing was sent to it"
            )),
            TransportError::Protocol(m) => Error::InvalidArgument(format!(
                "the IPC broker of process {pid} answered out of protocol: {m}"
            )),
            TransportError::Local(e) => e.into(),
        })
}

/// `Driver::ipc_broker_stats`: the state of this process's broker.
pub(crate) fn stats(d: &DriverShared) -> BrokerStats {
    d.backend.broker_stats()
}

/// `Driver::ipc_broker_request`: the bare transport, no handle rule applied (the baseline that
/// benchmarks measure opens against, and a probe for tests of the broker).
pub(crate) fn raw_request(
    d: &DriverShared,
    pid: u32,
    nonce: u32,
    request: &[u8; 64],
    max_payload: usize,
    max_fds: usize,
) -> std::result::Result<BrokerAnswer, TransportError> {
    d.backend
        .broker_request(pid, nonce, request, max_payload, max_fds)
}

/// `Driver::ipc_broker_name`: the name of process `pid`'s broker started with `nonce`.
pub(crate) fn name(d: &DriverShared, pid: u32, nonce: u32) -> String {
    d.backend.broker_name(pid, nonce)
}
