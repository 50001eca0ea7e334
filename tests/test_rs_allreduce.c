/* The compressed reduce-scatter all-reduce (algos/coll/rs_allreduce.c) and the
 * codec table's aggregation entries (terse_plugin.h), over real rank
 * processes on shm and tcp;ofi_rxm, 2 to 8 ranks (more processes than
 * cores is fine).
 *
 * For every codec whose messages travel (fp16 ... vq), with
 * TERSE_COMPRESSED_ALGO=rs, each rank checks:
 *   - exact replay: its result is bitwise what the documented algorithm
 *     gives, recomputed in-process through the public codec API (each
 *     rank's pieces, decoded in rank order, the owner's re-encode, decoded
 *     with alpha 1/N) -- so every rank also holds the same bits;
 *   - the float64 reference: ||y - mean|| <= beta (1 + beta) sum ||x_r|| /
 *     N + beta ||sum x_r|| / N, beta being the codec's per-message bound
 *     (each rank's own codec error, then the re-encode's on the sum);
 *   - exact byte counts: the N - 1 pieces it sent and the N - 1 owner
 *     messages it forwarded, the (N - 1) (8 N + 16) bytes of lengths and
 *     codec digests.
 * A rank killed in a loop of reduce-scatters fails every survivor in time,
 * with its codec's residual as before the failed call (tcp and shm).
 * Plugins written here check that a summable plugin with a view travels
 * the ring, one without a view is all-gathered, and a cuttable plugin
 * takes the reduce-scatter. */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "common/rng.h"
#include "compress/aggregate.h"
#include "ranks.h"
#include "terse_plugin.h"
#include "testutil.h"

#define ROWS 61u
#define COLS 173u /* 10553 elements: not a multiple of any bucket */
#define N_ELEM (ROWS * COLS)
#define TENSOR 7u

static const struct rs_case {
    const char *spec;
    double beta; /* per-message relative error bound (0: terngrad, from the data) */
} rs_cases[] = {
    {"fp16", 0x1p-11},
    {"bf16", 0x1p-8},
    {"int8", 0.016},
    {"int8:bucket=64", 0.016},
    {"qsgd", 1.8},
    {"qsgd:bits=8,bucket=512", 0.178},
    {"terngrad", 0.0},
    {"sign", 1.0},
    {"sign:bucket=128", 1.0},
    {"topk:ratio=0.05", 0.975},
    {"topk:k=300", 0.986},
    {"vq", 0.75},
};
#define NRS (sizeof rs_cases / sizeof rs_cases[0])

/* Every rank ran its body to the end without a failing call. */
static void expect_finished(const tr_out *o, int N, const char *what) {
    for (int r = 0; r < N; r++)
        cr_assert(o[r].finished && o[r].status == 0, "%s: rank %d failed: %s", what, r, o[r].err);
}

static void rank_input(int q, float *x) { tu_fill_gauss(x, N_ELEM, 900 + (uint64_t)q); }

/* terngrad's bound for a vector: 1.5 sqrt(sum_b s_b ||x_b||_1) / ||x||. */
static double terngrad_abs(const float *x, size_t n) {
    double acc = 0;
    for (size_t b = 0; b < n; b += 512) {
        size_t e = b + 512 < n ? b + 512 : n;
        double s = 0, l1 = 0;
        for (size_t i = b; i < e; i++) {
            if (fabs(x[i]) > s) s = fabs(x[i]);
            l1 += fabs(x[i]);
        }
        acc += s * l1;
    }
    return 1.5 * sqrt(acc);
}

typedef struct {
    uint64_t sent, recv, framing; /* payload bytes of rank r; framing both ways */
} bytes_want;

/* Replay the reduce-scatter for N ranks into want (alpha 1/N); the bytes
 * rank r should have moved into *bw. 1 on success. */
