/* All-reduce for the built-in codecs whose payloads add linearly:
 *
 *   none   The message is the buffer itself, so the buffer goes through the
 *          dense all-reduce untouched, with no copy. Its error feedback is
 *          trivially exact: e = (g + e) - D(C(g + e)) = 0, so the residual
 *          (if any) is added in and cleared, as encode would do.
 *   randk  Every rank draws the same k indices (the key leaves the rank
 *          out, compress/randk.c), so the payload after its 8-byte key is k
 *          fp32 values that add element-wise. Each rank encodes (its own
 *          error feedback), the k values go through the dense all-reduce
 *          (recursive doubling or ring: fixed order, identical bits), the
 *          message is resealed (its checksum covers the values) and decoded
 *          once, scaled by alpha (1, or 1/N for an average). k floats
 *          travel instead of n.
 *
 * Ranks must agree on the randk stream (seed, tensor and step); a rank
 * whose codec drew other indices would add values of other coordinates, a
 * silently wrong sum. So before the values travel, the ranks exchange the
 * 8-byte key each message carries (one small all-gather, counted as
 * framing) and refuse, all of them alike, with TERSE_ERR_CORRUPT when any
 * two differ. */
#include <string.h>

#include "algos/comm.h"
#include "common/error.h"
#include "compress/codec_internal.h"
#include "compress/wire.h"

#define RANDK_KEY_BYTES 8u

int terse__summable_supported(const terse_codec *codec) {
    return codec->ops.id == TERSE_ID_NONE || codec->ops.id == TERSE_ID_RANDK;
}

static terse_status none_allreduce(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                   terse_op op) {
    if (codec->residual) {
        uint64_t t0 = terse__now_ns();
        for (size_t i = 0; i < n; i++) buf[i] += codec->residual[i];
        memset(codec->residual, 0, n * sizeof(float));
        terse__comm_codec_time(c, t0);
    }
    codec->step++;
    return terse__allreduce_dense(c, buf, n, op == TERSE_OP_AVG);
}

/* Every rank's randk key must be ours (see the top of the file). */
static terse_status check_keys(terse_comm *c, const terse_codec *codec, const uint8_t *key) {
    uint64_t mine;
    memcpy(&mine, key, sizeof mine);
    uint64_t *all = terse__comm_scratch(c, 2, (size_t)c->nranks * sizeof(uint64_t));
    if (!all) return TERSE_ERR_NOMEM;
    TERSE_CHECK(terse__allgather_u64(c, mine, all));
    for (int r = 0; r < c->nranks; r++)
        if (all[r] != all[0])
            return TERSE_ERROR(TERSE_ERR_CORRUPT,
                               "randk allreduce on rank %d: rank %d's random-index stream "
                               "(key %#llx) differs from rank 0's (%#llx): the ranks' codecs "
                               "'%s' disagree on seed, tensor id or step, and summing their "
                               "values would add unrelated coordinates",
                               c->rank, r, (unsigned long long)all[r],
                               (unsigned long long)all[0], terse_codec_spec(codec));
    return TERSE_OK;
}

static terse_status randk_allreduce(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                    terse_op op) {
    const size_t bound = terse_codec_bound(codec);
    uint8_t *msg = terse__comm_scratch(c, 0, bound);
    if (!msg) return TERSE_ERR_NOMEM;
    uint64_t t0 = terse__now_ns();
    size_t len = 0;
    TERSE_CHECK(terse_encode(codec, buf, msg, bound, &len));
    terse__comm_codec_time(c, t0);
    const size_t head = TERSE_WIRE_HEADER_SIZE + RANDK_KEY_BYTES;
    if (len < head || (len - head) % sizeof(float) != 0)
        return TERSE_ERROR(TERSE_ERR_INTERNAL, "rank %d: randk message of %zu bytes", c->rank,
                           len);
    TERSE_CHECK(check_keys(c, codec, msg + TERSE_WIRE_HEADER_SIZE));
    /* The scratch is 64-byte aligned and head is 40: the values are
     * 8-byte aligned floats. */
    float *values = (float *)(void *)(msg + head);
    TERSE_CHECK(terse__allreduce_dense(c, values, (len - head) / sizeof(float), 0));
    t0 = terse__now_ns();
    terse__wire_seal(msg, codec->ops.id, n, len - TERSE_WIRE_HEADER_SIZE);
    const float alpha = op == TERSE_OP_AVG ? 1.0f / (float)c->nranks : 1.0f;
    TERSE_CHECK(terse_decode(codec, msg, len, buf, alpha, 0));
    terse__comm_codec_time(c, t0);
    return TERSE_OK;
}

terse_status terse__allreduce_summable(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                       terse_op op) {
    if (codec->ops.id == TERSE_ID_NONE) return none_allreduce(c, buf, n, codec, op);
    return randk_allreduce(c, buf, n, codec, op);
}
