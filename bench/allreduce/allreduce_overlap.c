/* terse-bench allreduce --overlap: the computation an allreduce is hidden
 * behind. A fixed number of single-threaded cblas_sgemm calls on small
 * square matrices stands in for a backward pass: its length is calibrated
 * once, before any row, and from then on only the call count is used, so
 * every "compute" phase does exactly the same work whether it runs alone or
 * beside an allreduce. A time-based loop would stretch or shrink with the
 * interference it is meant to measure. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "allreduce/allreduce.h"
#include "core/bench.h"

/* The calibration times batches of calls until one lasts at least this
 * long, so a clock read and a page fault are noise. */
#define CALIBRATE_MIN_SECONDS 0.2
#define CALIBRATE_MAX_CALLS (1L << 24)

static void sgemm_once(const ar_compute *k) {
    blasint d = (blasint)k->dim;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d, d, d, 1.0f, k->a, d, k->b, d,
                0.0f, k->c, d);
}

static void run_calls(const ar_compute *k, long calls) {
    for (long i = 0; i < calls; i++) sgemm_once(k);
}

void ar_compute_run(const ar_compute *k) {
    run_calls(k, k->calls);
}

int ar_compute_init(ar_compute *k, int ms) {
    memset(k, 0, sizeof *k);
    k->dim = AR_COMPUTE_DIM;
    size_t bytes = (size_t)k->dim * (size_t)k->dim * sizeof(float);
    k->a = bench_alloc(bytes);
    k->b = bench_alloc(bytes);
    k->c = bench_alloc(bytes);
    if (!k->a || !k->b || !k->c) {
        ar_compute_free(k);
        return -1;
    }
    /* One OpenBLAS thread: the computation is one core's work, the other
     * cores belong to the other ranks and to terse's progress threads.
     * (OPENBLAS_VERSION comes with OpenBLAS's cblas.h, which declares the
     * call; other CBLAS builds run single-threaded at this size anyway.) */
#ifdef OPENBLAS_VERSION
    openblas_set_num_threads(1);
#endif
    bench_gradient_fill(k->a, (size_t)k->dim * (size_t)k->dim, 0x0e71a9u);
    bench_gradient_fill(k->b, (size_t)k->dim * (size_t)k->dim, 0x0e71aau);
    run_calls(k, 8); /* caches, OpenBLAS's buffers, frequency ramp */
    long calls = 1;
    double t;
    for (;;) {
        double t0 = bench_now();
        run_calls(k, calls);
        t = bench_now() - t0;
        if (t >= CALIBRATE_MIN_SECONDS || calls >= CALIBRATE_MAX_CALLS) break;
        calls *= 2;
    }
    k->call_s = t / (double)calls;
    double want = 1e-3 * ms / k->call_s;
    k->calls = want < 1 ? 1 : (long)llround(want);
    return 0;
}

void ar_compute_free(ar_compute *k) {
    free(k->a);
    free(k->b);
    free(k->c);
    k->a = k->b = k->c = NULL;
}
