//! Memory calls: `aclrtMalloc`, `aclrtFree`, `aclrtMallocHost`, `aclrtFreeHost`,
//! `aclrtMemset`, `aclrtMemsetAsync`, `aclrtMemcpy`, `aclrtMemcpyAsync`, `aclrtGetMemInfo`.
//!
//! Device memory is a hetmem device allocation of the current context's device
//! ([`hetmem::Context::alloc_device`]); host memory a hetmem host allocation. Host-synchronous
//! copies and fills are [`hetmem::Context::host_memcpy`] / [`hetmem::Context::host_memset`]
//! (managed memory migrates to the host, plain memory must be mapped with the access needed);
//! asynchronous ones are stream-ordered ([`crate::stream`]). On the host backend device memory
//! is host-addressable, so every `aclrtMemcpyKind` copies the same way: the kind is checked to be
//! one of the eight values and otherwise not used to choose a path (pointers decide).

use crate::state;
use crate::{entry, null, out, AclError};

/// The highest `aclrtMemcpyKind` (`ACL_MEMCPY_INTER_DEVICE_TO_DEVICE`).
pub const MAX_MEMCPY_KIND: u32 = hetmem::spec::MemcpyKind::MAX;

/// `aclrtMalloc`: `size` bytes of device memory on the current device, aligned to the page size
/// for that size (64 KiB below 2 MiB, 2 MiB from 2 MiB up), charged to the device's capacity.
/// Every `aclrtMemMallocPolicy` is accepted and places the memory the same way.
///
/// Errors (`*devPtr` unchanged): `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer or size
/// 0; `ACL_ERROR_RT_PARAM_INVALID` (107000) for a policy that is not an
/// `aclrtMemMallocPolicy`, or a size over the device's largest allocation;
/// `ACL_ERROR_RT_MEMORY_ALLOCATION` (207001) when the device is full;
/// `ACL_ERROR_RT_CONTEXT_NULL` (107002) without a current context.
#[no_mangle]
pub unsafe extern "C" fn aclrtMalloc(
    dev_ptr: *mut *mut libc::c_void,
    size: usize,
    policy: u32,
) -> AclError {
    entry("aclrtMalloc", || {
        let g = state::fast_global()?;
        if dev_ptr.is_null() {
            return Err(null("devPtr"));
        }
        hetmem::acl::check_nonzero(size, "size")?;
        hetmem::spec::MallocPolicy::from_raw(policy)?;
        let c = g.current()?;
        let p = c.ctx.alloc_device(&c.dev, &hetmem::AllocDesc::new(size))?;
        // SAFETY: non-null out-pointer.
        unsafe { out(dev_ptr, p as *mut libc::c_void) };
        Ok(())
    })
}

/// `aclrtFree`: frees device memory from `aclrtMalloc` or managed memory from
/// `aclrtMemAllocManaged` (`devPtr` must be the pointer they returned, in the current
/// context). Stream work still using device memory finishes first (the memory goes when it
/// has); for managed memory the free waits until stream work queued on it has run
/// ([`hetmem::Context::free_managed`]), so a later `aclrtSynchronizeStream` returns 0.
///
/// Errors (nothing freed): `ACL_ERROR_INVALID_PARAM` (100000) for NULL;
/// `ACL_ERROR_RT_PARAM_INVALID` (107000) for any other pointer (interior, unknown, freed,
/// host memory of `aclrtMallocHost`, another context's).
#[no_mangle]
pub extern "C" fn aclrtFree(dev_ptr: *mut libc::c_void) -> AclError {
    entry("aclrtFree", || {
        let g = state::fast_global()?;
        let p = dev_ptr as usize;
        if p == 0 {
            return Err(null("devPtr"));
        }
        let c = g.current()?;
        if c.ctx.is_managed(p) {
            return Ok(c.ctx.free_managed(p)?);
        }
        let props = c.ctx.get_allocation_properties(p)?;
        hetmem::acl::check_free_kind(p, props.memory_type, false)?;
        Ok(c.ctx.free_memory(p)?)
    })
}

/// `aclrtMallocHost`: `size` bytes of host memory that every device reaches, page-aligned.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer or size 0;
/// `ACL_ERROR_RT_MEMORY_ALLOCATION` (207001) if the OS refuses; `ACL_ERROR_RT_CONTEXT_NULL`
/// (107002) without a current context.
#[no_mangle]
pub unsafe extern "C" fn aclrtMallocHost(
    host_ptr: *mut *mut libc::c_void,
    size: usize,
) -> AclError {
    entry("aclrtMallocHost", || {
        let g = state::fast_global()?;
        if host_ptr.is_null() {
            return Err(null("hostPtr"));
        }
        hetmem::acl::check_nonzero(size, "size")?;
        let c = g.current()?;
        let p = c
            .ctx
            .alloc_host(&hetmem::AllocDesc::new(size).relaxed_max_size(true))?;
        // SAFETY: non-null out-pointer.
        unsafe { out(host_ptr, p as *mut libc::c_void) };
        Ok(())
    })
}

/// `aclrtFreeHost`: frees memory from `aclrtMallocHost`.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for NULL; `ACL_ERROR_RT_PARAM_INVALID` (107000)
/// for anything but the base of a live `aclrtMallocHost` allocation of the current context.
#[no_mangle]
pub extern "C" fn aclrtFreeHost(host_ptr: *mut libc::c_void) -> AclError {
    entry("aclrtFreeHost", || {
        let g = state::fast_global()?;
        let p = host_ptr as usize;
        if p == 0 {
            return Err(null("hostPtr"));
        }
        let c = g.current()?;
        let props = c.ctx.get_allocation_properties(p)?;
        hetmem::acl::check_free_kind(p, props.memory_type, true)?;
        Ok(c.ctx.free_memory(p)?)
    })
}

