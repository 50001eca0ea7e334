/* terngrad: TernGrad (Wen et al., "TernGrad: Ternary Gradients to Reduce
 * Communication in Distributed Deep Learning", NeurIPS 2017): per bucket the
 * scale s = max|x| in fp32, and each element becomes s * sign(x) with
 * probability |x| / s, else 0. That is QSGD's rounding with one level
 * (L = 1) against the max norm instead of the L2 norm, so it runs on the
 * same engine (squant.h) at 2 bits: code 0 = -s, 1 = 0, 2 = +s, 3 invalid.
 *
 * lsq=1 sends, instead of max|x|, the least-squares scale of the drawn
 * signs: the mean |x| over the elements kept (squant.h). Biased, but a
 * contraction, which error feedback needs and TernGrad's unbiased
 * rounding is not (its variance sum |x|(s - |x|) exceeds ||x||^2 on
 * Gaussian buckets of the default 512). Default 1 with ef=1, else 0.
 *
 * round=nearest keeps an element (as s * sign(x)) when |x| >= s / 2 and
 * drops it otherwise, instead of drawing: biased and deterministic, which
 * suits error feedback, whose residual carries the rounding error anyway
 * (squant.h). Default nearest with ef=1, else stochastic; same format. */
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "compress/codec_internal.h"
#include "compress/spec.h"
#include "compress/squant.h"

static terse_status terngrad_create(terse_spec *spec, size_t rows, size_t cols, void **self,
                                    char *canon, size_t canon_cap) {
    uint64_t bucket, lsq;
    unsigned nearest;
    int ef = terse_spec_error_feedback(spec);
    TERSE_CHECK(terse_spec_get_u64(spec, "bucket", 512, 8, (uint64_t)1 << 24, &bucket));
    TERSE_CHECK(terse_spec_get_u64(spec, "lsq", ef ? 1 : 0, 0, 1, &lsq));
    TERSE_CHECK(
        terse__spec_get_choice(spec, "round", ef ? 1 : 0, terse__squant_rounding, &nearest));
    terse__squant *q = malloc(sizeof *q);
    if (!q) return TERSE_ERROR(TERSE_ERR_NOMEM, "allocating codec 'terngrad'");
    terse__squant_init(q, "terngrad", rows * cols, (size_t)bucket, 2, TERSE_SQUANT_ABSMAX,
                       (int)lsq, (int)nearest);
    snprintf(canon, canon_cap, "bucket=%zu,lsq=%d,round=%s", q->bucket, q->lsq,
             terse__squant_rounding[q->nearest]);
    *self = q;
    return TERSE_OK;
}

static void terngrad_destroy(void *self) { free(self); }

static size_t terngrad_bound(const void *self) { return ((const terse__squant *)self)->payload; }

static double terngrad_bits(const void *self) {
    const terse__squant *q = self;
    return 8.0 * (double)q->payload / (double)q->n;
}

static terse_status terngrad_encode(void *self, const terse_encode_ctx *ctx, const float *x,
                                    uint8_t *payload, size_t cap, size_t *len) {
    (void)cap; /* the core guarantees cap >= bound, which is exact */
    const terse__squant *q = self;
    terse__squant_encode(q, ctx, x, payload);
    *len = q->payload;
    return TERSE_OK;
}

static terse_status terngrad_decode(void *self, const uint8_t *payload, size_t len, float *dst,
                                    float alpha, int accumulate) {
    return terse__squant_decode(self, payload, len, dst, alpha, accumulate);
}

/* Cut at bucket boundaries (each bucket has its own scale). */
static size_t terngrad_segment_align(const void *self) { return ((const terse__squant *)self)->bucket; }

const terse_codec_ops terse__codec_terngrad = {
    .size = sizeof(terse_codec_ops),
    .id = TERSE_ID_TERNGRAD,
    .name = "terngrad",
    .flags = TERSE_CODEC_RANDOMIZED | TERSE_CODEC_FIXED_SIZE,
    .create = terngrad_create,
    .destroy = terngrad_destroy,
    .bound = terngrad_bound,
    .bits_per_element = terngrad_bits,
    .encode = terngrad_encode,
    .decode = terngrad_decode,
    .segment_align = terngrad_segment_align,
};
