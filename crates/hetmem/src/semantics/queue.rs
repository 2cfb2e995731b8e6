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
//!   Otherwise the append fails with `InvalidArgument` (null: `InvalidNullPointer`) and
//!   nothing is appended. Lookups are driver-wide, as `zeMemGetAllocProperties`'s are.
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
//! - **Lock order**: `usm` -> `vm` -> the IPC view table -> the in-flight table. The completion
//!   path of a batch takes only the in-flight table (then frees USM memory with no lock held).
//!
//! Every type here is `Send + Sync`. Dropping a [`CommandQueue`] or an immediate
//! [`CommandList`] lets its submitted work finish (a wait on an event that is never signalled
//! is abandoned after about 10 ms) and joins its engine thread.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::backend::{Engine, EngineOp, EngineSync};
use crate::error::{Addr, Error, Result};
use crate::semantics::driver::DriverShared;
use crate::semantics::inflight::{wait_until, InFlightRef};
use crate::semantics::usm::UsmState;
use crate::semantics::vmm::VmState;
pub use crate::spec::{FreePolicy, SyncStatus};

/// The largest fill pattern in bytes (`maxMemoryFillPatternSize` of
/// `ze_command_queue_group_properties_t`).
pub const MAX_FILL_PATTERN_SIZE: usize = 128;

/// One memory operand of a command.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Operand {
    pub(crate) ptr: usize,
    pub(crate) size: usize,
    pub(crate) write: bool,
}

/// Checks one operand against live memory (see the module docs); returns what it references
/// (the USM allocation, the reservation or the IPC view).
pub(crate) fn check_operand(
    usm: &UsmState,
    vm: &VmState,
    views: &crate::semantics::ipc::Views<'_>,
    op: Operand,
) -> Result<InFlightRef> {
    let what = if op.write { "destination" } else { "source" };
    if op.ptr == 0 {
        return Err(Error::InvalidNullPointer(format!("{what} pointer is null")));
    }
    let end = op.ptr.checked_add(op.size).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{what} {} + {:#x} overflows",
            Addr(op.ptr),
            op.size
        ))
    })?;
    if let Some((base, size, id, read_only)) = usm.operand_info(op.ptr) {
        if end > base + size {
            return Err(Error::InvalidArgument(format!(
                "{what} [{}, {}) runs past the end {} of its allocation at {}",
                Addr(op.ptr),
                Addr(end),
                Addr(base + size),
                Addr(base)
            )));
        }
        if op.write && read_only {
            return Err(Error::InvalidArgument(format!(
                "{what} {} is in an import recorded read-only",
                Addr(op.ptr)
            )));
        }
        return Ok(InFlightRef::Usm(id));
    }
    if let Some((base, size)) = views.range(op.ptr) {
        // Views are mapped read-write for their whole size (see `crate::ipc`).
        if end > base + size {
            return Err(Error::InvalidArgument(format!(
                "{what} [{}, {}) runs past the end {} of the IPC view at {}",
                Addr(op.ptr),
                Addr(end),
                Addr(base + size),
                Addr(base)
            )));
        }
        return Ok(InFlightRef::View(base));
    }
    match vm.check_device_access(op.ptr, end, op.write) {
        Some(Ok(())) => match vm.pointer_info(op.ptr) {
            Some(info) => Ok(InFlightRef::Reservation(info.reservation.0)),
            None => Err(Error::InvalidArgument(format!(
                "{what} {} is not inside a reservation",
                Addr(op.ptr)
            ))),
        },
        Some(Err(why)) => Err(Error::InvalidArgument(format!("{what}: {why}"))),
        None => Err(Error::InvalidArgument(format!(
            "{what} {} is not inside a USM allocation, an import, an opened IPC view or a \
             virtual-memory reservation",
            Addr(op.ptr)
        ))),
    }
}

