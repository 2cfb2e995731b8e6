//! Model-based property test of the IPC state of one process (exporter and importer in the
//! same process: open looks the export up directly, as it does for any exporter in-process).
//!
//! Random sequences of: device / host allocation; physical object creation, mapping into and
//! unmapping from an arena of three adjacent reservations; destroy; free; get a handle for an
//! allocation (interior pointers), a mapped page, a physical object, or a range (random OS-page
//! offsets and sizes, holes, size 0, null, unaligned, over USM); open (the same handle many
//! times), write through views and through the exporter's pointers, close (valid, interior,
//! null, closed, non-view pointers), put (valid, twice). A deliberately simple reference model
//! predicts each outcome (Ok or the exact `ze_result_t`) before the call. After every step the
//! driver's live exports and open views ([`hetmem::Driver::ipc_stats`]), its allocation and
//! physical-object counts, and the words every exporter pointer and every view sees must match
//! the model: views of the same object alias each other and the exporter; a range view is a
//! snapshot of the objects mapped at export; memory stays valid in views after the exporter
//! frees or destroys it. A failed call must change nothing: exports, views, counters and the
//! process's fd count (`/proc/self/fd`).
//!
//! Memory is modelled per OS page ("sub-page"): two probe words (the first and the last of each
//! OS page) per page; writes only touch probe words, and every probe word of every pointer the
//! model knows is compared after each step.
//!
//! On cuda: the sub-page is the unit of range handles there, the 2 MiB page (as the base page);
//! words are read and written through the runtime's copies (`dev_*`); host USM has no
//! shareable handle, so its export is the error UNSUPPORTED_FEATURE; fresh memory is zeroed by
//! the test before the model knows it (nothing requires a backend to zero it), and the
//! process's fd count is the host backend's fact. Fewer cases run.

mod common;

use common::runtime_with;

use common::ze::{
    ADDRESS_NOT_FOUND, HANDLE_OBJECT_IN_USE, INVALID_ARGUMENT, INVALID_NULL_POINTER, INVALID_SIZE,
};

use std::collections::HashMap;
use std::sync::{Once, OnceLock};

use hetmem::platform::{open_fd_count, page_size as os_page_size};
use hetmem::{
    AccessAttribute, AllocDesc, Context, Driver, IpcHandle, IpcHandleKind, IpcProperties,
    PhysicalMemory, PhysicalMemoryFlags, Reservation, Runtime,
};
use proptest::prelude::*;
use proptest::test_runner::Config;

/// The host backend's base page (unit of map / unmap and of allocation sizes; `World::page`).
const HOST_PAGE: usize = 64 << 10;
/// `ze_result_t` of an export of memory the backend cannot share.
/// Pages per reservation of the arena.
const RES_PAGES: usize = 4;
/// Reservations in the arena (adjacent).
const RESERVATIONS: usize = 3;
const ARENA_PAGES: usize = RES_PAGES * RESERVATIONS;

/// Memory the model knows: an allocation or a physical object (model ids, never reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Alloc(usize),
    Phys(usize),
}

/// One OS page of some memory.
type Sub = (Key, usize);

#[derive(Debug)]
struct MAlloc {
    key: Key,
    ptr: usize,
    subs: usize,
}

#[derive(Debug)]
struct MPhys {
    key: Key,
    pm: PhysicalMemory,
    subs: usize,
}

#[derive(Debug)]
struct MExport {
    handle: IpcHandle,
    kind: IpcHandleKind,
    layout: Vec<Sub>,
    live: bool,
    /// Gets not yet put (gets of the same memory count on one export: case 6 of
    /// `shared/cases/level-zero.md`).
    refs: usize,
    /// What it shares, for gets of the same memory: `(key, 0, usize::MAX)` a whole
    /// allocation or physical object, `(key, first sub, subs)` a mapping of part of an object
    /// (case 8); `None` a range handle (each get its own export).
    source: Option<(Key, usize, usize)>,
}

#[derive(Debug)]
struct MView {
    ptr: usize,
    layout: Vec<Sub>,
}

