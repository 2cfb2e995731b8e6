//! The cuda backend: NVIDIA GPUs through the CUDA driver API (`cudarc`, loaded at run time).
//!
//! | operation | driver calls |
//! |---|---|
//! | reserve / release | `cuMemAddressReserve` / `cuMemAddressFree` |
//! | create physical (device) | one `cuMemCreate` of the whole size (rounded up to the granule, 2 MiB on an H200), location `CU_MEM_LOCATION_TYPE_DEVICE`, POSIX-fd shareable |
//! | create physical (host) | the same with `CU_MEM_LOCATION_TYPE_HOST_NUMA` (the calling thread's node) |
//! | destroy physical | `cuMemRelease` of each allocation (mappings keep theirs alive) |
//! | map | `cuMemMap` of each allocation in the range, then one `cuMemSetAccess` over the range for every device that can reach it (and the host, for host memory) |
//! | unmap | `cuMemUnmap` of each mapping of the range |
//! | protect | one `cuMemSetAccess` per run of one location (NONE is `CU_MEM_ACCESS_FLAGS_PROT_NONE`) |
//! | alloc device | `cuMemCreate` + `cuMemAddressReserve` + `cuMemMap` + `cuMemSetAccess` (exportable, unlike `cuMemAlloc`) |
//! | alloc host | the same at `CU_MEM_LOCATION_TYPE_HOST_NUMA` (the calling thread's node), access for the host and every device: pinned, reachable at the same address from both, and exportable (case 9 of the cases file); where the driver refuses host memory from `cuMemCreate`, `cuMemHostAlloc(PORTABLE \| DEVICEMAP)` from then on (not exportable) |
//! | alloc shared | `cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL)` |
//! | register host | `cuMemHostRegister(PORTABLE \| DEVICEMAP [\| READ_ONLY])` / `cuMemHostUnregister` |
//! | engines | a stream each ([`engine`]) |
//!
//! # Physical objects: one allocation, split into granules when a piece is needed
//! `cuMemMap` maps an allocation only whole, at offset 0 (`CUDA_ERROR_NOT_SUPPORTED`
//! otherwise), and `cuMemUnmap` / `cuMemSetAccess` take only whole mappings
//! (`CUDA_ERROR_INVALID_VALUE` for a sub-range: both measured on an H200, driver 580). Level Zero
//! maps any page-aligned piece of a physical object at any offset, unmaps any page-aligned
//! piece of a mapping and sets access per page.
//!
//! What a mapping costs is per *allocation*, not per byte (H200, driver 580, measured with a
//! ctypes probe): `cuMemSetAccess` takes about 30 µs for one allocation of 2 MiB and about
//! 46 µs for one of 32 MiB, but about 28 µs *per allocation* when one call covers a run of
//! 2 MiB allocations; `cuMemUnmap` about 18-20 µs per allocation likewise. So one allocation
//! per granule would make every map cost what the naive per-2 MiB sequence costs.
//!
//! A physical object is therefore made as **one** allocation ([`Chunk`]) and mapped whole with
//! one `cuMemMap` and one `cuMemSetAccess`, the fast path that a KV cache growing by whole
//! chunks takes (3 µs per 2 MiB for a 32 MiB chunk, against about 35 µs for `cuMemCreate` +
//! `cuMemMap` + `cuMemSetAccess` per 2 MiB). The first operation that needs a *piece* of an
//! allocation (a map of part of the object, an unmap or a protect of part of a mapping, an
//! IPC export whose importer may map a piece of it: see "IPC") **splits** it: one new
//! allocation per granule, the contents copied device to device (`cuMemcpyDtoD`, after
//! `cuCtxSynchronize` so that no queued work still writes it), and every mapping of the old
//! allocation re-made over the granules with its protection. A split costs about one
//! `cuMemCreate` + `cuMemMap` + `cuMemSetAccess` per granule and happens at most once per
//! allocation; it needs the granules' memory while the copy runs, so near a full device it
//! can fail with `OutOfDeviceMemory` (then nothing has changed). After a split every
//! page-aligned range is a run of whole mappings.
//!
//! An allocation shared with another process (exported whole through an IPC handle, or
//! imported from one: see "IPC") is never split: the other process maps that very allocation,
//! and a split would copy it to new allocations that only this process sees, so the two
//! would silently diverge. An operation that needs a piece of such an allocation (a map of
//! part of it, an unmap or protect of part of its mapping, a range export of part of it) is
//! refused with `Unsupported` (`UnsupportedFeature` in the spec) before anything is done
//! to it (another allocation the same call needed a piece of may already be split, which
//! keeps its contents and mappings: nothing the caller can see); the allocation can still be
//! mapped, unmapped, protected and exported whole.
//!
//! A split is not atomic for a host thread writing *host* physical memory (`HOST_NUMA`)
//! through another mapping of the same object while the split runs: such a write can be lost.
//! Device memory is written only by device work, which the split waits for.
//!
//! # IPC
//! An export gives one `cuMemExportToShareableHandle` fd per allocation of the object, with
//! its size ([`Backend::export_physical`]). Since an importer too can map an allocation only
//! whole, which allocations go whole depends on what the handle's importer will map:
//! - a **physical object's handle** (no covered ranges: its importer may map any piece)
//!   splits every allocation of more than one granule first, so every part is one granule;
//!   except an allocation already shared whole, which cannot be split any more: it goes whole,
//!   and an importer can then map only all of it (a map of a piece of it there is refused, as
//!   above), which is less surprising than refusing the export;
//! - a **range handle** gives the runs of the object in the range: an allocation that every
//!   run touching it covers entirely goes whole (each piece of the handle cut from it is then
//!   the whole allocation: one import, one `cuMemMap` and one `cuMemSetAccess` at the
//!   importer instead of one per granule), one that a run covers only in part is split into
//!   granules (refused if it is shared already), and one no run touches is exported but not
//!   sent (the semantics layer closes the parts no piece names). A range over PyTorch's
//!   20 MiB segments, each mapped whole, thus sends one fd per segment, not ten.
//!
//! Every allocation an export hands out for a piece is marked shared from then on (an
//! imported one is shared from the start), so never split afterwards (see above). A handle
//! whose registration fails after the backend's export leaves its allocations marked
//! although nothing was sent (the mark is never taken back: the backend cannot know whether
//! an fd went out).
//!
//! The semantics layer carries the parts' sizes in the broker's answer: the fds are
//! descriptors of `/dev/nvidiactl`, all with the same `fstat` identity and size 0, so they
//! travel only through the broker and cannot be traced back to their export
//! ([`Backend::shareable_fds_have_identity`] is false). An import is
//! `cuMemImportFromShareableHandle` of each fd, its location read back with
//! `cuMemGetAllocationPropertiesFromHandle`. Shared USM memory (and host USM where the
//! driver made it with `cuMemHostAlloc`) has no shareable handle here. Managed memory:
//! [`managed`].

