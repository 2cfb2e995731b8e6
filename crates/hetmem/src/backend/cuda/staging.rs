//! Staging of pageable (plain system) memory for an engine's copies and fills: the copy
//! engine reaches only memory CUDA knows without the driver's own bounce through one CPU
//! thread, so copies of at least [`STAGE_MIN`] bytes with one pageable side go through
//! [`BUFFERS`] pinned buffers of [`CHUNK`] bytes (`cuMemHostAlloc`, made on an engine's first
//! such copy), chunk by chunk and pipelined: while the DMA of one chunk runs, the host copies
//! the next with up to [`MAX_HOST_THREADS`] threads (a pool owned by the engine): into a
//! pinned buffer with streaming stores, out of one into pageable memory with `memcpy`
//! ([`HostPool::copy_cached`] says why). Fills of
//! pageable memory and copies between two pageable ranges are host work after a
//! `cuStreamSynchronize`, split over the same threads.
//!
//! Stream order holds: a chunk leaves a pinned buffer only by a DMA on the engine's stream
//! (after everything queued before it), a buffer is rewritten by the host only after the event
//! recorded behind its last DMA, and a copy into pageable memory returns only once its bytes
//! are there (later work of the stream sees them).

use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;

use cudarc::driver::sys;
use parking_lot::{Condvar, Mutex};

/// Copies with a pageable side below this many bytes use `cuMemcpyAsync` directly (the
/// driver stages them itself).
pub(crate) const STAGE_MIN: usize = 1 << 20;
/// Bytes per pinned staging buffer, and per chunk of a copy out of the device.
pub(crate) const CHUNK: usize = 8 << 20;
/// Bytes per chunk of a copy into the device (the first half of each buffer).
pub(crate) const IN_CHUNK: usize = CHUNK / 2;
/// Pinned staging buffers per engine.
///
/// Chosen on an H200 machine (16 CPUs, 300 MiB L3, 2026-12-03). `docs/probes/cuda-staging.c`,
/// a C copy of this pipeline (64 MiB copies, medians of 5), ran malloc->device at 36.6 and
/// device->malloc at 36.2 GiB/s with 3 buffers of 8 MiB and 8 threads, and at 38-39 and 44-46
/// GiB/s with 4 buffers, 4 MiB chunks in, 8 MiB out and 12 threads (pinned DMA alone: 51
/// GiB/s; host copies lose 10-25% while a DMA runs beside them). Through `hetmem bench cuda`
/// the same two settings gave 30.8 / 32.4 and 30.5 / 36.3 GiB/s (two runs each), and 2 or 16
/// MiB chunks, 6 buffers or `memcpy` in did no better: the fourth buffer keeps three DMAs
/// queued while the host drains one (the way out gains about 10%); the way in stays where it
/// was, short of the probe by costs of the engine's own not yet found.
pub(crate) const BUFFERS: usize = 4;
/// Host threads (the dispatch thread included) that copy one chunk or fill one range.
pub(crate) const MAX_HOST_THREADS: usize = 12;
/// The smallest part of a host copy or fill given to a thread of its own. At 512 KiB a 4 MiB
/// chunk into the device went to 8 threads, not [`MAX_HOST_THREADS`]; at 256 KiB it goes to
/// all 12 (341 KiB each), as the C probe (`docs/probes/cuda-staging.c`) splits every chunk.
const MIN_PART: usize = 256 << 10;

type Job = Box<dyn FnOnce() + Send>;

/// Helper threads for host copies and fills: a job is cut into parts, the caller runs the
/// first and waits for the rest.
pub(crate) struct HostPool {
    workers: Vec<Sender<Job>>,
    done: Arc<(Mutex<usize>, Condvar)>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for HostPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostPool({} helpers)", self.workers.len())
    }
}

