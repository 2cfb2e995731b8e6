/* IPC across two real processes through the loader, both ways that Level Zero programs use:
 *  A. parent exports device memory; the fd of the handle's first 4 bytes goes over SCM_RIGHTS
 *     with the 64 bytes; the child writes the received fd over bytes 0..4 and opens (and also
 *     rebuilds the handle from the fd with zeMemGetIpcHandleFromFileDescriptorExp: the fd
 *     identifies its memory on hetmem's host backend and is the export's description on its
 *     cuda backend; a driver answering UNSUPPORTED_FEATURE gets a NOT APPLICABLE line);
 *  B. child exports host memory (device memory where the driver answers UNSUPPORTED_FEATURE
 *     for host memory, as hetmem's cuda backend documents); the 64 bytes alone go over the
 *     socket as opaque data; the parent opens;
 *  C. a range handle (ze_ipc_phys_mem_handle_range_ext_desc_t) over two physical objects (of
 *     two devices where there are two), opened in the child with the plain zeMemOpenIpcHandle;
 *  D. a range over the same objects that starts and ends inside pages: the child's pointer is
 *     the range's first byte and its address range exactly the range.
 * Each side writes through its view and the other sees it: device memory through fills and
 * copies, host memory also through its pointers. Sizes of physical memory come from the
 * page-size query. The calls the 1.4 loader has no slot for come from
 * zeDriverGetExtensionFunctionAddress. */
#include "common.h"
#include "ze_hetmem.h"
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int sock;

