/* ACL virtual memory across real processes: reserve, map, export a physical handle to a
 * second process (fork + exec), "sleep" (unmap, free the physical memory) and "wake"
 * (re-create it and map it again at the same virtual address), plus every argument error of
 * the virtual-memory calls. The importer keeps its memory after the exporter frees its handle.
 *
 *   vmm_sleep_wake                      the exporter (the test)
 *   vmm_sleep_wake child RFD WFD PAT    an importer: reads the shareable handle from RFD, checks
 *                                       the bytes are PAT, writes 0xC5 over the first page, says
 *                                       "ok" on WFD, waits for "slept", checks again, exits 0
 *   vmm_sleep_wake intruder RFD WFD     a process not on the pid list: its import must fail
 *
 * Mapped memory is read and written only through aclrtMemcpy / aclrtMemset (device memory need
 * not be reachable through host pointers). */
#include <errno.h>
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

static int child(int rfd, int wfd, unsigned pat) {
    OK(aclInit(NULL));
    OK(aclrtSetDevice(0));
    uint64_t sh = 0;
    read_all(rfd, &sh, sizeof sh);
    aclrtDrvMemHandle h = NULL;
    OK(aclrtMemImportFromShareableHandle(sh, 0, &h));
    void *va = NULL;
    OK(aclrtReserveMemAddress(&va, gran, 0, NULL, 0));
    OK(aclrtMapMem(va, gran, 0, h, 0));
    EXPECT_BYTES(va, gran, (unsigned char)pat, "importer's view");
    OK(aclrtMemset(va, 4096, 0xC5, 4096));
    write_all(wfd, "ok", 2);
    char msg[6];
    read_all(rfd, msg, 6);
    if (memcmp(msg, "slept!", 6) != 0) FAILF("unexpected message");
    /* The exporter unmapped and freed its handle: our import still holds the memory. */
    EXPECT_BYTES(va, 4096, 0xC5, "importer after the exporter's sleep");
    EXPECT_BYTES((unsigned char *)va + 4096, gran - 4096, (unsigned char)pat, "rest");
    EXPECT_CODE(aclrtFreePhysical(h), ACL_ERROR_RT_PARAM_INVALID); /* still mapped */
    OK(aclrtUnmapMem(va));
    OK(aclrtFreePhysical(h));
    OK(aclrtReleaseMemAddress(va));
    OK(aclFinalize());
    return 0;
}

static int intruder(int rfd, int wfd) {
    OK(aclInit(NULL));
    OK(aclrtSetDevice(0));
    uint64_t sh = 0;
    read_all(rfd, &sh, sizeof sh);
    aclrtDrvMemHandle h = (aclrtDrvMemHandle)0x5;
    EXPECT_CODE(aclrtMemImportFromShareableHandle(sh, 0, &h), ACL_ERROR_RT_PARAM_INVALID);
    MSG_HAS("pid list");
    CHECK(h == (aclrtDrvMemHandle)0x5);
    write_all(wfd, "ok", 2);
    OK(aclFinalize());
    return 0;
}

/* Exports a handle, sends the value and exits without freeing anything or aclFinalize: the
 * library removes its shareable-handle file at exit. */
static int leaver(int wfd) {
    OK(aclInit(NULL));
    OK(aclrtSetDevice(0));
    aclrtPhysicalMemProp prop = dev_prop(0);
    aclrtDrvMemHandle h = NULL;
    OK(aclrtMallocPhysical(&h, gran, &prop, 0));
    uint64_t sh = 0;
    OK(aclrtMemExportToShareableHandle(h, ACL_MEM_HANDLE_TYPE_NONE, 1, &sh));
    write_all(wfd, &sh, sizeof sh);
    return 0;
}

/* Starts `mode` of this program as a new process; returns its pid and pipes. */
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
        execl("/proc/self/exe", "vmm_sleep_wake", mode, r, w, p, (char *)NULL);
        _exit(127);
    }
    close(down[0]);
    close(up[1]);
    *to_child = down[1];
    *from_child = up[0];
    return pid;
}

static void expect_exit0(pid_t pid, const char *what) {
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) FAILF("%s exited with status %#x", what, st);
}

