/* int8: per-bucket absmax quantization to 8-bit integers.
 *
 * Each bucket of B elements (the last may be short) sends one fp32 scale
 * s = max|x| / 127 and one int8 code per element, q = round_even(x / s),
 * which lies in [-127, 127] (-128 is never produced), and decodes to s * q.
 *
 * Payload (little endian), exactly 4 * nb + n bytes, nb = ceil(n / B):
 *     offset 0       nb fp32 scales, bucket order
 *     offset 4 * nb  n int8 codes, element order
 * All scales come first so that the codes are one contiguous run that SIMD
 * loads straight from the message without regard to bucket boundaries.
 *
 * Special values (the encoder's policy; the decoder just multiplies):
 *   - an all-zero bucket, or one whose max|x| / 127 underflows to 0 (max|x|
 *     below 2^-149 * 127), sends s = 0 and all codes 0: it decodes to zeros;
 *   - a bucket holding any Inf or NaN sends s = NaN (0x7fc00000) and all
 *     codes 0, so the whole bucket decodes to NaN. Overflow stays visible
 *     after aggregation (a loss scaler will skip the step) instead of being
 *     clipped to a finite value, and no float -> int conversion ever sees a
 *     non-finite value;
 *   - -0 encodes as code 0;
 *   - for max|x| = FLT_MAX, fp32 max/127 rounds up so far that 127 s would
 *     overflow; s is then one ulp smaller, so finite inputs always decode
 *     to finite values (with alpha = 1).
 * Error: |x - s q| <= s/2 up to fp32 rounding of x / s and s * q (a few ulp
 * of s), whenever s is a normal float; with a subnormal s (max|x| < 127 *
 * 2^-126) the clamp may add up to 127 * 2^-150.
 *
 * A crafted payload can only hold a wrong length (checked) or arbitrary
 * scale and code bytes; every pattern decodes without UB (code -128 decodes
 * to -128 s, a non-finite scale to Inf/NaN). */
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "compress/codec_internal.h"
#include "compress/int8_kernels.h"

#define INT8_BUCKET_DEFAULT 512u
#define INT8_BUCKET_MIN 8u
#define INT8_BUCKET_MAX (1u << 24)

typedef struct {
    size_t n, bucket, nb;
} int8_codec;

static terse_status int8_create(terse_spec *spec, size_t rows, size_t cols, void **self,
                                char *canon, size_t canon_cap) {
    uint64_t bucket;
    TERSE_CHECK(terse_spec_get_u64(spec, "bucket", INT8_BUCKET_DEFAULT, INT8_BUCKET_MIN,
                                   INT8_BUCKET_MAX, &bucket));
    int8_codec *c = malloc(sizeof *c);
    if (!c) return TERSE_ERROR(TERSE_ERR_NOMEM, "allocating codec 'int8'");
    c->n = rows * cols;
    c->bucket = (size_t)bucket;
    c->nb = (c->n + c->bucket - 1) / c->bucket;
    snprintf(canon, canon_cap, "bucket=%zu", c->bucket);
    *self = c;
    return TERSE_OK;
}

static void int8_destroy(void *self) { free(self); }

/* Every message has exactly this length, whatever the values. */
static size_t int8_bound(const void *self) {
    const int8_codec *c = self;
    return 4 * c->nb + c->n;
}

static double int8_bits(const void *self) {
    const int8_codec *c = self;
    return 8.0 * (double)int8_bound(self) / (double)c->n;
}

static terse_status int8_encode(void *self, const terse_encode_ctx *ctx, const float *x,
                                uint8_t *payload, size_t cap, size_t *len) {
    (void)ctx;
    (void)cap;
    int8_codec *c = self;
    terse__int8_encode_kernel()(x, c->n, c->bucket, payload, (int8_t *)(payload + 4 * c->nb));
    *len = int8_bound(c);
    return TERSE_OK;
}

static terse_status int8_decode(void *self, const uint8_t *payload, size_t len, float *dst,
                                float alpha, int accumulate) {
    int8_codec *c = self;
    if (len != int8_bound(c))
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "int8: payload is %zu bytes, expected %zu (%zu fp32 scales at byte 0, "
                           "%zu int8 codes at byte %zu)",
                           len, int8_bound(c), c->nb, c->n, 4 * c->nb);
    terse__int8_decode_kernel()(payload, (const int8_t *)(payload + 4 * c->nb), c->n, c->bucket,
                                dst, alpha, accumulate);
    return TERSE_OK;
}

/* Cut at bucket boundaries: a segment's message holds its buckets' scales
 * and codes, exactly as the whole message does. */
static size_t int8_segment_align(const void *self) { return ((const int8_codec *)self)->bucket; }

const terse_codec_ops terse__codec_int8 = {
    .size = sizeof(terse_codec_ops),
    .id = TERSE_ID_INT8,
    .name = "int8",
    .flags = TERSE_CODEC_FIXED_SIZE,
    .create = int8_create,
    .destroy = int8_destroy,
    .bound = int8_bound,
    .bits_per_element = int8_bits,
    .encode = int8_encode,
    .decode = int8_decode,
    .segment_align = int8_segment_align,
};
