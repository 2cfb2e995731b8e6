/* Case 12 of shared/cases/level-zero.md: sub-devices. With a host-backend configuration of
 * HETMEM_HOST_SUBDEVICES=N (the suite runs this program with N = 2, 256 MiB devices):
 * zeDeviceGetSubDevices returns N sub-devices per device, the same handles every time, each
 * flagged ZE_DEVICE_PROPERTY_FLAG_SUBDEVICE with its subdeviceId, its share of the root's
 * capacity (totalSize, maxMemAllocSize) and its own queues; zeDeviceGetRootDevice answers the
 * root (and null for a root); allocations and physical memory on a sub-device count against it
 * and its root, the root's own allocations against the whole root; copies and fills on a
 * sub-device's queue and immediate list work; an IPC handle of memory on a sub-device, opened
 * in a child process on that sub-device and read and written through the child's sub-device
 * queue, shows the parent's bytes (and the parent sees the child's).
 *
 * Where the driver reports no sub-devices on a backend other than host (a CUDA GPU has none in
 * the Level Zero sense), the cases are not applicable, with the reason; the answers that hold
 * everywhere (0 sub-devices, a null root) are still checked. */
#include "common.h"
#include "ze_hetmem.h"
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int sock;
static void send_all(const void *b, size_t n) {
    if (send(sock, b, n, 0) != (ssize_t)n) { perror("send"); exit(3); }
}
static void recv_all(void *b, size_t n) {
    if (recv(sock, b, n, MSG_WAITALL) != (ssize_t)n) { perror("recv"); exit(3); }
}

#define MAXSUB 16

/* The sub-devices of dev (at most MAXSUB); their count. */
static uint32_t subs_of(ze_device_handle_t dev, ze_device_handle_t *out) {
    uint32_t n = 0;
    OK(zeDeviceGetSubDevices(dev, &n, NULL));
    if (n > MAXSUB) n = MAXSUB;
    if (n) OK(zeDeviceGetSubDevices(dev, &n, out));
    return n;
}

typedef ze_result_t (*root_fn_t)(ze_device_handle_t, ze_device_handle_t *);

static int child(void) {
    unsigned char go = 0;
    recv_all(&go, 1);
    if (!go) return 0;
    env_t e = setup();
    ze_device_handle_t sub[MAXSUB];
    uint32_t n = subs_of(e.dev[0], sub);
    EXPECT(n >= 2);
    if (n < 2) return finish("cases_subdevices (child)");
    ze_ipc_mem_handle_t h;
    recv_all(&h, sizeof h);
    /* opened on sub-device 1, read and written through sub-device 1's own immediate list */
    dev_io_t io = dev_io(e.ctx, sub[1]);
    void *v = NULL;
    OK(zeMemOpenIpcHandle(e.ctx, sub[1], h, 0, &v));
    EXPECT(v != NULL);
    if (v) {
        EXPECT(DEV_BYTE(&io, v) == 0x6b);
        EXPECT(DEV_ALL(&io, v, 0x6b, 1 << 20));
        OK(dev_fill(&io, (char *)v + 10, 0x3e, 1));
        /* and a copy on a regular list executed on a queue of the sub-device */
        ze_command_queue_desc_t qd = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0,
                                      ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS, ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
        ze_command_queue_handle_t q = NULL;
        OK(zeCommandQueueCreate(e.ctx, sub[1], &qd, &q));
        ze_command_list_desc_t ld = {ZE_STRUCTURE_TYPE_COMMAND_LIST_DESC, NULL, 0, 0};
        ze_command_list_handle_t l = NULL;
        OK(zeCommandListCreate(e.ctx, sub[1], &ld, &l));
        void *hb = NULL;
        OK(zeMemAllocHost(e.ctx, &HOST_DESC, 64, 0, &hb));
        OK(zeCommandListAppendMemoryCopy(l, hb, v, 64, NULL, 0, NULL));
        OK(zeCommandListClose(l));
        OK(zeCommandQueueExecuteCommandLists(q, 1, &l, NULL));
        OK(zeCommandQueueSynchronize(q, UINT64_MAX));
        EXPECT(hb && ((unsigned char *)hb)[0] == 0x6b && ((unsigned char *)hb)[10] == 0x3e);
        OK(zeMemFree(e.ctx, hb));
        OK(zeCommandListDestroy(l));
        OK(zeCommandQueueDestroy(q));
        OK(zeMemCloseIpcHandle(e.ctx, v));
    }
    dev_io_done(&io);
    unsigned char done = 1;
    send_all(&done, 1);
    zeContextDestroy(e.ctx);
    return finish("cases_subdevices (child)");
}