static int replay(const char *spec, int N, int r, float *want, bytes_want *bw) {
    terse_codec *cut = NULL;
    const terse__segments *g = NULL;
    if (terse_codec_create(spec, ROWS, COLS, &cut) != TERSE_OK) return 0;
    if (terse__codec_segments(cut, (uint32_t)N, 0, &g) != TERSE_OK || !g) {
        terse_codec_free(cut);
        return 0;
    }
    float *x = malloc((size_t)N * N_ELEM * sizeof(float));
    float *sum = malloc(N_ELEM * sizeof(float));
    size_t cap = g->max_bound;
    uint8_t *msg = malloc(cap);
    int ok = x && sum && msg;
    for (int q = 0; ok && q < N; q++) rank_input(q, x + (size_t)q * N_ELEM);
    memset(bw, 0, sizeof *bw);
    for (int s = 0; ok && s < N; s++) {
        terse_codec *child = NULL;
        ok = terse_codec_create(terse_codec_spec(g->child[s]), 1, g->len[s], &child) == TERSE_OK;
        const uint64_t tensor = terse__mix64(TENSOR ^ terse__mix64((uint64_t)s + 1));
        for (int q = 0; ok && q < N; q++) {
            /* a fresh codec: step 0, as the collective's first call */
            terse_codec *cq = NULL;
            size_t len = 0;
            ok = terse_codec_create(terse_codec_spec(g->child[s]), 1, g->len[s], &cq) ==
                     TERSE_OK &&
                 terse_codec_set_stream(cq, tensor, (uint32_t)q) == TERSE_OK &&
                 terse_encode(cq, x + (size_t)q * N_ELEM + g->off[s], msg, cap, &len) ==
                     TERSE_OK &&
                 terse_decode(cq, msg, len, sum, 1.0f, q > 0) == TERSE_OK;
            terse_codec_free(cq);
            if (q == r && s != r) bw->sent += len;
            if (s == r && q != r) bw->recv += len;
        }
        size_t olen = 0;
        ok = ok && terse_codec_set_stream(child, tensor, (uint32_t)s | 0x80000000u) == TERSE_OK &&
             terse_encode(child, sum, msg, cap, &olen) == TERSE_OK &&
             terse_decode(child, msg, olen, want + g->off[s], 1.0f / (float)N, 0) == TERSE_OK;
        if (s != (r + 1) % N) bw->sent += olen;
        if (s != r) bw->recv += olen;
        terse_codec_free(child);
    }
    bw->framing = (uint64_t)(N - 1) * (8u * (uint64_t)N + 16u);
    free(x);
    free(sum);
    free(msg);
    terse_codec_free(cut);
    return ok;
}

/* hash[i]: result bits; val[i]: error over bound; u[i]: replay matched;
 * u[32 + i]: bytes matched. */
static int rs_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int N = terse_comm_size(c), r = terse_comm_rank(c);
    float *y = malloc(N_ELEM * sizeof(float)), *x = malloc(N_ELEM * sizeof(float));
    float *want = malloc(N_ELEM * sizeof(float));
    double *mean = malloc(N_ELEM * sizeof(double));
    for (size_t ci = 0; ci < NRS; ci++) {
        const struct rs_case *k = &rs_cases[ci];
        terse_codec *codec = NULL;
        TR_CALL(o, terse_codec_create(k->spec, ROWS, COLS, &codec));
        terse_codec_set_stream(codec, TENSOR, (uint32_t)r);
        rank_input(r, y);
        terse_comm_reset_stats(c);
        TR_CALL(o, terse_allreduce(c, y, N_ELEM, codec, TERSE_OP_AVG));
        terse_comm_stats st = TERSE_COMM_STATS_INIT;
        terse_comm_get_stats(c, &st);
        o->hash[ci] = tr_hash(y, N_ELEM * sizeof(float));

        bytes_want bw = {0, 0, 0};
        o->u[ci] = (uint64_t)(replay(k->spec, N, r, want, &bw) &&
                              memcmp(want, y, N_ELEM * sizeof(float)) == 0);
        o->u[32 + ci] = st.payload_bytes_sent == bw.sent && st.payload_bytes_recv == bw.recv &&
                        st.wire_bytes_sent == bw.sent + bw.framing &&
                        st.wire_bytes_recv == bw.recv + bw.framing;
        if (!o->u[32 + ci] && !o->err[0])
            snprintf(o->err, sizeof o->err,
                     "%s: sent %llu/%llu recv %llu/%llu (payload/wire), want %llu %llu + %llu",
                     k->spec, (unsigned long long)st.payload_bytes_sent,
                     (unsigned long long)st.wire_bytes_sent,
                     (unsigned long long)st.payload_bytes_recv,
                     (unsigned long long)st.wire_bytes_recv, (unsigned long long)bw.sent,
                     (unsigned long long)bw.recv, (unsigned long long)bw.framing);

        memset(mean, 0, N_ELEM * sizeof(double));
        double own = 0; /* sum_r beta_r ||x_r|| */
        for (int q = 0; q < N; q++) {
            rank_input(q, x);
            for (size_t i = 0; i < N_ELEM; i++) mean[i] += x[i];
            own += k->beta > 0 ? k->beta * tu_norm2(x, N_ELEM) : terngrad_abs(x, N_ELEM);
        }
        double total = 0, err = 0;
        for (size_t i = 0; i < N_ELEM; i++) {
            x[i] = (float)mean[i];
            total += mean[i] * mean[i];
            mean[i] /= N;
        }
        total = sqrt(total);
        /* the re-encode's bound on the sum, which lies within own of the
         * true sum: beta (||sum|| + own); terngrad's from the true sum, with
         * the same slack */
        double beta_sum = k->beta > 0 ? k->beta : terngrad_abs(x, N_ELEM) / total;
        double bound = (own + beta_sum * (total + own)) / N + 1e-5 * total / N;
        for (size_t i = 0; i < N_ELEM; i++) err += (y[i] - mean[i]) * (y[i] - mean[i]);
        o->val[ci] = sqrt(err) / bound;
        terse_codec_free(codec);
    }
    free(y);
    free(x);
    free(want);
    free(mean);
    return 0;
}

