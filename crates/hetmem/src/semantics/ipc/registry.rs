//! The process-wide IPC registries and their statistics: the exports of this process
//! ([`EXPORTS`], export id -> [`ExportRec`]: what the broker and in-process opens hand out;
//! one export per exported memory, [`Source`], counting the gets not yet put), the
//! views opened in this process ([`IMPORTS`], returned pointer -> [`ImportRec`]), the export
//! ids (non-zero `u32`, wrapping after 2^32 - 1 and skipping live ones, [`fresh_export_id`]),
//! the constant-time token check, and the counters ([`stats`], `Driver::ipc_stats`;
//! [`live_exports`], [`open_views`]).
//!
//! Capacity rule: an export, and a view of this process's own memory, hold the memory's
//! device capacity ([`Charge`]) until put / closed, even once the memory is destroyed or freed
//! (`crate::semantics::capacity`).
//!
//! Lock order: `usm` -> `vm` -> [`IMPORTS`] (the view table); [`EXPORTS`] is taken with no
//! driver lock held, or after them, never before.

use crate::backend::ipc::OwnedFd;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::semantics::capacity::Charge;
use crate::semantics::driver::DriverShared;
use crate::semantics::ipc::format::{IpcHandle, Piece};
use crate::semantics::usm::MemoryType;
use crate::spec::IpcHandleKind;

/// What an export shares, when gets of it are counted on one export (one export per
/// allocation, physical object or mapping; explicit range handles are their own exports).
/// Ids are the memory's process-wide unique ids (`crate::semantics::capacity::fresh_id`),
/// never reused, so memory freed while exported never meets a later one's export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Source {
    /// A USM allocation (its record's id).
    Allocation(u64),
    /// A whole physical memory object (its id).
    Physical(u64),
    /// The mapping of `len` bytes of physical object `phys` from `offset`, got through a
    /// pointer into it (`zeMemGetIpcHandle` on mapped VA where the mapping is not the whole
    /// object).
    Mapping { phys: u64, offset: u64, len: u64 },
}

#[derive(Debug)]
pub(crate) struct ExportRec {
    pub(crate) token: [u8; 16],
    pub(crate) kind: IpcHandleKind,
    /// The memory type the handle reports (byte 10).
    pub(crate) mem: MemoryType,
    pub(crate) context: u64,
    /// The exporting driver (`Arc::as_ptr` of its shared state; its contexts keep it alive
    /// while the export lives).
    pub(crate) driver: usize,
    pub(crate) size: u64,
    pub(crate) fds: Arc<[OwnedFd]>,
    /// Bytes behind each fd (the exported parts' sizes).
    pub(crate) sizes: Arc<[u64]>,
    pub(crate) pieces: Arc<[Piece]>,
    /// The device capacity of the exported memory: held while the export lives, even once
    /// the memory is destroyed or freed (`crate::semantics::capacity`).
    pub(crate) capacity: Arc<[Arc<Charge>]>,
    /// What the export shares, for gets counted on it (`None`: an explicit range handle).
    pub(crate) source: Option<Source>,
    /// Gets not yet put (`zeMemGetIpcHandle*` of the same memory return this export's handle
    /// again and count here; `zeMemPutIpcHandle` counts down, the last removes the export).
    pub(crate) refs: u32,
    /// The handle every get of this export returns.
    pub(crate) handle: IpcHandle,
    /// On a backend whose shareable fds carry no identity (cuda): the export's description,
    /// the fd in bytes 0..4 of its handle (a sealed memfd holding the handle with -1 there,
    /// `crate::semantics::ipc::export::register`); closed with the record, at the last put.
    #[expect(
        dead_code,
        reason = "held, never read: its number is in the handle; dropping it closes it"
    )]
    pub(crate) description: Option<OwnedFd>,
}

/// The exports of this process: by export id, and by what they share ([`Source`]).
#[derive(Debug)]
pub(crate) struct Exports {
    recs: BTreeMap<u32, ExportRec>,
    by_source: Option<HashMap<Source, u32>>,
}

impl Exports {
    pub(crate) fn get(&self, id: &u32) -> Option<&ExportRec> {
        self.recs.get(id)
    }
    pub(crate) fn len(&self) -> usize {
        self.recs.len()
    }
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&u32, &ExportRec)> {
        self.recs.iter()
    }
    pub(crate) fn values(&self) -> impl Iterator<Item = &ExportRec> {
        self.recs.values()
    }
    pub(crate) fn contains_key(&self, id: &u32) -> bool {
        self.recs.contains_key(id)
    }
    /// Another get of the live export of `source`: counts it and returns its handle.
    pub(crate) fn reuse(&mut self, source: Source) -> Option<IpcHandle> {
        let id = *self.by_source.as_ref()?.get(&source)?;
        let rec = self.recs.get_mut(&id).expect("indexed exports are live");
        rec.refs += 1;
        Some(rec.handle)
    }
    /// Inserts a new export (one get); its source must not be exported yet ([`Exports::reuse`]
    /// first, under the same lock).
    pub(crate) fn insert(&mut self, id: u32, rec: ExportRec) {
        if let Some(s) = rec.source {
            self.by_source
                .get_or_insert_with(HashMap::new)
                .insert(s, id);
        }
        self.recs.insert(id, rec);
    }
    /// One put of export `id`: counts it down; the last removes the export, returned so that
    /// its fds close after the lock is dropped.
    pub(crate) fn put(&mut self, id: u32) -> Option<ExportRec> {
        let rec = self.recs.get_mut(&id)?;
        rec.refs -= 1;
        if rec.refs > 0 {
            return None;
        }
        let rec = self.recs.remove(&id).expect("present");
        if let (Some(s), Some(m)) = (rec.source, self.by_source.as_mut()) {
            m.remove(&s);
        }
        Some(rec)
    }
    /// Removes every export of `context` (context teardown), whatever their counts.
    pub(crate) fn remove_context(&mut self, context: u64) -> Vec<ExportRec> {
        let ids: Vec<u32> = self
            .recs
            .iter()
            .filter(|(_, r)| r.context == context)
            .map(|(&i, _)| i)
            .collect();
        ids.into_iter()
            .map(|i| {
                let rec = self.recs.remove(&i).expect("listed");
                if let (Some(s), Some(m)) = (rec.source, self.by_source.as_mut()) {
                    m.remove(&s);
                }
                rec
            })
            .collect()
    }
}

