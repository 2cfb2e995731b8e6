//! Device capacity and object ids shared by the virtual-memory ([`crate::vmm`]) and USM
//! ([`crate::usm`]) semantics.
//!
//! Physical memory objects (`zePhysicalMemCreate`) and device / shared allocations
//! (`zeMemAllocDevice`, `zeMemAllocShared`) draw on the same device memory, so one counter per
//! device is charged by both. The counters are atomic, so each semantics state can charge them
//! under its own lock without taking the other's.
//!
//! # Memory held by more than its creator
//! Device memory counts against the capacity for as long as anything keeps it alive, not only
//! its creator: a physical object or allocation destroyed (or freed) while an IPC export of it
//! is live, or while a view of it is open in this process, is still memory of the device. So a
//! charge is a [`Charge`] shared (`Arc`) by the object's record, each export of it and each
//! view of it opened in this process ([`crate::ipc`]); the bytes come back when the last of
//! them goes. Views opened in other processes are not seen here (the exporter's export, which
//! they need to be opened, holds the charge until it is put).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::backend::DeviceInfo;
use crate::error::{Error, Result};

/// Ids are process-wide, so that a handle of one driver (or runtime) is never taken for an
/// object of another.
pub(crate) static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh process-wide id, never 0 and never reused (also used for contexts).
pub(crate) fn fresh_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// Per-device used / capacity counters (bytes).
#[derive(Debug)]
pub(crate) struct DeviceMemory {
    pub(crate) capacity: Vec<u64>,
    pub(crate) used: Vec<AtomicU64>,
}

impl DeviceMemory {
    /// Counters for `devices`, all unused.
    pub(crate) fn new(devices: &[DeviceInfo]) -> DeviceMemory {
        DeviceMemory {
            capacity: devices.iter().map(|d| d.capacity).collect(),
            used: devices.iter().map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Number of devices.
    pub(crate) fn len(&self) -> usize {
        self.capacity.len()
    }

    /// Capacity of device `i` in bytes. `i` must be a valid index.
    pub(crate) fn capacity(&self, i: usize) -> u64 {
        self.capacity[i]
    }

    /// Bytes of device `i` in use. `i` must be a valid index.
    pub(crate) fn used(&self, i: usize) -> u64 {
        self.used[i].load(Ordering::Acquire)
    }

    /// Charges `bytes` to device `i`, or fails with `OutOfDeviceMemory` (nothing charged) if
    /// they do not fit in what is left.
    pub(crate) fn take(&self, i: usize, bytes: u64) -> Result<()> {
        let cap = self.capacity[i];
        self.used[i]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(bytes).filter(|&n| n <= cap)
            })
            .map(|_| ())
            .map_err(|u| {
                Error::OutOfDeviceMemory(format!(
                    "device {i} has {:#x} bytes free of {cap:#x}; {bytes:#x} asked",
                    cap - u
                ))
            })
    }

    /// Charges `bytes` to device `i` as [`DeviceMemory::take`] does, as a [`Charge`] that gives
    /// them back when its last holder drops it.
    pub(crate) fn charge(self: &Arc<Self>, i: usize, bytes: u64) -> Result<Arc<Charge>> {
        self.take(i, bytes)?;
        Ok(Arc::new(Charge {
            devmem: self.clone(),
            device: i,
            bytes,
        }))
    }

    /// Gives back `bytes` charged earlier with [`DeviceMemory::take`].
    pub(crate) fn give_back(&self, i: usize, bytes: u64) {
        self.used[i].fetch_sub(bytes, Ordering::AcqRel);
    }

    /// A fresh id, unique in the process across physical objects, allocations, imports and
    /// contexts of every driver; never 0.
    pub(crate) fn next_id(&self) -> u64 {
        fresh_id()
    }
}

/// Bytes of one device charged for one piece of memory (a physical object, a device or
/// shared allocation), held by everything that keeps that memory alive (see the module docs);
/// given back when the last holder drops it.
#[derive(Debug)]
pub(crate) struct Charge {
    devmem: Arc<DeviceMemory>,
    device: usize,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.devmem.give_back(self.device, self.bytes);
    }
}
