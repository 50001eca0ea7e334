/* terse-bench allreduce, the rank role: join the job, then for every
 * (codec spec, size) time terse_allreduce and let rank 0 report a row.
 * Public API only (include/terse.h). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <terse.h>

#include "allreduce/allreduce.h"
#include "core/bench.h"

#define GRADIENT_SEED 0xa11ed0ceu
/* Fewer timed iterations than this make a median meaningless; -r below it
 * still wins. */
#define MIN_ITERS 3

/* The timings a rank gathers per row: the blocking allreduce, with
 * --overlap the three of overlap_loop, with --parts the two of parts_loop
 * (series a flag did not ask for stay zero). */
enum {
    SERIES_BLOCKING,
    SERIES_COMPUTE,
    SERIES_ALONE,
    SERIES_OVERLAP,
    SERIES_CODEC,
    SERIES_WIRE,
    N_SERIES
};

typedef struct {
    const ar_options *o;
    terse_comm *comm;
    int rank, nranks;
    FILE *results; /* rank 0 with --results */
    size_t done, total;
    ar_compute compute; /* --overlap's sgemm loop, calibrated once */
} worker;

static size_t n_series(const worker *w) {
    if (w->o->parts) return N_SERIES;
    return w->o->overlap_ms > 0 ? SERIES_OVERLAP + 1 : 1;
}

/* Every rank says whether it is ready for the next row (codec created,
 * memory had); the row runs only if all are. One tiny dense allreduce, so
 * a failure on one rank never leaves the others waiting in a collective.
 * Returns 1 if all are ready, 0 if some are not, -1 if the allreduce itself
 * failed (the communicator is then unusable). */
static int all_ready(worker *w, int ready) {
    float not_ready = ready ? 0.0f : 1.0f;
    if (terse_allreduce(w->comm, &not_ready, 1, NULL, TERSE_OP_SUM) != TERSE_OK) return -1;
    return not_ready == 0.0f;
}

static void row_error(const worker *w, ar_row *r, const char *what) {
    r->ok = 0;
    snprintf(r->error, sizeof r->error, "rank %d: %s: %s", w->rank, what, terse_last_error());
}

/* Decide the timed iteration count from the last warm-up: enough to fill
 * the budget, at least MIN_ITERS, at most -r. Rank 0 decides and broadcasts
 * so all ranks run the same number of collectives. With --overlap an
 * iteration is also two computations and two more allreduces. */
static terse_status agree_iters(worker *w, double warm_s, int *iters) {
    const ar_options *o = w->o;
    int n = o->iters;
    double per = warm_s;
    if (o->overlap_ms > 0) per = 3 * warm_s + 2e-3 * o->overlap_ms;
    if (o->warmup > 0 && warm_s > 0) {
        double fit = ceil(o->budget / per);
        if (fit < (double)n) n = (int)fit;
        if (n < MIN_ITERS) n = MIN_ITERS < o->iters ? MIN_ITERS : o->iters;
    }
    int32_t v = n;
    terse_status s = terse_broadcast(w->comm, &v, sizeof v, 0);
    *iters = v;
    return s;
}

/* The timed loop. t[i] gets each iteration's seconds; stats[0..4) the
 * per-op means of wire bytes sent, payload bytes sent, codec and network
 * seconds. Only the allreduce calls are counted: the barriers between them
 * carry bytes too, and they are not what is measured. */
static terse_status timed_loop(worker *w, float *buf, const float *x0, size_t n,
                               terse_codec *codec, int iters, double *t, double *stats) {
    terse_op op = w->o->op_avg ? TERSE_OP_AVG : TERSE_OP_SUM;
    terse_comm_stats s0 = TERSE_COMM_STATS_INIT, s1 = TERSE_COMM_STATS_INIT;
    double wire = 0, payload = 0, codec_s = 0, net_s = 0;
    for (int i = 0; i < iters; i++) {
        memcpy(buf, x0, n * sizeof(float));
        terse_status s = terse_barrier(w->comm);
        if (s == TERSE_OK) s = terse_comm_get_stats(w->comm, &s0);
        if (s != TERSE_OK) return s;
        double t0 = bench_now();
        s = terse_allreduce(w->comm, buf, n, codec, op);
        t[i] = bench_now() - t0;
        if (s == TERSE_OK) s = terse_comm_get_stats(w->comm, &s1);
        if (s != TERSE_OK) return s;
        wire += (double)(s1.wire_bytes_sent - s0.wire_bytes_sent);
        payload += (double)(s1.payload_bytes_sent - s0.payload_bytes_sent);
        codec_s += s1.codec_seconds - s0.codec_seconds;
        net_s += s1.network_seconds - s0.network_seconds;
    }
    stats[0] = wire / iters;
    stats[1] = payload / iters;
    stats[2] = codec_s / iters;
    stats[3] = net_s / iters;
    return TERSE_OK;
}

