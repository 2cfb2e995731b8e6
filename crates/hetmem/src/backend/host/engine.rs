//! Host device engines: one worker thread per engine, executing submitted [`EngineOp`]s in
//! order. The CUDA equivalents: an engine is a stream (`cuStreamCreate`), `Copy` is
//! `cuMemcpyAsync`, `Fill` is `cuMemsetD8Async` / `cuMemsetD32Async` (or a pattern copy), `Wait`
//! is `cuStreamWaitEvent`, `Signal` is `cuEventRecord`, `Host` is `cuLaunchHostFunc`.
//!
//! Copies are `memmove` (`std::ptr::copy`), fills are `memset` (`std::ptr::write_bytes`) for
//! one-byte patterns; longer patterns are stored from SSE2 registers on x86_64 (streaming
//! stores past 4 MiB, as `memset` does) and by a doubling `memcpy` of the pattern elsewhere
//! and for small fills.

use crate::backend::dispatch::{Closing, Dispatcher};
use crate::backend::{Engine, EngineOp, Result};

/// A worker thread executing batches of operations in submission order.
#[derive(Debug)]
pub struct HostEngine(Dispatcher);

impl HostEngine {
    /// Starts the worker thread, named `hetmem-dev{device}`.
    pub fn new(device: u32) -> Result<HostEngine> {
        Ok(HostEngine(Dispatcher::spawn(
            format!("hetmem-dev{device}"),
            run,
        )?))
    }
}

fn run(rx: std::sync::mpsc::Receiver<Vec<EngineOp>>, closing: Closing) {
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
                EngineOp::Wait(s) => abandoned = abandoned || closing.wait(s.as_ref()),
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
    #[cfg(target_arch = "x86_64")]
    if size >= WIDE_FILL_MIN && WIDE_BLOCK.is_multiple_of(pattern.len()) {
        // SAFETY: forwarded contract.
        unsafe { fill_wide(dst, pattern, size) };
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

/// Bytes of one block of [`fill_wide`]: a multiple of every pattern length (powers of two up to
/// 128).
#[cfg(target_arch = "x86_64")]
const WIDE_BLOCK: usize = 128;
/// Fills from this size up are written from registers (below, the doubling copy is as fast).
#[cfg(target_arch = "x86_64")]
const WIDE_FILL_MIN: usize = 4096;
/// Fills from this size up use non-temporal stores, as `memset` does for sizes well past the
/// caches: no read-for-ownership of lines that are only overwritten.
#[cfg(target_arch = "x86_64")]
const STREAM_FILL_MIN: usize = 4 << 20;

/// Fills `size` bytes at `dst` with `pattern` (whose length divides [`WIDE_BLOCK`]) repeated,
/// storing 128-byte blocks from SSE2 registers (16-byte aligned; streaming stores for large
/// fills), so no byte of the destination is read: the speed of `memset` for any pattern.
///
/// # Safety
/// `[dst, dst+size)` is writable memory; `pattern` is not inside it.
#[cfg(target_arch = "x86_64")]
unsafe fn fill_wide(dst: *mut u8, pattern: &[u8], size: usize) {
    use std::arch::x86_64::{
        __m128i, _mm_loadu_si128, _mm_sfence, _mm_store_si128, _mm_stream_si128,
    };
    let plen = pattern.len();
    // Bytes up to the first 16-byte boundary, one at a time with the right phase.
    let head = dst.align_offset(16).min(size);
    for i in 0..head {
        // SAFETY: i < size.
        unsafe { *dst.add(i) = pattern[i % plen] };
    }
    // The pattern as it continues at dst + head, one whole block (WIDE_BLOCK % plen == 0, so
    // every later block has the same phase).
    let mut block = [0u8; WIDE_BLOCK];
    for (j, b) in block.iter_mut().enumerate() {
        *b = pattern[(head + j) % plen];
    }
    // SAFETY: SSE2 is part of x86_64; the loads read inside `block`.
    let regs: [__m128i; WIDE_BLOCK / 16] =
        std::array::from_fn(|k| unsafe { _mm_loadu_si128(block.as_ptr().add(16 * k).cast()) });
    let blocks = (size - head) / WIDE_BLOCK;
    // SAFETY: dst + head is 16-byte aligned and the blocks lie inside the range.
    unsafe {
        let mut p = dst.add(head);
        if size >= STREAM_FILL_MIN {
            for _ in 0..blocks {
                for (k, r) in regs.iter().enumerate() {
                    _mm_stream_si128(p.add(16 * k).cast(), *r);
                }
                p = p.add(WIDE_BLOCK);
            }
            // Streaming stores are weakly ordered: fence them before anyone is told.
            _mm_sfence();
        } else {
            for _ in 0..blocks {
                for (k, r) in regs.iter().enumerate() {
                    _mm_store_si128(p.add(16 * k).cast(), *r);
                }
                p = p.add(WIDE_BLOCK);
            }
        }
    }
    for i in head + blocks * WIDE_BLOCK..size {
        // SAFETY: i < size.
        unsafe { *dst.add(i) = pattern[i % plen] };
    }
}

impl Engine for HostEngine {
    unsafe fn submit(&self, ops: Vec<EngineOp>) {
        self.0.submit(ops);
    }
}

#[cfg(test)]
mod tests {
    use super::fill;

    #[test]
    fn fill_repeats_every_pattern_at_every_alignment_and_size() {
        let sizes = [
            0,
            1,
            15,
            17,
            127,
            129,
            4095,
            4096,
            4097,
            70_001,
            (4 << 20) + 33,
        ];
        let mut buf = vec![0u8; (4 << 20) + 256];
        let mut plen = 1;
        while plen <= 128 {
            let pattern: Vec<u8> = (0..plen)
                .map(|i| (i as u8).wrapping_mul(13) ^ 0x5a)
                .collect();
            for off in [0, 1, 7, 16, 33] {
                for &size in &sizes {
                    buf.fill(0xEE);
                    // SAFETY: off + size is inside buf.
                    unsafe { fill(buf.as_mut_ptr().add(off), &pattern, size) };
                    assert!(buf[..off].iter().all(|&b| b == 0xEE), "{plen} {off} {size}");
                    for i in 0..size {
                        assert_eq!(buf[off + i], pattern[i % plen], "{plen} {off} {size} {i}");
                    }
                    assert!(
                        buf[off + size..].iter().all(|&b| b == 0xEE),
                        "{plen} {off} {size}"
                    );
                }
            }
            plen *= 2;
        }
    }
}
