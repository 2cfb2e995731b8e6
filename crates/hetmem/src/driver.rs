//! The object model: [`Runtime`] → [`Driver`] (one per backend) → [`Device`]s → [`Context`]s,
//! as in Level Zero (`zeInitDrivers`, `zeDriverGet`, `zeDeviceGet`, `zeContextCreate`).
//!
//! The backend is chosen by [`RuntimeBuilder::backend`] in Rust and by `HETMEM_BACKEND`
//! (`host`, the default, or `cuda`) through [`Runtime::from_env`]. Host-backend devices are set
//! by `HETMEM_HOST_DEVICES` (default 2) and `HETMEM_HOST_DEVICE_MEMORY` (bytes per device, with an
//! optional `K`/`M`/`G`/`T` suffix; default a quarter of RAM split between the devices), and the
//! largest single allocation by `HETMEM_HOST_MAX_ALLOC` (default half a device).

use std::sync::Arc;

use parking_lot::RwLock;

use crate::backend::host::{HostBackend, HostConfig};
use crate::backend::{AllocLocation, Backend, DeviceInfo};
use crate::capacity::DeviceMemory;
use crate::error::{Error, Result};
use crate::usm::{AllocDesc, AllocationProperties, MemoryType, UsmState, UsmStats};
use crate::vmm::{
    AccessAttribute, PhysicalMemory, PhysicalMemoryFlags, Reservation, VmState, VmStats,
};

/// Which backend a driver runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// Any Linux machine: virtual devices over mmap / memfd / mprotect.
    Host,
    /// NVIDIA GPUs through the CUDA driver API.
    Cuda,
}

impl BackendKind {
    /// Parses `host` or `cuda` (as in `HETMEM_BACKEND`).
    pub fn parse(s: &str) -> Result<BackendKind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "host" => Ok(BackendKind::Host),
            "cuda" => Ok(BackendKind::Cuda),
            other => Err(Error::InvalidArgument(format!(
                "backend {other:?} is not one of: host, cuda"
            ))),
        }
    }

    /// `host` or `cuda`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Cuda => "cuda",
        }
    }
}

/// Parses a byte count with an optional binary suffix: `1073741824`, `512M`, `4G`, `1T`, `64K`.
pub fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = t[i..].to_ascii_uppercase();
            let m = match unit.trim_end_matches("IB").trim_end_matches('B') {
                "" => 1u64,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "size {s:?} has an unknown unit"
                    )))
                }
            };
            (&t[..i], m)
        }
        None => (t, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| Error::InvalidArgument(format!("size {s:?} is not a number of bytes")))?;
    n.checked_mul(mult)
        .ok_or_else(|| Error::InvalidArgument(format!("size {s:?} overflows 64 bits")))
}

