/* Case 6 of shared/cases/level-zero.md: get many, put many (the reference driver counts the
 * gets of one allocation on one handle).
 *  - zeMemGetIpcHandle of one device allocation N times (N = 1..8), then zeMemPutIpcHandle N
 *    times -> every put SUCCESS; a get after the last put -> SUCCESS (opened here: the bytes),
 *    and its put through another context of the same driver -> SUCCESS;
 *  - the same for physical memory mapped in a reservation (a get through the mapped VA);
 *  - a handle got twice and put once still opens in a child process; once put again it does
 *    not (INVALID_ARGUMENT);
 *  - 8 threads getting and putting handles of their own allocations at once -> all succeed. */
#include "ipc_common.h"
#include <pthread.h>

static const size_t M = 1 << 20, M2 = 2 << 20;

static int child(void) {
    env_t e = setup();
    dev_io_t io = dev_io(e.ctx, e.dev[0]);
    ze_ipc_mem_handle_t h;
    recv_msg(&h, sizeof h); /* got twice by the parent, put once */
    void *v = NULL;
    OK(zeMemOpenIpcHandle(e.ctx, e.dev[0], h, 0, &v));
    EXPECT(v && DEV_BYTE(&io, v) == 0x6c && DEV_BYTE(&io, (char *)v + M - 1) == 0x6c);
    OK(zeMemCloseIpcHandle(e.ctx, v));
    sync_byte();
    wait_byte(); /* the parent put it the second time */
    v = NULL;
    CHECK(zeMemOpenIpcHandle(e.ctx, e.dev[0], h, 0, &v), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    sync_byte();
    dev_io_done(&io);
    OK(zeContextDestroy(e.ctx));
    return finish("cases_ipc6 (child)");
}

/* N gets then N puts of the memory at p, N = 1..8; then a get whose view shows byte c, put
 * through context `other`. */
static void get_n_put_n(env_t *e, ext_t *x, dev_io_t *io, ze_context_handle_t other, void *p, unsigned char c) {
    for (int n = 1; n <= 8; n++) {
        ze_ipc_mem_handle_t h[8];
        for (int i = 0; i < n; i++) OK(zeMemGetIpcHandle(e->ctx, p, &h[i]));
        for (int i = 0; i < n; i++) OK(x->put(e->ctx, h[i]));
    }
    ze_ipc_mem_handle_t h;
    OK(zeMemGetIpcHandle(e->ctx, p, &h)); /* a get after the last put */
    void *v = NULL;
    OK(zeMemOpenIpcHandle(e->ctx, e->dev[0], h, 0, &v));
    EXPECT(v && DEV_BYTE(io, v) == c);
    OK(zeMemCloseIpcHandle(e->ctx, v));
    OK(x->put(other, h)); /* through another context of the same driver */
}

typedef struct {
    env_t *e;
    ext_t *x;
    int calls, fails;
} worker_t;
static void *worker(void *arg) {
    worker_t *w = arg;
    void *d = NULL;
    w->calls++;
    if (zeMemAllocDevice(w->e->ctx, &DEV_DESC, M, 0, w->e->dev[0], &d) != ZE_RESULT_SUCCESS) {
        w->fails++;
        return NULL;
    }
    for (int i = 0; i < 40; i++) {
        ze_ipc_mem_handle_t h[3];
        for (int k = 0; k < 3; k++, w->calls++)
            if (zeMemGetIpcHandle(w->e->ctx, d, &h[k]) != ZE_RESULT_SUCCESS) w->fails++;
        for (int k = 0; k < 3; k++, w->calls++)
            if (w->x->put(w->e->ctx, h[k]) != ZE_RESULT_SUCCESS) w->fails++;
    }
    w->calls++;
    if (zeMemFree(w->e->ctx, d) != ZE_RESULT_SUCCESS) w->fails++;
    return NULL;
}

int main(void) {
    pid_t pid = fork_child(child);
    env_t e = setup();
    ext_t x = ext(&e);
    dev_io_t io = dev_io(e.ctx, e.dev[0]);
    ze_context_desc_t cd = {ZE_STRUCTURE_TYPE_CONTEXT_DESC, NULL, 0};
    ze_context_handle_t other = NULL;
    MUST(zeContextCreate(e.drv, &cd, &other));

    /* a device allocation */
    void *d = NULL;
    MUST(zeMemAllocDevice(e.ctx, &DEV_DESC, M, 0, e.dev[0], &d));
    OK(dev_fill(&io, d, 0x6c, M));
    get_n_put_n(&e, &x, &io, other, d, 0x6c);

    /* got twice, put once: a child still opens it; put again: it does not */
    ze_ipc_mem_handle_t ha, hb;
    OK(zeMemGetIpcHandle(e.ctx, d, &ha));
    OK(zeMemGetIpcHandle(e.ctx, d, &hb));
    OK(x.put(e.ctx, ha));
    send_msg(&hb, sizeof hb, -1);
    wait_byte();
    OK(x.put(e.ctx, hb));
    sync_byte();
    wait_byte();

    /* physical memory mapped in a reservation, got through the mapped VA */
    const size_t P = page_size(e.ctx, e.dev[0], M2);
    void *r = NULL;
    OK(zeVirtualMemReserve(e.ctx, (void *)(uintptr_t)(96ull << 30), P, &r));
    ze_physical_mem_desc_t pd = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, NULL, 0, P};
    ze_physical_mem_handle_t ph = NULL;
    MUST(zePhysicalMemCreate(e.ctx, e.dev[0], &pd, &ph));
    OK(zeVirtualMemMap(e.ctx, r, P, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    OK(dev_fill(&io, r, 0x4d, P));
    get_n_put_n(&e, &x, &io, other, (char *)r + 100, 0x4d);
    OK(zeVirtualMemUnmap(e.ctx, r, P));
    OK(zeVirtualMemFree(e.ctx, r, P));
    OK(zePhysicalMemDestroy(e.ctx, ph));

    /* 8 threads, each getting and putting handles of its own allocation */
    pthread_t t[8];
    worker_t w[8];
    for (int i = 0; i < 8; i++) {
        w[i] = (worker_t){&e, &x, 0, 0};
        if (pthread_create(&t[i], NULL, worker, &w[i])) { perror("pthread_create"); return 3; }
    }
    int calls = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        EXPECT(w[i].fails == 0);
        calls += w[i].calls;
    }
    EXPECT(calls == 8 * (2 + 40 * 6));

    OK(zeMemFree(e.ctx, d));
    expect_child_ok(pid);
    dev_io_done(&io);
    OK(zeContextDestroy(other));
    OK(zeContextDestroy(e.ctx));
    return finish("cases_ipc6 (parent)");
}
