/*
 * ze_hetmem.h: what the installed Level Zero header (Debian bookworm's libze-dev 1.8.12, API
 * 1.4) lacks and libze_hetmem implements. Include it after <level_zero/ze_api.h>.
 *
 * Sources of the values:
 *   [F]  shared/spec/level-zero-facts.md (read from the published 1.17 ze_api.h / ze_ddi.h);
 *   [T]  Debian trixie's libze-dev 1.20.6 (API 1.12) ze_api.h;
 *   [S]  oneAPI Level Zero specification 1.18 pages (shared/spec/level-zero-*.txt);
 *   [P]  PROVISIONAL: not found in any published header; chosen here (see below).
 *   [I]  inferred, not confirmed in a published header;
 *   [C]  shared/cases/level-zero.md (what programs written for the 1.17 headers read);
 *   [Y]  the published spec sources (oneapi-src/level-zero-spec scripts/core/<extension>.yml: layouts and
 *        enum values, no stype numbers).
 * Types are guarded by a macro the header that declares them defines (their extension name),
 * so this header also compiles with newer ze_api.h versions. Function declarations are
 * repeated as the headers give them (a repeated identical prototype is legal C).
 */
#ifndef ZE_HETMEM_H
#define ZE_HETMEM_H

#include <level_zero/ze_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- result codes ------------------------------------------------------------------- */
#define ZE_HETMEM_RESULT_ERROR_ADDRESS_NOT_FOUND ((ze_result_t)0x78000021) /* [F] */

/* ---- structure types ---------------------------------------------------------------- */
#define ZE_HETMEM_STYPE_RELAXED_ALLOCATION_LIMITS_EXT_DESC ((ze_structure_type_t)0x10016)     /* [F] */
#define ZE_HETMEM_STYPE_EXTERNAL_MEMMAP_SYSMEM_EXT_DESC ((ze_structure_type_t)0x00020037)    /* [F] */
#define ZE_HETMEM_STYPE_IPC_MEM_HANDLE_TYPE_EXT_DESC ((ze_structure_type_t)0x0002003d)       /* [F] */
#define ZE_HETMEM_STYPE_PHYSICAL_MEM_PROPERTIES ((ze_structure_type_t)0x00020040)            /* [F] */
#define ZE_HETMEM_STYPE_INIT_DRIVER_TYPE_DESC ((ze_structure_type_t)0x00020021)              /* [T] */
#define ZE_HETMEM_STYPE_DEVICE_READONLY_MEMORY_EXT_PROPERTIES ((ze_structure_type_t)0x10015)  /* [C] */
/* [P] The v1.18 range descriptor's stype (ZE_STRUCTURE_TYPE_IPC_PHYS_MEM_HANDLE_RANGE_EXT_DESC)
 * was in no published header: 0x00020049 is the first value after the last stype of the 1.17
 * header [F], so it collides with no published stype. The one place it lives in C (Rust:
 * hetmem_ze::types::ZE_STRUCTURE_TYPE_IPC_PHYS_MEM_HANDLE_RANGE_EXT_DESC). */
#define ZE_HETMEM_STYPE_IPC_PHYS_MEM_HANDLE_RANGE_EXT_DESC ((ze_structure_type_t)0x00020049)

/* ---- flags ---------------------------------------------------------------------------- */
/* [I] named by the external-memmap extension [S]; ZE_BIT(4), the bit after
 * ZE_HOST_MEM_ALLOC_FLAG_BIAS_INITIAL_PLACEMENT (ZE_BIT(3), the last of the 1.4 header). */
#define ZE_HETMEM_HOST_MEM_ALLOC_FLAG_MEM_READ_ONLY (1u << 4)
/* The 1.4 header calls bit 0 TBD; named from 1.? on [T]. */
#define ZE_HETMEM_PHYSICAL_MEM_FLAG_ALLOCATE_ON_DEVICE (1u << 0)       /* [T] [F] */
#define ZE_HETMEM_PHYSICAL_MEM_FLAG_ALLOCATE_ON_HOST (1u << 1)         /* [T] [F] */
#define ZE_HETMEM_IPC_MEM_HANDLE_TYPE_FLAG_DEFAULT (1u << 0)            /* [F] */
#define ZE_HETMEM_IPC_MEM_HANDLE_TYPE_FLAG_FABRIC_ACCESSIBLE (1u << 1)  /* [F] */
#define ZE_HETMEM_RELAXED_ALLOCATION_LIMITS_EXT_FLAG_MAX_SIZE (1u << 0) /* [S] */
#define ZE_HETMEM_INIT_DRIVER_TYPE_FLAG_GPU (1u << 0)                   /* [T] */
#define ZE_HETMEM_INIT_DRIVER_TYPE_FLAG_NPU (1u << 1)                   /* [T] */
/* ze_device_readonly_memory_capability_t [C] [Y]: NONE (0, READONLY has no effect), HINT (1, a
 * hint; writes may succeed), ENFORCED (2). */
