/* Collectives over real rank processes and real providers (shm and
 * tcp;ofi_rxm on loopback): dense and compressed all-reduce against a
 * float64 reference, bitwise identity across ranks and runs, error
 * feedback through the collective, broadcast, all-gather, barrier, and
 * exact byte statistics. Failure handling is in test_comm_failure.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "algos/coll/ring.h"
#include "compress/state.h"
#include "ranks.h"
#include "testutil.h"

/* ------------------------------------------------------------ partition */

Test(partition, parts_tile_the_range_and_differ_by_at_most_one) {
    for (size_t total = 0; total < 40; total++)
        for (size_t parts = 1; parts < 9; parts++) {
            size_t next = 0, lo = SIZE_MAX, hi = 0;
            for (size_t i = 0; i < parts; i++) {
                size_t off, len;
                terse__part(total, parts, i, &off, &len);
                cr_assert_eq(off, next, "total %zu parts %zu: part %zu starts at %zu", total,
                             parts, i, off);
                next = off + len;
                if (len < lo) lo = len;
                if (len > hi) hi = len;
            }
            cr_assert_eq(next, total);
            cr_assert_leq(hi - lo, 1);
        }
}

Test(partition, chunk_count_keeps_every_chunk_within_the_chunk_size) {
    cr_assert_eq(terse__chunks_for(0, 4096), 1);
    cr_assert_eq(terse__chunks_for(4096, 4096), 1);
    cr_assert_eq(terse__chunks_for(4097, 4096), 2);
    for (size_t bytes = 1; bytes < 100000; bytes += 997) {
        size_t k = terse__chunks_for(bytes, 1000);
        size_t off, len;
        terse__part(bytes, k, 0, &off, &len); /* part 0 is the largest */
        cr_assert_leq(len, 1000);
        cr_assert(k == 1 || bytes > (k - 1) * 1000);
    }
}

/* ------------------------------------------------------------ dense */

static void rank_input(float *x, size_t n, int rank, uint64_t seed) {
    tu_fill_uniform(x, n, seed * 131 + (uint64_t)rank, -1.0f, 1.0f);
}

#define DENSE_MAX 1000003u

/* For each n and op: the worst |result - float64 sum| over the bound
 * (N + 1) 2^-24 sum|x| (a float sum's rounding, one more for the average's
 * division), and a hash of the result bits. */
static int dense_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int N = terse_comm_size(c), r = terse_comm_rank(c);
    const size_t sizes[] = {0, 1, 2, 7, (size_t)N - 1, 5000, DENSE_MAX};
    float *x = malloc(DENSE_MAX * sizeof(float)), *y = malloc(DENSE_MAX * sizeof(float));
    double *sum = malloc(DENSE_MAX * sizeof(double)), *abs_sum = malloc(DENSE_MAX * sizeof(double));
    size_t slot = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int op = TERSE_OP_SUM; op <= TERSE_OP_AVG; op++) {
            size_t n = sizes[si];
            rank_input(y, n, r, n);
            TR_CALL(o, terse_allreduce(c, y, n, NULL, (terse_op)op));
            memset(sum, 0, n * sizeof(double));
            memset(abs_sum, 0, n * sizeof(double));
            for (int q = 0; q < N; q++) {
                rank_input(x, n, q, n);
                for (size_t i = 0; i < n; i++) {
                    sum[i] += x[i];
                    abs_sum[i] += fabs(x[i]);
                }
            }
            double worst = 0, div = op == TERSE_OP_AVG ? N : 1;
            for (size_t i = 0; i < n; i++) {
                double err = fabs(y[i] - sum[i] / div);
                double bound = (N + 1) * 0x1p-24 * abs_sum[i] / div + 1e-38;
                if (!(err / bound <= worst)) worst = err / bound;
            }
            o->val[slot] = worst;
            o->u[slot] = n;
            o->hash[slot++] = tr_hash(y, n * sizeof(float));
        }
    o->u[TR_SLOTS - 1] = slot;
    free(x);
    free(y);
    free(sum);
    free(abs_sum);
    return 0;
}

