//! # hetmem
//!
//! A heterogeneous-memory runtime: the memory parts of Level Zero (virtual memory, physical
//! memory, and the memory extensions) and of ACL managed memory, with their exact semantics,
//! over a **host** backend (any Linux: real `mmap`, `memfd`, `mprotect`) and a **cuda** backend.
//!
//! # Layers
//!
//! Data flows one way, each layer calling only the one below, each a folder of `src/`:
//!
//! ```text
//! api/        the safe front: Runtime, Driver, Device, Context, and one public module per family
//!             (vmm, usm, queue, ipc, managed, acl, platform) with its types and the thin
//!             `impl Context` of its calls. The C ABI crates (hetmem-ze, hetmem-acl) sit here.
//! spec.rs     every spec enumeration, flag set and structure-type constant with its decoder
//!             (what a C ABI turns descriptors and pNext chains into)
//! semantics/  every rule of the specs, once: validation, the choice of each error code, all
//!             bookkeeping (ranges, mappings, access, capacity, in-flight work, free policies,
//!             the IPC handle format, managed advice records and the range attributes, the
//!             stream holds a managed free waits for). No OS call, no backend named; its
//!             modules import each other without a cycle.
//! backend/    the trait a platform implements (`backend::Backend`, `backend::ipc`, and
//!             `backend::managed::ManagedResidency`, managed residency at the level of a
//!             unified-memory driver: allocate, free, prefetch, advise, prepare / release for
//!             device work, device and host copies and fills): raw operations, minimal
//!             validation, failures as the backend's own `HalError` (`ResidencyError`),
//!             converted to the spec `Error` in one place each. Each method's docs name the
//!             CUDA driver call a GPU backend makes.
//! backend/host/  the host backend (rustix, one wrapper per call, man pages named): mmap /
//!             memfd / mprotect, worker threads as engines, and a software UVM driver for
//!             managed memory (the residency engine of `residency.rs`: pages, device slots, LRU
//!             eviction, pins, host faults, over the userfaultfd wrappers of `managed.rs`).
//! backend/cuda/  the cuda backend (the CUDA driver API through cudarc, loaded at run time, one
//!             wrapper per driver call): cuMemAddressReserve / cuMemCreate / cuMemMap /
//!             cuMemSetAccess, cuMemHostAlloc / cuMemAllocManaged / cuMemHostRegister, streams.
//! backend/platform.rs  the Linux platform layer in the backend's terms (errors, protections).
//! hetmem-linux (its own crate, below every backend): what both backends share on Linux, one
//!             wrapper per syscall or file read: machine facts, NUMA, /proc/self/maps, errno
//!             classification, the SCM_RIGHTS broker, the /dev/shm records of ACL shareable
//!             handles, the copy engine's streaming copy. It and the two backend folders are the
//!             only places that make OS or driver calls; only `backend/` names it or `std::os`.
//! ```
//!
//! Why this cut: it is wgpu's (`wgpu` / `wgpu-core` / `wgpu-hal`). The semantics layer must give
//! the same answer to the same call on every backend and through every front (Rust, Level Zero
//! C, ACL C), so it is the one place that validates and tracks resources; a backend that chose a
//! code, or a front that checked an argument, would let two fronts disagree. The backend trait is
//! shaped by what both Linux and the CUDA driver can do, so the `cuda/` folder beside `host/`
//! implements it without touching anything above. `tests/layering.rs` checks the direction.
//!
//! ```
//! use hetmem::{AccessAttribute, PhysicalMemoryFlags, Runtime};
//! let rt = Runtime::builder().host_devices(1).host_device_memory(64 << 20).build()?;
//! let dev = rt.driver().device(0).unwrap();
//! let ctx = rt.driver().create_context()?;
//! let page = ctx.query_page_size(&dev, 4 << 20)?; // 2 MiB
//! let r = ctx.reserve(None, 2 * page)?;
//! let phys = ctx.create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, page)?;
//! ctx.map(r.base, page, phys, 0, AccessAttribute::ReadWrite)?;
//! unsafe { r.as_ptr().write(42) };
//! assert_eq!(ctx.get_access_attribute(r.base, 2 * page)?, (AccessAttribute::ReadWrite, page));
//! ctx.free_reservation(r)?; // unmaps too
//! ctx.destroy_physical_memory(phys)?;
//! # Ok::<(), hetmem::Error>(())
//! ```

pub mod api;
pub mod backend;
mod config;
pub mod error;
mod semantics;
pub mod spec;

// The public module of each family (its types, and the `impl Context` methods of its calls).
pub use api::{acl, ipc, managed, platform, queue, usm, vmm};
pub use semantics::acl_ext;
pub use semantics::acl_vmm;
/// Range bookkeeping (sorted non-overlapping ranges with split and merge), used by the
/// semantics layer; public for its property tests and benchmarks.
pub use semantics::ranges;

pub use api::runtime::{Context, Device, Driver, Runtime, RuntimeBuilder};
pub use config::{parse_bytes, Adjustment, BackendConfig, BackendKind, HostConfig};
pub use error::{AclCode, Error, Result};
pub use ipc::{IpcHandle, IpcHandleKind, IpcHandleTypes, IpcProperties};
pub use managed::{
    Advice, DeviceBuffer, Location, ManagedDeviceStats, ManagedStats, RangeAttribute, Residency,
    Stream, ACL_RT_MEM_ATTACH_GLOBAL, MANAGED_PAGE_SIZE,
};
pub use queue::{
    CommandList, CommandListDesc, CommandQueue, CommandQueueDesc, Event, EventPool, Fence,
    FreePolicy, QueueMode, QueuePriority, SyncStatus, MAX_FILL_PATTERN_SIZE, QUEUES_PER_GROUP,
};
pub use spec::{FlagSet, MemoryAdvice};
pub use usm::{AllocDesc, AllocationProperties, CompressionHint, MemoryType, UsmStats};
pub use vmm::{
    page_size_for, AccessAttribute, DeviceUsage, PhysicalMemory, PhysicalMemoryFlags, Reservation,
    VmStats,
};
