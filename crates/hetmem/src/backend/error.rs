//! The backend's own error type.
//!
//! A backend fails only for what its caller cannot foresee (wgpu-hal's third rule): memory
//! running out, an OS limit, a lost device, a platform that lacks a facility, or an unexpected
//! failure of the platform. It never chooses a spec result code: the semantics layer turns a
//! [`HalError`] into the spec [`crate::Error`] in one place (`impl From<HalError> for Error` in
//! [`crate::error`]), and chooses differently where a rule asks for it.

/// `Result` of a backend operation.
pub type Result<T, E = HalError> = std::result::Result<T, E>;

/// Why a backend operation failed. Each message names the call that failed and, for a limit,
/// the limit and its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HalError {
    /// Host memory, or an OS limit on it (address space, `vm.max_map_count`, open files,
    /// `RLIMIT_FSIZE`, threads), is exhausted. CUDA: `CUDA_ERROR_OUT_OF_MEMORY` for host memory.
    #[error("{0}")]
    OutOfHostMemory(String),
    /// The device's own memory is exhausted (CUDA: `CUDA_ERROR_OUT_OF_MEMORY` for device memory).
    #[error("{0}")]
    OutOfDeviceMemory(String),
    /// The device stopped answering (CUDA: `CUDA_ERROR_ILLEGAL_ADDRESS`, `..._LAUNCH_FAILED`,
    /// a sticky error). Nothing on it can be trusted any more.
    #[error("{0}")]
    DeviceLost(String),
    /// The platform lacks the facility this operation needs (no `userfaultfd`, no host
    /// physical memory in this CUDA driver, ...). The message says what is missing.
    #[error("{0}")]
    Unsupported(String),
    /// Anything else the platform reported; the message names the call and its error.
    #[error("{0}")]
    Unexpected(String),
}