#define ZE_HETMEM_DEVICE_READONLY_MEMORY_CAPABILITY_NONE 0u
#define ZE_HETMEM_DEVICE_READONLY_MEMORY_CAPABILITY_HINT 1u
#define ZE_HETMEM_DEVICE_READONLY_MEMORY_CAPABILITY_ENFORCED 2u

/* ---- extension names [F] --------------------------------------------------------------- */
#define ZE_HETMEM_RELAXED_ALLOCATION_LIMITS_EXT_NAME "ZE_extension_relaxed_allocation_limits"
#define ZE_HETMEM_EXTERNAL_MEMMAP_SYSMEM_EXT_NAME "ZE_extension_external_memmap_sysmem"
#define ZE_HETMEM_IPC_MEM_HANDLE_TYPE_EXT_NAME "ZE_extension_ipc_mem_handle_type"
#define ZE_HETMEM_IPC_PHYS_MEM_HANDLE_RANGE_EXT_NAME "ZE_extension_ipc_phys_mem_handle_range"

/* ---- structures [F] [S] --------------------------------------------------------------- */
#ifndef ZE_RELAXED_ALLOCATION_LIMITS_EXT_NAME
typedef struct _ze_relaxed_allocation_limits_ext_desc_t {
    ze_structure_type_t stype;
    const void *pNext;
    uint32_t flags;
} ze_relaxed_allocation_limits_ext_desc_t;
#endif
#ifndef ZE_EXTERNAL_MEMMAP_SYSMEM_EXT_NAME
typedef struct _ze_external_memmap_sysmem_ext_desc_t {
    ze_structure_type_t stype;
    const void *pNext;
    void *pSystemMemory;
    uint64_t size;
} ze_external_memmap_sysmem_ext_desc_t;
#endif
#ifndef ZE_IPC_MEM_HANDLE_TYPE_EXT_NAME
typedef struct _ze_ipc_mem_handle_type_ext_desc_t {
    ze_structure_type_t stype;
    const void *pNext;
    uint32_t typeFlags;
} ze_ipc_mem_handle_type_ext_desc_t;
/* zePhysicalMemGetProperties' output (API 1.15, as the handle-type extension). */
typedef struct _ze_physical_mem_properties_t {
    ze_structure_type_t stype;
    void *pNext;
    uint64_t id;
    uint64_t size;
} ze_physical_mem_properties_t;
#endif
#ifndef ZE_IPC_PHYS_MEM_HANDLE_RANGE_EXT_NAME
typedef struct _ze_ipc_phys_mem_handle_range_ext_desc_t {
    ze_structure_type_t stype;
    const void *pNext;
    size_t size;
} ze_ipc_phys_mem_handle_range_ext_desc_t;
#endif
#ifndef ZE_API_VERSION_CURRENT_M /* defined from the 1.11 header on [T]; the type is 1.10 */
typedef struct _ze_init_driver_type_desc_t {
    ze_structure_type_t stype;
    const void *pNext;
    uint32_t flags;
} ze_init_driver_type_desc_t;
#endif
/* Chained on ze_device_properties_t (zeDeviceGetProperties), API 1.17 [Y]: the properties base
 * (stype, pNext) and the one enum field, readonlyCapability. Its stype's number (0x10015) is
 * [C]'s: [Y] gives no numbers, and no header of 1.14 or later was reachable here. The 1.17
 * header's extension-name macro is ZE_VIRTUAL_MEM_READONLY_PROPERTIES_EXT_NAME [Y]; a header
 * that declares the type under another guard may define ZE_HETMEM_HAVE_READONLY_MEMORY_EXT
 * before including this one. */
#if !defined(ZE_HETMEM_HAVE_READONLY_MEMORY_EXT) && !defined(ZE_VIRTUAL_MEM_READONLY_PROPERTIES_EXT_NAME)
typedef struct _ze_device_readonly_memory_ext_properties_t {
    ze_structure_type_t stype;
    void *pNext;
    uint32_t readonlyCapability;
} ze_device_readonly_memory_ext_properties_t;
#endif

/* ---- functions (prototypes as in [T] and [S]) ------------------------------------------ */
ze_result_t zeInitDrivers(uint32_t *pCount, ze_driver_handle_t *phDrivers,
                          ze_init_driver_type_desc_t *desc);
