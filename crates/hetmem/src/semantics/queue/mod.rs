//! Device queues, command lists, events and fences: the semantics layer.
//!
//! Spec: oneAPI Level Zero core "Command Queues and Command Lists" and "Synchronization
//! Primitives" (`zeCommandQueueCreate`, `zeCommandQueueExecuteCommandLists`,
//! `zeCommandQueueSynchronize`, `zeCommandListCreate`, `zeCommandListCreateImmediate`,
//! `zeCommandListAppendMemoryCopy`, `zeCommandListAppendMemoryFill`,
//! `zeCommandListAppendBarrier`, `zeCommandListAppendSignalEvent`,
//! `zeCommandListAppendWaitOnEvents`, `zeCommandListClose`, `zeCommandListReset`,
//! `zeCommandListHostSynchronize`, `zeEventHostSignal`, `zeEventHostSynchronize`,
//! `zeEventQueryStatus`, `zeEventHostReset`, `zeFenceCreate`, `zeFenceHostSynchronize`,
//! `zeFenceQueryStatus`, `zeFenceReset`).
//!
//! Execution is the backend's ([`crate::backend::Engine`]): each [`CommandQueue`] and each
//! immediate [`CommandList`] owns one engine (host: a worker thread; CUDA: a stream), so a
//! device has as many engines as queues. Commands of one queue run in order, one after the
//! other; different queues run concurrently.
//!
//! # Rules (decided here, once)
//! - **Memory operands** must lie wholly inside memory the driver knows: a USM allocation or
//!   import (up to the size asked at allocation), an IPC view opened with a context of this
//!   driver (up to its size; read and write), or mapped pages of one virtual-memory
//!   reservation whose access allows the operation (source readable: READONLY or READWRITE;
//!   destination writable: READWRITE). An import recorded read-only cannot be a destination.
//!   **Plain system memory** of the process (`malloc`, `new[]`, the stack: none of the
//!   above) follows the spec of the call ([`OperandRule`]): Level Zero's copies and fills
//!   accept it, on both backends, where the process has it mapped readable (source) /
//!   writable (destination) for the whole range ([`SYSTEM_MEMORY_IN_QUEUES`]; the backend
//!   reads the process's mappings, nothing is touched; a range with any byte unmapped is
//!   `InvalidArgument`); it is not held against frees (the program owns it). ACL's stream
//!   operations (`aclrtMemcpyAsync`, `aclrtMemsetAsync`) take only memory the runtime knows,
//!   as CANN's do. Otherwise the append fails with `InvalidArgument` (null:
//!   `InvalidNullPointer`) and nothing is appended. Lookups are driver-wide, as
//!   `zeMemGetAllocProperties`'s are.
//! - Operands are checked again when a regular list is executed (the memory may have been
//!   freed since the append); a failure there is `InvalidArgument` and nothing is submitted.
//! - A size of 0 is accepted and does nothing; its pointers are still checked.
//! - **Overlapping copies** (source and destination ranges overlap) are allowed and behave as
//!   `memmove`: the destination receives the source bytes as they were before the copy.
//! - **Fill patterns** are 1 to [`MAX_FILL_PATTERN_SIZE`] bytes and a power of two
//!   (`maxMemoryFillPatternSize` of the queue group), else `InvalidSize`. The fill size need not
//!   be a multiple of the pattern: byte `i` of the range gets `pattern[i % pattern.len()]`.
//! - **Barrier**: queues are in order, so a barrier only adds its waits and its signal.
//! - Appending to a closed list, executing an open list, an immediate list, a list of another
//!   device, or a fence of another queue is `InvalidArgument`; executing no list is
//!   `InvalidSize` (`0 == numCommandLists`).
//! - **One context**: a list executed on a queue, and every event appended to a list (signal
//!   or wait), must have been created on the queue's / list's context (Level Zero: "the
//!   application must ensure the command queue, command list and fence were created on the
//!   same context"; the header names no code, so `InvalidArgument`, as for a fence of another
//!   queue). Nothing is appended or submitted then.
//! - **Descriptors**: a queue ([`CommandQueueDesc`]) names group ordinal 0 and an index below
//!   [`QUEUES_PER_GROUP`] (else `InvalidArgument`), a mode up to ASYNCHRONOUS and a priority up
//!   to HIGH (else `InvalidEnumeration`); a command list ([`CommandListDesc`]) names ordinal 0.
//! - **Event pools** hold at least one event (count 0: `InvalidSize`); an event takes an index
//!   below the count that no live event of the pool holds (else `InvalidArgument`), freed when
//!   the event's last clone is dropped.
//! - **Fences** may be created signalled (`ZE_FENCE_FLAG_SIGNALED`): ready until reset.
//! - **Timeouts** are in nanoseconds: 0 only queries, `u64::MAX` waits forever. A wait that
//!   times out returns [`SyncStatus::NotReady`] (`ZE_RESULT_NOT_READY`, 0x1, a success code),
//!   not an error.
//! - **In-flight references**: every submitted batch records the ids of the USM allocations it
//!   references and holds them until the batch has finished, so the free policies of
//!   `zeMemFreeExt` can wait for them (`InFlight`): BLOCKING waits, DEFER and free-now hand
//!   the release to the last batch that references the memory ([`FreePolicy`]).
//! - **Context teardown** (dropping the last [`Context`] handle) releases its USM memory the
//!   DEFER way: memory that queued work of another context's queues still references goes
//!   when that work finishes (its device capacity with it), the rest at once.
//! - **Virtual memory and IPC views in flight**: a submitted batch also holds a reference on
//!   each virtual-memory reservation (by base address) and each opened IPC view (by base) that
//!   its operands touch, until it has finished. `zeVirtualMemUnmap`, `zeVirtualMemFree`,
//!   `zeVirtualMemSetAccessAttribute`, `zeMemCloseIpcHandle` and context teardown **block**
//!   until no queued or running work references the reservation / view they change (Level
//!   Zero leaves this undefined; waiting, as `zeMemFreeExt` BLOCKING does, is the safe choice:
//!   the engine never touches a page that was unmapped or made inaccessible under it). The
//!   granularity is the whole reservation: a call on one mapping of a reservation also waits
//!   for work on another mapping of the same reservation; calls on other reservations, and
//!   `zeVirtualMemMap` (which cannot touch mapped pages), never wait. Such a call waits without
//!   holding any lock (it re-checks under the driver's write lock and waits again if new work
//!   came in), so it cannot block the engines or unrelated calls; it waits forever if the work
//!   waits on an event that is never signalled, as a BLOCKING free does. Calling one of these
//!   from an engine's host function, on memory that a later batch of the same engine uses,
//!   would wait for itself: don't.
//! - **Lock order**: that of [`crate::semantics::driver`] (`usm` -> `vm` -> the IPC view table
//!   -> a reservation's gate -> the in-flight table). The completion path of a batch takes only
//!   the in-flight table (then frees USM memory with no lock held).
//!
//! Every type here is `Send + Sync`. Dropping a [`CommandQueue`] or an immediate
//! [`CommandList`] lets its submitted work finish (a wait on an event that is never signalled
//! is abandoned after about 10 ms) and joins its engine thread.//!
//! # Files
//! - [`args`]: descriptors, fill patterns, pool counts and indices, the one-context rule;
//! - [`event`]: events, event pools and fences (host signal, wait, query, reset, destroy);
//! - [`command`]: recorded commands, their memory operands and the operand checks, in-flight
//!   holds;
//! - [`engine`]: one engine's submission and synchronization, host-synchronous device
//!   operations;
//! - [`list`]: command lists (append, close, reset) and command queues (execute).

pub(crate) mod args;
pub(crate) mod command;
pub(crate) mod engine;
pub(crate) mod event;
pub(crate) mod list;

pub use crate::semantics::queue::args::{
    CommandListDesc, CommandQueueDesc, QueueMode, QueuePriority, MAX_FILL_PATTERN_SIZE,
    QUEUES_PER_GROUP,
};
pub use crate::semantics::queue::command::OperandRule;
pub(crate) use crate::semantics::queue::command::{check_operand, hold, owning_device, Operand};
pub(crate) use crate::semantics::queue::engine::{device_sync_op, Submitter};
pub use crate::spec::{FreePolicy, SyncStatus};

/// Whether Level Zero's queued copies and fills ([`OperandRule::LevelZero`]) take plain system
/// memory of the process (`malloc`, the stack) as an operand: always, on both backends (see the
/// module docs). Level Zero's
/// `sharedSystemAllocCapabilities` reports `ZE_MEMORY_ACCESS_CAP_FLAG_RW` from it.
pub const SYSTEM_MEMORY_IN_QUEUES: bool = true;
