/* sign: scaled sign, the compressor of EF-signSGD (Karimireddy et al.,
 * "Error Feedback Fixes SignSGD and other Gradient Compression Schemes",
 * ICML 2019): each bucket of B elements (the last may be short) sends one
 * bit per element and one fp32 scale, the mean |x| of the bucket, and
 * decodes to +-scale. Biased; meant for ef=1.
 *
 * Payload (little endian), exactly 4 * nb + ceil(n / 8) bytes,
 * nb = ceil(n / B):
 *     offset 0       nb fp32 scales, bucket order
 *     offset 4 * nb  sign bits of the whole tensor, LSB first (bit i of the
 *                    tensor is bit i % 8 of byte i / 8), 1 = negative, the
 *                    unused high bits of the last byte 0
 * The mean is summed in the fixed order documented in sign_kernels.h, so
 * every SIMD level sends the same bytes.
 *
 * Special values (the encoder's policy):
 *   - the bit is (x < 0): +0, -0 and NaN all send 0 ("positive"), so the
 *     two zeros are treated alike;
 *   - an all-zero bucket has scale 0 and decodes to +0;
 *   - a bucket holding Inf has scale Inf (decodes to +-Inf), one holding
 *     NaN has scale NaN (0x7fc00000, decodes to NaN): overflow stays
 *     visible downstream instead of being averaged away;
 *   - the mean is accumulated in double, so finite inputs never overflow
 *     it.
 * Decoding checks the length and that the padding bits are 0, so each
 * decoded tensor has exactly one encoding; any scale bytes decode without
 * UB (a non-finite scale gives Inf/NaN outputs). */
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "compress/codec_internal.h"
#include "compress/sign_kernels.h"

#define SIGN_BUCKET_DEFAULT 1024u
#define SIGN_BUCKET_MIN 8u
#define SIGN_BUCKET_MAX (1u << 24)

typedef struct {
    size_t n, bucket, nb;
} sign_codec;

static terse_status sign_create(terse_spec *spec, size_t rows, size_t cols, void **self,
                                char *canon, size_t canon_cap) {
    uint64_t bucket;
    TERSE_CHECK(terse_spec_get_u64(spec, "bucket", SIGN_BUCKET_DEFAULT, SIGN_BUCKET_MIN,
                                   SIGN_BUCKET_MAX, &bucket));
    sign_codec *c = malloc(sizeof *c);
    if (!c) return TERSE_ERROR(TERSE_ERR_NOMEM, "allocating codec 'sign'");
    c->n = rows * cols;
    c->bucket = (size_t)bucket;
    c->nb = (c->n + c->bucket - 1) / c->bucket;
    snprintf(canon, canon_cap, "bucket=%zu", c->bucket);
    *self = c;
    return TERSE_OK;
}

static void sign_destroy(void *self) { free(self); }

/* Every message has exactly this length, whatever the values. */
static size_t sign_bound(const void *self) {
    const sign_codec *c = self;
    return 4 * c->nb + (c->n + 7) / 8;
}

static double sign_bits(const void *self) {
    const sign_codec *c = self;
    return 8.0 * (double)sign_bound(self) / (double)c->n;
}

static terse_status sign_encode(void *self, const terse_encode_ctx *ctx, const float *x,
                                uint8_t *payload, size_t cap, size_t *len) {
    (void)ctx;
    (void)cap;
    sign_codec *c = self;
    terse__sign_encode_kernel()(x, c->n, c->bucket, payload, payload + 4 * c->nb);
    *len = sign_bound(c);
    return TERSE_OK;
}

static terse_status sign_decode(void *self, const uint8_t *payload, size_t len, float *dst,
                                float alpha, int accumulate) {
    sign_codec *c = self;
    if (len != sign_bound(c))
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "sign: payload is %zu bytes, expected %zu (%zu fp32 scales at byte 0, "
                           "%zu bytes of sign bits at byte %zu)",
                           len, sign_bound(c), c->nb, (c->n + 7) / 8, 4 * c->nb);
    const uint8_t *bits = payload + 4 * c->nb;
    if (c->n % 8) {
        size_t last = (c->n - 1) / 8;
        if (bits[last] >> (c->n % 8))
            return TERSE_ERROR(TERSE_ERR_CORRUPT,
                               "sign: padding bits of the last sign byte (payload byte %zu) are "
                               "0x%02x, must be 0",
                               4 * c->nb + last, (unsigned)(bits[last] >> (c->n % 8)));
    }
    terse__sign_decode_kernel()(payload, bits, c->n, c->bucket, dst, alpha, accumulate);
    return TERSE_OK;
}

/* Cut at bucket boundaries: a segment's buckets code as the whole's do. */
static size_t sign_segment_align(const void *self) { return ((const sign_codec *)self)->bucket; }

const terse_codec_ops terse__codec_sign = {
    .size = sizeof(terse_codec_ops),
    .id = TERSE_ID_SIGN,
    .name = "sign",
    .flags = TERSE_CODEC_FIXED_SIZE,
    .create = sign_create,
    .destroy = sign_destroy,
    .bound = sign_bound,
    .bits_per_element = sign_bits,
    .encode = sign_encode,
    .decode = sign_decode,
    .segment_align = sign_segment_align,
};
