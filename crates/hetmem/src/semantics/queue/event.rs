//! Events, event pools and fences over the backend's sync objects (`zeEventPoolCreate`,
//! `zeEventCreate`, `zeEventDestroy`'s check, `zeEventHostSignal`, `zeEventHostSynchronize`,
//! `zeEventQueryStatus`, `zeEventHostReset`, `zeFenceCreate`, `zeFenceHostSynchronize`,
//! `zeFenceQueryStatus`, `zeFenceReset`). The rules: the module docs of
//! [`crate::semantics::queue`] (pools and indices, signalled fences, timeouts).

use std::collections::BTreeSet;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::backend::EngineSync;
use crate::error::{Error, Result};
use crate::semantics::driver::DriverShared;
use crate::semantics::queue::args::{check_pool_count, take_pool_index};
use crate::spec::SyncStatus;

/// An event: its sync object, the context it was made in, and the tokens that tell how many
/// clones and how many queued waits hold it. Clones are the same event.
#[derive(Debug, Clone)]
pub(crate) struct EventCore {
    pub(crate) flag: Arc<dyn EngineSync>,
    /// One strong count per clone of this event.
    clones: Arc<()>,
    /// The wait token: one strong count per clone, and one per command that waits on the
    /// event, from its submission until its wait is over.
    pub(crate) waits: Arc<()>,
    /// The id of the context the event was made in.
    pub(crate) context: u64,
    /// The pool slot the event holds, given back when the last clone is dropped.
    _slot: Option<Arc<PoolSlot>>,
}

impl EventCore {
    /// A host-visible event of `context`, not signalled (`zeEventCreate`, implicit pool).
    ///
    /// Errors: `OutOfHostMemory` from the backend.
    pub(crate) fn new(d: &DriverShared, context: u64) -> Result<EventCore> {
        Ok(EventCore {
            flag: d.backend.create_sync()?,
            clones: Arc::new(()),
            waits: Arc::new(()),
            context,
            _slot: None,
        })
    }

    /// `zeEventDestroy`'s check: refused while a queued command still waits on the event.
    ///
    /// Errors: `HandleObjectInUse` naming how many commands still wait on it.
    pub(crate) fn check_destroy(&self) -> Result<()> {
        let work = Arc::strong_count(&self.waits).saturating_sub(Arc::strong_count(&self.clones));
        if work > 0 {
            return Err(Error::HandleObjectInUse(format!(
                "{work} queued command(s) wait on the event; destroy it once their waits are over"
            )));
        }
        Ok(())
    }

    /// `zeEventHostSignal`.
    pub(crate) fn host_signal(&self) -> Result<()> {
        self.flag.signal();
        Ok(())
    }

    /// `zeEventHostSynchronize`.
    pub(crate) fn host_synchronize(&self, timeout_ns: u64) -> Result<SyncStatus> {
        Ok(SyncStatus::of(self.flag.wait_ns(timeout_ns)))
    }

    /// `zeEventQueryStatus`.
    pub(crate) fn query_status(&self) -> Result<SyncStatus> {
        Ok(SyncStatus::of(self.flag.is_signalled()))
    }

    /// `zeEventHostReset`.
    pub(crate) fn host_reset(&self) -> Result<()> {
        self.flag.reset();
        Ok(())
    }
}

/// A taken slot of an event pool; freed on drop.
#[derive(Debug)]
struct PoolSlot {
    used: Weak<Mutex<BTreeSet<u32>>>,
    index: u32,
}

impl Drop for PoolSlot {
    fn drop(&mut self) {
        if let Some(u) = self.used.upgrade() {
            u.lock().remove(&self.index);
        }
    }
}

/// An event pool of `count` events, each in its own index.
#[derive(Debug)]
pub(crate) struct PoolCore {
    count: u32,
    /// Indices with a live event (a set: a pool of 2^32 events costs nothing until its events
    /// are made).
    used: Arc<Mutex<BTreeSet<u32>>>,
}

impl PoolCore {
    /// `zeEventPoolCreate` of `count` events.
    ///
    /// Errors: `InvalidSize` for a count of 0.
    pub(crate) fn new(count: u32) -> Result<PoolCore> {
        check_pool_count(count)?;
        Ok(PoolCore {
            count,
            used: Arc::default(),
        })
    }

    /// The number of events the pool holds.
    pub(crate) fn count(&self) -> u32 {
        self.count
    }

    /// The number of indices taken by live events.
    pub(crate) fn used(&self) -> usize {
        self.used.lock().len()
    }

    /// `zeEventCreate` in slot `index`, of `context`.
    ///
    /// Errors: `InvalidArgument` for an index not below the count or one a live event of the
    /// pool holds (nothing is taken then); `OutOfHostMemory` from the backend.
    pub(crate) fn create_event(
        &self,
        d: &DriverShared,
        context: u64,
        index: u32,
    ) -> Result<EventCore> {
        take_pool_index(&mut self.used.lock(), self.count, index)?;
        let slot = Arc::new(PoolSlot {
            used: Arc::downgrade(&self.used),
            index,
        });
        // On failure the slot is dropped and the index freed.
        let mut e = EventCore::new(d, context)?;
        e._slot = Some(slot);
        Ok(e)
    }
}

/// A fence of one command queue.
#[derive(Debug, Clone)]
pub(crate) struct FenceCore {
    pub(crate) flag: Arc<dyn EngineSync>,
    /// The id of the queue it belongs to.
    pub(crate) queue: u64,
}

impl FenceCore {
    /// `zeFenceCreate` on queue `queue`, signalled at once if `signaled`.
    ///
    /// Errors: `OutOfHostMemory` from the backend.
    pub(crate) fn new(d: &DriverShared, queue: u64, signaled: bool) -> Result<FenceCore> {
        let flag = d.backend.create_sync()?;
        if signaled {
            flag.signal();
        }
        Ok(FenceCore { flag, queue })
    }

    /// `zeFenceHostSynchronize`.
    pub(crate) fn host_synchronize(&self, timeout_ns: u64) -> Result<SyncStatus> {
        Ok(SyncStatus::of(self.flag.wait_ns(timeout_ns)))
    }

    /// `zeFenceQueryStatus`.
    pub(crate) fn query_status(&self) -> Result<SyncStatus> {
        Ok(SyncStatus::of(self.flag.is_signalled()))
    }

    /// `zeFenceReset`.
    pub(crate) fn reset(&self) -> Result<()> {
        self.flag.reset();
        Ok(())
    }
}
