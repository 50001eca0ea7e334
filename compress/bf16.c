/* bf16: bfloat16 (the top 16 bits of a binary32), round to nearest even.
 * The payload is n little-endian 16-bit values; the conversion rules live
 * with the kernels (compress/half_kernels.h).
 *
 * Not flagged summable: adding two payloads element-wise as integers is
 * meaningless, and adding them as bf16 would round every partial sum to 8
 * significant bits, so the collectives must decode each message to fp32
 * before reducing. */
#include <stdlib.h>

#include "common/error.h"
#include "compress/codec_internal.h"
#include "compress/half_kernels.h"

typedef struct {
    size_t n;
} bf16_codec;

static terse_status bf16_create(terse_spec *spec, size_t rows, size_t cols, void **self,
                                char *canon, size_t canon_cap) {
    (void)spec;
    (void)canon_cap;
    bf16_codec *c = malloc(sizeof *c);
    if (!c) return TERSE_ERROR(TERSE_ERR_NOMEM, "allocating codec 'bf16'");
    c->n = rows * cols;
    canon[0] = '\0';
    *self = c;
    return TERSE_OK;
}

static void bf16_destroy(void *self) { free(self); }

static size_t bf16_bound(const void *self) { return ((const bf16_codec *)self)->n * 2; }

static double bf16_bits(const void *self) {
    (void)self;
    return 16.0;
}

static terse_status bf16_encode(void *self, const terse_encode_ctx *ctx, const float *x,
                                uint8_t *payload, size_t cap, size_t *len) {
    (void)ctx;
    (void)cap;
    bf16_codec *c = self;
    terse__bf16_encode(payload, x, c->n);
    *len = c->n * 2;
    return TERSE_OK;
}

static terse_status bf16_decode(void *self, const uint8_t *payload, size_t len, float *dst,
                                float alpha, int accumulate) {
    bf16_codec *c = self;
    if (len != c->n * 2)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "bf16: payload length (header byte 16) is %zu bytes, expected %zu "
                           "(2 per element)",
                           len, c->n * 2);
    terse__bf16_decode(dst, payload, c->n, alpha, accumulate);
    return TERSE_OK;
}

/* Elementwise: any cut leaves every element's code as it was. */
static size_t bf16_segment_align(const void *self) {
    (void)self;
    return 1;
}

const terse_codec_ops terse__codec_bf16 = {
    .size = sizeof(terse_codec_ops),
    .id = TERSE_ID_BF16,
    .name = "bf16",
    .flags = TERSE_CODEC_FIXED_SIZE,
    .create = bf16_create,
    .destroy = bf16_destroy,
    .bound = bf16_bound,
    .bits_per_element = bf16_bits,
    .encode = bf16_encode,
    .decode = bf16_decode,
    .segment_align = bf16_segment_align,
};
