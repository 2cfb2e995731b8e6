//! The V2 shareable-handle calls (`aclrtMemExportToShareableHandleV2`,
//! `aclrtMemImportFromShareableHandleV2`, `aclrtMemSetPidToShareableHandleV2`): the V1 calls of
//! [`crate::vmm`] with the handle behind a pointer, as a `uint64_t`
//! (`ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT`) or a 128-byte `aclrtMemFabricHandle`
//! (`ACL_MEM_SHARE_HANDLE_TYPE_FABRIC`, which here carries the same shareable handle: fabric
//! sharing within one machine, [`hetmem::acl_ext::fabric_bytes`]).

use crate::vmm::{
    aclrtMemExportToShareableHandle, aclrtMemImportFromShareableHandle,
    aclrtMemSetPidToShareableHandle,
};
use crate::{entry, null, out, AclError, Fail, Res};

/// A V1 call's answer as this call's result (its message taken as ours).
fn inner(code: AclError) -> Res {
    if code == 0 {
        return Ok(());
    }
    // SAFETY: the library's NUL-terminated message of this thread.
    let m = unsafe { std::ffi::CStr::from_ptr(crate::aclGetRecentErrMsg()) };
    Err(Fail::new(code, m.to_string_lossy().into_owned()))
}

/// The shareable handle behind `p` of type `share_type`.
///
/// # Safety
/// `p` is non-null and points to a `uint64_t` (DEFAULT) or an `aclrtMemFabricHandle` (FABRIC).
unsafe fn read_shareable(p: *const libc::c_void, share_type: u32) -> Res<u64> {
    Ok(
        match hetmem::acl_ext::SharedHandleType::from_raw(share_type)? {
            // SAFETY: the caller's contract.
            hetmem::acl_ext::SharedHandleType::Default => unsafe {
                (p as *const u64).read_unaligned()
            },
            hetmem::acl_ext::SharedHandleType::Fabric => {
                // SAFETY: the caller's contract.
                let b = unsafe { (p as *const [u8; 128]).read_unaligned() };
                hetmem::acl_ext::fabric_shareable(&b)?
            }
        },
    )
}

/// `aclrtMemExportToShareableHandleV2`: as `aclrtMemExportToShareableHandle` (default pid
/// validation), writing the handle to `*shareableHandle` as a `uint64_t` (DEFAULT, 1) or an
/// `aclrtMemFabricHandle` (FABRIC, 2).
///
/// Errors: those of the V1 call; `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer or
/// flags other than 0; `ACL_ERROR_RT_PARAM_INVALID` (107000) for another share type.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemExportToShareableHandleV2(
    handle: *mut libc::c_void,
    flags: u64,
    share_type: u32,
    shareable_handle: *mut libc::c_void,
) -> AclError {
    entry("aclrtMemExportToShareableHandleV2", || {
        if shareable_handle.is_null() {
            return Err(null("shareableHandle"));
        }
        hetmem::acl::check_flags_zero(flags)?;
        let t = hetmem::acl_ext::SharedHandleType::from_raw(share_type)?;
        let mut sh = 0u64;
        // SAFETY: a valid out-pointer of our own.
        inner(unsafe { aclrtMemExportToShareableHandle(handle, 0, 0, &mut sh) })?;
        match t {
            // SAFETY: non-null, a uint64_t of the caller.
            hetmem::acl_ext::SharedHandleType::Default => unsafe {
                out(shareable_handle as *mut u64, sh)
            },
            // SAFETY: non-null, an aclrtMemFabricHandle of the caller.
            hetmem::acl_ext::SharedHandleType::Fabric => unsafe {
                out(
                    shareable_handle as *mut [u8; 128],
                    hetmem::acl_ext::fabric_bytes(sh),
                )
            },
        }
        Ok(())
    })
}

/// `aclrtMemImportFromShareableHandleV2`: as `aclrtMemImportFromShareableHandle` on the
/// current device, the handle read from `*shareableHandle` of type `shareType`.
///
/// Errors: those of the V1 call; `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer or
/// flags other than 0; `ACL_ERROR_RT_PARAM_INVALID` (107000) for another share type or a fabric
/// handle that is not one.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemImportFromShareableHandleV2(
    shareable_handle: *const libc::c_void,
    share_type: u32,
    flags: u64,
    handle: *mut *mut libc::c_void,
) -> AclError {
    entry("aclrtMemImportFromShareableHandleV2", || {
        let g = crate::state::fast_global()?;
        if shareable_handle.is_null() || handle.is_null() {
            return Err(null(if handle.is_null() {
                "handle"
            } else {
                "shareableHandle"
            }));
        }
        hetmem::acl::check_flags_zero(flags)?;
        // SAFETY: non-null, the caller's handle of that type.
        let sh = unsafe { read_shareable(shareable_handle, share_type) }?;
        let dev = g.current()?.dev.ordinal() as i32;
        // SAFETY: the caller's out-pointer, non-null.
        inner(unsafe { aclrtMemImportFromShareableHandle(sh, dev, handle) })
    })
}

/// `aclrtMemSetPidToShareableHandleV2`: as `aclrtMemSetPidToShareableHandle`, the handle read
/// from `*shareableHandle` of type `shareType`.
///
/// Errors: those of the V1 call; `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer;
/// `ACL_ERROR_RT_PARAM_INVALID` (107000) for another share type.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemSetPidToShareableHandleV2(
    shareable_handle: *const libc::c_void,
    share_type: u32,
    pid: *const i32,
    pid_num: usize,
) -> AclError {
    entry("aclrtMemSetPidToShareableHandleV2", || {
        if shareable_handle.is_null() {
            return Err(null("shareableHandle"));
        }
        // SAFETY: non-null, the caller's handle of that type.
        let sh = unsafe { read_shareable(shareable_handle, share_type) }?;
        // SAFETY: the caller's pid array.
        inner(unsafe { aclrtMemSetPidToShareableHandle(sh, pid, pid_num) })
    })
}
