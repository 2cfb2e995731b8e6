//! Managed memory on the cuda backend: the CUDA driver is the unified-memory driver, so each
//! [`ManagedResidency`] operation is one or two driver calls, made on a stream of this module's
//! own and waited for (`cuStreamSynchronize`), since the semantics layer calls these in its
//! stream order and expects them done.
//!
//! | operation | driver calls |
//! |---|---|
//! | allocate / free | `cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL)` (refused past the GPU's free memory, `cuMemGetInfo`) / `cuCtxSynchronize` + `cuMemFree` |
//! | prefetch | `cuMemPrefetchAsync_v2` to `CU_MEM_LOCATION_TYPE_HOST`, `..._HOST_NUMA` or `..._DEVICE` |
//! | advise | `cuMemAdvise_v2` (`CUmem_advise` 1..=6), with ACL's eager population as a prefetch |
//! | device copy / fill | `cuMemcpyAsync` / `cuMemsetD8Async` (the driver migrates on access) |
//! | host copy / fill | a plain `memmove` / `memset` by the calling thread (the driver migrates on fault) |
//!
//! # What the driver does not tell
//! CUDA has no query for where a page lives now. [`ManagedResidency::residency`], the pages
//! the `check` of an advice sees, and the migration counters are this backend's record of the
//! last place each page was moved to or used from through hetmem (prefetch, advice, device
//! work, host copies and fills); plain host loads and stores through the pointer migrate pages
//! without hetmem seeing them. The range attributes never depend on this: the semantics layer
//! answers them from its own advice records.
//!
//! # Oversubscription
//! The driver would accept more managed memory than the GPU has and evict on demand, but asking
//! for more than the GPU has free can hang it (the GPU machine's notes), so an allocation larger
//! than `cuMemGetInfo`'s free bytes is refused as out of device memory.

use std::collections::BTreeMap;

use cudarc::driver::sys;
use parking_lot::Mutex;

use super::driver;
use crate::backend::managed::{
    DeviceOperand, ManagedDeviceStats, ManagedResidency, ManagedStats, PageView, Place, Residency,
    ResidencyAdvice, ResidencyError, ResidencyResult, WorkBuffer,
};
use crate::backend::{HalError, Result};

/// A stream handle shareable between threads (calls on it are serialised by `state`).
struct Stream(sys::CUstream);
// SAFETY: driver streams are process-wide objects usable from any thread.
unsafe impl Send for Stream {}

#[derive(Debug, Default)]
struct State {
    /// Live ranges: base -> (size, the pointer `cuMemAllocManaged` returned).
    ranges: BTreeMap<usize, (usize, usize)>,
    /// The last place each page (by address) was moved to or used from through hetmem.
    pages: BTreeMap<usize, Place>,
    /// The pages advised read-mostly (`cuMemAdvise` records it; the driver has no query
    /// hetmem could ask per page cheaply).
    read_mostly: std::collections::BTreeSet<usize>,
    stats: ManagedStats,
}

/// The cuda backend's managed memory.
pub(crate) struct CudaManaged {
    ctx: std::sync::Arc<super::Contexts>,
    devices: usize,
    page: usize,
    state: Mutex<State>,
    stream: Mutex<Stream>,
}

impl std::fmt::Debug for CudaManaged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaManaged({} devices, page {})",
            self.devices, self.page
        )
    }
}

fn location(p: Place) -> sys::CUmemLocation {
    match p {
        Place::Host => sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        },
        Place::HostNuma(n) => driver::host_numa_location(n),
        Place::Device(d) => driver::device_location(d),
    }
}

fn platform(e: HalError) -> ResidencyError {
    match e {
        HalError::OutOfDeviceMemory(m) => ResidencyError::DeviceFull(m),
        e => ResidencyError::Platform(e),
    }
}

