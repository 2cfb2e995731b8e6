//! Memory copies of the platform: [`stream_copy`], the copy with non-temporal (streaming)
//! stores that the host backend's copy engine migrates managed pages with, public so that a
//! benchmark can measure it as a raw baseline (`hetmem bench managed`), and
//! [`stream_copy_any`], streaming stores at any alignment and length (the cuda backend's copies
//! into pinned staging buffers). No OS call; nothing of the specs.

/// Copies `len` bytes from `src` to `dst` (not overlapping), as a copy engine would: with
/// non-temporal (streaming) stores that bypass the cache when `dst` is 16-byte aligned and `len`
/// a multiple of 64, so a migrated page neither pollutes the cache nor reads its destination
/// first (on x86_64; `memcpy` elsewhere and for the unaligned case).
///
/// Lengths that are a multiple of 16 KiB are copied four 4 KiB pages at a time, interleaved a
/// cache line from each, with software prefetch of the source (as glibc's `memcpy` does for
/// copies larger than the cache): four streams keep more loads in flight than one, which the
/// hardware prefetcher (tracking 4 KiB pages) does not do across a page boundary. Measured on
/// the project's 2-core Xeon: a 2 MiB page at 0.99-1.03x a 1 GiB `memcpy`, against 0.76-0.82x
/// for the plain streaming loop.
///
/// # Safety
/// `src` is readable and `dst` writable for `len` bytes, and they do not overlap.
pub unsafe fn stream_copy(dst: usize, src: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if dst.is_multiple_of(16) && len.is_multiple_of(64) {
        use std::arch::x86_64::{
            __m128i, _mm_loadu_si128, _mm_prefetch, _mm_sfence, _mm_stream_si128, _MM_HINT_T0,
        };
        let (d, s) = (dst as *mut u8, src as *const u8);
        /// Copies the 64 bytes at offset `o` with streaming stores.
        ///
        /// # Safety
        /// `o + 64 <= len`; `d + o` is 16-byte aligned.
        #[inline(always)]
        unsafe fn line(d: *mut u8, s: *const u8, o: usize) {
            // SAFETY: the caller's bounds; the stores are 16-byte aligned; SSE2 is part of
            // x86_64.
            unsafe {
                let a = _mm_loadu_si128(s.add(o) as *const __m128i);
                let b = _mm_loadu_si128(s.add(o + 16) as *const __m128i);
                let c = _mm_loadu_si128(s.add(o + 32) as *const __m128i);
                let e = _mm_loadu_si128(s.add(o + 48) as *const __m128i);
                _mm_stream_si128(d.add(o) as *mut __m128i, a);
                _mm_stream_si128(d.add(o + 16) as *mut __m128i, b);
                _mm_stream_si128(d.add(o + 32) as *mut __m128i, c);
                _mm_stream_si128(d.add(o + 48) as *mut __m128i, e);
            }
        }
        const STRIDE: usize = 4096;
        const BLOCK: usize = 4 * STRIDE;
        let mut i = 0;
        if len.is_multiple_of(BLOCK) {
            while i < len {
                let mut off = 0;
                while off < STRIDE {
                    for p in 0..4 {
                        let o = i + p * STRIDE + off;
                        // SAFETY: a prefetch never faults, whatever the address; `o + 64 <=
                        // len` since `i + BLOCK <= len`; `d + o` is 16-byte aligned (d, i, off
                        // and the stride are).
                        unsafe {
                            _mm_prefetch(s.wrapping_add(o + 256) as *const i8, _MM_HINT_T0);
                            line(d, s, o);
                        }
                    }
                    off += 64;
                }
                i += BLOCK;
            }
        } else {
            while i < len {
                // SAFETY: i + 64 <= len; dst and i are 16-byte aligned.
                unsafe { line(d, s, i) };
                i += 64;
            }
        }
        // Streaming stores are weakly ordered: fence before anyone else may read the bytes.
        // SAFETY: SSE2 is part of x86_64.
        unsafe { _mm_sfence() };
        return;
    }
    // SAFETY: forwarded contract.
    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) };
}

