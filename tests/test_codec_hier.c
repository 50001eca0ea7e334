/* The compressed hierarchical all-reduce (algos/coll/codec_hier_allreduce.c,
 * "codec-hier"), over real rank processes: 2 hosts x 2 ranks grouped by
 * TERSE_HOST, shm inside a host, tcp between hosts.
 *
 *   - int8:ef=1, qsgd:bits=4, fp16 and topk take codec-hier (terse_allreduce_algorithm
 *     names it); every rank ends with the same bits, within the codec's
 *     per-message bound of the float64 mean: one encode per host sum, so
 *     ||y - mean|| <= beta sum_h ||S_h|| / N (S_h: host h's fp32 sum);
 *   - error feedback per segment on its owner: over K calls of a constant
 *     input (int8:ef=1, sign:ef=1) the sum of the outputs approaches K x
 *     the sum of the inputs, far closer than one call's error;
 *   - TERSE_TOPOLOGY=flat and TERSE_COMPRESSED_ALGO=gather keep the flat
 *     paths;
 *   - a rank whose codec is bound to another size fails every rank with
 *     TERSE_ERR_SHAPE (the call descriptors), none hangs;
 *   - a rank stopped between calls fails every survivor, and a survivor
 *     that had encoded its segment has its codec's residual put back.
 * 3 hosts of 2 as well: with 2 hosts the decode order cannot show in the
 * bits (two fp32 terms commute); and hosts of 3 + 2 (a third rank that owns
 * no segment). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "algos/coll/coll.h"
#include "compress/aggregate.h"
#include "ranks.h"
#include "testutil.h"

#define ROWS 300u
#define COLS 401u /* 120300 elements: above the 64 KiB auto threshold, not a bucket multiple */
#define NE ((size_t)ROWS * COLS)
#define NR 4
#define K_EF 100

/* A job: the path expected ("codec-hier", or "flat": any other compressed
 * path), its size and each rank's TERSE_HOST. */
typedef struct {
    const char *want;
    int n;
    const char *host[8];
    int pipelined; /* fixed-size codecs must be cut into chunks (TERSE_RING_CHUNK_BYTES small) */
    /* over each host's shared segment (fixed-size codecs: codec-hier-seg;
     * TERSE_SEGMENT_STEP_BYTES small when pipelined); 0: TERSE_SHM_SEGMENT=off */
    int seg;
} hjob;

static const hjob two_by_two = {"codec-hier", NR, {"a", "a", "b", "b"}, 0, 0};

static void set_host(int rank, const void *arg) {
    const hjob *j = arg;
    char buf[16];
    snprintf(buf, sizeof buf, "%d", rank);
    setenv("TERSE_RANK", buf, 1);
    snprintf(buf, sizeof buf, "%d", j->n);
    setenv("TERSE_SIZE", buf, 1);
    unsetenv("TERSE_LOCAL_RANK");
    unsetenv("TERSE_LOCAL_SIZE");
    setenv("TERSE_HOST", j->host[rank], 1);
}

static const struct hcase {
    const char *spec;
    double beta; /* per-message relative error bound (tests/test_rs_allreduce.c) */
} cases[] = {
    {"int8:ef=1", 0.016},
    {"qsgd:bits=4", 1.8},
    {"fp16", 0x1p-11},
    {"topk:ratio=0.05", 0.975}, /* messages of varying size: lengths travel first */
};
#define NCASES (sizeof cases / sizeof cases[0])

static void rank_input(int q, float *x) { tu_fill_gauss(x, NE, 700 + (uint64_t)q); }

/* u[0..NCASES): the path is codec-hier; hash[i]: result bits; val[i]:
 * error over bound. hash[8 + i], val[8 + i]: the error-feedback runs. */
