/* The parameter server over real rank processes (shm and tcp;ofi_rxm):
 * sync against a float64 reference and bitwise across workers, quorum,
 * async and ssp bounds, placement, compression both ways, bad input, and
 * a worker or server killed. */
#include <math.h>
#include <pthread.h>
#include <signal.h>

#include "algos/ps.h"
#include "ranks.h"
#include "terse_plugin.h"

/* What a job runs: servers serve, workers train. */
typedef struct ps_job {
    int servers;
    const char *mode;
    terse_ps_update update;
    float lr;
    size_t n;       /* floats per key */
    int keys;
    int steps;
    const char *push, *pull;
    size_t chunk_bytes;
    int victim;     /* a worker that SIGKILLs itself at victim_step, or -1 */
    int victim_step;
} ps_job;

/* Worker w's gradient at step t, element i: distinct per worker, exact in
 * float (small integers over a power of two). */
static float grad(int w, int t, size_t key, size_t i) {
    return (float)((int)((w * 7 + t * 3 + (int)key * 5 + (int)i) % 17) - 8) / 16.0f;
}

/* A rank's parameter-server statistics. */
static terse_ps_stats ps_stats_of(terse_ps *ps) {
    terse_ps_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    terse_ps_get_stats(ps, &st);
    return st;
}

static int make_ps(terse_comm *c, tr_out *o, const ps_job *j, terse_ps **ps) {
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.num_servers = j->servers;
    cfg.update = j->update;
    cfg.lr = j->lr;
    if (j->chunk_bytes) cfg.chunk_bytes = j->chunk_bytes;
    TR_CALL(o, terse_ps_config_parse(j->mode, &cfg));
    TR_CALL(o, terse_ps_create(c, &cfg, ps));
    for (int k = 0; k < j->keys; k++) TR_CALL(o, terse_ps_declare(*ps, (size_t)k, j->n, j->push, j->pull, NULL));
    return 0;
}

/* Sync training: every worker pushpulls each key each step; the final
 * value of key 0 and a hash of every step's result are reported. */
static int sync_body(terse_comm *c, tr_out *o, const void *arg) {
    const ps_job *j = arg;
    terse_ps *ps = NULL;
    if (make_ps(c, o, j, &ps)) return 1;
    int rank = terse_comm_rank(c);
    if (terse_ps_is_server(ps)) {
        TR_CALL(o, terse_ps_serve(ps));
        terse_ps_stats st = ps_stats_of(ps);
        o->u[0] = st.steps_closed;
        o->u[1] = st.pushes_applied;
        terse_ps_free(ps);
        return 0;
    }
    float *buf = malloc(j->n * sizeof(float));
    uint64_t h = 0;
    for (int t = 0; t < j->steps; t++) {
        for (int k = 0; k < j->keys; k++) {
            for (size_t i = 0; i < j->n; i++) buf[i] = grad(rank, t, (size_t)k, i);
            terse_request *r = NULL;
            TR_CALL(o, terse_ps_pushpull(ps, (size_t)k, buf, &r));
            terse_status s = terse_request_wait(r);
            terse_request_free(r);
            TR_CALL(o, s);
            h = h * 31 + tr_hash(buf, j->n * sizeof(float));
            if (k == 0 && t == j->steps - 1)
                for (size_t i = 0; i < j->n && i < TR_FLOATS; i++) o->f[i] = buf[i];
        }
        TR_CALL(o, terse_ps_clock(ps));
    }
    o->hash[0] = h;
    TR_CALL(o, terse_ps_finish(ps));
    terse_ps_free(ps);
    free(buf);
    return 0;
}

static void sync_dense(const char *prov, int servers, int workers) {
    ps_job j = {servers, "sync", TERSE_PS_UPDATE_NONE, 0, 3000, 3, 4, NULL, NULL, 4096, -1, 0};
    tr_job job = {prov, servers + workers, 20000, 60, -1};
    tr_out *o = tr_run(&job, sync_body, &j);
    int W = workers, last = j.steps - 1;
    for (size_t i = 0; i < j.n; i++) {
        double ref = 0;
        for (int w = servers; w < servers + W; w++) ref += grad(w, last, 0, i);
        ref /= W;
        cr_assert(fabs(o[servers].f[i] - ref) <= 1e-6, "element %zu: %g, reference %g", i,
                  (double)o[servers].f[i], ref);
    }
    for (int w = servers + 1; w < servers + W; w++)
        cr_assert_eq(o[w].hash[0], o[servers].hash[0], "worker %d's results differ bitwise", w);
    uint64_t closed = 0;
    for (int s = 0; s < servers; s++) closed += o[s].u[0];
    /* 3 keys of 3000 floats in 1024-float chunks: each key is on 1 or more servers. */
    cr_assert_geq(closed, (uint64_t)(j.keys * j.steps));
    tr_release(o);
}

Test(ps, sync_dense_tcp_1x2) { sync_dense("tcp", 1, 2); }
Test(ps, sync_dense_shm_2x2) { sync_dense("shm", 2, 2); }

/* ---------------------------------------------------------------- quorum */

typedef struct q_job {
    const char *prov;
    int late;        /* the worker that arrives late at step 0 (sleeps first) */
    int victim;      /* a worker that dies at step 1 (-1: none) */
    int steps;
} q_job;

#define QN 2000

/* The server holds one key of QN floats and runs SGD at lr 0.5, in mode. */
static int sgd_ps(terse_comm *c, tr_out *o, const char *mode, terse_ps **ps) {
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.update = TERSE_PS_UPDATE_SGD;
    cfg.lr = 0.5f;
    TR_CALL(o, terse_ps_config_parse(mode, &cfg));
    TR_CALL(o, terse_ps_create(c, &cfg, ps));
    TR_CALL(o, terse_ps_declare(*ps, 0, QN, NULL, NULL, NULL));
    return 0;
}

/* A victim must not die before every other rank is past the collective
 * setup its test is not about: a rank that finished terse_comm_init or
 * terse_ps_create may race ahead (async steps wait for nobody; a quorum
 * closes without the slowest), and its death then fails a slower rank's
 * setup with PEER_LOST instead of the failure under test (async: once in
 * 6 runs of test_ps; a replacement test: 2 runs in 23). say_ready marks
 * u[READY] of ranks.h's shared outputs; wait_all_ready waits for every
 * rank's mark, or for that rank to have failed or finished. */
#define READY 90
static void say_ready(tr_out *o) { __atomic_store_n(&o->u[READY], 1, __ATOMIC_RELEASE); }
static void wait_all_ready(terse_comm *c, tr_out *o) {
    tr_out *all = o - terse_comm_rank(c); /* one shared array */
    const double until = tr_now_ms() + 30000; /* a rank that crashed marks nothing */
    for (int r = 0; r < terse_comm_size(c); r++)
        while (!__atomic_load_n(&all[r].u[READY], __ATOMIC_ACQUIRE) &&
               !__atomic_load_n(&all[r].status, __ATOMIC_ACQUIRE) &&
               !__atomic_load_n(&all[r].finished, __ATOMIC_ACQUIRE) && tr_now_ms() < until)
            usleep(1000);
}

/* 1 server, 3 workers, sync:quorum=2, the server holds parameters (sgd,
 * lr 0.5). */
static int quorum_body(terse_comm *c, tr_out *o, const void *arg) {
    const q_job *q = arg;
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.update = TERSE_PS_UPDATE_SGD;
    cfg.lr = 0.5f;
    cfg.chunk_bytes = 4096;
    TR_CALL(o, terse_ps_config_parse("sync:quorum=2", &cfg));
    terse_ps *ps = NULL;
    TR_CALL(o, terse_ps_create(c, &cfg, &ps));
    say_ready(o);
    TR_CALL(o, terse_ps_declare(ps, 0, QN, NULL, NULL, NULL));
    int rank = terse_comm_rank(c);
    if (terse_ps_is_server(ps)) {
        terse_status s = terse_ps_serve(ps);
        o->u[5] = (uint64_t)s;
        snprintf(o->err, sizeof o->err, "%s", terse_last_error());
        terse_ps_stats st = ps_stats_of(ps);
        o->u[0] = st.late_dropped;
        o->u[1] = st.steps_closed;
        o->u[2] = st.workers_lost;
        terse_ps_free(ps);
        return 0;
    }
    float buf[QN];
    for (int t = 0; t < q->steps; t++) {
        if (rank == q->victim && t == 1) {
            wait_all_ready(c, o);
            raise(SIGKILL);
        }
        if (rank == q->late && t == 0) usleep(1000000);
        for (size_t i = 0; i < QN; i++) buf[i] = grad(rank, t, 0, i);
        terse_status s = terse_ps_pushpull(ps, 0, buf, NULL);
        o->u[10 + t] = (uint64_t)s;
        if (s == TERSE_ERR_STALE) {
            TR_CALL(o, terse_ps_pull(ps, 0, buf, NULL)); /* and go on from the newer version */
        } else {
            TR_CALL(o, s);
        }
        if (t == 0)
            for (size_t i = 0; i < QN; i++) o->f[i] = buf[i];
        TR_CALL(o, terse_ps_clock(ps));
    }
    o->u[3] = ps_stats_of(ps).stale_refused;
    TR_CALL(o, terse_ps_finish(ps));
    terse_ps_free(ps);
    return 0;
}

Test(ps, quorum_drops_exactly_the_late_push) {
    char log[128];
    snprintf(log, sizeof log, "/tmp/terse-quorum-%d.log", (int)getpid());
    unlink(log);
    setenv("TERSE_PS_QUORUM_LOG", log, 1);
    q_job q = {"tcp", 3, -1, 2};
    tr_job job = {"tcp", 4, 20000, 60, -1};
    tr_out *o = tr_run(&job, quorum_body, &q);
    cr_assert_eq(o[0].u[5], TERSE_OK, "serve: %s", o[0].err);
    cr_assert_eq(o[0].u[0], 1, "late pushes dropped: %llu, expected exactly 1",
                 (unsigned long long)o[0].u[0]);
    cr_assert_eq(o[3].u[10], TERSE_ERR_STALE, "the late push got %s",
                 terse_status_name((terse_status)o[3].u[10]));
    cr_assert_eq(o[3].u[3], 1);
    cr_assert_eq(o[1].u[10], TERSE_OK);
    cr_assert_eq(o[2].u[10], TERSE_OK);
    /* Step 0's parameters: 0 - 0.5 * mean(g1, g2), the late worker's push left out. */
    for (size_t i = 0; i < QN; i++) {
        double ref = -0.5 * (grad(1, 0, 0, i) + grad(2, 0, 0, i)) / 2.0;
        cr_assert(fabs(o[1].f[i] - ref) < 1e-6, "element %zu: %g vs %g", i, (double)o[1].f[i], ref);
        cr_assert_eq(o[1].f[i], o[2].f[i]);
    }
    /* The log names the set of step 0. */
    FILE *f = fopen(log, "r");
    cr_assert(f, "no quorum log at %s", log);
    char line[128] = "";
    cr_assert(fgets(line, sizeof line, f));
    fclose(f);
    unlink(log);
    cr_assert_str_eq(line, "0 0 0 1,2\n");
    tr_release(o);
}

Test(ps, quorum_goes_on_without_a_killed_worker) {
    q_job q = {"tcp", -1, 3, 6};
    tr_job job = {"tcp", 4, 20000, 60, 3};
    tr_out *o = tr_run(&job, quorum_body, &q);
    for (int w = 1; w <= 2; w++) cr_assert_eq(o[w].status, 0, "worker %d: %s", w, o[w].err);
    cr_assert_eq(o[0].u[5], TERSE_ERR_PEER_LOST, "serve: %s", o[0].err);
    cr_assert(strstr(o[0].err, "worker rank 3 was lost"), "%s", o[0].err);
    cr_assert_eq(o[0].u[2], 1);
    cr_assert_geq(o[0].u[1], 6);
    tr_release(o);
}

/* ---------------------------------------------------------------- killed */

typedef struct kill_job {
    const char *mode;
    int servers, workers, victim, steps;
} kill_job;

static void *die_later(void *arg) {
    usleep((useconds_t)(uintptr_t)arg);
    raise(SIGKILL);
    return NULL;
}

static int kill_body(terse_comm *c, tr_out *o, const void *arg) {
    const kill_job *k = arg;
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.num_servers = k->servers;
    cfg.update = TERSE_PS_UPDATE_SGD;
    cfg.lr = 0.1f;
    cfg.chunk_bytes = 4096;
    TR_CALL(o, terse_ps_config_parse(k->mode, &cfg));
    terse_ps *ps = NULL;
    TR_CALL(o, terse_ps_create(c, &cfg, &ps));
    say_ready(o);
    TR_CALL(o, terse_ps_declare(ps, 0, QN, NULL, NULL, NULL));
    int rank = terse_comm_rank(c);
    if (terse_ps_is_server(ps)) {
        if (rank == k->victim) {
            wait_all_ready(c, o);
            pthread_t t;
            pthread_create(&t, NULL, die_later, (void *)(uintptr_t)300000);
        }
        terse_status s = terse_ps_serve(ps);
        o->u[5] = (uint64_t)s;
        snprintf(o->err, sizeof o->err, "%s", terse_last_error());
        terse_ps_free(ps);
        return 0;
    }
    float buf[QN];
    double t0 = tr_now_ms();
    for (int t = 0; t < k->steps; t++) {
        if (rank == k->victim && t == 2) {
            wait_all_ready(c, o);
            raise(SIGKILL);
        }
        for (size_t i = 0; i < QN; i++) buf[i] = grad(rank, t, 0, i);
        t0 = tr_now_ms();
        terse_status s = terse_ps_pushpull(ps, 0, buf, NULL);
        if (s != TERSE_OK) {
            o->val[0] = tr_now_ms() - t0;
            o->u[6] = (uint64_t)t;
            terse_ps_free(ps);
            return tr_fail(o, s, "pushpull");
        }
        TR_CALL(o, terse_ps_clock(ps));
        if (k->victim < k->servers) usleep(20000); /* the server dies mid-run */
    }
    TR_CALL(o, terse_ps_finish(ps));
    terse_ps_free(ps);
    return 0;
}

