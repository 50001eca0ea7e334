/* The server's update rules for stale pushes (plain, step, dc, amom,
 * their combination, and dana) and its learning-rate schedule, each against a
 * float64 reference of the server's arithmetic with a forced staleness
 * pattern; the rules' parsing and the configurations terse_ps_create
 * refuses on every rank (terse.h, Stale pushes and Learning-rate
 * schedule). */
#include "ps_jobs.h"

#define RN 1000 /* floats per key; two keys on one server */
#define RW 3    /* workers: ranks 1 (A), 2 (B), 3 (C) */
#define RK 3    /* B's pushes while A holds its old pull */

typedef struct rule_job {
    const char *mode;
    float lr, momentum;
    terse_ps_lr_schedule schedule;
    uint64_t lr_steps, lr_warmup;
} rule_job;

static int rule_ps(terse_comm *c, tr_out *o, const rule_job *j, terse_ps **ps) {
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.update = TERSE_PS_UPDATE_SGD;
    cfg.lr = j->lr;
    cfg.momentum = j->momentum;
    cfg.lr_schedule = j->schedule;
    cfg.lr_steps = j->lr_steps;
    cfg.lr_warmup = j->lr_warmup;
    TR_CALL(o, terse_ps_config_parse(j->mode, &cfg));
    TR_CALL(o, terse_ps_create(c, &cfg, ps));
    for (size_t k = 0; k < 2; k++) TR_CALL(o, terse_ps_declare(*ps, k, RN, NULL, NULL, NULL));
    return 0;
}

static int push_key(tr_out *o, terse_ps *ps, int w, int t, size_t key) {
    float buf[RN];
    for (size_t i = 0; i < RN; i++) buf[i] = grad(w, t, key, i);
    TR_CALL(o, terse_ps_push(ps, key, buf, NULL));
    return 0;
}

static int pushpull_key(tr_out *o, terse_ps *ps, int w, int t, size_t key) {
    float buf[RN];
    for (size_t i = 0; i < RN; i++) buf[i] = grad(w, t, key, i);
    TR_CALL(o, terse_ps_pushpull(ps, key, buf, NULL));
    return 0;
}

/* The staleness pattern, events only (no sleeps):
 *   A pulls key 0 (version 0), marks u[6];
 *   B pulls both keys, then pushpulls each key RK times (0 stale), marks;
 *   A pulls key 1 (version RK), pushes both keys: key 0 is RK stale and
 *     computed at version 0, key 1 fresh; marks;
 *   C, which never pulled, pushes both keys (RK + 1 stale, no kept copy),
 *     then pulls both: its f[0, 2 RN) holds the server's final state;
 *     marks u[8];
 *   A and B finish (u[9]: the server answered their finish), then C pulls
 *     both again into f[2 RN, 4 RN): dana has taken their momenta out. */
static int rule_body(terse_comm *c, tr_out *o, const void *arg) {
    const rule_job *j = arg;
    terse_ps *ps = NULL;
    if (rule_ps(c, o, j, &ps)) return 1;
    const int rank = terse_comm_rank(c);
    const tr_out *all = o - rank;
    if (terse_ps_is_server(ps)) {
        TR_CALL(o, terse_ps_serve(ps));
        terse_ps_stats st = ps_stats_of(ps);
        o->u[0] = st.pushes_applied;
        o->u[1] = st.staleness_max;
        o->u[2] = st.dc_copy_bytes;
        terse_ps_free(ps);
        return 0;
    }
    float buf[RN];
    if (rank == 1) {
        TR_CALL(o, terse_ps_pull(ps, 0, buf, NULL));
        ps_mark(&o->u[6]);
        ps_wait_mark(&all[2], &all[2].u[6]);
        TR_CALL(o, terse_ps_pull(ps, 1, buf, NULL));
        for (size_t k = 0; k < 2; k++)
            if (push_key(o, ps, 1, 9, k)) return 1;
        ps_mark(&o->u[7]);
        ps_wait_mark(&all[3], &all[3].u[8]);
        TR_CALL(o, terse_ps_finish(ps));
        ps_mark(&o->u[9]);
    } else if (rank == 2) {
        ps_wait_mark(&all[1], &all[1].u[6]);
        for (size_t k = 0; k < 2; k++) TR_CALL(o, terse_ps_pull(ps, k, buf, NULL));
        for (int t = 0; t < RK; t++) {
            for (size_t k = 0; k < 2; k++)
                if (pushpull_key(o, ps, 2, t, k)) return 1;
            TR_CALL(o, terse_ps_clock(ps)); /* ssp: one push per key and clock */
        }
        ps_mark(&o->u[6]);
        ps_wait_mark(&all[3], &all[3].u[8]);
        TR_CALL(o, terse_ps_finish(ps));
        ps_mark(&o->u[9]);
    } else {
        ps_wait_mark(&all[1], &all[1].u[7]);
        for (size_t k = 0; k < 2; k++)
            if (push_key(o, ps, 3, 9, k)) return 1;
        for (size_t k = 0; k < 2; k++) {
            TR_CALL(o, terse_ps_pull(ps, k, buf, NULL));
            memcpy(o->f + k * RN, buf, sizeof buf);
        }
        ps_mark(&o->u[8]);
        ps_wait_mark(&all[1], &all[1].u[9]);
        ps_wait_mark(&all[2], &all[2].u[9]);
        for (size_t k = 0; k < 2; k++) {
            TR_CALL(o, terse_ps_pull(ps, k, buf, NULL));
            memcpy(o->f + (2 + k) * RN, buf, sizeof buf);
        }
    }
    TR_CALL(o, terse_ps_finish(ps));
    terse_ps_free(ps);
    return 0;
}

