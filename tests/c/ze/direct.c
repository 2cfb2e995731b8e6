/* Linked with -lze_hetmem (no loader): the calls and descriptors newer than the installed
 * 1.4 header and loader (declared by ze_hetmem.h), and the driver's own answers before init.
 * Physical memory sizes come from the page-size query. */
#include "common.h"
#include "ze_hetmem.h"
#include <sys/mman.h>
#include <unistd.h>

int main(void) {
    /* Before init: every call is UNINITIALIZED; bad init flags are refused. */
    uint32_t n = 0;
    CHECK(zeDriverGet(&n, NULL), ZE_RESULT_ERROR_UNINITIALIZED);
    CHECK(zeInit(0x4), ZE_RESULT_ERROR_INVALID_ENUMERATION);
    CHECK(zeInit(ZE_INIT_FLAG_VPU_ONLY), ZE_RESULT_ERROR_UNINITIALIZED); /* hetmem devices are GPUs */
    CHECK(zeDriverGet(&n, NULL), ZE_RESULT_ERROR_UNINITIALIZED);

    /* zeInitDrivers */
    ze_init_driver_type_desc_t id = {ZE_HETMEM_STYPE_INIT_DRIVER_TYPE_DESC, NULL, ZE_HETMEM_INIT_DRIVER_TYPE_FLAG_GPU};
    CHECK(zeInitDrivers(NULL, NULL, &id), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    CHECK(zeInitDrivers(&n, NULL, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    id.flags = 0;
    CHECK(zeInitDrivers(&n, NULL, &id), ZE_RESULT_ERROR_INVALID_ENUMERATION);
    id.flags = ZE_HETMEM_INIT_DRIVER_TYPE_FLAG_NPU;
    n = 0;
    OK(zeInitDrivers(&n, NULL, &id));
    EXPECT(n == 0);
    id.flags = ZE_HETMEM_INIT_DRIVER_TYPE_FLAG_GPU | ZE_HETMEM_INIT_DRIVER_TYPE_FLAG_NPU;
    n = 0;
    OK(zeInitDrivers(&n, NULL, &id));
    EXPECT(n == 1);
    ze_driver_handle_t drv = NULL;
    OK(zeInitDrivers(&n, &drv, &id));
    env_t e = setup();
    EXPECT(drv == e.drv);

    /* the extension-function route gives the exported functions themselves */
    void *f = NULL;
    OK(zeDriverGetExtensionFunctionAddress(e.drv, "zeMemPutIpcHandle", &f));
    EXPECT(f == (void *)zeMemPutIpcHandle);
    OK(zeDriverGetExtensionFunctionAddress(e.drv, "zeMemAllocHost", &f));
    EXPECT(f == (void *)zeMemAllocHost);

    /* last error description, default context, root device */
    void *x = NULL;
    CHECK(zeMemAllocHost(e.ctx, &HOST_DESC, 0, 0, &x), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    const char *msg = NULL;
    OK(zeDriverGetLastErrorDescription(e.drv, &msg));
    EXPECT(msg && strstr(msg, "size") != NULL);
    CHECK(zeDriverGetLastErrorDescription(e.drv, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    ze_context_handle_t dc = zeDriverGetDefaultContext(e.drv);
    EXPECT(dc != NULL && dc == zeDriverGetDefaultContext(e.drv));
    EXPECT(zeDriverGetDefaultContext(BOGUS(ze_driver_handle_t)) == NULL);
    OK(zeContextGetStatus(dc));
    ze_device_handle_t root = BOGUS(ze_device_handle_t);
    OK(zeDeviceGetRootDevice(e.dev[0], &root));
    EXPECT(root == NULL);

    /* relaxed limits, the extension form */
    ze_device_properties_t dp = {ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
    OK(zeDeviceGetProperties(e.dev[0], &dp));
    ze_relaxed_allocation_limits_ext_desc_t rl = {ZE_HETMEM_STYPE_RELAXED_ALLOCATION_LIMITS_EXT_DESC, NULL,
                                                  ZE_HETMEM_RELAXED_ALLOCATION_LIMITS_EXT_FLAG_MAX_SIZE};
    ze_host_mem_alloc_desc_t hrl = {ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC, &rl, 0};
    void *big = NULL;
    CHECK(zeMemAllocHost(e.ctx, &HOST_DESC, dp.maxMemAllocSize + 4096, 0, &big), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    if (dp.maxMemAllocSize + 4096 <= FILL_LIMIT) {
        OK(zeMemAllocHost(e.ctx, &hrl, dp.maxMemAllocSize + 4096, 0, &big));
        OK(zeMemFree(e.ctx, big));
    } else {
        NOT_APPLICABLE("a host allocation over maxMemAllocSize with relaxed limits",
                       "maxMemAllocSize is %.1f GiB: allocating more than it is not done in a test (needs <= 1 GiB)",
                       gib(dp.maxMemAllocSize));
    }

    /* import of system memory: the same pointer back, HOST_IMPORTED, read-only needs the flag */
    long pg = sysconf(_SC_PAGESIZE);
    char *sys = mmap(NULL, 4 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ze_external_memmap_sysmem_ext_desc_t sm = {ZE_HETMEM_STYPE_EXTERNAL_MEMMAP_SYSMEM_EXT_DESC, NULL, sys, 2 * (uint64_t)pg};
    ze_host_mem_alloc_desc_t hsm = {ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC, &sm, 0};
    void *imp = NULL;
    OK(zeMemAllocHost(e.ctx, &hsm, 2 * pg, 0, &imp));
    EXPECT(imp == sys);
    ze_memory_allocation_properties_t mp = {ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    OK(zeMemGetAllocProperties(e.ctx, sys + 5, &mp, NULL));
    EXPECT(mp.type == 4 /* ZE_MEMORY_TYPE_HOST_IMPORTED */);
    void *again = NULL;
    CHECK(zeMemAllocHost(e.ctx, &hsm, 2 * pg, 0, &again), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* overlaps */
    ze_ipc_mem_handle_t ih;
    CHECK(zeMemGetIpcHandle(e.ctx, sys, &ih), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* no shareable object */
    OK(zeMemFree(e.ctx, imp));
    sys[0] = 7; /* the memory itself stays */
    sm.pSystemMemory = sys + 1;
    CHECK(zeMemAllocHost(e.ctx, &hsm, 2 * pg, 0, &again), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* unaligned */
    sm.pSystemMemory = sys;
    CHECK(zeMemAllocHost(e.ctx, &hsm, pg, 0, &again), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* size differs */
    mprotect(sys + 2 * pg, 2 * pg, PROT_READ);
    sm.pSystemMemory = sys + 2 * pg;
    CHECK(zeMemAllocHost(e.ctx, &hsm, 2 * pg, 0, &again), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* read-only memory */
    hsm.flags = ZE_HETMEM_HOST_MEM_ALLOC_FLAG_MEM_READ_ONLY;
    OK(zeMemAllocHost(e.ctx, &hsm, 2 * pg, 0, &again));
    EXPECT(again == sys + 2 * pg);
    OK(zeMemFree(e.ctx, again));
    hsm.flags = 0x20;
    CHECK(zeMemAllocHost(e.ctx, &hsm, 2 * pg, 0, &again), ZE_RESULT_ERROR_INVALID_ENUMERATION);
    munmap(sys, 4 * pg);

    /* IPC handle types: on allocation and at get (case 11 of shared/cases/level-zero.md:
     * FABRIC_ACCESSIBLE is supported within one machine; a type the memory was not created
     * with is UNSUPPORTED_FEATURE) */
    ze_ipc_mem_handle_type_ext_desc_t it = {ZE_HETMEM_STYPE_IPC_MEM_HANDLE_TYPE_EXT_DESC, NULL,
                                            ZE_HETMEM_IPC_MEM_HANDLE_TYPE_FLAG_FABRIC_ACCESSIBLE};
    ze_device_mem_alloc_desc_t dit = {ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC, &it, 0, 0};
    void *dm = NULL;
    OK(zeMemAllocDevice(e.ctx, &dit, 65536, 0, e.dev[0], &dm));
    {
        ze_ipc_mem_handle_t hf;
        OK(zeMemGetIpcHandleWithProperties(e.ctx, dm, &it, &hf));
        OK(zeMemPutIpcHandle(e.ctx, hf));
        it.typeFlags = ZE_HETMEM_IPC_MEM_HANDLE_TYPE_FLAG_DEFAULT; /* not created with it */
        CHECK(zeMemGetIpcHandleWithProperties(e.ctx, dm, &it, &hf), ZE_RESULT_ERROR_UNSUPPORTED_FEATURE);
        it.typeFlags = ZE_HETMEM_IPC_MEM_HANDLE_TYPE_FLAG_FABRIC_ACCESSIBLE;
        OK(zeMemFree(e.ctx, dm));
        dm = NULL;
    }
    it.typeFlags = 0x8;
    CHECK(zeMemAllocDevice(e.ctx, &dit, 65536, 0, e.dev[0], &dm), ZE_RESULT_ERROR_INVALID_ENUMERATION);
    it.typeFlags = ZE_HETMEM_IPC_MEM_HANDLE_TYPE_FLAG_DEFAULT;
    OK(zeMemAllocDevice(e.ctx, &dit, 65536, 0, e.dev[0], &dm));
    ze_device_mem_alloc_desc_t shared_it = dit; /* not defined on shared allocations */
    void *sh = NULL;
    CHECK(zeMemAllocShared(e.ctx, &shared_it, &HOST_DESC, 65536, 0, e.dev[0], &sh), ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION);
    ze_ipc_mem_handle_t h;
    OK(zeMemGetIpcHandleWithProperties(e.ctx, dm, &it, &h));
    OK(zeMemPutIpcHandle(e.ctx, h));
    it.typeFlags = ZE_HETMEM_IPC_MEM_HANDLE_TYPE_FLAG_FABRIC_ACCESSIBLE;
    CHECK(zeMemGetIpcHandleWithProperties(e.ctx, dm, &it, &h), ZE_RESULT_ERROR_UNSUPPORTED_FEATURE);
    CHECK(zeMemGetIpcHandleWithProperties(e.ctx, dm, NULL, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    OK(zeMemGetIpcHandleWithProperties(e.ctx, dm, NULL, &h)); /* no chain: as zeMemGetIpcHandle */
    /* fd <-> handle */
    uint64_t fd = 0;
    OK(zeMemGetFileDescriptorFromIpcHandleExp(e.ctx, h, &fd));
    ze_ipc_mem_handle_t h2;
    const ze_result_t fr = zeMemGetIpcHandleFromFileDescriptorExp(e.ctx, fd, &h2);
    if (fr == ZE_RESULT_ERROR_UNSUPPORTED_FEATURE) {
        /* documented where the driver's shareable fds do not identify their memory */
        NOT_APPLICABLE("an export's handle rebuilt from its own fd",
                       "zeMemGetIpcHandleFromFileDescriptorExp answers UNSUPPORTED_FEATURE: the driver's shareable "
                       "fds do not identify their memory");
    } else {
        CHECK(fr, ZE_RESULT_SUCCESS);
        EXPECT(memcmp(&h, &h2, sizeof h) == 0); /* an export's own fd gives that export back */
    }
    CHECK(zeMemGetFileDescriptorFromIpcHandleExp(e.ctx, h, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    CHECK(zeMemGetIpcHandleFromFileDescriptorExp(e.ctx, fd, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    CHECK(zeMemGetIpcHandleFromFileDescriptorExp(e.ctx, (uint64_t)-1, &h2), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    CHECK(zeMemGetIpcHandleFromFileDescriptorExp(e.ctx, 0, &h2), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* stdin (/dev/null in the suite): no memory behind it */
    ze_ipc_mem_handle_t junk;
    memset(&junk, 0x11, sizeof junk);
    CHECK(zeMemGetFileDescriptorFromIpcHandleExp(e.ctx, junk, &fd), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    CHECK(zeMemPutIpcHandle(e.ctx, junk), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    OK(zeMemPutIpcHandle(e.ctx, h));
    CHECK(zeMemPutIpcHandle(e.ctx, h), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* already put */

    /* the range descriptor's error paths; M2: a page of 2 MiB (2 MiB on the host backend and the
     * GPUs hetmem runs on) */
    const size_t M2 = page_size(e.ctx, e.dev[0], 2 << 20);
    ze_ipc_phys_mem_handle_range_ext_desc_t rd = {ZE_HETMEM_STYPE_IPC_PHYS_MEM_HANDLE_RANGE_EXT_DESC, NULL, 0};
    void *r = NULL;
    OK(zeVirtualMemReserve(e.ctx, NULL, 2 * M2, &r));
    ze_physical_mem_desc_t pd = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, &(ze_ipc_mem_handle_type_ext_desc_t){
                                     ZE_HETMEM_STYPE_IPC_MEM_HANDLE_TYPE_EXT_DESC, NULL, ZE_HETMEM_IPC_MEM_HANDLE_TYPE_FLAG_DEFAULT},
                                 0, M2};
    ze_physical_mem_handle_t ph = NULL;
    OK(zePhysicalMemCreate(e.ctx, e.dev[0], &pd, &ph)); /* with a handle-type descriptor */
    OK(zeVirtualMemMap(e.ctx, r, M2, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    CHECK(zeMemGetIpcHandleWithProperties(e.ctx, r, &rd, &h), ZE_RESULT_ERROR_INVALID_SIZE); /* size 0 */
    rd.size = 2 * M2;
    CHECK(zeMemGetIpcHandleWithProperties(e.ctx, r, &rd, &h), ZE_HETMEM_RESULT_ERROR_ADDRESS_NOT_FOUND); /* hole */
    CHECK(zeMemGetIpcHandleWithProperties(e.ctx, NULL, &rd, &h), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    rd.size = page_size(e.ctx, e.dev[0], 1); /* a range of whole base pages (64 KiB; 2 MiB on a GPU) */
    CHECK(zeMemGetIpcHandleWithProperties(e.ctx, dm, &rd, &h), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* USM */
    rd.size = M2;
    OK(zeMemGetIpcHandleWithProperties(e.ctx, r, &rd, &h));
    void *v = NULL;
    OK(zeMemOpenIpcHandle(e.ctx, e.dev[0], h, 0, &v));
    OK(zeMemCloseIpcHandle(e.ctx, v));
    OK(zeMemPutIpcHandle(e.ctx, h));
    /* zePhysicalMemGetProperties */
    ze_physical_mem_properties_t pp = {ZE_HETMEM_STYPE_PHYSICAL_MEM_PROPERTIES, NULL, 0, 0};
    OK(zePhysicalMemGetProperties(e.ctx, ph, &pp));
    EXPECT(pp.size == M2 && pp.id != 0);
    CHECK(zePhysicalMemGetProperties(dc, ph, &pp), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* other context */
    OK(zeVirtualMemFree(e.ctx, r, 2 * M2));
    OK(zePhysicalMemDestroy(e.ctx, ph));
    OK(zeMemFree(e.ctx, dm));

    /* zeCommandListHostSynchronize */
    ze_command_queue_desc_t qd = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0, 0, 0};
    ze_command_list_handle_t il = NULL;
    OK(zeCommandListCreateImmediate(e.ctx, e.dev[0], &qd, &il));
    OK(zeCommandListHostSynchronize(il, 0));
    CHECK(zeCommandListHostSynchronize(BOGUS(ze_command_list_handle_t), 0), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    OK(zeCommandListDestroy(il));

    OK(zeContextDestroy(e.ctx));
    return finish("direct");
}
