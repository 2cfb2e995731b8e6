//! The dispatch thread both backends' engines are built on: a thread that takes submitted
//! batches of [`EngineOp`]s in order from a channel, and the rules of dropping an engine
//! (finish what was submitted; a wait that can never be satisfied is abandoned). The host
//! backend's thread runs the operations itself; the cuda backend's queues them on a stream.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use super::{EngineOp, EngineSync, HalError, Result};

/// How long one wait slice lasts before the thread checks whether its engine is being dropped.
const WAIT_SLICE_NS: u64 = 10_000_000;

/// Set when the engine is being dropped.
#[derive(Debug, Clone)]
pub(crate) struct Closing(Arc<AtomicBool>);

impl Closing {
    /// Waits for `s` unless the engine is dropped meanwhile; true if the wait was abandoned
    /// (the memory work after it is then skipped, its `Host` operations still run).
    pub(crate) fn wait(&self, s: &dyn EngineSync) -> bool {
        while !s.wait_ns(WAIT_SLICE_NS) {
            if self.0.load(Ordering::Acquire) {
                return true;
            }
        }
        false
    }
}

/// A thread executing or queuing batches of operations in submission order.
#[derive(Debug)]
pub(crate) struct Dispatcher {
    tx: Mutex<Option<Sender<Vec<EngineOp>>>>,
    closing: Closing,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Dispatcher {
    /// Starts thread `name` (`std::thread::Builder::spawn`) running `run` over the batches.
    pub(crate) fn spawn(
        name: String,
        run: impl FnOnce(Receiver<Vec<EngineOp>>, Closing) + Send + 'static,
    ) -> Result<Dispatcher> {
        let (tx, rx) = channel::<Vec<EngineOp>>();
        let closing = Closing(Arc::new(AtomicBool::new(false)));
        let c = closing.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || run(rx, c))
            .map_err(|e| HalError::OutOfHostMemory(format!("spawning an engine thread: {e}")))?;
        Ok(Dispatcher {
            tx: Mutex::new(Some(tx)),
            closing,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Queues `ops` after everything submitted before.
    pub(crate) fn submit(&self, ops: Vec<EngineOp>) {
        if let Some(tx) = self.tx.lock().as_ref() {
            // The receiver lives until the sender is dropped in `Drop` (or the thread ended
            // early, when nothing is left to run anyway).
            let _ = tx.send(ops);
        }
    }
}

impl Drop for Dispatcher {
    /// Finishes the submitted work (abandoning a wait that never comes) and joins the thread.
    fn drop(&mut self) {
        self.closing.0.store(true, Ordering::Release);
        // Closing the channel ends the thread's loop once the submitted work is done.
        drop(self.tx.lock().take());
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}
