/* Header test: every struct's size and field offsets, every enum value and every error code of
 * hetmem's acl headers, against the numbers of the published CANN headers (acl_base.h, acl_rt.h,
 * error_codes/rt_error_codes.h). The expected numbers are written here from those headers, not
 * taken from ours. */
#include <stddef.h>

#include "check.h"

#define EQ(expr, want) CHECK_EQ((long long)(expr), (long long)(want))

int main(void) {
    /* Structs (LP64). */
    EQ(sizeof(aclrtMemManagedLocation), 8);
    EQ(offsetof(aclrtMemManagedLocation, type), 0);
    EQ(offsetof(aclrtMemManagedLocation, id), 4);
    EQ(sizeof(aclrtMemLocation), 8);
    EQ(offsetof(aclrtMemLocation, id), 0);
    EQ(offsetof(aclrtMemLocation, type), 4);
    EQ(sizeof(aclrtPhysicalMemProp), 32);
    EQ(offsetof(aclrtPhysicalMemProp, handleType), 0);
    EQ(offsetof(aclrtPhysicalMemProp, allocationType), 4);
    EQ(offsetof(aclrtPhysicalMemProp, memAttr), 8);
    EQ(offsetof(aclrtPhysicalMemProp, location), 12);
    EQ(offsetof(aclrtPhysicalMemProp, reserve), 24);
    EQ(sizeof(aclrtDrvMemHandle), sizeof(void *));
    EQ(sizeof(aclrtStream), sizeof(void *));
    EQ(sizeof(aclrtEvent), sizeof(void *));
    EQ(sizeof(aclrtContext), sizeof(void *));
    EQ(sizeof(aclError), 4);

    /* Enums. */
    EQ(ACL_DEVICE, 0); EQ(ACL_HOST, 1);
    EQ(ACL_EVENT_RECORDED_STATUS_NOT_READY, 0); EQ(ACL_EVENT_RECORDED_STATUS_COMPLETE, 1);
    EQ(ACL_MEMCPY_HOST_TO_HOST, 0); EQ(ACL_MEMCPY_HOST_TO_DEVICE, 1);
    EQ(ACL_MEMCPY_DEVICE_TO_HOST, 2); EQ(ACL_MEMCPY_DEVICE_TO_DEVICE, 3);
    EQ(ACL_MEMCPY_DEFAULT, 4); EQ(ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE, 5);
    EQ(ACL_MEMCPY_INNER_DEVICE_TO_DEVICE, 6); EQ(ACL_MEMCPY_INTER_DEVICE_TO_DEVICE, 7);
    EQ(ACL_MEM_ADVISE_SET_READ_MOSTLY, 0); EQ(ACL_MEM_ADVISE_UNSET_READ_MOSTLY, 1);
    EQ(ACL_MEM_ADVISE_SET_PREFERRED_LOCATION, 2); EQ(ACL_MEM_ADVISE_UNSET_PREFERRED_LOCATION, 3);
    EQ(ACL_MEM_ADVISE_SET_ACCESSED_BY, 4); EQ(ACL_MEM_ADVISE_UNSET_ACCESSED_BY, 5);
    EQ(ACL_MEM_LOCATIONTYPE_INVALID, 0); EQ(ACL_MEM_LOCATIONTYPE_DEVICE, 1);
    EQ(ACL_MEM_LOCATIONTYPE_HOST, 2); EQ(ACL_MEM_LOCATIONTYPE_HOST_NUMA, 3);
    EQ(ACL_MEM_LOCATIONTYPE_HOST_NUMA_CURRENT, 4);
    EQ(ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, 1); EQ(ACL_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, 2);
    EQ(ACL_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, 3);
    EQ(ACL_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE, 4);
    EQ(ACL_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID, 5);
    EQ(ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, 6);
    EQ(ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE, 7);
    EQ(ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID, 8);
    EQ(ACL_MEM_MALLOC_HUGE_FIRST, 0); EQ(ACL_MEM_MALLOC_HUGE_ONLY, 1);
    EQ(ACL_MEM_MALLOC_NORMAL_ONLY, 2); EQ(ACL_MEM_MALLOC_HUGE_FIRST_P2P, 3);
    EQ(ACL_MEM_MALLOC_HUGE_ONLY_P2P, 4); EQ(ACL_MEM_MALLOC_NORMAL_ONLY_P2P, 5);
    EQ(ACL_MEM_MALLOC_HUGE1G_ONLY, 6); EQ(ACL_MEM_MALLOC_HUGE1G_ONLY_P2P, 7);
    EQ(ACL_MEM_TYPE_LOW_BAND_WIDTH, 0x100); EQ(ACL_MEM_TYPE_HIGH_BAND_WIDTH, 0x1000);
    EQ(ACL_MEM_ACCESS_USER_SPACE_READONLY, 0x100000);
    EQ(ACL_DDR_MEM, 0); EQ(ACL_HBM_MEM, 1); EQ(ACL_DDR_MEM_HUGE, 2); EQ(ACL_DDR_MEM_NORMAL, 3);
    EQ(ACL_HBM_MEM_HUGE, 4); EQ(ACL_HBM_MEM_NORMAL, 5); EQ(ACL_DDR_MEM_P2P_HUGE, 6);
    EQ(ACL_DDR_MEM_P2P_NORMAL, 7); EQ(ACL_HBM_MEM_P2P_HUGE, 8); EQ(ACL_HBM_MEM_P2P_NORMAL, 9);
    EQ(ACL_HBM_MEM_HUGE1G, 10); EQ(ACL_HBM_MEM_P2P_HUGE1G, 11); EQ(ACL_MEM_NORMAL, 12);
    EQ(ACL_MEM_HUGE, 13); EQ(ACL_MEM_HUGE1G, 14); EQ(ACL_MEM_P2P_NORMAL, 15);
    EQ(ACL_MEM_P2P_HUGE, 16); EQ(ACL_MEM_P2P_HUGE1G, 17);
    EQ(ACL_MEM_LOCATION_TYPE_HOST, 0); EQ(ACL_MEM_LOCATION_TYPE_DEVICE, 1);
    EQ(ACL_MEM_LOCATION_TYPE_UNREGISTERED, 2); EQ(ACL_MEM_LOCATION_TYPE_MANAGED, 3);
    EQ(ACL_MEM_LOCATION_TYPE_HOST_NUMA, 4);
    EQ(ACL_MEM_ALLOCATION_TYPE_PINNED, 0);
    EQ(ACL_MEM_HANDLE_TYPE_NONE, 0); EQ(ACL_MEM_HANDLE_TYPE_POSIX, 2);
    EQ(ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, 0); EQ(ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED, 1);
    EQ(ACL_RT_MEM_ALLOC_GRANULARITY_UNDEF, 0xFFFF);
    EQ(ACL_RT_THREAD_LEVEL, 0);

    /* Structs and constants of the calls beyond the core (acl_rt.h of CANN 1.17). */
    EQ(sizeof(aclrtMemAccessDesc), 24);
    EQ(offsetof(aclrtMemAccessDesc, flags), 0);
    EQ(offsetof(aclrtMemAccessDesc, location), 4);
    EQ(offsetof(aclrtMemAccessDesc, rsv), 12);
    EQ(ACL_RT_MEM_ACCESS_FLAGS_NONE, 0); EQ(ACL_RT_MEM_ACCESS_FLAGS_READ, 1);
    EQ(ACL_RT_MEM_ACCESS_FLAGS_READWRITE, 3);
    EQ(sizeof(aclrtMallocAttrValue), 8);
    EQ(sizeof(aclrtMallocAttribute), 12);
    EQ(offsetof(aclrtMallocAttribute, value), 4);
    EQ(sizeof(aclrtMallocConfig), 16);
    EQ(offsetof(aclrtMallocConfig, numAttrs), 8);
    EQ(ACL_RT_MEM_ATTR_RSV, 0); EQ(ACL_RT_MEM_ATTR_MODULE_ID, 1);
    EQ(ACL_RT_MEM_ATTR_DEVICE_ID, 2); EQ(ACL_RT_MEM_ATTR_VA_FLAG, 3);
    EQ(sizeof(aclrtMemcpyBatchAttr), 32);
    EQ(offsetof(aclrtMemcpyBatchAttr, srcLoc), 8);
    EQ(offsetof(aclrtMemcpyBatchAttr, rsv), 16);
    EQ(sizeof(aclrtPtrAttributes), 28);
    EQ(offsetof(aclrtPtrAttributes, pageSize), 8);
    EQ(offsetof(aclrtPtrAttributes, rsv), 12);
    EQ(sizeof(aclrtMemFabricHandle), 128);
    EQ(sizeof(aclrtServerPid), 24);
    EQ(offsetof(aclrtServerPid, pid), 8);
    EQ(offsetof(aclrtServerPid, num), 16);
    EQ(ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT, 1); EQ(ACL_MEM_SHARE_HANDLE_TYPE_FABRIC, 2);
    EQ(ACL_HOST_REGISTER_MAPPED, 0); EQ(ACL_HOST_REGISTER_IOMEMORY, 4);
    EQ(ACL_HOST_REGISTER_READONLY, 8);
    EQ(ACL_HOST_REG_MAPPED, 0x2); EQ(ACL_HOST_REG_IOMEMORY, 0x4); EQ(ACL_HOST_REG_READONLY, 0x8);
    EQ(ACL_HOST_REG_PINNED, 0x10000000);
    EQ(ACL_RT_HAC_TYPE_STARS, 0); EQ(ACL_RT_HAC_TYPE_CCU, 9);
    EQ(ACL_RT_HOST_MEM_MAP_NOT_SUPPORTED, 0); EQ(ACL_RT_HOST_MEM_MAP_SUPPORTED, 1);
    EQ(ACL_CALLBACK_NO_BLOCK, 0); EQ(ACL_CALLBACK_BLOCK, 1);
    EQ(ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT, 0); EQ(ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION, 1);
    EQ(ACL_RT_IPC_MEM_IMPORT_FLAG_DEFAULT, 0); EQ(ACL_RT_IPC_MEM_IMPORT_FLAG_ENABLE_PEER_ACCESS, 1);
    EQ(ACL_RT_IPC_MEM_ATTR_ACCESS_LINK, 0);
    EQ(ACL_RT_MEM_ACCESS_LINK_SIO, 0); EQ(ACL_RT_MEM_ACCESS_LINK_HCCS, 1);
    EQ(ACL_RT_MEM_ACCESS_UB_ONE_PORT_PATH, 2); EQ(ACL_RT_MEM_ACCESS_UB_MULTI_PORT_PATH, 3);
    EQ(ACL_EVENT_SYNC, 0x1); EQ(ACL_EVENT_CAPTURE_STREAM_PROGRESS, 0x2);
    EQ(ACL_EVENT_TIME_LINE, 0x8); EQ(ACL_EVENT_DEVICE_USE_ONLY, 0x10);
    EQ(ACL_EVENT_EXTERNAL, 0x20); EQ(ACL_EVENT_IPC, 0x40);
    EQ(ACL_STREAM_WAIT_VALUE_GEQ, 0); EQ(ACL_STREAM_WAIT_VALUE_EQ, 1);
    EQ(ACL_STREAM_WAIT_VALUE_AND, 2); EQ(ACL_STREAM_WAIT_VALUE_NOR, 3);

    /* Macros. */
    EQ(ACL_RT_MEM_ATTACH_GLOBAL, 1);
    EQ(ACL_RT_VMM_EXPORT_FLAG_DEFAULT, 0); EQ(ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION, 1);
    EQ(ACL_MAJOR_VERSION, 1); EQ(ACL_MINOR_VERSION, 17); EQ(ACL_PATCH_VERSION, 0);

    /* Error codes. */
    EQ(ACL_SUCCESS, 0); EQ(ACL_ERROR_NONE, 0);
    EQ(ACL_ERROR_INVALID_PARAM, 100000); EQ(ACL_ERROR_UNINITIALIZE, 100001);
    EQ(ACL_ERROR_REPEAT_INITIALIZE, 100002); EQ(ACL_ERROR_INVALID_FILE, 100003);
    EQ(ACL_RT_SUCCESS, 0);
    EQ(ACL_ERROR_RT_PARAM_INVALID, 107000); EQ(ACL_ERROR_RT_INVALID_DEVICEID, 107001);
    EQ(ACL_ERROR_RT_CONTEXT_NULL, 107002); EQ(ACL_ERROR_RT_ADDR_UNALIGNED, 107008);
    EQ(ACL_ERROR_RT_INVALID_HANDLE, 107017);
    EQ(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, 207000); EQ(ACL_ERROR_RT_MEMORY_ALLOCATION, 207001);
    EQ(ACL_ERROR_RT_INTERNAL_ERROR, 507000); EQ(ACL_ERROR_RT_DRV_INTERNAL_ERROR, 507899);

    /* The library's version call agrees with the macros. */
    int32_t ma = -1, mi = -1, pa = -1;
    OK(aclrtGetVersion(&ma, &mi, &pa));
    EQ(ma, 1); EQ(mi, 17); EQ(pa, 0);
    printf("header layout ok\n");
    return 0;
}
