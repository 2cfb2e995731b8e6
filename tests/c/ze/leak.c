/* Leak check through the loader: thousands of mixed calls (allocations, queries, IPC, virtual
 * memory, queues, events, and failing calls), each answering what it must, then the process's
 * mappings, open fds, the driver's live handles and (on small devices) the devices' capacity
 * are back where they started.
 *
 * How many calls: 10,000 where the base page is 64 KiB (the host backend). Where the page-size
 * query answers 2 MiB for every size (a GPU: the CUDA driver's granularity), every allocation,
 * physical object and mapping of a round is real 2 MiB-granular driver work (cuMemCreate,
 * cuMemMap, cuMemSetAccess, export / import: about 30-50 us each, and their frees), so 2,500
 * calls (about 100 rounds) keep the run to a few seconds; a leak of anything per round still
 * shows 100-fold. */
#include "common.h"
#include "ze_hetmem.h"
#include <dirent.h>
#include <dlfcn.h>

/* Every wait is bounded, so that a call answering wrongly cannot hang the suite. */
#define WAIT (10ull * 1000 * 1000 * 1000)

static long calls = 0, wrong = 0;
/* A call of a round and the answer it must give; a wrong answer is counted (and the first
 * few printed). */
#define C(x, expect) answer(#x, __LINE__, (x), (expect))
static void answer(const char *what, int line, ze_result_t r, ze_result_t expect) {
    calls++;
    if (r != expect) {
        if (wrong++ < 10)
            fprintf(stderr, "FAIL leak.c:%d: %s = 0x%x, expected 0x%x\n", line, what, (unsigned)r, (unsigned)expect);
    }
}
#define S_OK ZE_RESULT_SUCCESS
static int count_lines(const char *path) {
    FILE *f = fopen(path, "r");
    int n = 0, ch;
    while ((ch = fgetc(f)) != EOF) n += ch == '\n';
    fclose(f);
    return n;
}
static int count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

static env_t e;
static ze_hetmem_pfnMemPutIpcHandle_t put;
static ze_command_queue_handle_t q;
static ze_event_pool_handle_t pool;
/* The base page (access attributes work on it) and the physical object: a page of 2 MiB
 * (host backend: 64 KiB and 2 MiB; a GPU: 2 MiB and 2 MiB), mapped in a reservation of two. */
static size_t base_page, obj;

