//! The cuda backend: NVIDIA GPUs through the CUDA driver API (`cudarc`, loaded at run time).
//!
//! | operation | driver calls |
//! |---|---|
//! | reserve / release | `cuMemAddressReserve` / `cuMemAddressFree` |
//! | create physical (device) | one `cuMemCreate` per granule (2 MiB on an H200), location `CU_MEM_LOCATION_TYPE_DEVICE`, POSIX-fd shareable |
//! | create physical (host) | the same with `CU_MEM_LOCATION_TYPE_HOST_NUMA` (the calling thread's node) |
//! | destroy physical | `cuMemRelease` of each granule |
//! | map | `cuMemMap` of each granule, then one `cuMemSetAccess` over the range for every device that can reach it (and the host, for host memory) |
//! | unmap | `cuMemUnmap` of each granule of the range |
//! | protect | one `cuMemSetAccess` over the range (NONE is `CU_MEM_ACCESS_FLAGS_PROT_NONE`) |
//! | alloc device | `cuMemCreate` + `cuMemAddressReserve` + `cuMemMap` + `cuMemSetAccess` (exportable, unlike `cuMemAlloc`) |
//! | alloc host / shared | `cuMemHostAlloc(PORTABLE \| DEVICEMAP)` / `cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL)` |
//! | register host | `cuMemHostRegister(PORTABLE \| DEVICEMAP [\| READ_ONLY])` / `cuMemHostUnregister` |
//! | engines | a stream each ([`engine`]) |
//!
//! # Why one allocation per granule
//! `cuMemMap` maps an allocation only whole, at offset 0 (`CUDA_ERROR_NOT_SUPPORTED`
//! otherwise), and `cuMemUnmap` / `cuMemSetAccess` take only whole mappings
//! (`CUDA_ERROR_INVALID_VALUE` for a sub-range: both measured on an H200, driver 580). Level Zero
//! maps any page-aligned piece of a physical object at any offset, unmaps any page-aligned
//! piece of a mapping and sets access per page. So a physical object is made of one
//! allocation per granule (the page size this backend reports, from
//! `cuMemGetAllocationGranularity`), and every granule is its own mapping: then every
//! page-aligned range is a run of whole mappings, and access is one `cuMemSetAccess` per
//! contiguous run.
//!
//! # What is not here yet
//! IPC export and import (`cuMemExportToShareableHandle` gives an fd of `/dev/nvidiactl`, not a
//! memfd: the handle's identity and size checks need their own design) answer `Unsupported`
//! with a message saying so. Managed memory: [`managed`].

mod driver;
mod engine;
mod managed;

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::sys;
use parking_lot::Mutex;

use super::{
    AllocLocation, Backend, DeviceInfo, HalError, PhysicalLocation, Protection, RawAllocation,
    RawPhysical, Result,
};

/// Where the memory of a physical object lives: a device, or host memory on a NUMA node (the
/// node it was made on, which its host access descriptor must name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Home {
    Device(u32),
    HostNuma(u32),
}

/// A physical object: its granules, in order (each `granule` bytes, one `cuMemCreate`).
#[derive(Debug)]
struct Physical {
    granules: Vec<driver::CUmemGenericAllocationHandle>,
    home: Home,
}

/// A USM allocation and how to free it.
#[derive(Debug)]
enum Alloc {
    /// Device memory: one allocation of `size` bytes mapped at `addr` in a reservation of its
    /// own.
    Device {
        handle: driver::CUmemGenericAllocationHandle,
        addr: usize,
        size: usize,
    },
    /// Pinned host memory from `cuMemHostAlloc`, starting at `base`.
    Host { base: usize },
    /// Managed memory from `cuMemAllocManaged`, starting at `base`.
    Managed { base: usize },
}

