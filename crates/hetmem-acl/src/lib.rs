//! # hetmem-acl: an ACL-compatible C library (`libascendcl.so`) over hetmem
//!
//! C and C++ programs written against `acl/acl.h` link this library with `-lascendcl` (headers in
//! `include/acl/` of this crate) and run on any hetmem backend (`HETMEM_BACKEND`, the host
//! backend by default, configured by `HETMEM_HOST_DEVICES` / `HETMEM_HOST_DEVICE_MEMORY`).
//!
//! This crate only **translates**: C arguments become calls of hetmem's safe API
//! ([`hetmem::Context`], [`hetmem::Stream`], ...), and [`hetmem::Error::acl_error`] becomes the
//! returned `aclError`. Every rule of the spec (sizes, alignment, advice, attribute answers,
//! error selection) lives in hetmem's semantics layer. What is decided here is what only a C
//! library has:
//! - **handles**: contexts, streams, events and physical-memory handles given to C are opaque
//!   numbers looked up in a registry ([`state`]; physical handles in a slab, [`vmm::Vmm`]), never
//!   dereferenced; an unknown, destroyed or foreign handle is `ACL_ERROR_RT_PARAM_INVALID` (107000), never a crash;
//! - **per-thread state**: the current context (and with it the current device), the message of
//!   the last failed call ([`aclGetRecentErrMsg`]) and the last error code
//!   (`aclrtGetLastError` / `aclrtPeekAtLastError`); there is no sticky error: a failed call
//!   changes nothing and later calls work;
//! - **the library's life**: `aclInit` / `aclFinalize` (`ACL_ERROR_UNINITIALIZE` 100001 before
//!   `aclInit`, `ACL_ERROR_REPEAT_INITIALIZE` 100002 for a second one);
//! - **no panic crosses the C ABI**: every entry point runs inside [`entry`], which catches a
//!   panic and answers `ACL_ERROR_RT_INTERNAL_ERROR` (507000).
//!
//! Modules: [`setup`] (init, devices, contexts, errors), [`memory`] (malloc / free / memset /
//! memcpy / mem info), [`managed`] (managed memory), [`stream`] (streams and events),
//! [`vmm`] (virtual memory and shareable handles).
//!
//! # The published calls and what this library does with them
//!
//! Every function CANN's `acl_rt.h` (1.17) declares in the memory, virtual-memory,
//! shareable-handle / IPC and managed-memory groups, and the device / context / stream / event
//! calls the published examples make, is declared in `include/acl/` and exported. "hetmem"
//! means implemented through hetmem's semantics layer (this crate only translates); "207000"
//! means declared and answering `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` with a message saying why.
//! Backends: host and cuda alike unless the row says otherwise (managed memory on the host
//! backend needs userfaultfd; where it is refused, streams run plain-memory work only and the
//! host-function rows answer 207000 saying so).
//!
//! | group | function | status |
//! |---|---|---|
//! | set-up | `aclInit`, `aclFinalize`, `aclrtGetVersion`, `aclGetRecentErrMsg` (read once), `aclrtGetLastError`, `aclrtPeekAtLastError` | hetmem |
//! | devices, contexts | `aclrtSetDevice`, `aclrtResetDevice`, `aclrtResetDeviceForce`, `aclrtGetDevice`, `aclrtGetDeviceCount`, `aclrtGetRunMode`, `aclrtCreateContext`, `aclrtDestroyContext`, `aclrtSetCurrentContext`, `aclrtGetCurrentContext`, `aclrtDeviceGetBareTgid` | hetmem |
//! | streams, events | `aclrtCreateStream`, `aclrtDestroyStream`, `aclrtDestroyStreamForce`, `aclrtSynchronizeStream`, `aclrtSynchronizeDevice`, `aclrtCreateEvent`, `aclrtCreateEventWithFlag`, `aclrtCreateEventExWithFlag`, `aclrtDestroyEvent`, `aclrtRecordEvent`, `aclrtStreamWaitEvent`, `aclrtSynchronizeEvent`, `aclrtQueryEventStatus` | hetmem (`ACL_EVENT_IPC`: 207000) |
//! | stream host work, values | `aclrtLaunchHostFunc`, `aclrtLaunchCallback`, `aclrtValueWrite`, `aclrtValueWait` | hetmem (207000 without managed memory) |
//! | kernels | `aclrtLaunchKernel` | 207000: hetmem runs no kernels |
//! | memory | `aclrtMalloc`, `aclrtMallocAlign32`, `aclrtMallocCached`, `aclrtMallocWithCfg`, `aclrtMallocForTaskScheduler`, `aclrtMallocHost`, `aclrtMallocHostWithCfg`, `aclrtFree`, `aclrtFreeHost`, `aclrtFreeWithDevSync`, `aclrtFreeHostWithDevSync`, `aclrtGetMemInfo`, `aclrtMemGetAddressRange`, `aclrtPointerGetAttributes` | hetmem |
//! | copies, fills | `aclrtMemcpy`, `aclrtMemcpyAsync`, `aclrtMemcpyAsyncWithCondition`, `aclrtMemcpy2d`, `aclrtMemcpy2dAsync`, `aclrtMemcpyBatch`, `aclrtMemcpyBatchV2`, `aclrtMemcpyBatchAsync`, `aclrtMemcpyBatchAsyncV2`, `aclrtMemset`, `aclrtMemsetAsync`, `aclrtMemsetD32`, `aclrtMemsetD32Async` | hetmem (`D32Async` on managed memory with four different bytes: 207000) |
//! | copies for kernels | `aclrtGetSymbolAddress`, `aclrtGetSymbolSize`, `aclrtMemcpyFromSymbol(Async)`, `aclrtMemcpyToSymbol(Async)`, `aclrtGetMemcpyDescSize`, `aclrtSetMemcpyDesc`, `aclrtMemcpyAsyncWithDesc`, `aclrtMemcpyAsyncWithOffset` | 207000: symbols, descriptors and device-read addresses belong to kernels |
//! | host registration | `aclrtHostRegister`, `aclrtHostRegisterV2`, `aclrtHostGetDevicePointer`, `aclrtHostUnregister`, `aclrtHostMemMapCapabilities` | hetmem (IOMEMORY: 207000) |
//! | virtual memory | `aclrtMemGetAllocationGranularity`, `aclrtReserveMemAddress`, `aclrtReleaseMemAddress`, `aclrtMallocPhysical`, `aclrtFreePhysical`, `aclrtMapMem`, `aclrtMemMapNoAccess`, `aclrtUnmapMem`, `aclrtMemSetAccess`, `aclrtMemGetAccess`, `aclrtMemRetainAllocationHandle`, `aclrtMemGetAllocationPropertiesFromHandle` | hetmem (different access per device in one `aclrtMemSetAccess`: 207000) |
//! | virtual memory, Ascend links | `aclrtReserveMemAddressNoUCMemory`, `aclrtMemP2PMap`, `aclrtMemMapSelectedLink`, `aclrtMemMapSetLink` | 207000: UC memory, peer page tables and link selection are Ascend hardware |
//! | shareable handles | `aclrtMemExportToShareableHandle(V2)`, `aclrtMemImportFromShareableHandle(V2)`, `aclrtMemSetPidToShareableHandle(V2)` (V2: DEFAULT and FABRIC within one machine) | hetmem |
//! | IPC by key | `aclrtIpcMemGetExportKey`, `aclrtIpcMemSetImportPid`, `aclrtIpcMemImportByKey`, `aclrtIpcMemClose` | hetmem |
//! | IPC, other | `aclrtIpcMemSetAttr`, `aclrtIpcMemImportPidInterServer` | 207000: link selection, several machines |
//! | managed memory | `aclrtMemAllocManaged`, `aclrtMemManagedAdvise`, `aclrtMemManagedPrefetchAsync`, `aclrtMemManagedPrefetchBatchAsync`, `aclrtMemManagedGetAttr`, `aclrtMemManagedGetAttrs` | hetmem (207000 where the platform cannot migrate on faults) |

