// Probe of the cuda backend's staged pageable copies (issue 20), run on the GPU machine:
//   gcc -O2 -mavx2 -o cuda-staging cuda-staging.c -I/usr/local/cuda/include -lcuda -lpthread
// 1. host copy rates alone and while a pinned DMA runs; 2. the staging pipeline (one chunk split
// over T threads, a barrier per chunk, B pinned buffers of C MiB; nt=1: streaming stores in)
// for 64 and 256 MiB, medians of 5 with min-max. See src/backend/cuda/staging.rs for results.
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <immintrin.h>
static int NTSTORE;
static void ntcopy(char *d, const char *s, size_t n) {
  size_t i = 0;
  if (((size_t)d & 31) == 0) { for (; i + 128 <= n; i += 128) { for (int k = 0; k < 4; k++) { __m256i v = _mm256_loadu_si256((const __m256i *)(s + i + 32 * k)); _mm256_stream_si256((__m256i *)(d + i + 32 * k), v); } } _mm_sfence(); }
  memcpy(d + i, s + i, n - i);
}
#define CPY(d, s, n) (NTSTORE ? ntcopy((char *)(d), (const char *)(s), (n)) : (void)memcpy((d), (s), (n)))
#define CK(x) do { CUresult r_ = (x); if (r_) { printf("%s -> %d\n", #x, r_); exit(1); } } while (0)
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static CUcontext ctx;
static size_t SZ;
static char *hostbuf;
static CUdeviceptr dev;
static CUstream mainst;

// ---------- pool with barrier (A) ----------
typedef struct { char *d, *s; size_t n; } part;
static int NT;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv_go = PTHREAD_COND_INITIALIZER, cv_done = PTHREAD_COND_INITIALIZER;
static part parts[64];
static long gen; static int done_n; static int quit;
static void *worker(void *a) {
  long i = (long)a, seen = 0;
  for (;;) {
    pthread_mutex_lock(&mu);
    while (gen == seen && !quit) pthread_cond_wait(&cv_go, &mu);
    if (quit) { pthread_mutex_unlock(&mu); return 0; }
    seen = gen; part p = parts[i];
    pthread_mutex_unlock(&mu);
    CPY(p.d, p.s, p.n);
    pthread_mutex_lock(&mu); done_n++; pthread_cond_signal(&cv_done); pthread_mutex_unlock(&mu);
  }
}
static void pool_copy(char *d, char *s, size_t n) {
  size_t step = (n / NT + 63) & ~63UL;
  pthread_mutex_lock(&mu);
  for (int i = 1; i < NT; i++) { size_t o = step * i; parts[i] = (part){d + o, s + o, o < n ? (n - o < step ? n - o : step) : 0}; }
  done_n = 0; gen++; pthread_cond_broadcast(&cv_go); pthread_mutex_unlock(&mu);
  CPY(d, s, step < n ? step : n);
  pthread_mutex_lock(&mu); while (done_n < NT - 1) pthread_cond_wait(&cv_done, &mu); pthread_mutex_unlock(&mu);
}
static double run_A(int in, size_t C, int B) {
  void *bufs[8]; CUevent ev[8]; int rec[8] = {0};
  for (int b = 0; b < B; b++) { CK(cuMemHostAlloc(&bufs[b], C, 0)); CK(cuEventCreate(&ev[b], 2)); }
  double best = 1e9, tot = 0; int reps = 12;
  for (int r = 0; r < reps; r++) {
    double t = now();
    size_t n = (SZ + C - 1) / C;
    if (in) {
      for (size_t k = 0; k < n; k++) {
        int b = k % B; size_t o = k * C, len = SZ - o < C ? SZ - o : C;
        if (rec[b]) CK(cuEventSynchronize(ev[b]));
        pool_copy(bufs[b], hostbuf + o, len);
        CK(cuMemcpyHtoDAsync(dev + o, bufs[b], len, mainst)); CK(cuEventRecord(ev[b], mainst)); rec[b] = 1;
      }
      CK(cuStreamSynchronize(mainst));
    } else {
      for (size_t k = 0; k < n && k < (size_t)B; k++) { size_t o = k * C, len = SZ - o < C ? SZ - o : C; CK(cuMemcpyDtoHAsync(bufs[k], dev + o, len, mainst)); CK(cuEventRecord(ev[k], mainst)); }
      for (size_t k = 0; k < n; k++) {
        int b = k % B; size_t o = k * C, len = SZ - o < C ? SZ - o : C;
        CK(cuEventSynchronize(ev[b]));
        pool_copy(hostbuf + o, bufs[b], len);
        size_t k2 = k + B;
        if (k2 < n) { size_t o2 = k2 * C, l2 = SZ - o2 < C ? SZ - o2 : C; CK(cuMemcpyDtoHAsync(bufs[b], dev + o2, l2, mainst)); CK(cuEventRecord(ev[b], mainst)); }
      }
    }
    t = now() - t; if (r >= 2) { tot += t; if (t < best) best = t; }
  }
  for (int b = 0; b < B; b++) { cuMemFreeHost(bufs[b]); cuEventDestroy(ev[b]); }
  return SZ / (tot / (reps - 2)) / (1 << 30);
}

