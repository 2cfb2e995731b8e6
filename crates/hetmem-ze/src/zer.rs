//! The runtime API (`zer*`, API 1.14; `include/zer_api.h` of `oneapi-src/level-zero`): the
//! four functions of the loader's runtime table, exported under their own names and through
//! `zerGetGlobalProcAddrTable` ([`crate::ddi`]).
//!
//! # How a loader reaches them (read from `oneapi-src/level-zero`, `source/loader/zer_ldrddi.cpp`)
//! The loader `dlsym`s `zerGetGlobalProcAddrTable` in each driver (an optional table: a driver
//! without it is still loaded, and the application's `zerGetDefaultContext` then answers null
//! with "ERROR UNINITIALIZED") and calls it with its `ddi_init_version` and a
//! `zer_global_dditable_t { pfnGetLastErrorDescription, pfnTranslateDeviceHandleToIdentifier,
//! pfnTranslateIdentifierToDeviceHandle, pfnGetDefaultContext }` (`include/zer_ddi.h`; every
//! slot is 1.14). With one driver and no intercept the loader hands that table to the
//! application unchanged; with several it calls the *default* driver's. Loader 1.8.12 (Debian
//! bookworm, the one the C suite runs through) has no `zer` symbol at all, so there the C
//! suite fetches the table from this library itself, as a loader would
//! (`tests/c/ze/zer.c`).
//!
//! The rules are those of `zer_api.h`: no function but `zerGetLastErrorDescription` returns a
//! code; a failure answers `UINT32_MAX` or null and leaves its reason for
//! `zerGetLastErrorDescription` (this thread's last error, as `zeDriverGetLastErrorDescription`
//! answers). The driver must be initialised (`zeInit` / `zeInitDrivers`) first. Device
//! identifiers are the devices' indices in `zeDeviceGet`'s list (the reference driver's
//! answer: its identifier is the index among the devices it exposes); sub-devices, which are
//! not in that list, have none. The translations take no lock; `zerGetDefaultContext` takes
//! the handle registry's read lock (to answer null for a destroyed default context).

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_void};

use crate::rt::{self, fail};
use crate::types::*;

/// `zerGetLastErrorDescription`: this thread's last error message (the same string as
/// `zeDriverGetLastErrorDescription`; empty when no call of this thread has failed). The
/// string stays valid until this thread's next failing call.
///
/// Errors: `ZE_RESULT_ERROR_INVALID_NULL_POINTER` for a null `ppString`.
#[no_mangle]
pub unsafe extern "C" fn zerGetLastErrorDescription(ppString: *mut *const c_char) -> ze_result_t {
    rt::guard(|| {
        let p = ppString
            .as_mut()
            .ok_or_else(|| fail(ZE_RESULT_ERROR_INVALID_NULL_POINTER, "ppString is null"))?;
        *p = rt::last_error_ptr();
        Ok(ZE_RESULT_SUCCESS)
    })
}

/// `zerTranslateDeviceHandleToIdentifier`: the index of `hDevice` in `zeDeviceGet`'s list.
///
/// Failure (`UINT32_MAX`, the reason for `zerGetLastErrorDescription`): a null handle, a
/// handle that is no device of this driver, a sub-device (not in `zeDeviceGet`'s list), or a
/// driver not initialised.
#[no_mangle]
pub unsafe extern "C" fn zerTranslateDeviceHandleToIdentifier(hDevice: *mut c_void) -> u32 {
    let r = std::panic::catch_unwind(|| -> Result<u32, u32> {
        let s = rt::state()?;
        let h = hDevice as u64;
        if h == 0 {
            return Err(fail(
                ZE_RESULT_ERROR_INVALID_NULL_HANDLE,
                "zerTranslateDeviceHandleToIdentifier: hDevice is null",
            ));
        }
        if let Some(i) = s.devices.iter().position(|&d| d == h) {
            return Ok(i as u32);
        }
        // A live device handle that is not in the list is a sub-device.
        Err(match rt::device(hDevice) {
            Ok(_) => fail(
                ZE_RESULT_ERROR_INVALID_ARGUMENT,
                format!(
                    "zerTranslateDeviceHandleToIdentifier: device {h:#x} is a sub-device; \
                     identifiers name the devices of zeDeviceGet"
                ),
            ),
            Err(code) => code,
        })
    });
    match r {
        Ok(Ok(i)) => i,
        _ => u32::MAX,
    }
}

/// `zerTranslateIdentifierToDeviceHandle`: the device of `zeDeviceGet`'s list at index
/// `identifier`.
///
/// Failure (null, the reason for `zerGetLastErrorDescription`): an identifier past the last
/// device, or a driver not initialised.
#[no_mangle]
pub unsafe extern "C" fn zerTranslateIdentifierToDeviceHandle(identifier: u32) -> *mut c_void {
    let r = std::panic::catch_unwind(|| -> Result<u64, u32> {
        let s = rt::state()?;
        s.devices.get(identifier as usize).copied().ok_or_else(|| {
            fail(
                ZE_RESULT_ERROR_INVALID_ARGUMENT,
                format!(
                    "zerTranslateIdentifierToDeviceHandle: identifier {identifier} names no \
                     device ({} devices)",
                    s.devices.len()
                ),
            )
        })
    });
    match r {
        Ok(Ok(h)) => h as *mut c_void,
        _ => std::ptr::null_mut(),
    }
}

/// `zerGetDefaultContext`: the driver's default context, holding every device; the same
/// handle as `zeDriverGetDefaultContext` of this (the only) driver, made on first use and the
/// same on every call.
///
/// Failure (null, the reason for `zerGetLastErrorDescription`): a driver not initialised, or
/// a default context that could not be made or was destroyed (`zeContextDestroy` of it makes
/// it invalid for good, as for `zeDriverGetDefaultContext`).
#[no_mangle]
pub unsafe extern "C" fn zerGetDefaultContext() -> *mut c_void {
    let r = std::panic::catch_unwind(|| -> Result<u64, u32> {
        let s = rt::state()?;
        let h = crate::api::zeDriverGetDefaultContext(s.driver as *mut c_void) as u64;
        if h == 0 {
            return Err(fail(
                ZE_RESULT_ERROR_UNKNOWN,
                "zerGetDefaultContext: the default context could not be made",
            ));
        }
        // A destroyed default context stays destroyed: say so rather than hand out a dead
        // handle.
        rt::context(h as *mut c_void).map_err(|_| {
            fail(
                ZE_RESULT_ERROR_INVALID_NULL_HANDLE,
                format!("zerGetDefaultContext: the default context {h:#x} was destroyed"),
            )
        })?;
        Ok(h)
    });
    match r {
        Ok(Ok(h)) => h as *mut c_void,
        _ => std::ptr::null_mut(),
    }
}