/* The server's arithmetic in double, one key: each push (worker, step,
 * staleness, the value it computed at or NULL). */
typedef struct ref_push {
    int w, t;
    uint64_t stale;
    int kept; /* 1: compensated against the value after `at` pushes */
    int at;
} ref_push;

/* x: what a pull returns after the pushes; x_c: after A and B finished
 * (dana: their momenta taken out; the other rules: x). */
/* terse.h's rate of step k: constant when T is 0, else cosine over T steps
 * with U of warm-up. */
static double ref_lr(double lr, uint64_t T, uint64_t U, uint64_t k) {
    if (!T) return lr;
    if (k >= T) return 0.0;
    if (k < U) return lr * (double)(k + 1) / (double)U;
    return lr * 0.5 * (1.0 + cos(M_PI * (double)(k - U) / (double)(T - U)));
}

static void reference(int rule, double lambda, double lr0, uint64_t T, uint64_t U, double mu,
                      size_t key, const ref_push *p, int np, double *x, double *x_c) {
    static double v[RW + 1][RN]; /* dana: per worker; else v[0], shared */
    double hist[8][RN];
    memset(v, 0, sizeof v);
    const int dana = rule == TERSE_PS_STALE_DANA;
    const double W = RW, m = (rule & TERSE_PS_STALE_AMOM) ? fmax(0.0, mu - (1.0 - 1.0 / W)) : mu;
    memset(x, 0, RN * sizeof *x);
    for (int e = 0; e < np; e++) {
        memcpy(hist[e], x, sizeof hist[e]);
        double c = 1.0 / W;
        const double lr = ref_lr(lr0, T, U, (uint64_t)e / RW); /* step: pushes applied / W */
        if ((rule & TERSE_PS_STALE_STEP) && p[e].stale > 1) c /= (double)p[e].stale;
        for (size_t i = 0; i < RN; i++) {
            double g = grad(p[e].w, p[e].t, key, i);
            if ((rule & TERSE_PS_STALE_DC) && p[e].kept)
                g += lambda * g * g * (x[i] - hist[p[e].at][i]);
            double *vw = &v[dana ? p[e].w : 0][i];
            *vw = m * *vw + c * g;
            x[i] -= lr * *vw;
        }
    }
    /* dana: a pull returns the look-ahead, x - lr mu sum_w v_w */
    const double lr = ref_lr(lr0, T, U, (uint64_t)np / RW);
    for (size_t i = 0; i < RN; i++) x_c[i] = x[i] - (dana ? lr * mu * v[3][i] : 0.0);
    for (int w = 1; dana && w <= RW; w++)
        for (size_t i = 0; i < RN; i++) x[i] -= lr * mu * v[w][i];
}

