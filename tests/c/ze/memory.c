/* USM allocations through the loader: host / device / shared with the chained descriptors the
 * installed header knows (compression hints, experimental relaxed limits), free, free with a
 * policy, properties, address range, in-process IPC; and their documented error paths. Device
 * memory is written and read through command-list fills and copies only; the capacity check
 * fills a device, so it runs on devices of at most 1 GiB. */
#include "common.h"

int main(void) {
    env_t e = setup();
    ze_device_properties_t dp = {ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
    MUST(zeDeviceGetProperties(e.dev[0], &dp));
    const size_t max = dp.maxMemAllocSize; /* 128 MiB on the host backend's 256 MiB devices */
    const uint64_t total1 = device_memory(last_device(&e));
    ze_device_handle_t d1 = last_device(&e); /* device 1; device 0 where there is one */
    dev_io_t io = dev_io(e.ctx, e.dev[0]);

    /* host / device / shared */
    void *h = NULL, *d = NULL, *s = NULL;
    OK(zeMemAllocHost(e.ctx, &HOST_DESC, 100000, 0, &h));
    OK(zeMemAllocDevice(e.ctx, &DEV_DESC, 1 << 20, 4096, e.dev[0], &d));
    OK(zeMemAllocShared(e.ctx, &DEV_DESC, &HOST_DESC, 3 << 20, 0, d1, &s));
    EXPECT(h && d && s);
    EXPECT(((uintptr_t)d & 4095) == 0);
    memset(h, 1, 100000); /* host-accessible, all of it */
    OK(dev_fill(&io, d, 2, 1 << 20)); /* device memory: through the device */
    memset(s, 3, 3 << 20);            /* shared: host-accessible */
    EXPECT(DEV_ALL(&io, d, 2, 1 << 20));

    ze_memory_allocation_properties_t mp = {ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    ze_device_handle_t pd = BOGUS(ze_device_handle_t);
    OK(zeMemGetAllocProperties(e.ctx, h, &mp, &pd));
    EXPECT(mp.type == ZE_MEMORY_TYPE_HOST && mp.id != 0 && pd == NULL);
    OK(zeMemGetAllocProperties(e.ctx, (char *)d + 100, &mp, &pd));
    /* an allocation's page size is the page-size query's answer for its size (64 KiB for 1 MiB
     * on the host backend; vm.c checks the query itself) */
    EXPECT(mp.type == ZE_MEMORY_TYPE_DEVICE && pd == e.dev[0] && mp.pageSize == page_size(e.ctx, e.dev[0], 1 << 20));
    OK(zeMemGetAllocProperties(e.ctx, s, &mp, &pd));
    EXPECT(mp.type == ZE_MEMORY_TYPE_SHARED && pd == d1 && mp.pageSize == page_size(e.ctx, d1, 3 << 20));
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
    /* Device capacity: device 1 holds only the shared allocation (3 MiB, charged in pages of
     * its size: 4 MiB). With 256 MiB and maxMemAllocSize 128 MiB: 128 + 120 MiB fit, 4 MiB
     * stay free, 16 MiB more do not fit until the first is freed. */
    const size_t sp = page_size(e.ctx, d1, 3 << 20);
    const uint64_t shared_charge = ((3u << 20) + sp - 1) / sp * sp;
    const uint64_t rest2 = total1 - shared_charge - max; /* what the second allocation may take */
    if (total1 > FILL_LIMIT) {
        NOT_APPLICABLE("device capacity (OUT_OF_DEVICE_MEMORY, and capacity coming back on free)",
                       "device memory is %.1f GiB: filling it is not done in a test (needs <= 1 GiB)", gib(total1));
    } else if (e.ndev < 2) {
        NOT_APPLICABLE("device capacity (OUT_OF_DEVICE_MEMORY, and capacity coming back on free)",
                       "only 1 device (needs 2: device 1 must hold nothing but the shared allocation)");
    } else if (total1 < shared_charge + max + (8u << 20) || rest2 - (4u << 20) > max || max < (12u << 20)) {
        NOT_APPLICABLE("device capacity (OUT_OF_DEVICE_MEMORY, and capacity coming back on free)",
                       "device 1 has %.3f GiB and maxMemAllocSize %.3f GiB: not the check's shape (two allocations "
                       "of at most maxMemAllocSize leaving 4 MiB free, the first at least 12 MiB)",
                       gib(total1), gib(max));
    } else {
        void *big1 = NULL, *big2 = NULL, *big3 = NULL;
        OK(zeMemAllocDevice(e.ctx, &DEV_DESC, max, 0, d1, &big1));
        OK(zeMemAllocDevice(e.ctx, &DEV_DESC, rest2 - (4 << 20), 0, d1, &big2)); /* 4 MiB stay free */
        CHECK(zeMemAllocDevice(e.ctx, &DEV_DESC, 16 << 20, 0, d1, &big3), ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
        EXPECT(big3 == NULL);
        OK(zeMemFree(e.ctx, big1));
        OK(zeMemAllocDevice(e.ctx, &DEV_DESC, 16 << 20, 0, d1, &big3)); /* capacity came back */
        OK(zeMemFree(e.ctx, big2));
        OK(zeMemFree(e.ctx, big3));
    }

    /* Chained descriptors the 1.4 header knows */
    ze_relaxed_allocation_limits_exp_desc_t rl = {ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC, NULL,
                                                  ZE_RELAXED_ALLOCATION_LIMITS_EXP_FLAG_MAX_SIZE};
    ze_device_mem_alloc_desc_t drl = {ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC, &rl, 0, 0};
    void *over = NULL;
    const uint64_t total0 = device_memory(e.dev[0]);
    if (max + (2 << 20) <= total0) {
        OK(zeMemAllocDevice(e.ctx, &drl, max + (2 << 20), 0, e.dev[0], &over)); /* over maxMemAllocSize */
        OK(zeMemFree(e.ctx, over));
    } else {
        /* past the device's whole memory even relaxed limits refuse (reference driver) */
        CHECK(zeMemAllocDevice(e.ctx, &drl, max + (2 << 20), 0, e.dev[0], &over), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
        NOT_APPLICABLE("a device allocation over maxMemAllocSize with relaxed limits",
                       "maxMemAllocSize is the whole device memory (%.1f GiB): no size is over it and within the device",
                       gib(total0));
    }
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
    EXPECT(DEV_BYTE(&io, (char *)v1 + 12345) == 2);
    OK(dev_fill(&io, (char *)d + 7, 99, 1));
    EXPECT(DEV_BYTE(&io, (char *)v2 + 7) == 99);
    OK(zeMemGetAddressRange(e.ctx, v1, &base, &size));
    /* a view spans the allocation rounded up to its pages (1 MiB in 64 KiB pages; 2 MiB where
     * pages are 2 MiB) */
    const size_t dpage = page_size(e.ctx, e.dev[0], 1 << 20);
    EXPECT(base == v1 && size == ((1u << 20) + dpage - 1) / dpage * dpage);
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

    dev_io_done(&io);
    OK(zeContextDestroy(e.ctx));
    return finish("memory");
}