/// `aclrtMemset`: sets `count` bytes at `devPtr` to the low byte of `value`, host-synchronously
/// (managed pages migrate to the host).
///
/// Errors (nothing written): `ACL_ERROR_INVALID_PARAM` (100000) for NULL or `count >
/// maxCount`; `ACL_ERROR_RT_PARAM_INVALID` (107000) for memory that is not mapped writable or
/// runs past its managed allocation.
#[no_mangle]
pub extern "C" fn aclrtMemset(
    dev_ptr: *mut libc::c_void,
    max_count: usize,
    value: i32,
    count: usize,
) -> AclError {
    entry("aclrtMemset", || {
        let g = state::fast_global()?;
        if dev_ptr.is_null() {
            return Err(null("devPtr"));
        }
        hetmem::acl::check_count(count, max_count, "maxCount")?;
        let c = g.current()?;
        // SAFETY: aclrtMemset's contract: the C caller owns the destination memory.
        Ok(unsafe { c.ctx.host_memset(dev_ptr as usize, value as u8, count) }?)
    })
}

/// `aclrtMemsetAsync`: as [`aclrtMemset`], in order on `stream` (NULL: the default stream), by
/// the stream's device.
///
/// Errors: as [`aclrtMemset`]; `ACL_ERROR_RT_PARAM_INVALID` (107000) for a stream that is not
/// live. Errors of the work itself are reported by `aclrtSynchronizeStream`.
#[no_mangle]
pub extern "C" fn aclrtMemsetAsync(
    dev_ptr: *mut libc::c_void,
    max_count: usize,
    value: i32,
    count: usize,
    stream: *mut libc::c_void,
) -> AclError {
    entry("aclrtMemsetAsync", || {
        let g = state::fast_global()?;
        if dev_ptr.is_null() {
            return Err(null("devPtr"));
        }
        hetmem::acl::check_count(count, max_count, "maxCount")?;
        let s = g.stream(stream as usize)?;
        s.memset(dev_ptr as usize, value as u8, count)
    })
}

/// `aclrtMemcpy`: copies `count` bytes from `src` to `dst` host-synchronously, any `kind`
/// (host, device, managed, mapped virtual memory on either side; overlap behaves as memmove).
///
/// Errors (nothing copied): `ACL_ERROR_INVALID_PARAM` (100000) for NULL or `count > destMax`;
/// `ACL_ERROR_RT_PARAM_INVALID` (107000) for a kind that is not an `aclrtMemcpyKind` or memory
/// not mapped with the access needed.
#[no_mangle]
pub extern "C" fn aclrtMemcpy(
    dst: *mut libc::c_void,
    dest_max: usize,
    src: *const libc::c_void,
    count: usize,
    kind: u32,
) -> AclError {
    entry("aclrtMemcpy", || {
        let g = state::fast_global()?;
        if dst.is_null() || src.is_null() {
            return Err(null(if dst.is_null() { "dst" } else { "src" }));
        }
        hetmem::acl::check_count(count, dest_max, "destMax")?;
        hetmem::spec::MemcpyKind::from_raw(kind)?;
        let c = g.current()?;
        // SAFETY: aclrtMemcpy's contract: the C caller owns both ranges.
        Ok(unsafe { c.ctx.host_memcpy(dst as usize, src as usize, count) }?)
    })
}

/// `aclrtMemcpyAsync`: as [`aclrtMemcpy`], in order on `stream` (NULL: the default stream), by
/// the stream's device. Plain sides must be memory the runtime knows (device / host
/// allocations, mapped virtual memory) or one side managed memory.
///
/// Errors: as [`aclrtMemcpy`]; `ACL_ERROR_RT_PARAM_INVALID` (107000) for a stream that is not
/// live or an operand that is not memory the runtime knows.
#[no_mangle]
pub extern "C" fn aclrtMemcpyAsync(
    dst: *mut libc::c_void,
    dest_max: usize,
    src: *const libc::c_void,
    count: usize,
    kind: u32,
    stream: *mut libc::c_void,
) -> AclError {
    entry("aclrtMemcpyAsync", || {
        let g = state::fast_global()?;
        if dst.is_null() || src.is_null() {
            return Err(null(if dst.is_null() { "dst" } else { "src" }));
        }
        hetmem::acl::check_count(count, dest_max, "destMax")?;
        hetmem::spec::MemcpyKind::from_raw(kind)?;
        let s = g.stream(stream as usize)?;
        s.memcpy(dst as usize, src as usize, count)
    })
}

/// `aclrtGetMemInfo`: free and total bytes of the current device's memory (its capacity, and
/// what device allocations, physical memory and managed pages leave of it). Every
/// `aclrtMemAttr` (0..=17) answers for the device's one kind of memory.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer; `ACL_ERROR_RT_PARAM_INVALID`
/// (107000) for an attribute that is not an `aclrtMemAttr`; `ACL_ERROR_RT_CONTEXT_NULL` (107002)
/// without a current context.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetMemInfo(
    attr: u32,
    free: *mut usize,
    total: *mut usize,
) -> AclError {
    entry("aclrtGetMemInfo", || {
        let g = state::fast_global()?;
        if free.is_null() || total.is_null() {
            return Err(null(if free.is_null() { "free" } else { "total" }));
        }
        hetmem::spec::MemAttr::from_raw(attr, "attr")?;
        let c = g.current()?;
        let cap = c.dev.info().capacity;
        let used = c.dev.used_memory();
        // SAFETY: non-null out-pointers.
        unsafe {
            out(free, cap.saturating_sub(used) as usize);
            out(total, cap as usize);
        }
        Ok(())
    })
}