/* A worker's body may fail (that is the point): run it with ranks.h, whose
 * assertion wants exit 0, by reporting failure through o only. */
static int kill_body_soft(terse_comm *c, tr_out *o, const void *arg) {
    kill_body(c, o, arg);
    return 0;
}

Test(ps, sync_worker_killed_fails_the_others_naming_it) {
    kill_job k = {"sync", 1, 3, 3, 5};
    tr_job job = {"tcp", 4, 5000, 60, 3};
    tr_out *o = tr_run(&job, kill_body_soft, &k);
    for (int w = 1; w <= 2; w++) {
        cr_assert_eq(o[w].status, TERSE_ERR_PEER_LOST, "worker %d: %s", w, o[w].err);
        cr_assert(strstr(o[w].err, "worker rank 3 was lost"), "worker %d: %s", w, o[w].err);
        cr_assert_eq(o[w].u[6], 2, "failed at step %llu", (unsigned long long)o[w].u[6]);
        cr_assert_lt(o[w].val[0], 5000.0, "took %.0f ms, beyond the timeout", o[w].val[0]);
    }
    cr_assert_eq(o[0].u[5], TERSE_ERR_PEER_LOST);
    tr_release(o);
}

Test(ps, async_goes_on_without_a_killed_worker) {
    kill_job k = {"async", 1, 3, 3, 12};
    tr_job job = {"tcp", 4, 5000, 60, 3};
    tr_out *o = tr_run(&job, kill_body_soft, &k);
    for (int w = 1; w <= 2; w++) cr_assert_eq(o[w].status, 0, "worker %d: %s", w, o[w].err);
    cr_assert_eq(o[0].u[5], TERSE_ERR_PEER_LOST, "serve: %s", o[0].err);
    tr_release(o);
}

Test(ps, server_killed_fails_the_workers_naming_it) {
    kill_job k = {"sync", 2, 2, 1, 400};
    tr_job job = {"tcp", 4, 5000, 60, 1};
    tr_out *o = tr_run(&job, kill_body_soft, &k);
    for (int w = 2; w <= 3; w++) {
        cr_assert(o[w].status == TERSE_ERR_PEER_LOST, "worker %d: %s", w, o[w].err);
        cr_assert(strstr(o[w].err, "rank 1"), "worker %d does not name server rank 1: %s", w,
                  o[w].err);
        cr_assert(strstr(o[w].err, "the only server of slot 1"),
                  "worker %d does not name the slot: %s", w, o[w].err);
        cr_assert_lt(o[w].val[0], 5000.0, "took %.0f ms", o[w].val[0]);
    }
    tr_release(o);
}

/* ---------------------------------------------------------------- async */

/* Worker 1 pulls once, then pushes three times without pulling: with
 * max_staleness=1 the third push (2 updates stale) is refused. Worker 2
 * then trains normally; the final parameters are exact (gradients are
 * multiples of 1/16, lr 0.5, weight 1/2: every partial sum is a float). */
static int async_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    terse_ps *ps = NULL;
    if (sgd_ps(c, o, "async:max_staleness=1", &ps)) return 1;
    int rank = terse_comm_rank(c);
    if (terse_ps_is_server(ps)) {
        TR_CALL(o, terse_ps_serve(ps));
        terse_ps_stats st = ps_stats_of(ps);
        o->u[0] = st.refused_stale;
        o->u[1] = st.pushes_applied;
        o->u[2] = st.staleness_max;
        terse_ps_free(ps);
        return 0;
    }
    float buf[QN];
    if (rank == 1) {
        TR_CALL(o, terse_ps_pull(ps, 0, buf, NULL));
        for (int t = 0; t < 3; t++) {
            for (size_t i = 0; i < QN; i++) buf[i] = grad(rank, t, 0, i);
            o->u[10 + t] = (uint64_t)terse_ps_push(ps, 0, buf, NULL);
            if (t == 2) snprintf(o->err, sizeof o->err, "%s", terse_last_error());
        }
        TR_CALL(o, terse_ps_pull(ps, 0, buf, NULL)); /* as the refusal says: pull again */
    }
    /* Then worker 2 trains alone (its pushes are 0 stale): it waits for
     * worker 1's pushes to be applied -- a barrier would need the servers;
     * a sleep is enough, and if it is not, the counts below say so. */
    if (rank == 2) {
        usleep(1000000);
        TR_CALL(o, terse_ps_pull(ps, 0, buf, NULL));
        for (int t = 3; t < 6; t++) {
            for (size_t i = 0; i < QN; i++) buf[i] = grad(rank, t, 0, i);
            TR_CALL(o, terse_ps_pushpull(ps, 0, buf, NULL));
            TR_CALL(o, terse_ps_clock(ps));
        }
    }
    for (size_t i = 0; i < QN; i++) o->f[i] = buf[i];
    TR_CALL(o, terse_ps_finish(ps));
    terse_ps_free(ps);
    return 0;
}

Test(ps, async_refuses_pushes_over_max_staleness) {
    tr_job job = {"tcp", 3, 20000, 60, -1};
    tr_out *o = tr_run(&job, async_body, NULL);
    cr_assert_eq(o[1].u[10], TERSE_OK);
    cr_assert_eq(o[1].u[11], TERSE_OK);
    cr_assert_eq(o[1].u[12], TERSE_ERR_STALE, "third push: %s",
                 terse_status_name((terse_status)o[1].u[12]));
    cr_assert(strstr(o[1].err, "max_staleness=1"), "%s", o[1].err);
    cr_assert_eq(o[0].u[0], 1, "refused: %llu", (unsigned long long)o[0].u[0]);
    cr_assert_eq(o[0].u[1], 2 + 3, "applied: %llu", (unsigned long long)o[0].u[1]);
    cr_assert_leq(o[0].u[2], 1);
    /* x = -0.5 * 1/2 * (every applied gradient). */
    for (size_t i = 0; i < QN; i++) {
        double sum = grad(1, 0, 0, i) + grad(1, 1, 0, i);
        for (int t = 3; t < 6; t++) sum += grad(2, t, 0, i);
        double ref = -0.25 * sum;
        cr_assert(fabs(o[2].f[i] - ref) < 1e-6, "element %zu: %g vs %g", i, (double)o[2].f[i], ref);
    }
    tr_release(o);
}

/* ---------------------------------------------------------------- ssp */

#define SSP_STEPS 6
#define SSP_SLOW_MS 150

/* ssp:1, worker 1 fast, worker 2 slow (150 ms a step). Worker 1's pull at
 * clock c may return only after worker 2 started its push of clock c - 1. */
static int ssp_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    terse_ps *ps = NULL;
    if (sgd_ps(c, o, "ssp:1", &ps)) return 1;
    int rank = terse_comm_rank(c);
    if (terse_ps_is_server(ps)) {
        TR_CALL(o, terse_ps_serve(ps));
        terse_ps_free(ps);
        return 0;
    }
    float buf[QN];
    for (int t = 0; t < SSP_STEPS; t++) {
        if (rank == 2) usleep(SSP_SLOW_MS * 1000);
        for (size_t i = 0; i < QN; i++) buf[i] = grad(rank, t, 0, i);
        o->val[t] = tr_now_ms(); /* push started */
        TR_CALL(o, terse_ps_push(ps, 0, buf, NULL));
        TR_CALL(o, terse_ps_pull(ps, 0, buf, NULL));
        o->val[SSP_STEPS + t] = tr_now_ms(); /* pull returned */
        TR_CALL(o, terse_ps_clock(ps));
    }
    TR_CALL(o, terse_ps_finish(ps));
    terse_ps_free(ps);
    return 0;
}

Test(ps, ssp_pull_waits_for_the_slowest_within_the_bound) {
    tr_job job = {"tcp", 3, 20000, 60, -1};
    tr_out *o = tr_run(&job, ssp_body, NULL);
    const tr_out *fast = &o[1], *slow = &o[2];
    for (int t = 1; t < SSP_STEPS; t++)
        cr_assert_geq(fast->val[SSP_STEPS + t], slow->val[t - 1],
                      "the fast worker's pull at clock %d returned %.1f ms before the slow one "
                      "pushed clock %d: the bound s=1 was violated",
                      t, slow->val[t - 1] - fast->val[SSP_STEPS + t], t - 1);
    /* And it did get ahead (ssp is not bulk synchronous here): its pull at
     * clock 1 needs only the slow worker's clock 0, not its clock 1. */
    cr_assert_lt(fast->val[SSP_STEPS + 1], slow->val[1],
                 "the fast worker's pull at clock 1 waited for the slow worker's clock 1");
    tr_release(o);
}

/* ssp:0 with a worker whose push at clock 1 holds an infinity: the push is
 * not applied, its clock moves on, and nobody waits for it to the timeout
 * (the bound counts the refused clock as pushed). */
static int ssp_nonfinite_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    terse_ps *ps = NULL;
    if (sgd_ps(c, o, "ssp:0", &ps)) return 1;
    int rank = terse_comm_rank(c);
    if (terse_ps_is_server(ps)) {
        TR_CALL(o, terse_ps_serve(ps));
        terse_ps_stats st = ps_stats_of(ps);
        o->u[0] = st.refused_nonfinite, o->u[1] = st.pushes_applied;
        terse_ps_free(ps);
        return 0;
    }
    float buf[QN];
    double t0 = tr_now_ms();
    for (int t = 0; t < 3; t++) {
        for (size_t i = 0; i < QN; i++) buf[i] = grad(rank, t, 0, i);
        if (rank == 2 && t == 1) buf[5] = INFINITY;
        o->u[10 + t] = (uint64_t)terse_ps_push(ps, 0, buf, NULL);
        TR_CALL(o, terse_ps_pull(ps, 0, buf, NULL));
        TR_CALL(o, terse_ps_clock(ps));
    }
    o->val[0] = tr_now_ms() - t0;
    for (size_t i = 0; i < QN; i++)
        if (!isfinite(buf[i])) o->u[20] = 1;
    TR_CALL(o, terse_ps_finish(ps));
    terse_ps_free(ps);
    return 0;
}

Test(ps, ssp_a_nonfinite_push_is_not_applied_and_holds_nobody) {
    tr_job job = {"shm", 3, 20000, 60, -1};
    tr_out *o = tr_run(&job, ssp_nonfinite_body, NULL);
    cr_assert_eq(o[2].u[11], TERSE_ERR_NONFINITE, "%s", o[2].err);
    cr_assert_eq(o[0].u[0], 1);
    cr_assert_eq(o[0].u[1], 5, "applied %llu", (unsigned long long)o[0].u[1]);
    for (int w = 1; w <= 2; w++) {
        cr_assert_eq(o[w].u[20], 0, "rank %d pulled a non-finite value", w);
        cr_assert_lt(o[w].val[0], 10000.0, "rank %d took %.0f ms: it waited for the refused clock",
                     w, o[w].val[0]);
    }
    tr_release(o);
}

/* ---------------------------------------------------------------- rounds */

/* Rounds as federated learning runs them: 1 server, 3 workers,
 * sync:quorum=2,deadline_ms=D. Round r samples two workers (r even: 1 and
 * 2; odd: 2 and 3); the third calls terse_ps_clock without pushing and
 * pulls, which waits until the round closed. In round 2 worker 1 is late
 * by D + 2 s: the round closes at its deadline with worker 2's push alone,
 * and worker 1's push is refused as late. */
#define ROUNDS 4
/* long enough that no sampled worker misses a round on a loaded 2-core
 * machine (400 ms once did in CI, beside the replacement tests, and
 * 1000 ms once did in round 0, beside the other suites, and 3000 ms once
 * did in the sanitizer build, 2026-12-03) */
#define DEADLINE_MS 5000
/* how long worker 1 is late in round 2: past the deadline, with margin */
#define LATE_MS (DEADLINE_MS + 2000)
static int sampled(int w, int r) { return r % 2 ? w >= 2 : w <= 2; }

/* Rounds' variants: worker 3 dies in round 1; pushes weighted w + 1
 * (terse_ps_push_weighted, as federated clients weight by examples). */
typedef struct {
    int dies, weighted;
} rounds_job;

static double rounds_weight(const rounds_job *j, int w) { return j && j->weighted ? w + 1 : 1; }

/* The mean of round r's pushes from the sampled workers not left out. */
static double rounds_want(const rounds_job *j, int r, int (*out)(int w, int r)) {
    double want = 0, total = 0;
    for (int w = 1; w <= 3; w++)
        if (sampled(w, r) && !out(w, r)) {
            want += rounds_weight(j, w) * grad(w, r, 0, 0);
            total += rounds_weight(j, w);
        }
    return want / total;
}

