//! Engines of the cuda backend: one CUDA stream each (`cuStreamCreate(CU_STREAM_NON_BLOCKING)`
//! in the device's primary context), fed by a dispatch thread that takes the submitted
//! batches in order:
//!
//! | operation | driver call |
//! |---|---|
//! | `Copy` | `cuMemcpyAsync` (overlapping ranges: through a staging buffer from `cuMemAlloc`, after `cuStreamSynchronize`; from 1 MiB with a pageable side: through pinned staging buffers, see [`super::staging`]) |
//! | `Fill` of pageable memory | the host writes the pattern after `cuStreamSynchronize` |
//! | `Fill`, 1-, 2- and 4-byte patterns | `cuMemsetD8Async` / `cuMemsetD16Async` / `cuMemsetD32Async` |
//! | `Fill`, longer patterns | the pattern copied in once (`cuMemcpyAsync` from the host), then doubled in place by device-to-device `cuMemcpyAsync` |
//! | `Wait` | the dispatch thread waits for the object before it queues what follows |
//! | `Signal`, `Host` | `cuEventRecord` of an event that a completion thread waits for (`cuEventSynchronize`), then runs them |
//!
//! Host work never sits in the stream itself (no `cuLaunchHostFunc`): a host function holds
//! back the work queued after it until the driver's callback thread has run it, which cost
//! 20% of device-to-device copy bandwidth when every command was followed by its bookkeeping
//! (`hetmem bench cuda`). An event costs the stream nothing.
//! Events and fences are host objects ([`crate::backend::sync::FlagSync`]): a wait holds back
//! only the work queued after it on that stream, never the caller or other streams.
//! Dropping an engine finishes its submitted work (a wait that can never be satisfied is
//! abandoned: the memory work after it is skipped, its `Host` operations still run), then
//! `cuStreamSynchronize` and `cuStreamDestroy`.

use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;

use cudarc::driver::sys;

use super::driver::{self, CUcontext};
use super::staging::{HostPool, Staging, STAGE_MIN};
use crate::backend::dispatch::{Closing, Dispatcher};
use crate::backend::{Engine, EngineOp, HalError, Result};

/// A CUDA stream and the thread that queues onto it, with the first failure of its work not
/// yet reported ([`Engine::take_error`]).
#[derive(Debug)]
pub(crate) struct CudaEngine(Dispatcher, Fault);

/// The first failure of an engine's asynchronous work since it was last taken.
type Fault = Arc<parking_lot::Mutex<Option<HalError>>>;

