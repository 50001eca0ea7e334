/* The engine when things go wrong: the inactivity timeout, codec state
 * after a failed collective, ranks whose random streams or tuning
 * variables disagree, and malformed tuning values. Real rank processes
 * over real providers. */
#include "algos/engine/engine.h"
#include "common/env.h"
#include "ranks.h"
#include "testutil.h"

/* ------------------------------------------------------------ timeout */

#define BIG_FLOATS ((size_t)256 << 20) /* 1 GiB */

/* Filled by each rank before terse_comm_init (tr_before_init), so that no
 * rank spends longer than the timeout preparing while the other waits, and
 * the call does not pay for copy-on-write faults of a buffer inherited from
 * the test process (8 s of a 512 MB call on one VM, TLB-flush IPIs).
 * u[0]: status; val[0]: the allreduce's time (ms); u[1]: wrong elements. */
static float *big_input;

static void big_fill(int rank, const void *arg) {
    (void)rank, (void)arg;
    big_input = malloc(BIG_FLOATS * sizeof(float));
    if (!big_input) _exit(3);
    for (size_t i = 0; i < BIG_FLOATS; i++) big_input[i] = 1.0f;
}

static int big_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    float *x = big_input;
    TR_CALL(o, terse_barrier(c));
    double t0 = tr_now_ms();
    o->u[0] = (uint64_t)terse_allreduce(c, x, BIG_FLOATS, NULL, TERSE_OP_SUM);
    o->val[0] = tr_now_ms() - t0;
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    for (size_t i = 0; i < BIG_FLOATS; i++) o->u[1] += x[i] != 2.0f;
    return 0;
}

/* The timeout is 600 ms, not 300: on a loaded 2-core machine (ctest -j 2
 * next to other multi-process tests) a 300 ms one once saw a whole 300 ms
 * without a completion. The tensor is 1 GiB, not 512 MB: with the timeout
 * scaled by a loaded start (600 ms x 2.49 in one CI run) a 512 MB
 * allreduce on a fast machine (1.2 s, AMD EPYC) finished within it and the
 * test showed nothing. 1 GiB takes about 2 s on 2 vCPUs (AMD EPYC), above the
 * largest scaled timeout (600 ms x 3). Should a machine still finish
 * within the timeout, the test says so on stderr and still checks the sum
 * (a cr_log_warn would make Criterion 2.4 exit nonzero, testutil.h). */
#define BIG_TIMEOUT_MS 600
Test(timeout, is_inactivity_a_1GiB_allreduce_with_a_600ms_timeout_succeeds_tcp) {
    /* A deadline test: the 600 ms grow with the load measured now
     * (plain_time_scale), as the allreduce's own time does, so that a
     * busy machine's scheduling gaps are not taken for inactivity. */
    const int timeout_ms = (int)(BIG_TIMEOUT_MS * plain_time_scale());
    tr_job job = {"tcp", 2, timeout_ms, 90, -1};
    tr_before_init = big_fill;
    tr_out *o = tr_run(&job, big_body, NULL);
    tr_before_init = NULL;
    for (int r = 0; r < 2; r++) {
        cr_expect_eq(o[r].u[0], TERSE_OK, "rank %d: %s", r, o[r].err);
        cr_expect_eq(o[r].u[1], 0, "rank %d: %llu wrong elements", r,
                     (unsigned long long)o[r].u[1]);
        if (o[r].val[0] <= timeout_ms)
            fprintf(stderr, "[NOTE] rank %d: the allreduce took %.0f ms, not longer than the %d ms "
                            "timeout: on this machine the test shows nothing\n", r, o[r].val[0],
                    timeout_ms);
        cr_log_info("rank %d: 1 GiB allreduce took %.0f ms with a %d ms timeout", r,
                    o[r].val[0], timeout_ms);
    }
    tr_release(o);
}

/* ------------------------------------------------------------ state */

typedef struct {
    const char *spec;
    size_t rows, cols;
} codec_case;

