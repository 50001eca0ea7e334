/* The pipelined all-gather all-reduce (algos/coll/pipe_allreduce.c) over real
 * rank processes on shm and tcp;ofi_rxm, 2 to 8 ranks.
 *
 * With TERSE_PIPELINE_BYTES=4096 (pieces of 1024 floats, about ten of
 * them on this tensor), for every codec whose messages travel, each rank
 * checks over three steps (error feedback carried from step to step):
 *   - exact replay: its result is bitwise what the documented algorithm
 *     gives, recomputed in-process through the public codec API (each
 *     rank's pieces, coded by child codecs with the documented streams,
 *     decoded in rank order) -- so every rank also holds the same bits;
 *   - for the deterministic codecs, the result is bitwise the result of
 *     the same job with TERSE_PIPELINE_BYTES=0 (one whole message): the
 *     cut changes no bit;
 *   - exact byte counts: N - 1 copies of each of its messages, and 8 (N -
 *     1) bytes of digests (whole messages, on the ring: 8 (N - 1) of
 *     lengths);
 *   - terse_allreduce_algorithm names "gather-pipe" (topk, not cut:
 *     "gather").
 * Then: ranks with other specs never get TERSE_OK, a plugin that claims
 * fixed-size messages and writes a shorter one is refused, and a rank
 * killed mid-pipeline fails every survivor within the timeout. */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "algos/coll/coll.h"
#include "common/rng.h"
#include "compress/aggregate.h"
#include "ranks.h"
#include "terse_plugin.h"
#include "testutil.h"

#define ROWS 61u
#define COLS 173u /* 10553 elements: not a multiple of any bucket */
#define N_ELEM (ROWS * COLS)
#define TENSOR 11u
#define STEPS 3
#define PIECE_BYTES 4096u

static const struct pipe_case {
    const char *spec;
    int deterministic; /* the cut cannot change a bit */
} cases[] = {
    {"fp16", 1},         {"bf16", 1},
    {"int8", 1},         {"int8:bucket=64,ef=1", 1},
    {"qsgd", 0},         {"qsgd:bits=8,bucket=512,ef=1", 0},
    {"terngrad", 0},     {"sign:ef=1", 1},
    {"sign:bucket=128", 1}, {"vq", 1},
    {"topk:ratio=0.05,ef=1", 1}, {"topk:k=300", 1},
};
#define NCASES (sizeof cases / sizeof cases[0])

static void expect_finished(const tr_out *o, int N, const char *what) {
    for (int r = 0; r < N; r++)
        cr_assert(o[r].finished && o[r].status == 0, "%s: rank %d failed: %s", what, r, o[r].err);
}

static void rank_input(int q, int t, float *x) {
    tu_fill_gauss(x, N_ELEM, 3000 + 17 * (uint64_t)q + (uint64_t)t);
}

typedef struct {
    uint64_t sent, recv, framing;
} bytes_want;

/* Replay STEPS steps of the pipelined all-gather for N ranks into want
 * (alpha 1/N; the last step's result), and the bytes rank r moves in the
 * last step into *bw. 1 on success. piece_elems 0: one whole message. */
