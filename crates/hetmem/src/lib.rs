//! # hetmem
//!
//! A heterogeneous-memory runtime: the memory parts of Level Zero (virtual memory, physical
//! memory, and the memory extensions) and of ACL managed memory, with their exact semantics,
//! over a **host** backend (any Linux: real `mmap`, `memfd`, `mprotect`) and a **cuda** backend.
//!
//! Layers, each calling only the one below:
//! - safe API: [`Runtime`], [`Driver`], [`Device`], [`Context`];
//! - semantics ([`vmm`] for virtual memory, [`usm`] for host / device / shared allocations,
//!   imports of system memory and their queries, [`managed`] for ACL managed memory with
//!   fault-driven migration): every spec rule, validation, error selection and bookkeeping;
//! - backend trait ([`backend::Backend`]): raw operations, no spec logic;
//! - backends ([`backend::host`]).
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

pub mod backend;
mod capacity;
pub mod driver;
pub mod error;
pub mod ipc;
pub mod managed;
pub mod platform;
pub mod queue;
pub mod ranges;
pub mod usm;
pub mod vmm;

pub use driver::{
    parse_bytes, BackendConfig, BackendKind, Context, Device, Driver, HostConfig, Runtime,
    RuntimeBuilder,
};
pub use error::{Error, Result};
pub use ipc::{IpcHandle, IpcHandleKind, IpcHandleTypes, IpcProperties};
pub use managed::{
    Advice, DeviceBuffer, Location, ManagedDeviceStats, ManagedStats, RangeAttribute, Residency,
    Stream, ACL_RT_MEM_ATTACH_GLOBAL, MANAGED_PAGE_SIZE,
};
pub use queue::{
    CommandList, CommandQueue, Event, Fence, FreePolicy, SyncStatus, MAX_FILL_PATTERN_SIZE,
};
pub use usm::{AllocDesc, AllocationProperties, CompressionHint, MemoryType, UsmStats};
pub use vmm::{
    page_size_for, AccessAttribute, DeviceUsage, PhysicalMemory, PhysicalMemoryFlags, Reservation,
    VmStats,
};
