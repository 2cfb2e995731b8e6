//! ACL virtual memory over hetmem's virtual-memory and IPC core (the calls LLM servers use to
//! sleep and wake model memory at fixed addresses): `aclrtMemGetAllocationGranularity`,
//! `aclrtReserveMemAddress`, `aclrtReleaseMemAddress`, `aclrtMallocPhysical`,
//! `aclrtFreePhysical`, `aclrtMapMem`, `aclrtUnmapMem`, `aclrtMemExportToShareableHandle`,
//! `aclrtMemSetPidToShareableHandle`, `aclrtMemImportFromShareableHandle`.
//!
//! Sizes, alignment and mapping rules are hetmem's ([`hetmem::Context::reserve`],
//! [`hetmem::Context::map`], and the ACL argument rules of [`hetmem::acl`]): the granularity
//! this library reports ([`hetmem::Context::acl_granularity`], 2 MiB on the host backend) is
//! the rule, as the ACL documentation states it: the sizes of reservations, physical memory and
//! mappings are multiples of it (a smaller hetmem page size such as 64 KiB is refused, 107000),
//! and size 0 is `ACL_ERROR_INVALID_PARAM` (100000) for all three
//! ([`hetmem::acl::check_vmm_size`]).
//!
//! # Shareable handles
//! ACL's shareable handle is a `uint64_t` that another process (of the same user) imports; its
//! rules (one export per handle, the pid whitelist of `aclrtMemSetPidToShareableHandle`, the
//! export flags) and the record it stands for are hetmem's ([`hetmem::Context::acl_export_shareable`],
//! `semantics::acl::shareable`). This library ends a handle's export when the handle goes
//! (`aclrtFreePhysical`, `aclrtResetDevice` / `aclrtDestroyContext` of its context,
//! `aclFinalize`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::state::{self, Ctx, Reserved};
use crate::{entry, null, out, AclError, Fail, Res};

// Handles are `serial << 24 | slot << 4 | kind` (below): a 64-bit layout.
const _: () = assert!(usize::BITS == 64);

/// The kind tag of a physical memory handle (its low 4 bits, as [`state::fresh_handle`] tags
/// the other kinds).
const PHYS_KIND: usize = 4;
/// Bits of a physical handle above the kind tag that number its slot.
const SLOT_BITS: u32 = 20;
const SLOT_MASK: usize = (1 << SLOT_BITS) - 1;

/// The virtual-memory registry: physical memory handles, reservations and the records of
/// mappings, for the one running library instance, behind one lock ([`VMM`]).
///
/// A physical handle (`aclrtDrvMemHandle`) is `serial << 24 | slot << 4 | 4`: `slot` indexes
/// the slot table, `serial` is never given twice in the process's life (not even across
/// `aclFinalize` / `aclInit`), and 4 is the kind tag ([`state::fresh_handle`]'s scheme), so a
/// handle is found by indexing and checked by comparing it whole with the slot's: a stale
/// handle (its slot freed or reused), a bit-flipped or foreign one, or a handle of another kind
/// is simply not found (107000). No hashing and no reference count on the way.
///
/// The entry points that need no current context (map, unmap, free physical, release) reach
/// it without the library instance ([`state::fast_global`]): [`Vmm::live`] says whether
/// `aclInit` ran (and `aclFinalize` not since), so that they answer `ACL_ERROR_UNINITIALIZE`
/// as every other call does. Lock order: the instance's slot and registry
/// ([`state::Global::reg`]) may be held while this is taken, never the other way round.
///
/// The lock is held across hetmem's map (filing the record first) and physical free (so
/// that other threads see a handle live until it is freed, and gone after); both are short and
/// never wait for device work, but on cuda a free is a 10-30 us driver call, which other VMM
/// calls wait out. Unmap and release, which wait for stream work, run with it released.
#[derive(Debug)]
pub struct Vmm {
    /// `aclInit` ran and `aclFinalize` has not since.
    live: bool,
    /// The next serial (from 1; never reset).
    next_serial: usize,
    /// Physical handles by slot.
    slots: Vec<Option<Phys>>,
    /// Free slots, the last freed on top (the slot most likely still in the caches).
    free: Vec<usize>,
    /// Reservations by base address.
    pub reservations: BTreeMap<usize, Reserved>,
    /// Mappings made by `aclrtMapMem`: start -> (size, the context of the physical memory),
    /// hashed by address; a released reservation finds its own with [`take_records`].
    pub mappings: state::HashMap<usize, (usize, Arc<Ctx>)>,
}

