/* Leak check through the loader: 10,000 mixed calls (allocations, queries, IPC, virtual
 * memory, queues, events, and failing calls), then the process's mappings, open fds, the
 * driver's live handles and the devices' capacity are back where they started. */
#include "common.h"
#include "ze_hetmem.h"
#include <dirent.h>
#include <dlfcn.h>

static long calls = 0;
#define C(x) (calls++, (x))

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

static void round_of_calls(int i) {
    void *h = NULL, *d = NULL, *v = NULL, *r = NULL;
    ze_memory_allocation_properties_t mp = {ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    C(zeMemAllocHost(e.ctx, &HOST_DESC, 4096 + (size_t)i, 0, &h));
    C(zeMemAllocDevice(e.ctx, &DEV_DESC, 65536, 0, e.dev[i % 2], &d));
    C(zeMemGetAllocProperties(e.ctx, d, &mp, NULL));
    C(zeMemGetAddressRange(e.ctx, h, NULL, NULL));
    ze_ipc_mem_handle_t ih;
    C(zeMemGetIpcHandle(e.ctx, d, &ih));
    C(zeMemOpenIpcHandle(e.ctx, e.dev[0], ih, 0, &v));
    C(zeMemCloseIpcHandle(e.ctx, v));
    C(put(e.ctx, ih));
    C(zeMemFree(e.ctx, (char *)h + 1)); /* fails: interior pointer */
    C(zeMemFree(e.ctx, BOGUS(void *)));  /* fails: unknown */
    ze_physical_mem_desc_t pd = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, NULL, 0, 2 << 20};
    ze_physical_mem_handle_t ph = NULL;
    C(zeVirtualMemReserve(e.ctx, (void *)(uintptr_t)(128ull << 30), 4 << 20, &r));
    C(zePhysicalMemCreate(e.ctx, e.dev[0], &pd, &ph));
    C(zeVirtualMemMap(e.ctx, r, 2 << 20, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    C(zeVirtualMemSetAccessAttribute(e.ctx, r, 64 << 10, ZE_MEMORY_ACCESS_ATTRIBUTE_READONLY));
    ze_memory_access_attribute_t acc;
    size_t out;
    C(zeVirtualMemGetAccessAttribute(e.ctx, r, 4 << 20, &acc, &out));
    C(zeVirtualMemMap(e.ctx, r, 2 << 20, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE)); /* fails: mapped */
    C(zeVirtualMemUnmap(e.ctx, r, 2 << 20));
    C(zeVirtualMemFree(e.ctx, r, 4 << 20));
    C(zePhysicalMemDestroy(e.ctx, ph));
    if (i % 5 == 0) {
        ze_command_list_desc_t ld = {ZE_STRUCTURE_TYPE_COMMAND_LIST_DESC, NULL, 0, 0};
        ze_command_list_handle_t l = NULL;
        ze_event_desc_t ed = {ZE_STRUCTURE_TYPE_EVENT_DESC, NULL, 0, 0, 0};
        ze_event_handle_t ev = NULL;
        C(zeEventCreate(pool, &ed, &ev));
        C(zeCommandListCreate(e.ctx, e.dev[0], &ld, &l));
        C(zeCommandListAppendMemoryCopy(l, h, d, 4096, ev, 0, NULL));
        C(zeCommandListClose(l));
        C(zeCommandQueueExecuteCommandLists(q, 1, &l, NULL));
        C(zeEventHostSynchronize(ev, UINT64_MAX));
        C(zeCommandQueueSynchronize(q, UINT64_MAX));
        C(zeCommandListDestroy(l));
        C(zeEventDestroy(ev));
    }
    C(zeMemFree(e.ctx, h));
    C(zeMemFree(e.ctx, d));
}

int main(void) {
    e = setup();
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
    for (int i = 0; calls < 10000; i++) round_of_calls(i);
    int maps1 = count_lines("/proc/self/maps"), fds1 = count_fds();
    uint64_t live1 = live ? live() : 0;
    printf("leak: %ld calls; mappings %d -> %d, fds %d -> %d, live handles %llu -> %llu\n", calls, maps0,
           maps1, fds0, fds1, (unsigned long long)live0, (unsigned long long)live1);
    EXPECT(calls >= 10000);
    EXPECT(maps1 == maps0);
    EXPECT(fds1 == fds0);
    EXPECT(live1 == live0);
    /* device capacity is all back: each device takes two maximal allocations (its whole memory) */
    ze_device_properties_t dp = {ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
    MUST(zeDeviceGetProperties(e.dev[0], &dp));
    for (uint32_t k = 0; k < e.ndev; k++) {
        void *a = NULL, *b = NULL;
        OK(zeMemAllocDevice(e.ctx, &DEV_DESC, dp.maxMemAllocSize, 0, e.dev[k], &a));
        OK(zeMemAllocDevice(e.ctx, &DEV_DESC, dp.maxMemAllocSize, 0, e.dev[k], &b));
        OK(zeMemFree(e.ctx, a));
        OK(zeMemFree(e.ctx, b));
    }
    OK(zeCommandQueueDestroy(q));
    OK(zeEventPoolDestroy(pool));
    OK(zeContextDestroy(e.ctx));
    return finish("leak");
}