mod driver;
mod engine;
mod managed;
mod staging;

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::sys;
use parking_lot::Mutex;

use super::{
    AllocLocation, Backend, DeviceInfo, HalError, PhysicalLocation, Protection, RawAllocation,
    RawPhysical, Result, SharedPart,
};

/// Where the memory of a physical object lives: a device, or host memory on a NUMA node (the
/// node it was made on, which its host access descriptor must name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Home {
    Device(u32),
    HostNuma(u32),
}

/// How an allocation came to be shared with another process (see [`Chunk::shared`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shared {
    /// Exported (its fd handed out by [`Backend::export_physical`] for a piece to map).
    Exported,
    /// Imported from another export (`cuMemImportFromShareableHandle`).
    Imported,
}

/// One allocation (`cuMemCreate`, or `cuMemImportFromShareableHandle`) of `granules`
/// granules at `home`. The physical object and every mapping of it hold it (`Arc`); the last
/// to let go releases it (`cuMemRelease`).
#[derive(Debug)]
struct Chunk {
    handle: driver::CUmemGenericAllocationHandle,
    granules: usize,
    home: Home,
    /// The shareable fd of its first export, kept so that later exports are a `dup` (about
    /// 1 µs) instead of another `cuMemExportToShareableHandle` (about 110 µs per 2 MiB
    /// allocation on an H200).
    exported: std::sync::OnceLock<std::os::fd::OwnedFd>,
    /// Set, for good, once the allocation is shared with another process: another process
    /// maps this very allocation, so it is never split ([`CudaBackend::split`] refuses: a
    /// split would copy it to new allocations that only this process sees). Only an
    /// allocation of more than one granule can be split at all.
    shared: std::sync::OnceLock<Shared>,
}

impl Chunk {
    fn new(handle: driver::CUmemGenericAllocationHandle, granules: usize, home: Home) -> Chunk {
        Chunk {
            handle,
            granules,
            home,
            exported: std::sync::OnceLock::new(),
            shared: std::sync::OnceLock::new(),
        }
    }

