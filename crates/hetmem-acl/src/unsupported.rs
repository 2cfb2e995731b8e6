//! The published calls of the families hetmem covers that it does not implement: each is
//! exported and answers `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000) with a message saying why
//! (recorded for `aclGetRecentErrMsg`), after `ACL_ERROR_UNINITIALIZE` before `aclInit`.
//! Nothing is read through their pointers.

use crate::{entry, AclError, Fail};

fn refuse(name: &'static str, why: &str) -> AclError {
    entry(name, || {
        crate::state::global()?;
        Err(Fail::from(hetmem::Error::UnsupportedFeature(format!(
            "{name} is not supported by hetmem: {why}"
        ))))
    })
}

/// Why the symbol calls are refused.
const SYMBOLS: &str = "device symbols belong to kernel binaries, and hetmem loads and runs no \
                       kernels";
/// Why the descriptor copies are refused.
const DESCS: &str = "memcpy descriptors are read by device kernels, and hetmem runs none";

macro_rules! unsupported {
    ($($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) => $why:expr;)*) => {$(
        $(#[$doc])*
        #[no_mangle]
        pub extern "C" fn $name($($arg: $ty),*) -> AclError {
            $(let _ = $arg;)*
            refuse(stringify!($name), $why)
        }
    )*};
}

type P = *mut libc::c_void;
type CP = *const libc::c_void;

unsupported! {
    /// `aclrtGetSymbolAddress`: 207000 (no kernel binaries).
    fn aclrtGetSymbolAddress(symbol: CP, dev_ptr: *mut P) => SYMBOLS;
    /// `aclrtGetSymbolSize`: 207000 (no kernel binaries).
    fn aclrtGetSymbolSize(symbol: CP, size: *mut usize) => SYMBOLS;
    /// `aclrtMemcpyFromSymbol`: 207000 (no kernel binaries).
    fn aclrtMemcpyFromSymbol(dst: P, dst_max: usize, symbol: CP, count: usize, offset: usize,
                             kind: u32) => SYMBOLS;
    /// `aclrtMemcpyFromSymbolAsync`: 207000 (no kernel binaries).
    fn aclrtMemcpyFromSymbolAsync(dst: P, dst_max: usize, symbol: CP, count: usize,
                                  offset: usize, kind: u32, stream: P) => SYMBOLS;
    /// `aclrtMemcpyToSymbol`: 207000 (no kernel binaries).
    fn aclrtMemcpyToSymbol(symbol: CP, src: CP, count: usize, offset: usize, kind: u32)
        => SYMBOLS;
    /// `aclrtMemcpyToSymbolAsync`: 207000 (no kernel binaries).
    fn aclrtMemcpyToSymbolAsync(symbol: CP, src: CP, count: usize, offset: usize, kind: u32,
                                stream: P) => SYMBOLS;
    /// `aclrtGetMemcpyDescSize`: 207000 (descriptors are for kernels).
    fn aclrtGetMemcpyDescSize(kind: u32, desc_size: *mut usize) => DESCS;
    /// `aclrtSetMemcpyDesc`: 207000 (descriptors are for kernels).
    fn aclrtSetMemcpyDesc(desc: P, kind: u32, src_addr: P, dst_addr: P, count: usize,
                          config: P) => DESCS;
    /// `aclrtMemcpyAsyncWithDesc`: 207000 (descriptors are for kernels).
    fn aclrtMemcpyAsyncWithDesc(desc: P, kind: u32, stream: P) => DESCS;
    /// `aclrtMemcpyAsyncWithOffset`: 207000.
    fn aclrtMemcpyAsyncWithOffset(dst: *mut P, dest_max: usize, dst_data_offset: usize,
                                  src: *mut CP, count: usize, src_data_offset: usize,
                                  kind: u32, stream: P)
        => "its addresses are read from device memory when the copy runs (a task-sink \
            feature of Ascend's scheduler); use aclrtMemcpyAsync";
    /// `aclrtLaunchKernel`: 207000 (no kernels).
    fn aclrtLaunchKernel(func_handle: P, num_blocks: u32, args_data: CP, args_size: usize,
                         stream: P)
        => "hetmem runs no device kernels (aclrtLaunchHostFunc runs host work in stream order)";
    /// `aclrtIpcMemSetAttr`: 207000 (no link selection).
    fn aclrtIpcMemSetAttr(key: *const libc::c_char, ty: u32, attr: u64)
        => "the only attribute, ACL_RT_IPC_MEM_ATTR_ACCESS_LINK, picks an Ascend \
            interconnect (SIO, HCCS, UB), which hetmem's devices do not have";
    /// `aclrtIpcMemImportPidInterServer`: 207000 (one machine).
    fn aclrtIpcMemImportPidInterServer(key: *const libc::c_char, server_pids: P, num: usize)
        => "hetmem shares memory between processes of one machine only";
    /// `aclrtReserveMemAddressNoUCMemory`: 207000.
    fn aclrtReserveMemAddressNoUCMemory(vir_ptr: *mut P, size: usize, alignment: usize,
                                        expect_ptr: P, flags: u64)
        => "reservations without Ascend's UC memory are a device mode hetmem does not \
            model; aclrtReserveMemAddress reserves address space";
    /// `aclrtMemP2PMap`: 207000.
    fn aclrtMemP2PMap(dev_ptr: P, size: usize, dst_dev_id: i32, flags: u64)
        => "peer page tables between Ascend devices are not modelled; hetmem's device memory \
            is reached by the copies of every device of the runtime";
    /// `aclrtMemMapSelectedLink`: 207000 (no link selection).
    fn aclrtMemMapSelectedLink(vir_ptr_dst: P, size: usize, vir_ptr_src: P, link_idx: u32)
        => "mapping through a chosen Ascend link (SIO, HCCS) is not modelled";
    /// `aclrtMemMapSetLink`: 207000 (no link selection).
    fn aclrtMemMapSetLink(handle: P, advice_link: u32)
        => "choosing an Ascend link (SIO, HCCS, UB) for a handle is not modelled";
}
