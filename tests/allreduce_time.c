/* allreduce_time N ITERS: one rank of a job (launched like allreduce_check)
 * that times ITERS dense all-reduces of N floats after one warm-up and
 * prints, on rank 0, "alg A provider P median_ms M min_ms M", then times
 * 5 rounds of 100 barriers and prints "barrier_us B" (the median round's
 * mean) -- for
 * tests/netns_hier.sh's hierarchical-against-flat measurement. Exits 1 with
 * a sentence on any failure or a wrong sum. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <terse.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: allreduce_time N ITERS\n");
        return 2;
    }
    size_t n = strtoull(argv[1], NULL, 10);
    int iters = atoi(argv[2]);
    if (n == 0 || iters < 1 || iters > 1000) {
        fprintf(stderr, "allreduce_time: N must be > 0 and ITERS 1..1000\n");
        return 2;
    }
    terse_comm *c = NULL;
    terse_status s = terse_comm_init(NULL, &c);
    if (s != TERSE_OK) {
        fprintf(stderr, "allreduce_time: init: %s\n", terse_last_error());
        return 1;
    }
    const int r = terse_comm_rank(c), N = terse_comm_size(c);
    float *x = malloc(n * sizeof *x);
    double *t = malloc((size_t)iters * sizeof *t);
    if (!x || !t) return 1;
    for (int k = -1; k < iters && s == TERSE_OK; k++) {
        for (size_t i = 0; i < n; i++) x[i] = (float)((r + 1) * (int)(i % 13 + 1));
        s = terse_barrier(c);
        double t0 = now_ms();
        if (s == TERSE_OK) s = terse_allreduce(c, x, n, NULL, TERSE_OP_SUM);
        if (k >= 0) t[k] = now_ms() - t0;
        for (size_t i = 0; s == TERSE_OK && i < n; i++)
            if (x[i] != (float)(N * (N + 1) / 2 * (int)(i % 13 + 1))) {
                fprintf(stderr, "allreduce_time rank %d: element %zu is wrong\n", r, i);
                return 1;
            }
    }
    if (s != TERSE_OK) {
        fprintf(stderr, "allreduce_time rank %d: %s\n", r, terse_last_error());
        return 1;
    }
    /* and the barrier: 5 rounds of 100, the median round's mean */
    double bt[5];
    for (int k = 0; k < 5 && s == TERSE_OK; k++) {
        double t0 = now_ms();
        for (int i = 0; i < 100 && s == TERSE_OK; i++) s = terse_barrier(c);
        bt[k] = (now_ms() - t0) * 10.0; /* us per barrier */
    }
    if (s != TERSE_OK) {
        fprintf(stderr, "allreduce_time rank %d: barrier: %s\n", r, terse_last_error());
        return 1;
    }
    qsort(t, (size_t)iters, sizeof *t, cmp);
    qsort(bt, 5, sizeof *bt, cmp);
    if (r == 0) {
        printf("alg %s provider %s median_ms %.1f min_ms %.1f\n",
               terse_allreduce_algorithm(c, NULL, n), terse_comm_provider(c), t[iters / 2], t[0]);
        printf("barrier_us %.1f\n", bt[2]);
    }
    terse_comm_free(c);
    free(x);
    free(t);
    return 0;
}