/* --overlap, after the blocking loop: per iteration, with the ranks meeting
 * in a barrier before each timed phase,
 *   compute   the calibrated sgemm loop alone;
 *   alone     terse_allreduce_start, then terse_request_wait;
 *   overlap   terse_allreduce_start, the same sgemm loop, terse_request_wait.
 * t[SERIES_*] get each phase's seconds per iteration. */
static terse_status overlap_loop(worker *w, float *buf, const float *x0, size_t n,
                                 terse_codec *codec, int iters, double *const *t) {
    terse_op op = w->o->op_avg ? TERSE_OP_AVG : TERSE_OP_SUM;
    for (int i = 0; i < iters; i++) {
        terse_status s = terse_barrier(w->comm);
        if (s != TERSE_OK) return s;
        double t0 = bench_now();
        ar_compute_run(&w->compute);
        t[SERIES_COMPUTE][i] = bench_now() - t0;
        for (int with_compute = 0; with_compute <= 1; with_compute++) {
            terse_request *req = NULL;
            memcpy(buf, x0, n * sizeof(float));
            s = terse_barrier(w->comm);
            if (s != TERSE_OK) return s;
            t0 = bench_now();
            s = terse_allreduce_start(w->comm, buf, n, codec, op, &req);
            if (s != TERSE_OK) return s;
            if (with_compute) ar_compute_run(&w->compute);
            s = terse_request_wait(req);
            t[with_compute ? SERIES_OVERLAP : SERIES_ALONE][i] = bench_now() - t0;
            terse_request_free(req);
            if (s != TERSE_OK) return s;
        }
    }
    return TERSE_OK;
}

/* --parts, for the all-gather paths: per iteration, after a barrier each,
 *   codec  this rank's codec work without the wire, on a second codec of
 *          the same spec (the measured one's error feedback stays as the
 *          allreduces left it): terse_encode of its buffer, then N
 *          terse_decode of that message into a scratch buffer, the first
 *          overwriting -- what the all-gather paths compute;
 *   wire   the same bytes without the codec: terse_allgather of that
 *          message (each rank sends it to N - 1 others, as the paths do).
 * t[SERIES_CODEC], t[SERIES_WIRE] get the seconds. */
static terse_status parts_loop(worker *w, const char *spec, size_t rows, size_t cols,
                               const float *x0, size_t n, int iters, double *const *t) {
    const float alpha = w->o->op_avg ? 1.0f / (float)w->nranks : 1.0f;
    terse_codec *k = NULL;
    terse_status s = terse_codec_create(spec, rows, cols, &k);
    if (s == TERSE_OK) s = terse_codec_set_stream(k, 0, (uint32_t)w->rank);
    const size_t bound = terse_codec_bound(k);
    uint8_t *msg = malloc(bound > 0 ? bound : 1);
    uint8_t *all = malloc(bound * (size_t)w->nranks + 1);
    float *out = bench_alloc(n * sizeof(float));
    if (s == TERSE_OK && (!msg || !all || !out))
        s = TERSE_ERR_NOMEM;
    size_t len = 0;
    for (int i = -1; s == TERSE_OK && i < iters; i++) { /* i = -1: untimed warm-up */
        s = terse_barrier(w->comm);
        double t0 = bench_now();
        if (s == TERSE_OK) s = terse_encode(k, x0, msg, bound, &len);
        for (int q = 0; s == TERSE_OK && q < w->nranks; q++)
            s = terse_decode(k, msg, len, out, alpha, q > 0);
        if (i >= 0) t[SERIES_CODEC][i] = bench_now() - t0;
        if (s == TERSE_OK) s = terse_barrier(w->comm);
        t0 = bench_now();
        if (s == TERSE_OK)
            s = terse_allgather(w->comm, msg, len, all, bound * (size_t)w->nranks, NULL);
        if (i >= 0) t[SERIES_WIRE][i] = bench_now() - t0;
    }
    terse_codec_free(k);
    free(msg);
    free(all);
    free(out);
    return s;
}

