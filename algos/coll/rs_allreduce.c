/* Compressed all-reduce by reduce-scatter + all-gather, for codecs whose
 * messages travel as they are (not summable) and whose tensor can be cut
 * (segment_align, terse_plugin.h). Rank s owns segment s of the tensor
 * (compress/aggregate.c cuts it on the codec's bucket boundaries).
 *
 *   1. Every rank encodes its buffer segment by segment (its own error
 *      feedback over the whole tensor, as terse_encode keeps it).
 *   2. The N x N piece lengths are all-gathered (8 bytes each, framing),
 *      with a digest of each rank's codec spec and cut: ranks whose codecs
 *      differ are refused on every rank (TERSE_ERR_CORRUPT) before any
 *      piece moves, as is any length no piece of its segment can have.
 *   3. All-to-all: rank r sends its piece of segment s to rank s, and
 *      receives every rank's piece of segment r (pairwise: at step t it
 *      sends to r + t and receives from r - t).
 *   4. The owner decodes the N pieces of its segment in rank order into an
 *      fp32 sum, and re-encodes the sum with the same codec (with ef=1
 *      through a second residual it keeps for the segment: what the
 *      re-encode dropped is sent in later steps).
 *   5. The owners' messages are all-gathered (sizes first, then the ring),
 *      and every rank decodes every owner's message, scaled by alpha, into
 *      its segment of buf.
 *
 * Step 5 is the same arithmetic on the same bytes on every rank, so every
 * rank holds the same bits, reproducible run to run. Bytes per rank: the
 * N - 1 pieces it sends in step 3 and the N - 1 owner messages it
 * forwards in step 5, each about M / N for a message of M bytes, so about
 * 2 (N - 1) / N x M, against (N - 1) x M for the all-gather of whole
 * messages; decode work is O(n) per rank, against N x n.
 *
 * Error: the result is D(C(sum_r D(C(x_r)))): each rank's own codec error
 * (as on the gather path), then the re-encode's error on the sum -- for a
 * codec with relative error beta, at most beta ||sum|| on top
 * (docs/collectives.md states the bounds the tests check). */
#include <stdint.h>
#include <stdio.h>

#include "algos/coll/coll.h"
#include "common/error.h"
#include "compress/aggregate.h"

/* Pairs of requests in flight at once in the all-to-all. */
#define RS_WINDOW 16

static terse_status decode_error(terse_comm *c, terse_status s, const char *what, int from) {
    char why[400];
    snprintf(why, sizeof why, "%s", terse__comm_last_sentence());
    return TERSE_ERROR(s, "rank %d: decoding rank %d's %s: %s", c->rank, from, what, why);
}

/* 3. Every rank's piece of our segment into piece[q] (ours is own[r]). */
static terse_status all_to_all(terse_comm *c, uint8_t *own, uint8_t *piece, size_t slot,
                               const size_t *mine, const uint64_t *L, size_t row) {
    const int N = c->nranks, r = c->rank;
    terse__comm_next_phase(c);
    for (int t0 = 1; t0 < N; t0 += RS_WINDOW) {
        size_t nreq = 0;
        for (int t = t0; t < N && t < t0 + RS_WINDOW; t++) {
            int to = (r + t) % N, from = (r - t + N) % N;
            uint64_t tag = terse__comm_tag(c, (uint64_t)t);
            TERSE_CHECK(terse__comm_irecv(c, from, tag, piece + (size_t)from * slot,
                                          (size_t)L[(size_t)from * row + r], TERSE__BYTES_PAYLOAD,
                                          &c->reqs[nreq++]));
            TERSE_CHECK(terse__comm_isend(c, to, tag, own + (size_t)to * slot, mine[to],
                                          TERSE__BYTES_PAYLOAD, &c->reqs[nreq++]));
        }
        TERSE_CHECK(terse__comm_wait(c, c->reqs, nreq));
    }
    return TERSE_OK;
}