/* Both ranks run two good steps; then rank 1 dies and rank 0's third
 * allreduce must fail and leave the codec's state exactly as before it.
 * u[0]: status; u[1]: state bytes that changed; u[2]: step before/after. */
static int state_body(terse_comm *c, tr_out *o, const void *arg) {
    const codec_case *k = arg;
    const int r = terse_comm_rank(c);
    const size_t n = k->rows * k->cols;
    terse_codec *cod;
    TR_CALL(o, terse_codec_create(k->spec, k->rows, k->cols, &cod));
    TR_CALL(o, terse_codec_set_stream(cod, 3, (uint32_t)r));
    float *x = malloc(n * sizeof(float));
    for (int step = 0; step < 2; step++) {
        tu_fill_uniform(x, n, (uint64_t)(r * 10 + step), -1, 1);
        TR_CALL(o, terse_allreduce(c, x, n, cod, TERSE_OP_AVG));
    }
    tr_out *all = o - r; /* every rank's outputs (one shared mapping) */
    if (r == 1) { /* die while rank 0 is inside its third call, waiting for us: once it
                   * says it is about to make it (an event, however slow the machine),
                   * and 300 ms later, so that the call has waited */
        const double until = tr_now_ms() + 25000; /* bounds a rank 0 that crashed */
        while (!__atomic_load_n(&all[0].u[9], __ATOMIC_ACQUIRE) &&
               !__atomic_load_n(&all[0].status, __ATOMIC_ACQUIRE) && tr_now_ms() < until)
            usleep(1000);
        usleep(300 * 1000);
        raise(SIGKILL);
    }
    size_t len = terse_codec_state_size(cod), l1 = 0, l2 = 0;
    uint8_t *before = malloc(len), *after = malloc(len);
    TR_CALL(o, terse_codec_state_save(cod, before, len, &l1));
    uint64_t step_before = terse_codec_step(cod);
    tu_fill_uniform(x, n, 99, -1, 1);
    __atomic_store_n(&o->u[9], 1, __ATOMIC_RELEASE); /* rank 1 may die now */
    double t0 = tr_now_ms();
    o->u[0] = (uint64_t)terse_allreduce(c, x, n, cod, TERSE_OP_AVG);
    o->val[0] = tr_now_ms() - t0;
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    TR_CALL(o, terse_codec_state_save(cod, after, len, &l2));
    for (size_t i = 0; i < len; i++) o->u[1] += before[i] != after[i];
    o->u[2] = step_before == terse_codec_step(cod);
    free(before);
    free(after);
    free(x);
    terse_codec_free(cod);
    return 0;
}

static void check_state(const char *spec, size_t rows, size_t cols) {
    codec_case k = {spec, rows, cols};
    tr_job job = {"tcp", 2, 5000, 30, 1};
    tr_out *o = tr_run(&job, state_body, &k);
    cr_expect(o[0].u[0] == TERSE_ERR_PEER_LOST || o[0].u[0] == TERSE_ERR_TIMEOUT,
              "%s: the allreduce without rank 1 returned %llu: %s", spec,
              (unsigned long long)o[0].u[0], o[0].err);
    cr_expect_eq(o[0].u[1], 0, "%s: %llu bytes of codec state changed by the failed call", spec,
                 (unsigned long long)o[0].u[1]);
    cr_expect_eq(o[0].u[2], 1, "%s: the step moved", spec);
    /* It was inside the call (encoded, waiting for rank 1) when rank 1 died. */
    cr_expect_geq(o[0].val[0], 200.0, "%s: the call failed after only %.0f ms", spec,
                  o[0].val[0]);
    tr_release(o);
}

Test(transactional, failed_gather_allreduce_leaves_topk_state_unchanged) {
    check_state("topk:ratio=0.01,ef=1", 200000, 1);
}
Test(transactional, failed_summable_allreduce_leaves_randk_state_unchanged) {
    check_state("randk:ratio=0.01,ef=1", 200000, 1);
}
Test(transactional, failed_two_round_allreduce_leaves_powersgd_q_unchanged) {
    check_state("powersgd:rank=4,ef=1", 512, 384);
}
Test(transactional, failed_allreduce_leaves_qsgd_stream_unchanged) {
    check_state("qsgd:bits=4,round=stochastic", 100000, 1);
}