/// The reference model.
#[derive(Debug, Default)]
struct Model {
    allocs: Vec<MAlloc>,
    phys: Vec<MPhys>,
    /// What each OS page of the arena maps, if anything.
    arena: Vec<Option<Sub>>,
    exports: Vec<MExport>,
    views: Vec<MView>,
    /// Pointers of views closed (not open now).
    closed: Vec<usize>,
    /// Probe words written: (memory page, probe 0 / 1) -> value; unwritten words are 0.
    mem: HashMap<(Sub, u8), u64>,
    next: usize,
}

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        device: bool,
        pages: usize,
    },
    CreatePhys {
        pages: usize,
    },
    Map {
        obj: usize,
        off: usize,
        at: usize,
        len: usize,
    },
    Unmap {
        at: usize,
        len: usize,
    },
    Free {
        sel: usize,
    },
    Destroy {
        sel: usize,
    },
    GetAlloc {
        sel: usize,
        at: usize,
    },
    GetMapped {
        at: usize,
    },
    GetPhys {
        sel: usize,
    },
    GetRange {
        how: u8,
        start: usize,
        len: usize,
    },
    Open {
        sel: usize,
        flags: u32,
    },
    Close {
        how: u8,
        sel: usize,
    },
    Put {
        sel: usize,
    },
    /// Open or put a stale handle (its context is gone) or a forged one (a live handle with a
    /// token byte changed).
    Stale {
        forged: bool,
        open: bool,
        sel: usize,
    },
    Write {
        target: u8,
        sel: usize,
        at: usize,
        probe: u8,
        value: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let sel = any::<usize>;
    prop_oneof![
        2 => (any::<bool>(), 1..4usize).prop_map(|(device, pages)| Op::Alloc { device, pages }),
        2 => (1..5usize).prop_map(|pages| Op::CreatePhys { pages }),
        8 => (sel(), sel(), 0..ARENA_PAGES, 1..5usize)
            .prop_map(|(obj, off, at, len)| Op::Map { obj, off, at, len }),
        2 => (0..ARENA_PAGES, 1..4usize).prop_map(|(at, len)| Op::Unmap { at, len }),
        1 => sel().prop_map(|sel| Op::Free { sel }),
        1 => sel().prop_map(|sel| Op::Destroy { sel }),
        2 => (sel(), sel()).prop_map(|(sel, at)| Op::GetAlloc { sel, at }),
        2 => sel().prop_map(|at| Op::GetMapped { at }),
        2 => sel().prop_map(|sel| Op::GetPhys { sel }),
        6 => (0..6u8, sel(), 0..48usize).prop_map(|(how, start, len)| Op::GetRange {
            how,
            start,
            len
        }),
        8 => (sel(), 0..4u32).prop_map(|(sel, flags)| Op::Open { sel, flags }),
        3 => (0..6u8, sel()).prop_map(|(how, sel)| Op::Close { how, sel }),
        2 => sel().prop_map(|sel| Op::Put { sel }),
        1 => (any::<bool>(), any::<bool>(), sel())
            .prop_map(|(forged, open, sel)| Op::Stale { forged, open, sel }),
        6 => (0..3u8, sel(), sel(), 0..2u8, any::<u64>()).prop_map(
            |(target, sel, at, probe, value)| Op::Write {
                target,
                sel,
                at,
                probe,
                value
            }
        ),
    ]
}

/// The world under test: a driver, a context and the arena.
struct World {
    _rt: Runtime,
    d: Driver,
    ctx: Context,
    arena: Vec<Reservation>,
    /// The base page: 64 KiB on the host backend, 2 MiB on cuda.
    page: usize,
    sub: usize,
}

impl World {
    fn arena_ptr(&self, sub: usize) -> usize {
        self.arena[0].base + sub * self.sub
    }
    fn subs_per_page(&self) -> usize {
        self.page / self.sub
    }
    /// Everything a failed call must leave alone (the fd count on the host backend only).
    fn state(&self) -> impl PartialEq + std::fmt::Debug {
        (
            self.d.ipc_stats(),
            self.d.vm_stats(),
            self.d.usm_stats(),
            common::on_host().then(open_fd_count),
        )
    }
    /// Zeroes `size` fresh bytes at `p` on a backend that does not (the model's unwritten
    /// words are 0).
    fn zero(&self, p: usize, size: usize) {
        if !common::on_host() {
            common::dev_put(&self.ctx, p, &vec![0; size]);
        }
    }
}

/// The address of probe `probe` of OS page `sub` of memory starting at `base`.
fn probe_addr(base: usize, sub: usize, probe: u8, page: usize) -> usize {
    base + sub * page + if probe == 0 { 0 } else { page - 8 }
}

