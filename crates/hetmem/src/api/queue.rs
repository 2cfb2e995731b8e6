//! The public module of this family: its types (from the semantics module of the same name,
//! where the rules live) and the calls, as methods of [`crate::Context`] and [`crate::Driver`].

use crate::api::runtime::{Context, Device, Driver};
use crate::error::Result;
use crate::semantics::queue::event::{EventCore, FenceCore, PoolCore};
use crate::semantics::queue::list::{ListCore, QueueCore};
pub use crate::semantics::queue::*;

/// An event (`ze_event_handle_t`, host-visible, in an implicit pool): signalled by the host or
/// by a command, waited on by the host or by commands of any queue. Clones are the same event.
#[derive(Debug, Clone)]
pub struct Event {
    core: EventCore,
}

/// An event pool (`ze_event_pool_handle_t`) of `count` host-visible events, each in its own
/// index ([`EventPool::create_event`]); an index is free again once every clone of its event
/// is dropped. Events keep working after the pool is dropped.
#[derive(Debug)]
pub struct EventPool {
    ctx: Context,
    core: PoolCore,
}

impl EventPool {
    /// The number of events the pool holds.
    pub fn count(&self) -> u32 {
        self.core.count()
    }

    /// The number of indices taken by live events.
    pub fn used(&self) -> usize {
        self.core.used()
    }

    /// Creates the event in slot `index`, not signalled (`zeEventCreate`).
    ///
    /// Errors: `InvalidArgument` for an index not below [`EventPool::count`] or one a live
    /// event of the pool holds (nothing is taken then); `OutOfHostMemory` from the backend.
    pub fn create_event(&self, index: u32) -> Result<Event> {
        let core = self.core.create_event(self.ctx.d(), self.ctx.id(), index)?;
        Ok(Event { core })
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
        self.core.check_destroy()
    }

    /// Signals the event from the host (`zeEventHostSignal`); signalling a signalled event
    /// keeps it signalled. Wakes every host and engine wait on it.
    ///
    /// Errors: none; always `Ok` (the `Result` is kept for the C ABI's `ze_result_t`).
    pub fn host_signal(&self) -> Result<()> {
        self.core.host_signal()
    }

    /// Waits up to `timeout_ns` nanoseconds for the event (`zeEventHostSynchronize`); 0 only
    /// queries, `u64::MAX` waits forever. Returns `NotReady` if it is still not signalled.
    ///
    /// Errors: none; always `Ok` (the `Result` is kept for the C ABI's `ze_result_t`).
    pub fn host_synchronize(&self, timeout_ns: u64) -> Result<SyncStatus> {
        self.core.host_synchronize(timeout_ns)
    }

    /// Whether the event is signalled (`zeEventQueryStatus`): `Ready` or `NotReady`.
    ///
    /// Errors: none; always `Ok` (the `Result` is kept for the C ABI's `ze_result_t`).
    pub fn query_status(&self) -> Result<SyncStatus> {
        self.core.query_status()
    }

    /// Resets the event to not signalled (`zeEventHostReset`); resetting an unsignalled event
    /// does nothing. Commands already queued that will signal it still do.
    ///
    /// Errors: none; always `Ok` (the `Result` is kept for the C ABI's `ze_result_t`).
    pub fn host_reset(&self) -> Result<()> {
        self.core.host_reset()
    }
}

/// A fence (`ze_fence_handle_t`) of one command queue: signalled when the batch of command
/// lists it was passed with has finished.
#[derive(Debug, Clone)]
pub struct Fence {
    core: FenceCore,
}

impl Fence {
    /// Waits up to `timeout_ns` nanoseconds for the fence (`zeFenceHostSynchronize`); 0 only
    /// queries, `u64::MAX` waits forever. Returns `NotReady` if it is still not signalled.
    ///
    /// Errors: none; always `Ok` (the `Result` is kept for the C ABI's `ze_result_t`).
    pub fn host_synchronize(&self, timeout_ns: u64) -> Result<SyncStatus> {
        self.core.host_synchronize(timeout_ns)
    }

    /// Whether the fence is signalled (`zeFenceQueryStatus`): `Ready` or `NotReady`.
    ///
    /// Errors: none; always `Ok` (the `Result` is kept for the C ABI's `ze_result_t`).
    pub fn query_status(&self) -> Result<SyncStatus> {
        self.core.query_status()
    }

