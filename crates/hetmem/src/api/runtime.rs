//! The object model: [`Runtime`] → [`Driver`] (one per backend) → [`Device`]s → [`Context`]s,
//! as in Level Zero (`zeInitDrivers`, `zeDriverGet`, `zeDeviceGet`, `zeContextCreate`).
//!
//! The backend is chosen by [`RuntimeBuilder::backend`] in Rust and by `HETMEM_BACKEND`
//! (`host`, the default, or `cuda`) through [`Runtime::from_env`]. Host-backend devices are set
//! by `HETMEM_HOST_DEVICES` (default 2) and `HETMEM_HOST_DEVICE_MEMORY` (bytes per device, with an
//! optional `K`/`M`/`G`/`T` suffix; default a quarter of RAM split between the devices), and the
//! largest single allocation by `HETMEM_HOST_MAX_ALLOC` (default half a device); 2 MiB pages
//! where the machine offers them unless `HETMEM_HOST_HUGE_PAGES=off` (`on`/`auto`, the default,
//! takes them); `HETMEM_HOST_SUBDEVICES=N` (0, the default, or 2 to 16) splits each host device
//! into `N` sub-devices ([`Device::sub_devices`]), each with its share of the device's capacity
//! and its own queues, as a multi-tile GPU is split into tiles (the cuda backend has none:
//! [`Driver::sub_devices_note`]).

use std::sync::Arc;

use crate::backend::{Backend, DeviceInfo};
use crate::config::{parse_bytes, Adjustment, BackendConfig, BackendKind, HostConfig};
use crate::error::{Error, Result};
use crate::semantics::driver::{DeviceRef, DriverShared};
use crate::semantics::usm::UsmStats;
use crate::semantics::vmm::VmStats;

/// Builds a [`Runtime`].
#[derive(Debug, Clone)]
pub struct RuntimeBuilder {
    backend: BackendKind,
    host: HostConfig,
    ipc_max_range_pieces: usize,
    /// How the largest single allocation was given (`HETMEM_HOST_MAX_ALLOC=10G`, or the
    /// builder call), for an [`Adjustment`] that names it; `None` while it is the default.
    max_alloc_setting: Option<String>,
    /// How the sub-device count was given (`HETMEM_HOST_SUBDEVICES=2` or the builder call),
    /// for the message of a refused count.
    sub_devices_setting: Option<String>,
}

/// The smallest host device [`RuntimeBuilder::from_env`] derives from `HETMEM_HOST_DEVICES`.
const MIN_DERIVED_DEVICE_MEMORY: u64 = 64 << 20;

impl RuntimeBuilder {
    /// Chooses the backend.
    pub fn backend(mut self, kind: BackendKind) -> Self {
        self.backend = kind;
        self
    }
    /// Number of host-backend devices (at least 1).
    pub fn host_devices(mut self, n: u32) -> Self {
        self.host.devices = n;
        self
    }
    /// Capacity of each host-backend device in bytes; the largest single allocation becomes half
    /// of it unless set after this call. 0 is refused by [`RuntimeBuilder::build`]
    /// (`InvalidArgument`).
    pub fn host_device_memory(mut self, bytes: u64) -> Self {
        self.host.device_memory = bytes;
        self.host.max_alloc_size = (bytes / 2).max(1);
        self.max_alloc_setting = None;
        self.host.adjustments.retain(|a| a.field != "device_memory");
        self
    }
    /// Largest single allocation of each host-backend device in bytes. More than a device's
    /// memory is lowered to it by [`RuntimeBuilder::build`], which records an [`Adjustment`]
    /// ([`HostConfig::adjustments`]).
    pub fn host_max_alloc_size(mut self, bytes: u64) -> Self {
        self.host.max_alloc_size = bytes;
        self.max_alloc_setting = Some(format!("host_max_alloc_size({bytes})"));
        self
    }
    /// Sub-devices of each host-backend device (`HETMEM_HOST_SUBDEVICES`): 0 (none, the
    /// default) or 2 to 16, each a share of its device's capacity (capacity / `n`, rounded
    /// down to 2 MiB) with its own queues ([`Device::sub_devices`]). Checked by
    /// [`RuntimeBuilder::build`] (`InvalidArgument` for 1, more than 16, or shares under
    /// 2 MiB).
    pub fn host_subdevices(mut self, n: u32) -> Self {
        self.host.sub_devices = n;
        self.sub_devices_setting = Some(format!("host_subdevices({n})"));
        self
    }
    /// Whether the host backend takes 2 MiB pages where the machine offers them (shmem THP for
    /// physical objects mapped 2 MiB-aligned, reserved hugetlbfs pages for managed memory;
    /// 4 KiB pages wherever none is free). Default true; `HETMEM_HOST_HUGE_PAGES=off` sets false.
    pub fn host_huge_pages(mut self, on: bool) -> Self {
        self.host.huge_pages = on;
        self
    }
    /// Most `(physical object, offset, length)` pieces one IPC range handle of this driver
    /// carries (`ze_ipc_phys_mem_handle_range_ext_desc_t`): exporting a range of more pieces is
    /// `UnsupportedSize` naming the limit, and opening a range handle that claims more is
    /// refused the same way. Default [`crate::semantics::ipc::DEFAULT_MAX_RANGE_PIECES`] (1 << 20); values
    /// below 1 are taken as 1. See [`Driver::ipc_max_range_pieces`].
    pub fn ipc_max_range_pieces(mut self, n: usize) -> Self {
        self.ipc_max_range_pieces = n.max(1);
        self
    }

