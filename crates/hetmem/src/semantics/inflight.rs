//! In-flight references: which USM allocations, reservations and opened IPC views submitted
//! batches of device work still use, and the frees waiting for them (`zeMemFreeExt`'s
//! BLOCKING and DEFER policies, free-now under running work). Queue submission takes the
//! references; unmap, reservation free, set-access, IPC close and context teardown wait for
//! them (see the README's "Queued work on virtual memory").

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Condvar, Mutex};

use crate::semantics::usm::PendingFree;
use std::time::{Duration, Instant};

/// What a submitted batch holds a reference on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum InFlightRef {
    /// A USM allocation or import, by id.
    Usm(u64),
    /// A virtual-memory reservation, by base address.
    Reservation(usize),
    /// An opened IPC view ([`crate::ipc`]), by base address.
    View(usize),
    /// Plain system memory of the process (`malloc`, the stack), Level Zero only: never
    /// acquired (the program owns that memory; frees are not held).
    System,
}

/// Driver-wide counts of in-flight references (USM allocations by id, reservations and IPC
/// views by base): how many submitted batches that reference each have not finished; and the
/// USM frees waiting for those counts to reach zero (`zeMemFreeExt`).
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    pub(crate) state: Mutex<InFlightState>,
    pub(crate) cv: Condvar,
    /// Threads blocked in [`InFlight::wait_unreferenced_ref`] right now (diagnostics, tests).
    pub(crate) waiters: AtomicU64,
    /// Distinct reservations referenced by in-flight work. Changed only under `state`; read
    /// without it by [`vm_write_unreferenced`]'s fast path, under the vm write lock (which no
    /// submission holds, so the count cannot grow then), and by set-access's, under the
    /// reservation's gate (which a submission that references it holds while it does).
    pub(crate) reservations: AtomicU64,
}

#[derive(Debug, Default)]
pub(crate) struct InFlightState {
    pub(crate) counts: HashMap<InFlightRef, usize>,
    pub(crate) pending: HashMap<u64, PendingFree>,
    /// Every USM allocation taken out of the table whose memory is not released yet, by id:
    /// its `[base, end)`. Entered under the usm write lock that takes the record out
    /// ([`InFlight::retiring`]) and left once the memory is gone ([`InFlight::finish`]), so a
    /// submission checking under the usm read lock never takes that memory, about to be
    /// unmapped, for plain system memory of the program (`queue::command`).
    pub(crate) retiring: HashMap<u64, (usize, usize)>,
}

impl InFlight {
    pub(crate) fn acquire(&self, refs: &[InFlightRef]) {
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
    pub(crate) fn release(&self, refs: &[InFlightRef]) -> Vec<PendingFree> {
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

    /// Records `p` (just taken out of the USM table, the usm write lock still held) as
    /// retiring until [`InFlight::finish`] releases its memory.
    pub(crate) fn retiring(&self, p: &PendingFree) {
        self.state
            .lock()
            .retiring
            .insert(p.id(), (p.ptr, p.ptr + p.rec.extent()));
    }

    /// Releases `p`'s memory ([`PendingFree::finish`]), then ends its retiring record.
    pub(crate) fn finish(&self, p: PendingFree, backend: &dyn crate::backend::Backend) {
        let id = p.id();
        p.finish(backend);
        self.state.lock().retiring.remove(&id);
    }

    /// The freed allocation whose memory is not released yet (held for queued work, or on its
    /// way out) that overlaps `[start, end)`, as `(base, end)`. Takes the state lock: callers
    /// holding the usm / vm read locks may call it (the lock order of `crate::semantics::driver`).
    pub(crate) fn retiring_overlapping(&self, start: usize, end: usize) -> Option<(usize, usize)> {
        let st = self.state.lock();
        st.retiring
            .values()
            .copied()
            .find(|&(b, e)| b < end && start < e)
    }

    /// Number of frees waiting for work to finish.
    pub(crate) fn pending_frees(&self) -> usize {
        self.state.lock().pending.len()
    }
}

/// Waits on `cv` until `done(state)` or the timeout (ns; 0 = no wait, `u64::MAX` = forever).
pub(crate) fn wait_until<T>(
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
