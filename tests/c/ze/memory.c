/* USM allocations through the loader: host / device / shared with the chained descriptors the
 * installed header knows (compression hints, experimental relaxed limits), free, free with a
 * policy, properties, address range, in-process IPC; and their documented error paths. */
#include "common.h"

int main(void) {
    env_t e = setup();
    ze_device_properties_t dp = {ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
    MUST(zeDeviceGetProperties(e.dev[0], &dp));
    const size_t max = dp.maxMemAllocSize; /* 128 MiB */

    /* host / device / shared */
    void *h = NULL, *d = NULL, *s = NULL;
    OK(zeMemAllocHost(e.ctx, &HOST_DESC, 100000, 0, &h));
    OK(zeMemAllocDevice(e.ctx, &DEV_DESC, 1 << 20, 4096, e.dev[0], &d));
    OK(zeMemAllocShared(e.ctx, &DEV_DESC, &HOST_DESC, 3 << 20, 0, e.dev[1], &s));
    EXPECT(h && d && s);
    EXPECT(((uintptr_t)d & 4095) == 0);
    memset(h, 1, 100000); /* host-accessible, all of it */
    memset(d, 2, 1 << 20);
    memset(s, 3, 3 << 20);

    ze_memory_allocation_properties_t mp = {ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    ze_device_handle_t pd = BOGUS(ze_device_handle_t);
    OK(zeMemGetAllocProperties(e.ctx, h, &mp, &pd));
    EXPECT(mp.type == ZE_MEMORY_TYPE_HOST && mp.id != 0 && pd == NULL);
    OK(zeMemGetAllocProperties(e.ctx, (char *)d + 100, &mp, &pd));
    EXPECT(mp.type == ZE_MEMORY_TYPE_DEVICE && pd == e.dev[0] && mp.pageSize == 64 << 10);
    OK(zeMemGetAllocProperties(e.ctx, s, &mp, &pd));
    EXPECT(mp.type == ZE_MEMORY_TYPE_SHARED && pd == e.dev[1] && mp.pageSize == 2 << 20);
    OK(zeMemGetAllocProperties(e.ctx, s, &mp, NULL)); /* phDevice is optional */
    int local = 0;
    OK(zeMemGetAllocProperties(e.ctx, &local, &mp, &pd)); /* unknown memory: UNKNOWN, id 0 */
    EXPECT(mp.type == ZE_MEMORY_TYPE_UNKNOWN && mp.id == 0 && pd == NULL);
    CHECK(zeMemGetAllocProperties(e.ctx, h, NULL, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    CHECK_V(zeMemGetAllocProperties(e.ctx, NULL, &mp, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER,
            ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    CHECK(zeMemGetAllocProperties(BOGUS(ze_context_handle_t), h, &mp, NULL), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);

    void *base = NULL;
    size_t size = 0;
    OK(zeMemGetAddressRange(e.ctx, (char *)h + 99999, &base, &size));
    EXPECT(base == h && size == 100000);
    OK(zeMemGetAddressRange(e.ctx, (char *)d + 5, NULL, &size)); /* both outputs optional */
    EXPECT(size == 1 << 20);
    CHECK(zeMemGetAddressRange(e.ctx, &local, &base, &size), ZE_RESULT_ERROR_UNKNOWN);

    /* Errors of allocation: nothing is allocated, *pptr is untouched */
    void *x = BOGUS(void *);
    CHECK(zeMemAllocDevice(e.ctx, &DEV_DESC, 0, 0, e.dev[0], &x), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    CHECK(zeMemAllocDevice(e.ctx, &DEV_DESC, 4096, 3, e.dev[0], &x), ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT);
    CHECK(zeMemAllocDevice(e.ctx, &DEV_DESC, max + (2 << 20), 0, e.dev[0], &x), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    CHECK(zeMemAllocHost(e.ctx, &HOST_DESC, 4096, 0, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    CHECK(zeMemAllocHost(e.ctx, NULL, 4096, 0, &x), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    ze_device_mem_alloc_desc_t badflags = {ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC, NULL, 0x8, 0};
    CHECK(zeMemAllocDevice(e.ctx, &badflags, 4096, 0, e.dev[0], &x), ZE_RESULT_ERROR_INVALID_ENUMERATION);
    CHECK(zeMemAllocDevice(e.ctx, &DEV_DESC, 4096, 0, BOGUS(ze_device_handle_t), &x), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    EXPECT(x == BOGUS(void *));
    /* Device capacity: 256 MiB, 4 MiB used by the shared allocation on device 1: 128 + 120 MiB
     * fit, 16 MiB more does not, until the first is freed. */
    void *big1 = NULL, *big2 = NULL, *big3 = NULL;
    OK(zeMemAllocDevice(e.ctx, &DEV_DESC, max, 0, e.dev[1], &big1));
    OK(zeMemAllocDevice(e.ctx, &DEV_DESC, max - (8 << 20), 0, e.dev[1], &big2));
    CHECK(zeMemAllocDevice(e.ctx, &DEV_DESC, 16 << 20, 0, e.dev[1], &big3), ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
    EXPECT(big3 == NULL);
    OK(zeMemFree(e.ctx, big1));
    OK(zeMemAllocDevice(e.ctx, &DEV_DESC, 16 << 20, 0, e.dev[1], &big3)); /* capacity came back */
    OK(zeMemFree(e.ctx, big2));
    OK(zeMemFree(e.ctx, big3));

    /* Chained descriptors the 1.4 header knows */
    ze_relaxed_allocation_limits_exp_desc_t rl = {ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC, NULL,
                                                  ZE_RELAXED_ALLOCATION_LIMITS_EXP_FLAG_MAX_SIZE};
    ze_device_mem_alloc_desc_t drl = {ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC, &rl, 0, 0};
    void *over = NULL;
    OK(zeMemAllocDevice(e.ctx, &drl, max + (2 << 20), 0, e.dev[0], &over)); /* over maxMemAllocSize */
    OK(zeMemFree(e.ctx, over));
    rl.flags = 0; /* without MAX_SIZE: INVALID_ARGUMENT (reference driver) */
    CHECK(zeMemAllocDevice(e.ctx, &drl, 4096, 0, e.dev[0], &over), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    rl.flags = 0x2;
    CHECK_V(zeMemAllocDevice(e.ctx, &drl, 4096, 0, e.dev[0], &over), ZE_RESULT_ERROR_INVALID_ENUMERATION,
            ZE_RESULT_ERROR_INVALID_ENUMERATION);
    ze_memory_compression_hints_ext_desc_t ch = {ZE_STRUCTURE_TYPE_MEMORY_COMPRESSION_HINTS_EXT_DESC, NULL,
                                                 ZE_MEMORY_COMPRESSION_HINTS_EXT_FLAG_COMPRESSED};
    ze_device_mem_alloc_desc_t dch = {ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC, &ch, 0, 0};
    void *cp = NULL;
    OK(zeMemAllocDevice(e.ctx, &dch, 65536, 0, e.dev[0], &cp));
    OK(zeMemFree(e.ctx, cp));
    ch.flags = 0x3; /* both: not exactly one */
    CHECK(zeMemAllocDevice(e.ctx, &dch, 65536, 0, e.dev[0], &cp), ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION);
    /* A chained structure the call does not take */
    ze_context_desc_t foreign = {ZE_STRUCTURE_TYPE_CONTEXT_DESC, NULL, 0};
    ze_host_mem_alloc_desc_t hf = {ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC, &foreign, 0};
    CHECK(zeMemAllocHost(e.ctx, &hf, 4096, 0, &cp), ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION);

    /* In-process IPC: distinct views of the same bytes */
    ze_ipc_mem_handle_t ih;
    OK(zeMemGetIpcHandle(e.ctx, d, &ih));
    void *v1 = NULL, *v2 = NULL;
    OK(zeMemOpenIpcHandle(e.ctx, e.dev[0], ih, 0, &v1));
    OK(zeMemOpenIpcHandle(e.ctx, e.dev[0], ih, 0, &v2));
    EXPECT(v1 && v2 && v1 != v2 && v1 != d);
    EXPECT(((unsigned char *)v1)[12345] == 2);
    ((unsigned char *)d)[7] = 99;
    EXPECT(((unsigned char *)v2)[7] == 99);
    OK(zeMemGetAddressRange(e.ctx, v1, &base, &size));
    EXPECT(base == v1 && size == 1 << 20);
    CHECK_V(zeMemOpenIpcHandle(e.ctx, e.dev[0], ih, 0x4, &v1), ZE_RESULT_ERROR_INVALID_ENUMERATION,
            ZE_RESULT_ERROR_INVALID_ENUMERATION);
    ze_ipc_mem_handle_t junk;
    memset(&junk, 0x5a, sizeof junk);
    void *vj = NULL;
    CHECK(zeMemOpenIpcHandle(e.ctx, e.dev[0], junk, 0, &vj), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    CHECK(zeMemOpenIpcHandle(e.ctx, e.dev[0], ih, 0, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    OK(zeMemCloseIpcHandle(e.ctx, v1));
    OK(zeMemCloseIpcHandle(e.ctx, v2));
    CHECK(zeMemCloseIpcHandle(e.ctx, v2), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* closed */
    CHECK(zeMemGetIpcHandle(e.ctx, &local, &ih), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    CHECK(zeMemGetIpcHandle(e.ctx, d, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);

    /* Free: interior / unknown / double */
    CHECK(zeMemFree(e.ctx, (char *)h + 1), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    CHECK(zeMemFree(e.ctx, &local), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    CHECK_V(zeMemFree(e.ctx, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER, ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    OK(zeMemFree(e.ctx, h));
    CHECK(zeMemFree(e.ctx, h), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    /* zeMemFreeExt: each policy, bad policy, bad stype, null descriptor */
    ze_memory_free_ext_desc_t fd = {ZE_STRUCTURE_TYPE_MEMORY_FREE_EXT_DESC, NULL, 0x4};
    CHECK(zeMemFreeExt(e.ctx, &fd, d), ZE_RESULT_ERROR_INVALID_ENUMERATION);
    fd.freePolicy = ZE_DRIVER_MEMORY_FREE_POLICY_EXT_FLAG_BLOCKING_FREE;
    fd.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC;
    CHECK(zeMemFreeExt(e.ctx, &fd, d), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    CHECK(zeMemFreeExt(e.ctx, NULL, d), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    fd.stype = ZE_STRUCTURE_TYPE_MEMORY_FREE_EXT_DESC;
    OK(zeMemFreeExt(e.ctx, &fd, d));
    fd.freePolicy = ZE_DRIVER_MEMORY_FREE_POLICY_EXT_FLAG_DEFER_FREE;
    OK(zeMemFreeExt(e.ctx, &fd, s));
    CHECK(zeMemFreeExt(e.ctx, &fd, s), ZE_RESULT_ERROR_INVALID_ARGUMENT);

    OK(zeContextDestroy(e.ctx));
    return finish("memory");
}
