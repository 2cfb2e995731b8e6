//! Command lists and command queues (`zeCommandListCreate`, `zeCommandListCreateImmediate`,
//! `zeCommandListAppendMemoryCopy`, `zeCommandListAppendMemoryFill`,
//! `zeCommandListAppendBarrier`, `zeCommandListAppendSignalEvent`,
//! `zeCommandListAppendWaitOnEvents`, `zeCommandListClose`, `zeCommandListReset`,
//! `zeCommandListHostSynchronize`, `zeCommandQueueCreate`, `zeCommandQueueExecuteCommandLists`,
//! `zeCommandQueueSynchronize`): the append, close, execute and one-context rules of the module
//! docs of [`crate::semantics::queue`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::semantics::driver::{DeviceRef, DriverShared};
use crate::semantics::queue::args::{
    check_pattern, check_same_context, CommandListDesc, CommandQueueDesc,
};
use crate::semantics::queue::command::{check_all, Cmd, OperandRule};
use crate::semantics::queue::engine::Submitter;
use crate::semantics::queue::event::{EventCore, FenceCore};
use crate::spec::SyncStatus;

/// The commands a regular list has recorded, and whether it is closed.
#[derive(Debug, Default)]
pub(crate) struct Recorded {
    pub(crate) cmds: Vec<Cmd>,
    pub(crate) closed: bool,
}

/// A regular list records; an immediate list submits to its own engine.
#[derive(Debug)]
pub(crate) enum ListKind {
    Regular(Mutex<Recorded>),
    Immediate(Submitter),
}

/// The commands of one append: waits on `wait`, `core`, then a signal of `signal`.
fn with_events<'a>(
    core: Option<Cmd>,
    signal: Option<&EventCore>,
    wait: impl Iterator<Item = &'a EventCore>,
) -> Vec<Cmd> {
    let mut v = Vec::with_capacity(3);
    let wait: Vec<_> = wait
        .map(|e| (e.flag.clone(), Arc::downgrade(&e.waits)))
        .collect();
    if !wait.is_empty() {
        v.push(Cmd::Wait(wait));
    }
    v.extend(core);
    if let Some(e) = signal {
        v.push(Cmd::Signal(e.flag.clone()));
    }
    v
}

/// A command list on one device of one context.
#[derive(Debug)]
pub(crate) struct ListCore {
    kind: ListKind,
    device: u32,
    context: u64,
    driver: Arc<DriverShared>,
    /// Which spec's operand rule its appends follow (regular lists: Level Zero's).
    rule: OperandRule,
}

impl ListCore {
    /// `zeCommandListCreate` on `device` (checked to be of this driver), after `desc`'s check.
    ///
    /// Errors: those of [`CommandListDesc::check`]; `InvalidNullHandle` for a device of another
    /// driver.
    pub(crate) fn regular(
        d: &Arc<DriverShared>,
        device: DeviceRef<'_>,
        context: u64,
        desc: Option<&CommandListDesc>,
    ) -> Result<ListCore> {
        desc.map(CommandListDesc::check).transpose()?;
        let device = d.device_ordinal(device)?;
        Ok(ListCore {
            kind: ListKind::Regular(Mutex::default()),
            device,
            context,
            driver: d.clone(),
            rule: OperandRule::LevelZero,
        })
    }

    /// `zeCommandListCreateImmediate` on `device` (checked to be of this driver), after
    /// `desc`'s check: the list's own engine, its appends following `rule` (an ACL stream's
    /// list: [`OperandRule::Acl`]).
    ///
    /// Errors: those of [`CommandQueueDesc::check`]; `InvalidNullHandle` for a device of
    /// another driver; `OutOfHostMemory` if the engine cannot be started.
    pub(crate) fn immediate(
        d: &Arc<DriverShared>,
        device: DeviceRef<'_>,
        context: u64,
        desc: Option<&CommandQueueDesc>,
        rule: OperandRule,
    ) -> Result<ListCore> {
        desc.map(CommandQueueDesc::check).transpose()?;
        let device = d.device_ordinal(device)?;
        Ok(ListCore {
            kind: ListKind::Immediate(Submitter::new(d.clone(), device)?),
            device,
            context,
            driver: d.clone(),
            rule,
        })
    }

    /// Whether the list is immediate.
    pub(crate) fn is_immediate(&self) -> bool {
        matches!(self.kind, ListKind::Immediate(_))
    }

