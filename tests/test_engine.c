/* The engine: non-blocking collectives, groups, abort, the inactivity
 * timeout, transactional codec state and the parameters every rank must
 * share -- over real rank processes and real providers. */
#include <pthread.h>

#include "algos/comm/comm.h"
#include "ranks.h"
#include "testutil.h"

/* ------------------------------------------------------------ requests */

#define NSPEC 4
static const char *const specs[NSPEC] = {NULL, "topk:ratio=0.01,ef=1", "qsgd:bits=4",
                                         "powersgd:rank=2,ef=1"};
static const size_t rows[NSPEC] = {300001, 50000, 100003, 128}, cols[NSPEC] = {1, 1, 1, 96};
#define STEPS 2

static void input(float *x, size_t n, int rank, int spec, int step) {
    tu_fill_uniform(x, n, (uint64_t)(rank * 1000 + spec * 10 + step), -1.0f, 1.0f);
}

static int make_codecs(terse_codec **cod, int rank, tr_out *o) {
    for (int k = 0; k < NSPEC; k++) {
        cod[k] = NULL;
        if (!specs[k]) continue;
        TR_CALL(o, terse_codec_create(specs[k], rows[k], cols[k], &cod[k]));
        TR_CALL(o, terse_codec_set_stream(cod[k], (uint64_t)k, (uint32_t)rank));
    }
    return 0;
}

/* hash[step * NSPEC + k]: blocking results; hash[32 + ...]: started then
 * waited in reverse order, with a broadcast and a barrier in between. */
static int reverse_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int r = terse_comm_rank(c);
    float *buf[NSPEC];
    terse_codec *cod[NSPEC];
    for (int k = 0; k < NSPEC; k++) buf[k] = malloc(rows[k] * cols[k] * sizeof(float));
    for (int pass = 0; pass < 2; pass++) {
        if (make_codecs(cod, r, o)) return 1;
        for (int step = 0; step < STEPS; step++) {
            for (int k = 0; k < NSPEC; k++) input(buf[k], rows[k] * cols[k], r, k, step);
            if (pass == 0) {
                for (int k = 0; k < NSPEC; k++)
                    TR_CALL(o, terse_allreduce(c, buf[k], rows[k] * cols[k], cod[k],
                                               TERSE_OP_AVG));
            } else {
                terse_request *q[NSPEC + 2];
                uint8_t bc[100] = {0};
                if (r == 0) memset(bc, 7, sizeof bc);
                for (int k = 0; k < NSPEC; k++) {
                    TR_CALL(o, terse_allreduce_start(c, buf[k], rows[k] * cols[k], cod[k],
                                                     TERSE_OP_AVG, &q[k]));
                    if (k == 1) TR_CALL(o, terse_broadcast_start(c, bc, sizeof bc, 0, &q[4]));
                }
                TR_CALL(o, terse_barrier_start(c, &q[5]));
                for (int k = NSPEC + 1; k >= 0; k--) {
                    TR_CALL(o, terse_request_wait(q[k]));
                    int done = 0;
                    TR_CALL(o, terse_request_test(q[k], &done));
                    o->u[1] += done != 1;
                }
                for (int k = 0; k < NSPEC + 2; k++) terse_request_free(q[k]);
                for (size_t i = 0; i < sizeof bc; i++) o->u[2] += bc[i] != 7;
            }
            for (int k = 0; k < NSPEC; k++)
                o->hash[32 * pass + step * NSPEC + k] =
                    tr_hash(buf[k], rows[k] * cols[k] * sizeof(float));
        }
        for (int k = 0; k < NSPEC; k++) terse_codec_free(cod[k]);
    }
    for (int k = 0; k < NSPEC; k++) free(buf[k]);
    return 0;
}