/// Copies `len` bytes from `src` to `dst` (not overlapping) with non-temporal (streaming)
/// stores at any alignment and length: the bytes up to the first 64-byte boundary of `dst` and
/// those past the last whole 128-byte block are copied with `memcpy`, the blocks between with
/// streaming stores (256-bit with AVX2, found at run time, else 128-bit), each block read with
/// unaligned loads, then one `sfence`. Copies below 256 bytes are a plain `memcpy`; so is
/// everything off x86_64.
///
/// For a destination that is read next by someone else (a DMA out of a pinned buffer), not by
/// this CPU: the stores neither read the destination's lines first nor leave them in the cache.
/// The loop is the one of the C probe of the cuda backend's staging
/// (`docs/probes/cuda-staging.c`); unlike [`stream_copy`] it takes any alignment and length
/// without falling back to `memcpy` for the whole range, and it does not interleave pages or
/// prefetch.
///
/// # Safety
/// `src` is readable and `dst` writable for `len` bytes, and they do not overlap.
pub unsafe fn stream_copy_any(dst: usize, src: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= 256 {
        let wide = std::arch::is_x86_feature_detected!("avx2");
        // SAFETY: forwarded contract; AVX2 only where the CPU has it.
        unsafe { x86::stream_copy_any(dst, src, len, wide) };
        return;
    }
    // SAFETY: forwarded contract.
    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) };
}

/// The x86_64 loops of [`stream_copy_any`].
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm256_loadu_si256, _mm256_stream_si256, _mm_loadu_si128, _mm_sfence,
        _mm_stream_si128,
    };

    /// Bytes per iteration of the streaming loops.
    const BLOCK: usize = 128;

    /// [`super::stream_copy_any`] for `len >= 256`, with 256-bit stores if `wide`.
    ///
    /// # Safety
    /// As `stream_copy_any`; `wide` only where the CPU has AVX2.
    pub(crate) unsafe fn stream_copy_any(dst: usize, src: usize, len: usize, wide: bool) {
        debug_assert!(len >= 2 * BLOCK);
        // Up to the first 64-byte boundary of the destination (less than 64 bytes, so at
        // least one whole block is left: len >= 256).
        let head = dst.wrapping_neg() & 63;
        let (d, s, n) = (dst + head, src + head, len - head);
        let body = n - n % BLOCK;
        // SAFETY: the caller's ranges: [0, head), [head, head + body) and the rest lie inside
        // them; `d` is 64-byte aligned and `body` a multiple of BLOCK; AVX2 only if `wide`.
        unsafe {
            std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, head);
            if wide {
                body_avx2(d, s, body);
            } else {
                body_sse2(d, s, body);
            }
            std::ptr::copy_nonoverlapping((s + body) as *const u8, (d + body) as *mut u8, n - body);
            // Streaming stores are weakly ordered: fence before anyone else may read the bytes.
            _mm_sfence();
        }
    }

    /// Streaming copy of `n` bytes (a multiple of [`BLOCK`]) with 256-bit stores.
    ///
    /// # Safety
    /// `s` readable and `d` writable for `n` bytes, not overlapping; `d` 32-byte aligned; the
    /// CPU has AVX2.
    #[target_feature(enable = "avx2")]
    unsafe fn body_avx2(d: usize, s: usize, n: usize) {
        let (d, s) = (d as *mut u8, s as *const u8);
        let mut i = 0;
        while i < n {
            // SAFETY: i + BLOCK <= n: the caller's ranges; the stores are 32-byte aligned (d
            // and i are); loads may be unaligned.
            unsafe {
                let a = _mm256_loadu_si256(s.add(i) as *const __m256i);
                let b = _mm256_loadu_si256(s.add(i + 32) as *const __m256i);
                let c = _mm256_loadu_si256(s.add(i + 64) as *const __m256i);
                let e = _mm256_loadu_si256(s.add(i + 96) as *const __m256i);
                _mm256_stream_si256(d.add(i) as *mut __m256i, a);
                _mm256_stream_si256(d.add(i + 32) as *mut __m256i, b);
                _mm256_stream_si256(d.add(i + 64) as *mut __m256i, c);
                _mm256_stream_si256(d.add(i + 96) as *mut __m256i, e);
            }
            i += BLOCK;
        }
    }

    /// As [`body_avx2`] with 128-bit stores (SSE2, part of x86_64).
    ///
    /// # Safety
    /// `s` readable and `d` writable for `n` bytes, not overlapping; `d` 16-byte aligned.
    unsafe fn body_sse2(d: usize, s: usize, n: usize) {
        let (d, s) = (d as *mut u8, s as *const u8);
        let mut i = 0;
        while i < n {
            for k in (0..BLOCK).step_by(64) {
                // SAFETY: i + k + 64 <= n: the caller's ranges; the stores are 16-byte aligned
                // (d, i and k are).
                unsafe {
                    let o = i + k;
                    let a = _mm_loadu_si128(s.add(o) as *const __m128i);
                    let b = _mm_loadu_si128(s.add(o + 16) as *const __m128i);
                    let c = _mm_loadu_si128(s.add(o + 32) as *const __m128i);
                    let e = _mm_loadu_si128(s.add(o + 48) as *const __m128i);
                    _mm_stream_si128(d.add(o) as *mut __m128i, a);
                    _mm_stream_si128(d.add(o + 16) as *mut __m128i, b);
                    _mm_stream_si128(d.add(o + 32) as *mut __m128i, c);
                    _mm_stream_si128(d.add(o + 48) as *mut __m128i, e);
                }
            }
            i += BLOCK;
        }
    }
}

