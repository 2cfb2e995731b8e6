/* The Rust-side C types and constants of hetmem-ze against the installed ze_api.h (and
 * ze_hetmem.h for what it lacks): every sizeof, offsetof and value in the library's layout
 * table is compared with the compiler's answer, and every entry must be checked. Then every DDI
 * table of the installed ze_ddi.h: the getter fills each slot, at the installed header's API
 * version, with the function of that name, and writes nothing past the table. */
#include "common.h"
#include "ze_hetmem.h"
#include <level_zero/ze_ddi.h>
#include <stddef.h>

static const hetmem_layout_entry_t *tab;
static uint32_t ntab, checked;

static void check(const char *name, uint64_t value) {
    for (uint32_t i = 0; i < ntab; i++) {
        if (!strcmp(tab[i].name, name)) {
            checked++;
            if (tab[i].value != value) {
                fprintf(stderr, "FAIL layout %s: Rust says %llu, the header %llu\n", name,
                        (unsigned long long)tab[i].value, (unsigned long long)value);
                failures++;
            } else {
                passes++;
            }
            return;
        }
    }
    fprintf(stderr, "FAIL layout %s: not in the library's table\n", name);
    failures++;
}
#define SZ(T) check("sizeof(" #T ")", sizeof(T))
#define OFF(T, f) check("offsetof(" #T "," #f ")", offsetof(T, f))
#define VAL(N) check(#N, (uint64_t)(N))
#define VAL_AS(N, E) check(#N, (uint64_t)(E))

