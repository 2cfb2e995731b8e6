//! The public module of this family: its types (from the semantics module of the same name,
//! where the rules live: `semantics/managed/`, one file per group of spec functions) and the
//! calls, as methods of [`crate::Context`], [`crate::Driver`] and [`Stream`], each one call
//! into that module.

pub use crate::api::platform::{current_numa_node, numa_nodes};
use crate::api::runtime::{Context, Device, Driver};
use crate::error::Result;
use crate::semantics::managed as sm;
pub use crate::semantics::managed::alloc::{ManagedDeviceStats, ManagedStats};
pub use crate::semantics::managed::host::Residency;
pub use crate::semantics::managed::state::{MANAGED_PAGE_SIZE, MAX_MANAGED_PER_PROCESS};
pub use crate::semantics::managed::stream::DeviceBuffer;
pub use crate::spec::{location_type, Advice, Location, RangeAttribute, ACL_RT_MEM_ATTACH_GLOBAL};

/// An in-order stream on one device (`aclrtStream`), on the device queue machinery (one engine
/// of the device, as a [`crate::CommandQueue`] has): prefetches, copies, fills and launched work
/// run in submission order, on the device's engine. Dropping it (`aclrtDestroyStream`) waits
/// for its work.
#[derive(Debug)]
pub struct Stream {
    // Dropped first: the engine runs what is queued, then joins, before the context goes.
    inner: sm::stream::ManagedStream,
    device: Device,
    _ctx: Context,
}

impl Stream {
    /// The device the stream runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Discards the work queued on the stream that has not started (`aclrtDestroyStreamForce`:
    /// "discard all tasks"): each queued copy, fill or launch is dropped unrun and releases
    /// the memory it held (its managed holds and in-flight references); work already running
    /// finishes. Work submitted after the call runs as usual. Never fails.
    pub fn discard_queued(&self) {
        self.inner.discard_queued();
    }