/* Gather every rank's [stats(4), series 0 (iters), series 1 ...] and fold
 * them into r on every rank: per iteration the max over ranks, the median
 * of that (and for the blocking series its mean), and each stat's max. */
static terse_status fold_ranks(worker *w, const double *mine, int iters, ar_row *r) {
    size_t ns = n_series(w), per = 4 + ns * (size_t)iters, bytes = per * sizeof(double);
    double *all = malloc(bytes * (size_t)w->nranks);
    double *slowest = malloc((size_t)iters * sizeof(double));
    double med[N_SERIES] = {0};
    terse_status s = TERSE_ERR_NOMEM;
    if (all && slowest) s = terse_allgather(w->comm, mine, bytes, all, bytes * (size_t)w->nranks,
                                            NULL);
    if (s == TERSE_OK) {
        double st[4] = {0, 0, 0, 0};
        for (int k = 0; k < w->nranks; k++)
            for (int j = 0; j < 4; j++) st[j] = fmax(st[j], all[(size_t)k * per + (size_t)j]);
        for (size_t q = 0; q < ns; q++) {
            size_t off = 4 + q * (size_t)iters;
            for (int i = 0; i < iters; i++) slowest[i] = 0;
            for (int k = 0; k < w->nranks; k++)
                for (int i = 0; i < iters; i++)
                    slowest[i] = fmax(slowest[i], all[(size_t)k * per + off + (size_t)i]);
            if (q == SERIES_BLOCKING) {
                double sum = 0;
                for (int i = 0; i < iters; i++) sum += slowest[i];
                r->mean_s = sum / iters;
            }
            med[q] = bench_median(slowest, (size_t)iters);
        }
        r->time_s = med[SERIES_BLOCKING];
        r->compute_s = med[SERIES_COMPUTE];
        r->alone_s = med[SERIES_ALONE];
        r->overlap_s = med[SERIES_OVERLAP];
        r->codec_alone_s = med[SERIES_CODEC];
        r->wire_alone_s = med[SERIES_WIRE];
        r->compute_calls = w->o->overlap_ms > 0 ? w->compute.calls : 0;
        r->wire_sent = st[0];
        r->payload_sent = st[1];
        r->codec_s = st[2];
        r->net_s = st[3];
        r->iters = iters;
    }
    free(all);
    free(slowest);
    return s;
}

/* Measure one (spec, size) into r. Returns 0, or -1 when the communicator
 * failed (then nothing more can run). */