// The model only reads and writes probe words of memory mapped read-write, as the device sees
// them.
fn read(w: &World, p: usize) -> u64 {
    common::dev_read(&w.ctx, p)
}
fn write(w: &World, p: usize, v: u64) {
    common::dev_write(&w.ctx, p, v)
}

impl Model {
    fn fresh(&mut self) -> usize {
        self.next += 1;
        self.next
    }
    fn word(&self, s: Sub, probe: u8) -> u64 {
        self.mem.get(&(s, probe)).copied().unwrap_or(0)
    }
    fn live_exports(&self) -> usize {
        self.exports.iter().filter(|e| e.live).count()
    }
    /// Records a get: another get of the live export of `source` (the same handle, counted),
    /// or a new export.
    fn got(
        &mut self,
        handle: IpcHandle,
        kind: IpcHandleKind,
        layout: Vec<Sub>,
        source: Option<(Key, usize, usize)>,
    ) -> std::result::Result<(), TestCaseError> {
        if let Some(e) = self
            .exports
            .iter_mut()
            .find(|e| e.live && source.is_some() && e.source == source)
        {
            prop_assert_eq!(
                e.handle,
                handle,
                "a get of exported memory gives its handle"
            );
            e.refs += 1;
            return Ok(());
        }
        prop_assert!(
            self.exports.iter().all(|e| e.handle != handle),
            "a new export gives a new handle"
        );
        self.exports.push(MExport {
            handle,
            kind,
            layout,
            live: true,
            refs: 1,
            source,
        });
        Ok(())
    }
    /// The arena's reservation index of arena page `p`.
    fn res_of(p: usize) -> usize {
        p / RES_PAGES
    }
}

/// Expects `r` to be the error `code` and `w`'s state unchanged around it.
fn expect_err<T: std::fmt::Debug>(
    w: &World,
    code: u32,
    what: &str,
    call: impl FnOnce() -> hetmem::Result<T>,
) -> std::result::Result<(), TestCaseError> {
    let before = w.state();
    let r = call();
    let after = w.state();
    match r {
        Ok(v) => Err(TestCaseError::fail(format!(
            "{what}: expected {code:#x}, got Ok({v:?})"
        ))),
        Err(e) => {
            prop_assert_eq!(e.ze_result(), code, "{}: {}", what, e);
            prop_assert!(
                !e.message().is_empty(),
                "{}: an error without a message",
                what
            );
            prop_assert_eq!(after, before, "{}: a failed call changed something", what);
            Ok(())
        }
    }
}