    /// Waits for everything submitted before (`aclrtSynchronizeStream`).
    ///
    /// Errors: the first error of the work since the last synchronize (e.g. `OutOfDeviceMemory`
    /// when a device full of non-managed memory could not take a page); the stream stays
    /// usable. Managed memory is never freed under queued work ([`Context::free_managed`]
    /// waits for it).
    pub fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }

    /// Stream-ordered `aclrtMemcpyAsync` of `count` bytes (overlap behaves as `memmove`),
    /// executed by the stream's device. Each side is either managed memory (the range inside
    /// one managed allocation; its pages migrate to the stream's device first, as any device
    /// access) or memory the driver knows, used in place: a USM allocation or import, an
    /// opened IPC view, or mapped virtual memory with the access the copy needs (the rules of
    /// [`crate::queue`]), held in flight until the copy has run. At least one side must be
    /// managed (a copy between two USM ranges is a command list's job).
    ///
    /// Errors (nothing queued): `ACL_ERROR_INVALID_PARAM` (100000); `ACL_ERROR_RT_PARAM_INVALID` (107000) for
    /// a managed range running past its allocation or when neither side is managed memory;
    /// `ACL_ERROR_RT_PARAM_INVALID` (107000) for a non-managed side that is not memory the driver knows
    /// (or read-only memory as the destination).
    pub fn memcpy_async(&self, dst: usize, src: usize, count: usize) -> Result<()> {
        self.inner.memcpy_async(dst, src, count)
    }

    /// Stream-ordered `aclrtMemsetAsync`: `count` bytes at `ptr` (inside one managed
    /// allocation; any alignment) set to `value`, by the stream's device (the pages migrate
    /// there first). Run-time errors (e.g. `OutOfDeviceMemory` when the device is full of
    /// pages in use by running work) are reported by [`Stream::synchronize`].
    ///
    /// Errors (nothing queued): `ACL_ERROR_INVALID_PARAM` (100000); `ACL_ERROR_RT_PARAM_INVALID` (107000) for
    /// a range not inside one managed allocation.
    pub fn memset_async(&self, ptr: usize, value: u8, count: usize) -> Result<()> {
        self.inner.memset_async(ptr, value, count)
    }

    /// Launches device work (what `aclrtLaunchKernel` runs; hetmem's stand-in for a kernel)
    /// that uses `buffers` (`(ptr, len, write)` in bytes, any alignment, each inside one managed
    /// allocation): when the stream reaches it, every page of every buffer is migrated to the
    /// stream's device (written buffers exclusively) and **pinned** there, then `work` runs on
    /// the device's engine, with no lock held, with the device address of each buffer,
    /// contiguous; the pins drop when it returns. The whole working set must fit in the device
    /// next to the pages other running work has pinned there. `work` stands for a device
    /// kernel: it must reach managed memory only through the buffers it is given.
    ///
    /// While `work` runs (the host backend's pins): host faults and other managed
    /// calls on other pages proceed; a host access to one of its pages waits until `work`
    /// returns (the fault thread keeps serving other faults); prefetches, advice, frees and
    /// device operations that would move its pages wait too, while other work that needs its
    /// pages where they are (same device, no change) runs alongside. So `work` must not wait
    /// for a host thread that touches its own buffers through the managed pointer, nor call
    /// hetmem functions that move them (each would wait for the other).
    ///
    /// On the cuda backend, which runs no kernels, `work` is a host function in stream order:
    /// it gets the managed addresses themselves, the driver migrates the pages it touches to
    /// the host, and hetmem's residency record says so afterwards (nothing is pinned).
    ///
    /// Errors (nothing queued): `InvalidNullPointer`; `AddressNotFound`. At run time (reported
    /// by [`Stream::synchronize`]): `OutOfDeviceMemory` if the buffers do not fit in the device
    /// together (`work` does not run); `Unknown` if `work` panicked (the stream stays usable).
    pub fn launch(
        &self,
        buffers: &[(usize, usize, bool)],
        work: impl FnOnce(&[DeviceBuffer]) + Send + 'static,
    ) -> Result<()> {
        self.inner.launch(buffers, work)
    }
}

impl Context {
    /// Allocates `size` bytes of managed memory (`aclrtMemAllocManaged`), rounded up to a
    /// multiple of 2 MiB, 2 MiB-aligned, reachable from the host and every device. Pages are
    /// populated on first touch (contents not initialised; fresh pages read zero here).
    ///
    /// Errors: `ACL_ERROR_INVALID_PARAM` (100000) unless `flag` is [`ACL_RT_MEM_ATTACH_GLOBAL`];
    /// `ACL_ERROR_INVALID_PARAM` (100000) for 0; `ACL_ERROR_RT_PARAM_INVALID` (107000) over 3 TiB; `OutOfHostMemory`
    /// (207001) if the process would hold over 3 TiB of managed memory or the OS refuses;
    /// `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000) where the platform cannot migrate on faults (the message
    /// says why).
    pub fn alloc_managed(&self, size: u64, flag: u32) -> Result<usize> {
        sm::alloc::allocate(self.driver_shared(), self.id(), size, flag)
    }

    /// Frees managed memory (`aclrtFree`): `ptr` must be the base of a live managed allocation
    /// of this context. Stream work queued on it first runs (prefetches, copies, fills and
    /// launched work queued before the free on any stream: the free waits for them, with no
    /// lock held meanwhile, so their synchronize succeeds); then its pages leave every device.
    /// Work queued on it afterwards is refused when queued (107000).
    ///
    /// Errors (nothing freed): `ACL_ERROR_INVALID_PARAM` (100000); `ACL_ERROR_RT_PARAM_INVALID` (107000) for any
    /// other pointer (interior, unknown, freed, another context's); `UnsupportedFeature`
    /// (207000) where managed memory is unavailable.
    pub fn free_managed(&self, ptr: usize) -> Result<()> {
        sm::alloc::free(self.driver_shared(), self.id(), ptr)
    }

