// Probe of `hetmem bench kv`'s sides (issue 23): two identical copies A and B of the raw grow /
// release sequence, each with its own reservation and 256 memfds of 2 MiB, timed round by round
// (the order turning), medians of 21 rounds. Nothing differs between A and B but which one's
// memory is touched first:
//   gcc -O2 -o kv-first-touch kv-first-touch.c
//   ./kv-first-touch           B's memory first, in one block (A/B < 1: B is slower)
//   AFIRST=1 ./kv-first-touch  A's memory first (A/B > 1)
//   WARM=1 ./kv-first-touch    first touch interleaved, 2 MiB of A, 2 MiB of B, ... (A/B ~ 1)
// Grow: mmap(MAP_SHARED | MAP_FIXED | MAP_POPULATE) of memfd i, then one write per 4 KiB page.
// Release: mmap(PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED) over it.
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#define PAGE (2UL << 20)
#define N 256
#define ROUNDS 21
typedef struct { char *base; int fds[N]; } side;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static void make(side *s) {
  s->base = mmap(0, N * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (s->base == MAP_FAILED || (unsigned long)s->base % PAGE) { fprintf(stderr, "reservation not 2 MiB-aligned\n"); exit(1); }
  for (int i = 0; i < N; i++) {
    s->fds[i] = memfd_create("probe", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (s->fds[i] < 0 || ftruncate(s->fds[i], PAGE)) { perror("memfd"); exit(1); }
    fcntl(s->fds[i], F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL);
  }
}
static void grow(side *s, int i) {
  char *a = s->base + i * PAGE;
  if (mmap(a, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, s->fds[i], 0) != a) { perror("mmap"); exit(1); }
  for (size_t o = 0; o < PAGE; o += 4096) *(volatile long *)(a + o) = o | 1;
}
static void release(side *s, int i) {
  mmap(s->base + i * PAGE, PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}
static void phase(side *s, double *g, double *r) {
  double t = now();
  for (int i = 0; i < N; i++) grow(s, i);
  *g = (now() - t) / N;
  t = now();
  for (int i = N - 1; i >= 0; i--) release(s, i);
  *r = (now() - t) / N;
}
int main(void) {
  static side A, B;
  make(&A);
  make(&B);
  if (getenv("WARM"))
    for (int i = 0; i < N; i++) { grow(&A, i); release(&A, i); grow(&B, i); release(&B, i); }
  int afirst = getenv("AFIRST") != NULL;
  double ga[ROUNDS], ra[ROUNDS], gb[ROUNDS], rb[ROUNDS], g, r;
  // Round 0 warms up (and, without WARM, is the first touch: B's first unless AFIRST).
  for (int k = 0; k <= ROUNDS; k++) {
    double g2, r2;
    if ((k + afirst) % 2) { phase(&A, &g, &r); phase(&B, &g2, &r2); }
    else { phase(&B, &g2, &r2); phase(&A, &g, &r); }
    if (k) { ga[k - 1] = g; ra[k - 1] = r; gb[k - 1] = g2; rb[k - 1] = r2; }
  }
  qsort(ga, ROUNDS, 8, cmp); qsort(ra, ROUNDS, 8, cmp); qsort(gb, ROUNDS, 8, cmp); qsort(rb, ROUNDS, 8, cmp);
  int m = ROUNDS / 2;
  printf("%-6s grow A %.0f B %.0f ns (A/B %.3f)  release A %.0f B %.0f ns (A/B %.3f)\n",
         getenv("WARM") ? "interl" : afirst ? "A 1st" : "B 1st", ga[m], gb[m], ga[m] / gb[m], ra[m], rb[m], ra[m] / rb[m]);
  return 0;
}