/// [`Vmm`] behind its lock, and the count of `aclrtReleaseMemAddress` calls between taking
/// their reservation out and hetmem's free returning, in the lock's cache line.
///
/// While one is in flight, `aclrtMapMem` files a record only for a range inside a filed
/// reservation: a map that reached hetmem before the release's free (which then unmaps it)
/// would otherwise leave a record of a mapping that is gone.
#[repr(C, align(64))]
pub struct VmmLock {
    releasing: AtomicUsize,
    vmm: Mutex<Vmm>,
}

impl VmmLock {
    /// Takes the lock.
    pub fn lock(&self) -> parking_lot::MutexGuard<'_, Vmm> {
        self.vmm.lock()
    }
}

/// The virtual-memory registry of the running instance (see [`Vmm`]).
pub static VMM: VmmLock = VmmLock {
    releasing: AtomicUsize::new(0),
    vmm: Mutex::new(Vmm {
        live: false,
        next_serial: 1,
        slots: Vec::new(),
        free: Vec::new(),
        reservations: BTreeMap::new(),
        mappings: state::HashMap::with_hasher(std::hash::BuildHasherDefault::new()),
    }),
};

/// Takes the records of the mappings inside `[base, base+size)` out of `m`: at most
/// min(records, granules) look-ups (a mapping starts on a granule: its size is a multiple of
/// `gran`, and hetmem aligns a mapping's start to the page size for its size, `gran`), none
/// where `m` is empty.
fn take_records(
    m: &mut state::HashMap<usize, (usize, Arc<Ctx>)>,
    base: usize,
    size: usize,
    gran: usize,
) -> Vec<(usize, (usize, Arc<Ctx>))> {
    if m.is_empty() {
        return Vec::new();
    }
    let granules = size / gran.max(1);
    if m.len() <= granules {
        let keys: Vec<usize> = m
            .keys()
            .copied()
            .filter(|&k| (base..base + size).contains(&k))
            .collect();
        keys.into_iter()
            .filter_map(|k| m.remove_entry(&k))
            .collect()
    } else {
        (0..granules)
            .filter_map(|i| m.remove_entry(&(base + i * gran)))
            .collect()
    }
}

/// What a context's end (or `aclFinalize`) takes out of [`VMM`], torn down outside the lock.
#[derive(Debug, Default)]
pub struct Taken {
    /// Physical handles (their exports end when they drop).
    pub phys: Vec<Phys>,
    /// Reservations.
    pub reservations: Vec<Reserved>,
    /// Mapping records.
    pub mappings: Vec<(usize, Arc<Ctx>)>,
}

impl Vmm {
    /// `ACL_ERROR_UNINITIALIZE` unless the library is running.
    pub fn live(&self) -> Res {
        if self.live {
            Ok(())
        } else {
            Err(Fail::new(
                crate::ACL_ERROR_UNINITIALIZE,
                "the library is not initialised: call aclInit first",
            ))
        }
    }

    /// Whether `c` may still file objects: the library is running and `c` not torn down (a
    /// context's end marks it under this lock, so nothing filed afterwards outlives it).
    fn accepts(&self, c: &Ctx) -> Res {
        self.live()?;
        if !c.alive.load(Ordering::Acquire) {
            return Err(Fail::new(
                crate::ACL_ERROR_RT_CONTEXT_NULL,
                format!(
                    "context {:#x} was destroyed (its device reset, the context destroyed or                      aclFinalize) while the call ran",
                    c.handle
                ),
            ));
        }
        Ok(())
    }

    /// The physical handle `h`.
    pub fn phys(&self, h: usize) -> Option<&Phys> {
        find(&self.slots, h)
    }

    /// The physical handle `h`, or `InvalidArgument` (107000).
    pub fn phys_or_fail(&self, h: usize) -> Res<&Phys> {
        self.phys(h)
            .ok_or_else(|| state::bad_handle("physical memory handle", h))
    }