impl HostPool {
    /// A pool of `helpers` threads (fewer if the OS refuses some).
    pub(crate) fn new(helpers: usize) -> HostPool {
        let done = Arc::new((Mutex::new(0usize), Condvar::new()));
        let (mut workers, mut threads) = (Vec::new(), Vec::new());
        for i in 0..helpers {
            let (tx, rx) = channel::<Job>();
            let d = done.clone();
            let t = std::thread::Builder::new()
                .name(format!("hetmem-stage{i}"))
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                        *d.0.lock() += 1;
                        d.1.notify_all();
                    }
                });
            match t {
                Ok(t) => {
                    workers.push(tx);
                    threads.push(t);
                }
                Err(_) => break,
            }
        }
        HostPool {
            workers,
            done,
            threads,
        }
    }

    /// The pool the engines use: [`MAX_HOST_THREADS`] threads in all, at most the machine's.
    pub(crate) fn for_machine() -> HostPool {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        HostPool::new(n.clamp(1, MAX_HOST_THREADS) - 1)
    }

    /// Cuts `[0, len)` into at most one part per thread, each at least [`MIN_PART`] bytes and a
    /// multiple of `align` (but the last), and runs `f(offset, part_len)` on each, returning
    /// once all have run.
    pub(crate) fn split(
        &self,
        len: usize,
        align: usize,
        f: impl Fn(usize, usize) + Send + Sync + Clone + 'static,
    ) {
        let parts = (len / MIN_PART).clamp(1, self.workers.len() + 1);
        let mut step = len.div_ceil(parts);
        step = step.div_ceil(align) * align;
        let mut jobs = Vec::new();
        let mut off = step;
        while off < len {
            let (o, n) = (off, step.min(len - off));
            let g = f.clone();
            jobs.push(Box::new(move || g(o, n)) as Job);
            off += step;
        }
        let sent = jobs.len();
        *self.done.0.lock() = 0;
        for (w, j) in self.workers.iter().zip(jobs) {
            // A helper that is gone has taken its job with it: count it as done.
            if w.send(j).is_err() {
                *self.done.0.lock() += 1;
            }
        }
        f(0, step.min(len));
        let mut d = self.done.0.lock();
        while *d < sent {
            self.done.1.wait(&mut d);
        }
    }

    /// Copies `len` bytes from `src` to `dst` (not overlapping) with the pool's threads, with
    /// streaming stores ([`hetmem_linux::copy::stream_copy_any`]: 256-bit where the CPU has
    /// AVX2, whatever the alignment and length of each part): for a destination that a DMA
    /// reads next (a pinned staging buffer), or host memory a host copy fills. It used
    /// [`hetmem_linux::copy::stream_copy`], which streams 128 bits at a time and copies a
    /// part whose length is not a multiple of 64 with `memcpy` whole; the C probe of this
    /// pipeline (`docs/probes/cuda-staging.c`) streams 256 bits.
    ///
    /// # Safety
    /// `src` readable and `dst` writable for `len` bytes, not overlapping, until it returns.
    pub(crate) unsafe fn copy(&self, dst: usize, src: usize, len: usize) {
        // SAFETY: forwarded contract.
        unsafe { self.copy_by(dst, src, len, hetmem_linux::copy::stream_copy_any) }
    }

    /// As [`HostPool::copy`] with the C library's `memcpy`: for the way out of a staging
    /// buffer into the program's pageable memory. On an H200 machine (16 CPUs, 8 copying
    /// threads) a staged 64 MiB device-to-malloc copy ran at 29-33 GiB/s this way against
    /// 7-21 GiB/s (erratic) with streaming stores, while the way in (malloc to the pinned
    /// buffer) was the other way round (32-34 against 28-30 GiB/s), so each direction keeps
    /// the faster one.
    ///
    /// # Safety
    /// As [`HostPool::copy`].
    pub(crate) unsafe fn copy_cached(&self, dst: usize, src: usize, len: usize) {
        /// `memcpy` in [`hetmem_linux::copy::stream_copy_any`]'s argument order.
        ///
        /// # Safety
        /// As `stream_copy_any`.
        unsafe fn memcpy(dst: usize, src: usize, n: usize) {
            // SAFETY: the caller's ranges, not overlapping.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n) }
        }
        // SAFETY: forwarded contract.
        unsafe { self.copy_by(dst, src, len, memcpy) }
    }

    /// Copies `len` bytes from `src` to `dst` with the pool's threads, each part with `f`.
    ///
    /// # Safety
    /// As [`HostPool::copy`]; `f(dst, src, n)` copies `n` bytes when given such ranges.
    unsafe fn copy_by(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        f: unsafe fn(usize, usize, usize),
    ) {
        self.split(len, 64, move |o, n| {
            // SAFETY: the caller's ranges; the parts are disjoint.
            unsafe { f(dst + o, src + o, n) }
        });
    }

    /// Fills `len` bytes at `ptr` with `pattern` repeated (byte `i` gets
    /// `pattern[i % pattern.len()]`) with the pool's threads.
    ///
    /// # Safety
    /// `ptr` writable for `len` bytes until it returns.
    pub(crate) unsafe fn fill(&self, ptr: usize, pattern: &[u8], len: usize) {
        let p: Arc<[u8]> = pattern.into();
        let align = pattern.len().max(64).next_multiple_of(pattern.len());
        self.split(len, align, move |o, n| {
            // SAFETY: the caller's range; each part starts at a multiple of the pattern.
            unsafe { super::engine::host_fill(ptr + o, &p, n) }
        });
    }
}