#![allow(clippy::missing_safety_doc)]

use std::cell::RefCell;
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};

pub mod access;
pub mod copy;
pub mod family;
pub mod hostreg;
pub mod ipc;
pub mod managed;
pub mod memory;
pub mod setup;
pub mod share_v2;
pub mod state;
pub mod stream;
pub mod unsupported;
pub mod vmm;

/// `aclError`.
pub type AclError = i32;

/// `ACL_SUCCESS`.
pub const ACL_SUCCESS: AclError = 0;
/// `ACL_ERROR_INVALID_PARAM`.
pub const ACL_ERROR_INVALID_PARAM: AclError = 100_000;
/// `ACL_ERROR_UNINITIALIZE`: a call before `aclInit` (or after `aclFinalize`).
pub const ACL_ERROR_UNINITIALIZE: AclError = 100_001;
/// `ACL_ERROR_REPEAT_INITIALIZE`: `aclInit` while initialised.
pub const ACL_ERROR_REPEAT_INITIALIZE: AclError = 100_002;
/// `ACL_ERROR_INVALID_FILE`: `aclInit` with a configuration path that cannot be read.
pub const ACL_ERROR_INVALID_FILE: AclError = 100_003;
/// `ACL_ERROR_RT_PARAM_INVALID`.
pub const ACL_ERROR_RT_PARAM_INVALID: AclError = 107_000;
/// `ACL_ERROR_RT_CONTEXT_NULL`: the calling thread has no current context (no
/// `aclrtSetDevice`, `aclrtCreateContext` or `aclrtSetCurrentContext` yet, or its device was
/// reset).
pub const ACL_ERROR_RT_CONTEXT_NULL: AclError = 107_002;
/// `ACL_ERROR_RT_INTERNAL_ERROR`: a panic inside the library (a bug), caught at the ABI.
pub const ACL_ERROR_RT_INTERNAL_ERROR: AclError = 507_000;

