//! Streams on managed memory (`aclrtCreateStream`, `aclrtSynchronizeStream`; dropping one is
//! `aclrtDestroyStream`) and the stream-ordered operations that are device accesses on the
//! stream's device: `aclrtMemcpyAsync` ([`ManagedStream::memcpy_async`]), `aclrtMemsetAsync`
//! ([`ManagedStream::memset_async`]) and launched device work ([`ManagedStream::launch`],
//! what `aclrtLaunchKernel` runs).
//!
//! A stream is one engine of the device queue machinery ([`Submitter`]): work runs in
//! submission order as host functions on it. Each operation checks its arguments when queued
//! (null pointers `ACL_ERROR_INVALID_PARAM` (100000); managed ranges inside one allocation,
//! 107000; for a copy, one side managed and the other memory the driver knows, held in flight
//! as a queue operand) and takes a [`QueuedHold`] on the managed allocations it references, so
//! a free waits until it has run. Run-time failures (through [`residency_error`]; a panic of
//! launched work is `ACL_ERROR_RT_DRV_INTERNAL_ERROR`) are kept, the first one, until the next
//! [`ManagedStream::synchronize`].

use std::sync::Arc;

use parking_lot::Mutex;

use crate::backend::managed::{DeviceOperand, ManagedResidency};
use crate::error::{AclCode, Error, Result};
use crate::semantics::checks::check_device;
use crate::semantics::driver::DriverShared;
use crate::semantics::managed::rules::{check_null, neither_managed, residency_error};
use crate::semantics::managed::state::{Core, QueuedHold};
use crate::semantics::queue::{self, Operand, Submitter};

/// One buffer of `Stream::launch`ed work: the device address of `[ptr, ptr+len)`.
#[derive(Debug, Clone, Copy)]
pub struct DeviceBuffer {
    /// Where the device reaches the buffer (valid only during the work).
    pub ptr: *mut u8,
    /// Bytes.
    pub len: usize,
}

/// An in-order stream on one device: its engine, the driver's managed memory, and the first
/// error of its work since the last synchronize. Dropping it waits for its work (the engine
/// joins).
#[derive(Debug)]
pub(crate) struct ManagedStream {
    // Dropped first: the engine runs what is queued, then joins.
    sub: Submitter,
    device: u32,
    core: Arc<Core>,
    error: Arc<Mutex<Option<Error>>>,
}

impl ManagedStream {
    /// `aclrtCreateStream` on device `ordinal` of driver `device_driver` for driver `d`.
    ///
    /// Errors: `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000) where managed memory is
    /// unavailable; `InvalidNullHandle` for a device of another driver; `OutOfHostMemory` if
    /// the engine cannot start.
    pub(crate) fn create(
        d: &Arc<DriverShared>,
        device_driver: &DriverShared,
        ordinal: u32,
    ) -> Result<ManagedStream> {
        let core = d.managed.core(d.backend.as_ref())?.clone();
        check_device(&**d, device_driver, ordinal)?;
        Ok(ManagedStream {
            sub: Submitter::new(d.clone(), ordinal)?,
            device: ordinal,
            core,
            error: Arc::default(),
        })
    }

    /// The driver's managed memory this stream works on.
    pub(in crate::semantics) fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// Queues `f`; `hold` (the managed allocations it references) is released once it has run.
    pub(in crate::semantics) fn enqueue(
        &self,
        hold: QueuedHold,
        f: impl FnOnce(&Core) -> Result<()> + Send + 'static,
    ) {
        let core = self.core.clone();
        let err = self.error.clone();
        self.sub.submit_host(Box::new(move || {
            let r = f(&core);
            drop(hold);
            if let Err(e) = r {
                err.lock().get_or_insert(e);
            }
        }));
    }

    /// `aclrtDestroyStreamForce`'s discard: the work queued and not started is dropped unrun,
    /// releasing its managed holds and in-flight references
    /// ([`Submitter::discard_queued_host`]); work already running finishes.
    pub(crate) fn discard_queued(&self) {
        self.sub.discard_queued_host();
    }