static void check_dense(const char *provider, int nranks) {
    tr_job job = {provider, nranks, 10000, 40, -1};
    tr_out *o = tr_run(&job, dense_body, NULL);
    size_t slots = o[0].u[TR_SLOTS - 1];
    cr_assert_eq(slots, 14);
    for (size_t s = 0; s < slots; s++)
        for (int r = 0; r < nranks; r++) {
            cr_expect_leq(o[r].val[s], 1.0, "%s x%d, n = %llu, %s: rank %d error %.3g x bound",
                          provider, nranks, (unsigned long long)o[r].u[s], s % 2 ? "avg" : "sum",
                          r, o[r].val[s]);
            cr_expect_eq(o[r].hash[s], o[0].hash[s],
                         "%s x%d, n = %llu: rank %d's result differs from rank 0's", provider,
                         nranks, (unsigned long long)o[r].u[s], r);
        }
    tr_release(o);
}

Test(dense_allreduce, two_ranks_shm) { check_dense("shm", 2); }
Test(dense_allreduce, two_ranks_tcp) { check_dense("tcp", 2); }
Test(dense_allreduce, three_ranks_shm) { check_dense("shm", 3); }
Test(dense_allreduce, three_ranks_tcp) { check_dense("tcp", 3); }
Test(dense_allreduce, four_ranks_shm) { check_dense("shm", 4); }
Test(dense_allreduce, four_ranks_tcp) { check_dense("tcp", 4); }
/* shm's all-reduces above take the host's shared segment; libfabric's shm
 * carries recursive doubling and the ring here */
Test(dense_allreduce, three_ranks_shm_transport) {
    setenv("TERSE_SHM_SEGMENT", "off", 1);
    check_dense("shm", 3);
    unsetenv("TERSE_SHM_SEGMENT");
}

/* ------------------------------------------------------------ codecs */

/* beta: the documented per-rank bound ||D(E(x)) - x|| <= beta ||x||
 * (an expectation for the randomized codecs, deterministic for the rest);
 * 0 means "computed from the data" (terngrad). */
static const struct codec_case {
    const char *spec;
    double beta;
    int lowrank; /* feed rank-4 matrices (exactly representable) */
} codec_cases[] = {
    {"none", 0.0, 0},
    {"none:ef=1", 0.0, 0},
    {"fp16", 0x1p-11, 0},
    {"bf16", 0x1p-8, 0},
    {"int8", 0.016, 0},                    /* |x| <= 3.47: s/2 <= 3.47/254 */
    {"qsgd", 1.8, 0},                      /* sqrt(min(512/49, sqrt(512)/7)) */
    {"qsgd:bits=8,bucket=512", 0.178, 0},  /* sqrt(512/127^2) */
    {"terngrad", 0.0, 0},                  /* sqrt(s ||x||_1) / ||x||, per bucket */
    {"sign", 1.0, 0},                      /* least-squares scale: a contraction */
    {"topk:ratio=0.05", 0.975, 0},         /* sqrt(1 - k/n) */
    {"randk:ratio=0.1,unbiased=0", 1.0, 0},
    {"randk:ratio=0.05", 1.5 * 4.48, 0},   /* ~ sqrt(n/k) */
    {"powersgd:rank=4", 1e-4, 1},
    {"powersgd:rank=64", 1e-5, 1},         /* (96 + 80) 64 2 >= 96 80: dense */
    {"vq", 0.75, 0},
};
#define NCASES (sizeof codec_cases / sizeof codec_cases[0])

static void case_shape(const struct codec_case *k, size_t *rows, size_t *cols) {
    *rows = k->lowrank ? 96 : TU_ROWS;
    *cols = k->lowrank ? 80 : TU_COLS;
}

/* Rank q's input for case k: Gaussian, or U V_q^T with U (rows x 4)
 * shared, so the sum over ranks is rank 4 too. */
static void case_input(const struct codec_case *k, int q, float *x) {
    size_t rows, cols;
    case_shape(k, &rows, &cols);
    if (!k->lowrank) {
        tu_fill_gauss(x, rows * cols, 500 + (uint64_t)q);
        return;
    }
    float u[96 * 4], v[80 * 4];
    tu_fill_gauss(u, rows * 4, 77);
    tu_fill_gauss(v, cols * 4, 600 + (uint64_t)q);
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) {
            double s = 0;
            for (size_t t = 0; t < 4; t++) s += (double)u[i * 4 + t] * v[j * 4 + t];
            x[i * cols + j] = (float)s;
        }
}

