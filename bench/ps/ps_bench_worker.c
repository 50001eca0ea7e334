/* terse-bench ps, the rank role (ps_bench.h): one rank of either job.
 *   --job ps         servers + workers ranks: one parameter server, one
 *                    key per (size, codec); workers time push+pull steps,
 *                    servers serve.
 *   --job allreduce  `workers` ranks time the dense allreduce of each size.
 * Rank 0 gathers every rank's times once the measuring is over and writes
 * one record per row to --results. Public API only (include/terse.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <terse.h>

#include "core/bench.h"
#include "ps/ps_bench.h"

#define WHO "terse-bench ps"
#define GRADIENT_SEED 0x9a2a5e11u

/* What a rank contributes per row to the gather, in doubles: whether its
 * part of the row went well, wire bytes sent and received per timed
 * iteration, then the timed iterations' seconds. */
enum { SLOT_OK, SLOT_SENT, SLOT_RECV, SLOT_UP, SLOT_DOWN, SLOT_DUPLEX, SLOT_TIMES };
#define ERR_BYTES 512
/* Floats of a sync key (ps_steps). */
#define SYNC_FLOATS 16

typedef struct {
    const psb_options *o;
    terse_comm *comm;
    int rank, nranks;
    size_t n_rows;  /* ps: one per (size, codec); allreduce: one per size */
    size_t per;     /* doubles per row in the gather */
    double *mine;   /* n_rows * per */
    char err[ERR_BYTES]; /* this rank's first failure, or "" */
} worker;

static double *slot(worker *w, size_t row) {
    return w->mine + row * w->per;
}

/* Keep this rank's first failure, "rank R: what: the library's sentence"
 * (cut to ERR_BYTES), and say it on stderr. */
static void fail_terse(worker *w, const char *what) {
    if (w->err[0]) return;
    int n = snprintf(w->err, sizeof w->err, "rank %d: %s: %s", w->rank, what, terse_last_error());
    if (n < 0) snprintf(w->err, sizeof w->err, "rank %d failed", w->rank);
    fprintf(stderr, WHO ": %s\n", w->err);
}

/* Every rank says whether it is ready (memory had, file opened); the job
 * runs only if all are. 1, 0, or -1 if the allreduce itself failed. */
static int all_ready(worker *w, int ready) {
    float not_ready = ready ? 0.0f : 1.0f;
    if (terse_allreduce(w->comm, &not_ready, 1, NULL, TERSE_OP_SUM) != TERSE_OK) return -1;
    return not_ready == 0.0f;
}

static size_t max_size(const psb_options *o) {
    size_t m = 0;
    for (size_t i = 0; i < o->n_sizes; i++)
        if (o->sizes[i] > m) m = o->sizes[i];
    return m;
}

static int is_dense(const char *spec) {
    return strcmp(spec, PSB_DENSE) == 0;
}

/* Wire bytes this rank has sent and received so far. */
/* One timed iteration into its row: its time, and its share (1/repeats)
 * of the bytes sent and received and of what the link meter saw. */
static void record(double *sl, int it, double t, double sent, double recv, const psb_link *link,
                   int repeats) {
    sl[SLOT_TIMES + (size_t)(it - PSB_WARMUP)] = t;
    sl[SLOT_SENT] += sent / repeats;
    sl[SLOT_RECV] += recv / repeats;
    if (link->valid) {
        sl[SLOT_UP] += link->up / repeats;
        sl[SLOT_DOWN] += link->down / repeats;
        sl[SLOT_DUPLEX] += link->duplex / repeats;
    }
}

static void wire(const worker *w, double *sent, double *recv) {
    terse_comm_stats st = TERSE_COMM_STATS_INIT;
    if (terse_comm_get_stats(w->comm, &st) != TERSE_OK) {
        *sent = *recv = 0;
        return;
    }
    *sent = (double)st.wire_bytes_sent;
    *recv = (double)st.wire_bytes_recv;
}

/* Gather every rank's slots and first failure; on rank 0 fold them into
 * rows (ranks [first, nranks) are the workers whose times count) and write
 * them; identity() names row i (servers, workers, bytes, spec, placement). */
