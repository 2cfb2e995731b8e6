//! The DDI tables (`zeGet*ProcAddrTable`) and the functions answered
//! `ZE_RESULT_ERROR_UNSUPPORTED_FEATURE`.
//!
//! Each table is listed in header declaration order with the API minor version in which each
//! slot first appeared in `ze_ddi.h` (1.0 to 1.18; the order and versions follow the published
//! headers: the installed 1.4 `ze_ddi.h`, Debian trixie's 1.12 `ze_ddi.h`, and, for 1.13 to
//! 1.18, the DDI manifest of Intel's compute-runtime). Slots appear in version order, so the
//! table of version 1.N is a prefix: a getter asked for 1.N writes exactly the slots that exist
//! in 1.N and never past them; asked for a newer 1.x than 1.18 it writes every slot it knows
//! (the caller's table is at least that long). A major version other than 1 is
//! `ZE_RESULT_ERROR_UNSUPPORTED_VERSION` and nothing is written; a null table is
//! `ZE_RESULT_ERROR_INVALID_NULL_POINTER`.
//!
//! Every slot is filled: implemented functions ([`crate::api`]) or a stub that answers
//! `ZE_RESULT_ERROR_UNSUPPORTED_FEATURE`. The tables are built here from the API module's
//! functions; the API module never names this one (`zeDriverGetExtensionFunctionAddress`, the
//! one entry point that reads the tables, is here). Every function is also exported under its own name,
//! so that a program can link `-lze_hetmem` directly.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::c_void;

#[allow(clippy::wildcard_imports)]
use crate::api::*;
use crate::types::*;
use crate::zer::*;

/// The newest minor version whose table layout is known here.
pub const NEWEST_MINOR: u32 = 18;

/// Answers an unsupported call.
#[cold]
fn unsupported(name: &str) -> ze_result_t {
    crate::rt::guard(|| {
        Err(crate::rt::fail(
            ZE_RESULT_ERROR_UNSUPPORTED_FEATURE,
            format!("{name} is not supported by the hetmem Level Zero driver"),
        ))
    })
}

macro_rules! stubs {
    ($($f:ident)*) => {
        $(
            /// Not supported: answers `ZE_RESULT_ERROR_UNSUPPORTED_FEATURE`.
            #[no_mangle]
            pub extern "C" fn $f() -> ze_result_t {
                unsupported(stringify!($f))
            }
        )*
        /// Every function answered `ZE_RESULT_ERROR_UNSUPPORTED_FEATURE`.
        pub const UNSUPPORTED: &[&str] = &[$(stringify!($f)),*];
    };
}