// ---------- independent lanes (L) ----------
typedef struct { int in; size_t C, off, len; void *bufs[2]; CUevent ev[2]; CUstream st; pthread_barrier_t *bar; int reps; } lane;
static void *lane_run(void *a) {
  lane *l = a; CK(cuCtxSetCurrent(ctx));
  for (int r = 0; r < l->reps; r++) {
    pthread_barrier_wait(l->bar);
    size_t n = (l->len + l->C - 1) / l->C; int rec[2] = {0, 0};
    if (l->in) {
      for (size_t k = 0; k < n; k++) {
        int b = k & 1; size_t o = l->off + k * l->C, len = l->len - k * l->C < l->C ? l->len - k * l->C : l->C;
        if (rec[b]) CK(cuEventSynchronize(l->ev[b]));
        CPY(l->bufs[b], hostbuf + o, len);
        CK(cuMemcpyHtoDAsync(dev + o, l->bufs[b], len, l->st)); CK(cuEventRecord(l->ev[b], l->st)); rec[b] = 1;
      }
      CK(cuStreamSynchronize(l->st));
    } else {
      for (size_t k = 0; k < n && k < 2; k++) { size_t o = l->off + k * l->C, len = l->len - k * l->C < l->C ? l->len - k * l->C : l->C; CK(cuMemcpyDtoHAsync(l->bufs[k], dev + o, len, l->st)); CK(cuEventRecord(l->ev[k], l->st)); }
      for (size_t k = 0; k < n; k++) {
        int b = k & 1; size_t o = l->off + k * l->C, len = l->len - k * l->C < l->C ? l->len - k * l->C : l->C;
        CK(cuEventSynchronize(l->ev[b]));
        memcpy(hostbuf + o, l->bufs[b], len);
        if (k + 2 < n) { size_t o2 = l->off + (k + 2) * l->C, l2 = l->len - (k + 2) * l->C < l->C ? l->len - (k + 2) * l->C : l->C; CK(cuMemcpyDtoHAsync(l->bufs[b], dev + o2, l2, l->st)); CK(cuEventRecord(l->ev[b], l->st)); }
      }
    }
    pthread_barrier_wait(l->bar);
  }
  return 0;
}
static double run_L(int in, size_t C, int T) {
  lane ls[32]; pthread_t th[32]; pthread_barrier_t bar; int reps = 12;
  pthread_barrier_init(&bar, 0, T + 1);
  size_t slice = ((SZ / T) + 4095) & ~4095UL;
  for (int i = 0; i < T; i++) {
    lane *l = &ls[i]; l->in = in; l->C = C; l->off = slice * i; l->len = l->off < SZ ? (SZ - l->off < slice ? SZ - l->off : slice) : 0; l->bar = &bar; l->reps = reps;
    for (int b = 0; b < 2; b++) { CK(cuMemHostAlloc(&l->bufs[b], C, 0)); CK(cuEventCreate(&l->ev[b], 2)); }
    CK(cuStreamCreate(&l->st, 1));
    pthread_create(&th[i], 0, lane_run, l);
  }
  double tot = 0;
  for (int r = 0; r < reps; r++) {
    double t = now(); pthread_barrier_wait(&bar); pthread_barrier_wait(&bar); t = now() - t;
    if (r >= 2) tot += t;
  }
  for (int i = 0; i < T; i++) { pthread_join(th[i], 0); for (int b = 0; b < 2; b++) { cuMemFreeHost(ls[i].bufs[b]); cuEventDestroy(ls[i].ev[b]); } cuStreamDestroy(ls[i].st); }
  pthread_barrier_destroy(&bar);
  return SZ / (tot / (reps - 2)) / (1 << 30);
}


