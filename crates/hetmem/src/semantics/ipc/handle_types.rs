//! The IPC handle-type rules (`ze_ipc_mem_handle_type_ext_desc_t`, memory extensions,
//! `ZE_extension_ipc_mem_handle_type`): DEFAULT (1 << 0) and FABRIC_ACCESSIBLE (1 << 1); bits
//! over 0x3 are `InvalidEnumeration` (at [`IpcHandleTypes::from_raw`]); 0 counts as DEFAULT.
//!
//! Both types are supported on every backend of this build ([`SUPPORTED_TYPES`], case 11 of
//! `shared/cases/level-zero.md`), within one machine: a FABRIC_ACCESSIBLE handle is the same
//! 64 bytes as a DEFAULT one (same format, same transports: the fd in bytes 0..4 or the
//! exporter's broker) and another process of the same machine opens it exactly as a default
//! one; no fabric between machines is implemented. The spec publishes no
//! `ze_ipc_property_flag_t` for fabric handles, so `zeDriverGetIpcProperties` reports
//! `ZE_IPC_PROPERTY_FLAG_MEMORY` alone; the support is reported by the extension
//! `ZE_extension_ipc_mem_handle_type` (listed by `zeDriverGetExtensionProperties`) and by the
//! types being accepted.
//!
//! Memory created with a handle-type descriptor supports only the types chained there; a get
//! whose descriptor asks for another is `UnsupportedFeature` (the extension's note: the driver
//! cannot provide that handle type for that memory): created DEFAULT and asked FABRIC, or
//! created FABRIC and asked DEFAULT. A get without a handle-type descriptor asks for no type
//! and exports the memory whatever it was created with. The types themselves are kept on the
//! allocation's or physical object's record (`crate::semantics::usm`, `crate::semantics::vmm`).

use crate::error::{Error, Result};
use crate::spec::IpcHandleTypes;

/// The types every backend of this build supports: DEFAULT and FABRIC_ACCESSIBLE (within one
/// machine, the same handle; see the module docs).
pub(crate) const SUPPORTED_TYPES: IpcHandleTypes = IpcHandleTypes::ALL;

/// The handle types every backend of this build supports ([`SUPPORTED_TYPES`]).
pub fn supported_handle_types() -> IpcHandleTypes {
    SUPPORTED_TYPES
}

/// Checks handle types chained at the creation of memory (an allocation or a physical object)
/// against what this build's backends support.
///
/// Errors: `UnsupportedFeature` for types no backend supports, naming the flags (none today:
/// every valid combination is supported; invalid bits fail earlier, at
/// [`IpcHandleTypes::from_raw`]).
pub fn check_new_handle_types(asked: IpcHandleTypes) -> Result<()> {
    check_handle_types(asked, SUPPORTED_TYPES, None)
}

/// The check of a get: the types its descriptor asks for (`asked`; `None`: no handle-type
/// descriptor, no type asked) against the backend's and those the memory was created with.
pub(crate) fn check_asked(
    asked: Option<IpcHandleTypes>,
    created: Option<IpcHandleTypes>,
) -> Result<()> {
    match asked {
        Some(a) => check_handle_types(a, SUPPORTED_TYPES, created),
        None => Ok(()),
    }
}

/// Checks handle types asked at creation (allocation, physical memory) or at get against what
/// the backend supports (`supported`) and, at get, what the memory was created with
/// (`created`; `None`: no descriptor was chained at creation, any supported type goes).
/// Spec: the note of `ze_ipc_mem_handle_type_ext_desc_t` (memory extensions): a type the driver
/// cannot provide for that memory is `ZE_RESULT_ERROR_UNSUPPORTED_FEATURE`.
///
/// Errors: `UnsupportedFeature` naming the flags asked and those supported / created.
pub fn check_handle_types(
    asked: IpcHandleTypes,
    supported: IpcHandleTypes,
    created: Option<IpcHandleTypes>,
) -> Result<()> {
    if !supported.contains(asked) {
        return Err(Error::UnsupportedFeature(format!(
            "IPC handle type flags {:#x} are not supported by this backend (supported: {:#x})",
            asked.raw(),
            supported.raw()
        )));
    }
    if let Some(c) = created {
        if !c.contains(asked) {
            return Err(Error::UnsupportedFeature(format!(
                "IPC handle type flags {:#x} were not requested when the memory was created \
                 (it was created with {:#x})",
                asked.raw(),
                c.raw()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Case 11 of shared/cases/level-zero.md: FABRIC_ACCESSIBLE is supported; a type not
    /// chained at creation is refused either way; bits over 0x3 are an invalid enumeration.
    #[test]
    fn handle_types_fabric_is_supported_types_not_chained_at_creation_are_not_and_bits_over_3_are_invalid_enumeration(
    ) {
        assert_eq!(
            IpcHandleTypes::from_raw(4).unwrap_err().ze_result(),
            0x7800_000c
        );
        assert_eq!(
            IpcHandleTypes::from_raw(0).unwrap(),
            IpcHandleTypes::DEFAULT
        );
        let (def, fab) = (IpcHandleTypes::DEFAULT, IpcHandleTypes::FABRIC_ACCESSIBLE);
        assert!(check_new_handle_types(fab).is_ok());
        assert!(check_new_handle_types(IpcHandleTypes::ALL).is_ok());
        assert!(check_handle_types(fab, SUPPORTED_TYPES, None).is_ok());
        assert!(check_handle_types(fab, SUPPORTED_TYPES, Some(fab)).is_ok());
        // Created DEFAULT, asked FABRIC; created FABRIC, asked DEFAULT: refused.
        let e = check_handle_types(fab, SUPPORTED_TYPES, Some(def)).unwrap_err();
        assert_eq!(e.ze_result(), 0x7800_0003);
        assert!(
            e.message().contains("0x2") && e.message().contains("0x1"),
            "{e}"
        );
        let e = check_asked(Some(def), Some(fab)).unwrap_err();
        assert_eq!(e.ze_result(), 0x7800_0003);
        // No descriptor at get: no type asked, whatever the memory was created with.
        assert!(check_asked(None, Some(fab)).is_ok());
        // A backend without fabric support would refuse it.
        let e = check_handle_types(fab, def, None).unwrap_err();
        assert_eq!(e.ze_result(), 0x7800_0003);
        assert!(check_handle_types(def, IpcHandleTypes::ALL, Some(IpcHandleTypes::ALL)).is_ok());
    }
}