    /// Whether the byte at `ptr` is inside a live managed allocation of this driver (any
    /// context): the "pointer inside managed memory" check of `aclrtMemManagedAdvise`,
    /// `aclrtMemManagedPrefetchAsync` and `aclrtMemManagedGetAttr` (107000 when false), as a
    /// query of hetmem's own (the spec has no call for it). Any alignment; never fails (false
    /// before the first managed allocation).
    pub fn is_managed(&self, ptr: usize) -> bool {
        sm::alloc::is_managed(self.driver_shared(), ptr)
    }

    /// Host-synchronous `aclrtMemset`: sets `count` bytes at `ptr` (inside one managed
    /// allocation; any alignment, `count` 0 allowed) to `value` from the calling thread; the
    /// pages migrate to the host.
    ///
    /// Errors (nothing written): `ACL_ERROR_INVALID_PARAM` (100000); `ACL_ERROR_RT_PARAM_INVALID` (107000) for a
    /// range not inside one managed allocation (or overflowing); `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000)
    /// where managed memory is unavailable.
    pub fn managed_memset(&self, ptr: usize, value: u8, count: usize) -> Result<()> {
        sm::host::memset(self.driver_shared(), ptr, value, count)
    }

    /// Host-synchronous `aclrtMemcpy` of `count` bytes (overlap behaves as `memmove`) by the
    /// calling thread, a host access: managed pages migrate to the host. Each side is managed
    /// memory (inside one managed allocation) or plain process memory that is mapped readable
    /// (`src`) / writable (`dst`) for the whole range, checked against `/proc/self/maps`: host
    /// buffers, USM host / device / shared allocations, imports. A plain side the host cannot
    /// reach that is device memory of this driver (the cuda backend's device allocations,
    /// mappings and views) is checked as a queue operand, held against frees, and the copy is
    /// then done by the device that owns it (`ManagedResidency::device_copy`, synchronously),
    /// so the managed pages go to that device instead. At least one side must be managed.
    ///
    /// Errors (nothing copied): `ACL_ERROR_INVALID_PARAM` (100000); `ACL_ERROR_RT_PARAM_INVALID` (107000) for a
    /// managed range running past its allocation, a plain range that is not mapped with the
    /// access needed or runs into managed memory, or when neither side is managed.
    pub fn managed_memcpy(&self, dst: usize, src: usize, count: usize) -> Result<()> {
        sm::ops::memcpy(self.driver_shared_arc(), dst, src, count)
    }

    /// Host-synchronous `aclrtMemcpy` of `count` bytes between any two kinds of memory (overlap
    /// behaves as `memmove`), by the calling thread. If either side is managed memory this is
    /// [`Context::managed_memcpy`]. Otherwise each side must be plain process memory mapped
    /// readable (`src`) / writable (`dst`) for the whole range: host buffers, USM host / device
    /// / shared allocations, imports, mapped virtual memory, opened IPC views (on the host
    /// backend device memory is process memory). A side the host cannot reach that is device
    /// memory of this driver (the cuda backend's device allocations, mappings and views) is
    /// copied by the engine of the device that owns it instead (device 0 for a view), checked
    /// as a queue operand and held against frees until the copy has run; the other side may
    /// then be any host memory. A `count` of 0
    /// copies nothing (the pointers are still checked for null). Works where managed memory is
    /// unavailable.
    ///
    /// Errors (nothing copied): `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer;
    /// `ACL_ERROR_RT_PARAM_INVALID` (107000) for a range that is not mapped with the access
    /// needed, runs into managed memory or overflows; as [`Context::managed_memcpy`] when a side
    /// is managed.
    ///
    /// # Safety
    /// The checks above only prove the memory is mapped: the caller guarantees that `dst` may
    /// be written (no Rust reference, no other owner depends on those bytes) and that nothing
    /// writes `src` meanwhile. This is the C contract of `aclrtMemcpy`; a C ABI passes it on.
    pub unsafe fn host_memcpy(&self, dst: usize, src: usize, count: usize) -> Result<()> {
        // SAFETY: the caller's contract, passed on.
        unsafe { sm::ops::host_memcpy(self.driver_shared_arc(), dst, src, count) }
    }

