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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::backend::{Engine, EngineOp, EngineSync};
use crate::driver::{Context, Device, Driver, DriverShared};
use crate::error::{Addr, Error, Result};
use crate::usm::{PendingFree, UsmState};
use crate::vmm::VmState;

/// The largest fill pattern in bytes (`maxMemoryFillPatternSize` of
/// `ze_command_queue_group_properties_t`).
pub const MAX_FILL_PATTERN_SIZE: usize = 128;

/// The outcome of a query or a wait with a timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SyncStatus {
    /// `ZE_RESULT_SUCCESS`: signalled / finished.
    Ready,
    /// `ZE_RESULT_NOT_READY` (0x1): not yet (the timeout expired first). A success code in
    /// Level Zero, so not an [`Error`].
    NotReady,
}

impl SyncStatus {
    /// The `ze_result_t` value: 0 for `Ready`, 1 for `NotReady`.
    pub fn ze_result(self) -> u32 {
        match self {
            SyncStatus::Ready => 0,
            SyncStatus::NotReady => 1,
        }
    }

    fn of(ready: bool) -> SyncStatus {
        if ready {
            SyncStatus::Ready
        } else {
            SyncStatus::NotReady
        }
    }
}

/// Waits on `cv` until `done(state)` or the timeout (ns; 0 = no wait, `u64::MAX` = forever).
fn wait_until<T>(
    m: &Mutex<T>,
    cv: &Condvar,
    timeout_ns: u64,
    mut done: impl FnMut(&T) -> bool,
) -> bool {
    let mut g = m.lock();
    if done(&g) {
        return true;
    }
    if timeout_ns == 0 {
        return false;
    }
    let deadline = if timeout_ns == u64::MAX {
        None
    } else {
        Instant::now().checked_add(Duration::from_nanos(timeout_ns))
    };
    while !done(&g) {
        match deadline {
            None => cv.wait(&mut g),
            Some(d) => {
                if cv.wait_until(&mut g, d).timed_out() {
                    return done(&g);
                }
            }
        }
    }
    true
}

/// A signalled / not-signalled flag: the state of an event or a fence.
#[derive(Debug, Default)]
struct Flag {
    set: Mutex<bool>,
    cv: Condvar,
}

impl Flag {
    fn reset(&self) {
        *self.set.lock() = false;
    }
    fn is_set(&self) -> bool {
        *self.set.lock()
    }
}

impl EngineSync for Flag {
    fn wait_ns(&self, timeout_ns: u64) -> bool {
        wait_until(&self.set, &self.cv, timeout_ns, |s| *s)
    }
    fn signal(&self) {
        *self.set.lock() = true;
        self.cv.notify_all();
    }
}

/// An event (`ze_event_handle_t`, host-visible, in an implicit pool): signalled by the host or
/// by a command, waited on by the host or by commands of any queue. Clones are the same event.
#[derive(Debug, Clone)]
pub struct Event {
    flag: Arc<Flag>,
}

impl Event {
    /// Signals the event from the host (`zeEventHostSignal`); signalling a signalled event
    /// keeps it signalled. Wakes every host and engine wait on it.
    ///
    /// Errors: none; always `Ok` (the `Result` is kept for the C ABI's `ze_result_t`).
    pub fn host_signal(&self) -> Result<()> {
        self.flag.signal();
        Ok(())
    }

    /// Waits up to `timeout_ns` nanoseconds for the event (`zeEventHostSynchronize`); 0 only
    /// queries, `u64::MAX` waits forever. Returns `NotReady` if it is still not signalled.
    ///
    /// Errors: none; always `Ok` (the `Result` is kept for the C ABI's `ze_result_t`).
    pub fn host_synchronize(&self, timeout_ns: u64) -> Result<SyncStatus> {
        Ok(SyncStatus::of(self.flag.wait_ns(timeout_ns)))
    }

    /// Whether the event is signalled (`zeEventQueryStatus`): `Ready` or `NotReady`.
    ///
    /// Errors: none; always `Ok` (the `Result` is kept for the C ABI's `ze_result_t`).
    pub fn query_status(&self) -> Result<SyncStatus> {
        Ok(SyncStatus::of(self.flag.is_set()))
    }

