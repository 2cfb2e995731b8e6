//! The backend trait: the few raw operations a platform must provide.
//!
//! Following wgpu-hal's three rules, the operations here are
//! - **portable**: used as documented, they give the same results on every backend;
//! - **unsafe with minimal validation**: the semantics layer ([`crate::vmm`]) has already checked
//!   every argument against the spec (alignment, ranges, overlap, capacity, enumerations), so a
//!   backend never decides a spec error code;
//! - **fallible only for what the caller cannot anticipate**: out of memory, an OS limit, a lost
//!   device. Those come back as [`crate::backend::HalError::OutOfHostMemory`] / [`crate::Error::OutOfDeviceMemory`] /
//!   [`crate::backend::HalError::Unexpected`] with a message naming the limit or the failing call.
//!
//! Each method names the CUDA driver call the cuda backend maps it to.
//!
//! Three traits make a backend: [`Backend`] (virtual and physical memory, USM, engines,
//! events, protection, the IPC transport), [`ipc`]'s transport types, and
//! [`managed::ManagedResidency`], managed memory at the level a unified-memory driver offers
//! (`cuMemAllocManaged`, `cuMemPrefetchAsync`, `cuMemAdvise`, `cuMemcpyAsync` /
//! `cuMemsetD8Async` on managed memory). The ACL rules of managed memory, its advice records
//! and the range attributes stay above, in the semantics layer; where pages live and how they
//! move is the backend's (on the host backend a residency engine over `userfaultfd(2)`).

mod cuda;
mod dispatch;
mod error;
mod host;
pub mod ipc;
pub mod managed;
mod platform;
mod sync;

pub use error::{HalError, Result};
pub(crate) use ipc::SharedPart;
use ipc::{BrokerAnswer, BrokerHandler, BrokerStats, ShareableIdentity, TransportError};
use std::os::fd::{BorrowedFd, OwnedFd};

/// Makes the host backend: `devices` virtual devices of `device_memory` bytes each, largest
/// single allocation `max_alloc_size` bytes (all validated by the caller: non-zero).
pub(crate) fn create_host(
    devices: u32,
    device_memory: u64,
    max_alloc_size: u64,
    huge_pages: bool,
) -> Box<dyn Backend> {
    Box::new(host::HostBackend::new(
        devices,
        device_memory,
        max_alloc_size,
        huge_pages,
    ))
}

/// Makes the cuda backend over every GPU the CUDA driver reports. `Err` says why it cannot run
/// on this machine (no driver library, `cuInit` failing, no device, no virtual memory
/// management); the runtime reports it as `Uninitialized`.
pub(crate) fn create_cuda() -> std::result::Result<Box<dyn Backend>, String> {
    Ok(Box::new(cuda::CudaBackend::new()?))
}

/// Facts about the machine and the process that the platform layer reads (for defaults, for
/// `hetmem info`, and for leak checks): Linux, whatever the backend.
pub use hetmem_linux::PlatformFacts;

// The platform's facts and helpers, from the one platform this build has (Linux): see each
// function's docs in `platform`.
pub(crate) use platform::{
    check_readable, current_numa_node, mapping_count, monotonic_ns, numa_nodes, open_fd_count,
    platform_facts,
};

/// A device as the backend sees it. All sizes in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Human-readable name, e.g. `hetmem host device 0`.
    pub name: String,
    /// Memory that physical objects and device allocations count against.
    pub capacity: u64,
    /// Largest single allocation (`maxMemAllocSize` of `ze_device_properties_t`).
    pub max_alloc_size: u64,
    /// Smallest mapping granularity the platform supports on this device (a power of two, a
    /// multiple of the OS page size). CUDA: `cuMemGetAllocationGranularity(MINIMUM)`; host: the OS
    /// page size. The page-size rule of the spec is applied above this floor.
    pub min_page_size: usize,
}

