/* Helpers of the ACL C tests: each check prints the failing expression, the code and the
 * library's message, then exits 1.
 *
 * The programs are written for any conforming implementation: device memory (aclrtMalloc,
 * physical memory mapped with aclrtMapMem) is read and written only through aclrtMemcpy /
 * aclrtMemset and their async forms, never through a host pointer; the device count, memory
 * and granularity come from the API's own answers. A check that cannot apply here prints, on
 * stdout, one line
 *
 *   NOT APPLICABLE (<backend>) tests/c/acl/<program>.c <what> [part]: <reason>
 *
 * (NA_PART), and the rest of the program goes on; a program that cannot run at all prints the
 * line without " [part]" (NA_WHOLE) and exits 77. The Rust runner re-emits these lines past
 * the test capture, so scripts/gpu-suite counts them. Whether a check applies is decided from
 * what the API answers (device count, aclrtGetMemInfo, what a call returns), never from the
 * backend's name. */
#ifndef HETMEM_ACL_TEST_CHECK_H
#define HETMEM_ACL_TEST_CHECK_H

#include <stdarg.h>
#include <stdint.h>
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
        const char *m_ = aclGetRecentErrMsg(); /* read once: this takes the message */     \
        if (m_ == NULL || !strstr(m_, (needle)))                                           \
            FAILF("message \"%s\" does not mention \"%s\"", m_ ? m_ : "(null)", (needle)); \
    } while (0)

#define MIB (1024UL * 1024UL)

#define GIB (1024UL * MIB)

/* Checks that fill a device (allocate until it is full) run only on a device of at most this
 * much memory; on a bigger one they print their NOT APPLICABLE line. */
#define FILL_LIMIT GIB

/* The backend the program runs on, for NOT APPLICABLE lines only (HETMEM_BACKEND, default
 * host). Never used to decide what to check. */
static inline const char *backend_name(void) {
    const char *b = getenv("HETMEM_BACKEND");
    return b != NULL && *b != '\0' ? b : "host";
}

static inline void na_line_(const char *file, int line, const char *what, int part,
                            const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static inline void na_line_(const char *file, int line, const char *what, int part,
                            const char *fmt, ...) {
    if (strchr(what, ':') != NULL) {
        fprintf(stderr, "%s:%d: a NOT APPLICABLE <what> may not hold a colon: %s\n", file, line,
                what);
        exit(1);
    }
    const char *base = strrchr(file, '/');
    base = base != NULL ? base + 1 : file;
    printf("NOT APPLICABLE (%s) tests/c/acl/%s %s%s: ", backend_name(), base, what,
           part ? " [part]" : "");
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

/* One check (or group of checks) `what` of this program does not apply here, for the reason
 * given (a printf format); the program goes on. */
#define NA_PART(what, ...) na_line_(__FILE__, __LINE__, (what), 1, __VA_ARGS__)

/* The whole program (from here on) does not apply here: prints the line and exits 77. */
#define NA_WHOLE(what, ...)                                                                \
    do {                                                                                   \
        na_line_(__FILE__, __LINE__, (what), 0, __VA_ARGS__);                              \
        exit(SKIP_EXIT);                                                                   \
    } while (0)

/* The number of devices, from aclrtGetDeviceCount (at least one). */
static inline uint32_t device_count(void) {
    uint32_t n = 0;
    aclError e = aclrtGetDeviceCount(&n);
    if (e != ACL_SUCCESS) FAILF("aclrtGetDeviceCount returned %d", e);
    if (n == 0) FAILF("aclrtGetDeviceCount answered 0 devices");
    return n;
}

/* Free and total memory of the current device (aclrtGetMemInfo). */
static inline void mem_info(size_t *free, size_t *total) {
    aclError e = aclrtGetMemInfo(ACL_HBM_MEM, free, total);
    if (e != ACL_SUCCESS) FAILF("aclrtGetMemInfo returned %d", e);
}

static inline double gib(size_t bytes) { return (double)bytes / (double)GIB; }

/* A number of the host backend's configuration (`var`: HETMEM_HOST_DEVICES, or a size with
 * K/M/G/T such as HETMEM_HOST_DEVICE_MEMORY=256M) that the runner set for this program, or 0
 * where it set none (the runner sets them for the host backend only). */
static inline unsigned long long configured_size(const char *var) {
    const char *v = getenv(var);
    if (v == NULL || *v == '\0') return 0;
    char *end = NULL;
    unsigned long long n = strtoull(v, &end, 10);
    switch (*end) {
    case 'K': n <<= 10; break;
    case 'M': n <<= 20; break;
    case 'G': n <<= 30; break;
    case 'T': n <<= 40; break;
    default: break;
    }
    return n;
}

/* Every byte of [p, p + n) is `v`; p may be any memory aclrtMemcpy reads (device memory,
 * mapped virtual memory, host or managed memory): read back through the device, in pieces. */
static inline void expect_bytes_(const char *file, int line, const void *p, size_t n,
                                 unsigned char v, const char *what) {
    size_t piece = n < 4 * MIB ? n : 4 * MIB;
    unsigned char *buf = malloc(piece);
    if (buf == NULL) FAILF("malloc(%zu)", piece);
    for (size_t off = 0; off < n; off += piece) {
        size_t len = n - off < piece ? n - off : piece;
        aclError e = aclrtMemcpy(buf, piece, (const char *)p + off, len, ACL_MEMCPY_DEVICE_TO_HOST);
        if (e != ACL_SUCCESS) {
            fprintf(stderr, "%s:%d: ", file, line);
            FAILF("%s: aclrtMemcpy of %zu bytes at +%#zx returned %d", what, len, off, e);
        }
        for (size_t i = 0; i < len; i++)
            if (buf[i] != v) {
                fprintf(stderr, "%s:%d: ", file, line);
                FAILF("%s: byte %zu is %#x, expected %#x", what, off + i, buf[i], v);
            }
    }
    free(buf);
}
#define EXPECT_BYTES(p, n, v, what) expect_bytes_(__FILE__, __LINE__, (p), (n), (v), (what))

/* Managed memory needs userfaultfd on the host backend; where the platform refuses it,
 * aclrtMemAllocManaged answers ACL_ERROR_RT_FEATURE_NOT_SUPPORT and the rest of the program
 * is not applicable, with the library's reason. */
#define managed_or_skip(size) managed_or_skip_(__FILE__, __LINE__, (size))
static inline void *managed_or_skip_(const char *file, int line, uint64_t size) {
    void *p = NULL;
    aclError e = aclrtMemAllocManaged(&p, size, ACL_RT_MEM_ATTACH_GLOBAL);
    if (e == ACL_ERROR_RT_FEATURE_NOT_SUPPORT) {
        na_line_(file, line, "managed memory", 0, "managed memory is unavailable here (%s)",
                 aclGetRecentErrMsg());
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