stubs! {
    zeDriverRTASFormatCompatibilityCheckExt zeDriverRTASFormatCompatibilityCheckExp
    zeMemGetPitchFor2dImage
    zeContextMakeImageResident zeContextEvictImage
    zeDeviceReserveCacheExt zeDeviceSetCacheAdviceExt zeDevicePciGetPropertiesExt
    zeDeviceImportExternalSemaphoreExt zeDeviceReleaseExternalSemaphoreExt
    zeDeviceGetVectorWidthPropertiesExt zeDeviceSynchronize
    zeDeviceGetAggregatedCopyOffloadIncrementValue zeDeviceGetRuntimeRequirements
    zeDeviceGetRuntimeRequirementsKey zeDeviceValidateRuntimeRequirements
    zeDeviceGetCounterBasedEventMaxValue zeDeviceGetCompilerInfo zeDeviceGetFabricVertexExp
    zeCommandQueueGetOrdinal zeCommandQueueGetIndex zeCommandQueueGetFlags zeCommandQueueGetMode
    zeCommandQueueGetPriority
    zeCommandListAppendWriteGlobalTimestamp zeCommandListAppendMemoryCopyRegion
    zeCommandListAppendMemoryCopyFromContext zeCommandListAppendImageCopy
    zeCommandListAppendImageCopyRegion zeCommandListAppendImageCopyToMemory
    zeCommandListAppendImageCopyFromMemory zeCommandListAppendEventReset
    zeCommandListAppendQueryKernelTimestamps zeCommandListAppendLaunchKernel
    zeCommandListAppendLaunchCooperativeKernel zeCommandListAppendLaunchKernelIndirect
    zeCommandListAppendLaunchMultipleKernelsIndirect zeCommandListAppendImageCopyToMemoryExt
    zeCommandListAppendImageCopyFromMemoryExt zeCommandListGetDeviceHandle
    zeCommandListGetContextHandle zeCommandListGetOrdinal zeCommandListImmediateGetIndex
    zeCommandListIsImmediate zeCommandListAppendSignalExternalSemaphoreExt
    zeCommandListAppendWaitExternalSemaphoreExt zeCommandListAppendLaunchKernelWithParameters
    zeCommandListAppendLaunchKernelWithArguments zeCommandListAppendMemoryCopyWithParameters
    zeCommandListAppendMemoryFillWithParameters zeCommandListImmediateAppendCommandListsWithParameters
    zeCommandListGetFlags zeCommandListImmediateGetFlags zeCommandListImmediateGetMode
    zeCommandListImmediateGetPriority zeCommandListBeginGraphCaptureExt
    zeCommandListBeginCaptureIntoGraphExt zeCommandListIsGraphCaptureEnabledExt
    zeCommandListEndGraphCaptureExt zeCommandListGetGraphExt zeCommandListAppendGraphExt
    zeCommandListAppendHostFunction zeCommandListAppendSignalEventWithParameters
    zeCommandListAppendWaitOnEventsWithParameters
    zeCommandListCreateCloneExp zeCommandListImmediateAppendCommandListsExp
    zeCommandListGetNextCommandIdExp zeCommandListUpdateMutableCommandsExp
    zeCommandListUpdateMutableCommandSignalEventExp zeCommandListUpdateMutableCommandWaitEventsExp
    zeCommandListGetNextCommandIdWithKernelsExp zeCommandListUpdateMutableCommandKernelsExp
    zeCommandListIsMutableExp
    zeGraphCreateExt zeGraphGetPrimaryCommandListExt zeGraphSetDestructionCallbackExt
    zeGraphInstantiateExt zeGraphIsEmptyExt zeGraphDumpContentsExt zeGraphDestroyExt
    zeExecutableGraphGetSourceGraphExt zeExecutableGraphDestroyExt
    zeEventPoolGetIpcHandle zeEventPoolOpenIpcHandle zeEventPoolCloseIpcHandle
    zeEventPoolPutIpcHandle zeEventPoolGetContextHandle zeEventPoolGetFlags
    zeEventQueryKernelTimestamp zeEventQueryKernelTimestampsExt zeEventGetEventPool
    zeEventGetSignalScope zeEventGetWaitScope zeEventCounterBasedCreate
    zeEventCounterBasedGetIpcHandle zeEventCounterBasedOpenIpcHandle
    zeEventCounterBasedCloseIpcHandle zeEventCounterBasedGetDeviceAddress
    zeEventGetCounterBasedFlags zeEventQueryTimestampsExp
    zeImageGetProperties zeImageCreate zeImageDestroy zeImageGetAllocPropertiesExt
    zeImageViewCreateExt zeImageGetMemoryPropertiesExp zeImageViewCreateExp
    zeImageGetDeviceOffsetExp
    zeModuleCreate zeModuleDestroy zeModuleDynamicLink zeModuleGetNativeBinary
    zeModuleGetGlobalPointer zeModuleGetKernelNames zeModuleGetProperties
    zeModuleGetFunctionPointer zeModuleInspectLinkageExt zeModuleGetDeviceHandle
    zeModuleBuildLogDestroy zeModuleBuildLogGetString
    zeKernelCreate zeKernelDestroy zeKernelSetCacheConfig zeKernelSetGroupSize
    zeKernelSuggestGroupSize zeKernelSuggestMaxCooperativeGroupCount zeKernelSetArgumentValue
    zeKernelSetIndirectAccess zeKernelGetIndirectAccess zeKernelGetSourceAttributes
    zeKernelGetProperties zeKernelGetName zeKernelGetModuleHandle
    zeKernelSetGlobalOffsetExp zeKernelSchedulingHintExp zeKernelGetBinaryExp
    zeKernelGetAllocationPropertiesExp
    zeSamplerCreate zeSamplerDestroy
    zeMemSetAtomicAccessAttributeExp zeMemGetAtomicAccessAttributeExp
    zeFabricVertexGetExp zeFabricVertexGetSubVerticesExp zeFabricVertexGetPropertiesExp
    zeFabricVertexGetDeviceExp zeFabricEdgeGetExp zeFabricEdgeGetVerticesExp
    zeFabricEdgeGetPropertiesExp
    zeRTASParallelOperationCreateExp zeRTASParallelOperationGetPropertiesExp
    zeRTASParallelOperationJoinExp zeRTASParallelOperationDestroyExp
    zeRTASBuilderCreateExp zeRTASBuilderGetBuildPropertiesExp zeRTASBuilderBuildExp
    zeRTASBuilderDestroyExp
    zeRTASBuilderCreateExt zeRTASBuilderGetBuildPropertiesExt zeRTASBuilderBuildExt
    zeRTASBuilderCommandListAppendCopyExt zeRTASBuilderDestroyExt
    zeRTASParallelOperationCreateExt zeRTASParallelOperationGetPropertiesExt
    zeRTASParallelOperationJoinExt zeRTASParallelOperationDestroyExt
}

