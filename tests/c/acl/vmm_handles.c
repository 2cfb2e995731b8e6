/* Physical memory handles and the VMM calls across the library's life: the codes before
 * aclInit and after aclFinalize, a handle of an earlier instance, a stale handle whose slot a
 * new handle took, bit-flipped handles, and a release with a mapping still in it. */
#include <stdint.h>
#include <string.h>

#include "check.h"

static aclrtPhysicalMemProp dev_prop(void) {
    aclrtPhysicalMemProp p;
    memset(&p, 0, sizeof p);
    p.handleType = ACL_MEM_HANDLE_TYPE_NONE;
    p.allocationType = ACL_MEM_ALLOCATION_TYPE_PINNED;
    p.memAttr = ACL_HBM_MEM_HUGE;
    p.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    return p;
}

/* Every VMM call answers ACL_ERROR_UNINITIALIZE (before its argument checks). */
static void uninitialised(void *va, aclrtDrvMemHandle h, size_t gran) {
    aclrtPhysicalMemProp p = dev_prop();
    void *v = NULL;
    aclrtDrvMemHandle n = NULL;
    size_t g = 0;
    uint64_t s = 0;
    EXPECT_CODE(aclrtMemGetAllocationGranularity(&p, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g),
                ACL_ERROR_UNINITIALIZE);
    EXPECT_CODE(aclrtReserveMemAddress(&v, gran, 0, NULL, 0), ACL_ERROR_UNINITIALIZE);
    EXPECT_CODE(aclrtReserveMemAddress(NULL, 0, 0, NULL, 0), ACL_ERROR_UNINITIALIZE);
    EXPECT_CODE(aclrtMallocPhysical(&n, gran, &p, 0), ACL_ERROR_UNINITIALIZE);
    EXPECT_CODE(aclrtMallocPhysical(NULL, 0, NULL, 0), ACL_ERROR_UNINITIALIZE);
    EXPECT_CODE(aclrtMapMem(va, gran, 0, h, 0), ACL_ERROR_UNINITIALIZE);
    EXPECT_CODE(aclrtMapMem(NULL, 0, 0, NULL, 0), ACL_ERROR_UNINITIALIZE);
    EXPECT_CODE(aclrtUnmapMem(va), ACL_ERROR_UNINITIALIZE);
    EXPECT_CODE(aclrtUnmapMem(NULL), ACL_ERROR_UNINITIALIZE);
    EXPECT_CODE(aclrtFreePhysical(h), ACL_ERROR_UNINITIALIZE);
    EXPECT_CODE(aclrtFreePhysical(NULL), ACL_ERROR_UNINITIALIZE);
    EXPECT_CODE(aclrtReleaseMemAddress(va), ACL_ERROR_UNINITIALIZE);
    EXPECT_CODE(aclrtReleaseMemAddress(NULL), ACL_ERROR_UNINITIALIZE);
    EXPECT_CODE(aclrtMemGetAllocationPropertiesFromHandle(h, &p), ACL_ERROR_UNINITIALIZE);
    EXPECT_CODE(aclrtMemExportToShareableHandle(h, ACL_MEM_HANDLE_TYPE_NONE, 0, &s),
                ACL_ERROR_UNINITIALIZE);
    EXPECT_CODE(aclrtMemExportToShareableHandle(h, ACL_MEM_HANDLE_TYPE_NONE, 0, NULL),
                ACL_ERROR_UNINITIALIZE);
}

/* `h` is not a live handle: every call naming it answers 107000. */
static void unknown(aclrtDrvMemHandle h, void *va, size_t gran) {
    aclrtPhysicalMemProp q;
    uint64_t s = 0;
    EXPECT_CODE(aclrtMemGetAllocationPropertiesFromHandle(h, &q), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtMapMem(va, gran, 0, h, 0), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtFreePhysical(h), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtMemExportToShareableHandle(h, ACL_MEM_HANDLE_TYPE_NONE, 0, &s),
                ACL_ERROR_RT_PARAM_INVALID);
}