/* ------------------------------------------------------------ randk key */

/* Rank 1's codec has another seed: its random indices differ. */
static int randk_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int r = terse_comm_rank(c);
    terse_codec *cod;
    TR_CALL(o, terse_codec_create(r == 1 ? "randk:ratio=0.1,seed=2" : "randk:ratio=0.1,seed=1",
                                  10000, 1, &cod));
    float x[10000];
    tu_fill_uniform(x, 10000, (uint64_t)r, -1, 1);
    float keep[10000];
    memcpy(keep, x, sizeof x);
    o->u[0] = (uint64_t)terse_allreduce(c, x, 10000, cod, TERSE_OP_SUM);
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    o->u[1] = memcmp(keep, x, sizeof x) != 0;
    terse_codec_free(cod);
    return 0;
}

Test(randk, ranks_whose_streams_differ_get_corrupt_not_a_wrong_sum_shm) {
    tr_job job = {"shm", 2, 5000, 30, -1};
    tr_out *o = tr_run(&job, randk_body, NULL);
    for (int r = 0; r < 2; r++) {
        cr_expect_eq(o[r].u[0], TERSE_ERR_CORRUPT, "rank %d returned %llu: %s", r,
                     (unsigned long long)o[r].u[0], o[r].err);
        cr_expect(strstr(o[r].err, "differs from rank 0's outside its values"), "rank %d: %s", r,
                  o[r].err);
        cr_expect_eq(o[r].u[1], 0, "rank %d: the buffer was changed", r);
    }
    tr_release(o);
}

/* ------------------------------------------------------------ params */

typedef struct {
    int status;
    char err[600];
} init_out;