/// The primary contexts this backend retained (`cuDevicePrimaryCtxRetain`), one per device,
/// shared (`Arc`) by the backend, its engines and its managed memory: the last of them to go
/// releases them (`cuDevicePrimaryCtxRelease`), so no thread ever binds a released context.
pub(crate) struct Contexts {
    ctx: Vec<driver::CUcontext>,
    devices: Vec<driver::CUdevice>,
}
// SAFETY: primary contexts are process-wide objects; the driver accepts them from any thread.
unsafe impl Send for Contexts {}
// SAFETY: as above; they are only read.
unsafe impl Sync for Contexts {}

impl Contexts {
    /// Device `d`'s primary context.
    pub(crate) fn get(&self, d: u32) -> driver::CUcontext {
        self.ctx[d as usize]
    }
}

impl Drop for Contexts {
    fn drop(&mut self) {
        for d in &self.devices {
            // SAFETY: retained once by `CudaBackend::new`, released once here, after every
            // user of the contexts (they hold this `Arc`) is gone.
            unsafe {
                let _ = sys::cuDevicePrimaryCtxRelease_v2(*d);
            }
        }
    }
}

impl std::fmt::Debug for Contexts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} primary contexts", self.ctx.len())
    }
}

/// The cuda backend.
#[derive(Debug)]
pub(crate) struct CudaBackend {
    devices: Vec<DeviceInfo>,
    handles: Vec<driver::CUdevice>,
    contexts: Arc<Contexts>,
    /// `reach[d]`: the devices that can reach memory of device `d` (itself and its peers).
    reach: Vec<Vec<u32>>,
    granule: usize,
    describe: String,
    next_id: AtomicU64,
    physical: Mutex<HashMap<u64, Physical>>,
    /// Every mapped granule: address -> (handle, where its memory lives).
    mapped: Mutex<BTreeMap<usize, (driver::CUmemGenericAllocationHandle, Home)>>,
    allocs: Mutex<HashMap<u64, Alloc>>,
}

impl CudaBackend {
    /// Loads and initialises the driver and takes every device's primary context. `Err` says
    /// why the cuda backend cannot run on this machine (see [`driver::load`]).
    pub(crate) fn new() -> std::result::Result<CudaBackend, String> {
        let (version, count) = driver::load()?;
        let e = |e: HalError| e.to_string();
        let mut devices = Vec::new();
        let mut handles = Vec::new();
        let mut contexts = Contexts {
            ctx: Vec::new(),
            devices: Vec::new(),
        };
        let mut granule = 0usize;
        for i in 0..count {
            let d = driver::device(i).map_err(e)?;
            let vmm = driver::attribute(
                d,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            );
            if vmm == 0 {
                return Err(format!(
                    "CUDA device {i} ({}) has no virtual memory management \
                     (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)",
                    driver::device_name(d)
                ));
            }
            let g = driver::granularity(driver::device_location(i as u32)).map_err(e)?;
            granule = granule.max(g);
            devices.push(DeviceInfo {
                name: driver::device_name(d),
                capacity: driver::total_mem(d).map_err(e)?,
                max_alloc_size: 0,
                min_page_size: g,
            });
            handles.push(d);
            contexts.ctx.push(driver::primary_context(d).map_err(e)?);
            contexts.devices.push(d);
        }
        // One page size for every device and the host, so that any granule maps anywhere.
        for d in &mut devices {
            d.min_page_size = granule;
            d.max_alloc_size = d.capacity;
        }
        let reach: Vec<Vec<u32>> = (0..handles.len())
            .map(|d| {
                (0..handles.len())
                    .filter(|&p| p == d || driver::can_access_peer(handles[p], handles[d]))
                    .map(|p| p as u32)
                    .collect()
            })
            .collect();
        let describe = format!(
            "CUDA driver API {}.{} ({} device{}: {}); page size (cuMemGetAllocationGranularity, \
             minimum) {} KiB",
            version / 1000,
            version % 1000 / 10,
            devices.len(),
            if devices.len() == 1 { "" } else { "s" },
            devices
                .iter()
                .map(|d| format!("{} {} GiB", d.name, d.capacity >> 30))
                .collect::<Vec<_>>()
                .join(", "),
            granule >> 10
        );
        let b = CudaBackend {
            devices,
            handles,
            contexts: Arc::new(contexts),
            reach,
            granule,
            describe,
            next_id: AtomicU64::new(1),
            physical: Mutex::new(HashMap::new()),
            mapped: Mutex::new(BTreeMap::new()),
            allocs: Mutex::new(HashMap::new()),
        };
        b.bind(0).map_err(e)?;
        Ok(b)
    }

