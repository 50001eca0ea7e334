/* PowerSGD all-reduce: the two rounds of Vogels et al. (NeurIPS 2019,
 * Algorithm 1), as PyTorch's powerSGD_hook runs them.
 *
 * Every rank holds its gradient G (rows x cols) and the shared warm start
 * Q (cols x R): identical on all ranks, because it is either drawn from
 * the seed and tensor (never the rank) or the previous step's all-reduced
 * Q. Per step:
 *
 *   1. M = G + e with error feedback (e: this rank's residual), else G.
 *   2. P = M Q, then all-reduce P (sum): P = sum over ranks of M_i Q.
 *   3. Orthonormalise P (Householder QR) -- the same bits on every rank,
 *      since every rank holds the same summed P.
 *   4. Q_i = M^T P, this rank's share of the result, P Q_i^T.
 *   5. With error feedback, e = M - P Q_i^T: what this rank wanted to send
 *      minus what it contributed (the codec's own ef rule). Summed over
 *      ranks, the residuals are exactly sum M - result, as with PyTorch's
 *      hook, which stores M - P Q^T / N per rank instead.
 *   6. All-reduce Q (sum): Q = sum of Q_i = (sum M_i)^T P.
 *   7. Result = alpha P Q^T (alpha = 1, or 1/N for an average), identical
 *      on every rank; Q is kept as the next warm start.
 *
 * P and Q travel as dense fp32 through recursive doubling or the ring:
 * (rows + cols) R floats instead of rows x cols. Shapes where that is no
 * saving (vectors, small matrices, see compress/powersgd.c) travel dense,
 * with the residual folded in and cleared (e = M - M = 0). */
#include <string.h>

#include "algos/comm.h"
#include "common/error.h"
#include "compress/powersgd.h"

static terse_status dense_fallback(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                   const terse__powersgd_factors *f, terse_op op) {
    if (f->residual) {
        for (size_t i = 0; i < n; i++) buf[i] += f->residual[i];
        memset(f->residual, 0, n * sizeof(float));
    }
    terse__powersgd_end_step(codec);
    return terse__allreduce_dense(c, buf, n, op == TERSE_OP_AVG);
}

terse_status terse__allreduce_powersgd(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                       terse_op op) {
    terse__powersgd_factors f;
    TERSE_CHECK(terse__powersgd_factors_of(codec, &f));
    if (f.rank == 0) return dense_fallback(c, buf, n, codec, &f, op);

    /* 1, 2 */
    uint64_t t0 = terse__now_ns();
    const float *m = buf;
    if (f.residual) {
        for (size_t i = 0; i < n; i++) f.residual[i] += buf[i];
        m = f.residual;
    }
    terse__powersgd_project(codec, m);
    terse__comm_codec_time(c, t0);
    TERSE_CHECK(terse__allreduce_dense(c, f.p, f.rows * f.rank, 0));

    /* 3, 4, 5 */
    t0 = terse__now_ns();
    TERSE_CHECK(terse__powersgd_orthonormalise(codec));
    terse__powersgd_back_project(codec, m);
    if (f.residual) terse__powersgd_expand(codec, -1.0f, 1, f.residual);
    terse__comm_codec_time(c, t0);

    /* 6, 7 */
    TERSE_CHECK(terse__allreduce_dense(c, f.q, f.cols * f.rank, 0));
    t0 = terse__now_ns();
    const float alpha = op == TERSE_OP_AVG ? 1.0f / (float)c->nranks : 1.0f;
    terse__powersgd_expand(codec, alpha, 0, buf);
    terse__powersgd_end_step(codec);
    terse__comm_codec_time(c, t0);
    return TERSE_OK;
}