/* Fork nranks processes that set rank-specific environment, then join. */
static init_out *init_job(int nranks, const char *var, const char *const *vals) {
    init_out *out = mmap(NULL, sizeof(init_out) * 4, PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(out, MAP_FAILED);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", tr_free_port());
    pid_t pid[4];
    fflush(NULL);
    for (int r = 0; r < nranks; r++) {
        pid[r] = fork();
        cr_assert_geq(pid[r], 0);
        if (pid[r] == 0) {
            if (vals[r]) setenv(var, vals[r], 1);
            else unsetenv(var);
            terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
            cfg.rank = r, cfg.nranks = nranks, cfg.addr = addr, cfg.provider = "tcp";
            cfg.token = "params-test-token", cfg.timeout_ms = 5000;
            terse_comm *c = NULL;
            out[r].status = (int)terse_comm_init(&cfg, &c);
            snprintf(out[r].err, sizeof out[r].err, "%s", terse_last_error());
            terse_comm_free(c);
            _exit(0);
        }
    }
    double deadline = tr_now_ms() + 20000;
    for (int r = 0; r < nranks; r++) {
        int st;
        while (waitpid(pid[r], &st, WNOHANG) == 0) {
            if (tr_now_ms() > deadline) kill(pid[r], SIGKILL);
            usleep(5000);
        }
        tr_remove_shm_of(pid[r]);
    }
    return out;
}

Test(params, a_variable_that_differs_between_ranks_fails_init_on_every_rank_naming_it) {
    const char *const vals[3] = {"512k", "1m", "512k"};
    init_out *o = init_job(3, "TERSE_RING_CHUNK_BYTES", vals);
    for (int r = 0; r < 3; r++) {
        cr_expect_eq(o[r].status, TERSE_ERR_INVALID, "rank %d: %d %s", r, o[r].status, o[r].err);
        cr_expect(strstr(o[r].err, "TERSE_RING_CHUNK_BYTES"), "rank %d: %s", r, o[r].err);
        cr_expect(strstr(o[r].err, "524288") && strstr(o[r].err, "1048576"), "rank %d: %s", r,
                  o[r].err);
    }
    munmap(o, sizeof(init_out) * 4);
}

Test(params, unset_on_one_rank_and_the_default_on_another_agree) {
    const char *const vals[2] = {"64k", NULL};
    init_out *o = init_job(2, "TERSE_RD_MAX_BYTES", vals);
    for (int r = 0; r < 2; r++) cr_expect_eq(o[r].status, TERSE_OK, "rank %d: %s", r, o[r].err);
    munmap(o, sizeof(init_out) * 4);
}

static void expect_refused(const char *var, const char *val) {
    setenv(var, val, 1);
    terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
    cfg.rank = 0, cfg.nranks = 1, cfg.provider = "shm";
    terse_comm *c = NULL;
    cr_expect_eq(terse_comm_init(&cfg, &c), TERSE_ERR_INVALID, "%s=%s was accepted", var, val);
    cr_expect_null(c);
    cr_expect(strstr(terse_last_error(), var), "%s=%s: %s", var, val, terse_last_error());
    terse_comm_free(c);
    unsetenv(var);
}

Test(params, malformed_values_are_refused_not_ignored) {
    expect_refused("TERSE_RING_CHUNK_BYTES", "64q");
    expect_refused("TERSE_RING_CHUNK_BYTES", "1k"); /* below 4 KiB */
    expect_refused("TERSE_RING_CHUNK_BYTES", "-4096");
    expect_refused("TERSE_RD_MAX_BYTES", "lots");
    expect_refused("TERSE_RD_MAX_BYTES", "64 k");
    expect_refused("TERSE_CHUNK_BYTES", "0");
    expect_refused("TERSE_CHUNK_BYTES", "99999999999999999999");
    expect_refused("TERSE_PROGRESS", "threads");
    expect_refused("TERSE_SIMD", "avx9000");
    expect_refused("TERSE_FABRIC_REGISTER", "yes");
    expect_refused("TERSE_SWEEP", "yes");
    expect_refused("TERSE_SHM_RESCUE", "on");
    expect_refused("TERSE_TRACE_TAGS", "true");
}

Test(params, suffixes_are_powers_of_1024) {
    size_t v = 0;
    cr_expect_eq(terse__parse_bytes("X", "64k", 0, SIZE_MAX, &v), TERSE_OK);
    cr_expect_eq(v, 65536);
    cr_expect_eq(terse__parse_bytes("X", "2MiB", 0, SIZE_MAX, &v), TERSE_OK);
    cr_expect_eq(v, 2u << 20);
    cr_expect_eq(terse__parse_bytes("X", "1G", 0, SIZE_MAX, &v), TERSE_OK);
    cr_expect_eq(v, 1u << 30);
    cr_expect_eq(terse__parse_bytes("X", "12", 0, SIZE_MAX, &v), TERSE_OK);
    cr_expect_eq(v, 12);
    cr_expect_eq(terse__parse_bytes("X", "1kk", 0, SIZE_MAX, &v), TERSE_ERR_INVALID);
    cr_expect_eq(terse__parse_bytes("X", "", 0, SIZE_MAX, &v), TERSE_ERR_INVALID);
    cr_expect_eq(terse__parse_bytes("X", "0x10", 0, SIZE_MAX, &v), TERSE_ERR_INVALID);
}

/* ------------------------------------------------------------ requests */

/* Rank 2 dies (SIGKILL) or stops (SIGSTOP) while ranks 0 and 1 have four
 * requests in flight; every one must complete with PEER_LOST or TIMEOUT
 * naming rank 2 (stopped: on at least one survivor, see below).
 * u[k]: request k's status; val[0]: time to the last. */
#define INFLIGHT 4
static int inflight_body(terse_comm *c, tr_out *o, const void *arg) {
    const int sig = *(const int *)arg, r = terse_comm_rank(c);
    const size_t n = (size_t)4 << 20;
    float *x[INFLIGHT];
    for (int k = 0; k < INFLIGHT; k++) x[k] = calloc(n, sizeof(float));
    TR_CALL(o, terse_barrier(c));
    tr_out *all = o - r; /* every rank's outputs (one shared mapping) */
    if (r == 2) {
        all[2].u[10] = (uint64_t)getpid();
        usleep(50 * 1000);
        raise(sig);
        usleep(10 * 1000 * 1000); /* stopped: rank 0 kills us at the end */
        return 0;
    }
    terse_request *q[INFLIGHT];
    double t0 = tr_now_ms();
    for (int k = 0; k < INFLIGHT; k++)
        TR_CALL(o, terse_allreduce_start(c, x[k], n, NULL, TERSE_OP_SUM, &q[k]));
    for (int k = 0; k < INFLIGHT; k++) {
        o->u[k] = (uint64_t)terse_request_wait(q[k]);
        snprintf(o->err + 0, sizeof o->err, "%s", terse_last_error());
        o->hash[k] = strstr(terse_last_error(), "rank 2") != NULL;
        terse_request_free(q[k]);
    }
    o->val[0] = tr_now_ms() - t0;
    for (int k = 0; k < INFLIGHT; k++) free(x[k]);
    if (sig == SIGSTOP && r == 0) kill((pid_t)all[2].u[10], SIGKILL);
    return 0;
}

static void check_inflight(int sig) {
    tr_job job = {"tcp", 3, 3000, 30, 2};
    tr_out *o = tr_run(&job, inflight_body, &sig);
    for (int r = 0; r < 2; r++) {
        for (int k = 0; k < INFLIGHT; k++) {
            cr_expect(o[r].u[k] == TERSE_ERR_PEER_LOST || o[r].u[k] == TERSE_ERR_TIMEOUT,
                      "%s: rank %d request %d returned %llu: %s", strsignal(sig), r, k,
                      (unsigned long long)o[r].u[k], o[r].err);
            /* A stopped rank is silent, not lost: over tcp (net) the
             * kernel takes a rank's sends to it, so a survivor that waits
             * only on the other survivor (itself held up by rank 2) can
             * name no one else. That survivor must still fail in time, and
             * the one that waited on rank 2 must name it. */
            if (sig == SIGKILL || !o[1 - r].hash[k])
                cr_expect_eq(o[r].hash[k], 1, "%s: rank %d request %d does not name rank 2: %s",
                             strsignal(sig), r, k, o[r].err);
        }
        cr_expect_leq(o[r].val[0], 3000.0 + plain_slack_ms(2000), "%s: rank %d took %.0f ms", strsignal(sig), r,
                      o[r].val[0]);
    }
    tr_release(o);
}

Test(requests, every_request_in_flight_fails_within_the_timeout_naming_a_killed_peer_tcp) {
    check_inflight(SIGKILL);
}
Test(requests, every_request_in_flight_fails_within_the_timeout_naming_a_stopped_peer_tcp) {
    check_inflight(SIGSTOP);
}

/* ------------------------------------------------------------ loss notices */

/* Rank 1 drops its store connection without a goodbye but keeps its
 * endpoint and keeps calling: the store announces it lost while its
 * messages still flow (what an impersonator that displaced it looks like).
 * Rank 0 runs tiny allreduces, each well under a millisecond, paced by
 * `arg` ms of sleep; it must fail within 1 s of the notice.
 * u[0]: status; val[0]: ms from the drop to the failure; u[1]: calls. */
static int notice_body(terse_comm *c, tr_out *o, const void *arg) {
    const int pace_ms = *(const int *)arg, r = terse_comm_rank(c);
    tr_out *all = o - r;
    float x = 1;
    for (int i = 0; i < 20; i++) TR_CALL(o, terse_allreduce(c, &x, 1, NULL, TERSE_OP_SUM));
    if (r == 1) {
        all[1].val[1] = tr_now_ms();
        terse__store_abandon(c->store);
        c->store = NULL;
    }
    terse_status s = TERSE_OK;
    for (int i = 0; i < 100000 && s == TERSE_OK; i++) {
        s = terse_allreduce(c, &x, 1, NULL, TERSE_OP_SUM);
        o->u[1]++;
        if (pace_ms) usleep((useconds_t)pace_ms * 1000);
        if (r == 1 && tr_now_ms() - all[1].val[1] > 5000) break;
    }
    o->u[0] = (uint64_t)s;
    o->val[0] = tr_now_ms() - all[1].val[1];
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    return 0;
}

static void check_notice(int pace_ms) {
    tr_job job = {"tcp", 2, 3000, 30, -1};
    tr_out *o = tr_run(&job, notice_body, &pace_ms);
    cr_expect_eq(o[0].u[0], TERSE_ERR_PEER_LOST, "paced %d ms: rank 0 returned %llu after %llu "
                 "calls: %s", pace_ms, (unsigned long long)o[0].u[0],
                 (unsigned long long)o[0].u[1], o[0].err);
    cr_expect(strstr(o[0].err, "rank 1"), "%s", o[0].err);
    cr_expect_leq(o[0].val[0], plain_slack_ms(1000), "paced %d ms: rank 0 failed %.0f ms after the notice",
                  pace_ms, o[0].val[0]);
    cr_log_info("paced %d ms: rank 0 failed %.0f ms after rank 1 left the store (%llu calls)",
                pace_ms, o[0].val[0], (unsigned long long)o[0].u[1]);
    tr_release(o);
}

Test(loss_notice, fails_within_1s_however_the_calls_are_paced_back_to_back) { check_notice(0); }
Test(loss_notice, fails_within_1s_however_the_calls_are_paced_5ms_apart) { check_notice(5); }

/* ------------------------------------------------------------ abandoned */

#include "transport/fabric_impl.h"

/* An extension request that behaves like libfabric shm spinning on a dead
 * peer's lock: it enters a provider call and never leaves. */
static terse_status stuck_run(terse_comm *c, terse_request *r, int *keep_usable) {
    (void)r, (void)keep_usable;
    terse__fabric_enter(c->fabric, 1, "a stuck test call");
    for (;;) pause();
    return TERSE_OK;
}

static terse_status quick_run(terse_comm *c, terse_request *r, int *keep_usable) {
    (void)c, (void)r, (void)keep_usable;
    return TERSE_OK;
}

static terse_request ext_of(terse_comm *c, terse__ext_fn run, const char *name) {
    terse_request t = terse__engine_make(c, TERSE__OP_EXT);
    t.a.ext.run = run;
    t.a.ext.name = name;
    return t;
}

/* On shm the watchdog gives up on a progress thread stuck inside a
 * provider call. Every later call must fail at once and say why -- a
 * blocking extension call (the parameter server's terse_ps_free says
 * goodbye through one) once waited forever for the abandoned thread --
 * and terse_comm_free must return. Rank 0 only; rank 1 waits for it.
 * u[0..3]: the statuses of the stuck request, a blocking extension call,
 * a started one, an allreduce; val[0]: ms for the three after the first;
 * val[1]: ms terse_comm_free took (measured by the body's caller: it is
 * called here instead). */
static int abandoned_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    if (terse_comm_rank(c) == 1) {
        usleep(2500 * 1000);
        return 0;
    }
    terse_request t = ext_of(c, stuck_run, "stuck"), *r = NULL;
    TR_CALL(o, terse__engine_start_ext(c, &t, &r));
    /* a group left open across the give-up: its end queues it after */
    float g = 1;
    terse_request *member = NULL;
    TR_CALL(o, terse_group_start(c));
    TR_CALL(o, terse_allreduce_start(c, &g, 1, NULL, TERSE_OP_SUM, &member));
    o->u[0] = (uint64_t)terse_request_wait(r);
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    terse_request_free(r);
    double g0 = tr_now_ms();
    (void)terse_group_end(c);
    o->u[4] = (uint64_t)terse_request_wait(member);
    o->val[1] = tr_now_ms() - g0;
    terse_request_free(member);
    double t0 = tr_now_ms();
    terse_request q = ext_of(c, quick_run, "quick");
    o->u[1] = (uint64_t)terse__engine_run_ext(c, &q);
    o->hash[1] = strstr(terse_last_error(), "spun inside") != NULL;
    terse_request s = ext_of(c, quick_run, "quick"), *sr = NULL;
    terse_status st = terse__engine_start_ext(c, &s, &sr);
    if (st == TERSE_OK) {
        st = terse_request_wait(sr);
        terse_request_free(sr);
    }
    o->u[2] = (uint64_t)st;
    float x = 1;
    o->u[3] = (uint64_t)terse_allreduce(c, &x, 1, NULL, TERSE_OP_SUM);
    o->val[0] = tr_now_ms() - t0;
    return 0;
}

