//! Device capacity and object ids shared by the virtual-memory ([`crate::vmm`]) and USM
//! ([`crate::usm`]) semantics, and the sub-device model.
//!
//! # Sub-devices
//! A driver configured with sub-devices (the host backend's `HETMEM_HOST_SUBDEVICES=N`,
//! [`crate::RuntimeBuilder::host_subdevices`]) splits each device (the *root*) into `N`
//! sub-devices, as a multi-tile GPU is split into tiles: sub-device `s` owns a share of the
//! root's capacity ([`sub_device_share`]: `capacity / N`, rounded down to 2 MiB) and is
//! charged for what is made on it, and everything made on a sub-device is also memory of its
//! root. Memory made on the root itself (`zeMemAllocDevice` with the root's handle) counts
//! against the whole root only. So a root has `capacity - used(root)` free, and a sub-device
//! the smaller of its own share's free bytes and its root's. The backend does the raw work of
//! every sub-device on its root device (it knows nothing of sub-devices).
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

/// The most sub-devices one device may be split into.
pub const MAX_SUB_DEVICES: u32 = 16;
/// The unit of a sub-device's share of its root's capacity (so that every page size fits).
pub const SUB_DEVICE_SHARE_UNIT: u64 = 2 << 20;

/// A sub-device's share of a root device of `capacity` bytes split `n` ways: `capacity / n`
/// rounded down to [`SUB_DEVICE_SHARE_UNIT`]; 0 for `n == 0`.
pub fn sub_device_share(capacity: u64, n: u32) -> u64 {
    if n == 0 {
        return 0;
    }
    capacity / n as u64 / SUB_DEVICE_SHARE_UNIT * SUB_DEVICE_SHARE_UNIT
}

/// Checks a sub-device count for devices of `capacity` bytes: 0 (none) or 2 to
/// [`MAX_SUB_DEVICES`], each share at least [`SUB_DEVICE_SHARE_UNIT`]. `setting` names where
/// the count came from, for the message.
///
/// Errors: `InvalidArgument` naming the count and the rule it breaks.
pub fn check_sub_devices(n: u32, capacity: u64, setting: &str) -> Result<()> {
    if n == 1 || n > MAX_SUB_DEVICES {
        return Err(Error::InvalidArgument(format!(
            "{setting}: {n} sub-devices per device; use 0 (none) or 2 to {MAX_SUB_DEVICES}              (a device split into one sub-device is the device itself)"
        )));
    }
    if n > 1 && sub_device_share(capacity, n) == 0 {
        return Err(Error::InvalidArgument(format!(
            "{setting}: a device of {capacity} bytes split into {n} sub-devices leaves each less              than {SUB_DEVICE_SHARE_UNIT} bytes"
        )));
    }
    Ok(())
}

/// Per-device used / capacity counters (bytes), and those of each device's sub-devices (see
/// the module docs).
#[derive(Debug)]
pub(crate) struct DeviceMemory {
    pub(crate) capacity: Vec<u64>,
    pub(crate) used: Vec<AtomicU64>,
    /// Sub-devices of every device (0: none).
    pub(crate) sub_devices: u32,
    /// Bytes charged to sub-device `s` of device `i`, at `i * sub_devices + s`.
    sub_used: Vec<AtomicU64>,
}

