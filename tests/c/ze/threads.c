/* Concurrency through the loader: 8 threads at once allocate, query, export / open / close /
 * put IPC handles, reserve / map / protect / unmap virtual memory and copy on their own
 * immediate lists, in one shared context, while a ninth thread keeps passing destroyed and
 * made-up handles. Every call answers as it would alone; nothing is left behind. The threads
 * spread over the devices there are; sizes come from the page-size query (a READONLY base
 * page, and one the copy writes, in one mapping). */
#include "common.h"
#include "ze_hetmem.h"
#include <pthread.h>

#define THREADS 8
#define ITERS 150
static env_t e;
static ze_hetmem_pfnMemPutIpcHandle_t put;
static ze_result_t (*list_sync)(ze_command_list_handle_t, uint64_t);
static volatile int stop;
/* The base page (access attributes work on it) and the mapping: two base pages, at least a
 * page of 2 MiB (host backend: 64 KiB in 2 MiB; 2 MiB pages: 2 MiB in 4 MiB). */
static size_t base_page, map_size;
static int errors[THREADS + 1];

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg, bad = 0;
    ze_command_queue_desc_t qd = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0, 0, 0};
    ze_command_list_handle_t il = NULL;
    bad += zeCommandListCreateImmediate(e.ctx, e.dev[id % e.ndev], &qd, &il) != 0;
    for (int i = 0; i < ITERS; i++) {
        void *a = NULL, *b = NULL, *v = NULL, *r = NULL;
        bad += zeMemAllocDevice(e.ctx, &DEV_DESC, 65536, 0, e.dev[i % e.ndev], &a) != 0;
        bad += zeMemAllocHost(e.ctx, &HOST_DESC, 65536, 0, &b) != 0;
        memset(b, id, 65536);
        bad += zeCommandListAppendMemoryCopy(il, a, b, 65536, NULL, 0, NULL) != 0;
        ze_ipc_mem_handle_t h;
        bad += zeMemGetIpcHandle(e.ctx, a, &h) != 0;
        bad += zeMemOpenIpcHandle(e.ctx, e.dev[0], h, 0, &v) != 0;
        ze_physical_mem_desc_t pd = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, NULL, 0, map_size};
        ze_physical_mem_handle_t ph = NULL;
        bad += zeVirtualMemReserve(e.ctx, (void *)(uintptr_t)(256ull << 30), map_size, &r) != 0;
        bad += zePhysicalMemCreate(e.ctx, e.dev[i % e.ndev], &pd, &ph) != 0;
        bad += zeVirtualMemMap(e.ctx, r, map_size, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE) != 0;
        bad += zeVirtualMemSetAccessAttribute(e.ctx, r, base_page, ZE_MEMORY_ACCESS_ATTRIBUTE_READONLY) != 0;
        bad += zeCommandListAppendMemoryCopy(il, (char *)r + base_page, b, 4096, NULL, 0, NULL) != 0;
        bad += zeVirtualMemFree(e.ctx, r, map_size) != 0; /* waits for the copy into it */
        bad += zePhysicalMemDestroy(e.ctx, ph) != 0;
        bad += zeMemFree(e.ctx, a) != ZE_RESULT_SUCCESS; /* freed while the copy may run */
        bad += zeMemCloseIpcHandle(e.ctx, v) != 0;
        bad += put(e.ctx, h) != 0;
        bad += list_sync(il, 10ull * 1000 * 1000 * 1000) != 0;
        bad += zeMemFree(e.ctx, b) != 0;
    }
    bad += zeCommandListDestroy(il) != 0;
    errors[id] = bad;
    return NULL;
}

static void *vandal(void *arg) {
    (void)arg;
    int bad = 0;
    while (!stop) {
        ze_context_desc_t cd = {ZE_STRUCTURE_TYPE_CONTEXT_DESC, NULL, 0};
        ze_context_handle_t c = NULL;
        bad += zeContextCreate(e.drv, &cd, &c) != 0;
        bad += zeContextDestroy(c) != 0;
        void *p = NULL;
        bad += zeMemAllocHost(c, &HOST_DESC, 4096, 0, &p) != ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
        bad += zeMemFree(e.ctx, BOGUS(void *)) != ZE_RESULT_ERROR_INVALID_ARGUMENT;
        bad += zeContextGetStatus(BOGUS(ze_context_handle_t)) != ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    }
    errors[THREADS] = bad;
    return NULL;
}

int main(void) {
    e = setup();
    base_page = page_size(e.ctx, e.dev[0], 1);
    map_size = 2 * base_page > page_size(e.ctx, e.dev[0], 2 << 20) ? 2 * base_page : page_size(e.ctx, e.dev[0], 2 << 20);
    MUST(zeDriverGetExtensionFunctionAddress(e.drv, "zeMemPutIpcHandle", (void **)&put));
    MUST(zeDriverGetExtensionFunctionAddress(e.drv, "zeCommandListHostSynchronize", (void **)&list_sync));
    pthread_t t[THREADS], v;
    pthread_create(&v, NULL, vandal, NULL);
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    stop = 1;
    pthread_join(v, NULL);
    for (int i = 0; i <= THREADS; i++) {
        if (errors[i]) fprintf(stderr, "FAIL thread %d: %d calls answered unexpectedly\n", i, errors[i]);
        EXPECT(errors[i] == 0);
    }
    EXPECT_CAPACITY_BACK(&e, "every device's whole capacity back after the threads");
    OK(zeContextDestroy(e.ctx));
    return finish("threads");
}