/// Builds a [`Runtime`].
#[derive(Debug, Clone)]
pub struct RuntimeBuilder {
    backend: BackendKind,
    host: HostConfig,
    ipc_max_range_pieces: usize,
}

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
        self
    }
    /// Largest single allocation of each host-backend device in bytes.
    pub fn host_max_alloc_size(mut self, bytes: u64) -> Self {
        self.host.max_alloc_size = bytes;
        self
    }
    /// Most `(physical object, offset, length)` pieces one IPC range handle of this driver
    /// carries (`ze_ipc_phys_mem_handle_range_ext_desc_t`): exporting a range of more pieces is
    /// `UnsupportedSize` naming the limit, and opening a range handle that claims more is
    /// refused the same way. Default [`crate::ipc::DEFAULT_MAX_RANGE_PIECES`] (1 << 20); values
    /// below 1 are taken as 1. See [`Driver::ipc_max_range_pieces`].
    pub fn ipc_max_range_pieces(mut self, n: usize) -> Self {
        self.ipc_max_range_pieces = n.max(1);
        self
    }

    /// The configuration from the environment (see the module docs), on top of the defaults.
    ///
    /// Errors: `InvalidArgument`, naming the variable and its value, for a `HETMEM_BACKEND`
    /// that is not `host` or `cuda`, a `HETMEM_HOST_DEVICES` that is not a count, or a
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
                b = b.host_device_memory(per.max(64 << 20));
            }
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
        }
        Ok(b)
    }

    /// Starts the runtime: makes the backend and its driver.
    ///
    /// Errors: `InvalidArgument` for a host backend with 0 devices, 0 bytes of device memory
    /// or a largest single allocation of 0 bytes (the message names the value);
    /// `Uninitialized` for the cuda backend, which is not part of this build yet.
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
        // The largest single allocation cannot exceed the device.
        self.host.max_alloc_size = self.host.max_alloc_size.min(self.host.device_memory);
        let backend: Box<dyn Backend> = match self.backend {
            BackendKind::Host => Box::new(HostBackend::new(self.host.clone())?),
            BackendKind::Cuda => {
                return Err(Error::Uninitialized(
                    "the cuda backend is not part of this build yet; use HETMEM_BACKEND=host"
                        .into(),
                ))
            }
        };
        let devmem = Arc::new(DeviceMemory::new(backend.devices()));
        let vm = VmState::new(backend.as_ref(), devmem.clone());
        let managed = crate::managed::ManagedState::new(devmem.clone());
        let usm = UsmState::new(backend.as_ref(), devmem);
        let shared = Arc::new(DriverShared {
            kind: self.backend,
            host: self.host,
            backend,
            vm: RwLock::new(vm),
            usm: RwLock::new(usm),
            inflight: crate::queue::InFlight::default(),
            managed,
            ipc_max_range_pieces: self.ipc_max_range_pieces,
        });
        Ok(Runtime {
            driver: Driver { shared },
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
            ipc_max_range_pieces: crate::ipc::DEFAULT_MAX_RANGE_PIECES,
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

#[derive(Debug)]
pub(crate) struct DriverShared {
    pub(crate) kind: BackendKind,
    pub(crate) host: HostConfig,
    pub(crate) backend: Box<dyn Backend>,
    pub(crate) vm: RwLock<VmState>,
    /// USM allocations and imports. Lock order: `usm` before `vm` when both are held (an
    /// import checks that it overlaps no reservation); never take `usm` while holding `vm`.
    pub(crate) usm: RwLock<UsmState>,
    /// In-flight references of queued device work to USM allocations ([`crate::queue`]).
    pub(crate) inflight: crate::queue::InFlight,
    /// ACL managed memory ([`crate::managed`]); its own lock, never held with `usm` or `vm`.
    pub(crate) managed: crate::managed::ManagedState,
    /// [`RuntimeBuilder::ipc_max_range_pieces`].
    pub(crate) ipc_max_range_pieces: usize,
}

/// A driver (`ze_driver_handle_t`): one backend and its devices.
#[derive(Debug, Clone)]
pub struct Driver {
    pub(crate) shared: Arc<DriverShared>,
}

impl Driver {
    /// The backend this driver runs on.
    pub fn backend_kind(&self) -> BackendKind {
        self.shared.kind
    }

    /// A description of the backend (platform, versions).
    pub fn describe(&self) -> String {
        self.shared.backend.describe()
    }

    /// The host-backend configuration in force (meaningful on the host backend).
    pub fn host_config(&self) -> &HostConfig {
        &self.shared.host
    }

    /// The devices (`zeDeviceGet`), in ordinal order.
    pub fn devices(&self) -> Vec<Device> {
        (0..self.shared.backend.devices().len() as u32)
            .map(|ordinal| Device {
                shared: self.shared.clone(),
                ordinal,
            })
            .collect()
    }

    /// Device `ordinal`, if it exists.
    pub fn device(&self, ordinal: u32) -> Option<Device> {
        self.devices().into_iter().nth(ordinal as usize)
    }

    /// Creates a context (`zeContextCreate`). Everything made in a context (reservations,
    /// mappings, physical objects, USM allocations and imports) is released when its last
    /// handle is dropped (`zeContextDestroy`); a USM allocation that queued work of another
    /// context still references goes when that work finishes, never under it (its device
    /// capacity comes back then). The context's own queues and lists hold it alive, and their
    /// work has finished before it goes.
    pub fn create_context(&self) -> Result<Context> {
        let id = crate::capacity::fresh_id();
        Ok(Context {
            inner: Arc::new(ContextInner {
                driver: self.shared.clone(),
                id,
            }),
        })
    }

    /// Counters of the driver's virtual memory (all contexts).
    pub fn vm_stats(&self) -> VmStats {
        self.shared.vm.read().stats()
    }

    /// Counters of the driver's USM allocations and imports (all contexts). Device capacity
    /// used by device / shared allocations shows in [`Driver::vm_stats`]' `devices` and
    /// [`Device::used_memory`], shared with physical memory.
    pub fn usm_stats(&self) -> UsmStats {
        self.shared.usm.read().stats()
    }
}

/// A device (`ze_device_handle_t`).
#[derive(Debug, Clone)]
pub struct Device {
    pub(crate) shared: Arc<DriverShared>,
    ordinal: u32,
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared) && self.ordinal == other.ordinal
    }
}
impl Eq for Device {}