impl Drop for HostPool {
    fn drop(&mut self) {
        self.workers.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Where the bytes of a staged copy go: the plan of DMAs and host copies for one copy, apart
/// from the driver (so the pipeline is tested without a GPU).
pub(crate) trait Dma {
    /// Queues a copy of `len` bytes from `src` to `dst` on the stream.
    fn copy(&mut self, dst: usize, src: usize, len: usize);
    /// Records buffer `b`'s event behind what is queued.
    fn record(&mut self, b: usize);
    /// Waits for buffer `b`'s last recorded event (at once if none).
    fn wait(&mut self, b: usize);
}

/// Copies `size` bytes from pageable `src` to `dst` (memory the device reaches) through the
/// pinned `bufs`, in chunks of [`IN_CHUNK`] bytes: each chunk copied in by the host once its
/// buffer's last DMA is done, then DMAed out.
///
/// # Safety
/// `src` readable for `size` bytes; each buffer writable for [`IN_CHUNK`] bytes.
pub(crate) unsafe fn stage_in(
    dma: &mut impl Dma,
    pool: &HostPool,
    bufs: &[usize],
    dst: usize,
    src: usize,
    size: usize,
) {
    let mut off = 0;
    let mut k = 0;
    while off < size {
        let len = IN_CHUNK.min(size - off);
        let b = k % bufs.len();
        dma.wait(b);
        // SAFETY: the buffer is no DMA's source any more; the caller's ranges.
        unsafe { pool.copy(bufs[b], src + off, len) };
        dma.copy(dst + off, bufs[b], len);
        dma.record(b);
        off += len;
        k += 1;
    }
}

/// Copies `size` bytes from `src` (memory the device reaches) to pageable `dst` through the
/// pinned `bufs`: the first chunks DMAed in, then each one copied out by the host once its
/// event is reached and its buffer refilled with the next chunk but `bufs.len() - 1`.
///
/// # Safety
/// `dst` writable for `size` bytes; each buffer readable for [`CHUNK`] bytes.
pub(crate) unsafe fn stage_out<D: Dma>(
    dma: &mut D,
    pool: &HostPool,
    bufs: &[usize],
    dst: usize,
    src: usize,
    size: usize,
) {
    let n = size.div_ceil(CHUNK);
    let chunk = |k: usize| (k * CHUNK, CHUNK.min(size - k * CHUNK));
    let issue = |dma: &mut D, k: usize| {
        let (o, len) = chunk(k);
        let b = k % bufs.len();
        dma.copy(bufs[b], src + o, len);
        dma.record(b);
    };
    for k in 0..n.min(bufs.len()) {
        issue(dma, k);
    }
    for k in 0..n {
        let b = k % bufs.len();
        dma.wait(b);
        let (o, len) = chunk(k);
        // SAFETY: the chunk's DMA is done; the caller's range.
        unsafe { pool.copy_cached(dst + o, bufs[b], len) };
        if k + bufs.len() < n {
            issue(dma, k + bufs.len());
        }
    }
}

/// An engine's pinned staging buffers and their events, made on first use.
pub(crate) struct Staging {
    bufs: Vec<(usize, sys::CUevent, bool)>,
    pub(crate) pool: HostPool,
}

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Staging({} buffers, {:?})", self.bufs.len(), self.pool)
    }
}