static void run_rs(const char *provider, int N) {
    setenv("TERSE_COMPRESSED_ALGO", "rs", 1);
    tr_job job = {provider, N, 20000, 120, -1};
    tr_out *o = tr_run(&job, rs_body, NULL);
    unsetenv("TERSE_COMPRESSED_ALGO");
    expect_finished(o, N, "every codec");
    for (size_t ci = 0; ci < NRS; ci++) {
        if (getenv("TR_VERBOSE"))
            fprintf(stderr, "%-24s %s x%d: error/bound %.3g replay %d bytes %d\n",
                    rs_cases[ci].spec, provider, N, o[0].val[ci], (int)o[0].u[ci],
                    (int)o[0].u[32 + ci]);
        for (int r = 0; r < N; r++) {
            cr_expect_eq(o[r].u[ci], 1,
                         "%s on %s x%d: rank %d's result is not the replayed reduce-scatter",
                         rs_cases[ci].spec, provider, N, r);
            cr_expect_eq(o[r].hash[ci], o[0].hash[ci], "%s on %s x%d: rank %d differs from rank 0",
                         rs_cases[ci].spec, provider, N, r);
            cr_expect_leq(o[r].val[ci], 1.0, "%s on %s x%d: rank %d's error is %.3g x its bound",
                          rs_cases[ci].spec, provider, N, r, o[r].val[ci]);
            cr_expect_eq(o[r].u[32 + ci], 1, "%s on %s x%d: rank %d's byte counts: %s",
                         rs_cases[ci].spec, provider, N, r, o[r].err);
        }
    }
    tr_release(o);
}

Test(rs_allreduce, every_codec_two_ranks_tcp, .timeout = 200) { run_rs("tcp", 2); }
Test(rs_allreduce, every_codec_three_ranks_shm, .timeout = 200) { run_rs("shm", 3); }
Test(rs_allreduce, every_codec_four_ranks_tcp, .timeout = 200) { run_rs("tcp", 4); }
Test(rs_allreduce, every_codec_six_ranks_shm, .timeout = 200) { run_rs("shm", 6); }
Test(rs_allreduce, every_codec_eight_ranks_shm, .timeout = 200) { run_rs("shm", 8); }
Test(rs_allreduce, every_codec_eight_ranks_tcp, .timeout = 200) { run_rs("tcp", 8); }

/* ------------------------------------------------------------ plugins */

/* Test plugins, all fp32 underneath, so sums of small integers are exact:
 *   tplain   u32 magic, then n fp32; not summable; cuttable (align 1)
 *   tsum     u32 count, 4 zero bytes, then n fp32; summable with a view
 *   tsumnov  tsum's messages, summable flag but no view (terse cannot know
 *            where the values are: all-gathered)
 *   tround   two rounds: the first half of x, then the second half */
#define TP_MAGIC 0x4e4c5054u
typedef struct {
    size_t n;
} tp_codec;

static terse_status tp_create(terse_spec *spec, size_t rows, size_t cols, void **self,
                              char *canon, size_t cap) {
    (void)spec;
    (void)cap;
    tp_codec *c = malloc(sizeof *c);
    if (!c) return TERSE_ERR_NOMEM;
    c->n = rows * cols;
    canon[0] = '\0';
    *self = c;
    return TERSE_OK;
}
static void tp_destroy(void *self) { free(self); }
static size_t tplain_bound(const void *self) { return 4 + 4 * ((const tp_codec *)self)->n; }
static size_t tsum_bound(const void *self) { return 8 + 4 * ((const tp_codec *)self)->n; }

static terse_status tplain_encode(void *self, const terse_encode_ctx *ctx, const float *x,
                                  uint8_t *p, size_t cap, size_t *len) {
    (void)ctx;
    (void)cap;
    const tp_codec *c = self;
    uint32_t m = TP_MAGIC;
    memcpy(p, &m, 4);
    memcpy(p + 4, x, 4 * c->n);
    *len = 4 + 4 * c->n;
    return TERSE_OK;
}

static terse_status put_floats(const tp_codec *c, const uint8_t *src, float *dst, float alpha,
                               int acc) {
    for (size_t i = 0; i < c->n; i++) {
        float v;
        memcpy(&v, src + 4 * i, 4);
        dst[i] = (acc ? dst[i] : 0.0f) + alpha * v;
    }
    return TERSE_OK;
}

