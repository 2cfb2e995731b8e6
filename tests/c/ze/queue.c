/* Command queues, regular and immediate command lists, event pools, events and fences through
 * the loader: copy, fill, barrier, signal / wait, close, reset, execute, synchronize, query;
 * the free policies of zeMemFreeExt on real queued copies; and the documented error paths.
 * Device memory is written and read by the device only (copies and fills). */
#include "common.h"
#include <pthread.h>
#include <time.h>
#include <unistd.h>

/* Waits are bounded so that a failure cannot hang the suite. */
#define WAIT (10ull * 1000 * 1000 * 1000)

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}
static ze_event_handle_t gate_ev;
static void *signal_later(void *arg) {
    usleep((useconds_t)(uintptr_t)arg * 1000);
    zeEventHostSignal(gate_ev);
    return NULL;
}

int main(void) {
    env_t e = setup();
    const size_t N = 8 << 20;
    ze_command_queue_desc_t qd = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0,
                                  ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS, ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
    ze_command_queue_handle_t q = NULL, qx = NULL;
    OK(zeCommandQueueCreate(e.ctx, e.dev[0], &qd, &q));
    qd.ordinal = 1;
    CHECK(zeCommandQueueCreate(e.ctx, e.dev[0], &qd, &qx), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    qd.ordinal = 0;
    qd.mode = 7;
    CHECK(zeCommandQueueCreate(e.ctx, e.dev[0], &qd, &qx), ZE_RESULT_ERROR_INVALID_ENUMERATION);
    qd.mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS;
    CHECK(zeCommandQueueCreate(e.ctx, e.dev[0], NULL, &qx), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    CHECK(zeCommandQueueCreate(e.ctx, BOGUS(ze_device_handle_t), &qd, &qx), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    EXPECT(qx == NULL);

    ze_command_list_desc_t ld = {ZE_STRUCTURE_TYPE_COMMAND_LIST_DESC, NULL, 0, 0};
    ze_command_list_handle_t l = NULL, lx = NULL;
    OK(zeCommandListCreate(e.ctx, e.dev[0], &ld, &l));
    ld.commandQueueGroupOrdinal = 3;
    CHECK(zeCommandListCreate(e.ctx, e.dev[0], &ld, &lx), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    ld.commandQueueGroupOrdinal = 0;

    ze_event_pool_desc_t pd = {ZE_STRUCTURE_TYPE_EVENT_POOL_DESC, NULL, ZE_EVENT_POOL_FLAG_HOST_VISIBLE, 4};
    ze_event_pool_handle_t pool = NULL, px = NULL;
    OK(zeEventPoolCreate(e.ctx, &pd, 1, e.dev, &pool));
    pd.count = 0;
    CHECK_V(zeEventPoolCreate(e.ctx, &pd, 0, NULL, &px), ZE_RESULT_ERROR_INVALID_SIZE, ZE_RESULT_ERROR_INVALID_SIZE);
    pd.count = 4;
    ze_event_desc_t ed = {ZE_STRUCTURE_TYPE_EVENT_DESC, NULL, 0, ZE_EVENT_SCOPE_FLAG_HOST, ZE_EVENT_SCOPE_FLAG_HOST};
    ze_event_handle_t ev[4] = {0}, evx = NULL;
    for (uint32_t i = 0; i < 4; i++) {
        ed.index = i;
        OK(zeEventCreate(pool, &ed, &ev[i]));
    }
    ed.index = 4;
    CHECK(zeEventCreate(pool, &ed, &evx), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* past count */
    ed.index = 1;
    CHECK(zeEventCreate(pool, &ed, &evx), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* slot in use */
    EXPECT(evx == NULL);
    {
        /* A pool of 2^32 - 1 events costs nothing until its events are made: its last index
         * works, and the pool goes with its one event. */
        ze_event_pool_desc_t big = pd;
        big.count = 0xffffffffu;
        ze_event_pool_handle_t bp = NULL;
        ze_event_handle_t be = NULL;
        OK(zeEventPoolCreate(e.ctx, &big, 1, e.dev, &bp));
        ze_event_desc_t bd = ed;
        bd.index = 0xfffffffeu;
        OK(zeEventCreate(bp, &bd, &be));
        OK(zeEventHostSignal(be));
        OK(zeEventQueryStatus(be));
        OK(zeEventDestroy(be));
        OK(zeEventPoolDestroy(bp));
    }

    void *src = NULL, *dst = NULL, *dev = NULL;
    OK(zeMemAllocHost(e.ctx, &HOST_DESC, N, 0, &src));
    OK(zeMemAllocHost(e.ctx, &HOST_DESC, N, 0, &dst));
    OK(zeMemAllocDevice(e.ctx, &DEV_DESC, N, 0, e.dev[0], &dev));
    for (size_t i = 0; i < N; i++) ((unsigned char *)src)[i] = (unsigned char)(i * 7);

    /* host -> device -> host, a fill of the tail with a 4-byte pattern, a barrier, a signal */
    OK(zeCommandListAppendMemoryCopy(l, dev, src, N, NULL, 0, NULL));
    OK(zeCommandListAppendBarrier(l, NULL, 0, NULL));
    OK(zeCommandListAppendMemoryCopy(l, dst, dev, N, NULL, 0, NULL));
    uint32_t pat = 0xdeadbeef;
    OK(zeCommandListAppendMemoryFill(l, (char *)dst + N - 4096, &pat, 4, 4096, NULL, 0, NULL));
    OK(zeCommandListAppendSignalEvent(l, ev[0]));
    /* errors of appends: nothing appended */
    CHECK(zeCommandListAppendMemoryFill(l, dst, &pat, 3, 64, NULL, 0, NULL), ZE_RESULT_ERROR_INVALID_SIZE);
    CHECK(zeCommandListAppendMemoryFill(l, dst, &pat, 1u << 30, 64, NULL, 0, NULL), ZE_RESULT_ERROR_INVALID_SIZE);
    CHECK(zeCommandListAppendMemoryFill(l, dst, NULL, 4, 64, NULL, 0, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    /* memory of no kind: a page that is never mapped (system memory is an operand: case 1,
     * cases_sysmem.c) */
    CHECK(zeCommandListAppendMemoryCopy(l, dst, (void *)(uintptr_t)4096, 64, NULL, 0, NULL), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    CHECK(zeCommandListAppendMemoryCopy(l, dst, src, N + 1, NULL, 0, NULL), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    CHECK_V(zeCommandListAppendMemoryCopy(l, NULL, src, 16, NULL, 0, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER,
            ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    CHECK(zeCommandListAppendMemoryCopy(l, dst, src, 16, NULL, 2, NULL), ZE_RESULT_ERROR_INVALID_SIZE);
    CHECK(zeCommandListAppendMemoryCopy(l, dst, src, 16, BOGUS(ze_event_handle_t), 0, NULL), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    CHECK(zeCommandListAppendSignalEvent(l, BOGUS(ze_event_handle_t)), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    {
        /* Objects of one context only: an event, or a list, of another context is refused
         * (INVALID_ARGUMENT) and nothing is appended or submitted. */
        ze_context_desc_t cd = {ZE_STRUCTURE_TYPE_CONTEXT_DESC, NULL, 0};
        ze_context_handle_t c2 = NULL;
        OK(zeContextCreate(e.drv, &cd, &c2));
        ze_event_pool_handle_t p2 = NULL;
        ze_event_handle_t e2 = NULL;
        OK(zeEventPoolCreate(c2, &pd, 0, NULL, &p2));
        ze_event_desc_t d2 = ed;
        d2.index = 0;
        OK(zeEventCreate(p2, &d2, &e2));
        CHECK(zeCommandListAppendSignalEvent(l, e2), ZE_RESULT_ERROR_INVALID_ARGUMENT);
        CHECK(zeCommandListAppendWaitOnEvents(l, 1, &e2), ZE_RESULT_ERROR_INVALID_ARGUMENT);
        CHECK(zeCommandListAppendBarrier(l, e2, 0, NULL), ZE_RESULT_ERROR_INVALID_ARGUMENT);
        CHECK(zeCommandListAppendMemoryCopy(l, dst, src, 16, NULL, 1, &e2), ZE_RESULT_ERROR_INVALID_ARGUMENT);
        ze_command_list_handle_t l2 = NULL;
        OK(zeCommandListCreate(c2, e.dev[0], &ld, &l2));
        OK(zeCommandListClose(l2));
        CHECK(zeCommandQueueExecuteCommandLists(q, 1, &l2, NULL), ZE_RESULT_ERROR_INVALID_ARGUMENT);
        /* nothing was appended to l: e2 is never signalled by it, and not waited on */
        OK(zeEventDestroy(e2));
        OK(zeCommandListDestroy(l2));
        OK(zeEventPoolDestroy(p2));
        OK(zeContextDestroy(c2));
    }
    /* executing an open list is refused */
    CHECK(zeCommandQueueExecuteCommandLists(q, 1, &l, NULL), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    OK(zeCommandListClose(l));
    CHECK(zeCommandListAppendBarrier(l, NULL, 0, NULL), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* closed */

    ze_fence_desc_t fd = {ZE_STRUCTURE_TYPE_FENCE_DESC, NULL, 0};
    ze_fence_handle_t f = NULL, fx = NULL;
    OK(zeFenceCreate(q, &fd, &f));
    CHECK(zeFenceQueryStatus(f), ZE_RESULT_NOT_READY);
    fd.flags = ZE_FENCE_FLAG_SIGNALED;
    /* a fence created signalled: ready at once, until it is reset */
    OK(zeFenceCreate(q, &fd, &fx));
    OK(zeFenceQueryStatus(fx));
    OK(zeFenceHostSynchronize(fx, 0));
    OK(zeFenceReset(fx));
    CHECK(zeFenceQueryStatus(fx), ZE_RESULT_NOT_READY);
    OK(zeFenceDestroy(fx));
    fx = NULL;
    fd.flags = 0x2;
    CHECK_V(zeFenceCreate(q, &fd, &fx), ZE_RESULT_ERROR_INVALID_ENUMERATION, ZE_RESULT_ERROR_INVALID_ENUMERATION);

    CHECK(zeEventQueryStatus(ev[0]), ZE_RESULT_NOT_READY);
    OK(zeCommandQueueExecuteCommandLists(q, 1, &l, f));
    OK(zeFenceHostSynchronize(f, WAIT));
    OK(zeFenceQueryStatus(f));
    OK(zeEventHostSynchronize(ev[0], WAIT));
    OK(zeEventQueryStatus(ev[0]));
    OK(zeCommandQueueSynchronize(q, WAIT));
    EXPECT(memcmp(dst, src, N - 4096) == 0);
    EXPECT(((uint32_t *)((char *)dst + N - 4096))[17] == 0xdeadbeef);
    /* execute again (lists are reusable), after a fence reset */
    OK(zeFenceReset(f));
    CHECK(zeFenceQueryStatus(f), ZE_RESULT_NOT_READY);
    memset(dst, 0, N);
    OK(zeEventHostReset(ev[0]));
    CHECK(zeEventQueryStatus(ev[0]), ZE_RESULT_NOT_READY);
    OK(zeCommandQueueExecuteCommandLists(q, 1, &l, f));
    OK(zeFenceHostSynchronize(f, WAIT));
    EXPECT(memcmp(dst, src, 4096) == 0);
    CHECK(zeCommandQueueExecuteCommandLists(q, 0, &l, NULL), ZE_RESULT_ERROR_INVALID_SIZE);
    CHECK_V(zeCommandQueueExecuteCommandLists(q, 1, NULL, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER,
            ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    ze_command_list_handle_t bogus_list = BOGUS(ze_command_list_handle_t);
    CHECK(zeCommandQueueExecuteCommandLists(q, 1, &bogus_list, NULL), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    OK(zeCommandListReset(l));
    OK(zeCommandListAppendBarrier(l, NULL, 0, NULL)); /* open again */
    OK(zeCommandListClose(l));

    /* events across an immediate list: a wait on an event the host signals later */
    ze_command_list_handle_t il = NULL;
    OK(zeCommandListCreateImmediate(e.ctx, e.dev[0], &qd, &il));
    CHECK(zeCommandQueueExecuteCommandLists(q, 1, &il, NULL), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* immediate */
    OK(zeCommandListAppendWaitOnEvents(il, 1, &ev[1]));
    OK(zeCommandListAppendMemoryFill(il, dst, &pat, 1, 4096, ev[2], 0, NULL));
    CHECK(zeEventHostSynchronize(ev[2], 20 * 1000 * 1000), ZE_RESULT_NOT_READY); /* 20 ms: still waiting */
    OK(zeEventHostSignal(ev[1]));
    OK(zeEventHostSynchronize(ev[2], WAIT));
    EXPECT(((unsigned char *)dst)[4095] == 0xef);
    CHECK(zeCommandListAppendWaitOnEvents(il, 0, &ev[1]), ZE_RESULT_ERROR_INVALID_SIZE);
    /* zeEventDestroy of an event that queued work waits on: HANDLE_OBJECT_IN_USE (the work, and
     * every unmap or free waiting for it, would wait forever); once the wait is over it goes. */
    OK(zeEventHostReset(ev[1]));
    OK(zeEventHostReset(ev[2]));
    OK(zeCommandListAppendMemoryFill(il, dst, &pat, 1, 4096, ev[2], 1, &ev[1]));
    CHECK(zeEventDestroy(ev[1]), ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);
    CHECK(zeEventPoolDestroy(pool), ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);
    OK(zeEventHostSignal(ev[1]));
    OK(zeEventHostSynchronize(ev[2], WAIT));
    OK(zeEventDestroy(ev[1])); /* right after the later signal of the same work: not in use */
    ed.index = 1;
    OK(zeEventCreate(pool, &ed, &ev[1]));
    size_t rsz = 4096;
    const void *rptr = dst;
    OK(zeCommandListAppendMemoryRangesBarrier(il, 1, &rsz, &rptr, ev[3], 0, NULL));
    OK(zeCommandListAppendMemoryPrefetch(il, dst, 4096));
    OK(zeCommandListAppendMemAdvise(il, e.dev[0], dst, 4096, ZE_MEMORY_ADVICE_SET_READ_MOSTLY));
    OK(zeEventHostSynchronize(ev[3], WAIT));
    /* a synchronous immediate list: each append has finished when it returns */
    ze_command_queue_desc_t sd = qd;
    sd.mode = ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS;
    ze_command_list_handle_t sl = NULL;
    OK(zeCommandListCreateImmediate(e.ctx, last_device(&e), &sd, &sl));
    memset(dst, 0, 64);
    OK(zeCommandListAppendMemoryCopy(sl, dst, src, 64, NULL, 0, NULL));
    EXPECT(memcmp(dst, src, 64) == 0);

    /* zeCommandListHostSynchronize (1.6) has no slot in the 1.4 loader: by name. */
    ze_result_t (*list_sync)(ze_command_list_handle_t, uint64_t) = NULL;
    MUST(zeDriverGetExtensionFunctionAddress(e.drv, "zeCommandListHostSynchronize", (void **)&list_sync));
    /* Free policies on real queued copies: a copy gated on an event the host signals later. */
    void *victim = NULL;
    ze_memory_free_ext_desc_t fdesc = {ZE_STRUCTURE_TYPE_MEMORY_FREE_EXT_DESC, NULL, 0};
    for (int policy = 0; policy < 3; policy++) {
        OK(zeMemAllocDevice(e.ctx, &DEV_DESC, N, 0, e.dev[0], &victim));
        const unsigned char v = (unsigned char)(0x11 * (policy + 1));
        OK(zeCommandListAppendMemoryFill(il, victim, &v, 1, N, NULL, 0, NULL)); /* device memory: by the device */
        OK(list_sync(il, WAIT));
        memset(dst, 0, N);
        OK(zeEventHostReset(ev[1]));
        gate_ev = ev[1];
        OK(zeCommandListAppendMemoryCopy(il, dst, victim, N, NULL, 1, &ev[1]));
        pthread_t t;
        pthread_create(&t, NULL, signal_later, (void *)(uintptr_t)150);
        double t0 = now_ms();
        fdesc.freePolicy = policy == 0 ? 0 : policy == 1 ? ZE_DRIVER_MEMORY_FREE_POLICY_EXT_FLAG_BLOCKING_FREE
                                                         : ZE_DRIVER_MEMORY_FREE_POLICY_EXT_FLAG_DEFER_FREE;
        OK(zeMemFreeExt(e.ctx, &fdesc, victim));
        double took = now_ms() - t0;
        if (policy == 1)
            EXPECT(took >= 100); /* BLOCKING waited for the gated copy */
        else
            EXPECT(took < 100); /* free-now and DEFER return at once */
        CHECK(zeMemFree(e.ctx, victim), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* invalid at once */
        OK(list_sync(il, WAIT));
        pthread_join(t, NULL);
        /* the copy read the memory as it was: nothing was released under it */
        EXPECT(((unsigned char *)dst)[0] == 0x11 * (policy + 1) && ((unsigned char *)dst)[N - 1] == 0x11 * (policy + 1));
    }

    /* destroy: queue, lists, events, pool, fence; destroyed handles are refused */
    OK(zeFenceDestroy(f));
    CHECK(zeFenceQueryStatus(f), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    OK(zeEventDestroy(ev[0]));
    CHECK(zeEventHostSignal(ev[0]), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    ed.index = 0;
    OK(zeEventCreate(pool, &ed, &ev[0])); /* the slot is free again */
    OK(zeCommandListDestroy(l));
    CHECK(zeCommandListClose(l), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    OK(zeCommandListDestroy(il));
    OK(zeCommandListDestroy(sl));
    ze_fence_handle_t f2 = NULL;
    OK(zeFenceCreate(q, &(ze_fence_desc_t){ZE_STRUCTURE_TYPE_FENCE_DESC, NULL, 0}, &f2));
    OK(zeCommandQueueDestroy(q));
    CHECK(zeCommandQueueSynchronize(q, 0), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    CHECK(zeFenceQueryStatus(f2), ZE_RESULT_ERROR_INVALID_NULL_HANDLE); /* went with its queue */
    OK(zeEventPoolDestroy(pool));
    CHECK(zeEventQueryStatus(ev[2]), ZE_RESULT_ERROR_INVALID_NULL_HANDLE); /* went with its pool */
    OK(zeMemFree(e.ctx, src));
    OK(zeMemFree(e.ctx, dst));
    OK(zeMemFree(e.ctx, dev));
    OK(zeContextDestroy(e.ctx));
    return finish("queue");
}