    /// How many things are filed: live physical handles, reservations and mapping records.
    pub fn filed(&self) -> usize {
        self.all_phys().count() + self.reservations.len() + self.mappings.len()
    }

    /// Every live physical handle.
    pub fn all_phys(&self) -> impl Iterator<Item = &Phys> {
        self.slots.iter().flatten()
    }

    /// Files the handle `make` builds from its number; the number.
    ///
    /// Errors: `OutOfHostMemory` with 2^20 handles live.
    fn insert(&mut self, make: impl FnOnce(usize) -> Phys) -> Res<usize> {
        let slot = match self.free.pop() {
            Some(s) => s,
            None if self.slots.len() <= SLOT_MASK => {
                self.slots.push(None);
                self.slots.len() - 1
            }
            None => {
                return Err(hetmem::Error::OutOfHostMemory(format!(
                    "{} physical memory handles are live, the most this library numbers",
                    SLOT_MASK + 1
                ))
                .into())
            }
        };
        let h = self.next_serial << 24 | slot << 4 | PHYS_KIND;
        self.next_serial += 1;
        self.slots[slot] = Some(make(h));
        Ok(h)
    }

    /// Takes the physical handle `h` out.
    fn remove(&mut self, h: usize) -> Option<Phys> {
        self.phys(h)?;
        let slot = (h >> 4) & SLOT_MASK;
        self.free.push(slot);
        self.slots[slot].take()
    }

    /// Takes out everything of the context `c` (its physical handles, reservations and the
    /// mapping records inside them), marking it torn down first (see [`Vmm::accepts`]).
    fn take_ctx(&mut self, c: &Ctx, out: &mut Taken) {
        c.alive.store(false, Ordering::Release);
        let h = c.handle;
        for (i, s) in self.slots.iter_mut().enumerate() {
            if s.as_ref().is_some_and(|p| p.ctx.handle == h) {
                out.phys.extend(s.take());
                self.free.push(i);
            }
        }
        let res: Vec<usize> = self
            .reservations
            .iter()
            .filter(|(_, r)| r.ctx.handle == h)
            .map(|(&k, _)| k)
            .collect();
        for b in res {
            let r = self.reservations.remove(&b).expect("listed");
            out.mappings.extend(
                take_records(&mut self.mappings, b, r.r.size, r.ctx.gran)
                    .into_iter()
                    .map(|(_, m)| m),
            );
            out.reservations.push(r);
        }
    }
}

/// The physical handle `h` of `slots` (the slot table): the slot its number names, if the
/// handle filed there is `h` itself.
fn find(slots: &[Option<Phys>], h: usize) -> Option<&Phys> {
    if h & 0xf != PHYS_KIND {
        return None;
    }
    match slots.get((h >> 4) & SLOT_MASK) {
        Some(Some(p)) if p.handle == h => Some(p),
        _ => None,
    }
}

/// `aclInit`: the registry opens (empty).
pub(crate) fn open() {
    VMM.lock().live = true;
}

/// Takes out everything of the contexts `ctxs` (`aclrtResetDevice`, `aclrtDestroyContext`),
/// in one hold.
pub(crate) fn take_contexts<'a>(ctxs: impl IntoIterator<Item = &'a Arc<Ctx>>) -> Taken {
    let mut out = Taken::default();
    let mut v = VMM.lock();
    for c in ctxs {
        v.take_ctx(c, &mut out);
    }
    out
}

/// `aclFinalize`: closes the registry and takes everything out, in one hold (every context of
/// the instance marked torn down).
pub(crate) fn close<'a>(ctxs: impl IntoIterator<Item = &'a Arc<Ctx>>) -> Taken {
    let mut v = VMM.lock();
    v.live = false;
    for c in ctxs {
        c.alive.store(false, Ordering::Release);
    }
    let v = &mut *v;
    v.free.extend(
        v.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_some())
            .map(|(i, _)| i),
    );
    Taken {
        phys: v.slots.iter_mut().filter_map(Option::take).collect(),
        reservations: std::mem::take(&mut v.reservations).into_values().collect(),
        mappings: std::mem::take(&mut v.mappings).into_values().collect(),
    }
}

