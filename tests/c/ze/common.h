/* Shared helpers of the hetmem-ze C suite: result checks that count, and the usual setup. */
#ifndef HETMEM_ZE_TEST_COMMON_H
#define HETMEM_ZE_TEST_COMMON_H
#define _GNU_SOURCE
#include <level_zero/ze_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>

static int failures = 0, passes = 0;
/* The driver setup() found: a failed check prints its last error description through the
 * loader's zeDriverGetLastErrorDescription where the loader has one (1.32), else the driver's
 * own from zeDriverGetExtensionFunctionAddress (Debian's 1.8 loader has no slot for it). */
static ze_driver_handle_t last_error_drv;
static void print_last_error(void) {
    typedef ze_result_t (*fn_t)(ze_driver_handle_t, const char **);
    static fn_t fn;
    static int looked;
    if (!looked) {
        looked = 1;
        fn = (fn_t)dlsym(RTLD_DEFAULT, "zeDriverGetLastErrorDescription");
        /* a loader without it (1.8): the driver's own, by name */
        if (!fn && last_error_drv &&
            zeDriverGetExtensionFunctionAddress(last_error_drv, "zeDriverGetLastErrorDescription",
                                                (void **)&fn) != ZE_RESULT_SUCCESS)
            fn = NULL;
    }
    const char *s = NULL;
    if (fn && last_error_drv && fn(last_error_drv, &s) == ZE_RESULT_SUCCESS && s && *s)
        fprintf(stderr, "  last error description: %s\n", s);
}

#define CHECK(call, expect)                                                                    \
    do {                                                                                       \
        ze_result_t r_ = (call);                                                               \
        if (r_ != (ze_result_t)(expect)) {                                                     \
            fprintf(stderr, "FAIL %s:%d: %s = 0x%x, expected %s (0x%x)\n", __FILE__, __LINE__, \
                    #call, (unsigned)r_, #expect, (unsigned)(expect));                         \
            print_last_error();                                                                \
            failures++;                                                                        \
        } else {                                                                               \
            passes++;                                                                          \
        }                                                                                      \
    } while (0)
#define OK(call) CHECK(call, ZE_RESULT_SUCCESS)
/* The loader's validation layer answers some calls itself (null arguments of any function):
 * where it does, the suite expects its answer in the validation pass (HETMEM_ZE_VALIDATION=1). */
static int validating = -1;
static int is_validating(void) {
    if (validating < 0) validating = getenv("HETMEM_ZE_VALIDATION") != NULL;
    return validating;
}
#define CHECK_V(call, plain, with_layer) CHECK(call, is_validating() ? (with_layer) : (plain))
#define EXPECT(cond)                                                                           \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                    \
            failures++;                                                                        \
        } else {                                                                               \
            passes++;                                                                          \
        }                                                                                      \
    } while (0)
