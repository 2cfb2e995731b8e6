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

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use cudarc::driver::sys;
use parking_lot::Mutex;

use crate::backend::platform::{futex_wait, futex_wake};

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
/// queued while the host drains one (the way out gains about 10%); the way in stayed where it
/// was, short of the probe by costs of the engine's own. Those found since (issue 20), and
/// removed: a 4 MiB chunk in went to 8 threads, not 12 ([`MIN_PART`]); the pool woke its
/// helpers one send at a time and the caller once per part ([`HostPool`]); the stores were
/// 128-bit ([`HostPool::copy`]); and every queued copy with a `malloc`'d operand read the whole
/// of `/proc/self/maps` (`hetmem_linux::host_protection`). Measured on the H200 on 2026-12-04
/// (three runs each, in turn with the old code switched back in the same build): malloc->device
/// 34.3-38.2 GiB/s (0.75-0.85 of the USM copy) against 31.9-34.9, device->malloc 38.2-44.0
/// (0.82-0.92) against 37.1-40.0. Short of the probe's 38-39 in, the way in is now where the
/// machine's memory puts it; a spin before the waits sleep bought nothing there.
pub(crate) const BUFFERS: usize = 4;
/// Host threads (the dispatch thread included) that copy one chunk or fill one range.
pub(crate) const MAX_HOST_THREADS: usize = 12;
/// The smallest part of a host copy or fill given to a thread of its own. At 512 KiB a 4 MiB
/// chunk into the device went to 8 threads, not [`MAX_HOST_THREADS`]; at 256 KiB it goes to
/// all 12 (341 KiB each), as the C probe (`docs/probes/cuda-staging.c`) splits every chunk.
const MIN_PART: usize = 256 << 10;

/// What a job runs on each of its parts: `work(offset, len)`.
type Work = Arc<dyn Fn(usize, usize) + Send + Sync>;

/// One part of a job, in the slot of the helper that runs it.
struct Part {
    work: Work,
    off: usize,
    len: usize,
}

/// A value alone on its cache lines (two: the prefetcher fetches lines in pairs), so that a
/// thread that writes one does not slow down the threads reading another.
#[repr(align(128))]
#[derive(Default)]
struct Line<T>(T);

/// What a pool's caller and its helpers share. A job is handed out as the probe's pool does it
/// (`docs/probes/cuda-staging.c`: one generation, one broadcast): the caller puts each
/// helper's part in its slot, bumps `generation` and wakes every sleeping helper with one
/// `FUTEX_WAKE`; a helper that finds a part in its slot runs it, and the one that finishes
/// the last part wakes the caller (only if it sleeps).
#[derive(Default)]
struct Shared {
    /// Bumped once per job after the parts are in their slots (and at drop): the helpers
    /// sleep on it (a futex word).
    generation: Line<AtomicU32>,
    /// Helpers sleeping on `generation` or about to: the caller wakes them only then.
    sleepers: Line<AtomicU32>,
    /// Parts handed to helpers and not finished: the caller sleeps on it until 0 (a futex
    /// word). Set before the slots are filled, so no helper counts down before it is set.
    left: Line<AtomicU32>,
    /// Whether the caller sleeps on `left` or is about to: the last part wakes it only then.
    caller_asleep: Line<AtomicBool>,
    /// Set when the pool is dropped.
    quit: AtomicBool,
    /// The payload of the first helper part of the current job that panicked: the caller
    /// raises it once every part is done (as it raises its own part's).
    panicked: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    /// Each helper's part of the current job, if it has one.
    slots: Vec<Line<Mutex<Option<Part>>>>,
}

