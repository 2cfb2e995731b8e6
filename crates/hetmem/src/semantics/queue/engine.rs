//! One engine (host: a worker thread; CUDA: a stream) and its bookkeeping: submission of a
//! checked batch with its in-flight references and fence, host functions in order,
//! synchronization with the first failure of queued work reported once; and the
//! host-synchronous device operations of ACL (`aclrtMemcpy` / `aclrtMemset`) on the driver's
//! per-device sync engines.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::backend::{Engine, EngineOp, EngineSync};
use crate::error::Result;
use crate::semantics::driver::DriverShared;
use crate::semantics::inflight::wait_until;
use crate::semantics::queue::command::{
    check_all, engine_ops, hold, owning_device, Cmd, OperandRule,
};
use crate::semantics::queue::command::{HeldOperand, Operand};
use crate::spec::SyncStatus;

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
    /// Host functions ([`Submitter::submit_host`]) numbered up to this batch count are
    /// discarded when the engine reaches them ([`Submitter::discard_queued_host`]).
    pub(crate) discard_through: Arc<std::sync::atomic::AtomicU64>,
    // Dropped last: joins the engine thread after the rest is gone.
    pub(crate) engine: Box<dyn Engine>,
}

impl Submitter {
    pub(crate) fn new(driver: Arc<DriverShared>, device: u32) -> Result<Submitter> {
        let engine = driver.backend.create_engine(device)?;
        Ok(Submitter {
            driver,
            progress: Arc::default(),
            discard_through: Arc::default(),
            engine,
        })
    }

    /// Validates `cmds` under `rule`, holds their references and submits them as one batch.
    pub(crate) fn submit(
        &self,
        cmds: &[Cmd],
        fence: Option<Arc<dyn EngineSync>>,
        rule: OperandRule,
    ) -> Result<()> {
        let ids = check_all(&self.driver, cmds, true, rule)?;
        let mut ops = engine_ops(cmds);
        let driver = self.driver.clone();
        let progress = self.progress.clone();
        ops.push(EngineOp::Host(Box::new(move || {
            for p in driver.inflight.release(&ids) {
                driver.inflight.finish(p, driver.backend.as_ref());
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
    /// A host function discarded before it runs ([`Submitter::discard_queued_host`]) is
    /// dropped unrun, so what it holds (the memory it references) is released.
    pub(crate) fn submit_host(&self, f: Box<dyn FnOnce() + Send>) {
        let progress = self.progress.clone();
        let mut counts = self.progress.counts.lock();
        counts.0 += 1;
        let ticket = counts.0;
        let discard = self.discard_through.clone();
        let ops = vec![
            EngineOp::Host(Box::new(move || {
                if ticket > discard.load(std::sync::atomic::Ordering::Acquire) {
                    f();
                }
            })),
            EngineOp::Host(Box::new(move || {
                progress.counts.lock().1 += 1;
                progress.cv.notify_all();
            })),
        ];
        drop(counts);
        // SAFETY: no memory operation; host functions only.
        unsafe { self.engine.submit(ops) };
    }

    /// Discards every host function submitted so far that has not started (ACL's
    /// `aclrtDestroyStreamForce`: "discard all tasks"): each is dropped unrun when the engine
    /// reaches it, releasing what it holds; one already running finishes. Memory operations
    /// ([`Submitter::submit`]) are never discarded.
    pub(crate) fn discard_queued_host(&self) {
        let through = self.progress.counts.lock().0;
        self.discard_through
            .fetch_max(through, std::sync::atomic::Ordering::AcqRel);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Runtime;

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
            discard_through: Arc::default(),
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
