/* All-reduce for codecs that aggregate in rounds of dense sums (the
 * codec's rounds entries, terse_plugin.h): none (one round, its input
 * itself) and PowerSGD (sum P, a codec step, sum Q) among the built-ins.
 *
 * For each round the codec names a vector; it is summed over the ranks by
 * the dense all-reduce (recursive doubling or the ring: a fixed order, so
 * every rank holds the same bits), and the codec's next round reads the
 * sum. After the last round the codec writes alpha times the aggregate
 * into buf (alpha = 1, or 1/N for an average). The codec's own time counts
 * as codec seconds, the sums as network time. */
#include "algos/coll/coll.h"
#include "common/error.h"
#include "compress/aggregate.h"

terse_status terse__allreduce_rounds(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                     terse_op op) {
    (void)n; /* the codec is bound to n elements (terse_allreduce checked) */
    const uint32_t N = (uint32_t)c->nranks;
    const unsigned R = terse__codec_rounds(codec);
    for (unsigned r = 0; r < R; r++) {
        float *vec;
        size_t count;
        uint64_t t0 = terse__now_ns();
        terse_status s = terse__codec_round_vector(codec, N, r, buf, &vec, &count);
        terse__comm_codec_time(c, t0);
        TERSE_CHECK(s);
        TERSE_CHECK(terse__allreduce_dense(c, vec, count, 0));
    }
    uint64_t t0 = terse__now_ns();
    const float alpha = op == TERSE_OP_AVG ? 1.0f / (float)N : 1.0f;
    terse_status s = terse__codec_round_finish(codec, N, buf, alpha);
    terse__comm_codec_time(c, t0);
    return s;
}