    /// The configuration from the environment (see the module docs), on top of the defaults.
    /// `HETMEM_HOST_DEVICES` alone splits the default memory between the devices, at least
    /// 64 MiB each: where that minimum applies, [`HostConfig::adjustments`] says so.
    ///
    /// Errors: `InvalidArgument`, naming the variable and its value, for a `HETMEM_BACKEND`
    /// that is not `host` or `cuda`, a `HETMEM_HOST_DEVICES` or `HETMEM_HOST_SUBDEVICES` that
    /// is not a count, or a
    /// `HETMEM_HOST_DEVICE_MEMORY` / `HETMEM_HOST_MAX_ALLOC` that is not a byte count (see
    /// [`parse_bytes`]) or is 0. A device count of 0 is refused by [`RuntimeBuilder::build`].
    pub fn from_env() -> Result<RuntimeBuilder> {
        let mut b = Runtime::builder();
        if let Ok(v) = std::env::var("HETMEM_BACKEND") {
            b = b.backend(BackendKind::parse(&v)?);
        }
        if let Ok(v) = std::env::var("HETMEM_HOST_DEVICES") {
            let n: u32 = v.trim().parse().map_err(|_| {
                Error::InvalidArgument(format!("HETMEM_HOST_DEVICES={v:?} is not a count"))
            })?;
            b = b.host_devices(n);
            // Keep a quarter of RAM in all unless the memory is set explicitly.
            let d = HostConfig::default_for_machine();
            if n > 0 {
                let per = (d.device_memory * d.devices as u64 / n as u64) / (2 << 20) * (2 << 20);
                b = b.host_device_memory(per.max(MIN_DERIVED_DEVICE_MEMORY));
                if per < MIN_DERIVED_DEVICE_MEMORY {
                    b.host.adjustments.push(Adjustment {
                        setting: format!("HETMEM_HOST_DEVICES={v}"),
                        field: "device_memory",
                        asked: per,
                        used: MIN_DERIVED_DEVICE_MEMORY,
                        reason: format!(
                            "the default memory ({} bytes) split {n} ways, below the {} byte \
                             minimum of a device (set HETMEM_HOST_DEVICE_MEMORY to choose)",
                            d.device_memory * d.devices as u64,
                            MIN_DERIVED_DEVICE_MEMORY
                        ),
                    });
                }
            }
        }
        if let Ok(v) = std::env::var("HETMEM_HOST_SUBDEVICES") {
            let n: u32 = v.trim().parse().map_err(|_| {
                Error::InvalidArgument(format!(
                    "HETMEM_HOST_SUBDEVICES={v:?} is not a count (0, or 2 to 16 sub-devices \
                     per device)"
                ))
            })?;
            b = b.host_subdevices(n);
            b.sub_devices_setting = Some(format!("HETMEM_HOST_SUBDEVICES={v}"));
        }
        if let Ok(v) = std::env::var("HETMEM_HOST_HUGE_PAGES") {
            b = b.host_huge_pages(match v.trim().to_ascii_lowercase().as_str() {
                "" | "on" | "auto" | "1" => true,
                "off" | "0" => false,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "HETMEM_HOST_HUGE_PAGES={v:?} is not one of: auto, on, off"
                    )))
                }
            });
        }
        for var in ["HETMEM_HOST_DEVICE_MEMORY", "HETMEM_HOST_MAX_ALLOC"] {
            let Ok(v) = std::env::var(var) else { continue };
            let n = parse_bytes(&v)
                .map_err(|e| Error::InvalidArgument(format!("{var}={v:?}: {}", e.message())))?;
            if n == 0 {
                return Err(Error::InvalidArgument(format!(
                    "{var}={v:?} is 0 bytes; it must be at least 1 byte"
                )));
            }
            b = match var {
                "HETMEM_HOST_DEVICE_MEMORY" => b.host_device_memory(n),
                _ => b.host_max_alloc_size(n),
            };
            if var == "HETMEM_HOST_MAX_ALLOC" {
                b.max_alloc_setting = Some(format!("{var}={v}"));
            }
        }
        Ok(b)
    }

    /// Starts the runtime: makes the backend and its driver. A largest single allocation above
    /// the device memory is lowered to it, recorded in [`HostConfig::adjustments`] (and logged
    /// as a `tracing` warning, as every adjustment is).
    ///
    /// Errors: `InvalidArgument` for a host backend with 0 devices, 0 bytes of device memory,
    /// a largest single allocation of 0 bytes, or a sub-device count other than 0 or 2 to 16
    /// (or one that leaves shares under 2 MiB) (the message names the value);
    /// `Uninitialized` for the cuda backend where it cannot start (no NVIDIA driver, no GPU,
    /// no virtual memory management), with the reason.
    pub fn build(mut self) -> Result<Runtime> {
        if self.backend == BackendKind::Host {
            if self.host.devices == 0 {
                return Err(Error::InvalidArgument(
                    "host device count is 0 (host_devices(0) or HETMEM_HOST_DEVICES=0); \
                     the host backend needs at least 1 device"
                        .into(),
                ));
            }
            if self.host.device_memory == 0 {
                return Err(Error::InvalidArgument(
                    "host device memory is 0 bytes (host_device_memory(0) or \
                     HETMEM_HOST_DEVICE_MEMORY=0); a host device needs memory"
                        .into(),
                ));
            }
            if self.host.max_alloc_size == 0 {
                return Err(Error::InvalidArgument(
                    "largest single allocation is 0 bytes (host_max_alloc_size(0) or \
                     HETMEM_HOST_MAX_ALLOC=0)"
                        .into(),
                ));
            }
        }
        if self.backend == BackendKind::Host {
            let setting = self
                .sub_devices_setting
                .clone()
                .unwrap_or_else(|| format!("host_subdevices({})", self.host.sub_devices));
            crate::semantics::capacity::check_sub_devices(
                self.host.sub_devices,
                self.host.device_memory,
                &setting,
            )?;
        }
        // The largest single allocation cannot exceed the device.
        if self.backend == BackendKind::Host && self.host.max_alloc_size > self.host.device_memory {
            let (asked, used) = (self.host.max_alloc_size, self.host.device_memory);
            self.host.adjustments.push(Adjustment {
                setting: self
                    .max_alloc_setting
                    .clone()
                    .unwrap_or_else(|| format!("host_max_alloc_size({asked})")),
                field: "max_alloc_size",
                asked,
                used,
                reason: format!("more than a device's memory ({used} bytes)"),
            });
            self.host.max_alloc_size = used;
        }
        if self.backend == BackendKind::Host {
            for a in &self.host.adjustments {
                tracing::warn!("configuration adjusted: {a}");
            }
        }
        let (backend, config): (Box<dyn Backend>, BackendConfig) = match self.backend {
            BackendKind::Host => (
                crate::backend::create_host(
                    self.host.devices,
                    self.host.device_memory,
                    self.host.max_alloc_size,
                    self.host.huge_pages,
                ),
                BackendConfig::Host(self.host),
            ),
            BackendKind::Cuda => match crate::backend::create_cuda() {
                Ok(b) => (b, BackendConfig::Cuda),
                Err(why) => {
                    return Err(Error::Uninitialized(format!(
                        "the cuda backend cannot start on this machine: {why}"
                    )))
                }
            },
        };
        let shared = Arc::new(DriverShared::new(
            config,
            backend,
            self.ipc_max_range_pieces,
        ));
        Ok(Runtime {
            driver: Driver::new(shared),
        })
    }
}