static void check_reverse(const char *provider, int nranks, const char *progress) {
    setenv("TERSE_PROGRESS", progress, 1);
    tr_job job = {provider, nranks, 20000, 120, -1};
    tr_out *o = tr_run(&job, reverse_body, NULL);
    for (int r = 0; r < nranks; r++) {
        cr_expect_eq(o[r].u[1], 0, "rank %d: test after wait did not say done", r);
        cr_expect_eq(o[r].u[2], 0, "rank %d: broadcast request delivered wrong bytes", r);
        for (int s = 0; s < STEPS * NSPEC; s++) {
            cr_expect_eq(o[r].hash[32 + s], o[r].hash[s],
                         "%s x%d (%s): rank %d, step %d, %s: started result differs from the "
                         "blocking one",
                         provider, nranks, progress, r, s / NSPEC,
                         specs[s % NSPEC] ? specs[s % NSPEC] : "dense");
            cr_expect_eq(o[r].hash[s], o[0].hash[s], "rank %d differs from rank 0 (slot %d)", r,
                         s);
        }
    }
    tr_release(o);
}

Test(requests, four_started_waited_in_reverse_equal_blocking_shm_2) {
    check_reverse("shm", 2, "thread");
}
Test(requests, four_started_waited_in_reverse_equal_blocking_tcp_3) {
    check_reverse("tcp", 3, "thread");
}
Test(requests, four_started_waited_in_reverse_equal_blocking_shm_4) {
    check_reverse("shm", 4, "thread");
}
Test(requests, four_started_waited_in_reverse_equal_blocking_tcp_2_caller) {
    check_reverse("tcp", 2, "caller");
}

/* ------------------------------------------------------------ groups */

#define NSMALL 150

static size_t small_n(int i) { return (size_t)(1 + (i * 37) % 300); }

/* u[0], u[1]: phases used by the separate calls and by the group;
 * u[2]: members whose group result differs from the separate result. */
static int group_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int r = terse_comm_rank(c);
    float *sep[NSMALL + 1], *grp[NSMALL + 1];
    const size_t big = 100000;
    for (int i = 0; i <= NSMALL; i++) {
        size_t n = i < NSMALL ? small_n(i) : big;
        sep[i] = malloc(n * sizeof(float));
        grp[i] = malloc(n * sizeof(float));
        tu_fill_uniform(sep[i], n, (uint64_t)(r * 7919 + i), -1, 1);
        memcpy(grp[i], sep[i], n * sizeof(float));
    }
    terse_codec *c1, *c2;
    TR_CALL(o, terse_codec_create("topk:ratio=0.05,ef=1", big, 1, &c1));
    TR_CALL(o, terse_codec_create("topk:ratio=0.05,ef=1", big, 1, &c2));
    float *t1 = malloc(big * sizeof(float)), *t2 = malloc(big * sizeof(float));
    tu_fill_uniform(t1, big, (uint64_t)r, -1, 1);
    memcpy(t2, t1, big * sizeof(float));

    uint32_t s0 = c->seq;
    for (int i = 0; i <= NSMALL; i++)
        TR_CALL(o, terse_allreduce(c, sep[i], i < NSMALL ? small_n(i) : big, NULL,
                                   i % 3 ? TERSE_OP_SUM : TERSE_OP_AVG));
    TR_CALL(o, terse_allreduce(c, t1, big, c1, TERSE_OP_SUM));
    uint32_t s1 = c->seq;
    terse_request *q[NSMALL + 2];
    TR_CALL(o, terse_group_start(c));
    for (int i = 0; i <= NSMALL; i++)
        TR_CALL(o, terse_allreduce_start(c, grp[i], i < NSMALL ? small_n(i) : big, NULL,
                                         i % 3 ? TERSE_OP_SUM : TERSE_OP_AVG, &q[i]));
    TR_CALL(o, terse_allreduce_start(c, t2, big, c2, TERSE_OP_SUM, &q[NSMALL + 1]));
    TR_CALL(o, terse_group_end(c));
    for (int i = 0; i <= NSMALL + 1; i++) {
        TR_CALL(o, terse_request_wait(q[i]));
        terse_request_free(q[i]);
    }
    uint32_t s2 = c->seq;
    o->u[0] = s1 - s0;
    o->u[1] = s2 - s1;
    for (int i = 0; i <= NSMALL; i++)
        o->u[2] += memcmp(sep[i], grp[i], (i < NSMALL ? small_n(i) : big) * sizeof(float)) != 0;
    o->u[2] += memcmp(t1, t2, big * sizeof(float)) != 0;
    for (int i = 0; i <= NSMALL; i++) {
        free(sep[i]);
        free(grp[i]);
    }
    free(t1);
    free(t2);
    terse_codec_free(c1);
    terse_codec_free(c2);
    return 0;
}

