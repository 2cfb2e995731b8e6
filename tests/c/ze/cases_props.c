/* Case 2 of shared/cases/level-zero.md: zeDeviceGetProperties with a chained
 * ze_device_readonly_memory_ext_properties_t (stype 0x10015) -> readonlyCapability ENFORCED (2),
 * and it is: a queued copy into a READONLY page of a mapping is refused, a copy out of it works.
 * A chained structure the driver does not answer is left as it was.
 *
 * The other chained device properties a memory program reads, where hetmem can answer them:
 * zeDeviceGetMemoryProperties with ze_device_memory_ext_properties_t (1.4) -> physicalSize =
 * totalSize (the device's capacity), design bandwidths 0 with unit UNKNOWN, the memory type left
 * as the program wrote it (not known). Structures it cannot answer truthfully (the LUID, ...)
 * are left untouched wherever they are chained. */
#include "common.h"
#include "ze_hetmem.h"

int main(void) {
    env_t e = setup();
    for (uint32_t d = 0; d < e.ndev; d++) {
        ze_device_readonly_memory_ext_properties_t ro;
        memset(&ro, 0xee, sizeof ro);
        ro.stype = ZE_HETMEM_STYPE_DEVICE_READONLY_MEMORY_EXT_PROPERTIES;
        ro.pNext = NULL;
        /* a structure of no stype this driver answers, chained after it: untouched */
        struct { ze_structure_type_t stype; void *pNext; uint64_t word; } other;
        other.stype = (ze_structure_type_t)0x7ffffff0;
        other.pNext = NULL;
        other.word = 0x1234;
        ro.pNext = &other;
        ze_device_properties_t p = {ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES, &ro};
        OK(zeDeviceGetProperties(e.dev[d], &p));
        EXPECT(ro.readonlyCapability == ZE_HETMEM_DEVICE_READONLY_MEMORY_CAPABILITY_ENFORCED); /* case 2 */
        EXPECT(ro.pNext == &other && other.word == 0x1234 && other.pNext == NULL);
    }
    for (uint32_t d = 0; d < e.ndev; d++) {
        /* the memory extension: physicalSize and the bandwidth unit answered, type untouched */
        ze_device_memory_ext_properties_t mx;
        memset(&mx, 0xee, sizeof mx);
        mx.stype = ZE_STRUCTURE_TYPE_DEVICE_MEMORY_EXT_PROPERTIES;
        mx.type = (ze_device_memory_ext_type_t)0x55;
        /* an unanswerable structure (the LUID extension, 1.4) after it: untouched */
        ze_device_luid_ext_properties_t luid;
        memset(&luid, 0xab, sizeof luid);
        luid.stype = ZE_STRUCTURE_TYPE_DEVICE_LUID_EXT_PROPERTIES;
        luid.pNext = NULL;
        mx.pNext = &luid;
        ze_device_memory_properties_t mp;
        memset(&mp, 0, sizeof mp);
        mp.stype = ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES;
        mp.pNext = &mx;
        uint32_t n = 1;
        OK(zeDeviceGetMemoryProperties(e.dev[d], &n, &mp));
        EXPECT(n == 1);
        EXPECT(mp.totalSize > 0 && mx.physicalSize == mp.totalSize);
        EXPECT(mx.readBandwidth == 0 && mx.writeBandwidth == 0);
        EXPECT(mx.bandwidthUnit == ZE_BANDWIDTH_UNIT_UNKNOWN);
        EXPECT((uint32_t)mx.type == 0x55);
        EXPECT(mx.pNext == &luid && luid.pNext == NULL && luid.luid.id[0] == 0xab &&
               luid.nodeMask == 0xabababab);
        /* the LUID chained on the device properties: untouched too */
        ze_device_properties_t p = {ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES, &luid};
        OK(zeDeviceGetProperties(e.dev[d], &p));
        EXPECT(luid.pNext == NULL && luid.luid.id[7] == 0xab && luid.nodeMask == 0xabababab);
    }
    /* ENFORCED holds: device writes into READONLY pages are refused */
    size_t B = 0;
    MUST(zeVirtualMemQueryPageSize(e.ctx, e.dev[0], 1, &B));
    void *r = NULL;
    MUST(zeVirtualMemReserve(e.ctx, (void *)(uintptr_t)(100ull << 30), B, &r));
    ze_physical_mem_desc_t pd = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, NULL, 0, B};
    ze_physical_mem_handle_t ph = NULL;
    MUST(zePhysicalMemCreate(e.ctx, e.dev[0], &pd, &ph));
    MUST(zeVirtualMemMap(e.ctx, r, B, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    ze_command_queue_desc_t qd = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0,
                                  ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS, ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
    ze_command_list_handle_t list = NULL;
    MUST(zeCommandListCreateImmediate(e.ctx, e.dev[0], &qd, &list));
    void *hb = NULL;
    MUST(zeMemAllocHost(e.ctx, &HOST_DESC, 64, 64, &hb));
    unsigned char pat = 0x3c;
    OK(zeCommandListAppendMemoryFill(list, r, &pat, 1, 64, NULL, 0, NULL));
    OK(zeVirtualMemSetAccessAttribute(e.ctx, r, B, ZE_MEMORY_ACCESS_ATTRIBUTE_READONLY));
    CHECK(zeCommandListAppendMemoryCopy(list, r, hb, 64, NULL, 0, NULL), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    CHECK(zeCommandListAppendMemoryFill(list, r, &pat, 1, 64, NULL, 0, NULL), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    memset(hb, 0, 64);
    OK(zeCommandListAppendMemoryCopy(list, hb, r, 64, NULL, 0, NULL));
    EXPECT(((unsigned char *)hb)[0] == 0x3c && ((unsigned char *)hb)[63] == 0x3c);
    OK(zeVirtualMemUnmap(e.ctx, r, B));
    OK(zePhysicalMemDestroy(e.ctx, ph));
    OK(zeVirtualMemFree(e.ctx, r, B));
    zeMemFree(e.ctx, hb);
    zeCommandListDestroy(list);
    zeContextDestroy(e.ctx);
    return finish("cases_props");
}