/// Checks every operand under the driver's read locks and the IPC view table (usm, vm, views:
/// the lock order); if `hold`, records the in-flight references before the locks are dropped,
/// so no free, unmap or close can slip in between.
pub(crate) fn check_all(d: &DriverShared, cmds: &[Cmd], hold: bool) -> Result<Vec<InFlightRef>> {
    let usm = d.usm.read();
    let vm = d.vm.read();
    let views = crate::semantics::ipc::views(d);
    // The gates of the reservations the operands lie in, in address order: no set-access on
    // them runs between the access check and the references (see `crate::semantics::access`).
    let gates = if hold {
        vm.gates_for(cmds.iter().flat_map(|c| c.operands()).map(|op| op.ptr))
    } else {
        Vec::new()
    };
    let _held: Vec<_> = gates.iter().map(|p| p.exclusive()).collect();
    let mut ids = Vec::new();
    for c in cmds {
        for op in c.operands() {
            ids.push(check_operand(&usm, &vm, &views, op)?);
        }
    }
    ids.sort_unstable();
    ids.dedup();
    if hold {
        d.inflight.acquire(&ids);
    }
    Ok(ids)
}

/// A recorded command.
#[derive(Debug, Clone)]
pub(crate) enum Cmd {
    Copy {
        dst: usize,
        src: usize,
        size: usize,
    },
    Fill {
        ptr: usize,
        pattern: Vec<u8>,
        size: usize,
    },
    /// Signals an event's sync object.
    Signal(Arc<dyn EngineSync>),
    /// Waits for every one of these events' sync objects; each comes with its event's wait
    /// token, taken (upgraded) when the command is queued and held by the engine until the
    /// waits are over, so that the event can tell queued work waits on it
    /// ([`crate::Event::check_destroy`]); a command merely recorded in a list does not hold it.
    Wait(Vec<(Arc<dyn EngineSync>, std::sync::Weak<()>)>),
}

impl Cmd {
    /// The memory operands of the command (at most two; no allocation on the submit path).
    pub(crate) fn operands(&self) -> impl Iterator<Item = Operand> {
        let ops = match *self {
            Cmd::Copy { dst, src, size } => [
                Some(Operand {
                    ptr: dst,
                    size,
                    write: true,
                }),
                Some(Operand {
                    ptr: src,
                    size,
                    write: false,
                }),
            ],
            Cmd::Fill { ptr, size, .. } => [
                Some(Operand {
                    ptr,
                    size,
                    write: true,
                }),
                None,
            ],
            Cmd::Signal(_) | Cmd::Wait(_) => [None, None],
        };
        ops.into_iter().flatten()
    }
}

pub(crate) fn engine_ops(cmds: &[Cmd]) -> Vec<EngineOp> {
    let mut ops = Vec::with_capacity(cmds.len() + 1);
    for c in cmds {
        match c {
            &Cmd::Copy { dst, src, size } => ops.push(EngineOp::Copy { dst, src, size }),
            Cmd::Fill { ptr, pattern, size } => ops.push(EngineOp::Fill {
                ptr: *ptr,
                pattern: pattern.clone(),
                size: *size,
            }),
            Cmd::Signal(e) => ops.push(EngineOp::Signal(e.clone())),
            // One wait per event: the batch goes on once all are signalled.
            Cmd::Wait(evs) => {
                ops.extend(evs.iter().map(|e| EngineOp::Wait(e.0.clone())));
                // The events stay "waited on" until the waits are over (not until the batch
                // ends: a host woken by a later signal of this batch may destroy them).
                let tokens: Vec<Arc<()>> = evs.iter().filter_map(|e| e.1.upgrade()).collect();
                ops.push(EngineOp::Host(Box::new(move || drop(tokens))));
            }
        }
    }
    ops
}

/// The commands of one append: waits, the operation, the signal.
pub(crate) fn with_events(
    core: Option<Cmd>,
    signal: Option<&Arc<dyn EngineSync>>,
    wait: &[(&Arc<dyn EngineSync>, &Arc<()>)],
) -> Vec<Cmd> {
    let mut v = Vec::with_capacity(3);
    if !wait.is_empty() {
        v.push(Cmd::Wait(
            wait.iter()
                .map(|&(e, t)| (e.clone(), Arc::downgrade(t)))
                .collect(),
        ));
    }
    v.extend(core);
    if let Some(e) = signal {
        v.push(Cmd::Signal(e.clone()));
    }
    v
}

pub(crate) fn check_pattern(pattern: &[u8]) -> Result<()> {
    let n = pattern.len();
    if n == 0 || n > MAX_FILL_PATTERN_SIZE || !n.is_power_of_two() {
        return Err(Error::InvalidSize(format!(
            "fill pattern of {n} bytes is not a power of two from 1 to {MAX_FILL_PATTERN_SIZE}"
        )));
    }
    Ok(())
}

