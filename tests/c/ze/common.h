/* Shared helpers of the hetmem-ze C suite: result checks that count, and the usual setup. */
#ifndef HETMEM_ZE_TEST_COMMON_H
#define HETMEM_ZE_TEST_COMMON_H
#define _GNU_SOURCE
#include <level_zero/ze_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0, passes = 0;

#define CHECK(call, expect)                                                                    \
    do {                                                                                       \
        ze_result_t r_ = (call);                                                               \
        if (r_ != (ze_result_t)(expect)) {                                                     \
            fprintf(stderr, "FAIL %s:%d: %s = 0x%x, expected %s (0x%x)\n", __FILE__, __LINE__, \
                    #call, (unsigned)r_, #expect, (unsigned)(expect));                         \
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
#endif