static terse_status tplain_decode(void *self, const uint8_t *p, size_t len, float *dst,
                                  float alpha, int acc) {
    const tp_codec *c = self;
    uint32_t m;
    if (len != 4 + 4 * c->n) return terse_plugin_error(TERSE_ERR_CORRUPT, "tplain: length");
    memcpy(&m, p, 4);
    if (m != TP_MAGIC) return terse_plugin_error(TERSE_ERR_CORRUPT, "tplain: magic");
    return put_floats(c, p + 4, dst, alpha, acc);
}

static size_t tplain_align(const void *self) {
    (void)self;
    return 1;
}

static terse_status tsum_encode(void *self, const terse_encode_ctx *ctx, const float *x,
                                uint8_t *p, size_t cap, size_t *len) {
    (void)ctx;
    (void)cap;
    const tp_codec *c = self;
    uint32_t m = (uint32_t)c->n;
    memcpy(p, &m, 4);
    memset(p + 4, 0, 4);
    memcpy(p + 8, x, 4 * c->n);
    *len = 8 + 4 * c->n;
    return TERSE_OK;
}

static terse_status tsum_decode(void *self, const uint8_t *p, size_t len, float *dst, float alpha,
                                int acc) {
    const tp_codec *c = self;
    uint32_t m;
    if (len != 8 + 4 * c->n) return terse_plugin_error(TERSE_ERR_CORRUPT, "tsum: length");
    memcpy(&m, p, 4);
    if (m != (uint32_t)c->n) return terse_plugin_error(TERSE_ERR_CORRUPT, "tsum: count");
    return put_floats(c, p + 8, dst, alpha, acc);
}

static terse_status tsum_view(const void *self, const uint8_t *p, size_t len,
                              terse_summable_view *v) {
    (void)p;
    (void)len;
    v->values_off = 8;
    v->count = ((const tp_codec *)self)->n;
    return TERSE_OK;
}

static unsigned tround_rounds(const void *self) {
    (void)self;
    return 2;
}

static terse_status tround_vector(void *self, const terse_round_ctx *ctx, unsigned r, float *x,
                                  float **vec, size_t *count) {
    (void)ctx;
    const tp_codec *c = self;
    size_t half = c->n / 2;
    *vec = r == 0 ? x : x + half;
    *count = r == 0 ? half : c->n - half;
    return TERSE_OK;
}

static terse_status tround_finish(void *self, const terse_round_ctx *ctx, float *x, float alpha) {
    (void)ctx;
    const tp_codec *c = self;
    for (size_t i = 0; i < c->n; i++) x[i] *= alpha;
    return TERSE_OK;
}

static void register_plugins(void) {
    terse_codec_ops ops;
    memset(&ops, 0, sizeof ops);
    ops.size = sizeof ops;
    ops.create = tp_create;
    ops.destroy = tp_destroy;

    ops.id = 0x9101;
    ops.name = "tplain";
    ops.bound = tplain_bound;
    ops.encode = tplain_encode;
    ops.decode = tplain_decode;
    ops.segment_align = tplain_align;
    terse_codec_register(&ops);
    ops.segment_align = NULL;

    ops.id = 0x9102;
    ops.name = "tsum";
    ops.flags = TERSE_CODEC_SUMMABLE;
    ops.bound = tsum_bound;
    ops.encode = tsum_encode;
    ops.decode = tsum_decode;
    ops.summable_view = tsum_view;
    terse_codec_register(&ops);

    ops.id = 0x9103;
    ops.name = "tsumnov";
    ops.summable_view = NULL;
    terse_codec_register(&ops);

    ops.id = 0x9104;
    ops.name = "tround";
    ops.flags = 0;
    ops.rounds = tround_rounds;
    ops.round_vector = tround_vector;
    ops.round_finish = tround_finish;
    terse_codec_register(&ops);
}

#define PN_SMALL 1000u  /* recursive doubling for the summed values */
#define PN_LARGE 20000u /* tplain pieces of 20 KiB at 4 ranks: reduce-scatter */

static const struct plugin_case {
    const char *spec;
    size_t n;
    const char *algo; /* terse_allreduce_algorithm's name for the path */
} plugin_cases[] = {
    {"tsum", PN_SMALL, "summable"},
    {"tsumnov", PN_SMALL, "gather"},
    {"tround", PN_SMALL, "rounds"},
    {"tplain", PN_LARGE, "rs"},
};
#define NPLUG (sizeof plugin_cases / sizeof plugin_cases[0])

/* u[i]: exact sums; u[8 + i]: payload bytes sent; u[16 + i]: wire bytes
 * sent; u[24 + i]: terse_allreduce_algorithm named the expected path. */
