//! The one error type of hetmem.
//!
//! Every variant is named after a Level Zero result code (`ze_result_t`), carries a message that
//! names the offending value, and translates to the exact C value with [`Error::ze_result`].

use std::fmt;

/// `Result` with hetmem's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error from a hetmem call. Variants follow the `ZE_RESULT_ERROR_*` codes; the message says
/// which value was wrong and why.
///
/// A call that returns an error has changed nothing (no reservation, mapping, physical object,
/// capacity or access attribute differs from before the call).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// `ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY` (0x70000002): the host, or an OS limit (open files,
    /// `vm.max_map_count`, address space), is exhausted. The message names the limit.
    #[error("out of host memory: {0}")]
    OutOfHostMemory(String),
    /// `ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY` (0x70000003): the device's capacity is exhausted.
    #[error("out of device memory: {0}")]
    OutOfDeviceMemory(String),
    /// `ZE_RESULT_ERROR_UNINITIALIZED` (0x78000001).
    #[error("uninitialized: {0}")]
    Uninitialized(String),
    /// `ZE_RESULT_ERROR_UNSUPPORTED_FEATURE` (0x78000003).
    #[error("unsupported feature: {0}")]
    UnsupportedFeature(String),
    /// `ZE_RESULT_ERROR_INVALID_ARGUMENT` (0x78000004).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// `ZE_RESULT_ERROR_INVALID_NULL_HANDLE` (0x78000005).
    #[error("invalid null handle: {0}")]
    InvalidNullHandle(String),
    /// `ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE` (0x78000006).
    #[error("handle object in use: {0}")]
    HandleObjectInUse(String),
    /// `ZE_RESULT_ERROR_INVALID_NULL_POINTER` (0x78000007).
    #[error("invalid null pointer: {0}")]
    InvalidNullPointer(String),
    /// `ZE_RESULT_ERROR_INVALID_SIZE` (0x78000008).
    #[error("invalid size: {0}")]
    InvalidSize(String),
    /// `ZE_RESULT_ERROR_UNSUPPORTED_SIZE` (0x78000009).
    #[error("unsupported size: {0}")]
    UnsupportedSize(String),
    /// `ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT` (0x7800000a).
    #[error("unsupported alignment: {0}")]
    UnsupportedAlignment(String),
    /// `ZE_RESULT_ERROR_INVALID_ENUMERATION` (0x7800000c).
    #[error("invalid enumeration: {0}")]
    InvalidEnumeration(String),
    /// `ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION` (0x7800000d).
    #[error("unsupported enumeration: {0}")]
    UnsupportedEnumeration(String),
    /// `ZE_RESULT_ERROR_ADDRESS_NOT_FOUND` (0x78000021).
    #[error("address not found: {0}")]
    AddressNotFound(String),
    /// `ZE_RESULT_ERROR_UNKNOWN` (0x7ffffffe): an OS or driver failure with no better code.
    #[error("unknown error: {0}")]
    Unknown(String),
    /// A refusal by a rule of the ACL families (managed memory), whose `aclError` the rule
    /// chose itself ([`AclCode`]); [`Error::ze_result`] gives the nearest Level Zero code.
    #[error("{name}: {1}", name = .0.name())]
    Acl(AclCode, String),
}

/// An `aclError` value (CANN `acl_base.h` / `acl_rt.h`) that a rule of the ACL families
/// chooses for its refusal ([`Error::Acl`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum AclCode {
    /// `ACL_ERROR_INVALID_PARAM` (100000): a parameter checked at the API layer (null pointer,
    /// size 0, bad flag value).
    InvalidParam = 100_000,
    /// `ACL_ERROR_RT_PARAM_INVALID` (107000): a parameter the runtime refuses (enumeration out
    /// of range, bad device or NUMA id, size rule, range not managed, refused advice).
    RtParamInvalid = 107_000,
    /// `ACL_ERROR_RT_ADDR_UNALIGNED` (107008): an address not aligned as required.
    RtAddrUnaligned = 107_008,
    /// `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000).
    RtFeatureNotSupport = 207_000,
    /// `ACL_ERROR_RT_MEMORY_ALLOCATION` (207001).
    RtMemoryAllocation = 207_001,
    /// `ACL_ERROR_RT_DRV_INTERNAL_ERROR` (507899, `rt_error_codes.h`): a failure of the driver or
    /// platform under the runtime.
    RtDrvInternalError = 507_899,
}

