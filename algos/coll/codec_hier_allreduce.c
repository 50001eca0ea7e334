/* The compressed hierarchical all-reduce ("codec-hier", issue 28, item 3):
 * for codecs whose messages travel (fp16, bf16, int8, qsgd, terngrad, sign,
 * topk, plugins) and whose tensor can be cut into L segments on the
 * codec's buckets (terse__codec_segments with L parts), in a job of H hosts
 * of L ranks each (for hosts of unequal size see phase 2). Local rank l
 * owns segment l:
 *
 *   1. hello inside the host: each rank sends its local peers an 8-byte
 *      digest of its codec spec, shape and cut; a rank whose cut differs is
 *      refused (TERSE_ERR_CORRUPT) before a segment of the wrong size moves;
 *   2. exact fp32 reduce-scatter inside the host (shm): every local rank
 *      sends segment j to local rank j, and the owner sums its segment's L
 *      copies in local-rank order;
 *      (hosts of unequal size: the tensor is cut into S segments, S the
 *      fewest ranks a host holds, owned by local ranks 0 .. S - 1 of every
 *      host; a host's other ranks send their copies to the owners and get
 *      the result back in phase 5, and own no residual -- as dense-hier's
 *      shards)
 *   3. the owner encodes its host's sum of segment l with the call's codec
 *      (error feedback: the codec's residual over segment l -- this rank's
 *      across calls, since it always owns segment l; the rest of the
 *      residual stays untouched), and exchanges it with the H - 1 other
 *      members of its rail (local rank l on the other hosts; the network):
 *      first [length, digest] (framing), then the messages;
 *   4. every rail member decodes the H messages in host order into the
 *      fp32 sum (scaled by 1 / N for an average): the same arithmetic on
 *      the same bytes, so every member of the rail gets the same bits;
 *   5. fp32 all-gather inside the host: the owner sends its final segment
 *      to its local peers.
 * Every rank therefore ends with the same bits, and the same inputs, H, L
 * and codec give the same bits run to run (not the flat paths' bits).
 *
 * Bytes across the host link per rank each way: (H - 1) messages of one
 * segment, about (H - 1) / L of the codec's message (plus H - 1 16-byte
 * headers); the flat all-gather sends (N - 1) whole messages.
 *
 * Error: the result is sum over hosts of D(C(host sum + e)): one encode per
 * host sum of a segment, instead of one per rank (docs/collectives.md). A
 * codec with relative error beta errs by at most beta ||host sum|| per host,
 * no re-encode on top (the reduce-scatter path's second quantization).
 *
 * Pipelined for fixed-size codecs (TERSE_CODEC_FIXED_SIZE: no lengths
 * travel) whose shards would hold more than two ring chunks of fp32, as
 * dense-hier: the tensor is cut into T chunks of L segments each
 * (terse__codec_hier_parts; segment t L + j is chunk t's, owned by local
 * rank j, so each owner keeps its residual over its segments), the hello
 * carries the digest to the rail as well, and the reduce-scatter of chunk
 * t, the rail exchange of t - 1 and the all-gather of t - 2 travel
 * together (pipelined() below). Other codecs (topk: lengths travel) run
 * the phases one after another on one chunk. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "algos/coll/coll.h"
#include "algos/coll/ring.h"
#include "common/error.h"
#include "compress/aggregate.h"

int terse__codec_hier_wanted(const terse_comm *c, const terse_codec *codec) {
    if (c->params.compressed_algo != 0) return 0; /* gather or rs asked for: flat */
    if (!terse__hier_wanted(c, terse_codec_elements(codec))) return 0;
    return terse__codec_can_cut(codec, (uint32_t)c->local_min);
}

/* The segments are there and the codec is of fixed size: the cut aims at
 * chunks of half a segment step (terse__codec_hier_parts). */
static int seg_base_ok(const terse_comm *c, const terse_codec *codec) {
    return terse__hier_seg_fits(c) && terse__codec_fixed_size(codec);
}

/* ... and that cut's chunks fit a step (bucket rounding or the cap on
 * chunks could make one larger; then the pipelined codec-hier runs on the
 * same cut). From the codec's spec and the host table only: every rank
 * whose codec has the same options decides alike. */
