//! The public module of this family: its types (from the semantics module of the same name,
//! where the rules live) and the calls, as methods of [`crate::Context`] and [`crate::Driver`].

use parking_lot::Mutex;
use std::sync::Arc;

pub use crate::api::platform::{current_numa_node, numa_nodes};
use crate::api::queue::CommandQueue;
use crate::api::runtime::{Context, Device, Driver};
use crate::backend::managed::DeviceOperand;
use crate::error::{AclCode, Addr, Error, Result};
pub use crate::semantics::managed::*;

/// An in-order stream on one device (`aclrtStream`), on the device queue machinery
/// ([`CommandQueue`]): prefetches, copies, fills and launched work run in submission order, on
/// the device's engine. Dropping it (`aclrtDestroyStream`) waits for its work.
#[derive(Debug)]
pub struct Stream {
    queue: CommandQueue,
    core: Arc<Core>,
    error: Arc<Mutex<Option<Error>>>,
}

/// One buffer of [`Stream::launch`]ed work: the device address of `[ptr, ptr+len)`.
#[derive(Debug, Clone, Copy)]
pub struct DeviceBuffer {
    /// Where the device reaches the buffer (valid only during the work).
    pub ptr: *mut u8,
    /// Bytes.
    pub len: usize,
}

impl Stream {
    /// The device the stream runs on.
    pub fn device(&self) -> &Device {
        self.queue.device()
    }

    fn dev(&self) -> u32 {
        self.queue.device().ordinal()
    }

    /// Queues `f`; `hold` (the managed allocations it references) is released once it has run.
    fn enqueue(&self, hold: QueuedHold, f: impl FnOnce(&Core) -> Result<()> + Send + 'static) {
        let core = self.core.clone();
        let err = self.error.clone();
        self.queue.submit_host(Box::new(move || {
            let r = f(&core);
            drop(hold);
            if let Err(e) = r {
                err.lock().get_or_insert(e);
            }
        }));
    }

    /// Waits for everything submitted before (`aclrtSynchronizeStream`).
    ///
    /// Errors: the first error of the work since the last synchronize (e.g. `OutOfDeviceMemory`
    /// when a device full of non-managed memory could not take a page); the stream stays
    /// usable. Managed memory is never freed under queued work ([`Context::free_managed`]
    /// waits for it).
    pub fn synchronize(&self) -> Result<()> {
        self.queue.synchronize(u64::MAX)?;
        match self.error.lock().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
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
        if dst == 0 || src == 0 {
            return Err(Error::Acl(AclCode::InvalidParam, "pointer is null".into()));
        }
        let (dm, sm, hold) = {
            let mut st = self.core.state.lock();
            let dm = self.core.find(&st, dst).is_some();
            let sm = self.core.find(&st, src).is_some();
            if !dm && !sm {
                return Err(Error::Acl(
                    AclCode::RtParamInvalid,
                    format!(
                        "neither {} nor {} is inside managed memory",
                        Addr(dst),
                        Addr(src)
                    ),
                ));
            }
            if dm {
                self.core.check_range(&st, dst, count)?;
            }
            if sm {
                self.core.check_range(&st, src, count)?;
            }
            let managed: Vec<usize> = [(dst, dm), (src, sm)]
                .iter()
                .filter(|&&(_, m)| m)
                .map(|&(a, _)| a)
                .collect();
            let hold = QueuedHold::take(&self.core, &mut st, &managed);
            (dm, sm, hold)
        };
        // The plain side (at most one), held in flight until the copy has run.
        let held = match (dm, sm) {
            (false, _) => Some(self.queue.hold_operand(dst, count, true)?),
            (_, false) => Some(self.queue.hold_operand(src, count, false)?),
            _ => None,
        };
        let d = self.dev();
        self.enqueue(hold, move |c| {
            let r = device_copy(c.res.as_ref(), d, (dst, dm), (src, sm), count);
            drop(held);
            r
        });
        Ok(())
    }