int main(void) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) { perror("socketpair"); return 3; }
    fflush(stdout);
    pid_t pid = fork(); /* before zeInit: each process initialises its own driver */
    if (pid == 0) {
        close(sv[0]);
        sock = sv[1];
        exit(child());
    }
    close(sv[1]);
    sock = sv[0];
    env_t e = setup();
    root_fn_t root_of = NULL; /* 1.7: newer than the 1.4 loader */
    MUST(zeDriverGetExtensionFunctionAddress(e.drv, "zeDeviceGetRootDevice", (void **)&root_of));
    const char *want_s = getenv("HETMEM_HOST_SUBDEVICES");
    const int host = strcmp(backend_name(), "host") == 0;
    const uint32_t want = host && want_s ? (uint32_t)strtoul(want_s, NULL, 10) : 0;

    ze_device_handle_t sub[MAXSUB], again[MAXSUB];
    uint32_t n0 = subs_of(e.dev[0], sub);
    for (uint32_t d = 0; d < e.ndev; d++) {
        ze_device_handle_t r = BOGUS(ze_device_handle_t);
        OK(root_of(e.dev[d], &r));
        EXPECT(r == NULL); /* a root device belongs to no root */
    }
    if (n0 == 0 && !host) {
        EXPECT(want == 0);
        NOT_APPLICABLE("the sub-device cases (case 12)",
                       "the driver reports no sub-devices on this backend: a CUDA GPU is one device "
                       "(MIG instances are separate devices, not sub-devices); hetmem info says why");
        unsigned char go = 0;
        send_all(&go, 1);
        waitpid(pid, NULL, 0);
        zeContextDestroy(e.ctx);
        return finish("cases_subdevices");
    }
    EXPECT(want >= 2 && n0 == want); /* the suite sets HETMEM_HOST_SUBDEVICES=2 */

    /* The devices, their sub-devices, the properties */
    for (uint32_t d = 0; d < e.ndev; d++) {
        uint32_t n = subs_of(e.dev[d], sub);
        EXPECT(n == want);
        EXPECT(subs_of(e.dev[d], again) == n && memcmp(sub, again, n * sizeof sub[0]) == 0);
        /* fewer asked: fewer written */
        uint32_t one = 1;
        ze_device_handle_t first = NULL;
        OK(zeDeviceGetSubDevices(e.dev[d], &one, &first));
        EXPECT(one == 1 && first == sub[0]);
        ze_device_properties_t rp = {ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
        OK(zeDeviceGetProperties(e.dev[d], &rp));
        EXPECT((rp.flags & ZE_DEVICE_PROPERTY_FLAG_SUBDEVICE) == 0);
        const uint64_t total = device_memory(e.dev[d]);
        const uint64_t share = total / n / (2u << 20) * (2u << 20);
        for (uint32_t k = 0; k < n; k++) {
            EXPECT(sub[k] != e.dev[d]);
            ze_device_properties_t p = {ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
            OK(zeDeviceGetProperties(sub[k], &p));
            EXPECT(p.flags & ZE_DEVICE_PROPERTY_FLAG_SUBDEVICE);
            EXPECT(p.subdeviceId == k);
            EXPECT(p.type == rp.type && p.deviceId == rp.deviceId);
            EXPECT(memcmp(p.uuid.id, rp.uuid.id, sizeof p.uuid.id) != 0);
            EXPECT(p.maxMemAllocSize <= share && p.maxMemAllocSize > 0);
            EXPECT(device_memory(sub[k]) == share);
            ze_device_handle_t r = NULL;
            OK(root_of(sub[k], &r));
            EXPECT(r == e.dev[d]);
            uint32_t none = 7;
            OK(zeDeviceGetSubDevices(sub[k], &none, NULL));
            EXPECT(none == 0);
            uint32_t groups = 0;
            OK(zeDeviceGetCommandQueueGroupProperties(sub[k], &groups, NULL));
            EXPECT(groups >= 1);
        }
    }

    /* Capacity: a sub-device's share, its root's whole */
    n0 = subs_of(e.dev[0], sub);
    ze_device_properties_t sp = {ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
    OK(zeDeviceGetProperties(sub[0], &sp));
    const uint64_t share = device_memory(sub[0]), total = device_memory(e.dev[0]);
    const size_t M2 = 2u << 20;
    void *a = NULL, *b = NULL, *c = NULL, *r1 = NULL;
    if (share <= FILL_LIMIT && sp.maxMemAllocSize == share) {
        /* sub-device 0 full: one more page fails there, not on sub-device 1 */
        OK(zeMemAllocDevice(e.ctx, &DEV_DESC, share, 0, sub[0], &a));
        CHECK(zeMemAllocDevice(e.ctx, &DEV_DESC, M2, 0, sub[0], &b), ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
        OK(zeMemAllocDevice(e.ctx, &DEV_DESC, M2, 0, sub[1], &c));
        /* the root's own memory counts against the whole root ... */
        const uint64_t left = total - share - M2;
        OK(zeMemAllocDevice(e.ctx, &DEV_DESC, left - M2, 0, e.dev[0], &r1));
        /* ... so sub-device 1, though its share has room, has only the root's last page */
        void *x = NULL;
        CHECK(zeMemAllocDevice(e.ctx, &DEV_DESC, 2 * M2, 0, sub[1], &x), ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
        OK(zeMemAllocDevice(e.ctx, &DEV_DESC, M2, 0, sub[1], &x));
        CHECK(zeMemAllocDevice(e.ctx, &DEV_DESC, M2, 0, e.dev[0], &b), ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
        /* device 1 is untouched */
        void *y = NULL;
        OK(zeMemAllocDevice(e.ctx, &DEV_DESC, M2, 0, e.dev[e.ndev - 1], &y));
        OK(zeMemFree(e.ctx, y));
        OK(zeMemFree(e.ctx, x));
        OK(zeMemFree(e.ctx, r1));
        OK(zeMemFree(e.ctx, c));
        OK(zeMemFree(e.ctx, a));
        EXPECT_CAPACITY_BACK(&e, "the whole capacity back after the sub-device allocations");
    } else {
        NOT_APPLICABLE("filling a sub-device", "its share is %.1f GiB and maxMemAllocSize %.1f GiB",
                       gib(share), gib(sp.maxMemAllocSize));
    }
    /* more than a sub-device's whole share: unsupported size (its limits are its own) */
    ze_relaxed_allocation_limits_exp_desc_t relax = {ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC, NULL,
                                                     ZE_RELAXED_ALLOCATION_LIMITS_EXP_FLAG_MAX_SIZE};
    ze_device_mem_alloc_desc_t big = {ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC, &relax, 0, 0};
    CHECK(zeMemAllocDevice(e.ctx, &big, share + M2, 0, sub[0], &b), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    /* an allocation says it is on its sub-device */
    OK(zeMemAllocDevice(e.ctx, &DEV_DESC, M2, 0, sub[1], &a));
    ze_memory_allocation_properties_t ap = {ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    ze_device_handle_t on = NULL;
    OK(zeMemGetAllocProperties(e.ctx, a, &ap, &on));
    EXPECT(ap.type == ZE_MEMORY_TYPE_DEVICE && on == sub[1]);
    OK(zeMemFree(e.ctx, a));

    /* Physical memory on a sub-device, mapped, filled and read on its own queue */
    dev_io_t io = dev_io(e.ctx, sub[1]);
    const size_t pg = page_size(e.ctx, sub[1], M2);
    ze_physical_mem_desc_t pd = {ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC, NULL, 0, pg};
    ze_physical_mem_handle_t ph = NULL;
    OK(zePhysicalMemCreate(e.ctx, sub[1], &pd, &ph));
    void *va = NULL;
    OK(zeVirtualMemReserve(e.ctx, (void *)(uintptr_t)(96ull << 30), pg, &va));
    OK(zeVirtualMemMap(e.ctx, va, pg, ph, 0, ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE));
    OK(dev_fill(&io, va, 0x21, pg));
    EXPECT(DEV_ALL(&io, va, 0x21, pg));
    if (share <= FILL_LIMIT) {
        /* the physical object is the sub-device's: its share has pg bytes less */
        void *x = NULL;
        CHECK(zeMemAllocDevice(e.ctx, &big, share - pg + M2, 0, sub[1], &x), ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
    }
    OK(zeVirtualMemUnmap(e.ctx, va, pg));
    OK(zePhysicalMemDestroy(e.ctx, ph));
    OK(zeVirtualMemFree(e.ctx, va, pg));

    /* IPC: device memory on sub-device 1, opened in the child on its sub-device 1 */
    void *shared = NULL;
    OK(zeMemAllocDevice(e.ctx, &DEV_DESC, 1 << 20, 0, sub[1], &shared));
    OK(dev_fill(&io, shared, 0x6b, 1 << 20));
    ze_ipc_mem_handle_t h;
    OK(zeMemGetIpcHandle(e.ctx, shared, &h));
    unsigned char go = 1;
    send_all(&go, 1);
    send_all(&h, sizeof h);
    unsigned char done = 0;
    recv_all(&done, 1);
    EXPECT(done == 1);
    EXPECT(DEV_BYTE(&io, (char *)shared + 10) == 0x3e); /* the child's write */
    ze_hetmem_pfnMemPutIpcHandle_t put = NULL;
    MUST(zeDriverGetExtensionFunctionAddress(e.drv, "zeMemPutIpcHandle", (void **)&put));
    OK(put(e.ctx, h));
    OK(zeMemFree(e.ctx, shared));
    dev_io_done(&io);
    int st = 0;
    waitpid(pid, &st, 0);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    zeContextDestroy(e.ctx);
    return finish("cases_subdevices");
}