static double terngrad_beta(const float *x, size_t n) {
    double acc = 0, nrm = 0;
    for (size_t b = 0; b < n; b += 512) {
        size_t e = b + 512 < n ? b + 512 : n;
        double s = 0, l1 = 0;
        for (size_t i = b; i < e; i++) {
            if (fabs(x[i]) > s) s = fabs(x[i]);
            l1 += fabs(x[i]);
            nrm += (double)x[i] * x[i];
        }
        acc += s * l1;
    }
    return 1.5 * sqrt(acc / nrm);
}

/* Non-summable codecs are decoded in rank order: replay that here. 1 if y
 * is bitwise what decoding every rank's message (alpha 1/N) gives. */
static int matches_replay(const struct codec_case *k, int N, const float *y, float *x, size_t n,
                          size_t rows, size_t cols) {
    float *want = malloc(n * sizeof(float));
    int ok = 1;
    for (int q = 0; q < N && ok; q++) {
        terse_codec *cq = NULL;
        if (terse_codec_create(k->spec, rows, cols, &cq) != TERSE_OK) {
            ok = 0;
            break;
        }
        terse_codec_set_stream(cq, 7, (uint32_t)q);
        case_input(k, q, x);
        size_t cap = terse_codec_bound(cq), len = 0;
        uint8_t *msg = malloc(cap);
        ok = terse_encode(cq, x, msg, cap, &len) == TERSE_OK &&
             terse_decode(cq, msg, len, want, 1.0f / (float)N, q > 0) == TERSE_OK;
        free(msg);
        terse_codec_free(cq);
    }
    ok = ok && memcmp(want, y, n * sizeof(float)) == 0;
    free(want);
    return ok;
}

/* randk's result is randk of the mean: zero, or the mean times the stratum
 * scale (1, or n/k rounded either way when unbiased). 1 if so. */
static int randk_shape_ok(const float *y, const double *mean, size_t n, size_t k, int unbiased) {
    size_t nonzero = 0;
    for (size_t i = 0; i < n; i++) {
        if (y[i] == 0.0f) continue;
        nonzero++;
        int ok = 0;
        for (size_t scale = unbiased ? n / k : 1; scale <= (unbiased ? n / k + 1 : 1); scale++)
            ok |=
                fabs(y[i] - (double)scale * mean[i]) <= 1e-5 * (double)scale * (1 + fabs(mean[i]));
        if (!ok) return 0;
    }
    return nonzero == k;
}

/* val[i]: ||y - mean|| over the bound; u[i]: 1 = exact replay matched or
 * not applicable, 0 = mismatch; hash[i]: the result bits. */
static int codec_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int N = terse_comm_size(c), r = terse_comm_rank(c);
    for (size_t ci = 0; ci < NCASES; ci++) {
        const struct codec_case *k = &codec_cases[ci];
        size_t rows, cols;
        case_shape(k, &rows, &cols);
        size_t n = rows * cols;
        float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
        double *mean = calloc(n, sizeof(double));
        terse_codec *codec = NULL;
        TR_CALL(o, terse_codec_create(k->spec, rows, cols, &codec));
        terse_codec_set_stream(codec, 7, (uint32_t)r);
        case_input(k, r, y);
        TR_CALL(o, terse_allreduce(c, y, n, codec, TERSE_OP_AVG));
        o->hash[ci] = tr_hash(y, n * sizeof(float));

        double bound = 0, slack = 0;
        for (int q = 0; q < N; q++) {
            case_input(k, q, x);
            for (size_t i = 0; i < n; i++) mean[i] += x[i] / (double)N;
            double beta = k->beta > 0 ? k->beta : terngrad_beta(x, n);
            if (!strncmp(k->spec, "none", 4)) beta = 1e-6;
            bound += beta * tu_norm2(x, n) / N;
            slack += 1e-5 * tu_norm2(x, n) / N;
        }
        double err = 0;
        for (size_t i = 0; i < n; i++) err += (y[i] - mean[i]) * (y[i] - mean[i]);
        o->val[ci] = sqrt(err) / (bound + slack);

        terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
        terse_codec_get_traits(codec, &t);
        o->u[ci] = 1;
        if (!strcmp(t.name, "randk")) {
            int unbiased = strstr(terse_codec_spec(codec), "unbiased=1") != NULL;
            size_t kk = (size_t)((strstr(k->spec, "0.1") ? 0.1 : 0.05) * n + 0.5);
            o->u[ci] = (uint64_t)randk_shape_ok(y, mean, n, kk, unbiased);
        } else if (strcmp(t.name, "none") && strcmp(t.name, "powersgd")) {
            o->u[ci] = (uint64_t)matches_replay(k, N, y, x, n, rows, cols);
        }
        terse_codec_free(codec);
        free(x);
        free(y);
        free(mean);
    }
    return 0;
}