/// Queues in the device's one command queue group (`numQueues` of
/// `ze_command_queue_group_properties_t`).
pub const QUEUES_PER_GROUP: u32 = 64;

/// `ze_command_queue_mode_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueMode {
    /// DEFAULT (0): asynchronous here.
    #[default]
    Default = 0,
    /// SYNCHRONOUS (1): each execute (and each append of an immediate list) waits for its work.
    Synchronous = 1,
    /// ASYNCHRONOUS (2).
    Asynchronous = 2,
}

/// `ze_command_queue_priority_t` (recorded; every queue runs alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueuePriority {
    /// NORMAL (0).
    #[default]
    Normal = 0,
    /// PRIORITY_LOW (1).
    Low = 1,
    /// PRIORITY_HIGH (2).
    High = 2,
}

/// `ze_command_queue_desc_t` (`zeCommandQueueCreate`, and the `altdesc` of
/// `zeCommandListCreateImmediate`).
///
/// ```
/// # use hetmem::queue::{CommandQueueDesc, QueueMode};
/// let d = CommandQueueDesc::from_raw(0, 3, 0, 1, 0).unwrap();
/// assert_eq!(d.mode, QueueMode::Synchronous);
/// assert!(CommandQueueDesc::from_raw(1, 0, 0, 0, 0).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommandQueueDesc {
    /// The command queue group ordinal: the device has one group, 0.
    pub ordinal: u32,
    /// The queue index in the group: below [`QUEUES_PER_GROUP`].
    pub index: u32,
    /// `ze_command_queue_flags_t`.
    pub flags: u32,
    /// The mode.
    pub mode: QueueMode,
    /// The priority.
    pub priority: QueuePriority,
}

impl CommandQueueDesc {
    /// Decodes the C fields and checks them ([`CommandQueueDesc::check`]).
    ///
    /// Errors: `InvalidEnumeration` for flags outside `ze_command_queue_flags_t`, a mode past
    /// ASYNCHRONOUS (2) or a priority past HIGH (2); `InvalidArgument` for an ordinal other
    /// than 0 or an index of [`QUEUES_PER_GROUP`] or more. Each names the value.
    pub fn from_raw(
        ordinal: u32,
        index: u32,
        flags: u32,
        mode: u32,
        priority: u32,
    ) -> Result<CommandQueueDesc> {
        crate::spec::FlagSet::CommandQueue.check(flags)?;
        let mode = match mode {
            0 => QueueMode::Default,
            1 => QueueMode::Synchronous,
            2 => QueueMode::Asynchronous,
            m => {
                return Err(Error::InvalidEnumeration(format!(
                    "queue mode {m} is not DEFAULT, SYNCHRONOUS or ASYNCHRONOUS"
                )))
            }
        };
        let priority = match priority {
            0 => QueuePriority::Normal,
            1 => QueuePriority::Low,
            2 => QueuePriority::High,
            p => {
                return Err(Error::InvalidEnumeration(format!(
                    "queue priority {p} is not NORMAL, LOW or HIGH"
                )))
            }
        };
        let d = CommandQueueDesc {
            ordinal,
            index,
            flags,
            mode,
            priority,
        };
        d.check()?;
        Ok(d)
    }

    /// The group rule: ordinal 0 (the one group), index below [`QUEUES_PER_GROUP`]; flags
    /// within their set.
    ///
    /// Errors: as [`CommandQueueDesc::from_raw`].
    pub fn check(&self) -> Result<()> {
        crate::spec::FlagSet::CommandQueue.check(self.flags)?;
        if self.ordinal != 0 || self.index >= QUEUES_PER_GROUP {
            return Err(Error::InvalidArgument(format!(
                "queue group ordinal {} / index {}: the device has one group (ordinal 0) of \
                 {QUEUES_PER_GROUP} queues",
                self.ordinal, self.index
            )));
        }
        Ok(())
    }

    /// Whether the mode is SYNCHRONOUS.
    pub fn is_synchronous(&self) -> bool {
        self.mode == QueueMode::Synchronous
    }
}