fn step(w: &World, m: &mut Model, op: &Op) -> std::result::Result<(), TestCaseError> {
    let sub = w.sub;
    let spp = w.subs_per_page();
    let dev = w.d.device(0).unwrap();
    match *op {
        Op::Alloc { device, pages } => {
            let desc = AllocDesc::new(pages * w.page);
            let p = if device {
                w.ctx.alloc_device(&dev, &desc)
            } else {
                w.ctx.alloc_host(&desc)
            }
            .map_err(|e| TestCaseError::fail(format!("alloc: {e}")))?;
            w.zero(p, pages * w.page);
            let key = Key::Alloc(m.fresh());
            m.allocs.push(MAlloc {
                key,
                ptr: p,
                subs: pages * spp,
            });
        }
        Op::CreatePhys { pages } => {
            let pm = w
                .ctx
                .create_physical_memory(
                    Some(&dev),
                    PhysicalMemoryFlags::AllocateOnDevice,
                    pages * w.page,
                )
                .map_err(|e| TestCaseError::fail(format!("create: {e}")))?;
            if !common::on_host() {
                // Zeroed through a mapping of its own, gone again before the step ends.
                let size = pages * w.page;
                let r = w.ctx.reserve(None, size).unwrap();
                w.ctx
                    .map(r.base, size, pm, 0, AccessAttribute::ReadWrite)
                    .unwrap();
                w.zero(r.base, size);
                w.ctx.free_reservation(r).unwrap();
            }
            let key = Key::Phys(m.fresh());
            m.phys.push(MPhys {
                key,
                pm,
                subs: pages * spp,
            });
        }
        Op::Map { obj, off, at, len } => {
            if m.phys.is_empty() {
                return Ok(());
            }
            let o = &m.phys[obj % m.phys.len()];
            let pages = o.subs / spp;
            let off = off % pages;
            let len = len.min(pages - off);
            let end = at + len;
            // Only valid maps (map's own rules are vmm_model's business).
            if end > ARENA_PAGES
                || Model::res_of(at) != Model::res_of(end - 1)
                || (at * spp..end * spp).any(|s| m.arena[s].is_some())
            {
                return Ok(());
            }
            w.ctx
                .map(
                    w.arena_ptr(at * spp),
                    len * w.page,
                    o.pm,
                    off * w.page,
                    AccessAttribute::ReadWrite,
                )
                .map_err(|e| TestCaseError::fail(format!("map: {e}")))?;
            let key = o.key;
            for i in 0..len * spp {
                m.arena[at * spp + i] = Some((key, off * spp + i));
            }
        }
        Op::Unmap { at, len } => {
            let end = (at + len).min(ARENA_PAGES);
            // Inside one reservation: the mapped pages go, the others stay unmapped (a range
            // with nothing mapped succeeds, the reference driver's answer).
            let ok = Model::res_of(at) == Model::res_of(end - 1);
            let (p, size) = (w.arena_ptr(at * spp), (end - at) * w.page);
            if ok {
                w.ctx
                    .unmap(p, size)
                    .map_err(|e| TestCaseError::fail(format!("unmap: {e}")))?;
                for s in at * spp..end * spp {
                    m.arena[s] = None;
                }
            } else {
                expect_err(w, INVALID_ARGUMENT, "unmap across reservations", || {
                    w.ctx.unmap(p, size)
                })?;
            }
        }
        Op::Free { sel } => {
            if m.allocs.is_empty() {
                return Ok(());
            }
            let a = m.allocs.remove(sel % m.allocs.len());
            w.ctx
                .free_memory(a.ptr)
                .map_err(|e| TestCaseError::fail(format!("free: {e}")))?;
        }
        Op::Destroy { sel } => {
            if m.phys.is_empty() {
                return Ok(());
            }
            let i = sel % m.phys.len();
            let (key, pm) = (m.phys[i].key, m.phys[i].pm);
            if m.arena.iter().flatten().any(|&(k, _)| k == key) {
                expect_err(
                    w,
                    HANDLE_OBJECT_IN_USE,
                    "destroy of a mapped object",
                    || w.ctx.destroy_physical_memory(pm),
                )?;
            } else {
                w.ctx
                    .destroy_physical_memory(pm)
                    .map_err(|e| TestCaseError::fail(format!("destroy: {e}")))?;
                m.phys.remove(i);
            }
        }
        Op::GetAlloc { sel, at } => {
            if m.allocs.is_empty() {
                return Ok(());
            }
            let a = &m.allocs[sel % m.allocs.len()];
            // Any byte of the allocation names the whole allocation.
            let p = a.ptr + at % (a.subs * sub);
            let h = w
                .ctx
                .get_ipc_handle(p)
                .map_err(|e| TestCaseError::fail(format!("get alloc: {e}")))?;
            prop_assert_eq!(h.size(), Some(a.subs * sub));
            let layout = (0..a.subs).map(|s| (a.key, s)).collect();
            let key = a.key;
            m.got(
                h,
                IpcHandleKind::Allocation,
                layout,
                Some((key, 0, usize::MAX)),
            )?;
        }
        Op::GetMapped { at } => {
            let s = at % (ARENA_PAGES * spp);
            let p = w.arena_ptr(s) + (at >> 20) % sub;
            match m.arena[s] {
                None => expect_err(w, INVALID_ARGUMENT, "get of an unmapped page", || {
                    w.ctx.get_ipc_handle(p)
                })?,
                Some((key, _)) => {
                    let o = m
                        .phys
                        .iter()
                        .find(|o| o.key == key)
                        .expect("mapped is live");
                    let h = w
                        .ctx
                        .get_ipc_handle(p)
                        .map_err(|e| TestCaseError::fail(format!("get mapped: {e}")))?;
                    // The mapping around s: sub-pages mapped contiguously from the object,
                    // inside the reservation of s (case 8).
                    let lo = Model::res_of(s / spp) * RES_PAGES * spp;
                    let hi = lo + RES_PAGES * spp;
                    let idx = |t: usize| m.arena[t].filter(|x| x.0 == key).map(|x| x.1);
                    let i0 = idx(s).expect("mapped");
                    let mut a = s;
                    while a > lo && idx(a - 1) == Some(i0 + a - 1 - s) {
                        a -= 1;
                    }
                    let mut b = s + 1;
                    while b < hi && idx(b) == Some(i0 + b - s) {
                        b += 1;
                    }
                    let first = i0 + a - s;
                    let subs = o.subs;
                    if first == 0 && b - a == subs {
                        prop_assert_eq!(h.size(), Some(subs * sub));
                        let layout = (0..subs).map(|i| (key, i)).collect();
                        m.got(
                            h,
                            IpcHandleKind::Physical,
                            layout,
                            Some((key, 0, usize::MAX)),
                        )?;
                    } else {
                        prop_assert_eq!(h.size(), Some((b - a) * sub), "the mapping's size");
                        let layout = (first..first + b - a).map(|i| (key, i)).collect();
                        m.got(h, IpcHandleKind::Range, layout, Some((key, first, b - a)))?;
                    }
                }
            }
        }
        Op::GetPhys { sel } => {
            if m.phys.is_empty() {
                return Ok(());
            }
            let o = &m.phys[sel % m.phys.len()];
            let h = w
                .ctx
                .get_physical_memory_ipc_handle(o.pm, None)
                .map_err(|e| TestCaseError::fail(format!("get physical: {e}")))?;
            prop_assert_eq!(h.size(), Some(o.subs * sub));
            let layout = (0..o.subs).map(|i| (o.key, i)).collect();
            let key = o.key;
            m.got(
                h,
                IpcHandleKind::Physical,
                layout,
                Some((key, 0, usize::MAX)),
            )?;
        }
        Op::GetRange { how, start, len } => {
            let total = ARENA_PAGES * spp;
            let s = start % total;
            let len = len.min(total - s);
            let range = |n: usize| IpcProperties {
                range_size: Some(n),
                ..Default::default()
            };
            match how {
                // Null.
                0 => expect_err(w, INVALID_NULL_POINTER, "range at null", || {
                    w.ctx
                        .get_ipc_handle_with_properties(0, &range(len.max(1) * sub))
                })?,
                // Over a USM allocation.
                1 if !m.allocs.is_empty() => {
                    let a = &m.allocs[start % m.allocs.len()];
                    let n = (len % a.subs).max(1) * sub;
                    expect_err(w, INVALID_ARGUMENT, "range over USM", || {
                        w.ctx.get_ipc_handle_with_properties(a.ptr, &range(n))
                    })?
                }
                // Starting and ending inside sub-pages (size 0 is checked first): shared like
                // any range where every touched page is mapped (checked at once, then put:
                // the model keeps page-aligned exports only), else the first unmapped byte.
                2 => {
                    let p = w.arena_ptr(s) + 8;
                    let n = (len * sub).saturating_sub(16);
                    if n == 0 {
                        expect_err(w, INVALID_SIZE, "range of size 0", || {
                            w.ctx.get_ipc_handle_with_properties(p, &range(0))
                        })?
                    } else if let Some(hole) = (s..s + len).find(|&i| m.arena[i].is_none()) {
                        let before = w.state();
                        let e = w
                            .ctx
                            .get_ipc_handle_with_properties(p, &range(n))
                            .unwrap_err();
                        prop_assert_eq!(e.ze_result(), ADDRESS_NOT_FOUND, "{}", e);
                        let at = format!("{:#x}", w.arena_ptr(hole).max(p));
                        prop_assert!(e.message().contains(&at), "{} should name {}", e, at);
                        prop_assert_eq!(w.state(), before);
                    } else {
                        let before = w.state();
                        let h =
                            w.ctx
                                .get_ipc_handle_with_properties(p, &range(n))
                                .map_err(|e| {
                                    TestCaseError::fail(format!("get unaligned range: {e}"))
                                })?;
                        prop_assert_eq!(h.size(), Some(n));
                        let v = w
                            .ctx
                            .open_ipc_handle(&h, 0)
                            .map_err(|e| TestCaseError::fail(format!("open: {e}")))?;
                        prop_assert_eq!(w.ctx.get_address_range(v).unwrap(), (v, n));
                        prop_assert_eq!(read(w, v), read(w, p));
                        prop_assert_eq!(read(w, v + n - 8), read(w, p + n - 8));
                        w.ctx.close_ipc_handle(v).unwrap();
                        w.ctx.put_ipc_handle(&h).unwrap();
                        prop_assert_eq!(w.state(), before);
                    }
                }
                _ => {
                    // `how` 3: start at a mapped page and stay in its mapped run (mostly
                    // succeeds; runs may cross reservations); 4, 5: anywhere (holes).
                    let (s, len) = match m
                        .arena
                        .iter()
                        .enumerate()
                        .filter(|x| x.1.is_some())
                        .nth(start % m.arena.iter().flatten().count().max(1))
                    {
                        Some((s, _)) if how == 3 => {
                            let run = m.arena[s..].iter().take_while(|x| x.is_some()).count();
                            (s, len.min(run))
                        }
                        _ => (s, len),
                    };
                    let p = w.arena_ptr(s);
                    if len == 0 {
                        expect_err(w, INVALID_SIZE, "range of size 0", || {
                            w.ctx.get_ipc_handle_with_properties(p, &range(0))
                        })?
                    } else if let Some(hole) = (s..s + len).find(|&i| m.arena[i].is_none()) {
                        let before = w.state();
                        let e = w
                            .ctx
                            .get_ipc_handle_with_properties(p, &range(len * sub))
                            .unwrap_err();
                        prop_assert_eq!(e.ze_result(), ADDRESS_NOT_FOUND, "{}", e);
                        let at = format!("{:#x}", w.arena_ptr(hole));
                        prop_assert!(e.message().contains(&at), "{} should name {}", e, at);
                        prop_assert_eq!(w.state(), before);
                    } else {
                        let h = w
                            .ctx
                            .get_ipc_handle_with_properties(p, &range(len * sub))
                            .map_err(|e| TestCaseError::fail(format!("get range: {e}")))?;
                        prop_assert_eq!(h.size(), Some(len * sub));
                        let layout = (s..s + len).map(|i| m.arena[i].unwrap()).collect();
                        m.got(h, IpcHandleKind::Range, layout, None)?;
                    }
                }
            }
        }
        Op::Open { sel, flags } => {
            if m.exports.is_empty() {
                return Ok(());
            }
            let e = &m.exports[sel % m.exports.len()];
            prop_assert_eq!(e.handle.kind(), Some(e.kind));
            if !e.live {
                expect_err(w, INVALID_ARGUMENT, "open of a put handle", || {
                    w.ctx.open_ipc_handle(&e.handle, flags)
                })?;
                return Ok(());
            }
            let v = w
                .ctx
                .open_ipc_handle(&e.handle, flags)
                .map_err(|err| TestCaseError::fail(format!("open: {err}")))?;
            let size = e.layout.len() * sub;
            prop_assert!(
                m.views.iter().all(|x| x.ptr != v),
                "open returned a pointer already open"
            );
            prop_assert_eq!(w.ctx.get_address_range(v).unwrap(), (v, size));
            prop_assert_eq!(w.ctx.get_address_range(v + size - 1).unwrap(), (v, size));
            m.closed.retain(|&c| c != v);
            m.views.push(MView {
                ptr: v,
                layout: e.layout.clone(),
            });
        }
        Op::Close { how, sel } => match how {
            0 => expect_err(w, INVALID_NULL_POINTER, "close of null", || {
                w.ctx.close_ipc_handle(0)
            })?,
            1 if !m.views.is_empty() => {
                // Interior pointer of a view.
                let v = &m.views[sel % m.views.len()];
                let p = v.ptr + 8 + (sel >> 8) % (v.layout.len() * sub - 8);
                expect_err(w, INVALID_ARGUMENT, "close of an interior pointer", || {
                    w.ctx.close_ipc_handle(p)
                })?
            }
            2 if !m.closed.is_empty() => {
                let p = m.closed[sel % m.closed.len()];
                expect_err(w, INVALID_ARGUMENT, "close of a closed view", || {
                    w.ctx.close_ipc_handle(p)
                })?
            }
            3 if !m.allocs.is_empty() => {
                let p = m.allocs[sel % m.allocs.len()].ptr;
                expect_err(w, INVALID_ARGUMENT, "close of an allocation", || {
                    w.ctx.close_ipc_handle(p)
                })?
            }
            _ if !m.views.is_empty() => {
                let v = m.views.remove(sel % m.views.len());
                w.ctx
                    .close_ipc_handle(v.ptr)
                    .map_err(|e| TestCaseError::fail(format!("close: {e}")))?;
                m.closed.push(v.ptr);
            }
            _ => {}
        },
        Op::Put { sel } => {
            if m.exports.is_empty() {
                return Ok(());
            }
            let i = sel % m.exports.len();
            let h = m.exports[i].handle;
            if m.exports[i].live {
                w.ctx
                    .put_ipc_handle(&h)
                    .map_err(|e| TestCaseError::fail(format!("put: {e}")))?;
                m.exports[i].refs -= 1;
                m.exports[i].live = m.exports[i].refs > 0;
            } else {
                expect_err(w, INVALID_ARGUMENT, "put twice", || {
                    w.ctx.put_ipc_handle(&h)
                })?;
            }
        }
        Op::Stale { forged, open, sel } => {
            let h = if forged {
                if m.exports.is_empty() {
                    return Ok(());
                }
                let mut h = m.exports[sel % m.exports.len()].handle;
                h.data[24 + sel % 16] ^= 1 << (sel % 8);
                h
            } else {
                *STALE.get().expect("warmed up")
            };
            if open {
                expect_err(
                    w,
                    INVALID_ARGUMENT,
                    "open of a stale / forged handle",
                    || w.ctx.open_ipc_handle(&h, 0),
                )?;
            } else {
                expect_err(
                    w,
                    INVALID_ARGUMENT,
                    "put of a stale / forged handle",
                    || w.ctx.put_ipc_handle(&h),
                )?;
            }
        }
        Op::Write {
            target,
            sel,
            at,
            probe,
            value,
        } => {
            let (base, s, memsub) = match target {
                0 if !m.views.is_empty() => {
                    let v = &m.views[sel % m.views.len()];
                    let s = at % v.layout.len();
                    (v.ptr, s, v.layout[s])
                }
                1 if !m.allocs.is_empty() => {
                    let a = &m.allocs[sel % m.allocs.len()];
                    let s = at % a.subs;
                    (a.ptr, s, (a.key, s))
                }
                _ => {
                    let s = at % (ARENA_PAGES * spp);
                    match m.arena[s] {
                        Some(x) => (w.arena_ptr(0), s, x),
                        None => return Ok(()),
                    }
                }
            };
            write(w, probe_addr(base, s, probe, sub), value);
            m.mem.insert((memsub, probe), value);
        }
    }
    Ok(())
}