Test(abandoned, every_call_after_the_watchdog_gave_up_fails_at_once_and_free_returns) {
    tr_job job = {"shm", 2, 5000, 30, -1};
    tr_out *o = tr_run(&job, abandoned_body, NULL);
    cr_assert(o[0].finished, "rank 0 did not finish (terse_comm_free did not return?)");
    cr_expect_eq(o[0].u[0], TERSE_ERR_TIMEOUT, "the stuck request: %llu: %s",
                 (unsigned long long)o[0].u[0], o[0].err);
    cr_expect(strstr(o[0].err, "spun inside a stuck test call (rank 1)"), "%s", o[0].err);
    for (int k = 1; k <= 3; k++)
        cr_expect(o[0].u[k] != TERSE_OK, "call %d after the watchdog returned TERSE_OK", k);
    cr_expect_eq(o[0].hash[1], 1, "the blocking call does not say why it failed");
    cr_expect_lt(o[0].val[0], plain_slack_ms(500), "the calls after the watchdog took %.0f ms", o[0].val[0]);
    cr_expect(o[0].u[4] != TERSE_OK, "a group ended after the watchdog returned TERSE_OK");
    cr_expect_lt(o[0].val[1], plain_slack_ms(500), "the group ended after the watchdog took %.0f ms to fail",
                 o[0].val[1]);
    tr_release(o);
}