/// Where a physical memory object lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PhysicalLocation {
    /// On device `ordinal` (`ZE_PHYSICAL_MEM_FLAG_ALLOCATE_ON_DEVICE`).
    Device(u32),
    /// In host memory (`ZE_PHYSICAL_MEM_FLAG_ALLOCATE_ON_HOST`).
    Host,
}

/// A backend's own handle for a physical memory object: on the host backend an owned memfd
/// number, on CUDA a `CUmemGenericAllocationHandle`. Only the backend that made it interprets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawPhysical(pub u64);

/// Page protection of a mapped range (the backend's view of an access attribute).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protection {
    /// No access.
    None,
    /// Read and write.
    ReadWrite,
    /// Read only.
    ReadOnly,
}

/// Where a USM allocation (`zeMemAlloc{Device,Host,Shared}`) lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AllocLocation {
    /// Device memory of device `ordinal` (`zeMemAllocDevice`).
    Device(u32),
    /// Host memory reachable by every device (`zeMemAllocHost`).
    Host,
    /// Shared memory, reachable from the host and every device, associated with a device if
    /// given (`zeMemAllocShared`).
    Shared(Option<u32>),
}

/// A backend's own handle for a USM allocation: on the host backend an owned memfd number, on
/// CUDA the `CUdeviceptr`. Only the backend that made it interprets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawAllocation(pub u64);

/// A synchronisation object made by the backend ([`Backend::create_sync`]) that engines wait
/// on and signal on the device, and the host waits on, signals and resets: the state of an
/// event or fence of [`crate::queue`]. Both backends use a flag with a condition variable
/// (`sync::FlagSync`): the cuda backend's engines wait for it on their dispatch thread before
/// queuing what follows on the stream, and signal it from their completion thread. (Waiting on
/// the device instead, `cuStreamWaitValue32` on pinned host memory, is not done yet.)
pub trait EngineSync: Send + Sync + std::fmt::Debug {
    /// Waits up to `timeout_ns` nanoseconds (0: only look; `u64::MAX`: forever) for the object
    /// to be signalled; true if it is.
    fn wait_ns(&self, timeout_ns: u64) -> bool;
    /// Signals the object, waking every waiter.
    fn signal(&self);
    /// Back to not signalled; a signal already queued on an engine still comes.
    fn reset(&self);
    /// Whether the object is signalled now.
    fn is_signalled(&self) -> bool;
}

/// One raw operation for a device engine. Every address has been validated by the semantics
/// layer ([`crate::queue`]) against live memory and access before it gets here.
pub enum EngineOp {
    /// Copies `size` bytes from `src` to `dst`; the ranges may overlap (memmove semantics).
    /// CUDA: `cuMemcpyAsync`.
    Copy {
        /// Destination address.
        dst: usize,
        /// Source address.
        src: usize,
        /// Bytes.
        size: usize,
    },
    /// Fills `size` bytes at `ptr` with `pattern` repeated (byte `i` gets
    /// `pattern[i % pattern.len()]`). CUDA: `cuMemsetD8Async` / `cuMemsetD32Async` for 1- and
    /// 4-byte patterns, a copy from a pattern buffer otherwise.
    Fill {
        /// Destination address.
        ptr: usize,
        /// The pattern (1 to 128 bytes, a power of two).
        pattern: Vec<u8>,
        /// Bytes.
        size: usize,
    },
    /// Waits until the object is signalled. CUDA: the dispatch thread waits before it queues
    /// what follows on the stream.
    Wait(std::sync::Arc<dyn EngineSync>),
    /// Signals the object once everything before it has finished. CUDA: `cuEventRecord`, and
    /// the completion thread signals it once the event has completed.
    Signal(std::sync::Arc<dyn EngineSync>),
    /// Runs a host function once everything before it has finished (bookkeeping of the
    /// semantics layer: in-flight references, fences). CUDA: `cuEventRecord` and the
    /// completion thread (a `cuLaunchHostFunc` would hold the stream back meanwhile).
    Host(Box<dyn FnOnce() + Send>),
}

