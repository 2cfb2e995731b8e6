/* Where userfaultfd is refused (here: a seccomp filter installed before aclInit), the managed
 * calls answer ACL_ERROR_RT_FEATURE_NOT_SUPPORT saying why, and everything else (device memory,
 * streams, events, virtual memory) still works. */
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include "check.h"

static void refuse_userfaultfd(void) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_userfaultfd, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 1 /* EPERM */),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    CHECK(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0);
    CHECK(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0);
}

int main(void) {
    refuse_userfaultfd();
    OK(aclInit(NULL));
    OK(aclrtSetDevice(0));
    void *m = (void *)0x1;
    EXPECT_CODE(aclrtMemAllocManaged(&m, 2 * MIB, ACL_RT_MEM_ATTACH_GLOBAL),
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    MSG_HAS("userfaultfd");
    CHECK(m == (void *)0x1);
    int32_t v = 0;
    char buf[64];
    EXPECT_CODE(aclrtMemManagedGetAttr(ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, buf, 64, &v, 4),
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT);

    /* Everything else works: device memory, a stream, events, host copies. */
    void *d = NULL, *h = NULL;
    OK(aclrtMalloc(&d, 4 * MIB, ACL_MEM_MALLOC_HUGE_FIRST));
    OK(aclrtMallocHost(&h, 4 * MIB));
    aclrtStream s = NULL;
    OK(aclrtCreateStream(&s));
    EXPECT_CODE(aclrtMemManagedPrefetchAsync(d, 2 * MIB, loc(ACL_MEM_LOCATIONTYPE_HOST, 0), 0, s),
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    aclrtEvent e = NULL;
    OK(aclrtCreateEvent(&e));
    OK(aclrtMemsetAsync(d, 4 * MIB, 0x3e, 4 * MIB, s));
    OK(aclrtRecordEvent(e, s));
    OK(aclrtStreamWaitEvent(s, e));
    OK(aclrtMemcpyAsync(h, 4 * MIB, d, 4 * MIB, ACL_MEMCPY_DEVICE_TO_HOST, s));
    OK(aclrtSynchronizeStream(s));
    OK(aclrtSynchronizeEvent(e));
    for (size_t i = 0; i < 4 * MIB; i += 4099) CHECK_EQ(((unsigned char *)h)[i], 0x3e);
    OK(aclrtMemcpy(buf, sizeof buf, d, sizeof buf, ACL_MEMCPY_DEVICE_TO_HOST));
    CHECK_EQ(buf[63], 0x3e);
    OK(aclrtDestroyEvent(e));
    OK(aclrtDestroyStream(s));
    OK(aclrtFree(d));
    OK(aclrtFreeHost(h));
    OK(aclFinalize());
    printf("managed unsupported ok\n");
    return 0;
}