impl CudaManaged {
    /// Checks that every device migrates managed memory on fault
    /// (`CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY`, `..._CONCURRENT_MANAGED_ACCESS`) and makes the
    /// stream. `Err` says what is missing.
    pub(crate) fn new(
        ctx: std::sync::Arc<super::Contexts>,
        handles: &[driver::CUdevice],
        page: usize,
    ) -> std::result::Result<CudaManaged, String> {
        for (i, &d) in handles.iter().enumerate() {
            for (a, what) in [
                (
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY,
                    "CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY",
                ),
                (
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
                    "CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS",
                ),
            ] {
                if driver::attribute(d, a) == 0 {
                    return Err(format!(
                        "CUDA device {i} has no managed memory with migration on fault ({what} is 0)"
                    ));
                }
            }
        }
        driver::set_current(ctx.get(0)).map_err(|e| e.to_string())?;
        let mut s = std::ptr::null_mut();
        // SAFETY: valid out-pointer; flag 1 is CU_STREAM_NON_BLOCKING.
        driver::check(
            "cuStreamCreate",
            unsafe { sys::cuStreamCreate(&mut s, 1) },
            false,
        )
        .map_err(|e| e.to_string())?;
        Ok(CudaManaged {
            devices: handles.len(),
            ctx,
            page,
            state: Mutex::new(State {
                stats: ManagedStats {
                    devices: vec![ManagedDeviceStats::default(); handles.len()],
                    ..ManagedStats::default()
                },
                ..State::default()
            }),
            stream: Mutex::new(Stream(s)),
        })
    }

    fn bind(&self) -> Result<()> {
        driver::set_current(self.ctx.get(0))
    }

    /// Runs `f` on the module's stream and waits for it (`cuStreamSynchronize`).
    fn on_stream(
        &self,
        what: &str,
        f: impl FnOnce(sys::CUstream) -> sys::CUresult,
    ) -> ResidencyResult<()> {
        self.bind().map_err(platform)?;
        let s = self.stream.lock();
        driver::check(what, f(s.0), true).map_err(platform)?;
        // SAFETY: our stream.
        driver::check(
            "cuStreamSynchronize",
            unsafe { sys::cuStreamSynchronize(s.0) },
            true,
        )
        .map_err(platform)
    }

    /// Records that `[ptr, ptr+len)` is now at `to`, counting the pages that moved.
    fn note(&self, ptr: usize, len: usize, to: Place) {
        if len == 0 {
            return;
        }
        let mut st = self.state.lock();
        let first = ptr / self.page * self.page;
        let mut p = first;
        while p < ptr + len {
            let before = st.pages.insert(p, to);
            if before != Some(to) {
                let bytes = self.page as u64;
                if let Some(Place::Device(e)) = before {
                    let ds = &mut st.stats.devices[e as usize];
                    ds.pages_from_device += 1;
                    ds.bytes_from_device += bytes;
                }
                match (before.and_then(Place::device), to.device()) {
                    (_, Some(d)) => {
                        let ds = &mut st.stats.devices[d as usize];
                        ds.pages_to_device += 1;
                        ds.bytes_to_device += bytes;
                        if before.is_some_and(|b| b.device().is_none()) {
                            st.stats.pages_from_host += 1;
                            st.stats.bytes_from_host += bytes;
                        }
                    }
                    (Some(_), None) => {
                        st.stats.pages_to_host += 1;
                        st.stats.bytes_to_host += bytes;
                    }
                    (None, None) => {}
                }
            }
            p += self.page;
        }
    }

    fn is_managed(&self, ptr: usize, len: usize) -> bool {
        let st = self.state.lock();
        st.ranges
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&b, &(s, _))| ptr + len <= b + s)
    }
}

impl ManagedResidency for CudaManaged {
    fn numa_nodes(&self) -> Vec<u32> {
        crate::backend::platform::numa_nodes()
    }

    fn current_numa_node(&self) -> u32 {
        crate::backend::platform::current_numa_node()
    }

    fn allocate(&self, size: usize, align: usize) -> Result<usize> {
        self.bind()?;
        let (free, _) = driver::mem_get_info()?;
        let extra = if align > self.page { align } else { 0 };
        if size + extra > free {
            return Err(HalError::OutOfDeviceMemory(format!(
                "managed memory of {size:#x} bytes exceeds the {free:#x} bytes the GPU has free \
                 (cuMemGetInfo); hetmem never asks the CUDA driver for more managed memory than that"
            )));
        }
        let raw = driver::alloc_managed(size + extra)?;
        let base = raw.next_multiple_of(align.max(1));
        let mut st = self.state.lock();
        st.ranges.insert(base, (size, raw));
        st.stats.allocations += 1;
        st.stats.bytes += size as u64;
        Ok(base)
    }

