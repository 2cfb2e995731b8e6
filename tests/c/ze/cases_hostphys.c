/* Case 10 of shared/cases/level-zero.md: physical host memory.
 *   zePhysicalMemCreate(ctx, NULL, {size = page size, flags = ZE_PHYSICAL_MEM_FLAG_ALLOCATE_ON_HOST}),
 *   mapped read-write in a reservation, filled and copied through on a queue -> SUCCESS with the
 *   bytes right, at every page size zeVirtualMemQueryPageSize answers (sizes 1 byte to 1 GiB),
 *   for one page and for several pages, mapped whole and from an offset of one page.
 * The bytes are checked through the queue (copies to malloc'd memory, case 1) and through the
 * mapping from the host (host physical memory is host memory).
 * The 1.4 validation layer knows neither ALLOCATE_ON_HOST (its flags stop at 0x1) nor a null
 * device for it, and answers itself: under the layer the program expects the layer's answers
 * (README, "What the validation layer refuses that the spec allows"). */
#include "common.h"
#include "ze_hetmem.h"

static ze_command_list_handle_t list;
static ze_context_handle_t ctx;
static void *dev_buf;

/* One host physical object of `pages` pages of `page` bytes, mapped at offset `phys_off`
 * pages for `map_pages` pages: fills, copies in from device and malloc memory, copies out, host
 * reads and writes through the mapping. */
static void round_trip(ze_device_handle_t dev, size_t page, size_t pages, size_t phys_off,
                       size_t map_pages) {
    const size_t size = page * pages, len = page * map_pages;
    ze_physical_mem_desc_t hd = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, NULL,
                                 ZE_HETMEM_PHYSICAL_MEM_FLAG_ALLOCATE_ON_HOST, size};
    ze_physical_mem_handle_t ph = NULL;
    ze_result_t r = zePhysicalMemCreate(ctx, NULL, &hd, &ph); /* case 10: null device */
    CHECK(r, ZE_RESULT_SUCCESS);
    if (r != ZE_RESULT_SUCCESS) {
        fprintf(stderr, "  host physical memory of %zu bytes (page %zu): 0x%x\n", size, page, (unsigned)r);
        return;
    }
    void *va = NULL;
    OK(zeVirtualMemReserve(ctx, NULL, len, &va));
    r = zeVirtualMemMap(ctx, va, len, ph, phys_off * page, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE);
    CHECK(r, ZE_RESULT_SUCCESS);
    if (r == ZE_RESULT_SUCCESS) {
        unsigned char *v = va;
        unsigned char *src = malloc(len), *back = malloc(len);
        for (size_t i = 0; i < len; i++) src[i] = (unsigned char)(i * 13 + pages + phys_off);
        /* a fill on the queue, read back by a copy and from the host */
        unsigned char pat[4] = {0xc1, 0xc2, 0xc3, 0xc4};
        OK(zeCommandListAppendMemoryFill(list, va, pat, 4, len, NULL, 0, NULL));
        memset(back, 0, len);
        OK(zeCommandListAppendMemoryCopy(list, back, va, len, NULL, 0, NULL));
        EXPECT(back[0] == 0xc1 && back[1] == 0xc2 && back[len - 1] == 0xc4 && back[len / 2] == 0xc1);
        EXPECT(v[0] == 0xc1 && v[len - 2] == 0xc3);
        /* malloc -> host physical -> device -> malloc */
        OK(zeCommandListAppendMemoryCopy(list, va, src, len, NULL, 0, NULL));
        OK(zeCommandListAppendMemoryCopy(list, dev_buf, va, len, NULL, 0, NULL));
        memset(back, 0, len);
        OK(zeCommandListAppendMemoryCopy(list, back, dev_buf, len, NULL, 0, NULL));
        EXPECT(memcmp(back, src, len) == 0);
        EXPECT(memcmp(v, src, len) == 0); /* the host sees the bytes the queue wrote */
        /* device -> host physical at an odd offset, the host reads it; the host writes, the queue
         * reads it */
        OK(zeCommandListAppendMemoryFill(list, dev_buf, pat + 1, 1, len, NULL, 0, NULL));
        OK(zeCommandListAppendMemoryCopy(list, v + 3, dev_buf, len - 8, NULL, 0, NULL));
        EXPECT(v[2] == src[2] && v[3] == 0xc2 && v[len - 6] == 0xc2 && v[len - 5] == src[len - 5]);
        memset(v, 0x5e, len);
        memset(back, 0, len);
        OK(zeCommandListAppendMemoryCopy(list, back, va, len, NULL, 0, NULL));
        EXPECT(back[0] == 0x5e && back[len - 1] == 0x5e);
        free(src);
        free(back);
        OK(zeVirtualMemUnmap(ctx, va, len));
    }
    OK(zeVirtualMemFree(ctx, va, len));
    OK(zePhysicalMemDestroy(ctx, ph));
}

