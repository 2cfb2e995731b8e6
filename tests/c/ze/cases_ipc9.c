/* Case 9 of shared/cases/level-zero.md: host USM over IPC (on cuda too).
 * zeMemAllocHost (plain, BIAS_CACHED, BIAS_UNCACHED; 4 KiB, 1 MiB + 3 bytes, 8 MiB) +
 * zeMemGetIpcHandle -> SUCCESS; a child opens each handle and reads the parent's bytes through
 * the pointer the open gives (host memory is host memory there too) and through a queue copy,
 * writes one byte back, closes; the parent sees the byte in its own allocation, puts, frees.
 * Where the driver has no shareable handle for host memory the program says NOT APPLICABLE
 * with the reason (hetmem's cuda backend answers so only where the CUDA driver cannot make
 * host memory with cuMemCreate at a host NUMA node). */
#include "ipc_common.h"

#define N 9
static const size_t SIZES[3] = {4096, (1 << 20) + 3, 8 << 20};
static const ze_host_mem_alloc_flags_t FLAGS[3] = {0, ZE_HOST_MEM_ALLOC_FLAG_BIAS_CACHED,
                                                   ZE_HOST_MEM_ALLOC_FLAG_BIAS_UNCACHED};
typedef struct {
    ze_ipc_mem_handle_t h[N];
    size_t size[N];
    int n;
} msg_t;

static unsigned char pattern(int k, size_t i) { return (unsigned char)(k * 31 + i * 7 + 1); }

static int child(void) {
    env_t e = setup();
    dev_io_t io = dev_io(e.ctx, e.dev[0]);
    msg_t m;
    recv_msg(&m, sizeof m);
    for (int k = 0; k < m.n; k++) {
        void *v = NULL;
        OK(zeMemOpenIpcHandle(e.ctx, e.dev[0], m.h[k], 0, &v));
        if (!v) continue;
        const unsigned char *b = v;
        const size_t s = m.size[k];
        /* through the pointer: first, middle, last byte */
        EXPECT(b[0] == pattern(k, 0) && b[s / 2] == pattern(k, s / 2) && b[s - 1] == pattern(k, s - 1));
        /* through a queue copy into malloc'd memory (case 1) */
        unsigned char *back = malloc(s);
        OK(dev_read(&io, back, v, s));
        int same = 1;
        for (size_t i = 0; i < s; i++) same &= back[i] == pattern(k, i);
        EXPECT(same);
        free(back);
        ((unsigned char *)v)[1] = 0xe9; /* written back through the view */
        OK(zeMemCloseIpcHandle(e.ctx, v));
    }
    sync_byte();
    dev_io_done(&io);
    OK(zeContextDestroy(e.ctx));
    return finish("cases_ipc9 (child)");
}

int main(void) {
    pid_t pid = fork_child(child);
    env_t e = setup();
    ext_t x = ext(&e);
    msg_t m;
    memset(&m, 0, sizeof m);
    void *p[N] = {0};
    int unsupported = 0;
    for (int f = 0; f < 3; f++)
        for (int s = 0; s < 3; s++) {
            const int k = m.n;
            ze_host_mem_alloc_desc_t hd = {ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC, NULL, FLAGS[f]};
            OK(zeMemAllocHost(e.ctx, &hd, SIZES[s], 0, &p[k]));
            if (!p[k]) continue;
            for (size_t i = 0; i < SIZES[s]; i++) ((unsigned char *)p[k])[i] = pattern(k, i);
            const ze_result_t r = zeMemGetIpcHandle(e.ctx, p[k], &m.h[k]);
            if (r == ZE_RESULT_ERROR_UNSUPPORTED_FEATURE) {
                unsupported = 1;
                OK(zeMemFree(e.ctx, p[k]));
                p[k] = NULL;
                continue;
            }
            CHECK(r, ZE_RESULT_SUCCESS);
            m.size[k] = SIZES[s];
            m.n++;
        }
    if (unsupported) {
        EXPECT(m.n == 0); /* all host memory or none */
        NOT_APPLICABLE("host USM over IPC (case 9)",
                       "zeMemGetIpcHandle answers UNSUPPORTED_FEATURE for zeMemAllocHost memory: the driver has no "
                       "shareable handle for it");
    }
    send_msg(&m, sizeof m, -1);
    wait_byte();
    for (int k = 0; k < m.n; k++) {
        const unsigned char *b = p[k];
        EXPECT(b[1] == 0xe9 && b[0] == pattern(k, 0) && b[2] == pattern(k, 2)); /* the child's byte */
        OK(x.put(e.ctx, m.h[k]));
        OK(zeMemFree(e.ctx, p[k]));
    }
    expect_child_ok(pid);
    OK(zeContextDestroy(e.ctx));
    return finish("cases_ipc9 (parent)");
}