static int rounds_body(terse_comm *c, tr_out *o, const void *arg) {
    const rounds_job *j = arg;
    const int dies = j && j->dies;
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    char spec[64];
    snprintf(spec, sizeof spec, "sync:quorum=2,deadline_ms=%d", DEADLINE_MS);
    TR_CALL(o, terse_ps_config_parse(spec, &cfg));
    terse_ps *ps = NULL;
    TR_CALL(o, terse_ps_create(c, &cfg, &ps));
    TR_CALL(o, terse_ps_declare(ps, 0, QN, NULL, NULL, NULL));
    int rank = terse_comm_rank(c);
    if (terse_ps_is_server(ps)) {
        terse_status served = terse_ps_serve(ps); /* names the lost worker, went on */
        if (!(dies && served == TERSE_ERR_PEER_LOST)) TR_CALL(o, served);
        terse_ps_stats st = ps_stats_of(ps);
        o->u[0] = st.steps_closed, o->u[1] = st.deadline_closes, o->u[2] = st.late_dropped;
        terse_ps_free(ps);
        return 0;
    }
    float buf[QN];
    for (int r = 0; r < ROUNDS; r++) {
        if (dies && rank == 3 && r == 1) raise(SIGKILL); /* mid-round, before its push */
        if (sampled(rank, r)) {
            if (!dies && r == 2 && rank == 1) usleep(LATE_MS * 1000);
            for (size_t i = 0; i < QN; i++) buf[i] = grad(rank, r, 0, i);
            if (j && j->weighted) {
                o->u[10 + r] = (uint64_t)terse_ps_push_weighted(ps, 0, buf, rounds_weight(j, rank), NULL);
                if (o->u[10 + r] == TERSE_OK) o->u[10 + r] = (uint64_t)terse_ps_pull(ps, 0, buf, NULL);
            } else {
                o->u[10 + r] = (uint64_t)terse_ps_pushpull(ps, 0, buf, NULL);
            }
            if (o->u[10 + r] == TERSE_ERR_STALE) TR_CALL(o, terse_ps_pull(ps, 0, buf, NULL));
            else TR_CALL(o, (terse_status)o->u[10 + r]);
        } else {
            TR_CALL(o, terse_ps_clock(ps)); /* sat this round out */
            TR_CALL(o, terse_ps_pull(ps, 0, buf, NULL));
            o->u[10 + r] = 99;
        }
        o->hash[r] = tr_hash(buf, sizeof buf);
        o->f[r] = buf[0];
        if (sampled(rank, r)) TR_CALL(o, terse_ps_clock(ps));
        o->u[20 + r] = terse_ps_worker_clock(ps); /* past r + 1: it fell behind a quorum */
    }
    TR_CALL(o, terse_ps_finish(ps));
    terse_ps_free(ps);
    return 0;
}

static int late_in_round_2(int w, int r) { return r == 2 && w == 1; }
static int dead_from_round_1(int w, int r) { return w == 3 && r >= 1; }

static void rounds_on_time(const rounds_job *j) {
    tr_job job = {"shm", 4, 20000, 60, -1};
    tr_out *o = tr_run(&job, rounds_body, j);
    for (int r = 0; r < ROUNDS; r++) {
        /* everyone holds the round's result, sampled or not -- but worker
         * 1 from round 2 on: late, it catches up to the newest step (its
         * pull moves its clock there), and rounds after that are other
         * steps for it, some closed empty by their deadline */
        cr_assert_eq(o[3].hash[r], o[2].hash[r], "round %d: workers 2 and 3 differ", r);
        /* A weighted push and its pull are two requests: if worker 1 is
         * descheduled between them while workers 2 and 3 close round 1 on
         * their quorum, its pull returns round 1's result and moves its
         * clock there (terse.h, Steps), and its rounds run one ahead. */
        const int behind = o[1].u[20] > 1;
        if (r == 0 && behind) {
            fprintf(stderr, "worker 1 fell behind the quorum in round 0 (its clock went to "
                            "%llu): its pull returned round 1's result, as documented\n",
                    (unsigned long long)o[1].u[20]);
            cr_assert_eq(o[1].hash[0], o[2].hash[1], "round 0: worker 1 behind (%g), want "
                         "round 1's result (%g)", (double)o[1].f[0], (double)o[2].f[1]);
        } else if (r < 2 && !behind) {
            cr_assert_eq(o[1].hash[r], o[2].hash[r],
                         "round %d: worker 1 differs (%g, push/pull status %llu) from worker 2 "
                         "(%g, status %llu); want %g; server: %llu steps closed, %llu by the "
                         "deadline, %llu late pushes",
                         r, (double)o[1].f[r], (unsigned long long)o[1].u[10 + r],
                         (double)o[2].f[r], (unsigned long long)o[2].u[10 + r],
                         rounds_want(j, r, late_in_round_2), (unsigned long long)o[0].u[0],
                         (unsigned long long)o[0].u[1], (unsigned long long)o[0].u[2]);
        }
        double want = rounds_want(j, r, late_in_round_2);
        cr_assert_float_eq(o[2].f[r], want, 1e-6, "round %d: %g, want %g", r, (double)o[2].f[r],
                           want);
    }
    cr_assert_eq(o[1].u[12], TERSE_ERR_STALE, "the late push: %s", o[1].err);
    /* round 2 by its deadline; after the last round, empty steps may close
     * on theirs while the workers finish */
    cr_assert_geq(o[0].u[0], ROUNDS, "steps closed");
    cr_assert_geq(o[0].u[1], 1, "closed by the deadline: %llu", (unsigned long long)o[0].u[1]);
    cr_assert_eq(o[0].u[0] - o[0].u[1], ROUNDS - 1, "closed on their quorum");
    cr_assert_eq(o[0].u[2], 1, "late pushes dropped: %llu", (unsigned long long)o[0].u[2]);
    tr_release(o);
}

Test(ps, rounds_close_on_their_quorum_or_deadline_and_idle_workers_pull_the_result) {
    rounds_on_time(NULL);
}

/* Federated averaging's weights: each round's mean weighs its pushes, and
 * the late push's weight leaves with it. */
Test(ps, weighted_rounds_average_by_weight_over_the_pushes_that_made_the_round) {
    static const rounds_job j = {0, 1};
    rounds_on_time(&j);
}

/* A sampled worker killed before its push: its rounds close at their
 * deadline with the others' pushes, and the rest go on unaffected. */
Test(ps, a_worker_that_dies_mid_round_is_dropped_and_the_round_completes) {
    static const rounds_job j = {1, 1}; /* weighted: the dead worker's weight goes too */
    tr_job job = {"shm", 4, 20000, 60, 3};
    tr_out *o = tr_run(&job, rounds_body, &j);
    for (int r = 0; r < ROUNDS; r++) {
        cr_assert_eq(o[1].hash[r], o[2].hash[r], "round %d: workers 1 and 2 differ", r);
        double want = rounds_want(&j, r, dead_from_round_1);
        cr_assert_float_eq(o[2].f[r], want, 1e-6, "round %d: %g, want %g", r, (double)o[2].f[r],
                           want);
        if (sampled(2, r)) cr_assert_eq(o[2].u[10 + r], TERSE_OK, "round %d: %s", r, o[2].err);
    }
    cr_assert_geq(o[0].u[1], 2, "rounds 1 and 3 closed by their deadline");
    tr_release(o);
}

Test(ps, a_deadline_needs_sync_and_parses_strictly) {
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cr_assert_eq(terse_ps_config_parse("sync:deadline_ms=250", &cfg), TERSE_OK);
    cr_assert_eq(cfg.deadline_ms, 250);
    cr_assert_eq(terse_ps_config_parse("sync", &cfg), TERSE_OK);
    cr_assert_eq(cfg.deadline_ms, 0, "a new spec resets it");
    cr_assert_eq(terse_ps_config_parse("sync:deadline_ms=0", &cfg), TERSE_ERR_INVALID);
    cr_assert_eq(terse_ps_config_parse("async:deadline_ms=5", &cfg), TERSE_ERR_INVALID);
    cr_assert(strstr(terse_last_error(), "deadline_ms"), "%s", terse_last_error());
}

/* ---------------------------------------------------------------- placement */

/* Placement is a pure function: build it on a bare terse_ps. */
static terse_ps *bare(int servers, size_t chunk_bytes) {
    terse_ps *ps = calloc(1, sizeof *ps);
    ps->nservers = servers;
    ps->cfg.vnodes = 64;
    ps->chunk_floats = chunk_bytes / 4;
    ps->placed = calloc((size_t)servers, sizeof *ps->placed);
    ps->keys = calloc(4096, sizeof *ps->keys);
    for (size_t i = 0; i < 4096; i++) {
        ps->keys[i] = calloc(1, sizeof **ps->keys);
        ps->keys[i]->index = i;
    }
    cr_assert_eq(terse__ps_ring_build(ps), TERSE_OK);
    return ps;
}

static void bare_place(terse_ps *ps, size_t key, size_t n) {
    terse__ps_key *k = ps->keys[key];
    k->n = n;
    k->chunk_floats = ps->chunk_floats;
    k->nchunks = (n - 1) / k->chunk_floats + 1;
    k->server = calloc(k->nchunks, sizeof *k->server);
    terse__ps_place(ps, k);
}

static void bare_free(terse_ps *ps, size_t nkeys) {
    for (size_t i = 0; i < nkeys; i++) free(ps->keys[i]->server);
    for (size_t i = 0; i < 4096; i++) free(ps->keys[i]);
    free(ps->keys), free(ps->placed), free(ps->ring_hash), free(ps->ring_server);
    free(ps);
}

Test(ps, placement_spreads_a_small_model_over_every_server) {
    /* Ten tensors, each smaller than a chunk (ps-lite #119's case). */
    static const size_t sizes[10] = {800, 32, 25000, 64, 3000, 16, 12000, 128, 500, 10};
    terse_ps *ps = bare(3, (size_t)1 << 20);
    uint64_t total = 0;
    for (size_t k = 0; k < 10; k++) {
        bare_place(ps, k, sizes[k]);
        total += sizes[k] * 4;
    }
    for (int s = 0; s < 3; s++)
        cr_assert_gt(ps->placed[s], 0, "server %d holds nothing of a 10-tensor model", s);
    bare_free(ps, 10);
    (void)total;
}

Test(ps, placement_moves_about_one_in_s_when_a_server_joins) {
    const size_t keys = 1000, n = 256; /* 1000 one-chunk tensors */
    terse_ps *a = bare(3, 1024), *b = bare(4, 1024);
    for (size_t k = 0; k < keys; k++) {
        bare_place(a, k, n);
        bare_place(b, k, n);
    }
    size_t moved = 0, to_other = 0;
    for (size_t k = 0; k < keys; k++)
        if (a->keys[k]->server[0] != b->keys[k]->server[0]) {
            moved++;
            to_other += b->keys[k]->server[0] != 3;
        }
    double frac = (double)moved / (double)keys;
    fprintf(stderr, "placement: adding a 4th server moved %.1f%% of 1000 chunks (%zu not to the new server)\n",
            100 * frac, to_other);
    cr_assert(frac > 0.15 && frac < 0.40, "moved %.1f%% (about 25%% expected)", 100 * frac);
    /* Balance with 4 servers: within the 1.25x bound, plus one chunk. */
    for (int s = 0; s < 4; s++)
        cr_assert_leq((double)b->placed[s], 1.25 * keys * n * 4 / 4 + 1024,
                      "server %d holds %llu bytes", s, (unsigned long long)b->placed[s]);
    bare_free(a, keys);
    bare_free(b, keys);
}

/* ---------------------------------------------------------------- compression */

#define CN 1000
#define CSTEPS 6

/* Push qsgd 4-bit with worker-side error feedback, pull int8 with
 * server-side error feedback. Each side's identity: what was sent plus the
 * residual left equals what was meant to be sent. */
static int comp_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.chunk_bytes = 1024;
    terse_ps *ps = NULL;
    TR_CALL(o, terse_ps_create(c, &cfg, &ps));
    TR_CALL(o, terse_ps_declare(ps, 0, CN, "qsgd:bits=4,ef=1", "int8:ef=1", NULL));
    terse__ps_key *k = ps->keys[0];
    int rank = terse_comm_rank(c);
    if (terse_ps_is_server(ps)) {
        TR_CALL(o, terse_ps_serve(ps));
        terse__ps_shard *sh = k->shard;
        for (size_t i = 0; i < sh->nchunks; i++) {
            const float *e = terse_codec_residual(sh->enc[i]);
            size_t len = terse_codec_elements(sh->enc[i]);
            memcpy(o->f + sh->offs[i], e, len * sizeof(float));
        }
        terse_ps_free(ps);
        return 0;
    }
    terse_codec **dec = calloc(k->nchunks, sizeof *dec);
    for (size_t ch = 0; ch < k->nchunks; ch++)
        TR_CALL(o, terse_codec_create("qsgd:bits=4", 1, terse_codec_elements(k->push_enc[ch]), &dec[ch]));
    float buf[CN], *sent = o->f, *pulled = o->f + CN, *resid = o->f + 2 * CN, *meant = o->f + 3 * CN;
    for (int t = 0; t < CSTEPS; t++) {
        for (size_t i = 0; i < CN; i++) {
            buf[i] = grad(rank, t, 0, i) * (float)(1 + i % 3);
            meant[i] += buf[i];
        }
        TR_CALL(o, terse_ps_pushpull(ps, 0, buf, NULL));
        for (size_t i = 0; i < CN; i++) pulled[i] += buf[i];
        /* What went out: the payload still in the send buffer, decoded. */
        const uint8_t *p = ps->sbuf[0];
        size_t off = 0;
        for (size_t ch = 0; ch < k->nchunks; ch++) {
            size_t m = 0;
            TR_CALL(o, terse__ps_msg_len(p + off, ps->sbuf_cap[0] - off, &m));
            TR_CALL(o, terse_decode(dec[ch], p + off, m, sent + ch * k->chunk_floats, 1.0f, 1));
            off += m;
        }
        TR_CALL(o, terse_ps_clock(ps));
    }
    for (size_t ch = 0; ch < k->nchunks; ch++) {
        memcpy(resid + ch * k->chunk_floats, terse_codec_residual(k->push_enc[ch]),
               terse_codec_elements(k->push_enc[ch]) * sizeof(float));
        terse_codec_free(dec[ch]);
    }
    free(dec);
    terse_comm_stats st = TERSE_COMM_STATS_INIT;
    terse_comm_get_stats(c, &st);
    o->u[0] = st.payload_bytes_sent;
    o->u[1] = st.payload_bytes_recv;
    TR_CALL(o, terse_ps_finish(ps));
    terse_ps_free(ps);
    return 0;
}