    /// Host-synchronous `aclrtMemset` of `count` bytes at `ptr` to `value`, any memory: managed
    /// memory as [`Context::managed_memset`], otherwise plain process memory mapped writable
    /// for the whole range, or device memory of this driver the host cannot reach, filled by
    /// engine of the device that owns it (as [`Context::host_memcpy`]).
    ///
    /// Errors (nothing written): `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer;
    /// `ACL_ERROR_RT_PARAM_INVALID` (107000) for a range not mapped writable, running into
    /// managed memory or overflowing; as [`Context::managed_memset`] when `ptr` is managed.
    ///
    /// # Safety
    /// As [`Context::host_memcpy`]: the caller guarantees `[ptr, ptr + count)` may be written.
    pub unsafe fn host_memset(&self, ptr: usize, value: u8, count: usize) -> Result<()> {
        // SAFETY: the caller's contract, passed on.
        unsafe { sm::ops::host_memset(self.driver_shared_arc(), ptr, value, count) }
    }

    /// Host-synchronous copy of `data` into managed memory at `dst` (`aclrtMemcpy`,
    /// host-to-managed).
    ///
    /// Errors: as [`Context::managed_memset`].
    pub fn managed_write(&self, dst: usize, data: &[u8]) -> Result<()> {
        sm::host::write(self.driver_shared(), dst, data)
    }

    /// Host-synchronous copy of managed memory at `src` into `out` (`aclrtMemcpy`,
    /// managed-to-host).
    ///
    /// Errors: as [`Context::managed_memset`].
    pub fn managed_read(&self, src: usize, out: &mut [u8]) -> Result<()> {
        sm::host::read(self.driver_shared(), src, out)
    }

    /// Applies advice to `[ptr, ptr+size)` (`aclrtMemManagedAdvise`); see [`Advice`] for what
    /// each does. `location` is ignored by `SET_READ_MOSTLY` and `UNSET_PREFERRED_LOCATION`;
    /// `UNSET_READ_MOSTLY` takes INVALID as the host.
    ///
    /// Errors (nothing changed): `ACL_ERROR_INVALID_PARAM` (100000) for null / 0;
    /// `ACL_ERROR_RT_PARAM_INVALID` (107000) for a size that is not a multiple of 2 MiB or over 3 TiB;
    /// `ACL_ERROR_RT_PARAM_INVALID` (107000) unless the range is inside one managed allocation;
    /// `ACL_ERROR_RT_ADDR_UNALIGNED` (107008) for a pointer not 2 MiB-aligned; `InvalidArgument`
    /// (107000) for an INVALID location where one is needed, a device id that is not a device, a
    /// NUMA node that does not exist, or a preferred location refused because pages are mapped
    /// elsewhere; `ACL_ERROR_RT_MEMORY_ALLOCATION` (207001) if the device an eager step needs cannot take
    /// the pages (`SET_PREFERRED_LOCATION`: the whole range at once, next to the device's
    /// other memory and pages in use by running work; `UNSET_READ_MOSTLY` / `SET_ACCESSED_BY`
    /// to a device: not even one page, the device being full of memory that is not an
    /// evictable managed page); `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000) where managed memory is
    /// unavailable. Every refusal is decided before any page moves or any advice is recorded.
    /// Only a failure of the platform itself in the middle (the OS refusing a mapping) can
    /// leave pages moved; the advice is then still not recorded, `SET_READ_MOSTLY` takes its
    /// read-only copies back, and no data is lost.
    ///
    /// `ptr` and `size` in bytes, both multiples of 2 MiB ([`MANAGED_PAGE_SIZE`]).
    pub fn mem_advise(
        &self,
        ptr: usize,
        size: usize,
        advice: Advice,
        location: Location,
    ) -> Result<()> {
        sm::advice::advise(self.driver_shared(), ptr, size, advice, location)
    }