int terse__codec_hier_seg_ok(const terse_comm *c, const terse_codec *codec) {
    if (!seg_base_ok(c, codec)) return 0;
    const size_t B = terse__comm_seg_step_bytes(c) / sizeof(float);
    return terse__codec_cut_max_span(codec, terse__codec_hier_parts(c, codec),
                                     (uint32_t)c->local_min) <= B;
}

uint32_t terse__codec_hier_parts(const terse_comm *c, const terse_codec *codec) {
    const size_t L = (size_t)c->local_min, n = terse_codec_elements(codec);
    if (!terse__codec_fixed_size(codec)) return (uint32_t)L; /* lengths travel: one chunk */
    size_t T;
    if (seg_base_ok(c, codec)) {
        /* over the segments: chunks of about half a segment step, so that
         * the cut's bucket rounding keeps each within a step
         * (terse__codec_hier_seg_ok checks) */
        const size_t half = terse__comm_seg_step_bytes(c) / sizeof(float) / 2;
        T = (n + half - 1) / half;
    } else {
        /* chunks whose shards hold two ring chunks of fp32, as dense-hier's */
        const size_t per_shard = 2 * terse__ring_chunk_bytes(c) / sizeof(float);
        T = (n + L * per_shard - 1) / (L * per_shard);
    }
    if (T > 4096) T = 4096;
    while (T > 1 && !terse__codec_can_cut(codec, (uint32_t)(L * T))) T--;
    return (uint32_t)(L * (T ? T : 1));
}

static terse_status pipelined(terse_comm *c, float *buf, terse_codec *codec, terse_op op,
                              const terse__segments *g);