/// A failed call: the code returned to C and the message [`aclGetRecentErrMsg`] gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fail {
    /// The `aclError`.
    pub code: AclError,
    /// What was wrong, naming the bad value.
    pub msg: String,
}

impl Fail {
    /// A failure with a code of the C library's own (life cycle, current context).
    pub fn new(code: AclError, msg: impl Into<String>) -> Fail {
        Fail {
            code,
            msg: msg.into(),
        }
    }
}

impl From<hetmem::Error> for Fail {
    fn from(e: hetmem::Error) -> Fail {
        Fail {
            code: e.acl_error() as AclError,
            msg: e.to_string(),
        }
    }
}

/// The result of an entry point's body.
pub type Res<T = ()> = Result<T, Fail>;

/// A null pointer argument: `InvalidNullPointer` (100000, `ACL_ERROR_INVALID_PARAM`).
pub(crate) fn null(what: &str) -> Fail {
    hetmem::Error::InvalidNullPointer(format!("{what} is null")).into()
}

thread_local! {
    /// The message of the last failed call on this thread not yet read by
    /// [`aclGetRecentErrMsg`], NUL-terminated.
    static LAST_MSG: RefCell<Option<CString>> = const { RefCell::new(None) };
    /// The message [`aclGetRecentErrMsg`] handed out last (its pointer stays valid until that
    /// call hands out another).
    static HANDED_MSG: RefCell<CString> = RefCell::new(CString::default());
    /// The code of the last failed call on this thread (`aclrtGetLastError`).
    static LAST_ERR: std::cell::Cell<AclError> = const { std::cell::Cell::new(0) };
}

fn record(name: &str, f: &Fail) {
    let text = format!("{name}: {} (error {})", f.msg, f.code);
    let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
    LAST_MSG.with(|m| *m.borrow_mut() = Some(c));
    LAST_ERR.with(|e| e.set(f.code));
}

/// Runs one entry point's body: `ACL_SUCCESS` for `Ok`; for `Err` the code, with the message
/// recorded for [`aclGetRecentErrMsg`]; a panic is caught (it never unwinds into C) and answers
/// `ACL_ERROR_RT_INTERNAL_ERROR` (507000).
pub fn entry(name: &'static str, body: impl FnOnce() -> Res) -> AclError {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => ACL_SUCCESS,
        Ok(Err(f)) => {
            record(name, &f);
            f.code
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".into());
            let f = Fail::new(
                ACL_ERROR_RT_INTERNAL_ERROR,
                format!("internal error: {what}"),
            );
            record(name, &f);
            f.code
        }
    }
}

/// Writes `v` through an out-pointer of the C caller (after every check has passed).
///
/// # Safety
/// `p` is non-null and points to writable memory for a `T` (the caller's contract).
pub(crate) unsafe fn out<T>(p: *mut T, v: T) {
    // SAFETY: the caller's contract; unaligned writes tolerated.
    unsafe { p.write_unaligned(v) }
}

/// `aclGetRecentErrMsg`: the message of the last failed call on the calling thread, naming the
/// bad value, **read once** (CANN documents the call as get-and-clear): the call takes the
/// message, so a second call with no failure in between answers `""` (never NULL, so a caller
/// may pass the answer to `strstr` / `printf` as it is). The pointer stays valid until a later
/// call on this thread hands out another message. Never fails; may be called before `aclInit`.
#[no_mangle]
pub extern "C" fn aclGetRecentErrMsg() -> *const libc::c_char {
    catch_unwind(|| match LAST_MSG.with(|m| m.borrow_mut().take()) {
        Some(msg) => HANDED_MSG.with(|h| {
            *h.borrow_mut() = msg;
            h.borrow().as_ptr()
        }),
        None => c"".as_ptr(),
    })
    .unwrap_or(c"".as_ptr())
}

/// `aclrtGetLastError(ACL_RT_THREAD_LEVEL)`: the code of the last failed call on the calling
/// thread, then clears it (so a second call answers `ACL_SUCCESS`). The level must be
/// `ACL_RT_THREAD_LEVEL` (0), else `ACL_ERROR_RT_PARAM_INVALID` (recorded as the last error
/// like any failure). May be called before `aclInit`.
#[no_mangle]
pub extern "C" fn aclrtGetLastError(level: u32) -> AclError {
    last_error(level, true)
}

/// `aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL)`: as [`aclrtGetLastError`] without clearing.
#[no_mangle]
pub extern "C" fn aclrtPeekAtLastError(level: u32) -> AclError {
    last_error(level, false)
}

fn last_error(level: u32, clear: bool) -> AclError {
    catch_unwind(|| {
        if level != 0 {
            let f: Fail = hetmem::Error::UnsupportedEnumeration(format!(
                "level {level} is not an aclrtLastErrLevel (only ACL_RT_THREAD_LEVEL, 0)"
            ))
            .into();
            record("aclrtGetLastError", &f);
            return f.code;
        }
        LAST_ERR.with(|e| {
            let v = e.get();
            if clear {
                e.set(0);
            }
            v
        })
    })
    .unwrap_or(ACL_ERROR_RT_INTERNAL_ERROR)
}
