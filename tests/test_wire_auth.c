/* Authenticated data messages (TERSE_WIRE=mac), over real rank processes:
 * a chunk altered on the way is dropped and counted and never reaches a
 * reduction; the rank whose messages are altered is named; the modes
 * default and agree as documented. */
#include "algos/comm.h"
#include "ranks.h"
#include "testutil.h"

#define N_FLOATS 1000000

/* Rank 1 runs three good allreduces, then turns on the tamper hook (its
 * chunks' MACs are flipped after they were computed, as a relay flipping
 * bits would) for `every` chunks. u[0]: the tampered call's status;
 * u[1]: elements of rank 0's buffer that hold anything but the right sum or
 * its own input; u[2]: auth failures counted; u[3]: wire_mac. */
static int tamper_body(terse_comm *c, tr_out *o, const void *arg) {
    const unsigned every = *(const unsigned *)arg;
    const int r = terse_comm_rank(c);
    float *x = malloc(N_FLOATS * sizeof(float));
    o->u[3] = (uint64_t)c->wire_mac;
    for (int k = 0; k < 3; k++) {
        for (size_t i = 0; i < N_FLOATS; i++) x[i] = (float)(r + 1);
        TR_CALL(o, terse_allreduce(c, x, N_FLOATS, NULL, TERSE_OP_SUM));
        for (size_t i = 0; i < N_FLOATS; i++) o->u[1] += x[i] != 3.0f;
    }
    if (r == 1) terse__fabric_test_tamper(c->fabric, every);
    for (size_t i = 0; i < N_FLOATS; i++) x[i] = (float)(r + 1);
    o->u[0] = (uint64_t)terse_allreduce(c, x, N_FLOATS, NULL, TERSE_OP_SUM);
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    if (o->u[0] == TERSE_OK)
        for (size_t i = 0; i < N_FLOATS; i++) o->u[1] += x[i] != 3.0f;
    terse_comm_stats st = TERSE_COMM_STATS_INIT;
    TR_CALL(o, terse_comm_get_stats(c, &st));
    o->u[2] = st.auth_failures;
    free(x);
    return 0;
}

static void check_tamper(unsigned every) {
    unsetenv("TERSE_WIRE");
    tr_job job = {"tcp", 2, 2000, 30, -1, NULL};
    tr_out *o = tr_run(&job, tamper_body, &every);
    cr_expect_eq(o[0].u[3], 1, "tcp does not default to TERSE_WIRE=mac");
    cr_expect_eq(o[0].u[0], TERSE_ERR_AUTH, "every %u: rank 0 returned %llu: %s", every,
                 (unsigned long long)o[0].u[0], o[0].err);
    cr_expect(strstr(o[0].err, "rank 1"), "the sentence does not name rank 1: %s", o[0].err);
    cr_expect_gt(o[0].u[2], 0, "no authentication failure was counted");
    for (int r = 0; r < 2; r++) {
        cr_expect_eq(o[r].u[1], 0, "rank %d: %llu wrong elements reported as success", r,
                     (unsigned long long)o[r].u[1]);
        cr_expect(o[r].u[0] != TERSE_OK || r == 1, "rank %d returned TERSE_OK", r);
    }
    tr_release(o);
}

Test(wire_auth, every_altered_chunk_is_dropped_and_the_sender_named_tcp) { check_tamper(1); }
Test(wire_auth, one_altered_chunk_in_three_fails_the_call_not_the_sum_tcp) { check_tamper(3); }

/* Barriers and tiny allreduces travel by inject; their MACs must check too. */
static int small_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int r = terse_comm_rank(c);
    float x[3] = {1, 2, 3};
    for (int k = 0; k < 50; k++) {
        TR_CALL(o, terse_barrier(c));
        x[0] = (float)r;
        TR_CALL(o, terse_allreduce(c, x, 3, NULL, TERSE_OP_SUM));
        o->u[1] += x[0] != 1.0f;
    }
    if (r == 1) terse__fabric_test_tamper(c->fabric, 1);
    o->u[0] = (uint64_t)terse_barrier(c);
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    return 0;
}

Test(wire_auth, injected_small_messages_are_authenticated_too_tcp) {
    unsetenv("TERSE_WIRE");
    tr_job job = {"tcp", 2, 2000, 30, -1, NULL};
    tr_out *o = tr_run(&job, small_body, NULL);
    cr_expect_eq(o[0].u[1], 0, "wrong small sums");
    cr_expect_eq(o[0].u[0], TERSE_ERR_AUTH, "rank 0's barrier returned %llu: %s",
                 (unsigned long long)o[0].u[0], o[0].err);
    tr_release(o);
}

static int mode_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    o->u[0] = (uint64_t)c->wire_mac;
    float x[1000];
    for (int i = 0; i < 1000; i++) x[i] = 1;
    TR_CALL(o, terse_allreduce(c, x, 1000, NULL, TERSE_OP_SUM));
    o->u[1] = x[999] == 2.0f;
    return 0;
}

Test(wire_auth, shm_defaults_to_none_and_mac_can_be_asked_for) {
    unsetenv("TERSE_WIRE");
    tr_job job = {"shm", 2, 5000, 30, -1, NULL};
    tr_out *o = tr_run(&job, mode_body, NULL);
    cr_expect_eq(o[0].u[0], 0, "shm should default to TERSE_WIRE=none");
    cr_expect_eq(o[0].u[1], 1);
    tr_release(o);
    setenv("TERSE_WIRE", "mac", 1);
    o = tr_run(&job, mode_body, NULL);
    cr_expect_eq(o[0].u[0], 1, "TERSE_WIRE=mac was not applied on shm");
    cr_expect_eq(o[0].u[1], 1);
    tr_release(o);
    setenv("TERSE_WIRE", "none", 1);
    tr_job tcp = {"tcp", 2, 5000, 30, -1, NULL};
    o = tr_run(&tcp, mode_body, NULL);
    cr_expect_eq(o[0].u[0], 0, "TERSE_WIRE=none was not applied on tcp");
    cr_expect_eq(o[0].u[1], 1);
    tr_release(o);
    unsetenv("TERSE_WIRE");
}
