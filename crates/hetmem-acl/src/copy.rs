//! Memory calls beyond [`crate::memory`]: the `aclrtMalloc*` / `aclrtFree*` variants, the 2-D
//! and batch copies, 32-bit fills and the copy with a condition. Each does what the core call
//! does (through the same hetmem calls), with the variant's own arguments checked by
//! [`hetmem::acl_ext`].

use std::sync::Arc;

use crate::state::{self, Ctx};
use crate::{entry, null, out, AclError, Res};

/// `aclrtMallocAttribute` (12 bytes): the attribute and its 8-byte value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AclMallocAttribute {
    /// `aclrtMallocAttrType`: RSV 0, MODULE_ID 1, DEVICE_ID 2, VA_FLAG 3.
    pub attr: u32,
    /// `aclrtMallocAttrValue` (`moduleId`, `deviceId`, `vaFlag` or `rsv[8]`).
    pub value: [u32; 2],
}

/// `aclrtMallocConfig` (16 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AclMallocConfig {
    /// `attrs`.
    pub attrs: *const AclMallocAttribute,
    /// `numAttrs`.
    pub num_attrs: usize,
}

/// `aclrtMemcpyBatchAttr` (32 bytes): destination and source locations, 16 reserved bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AclMemcpyBatchAttr {
    /// `dstLoc` (`id`, `type`).
    pub dst_loc: [u32; 2],
    /// `srcLoc`.
    pub src_loc: [u32; 2],
    /// `rsv`.
    pub rsv: [u8; 16],
}

fn malloc_on(c: &Arc<Ctx>, dev: Option<hetmem::Device>, size: usize, policy: u32) -> Res<usize> {
    hetmem::acl::check_nonzero(size, "size")?;
    hetmem::spec::MallocPolicy::from_raw(policy)?;
    let d = dev.unwrap_or_else(|| c.dev.clone());
    Ok(c.ctx.alloc_device(&d, &hetmem::AllocDesc::new(size))?)
}

fn malloc_entry(
    name: &'static str,
    dev_ptr: *mut *mut libc::c_void,
    size: usize,
    policy: u32,
    cfg: *const AclMallocConfig,
) -> AclError {
    entry(name, || {
        let g = state::fast_global()?;
        if dev_ptr.is_null() {
            return Err(null("devPtr"));
        }
        let c = g.current()?;
        let mut dev = None;
        if !cfg.is_null() {
            // SAFETY: non-null, the caller's struct.
            let cfg = unsafe { cfg.read_unaligned() };
            if cfg.num_attrs > 0 && cfg.attrs.is_null() {
                return Err(null("cfg->attrs"));
            }
            for i in 0..cfg.num_attrs {
                // SAFETY: an array of `num_attrs` attributes (the caller's contract).
                let a = unsafe { cfg.attrs.add(i).read_unaligned() };
                match a.attr {
                    0 | 1 => {} // reserved, module id: nothing to do here
                    2 => dev = Some(g.device(a.value[0] as i64)?),
                    3 if a.value[0] == 0 => {}
                    3 => {
                        return Err(hetmem::Error::UnsupportedFeature(format!(
                            "vaFlag {:#x}: hetmem places device memory at addresses of its own",
                            a.value[0]
                        ))
                        .into())
                    }
                    t => {
                        return Err(hetmem::Error::UnsupportedEnumeration(format!(
                            "attrs[{i}].attr {t} is not an aclrtMallocAttrType (0..=3)"
                        ))
                        .into())
                    }
                }
            }
        }
        let p = malloc_on(c, dev, size, policy)?;
        // SAFETY: non-null out-pointer.
        unsafe { out(dev_ptr, p as *mut libc::c_void) };
        Ok(())
    })
}

/// `aclrtMallocAlign32`: as `aclrtMalloc` (hetmem aligns device memory to its page size,
/// far more than 32 bytes, with no padding).
///
/// Errors: those of `aclrtMalloc`.
#[no_mangle]
pub extern "C" fn aclrtMallocAlign32(
    dev_ptr: *mut *mut libc::c_void,
    size: usize,
    policy: u32,
) -> AclError {
    malloc_entry(
        "aclrtMallocAlign32",
        dev_ptr,
        size,
        policy,
        std::ptr::null(),
    )
}