int main(void) {
    env_t e = setup();
    ctx = e.ctx;
    ze_physical_mem_desc_t hd = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, NULL,
                                 ZE_HETMEM_PHYSICAL_MEM_FLAG_ALLOCATE_ON_HOST, page_size(e.ctx, e.dev[0], 1)};
    if (is_validating()) {
        ze_physical_mem_handle_t ph = NULL;
        CHECK(zePhysicalMemCreate(e.ctx, NULL, &hd, &ph), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
        CHECK(zePhysicalMemCreate(e.ctx, e.dev[0], &hd, &ph), ZE_RESULT_ERROR_INVALID_ENUMERATION);
        EXPECT(ph == NULL);
        /* (the plain pass runs the case itself) */
        zeContextDestroy(e.ctx);
        return finish("cases_hostphys");
    }
    ze_command_queue_desc_t qd = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0,
                                  ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS, ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
    MUST(zeCommandListCreateImmediate(e.ctx, e.dev[0], &qd, &list));
    /* Every page size the query answers, for sizes from 1 byte to 1 GiB. */
    size_t seen[64];
    int nseen = 0;
    size_t biggest = 0;
    for (size_t s = 1; s <= (1ull << 30); s <<= 1) {
        size_t p = page_size(e.ctx, e.dev[0], s);
        int known = 0;
        for (int i = 0; i < nseen; i++) known |= seen[i] == p;
        if (!known && nseen < 64) seen[nseen++] = p;
        if (p > biggest) biggest = p;
    }
    EXPECT(nseen >= 1);
    MUST(zeMemAllocDevice(e.ctx, &DEV_DESC, 3 * biggest, 64, e.dev[0], &dev_buf));
    for (int i = 0; i < nseen; i++) {
        size_t p = seen[i];
        printf("cases_hostphys: page size %zu\n", p);
        round_trip(e.dev[0], p, 1, 0, 1);  /* one page, the case itself */
        round_trip(e.dev[0], p, 3, 0, 3);  /* several pages, mapped whole */
        round_trip(e.dev[0], p, 3, 1, 2);  /* from an offset of one page */
    }
    /* With a device too (the spec ignores it for host memory). */
    ze_physical_mem_handle_t ph = NULL;
    OK(zePhysicalMemCreate(e.ctx, e.dev[0], &hd, &ph));
    if (ph) OK(zePhysicalMemDestroy(e.ctx, ph));
    /* Bad input: a size that is no multiple of the page, flags asking for both places. */
    ph = NULL;
    ze_physical_mem_desc_t bad = hd;
    bad.size = hd.size + 1;
    CHECK(zePhysicalMemCreate(e.ctx, NULL, &bad, &ph), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    bad = hd;
    bad.flags = 0x3; /* ALLOCATE_ON_DEVICE | ALLOCATE_ON_HOST */
    CHECK(zePhysicalMemCreate(e.ctx, e.dev[0], &bad, &ph), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    EXPECT(ph == NULL);
    zeMemFree(e.ctx, dev_buf);
    zeCommandListDestroy(list);
    zeContextDestroy(e.ctx);
    return finish("cases_hostphys");
}
