/* All-reduce for codecs whose messages cannot be added as they are (fp16,
 * bf16, int8, qsgd, terngrad, sign, topk, vq, plugins):
 *
 *   1. Every rank encodes its buffer with its own codec (its own error
 *      feedback and random stream) into its slot of a message array.
 *   2. Message sizes are all-gathered (8 bytes per rank, framing), then
 *      the messages themselves (variable size, ring all-gather).
 *   3. Every rank decodes all N messages in rank order into the buffer:
 *      message 0 overwrites, messages 1 .. N-1 accumulate, each scaled by
 *      alpha (1 for a sum, 1/N for an average).
 *
 * Step 3 is the same arithmetic on the same bytes on every rank, so the
 * results are bitwise identical everywhere and reproducible run to run.
 * Each rank receives N-1 compressed messages: cheaper than the dense ring
 * while the compression ratio beats N/2 (e.g. any codec here at N = 2..4
 * except fp16/bf16 beyond N = 4). */
#include <stdint.h>
#include <stdio.h>

#include "algos/coll/coll.h"
#include "common/error.h"
#include "compress/aggregate.h"

terse_status terse__allreduce_gather(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                     terse_op op) {
    (void)n; /* the codec is bound to n elements (terse_allreduce checked) */
    const size_t N = (size_t)c->nranks;
    const size_t bound = terse_codec_bound(codec);
    const size_t slot = (bound + 63) & ~(size_t)63;
    if (slot < bound || slot > SIZE_MAX / N)
        return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: %zu messages of %zu bytes overflow",
                           c->rank, N, bound);
    uint8_t *msgs = terse__comm_scratch(c, 0, N * slot);
    size_t *off = terse__comm_scratch(c, 1, 2 * N * sizeof(size_t));
    uint64_t *lens = terse__comm_scratch(c, 2, N * sizeof(uint64_t));
    if (!msgs || !off || !lens) return TERSE_ERR_NOMEM;
    size_t *len = off + N;

    /* 1. encode into our slot */
    uint64_t t0 = terse__now_ns();
    size_t mine = 0;
    TERSE_CHECK(terse_encode(codec, buf, msgs + (size_t)c->rank * slot, bound, &mine));
    terse__comm_codec_time(c, t0);
    TERSE_CHECK(terse__codec_check_fixed(codec, c->rank, mine, bound));

    /* 2. sizes, then messages */
    TERSE_CHECK(terse__allgather_u64(c, mine, lens));
    for (size_t r = 0; r < N; r++) {
        if (lens[r] > bound)
            return TERSE_ERROR(TERSE_ERR_CORRUPT,
                               "rank %d: rank %zu announces a %llu-byte message, but codec '%s' "
                               "never exceeds %zu (do all ranks use the same spec and shape?)",
                               c->rank, r, (unsigned long long)lens[r], terse_codec_spec(codec),
                               bound);
        off[r] = r * slot;
        len[r] = (size_t)lens[r];
    }
    TERSE_CHECK(terse__allgatherv_ring(c, msgs, off, len));

    /* 3. decode in rank order */
    const float alpha = op == TERSE_OP_AVG ? 1.0f / (float)N : 1.0f;
    t0 = terse__now_ns();
    for (size_t r = 0; r < N; r++) {
        TERSE_CHECK(terse__comm_poll_abort(c, "decoding the gathered messages"));
        terse_status s = terse_decode(codec, msgs + off[r], len[r], buf, alpha, r > 0);
        if (s != TERSE_OK) {
            char why[400];
            snprintf(why, sizeof why, "%s", terse__comm_last_sentence());
            return TERSE_ERROR(s, "rank %d: decoding rank %zu's message: %s", c->rank, r, why);
        }
    }
    terse__comm_codec_time(c, t0);
    return TERSE_OK;
}