static int plugin_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    register_plugins();
    const int N = terse_comm_size(c), r = terse_comm_rank(c);
    float *y = malloc(PN_LARGE * sizeof(float));
    for (size_t pi = 0; pi < NPLUG; pi++) {
        const size_t n = plugin_cases[pi].n;
        terse_codec *codec = NULL;
        TR_CALL(o, terse_codec_create(plugin_cases[pi].spec, 1, n, &codec));
        for (size_t i = 0; i < n; i++) y[i] = (float)((r + 1) * (int)(i % 13 + 1));
        o->u[24 + pi] = !strcmp(terse_allreduce_algorithm(c, codec, n), plugin_cases[pi].algo);
        terse_comm_reset_stats(c);
        TR_CALL(o, terse_allreduce(c, y, n, codec, TERSE_OP_SUM));
        terse_comm_stats st = TERSE_COMM_STATS_INIT;
        terse_comm_get_stats(c, &st);
        int exact = 1;
        for (size_t i = 0; i < n; i++)
            exact &= y[i] == (float)(N * (N + 1) / 2 * (int)(i % 13 + 1));
        o->u[pi] = (uint64_t)exact;
        o->u[8 + pi] = st.payload_bytes_sent;
        o->u[16 + pi] = st.wire_bytes_sent;
        terse_codec_free(codec);
    }
    free(y);
    return 0;
}

Test(plugin_aggregation, each_plugin_takes_the_path_its_table_offers) {
    const int N = 4;
    tr_job job = {"shm", N, 20000, 60, -1};
    /* the byte counts below are the transport's dense paths (the host's
     * shared segment would send none: test_segment.c) */
    setenv("TERSE_SHM_SEGMENT", "off", 1);
    tr_out *o = tr_run(&job, plugin_body, NULL);
    unsetenv("TERSE_SHM_SEGMENT");
    expect_finished(o, N, "plugins");
    const uint64_t H = TERSE_WIRE_HEADER_SIZE, small = 4 * PN_SMALL;
    for (int r = 0; r < N; r++) {
        for (size_t pi = 0; pi < NPLUG; pi++) {
            cr_expect_eq(o[r].u[pi], 1, "%s: rank %d's sums are not exact",
                         plugin_cases[pi].spec, r);
            cr_expect_eq(o[r].u[24 + pi], 1, "%s: terse_allreduce_algorithm is not '%s'",
                         plugin_cases[pi].spec, plugin_cases[pi].algo);
        }
        /* tsum: its values through recursive doubling (2 exchanges at 4
         * ranks), plus the 8-byte digests of the all-gather as framing */
        cr_expect_eq(o[r].u[8], 2 * small, "tsum: rank %d sent %llu", r,
                     (unsigned long long)o[r].u[8]);
        cr_expect_eq(o[r].u[16], 2 * small + 8 * (N - 1));
        /* tsumnov: N - 1 whole messages, plus their sizes */
        cr_expect_eq(o[r].u[9], (N - 1) * (H + 8 + small), "tsumnov: rank %d sent %llu", r,
                     (unsigned long long)o[r].u[9]);
        cr_expect_eq(o[r].u[17], (N - 1) * (H + 8 + small + 8));
        /* tround: two rounds of half the vector, each 2 exchanges */
        cr_expect_eq(o[r].u[10], 2 * 2 * (small / 2), "tround: rank %d sent %llu", r,
                     (unsigned long long)o[r].u[10]);
        cr_expect_eq(o[r].u[18], o[r].u[10]);
        /* tplain: reduce-scatter by default at 4 ranks and 20 KiB pieces:
         * 3 pieces and 3 owner messages of 5000 floats each */
        const uint64_t piece = H + 4 + 4 * (PN_LARGE / N);
        cr_expect_eq(o[r].u[11], 6 * piece, "tplain: rank %d sent %llu", r,
                     (unsigned long long)o[r].u[11]);
        cr_expect_eq(o[r].u[19], 6 * piece + (N - 1) * (8 * N + 16));
    }
    tr_release(o);
}

/* ------------------------------------------------------------ error feedback */

/* A constant input, step after step: with ef=1 the collective delivers,
 * over T steps, T times the sum minus bounded residuals -- the ranks' own
 * and the owner's re-encode residual, without which topk's re-encode of
 * the denser summed segment would drop mass forever. Without ef the
 * shortfall is a fixed share of every step. val[0]: relative error of the
 * T-step total, ef=1; val[1]: the same without ef. */