    /// Resets the event to not signalled (`zeEventHostReset`); resetting an unsignalled event
    /// does nothing. Commands already queued that will signal it still do.
    ///
    /// Errors: none; always `Ok` (the `Result` is kept for the C ABI's `ze_result_t`).
    pub fn host_reset(&self) -> Result<()> {
        self.flag.reset();
        Ok(())
    }
}

/// A fence (`ze_fence_handle_t`) of one command queue: signalled when the batch of command
/// lists it was passed with has finished.
#[derive(Debug, Clone)]
pub struct Fence {
    flag: Arc<Flag>,
    queue: u64,
}

impl Fence {
    /// Waits up to `timeout_ns` nanoseconds for the fence (`zeFenceHostSynchronize`); 0 only
    /// queries, `u64::MAX` waits forever. Returns `NotReady` if it is still not signalled.
    ///
    /// Errors: none; always `Ok` (the `Result` is kept for the C ABI's `ze_result_t`).
    pub fn host_synchronize(&self, timeout_ns: u64) -> Result<SyncStatus> {
        Ok(SyncStatus::of(self.flag.wait_ns(timeout_ns)))
    }

    /// Whether the fence is signalled (`zeFenceQueryStatus`): `Ready` or `NotReady`.
    ///
    /// Errors: none; always `Ok` (the `Result` is kept for the C ABI's `ze_result_t`).
    pub fn query_status(&self) -> Result<SyncStatus> {
        Ok(SyncStatus::of(self.flag.is_set()))
    }

    /// Resets the fence to not signalled (`zeFenceReset`); a batch still running with it
    /// signals it when it finishes.
    ///
    /// Errors: none; always `Ok` (the `Result` is kept for the C ABI's `ze_result_t`).
    pub fn reset(&self) -> Result<()> {
        self.flag.reset();
        Ok(())
    }
}

/// What a submitted batch holds a reference on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum InFlightRef {
    /// A USM allocation or import, by id.
    Usm(u64),
    /// A virtual-memory reservation, by base address.
    Reservation(usize),
    /// An opened IPC view ([`crate::ipc`]), by base address.
    View(usize),
}

/// Driver-wide counts of in-flight references (USM allocations by id, reservations and IPC
/// views by base): how many submitted batches that reference each have not finished; and the
/// USM frees waiting for those counts to reach zero (`zeMemFreeExt`).
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    state: Mutex<InFlightState>,
    cv: Condvar,
    /// Threads blocked in [`InFlight::wait_unreferenced_ref`] right now (diagnostics, tests).
    waiters: AtomicU64,
    /// Distinct reservations referenced by in-flight work. Changed only under `state`; read
    /// without it by [`vm_write_unreferenced`]'s fast path, under the vm write lock (which no
    /// submission holds, so the count cannot grow then).
    reservations: AtomicU64,
}

#[derive(Debug, Default)]
struct InFlightState {
    counts: HashMap<InFlightRef, usize>,
    pending: HashMap<u64, PendingFree>,
}

impl InFlight {
    fn acquire(&self, refs: &[InFlightRef]) {
        let mut st = self.state.lock();
        for &r in refs {
            let n = st.counts.entry(r).or_insert(0);
            if *n == 0 && matches!(r, InFlightRef::Reservation(_)) {
                self.reservations.fetch_add(1, Ordering::Release);
            }
            *n += 1;
        }
    }

    /// Drops one reference to each of `refs`; returns the pending frees whose last reference
    /// this was (the caller releases them, outside the lock).
    fn release(&self, refs: &[InFlightRef]) -> Vec<PendingFree> {
        let mut st = self.state.lock();
        let mut ready = Vec::new();
        for r in refs {
            if let Some(n) = st.counts.get_mut(r) {
                *n -= 1;
                if *n == 0 {
                    st.counts.remove(r);
                    if matches!(r, InFlightRef::Reservation(_)) {
                        self.reservations.fetch_sub(1, Ordering::Release);
                    }
                    if let InFlightRef::Usm(id) = r {
                        ready.extend(st.pending.remove(id));
                    }
                }
            }
        }
        drop(st);
        self.cv.notify_all();
        ready
    }

    /// Whether queued or running work references `r`.
    pub(crate) fn is_referenced_ref(&self, r: InFlightRef) -> bool {
        self.state.lock().counts.contains_key(&r)
    }