static void check_group(const char *provider) {
    tr_job job = {provider, 3, 20000, 60, -1};
    tr_out *o = tr_run(&job, group_body, NULL);
    for (int r = 0; r < 3; r++) {
        cr_expect_eq(o[r].u[2], 0, "rank %d: %llu group members differ from separate calls", r,
                     (unsigned long long)o[r].u[2]);
        cr_expect_geq(o[r].u[0], NSMALL, "separate calls used %llu phases",
                      (unsigned long long)o[r].u[0]);
        /* two fused exchanges (sum, average), then the large dense ring and
         * the codec's exchanges, each a few phases */
        cr_expect_leq(o[r].u[1], 12, "rank %d: the group used %llu phases (separately: %llu)", r,
                      (unsigned long long)o[r].u[1], (unsigned long long)o[r].u[0]);
        if (r == 0)
            cr_log_info("the group used %llu phases; the same calls one by one used %llu",
                        (unsigned long long)o[r].u[1], (unsigned long long)o[r].u[0]);
    }
    tr_release(o);
}

Test(groups, small_dense_allreduces_fuse_into_few_exchanges_with_identical_bits_tcp_3) {
    check_group("tcp");
}
/* over the host's shared segment: a fused batch must take it too (its sums
 * in rank order differ from recursive doubling's at 3 ranks) */
Test(groups, small_dense_allreduces_fuse_with_identical_bits_shm_3) { check_group("shm"); }

/* ------------------------------------------------------------ abort */

typedef struct {
    terse_comm *c;
    int delay_ms;
    double at_ms;
} aborter;

static void *abort_later(void *arg) {
    aborter *a = arg;
    usleep((useconds_t)a->delay_ms * 1000);
    a->at_ms = tr_now_ms();
    terse_comm_abort(a->c);
    return NULL;
}

#define ABORT_FLOATS ((size_t)64 << 20) /* 256 MB */

/* Ranks 0 and 1 abort from a second thread 150 ms into a 256 MB allreduce
 * (each 150 ms after its own start); rank 2 does not. u[0]: the wait's status; val[0]: abort -> return (ms);
 * u[1]: the next call's status; val[1]: start -> return (ms). */
static int abort_body(terse_comm *c, tr_out *o, const void *arg) {
    const int delay_ms = *(const int *)arg; /* from the call's start */
    const int r = terse_comm_rank(c);
    float *x = malloc(ABORT_FLOATS * sizeof(float));
    for (size_t i = 0; i < ABORT_FLOATS; i++) x[i] = (float)r;
    TR_CALL(o, terse_barrier(c));
    terse_request *q;
    double t0 = tr_now_ms();
    TR_CALL(o, terse_allreduce_start(c, x, ABORT_FLOATS, NULL, TERSE_OP_SUM, &q));
    aborter a = {c, delay_ms, 0};
    pthread_t th;
    if (r < 2) pthread_create(&th, NULL, abort_later, &a);
    terse_status s = terse_request_wait(q);
    double t1 = tr_now_ms();
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    if (r < 2) pthread_join(th, NULL);
    o->u[0] = (uint64_t)s;
    o->val[0] = t1 - a.at_ms;
    o->val[1] = t1 - t0;
    float y = 0;
    o->u[1] = (uint64_t)terse_allreduce(c, &y, 1, NULL, TERSE_OP_SUM);
    terse_request_free(q);
    free(x);
    return 0;
}