    /// Resets the fence to not signalled (`zeFenceReset`); a batch still running with it
    /// signals it when it finishes.
    ///
    /// Errors: none; always `Ok` (the `Result` is kept for the C ABI's `ze_result_t`).
    pub fn reset(&self) -> Result<()> {
        self.core.reset()
    }
}

/// A command queue (`ze_command_queue_handle_t`, asynchronous mode) on one device: executes
/// closed command lists in submission order on its own engine. CUDA: a stream.
#[derive(Debug)]
pub struct CommandQueue {
    // The engine (inside `core`) is dropped first, so submitted work never outlives the context.
    core: QueueCore,
    device: Device,
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
        let core = self.core.create_fence(signaled)?;
        Ok(Fence { core })
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
        let lists = lists.iter().map(|l| &l.core);
        self.core.execute(lists, fence.map(|f| &f.core))
    }

    /// Waits up to `timeout_ns` nanoseconds for every batch submitted before the call
    /// (`zeCommandQueueSynchronize`); 0 only queries, `u64::MAX` waits forever. Returns
    /// `NotReady` if work is still running when the timeout expires.
    pub fn synchronize(&self, timeout_ns: u64) -> Result<SyncStatus> {
        self.core.synchronize(timeout_ns)
    }
}

/// A command list (`ze_command_list_handle_t`) on one device: regular (recorded, closed, then
/// executed on a [`CommandQueue`]) or immediate (each command is submitted to the list's own
/// engine as it is appended). Appends validate their operands at once (see the module docs).
#[derive(Debug)]
pub struct CommandList {
    // The engine of an immediate list (inside `core`) is dropped first, as a queue's.
    core: ListCore,
    device: Device,
    _ctx: Context,
}

impl CommandList {
    /// Whether the list is immediate.
    pub fn is_immediate(&self) -> bool {
        self.core.is_immediate()
    }

    /// The device the list is for.
    pub fn device(&self) -> &Device {
        &self.device
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
        self.core
            .append_copy(dst, src, size, signal.map(|e| &e.core), cores(wait))
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
        self.core
            .append_fill(ptr, pattern, size, signal.map(|e| &e.core), cores(wait))
    }

    /// Appends a barrier (`zeCommandListAppendBarrier`): later commands start only after the
    /// earlier ones and the events in `wait`; `signal` is signalled when it is reached. Queues
    /// are in order, so this is exactly its waits and its signal.
    ///
    /// Errors: `InvalidArgument` if the list is closed.
    pub fn append_barrier(&self, signal: Option<&Event>, wait: &[&Event]) -> Result<()> {
        self.core
            .append_barrier(signal.map(|e| &e.core), cores(wait))
    }

    /// Appends a signal of `event` once every earlier command has finished
    /// (`zeCommandListAppendSignalEvent`). CUDA: `cuEventRecord`.
    ///
    /// Errors: `InvalidArgument` if the list is closed.
    pub fn append_signal_event(&self, event: &Event) -> Result<()> {
        self.core.append_signal(&event.core)
    }

    /// Appends a wait: later commands start only once every event in `events` is signalled
    /// (`zeCommandListAppendWaitOnEvents`). CUDA: `cuStreamWaitEvent`.
    ///
    /// Errors: `InvalidSize` for no event (`0 == numEvents`); `InvalidArgument` if the list is
    /// closed.
    pub fn append_wait_on_events(&self, events: &[&Event]) -> Result<()> {
        self.core.append_wait(cores(events))
    }

    /// Closes the list for execution (`zeCommandListClose`); no more appends until
    /// [`CommandList::reset`]. An immediate list has nothing to close: no-op.
    pub fn close(&self) -> Result<()> {
        self.core.close()
    }

    /// Empties the list and reopens it for appends (`zeCommandListReset`). Batches already
    /// submitted keep their own copy of the commands. An immediate list: no-op.
    pub fn reset(&self) -> Result<()> {
        self.core.reset()
    }

    /// Waits up to `timeout_ns` nanoseconds for everything appended to an immediate list
    /// (`zeCommandListHostSynchronize`); 0 only queries, `u64::MAX` waits forever. A regular
    /// list has nothing in flight of its own: `Ready`.
    pub fn host_synchronize(&self, timeout_ns: u64) -> Result<SyncStatus> {
        self.core.host_synchronize(timeout_ns)
    }
}

