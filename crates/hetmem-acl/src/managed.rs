//! Managed (unified) memory: `aclrtMemAllocManaged`, `aclrtMemManagedAdvise`,
//! `aclrtMemManagedPrefetchAsync`, `aclrtMemManagedGetAttr`, `aclrtMemManagedGetAttrs` (and
//! `aclrtFree` in [`crate::memory`]), exactly as [`hetmem::managed`] decides them: 2 MiB
//! rounding, the eager advice rules, the eight range attributes and their `dataSize` rules,
//! and the error codes (`Error::acl_error`). Here the C values are decoded
//! ([`hetmem::Advice::from_raw`], [`hetmem::Location::from_raw`],
//! [`hetmem::RangeAttribute::from_raw`]) after the pointer checks.

use crate::state;
use crate::{entry, null, out, AclError, Res};

/// `aclrtMemManagedLocation` (`{ type; id; }`, 8 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AclMemManagedLocation {
    /// `aclrtMemManagedLocationType`.
    pub ty: u32,
    /// Device or NUMA node id.
    pub id: i32,
}

fn decode_location(l: AclMemManagedLocation) -> Res<hetmem::Location> {
    Ok(hetmem::Location::from_raw(l.ty, l.id)?)
}

fn usize_of(v: u64, what: &str) -> Res<usize> {
    usize::try_from(v).map_err(|_| {
        hetmem::Error::UnsupportedSize(format!("{what} {v:#x} does not fit this machine")).into()
    })
}

/// `aclrtMemAllocManaged`: `size` bytes of managed memory (rounded up to 2 MiB, 2 MiB-aligned),
/// reachable from the host and every device; freed by `aclrtFree`.
///
/// Errors (`*ptr` unchanged): `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer, size 0 or
/// a flag other than `ACL_RT_MEM_ATTACH_GLOBAL`; `ACL_ERROR_RT_PARAM_INVALID` (107000) over
/// 3 TiB; `ACL_ERROR_RT_MEMORY_ALLOCATION` (207001) past 3 TiB per process or if the OS
/// refuses; `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000) where userfaultfd is refused (the
/// message says why).
#[no_mangle]
pub unsafe extern "C" fn aclrtMemAllocManaged(
    ptr: *mut *mut libc::c_void,
    size: u64,
    flag: u32,
) -> AclError {
    entry("aclrtMemAllocManaged", || {
        let g = state::fast_global()?;
        if ptr.is_null() {
            return Err(null("ptr"));
        }
        let c = g.current()?;
        let p = c.ctx.alloc_managed(size, flag)?;
        // SAFETY: non-null out-pointer.
        unsafe { out(ptr, p as *mut libc::c_void) };
        Ok(())
    })
}

/// `aclrtMemManagedAdvise`: advice on `[ptr, ptr+size)` (both multiples of 2 MiB, inside one
/// managed allocation); see [`hetmem::Advice`] for what each advice does at once.
///
/// Errors (nothing changed): `ACL_ERROR_INVALID_PARAM` (100000) for NULL or size 0;
/// `ACL_ERROR_RT_PARAM_INVALID` (107000) for a size not a multiple of 2 MiB or over 3 TiB, a
/// range not inside managed memory, an advice or location type out of range, a bad device or
/// NUMA id, or advice refused by the eager rules; `ACL_ERROR_RT_ADDR_UNALIGNED` (107008) for a
/// pointer not 2 MiB-aligned; 207001 when a device cannot take the pages.
#[no_mangle]
pub extern "C" fn aclrtMemManagedAdvise(
    ptr: *const libc::c_void,
    size: u64,
    advise: u32,
    location: AclMemManagedLocation,
) -> AclError {
    entry("aclrtMemManagedAdvise", || {
        let g = state::fast_global()?;
        if ptr.is_null() {
            return Err(null("ptr"));
        }
        let c = g.current()?;
        let size = usize_of(size, "size")?;
        hetmem::acl::check_nonzero(size, "size")?;
        let advice = hetmem::Advice::from_raw(advise)?;
        let loc = hetmem::acl::advice_location(advice, location.ty, location.id)?;
        Ok(c.ctx.mem_advise(ptr as usize, size, advice, loc)?)
    })
}