/// The runtime: holds the driver of the chosen backend.
#[derive(Debug, Clone)]
pub struct Runtime {
    driver: Driver,
}

impl Runtime {
    /// A builder with the defaults (host backend, 2 devices, a quarter of RAM).
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder {
            backend: BackendKind::Host,
            host: HostConfig::default_for_machine(),
            ipc_max_range_pieces: crate::semantics::ipc::DEFAULT_MAX_RANGE_PIECES,
            max_alloc_setting: None,
            sub_devices_setting: None,
        }
    }

    /// A runtime configured from the environment (`HETMEM_BACKEND`, `HETMEM_HOST_*`).
    ///
    /// Errors: those of [`RuntimeBuilder::from_env`] (`InvalidArgument` for a bad or 0 value)
    /// and [`RuntimeBuilder::build`] (`InvalidArgument` for 0 devices, `Uninitialized` for
    /// cuda).
    pub fn from_env() -> Result<Runtime> {
        RuntimeBuilder::from_env()?.build()
    }

    /// The drivers (`zeDriverGet`): one, for the chosen backend.
    pub fn drivers(&self) -> Vec<Driver> {
        vec![self.driver.clone()]
    }

    /// The driver.
    pub fn driver(&self) -> &Driver {
        &self.driver
    }
}