/// Compares everything observable with the model.
fn check(w: &World, m: &Model) -> std::result::Result<(), TestCaseError> {
    let st = w.d.ipc_stats();
    prop_assert_eq!(st.exports, m.live_exports(), "live exports");
    prop_assert_eq!(st.views, m.views.len(), "open views");
    prop_assert_eq!(w.d.usm_stats().allocations, m.allocs.len());
    prop_assert_eq!(w.d.vm_stats().physical_objects, m.phys.len());
    let sub = w.sub;
    let look = |what: &str, base: usize, s: usize, memsub: Sub| {
        for probe in 0..2u8 {
            let got = read(w, probe_addr(base, s, probe, sub));
            let want = m.word(memsub, probe);
            if got != want {
                return Err(TestCaseError::fail(format!(
                    "{what} at {base:#x} page {s} probe {probe}: read {got:#x}, model \
                     {want:#x} ({memsub:?})"
                )));
            }
        }
        Ok(())
    };
    for a in &m.allocs {
        for s in 0..a.subs {
            look("allocation", a.ptr, s, (a.key, s))?;
        }
    }
    for (s, x) in m.arena.iter().enumerate() {
        if let Some(x) = x {
            look("arena", w.arena_ptr(0), s, *x)?;
        }
    }
    for v in &m.views {
        for (s, x) in v.layout.iter().enumerate() {
            look("view", v.ptr, s, *x)?;
        }
    }
    Ok(())
}