impl CudaEngine {
    /// Starts the dispatch thread for device `device` (its context from `contexts`, which the
    /// engine's threads keep alive), which creates the
    /// stream; fails if the stream cannot be created.
    pub(crate) fn new(device: u32, contexts: Arc<super::Contexts>) -> Result<CudaEngine> {
        let (ready_tx, ready_rx) = channel::<Result<()>>();
        let fault = Fault::default();
        let (f_run, f_done) = (fault.clone(), fault.clone());
        let dispatcher = Dispatcher::spawn(format!("hetmem-cuda{device}"), move |rx, closing| {
            let ctx = contexts.get(device);
            let stream = match driver::set_current(ctx).and_then(|()| stream_create()) {
                Ok(s) => s,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let (done_tx, done_rx) = channel::<Completion>();
            let completer = contexts.clone();
            let completion = std::thread::Builder::new()
                .name(format!("hetmem-cuda{device}-done"))
                .spawn(move || complete(completer.get(device), &completer, done_rx, &f_done));
            let completion = match completion {
                Ok(t) => t,
                Err(e) => {
                    let _ = ready_tx.send(Err(HalError::OutOfHostMemory(format!(
                        "spawning an engine's completion thread: {e}"
                    ))));
                    // SAFETY: the stream is ours and unused.
                    unsafe { sys::cuStreamDestroy_v2(stream) };
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            run(stream, rx, closing, done_tx, &f_run);
            let _ = completion.join();
        })?;
        // A failure to start is reported before anything is submitted; dropping the
        // dispatcher then joins the thread, which has returned.
        ready_rx
            .recv()
            .unwrap_or_else(|_| Err(HalError::Unexpected("the engine thread died".into())))?;
        Ok(CudaEngine(dispatcher, fault))
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

/// Logs a failed asynchronous call and keeps the first one in `fault`, for the next
/// synchronize to report ([`Engine::take_error`]); the work's completion is still signalled
/// through the `Host` operations that follow, so nothing waits forever.
fn report(fault: &Fault, what: &str, r: sys::CUresult) {
    if let Err(e) = driver::check(what, r, false) {
        tracing::error!("{what} failed on a cuda engine: {}", driver::error_name(r));
        fault.lock().get_or_insert(e);
    }
}

/// Host work to run once the stream has reached `event` (`None`: at once, in order).
struct Completion {
    event: Option<SendEvent>,
    work: Vec<Box<dyn FnOnce() + Send>>,
}

/// An event handle that may move to the completion thread.
struct SendEvent(sys::CUevent);
// SAFETY: events are context objects usable from any thread of the process.
unsafe impl Send for SendEvent {}

/// `cuEventCreate(CU_EVENT_DISABLE_TIMING)` + `cuEventRecord(stream)`; `None` if the driver
/// refuses (a lost context), after synchronising the stream so the work after it is still
/// ordered.
fn record(fault: &Fault, stream: sys::CUstream) -> Option<SendEvent> {
    let mut e = std::ptr::null_mut();
    // SAFETY: valid out-pointer; flag 2 is CU_EVENT_DISABLE_TIMING; the stream is ours.
    unsafe {
        let r = sys::cuEventCreate(&mut e, 2);
        if r == sys::CUresult::CUDA_SUCCESS {
            let r = sys::cuEventRecord(e, stream);
            if r == sys::CUresult::CUDA_SUCCESS {
                return Some(SendEvent(e));
            }
            report(fault, "cuEventRecord", r);
            let _ = sys::cuEventDestroy_v2(e);
        } else {
            report(fault, "cuEventCreate", r);
        }
        report(
            fault,
            "cuStreamSynchronize",
            sys::cuStreamSynchronize(stream),
        );
    }
    None
}

/// The completion thread: waits for each event in order (`cuEventSynchronize`), then runs its
/// host work.
/// `_alive` keeps the context retained while this thread runs.
fn complete(ctx: CUcontext, _alive: &super::Contexts, rx: Receiver<Completion>, fault: &Fault) {
    let _ = driver::set_current(ctx);
    while let Ok(c) = rx.recv() {
        if let Some(SendEvent(e)) = c.event {
            // SAFETY: an event recorded on our stream, destroyed once.
            unsafe {
                report(fault, "cuEventSynchronize", sys::cuEventSynchronize(e));
                let _ = sys::cuEventDestroy_v2(e);
            }
        }
        for f in c.work {
            // A panic must not take the thread (and every later completion) with it.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        }
    }
}

/// Host work handed to the completion thread at most this many items at a time: past it,
/// the dispatch thread records an event even if more batches are waiting.
const MAX_PENDING: usize = 256;

/// The dispatch loop. Host work (completions, signals) is handed to the completion thread
/// with one event recorded after the device work queued before it. While more batches are
/// already waiting, their device work is queued first and one event covers them all (up to
/// [`MAX_PENDING`] host items): an event and a completion-thread wake-up per batch cost
/// more than a small copy itself. Host work then runs a little later than it could, never
/// earlier; a `Wait` hands over what is pending before it blocks, so nothing that a wait
/// needs is held back.
fn run(
    stream: sys::CUstream,
    rx: Receiver<Vec<EngineOp>>,
    closing: Closing,
    done: Sender<Completion>,
    fault: &Fault,
) {
    // Host work not yet handed over, and whether device work was queued since the last
    // hand-over (else no new event is needed).
    let mut pending: Vec<Box<dyn FnOnce() + Send>> = Vec::new();
    let mut device_work = false;
    // Pinned buffers for copies with a pageable side, made on the first one.
    let mut staging: Option<Option<Staging>> = None;
    let flush = |pending: &mut Vec<Box<dyn FnOnce() + Send>>, device_work: &mut bool| {
        if pending.is_empty() {
            return;
        }
        let event = if *device_work {
            record(fault, stream)
        } else {
            None
        };
        *device_work = false;
        let _ = done.send(Completion {
            event,
            work: std::mem::take(pending),
        });
    };
    loop {
        let batch = match rx.try_recv() {
            Ok(b) => b,
            Err(TryRecvError::Empty) => {
                // Nothing more waiting: hand over what is pending, then sleep.
                flush(&mut pending, &mut device_work);
                match rx.recv() {
                    Ok(b) => b,
                    Err(_) => break,
                }
            }
            Err(TryRecvError::Disconnected) => break,
        };
        let mut abandoned = false;
        for op in batch {
            match op {
                EngineOp::Copy { dst, src, size } => {
                    if !abandoned && size > 0 {
                        // SAFETY: the submitter guarantees both ranges are live and reachable
                        // until the copy has run.
                        unsafe { copy(fault, stream, &mut staging, dst, src, size) };
                        device_work = true;
                    }
                }
                EngineOp::Fill { ptr, pattern, size } => {
                    if !abandoned && size > 0 {
                        // SAFETY: as for Copy.
                        unsafe {
                            if pageable(ptr) {
                                let pool = staging_of(&mut staging).map(|s| &s.pool);
                                fill_pageable(fault, stream, pool, ptr, &pattern, size)
                            } else {
                                fill(fault, stream, ptr, &pattern, size)
                            }
                        };
                        device_work = true;
                    }
                }
                EngineOp::Wait(s) => {
                    // What came before the wait is reported without waiting for it.
                    flush(&mut pending, &mut device_work);
                    abandoned = abandoned || closing.wait(s.as_ref());
                }
                EngineOp::Signal(s) => {
                    if !abandoned {
                        pending.push(Box::new(move || s.signal()));
                    }
                }
                EngineOp::Host(f) => pending.push(f),
            }
        }
        if pending.len() >= MAX_PENDING {
            flush(&mut pending, &mut device_work);
        }
    }
    flush(&mut pending, &mut device_work);
    // SAFETY: the stream is ours and nothing queues on it any more.
    unsafe {
        report(
            fault,
            "cuStreamSynchronize",
            sys::cuStreamSynchronize(stream),
        );
        // No DMA uses the staging buffers any more.
        drop(staging);
        report(fault, "cuStreamDestroy", sys::cuStreamDestroy_v2(stream));
    }
}

/// The engine's staging buffers, made on first use (`None` if the driver refused them).
fn staging_of(s: &mut Option<Option<Staging>>) -> Option<&mut Staging> {
    s.get_or_insert_with(Staging::new).as_mut()
}

/// Copies `size` bytes from `src` to `dst` on `stream` (memmove semantics). From
/// [`STAGE_MIN`] bytes, a pageable side goes through the engine's pinned staging buffers
/// ([`crate::backend::cuda::staging`]), and two pageable sides are copied by the host after
/// the stream has drained.
///
/// # Safety
/// Both ranges are live memory the device can reach (or pageable host memory).
unsafe fn copy(
    fault: &Fault,
    stream: sys::CUstream,
    staging: &mut Option<Option<Staging>>,
    dst: usize,
    src: usize,
    size: usize,
) {
    let overlap = dst < src + size && src < dst + size && dst != src;
    if size >= STAGE_MIN {
        let (pd, ps) = (pageable(dst), pageable(src));
        if pd && ps {
            // SAFETY: the stream is ours; both ranges are the process's (forwarded contract).
            unsafe {
                report(
                    fault,
                    "cuStreamSynchronize",
                    sys::cuStreamSynchronize(stream),
                );
                match staging_of(staging) {
                    Some(s) if !overlap => s.pool.copy(dst, src, size),
                    _ => std::ptr::copy(src as *const u8, dst as *mut u8, size),
                }
            }
            return;
        }
        if pd || ps {
            if let Some(s) = staging_of(staging) {
                let rep = |what: &str, r| report(fault, what, r);
                // SAFETY: forwarded contract; a pageable range and one the device reaches
                // never overlap.
                unsafe { s.copy(stream, &rep, ps, dst, src, size) };
                return;
            }
        }
    }
    if !overlap {
        // SAFETY: forwarded contract.
        report(fault, "cuMemcpyAsync", unsafe {
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
        report(
            fault,
            "cuStreamSynchronize",
            sys::cuStreamSynchronize(stream),
        );
        let r = sys::cuMemAlloc_v2(&mut tmp, size);
        if r != sys::CUresult::CUDA_SUCCESS {
            report(fault, "cuMemAlloc (staging an overlapping copy)", r);
            return;
        }
        report(
            fault,
            "cuMemcpyAsync",
            sys::cuMemcpyAsync(tmp, src as u64, size, stream),
        );
        report(
            fault,
            "cuMemcpyAsync",
            sys::cuMemcpyAsync(dst as u64, tmp, size, stream),
        );
        report(
            fault,
            "cuStreamSynchronize",
            sys::cuStreamSynchronize(stream),
        );
        let _ = sys::cuMemFree_v2(tmp);
    }
}

/// Whether `ptr` is plain pageable memory of the process, which CUDA does not know
/// (`cuPointerGetAttribute` answers `CUDA_ERROR_INVALID_VALUE`): device, host-allocated,
/// registered and mapped memory are known. The semantics layer accepts such memory as a
/// queue operand only where the process has it mapped with the access needed.
fn pageable(ptr: usize) -> bool {
    let mut t: u32 = 0;
    // SAFETY: writes one CUmemorytype (an unsigned int) into `t`.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut t as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr as u64,
        )
    };
    r == sys::CUresult::CUDA_ERROR_INVALID_VALUE
}

/// A fill of pageable memory, which `cuMemsetD*Async` cannot take: in stream order, the
/// stream is synchronized and the host writes the pattern, from [`STAGE_MIN`] bytes with the
/// staging pool's threads (staging through device memory would cost a copy of the same size
/// over the bus).
///
/// # Safety
/// The range is live, writable memory of this process.
unsafe fn fill_pageable(
    fault: &Fault,
    stream: sys::CUstream,
    pool: Option<&HostPool>,
    ptr: usize,
    pattern: &[u8],
    size: usize,
) {
    // SAFETY: the stream is ours.
    unsafe {
        report(
            fault,
            "cuStreamSynchronize",
            sys::cuStreamSynchronize(stream),
        )
    };
    // SAFETY: forwarded contract.
    unsafe {
        match pool {
            Some(p) if size >= STAGE_MIN => p.fill(ptr, pattern, size),
            _ => host_fill(ptr, pattern, size),
        }
    }
}

/// Writes `pattern` repeated over `size` bytes at `ptr` on the host: `memset` for a uniform
/// pattern, else the first pattern and then the filled prefix doubled (byte `i` gets
/// `pattern[i % pattern.len()]`).
///
/// # Safety
/// The range is live, writable memory of this process.
pub(crate) unsafe fn host_fill(ptr: usize, pattern: &[u8], size: usize) {
    let p = ptr as *mut u8;
    if pattern.iter().all(|&b| b == pattern[0]) {
        // SAFETY: forwarded contract.
        unsafe { std::ptr::write_bytes(p, pattern[0], size) };
        return;
    }
    let first = pattern.len().min(size);
    // SAFETY: forwarded contract; every copy below stays inside the range and copies the
    // filled prefix [0, done) into [done, done + k), which it does not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(pattern.as_ptr(), p, first);
        let mut done = first;
        while done < size {
            let k = done.min(size - done);
            std::ptr::copy_nonoverlapping(p, p.add(done), k);
            done += k;
        }
    }
}

/// Whether `ptr` is host memory CUDA knows (`CU_POINTER_ATTRIBUTE_MEMORY_TYPE` is
/// `CU_MEMORYTYPE_HOST`: `cuMemHostAlloc`, registered, or `cuMemCreate` at a host NUMA node),
/// which the host can write directly.
fn host_located(ptr: usize) -> bool {
    let mut t: u32 = 0;
    // SAFETY: writes one CUmemorytype (an unsigned int) into `t`.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut t as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr as u64,
        )
    };
    r == sys::CUresult::CUDA_SUCCESS && t == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32
}

/// One `cuMemsetD*Async`'s answer `r` for the fill of `size` bytes at `ptr`: reported, unless
/// the driver refused a fill of host memory, which the host then writes in stream order. On an
/// H200 (driver 580) every `cuMemsetD8/D32Async` over a range of host physical memory
/// (`cuMemCreate` at a host NUMA node) that spans two allocations mapped side by side answers
/// `CUDA_ERROR_INVALID_VALUE` (one allocation alone is fine, device memory too): case 10 of the
/// cases file maps host physical memory from an offset, which splits it into granules.
///
/// # Safety
/// As [`fill`].
unsafe fn memset_done(
    fault: &Fault,
    stream: sys::CUstream,
    what: &str,
    r: sys::CUresult,
    ptr: usize,
    pattern: &[u8],
    size: usize,
) {
    if r != sys::CUresult::CUDA_SUCCESS && host_located(ptr) {
        // SAFETY: forwarded contract; host memory of this process, mapped for the host.
        unsafe { fill_pageable(fault, stream, None, ptr, pattern, size) };
        return;
    }
    report(fault, what, r);
}

/// Fills `size` bytes at `ptr` with `pattern` repeated, on `stream`.
///
/// # Safety
/// The range is live memory the device can reach.
unsafe fn fill(fault: &Fault, stream: sys::CUstream, ptr: usize, pattern: &[u8], size: usize) {
    let p = ptr as u64;
    let uniform = pattern.iter().all(|&b| b == pattern[0]);
    // SAFETY (every call below): forwarded contract; the stream is ours.
    unsafe {
        if uniform {
            let r = sys::cuMemsetD8Async(p, pattern[0], size, stream);
            memset_done(fault, stream, "cuMemsetD8Async", r, ptr, pattern, size);
            return;
        }
        let n = pattern.len();
        if n == 2 && ptr.is_multiple_of(2) && size.is_multiple_of(2) {
            let v = u16::from_ne_bytes([pattern[0], pattern[1]]);
            let r = sys::cuMemsetD16Async(p, v, size / 2, stream);
            memset_done(fault, stream, "cuMemsetD16Async", r, ptr, pattern, size);
            return;
        }
        if n == 4 && ptr.is_multiple_of(4) && size.is_multiple_of(4) {
            let v = u32::from_ne_bytes([pattern[0], pattern[1], pattern[2], pattern[3]]);
            let r = sys::cuMemsetD32Async(p, v, size / 4, stream);
            memset_done(fault, stream, "cuMemsetD32Async", r, ptr, pattern, size);
            return;
        }
        // The first pattern from pageable host memory (the driver has staged it when the call
        // returns), then double the filled prefix, which stays a whole number of patterns.
        let first = n.min(size);
        report(
            fault,
            "cuMemcpyAsync",
            sys::cuMemcpyAsync(p, pattern.as_ptr() as u64, first, stream),
        );
        let mut done = first;
        while done < size {
            let k = done.min(size - done);
            report(
                fault,
                "cuMemcpyAsync",
                sys::cuMemcpyAsync(p + done as u64, p, k, stream),
            );
            done += k;
        }
        // The pattern buffer is freed when this returns: make sure the first copy has read it.
        report(
            fault,
            "cuStreamSynchronize",
            sys::cuStreamSynchronize(stream),
        );
    }
}

impl Engine for CudaEngine {
    unsafe fn submit(&self, ops: Vec<EngineOp>) {
        self.0.submit(ops);
    }

    fn take_error(&self) -> Option<HalError> {
        self.1.lock().take()
    }
}

#[cfg(test)]
mod tests {
    /// The host fill of pageable memory repeats the pattern from the first byte, for uniform
    /// and non-uniform patterns, sizes below, at and past a multiple of the pattern; the
    /// bytes after the range stay.
    #[test]
    fn host_fill_repeats_the_pattern_over_the_range_only() {
        for pattern in [
            &[7u8][..],
            &[1, 2],
            &[1, 2, 3, 4],
            &[9; 16],
            &(0..64).collect::<Vec<u8>>(),
        ] {
            for size in [0usize, 1, 3, 16, 63, 64, 65, 1000, 4099] {
                let mut buf = vec![0xeeu8; size + 8];
                // SAFETY: `size` writable bytes of our own buffer.
                unsafe { super::host_fill(buf.as_mut_ptr() as usize, pattern, size) };
                for (i, &b) in buf[..size].iter().enumerate() {
                    assert_eq!(b, pattern[i % pattern.len()], "byte {i} of {size}");
                }
                assert!(buf[size..].iter().all(|&b| b == 0xee));
            }
        }
    }
}
