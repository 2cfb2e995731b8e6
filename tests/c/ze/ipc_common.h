/* Shared helpers of the IPC case programs (cases_ipc*.c): a Unix socket to the forked child
 * (messages with an optional fd over SCM_RIGHTS), and the IPC calls the 1.4 loader has no slot
 * for, from zeDriverGetExtensionFunctionAddress. Fork before zeInit: each process initialises
 * its own driver. */
#ifndef HETMEM_ZE_TEST_IPC_COMMON_H
#define HETMEM_ZE_TEST_IPC_COMMON_H
#include "common.h"
#include "ze_hetmem.h"
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int sock = -1;

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

/* Forks the child (before zeInit) and runs child_main in it; the parent gets the child's pid
 * and keeps the other end of the socket. */
static pid_t fork_child(int (*child_main)(void)) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) { perror("socketpair"); exit(3); }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); exit(3); }
    if (pid == 0) {
        close(sv[0]);
        sock = sv[1];
        exit(child_main());
    }
    close(sv[1]);
    sock = sv[0];
    return pid;
}
/* Waits for the child; a failure if it did not exit 0. */
static void expect_child_ok(pid_t pid) {
    int st = 0;
    waitpid(pid, &st, 0);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}
#endif