impl AclCode {
    /// The spec name, e.g. `ACL_ERROR_RT_PARAM_INVALID`.
    pub fn name(self) -> &'static str {
        match self {
            AclCode::InvalidParam => "ACL_ERROR_INVALID_PARAM",
            AclCode::RtParamInvalid => "ACL_ERROR_RT_PARAM_INVALID",
            AclCode::RtAddrUnaligned => "ACL_ERROR_RT_ADDR_UNALIGNED",
            AclCode::RtFeatureNotSupport => "ACL_ERROR_RT_FEATURE_NOT_SUPPORT",
            AclCode::RtMemoryAllocation => "ACL_ERROR_RT_MEMORY_ALLOCATION",
            AclCode::RtDrvInternalError => "ACL_ERROR_RT_DRV_INTERNAL_ERROR",
        }
    }

    /// The nearest Level Zero result, for an ACL refusal that reaches a Level Zero front.
    fn nearest_ze(self) -> Error {
        let m = String::new();
        match self {
            AclCode::InvalidParam | AclCode::RtParamInvalid => Error::InvalidArgument(m),
            AclCode::RtAddrUnaligned => Error::UnsupportedAlignment(m),
            AclCode::RtFeatureNotSupport => Error::UnsupportedFeature(m),
            AclCode::RtMemoryAllocation => Error::OutOfDeviceMemory(m),
            AclCode::RtDrvInternalError => Error::Unknown(m),
        }
    }
}

impl Error {
    /// The `ze_result_t` value of this error (values from `ze_api.h`).
    pub fn ze_result(&self) -> u32 {
        match self {
            Error::Acl(c, _) => c.nearest_ze().ze_result(),
            Error::OutOfHostMemory(_) => 0x7000_0002,
            Error::OutOfDeviceMemory(_) => 0x7000_0003,
            Error::Uninitialized(_) => 0x7800_0001,
            Error::UnsupportedFeature(_) => 0x7800_0003,
            Error::InvalidArgument(_) => 0x7800_0004,
            Error::InvalidNullHandle(_) => 0x7800_0005,
            Error::HandleObjectInUse(_) => 0x7800_0006,
            Error::InvalidNullPointer(_) => 0x7800_0007,
            Error::InvalidSize(_) => 0x7800_0008,
            Error::UnsupportedSize(_) => 0x7800_0009,
            Error::UnsupportedAlignment(_) => 0x7800_000a,
            Error::InvalidEnumeration(_) => 0x7800_000c,
            Error::UnsupportedEnumeration(_) => 0x7800_000d,
            Error::AddressNotFound(_) => 0x7800_0021,
            Error::Unknown(_) => 0x7fff_fffe,
        }
    }

    /// The spec name of the code, e.g. `ZE_RESULT_ERROR_INVALID_ARGUMENT`.
    pub fn ze_name(&self) -> &'static str {
        match self {
            Error::Acl(c, _) => c.nearest_ze().ze_name(),
            Error::OutOfHostMemory(_) => "ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY",
            Error::OutOfDeviceMemory(_) => "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY",
            Error::Uninitialized(_) => "ZE_RESULT_ERROR_UNINITIALIZED",
            Error::UnsupportedFeature(_) => "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE",
            Error::InvalidArgument(_) => "ZE_RESULT_ERROR_INVALID_ARGUMENT",
            Error::InvalidNullHandle(_) => "ZE_RESULT_ERROR_INVALID_NULL_HANDLE",
            Error::HandleObjectInUse(_) => "ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE",
            Error::InvalidNullPointer(_) => "ZE_RESULT_ERROR_INVALID_NULL_POINTER",
            Error::InvalidSize(_) => "ZE_RESULT_ERROR_INVALID_SIZE",
            Error::UnsupportedSize(_) => "ZE_RESULT_ERROR_UNSUPPORTED_SIZE",
            Error::UnsupportedAlignment(_) => "ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT",
            Error::InvalidEnumeration(_) => "ZE_RESULT_ERROR_INVALID_ENUMERATION",
            Error::UnsupportedEnumeration(_) => "ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION",
            Error::AddressNotFound(_) => "ZE_RESULT_ERROR_ADDRESS_NOT_FOUND",
            Error::Unknown(_) => "ZE_RESULT_ERROR_UNKNOWN",
        }
    }

    /// The ACL `aclError` value of this error (values from the CANN `acl_base.h` /
    /// `acl_rt.h`): for [`Error::Acl`] the code its rule chose; for the Level Zero variants
    /// (errors of the calls ACL shares with Level Zero: virtual memory, allocations, queues) the
    /// ACL code of the same meaning:
    /// - 100000 `ACL_ERROR_INVALID_PARAM` (checked at the API layer): `InvalidNullPointer`,
    ///   `InvalidSize` (size 0), `InvalidEnumeration` (bad flag values);
    /// - 107000 `ACL_ERROR_RT_PARAM_INVALID`: `InvalidArgument` (bad device / NUMA id, refused
    ///   advice), `UnsupportedEnumeration` (out-of-range enum values), `UnsupportedSize` (size
    ///   not a multiple of 2 MiB, over 3 TiB, bad dataSize), `AddressNotFound` (not managed),
    ///   `InvalidNullHandle`, `HandleObjectInUse`;
    /// - 107008 `ACL_ERROR_RT_ADDR_UNALIGNED`: `UnsupportedAlignment`;
    /// - 207000 `ACL_ERROR_RT_FEATURE_NOT_SUPPORT`: `UnsupportedFeature`, `Uninitialized`;
    /// - 207001 `ACL_ERROR_RT_MEMORY_ALLOCATION`: `OutOfHostMemory`, `OutOfDeviceMemory`;
    /// - 507899 `ACL_ERROR_RT_DRV_INTERNAL_ERROR`: `Unknown`.
    pub fn acl_error(&self) -> u32 {
        match self {
            Error::Acl(c, _) => *c as u32,
            Error::InvalidNullPointer(_) | Error::InvalidSize(_) | Error::InvalidEnumeration(_) => {
                100_000
            }
            Error::InvalidArgument(_)
            | Error::UnsupportedEnumeration(_)
            | Error::UnsupportedSize(_)
            | Error::AddressNotFound(_)
            | Error::InvalidNullHandle(_)
            | Error::HandleObjectInUse(_) => 107_000,
            Error::UnsupportedAlignment(_) => 107_008,
            Error::UnsupportedFeature(_) | Error::Uninitialized(_) => 207_000,
            Error::OutOfHostMemory(_) | Error::OutOfDeviceMemory(_) => 207_001,
            Error::Unknown(_) => 507_899,
        }
    }

    /// The message without the code's prefix.
    pub fn message(&self) -> &str {
        match self {
            Error::OutOfHostMemory(m)
            | Error::OutOfDeviceMemory(m)
            | Error::Uninitialized(m)
            | Error::UnsupportedFeature(m)
            | Error::InvalidArgument(m)
            | Error::InvalidNullHandle(m)
            | Error::HandleObjectInUse(m)
            | Error::InvalidNullPointer(m)
            | Error::InvalidSize(m)
            | Error::UnsupportedSize(m)
            | Error::UnsupportedAlignment(m)
            | Error::InvalidEnumeration(m)
            | Error::UnsupportedEnumeration(m)
            | Error::AddressNotFound(m)
            | Error::Unknown(m)
            | Error::Acl(_, m) => m,
        }
    }
}