    /// Makes device `d`'s primary context current on the calling thread.
    fn bind(&self, d: u32) -> Result<()> {
        driver::set_current(self.contexts.get(d))
    }

    /// The access descriptors for memory at `home` with protection `prot`: every device that
    /// can reach it, and the host (its NUMA node) for host memory.
    fn access(&self, home: Home, prot: Protection) -> Vec<sys::CUmemAccessDesc> {
        let flags = match prot {
            Protection::None => sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE,
            Protection::ReadOnly => sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ,
            Protection::ReadWrite => sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let devices: Vec<u32> = match home {
            Home::Device(d) => self.reach[d as usize].clone(),
            Home::HostNuma(_) => (0..self.devices.len() as u32).collect(),
        };
        let mut v: Vec<sys::CUmemAccessDesc> = devices
            .into_iter()
            .map(|d| sys::CUmemAccessDesc {
                location: driver::device_location(d),
                flags,
            })
            .collect();
        if let Home::HostNuma(node) = home {
            v.push(sys::CUmemAccessDesc {
                location: driver::host_numa_location(node),
                flags,
            });
        }
        v
    }

    fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Sets `prot` over the mapped granules of `[addr, addr+size)`: one `cuMemSetAccess` per
    /// run of granules of one location.
    ///
    /// # Safety
    /// Every granule of the range is mapped.
    unsafe fn set_access_runs(&self, addr: usize, size: usize, prot: Protection) -> Result<()> {
        let runs: Vec<(usize, usize, Home)> = {
            let m = self.mapped.lock();
            let mut runs: Vec<(usize, usize, Home)> = Vec::new();
            for (&a, &(_, loc)) in m.range(addr..addr + size) {
                match runs.last_mut() {
                    Some((_, end, l)) if *end == a && *l == loc => *end += self.granule,
                    _ => runs.push((a, a + self.granule, loc)),
                }
            }
            runs
        };
        for (s, e, loc) in runs {
            // SAFETY: a run of whole mapped granules.
            unsafe { driver::set_access(s, e - s, &self.access(loc, prot))? };
        }
        Ok(())
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    unsafe fn reserve(&self, hint: Option<usize>, size: usize, align: usize) -> Result<usize> {
        self.bind(0)?;
        driver::address_reserve(size, align.max(self.granule), hint.unwrap_or(0))
    }

    unsafe fn release(&self, addr: usize, size: usize) -> Result<()> {
        self.bind(0)?;
        // SAFETY: forwarded contract.
        unsafe { driver::address_free(addr, size) }
    }

    fn create_physical(&self, location: PhysicalLocation, size: usize) -> Result<RawPhysical> {
        self.bind(0)?;
        let home = match location {
            PhysicalLocation::Device(d) => Home::Device(d),
            PhysicalLocation::Host => Home::HostNuma(super::platform::current_numa_node()),
        };
        let loc = match home {
            Home::Device(d) => driver::device_location(d),
            Home::HostNuma(n) => driver::host_numa_location(n),
        };
        let n = size.div_ceil(self.granule);
        let mut granules = Vec::with_capacity(n);
        for _ in 0..n {
            match driver::mem_create(self.granule, loc) {
                Ok(h) => granules.push(h),
                Err(e) => {
                    for h in granules {
                        // SAFETY: made above, never mapped.
                        unsafe { driver::mem_release(h) };
                    }
                    return Err(match (e, location) {
                        (HalError::Unsupported(m), PhysicalLocation::Host) => {
                            HalError::Unsupported(format!(
                                "{m}: this CUDA driver cannot make host physical memory \
                                 (CU_MEM_LOCATION_TYPE_HOST_NUMA)"
                            ))
                        }
                        (e, _) => e,
                    });
                }
            }
        }
        let id = self.id();
        self.physical.lock().insert(id, Physical { granules, home });
        Ok(RawPhysical(id))
    }

    unsafe fn destroy_physical(&self, raw: RawPhysical) {
        if let Some(p) = self.physical.lock().remove(&raw.0) {
            for h in p.granules {
                // SAFETY: the caller gives the object up; mappings keep their memory alive.
                unsafe { driver::mem_release(h) };
            }
        }
    }

    unsafe fn map(
        &self,
        addr: usize,
        size: usize,
        raw: RawPhysical,
        phys_offset: usize,
        prot: Protection,
    ) -> Result<()> {
        self.bind(0)?;
        let g = self.granule;
        let (handles, loc) = {
            let p = self.physical.lock();
            let p = p.get(&raw.0).ok_or_else(|| {
                HalError::Unexpected(format!("physical object {} is not known", raw.0))
            })?;
            let first = phys_offset / g;
            let part = p.granules.get(first..first + size / g).ok_or_else(|| {
                HalError::Unexpected(format!(
                    "[{phys_offset:#x}, +{size:#x}) is outside physical object {} ({} granules)",
                    raw.0,
                    p.granules.len()
                ))
            })?;
            (part.to_vec(), p.home)
        };
        let mut done = 0;
        let mut result = Ok(());
        for (i, &h) in handles.iter().enumerate() {
            // SAFETY: the range is reserved and unmapped (caller), and `h` is one granule.
            if let Err(e) = unsafe { driver::mem_map(addr + i * g, g, h) } {
                result = Err(e);
                break;
            }
            done += 1;
        }
        if result.is_ok() {
            // SAFETY: the whole range is mapped granules just made.
            result = unsafe { driver::set_access(addr, size, &self.access(loc, prot)) };
        }
        if let Err(e) = result {
            for i in 0..done {
                // SAFETY: mapped above, used by nobody yet.
                unsafe { driver::mem_unmap(addr + i * g, g).ok() };
            }
            return Err(e);
        }
        let mut m = self.mapped.lock();
        for (i, &h) in handles.iter().enumerate() {
            m.insert(addr + i * g, (h, loc));
        }
        Ok(())
    }

    unsafe fn unmap(&self, addr: usize, size: usize) -> Result<()> {
        self.bind(0)?;
        let g = self.granule;
        let mut m = self.mapped.lock();
        let keys: Vec<usize> = m.range(addr..addr + size).map(|(&a, _)| a).collect();
        for a in keys {
            // SAFETY: a whole mapped granule inside the caller's range.
            unsafe { driver::mem_unmap(a, g)? };
            m.remove(&a);
        }
        Ok(())
    }

    fn alloc(
        &self,
        location: AllocLocation,
        size: usize,
        align: usize,
    ) -> Result<(usize, RawAllocation)> {
        let (addr, alloc) = match location {
            AllocLocation::Device(d) => {
                self.bind(d)?;
                let size = size.div_ceil(self.granule) * self.granule;
                let handle = driver::mem_create(size, driver::device_location(d))?;
                let addr = match driver::address_reserve(size, align.max(self.granule), 0) {
                    Ok(a) => a,
                    Err(e) => {
                        // SAFETY: made above, never mapped.
                        unsafe { driver::mem_release(handle) };
                        return Err(e);
                    }
                };
                // SAFETY: a fresh reservation of the allocation's size.
                let mapped = unsafe { driver::mem_map(addr, size, handle) }.and_then(|()| {
                    // SAFETY: one whole mapping.
                    unsafe {
                        driver::set_access(
                            addr,
                            size,
                            &self.access(Home::Device(d), Protection::ReadWrite),
                        )
                    }
                });
                if let Err(e) = mapped {
                    // SAFETY: undoing the steps above, in reverse.
                    unsafe {
                        driver::mem_unmap(addr, size).ok();
                        driver::address_free(addr, size).ok();
                        driver::mem_release(handle);
                    }
                    return Err(e);
                }
                (addr, Alloc::Device { handle, addr, size })
            }
            AllocLocation::Host => {
                self.bind(0)?;
                let base = driver::host_alloc(size + align.saturating_sub(4096))?;
                (base.next_multiple_of(align), Alloc::Host { base })
            }
            AllocLocation::Shared(d) => {
                self.bind(d.unwrap_or(0))?;
                let extra = if align > self.granule { align } else { 0 };
                let base = driver::alloc_managed(size + extra)?;
                (base.next_multiple_of(align), Alloc::Managed { base })
            }
        };
        let id = self.id();
        self.allocs.lock().insert(id, alloc);
        Ok((addr, RawAllocation(id)))
    }

    unsafe fn free_alloc(&self, _addr: usize, _size: usize, raw: RawAllocation) {
        let Some(a) = self.allocs.lock().remove(&raw.0) else {
            return;
        };
        let _ = self.bind(0);
        // SAFETY: the caller gives up one live allocation of ours; nothing uses it any more.
        unsafe {
            match a {
                Alloc::Device { handle, addr, size } => {
                    driver::mem_unmap(addr, size).ok();
                    driver::address_free(addr, size).ok();
                    driver::mem_release(handle);
                }
                Alloc::Host { base } => driver::host_free(base),
                Alloc::Managed { base } => driver::mem_free(base),
            }
        }
    }

    fn register_host(&self, addr: usize, size: usize, read_only: bool) -> Result<()> {
        self.bind(0)?;
        driver::host_register(addr, size, read_only)
    }

    unsafe fn unregister_host(&self, addr: usize, _size: usize) {
        let _ = self.bind(0);
        // SAFETY: forwarded contract.
        unsafe { driver::host_unregister(addr) };
    }

    fn create_engine(&self, device: u32) -> Result<Box<dyn super::Engine>> {
        Ok(Box::new(engine::CudaEngine::new(
            device,
            self.contexts.clone(),
        )?))
    }

    fn create_sync(&self) -> Result<std::sync::Arc<dyn super::EngineSync>> {
        Ok(std::sync::Arc::new(super::sync::FlagSync::default()))
    }

    unsafe fn protect(&self, addr: usize, size: usize, prot: Protection) -> Result<()> {
        self.bind(0)?;
        // SAFETY: forwarded contract.
        unsafe { self.set_access_runs(addr, size, prot) }
    }

    fn managed(
        &self,
        page_size: usize,
        _room: std::sync::Arc<dyn super::managed::DeviceRoom>,
    ) -> std::result::Result<std::sync::Arc<dyn super::managed::ManagedResidency>, String> {
        // The driver accounts its own memory (the room is the host backend's concern).
        Ok(std::sync::Arc::new(managed::CudaManaged::new(
            self.contexts.clone(),
            &self.handles,
            page_size,
        )?))
    }

    fn export_physical(&self, _raw: RawPhysical) -> Result<OwnedFd> {
        Err(HalError::Unsupported(
            "IPC export of physical memory is not implemented on the cuda backend yet".into(),
        ))
    }

    fn export_allocation(&self, _raw: RawAllocation) -> Result<OwnedFd> {
        Err(HalError::Unsupported(
            "IPC export of allocations is not implemented on the cuda backend yet".into(),
        ))
    }

    fn import_physical(&self, _fd: OwnedFd) -> Result<RawPhysical> {
        Err(HalError::Unsupported(
            "IPC import is not implemented on the cuda backend yet".into(),
        ))
    }

    fn check_shareable(&self, _fd: BorrowedFd<'_>, _need: u64) -> std::result::Result<(), String> {
        Err("IPC import is not implemented on the cuda backend yet".into())
    }
}