static tr_out *run_codecs(const char *provider, int nranks) {
    tr_job job = {provider, nranks, 10000, 40, -1};
    tr_out *o = tr_run(&job, codec_body, NULL);
    if (getenv("TR_VERBOSE"))
        for (size_t ci = 0; ci < NCASES; ci++)
            fprintf(stderr, "%-28s %s x%d: error/bound %.3g exact %d hash %016llx\n",
                    codec_cases[ci].spec, provider, nranks, o[0].val[ci], (int)o[0].u[ci],
                    (unsigned long long)o[0].hash[ci]);
    for (size_t ci = 0; ci < NCASES; ci++)
        for (int r = 0; r < nranks; r++) {
            cr_expect_leq(o[r].val[ci], 1.0, "%s on %s x%d: rank %d's error is %.3g x its bound",
                          codec_cases[ci].spec, provider, nranks, r, o[r].val[ci]);
            cr_expect_eq(o[r].u[ci], 1, "%s on %s x%d: rank %d's result is not %s",
                         codec_cases[ci].spec, provider, nranks, r,
                         strncmp(codec_cases[ci].spec, "randk", 5)
                             ? "the rank-order decode of every rank's message"
                             : "randk of the mean");
            cr_expect_eq(o[r].hash[ci], o[0].hash[ci], "%s on %s x%d: rank %d differs from rank 0",
                         codec_cases[ci].spec, provider, nranks, r);
        }
    return o;
}

Test(codec_allreduce, every_codec_within_its_bound_identical_on_ranks_and_reruns) {
    tr_out *a = run_codecs("shm", 3);
    tr_out *b = run_codecs("tcp", 3);
    for (size_t ci = 0; ci < NCASES; ci++)
        cr_expect_eq(a[0].hash[ci], b[0].hash[ci], "%s: the rerun (over tcp) gave other bits",
                     codec_cases[ci].spec);
    tr_release(a);
    tr_release(b);
}

Test(codec_allreduce, two_and_four_ranks) {
    tr_release(run_codecs("shm", 2));
    tr_release(run_codecs("tcp", 4));
}

/* ------------------------------------------------------------ error feedback */

/* With ef=1 and op sum, what the ranks meant to send is exactly what the
 * collective delivered plus what they kept: sum_r e_r(s) + result(s) =
 * sum_r (x_r(s) + e_r(s-1)), step after step, whichever path the codec
 * takes (all-gather, summable ring, or PowerSGD's two rounds). */
static const char *const ef_specs[] = {"topk:ratio=0.1,ef=1", "randk:ratio=0.25,ef=1",
                                       "powersgd:rank=2,ef=1", "sign:bucket=64,ef=1"};
#define EF_ROWS 16u
#define EF_COLS 12u
#define EF_N (EF_ROWS * EF_COLS)
#define EF_STEPS 2
#define EF_NSPECS (sizeof ef_specs / sizeof ef_specs[0])

static void ef_input(float *x, int rank, int step) {
    tu_fill_gauss(x, EF_N, 900 + 10 * (uint64_t)step + (uint64_t)rank);
}

/* The residual, read from the codec's checkpoint (compress/state.h). */
static int residual_of(terse_codec *codec, float *e) {
    size_t size = terse_codec_state_size(codec), len = 0;
    uint8_t *st = malloc(size);
    int ok = terse_codec_state_save(codec, st, size, &len) == TERSE_OK &&
             len >= TERSE__STATE_HEAD + EF_N * sizeof(float);
    if (ok) memcpy(e, st + TERSE__STATE_HEAD, EF_N * sizeof(float));
    free(st);
    return ok;
}

/* f: per spec and step, the residual then the result (EF_N floats each). */
static int ef_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    for (size_t si = 0; si < EF_NSPECS; si++) {
        terse_codec *codec = NULL;
        TR_CALL(o, terse_codec_create(ef_specs[si], EF_ROWS, EF_COLS, &codec));
        terse_codec_set_stream(codec, 3, (uint32_t)terse_comm_rank(c));
        for (int s = 0; s < EF_STEPS; s++) {
            float *e = o->f + (si * EF_STEPS + (size_t)s) * 2 * EF_N, *y = e + EF_N;
            ef_input(y, terse_comm_rank(c), s);
            TR_CALL(o, terse_allreduce(c, y, EF_N, codec, TERSE_OP_SUM));
            if (!residual_of(codec, e)) return tr_fail(o, TERSE_ERR_INTERNAL, "residual_of");
        }
        terse_codec_free(codec);
    }
    return 0;
}

