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
 * randk's unbiased does the other way round.
 *
 * round=nearest rounds each element to its nearest level (floor(u + 1/2))
 * instead of stochastically: biased, and no draws, but error feedback
 * already carries the rounding error to the next step, where stochastic
 * rounding only adds noise (4 points of accuracy on a Fashion-MNIST MLP,
 * squant.h). So round defaults to nearest with ef=1 and to stochastic
 * without, like lsq; the message format is the same either way.
 *
 * norm=max scales each bucket by its largest magnitude instead of its L2
 * norm. Nearest rounding against the L2 norm sends nothing of a flat
 * bucket, ever: each element is norm/sqrt(bucket), L/sqrt(bucket) of a
 * level (0.31 at 4 bits, 512 elements), which rounds to 0 -- and error
 * feedback cannot help, since the residual stays flat and the ratio stays
 * the same (a constant gradient left the parameters at 0 while the
 * residual grew 1, 2, 3, ...). Against the largest magnitude the largest
 * element is always a whole level. So norm defaults to max with nearest
 * rounding and to l2 (QSGD's) with stochastic rounding, whose draws are
 * unbiased either way; the message format is the same (the scale field). */
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "compress/codec_internal.h"
#include "compress/spec.h"
#include "compress/squant.h"

static terse_status qsgd_create(terse_spec *spec, size_t rows, size_t cols, void **self,
                                char *canon, size_t canon_cap) {
    uint64_t bits, bucket, lsq;
    unsigned nearest;
    int ef = terse_spec_error_feedback(spec);
    TERSE_CHECK(terse_spec_get_u64(spec, "bits", 4, 2, 8, &bits));
    TERSE_CHECK(terse_spec_get_u64(spec, "bucket", 512, 8, (uint64_t)1 << 24, &bucket));
    TERSE_CHECK(terse_spec_get_u64(spec, "lsq", ef ? 1 : 0, 0, 1, &lsq));
    TERSE_CHECK(
        terse__spec_get_choice(spec, "round", ef ? 1 : 0, terse__squant_rounding, &nearest));
    static const char *const norms[] = {"l2", "max", NULL};
    unsigned norm;
    TERSE_CHECK(terse__spec_get_choice(spec, "norm", nearest ? 1 : 0, norms, &norm));
    terse__squant *q = malloc(sizeof *q);
    if (!q) return TERSE_ERROR(TERSE_ERR_NOMEM, "allocating codec 'qsgd'");
    terse__squant_init(q, "qsgd", rows * cols, (size_t)bucket, (unsigned)bits,
                       norm ? TERSE_SQUANT_ABSMAX : TERSE_SQUANT_NORM2, (int)lsq, (int)nearest);
    snprintf(canon, canon_cap, "bits=%u,bucket=%zu,lsq=%d,round=%s,norm=%s", q->bits, q->bucket,
             q->lsq, terse__squant_rounding[q->nearest], norms[norm]);
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

/* Cut at bucket boundaries (each bucket has its own scale). */
static size_t qsgd_segment_align(const void *self) { return ((const terse__squant *)self)->bucket; }

const terse_codec_ops terse__codec_qsgd = {
    .size = sizeof(terse_codec_ops),
    .id = TERSE_ID_QSGD,
    .name = "qsgd",
    .flags = TERSE_CODEC_RANDOMIZED | TERSE_CODEC_FIXED_SIZE,
    .create = qsgd_create,
    .destroy = qsgd_destroy,
    .bound = qsgd_bound,
    .bits_per_element = qsgd_bits,
    .encode = qsgd_encode,
    .decode = qsgd_decode,
    .segment_align = qsgd_segment_align,
};