impl Device {
    /// The device's ordinal (0-based id).
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }
    /// The backend's description of the device: name, capacity, largest allocation, granularity.
    pub fn info(&self) -> &DeviceInfo {
        &self.shared.backend.devices()[self.ordinal as usize]
    }
    /// Bytes of the capacity in use now.
    pub fn used_memory(&self) -> u64 {
        self.shared.vm.read().stats().devices[self.ordinal as usize].used
    }
}

#[derive(Debug)]
struct ContextInner {
    driver: Arc<DriverShared>,
    id: u64,
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        let d = &self.driver;
        d.managed.release_context(self.id);
        // USM memory that queued work (of another context's queues) still references is
        // released when that work finishes, as DEFER_FREE does; the rest goes now. Taken out
        // under the write lock, so no new submission can reference it from here on.
        let taken = d.usm.write().take_context(self.id);
        for p in taken {
            if let Some(p) = d.inflight.defer_or_return(p) {
                p.finish(d.backend.as_ref());
            }
        }
        // Waits (no lock held) until no queued work uses the context's reservations or views.
        let id = self.id;
        crate::queue::vm_write_unreferenced(d, |vm| vm.reservations_of(id))
            .release_context(d.backend.as_ref(), self.id);
        crate::ipc::release_context(d, self.id);
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
    fn d(&self) -> &DriverShared {
        &self.inner.driver
    }

    /// The driver's shared state (for the semantics modules' `impl Context` blocks).
    pub(crate) fn driver_shared(&self) -> &DriverShared {
        &self.inner.driver
    }

    /// This context's id (owner tag of its objects).
    pub(crate) fn id(&self) -> u64 {
        self.inner.id
    }

    /// The driver of this context.
    pub fn driver(&self) -> Driver {
        Driver {
            shared: self.inner.driver.clone(),
        }
    }

    /// Reserves `size` bytes of virtual address space (`zeVirtualMemReserve`).
    ///
    /// `start_hint`: where to try first; used when page-aligned and free, otherwise another
    /// address is chosen (an existing mapping of the process is never replaced). The result is
    /// aligned to [`Context::query_page_size`]`(size)`, and its pages are inaccessible (NONE).
    ///
    /// Errors: `UnsupportedSize` if `size` is 0 or not a multiple of the page size for `size`;
    /// `OutOfHostMemory` if the address space (or `vm.max_map_count`) is exhausted.
    pub fn reserve(&self, start_hint: Option<usize>, size: usize) -> Result<Reservation> {
        let d = self.d();
        d.vm.write().reserve(
            d.backend.as_ref(),
            self.inner.id,
            start_hint.unwrap_or(0),
            size,
        )
    }

    /// Frees a reservation (`zeVirtualMemFree`): unmaps whatever is mapped in it (the physical
    /// objects survive) and releases the range. Blocks until no queued or running command
    /// references the reservation (see "Virtual memory and IPC views in flight" in
    /// [`crate::queue`]).
    ///
    /// Errors: `InvalidNullPointer` for null; `UnsupportedSize` for 0; `InvalidArgument` unless
    /// `(ptr, size)` is exactly the base and size of a live reservation of this context.
    pub fn free(&self, ptr: usize, size: usize) -> Result<()> {
        let d = self.d();
        let mut vm =
            crate::queue::vm_write_unreferenced(d, |vm| crate::queue::reservation_at(vm, ptr));
        vm.free(d.backend.as_ref(), self.inner.id, ptr, size)
    }

    /// Frees `r` (see [`Context::free`]).
    pub fn free_reservation(&self, r: Reservation) -> Result<()> {
        self.free(r.base, r.size)
    }

    /// The page size for aligning reservations and physical memory of `size` bytes on `device`
    /// (`zeVirtualMemQueryPageSize`): 64 KiB below 2 MiB, 2 MiB from 2 MiB up, never below the
    /// device's granularity (a multiple of the OS page size).
    ///
    /// Errors: `UnsupportedSize` if `size` is 0; `InvalidNullHandle` for a device of another
    /// driver.
    pub fn query_page_size(&self, device: &Device, size: usize) -> Result<usize> {
        self.check_device(device)?;
        self.d().vm.read().query_page_size(device.ordinal, size)
    }