/// `aclrtMallocCached`: as `aclrtMalloc` (device memory here has one caching mode).
///
/// Errors: those of `aclrtMalloc`.
#[no_mangle]
pub extern "C" fn aclrtMallocCached(
    dev_ptr: *mut *mut libc::c_void,
    size: usize,
    policy: u32,
) -> AclError {
    malloc_entry("aclrtMallocCached", dev_ptr, size, policy, std::ptr::null())
}

/// `aclrtMallocWithCfg`: as `aclrtMalloc`; `cfg` may be NULL. Attributes: `DEVICE_ID` places
/// the memory on that device; `MODULE_ID` and `RSV` are accepted and not used; `VA_FLAG` 0 is
/// accepted, another value is `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000).
///
/// Errors: those of `aclrtMalloc`; `ACL_ERROR_RT_PARAM_INVALID` (107000) for an attribute that
/// is not an `aclrtMallocAttrType` or a device id that is not a device.
#[no_mangle]
pub extern "C" fn aclrtMallocWithCfg(
    dev_ptr: *mut *mut libc::c_void,
    size: usize,
    policy: u32,
    cfg: *const AclMallocConfig,
) -> AclError {
    malloc_entry("aclrtMallocWithCfg", dev_ptr, size, policy, cfg)
}

/// `aclrtMallocForTaskScheduler`: as [`aclrtMallocWithCfg`] (device memory of the current
/// device; hetmem has no memory of its own for a task scheduler).
#[no_mangle]
pub extern "C" fn aclrtMallocForTaskScheduler(
    dev_ptr: *mut *mut libc::c_void,
    size: usize,
    policy: u32,
    cfg: *const AclMallocConfig,
) -> AclError {
    malloc_entry("aclrtMallocForTaskScheduler", dev_ptr, size, policy, cfg)
}

/// `aclrtMallocHostWithCfg`: as `aclrtMallocHost`; `cfg` may be NULL and its attributes are
/// accepted and not used.
///
/// Errors: those of `aclrtMallocHost`.
#[no_mangle]
pub unsafe extern "C" fn aclrtMallocHostWithCfg(
    ptr: *mut *mut libc::c_void,
    size: u64,
    _cfg: *const AclMallocConfig,
) -> AclError {
    entry("aclrtMallocHostWithCfg", || {
        let g = state::fast_global()?;
        if ptr.is_null() {
            return Err(null("ptr"));
        }
        hetmem::acl::check_nonzero(size as usize, "size")?;
        let c = g.current()?;
        let p = c
            .ctx
            .alloc_host(&hetmem::AllocDesc::new(size as usize).relaxed_max_size(true))?;
        // SAFETY: non-null out-pointer.
        unsafe { out(ptr, p as *mut libc::c_void) };
        Ok(())
    })
}

/// Waits for every stream of the current device (`aclrtSynchronizeDevice`'s work).
fn sync_device(g: &state::G) -> Res {
    let dev = g.current()?.dev.ordinal();
    let streams: Vec<Arc<crate::stream::AclStream>> = {
        let reg = g.reg.lock();
        let mut v: Vec<_> = reg
            .all::<crate::stream::AclStream>()
            .filter(|s| s.ctx.dev.ordinal() == dev)
            .collect();
        for c in reg.contexts.values().filter(|c| c.dev.ordinal() == dev) {
            if let Some(s) = c.default_stream.lock().clone().and_then(state::downcast) {
                v.push(s);
            }
        }
        v
    };
    for s in streams {
        s.synchronize()?;
    }
    Ok(())
}

