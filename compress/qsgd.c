/* qsgd: QSGD (Alistarh et al., "QSGD: Communication-Efficient SGD via
 * Gradient Quantization and Encoding", NeurIPS 2017), without the Elias
 * coding: per bucket, the L2 norm in fp32 and each element stochastically
 * rounded to one of 2L+1 levels {-L..L}/L * norm, L = 2^(bits-1) - 1, in
 * `bits` bits. The payload layout, special buckets and validation are
 * squant.h's; the per-element kernels are squant_kernels.h's.
 *
 * lsq=1 replaces each norm by the least-squares scale of the drawn levels
 * (squant.h): biased, but a contraction, which error feedback needs;
 * unbiased QSGD at few levels is not one and its residual would grow
 * without bound. So lsq defaults to 1 with ef=1 and to 0 without, as
 * randk's unbiased does the other way round. */
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "compress/codec_internal.h"
#include "compress/squant.h"

static terse_status qsgd_create(terse_spec *spec, size_t rows, size_t cols, void **self,
                                char *canon, size_t canon_cap) {
    uint64_t bits, bucket, lsq;
    TERSE_CHECK(terse_spec_get_u64(spec, "bits", 4, 2, 8, &bits));
    TERSE_CHECK(terse_spec_get_u64(spec, "bucket", 512, 8, (uint64_t)1 << 24, &bucket));
    TERSE_CHECK(
        terse_spec_get_u64(spec, "lsq", terse_spec_error_feedback(spec) ? 1 : 0, 0, 1, &lsq));
    terse__squant *q = malloc(sizeof *q);
    if (!q) return TERSE_ERROR(TERSE_ERR_NOMEM, "allocating codec 'qsgd'");
    terse__squant_init(q, "qsgd", rows * cols, (size_t)bucket, (unsigned)bits, TERSE_SQUANT_NORM2,
                       (int)lsq);
    snprintf(canon, canon_cap, "bits=%u,bucket=%zu,lsq=%d", q->bits, q->bucket, q->lsq);
    *self = q;
    return TERSE_OK;
}

static void qsgd_destroy(void *self) { free(self); }

static size_t qsgd_bound(const void *self) { return ((const terse__squant *)self)->payload; }

static double qsgd_bits(const void *self) {
    const terse__squant *q = self;
    return 8.0 * (double)q->payload / (double)q->n;
}

static terse_status qsgd_encode(void *self, const terse_encode_ctx *ctx, const float *x,
                                uint8_t *payload, size_t cap, size_t *len) {
    (void)cap; /* the core guarantees cap >= bound, which is exact */
    const terse__squant *q = self;
    terse__squant_encode(q, ctx, x, payload);
    *len = q->payload;
    return TERSE_OK;
}

static terse_status qsgd_decode(void *self, const uint8_t *payload, size_t len, float *dst,
                                float alpha, int accumulate) {
    return terse__squant_decode(self, payload, len, dst, alpha, accumulate);
}

const terse_codec_ops terse__codec_qsgd = {
    .size = sizeof(terse_codec_ops),
    .id = TERSE_ID_QSGD,
    .name = "qsgd",
    .flags = TERSE_CODEC_RANDOMIZED,
    .create = qsgd_create,
    .destroy = qsgd_destroy,
    .bound = qsgd_bound,
    .bits_per_element = qsgd_bits,
    .encode = qsgd_encode,
    .decode = qsgd_decode,
};
