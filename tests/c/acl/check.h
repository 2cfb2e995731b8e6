/* Helpers of the ACL C tests: each check prints the failing expression, the code and the
 * library's message, then exits 1. A test that cannot run here exits 77 after printing
 * "SKIP: <reason>" (the Rust runner reports it loudly). */
#ifndef HETMEM_ACL_TEST_CHECK_H
#define HETMEM_ACL_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"

#define SKIP_EXIT 77

#define FAILF(...)                                                                         \
    do {                                                                                   \
        fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                   \
        fprintf(stderr, __VA_ARGS__);                                                      \
        fprintf(stderr, "\n  last message: %s\n", aclGetRecentErrMsg());                  \
        exit(1);                                                                           \
    } while (0)

/* The call returns `want`. */
#define EXPECT_CODE(call, want)                                                            \
    do {                                                                                   \
        aclError got_ = (call);                                                            \
        if (got_ != (aclError)(want))                                                      \
            FAILF("%s returned %d, expected %d (%s)", #call, got_, (int)(want), #want);   \
    } while (0)

#define OK(call) EXPECT_CODE(call, ACL_SUCCESS)

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (!(cond))                                                                       \
            FAILF("check failed: %s", #cond);                                              \
    } while (0)

#define CHECK_EQ(a, b)                                                                     \
    do {                                                                                   \
        long long a_ = (long long)(a), b_ = (long long)(b);                                \
        if (a_ != b_)                                                                      \
            FAILF("%s == %lld, expected %s == %lld", #a, a_, #b, b_);                    \
    } while (0)

/* The last failure's message mentions `needle` (messages name the bad value). */
#define MSG_HAS(needle)                                                                    \
    do {                                                                                   \
        if (!strstr(aclGetRecentErrMsg(), (needle)))                                       \
            FAILF("message does not mention \"%s\"", (needle));                            \
    } while (0)

#define MIB (1024UL * 1024UL)

/* Managed memory needs userfaultfd; where the platform refuses it, aclrtMemAllocManaged
 * answers ACL_ERROR_RT_FEATURE_NOT_SUPPORT and the program skips with the library's reason. */
static inline void *managed_or_skip(uint64_t size) {
    void *p = NULL;
    aclError e = aclrtMemAllocManaged(&p, size, ACL_RT_MEM_ATTACH_GLOBAL);
    if (e == ACL_ERROR_RT_FEATURE_NOT_SUPPORT) {
        printf("SKIP: managed memory unavailable here: %s\n", aclGetRecentErrMsg());
        exit(SKIP_EXIT);
    }
    if (e != ACL_SUCCESS)
        FAILF("aclrtMemAllocManaged(%llu) returned %d", (unsigned long long)size, e);
    return p;
}

static inline aclrtMemManagedLocation loc(aclrtMemManagedLocationType t, int32_t id) {
    aclrtMemManagedLocation l;
    l.type = t;
    l.id = id;
    return l;
}

static inline int32_t attr_i32(aclrtMemManagedRangeAttribute a, const void *p, size_t size) {
    int32_t v = 0x7777;
    aclError e = aclrtMemManagedGetAttr(a, p, size, &v, sizeof v);
    if (e != ACL_SUCCESS)
        FAILF("aclrtMemManagedGetAttr(%d, size %zu) returned %d", (int)a, size, e);
    return v;
}

#endif