static void compression(const char *prov) {
    tr_job job = {prov, 3, 20000, 60, -1};
    tr_out *o = tr_run(&job, comp_body, NULL);
    for (int w = 1; w <= 2; w++) {
        const float *sent = o[w].f, *resid = o[w].f + 2 * CN, *meant = o[w].f + 3 * CN;
        for (size_t i = 0; i < CN; i++)
            cr_assert(fabs((double)sent[i] + resid[i] - meant[i]) < 1e-4,
                      "worker %d element %zu: sent %g + residual %g != pushed %g", w, i,
                      (double)sent[i], (double)resid[i], (double)meant[i]);
        /* Compressed both ways: qsgd 4-bit up, int8 down, against fp32. */
        cr_assert_lt(o[w].u[0], CSTEPS * CN * 4 / 4, "sent %llu payload bytes",
                     (unsigned long long)o[w].u[0]);
        cr_assert_lt(o[w].u[1], CSTEPS * CN * 4 / 3, "received %llu payload bytes",
                     (unsigned long long)o[w].u[1]);
    }
    const float *e_server = o[0].f;
    for (size_t i = 0; i < CN; i++) {
        cr_assert_eq(o[1].f[CN + i], o[2].f[CN + i], "workers pulled different bits at %zu", i);
        /* Server side: the pulls plus the server's residual are the
         * aggregates, i.e. the mean of what the workers sent. */
        double agg = 0.5 * ((double)o[1].f[i] + o[2].f[i]);
        cr_assert(fabs((double)o[1].f[CN + i] + e_server[i] - agg) < 1e-4,
                  "element %zu: pulled %g + server residual %g != aggregates %g", i,
                  (double)o[1].f[CN + i], (double)e_server[i], agg);
    }
    tr_release(o);
}

Test(ps, compression_both_ways_keeps_the_sum_identity_tcp) { compression("tcp"); }
Test(ps, compression_both_ways_keeps_the_sum_identity_shm) { compression("shm"); }

/* ---------------------------------------------------------------- bad input */

#define BN 3000

static terse__ps_hdr hdr_for(terse_ps *ps, int op, uint64_t key, int s, uint64_t plen) {
    terse__ps_key *k = ps->keys[0];
    terse__ps_hdr h = {op, key, ps->clock, plen, 0, k->srv_floats[s], k->decl_hash, 1.0f, 0};
    return h;
}

/* A valid payload for server s: its chunks of key 0, encoded "none". */
static size_t payload_for(terse_ps *ps, int s, const float *x, uint8_t *out) {
    terse__ps_key *k = ps->keys[0];
    size_t off = 0;
    for (size_t ch = 0; ch < k->nchunks; ch++) {
        if (k->server[ch] != s) continue;
        size_t len = terse_codec_elements(k->push_enc[ch]), got = 0;
        terse_codec *cd = NULL;
        terse_codec_create("none", 1, len, &cd);
        terse_encode(cd, x + ch * k->chunk_floats, out + off, terse_codec_bound(cd), &got);
        terse_codec_free(cd);
        off += got;
    }
    return off;
}

#define EXPECT(o, slot, call, want)                                               \
    do {                                                                           \
        terse__ps_rep rep_;                                                        \
        memset(&rep_, 0, sizeof rep_);                                             \
        terse_status t_ = (call);                                                  \
        if (t_ != TERSE_OK) return tr_fail((o), t_, #call);                        \
        (o)->u[slot] = (uint64_t)rep_.status;                                      \
        if (rep_.status != (want)) {                                               \
            snprintf((o)->err, sizeof (o)->err, "slot %d: %s gave %s: %s", slot, #call, \
                     terse_status_name(rep_.status), rep_.text);                   \
            (o)->status = 1;                                                       \
            return 1;                                                              \
        }                                                                          \
    } while (0)

static int bad_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.num_servers = 2;
    cfg.chunk_bytes = 4096;
    terse_ps *ps = NULL;
    TR_CALL(o, terse_ps_create(c, &cfg, &ps));
    TR_CALL(o, terse_ps_declare(ps, 0, BN, NULL, NULL, NULL));
    /* Declaration errors: a bad spec, a two-round codec, out of order. */
    o->u[40] = (uint64_t)terse_ps_declare(ps, 1, 10, "qsgd:bits=99", NULL, NULL);
    o->u[41] = (uint64_t)terse_ps_declare(ps, 1, 10, "powersgd:rank=2", NULL, NULL);
    o->u[42] = (uint64_t)terse_ps_declare(ps, 5, 10, NULL, NULL, NULL);
    int rank = terse_comm_rank(c);
    float x[BN];
    for (size_t i = 0; i < BN; i++) x[i] = grad(rank, 0, 0, i);
    if (terse_ps_is_server(ps)) {
        o->u[43] = (uint64_t)terse_ps_push(ps, 0, x, NULL); /* a server may not push */
        if (rank == 1) { /* a rank that is not a worker talks to server 0 */
            static uint8_t pl[2 * BN * 4];
            terse__ps_hdr h = {TERSE__PS_PUSH, 0, 0, 64, 0, 0, ps->keys[0]->decl_hash, 1.0f, 0};
            terse__ps_rep rep_;
            memset(&rep_, 0, sizeof rep_);
            TR_CALL(o, terse__ps_test_raw(ps, 0, &h, pl, 64, &rep_));
            o->u[0] = (uint64_t)rep_.status;
            snprintf(o->err, sizeof o->err, "%s", rep_.text);
        }
        TR_CALL(o, terse_ps_serve(ps));
        terse_ps_stats st = ps_stats_of(ps);
        o->u[1] = st.refused_role;
        o->u[2] = st.refused_key;
        o->u[3] = st.refused_corrupt;
        o->u[4] = st.refused_step;
        terse_ps_free(ps);
        return 0;
    }
    o->u[44] = (uint64_t)terse_ps_push(ps, 99, x, NULL);
    o->u[45] = (uint64_t)terse_ps_pull(ps, 0, NULL, NULL);
    int s = terse_ps_chunk_server(ps, 0, 0);
    terse__ps_key *k = ps->keys[0];
    static uint8_t pl[2 * BN * 4 + 4096];
    terse__ps_hdr h;
    h = hdr_for(ps, TERSE__PS_PULL, 7, s, 0);
    EXPECT(o, 10, terse__ps_test_raw(ps, s, &h, NULL, 0, &rep_), TERSE_ERR_INVALID);
    h = hdr_for(ps, TERSE__PS_PULL, 0, s, 0);
    h.nfloats++;
    EXPECT(o, 11, terse__ps_test_raw(ps, s, &h, NULL, 0, &rep_), TERSE_ERR_SHAPE);
    h = hdr_for(ps, TERSE__PS_PULL, 0, s, 0);
    h.decl_hash ^= 1;
    EXPECT(o, 12, terse__ps_test_raw(ps, s, &h, NULL, 0, &rep_), TERSE_ERR_INVALID);
    size_t big = k->srv_push_bound[s] + 1;
    h = hdr_for(ps, TERSE__PS_PUSH, 0, s, big);
    EXPECT(o, 13, terse__ps_test_raw(ps, s, &h, pl, big, &rep_), TERSE_ERR_SHAPE);
    size_t len = payload_for(ps, s, x, pl);
    pl[len / 2] ^= 0x40; /* a corrupt payload: its CRC fails */
    h = hdr_for(ps, TERSE__PS_PUSH, 0, s, len);
    EXPECT(o, 14, terse__ps_test_raw(ps, s, &h, pl, len, &rep_), TERSE_ERR_CORRUPT);
    pl[len / 2] ^= 0x40;
    h = hdr_for(ps, TERSE__PS_PULL, 0, s, 16);
    EXPECT(o, 15, terse__ps_test_raw(ps, s, &h, pl, 16, &rep_), TERSE_ERR_CORRUPT);
    /* A weight on a pull; a weight that is NaN, negative or zero (as bits:
     * 0 means unweighted, so -0.0) on a push; the API refuses them too. */
    h = hdr_for(ps, TERSE__PS_PULL, 0, s, 0);
    h.weight = 2.0f;
    EXPECT(o, 18, terse__ps_test_raw(ps, s, &h, NULL, 0, &rep_), TERSE_ERR_CORRUPT);
    const float bad_w[3] = {NAN, -1.0f, -0.0f};
    for (int b = 0; b < 3; b++) {
        h = hdr_for(ps, TERSE__PS_PUSH, 0, s, len);
        h.weight = bad_w[b];
        EXPECT(o, 19 + b, terse__ps_test_raw(ps, s, &h, pl, len, &rep_), TERSE_ERR_CORRUPT);
    }
    o->u[46] = (uint64_t)terse_ps_push_weighted(ps, 0, x, 0.0, NULL);
    o->u[47] = (uint64_t)terse_ps_push_weighted(ps, 0, x, NAN, NULL);
    o->u[48] = (uint64_t)terse_ps_push_weighted(ps, 0, x, INFINITY, NULL);
    /* Step 0 for real (one worker: it closes at once), then a push for it again. */
    float y[BN];
    memcpy(y, x, sizeof y);
    TR_CALL(o, terse_ps_pushpull(ps, 0, y, NULL));
    TR_CALL(o, terse_ps_clock(ps));
    h = hdr_for(ps, TERSE__PS_PUSH, 0, s, len);
    h.clock = 0;
    EXPECT(o, 16, terse__ps_test_raw(ps, s, &h, pl, len, &rep_), TERSE_ERR_STALE);
    /* A push for a step not yet open. */
    h.clock = 5;
    EXPECT(o, 17, terse__ps_test_raw(ps, s, &h, pl, len, &rep_), TERSE_ERR_INVALID);
    /* And the servers still serve: step 1 gives the right values. */
    for (size_t i = 0; i < BN; i++) y[i] = grad(rank, 1, 0, i);
    TR_CALL(o, terse_ps_pushpull(ps, 0, y, NULL));
    for (size_t i = 0; i < BN; i++)
        if (y[i] != grad(rank, 1, 0, i)) {
            snprintf(o->err, sizeof o->err, "element %zu after the bad input: %g", i, (double)y[i]);
            o->status = 1;
            return 1;
        }
    TR_CALL(o, terse_ps_finish(ps));
    terse_ps_free(ps);
    return 0;
}

Test(ps, bad_input_is_refused_with_a_status_and_serving_goes_on) {
    tr_job job = {"tcp", 3, 20000, 60, -1};
    tr_out *o = tr_run(&job, bad_body, NULL);
    cr_assert_eq(o[1].u[0], TERSE_ERR_INVALID, "a server's push to a server: %s",
                 terse_status_name((terse_status)o[1].u[0]));
    cr_assert(strstr(o[1].err, "is a server"), "%s", o[1].err);
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(o[r].u[40], TERSE_ERR_INVALID, "rank %d: bad spec", r);
        cr_assert_eq(o[r].u[41], TERSE_ERR_UNSUPPORTED, "rank %d: powersgd", r);
        cr_assert_eq(o[r].u[42], TERSE_ERR_INVALID, "rank %d: key out of order", r);
    }
    cr_assert_eq(o[0].u[43], TERSE_ERR_INVALID);
    cr_assert_eq(o[2].u[44], TERSE_ERR_INVALID);
    cr_assert_eq(o[2].u[45], TERSE_ERR_INVALID);
    cr_assert_eq(o[0].u[1], 1, "refused_role %llu", (unsigned long long)o[0].u[1]);
    cr_assert_eq(o[0].u[2] + o[1].u[2], 4, "refused_key");
    cr_assert_eq(o[0].u[3] + o[1].u[3], 6, "refused_corrupt");
    for (int slot = 46; slot <= 48; slot++)
        cr_assert_eq(o[2].u[slot], TERSE_ERR_INVALID, "slot %d: a weight of 0, NaN or inf", slot);
    cr_assert_eq(o[0].u[4] + o[1].u[4], 2, "refused_step");
    tr_release(o);
}

/* Every rank must create with the same config. */
static int mismatch_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    if (terse_comm_rank(c) == 2) cfg.chunk_bytes = 8192;
    terse_ps *ps = NULL;
    o->u[0] = (uint64_t)terse_ps_create(c, &cfg, &ps);
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    terse_ps_free(ps);
    return 0;
}

Test(ps, a_config_that_differs_is_refused_naming_the_field) {
    tr_job job = {"shm", 3, 20000, 60, -1};
    tr_out *o = tr_run(&job, mismatch_body, NULL);
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(o[r].u[0], TERSE_ERR_INVALID, "rank %d", r);
        cr_assert(strstr(o[r].err, "chunk_bytes"), "rank %d: %s", r, o[r].err);
    }
    tr_release(o);
}

/* ------------------------------------------------------ robust aggregation */

/* 1 server, 5 workers, sync, a robust aggregator. Rank 5 is Byzantine: it
 * pushes 1e30-sized values every step. Rank 4 pushes a NaN at its last
 * step. Every honest worker reports what it pulled at each step. */
#define RN 300
#define RSTEPS 3
static float robust_push(int w, int t, size_t i) {
    if (w == 5) return 1e30f * (float)(1 + (int)(i % 3));
    if (w == 4 && t == RSTEPS - 1 && i == 7) return NAN;
    return grad(w, t, 0, i);
}