fn world() -> World {
    let rt = runtime_with(1, 64 << 20);
    let d = rt.driver().clone();
    let ctx = d.create_context().unwrap();
    let page = common::page(&ctx);
    if common::on_host() {
        assert_eq!(page, HOST_PAGE);
    }
    let arena = adjacent(&ctx, page);
    World {
        _rt: rt,
        d,
        ctx,
        arena,
        page,
        // Range handles are cut in OS pages on the host backend, in the base page on cuda.
        sub: if common::on_host() {
            os_page_size()
        } else {
            page
        },
    }
}

/// Three adjacent reservations of `RES_PAGES` pages.
fn adjacent(ctx: &Context, page: usize) -> Vec<Reservation> {
    let size = RES_PAGES * page;
    for _ in 0..100 {
        let probe = ctx.reserve(None, RESERVATIONS * size).unwrap();
        ctx.free_reservation(probe).unwrap();
        let rs: Vec<_> = (0..RESERVATIONS)
            .map_while(|i| {
                let r = ctx.reserve(Some(probe.base + i * size), size).ok()?;
                if r.base == probe.base + i * size {
                    Some(r)
                } else {
                    ctx.free_reservation(r).unwrap();
                    None
                }
            })
            .collect();
        if rs.len() == RESERVATIONS {
            return rs;
        }
        for r in rs {
            ctx.free_reservation(r).unwrap();
        }
    }
    panic!("no room for adjacent reservations");
}

