//! Engines of the cuda backend: one CUDA stream each (`cuStreamCreate(CU_STREAM_NON_BLOCKING)`
//! in the device's primary context), fed by a dispatch thread that takes the submitted
//! batches in order:
//!
//! | operation | driver call |
//! |---|---|
//! | `Copy` | `cuMemcpyAsync` (overlapping ranges: through a staging buffer from `cuMemAlloc`, after `cuStreamSynchronize`) |
//! | `Fill`, 1-, 2- and 4-byte patterns | `cuMemsetD8Async` / `cuMemsetD16Async` / `cuMemsetD32Async` |
//! | `Fill`, longer patterns | the pattern copied in once (`cuMemcpyAsync` from the host), then doubled in place by device-to-device `cuMemcpyAsync` |
//! | `Wait` | the dispatch thread waits for the object before it queues what follows |
//! | `Signal`, `Host` | `cuLaunchHostFunc` (runs once everything queued before has finished) |
//!
//! Events and fences are host objects ([`crate::backend::sync::FlagSync`]): a wait holds back
//! only the work queued after it on that stream, never the caller or other streams.
//! Dropping an engine finishes its submitted work (a wait that can never be satisfied is
//! abandoned: the memory work after it is skipped, its `Host` operations still run), then
//! `cuStreamSynchronize` and `cuStreamDestroy`.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use cudarc::driver::sys;
use parking_lot::Mutex;

use super::driver::{self, CUcontext};
use crate::backend::{Engine, EngineOp, HalError, Result};

/// How long one wait slice lasts before the dispatch thread checks whether it is being dropped.
const WAIT_SLICE_NS: u64 = 10_000_000;

