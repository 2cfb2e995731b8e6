//! Views opened in this process: what an open maps ([`Material`], mapped by [`map_view`] into a
//! fresh reservation, read-write, whole pages of the mapping granularity
//! [`mapping_granularity`]), and the questions other families ask about them: the range
//! (`zeMemGetAddressRange` on an opened pointer, [`opened_range`]), the properties
//! (`zeMemGetAllocProperties`: the exported memory's type, a fresh id, the view's page size;
//! [`opened_properties`]), overlap with a range being exported or imported
//! ([`view_overlapping`]), and the locked table the queues check their operands against
//! ([`views`]: a view is a valid copy / fill operand, source and destination, for queues of the
//! driver it was opened with, within its size).
//!
//! Lock order: `usm` -> `vm` -> the view table -> a reservation's gate -> `inflight`.

use crate::backend::ipc::OwnedFd;
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::backend::{Backend, Protection, RawPhysical, SharedPart};
use crate::error::Result;
use crate::semantics::capacity::Charge;
use crate::semantics::driver::DriverShared;
use crate::semantics::ipc::format::Piece;
use crate::semantics::ipc::registry::{driver_id, ImportRec, IMPORTS};
use crate::semantics::usm::AllocationProperties;

/// What an open needs: the view size, the objects' fds and the pieces, plus the device
/// capacity the view holds (that of this process's own memory only).
pub(crate) struct Material {
    pub(crate) size: usize,
    pub(crate) fds: Vec<OwnedFd>,
    /// Bytes behind each fd, as the exporter said.
    pub(crate) sizes: Vec<u64>,
    pub(crate) pieces: Vec<Piece>,
    pub(crate) capacity: Arc<[Arc<Charge>]>,
    /// The fds are duplicates of an export of this process (made by its own backend from its
    /// own memory, so already what an open checks): the backend's checks of received fds are
    /// skipped for them (see `validate`).
    pub(crate) own: bool,
}

/// The smallest unit a range handle's pieces are cut in: the finest mapping granularity of the
/// backend's devices (the OS page on the host backend, 2 MiB on a GPU).
pub(crate) fn mapping_granularity(backend: &dyn Backend) -> usize {
    backend
        .devices()
        .iter()
        .map(|d| d.min_page_size)
        .min()
        .unwrap_or_else(|| backend.host_page_size())
}

/// Maps the material into a fresh reservation, read-write, its page table filled on first
/// touch ([`Backend::map_view`]); returns its base.
pub(crate) fn map_view(backend: &dyn Backend, align: usize, m: Material) -> Result<usize> {
    // SAFETY: a fresh placeholder chosen by the backend; replaces nothing.
    let base = unsafe { backend.reserve(None, m.size, align)? };
    let mut raws: Vec<RawPhysical> = Vec::with_capacity(m.fds.len());
    let mut result = Ok(());
    for (fd, size) in m.fds.into_iter().zip(m.sizes) {
        match backend.import_physical(vec![SharedPart { fd, size }]) {
            Ok(r) => raws.push(r),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let mut at = base;
    if result.is_ok() {
        for p in &m.pieces {
            // SAFETY: [at, at+len) is an unmapped part of our fresh reservation, and the piece
            // lies inside its object (validated).
            let r = unsafe {
                backend.map_view(
                    at,
                    p.len as usize,
                    raws[p.obj as usize],
                    p.offset as usize,
                    Protection::ReadWrite,
                )
            };
            if let Err(e) = r {
                result = Err(e);
                break;
            }
            at += p.len as usize;
        }
    }
    for r in raws {
        // SAFETY: imported above; the mappings keep the memory, the handle is not used again.
        unsafe { backend.destroy_physical(r) };
    }
    if let Err(e) = result {
        // SAFETY: our reservation, mapped in [base, at).
        unsafe { backend.release_mapped(base, m.size, &[(base, at)]).ok() };
        return Err(e.into());
    }
    Ok(base)
}

/// `(base, size)` of a view opened in this process that contains `ptr`
/// (`zeMemGetAddressRange` on an opened pointer).
pub(crate) fn opened_range(ptr: usize) -> Option<(usize, usize)> {
    let im = IMPORTS.lock();
    let (&b, r) = im.range(..=ptr).next_back()?;
    (ptr < b + r.size).then_some((b, r.size))
}

/// `(base, end)` of what a view opened in this process (any context, any driver) mapped, if it
/// overlaps `[start, end)`: memory that is neither system memory nor reserved VA of this
/// process.
pub(crate) fn view_overlapping(start: usize, end: usize) -> Option<(usize, usize)> {
    let im = IMPORTS.lock();
    // The views are disjoint and keyed in address order; a view's mapping may begin below its
    // key (by less than a page), so the first view at or above `end` may overlap too.
    let extent = |(_, r): (&usize, &ImportRec)| (r.map_base, r.map_base + r.map_size);
    let before = im.range(..end).next_back().map(extent);
    let after = im.range(end..).next().map(extent);
    [before, after]
        .into_iter()
        .flatten()
        .find(|&(b, e)| b < end && e > start)
}

/// Properties of a view opened in this process that contains `ptr`
/// (`zeMemGetAllocProperties` on an opened pointer): the exported memory's type, an id of the
/// view (unique, never reused), the view's page size; no device.
pub(crate) fn opened_properties(ptr: usize) -> Option<AllocationProperties> {
    let im = IMPORTS.lock();
    let (&b, r) = im.range(..=ptr).next_back()?;
    (ptr < b + r.size).then(|| AllocationProperties {
        memory_type: r.mem,
        id: r.id,
        page_size: r.page_size,
        ..Default::default()
    })
}

/// The table of views opened in this process, locked, as seen by the queues of one driver.
/// Queue operand checks ([`crate::semantics::queue`]) hold it while they take their in-flight references,
/// so no close can slip in between (lock order: usm, vm, this table, the in-flight table).
pub(crate) struct Views<'a> {
    pub(crate) table: parking_lot::MutexGuard<'a, BTreeMap<usize, ImportRec>>,
    pub(crate) driver: usize,
}

impl Views<'_> {
    /// `(base, size)` of a view of this driver that contains `ptr`.
    pub(crate) fn range(&self, ptr: usize) -> Option<(usize, usize)> {
        let (&b, r) = self.table.range(..=ptr).next_back()?;
        (ptr < b + r.size && r.driver == self.driver).then_some((b, r.size))
    }
}

/// Locks the view table for the queues of driver `d`.
pub(crate) fn views(d: &DriverShared) -> Views<'static> {
    Views {
        table: IMPORTS.lock(),
        driver: driver_id(d),
    }
}