typedef void (*row_identity)(const worker *w, size_t i, psb_row *r, void *arg);

static int gather_and_write(worker *w, int first, FILE *results, row_identity identity,
                            void *arg) {
    const psb_options *o = w->o;
    size_t bytes = w->n_rows * w->per * sizeof(double), nr = (size_t)w->nranks;
    double *all = malloc(bytes * nr);
    char *errs = malloc(ERR_BYTES * nr);
    double *slowest = malloc((size_t)o->repeats * sizeof(double));
    int rc = 0;
    if (!all || !errs || !slowest) {
        fprintf(stderr, WHO ": rank %d: out of memory for the gather\n", w->rank);
        rc = -1;
        goto out;
    }
    if (terse_allgather(w->comm, w->mine, bytes, all, bytes * nr, NULL) != TERSE_OK ||
        terse_allgather(w->comm, w->err, ERR_BYTES, errs, ERR_BYTES * nr, NULL) != TERSE_OK) {
        fprintf(stderr, WHO ": rank %d: gathering the times: %s\n", w->rank, terse_last_error());
        rc = -1;
        goto out;
    }
    if (w->rank != 0) goto out;
    for (size_t i = 0; i < w->n_rows; i++) {
        psb_row r;
        memset(&r, 0, sizeof r);
        identity(w, i, &r, arg);
        snprintf(r.provider, sizeof r.provider, "%s", terse_comm_provider(w->comm));
        r.iters = o->repeats;
        r.ok = 1;
        for (int k = 0; k < o->repeats; k++) slowest[k] = 0;
        int metered = 0; /* workers whose link was measured */
        for (int q = 0; q < w->nranks; q++) {
            const double *s = all + ((size_t)q * w->n_rows + i) * w->per;
            const char *e = errs + (size_t)q * ERR_BYTES;
            if (s[SLOT_OK] != 1.0) {
                if (r.ok) {
                    /* The first rank that failed says why; one that never
                     * reached the row because another failed says that. */
                    int len = (int)strnlen(e, ERR_BYTES - 1);
                    if (!len)
                        snprintf(r.error, sizeof r.error, "not measured");
                    else if (snprintf(r.error, sizeof r.error, "%.*s", len, e) < 0)
                        r.error[0] = '\0';
                    r.ok = 0;
                }
                continue;
            }
            if (q < first) continue;
            r.sent = fmax(r.sent, s[SLOT_SENT]);
            r.recv = fmax(r.recv, s[SLOT_RECV]);
            r.link_up = fmax(r.link_up, s[SLOT_UP]);
            r.link_down = fmax(r.link_down, s[SLOT_DOWN]);
            if (s[SLOT_UP] > 0) {
                r.duplex += s[SLOT_DUPLEX];
                metered++;
            }
            for (int k = 0; k < o->repeats; k++)
                slowest[k] = fmax(slowest[k], s[SLOT_TIMES + (size_t)k]);
        }
        if (metered) r.duplex /= metered;
        if (r.ok) r.time_s = bench_median(slowest, (size_t)o->repeats);
        if (r.ok && !(r.time_s > 0)) {
            r.ok = 0;
            snprintf(r.error, sizeof r.error, "no time was measured");
        }
        psb_record_write(results, &r);
        if (!o->quiet) {
            char label[24], job[64];
            bench_count_label(r.bytes, label, sizeof label);
            if (r.servers)
                snprintf(job, sizeof job, "ps, %d server%s, %d workers", r.servers,
                         r.servers == 1 ? "" : "s", r.workers);
            else
                snprintf(job, sizeof job, "allreduce, %d workers", r.workers);
            if (r.ok)
                fprintf(stderr, WHO ": %s, %sB %s: %.3f ms, %.0f B sent per worker\n", job,
                        label, r.spec, 1e3 * r.time_s, r.sent);
            else
                fprintf(stderr, WHO ": %s, %sB %s: failed: %s\n", job, label, r.spec, r.error);
        }
    }
    if (fflush(results) != 0 || ferror(results)) {
        fprintf(stderr, WHO ": cannot write the results file\n");
        rc = -1;
    }
out:
    free(all);
    free(errs);
    free(slowest);
    return rc;
}

