/* Case 8 of shared/cases/level-zero.md: IPC of a mapping at an offset. Physical memory P of 4
 * pages, mapped at offset 2 pages into a reservation at VA v of 2 pages; zeMemGetIpcHandle(v)
 * (and of a pointer inside the mapping) -> the importer's view is the mapping: 2 pages, pages
 * 2..3 of P, the same bytes as the exporter at v, not page 0 of P. A mapping of the whole
 * object from offset 0 still shares the whole object. Pages are of the page size the query
 * gives for the object's size. */
#include "ipc_common.h"

static const size_t M2 = 2 << 20;

/* The page size of a 4-page object: stable under the query. */
static size_t object_page(env_t *e) {
    size_t B = page_size(e->ctx, e->dev[0], M2);
    for (int i = 0; i < 4; i++) {
        const size_t n = page_size(e->ctx, e->dev[0], 4 * B);
        if (n == B) break;
        B = n;
    }
    return B;
}

static int child(void) {
    env_t e = setup();
    dev_io_t io = dev_io(e.ctx, e.dev[0]);
    const size_t B = object_page(&e);
    ze_ipc_mem_handle_t h[3];
    recv_msg(h, sizeof h);
    for (int k = 0; k < 2; k++) { /* at v, and at v + B + 7: the same mapping */
        void *v = NULL;
        OK(zeMemOpenIpcHandle(e.ctx, e.dev[0], h[k], 0, &v));
        void *base = NULL;
        size_t size = 0;
        OK(zeMemGetAddressRange(e.ctx, v, &base, &size));
        EXPECT(base == v && size == 2 * B); /* the mapping, not the object */
        EXPECT(DEV_BYTE(&io, v) == 0x82 && DEV_BYTE(&io, (char *)v + B - 1) == 0x82);
        EXPECT(DEV_BYTE(&io, (char *)v + B) == 0x83 && DEV_BYTE(&io, (char *)v + 2 * B - 1) == 0x83);
        if (k == 0) OK(dev_fill(&io, (char *)v + 1, 0x5e, 1));
        OK(zeMemCloseIpcHandle(e.ctx, v));
    }
    /* the whole object mapped from offset 0: the whole object */
    void *w = NULL;
    OK(zeMemOpenIpcHandle(e.ctx, e.dev[0], h[2], 0, &w));
    void *base = NULL;
    size_t size = 0;
    OK(zeMemGetAddressRange(e.ctx, w, &base, &size));
    EXPECT(base == w && size == 4 * B);
    EXPECT(DEV_BYTE(&io, w) == 0x80 && DEV_BYTE(&io, (char *)w + 3 * B) == 0x83);
    OK(zeMemCloseIpcHandle(e.ctx, w));
    sync_byte();
    dev_io_done(&io);
    OK(zeContextDestroy(e.ctx));
    return finish("cases_ipc8 (child)");
}

int main(void) {
    pid_t pid = fork_child(child);
    env_t e = setup();
    ext_t x = ext(&e);
    dev_io_t io = dev_io(e.ctx, e.dev[0]);
    const size_t B = object_page(&e);
    ze_physical_mem_desc_t pd = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, NULL, 0, 4 * B};
    ze_physical_mem_handle_t ph = NULL;
    MUST(zePhysicalMemCreate(e.ctx, e.dev[0], &pd, &ph));
    /* all of P at w (page i holds 0x80 + i), pages 2..3 of P at v */
    void *w = NULL, *v = NULL;
    OK(zeVirtualMemReserve(e.ctx, (void *)(uintptr_t)(96ull << 30), 4 * B, &w));
    OK(zeVirtualMemReserve(e.ctx, (void *)(uintptr_t)(100ull << 30), 2 * B, &v));
    OK(zeVirtualMemMap(e.ctx, w, 4 * B, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    for (int i = 0; i < 4; i++) OK(dev_fill(&io, (char *)w + i * B, (unsigned char)(0x80 + i), B));
    OK(zeVirtualMemMap(e.ctx, v, 2 * B, ph, 2 * B, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    EXPECT(DEV_BYTE(&io, v) == 0x82); /* the exporter's own bytes at v */
    ze_ipc_mem_handle_t h[3];
    OK(zeMemGetIpcHandle(e.ctx, v, &h[0]));
    OK(zeMemGetIpcHandle(e.ctx, (char *)v + B + 7, &h[1]));
    OK(zeMemGetIpcHandle(e.ctx, w, &h[2]));
    send_msg(h, sizeof h, -1);
    wait_byte();
    EXPECT(DEV_BYTE(&io, (char *)v + 1) == 0x5e && DEV_BYTE(&io, (char *)w + 2 * B + 1) == 0x5e);
    for (int k = 0; k < 3; k++) OK(x.put(e.ctx, h[k]));
    OK(zeVirtualMemUnmap(e.ctx, v, 2 * B));
    OK(zeVirtualMemUnmap(e.ctx, w, 4 * B));
    OK(zeVirtualMemFree(e.ctx, v, 2 * B));
    OK(zeVirtualMemFree(e.ctx, w, 4 * B));
    OK(zePhysicalMemDestroy(e.ctx, ph));
    expect_child_ok(pid);
    dev_io_done(&io);
    OK(zeContextDestroy(e.ctx));
    return finish("cases_ipc8 (parent)");
}