/// `aclrtMemManagedPrefetchAsync`: migrates `[ptr, ptr+size)` to `location` in order on
/// `stream` (NULL: the current context's default stream); `LAST_PREFETCH_LOCATION` records the
/// request at once.
///
/// Errors (nothing queued or recorded): `ACL_ERROR_INVALID_PARAM` (100000) for NULL, size 0 or
/// flags other than 0; then as [`aclrtMemManagedAdvise`] for the range and location;
/// `ACL_ERROR_RT_PARAM_INVALID` (107000) for a stream that is not live. A failed call leaves
/// the stream working.
#[no_mangle]
pub extern "C" fn aclrtMemManagedPrefetchAsync(
    ptr: *const libc::c_void,
    size: usize,
    location: AclMemManagedLocation,
    flags: u32,
    stream: *mut libc::c_void,
) -> AclError {
    entry("aclrtMemManagedPrefetchAsync", || {
        let g = state::fast_global()?;
        if ptr.is_null() {
            return Err(null("ptr"));
        }
        hetmem::acl::check_nonzero(size, "size")?;
        let s = g.stream(stream as usize)?;
        let loc = decode_location(location)?;
        let st = s.managed()?;
        Ok(s.ctx.ctx.mem_prefetch(ptr as usize, size, loc, flags, st)?)
    })
}

/// `aclrtMemManagedGetAttr`: one [`hetmem::RangeAttribute`] of `[ptr, ptr+size)` into
/// `data` (`dataSize` bytes: 4, or a non-zero multiple of 4 for ACCESSED_BY), as native 32-bit
/// integers. Nothing is written on error.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer or `data`, size 0;
/// `ACL_ERROR_RT_PARAM_INVALID` (107000) for an attribute out of range, a `dataSize` its
/// attribute does not allow, size over 3 TiB, or a range not inside managed memory.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemManagedGetAttr(
    attribute: u32,
    ptr: *const libc::c_void,
    size: usize,
    data: *mut libc::c_void,
    data_size: usize,
) -> AclError {
    entry("aclrtMemManagedGetAttr", || {
        let g = state::fast_global()?;
        if ptr.is_null() {
            return Err(null("ptr"));
        }
        if data.is_null() {
            return Err(null("data"));
        }
        let c = g.current()?;
        let a = hetmem::RangeAttribute::from_raw(attribute)?;
        let buf = buffer(data, data_size)?;
        Ok(c.ctx.managed_get_attr(a, ptr as usize, size, buf)?)
    })
}

/// The caller's `data` buffer of `dataSize` bytes (at most `isize::MAX`, as a slice allows).
fn buffer<'a>(data: *mut libc::c_void, data_size: usize) -> Res<&'a mut [u8]> {
    if data_size > isize::MAX as usize {
        return Err(hetmem::Error::UnsupportedSize(format!(
            "dataSize {data_size:#x} is larger than any buffer"
        ))
        .into());
    }
    // SAFETY: `data` is non-null and points to `data_size` writable bytes (the caller's
    // contract of aclrtMemManagedGetAttr); hetmem writes only once every check has passed.
    Ok(unsafe { std::slice::from_raw_parts_mut(data as *mut u8, data_size) })
}

/// `aclrtMemManagedGetAttrs`: `numAttributes` attributes at once, `data[i]` (of `dataSizes[i]`
/// bytes) receiving `attributes[i]`; every attribute and `dataSize` is checked before any is
/// written.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null array, pointer or `data[i]`,
/// `numAttributes` 0, size 0; then as [`aclrtMemManagedGetAttr`] for each.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemManagedGetAttrs(
    attributes: *const u32,
    num_attributes: usize,
    ptr: *const libc::c_void,
    size: usize,
    data: *const *mut libc::c_void,
    data_sizes: *const usize,
) -> AclError {
    entry("aclrtMemManagedGetAttrs", || {
        let g = state::fast_global()?;
        if ptr.is_null() {
            return Err(null("ptr"));
        }
        if attributes.is_null() || data.is_null() || data_sizes.is_null() {
            return Err(null("attributes, data or dataSizes"));
        }
        hetmem::acl::check_attribute_count(num_attributes)?;
        let c = g.current()?;
        // SAFETY: arrays of `num_attributes` elements (the caller's contract).
        let (attrs, ptrs, sizes) = unsafe {
            (
                std::slice::from_raw_parts(attributes, num_attributes),
                std::slice::from_raw_parts(data, num_attributes),
                std::slice::from_raw_parts(data_sizes, num_attributes),
            )
        };
        let mut decoded = Vec::with_capacity(num_attributes);
        for &a in attrs {
            decoded.push(hetmem::RangeAttribute::from_raw(a)?);
        }
        let mut bufs = Vec::with_capacity(num_attributes);
        for (i, (&p, &n)) in ptrs.iter().zip(sizes).enumerate() {
            if p.is_null() {
                return Err(null(&format!("data[{i}]")));
            }
            bufs.push(buffer(p, n)?);
        }
        Ok(c.ctx
            .managed_get_attrs(&decoded, ptr as usize, size, &mut bufs)?)
    })
}