/* ---------------------------------------------------------------- ps job */

typedef struct {
    int servers, workers, colocated;
    uint64_t (*placed)[PSB_MAX_RANKS]; /* per row: the key's bytes per server */
} ps_job;

static void ps_identity(const worker *w, size_t i, psb_row *r, void *arg) {
    const ps_job *j = arg;
    r->servers = j->servers;
    r->workers = j->workers;
    r->colocated = j->colocated;
    r->bytes = w->o->sizes[i / w->o->n_specs];
    snprintf(r->spec, sizeof r->spec, "%s", w->o->specs[i % w->o->n_specs]);
    r->n_placed = j->servers;
    memcpy(r->placed, j->placed[i], sizeof r->placed);
}

/* Declare one key per (size, codec), in that order, and note what each
 * key put on each server; then one tiny dense "sync key" per row (after
 * them, so they do not change where the measured keys go). Every rank does
 * this alike. */
static int declare_keys(worker *w, terse_ps *ps, ps_job *j) {
    const psb_options *o = w->o;
    uint64_t before[PSB_MAX_RANKS] = {0}, after[PSB_MAX_RANKS] = {0};
    for (size_t key = 0; key < w->n_rows; key++) {
        size_t bytes = o->sizes[key / o->n_specs];
        const char *spec = o->specs[key % o->n_specs];
        const char *s = is_dense(spec) ? NULL : spec;
        if (terse_ps_placement(ps, before) != TERSE_OK ||
            terse_ps_declare(ps, key, bytes / 4, s, s, NULL) != TERSE_OK ||
            terse_ps_placement(ps, after) != TERSE_OK) {
            char what[320];
            snprintf(what, sizeof what, "declaring key %zu (%zu bytes, %s)", key, bytes, spec);
            fail_terse(w, what);
            return -1;
        }
        for (int q = 0; q < j->servers; q++) j->placed[key][q] = after[q] - before[q];
    }
    for (size_t i = 0; i < w->n_rows; i++)
        if (terse_ps_declare(ps, w->n_rows + i, SYNC_FLOATS, NULL, NULL, NULL) != TERSE_OK) {
            fail_terse(w, "declaring a sync key");
            return -1;
        }
    return 0;
}

/* One push+pull of key, waited for. */
static terse_status pushpull(terse_ps *ps, size_t key, float *buf) {
    terse_request *req = NULL;
    terse_status s = terse_ps_pushpull(ps, key, buf, &req);
    if (s == TERSE_OK) s = terse_request_wait(req);
    terse_request_free(req);
    return s;
}

/* A worker: per step, every key once in declaration order (a sync step
 * pushes each key once, and no key may skip a step), each push+pull timed
 * on its own, then the clock. Before each timed push+pull, the row's sync
 * key (untimed): its pull returns once every worker has pushed it, so the
 * workers start the row together, as a barrier would make them, and no
 * row's time carries the skew the previous row left. Stops at the first
 * failure. */
static void ps_steps(worker *w, terse_ps *ps, float *buf, const float *x0) {
    const psb_options *o = w->o;
    int steps = PSB_WARMUP + o->repeats;
    for (int it = 0; it < steps; it++) {
        int timed = it >= PSB_WARMUP;
        for (size_t key = 0; key < w->n_rows; key++) {
            size_t n = o->sizes[key / o->n_specs] / 4;
            memcpy(buf, x0, n * sizeof(float));
            float sync[SYNC_FLOATS] = {0};
            terse_status s = pushpull(ps, w->n_rows + key, sync);
            if (s != TERSE_OK) {
                char what[96];
                snprintf(what, sizeof what, "terse_ps_pushpull of sync key %zu, step %d",
                         w->n_rows + key, it);
                fail_terse(w, what);
                return;
            }
            double s0, r0, s1, r1;
            wire(w, &s0, &r0);
            psb_link link;
            psb_link_begin(&link);
            double t0 = bench_now();
            s = pushpull(ps, key, buf);
            double t = bench_now() - t0;
            psb_link_end(&link);
            if (s != TERSE_OK) {
                char what[96];
                snprintf(what, sizeof what, "terse_ps_pushpull of key %zu, step %d", key, it);
                fail_terse(w, what);
                return;
            }
            wire(w, &s1, &r1);
            if (timed) record(slot(w, key), it, t, s1 - s0, r1 - r0, &link, o->repeats);
        }
        if (terse_ps_clock(ps) != TERSE_OK) {
            fail_terse(w, "terse_ps_clock");
            return;
        }
        if (!o->quiet && w->rank == (o->colocate ? 0 : o->servers[0]))
            fprintf(stderr, WHO ": %s step %d of %d done\n", timed ? "timed" : "warm-up",
                    timed ? it - PSB_WARMUP + 1 : it + 1, timed ? o->repeats : PSB_WARMUP);
    }
    for (size_t key = 0; key < w->n_rows; key++) slot(w, key)[SLOT_OK] = 1.0;
}