static int measure(worker *w, const char *spec, size_t bytes, ar_row *r) {
    const ar_options *o = w->o;
    size_t n = bytes / 4;
    int dense = strcmp(spec, AR_DENSE) == 0;
    terse_codec *codec = NULL;
    float *buf = NULL, *x0 = NULL;
    double *mine = NULL;
    int rc = 0, ready = 1;
    memset(r, 0, sizeof *r);
    snprintf(r->spec, sizeof r->spec, "%s", spec);
    snprintf(r->provider, sizeof r->provider, "%s", terse_comm_provider(w->comm));
    {
        int nhosts = 1, local_size = 1;
        const char *topology = getenv("TERSE_TOPOLOGY");
        terse_comm_topology(w->comm, NULL, NULL, &local_size, &nhosts);
        if (topology && strcmp(topology, "flat") == 0)
            snprintf(r->topo, sizeof r->topo, "flat");
        else /* rank 0's: the rows are rank 0's */
            snprintf(r->topo, sizeof r->topo, "%dx%d", nhosts, local_size);
    }
    r->nranks = w->nranks;
    r->bytes = bytes;
    ar_shape_for(o, spec, bytes, &r->rows, &r->cols);

    buf = bench_alloc(bytes);
    x0 = bench_alloc(bytes);
    mine = calloc(4 + n_series(w) * (size_t)o->iters, sizeof(double));
    if (!buf || !x0 || !mine) {
        snprintf(r->error, sizeof r->error, "rank %d: out of memory for %zu bytes", w->rank,
                 bytes);
        ready = 0;
    } else if (!dense) {
        if (terse_codec_create(spec, r->rows, r->cols, &codec) != TERSE_OK ||
            terse_codec_set_stream(codec, 0, (uint32_t)w->rank) != TERSE_OK) {
            snprintf(r->error, sizeof r->error, "rank %d: codec %s for %zux%zu: %s", w->rank,
                     spec, r->rows, r->cols, terse_last_error());
            ready = 0;
        }
    }
    if (ready) bench_gradient_fill(x0, n, GRADIENT_SEED + (uint64_t)w->rank);
    snprintf(r->algo, sizeof r->algo, "%s", terse_allreduce_algorithm(w->comm, codec, n));
    if (!ready) fprintf(stderr, "terse-bench allreduce: %s\n", r->error);
    int all = all_ready(w, ready);
    if (all < 0) {
        row_error(w, r, "agreeing to start the row");
        rc = -1;
        goto done;
    }
    if (!all) {
        if (ready) snprintf(r->error, sizeof r->error, "another rank could not set up the row");
        goto done;
    }

    /* Warm-up: connections, page faults, codec scratch and error-feedback
     * state all settle here; the last one sizes the timed loop. */
    double warm = 0;
    terse_op op = o->op_avg ? TERSE_OP_AVG : TERSE_OP_SUM;
    for (int i = 0; i < o->warmup; i++) {
        memcpy(buf, x0, bytes);
        terse_status s = terse_barrier(w->comm);
        double t0 = bench_now();
        if (s == TERSE_OK) s = terse_allreduce(w->comm, buf, n, codec, op);
        warm = bench_now() - t0;
        if (s != TERSE_OK) {
            row_error(w, r, "warm-up allreduce");
            rc = -1;
            goto done;
        }
    }
    int iters;
    if (agree_iters(w, warm, &iters) != TERSE_OK) {
        row_error(w, r, "agreeing on the iteration count");
        rc = -1;
        goto done;
    }
    if (timed_loop(w, buf, x0, n, codec, iters, mine + 4, mine) != TERSE_OK) {
        row_error(w, r, "timed allreduce");
        rc = -1;
        goto done;
    }
    if (o->overlap_ms > 0) {
        double *t[N_SERIES];
        for (size_t q = 0; q < N_SERIES; q++) t[q] = mine + 4 + q * (size_t)iters;
        if (overlap_loop(w, buf, x0, n, codec, iters, t) != TERSE_OK) {
            row_error(w, r, "overlapped allreduce");
            rc = -1;
            goto done;
        }
    }
    if (o->parts && codec && strncmp(r->algo, "gather", 6) == 0) {
        double *t[N_SERIES];
        for (size_t q = 0; q < N_SERIES; q++) t[q] = mine + 4 + q * (size_t)iters;
        if (parts_loop(w, spec, r->rows, r->cols, x0, n, iters, t) != TERSE_OK) {
            row_error(w, r, "timing the codec and the wire apart");
            rc = -1;
            goto done;
        }
    }
    if (fold_ranks(w, mine, iters, r) != TERSE_OK) {
        row_error(w, r, "gathering the ranks' times");
        rc = -1;
        goto done;
    }
    r->ok = 1;
done:
    if (!r->ok && w->rank != 0) fprintf(stderr, "terse-bench allreduce: %s\n", r->error);
    terse_codec_free(codec);
    free(buf);
    free(x0);
    free(mine);
    return rc;
}

static void progress(worker *w, const ar_row *r) {
    if (w->o->quiet || w->rank != 0) return;
    w->done++;
    if (r->ok)
        fprintf(stderr, "[%zu/%zu] %s %zu bytes: %d iters, %.1f us, algbw %.3f GB/s, wire "
                        "%.0f B/rank\n",
                w->done, w->total, r->spec, r->bytes, r->iters, 1e6 * r->time_s,
                ar_algbw(r), r->wire_sent);
    if (r->ok && r->compute_calls > 0)
        fprintf(stderr, "[%zu/%zu]   overlap: compute %.1f ms, start+wait %.1f ms, "
                        "overlapped %.1f ms: %.2f of the max, %.2f of the sum\n",
                w->done, w->total, 1e3 * r->compute_s, 1e3 * r->alone_s, 1e3 * r->overlap_s,
                r->overlap_s / fmax(r->compute_s, r->alone_s),
                r->overlap_s / (r->compute_s + r->alone_s));
    if (!r->ok)
        fprintf(stderr, "[%zu/%zu] %s %zu bytes: failed: %s\n", w->done, w->total, r->spec,
                r->bytes, r->error);
}