static int robust_body(terse_comm *c, tr_out *o, const void *arg) {
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.aggregator = arg;
    cfg.chunk_bytes = 512; /* 128-float chunks: the key spans three */
    terse_ps *ps = NULL;
    TR_CALL(o, terse_ps_create(c, &cfg, &ps));
    TR_CALL(o, terse_ps_declare(ps, 0, RN, NULL, NULL, NULL));
    int rank = terse_comm_rank(c);
    if (terse_ps_is_server(ps)) {
        TR_CALL(o, terse_ps_serve(ps));
        terse_ps_stats st = ps_stats_of(ps);
        o->u[0] = st.steps_closed, o->u[1] = st.pushes_applied, o->u[2] = st.refused_nonfinite;
        terse_ps_free(ps);
        return 0;
    }
    float buf[RN];
    if (rank == 1) { /* weights are the mean's alone: refused here, and by the server */
        for (size_t i = 0; i < RN; i++) buf[i] = robust_push(rank, 0, i);
        o->u[30] = (uint64_t)terse_ps_push_weighted(ps, 0, buf, 2.0, NULL);
        snprintf(o->err, sizeof o->err, "%s", terse_last_error());
        terse__ps_hdr h = {TERSE__PS_PUSH, 0, 0, 64, 0, RN, ps->keys[0]->decl_hash, 2.0f, 0};
        static uint8_t pl[64];
        terse__ps_rep rep;
        memset(&rep, 0, sizeof rep);
        TR_CALL(o, terse__ps_test_raw(ps, 0, &h, pl, sizeof pl, &rep));
        o->u[31] = (uint64_t)rep.status;
        snprintf(o->err + strlen(o->err), sizeof o->err - strlen(o->err), " | %s", rep.text);
    }
    for (int t = 0; t < RSTEPS; t++) {
        for (size_t i = 0; i < RN; i++) buf[i] = robust_push(rank, t, i);
        terse_status s = terse_ps_pushpull(ps, 0, buf, NULL);
        o->u[10 + t] = (uint64_t)s;
        if (s != TERSE_OK) {
            snprintf(o->err, sizeof o->err, "%s", terse_last_error());
            break;
        }
        o->hash[t] = tr_hash(buf, sizeof buf);
        if (t == RSTEPS - 1) memcpy(o->f, buf, sizeof buf);
        TR_CALL(o, terse_ps_clock(ps));
    }
    TR_CALL(o, terse_ps_finish(ps));
    terse_ps_free(ps);
    return 0;
}

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void robust(const char *prov, const char *agg) {
    tr_job job = {prov, 6, 20000, 90, -1};
    tr_out *o = tr_run(&job, robust_body, agg);
    const int last = RSTEPS - 1;
    /* rank 4's NaN push is refused naming the element; the step closes
     * without it */
    cr_assert_eq(o[1].u[30], TERSE_ERR_INVALID, "a weighted push under %s: %s", agg, o[1].err);
    cr_assert(strstr(o[1].err, "need sync mode with the mean aggregator (this job runs sync mode "
                               "with "),
              "%s", o[1].err);
    cr_assert_eq(o[1].u[31], TERSE_ERR_INVALID, "a forged weighted push under %s: %s", agg,
                 o[1].err);
    cr_assert(strstr(o[1].err, "| a push weighted 2: weighted pushes need"), "%s", o[1].err);
    cr_assert_eq(o[4].u[10 + last], TERSE_ERR_NONFINITE, "rank 4: %s", o[4].err);
    cr_assert(strstr(o[4].err, "left out of the step's aggregate"), "%s", o[4].err);
    cr_assert_eq(o[0].u[2], 1, "refused_nonfinite %llu", (unsigned long long)o[0].u[2]);
    /* one server holds the key's three chunks: one shard, one push a worker a step */
    cr_assert_eq(o[0].u[1], (uint64_t)(5 * RSTEPS - 1), "pushes applied %llu",
                 (unsigned long long)o[0].u[1]);
    for (int w = 1; w <= 5; w++) {
        if (w == 4) continue;
        cr_assert_eq(o[w].u[10 + last], TERSE_OK, "rank %d: %s", w, o[w].err);
        for (int t = 0; t < RSTEPS; t++)
            cr_assert_eq(o[w].hash[t], o[1].hash[t], "rank %d step %d differs bitwise", w, t);
    }
    /* the last step's reference over ranks 1, 2, 3 (honest) and 5 */
    for (size_t i = 0; i < RN; i++) {
        float v[4] = {robust_push(1, last, i), robust_push(2, last, i), robust_push(3, last, i),
                      robust_push(5, last, i)};
        cr_assert(isfinite(o[1].f[i]), "element %zu is %g", i, (double)o[1].f[i]);
        if (!strcmp(agg, "median")) {
            qsort(v, 4, sizeof v[0], cmp_f);
            double ref = ((double)v[1] + v[2]) / 2;
            cr_assert_float_eq(o[1].f[i], ref, 1e-6, "element %zu", i);
        } else { /* krum over 4 pushes (f shrinks to 0): one of the three honest ones */
            cr_assert(fabsf(o[1].f[i]) <= 1.0f, "element %zu: %g", i, (double)o[1].f[i]);
        }
    }
    tr_release(o);
}

Test(ps, median_leaves_out_a_nan_push_and_outvotes_a_byzantine_worker_shm) {
    robust("shm", "median");
}
Test(ps, krum_leaves_out_a_nan_push_and_outvotes_a_byzantine_worker_tcp) {
    robust("tcp", "krum:f=1");
}

/* A plugin aggregator (terse_plugin.h) over real processes: registered
 * before the ranks fork, named in the config like a built-in. */
static terse_status min_aggregate(const char *options, const float *const *in, size_t k,
                                  size_t n, float *out, float *center, void *user) {
    (void)options, (void)center, (void)user;
    for (size_t i = 0; i < n; i++) {
        out[i] = in[0][i];
        for (size_t j = 1; j < k; j++) out[i] = fminf(out[i], in[j][i]);
    }
    return TERSE_OK;
}

Test(ps, a_plugin_aggregator_serves_real_workers_tcp) {
    terse_ps_aggregator_ops ops = TERSE_PS_AGGREGATOR_OPS_INIT;
    ops.name = "minof";
    ops.aggregate = min_aggregate;
    cr_assert_eq(terse_ps_register_aggregator(&ops), TERSE_OK, "%s", terse_last_error());
    tr_job job = {"tcp", 4, 20000, 60, -1};
    tr_out *o = tr_run(&job, robust_body, "minof");
    /* robust_body with 3 workers (ranks 1-3): all honest */
    const int last = RSTEPS - 1;
    cr_assert_eq(o[1].u[10 + last], TERSE_OK, "%s", o[1].err);
    for (size_t i = 0; i < RN; i++) {
        float want = fminf(fminf(robust_push(1, last, i), robust_push(2, last, i)),
                           robust_push(3, last, i));
        cr_assert_eq(o[1].f[i], want, "element %zu", i);
    }
    tr_release(o);
}

static int cannot_hold_body(terse_comm *c, tr_out *o, const void *arg) {
    const char *const *spec = arg;
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.aggregator = spec[0];
    TR_CALL(o, terse_ps_config_parse(spec[1], &cfg));
    if (!strcmp(spec[1], "async")) cfg.update = TERSE_PS_UPDATE_SGD;
    terse_ps *ps = NULL;
    o->u[0] = (uint64_t)terse_ps_create(c, &cfg, &ps);
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    terse_ps_free(ps);
    return 0;
}

Test(ps, an_aggregator_that_cannot_hold_is_refused_on_every_rank) {
    static const char *const cases[][3] = {
        {"krum:f=1", "sync", "n >= 2f+3 = 5"},
        {"trimmed_mean:b=1", "sync:quorum=2", "(counting the quorum's pushes)"},
        {"median", "async", "needs sync mode"},
        {"krum:q=1", "sync", "unknown option \"q\""},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        tr_job job = {"shm", 4, 20000, 60, -1};
        tr_out *o = tr_run(&job, cannot_hold_body, cases[k]);
        for (int r = 0; r < 4; r++) {
            cr_assert_eq(o[r].u[0], TERSE_ERR_INVALID, "%s, rank %d", cases[k][0], r);
            cr_assert(strstr(o[r].err, cases[k][2]), "rank %d: %s", r, o[r].err);
        }
        tr_release(o);
    }
}

Test(ps, mode_specs_parse_strictly) {
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cr_assert_eq(terse_ps_config_parse("ssp:2", &cfg), TERSE_OK);
    cr_assert_eq(cfg.mode, TERSE_PS_SSP);
    cr_assert_eq(cfg.staleness, 2);
    cr_assert_eq(terse_ps_config_parse("sync:quorum=3", &cfg), TERSE_OK);
    cr_assert_eq(cfg.quorum, 3);
    cr_assert_eq(terse_ps_config_parse("async:max_staleness=4,lr_scale=1", &cfg), TERSE_OK);
    cr_assert_eq(cfg.max_staleness, 4);
    cr_assert_eq(cfg.lr_scale, 1);
    static const char *bad[] = {"ssp", "ssp:x", "sync:quorum=0", "sync:quorum=2x", "async:foo=1",
                                "bsp", "sync:max_staleness=1", "async:lr_scale=2", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(terse_ps_config_parse(bad[i], &cfg), TERSE_ERR_INVALID, "\"%s\"", bad[i]);
        cr_assert_neq(terse_last_error()[0], 0);
    }
}

/* A worker whose transport the shm watchdog gave up on (a lock the rescue
 * could not release): TIMEOUT, the known limitation, reported. */
static int shm_lock_spun(const tr_out *o, int w) {
    if (o->status != TERSE_ERR_TIMEOUT || !strstr(o->err, TR_SHM_LOCK_SPIN)) return 0;
    fprintf(stderr, "WARNING: KNOWN LIMITATION: worker %d: %s\n", w, o->err);
    return 1;
}

/* The same over shm, where a peer SIGKILLed mid-call can leave a region
 * lock taken (docs/collectives.md): the lock is released and the loss
 * reported as one, or the watchdog gives up (TIMEOUT); never a hang. */
Test(ps, sync_worker_killed_shm) {
    kill_job k = {"sync", 1, 3, 3, 5};
    tr_job job = {"shm", 4, 5000, 30, 3};
    tr_out *o = tr_run(&job, kill_body_soft, &k);
    for (int w = 1; w <= 2; w++) {
        if (shm_lock_spun(&o[w], w)) continue;
        cr_assert_eq(o[w].status, TERSE_ERR_PEER_LOST, "worker %d: %s", w, o[w].err);
        cr_assert(strstr(o[w].err, "worker rank 3 was lost"), "worker %d: %s", w, o[w].err);
    }
    tr_release(o);
}

Test(ps, server_killed_shm) {
    kill_job k = {"sync", 2, 2, 1, 400};
    tr_job job = {"shm", 4, 5000, 30, 1};
    tr_out *o = tr_run(&job, kill_body_soft, &k);
    for (int w = 2; w <= 3; w++) {
        if (shm_lock_spun(&o[w], w)) continue;
        cr_assert(o[w].status == TERSE_ERR_PEER_LOST, "worker %d: %s", w, o[w].err);
        cr_assert_lt(o[w].val[0], 5000.0, "took %.0f ms", o[w].val[0]);
        cr_assert(strstr(o[w].err, "rank 1"), "worker %d does not name server rank 1: %s", w,
                  o[w].err);
    }
    tr_release(o);
}

/* A header that announces a payload of several transport chunks, followed
 * by a short one (over shm, where no MAC drops it first): the server
 * refuses it, cancels the receive's other chunks before it reuses the
 * buffer, and serves on. */
#define SN (600 * 1024)
static int short_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    terse_ps *ps = NULL;
    TR_CALL(o, terse_ps_create(c, &cfg, &ps));
    TR_CALL(o, terse_ps_declare(ps, 0, SN, NULL, NULL, NULL));
    if (terse_ps_is_server(ps)) {
        TR_CALL(o, terse_ps_serve(ps));
        terse_ps_free(ps);
        return 0;
    }
    static float x[SN];
    static uint8_t junk[256];
    for (int round = 0; round < 3; round++) {
        terse__ps_key *k = ps->keys[0];
        terse__ps_hdr h = {TERSE__PS_PUSH, 0, ps->clock, k->srv_push_bound[0], 0,
                           k->srv_floats[0], k->decl_hash, 1.0f, 0};
        terse__ps_rep rep_;
        memset(&rep_, 0, sizeof rep_);
        TR_CALL(o, terse__ps_test_raw(ps, 0, &h, junk, sizeof junk, &rep_));
        o->u[round] = (uint64_t)rep_.status;
    }
    for (size_t i = 0; i < SN; i++) x[i] = grad(1, 0, 0, i);
    TR_CALL(o, terse_ps_pushpull(ps, 0, x, NULL));
    for (size_t i = 0; i < SN; i++)
        if (x[i] != grad(1, 0, 0, i)) {
            snprintf(o->err, sizeof o->err, "element %zu: %g", i, (double)x[i]);
            o->status = 1;
            return 1;
        }
    TR_CALL(o, terse_ps_finish(ps));
    terse_ps_free(ps);
    return 0;
}

Test(ps, a_short_payload_is_refused_and_its_receive_cancelled_shm) {
    tr_job job = {"shm", 2, 20000, 60, -1};
    tr_out *o = tr_run(&job, short_body, NULL);
    for (int r = 0; r < 3; r++)
        cr_assert_eq(o[1].u[r], TERSE_ERR_CORRUPT, "round %d: %s", r,
                     terse_status_name((terse_status)o[1].u[r]));
    tr_release(o);
}

/* Sync: a worker that pushes a step and finishes without pulling still
 * counts for that step, and the step waits for the others. */