    pub(crate) fn check_device(&self, device: &Device) -> Result<()> {
        if !Arc::ptr_eq(&device.shared, &self.inner.driver) {
            return Err(Error::InvalidNullHandle(format!(
                "device {} belongs to another driver",
                device.ordinal
            )));
        }
        Ok(())
    }

    /// Creates a physical memory object of `size` bytes (`zePhysicalMemCreate`) on `device`
    /// (`AllocateOnDevice`, counted against its capacity) or in host memory (`AllocateOnHost`,
    /// device optional).
    ///
    /// Errors: `UnsupportedSize` if `size` is 0 or not a multiple of the page size for `size`;
    /// `InvalidNullHandle` for device memory without a device; `OutOfDeviceMemory` beyond the
    /// device's remaining capacity; `OutOfHostMemory` if the OS refuses (open-file limit).
    pub fn create_physical_memory(
        &self,
        device: Option<&Device>,
        flags: PhysicalMemoryFlags,
        size: usize,
    ) -> Result<PhysicalMemory> {
        if let Some(dev) = device {
            self.check_device(dev)?;
        }
        let d = self.d();
        d.vm.write().create_physical(
            d.backend.as_ref(),
            self.inner.id,
            device.map(|x| x.ordinal),
            flags,
            size,
        )
    }

    /// Destroys a physical memory object (`zePhysicalMemDestroy`). Its device capacity comes
    /// back at once, or, while an IPC export of it is live (or a view of it open in this
    /// process), when the last of those is put or closed.
    ///
    /// Errors: `HandleObjectInUse` while any page of it is mapped (nothing changes);
    /// `InvalidArgument` for a handle that is not live in this context.
    pub fn destroy_physical_memory(&self, phys: PhysicalMemory) -> Result<()> {
        let d = self.d();
        d.vm.write()
            .destroy_physical(d.backend.as_ref(), self.inner.id, phys.id)
    }

    /// Maps `[offset, offset+size)` of `phys` at `ptr` with `access` (`zeVirtualMemMap`).
    /// One physical object may be mapped at several addresses at once; aliases share bytes.
    ///
    /// Errors: `InvalidNullPointer` for null `ptr`; `UnsupportedSize` if `size` is 0 or not a
    /// multiple of the page size for `size`; `UnsupportedAlignment` if `ptr` or `offset` is not
    /// aligned to it; `InvalidArgument` if the range is not inside one reservation of this
    /// context, overlaps a mapping, or `offset+size` is past the end of `phys`.
    pub fn map(
        &self,
        ptr: usize,
        size: usize,
        phys: PhysicalMemory,
        offset: usize,
        access: AccessAttribute,
    ) -> Result<()> {
        let d = self.d();
        d.vm.write().map(
            d.backend.as_ref(),
            self.inner.id,
            ptr,
            size,
            phys.id,
            offset,
            access,
        )
    }

    /// Unmaps `[ptr, ptr+size)` (`zeVirtualMemUnmap`): any base-page-aligned sub-range of
    /// mapped pages. The pages revert to NONE and stay reserved. Blocks until no queued or
    /// running command references the reservation (see [`crate::queue`]).
    ///
    /// Errors: `UnsupportedAlignment` / `UnsupportedSize` if `ptr` / `size` is not a multiple of
    /// the base page (`query_page_size(1)`); `InvalidArgument` if the range is outside one
    /// reservation or any page in it is not mapped.
    pub fn unmap(&self, ptr: usize, size: usize) -> Result<()> {
        let d = self.d();
        let mut vm =
            crate::queue::vm_write_unreferenced(d, |vm| crate::queue::reservation_at(vm, ptr));
        vm.unmap(d.backend.as_ref(), self.inner.id, ptr, size)
    }

    /// Sets the access attribute of the mapped pages of `[ptr, ptr+size)`
    /// (`zeVirtualMemSetAccessAttribute`). Per page: a sub-range of a mapping can differ from the
    /// rest. READONLY faults on write and NONE on any access. Unmapped pages of the range have no
    /// memory and stay NONE. Blocks, as [`Context::unmap`] does, until no queued or running
    /// command references the reservation.
    ///
    /// Errors: as [`Context::unmap`] for alignment and range.
    pub fn set_access_attribute(
        &self,
        ptr: usize,
        size: usize,
        access: AccessAttribute,
    ) -> Result<()> {
        let d = self.d();
        crate::queue::vm_write_unreferenced(d, |vm| crate::queue::reservation_at(vm, ptr))
            .set_access(d.backend.as_ref(), self.inner.id, ptr, size, access)
    }

