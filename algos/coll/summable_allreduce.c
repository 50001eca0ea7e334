/* All-reduce for codecs whose messages add linearly and say where their
 * values sit (TERSE_CODEC_SUMMABLE with a summable_view, terse_plugin.h):
 * randk among the built-ins, and any plugin that gives the view.
 *
 *   1. Every rank encodes its buffer (its own error feedback).
 *   2. The ranks all-gather a 64-bit digest of their message's bytes
 *      outside the values, and its length (8 bytes each, framing). They
 *      must all be equal: randk's shared index key sits there, so ranks
 *      whose codecs drew other indices (seed, tensor id or step differ)
 *      are refused, all of them alike, with TERSE_ERR_CORRUPT, instead of
 *      adding values of unrelated coordinates -- a silently wrong sum.
 *   3. The values go through the dense all-reduce inside the message
 *      (recursive doubling or the ring: fixed order, identical bits).
 *   4. The message is resealed (its checksum covers the values) and
 *      decoded once, scaled by alpha (1, or 1/N for an average).
 *
 * For randk, k floats travel instead of n. */
#include <stdio.h>

#include "algos/coll/coll.h"
#include "common/error.h"
#include "compress/aggregate.h"

static terse_status check_frames(terse_comm *c, const terse_codec *codec, uint64_t mine) {
    uint64_t *all = terse__comm_scratch(c, 2, (size_t)c->nranks * sizeof(uint64_t));
    if (!all) return TERSE_ERR_NOMEM;
    TERSE_CHECK(terse__allgather_u64(c, mine, all));
    for (int r = 1; r < c->nranks; r++)
        if (all[r] != all[0])
            return TERSE_ERROR(TERSE_ERR_CORRUPT,
                               "summable allreduce on rank %d: rank %d's message differs from "
                               "rank 0's outside its values (digest %#llx, rank 0's %#llx): the "
                               "ranks' codecs '%s' disagree on seed, tensor id, step or shape, "
                               "and summing their values would add unrelated coordinates",
                               c->rank, r, (unsigned long long)all[r],
                               (unsigned long long)all[0], terse_codec_spec(codec));
    return TERSE_OK;
}

terse_status terse__allreduce_summable(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                       terse_op op) {
    (void)n;
    const size_t bound = terse_codec_bound(codec);
    uint8_t *msg = terse__comm_scratch(c, 0, bound);
    if (!msg) return TERSE_ERR_NOMEM;
    uint64_t t0 = terse__now_ns();
    size_t len = 0, voff = 0, count = 0;
    terse_status s = terse_encode(codec, buf, msg, bound, &len);
    if (s == TERSE_OK) s = terse__codec_summable_view(codec, msg, len, &voff, &count);
    terse__comm_codec_time(c, t0);
    TERSE_CHECK(s);
    TERSE_CHECK(check_frames(c, codec, terse__message_frame_digest(msg, len, voff, count)));
    /* The scratch is 64-byte aligned and voff a multiple of 4. */
    float *values = (float *)(void *)(msg + voff);
    TERSE_CHECK(terse__allreduce_dense(c, values, count, 0));
    t0 = terse__now_ns();
    terse__codec_reseal(codec, msg, len);
    const float alpha = op == TERSE_OP_AVG ? 1.0f / (float)c->nranks : 1.0f;
    s = terse_decode(codec, msg, len, buf, alpha, 0);
    terse__comm_codec_time(c, t0);
    return s;
}