impl std::fmt::Debug for EngineOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineOp::Copy { dst, src, size } => write!(f, "Copy({dst:#x} <- {src:#x}, {size})"),
            EngineOp::Fill { ptr, pattern, size } => {
                write!(f, "Fill({ptr:#x}, {} byte pattern, {size})", pattern.len())
            }
            EngineOp::Wait(_) => f.write_str("Wait"),
            EngineOp::Signal(_) => f.write_str("Signal"),
            EngineOp::Host(_) => f.write_str("Host"),
        }
    }
}

/// A device engine: executes submitted batches of [`EngineOp`]s in submission order, one
/// operation after another, asynchronously to the caller. CUDA: a stream (`cuStreamCreate`);
/// host: a worker thread. Dropping it finishes the work already submitted (a wait that can
/// never be satisfied is abandoned, skipping the memory operations after it but still running
/// its `Host` operations) and joins the thread.
pub trait Engine: Send + Sync + std::fmt::Debug {
    /// Queues `ops` after everything submitted before.
    ///
    /// # Safety
    /// Every `Copy` / `Fill` range is live memory, readable (source) or writable (destination)
    /// from the host, and stays so until the operation has run.
    unsafe fn submit(&self, ops: Vec<EngineOp>);

    /// The first failure of queued work since the last call, if any: work the engine could
    /// not do after it was accepted (CUDA: an asynchronous call or the stream itself that
    /// failed). The semantics layer reports it from the next synchronize, so no failed copy
    /// passes for a finished one. Host: never (its copies cannot fail once checked).
    fn take_error(&self) -> Option<HalError> {
        None
    }
}