    /// The access attribute of the page at `ptr`, and the length in bytes from `ptr` (capped at
    /// `size`) of pages that share it (`zeVirtualMemGetAccessAttribute`). Unmapped pages read
    /// NONE.
    ///
    /// Errors: as [`Context::unmap`] for alignment and range.
    pub fn get_access_attribute(
        &self,
        ptr: usize,
        size: usize,
    ) -> Result<(AccessAttribute, usize)> {
        self.d().vm.read().get_access(self.inner.id, ptr, size)
    }

    /// Allocates device memory on `device` (`zeMemAllocDevice`). The address is aligned to
    /// `max(desc.alignment, page size)`, the page size being [`Context::query_page_size`] for
    /// the size; the rounded-up size is charged to the device's capacity (shared with physical
    /// memory). On the host backend device memory is host-accessible (a sealed memfd).
    ///
    /// Errors: `UnsupportedSize` for size 0, or over the device's `max_alloc_size` without
    /// `relaxed_max_size`, or over its whole capacity; `UnsupportedAlignment` unless the
    /// alignment is 0 or a power of two; `OutOfDeviceMemory` beyond the remaining capacity;
    /// `InvalidNullHandle` for a device of another driver; `OutOfHostMemory` if the OS refuses.
    pub fn alloc_device(&self, device: &Device, desc: &AllocDesc) -> Result<usize> {
        self.check_device(device)?;
        let d = self.d();
        d.usm.write().alloc(
            d.backend.as_ref(),
            self.inner.id,
            AllocLocation::Device(device.ordinal),
            desc,
        )
    }

    /// Allocates host memory reachable by every device (`zeMemAllocHost`). Alignment and page
    /// size as [`Context::alloc_device`]; no device capacity is charged.
    ///
    /// Errors: `UnsupportedSize` for size 0 or over device 0's `max_alloc_size` without
    /// `relaxed_max_size`; `UnsupportedAlignment`; `OutOfHostMemory` if the OS refuses.
    pub fn alloc_host(&self, desc: &AllocDesc) -> Result<usize> {
        let d = self.d();
        d.usm
            .write()
            .alloc(d.backend.as_ref(), self.inner.id, AllocLocation::Host, desc)
    }

    /// Allocates shared memory, reachable from the host and every device (`zeMemAllocShared`),
    /// associated with and charged to `device` if given (no device: nothing charged, limits of
    /// device 0).
    ///
    /// Errors: as [`Context::alloc_device`].
    pub fn alloc_shared(&self, device: Option<&Device>, desc: &AllocDesc) -> Result<usize> {
        if let Some(dev) = device {
            self.check_device(dev)?;
        }
        let d = self.d();
        d.usm.write().alloc(
            d.backend.as_ref(),
            self.inner.id,
            AllocLocation::Shared(device.map(|x| x.ordinal)),
            desc,
        )
    }

    /// Imports system memory `[ptr, ptr+size)` (`zeMemAllocHost` with
    /// `ze_external_memmap_sysmem_ext_desc_t`; `read_only` is `ZE_HOST_MEM_ALLOC_FLAG_MEM_READ_ONLY`).
    /// Returns `ptr` itself. Heap, stack and static memory all work. Read-only memory needs
    /// `read_only`, and an import made with it is read-only for devices
    /// ([`AllocationProperties::read_only`]). [`Context::free_memory`] releases the record only;
    /// the memory and its contents stay.
    ///
    /// Errors: `UnsupportedSize` for size 0; `InvalidArgument` if `ptr` or `size` is not a
    /// multiple of the host (OS) page, the range is not wholly mapped readable memory, it is
    /// read-only and `read_only` is not set, or it overlaps a live import, allocation,
    /// virtual-memory reservation, IPC view opened in this process ([`Context::open_ipc_handle`])
    /// or managed allocation of this driver.
    pub fn import_system_memory(&self, ptr: usize, size: usize, read_only: bool) -> Result<usize> {
        let d = self.d();
        // The managed lock is never held with usm or vm: ask first.
        let managed = ptr
            .checked_add(size)
            .and_then(|end| d.managed.overlapping(ptr, end));
        let mut usm = d.usm.write();
        // Lock order: usm, then vm, then the IPC view table.
        usm.import(
            d.backend.as_ref(),
            self.inner.id,
            ptr,
            size,
            read_only,
            |s, e| {
                let range = |(a, b): (usize, usize)| {
                    format!("[{}, {})", crate::error::Addr(a), crate::error::Addr(b))
                };
                if let Some(m) = managed {
                    Some(format!("the managed allocation {}", range(m)))
                } else if d.vm.read().reservation_overlaps(s, e) {
                    Some("a virtual-memory reservation".into())
                } else {
                    crate::ipc::view_overlapping(s, e)
                        .map(|v| format!("the opened IPC view {}", range(v)))
                }
            },
        )
    }

