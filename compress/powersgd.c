/* powersgd: a rank-R approximation of the gradient matrix by one power
 * iteration with a warm start (Vogels, Karimireddy and Jaggi, "PowerSGD:
 * Practical Low-Rank Gradient Compression for Distributed Optimization",
 * NeurIPS 2019, Algorithm 1 with one iteration per step).
 *
 * The tensor M is rows x cols, row major. Row-major M is the column-major
 * matrix M^T with leading dimension cols, so every product below is one
 * column-major cblas_sgemm on the caller's buffer, with no transposed copy:
 *
 *   1. Q (cols x R) is the warm start: the Q this codec produced on its
 *      previous encode. On the first encode it is drawn from the seed, keyed
 *      by terse__rng_key(seed, 0, tensor, 0) -- neither step nor rank -- so
 *      that every rank starts from the same Q.
 *   2. P = M Q (rows x R).
 *   3. Orthonormalise the columns of P by Householder QR (sgeqrf, then
 *      sorgqr to form the explicit Q factor in place). Householder QR yields
 *      orthonormal columns even when P is rank deficient: a zero column gets
 *      tau = 0 (an identity reflector) and sorgqr fills it with a unit vector
 *      orthogonal to the others. So a zero gradient gives a valid basis, not
 *      the NaN a Gram-Schmidt division by a zero norm would give.
 *   4. Q = M^T P (cols x R). It is kept as the next warm start and sent.
 *   5. The receiver computes P Q^T = P P^T M: M projected onto span(P).
 *      Repeated on the same M this is subspace iteration on M M^T, which
 *      converges to the best rank-R approximation when sigma_R > sigma_R+1.
 *
 * If the new Q is all zeros (a zero gradient) or not finite (a NaN or Inf in
 * the gradient), it is useless as a warm start -- P = M Q would stay zero or
 * NaN forever -- so the codec forgets it and redraws the initial Q from the
 * seed on the next encode. That message itself is still sent faithfully.
 *
 * Dense fallback: vectors (rows == 1 or cols == 1), matrices where the
 * factors are not smaller -- (rows + cols) * R * 2 >= rows * cols, PyTorch's
 * PowerSGD hook rule -- and shapes with a side above INT_MAX (the BLAS and
 * LAPACK index type) send M as dense fp32. R is first clamped to
 * min(rows, cols).
 *
 * Payload (little endian):
 *   offset  size
 *        0     1  mode: 0 = dense, 1 = low rank (fixed by the shape and R)
 *        1     1  reserved, 0
 *        2     2  effective rank R (0 in dense mode)
 *        4        dense:    rows * cols fp32, M row major
 *                 low rank: P, rows x R fp32, column major (column j of P
 *                           at offset 4 + 4 * rows * j); then Q, cols x R
 *                           fp32, column major
 * Decode checks mode, reserved byte, rank and the exact length.
 *
 * Not summable: the sum of P Q^T over ranks is not (sum P)(sum Q)^T. The
 * collectives run PowerSGD's two rounds (sum P, orthonormalise, recompute
 * Q, sum Q) through the rounds entries at the end of this file.
 *
 * Determinism: encode and decode are deterministic on one machine for a
 * given OpenBLAS build and thread count, but OpenBLAS picks its sgemm kernel
 * by CPU (AVX2 vs AVX-512 sum in different orders, with FMA or not), so
 * messages can differ in the last bits between machines of different CPU
 * types. TERSE_SIMD does not govern OpenBLAS (OPENBLAS_CORETYPE does).
 *
 * Codec state (checkpoints), low-rank mode only (dense mode has none):
 *   0 u32 initialised (0 or 1)   4 u32 R   8 Q, cols x R fp32 column major
 */
#include <cblas.h>
#include <lapacke.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/error.h"
#include "common/rng.h"
#include "compress/codec_internal.h"
#include "compress/kernels.h"

#define PSGD_HEAD 4u
#define PSGD_MODE_DENSE 0u
#define PSGD_MODE_LOWRANK 1u
#define PSGD_STATE_HEAD 8u