static int replay(const char *spec, int N, int r, size_t piece_elems, float *want,
                  bytes_want *bw) {
    terse_codec *cut = NULL;
    const terse__pieces *p = NULL;
    if (terse_codec_create(spec, ROWS, COLS, &cut) != TERSE_OK) return 0;
    if (terse__codec_pieces(cut, piece_elems, &p) != TERSE_OK) return 0;
    const size_t P = p ? p->count : 1;
    const int fixed = terse__codec_fixed_size(cut);
    /* codecs[q * P + s]: rank q's coder of piece s, kept across steps so
     * that its step is the collective's; e[q]: rank q's residual */
    terse_codec **codecs = calloc((size_t)N * P, sizeof *codecs);
    float *e = calloc((size_t)N * N_ELEM, sizeof(float));
    float *x = malloc(N_ELEM * sizeof(float)), *src = malloc(N_ELEM * sizeof(float));
    const size_t cap = p ? p->max_bound : terse_codec_bound(cut);
    uint8_t *msg = malloc(cap);
    int ok = codecs && e && x && src && msg;
    const int ef = strstr(spec, "ef=1") != NULL;
    for (size_t i = 0; ok && i < (size_t)N * P; i++) {
        const size_t s = i % P;
        const uint32_t q = (uint32_t)(i / P);
        if (p) {
            /* the child's spec is ef=0: error feedback is the parent's */
            ok = terse_codec_create(terse_codec_spec(p->child[s]), 1, p->len[s], &codecs[i]) ==
                     TERSE_OK &&
                 terse_codec_set_stream(codecs[i],
                                        terse__mix64(TENSOR ^ terse__mix64((uint64_t)s + 1)),
                                        q) == TERSE_OK;
        } else {
            /* the canonical spec (options such as qsgd's rounding follow
             * ef) with ef=0: error feedback is replayed here */
            char plain[320];
            snprintf(plain, sizeof plain, "%s", terse_codec_spec(cut));
            char *efp = strstr(plain, "ef=1");
            if (efp) efp[3] = '0';
            ok = terse_codec_create(plain, ROWS, COLS, &codecs[i]) == TERSE_OK &&
                 terse_codec_set_stream(codecs[i], TENSOR, q) == TERSE_OK;
        }
    }
    uint64_t total[TR_MAX_RANKS]; /* bytes of rank q's messages, last step */
    for (int t = 0; ok && t < STEPS; t++) {
        for (int q = 0; ok && q < N; q++) {
            total[q] = 0;
            rank_input(q, t, x);
            float *eq = e + (size_t)q * N_ELEM;
            for (size_t i = 0; i < N_ELEM; i++) {
                if (ef) eq[i] += x[i];
                src[i] = ef ? eq[i] : x[i];
            }
            for (size_t s = 0; ok && s < P; s++) {
                const size_t off = p ? p->off[s] : 0;
                terse_codec *k = codecs[(size_t)q * P + s];
                size_t len = 0;
                ok = terse_encode(k, src + off, msg, cap, &len) == TERSE_OK;
                if (ok && ef) ok = terse_decode(k, msg, len, eq + off, -1.0f, 1) == TERSE_OK;
                if (ok) ok = terse_decode(k, msg, len, want + off, 1.0f / (float)N, q > 0) ==
                             TERSE_OK;
                total[q] += len;
            }
        }
    }
    /* pipelined, every rank sends each peer its messages directly; whole
     * messages (one piece, or where the requests do not fit: 8 ranks
     * without fixed sizes) take the ring, which forwards every block but
     * its successor's, after the sizes' all-gather */
    memset(bw, 0, sizeof *bw);
    const int direct = P > 1 && terse__pipe_fits(N, fixed);
    for (int q = 0; ok && q < N; q++) {
        if (q != r) bw->recv += total[q];
        if (direct && q == r) bw->sent += (uint64_t)(N - 1) * total[q];
        if (!direct && q != (r + 1) % N) bw->sent += total[q];
    }
    bw->framing = (uint64_t)(N - 1) * 8u * (fixed || !direct ? 1u : 1u + P);
    for (size_t i = 0; codecs && i < (size_t)N * P; i++) terse_codec_free(codecs[i]);
    free(codecs);
    free(e);
    free(x);
    free(src);
    free(msg);
    terse_codec_free(cut);
    return ok;
}

/* hash[i]: result bits; u[i]: replay matched; u[16 + i]: bytes matched;
 * u[32 + i]: algorithm name as expected. */
static int pipe_body(terse_comm *c, tr_out *o, const void *arg) {
    const size_t piece_elems = *(const size_t *)arg;
    const int N = terse_comm_size(c), r = terse_comm_rank(c);
    float *y = malloc(N_ELEM * sizeof(float)), *want = malloc(N_ELEM * sizeof(float));
    for (size_t ci = 0; ci < NCASES; ci++) {
        const char *spec = cases[ci].spec;
        terse_codec *codec = NULL;
        TR_CALL(o, terse_codec_create(spec, ROWS, COLS, &codec));
        terse_codec_set_stream(codec, TENSOR, (uint32_t)r);
        const char *algo = terse_allreduce_algorithm(c, codec, N_ELEM);
        const int cut = piece_elems && strncmp(spec, "topk", 4) != 0;
        o->u[32 + ci] = !strcmp(algo, cut ? "gather-pipe" : "gather");
        terse_comm_stats st = TERSE_COMM_STATS_INIT;
        for (int t = 0; t < STEPS; t++) {
            rank_input(r, t, y);
            terse_comm_reset_stats(c);
            TR_CALL(o, terse_allreduce(c, y, N_ELEM, codec, TERSE_OP_AVG));
            terse_comm_get_stats(c, &st);
        }
        o->hash[ci] = tr_hash(y, N_ELEM * sizeof(float));
        bytes_want bw = {0, 0, 0};
        o->u[ci] = (uint64_t)(replay(spec, N, r, piece_elems, want, &bw) &&
                              memcmp(want, y, N_ELEM * sizeof(float)) == 0);
        o->u[16 + ci] = st.payload_bytes_sent == bw.sent && st.payload_bytes_recv == bw.recv &&
                        st.wire_bytes_sent == bw.sent + bw.framing &&
                        st.wire_bytes_recv == bw.recv + bw.framing;
        if (!o->u[16 + ci] && !o->err[0])
            snprintf(o->err, sizeof o->err,
                     "%s: sent %llu/%llu recv %llu/%llu (payload/wire), want %llu %llu + %llu",
                     spec, (unsigned long long)st.payload_bytes_sent,
                     (unsigned long long)st.wire_bytes_sent,
                     (unsigned long long)st.payload_bytes_recv,
                     (unsigned long long)st.wire_bytes_recv, (unsigned long long)bw.sent,
                     (unsigned long long)bw.recv, (unsigned long long)bw.framing);
        terse_codec_free(codec);
    }
    free(y);
    free(want);
    return 0;
}

