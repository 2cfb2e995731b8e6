/* Many threads using the library at once: each has its own current device, stream, event and
 * memory; events recorded by one thread order another thread's stream; a context destroyed by
 * one thread makes another thread's calls fail cleanly. Data is checked throughout (device and
 * mapped memory through copies). Thread `id` works on device id % (number of devices). */
#include <pthread.h>
#include <stdint.h>

#include "check.h"

#define THREADS 8
#define ROUNDS 40
#define SZ (1 * MIB)

static aclrtEvent shared_ev[THREADS];
static void *shared_buf[THREADS];
static pthread_barrier_t bar;
static int managed_ok = 1;
static int32_t ndev;

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    const int32_t dev = id % ndev;
    OK(aclrtSetDevice(dev));
    aclrtStream s = NULL;
    OK(aclrtCreateStream(&s));
    OK(aclrtCreateEvent(&shared_ev[id]));
    OK(aclrtMalloc(&shared_buf[id], SZ, ACL_MEM_MALLOC_HUGE_FIRST));
    void *host = NULL;
    OK(aclrtMallocHost(&host, SZ));
    pthread_barrier_wait(&bar);
    int peer = (id + 1) % THREADS;
    for (int r = 0; r < ROUNDS; r++) {
        unsigned char v = (unsigned char)(id * ROUNDS + r);
        /* Fill my buffer, record my event. */
        OK(aclrtMemsetAsync(shared_buf[id], SZ, v, SZ, s));
        OK(aclrtRecordEvent(shared_ev[id], s));
        OK(aclrtSynchronizeEvent(shared_ev[id]));
        pthread_barrier_wait(&bar);
        /* Copy my peer's buffer after its event (already complete: the barrier). */
        OK(aclrtStreamWaitEvent(s, shared_ev[peer]));
        OK(aclrtMemcpyAsync(host, SZ, shared_buf[peer], SZ, ACL_MEMCPY_DEVICE_TO_HOST, s));
        OK(aclrtSynchronizeStream(s));
        unsigned char want = (unsigned char)(peer * ROUNDS + r);
        for (size_t i = 0; i < SZ; i += 4099)
            if (((unsigned char *)host)[i] != want)
                FAILF("thread %d round %d: byte %zu is %u, expected %u", id, r, i,
                      ((unsigned char *)host)[i], want);
        pthread_barrier_wait(&bar);
        /* Private churn: managed memory, virtual memory, failing calls. */
        if (managed_ok) {
            void *m = NULL;
            aclError e = aclrtMemAllocManaged(&m, 2 * MIB, ACL_RT_MEM_ATTACH_GLOBAL);
            if (e == ACL_ERROR_RT_FEATURE_NOT_SUPPORT) {
                managed_ok = 0;
            } else {
                OK(e);
                OK(aclrtMemManagedPrefetchAsync(m, 2 * MIB, loc(ACL_MEM_LOCATIONTYPE_DEVICE, dev), 0, s));
                OK(aclrtMemsetAsync(m, 2 * MIB, v, 2 * MIB, s));
                OK(aclrtSynchronizeStream(s));
                CHECK_EQ(((unsigned char *)m)[12345], v);
                OK(aclrtFree(m));
            }
        }
        void *va = NULL;
        aclrtDrvMemHandle ph = NULL;
        aclrtPhysicalMemProp prop;
        memset(&prop, 0, sizeof prop);
        prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = (uint32_t)dev;
        size_t g = 0;
        OK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED, &g));
        OK(aclrtReserveMemAddress(&va, g, 0, NULL, 0));
        OK(aclrtMallocPhysical(&ph, g, &prop, 0));
        OK(aclrtMapMem(va, g, 0, ph, 0));
        OK(aclrtMemset((unsigned char *)va + 77, 1, v, 1));
        unsigned char back = (unsigned char)~v;
        OK(aclrtMemcpy(&back, 1, (unsigned char *)va + 77, 1, ACL_MEMCPY_DEVICE_TO_HOST));
        CHECK_EQ(back, v);
        EXPECT_CODE(aclrtFreePhysical(ph), ACL_ERROR_RT_PARAM_INVALID);
        OK(aclrtUnmapMem(va));
        OK(aclrtFreePhysical(ph));
        OK(aclrtReleaseMemAddress(va));
        EXPECT_CODE(aclrtSynchronizeStream((aclrtStream)shared_ev[peer]), ACL_ERROR_RT_PARAM_INVALID);
    }
    pthread_barrier_wait(&bar);
    OK(aclrtDestroyStream(s));
    OK(aclrtFreeHost(host));
    return NULL;
}

static aclrtContext victim;
static void *destroyer(void *arg) {
    (void)arg;
    OK(aclrtDestroyContext(victim));
    return NULL;
}

int main(void) {
    OK(aclInit(NULL));
    ndev = (int32_t)device_count();
    /* The victim context's device: the second device, or device 0 where there is only one. */
    const int32_t vdev = ndev >= 2 ? 1 : 0;
    if (ndev < 2)
        NA_PART("threads spread over two devices",
                "only %d device (needs 2); all %d threads work on device 0", ndev, THREADS);
    /* What one SZ allocation takes of its device (rounded up to its page size). */
    size_t free0 = 0, free1 = 0, total = 0;
    OK(aclrtSetDevice(vdev));
    mem_info(&free0, &total);
    void *probe = NULL;
    OK(aclrtMalloc(&probe, SZ, ACL_MEM_MALLOC_HUGE_FIRST));
    mem_info(&free1, &total);
    const size_t charge = free0 - free1;
    CHECK(charge >= SZ);
    OK(aclrtFree(probe));
    mem_info(&free1, &total);
    CHECK_EQ(free1, free0);
    OK(aclrtResetDevice(vdev));
    CHECK(pthread_barrier_init(&bar, NULL, THREADS) == 0);
    pthread_t t[THREADS];
    for (intptr_t i = 0; i < THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, worker, (void *)i) == 0);
    for (int i = 0; i < THREADS; i++) CHECK(pthread_join(t[i], NULL) == 0);

    /* Another thread destroys this thread's current context: later calls fail cleanly. */
    OK(aclrtCreateContext(&victim, vdev));
    void *p = NULL;
    OK(aclrtMalloc(&p, SZ, ACL_MEM_MALLOC_HUGE_FIRST));
    pthread_t d;
    CHECK(pthread_create(&d, NULL, destroyer, NULL) == 0);
    CHECK(pthread_join(d, NULL) == 0);
    EXPECT_CODE(aclrtMalloc(&p, SZ, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_CONTEXT_NULL);
    MSG_HAS("destroyed");
    int32_t dev = -1;
    EXPECT_CODE(aclrtGetDevice(&dev), ACL_ERROR_RT_CONTEXT_NULL);
    OK(aclrtSetDevice(vdev));
    size_t free = 0;
    OK(aclrtGetMemInfo(ACL_HBM_MEM, &free, &total));
    /* Only the workers' device buffers on that device (4 of 8 with two devices) remain; the
     * victim's memory is gone. */
    int on_vdev = 0;
    for (int i = 0; i < THREADS; i++) on_vdev += i % ndev == vdev;
    CHECK_EQ(total - free, (size_t)on_vdev * charge);
    OK(aclFinalize());
    printf("threads ok (managed %s)\n", managed_ok ? "used" : "unavailable");
    return 0;
}
