/* Case 2 of shared/cases/level-zero.md: zeDeviceGetProperties with a chained
 * ze_device_readonly_memory_ext_properties_t (stype 0x10015) -> readonlyCapability ENFORCED (2),
 * and it is: a queued copy into a READONLY page of a mapping is refused, a copy out of it works.
 * A chained structure the driver does not answer is left as it was. */
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
