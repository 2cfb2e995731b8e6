/* Cases 3 and 4 of shared/cases/level-zero.md: where the reference driver's answer differs from
 * the 1.4 header's error list, hetmem answers as the reference driver (documented in the crate
 * docs of hetmem-ze and in hetmem::semantics::vmm).
 *
 * Case 3: zeVirtualMemQueryPageSize(ctx, dev, 0, &p) -> SUCCESS, p = the page size of the
 *   smallest allocation (that of size 1). The header lists UNSUPPORTED_SIZE for 0 == size, and
 *   the loader's validation layer answers that itself, before the driver: under the layer the
 *   program expects the layer's answer.
 * Case 4: zeVirtualMemUnmap of a page-aligned range inside a reservation that is already
 *   unmapped, or was never mapped -> SUCCESS, nothing changes (the mapped bytes elsewhere stay,
 *   the access attributes stay); outside every reservation -> INVALID_ARGUMENT. */
#include "common.h"

int main(void) {
    env_t e = setup();
    size_t B = 0, page = 0;
    MUST(zeVirtualMemQueryPageSize(e.ctx, e.dev[0], 1, &B));

    /* ---- case 3 ---- */
    page = 12345;
    CHECK_V(zeVirtualMemQueryPageSize(e.ctx, e.dev[0], 0, &page), ZE_RESULT_SUCCESS,
            ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    if (!is_validating()) EXPECT(page == B); /* case 3: the smallest allocation's page size */
    /* a reservation of that page size works, as programs then do */
    void *r = NULL;
    /* a start hint: the 1.4 validation layer refuses a null one */
    OK(zeVirtualMemReserve(e.ctx, (void *)(uintptr_t)(96ull << 30), 4 * B, &r));

    /* ---- case 4 ---- */
    ze_physical_mem_desc_t pd = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, NULL, 0, 2 * B};
    ze_physical_mem_handle_t ph = NULL;
    MUST(zePhysicalMemCreate(e.ctx, e.dev[0], &pd, &ph));
    char *base = (char *)r;
    /* never mapped */
    OK(zeVirtualMemUnmap(e.ctx, base, B));
    OK(zeVirtualMemUnmap(e.ctx, base, 4 * B));
    OK(zeVirtualMemMap(e.ctx, base, B, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    OK(zeVirtualMemMap(e.ctx, base + B, B, ph, B, ZE_MEMORY_ACCESS_ATTRIBUTE_READONLY));
    /* bytes in the first mapping, written by a queued fill and read back by a copy */
    ze_command_queue_desc_t qd = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0,
                                  ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS, ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
    ze_command_list_handle_t list = NULL;
    MUST(zeCommandListCreateImmediate(e.ctx, e.dev[0], &qd, &list));
    unsigned char pat = 0x5a, back[64];
    void *hb = NULL;
    MUST(zeMemAllocHost(e.ctx, &HOST_DESC, 64, 64, &hb));
    OK(zeCommandListAppendMemoryFill(list, base, &pat, 1, 64, NULL, 0, NULL));
    /* the pages after the two mappings were never mapped: SUCCESS, nothing changes */
    OK(zeVirtualMemUnmap(e.ctx, base + 2 * B, B));
    OK(zeVirtualMemUnmap(e.ctx, base + 2 * B, 2 * B));
    ze_memory_access_attribute_t acc = 0;
    size_t out = 0;
    OK(zeVirtualMemGetAccessAttribute(e.ctx, base, B, &acc, &out));
    EXPECT(acc == ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE);
    OK(zeVirtualMemGetAccessAttribute(e.ctx, base + B, B, &acc, &out));
    EXPECT(acc == ZE_MEMORY_ACCESS_ATTRIBUTE_READONLY);
    OK(zeCommandListAppendMemoryCopy(list, hb, base, 64, NULL, 0, NULL));
    memcpy(back, hb, 64);
    EXPECT(back[0] == 0x5a && back[63] == 0x5a);
    /* programs unmap the first mapping, then every mapping in a loop, the first one twice */
    OK(zeVirtualMemUnmap(e.ctx, base, B));
    OK(zeVirtualMemUnmap(e.ctx, base, B));
    OK(zeVirtualMemUnmap(e.ctx, base + B, B));
    OK(zeVirtualMemGetAccessAttribute(e.ctx, base, 4 * B, &acc, &out));
    EXPECT(acc == ZE_MEMORY_ACCESS_ATTRIBUTE_NONE && out == 4 * B);
    /* all unmapped: the object can go */
    OK(zePhysicalMemDestroy(e.ctx, ph));
    /* outside every reservation: INVALID_ARGUMENT */
    CHECK(zeVirtualMemUnmap(e.ctx, base + 4 * B, B), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    CHECK(zeVirtualMemUnmap(e.ctx, base + 3 * B, 2 * B), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    OK(zeVirtualMemFree(e.ctx, r, 4 * B));
    CHECK(zeVirtualMemUnmap(e.ctx, base, B), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* freed */

    zeMemFree(e.ctx, hb);
    zeCommandListDestroy(list);
    zeContextDestroy(e.ctx);
    return finish("cases_vm");
}