    /// `aclrtSynchronizeStream`: waits for everything submitted before; the first error of the
    /// work since the last synchronize (the stream stays usable).
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.sub.synchronize(u64::MAX)?;
        match self.error.lock().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Stream-ordered `aclrtMemcpyAsync` of `count` bytes: each side managed memory (the range
    /// inside one allocation) or memory the driver knows (a queue operand, held in flight until
    /// the copy has run); at least one side managed.
    pub(crate) fn memcpy_async(&self, dst: usize, src: usize, count: usize) -> Result<()> {
        check_null(dst, "pointer")?;
        check_null(src, "pointer")?;
        let (dm, sm, queued) = {
            let mut st = self.core.state.lock();
            let dm = self.core.find(&st, dst).is_some();
            let sm = self.core.find(&st, src).is_some();
            if !dm && !sm {
                return Err(neither_managed(dst, src));
            }
            if dm {
                self.core.check_range(&st, dst, count)?;
            }
            if sm {
                self.core.check_range(&st, src, count)?;
            }
            let managed: Vec<usize> = [(dst, dm), (src, sm)]
                .iter()
                .filter(|&&(_, m)| m)
                .map(|&(a, _)| a)
                .collect();
            let queued = QueuedHold::take(&self.core, &mut st, &managed);
            (dm, sm, queued)
        };
        // The plain side (at most one), held in flight until the copy has run.
        let plain = |ptr, write| {
            queue::hold(
                &self.sub.driver,
                Operand {
                    ptr,
                    size: count,
                    write,
                },
            )
        };
        let held = match (dm, sm) {
            (false, _) => Some(plain(dst, true)?),
            (_, false) => Some(plain(src, false)?),
            _ => None,
        };
        let d = self.device;
        self.enqueue(queued, move |c| {
            let r = device_copy(c.res.as_ref(), d, (dst, dm), (src, sm), count);
            drop(held);
            r
        });
        Ok(())
    }

    /// Stream-ordered `aclrtMemsetAsync`: `count` bytes at `ptr` (inside one managed
    /// allocation) set to `value` by the stream's device.
    pub(crate) fn memset_async(&self, ptr: usize, value: u8, count: usize) -> Result<()> {
        check_null(ptr, "pointer")?;
        let hold = {
            let mut st = self.core.state.lock();
            self.core.check_range(&st, ptr, count)?;
            QueuedHold::take(&self.core, &mut st, &[ptr])
        };
        let d = self.device;
        self.enqueue(hold, move |c| {
            c.res
                .device_fill(d, ptr, value, count)
                .map_err(residency_error)
        });
        Ok(())
    }

    /// Launched device work on `buffers` (`(ptr, len, write)`, each inside one managed
    /// allocation): when the stream reaches it, the backend migrates and pins every page on
    /// the stream's device (`ManagedResidency::prepare`), `work` runs with the device address
    /// of each buffer and no lock held, then the pins drop (`ManagedResidency::release`).
    pub(crate) fn launch(
        &self,
        buffers: &[(usize, usize, bool)],
        work: impl FnOnce(&[DeviceBuffer]) + Send + 'static,
    ) -> Result<()> {
        let hold = {
            let mut st = self.core.state.lock();
            for &(p, l, _) in buffers {
                check_null(p, "buffer pointer")?;
                self.core.check_range(&st, p, l)?;
            }
            let addrs: Vec<usize> = buffers.iter().map(|&(p, _, _)| p).collect();
            QueuedHold::take(&self.core, &mut st, &addrs)
        };
        let d = self.device;
        let bufs = buffers.to_vec();
        self.enqueue(hold, move |c| {
            // Every page migrates to the device and stays there (pinned) while `work` runs,
            // with no lock held.
            let addrs = c.res.prepare(d, &bufs).map_err(residency_error)?;
            let dev: Vec<DeviceBuffer> = bufs
                .iter()
                .zip(addrs)
                .map(|(&(_, l, _), a)| DeviceBuffer {
                    ptr: a as *mut u8,
                    len: l,
                })
                .collect();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || work(&dev)));
            c.res.release(&bufs);
            r.map_err(|_| {
                Error::Acl(
                    AclCode::RtDrvInternalError,
                    "launched device work panicked".into(),
                )
            })
        });
        Ok(())
    }
}

/// A copy of `count` bytes on `device` by the managed-residency backend, each side given as
/// `(address, whether it is managed memory)`.
pub(in crate::semantics) fn device_copy(
    res: &dyn ManagedResidency,
    device: u32,
    (dst, dm): (usize, bool),
    (src, sm): (usize, bool),
    count: usize,
) -> Result<()> {
    res.device_copy(
        device,
        DeviceOperand {
            addr: dst,
            managed: dm,
        },
        DeviceOperand {
            addr: src,
            managed: sm,
        },
        count,
    )
    .map_err(residency_error)
}
