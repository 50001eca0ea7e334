/* terse_allreduce: checks its arguments and picks the algorithm.
 *
 *   no codec            dense fp32: recursive doubling up to
 *                       TERSE_RD_MAX_BYTES (64 KiB), else the pipelined ring
 *   powersgd            its two rounds, P then Q (powersgd_allreduce.c)
 *   none, randk         summable: the ring over their fp32 values
 *                       (summable_allreduce.c)
 *   everything else     all-gather of messages, decoded in rank order
 *                       (gather_allreduce.c). This includes fp16 and bf16,
 *                       whose payloads cannot be added without decoding,
 *                       and plugins, even summable ones: terse cannot know
 *                       where a plugin's values sit in its payload.
 *
 * Every choice depends only on arguments that all ranks share (n, the
 * codec's spec, the rank count), so all ranks run the same algorithm. */
#include <stdio.h>

#include "algos/comm.h"
#include "common/error.h"
#include "compress/codec_internal.h"

terse_status terse__allreduce_dense(terse_comm *c, float *buf, size_t n, int divide) {
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

/* The codec's state before the call, so that a failed collective can put
 * it back (transactional state: residual, step, stream, PowerSGD's Q). */
static terse_status snapshot(terse_comm *c, terse_codec *codec) {
    void *p = terse__comm_scratch(c, TERSE__SCRATCH_STATE, terse__codec_snapshot_size(codec));
    if (!p) return TERSE_ERR_NOMEM;
    uint64_t t0 = terse__now_ns();
    terse_status s = terse__codec_snapshot(codec, p);
    terse__comm_codec_time(c, t0);
    return s;
}

static terse_status run_codec(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                              terse_op op) {
    if (codec->ops.id == TERSE_ID_POWERSGD)
        return terse__allreduce_powersgd(c, buf, n, codec, op);
    if (terse__summable_supported(codec)) return terse__allreduce_summable(c, buf, n, codec, op);
    return terse__allreduce_gather(c, buf, n, codec, op);
}

terse_status terse__allreduce_run(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                  terse_op op) {
    if (!codec) return terse__allreduce_dense(c, buf, n, op == TERSE_OP_AVG);
    TERSE_CHECK(snapshot(c, codec));
    terse_status s = run_codec(c, buf, n, codec, op);
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