int main(void) {
    tab = hetmemZeLayout(&ntab);
    EXPECT(ntab > 100);

    SZ(ze_driver_properties_t); OFF(ze_driver_properties_t, stype); OFF(ze_driver_properties_t, pNext);
    OFF(ze_driver_properties_t, uuid); OFF(ze_driver_properties_t, driverVersion);
    SZ(ze_driver_ipc_properties_t); OFF(ze_driver_ipc_properties_t, flags);
    SZ(ze_driver_extension_properties_t); OFF(ze_driver_extension_properties_t, name);
    OFF(ze_driver_extension_properties_t, version);
    SZ(ze_driver_memory_free_ext_properties_t); OFF(ze_driver_memory_free_ext_properties_t, freePolicies);
    SZ(ze_device_properties_t);
    OFF(ze_device_properties_t, type); OFF(ze_device_properties_t, vendorId); OFF(ze_device_properties_t, deviceId);
    OFF(ze_device_properties_t, flags); OFF(ze_device_properties_t, subdeviceId);
    OFF(ze_device_properties_t, coreClockRate); OFF(ze_device_properties_t, maxMemAllocSize);
    OFF(ze_device_properties_t, maxHardwareContexts); OFF(ze_device_properties_t, maxCommandQueuePriority);
    OFF(ze_device_properties_t, numThreadsPerEU); OFF(ze_device_properties_t, physicalEUSimdWidth);
    OFF(ze_device_properties_t, numEUsPerSubslice); OFF(ze_device_properties_t, numSubslicesPerSlice);
    OFF(ze_device_properties_t, numSlices); OFF(ze_device_properties_t, timerResolution);
    OFF(ze_device_properties_t, timestampValidBits); OFF(ze_device_properties_t, kernelTimestampValidBits);
    OFF(ze_device_properties_t, uuid); OFF(ze_device_properties_t, name);
    SZ(ze_device_compute_properties_t); OFF(ze_device_compute_properties_t, maxTotalGroupSize);
    OFF(ze_device_compute_properties_t, maxSharedLocalMemory); OFF(ze_device_compute_properties_t, numSubGroupSizes);
    OFF(ze_device_compute_properties_t, subGroupSizes);
    SZ(ze_device_module_properties_t); OFF(ze_device_module_properties_t, spirvVersionSupported);
    OFF(ze_device_module_properties_t, maxArgumentsSize); OFF(ze_device_module_properties_t, printfBufferSize);
    OFF(ze_device_module_properties_t, nativeKernelSupported);
    SZ(ze_command_queue_group_properties_t); OFF(ze_command_queue_group_properties_t, flags);
    OFF(ze_command_queue_group_properties_t, maxMemoryFillPatternSize); OFF(ze_command_queue_group_properties_t, numQueues);
    SZ(ze_device_memory_properties_t); OFF(ze_device_memory_properties_t, flags);
    OFF(ze_device_memory_properties_t, maxClockRate); OFF(ze_device_memory_properties_t, maxBusWidth);
    OFF(ze_device_memory_properties_t, totalSize); OFF(ze_device_memory_properties_t, name);
    SZ(ze_device_memory_access_properties_t); OFF(ze_device_memory_access_properties_t, hostAllocCapabilities);
    OFF(ze_device_memory_access_properties_t, deviceAllocCapabilities);
    OFF(ze_device_memory_access_properties_t, sharedSingleDeviceAllocCapabilities);
    OFF(ze_device_memory_access_properties_t, sharedCrossDeviceAllocCapabilities);
    OFF(ze_device_memory_access_properties_t, sharedSystemAllocCapabilities);
    SZ(ze_device_cache_properties_t); OFF(ze_device_cache_properties_t, flags); OFF(ze_device_cache_properties_t, cacheSize);
    SZ(ze_device_image_properties_t); OFF(ze_device_image_properties_t, maxImageDims1D);
    OFF(ze_device_image_properties_t, maxImageBufferSize); OFF(ze_device_image_properties_t, maxWriteImageArgs);
    SZ(ze_device_external_memory_properties_t); OFF(ze_device_external_memory_properties_t, memoryAllocationImportTypes);
    OFF(ze_device_external_memory_properties_t, imageExportTypes);
    SZ(ze_device_p2p_properties_t); OFF(ze_device_p2p_properties_t, flags);
    SZ(ze_context_desc_t); OFF(ze_context_desc_t, stype); OFF(ze_context_desc_t, pNext); OFF(ze_context_desc_t, flags);
    SZ(ze_command_queue_desc_t); OFF(ze_command_queue_desc_t, ordinal); OFF(ze_command_queue_desc_t, index);
    OFF(ze_command_queue_desc_t, flags); OFF(ze_command_queue_desc_t, mode); OFF(ze_command_queue_desc_t, priority);
    SZ(ze_command_list_desc_t); OFF(ze_command_list_desc_t, commandQueueGroupOrdinal); OFF(ze_command_list_desc_t, flags);
    SZ(ze_event_pool_desc_t); OFF(ze_event_pool_desc_t, flags); OFF(ze_event_pool_desc_t, count);
    SZ(ze_event_desc_t); OFF(ze_event_desc_t, index); OFF(ze_event_desc_t, signal); OFF(ze_event_desc_t, wait);
    SZ(ze_fence_desc_t); OFF(ze_fence_desc_t, flags);
    SZ(ze_device_mem_alloc_desc_t); OFF(ze_device_mem_alloc_desc_t, flags); OFF(ze_device_mem_alloc_desc_t, ordinal);
    SZ(ze_host_mem_alloc_desc_t); OFF(ze_host_mem_alloc_desc_t, flags);
    SZ(ze_memory_allocation_properties_t); OFF(ze_memory_allocation_properties_t, type);
    OFF(ze_memory_allocation_properties_t, id); OFF(ze_memory_allocation_properties_t, pageSize);
    SZ(ze_ipc_mem_handle_t); OFF(ze_ipc_mem_handle_t, data);
    SZ(ze_physical_mem_desc_t); OFF(ze_physical_mem_desc_t, flags); OFF(ze_physical_mem_desc_t, size);
    SZ(ze_memory_free_ext_desc_t); OFF(ze_memory_free_ext_desc_t, freePolicy);
    SZ(ze_relaxed_allocation_limits_exp_desc_t); OFF(ze_relaxed_allocation_limits_exp_desc_t, flags);
    SZ(ze_memory_compression_hints_ext_desc_t); OFF(ze_memory_compression_hints_ext_desc_t, flags);
    /* newer than the installed header: ze_hetmem.h's declarations */
    SZ(ze_relaxed_allocation_limits_ext_desc_t); OFF(ze_relaxed_allocation_limits_ext_desc_t, flags);
    SZ(ze_external_memmap_sysmem_ext_desc_t); OFF(ze_external_memmap_sysmem_ext_desc_t, pSystemMemory);
    OFF(ze_external_memmap_sysmem_ext_desc_t, size);
    SZ(ze_ipc_mem_handle_type_ext_desc_t); OFF(ze_ipc_mem_handle_type_ext_desc_t, typeFlags);
    SZ(ze_ipc_phys_mem_handle_range_ext_desc_t); OFF(ze_ipc_phys_mem_handle_range_ext_desc_t, size);
    SZ(ze_physical_mem_properties_t); OFF(ze_physical_mem_properties_t, id); OFF(ze_physical_mem_properties_t, size);
    SZ(ze_init_driver_type_desc_t); OFF(ze_init_driver_type_desc_t, flags);
    /* API 1.17 (virtualMemReadOnlyProperties.yml of the spec sources: the properties base,
     * then one enum) */
    SZ(ze_device_readonly_memory_ext_properties_t); OFF(ze_device_readonly_memory_ext_properties_t, stype);
    OFF(ze_device_readonly_memory_ext_properties_t, pNext);
    OFF(ze_device_readonly_memory_ext_properties_t, readonlyCapability);
    /* in the installed header (ZE_extension_device_memory_properties, 1.4) */
    SZ(ze_device_memory_ext_properties_t); OFF(ze_device_memory_ext_properties_t, stype);
    OFF(ze_device_memory_ext_properties_t, pNext); OFF(ze_device_memory_ext_properties_t, type);
    OFF(ze_device_memory_ext_properties_t, physicalSize); OFF(ze_device_memory_ext_properties_t, readBandwidth);
    OFF(ze_device_memory_ext_properties_t, writeBandwidth); OFF(ze_device_memory_ext_properties_t, bandwidthUnit);

    VAL(ZE_RESULT_SUCCESS); VAL(ZE_RESULT_NOT_READY); VAL(ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY);
    VAL(ZE_RESULT_ERROR_UNINITIALIZED); VAL(ZE_RESULT_ERROR_UNSUPPORTED_VERSION);
    VAL(ZE_RESULT_ERROR_UNSUPPORTED_FEATURE); VAL(ZE_RESULT_ERROR_INVALID_ARGUMENT);
    VAL(ZE_RESULT_ERROR_INVALID_NULL_HANDLE); VAL(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    VAL(ZE_RESULT_ERROR_INVALID_SIZE); VAL(ZE_RESULT_ERROR_INVALID_ENUMERATION);
    VAL(ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION); VAL(ZE_RESULT_ERROR_UNKNOWN);
    VAL(ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES); VAL(ZE_STRUCTURE_TYPE_DRIVER_IPC_PROPERTIES);
    VAL(ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES); VAL(ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES);
    VAL(ZE_STRUCTURE_TYPE_CONTEXT_DESC);
    VAL(ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC); VAL(ZE_STRUCTURE_TYPE_COMMAND_LIST_DESC);
    VAL(ZE_STRUCTURE_TYPE_EVENT_POOL_DESC); VAL(ZE_STRUCTURE_TYPE_EVENT_DESC); VAL(ZE_STRUCTURE_TYPE_FENCE_DESC);
    VAL(ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC); VAL(ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC);
    VAL(ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES); VAL(ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC);
    VAL(ZE_STRUCTURE_TYPE_DRIVER_MEMORY_FREE_EXT_PROPERTIES); VAL(ZE_STRUCTURE_TYPE_MEMORY_FREE_EXT_DESC);
    VAL(ZE_STRUCTURE_TYPE_MEMORY_COMPRESSION_HINTS_EXT_DESC); VAL(ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC);
    VAL_AS(ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXT_DESC, ZE_HETMEM_STYPE_RELAXED_ALLOCATION_LIMITS_EXT_DESC);
    VAL_AS(ZE_STRUCTURE_TYPE_EXTERNAL_MEMMAP_SYSMEM_EXT_DESC, ZE_HETMEM_STYPE_EXTERNAL_MEMMAP_SYSMEM_EXT_DESC);
    VAL_AS(ZE_STRUCTURE_TYPE_IPC_MEM_HANDLE_TYPE_EXT_DESC, ZE_HETMEM_STYPE_IPC_MEM_HANDLE_TYPE_EXT_DESC);
    VAL_AS(ZE_STRUCTURE_TYPE_PHYSICAL_MEM_PROPERTIES, ZE_HETMEM_STYPE_PHYSICAL_MEM_PROPERTIES);
    VAL_AS(ZE_STRUCTURE_TYPE_IPC_PHYS_MEM_HANDLE_RANGE_EXT_DESC, ZE_HETMEM_STYPE_IPC_PHYS_MEM_HANDLE_RANGE_EXT_DESC);
    VAL_AS(ZE_STRUCTURE_TYPE_INIT_DRIVER_TYPE_DESC, ZE_HETMEM_STYPE_INIT_DRIVER_TYPE_DESC);
    VAL_AS(ZE_STRUCTURE_TYPE_DEVICE_READONLY_MEMORY_EXT_PROPERTIES, ZE_HETMEM_STYPE_DEVICE_READONLY_MEMORY_EXT_PROPERTIES);
    VAL_AS(ZE_DEVICE_READONLY_MEMORY_CAPABILITY_ENFORCED, ZE_HETMEM_DEVICE_READONLY_MEMORY_CAPABILITY_ENFORCED);
    VAL(ZE_STRUCTURE_TYPE_DEVICE_MEMORY_EXT_PROPERTIES); VAL(ZE_BANDWIDTH_UNIT_UNKNOWN);
    VAL(ZE_INIT_FLAG_GPU_ONLY); VAL(ZE_INIT_FLAG_VPU_ONLY); VAL(ZE_DEVICE_TYPE_GPU);
    VAL(ZE_DEVICE_PROPERTY_FLAG_INTEGRATED); VAL(ZE_DEVICE_PROPERTY_FLAG_SUBDEVICE); VAL(ZE_IPC_PROPERTY_FLAG_MEMORY);
    VAL(ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE); VAL(ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY);
    VAL(ZE_MEMORY_ACCESS_CAP_FLAG_RW); VAL(ZE_MEMORY_ACCESS_CAP_FLAG_CONCURRENT_ATOMIC);
    VAL(ZE_DEVICE_P2P_PROPERTY_FLAG_ACCESS); VAL(ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS); VAL(ZE_FENCE_FLAG_SIGNALED);
    VAL_AS(ZE_HOST_MEM_ALLOC_FLAG_MEM_READ_ONLY, ZE_HETMEM_HOST_MEM_ALLOC_FLAG_MEM_READ_ONLY);
    VAL(ZE_MAX_DEVICE_NAME); VAL(ZE_MAX_EXTENSION_NAME); VAL(ZE_MAX_IPC_HANDLE_SIZE);
    if (checked != ntab) {
        fprintf(stderr, "FAIL layout: %u of the library's %u entries were checked\n", checked, ntab);
        failures++;
    }

    /* DDI tables: each filled at the installed version, slot by slot, and nothing past it. */
#define TABLE_BEGIN(T, getter)                                                                 \
    {                                                                                          \
        struct { T t; uint64_t canary[8]; } b;                                                 \
        memset(&b, 0, sizeof b);                                                               \
        for (int k = 0; k < 8; k++) b.canary[k] = 0xa5a5a5a5a5a5a5a5ull;                       \
        CHECK(getter(ZE_API_VERSION_CURRENT, &b.t), ZE_RESULT_SUCCESS);                        \
        for (int k = 0; k < 8; k++) EXPECT(b.canary[k] == 0xa5a5a5a5a5a5a5a5ull);
#define SLOT(T, field, func)                                                                   \
        if ((void *)b.t.field != (void *)func) {                                               \
            fprintf(stderr, "FAIL %s.%s does not hold %s\n", #T, #field, #func);               \
            failures++;                                                                        \
        } else passes++;
#define TABLE_END }
#include "ddi_slots.h"

    /* A major version other than 1, and a null table. */
    ze_mem_dditable_t mt;
    memset(&mt, 0, sizeof mt);
    CHECK(zeGetMemProcAddrTable(ZE_MAKE_VERSION(2, 0), &mt), ZE_RESULT_ERROR_UNSUPPORTED_VERSION);
    EXPECT(mt.pfnAllocHost == NULL);
    CHECK(zeGetMemProcAddrTable(ZE_API_VERSION_CURRENT, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    /* An older version gets the shorter table: 1.0 has no pfnFreeExt (added in 1.3). */
    memset(&mt, 0, sizeof mt);
    OK(zeGetMemProcAddrTable(ZE_API_VERSION_1_0, &mt));
    EXPECT(mt.pfnCloseIpcHandle != NULL && mt.pfnFreeExt == NULL);
    return finish("layout");
}
