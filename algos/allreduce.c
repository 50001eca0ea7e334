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
#include "algos/comm.h"
#include "common/error.h"
#include "compress/codec_internal.h"

terse_status terse__allreduce_dense(terse_comm *c, float *buf, size_t n, int divide) {
    if (n <= terse__rd_max_bytes() / sizeof(float)) return terse__allreduce_rd(c, buf, n, divide);
    return terse__allreduce_ring(c, buf, n, divide);
}

static terse_status allreduce(terse_comm *c, float *buf, size_t n, terse_codec *codec,
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
    if (!codec) return terse__allreduce_dense(c, buf, n, op == TERSE_OP_AVG);
    if (terse_codec_elements(codec) != n)
        return TERSE_ERROR(TERSE_ERR_SHAPE,
                           "terse_allreduce on rank %d: codec '%s' is bound to %zu elements, "
                           "n = %zu",
                           c->rank, terse_codec_spec(codec), terse_codec_elements(codec), n);
    if (codec->ops.id == TERSE_ID_POWERSGD)
        return terse__allreduce_powersgd(c, buf, n, codec, op);
    if (terse__summable_supported(codec)) return terse__allreduce_summable(c, buf, n, codec, op);
    return terse__allreduce_gather(c, buf, n, codec, op);
}

terse_status terse_allreduce(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                             terse_op op) {
    TERSE_CHECK(terse__comm_begin(c, "terse_allreduce"));
    return terse__comm_end(c, allreduce(c, buf, n, codec, op), 0);
}