/// A driver (`ze_driver_handle_t`): one backend and its devices.
#[derive(Debug, Clone)]
pub struct Driver {
    pub(crate) shared: Arc<DriverShared>,
    /// The devices, made once: every `Driver` clone (and every context's driver) shares them, so
    /// a `&Device` stays valid as long as any of them lives (a C ABI hands out its address).
    devices: Arc<[Device]>,
}

impl Driver {
    fn new(shared: Arc<DriverShared>) -> Driver {
        let devices = (0..crate::semantics::driver::devices(&shared).len() as u32)
            .map(|ordinal| Device {
                shared: shared.clone(),
                ordinal,
                sub: None,
            })
            .collect();
        Driver { shared, devices }
    }

    /// The backend this driver runs on.
    pub fn backend_kind(&self) -> BackendKind {
        self.config().kind()
    }

    /// The backend and the settings in force.
    pub fn config(&self) -> &BackendConfig {
        crate::semantics::driver::config(&self.shared)
    }

    /// A description of the backend (platform, versions).
    pub fn describe(&self) -> String {
        crate::semantics::driver::describe(&self.shared)
    }

    /// Which page kinds the backend uses and why (the host backend: 4 KiB or 2 MiB pages for
    /// physical objects and managed memory, from the machine's settings and
    /// [`RuntimeBuilder::host_huge_pages`]); `None` where the driver decides (cuda).
    pub fn page_kinds(&self) -> Option<String> {
        crate::semantics::driver::page_kinds(&self.shared)
    }

    /// Sub-devices of each device (0: none): the host backend's `HETMEM_HOST_SUBDEVICES`; 0
    /// on cuda ([`Driver::sub_devices_note`]).
    pub fn sub_devices_per_device(&self) -> u32 {
        crate::semantics::driver::sub_devices(&self.shared)
    }

    /// Why the devices have no sub-devices, where that is the platform's nature (cuda: a GPU
    /// is one device, and MIG instances are separate devices, not sub-devices); `None` where
    /// they are a setting (the host backend).
    pub fn sub_devices_note(&self) -> Option<String> {
        crate::semantics::driver::sub_devices_note(&self.shared)
    }

