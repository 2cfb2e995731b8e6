//! The argument rules of the managed-memory calls, each choosing its ACL code once, and the
//! one conversion of residency-backend errors ([`residency_error`]).
//!
//! - `aclrtMemAllocManaged`: [`check_alloc_args`] (flag, size 0, over 3 TiB; the 2 MiB
//!   rounding).
//! - `aclrtMemManagedAdvise` / `aclrtMemManagedPrefetchAsync`: [`check_advise_args`] (pointer,
//!   size, range, alignment), [`Core::resolve`] (the location), [`check_prefetch_flags`].
//! - `aclrtMemManagedGetAttr(s)`: [`check_attr_args`], [`check_data_size`],
//!   [`check_attrs_count`], [`check_accessed_by_slots`].
//! - Every call on a managed range: [`check_null`], [`Core::check_range`] (inside one live
//!   allocation).
//! - `aclrtMemcpy` / `aclrtMemset` on plain memory: [`check_process_memory`] (mapped with the
//!   access needed), [`check_plain_overlap`] (no overflow, no managed byte), and
//!   [`operand_error`] (a device-side operand refused by the queue rules, as ACL's code).
//! - [`residency_error`]: what the residency backend says happened, as the spec code.

use crate::backend::managed::ResidencyError;
use crate::error::{AclCode, Addr, Error, Result};
use crate::semantics::managed::state::{Core, Loc, State, MAX_MANAGED_PER_PROCESS, PAGE};
use crate::spec::{Location, RangeAttribute, ACL_RT_MEM_ATTACH_GLOBAL};

/// Most `slots` the ACCESSED_BY query of `Context::managed_accessed_by` answers (1 Mi entries,
/// 4 MiB).
pub const MAX_ACCESSED_BY_SLOTS: usize = 1 << 20;

/// The spec error for a residency failure: the backend says what happened, this layer
/// chooses the code.
pub(in crate::semantics) fn residency_error(e: ResidencyError) -> Error {
    match e {
        ResidencyError::Platform(h) => h.into(),
        ResidencyError::DeviceFull(m) => Error::Acl(AclCode::RtMemoryAllocation, m),
        ResidencyError::NotManaged(m) | ResidencyError::Refused(m) => {
            Error::Acl(AclCode::RtParamInvalid, m)
        }
        ResidencyError::Broken(m) => Error::Acl(AclCode::RtDrvInternalError, m),
    }
}

/// A null pointer of a managed call: `ACL_ERROR_INVALID_PARAM` (100000), `what` naming it
/// ("pointer", "buffer pointer").
pub(in crate::semantics) fn check_null(ptr: usize, what: &str) -> Result<()> {
    if ptr == 0 {
        return Err(Error::Acl(AclCode::InvalidParam, format!("{what} is null")));
    }
    Ok(())
}

/// The argument checks of `aclrtMemAllocManaged`, in the spec's order (flag, size 0, size over
/// 3 TiB), and the 2 MiB rounding: the size to allocate.
pub(in crate::semantics) fn check_alloc_args(size: u64, flag: u32) -> Result<u64> {
    if flag != ACL_RT_MEM_ATTACH_GLOBAL {
        return Err(Error::Acl(
            AclCode::InvalidParam,
            format!("flag {flag:#x} is not ACL_RT_MEM_ATTACH_GLOBAL (0x1)"),
        ));
    }
    if size == 0 {
        return Err(Error::Acl(
            AclCode::InvalidParam,
            "managed allocation of size 0".into(),
        ));
    }
    if size > MAX_MANAGED_PER_PROCESS {
        return Err(Error::Acl(
            AclCode::RtParamInvalid,
            format!("size {size:#x} exceeds the 3 TiB of managed memory a process may allocate"),
        ));
    }
    Ok(size.div_ceil(PAGE as u64) * PAGE as u64)
}

/// `flags` of `aclrtMemManagedPrefetchAsync`: 0, else `ACL_ERROR_INVALID_PARAM` (100000).
pub(in crate::semantics) fn check_prefetch_flags(flags: u32) -> Result<()> {
    if flags != 0 {
        return Err(Error::Acl(
            AclCode::InvalidParam,
            format!("prefetch flags {flags:#x} must be 0"),
        ));
    }
    Ok(())
}