/// `aclrtFreeWithDevSync`: waits for the current device's streams, then frees as `aclrtFree`.
///
/// Errors: the first error of the streams' work; those of `aclrtFree` (nothing freed).
#[no_mangle]
pub extern "C" fn aclrtFreeWithDevSync(dev_ptr: *mut libc::c_void) -> AclError {
    entry("aclrtFreeWithDevSync", || {
        let g = state::fast_global()?;
        let p = dev_ptr as usize;
        if p == 0 {
            return Err(null("devPtr"));
        }
        sync_device(&g)?;
        let c = g.current()?;
        if c.ctx.is_managed(p) {
            return Ok(c.ctx.free_managed(p)?);
        }
        let props = c.ctx.get_allocation_properties(p)?;
        hetmem::acl::check_free_kind(p, props.memory_type, false)?;
        Ok(c.ctx.free_memory(p)?)
    })
}

/// `aclrtFreeHostWithDevSync`: waits for the current device's streams, then frees as
/// `aclrtFreeHost`.
///
/// Errors: the first error of the streams' work; those of `aclrtFreeHost`.
#[no_mangle]
pub extern "C" fn aclrtFreeHostWithDevSync(host_ptr: *mut libc::c_void) -> AclError {
    entry("aclrtFreeHostWithDevSync", || {
        let g = state::fast_global()?;
        let p = host_ptr as usize;
        if p == 0 {
            return Err(null("hostPtr"));
        }
        sync_device(&g)?;
        let c = g.current()?;
        let props = c.ctx.get_allocation_properties(p)?;
        hetmem::acl::check_free_kind(p, props.memory_type, true)?;
        Ok(c.ctx.free_memory(p)?)
    })
}

/// `aclrtMemcpyAsyncWithCondition` (deprecated by CANN for `aclrtMemcpyAsync`): as
/// `aclrtMemcpyAsync` (every memory here is the runtime's or managed, so the copy is always
/// stream-ordered).
///
/// Errors: those of `aclrtMemcpyAsync`.
#[no_mangle]
pub extern "C" fn aclrtMemcpyAsyncWithCondition(
    dst: *mut libc::c_void,
    dest_max: usize,
    src: *const libc::c_void,
    count: usize,
    kind: u32,
    stream: *mut libc::c_void,
) -> AclError {
    entry("aclrtMemcpyAsyncWithCondition", || {
        let g = state::fast_global()?;
        if dst.is_null() || src.is_null() {
            return Err(null(if dst.is_null() { "dst" } else { "src" }));
        }
        hetmem::acl::check_count(count, dest_max, "destMax")?;
        hetmem::spec::MemcpyKind::from_raw(kind)?;
        g.stream(stream as usize)?
            .memcpy(dst as usize, src as usize, count)
    })
}

/// `aclrtMemcpy2d`: copies `height` rows of `width` bytes, rows `spitch` bytes apart at `src`
/// and `dpitch` apart at `dst`, host-synchronously, each row as `aclrtMemcpy` copies.
///
/// Errors (checked before any row is copied): `ACL_ERROR_INVALID_PARAM` (100000) for a null
/// pointer, width or height 0, a width over a pitch; `ACL_ERROR_RT_PARAM_INVALID` (107000)
/// for a kind that is not an `aclrtMemcpyKind`; then those of the row copies (107000 for
/// memory not mapped with the access needed: earlier rows stay copied).
#[no_mangle]
pub extern "C" fn aclrtMemcpy2d(
    dst: *mut libc::c_void,
    dpitch: usize,
    src: *const libc::c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: u32,
) -> AclError {
    entry("aclrtMemcpy2d", || {
        let g = state::fast_global()?;
        if dst.is_null() || src.is_null() {
            return Err(null(if dst.is_null() { "dst" } else { "src" }));
        }
        let rows = hetmem::acl_ext::rows_2d(dpitch, spitch, width, height)?;
        hetmem::spec::MemcpyKind::from_raw(kind)?;
        let c = g.current()?;
        for (d, s) in rows {
            // SAFETY: aclrtMemcpy2d's contract: the C caller owns both matrices.
            unsafe {
                c.ctx
                    .host_memcpy(dst as usize + d, src as usize + s, width)?
            };
        }
        Ok(())
    })
}