static int finish_early_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    terse_ps *ps = NULL;
    TR_CALL(o, terse_ps_create(c, &cfg, &ps));
    TR_CALL(o, terse_ps_declare(ps, 0, QN, NULL, NULL, NULL));
    int rank = terse_comm_rank(c);
    if (terse_ps_is_server(ps)) {
        TR_CALL(o, terse_ps_serve(ps));
        terse_ps_free(ps);
        return 0;
    }
    float buf[QN];
    for (size_t i = 0; i < QN; i++) buf[i] = grad(rank, 0, 0, i);
    if (rank == 3) usleep(600000);
    if (rank == 1) {
        TR_CALL(o, terse_ps_push(ps, 0, buf, NULL));
    } else {
        TR_CALL(o, terse_ps_pushpull(ps, 0, buf, NULL));
        for (size_t i = 0; i < QN; i++) o->f[i] = buf[i];
    }
    TR_CALL(o, terse_ps_finish(ps));
    terse_ps_free(ps);
    return 0;
}

Test(ps, sync_counts_a_push_from_a_worker_that_finished) {
    tr_job job = {"tcp", 4, 20000, 60, -1};
    tr_out *o = tr_run(&job, finish_early_body, NULL);
    for (size_t i = 0; i < QN; i++) {
        double ref = (grad(1, 0, 0, i) + grad(2, 0, 0, i) + grad(3, 0, 0, i)) / 3.0;
        cr_assert(fabs(o[2].f[i] - ref) < 1e-6, "element %zu: %g vs %g", i, (double)o[2].f[i], ref);
        cr_assert_eq(o[2].f[i], o[3].f[i]);
    }
    tr_release(o);
}

/* Sync: a worker SIGSTOPped before its push holds the step open; the
 * other's pull fails with TERSE_ERR_TIMEOUT naming it (at 3/4 of the
 * timeout), and its communicator stays usable. It then kills the stopped
 * one, and the server ends naming it lost. */
static int stopped_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    tr_out *all = o - terse_comm_rank(c); /* ranks.h's outputs are one shared array */
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    terse_ps *ps = NULL;
    TR_CALL(o, terse_ps_create(c, &cfg, &ps));
    say_ready(o);
    TR_CALL(o, terse_ps_declare(ps, 0, QN, NULL, NULL, NULL));
    int rank = terse_comm_rank(c);
    if (terse_ps_is_server(ps)) {
        o->u[5] = (uint64_t)terse_ps_serve(ps);
        snprintf(o->err, sizeof o->err, "%s", terse_last_error());
        terse_ps_free(ps);
        return 0;
    }
    float buf[QN];
    for (size_t i = 0; i < QN; i++) buf[i] = grad(rank, 0, 0, i);
    if (rank == 2) {
        wait_all_ready(c, o); /* a stop inside another's create would time it out */
        all[2].u[9] = (uint64_t)getpid();
        __atomic_store_n(&all[2].u[8], 1, __ATOMIC_RELEASE);
        raise(SIGSTOP);
    }
    while (!__atomic_load_n(&all[2].u[8], __ATOMIC_ACQUIRE)) usleep(1000);
    double t0 = tr_now_ms();
    terse_status s = terse_ps_pushpull(ps, 0, buf, NULL);
    o->val[0] = tr_now_ms() - t0;
    o->u[0] = (uint64_t)s;
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    kill((pid_t)all[2].u[9], SIGKILL);
    o->u[1] = (uint64_t)terse_ps_finish(ps); /* still usable: a refusal fails one request */
    terse_ps_free(ps);
    return 0;
}

Test(ps, sync_stopped_worker_times_out_the_others_naming_it) {
    tr_job job = {"tcp", 3, 4000, 60, 2};
    tr_out *o = tr_run(&job, stopped_body, NULL);
    cr_assert_eq(o[1].u[0], TERSE_ERR_TIMEOUT, "worker 1: %s", o[1].err);
    cr_assert(strstr(o[1].err, "worker ranks 2"), "does not name the stopped worker: %s", o[1].err);
    cr_assert_lt(o[1].val[0], 4000.0, "took %.0f ms, beyond the timeout", o[1].val[0]);
    cr_assert_eq(o[1].u[1], TERSE_OK, "finish after the timeout: %s", o[1].err);
    cr_assert_eq(o[0].u[5], TERSE_ERR_PEER_LOST, "serve: %s", o[0].err);
    tr_release(o);
}

/* ---------------------------------------------------------------- replicas */

/* 2 servers, 3 workers, sync SGD with momentum; key 0 dense across both
 * servers, key 1 pushed through int8 with error feedback. Server rank 1
 * (the head of slot 1) may be SIGKILLed once it closed kill_at shard steps. */
#define FN 3000
#define FN1 600
#define FSTEPS 30

typedef struct fail_job {
    int replicas;
    int kill_at; /* SIGKILL server rank 1 once it closed this many shard steps (0: never) */
    int worker_dies; /* SIGKILL worker rank 4 at this step (0: never) */
    const char *mode;  /* NULL: sync */
    int nap_us;        /* workers' pause between steps (0: 4 ms) */
    int servers;       /* 0: 2 */
    int victim;        /* the server kill_at kills (0: rank 1) */
    int second;        /* a server SIGKILLed once its replica's replacement caught up and
                          acknowledged 3 more steps (0: none) */
    int third;         /* a server SIGKILLed as soon as it took a slot over (0: none) */
} fail_job;

static float fgrad(int w, int t, size_t i) {
    return sinf((float)(w * 131 + t * 17) * 0.37f + (float)i * 0.011f) * (float)(1 + w);
}

static void *die_at(void *arg) {
    tr_out *o = arg;
    const volatile uint64_t *closed = (const volatile uint64_t *)(uintptr_t)o->u[41];
    while (*closed < o->u[40]) usleep(100); /* the server's own count, read racily: a moment */
    o->val[0] = tr_now_ms(); /* the moment of death, for the recovery time */
    raise(SIGKILL);
    return NULL;
}

static int failover_body(terse_comm *c, tr_out *o, const void *arg);

/* A replacement: when its head instance got its slot back (val[3]). */
static void *watch_caught_up(void *arg) {
    tr_out *o = arg;
    const volatile uint64_t *psp = &o->u[42];
    while (!*psp) usleep(100);
    const volatile int *awaiting = &((terse_ps *)(uintptr_t)*psp)->awaiting;
    const volatile uint64_t *served = &o->u[43]; /* terse_ps_serve returned */
    while (*awaiting && !*served) usleep(50);
    o->val[3] = tr_now_ms();
    return NULL;
}

/* fail_job.third: die as soon as this server took its mirror's slot over. */
static void *die_on_takeover(void *arg) {
    terse_ps *ps = arg;
    while (!ps->mirror || !*(const volatile int *)&ps->mirror->promoted) usleep(100);
    raise(SIGKILL);
    return NULL;
}

/* fail_job.second: die once this head's replica is a caught-up replacement. */
static void *die_after_catch_up(void *arg) {
    terse_ps *ps = arg;
    const volatile int *fresh = &ps->backup_fresh;
    const volatile uint64_t *acked = &ps->stats.replicated;
    while (!*fresh) usleep(200);
    uint64_t from = *acked;
    while (*acked < from + 3 + (uint64_t)ps->nkeys) usleep(200);
    raise(SIGKILL);
    return NULL;
}

/* Failures go into o only (the trials sort them). */
static int failover_body_soft(terse_comm *c, tr_out *o, const void *arg) {
    failover_body(c, o, arg);
    return 0;
}

static int failover_body(terse_comm *c, tr_out *o, const void *arg) {
    const fail_job *j = arg;
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.num_servers = j->servers ? j->servers : 2;
    cfg.update = TERSE_PS_UPDATE_SGD;
    cfg.lr = 0.05f;
    cfg.momentum = 0.9f;
    cfg.chunk_bytes = 4096;
    if (j->mode) TR_CALL(o, terse_ps_config_parse(j->mode, &cfg));
    cfg.replicas = j->replicas;
    terse_ps *ps = NULL;
    TR_CALL(o, terse_ps_create(c, &cfg, &ps));
    TR_CALL(o, terse_ps_declare(ps, 0, FN, NULL, NULL, NULL));
    TR_CALL(o, terse_ps_declare(ps, 1, FN1, "int8:ef=1", NULL, NULL));
    int rank = terse_comm_rank(c);
    if (terse_ps_is_server(ps)) {
        pthread_t watch;
        int watching = getenv("TR_REPLACEMENT") != NULL;
        o->val[2] = tr_now_ms(); /* a replacement: joined */
        if (watching) pthread_create(&watch, NULL, watch_caught_up, (void *)o);
        o->u[42] = (uint64_t)(uintptr_t)ps;
        if (j->third && rank == j->third) {
            pthread_t t;
            pthread_create(&t, NULL, die_on_takeover, ps);
        }
        if (j->second && rank == j->second && !getenv("TR_REPLACEMENT")) {
            pthread_t t;
            pthread_create(&t, NULL, die_after_catch_up, ps);
        }
        if (rank == (j->victim ? j->victim : 1) && j->kill_at && !getenv("TR_REPLACEMENT")) {
            pthread_t t;
            o->u[40] = (uint64_t)j->kill_at;
            o->u[41] = (uint64_t)(uintptr_t)&ps->stats.steps_closed;
            pthread_create(&t, NULL, die_at, o);
        }
        terse_status s = terse_ps_serve(ps);
        o->u[43] = 1;
        if (watching) pthread_join(watch, NULL);
        o->u[5] = (uint64_t)s;
        snprintf(o->err, sizeof o->err, "%s", terse_last_error());
        if (s != TERSE_OK) fprintf(stderr, "server rank %d: %s\n", rank, o->err);
        terse_ps_stats st = ps_stats_of(ps);
        o->u[0] = st.replicated, o->u[1] = st.takeovers, o->u[2] = st.duplicates;
        o->u[3] = st.steps_closed;
        o->val[1] = tr_now_ms(); /* serving ended */
        /* TR_HOLD_STORE: rank 0 keeps the bootstrap store up until the
         * replacement has served (20 s at most), so that a job which fails
         * fast cannot leave before the replacement joins */
        if (getenv("TR_REPLACEMENT") && getenv("TR_HOLD_STORE"))
            (void)terse__store_set(c->store, "replacement/done", "1", 2);
        for (int i = 0; getenv("TR_HOLD_STORE") && rank == 0 && !watching && i < 2000; i++) {
            char v[4];
            size_t len = sizeof v;
            if (terse__store_get(c->store, "replacement/done", v, &len, 10) == TERSE_OK) break;
            usleep(10000);
        }
        terse_ps_free(ps);
        return 0;
    }
    static float x[FN], y[FN1];
    for (int t = 0; t < FSTEPS; t++) {
        if (rank == 4 && j->worker_dies && t == j->worker_dies) raise(SIGKILL);
        for (size_t i = 0; i < FN; i++) x[i] = fgrad(rank, t, i);
        for (size_t i = 0; i < FN1; i++) y[i] = fgrad(rank, t, i + FN);
        /* With a deadline the two servers of key 0 close its steps on their
         * own clocks, so a push can be late on one and ahead on the other:
         * a refusal there (STALE, INVALID) only means pull and go on. */
        const int refusals_ok = j->mode != NULL;
        terse_status s = terse_ps_pushpull(ps, 0, x, NULL);
        if (refusals_ok && (s == TERSE_ERR_STALE || s == TERSE_ERR_INVALID))
            s = terse_ps_pull(ps, 0, x, NULL);
        if (s == TERSE_OK) s = terse_ps_push(ps, 1, y, NULL);
        if (refusals_ok && (s == TERSE_ERR_STALE || s == TERSE_ERR_INVALID)) s = TERSE_OK;
        if (s == TERSE_OK) s = terse_ps_pull(ps, 1, y, NULL);
        if (s != TERSE_OK) {
            tr_fail(o, s, "step");
            terse_ps_free(ps); /* says goodbye to the servers */
            return 1;
        }
        o->val[10 + t] = tr_now_ms(); /* this step complete */
        TR_CALL(o, terse_ps_clock(ps));
        usleep(j->nap_us ? (useconds_t)j->nap_us : 4000);
    }
    memcpy(o->f, x, sizeof x);
    memcpy(o->f + FN, y, sizeof y);
    o->hash[0] = tr_hash(o->f, (FN + FN1) * sizeof(float));
    double f0 = tr_now_ms();
    TR_CALL(o, terse_ps_finish(ps));
    o->val[9] = tr_now_ms() - f0; /* the goodbyes */
    terse_ps_free(ps);
    return 0;
}

/* The same training, replicated or not, gives the same bits; every step a
 * head closes is acknowledged by its replica first. */
Test(ps, replicas_keep_each_closed_step_on_both_servers_and_change_no_bits) {
    fail_job one = {1, 0, 0, NULL, 0, 0, 0, 0, 0}, two = {2, 0, 0, NULL, 0, 0, 0, 0, 0};
    tr_job job = {"shm", 5, 20000, 60, -1};
    tr_out *a = tr_run(&job, failover_body, &one);
    tr_out *b = tr_run(&job, failover_body, &two);
    for (int w = 2; w < 5; w++) {
        cr_assert_eq(b[w].status, 0, "worker %d: %s", w, b[w].err);
        cr_assert_eq(a[w].hash[0], b[w].hash[0], "worker %d: replicas changed the result", w);
        cr_assert_eq(b[w].hash[0], b[2].hash[0], "workers differ");
    }
    for (int s = 0; s < 2; s++) {
        cr_assert_eq(a[s].u[0], 0, "replicated without replicas");
        cr_assert_geq(b[s].u[3], FSTEPS, "server %d closed %llu steps", s,
                      (unsigned long long)b[s].u[3]);
        cr_assert_eq(b[s].u[0], b[s].u[3], "server %d: %llu steps closed, %llu acknowledged", s,
                     (unsigned long long)b[s].u[3], (unsigned long long)b[s].u[0]);
    }
    tr_release(a);
    tr_release(b);
}

