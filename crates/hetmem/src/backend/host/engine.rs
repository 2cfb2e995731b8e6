//! Host device engines: one worker thread per engine, executing submitted [`EngineOp`]s in
//! order. The CUDA equivalents: an engine is a stream (`cuStreamCreate`), `Copy` is
//! `cuMemcpyAsync`, `Fill` is `cuMemsetD8Async` / `cuMemsetD32Async` (or a pattern copy), `Wait`
//! is `cuStreamWaitEvent`, `Signal` is `cuEventRecord`, `Host` is `cuLaunchHostFunc`.
//!
//! Copies are `memmove` (`std::ptr::copy`), fills are `memset` (`std::ptr::write_bytes`) for
//! one-byte patterns and a doubling `memcpy` of the pattern otherwise.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use crate::backend::{Engine, EngineOp};
use crate::error::{Error, Result};

/// How long one wait slice lasts before the engine checks whether it is being dropped.
const WAIT_SLICE_NS: u64 = 10_000_000;

/// A worker thread executing batches of operations in submission order.
#[derive(Debug)]
pub struct HostEngine {
    tx: Mutex<Option<Sender<Vec<EngineOp>>>>,
    closing: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl HostEngine {
    /// Starts the worker thread (`std::thread::Builder::spawn`), named `hetmem-dev{device}`.
    pub fn new(device: u32) -> Result<HostEngine> {
        let (tx, rx) = channel::<Vec<EngineOp>>();
        let closing = Arc::new(AtomicBool::new(false));
        let c = closing.clone();
        let thread = std::thread::Builder::new()
            .name(format!("hetmem-dev{device}"))
            .spawn(move || run(rx, c))
            .map_err(|e| Error::OutOfHostMemory(format!("spawning an engine thread: {e}")))?;
        Ok(HostEngine {
            tx: Mutex::new(Some(tx)),
            closing,
            thread: Mutex::new(Some(thread)),
        })
    }
}

fn run(rx: Receiver<Vec<EngineOp>>, closing: Arc<AtomicBool>) {
    while let Ok(batch) = rx.recv() {
        let mut abandoned = false;
        for op in batch {
            match op {
                EngineOp::Copy { dst, src, size } => {
                    if !abandoned && size > 0 {
                        // SAFETY: the submitter guarantees both ranges are live and accessible
                        // until this runs; overlap is allowed (memmove).
                        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, size) };
                    }
                }
                EngineOp::Fill { ptr, pattern, size } => {
                    if !abandoned {
                        // SAFETY: as for Copy.
                        unsafe { fill(ptr as *mut u8, &pattern, size) };
                    }
                }
                EngineOp::Wait(s) => {
                    while !abandoned && !s.wait_ns(WAIT_SLICE_NS) {
                        if closing.load(Ordering::Acquire) {
                            // Dropped while waiting on something that never came: skip the
                            // memory work of this batch, still run its bookkeeping.
                            abandoned = true;
                        }
                    }
                }
                EngineOp::Signal(s) => {
                    if !abandoned {
                        s.signal();
                    }
                }
                EngineOp::Host(f) => f(),
            }
        }
    }
}

/// Fills `size` bytes at `dst` with `pattern` repeated.
///
/// # Safety
/// `[dst, dst+size)` is writable memory.
unsafe fn fill(dst: *mut u8, pattern: &[u8], size: usize) {
    if size == 0 || pattern.is_empty() {
        return;
    }
    if pattern.len() == 1 || pattern.iter().all(|&b| b == pattern[0]) {
        // SAFETY: forwarded contract.
        unsafe { std::ptr::write_bytes(dst, pattern[0], size) };
        return;
    }
    let first = pattern.len().min(size);
    // SAFETY: `first <= size`, and the pattern is host memory not inside the destination.
    unsafe { std::ptr::copy_nonoverlapping(pattern.as_ptr(), dst, first) };
    // Double the filled prefix: it is a whole number of patterns, so copying it on keeps the
    // phase. Chunks are capped so that the source stays in cache.
    let mut done = first;
    while done < size {
        let n = done.min(size - done).min(1 << 20);
        // SAFETY: [dst, dst+done) is filled and [dst+done, dst+done+n) is inside the range; they
        // do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(dst, dst.add(done), n) };
        done += n;
    }
}

impl Engine for HostEngine {
    unsafe fn submit(&self, ops: Vec<EngineOp>) {
        if let Some(tx) = self.tx.lock().as_ref() {
            // The receiver lives until the sender is dropped in `Drop`, so this cannot fail.
            let _ = tx.send(ops);
        }
    }
}

impl Drop for HostEngine {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Release);
        // Closing the channel ends the worker's loop once the submitted work is done.
        drop(self.tx.lock().take());
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}