/// Fills `table` with the slots of version `version` (see the module docs).
unsafe fn fill(version: u32, table: *mut ze_pfn_t, slots: &[(u32, ze_pfn_t)]) -> ze_result_t {
    crate::rt::guard(|| {
        if table.is_null() {
            return Err(crate::rt::fail(
                ZE_RESULT_ERROR_INVALID_NULL_POINTER,
                "pDdiTable is null",
            ));
        }
        if version >> 16 != 1 {
            return Err(crate::rt::fail(
                ZE_RESULT_ERROR_UNSUPPORTED_VERSION,
                format!("API version {version:#x} is not 1.x"),
            ));
        }
        let minor = version & 0xffff;
        for (i, &(v, f)) in slots.iter().enumerate() {
            if v > minor {
                break;
            }
            *table.add(i) = f;
        }
        Ok(ZE_RESULT_SUCCESS)
    })
}

macro_rules! tables {
    ($( $getter:ident => [ $( $f:ident $v:literal ),* $(,)? ] ; )*) => {
        $(
            /// Fills the application's table of this name with this driver's functions
            /// (see the module docs for versions).
            #[no_mangle]
            pub unsafe extern "C" fn $getter(version: u32, pDdiTable: *mut c_void) -> ze_result_t {
                fill(version, pDdiTable as *mut ze_pfn_t, &[ $( ($v, $f as ze_pfn_t) ),* ])
            }
        )*
        /// Every table: getter name, then `(function name, minor version of the slot,
        /// function)` in slot order.
        pub fn all_tables() -> Vec<(&'static str, Vec<(&'static str, u32, ze_pfn_t)>)> {
            vec![ $( (stringify!($getter), vec![ $( (stringify!($f), $v, $f as ze_pfn_t) ),* ]) ),* ]
        }
    };
}