/* va: two granules mapped (a, then another), every byte `pat`. */
static void argument_errors(void *va, aclrtDrvMemHandle a, unsigned char pat) {
    aclrtPhysicalMemProp prop = dev_prop(0);
    size_t g = 0;
    aclrtDrvMemHandle h = (aclrtDrvMemHandle)0x77;
    void *p = (void *)0x77;
    EXPECT_CODE(aclrtMemGetAllocationGranularity(&prop, (aclrtMemGranularityOptions)2, &g),
                ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtMemGetAllocationGranularity(NULL, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g),
                ACL_ERROR_INVALID_PARAM);
    prop.location.id = 5;
    EXPECT_CODE(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g),
                ACL_ERROR_RT_PARAM_INVALID);
    MSG_HAS("device id 5");
    EXPECT_CODE(aclrtMallocPhysical(&h, gran, &prop, 0), ACL_ERROR_RT_PARAM_INVALID);
    prop = dev_prop(0);
    prop.allocationType = (aclrtMemAllocationType)1;
    EXPECT_CODE(aclrtMallocPhysical(&h, gran, &prop, 0), ACL_ERROR_RT_PARAM_INVALID);
    prop = dev_prop(0);
    prop.handleType = (aclrtMemHandleType)1;
    EXPECT_CODE(aclrtMallocPhysical(&h, gran, &prop, 0), ACL_ERROR_RT_PARAM_INVALID);
    prop = dev_prop(0);
    EXPECT_CODE(aclrtMallocPhysical(&h, gran, &prop, 1), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtMallocPhysical(&h, 0, &prop, 0), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtMallocPhysical(&h, gran + 4096, &prop, 0), ACL_ERROR_RT_PARAM_INVALID);
    /* More than the device has free: refused before anything is made, whatever its size. */
    size_t free_now = 0, total = 0;
    mem_info(&free_now, &total);
    EXPECT_CODE(aclrtMallocPhysical(&h, (free_now / gran + 1) * gran, &prop, 0),
                ACL_ERROR_RT_MEMORY_ALLOCATION);
    EXPECT_CODE(aclrtMallocPhysical(NULL, gran, &prop, 0), ACL_ERROR_INVALID_PARAM);
    CHECK(h == (aclrtDrvMemHandle)0x77);
    EXPECT_CODE(aclrtReserveMemAddress(&p, 0, 0, NULL, 0), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtReserveMemAddress(&p, gran + 4096, 0, NULL, 0), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtReserveMemAddress(&p, gran, 3, NULL, 0), ACL_ERROR_RT_PARAM_INVALID);
    MSG_HAS("alignment 0x3");
    EXPECT_CODE(aclrtReserveMemAddress(NULL, gran, 0, NULL, 0), ACL_ERROR_INVALID_PARAM);
    CHECK(p == (void *)0x77);
    /* Sizes follow the reported granularity: 64 KiB (a hetmem page size, below it) is refused
       by reserve, physical memory and map alike, naming the granularity. */
    EXPECT_CODE(aclrtReserveMemAddress(&p, 64 * 1024, 0, NULL, 0), ACL_ERROR_RT_PARAM_INVALID);
    MSG_HAS("granularity");
    EXPECT_CODE(aclrtMallocPhysical(&h, 64 * 1024, &prop, 0), ACL_ERROR_RT_PARAM_INVALID);
    MSG_HAS("granularity");
    EXPECT_CODE(aclrtMapMem(va, 64 * 1024, 0, a, 0), ACL_ERROR_RT_PARAM_INVALID);
    MSG_HAS("granularity");
    CHECK(p == (void *)0x77 && h == (aclrtDrvMemHandle)0x77);
    /* Size 0 is ACL_ERROR_INVALID_PARAM for all three (one rule). */
    EXPECT_CODE(aclrtMapMem(va, 0, 0, a, 0), ACL_ERROR_INVALID_PARAM);
    MSG_HAS("size is 0");
    EXPECT_CODE(aclrtReserveMemAddress(&p, 0, 0, NULL, 0), ACL_ERROR_INVALID_PARAM);
    MSG_HAS("size is 0");
    EXPECT_CODE(aclrtMallocPhysical(&h, 0, &prop, 0), ACL_ERROR_INVALID_PARAM);
    MSG_HAS("size is 0");
    /* Map: flags, alignment, size, overlap, bad handle. va is mapped (both pages). */
    EXPECT_CODE(aclrtMapMem(va, gran, 0, a, 1), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtMapMem(va, gran, 0, a, 0), ACL_ERROR_RT_PARAM_INVALID); /* overlaps */
    EXPECT_CODE(aclrtMapMem(va, gran, 0, (aclrtDrvMemHandle)0x1234, 0), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtMapMem(NULL, gran, 0, a, 0), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtUnmapMem((char *)va + 4096), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtUnmapMem(NULL), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtReleaseMemAddress((char *)va + gran), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtFreePhysical(a), ACL_ERROR_RT_PARAM_INVALID); /* mapped */
    MSG_HAS("mapped");
    /* Export / import argument errors. */
    uint64_t sh = 0;
    EXPECT_CODE(aclrtMemExportToShareableHandle(a, (aclrtMemHandleType)1, 0, &sh),
                ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtMemExportToShareableHandle(a, ACL_MEM_HANDLE_TYPE_NONE, 2, &sh),
                ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtMemExportToShareableHandle(a, ACL_MEM_HANDLE_TYPE_NONE, 0, NULL),
                ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtMemExportToShareableHandle((aclrtDrvMemHandle)0x99, ACL_MEM_HANDLE_TYPE_NONE, 0, &sh),
                ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtMemImportFromShareableHandle(0xfeed00000001ULL, 0, &h), ACL_ERROR_RT_PARAM_INVALID);
    int32_t pid = 1;
    EXPECT_CODE(aclrtMemSetPidToShareableHandle(0xfeed00000001ULL, &pid, 1), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtMemSetPidToShareableHandle(0xfeed00000001ULL, NULL, 1), ACL_ERROR_INVALID_PARAM);
    CHECK(sh == 0);
    /* Still mapped and readable after all those refusals. */
    EXPECT_BYTES(va, 2 * gran, pat, "mapping after refused calls");
}