/// A CUDA stream and the thread that queues onto it.
#[derive(Debug)]
pub(crate) struct CudaEngine {
    tx: Mutex<Option<Sender<Vec<EngineOp>>>>,
    closing: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// A context handle that may move to the dispatch thread: primary contexts are process-wide
/// and usable from any thread once made current there.
struct SendCtx(CUcontext);
// SAFETY: see above; the driver's context handles are valid on every thread of the process.
unsafe impl Send for SendCtx {}

impl CudaEngine {
    /// Starts the dispatch thread for device `device` (context `ctx`), which creates the
    /// stream; fails if the stream cannot be created.
    pub(crate) fn new(device: u32, ctx: CUcontext) -> Result<CudaEngine> {
        let (tx, rx) = channel::<Vec<EngineOp>>();
        let (ready_tx, ready_rx) = channel::<Result<()>>();
        let closing = Arc::new(AtomicBool::new(false));
        let c = closing.clone();
        let ctx = SendCtx(ctx);
        let thread = std::thread::Builder::new()
            .name(format!("hetmem-cuda{device}"))
            .spawn(move || {
                let ctx = ctx;
                let stream = match driver::set_current(ctx.0).and_then(|()| stream_create()) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                run(stream, rx, c);
            })
            .map_err(|e| HalError::OutOfHostMemory(format!("spawning an engine thread: {e}")))?;
        let ready = ready_rx
            .recv()
            .unwrap_or_else(|_| Err(HalError::Unexpected("the engine thread died".into())));
        if let Err(e) = ready {
            let _ = thread.join();
            return Err(e);
        }
        Ok(CudaEngine {
            tx: Mutex::new(Some(tx)),
            closing,
            thread: Mutex::new(Some(thread)),
        })
    }
}

/// `cuStreamCreate(CU_STREAM_NON_BLOCKING)` in the current context.
fn stream_create() -> Result<sys::CUstream> {
    let mut s = std::ptr::null_mut();
    // SAFETY: valid out-pointer; flag 1 is CU_STREAM_NON_BLOCKING.
    driver::check(
        "cuStreamCreate",
        unsafe { sys::cuStreamCreate(&mut s, 1) },
        false,
    )?;
    Ok(s)
}

/// Trampoline of `cuLaunchHostFunc`: runs and frees the boxed closure.
unsafe extern "C" fn run_host(data: *mut c_void) {
    // SAFETY: `data` is the `Box<Box<dyn FnOnce>>` leaked by `launch_host`, passed once.
    let f: Box<Box<dyn FnOnce() + Send>> = unsafe { Box::from_raw(data.cast()) };
    // A panic must not cross into the driver's thread.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
}

/// `cuLaunchHostFunc(stream, f)`: `f` runs on the driver's callback thread once the work
/// queued before has finished. If the driver refuses (a lost context), the stream is
/// synchronised and `f` runs here, so bookkeeping never waits forever.
fn launch_host(stream: sys::CUstream, f: Box<dyn FnOnce() + Send>) {
    let data = Box::into_raw(Box::new(f));
    // SAFETY: the trampoline takes back ownership of `data` exactly once, when it runs.
    let r = unsafe { sys::cuLaunchHostFunc(stream, Some(run_host), data.cast()) };
    if r != sys::CUresult::CUDA_SUCCESS {
        tracing::error!("cuLaunchHostFunc failed: {}", driver::error_name(r));
        // SAFETY: the stream is ours; then the closure was not queued, so it is still ours.
        unsafe {
            let _ = sys::cuStreamSynchronize(stream);
            run_host(data.cast());
        }
    }
}

/// Logs a failed asynchronous call: an engine has nobody to return it to (the work's
/// completion is still reported through the `Host` operations that follow).
fn report(what: &str, r: sys::CUresult) {
    if r != sys::CUresult::CUDA_SUCCESS {
        tracing::error!("{what} failed on a cuda engine: {}", driver::error_name(r));
    }
}

fn run(stream: sys::CUstream, rx: Receiver<Vec<EngineOp>>, closing: Arc<AtomicBool>) {
    while let Ok(batch) = rx.recv() {
        let mut abandoned = false;
        for op in batch {
            match op {
                EngineOp::Copy { dst, src, size } => {
                    if !abandoned && size > 0 {
                        // SAFETY: the submitter guarantees both ranges are live and reachable
                        // until the copy has run.
                        unsafe { copy(stream, dst, src, size) };
                    }
                }
                EngineOp::Fill { ptr, pattern, size } => {
                    if !abandoned && size > 0 {
                        // SAFETY: as for Copy.
                        unsafe { fill(stream, ptr, &pattern, size) };
                    }
                }
                EngineOp::Wait(s) => {
                    while !abandoned && !s.wait_ns(WAIT_SLICE_NS) {
                        if closing.load(Ordering::Acquire) {
                            abandoned = true;
                        }
                    }
                }
                EngineOp::Signal(s) => {
                    if !abandoned {
                        launch_host(stream, Box::new(move || s.signal()));
                    }
                }
                EngineOp::Host(f) => launch_host(stream, f),
            }
        }
    }
    // SAFETY: the stream is ours and nothing queues on it any more.
    unsafe {
        report("cuStreamSynchronize", sys::cuStreamSynchronize(stream));
        report("cuStreamDestroy", sys::cuStreamDestroy_v2(stream));
    }
}

/// Copies `size` bytes from `src` to `dst` on `stream` (memmove semantics).
///
/// # Safety
/// Both ranges are live memory the device can reach (or pageable host memory).
unsafe fn copy(stream: sys::CUstream, dst: usize, src: usize, size: usize) {
    let overlap = dst < src + size && src < dst + size && dst != src;
    if !overlap {
        // SAFETY: forwarded contract.
        report("cuMemcpyAsync", unsafe {
            sys::cuMemcpyAsync(dst as u64, src as u64, size, stream)
        });
        return;
    }
    if dst == src {
        return;
    }
    // Overlapping ranges: cuMemcpy is undefined there, so go through a staging buffer.
    let mut tmp: u64 = 0;
    // SAFETY: valid out-pointer; the stream is ours; the staging buffer is freed after the
    // stream has finished with it.
    unsafe {
        report("cuStreamSynchronize", sys::cuStreamSynchronize(stream));
        let r = sys::cuMemAlloc_v2(&mut tmp, size);
        if r != sys::CUresult::CUDA_SUCCESS {
            report("cuMemAlloc (staging an overlapping copy)", r);
            return;
        }
        report(
            "cuMemcpyAsync",
            sys::cuMemcpyAsync(tmp, src as u64, size, stream),
        );
        report(
            "cuMemcpyAsync",
            sys::cuMemcpyAsync(dst as u64, tmp, size, stream),
        );
        report("cuStreamSynchronize", sys::cuStreamSynchronize(stream));
        let _ = sys::cuMemFree_v2(tmp);
    }
}

/// Fills `size` bytes at `ptr` with `pattern` repeated, on `stream`.
///
/// # Safety
/// The range is live memory the device can reach.
unsafe fn fill(stream: sys::CUstream, ptr: usize, pattern: &[u8], size: usize) {
    let p = ptr as u64;
    let uniform = pattern.iter().all(|&b| b == pattern[0]);
    // SAFETY (every call below): forwarded contract; the stream is ours.
    unsafe {
        if uniform {
            report(
                "cuMemsetD8Async",
                sys::cuMemsetD8Async(p, pattern[0], size, stream),
            );
            return;
        }
        let n = pattern.len();
        if n == 2 && ptr.is_multiple_of(2) && size.is_multiple_of(2) {
            let v = u16::from_ne_bytes([pattern[0], pattern[1]]);
            report(
                "cuMemsetD16Async",
                sys::cuMemsetD16Async(p, v, size / 2, stream),
            );
            return;
        }
        if n == 4 && ptr.is_multiple_of(4) && size.is_multiple_of(4) {
            let v = u32::from_ne_bytes([pattern[0], pattern[1], pattern[2], pattern[3]]);
            report(
                "cuMemsetD32Async",
                sys::cuMemsetD32Async(p, v, size / 4, stream),
            );
            return;
        }
        // The first pattern from pageable host memory (the driver has staged it when the call
        // returns), then double the filled prefix, which stays a whole number of patterns.
        let first = n.min(size);
        report(
            "cuMemcpyAsync",
            sys::cuMemcpyAsync(p, pattern.as_ptr() as u64, first, stream),
        );
        let mut done = first;
        while done < size {
            let k = done.min(size - done);
            report(
                "cuMemcpyAsync",
                sys::cuMemcpyAsync(p + done as u64, p, k, stream),
            );
            done += k;
        }
        // The pattern buffer is freed when this returns: make sure the first copy has read it.
        report("cuStreamSynchronize", sys::cuStreamSynchronize(stream));
    }
}

impl Engine for CudaEngine {
    unsafe fn submit(&self, ops: Vec<EngineOp>) {
        if let Some(tx) = self.tx.lock().as_ref() {
            // The receiver lives until the sender is dropped in `Drop`.
            let _ = tx.send(ops);
        }
    }
}

impl Drop for CudaEngine {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Release);
        drop(self.tx.lock().take());
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}