static tr_out *run_job(const char *provider, int N, size_t piece_bytes) {
    static size_t elems;
    elems = piece_bytes / sizeof(float);
    char v[32];
    snprintf(v, sizeof v, "%zu", piece_bytes);
    setenv("TERSE_PIPELINE_BYTES", v, 1);
    tr_job job = {provider, N, 20000, 120, -1};
    tr_out *o = tr_run(&job, pipe_body, &elems);
    unsetenv("TERSE_PIPELINE_BYTES");
    expect_finished(o, N, piece_bytes ? "pipelined" : "whole messages");
    return o;
}

static void check_job(const tr_out *o, const char *provider, int N, const char *what) {
    for (size_t ci = 0; ci < NCASES; ci++)
        for (int r = 0; r < N; r++) {
            cr_expect_eq(o[r].u[ci], 1, "%s %s on %s x%d: rank %d's result is not the replay",
                         what, cases[ci].spec, provider, N, r);
            cr_expect_eq(o[r].hash[ci], o[0].hash[ci], "%s %s on %s x%d: rank %d differs",
                         what, cases[ci].spec, provider, N, r);
            cr_expect_eq(o[r].u[16 + ci], 1, "%s %s on %s x%d: rank %d's byte counts: %s", what,
                         cases[ci].spec, provider, N, r, o[r].err);
            cr_expect_eq(o[r].u[32 + ci], 1, "%s %s on %s x%d: rank %d: unexpected algorithm",
                         what, cases[ci].spec, provider, N, r);
        }
}

static void run_pipe(const char *provider, int N) {
    tr_out *cutj = run_job(provider, N, PIECE_BYTES);
    check_job(cutj, provider, N, "pipelined");
    tr_out *whole = run_job(provider, N, 0);
    check_job(whole, provider, N, "whole");
    for (size_t ci = 0; ci < NCASES; ci++)
        if (cases[ci].deterministic)
            cr_expect_eq(cutj[0].hash[ci], whole[0].hash[ci],
                         "%s on %s x%d: the pipelined result is not bitwise the whole-message "
                         "result",
                         cases[ci].spec, provider, N);
    tr_release(cutj);
    tr_release(whole);
}

Test(pipe_allreduce, every_codec_two_ranks_tcp, .timeout = 240) { run_pipe("tcp", 2); }
Test(pipe_allreduce, every_codec_three_ranks_shm, .timeout = 240) { run_pipe("shm", 3); }
Test(pipe_allreduce, every_codec_five_ranks_tcp, .timeout = 240) { run_pipe("tcp", 5); }
Test(pipe_allreduce, every_codec_eight_ranks_shm, .timeout = 240) { run_pipe("shm", 8); }