    /// Stream-ordered `aclrtMemsetAsync`: `count` bytes at `ptr` (inside one managed
    /// allocation; any alignment) set to `value`, by the stream's device (the pages migrate
    /// there first). Run-time errors (e.g. `OutOfDeviceMemory` when the device is full of
    /// pages in use by running work) are reported by [`Stream::synchronize`].
    ///
    /// Errors (nothing queued): `ACL_ERROR_INVALID_PARAM` (100000); `ACL_ERROR_RT_PARAM_INVALID` (107000) for
    /// a range not inside one managed allocation.
    pub fn memset_async(&self, ptr: usize, value: u8, count: usize) -> Result<()> {
        if ptr == 0 {
            return Err(Error::Acl(AclCode::InvalidParam, "pointer is null".into()));
        }
        let hold = {
            let mut st = self.core.state.lock();
            self.core.check_range(&st, ptr, count)?;
            QueuedHold::take(&self.core, &mut st, &[ptr])
        };
        let d = self.dev();
        self.enqueue(hold, move |c| {
            c.res
                .device_fill(d, ptr, value, count)
                .map_err(residency_error)
        });
        Ok(())
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
        let hold = {
            let mut st = self.core.state.lock();
            for &(p, l, _) in buffers {
                if p == 0 {
                    return Err(Error::Acl(
                        AclCode::InvalidParam,
                        "buffer pointer is null".into(),
                    ));
                }
                self.core.check_range(&st, p, l)?;
            }
            let addrs: Vec<usize> = buffers.iter().map(|&(p, _, _)| p).collect();
            QueuedHold::take(&self.core, &mut st, &addrs)
        };
        let d = self.dev();
        let bufs = buffers.to_vec();
        self.enqueue(hold, move |c| {
            // Every page migrates to the device and stays there (pinned) while `work` runs,
            // with no lock held.
            let addrs = c.res.prepare(d, &bufs).map_err(residency_error)?;
            let dev: Vec<DeviceBuffer> = bufs
                .iter()
                .zip(addrs)
                .map(|(&(_, l, _), a)| DeviceBuffer {
                    ptr: a as *mut u8,
                    len: l,
                })
                .collect();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || work(&dev)));
            c.res.release(&bufs);
            r.map_err(|_| {
                Error::Acl(
                    AclCode::RtDrvInternalError,
                    "launched device work panicked".into(),
                )
            })
        });
        Ok(())
    }
}

