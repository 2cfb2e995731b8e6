/* Virtual and physical memory through the loader: reserve, page size, physical objects, map,
 * aliases, access attributes (checked on queued copies, and on host accesses where the driver
 * makes device memory reachable through host pointers: a write to a READONLY page faults),
 * outSize, unmap, free, and the documented error paths. zePhysicalMemGetProperties (no slot in
 * the 1.4 loader) through zeDriverGetExtensionFunctionAddress. Every size derives from the
 * page-size query (64 KiB base pages and 2 MiB pages on the host backend, 2 MiB for both on a
 * GPU); device memory is written and read through fills and copies. */
#include "common.h"
#include "ze_hetmem.h"
#include <setjmp.h>
#include <signal.h>

/* A host access to p in this process, a SIGSEGV / SIGBUS caught: the signal, or 0. (In this
 * process, not a forked child: a driver may keep its mappings out of children.) */
static sigjmp_buf fault_jmp;
static void on_fault(int sig) { siglongjmp(fault_jmp, sig); }
static int host_access(volatile char *p, int write) {
    struct sigaction sa, old_segv, old_bus;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fault;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
    int sig = sigsetjmp(fault_jmp, 1);
    if (sig == 0) {
        char c = p[0];
        if (write) p[0] = c; /* the byte it holds: nothing changes where the write is allowed */
    }
    sigaction(SIGSEGV, &old_segv, NULL);
    sigaction(SIGBUS, &old_bus, NULL);
    return sig;
}