/// `ze_command_list_desc_t` (`zeCommandListCreate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommandListDesc {
    /// `commandQueueGroupOrdinal`: the device has one group, 0.
    pub ordinal: u32,
    /// `ze_command_list_flags_t`.
    pub flags: u32,
}

impl CommandListDesc {
    /// Decodes and checks the C fields.
    ///
    /// Errors: `InvalidEnumeration` for flags outside `ze_command_list_flags_t`;
    /// `InvalidArgument` for an ordinal other than 0, naming it.
    pub fn from_raw(ordinal: u32, flags: u32) -> Result<CommandListDesc> {
        let d = CommandListDesc { ordinal, flags };
        d.check()?;
        Ok(d)
    }

    /// The rule of [`CommandListDesc::from_raw`].
    pub fn check(&self) -> Result<()> {
        crate::spec::FlagSet::CommandList.check(self.flags)?;
        if self.ordinal != 0 {
            return Err(Error::InvalidArgument(format!(
                "commandQueueGroupOrdinal {}: the device has one group (ordinal 0)",
                self.ordinal
            )));
        }
        Ok(())
    }
}

/// The event pool rules (`zeEventPoolCreate`): a pool has at least one event.
///
/// Errors: `InvalidSize` for a count of 0.
pub(crate) fn check_pool_count(count: u32) -> Result<()> {
    if count == 0 {
        return Err(Error::InvalidSize("event pool count is 0".into()));
    }
    Ok(())
}

/// Takes slot `index` of a pool of `count` events whose live slots are `used`
/// (`zeEventCreate`): the index is below the count and not taken by a live event.
///
/// Errors: `InvalidArgument` naming the index (and the count).
pub(crate) fn take_pool_index(
    used: &mut std::collections::BTreeSet<u32>,
    count: u32,
    index: u32,
) -> Result<()> {
    if index >= count {
        return Err(Error::InvalidArgument(format!(
            "event index {index} is not below the pool's count {count}"
        )));
    }
    if !used.insert(index) {
        return Err(Error::InvalidArgument(format!(
            "event index {index} of the pool is already in use"
        )));
    }
    Ok(())
}

/// The one-context rule (Level Zero: "the application must ensure the command queue, command
/// list and fence were created on the same context"; events appended to a list likewise):
/// an object of another context is `InvalidArgument`, naming what.
pub(crate) fn check_same_context(what: &str, theirs: u64, ours: u64) -> Result<()> {
    if theirs != ours {
        return Err(Error::InvalidArgument(format!(
            "{what} was created on context {theirs}, not on this object's context {ours}"
        )));
    }
    Ok(())
}

/// Submitted / completed batch counters of one engine.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    pub(crate) counts: Mutex<(u64, u64)>,
    pub(crate) cv: Condvar,
}

/// One engine and its bookkeeping: what a queue and an immediate list share.
#[derive(Debug)]
pub(crate) struct Submitter {
    pub(crate) driver: Arc<DriverShared>,
    pub(crate) progress: Arc<Progress>,
    // Dropped last: joins the engine thread after the rest is gone.
    pub(crate) engine: Box<dyn Engine>,
}

impl Submitter {
    pub(crate) fn new(driver: Arc<DriverShared>, device: u32) -> Result<Submitter> {
        let engine = driver.backend.create_engine(device)?;
        Ok(Submitter {
            driver,
            progress: Arc::default(),
            engine,
        })
    }

    /// Validates `cmds`, holds their references and submits them as one batch.
    pub(crate) fn submit(&self, cmds: &[Cmd], fence: Option<Arc<dyn EngineSync>>) -> Result<()> {
        let ids = check_all(&self.driver, cmds, true)?;
        let mut ops = engine_ops(cmds);
        let driver = self.driver.clone();
        let progress = self.progress.clone();
        ops.push(EngineOp::Host(Box::new(move || {
            for p in driver.inflight.release(&ids) {
                p.finish(driver.backend.as_ref());
            }
            if let Some(f) = fence {
                f.signal();
            }
            progress.counts.lock().1 += 1;
            progress.cv.notify_all();
        })));
        self.progress.counts.lock().0 += 1;
        // SAFETY: every operand was checked against live memory with the right access, and the
        // USM allocations it references are held in flight until the batch's last op has run.
        unsafe { self.engine.submit(ops) };
        Ok(())
    }

