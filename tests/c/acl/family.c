/* The calls beyond the core families, through hetmem's acl/acl.h: the aclrtMalloc* / aclrtFree*
 * variants, 2-D and batch copies, 32-bit fills, host registration and pointer attributes, V2
 * (and fabric) shareable handles, value write / wait on a stream, event flags, batch prefetch,
 * and the declared calls that answer ACL_ERROR_RT_FEATURE_NOT_SUPPORT with a reason.
 * Device memory is reached only through aclrtMemcpy / aclrtMemset; sizes come from the
 * granularity query. */
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"

static size_t gran;

static void mallocs(void) {
    void *p = NULL;
    OK(aclrtMallocAlign32(&p, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    OK(aclrtMemset(p, 4096, 0x12, 4096));
    EXPECT_BYTES(p, 4096, 0x12, "aclrtMallocAlign32 memory");
    OK(aclrtFreeWithDevSync(p));
    OK(aclrtMallocCached(&p, gran, ACL_MEM_MALLOC_HUGE_ONLY));
    OK(aclrtFree(p));
    aclrtMallocAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.attr = ACL_RT_MEM_ATTR_DEVICE_ID;
    attr.value.deviceId = device_count() - 1;
    aclrtMallocConfig cfg = {&attr, 1};
    OK(aclrtMallocWithCfg(&p, gran, ACL_MEM_MALLOC_HUGE_FIRST, &cfg));
    aclrtPtrAttributes pa;
    OK(aclrtPointerGetAttributes(p, &pa));
    CHECK_EQ(pa.location.type, ACL_MEM_LOCATION_TYPE_DEVICE);
    CHECK_EQ(pa.location.id, device_count() - 1);
    CHECK(pa.pageSize > 0);
    void *base = NULL;
    size_t size = 0;
    OK(aclrtMemGetAddressRange((char *)p + 100, &base, &size));
    CHECK(base == p);
    CHECK(size >= gran);
    OK(aclrtFree(p));
    OK(aclrtMallocWithCfg(&p, gran, ACL_MEM_MALLOC_HUGE_FIRST, NULL));
    OK(aclrtFree(p));
    attr.value.deviceId = 9999;
    EXPECT_CODE(aclrtMallocWithCfg(&p, gran, ACL_MEM_MALLOC_HUGE_FIRST, &cfg),
                ACL_ERROR_RT_PARAM_INVALID);
    attr.attr = (aclrtMallocAttrType)77;
    EXPECT_CODE(aclrtMallocWithCfg(&p, gran, ACL_MEM_MALLOC_HUGE_FIRST, &cfg),
                ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtMallocAlign32(&p, 0, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_PARAM);
    OK(aclrtMallocForTaskScheduler(&p, 4096, ACL_MEM_MALLOC_HUGE_FIRST, NULL));
    OK(aclrtFree(p));
    void *h = NULL;
    OK(aclrtMallocHostWithCfg(&h, 4096, NULL));
    OK(aclrtPointerGetAttributes(h, &pa));
    CHECK_EQ(pa.location.type, ACL_MEM_LOCATION_TYPE_HOST);
    OK(aclrtFreeHostWithDevSync(h));
    int local = 0;
    OK(aclrtPointerGetAttributes(&local, &pa));
    CHECK_EQ(pa.location.type, ACL_MEM_LOCATION_TYPE_UNREGISTERED);
    EXPECT_CODE(aclrtMemGetAddressRange(&local, &base, &size), ACL_ERROR_RT_PARAM_INVALID);
    printf("mallocs ok\n");
}

static void copies(void) {
    enum { W = 100, H = 7, SP = 160, DP = 128 };
    unsigned char src[SP * H], back[DP * H];
    for (size_t i = 0; i < sizeof src; i++) src[i] = (unsigned char)(i * 7 + 3);
    void *d = NULL;
    OK(aclrtMalloc(&d, gran, ACL_MEM_MALLOC_HUGE_FIRST));
    OK(aclrtMemset(d, gran, 0, gran));
    OK(aclrtMemcpy2d(d, DP, src, SP, W, H, ACL_MEMCPY_HOST_TO_DEVICE));
    OK(aclrtMemcpy(back, sizeof back, d, sizeof back, ACL_MEMCPY_DEVICE_TO_HOST));
    for (int r = 0; r < H; r++)
        for (int c = 0; c < DP; c++)
            CHECK_EQ(back[r * DP + c], c < W ? src[r * SP + c] : 0);
    EXPECT_CODE(aclrtMemcpy2d(d, 50, src, SP, W, H, ACL_MEMCPY_HOST_TO_DEVICE),
                ACL_ERROR_INVALID_PARAM); /* width over dpitch */
    EXPECT_CODE(aclrtMemcpy2d(d, DP, src, SP, W, 0, ACL_MEMCPY_HOST_TO_DEVICE),
                ACL_ERROR_INVALID_PARAM);
    aclrtStream s = NULL;
    OK(aclrtCreateStream(&s));
    OK(aclrtMemset(d, gran, 0, gran));
    /* Stream copies take memory the runtime knows: host memory of aclrtMallocHost. */
    unsigned char *hsrc = NULL;
    OK(aclrtMallocHost((void **)&hsrc, sizeof src));
    memcpy(hsrc, src, sizeof src);
    OK(aclrtMemcpy2dAsync(d, DP, hsrc, SP, W, H, ACL_MEMCPY_HOST_TO_DEVICE, s));
    OK(aclrtSynchronizeStream(s));
    OK(aclrtMemcpy(back, sizeof back, d, sizeof back, ACL_MEMCPY_DEVICE_TO_HOST));
    for (int r = 0; r < H; r++) CHECK_EQ(back[r * DP + 5], src[r * SP + 5]);

    /* Batch: three copies into the device memory, then back. */
    unsigned char a[64], b[64], c[64];
    memset(a, 0xA1, 64);
    memset(b, 0xB2, 64);
    memset(c, 0xC3, 64);
    void *dsts[3] = {d, (char *)d + 64, (char *)d + 128};
    void *srcs[3] = {a, b, c};
    size_t maxs[3] = {64, 64, 64}, sizes[3] = {64, 64, 64};
    aclrtMemcpyBatchAttr attrs[1];
    memset(attrs, 0, sizeof attrs);
    size_t idx[1] = {0};
    size_t fail = 0;
    OK(aclrtMemcpyBatch(dsts, maxs, srcs, sizes, 3, attrs, idx, 1, &fail));
    CHECK_EQ(fail, SIZE_MAX);
    EXPECT_BYTES((char *)d + 64, 64, 0xB2, "batch copy 1");
    sizes[2] = 65; /* over its destMax: refused before any copy */
    EXPECT_CODE(aclrtMemcpyBatch(dsts, maxs, srcs, sizes, 3, attrs, idx, 1, &fail),
                ACL_ERROR_INVALID_PARAM);
    sizes[2] = 64;
    size_t bad_idx[1] = {1};
    EXPECT_CODE(aclrtMemcpyBatchV2(dsts, maxs, srcs, sizes, 3, attrs, bad_idx, 1),
                ACL_ERROR_RT_PARAM_INVALID);
    memset(hsrc, 0x5E, 3 * 64);
    void *hsrcs[3] = {hsrc, hsrc + 64, hsrc + 128};
    OK(aclrtMemcpyBatchAsyncV2(dsts, maxs, hsrcs, sizes, 3, attrs, idx, 1, s));
    OK(aclrtMemcpyBatchAsync(dsts, maxs, hsrcs, sizes, 3, attrs, idx, 1, &fail, s));
    CHECK_EQ(fail, SIZE_MAX);
    OK(aclrtSynchronizeStream(s));
    EXPECT_BYTES(d, 64, 0x5E, "async batch copy 0");

    /* 32-bit fills. */
    OK(aclrtMemsetD32(d, gran, 0x01020304u, 1000));
    uint32_t w[1001];
    OK(aclrtMemcpy(w, sizeof w, d, sizeof w, ACL_MEMCPY_DEVICE_TO_HOST));
    for (int i = 0; i < 1000; i++) CHECK_EQ(w[i], 0x01020304u);
    CHECK(w[1000] != 0x01020304u);
    EXPECT_CODE(aclrtMemsetD32(d, 16, 1, 5), ACL_ERROR_INVALID_PARAM);
    OK(aclrtMemsetD32Async(d, gran, 0xDEADBEEFu, gran / 4, s));
    OK(aclrtSynchronizeStream(s));
    OK(aclrtMemcpy(w, sizeof w, (char *)d + gran - sizeof w, sizeof w,
                   ACL_MEMCPY_DEVICE_TO_HOST));
    for (int i = 0; i < 1001; i++) CHECK_EQ(w[i], 0xDEADBEEFu);
    OK(aclrtMemcpyAsyncWithCondition(d, gran, hsrc, 64, ACL_MEMCPY_HOST_TO_DEVICE, s));
    OK(aclrtSynchronizeStream(s));
    EXPECT_BYTES(d, 64, 0x5E, "copy with condition");
    OK(aclrtFreeHost(hsrc));
    OK(aclrtDestroyStream(s));
    OK(aclrtFree(d));
    printf("copies ok\n");
}

static void host_register(void) {
    long pg = sysconf(_SC_PAGESIZE);
    size_t len = 4 * (size_t)pg;
    unsigned char *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(mem != MAP_FAILED);
    memset(mem, 0x6B, len);
    void *dp = NULL;
    OK(aclrtHostRegister(mem, len, ACL_HOST_REGISTER_MAPPED, &dp));
    void *dp2 = NULL;
    OK(aclrtHostGetDevicePointer(mem + 10, &dp2, 0));
    CHECK(dp2 == mem + 10);
    aclrtPtrAttributes pa;
    OK(aclrtPointerGetAttributes(mem, &pa));
    CHECK_EQ(pa.location.type, ACL_MEM_LOCATION_TYPE_HOST);
    /* Devices reach it: a device copy reads it. */
    void *d = NULL;
    OK(aclrtMalloc(&d, gran, ACL_MEM_MALLOC_HUGE_FIRST));
    aclrtStream s = NULL;
    OK(aclrtCreateStream(&s));
    OK(aclrtMemcpyAsync(d, gran, dp, len, ACL_MEMCPY_HOST_TO_DEVICE, s));
    OK(aclrtSynchronizeStream(s));
    EXPECT_BYTES(d, len, 0x6B, "device copy of registered host memory");
    EXPECT_CODE(aclrtHostRegister(mem, len, ACL_HOST_REGISTER_MAPPED, &dp),
                ACL_ERROR_RT_PARAM_INVALID); /* registered already */
    OK(aclrtHostUnregister(mem));
    EXPECT_CODE(aclrtHostUnregister(mem), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtHostGetDevicePointer(mem, &dp2, 0), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtHostRegister(mem, len, ACL_HOST_REGISTER_IOMEMORY, &dp),
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_CODE(aclrtHostRegisterV2(mem, len, 0x1), ACL_ERROR_INVALID_PARAM);
    OK(aclrtHostRegisterV2(mem, len, ACL_HOST_REG_MAPPED | ACL_HOST_REG_PINNED));
    OK(aclrtHostGetDevicePointer(mem, &dp2, 0));
    OK(aclrtHostUnregister(mem));
    aclrtHostMemMapCapability cap = ACL_RT_HOST_MEM_MAP_NOT_SUPPORTED;
    OK(aclrtHostMemMapCapabilities(0, ACL_RT_HAC_TYPE_SDMA, &cap));
    CHECK_EQ(cap, ACL_RT_HOST_MEM_MAP_SUPPORTED);
    OK(aclrtDestroyStream(s));
    OK(aclrtFree(d));
    munmap(mem, len);
    printf("host registration ok\n");
}

static void shareable_v2(void) {
    aclrtPhysicalMemProp prop;
    memset(&prop, 0, sizeof prop);
    prop.memAttr = ACL_HBM_MEM_HUGE;
    prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    aclrtDrvMemHandle h = NULL;
    OK(aclrtMallocPhysical(&h, gran, &prop, 0));
    void *va = NULL;
    OK(aclrtReserveMemAddress(&va, 2 * gran, 0, NULL, 0));
    OK(aclrtMapMem(va, gran, 0, h, 0));
    OK(aclrtMemset(va, gran, 0x4D, gran));
    aclrtMemFabricHandle fab;
    memset(&fab, 0, sizeof fab);
    OK(aclrtMemExportToShareableHandleV2(h, 0, ACL_MEM_SHARE_HANDLE_TYPE_FABRIC, &fab));
    int32_t me = 0;
    OK(aclrtDeviceGetBareTgid(&me));
    OK(aclrtMemSetPidToShareableHandleV2(&fab, ACL_MEM_SHARE_HANDLE_TYPE_FABRIC, &me, 1));
    aclrtDrvMemHandle imp = NULL;
    OK(aclrtMemImportFromShareableHandleV2(&fab, ACL_MEM_SHARE_HANDLE_TYPE_FABRIC, 0, &imp));
    OK(aclrtMapMem((char *)va + gran, gran, 0, imp, 0));
    EXPECT_BYTES((char *)va + gran, gran, 0x4D, "fabric import");
    aclrtMemFabricHandle junk;
    memset(&junk, 0x33, sizeof junk);
    aclrtDrvMemHandle none = (aclrtDrvMemHandle)0x5;
    EXPECT_CODE(aclrtMemImportFromShareableHandleV2(&junk, ACL_MEM_SHARE_HANDLE_TYPE_FABRIC, 0,
                                                    &none),
                ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtMemImportFromShareableHandleV2(&fab, (aclrtMemSharedHandleType)3, 0, &none),
                ACL_ERROR_RT_PARAM_INVALID);
    CHECK(none == (aclrtDrvMemHandle)0x5);
    OK(aclrtUnmapMem((char *)va + gran));
    OK(aclrtFreePhysical(imp));
    /* DEFAULT: a uint64_t; exported once per handle. */
    uint64_t sh = 0;
    EXPECT_CODE(aclrtMemExportToShareableHandleV2(h, 0, ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT, &sh),
                ACL_ERROR_RT_PARAM_INVALID); /* already exported */
    OK(aclrtUnmapMem(va));
    OK(aclrtFreePhysical(h));
    OK(aclrtMallocPhysical(&h, gran, &prop, 0));
    OK(aclrtMemExportToShareableHandleV2(h, 0, ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT, &sh));
    OK(aclrtMemImportFromShareableHandleV2(&sh, ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT, 0, &imp));
    OK(aclrtFreePhysical(imp));
    OK(aclrtFreePhysical(h));
    OK(aclrtReleaseMemAddress(va));
    printf("shareable handles v2 ok\n");
}

static void values_and_events(void) {
    aclrtStream s = NULL;
    OK(aclrtCreateStream(&s));
    void *d = NULL;
    OK(aclrtMalloc(&d, gran, ACL_MEM_MALLOC_HUGE_FIRST));
    OK(aclrtMemset(d, gran, 0, gran));
    aclError e = aclrtValueWrite(d, 0x1122334455667788ull, 0, s);
    if (e == ACL_ERROR_RT_FEATURE_NOT_SUPPORT) {
        NA_PART("aclrtValueWrite / aclrtValueWait", "streams run no host steps here (%s)",
                aclGetRecentErrMsg());
    } else {
        OK(e);
        OK(aclrtValueWait(d, 0x1122334455667788ull, ACL_STREAM_WAIT_VALUE_EQ, s));
        OK(aclrtValueWrite((char *)d + 8, 5, 0, s));
        OK(aclrtValueWait((char *)d + 8, 4, ACL_STREAM_WAIT_VALUE_GEQ, s));
        OK(aclrtSynchronizeStream(s));
        uint64_t v[2] = {0, 0};
        OK(aclrtMemcpy(v, sizeof v, d, sizeof v, ACL_MEMCPY_DEVICE_TO_HOST));
        CHECK(v[0] == 0x1122334455667788ull && v[1] == 5);
        EXPECT_CODE(aclrtValueWrite((char *)d + 4, 1, 0, s), ACL_ERROR_RT_ADDR_UNALIGNED);
        EXPECT_CODE(aclrtValueWrite(d, 1, 1, s), ACL_ERROR_INVALID_PARAM);
        EXPECT_CODE(aclrtValueWait(d, 1, 9, s), ACL_ERROR_RT_PARAM_INVALID);
        int local[4];
        EXPECT_CODE(aclrtValueWrite(local, 1, 0, s), ACL_ERROR_RT_PARAM_INVALID);
    }
    aclrtEvent ev = NULL;
    OK(aclrtCreateEventWithFlag(&ev, ACL_EVENT_SYNC | ACL_EVENT_TIME_LINE));
    OK(aclrtRecordEvent(ev, s));
    OK(aclrtSynchronizeEvent(ev));
    OK(aclrtDestroyEvent(ev));
    OK(aclrtCreateEventExWithFlag(&ev, ACL_EVENT_SYNC));
    OK(aclrtDestroyEvent(ev));
    EXPECT_CODE(aclrtCreateEventWithFlag(&ev, ACL_EVENT_IPC), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_CODE(aclrtCreateEventWithFlag(&ev, 0x80000000u), ACL_ERROR_INVALID_PARAM);
    OK(aclrtDestroyStream(s));
    OK(aclrtFree(d));
    printf("values and events ok\n");
}

static void unsupported(void) {
    void *p = NULL;
    size_t n = 0;
    EXPECT_CODE(aclrtGetSymbolAddress(&n, &p), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    MSG_HAS("kernel");
    EXPECT_CODE(aclrtGetSymbolSize(&n, &n), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_CODE(aclrtMemcpyFromSymbol(&n, 8, &n, 8, 0, ACL_MEMCPY_DEVICE_TO_HOST),
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_CODE(aclrtMemcpyToSymbol(&n, &n, 8, 0, ACL_MEMCPY_HOST_TO_DEVICE),
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_CODE(aclrtMemcpyFromSymbolAsync(&n, 8, &n, 8, 0, ACL_MEMCPY_DEVICE_TO_HOST, NULL),
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_CODE(aclrtMemcpyToSymbolAsync(&n, &n, 8, 0, ACL_MEMCPY_HOST_TO_DEVICE, NULL),
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_CODE(aclrtGetMemcpyDescSize(ACL_MEMCPY_DEVICE_TO_DEVICE, &n),
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_CODE(aclrtSetMemcpyDesc(&n, ACL_MEMCPY_DEVICE_TO_DEVICE, &n, &n, 8, NULL),
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_CODE(aclrtMemcpyAsyncWithDesc(&n, ACL_MEMCPY_DEVICE_TO_DEVICE, NULL),
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_CODE(aclrtMemcpyAsyncWithOffset(&p, 8, 0, (const void **)&p, 8, 0,
                                           ACL_MEMCPY_DEVICE_TO_DEVICE, NULL),
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_CODE(aclrtLaunchKernel(NULL, 1, NULL, 0, NULL), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    MSG_HAS("kernels");
    EXPECT_CODE(aclrtIpcMemSetAttr("k", ACL_RT_IPC_MEM_ATTR_ACCESS_LINK, 0),
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_CODE(aclrtIpcMemImportPidInterServer("k", NULL, 0), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_CODE(aclrtReserveMemAddressNoUCMemory(&p, gran, 0, NULL, 0),
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_CODE(aclrtMemP2PMap(&n, 8, 0, 0), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_CODE(aclrtMemMapSelectedLink(&n, 8, &n, 0), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_CODE(aclrtMemMapSetLink(NULL, ACL_RT_MEM_ACCESS_LINK_SIO),
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    MSG_HAS("not modelled");
    printf("unsupported calls ok\n");
}

int main(void) {
    /* Before aclInit: 100001, not 207000. */
    EXPECT_CODE(aclrtLaunchKernel(NULL, 1, NULL, 0, NULL), ACL_ERROR_UNINITIALIZE);
    OK(aclInit(NULL));
    OK(aclrtSetDevice(0));
    aclrtPhysicalMemProp prop;
    memset(&prop, 0, sizeof prop);
    prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    OK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &gran));
    size_t free0 = 0, total = 0;
    mem_info(&free0, &total);
    mallocs();
    copies();
    host_register();
    shareable_v2();
    values_and_events();
    unsupported();
    size_t free1 = 0;
    mem_info(&free1, &total);
    CHECK_EQ(free1, free0);
    OK(aclrtResetDevice(0));
    OK(aclFinalize());
    printf("family ok\n");
    return 0;
}