/* T > 0: the cosine schedule over T steps with U of warm-up. */
static void check_rule_at(const char *mode, int rule, double lambda, uint64_t T, uint64_t U) {
    rule_job j = {mode, 0.5f, 0.9f, T ? TERSE_PS_LR_COSINE : TERSE_PS_LR_CONSTANT, T, U};
    tr_job job = {"tcp", 1 + RW, 20000, 60, -1};
    tr_out *o = tr_run(&job, rule_body, &j);
    for (int r = 0; r <= RW; r++) cr_assert_eq(o[r].status, 0, "rank %d: %s", r, o[r].err);
    /* key 0: B's pushes (each at the value its pushpull left), A's at
     * version 0 (RK stale), C's with no copy; key 1: A's is fresh. */
    ref_push k0[] = {{2, 0, 0, 1, 0}, {2, 1, 0, 1, 1}, {2, 2, 0, 1, 2},
                     {1, 9, RK, 1, 0}, {3, 9, RK + 1, 0, 0}};
    ref_push k1[] = {{2, 0, 0, 1, 0}, {2, 1, 0, 1, 1}, {2, 2, 0, 1, 2},
                     {1, 9, 0, 1, 3}, {3, 9, RK + 1, 0, 0}};
    double x[RN], x_c[RN], x_plain[RN], unused[RN];
    int differs = 0;
    for (size_t key = 0; key < 2; key++) {
        reference(rule, lambda, 0.5, T, U, 0.9, key, key ? k1 : k0, 5, x, x_c);
        reference(TERSE_PS_STALE_PLAIN, 0, 0.5, T, U, 0.9, key, key ? k1 : k0, 5, x_plain, unused);
        for (size_t i = 0; i < RN; i++) {
            const double got = o[3].f[key * RN + i], got_c = o[3].f[(2 + key) * RN + i];
            cr_assert(fabs(got - x[i]) <= 1e-5 * (1.0 + fabs(x[i])),
                      "%s: key %zu element %zu: %.9g, reference %.9g", mode, key, i, got, x[i]);
            cr_assert(fabs(got_c - x_c[i]) <= 1e-5 * (1.0 + fabs(x_c[i])),
                      "%s: after A and B finished, key %zu element %zu: %.9g, reference %.9g",
                      mode, key, i, got_c, x_c[i]);
            differs |= fabs(x[i] - x_plain[i]) > 1e-4;
        }
    }
    /* the pattern makes every rule but plain differ from plain */
    cr_assert(rule == TERSE_PS_STALE_PLAIN || differs, "%s: the same as plain", mode);
    cr_assert_eq(o[0].u[0], 10, "pushes applied: %llu", (unsigned long long)o[0].u[0]);
    cr_assert_eq(o[0].u[1], RK + 1, "staleness_max: %llu", (unsigned long long)o[0].u[1]);
    /* dc keeps a copy per worker and shard pulled, dana a momentum per
     * worker and shard pushed: A 2, B 2, C 2 */
    const uint64_t copies =
        (rule & (TERSE_PS_STALE_DC | TERSE_PS_STALE_DANA)) ? 6ull * RN * sizeof(float) : 0;
    cr_assert_eq(o[0].u[2], copies, "%s: dc_copy_bytes %llu, expected %llu", mode,
                 (unsigned long long)o[0].u[2], (unsigned long long)copies);
    tr_release(o);
}

static void check_rule(const char *mode, int rule, double lambda) {
    check_rule_at(mode, rule, lambda, 0, 0);
}

Test(ps_rules, plain_applies_a_stale_push_as_if_fresh) {
    check_rule("async:update=plain", TERSE_PS_STALE_PLAIN, 0);
}
Test(ps_rules, step_divides_by_the_staleness) {
    check_rule("async:update=step", TERSE_PS_STALE_STEP, 0);
}
Test(ps_rules, dc_compensates_against_each_shards_own_pulled_copy) {
    check_rule("async:update=dc,lambda=2", TERSE_PS_STALE_DC, 2);
}
Test(ps_rules, amom_reduces_the_momentum_by_the_implicit_one) {
    check_rule("ssp:8,update=amom", TERSE_PS_STALE_AMOM, 0);
}
Test(ps_rules, dana_keeps_a_momentum_per_worker_and_pulls_at_the_look_ahead) {
    check_rule("async:update=dana", TERSE_PS_STALE_DANA, 0);
    check_rule("ssp:8,update=dana", TERSE_PS_STALE_DANA, 0);
    /* the look-ahead at the current step's rate: pushes 0-2 at lr / 2,
     * 3-4 and the pulls at lr (cosine over 4 steps, 2 of warm-up) */
    check_rule_at("async:update=dana", TERSE_PS_STALE_DANA, 0, 4, 2);
}
Test(ps_rules, rules_combine_and_the_default_is_the_documented_one) {
    check_rule("async:update=amom+step+dc,lambda=1", TERSE_PS_STALE_AMOM | TERSE_PS_STALE_STEP |
                                                         TERSE_PS_STALE_DC, 1);
    check_rule("async", TERSE_PS_STALE_DEFAULT_RULE, 0.04);
    check_rule("async:lr_scale=1", TERSE_PS_STALE_STEP, 0); /* lr_scale=1 alone: step */
}