ze_result_t zeDriverGetLastErrorDescription(ze_driver_handle_t hDriver, const char **ppString);
ze_context_handle_t zeDriverGetDefaultContext(ze_driver_handle_t hDriver);
ze_result_t zeDeviceGetRootDevice(ze_device_handle_t hDevice, ze_device_handle_t *phRootDevice);
ze_result_t zeCommandListHostSynchronize(ze_command_list_handle_t hCommandList, uint64_t timeout);
ze_result_t zeMemPutIpcHandle(ze_context_handle_t hContext, ze_ipc_mem_handle_t handle);
ze_result_t zeMemGetIpcHandleWithProperties(ze_context_handle_t hContext, const void *ptr,
                                            void *pNext, ze_ipc_mem_handle_t *pIpcHandle);
ze_result_t zeMemGetIpcHandleFromFileDescriptorExp(ze_context_handle_t hContext, uint64_t handle,
                                                   ze_ipc_mem_handle_t *pIpcHandle);
ze_result_t zeMemGetFileDescriptorFromIpcHandleExp(ze_context_handle_t hContext,
                                                   ze_ipc_mem_handle_t ipcHandle, uint64_t *pHandle);
ze_result_t zePhysicalMemGetProperties(ze_context_handle_t hContext,
                                       ze_physical_mem_handle_t hPhysicalMemory,
                                       ze_physical_mem_properties_t *pMemProperties);

/* The runtime API (zer_api.h / zer_ddi.h of API 1.14, oneapi-src/level-zero include/): the
 * four functions of the loader's runtime table, and the table a loader asks a driver for with
 * zerGetGlobalProcAddrTable (slot order as in zer_ddi.h). */
ze_result_t zerGetLastErrorDescription(const char **ppString);
uint32_t zerTranslateDeviceHandleToIdentifier(ze_device_handle_t hDevice);
ze_device_handle_t zerTranslateIdentifierToDeviceHandle(uint32_t identifier);
ze_context_handle_t zerGetDefaultContext(void);
#ifndef _ZER_DDI_H
typedef ze_result_t (*zer_pfnGetLastErrorDescription_t)(const char **);
typedef uint32_t (*zer_pfnTranslateDeviceHandleToIdentifier_t)(ze_device_handle_t);
typedef ze_device_handle_t (*zer_pfnTranslateIdentifierToDeviceHandle_t)(uint32_t);
typedef ze_context_handle_t (*zer_pfnGetDefaultContext_t)(void);
typedef struct _zer_global_dditable_t {
    zer_pfnGetLastErrorDescription_t pfnGetLastErrorDescription;
    zer_pfnTranslateDeviceHandleToIdentifier_t pfnTranslateDeviceHandleToIdentifier;
    zer_pfnTranslateIdentifierToDeviceHandle_t pfnTranslateIdentifierToDeviceHandle;
    zer_pfnGetDefaultContext_t pfnGetDefaultContext;
} zer_global_dditable_t;
typedef ze_result_t (*zer_pfnGetGlobalProcAddrTable_t)(ze_api_version_t, zer_global_dditable_t *);
#endif
ze_result_t zerGetGlobalProcAddrTable(ze_api_version_t version, zer_global_dditable_t *pDdiTable);

/* Function-pointer types, for zeDriverGetExtensionFunctionAddress through an older loader. */
typedef ze_result_t (*ze_hetmem_pfnMemPutIpcHandle_t)(ze_context_handle_t, ze_ipc_mem_handle_t);
typedef ze_result_t (*ze_hetmem_pfnMemGetIpcHandleWithProperties_t)(ze_context_handle_t, const void *,
                                                                    void *, ze_ipc_mem_handle_t *);
typedef ze_result_t (*ze_hetmem_pfnPhysicalMemGetProperties_t)(ze_context_handle_t,
                                                               ze_physical_mem_handle_t,
                                                               ze_physical_mem_properties_t *);
typedef ze_result_t (*ze_hetmem_pfnMemGetIpcHandleFromFileDescriptorExp_t)(ze_context_handle_t, uint64_t,
                                                                          ze_ipc_mem_handle_t *);
typedef ze_result_t (*ze_hetmem_pfnMemGetFileDescriptorFromIpcHandleExp_t)(ze_context_handle_t,
                                                                          ze_ipc_mem_handle_t, uint64_t *);

/* hetmem's own (not Level Zero): the layout table the C layout test reads, and the number of
 * live handles (leak checks). */
typedef struct _hetmem_layout_entry_t {
    const char *name;
    uint64_t value;
} hetmem_layout_entry_t;
const hetmem_layout_entry_t *hetmemZeLayout(uint32_t *count);
uint64_t hetmemZeLiveHandles(void);

#ifdef __cplusplus
}
#endif
#endif /* ZE_HETMEM_H */