static int hier_body(terse_comm *c, tr_out *o, const void *arg) {
    const hjob *j = arg;
    const char *want_algo = j->want;
    const int r = terse_comm_rank(c), N = terse_comm_size(c);
    int hi, lr, ls, H;
    TR_CALL(o, terse_comm_topology(c, &hi, &lr, &ls, &H));
    float *x = malloc(NE * sizeof *x), *y = malloc(NE * sizeof *y);
    double *sum = calloc(NE, sizeof *sum);
    double *acc = calloc(NE, sizeof *acc);
    float *host = malloc((size_t)H * NE * sizeof *host);
    if (!x || !y || !sum || !acc || !host) return tr_fail(o, TERSE_ERR_NOMEM, "malloc");
    /* the float64 sum, and each host's sum in fp32 local-rank order */
    memset(host, 0, (size_t)H * NE * sizeof *host);
    for (int q = 0; q < N; q++) {
        rank_input(q, x);
        float *hs = host + (size_t)terse_comm_host_of(c, q) * NE;
        for (size_t i = 0; i < NE; i++) {
            sum[i] += x[i];
            hs[i] += x[i];
        }
    }
    double hnorm = 0; /* sum_h ||S_h|| */
    for (int h = 0; h < H; h++) hnorm += tu_norm2(host + (size_t)h * NE, NE);
    double rnorm = 0; /* sum_r ||x_r|| */
    for (int q = 0; q < N; q++) {
        rank_input(q, x);
        rnorm += tu_norm2(x, NE);
    }
    const int hier = strcmp(want_algo, "codec-hier") == 0;
    char want_k[32];
    double snorm = 0;
    for (size_t i = 0; i < NE; i++) snorm += sum[i] * sum[i];
    snorm = sqrt(snorm);

    for (size_t k = 0; k < NCASES; k++) {
        terse_codec *codec = NULL;
        TR_CALL(o, terse_codec_create(cases[k].spec, ROWS, COLS, &codec));
        const char *algo = terse_allreduce_algorithm(c, codec, NE);
        /* over the segments: the fixed-size codecs (topk's lengths travel) */
        snprintf(want_k, sizeof want_k, "%s%s", want_algo,
                 hier && j->seg && terse__codec_fixed_size(codec) ? "-seg" : "");
        o->u[k] = hier ? strcmp(algo, want_k) == 0
                       : strncmp(algo, "codec-hier", 10) != 0 && strncmp(algo, "dense", 5) != 0;
        o->u[8 + k] = hier ? terse__codec_hier_parts(c, codec) : 0; /* segments cut */
        if (!o->u[k]) snprintf(o->err, sizeof o->err, "%s: %s", cases[k].spec, algo);
        rank_input(r, y);
        const uint64_t steps0 = c->lseg_step;
        TR_CALL(o, terse_allreduce(c, y, NE, codec, TERSE_OP_AVG));
        o->u[16 + k] = c->lseg_step - steps0; /* the segments' steps it ran: the path taken */
        o->hash[k] = tr_hash(y, NE * sizeof *y);
        double err = 0;
        for (size_t i = 0; i < NE; i++) {
            double d = (double)y[i] - sum[i] / N;
            err += d * d;
        }
        /* hier: one encode per host sum; flat: one per rank, and the
         * reduce-scatter's re-encode of the sum (test_rs_allreduce.c);
         * fp32 summation slack on top */
        const double b = cases[k].beta;
        const double bound = hier ? b * hnorm : b * rnorm + b * (snorm + b * rnorm);
        o->val[k] = sqrt(err) / ((bound + 1e-5 * snorm) / N);
        o->val[16 + k] = sqrt(err) / (snorm / N);
        terse_codec_free(codec);
    }

    /* error feedback: K calls of a constant input */
    static const char *const ef_specs[] = {"int8:ef=1", "sign:ef=1"};
    for (int k = 0; k < 2; k++) {
        terse_codec *codec = NULL;
        TR_CALL(o, terse_codec_create(ef_specs[k], ROWS, COLS, &codec));
        memset(acc, 0, NE * sizeof *acc);
        double first = 0;
        for (int t = 0; t < K_EF; t++) {
            rank_input(r, y);
            TR_CALL(o, terse_allreduce(c, y, NE, codec, TERSE_OP_SUM));
            for (size_t i = 0; i < NE; i++) acc[i] += y[i];
            if (t == 0) {
                for (size_t i = 0; i < NE; i++) first += (y[i] - sum[i]) * (y[i] - sum[i]);
                first = sqrt(first) / snorm;
            }
        }
        double err = 0;
        for (size_t i = 0; i < NE; i++) {
            double d = acc[i] - K_EF * sum[i];
            err += d * d;
        }
        o->val[8 + k] = sqrt(err) / (K_EF * snorm); /* the sum's relative error */
        o->val[12 + k] = first;                     /* one call's */
        o->hash[8 + k] = tr_hash(acc, NE * sizeof *acc);
        terse_codec_free(codec);
    }
    free(x);
    free(y);
    free(sum);
    free(acc);
    free(host);
    return 0;
}

