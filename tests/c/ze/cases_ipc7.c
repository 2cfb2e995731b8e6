/* Case 7 of shared/cases/level-zero.md: a physical memory handle as the pointer.
 * zeMemGetIpcHandleWithProperties(ctx, (const void *)hPhysicalMemory, <handle-type desc
 * DEFAULT>, &h) for physical memory that is mapped nowhere -> SUCCESS (the reference driver
 * accepts it; programs share physical memory before mapping it); so does the plain
 * zeMemGetIpcHandle. A child process opens the handle (the open maps it) and reads the
 * parent's bytes, and writes one the parent then sees through a mapping of its own. */
#include "ipc_common.h"

static const size_t M2 = 2 << 20;

static int child(void) {
    env_t e = setup();
    dev_io_t io = dev_io(e.ctx, e.dev[0]);
    ze_ipc_mem_handle_t h[2];
    size_t P = 0;
    recv_msg(h, sizeof h);
    recv_msg(&P, sizeof P);
    for (int k = 0; k < 2; k++) {
        void *v = NULL;
        OK(zeMemOpenIpcHandle(e.ctx, e.dev[0], h[k], 0, &v));
        EXPECT(v && DEV_BYTE(&io, v) == 0x7a && DEV_BYTE(&io, (char *)v + P - 1) == 0x7a);
        void *base = NULL;
        size_t size = 0;
        OK(zeMemGetAddressRange(e.ctx, v, &base, &size));
        EXPECT(base == v && size == P); /* the whole physical object */
        if (k == 0) OK(dev_fill(&io, (char *)v + 5, 0x17, 1));
        OK(zeMemCloseIpcHandle(e.ctx, v));
    }
    sync_byte();
    dev_io_done(&io);
    OK(zeContextDestroy(e.ctx));
    return finish("cases_ipc7 (child)");
}

int main(void) {
    pid_t pid = fork_child(child);
    env_t e = setup();
    ext_t x = ext(&e);
    dev_io_t io = dev_io(e.ctx, e.dev[0]);
    const size_t P = page_size(e.ctx, e.dev[0], M2);
    ze_physical_mem_desc_t pd = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, NULL, 0, P};
    ze_physical_mem_handle_t ph = NULL;
    MUST(zePhysicalMemCreate(e.ctx, e.dev[0], &pd, &ph));
    /* the bytes are written through a mapping that is gone before the get */
    void *r = NULL;
    OK(zeVirtualMemReserve(e.ctx, (void *)(uintptr_t)(96ull << 30), P, &r));
    OK(zeVirtualMemMap(e.ctx, r, P, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    OK(dev_fill(&io, r, 0x7a, P));
    OK(zeVirtualMemUnmap(e.ctx, r, P));

    ze_ipc_mem_handle_type_ext_desc_t td = {ZE_HETMEM_STYPE_IPC_MEM_HANDLE_TYPE_EXT_DESC, NULL,
                                            ZE_HETMEM_IPC_MEM_HANDLE_TYPE_FLAG_DEFAULT};
    ze_ipc_mem_handle_t h[2];
    OK(x.getp(e.ctx, (const void *)ph, &td, &h[0]));
    OK(zeMemGetIpcHandle(e.ctx, (const void *)ph, &h[1]));
    /* a physical memory handle of another context is no pointer of this one */
    ze_context_desc_t cd = {ZE_STRUCTURE_TYPE_CONTEXT_DESC, NULL, 0};
    ze_context_handle_t other = NULL;
    MUST(zeContextCreate(e.drv, &cd, &other));
    ze_ipc_mem_handle_t ho;
    CHECK(x.getp(other, (const void *)ph, &td, &ho), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    OK(zeContextDestroy(other));
    send_msg(h, sizeof h, -1);
    send_msg(&P, sizeof P, -1);
    wait_byte();
    /* the child's byte, through a new mapping */
    OK(zeVirtualMemMap(e.ctx, r, P, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    EXPECT(DEV_BYTE(&io, (char *)r + 5) == 0x17 && DEV_BYTE(&io, (char *)r + 6) == 0x7a);
    OK(zeVirtualMemUnmap(e.ctx, r, P));
    OK(x.put(e.ctx, h[0]));
    OK(x.put(e.ctx, h[1]));
    OK(zeVirtualMemFree(e.ctx, r, P));
    OK(zePhysicalMemDestroy(e.ctx, ph));
    expect_child_ok(pid);
    dev_io_done(&io);
    OK(zeContextDestroy(e.ctx));
    return finish("cases_ipc7 (parent)");
}
