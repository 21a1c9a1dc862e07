/* The CPU's fp32 peak as a program sees it: every core runs independent AVX-512 FMAs
 * (12 accumulators, more than FMA latency x pipes), so the figure is cores x FMA pipes x 32
 * FLOP x the clock the cores really hold under this load, turbo included, which
 * /proc/cpuinfo does not tell.  run.py builds it with `cc -O2 -mavx512f -pthread` and takes
 * the best of a few rounds as the roofline's peak.
 *
 *     fma_peak [THREADS]    prints: <GFLOP/s all threads> <GFLOP/s one thread>
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ACC 12
#define STEPS 100000000L

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *spin(void *out) {
    __m512 a[ACC];
    const __m512 b = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < ACC; i++) a[i] = _mm512_set1_ps((float)i);
    for (long k = 0; k < STEPS; k++) {
#pragma GCC unroll 12
        for (int i = 0; i < ACC; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
    }
    float s = 0;  /* keep the result alive so the loop is not removed */
    for (int i = 0; i < ACC; i++) s += _mm512_reduce_add_ps(a[i]);
    *(float *)out = s;
    return NULL;
}

static double rate(int threads) {
    pthread_t tid[256];
    float sink[256];
    double best = 0;
    for (int round = 0; round < 3; round++) {
        double t = now();
        for (int i = 0; i < threads; i++) pthread_create(&tid[i], NULL, spin, &sink[i]);
        for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
        double g = (double)threads * STEPS * ACC * 32 / (now() - t) * 1e-9;
        if (g > best) best = g;
    }
    return best;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (threads < 1 || threads > 256) threads = 1;
    double all = rate(threads);
    printf("%.1f %.1f\n", all, rate(1));
    return 0;
}
