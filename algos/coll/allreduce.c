/* terse_allreduce: checks its arguments and picks the algorithm.
 *
 *   no codec            dense fp32: with every rank on one host, over the
 *                       host's shared segment (seg_allreduce.c) unless
 *                       TERSE_SHM_SEGMENT=off; else recursive doubling up to
 *                       TERSE_RD_MAX_BYTES (64 KiB), else the pipelined ring;
 *                       with several hosts of equal size (and TERSE_TOPOLOGY
 *                       not flat) the hierarchical one above that size
 *                       (hier_allreduce.c; at any size with hier), its
 *                       intra-host phases over each host's shared segment
 *                       unless TERSE_SHM_SEGMENT=off (seg_allreduce.c) -- the
 *                       dense sums inside rounds and summable codecs too
 *   a codec             whatever its function table offers
 *                       (compress/aggregate.h), in this order:
 *     rounds            its rounds of dense sums (none: one, its input;
 *                       powersgd: P, then Q) (rounds_allreduce.c)
 *     summable view     the ring over the values inside the messages
 *                       (randk; summable_allreduce.c)
 *     messages          the messages themselves travel (fp16, bf16, int8,
 *                       qsgd, terngrad, sign, topk, vq, plugins):
 *                       - all-gather of every rank's message, decoded in
 *                         rank order: pipelined piece by piece, every rank
 *                         sending to every other (pipe_allreduce.c), where
 *                         the codec is cut into two pieces or more
 *                         (TERSE_PIPELINE_BYTES) and the requests fit (up to
 *                         8 ranks for fixed-size codecs, 6 for others),
 *                         else the ring all-gather of whole messages
 *                         (gather_allreduce.c); or
 *                       - reduce-scatter of segment pieces, re-encode, and
 *                         all-gather of the reduced segments
 *                         (rs_allreduce.c), when the codec can be cut and
 *                         want_rs says so.
 *                       first, with several hosts of equal size (as for
 *                       dense-hier, TERSE_COMPRESSED_ALGO auto) and a codec
 *                       cut into local_size segments: the compressed
 *                       hierarchical one, fp32 inside hosts and the codec
 *                       between them (codec_hier_allreduce.c).
 *
 * algos/ knows no codec by id. Every choice depends only on what all ranks
 * share (n, the codec's spec, the rank count, TERSE_COMPRESSED_ALGO, agreed
 * at init), so all ranks run the same algorithm. */
#include <stdio.h>

#include "algos/coll/coll.h"
#include "common/error.h"
#include "compress/aggregate.h"

terse_status terse__allreduce_dense(terse_comm *c, float *buf, size_t n, int divide) {
    if (c->seg) return terse__allreduce_seg(c, buf, n, divide);
    if (terse__hier_wanted(c, n))
        return terse__hier_seg_fits(c) ? terse__allreduce_hier_seg(c, buf, n, divide)
                                       : terse__allreduce_hier(c, buf, n, divide);
    if (n <= terse__rd_max_bytes(c) / sizeof(float)) return terse__allreduce_rd(c, buf, n, divide);
    return terse__allreduce_ring(c, buf, n, divide);
}

terse_status terse__allreduce_check(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                   terse_op op) {
    if (op != TERSE_OP_SUM && op != TERSE_OP_AVG)
        return TERSE_ERROR(TERSE_ERR_INVALID, "terse_allreduce on rank %d: unknown op %d",
                           c->rank, (int)op);
    if (n > 0 && !buf)
        return TERSE_ERROR(TERSE_ERR_INVALID, "terse_allreduce on rank %d: buf is NULL, n = %zu",
                           c->rank, n);
    if (n > TERSE_MAX_ELEMENTS)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_allreduce on rank %d: n = %zu exceeds TERSE_MAX_ELEMENTS",
                           c->rank, n);
    if (codec && terse_codec_elements(codec) != n)
        return TERSE_ERROR(TERSE_ERR_SHAPE,
                           "terse_allreduce on rank %d: codec '%s' is bound to %zu elements, "
                           "n = %zu",
                           c->rank, terse_codec_spec(codec), terse_codec_elements(codec), n);
    return TERSE_OK;
}

