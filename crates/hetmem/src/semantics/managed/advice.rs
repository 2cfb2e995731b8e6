//! `aclrtMemManagedAdvise`: the six advices, with ACL's eager semantics (see
//! [`crate::spec::Advice`]).
//!
//! In order: the argument checks ([`check_advise_args`]: pointer, size, range, alignment), the
//! location ([`Core::resolve`](crate::semantics::managed::state::Core::resolve);
//! `UNSET_READ_MOSTLY` takes INVALID as the host, `SET_READ_MOSTLY` and
//! `UNSET_PREFERRED_LOCATION` ignore it), then the backend's part
//! (`ManagedResidency::advise`: it waits for work using the range, lets the
//! preferred-location rule below refuse, decides device room, and moves pages), then the
//! advice record ([`PageAdvice`](crate::semantics::managed::state::PageAdvice)) once it has
//! succeeded: a refused call changes nothing.
//!
//! The preferred-location rule: `SET_PREFERRED_LOCATION` is refused
//! (`ACL_ERROR_RT_PARAM_INVALID`, 107000) when a page that is not read-mostly is mapped
//! elsewhere: on a device for the host, on the host or another device for a device; checked on
//! every page before anything moves.

use crate::backend::managed::{PageView, ResidencyAdvice};
use crate::error::{Addr, Result};
use crate::semantics::driver::DriverShared;
use crate::semantics::managed::rules::{check_advise_args, residency_error};
use crate::semantics::managed::state::Loc;
use crate::spec::{Advice, Location};

/// `aclrtMemManagedAdvise` of `advice` at `location` on `[ptr, ptr+size)` (see
/// `Context::mem_advise`).
pub(crate) fn advise(
    d: &DriverShared,
    ptr: usize,
    size: usize,
    advice: Advice,
    location: Location,
) -> Result<()> {
    let core = d.managed.core(d.backend.as_ref())?;
    {
        let st = core.state.lock();
        check_advise_args(core, &st, ptr, size)?;
    }
    // The location, then the backend's part: it waits for work using the range, lets the
    // preferred-location rule below refuse, decides device room, and moves pages. Advice
    // is recorded here only once it has succeeded: a refused call changes nothing.
    let (radv, loc) = match advice {
        Advice::SetReadMostly => (ResidencyAdvice::SetReadMostly, None),
        Advice::UnsetReadMostly => {
            let loc = match location {
                Location::Invalid => Loc::Host,
                l => core.resolve(l, "UNSET_READ_MOSTLY")?,
            };
            (ResidencyAdvice::UnsetReadMostly(loc.place()), Some(loc))
        }
        Advice::SetPreferredLocation => {
            let loc = core.resolve(location, "SET_PREFERRED_LOCATION")?;
            (
                ResidencyAdvice::SetPreferredLocation(loc.place()),
                Some(loc),
            )
        }
        Advice::UnsetPreferredLocation => (ResidencyAdvice::UnsetPreferredLocation, None),
        Advice::SetAccessedBy => {
            let loc = core.resolve(location, "SET_ACCESSED_BY")?;
            (ResidencyAdvice::SetAccessedBy(loc.place()), Some(loc))
        }
        Advice::UnsetAccessedBy => {
            let loc = core.resolve(location, "UNSET_ACCESSED_BY")?;
            (ResidencyAdvice::UnsetAccessedBy(loc.place()), Some(loc))
        }
    };
    let mut check = |pages: &[PageView]| -> std::result::Result<(), String> {
        match loc.filter(|_| advice == Advice::SetPreferredLocation) {
            Some(loc) => check_preferred(loc, pages),
            None => Ok(()),
        }
    };
    core.res
        .advise(ptr, size, radv, &mut check)
        .map_err(residency_error)?;
    let mut st = core.state.lock();
    for p in core.advice_mut(&mut st, ptr, size) {
        match (advice, loc) {
            (Advice::SetReadMostly, _) => p.read_mostly = true,
            (Advice::UnsetReadMostly, _) => p.read_mostly = false,
            (Advice::SetPreferredLocation, l) => p.preferred = l,
            (Advice::UnsetPreferredLocation, _) => p.preferred = None,
            (Advice::SetAccessedBy, Some(l)) => {
                p.accessed_by.insert(l);
            }
            (Advice::UnsetAccessedBy, Some(l)) => {
                p.accessed_by.remove(&l);
            }
            _ => {}
        }
    }
    Ok(())
}

/// The preferred-location rule (module docs) over the backend's view of the range's pages:
/// why `SET_PREFERRED_LOCATION` to `loc` is refused, if it is (the backend answers the
/// refusal as `ResidencyError::Refused`, 107000).
fn check_preferred(loc: Loc, pages: &[PageView]) -> std::result::Result<(), String> {
    for p in pages.iter().filter(|p| !p.read_mostly) {
        match loc {
            Loc::Host | Loc::Numa(_) => {
                if let Some(d) = p.device {
                    return Err(format!(
                        "SET_PREFERRED_LOCATION to the host: page {} is mapped on device {d}",
                        Addr(p.addr)
                    ));
                }
            }
            Loc::Device(d) => {
                if p.host {
                    return Err(format!(
                        "SET_PREFERRED_LOCATION to device {d}: page {} is mapped on the host",
                        Addr(p.addr)
                    ));
                }
                if let Some(e) = p.device.filter(|&e| e != d) {
                    return Err(format!(
                        "SET_PREFERRED_LOCATION to device {d}: page {} is mapped on device {e}",
                        Addr(p.addr)
                    ));
                }
            }
        }
    }
    Ok(())
}
