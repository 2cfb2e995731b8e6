//! Python exceptions for hetmem's spec errors: one class per Level Zero result (all under
//! `hetmem.HetmemError`) and `hetmem.AclError` for the refusals whose `aclError` an ACL rule
//! chose. Every instance carries `code` (the spec value: the `ze_result_t`, or the `aclError`
//! for `AclError`), `name` (its spec name), `ze_result` / `ze_name` (the Level Zero code, the
//! nearest one for ACL refusals), `acl_error` (the ACL code of the same meaning) and `message`
//! (hetmem's message, naming the bad value).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    hetmem,
    HetmemError,
    PyException,
    "A refusal by a hetmem spec rule: `code`, `name`, `ze_result`, `ze_name`, `acl_error`, `message`."
);
create_exception!(
    hetmem,
    OutOfHostMemoryError,
    HetmemError,
    "ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY (0x70000002)."
);
create_exception!(
    hetmem,
    OutOfDeviceMemoryError,
    HetmemError,
    "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY (0x70000003)."
);
create_exception!(
    hetmem,
    UninitializedError,
    HetmemError,
    "ZE_RESULT_ERROR_UNINITIALIZED (0x78000001): e.g. the cuda backend cannot start here."
);
create_exception!(
    hetmem,
    UnsupportedFeatureError,
    HetmemError,
    "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE (0x78000003)."
);
create_exception!(
    hetmem,
    InvalidArgumentError,
    HetmemError,
    "ZE_RESULT_ERROR_INVALID_ARGUMENT (0x78000004)."
);
create_exception!(
    hetmem,
    InvalidNullHandleError,
    HetmemError,
    "ZE_RESULT_ERROR_INVALID_NULL_HANDLE (0x78000005)."
);
create_exception!(
    hetmem,
    HandleObjectInUseError,
    HetmemError,
    "ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE (0x78000006)."
);
create_exception!(
    hetmem,
    InvalidNullPointerError,
    HetmemError,
    "ZE_RESULT_ERROR_INVALID_NULL_POINTER (0x78000007)."
);
create_exception!(
    hetmem,
    InvalidSizeError,
    HetmemError,
    "ZE_RESULT_ERROR_INVALID_SIZE (0x78000008)."
);
create_exception!(
    hetmem,
    UnsupportedSizeError,
    HetmemError,
    "ZE_RESULT_ERROR_UNSUPPORTED_SIZE (0x78000009)."
);
create_exception!(
    hetmem,
    UnsupportedAlignmentError,
    HetmemError,
    "ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT (0x7800000a)."
);
create_exception!(
    hetmem,
    InvalidEnumerationError,
    HetmemError,
    "ZE_RESULT_ERROR_INVALID_ENUMERATION (0x7800000c)."
);
create_exception!(
    hetmem,
    UnsupportedEnumerationError,
    HetmemError,
    "ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION (0x7800000d)."
);
create_exception!(
    hetmem,
    AddressNotFoundError,
    HetmemError,
    "ZE_RESULT_ERROR_ADDRESS_NOT_FOUND (0x78000021)."
);
create_exception!(
    hetmem,
    UnknownError,
    HetmemError,
    "ZE_RESULT_ERROR_UNKNOWN (0x7ffffffe): an OS or driver failure."
);
create_exception!(hetmem, AclError, HetmemError, "A refusal by an ACL rule (managed memory): `code` is the aclError, e.g. 107000 ACL_ERROR_RT_PARAM_INVALID.");