/// `aclrtMemcpy2dAsync`: as [`aclrtMemcpy2d`], each row in order on `stream` (NULL: the
/// default stream) as `aclrtMemcpyAsync` copies.
///
/// Errors: as [`aclrtMemcpy2d`]; `ACL_ERROR_RT_PARAM_INVALID` (107000) for a stream that is
/// not live.
#[no_mangle]
pub extern "C" fn aclrtMemcpy2dAsync(
    dst: *mut libc::c_void,
    dpitch: usize,
    src: *const libc::c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: u32,
    stream: *mut libc::c_void,
) -> AclError {
    entry("aclrtMemcpy2dAsync", || {
        let g = state::fast_global()?;
        if dst.is_null() || src.is_null() {
            return Err(null(if dst.is_null() { "dst" } else { "src" }));
        }
        let rows = hetmem::acl_ext::rows_2d(dpitch, spitch, width, height)?;
        hetmem::spec::MemcpyKind::from_raw(kind)?;
        let s = g.stream(stream as usize)?;
        for (d, o) in rows {
            s.memcpy(dst as usize + d, src as usize + o, width)?;
        }
        Ok(())
    })
}

/// The copies of a batch call, checked: `(dst, src, size)` each.
///
/// # Safety
/// The arrays hold `n` entries (and `num_attrs` for the attributes), the caller's contract.
#[allow(clippy::too_many_arguments)]
unsafe fn batch(
    dsts: *const *mut libc::c_void,
    dest_maxs: *const usize,
    srcs: *const *mut libc::c_void,
    sizes: *const usize,
    n: usize,
    attrs: *const AclMemcpyBatchAttr,
    attrs_indexes: *const usize,
    num_attrs: usize,
) -> Res<Vec<(usize, usize, usize)>> {
    for (p, what) in [
        (dsts as usize, "dsts"),
        (dest_maxs as usize, "destMaxs"),
        (srcs as usize, "srcs"),
        (sizes as usize, "sizes"),
        (attrs as usize, "attrs"),
        (attrs_indexes as usize, "attrsIndexes"),
    ] {
        if p == 0 {
            return Err(null(what));
        }
    }
    // SAFETY: `num_attrs` indexes (the caller's contract), checked non-null above.
    let idx = unsafe { std::slice::from_raw_parts(attrs_indexes, num_attrs) };
    hetmem::acl_ext::check_batch(n, idx)?;
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: `n` entries each (the caller's contract).
        let (d, m, s, c) = unsafe {
            (
                *dsts.add(i) as usize,
                *dest_maxs.add(i),
                *srcs.add(i) as usize,
                *sizes.add(i),
            )
        };
        if d == 0 || s == 0 {
            return Err(null(if d == 0 { "dsts[i]" } else { "srcs[i]" }));
        }
        hetmem::acl::check_count(c, m, "destMaxs[i]")?;
        v.push((d, s, c));
    }
    Ok(v)
}

/// `aclrtMemcpyBatch`: `numBatches` host-synchronous copies (`dsts[i]` <- `srcs[i]`, `sizes[i]`
/// bytes, at most `destMaxs[i]`), in order, each as `aclrtMemcpy` copies; the locations of the
/// attributes are not needed (pointers decide). `*failIndex` is the index of the copy that
/// failed, or `SIZE_MAX` when all were copied or the error is no copy's.
///
/// Errors (argument errors before any copy): `ACL_ERROR_INVALID_PARAM` (100000) for a null
/// array or pointer, 0 copies or attributes, a size over its `destMax`;
/// `ACL_ERROR_RT_PARAM_INVALID` (107000) for bad attribute indexes; then the first failing
/// copy's error (earlier copies stay done).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn aclrtMemcpyBatch(
    dsts: *const *mut libc::c_void,
    dest_maxs: *const usize,
    srcs: *const *mut libc::c_void,
    sizes: *const usize,
    num_batches: usize,
    attrs: *const AclMemcpyBatchAttr,
    attrs_indexes: *const usize,
    num_attrs: usize,
    fail_index: *mut usize,
) -> AclError {
    entry("aclrtMemcpyBatch", || {
        if fail_index.is_null() {
            return Err(null("failIndex"));
        }
        // SAFETY: non-null out-pointer.
        unsafe { out(fail_index, usize::MAX) };
        // SAFETY: the caller's arrays.
        unsafe {
            batch_sync(
                dsts,
                dest_maxs,
                srcs,
                sizes,
                num_batches,
                attrs,
                attrs_indexes,
                num_attrs,
                Some(fail_index),
            )
        }
    })
}