    /// Queues a host function after everything submitted before, counted as one batch (for
    /// stream-ordered managed-memory work, [`crate::managed::Stream`]).
    pub(crate) fn submit_host(&self, f: Box<dyn FnOnce() + Send>) {
        let progress = self.progress.clone();
        let ops = vec![
            EngineOp::Host(f),
            EngineOp::Host(Box::new(move || {
                progress.counts.lock().1 += 1;
                progress.cv.notify_all();
            })),
        ];
        self.progress.counts.lock().0 += 1;
        // SAFETY: no memory operation; host functions only.
        unsafe { self.engine.submit(ops) };
    }

    /// Waits for every batch submitted before the call.
    ///
    /// Errors: the first failure of queued work on the engine since the last synchronize
    /// ([`Engine::take_error`]; `Unknown`, naming the failed call and "device lost" for a
    /// sticky CUDA error),
    /// reported once, after the wait.
    pub(crate) fn synchronize(&self, timeout_ns: u64) -> Result<SyncStatus> {
        let target = self.progress.counts.lock().0;
        let status = SyncStatus::of(wait_until(
            &self.progress.counts,
            &self.progress.cv,
            timeout_ns,
            |c| c.1 >= target,
        ));
        match self.engine.take_error() {
            Some(e) => Err(e.into()),
            None => Ok(status),
        }
    }
}

