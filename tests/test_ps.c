/* The parameter server over real rank processes (shm and tcp;ofi_rxm):
 * sync against a float64 reference and bitwise across workers, quorum,
 * async and ssp bounds, placement, compression both ways, bad input, and
 * a worker or server killed. */
#include <math.h>
#include <pthread.h>
#include <signal.h>

#include "algos/ps.h"
#include "ranks.h"

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
        terse_ps_stats st;
        memset(&st, 0, sizeof st);
        st.size = sizeof st;
        terse_ps_get_stats(ps, &st);
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
    tr_job job = {prov, servers + workers, 20000, 60, -1, NULL};
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
    TR_CALL(o, terse_ps_declare(ps, 0, QN, NULL, NULL, NULL));
    int rank = terse_comm_rank(c);
    if (terse_ps_is_server(ps)) {
        terse_status s = terse_ps_serve(ps);
        o->u[5] = (uint64_t)s;
        snprintf(o->err, sizeof o->err, "%s", terse_last_error());
        terse_ps_stats st;
        memset(&st, 0, sizeof st);
        st.size = sizeof st;
        terse_ps_get_stats(ps, &st);
        o->u[0] = st.late_dropped;
        o->u[1] = st.steps_closed;
        o->u[2] = st.workers_lost;
        terse_ps_free(ps);
        return 0;
    }
    float buf[QN];
    for (int t = 0; t < q->steps; t++) {
        if (rank == q->victim && t == 1) raise(SIGKILL);
        if (rank == q->late && t == 0) usleep(400000);
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
    terse_ps_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    terse_ps_get_stats(ps, &st);
    o->u[3] = st.stale_refused;
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
    tr_job job = {"tcp", 4, 20000, 60, -1, NULL};
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
    tr_job job = {"tcp", 4, 20000, 60, 3, NULL};
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
    TR_CALL(o, terse_ps_declare(ps, 0, QN, NULL, NULL, NULL));
    int rank = terse_comm_rank(c);
    if (terse_ps_is_server(ps)) {
        if (rank == k->victim) {
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
        if (rank == k->victim && t == 2) raise(SIGKILL);
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
    tr_job job = {"tcp", 4, 5000, 60, 3, NULL};
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
    tr_job job = {"tcp", 4, 5000, 60, 3, NULL};
    tr_out *o = tr_run(&job, kill_body_soft, &k);
    for (int w = 1; w <= 2; w++) cr_assert_eq(o[w].status, 0, "worker %d: %s", w, o[w].err);
    cr_assert_eq(o[0].u[5], TERSE_ERR_PEER_LOST, "serve: %s", o[0].err);
    tr_release(o);
}

Test(ps, server_killed_fails_the_workers_naming_it) {
    kill_job k = {"sync", 2, 2, 1, 400};
    tr_job job = {"tcp", 4, 5000, 60, 1, NULL};
    tr_out *o = tr_run(&job, kill_body_soft, &k);
    for (int w = 2; w <= 3; w++) {
        cr_assert(o[w].status == TERSE_ERR_PEER_LOST, "worker %d: %s", w, o[w].err);
        cr_assert(strstr(o[w].err, "rank 1"), "worker %d does not name server rank 1: %s", w,
                  o[w].err);
        cr_assert_lt(o[w].val[0], 5000.0, "took %.0f ms", o[w].val[0]);
    }
    tr_release(o);
}