/// `aclrtPhysicalMemProp` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AclPhysicalMemProp {
    /// `aclrtMemHandleType`: NONE (0) or POSIX (2).
    pub handle_type: u32,
    /// `aclrtMemAllocationType`: PINNED (0).
    pub allocation_type: u32,
    /// `aclrtMemAttr` (0..=17).
    pub mem_attr: u32,
    /// `aclrtMemLocation.id`.
    pub location_id: u32,
    /// `aclrtMemLocation.type`: DEVICE (1), or HOST (0) for host physical memory.
    pub location_type: u32,
    /// `reserve`.
    pub reserve: u64,
}

impl AclPhysicalMemProp {
    /// The properties an imported handle reports: DEVICE `device`, handle type NONE, PINNED,
    /// `ACL_HBM_MEM_HUGE` (4).
    pub fn imported(device: u32) -> AclPhysicalMemProp {
        AclPhysicalMemProp {
            handle_type: 0,
            allocation_type: 0,
            mem_attr: 4,
            location_id: device,
            location_type: 1,
            reserve: 0,
        }
    }
}

/// `ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION`.
pub const EXPORT_FLAG_DISABLE_PID_VALIDATION: u64 =
    hetmem::spec::ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION;
/// A physical memory handle (`aclrtDrvMemHandle`).
#[derive(Debug)]
pub struct Phys {
    /// The handle given to C.
    pub handle: usize,
    /// The context that made or imported it.
    pub ctx: Arc<Ctx>,
    /// The hetmem physical memory object.
    pub mem: hetmem::PhysicalMemory,
    /// The properties it was made with (`aclrtMallocPhysical`) or imported as
    /// (`aclrtMemImportFromShareableHandle`): `aclrtMemGetAllocationPropertiesFromHandle`.
    pub prop: AclPhysicalMemProp,
    /// Retains (`aclrtMemRetainAllocationHandle`) not yet given back: each is one more
    /// `aclrtFreePhysical` the handle takes before its memory goes.
    pub retains: std::sync::atomic::AtomicUsize,
    /// Set when `aclrtMemExportToShareableHandle` exports it, cleared when the export is ended
    /// (so that only an exported handle asks hetmem to end an export, and only once).
    exported: std::sync::atomic::AtomicBool,
}

impl Phys {
    /// Ends the export, if any (importers keep what they imported); once.
    pub fn unexport(&self) {
        if self.exported.swap(false, Ordering::AcqRel) {
            self.ctx.ctx.acl_unexport_shareable(self.mem);
        }
    }
}

impl Drop for Phys {
    fn drop(&mut self) {
        self.unexport();
    }
}

/// Decodes `prop` ([`hetmem::acl::check_physical_prop`]) and looks up its device (DEVICE
/// location; `None` for HOST).
fn check_prop(g: &state::Global, prop: &AclPhysicalMemProp) -> Res<Option<hetmem::Device>> {
    match hetmem::acl::check_physical_prop(
        prop.handle_type,
        prop.allocation_type,
        prop.mem_attr,
        prop.location_type,
    )? {
        hetmem::spec::PhysLocationType::Device => Ok(Some(g.device(prop.location_id as i64)?)),
        hetmem::spec::PhysLocationType::Host => Ok(None),
    }
}

/// `aclrtMemGetAllocationGranularity`: the size and alignment unit of reservations, physical
/// memory and mappings on `prop`'s device: the page size hetmem answers for 2 MiB (2 MiB on
/// the host backend), for both MINIMUM and RECOMMENDED.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer; `ACL_ERROR_RT_PARAM_INVALID`
/// (107000) for an option that is not MINIMUM (0) or RECOMMENDED (1), or a property out of
/// range (handle type, allocation type, memAttr, location type, device id).
#[no_mangle]
pub unsafe extern "C" fn aclrtMemGetAllocationGranularity(
    prop: *const AclPhysicalMemProp,
    option: u32,
    granularity: *mut usize,
) -> AclError {
    entry("aclrtMemGetAllocationGranularity", || {
        let g = state::fast_global()?;
        if prop.is_null() || granularity.is_null() {
            return Err(null(if prop.is_null() {
                "prop"
            } else {
                "granularity"
            }));
        }
        // SAFETY: non-null, the caller's struct.
        let p = unsafe { prop.read_unaligned() };
        let dev = check_prop(&g, &p)?;
        hetmem::spec::GranularityOption::from_raw(option)?;
        let c = g.current()?;
        let dev = dev.unwrap_or_else(|| c.dev.clone());
        let page = c.ctx.acl_granularity(&dev)?;
        // SAFETY: non-null out-pointer.
        unsafe { out(granularity, page) };
        Ok(())
    })
}