typedef struct {
    size_t rows, cols, n;
    size_t rank; /* effective rank; 0 in dense mode */
    int initialised;
    float *q;     /* the warm start (state): cols x rank, column major */
    float *p;     /* encode/decode scratch: rows x rank, column major */
    float *pt;    /* encode scratch: P transposed (rank x rows, column major) */
    float *qd;    /* decode scratch: cols x rank (decode must not touch q) */
    float *tau;   /* Householder scalars, rank */
    float *work;  /* LAPACK workspace, lwork floats */
    lapack_int lwork;
} psgd_codec;

static void psgd_destroy(void *self) {
    psgd_codec *c = self;
    if (!c) return;
    free(c->q);
    free(c->p);
    free(c->pt);
    free(c->qd);
    free(c->tau);
    free(c->work);
    free(c);
}

/* Ask LAPACK how much workspace sgeqrf and sorgqr want for this shape. */
static terse_status query_lwork(psgd_codec *c) {
    lapack_int m = (lapack_int)c->rows, r = (lapack_int)c->rank;
    float w1 = 0, w2 = 0;
    lapack_int i1 = LAPACKE_sgeqrf_work(LAPACK_COL_MAJOR, m, r, c->p, m, c->tau, &w1, -1);
    lapack_int i2 = LAPACKE_sorgqr_work(LAPACK_COL_MAJOR, m, r, r, c->p, m, c->tau, &w2, -1);
    if (i1 != 0 || i2 != 0)
        return TERSE_ERROR(TERSE_ERR_INTERNAL, "powersgd: LAPACK workspace query failed (%d, %d)",
                           (int)i1, (int)i2);
    float w = w1 > w2 ? w1 : w2;
    /* The optimum is rank * block size; anything up to 2^24 is exact. */
    if (!(w >= 1.0f) || w > 16777216.0f) w = (float)(c->rank * 64);
    c->lwork = (lapack_int)w;
    if ((size_t)c->lwork < c->rank) c->lwork = (lapack_int)c->rank;
    return TERSE_OK;
}

static terse_status psgd_create(terse_spec *spec, size_t rows, size_t cols, void **self,
                                char *canon, size_t canon_cap) {
    uint64_t r = 0;
    TERSE_CHECK(terse_spec_get_u64(spec, "rank", 4, 1, 1024, &r));
    terse_status s = TERSE_OK;
    psgd_codec *c = calloc(1, sizeof *c);
    if (!c) return TERSE_ERROR(TERSE_ERR_NOMEM, "allocating codec 'powersgd'");
    c->rows = rows;
    c->cols = cols;
    c->n = rows * cols;
    uint64_t side = rows < cols ? rows : cols;
    uint64_t R = r < side ? r : side;
    /* rows, cols <= 2^36 and R <= 1024, so this cannot overflow 64 bits. */
    int lowrank = rows > 1 && cols > 1 && rows <= INT_MAX && cols <= INT_MAX &&
                  ((uint64_t)rows + cols) * R * 2 < (uint64_t)rows * cols;
    if (lowrank) {
        c->rank = (size_t)R;
        c->q = malloc(cols * c->rank * sizeof(float));
        c->qd = malloc(cols * c->rank * sizeof(float));
        c->p = malloc(rows * c->rank * sizeof(float));
        c->pt = malloc(rows * c->rank * sizeof(float));
        c->tau = malloc(c->rank * sizeof(float));
        if (!c->q || !c->qd || !c->p || !c->pt || !c->tau)
            TERSE_FAIL_GOTO(s, fail, TERSE_ERR_NOMEM,
                            "powersgd: allocating rank-%zu factors for %zu x %zu", c->rank, rows,
                            cols);
        TERSE_CHECK_GOTO(query_lwork(c), s, fail);
        c->work = malloc((size_t)c->lwork * sizeof(float));
        if (!c->work)
            TERSE_FAIL_GOTO(s, fail, TERSE_ERR_NOMEM, "powersgd: allocating LAPACK workspace");
    }
    snprintf(canon, canon_cap, "rank=%llu", (unsigned long long)r);
    *self = c;
    return TERSE_OK;
fail:
    psgd_destroy(c);
    return s;
}

static size_t psgd_bound(const void *self) {
    const psgd_codec *c = self;
    if (!c->rank) return PSGD_HEAD + 4 * c->n;
    return PSGD_HEAD + 4 * (c->rows + c->cols) * c->rank;
}

static double psgd_bits(const void *self) {
    const psgd_codec *c = self;
    if (!c->rank) return 32.0;
    return 32.0 * (double)((c->rows + c->cols) * c->rank) / (double)c->n;
}