/* Reduce-scatter instead of the all-gather of whole messages?
 * TERSE_COMPRESSED_ALGO=gather|rs decides. By default (auto) rs when
 *   - N >= 4,
 *   - the all-gather would move more bytes than the dense ring: with
 *     messages of M bytes (the codec's bound) for n floats, (N - 1) M >
 *     2 (N - 1) / N x 4 n, i.e. N M > 8 n -- the codec's compression ratio
 *     is below N / 2, so gathering whole messages gives back what it saved
 *     (fp16 from 4 ranks, int8 from 8, 4-bit qsgd from 16, sign from 63);
 *   - and a message's 1/N share is still >= 16 KiB (below, the latency of
 *     the reduce-scatter's twice as many messages dominates).
 * Why not always from 4 ranks, where it is faster: the re-encode of each
 * segment's sum is a second quantization, and in terse-bench train it cost
 * 0.5 to 1.5 points of accuracy against the all-gather at 2, 4 and 8
 * workers (docs/collectives.md); the all-gather keeps each rank's message
 * exact. So auto spends accuracy only where the all-gather would cost more
 * than not compressing at all. */
#define RS_MIN_RANKS 4
#define RS_MIN_PIECE_BYTES ((size_t)16 << 10)

static int want_rs(const terse_comm *c, const terse_codec *codec) {
    if (c->params.compressed_algo == 1) return 0;
    if (c->params.compressed_algo == 2) return c->nranks >= 2;
    const size_t N = (size_t)c->nranks, M = terse_codec_bound(codec);
    const size_t n = terse_codec_elements(codec);
    if (N < RS_MIN_RANKS || M / N < RS_MIN_PIECE_BYTES) return 0;
    /* N M > 8 n, in floating point: no overflow for any n <= 2^36 */
    return (double)N * (double)M > 8.0 * (double)n;
}

typedef enum { RUN_ROUNDS, RUN_SUMMABLE, RUN_GATHER, RUN_PIPE, RUN_RS, RUN_HIER } run_kind;

static int pipe_fits(const terse_comm *c, const terse_codec *codec) {
    return terse__pipe_fits(c->nranks, terse__codec_fixed_size(codec));
}

/* Which path, and for the reduce-scatter the codec's cut, prepared before
 * the snapshot (the cut's residual is part of it). A codec that cannot be
 * cut (no segment_align, or fewer buckets than ranks) takes the gather;
 * the gather's pieces are prepared here too (NULL: one whole message). */
static terse_status choose(terse_comm *c, terse_codec *codec, run_kind *kind,
                           const terse__pieces **pieces) {
    *pieces = NULL;
    switch (terse__codec_agg_kind(codec)) {
    case TERSE__AGG_ROUNDS: *kind = RUN_ROUNDS; return TERSE_OK;
    case TERSE__AGG_SUMMABLE: *kind = RUN_SUMMABLE; return TERSE_OK;
    default: break;
    }
    *kind = RUN_GATHER;
    uint64_t t0 = terse__now_ns();
    terse_status s = TERSE_OK;
    if (terse__codec_hier_wanted(c, codec)) {
        const terse__segments *g = NULL;
        s = terse__codec_segments(codec, terse__codec_hier_parts(c, codec),
                                  terse__codec_hier_cut_rank(c), &g);
        if (s == TERSE_OK && g) *kind = RUN_HIER;
    }
    if (s == TERSE_OK && *kind == RUN_GATHER && want_rs(c, codec)) {
        const terse__segments *g = NULL;
        s = terse__codec_segments(codec, (uint32_t)c->nranks, (uint32_t)c->rank, &g);
        if (s == TERSE_OK && g) *kind = RUN_RS;
    }
    if (s == TERSE_OK && *kind == RUN_GATHER && pipe_fits(c, codec)) {
        s = terse__codec_pieces(codec, c->params.pipeline_bytes / sizeof(float), pieces);
        if (s == TERSE_OK && *pieces) *kind = RUN_PIPE; /* one piece: nothing to overlap */
    }
    terse__comm_codec_time(c, t0);
    return s;
}

