/* Case 11 of shared/cases/level-zero.md: FABRIC_ACCESSIBLE handles, within one machine.
 * ZE_IPC_MEM_HANDLE_TYPE_FLAG_FABRIC_ACCESSIBLE chained at the creation of
 *   0. device USM (zeMemAllocDevice),
 *   1. host USM (zeMemAllocHost; where the driver exports host memory: NOT APPLICABLE, with the
 *      reason, where it answers UNSUPPORTED_FEATURE for host memory, as hetmem's cuda backend),
 *   2. physical memory (zePhysicalMemCreate), got with the physical handle as the pointer and
 *      mapped nowhere (case 7's way),
 *   3. physical memory mapped in a reservation, got with the range descriptor,
 * and asked at zeMemGetIpcHandleWithProperties -> SUCCESS; a child process opens each handle,
 * reads the parent's bytes and writes one back that the parent sees. For each: memory created
 * with DEFAULT and asked for FABRIC_ACCESSIBLE -> UNSUPPORTED_FEATURE, and the reverse; type
 * flags 4 at creation and at get -> INVALID_ENUMERATION. The driver lists the extension
 * ZE_extension_ipc_mem_handle_type and keeps ZE_IPC_PROPERTY_FLAG_MEMORY (the spec has no IPC
 * property flag for fabric handles). */
#include "ipc_common.h"

static const size_t M2 = 2 << 20;
/* A start hint of `g` GiB (the loader's validation layer refuses a null pStart). */
#define HINT(g) ((void *)(uintptr_t)((uint64_t)(g) << 30))
enum { DEV, HOST, PHYS, RANGE, KINDS };
static const char *const NAMES[KINDS] = {"device USM", "host USM", "physical memory", "mapped range"};

typedef struct {
    ze_ipc_mem_handle_t h[KINDS];
    uint32_t valid[KINDS];
    size_t size[KINDS];
} msg_t;

static int child(void) {
    env_t e = setup();
    dev_io_t io = dev_io(e.ctx, e.dev[0]);
    msg_t m;
    recv_msg(&m, sizeof m);
    for (int k = 0; k < KINDS; k++) {
        if (!m.valid[k]) continue;
        void *v = NULL;
        OK(zeMemOpenIpcHandle(e.ctx, e.dev[0], m.h[k], 0, &v));
        if (!v) continue;
        EXPECT(DEV_BYTE(&io, v) == 0x40 + k && DEV_BYTE(&io, (char *)v + m.size[k] - 1) == 0x40 + k);
        void *base = NULL;
        size_t size = 0;
        OK(zeMemGetAddressRange(e.ctx, v, &base, &size));
        EXPECT(base == v && size >= m.size[k]);
        OK(dev_fill(&io, (char *)v + 5, 0x60 + k, 1));
        OK(zeMemCloseIpcHandle(e.ctx, v));
    }
    sync_byte();
    dev_io_done(&io);
    OK(zeContextDestroy(e.ctx));
    return finish("cases_ipc11 (child)");
}

/* A handle-type descriptor of `flags`, chained before `next`. */
static ze_ipc_mem_handle_type_ext_desc_t types(uint32_t flags, const void *next) {
    ze_ipc_mem_handle_type_ext_desc_t t = {ZE_HETMEM_STYPE_IPC_MEM_HANDLE_TYPE_EXT_DESC, next, flags};
    return t;
}