/* The initial Q: roughly Gaussian entries (a sum of four 16-bit uniforms,
 * integer arithmetic and one exact scaling by 2^-15), deterministic on every
 * machine. The scale does not matter: P is orthonormalised. */
static void psgd_init_q(psgd_codec *c, uint64_t seed, uint64_t tensor) {
    uint64_t key = terse__rng_key(seed, 0, tensor, 0);
    size_t m = c->cols * c->rank;
    for (size_t i = 0; i < m; i++) {
        uint64_t u = terse__rng_u64(key, i);
        int32_t sum = (int32_t)(u & 0xffff) + (int32_t)((u >> 16) & 0xffff) +
                      (int32_t)((u >> 32) & 0xffff) + (int32_t)(u >> 48) - 131070;
        c->q[i] = (float)sum * 0x1p-15f;
    }
    c->initialised = 1;
}

/* A warm start is worth keeping only if it is finite and not all zero. */
static int q_usable(const float *q, size_t m) {
    int nonzero = 0;
    for (size_t i = 0; i < m; i++) {
        if (!isfinite(q[i])) return 0;
        nonzero |= q[i] != 0.0f;
    }
    return nonzero;
}

/* 2. P = M Q: M is the column-major cols x rows matrix x, transposed. */
static void project(psgd_codec *c, const float *x) {
    const int m = (int)c->rows, k = (int)c->cols, r = (int)c->rank;
    cblas_sgemm(CblasColMajor, CblasTrans, CblasNoTrans, m, r, k, 1.0f, x, k, c->q, k, 0.0f,
                c->p, m);
}

/* 3. Orthonormalise the columns of P in place (Householder QR). */
static terse_status orthonormalise(psgd_codec *c) {
    const int m = (int)c->rows, r = (int)c->rank;
    lapack_int info = LAPACKE_sgeqrf_work(LAPACK_COL_MAJOR, m, r, c->p, m, c->tau, c->work,
                                          c->lwork);
    if (info == 0)
        info = LAPACKE_sorgqr_work(LAPACK_COL_MAJOR, m, r, r, c->p, m, c->tau, c->work,
                                   c->lwork);
    if (info != 0)
        return TERSE_ERROR(TERSE_ERR_INTERNAL, "powersgd: LAPACK QR of %d x %d failed (info %d)",
                           m, r, (int)info);
    return TERSE_OK;
}

/* 4. Q = M^T P, overwriting the warm start it came from. It is computed
 * from P^T, transposed here in O(rows R), because OpenBLAS 0.3.21's
 * small-matrix sgemm kernel for NoTrans x NoTrans (AVX-512) calls malloc
 * on every call, and encode must not allocate. */
static void back_project(psgd_codec *c, const float *x) {
    const int m = (int)c->rows, k = (int)c->cols, r = (int)c->rank;
    for (size_t j = 0; j < c->rank; j++)
        for (size_t i = 0; i < c->rows; i++) c->pt[i * c->rank + j] = c->p[j * c->rows + i];
    cblas_sgemm(CblasColMajor, CblasNoTrans, CblasTrans, k, r, m, 1.0f, x, k, c->pt, r, 0.0f,
                c->q, k);
}

static terse_status psgd_encode(void *self, const terse_encode_ctx *ctx, const float *x,
                                uint8_t *payload, size_t cap, size_t *len) {
    (void)cap;
    psgd_codec *c = self;
    if (!c->rank) {
        payload[0] = PSGD_MODE_DENSE;
        payload[1] = 0;
        terse__put_u16(payload + 2, 0);
        memcpy(payload + PSGD_HEAD, x, c->n * 4);
        *len = PSGD_HEAD + 4 * c->n;
        return TERSE_OK;
    }
    if (!c->initialised) psgd_init_q(c, ctx->seed, ctx->tensor);
    project(c, x);
    TERSE_CHECK(orthonormalise(c));
    back_project(c, x);

    size_t pbytes = 4 * c->rows * c->rank, qbytes = 4 * c->cols * c->rank;
    payload[0] = PSGD_MODE_LOWRANK;
    payload[1] = 0;
    terse__put_u16(payload + 2, (uint16_t)c->rank);
    memcpy(payload + PSGD_HEAD, c->p, pbytes);
    memcpy(payload + PSGD_HEAD + pbytes, c->q, qbytes);
    *len = PSGD_HEAD + pbytes + qbytes;
    if (!q_usable(c->q, c->cols * c->rank)) c->initialised = 0;
    return TERSE_OK;
}