static void round_of_calls(int i) {
    void *h = NULL, *d = NULL, *v = NULL, *r = NULL;
    ze_memory_allocation_properties_t mp = {ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    C(zeMemAllocHost(e.ctx, &HOST_DESC, 4096 + (size_t)i, 0, &h), S_OK);
    C(zeMemAllocDevice(e.ctx, &DEV_DESC, 65536, 0, e.dev[i % e.ndev], &d), S_OK);
    C(zeMemGetAllocProperties(e.ctx, d, &mp, NULL), S_OK);
    C(zeMemGetAddressRange(e.ctx, h, NULL, NULL), S_OK);
    ze_ipc_mem_handle_t ih;
    C(zeMemGetIpcHandle(e.ctx, d, &ih), S_OK);
    C(zeMemOpenIpcHandle(e.ctx, e.dev[0], ih, 0, &v), S_OK);
    C(zeMemCloseIpcHandle(e.ctx, v), S_OK);
    C(put(e.ctx, ih), S_OK);
    C(zeMemFree(e.ctx, (char *)h + 1), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* interior pointer */
    C(zeMemFree(e.ctx, BOGUS(void *)), ZE_RESULT_ERROR_INVALID_ARGUMENT);  /* unknown */
    ze_physical_mem_desc_t pd = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, NULL, 0, obj};
    ze_physical_mem_handle_t ph = NULL;
    C(zeVirtualMemReserve(e.ctx, (void *)(uintptr_t)(128ull << 30), 2 * obj, &r), S_OK);
    C(zePhysicalMemCreate(e.ctx, e.dev[0], &pd, &ph), S_OK);
    C(zeVirtualMemMap(e.ctx, r, obj, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE), S_OK);
    C(zeVirtualMemSetAccessAttribute(e.ctx, r, base_page, ZE_MEMORY_ACCESS_ATTRIBUTE_READONLY), S_OK);
    ze_memory_access_attribute_t acc;
    size_t out;
    C(zeVirtualMemGetAccessAttribute(e.ctx, r, 2 * obj, &acc, &out), S_OK);
    C(zeVirtualMemMap(e.ctx, r, obj, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* mapped */
    C(zeVirtualMemUnmap(e.ctx, r, obj), S_OK);
    C(zeVirtualMemFree(e.ctx, r, 2 * obj), S_OK);
    C(zePhysicalMemDestroy(e.ctx, ph), S_OK);
    if (i % 5 == 0) {
        ze_command_list_desc_t ld = {ZE_STRUCTURE_TYPE_COMMAND_LIST_DESC, NULL, 0, 0};
        ze_command_list_handle_t l = NULL;
        ze_event_desc_t ed = {ZE_STRUCTURE_TYPE_EVENT_DESC, NULL, 0, 0, 0};
        ze_event_handle_t ev = NULL;
        C(zeEventCreate(pool, &ed, &ev), S_OK);
        C(zeCommandListCreate(e.ctx, e.dev[0], &ld, &l), S_OK);
        C(zeCommandListAppendMemoryCopy(l, h, d, 4096, ev, 0, NULL), S_OK);
        C(zeCommandListClose(l), S_OK);
        C(zeCommandQueueExecuteCommandLists(q, 1, &l, NULL), S_OK);
        C(zeEventHostSynchronize(ev, WAIT), S_OK);
        C(zeCommandQueueSynchronize(q, WAIT), S_OK);
        C(zeCommandListDestroy(l), S_OK);
        C(zeEventDestroy(ev), S_OK);
    }
    C(zeMemFree(e.ctx, h), S_OK);
    C(zeMemFree(e.ctx, d), S_OK);
}

int main(void) {
    e = setup();
    base_page = page_size(e.ctx, e.dev[0], 1);
    obj = page_size(e.ctx, e.dev[0], 2 << 20);
    const long target = base_page >= (2u << 20) ? 2500 : 10000; /* see the top of the file */
    MUST(zeDriverGetExtensionFunctionAddress(e.drv, "zeMemPutIpcHandle", (void **)&put));
    void *lib = dlopen(getenv("ZE_ENABLE_ALT_DRIVERS"), RTLD_NOW | RTLD_NOLOAD);
    uint64_t (*live)(void) = lib ? (uint64_t(*)(void))dlsym(lib, "hetmemZeLiveHandles") : NULL;
    EXPECT(live != NULL);
    ze_command_queue_desc_t qd = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0, 0, 0};
    MUST(zeCommandQueueCreate(e.ctx, e.dev[0], &qd, &q));
    ze_event_pool_desc_t epd = {ZE_STRUCTURE_TYPE_EVENT_POOL_DESC, NULL, ZE_EVENT_POOL_FLAG_HOST_VISIBLE, 1};
    MUST(zeEventPoolCreate(e.ctx, &epd, 0, NULL, &pool));
    /* warm-up: the IPC broker, thread stacks and allocator arenas reach their steady state */
    for (int i = 0; i < 20; i++) round_of_calls(i);
    int maps0 = count_lines("/proc/self/maps"), fds0 = count_fds();
    uint64_t live0 = live ? live() : 0;
    calls = 0;
    for (int i = 0; calls < target; i++) round_of_calls(i);
    int maps1 = count_lines("/proc/self/maps"), fds1 = count_fds();
    uint64_t live1 = live ? live() : 0;
    printf("leak: %ld calls (%ld answered wrongly); mappings %d -> %d, fds %d -> %d, live handles %llu -> %llu\n",
           calls, wrong, maps0, maps1, fds0, fds1, (unsigned long long)live0, (unsigned long long)live1);
    EXPECT(calls >= target);
    EXPECT(wrong == 0);
    EXPECT(maps1 == maps0);
    EXPECT(fds1 == fds0);
    EXPECT(live1 == live0);
    EXPECT_CAPACITY_BACK(&e, "every device's whole capacity back after the calls");
    OK(zeCommandQueueDestroy(q));
    OK(zeEventPoolDestroy(pool));
    OK(zeContextDestroy(e.ctx));
    return finish("leak");
}
