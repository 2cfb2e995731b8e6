//! The eight range attributes (`aclrtMemManagedGetAttr`, `aclrtMemManagedGetAttrs`), answered
//! from hetmem's own advice records ([`PageAdvice`]), never from the backend (whose answers
//! differ from ACL's, see [`crate::backend::managed`]).
//!
//! Every page the range overlaps counts: READ_MOSTLY is 1 when every page is read-mostly;
//! PREFERRED_LOCATION(_TYPE / _ID) and LAST_PREFETCH_LOCATION(_TYPE / _ID) give the location
//! shared by every page (-2 / INVALID when they differ or none is set; `*_ID` is -2 for the
//! host); ACCESSED_BY gives the locations advised on every page (device id, -1 host, NUMA
//! node id), padded with -2 to `dataSize`. Arguments: [`check_attr_args`] (pointer, size),
//! [`check_data_size`], then the range inside one allocation; for several,
//! [`check_attrs_count`] and every `dataSize` before any is written.

use crate::error::Result;
use crate::semantics::driver::DriverShared;
use crate::semantics::managed::rules::{
    check_accessed_by_slots, check_attr_args, check_attrs_count, check_data_size,
};
use crate::semantics::managed::state::{Core, Loc, PageAdvice, State, PAGE};
use crate::spec::{location_type, RangeAttribute};

/// One attribute of `[ptr, ptr+size)` into `data`, under the state lock `st`.
fn get_attr_locked(
    core: &Core,
    st: &State,
    attribute: RangeAttribute,
    ptr: usize,
    size: usize,
    data: &mut [u8],
) -> Result<()> {
    check_attr_args(ptr, size)?;
    check_data_size(attribute, data.len())?;
    core.check_range(st, ptr, size)?;
    let first = ptr & !(PAGE - 1);
    // The range lies in one allocation (checked): its pages, borrowed, not copied.
    let (base, i0) = core.find(st, first).expect("checked range");
    let i1 = (ptr + size - 1 - base) / PAGE;
    let pages: &[PageAdvice] = &st.allocs[&base].pages[i0..=i1];
    let uniform = |f: &dyn Fn(&PageAdvice) -> Option<Loc>| -> Option<Loc> {
        let v = f(&pages[0])?;
        pages.iter().all(|p| f(p) == Some(v)).then_some(v)
    };
    let put = |data: &mut [u8], v: i32| data[..4].copy_from_slice(&v.to_ne_bytes());
    use RangeAttribute::*;
    match attribute {
        ReadMostly => put(data, pages.iter().all(|p| p.read_mostly) as i32),
        PreferredLocation => put(data, uniform(&|p| p.preferred).map_or(-2, Loc::id)),
        PreferredLocationType => put(
            data,
            uniform(&|p| p.preferred).map_or(location_type::INVALID, Loc::ty) as i32,
        ),
        PreferredLocationId => put(data, uniform(&|p| p.preferred).map_or(-2, Loc::id_only)),
        LastPrefetchLocation => put(data, uniform(&|p| p.last_prefetch).map_or(-2, Loc::id)),
        LastPrefetchLocationType => put(
            data,
            uniform(&|p| p.last_prefetch).map_or(location_type::INVALID, Loc::ty) as i32,
        ),
        LastPrefetchLocationId => put(data, uniform(&|p| p.last_prefetch).map_or(-2, Loc::id_only)),
        AccessedBy => {
            let mut set = pages[0].accessed_by.clone();
            for p in &pages[1..] {
                set = set.intersection(&p.accessed_by).copied().collect();
            }
            let ids: Vec<i32> = set.iter().map(|l| l.id()).collect();
            for (i, c) in data.chunks_mut(4).enumerate() {
                c.copy_from_slice(&ids.get(i).copied().unwrap_or(-2).to_ne_bytes());
            }
        }
    }
    Ok(())
}

/// `aclrtMemManagedGetAttr`: `attribute` of `[ptr, ptr+size)` into `data` (`dataSize` is
/// `data.len()`), native 32-bit integers; nothing written on error.
pub(crate) fn get_attr(
    d: &DriverShared,
    attribute: RangeAttribute,
    ptr: usize,
    size: usize,
    data: &mut [u8],
) -> Result<()> {
    let core = d.managed.core(d.backend.as_ref())?;
    let st = core.state.lock();
    get_attr_locked(core, &st, attribute, ptr, size, data)
}

/// `aclrtMemManagedGetAttrs`: `data[i]` receives `attributes[i]`; all are checked before any
/// is written.
pub(crate) fn get_attrs(
    d: &DriverShared,
    attributes: &[RangeAttribute],
    ptr: usize,
    size: usize,
    data: &mut [&mut [u8]],
) -> Result<()> {
    check_attrs_count(attributes.len(), data.len())?;
    let core = d.managed.core(d.backend.as_ref())?;
    let st = core.state.lock();
    for (a, b) in attributes.iter().zip(data.iter()) {
        check_data_size(*a, b.len())?;
    }
    for (a, b) in attributes.iter().zip(data.iter_mut()) {
        get_attr_locked(core, &st, *a, ptr, size, b)?;
    }
    Ok(())
}

/// One 4-byte attribute as an `i32` ([`get_attr`] with `dataSize` 4; for ACCESSED_BY the
/// first slot).
pub(crate) fn attr_i32(
    d: &DriverShared,
    attribute: RangeAttribute,
    ptr: usize,
    size: usize,
) -> Result<i32> {
    let mut b = [0u8; 4];
    get_attr(d, attribute, ptr, size, &mut b)?;
    Ok(i32::from_ne_bytes(b))
}

/// ACCESSED_BY of `[ptr, ptr+size)` in `slots` entries ([`get_attr`] with `dataSize` =
/// `slots` * 4), after [`check_accessed_by_slots`].
pub(crate) fn accessed_by(
    d: &DriverShared,
    ptr: usize,
    size: usize,
    slots: usize,
) -> Result<Vec<i32>> {
    check_accessed_by_slots(slots)?;
    let mut b = vec![0u8; slots * 4];
    get_attr(d, RangeAttribute::AccessedBy, ptr, size, &mut b)?;
    Ok(b.chunks(4)
        .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}