    unsafe fn free(&self, base: usize) {
        let Some((size, raw)) = self.state.lock().ranges.remove(&base) else {
            return;
        };
        if self.bind().is_ok() {
            // SAFETY: waits for all work of the context, then frees our allocation, which
            // nothing uses any more (caller).
            unsafe {
                let _ = sys::cuCtxSynchronize();
                driver::mem_free(raw);
            }
        }
        let mut st = self.state.lock();
        let keys: Vec<usize> = st.pages.range(base..base + size).map(|(&k, _)| k).collect();
        for k in keys {
            st.pages.remove(&k);
        }
        let keys: Vec<usize> = st.read_mostly.range(base..base + size).copied().collect();
        for k in keys {
            st.read_mostly.remove(&k);
        }
        st.stats.allocations -= 1;
        st.stats.bytes -= size as u64;
    }

    fn prefetch(&self, ptr: usize, size: usize, to: Place) -> ResidencyResult<()> {
        if !self.is_managed(ptr, size) {
            return Err(ResidencyError::NotManaged(format!(
                "[{ptr:#x}, +{size:#x}) is not inside a live managed allocation"
            )));
        }
        let loc = location(to);
        // SAFETY: a live managed range; the stream is ours.
        self.on_stream("cuMemPrefetchAsync_v2", |s| unsafe {
            sys::cuMemPrefetchAsync_v2(ptr as u64, size, loc, 0, s)
        })?;
        self.note(ptr, size, to);
        Ok(())
    }

    fn advise(
        &self,
        ptr: usize,
        size: usize,
        advice: ResidencyAdvice,
        check: &mut dyn FnMut(&[PageView]) -> std::result::Result<(), String>,
    ) -> ResidencyResult<()> {
        if !self.is_managed(ptr, size) {
            return Err(ResidencyError::NotManaged(format!(
                "[{ptr:#x}, +{size:#x}) is not inside a live managed allocation"
            )));
        }
        let views: Vec<PageView> = {
            let st = self.state.lock();
            (ptr..ptr + size)
                .step_by(self.page)
                .map(|a| {
                    let at = st.pages.get(&a).copied();
                    PageView {
                        addr: a,
                        read_mostly: st.read_mostly.contains(&a),
                        host: matches!(at, Some(Place::Host | Place::HostNuma(_))),
                        device: at.and_then(Place::device),
                    }
                })
                .collect()
        };
        check(&views).map_err(ResidencyError::Refused)?;
        use sys::CUmem_advise as A;
        let (a, loc, eager) = match advice {
            ResidencyAdvice::SetReadMostly => (
                A::CU_MEM_ADVISE_SET_READ_MOSTLY,
                Place::Host,
                Some(Place::Host),
            ),
            ResidencyAdvice::UnsetReadMostly(p) => (A::CU_MEM_ADVISE_UNSET_READ_MOSTLY, p, Some(p)),
            ResidencyAdvice::SetPreferredLocation(p) => {
                (A::CU_MEM_ADVISE_SET_PREFERRED_LOCATION, p, Some(p))
            }
            ResidencyAdvice::UnsetPreferredLocation => {
                (A::CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION, Place::Host, None)
            }
            ResidencyAdvice::SetAccessedBy(p) => (A::CU_MEM_ADVISE_SET_ACCESSED_BY, p, None),
            ResidencyAdvice::UnsetAccessedBy(p) => (A::CU_MEM_ADVISE_UNSET_ACCESSED_BY, p, None),
        };
        self.bind().map_err(platform)?;
        // SAFETY: a live managed range.
        driver::check(
            "cuMemAdvise_v2",
            unsafe { sys::cuMemAdvise_v2(ptr as u64, size, a, location(loc)) },
            true,
        )
        .map_err(platform)?;
        {
            let mut st = self.state.lock();
            match advice {
                ResidencyAdvice::SetReadMostly => {
                    st.read_mostly.extend((ptr..ptr + size).step_by(self.page))
                }
                ResidencyAdvice::UnsetReadMostly(_) => {
                    for a in (ptr..ptr + size).step_by(self.page) {
                        st.read_mostly.remove(&a);
                    }
                }
                _ => {}
            }
        }
        if let Some(p) = eager {
            // ACL populates at once where CUDA only records the advice.
            self.prefetch(ptr, size, p)?;
        }
        Ok(())
    }