terse_status terse__allreduce_rs(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                 terse_op op) {
    (void)n; /* the codec is bound to n elements (terse_allreduce checked) */
    const int N = c->nranks, r = c->rank;
    const terse__segments *g = NULL;
    TERSE_CHECK(terse__codec_segments(codec, (uint32_t)N, (uint32_t)r, &g));
    if (!g)
        return TERSE_ERROR(TERSE_ERR_INTERNAL, "rank %d: codec '%s' has no segments", r,
                           terse_codec_spec(codec));
    const size_t slot = (g->max_bound + 63) & ~(size_t)63;
    const size_t seg = g->len[r];
    if (slot < g->max_bound || slot > (SIZE_MAX - seg * sizeof(float) - 64) / (3 * (size_t)N))
        return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: %d pieces of %zu bytes overflow", r, N,
                           g->max_bound);
    uint8_t *own = terse__comm_scratch(c, 0, 3 * (size_t)N * slot + seg * sizeof(float));
    const size_t row = (size_t)N + 1; /* N piece lengths and the codec digest */
    uint64_t *L = terse__comm_scratch(c, 1, ((size_t)N * row + row + (size_t)N) * sizeof(uint64_t));
    size_t *aux = terse__comm_scratch(c, 2, 3 * (size_t)N * sizeof(size_t));
    if (!own || !L || !aux) return TERSE_ERR_NOMEM;
    uint8_t *piece = own + (size_t)N * slot, *owner = piece + (size_t)N * slot;
    float *sum = (float *)(void *)(owner + (size_t)N * slot);
    uint64_t *mine64 = L + (size_t)N * row, *olen = mine64 + row;
    size_t *mine = aux, *off = aux + N, *len = aux + 2 * (size_t)N;

    /* 1. encode our pieces */
    uint64_t t0 = terse__now_ns();
    terse_status s = terse__codec_encode_segments(codec, buf, own, slot, mine);
    terse__comm_codec_time(c, t0);
    TERSE_CHECK(s);

    /* 2. everyone's piece lengths, L[q * row + s] = rank q's piece of s,
     * and codec digests, L[q * row + N] */
    for (int q = 0; q < N; q++) mine64[q] = mine[q];
    mine64[N] = terse__codec_cut_digest(codec);
    TERSE_CHECK(terse__allgather_fixed(c, mine64, row * sizeof(uint64_t), L));
    for (int q = 0; q < N; q++) {
        if (L[(size_t)q * row + N] != mine64[N])
            return TERSE_ERROR(TERSE_ERR_CORRUPT,
                               "rank %d: rank %d's codec or its cut into %d segments differs "
                               "from this rank's '%s' (do all ranks use the same spec and "
                               "shape?)",
                               r, q, N, terse_codec_spec(codec));
        for (int sg = 0; sg < N; sg++) {
            const uint64_t l = L[(size_t)q * row + sg];
            const size_t sb = terse_codec_bound(g->child[sg]);
            if (l < TERSE_WIRE_HEADER_SIZE || l > sb)
                return TERSE_ERROR(TERSE_ERR_CORRUPT,
                                   "rank %d: rank %d announces a %llu-byte piece of segment %d, "
                                   "but codec '%s' writes %u to %zu bytes there",
                                   r, q, (unsigned long long)l, sg, terse_codec_spec(codec),
                                   TERSE_WIRE_HEADER_SIZE, sb);
        }
    }

    /* 3. the pieces of our segment */
    TERSE_CHECK(all_to_all(c, own, piece, slot, mine, L, row));

    /* 4. decode and sum them in rank order, re-encode the sum */
    t0 = terse__now_ns();
    for (int q = 0; q < N; q++) {
        const uint8_t *p = q == r ? own + (size_t)r * slot : piece + (size_t)q * slot;
        s = terse__codec_decode_segment(codec, (uint32_t)r, p, (size_t)L[(size_t)q * row + r],
                                        sum, 1.0f, q > 0);
        if (s != TERSE_OK) {
            terse__comm_codec_time(c, t0);
            return decode_error(c, s, "piece of our segment", q);
        }
    }
    size_t olen_mine = 0;
    s = terse__codec_requantize(codec, sum, owner + (size_t)r * slot, slot, &olen_mine);
    terse__comm_codec_time(c, t0);
    TERSE_CHECK(s);
    TERSE_CHECK(terse__comm_poll_abort(c, "re-encoding a reduced segment"));

    /* 5. the owners' messages to everyone, then decode them all */
    TERSE_CHECK(terse__allgather_u64(c, olen_mine, olen));
    for (int b = 0; b < N; b++) {
        size_t bb = terse_codec_bound(g->child[b]);
        if (olen[b] < TERSE_WIRE_HEADER_SIZE || olen[b] > bb)
            return TERSE_ERROR(TERSE_ERR_CORRUPT,
                               "rank %d: rank %d announces a %llu-byte message for its segment, "
                               "but codec '%s' never exceeds %zu there",
                               r, b, (unsigned long long)olen[b], terse_codec_spec(codec), bb);
        off[b] = (size_t)b * slot;
        len[b] = (size_t)olen[b];
    }
    TERSE_CHECK(terse__allgatherv_ring(c, owner, off, len));
    const float alpha = op == TERSE_OP_AVG ? 1.0f / (float)N : 1.0f;
    t0 = terse__now_ns();
    for (int b = 0; b < N; b++) {
        s = terse__codec_decode_segment(codec, (uint32_t)b, owner + off[b], len[b],
                                        buf + g->off[b], alpha, 0);
        if (s != TERSE_OK) {
            terse__comm_codec_time(c, t0);
            return decode_error(c, s, "reduced segment", b);
        }
    }
    terse__codec_segments_done(codec);
    terse__comm_codec_time(c, t0);
    return TERSE_OK;
}