#define EF_T 40
static int ef_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int N = terse_comm_size(c), r = terse_comm_rank(c);
    const char *specs[2] = {"topk:ratio=0.25,ef=1", "topk:ratio=0.25"};
    float *x = malloc(N_ELEM * sizeof(float)), *y = malloc(N_ELEM * sizeof(float));
    double *acc = malloc(N_ELEM * sizeof(double)), *want = calloc(N_ELEM, sizeof(double));
    for (int q = 0; q < N; q++) {
        rank_input(q, x);
        for (size_t i = 0; i < N_ELEM; i++) want[i] += EF_T * (double)x[i];
    }
    for (int v = 0; v < 2; v++) {
        terse_codec *codec = NULL;
        TR_CALL(o, terse_codec_create(specs[v], ROWS, COLS, &codec));
        terse_codec_set_stream(codec, TENSOR, (uint32_t)r);
        memset(acc, 0, N_ELEM * sizeof(double));
        rank_input(r, x);
        for (int t = 0; t < EF_T; t++) {
            memcpy(y, x, N_ELEM * sizeof(float));
            TR_CALL(o, terse_allreduce(c, y, N_ELEM, codec, TERSE_OP_SUM));
            for (size_t i = 0; i < N_ELEM; i++) acc[i] += y[i];
        }
        double err = 0, nrm = 0;
        for (size_t i = 0; i < N_ELEM; i++) {
            err += (acc[i] - want[i]) * (acc[i] - want[i]);
            nrm += want[i] * want[i];
        }
        o->val[v] = sqrt(err / nrm);
        terse_codec_free(codec);
    }
    free(x);
    free(y);
    free(acc);
    free(want);
    return 0;
}

Test(rs_allreduce, error_feedback_delivers_what_the_re_encode_dropped, .timeout = 200) {
    setenv("TERSE_COMPRESSED_ALGO", "rs", 1);
    tr_job job = {"shm", 4, 20000, 120, -1};
    tr_out *o = tr_run(&job, ef_body, NULL);
    unsetenv("TERSE_COMPRESSED_ALGO");
    expect_finished(o, 4, "error feedback");
    if (getenv("TR_VERBOSE"))
        fprintf(stderr, "rs ef: total relative error %.4f with ef, %.4f without\n", o[0].val[0],
                o[0].val[1]);
    for (int r = 0; r < 4; r++) {
        cr_expect_lt(o[r].val[0], 0.1, "rank %d: ef=1 delivered the %d-step total within %.3f",
                     r, EF_T, o[r].val[0]);
        cr_expect_gt(o[r].val[1], 0.3, "rank %d: without ef the total is off by only %.3f", r,
                     o[r].val[1]);
    }
    tr_release(o);
}

/* ------------------------------------------------------------ refusals */

/* One rank's codec differs from the others': no rank may return TERSE_OK. */

static tr_out *run_mismatch(const tr_mismatch *m) {
    setenv("TERSE_COMPRESSED_ALGO", "rs", 1);
    tr_job job = {"shm", 4, 3000, 60, -1};
    tr_out *o = tr_run(&job, tr_mismatch_body, m);
    unsetenv("TERSE_COMPRESSED_ALGO");
    return o;
}

Test(rs_allreduce, ranks_with_other_specs_never_get_ok, .timeout = 200) {
    /* rank 1 cuts its buckets differently */
    static const tr_mismatch m = {"int8:bucket=128", "int8:bucket=64", 1, ROWS, COLS};
    tr_out *o = run_mismatch(&m);
    /* the codec digests travel with the lengths: every rank refuses at
     * the same point, before any piece moves */
    for (int r = 0; r < 4; r++) {
        if (getenv("TR_VERBOSE")) fprintf(stderr, "rank %d: %s\n", r, o[r].err);
        cr_expect_eq(o[r].u[0], TERSE_ERR_CORRUPT, "rank %d returned %s: %s", r,
                     terse_status_name((terse_status)o[r].u[0]), o[r].err);
        cr_expect(strstr(o[r].err, "differs from this rank's"), "rank %d: %s", r, o[r].err);
    }
    tr_release(o);
}

/* topk k=300 against k=301: pieces of the same lengths, other codecs. */
Test(rs_allreduce, a_rank_whose_k_differs_is_refused_everywhere, .timeout = 200) {
    static const tr_mismatch m = {"topk:k=300", "topk:k=301", 2, ROWS, COLS};
    tr_out *o = run_mismatch(&m);
    for (int r = 0; r < 4; r++)
        cr_expect_eq(o[r].u[0], TERSE_ERR_CORRUPT, "rank %d returned %s: %s", r,
                     terse_status_name((terse_status)o[r].u[0]), o[r].err);
    tr_release(o);
}

/* ------------------------------------------------------------ the cut, by hand */