terse_status terse__allreduce_codec_hier(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                         terse_op op) {
    (void)n; /* the codec is bound to n elements (terse_allreduce checked) */
    const int L = c->local_size, S = c->local_min, H = c->nhosts, l = c->local_rank,
              h = c->host_index;
    const int owner = l < S;
    const terse__segments *g = NULL;
    const uint32_t parts = terse__codec_hier_parts(c, codec);
    TERSE_CHECK(terse__codec_segments(codec, parts, terse__codec_hier_cut_rank(c), &g));
    if (!g)
        return TERSE_ERROR(TERSE_ERR_INTERNAL, "rank %d: codec '%s' has no %u segments", c->rank,
                           terse_codec_spec(codec), parts);
    if (terse__codec_hier_seg_ok(c, codec) && terse__codec_hier_seg_fits(c, g))
        return terse__allreduce_codec_hier_seg(c, buf, codec, op, g);
    if (parts > (uint32_t)S) return pipelined(c, buf, codec, op, g);
    size_t max_len = 0;
    for (int j = 0; j < S; j++)
        if (g->len[j] > max_len) max_len = g->len[j];
    const size_t stride = (max_len + 15) & ~(size_t)15;
    const size_t slot = (g->max_bound + 63) & ~(size_t)63;
    if (stride > SIZE_MAX / sizeof(float) / (size_t)L || slot > SIZE_MAX / (size_t)H)
        return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: scratch for %d segments overflows",
                           c->rank, L);
    float *tmp = terse__comm_scratch(c, 1, (size_t)L * stride * sizeof(float));
    uint8_t *msg = terse__comm_scratch(c, 0, (size_t)H * slot);
    uint64_t *hdr = terse__comm_scratch(c, 2, (2 * (size_t)H + (size_t)L) * sizeof(uint64_t));
    if (!tmp || !msg || !hdr) return TERSE_ERR_NOMEM;
    uint64_t *hello = hdr + 2 * (size_t)H; /* L digests */
    int local[TERSE__COMM_MAX_REQS] = {0}, rail[TERSE__COMM_MAX_REQS] = {0};
    terse__hier_peers(c, local, rail);
    const uint64_t digest = terse__codec_cut_digest(codec);
    /* an owner's segment (a rank beyond the S-th of its host owns none) */
    const size_t mlen = owner ? g->len[l] : 0;
    float *mine = buf + (owner ? g->off[l] : 0);

    /* 1. hello inside the host */
    terse__comm_next_phase(c);
    size_t nreq = 0;
    hello[l] = digest;
    for (int j = 0; j < L; j++) {
        if (j == l) continue;
        TERSE_CHECK(terse__comm_irecv(c, local[j], terse__comm_tag(c, 0), &hello[j],
                                      sizeof(uint64_t), TERSE__BYTES_FRAMING, &c->reqs[nreq++]));
        TERSE_CHECK(terse__comm_isend(c, local[j], terse__comm_tag(c, 0), &hello[l],
                                      sizeof(uint64_t), TERSE__BYTES_FRAMING, &c->reqs[nreq++]));
    }
    TERSE_CHECK(terse__comm_wait(c, c->reqs, nreq));
    for (int j = 0; j < L; j++)
        if (hello[j] != digest) {
            c->desc_failed = c->desc_on; /* told to the others through the store */
            return TERSE_ERROR(TERSE_ERR_CORRUPT,
                               "rank %d: rank %d's codec or its cut into %d segments differs "
                               "from this rank's '%s' (do all ranks use the same spec and "
                               "shape?)",
                               c->rank, local[j], L, terse_codec_spec(codec));
        }

    /* 2. reduce-scatter inside the host: our segment's L copies, summed in
     * local-rank order into buf; every local rank sends segment j to its
     * owner, local rank j < S */
    terse__comm_next_phase(c);
    nreq = 0;
    for (int j = 0; j < L; j++) {
        if (j == l) continue;
        if (owner)
            TERSE_CHECK(terse__comm_irecv(c, local[j], terse__comm_tag(c, 0),
                                          tmp + (size_t)j * stride, mlen * sizeof(float),
                                          TERSE__BYTES_PAYLOAD, &c->reqs[nreq++]));
        if (j < S)
            TERSE_CHECK(terse__comm_isend(c, local[j], terse__comm_tag(c, 0), buf + g->off[j],
                                          g->len[j] * sizeof(float), TERSE__BYTES_PAYLOAD,
                                          &c->reqs[nreq++]));
    }
    TERSE_CHECK(terse__comm_wait(c, c->reqs, nreq));
    if (!owner) {
        /* the owners' phases 3 and 4 (two phases: every rank numbers them
         * alike), then their segments come back in phase 5 */
        terse__comm_next_phase(c);
        terse__comm_next_phase(c);
        goto gather;
    }
    uint64_t t0 = terse__now_ns();
    memcpy(tmp + (size_t)l * stride, mine, mlen * sizeof(float));
    memcpy(mine, tmp, mlen * sizeof(float));
    for (int j = 1; j < L; j++) terse__reduce_add(mine, tmp + (size_t)j * stride, mlen, 0, 1.0f);

    /* 3. encode our host's sum of segment l, exchange across the rail */
    uint8_t *own = msg + (size_t)h * slot;
    size_t own_len = 0;
    terse_status s = terse__codec_encode_segment(codec, (uint32_t)l, mine, own, slot, &own_len);
    terse__comm_codec_time(c, t0);
    TERSE_CHECK(s);
    TERSE_CHECK(terse__comm_poll_abort(c, "encoding a host's segment"));
    terse__comm_next_phase(c);
    nreq = 0;
    hdr[2 * h] = own_len;
    hdr[2 * h + 1] = digest;
    for (int q = 0; q < H; q++) {
        if (q == h) continue;
        TERSE_CHECK(terse__comm_irecv(c, rail[q], terse__comm_tag(c, 0), &hdr[2 * q],
                                      2 * sizeof(uint64_t), TERSE__BYTES_FRAMING,
                                      &c->reqs[nreq++]));
        TERSE_CHECK(terse__comm_isend(c, rail[q], terse__comm_tag(c, 0), &hdr[2 * h],
                                      2 * sizeof(uint64_t), TERSE__BYTES_FRAMING,
                                      &c->reqs[nreq++]));
    }
    TERSE_CHECK(terse__comm_wait(c, c->reqs, nreq));
    const size_t bound = terse_codec_bound(g->child[l]);
    for (int q = 0; q < H; q++) {
        if (hdr[2 * q + 1] != digest) {
            c->desc_failed = c->desc_on; /* told to the others through the store */
            return TERSE_ERROR(TERSE_ERR_CORRUPT,
                               "rank %d: rank %d's codec or its cut into %d segments differs "
                               "from this rank's '%s' (do all ranks use the same spec and "
                               "shape?)",
                               c->rank, rail[q], L, terse_codec_spec(codec));
        }
        if (hdr[2 * q] < TERSE_WIRE_HEADER_SIZE || hdr[2 * q] > bound)
            return TERSE_ERROR(TERSE_ERR_CORRUPT,
                               "rank %d: rank %d announces a %llu-byte message for segment %d, "
                               "but codec '%s' writes %u to %zu bytes there",
                               c->rank, rail[q], (unsigned long long)hdr[2 * q], l,
                               terse_codec_spec(codec), TERSE_WIRE_HEADER_SIZE, bound);
    }
    terse__comm_next_phase(c);
    nreq = 0;
    for (int q = 0; q < H; q++) {
        if (q == h) continue;
        TERSE_CHECK(terse__comm_irecv(c, rail[q], terse__comm_tag(c, 0), msg + (size_t)q * slot,
                                      (size_t)hdr[2 * q], TERSE__BYTES_PAYLOAD, &c->reqs[nreq++]));
        TERSE_CHECK(terse__comm_isend(c, rail[q], terse__comm_tag(c, 0), own, own_len,
                                      TERSE__BYTES_PAYLOAD, &c->reqs[nreq++]));
    }
    TERSE_CHECK(terse__comm_wait(c, c->reqs, nreq));

    /* 4. decode the H messages in host order */
    const float alpha = op == TERSE_OP_AVG ? 1.0f / (float)c->nranks : 1.0f;
    t0 = terse__now_ns();
    for (int q = 0; q < H; q++) {
        s = terse__codec_decode_segment(codec, (uint32_t)l, msg + (size_t)q * slot,
                                        (size_t)hdr[2 * q], mine, alpha, q > 0);
        if (s != TERSE_OK) {
            terse__comm_codec_time(c, t0);
            char why[400];
            snprintf(why, sizeof why, "%s", terse__comm_last_sentence());
            return TERSE_ERROR(s, "rank %d: decoding rank %d's message for segment %d: %s",
                               c->rank, rail[q], l, why);
        }
    }
    terse__comm_codec_time(c, t0);

    /* 5. all-gather inside the host: the owners' final segments */