/* ------------------------------------------------------------ shm lock */

#include <fcntl.h>
#include <sys/mman.h>

/* Take the spinlock in rank r's shm region (libfabric 1.17's layout: the
 * lock at byte 24), as a sender killed inside libfabric leaves it.
 * The region's file is the one this rank's fabric recorded for r. */
static int take_region_lock_of(terse_comm *c, int r) {
    char path[300];
    snprintf(path, sizeof path, "/dev/shm/%s", c->fabric->shm[r].file);
    int fd = open(path, O_RDWR);
    if (fd < 0) return -1;
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return -1;
    pthread_spinlock_t *lock = (pthread_spinlock_t *)((char *)m + 24);
    for (int i = 0; pthread_spin_trylock(lock) != 0; i++) {
        if (i > 100000) return -1; /* its owner holds it a moment now and then */
        usleep(10);
    }
    /* and signal the owner, as a sender does: its progress then runs and
     * wants the lock (the signal word follows the lock) */
    __atomic_store_n((int32_t *)((char *)m + 28), 1, __ATOMIC_RELEASE);
    return 0;
}

/* Rank 2 takes rank 0's region lock, signals rank 0, and dies (SIGKILL)
 * or stops (SIGSTOP); with a 4th rank, rank 3 dies first, so a process
 * of the job is dead either way. Ranks 0 and 1 then run an allreduce,
 * and rank 0's progress spins on its own lock. u[0]: rank 0's status;
 * val[0]: ms. TERSE_SHM_RESCUE=1 in every rank. */