/* ---------------------------------------------------------------- schedule */

#define SCHED_STEPS 6

/* sync, 1 server, 2 workers, cosine over 5 steps with 2 of warm-up, run
 * for 6 (the last at rate 0): each worker pushpulls key 0 every step. */
static int sched_body(terse_comm *c, tr_out *o, const void *arg) {
    const rule_job *j = arg;
    terse_ps *ps = NULL;
    if (rule_ps(c, o, j, &ps)) return 1;
    if (terse_ps_is_server(ps)) {
        TR_CALL(o, terse_ps_serve(ps));
        terse_ps_free(ps);
        return 0;
    }
    const int rank = terse_comm_rank(c);
    float buf[RN];
    for (int t = 0; t < SCHED_STEPS; t++) {
        for (size_t i = 0; i < RN; i++) buf[i] = grad(rank, t, 0, i);
        TR_CALL(o, terse_ps_pushpull(ps, 0, buf, NULL));
        if (t == SCHED_STEPS - 2) memcpy(o->f, buf, sizeof buf);
        if (t == SCHED_STEPS - 1) memcpy(o->f + RN, buf, sizeof buf);
        TR_CALL(o, terse_ps_clock(ps));
    }
    TR_CALL(o, terse_ps_finish(ps));
    terse_ps_free(ps);
    return 0;
}

Test(ps_rules, the_server_runs_the_cosine_schedule_by_its_closed_steps) {
    rule_job j = {"sync", 0.5f, 0.9f, TERSE_PS_LR_COSINE, 5, 2};
    tr_job job = {"tcp", 3, 20000, 60, -1};
    tr_out *o = tr_run(&job, sched_body, &j);
    for (int r = 0; r < 3; r++) cr_assert_eq(o[r].status, 0, "rank %d: %s", r, o[r].err);
    double x[RN] = {0}, v[RN] = {0};
    for (int t = 0; t < SCHED_STEPS; t++) {
        /* terse.h: lr (k+1)/U for k < U, then cosine over T - U, 0 from T */
        const double lr = t < 2 ? 0.5 * (t + 1) / 2.0
                          : t < 5 ? 0.5 * 0.5 * (1.0 + cos(M_PI * (t - 2) / 3.0))
                                  : 0.0;
        for (size_t i = 0; i < RN; i++) {
            const double g = (grad(1, t, 0, i) + grad(2, t, 0, i)) / 2.0;
            v[i] = 0.9 * v[i] + g;
            x[i] -= lr * v[i];
        }
    }
    for (size_t i = 0; i < RN; i++) {
        cr_assert(fabs(o[1].f[RN + i] - x[i]) <= 1e-5 * (1.0 + fabs(x[i])),
                  "element %zu: %.9g, reference %.9g", i, (double)o[1].f[RN + i], x[i]);
        /* the step past lr_steps moves nothing (rate 0) */
        cr_assert_eq(o[1].f[RN + i], o[1].f[i], "element %zu moved after lr_steps", i);
        cr_assert_eq(o[1].f[RN + i], o[2].f[RN + i]);
    }
    tr_release(o);
}

/* ---------------------------------------------------------------- refusals */

Test(ps_rules, specs_parse_strictly) {
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cr_assert_eq(terse_ps_config_parse("async:update=dc,lambda=0.25", &cfg), TERSE_OK);
    cr_assert_eq(cfg.stale_rule, TERSE_PS_STALE_DC);
    cr_assert_eq(cfg.dc_lambda, 0.25f);
    cr_assert_eq(terse_ps_config_parse("ssp:2,update=amom+step", &cfg), TERSE_OK);
    cr_assert_eq(cfg.staleness, 2);
    cr_assert_eq(cfg.stale_rule, TERSE_PS_STALE_AMOM | TERSE_PS_STALE_STEP);
    cr_assert_eq(cfg.dc_lambda, 0.0f, "what the spec leaves out is reset");
    static const struct {
        const char *spec, *names;
    } bad[] = {{"async:update=nesterov", "\"nesterov\""},
               {"async:update=dc+", "\"\""},
               {"async:lambda=-1", "lambda=-1"},
               {"async:lambda=nan", "lambda=nan"},
               {"sync:update=dc", "\"update\""},
               {"ssp:2,bound=3", "\"bound\""}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(terse_ps_config_parse(bad[i].spec, &cfg), TERSE_ERR_INVALID, "%s",
                     bad[i].spec);
        cr_assert(strstr(terse_last_error(), bad[i].names), "%s: %s", bad[i].spec,
                  terse_last_error());
    }
    /* a caller built with 0.4's header: its config ends at colocate */
    terse_ps_config old = TERSE_PS_CONFIG_INIT;
    old.size = offsetof(terse_ps_config, colocate) + sizeof(int);
    old.stale_rule = 77; /* past the caller's struct: must stay untouched */
    cr_assert_eq(terse_ps_config_parse("async:max_staleness=3", &old), TERSE_OK, "%s",
                 terse_last_error());
    cr_assert_eq(old.max_staleness, 3);
    cr_assert_eq(old.stale_rule, 77);
    cr_assert_eq(terse_ps_config_parse("async:update=step", &old), TERSE_ERR_INVALID);
}