static int cmp_d(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* A kill trial on shm in which a survivor spun on the dead process's
 * shared-region lock (libfabric's, not terse's to fix: the watchdog fails
 * it with TIMEOUT, never wrong data): reported as the known limitation, and
 * 1 so the caller skips the trial. dead: the killed ranks (-1: none). */
static int lost_to_shm_lock(const char *prov, const tr_out *o, int nprocs, int dead1, int dead2,
                            int kill_at) {
    int spun = 0;
    for (int q = 0; q < nprocs; q++)
        spun |= q != dead1 && q != dead2 &&
                (!o[q].finished || strstr(o[q].err, TR_SHM_LOCK_SPIN) != NULL);
    if (strcmp(prov, "shm") != 0 || !spun) return 0;
    fprintf(stderr, "WARNING: KNOWN LIMITATION: kill after %d steps: a survivor spun on a dead "
                    "server's shm region lock until the watchdog gave up\n",
            kill_at);
    return 1;
}

/* SIGKILL the head of slot 1 at several moments of a run with replicas 2
 * (after k of its shard steps, k spread over the run): every worker
 * finishes, and with the same bits as the run nobody died in.
 * TERSE_FAILOVER_TRIALS sets the moments (2 here; the campaign runs 10);
 * prints the recovery time, kill to the next step a worker completed. */
static void failover(const char *prov) {
    fail_job ref = {2, 0, 0, NULL, 0, 0, 0, 0, 0};
    tr_job job = {prov, 5, 20000, 90, -1};
    tr_out *r = tr_run(&job, failover_body, &ref);
    cr_assert_eq(r[2].status, 0, "%s", r[2].err);
    uint64_t want = r[2].hash[0], steps = r[1].u[3]; /* server 1's shard steps in a whole run */
    tr_release(r);
    const char *env = getenv("TERSE_FAILOVER_TRIALS");
    int trials = env ? atoi(env) : 2;
    if (trials < 1 || trials > 100) trials = 2;
    double rec[100];
    int n = 0;
    if (!strcmp(prov, "tcp")) tr_known_segv = TR_RXM_TEARDOWN_SEGV;
    int spins = 0;
    uint64_t dups = 0; /* resends the new head already had: answered, not applied again */
    for (int k = 0; k < trials; k++) {
        /* from the first steps to the last ones */
        fail_job j = {2, 1 + (int)((double)(steps - 3) * (k + 0.5) / trials), 0, NULL, 0,
                      0, 0, 0, 0};
        tr_job kj = {prov, 5, 20000, 90, 1};
        tr_out *o = tr_run(&kj, failover_body_soft, &j);
        if (lost_to_shm_lock(prov, o, 5, 1, -1, j.kill_at)) {
            spins++;
            tr_release(o);
            continue;
        }
        double best = -1;
        if (o[0].finished)
            cr_assert_eq(o[0].u[5], TERSE_OK, "kill after %d steps, server 0: %s", j.kill_at,
                         o[0].err);
        for (int w = 2; w < 5; w++) {
            if (!o[w].finished) continue; /* rxm's teardown crash, reported */
            cr_assert_eq(o[w].status, 0, "kill after %d steps, worker %d: %s", j.kill_at, w,
                         o[w].err);
            cr_assert_eq(o[w].hash[0], want, "kill after %d steps: worker %d's parameters differ",
                         j.kill_at, w);
            for (int t = 0; t < FSTEPS; t++)
                if (o[w].val[10 + t] > o[1].val[0]) {
                    double d = o[w].val[10 + t] - o[1].val[0];
                    if (best < 0 || d < best) best = d;
                    break;
                }
        }
        if (o[0].finished) dups += o[0].u[2];
        if (o[0].finished) {
            cr_assert_eq(o[0].u[5], TERSE_OK, "server 0: %s", o[0].err);
            if (best >= 0) cr_assert_eq(o[0].u[1], 1, "server 0 took over %llu slots",
                                        (unsigned long long)o[0].u[1]);
        }
        if (best >= 0) rec[n++] = best;
        tr_release(o);
    }
    tr_known_segv = NULL;
    if (n) {
        qsort(rec, (size_t)n, sizeof rec[0], cmp_d);
        fprintf(stderr, "failover %s: %d kills, %d bitwise equal (%d lost to shm's lock); "
                        "recovery (kill to the next step completed, in %d of them) min %.1f ms, "
                        "median %.1f ms, max %.1f ms; %llu resent pushes were duplicates\n",
                prov, trials, trials - spins, spins, n, rec[0], rec[n / 2], rec[n - 1],
                (unsigned long long)dups);
    }
    cr_assert_lt(spins, trials, "%s: no kill trial completed (all lost to shm's lock)", prov);
}

Test(ps, a_killed_head_is_replaced_by_its_replica_with_the_same_bits_tcp) { failover("tcp"); }
Test(ps, a_killed_head_is_replaced_by_its_replica_with_the_same_bits_shm) { failover("shm"); }

/* A killed head's replacement (a new process, rejoin = 1) gets both its
 * slots back: slot 1 from server 0, which stood in, and its replica's place
 * for slot 0. The workers move back, and the result is bit for bit the run
 * nobody died in. Then the replacement itself is killed... no: it serves
 * to the end, closes steps and replicates them to server 0. */
static void replacement(const char *prov) {
    fail_job ref = {2, 0, 0, NULL, 12000, 0, 0, 0, 0};
    tr_job job = {prov, 5, 20000, 90, -1};
    tr_out *r = tr_run(&job, failover_body, &ref);
    cr_assert_eq(r[2].status, 0, "%s", r[2].err);
    uint64_t want = r[2].hash[0];
    tr_release(r);
    const char *env = getenv("TERSE_REPLACE_TRIALS");
    int trials = env ? atoi(env) : 1;
    if (trials < 1 || trials > 50) trials = 1;
    double join[50], back[50], total[50];
    int n = 0, spins = 0;
    /* a trial lost to shm's lock is run again (3 times at most) */
    for (int k = 0; n < trials && k < trials + 3; k++) {
        if (!strcmp(prov, "tcp")) tr_known_segv = TR_RXM_TEARDOWN_SEGV;
        /* 40 ms between steps: the replacement (a new process, 0.1-0.5 s to
         * join) arrives mid-run even on a loaded machine */
        fail_job j = {2, 2 + k % 6, 0, NULL, 40000, 0, 0, 0, 0};
        tr_job kj = {prov, 5, 20000, 60, 1};
        tr_replace_victim = 1;
        tr_out *o = tr_run(&kj, failover_body_soft, &j);
        tr_replace_victim = 0;
        tr_known_segv = NULL;
        if (lost_to_shm_lock(prov, o, 6, 1, -1, j.kill_at)) {
            spins++;
            tr_release(o);
            continue;
        }
        for (int w = 2; w < 5; w++) {
            if (!o[w].finished) continue; /* rxm's teardown crash, reported */
            cr_assert_eq(o[w].status, 0, "kill after %d: worker %d: %s", j.kill_at, w, o[w].err);
            cr_assert_eq(o[w].hash[0], want, "kill after %d: worker %d's parameters differ "
                                             "from the run without the kill", j.kill_at, w);
        }
        tr_out *rp = &o[5]; /* the replacement */
        cr_assert(rp->finished, "the replacement did not finish: %s", rp->err);
        cr_assert_eq(rp->u[5], TERSE_OK, "the replacement's serve: %s", rp->err);
        cr_assert_gt(rp->u[3], 0, "the replacement closed no step (it never got its slot back)");
        cr_assert_eq(rp->u[0], rp->u[3], "the replacement closed %llu steps, its replica "
                                         "acknowledged %llu", (unsigned long long)rp->u[3],
                     (unsigned long long)rp->u[0]);
        cr_assert_eq(o[0].u[5], TERSE_OK, "server 0: %s", o[0].err);
        join[n] = rp->val[2] - o[1].val[0];
        back[n] = rp->val[3] - rp->val[2];
        total[n++] = rp->val[3] - o[1].val[0];
        tr_release(o);
    }
    cr_assert_gt(n, 0, "%s: no replacement trial completed (%d lost to shm's lock)", prov, spins);
    qsort(join, (size_t)n, sizeof join[0], cmp_d);
    qsort(back, (size_t)n, sizeof back[0], cmp_d);
    qsort(total, (size_t)n, sizeof total[0], cmp_d);
    fprintf(stderr, "replacement %s: %d kills, %d bitwise equal (%d lost to shm's lock); kill to the replacement "
                    "joined (its process started by the test): min %.1f / median %.1f / max "
                    "%.1f ms; joined to slot back: %.1f / %.1f / %.1f ms; kill to slot back: "
                    "%.1f / %.1f / %.1f ms\n",
            prov, n + spins, n, spins, join[0], join[n / 2], join[n - 1], back[0], back[n / 2],
            back[n - 1], total[0], total[n / 2], total[n - 1]);
}

/* Three servers. Server 2 dies (the head of slot 2, the replica of slot
 * 1); its replacement takes slot 2 back from server 0 and catches up as
 * slot 1's replica; then (second) server 1 dies, and the replacement takes
 * slot 1 over too. Same bits as the run nobody died in. Without the second
 * death, the end of serving is the test: server 1's last roster to the
 * replacement races the workers' goodbyes to it (which once hung them). */
static void three_servers(const char *prov, int second) {
    fail_job ref = {2, 0, 0, NULL, 15000, 3, 0, 0, 0};
    tr_job job = {prov, 6, 20000, 90, -1};
    tr_out *r = tr_run(&job, failover_body, &ref);
    cr_assert_eq(r[3].status, 0, "%s", r[3].err);
    uint64_t want = r[3].hash[0];
    tr_release(r);
    if (!strcmp(prov, "tcp")) tr_known_segv = TR_RXM_TEARDOWN_SEGV;
    fail_job j = {2, 3, 0, NULL, 40000, 3, 2, second ? 1 : 0, 0};
    tr_job kj = {prov, 6, 20000, 60, 2};
    tr_replace_victim = 1;
    tr_victim2 = second ? 1 : 0;
    tr_out *o = tr_run(&kj, failover_body_soft, &j);
    tr_replace_victim = 0;
    tr_victim2 = 0;
    tr_known_segv = NULL;
    if (lost_to_shm_lock(prov, o, 7, second ? 1 : -1, 2, j.kill_at)) {
        tr_release(o);
        return;
    }
    for (int w = 3; w < 6; w++) {
        if (!o[w].finished) continue; /* rxm's teardown crash, reported */
        cr_assert_eq(o[w].status, 0, "worker %d: %s", w, o[w].err);
        cr_assert_eq(o[w].hash[0], want, "worker %d's parameters differ from the run without "
                                         "the kills", w);
    }
    tr_out *rp = &o[6];
    cr_assert(rp->finished, "the replacement did not finish: %s", rp->err);
    cr_assert_eq(rp->u[5], TERSE_OK, "the replacement's serve: %s", rp->err);
    cr_assert_eq(rp->u[1], (uint64_t)second, "the replacement took %llu slots over",
                 (unsigned long long)rp->u[1]);
    for (int w = 3; w < 6 && !second; w++) /* nobody waits for a goodbye's answer */
        cr_assert_lt(o[w].val[9], 1500.0, "worker %d's terse_ps_finish took %.0f ms", w,
                     o[w].val[9]);
    cr_assert_eq(o[0].u[5], TERSE_OK, "server 0: %s", o[0].err);
    tr_release(o);
}

Test(ps, a_replacement_catches_up_as_a_replica_and_takes_over_when_its_head_dies_tcp) {
    three_servers("tcp", 1);
}
Test(ps, a_replacement_catches_up_as_a_replica_and_takes_over_when_its_head_dies_shm) {
    three_servers("shm", 1);
}
Test(ps, a_replacement_replica_ends_serving_with_everyone_else_tcp) { three_servers("tcp", 0); }

/* Three servers: server 1 dies, server 2 takes slot 1 over and dies too;
 * then server 1's replacement joins. Slot 1 is lost: the replacement ends
 * at once with TERSE_ERR_PEER_LOST saying so (it does not wait for a slot
 * that cannot come back), and the workers fail naming the slot. */
Test(ps, a_replacement_whose_slot_died_with_its_stand_in_says_so_at_once) {
    fail_job j = {2, 3, 0, NULL, 40000, 3, 1, 0, 2};
    tr_job kj = {"tcp", 6, 20000, 60, 1};
    tr_known_segv = TR_RXM_TEARDOWN_SEGV;
    tr_replace_victim = 1;
    tr_victim2 = 2;
    /* over net the job fails fast enough that rank 0, the store, was seen
     * to leave before the replacement joined (fresh-clone CI, 2026-12-03) */
    setenv("TR_HOLD_STORE", "1", 1);
    tr_out *o = tr_run(&kj, failover_body_soft, &j);
    unsetenv("TR_HOLD_STORE");
    tr_replace_victim = 0;
    tr_victim2 = 0;
    tr_known_segv = NULL;
    tr_out *rp = &o[6];
    cr_assert(rp->finished, "the replacement did not finish: %s", rp->err);
    cr_assert_eq(rp->u[5], TERSE_ERR_PEER_LOST, "the replacement's serve: %s", rp->err);
    cr_assert(strstr(rp->err, "slot 1 is lost: server rank 2, which stood in for it, died before "
                              "handing it back"), "%s", rp->err);
    cr_assert_lt(rp->val[1] - rp->val[2], 5000.0, "the replacement took %.0f ms to give up",
                 rp->val[1] - rp->val[2]);
    /* The first worker to fail names the slot; the others may fail first
     * on its loss (sync mode without a quorum cannot go on without it). */
    int named = 0, seen = 0;
    for (int w = 3; w < 6; w++) {
        if (!o[w].finished) continue; /* rxm's teardown crash, reported */
        seen++;
        cr_assert_eq(o[w].status, TERSE_ERR_PEER_LOST, "worker %d: %s", w, o[w].err);
        named += strstr(o[w].err, "slot 1") != NULL;
    }
    cr_assert(!seen || named, "no worker names slot 1 (%s)", o[3].err);
    tr_release(o);
}

/* A replacement can only serve a parameter server with replicas 2: its
 * collectives and a worker's terse_ps_create are refused with a sentence.
 * Rank 2 dies after init; rank 0 (the store) waits for the replacement to
 * say it is done. */
static int rejoin_refusals_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    int rank = terse_comm_rank(c);
    if (getenv("TR_REPLACEMENT")) {
        float x[4] = {1, 2, 3, 4};
        o->u[0] = (uint64_t)terse_allreduce(c, x, 4, NULL, TERSE_OP_SUM);
        snprintf(o->err, sizeof o->err, "%s", terse_last_error());
        terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
        cfg.num_servers = 1;
        terse_ps *ps = NULL;
        o->u[1] = (uint64_t)terse_ps_create(c, &cfg, &ps);
        snprintf((char *)o->f, 512, "%s", terse_last_error());
        TR_CALL(o, terse__store_set(c->store, "replacement/done", "1", 2));
        return 0;
    }
    /* rank 2 dies once the others' terse_comm_init returned (a rank 1
     * whose init failed would exit without a goodbye, lost for good) */
    say_ready(o);
    if (rank == 2) {
        wait_all_ready(c, o);
        raise(SIGKILL);
    }
    if (rank == 1) return 0;
    for (int i = 0; i < 2000; i++) { /* 20 s at most */
        const uint8_t *lost = NULL;
        (void)terse__store_poll_lost(c->store, &lost);
        char v[4];
        size_t len = sizeof v;
        if (terse__store_get(c->store, "replacement/done", v, &len, 10) == TERSE_OK) return 0;
        usleep(10000);
    }
    return tr_fail(o, TERSE_ERR_TIMEOUT, "waiting for the replacement");
}