Test(codec_allreduce, error_feedback_keeps_what_the_collective_did_not_deliver) {
    cr_assert_leq(EF_NSPECS * EF_STEPS * 2 * EF_N, TR_FLOATS);
    const int N = 3;
    tr_job job = {"shm", N, 10000, 30, -1};
    tr_out *o = tr_run(&job, ef_body, NULL);
    float x[EF_N];
    for (size_t si = 0; si < EF_NSPECS; si++)
        for (int s = 0; s < EF_STEPS; s++) {
            size_t at = (si * EF_STEPS + (size_t)s) * 2 * EF_N;
            double worst = 0, scale = 0;
            for (size_t i = 0; i < EF_N; i++) {
                double meant = 0, kept = 0;
                for (int r = 0; r < N; r++) {
                    ef_input(x, r, s);
                    meant += x[i] + (s ? o[r].f[at - 2 * EF_N + i] : 0.0);
                    kept += o[r].f[at + i];
                    cr_assert_eq(o[r].f[at + EF_N + i], o[0].f[at + EF_N + i],
                                 "%s step %d: rank %d's result differs", ef_specs[si], s, r);
                }
                double d = fabs(meant - (kept + o[0].f[at + EF_N + i]));
                if (d > worst) worst = d;
                if (fabs(meant) > scale) scale = fabs(meant);
            }
            cr_expect_leq(worst, 1e-5 * scale, "%s step %d: sum e + result is off by %g",
                          ef_specs[si], s, worst);
        }
    tr_release(o);
}

/* ------------------------------------------------------------ broadcast, all-gather, barrier */

static uint8_t pattern(int who, size_t i) {
    return (uint8_t)(i * 131 + (size_t)who * 17 + (i >> 8));
}

/* u[0]: broadcast mismatches; u[1]: all-gather mismatches; u[2]: status of
 * the too-small all-gather; u[3]: counts right after it; u[4], u[5]: barrier
 * entry and exit times (us); u[6]: status of the first call after the
 * too-small one. */
static int coll_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int N = terse_comm_size(c), r = terse_comm_rank(c);
    const size_t big = 2 * 1024 * 1024 + 3;
    uint8_t *buf = malloc(big);

    /* broadcast: small (binomial tree) and large (chain), several roots */
    const size_t sizes[] = {0, 1, 777, 65536, 65537, big};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int root = 0; root < N; root += (N > 2 ? N - 2 : 1)) {
            for (size_t i = 0; i < sizes[si]; i++) buf[i] = r == root ? pattern(root, i) : 0xee;
            TR_CALL(o, terse_broadcast(c, buf, sizes[si], root));
            for (size_t i = 0; i < sizes[si]; i++) o->u[0] += buf[i] != pattern(root, i);
        }

    /* all-gather: rank 1 sends nothing; then blocks big enough to chunk */
    for (int round = 0; round < 2; round++) {
        size_t each = round ? 700001 : 1000;
        size_t mine = r == 1 ? 0 : each + (size_t)r * 13, total = 0;
        for (int q = 0; q < N; q++) total += q == 1 ? 0 : each + (size_t)q * 13;
        uint8_t *send = malloc(mine + 1), *recv = malloc(total + 1);
        for (size_t i = 0; i < mine; i++) send[i] = pattern(r, i);
        size_t counts[TR_MAX_RANKS];
        TR_CALL(o, terse_allgather(c, send, mine, recv, total, counts));
        size_t at = 0;
        for (int q = 0; q < N; q++) {
            o->u[1] += counts[q] != (q == 1 ? 0 : each + (size_t)q * 13);
            for (size_t i = 0; i < counts[q]; i++) o->u[1] += recv[at + i] != pattern(q, i);
            at += counts[q];
        }
        /* too small on the last rank only: every rank must refuse */
        if (round == 0) {
            memset(counts, 0, sizeof counts);
            terse_status s = terse_allgather(c, send, mine, recv, r == N - 1 ? total - 1 : total,
                                             counts);
            o->u[2] = (uint64_t)s;
            o->u[3] = 1;
            for (int q = 0; q < N; q++)
                o->u[3] &= counts[q] == (q == 1 ? 0 : each + (size_t)q * 13);
            snprintf(o->err, sizeof o->err, "%s", terse_last_error());
        }
        free(send);
        free(recv);
    }

    /* barrier: ranks enter 40 ms apart; none may leave before the last enters */
    usleep((useconds_t)(40000 * r));
    o->u[4] = (uint64_t)(tr_now_ms() * 1000);
    TR_CALL(o, terse_barrier(c));
    o->u[5] = (uint64_t)(tr_now_ms() * 1000);
    TR_CALL(o, terse_barrier(c));
    free(buf);
    return 0;
}