/// The engine's stream as a [`Dma`].
struct StreamDma<'a> {
    stream: sys::CUstream,
    bufs: &'a mut [(usize, sys::CUevent, bool)],
    fault: &'a dyn Fn(&str, sys::CUresult),
}

impl Dma for StreamDma<'_> {
    fn copy(&mut self, dst: usize, src: usize, len: usize) {
        // SAFETY: the staged copy's ranges (see `stage_in` / `stage_out`); the stream is ours.
        let r = unsafe { sys::cuMemcpyAsync(dst as u64, src as u64, len, self.stream) };
        (self.fault)("cuMemcpyAsync (staged)", r);
    }
    fn record(&mut self, b: usize) {
        // SAFETY: our event and stream.
        let r = unsafe { sys::cuEventRecord(self.bufs[b].1, self.stream) };
        (self.fault)("cuEventRecord (staging)", r);
        self.bufs[b].2 = r == sys::CUresult::CUDA_SUCCESS;
    }
    fn wait(&mut self, b: usize) {
        if self.bufs[b].2 {
            // SAFETY: our event, recorded.
            let r = unsafe { sys::cuEventSynchronize(self.bufs[b].1) };
            (self.fault)("cuEventSynchronize (staging)", r);
        }
    }
}

impl Staging {
    /// [`BUFFERS`] pinned buffers with their events, in the current context; `None` if the
    /// driver refuses (the copy then goes to `cuMemcpyAsync` as it is).
    pub(crate) fn new() -> Option<Staging> {
        let mut s = Staging {
            bufs: Vec::new(),
            pool: HostPool::for_machine(),
        };
        for _ in 0..BUFFERS {
            let mut p = std::ptr::null_mut();
            let mut e = std::ptr::null_mut();
            // SAFETY: valid out-pointers; flag 0: plain pinned memory; 2: no timing.
            unsafe {
                if sys::cuMemHostAlloc(&mut p, CHUNK, 0) != sys::CUresult::CUDA_SUCCESS {
                    return None;
                }
                if sys::cuEventCreate(&mut e, 2) != sys::CUresult::CUDA_SUCCESS {
                    let _ = sys::cuMemFreeHost(p);
                    return None;
                }
            }
            s.bufs.push((p as usize, e, false));
        }
        Some(s)
    }

    /// A staged copy on `stream`; `into_device`: `src` is the pageable side, else `dst`.
    ///
    /// # Safety
    /// Both ranges are live; the pageable one is memory of this process with the access
    /// needed, the other one memory the device reaches.
    pub(crate) unsafe fn copy(
        &mut self,
        stream: sys::CUstream,
        fault: &dyn Fn(&str, sys::CUresult),
        into_device: bool,
        dst: usize,
        src: usize,
        size: usize,
    ) {
        let ptrs: Vec<usize> = self.bufs.iter().map(|b| b.0).collect();
        let mut dma = StreamDma {
            stream,
            bufs: &mut self.bufs,
            fault,
        };
        // SAFETY: forwarded contract; the buffers are ours, CHUNK bytes each.
        unsafe {
            if into_device {
                stage_in(&mut dma, &self.pool, &ptrs, dst, src, size)
            } else {
                stage_out(&mut dma, &self.pool, &ptrs, dst, src, size)
            }
        }
    }
}