static void *dmaloop(void *a) { void **p = a; CK(cuCtxSetCurrent(ctx)); CUstream s; CK(cuStreamCreate(&s, 1)); double t = now(); int n = 0; while (now() - t < 0.3) { CK(cuMemcpyHtoDAsync(dev, p[0], SZ, s)); CK(cuStreamSynchronize(s)); n++; } *(double *)p[1] = n * (double)SZ / (now() - t) / (1 << 30); return 0; }
static int cmpd(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
  CUdevice d;
  CK(cuInit(0)); CK(cuDeviceGet(&d, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, d)); CK(cuCtxSetCurrent(ctx));
  CK(cuStreamCreate(&mainst, 1));
  // 1. memcpy malloc->pinned with T threads while a DMA pinned->device loop runs
  SZ = 256UL << 20; hostbuf = malloc(SZ); memset(hostbuf, 3, SZ); CK(cuMemAlloc(&dev, SZ));
  void *pinA, *pinB; CK(cuMemHostAlloc(&pinA, SZ, 0)); CK(cuMemHostAlloc(&pinB, SZ, 0)); memset(pinA, 1, SZ); memset(pinB, 1, SZ);
  for (NTSTORE = 0; NTSTORE < 2; NTSTORE++) for (int T = 4; T <= 16; T += 4) {
    NT = T; quit = 0; gen = 0; pthread_t w[64]; for (long i = 1; i < NT; i++) pthread_create(&w[i], 0, worker, (void *)i);
    double solo = 0, with = 0, dmar = 0; int reps = 0; double t;
    t = now(); reps = 0; while (now() - t < 0.3) { pool_copy(pinB, hostbuf, SZ); reps++; } solo = reps * (double)SZ / (now() - t) / (1 << 30);
    pthread_t dt; void *arg[2] = {pinA, &dmar}; pthread_create(&dt, 0, dmaloop, arg);
    t = now(); reps = 0; while (now() - t < 0.3) { pool_copy(pinB, hostbuf, SZ); reps++; } with = reps * (double)SZ / (now() - t) / (1 << 30);
    pthread_join(dt, 0);
    t = now(); reps = 0; while (now() - t < 0.3) { pool_copy(hostbuf, pinB, SZ); reps++; } double osolo = reps * (double)SZ / (now() - t) / (1 << 30);
    printf("nt=%d T=%2d malloc->pinned alone %.1f, during DMA %.1f (DMA %.1f); pinned->malloc alone %.1f GiB/s\n", NTSTORE, T, solo, with, dmar, osolo);
    pthread_mutex_lock(&mu); quit = 1; pthread_cond_broadcast(&cv_go); pthread_mutex_unlock(&mu); for (int i = 1; i < NT; i++) pthread_join(w[i], 0);
  }
  cuMemFreeHost(pinA); cuMemFreeHost(pinB); free(hostbuf); cuMemFree(dev);
  // 2. pipeline A, repeated, medians
  size_t sizes[] = {64UL << 20, 256UL << 20};
  for (int si = 0; si < 2; si++) {
    SZ = sizes[si]; hostbuf = malloc(SZ); memset(hostbuf, 3, SZ); CK(cuMemAlloc(&dev, SZ));
    int ts[] = {8, 12, 16}; size_t cs[] = {2UL << 20, 4UL << 20, 8UL << 20, 16UL << 20}; int bs[] = {3, 4, 6};
    for (int ti = 0; ti < 3; ti++) for (NTSTORE = 0; NTSTORE < 2; NTSTORE++) {
      NT = ts[ti]; quit = 0; gen = 0; pthread_t w[64]; for (long i = 1; i < NT; i++) pthread_create(&w[i], 0, worker, (void *)i);
      for (int ci = si ? 2 : 0; ci < 4; ci++) for (int bi = 0; bi < 3; bi++) {
        double vi[5], vo[5];
        for (int r = 0; r < 5; r++) { vi[r] = run_A(1, cs[ci], bs[bi]); int s = NTSTORE; NTSTORE = 0; vo[r] = run_A(0, cs[ci], bs[bi]); NTSTORE = s; }
        qsort(vi, 5, 8, cmpd); qsort(vo, 5, 8, cmpd);
        printf("%3zu MiB A nt=%d T=%2d C=%2zu B=%d: in %.1f [%.1f-%.1f] out %.1f [%.1f-%.1f]\n", SZ >> 20, NTSTORE, NT, cs[ci] >> 20, bs[bi], vi[2], vi[0], vi[4], vo[2], vo[0], vo[4]);
      }
      pthread_mutex_lock(&mu); quit = 1; pthread_cond_broadcast(&cv_go); pthread_mutex_unlock(&mu); for (int i = 1; i < NT; i++) pthread_join(w[i], 0);
    }
    free(hostbuf); cuMemFree(dev);
  }
  return 0;
}