static void check_abort(const char *provider);
Test(abort, from_a_second_thread_during_256MB_returns_fast_and_others_fail_tcp_3) {
    check_abort("tcp");
}
/* over the host's shared segment: the abort flag at every step */
Test(abort, from_a_second_thread_during_256MB_returns_fast_and_others_fail_shm_3) {
    check_abort("shm");
}
static void check_abort(const char *provider) {
    tr_job job = {provider, 3, 10000, 60, -1};
    /* well inside the call: the segment moves 256 MB faster than tcp */
    const int delay_ms = strcmp(provider, "shm") ? 150 : 20;
    tr_known_segv = TR_RXM_TEARDOWN_SEGV;
    tr_out *o = tr_run(&job, abort_body, &delay_ms);
    tr_known_segv = NULL;
    /* Ranks 0 and 1 abort about together, never exactly: the first to
     * abort closes its end, and the other's request may fail of that
     * (PEER_LOST naming it) before its own abort. At least one must see
     * ABORTED; each must see ABORTED or its fellow aborter named. */
    int aborted = 0, crashed = 0;
    for (int r = 0; r < 3; r++) crashed += !o[r].finished; /* tr_run warned */
    for (int r = 0; r < 2; r++) {
        if (!o[r].finished) continue;
        terse_status s = (terse_status)o[r].u[0];
        aborted += s == TERSE_ERR_ABORTED;
        if (s != TERSE_ERR_ABORTED) {
            cr_expect(s == TERSE_ERR_PEER_LOST || s == TERSE_ERR_TIMEOUT,
                      "rank %d: wait returned %s: %s", r, terse_status_name(s), o[r].err);
            cr_expect(strstr(o[r].err, r ? "rank 0" : "rank 1"), "rank %d: %s", r, o[r].err);
            continue;
        }
        cr_log_info("rank %d: abort -> wait returned in %.1f ms (allreduce ran %.0f ms)", r,
                    o[r].val[0], o[r].val[1]);
        /* The contract is 100 ms, and the plain build measures 0.1-40 ms
         * here (the log line above). This bound only tells "promptly" from
         * "at the 10 s timeout": the sanitizer builds, on a loaded 2-core
         * runner, have taken 235 ms (closing the endpoint under ASan). */
        cr_expect_leq(o[r].val[0], plain_slack_ms(1000), "rank %d: abort took %.1f ms to return", r,
                      o[r].val[0]);
    }
    if (!crashed) cr_expect_geq(aborted, 1, "neither aborting rank saw TERSE_ERR_ABORTED");
    for (int r = 0; r < 2; r++)
        if (o[r].finished)
            cr_expect_eq(o[r].u[1], TERSE_ERR_ABORTED,
                         "rank %d: the call after abort returned %llu", r,
                         (unsigned long long)o[r].u[1]);
    if (o[2].finished) {
        cr_expect(o[2].u[0] == TERSE_ERR_PEER_LOST || o[2].u[0] == TERSE_ERR_TIMEOUT,
                  "rank 2 returned %llu: %s", (unsigned long long)o[2].u[0], o[2].err);
        cr_expect_leq(o[2].val[1], 10000.0 + plain_slack_ms(2000), "rank 2 failed only after %.0f ms",
                      o[2].val[1]);
    }
    tr_release(o);
}

Test(abort, single_rank_every_later_call_is_aborted) {
    terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
    cfg.rank = 0, cfg.nranks = 1, cfg.provider = "shm";
    terse_comm *c = NULL;
    cr_assert_eq(terse_comm_init(&cfg, &c), TERSE_OK, "%s", terse_last_error());
    terse_comm_abort(c);
    terse_comm_abort(c); /* twice is harmless */
    float x[4] = {1, 2, 3, 4};
    terse_request *q = NULL;
    cr_expect_eq(terse_allreduce(c, x, 4, NULL, TERSE_OP_SUM), TERSE_ERR_ABORTED);
    cr_expect(strstr(terse_last_error(), "aborted"), "%s", terse_last_error());
    cr_expect_eq(terse_allreduce_start(c, x, 4, NULL, TERSE_OP_SUM, &q), TERSE_ERR_ABORTED);
    cr_expect_null(q);
    cr_expect_eq(terse_barrier(c), TERSE_ERR_ABORTED);
    cr_expect_eq(x[3], 4.0f);
    terse_comm_free(c);
    terse_comm_abort(NULL);
}