int main(void) {
    env_t e = setup();
    const size_t M2 = 2 << 20, K64 = 64 << 10;
    /* B: the base page (unmap and the access attributes work on it); P: the page of 2 MiB */
    size_t B = 0, P = 0, page = 0;
    OK(zeVirtualMemQueryPageSize(e.ctx, e.dev[0], 1, &B));
    OK(zeVirtualMemQueryPageSize(e.ctx, e.dev[0], M2, &P));
    /* 64 KiB below 2 MiB and 2 MiB from 2 MiB up (the reference driver), never below the
     * device's mapping granularity */
    if (B == K64) {
        EXPECT(P == M2);
    } else {
        EXPECT(B > K64 && (B & (B - 1)) == 0); /* the granularity: a power of two */
        EXPECT(P == (B > M2 ? B : M2));
        NOT_APPLICABLE("the 64 KiB page size of sizes below 2 MiB",
                       "zeVirtualMemQueryPageSize of 1 byte answers %zu KiB, the device's mapping granularity", B >> 10);
    }
    OK(zeVirtualMemQueryPageSize(e.ctx, e.dev[0], M2 - 1, &page));
    EXPECT(page == B);
    OK(zeVirtualMemQueryPageSize(e.ctx, e.dev[0], 4 * M2, &page));
    EXPECT(page == P);
    /* size 0: case 3, in cases_vm.c */
    CHECK(zeVirtualMemQueryPageSize(e.ctx, e.dev[0], M2, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    CHECK(zeVirtualMemQueryPageSize(e.ctx, BOGUS(ze_device_handle_t), M2, &page), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    /* The physical object: S = 2H bytes, H (the half made READONLY below) a whole number of
     * base pages and S of pages of its size. Host backend: H = 1 MiB, S = 2 MiB; 2 MiB base
     * pages: H = 2 MiB, S = 4 MiB. The reservation holds 4 S. */
    const size_t H = B > P / 2 ? B : P / 2, S = 2 * H;
    EXPECT(S % page_size(e.ctx, e.dev[0], S) == 0);

    /* The 1.4 validation layer still requires a start hint (optional since): pass one. */
    void *const HINT = (void *)(uintptr_t)(64ull << 30);
    void *r = NULL;
    OK(zeVirtualMemReserve(e.ctx, HINT, 4 * S, &r));
    EXPECT(r && ((uintptr_t)r % page_size(e.ctx, e.dev[0], 4 * S)) == 0);
    void *bad = BOGUS(void *);
    CHECK(zeVirtualMemReserve(e.ctx, HINT, 0, &bad), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    CHECK_V(zeVirtualMemReserve(e.ctx, NULL, 0, &bad), ZE_RESULT_ERROR_UNSUPPORTED_SIZE, ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    CHECK(zeVirtualMemReserve(e.ctx, HINT, S, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    EXPECT(bad == BOGUS(void *));

    ze_physical_mem_desc_t pd = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, NULL, 0, S};
    ze_physical_mem_handle_t ph = NULL, hostph = NULL, hostph2 = NULL, badph = NULL;
    OK(zePhysicalMemCreate(e.ctx, e.dev[0], &pd, &ph));
    ze_physical_mem_desc_t hd = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, NULL, ZE_HETMEM_PHYSICAL_MEM_FLAG_ALLOCATE_ON_HOST, S};
    /* Host memory needs no device. The 1.4 validation layer knows neither ALLOCATE_ON_HOST
     * (its flags stop at 0x1) nor a null device: there, host physical memory is not reachable.
     * A driver that cannot make host physical memory answers UNSUPPORTED_FEATURE (hetmem's
     * cuda backend on a CUDA driver without CU_MEM_LOCATION_TYPE_HOST_NUMA). */
    int have_host = 0;
    ze_result_t hr = zePhysicalMemCreate(e.ctx, NULL, &hd, &hostph);
    if (is_validating()) {
        CHECK(hr, ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
        CHECK(zePhysicalMemCreate(e.ctx, e.dev[0], &hd, &hostph2), ZE_RESULT_ERROR_INVALID_ENUMERATION);
    } else if (hr == ZE_RESULT_ERROR_UNSUPPORTED_FEATURE) {
        CHECK(zePhysicalMemCreate(e.ctx, e.dev[0], &hd, &hostph2), ZE_RESULT_ERROR_UNSUPPORTED_FEATURE);
        EXPECT(hostph == NULL && hostph2 == NULL);
        NOT_APPLICABLE("host physical memory (ALLOCATE_ON_HOST) created, mapped and read",
                       "zePhysicalMemCreate answers UNSUPPORTED_FEATURE: the driver cannot make host physical memory");
    } else {
        CHECK(hr, ZE_RESULT_SUCCESS);
        OK(zePhysicalMemCreate(e.ctx, e.dev[0], &hd, &hostph2)); /* with a device too */
        have_host = 1;
    }
    pd.size = 12345;
    CHECK(zePhysicalMemCreate(e.ctx, e.dev[0], &pd, &badph), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    pd.size = S;
    pd.flags = 0x4;
    CHECK_V(zePhysicalMemCreate(e.ctx, e.dev[0], &pd, &badph), ZE_RESULT_ERROR_INVALID_ENUMERATION,
            ZE_RESULT_ERROR_INVALID_ENUMERATION);
    pd.flags = 0;
    CHECK(zePhysicalMemCreate(e.ctx, NULL, &pd, &badph), ZE_RESULT_ERROR_INVALID_NULL_HANDLE); /* device memory needs a device */
    EXPECT(badph == NULL);

    /* zePhysicalMemGetProperties through the extension-function route */
    ze_hetmem_pfnPhysicalMemGetProperties_t getprops = NULL;
    OK(zeDriverGetExtensionFunctionAddress(e.drv, "zePhysicalMemGetProperties", (void **)&getprops));
    ze_physical_mem_properties_t pp = {ZE_HETMEM_STYPE_PHYSICAL_MEM_PROPERTIES, NULL, 0, 0};
    OK(getprops(e.ctx, ph, &pp));
    EXPECT(pp.size == S && pp.id != 0);
    CHECK(getprops(e.ctx, ph, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    CHECK(getprops(e.ctx, BOGUS(ze_physical_mem_handle_t), &pp), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);

    /* map, alias: the same object at two addresses shares its bytes (written and read by the
     * device) */
    dev_io_t io = dev_io(e.ctx, e.dev[0]);
    char *a = (char *)r, *b = (char *)r + 2 * S;
    OK(zeVirtualMemMap(e.ctx, a, S, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    OK(zeVirtualMemMap(e.ctx, b, S, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    OK(dev_fill(&io, a + 100, 42, 1));
    EXPECT(DEV_BYTE(&io, b + 100) == 42);
    CHECK(zeVirtualMemMap(e.ctx, a, S, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* over a mapping */
    CHECK(zeVirtualMemMap(e.ctx, a + S, S, ph, S, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* past the object */
    CHECK(zeVirtualMemMap(e.ctx, a + S, S, ph, 0, 3), ZE_RESULT_ERROR_INVALID_ENUMERATION);
    CHECK(zeVirtualMemMap(e.ctx, a + 4096, S, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE), ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT);
    CHECK(zeVirtualMemMap(e.ctx, a + S, S, BOGUS(ze_physical_mem_handle_t), 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE),
          ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    int outside = 0;
    CHECK(zeVirtualMemMap(e.ctx, (void *)(((uintptr_t)&outside) & ~(uintptr_t)(P - 1)), S, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE),
          ZE_RESULT_ERROR_INVALID_ARGUMENT); /* not in a reservation */

    /* access attributes: READONLY on the second half of b; get returns runs (outSize) */
    OK(zeVirtualMemSetAccessAttribute(e.ctx, b + H, H, ZE_MEMORY_ACCESS_ATTRIBUTE_READONLY));
    ze_memory_access_attribute_t acc = 99;
    size_t out = 0;
    OK(zeVirtualMemGetAccessAttribute(e.ctx, b, S, &acc, &out));
    EXPECT(acc == ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE && out == H);
    OK(zeVirtualMemGetAccessAttribute(e.ctx, b + H, S, &acc, &out));
    EXPECT(acc == ZE_MEMORY_ACCESS_ATTRIBUTE_READONLY && out == H); /* then the unmapped page (NONE) */
    OK(zeVirtualMemGetAccessAttribute(e.ctx, a + S, S, &acc, &out));
    EXPECT(acc == ZE_MEMORY_ACCESS_ATTRIBUTE_NONE && out == S); /* unmapped pages read NONE */
    CHECK(zeVirtualMemGetAccessAttribute(e.ctx, b, S, NULL, &out), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    CHECK(zeVirtualMemGetAccessAttribute(e.ctx, b, S, &acc, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    CHECK(zeVirtualMemGetAccessAttribute(e.ctx, b + 4096, B, &acc, &out), ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT);
    CHECK(zeVirtualMemSetAccessAttribute(e.ctx, b, B + 4096, ZE_MEMORY_ACCESS_ATTRIBUTE_READONLY), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    CHECK(zeVirtualMemSetAccessAttribute(e.ctx, b, B, 7), ZE_RESULT_ERROR_INVALID_ENUMERATION);
    /* enforced on queued copies: nothing is copied into the READONLY half, which reads */
    unsigned char *hb = NULL;
    OK(zeMemAllocHost(e.ctx, &HOST_DESC, 4096, 0, (void **)&hb));
    memset(hb, 0x66, 4096);
    CHECK(zeCommandListAppendMemoryCopy(io.list, b + H, hb, 64, NULL, 0, NULL), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    OK(zeCommandListAppendMemoryCopy(io.list, b + 200, hb, 64, NULL, 0, NULL)); /* the READWRITE half takes it */
    EXPECT(DEV_ALL(&io, a + 200, 0x66, 64));                                   /* seen through the alias */
    OK(dev_fill(&io, a + H, 0x77, 64)); /* the same bytes, READWRITE at a */
    OK(zeCommandListAppendMemoryCopy(io.list, hb + 1024, b + H, 64, NULL, 0, NULL));
    EXPECT(hb[1024] == 0x77 && hb[1024 + 63] == 0x77);
    /* enforced on host accesses where device memory is reachable through host pointers: the
     * READONLY half faults on write and reads; NONE faults on read */
    const int reach = host_access((volatile char *)b, 0) == 0;
    if (reach) {
        EXPECT(host_access((volatile char *)b + H, 1) == SIGSEGV);
        EXPECT(host_access((volatile char *)b + H, 0) == 0);
        EXPECT(host_access((volatile char *)b, 1) == 0);
    } else {
        NOT_APPLICABLE("access attributes enforced on host accesses to device physical memory",
                       "a host read of a READWRITE page of device physical memory faults: the driver does not make "
                       "device memory reachable through host pointers");
    }
    OK(zeVirtualMemSetAccessAttribute(e.ctx, a, B, ZE_MEMORY_ACCESS_ATTRIBUTE_NONE));
    if (reach) EXPECT(host_access((volatile char *)a, 0) == SIGSEGV);
    CHECK(zeCommandListAppendMemoryCopy(io.list, hb, a, 64, NULL, 0, NULL), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    CHECK(zeCommandListAppendMemoryCopy(io.list, a, hb, 64, NULL, 0, NULL), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    EXPECT(DEV_BYTE(&io, b + 100) == 42); /* the alias still reads the bytes */

    /* in use: a mapped object cannot be destroyed */
    CHECK(zePhysicalMemDestroy(e.ctx, ph), ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);
    OK(zeVirtualMemUnmap(e.ctx, b, S));
    OK(zeVirtualMemUnmap(e.ctx, b, S)); /* not mapped any more: case 4 (cases_vm.c) */
    CHECK(zeVirtualMemUnmap(e.ctx, a + 4096, B), ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT);
    OK(zeVirtualMemGetAccessAttribute(e.ctx, b, S, &acc, &out));
    EXPECT(acc == ZE_MEMORY_ACCESS_ATTRIBUTE_NONE);
    /* host physical memory maps too: the device writes it, and the host reaches it where the
     * driver maps it for the host */
    ze_memory_allocation_properties_t mp = {ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    if (have_host) {
        OK(zeVirtualMemMap(e.ctx, b, S, hostph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
        OK(dev_fill(&io, b + 5, 5, 1));
        EXPECT(DEV_BYTE(&io, b + 5) == 5);
        OK(zeMemGetAllocProperties(e.ctx, b, &mp, NULL));
        EXPECT(mp.type == ZE_MEMORY_TYPE_HOST);
        if (host_access((volatile char *)b, 0) == 0) {
            EXPECT(((volatile char *)b)[5] == 5);
            b[6] = 6;
            EXPECT(DEV_BYTE(&io, b + 6) == 6);
        } else {
            NOT_APPLICABLE("host accesses to host physical memory mapped in a reservation",
                           "a host read of it faults: the driver does not map it for the host");
        }
    }
    OK(zeMemGetAllocProperties(e.ctx, a + B, &mp, NULL));
    EXPECT(mp.type == ZE_MEMORY_TYPE_DEVICE && mp.id == pp.id);
    void *base = NULL;
    size_t sz = 0;
    OK(zeMemGetAddressRange(e.ctx, b, &base, &sz));
    EXPECT(base == r && sz == 4 * S);

    /* free needs the exact base and size; it unmaps; the objects survive */
    CHECK(zeVirtualMemFree(e.ctx, r, 2 * S), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    CHECK(zeVirtualMemFree(e.ctx, (char *)r + S, 3 * S), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    OK(zeVirtualMemFree(e.ctx, r, 4 * S));
    CHECK(zeVirtualMemFree(e.ctx, r, 4 * S), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    OK(zePhysicalMemDestroy(e.ctx, ph));
    if (have_host) {
        OK(zePhysicalMemDestroy(e.ctx, hostph));
        OK(zePhysicalMemDestroy(e.ctx, hostph2));
    }
    CHECK(zePhysicalMemDestroy(e.ctx, ph), ZE_RESULT_ERROR_INVALID_NULL_HANDLE); /* destroyed */
    CHECK(getprops(e.ctx, ph, &pp), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);

    /* the start address is a hint */
    void *r2 = NULL;
    OK(zeVirtualMemReserve(e.ctx, (void *)0x10000, P, &r2));
    EXPECT(r2 != NULL);
    OK(zeVirtualMemFree(e.ctx, r2, P));

    /* context teardown releases what is left */
    OK(zeMemFree(e.ctx, hb));
    dev_io_done(&io);
    OK(zeVirtualMemReserve(e.ctx, HINT, S, &r2));
    OK(zePhysicalMemCreate(e.ctx, e.dev[0], &pd, &ph));
    OK(zeVirtualMemMap(e.ctx, r2, S, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    OK(zeContextDestroy(e.ctx));
    CHECK(zePhysicalMemDestroy(e.ctx, ph), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    return finish("vm");
}
