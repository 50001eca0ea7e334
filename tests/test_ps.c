/* The parameter server over real rank processes (shm and tcp;ofi_rxm),
 * its core: sync against a float64 reference and bitwise across workers,
 * quorum, async and ssp bounds, placement, compression both ways, bad
 * input and configurations that differ. Elsewhere: deadline rounds
 * (test_ps_rounds.c), robust and plugin aggregators (test_ps_robust.c),
 * killed or stopped workers and servers, replicas and replacements
 * (test_ps_failover.c); what they share is in ps_jobs.h. */
#include "ps_jobs.h"

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
    int late;        /* the worker that arrives late at step 0: it pushes only once
                        every other worker finished */
    int victim;      /* a worker that dies at step 1 (-1: none) */
    int steps;
} q_job;

/* 1 server, 3 workers, sync:quorum=2, the server holds parameters (sgd,
 * lr 0.5). A worker that finished marks u[6]. */
static int quorum_body(terse_comm *c, tr_out *o, const void *arg) {
    const q_job *q = arg;
    terse_ps *ps = NULL;
    if (sgd_ps(c, o, "sync:quorum=2", 1, 0.5f, 4096, &ps)) return 1;
    int rank = terse_comm_rank(c);
    const tr_out *all = o - rank;
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
            tr_wait_all_ready(c, o);
            raise(SIGKILL);
        }
        if (rank == q->late && t == 0) /* late however fast the others are */
            for (int w = 1; w < terse_comm_size(c); w++)
                if (w != rank) ps_wait_mark(&all[w], &all[w].u[6]);
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
    ps_mark(&o->u[6]);
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
    /* The server closes after its workers left with a goodbye, one of them
     * without reading a reply it was sent: the store's LEFT notice ends the
     * server's flush at once, where it waited out its whole budget (5 s)
     * for a worker that had gone. A deadline check: 1 s, scaled with the
     * load, and under the budget. */
    const double limit = plain_slack_ms(1000) < 4000 ? plain_slack_ms(1000) : 4000;
    cr_expect_lt(o[0].free_ms, limit, "the server's terse_comm_free took %.0f ms", o[0].free_ms);
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

/* ---------------------------------------------------------------- async */

/* Worker 1 pulls once, then pushes three times without pulling: with
 * max_staleness=1 the third push (2 updates stale) is refused. Worker 2
 * then trains normally; the final parameters are exact (gradients are
 * multiples of 1/16, lr 0.5, weight 1/2: every partial sum is a float). */
