/* terse-bench-mpi: the Open MPI baseline for `terse-bench allreduce
 * --vs-mpi`. It times MPI_Allreduce exactly as the terse ranks time
 * terse_allreduce (allreduce_worker.c): the same input data, the buffer
 * restored before every iteration, a barrier, one timed in-place
 * allreduce, the same warm-up and iteration-count rule, and the median over
 * iterations of the slowest rank's time. Rank 0 writes one record per size
 * in allreduce.h's format.
 *
 *   mpirun -np N terse-bench-mpi [--results FILE] [-r N] [-w N] [-t SEC] [-q]
 *                                BYTES...
 *
 * Built only when CMake finds MPI; it does not link terse. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "allreduce/allreduce.h"
#include "core/bench.h"

#define GRADIENT_SEED 0xa11ed0ceu /* as allreduce_worker.c */

/* In a sanitizer build, Open MPI's own allocations still live at exit would
 * fail every run with LeakSanitizer reports about a library that is not
 * ours; everything else AddressSanitizer checks stays on. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TERSE_BENCH_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(TERSE_BENCH_ASAN)
/* Default visibility: the sanitizer runtime finds this hook by dynamic
 * lookup, and the build hides symbols by default. */
__attribute__((visibility("default"), used)) const char *__asan_default_options(void);
const char *__asan_default_options(void) {
    return "detect_leaks=0";
}
#endif
#define MIN_ITERS 3

typedef struct {
    const char *results;
    int iters, warmup, quiet;
    double budget;
    size_t sizes[AR_MAX_SIZES];
    int n_sizes;
} options;

static int parse_args(int argc, char **argv, options *o) {
    o->iters = 20;
    o->warmup = 2;
    o->budget = 2.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char *end;
        if (strcmp(a, "-q") == 0) {
            o->quiet = 1;
        } else if (i + 1 < argc && strcmp(a, "--results") == 0) {
            o->results = argv[++i];
        } else if (i + 1 < argc && strcmp(a, "-r") == 0) {
            o->iters = (int)strtol(argv[++i], &end, 10);
            if (*end || o->iters < 1 || o->iters > AR_MAX_ITERS) return -1;
        } else if (i + 1 < argc && strcmp(a, "-w") == 0) {
            o->warmup = (int)strtol(argv[++i], &end, 10);
            if (*end || o->warmup < 0 || o->warmup > AR_MAX_ITERS) return -1;
        } else if (i + 1 < argc && strcmp(a, "-t") == 0) {
            o->budget = strtod(argv[++i], &end);
            if (*end || !(o->budget > 0)) return -1;
        } else if (a[0] >= '0' && a[0] <= '9' && o->n_sizes < AR_MAX_SIZES) {
            unsigned long long b = strtoull(a, &end, 10);
            /* MPI counts are ints. */
            if (*end || b == 0 || b % 4 != 0 || b / 4 > INT_MAX) return -1;
            o->sizes[o->n_sizes++] = (size_t)b;
        } else {
            return -1;
        }
    }
    return o->n_sizes > 0 ? 0 : -1;
}

/* One size; fills r on rank 0. Returns an MPI error code. */
static int measure(const options *o, int rank, int nranks, size_t bytes, ar_row *r) {
    size_t n = bytes / 4;
    float *buf = bench_alloc(bytes), *x0 = bench_alloc(bytes);
    double *t = malloc((size_t)o->iters * sizeof(double));
    double *slowest = malloc((size_t)o->iters * sizeof(double));
    int ready = buf && x0 && t && slowest, all_ready = 0, rc;
    rc = MPI_Allreduce(&ready, &all_ready, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS || !all_ready) {
        snprintf(r->error, sizeof r->error, "out of memory for %zu bytes", bytes);
        goto done;
    }
    bench_gradient_fill(x0, n, GRADIENT_SEED + (uint64_t)rank);

    double warm = 0;
    for (int i = 0; i < o->warmup && rc == MPI_SUCCESS; i++) {
        memcpy(buf, x0, bytes);
        rc = MPI_Barrier(MPI_COMM_WORLD);
        double t0 = bench_now();
        if (rc == MPI_SUCCESS)
            rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        warm = bench_now() - t0;
    }
    /* The iteration-count rule of allreduce_worker.c's agree_iters. */
    int iters = o->iters;
    if (o->warmup > 0 && warm > 0) {
        double fit = ceil(o->budget / warm);
        if (fit < (double)iters) iters = (int)fit;
        if (iters < MIN_ITERS) iters = MIN_ITERS < o->iters ? MIN_ITERS : o->iters;
    }
    if (rc == MPI_SUCCESS) rc = MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);
    for (int i = 0; i < iters && rc == MPI_SUCCESS; i++) {
        memcpy(buf, x0, bytes);
        rc = MPI_Barrier(MPI_COMM_WORLD);
        double t0 = bench_now();
        if (rc == MPI_SUCCESS)
            rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        t[i] = bench_now() - t0;
    }
    if (rc == MPI_SUCCESS)
        rc = MPI_Reduce(t, slowest, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        snprintf(r->error, sizeof r->error, "MPI error %d", rc);
        goto done;
    }
    if (rank == 0) {
        double sum = 0;
        for (int i = 0; i < iters; i++) sum += slowest[i];
        r->mean_s = sum / iters;
        r->time_s = bench_median(slowest, (size_t)iters);
    }
    r->iters = iters;
    r->ok = 1;
done:
    r->nranks = nranks;
    r->bytes = bytes;
    r->rows = n;
    r->cols = 1;
    free(buf);
    free(x0);
    free(t);
    free(slowest);
    return rc;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, nranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    /* Errors come back as codes, so a failure is reported, not aborted. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    options o;
    memset(&o, 0, sizeof o);
    if (parse_args(argc, argv, &o) != 0) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np N terse-bench-mpi [--results FILE] [-r N] [-w N] "
                            "[-t SEC] [-q] BYTES...  (BYTES multiples of 4)\n");
        MPI_Finalize();
        return 2;
    }
    FILE *out = stdout;
    if (rank == 0 && o.results && !(out = fopen(o.results, "w"))) {
        perror("terse-bench-mpi: cannot write the results file");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const char *btl = getenv("OMPI_MCA_btl");
    int failed = 0;
    for (int s = 0; s < o.n_sizes; s++) {
        ar_row r;
        memset(&r, 0, sizeof r);
        r.is_mpi = 1;
        snprintf(r.spec, sizeof r.spec, "%s", AR_DENSE);
        snprintf(r.provider, sizeof r.provider, "Open MPI btl %s", btl ? btl : "default");
        int rc = measure(&o, rank, nranks, o.sizes[s], &r);
        if (rank == 0) {
            ar_record_write(out, &r);
            fflush(out);
            if (!o.quiet && r.ok)
                fprintf(stderr, "[mpi] %zu bytes: %d iters, %.1f us, algbw %.3f GB/s\n", r.bytes,
                        r.iters, 1e6 * r.time_s, ar_algbw(&r));
        }
        if (!r.ok) failed = 1;
        if (rc != MPI_SUCCESS) break;
    }
    if (rank == 0 && out != stdout && fclose(out) != 0) failed = 1;
    MPI_Finalize();
    return failed;
}