tables! {
    zeGetGlobalProcAddrTable => [zeInit 0, zeInitDrivers 10];
    // The runtime table (`zer_ddi.h`, [`crate::zer`]): asked by loaders that route `zer*`
    // through drivers; optional for them.
    zerGetGlobalProcAddrTable => [
        zerGetLastErrorDescription 14, zerTranslateDeviceHandleToIdentifier 14,
        zerTranslateIdentifierToDeviceHandle 14, zerGetDefaultContext 14,
    ];
    zeGetDriverProcAddrTable => [
        zeDriverGet 0, zeDriverGetApiVersion 0, zeDriverGetProperties 0,
        zeDriverGetIpcProperties 0, zeDriverGetExtensionProperties 0,
        zeDriverGetExtensionFunctionAddress 1, zeDriverGetLastErrorDescription 6,
        zeDriverRTASFormatCompatibilityCheckExt 13, zeDriverGetDefaultContext 14,
    ];
    zeGetDriverExpProcAddrTable => [zeDriverRTASFormatCompatibilityCheckExp 7];
    zeGetDeviceProcAddrTable => [
        zeDeviceGet 0, zeDeviceGetSubDevices 0, zeDeviceGetProperties 0,
        zeDeviceGetComputeProperties 0, zeDeviceGetModuleProperties 0,
        zeDeviceGetCommandQueueGroupProperties 0, zeDeviceGetMemoryProperties 0,
        zeDeviceGetMemoryAccessProperties 0, zeDeviceGetCacheProperties 0,
        zeDeviceGetImageProperties 0, zeDeviceGetExternalMemoryProperties 0,
        zeDeviceGetP2PProperties 0, zeDeviceCanAccessPeer 0, zeDeviceGetStatus 0,
        zeDeviceGetGlobalTimestamps 1, zeDeviceReserveCacheExt 2, zeDeviceSetCacheAdviceExt 2,
        zeDevicePciGetPropertiesExt 3, zeDeviceGetRootDevice 7,
        zeDeviceImportExternalSemaphoreExt 12, zeDeviceReleaseExternalSemaphoreExt 12,
        zeDeviceGetVectorWidthPropertiesExt 13, zeDeviceSynchronize 14,
        zeDeviceGetAggregatedCopyOffloadIncrementValue 15, zeDeviceGetRuntimeRequirements 16,
        zeDeviceGetRuntimeRequirementsKey 16, zeDeviceValidateRuntimeRequirements 16,
        zeDeviceGetCounterBasedEventMaxValue 17, zeDeviceGetCompilerInfo 18,
    ];
    zeGetDeviceExpProcAddrTable => [zeDeviceGetFabricVertexExp 4];
    zeGetContextProcAddrTable => [
        zeContextCreate 0, zeContextDestroy 0, zeContextGetStatus 0, zeContextSystemBarrier 0,
        zeContextMakeMemoryResident 0, zeContextEvictMemory 0, zeContextMakeImageResident 0,
        zeContextEvictImage 0, zeContextCreateEx 1,
    ];
    zeGetCommandQueueProcAddrTable => [
        zeCommandQueueCreate 0, zeCommandQueueDestroy 0, zeCommandQueueExecuteCommandLists 0,
        zeCommandQueueSynchronize 0, zeCommandQueueGetOrdinal 9, zeCommandQueueGetIndex 9,
        zeCommandQueueGetFlags 17, zeCommandQueueGetMode 17, zeCommandQueueGetPriority 17,
    ];
    zeGetCommandListProcAddrTable => [
        zeCommandListCreate 0, zeCommandListCreateImmediate 0, zeCommandListDestroy 0,
        zeCommandListClose 0, zeCommandListReset 0, zeCommandListAppendWriteGlobalTimestamp 0,
        zeCommandListAppendBarrier 0, zeCommandListAppendMemoryRangesBarrier 0,
        zeCommandListAppendMemoryCopy 0, zeCommandListAppendMemoryFill 0,
        zeCommandListAppendMemoryCopyRegion 0, zeCommandListAppendMemoryCopyFromContext 0,
        zeCommandListAppendImageCopy 0, zeCommandListAppendImageCopyRegion 0,
        zeCommandListAppendImageCopyToMemory 0, zeCommandListAppendImageCopyFromMemory 0,
        zeCommandListAppendMemoryPrefetch 0, zeCommandListAppendMemAdvise 0,
        zeCommandListAppendSignalEvent 0, zeCommandListAppendWaitOnEvents 0,
        zeCommandListAppendEventReset 0, zeCommandListAppendQueryKernelTimestamps 0,
        zeCommandListAppendLaunchKernel 0, zeCommandListAppendLaunchCooperativeKernel 0,
        zeCommandListAppendLaunchKernelIndirect 0,
        zeCommandListAppendLaunchMultipleKernelsIndirect 0,
        zeCommandListAppendImageCopyToMemoryExt 3, zeCommandListAppendImageCopyFromMemoryExt 3,
        zeCommandListHostSynchronize 6, zeCommandListGetDeviceHandle 9,
        zeCommandListGetContextHandle 9, zeCommandListGetOrdinal 9,
        zeCommandListImmediateGetIndex 9, zeCommandListIsImmediate 9,
        zeCommandListAppendSignalExternalSemaphoreExt 12,
        zeCommandListAppendWaitExternalSemaphoreExt 12,
        zeCommandListAppendLaunchKernelWithParameters 14,
        zeCommandListAppendLaunchKernelWithArguments 14,
        zeCommandListAppendMemoryCopyWithParameters 16,
        zeCommandListAppendMemoryFillWithParameters 16,
        zeCommandListImmediateAppendCommandListsWithParameters 16, zeCommandListGetFlags 17,
        zeCommandListImmediateGetFlags 17, zeCommandListImmediateGetMode 17,
        zeCommandListImmediateGetPriority 17, zeCommandListBeginGraphCaptureExt 17,
        zeCommandListBeginCaptureIntoGraphExt 17, zeCommandListIsGraphCaptureEnabledExt 17,
        zeCommandListEndGraphCaptureExt 17, zeCommandListGetGraphExt 17,
        zeCommandListAppendGraphExt 17, zeCommandListAppendHostFunction 17,
        zeCommandListAppendSignalEventWithParameters 18,
        zeCommandListAppendWaitOnEventsWithParameters 18,
    ];
    zeGetCommandListExpProcAddrTable => [
        zeCommandListCreateCloneExp 9, zeCommandListImmediateAppendCommandListsExp 9,
        zeCommandListGetNextCommandIdExp 9, zeCommandListUpdateMutableCommandsExp 9,
        zeCommandListUpdateMutableCommandSignalEventExp 9,
        zeCommandListUpdateMutableCommandWaitEventsExp 9,
        zeCommandListGetNextCommandIdWithKernelsExp 10,
        zeCommandListUpdateMutableCommandKernelsExp 10, zeCommandListIsMutableExp 17,
    ];
    zeGetGraphProcAddrTable => [
        zeGraphCreateExt 17, zeGraphGetPrimaryCommandListExt 17,
        zeGraphSetDestructionCallbackExt 17, zeGraphInstantiateExt 17, zeGraphIsEmptyExt 17,
        zeGraphDumpContentsExt 17, zeGraphDestroyExt 17,
    ];
    zeGetExecutableGraphProcAddrTable => [
        zeExecutableGraphGetSourceGraphExt 17, zeExecutableGraphDestroyExt 17,
    ];
    zeGetFenceProcAddrTable => [
        zeFenceCreate 0, zeFenceDestroy 0, zeFenceHostSynchronize 0, zeFenceQueryStatus 0,
        zeFenceReset 0,
    ];
    zeGetEventPoolProcAddrTable => [
        zeEventPoolCreate 0, zeEventPoolDestroy 0, zeEventPoolGetIpcHandle 0,
        zeEventPoolOpenIpcHandle 0, zeEventPoolCloseIpcHandle 0, zeEventPoolPutIpcHandle 6,
        zeEventPoolGetContextHandle 9, zeEventPoolGetFlags 9,
    ];
    zeGetEventProcAddrTable => [
        zeEventCreate 0, zeEventDestroy 0, zeEventHostSignal 0, zeEventHostSynchronize 0,
        zeEventQueryStatus 0, zeEventHostReset 0, zeEventQueryKernelTimestamp 0,
        zeEventQueryKernelTimestampsExt 6, zeEventGetEventPool 9, zeEventGetSignalScope 9,
        zeEventGetWaitScope 9, zeEventCounterBasedCreate 15, zeEventCounterBasedGetIpcHandle 15,
        zeEventCounterBasedOpenIpcHandle 15, zeEventCounterBasedCloseIpcHandle 15,
        zeEventCounterBasedGetDeviceAddress 15, zeEventGetCounterBasedFlags 17,
    ];
    zeGetEventExpProcAddrTable => [zeEventQueryTimestampsExp 2];
    zeGetImageProcAddrTable => [
        zeImageGetProperties 0, zeImageCreate 0, zeImageDestroy 0,
        zeImageGetAllocPropertiesExt 3, zeImageViewCreateExt 5,
    ];
    zeGetImageExpProcAddrTable => [
        zeImageGetMemoryPropertiesExp 2, zeImageViewCreateExp 2, zeImageGetDeviceOffsetExp 9,
    ];
    zeGetModuleProcAddrTable => [
        zeModuleCreate 0, zeModuleDestroy 0, zeModuleDynamicLink 0, zeModuleGetNativeBinary 0,
        zeModuleGetGlobalPointer 0, zeModuleGetKernelNames 0, zeModuleGetProperties 0,
        zeModuleGetFunctionPointer 0, zeModuleInspectLinkageExt 3, zeModuleGetDeviceHandle 18,
    ];
    zeGetModuleBuildLogProcAddrTable => [zeModuleBuildLogDestroy 0, zeModuleBuildLogGetString 0];
    zeGetKernelProcAddrTable => [
        zeKernelCreate 0, zeKernelDestroy 0, zeKernelSetCacheConfig 0, zeKernelSetGroupSize 0,
        zeKernelSuggestGroupSize 0, zeKernelSuggestMaxCooperativeGroupCount 0,
        zeKernelSetArgumentValue 0, zeKernelSetIndirectAccess 0, zeKernelGetIndirectAccess 0,
        zeKernelGetSourceAttributes 0, zeKernelGetProperties 0, zeKernelGetName 0,
        zeKernelGetModuleHandle 18,
    ];
    zeGetKernelExpProcAddrTable => [
        zeKernelSetGlobalOffsetExp 1, zeKernelSchedulingHintExp 2, zeKernelGetBinaryExp 11,
        zeKernelGetAllocationPropertiesExp 14,
    ];
    zeGetSamplerProcAddrTable => [zeSamplerCreate 0, zeSamplerDestroy 0];
    zeGetPhysicalMemProcAddrTable => [
        zePhysicalMemCreate 0, zePhysicalMemDestroy 0, zePhysicalMemGetProperties 15,
    ];
    zeGetMemProcAddrTable => [
        zeMemAllocShared 0, zeMemAllocDevice 0, zeMemAllocHost 0, zeMemFree 0,
        zeMemGetAllocProperties 0, zeMemGetAddressRange 0, zeMemGetIpcHandle 0,
        zeMemOpenIpcHandle 0, zeMemCloseIpcHandle 0, zeMemFreeExt 3, zeMemPutIpcHandle 6,
        zeMemGetPitchFor2dImage 9, zeMemGetIpcHandleWithProperties 15,
    ];
    zeGetMemExpProcAddrTable => [
        zeMemGetIpcHandleFromFileDescriptorExp 6, zeMemGetFileDescriptorFromIpcHandleExp 6,
        zeMemSetAtomicAccessAttributeExp 7, zeMemGetAtomicAccessAttributeExp 7,
    ];
    zeGetVirtualMemProcAddrTable => [
        zeVirtualMemReserve 0, zeVirtualMemFree 0, zeVirtualMemQueryPageSize 0,
        zeVirtualMemMap 0, zeVirtualMemUnmap 0, zeVirtualMemSetAccessAttribute 0,
        zeVirtualMemGetAccessAttribute 0,
    ];
    zeGetFabricVertexExpProcAddrTable => [
        zeFabricVertexGetExp 4, zeFabricVertexGetSubVerticesExp 4,
        zeFabricVertexGetPropertiesExp 4, zeFabricVertexGetDeviceExp 4,
    ];
    zeGetFabricEdgeExpProcAddrTable => [
        zeFabricEdgeGetExp 4, zeFabricEdgeGetVerticesExp 4, zeFabricEdgeGetPropertiesExp 4,
    ];
    zeGetRTASParallelOperationExpProcAddrTable => [
        zeRTASParallelOperationCreateExp 7, zeRTASParallelOperationGetPropertiesExp 7,
        zeRTASParallelOperationJoinExp 7, zeRTASParallelOperationDestroyExp 7,
    ];
    zeGetRTASBuilderExpProcAddrTable => [
        zeRTASBuilderCreateExp 7, zeRTASBuilderGetBuildPropertiesExp 7, zeRTASBuilderBuildExp 7,
        zeRTASBuilderDestroyExp 7,
    ];
    zeGetRTASBuilderProcAddrTable => [
        zeRTASBuilderCreateExt 13, zeRTASBuilderGetBuildPropertiesExt 13,
        zeRTASBuilderBuildExt 13, zeRTASBuilderCommandListAppendCopyExt 13,
        zeRTASBuilderDestroyExt 13,
    ];
    zeGetRTASParallelOperationProcAddrTable => [
        zeRTASParallelOperationCreateExt 13, zeRTASParallelOperationGetPropertiesExt 13,
        zeRTASParallelOperationJoinExt 13, zeRTASParallelOperationDestroyExt 13,
    ];
}