static int held_lock_body(terse_comm *c, tr_out *o, const void *arg) {
    const int sig = *(const int *)arg, r = terse_comm_rank(c);
    tr_out *all = o - r;
    if (r == 2) all[2].u[10] = (uint64_t)getpid();
    o->u[12] = (uint64_t)getpid();
    TR_CALL(o, terse_barrier(c));
    o->u[11] = 1; /* out of the barrier (a death must not fail it) */
    if (r >= 2) {
        while (!__atomic_load_n(&all[0].u[11], __ATOMIC_ACQUIRE) ||
               !__atomic_load_n(&all[1].u[11], __ATOMIC_ACQUIRE))
            usleep(1000);
        if (r == 3) raise(SIGKILL);
        if (terse_comm_size(c) > 3)
            while (!__atomic_load_n(&all[3].finished, __ATOMIC_ACQUIRE) &&
                   kill((pid_t)all[3].u[12], 0) == 0)
                usleep(1000);
        if (take_region_lock_of(c, 0) != 0)
            return tr_fail(o, TERSE_ERR_INTERNAL, "rank 0's shm region lock could not be taken");
        raise(sig);
        return 0;
    }
    usleep(100 * 1000);
    float x[64] = {0};
    double t0 = tr_now_ms();
    o->u[0] = (uint64_t)terse_allreduce(c, x, 64, NULL, TERSE_OP_SUM);
    o->val[0] = tr_now_ms() - t0;
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    if (sig == SIGSTOP && r == 0) kill((pid_t)all[2].u[10], SIGKILL);
    return 0;
}

