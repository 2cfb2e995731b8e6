/* The managed-memory cases of cases/managed.md, through the C library, one block each. */
#include "check.h"

int main(void) {
    OK(aclInit(NULL));
    OK(aclrtSetDevice(0));
    uint32_t ndev = 0;
    OK(aclrtGetDeviceCount(&ndev));
    CHECK(ndev >= 1);
    aclrtStream s = NULL;
    OK(aclrtCreateStream(&s));

    /* 1. Size 0 -> 100000, *ptr unchanged. */
    void *sentinel = (void *)0x1234;
    void *p = sentinel;
    EXPECT_CODE(aclrtMemAllocManaged(&p, 0, ACL_RT_MEM_ATTACH_GLOBAL), ACL_ERROR_INVALID_PARAM);
    CHECK(p == sentinel);
    MSG_HAS("size 0");
    EXPECT_CODE(aclrtGetLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_INVALID_PARAM);

    char *m = managed_or_skip(4 * MIB);

    /* 2. Prefetch of ordinary device memory -> 107000; nothing migrates; the next valid
     *    prefetch on the same stream succeeds. */
    void *dev = NULL;
    OK(aclrtMalloc(&dev, 2 * MIB, ACL_MEM_MALLOC_HUGE_FIRST));
    OK(aclrtMemset(dev, 2 * MIB, 0x5a, 2 * MIB));
    EXPECT_CODE(aclrtMemManagedPrefetchAsync(dev, 2 * MIB, loc(ACL_MEM_LOCATIONTYPE_DEVICE, 0), 0, s),
                ACL_ERROR_RT_PARAM_INVALID);
    OK(aclrtSynchronizeStream(s));
    unsigned char probe[16];
    OK(aclrtMemcpy(probe, sizeof probe, dev, sizeof probe, ACL_MEMCPY_DEVICE_TO_HOST));
    for (size_t i = 0; i < sizeof probe; i++) CHECK_EQ(probe[i], 0x5a);
    CHECK_EQ(attr_i32(ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m, 4 * MIB), -2);
    OK(aclrtMemManagedPrefetchAsync(m, 2 * MIB, loc(ACL_MEM_LOCATIONTYPE_DEVICE, 0), 0, s));
    OK(aclrtSynchronizeStream(s));
    CHECK_EQ(attr_i32(ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m, 2 * MIB), 0);

    /* 3. Prefetch with size 0 -> 100000; then a valid call on the same stream succeeds. */
    EXPECT_CODE(aclrtMemManagedPrefetchAsync(m, 0, loc(ACL_MEM_LOCATIONTYPE_HOST, 0), 0, s),
                ACL_ERROR_INVALID_PARAM);
    OK(aclrtMemManagedPrefetchAsync(m, 2 * MIB, loc(ACL_MEM_LOCATIONTYPE_HOST, 0), 0, s));
    OK(aclrtSynchronizeStream(s));
    CHECK_EQ(attr_i32(ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m, 2 * MIB), -1);

    /* 4. A fresh 4 MiB allocation, nothing advised. */
    char *f = managed_or_skip(4 * MIB);
    CHECK_EQ(attr_i32(ACL_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, f, 4 * MIB), -2);
    CHECK_EQ(attr_i32(ACL_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE, f, 4 * MIB),
             ACL_MEM_LOCATIONTYPE_INVALID);
    CHECK_EQ(attr_i32(ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, f, 4 * MIB), -2);

    /* 5. SET_PREFERRED_LOCATION to device id = number of devices -> 107000, nothing changed. */
    EXPECT_CODE(aclrtMemManagedAdvise(f, 4 * MIB, ACL_MEM_ADVISE_SET_PREFERRED_LOCATION,
                                      loc(ACL_MEM_LOCATIONTYPE_DEVICE, (int32_t)ndev)),
                ACL_ERROR_RT_PARAM_INVALID);
    char idtext[16];
    snprintf(idtext, sizeof idtext, "%u", ndev);
    MSG_HAS(idtext);
    CHECK_EQ(attr_i32(ACL_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, f, 4 * MIB), -2);
    CHECK_EQ(attr_i32(ACL_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE, f, 4 * MIB), 0);

    /* 6. SET_READ_MOSTLY with size 3 MiB -> 107000, nothing changed; 2 MiB succeeds. */
    EXPECT_CODE(aclrtMemManagedAdvise(f, 3 * MIB, ACL_MEM_ADVISE_SET_READ_MOSTLY,
                                      loc(ACL_MEM_LOCATIONTYPE_HOST, 0)),
                ACL_ERROR_RT_PARAM_INVALID);
    MSG_HAS("0x300000");
    CHECK_EQ(attr_i32(ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, f, 2 * MIB), 0);
    OK(aclrtMemManagedAdvise(f, 2 * MIB, ACL_MEM_ADVISE_SET_READ_MOSTLY,
                             loc(ACL_MEM_LOCATIONTYPE_HOST, 0)));
    CHECK_EQ(attr_i32(ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, f, 2 * MIB), 1);
    CHECK_EQ(attr_i32(ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, f, 4 * MIB), 0);

    /* 7. GetAttr READ_MOSTLY with dataSize 8 -> 107000 (nothing written); 4 -> success. */
    int32_t big[2] = {0x11, 0x22};
    EXPECT_CODE(aclrtMemManagedGetAttr(ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, f, 2 * MIB, big, 8),
                ACL_ERROR_RT_PARAM_INVALID);
    MSG_HAS("dataSize 8");
    CHECK_EQ(big[0], 0x11);
    CHECK_EQ(big[1], 0x22);
    OK(aclrtMemManagedGetAttr(ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, f, 2 * MIB, big, 4));
    CHECK_EQ(big[0], 1);

    /* 8. SET_ACCESSED_BY device 0 keeps SET_READ_MOSTLY; a prefetch clears neither. */
    OK(aclrtMemManagedAdvise(f, 2 * MIB, ACL_MEM_ADVISE_SET_ACCESSED_BY,
                             loc(ACL_MEM_LOCATIONTYPE_DEVICE, 0)));
    CHECK_EQ(attr_i32(ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, f, 2 * MIB), 1);
    OK(aclrtMemManagedPrefetchAsync(f, 2 * MIB, loc(ACL_MEM_LOCATIONTYPE_DEVICE, 0), 0, s));
    OK(aclrtSynchronizeStream(s));
    CHECK_EQ(attr_i32(ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, f, 2 * MIB), 1);
    int32_t by[3] = {7, 7, 7};
    OK(aclrtMemManagedGetAttr(ACL_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, f, 2 * MIB, by, sizeof by));
    CHECK_EQ(by[0], 0);
    CHECK_EQ(by[1], -2);
    CHECK_EQ(by[2], -2);

    OK(aclrtFree(f));
    OK(aclrtFree(m));
    OK(aclrtFree(dev));
    OK(aclrtDestroyStream(s));
    OK(aclrtResetDevice(0));
    OK(aclFinalize());
    printf("managed cases ok\n");
    return 0;
}
