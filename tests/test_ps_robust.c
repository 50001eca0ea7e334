/* The parameter server's robust aggregators over real rank processes: a
 * NaN push left out, a Byzantine worker outvoted (median, Krum), a plugin
 * aggregator serving real workers, and aggregators that cannot hold
 * refused on every rank. (The aggregators against their references are
 * test_ps_aggregate.c.) */
#include "ps_jobs.h"
#include "terse_plugin.h"

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
        terse__ps_hdr h = {TERSE__PS_PUSH, 0, 0, 64, 0, RN, ps->keys[0]->decl_hash, 2.0f, 0, 0, 0};
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