    /// Prefetches `[ptr, ptr+size)` to `location` in order on `stream`
    /// (`aclrtMemManagedPrefetchAsync`): when the stream reaches it, every page is migrated
    /// there (read-mostly pages get a read-only copy there, keeping the others; fresh pages are
    /// populated there). `LAST_PREFETCH_LOCATION` records the request at once.
    ///
    /// Errors (nothing queued or recorded): `ACL_ERROR_INVALID_PARAM` (100000) unless `flags` is 0;
    /// then as [`Context::mem_advise`] for pointer, size, range and alignment; `InvalidArgument`
    /// (107000) for an INVALID location, a bad device id or NUMA node; `InvalidArgument` for a
    /// stream of another driver. At run time (reported by [`Stream::synchronize`]):
    /// `ACL_ERROR_RT_MEMORY_ALLOCATION` (207001) if the device cannot take a single page (full of memory
    /// that is not an evictable managed page): nothing moves, `LAST_PREFETCH_LOCATION` keeps
    /// the request (it records requests, not completion). A free of the memory waits until the
    /// prefetch has run.
    ///
    /// `ptr` and `size` in bytes, both multiples of 2 MiB ([`MANAGED_PAGE_SIZE`]). A prefetch
    /// larger than the device leaves its last pages there (earlier ones are evicted).
    pub fn mem_prefetch(
        &self,
        ptr: usize,
        size: usize,
        location: Location,
        flags: u32,
        stream: &Stream,
    ) -> Result<()> {
        sm::prefetch::prefetch(
            self.driver_shared(),
            ptr,
            size,
            location,
            flags,
            &stream.inner,
        )
    }

    /// One attribute of `[ptr, ptr+size)` into `data` (`aclrtMemManagedGetAttr`), as native
    /// 32-bit integers; `data.len()` is `dataSize`. Every page the range overlaps counts; see
    /// [`RangeAttribute`] for the answers.
    ///
    /// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer; `ACL_ERROR_INVALID_PARAM` (100000) for size
    /// 0; `ACL_ERROR_RT_PARAM_INVALID` (107000) over 3 TiB or for a `dataSize` its attribute does not
    /// allow (4, or a non-zero multiple of 4 for ACCESSED_BY); `ACL_ERROR_RT_PARAM_INVALID` (107000)
    /// unless the range is inside one managed allocation (or `ptr + size` overflows);
    /// `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000) where managed memory is unavailable. Nothing is written on
    /// error. `size` in bytes, no alignment rule; any `dataSize` allowed is written in full
    /// (ACCESSED_BY padded with -2), without allocating.
    pub fn managed_get_attr(
        &self,
        attribute: RangeAttribute,
        ptr: usize,
        size: usize,
        data: &mut [u8],
    ) -> Result<()> {
        sm::attrs::get_attr(self.driver_shared(), attribute, ptr, size, data)
    }

    /// Several attributes at once (`aclrtMemManagedGetAttrs`): `data[i]` receives
    /// `attributes[i]`. All are checked before any is written.
    ///
    /// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for no attribute or a count mismatch; then as
    /// [`Context::managed_get_attr`] for each.
    pub fn managed_get_attrs(
        &self,
        attributes: &[RangeAttribute],
        ptr: usize,
        size: usize,
        data: &mut [&mut [u8]],
    ) -> Result<()> {
        sm::attrs::get_attrs(self.driver_shared(), attributes, ptr, size, data)
    }

