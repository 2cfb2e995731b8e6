/* Where userfaultfd is refused (here: a seccomp filter installed before aclInit), the managed
 * calls answer ACL_ERROR_RT_FEATURE_NOT_SUPPORT saying why, and everything else (device memory,
 * streams, events, virtual memory) still works.
 *
 * Managed memory that does not need userfaultfd (the cuda backend's is cuMemAllocManaged)
 * still allocates under the filter: then the "managed is unsupported" part does not apply (the
 * program says so), the managed calls are checked to answer as they do where managed memory
 * works, and the rest is checked as above. */
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
    aclError managed = aclrtMemAllocManaged(&m, 2 * MIB, ACL_RT_MEM_ATTACH_GLOBAL);
    /* The code managed calls on memory that is not managed answer: 207000 while managed memory
     * is unsupported, 107000 (not managed memory) where it works. */
    aclError not_managed = ACL_ERROR_RT_FEATURE_NOT_SUPPORT;
    int32_t v = 0;
    char buf[64];
    if (managed == ACL_SUCCESS) {
        NA_PART("managed calls answer 207000 without userfaultfd",
                "managed memory does not use userfaultfd here (aclrtMemAllocManaged succeeded "
                "under the seccomp filter refusing it)");
        CHECK(m != NULL && m != (void *)0x1);
        /* Managed memory works as anywhere: filled, read back, its attributes answered. */
        OK(aclrtMemset(m, 2 * MIB, 0x2b, 2 * MIB));
        EXPECT_BYTES(m, 2 * MIB, 0x2b, "managed memory under the filter");
        CHECK_EQ(attr_i32(ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, 2 * MIB), 0);
        OK(aclrtFree(m));
        not_managed = ACL_ERROR_RT_PARAM_INVALID;
    } else {
        EXPECT_CODE(managed, ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
        MSG_HAS("userfaultfd");
        CHECK(m == (void *)0x1);
    }
    EXPECT_CODE(aclrtMemManagedGetAttr(ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, buf, 64, &v, 4),
                not_managed);

    /* Everything else works: device memory, a stream, events, host copies. */
    void *d = NULL, *h = NULL;
    OK(aclrtMalloc(&d, 4 * MIB, ACL_MEM_MALLOC_HUGE_FIRST));
    OK(aclrtMallocHost(&h, 4 * MIB));
    aclrtStream s = NULL;
    OK(aclrtCreateStream(&s));
    EXPECT_CODE(aclrtMemManagedPrefetchAsync(d, 2 * MIB, loc(ACL_MEM_LOCATIONTYPE_HOST, 0), 0, s),
                not_managed);
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