    /// Waits until no queued or running work references allocation `id`.
    pub(crate) fn wait_unreferenced(&self, id: u64) {
        self.wait_unreferenced_ref(InFlightRef::Usm(id))
    }

    /// Waits until no queued or running work references `r`. The caller must hold no lock of
    /// the driver (see the lock order in the module docs).
    pub(crate) fn wait_unreferenced_ref(&self, r: InFlightRef) {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        wait_until(&self.state, &self.cv, u64::MAX, |st| {
            !st.counts.contains_key(&r)
        });
        self.waiters.fetch_sub(1, Ordering::SeqCst);
    }

    /// Number of threads blocked waiting for in-flight work to let go of a reservation or view.
    pub(crate) fn waiters(&self) -> u64 {
        self.waiters.load(Ordering::SeqCst)
    }

    /// If work references `p`'s allocation, keeps `p` to be released when that work finishes
    /// and returns `None`; otherwise gives `p` back to be released now. Atomic with
    /// [`InFlight::release`], so a free is never lost between the check and the keep.
    pub(crate) fn defer_or_return(&self, p: PendingFree) -> Option<PendingFree> {
        let mut st = self.state.lock();
        if st.counts.contains_key(&InFlightRef::Usm(p.id())) {
            st.pending.insert(p.id(), p);
            None
        } else {
            Some(p)
        }
    }

    /// Number of frees waiting for work to finish.
    pub(crate) fn pending_frees(&self) -> usize {
        self.state.lock().pending.len()
    }
}

/// One memory operand of a command.
#[derive(Debug, Clone, Copy)]
struct Operand {
    ptr: usize,
    size: usize,
    write: bool,
}