    /// Checks that `events` (the signal first, then the waits) were made in the list's context.
    fn check_events<'a>(
        &self,
        signal: Option<&EventCore>,
        wait: impl Iterator<Item = &'a EventCore>,
    ) -> Result<()> {
        if let Some(e) = signal {
            check_same_context("the signal event", e.context, self.context)?;
        }
        for (i, e) in wait.enumerate() {
            check_same_context(&format!("wait event {i}"), e.context, self.context)?;
        }
        Ok(())
    }

    /// Checks the events, then submits (immediate) or checks and records (regular) the
    /// commands of one append.
    fn append<'a>(
        &self,
        core: Option<Cmd>,
        signal: Option<&EventCore>,
        wait: impl Iterator<Item = &'a EventCore> + Clone,
    ) -> Result<()> {
        self.check_events(signal, wait.clone())?;
        let cmds = with_events(core, signal, wait);
        match &self.kind {
            ListKind::Immediate(sub) => sub.submit(&cmds, None, self.rule),
            ListKind::Regular(r) => {
                let mut r = r.lock();
                if r.closed {
                    return Err(Error::InvalidArgument(
                        "the command list is closed; reset it to append".into(),
                    ));
                }
                check_all(&self.driver, &cmds, false, self.rule)?;
                r.cmds.extend(cmds);
                Ok(())
            }
        }
    }

    /// `zeCommandListAppendMemoryCopy`.
    pub(crate) fn append_copy<'a>(
        &self,
        dst: usize,
        src: usize,
        size: usize,
        signal: Option<&EventCore>,
        wait: impl Iterator<Item = &'a EventCore> + Clone,
    ) -> Result<()> {
        self.append(Some(Cmd::Copy { dst, src, size }), signal, wait)
    }

    /// `zeCommandListAppendMemoryFill`: the pattern rule ([`check_pattern`]) first.
    pub(crate) fn append_fill<'a>(
        &self,
        ptr: usize,
        pattern: &[u8],
        size: usize,
        signal: Option<&EventCore>,
        wait: impl Iterator<Item = &'a EventCore> + Clone,
    ) -> Result<()> {
        check_pattern(pattern)?;
        let fill = Cmd::Fill {
            ptr,
            pattern: pattern.to_vec(),
            size,
        };
        self.append(Some(fill), signal, wait)
    }

    /// `zeCommandListAppendBarrier`: its waits and its signal (queues are in order).
    pub(crate) fn append_barrier<'a>(
        &self,
        signal: Option<&EventCore>,
        wait: impl Iterator<Item = &'a EventCore> + Clone,
    ) -> Result<()> {
        self.append(None, signal, wait)
    }

    /// `zeCommandListAppendSignalEvent`.
    pub(crate) fn append_signal(&self, event: &EventCore) -> Result<()> {
        self.check_events(Some(event), std::iter::empty())?;
        self.append(
            Some(Cmd::Signal(event.flag.clone())),
            None,
            std::iter::empty(),
        )
    }

    /// `zeCommandListAppendWaitOnEvents`.
    ///
    /// Errors: `InvalidSize` for no event; those of an append.
    pub(crate) fn append_wait<'a>(
        &self,
        events: impl ExactSizeIterator<Item = &'a EventCore> + Clone,
    ) -> Result<()> {
        if events.len() == 0 {
            return Err(Error::InvalidSize("no event to wait on".into()));
        }
        self.append(None, None, events)
    }

    /// `zeCommandListClose` (an immediate list: no-op).
    pub(crate) fn close(&self) -> Result<()> {
        if let ListKind::Regular(r) = &self.kind {
            r.lock().closed = true;
        }
        Ok(())
    }

    /// `zeCommandListReset` (an immediate list: no-op).
    pub(crate) fn reset(&self) -> Result<()> {
        if let ListKind::Regular(r) = &self.kind {
            *r.lock() = Recorded::default();
        }
        Ok(())
    }

    /// `zeCommandListHostSynchronize` (a regular list: `Ready`).
    pub(crate) fn host_synchronize(&self, timeout_ns: u64) -> Result<SyncStatus> {
        match &self.kind {
            ListKind::Immediate(sub) => sub.synchronize(timeout_ns),
            ListKind::Regular(_) => Ok(SyncStatus::Ready),
        }
    }
}

static NEXT_QUEUE: AtomicU64 = AtomicU64::new(1);

/// A command queue on one device of one context: its engine and its id (for fences).
#[derive(Debug)]
pub(crate) struct QueueCore {
    sub: Submitter,
    device: u32,
    id: u64,
    context: u64,
}

impl QueueCore {
    /// `zeCommandQueueCreate` on `device` (checked to be of this driver), after `desc`'s check.
    ///
    /// Errors: those of [`CommandQueueDesc::check`]; `InvalidNullHandle` for a device of
    /// another driver; `OutOfHostMemory` if the engine cannot be started.
    pub(crate) fn new(
        d: &Arc<DriverShared>,
        device: DeviceRef<'_>,
        context: u64,
        desc: Option<&CommandQueueDesc>,
    ) -> Result<QueueCore> {
        desc.map(CommandQueueDesc::check).transpose()?;
        let device = d.device_ordinal(device)?;
        Ok(QueueCore {
            sub: Submitter::new(d.clone(), device)?,
            device,
            id: NEXT_QUEUE.fetch_add(1, Ordering::Relaxed),
            context,
        })
    }

    /// `zeFenceCreate` on this queue.
    pub(crate) fn create_fence(&self, signaled: bool) -> Result<FenceCore> {
        FenceCore::new(&self.sub.driver, self.id, signaled)
    }

    /// `zeCommandQueueExecuteCommandLists`: every list closed, regular, of this queue's device
    /// and context, the fence of this queue; then the operands checked again and the whole
    /// batch submitted (nothing is submitted on any failure).
    ///
    /// Errors: `InvalidSize` for no list; `InvalidArgument` for the rest.
    pub(crate) fn execute<'a>(
        &self,
        lists: impl ExactSizeIterator<Item = &'a ListCore>,
        fence: Option<&FenceCore>,
    ) -> Result<()> {
        if lists.len() == 0 {
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
        for (i, l) in lists.enumerate() {
            check_same_context(&format!("command list {i}"), l.context, self.context)?;
            if l.device != self.device {
                return Err(Error::InvalidArgument(format!(
                    "command list {i} is for device {}, the queue for device {}",
                    l.device, self.device
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
        // Regular lists are Level Zero's alone (ACL streams use immediate lists).
        self.sub
            .submit(&cmds, fence.map(|f| f.flag.clone()), OperandRule::LevelZero)
    }

    /// `zeCommandQueueSynchronize`.
    pub(crate) fn synchronize(&self, timeout_ns: u64) -> Result<SyncStatus> {
        self.sub.synchronize(timeout_ns)
    }
}

#[cfg(test)]
mod tests {
    use crate::semantics::inflight::InFlightRef;
    use crate::spec::SyncStatus;
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