static void check_coll(const char *provider, int nranks) {
    tr_job job = {provider, nranks, 10000, 30, -1};
    tr_out *o = tr_run(&job, coll_body, NULL);
    uint64_t last_entry = 0;
    for (int r = 0; r < nranks; r++)
        if (o[r].u[4] > last_entry) last_entry = o[r].u[4];
    for (int r = 0; r < nranks; r++) {
        cr_expect_eq(o[r].u[0], 0, "%s x%d: rank %d: %llu broadcast bytes wrong", provider, nranks,
                     r, (unsigned long long)o[r].u[0]);
        cr_expect_eq(o[r].u[1], 0, "%s x%d: rank %d: %llu all-gather bytes or counts wrong",
                     provider, nranks, r, (unsigned long long)o[r].u[1]);
        cr_expect_eq(o[r].u[2], TERSE_ERR_DST_TOO_SMALL,
                     "%s x%d: rank %d: too-small all-gather returned %llu", provider, nranks, r,
                     (unsigned long long)o[r].u[2]);
        cr_expect(strstr(o[r].err, "recv_cap"), "rank %d: sentence '%s'", r, o[r].err);
        cr_expect_eq(o[r].u[3], 1, "rank %d: counts not filled on DST_TOO_SMALL", r);
        cr_expect_geq(o[r].u[5], last_entry, "%s x%d: rank %d left the barrier at %llu us, "
                      "before the last rank entered at %llu us",
                      provider, nranks, r, (unsigned long long)o[r].u[5],
                      (unsigned long long)last_entry);
    }
    tr_release(o);
}

Test(collectives, broadcast_allgather_barrier_three_ranks_tcp) { check_coll("tcp", 3); }
Test(collectives, broadcast_allgather_barrier_four_ranks_shm) { check_coll("shm", 4); }
Test(collectives, broadcast_allgather_barrier_two_ranks_shm) { check_coll("shm", 2); }

/* ------------------------------------------------------------ statistics */

/* u[8 k ..]: payload sent, recv, wire sent, recv, ops for case k; val[k]:
 * codec seconds, val[8 + k]: network seconds. u[40]: int8 message bytes. */
static void take_stats(terse_comm *c, tr_out *o, int k) {
    terse_comm_stats st = TERSE_COMM_STATS_INIT;
    terse_comm_get_stats(c, &st);
    uint64_t *u = o->u + 8 * k;
    u[0] = st.payload_bytes_sent;
    u[1] = st.payload_bytes_recv;
    u[2] = st.wire_bytes_sent;
    u[3] = st.wire_bytes_recv;
    u[4] = st.ops;
    o->val[k] = st.codec_seconds;
    o->val[8 + k] = st.network_seconds;
    terse_comm_reset_stats(c);
}

#define STATS_RING_N 1000003u
#define STATS_RD_N 1000u
#define STATS_BCAST 100000u

static int stats_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    float *y = calloc(STATS_RING_N, sizeof(float));
    terse_comm_reset_stats(c);
    TR_CALL(o, terse_allreduce(c, y, STATS_RING_N, NULL, TERSE_OP_SUM));
    take_stats(c, o, 0);
    TR_CALL(o, terse_allreduce(c, y, STATS_RD_N, NULL, TERSE_OP_AVG));
    take_stats(c, o, 1);
    terse_codec *codec = NULL;
    TR_CALL(o, terse_codec_create("int8", TU_ROWS, TU_COLS, &codec));
    tu_fill_gauss(y, TU_ROWS * TU_COLS, 1);
    size_t cap = terse_codec_bound(codec), len = 0;
    uint8_t *msg = malloc(cap);
    TR_CALL(o, terse_encode(codec, y, msg, cap, &len));
    o->u[40] = len;
    free(msg);
    TR_CALL(o, terse_allreduce(c, y, TU_ROWS * TU_COLS, codec, TERSE_OP_SUM));
    take_stats(c, o, 2);
    TR_CALL(o, terse_broadcast(c, y, STATS_BCAST, 1));
    take_stats(c, o, 3);
    TR_CALL(o, terse_barrier(c));
    take_stats(c, o, 4);
    terse_codec_free(codec);
    free(y);
    return 0;
}