impl Drop for Staging {
    /// The caller has synchronized the stream: no DMA uses the buffers any more.
    fn drop(&mut self) {
        for &(p, e, _) in &self.bufs {
            // SAFETY: ours, unused.
            unsafe {
                let _ = sys::cuEventDestroy_v2(e);
                let _ = sys::cuMemFreeHost(p as *mut _);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DMA that copies at once and counts the copies.
    #[derive(Default)]
    struct Fake {
        recorded: Vec<bool>,
        copies: usize,
    }
    impl Dma for Fake {
        fn copy(&mut self, dst: usize, src: usize, len: usize) {
            // SAFETY: the test's buffers.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) };
            self.copies += 1;
        }
        fn record(&mut self, b: usize) {
            self.recorded[b] = true;
        }
        fn wait(&mut self, b: usize) {
            self.recorded[b] = false;
        }
    }

    /// Staged copies in and out carry every byte, for sizes below, at and past multiples of
    /// the chunk, at odd offsets, with one DMA per chunk; the bytes around stay.
    #[test]
    fn staged_copies_carry_every_byte_chunk_by_chunk() {
        let pool = HostPool::new(3);
        let mut bufs: Vec<Vec<u8>> = (0..BUFFERS).map(|_| vec![0u8; CHUNK]).collect();
        let ptrs: Vec<usize> = bufs.iter_mut().map(|b| b.as_mut_ptr() as usize).collect();
        for size in [1usize, 4099, CHUNK, CHUNK + 1, 3 * CHUNK, 4 * CHUNK + 77] {
            let src: Vec<u8> = (0..size + 8).map(|i| (i * 7 + (i >> 13)) as u8).collect();
            for into_device in [true, false] {
                let mut dst = vec![0xeeu8; size + 8];
                let mut dma = Fake {
                    recorded: vec![false; BUFFERS],
                    copies: 0,
                };
                let (d, s) = (dst.as_mut_ptr() as usize + 3, src.as_ptr() as usize + 5);
                // SAFETY: the test's buffers, large enough.
                unsafe {
                    if into_device {
                        stage_in(&mut dma, &pool, &ptrs, d, s, size)
                    } else {
                        stage_out(&mut dma, &pool, &ptrs, d, s, size)
                    }
                }
                assert_eq!(
                    &dst[3..3 + size],
                    &src[5..5 + size],
                    "{size} in {into_device}"
                );
                assert!(dst[..3].iter().chain(&dst[3 + size..]).all(|&b| b == 0xee));
                let chunk = if into_device { IN_CHUNK } else { CHUNK };
                assert_eq!(dma.copies, size.div_ceil(chunk));
            }
        }
    }

    /// The pool's fill and copy split a range over its threads at pattern boundaries.
    #[test]
    fn pool_fill_and_copy_split_at_pattern_boundaries() {
        let pool = HostPool::new(3);
        let n = (5 << 20) + 33;
        let pattern: Vec<u8> = (1..=16).collect();
        let mut a = vec![0u8; n + 4];
        // SAFETY: our buffer.
        unsafe { pool.fill(a.as_mut_ptr() as usize + 1, &pattern, n) };
        assert!(a[1..=n]
            .iter()
            .enumerate()
            .all(|(i, &b)| b == pattern[i % 16]));
        assert_eq!((a[0], a[n + 1]), (0, 0));
        let mut b = vec![0u8; n + 4];
        // SAFETY: our buffers, distinct.
        unsafe { pool.copy(b.as_mut_ptr() as usize, a.as_ptr() as usize, n + 4) };
        assert_eq!(a, b);
    }
}