/// The Python exception for a hetmem error, with its attributes set.
pub fn to_py(e: hetmem::Error) -> PyErr {
    use hetmem::Error as E;
    let (code, name, text) = match &e {
        E::Acl(c, m) => (
            *c as u32,
            c.name(),
            format!("{} ({}): {m}", c.name(), *c as u32),
        ),
        other => (
            other.ze_result(),
            other.ze_name(),
            format!(
                "{} ({:#x}): {}",
                other.ze_name(),
                other.ze_result(),
                other.message()
            ),
        ),
    };
    let err = match &e {
        E::OutOfHostMemory(_) => OutOfHostMemoryError::new_err(text),
        E::OutOfDeviceMemory(_) => OutOfDeviceMemoryError::new_err(text),
        E::Uninitialized(_) => UninitializedError::new_err(text),
        E::UnsupportedFeature(_) => UnsupportedFeatureError::new_err(text),
        E::InvalidArgument(_) => InvalidArgumentError::new_err(text),
        E::InvalidNullHandle(_) => InvalidNullHandleError::new_err(text),
        E::HandleObjectInUse(_) => HandleObjectInUseError::new_err(text),
        E::InvalidNullPointer(_) => InvalidNullPointerError::new_err(text),
        E::InvalidSize(_) => InvalidSizeError::new_err(text),
        E::UnsupportedSize(_) => UnsupportedSizeError::new_err(text),
        E::UnsupportedAlignment(_) => UnsupportedAlignmentError::new_err(text),
        E::InvalidEnumeration(_) => InvalidEnumerationError::new_err(text),
        E::UnsupportedEnumeration(_) => UnsupportedEnumerationError::new_err(text),
        E::AddressNotFound(_) => AddressNotFoundError::new_err(text),
        E::Unknown(_) => UnknownError::new_err(text),
        E::Acl(..) => AclError::new_err(text),
    };
    Python::attach(|py| {
        let v = err.value(py);
        // Setting attributes on a fresh exception instance cannot fail in practice; if it did,
        // the exception still carries its text.
        let _ = v.setattr("code", code);
        let _ = v.setattr("name", name);
        let _ = v.setattr("ze_result", e.ze_result());
        let _ = v.setattr("ze_name", e.ze_name());
        let _ = v.setattr("acl_error", e.acl_error());
        let _ = v.setattr("message", e.message());
    });
    err
}

/// `Result<T, hetmem::Error>` into a `PyResult`.
pub trait IntoPyResult<T> {
    /// Converts the error with [`to_py`].
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for hetmem::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("HetmemError", py.get_type::<HetmemError>())?;
    m.add(
        "OutOfHostMemoryError",
        py.get_type::<OutOfHostMemoryError>(),
    )?;
    m.add(
        "OutOfDeviceMemoryError",
        py.get_type::<OutOfDeviceMemoryError>(),
    )?;
    m.add("UninitializedError", py.get_type::<UninitializedError>())?;
    m.add(
        "UnsupportedFeatureError",
        py.get_type::<UnsupportedFeatureError>(),
    )?;
    m.add(
        "InvalidArgumentError",
        py.get_type::<InvalidArgumentError>(),
    )?;
    m.add(
        "InvalidNullHandleError",
        py.get_type::<InvalidNullHandleError>(),
    )?;
    m.add(
        "HandleObjectInUseError",
        py.get_type::<HandleObjectInUseError>(),
    )?;
    m.add(
        "InvalidNullPointerError",
        py.get_type::<InvalidNullPointerError>(),
    )?;
    m.add("InvalidSizeError", py.get_type::<InvalidSizeError>())?;
    m.add(
        "UnsupportedSizeError",
        py.get_type::<UnsupportedSizeError>(),
    )?;
    m.add(
        "UnsupportedAlignmentError",
        py.get_type::<UnsupportedAlignmentError>(),
    )?;
    m.add(
        "InvalidEnumerationError",
        py.get_type::<InvalidEnumerationError>(),
    )?;
    m.add(
        "UnsupportedEnumerationError",
        py.get_type::<UnsupportedEnumerationError>(),
    )?;
    m.add(
        "AddressNotFoundError",
        py.get_type::<AddressNotFoundError>(),
    )?;
    m.add("UnknownError", py.get_type::<UnknownError>())?;
    m.add("AclError", py.get_type::<AclError>())?;
    Ok(())
}