    /// One 4-byte attribute as an `i32` (a convenience over [`Context::managed_get_attr`] with
    /// `dataSize` 4, `aclrtMemManagedGetAttr`). For ACCESSED_BY it gives the first slot (-2 if
    /// none). `size` in bytes, no alignment rule.
    ///
    /// Errors: as [`Context::managed_get_attr`]: `ACL_ERROR_INVALID_PARAM` (100000)
    /// for a null pointer / size 0; `ACL_ERROR_RT_PARAM_INVALID` (107000) over 3 TiB; `AddressNotFound`
    /// (107000) unless the range is inside one managed allocation; `UnsupportedFeature`
    /// (207000) where managed memory is unavailable.
    pub fn managed_attr_i32(
        &self,
        attribute: RangeAttribute,
        ptr: usize,
        size: usize,
    ) -> Result<i32> {
        sm::attrs::attr_i32(self.driver_shared(), attribute, ptr, size)
    }

    /// Most `slots` [`Context::managed_accessed_by`] answers (1 Mi entries, 4 MiB); larger
    /// buffers go through [`Context::managed_get_attr`], which writes the caller's buffer.
    pub const MAX_ACCESSED_BY_SLOTS: usize = sm::rules::MAX_ACCESSED_BY_SLOTS;

    /// ACCESSED_BY of `[ptr, ptr+size)` (`aclrtMemManagedGetAttr` with `dataSize` = `slots` *
    /// 4): the ids (device id, -1 host, NUMA node id) advised over the whole range, in `slots`
    /// entries, padded with -2 or truncated. `size` in bytes, no alignment rule.
    ///
    /// Errors: `ACL_ERROR_RT_PARAM_INVALID` (107000) for `slots` 0 (dataSize 0) or over
    /// [`Context::MAX_ACCESSED_BY_SLOTS`] (use [`Context::managed_get_attr`] with a buffer of
    /// your own for more); then as [`Context::managed_attr_i32`].
    pub fn managed_accessed_by(&self, ptr: usize, size: usize, slots: usize) -> Result<Vec<i32>> {
        sm::attrs::accessed_by(self.driver_shared(), ptr, size, slots)
    }

    /// Creates an in-order stream on `device` (`aclrtCreateStream` after `aclrtSetDevice`).
    ///
    /// Errors: `InvalidNullHandle` for a device of another driver; `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000)
    /// where managed memory is unavailable; `OutOfHostMemory` if the engine cannot start.
    pub fn create_stream(&self, device: &Device) -> Result<Stream> {
        Ok(Stream {
            inner: sm::stream::ManagedStream::create(
                self.driver_shared_arc(),
                &device.shared,
                device.ordinal(),
            )?,
            device: device.clone(),
            _ctx: self.clone(),
        })
    }

    /// Reads `out.len()` bytes of managed memory at `src` from wherever each page lives now,
    /// without migrating anything or counting a fault (for tests, debuggers and demos; the
    /// host-synchronous read is [`Context::managed_read`]). A page that has never been touched
    /// reads as zeros.
    ///
    /// Errors: `InvalidNullPointer`; `ACL_ERROR_RT_PARAM_INVALID` (107000) for a range not inside one
    /// managed allocation; `Unknown` if the copies of a read-mostly page differ (a broken
    /// invariant, never expected).
    pub fn managed_peek(&self, src: usize, out: &mut [u8]) -> Result<()> {
        sm::host::peek(self.driver_shared(), src, out)
    }

    /// Where the page holding `ptr` lives now: the host, devices with a copy. For tests and
    /// demos; `None` if `ptr` is not managed or the page has never been touched.
    pub fn managed_residency(&self, ptr: usize) -> Option<Residency> {
        sm::host::residency(self.driver_shared(), ptr)
    }
}

impl Driver {
    /// Counters of the driver's managed memory: faults, pages and bytes migrated each way, per
    /// device (hetmem's own query; ACL has no call for it). All zero before the first managed
    /// allocation. Never fails.
    pub fn managed_stats(&self) -> ManagedStats {
        sm::alloc::stats(&self.shared)
    }
}