static void before_held_lock(int rank, const void *arg) {
    (void)arg;
    setenv("TERSE_SHM_RESCUE", "1", 1);
    /* the all-reduce must go through libfabric's shm, whose lock this is
     * about (the host's shared segment takes none) */
    setenv("TERSE_SHM_SEGMENT", "off", 1);
    (void)rank;
}

static tr_out *run_held_lock(int sig, int nranks) {
    uint32_t v = fi_version();
    if (FI_MAJOR(v) != 1 || FI_MINOR(v) != 17)
        cr_skip_test("the rescue and this test know libfabric 1.17's shm region layout only");
    tr_job job = {"shm", nranks, 5000, 30, 2};
    tr_before_init = before_held_lock;
    tr_victim2 = nranks > 3 ? 3 : 0;
    tr_out *o = tr_run(&job, held_lock_body, &sig);
    tr_before_init = NULL;
    tr_victim2 = 0;
    cr_assert(o[0].finished, "rank 0 did not finish");
    return o;
}

/* A lock a dead process held is released (TERSE_SHM_RESCUE=1), and the
 * survivor reports the death itself (PEER_LOST naming rank 2) instead of
 * giving up on its transport; the watchdog's TIMEOUT is what it gets
 * without the rescue. */
Test(shm_lock, a_lock_held_by_a_dead_rank_is_released_and_the_loss_reported_within_5s) {
    tr_out *o = run_held_lock(SIGKILL, 3);
    cr_expect_eq(o[0].u[0], TERSE_ERR_PEER_LOST, "rank 0: %s", o[0].err);
    cr_expect(strstr(o[0].err, "rank 2"), "rank 0's sentence does not name rank 2: %s", o[0].err);
    cr_expect(!strstr(o[0].err, "spun inside"), "rank 0 gave up on its transport: %s", o[0].err);
    cr_expect_lt(o[0].val[0], 5000.0, "rank 0 took %.0f ms", o[0].val[0]);
    tr_release(o);
}

/* A stopped process may hold the lock and resume inside its section: no
 * release then, though another rank (3) is dead, and the watchdog gives
 * up (TIMEOUT naming the spin). */
Test(shm_lock, a_lock_held_by_a_stopped_rank_is_left_alone) {
    tr_out *o = run_held_lock(SIGSTOP, 4);
    cr_expect_eq(o[0].u[0], TERSE_ERR_TIMEOUT, "rank 0: %s (%.0f ms)", o[0].err, o[0].val[0]);
    cr_expect(strstr(o[0].err, "spun inside"), "rank 0: %s", o[0].err);
    tr_release(o);
}