static int run_ps(worker *w, FILE *results) {
    const psb_options *o = w->o;
    ps_job j = {o->servers[0], o->workers[0], o->colocate, NULL};
    if (j.colocated ? w->nranks != j.workers || j.servers != j.workers
                    : w->nranks != j.servers + j.workers) {
        fprintf(stderr, WHO ": rank %d: the job has %d ranks, not %d servers %s %d workers\n",
                w->rank, w->nranks, j.servers, j.colocated ? "colocated with" : "+", j.workers);
        return -1;
    }
    int is_server = !j.colocated && w->rank < j.servers;
    size_t maxb = max_size(o);
    float *buf = NULL, *x0 = NULL;
    terse_ps *ps = NULL;
    int rc = -1;
    j.placed = calloc(w->n_rows, sizeof *j.placed);
    if (!is_server) {
        buf = bench_alloc(maxb);
        x0 = bench_alloc(maxb);
    }
    int ready = j.placed && (is_server || (buf && x0));
    if (!ready)
        fprintf(stderr, WHO ": rank %d: out of memory for %zu-byte buffers\n", w->rank, maxb);
    else if (!is_server)
        bench_gradient_fill(x0, maxb / 4, GRADIENT_SEED + (uint64_t)w->rank);
    if (all_ready(w, ready) != 1) goto out;

    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    if (terse_ps_config_parse("sync", &cfg) != TERSE_OK) {
        fail_terse(w, "terse_ps_config_parse");
        goto out;
    }
    cfg.num_servers = j.colocated ? 1 : j.servers;
    cfg.colocate = j.colocated;
    cfg.chunk_bytes = o->chunk_bytes;
    if (terse_ps_create(w->comm, &cfg, &ps) != TERSE_OK) {
        fail_terse(w, "terse_ps_create");
        goto out;
    }
    if (declare_keys(w, ps, &j) != 0) goto out;
    if (is_server) {
        if (terse_ps_serve(ps) != TERSE_OK) fail_terse(w, "terse_ps_serve");
        /* A server has no times: its rows are ok unless serving failed. */
        for (size_t key = 0; key < w->n_rows && !w->err[0]; key++) slot(w, key)[SLOT_OK] = 1.0;
    } else {
        ps_steps(w, ps, buf, x0);
        if (terse_ps_finish(ps) != TERSE_OK) {
            fail_terse(w, "terse_ps_finish");
            for (size_t key = 0; key < w->n_rows; key++) slot(w, key)[SLOT_OK] = 0.0;
        }
    }
    /* Serving is over on every rank that gets here: free the parameter
     * server before the communicator runs collectives again. */
    terse_ps_free(ps);
    ps = NULL;
    rc = gather_and_write(w, j.colocated ? 0 : j.servers, results, ps_identity, &j);
out:
    terse_ps_free(ps);
    free(buf);
    free(x0);
    free(j.placed);
    return rc;
}

/* ---------------------------------------------------------------- allreduce job */

static void ar_identity(const worker *w, size_t i, psb_row *r, void *arg) {
    (void)arg;
    r->servers = 0;
    r->workers = w->nranks;
    r->bytes = w->o->sizes[i];
    snprintf(r->spec, sizeof r->spec, "%s", PSB_DENSE);
}

/* Per iteration every size once, as the parameter-server steps go, each
 * after a barrier (untimed), as each push+pull comes after its sync key. */
