/* terse-bench allreduce, the rank role: join the job, then for every
 * (codec spec, size) time terse_allreduce and let rank 0 report a row.
 * Public API only (include/terse.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <terse.h>

#include "allreduce.h"
#include "bench.h"

#define GRADIENT_SEED 0xa11ed0ceu
/* Fewer timed iterations than this make a median meaningless; -r below it
 * still wins. */
#define MIN_ITERS 3

typedef struct {
    const ar_options *o;
    terse_comm *comm;
    int rank, nranks;
    FILE *results; /* rank 0 with --results */
    size_t done, total;
} worker;

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
 * so all ranks run the same number of collectives. */
static terse_status agree_iters(worker *w, double warm_s, int *iters) {
    const ar_options *o = w->o;
    int n = o->iters;
    if (o->warmup > 0 && warm_s > 0) {
        double fit = ceil(o->budget / warm_s);
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

/* Gather every rank's [stats(4), t(iters)] and fold them into r on every
 * rank: per-iteration max over ranks, its median, and each stat's max. */
static terse_status fold_ranks(worker *w, const double *mine, int iters, ar_row *r) {
    size_t per = 4 + (size_t)iters, bytes = per * sizeof(double);
    double *all = malloc(bytes * (size_t)w->nranks);
    double *slowest = malloc((size_t)iters * sizeof(double));
    terse_status s = TERSE_ERR_NOMEM;
    if (all && slowest) s = terse_allgather(w->comm, mine, bytes, all, bytes * (size_t)w->nranks,
                                            NULL);
    if (s == TERSE_OK) {
        double st[4] = {0, 0, 0, 0};
        for (int i = 0; i < iters; i++) slowest[i] = 0;
        for (int k = 0; k < w->nranks; k++) {
            const double *v = all + (size_t)k * per;
            for (int j = 0; j < 4; j++) st[j] = fmax(st[j], v[j]);
            for (int i = 0; i < iters; i++) slowest[i] = fmax(slowest[i], v[4 + i]);
        }
        double sum = 0;
        for (int i = 0; i < iters; i++) sum += slowest[i];
        r->mean_s = sum / iters;
        r->time_s = bench_median(slowest, (size_t)iters);
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
    r->nranks = w->nranks;
    r->bytes = bytes;
    ar_shape_for(o, spec, bytes, &r->rows, &r->cols);

    buf = bench_alloc(bytes);
    x0 = bench_alloc(bytes);
    mine = malloc((4 + (size_t)o->iters) * sizeof(double));
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
        fprintf(stderr, "[%zu/%zu] %s %zu bytes: %d iters, %.1f us, eff.algbw %.3f GB/s, wire "
                        "%.0f B/rank\n",
                w->done, w->total, r->spec, r->bytes, r->iters, 1e6 * r->time_s,
                ar_effective_algbw(r), r->wire_sent);
    else
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
    ar_report_row(w->o, r, NULL);
    fflush(stdout);
}

int ar_worker_main(const ar_options *o) {
    worker w = {o, NULL, 0, 0, NULL, 0, o->n_specs * o->n_sizes};
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
    terse_comm_free(w.comm);
    return failed ? BENCH_EXIT_RUNTIME : BENCH_EXIT_OK;
}
