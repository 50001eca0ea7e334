/* Authenticated data messages (TERSE_WIRE=mac), over real rank processes:
 * a chunk altered on the way is dropped and counted and never reaches a
 * reduction; the rank whose messages are altered is named; the modes
 * default and agree as documented. */
#include "algos/comm/comm.h"
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
    tr_job job = {"tcp", 2, 2000, 30, -1};
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
    tr_job job = {"tcp", 2, 2000, 30, -1};
    tr_out *o = tr_run(&job, small_body, NULL);
    cr_expect_eq(o[0].u[1], 0, "wrong small sums");
    cr_expect_eq(o[0].u[0], TERSE_ERR_AUTH, "rank 0's barrier returned %llu: %s",
                 (unsigned long long)o[0].u[0], o[0].err);
    tr_release(o);
}

/* Honest ranks that pass different sizes: under mac the odd-sized chunk
 * fails authentication (the tag covers the length), but the call
 * descriptor (comm_desc.c) says what happened: TERSE_ERR_SHAPE naming both
 * sizes, never AUTH. arg: the root's size (the other rank passes 5). */
static int sizes_body(terse_comm *c, tr_out *o, const void *arg) {
    const int r = terse_comm_rank(c);
    char buf[8] = "abcdefg";
    o->u[0] = (uint64_t)terse_broadcast(c, buf, r == 0 ? *(const size_t *)arg : 5, 0);
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    return 0;
}

/* want: rank 1's own finding; told: rank 0's, which rank 1 may hear first
 * through the store -- either names both sizes. */
static void check_sizes(size_t root_len, const char *want, const char *told) {
    unsetenv("TERSE_WIRE");
    tr_job job = {"tcp", 2, 1000, 30, -1};
    tr_out *o = tr_run(&job, sizes_body, &root_len);
    cr_expect_eq(o[1].u[0], TERSE_ERR_SHAPE, "rank 1 returned %llu: %s",
                 (unsigned long long)o[1].u[0], o[1].err);
    cr_expect(strstr(o[1].err, want) || strstr(o[1].err, told),
              "rank 1's sentence does not name both sizes (%s, or %s): %s", want, told, o[1].err);
    tr_release(o);
}

Test(wire_auth, ranks_that_disagree_on_a_size_are_told_so_tcp) {
    check_sizes(6, "rank 0 passed 6 bytes, this rank 5", "rank 1 passed 5 bytes, this rank 6");
    check_sizes(4, "rank 0 passed 4 bytes, this rank 5", "rank 1 passed 5 bytes, this rank 4");
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
    tr_job job = {"shm", 2, 5000, 30, -1};
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
    tr_job tcp = {"tcp", 2, 5000, 30, -1};
    o = tr_run(&tcp, mode_body, NULL);
    cr_expect_eq(o[0].u[0], 0, "TERSE_WIRE=none was not applied on tcp");
    cr_expect_eq(o[0].u[1], 1);
    tr_release(o);
    unsetenv("TERSE_WIRE");
}

/* TERSE_WIRE=seal: results exactly as without it (dense, a codec, small
 * injected messages, several sizes), and an altered chunk fails as with mac.
 * Rank 1 asks for it by its earlier name, encrypt: the same mode. */
static void seal_on_0_encrypt_on_1(int rank, const void *arg) {
    (void)arg;
    setenv("TERSE_WIRE", rank ? "encrypt" : "seal", 1);
}

static int encrypt_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int r = terse_comm_rank(c);
    o->u[3] = (uint64_t)c->wire_mac;
    const size_t sizes[] = {1, 17, 5000, 300001, 3000000};
    float *x = malloc(3000000 * sizeof(float));
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        for (size_t i = 0; i < sizes[k]; i++) x[i] = (float)((i % 7) + (size_t)r);
        TR_CALL(o, terse_allreduce(c, x, sizes[k], NULL, TERSE_OP_SUM));
        for (size_t i = 0; i < sizes[k]; i++) o->u[1] += x[i] != (float)(2 * (i % 7) + 1);
    }
    terse_codec *cod;
    TR_CALL(o, terse_codec_create("int8", 100000, 1, &cod));
    for (size_t i = 0; i < 100000; i++) x[i] = 1.0f;
    TR_CALL(o, terse_allreduce(c, x, 100000, cod, TERSE_OP_SUM));
    for (size_t i = 0; i < 100000; i++) o->u[1] += x[i] < 1.9f || x[i] > 2.1f;
    terse_codec_free(cod);
    TR_CALL(o, terse_barrier(c));
    if (r == 1) terse__fabric_test_tamper(c->fabric, 1);
    o->u[0] = (uint64_t)terse_allreduce(c, x, 300001, NULL, TERSE_OP_SUM);
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    free(x);
    return 0;
}