/// `aclrtMemcpyBatchV2`: as [`aclrtMemcpyBatch`] without `failIndex`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn aclrtMemcpyBatchV2(
    dsts: *const *mut libc::c_void,
    dest_maxs: *const usize,
    srcs: *const *mut libc::c_void,
    sizes: *const usize,
    num_batches: usize,
    attrs: *const AclMemcpyBatchAttr,
    attrs_indexes: *const usize,
    num_attrs: usize,
) -> AclError {
    entry("aclrtMemcpyBatchV2", || {
        // SAFETY: the caller's arrays.
        unsafe {
            batch_sync(
                dsts,
                dest_maxs,
                srcs,
                sizes,
                num_batches,
                attrs,
                attrs_indexes,
                num_attrs,
                None,
            )
        }
    })
}

#[allow(clippy::too_many_arguments)]
unsafe fn batch_sync(
    dsts: *const *mut libc::c_void,
    dest_maxs: *const usize,
    srcs: *const *mut libc::c_void,
    sizes: *const usize,
    n: usize,
    attrs: *const AclMemcpyBatchAttr,
    attrs_indexes: *const usize,
    num_attrs: usize,
    fail_index: Option<*mut usize>,
) -> Res {
    let g = state::fast_global()?;
    // SAFETY: the caller's arrays.
    let copies = unsafe {
        batch(
            dsts,
            dest_maxs,
            srcs,
            sizes,
            n,
            attrs,
            attrs_indexes,
            num_attrs,
        )
    }?;
    let c = g.current()?;
    for (i, (d, s, len)) in copies.into_iter().enumerate() {
        // SAFETY: the C caller owns both ranges (aclrtMemcpy's contract).
        if let Err(e) = unsafe { c.ctx.host_memcpy(d, s, len) } {
            if let Some(f) = fail_index {
                // SAFETY: non-null out-pointer (checked by the caller).
                unsafe { out(f, i) };
            }
            return Err(e.into());
        }
    }
    Ok(())
}

/// `aclrtMemcpyBatchAsync`: as [`aclrtMemcpyBatch`], every copy in order on `stream` (NULL:
/// the default stream) as `aclrtMemcpyAsync` queues it; `*failIndex` names a copy that could
/// not be queued. Errors of the copies themselves are reported by `aclrtSynchronizeStream`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn aclrtMemcpyBatchAsync(
    dsts: *const *mut libc::c_void,
    dest_maxs: *const usize,
    srcs: *const *mut libc::c_void,
    sizes: *const usize,
    num_batches: usize,
    attrs: *const AclMemcpyBatchAttr,
    attrs_indexes: *const usize,
    num_attrs: usize,
    fail_index: *mut usize,
    stream: *mut libc::c_void,
) -> AclError {
    entry("aclrtMemcpyBatchAsync", || {
        if fail_index.is_null() {
            return Err(null("failIndex"));
        }
        // SAFETY: non-null out-pointer.
        unsafe { out(fail_index, usize::MAX) };
        // SAFETY: the caller's arrays.
        unsafe {
            batch_async(
                dsts,
                dest_maxs,
                srcs,
                sizes,
                num_batches,
                attrs,
                attrs_indexes,
                num_attrs,
                Some(fail_index),
                stream,
            )
        }
    })
}

/// `aclrtMemcpyBatchAsyncV2`: as [`aclrtMemcpyBatchAsync`] without `failIndex`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn aclrtMemcpyBatchAsyncV2(
    dsts: *const *mut libc::c_void,
    dest_maxs: *const usize,
    srcs: *const *mut libc::c_void,
    sizes: *const usize,
    num_batches: usize,
    attrs: *const AclMemcpyBatchAttr,
    attrs_indexes: *const usize,
    num_attrs: usize,
    stream: *mut libc::c_void,
) -> AclError {
    entry("aclrtMemcpyBatchAsyncV2", || {
        // SAFETY: the caller's arrays.
        unsafe {
            batch_async(
                dsts,
                dest_maxs,
                srcs,
                sizes,
                num_batches,
                attrs,
                attrs_indexes,
                num_attrs,
                None,
                stream,
            )
        }
    })
}