/* The cut itself: int8's 512-element buckets, pieces of 2 buckets. */
Test(pieces, int8_pieces_hold_whole_buckets) {
    terse_codec *c = NULL;
    cr_assert_eq(terse_codec_create("int8", ROWS, COLS, &c), TERSE_OK);
    const terse__pieces *p = NULL;
    cr_assert_eq(terse__codec_pieces(c, 1024, &p), TERSE_OK);
    cr_assert_not_null(p);
    /* 10553 = 20 x 512 + 313: 21 buckets, 11 pieces, the last of 1 bucket */
    cr_expect_eq(p->count, 11);
    cr_expect_eq(terse__codec_piece_count(c, 1024), 11);
    for (size_t s = 0; s < 10; s++) {
        cr_expect_eq(p->off[s], 1024 * s);
        cr_expect_eq(p->len[s], 1024);
    }
    cr_expect_eq(p->len[10], 313);
    cr_expect(p->child[0] == p->child[9] && p->child[9] != p->child[10]);
    /* 600 elements: still whole buckets, one per piece */
    cr_assert_eq(terse__codec_pieces(c, 600, &p), TERSE_OK);
    cr_expect_eq(p->count, 21);
    /* one piece for the whole tensor: not cut */
    cr_assert_eq(terse__codec_pieces(c, 1 << 20, &p), TERSE_OK);
    cr_expect_null(p);
    cr_expect_eq(terse__codec_piece_count(c, 1 << 20), 1);
    terse_codec_free(c);
    /* topk chooses k over what it sees: never cut into pieces */
    cr_assert_eq(terse_codec_create("topk:ratio=0.01", ROWS, COLS, &c), TERSE_OK);
    cr_assert_eq(terse__codec_pieces(c, 1024, &p), TERSE_OK);
    cr_expect_null(p);
    terse_codec_free(c);
}