static tr_out *run_hier(const hjob *j) {
    tr_before_init = set_host;
    tr_job job = {"tcp", j->n, 20000, 120, -1};
    if (j->pipelined) setenv("TERSE_RING_CHUNK_BYTES", "16384", 1); /* 8 Ki floats a shard */
    if (j->pipelined && j->seg) setenv("TERSE_SEGMENT_STEP_BYTES", "65536", 1); /* 8 Ki a chunk */
    setenv("TERSE_SHM_SEGMENT", j->seg ? "auto" : "off", 1);
    tr_out *o = tr_run(&job, hier_body, j);
    unsetenv("TERSE_RING_CHUNK_BYTES");
    unsetenv("TERSE_SEGMENT_STEP_BYTES");
    unsetenv("TERSE_SHM_SEGMENT");
    return o;
}

static void check_hier(tr_out *o, const hjob *j) {
    const char *want_algo = j->want;
    const int nr = j->n;
    for (int r = 0; r < nr; r++)
        cr_assert(o[r].finished && o[r].status == 0, "rank %d failed: %s", r, o[r].err);
    for (size_t k = 0; k < NCASES; k++) {
        fprintf(stderr, "[NOTE] %s %-12s error/bound %.3g, relative error %.3g\n", want_algo,
                cases[k].spec, o[0].val[k], o[0].val[16 + k]);
        for (int r = 0; r < nr; r++) {
            cr_expect(o[r].u[k], "rank %d: %s does not take %s (%s)", r, cases[k].spec,
                      want_algo, o[r].err);
            cr_expect_eq(o[r].hash[k], o[0].hash[k], "%s: rank %d's bits differ from rank 0's",
                         cases[k].spec, r);
            /* over the segments exactly when the name says so */
            const int on_seg = j->seg && strncmp(cases[k].spec, "topk", 4) != 0;
            cr_expect_eq(o[r].u[16 + k] > 0, on_seg, "%s: rank %d ran %llu segment steps", cases[k].spec,
                         r, (unsigned long long)o[r].u[16 + k]);
            if (j->pipelined && strncmp(cases[k].spec, "topk", 4) != 0)
                cr_expect_gt(o[r].u[8 + k], 2, "%s: rank %d: not pipelined (%d segments)",
                             cases[k].spec, r, (int)o[r].u[8 + k]);
            if (!j->pipelined && !strcmp(want_algo, "codec-hier"))
                cr_expect_eq(o[r].u[8 + k], 2, "%s: rank %d: %d segments, not one a local rank",
                             cases[k].spec, r, (int)o[r].u[8 + k]);
            cr_expect_leq(o[r].val[k], 1.0, "%s: rank %d's error is %.3g x its bound",
                          cases[k].spec, r, o[r].val[k]);
        }
    }
    static const char *const ef_specs[] = {"int8:ef=1", "sign:ef=1"};
    for (int k = 0; k < 2; k++) {
        fprintf(stderr, "[NOTE] %s %-10s: one call %.3g, the sum of %d calls %.3g\n", want_algo,
                ef_specs[k], o[0].val[12 + k], K_EF, o[0].val[8 + k]);
        for (int r = 0; r < nr; r++) {
            cr_expect_eq(o[r].hash[8 + k], o[0].hash[8 + k],
                         "%s: rank %d's outputs differ from rank 0's", ef_specs[k], r);
            /* a bounded residual: the K-call sum's error is about one
             * call's / K; without error feedback (a deterministic codec)
             * it would equal one call's */
            cr_expect_lt(o[r].val[8 + k], 0.25 * o[r].val[12 + k],
                         "%s: the sum of %d calls is %.3g off, one call %.3g (error feedback "
                         "lost?)",
                         ef_specs[k], K_EF, o[r].val[8 + k], o[r].val[12 + k]);
        }
    }
}

/* A job under the default topology and compressed algorithm, checked. */
static void check_job(const hjob *j) {
    unsetenv("TERSE_TOPOLOGY");
    unsetenv("TERSE_COMPRESSED_ALGO");
    tr_out *o = run_hier(j);
    check_hier(o, j);
    tr_release(o);
}

Test(codec_hier, two_hosts_of_two_int8_qsgd_fp16, .timeout = 300) { check_job(&two_by_two); }

Test(codec_hier, topology_flat_keeps_the_flat_path, .timeout = 300) {
    setenv("TERSE_TOPOLOGY", "flat", 1);
    unsetenv("TERSE_COMPRESSED_ALGO");
    hjob j = two_by_two;
    j.want = "flat";
    tr_out *o = run_hier(&j);
    check_hier(o, &j);
    tr_release(o);
}

