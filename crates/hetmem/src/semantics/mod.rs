//! The semantics layer: every rule of the three specs, once. Validation, the choice of each
//! error code, and all bookkeeping (reservations, mappings, access, physical objects, USM
//! allocations and imports, capacity, in-flight references of queued work, free policies, the
//! IPC handle format and its exports / imports, managed-memory advice records and attributes)
//! live here, over the backend traits ([`crate::backend::Backend`],
//! [`crate::backend::managed::ManagedResidency`], which decides where managed pages live);
//! nothing here makes an OS call or names a backend.
//!
//! Modules, each importing only those listed before it (no cycle):
//!
//! | module | what |
//! |---|---|
//! | [`checks`] | the generic argument checks (null, zero, page multiple, alignment, device of the driver) |
//! | [`ranges`] | sorted non-overlapping ranges with split / merge (the bookkeeping structure) |
//! | [`capacity`] | per-device capacity counters; the sub-device model (each sub-device a share of its root, charged with it) |
//! | [`access`] | per-page access attributes of reservations, read and written without the driver's lock |
//! | [`vmm`] | reservations, physical memory, mappings, access attributes (the bookkeeping) |
//! | [`usm`] | host / device / shared allocations, imports of system memory, pending frees (the bookkeeping) |
//! | [`managed`] | the managed family's file table (its modules; it imports none of them) |
//! | [`managed::state`] | ACL managed memory's records: allocations, per-page advice, queued-work holds (residency is the backend's) |
//! | [`managed::rules`] | managed-memory argument rules and the one conversion of residency errors |
//! | [`inflight`] | in-flight references of queued work and the frees waiting for them |
//! | [`driver`] | the state of one driver (the above, the backend, in-flight references), its lock order, the device-of-driver check, the driver and device queries |
//! | `vmm::calls` | the `zeVirtualMem*` / `zePhysicalMem*` calls on a driver, taking its locks |
//! | [`managed::alloc`] | `aclrtMemAllocManaged`, `aclrtFree` of managed memory |
//! | [`managed::host`] | host accesses of managed memory (`aclrtMemset` / `aclrtMemcpy` to a host buffer) |
//! | [`managed::attrs`] | `aclrtMemManagedGetAttr(s)`: the eight range attributes |
//! | [`managed::advice`] | `aclrtMemManagedAdvise` |
//! | [`ipc::format`] | the 64-byte IPC handle (encode / decode), the broker's answer, pieces |
//! | [`ipc::handle_types`] | the IPC handle-type rules (DEFAULT, FABRIC_ACCESSIBLE, types chained at creation) |
//! | [`ipc::registry`] | the process-wide IPC export and view tables, export ids, tokens, statistics |
//! | [`ipc::views`] | opened IPC views: mapping one, range, properties, overlap, the queues' operand table |
//! | [`ipc::broker`] | what this process's IPC broker answers, starting it, asking another's |
//! | [`ipc::export`] | IPC get: allocation, physical object, range; physical memory created with handle types |
//! | [`ipc::import`] | IPC open, physical import, close, put, handle from an fd, context teardown |
//! | [`ipc`] | the IPC family's re-exports and its file table |
//! | `queue::args` | queue / list descriptors, fill patterns, event pool counts and indices, the one-context rule |
//! | `queue::event` | events, event pools, fences |
//! | `queue::command` | recorded commands, their operands and the operand checks, in-flight holds |
//! | `queue::engine` | one engine's submission and synchronization; host-synchronous device operations |
//! | `queue::list` | command lists (append, close, reset) and command queues (execute) |
//! | [`queue`] | the queue family's rules (module docs) and re-exports |
//! | [`managed::stream`] | managed streams: stream-ordered copies, fills, launched work |
//! | [`managed::prefetch`] | `aclrtMemManagedPrefetchAsync` |
//! | [`managed::ops`] | host-synchronous `aclrtMemcpy` / `aclrtMemset` over any memory |
//! | `usm::calls` | the `zeMem*` calls on a driver (allocations, import, free policies, properties, ranges), taking its locks |
//! | [`context`] | context creation and teardown (releasing everything a context owns) |
//! | [`acl`] | ACL argument rules that are no family's state (sizes, counts, flags, properties, the pid whitelist of every import) |
//! | `acl::shareable` | ACL shareable handles: one export per object, their records (the pid whitelist is `acl`'s) |
//! | `acl::ipc_key` | ACL IPC keys (`aclrtIpcMem*`): the key format, this process's key exports and views |
//! | [`acl_ext`] | ACL argument rules of the calls beyond the core (2-D / batch copies, 32-bit fills, host registration, value wait, event flags, V2 handle types) |
//! | [`acl_vmm`] | ACL virtual-memory rules Level Zero lacks: access descriptors, the physical object at an address |
//!
//! Every entry point that works on a driver takes `&DriverShared` (or `&Arc<DriverShared>`
//! where it keeps it) and takes the driver's locks itself, in the order written down in
//! [`driver`]; `api/` takes none.

pub(crate) mod access;
pub mod acl;
pub mod acl_ext;
pub mod acl_vmm;
pub mod capacity;
pub(crate) mod checks;
pub(crate) mod context;
pub(crate) mod driver;
pub(crate) mod inflight;
pub mod ipc;
pub(crate) mod managed;
pub mod queue;
pub mod ranges;
pub mod usm;
pub mod vmm;