/// Checks one operand against live memory (see the module docs); returns what it references
/// (the USM allocation, the reservation or the IPC view).
fn check_operand(
    usm: &UsmState,
    vm: &VmState,
    views: &crate::ipc::Views<'_>,
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
fn check_all(d: &DriverShared, cmds: &[Cmd], hold: bool) -> Result<Vec<InFlightRef>> {
    let usm = d.usm.read();
    let vm = d.vm.read();
    let views = crate::ipc::views(d);
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
enum Cmd {
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
    Signal(Event),
    Wait(Vec<Event>),
}

impl Cmd {
    /// The memory operands of the command (at most two; no allocation on the submit path).
    fn operands(&self) -> impl Iterator<Item = Operand> {
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

fn engine_ops(cmds: &[Cmd]) -> Vec<EngineOp> {
    let mut ops = Vec::with_capacity(cmds.len() + 1);
    for c in cmds {
        match c {
            &Cmd::Copy { dst, src, size } => ops.push(EngineOp::Copy { dst, src, size }),
            Cmd::Fill { ptr, pattern, size } => ops.push(EngineOp::Fill {
                ptr: *ptr,
                pattern: pattern.clone(),
                size: *size,
            }),
            Cmd::Signal(e) => ops.push(EngineOp::Signal(e.flag.clone())),
            // One wait per event: the batch goes on once all are signalled.
            Cmd::Wait(evs) => ops.extend(evs.iter().map(|e| EngineOp::Wait(e.flag.clone()))),
        }
    }
    ops
}

/// The commands of one append: waits, the operation, the signal.
fn with_events(core: Option<Cmd>, signal: Option<&Event>, wait: &[&Event]) -> Vec<Cmd> {
    let mut v = Vec::with_capacity(3);
    if !wait.is_empty() {
        v.push(Cmd::Wait(wait.iter().map(|&e| e.clone()).collect()));
    }
    v.extend(core);
    if let Some(e) = signal {
        v.push(Cmd::Signal(e.clone()));
    }
    v
}

fn check_pattern(pattern: &[u8]) -> Result<()> {
    let n = pattern.len();
    if n == 0 || n > MAX_FILL_PATTERN_SIZE || !n.is_power_of_two() {
        return Err(Error::InvalidSize(format!(
            "fill pattern of {n} bytes is not a power of two from 1 to {MAX_FILL_PATTERN_SIZE}"
        )));
    }
    Ok(())
}

/// Submitted / completed batch counters of one engine.
#[derive(Debug, Default)]
struct Progress {
    counts: Mutex<(u64, u64)>,
    cv: Condvar,
}

/// One engine and its bookkeeping: what a queue and an immediate list share.
#[derive(Debug)]
struct Submitter {
    driver: Arc<DriverShared>,
    progress: Arc<Progress>,
    // Dropped last: joins the engine thread after the rest is gone.
    engine: Box<dyn Engine>,
}

impl Submitter {
    fn new(driver: Arc<DriverShared>, device: u32) -> Result<Submitter> {
        let engine = driver.backend.create_engine(device)?;
        Ok(Submitter {
            driver,
            progress: Arc::default(),
            engine,
        })
    }

    /// Validates `cmds`, holds their references and submits them as one batch.
    fn submit(&self, cmds: &[Cmd], fence: Option<Arc<Flag>>) -> Result<()> {
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
    fn submit_host(&self, f: Box<dyn FnOnce() + Send>) {
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
    fn synchronize(&self, timeout_ns: u64) -> SyncStatus {
        let target = self.progress.counts.lock().0;
        SyncStatus::of(wait_until(
            &self.progress.counts,
            &self.progress.cv,
            timeout_ns,
            |c| c.1 >= target,
        ))
    }
}

static NEXT_QUEUE: AtomicU64 = AtomicU64::new(1);

/// A command queue (`ze_command_queue_handle_t`, asynchronous mode) on one device: executes
/// closed command lists in submission order on its own engine. CUDA: a stream.
#[derive(Debug)]
pub struct CommandQueue {
    // The engine (inside `sub`) is dropped first, so submitted work never outlives the context.
    sub: Submitter,
    device: Device,
    id: u64,
    _ctx: Context,
}

impl CommandQueue {
    /// The device the queue executes on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Creates a fence of this queue, not signalled (`zeFenceCreate`).
    pub fn create_fence(&self) -> Result<Fence> {
        Ok(Fence {
            flag: Arc::default(),
            queue: self.id,
        })
    }

    /// Submits `lists`, in order, as one batch (`zeCommandQueueExecuteCommandLists`); returns
    /// at once. `fence`, if given, is signalled when the whole batch has finished.
    ///
    /// Errors: `InvalidSize` for no list; `InvalidArgument` for a list that is open, immediate
    /// or of another device, a fence of another queue, or an operand that is no longer live
    /// memory with the needed access (nothing is submitted then).
    pub fn execute_command_lists(
        &self,
        lists: &[&CommandList],
        fence: Option<&Fence>,
    ) -> Result<()> {
        if lists.is_empty() {
            return Err(Error::InvalidSize("no command list to execute".into()));
        }
        if let Some(f) = fence {
            if f.queue != self.id {
                return Err(Error::InvalidArgument(
                    "the fence was created on another command queue".into(),
                ));
            }
        }
        let mut cmds = Vec::new();
        for (i, l) in lists.iter().enumerate() {
            if l.device != self.device {
                return Err(Error::InvalidArgument(format!(
                    "command list {i} is for device {}, the queue for device {}",
                    l.device.ordinal(),
                    self.device.ordinal()
                )));
            }
            match &l.kind {
                ListKind::Immediate(_) => {
                    return Err(Error::InvalidArgument(format!(
                        "command list {i} is immediate and cannot be executed on a queue"
                    )))
                }
                ListKind::Regular(r) => {
                    let r = r.lock();
                    if !r.closed {
                        return Err(Error::InvalidArgument(format!(
                            "command list {i} is not closed"
                        )));
                    }
                    cmds.extend(r.cmds.iter().cloned());
                }
            }
        }
        self.sub.submit(&cmds, fence.map(|f| f.flag.clone()))
    }

    /// Waits up to `timeout_ns` nanoseconds for every batch submitted before the call
    /// (`zeCommandQueueSynchronize`); 0 only queries, `u64::MAX` waits forever. Returns
    /// `NotReady` if work is still running when the timeout expires.
    pub fn synchronize(&self, timeout_ns: u64) -> Result<SyncStatus> {
        Ok(self.sub.synchronize(timeout_ns))
    }
}

impl CommandQueue {
    /// Queues a host function in order on the queue's engine (CUDA: `cuLaunchHostFunc`): how
    /// managed-memory streams ([`crate::managed::Stream`]) run their stream-ordered work.
    pub(crate) fn submit_host(&self, f: Box<dyn FnOnce() + Send>) {
        self.sub.submit_host(f)
    }

    /// Checks `[ptr, ptr+size)` as a memory operand (the rules in the module docs) and holds
    /// its in-flight reference until the returned guard is dropped: the plain-memory side of
    /// a managed stream copy ([`crate::managed::Stream::memcpy_async`]).
    ///
    /// Errors: as an append: `InvalidNullPointer`, `InvalidArgument`.
    pub(crate) fn hold_operand(&self, ptr: usize, size: usize, write: bool) -> Result<HeldOperand> {
        let d = &self.sub.driver;
        let usm = d.usm.read();
        let vm = d.vm.read();
        let views = crate::ipc::views(d);
        let r = check_operand(&usm, &vm, &views, Operand { ptr, size, write })?;
        d.inflight.acquire(&[r]);
        Ok(HeldOperand {
            driver: d.clone(),
            r,
        })
    }
}

/// An operand's in-flight reference, released on drop ([`CommandQueue::hold_operand`]).
#[derive(Debug)]
pub(crate) struct HeldOperand {
    driver: Arc<DriverShared>,
    r: InFlightRef,
}

impl Drop for HeldOperand {
    fn drop(&mut self) {
        for p in self.driver.inflight.release(&[self.r]) {
            p.finish(self.driver.backend.as_ref());
        }
    }
}

#[derive(Debug, Default)]
struct Recorded {
    cmds: Vec<Cmd>,
    closed: bool,
}

#[derive(Debug)]
enum ListKind {
    Regular(Mutex<Recorded>),
    Immediate(Submitter),
}

/// A command list (`ze_command_list_handle_t`) on one device: regular (recorded, closed, then
/// executed on a [`CommandQueue`]) or immediate (each command is submitted to the list's own
/// engine as it is appended). Appends validate their operands at once (see the module docs).
#[derive(Debug)]
pub struct CommandList {
    kind: ListKind,
    device: Device,
    driver: Arc<DriverShared>,
    _ctx: Context,
}

impl CommandList {
    /// Whether the list is immediate.
    pub fn is_immediate(&self) -> bool {
        matches!(self.kind, ListKind::Immediate(_))
    }

    /// The device the list is for.
    pub fn device(&self) -> &Device {
        &self.device
    }

    fn append(&self, cmds: Vec<Cmd>) -> Result<()> {
        match &self.kind {
            ListKind::Immediate(sub) => sub.submit(&cmds, None),
            ListKind::Regular(r) => {
                let mut r = r.lock();
                if r.closed {
                    return Err(Error::InvalidArgument(
                        "the command list is closed; reset it to append".into(),
                    ));
                }
                check_all(&self.driver, &cmds, false)?;
                r.cmds.extend(cmds);
                Ok(())
            }
        }
    }

    /// Appends a copy of `size` bytes from `src` to `dst` (`zeCommandListAppendMemoryCopy`),
    /// between any two kinds of memory (host, device, shared, imported, opened IPC views,
    /// virtual-memory mappings). It starts after the events in `wait` are signalled and signals `signal` when
    /// done. Overlapping ranges behave as `memmove`. CUDA: `cuMemcpyAsync`.
    ///
    /// Errors (nothing appended): `InvalidNullPointer` for a null pointer; `InvalidArgument` if
    /// either range is not wholly inside live memory with the needed access (source readable,
    /// destination writable; a read-only import is not writable) or the list is closed.
    pub fn append_memory_copy(
        &self,
        dst: usize,
        src: usize,
        size: usize,
        signal: Option<&Event>,
        wait: &[&Event],
    ) -> Result<()> {
        self.append(with_events(
            Some(Cmd::Copy { dst, src, size }),
            signal,
            wait,
        ))
    }

    /// Appends a fill of `size` bytes at `ptr` with `pattern` repeated
    /// (`zeCommandListAppendMemoryFill`): byte `i` gets `pattern[i % pattern.len()]`, so `size`
    /// need not be a multiple of the pattern. Events as [`CommandList::append_memory_copy`].
    /// CUDA: `cuMemsetD8Async` / `cuMemsetD32Async` (other patterns: a pattern copy).
    ///
    /// Errors (nothing appended): `InvalidSize` unless `pattern.len()` is a power of two from 1
    /// to [`MAX_FILL_PATTERN_SIZE`]; `InvalidNullPointer` for a null `ptr`; `InvalidArgument`
    /// if the range is not wholly inside live writable memory or the list is closed.
    pub fn append_memory_fill(
        &self,
        ptr: usize,
        pattern: &[u8],
        size: usize,
        signal: Option<&Event>,
        wait: &[&Event],
    ) -> Result<()> {
        check_pattern(pattern)?;
        let fill = Cmd::Fill {
            ptr,
            pattern: pattern.to_vec(),
            size,
        };
        self.append(with_events(Some(fill), signal, wait))
    }

    /// Appends a barrier (`zeCommandListAppendBarrier`): later commands start only after the
    /// earlier ones and the events in `wait`; `signal` is signalled when it is reached. Queues
    /// are in order, so this is exactly its waits and its signal.
    ///
    /// Errors: `InvalidArgument` if the list is closed.
    pub fn append_barrier(&self, signal: Option<&Event>, wait: &[&Event]) -> Result<()> {
        self.append(with_events(None, signal, wait))
    }

    /// Appends a signal of `event` once every earlier command has finished
    /// (`zeCommandListAppendSignalEvent`). CUDA: `cuEventRecord`.
    ///
    /// Errors: `InvalidArgument` if the list is closed.
    pub fn append_signal_event(&self, event: &Event) -> Result<()> {
        self.append(vec![Cmd::Signal(event.clone())])
    }

    /// Appends a wait: later commands start only once every event in `events` is signalled
    /// (`zeCommandListAppendWaitOnEvents`). CUDA: `cuStreamWaitEvent`.
    ///
    /// Errors: `InvalidSize` for no event (`0 == numEvents`); `InvalidArgument` if the list is
    /// closed.
    pub fn append_wait_on_events(&self, events: &[&Event]) -> Result<()> {
        if events.is_empty() {
            return Err(Error::InvalidSize("no event to wait on".into()));
        }
        self.append(with_events(None, None, events))
    }

    /// Closes the list for execution (`zeCommandListClose`); no more appends until
    /// [`CommandList::reset`]. An immediate list has nothing to close: no-op.
    pub fn close(&self) -> Result<()> {
        if let ListKind::Regular(r) = &self.kind {
            r.lock().closed = true;
        }
        Ok(())
    }

    /// Empties the list and reopens it for appends (`zeCommandListReset`). Batches already
    /// submitted keep their own copy of the commands. An immediate list: no-op.
    pub fn reset(&self) -> Result<()> {
        if let ListKind::Regular(r) = &self.kind {
            *r.lock() = Recorded::default();
        }
        Ok(())
    }

    /// Waits up to `timeout_ns` nanoseconds for everything appended to an immediate list
    /// (`zeCommandListHostSynchronize`); 0 only queries, `u64::MAX` waits forever. A regular
    /// list has nothing in flight of its own: `Ready`.
    pub fn host_synchronize(&self, timeout_ns: u64) -> Result<SyncStatus> {
        Ok(match &self.kind {
            ListKind::Immediate(sub) => sub.synchronize(timeout_ns),
            ListKind::Regular(_) => SyncStatus::Ready,
        })
    }
}

impl Context {
    /// Creates an asynchronous, in-order command queue on `device` with its own engine
    /// (`zeCommandQueueCreate`; host: a worker thread, CUDA: a stream).
    ///
    /// Errors: `InvalidNullHandle` for a device of another driver; `OutOfHostMemory` if the
    /// engine cannot be started.
    pub fn create_command_queue(&self, device: &Device) -> Result<CommandQueue> {
        self.check_device(device)?;
        let driver = self.driver().shared;
        Ok(CommandQueue {
            sub: Submitter::new(driver, device.ordinal())?,
            device: device.clone(),
            id: NEXT_QUEUE.fetch_add(1, Ordering::Relaxed),
            _ctx: self.clone(),
        })
    }

    /// Creates an empty, open regular command list for `device` (`zeCommandListCreate`).
    ///
    /// Errors: `InvalidNullHandle` for a device of another driver.
    pub fn create_command_list(&self, device: &Device) -> Result<CommandList> {
        self.check_device(device)?;
        Ok(CommandList {
            kind: ListKind::Regular(Mutex::default()),
            device: device.clone(),
            driver: self.driver().shared,
            _ctx: self.clone(),
        })
    }

    /// Creates an immediate command list for `device` (`zeCommandListCreateImmediate`,
    /// asynchronous mode): each append is validated and submitted to the list's own engine at
    /// once.
    ///
    /// Errors: as [`Context::create_command_queue`].
    pub fn create_immediate_command_list(&self, device: &Device) -> Result<CommandList> {
        self.check_device(device)?;
        let driver = self.driver().shared;
        Ok(CommandList {
            kind: ListKind::Immediate(Submitter::new(driver.clone(), device.ordinal())?),
            device: device.clone(),
            driver,
            _ctx: self.clone(),
        })
    }

    /// Creates a host-visible event, not signalled (`zeEventPoolCreate` with
    /// `ZE_EVENT_POOL_FLAG_HOST_VISIBLE` and `zeEventCreate`, the pool implicit).
    pub fn create_event(&self) -> Result<Event> {
        Ok(Event {
            flag: Arc::default(),
        })
    }
}

/// `ze_driver_memory_free_policy_ext_flags_t`: how `zeMemFreeExt` frees memory that queued
/// or running work may still reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FreePolicy {
    /// 0 (default): free now. The pointer is invalid and the device capacity back at once
    /// (unless IPC exports or views of the memory hold it: see [`crate::Context::free_memory`]); if
    /// work still references the memory, its pages stay mapped to it (so no later allocation
    /// can be given that address and the engine never touches anyone else's memory) until that
    /// work finishes, then go.
    Immediate,
    /// `ZE_DRIVER_MEMORY_FREE_POLICY_EXT_FLAG_BLOCKING_FREE` (1 << 0): waits until every queued
    /// or running command that references the memory has finished, then frees it.
    Blocking,
    /// `ZE_DRIVER_MEMORY_FREE_POLICY_EXT_FLAG_DEFER_FREE` (1 << 1): returns at once; the
    /// pointer is invalid at once, and the memory and device capacity are released when the
    /// work that references it finishes.
    Defer,
}

impl FreePolicy {
    /// The policies this driver supports, as `ze_driver_memory_free_ext_properties_t`'s
    /// `freePolicies` reports them: BLOCKING_FREE | DEFER_FREE (0x3).
    pub const SUPPORTED: u32 = 0x3;

    /// Decodes the descriptor's `freePolicy`: 0, 1, 2; 3 (both flags) is taken as BLOCKING,
    /// which also meets DEFER's promise that nothing is freed under running work. Values over
    /// 0x3 are `InvalidEnumeration` (the validation layer's `0x3 < freePolicy`).
    pub fn from_raw(flags: u32) -> Result<FreePolicy> {
        match flags {
            0 => Ok(FreePolicy::Immediate),
            1 | 3 => Ok(FreePolicy::Blocking),
            2 => Ok(FreePolicy::Defer),
            _ => Err(Error::InvalidEnumeration(format!(
                "free policy {flags:#x} exceeds 0x3 (BLOCKING_FREE | DEFER_FREE)"
            ))),
        }
    }

    /// `ZE_STRUCTURE_TYPE_MEMORY_FREE_EXT_DESC` (0x1000a): the stype of
    /// `ze_memory_free_ext_desc_t`.
    pub const DESC_STYPE: u32 = 0x1000a;

    /// `ZE_STRUCTURE_TYPE_DRIVER_MEMORY_FREE_EXT_PROPERTIES` (0x10009): the stype of the
    /// driver's free-policy properties, which the conformance suite puts in the free
    /// descriptor; accepted there too.
    pub const PROPERTIES_STYPE: u32 = 0x10009;

    /// Decodes a raw `ze_memory_free_ext_desc_t` (`zeMemFreeExt`'s `pMemFreeDesc`): its `stype`
    /// and `freePolicy` fields, for the C ABI.
    ///
    /// - `free_policy` over 0x3 -> `InvalidEnumeration`, checked first, as the loader's
    ///   parameter-validation layer does (`0x3 < pMemFreeDesc->freePolicy`);
    /// - `stype` must be [`FreePolicy::DESC_STYPE`] (0x1000a) or, as the conformance suite
    ///   sends it, [`FreePolicy::PROPERTIES_STYPE`] (0x10009); any other is `InvalidArgument`,
    ///   the validation layer's answer for a descriptor of the wrong base type
    ///   (`validateStructureTypes`; the reference driver itself does not read `stype`);
    /// - then the policy as [`FreePolicy::from_raw`].
    pub fn from_desc(stype: u32, free_policy: u32) -> Result<FreePolicy> {
        if free_policy > Self::SUPPORTED {
            return FreePolicy::from_raw(free_policy);
        }
        if stype != Self::DESC_STYPE && stype != Self::PROPERTIES_STYPE {
            return Err(Error::InvalidArgument(format!(
                "free descriptor stype {stype:#x} is not ZE_STRUCTURE_TYPE_MEMORY_FREE_EXT_DESC \
                 ({:#x})",
                Self::DESC_STYPE
            )));
        }
        FreePolicy::from_raw(free_policy)
    }

    /// The C flag value.
    pub fn raw(self) -> u32 {
        match self {
            FreePolicy::Immediate => 0,
            FreePolicy::Blocking => 1,
            FreePolicy::Defer => 2,
        }
    }
}

impl Driver {
    /// The free policies `zeMemFreeExt` supports (`ze_driver_memory_free_ext_properties_t`,
    /// `freePolicies`): [`FreePolicy::SUPPORTED`].
    pub fn memory_free_policies(&self) -> u32 {
        FreePolicy::SUPPORTED
    }

    /// Frees waiting for queued work to finish ([`FreePolicy::Defer`], or free-now with work in
    /// flight); for leak checks.
    pub fn pending_frees(&self) -> usize {
        self.shared.inflight.pending_frees()
    }

    /// Threads blocked right now in a call (unmap, reservation free, access change, IPC close,
    /// context teardown) that waits for queued or running work to let go of the memory it
    /// changes; for tests and diagnostics.
    pub fn in_flight_waiters(&self) -> u64 {
        self.shared.inflight.waiters()
    }
}

/// Takes the driver's `vm` write lock once no queued or running work references any of the
/// reservations `bases` lists (computed under the lock). While one is referenced, drops the
/// lock, waits for it (no lock held, so engines and unrelated calls go on) and tries again.
/// Under the write lock no submission can take a new reference (they check under the read
/// lock), so the returned guard may change those reservations safely.
pub(crate) fn vm_write_unreferenced(
    d: &DriverShared,
    bases: impl Fn(&VmState) -> Vec<usize>,
) -> parking_lot::RwLockWriteGuard<'_, VmState> {
    loop {
        let vm = d.vm.write();
        // Fast path: no in-flight work references any reservation.
        if d.inflight.reservations.load(Ordering::Acquire) == 0 {
            return vm;
        }
        let busy = bases(&vm)
            .into_iter()
            .map(InFlightRef::Reservation)
            .find(|&r| d.inflight.is_referenced_ref(r));
        match busy {
            None => return vm,
            Some(r) => {
                drop(vm);
                d.inflight.wait_unreferenced_ref(r);
            }
        }
    }
}

/// The base of the reservation containing `ptr`, if any (for [`vm_write_unreferenced`]).
pub(crate) fn reservation_at(vm: &VmState, ptr: usize) -> Vec<usize> {
    vm.pointer_info(ptr)
        .map(|i| i.reservation.0)
        .into_iter()
        .collect()
}

impl Context {
    /// Frees an allocation or releases an import with a free policy (`zeMemFreeExt`). `ptr`
    /// must be the base of a live allocation or import of this context, as for
    /// [`Context::free_memory`]; it is invalid as soon as the call returns, whatever the
    /// policy. See [`FreePolicy`] for when the memory and the device capacity come back.
    ///
    /// Errors: `InvalidNullPointer` for null; `InvalidArgument` for anything that is not such a
    /// base (nothing is freed then).
    pub fn free_memory_ext(&self, ptr: usize, policy: FreePolicy) -> Result<()> {
        let d = self.driver().shared;
        // Taken out under the write lock: from here no new submission can reference it (they
        // check and take references under the read lock).
        let mut p = d.usm.write().take_for_free(self.id(), ptr)?;
        match policy {
            FreePolicy::Blocking => {
                d.inflight.wait_unreferenced(p.id());
                p.finish(d.backend.as_ref());
            }
            FreePolicy::Immediate | FreePolicy::Defer => {
                if policy == FreePolicy::Immediate {
                    p.give_back_capacity();
                }
                if let Some(p) = d.inflight.defer_or_return(p) {
                    p.finish(d.backend.as_ref());
                }
            }
        }
        Ok(())
    }
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
}