/* Three hosts of two, interleaved: three messages a rail, whose decode
 * order shows in the bits. */
Test(codec_hier, three_hosts_of_two_interleaved, .timeout = 300) {
    const hjob j = {"codec-hier", 6, {"a", "b", "c", "a", "b", "c"}, 0, 0};
    check_job(&j);
}

/* The same, pipelined: fixed-size codecs cut into chunks of L segments
 * (topk, whose lengths travel, stays whole). */
Test(codec_hier, two_hosts_of_two_pipelined, .timeout = 300) {
    hjob j = two_by_two;
    j.pipelined = 1;
    check_job(&j);
}

Test(codec_hier, three_hosts_of_two_pipelined, .timeout = 300) {
    const hjob j = {"codec-hier", 6, {"a", "b", "c", "a", "b", "c"}, 1, 0};
    check_job(&j);
}

/* Hosts of unequal size, 3 + 2 interleaved (b a b a b): two segments, owned
 * by local ranks 0 and 1 of each host; host b's third rank sends its copies
 * to them and gets the result back. Whole and pipelined. */
Test(codec_hier, hosts_of_three_and_two, .timeout = 300) {
    const hjob j = {"codec-hier", 5, {"b", "a", "b", "a", "b"}, 0, 0};
    check_job(&j);
}

Test(codec_hier, hosts_of_three_and_two_pipelined, .timeout = 300) {
    const hjob j = {"codec-hier", 5, {"b", "a", "b", "a", "b"}, 1, 0};
    check_job(&j);
}

/* Over each host's shared segment (codec-hier-seg for the fixed-size
 * codecs; topk stays on codec-hier): 2 x 2 in one chunk, 3 hosts of 2 and
 * 3 + 2 in chunks of 8 Ki floats (TERSE_SEGMENT_STEP_BYTES=64K). */
Test(codec_hier, two_hosts_of_two_over_the_segments, .timeout = 300) {
    hjob j = two_by_two;
    j.seg = 1;
    check_job(&j);
}

Test(codec_hier, three_hosts_of_two_over_the_segments_in_chunks, .timeout = 300) {
    const hjob j = {"codec-hier", 6, {"a", "b", "c", "a", "b", "c"}, 1, 1};
    check_job(&j);
}

Test(codec_hier, hosts_of_three_and_two_over_the_segments_in_chunks, .timeout = 300) {
    const hjob j = {"codec-hier", 5, {"b", "a", "b", "a", "b"}, 1, 1};
    check_job(&j);
}

/* Rank 3's codec is bound to another size: every rank fails with
 * TERSE_ERR_SHAPE, none hangs or returns TERSE_OK. */
static int mismatch_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int r = terse_comm_rank(c);
    const size_t cols = r == 3 ? COLS + 64 : COLS, n = (size_t)ROWS * cols;
    terse_codec *codec = NULL;
    TR_CALL(o, terse_codec_create("int8:ef=1", ROWS, cols, &codec));
    float *y = calloc(n, sizeof(float));
    o->u[1] = strncmp(terse_allreduce_algorithm(c, codec, n), "codec-hier", 10) == 0;
    /* every rank past init: a rank that fails fast and leaves must not
     * fail another's init */
    tr_say_ready(o);
    tr_wait_all_ready(c, o);
    o->u[0] = (uint64_t)terse_allreduce(c, y, n, codec, TERSE_OP_SUM);
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    free(y);
    terse_codec_free(codec);
    return 0;
}

Test(codec_hier, a_rank_with_another_size_fails_every_rank_with_shape, .timeout = 300) {
    unsetenv("TERSE_TOPOLOGY");
    unsetenv("TERSE_COMPRESSED_ALGO");
    tr_before_init = set_host;
    tr_job job = {"tcp", NR, 20000, 60, -1};
    tr_out *o = tr_run(&job, mismatch_body, &two_by_two);
    for (int r = 0; r < NR; r++) {
        cr_expect(o[r].u[1], "rank %d: not on codec-hier", r);
        cr_expect_eq(o[r].u[0], TERSE_ERR_SHAPE, "rank %d: %s: %s", r,
                     terse_status_name((terse_status)o[r].u[0]), o[r].err);
    }
    tr_release(o);
}

/* Rank 3 stops between codec-hier all-reduces (int8:ef=1, 2M floats) and
 * rank 0 kills it once its call failed: every survivor fails within the timeout with
 * PEER_LOST or TIMEOUT, and its codec is left as it was before the failed
 * call (the snapshot): u[1], the residual after the failure equals the
 * residual after the last call that succeeded. */