gather:
    terse__comm_next_phase(c);
    nreq = 0;
    for (int j = 0; j < L; j++) {
        if (j == l) continue;
        if (j < S)
            TERSE_CHECK(terse__comm_irecv(c, local[j], terse__comm_tag(c, 0), buf + g->off[j],
                                          g->len[j] * sizeof(float), TERSE__BYTES_PAYLOAD,
                                          &c->reqs[nreq++]));
        if (owner)
            TERSE_CHECK(terse__comm_isend(c, local[j], terse__comm_tag(c, 0), mine,
                                          mlen * sizeof(float), TERSE__BYTES_PAYLOAD,
                                          &c->reqs[nreq++]));
    }
    TERSE_CHECK(terse__comm_wait(c, c->reqs, nreq));
    terse__codec_segments_done(codec);
    return TERSE_OK;
}

/* The pipelined variant, for fixed-size codecs (no lengths travel) cut into
 * T > 1 chunks of S segments (segment t S + j: chunk t, owner j; S = L
 * with hosts of equal size). At step
 * t the requests of the reduce-scatter of chunk t, the rail exchange of
 * chunk t - 1 (encoded at the end of step t - 1) and the all-gather of
 * chunk t - 2 (decoded at the end of step t - 1) are posted together and
 * waited for; then chunk t's copies are summed and encoded, and chunk t -
 * 1's messages decoded in host order. Same arithmetic per segment as the
 * whole variant, so every rank still ends with the same bits. */