Test(ps, a_replacement_serves_a_replicated_parameter_server_and_nothing_else) {
    tr_job job = {"tcp", 3, 20000, 60, 2};
    tr_replace_victim = 1;
    tr_out *o = tr_run(&job, rejoin_refusals_body, NULL);
    tr_replace_victim = 0;
    cr_assert_eq(o[3].status, 0, "%s", o[3].err);
    cr_expect_eq(o[3].u[0], TERSE_ERR_INVALID, "a replacement's allreduce: %s", o[3].err);
    cr_expect(strstr(o[3].err, "rejoined a running job as a lost rank's replacement"), "%s",
              o[3].err);
    cr_expect_eq(o[3].u[1], TERSE_ERR_INVALID, "a replacement worker's terse_ps_create: %s",
                 (const char *)o[3].f);
    cr_expect(strstr((const char *)o[3].f, "only a server of a parameter server with replicas 2"),
              "%s", (const char *)o[3].f);
    tr_release(o);
}

Test(ps, a_killed_heads_replacement_takes_its_slots_back_with_the_same_bits_tcp) {
    replacement("tcp");
}
Test(ps, a_killed_heads_replacement_takes_its_slots_back_with_the_same_bits_shm) {
    replacement("shm");
}

/* Steps that close on a short deadline while the workers are away (empty
 * steps, one after another): a head never starts replicating a step
 * before the last one is acknowledged, so every step it closed is
 * acknowledged and the replica never gets one it was not sent. */
Test(ps, replicas_with_a_deadline_replicate_every_step_in_order) {
    fail_job j = {2, 0, 0, "sync:deadline_ms=5", 30000, 0, 0, 0, 0};
    tr_job job = {"shm", 5, 20000, 60, -1};
    tr_out *o = tr_run(&job, failover_body, &j);
    for (int s = 0; s < 2; s++) {
        cr_assert_eq(o[s].u[5], TERSE_OK, "server %d: %s", s, o[s].err);
        cr_assert_gt(o[s].u[3], FSTEPS, "server %d: %llu steps closed, expected empty ones too",
                     s, (unsigned long long)o[s].u[3]);
        /* every step a worker pulled was acknowledged; one per key, closed
         * by its deadline after the last pull, may still be on its way when
         * serving ends (2 keys) */
        cr_assert(o[s].u[0] <= o[s].u[3] && o[s].u[3] - o[s].u[0] <= 2,
                  "server %d: %llu closed, %llu acknowledged", s, (unsigned long long)o[s].u[3],
                  (unsigned long long)o[s].u[0]);
    }
    tr_release(o);
}

/* A worker killed under replicas: both instances of every server learn
 * it, the surviving workers fail naming it (sync without a quorum), and
 * serving ends instead of waiting for the dead worker's goodbye. */
Test(ps, replicas_a_killed_worker_ends_serving_on_both_instances) {
    fail_job j = {2, 0, 5, NULL, 0, 0, 0, 0, 0};
    tr_job job = {"tcp", 5, 5000, 20, 4};
    tr_known_segv = TR_RXM_TEARDOWN_SEGV;
    tr_out *o = tr_run(&job, failover_body_soft, &j);
    tr_known_segv = NULL;
    for (int s = 0; s < 2; s++) {
        if (!o[s].finished) continue; /* rxm's teardown crash, reported */
        cr_assert_eq(o[s].u[5], TERSE_ERR_PEER_LOST, "server %d: %s", s, o[s].err);
        cr_assert(strstr(o[s].err, "worker rank 4 was lost"), "server %d: %s", s, o[s].err);
    }
    for (int w = 2; w < 4; w++) {
        if (!o[w].finished) continue;
        cr_assert_eq(o[w].status, TERSE_ERR_PEER_LOST, "worker %d: %s", w, o[w].err);
        cr_assert(strstr(o[w].err, "worker rank 4"), "worker %d: %s", w, o[w].err);
    }
    tr_release(o);
}

/* A replica that stops (SIGSTOP) is dropped by its head after half the
 * timeout and told so; if the head dies later, the stale replica does not
 * take over, and the worker's request fails naming the slot. Rank 2 (the
 * one worker) stops, resumes and kills the servers, whose pids the ranks
 * publish in the shared outputs. */
static int abandon_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    int rank = terse_comm_rank(c);
    o->u[50] = (uint64_t)getpid();
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.num_servers = 2;
    cfg.chunk_bytes = 4096;
    cfg.replicas = 2;
    terse_ps *ps = NULL;
    TR_CALL(o, terse_ps_create(c, &cfg, &ps));
    /* one chunk each, until one lands on server 1: key kk, whose head is
     * the victim (rank 0 hosts the store) */
    const int h = 1, r = 0;
    size_t kk = 0;
    for (size_t k = 0; k < 16; k++) {
        TR_CALL(o, terse_ps_declare(ps, k, 256, NULL, NULL, NULL));
        if (terse_ps_chunk_server(ps, k, 0) == h) {
            kk = k;
            break;
        }
    }
    if (terse_ps_chunk_server(ps, kk, 0) != h) return tr_fail(o, TERSE_ERR_INTERNAL, "placement");
    if (terse_ps_is_server(ps)) {
        o->u[5] = (uint64_t)terse_ps_serve(ps);
        snprintf(o->err, sizeof o->err, "%s", terse_last_error());
        terse_ps_free(ps);
        return 0;
    }
    const tr_out *all = o - rank;
    while (!all[0].u[50] || !all[1].u[50]) usleep(1000);
    float x[256];
    terse_status s = TERSE_OK;
    for (int t = 0; t < 5 && s == TERSE_OK; t++) {
        if (t == 2) kill((pid_t)all[r].u[50], SIGSTOP);
        if (t == 3) {
            kill((pid_t)all[r].u[50], SIGCONT);
            usleep(300000); /* it reads its head's message */
        }
        if (t == 4) {
            kill((pid_t)all[h].u[50], SIGKILL);
            usleep(300000); /* the store's notice */
        }
        for (int i = 0; i < 256; i++) x[i] = (float)(t + i);
        double t0 = tr_now_ms();
        s = terse_ps_pushpull(ps, kk, x, NULL); /* the other key, never pushed, stays at 0 */
        o->val[t] = tr_now_ms() - t0;
        o->u[10 + t] = (uint64_t)s;
        if (s == TERSE_OK) s = terse_ps_clock(ps);
    }
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    terse_ps_free(ps);
    return 0;
}

Test(ps, a_replica_its_head_gave_up_on_does_not_take_over) {
    const int h = 1;
    tr_job job = {"tcp", 3, 2000, 60, h};
    tr_known_segv = TR_RXM_TEARDOWN_SEGV;
    tr_out *o = tr_run(&job, abandon_body, NULL);
    tr_known_segv = NULL;
    cr_assert_eq(o[2].status, 0, "%s", o[2].err);
    for (int t = 0; t < 4; t++) cr_assert_eq(o[2].u[10 + t], TERSE_OK, "step %d: %s", t, o[2].err);
    cr_assert(o[2].val[2] >= 900, "the step with the replica stopped took %.0f ms: the head "
                                  "should have waited half the 2 s timeout for its ack",
              o[2].val[2]);
    cr_assert_eq(o[2].u[14], TERSE_ERR_PEER_LOST, "after the head's death: %s", o[2].err);
    char want[64];
    snprintf(want, sizeof want, "slot %d is lost", h);
    cr_assert(strstr(o[2].err, want), "%s", o[2].err);
    tr_release(o);
}

static int replica_refusals_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const char *specs[] = {"sync:replicas=3", "async:replicas=2", "sync:replicas=0"};
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    for (int i = 0; i < 3; i++) o->u[i] = (uint64_t)terse_ps_config_parse(specs[i], &cfg);
    cfg = (terse_ps_config)TERSE_PS_CONFIG_INIT;
    cfg.replicas = 3;
    terse_ps *ps = NULL;
    o->u[3] = (uint64_t)terse_ps_create(c, &cfg, &ps);
    cfg.replicas = 2; /* one server */
    o->u[4] = (uint64_t)terse_ps_create(c, &cfg, &ps);
    o->u[9] = strstr(terse_last_error(), "2 or more servers") != NULL;
    cfg.num_servers = 2;
    TR_CALL(o, terse_ps_create(c, &cfg, &ps));
    o->u[5] = (uint64_t)terse_ps_declare(ps, 0, 100, NULL, "int8:ef=1", NULL);
    TR_CALL(o, terse_ps_declare(ps, 0, 100, NULL, NULL, NULL));
    if (terse_ps_is_server(ps)) {
        o->u[6] = (uint64_t)terse_ps_serve(ps);
        snprintf(o->err, sizeof o->err, "%s", terse_last_error());
        terse_ps_free(ps);
        return 0;
    }
    /* A worker that lies about failover: epoch 1 to a live head, and a
     * pull asked of slot 0's replica while its head lives. */
    int s = terse_ps_chunk_server(ps, 0, 0);
    terse__ps_hdr h = {TERSE__PS_PULL, 0, 1, 0, 0, ps->keys[0]->srv_floats[s],
                       ps->keys[0]->decl_hash, 1.0f, 1};
    terse__ps_rep rep;
    memset(&rep, 0, sizeof rep);
    TR_CALL(o, terse__ps_test_raw(ps, s, &h, NULL, 0, &rep));
    o->u[7] = (uint64_t)rep.status;
    snprintf(o->err, sizeof o->err, "%s", rep.text);
    h.epoch = 1;
    double t0 = tr_now_ms();
    TR_CALL(o, terse__ps_test_raw_replica(ps, s, &h, NULL, 0, &rep));
    o->val[0] = tr_now_ms() - t0;
    o->u[8] = (uint64_t)rep.status;
    snprintf(o->err + strlen(o->err), sizeof o->err - strlen(o->err), " | %s", rep.text);
    terse_ps_free(ps); /* finishes with both servers and the replicas */
    return 0;
}

Test(ps, replicas_refuse_what_they_cannot_hold) {
    tr_job job = {"shm", 3, 2000, 60, -1};
    tr_out *o = tr_run(&job, replica_refusals_body, NULL);
    cr_assert_eq(o[2].u[7], TERSE_ERR_INVALID, "epoch 1 to a live head: %s", o[2].err);
    cr_assert(strstr(o[2].err, "is the slot's head (epoch 0)"), "%s", o[2].err);
    cr_assert_eq(o[2].u[8], TERSE_ERR_INVALID, "a replica served while its head lives: %s",
                 o[2].err);
    cr_assert(strstr(o[2].err, "was not lost: send it there"), "%s", o[2].err);
    cr_assert(o[2].val[0] >= 1000 && o[2].val[0] < 2000, "held for %.0f ms (3/4 of 2000)",
              o[2].val[0]);
    for (int r = 0; r < 2; r++) cr_assert_eq(o[r].u[6], TERSE_OK, "server %d: %s", r, o[r].err);
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(o[r].u[0], TERSE_ERR_INVALID, "replicas=3 parses");
        cr_assert_eq(o[r].u[1], TERSE_ERR_INVALID, "async takes replicas");
        cr_assert_eq(o[r].u[2], TERSE_ERR_INVALID, "replicas=0 parses");
        cr_assert_eq(o[r].u[3], TERSE_ERR_UNSUPPORTED, "replicas 3 created");
        cr_assert_eq(o[r].u[4], TERSE_ERR_INVALID, "replicas 2 on one server created");
        cr_assert(o[r].u[9], "rank %d: the sentence does not say why", r);
        cr_assert_eq(o[r].u[5], TERSE_ERR_UNSUPPORTED, "a stateful pull codec with replicas");
    }
    tr_release(o);
}
