//! The synchronisation object shared by the backends ([`FlagSync`]).

use parking_lot::Mutex;

/// A synchronisation object kept on the host: a flag and a condition variable. The host
/// backend's events and fences, and the cuda backend's (its engines wait for them on their
/// dispatch thread before queuing what follows).
#[derive(Debug, Default)]
pub(crate) struct FlagSync {
    set: Mutex<bool>,
    cv: parking_lot::Condvar,
}

impl crate::backend::EngineSync for FlagSync {
    fn wait_ns(&self, timeout_ns: u64) -> bool {
        let mut g = self.set.lock();
        if *g || timeout_ns == 0 {
            return *g;
        }
        let deadline = (timeout_ns != u64::MAX)
            .then(|| {
                std::time::Instant::now().checked_add(std::time::Duration::from_nanos(timeout_ns))
            })
            .flatten();
        while !*g {
            match deadline {
                None => self.cv.wait(&mut g),
                Some(d) => {
                    if self.cv.wait_until(&mut g, d).timed_out() {
                        return *g;
                    }
                }
            }
        }
        true
    }
    fn signal(&self) {
        *self.set.lock() = true;
        self.cv.notify_all();
    }
    fn reset(&self) {
        *self.set.lock() = false;
    }
    fn is_signalled(&self) -> bool {
        *self.set.lock()
    }
}