/// `aclrtReserveMemAddress`: reserves `size` bytes of virtual address space in the current
/// context (inaccessible until mapped), aligned to the granularity. `expectPtr` is a hint:
/// used when aligned and free, otherwise another address is chosen. `alignment` 0 or a power
/// of two up to the granularity (every reservation is aligned to it); `flags` is not used.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null `virPtr` or size 0;
/// `ACL_ERROR_RT_PARAM_INVALID` (107000) for a size that is not a multiple of the granularity
/// (`aclrtMemGetAllocationGranularity`), or another alignment; 207001 when the address space is
/// exhausted.
#[no_mangle]
pub unsafe extern "C" fn aclrtReserveMemAddress(
    vir_ptr: *mut *mut libc::c_void,
    size: usize,
    alignment: usize,
    expect_ptr: *mut libc::c_void,
    _flags: u64,
) -> AclError {
    entry("aclrtReserveMemAddress", || {
        let g = state::fast_global()?;
        if vir_ptr.is_null() {
            return Err(null("virPtr"));
        }
        hetmem::acl::check_nonzero(size, "size")?;
        let c = g.current()?;
        hetmem::acl::check_vmm_size(size, c.gran)?;
        hetmem::acl::check_reserve_alignment(alignment, c.gran)?;
        let hint = (!expect_ptr.is_null()).then_some(expect_ptr as usize);
        let r = c.ctx.reserve(hint, size)?;
        let base = r.base;
        {
            let mut v = VMM.lock();
            if let Err(f) = v.accepts(c) {
                drop(v);
                // Its context ended while it was made: it goes with it, unfiled.
                let _ = c.ctx.free_reservation(r);
                return Err(f);
            }
            v.reservations.insert(base, Reserved { ctx: c.clone(), r });
        }
        // SAFETY: non-null out-pointer.
        unsafe { out(vir_ptr, base as *mut libc::c_void) };
        Ok(())
    })
}

/// `aclrtReleaseMemAddress`: releases a reservation (its mappings are unmapped first; the
/// physical memory stays).
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for NULL; `ACL_ERROR_RT_PARAM_INVALID` (107000)
/// for anything but the base of a live reservation of this library.
#[no_mangle]
pub extern "C" fn aclrtReleaseMemAddress(vir_ptr: *mut libc::c_void) -> AclError {
    entry("aclrtReleaseMemAddress", || {
        let p = vir_ptr as usize;
        // Taken out first with the records of its mappings (one hold of the registry), put
        // back if the free is refused; the free may wait for device work, so it runs with the
        // registry released. (Records taken after the free could be those of a new reservation
        // another thread made at the same address meanwhile.)
        let (r, maps) = {
            let mut reg = VMM.lock();
            reg.live()?;
            if p == 0 {
                return Err(null("virPtr"));
            }
            let Some(r) = reg.reservations.remove(&p) else {
                return Err(hetmem::Error::InvalidArgument(format!(
                    "{p:#x} is not the base of a reservation of aclrtReserveMemAddress"
                ))
                .into());
            };
            // Empty, and allocating nothing, where everything was unmapped first (the
            // sleep-mode allocator's way).
            let maps = take_records(&mut reg.mappings, p, r.r.size, r.ctx.gran);
            // Counted under the lock (see `VmmLock`), given back once the free has returned.
            VMM.releasing.fetch_add(1, Ordering::Relaxed);
            (r, maps)
        };
        let freed = r.ctx.ctx.free(r.r.base, r.r.size);
        if let Err(e) = freed {
            let mut reg = VMM.lock();
            // Put back unless its context ended meanwhile (which took its records).
            if reg.accepts(&r.ctx).is_ok() {
                reg.reservations.insert(p, r);
                reg.mappings.extend(maps);
            }
            VMM.releasing.fetch_sub(1, Ordering::Release);
            return Err(e.into());
        }
        VMM.releasing.fetch_sub(1, Ordering::Release);
        Ok(())
    })
}