    /// Frees an allocation or releases an import (`zeMemFree`, free now). `ptr` must be the
    /// base of a live allocation or import of this context. Device capacity comes back at once
    /// (while an IPC export of it is live, or a view of it open in this process: when the last
    /// of those is put or closed);
    /// if queued work still references the memory, the memory itself goes when that work
    /// finishes ([`crate::queue::FreePolicy::Immediate`]).
    ///
    /// Errors: `InvalidNullPointer` for null; `InvalidArgument` for anything else that is not
    /// such a base (interior or unknown pointers, other contexts' allocations).
    pub fn free_memory(&self, ptr: usize) -> Result<()> {
        // Free now, but never under queued work (see `FreePolicy::Immediate`).
        self.free_memory_ext(ptr, crate::queue::FreePolicy::Immediate)
    }

    /// Properties of the memory at `ptr` (`zeMemGetAllocProperties`), for any pointer:
    /// inside a USM allocation or import, its type, id, page size, device and hint; inside a
    /// mapped page of a virtual-memory reservation, `Device` with the physical object's device
    /// (or `Host` for host physical memory), the physical object's id and page size (the
    /// reference driver of this era answers UNKNOWN there; the issue asks for the object's
    /// type); otherwise `Unknown` with id 0, page size 0, no device (the header's answer for
    /// unknown memory).
    ///
    /// Errors: `InvalidNullPointer` for null.
    pub fn get_allocation_properties(&self, ptr: usize) -> Result<AllocationProperties> {
        if ptr == 0 {
            return Err(Error::InvalidNullPointer("pointer is null".into()));
        }
        let d = self.d();
        if let Some(p) = d.usm.read().properties(ptr) {
            return Ok(p);
        }
        if let Some(p) = crate::ipc::opened_properties(ptr) {
            return Ok(p);
        }
        let vm = d.vm.read().pointer_info(ptr);
        Ok(match vm.and_then(|v| v.mapped) {
            Some((id, loc, page_size)) => {
                let (memory_type, device) = match loc {
                    crate::backend::PhysicalLocation::Device(dev) => {
                        (MemoryType::Device, Some(dev))
                    }
                    crate::backend::PhysicalLocation::Host => (MemoryType::Host, None),
                };
                AllocationProperties {
                    memory_type,
                    id,
                    page_size,
                    device,
                    ..AllocationProperties::default()
                }
            }
            None => AllocationProperties::default(),
        })
    }

    /// Base and size in bytes of the allocation, import or virtual-memory reservation that
    /// contains `ptr` (`zeMemGetAddressRange`); the size is the size asked at allocation.
    ///
    /// Errors: `InvalidNullPointer` for null; `Unknown` (`ZE_RESULT_ERROR_UNKNOWN`) for a
    /// pointer in none of them, as the reference driver answers.
    pub fn get_address_range(&self, ptr: usize) -> Result<(usize, usize)> {
        if ptr == 0 {
            return Err(Error::InvalidNullPointer("pointer is null".into()));
        }
        let d = self.d();
        if let Some(r) = d.usm.read().address_range(ptr) {
            return Ok(r);
        }
        if let Some(r) = crate::ipc::opened_range(ptr) {
            return Ok(r);
        }
        d.vm.read()
            .pointer_info(ptr)
            .map(|v| v.reservation)
            .ok_or_else(|| {
                Error::Unknown(format!(
                    "{} is not inside an allocation, import or reservation",
                    crate::error::Addr(ptr)
                ))
            })
    }
}