/// The raw operations a platform provides. See the module docs for the contract.
///
/// Addresses are process virtual addresses. Every address, size and offset passed in is aligned
/// to the device's page size as the semantics layer computed it.
///
/// The operations on the host machine itself (its RAM and page size, NUMA, `/proc/self/maps`,
/// the IPC broker and shareable-handle identity) are the same for every backend on Linux: their
/// default bodies call the Linux platform crate (`hetmem-linux`, through `platform`), and a
/// backend overrides only what differs (the host backend's `check_shareable`, say).
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Short name: `host` or `cuda`.
    fn name(&self) -> &'static str;

    /// Description of the platform for `hetmem info` (driver version, etc.).
    fn describe(&self) -> String;

    /// Which page kinds the backend uses for its memory and why, for `hetmem info` (the host
    /// backend: 4 KiB or 2 MiB pages, see `host::huge`); `None` where the driver decides.
    fn page_kinds(&self) -> Option<String> {
        None
    }

    /// Why this platform's devices have no Level Zero sub-devices, where that is their nature
    /// (for `hetmem info` and the docs); `None` where sub-devices are a setting (the host
    /// backend's modelled devices, `HETMEM_HOST_SUBDEVICES`). The sub-device model itself is
    /// the semantics layer's (`semantics::capacity`); a backend only ever works on whole
    /// devices.
    fn sub_devices_note(&self) -> Option<String> {
        None
    }

    /// Bytes of host memory that host physical memory may use in all (the machine's RAM).
    fn host_capacity(&self) -> u64 {
        platform::total_ram()
    }

    /// The host's page size in bytes (imports of system memory are aligned to it). CUDA and
    /// host: the OS page size (`sysconf(_SC_PAGESIZE)`).
    fn host_page_size(&self) -> usize {
        platform::os_page_size()
    }

    /// The devices, in ordinal order.
    fn devices(&self) -> &[DeviceInfo];

    /// Reserves `size` bytes of inaccessible virtual address space aligned to `align` (a power of
    /// two). If `hint` is given and that exact range is free, it is used; otherwise another range
    /// is chosen. Must never replace an existing mapping of the process.
    ///
    /// CUDA: `cuMemAddressReserve(&ptr, size, align, hint, 0)`. Host: `mmap(PROT_NONE,
    /// MAP_NORESERVE | MAP_FIXED_NOREPLACE)`.
    ///
    /// # Safety
    /// None beyond the arguments being as documented; marked unsafe because it edits the address
    /// space of the process.
    unsafe fn reserve(&self, hint: Option<usize>, size: usize, align: usize) -> Result<usize>;

    /// Releases a whole reservation made by [`Backend::reserve`]; nothing inside is mapped.
    ///
    /// CUDA: `cuMemAddressFree`. Host: `munmap`.
    ///
    /// # Safety
    /// `[addr, addr+size)` is exactly one live reservation with no mappings left inside.
    unsafe fn release(&self, addr: usize, size: usize) -> Result<()>;

    /// Releases a whole reservation together with its mapped runs `mapped` (`(start, end)`
    /// pairs inside it). Default: [`Backend::unmap`] each run, then [`Backend::release`]. A
    /// platform that can drop both at once overrides it so that freeing needs no new resources.
    ///
    /// CUDA: `cuMemUnmap` of each run, then `cuMemAddressFree`. Host: one `munmap(2)`, which
    /// works even past `vm.max_map_count`, where an unmap through `mmap(MAP_FIXED)` is refused.
    ///
    /// # Safety
    /// `[addr, addr+size)` is exactly one live reservation and `mapped` are all its mapped runs.
    unsafe fn release_mapped(
        &self,
        addr: usize,
        size: usize,
        mapped: &[(usize, usize)],
    ) -> Result<()> {
        for &(s, e) in mapped {
            // SAFETY: every page of a mapped run is mapped.
            unsafe { self.unmap(s, e - s)? };
        }
        // SAFETY: nothing inside is mapped any more.
        unsafe { self.release(addr, size) }
    }

    /// Creates a physical memory object of `size` bytes at `location`.
    ///
    /// CUDA: one `cuMemCreate` of the whole size with `CU_MEM_LOCATION_TYPE_DEVICE` (or
    /// `_HOST_NUMA`) and a POSIX-fd shareable handle type. Host: `memfd_create` + `ftruncate` + `F_ADD_SEALS(GROW|SHRINK|SEAL)`;
    /// of a 2 MiB multiple, a hugetlbfs memfd while reserved huge pages are free (see the host
    /// backend's `hugetlb` module: it becomes shmem at the first use of a piece).
    fn create_physical(&self, location: PhysicalLocation, size: usize) -> Result<RawPhysical>;

    /// Destroys a physical memory object.
    ///
    /// CUDA: `cuMemRelease`. Host: `close`.
    ///
    /// # Safety
    /// `raw` came from [`Backend::create_physical`], is not mapped anywhere, and is not used again.
    unsafe fn destroy_physical(&self, raw: RawPhysical);

    /// Maps `[phys_offset, phys_offset+size)` of `raw` at `addr` with protection `prot`.
    ///
    /// CUDA: `cuMemMap(addr, size, phys_offset, raw, 0)` then `cuMemSetAccess`. Host:
    /// `mmap(addr, size, prot, MAP_SHARED | MAP_FIXED, memfd, phys_offset)`.
    ///
    /// # Safety
    /// `[addr, addr+size)` lies in a live reservation and is currently unmapped; the offset range
    /// lies inside the physical object.
    unsafe fn map(
        &self,
        addr: usize,
        size: usize,
        raw: RawPhysical,
        phys_offset: usize,
        prot: Protection,
    ) -> Result<()>;

    /// Maps a piece of an IPC view ([`crate::semantics::ipc::views`]): as [`Backend::map`], but
    /// the page-table entries are filled on first touch, not in the call. A view shows memory
    /// another process (or the exporting context) owns: filling its page table at every open
    /// would allocate every page of the exported objects that nobody touched and cost 512
    /// entries per 2 MiB on every open (an importer that reads two pages of each object pays
    /// two faults instead).
    ///
    /// CUDA: as [`Backend::map`] (the GPU's page tables have no lazy fill). Host:
    /// `mmap(addr, size, prot, MAP_SHARED | MAP_FIXED, memfd, phys_offset)` without
    /// `MAP_POPULATE`.
    ///
    /// # Safety
    /// As [`Backend::map`].
    unsafe fn map_view(
        &self,
        addr: usize,
        size: usize,
        raw: RawPhysical,
        phys_offset: usize,
        prot: Protection,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.map(addr, size, raw, phys_offset, prot) }
    }

    /// Unmaps `[addr, addr+size)`, which stays reserved and inaccessible. The range may be any
    /// page-aligned sub-range of earlier [`Backend::map`] ranges, and may span several of them;
    /// a platform that can only unmap whole mappings (CUDA) first splits a mapping the range
    /// covers in part (see the cuda backend's module docs).
    ///
    /// CUDA: `cuMemUnmap` of each whole mapping (after a split where needed). Host: `mmap(PROT_NONE, MAP_FIXED |
    /// MAP_NORESERVE)` over the range, which puts the placeholder back.
    ///
    /// # Safety
    /// Every page of the range is mapped.
    unsafe fn unmap(&self, addr: usize, size: usize) -> Result<()>;

    /// Allocates `size` bytes of USM memory at `location`, readable and writable from the host,
    /// at an address aligned to `align` (a power of two, at least the OS page); `size` is a
    /// multiple of the OS page. Returns the address and the backend's handle.
    ///
    /// CUDA: `cuMemAlloc` (device), `cuMemAllocHost` (host), `cuMemAllocManaged` (shared).
    /// Host: a sealed memfd (`memfd_create`, `ftruncate`, `F_ADD_SEALS`) mapped `MAP_SHARED`
    /// read-write over an aligned placeholder (`mmap(MAP_FIXED)`).
    fn alloc(
        &self,
        location: AllocLocation,
        size: usize,
        align: usize,
    ) -> Result<(usize, RawAllocation)>;

    /// Frees an allocation made by [`Backend::alloc`].
    ///
    /// CUDA: `cuMemFree` / `cuMemFreeHost`. Host: `munmap` + `close`.
    ///
    /// # Safety
    /// `(addr, size, raw)` is exactly what one live [`Backend::alloc`] returned and was given;
    /// nothing uses the memory afterwards.
    unsafe fn free_alloc(&self, addr: usize, size: usize, raw: RawAllocation);

    /// The protection of the process's own memory `[addr, addr+size)`: `None` if any byte of it
    /// is not mapped; otherwise the weakest protection over the range (`Protection::None` if
    /// any page cannot be read, `ReadOnly` if any cannot be written). Reads platform state
    /// only; used to vet imports of system memory.
    ///
    /// CUDA and host: `/proc/self/maps`.
    fn query_host_protection(&self, addr: usize, size: usize) -> Option<Protection> {
        platform::host_protection(addr, size)
    }

    /// Makes system memory `[addr, addr+size)` (page-aligned, mapped, not registered yet)
    /// reachable by the devices, read-only for them if `read_only`. The memory itself is not
    /// changed.
    ///
    /// CUDA: `cuMemHostRegister` (`CU_MEMHOSTREGISTER_READ_ONLY` if `read_only`). Host: nothing
    /// to do, devices are threads of this process.
    fn register_host(&self, addr: usize, size: usize, read_only: bool) -> Result<()>;

    /// Undoes [`Backend::register_host`]; the memory and its contents stay.
    ///
    /// CUDA: `cuMemHostUnregister`. Host: nothing.
    ///
    /// # Safety
    /// The range was registered and nothing on a device uses it any more.
    unsafe fn unregister_host(&self, addr: usize, size: usize);

    /// Makes a new engine (an in-order execution stream) on device `device`. Each command queue
    /// and immediate command list gets its own, so a device has as many engines as queues.
    ///
    /// CUDA: `cuStreamCreate(CU_STREAM_NON_BLOCKING)` in the device's primary context. Host: a
    /// worker thread (`std::thread::spawn`).
    fn create_engine(&self, device: u32) -> Result<Box<dyn Engine>>;

    /// Makes a synchronisation object, not signalled, for an event or a fence.
    ///
    /// CUDA: `cuEventCreate(CU_EVENT_DISABLE_TIMING)`. Host: a flag and a condition variable.
    fn create_sync(&self) -> Result<std::sync::Arc<dyn EngineSync>>;

    /// Changes the protection of mapped pages `[addr, addr+size)`.
    ///
    /// CUDA: `cuMemSetAccess`. Host: `mprotect`.
    ///
    /// # Safety
    /// Every page of the range is mapped.
    unsafe fn protect(&self, addr: usize, size: usize, prot: Protection) -> Result<()>;

    /// The managed-memory residency of this platform ([`managed::ManagedResidency`]), made
    /// once per driver on the first managed allocation, migrating pages of `page_size` bytes
    /// and charging device pages to `room` (the semantics layer's device accounting); `Err`
    /// says why this platform cannot provide it (the semantics layer turns it into
    /// `ACL_ERROR_RT_FEATURE_NOT_SUPPORT`).
    ///
    /// CUDA: the device's `CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY` and
    /// `CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS` (migration on fault), the driver
    /// migrating. Host: the residency engine of `host::residency` (a software UVM driver) over
    /// `userfaultfd(2)` with write-protect support (`host::managed`).
    fn managed(
        &self,
        page_size: usize,
        room: std::sync::Arc<dyn managed::DeviceRoom>,
    ) -> std::result::Result<std::sync::Arc<dyn managed::ManagedResidency>, String> {
        let _ = (page_size, room);
        Err(format!("the {} backend has no managed memory", self.name()))
    }

    /// The shareable handles of a physical object, in order: consecutive parts that together
    /// hold the whole object, each an fd owned by the caller with the bytes it holds, valid
    /// after the object is destroyed (each keeps its memory alive). Used by IPC exports
    /// ([`crate::ipc`]).
    ///
    /// `covered` says what the importer will map. Empty: a physical object's handle, whose
    /// importer may map any page-aligned piece of any part. Otherwise a range handle's: the
    /// byte ranges `(offset, len)` of the object (page-aligned, in any order, possibly
    /// overlapping) that its pieces cover; the caller cuts every piece from these ranges at the
    /// parts' boundaries and sends only the parts a piece names (the others it closes). A part
    /// may then have to be mapped whole: only where every covered range that touches it covers
    /// it entirely, so that every piece cut from it is the whole part.
    ///
    /// CUDA: one `cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR)` part per allocation of
    /// the object; an allocation that a piece needs only part of is split into one per granule
    /// first, and one that a range handle sends whole is never split afterwards (see the cuda
    /// backend's docs, "IPC"). Host: one part, `fcntl(F_DUPFD_CLOEXEC)` of the memfd
    /// (`covered` is not needed: a memfd maps at any offset).
    fn export_physical(
        &self,
        raw: RawPhysical,
        covered: &[(usize, usize)],
    ) -> Result<Vec<SharedPart>>;

    /// The shareable handles of a USM allocation's memory, as [`Backend::export_physical`];
    /// an importer maps each part whole.
    ///
    /// CUDA: device memory, `cuMemExportToShareableHandle` of its allocation (host and shared
    /// USM memory have none: `Unsupported`). Host: one part, `fcntl(F_DUPFD_CLOEXEC)` of the
    /// allocation's memfd.
    fn export_allocation(&self, raw: RawAllocation) -> Result<Vec<SharedPart>>;

    /// Turns parts made by an export (of this or another process) into one physical object of
    /// their summed size that [`Backend::map`] can map and [`Backend::destroy_physical`]
    /// releases; mappings made from it stay valid after that release. The sizes are what the
    /// exporter said; memory smaller than its claimed size fails here or at map.
    ///
    /// CUDA: `cuMemImportFromShareableHandle` of each part (the fds are closed afterwards).
    /// Host: exactly one part, whose fd it takes.
    fn import_physical(&self, parts: Vec<SharedPart>) -> Result<RawPhysical>;

    /// Bytes device `device` has free as its driver counts them (other processes' memory
    /// included), or `None` where the backend's devices are modelled and the semantics layer's
    /// capacity accounting is the answer. Host: `None`. CUDA: `cuMemGetInfo` in the device's
    /// context.
    fn device_free_memory(&self, _device: u32) -> Result<Option<u64>> {
        Ok(None)
    }

    /// Whether the host can read and write device memory (device USM allocations, physical
    /// memory on a device mapped in a reservation) through its addresses. Host: yes (device
    /// memory is process memory). CUDA: no (GPU memory; the host reaches it only through
    /// engine copies), so host-synchronous calls on it go through an engine.
    fn device_memory_host_accessible(&self) -> bool {
        true
    }

    /// Whether two shareable handles of the same memory can be recognised as such from the fds
    /// alone ([`Backend::shareable_identity`]). Host: yes (a memfd's device and inode).
    /// CUDA: no (every exported fd is a descriptor of `/dev/nvidiactl` with the same identity),
    /// so IPC handles go through the broker and an fd cannot be traced back to its export.
    fn shareable_fds_have_identity(&self) -> bool {
        true
    }

    /// The host's NUMA nodes, ascending (`[0]` if none is listed): the ids a host-NUMA location
    /// accepts. Never fails. CUDA and host: the entries `node<N>` of `/sys/devices/system/node`.
    fn numa_nodes(&self) -> Vec<u32> {
        platform::numa_nodes()
    }

    /// The NUMA node of the CPU the calling thread runs on (0 if unknown). Never fails.
    /// CUDA and host: `getcpu(2)`.
    fn current_numa_node(&self) -> u32 {
        platform::current_numa_node()
    }

    /// Starts this process's IPC broker unless it runs already, serving each request with the
    /// handler `make_handler` gives (called once, when the broker starts), and returns the
    /// broker's nonce (published in every handle, so that nobody can bind its name first).
    /// A broker that fails to start is not remembered: the next call tries again.
    ///
    /// CUDA and host: an abstract `SOCK_SEQPACKET` Unix socket named after the pid and nonce,
    /// served by a thread; peers of another uid are dropped unread.
    fn start_broker(&self, make_handler: &dyn Fn() -> BrokerHandler) -> Result<u32> {
        platform::start_broker(make_handler)
    }

    /// Asks process `pid`'s broker (started with `nonce`) about `request` and collects the whole
    /// answer, accepting at most `max_payload` bytes and `max_fds` handles. The request is sent
    /// only to a broker run by process `pid` under our uid.
    ///
    /// CUDA and host: `connect(2)` + `SO_PEERCRED` check, `sendmsg`, `recvmsg` with
    /// `SCM_RIGHTS`.
    fn broker_request(
        &self,
        pid: u32,
        nonce: u32,
        request: &[u8; 64],
        max_payload: usize,
        max_fds: usize,
    ) -> std::result::Result<BrokerAnswer, TransportError> {
        platform::broker_request(pid, nonce, request, max_payload, max_fds)
    }

    /// The state of this process's broker (zeros where none was started).
    fn broker_stats(&self) -> BrokerStats {
        platform::broker_stats()
    }

    /// The name of process `pid`'s broker started with `nonce`, for messages.
    fn broker_name(&self, pid: u32, nonce: u32) -> String {
        platform::broker_name(pid, nonce)
    }

    /// 16 random bytes for an export's secret token. CUDA and host: `getrandom(2)`.
    fn random_token(&self) -> Result<[u8; 16]> {
        platform::random_token()
    }

    /// The identity of a shareable handle, or `None` if `fd` is not open.
    /// CUDA and host: `fstat(2)`.
    fn shareable_identity(&self, fd: BorrowedFd<'_>) -> Option<ShareableIdentity> {
        platform::shareable_identity(fd)
    }

    /// Checks a shareable handle received from another process (or found in a handle's bytes)
    /// before anything is mapped from it: it must be memory this backend can import, holding at
    /// least `need` bytes, whose size nobody can change. `Err` says what is wrong.
    ///
    /// Host: a memfd sealed against grow and shrink (`fcntl(F_GET_SEALS)`, `fstat`). CUDA: what
    /// `cuMemImportFromShareableHandle` accepts, of at least `need` bytes.
    fn check_shareable(&self, fd: BorrowedFd<'_>, need: u64) -> std::result::Result<(), String>;

    /// A file descriptor holding `bytes` that nobody can change, for an export on a backend
    /// whose shareable fds carry no identity ([`Backend::shareable_fds_have_identity`]): the
    /// fd `zeMemGetFileDescriptorFromIpcHandleExp` gives, from which another process reads
    /// the handle back ([`Backend::read_description`]). CUDA and host: a memfd sealed against
    /// write, grow and shrink (`memfd_create(2)`, `write(2)`, `fcntl(F_ADD_SEALS)`).
    fn describe_export(&self, bytes: &[u8]) -> Result<OwnedFd> {
        platform::sealed_bytes(bytes)
    }

    /// The bytes of an fd [`Backend::describe_export`] made (here or in another process), at
    /// most `max`; `Err` says why `fd` is not one. CUDA and host: `fcntl(F_GET_SEALS)` (sealed
    /// against write, grow and shrink), `fstat(2)`, `pread(2)`.
    fn read_description(
        &self,
        fd: BorrowedFd<'_>,
        max: usize,
    ) -> std::result::Result<Vec<u8>, String> {
        platform::read_sealed(fd, max)
    }

    /// A close-on-exec duplicate of a shareable handle. CUDA and host: `fcntl(F_DUPFD_CLOEXEC)`.
    fn dup_shareable(&self, fd: BorrowedFd<'_>) -> Result<OwnedFd> {
        platform::dup(fd, "a shareable handle")
    }

    /// Writes `bytes` as this process's record `name` (replacing one of that name at once),
    /// which processes of the same user read with [`Backend::read_record`]; it lasts until
    /// [`Backend::remove_record`] or this process's exit. Used for ACL shareable handles.
    ///
    /// CUDA and host: a file `/dev/shm/<name>` (`/tmp` without `/dev/shm`), mode 0600, made
    /// fresh (`O_CREAT | O_EXCL | O_NOFOLLOW`) under `<name>.tmp` and `rename(2)`d; removed at
    /// exit by an `atexit(3)` handler. A failure is `OutOfHostMemory` naming the file.
    fn write_record(&self, name: &str, bytes: &[u8]) -> Result<()> {
        platform::write_record(name, bytes)
    }

    /// The bytes of record `name` (written by any process of our user); `Err` says why it cannot
    /// be read (none, another user's, unreadable). CUDA and host: `open(O_NOFOLLOW)`, `fstat`,
    /// `read`.
    fn read_record(&self, name: &str) -> std::result::Result<Vec<u8>, String> {
        platform::read_record(name)
    }

    /// Removes record `name` of this process (nothing if there is none). CUDA and host:
    /// `unlink(2)`.
    fn remove_record(&self, name: &str) {
        platform::remove_record(name)
    }
}