Test(wire_auth, seal_gives_the_same_results_and_refuses_altered_chunks_tcp) {
    tr_job job = {"tcp", 2, 2000, 30, -1};
    tr_before_init = seal_on_0_encrypt_on_1;
    tr_out *o = tr_run(&job, encrypt_body, NULL);
    tr_before_init = NULL;
    unsetenv("TERSE_WIRE");
    cr_expect_eq(o[0].u[3], 1, "seal did not authenticate");
    for (int r = 0; r < 2; r++)
        cr_expect_eq(o[r].u[1], 0, "rank %d: %llu wrong elements under seal", r,
                     (unsigned long long)o[r].u[1]);
    cr_expect_eq(o[0].u[0], TERSE_ERR_AUTH, "rank 0 returned %llu: %s",
                 (unsigned long long)o[0].u[0], o[0].err);
    tr_release(o);
}

/* seal's primitive on one rank's fabric: the ciphertext is not the
 * plaintext, it opens back to it, and one flipped bit -- in the bytes, the
 * tag, the nonce's epoch or chunk -- makes it fail; so does the same chunk
 * replayed as another collective's, and keys from another token (which
 * cannot read it: what they open is refused, never handed over). */
#include "transport/fabric_impl.h"

Test(wire_auth, sealed_chunks_are_ciphertext_and_open_only_unaltered) {
    terse__fabric *f = NULL;
    cr_assert_eq(terse__fabric_open("tcp", 1, 0, 1, &f), TERSE_OK, "%s", terse_last_error());
    uint8_t nonce[TERSE__WIRE_NONCE] = {1, 2, 3};
    cr_assert_eq(terse__fabric_set_keys(f, "a-token-of-twenty-bytes", nonce, 1), TERSE_OK, "%s",
                 terse_last_error());
    enum { N = 5000 };
    uint8_t plain[N], sealed[N], tag[TERSE__WIRE_MAC], work[N];
    for (int i = 0; i < N; i++) plain[i] = (uint8_t)(i * 7);
    terse__fabric_req r = {0};
    r.peer = 0, r.is_send = 1, r.tag = 0x123456, r.len = N, r.epoch = 9;
    cr_assert(terse__fabric_seal(f, &r, 3, plain, N, sealed, tag));
    size_t same = 0;
    for (int i = 0; i < N; i++) same += sealed[i] == plain[i];
    cr_expect_lt(same, N / 50, "%zu of %d bytes travel in the clear", same, N);
    r.is_send = 0;
    memcpy(work, sealed, N);
    cr_expect(terse__fabric_open_sealed(f, &r, 3, work, N, tag));
    cr_expect_eq(memcmp(work, plain, N), 0, "opened bytes differ from the plaintext");
    memcpy(work, sealed, N);
    work[1234] ^= 1;
    cr_expect(!terse__fabric_open_sealed(f, &r, 3, work, N, tag), "a flipped byte opened");
    memcpy(work, sealed, N);
    cr_expect(!terse__fabric_open_sealed(f, &r, 4, work, N, tag), "another chunk index opened");
    r.epoch = 10;
    memcpy(work, sealed, N);
    cr_expect(!terse__fabric_open_sealed(f, &r, 3, work, N, tag), "another epoch opened");
    r.epoch = 9;
    r.tag = 0x123457;
    memcpy(work, sealed, N);
    cr_expect(!terse__fabric_open_sealed(f, &r, 3, work, N, tag),
              "the chunk opened as another collective's (a replay)");
    r.tag = 0x123456;
    terse__fabric *g = NULL;
    cr_assert_eq(terse__fabric_open("tcp", 1, 0, 1, &g), TERSE_OK, "%s", terse_last_error());
    cr_assert_eq(terse__fabric_set_keys(g, "another-token-of-20-b", nonce, 1), TERSE_OK, "%s",
                 terse_last_error());
    memcpy(work, sealed, N);
    cr_expect(!terse__fabric_open_sealed(g, &r, 3, work, N, tag), "another token's keys opened it");
    terse__fabric_close(g);
    memcpy(work, sealed, N);
    cr_expect(terse__fabric_open_sealed(f, &r, 3, work, N, tag), "the untouched chunk no longer opens");
    tag[0] ^= 1;
    memcpy(work, sealed, N);
    cr_expect(!terse__fabric_open_sealed(f, &r, 3, work, N, tag), "a flipped tag opened");
    terse__fabric_close(f);
}