/* ------------------------------------------------------------ misuse */

Test(requests, misuse_gets_a_status_and_a_sentence) {
    terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
    cfg.rank = 0, cfg.nranks = 1, cfg.provider = "shm";
    terse_comm *c = NULL;
    cr_assert_eq(terse_comm_init(&cfg, &c), TERSE_OK, "%s", terse_last_error());
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    terse_request *q = NULL, *q2 = NULL;
    int done = 7;
    cr_expect_eq(terse_request_test(NULL, &done), TERSE_ERR_INVALID);
    cr_expect_eq(terse_request_wait(NULL), TERSE_ERR_INVALID);
    terse_request_free(NULL);
    cr_expect_eq(terse_group_end(c), TERSE_ERR_INVALID);
    cr_expect(strstr(terse_last_error(), "without terse_group_start"), "%s", terse_last_error());

    cr_assert_eq(terse_group_start(c), TERSE_OK);
    cr_assert_eq(terse_allreduce_start(c, x, 8, NULL, TERSE_OP_SUM, &q), TERSE_OK);
    cr_assert_eq(terse_allreduce_start(c, x, 4, NULL, TERSE_OP_AVG, &q2), TERSE_OK);
    cr_expect_eq(terse_request_wait(q), TERSE_ERR_INVALID);
    cr_expect(strstr(terse_last_error(), "group has not ended"), "%s", terse_last_error());
    cr_expect_eq(terse_request_test(q, &done), TERSE_ERR_INVALID);
    cr_expect_eq(terse_barrier(c), TERSE_ERR_INVALID);
    cr_expect(strstr(terse_last_error(), "inside a group"), "%s", terse_last_error());
    terse_request_free(q2); /* freed inside its group: released once it has run */
    cr_assert_eq(terse_group_end(c), TERSE_OK);
    cr_expect_eq(terse_request_wait(q), TERSE_OK, "%s", terse_last_error());
    cr_expect_eq(terse_request_test(q, &done), TERSE_OK);
    cr_expect_eq(done, 1);
    terse_request_free(q);

    /* a bad argument fails at start, with no request, and fails the comm */
    q = (terse_request *)x;
    cr_expect_eq(terse_allreduce_start(c, NULL, 8, NULL, TERSE_OP_SUM, &q), TERSE_ERR_INVALID);
    cr_expect_null(q);
    cr_expect_eq(terse_barrier(c), TERSE_ERR_INVALID);
    cr_expect(strstr(terse_last_error(), "failed earlier"), "%s", terse_last_error());

    terse_comm_free(c);

    /* no request pointer: the collective cannot be started, and this rank
     * would skip what the others run, so later starts are refused too */
    cr_assert_eq(terse_comm_init(&cfg, &c), TERSE_OK, "%s", terse_last_error());
    cr_expect_eq(terse_allreduce_start(c, x, 8, NULL, TERSE_OP_SUM, NULL), TERSE_ERR_INVALID);
    cr_expect(strstr(terse_last_error(), "request pointer is NULL"), "%s", terse_last_error());
    cr_expect_eq(terse_barrier(c), TERSE_ERR_INVALID);
    cr_expect(strstr(terse_last_error(), "failed earlier"), "%s", terse_last_error());
    terse_comm_free(c);
}

Test(requests, free_with_requests_in_flight_aborts_them_and_they_outlive_the_comm) {
    setenv("TERSE_PROGRESS", "caller", 1);
    terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
    cfg.rank = 0, cfg.nranks = 1, cfg.provider = "shm";
    terse_comm *c = NULL;
    cr_assert_eq(terse_comm_init(&cfg, &c), TERSE_OK, "%s", terse_last_error());
    float x[8] = {0};
    terse_request *q = NULL;
    cr_assert_eq(terse_allreduce_start(c, x, 8, NULL, TERSE_OP_SUM, &q), TERSE_OK);
    terse_comm_free(c); /* caller mode: q never ran */
    cr_expect_eq(terse_request_wait(q), TERSE_ERR_ABORTED);
    terse_request_free(q);
}