/* Rank 0: a record for the launcher, or (started by hand) a table row, with
 * the block heading before a spec's first row. */
static void emit(worker *w, const ar_row *r, int first_of_spec) {
    if (w->rank != 0) return;
    if (w->results) {
        ar_record_write(w->results, r);
        fflush(w->results);
        return;
    }
    if (first_of_spec) ar_report_spec(w->o, r->spec);
    ar_report_row(w->o, r, NULL, NULL);
    fflush(stdout);
}

/* --overlap: every rank calibrates its sgemm loop at once (as the rows will
 * run it: one per core), then takes rank 0's call count, so every rank does
 * the same work. Returns 0, or -1 (the communicator may be unusable). */
static int calibrate_compute(worker *w) {
    int ok = ar_compute_init(&w->compute, w->o->overlap_ms) == 0;
    if (!ok) fprintf(stderr, "terse-bench allreduce: rank %d: out of memory for the sgemm "
                             "loop\n", w->rank);
    if (all_ready(w, ok) != 1) return -1;
    int64_t calls = w->compute.calls;
    if (terse_broadcast(w->comm, &calls, sizeof calls, 0) != TERSE_OK) {
        fprintf(stderr, "terse-bench allreduce: rank %d: agreeing on the sgemm loop: %s\n",
                w->rank, terse_last_error());
        return -1;
    }
    w->compute.calls = (long)calls;
    if (w->rank == 0 && !w->o->quiet)
        fprintf(stderr, "terse-bench allreduce: overlap: %ld sgemm calls (%dx%d, %.3f ms "
                        "each) for about %d ms of computation\n",
                w->compute.calls, w->compute.dim, w->compute.dim, 1e3 * w->compute.call_s,
                w->o->overlap_ms);
    return 0;
}

int ar_worker_main(const ar_options *o) {
    worker w = {o, NULL, 0, 0, NULL, 0, o->n_specs * o->n_sizes, {0}};
    terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
    if (terse_comm_init(&cfg, &w.comm) != TERSE_OK) {
        fprintf(stderr, "terse-bench allreduce: cannot join the job: %s\n", terse_last_error());
        return BENCH_EXIT_RUNTIME;
    }
    w.rank = terse_comm_rank(w.comm);
    w.nranks = terse_comm_size(w.comm);
    int failed = 0;
    if (w.rank == 0 && o->results) {
        w.results = fopen(o->results, "w");
        if (!w.results) {
            perror("terse-bench allreduce: cannot write the results file");
            failed = 1; /* the others find out when we leave the job */
            goto out;
        }
    } else if (w.rank == 0) {
        if (o->vs_mpi && !o->worker)
            fprintf(stderr, "terse-bench allreduce: --vs-mpi works only when terse-bench "
                            "launches the ranks itself (TERSE_RANK unset); ignored\n");
        ar_report_begin(o, terse_comm_provider(w.comm), w.nranks, 0);
    }

    if (o->overlap_ms > 0 && calibrate_compute(&w) != 0) {
        failed = 1;
        goto out;
    }

    /* Spec-major, as the table is printed: one block per codec. */
    for (size_t c = 0; c < o->n_specs; c++) {
        for (size_t s = 0; s < o->n_sizes; s++) {
            ar_row r;
            int rc = measure(&w, o->specs[c], o->sizes[s], &r);
            if (!r.ok) failed = 1;
            progress(&w, &r);
            emit(&w, &r, s == 0);
            if (rc < 0) goto out; /* the communicator is gone: stop */
        }
    }
out:
    if (w.results && fclose(w.results) != 0) failed = 1;
    ar_compute_free(&w.compute);
    terse_comm_free(w.comm);
    return failed ? BENCH_EXIT_RUNTIME : BENCH_EXIT_OK;
}
