//! The public module of this family: its types (from the semantics module of the same name,
//! where the rules live) and the calls, as methods of [`crate::Context`] and [`crate::Driver`].

use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::api::runtime::{Context, Device, Driver};
use crate::backend::EngineSync;
use crate::error::{Error, Result};
use crate::semantics::driver::DriverShared;
pub use crate::semantics::queue::*;

/// An event (`ze_event_handle_t`, host-visible, in an implicit pool): signalled by the host or
/// by a command, waited on by the host or by commands of any queue. Clones are the same event.
#[derive(Debug, Clone)]
pub struct Event {
    flag: Arc<dyn EngineSync>,
    /// One strong count per API clone of this event.
    clones: Arc<()>,
    /// The wait token: one strong count per API clone, and one per command that waits on the
    /// event, from its submission until its wait is over.
    waits: Arc<()>,
    /// The id of the context the event was made in.
    context: u64,
    /// The pool slot the event holds, given back when the last clone is dropped.
    _slot: Option<Arc<PoolSlot>>,
}

/// A taken slot of an [`EventPool`]; freed on drop.
#[derive(Debug)]
struct PoolSlot {
    used: std::sync::Weak<Mutex<BTreeSet<u32>>>,
    index: u32,
}

impl Drop for PoolSlot {
    fn drop(&mut self) {
        if let Some(u) = self.used.upgrade() {
            u.lock().remove(&self.index);
        }
    }
}

/// An event pool (`ze_event_pool_handle_t`) of `count` host-visible events, each in its own
/// index ([`EventPool::create_event`]); an index is free again once every clone of its event
/// is dropped. Events keep working after the pool is dropped.
#[derive(Debug)]
pub struct EventPool {
    ctx: Context,
    count: u32,
    /// Indices with a live event (a set: a pool of 2^32 events costs nothing until its events
    /// are made).
    used: Arc<Mutex<BTreeSet<u32>>>,
}

impl EventPool {
    /// The number of events the pool holds.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The number of indices taken by live events.
    pub fn used(&self) -> usize {
        self.used.lock().len()
    }

    /// Creates the event in slot `index`, not signalled (`zeEventCreate`).
    ///
    /// Errors: `InvalidArgument` for an index not below [`EventPool::count`] or one a live
    /// event of the pool holds (nothing is taken then); `OutOfHostMemory` from the backend.
    pub fn create_event(&self, index: u32) -> Result<Event> {
        take_pool_index(&mut self.used.lock(), self.count, index)?;
        let slot = Arc::new(PoolSlot {
            used: Arc::downgrade(&self.used),
            index,
        });
        // On failure the slot is dropped and the index freed.
        let mut e = self.ctx.create_event()?;
        e._slot = Some(slot);
        Ok(e)
    }
}

impl Event {
    /// The check of `zeEventDestroy` ("the application must ensure the device is not currently
    /// referencing the event"): refused while a command that waits on the event is queued and
    /// its wait is not over, since destroying the event then
    /// would leave that work waiting for a signal nobody can send (and every unmap, free or
    /// teardown that waits for that work with it). A pending signal does not hold the event.
    /// Changes nothing; the event goes when its last clone is dropped.
    ///
    /// Errors: `HandleObjectInUse` naming how many commands still wait on it.
    pub fn check_destroy(&self) -> Result<()> {
        let work = Arc::strong_count(&self.waits).saturating_sub(Arc::strong_count(&self.clones));
        if work > 0 {
            return Err(Error::HandleObjectInUse(format!(
                "{work} queued command(s) wait on the event; destroy it once their waits are over"
            )));
        }
        Ok(())
    }

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
        Ok(SyncStatus::of(self.flag.is_signalled()))
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
    flag: Arc<dyn EngineSync>,
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
        Ok(SyncStatus::of(self.flag.is_signalled()))
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

    /// Creates a fence of this queue (`zeFenceCreate`), signalled at once if `signaled`
    /// (`ZE_FENCE_FLAG_SIGNALED`: a host synchronize returns at once until
    /// [`Fence::reset`]).
    ///
    /// Errors: `OutOfHostMemory` from the backend.
    pub fn create_fence(&self, signaled: bool) -> Result<Fence> {
        let flag = self.sub.driver.backend.create_sync()?;
        if signaled {
            flag.signal();
        }
        Ok(Fence {
            flag,
            queue: self.id,
        })
    }