static void send_msg(const void *buf, size_t len, int fd) {
    struct iovec iov = {(void *)buf, len};
    char ctl[CMSG_SPACE(sizeof(int))];
    memset(ctl, 0, sizeof ctl);
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    if (fd >= 0) {
        m.msg_control = ctl;
        m.msg_controllen = sizeof ctl;
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    if (sendmsg(sock, &m, 0) != (ssize_t)len) { perror("sendmsg"); exit(3); }
}
/* Receives len bytes; returns the fd that came with them, or -1. */
static int recv_msg(void *buf, size_t len) {
    struct iovec iov = {buf, len};
    char ctl[CMSG_SPACE(sizeof(int))];
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    if (recvmsg(sock, &m, MSG_WAITALL) != (ssize_t)len) { perror("recvmsg"); exit(3); }
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    int fd = -1;
    if (c && c->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}
static void sync_byte(void) { char b = 1; send_msg(&b, 1, -1); }
static void wait_byte(void) { char b; recv_msg(&b, 1); }

typedef struct {
    ze_hetmem_pfnMemPutIpcHandle_t put;
    ze_hetmem_pfnMemGetIpcHandleWithProperties_t getp;
    ze_hetmem_pfnMemGetIpcHandleFromFileDescriptorExp_t from_fd;
    ze_hetmem_pfnMemGetFileDescriptorFromIpcHandleExp_t to_fd;
} ext_t;
static ext_t ext(env_t *e) {
    ext_t x;
    MUST(zeDriverGetExtensionFunctionAddress(e->drv, "zeMemPutIpcHandle", (void **)&x.put));
    MUST(zeDriverGetExtensionFunctionAddress(e->drv, "zeMemGetIpcHandleWithProperties", (void **)&x.getp));
    MUST(zeDriverGetExtensionFunctionAddress(e->drv, "zeMemGetIpcHandleFromFileDescriptorExp", (void **)&x.from_fd));
    MUST(zeDriverGetExtensionFunctionAddress(e->drv, "zeMemGetFileDescriptorFromIpcHandleExp", (void **)&x.to_fd));
    return x;
}

static const size_t M = 1 << 20, M2 = 2 << 20;

/* C's physical objects: S = 2H bytes each, H a whole number of base pages (a range starts on
 * one) and S of pages of its size. Host backend: H = 1 MiB, S = 2 MiB; 2 MiB base pages: H = 2 MiB,
 * S = 4 MiB. The range is [H, H + S) of the two objects' 2 S. */
static size_t range_half(env_t *e) {
    const size_t b = page_size(e->ctx, e->dev[0], 1), p = page_size(e->ctx, e->dev[0], M2);
    return b > p / 2 ? b : p / 2;
}
/* B's message: the handle and the type of the memory exported. */
typedef struct {
    ze_ipc_mem_handle_t h;
    uint32_t type;
} b_msg_t;

static int child(void) {
    env_t e = setup();
    ext_t x = ext(&e);
    dev_io_t io = dev_io(e.ctx, e.dev[0]);
    /* A: 64 bytes + the fd over SCM_RIGHTS */
    ze_ipc_mem_handle_t h;
    int fd = recv_msg(&h, sizeof h);
    EXPECT(fd >= 0);
    memcpy(h.data, &fd, 4); /* the received fd over bytes 0..4 */
    void *v = NULL;
    OK(zeMemOpenIpcHandle(e.ctx, e.dev[0], h, 0, &v));
    EXPECT(v && DEV_BYTE(&io, (char *)v + M2 - 1) == 0xab);
    OK(dev_fill(&io, (char *)v + 100, 0x5c, 1)); /* written back through the view */
    uint64_t back = 0;
    OK(x.to_fd(e.ctx, h, &back));
    EXPECT((int)back == fd);
    ze_ipc_mem_handle_t h2;
    const ze_result_t fr = x.from_fd(e.ctx, (uint64_t)fd, &h2); /* the handle rebuilt from the fd alone */
    if (fr == ZE_RESULT_ERROR_UNSUPPORTED_FEATURE) {
        NOT_APPLICABLE("the handle rebuilt from a received fd alone",
                       "zeMemGetIpcHandleFromFileDescriptorExp answers UNSUPPORTED_FEATURE: the driver's shareable "
                       "fds do not identify their memory; the 64 bytes with the fd were opened instead");
    } else {
        CHECK(fr, ZE_RESULT_SUCCESS);
        void *v2 = NULL;
        OK(zeMemOpenIpcHandle(e.ctx, e.dev[0], h2, 0, &v2));
        EXPECT(v2 && v2 != v && DEV_BYTE(&io, (char *)v2 + 100) == 0x5c);
        OK(zeMemCloseIpcHandle(e.ctx, v2));
        back = 0;
        OK(x.to_fd(e.ctx, h2, &back));
        EXPECT((int)back == fd);
    }
    OK(zeMemCloseIpcHandle(e.ctx, v));
    close(fd);
    sync_byte();

    /* B: this side exports; the 64 bytes alone go to the parent */
    b_msg_t mb = {.type = ZE_MEMORY_TYPE_HOST};
    void *hm = NULL;
    OK(zeMemAllocHost(e.ctx, &HOST_DESC, M, 0, &hm));
    memset(hm, 0x3e, M);
    const ze_result_t gr = zeMemGetIpcHandle(e.ctx, hm, &mb.h);
    if (gr == ZE_RESULT_ERROR_UNSUPPORTED_FEATURE) {
        NOT_APPLICABLE("export of host memory (zeMemAllocHost) to another process",
                       "zeMemGetIpcHandle answers UNSUPPORTED_FEATURE for host memory: the driver has no shareable "
                       "handle for it; device memory is exported instead");
        OK(zeMemFree(e.ctx, hm));
        OK(zeMemAllocDevice(e.ctx, &DEV_DESC, M, 0, e.dev[0], &hm));
        OK(dev_fill(&io, hm, 0x3e, M));
        OK(zeMemGetIpcHandle(e.ctx, hm, &mb.h));
        mb.type = ZE_MEMORY_TYPE_DEVICE;
    } else {
        CHECK(gr, ZE_RESULT_SUCCESS);
    }
    send_msg(&mb, sizeof mb, -1);
    wait_byte();
    EXPECT(DEV_BYTE(&io, (char *)hm + M - 1) == 0x77); /* the parent wrote through its view */
    if (mb.type == ZE_MEMORY_TYPE_HOST) EXPECT(((unsigned char *)hm)[M - 1] == 0x77);
    OK(x.put(e.ctx, mb.h));
    CHECK(x.put(e.ctx, mb.h), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* already put */
    OK(zeMemFree(e.ctx, hm));

    /* C: a range handle, opened with the plain zeMemOpenIpcHandle */
    const size_t H = range_half(&e), S = 2 * H;
    ze_ipc_mem_handle_t hr;
    recv_msg(&hr, sizeof hr);
    void *vr = NULL;
    OK(zeMemOpenIpcHandle(e.ctx, e.dev[0], hr, 0, &vr));
    void *base = NULL;
    size_t size = 0;
    OK(zeMemGetAddressRange(e.ctx, vr, &base, &size));
    EXPECT(base == vr && size == S); /* self-describing: the whole range */
    char *b = vr;
    /* two objects in VA order */
    EXPECT(DEV_BYTE(&io, b) == 0x01 && DEV_BYTE(&io, b + H - 1) == 0x01 && DEV_BYTE(&io, b + H) == 0x02 &&
           DEV_BYTE(&io, b + S - 1) == 0x02);
    OK(dev_fill(&io, b + H + 10, 0x99, 1));
    OK(zeMemCloseIpcHandle(e.ctx, vr));
    sync_byte();

    /* D: a range that starts and ends inside pages ("an arbitrary offset within a mapped
     * range"): the returned pointer is the range's first byte and the view is exactly it */
    ze_ipc_mem_handle_t hd;
    recv_msg(&hd, sizeof hd);
    void *vd = NULL;
    OK(zeMemOpenIpcHandle(e.ctx, e.dev[0], hd, 0, &vd));
    OK(zeMemGetAddressRange(e.ctx, vd, &base, &size));
    EXPECT(base == vd && size == S - 300);
    char *c = vd;
    EXPECT(DEV_BYTE(&io, c) == 0x01 && DEV_BYTE(&io, c + (S - H - 101)) == 0x01 &&
           DEV_BYTE(&io, c + (S - H - 100)) == 0x02 && DEV_BYTE(&io, c + S - 301) == 0x02);
    OK(dev_fill(&io, c + 5, 0x55, 1));
    CHECK(zeMemCloseIpcHandle(e.ctx, c - 100), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* not the pointer open gave */
    OK(zeMemCloseIpcHandle(e.ctx, vd));
    sync_byte();
    wait_byte();
    dev_io_done(&io);
    OK(zeContextDestroy(e.ctx));
    return finish("ipc (child)");
}

int main(void) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) { perror("socketpair"); return 3; }
    fflush(stdout);
    pid_t pid = fork(); /* before zeInit: each process initialises its own driver */
    if (pid == 0) {
        close(sv[0]);
        sock = sv[1];
        exit(child());
    }
    close(sv[1]);
    sock = sv[0];
    env_t e = setup();
    ext_t x = ext(&e);
    dev_io_t io = dev_io(e.ctx, e.dev[0]);

    /* A */
    void *d = NULL;
    OK(zeMemAllocDevice(e.ctx, &DEV_DESC, M2, 0, e.dev[0], &d));
    OK(dev_fill(&io, d, 0xab, M2));
    ze_ipc_mem_handle_t h;
    OK(zeMemGetIpcHandle(e.ctx, d, &h));
    uint64_t fd64 = 0;
    OK(x.to_fd(e.ctx, h, &fd64));
    int fd;
    memcpy(&fd, h.data, 4);
    EXPECT((int)fd64 == fd); /* the fd is the handle's first 4 bytes */
    send_msg(&h, sizeof h, fd);
    wait_byte();
    EXPECT(DEV_BYTE(&io, (char *)d + 100) == 0x5c);
    OK(x.put(e.ctx, h));
    OK(zeMemFree(e.ctx, d));

    /* B: opened on the last device (device 1 where there are two) */
    b_msg_t mb;
    recv_msg(&mb, sizeof mb);
    void *vb = NULL;
    OK(zeMemOpenIpcHandle(e.ctx, last_device(&e), mb.h, 0, &vb));
    EXPECT(vb && DEV_BYTE(&io, vb) == 0x3e && DEV_BYTE(&io, (char *)vb + M - 2) == 0x3e);
    ze_memory_allocation_properties_t mp = {ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    OK(zeMemGetAllocProperties(e.ctx, vb, &mp, NULL));
    EXPECT(mp.type == (ze_memory_type_t)mb.type); /* the exported memory's type */
    if (mb.type == ZE_MEMORY_TYPE_HOST) {
        /* host memory: through the view's host pointer too */
        EXPECT(((unsigned char *)vb)[0] == 0x3e && ((unsigned char *)vb)[M - 2] == 0x3e);
        ((unsigned char *)vb)[M - 1] = 0x77;
    } else {
        OK(dev_fill(&io, (char *)vb + M - 1, 0x77, 1));
    }
    OK(zeMemCloseIpcHandle(e.ctx, vb));
    sync_byte();

    /* C: VA [r, r+2S) maps object 1 then object 2; the range [r+H, r+H+S) spans both */
    const size_t H = range_half(&e), S = 2 * H;
    void *const HINT = (void *)(uintptr_t)(96ull << 30);
    void *r = NULL;
    OK(zeVirtualMemReserve(e.ctx, HINT, 2 * S, &r));
    ze_physical_mem_desc_t pd = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, NULL, 0, S};
    ze_physical_mem_handle_t p1 = NULL, p2 = NULL;
    if (e.ndev < 2)
        NOT_APPLICABLE("a range handle over physical objects of two devices",
                       "only 1 device (needs 2); both objects are on device 0");
    OK(zePhysicalMemCreate(e.ctx, e.dev[0], &pd, &p1));
    OK(zePhysicalMemCreate(e.ctx, last_device(&e), &pd, &p2));
    OK(zeVirtualMemMap(e.ctx, r, S, p1, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    OK(zeVirtualMemMap(e.ctx, (char *)r + S, S, p2, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    OK(dev_fill(&io, r, 0x01, S));
    OK(dev_fill(&io, (char *)r + S, 0x02, S));
    ze_ipc_phys_mem_handle_range_ext_desc_t rd = {ZE_HETMEM_STYPE_IPC_PHYS_MEM_HANDLE_RANGE_EXT_DESC, NULL, S};
    ze_ipc_mem_handle_t hr;
    OK(x.getp(e.ctx, (char *)r + H, &rd, &hr));
    send_msg(&hr, sizeof hr, -1);
    wait_byte();
    EXPECT(DEV_BYTE(&io, (char *)r + S + 10) == 0x99); /* offset H+10 of the view */
    OK(x.put(e.ctx, hr));
    /* D: [r + H + 100, r + H + S - 200): starts and ends inside pages */
    ze_ipc_phys_mem_handle_range_ext_desc_t rd2 = {ZE_HETMEM_STYPE_IPC_PHYS_MEM_HANDLE_RANGE_EXT_DESC, NULL,
                                                   S - 300};
    ze_ipc_mem_handle_t hd;
    OK(x.getp(e.ctx, (char *)r + H + 100, &rd2, &hd));
    send_msg(&hd, sizeof hd, -1);
    wait_byte();
    EXPECT(DEV_BYTE(&io, (char *)r + H + 105) == 0x55); /* the child wrote its byte 5 */
    OK(x.put(e.ctx, hd));
    sync_byte();
    OK(zeVirtualMemUnmap(e.ctx, r, 2 * S));
    OK(zeVirtualMemFree(e.ctx, r, 2 * S));
    OK(zePhysicalMemDestroy(e.ctx, p1));
    OK(zePhysicalMemDestroy(e.ctx, p2));

    int st = 0;
    waitpid(pid, &st, 0);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    dev_io_done(&io);
    OK(zeContextDestroy(e.ctx));
    return finish("ipc (parent)");
}
