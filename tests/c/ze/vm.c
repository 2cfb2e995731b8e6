/* Virtual and physical memory through the loader: reserve, page size, physical objects, map,
 * aliases, access attributes (a write to a READONLY page kills a forked child with SIGSEGV),
 * outSize, unmap, free, and the documented error paths. zePhysicalMemGetProperties (no slot in
 * the 1.4 loader) through zeDriverGetExtensionFunctionAddress. */
#include "common.h"
#include "ze_hetmem.h"
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs fn(p) in a forked child; returns the signal that ended it, or 0. */
static int child_signal(void (*fn)(volatile char *), volatile char *p) {
    pid_t pid = fork();
    if (pid == 0) {
        fn(p);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}
static void do_write(volatile char *p) { p[0] = 1; }
static void do_read(volatile char *p) { (void)p[0]; }

int main(void) {
    env_t e = setup();
    const size_t M2 = 2 << 20;
    size_t page = 0;
    OK(zeVirtualMemQueryPageSize(e.ctx, e.dev[0], 1, &page));
    EXPECT(page == 64 << 10);
    OK(zeVirtualMemQueryPageSize(e.ctx, e.dev[0], M2, &page));
    EXPECT(page == M2);
    CHECK(zeVirtualMemQueryPageSize(e.ctx, e.dev[0], 0, &page), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    CHECK(zeVirtualMemQueryPageSize(e.ctx, e.dev[0], M2, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    CHECK(zeVirtualMemQueryPageSize(e.ctx, BOGUS(ze_device_handle_t), M2, &page), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);

    /* The 1.4 validation layer still requires a start hint (optional since): pass one. */
    void *const HINT = (void *)(uintptr_t)(64ull << 30);
    void *r = NULL;
    OK(zeVirtualMemReserve(e.ctx, HINT, 4 * M2, &r));
    EXPECT(r && ((uintptr_t)r % M2) == 0);
    void *bad = BOGUS(void *);
    CHECK(zeVirtualMemReserve(e.ctx, HINT, 0, &bad), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    CHECK_V(zeVirtualMemReserve(e.ctx, NULL, 0, &bad), ZE_RESULT_ERROR_UNSUPPORTED_SIZE, ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    CHECK(zeVirtualMemReserve(e.ctx, HINT, M2, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    EXPECT(bad == BOGUS(void *));

    ze_physical_mem_desc_t pd = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, NULL, 0, M2};
    ze_physical_mem_handle_t ph = NULL, hostph = NULL, badph = NULL;
    OK(zePhysicalMemCreate(e.ctx, e.dev[0], &pd, &ph));
    ze_physical_mem_desc_t hd = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, NULL, ZE_HETMEM_PHYSICAL_MEM_FLAG_ALLOCATE_ON_HOST, M2};
    /* Host memory needs no device. The 1.4 validation layer knows neither ALLOCATE_ON_HOST
     * (its flags stop at 0x1) nor a null device: there, host physical memory is not reachable. */
    CHECK_V(zePhysicalMemCreate(e.ctx, NULL, &hd, &hostph), ZE_RESULT_SUCCESS, ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    CHECK_V(zePhysicalMemCreate(e.ctx, e.dev[0], &hd, &hostph), ZE_RESULT_SUCCESS, ZE_RESULT_ERROR_INVALID_ENUMERATION);
    const int have_host = !is_validating();
    pd.size = 12345;
    CHECK(zePhysicalMemCreate(e.ctx, e.dev[0], &pd, &badph), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    pd.size = M2;
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
    EXPECT(pp.size == M2 && pp.id != 0);
    CHECK(getprops(e.ctx, ph, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    CHECK(getprops(e.ctx, BOGUS(ze_physical_mem_handle_t), &pp), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);

    /* map, alias: the same object at two addresses shares its bytes */
    char *a = (char *)r, *b = (char *)r + 2 * M2;
    OK(zeVirtualMemMap(e.ctx, a, M2, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    OK(zeVirtualMemMap(e.ctx, b, M2, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    a[100] = 42;
    EXPECT(b[100] == 42);
    CHECK(zeVirtualMemMap(e.ctx, a, M2, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* over a mapping */
    CHECK(zeVirtualMemMap(e.ctx, a + M2, M2, ph, M2, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* past the object */
    CHECK(zeVirtualMemMap(e.ctx, a + M2, M2, ph, 0, 3), ZE_RESULT_ERROR_INVALID_ENUMERATION);
    CHECK(zeVirtualMemMap(e.ctx, a + 4096, M2, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE), ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT);
    CHECK(zeVirtualMemMap(e.ctx, a + M2, M2, BOGUS(ze_physical_mem_handle_t), 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE),
          ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    int outside = 0;
    CHECK(zeVirtualMemMap(e.ctx, (void *)(((uintptr_t)&outside) & ~(M2 - 1)), M2, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE),
          ZE_RESULT_ERROR_INVALID_ARGUMENT); /* not in a reservation */

    /* access attributes: READONLY on the second half of b; get returns runs (outSize) */
    const size_t K64 = 64 << 10;
    OK(zeVirtualMemSetAccessAttribute(e.ctx, b + M2 / 2, M2 / 2, ZE_MEMORY_ACCESS_ATTRIBUTE_READONLY));
    ze_memory_access_attribute_t acc = 99;
    size_t out = 0;
    OK(zeVirtualMemGetAccessAttribute(e.ctx, b, M2, &acc, &out));
    EXPECT(acc == ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE && out == M2 / 2);
    OK(zeVirtualMemGetAccessAttribute(e.ctx, b + M2 / 2, M2, &acc, &out));
    EXPECT(acc == ZE_MEMORY_ACCESS_ATTRIBUTE_READONLY && out == M2 / 2); /* then the unmapped page (NONE) */
    OK(zeVirtualMemGetAccessAttribute(e.ctx, a + M2, M2, &acc, &out));
    EXPECT(acc == ZE_MEMORY_ACCESS_ATTRIBUTE_NONE && out == M2); /* unmapped pages read NONE */
    CHECK(zeVirtualMemGetAccessAttribute(e.ctx, b, M2, NULL, &out), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    CHECK(zeVirtualMemGetAccessAttribute(e.ctx, b, M2, &acc, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    CHECK(zeVirtualMemGetAccessAttribute(e.ctx, b + 4096, K64, &acc, &out), ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT);
    CHECK(zeVirtualMemSetAccessAttribute(e.ctx, b, K64 + 4096, ZE_MEMORY_ACCESS_ATTRIBUTE_READONLY), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    CHECK(zeVirtualMemSetAccessAttribute(e.ctx, b, K64, 7), ZE_RESULT_ERROR_INVALID_ENUMERATION);
    /* enforced: the read-only half faults on write, reads work; NONE faults on read */
    EXPECT(child_signal(do_write, (volatile char *)b + M2 / 2) == SIGSEGV);
    EXPECT(child_signal(do_read, (volatile char *)b + M2 / 2) == 0);
    EXPECT(child_signal(do_write, (volatile char *)b) == 0);
    OK(zeVirtualMemSetAccessAttribute(e.ctx, a, K64, ZE_MEMORY_ACCESS_ATTRIBUTE_NONE));
    EXPECT(child_signal(do_read, (volatile char *)a) == SIGSEGV);
    EXPECT(b[100] == 42); /* the alias still reads the bytes */

    /* in use: a mapped object cannot be destroyed */
    CHECK(zePhysicalMemDestroy(e.ctx, ph), ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);
    OK(zeVirtualMemUnmap(e.ctx, b, M2));
    CHECK(zeVirtualMemUnmap(e.ctx, b, M2), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* not mapped any more */
    CHECK(zeVirtualMemUnmap(e.ctx, a + 4096, K64), ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT);
    OK(zeVirtualMemGetAccessAttribute(e.ctx, b, M2, &acc, &out));
    EXPECT(acc == ZE_MEMORY_ACCESS_ATTRIBUTE_NONE);
    /* host physical memory maps too */
    ze_memory_allocation_properties_t mp = {ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    if (have_host) {
        OK(zeVirtualMemMap(e.ctx, b, M2, hostph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
        b[5] = 5;
        OK(zeMemGetAllocProperties(e.ctx, b, &mp, NULL));
        EXPECT(mp.type == ZE_MEMORY_TYPE_HOST);
    }
    OK(zeMemGetAllocProperties(e.ctx, a + K64, &mp, NULL));
    EXPECT(mp.type == ZE_MEMORY_TYPE_DEVICE && mp.id == pp.id);
    void *base = NULL;
    size_t sz = 0;
    OK(zeMemGetAddressRange(e.ctx, b, &base, &sz));
    EXPECT(base == r && sz == 4 * M2);

    /* free needs the exact base and size; it unmaps; the objects survive */
    CHECK(zeVirtualMemFree(e.ctx, r, 2 * M2), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    CHECK(zeVirtualMemFree(e.ctx, (char *)r + M2, 3 * M2), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    OK(zeVirtualMemFree(e.ctx, r, 4 * M2));
    CHECK(zeVirtualMemFree(e.ctx, r, 4 * M2), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    OK(zePhysicalMemDestroy(e.ctx, ph));
    if (have_host) OK(zePhysicalMemDestroy(e.ctx, hostph));
    CHECK(zePhysicalMemDestroy(e.ctx, ph), ZE_RESULT_ERROR_INVALID_NULL_HANDLE); /* destroyed */
    CHECK(getprops(e.ctx, ph, &pp), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);

    /* the start address is a hint */
    void *r2 = NULL;
    OK(zeVirtualMemReserve(e.ctx, (void *)0x10000, M2, &r2));
    EXPECT(r2 != NULL);
    OK(zeVirtualMemFree(e.ctx, r2, M2));

    /* context teardown releases what is left */
    OK(zeVirtualMemReserve(e.ctx, HINT, M2, &r2));
    OK(zePhysicalMemCreate(e.ctx, e.dev[0], &pd, &ph));
    OK(zeVirtualMemMap(e.ctx, r2, M2, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    OK(zeContextDestroy(e.ctx));
    CHECK(zePhysicalMemDestroy(e.ctx, ph), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    return finish("vm");
}