/// A view opened in this process, keyed in [`IMPORTS`] by the pointer open returned.
#[derive(Debug, Clone)]
pub(crate) struct ImportRec {
    /// Bytes from the returned pointer (a range handle's size).
    pub(crate) size: usize,
    /// What open mapped: whole pages from `map_base` (at or below the returned pointer: a
    /// range may start at any byte of its first page), `map_size` bytes.
    pub(crate) map_base: usize,
    pub(crate) map_size: usize,
    pub(crate) context: u64,
    /// The opening driver (`Arc::as_ptr` of its shared state; unique while the view lives,
    /// since the context, which keeps the driver alive, closes its views at teardown).
    pub(crate) driver: usize,
    pub(crate) mem: MemoryType,
    pub(crate) id: u64,
    pub(crate) page_size: usize,
    /// The device capacity of the viewed memory when it is this process's own (empty for
    /// memory of another process): held until the view is closed (`crate::semantics::capacity`).
    #[expect(
        dead_code,
        reason = "held, never read: dropping it gives the capacity back"
    )]
    pub(crate) capacity: Arc<[Arc<Charge>]>,
}

/// Exports of this process (export id -> record); read by the broker thread.
pub(crate) static EXPORTS: Mutex<Exports> = Mutex::new(Exports {
    recs: BTreeMap::new(),
    by_source: None,
});
/// The next export id to try (ids are `u32`, non-zero, wrapping; see the module docs).
pub(crate) static NEXT_EXPORT: AtomicU32 = AtomicU32::new(1);
/// Views opened in this process (returned pointer -> record).
pub(crate) static IMPORTS: Mutex<BTreeMap<usize, ImportRec>> = Mutex::new(BTreeMap::new());

pub(crate) fn own_pid() -> u32 {
    std::process::id()
}

/// Constant-time comparison of tokens.
pub(crate) fn token_eq(a: &[u8; 16], b: &[u8; 16]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A fresh export id: non-zero, not live (wraps after 2^32 - 1).
pub(crate) fn fresh_export_id(live: &Exports) -> u32 {
    loop {
        let id = NEXT_EXPORT.fetch_add(1, Ordering::Relaxed);
        if id != 0 && !live.contains_key(&id) {
            return id;
        }
    }
}

/// Number of live exports of this process, all drivers (memory with handles got and not all
/// put: gets of the same memory count on one export), for leak checks. Per driver: [`crate::Driver::ipc_stats`].
pub fn live_exports() -> usize {
    EXPORTS.lock().len()
}

/// Number of views opened in this process and not closed, all drivers, for leak checks. Per
/// driver: [`crate::Driver::ipc_stats`].
pub fn open_views() -> usize {
    IMPORTS.lock().len()
}

/// Counters of one driver's IPC state ([`crate::Driver::ipc_stats`]), for checks and leak tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IpcStats {
    /// Live exports of the driver's contexts: memory whose handles were got
    /// (`zeMemGetIpcHandle*`) and not all put (`zeMemPutIpcHandle`) while their context lives;
    /// repeated gets of the same memory count on one export.
    pub exports: usize,
    /// Views opened (`zeMemOpenIpcHandle`) in the driver's contexts and not closed.
    pub views: usize,
    /// Live allocations created with a handle-type descriptor chained (their types are kept on
    /// the allocation's record and go with it).
    pub typed_allocations: usize,
    /// Live physical memory objects created with a handle-type descriptor chained.
    pub typed_physical: usize,
}

/// The address of a driver's shared state: its identity in the records (the `driver` fields).
pub(crate) fn driver_id(d: &DriverShared) -> usize {
    d as *const DriverShared as usize
}

/// [`IpcStats`] of driver `d` (`Driver::ipc_stats`). Takes `usm`, `vm`, the view table and the
/// export table for reading, in that order; never fails.
pub(crate) fn stats(d: &DriverShared) -> IpcStats {
    let me = driver_id(d);
    // Lock order: usm before vm before the view table.
    let typed_allocations = d.usm.read().ipc_typed();
    let typed_physical = d.vm.read().ipc_typed();
    let views = IMPORTS.lock().values().filter(|r| r.driver == me).count();
    let exports = EXPORTS.lock().values().filter(|r| r.driver == me).count();
    IpcStats {
        exports,
        views,
        typed_allocations,
        typed_physical,
    }
}