/// `aclrtMallocPhysical`: `size` bytes of physical memory on `prop`'s device (DEVICE location)
/// or in host memory (HOST location), charged to the device's capacity; `size` a multiple of
/// the granularity.
///
/// Errors (`*handle` unchanged): `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer, size 0
/// or flags other than 0; `ACL_ERROR_RT_PARAM_INVALID` (107000) for a property out of range or
/// a size that is not a multiple of the granularity; 207001 when the device is full.
#[no_mangle]
pub unsafe extern "C" fn aclrtMallocPhysical(
    handle: *mut *mut libc::c_void,
    size: usize,
    prop: *const AclPhysicalMemProp,
    flags: u64,
) -> AclError {
    entry("aclrtMallocPhysical", || {
        let g = state::fast_global()?;
        if handle.is_null() || prop.is_null() {
            return Err(null(if handle.is_null() { "handle" } else { "prop" }));
        }
        hetmem::acl::check_nonzero(size, "size")?;
        hetmem::acl::check_flags_zero(flags)?;
        // SAFETY: non-null, the caller's struct.
        let p = unsafe { prop.read_unaligned() };
        let dev = check_prop(&g, &p)?;
        let c = g.current()?;
        let gran = match &dev {
            Some(d) if *d != c.dev => c.ctx.acl_granularity(d)?,
            _ => c.gran,
        };
        hetmem::acl::check_vmm_size(size, gran)?;
        let mem = match &dev {
            Some(d) => c.ctx.create_physical_memory(
                Some(d),
                hetmem::PhysicalMemoryFlags::AllocateOnDevice,
                size,
            )?,
            None => c.ctx.create_physical_memory(
                None,
                hetmem::PhysicalMemoryFlags::AllocateOnHost,
                size,
            )?,
        };
        let h = register(c, mem, p)?;
        // SAFETY: non-null out-pointer.
        unsafe { out(handle, h as *mut libc::c_void) };
        Ok(())
    })
}

/// Files `mem`, made or imported in `ctx`, as a physical memory handle; its number.
///
/// Errors: those of [`Vmm::accepts`] and [`Vmm::insert`] (`mem` is destroyed then).
fn register(ctx: &Arc<Ctx>, mem: hetmem::PhysicalMemory, prop: AclPhysicalMemProp) -> Res<usize> {
    let mut v = VMM.lock();
    let filed = v.accepts(ctx).and_then(|()| {
        v.insert(|handle| Phys {
            handle,
            ctx: ctx.clone(),
            mem,
            prop,
            retains: Default::default(),
            exported: Default::default(),
        })
    });
    if filed.is_err() {
        drop(v);
        let _ = ctx.ctx.destroy_physical_memory(mem);
    }
    filed
}

/// `aclrtFreePhysical`: releases physical memory (made or imported); its export, if any, ends
/// (processes that imported it keep their memory).
///
/// Errors: `ACL_ERROR_RT_PARAM_INVALID` (107000) for a handle that is not live, or memory still
/// mapped (unmap it first; nothing changes).
#[no_mangle]
pub extern "C" fn aclrtFreePhysical(handle: *mut libc::c_void) -> AclError {
    entry("aclrtFreePhysical", || {
        let h = handle as usize;
        // Looked up, freed and taken out in one hold of the registry: other threads see the
        // handle live until hetmem has freed it (a refused free changes nothing), and gone
        // after. (hetmem's free runs under the lock: other VMM calls wait for it.)
        let p = {
            let mut v = VMM.lock();
            v.live()?;
            let p = v.phys_or_fail(h)?;
            // A retain of aclrtMemRetainAllocationHandle given back: the memory stays.
            let retained = p.retains.load(Ordering::Relaxed);
            if retained > 0 {
                p.retains.store(retained - 1, Ordering::Relaxed);
                return Ok(());
            }
            p.ctx.ctx.destroy_physical_memory(p.mem)?;
            v.remove(h)
        };
        // Its export (if any) ends as it drops, with the lock released.
        drop(p);
        Ok(())
    })
}

