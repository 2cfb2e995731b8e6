/* The cases of shared/cases/acl.md, each with the answer that is right, in C against hetmem's
 * acl/acl.h. Each prints "case N ok" when its checks pass.
 *
 *   acl_cases                        the cases (the test)
 *   acl_cases importer RFD WFD PAT   case 6's importer: sends its aclrtDeviceGetBareTgid, reads a
 *                                    key, checks the exporter's bytes are PAT, writes 0x3C over
 *                                    the first 4 KiB, closes its view, says "ok", waits for
 *                                    "closed" and checks the key no longer imports
 *   acl_cases intruder RFD WFD       a process not on the key's pid list: its import is refused
 *
 * Device memory is reached only through aclrtMemcpy / aclrtMemset; sizes come from the
 * granularity query, memory from aclrtGetMemInfo, devices from aclrtGetDeviceCount. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static size_t gran;

static aclrtPhysicalMemProp dev_prop(int32_t dev) {
    aclrtPhysicalMemProp p;
    memset(&p, 0, sizeof p);
    p.handleType = ACL_MEM_HANDLE_TYPE_NONE;
    p.allocationType = ACL_MEM_ALLOCATION_TYPE_PINNED;
    p.memAttr = ACL_HBM_MEM_HUGE;
    p.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = (uint32_t)dev;
    return p;
}

static void write_all(int fd, const void *b, size_t n) {
    if (write(fd, b, n) != (ssize_t)n) FAILF("write to fd %d: %s", fd, strerror(errno));
}

static void read_all(int fd, void *b, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)b + got, n - got);
        if (r <= 0) FAILF("read from fd %d: %s", fd, r == 0 ? "eof" : strerror(errno));
        got += (size_t)r;
    }
}

static size_t free_mem(void) {
    size_t f = 0, t = 0;
    mem_info(&f, &t);
    return f;
}

/* ---- case 1: the recent error message is read once ---- */
static void case1(void) {
    EXPECT_CODE(aclrtSetDevice(987654), ACL_ERROR_RT_PARAM_INVALID);
    const char *m = aclGetRecentErrMsg();
    CHECK(m != NULL && strstr(m, "987654") != NULL);
    const char *again = aclGetRecentErrMsg();
    CHECK(again == NULL || again[0] == '\0'); /* get and clear */
    /* A success in between records nothing. */
    uint32_t n = 0;
    OK(aclrtGetDeviceCount(&n));
    again = aclGetRecentErrMsg();
    CHECK(again == NULL || again[0] == '\0');
    printf("case 1 ok: the message is read once, then \"\"\n");
}

/* ---- case 2: aclrtDeviceGetBareTgid ---- */
static void case2(void) {
    int32_t pid = -1;
    OK(aclrtDeviceGetBareTgid(&pid));
    CHECK_EQ(pid, getpid());
    EXPECT_CODE(aclrtDeviceGetBareTgid(NULL), ACL_ERROR_INVALID_PARAM);
    printf("case 2 ok: aclrtDeviceGetBareTgid answers %d\n", pid);
}

/* ---- case 8: no current context ---- */
static void *case8_thread(void *arg) {
    (void)arg;
    aclrtContext ctx = (aclrtContext)0x1234;
    EXPECT_CODE(aclrtGetCurrentContext(&ctx), ACL_ERROR_RT_CONTEXT_NULL);
    CHECK(ctx == NULL);
    return NULL;
}

static void case8(void) {
    /* Before any aclrtSetDevice in this thread... */
    aclrtContext ctx = (aclrtContext)0x1234;
    EXPECT_CODE(aclrtGetCurrentContext(&ctx), ACL_ERROR_RT_CONTEXT_NULL);
    MSG_HAS("no current context");
    CHECK(ctx == NULL);
    /* ...and in a new thread of a process that has one elsewhere. */
    OK(aclrtSetDevice(0));
    pthread_t t;
    CHECK(pthread_create(&t, NULL, case8_thread, NULL) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    OK(aclrtGetCurrentContext(&ctx));
    CHECK(ctx != NULL);
    OK(aclrtResetDevice(0));
    /* After the reset: none again, NULL again. */
    ctx = (aclrtContext)0x1234;
    EXPECT_CODE(aclrtGetCurrentContext(&ctx), ACL_ERROR_RT_CONTEXT_NULL);
    CHECK(ctx == NULL);
    printf("case 8 ok: no current context -> 107002 and *ctx == NULL\n");
}

/* ---- case 4: aclrtDestroyStreamForce and aclrtResetDeviceForce ---- */
static volatile int released;

static void blocker(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&released, __ATOMIC_ACQUIRE)) usleep(1000);
}