int main(int argc, char **argv) {
    aclrtPhysicalMemProp prop = dev_prop(0);
    if (argc >= 2) { /* a helper process */
        OK(aclInit(NULL));
        OK(aclrtSetDevice(0));
        OK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED, &gran));
        OK(aclFinalize());
        if (strcmp(argv[1], "child") == 0 && argc == 5)
            return child(atoi(argv[2]), atoi(argv[3]), (unsigned)atoi(argv[4]));
        if (strcmp(argv[1], "intruder") == 0 && argc >= 4)
            return intruder(atoi(argv[2]), atoi(argv[3]));
        if (strcmp(argv[1], "leaver") == 0 && argc >= 4)
            return leaver(atoi(argv[3]));
        FAILF("bad arguments");
    }

    OK(aclInit(NULL));
    OK(aclrtSetDevice(0));
    size_t gmin = 0;
    OK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &gmin));
    OK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED, &gran));
    CHECK_EQ(gran, 2 * MIB);
    CHECK_EQ(gmin, gran);
    size_t free0 = 0, total = 0, freen = 0;
    OK(aclrtGetMemInfo(ACL_HBM_MEM, &free0, &total));

    /* Reserve two granules, back them with two physical objects, fill. */
    void *va = NULL;
    OK(aclrtReserveMemAddress(&va, 2 * gran, 0, NULL, 0));
    CHECK(((uintptr_t)va & (gran - 1)) == 0);
    aclrtDrvMemHandle a = NULL, b = NULL;
    OK(aclrtMallocPhysical(&a, gran, &prop, 0));
    OK(aclrtMallocPhysical(&b, gran, &prop, 0));
    OK(aclrtGetMemInfo(ACL_HBM_MEM, &freen, &total));
    CHECK_EQ(freen, free0 - 2 * gran);
    OK(aclrtMapMem(va, gran, 0, a, 0));
    OK(aclrtMapMem((char *)va + gran, gran, 0, b, 0));
    OK(aclrtMemset(va, 2 * gran, 0x11, 2 * gran));
    argument_errors(va, a, 0x11);

    /* Export a to a child that is on the pid list; an intruder that is not fails. */
    uint64_t sh = 0;
    OK(aclrtMemExportToShareableHandle(a, ACL_MEM_HANDLE_TYPE_NONE, ACL_RT_VMM_EXPORT_FLAG_DEFAULT, &sh));
    uint64_t again = 0;
    EXPECT_CODE(aclrtMemExportToShareableHandle(a, ACL_MEM_HANDLE_TYPE_NONE, 0, &again),
                ACL_ERROR_RT_PARAM_INVALID);
    MSG_HAS("already exported");
    int to_c, from_c, to_i, from_i;
    pid_t c = spawn("child", 0x11, &to_c, &from_c);
    pid_t in = spawn("intruder", 0, &to_i, &from_i);
    int32_t allowed = (int32_t)c;
    OK(aclrtMemSetPidToShareableHandle(sh, &allowed, 1));
    write_all(to_i, &sh, sizeof sh);
    char ok[2];
    read_all(from_i, ok, 2);
    expect_exit0(in, "the intruder");
    write_all(to_c, &sh, sizeof sh);
    read_all(from_c, ok, 2);
    /* The child wrote through its own mapping of the same memory. */
    EXPECT_BYTES(va, 4096, 0xC5, "exporter sees the importer's write");
    EXPECT_BYTES((unsigned char *)va + 4096, 2 * gran - 4096, 0x11, "the rest");

    /* Sleep: unmap, free the physical memory (the child keeps its import). */
    void *va_before = va;
    OK(aclrtUnmapMem(va));
    OK(aclrtUnmapMem((char *)va + gran));
    EXPECT_CODE(aclrtUnmapMem(va), ACL_ERROR_RT_PARAM_INVALID);
    OK(aclrtFreePhysical(a));
    OK(aclrtFreePhysical(b));
    EXPECT_CODE(aclrtFreePhysical(a), ACL_ERROR_RT_PARAM_INVALID);
    OK(aclrtGetMemInfo(ACL_HBM_MEM, &freen, &total));
    CHECK_EQ(freen, free0); /* the device's memory is back */
    aclrtDrvMemHandle gone = NULL;
    EXPECT_CODE(aclrtMemImportFromShareableHandle(sh, 0, &gone), ACL_ERROR_RT_PARAM_INVALID);
    write_all(to_c, "slept!", 6);
    expect_exit0(c, "the importer");

    /* Wake: new physical memory mapped at the same virtual address. */
    OK(aclrtMallocPhysical(&a, gran, &prop, 0));
    OK(aclrtMallocPhysical(&b, gran, &prop, 0));
    OK(aclrtMapMem(va, gran, 0, a, 0));
    OK(aclrtMapMem((char *)va + gran, gran, 0, b, 0));
    CHECK(va == va_before);
    EXPECT_BYTES(va, 2 * gran, 0, "fresh physical memory");
    OK(aclrtMemset(va, 2 * gran, 0x22, 2 * gran));
    OK(aclrtMemcpy((char *)va + gran, gran, va, 4096, ACL_MEMCPY_DEVICE_TO_DEVICE));
    EXPECT_BYTES(va, 2 * gran, 0x22, "woken memory");
    /* Shared again, without pid validation, with a second importer. */
    OK(aclrtMemExportToShareableHandle(a, ACL_MEM_HANDLE_TYPE_POSIX,
                                       ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION, &sh));
    c = spawn("child", 0x22, &to_c, &from_c);
    write_all(to_c, &sh, sizeof sh);
    read_all(from_c, ok, 2);
    EXPECT_BYTES(va, 4096, 0xC5, "second importer's write");
    write_all(to_c, "slept!", 6);
    expect_exit0(c, "the second importer");
    /* An import in the exporting process itself, on the second device (device 0 where there
     * is only one). */
    uint32_t ndev = device_count();
    if (ndev < 2)
        NA_PART("an import on a device other than the exporter's",
                "only %u device (needs 2); the self import is on device 0", ndev);
    aclrtDrvMemHandle self = NULL;
    OK(aclrtMemImportFromShareableHandle(sh, ndev >= 2 ? 1 : 0, &self));
    void *va2 = NULL;
    OK(aclrtReserveMemAddress(&va2, gran, 0, NULL, 0));
    OK(aclrtMapMem(va2, gran, 0, self, 0));
    EXPECT_BYTES(va2, 4096, 0xC5, "self import");
    EXPECT_BYTES((unsigned char *)va2 + 4096, gran - 4096, 0x22, "self import, the rest");
    OK(aclrtUnmapMem(va2));
    OK(aclrtFreePhysical(self));
    OK(aclrtReleaseMemAddress(va2));

    /* A process that exits without freeing its export leaves no file behind. */
    pid_t lv = spawn("leaver", 0, &to_c, &from_c);
    uint64_t left = 0;
    read_all(from_c, &left, sizeof left);
    expect_exit0(lv, "the leaver");
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/hetmem-acl-shareable.%llu.%llu",
             (unsigned long long)(left >> 32), (unsigned long long)(left & 0xffffffffULL));
    if (access("/dev/shm", F_OK) == 0 && access(path, F_OK) == 0) FAILF("%s was left behind", path);
    EXPECT_CODE(aclrtMemImportFromShareableHandle(left, 0, &gone), ACL_ERROR_RT_PARAM_INVALID);

    /* Release with mappings in place unmaps them; the physical memory stays until freed. */
    OK(aclrtReleaseMemAddress(va));
    EXPECT_CODE(aclrtUnmapMem(va), ACL_ERROR_RT_PARAM_INVALID);
    OK(aclrtFreePhysical(a));
    OK(aclrtFreePhysical(b));
    OK(aclrtGetMemInfo(ACL_HBM_MEM, &freen, &total));
    CHECK_EQ(freen, free0);
    OK(aclrtResetDevice(0));
    OK(aclFinalize());
    printf("vmm sleep and wake across processes ok\n");
    return 0;
}