/// `aclrtMapMem`: maps `[offset, offset+size)` of the physical memory at `virPtr`, inside a
/// reservation, readable and writable; one mapping per `virPtr` (`aclrtUnmapMem` takes it).
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for NULL, size 0 or flags other than 0;
/// `ACL_ERROR_RT_PARAM_INVALID` (107000) for a handle that is not live, a size not a multiple
/// of the granularity, a range not inside one reservation or overlapping a mapping, or
/// past the end of the physical memory; `ACL_ERROR_RT_ADDR_UNALIGNED` (107008) for an address
/// or offset not aligned to the page size.
#[no_mangle]
pub extern "C" fn aclrtMapMem(
    vir_ptr: *mut libc::c_void,
    size: usize,
    offset: usize,
    handle: *mut libc::c_void,
    flags: u64,
) -> AclError {
    entry("aclrtMapMem", || {
        map_mem(
            vir_ptr,
            size,
            offset,
            handle,
            flags,
            hetmem::AccessAttribute::ReadWrite,
        )
    })
}

/// `aclrtMapMem` (`access` ReadWrite) and `aclrtMemMapNoAccess` (None).
pub(crate) fn map_mem(
    vir_ptr: *mut libc::c_void,
    size: usize,
    offset: usize,
    handle: *mut libc::c_void,
    flags: u64,
    access: hetmem::AccessAttribute,
) -> Res {
    {
        // One hold of the registry: map never waits for device work, so holding it is short
        // (and the handle is borrowed, not counted). The mapping's record is filed before the
        // map (taken back if it is refused): after a driver call that long, little of what the
        // library touches is still in the caches.
        let mut guard = VMM.lock();
        let reg = &mut *guard;
        reg.live()?;
        if vir_ptr.is_null() {
            return Err(null("virPtr"));
        }
        hetmem::acl::check_flags_zero(flags)?;
        hetmem::acl::check_nonzero(size, "size")?;
        let va = vir_ptr as usize;
        let h = handle as usize;
        let Vmm {
            slots,
            mappings,
            reservations,
            ..
        } = reg;
        let p = find(slots, h).ok_or_else(|| state::bad_handle("physical memory handle", h))?;
        hetmem::acl::check_vmm_size(size, p.ctx.gran)?;
        // A release in flight (see `VmmLock`): no record for a range outside every filed
        // reservation (hetmem answers the map as it finds it).
        let file = VMM.releasing.load(Ordering::Acquire) == 0
            || reservations
                .range(..=va)
                .next_back()
                .is_some_and(|(b, r)| va.saturating_add(size) <= b + r.r.size);
        let before = if file {
            mappings.insert(va, (size, p.ctx.clone()))
        } else {
            None
        };
        if let Err(e) = p.ctx.ctx.map(va, size, p.mem, offset, access) {
            // Refused: the registry as it was.
            if file {
                match before {
                    Some(b) => mappings.insert(va, b),
                    None => mappings.remove(&va),
                };
            }
            return Err(e.into());
        }
        Ok(())
    }
}

/// `aclrtUnmapMem`: unmaps the mapping `aclrtMapMem` made at `virPtr` (the pages stay
/// reserved, inaccessible; the physical memory stays). Waits for stream work using the
/// reservation.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for NULL; `ACL_ERROR_RT_PARAM_INVALID` (107000)
/// for an address where `aclrtMapMem` did not map.
#[no_mangle]
pub extern "C" fn aclrtUnmapMem(vir_ptr: *mut libc::c_void) -> AclError {
    entry("aclrtUnmapMem", || {
        let va = vir_ptr as usize;
        // Taken out first (one hold of the registry), put back if the unmap is refused; the
        // unmap itself may wait for device work, so it runs with the registry released.
        let (size, ctx) = {
            let mut v = VMM.lock();
            v.live()?;
            if va == 0 {
                return Err(null("virPtr"));
            }
            v.mappings.remove(&va).ok_or_else(|| {
                Fail::from(hetmem::Error::InvalidArgument(format!(
                    "{va:#x} is not an address aclrtMapMem mapped"
                )))
            })?
        };
        if let Err(e) = ctx.ctx.unmap(va, size) {
            let mut v = VMM.lock();
            // Put back unless its context ended meanwhile (which took its records).
            if v.accepts(&ctx).is_ok() {
                v.mappings.insert(va, (size, ctx));
            }
            return Err(e.into());
        }
        Ok(())
    })
}