/// The one conversion of backend failures into spec errors. A backend never picks a spec code;
/// this is the default the semantics layer applies, and a rule that needs another code maps the
/// [`HalError`](crate::backend::HalError) itself.
impl From<crate::backend::HalError> for Error {
    fn from(e: crate::backend::HalError) -> Error {
        use crate::backend::HalError as H;
        match e {
            H::OutOfHostMemory(m) => Error::OutOfHostMemory(m),
            H::OutOfDeviceMemory(m) => Error::OutOfDeviceMemory(m),
            H::DeviceLost(m) => Error::Unknown(format!("device lost: {m}")),
            H::Unsupported(m) => Error::UnsupportedFeature(m),
            H::Unexpected(m) => Error::Unknown(m),
        }
    }
}

/// Formats an address as `0x…` for error messages.
pub(crate) struct Addr(pub usize);

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_maps_to_its_ze_result_value() {
        let cases = [
            (Error::OutOfHostMemory(String::new()), 0x7000_0002),
            (Error::OutOfDeviceMemory(String::new()), 0x7000_0003),
            (Error::Uninitialized(String::new()), 0x7800_0001),
            (Error::UnsupportedFeature(String::new()), 0x7800_0003),
            (Error::InvalidArgument(String::new()), 0x7800_0004),
            (Error::InvalidNullHandle(String::new()), 0x7800_0005),
            (Error::HandleObjectInUse(String::new()), 0x7800_0006),
            (Error::InvalidNullPointer(String::new()), 0x7800_0007),
            (Error::InvalidSize(String::new()), 0x7800_0008),
            (Error::UnsupportedSize(String::new()), 0x7800_0009),
            (Error::UnsupportedAlignment(String::new()), 0x7800_000a),
            (Error::InvalidEnumeration(String::new()), 0x7800_000c),
            (Error::UnsupportedEnumeration(String::new()), 0x7800_000d),
            (Error::AddressNotFound(String::new()), 0x7800_0021),
            (Error::Unknown(String::new()), 0x7fff_fffe),
        ];
        for (e, v) in cases {
            assert_eq!(e.ze_result(), v, "{}", e.ze_name());
        }
    }

    #[test]
    fn display_names_the_code_and_keeps_the_message() {
        let e = Error::InvalidArgument("size 3 is odd".into());
        assert_eq!(e.to_string(), "invalid argument: size 3 is odd");
        assert_eq!(e.message(), "size 3 is odd");
    }
}