static terse_status pipelined(terse_comm *c, float *buf, terse_codec *codec, terse_op op,
                              const terse__segments *g) {
    const int L = c->local_size, S = c->local_min, H = c->nhosts, l = c->local_rank,
              h = c->host_index;
    const int owner = l < S; /* of segments t S + l */
    const size_t T = g->nranks / (size_t)S;
    size_t max_len = 0;
    for (uint32_t j = 0; j < g->nranks; j++)
        if (g->len[j] > max_len) max_len = g->len[j];
    const size_t stride = (max_len + 15) & ~(size_t)15;
    const size_t slot = (g->max_bound + 63) & ~(size_t)63;
    if (stride > SIZE_MAX / sizeof(float) / (size_t)L || slot > SIZE_MAX / (2 * (size_t)H))
        return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: scratch for %d segments overflows",
                           c->rank, L);
    float *tmp = terse__comm_scratch(c, 1, (size_t)L * stride * sizeof(float));
    /* chunk t's H messages at msg + (t % 2) H slot */
    uint8_t *msg = terse__comm_scratch(c, 0, 2 * (size_t)H * slot);
    uint64_t *hello = terse__comm_scratch(c, 2, ((size_t)L + (size_t)H) * sizeof(uint64_t));
    if (!tmp || !msg || !hello) return TERSE_ERR_NOMEM;
    int local[TERSE__COMM_MAX_REQS] = {0}, rail[TERSE__COMM_MAX_REQS] = {0};
    terse__hier_peers(c, local, rail);
    const uint64_t digest = terse__codec_cut_digest(codec);
    const float alpha = op == TERSE_OP_AVG ? 1.0f / (float)c->nranks : 1.0f;