int main(void) {
    aclrtPhysicalMemProp p = dev_prop();
    size_t gran = 2 * MIB;
    uninitialised((void *)(uintptr_t)0x7f0000000000ULL, (aclrtDrvMemHandle)(uintptr_t)0x1000014,
                  gran);

    OK(aclInit(NULL));
    OK(aclrtSetDevice(0));
    OK(aclrtMemGetAllocationGranularity(&p, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &gran));
    void *va = NULL;
    OK(aclrtReserveMemAddress(&va, gran, 0, NULL, 0));
    aclrtDrvMemHandle h = NULL;
    OK(aclrtMallocPhysical(&h, gran, &p, 0));

    /* A handle with any one bit flipped is not found; the handle itself stays live. */
    for (int bit = 0; bit < 64; bit++) {
        aclrtDrvMemHandle f = (aclrtDrvMemHandle)((uintptr_t)h ^ ((uintptr_t)1 << bit));
        unknown(f, va, gran);
    }
    aclrtPhysicalMemProp q;
    OK(aclrtMemGetAllocationPropertiesFromHandle(h, &q));
    CHECK_EQ(q.location.id, 0);

    /* A freed handle stays dead when a new handle takes its place. */
    OK(aclrtFreePhysical(h));
    aclrtDrvMemHandle h2 = NULL;
    OK(aclrtMallocPhysical(&h2, gran, &p, 0));
    CHECK(h2 != h);
    unknown(h, va, gran);
    OK(aclrtMapMem(va, gran, 0, h2, 0));

    /* A release with a mapping still in it unmaps it and succeeds (the physical memory
     * stays, and is no longer mapped): its record goes with it. */
    OK(aclrtReleaseMemAddress(va));
    EXPECT_CODE(aclrtUnmapMem(va), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtReleaseMemAddress(va), ACL_ERROR_RT_PARAM_INVALID);
    OK(aclrtMemGetAllocationPropertiesFromHandle(h2, &q));
    OK(aclrtReserveMemAddress(&va, gran, 0, NULL, 0));
    OK(aclrtMapMem(va, gran, 0, h2, 0));

    /* A release takes exactly its own records, whether there are more records than granules
     * (each granule looked up) or fewer (the records scanned): three one-granule reservations
     * mapped, and one of four granules with two mappings. */
    void *small[3];
    aclrtDrvMemHandle sp[3];
    for (int i = 0; i < 3; i++) {
        OK(aclrtReserveMemAddress(&small[i], gran, 0, NULL, 0));
        OK(aclrtMallocPhysical(&sp[i], gran, &p, 0));
        OK(aclrtMapMem(small[i], gran, 0, sp[i], 0));
    }
    void *big = NULL;
    OK(aclrtReserveMemAddress(&big, 4 * gran, 0, NULL, 0));
    OK(aclrtMapMem((char *)big + gran, gran, 0, sp[0], 0));
    OK(aclrtMapMem((char *)big + 3 * gran, gran, 0, sp[1], 0));
    /* 6 records (with va's), 1 granule: looked up by granule. */
    OK(aclrtReleaseMemAddress(small[1]));
    EXPECT_CODE(aclrtUnmapMem(small[1]), ACL_ERROR_RT_PARAM_INVALID);
    /* 5 records, 4 granules: scanned. Only big's two go. */
    OK(aclrtUnmapMem(va));
    OK(aclrtReleaseMemAddress(big));
    EXPECT_CODE(aclrtUnmapMem((char *)big + gran), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtUnmapMem((char *)big + 3 * gran), ACL_ERROR_RT_PARAM_INVALID);
    OK(aclrtUnmapMem(small[0]));
    OK(aclrtUnmapMem(small[2]));
    for (int i = 0; i < 3; i++) {
        if (i != 1)
            OK(aclrtReleaseMemAddress(small[i]));
        OK(aclrtFreePhysical(sp[i]));
    }
    OK(aclrtMapMem(va, gran, 0, h2, 0));

    /* After aclFinalize: the life-cycle code, for live-looking handles too. */
    OK(aclFinalize());
    uninitialised(va, h2, gran);

    /* A new instance knows no handle, reservation or mapping of the last one, even where its
     * own handles take the same slots. */
    OK(aclInit(NULL));
    OK(aclrtSetDevice(0));
    aclrtDrvMemHandle h3 = NULL;
    OK(aclrtMallocPhysical(&h3, gran, &p, 0));
    CHECK(h3 != h2);
    EXPECT_CODE(aclrtUnmapMem(va), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtReleaseMemAddress(va), ACL_ERROR_RT_PARAM_INVALID);
    void *va3 = NULL;
    OK(aclrtReserveMemAddress(&va3, gran, 0, NULL, 0));
    unknown(h2, va3, gran);
    OK(aclrtMapMem(va3, gran, 0, h3, 0));
    OK(aclrtUnmapMem(va3));
    OK(aclrtFreePhysical(h3));
    OK(aclrtReleaseMemAddress(va3));
    OK(aclrtResetDevice(0));
    OK(aclFinalize());
    printf("vmm handles ok\n");
    return 0;
}
