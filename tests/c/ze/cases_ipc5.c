/* Case 5 of shared/cases/level-zero.md: an IPC handle from a file descriptor, in another
 * process. The exporter (the parent) gets the IPC handle of device USM, and of physical memory
 * mapped in a reservation (zeMemGetIpcHandle on its VA), asks
 * zeMemGetFileDescriptorFromIpcHandleExp for its fd and sends that fd alone with SCM_RIGHTS (no
 * 64 bytes travel). The importer (the child): zeMemGetIpcHandleFromFileDescriptorExp(ctx, fd,
 * &h) -> SUCCESS; zeMemOpenIpcHandle(h) -> the exporter's bytes (it writes one back, the parent
 * sees it); zeMemCloseIpcHandle and zeMemPutIpcHandle(h) -> SUCCESS (the handle holds nothing
 * in the importer: the reference driver's answer). Where the driver answers UNSUPPORTED_FEATURE
 * for the handle from the fd, a NOT APPLICABLE line says so; anything else must be SUCCESS. */
#include "ipc_common.h"

static const size_t M2 = 2 << 20;

static int child(void) {
    env_t e = setup();
    ext_t x = ext(&e);
    dev_io_t io = dev_io(e.ctx, e.dev[0]);
    for (int k = 0; k < 2; k++) {
        size_t size = 0;
        const int fd = recv_msg(&size, sizeof size);
        EXPECT(fd >= 0);
        ze_ipc_mem_handle_t h;
        char opened = 0;
        const ze_result_t r = x.from_fd(e.ctx, (uint64_t)fd, &h);
        if (r == ZE_RESULT_ERROR_UNSUPPORTED_FEATURE) {
            NOT_APPLICABLE(k ? "the handle of mapped physical memory rebuilt from a received fd"
                             : "the handle of device USM rebuilt from a received fd",
                           "zeMemGetIpcHandleFromFileDescriptorExp answers UNSUPPORTED_FEATURE: the driver's "
                           "shareable fds do not identify their memory");
        } else {
            CHECK(r, ZE_RESULT_SUCCESS);
            uint64_t back = 0;
            OK(x.to_fd(e.ctx, h, &back));
            EXPECT((int)back == fd);
            void *v = NULL;
            OK(zeMemOpenIpcHandle(e.ctx, e.dev[0], h, 0, &v));
            if (v) {
                EXPECT(DEV_BYTE(&io, v) == 0x50 + k && DEV_BYTE(&io, (char *)v + size - 1) == 0x50 + k);
                OK(dev_fill(&io, (char *)v + 9, 0x70 + k, 1));
                OK(zeMemCloseIpcHandle(e.ctx, v));
                opened = 1;
            }
            OK(x.put(e.ctx, h));
        }
        close(fd);
        send_msg(&opened, 1, -1);
    }
    dev_io_done(&io);
    OK(zeContextDestroy(e.ctx));
    return finish("cases_ipc5 (child)");
}

int main(void) {
    pid_t pid = fork_child(child);
    env_t e = setup();
    ext_t x = ext(&e);
    dev_io_t io = dev_io(e.ctx, e.dev[0]);
    const size_t P = page_size(e.ctx, e.dev[0], M2);
    /* device USM */
    void *dm = NULL;
    MUST(zeMemAllocDevice(e.ctx, &DEV_DESC, M2, 0, e.dev[0], &dm));
    OK(dev_fill(&io, dm, 0x50, M2));
    /* physical memory mapped in a reservation */
    ze_physical_mem_desc_t pd = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, NULL, 0, P};
    ze_physical_mem_handle_t ph = NULL;
    MUST(zePhysicalMemCreate(e.ctx, e.dev[0], &pd, &ph));
    void *r = NULL;
    MUST(zeVirtualMemReserve(e.ctx, (void *)(uintptr_t)(112ull << 30), P, &r));
    MUST(zeVirtualMemMap(e.ctx, r, P, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    OK(dev_fill(&io, r, 0x51, P));
    void *const at[2] = {dm, r};
    const size_t size[2] = {M2, P};
    for (int k = 0; k < 2; k++) {
        ze_ipc_mem_handle_t h;
        OK(zeMemGetIpcHandle(e.ctx, at[k], &h));
        uint64_t fd = 0;
        OK(x.to_fd(e.ctx, h, &fd));
        send_msg(&size[k], sizeof size[k], (int)fd); /* the fd, and the size for the checks */
        char opened = 0;
        recv_msg(&opened, 1);
        /* the child's byte where it opened the handle; the pattern where it could not (it
         * printed why) */
        EXPECT(DEV_BYTE(&io, (char *)at[k] + 9) == (opened ? 0x70 + k : 0x50 + k));
        EXPECT(DEV_BYTE(&io, (char *)at[k] + 10) == 0x50 + k);
        OK(x.put(e.ctx, h));
    }
    expect_child_ok(pid);
    OK(zeVirtualMemUnmap(e.ctx, r, P));
    OK(zeVirtualMemFree(e.ctx, r, P));
    OK(zePhysicalMemDestroy(e.ctx, ph));
    OK(zeMemFree(e.ctx, dm));
    dev_io_done(&io);
    OK(zeContextDestroy(e.ctx));
    return finish("cases_ipc5 (parent)");
}
