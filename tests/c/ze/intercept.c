/* The loader's intercept mode (ZE_ENABLE_LOADER_INTERCEPT=1, as with several drivers): the
 * loader wraps every handle in its own object and translates it back for the driver. The main
 * flows work through it: driver / device queries, allocations and their queries, in-process
 * IPC, virtual memory, a queue copy with events and a fence, and the extension functions, which
 * get the driver's own handles from zelLoaderTranslateHandle. (No made-up or destroyed handles
 * here: in this mode the loader dereferences handles itself, before any driver sees them.)
 * Device memory is read through the device; the last device plays device 1. */
#include "common.h"
#include "ze_hetmem.h"
#include <level_zero/loader/ze_loader.h>

static void *native(zel_handle_type_t t, void *h) {
    void *o = NULL;
    MUST(zelLoaderTranslateHandle(t, h, &o));
    return o;
}

int main(void) {
    env_t e = setup();
    uint32_t nd = 0, want_n = 0;
    uint64_t want_mem = 0;
    OK(zeDeviceGet(e.drv, &nd, NULL));
    EXPECT(nd >= 1 && nd == e.ndev);
    if (modelled_devices(&want_n, &want_mem))
        EXPECT(e.ndev == want_n); /* HETMEM_HOST_DEVICES=2 in the suite's environment */
    else
        NOT_APPLICABLE("device count as HETMEM_HOST_DEVICES configures it",
                       "the %s backend's devices are not modelled by HETMEM_HOST_DEVICES (%u here)", backend_name(), nd);
    ze_device_handle_t d1 = last_device(&e);
    ze_device_properties_t dp = {ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
    OK(zeDeviceGetProperties(d1, &dp));
    EXPECT(dp.deviceId == e.ndev - 1);
    /* the loader's handles are not the driver's */
    EXPECT(native(ZEL_HANDLE_CONTEXT, e.ctx) != (void *)e.ctx);

    void *h = NULL, *d = NULL, *v = NULL;
    OK(zeMemAllocHost(e.ctx, &HOST_DESC, 1 << 20, 0, &h));
    OK(zeMemAllocDevice(e.ctx, &DEV_DESC, 1 << 20, 0, d1, &d));
    ze_memory_allocation_properties_t mp = {ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    ze_device_handle_t pd = NULL;
    OK(zeMemGetAllocProperties(e.ctx, d, &mp, &pd));
    EXPECT(mp.type == ZE_MEMORY_TYPE_DEVICE && pd == d1); /* translated back to the loader's */
    memset(h, 0x42, 1 << 20);
    ze_ipc_mem_handle_t ih;
    OK(zeMemGetIpcHandle(e.ctx, d, &ih));
    OK(zeMemOpenIpcHandle(e.ctx, e.dev[0], ih, 0, &v));
    CHECK(zeMemFree(e.ctx, (char *)h + 1), ZE_RESULT_ERROR_INVALID_ARGUMENT);

    ze_command_queue_desc_t qd = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0, 0, 0};
    ze_command_queue_handle_t q = NULL;
    ze_command_list_handle_t l = NULL;
    ze_command_list_desc_t ld = {ZE_STRUCTURE_TYPE_COMMAND_LIST_DESC, NULL, 0, 0};
    OK(zeCommandQueueCreate(e.ctx, d1, &qd, &q));
    OK(zeCommandListCreate(e.ctx, d1, &ld, &l));
    ze_event_pool_desc_t epd = {ZE_STRUCTURE_TYPE_EVENT_POOL_DESC, NULL, ZE_EVENT_POOL_FLAG_HOST_VISIBLE, 2};
    ze_event_pool_handle_t pool = NULL;
    OK(zeEventPoolCreate(e.ctx, &epd, 0, NULL, &pool));
    ze_event_desc_t ed = {ZE_STRUCTURE_TYPE_EVENT_DESC, NULL, 0, 0, 0};
    ze_event_handle_t gate = NULL, done = NULL;
    OK(zeEventCreate(pool, &ed, &gate));
    ed.index = 1;
    OK(zeEventCreate(pool, &ed, &done));
    OK(zeCommandListAppendMemoryCopy(l, d, h, 1 << 20, done, 1, &gate));
    OK(zeCommandListClose(l));
    ze_fence_desc_t fd = {ZE_STRUCTURE_TYPE_FENCE_DESC, NULL, 0};
    ze_fence_handle_t f = NULL;
    OK(zeFenceCreate(q, &fd, &f));
    OK(zeCommandQueueExecuteCommandLists(q, 1, &l, f));
    CHECK(zeEventQueryStatus(done), ZE_RESULT_NOT_READY);
    OK(zeEventHostSignal(gate));
    OK(zeFenceHostSynchronize(f, UINT64_MAX));
    OK(zeEventHostSynchronize(done, UINT64_MAX));
    dev_io_t io = dev_io(e.ctx, e.dev[0]);
    EXPECT(DEV_BYTE(&io, (char *)v + (1 << 20) - 1) == 0x42); /* the copy, seen through the IPC view */
    dev_io_done(&io);

    /* virtual memory, and the extension functions with translated handles */
    void *r = NULL;
    const size_t P = page_size(e.ctx, e.dev[0], 2 << 20); /* a page of 2 MiB */
    OK(zeVirtualMemReserve(e.ctx, (void *)(uintptr_t)(160ull << 30), P, &r));
    ze_physical_mem_desc_t phd = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, NULL, 0, P};
    ze_physical_mem_handle_t ph = NULL;
    OK(zePhysicalMemCreate(e.ctx, e.dev[0], &phd, &ph));
    OK(zeVirtualMemMap(e.ctx, r, P, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    ze_hetmem_pfnPhysicalMemGetProperties_t getprops = NULL;
    ze_hetmem_pfnMemPutIpcHandle_t put = NULL;
    OK(zeDriverGetExtensionFunctionAddress(e.drv, "zePhysicalMemGetProperties", (void **)&getprops));
    OK(zeDriverGetExtensionFunctionAddress(e.drv, "zeMemPutIpcHandle", (void **)&put));
    ze_physical_mem_properties_t pp = {ZE_HETMEM_STYPE_PHYSICAL_MEM_PROPERTIES, NULL, 0, 0};
    OK(getprops(native(ZEL_HANDLE_CONTEXT, e.ctx), native(ZEL_HANDLE_PHYSICAL_MEM, ph), &pp));
    EXPECT(pp.size == P);
    /* the loader's own handle is not one of the driver's: refused, not a crash */
    CHECK(getprops(e.ctx, ph, &pp), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    OK(zeVirtualMemUnmap(e.ctx, r, P));
    OK(zeVirtualMemFree(e.ctx, r, P));
    OK(zePhysicalMemDestroy(e.ctx, ph));

    OK(zeMemCloseIpcHandle(e.ctx, v));
    OK(put(native(ZEL_HANDLE_CONTEXT, e.ctx), ih));
    OK(zeFenceDestroy(f));
    OK(zeEventDestroy(gate));
    OK(zeEventDestroy(done));
    OK(zeEventPoolDestroy(pool));
    OK(zeCommandListDestroy(l));
    OK(zeCommandQueueDestroy(q));
    OK(zeMemFree(e.ctx, h));
    OK(zeMemFree(e.ctx, d));
    OK(zeContextDestroy(e.ctx));
    return finish("intercept");
}