#[cfg(test)]
mod tests {
    /// Copies `len` bytes from offset `so` of a source to offset `dof` of a destination with
    /// `copy`, and checks that exactly those bytes were carried and none around them touched.
    fn check(copy: &dyn Fn(usize, usize, usize), len: usize, dof: usize, so: usize) {
        let src: Vec<u8> = (0..len + so + 64)
            .map(|i| (i as u32).wrapping_mul(2654435761).rotate_right(13) as u8 | 1)
            .collect();
        let mut dst = vec![0u8; len + dof + 64];
        copy(
            dst.as_mut_ptr() as usize + dof,
            src.as_ptr() as usize + so,
            len,
        );
        assert!(
            dst[..dof].iter().all(|&b| b == 0),
            "before: len {len} dst+{dof} src+{so}"
        );
        assert_eq!(
            &dst[dof..dof + len],
            &src[so..so + len],
            "len {len} dst+{dof} src+{so}"
        );
        assert!(
            dst[dof + len..].iter().all(|&b| b == 0),
            "after: len {len} dst+{dof} src+{so}"
        );
    }

    /// Lengths that exercise every head (0..64 bytes to the destination's boundary) and every
    /// tail (0..=130 bytes past the last block), below and past the 256-byte threshold; one
    /// long one of the staging's part size (349,568 bytes) and one odd megabyte.
    fn lengths() -> Vec<usize> {
        let mut v: Vec<usize> = (0..=300).collect();
        for base in [1024usize, 4096] {
            v.extend((0..=130).map(|t| base + t));
        }
        v.extend([349568, 349568 + 63, (1 << 20) + 77]);
        v
    }

    /// `stream_copy_any` carries every byte for every length up to 300 and every tail of
    /// larger copies, at destination offsets across 64 bytes and source offsets 0..32 apart
    /// from them; the bytes around the destination stay untouched.
    #[test]
    fn stream_copy_any_carries_every_byte_at_any_alignment_and_length() {
        // SAFETY (the closure): `check` passes ranges of its own buffers, not overlapping.
        let copy = |d, s, n| unsafe { super::stream_copy_any(d, s, n) };
        for len in lengths() {
            for dof in [0usize, 1, 7, 15, 16, 31, 32, 33, 48, 63] {
                for so in [0usize, 1, 3, 16, 17, 31, 32] {
                    check(&copy, len, dof, (dof + so) % 64);
                }
            }
        }
    }

    /// The same over both x86_64 loops: 128-bit stores always, 256-bit where the CPU has AVX2.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn both_streaming_loops_carry_every_byte() {
        let mut loops = vec![false];
        if std::arch::is_x86_feature_detected!("avx2") {
            loops.push(true);
        }
        for wide in loops {
            // SAFETY (the closure): `check` passes ranges of its own buffers, not overlapping;
            // AVX2 only where detected.
            let copy = |d, s, n| unsafe { super::x86::stream_copy_any(d, s, n, wide) };
            for len in lengths().into_iter().filter(|&n| (256..=8192).contains(&n)) {
                for dof in 0..64 {
                    for so in [0usize, 5, 16, 40] {
                        check(&copy, len, dof, so);
                    }
                }
            }
        }
    }
}