/* What the traits say of the cut (terse-bench's model reads them). */
Test(pieces, traits_describe_the_cut) {
    static const struct {
        const char *spec;
        int fixed;
        size_t align;
        int options;
    } want[] = {
        {"int8", 1, 512, 0},     {"int8:bucket=64", 1, 64, 0}, {"fp16", 1, 1, 0},
        {"topk:ratio=0.01", 0, 1, 1}, {"qsgd", 1, 512, 0},        {"powersgd:rank=2", 0, 0, 0},
        {"randk:ratio=0.1", 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        terse_codec *c = NULL;
        cr_assert_eq(terse_codec_create(want[i].spec, 100, 100, &c), TERSE_OK, "%s",
                     want[i].spec);
        terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
        cr_assert_eq(terse_codec_get_traits(c, &t), TERSE_OK);
        cr_expect_eq(t.fixed_size, want[i].fixed, "%s: fixed_size %d", want[i].spec,
                     t.fixed_size);
        cr_expect_eq(t.segment_align, want[i].align, "%s: segment_align %zu", want[i].spec,
                     t.segment_align);
        cr_expect_eq(t.segment_options, want[i].options, "%s: segment_options %d",
                     want[i].spec, t.segment_options);
        terse_codec_free(c);
    }
    /* a caller built against 0.1.0's smaller struct: the new fields are
     * not written */
    terse_codec *c = NULL;
    cr_assert_eq(terse_codec_create("int8", 100, 100, &c), TERSE_OK);
    terse_codec_traits t;
    memset(&t, 0x5a, sizeof t);
    t.size = offsetof(terse_codec_traits, fixed_size);
    cr_assert_eq(terse_codec_get_traits(c, &t), TERSE_OK);
    cr_expect_eq(t.segment_align, (size_t)0x5a5a5a5a5a5a5a5aull);
    terse_codec_free(c);
}

/* ------------------------------------------------------------ refusals */


static void check_mismatch(const tr_mismatch *m, const char *provider, int N) {
    setenv("TERSE_PIPELINE_BYTES", "4096", 1);
    tr_job job = {provider, N, 3000, 60, -1};
    tr_out *o = tr_run(&job, tr_mismatch_body, m);
    unsetenv("TERSE_PIPELINE_BYTES");
    /* another codec is named by the call descriptors (comm_desc.c); the same
     * codec cut otherwise is found in the data */
    size_t a = strcspn(m->spec, ":"), b = strcspn(m->odd_spec, ":");
    terse_status want = a == b && !strncmp(m->spec, m->odd_spec, a) ? TERSE_ERR_CORRUPT
                                                                     : TERSE_ERR_CODEC_MISMATCH;
    for (int r = 0; r < N; r++) {
        if (getenv("TR_VERBOSE")) fprintf(stderr, "rank %d: %s\n", r, o[r].err);
        cr_expect_eq(o[r].u[0], want, "%s vs %s: rank %d returned %s: %s", m->spec,
                     m->odd_spec, r, terse_status_name((terse_status)o[r].u[0]), o[r].err);
    }
    tr_release(o);
}

/* Other buckets: other sizes and another cut (fixed-size: the digests). */
Test(pipe_allreduce, ranks_with_other_buckets_never_get_ok, .timeout = 120) {
    static const tr_mismatch m = {"int8:bucket=128", "int8:bucket=64", 1, ROWS, COLS};
    check_mismatch(&m, "shm", 3);
    check_mismatch(&m, "tcp", 2);
}

/* Same sizes, other codecs: qsgd 4 bits against terngrad's 2 would
 * differ in size; bf16 against fp16 do not -- the digest refuses. */
Test(pipe_allreduce, same_sizes_other_codec_never_get_ok, .timeout = 120) {
    static const tr_mismatch m = {"fp16", "bf16", 0, ROWS, COLS};
    check_mismatch(&m, "tcp", 3);
}

/* topk (lengths travel): k=300 against k=301. */
Test(pipe_allreduce, a_rank_whose_k_differs_is_refused_everywhere, .timeout = 120) {
    static const tr_mismatch m = {"topk:k=300", "topk:k=301", 1, ROWS, COLS};
    check_mismatch(&m, "shm", 3);
}

/* A plugin that sets TERSE_CODEC_FIXED_SIZE and writes one float less
 * than its bound whenever x[0] < 0. */
typedef struct {
    size_t n;
} tl_codec;
static terse_status tl_create(terse_spec *spec, size_t rows, size_t cols, void **self,
                              char *canon, size_t cap) {
    (void)spec;
    (void)cap;
    tl_codec *c = malloc(sizeof *c);
    if (!c) return TERSE_ERR_NOMEM;
    c->n = rows * cols;
    canon[0] = '\0';
    *self = c;
    return TERSE_OK;
}
static void tl_destroy(void *self) { free(self); }
static size_t tl_bound(const void *self) { return 4 * ((const tl_codec *)self)->n; }
static terse_status tl_encode(void *self, const terse_encode_ctx *ctx, const float *x,
                              uint8_t *p, size_t cap, size_t *len) {
    (void)ctx;
    (void)cap;
    const tl_codec *c = self;
    memcpy(p, x, 4 * c->n);
    *len = 4 * c->n - (x[0] < 0 ? 4 : 0);
    return TERSE_OK;
}
static size_t tl_align(const void *self) {
    (void)self;
    return 1;
}
static terse_status tl_decode(void *self, const uint8_t *p, size_t len, float *dst, float alpha,
                              int acc) {
    const tl_codec *c = self;
    for (size_t i = 0; i < c->n; i++) {
        float v = 0;
        if (4 * i + 4 <= len) memcpy(&v, p + 4 * i, 4);
        dst[i] = (acc ? dst[i] : 0.0f) + alpha * v;
    }
    return TERSE_OK;
}

static int liar_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    terse_codec_ops ops;
    memset(&ops, 0, sizeof ops);
    ops.size = sizeof ops;
    ops.id = 0x9201;
    ops.name = "tliar";
    ops.flags = TERSE_CODEC_FIXED_SIZE;
    ops.create = tl_create;
    ops.destroy = tl_destroy;
    ops.bound = tl_bound;
    ops.encode = tl_encode;
    ops.decode = tl_decode;
    ops.segment_align = tl_align;
    TR_CALL(o, terse_codec_register(&ops));
    const int r = terse_comm_rank(c);
    terse_codec *codec = NULL;
    /* 3000 elements: three pieces of 1024 (or fewer) */
    TR_CALL(o, terse_codec_create("tliar", 1, 3000, &codec));
    float y[3000];
    for (int i = 0; i < 3000; i++) y[i] = (float)(i + 1);
    o->hash[0] = !strcmp(terse_allreduce_algorithm(c, codec, 3000), "gather-pipe");
    /* first a call whose messages are as declared: exact sums */
    TR_CALL(o, terse_allreduce(c, y, 3000, codec, TERSE_OP_SUM));
    o->u[1] = y[2999] == 6000.0f;
    for (int i = 0; i < 3000; i++) y[i] = r == 1 ? -1.0f : 1.0f;
    o->u[0] = (uint64_t)terse_allreduce(c, y, 3000, codec, TERSE_OP_SUM);
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    terse_codec_free(codec);
    return 0;
}