/* A setup step that must work for the rest to mean anything. */
#define MUST(call)                                                                             \
    do {                                                                                       \
        ze_result_t r_ = (call);                                                               \
        if (r_ != ZE_RESULT_SUCCESS) {                                                         \
            fprintf(stderr, "FATAL %s:%d: %s = 0x%x\n", __FILE__, __LINE__, #call, (unsigned)r_); \
            exit(2);                                                                           \
        }                                                                                      \
    } while (0)

static int finish(const char *name) {
    printf("%s: %d checks passed, %d failed\n", name, passes, failures);
    return failures ? 1 : 0;
}

typedef struct {
    ze_driver_handle_t drv;
    ze_device_handle_t dev[4];
    uint32_t ndev;
    ze_context_handle_t ctx;
} env_t;

static env_t setup(void) {
    env_t e;
    memset(&e, 0, sizeof e);
    MUST(zeInit(0));
    uint32_t n = 1;
    MUST(zeDriverGet(&n, &e.drv));
    last_error_drv = e.drv;
    e.ndev = 4;
    MUST(zeDeviceGet(e.drv, &e.ndev, e.dev));
    ze_context_desc_t cd = {ZE_STRUCTURE_TYPE_CONTEXT_DESC, NULL, 0};
    MUST(zeContextCreate(e.drv, &cd, &e.ctx));
    return e;
}

static const ze_device_mem_alloc_desc_t DEV_DESC = {ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC, NULL, 0, 0};
static const ze_host_mem_alloc_desc_t HOST_DESC = {ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC, NULL, 0};

/* A handle value that is not null and was never given out. */
#define BOGUS(T) ((T)(uintptr_t)0x7777000000001234ull)

/* ---- Any conforming driver, any number of devices ------------------------------------------
 * Device memory (zeMemAllocDevice, device physical memory mapped in a reservation, IPC views of
 * either) is read and written only through command-list copies and fills: a driver need not
 * make it reachable through host pointers (the cuda backend does not). Sizes come from the
 * API's queries, the device count from zeDeviceGet. */

/* The backend named by HETMEM_BACKEND (default host), for the not-applicable lines. */
static const char *backend_name(void) {
    const char *b = getenv("HETMEM_BACKEND");
    return b && *b ? b : "host";
}
static const char *program_name(const char *file) {
    const char *s = strrchr(file, '/');
    return s ? s + 1 : file;
}
/* One loud line per check (or group of checks) that cannot apply here, with its reason, on
 * stdout (the harness re-emits it past the test capture; scripts/gpu-suite counts it):
 *   NOT APPLICABLE (<backend>) ze/<program>.c <what> [part]: <reason>
 * <what> has no colon. */
#define NOT_APPLICABLE(what, ...)                                                              \
    do {                                                                                       \
        printf("NOT APPLICABLE (%s) ze/%s %s [part]: ", backend_name(), program_name(__FILE__), \
               what);                                                                          \
        printf(__VA_ARGS__);                                                                   \
        printf("\n");                                                                          \
        fflush(stdout);                                                                        \
    } while (0)

/* Memory sizes in GiB, for the reasons. */
static double gib(uint64_t bytes) { return (double)bytes / (double)(1ull << 30); }
/* Filling a device (out-of-memory checks, "all capacity is back" checks) is done only on
 * devices of at most this much memory. */
#define FILL_LIMIT (1ull << 30)

/* totalSize of a device's first memory (zeDeviceGetMemoryProperties). */
static uint64_t device_memory(ze_device_handle_t dev) {
    uint32_t n = 1;
    ze_device_memory_properties_t mp = {ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES};
    MUST(zeDeviceGetMemoryProperties(dev, &n, &mp));
    return mp.totalSize;
}

/* Every device's whole capacity is free again (`what` names the check in the not-applicable
 * lines): each device takes two allocations of maxMemAllocSize, its whole memory where that is
 * half a device (the host backend's devices). A device over FILL_LIMIT, or whose
 * maxMemAllocSize is not half of it, gets a NOT APPLICABLE line saying which. */
#define EXPECT_CAPACITY_BACK(e, what) expect_capacity_back_at(e, what, __FILE__)
static void expect_capacity_back_at(const env_t *e, const char *what, const char *file) {
    for (uint32_t k = 0; k < e->ndev; k++) {
        ze_device_properties_t dp = {ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
        MUST(zeDeviceGetProperties(e->dev[k], &dp));
        const uint64_t total = device_memory(e->dev[k]);
        if (total > FILL_LIMIT || total != 2 * dp.maxMemAllocSize) {
            printf("NOT APPLICABLE (%s) ze/%s %s [part]: ", backend_name(), program_name(file), what);
            if (total > FILL_LIMIT)
                printf("device memory is %.1f GiB: filling it is not done in a test (needs <= 1 GiB)\n",
                       gib(total));
            else
                printf("device %u has %.3f GiB and maxMemAllocSize %.3f GiB (the check takes two maximal "
                       "allocations as the whole device)\n",
                       k, gib(total), gib(dp.maxMemAllocSize));
            fflush(stdout);
            continue;
        }
        void *a = NULL, *b = NULL;
        OK(zeMemAllocDevice(e->ctx, &DEV_DESC, dp.maxMemAllocSize, 0, e->dev[k], &a));
        OK(zeMemAllocDevice(e->ctx, &DEV_DESC, dp.maxMemAllocSize, 0, e->dev[k], &b));
        OK(zeMemFree(e->ctx, a));
        OK(zeMemFree(e->ctx, b));
    }
}
/* zeVirtualMemQueryPageSize for an allocation of `size` bytes on dev. */
static size_t page_size(ze_context_handle_t ctx, ze_device_handle_t dev, size_t size) {
    size_t p = 0;
    MUST(zeVirtualMemQueryPageSize(ctx, dev, size, &p));
    return p;
}
/* The last device (device 1 where there are two): checks that need a second device use it,
 * and fall back to device 0 where there is one. */
static ze_device_handle_t last_device(const env_t *e) { return e->dev[e->ndev - 1]; }

/* Parses a byte count as hetmem's environment takes it: digits, optionally K/M/G/T. */
static uint64_t parse_bytes(const char *s) {
    char *end = NULL;
    uint64_t v = strtoull(s, &end, 10);
    switch (end && *end ? *end : 0) {
    case 'K': case 'k': return v << 10;
    case 'M': case 'm': return v << 20;
    case 'G': case 'g': return v << 30;
    case 'T': case 't': return v << 40;
    default: return v;
    }
}
/* The host backend's modelled devices, as the environment configures them
 * (HETMEM_HOST_DEVICES, HETMEM_HOST_DEVICE_MEMORY: the harness sets both on the host backend
 * only; they mean nothing to another backend). 1 with the values when configured, else 0. */
static int modelled_devices(uint32_t *count, uint64_t *memory) {
    const char *n = getenv("HETMEM_HOST_DEVICES"), *m = getenv("HETMEM_HOST_DEVICE_MEMORY");
    if (!n || !m || strcmp(backend_name(), "host") != 0) return 0;
    *count = (uint32_t)strtoul(n, NULL, 10);
    *memory = parse_bytes(m);
    return 1;
}

/* Device memory through the device: a synchronous immediate command list (each append has
 * finished when it returns) and a host allocation to stage bytes through. */
typedef struct {
    ze_context_handle_t ctx;
    ze_command_list_handle_t list;
} dev_io_t;
static dev_io_t dev_io(ze_context_handle_t ctx, ze_device_handle_t dev) {
    dev_io_t io = {ctx, NULL};
    ze_command_queue_desc_t qd = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0,
                                  ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS, ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
    MUST(zeCommandListCreateImmediate(ctx, dev, &qd, &io.list));
    return io;
}
static void dev_io_done(dev_io_t *io) {
    MUST(zeCommandListDestroy(io->list));
    io->list = NULL;
}
/* Sets n bytes at p (any memory the device reaches) to c. */
static ze_result_t dev_fill(dev_io_t *io, void *p, unsigned char c, size_t n) {
    return zeCommandListAppendMemoryFill(io->list, p, &c, 1, n, NULL, 0, NULL);
}
/* Copies n bytes between host memory `host` (any: stack, malloc) and memory p the device
 * reaches, through a host allocation; to_device says which way. */
static ze_result_t dev_copy(dev_io_t *io, void *p, void *host, size_t n, int to_device) {
    void *stage = NULL;
    ze_result_t r = zeMemAllocHost(io->ctx, &HOST_DESC, n, 0, &stage);
    if (r != ZE_RESULT_SUCCESS) return r;
    if (to_device) {
        memcpy(stage, host, n);
        r = zeCommandListAppendMemoryCopy(io->list, p, stage, n, NULL, 0, NULL);
    } else {
        r = zeCommandListAppendMemoryCopy(io->list, stage, p, n, NULL, 0, NULL);
        if (r == ZE_RESULT_SUCCESS) memcpy(host, stage, n);
    }
    ze_result_t f = zeMemFree(io->ctx, stage);
    return r != ZE_RESULT_SUCCESS ? r : f;
}
static ze_result_t dev_read(dev_io_t *io, void *host, const void *p, size_t n) {
    return dev_copy(io, (void *)p, host, n, 0);
}
static ze_result_t dev_write(dev_io_t *io, void *p, const void *host, size_t n) {
    return dev_copy(io, p, (void *)host, n, 1);
}
/* The byte at p, read through the device; -1 (and a failure) if the copy fails. */
#define DEV_BYTE(io, p) dev_byte_at(io, p, __FILE__, __LINE__)
static int dev_byte_at(dev_io_t *io, const void *p, const char *file, int line) {
    unsigned char b = 0;
    ze_result_t r = dev_read(io, &b, p, 1);
    if (r != ZE_RESULT_SUCCESS) {
        fprintf(stderr, "FAIL %s:%d: reading a byte through the device = 0x%x\n", file, line, (unsigned)r);
        failures++;
        return -1;
    }
    return b;
}
/* 1 if all n bytes at p (read through the device) are c. */
#define DEV_ALL(io, p, c, n) dev_all_at(io, p, c, n, __FILE__, __LINE__)
static int dev_all_at(dev_io_t *io, const void *p, unsigned char c, size_t n, const char *file, int line) {
    unsigned char *buf = malloc(n);
    ze_result_t r = dev_read(io, buf, p, n);
    int all = r == ZE_RESULT_SUCCESS;
    if (!all) {
        fprintf(stderr, "FAIL %s:%d: reading %zu bytes through the device = 0x%x\n", file, line, n, (unsigned)r);
        failures++;
    }
    for (size_t i = 0; all && i < n; i++) all = buf[i] == c;
    free(buf);
    return all;
}
#endif