    /// Submits `lists`, in order, as one batch (`zeCommandQueueExecuteCommandLists`); returns
    /// at once. `fence`, if given, is signalled when the whole batch has finished.
    ///
    /// Errors: `InvalidSize` for no list; `InvalidArgument` for a list that is open, immediate,
    /// of another device or of another context, a fence of another queue, or an operand that is no longer live
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
            check_same_context(&format!("command list {i}"), l._ctx.id(), self._ctx.id())?;
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
        self.sub.synchronize(timeout_ns)
    }
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

    /// Checks that `events` (the signal first, then the waits) were made in the list's context.
    fn check_events(&self, signal: Option<&Event>, wait: &[&Event]) -> Result<()> {
        let ours = self._ctx.id();
        if let Some(e) = signal {
            check_same_context("the signal event", e.context, ours)?;
        }
        for (i, e) in wait.iter().enumerate() {
            check_same_context(&format!("wait event {i}"), e.context, ours)?;
        }
        Ok(())
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
        self.check_events(signal, wait)?;
        self.append(event_cmds(Some(Cmd::Copy { dst, src, size }), signal, wait))
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
        self.check_events(signal, wait)?;
        let fill = Cmd::Fill {
            ptr,
            pattern: pattern.to_vec(),
            size,
        };
        self.append(event_cmds(Some(fill), signal, wait))
    }

    /// Appends a barrier (`zeCommandListAppendBarrier`): later commands start only after the
    /// earlier ones and the events in `wait`; `signal` is signalled when it is reached. Queues
    /// are in order, so this is exactly its waits and its signal.
    ///
    /// Errors: `InvalidArgument` if the list is closed.
    pub fn append_barrier(&self, signal: Option<&Event>, wait: &[&Event]) -> Result<()> {
        self.check_events(signal, wait)?;
        self.append(event_cmds(None, signal, wait))
    }

    /// Appends a signal of `event` once every earlier command has finished
    /// (`zeCommandListAppendSignalEvent`). CUDA: `cuEventRecord`.
    ///
    /// Errors: `InvalidArgument` if the list is closed.
    pub fn append_signal_event(&self, event: &Event) -> Result<()> {
        self.check_events(Some(event), &[])?;
        self.append(vec![Cmd::Signal(event.flag.clone())])
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
        self.check_events(None, events)?;
        self.append(event_cmds(None, None, events))
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
        match &self.kind {
            ListKind::Immediate(sub) => sub.synchronize(timeout_ns),
            ListKind::Regular(_) => Ok(SyncStatus::Ready),
        }
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
            flag: self.driver().shared.backend.create_sync()?,
            clones: Arc::new(()),
            waits: Arc::new(()),
            context: self.id(),
            _slot: None,
        })
    }

    /// Creates an event pool of `count` events (`zeEventPoolCreate`, host visible); its events
    /// are made by index with [`EventPool::create_event`].
    ///
    /// Errors: `InvalidSize` for a count of 0.
    pub fn create_event_pool(&self, count: u32) -> Result<EventPool> {
        check_pool_count(count)?;
        Ok(EventPool {
            ctx: self.clone(),
            count,
            used: Arc::default(),
        })
    }

    /// Checks a [`CommandQueueDesc`] and creates the queue it describes
    /// (`zeCommandQueueCreate`); the mode is the caller's to honour (a synchronous queue's
    /// caller waits after each execute).
    ///
    /// Errors: those of [`CommandQueueDesc::check`], then of [`Context::create_command_queue`].
    pub fn create_command_queue_with(
        &self,
        device: &Device,
        desc: &CommandQueueDesc,
    ) -> Result<CommandQueue> {
        desc.check()?;
        self.create_command_queue(device)
    }

    /// Checks a [`CommandListDesc`] and creates the regular list (`zeCommandListCreate`).
    ///
    /// Errors: those of [`CommandListDesc::check`], then of [`Context::create_command_list`].
    pub fn create_command_list_with(
        &self,
        device: &Device,
        desc: &CommandListDesc,
    ) -> Result<CommandList> {
        desc.check()?;
        self.create_command_list(device)
    }

    /// Checks a [`CommandQueueDesc`] and creates the immediate list it describes
    /// (`zeCommandListCreateImmediate`).
    ///
    /// Errors: those of [`CommandQueueDesc::check`], then of
    /// [`Context::create_immediate_command_list`].
    pub fn create_immediate_command_list_with(
        &self,
        device: &Device,
        desc: &CommandQueueDesc,
    ) -> Result<CommandList> {
        desc.check()?;
        self.create_immediate_command_list(device)
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

/// The commands of one append: waits on `wait`, `core`, then a signal of `signal`.
fn event_cmds(core: Option<Cmd>, signal: Option<&Event>, wait: &[&Event]) -> Vec<Cmd> {
    let wait: Vec<(&Arc<dyn EngineSync>, &Arc<()>)> =
        wait.iter().map(|e| (&e.flag, &e.waits)).collect();
    with_events(core, signal.map(|e| &e.flag), &wait)
}
