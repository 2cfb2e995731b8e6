/* An ACL program using managed memory with streams, device memory and virtual memory
 * together: data moves through host accesses (page faults), stream copies, fills and
 * prefetches, and stays right. Managed and host memory are touched by the host; device and
 * mapped virtual memory only through copies. With one device, device 0 stands in for device 1
 * (another thread's current device, the prefetch target) and the program says so. */
#include <pthread.h>
#include <stdint.h>

#include "check.h"

#define N (8 * MIB)

static unsigned char *shared_m;
/* The second device: 1, or 0 where there is only one. */
static int32_t other;

static void *toucher(void *arg) {
    size_t part = (size_t)(uintptr_t)arg;
    OK(aclrtSetDevice(other)); /* another thread, another current device */
    for (size_t i = part * (N / 4); i < (part + 1) * (N / 4); i += 4096)
        shared_m[i] = (unsigned char)(part + 0x40);
    OK(aclrtResetDevice(other));
    return NULL;
}

/* aclrtFree of managed memory with stream work still queued on it: the free waits for the
   work, which runs on live memory, so the synchronize after the free returns 0. Four threads,
   each with its own stream, so the work is often still queued when the free comes. */
static void *free_with_queued_work(void *arg) {
    (void)arg;
    OK(aclrtSetDevice(0));
    aclrtStream s = NULL;
    OK(aclrtCreateStream(&s));
    aclrtMemManagedLocation dev0 = {ACL_MEM_LOCATIONTYPE_DEVICE, 0};
    aclrtMemManagedLocation host = {ACL_MEM_LOCATIONTYPE_HOST, 0};
    for (int round = 0; round < 8; round++) {
        void *p = NULL;
        OK(aclrtMemAllocManaged(&p, 4 * MIB, ACL_RT_MEM_ATTACH_GLOBAL));
        OK(aclrtMemManagedPrefetchAsync(p, 4 * MIB, dev0, 0, s));
        OK(aclrtMemsetAsync(p, 4 * MIB, 0x5a, 4 * MIB, s));
        OK(aclrtMemManagedPrefetchAsync(p, 4 * MIB, host, 0, s));
        OK(aclrtFree(p));
        OK(aclrtSynchronizeStream(s));
    }
    OK(aclrtDestroyStream(s));
    return NULL;
}

int main(void) {
    OK(aclInit(NULL));
    OK(aclrtSetDevice(0));
    uint32_t ndev = device_count();
    other = ndev >= 2 ? 1 : 0;
    aclrtStream s0 = NULL;
    OK(aclrtCreateStream(&s0));
    unsigned char *m = managed_or_skip(N - 123); /* rounded up to 8 MiB */
    if (ndev < 2)
        NA_PART("prefetch to a second device and threads whose current device is another one",
                "only %u device (needs 2); device 0 stands in for device 1", ndev);
    shared_m = m;
    void *d = NULL;
    OK(aclrtMalloc(&d, N, ACL_MEM_MALLOC_HUGE_FIRST));

    /* Host writes (first touch on the host), then stream copies both ways. */
    for (size_t i = 0; i < N; i++) m[i] = (unsigned char)(i % 251);
    OK(aclrtMemcpyAsync(d, N, m, N, ACL_MEMCPY_DEFAULT, s0));
    OK(aclrtMemsetAsync(m, N, 0, N, s0));
    OK(aclrtSynchronizeStream(s0));
    for (size_t i = 0; i < N; i += 997) CHECK_EQ(m[i], 0); /* the fill ran after the copy */
    OK(aclrtMemcpyAsync(m, N, d, N, ACL_MEMCPY_DEVICE_TO_DEVICE, s0));
    OK(aclrtSynchronizeStream(s0));
    for (size_t i = 0; i < N; i += 991) CHECK_EQ(m[i], i % 251);

    /* Prefetch to the second device, then the host reads it back through faults. */
    OK(aclrtMemManagedPrefetchAsync(m, N, loc(ACL_MEM_LOCATIONTYPE_DEVICE, other), 0, s0));
    OK(aclrtSynchronizeStream(s0));
    CHECK_EQ(attr_i32(ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m, N), other);
    for (size_t i = 0; i < N; i += 4093) CHECK_EQ(m[i], i % 251);

    /* Four threads touch four quarters at once. */
    pthread_t t[4];
    for (uintptr_t k = 0; k < 4; k++) CHECK(pthread_create(&t[k], NULL, toucher, (void *)k) == 0);
    for (int k = 0; k < 4; k++) CHECK(pthread_join(t[k], NULL) == 0);
    for (size_t k = 0; k < 4; k++) CHECK_EQ(m[k * (N / 4)], k + 0x40);

    /* Synchronous copies between managed, host and device memory, every kind. */
    static unsigned char host[4096];
    for (int kind = 0; kind <= 7; kind++) {
        memset(host, kind + 1, sizeof host);
        OK(aclrtMemcpy(m + 3 * MIB, N, host, sizeof host, (aclrtMemcpyKind)kind));
        OK(aclrtMemcpy(d, N, m + 3 * MIB, sizeof host, (aclrtMemcpyKind)kind));
        memset(host, 0, sizeof host);
        OK(aclrtMemcpy(host, sizeof host, d, sizeof host, (aclrtMemcpyKind)kind));
        for (size_t i = 0; i < sizeof host; i++) CHECK_EQ(host[i], kind + 1);
    }
    /* A managed range running past its allocation: refused, nothing copied. */
    EXPECT_CODE(aclrtMemcpy(m + N - 16, 64, host, 64, ACL_MEMCPY_HOST_TO_DEVICE),
                ACL_ERROR_RT_PARAM_INVALID);

    /* Virtual memory as the other side of a managed stream copy. */
    aclrtPhysicalMemProp prop;
    memset(&prop, 0, sizeof prop);
    prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g = 0;
    OK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED, &g));
    void *va = NULL;
    aclrtDrvMemHandle ph = NULL;
    OK(aclrtReserveMemAddress(&va, g, 0, NULL, 0));
    OK(aclrtMallocPhysical(&ph, g, &prop, 0));
    OK(aclrtMapMem(va, g, 0, ph, 0));
    OK(aclrtMemsetAsync(m, N, 0x6b, g, s0));
    OK(aclrtMemcpyAsync(va, g, m, g, ACL_MEMCPY_DEVICE_TO_DEVICE, s0));
    OK(aclrtSynchronizeStream(s0));
    EXPECT_BYTES(va, g, 0x6b, "virtual memory filled from managed memory");
    OK(aclrtUnmapMem(va));
    OK(aclrtFreePhysical(ph));
    OK(aclrtReleaseMemAddress(va));

    pthread_t fw[4];
    for (int i = 0; i < 4; i++) CHECK(pthread_create(&fw[i], NULL, free_with_queued_work, NULL) == 0);
    for (int i = 0; i < 4; i++) CHECK(pthread_join(fw[i], NULL) == 0);

    OK(aclrtMemsetAsync(m, N, 0x11, N, s0));
    OK(aclrtFree(m)); /* waits for the fill queued on it */
    OK(aclrtSynchronizeStream(s0));
    EXPECT_CODE(aclrtMemsetAsync(m, N, 0x11, N, s0), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtFree(m), ACL_ERROR_RT_PARAM_INVALID);
    OK(aclrtFree(d));
    OK(aclrtDestroyStream(s0));
    OK(aclrtResetDevice(0));
    OK(aclFinalize());
    printf("managed with streams ok\n");
    return 0;
}