/* int8 bucket=128 on 10553 elements: 83 buckets, 21 21 21 20 of them. */
Test(segments, int8_cuts_on_bucket_boundaries) {
    terse_codec *c = NULL;
    cr_assert_eq(terse_codec_create("int8:bucket=128", ROWS, COLS, &c), TERSE_OK);
    const terse__segments *g = NULL;
    cr_assert_eq(terse__codec_segments(c, 4, 1, &g), TERSE_OK);
    cr_assert_not_null(g);
    const size_t off[4] = {0, 2688, 5376, 8064}, len[4] = {2688, 2688, 2688, 2489};
    for (int s = 0; s < 4; s++) {
        cr_expect_eq(g->off[s], off[s], "segment %d starts at %zu", s, g->off[s]);
        cr_expect_eq(g->len[s], len[s], "segment %d has %zu", s, g->len[s]);
        cr_expect_str_eq(terse_codec_spec(g->child[s]), "int8:bucket=128,ef=0");
    }
    cr_expect_null(g->hop, "no ef, no owner residual");
    terse_codec_free(c);
    /* fewer buckets than ranks: no cut (the all-gather) */
    cr_assert_eq(terse_codec_create("int8:bucket=4096", 1, 8192, &c), TERSE_OK);
    cr_expect_eq(terse__codec_segments(c, 4, 0, &g), TERSE_OK);
    cr_expect_null(g);
    terse_codec_free(c);
}

/* topk k=300 of 10553 on 4 ranks: 2639 2638 2638 2638 elements, k 75 each. */
Test(segments, topk_scales_k_to_each_segment) {
    terse_codec *c = NULL;
    cr_assert_eq(terse_codec_create("topk:k=300,ef=1", ROWS, COLS, &c), TERSE_OK);
    const terse__segments *g = NULL;
    cr_assert_eq(terse__codec_segments(c, 4, 3, &g), TERSE_OK);
    cr_assert_not_null(g);
    cr_expect_eq(g->len[0], 2639);
    cr_expect_eq(g->len[3], 2638);
    for (int s = 0; s < 4; s++) cr_expect_str_eq(terse_codec_spec(g->child[s]), "topk:k=75,ef=0");
    cr_expect_not_null(g->hop, "ef=1: the owner keeps a residual for segment 3");
    terse_codec_free(c);
}

/* ------------------------------------------------------------ the table's checks */

Test(registry, aggregation_entries_are_checked_at_registration) {
    terse_codec_ops ops;
    memset(&ops, 0, sizeof ops);
    ops.size = sizeof ops;
    ops.create = tp_create;
    ops.destroy = tp_destroy;
    ops.bound = tplain_bound;
    ops.encode = tplain_encode;
    ops.decode = tplain_decode;
    ops.id = 0x9201;
    ops.name = "tbad_rounds";
    ops.rounds = tround_rounds;
    cr_expect_eq(terse_codec_register(&ops), TERSE_ERR_INVALID, "rounds without round_vector");
    ops.rounds = NULL;
    ops.round_vector = tround_vector;
    ops.round_finish = tround_finish;
    cr_expect_eq(terse_codec_register(&ops), TERSE_ERR_INVALID, "round_* without rounds");
    ops.round_vector = NULL;
    ops.round_finish = NULL;
    ops.summable_view = tsum_view;
    cr_expect_eq(terse_codec_register(&ops), TERSE_ERR_INVALID, "a view without SUMMABLE");
    ops.summable_view = NULL;
    /* a table of 0.1.0's size: nothing past state_load is read, even if
     * the memory after it holds garbage */
    struct {
        terse_codec_ops ops;
        char pad[64];
    } old;
    memset(&old, 0xff, sizeof old);
    memcpy(&old.ops, &ops, offsetof(terse_codec_ops, summable_view));
    old.ops.size = offsetof(terse_codec_ops, summable_view);
    old.ops.name = "told_table";
    old.ops.id = 0x9202;
    cr_expect_eq(terse_codec_register(&old.ops), TERSE_OK, "%s", terse_last_error());
    /* a size in the middle of an entry: rounded down to whole entries */
    old.ops.size = offsetof(terse_codec_ops, summable_view) + 3;
    old.ops.name = "told_table2";
    old.ops.id = 0x9203;
    cr_expect_eq(terse_codec_register(&old.ops), TERSE_OK, "%s", terse_last_error());
    terse_codec *c = NULL;
    cr_assert_eq(terse_codec_create("told_table2", 1, 100, &c), TERSE_OK);
    cr_expect_eq(terse__codec_agg_kind(c), TERSE__AGG_MESSAGES);
    cr_expect_eq(terse__codec_can_cut(c, 4), 0, "no segment_align was read");
    terse_codec_free(c);
}

/* ------------------------------------------------------------ none is dense */

/* At 3 ranks (1/3 is not exact) none's average is bitwise the dense one,
 * on both dense paths (recursive doubling and the ring). */
static int none_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int r = terse_comm_rank(c);
    const size_t sizes[2] = {3001, 300000};
    float *a = malloc(300000 * sizeof(float)), *b = malloc(300000 * sizeof(float));
    for (int k = 0; k < 2; k++) {
        const size_t n = sizes[k];
        tu_fill_gauss(a, n, 40 + (uint64_t)r);
        memcpy(b, a, n * sizeof(float));
        terse_codec *codec = NULL;
        TR_CALL(o, terse_codec_create("none", 1, n, &codec));
        TR_CALL(o, terse_allreduce(c, a, n, NULL, TERSE_OP_AVG));
        TR_CALL(o, terse_allreduce(c, b, n, codec, TERSE_OP_AVG));
        o->u[k] = memcmp(a, b, n * sizeof(float)) == 0;
        terse_codec_free(codec);
    }
    free(a);
    free(b);
    return 0;
}

