/* Timing: a monotonic clock, medians, and the memcpy baseline that every
 * throughput is compared with. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/bench.h"

double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, size_t n) {
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int bench_time(bench_op op, void *arg, int repeats, double warm_seconds, double *samples) {
    if (warm_seconds < 0) {
        double t0 = bench_now();
        int rc = op(arg);
        if (rc) return rc;
        warm_seconds = bench_now() - t0;
    }
    /* Calls that take microseconds are timed in batches: one clock read per
     * call would measure the clock and the noise of a single call. The
     * warm-up guesses the batch size; it usually overestimates the time of
     * a call (first-touch page faults, cold caches), so grow the batch until
     * one lasts the minimum. These calibration batches are not counted. */
    long iters = 1;
    double batch = warm_seconds;
    while (batch < BENCH_MIN_SAMPLE_SECONDS && iters < BENCH_MAX_BATCH) {
        /* Aim 20% past the minimum, and at least double, so this ends. */
        double want = ceil(1.2 * (double)iters * BENCH_MIN_SAMPLE_SECONDS / fmax(batch, 1e-9));
        want = fmin(fmax(want, 2.0 * (double)iters), (double)BENCH_MAX_BATCH);
        iters = (long)want;
        double t0 = bench_now();
        for (long i = 0; i < iters; i++) {
            int rc = op(arg);
            if (rc) return rc;
        }
        batch = bench_now() - t0;
    }
    for (int r = 0; r < repeats; r++) {
        double t0 = bench_now();
        for (long i = 0; i < iters; i++) {
            int rc = op(arg);
            if (rc) return rc;
        }
        samples[r] = (bench_now() - t0) / (double)iters;
    }
    return 0;
}

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
} copy_job;

static int copy_op(void *arg) {
    copy_job *j = arg;
    memcpy(j->dst, j->src, j->bytes);
    return 0;
}

void bench_time_memcpy(void *dst, const void *src, size_t bytes, int repeats, double *samples) {
    copy_job j = {dst, src, bytes};
    bench_time(copy_op, &j, repeats, -1.0, samples);
    /* Keep the copies observable, so no compiler may drop them. */
    volatile unsigned char sink = ((unsigned char *)dst)[bytes - 1];
    (void)sink;
}

void *bench_alloc(size_t bytes) {
    if (bytes > SIZE_MAX - 63) return NULL;
    size_t rounded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
    return aligned_alloc(64, rounded);
}