static int run_allreduce(worker *w, FILE *results) {
    const psb_options *o = w->o;
    if (w->nranks != o->workers[0]) {
        fprintf(stderr, WHO ": rank %d: the allreduce job has %d ranks, not %d\n", w->rank,
                w->nranks, o->workers[0]);
        return -1;
    }
    size_t maxb = max_size(o);
    float *buf = bench_alloc(maxb), *x0 = bench_alloc(maxb);
    int ready = buf && x0, rc = -1;
    if (!ready)
        fprintf(stderr, WHO ": rank %d: out of memory for %zu-byte buffers\n", w->rank, maxb);
    else
        bench_gradient_fill(x0, maxb / 4, GRADIENT_SEED + (uint64_t)w->rank);
    if (all_ready(w, ready) != 1) goto out;
    int steps = PSB_WARMUP + o->repeats;
    for (int it = 0; it < steps && !w->err[0]; it++) {
        int timed = it >= PSB_WARMUP;
        for (size_t z = 0; z < o->n_sizes; z++) {
            size_t n = o->sizes[z] / 4;
            memcpy(buf, x0, n * sizeof(float));
            terse_status s = terse_barrier(w->comm);
            if (s != TERSE_OK) {
                fail_terse(w, "terse_barrier");
                break;
            }
            double s0, r0, s1, r1;
            wire(w, &s0, &r0);
            psb_link link;
            psb_link_begin(&link);
            double t0 = bench_now();
            s = terse_allreduce(w->comm, buf, n, NULL, TERSE_OP_AVG);
            double t = bench_now() - t0;
            psb_link_end(&link);
            if (s != TERSE_OK) {
                char what[96];
                snprintf(what, sizeof what, "terse_allreduce of %zu bytes, iteration %d",
                         o->sizes[z], it);
                fail_terse(w, what);
                break;
            }
            wire(w, &s1, &r1);
            if (timed) record(slot(w, z), it, t, s1 - s0, r1 - r0, &link, o->repeats);
        }
    }
    if (w->err[0]) goto out; /* the communicator is unusable: no gather */
    for (size_t z = 0; z < o->n_sizes; z++) slot(w, z)[SLOT_OK] = 1.0;
    rc = gather_and_write(w, 0, results, ar_identity, NULL);
out:
    free(buf);
    free(x0);
    return rc;
}

int psb_worker_main(const psb_options *o) {
    worker w;
    memset(&w, 0, sizeof w);
    w.o = o;
    terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
    if (terse_comm_init(&cfg, &w.comm) != TERSE_OK) {
        fprintf(stderr, WHO ": cannot join the job: %s\n", terse_last_error());
        return BENCH_EXIT_RUNTIME;
    }
    w.rank = terse_comm_rank(w.comm);
    w.nranks = terse_comm_size(w.comm);
    w.n_rows = o->job_allreduce ? o->n_sizes : o->n_sizes * o->n_specs;
    w.per = SLOT_TIMES + (size_t)o->repeats;
    w.mine = calloc(w.n_rows * w.per, sizeof(double));
    FILE *results = NULL;
    int rc = -1;
    if (!w.mine) {
        fprintf(stderr, WHO ": rank %d: out of memory\n", w.rank);
        goto out; /* the others find out when we leave the job */
    }
    if (w.rank == 0) {
        results = fopen(o->results, "w");
        if (!results) {
            perror(WHO ": cannot write the results file");
            goto out;
        }
    }
    /* Inside ps-netns.sh every rank has a link of its own (TERSE_IFACE):
     * watch its two directions. */
    int metered = psb_link_start(getenv("TERSE_IFACE")) == 0;
    rc = o->job_allreduce ? run_allreduce(&w, results) : run_ps(&w, results);
    if (metered) psb_link_stop();
    /* A row that failed on some rank was recorded as failed; the job's
     * exit status says whether any did. */
    if (rc == 0 && w.err[0]) rc = -1;
out:
    if (results && fclose(results) != 0) rc = -1;
    free(w.mine);
    terse_comm_free(w.comm);
    return rc == 0 ? BENCH_EXIT_OK : BENCH_EXIT_RUNTIME;
}
