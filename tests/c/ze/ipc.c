/* IPC across two real processes through the loader, both ways that Level Zero programs use:
 *  A. parent exports; the fd of the handle's first 4 bytes goes over SCM_RIGHTS with the 64
 *     bytes; the child writes the received fd over bytes 0..4 and opens (and also rebuilds the
 *     handle from the fd with zeMemGetIpcHandleFromFileDescriptorExp);
 *  B. child exports; the 64 bytes alone go over the socket as opaque data; the parent opens;
 *  C. a range handle (ze_ipc_phys_mem_handle_range_ext_desc_t) over two physical objects,
 *     opened in the child with the plain zeMemOpenIpcHandle.
 * Each side writes through its view and the other sees it. The calls the 1.4 loader has no
 * slot for come from zeDriverGetExtensionFunctionAddress. */
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

static int child(void) {
    env_t e = setup();
    ext_t x = ext(&e);
    /* A: 64 bytes + the fd over SCM_RIGHTS */
    ze_ipc_mem_handle_t h;
    int fd = recv_msg(&h, sizeof h);
    EXPECT(fd >= 0);
    memcpy(h.data, &fd, 4); /* the received fd over bytes 0..4 */
    void *v = NULL;
    OK(zeMemOpenIpcHandle(e.ctx, e.dev[0], h, 0, &v));
    EXPECT(v && ((unsigned char *)v)[M2 - 1] == 0xab);
    ((unsigned char *)v)[100] = 0x5c; /* written back through the view */
    ze_ipc_mem_handle_t h2;
    OK(x.from_fd(e.ctx, (uint64_t)fd, &h2)); /* the handle rebuilt from the fd alone */
    void *v2 = NULL;
    OK(zeMemOpenIpcHandle(e.ctx, e.dev[0], h2, 0, &v2));
    EXPECT(v2 && v2 != v && ((unsigned char *)v2)[100] == 0x5c);
    OK(zeMemCloseIpcHandle(e.ctx, v2));
    uint64_t back = 0;
    OK(x.to_fd(e.ctx, h2, &back));
    EXPECT((int)back == fd);
    OK(zeMemCloseIpcHandle(e.ctx, v));
    close(fd);
    sync_byte();

    /* B: this side exports; the 64 bytes alone go to the parent */
    void *hm = NULL;
    OK(zeMemAllocHost(e.ctx, &HOST_DESC, M, 0, &hm));
    memset(hm, 0x3e, M);
    ze_ipc_mem_handle_t hb;
    OK(zeMemGetIpcHandle(e.ctx, hm, &hb));
    send_msg(&hb, sizeof hb, -1);
    wait_byte();
    EXPECT(((unsigned char *)hm)[M - 1] == 0x77); /* the parent wrote through its view */
    OK(x.put(e.ctx, hb));
    CHECK(x.put(e.ctx, hb), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* already put */
    OK(zeMemFree(e.ctx, hm));

    /* C: a range handle, opened with the plain zeMemOpenIpcHandle */
    ze_ipc_mem_handle_t hr;
    recv_msg(&hr, sizeof hr);
    void *vr = NULL;
    OK(zeMemOpenIpcHandle(e.ctx, e.dev[0], hr, 0, &vr));
    void *base = NULL;
    size_t size = 0;
    OK(zeMemGetAddressRange(e.ctx, vr, &base, &size));
    EXPECT(base == vr && size == M2); /* self-describing: the whole range */
    unsigned char *b = vr;
    EXPECT(b[0] == 0x01 && b[M - 1] == 0x01 && b[M] == 0x02 && b[M2 - 1] == 0x02); /* two objects in VA order */
    b[M + 10] = 0x99;
    OK(zeMemCloseIpcHandle(e.ctx, vr));
    sync_byte();
    wait_byte();
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

    /* A */
    void *d = NULL;
    OK(zeMemAllocDevice(e.ctx, &DEV_DESC, M2, 0, e.dev[0], &d));
    memset(d, 0xab, M2);
    ze_ipc_mem_handle_t h;
    OK(zeMemGetIpcHandle(e.ctx, d, &h));
    uint64_t fd64 = 0;
    OK(x.to_fd(e.ctx, h, &fd64));
    int fd;
    memcpy(&fd, h.data, 4);
    EXPECT((int)fd64 == fd); /* the fd is the handle's first 4 bytes */
    send_msg(&h, sizeof h, fd);
    wait_byte();
    EXPECT(((unsigned char *)d)[100] == 0x5c);
    OK(x.put(e.ctx, h));
    OK(zeMemFree(e.ctx, d));

    /* B */
    ze_ipc_mem_handle_t hb;
    recv_msg(&hb, sizeof hb);
    void *vb = NULL;
    OK(zeMemOpenIpcHandle(e.ctx, e.dev[1], hb, 0, &vb));
    EXPECT(vb && ((unsigned char *)vb)[0] == 0x3e && ((unsigned char *)vb)[M - 2] == 0x3e);
    ((unsigned char *)vb)[M - 1] = 0x77;
    ze_memory_allocation_properties_t mp = {ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    OK(zeMemGetAllocProperties(e.ctx, vb, &mp, NULL));
    EXPECT(mp.type == ZE_MEMORY_TYPE_HOST); /* the exported memory's type */
    OK(zeMemCloseIpcHandle(e.ctx, vb));
    sync_byte();

    /* C: VA [r, r+4M) maps object 1 then object 2; the range [r+1M, r+3M) spans both */
    void *const HINT = (void *)(uintptr_t)(96ull << 30);
    void *r = NULL;
    OK(zeVirtualMemReserve(e.ctx, HINT, 2 * M2, &r));
    ze_physical_mem_desc_t pd = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, NULL, 0, M2};
    ze_physical_mem_handle_t p1 = NULL, p2 = NULL;
    OK(zePhysicalMemCreate(e.ctx, e.dev[0], &pd, &p1));
    OK(zePhysicalMemCreate(e.ctx, e.dev[1], &pd, &p2));
    OK(zeVirtualMemMap(e.ctx, r, M2, p1, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    OK(zeVirtualMemMap(e.ctx, (char *)r + M2, M2, p2, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    memset(r, 0x01, M2);
    memset((char *)r + M2, 0x02, M2);
    ze_ipc_phys_mem_handle_range_ext_desc_t rd = {ZE_HETMEM_STYPE_IPC_PHYS_MEM_HANDLE_RANGE_EXT_DESC, NULL, M2};
    ze_ipc_mem_handle_t hr;
    OK(x.getp(e.ctx, (char *)r + M, &rd, &hr));
    send_msg(&hr, sizeof hr, -1);
    wait_byte();
    EXPECT(((unsigned char *)r)[M2 + 10] == 0x99); /* offset M+10 of the view */
    OK(x.put(e.ctx, hr));
    sync_byte();
    OK(zeVirtualMemUnmap(e.ctx, r, 2 * M2));
    OK(zeVirtualMemFree(e.ctx, r, 2 * M2));
    OK(zePhysicalMemDestroy(e.ctx, p1));
    OK(zePhysicalMemDestroy(e.ctx, p2));

    int st = 0;
    waitpid(pid, &st, 0);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    OK(zeContextDestroy(e.ctx));
    return finish("ipc (parent)");
}