impl Context {
    /// Creates an asynchronous, in-order command queue on `device` with its own engine
    /// (`zeCommandQueueCreate`; host: a worker thread, CUDA: a stream).
    ///
    /// Errors: `InvalidNullHandle` for a device of another driver; `OutOfHostMemory` if the
    /// engine cannot be started.
    pub fn create_command_queue(&self, device: &Device) -> Result<CommandQueue> {
        self.queue(device, None)
    }

    fn queue(&self, device: &Device, desc: Option<&CommandQueueDesc>) -> Result<CommandQueue> {
        let core = QueueCore::new(self.d_arc(), device.dref(), self.id(), desc)?;
        Ok(CommandQueue {
            core,
            device: device.clone(),
            _ctx: self.clone(),
        })
    }

    fn list(&self, device: &Device, core: Result<ListCore>) -> Result<CommandList> {
        Ok(CommandList {
            core: core?,
            device: device.clone(),
            _ctx: self.clone(),
        })
    }

    /// Creates an empty, open regular command list for `device` (`zeCommandListCreate`).
    ///
    /// Errors: `InvalidNullHandle` for a device of another driver.
    pub fn create_command_list(&self, device: &Device) -> Result<CommandList> {
        let core = ListCore::regular(self.d_arc(), device.dref(), self.id(), None);
        self.list(device, core)
    }

    /// Creates an immediate command list for `device` (`zeCommandListCreateImmediate`,
    /// asynchronous mode): each append is validated and submitted to the list's own engine at
    /// once. Its operands follow Level Zero's rule ([`OperandRule::LevelZero`]: plain system
    /// memory included).
    ///
    /// Errors: as [`Context::create_command_queue`].
    pub fn create_immediate_command_list(&self, device: &Device) -> Result<CommandList> {
        self.create_immediate_command_list_for(device, OperandRule::LevelZero)
    }

    /// Creates an immediate command list for `device` whose operands follow `rule`: an ACL
    /// stream's list ([`OperandRule::Acl`]: `aclrtMemcpyAsync` / `aclrtMemsetAsync` take only
    /// memory the runtime knows).
    ///
    /// Errors: as [`Context::create_command_queue`].
    pub fn create_immediate_command_list_for(
        &self,
        device: &Device,
        rule: OperandRule,
    ) -> Result<CommandList> {
        let core = ListCore::immediate(self.d_arc(), device.dref(), self.id(), None, rule);
        self.list(device, core)
    }

    /// Creates a host-visible event, not signalled (`zeEventPoolCreate` with
    /// `ZE_EVENT_POOL_FLAG_HOST_VISIBLE` and `zeEventCreate`, the pool implicit).
    pub fn create_event(&self) -> Result<Event> {
        let core = EventCore::new(self.d(), self.id())?;
        Ok(Event { core })
    }

    /// Creates an event pool of `count` events (`zeEventPoolCreate`, host visible); its events
    /// are made by index with [`EventPool::create_event`].
    ///
    /// Errors: `InvalidSize` for a count of 0.
    pub fn create_event_pool(&self, count: u32) -> Result<EventPool> {
        let core = PoolCore::new(count)?;
        Ok(EventPool {
            ctx: self.clone(),
            core,
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
        self.queue(device, Some(desc))
    }

    /// Checks a [`CommandListDesc`] and creates the regular list (`zeCommandListCreate`).
    ///
    /// Errors: those of [`CommandListDesc::check`], then of [`Context::create_command_list`].
    pub fn create_command_list_with(
        &self,
        device: &Device,
        desc: &CommandListDesc,
    ) -> Result<CommandList> {
        let core = ListCore::regular(self.d_arc(), device.dref(), self.id(), Some(desc));
        self.list(device, core)
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
        let core = ListCore::immediate(
            self.d_arc(),
            device.dref(),
            self.id(),
            Some(desc),
            OperandRule::LevelZero,
        );
        self.list(device, core)
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
        crate::semantics::driver::pending_frees(&self.shared)
    }

    /// Threads blocked right now in a call (unmap, reservation free, access change, IPC close,
    /// context teardown) that waits for queued or running work to let go of the memory it
    /// changes; for tests and diagnostics.
    pub fn in_flight_waiters(&self) -> u64 {
        crate::semantics::driver::in_flight_waiters(&self.shared)
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
        crate::semantics::usm::calls::free(self.d(), self.id(), ptr, policy)
    }
}

/// The semantics layer's events of `events`.
fn cores<'a>(events: &'a [&'a Event]) -> impl ExactSizeIterator<Item = &'a EventCore> + Clone + 'a {
    events.iter().map(|e| &e.core)
}