fn run(ops: &[Op]) -> std::result::Result<(), TestCaseError> {
    let w = world();
    let fds = open_fd_count();
    let mut m = Model {
        arena: vec![None; ARENA_PAGES * w.subs_per_page()],
        ..Default::default()
    };
    for (i, op) in ops.iter().enumerate() {
        step(&w, &mut m, op).map_err(|e| TestCaseError::fail(format!("step {i} {op:?}: {e}")))?;
        check(&w, &m).map_err(|e| TestCaseError::fail(format!("after step {i} {op:?}: {e}")))?;
    }
    // Teardown through the API: every fd and record comes back.
    for v in m.views.drain(..) {
        w.ctx.close_ipc_handle(v.ptr).unwrap();
    }
    for e in m.exports.iter().filter(|e| e.live) {
        for _ in 0..e.refs {
            w.ctx.put_ipc_handle(&e.handle).unwrap();
        }
    }
    for r in &w.arena {
        w.ctx.free_reservation(*r).unwrap();
    }
    for o in &m.phys {
        w.ctx.destroy_physical_memory(o.pm).unwrap();
    }
    for a in &m.allocs {
        w.ctx.free_memory(a.ptr).unwrap();
    }
    prop_assert_eq!(w.d.ipc_stats(), hetmem::ipc::IpcStats::default());
    if host_facts() {
        prop_assert_eq!(open_fd_count(), fds, "fds back after teardown");
    }
    Ok(())
}