/// Runs one copy or fill on the engine of the device that owns the first device side (device
/// 0 if none does) and waits for it: a host-synchronous call (ACL's `aclrtMemcpy` /
/// `aclrtMemset`) whose memory the host cannot reach (device memory on the cuda backend). `device_sides` are the operands that must be memory this driver
/// knows, checked as a queue's are ([`check_operand`]: live, inside
/// its allocation, reservation pages mapped with the access needed) and held in flight
/// until the operation has run, so a concurrent free waits for it; the caller has checked
/// any other side as host memory (which CUDA copies reach as pageable memory).
///
/// Errors: those of `check_operand` (`InvalidArgument`, `InvalidNullPointer`), before
/// anything runs; those of making the engine or its sync object.
pub(crate) fn device_sync_op(
    d: &Arc<DriverShared>,
    device_sides: &[Operand],
    op: EngineOp,
) -> Result<()> {
    // Released (and a free waiting on them finished) when they drop, after the operation.
    let _held = device_sides
        .iter()
        .map(|&o| hold(d, o))
        .collect::<Result<Vec<HeldOperand>>>()?;
    // The device whose memory the first device side is (device 0 for host memory and views):
    // its engine reaches that memory without peer access.
    let device = device_sides
        .first()
        .and_then(|o| owning_device(d, o.ptr))
        .unwrap_or(0);
    let mut engines = d.sync_engines.lock();
    let engine = match engines.entry(device) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(v) => v.insert(d.backend.create_engine(device)?),
    };
    let sync = d.backend.create_sync()?;
    // SAFETY: the device sides are live and held in flight (above) until `_held` drops,
    // after the signal; the host sides are the caller's, as its contract says.
    unsafe { engine.submit(vec![op, EngineOp::Signal(sync.clone())]) };
    sync.wait_ns(u64::MAX);
    match engine.take_error() {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// The device whose memory `ptr` is: a device USM allocation's device, or the device of the
/// physical memory mapped at a reserved address; `None` for anything else.
pub(crate) fn owning_device(d: &DriverShared, ptr: usize) -> Option<u32> {
    if let Some((_, r)) = d.usm.read().find(ptr) {
        return r.device;
    }
    match d.vm.read().pointer_info(ptr)?.mapped? {
        (_, crate::backend::PhysicalLocation::Device(dev), _) => Some(dev),
        _ => None,
    }
}

/// Checks `o` as a queue operand ([`check_operand`], under the reservation's gate so that no
/// set-access slips in, see `crate::semantics::access`) and holds it in flight until the
/// returned guard drops, so a free of its memory waits.
///
/// Errors: those of [`check_operand`] (`InvalidArgument`, `InvalidNullPointer`).
pub(crate) fn hold(d: &Arc<DriverShared>, o: Operand) -> Result<HeldOperand> {
    let usm = d.usm.read();
    let vm = d.vm.read();
    let views = crate::semantics::ipc::views(d);
    let gates = vm.gates_for([o.ptr]);
    let _held: Vec<_> = gates.iter().map(|p| p.exclusive()).collect();
    let r = check_operand(&usm, &vm, &views, o)?;
    d.inflight.acquire(&[r]);
    Ok(HeldOperand {
        driver: d.clone(),
        r,
    })
}

/// An operand's in-flight reference, released on drop ([`CommandQueue::hold_operand`]).
#[derive(Debug)]
pub(crate) struct HeldOperand {
    pub(crate) driver: Arc<DriverShared>,
    pub(crate) r: InFlightRef,
}

impl Drop for HeldOperand {
    fn drop(&mut self) {
        for p in self.driver.inflight.release(&[self.r]) {
            p.finish(self.driver.backend.as_ref());
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Recorded {
    pub(crate) cmds: Vec<Cmd>,
    pub(crate) closed: bool,
}

#[derive(Debug)]
pub(crate) enum ListKind {
    Regular(Mutex<Recorded>),
    Immediate(Submitter),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AllocDesc, Runtime};

    #[test]
    fn in_flight_references_last_until_the_batch_finishes() {
        let rt = Runtime::builder()
            .host_devices(1)
            .host_device_memory(256 << 20)
            .build()
            .unwrap();
        let dev = rt.driver().device(0).unwrap();
        let ctx = rt.driver().create_context().unwrap();
        let a = ctx.alloc_device(&dev, &AllocDesc::new(64 << 20)).unwrap();
        let b = ctx.alloc_host(&AllocDesc::new(64 << 20)).unwrap();
        let ia = ctx.get_allocation_properties(a).unwrap().id;
        let q = ctx.create_command_queue(&dev).unwrap();
        let l = ctx.create_command_list(&dev).unwrap();
        let gate = ctx.create_event().unwrap();
        l.append_memory_copy(a, b, 64 << 20, None, &[&gate])
            .unwrap();
        l.close().unwrap();
        let inflight = &rt.driver().shared.inflight;
        assert!(!inflight.is_referenced_ref(InFlightRef::Usm(ia)));
        q.execute_command_lists(&[&l], None).unwrap();
        assert!(inflight.is_referenced_ref(InFlightRef::Usm(ia)));
        gate.host_signal().unwrap();
        inflight.wait_unreferenced(ia);
        assert!(!inflight.is_referenced_ref(InFlightRef::Usm(ia)));
        assert_eq!(q.synchronize(u64::MAX).unwrap(), SyncStatus::Ready);
    }

    /// An engine whose queued work failed (as a CUDA stream's asynchronous call can) makes the
    /// next synchronize fail with that error, once: no failed copy passes for a finished one.
    #[test]
    fn a_failure_of_queued_work_is_reported_by_the_next_synchronize_once() {
        #[derive(Debug)]
        struct Failing(parking_lot::Mutex<Option<crate::backend::HalError>>);
        impl Engine for Failing {
            unsafe fn submit(&self, ops: Vec<EngineOp>) {
                for op in ops {
                    if let EngineOp::Host(f) = op {
                        f();
                    }
                }
                *self.0.lock() = Some(crate::backend::HalError::DeviceLost(
                    "cuMemcpyAsync failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)".into(),
                ));
            }
            fn take_error(&self) -> Option<crate::backend::HalError> {
                self.0.lock().take()
            }
        }
        let rt = Runtime::builder()
            .host_devices(1)
            .host_device_memory(64 << 20)
            .build()
            .unwrap();
        let sub = Submitter {
            driver: rt.driver().shared.clone(),
            progress: Arc::default(),
            engine: Box::new(Failing(parking_lot::Mutex::new(None))),
        };
        assert_eq!(sub.synchronize(u64::MAX).unwrap(), SyncStatus::Ready);
        sub.submit_host(Box::new(|| {}));
        let e = sub.synchronize(u64::MAX).unwrap_err();
        // The one conversion of backend errors (`error.rs`): a lost device is UNKNOWN, named.
        assert_eq!(e.ze_result(), 0x7fff_fffe /* UNKNOWN */, "{e}");
        assert!(
            e.message().contains("device lost") && e.message().contains("ILLEGAL_ADDRESS"),
            "{e}"
        );
        assert_eq!(sub.synchronize(u64::MAX).unwrap(), SyncStatus::Ready);
    }
}
