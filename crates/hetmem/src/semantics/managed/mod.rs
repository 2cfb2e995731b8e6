//! ACL managed (unified) memory: the semantics layer.
//!
//! Spec: `aclrtMemAllocManaged`, `aclrtFree`, `aclrtMemset`, `aclrtMemcpy`,
//! `aclrtMemManagedAdvise`, `aclrtMemManagedPrefetchAsync`, `aclrtMemManagedGetAttr(s)`,
//! `aclrtMemManagedRangeAttribute`, streams (`aclrtCreateStream`, `aclrtSynchronizeStream`,
//! `aclrtDestroyStream`), with the constants and rules of the CANN runtime headers.
//!
//! # Where each rule lives
//!
//! | file | spec functions / rules |
//! |---|---|
//! | [`state`] | the records: allocations, per-page advice, queued-work holds, the 2 MiB page, the 3 TiB limit, the platform check (207000) |
//! | [`rules`] | argument rules and their codes (pointer, size, range, alignment, flags, locations, `dataSize`, plain memory), the one conversion of residency errors ([`rules::residency_error`]) |
//! | [`alloc`] | `aclrtMemAllocManaged`, `aclrtFree` of managed memory, "is this managed", the residency counters |
//! | [`host`] | host accesses: `aclrtMemset` / `aclrtMemcpy` between managed memory and a host buffer; peek and residency (no migration) |
//! | [`attrs`] | `aclrtMemManagedGetAttr(s)`: the eight range attributes |
//! | [`advice`] | `aclrtMemManagedAdvise` and the preferred-location rule |
//! | [`stream`] | `aclrtCreateStream` / `aclrtSynchronizeStream` and the stream-ordered copy, fill and launched work |
//! | [`prefetch`] | `aclrtMemManagedPrefetchAsync` |
//! | [`ops`] | host-synchronous `aclrtMemcpy` / `aclrtMemset` over any memory (a managed side, plain memory, device memory the host cannot reach) |
//!
//! Every call of the family walks one way down: `api/managed.rs` (signatures and docs) makes
//! one call into one of these files, which takes the locks, decides every refusal, and calls
//! the residency backend ([`crate::backend::managed::ManagedResidency`], reached only from
//! here) last.
//!
//! # The cut
//! This module keeps every ACL rule: argument checks and their order, the error codes, the
//! 2 MiB rounding, the 3 TiB process limit, the advice bookkeeping the eight range attributes
//! are answered from (preferred location, accessed-by list, read-mostly, last prefetch
//! location: hetmem's own record, never the driver's answer, see
//! [`crate::backend::managed`]), the stream ordering, and "a free waits for the stream work
//! queued on the memory" ([`state::QueuedHold`]). Where pages live, and moving them, is the
//! backend's (`ManagedResidency`): on CUDA the driver's unified memory, on the host backend a
//! residency engine over `userfaultfd(2)` (pages, device slots, LRU eviction, pins, host
//! faults, read-mostly copies) that plays the part of a software UVM driver.
//!
//! # Residency (as the backends provide it)
//! - The **managed page** is 2 MiB ([`state::MANAGED_PAGE_SIZE`]): the unit of allocation
//!   rounding, of advice and prefetch, and of migration (given to the backend when it starts).
//! - A page has no copy until first touched, then lives in one place (read-mostly pages may
//!   have several read-only copies); a host access migrates it to the host, device-side
//!   operations (stream copies, fills, prefetches and launched work) to the stream's device. A
//!   full device evicts its least recently used managed page (pages that prefer the device
//!   last); only a device full of other memory or of pages in use by running work answers
//!   `ACL_ERROR_RT_MEMORY_ALLOCATION` (207001).
//! - **Preferred location / accessed-by** follow ACL's eager semantics (see
//!   [`crate::spec::Advice`]).
//! - Host-synchronous `aclrtMemset` / `aclrtMemcpy` ([`host`], [`ops`]) are host accesses
//!   (pages migrate to the host); the stream-ordered forms ([`stream`]) are device accesses on
//!   the stream's device. Either copy may have one plain side.
//!
//! # Locking
//! One mutex per driver (`state`) guards this module's bookkeeping (allocations, advice,
//! queued holds). It is held only briefly: never while a backend call that may wait runs
//! (advice, prefetch, free, device work, host access), and the backend never takes it, so work
//! running on the device (its pages pinned by the backend) can make managed calls of its own.
//! A call checks its arguments under the lock, drops it for the backend's part, and records
//! its advice under it again once the backend has succeeded. It is never held with the
//! driver's `usm` or `vm` locks (see [`crate::semantics::driver`]).
//!
//! # Errors
//! Every refusal of these calls is an [`crate::Error::Acl`] whose [`crate::AclCode`] the rule
//! chose: null pointers, size 0 and bad flag values are API-layer errors,
//! `ACL_ERROR_INVALID_PARAM` (100000). Out-of-range enumeration values, bad device or NUMA ids,
//! refused advice, a size that is not a multiple of 2 MiB or over 3 TiB, a bad `dataSize` and a
//! range not inside one managed allocation are `ACL_ERROR_RT_PARAM_INVALID` (107000). A pointer
//! that is not 2 MiB-aligned where alignment is required is `ACL_ERROR_RT_ADDR_UNALIGNED`
//! (107008). A platform without userfaultfd is `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000);
//! memory exhaustion `ACL_ERROR_RT_MEMORY_ALLOCATION` (207001). Checks run in
//! that order: pointer, size, range, alignment, enumerations, locations. A failed call changes
//! nothing and leaves later calls working: each call decides every refusal (arguments, advice
//! rules through the backend's `check`, device room in the backend) before a page moves, and
//! records advice only once its pages have moved.

pub(crate) mod advice;
pub(crate) mod alloc;
pub(crate) mod attrs;
pub(crate) mod host;
pub(crate) mod ops;
pub(crate) mod prefetch;
pub(crate) mod rules;
pub(crate) mod state;
pub(crate) mod stream;