Test(pipe_allreduce, a_plugin_whose_fixed_size_message_is_short_is_refused, .timeout = 60) {
    setenv("TERSE_PIPELINE_BYTES", "4096", 1);
    tr_job job = {"tcp", 2, 3000, 60, -1};
    tr_out *o = tr_run(&job, liar_body, NULL);
    unsetenv("TERSE_PIPELINE_BYTES");
    expect_finished(o, 2, "liar");
    cr_expect_eq(o[0].hash[0], 1, "tliar does not take the pipelined path");
    cr_expect_eq(o[0].u[1], 1, "the honest call's sum is wrong");
    /* rank 1 wrote the short message: INTERNAL naming the codec; rank 0
     * never gets TERSE_OK (its peer's call failed: lost or timed out) */
    cr_expect_eq(o[1].u[0], TERSE_ERR_INTERNAL, "rank 1 returned %s: %s",
                 terse_status_name((terse_status)o[1].u[0]), o[1].err);
    cr_expect(strstr(o[1].err, "tliar") && strstr(o[1].err, "TERSE_CODEC_FIXED_SIZE"), "%s",
              o[1].err);
    cr_expect_neq(o[0].u[0], TERSE_OK, "rank 0 returned TERSE_OK");
    tr_release(o);
}

/* ------------------------------------------------------------ a killed rank */

static int kill_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const size_t n = 1u << 21;
    terse_codec *codec = NULL;
    TR_CALL(o, terse_codec_create("int8:ef=1", 1, n, &codec));
    float *y = malloc(n * sizeof(float));
    tu_fill_gauss(y, n, 5);
    TR_CALL(o, terse_allreduce(c, y, n, codec, TERSE_OP_AVG));
    o->hash[1] = !strcmp(terse_allreduce_algorithm(c, codec, n), "gather-pipe");
    tr_last_rank_dies_in(c, 150);
    int failed = tr_allreduce_until_failure(c, o, y, n, codec, TERSE_OP_AVG, 5000, NULL);
    free(y);
    terse_codec_free(codec);
    return failed ? 0
                  : tr_fail(o, TERSE_OK, "5000 all-reduces succeeded although a rank was killed");
}

static void check_killed(const char *provider) {
    const int N = 3, timeout_ms = 3000;
    tr_job job = {provider, N, timeout_ms, 30, N - 1};
    if (!strcmp(provider, "tcp")) tr_known_segv = TR_RXM_TEARDOWN_SEGV;
    tr_out *o = tr_run(&job, kill_body, NULL);
    tr_known_segv = NULL;
    for (int r = 0; r < N - 1; r++) {
        if (!o[r].finished) continue; /* the known crash: tr_run warned */
        terse_status s = (terse_status)o[r].u[0];
        cr_expect_eq(o[r].hash[1], 1, "%s: survivor %d: not the pipelined path", provider, r);
        cr_expect(s == TERSE_ERR_PEER_LOST || s == TERSE_ERR_TIMEOUT,
                  "%s: survivor %d got %s (%s)", provider, r, terse_status_name(s), o[r].err);
        cr_expect_leq(o[r].val[0], timeout_ms + 1500.0, "%s: survivor %d took %.0f ms", provider,
                      r, o[r].val[0]);
        /* shm's spin on a region lock: the watchdog names the region and
         * the lost ranks the store has reported by then, which may not yet
         * include rank 2 */
        if (strstr(o[r].err, TR_SHM_LOCK_SPIN) && !strstr(o[r].err, "rank 2")) {
            fprintf(stderr, "WARNING: KNOWN LIMITATION: %s: survivor %d spun on the dead rank's "
                            "shm region lock; the watchdog's TIMEOUT names no rank\n",
                    provider, r);
            continue;
        }
        cr_expect(strstr(o[r].err, "rank 2"), "%s: survivor %d's sentence does not name rank 2: %s",
                  provider, r, o[r].err);
    }
    tr_release(o);
}

Test(pipe_allreduce, killed_rank_fails_every_survivor_tcp) { check_killed("tcp"); }
Test(pipe_allreduce, killed_rank_fails_every_survivor_shm) { check_killed("shm"); }

/* A malformed TERSE_PIPELINE_BYTES fails init with a sentence naming it. */
Test(pipe_allreduce, a_malformed_piece_size_is_refused_at_init) {
    static const char *const bad[] = {"12q", "-1", "0x10", "2000000000000000"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("TERSE_PIPELINE_BYTES", bad[i], 1);
        terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
        cfg.rank = 0, cfg.nranks = 1, cfg.provider = "shm";
        terse_comm *c = NULL;
        terse_status s = terse_comm_init(&cfg, &c);
        unsetenv("TERSE_PIPELINE_BYTES");
        cr_expect_eq(s, TERSE_ERR_INVALID, "'%s': %s", bad[i], terse_status_name(s));
        cr_expect(strstr(terse_last_error(), "TERSE_PIPELINE_BYTES"), "'%s': %s", bad[i],
                  terse_last_error());
        cr_expect_null(c);
        terse_comm_free(c);
    }
}