    /// The IPC handle types (`ze_ipc_mem_handle_type_flags_t`) this driver's memory can be
    /// created with and exported as: DEFAULT and FABRIC_ACCESSIBLE on every backend, a fabric
    /// handle opening within this machine as a default one does (case 11 of the cases file;
    /// no fabric between machines).
    pub fn ipc_handle_types(&self) -> crate::spec::IpcHandleTypes {
        crate::semantics::ipc::supported_handle_types()
    }

    /// The host-backend settings in force; `None` on another backend.
    pub fn host_config(&self) -> Option<&HostConfig> {
        match self.config() {
            BackendConfig::Host(h) => Some(h),
            _ => None,
        }
    }

    /// The devices (`zeDeviceGet`), in ordinal order.
    pub fn devices(&self) -> Vec<Device> {
        self.devices.to_vec()
    }

    /// Device `ordinal`, if it exists (a clone of the stable object, see
    /// [`Driver::device_ref`]).
    pub fn device(&self, ordinal: u32) -> Option<Device> {
        self.device_ref(ordinal).cloned()
    }

    /// The devices, in ordinal order, as the driver's own stable objects: the same addresses
    /// for the life of the driver, from every clone of it (`zeDeviceGet` handles).
    pub fn device_list(&self) -> &[Device] {
        &self.devices
    }

    /// Device `ordinal` as the driver's own stable object (see [`Driver::device_list`]).
    pub fn device_ref(&self, ordinal: u32) -> Option<&Device> {
        self.devices.get(ordinal as usize)
    }

    /// Creates a context (`zeContextCreate`). Everything made in a context (reservations,
    /// mappings, physical objects, USM allocations and imports) is released when its last
    /// handle is dropped (`zeContextDestroy`); a USM allocation that queued work of another
    /// context still references goes when that work finishes, never under it (its device
    /// capacity comes back then). The context's own queues and lists hold it alive, and their
    /// work has finished before it goes.
    pub fn create_context(&self) -> Result<Context> {
        Ok(Context {
            inner: Arc::new(ContextInner {
                driver: self.shared.clone(),
                handle: self.clone(),
                id: crate::semantics::context::create(),
            }),
        })
    }

    /// Counters of the driver's virtual memory (all contexts).
    pub fn vm_stats(&self) -> VmStats {
        crate::semantics::vmm::calls::stats(&self.shared)
    }

    /// Counters of the driver's USM allocations and imports (all contexts). Device capacity
    /// used by device / shared allocations shows in [`Driver::vm_stats`]' `devices` and
    /// [`Device::used_memory`], shared with physical memory.
    pub fn usm_stats(&self) -> UsmStats {
        crate::semantics::usm::calls::stats(&self.shared)
    }
}

/// A device (`ze_device_handle_t`): a root device of the driver ([`Driver::devices`]) or one
/// of a root's sub-devices ([`Device::sub_devices`]).
#[derive(Debug, Clone)]
pub struct Device {
    pub(crate) shared: Arc<DriverShared>,
    ordinal: u32,
    /// Sub-device `sub` of root device `ordinal`; `None` for the root itself.
    sub: Option<u32>,
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
            && self.ordinal == other.ordinal
            && self.sub == other.sub
    }
}
impl Eq for Device {}