/// `aclrtMemExportToShareableHandle`: a `uint64_t` another process (of the same user) imports
/// with `aclrtMemImportFromShareableHandle` (see the module docs). One export per handle.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer or flags other than DEFAULT (0)
/// / DISABLE_PID_VALIDATION (1); `ACL_ERROR_RT_PARAM_INVALID` (107000) for a handle that is not
/// live or already exported, or a handle type other than NONE (0) / POSIX (2).
#[no_mangle]
pub unsafe extern "C" fn aclrtMemExportToShareableHandle(
    handle: *mut libc::c_void,
    handle_type: u32,
    flags: u64,
    shareable: *mut u64,
) -> AclError {
    entry("aclrtMemExportToShareableHandle", || {
        let (ctx, mem) = {
            let v = VMM.lock();
            v.live()?;
            if shareable.is_null() {
                return Err(null("shareableHandle"));
            }
            let p = v.phys_or_fail(handle as usize)?;
            hetmem::spec::MemHandleType::from_raw(handle_type)?;
            // Marked before the export, so a free racing with it ends what it made (ending an
            // export that failed, or was never made, changes nothing).
            p.exported.store(true, Ordering::Release);
            (p.ctx.clone(), p.mem)
        };
        let s = ctx.ctx.acl_export_shareable(mem, flags)?;
        // SAFETY: non-null out-pointer.
        unsafe { out(shareable, s) };
        Ok(())
    })
}

/// `aclrtMemSetPidToShareableHandle`: the processes (by pid) that may import `shareableHandle`
/// (exported by this process without DISABLE_PID_VALIDATION); replaces the previous list.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null list or `pidNum` 0;
/// `ACL_ERROR_RT_PARAM_INVALID` (107000) for a value this process did not export (or whose
/// export ended).
#[no_mangle]
pub unsafe extern "C" fn aclrtMemSetPidToShareableHandle(
    shareable: u64,
    pid: *const i32,
    pid_num: usize,
) -> AclError {
    entry("aclrtMemSetPidToShareableHandle", || {
        let g = state::fast_global()?;
        if pid.is_null() {
            return Err(null("pid"));
        }
        hetmem::acl::check_pid_count(pid_num)?;
        // SAFETY: an array of `pid_num` pids (the caller's contract; the count is checked).
        let pids = unsafe { std::slice::from_raw_parts(pid, pid_num) };
        Ok(g.rt.driver().acl_set_shareable_pids(shareable, pids)?)
    })
}

/// `aclrtMemImportFromShareableHandle`: physical memory shared by another process (or this
/// one) as a handle of this process, on device `deviceId`, to map with `aclrtMapMem` and
/// release with `aclrtFreePhysical`. It stays valid after the exporter frees its handle or
/// exits.
///
/// Errors (`*handle` unchanged): `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer;
/// `ACL_ERROR_RT_PARAM_INVALID` (107000) for a bad device id, a value that was never exported or
/// whose export ended, a process not on the exporter's pid list, or an exporter that is gone.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemImportFromShareableHandle(
    shareable: u64,
    device_id: i32,
    handle: *mut *mut libc::c_void,
) -> AclError {
    entry("aclrtMemImportFromShareableHandle", || {
        let g = state::fast_global()?;
        if handle.is_null() {
            return Err(null("handle"));
        }
        let dev = g.device(device_id as i64)?;
        let c = g.current()?;
        let mem = c.ctx.acl_import_shareable(shareable, &dev)?;
        let ph = register(c, mem, AclPhysicalMemProp::imported(device_id as u32))?;
        // SAFETY: non-null out-pointer.
        unsafe { out(handle, ph as *mut libc::c_void) };
        Ok(())
    })
}