Test(rounds, none_average_is_bitwise_the_dense_average_at_three_ranks) {
    tr_job job = {"shm", 3, 10000, 60, -1};
    tr_out *o = tr_run(&job, none_body, NULL);
    expect_finished(o, 3, "none");
    for (int r = 0; r < 3; r++) {
        cr_expect_eq(o[r].u[0], 1, "rank %d: recursive doubling sizes differ", r);
        cr_expect_eq(o[r].u[1], 1, "rank %d: ring sizes differ", r);
    }
    tr_release(o);
}

/* ------------------------------------------------------------ a killed rank */

/* Rank 3 of 4 kills itself 150 ms into a loop of reduce-scatter
 * allreduces (fp16, ef=1, 2M floats): every survivor fails within the
 * timeout with PEER_LOST or TIMEOUT naming rank 3, and its codec is left
 * as it was before the failed call (the snapshot), so u[1]: the residual
 * after the failure equals the residual after the last call that
 * succeeded. */
static int rs_kill_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const size_t n = 1u << 21;
    terse_codec *codec = NULL;
    TR_CALL(o, terse_codec_create("fp16:ef=1", 1, n, &codec));
    float *y = malloc(n * sizeof(float)), *keep = malloc(n * sizeof(float));
    tu_fill_gauss(y, n, 77 + (uint64_t)terse_comm_rank(c));
    TR_CALL(o, terse_allreduce(c, y, n, codec, TERSE_OP_AVG));
    o->hash[1] = !strcmp(terse_allreduce_algorithm(c, codec, n), "rs");
    tr_last_rank_dies_in(c, 150);
    int failed = tr_allreduce_until_failure(c, o, y, n, codec, TERSE_OP_AVG, 5000, keep);
    if (failed) o->u[1] = memcmp(keep, terse_codec_residual(codec), n * sizeof(float)) == 0;
    free(y);
    free(keep);
    terse_codec_free(codec);
    return failed ? 0
                  : tr_fail(o, TERSE_OK, "5000 all-reduces succeeded although a rank was killed");
}

static void check_rs_killed(const char *provider) {
    const int N = 4, timeout_ms = 3000;
    tr_job job = {provider, N, timeout_ms, 40, N - 1};
    if (!strcmp(provider, "tcp")) tr_known_segv = TR_RXM_TEARDOWN_SEGV;
    setenv("TERSE_COMPRESSED_ALGO", "rs", 1);
    tr_out *o = tr_run(&job, rs_kill_body, NULL);
    unsetenv("TERSE_COMPRESSED_ALGO");
    tr_known_segv = NULL;
    for (int r = 0; r < N - 1; r++) {
        if (!o[r].finished) continue; /* the known crash: tr_run warned */
        terse_status s = (terse_status)o[r].u[0];
        cr_expect_eq(o[r].hash[1], 1, "%s: survivor %d: not the reduce-scatter", provider, r);
        cr_expect(s == TERSE_ERR_PEER_LOST || s == TERSE_ERR_TIMEOUT,
                  "%s: survivor %d got %s (%s)", provider, r, terse_status_name(s), o[r].err);
        cr_expect_leq(o[r].val[0], timeout_ms + 1500.0, "%s: survivor %d took %.0f ms", provider,
                      r, o[r].val[0]);
        /* shm's spin on the dead rank's region lock (known_limits.h): the
         * watchdog gave up on the executor, which still holds the codec
         * and never returns to restore it (terse.h says so); seen once
         * under ASan in a fresh-clone CI run, 2026-12-06 */
        if (strstr(o[r].err, TR_SHM_LOCK_SPIN)) {
            fprintf(stderr, "WARNING: KNOWN LIMITATION: %s: survivor %d spun on the dead rank's "
                            "shm region lock; its codec is as the abandoned executor left it: %s\n",
                    provider, r, o[r].err);
            continue;
        }
        cr_expect(strstr(o[r].err, "rank 3"), "%s: survivor %d's sentence does not name rank 3: %s",
                  provider, r, o[r].err);
        cr_expect_eq(o[r].u[1], 1, "%s: survivor %d's residual changed in the failed call (%s: %s)",
                     provider, r, terse_status_name(s), o[r].err);
    }
    tr_release(o);
}

Test(rs_allreduce, killed_rank_fails_every_survivor_tcp) { check_rs_killed("tcp"); }
Test(rs_allreduce, killed_rank_fails_every_survivor_shm) { check_rs_killed("shm"); }