int main(void) {
    pid_t pid = fork_child(child);
    env_t e = setup();
    ext_t x = ext(&e);
    dev_io_t io = dev_io(e.ctx, e.dev[0]);
    const uint32_t DEF = ZE_HETMEM_IPC_MEM_HANDLE_TYPE_FLAG_DEFAULT,
                   FAB = ZE_HETMEM_IPC_MEM_HANDLE_TYPE_FLAG_FABRIC_ACCESSIBLE;

    /* reported: the extension, and the IPC property flag the spec has */
    uint32_t n = 0;
    OK(zeDriverGetExtensionProperties(e.drv, &n, NULL));
    ze_driver_extension_properties_t xp[32];
    if (n > 32) n = 32;
    OK(zeDriverGetExtensionProperties(e.drv, &n, xp));
    int listed = 0;
    for (uint32_t i = 0; i < n; i++) listed |= strcmp(xp[i].name, ZE_HETMEM_IPC_MEM_HANDLE_TYPE_EXT_NAME) == 0;
    EXPECT(listed);
    ze_driver_ipc_properties_t ip = {ZE_STRUCTURE_TYPE_DRIVER_IPC_PROPERTIES};
    OK(zeDriverGetIpcProperties(e.drv, &ip));
    EXPECT(ip.flags == ZE_IPC_PROPERTY_FLAG_MEMORY);

    msg_t m;
    memset(&m, 0, sizeof m);
    ze_ipc_mem_handle_t junk;
    ze_ipc_mem_handle_type_ext_desc_t fab = types(FAB, NULL), def = types(DEF, NULL), bad = types(4, NULL);

    /* 0. device USM */
    void *dm = NULL, *dd = NULL, *tmp = NULL;
    {
        ze_device_mem_alloc_desc_t d = {ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC, &bad, 0, 0};
        CHECK(zeMemAllocDevice(e.ctx, &d, M2, 0, e.dev[0], &tmp), ZE_RESULT_ERROR_INVALID_ENUMERATION);
        d.pNext = &fab;
        OK(zeMemAllocDevice(e.ctx, &d, M2, 0, e.dev[0], &dm));
        d.pNext = &def;
        OK(zeMemAllocDevice(e.ctx, &d, M2, 0, e.dev[0], &dd));
    }
    OK(dev_fill(&io, dm, 0x40 + DEV, M2));
    OK(x.getp(e.ctx, dm, &fab, &m.h[DEV]));
    m.valid[DEV] = 1;
    m.size[DEV] = M2;
    CHECK(x.getp(e.ctx, dm, &def, &junk), ZE_RESULT_ERROR_UNSUPPORTED_FEATURE); /* created FABRIC only */
    CHECK(x.getp(e.ctx, dd, &fab, &junk), ZE_RESULT_ERROR_UNSUPPORTED_FEATURE); /* created DEFAULT only */
    CHECK(x.getp(e.ctx, dm, &bad, &junk), ZE_RESULT_ERROR_INVALID_ENUMERATION);

    /* 1. host USM */
    void *hm = NULL, *hd = NULL;
    {
        ze_host_mem_alloc_desc_t d = {ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC, &bad, 0};
        CHECK(zeMemAllocHost(e.ctx, &d, M2, 0, &tmp), ZE_RESULT_ERROR_INVALID_ENUMERATION);
        d.pNext = &fab;
        OK(zeMemAllocHost(e.ctx, &d, M2, 0, &hm));
        d.pNext = &def;
        OK(zeMemAllocHost(e.ctx, &d, M2, 0, &hd));
    }
    if (hm) memset(hm, 0x40 + HOST, M2);
    const ze_result_t hr = x.getp(e.ctx, hm, &fab, &m.h[HOST]);
    if (hr == ZE_RESULT_ERROR_UNSUPPORTED_FEATURE) {
        NOT_APPLICABLE("a FABRIC_ACCESSIBLE handle of host USM opened in another process",
                       "zeMemGetIpcHandle answers UNSUPPORTED_FEATURE for host memory (with the DEFAULT type too: "
                       "0x%x): the driver has no shareable handle for it",
                       (unsigned)zeMemGetIpcHandle(e.ctx, hm, &junk));
    } else {
        CHECK(hr, ZE_RESULT_SUCCESS);
        m.valid[HOST] = hr == ZE_RESULT_SUCCESS;
        m.size[HOST] = M2;
        CHECK(x.getp(e.ctx, hm, &def, &junk), ZE_RESULT_ERROR_UNSUPPORTED_FEATURE);
    }
    CHECK(x.getp(e.ctx, hd, &fab, &junk), ZE_RESULT_ERROR_UNSUPPORTED_FEATURE);
    CHECK(x.getp(e.ctx, hm, &bad, &junk), ZE_RESULT_ERROR_INVALID_ENUMERATION);

    /* 2. physical memory, its handle as the pointer, mapped nowhere at the get */
    const size_t P = page_size(e.ctx, e.dev[0], M2);
    ze_physical_mem_handle_t pf = NULL, pd = NULL, qf = NULL;
    {
        ze_physical_mem_desc_t d = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, &bad, 0, P};
        CHECK(zePhysicalMemCreate(e.ctx, e.dev[0], &d, &pf), ZE_RESULT_ERROR_INVALID_ENUMERATION);
        pf = NULL;
        d.pNext = &fab;
        OK(zePhysicalMemCreate(e.ctx, e.dev[0], &d, &pf));
        OK(zePhysicalMemCreate(e.ctx, e.dev[0], &d, &qf));
        d.pNext = &def;
        OK(zePhysicalMemCreate(e.ctx, e.dev[0], &d, &pd));
    }
    void *r = NULL, *rq = NULL;
    OK(zeVirtualMemReserve(e.ctx, HINT(100), P, &r));
    OK(zeVirtualMemMap(e.ctx, r, P, pf, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    OK(dev_fill(&io, r, 0x40 + PHYS, P));
    OK(zeVirtualMemUnmap(e.ctx, r, P));
    OK(x.getp(e.ctx, (const void *)pf, &fab, &m.h[PHYS]));
    m.valid[PHYS] = 1;
    m.size[PHYS] = P;
    CHECK(x.getp(e.ctx, (const void *)pf, &def, &junk), ZE_RESULT_ERROR_UNSUPPORTED_FEATURE);
    CHECK(x.getp(e.ctx, (const void *)pd, &fab, &junk), ZE_RESULT_ERROR_UNSUPPORTED_FEATURE);
    CHECK(x.getp(e.ctx, (const void *)pf, &bad, &junk), ZE_RESULT_ERROR_INVALID_ENUMERATION);

    /* 3. a mapped range: the range descriptor chained after the handle-type descriptor */
    ze_ipc_phys_mem_handle_range_ext_desc_t rd = {ZE_HETMEM_STYPE_IPC_PHYS_MEM_HANDLE_RANGE_EXT_DESC, NULL, P};
    ze_ipc_mem_handle_type_ext_desc_t fab_range = types(FAB, &rd), def_range = types(DEF, &rd),
                                      bad_range = types(4, &rd);
    OK(zeVirtualMemReserve(e.ctx, HINT(104), P, &rq));
    OK(zeVirtualMemMap(e.ctx, rq, P, qf, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    OK(dev_fill(&io, rq, 0x40 + RANGE, P));
    OK(x.getp(e.ctx, rq, &fab_range, &m.h[RANGE]));
    m.valid[RANGE] = 1;
    m.size[RANGE] = P;
    CHECK(x.getp(e.ctx, rq, &def_range, &junk), ZE_RESULT_ERROR_UNSUPPORTED_FEATURE);
    CHECK(x.getp(e.ctx, rq, &bad_range, &junk), ZE_RESULT_ERROR_INVALID_ENUMERATION);
    {
        /* the DEFAULT object mapped there instead: asked FABRIC, refused */
        void *rd_va = NULL;
        OK(zeVirtualMemReserve(e.ctx, HINT(108), P, &rd_va));
        OK(zeVirtualMemMap(e.ctx, rd_va, P, pd, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
        CHECK(x.getp(e.ctx, rd_va, &fab_range, &junk), ZE_RESULT_ERROR_UNSUPPORTED_FEATURE);
        OK(zeVirtualMemUnmap(e.ctx, rd_va, P));
        OK(zeVirtualMemFree(e.ctx, rd_va, P));
    }

    send_msg(&m, sizeof m, -1);
    wait_byte();
    /* the child's bytes, seen here */
    for (int k = 0; k < KINDS; k++) {
        if (!m.valid[k]) continue;
        void *at = k == DEV ? dm : k == HOST ? hm : k == PHYS ? r : rq;
        if (k == PHYS) OK(zeVirtualMemMap(e.ctx, r, P, pf, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
        const int got = DEV_BYTE(&io, (char *)at + 5), next = DEV_BYTE(&io, (char *)at + 6);
        if (got != 0x60 + k || next != 0x40 + k) {
            fprintf(stderr, "FAIL %s: the parent reads 0x%x 0x%x, expected 0x%x 0x%x\n", NAMES[k], got, next,
                    0x60 + k, 0x40 + k);
            failures++;
        } else {
            passes++;
        }
        if (k == HOST) EXPECT(((unsigned char *)hm)[5] == 0x60 + HOST);
        if (k == PHYS) OK(zeVirtualMemUnmap(e.ctx, r, P));
        OK(x.put(e.ctx, m.h[k]));
    }
    expect_child_ok(pid);
    OK(zeVirtualMemUnmap(e.ctx, rq, P));
    OK(zeVirtualMemFree(e.ctx, rq, P));
    OK(zeVirtualMemFree(e.ctx, r, P));
    OK(zePhysicalMemDestroy(e.ctx, pf));
    OK(zePhysicalMemDestroy(e.ctx, pd));
    OK(zePhysicalMemDestroy(e.ctx, qf));
    OK(zeMemFree(e.ctx, dm));
    OK(zeMemFree(e.ctx, dd));
    OK(zeMemFree(e.ctx, hm));
    OK(zeMemFree(e.ctx, hd));
    dev_io_done(&io);
    OK(zeContextDestroy(e.ctx));
    return finish("cases_ipc11 (parent)");
}