/* Every rank creates with each bad config in turn (every rank's the same):
 * each must refuse with its own sentence. */
static const struct {
    const char *mode;
    int rule;
    float lambda;
    terse_ps_lr_schedule sched;
    uint64_t steps, warmup;
    const char *names;
} bad_cfg[] = {
    {"async", 0x40, 0, TERSE_PS_LR_CONSTANT, 0, 0, "no rule"},
    {"sync", TERSE_PS_STALE_STEP, 0, TERSE_PS_LR_CONSTANT, 0, 0, "needs async or ssp"},
    {"async", TERSE_PS_STALE_DC, -1.0f, TERSE_PS_LR_CONSTANT, 0, 0, "dc_lambda -1"},
    {"async", TERSE_PS_STALE_STEP, 0.5f, TERSE_PS_LR_CONSTANT, 0, 0, "without the rule \"dc\""},
    {"async:lr_scale=1", TERSE_PS_STALE_PLAIN, 0, TERSE_PS_LR_CONSTANT, 0, 0, "\"plain\" combines"},
    {"async", TERSE_PS_STALE_DANA | TERSE_PS_STALE_STEP, 0, TERSE_PS_LR_CONSTANT, 0, 0,
     "\"dana\" (a momentum per worker) combines with no other"},
    {"sync", 0, 0, TERSE_PS_LR_COSINE, 10, 10, "lr_warmup < lr_steps"},
    {"sync", 0, 0, (terse_ps_lr_schedule)7, 10, 0, "unknown lr_schedule 7"},
};
#define NBAD (sizeof bad_cfg / sizeof *bad_cfg)

static int refuse_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    for (size_t i = 0; i < NBAD; i++) {
        terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
        cfg.update = TERSE_PS_UPDATE_SGD;
        cfg.lr = 0.1f;
        TR_CALL(o, terse_ps_config_parse(bad_cfg[i].mode, &cfg));
        cfg.stale_rule = bad_cfg[i].rule;
        cfg.dc_lambda = bad_cfg[i].lambda;
        cfg.lr_schedule = bad_cfg[i].sched;
        cfg.lr_steps = bad_cfg[i].steps;
        cfg.lr_warmup = bad_cfg[i].warmup;
        terse_ps *ps = NULL;
        o->u[i] = (uint64_t)terse_ps_create(c, &cfg, &ps);
        o->hash[i] = ps != NULL;
        if (strstr(terse_last_error(), bad_cfg[i].names)) o->u[40 + i] = 1;
        else snprintf(o->err, sizeof o->err, "%zu: %s", i, terse_last_error());
        terse_ps_free(ps);
    }
    return 0;
}

Test(ps_rules, bad_rules_and_schedules_are_refused_at_create_on_every_rank) {
    tr_job job = {"tcp", 3, 20000, 60, -1};
    tr_out *o = tr_run(&job, refuse_body, NULL);
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(o[r].status, 0, "rank %d: %s", r, o[r].err);
        for (size_t i = 0; i < NBAD; i++) {
            cr_assert_eq(o[r].u[i], TERSE_ERR_INVALID, "rank %d, config %zu: %s", r, i,
                         terse_status_name((terse_status)o[r].u[i]));
            cr_assert_eq(o[r].hash[i], 0);
            cr_assert_eq(o[r].u[40 + i], 1, "rank %d does not name \"%s\": %s", r,
                         bad_cfg[i].names, o[r].err);
        }
    }
    tr_release(o);
}
