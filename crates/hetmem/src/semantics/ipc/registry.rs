//! The process-wide IPC registries and their statistics: the exports of this process
//! ([`EXPORTS`], export id -> [`ExportRec`]: what the broker and in-process opens hand out), the
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
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::semantics::capacity::Charge;
use crate::semantics::driver::DriverShared;
use crate::semantics::ipc::format::Piece;
use crate::semantics::usm::MemoryType;
use crate::spec::IpcHandleKind;

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
pub(crate) static EXPORTS: Mutex<BTreeMap<u32, ExportRec>> = Mutex::new(BTreeMap::new());
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
pub(crate) fn fresh_export_id(live: &BTreeMap<u32, ExportRec>) -> u32 {
    loop {
        let id = NEXT_EXPORT.fetch_add(1, Ordering::Relaxed);
        if id != 0 && !live.contains_key(&id) {
            return id;
        }
    }
}

/// Number of live exports of this process, all drivers (handles got and not put), for leak
/// checks. Per driver: [`crate::Driver::ipc_stats`].
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
    /// Live exports of the driver's contexts: handles got (`zeMemGetIpcHandle*`) and not put
    /// (`zeMemPutIpcHandle`) while their context lives.
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