/// The address of implemented function `name` (`zeDriverGetExtensionFunctionAddress`), or
/// `None` for a name this driver does not implement.
pub fn implemented_function(name: &str) -> Option<ze_pfn_t> {
    if UNSUPPORTED.contains(&name) {
        return None;
    }
    all_tables()
        .into_iter()
        .flat_map(|(_, s)| s)
        .find(|(n, _, _)| *n == name)
        .map(|(_, _, f)| f)
}

/// `zeDriverGetExtensionFunctionAddress`: the address of implemented function `name`, looked
/// up in the tables above (an extension function is in a table like any other).
///
/// Errors: `ZE_RESULT_ERROR_INVALID_NULL_POINTER` for a null `name` or `ppFunctionAddress`;
/// `ZE_RESULT_ERROR_INVALID_ARGUMENT` for a name this driver does not implement.
#[no_mangle]
pub unsafe extern "C" fn zeDriverGetExtensionFunctionAddress(
    hDriver: *mut c_void,
    name: *const std::ffi::c_char,
    ppFunctionAddress: *mut *mut c_void,
) -> ze_result_t {
    use crate::rt::{driver, fail, guard};
    guard(|| {
        driver(hDriver)?;
        let null = |what: &str| {
            fail(
                ZE_RESULT_ERROR_INVALID_NULL_POINTER,
                format!("{what} is null"),
            )
        };
        if name.is_null() {
            return Err(null("name"));
        }
        let pp = ppFunctionAddress
            .as_mut()
            .ok_or_else(|| null("ppFunctionAddress"))?;
        let n = std::ffi::CStr::from_ptr(name).to_string_lossy();
        match implemented_function(&n) {
            Some(f) => {
                *pp = f as *mut c_void;
                Ok(ZE_RESULT_SUCCESS)
            }
            None => Err(fail(
                ZE_RESULT_ERROR_INVALID_ARGUMENT,
                format!("{n:?} is not a function this driver implements"),
            )),
        }
    })
}

