//! The generic argument checks every family makes (null pointers, zero sizes, page multiples,
//! alignment, a device of the call's driver), each choosing its spec code once; `what` names the argument in the message.
//! The checks that belong to one family's rules live in that family's module.

use crate::error::{Error, Result};

/// `InvalidNullPointer` if `ptr` is 0 (`what` names the pointer).
pub(crate) fn null_check(ptr: usize, what: &str) -> Result<()> {
    if ptr == 0 {
        return Err(Error::InvalidNullPointer(format!("{what} is null")));
    }
    Ok(())
}

/// `UnsupportedSize` if `size` is 0 (the Level Zero code for a zero size; ACL's is
/// [`crate::semantics::acl::check_nonzero`]).
pub(crate) fn nonzero(size: usize, what: &str) -> Result<()> {
    if size == 0 {
        return Err(Error::UnsupportedSize(format!("{what} is 0")));
    }
    Ok(())
}

/// `UnsupportedSize` unless `size` is a multiple of `page`.
pub(crate) fn size_multiple(size: usize, page: usize, what: &str) -> Result<()> {
    if !size.is_multiple_of(page) {
        return Err(Error::UnsupportedSize(format!(
            "{what} {size:#x} is not a multiple of its page size {page:#x}"
        )));
    }
    Ok(())
}

/// `UnsupportedAlignment` unless `value` is a multiple of `page`.
pub(crate) fn aligned(value: usize, page: usize, what: &str) -> Result<()> {
    if !value.is_multiple_of(page) {
        return Err(Error::UnsupportedAlignment(format!(
            "{what} {value:#x} is not aligned to the page size {page:#x}"
        )));
    }
    Ok(())
}

/// `InvalidNullHandle` unless device `ordinal`, of driver `device_driver`, is a device of
/// driver `d`, the driver of the call (the same driver state, compared by address); returns
/// `ordinal`. The one device-of-driver check, also through
/// [`crate::semantics::driver::DriverShared::device_ordinal`].
pub(crate) fn check_device<D>(d: &D, device_driver: &D, ordinal: u32) -> Result<u32> {
    if !std::ptr::eq(d, device_driver) {
        return Err(Error::InvalidNullHandle(format!(
            "device {ordinal} belongs to another driver"
        )));
    }
    Ok(ordinal)
}