impl Core {
    /// Checks `[ptr, ptr+size)` lies inside one live allocation: else
    /// `ACL_ERROR_RT_PARAM_INVALID` (107000), also for an overflowing range.
    pub(in crate::semantics) fn check_range(
        &self,
        st: &State,
        ptr: usize,
        size: usize,
    ) -> Result<()> {
        let end = ptr.checked_add(size).ok_or_else(|| {
            Error::Acl(
                AclCode::RtParamInvalid,
                format!("{} + {size:#x} overflows", Addr(ptr)),
            )
        })?;
        match st.allocs.range(..=ptr).next_back() {
            Some((&b, a)) if ptr < b + a.size && end <= b + a.size => Ok(()),
            Some((&b, a)) if ptr < b + a.size => Err(Error::Acl(
                AclCode::RtParamInvalid,
                format!(
                    "[{}, {}) runs past the end {} of the managed allocation at {}",
                    Addr(ptr),
                    Addr(end),
                    Addr(b + a.size),
                    Addr(b)
                ),
            )),
            _ => Err(Error::Acl(
                AclCode::RtParamInvalid,
                format!("{} is not inside managed memory", Addr(ptr)),
            )),
        }
    }

    /// Resolves an ACL location for `what` (an advice or "a prefetch"): INVALID, a device id
    /// that is not a device or a NUMA node that does not exist is `ACL_ERROR_RT_PARAM_INVALID`
    /// (107000); `HOST_NUMA_CURRENT` is the calling thread's node.
    pub(in crate::semantics) fn resolve(&self, loc: Location, what: &str) -> Result<Loc> {
        match loc {
            Location::Invalid => Err(Error::Acl(
                AclCode::RtParamInvalid,
                format!("location type INVALID is not allowed for {what}"),
            )),
            Location::Device(d) => {
                if (d as usize) < self.devices {
                    Ok(Loc::Device(d))
                } else {
                    Err(Error::Acl(
                        AclCode::RtParamInvalid,
                        format!("device id {d} is not a device (there are {})", self.devices),
                    ))
                }
            }
            Location::Host => Ok(Loc::Host),
            Location::HostNuma(n) => {
                let nodes = self.res.numa_nodes();
                if nodes.contains(&n) {
                    Ok(Loc::Numa(n))
                } else {
                    Err(Error::Acl(
                        AclCode::RtParamInvalid,
                        format!("NUMA node {n} does not exist (nodes: {nodes:?})"),
                    ))
                }
            }
            Location::HostNumaCurrent => Ok(Loc::Numa(self.res.current_numa_node())),
        }
    }
}

/// Checks pointer / size / alignment of an advise or prefetch (see the module docs of
/// [`crate::semantics::managed`]): null and 0 are `ACL_ERROR_INVALID_PARAM` (100000); a size
/// that is not a multiple of 2 MiB in (0, 3 TiB] and a range not inside one allocation
/// `ACL_ERROR_RT_PARAM_INVALID` (107000); a pointer not 2 MiB-aligned
/// `ACL_ERROR_RT_ADDR_UNALIGNED` (107008). In that order.
pub(in crate::semantics) fn check_advise_args(
    core: &Core,
    st: &State,
    ptr: usize,
    size: usize,
) -> Result<()> {
    check_null(ptr, "pointer")?;
    if size == 0 {
        return Err(Error::Acl(AclCode::InvalidParam, "size is 0".into()));
    }
    if size as u64 > MAX_MANAGED_PER_PROCESS || !size.is_multiple_of(PAGE) {
        return Err(Error::Acl(
            AclCode::RtParamInvalid,
            format!("size {size:#x} is not a multiple of 2 MiB in (0, 3 TiB]"),
        ));
    }
    core.check_range(st, ptr, size)?;
    if !ptr.is_multiple_of(PAGE) {
        return Err(Error::Acl(
            AclCode::RtAddrUnaligned,
            format!("pointer {} is not aligned to 2 MiB", Addr(ptr)),
        ));
    }
    Ok(())
}

/// Pointer and size of `aclrtMemManagedGetAttr`: null and 0 are `ACL_ERROR_INVALID_PARAM`
/// (100000), over 3 TiB `ACL_ERROR_RT_PARAM_INVALID` (107000); no alignment rule.
pub(in crate::semantics) fn check_attr_args(ptr: usize, size: usize) -> Result<()> {
    check_null(ptr, "pointer")?;
    if size == 0 {
        return Err(Error::Acl(AclCode::InvalidParam, "size is 0".into()));
    }
    if size as u64 > MAX_MANAGED_PER_PROCESS {
        return Err(Error::Acl(
            AclCode::RtParamInvalid,
            format!("size {size:#x} exceeds 3 TiB"),
        ));
    }
    Ok(())
}

/// `dataSize` of `aclrtMemManagedGetAttr`: 4, or a non-zero multiple of 4 for ACCESSED_BY;
/// else `ACL_ERROR_RT_PARAM_INVALID` (107000).
pub(in crate::semantics) fn check_data_size(attribute: RangeAttribute, n: usize) -> Result<()> {
    let ok = match attribute {
        RangeAttribute::AccessedBy => n > 0 && n.is_multiple_of(4),
        _ => n == 4,
    };
    if ok {
        Ok(())
    } else {
        Err(Error::Acl(
            AclCode::RtParamInvalid,
            format!(
                "dataSize {n} is not allowed for {attribute:?} ({})",
                if attribute == RangeAttribute::AccessedBy {
                    "a non-zero multiple of 4"
                } else {
                    "must be 4"
                }
            ),
        ))
    }
}