static terse_status psgd_decode(void *self, const uint8_t *payload, size_t len, float *dst,
                                float alpha, int accumulate) {
    psgd_codec *c = self;
    if (len < PSGD_HEAD)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "powersgd: payload is %zu bytes, shorter than its %u-byte header", len,
                           PSGD_HEAD);
    unsigned want_mode = c->rank ? PSGD_MODE_LOWRANK : PSGD_MODE_DENSE;
    if (payload[0] != want_mode)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "powersgd: mode byte %u at payload offset 0; a %zu x %zu tensor at "
                           "this rank is sent as mode %u (%s)",
                           payload[0], c->rows, c->cols, want_mode,
                           c->rank ? "low rank" : "dense");
    if (payload[1] != 0)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "powersgd: reserved byte at payload offset 1 is %u, not 0", payload[1]);
    unsigned r = terse__get_u16(payload + 2);
    if (r != c->rank)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "powersgd: rank %u at payload offset 2, this codec sends rank %zu", r,
                           c->rank);
    size_t want = psgd_bound(c);
    if (len != want)
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "powersgd: payload is %zu bytes, expected %zu", len,
                           want);
    if (!c->rank) {
        terse__kernel_axpy_f32(dst, payload + PSGD_HEAD, c->n, alpha, accumulate);
        return TERSE_OK;
    }
    /* The factors sit at any alignment in the message; BLAS wants floats.
     * Copying them is O((rows + cols) R), against O(rows cols R) for the
     * product. */
    size_t pbytes = 4 * c->rows * c->rank, qbytes = 4 * c->cols * c->rank;
    memcpy(c->p, payload + PSGD_HEAD, pbytes);
    memcpy(c->qd, payload + PSGD_HEAD + pbytes, qbytes);
    const int m = (int)c->rows, k = (int)c->cols, rr = (int)c->rank;
    /* Row-major dst = P Q^T is column-major dst^T = Q P^T. With beta = 1
     * sgemm adds alpha * (P Q^T) into dst in the same pass. */
    cblas_sgemm(CblasColMajor, CblasNoTrans, CblasTrans, k, m, rr, alpha, c->qd, k, c->p, m,
                accumulate ? 1.0f : 0.0f, dst, k);
    return TERSE_OK;
}

static size_t psgd_state_size(const void *self) {
    const psgd_codec *c = self;
    return c->rank ? PSGD_STATE_HEAD + 4 * c->cols * c->rank : 0;
}

static terse_status psgd_state_save(const void *self, uint8_t *dst) {
    const psgd_codec *c = self;
    if (!c->rank) return TERSE_OK;
    terse__put_u32(dst, c->initialised ? 1u : 0u);
    terse__put_u32(dst + 4, (uint32_t)c->rank);
    size_t qbytes = 4 * c->cols * c->rank;
    /* An uninitialised Q is garbage that will be redrawn: save zeros. */
    if (c->initialised)
        memcpy(dst + PSGD_STATE_HEAD, c->q, qbytes);
    else
        memset(dst + PSGD_STATE_HEAD, 0, qbytes);
    return TERSE_OK;
}

static terse_status psgd_state_load(void *self, const uint8_t *src, size_t len) {
    psgd_codec *c = self;
    if (len != psgd_state_size(c))
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "powersgd: state is %zu bytes, expected %zu", len,
                           psgd_state_size(c));
    if (!c->rank) return TERSE_OK;
    uint32_t init = terse__get_u32(src), r = terse__get_u32(src + 4);
    if (init > 1)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "powersgd: state flag 'initialised' at byte 0 is %u, not 0 or 1", init);
    if (r != c->rank)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "powersgd: state has rank %u at byte 4, this codec has rank %zu", r,
                           c->rank);
    memcpy(c->q, src + PSGD_STATE_HEAD, 4 * c->cols * c->rank);
    c->initialised = (int)init;
    return TERSE_OK;
}

