/* Set-up calls, per-thread current device / context, errors and handle validation. With one
 * device, the checks that need a second one (another thread's or context's device differing
 * from the main thread's) say so and run on device 0. */
#include <pthread.h>
#include <stdint.h>

#include "check.h"

/* Device 1 where there are two devices or more, else device 0. */
static int32_t other;

static void *thread_body(void *arg) {
    (void)arg;
    /* A new thread has no current context, whatever the main thread set. */
    int32_t d = -1;
    EXPECT_CODE(aclrtGetDevice(&d), ACL_ERROR_RT_CONTEXT_NULL);
    aclrtContext c = NULL;
    EXPECT_CODE(aclrtGetCurrentContext(&c), ACL_ERROR_RT_CONTEXT_NULL);
    /* Its own device choice does not change the main thread's. */
    OK(aclrtSetDevice(other));
    OK(aclrtGetDevice(&d));
    CHECK_EQ(d, other);
    /* Errors are per thread: this thread's failure is not the main thread's. */
    EXPECT_CODE(aclrtSetDevice(99), ACL_ERROR_RT_PARAM_INVALID);
    MSG_HAS("99");
    OK(aclrtResetDevice(other));
    return NULL;
}

int main(void) {
    /* Before aclInit: the life-cycle code; the version and the error calls work. */
    EXPECT_CODE(aclrtSetDevice(0), ACL_ERROR_UNINITIALIZE);
    MSG_HAS("aclInit");
    EXPECT_CODE(aclFinalize(), ACL_ERROR_UNINITIALIZE);
    EXPECT_CODE(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_UNINITIALIZE);
    EXPECT_CODE(aclrtGetLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_UNINITIALIZE);
    EXPECT_CODE(aclrtGetLastError(ACL_RT_THREAD_LEVEL), ACL_SUCCESS); /* cleared */
    EXPECT_CODE(aclrtGetVersion(NULL, NULL, NULL), ACL_ERROR_INVALID_PARAM);

    /* aclInit: a config file that cannot be read; NULL and "" accepted; twice refused. */
    EXPECT_CODE(aclInit("/nonexistent/hetmem-acl.json"), ACL_ERROR_INVALID_FILE);
    MSG_HAS("/nonexistent/hetmem-acl.json");
    OK(aclInit(""));
    EXPECT_CODE(aclInit(NULL), ACL_ERROR_REPEAT_INITIALIZE);
    OK(aclFinalize());
    OK(aclInit(NULL));

    uint32_t n = 0;
    OK(aclrtGetDeviceCount(&n));
    CHECK(n >= 1 && n < 99);
    unsigned long long want_n = configured_size("HETMEM_HOST_DEVICES");
    if (want_n != 0)
        CHECK_EQ(n, want_n); /* the runner's HETMEM_HOST_DEVICES=2 */
    else
        NA_PART("device count is HETMEM_HOST_DEVICES",
                "HETMEM_HOST_DEVICES is not set for this backend (%u devices, the machine's)", n);
    other = n >= 2 ? 1 : 0;
    if (n < 2)
        NA_PART("another thread and an explicit context on a second device",
                "only %u device (needs 2); they run on device 0", n);
    EXPECT_CODE(aclrtGetDeviceCount(NULL), ACL_ERROR_INVALID_PARAM);
    aclrtRunMode mode = ACL_DEVICE;
    OK(aclrtGetRunMode(&mode));
    CHECK_EQ(mode, ACL_HOST);

    /* No current device yet. */
    int32_t d = -1;
    EXPECT_CODE(aclrtGetDevice(&d), ACL_ERROR_RT_CONTEXT_NULL);
    CHECK_EQ(d, -1);
    /* Bad device ids: the code, the id in the message, nothing changed. */
    char idtext[32];
    snprintf(idtext, sizeof idtext, "device id %u", n);
    EXPECT_CODE(aclrtSetDevice((int32_t)n), ACL_ERROR_RT_PARAM_INVALID);
    MSG_HAS(idtext);
    EXPECT_CODE(aclrtSetDevice(-1), ACL_ERROR_RT_PARAM_INVALID);
    MSG_HAS("-1");
    EXPECT_CODE(aclrtGetDevice(&d), ACL_ERROR_RT_CONTEXT_NULL);
    EXPECT_CODE(aclrtResetDevice(0), ACL_ERROR_RT_PARAM_INVALID); /* never set */

    /* SetDevice makes the default context current; counted for ResetDevice. */
    OK(aclrtSetDevice(0));
    OK(aclrtGetDevice(&d));
    CHECK_EQ(d, 0);
    aclrtContext def0 = NULL, cur = NULL;
    OK(aclrtGetCurrentContext(&def0));
    CHECK(def0 != NULL);
    OK(aclrtSetDevice(0));
    OK(aclrtGetCurrentContext(&cur));
    CHECK(cur == def0); /* the same default context */
    EXPECT_CODE(aclrtDestroyContext(def0), ACL_ERROR_RT_PARAM_INVALID); /* default: reset it */
    MSG_HAS("default context");

    /* Another thread has its own current context. */
    pthread_t t;
    CHECK(pthread_create(&t, NULL, thread_body, NULL) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    OK(aclrtGetDevice(&d));
    CHECK_EQ(d, 0);
    OK(aclrtGetCurrentContext(&cur));
    CHECK(cur == def0);
    EXPECT_CODE(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_RT_PARAM_INVALID);

    /* Explicit contexts: CreateContext makes current; SetCurrentContext switches. */
    aclrtContext c1 = NULL;
    OK(aclrtCreateContext(&c1, other));
    CHECK(c1 != NULL && c1 != def0);
    OK(aclrtGetDevice(&d));
    CHECK_EQ(d, other);
    OK(aclrtGetCurrentContext(&cur));
    CHECK(cur == c1);
    OK(aclrtSetCurrentContext(def0));
    OK(aclrtGetDevice(&d));
    CHECK_EQ(d, 0);
    OK(aclrtGetCurrentContext(&cur));
    CHECK(cur == def0);
    OK(aclrtSetCurrentContext(c1));
    EXPECT_CODE(aclrtCreateContext(NULL, 0), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtCreateContext(&cur, (int32_t)n), ACL_ERROR_RT_PARAM_INVALID);

    /* Memory of a context goes with it; its handles become stale, never a crash. */
    void *p = NULL;
    OK(aclrtMalloc(&p, 1 * MIB, ACL_MEM_MALLOC_HUGE_FIRST));
    aclrtStream s = NULL;
    OK(aclrtCreateStream(&s));
    aclrtEvent ce = NULL;
    OK(aclrtCreateEvent(&ce));
    OK(aclrtRecordEvent(ce, s));
    size_t free_before = 0, total = 0, free_after = 0;
    OK(aclrtGetMemInfo(ACL_HBM_MEM, &free_before, &total));
    unsigned long long want_total = configured_size("HETMEM_HOST_DEVICE_MEMORY");
    if (want_total != 0)
        CHECK_EQ(total, want_total); /* the runner's HETMEM_HOST_DEVICE_MEMORY=256M */
    else
        NA_PART("device memory is HETMEM_HOST_DEVICE_MEMORY",
                "HETMEM_HOST_DEVICE_MEMORY is not set for this backend (device %d has %.1f GiB, "
                "the machine's)",
                other, gib(total));
    CHECK(total >= 1 * MIB);
    CHECK(free_before <= total - 1 * MIB);
    OK(aclrtDestroyContext(c1));
    EXPECT_CODE(aclrtGetDevice(&d), ACL_ERROR_RT_CONTEXT_NULL); /* it was current */
    MSG_HAS("no current context");
    EXPECT_CODE(aclrtSetCurrentContext(c1), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtDestroyContext(c1), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtSynchronizeStream(s), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtDestroyStream(s), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtDestroyEvent(ce), ACL_ERROR_RT_PARAM_INVALID); /* went with its context */
    OK(aclrtSetDevice(other));
    OK(aclrtGetMemInfo(ACL_DDR_MEM, &free_after, &total));
    CHECK_EQ(free_after, total); /* the device's capacity came back (nothing else holds any) */
    OK(aclrtResetDevice(other));

    /* Foreign, random and wrong-kind handles: the code, no crash. */
    OK(aclrtSetDevice(0));
    aclrtEvent ev = NULL;
    OK(aclrtCreateEvent(&ev));
    EXPECT_CODE(aclrtSynchronizeStream((aclrtStream)ev), ACL_ERROR_RT_PARAM_INVALID);
    MSG_HAS("stream");
    EXPECT_CODE(aclrtDestroyStream((aclrtStream)0xdeadbeef), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtSetCurrentContext((aclrtContext)&n), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtSetCurrentContext(NULL), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtDestroyEvent((aclrtEvent)def0), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtFreePhysical((aclrtDrvMemHandle)ev), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtRecordEvent((aclrtEvent)0x10, NULL), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtGetLastError((aclrtLastErrLevel)7), ACL_ERROR_RT_PARAM_INVALID);
    MSG_HAS("level 7");
    OK(aclrtDestroyEvent(ev));
    EXPECT_CODE(aclrtDestroyEvent(ev), ACL_ERROR_RT_PARAM_INVALID);

    /* No sticky error: after all those failures, ordinary calls work. */
    OK(aclrtMalloc(&p, 1 * MIB, ACL_MEM_MALLOC_NORMAL_ONLY));
    OK(aclrtFree(p));
    CHECK(aclrtGetLastError(ACL_RT_THREAD_LEVEL) == ACL_ERROR_RT_PARAM_INVALID);
    CHECK(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL) == ACL_SUCCESS);

    /* Reset twice (two SetDevice calls earlier plus this one): the default context stays until
     * the last reset, then the handle is stale. */
    OK(aclrtResetDevice(0));
    OK(aclrtResetDevice(0));
    OK(aclrtGetDevice(&d));
    OK(aclrtResetDevice(0));
    EXPECT_CODE(aclrtGetDevice(&d), ACL_ERROR_RT_CONTEXT_NULL);
    EXPECT_CODE(aclrtSetCurrentContext(def0), ACL_ERROR_RT_PARAM_INVALID);

    /* Finalize releases everything; handles stay invalid after a new init. */
    OK(aclrtSetDevice(0));
    aclrtContext last = NULL;
    OK(aclrtGetCurrentContext(&last));
    OK(aclFinalize());
    EXPECT_CODE(aclrtGetDevice(&d), ACL_ERROR_UNINITIALIZE);
    OK(aclInit(NULL));
    EXPECT_CODE(aclrtSetCurrentContext(last), ACL_ERROR_RT_PARAM_INVALID);
    OK(aclFinalize());
    printf("setup and errors ok\n");
    return 0;
}