impl Device {
    /// The device's ordinal (0-based id); a sub-device has its root's.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }
    /// The backend's description of the device (of its root, for a sub-device): name,
    /// capacity, largest allocation, granularity. A sub-device's own capacity and largest
    /// allocation are [`Device::capacity`] and [`Device::max_alloc_size`].
    pub fn info(&self) -> &DeviceInfo {
        &crate::semantics::driver::devices(&self.shared)[self.ordinal as usize]
    }
    /// This device as the semantics layer's calls take it (checked there against the
    /// driver of the call).
    pub(crate) fn dref(&self) -> DeviceRef<'_> {
        DeviceRef {
            driver: &self.shared,
            ordinal: self.ordinal,
            sub: self.sub,
        }
    }

    /// The sub-devices of this device (`zeDeviceGetSubDevices`), in index order: none for a
    /// sub-device, and none where the driver has no sub-devices
    /// ([`Driver::sub_devices_per_device`]). Each is charged for the memory made on it, within
    /// its share of this device's capacity, and that memory is this device's too; work on a
    /// sub-device's queues runs on its root's engines.
    pub fn sub_devices(&self) -> Vec<Device> {
        if self.sub.is_some() {
            return Vec::new();
        }
        (0..crate::semantics::driver::sub_devices(&self.shared))
            .map(|s| Device {
                shared: self.shared.clone(),
                ordinal: self.ordinal,
                sub: Some(s),
            })
            .collect()
    }
    /// The root device of a sub-device (`zeDeviceGetRootDevice`); `None` for a root device.
    pub fn root_device(&self) -> Option<Device> {
        self.sub.map(|_| Device {
            shared: self.shared.clone(),
            ordinal: self.ordinal,
            sub: None,
        })
    }
    /// The index of a sub-device among its root's sub-devices (`subdeviceId`); `None` for a
    /// root device.
    pub fn sub_device_id(&self) -> Option<u32> {
        self.sub
    }
    /// Bytes of memory of the device: the backend's capacity for a root device, its share of
    /// the root's for a sub-device (capacity / sub-devices, rounded down to 2 MiB).
    pub fn capacity(&self) -> u64 {
        crate::semantics::driver::capacity(&self.shared, self.ordinal, self.sub)
    }
    /// The largest single allocation in bytes (`maxMemAllocSize`): the backend's, and for a
    /// sub-device at most its [`Device::capacity`].
    pub fn max_alloc_size(&self) -> u64 {
        crate::semantics::driver::max_alloc_size(&self.shared, self.ordinal, self.sub)
    }

    /// Bytes of the capacity in use now (a root's includes what is made on its sub-devices).
    pub fn used_memory(&self) -> u64 {
        crate::semantics::driver::used_memory(&self.shared, self.ordinal, self.sub)
    }
    /// Bytes free on the device now: on a GPU what its driver reports (`cuMemGetInfo`, which
    /// counts other processes' memory too), on the host backend's modelled devices the
    /// capacity less [`Device::used_memory`]; on a sub-device, the smaller of its share's
    /// free bytes and its root's.
    ///
    /// Errors: a driver that cannot answer (`Unknown`, naming the call).
    pub fn free_memory(&self) -> Result<u64> {
        crate::semantics::driver::free_memory(&self.shared, self.ordinal, self.sub)
    }
}

#[derive(Debug)]
struct ContextInner {
    /// The driver's shared state (as `handle.shared`).
    driver: Arc<DriverShared>,
    /// The driver itself, with its stable devices.
    handle: Driver,
    id: u64,
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        crate::semantics::context::teardown(&self.driver, self.id);
    }
}

/// A context (`ze_context_handle_t`): owns reservations, mappings and physical memory.
///
/// Every method is thread-safe. Methods that change the address space are serialised by the
/// driver's lock (the kernel serialises them on its `mmap_lock` anyway); the access-attribute
/// query only takes the read side.
#[derive(Debug, Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

impl Context {
    pub(crate) fn d(&self) -> &DriverShared {
        &self.inner.driver
    }

    /// [`Context::d`], shared (for the semantics calls that keep it: queues, lists).
    pub(crate) fn d_arc(&self) -> &Arc<DriverShared> {
        &self.inner.driver
    }

    /// The driver's shared state (for the semantics modules' `impl Context` blocks).
    pub(crate) fn driver_shared(&self) -> &DriverShared {
        &self.inner.driver
    }

    /// [`Context::driver_shared`], shared.
    pub(crate) fn driver_shared_arc(&self) -> &Arc<DriverShared> {
        &self.inner.driver
    }

    /// This context's id (owner tag of its objects).
    pub(crate) fn id(&self) -> u64 {
        self.inner.id
    }

    /// The driver of this context.
    pub fn driver(&self) -> Driver {
        self.inner.handle.clone()
    }
}