#[allow(clippy::too_many_arguments)]
unsafe fn batch_async(
    dsts: *const *mut libc::c_void,
    dest_maxs: *const usize,
    srcs: *const *mut libc::c_void,
    sizes: *const usize,
    n: usize,
    attrs: *const AclMemcpyBatchAttr,
    attrs_indexes: *const usize,
    num_attrs: usize,
    fail_index: Option<*mut usize>,
    stream: *mut libc::c_void,
) -> Res {
    let g = state::fast_global()?;
    // SAFETY: the caller's arrays.
    let copies = unsafe {
        batch(
            dsts,
            dest_maxs,
            srcs,
            sizes,
            n,
            attrs,
            attrs_indexes,
            num_attrs,
        )
    }?;
    let s = g.stream(stream as usize)?;
    for (i, (d, src, len)) in copies.into_iter().enumerate() {
        if let Err(e) = s.memcpy(d, src, len) {
            if let Some(f) = fail_index {
                // SAFETY: non-null out-pointer (checked by the caller).
                unsafe { out(f, i) };
            }
            return Err(e);
        }
    }
    Ok(())
}

/// `aclrtMemsetD32`: sets `N` 32-bit values at `ptr` to `value` (native byte order),
/// host-synchronously, as `aclrtMemcpy` writes (from a host buffer of the pattern, in pieces).
///
/// Errors (nothing written): `ACL_ERROR_INVALID_PARAM` (100000) for NULL, `N` 0 or `N * 4`
/// over `memSize`; `ACL_ERROR_RT_PARAM_INVALID` (107000) for memory not mapped writable.
#[no_mangle]
pub extern "C" fn aclrtMemsetD32(
    ptr: *mut libc::c_void,
    mem_size: usize,
    value: u32,
    n: usize,
) -> AclError {
    entry("aclrtMemsetD32", || {
        let g = state::fast_global()?;
        if ptr.is_null() {
            return Err(null("ptr"));
        }
        let bytes = hetmem::acl_ext::d32_bytes(mem_size, n)?;
        let c = g.current()?;
        const PIECE: usize = 1 << 20;
        let pat: Vec<u8> = std::iter::repeat_n(value.to_ne_bytes(), PIECE.min(bytes) / 4)
            .flatten()
            .collect();
        let mut off = 0;
        while off < bytes {
            let len = pat.len().min(bytes - off);
            // SAFETY: aclrtMemsetD32's contract: the C caller owns the destination.
            unsafe {
                c.ctx
                    .host_memcpy(ptr as usize + off, pat.as_ptr() as usize, len)?
            };
            off += len;
        }
        Ok(())
    })
}

/// `aclrtMemsetD32Async`: as [`aclrtMemsetD32`], in order on `stream` (NULL: the default
/// stream), by the stream's device (a fill with the 4-byte pattern).
///
/// Errors: as [`aclrtMemsetD32`]; `ACL_ERROR_RT_PARAM_INVALID` (107000) for a stream that is
/// not live; `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000) for managed memory with a value whose
/// four bytes differ (managed fills take one byte).
#[no_mangle]
pub extern "C" fn aclrtMemsetD32Async(
    ptr: *mut libc::c_void,
    mem_size: usize,
    value: u32,
    n: usize,
    stream: *mut libc::c_void,
) -> AclError {
    entry("aclrtMemsetD32Async", || {
        let g = state::fast_global()?;
        if ptr.is_null() {
            return Err(null("ptr"));
        }
        let bytes = hetmem::acl_ext::d32_bytes(mem_size, n)?;
        let s = g.stream(stream as usize)?;
        s.fill_pattern(ptr as usize, &value.to_ne_bytes(), bytes)
    })
}