/* The codec's state before the call, so that a failed collective can put
 * it back (transactional state: residual, step, stream, PowerSGD's Q, the
 * reduce-scatter's hop residual). */
static terse_status snapshot(terse_comm *c, terse_codec *codec) {
    void *p = terse__comm_scratch(c, TERSE__SCRATCH_STATE, terse__codec_snapshot_size(codec));
    if (!p) return TERSE_ERR_NOMEM;
    uint64_t t0 = terse__now_ns();
    terse_status s = terse__codec_snapshot(codec, p);
    terse__comm_codec_time(c, t0);
    return s;
}

static terse_status run_codec(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                              terse_op op, run_kind kind, const terse__pieces *pieces) {
    switch (kind) {
    case RUN_PIPE: return terse__allreduce_pipe(c, buf, n, codec, op, pieces);
    case RUN_ROUNDS: return terse__allreduce_rounds(c, buf, n, codec, op);
    case RUN_SUMMABLE: return terse__allreduce_summable(c, buf, n, codec, op);
    case RUN_RS: return terse__allreduce_rs(c, buf, n, codec, op);
    case RUN_HIER: return terse__allreduce_codec_hier(c, buf, n, codec, op);
    default: return terse__allreduce_gather(c, buf, n, codec, op);
    }
}

const char *terse_allreduce_algorithm(const terse_comm *c, const terse_codec *codec, size_t n) {
    if (!c) return "invalid";
    if (!codec) {
        if (c->nranks == 1) return "local";
        if (c->seg) return "dense-seg";
        if (terse__hier_wanted(c, n))
            return terse__hier_seg_fits(c) ? "dense-hier-seg" : "dense-hier";
        return n <= terse__rd_max_bytes(c) / sizeof(float) ? "dense-rd" : "dense-ring";
    }
    switch (terse__codec_agg_kind(codec)) {
    case TERSE__AGG_ROUNDS: return "rounds";
    case TERSE__AGG_SUMMABLE: return "summable";
    default: break;
    }
    if (c->nranks == 1) return "gather";
    if (terse__codec_hier_wanted(c, codec))
        return terse__codec_hier_seg_ok(c, codec) ? "codec-hier-seg" : "codec-hier";
    if (want_rs(c, codec) && terse__codec_can_cut(codec, (uint32_t)c->nranks)) return "rs";
    if (pipe_fits(c, codec) &&
        terse__codec_piece_count(codec, c->params.pipeline_bytes / sizeof(float)) > 1)
        return "gather-pipe";
    return "gather";
}

terse_status terse__allreduce_run(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                  terse_op op) {
    if (!codec) return terse__allreduce_dense(c, buf, n, op == TERSE_OP_AVG);
    run_kind kind;
    const terse__pieces *pieces;
    TERSE_CHECK(choose(c, codec, &kind, &pieces));
    TERSE_CHECK(snapshot(c, codec));
    terse_status s = run_codec(c, buf, n, codec, op, kind, pieces);
    if (s != TERSE_OK) {
        /* Keep the sentence of the failure, not of the restore. */
        char why[512];
        snprintf(why, sizeof why, "%s", terse_last_error());
        if (terse__codec_restore(codec, c->scratch[TERSE__SCRATCH_STATE]) != TERSE_OK)
            fprintf(stderr, "terse: rank %d: restoring codec '%s' after a failed allreduce "
                            "failed: %s\n", c->rank, terse_codec_spec(codec), terse_last_error());
        terse__error_restore(why);
    }
    return s;
}