/* ---- aggregation: PowerSGD's two rounds (Vogels et al., Algorithm 1, as
 * PyTorch's powerSGD_hook runs them) ----
 *
 * The sum of P Q^T over ranks is not (sum P)(sum Q)^T, so an all-reduce
 * sums P between the two halves of an encode. Every rank holds its
 * gradient G and the same warm start Q (drawn from seed and tensor, never
 * the rank, or the previous step's summed Q). Per step:
 *
 *   round 0: M = G + e with error feedback (e: this rank's residual), else
 *            G; P = M Q; the collective sums P over the ranks.
 *   round 1: orthonormalise P (the same bits on every rank, since every
 *            rank holds the same sum); Q_i = M^T P, this rank's share of
 *            the result P Q_i^T; with error feedback e = M - P Q_i^T, what
 *            this rank wanted to send minus what it contributed (summed
 *            over ranks, exactly sum M - result, as with PyTorch's hook,
 *            which keeps M - P Q^T / N per rank instead); the collective
 *            sums Q.
 *   finish:  result = alpha P Q^T, identical on every rank; the summed Q is
 *            the next warm start (or redrawn if it is zero or not finite).
 *
 * P and Q travel as dense fp32: (rows + cols) R floats instead of rows x
 * cols. Shapes that travel dense (rank 0 here) take one round whose
 * vector is M itself, the residual folded in and cleared (e = M - M). */
static unsigned psgd_rounds(const void *self) {
    const psgd_codec *c = self;
    return c->rank ? 2 : 1;
}

static terse_status psgd_round_vector(void *self, const terse_round_ctx *ctx, unsigned round,
                                      float *x, float **vec, size_t *count) {
    psgd_codec *c = self;
    float *e = ctx->residual;
    if (!c->rank) {
        if (e) {
            for (size_t i = 0; i < c->n; i++) x[i] += e[i];
            memset(e, 0, c->n * sizeof(float));
        }
        *vec = x;
        *count = c->n;
        return TERSE_OK;
    }
    const float *m = e ? e : x;
    if (round == 0) {
        if (e)
            for (size_t i = 0; i < c->n; i++) e[i] += x[i];
        if (!c->initialised) psgd_init_q(c, ctx->seed, ctx->tensor);
        project(c, m);
        *vec = c->p;
        *count = c->rows * c->rank;
        return TERSE_OK;
    }
    TERSE_CHECK(orthonormalise(c));
    back_project(c, m);
    if (e) /* e = M - P Q_i^T: row-major e^T += -Q P^T, as in decode */
        cblas_sgemm(CblasColMajor, CblasNoTrans, CblasTrans, (int)c->cols, (int)c->rows,
                    (int)c->rank, -1.0f, c->q, (int)c->cols, c->p, (int)c->rows, 1.0f, e,
                    (int)c->cols);
    *vec = c->q;
    *count = c->cols * c->rank;
    return TERSE_OK;
}

static terse_status psgd_round_finish(void *self, const terse_round_ctx *ctx, float *x,
                                      float alpha) {
    psgd_codec *c = self;
    if (!c->rank) { /* an average divides by N, as the dense path does */
        if (alpha != 1.0f)
            for (size_t i = 0; i < c->n; i++) x[i] /= (float)ctx->nranks;
        return TERSE_OK;
    }
    cblas_sgemm(CblasColMajor, CblasNoTrans, CblasTrans, (int)c->cols, (int)c->rows,
                (int)c->rank, alpha, c->q, (int)c->cols, c->p, (int)c->rows, 0.0f, x,
                (int)c->cols);
    if (!q_usable(c->q, c->cols * c->rank)) c->initialised = 0;
    return TERSE_OK;
}

const terse_codec_ops terse__codec_powersgd = {
    .size = sizeof(terse_codec_ops),
    .id = TERSE_ID_POWERSGD,
    .name = "powersgd",
    .flags = TERSE_CODEC_RANDOMIZED,
    .create = psgd_create,
    .destroy = psgd_destroy,
    .bound = psgd_bound,
    .bits_per_element = psgd_bits,
    .encode = psgd_encode,
    .decode = psgd_decode,
    .state_size = psgd_state_size,
    .state_save = psgd_state_save,
    .state_load = psgd_state_load,
    .rounds = psgd_rounds,
    .round_vector = psgd_round_vector,
    .round_finish = psgd_round_finish,
};