/// Whether the process's fd count is checked: the host backend's fact (every export a memfd,
/// every view its mapping); on cuda the driver keeps descriptors of its own.
fn host_facts() -> bool {
    !common::part_not_applicable_on(
        hetmem::BackendKind::Cuda,
        "the process's fd count, around failed calls and after teardown: on the host backend \
         every export is a memfd of hetmem's, on cuda the driver opens and keeps descriptors \
         of its own",
    )
}

static WARM: Once = Once::new();
/// A handle whose context is gone.
static STALE: OnceLock<IpcHandle> = OnceLock::new();

/// The broker's socket and thread appear at the first export of the process; make them exist
/// before any case counts fds. Also makes [`STALE`].
fn warm_up() {
    WARM.call_once(|| {
        let w = world();
        let desc = AllocDesc::new(w.page);
        // Host USM has no shareable handle on cuda.
        let p = if common::on_host() {
            w.ctx.alloc_host(&desc).unwrap()
        } else {
            w.ctx.alloc_device(&w.d.device(0).unwrap(), &desc).unwrap()
        };
        let h = w.ctx.get_ipc_handle(p).unwrap();
        w.ctx.put_ipc_handle(&h).unwrap();
        // Not put: dropping the context (with `w`) puts it.
        STALE.set(w.ctx.get_ipc_handle(p).unwrap()).unwrap();
    });
}

/// 128 cases on the host backend; 8 on cuda, where every word is a device copy.
fn cases() -> u32 {
    if common::on_cuda() {
        8
    } else {
        128
    }
}

proptest! {
    #![proptest_config(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    })]

    #[test]
    fn ipc_state_matches_the_reference_model(ops in proptest::collection::vec(op(), 1..120)) {
        if common::skip() {
            return Ok(());
        }
        warm_up();
        run(&ops)?;
    }
}