/// `aclrtMemManagedGetAttrs`: at least one attribute and one data buffer each; else
/// `ACL_ERROR_INVALID_PARAM` (100000).
pub(in crate::semantics) fn check_attrs_count(attributes: usize, data: usize) -> Result<()> {
    if attributes == 0 || attributes != data {
        return Err(Error::Acl(
            AclCode::InvalidParam,
            format!("{attributes} attributes and {data} data buffers"),
        ));
    }
    Ok(())
}

/// `slots` of the ACCESSED_BY query: 1 to [`MAX_ACCESSED_BY_SLOTS`]; else
/// `ACL_ERROR_RT_PARAM_INVALID` (107000) (dataSize 0, or a buffer this query does not make).
pub(in crate::semantics) fn check_accessed_by_slots(slots: usize) -> Result<()> {
    if slots == 0 || slots > MAX_ACCESSED_BY_SLOTS {
        return Err(Error::Acl(
            AclCode::RtParamInvalid,
            format!(
                "{slots} ACCESSED_BY slots: 1 to {} are answered here (dataSize a non-zero \
                 multiple of 4; larger buffers through managed_get_attr)",
                MAX_ACCESSED_BY_SLOTS
            ),
        ));
    }
    Ok(())
}

/// A plain (not managed) side `[p, p+count)` of a host copy: `ACL_ERROR_RT_PARAM_INVALID`
/// (107000) if it overflows or `managed` (the managed allocation `(base, end)` overlapping it,
/// if any) says it runs into managed memory. Returns its end.
pub(in crate::semantics) fn check_plain_overlap(
    p: usize,
    count: usize,
    managed: impl FnOnce(usize) -> Option<usize>,
) -> Result<usize> {
    let end = p.checked_add(count).ok_or_else(|| {
        Error::Acl(
            AclCode::RtParamInvalid,
            format!("{} + {count:#x} overflows", Addr(p)),
        )
    })?;
    if let Some(b) = managed(end) {
        return Err(Error::Acl(
            AclCode::RtParamInvalid,
            format!(
                "[{}, {}) runs into the managed allocation at {}",
                Addr(p),
                Addr(end),
                Addr(b)
            ),
        ));
    }
    Ok(end)
}

/// Neither side of a managed copy is managed memory: `ACL_ERROR_RT_PARAM_INVALID` (107000).
pub(in crate::semantics) fn neither_managed(dst: usize, src: usize) -> Error {
    Error::Acl(
        AclCode::RtParamInvalid,
        format!(
            "neither {} nor {} is inside managed memory",
            Addr(dst),
            Addr(src)
        ),
    )
}

/// A device-side operand of a host-synchronous copy or fill refused by the queue rules
/// ([`crate::semantics::queue::check_operand`]): the same message, as
/// `ACL_ERROR_RT_PARAM_INVALID` (107000).
pub(in crate::semantics) fn operand_error(e: Error) -> Error {
    Error::Acl(AclCode::RtParamInvalid, e.message().to_string())
}

/// Checks `[ptr, ptr+len)` is mapped in this process, readable (and writable if `write`)
/// ([`Backend::query_host_protection`](crate::backend::Backend::query_host_protection)).
///
/// Errors: `ACL_ERROR_RT_PARAM_INVALID` (107000) naming the first byte that is not.
pub(in crate::semantics) fn check_process_memory(
    backend: &dyn crate::backend::Backend,
    ptr: usize,
    len: usize,
    write: bool,
) -> Result<()> {
    use crate::backend::Protection;
    let ok = |a: usize, n: usize| match backend.query_host_protection(a, n) {
        Some(Protection::ReadWrite) => true,
        Some(Protection::ReadOnly) => !write,
        Some(Protection::None) | None => false,
    };
    let end = ptr + len;
    if len == 0 || ok(ptr, len) {
        return Ok(());
    }
    // The error path only: find the first page that is not.
    let page = backend.host_page_size();
    let mut at = ptr;
    while at < end {
        let next = ((at / page) + 1) * page;
        if !ok(at, next.min(end) - at) {
            break;
        }
        at = next;
    }
    Err(Error::Acl(
        AclCode::RtParamInvalid,
        format!(
            "{} is not {} process memory (in [{}, {}))",
            Addr(at.min(end)),
            if write { "writable" } else { "readable" },
            Addr(ptr),
            Addr(end)
        ),
    ))
}