#define SEG(t, j) ((size_t)(t) * (size_t)S + (size_t)(j))
#define MSG(t, q) (msg + ((size_t)((t) % 2) * (size_t)H + (size_t)(q)) * slot)

    /* hello: the digest to the local peers and the rail (no lengths later) */
    terse__comm_next_phase(c);
    size_t nreq = 0;
    uint64_t *lh = hello, *rh = hello + L;
    lh[l] = digest;
    rh[h] = digest;
    for (int j = 0; j < L; j++) {
        if (j == l) continue;
        TERSE_CHECK(terse__comm_irecv(c, local[j], terse__comm_tag(c, 0), &lh[j],
                                      sizeof(uint64_t), TERSE__BYTES_FRAMING, &c->reqs[nreq++]));
        TERSE_CHECK(terse__comm_isend(c, local[j], terse__comm_tag(c, 0), &lh[l],
                                      sizeof(uint64_t), TERSE__BYTES_FRAMING, &c->reqs[nreq++]));
    }
    for (int q = 0; q < H && owner; q++) {
        if (q == h) continue;
        TERSE_CHECK(terse__comm_irecv(c, rail[q], terse__comm_tag(c, 1), &rh[q],
                                      sizeof(uint64_t), TERSE__BYTES_FRAMING, &c->reqs[nreq++]));
        TERSE_CHECK(terse__comm_isend(c, rail[q], terse__comm_tag(c, 1), &rh[h],
                                      sizeof(uint64_t), TERSE__BYTES_FRAMING, &c->reqs[nreq++]));
    }
    TERSE_CHECK(terse__comm_wait(c, c->reqs, nreq));
    for (int k = 0; k < (owner ? L + H : L); k++)
        if (hello[k] != digest) {
            c->desc_failed = c->desc_on; /* told to the others through the store */
            return TERSE_ERROR(TERSE_ERR_CORRUPT,
                               "rank %d: rank %d's codec or its cut into %u segments differs "
                               "from this rank's '%s' (do all ranks use the same spec and "
                               "shape?)",
                               c->rank, k < L ? local[k] : rail[k - L], g->nranks,
                               terse_codec_spec(codec));
        }

    for (size_t t = 0; t < T + 2; t++) {
        terse__comm_next_phase(c);
        nreq = 0;
        /* 1. reduce-scatter of chunk t: segment t S + j to local rank j < S */
        if (t < T) {
            const uint64_t tag = terse__comm_tag(c, 0);
            const size_t mlen = owner ? g->len[SEG(t, l)] : 0;
            for (int j = 0; j < L; j++) {
                if (j == l) continue;
                if (owner)
                    TERSE_CHECK(terse__comm_irecv(c, local[j], tag, tmp + (size_t)j * stride,
                                                  mlen * sizeof(float), TERSE__BYTES_PAYLOAD,
                                                  &c->reqs[nreq++]));
                if (j < S)
                    TERSE_CHECK(terse__comm_isend(c, local[j], tag, buf + g->off[SEG(t, j)],
                                                  g->len[SEG(t, j)] * sizeof(float),
                                                  TERSE__BYTES_PAYLOAD, &c->reqs[nreq++]));
            }
        }
        /* 2. the rail exchange of chunk t - 1 (fixed sizes: the child's bound) */
        if (owner && t >= 1 && t - 1 < T) {
            const uint64_t tag = terse__comm_tag(c, 1);
            const size_t mb = terse_codec_bound(g->child[SEG(t - 1, l)]);
            for (int q = 0; q < H; q++) {
                if (q == h) continue;
                TERSE_CHECK(terse__comm_irecv(c, rail[q], tag, MSG(t - 1, q), mb,
                                              TERSE__BYTES_PAYLOAD, &c->reqs[nreq++]));
                TERSE_CHECK(terse__comm_isend(c, rail[q], tag, MSG(t - 1, h), mb,
                                              TERSE__BYTES_PAYLOAD, &c->reqs[nreq++]));
            }
        }
        /* 3. the all-gather of chunk t - 2: the owners' segments */
        if (t >= 2) {
            const uint64_t tag = terse__comm_tag(c, 2);
            for (int j = 0; j < L; j++) {
                if (j == l) continue;
                if (j < S)
                    TERSE_CHECK(terse__comm_irecv(c, local[j], tag, buf + g->off[SEG(t - 2, j)],
                                                  g->len[SEG(t - 2, j)] * sizeof(float),
                                                  TERSE__BYTES_PAYLOAD, &c->reqs[nreq++]));
                if (owner)
                    TERSE_CHECK(terse__comm_isend(c, local[j], tag, buf + g->off[SEG(t - 2, l)],
                                                  g->len[SEG(t - 2, l)] * sizeof(float),
                                                  TERSE__BYTES_PAYLOAD, &c->reqs[nreq++]));
            }
        }
        TERSE_CHECK(terse__comm_wait(c, c->reqs, nreq));
        uint64_t t0 = terse__now_ns();
        terse_status s = TERSE_OK;
        /* chunk t: sum in local-rank order, encode */
        if (owner && t < T) {
            const size_t sg = SEG(t, l), mlen = g->len[sg];
            float *mine = buf + g->off[sg];
            memcpy(tmp + (size_t)l * stride, mine, mlen * sizeof(float));
            memcpy(mine, tmp, mlen * sizeof(float));
            for (int j = 1; j < L; j++)
                terse__reduce_add(mine, tmp + (size_t)j * stride, mlen, 0, 1.0f);
            size_t len = 0;
            s = terse__codec_encode_segment(codec, (uint32_t)sg, mine, MSG(t, h), slot, &len);
            if (s == TERSE_OK)
                s = terse__codec_check_fixed(codec, c->rank, len,
                                             terse_codec_bound(g->child[sg]));
        }
        /* chunk t - 1: decode in host order */
        if (owner && s == TERSE_OK && t >= 1 && t - 1 < T) {
            const size_t sg = SEG(t - 1, l);
            const size_t mb = terse_codec_bound(g->child[sg]);
            for (int q = 0; q < H && s == TERSE_OK; q++) {
                s = terse__codec_decode_segment(codec, (uint32_t)sg, MSG(t - 1, q), mb,
                                                buf + g->off[sg], alpha, q > 0);
                if (s != TERSE_OK) {
                    terse__comm_codec_time(c, t0);
                    char why[400];
                    snprintf(why, sizeof why, "%s", terse__comm_last_sentence());
                    return TERSE_ERROR(s, "rank %d: decoding rank %d's message for segment %zu: "
                                          "%s",
                                       c->rank, rail[q], sg, why);
                }
            }
        }
        terse__comm_codec_time(c, t0);
        TERSE_CHECK(s);
    }
#undef SEG
#undef MSG
    terse__codec_segments_done(codec);
    return TERSE_OK;
}