impl Shared {
    /// A helper's loop: waits for each new generation, runs the part in slot `i` if there is
    /// one, and counts it done.
    fn helper(&self, i: usize) {
        let mut seen = 0;
        loop {
            seen = self.next_generation(seen);
            if self.quit.load(Ordering::Acquire) {
                return;
            }
            // A helper given no part of a job finds its slot empty; one that was late finds
            // the part of the job after (the caller fills slots only once every part handed
            // out before is done, so a slot holds at most one part).
            let Some(part) = self.slots[i].0.lock().take() else {
                continue;
            };
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                (part.work)(part.off, part.len)
            }));
            if let Err(p) = r {
                self.panicked.lock().get_or_insert(p);
            }
            drop(part);
            // SeqCst pairs with the caller's store of `caller_asleep` and load of `left`: the
            // caller either sees 0 or is seen asleep and woken (the futex checks the value).
            if self.left.0.fetch_sub(1, Ordering::SeqCst) == 1
                && self.caller_asleep.0.load(Ordering::SeqCst)
            {
                futex_wake(&self.left.0, 1);
            }
        }
    }

    /// Waits until `generation` is no longer `seen` and returns it.
    fn next_generation(&self, seen: u32) -> u32 {
        loop {
            let g = self.generation.0.load(Ordering::Acquire);
            if g != seen {
                return g;
            }
            // SeqCst pairs with the caller's bump of `generation` and load of `sleepers`.
            self.sleepers.0.fetch_add(1, Ordering::SeqCst);
            if self.generation.0.load(Ordering::SeqCst) == seen {
                futex_wait(&self.generation.0, seen);
            }
            self.sleepers.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The caller's wait for every part handed out to be done.
    fn wait_parts(&self) {
        loop {
            if self.left.0.load(Ordering::Acquire) == 0 {
                return;
            }
            self.caller_asleep.0.store(true, Ordering::SeqCst);
            let v = self.left.0.load(Ordering::SeqCst);
            if v != 0 {
                futex_wait(&self.left.0, v);
            }
            self.caller_asleep.0.store(false, Ordering::Relaxed);
        }
    }
}

/// Helper threads for host copies and fills: a job is cut into parts, the caller runs the
/// first and waits for the rest (see [`Shared`] for the hand-off).
pub(crate) struct HostPool {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Held for the whole of a job: the slots and the count of parts left are one job's at a
    /// time. (An engine's pool has one caller, its dispatch thread; the lock makes a second
    /// caller wait rather than corrupt the hand-off.)
    job: Mutex<()>,
}

impl std::fmt::Debug for HostPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostPool({} helpers)", self.threads.len())
    }
}

impl HostPool {
    /// A pool of `helpers` threads (fewer if the OS refuses some).
    pub(crate) fn new(helpers: usize) -> HostPool {
        let shared = Arc::new(Shared {
            slots: (0..helpers).map(|_| Line::default()).collect(),
            ..Shared::default()
        });
        let mut threads = Vec::new();
        for i in 0..helpers {
            let sh = shared.clone();
            let t = std::thread::Builder::new()
                .name(format!("hetmem-stage{i}"))
                .spawn(move || sh.helper(i));
            match t {
                Ok(t) => threads.push(t),
                Err(_) => break,
            }
        }
        HostPool {
            shared,
            threads,
            job: Mutex::new(()),
        }
    }

    /// The pool the engines use: [`MAX_HOST_THREADS`] threads in all, at most the machine's.
    pub(crate) fn for_machine() -> HostPool {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        HostPool::new(n.clamp(1, MAX_HOST_THREADS) - 1)
    }