    /// A shareable fd of this allocation, owned by the caller (see `exported`).
    fn export(&self) -> Result<std::os::fd::OwnedFd> {
        if self.exported.get().is_none() {
            let fd = driver::export_fd(self.handle)?;
            let _ = self.exported.set(fd);
        }
        let fd = self.exported.get().expect("set above");
        super::platform::dup(fd.as_fd(), "an exported CUDA allocation")
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: this is the last holder of the handle; the driver keeps the memory while a
        // mapping of it exists (there is none left: mappings hold the chunk).
        unsafe { driver::mem_release(self.handle) };
    }
}

/// A physical object: its allocations, in order, tiling it.
#[derive(Debug)]
struct Physical {
    chunks: Vec<Arc<Chunk>>,
    home: Home,
}

/// One CUDA mapping: the whole of `chunk`, with protection `prot`.
#[derive(Debug, Clone)]
struct Mapping {
    chunk: Arc<Chunk>,
    prot: Protection,
}

/// The physical objects and the mappings, under one lock (a split changes both).
#[derive(Debug, Default)]
struct State {
    physical: HashMap<u64, Physical>,
    /// Every CUDA mapping, by start address.
    mapped: BTreeMap<usize, Mapping>,
}

/// A USM allocation and how to free it.
#[derive(Debug)]
enum Alloc {
    /// Device memory, or host memory at a host NUMA node: one `cuMemCreate` of `size` bytes
    /// mapped at `addr` in a reservation of its own (POSIX-fd shareable).
    Vmm {
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
    state: Mutex<State>,
    /// How many allocations were split into granules (see the module docs).
    splits: AtomicU64,
    allocs: Mutex<HashMap<u64, Alloc>>,
    /// Whether host USM is still made by `cuMemCreate` at a host NUMA node (exportable);
    /// cleared, for good, the first time the driver refuses (then `cuMemHostAlloc`).
    host_vmm: std::sync::atomic::AtomicBool,
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
            state: Mutex::new(State::default()),
            splits: AtomicU64::new(0),
            allocs: Mutex::new(HashMap::new()),
            host_vmm: std::sync::atomic::AtomicBool::new(true),
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

    /// The location of `home`'s memory.
    fn location(home: Home) -> sys::CUmemLocation {
        match home {
            Home::Device(d) => driver::device_location(d),
            Home::HostNuma(n) => driver::host_numa_location(n),
        }
    }

    /// One `cuMemCreate` of `size` bytes (rounded up to the granule) at `home`, mapped whole
    /// in a reservation of its own aligned to `align` (at least the granule), read-write for
    /// every location `home` gives access to: `(handle, address, size)`. Undone on error.
    fn vmm_alloc(
        &self,
        home: Home,
        size: usize,
        align: usize,
    ) -> Result<(driver::CUmemGenericAllocationHandle, usize, usize)> {
        let size = size.div_ceil(self.granule) * self.granule;
        let handle = driver::mem_create(size, Self::location(home))?;
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
            unsafe { driver::set_access(addr, size, &self.access(home, Protection::ReadWrite)) }
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
        Ok((handle, addr, size))
    }

    /// Splits `chunk` (more than one granule) into one allocation per granule: new
    /// allocations, the contents copied, every mapping of it re-made over them with its
    /// protection, and the physical object that holds it (if any) given the granules instead.
    /// On error nothing has changed. See the module docs.
    ///
    /// Refused with `Unsupported` (nothing done) for an allocation shared with another process
    /// ([`Chunk::shared`]).
    fn split(&self, st: &mut State, chunk: &Arc<Chunk>) -> Result<()> {
        let g = self.granule;
        let n = chunk.granules;
        let size = n * g;
        if let Some(&how) = chunk.shared.get() {
            let how = match how {
                Shared::Exported => "exported whole through an IPC handle",
                Shared::Imported => "imported whole from an IPC handle",
            };
            return Err(HalError::Unsupported(format!(
                "a piece of an allocation of {n} granules ({size:#x} bytes) was needed, but \
                 this allocation is shared whole with another process ({how}); the CUDA \
                 driver maps an allocation only whole (cuMemMap at offset 0, cuMemUnmap and \
                 cuMemSetAccess of whole mappings), and splitting it would copy it to \
                 allocations the other process does not see, so a piece of it can no longer \
                 be mapped, unmapped, protected or shared alone (only all {size:#x} bytes)"
            )));
        }
        let home = chunk.home;
        let device = match home {
            Home::Device(d) => d,
            Home::HostNuma(_) => 0,
        };
        self.bind(device)?;
        let mut parts: Vec<Arc<Chunk>> = Vec::with_capacity(n);
        for _ in 0..n {
            let handle = driver::mem_create(g, Self::location(home))?;
            parts.push(Arc::new(Chunk::new(handle, 1, home)));
        }
        // Copy: the old allocation and the granules side by side in a scratch reservation,
        // read-write for the copying device. Queued work that writes the old one (from its own
        // device or a peer) ends first.
        for d in 0..self.devices.len() as u32 {
            self.bind(d)?;
            driver::ctx_synchronize()?;
        }
        self.bind(device)?;
        let scratch = driver::address_reserve(2 * size, g, 0)?;
        let rw = [sys::CUmemAccessDesc {
            location: driver::device_location(device),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        }];
        let mut mapped: Vec<(usize, usize)> = Vec::new();
        let copied = (|| -> Result<()> {
            // SAFETY: fresh scratch space; each allocation mapped whole, then made accessible.
            unsafe {
                driver::mem_map(scratch, size, chunk.handle)?;
                mapped.push((scratch, size));
                for (i, p) in parts.iter().enumerate() {
                    driver::mem_map(scratch + size + i * g, g, p.handle)?;
                    mapped.push((scratch + size + i * g, g));
                }
                driver::set_access(scratch, 2 * size, &rw)?;
                driver::memcpy_dtod(scratch + size, scratch, size)
            }
        })();
        for &(a, len) in &mapped {
            // SAFETY: scratch mappings made above, used by nothing else.
            unsafe { driver::mem_unmap(a, len).ok() };
        }
        // SAFETY: the scratch reservation, now empty.
        unsafe { driver::address_free(scratch, 2 * size).ok() };
        copied?;
        // Re-make every mapping of the old allocation over the granules.
        let at: Vec<(usize, Protection)> = st
            .mapped
            .iter()
            .filter(|(_, m)| Arc::ptr_eq(&m.chunk, chunk))
            .map(|(&a, m)| (a, m.prot))
            .collect();
        for (k, &(a, prot)) in at.iter().enumerate() {
            let remap = || -> Result<()> {
                // SAFETY: `a` is a whole mapping of the old allocation; the granules replace it
                // at the same addresses, then get its protection.
                unsafe {
                    driver::mem_unmap(a, size)?;
                    for (i, p) in parts.iter().enumerate() {
                        if let Err(e) = driver::mem_map(a + i * g, g, p.handle) {
                            for j in 0..i {
                                driver::mem_unmap(a + j * g, g).ok();
                            }
                            driver::mem_map(a, size, chunk.handle).ok();
                            driver::set_access(a, size, &self.access(home, prot)).ok();
                            return Err(e);
                        }
                    }
                    driver::set_access(a, size, &self.access(home, prot))
                }
            };
            if let Err(e) = remap() {
                // Put the mappings already moved back on the old allocation.
                for &(b, prot) in &at[..k] {
                    // SAFETY: `b` holds the granules mapped above; the old allocation is alive.
                    unsafe {
                        driver::mem_unmap(b, size).ok();
                        driver::mem_map(b, size, chunk.handle).ok();
                        driver::set_access(b, size, &self.access(home, prot)).ok();
                    }
                }
                return Err(e);
            }
        }
        for &(a, prot) in &at {
            st.mapped.remove(&a);
            for (i, p) in parts.iter().enumerate() {
                st.mapped.insert(
                    a + i * g,
                    Mapping {
                        chunk: p.clone(),
                        prot,
                    },
                );
            }
        }
        for obj in st.physical.values_mut() {
            if let Some(i) = obj.chunks.iter().position(|c| Arc::ptr_eq(c, chunk)) {
                obj.chunks.splice(i..=i, parts.iter().cloned());
                break;
            }
        }
        let total = self.splits.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::debug!(
            granules = n,
            total,
            "cuda: split an allocation into granules"
        );
        Ok(())
    }

    /// Splits every mapping that `[addr, addr+size)` covers only in part, so that the range is
    /// a run of whole mappings.
    fn split_partial_mappings(&self, st: &mut State, addr: usize, size: usize) -> Result<()> {
        let g = self.granule;
        let end = addr + size;
        loop {
            let partial = st
                .mapped
                .range(..end)
                .rev()
                .take_while(|(&a, m)| a + m.chunk.granules * g > addr)
                .find(|(&a, m)| a < addr || a + m.chunk.granules * g > end)
                .map(|(_, m)| m.chunk.clone());
            match partial {
                Some(c) => self.split(st, &c)?,
                None => return Ok(()),
            }
        }
    }

    /// Sets `prot` over the mappings of `[addr, addr+size)` (whole mappings, see
    /// [`CudaBackend::split_partial_mappings`]): one `cuMemSetAccess` per run of one location.
    fn set_access_runs(
        &self,
        st: &mut State,
        addr: usize,
        size: usize,
        prot: Protection,
    ) -> Result<()> {
        let g = self.granule;
        let mut runs: Vec<(usize, usize, Home)> = Vec::new();
        for (&a, m) in st.mapped.range(addr..addr + size) {
            let e = a + m.chunk.granules * g;
            match runs.last_mut() {
                Some((_, end, l)) if *end == a && *l == m.chunk.home => *end = e,
                _ => runs.push((a, e, m.chunk.home)),
            }
        }
        for (s, e, loc) in runs {
            // SAFETY: a run of whole mappings.
            unsafe { driver::set_access(s, e - s, &self.access(loc, prot))? };
        }
        for (_, m) in st.mapped.range_mut(addr..addr + size) {
            m.prot = prot;
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

    fn sub_devices_note(&self) -> Option<String> {
        Some(
            "none: a CUDA GPU is one device with one memory and one set of engines that the \
             driver schedules itself; Level Zero sub-devices are parts of one device (tiles, \
             each with its own share of the memory and its own queues) that a program \
             addresses as devices of their own beside their root, and CUDA exposes no such \
             part. MIG is not that either: a MIG instance is a separate CUDA device (chosen \
             by CUDA_VISIBLE_DEVICES, its memory walled off), never a child of the whole GPU \
             in the same process; without MIG (an H200 by default) there is only the whole \
             GPU"
            .into(),
        )
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    unsafe fn reserve(&self, hint: Option<usize>, size: usize, align: usize) -> Result<usize> {
        self.bind(0)?;
        driver::address_reserve(size, align.max(self.granule), hint.unwrap_or(0)).map_err(|e| {
            match e {
                // The range the driver could not find is virtual address space (the host's
                // resource, as on every backend), whatever the driver calls it.
                HalError::Unexpected(m) | HalError::OutOfHostMemory(m) => {
                    HalError::OutOfHostMemory(format!(
                        "{m}: the GPU's virtual address space has no free range of {size:#x} \
                         bytes"
                    ))
                }
                e => e,
            }
        })
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
        let size = size.div_ceil(self.granule) * self.granule;
        let handle = driver::mem_create(size, loc).map_err(|e| match (e, location) {
            (HalError::Unsupported(m), PhysicalLocation::Host) => HalError::Unsupported(format!(
                "{m}: this CUDA driver cannot make host physical memory \
                 (CU_MEM_LOCATION_TYPE_HOST_NUMA)"
            )),
            (e, _) => e,
        })?;
        let chunk = Arc::new(Chunk::new(handle, size / self.granule, home));
        let id = self.id();
        self.state.lock().physical.insert(
            id,
            Physical {
                chunks: vec![chunk],
                home,
            },
        );
        Ok(RawPhysical(id))
    }

    unsafe fn destroy_physical(&self, raw: RawPhysical) {
        // The chunks are released by their last holder: this object, or a mapping of them.
        let gone = self.state.lock().physical.remove(&raw.0);
        drop(gone);
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
        let end = phys_offset + size;
        let mut st = self.state.lock();
        let home = loop {
            let p = st.physical.get(&raw.0).ok_or_else(|| {
                HalError::Unexpected(format!("physical object {} is not known", raw.0))
            })?;
            let total: usize = p.chunks.iter().map(|c| c.granules * g).sum();
            if end > total {
                return Err(HalError::Unexpected(format!(
                    "[{phys_offset:#x}, +{size:#x}) is outside physical object {} ({total:#x} \
                     bytes)",
                    raw.0
                )));
            }
            // A chunk the piece covers only in part is split first.
            let mut at = 0;
            let mut partial = None;
            for c in &p.chunks {
                let (s, e) = (at, at + c.granules * g);
                if s < end && e > phys_offset && (s < phys_offset || e > end) {
                    partial = Some(c.clone());
                    break;
                }
                at = e;
            }
            let home = p.home;
            match partial {
                Some(c) => self.split(&mut st, &c)?,
                None => break home,
            }
        };
        let chunks: Vec<Arc<Chunk>> = {
            let p = &st.physical[&raw.0];
            let mut at = 0;
            p.chunks
                .iter()
                .filter(|c| {
                    let s = at;
                    at += c.granules * g;
                    s >= phys_offset && s < end
                })
                .cloned()
                .collect()
        };
        let mut va = addr;
        let mut result = Ok(());
        let mut done = Vec::with_capacity(chunks.len());
        for c in &chunks {
            let len = c.granules * g;
            // SAFETY: the range is reserved and unmapped (caller), and `c` is mapped whole.
            if let Err(e) = unsafe { driver::mem_map(va, len, c.handle) } {
                result = Err(e);
                break;
            }
            done.push((va, len));
            va += len;
        }
        if result.is_ok() {
            // SAFETY: the whole range is mappings just made.
            result = unsafe { driver::set_access(addr, size, &self.access(home, prot)) };
        }
        if let Err(e) = result {
            for &(a, len) in &done {
                // SAFETY: mapped above, used by nobody yet.
                unsafe { driver::mem_unmap(a, len).ok() };
            }
            return Err(e);
        }
        let mut va = addr;
        for c in chunks {
            let len = c.granules * g;
            st.mapped.insert(va, Mapping { chunk: c, prot });
            va += len;
        }
        Ok(())
    }

    unsafe fn unmap(&self, addr: usize, size: usize) -> Result<()> {
        self.bind(0)?;
        let g = self.granule;
        let mut st = self.state.lock();
        self.split_partial_mappings(&mut st, addr, size)?;
        let keys: Vec<(usize, usize)> = st
            .mapped
            .range(addr..addr + size)
            .map(|(&a, m)| (a, m.chunk.granules * g))
            .collect();
        for (a, len) in keys {
            // SAFETY: a whole mapping inside the caller's range.
            unsafe { driver::mem_unmap(a, len)? };
            st.mapped.remove(&a);
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
                let (handle, addr, size) = self.vmm_alloc(Home::Device(d), size, align)?;
                (addr, Alloc::Vmm { handle, addr, size })
            }
            AllocLocation::Host => {
                self.bind(0)?;
                let home = Home::HostNuma(super::platform::current_numa_node());
                match self.host_vmm.load(Ordering::Relaxed) {
                    true => match self.vmm_alloc(home, size, align) {
                        Ok((handle, addr, size)) => (addr, Alloc::Vmm { handle, addr, size }),
                        Err(HalError::Unsupported(m)) => {
                            // This driver or system makes no host memory with cuMemCreate:
                            // cuMemHostAlloc from now on (not exportable).
                            tracing::warn!(
                                "host USM falls back to cuMemHostAlloc (not exportable): {m}"
                            );
                            self.host_vmm.store(false, Ordering::Relaxed);
                            let base = driver::host_alloc(size + align.saturating_sub(4096))?;
                            (base.next_multiple_of(align), Alloc::Host { base })
                        }
                        Err(e) => return Err(e),
                    },
                    false => {
                        let base = driver::host_alloc(size + align.saturating_sub(4096))?;
                        (base.next_multiple_of(align), Alloc::Host { base })
                    }
                }
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
                Alloc::Vmm { handle, addr, size } => {
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
        let mut st = self.state.lock();
        self.split_partial_mappings(&mut st, addr, size)?;
        self.set_access_runs(&mut st, addr, size, prot)
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

    fn export_physical(
        &self,
        raw: RawPhysical,
        covered: &[(usize, usize)],
    ) -> Result<Vec<SharedPart>> {
        let g = self.granule;
        let mut st = self.state.lock();
        // Granules first where an importer may need a piece of an allocation (see
        // `export_plan`); an allocation already shared cannot be split (its copy would no
        // longer be shared): a physical object's handle then sends it whole (an importer can
        // map only all of it), and a range handle that needs a piece of it is refused by
        // `split`.
        let plan = loop {
            let p = st.physical.get(&raw.0).ok_or_else(|| {
                HalError::Unexpected(format!("physical object {} is not known", raw.0))
            })?;
            let sizes: Vec<usize> = p.chunks.iter().map(|c| c.granules * g).collect();
            let plan = export_plan(&sizes, covered);
            let next = p
                .chunks
                .iter()
                .zip(&plan)
                .find(|(c, &e)| {
                    e == ChunkExport::Granules
                        && c.granules > 1
                        && !(covered.is_empty() && c.shared.get().is_some())
                })
                .map(|(c, _)| c.clone());
            match next {
                Some(c) => self.split(&mut st, &c)?,
                None => break plan,
            }
        };
        let chunks = &st.physical[&raw.0].chunks;
        let parts = chunks
            .iter()
            .map(|c| {
                Ok(SharedPart {
                    fd: c.export()?,
                    size: (c.granules * g) as u64,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // Every part a piece will name goes to another process: never split from now on. (A
        // part that no covered range touches is closed unsent by the caller.)
        for (c, e) in chunks.iter().zip(plan) {
            if e != ChunkExport::Unused {
                let _ = c.shared.set(Shared::Exported);
            }
        }
        Ok(parts)
    }

    fn export_allocation(&self, raw: RawAllocation) -> Result<Vec<SharedPart>> {
        match self.allocs.lock().get(&raw.0) {
            Some(Alloc::Vmm { handle, size, .. }) => Ok(vec![SharedPart {
                fd: driver::export_fd(*handle)?,
                size: *size as u64,
            }]),
            Some(Alloc::Host { .. }) => Err(HalError::Unsupported(
                "this host allocation is cuMemHostAlloc memory (the driver made no host memory \
                 with cuMemCreate at CU_MEM_LOCATION_TYPE_HOST_NUMA), which has no shareable \
                 handle"
                    .into(),
            )),
            Some(Alloc::Managed { .. }) => Err(HalError::Unsupported(
                "shared USM memory on the cuda backend (cuMemAllocManaged) has no shareable \
                 handle; device and host memory can be exported"
                    .into(),
            )),
            None => Err(HalError::Unexpected(format!(
                "allocation {} is not known",
                raw.0
            ))),
        }
    }

    fn import_physical(&self, parts: Vec<SharedPart>) -> Result<RawPhysical> {
        self.bind(0)?;
        let g = self.granule as u64;
        let mut chunks = Vec::with_capacity(parts.len());
        for p in &parts {
            if p.size == 0 || !p.size.is_multiple_of(g) {
                return Err(HalError::Unsupported(format!(
                    "an imported part of {:#x} bytes is not a multiple of the {g:#x}-byte \
                     granule",
                    p.size
                )));
            }
            let handle = driver::import_fd(p.fd.as_fd())?;
            // Held from here on, so that an error below releases it.
            let chunk = |home| Chunk::new(handle, (p.size / g) as usize, home);
            let loc = match driver::allocation_location(handle) {
                Ok(l) => l,
                Err(e) => {
                    drop(chunk(Home::Device(0)));
                    return Err(e);
                }
            };
            let home = if loc.type_ == sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE {
                Home::Device(loc.id as u32)
            } else {
                Home::HostNuma(loc.id.max(0) as u32)
            };
            let chunk = chunk(home);
            // Another process maps this allocation (its exporter, at least): never split.
            let _ = chunk.shared.set(Shared::Imported);
            chunks.push(Arc::new(chunk));
        }
        let home = chunks.first().map_or(Home::Device(0), |c| c.home);
        let id = self.id();
        self.state
            .lock()
            .physical
            .insert(id, Physical { chunks, home });
        Ok(RawPhysical(id))
    }

    fn device_free_memory(&self, device: u32) -> Result<Option<u64>> {
        self.bind(device)?;
        Ok(Some(driver::mem_get_info()?.0 as u64))
    }

    fn shareable_fds_have_identity(&self) -> bool {
        false
    }

    fn device_memory_host_accessible(&self) -> bool {
        false
    }

    fn shareable_identity(&self, _fd: BorrowedFd<'_>) -> Option<super::ipc::ShareableIdentity> {
        // Every exported fd is a descriptor of /dev/nvidiactl: fstat tells them apart by nothing.
        None
    }

    fn check_shareable(&self, fd: BorrowedFd<'_>, _need: u64) -> std::result::Result<(), String> {
        // A CUDA shareable handle is a descriptor of /dev/nvidiactl (character device, major
        // 195; fstat(2)). Its size cannot be read: `cuMemMap` refuses a size other than the
        // allocation's, so a part smaller than claimed fails at open (nothing kept).
        let major = super::platform::char_device_major(fd)
            .map_err(|e| format!("a received fd cannot be inspected ({e})"))?;
        if major != Some(NVIDIA_MAJOR) {
            return Err(
                "a received fd is not a CUDA shareable handle (a descriptor of /dev/nvidiactl)"
                    .into(),
            );
        }
        Ok(())
    }
}

/// The major number of the NVIDIA character devices (`/dev/nvidiactl`, `/dev/nvidia0`, ...).
const NVIDIA_MAJOR: u32 = 195;

/// How [`Backend::export_physical`] hands out one allocation of a physical object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkExport {
    /// An importer may map a piece of it: one part per granule (split first).
    Granules,
    /// Every piece cut from it is all of it: one part, the allocation whole (then shared).
    Whole,
    /// No piece is cut from it: one part, the allocation whole, which the caller closes
    /// unsent (so it is not shared).
    Unused,
}

/// What an export does with each allocation of an object tiled by allocations of
/// `chunk_sizes` bytes (in order), given the byte ranges `(offset, len)` of the object that
/// the handle's pieces cover (see [`Backend::export_physical`]). No ranges (a physical object's
/// handle, whose importer may map any piece): every allocation in granules. Otherwise an
/// allocation is sent whole where every range that touches it covers it entirely (every piece
/// cut from it at its bounds is then the whole allocation, which is all `cuMemMap` maps), in
/// granules where a range covers only part of it, and is unused where no range touches it.
fn export_plan(chunk_sizes: &[usize], covered: &[(usize, usize)]) -> Vec<ChunkExport> {
    let mut at = 0;
    chunk_sizes
        .iter()
        .map(|&size| {
            let (s, e) = (at, at + size);
            at = e;
            if covered.is_empty() {
                return ChunkExport::Granules;
            }
            let mut touched = false;
            for &(o, l) in covered {
                if l == 0 || o >= e || o + l <= s {
                    continue;
                }
                if o > s || o + l < e {
                    return ChunkExport::Granules;
                }
                touched = true;
            }
            if touched {
                ChunkExport::Whole
            } else {
                ChunkExport::Unused
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{export_plan, ChunkExport::*};

    const G: usize = 2 << 20;

    #[test]
    fn a_physical_handle_sends_every_allocation_in_granules() {
        assert_eq!(export_plan(&[10 * G], &[]), [Granules]);
        assert_eq!(export_plan(&[G, 3 * G], &[]), [Granules, Granules]);
    }

    #[test]
    fn a_range_over_whole_allocations_sends_them_whole() {
        // One object of one 20 MiB allocation (a PyTorch segment), mapped and shared whole.
        assert_eq!(export_plan(&[10 * G], &[(0, 10 * G)]), [Whole]);
        // An object already in three allocations, all covered by one run.
        assert_eq!(
            export_plan(&[2 * G, G, 3 * G], &[(0, 6 * G)]),
            [Whole, Whole, Whole]
        );
    }

    #[test]
    fn a_range_over_part_of_an_allocation_needs_its_granules() {
        assert_eq!(export_plan(&[10 * G], &[(0, 4 * G)]), [Granules]);
        assert_eq!(export_plan(&[10 * G], &[(2 * G, 8 * G)]), [Granules]);
        assert_eq!(export_plan(&[10 * G], &[(2 * G, 2 * G)]), [Granules]);
        // One run ends inside the second allocation: the first goes whole, the third unused.
        assert_eq!(
            export_plan(&[2 * G, 2 * G, 2 * G], &[(0, 3 * G)]),
            [Whole, Granules, Unused]
        );
    }

    #[test]
    fn every_run_that_touches_an_allocation_must_cover_it_whole() {
        // Two runs, each one allocation whole (mapped twice, or in two places of the range).
        assert_eq!(
            export_plan(&[2 * G, 2 * G, 2 * G], &[(4 * G, 2 * G), (0, 2 * G)]),
            [Whole, Unused, Whole]
        );
        // The same allocation twice, once whole and once in part: granules.
        assert_eq!(export_plan(&[4 * G], &[(0, 4 * G), (G, G)]), [Granules]);
        // Overlapping runs that each cover it whole.
        assert_eq!(export_plan(&[4 * G], &[(0, 4 * G), (0, 4 * G)]), [Whole]);
    }

    #[test]
    fn a_run_spanning_two_allocations_wholly_sends_both_whole() {
        assert_eq!(
            export_plan(&[G, 3 * G, 2 * G], &[(G, 5 * G)]),
            [Unused, Whole, Whole]
        );
        // Two runs of two allocations each, meeting in the middle one: all whole.
        assert_eq!(
            export_plan(&[G, G, G], &[(0, 2 * G), (G, 2 * G)]),
            [Whole, Whole, Whole]
        );
    }
}