static void *release_later(void *arg) {
    (void)arg;
    usleep(300 * 1000);
    __atomic_store_n(&released, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void case4_destroy_stream_force(void) {
    OK(aclrtSetDevice(0));
    size_t before = free_mem();
    void *d = NULL;
    OK(aclrtMalloc(&d, gran, ACL_MEM_MALLOC_HUGE_FIRST));
    OK(aclrtMemset(d, gran, 0x11, gran));
    aclrtStream s = NULL;
    OK(aclrtCreateStream(&s));
    released = 0;
    aclError e = aclrtLaunchHostFunc(s, blocker, NULL);
    if (e == ACL_ERROR_RT_FEATURE_NOT_SUPPORT) {
        NA_PART("aclrtDestroyStreamForce discards queued work",
                "no host function can hold a stream here (%s)", aclGetRecentErrMsg());
        OK(aclrtDestroyStreamForce(s));
        OK(aclrtFree(d));
        OK(aclrtResetDevice(0));
        return;
    }
    OK(e);
    /* Queued behind the running host function: a fill and a copy of the device memory. */
    OK(aclrtMemsetAsync(d, gran, 0x22, gran, s));
    unsigned char *host = NULL;
    OK(aclrtMallocHost((void **)&host, 4096));
    memset(host, 0x33, 4096);
    OK(aclrtMemcpyAsync(d, gran, host, 4096, ACL_MEMCPY_HOST_TO_DEVICE, s));
    pthread_t t;
    CHECK(pthread_create(&t, NULL, release_later, NULL) == 0);
    OK(aclrtDestroyStreamForce(s)); /* returns once the running host function has */
    CHECK(pthread_join(t, NULL) == 0);
    EXPECT_CODE(aclrtSynchronizeStream(s), ACL_ERROR_RT_PARAM_INVALID); /* gone */
    /* The discarded fill and copy never ran, and released the memory they held. */
    EXPECT_BYTES(d, gran, 0x11, "device memory after the forced destroy");
    OK(aclrtFree(d));
    OK(aclrtFreeHost(host));
    CHECK_EQ(free_mem(), before);
    EXPECT_CODE(aclrtDestroyStreamForce(NULL), ACL_ERROR_INVALID_PARAM);
    OK(aclrtResetDevice(0));
}

static void case4_reset_device_force(void) {
    OK(aclrtSetDevice(0));
    size_t before = free_mem();
    OK(aclrtSetDevice(0));
    OK(aclrtSetDevice(0));
    /* Physical memory of the default context, imported in a context of its own. */
    aclrtPhysicalMemProp prop = dev_prop(0);
    aclrtDrvMemHandle h = NULL;
    OK(aclrtMallocPhysical(&h, gran, &prop, 0));
    void *va = NULL;
    OK(aclrtReserveMemAddress(&va, gran, 0, NULL, 0));
    OK(aclrtMapMem(va, gran, 0, h, 0));
    OK(aclrtMemset(va, gran, 0x5A, gran));
    uint64_t sh = 0;
    OK(aclrtMemExportToShareableHandle(h, ACL_MEM_HANDLE_TYPE_NONE, 0, &sh));
    void *dmem = NULL;
    OK(aclrtMalloc(&dmem, gran, ACL_MEM_MALLOC_HUGE_FIRST));
    aclrtContext dflt = NULL;
    OK(aclrtGetCurrentContext(&dflt));
    aclrtContext other = NULL;
    OK(aclrtCreateContext(&other, 0));
    aclrtDrvMemHandle imp = NULL;
    OK(aclrtMemImportFromShareableHandle(sh, 0, &imp));
    void *va2 = NULL;
    OK(aclrtReserveMemAddress(&va2, gran, 0, NULL, 0));
    OK(aclrtMapMem(va2, gran, 0, imp, 0));
    OK(aclrtSetCurrentContext(dflt));
    /* Three aclrtSetDevice, one forced reset: the default context and all of it go. */
    OK(aclrtResetDeviceForce(0));
    aclrtContext cur = (aclrtContext)0x1;
    EXPECT_CODE(aclrtGetCurrentContext(&cur), ACL_ERROR_RT_CONTEXT_NULL);
    CHECK(cur == NULL);
    EXPECT_CODE(aclrtResetDeviceForce(0), ACL_ERROR_RT_PARAM_INVALID); /* already reset */
    EXPECT_CODE(aclrtResetDevice(0), ACL_ERROR_RT_PARAM_INVALID);
    /* The other holder's memory stays correct. */
    OK(aclrtSetCurrentContext(other));
    EXPECT_BYTES(va2, gran, 0x5A, "import after the exporter's forced reset");
    /* The reset context's memory came back; the import still counts. */
    CHECK_EQ(free_mem(), before - gran);
    OK(aclrtUnmapMem(va2));
    OK(aclrtFreePhysical(imp));
    OK(aclrtReleaseMemAddress(va2));
    CHECK_EQ(free_mem(), before);
    OK(aclrtDestroyContext(other));
    /* Paired use works too: set, force, set, force. */
    OK(aclrtSetDevice(0));
    OK(aclrtResetDeviceForce(0));
    OK(aclrtSetDevice(0));
    OK(aclrtResetDeviceForce(0));
}

static void case4(void) {
    case4_destroy_stream_force();
    case4_reset_device_force();
    printf("case 4 ok: aclrtDestroyStreamForce discards queued work; aclrtResetDeviceForce "
           "resets at once\n");
}

/* ---- case 5: aclrtMemSetAccess / aclrtMemGetAccess ---- */
static aclrtMemAccessDesc access_desc(aclrtMemAccessFlags f, uint32_t dev) {
    aclrtMemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.flags = f;
    d.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = dev;
    return d;
}

static uint64_t access_of(void *va, uint32_t dev) {
    aclrtMemLocation l = {dev, ACL_MEM_LOCATION_TYPE_DEVICE};
    uint64_t f = 0x77;
    OK(aclrtMemGetAccess(va, &l, &f));
    return f;
}

static void case5(void) {
    OK(aclrtSetDevice(0));
    aclrtPhysicalMemProp prop = dev_prop(0);
    aclrtDrvMemHandle h = NULL;
    OK(aclrtMallocPhysical(&h, gran, &prop, 0));
    void *va = NULL;
    OK(aclrtReserveMemAddress(&va, 2 * gran, 0, NULL, 0));
    OK(aclrtMapMem(va, gran, 0, h, 0));
    OK(aclrtMemset(va, gran, 0x44, gran));
    CHECK_EQ(access_of(va, 0), ACL_RT_MEM_ACCESS_FLAGS_READWRITE);
    unsigned char buf[256];
    memset(buf, 0x99, sizeof buf);

    aclrtMemAccessDesc d = access_desc(ACL_RT_MEM_ACCESS_FLAGS_READ, 0);
    OK(aclrtMemSetAccess(va, gran, &d, 1));
    CHECK_EQ(access_of((char *)va + 12345, 0), ACL_RT_MEM_ACCESS_FLAGS_READ);
    EXPECT_CODE(aclrtMemcpy(va, gran, buf, sizeof buf, ACL_MEMCPY_HOST_TO_DEVICE),
                ACL_ERROR_RT_PARAM_INVALID); /* read-only: the write is refused */
    EXPECT_BYTES(va, gran, 0x44, "read-only mapping");

    d = access_desc(ACL_RT_MEM_ACCESS_FLAGS_NONE, 0);
    OK(aclrtMemSetAccess(va, gran, &d, 1));
    CHECK_EQ(access_of(va, 0), ACL_RT_MEM_ACCESS_FLAGS_NONE);
    EXPECT_CODE(aclrtMemcpy(buf, sizeof buf, va, sizeof buf, ACL_MEMCPY_DEVICE_TO_HOST),
                ACL_ERROR_RT_PARAM_INVALID); /* no access: the read is refused */

    d = access_desc(ACL_RT_MEM_ACCESS_FLAGS_READWRITE, 0);
    OK(aclrtMemSetAccess(va, gran, &d, 1));
    OK(aclrtMemcpy(va, gran, buf, sizeof buf, ACL_MEMCPY_HOST_TO_DEVICE));
    EXPECT_BYTES(va, sizeof buf, 0x99, "read-write again");
    /* The unmapped page after it has no access. */
    CHECK_EQ(access_of((char *)va + gran, 0), ACL_RT_MEM_ACCESS_FLAGS_NONE);

    /* Argument errors, each changing nothing. */
    d = access_desc((aclrtMemAccessFlags)2, 0);
    EXPECT_CODE(aclrtMemSetAccess(va, gran, &d, 1), ACL_ERROR_RT_PARAM_INVALID);
    MSG_HAS("aclrtMemAccessFlags");
    d = access_desc(ACL_RT_MEM_ACCESS_FLAGS_READ, 0);
    d.location.type = ACL_MEM_LOCATION_TYPE_HOST;
    EXPECT_CODE(aclrtMemSetAccess(va, gran, &d, 1), ACL_ERROR_RT_PARAM_INVALID);
    d = access_desc(ACL_RT_MEM_ACCESS_FLAGS_READ, device_count());
    EXPECT_CODE(aclrtMemSetAccess(va, gran, &d, 1), ACL_ERROR_RT_PARAM_INVALID);
    d = access_desc(ACL_RT_MEM_ACCESS_FLAGS_READ, 0);
    EXPECT_CODE(aclrtMemSetAccess(va, gran, &d, 0), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtMemSetAccess(va, gran, NULL, 1), ACL_ERROR_INVALID_PARAM);
    if (device_count() >= 2) {
        aclrtMemAccessDesc two[2] = {access_desc(ACL_RT_MEM_ACCESS_FLAGS_READ, 0),
                                     access_desc(ACL_RT_MEM_ACCESS_FLAGS_READWRITE, 1)};
        EXPECT_CODE(aclrtMemSetAccess(va, gran, two, 2), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
        two[1] = access_desc(ACL_RT_MEM_ACCESS_FLAGS_READWRITE, 0);
        two[0] = access_desc(ACL_RT_MEM_ACCESS_FLAGS_READWRITE, 1);
        OK(aclrtMemSetAccess(va, gran, two, 2));
        CHECK_EQ(access_of(va, 1), ACL_RT_MEM_ACCESS_FLAGS_READWRITE);
    } else {
        NA_PART("aclrtMemSetAccess with descriptors of two devices", "one device here");
    }
    CHECK_EQ(access_of(va, 0), ACL_RT_MEM_ACCESS_FLAGS_READWRITE);
    aclrtMemLocation l = {0, ACL_MEM_LOCATION_TYPE_DEVICE};
    uint64_t f = 0;
    EXPECT_CODE(aclrtMemGetAccess(NULL, &l, &f), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtMemGetAccess(va, NULL, &f), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtMemGetAccess((void *)buf, &l, &f), ACL_ERROR_RT_PARAM_INVALID);

    /* aclrtMemMapNoAccess: mapped without access until aclrtMemSetAccess. */
    OK(aclrtUnmapMem(va));
    OK(aclrtMemMapNoAccess(va, gran, 0, h, 0));
    CHECK_EQ(access_of(va, 0), ACL_RT_MEM_ACCESS_FLAGS_NONE);
    EXPECT_CODE(aclrtMemcpy(buf, sizeof buf, va, sizeof buf, ACL_MEMCPY_DEVICE_TO_HOST),
                ACL_ERROR_RT_PARAM_INVALID);
    d = access_desc(ACL_RT_MEM_ACCESS_FLAGS_READWRITE, 0);
    OK(aclrtMemSetAccess(va, gran, &d, 1));
    EXPECT_BYTES(va, sizeof buf, 0x99, "mapped without access, then granted");
    OK(aclrtUnmapMem(va));
    OK(aclrtFreePhysical(h));
    OK(aclrtReleaseMemAddress(va));
    OK(aclrtResetDevice(0));
    printf("case 5 ok: aclrtMemSetAccess / aclrtMemGetAccess by the access rules\n");
}

/* ---- case 7: handles back from a pointer ---- */
static void case7(void) {
    OK(aclrtSetDevice(0));
    size_t before = free_mem();
    aclrtPhysicalMemProp prop = dev_prop(0);
    prop.memAttr = ACL_HBM_MEM_P2P_HUGE;
    aclrtDrvMemHandle h = NULL;
    OK(aclrtMallocPhysical(&h, gran, &prop, 0));
    void *va = NULL;
    OK(aclrtReserveMemAddress(&va, 2 * gran, 0, NULL, 0));
    OK(aclrtMapMem(va, gran, 0, h, 0));
    aclrtDrvMemHandle back = NULL;
    OK(aclrtMemRetainAllocationHandle((char *)va + 100, &back));
    CHECK(back == h);
    aclrtPhysicalMemProp got;
    memset(&got, 0xff, sizeof got);
    OK(aclrtMemGetAllocationPropertiesFromHandle(back, &got));
    CHECK_EQ(got.handleType, prop.handleType);
    CHECK_EQ(got.allocationType, prop.allocationType);
    CHECK_EQ(got.memAttr, ACL_HBM_MEM_P2P_HUGE);
    CHECK_EQ(got.location.type, ACL_MEM_LOCATION_TYPE_DEVICE);
    CHECK_EQ(got.location.id, 0);
    /* Errors: an unmapped page, a pointer in no reservation, null pointers. */
    aclrtDrvMemHandle none = (aclrtDrvMemHandle)0x5;
    EXPECT_CODE(aclrtMemRetainAllocationHandle((char *)va + gran, &none),
                ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtMemRetainAllocationHandle((void *)&none, &none), ACL_ERROR_RT_PARAM_INVALID);
    CHECK(none == (aclrtDrvMemHandle)0x5);
    EXPECT_CODE(aclrtMemRetainAllocationHandle(va, NULL), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtMemGetAllocationPropertiesFromHandle(h, NULL), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtMemGetAllocationPropertiesFromHandle((aclrtDrvMemHandle)0x10, &got),
                ACL_ERROR_RT_PARAM_INVALID);
    OK(aclrtUnmapMem(va));
    /* Retained: the first free gives the retain back, the memory stays; the second frees it. */
    OK(aclrtFreePhysical(h));
    CHECK_EQ(free_mem(), before - gran);
    OK(aclrtMemGetAllocationPropertiesFromHandle(h, &got));
    OK(aclrtFreePhysical(h));
    CHECK_EQ(free_mem(), before);
    EXPECT_CODE(aclrtFreePhysical(h), ACL_ERROR_RT_PARAM_INVALID);
    OK(aclrtReleaseMemAddress(va));
    OK(aclrtResetDevice(0));
    printf("case 7 ok: aclrtMemRetainAllocationHandle and its properties\n");
}

/* ---- case 3: imported memory counts against the device ---- */
static void case3(void) {
    OK(aclrtSetDevice(0));
    size_t f0 = 0, total = 0;
    mem_info(&f0, &total);
    int fill = total <= FILL_LIMIT;
    size_t rounds = fill ? 200 : 16;
    if (!fill)
        NA_PART("the device fills with imports", "the device has %.1f GiB (checks fill at most "
                "%.1f GiB); %zu imports are counted instead", gib(total), gib(FILL_LIMIT),
                rounds);
    aclrtDrvMemHandle *imports = calloc(rounds, sizeof *imports);
    CHECK(imports != NULL);
    size_t held = 0;
    for (size_t i = 0; i < rounds; i++) {
        aclrtPhysicalMemProp prop = dev_prop(0);
        aclrtDrvMemHandle h = NULL;
        aclError e = aclrtMallocPhysical(&h, gran, &prop, 0);
        if (e != ACL_SUCCESS) {
            CHECK(fill);
            CHECK_EQ(e, ACL_ERROR_RT_MEMORY_ALLOCATION);
            CHECK(f0 - held * gran < gran); /* full: what the imports hold */
            continue;
        }
        uint64_t sh = 0;
        OK(aclrtMemExportToShareableHandle(h, ACL_MEM_HANDLE_TYPE_NONE, 0, &sh));
        OK(aclrtMemImportFromShareableHandle(sh, 0, &imports[held]));
        OK(aclrtFreePhysical(h));
        held++;
        /* The original is freed; the import keeps its memory on the device. */
        CHECK_EQ(free_mem(), f0 - held * gran);
    }
    if (fill) CHECK_EQ(held, f0 / gran);
    for (size_t i = 0; i < held; i++) {
        OK(aclrtFreePhysical(imports[i]));
        CHECK_EQ(free_mem(), f0 - (held - i - 1) * gran);
    }
    free(imports);
    OK(aclrtResetDevice(0));
    printf("case 3 ok: %zu imports held %zu MiB of the device until freed\n", held,
           held * gran / MIB);
}

/* ---- case 6: IPC of aclrtMalloc memory between processes ---- */
static int importer(int rfd, int wfd, unsigned pat) {
    OK(aclInit(NULL));
    OK(aclrtSetDevice(0));
    int32_t me = 0;
    OK(aclrtDeviceGetBareTgid(&me));
    write_all(wfd, &me, sizeof me);
    char key[65];
    read_all(rfd, key, sizeof key);
    void *p = NULL;
    OK(aclrtIpcMemImportByKey(&p, key, ACL_RT_IPC_MEM_IMPORT_FLAG_DEFAULT));
    EXPECT_BYTES(p, gran, (unsigned char)pat, "importer's view of the exporter's bytes");
    OK(aclrtMemset(p, 4096, 0x3C, 4096));
    OK(aclrtIpcMemClose(key));
    EXPECT_CODE(aclrtIpcMemClose(key), ACL_ERROR_RT_PARAM_INVALID);
    write_all(wfd, "ok", 2);
    char msg[6];
    read_all(rfd, msg, 6);
    if (memcmp(msg, "closed", 6) != 0) FAILF("unexpected message");
    /* The exporter closed the key: it imports no more. */
    void *q = (void *)0x5;
    EXPECT_CODE(aclrtIpcMemImportByKey(&q, key, 0), ACL_ERROR_RT_PARAM_INVALID);
    CHECK(q == (void *)0x5);
    OK(aclFinalize());
    return 0;
}

static int intruder(int rfd, int wfd) {
    OK(aclInit(NULL));
    OK(aclrtSetDevice(0));
    int32_t me = 0;
    OK(aclrtDeviceGetBareTgid(&me));
    write_all(wfd, &me, sizeof me);
    char key[65];
    read_all(rfd, key, sizeof key);
    void *p = (void *)0x5;
    EXPECT_CODE(aclrtIpcMemImportByKey(&p, key, 0), ACL_ERROR_RT_PARAM_INVALID);
    MSG_HAS("pid list");
    CHECK(p == (void *)0x5);
    write_all(wfd, "ok", 2);
    OK(aclFinalize());
    return 0;
}

static pid_t spawn(const char *mode, unsigned pat, int *to_child, int *from_child) {
    int down[2], up[2];
    CHECK(pipe(down) == 0 && pipe(up) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        char r[16], w[16], p[16];
        snprintf(r, sizeof r, "%d", down[0]);
        snprintf(w, sizeof w, "%d", up[1]);
        snprintf(p, sizeof p, "%u", pat);
        execl("/proc/self/exe", "acl_cases", mode, r, w, p, (char *)NULL);
        _exit(127);
    }
    close(down[0]);
    close(up[1]);
    *to_child = down[1];
    *from_child = up[0];
    return pid;
}

static void reap(pid_t pid, const char *what) {
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) FAILF("%s exited with status %#x", what, st);
}

static void case6(void) {
    OK(aclrtSetDevice(0));
    const unsigned pat = 0xA7;
    void *d = NULL;
    OK(aclrtMalloc(&d, gran, ACL_MEM_MALLOC_HUGE_FIRST));
    OK(aclrtMemset(d, gran, (int32_t)pat, gran));
    char key[65];
    memset(key, 0, sizeof key);
    /* Argument errors first (nothing exported). */
    EXPECT_CODE(aclrtIpcMemGetExportKey(d, gran, key, 4, 0), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtIpcMemGetExportKey(d, gran, key, sizeof key, 2), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtIpcMemGetExportKey(d, 0, key, sizeof key, 0), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtIpcMemGetExportKey(d, gran + 1, key, sizeof key, 0),
                ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtIpcMemGetExportKey((char *)d + 64, 64, key, sizeof key, 0),
                ACL_ERROR_RT_PARAM_INVALID);
    OK(aclrtIpcMemGetExportKey(d, gran, key, sizeof key, ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT));
    CHECK(strlen(key) > 0 && strlen(key) < 32);

    int to_imp, from_imp, to_int, from_int;
    pid_t imp = spawn("importer", pat, &to_imp, &from_imp);
    pid_t intr = spawn("intruder", pat, &to_int, &from_int);
    int32_t imp_pid = 0, intr_pid = 0;
    read_all(from_imp, &imp_pid, sizeof imp_pid);
    read_all(from_int, &intr_pid, sizeof intr_pid);
    CHECK_EQ(imp_pid, imp);
    CHECK_EQ(intr_pid, intr);
    /* Only the importer is whitelisted. */
    OK(aclrtIpcMemSetImportPid(key, &imp_pid, 1));
    EXPECT_CODE(aclrtIpcMemSetImportPid(key, &imp_pid, 0), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtIpcMemSetImportPid("hmipc.1.1", &imp_pid, 1), ACL_ERROR_RT_PARAM_INVALID);
    write_all(to_int, key, sizeof key);
    char ok[2];
    read_all(from_int, ok, 2);
    reap(intr, "the intruder");
    write_all(to_imp, key, sizeof key);
    read_all(from_imp, ok, 2);
    /* The importer wrote through its view: the exporter's memory has its bytes. */
    EXPECT_BYTES(d, 4096, 0x3C, "exporter after the importer's write");
    EXPECT_BYTES((char *)d + 4096, gran - 4096, (unsigned char)pat, "the rest");
    OK(aclrtIpcMemClose(key));
    EXPECT_CODE(aclrtIpcMemClose(key), ACL_ERROR_RT_PARAM_INVALID);
    write_all(to_imp, "closed", 6);
    reap(imp, "the importer");
    /* In this process too the closed key imports no more. */
    void *q = (void *)0x5;
    EXPECT_CODE(aclrtIpcMemImportByKey(&q, key, 0), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtIpcMemImportByKey(&q, "not a key", 0), ACL_ERROR_RT_PARAM_INVALID);
    CHECK(q == (void *)0x5);
    OK(aclrtFree(d));
    OK(aclrtResetDevice(0));
    close(to_imp);
    close(from_imp);
    close(to_int);
    close(from_int);
    printf("case 6 ok: IPC by key between processes, whitelist, key dead after close\n");
}

static size_t granularity(void) {
    aclrtPhysicalMemProp prop = dev_prop(0);
    size_t g = 0;
    OK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g));
    CHECK(g > 0);
    return g;
}

int main(int argc, char **argv) {
    if (argc >= 4) {
        OK(aclInit(NULL));
        OK(aclrtSetDevice(0));
        gran = granularity();
        OK(aclrtResetDevice(0));
        OK(aclFinalize());
        if (strcmp(argv[1], "importer") == 0 && argc >= 5)
            return importer(atoi(argv[2]), atoi(argv[3]), (unsigned)atoi(argv[4]));
        if (strcmp(argv[1], "intruder") == 0) return intruder(atoi(argv[2]), atoi(argv[3]));
        FAILF("unknown mode %s", argv[1]);
    }
    OK(aclInit(NULL));
    case8(); /* first: before any aclrtSetDevice */
    case1();
    case2();
    OK(aclrtSetDevice(0));
    gran = granularity();
    OK(aclrtResetDevice(0));
    case4();
    case5();
    case7();
    case3();
    case6();
    OK(aclFinalize());
    printf("acl cases ok\n");
    return 0;
}