    /// Cuts `[0, len)` into at most one part per thread, each at least [`MIN_PART`] bytes and a
    /// multiple of `align` (but the last), and runs `f(offset, part_len)` on each, returning
    /// once all have run. The calling thread runs the first part.
    pub(crate) fn split(
        &self,
        len: usize,
        align: usize,
        f: impl Fn(usize, usize) + Send + Sync + 'static,
    ) {
        // Only the helpers that started (the slots of the others are never read).
        let helpers = self.threads.len();
        let parts = (len / MIN_PART).clamp(1, helpers + 1);
        let step = len.div_ceil(parts).div_ceil(align) * align;
        if step >= len {
            f(0, len);
            return;
        }
        // Parts after the first, one per helper: at most `parts - 1 <= helpers`.
        let given = (len - step).div_ceil(step);
        let _job = self.job.lock();
        let sh = &*self.shared;
        let work: Work = Arc::new(f);
        sh.left.0.store(given as u32, Ordering::SeqCst);
        for (i, slot) in sh.slots[..given].iter().enumerate() {
            let off = (i + 1) * step;
            *slot.0.lock() = Some(Part {
                work: work.clone(),
                off,
                len: step.min(len - off),
            });
        }
        // SeqCst pairs with a helper's increment of `sleepers` and load of `generation`.
        sh.generation.0.fetch_add(1, Ordering::SeqCst);
        if sh.sleepers.0.load(Ordering::SeqCst) > 0 {
            futex_wake(&sh.generation.0, u32::MAX);
        }
        // The helpers run the caller's ranges: wait for them even if our part panics. A
        // panic of any part is the caller's (its own first, else a helper's).
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(0, step)));
        sh.wait_parts();
        let theirs = sh.panicked.lock().take();
        if let Some(p) = mine.err().or(theirs) {
            std::panic::resume_unwind(p);
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
        // No job runs (`split` holds `&self` until its parts are done).
        self.shared.quit.store(true, Ordering::Release);
        self.shared.generation.0.fetch_add(1, Ordering::SeqCst);
        futex_wake(&self.shared.generation.0, u32::MAX);
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
    /// The buffers' addresses (those of `bufs`), for [`stage_in`] / [`stage_out`].
    ptrs: Vec<usize>,
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
            ptrs: Vec::new(),
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
            s.ptrs.push(p as usize);
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
        let ptrs = &self.ptrs;
        let mut dma = StreamDma {
            stream,
            bufs: &mut self.bufs,
            fault,
        };
        // SAFETY: forwarded contract; the buffers are ours, CHUNK bytes each.
        unsafe {
            if into_device {
                stage_in(&mut dma, &self.pool, ptrs, dst, src, size)
            } else {
                stage_out(&mut dma, &self.pool, ptrs, dst, src, size)
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

    /// Runs one split of `len` bytes on `pool` and checks that its parts cover `[0, len)`
    /// once, each a multiple of 64 but the last, each on a thread of its own, as many as
    /// `len` has [`MIN_PART`]s (at least one, at most the pool's threads); `slow` makes the
    /// parts at offsets it picks take a millisecond (so the caller, or the helpers, sleep).
    fn check_split(pool: &HostPool, len: usize, slow: fn(usize) -> bool) {
        let runs = Arc::new(Mutex::new(Vec::new()));
        let r = runs.clone();
        pool.split(len, 64, move |o, n| {
            if slow(o) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            r.lock().push((o, n, std::thread::current().id()));
        });
        let mut v = runs.lock().clone();
        v.sort_by_key(|p| p.0);
        let mut at = 0;
        for &(o, n, _) in &v {
            assert_eq!(o, at, "{len}: {v:?}");
            assert!(n > 0 && (o + n == len || n % 64 == 0), "{len}: {v:?}");
            at += n;
        }
        assert_eq!(at, len);
        let threads: std::collections::HashSet<_> = v.iter().map(|p| p.2).collect();
        assert_eq!(threads.len(), v.len(), "{len}: {v:?}");
        assert_eq!(v.len(), (len / MIN_PART).clamp(1, pool.threads.len() + 1));
    }

    /// Job after job, each part runs once on a thread of its own, for jobs of one part up to
    /// more parts than the pool has threads (helpers given no part of one job and a part of
    /// the next), with the caller or the helpers finishing last, and with pauses between jobs
    /// in which the helpers go to sleep.
    #[test]
    fn the_pool_runs_every_part_once_job_after_job() {
        let pool = HostPool::new(5);
        let lens = [
            1,
            MIN_PART,
            2 * MIN_PART + 1,
            3 * MIN_PART,
            7 * MIN_PART + 5,
            64 * MIN_PART,
        ];
        for k in 0..3000 {
            check_split(&pool, lens[k % lens.len()], |_| false);
        }
        for k in 0..60 {
            let len = lens[k % lens.len()];
            check_split(&pool, len, |o| o == 0);
            check_split(&pool, len, |o| o != 0);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// A part that panics, on a helper or on the caller, ends neither the pool nor the wait for
    /// the other parts: the panic is raised in the caller once every part is done, and the
    /// next job runs whole.
    #[test]
    fn a_panicking_part_leaves_the_pool_working() {
        let pool = HostPool::new(3);
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for panics_at in [MIN_PART, 0] {
            let d = done.clone();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                pool.split(4 * MIN_PART, 64, move |o, _| {
                    if o == panics_at {
                        panic!("part at {o}");
                    }
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    d.fetch_add(1, Ordering::SeqCst);
                })
            }));
            assert!(r.is_err(), "the part at {panics_at} panicked");
            assert_eq!(done.swap(0, Ordering::SeqCst), 3);
            check_split(&pool, 4 * MIN_PART, |_| false);
        }
    }

    /// A helper's part that panics reaches the caller with its own payload (a copy that
    /// panicked half-way never reads as done), and only once: the job after it returns.
    #[test]
    fn a_panic_in_a_helpers_part_reaches_the_caller() {
        let pool = HostPool::new(3);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.split(4 * MIN_PART, 64, |o, _| {
                if o == 2 * MIN_PART {
                    std::panic::panic_any(o);
                }
            })
        }));
        let payload = r.expect_err("the helper's panic");
        assert_eq!(payload.downcast_ref::<usize>(), Some(&(2 * MIN_PART)));
        let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.split(4 * MIN_PART, 64, |_, _| {})
        }));
        assert!(again.is_ok(), "the panic was raised twice");
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