impl DeviceMemory {
    /// Counters for `devices`, each split into `sub_devices` sub-devices (0: none), all unused.
    pub(crate) fn new(devices: &[DeviceInfo], sub_devices: u32) -> DeviceMemory {
        DeviceMemory {
            capacity: devices.iter().map(|d| d.capacity).collect(),
            used: devices.iter().map(|_| AtomicU64::new(0)).collect(),
            sub_devices,
            sub_used: (0..devices.len() * sub_devices as usize)
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    /// Capacity of sub-device `sub` of device `i` (its share), or of device `i` for `None`.
    pub(crate) fn slot_capacity(&self, i: usize, sub: Option<u32>) -> u64 {
        match sub {
            None => self.capacity[i],
            Some(_) => sub_device_share(self.capacity[i], self.sub_devices),
        }
    }

    /// Bytes charged to sub-device `sub` of device `i`, or to device `i` for `None` (which
    /// includes its sub-devices').
    pub(crate) fn slot_used(&self, i: usize, sub: Option<u32>) -> u64 {
        match sub {
            None => self.used(i),
            Some(s) => self.sub_used[self.sub_index(i, s)].load(Ordering::Acquire),
        }
    }

    /// Bytes free on sub-device `sub` of device `i` (the smaller of its share's and its
    /// root's), or on device `i` for `None`.
    pub(crate) fn slot_free(&self, i: usize, sub: Option<u32>) -> u64 {
        let root = self.capacity[i].saturating_sub(self.used(i));
        match sub {
            None => root,
            Some(_) => self
                .slot_capacity(i, sub)
                .saturating_sub(self.slot_used(i, sub))
                .min(root),
        }
    }

    fn sub_index(&self, i: usize, s: u32) -> usize {
        assert!(
            s < self.sub_devices,
            "sub-device {s} of {}",
            self.sub_devices
        );
        i * self.sub_devices as usize + s as usize
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

    /// Charges `bytes` to sub-device `sub` of device `i` and to device `i` (for `None`, to
    /// device `i` alone, as [`DeviceMemory::take`] does), as a [`Charge`] that gives them back
    /// when its last holder drops it; or fails with `OutOfDeviceMemory` naming the one they do
    /// not fit in (nothing charged).
    pub(crate) fn charge_on(
        self: &Arc<Self>,
        i: usize,
        sub: Option<u32>,
        bytes: u64,
    ) -> Result<Arc<Charge>> {
        if let Some(s) = sub {
            let k = self.sub_index(i, s);
            let share = self.slot_capacity(i, sub);
            self.sub_used[k]
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                    u.checked_add(bytes).filter(|&n| n <= share)
                })
                .map_err(|u| {
                    Error::OutOfDeviceMemory(format!(
                        "sub-device {s} of device {i} has {:#x} bytes free of its share {share:#x}; \
                         {bytes:#x} asked",
                        share - u
                    ))
                })?;
            if let Err(e) = self.take(i, bytes) {
                self.sub_used[k].fetch_sub(bytes, Ordering::AcqRel);
                return Err(e);
            }
        } else {
            self.take(i, bytes)?;
        }
        Ok(Arc::new(Charge {
            devmem: self.clone(),
            device: i,
            sub,
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
    /// The sub-device of `device` also charged, if any.
    sub: Option<u32>,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        if let Some(s) = self.sub {
            let k = self.devmem.sub_index(self.device, s);
            self.devmem.sub_used[k].fetch_sub(self.bytes, Ordering::AcqRel);
        }
        self.devmem.give_back(self.device, self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devmem(cap: u64, subs: u32) -> Arc<DeviceMemory> {
        let info = DeviceInfo {
            name: "d".into(),
            capacity: cap,
            max_alloc_size: cap,
            min_page_size: 4096,
        };
        Arc::new(DeviceMemory::new(&[info.clone(), info], subs))
    }

    const M: u64 = 1 << 20;

    #[test]
    fn a_sub_device_is_charged_with_its_root_and_limited_by_its_share() {
        let d = devmem(256 * M, 2);
        assert_eq!(d.slot_capacity(0, Some(1)), 128 * M);
        let a = d.charge_on(0, Some(1), 100 * M).unwrap();
        assert_eq!((d.slot_used(0, Some(1)), d.used(0)), (100 * M, 100 * M));
        assert_eq!(d.slot_used(0, Some(0)), 0);
        assert_eq!(d.slot_free(0, Some(1)), 28 * M);
        // Over the share (the root has room): refused, nothing charged.
        let e = d.charge_on(0, Some(1), 29 * M).unwrap_err();
        assert!(e.to_string().contains("sub-device 1 of device 0"), "{e}");
        assert_eq!((d.slot_used(0, Some(1)), d.used(0)), (100 * M, 100 * M));
        // The other device is untouched.
        assert_eq!(d.used(1), 0);
        drop(a);
        assert_eq!((d.slot_used(0, Some(1)), d.used(0)), (0, 0));
    }

    #[test]
    fn the_roots_own_memory_counts_against_the_whole_and_limits_its_sub_devices() {
        let d = devmem(256 * M, 2);
        let root = d.charge_on(0, None, 200 * M).unwrap();
        assert_eq!(d.slot_used(0, Some(0)), 0);
        // Sub-device 0's share is free, but only 56 MiB of the root are.
        assert_eq!(d.slot_free(0, Some(0)), 56 * M);
        let e = d.charge_on(0, Some(0), 100 * M).unwrap_err();
        assert!(e.to_string().contains("device 0 has"), "{e}");
        assert_eq!(
            d.slot_used(0, Some(0)),
            0,
            "the sub-device's charge was rolled back"
        );
        let s = d.charge_on(0, Some(0), 56 * M).unwrap();
        assert_eq!(d.slot_free(0, None), 0);
        drop((root, s));
        assert_eq!(d.slot_free(0, None), 256 * M);
    }

    #[test]
    fn sub_device_counts_are_checked() {
        assert!(check_sub_devices(0, 64 * M, "x").is_ok());
        assert!(check_sub_devices(2, 64 * M, "x").is_ok());
        assert!(check_sub_devices(16, 64 * M, "x").is_ok());
        for n in [1, 17] {
            let e = check_sub_devices(n, 64 * M, "HETMEM_HOST_SUBDEVICES=1").unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)));
            assert!(e.to_string().contains("HETMEM_HOST_SUBDEVICES"), "{e}");
        }
        assert!(check_sub_devices(4, 6 * M, "x").is_err(), "1.5 MiB shares");
        assert_eq!(sub_device_share(7 * M, 2), 2 * M);
    }
}