    fn prepare(&self, _device: u32, buffers: &[WorkBuffer]) -> ResidencyResult<Vec<usize>> {
        for &(p, l, _) in buffers {
            if !self.is_managed(p, l) {
                return Err(ResidencyError::NotManaged(format!(
                    "[{p:#x}, +{l:#x}) is not inside a live managed allocation"
                )));
            }
        }
        // Work between prepare and release is a host function here (this backend runs no
        // kernels): it reaches managed memory at the same address, where the driver migrates
        // the pages it touches to the host. So nothing moves now, and `release` records them
        // on the host.
        Ok(buffers.iter().map(|b| b.0).collect())
    }

    fn release(&self, buffers: &[WorkBuffer]) {
        for &(p, l, _) in buffers {
            self.note(p, l, Place::Host);
        }
    }

    fn device_copy(
        &self,
        device: u32,
        dst: DeviceOperand,
        src: DeviceOperand,
        len: usize,
    ) -> ResidencyResult<()> {
        // SAFETY: both sides are live memory the device reaches (checked by the caller).
        self.on_stream("cuMemcpyAsync", |s| unsafe {
            sys::cuMemcpyAsync(dst.addr as u64, src.addr as u64, len, s)
        })?;
        for o in [dst, src] {
            if o.managed {
                self.note(o.addr, len, Place::Device(device));
            }
        }
        Ok(())
    }

    fn device_fill(&self, device: u32, ptr: usize, value: u8, len: usize) -> ResidencyResult<()> {
        // SAFETY: a live managed range (caller).
        self.on_stream("cuMemsetD8Async", |s| unsafe {
            sys::cuMemsetD8Async(ptr as u64, value, len, s)
        })?;
        self.note(ptr, len, Place::Device(device));
        Ok(())
    }

    unsafe fn host_copy(&self, dst: usize, src: usize, len: usize) {
        // SAFETY: forwarded contract; managed memory is host-accessible (the driver migrates
        // on fault: CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS was checked).
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
        for p in [dst, src] {
            if self.is_managed(p, len) {
                self.note(p, len, Place::Host);
            }
        }
    }

    unsafe fn host_fill(&self, ptr: usize, value: u8, len: usize) {
        // SAFETY: as host_copy.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, value, len) };
        self.note(ptr, len, Place::Host);
    }

    fn peek(&self, src: usize, out: &mut [u8]) -> ResidencyResult<()> {
        self.bind().map_err(platform)?;
        // SAFETY: `src` is live managed memory (caller) and `out` a host buffer of its length.
        driver::check(
            "cuMemcpy",
            unsafe { sys::cuMemcpy(out.as_mut_ptr() as u64, src as u64, out.len()) },
            true,
        )
        .map_err(platform)
    }

    fn residency(&self, addr: usize) -> Option<Residency> {
        let st = self.state.lock();
        let page = addr / self.page * self.page;
        let at = *st.pages.get(&page)?;
        Some(Residency {
            host: at.device().is_none(),
            // A read-mostly page's host copy is read-only (the driver duplicates it on read).
            host_read_only: at.device().is_none() && st.read_mostly.contains(&page),
            devices: at.device().into_iter().collect(),
        })
    }

    fn stats(&self) -> ManagedStats {
        let st = self.state.lock();
        let mut s = st.stats.clone();
        s.host_resident_pages = st.pages.values().filter(|p| p.device().is_none()).count() as u64;
        for (d, ds) in s.devices.iter_mut().enumerate() {
            ds.resident_pages = st
                .pages
                .values()
                .filter(|p| p.device() == Some(d as u32))
                .count() as u64;
        }
        s
    }

    fn shutdown(&self) {
        let bases: Vec<usize> = self.state.lock().ranges.keys().copied().collect();
        for b in bases {
            // SAFETY: the driver is going away; nothing uses its managed memory any more.
            unsafe { self.free(b) };
        }
    }
}

impl Drop for CudaManaged {
    fn drop(&mut self) {
        self.shutdown();
        if self.bind().is_ok() {
            // SAFETY: our stream, idle after the frees' synchronisation.
            unsafe {
                let _ = sys::cuStreamDestroy_v2(self.stream.lock().0);
            }
        }
    }
}