static int async_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    terse_ps *ps = NULL;
    if (sgd_ps(c, o, "async:max_staleness=1", 1, 0.5f, 0, &ps)) return 1;
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
        ps_mark(&o->u[6]);
    }
    /* Then worker 2 trains alone (its pushes are 0 stale): it waits for
     * worker 1's pushes to be applied -- a barrier would need the servers;
     * worker 1 marks u[6] once its last push was answered and its pull
     * returned. */
    if (rank == 2) {
        const tr_out *w1 = o - rank + 1; /* ranks.h's outputs are one shared array */
        ps_wait_mark(w1, &w1->u[6]);
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
 * clock c may return only after worker 2 started its push of clock c - 1.
 * Worker 2 starts its push of clock 1 only once worker 1's pull at clock 1
 * returned (worker 1 marks u[0]): with ssp:1 that pull needs only clock 0
 * of worker 2, and a pull that waited for clock 1 would hold both until
 * the server refused it (3/4 of the timeout), failing the test. */
static int ssp_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    terse_ps *ps = NULL;
    if (sgd_ps(c, o, "ssp:1", 1, 0.5f, 0, &ps)) return 1;
    int rank = terse_comm_rank(c);
    const tr_out *fast = o - rank + 1;
    if (terse_ps_is_server(ps)) {
        TR_CALL(o, terse_ps_serve(ps));
        terse_ps_free(ps);
        return 0;
    }
    float buf[QN];
    for (int t = 0; t < SSP_STEPS; t++) {
        if (rank == 2) usleep(SSP_SLOW_MS * 1000);
        if (rank == 2 && t == 1) ps_wait_mark(fast, &fast->u[0]);
        for (size_t i = 0; i < QN; i++) buf[i] = grad(rank, t, 0, i);
        o->val[t] = tr_now_ms(); /* push started */
        TR_CALL(o, terse_ps_push(ps, 0, buf, NULL));
        TR_CALL(o, terse_ps_pull(ps, 0, buf, NULL));
        o->val[SSP_STEPS + t] = tr_now_ms(); /* pull returned */
        if (rank == 1 && t == 1) ps_mark(&o->u[0]);
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
     * clock 1 needs only the slow worker's clock 0, not its clock 1 (which
     * waits for that pull, however slow the machine). */
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
    if (sgd_ps(c, o, "ssp:0", 1, 0.5f, 0, &ps)) return 1;
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

/* Every worker pushes a key's partitions at once, so the busiest server's
 * share of one key is what its link needs: a key's chunks are spread at
 * most ceil(chunks / S) per server, whatever keys came before. */
Test(ps, placement_spreads_each_large_key_evenly) {
    static const int servers[] = {2, 3, 4};
    static const size_t chunks[] = {16, 64, 10, 7, 1, 33};
    for (size_t i = 0; i < 3; i++) {
        int S = servers[i];
        terse_ps *ps = bare(S, 1024);
        for (size_t k = 0; k < 6; k++) {
            bare_place(ps, k, chunks[k] * 256 - (k == 3 ? 100 : 0));
            size_t per[8] = {0}, cap = (chunks[k] + (size_t)S - 1) / (size_t)S;
            for (size_t c = 0; c < chunks[k]; c++) per[ps->keys[k]->server[c]]++;
            for (int s = 0; s < S; s++)
                cr_assert_leq(per[s], cap, "S=%d, key %zu of %zu chunks: server %d holds %zu",
                              S, k, chunks[k], s, per[s]);
        }
        /* The same key cut into one-chunk partitions (internal keys of their
         * own), as terse_ps_declare places them: the spread holds over all
         * of them together. */
        size_t mine[8] = {0}, per[8] = {0};
        ps->place_mine = mine;
        ps->place_chunks = 16;
        for (size_t p = 0; p < 16; p++) {
            bare_place(ps, 6 + p, 256);
            per[ps->keys[6 + p]->server[0]]++;
        }
        ps->place_mine = NULL;
        for (int s = 0; s < S; s++)
            cr_assert_leq(per[s], (16 + (size_t)S - 1) / (size_t)S,
                          "S=%d, 16 one-chunk partitions: server %d holds %zu", S, s, per[s]);
        bare_free(ps, 22);
    }
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
        /* What went out: the payload still in the send buffer (server 0's
         * first push lane: one partition, so the only one used), decoded. */
        const uint8_t *p = ps->lsbuf[0];
        size_t off = 0;
        for (size_t ch = 0; ch < k->nchunks; ch++) {
            size_t m = 0;
            TR_CALL(o, terse__ps_msg_len(p + off, ps->lsbuf_cap[0] - off, &m));
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
    terse__ps_hdr h = {op, key, ps->clock, plen, 0, k->srv_floats[s], k->decl_hash, 1.0f, 0, 0, 0};
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
            terse__ps_hdr h = {TERSE__PS_PUSH, 0, 0, 64, 0, 0, ps->keys[0]->decl_hash, 1.0f, 0, 0, 0};
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
                           k->srv_floats[0], k->decl_hash, 1.0f, 0, 0, 0};
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
 * counts for that step, and the step waits for the others: worker 3
 * pushes only once worker 1 finished (worker 1 marks u[6]). */
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
    const tr_out *w1 = o - rank + 1; /* ranks.h's outputs are one shared array */
    if (rank == 3) ps_wait_mark(w1, &w1->u[6]);
    if (rank == 1) {
        TR_CALL(o, terse_ps_push(ps, 0, buf, NULL));
    } else {
        TR_CALL(o, terse_ps_pushpull(ps, 0, buf, NULL));
        for (size_t i = 0; i < QN; i++) o->f[i] = buf[i];
    }
    TR_CALL(o, terse_ps_finish(ps));
    ps_mark(&o->u[6]);
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
