/* Case 1 of shared/cases/level-zero.md: ordinary system memory (malloc, the stack) as the
 * source or destination of zeCommandListAppendMemoryCopy / MemoryFill -> accepted and the bytes
 * arrive, on a device whose zeDeviceGetMemoryAccessProperties reports sharedSystemAllocCapabilities
 * with ZE_MEMORY_ACCESS_CAP_FLAG_RW. The memory is not held against frees (the program owns it);
 * a range that is not mapped at all fails cleanly with INVALID_ARGUMENT, never a crash; a
 * read-only page of the process is no destination. Device memory is read back only through
 * copies, so this runs on any driver that makes the claim. */
#include "common.h"
#include <sys/mman.h>
#include <unistd.h>

int main(void) {
    env_t e = setup();
    ze_device_memory_access_properties_t ap = {ZE_STRUCTURE_TYPE_DEVICE_MEMORY_ACCESS_PROPERTIES};
    OK(zeDeviceGetMemoryAccessProperties(e.dev[0], &ap));
    EXPECT(ap.sharedSystemAllocCapabilities & ZE_MEMORY_ACCESS_CAP_FLAG_RW); /* case 1: reported */

    ze_command_queue_desc_t qd = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0,
                                  ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS, ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
    ze_command_list_handle_t list = NULL;
    MUST(zeCommandListCreateImmediate(e.ctx, e.dev[0], &qd, &list));
    const size_t N = 1 << 20;
    void *dev = NULL;
    MUST(zeMemAllocDevice(e.ctx, &DEV_DESC, N, 64, e.dev[0], &dev));

    /* malloc -> device -> std::vector-like malloc buffer */
    unsigned char *src = malloc(N), *dst = malloc(N);
    for (size_t i = 0; i < N; i++) src[i] = (unsigned char)(i * 7 + 1);
    memset(dst, 0, N);
    OK(zeCommandListAppendMemoryCopy(list, dev, src, N, NULL, 0, NULL));
    OK(zeCommandListAppendMemoryCopy(list, dst, dev, N, NULL, 0, NULL));
    EXPECT(memcmp(src, dst, N) == 0); /* case 1: the bytes arrive */
    /* malloc -> malloc through the queue, at odd offsets and sizes */
    memset(dst, 0, N);
    OK(zeCommandListAppendMemoryCopy(list, dst + 3, src + 5, 1001, NULL, 0, NULL));
    EXPECT(memcmp(dst + 3, src + 5, 1001) == 0 && dst[2] == 0 && dst[1004] == 0);
    /* the stack, both ways */
    unsigned char stack_src[256], stack_dst[256];
    for (int i = 0; i < 256; i++) stack_src[i] = (unsigned char)(255 - i);
    memset(stack_dst, 0, sizeof stack_dst);
    OK(zeCommandListAppendMemoryCopy(list, dev, stack_src, sizeof stack_src, NULL, 0, NULL));
    OK(zeCommandListAppendMemoryCopy(list, stack_dst, dev, sizeof stack_dst, NULL, 0, NULL));
    EXPECT(memcmp(stack_src, stack_dst, 256) == 0);
    /* fills into system memory: 1-byte and 4-byte patterns, a size not a multiple of it */
    unsigned char one = 0xa5;
    uint32_t four = 0x04030201u;
    OK(zeCommandListAppendMemoryFill(list, dst, &one, 1, 4096, NULL, 0, NULL));
    EXPECT(dst[0] == 0xa5 && dst[4095] == 0xa5);
    OK(zeCommandListAppendMemoryFill(list, stack_dst, &four, 4, 250, NULL, 0, NULL));
    EXPECT(stack_dst[0] == 1 && stack_dst[1] == 2 && stack_dst[3] == 4 && stack_dst[248] == 1 &&
           stack_dst[249] == 2 && stack_dst[250] == (unsigned char)(255 - 250));
    /* a regular list on a queue: appended, executed later, bytes arrive */
    ze_command_queue_handle_t q = NULL;
    ze_command_queue_desc_t qa = qd;
    qa.mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS;
    MUST(zeCommandQueueCreate(e.ctx, e.dev[0], &qa, &q));
    ze_command_list_desc_t ld = {ZE_STRUCTURE_TYPE_COMMAND_LIST_DESC, NULL, 0, 0};
    ze_command_list_handle_t rl = NULL;
    MUST(zeCommandListCreate(e.ctx, e.dev[0], &ld, &rl));
    memset(dst, 0, N);
    OK(zeCommandListAppendMemoryCopy(rl, dev, src, N, NULL, 0, NULL));
    OK(zeCommandListAppendBarrier(rl, NULL, 0, NULL));
    OK(zeCommandListAppendMemoryCopy(rl, dst, dev, N, NULL, 0, NULL));
    OK(zeCommandListClose(rl));
    OK(zeCommandQueueExecuteCommandLists(q, 1, &rl, NULL));
    OK(zeCommandQueueSynchronize(q, UINT64_MAX));
    EXPECT(memcmp(src, dst, N) == 0);
    /* large copies both ways at odd offsets and sizes (the cuda backend stages pageable memory
     * through pinned buffers in chunks: several chunks and a partial last one), host USM to and
     * from malloc, and fills of a large malloc buffer with 1-, 4- and 16-byte patterns */
    {
        const size_t L = (40u << 20) + 13;
        unsigned char *big = malloc(L + 64), *back = malloc(L + 64);
        void *dbig = NULL, *husm = NULL;
        MUST(big && back ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY);
        MUST(zeMemAllocDevice(e.ctx, &DEV_DESC, L + 64, 64, e.dev[0], &dbig));
        MUST(zeMemAllocHost(e.ctx, &HOST_DESC, L + 64, 64, &husm));
        for (size_t i = 0; i < L + 64; i++) big[i] = (unsigned char)(i * 31 + (i >> 20));
        memset(back, 0, L + 64);
        OK(zeCommandListAppendMemoryCopy(list, (char *)dbig + 7, big + 3, L, NULL, 0, NULL));
        OK(zeCommandListAppendMemoryCopy(list, back + 5, (char *)dbig + 7, L, NULL, 0, NULL));
        EXPECT(memcmp(back + 5, big + 3, L) == 0 && back[4] == 0 && back[L + 5] == 0);
        memset(back, 0, L + 64);
        OK(zeCommandListAppendMemoryCopy(list, husm, big, L, NULL, 0, NULL));
        OK(zeCommandListAppendMemoryCopy(list, back, husm, L, NULL, 0, NULL));
        EXPECT(memcmp(back, big, L) == 0);
        unsigned char p16[16];
        for (int i = 0; i < 16; i++) p16[i] = (unsigned char)(0x30 + i);
        OK(zeCommandListAppendMemoryFill(list, back + 1, p16, 16, L, NULL, 0, NULL));
        int fill_ok = back[0] == big[0];
        for (size_t i = 0; i < L && fill_ok; i += 4099) fill_ok = back[1 + i] == p16[i % 16];
        EXPECT(fill_ok && back[L] == p16[(L - 1) % 16] && back[L + 1] == 0);
        OK(zeCommandListAppendMemoryFill(list, back, &four, 4, L, NULL, 0, NULL));
        EXPECT(back[0] == 1 && back[L - 1] == ((L - 1) % 4) + 1);
        OK(zeCommandListAppendMemoryFill(list, back, &one, 1, L, NULL, 0, NULL));
        EXPECT(back[0] == 0xa5 && back[L / 2] == 0xa5 && back[L - 1] == 0xa5 && back[L] != 0xa5);
        /* in queue order: a fill of malloc memory after a copy into it, then a copy out */
        OK(zeCommandListAppendMemoryCopy(list, back, dbig, 4096, NULL, 0, NULL));
        OK(zeCommandListAppendMemoryFill(list, back + 100, &one, 1, 10, NULL, 0, NULL));
        OK(zeCommandListAppendMemoryCopy(list, husm, back, 4096, NULL, 0, NULL));
        EXPECT(((unsigned char *)husm)[99] == big[3 + 92] && ((unsigned char *)husm)[100] == 0xa5 &&
               ((unsigned char *)husm)[110] == big[3 + 103]);
        zeMemFree(e.ctx, husm);
        zeMemFree(e.ctx, dbig);
        free(big);
        free(back);
    }
    /* not held against frees: the program frees its memory whenever it likes */
    free(src);
    /* a range that is not mapped: INVALID_ARGUMENT, never a crash */
    long pg = sysconf(_SC_PAGESIZE);
    unsigned char *hole = mmap(NULL, 3 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    MUST(hole == MAP_FAILED ? ZE_RESULT_ERROR_UNKNOWN : ZE_RESULT_SUCCESS);
    munmap(hole + pg, pg);
    CHECK(zeCommandListAppendMemoryCopy(list, dev, hole + pg, 64, NULL, 0, NULL), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    CHECK(zeCommandListAppendMemoryCopy(list, hole + pg, dev, 64, NULL, 0, NULL), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    CHECK(zeCommandListAppendMemoryFill(list, hole + pg, &one, 1, 64, NULL, 0, NULL), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    /* running from a mapped page into the hole */
    CHECK(zeCommandListAppendMemoryCopy(list, dev, hole + pg - 32, 64, NULL, 0, NULL), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    /* a read-only page of the process: a source, not a destination */
    hole[0] = 0x11;
    mprotect(hole, pg, PROT_READ);
    OK(zeCommandListAppendMemoryCopy(list, dev, hole, 64, NULL, 0, NULL));
    CHECK(zeCommandListAppendMemoryCopy(list, hole, dev, 64, NULL, 0, NULL), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    CHECK(zeCommandListAppendMemoryFill(list, hole, &one, 1, 64, NULL, 0, NULL), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    EXPECT(hole[0] == 0x11);
    /* an inaccessible page: neither */
    mprotect(hole, pg, PROT_NONE);
    CHECK(zeCommandListAppendMemoryCopy(list, dev, hole, 64, NULL, 0, NULL), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    munmap(hole, pg);
    munmap(hole + 2 * pg, pg);

    free(dst);
    zeMemFree(e.ctx, dev);
    zeCommandListDestroy(rl);
    zeCommandQueueDestroy(q);
    zeCommandListDestroy(list);
    zeContextDestroy(e.ctx);
    return finish("cases_sysmem");
}
