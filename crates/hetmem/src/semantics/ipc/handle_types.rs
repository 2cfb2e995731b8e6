//! The IPC handle-type rules (`ze_ipc_mem_handle_type_ext_desc_t`, memory extensions,
//! `ZE_extension_ipc_mem_handle_type`): DEFAULT (1 << 0) and FABRIC_ACCESSIBLE (1 << 1); bits
//! over 0x3 are `InvalidEnumeration` (at [`IpcHandleTypes::from_raw`]); 0 counts as DEFAULT.
//! This build's backends support DEFAULT only ([`SUPPORTED_TYPES`]): FABRIC_ACCESSIBLE is
//! `UnsupportedFeature` at get and at allocation / physical creation (the extension's note).
//! Memory created with a handle-type descriptor supports only the types chained there; asking
//! later for another is `UnsupportedFeature` (the same note: the driver cannot provide that
//! handle type for that memory). The types themselves are kept on the allocation's or physical
//! object's record (`crate::semantics::usm`, `crate::semantics::vmm`).

use crate::error::{Error, Result};
use crate::spec::IpcHandleTypes;

/// The types every backend of this build supports: DEFAULT only (no fabric).
pub(crate) const SUPPORTED_TYPES: IpcHandleTypes = IpcHandleTypes::DEFAULT;

/// Checks handle types chained at the creation of memory (an allocation or a physical object)
/// against what this build's backends support.
///
/// Errors: `UnsupportedFeature` for FABRIC_ACCESSIBLE, naming the flags.
pub fn check_new_handle_types(asked: IpcHandleTypes) -> Result<()> {
    check_handle_types(asked, SUPPORTED_TYPES, None)
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
            "IPC handle type flags {:#x}: FABRIC_ACCESSIBLE handles are not supported by this \
             backend (supported: {:#x}, DEFAULT)",
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

    #[test]
    fn handle_types_fabric_is_unsupported_and_bits_over_3_are_invalid_enumeration() {
        assert_eq!(
            IpcHandleTypes::from_raw(4).unwrap_err().ze_result(),
            0x7800_000c
        );
        assert_eq!(
            IpcHandleTypes::from_raw(0).unwrap(),
            IpcHandleTypes::DEFAULT
        );
        let e = check_handle_types(IpcHandleTypes::FABRIC_ACCESSIBLE, SUPPORTED_TYPES, None);
        assert_eq!(e.unwrap_err().ze_result(), 0x7800_0003);
        // A backend with fabric support: asking for a type not chained at creation fails.
        let both = IpcHandleTypes::from_raw(3).unwrap();
        let e = check_handle_types(
            IpcHandleTypes::FABRIC_ACCESSIBLE,
            both,
            Some(IpcHandleTypes::DEFAULT),
        );
        assert_eq!(e.unwrap_err().ze_result(), 0x7800_0003);
        assert!(check_handle_types(IpcHandleTypes::DEFAULT, both, Some(both)).is_ok());
    }
}