/// Names of every implemented function, in table order.
pub fn implemented_names() -> Vec<&'static str> {
    all_tables()
        .into_iter()
        .flat_map(|(_, s)| s)
        .map(|(n, _, _)| n)
        .filter(|n| !UNSUPPORTED.contains(n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_appear_in_version_order_so_each_version_is_a_prefix() {
        for (t, slots) in all_tables() {
            let mut last = 0;
            for (n, v, f) in slots {
                assert!(v >= last, "{t}: {n} (1.{v}) after a 1.{last} slot");
                assert!(v <= NEWEST_MINOR);
                assert!(!f.is_null());
                last = v;
            }
        }
    }

    #[test]
    fn every_stub_fills_a_slot_and_no_function_is_listed_twice() {
        let mut seen = std::collections::HashSet::new();
        for (_, slots) in all_tables() {
            for (n, _, _) in slots {
                assert!(seen.insert(n), "{n} is in two slots");
            }
        }
        for s in UNSUPPORTED {
            assert!(seen.contains(s), "stub {s} fills no slot");
        }
    }

    #[test]
    fn version_1_4_mem_table_is_ten_slots_and_nothing_past_it_is_written() {
        let mut t = [std::ptr::null::<c_void>(); 14];
        let sentinel = 0x5a5a as ze_pfn_t;
        t[10..].fill(sentinel);
        let r = unsafe { zeGetMemProcAddrTable(ze_make_version(1, 4), t.as_mut_ptr().cast()) };
        assert_eq!(r, ZE_RESULT_SUCCESS);
        assert!(t[..10].iter().all(|p| !p.is_null()));
        assert!(t[10..].iter().all(|&p| p == sentinel));
        let r = unsafe { zeGetMemProcAddrTable(ze_make_version(2, 0), t.as_mut_ptr().cast()) };
        assert_eq!(r, ZE_RESULT_ERROR_UNSUPPORTED_VERSION);
        let r = unsafe { zeGetMemProcAddrTable(ze_make_version(1, 4), std::ptr::null_mut()) };
        assert_eq!(r, ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    }
}

/// The slot of every sysman (`zes`) and tools (`zet`) table: this driver implements neither.
extern "C" fn tools_unsupported() -> ze_result_t {
    unsupported("this sysman / tools (zes / zet) function")
}

/// Fills a `zes` / `zet` table with [`tools_unsupported`]: the slot counts of the 1.4 header
/// (installed) and of the 1.12 header (Debian trixie) are known; a version between them gets
/// the 1.4 count and a newer one the 1.12 count (the slots past it, if any, stay as the caller
/// set them: loaders zero their tables and answer a null slot themselves).
unsafe fn fill_tools(version: u32, table: *mut ze_pfn_t, n14: usize, n112: usize) -> ze_result_t {
    let f = tools_unsupported as ze_pfn_t;
    let slots: Vec<(u32, ze_pfn_t)> = (0..n112.max(n14))
        .map(|i| (if i < n14 { 0 } else { 12 }, f))
        .collect();
    fill(version, table, &slots)
}

macro_rules! tool_tables {
    ($( $getter:ident $n14:literal $n112:literal ;)*) => {
        $(
            /// A sysman / tools table: every slot answers `ZE_RESULT_ERROR_UNSUPPORTED_FEATURE`.
            #[no_mangle]
            pub unsafe extern "C" fn $getter(version: u32, pDdiTable: *mut c_void) -> ze_result_t {
                fill_tools(version, pDdiTable as *mut ze_pfn_t, $n14, $n112)
            }
        )*
        /// `(getter, slots at 1.4, slots at 1.12)` of every sysman / tools table.
        pub const TOOL_TABLES: &[(&str, usize, usize)] = &[$((stringify!($getter), $n14, $n112)),*];
    };
}

tool_tables! {
    zetGetMetricProgrammableExpProcAddrTable 0 4;
    zetGetMetricTracerExpProcAddrTable 0 6;
    zetGetMetricDecoderExpProcAddrTable 0 3;
    zetGetDeviceProcAddrTable 1 1;
    zetGetDeviceExpProcAddrTable 0 2;
    zetGetContextProcAddrTable 1 1;
    zetGetCommandListProcAddrTable 4 4;
    zetGetModuleProcAddrTable 1 1;
    zetGetKernelProcAddrTable 1 1;
    zetGetMetricProcAddrTable 2 2;
    zetGetMetricExpProcAddrTable 0 3;
    zetGetMetricGroupProcAddrTable 3 3;
    zetGetMetricGroupExpProcAddrTable 1 9;
    zetGetMetricStreamerProcAddrTable 3 3;
    zetGetMetricQueryPoolProcAddrTable 2 2;
    zetGetMetricQueryProcAddrTable 4 4;
    zetGetTracerExpProcAddrTable 5 5;
    zetGetDebugProcAddrTable 11 12;
    zesGetGlobalProcAddrTable 0 1;
    zesGetDeviceProcAddrTable 29 37;
    zesGetDeviceExpProcAddrTable 0 3;
    zesGetDriverProcAddrTable 2 5;
    zesGetDriverExpProcAddrTable 0 1;
    zesGetOverclockProcAddrTable 0 9;
    zesGetSchedulerProcAddrTable 8 8;
    zesGetPerformanceFactorProcAddrTable 3 3;
    zesGetPowerProcAddrTable 8 8;
    zesGetFrequencyProcAddrTable 17 17;
    zesGetEngineProcAddrTable 2 3;
    zesGetStandbyProcAddrTable 3 3;
    zesGetFirmwareProcAddrTable 2 4;
    zesGetFirmwareExpProcAddrTable 0 2;
    zesGetMemoryProcAddrTable 3 3;
    zesGetFabricPortProcAddrTable 6 8;
    zesGetTemperatureProcAddrTable 4 4;
    zesGetPsuProcAddrTable 2 2;
    zesGetFanProcAddrTable 6 6;
    zesGetLedProcAddrTable 4 4;
    zesGetRasProcAddrTable 4 4;
    zesGetRasExpProcAddrTable 0 2;
    zesGetDiagnosticsProcAddrTable 3 3;
    zesGetVFManagementExpProcAddrTable 0 9;
}