static uint64_t seg_bytes(size_t n, int N, int s) {
    size_t off, len;
    terse__part(n, (size_t)N, (size_t)((s % N + N) % N), &off, &len);
    return len * sizeof(float);
}

Test(comm_stats, byte_counts_are_exact) {
    /* the expected counts assume the default algorithm choices */
    unsetenv("TERSE_RD_MAX_BYTES");
    unsetenv("TERSE_RING_CHUNK_BYTES");
    /* the transport's paths: the host's shared segment sends nothing
     * through it (test_segment.c counts that) */
    setenv("TERSE_SHM_SEGMENT", "off", 1);
    const int N = 3;
    tr_job job = {"shm", N, 10000, 30, -1};
    tr_out *o = tr_run(&job, stats_body, NULL);
    unsetenv("TERSE_SHM_SEGMENT");
    for (int r = 0; r < N; r++) {
        const uint64_t *u = o[r].u;
        /* ring: reduce-scatter sends every segment but r+1 and receives
         * every one but r; the all-gather sends all but r+2, receives all
         * but r+1. No framing. */
        uint64_t all = STATS_RING_N * sizeof(float);
        uint64_t sent =
            2 * all - seg_bytes(STATS_RING_N, N, r + 1) - seg_bytes(STATS_RING_N, N, r + 2);
        uint64_t recv = 2 * all - seg_bytes(STATS_RING_N, N, r) - seg_bytes(STATS_RING_N, N, r + 1);
        cr_expect_eq(u[0], sent, "rank %d ring sent %llu, expected %llu", r,
                     (unsigned long long)u[0], (unsigned long long)sent);
        cr_expect_eq(u[1], recv, "rank %d ring recv %llu, expected %llu", r,
                     (unsigned long long)u[1], (unsigned long long)recv);
        cr_expect_eq(u[2], u[0]);
        cr_expect_eq(u[3], u[1]);
        cr_expect_eq(u[4], 1);
        cr_expect_gt(o[r].val[8], 0.0, "network seconds");
        cr_expect_gt(o[r].val[0], 0.0, "codec (reduction) seconds");
        /* recursive doubling at N = 3: rank 0 folds into rank 1 and gets the
         * result back; ranks 1 and 2 exchange once; rank 1 unfolds. */
        uint64_t b = STATS_RD_N * sizeof(float);
        uint64_t rd_sent = r == 1 ? 2 * b : b, rd_recv = r == 1 ? 2 * b : b;
        cr_expect_eq(u[8], rd_sent, "rank %d rd sent %llu", r, (unsigned long long)u[8]);
        cr_expect_eq(u[9], rd_recv, "rank %d rd recv %llu", r, (unsigned long long)u[9]);
        cr_expect_eq(u[10], u[8]);
        cr_expect_eq(u[12], 1);
        /* int8 (all-gather of equal messages): N-1 messages each way, plus
         * N-1 8-byte sizes each way as framing */
        uint64_t L = o[r].u[40];
        cr_expect_eq(u[16], (N - 1) * L, "rank %d gather sent %llu", r, (unsigned long long)u[16]);
        cr_expect_eq(u[17], (N - 1) * L);
        cr_expect_eq(u[18], (N - 1) * (L + 8));
        cr_expect_eq(u[19], (N - 1) * (L + 8));
        cr_expect_gt(o[r].val[2], 0.0, "encode/decode seconds");
        /* broadcast from root 1 along the chain 1 -> 2 -> 0 */
        int v = (r - 1 + N) % N;
        cr_expect_eq(u[24], v < N - 1 ? STATS_BCAST : 0, "rank %d bcast sent", r);
        cr_expect_eq(u[25], v > 0 ? STATS_BCAST : 0, "rank %d bcast recv", r);
        /* barrier: empty messages only */
        cr_expect_eq(u[32] + u[33] + u[34] + u[35], 0);
        cr_expect_eq(u[36], 1);
    }
    tr_release(o);
}