static int kill_seg; /* the job runs over the hosts' segments (codec-hier-seg) */

static int kill_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const size_t n = 1u << 21;
    terse_codec *codec = NULL;
    TR_CALL(o, terse_codec_create("int8:ef=1", 1, n, &codec));
    float *y = malloc(n * sizeof(float)), *keep = malloc(n * sizeof(float));
    if (!y || !keep) return tr_fail(o, TERSE_ERR_NOMEM, "malloc");
    tu_fill_gauss(y, n, 77 + (uint64_t)terse_comm_rank(c));
    TR_CALL(o, terse_allreduce(c, y, n, codec, TERSE_OP_AVG));
    o->hash[1] = kill_seg ? !strcmp(terse_allreduce_algorithm(c, codec, n), "codec-hier-seg") &&
                                c->lseg_step > 0 /* the first call ran over the segments */
                          : !strcmp(terse_allreduce_algorithm(c, codec, n), "codec-hier") &&
                                terse__codec_hier_parts(c, codec) == 2;
    tr_say_ready(o);
    tr_wait_all_ready(c, o);
    /* rank 3 stops before the next call (a loss would be refused before
     * any work): its rail partner, rank 1, has summed and encoded its
     * segment when its wait for rank 3's message times out */
    const int r = terse_comm_rank(c);
    o->u[7] = (uint64_t)getpid();
    if (r == NR - 1) raise(SIGSTOP); /* killed by rank 0 below */
    int failed = tr_allreduce_until_failure(c, o, y, n, codec, TERSE_OP_AVG, 5000, keep);
    if (failed) o->u[1] = memcmp(keep, terse_codec_residual(codec), n * sizeof(float)) == 0;
    if (r == 0) kill((pid_t)(o - r)[NR - 1].u[7], SIGKILL);
    free(y);
    free(keep);
    terse_codec_free(codec);
    return failed ? 0
                  : tr_fail(o, TERSE_OK, "5000 all-reduces succeeded although a rank was killed");
}

Test(codec_hier, a_killed_rank_fails_every_survivor_with_its_codec_as_before) {
    unsetenv("TERSE_TOPOLOGY");
    unsetenv("TERSE_COMPRESSED_ALGO");
    const int timeout_ms = 3000;
    tr_before_init = set_host;
    tr_known_segv = TR_RXM_TEARDOWN_SEGV;
    tr_job job = {"tcp", NR, timeout_ms, 60, NR - 1};
    /* no call descriptors: with them, rank 0's data would wait for rank 3's
     * descriptor, and host a would never get as far as encoding */
    setenv("TERSE_CHECK_CALLS", "off", 1);
    /* one chunk (the whole variant): pipelined, the hello crosses the rail
     * first, and rank 1 would fail waiting for rank 3's before encoding */
    setenv("TERSE_RING_CHUNK_BYTES", "16777216", 1);
    setenv("TERSE_SHM_SEGMENT", "off", 1); /* codec-hier over shm (in one chunk) */
    tr_out *o = tr_run(&job, kill_body, &two_by_two);
    unsetenv("TERSE_CHECK_CALLS");
    unsetenv("TERSE_RING_CHUNK_BYTES");
    unsetenv("TERSE_SHM_SEGMENT");
    tr_known_segv = NULL;
    for (int r = 0; r < NR - 1; r++) {
        if (!o[r].finished) continue; /* the known crash: tr_run warned */
        terse_status s = (terse_status)o[r].u[0];
        cr_expect_eq(o[r].hash[1], 1, "survivor %d: not codec-hier in one chunk", r);
        cr_expect(s == TERSE_ERR_PEER_LOST || s == TERSE_ERR_TIMEOUT, "survivor %d got %s (%s)",
                  r, terse_status_name(s), o[r].err);
        if (strstr(o[r].err, TR_SHM_LOCK_SPIN)) {
            fprintf(stderr, "WARNING: KNOWN LIMITATION: survivor %d spun on the dead rank's shm "
                            "region lock; its codec is as the abandoned executor left it: %s\n",
                    r, o[r].err);
            continue;
        }
        cr_expect_eq(o[r].u[1], 1, "survivor %d's residual changed in the failed call (%s: %s)",
                     r, terse_status_name(s), o[r].err);
    }
    tr_release(o);
}