impl Context {
    fn managed(&self) -> Result<&Arc<Core>> {
        let d = self.driver_shared();
        d.managed.core(d.backend.as_ref())
    }

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
        let rounded = check_alloc_args(size, flag)?;
        self.managed()?.allocate(self.id(), rounded)
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
        if ptr == 0 {
            return Err(Error::Acl(AclCode::InvalidParam, "pointer is null".into()));
        }
        self.managed()?.free(self.id(), ptr)
    }

    /// Whether the byte at `ptr` is inside a live managed allocation of this driver (any
    /// context): the "pointer inside managed memory" check of `aclrtMemManagedAdvise`,
    /// `aclrtMemManagedPrefetchAsync` and `aclrtMemManagedGetAttr` (107000 when false), as a
    /// query of hetmem's own (the spec has no call for it). Any alignment; never fails (false
    /// before the first managed allocation).
    pub fn is_managed(&self, ptr: usize) -> bool {
        let d = self.driver_shared();
        d.managed
            .existing()
            .is_some_and(|c| c.find(&c.state.lock(), ptr).is_some())
    }

    /// Host-synchronous `aclrtMemset`: sets `count` bytes at `ptr` (inside one managed
    /// allocation; any alignment, `count` 0 allowed) to `value` from the calling thread; the
    /// pages migrate to the host.
    ///
    /// Errors (nothing written): `ACL_ERROR_INVALID_PARAM` (100000); `ACL_ERROR_RT_PARAM_INVALID` (107000) for a
    /// range not inside one managed allocation (or overflowing); `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000)
    /// where managed memory is unavailable.
    pub fn managed_memset(&self, ptr: usize, value: u8, count: usize) -> Result<()> {
        let core = self.check_host_range(ptr, count)?;
        // SAFETY: the range is inside a live managed allocation. No lock is held here.
        unsafe { core.res.host_fill(ptr, value, count) };
        Ok(())
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
        if dst == 0 || src == 0 {
            return Err(Error::Acl(AclCode::InvalidParam, "pointer is null".into()));
        }
        let core = self.managed()?;
        // A plain side that is not process memory mapped with the access needed, with why.
        let mut unreachable = None;
        let (dm, sm) = {
            let st = core.state.lock();
            let dm = core.find(&st, dst).is_some();
            let sm = core.find(&st, src).is_some();
            if !dm && !sm {
                return Err(Error::Acl(
                    AclCode::RtParamInvalid,
                    format!(
                        "neither {} nor {} is inside managed memory",
                        Addr(dst),
                        Addr(src)
                    ),
                ));
            }
            for (p, managed, write) in [(dst, dm, true), (src, sm, false)] {
                if managed {
                    core.check_range(&st, p, count)?;
                } else {
                    let end = p.checked_add(count).ok_or_else(|| {
                        Error::Acl(
                            AclCode::RtParamInvalid,
                            format!("{} + {count:#x} overflows", Addr(p)),
                        )
                    })?;
                    if let Some((&b, _)) = st.allocs.range(p..end).next() {
                        return Err(Error::Acl(
                            AclCode::RtParamInvalid,
                            format!(
                                "[{}, {}) runs into the managed allocation at {}",
                                Addr(p),
                                Addr(end),
                                Addr(b)
                            ),
                        ));
                    }
                    if let Err(e) =
                        check_process_memory(self.driver_shared().backend.as_ref(), p, count, write)
                    {
                        unreachable = Some((p, write, e));
                    }
                }
            }
            (dm, sm)
        };
        if let Some((p, write, host_err)) = unreachable {
            // Not process memory: device memory of this driver is copied by a device.
            match self.device_side(p, count, write) {
                None => return Err(host_err),
                Some(Err(e)) => return Err(e),
                Some(Ok(())) => {}
            }
            let d = self.driver_shared_arc();
            let _held = crate::semantics::queue::hold(
                d,
                crate::semantics::queue::Operand {
                    ptr: p,
                    size: count,
                    write,
                },
            )
            .map_err(|e| Error::Acl(AclCode::RtParamInvalid, e.message().to_string()))?;
            let device = crate::semantics::queue::owning_device(d, p).unwrap_or(0);
            return device_copy(core.res.as_ref(), device, (dst, dm), (src, sm), count);
        }
        // SAFETY: managed sides are inside live managed allocations (no lock is held here);
        // plain sides are mapped with the access needed.
        unsafe { core.res.host_copy(dst, src, count) };
        Ok(())
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
        if dst == 0 || src == 0 {
            return Err(Error::Acl(AclCode::InvalidParam, "pointer is null".into()));
        }
        if self.is_managed(dst) || self.is_managed(src) {
            return self.managed_memcpy(dst, src, count);
        }
        let s = self.check_plain(src, count, false);
        let d = self.check_plain(dst, count, true);
        if let (Ok(()), Ok(())) = (&s, &d) {
            // SAFETY: both ranges are mapped with the access needed (checked); memmove.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, count) };
            return Ok(());
        }
        // A side the host cannot reach may be device memory of this driver (the cuda
        // backend's): the device copies.
        let mut device_sides = Vec::new();
        for (r, p, write) in [(s, src, false), (d, dst, true)] {
            if let Err(host_err) = r {
                match self.device_side(p, count, write) {
                    None => return Err(host_err),
                    Some(Err(e)) => return Err(e),
                    Some(Ok(())) => {}
                }
                device_sides.push(crate::semantics::queue::Operand {
                    ptr: p,
                    size: count,
                    write,
                });
            }
        }
        crate::semantics::queue::device_sync_op(
            self.driver_shared_arc(),
            &device_sides,
            crate::backend::EngineOp::Copy {
                dst,
                src,
                size: count,
            },
        )
    }

    /// For a side the host cannot reach: `None` if it is not memory of this driver (or the
    /// backend's device memory is host-accessible, as on the host backend:
    /// [`crate::backend::Backend::device_memory_host_accessible`]), else whether a device can
    /// reach it with the access needed, as a queue operand is checked (the error names what
    /// is wrong: past the end, a page not mapped, a READONLY page for a write).
    fn device_side(&self, p: usize, count: usize, write: bool) -> Option<Result<()>> {
        let d = self.driver_shared();
        if d.backend.device_memory_host_accessible() {
            return None;
        }
        let usm = d.usm.read();
        let vm = d.vm.read();
        let views = crate::ipc::views(d);
        let known = usm.operand_info(p).is_some()
            || vm.pointer_info(p).is_some()
            || views.range(p).is_some();
        known.then(|| {
            crate::semantics::queue::check_operand(
                &usm,
                &vm,
                &views,
                crate::semantics::queue::Operand {
                    ptr: p,
                    size: count,
                    write,
                },
            )
            .map(|_| ())
            .map_err(|e| Error::Acl(AclCode::RtParamInvalid, e.message().to_string()))
        })
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
        if ptr == 0 {
            return Err(Error::Acl(AclCode::InvalidParam, "pointer is null".into()));
        }
        if self.is_managed(ptr) {
            return self.managed_memset(ptr, value, count);
        }
        if let Err(host_err) = self.check_plain(ptr, count, true) {
            // Device memory the host cannot reach (the cuda backend's): the device fills.
            match self.device_side(ptr, count, true) {
                None => return Err(host_err),
                Some(Err(e)) => return Err(e),
                Some(Ok(())) => {}
            }
            return crate::semantics::queue::device_sync_op(
                self.driver_shared_arc(),
                &[crate::semantics::queue::Operand {
                    ptr,
                    size: count,
                    write: true,
                }],
                crate::backend::EngineOp::Fill {
                    ptr,
                    pattern: vec![value],
                    size: count,
                },
            );
        }
        // SAFETY: the range is mapped writable (checked).
        unsafe { std::ptr::write_bytes(ptr as *mut u8, value, count) };
        Ok(())
    }

    /// A plain (not managed) side of a host copy: no overflow, no managed byte, mapped with
    /// the access needed.
    fn check_plain(&self, p: usize, count: usize, write: bool) -> Result<()> {
        let end = p.checked_add(count).ok_or_else(|| {
            Error::Acl(
                AclCode::RtParamInvalid,
                format!("{} + {count:#x} overflows", Addr(p)),
            )
        })?;
        if let Some((b, _)) = self.driver_shared().managed.overlapping(p, end) {
            return Err(Error::Acl(
                AclCode::RtParamInvalid,
                format!(
                    "[{}, {}) runs into the managed allocation at {}",
                    Addr(p),
                    Addr(end),
                    Addr(b)
                ),
            ));
        }
        if count == 0 {
            return Ok(());
        }
        check_process_memory(self.driver_shared().backend.as_ref(), p, count, write)
    }

    /// Host-synchronous copy of `data` into managed memory at `dst` (`aclrtMemcpy`,
    /// host-to-managed).
    ///
    /// Errors: as [`Context::managed_memset`].
    pub fn managed_write(&self, dst: usize, data: &[u8]) -> Result<()> {
        let core = self.check_host_range(dst, data.len())?;
        // SAFETY: the range is inside a live managed allocation; `data` is readable (and copy
        // allows overlap anyway).
        unsafe { core.res.host_copy(dst, data.as_ptr() as usize, data.len()) };
        Ok(())
    }

    /// Host-synchronous copy of managed memory at `src` into `out` (`aclrtMemcpy`,
    /// managed-to-host).
    ///
    /// Errors: as [`Context::managed_memset`].
    pub fn managed_read(&self, src: usize, out: &mut [u8]) -> Result<()> {
        let core = self.check_host_range(src, out.len())?;
        // SAFETY: the range is inside a live managed allocation; `out` is writable.
        unsafe {
            core.res
                .host_copy(out.as_mut_ptr() as usize, src, out.len())
        };
        Ok(())
    }

    fn check_host_range(&self, ptr: usize, count: usize) -> Result<&Arc<Core>> {
        if ptr == 0 {
            return Err(Error::Acl(AclCode::InvalidParam, "pointer is null".into()));
        }
        let core = self.managed()?;
        let st = core.state.lock();
        core.check_range(&st, ptr, count)?;
        Ok(core)
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
        self.managed()?.advise(ptr, size, advice, location)
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
        if flags != 0 {
            return Err(Error::Acl(
                AclCode::InvalidParam,
                format!("prefetch flags {flags:#x} must be 0"),
            ));
        }
        let core = self.managed()?;
        if !Arc::ptr_eq(core, &stream.core) {
            return Err(Error::Acl(
                AclCode::RtParamInvalid,
                "the stream belongs to another driver".into(),
            ));
        }
        let (loc, hold) = {
            let mut st = core.state.lock();
            check_advise_args(core, &st, ptr, size)?;
            let loc = core.resolve(location, "a prefetch")?;
            for p in core.advice_mut(&mut st, ptr, size) {
                p.last_prefetch = Some(loc);
            }
            (loc, QueuedHold::take(core, &mut st, &[ptr]))
        };
        stream.enqueue(hold, move |c| {
            c.res
                .prefetch(ptr, size, loc.place())
                .map_err(residency_error)
        });
        Ok(())
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
        let core = self.managed()?;
        let st = core.state.lock();
        get_attr_locked(core, &st, attribute, ptr, size, data)
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
        if attributes.is_empty() || attributes.len() != data.len() {
            return Err(Error::Acl(
                AclCode::InvalidParam,
                format!(
                    "{} attributes and {} data buffers",
                    attributes.len(),
                    data.len()
                ),
            ));
        }
        let core = self.managed()?;
        let st = core.state.lock();
        for (a, d) in attributes.iter().zip(data.iter()) {
            check_data_size(*a, d.len())?;
        }
        for (a, d) in attributes.iter().zip(data.iter_mut()) {
            get_attr_locked(core, &st, *a, ptr, size, d)?;
        }
        Ok(())
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
        let mut b = [0u8; 4];
        self.managed_get_attr(attribute, ptr, size, &mut b)?;
        Ok(i32::from_ne_bytes(b))
    }

    /// Most `slots` [`Context::managed_accessed_by`] answers (1 Mi entries, 4 MiB); larger
    /// buffers go through [`Context::managed_get_attr`], which writes the caller's buffer.
    pub const MAX_ACCESSED_BY_SLOTS: usize = 1 << 20;

    /// ACCESSED_BY of `[ptr, ptr+size)` (`aclrtMemManagedGetAttr` with `dataSize` = `slots` *
    /// 4): the ids (device id, -1 host, NUMA node id) advised over the whole range, in `slots`
    /// entries, padded with -2 or truncated. `size` in bytes, no alignment rule.
    ///
    /// Errors: `ACL_ERROR_RT_PARAM_INVALID` (107000) for `slots` 0 (dataSize 0) or over
    /// [`Context::MAX_ACCESSED_BY_SLOTS`] (use [`Context::managed_get_attr`] with a buffer of
    /// your own for more); then as [`Context::managed_attr_i32`].
    pub fn managed_accessed_by(&self, ptr: usize, size: usize, slots: usize) -> Result<Vec<i32>> {
        if slots == 0 || slots > Self::MAX_ACCESSED_BY_SLOTS {
            return Err(Error::Acl(
                AclCode::RtParamInvalid,
                format!(
                    "{slots} ACCESSED_BY slots: 1 to {} are answered here (dataSize a non-zero \
                 multiple of 4; larger buffers through managed_get_attr)",
                    Self::MAX_ACCESSED_BY_SLOTS
                ),
            ));
        }
        let mut b = vec![0u8; slots * 4];
        self.managed_get_attr(RangeAttribute::AccessedBy, ptr, size, &mut b)?;
        Ok(b.chunks(4)
            .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Creates an in-order stream on `device` (`aclrtCreateStream` after `aclrtSetDevice`).
    ///
    /// Errors: `InvalidNullHandle` for a device of another driver; `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000)
    /// where managed memory is unavailable; `OutOfHostMemory` if the engine cannot start.
    pub fn create_stream(&self, device: &Device) -> Result<Stream> {
        let core = self.managed()?.clone();
        Ok(Stream {
            queue: self.create_command_queue(device)?,
            core,
            error: Arc::default(),
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
        if src == 0 {
            return Err(Error::Acl(AclCode::InvalidParam, "pointer is null".into()));
        }
        let core = self.managed()?;
        core.check_range(&core.state.lock(), src, out.len())?;
        core.res.peek(src, out).map_err(residency_error)
    }

    /// Where the page holding `ptr` lives now: the host, devices with a copy. For tests and
    /// demos; `None` if `ptr` is not managed or the page has never been touched.
    pub fn managed_residency(&self, ptr: usize) -> Option<Residency> {
        let core = self.driver_shared().managed.existing()?;
        core.res.residency(ptr)
    }
}

impl Driver {
    /// Counters of the driver's managed memory: faults, pages and bytes migrated each way, per
    /// device (hetmem's own query; ACL has no call for it). All zero before the first managed
    /// allocation. Never fails.
    pub fn managed_stats(&self) -> ManagedStats {
        match self.shared.managed.existing() {
            Some(c) => c.res.stats(),
            None => ManagedStats {
                devices: vec![ManagedDeviceStats::default(); self.shared.backend.devices().len()],
                ..Default::default()
            },
        }
    }
}

/// A copy of `count` bytes on `device` by the managed-residency backend, each side given as
/// `(address, whether it is managed memory)`.
fn device_copy(
    res: &dyn crate::backend::managed::ManagedResidency,
    device: u32,
    (dst, dm): (usize, bool),
    (src, sm): (usize, bool),
    count: usize,
) -> Result<()> {
    res.device_copy(
        device,
        DeviceOperand {
            addr: dst,
            managed: dm,
        },
        DeviceOperand {
            addr: src,
            managed: sm,
        },
        count,
    )
    .map_err(residency_error)
}