/* The same over the hosts' segments (codec-hier-seg, 16 chunks): rank 3
 * stops between calls; rank 2 names it from the segment, rank 1 times out
 * waiting for rank 3's digest on the rail, and rank 0 waiting in the
 * segment for rank 1's input (so no survivor got as far as encoding here:
 * the residual check holds trivially; the old path's test above covers the
 * snapshot's restore, which is the same code). Every survivor fails by the
 * timeout, none hangs. */
Test(codec_hier, a_stopped_rank_fails_every_survivor_over_the_segments) {
    unsetenv("TERSE_TOPOLOGY");
    unsetenv("TERSE_COMPRESSED_ALGO");
    const int timeout_ms = 3000;
    tr_before_init = set_host;
    tr_known_segv = TR_RXM_TEARDOWN_SEGV;
    tr_job job = {"tcp", NR, timeout_ms, 60, NR - 1};
    setenv("TERSE_CHECK_CALLS", "off", 1);
    setenv("TERSE_SHM_SEGMENT", "auto", 1);
    kill_seg = 1;
    tr_out *o = tr_run(&job, kill_body, &two_by_two);
    kill_seg = 0;
    unsetenv("TERSE_CHECK_CALLS");
    unsetenv("TERSE_SHM_SEGMENT");
    tr_known_segv = NULL;
    for (int r = 0; r < NR - 1; r++) {
        if (!o[r].finished) continue; /* the known crash: tr_run warned */
        terse_status s = (terse_status)o[r].u[0];
        cr_expect_eq(o[r].hash[1], 1, "survivor %d: not codec-hier-seg", r);
        cr_expect(s == TERSE_ERR_PEER_LOST || s == TERSE_ERR_TIMEOUT, "survivor %d got %s (%s)",
                  r, terse_status_name(s), o[r].err);
        cr_expect_eq(o[r].u[1], 1, "survivor %d's residual changed in the failed call (%s: %s)",
                     r, terse_status_name(s), o[r].err);
        fprintf(stderr, "codec-hier-seg, rank 3 stopped: survivor %d: %s after %.0f ms: %s\n", r,
                terse_status_name(s), o[r].val[0], o[r].err);
    }
    cr_expect(strstr(o[2].err, "rank 3"), "rank 2 does not name rank 3: %s", o[2].err);
    tr_release(o);
}

/* A cut whose chunks cannot fit a segment step (int8 in buckets of 64 Ki
 * floats on 120300 elements: two buckets; steps of 16 Ki floats): the name
 * says codec-hier, the segments run no step, and every rank gets the same
 * bits. */
static int big_bucket_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    terse_codec *codec = NULL;
    TR_CALL(o, terse_codec_create("int8:bucket=65536", ROWS, COLS, &codec));
    float *y = malloc(NE * sizeof *y);
    if (!y) return tr_fail(o, TERSE_ERR_NOMEM, "malloc");
    rank_input(terse_comm_rank(c), y);
    o->u[0] = !strcmp(terse_allreduce_algorithm(c, codec, NE), "codec-hier");
    const uint64_t steps0 = c->lseg_step;
    TR_CALL(o, terse_allreduce(c, y, NE, codec, TERSE_OP_AVG));
    o->u[1] = c->lseg_step - steps0;
    o->u[2] = c->lseg_on;
    o->hash[0] = tr_hash(y, NE * sizeof *y);
    free(y);
    terse_codec_free(codec);
    return 0;
}

Test(codec_hier, a_cut_too_coarse_for_a_segment_step_takes_codec_hier_and_says_so) {
    unsetenv("TERSE_TOPOLOGY");
    unsetenv("TERSE_COMPRESSED_ALGO");
    setenv("TERSE_SEGMENT_STEP_BYTES", "65536", 1);
    tr_before_init = set_host;
    tr_job job = {"tcp", NR, 20000, 60, -1};
    tr_out *o = tr_run(&job, big_bucket_body, &two_by_two);
    unsetenv("TERSE_SEGMENT_STEP_BYTES");
    for (int r = 0; r < NR; r++) {
        cr_assert(o[r].finished && o[r].status == 0, "rank %d failed: %s", r, o[r].err);
        cr_expect_eq(o[r].u[2], 1, "rank %d: no segments", r);
        cr_expect_eq(o[r].u[0], 1, "rank %d: the name is not codec-hier", r);
        cr_expect_eq(o[r].u[1], 0, "rank %d ran %llu segment steps", r,
                     (unsigned long long)o[r].u[1]);
        cr_expect_eq(o[r].hash[0], o[0].hash[0], "rank %d's bits differ from rank 0's", r);
    }
    tr_release(o);
}
