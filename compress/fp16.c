/* fp16: IEEE binary16, round to nearest even. The payload is n
 * little-endian 16-bit values; the conversion rules live with the kernels
 * (compress/half_kernels.h).
 *
 * Not flagged summable: adding two payloads element-wise as integers is
 * meaningless, and adding them as halves would round every sum to fp16 and
 * overflow to Inf above 65504, so the collectives must decode each message
 * to fp32 before reducing. */
#include <stdlib.h>

#include "common/error.h"
#include "compress/codec_internal.h"
#include "compress/half_kernels.h"

typedef struct {
    size_t n;
} fp16_codec;

static terse_status fp16_create(terse_spec *spec, size_t rows, size_t cols, void **self,
                                char *canon, size_t canon_cap) {
    (void)spec;
    (void)canon_cap;
    fp16_codec *c = malloc(sizeof *c);
    if (!c) return TERSE_ERROR(TERSE_ERR_NOMEM, "allocating codec 'fp16'");
    c->n = rows * cols;
    canon[0] = '\0';
    *self = c;
    return TERSE_OK;
}

static void fp16_destroy(void *self) { free(self); }

static size_t fp16_bound(const void *self) { return ((const fp16_codec *)self)->n * 2; }

static double fp16_bits(const void *self) {
    (void)self;
    return 16.0;
}

static terse_status fp16_encode(void *self, const terse_encode_ctx *ctx, const float *x,
                                uint8_t *payload, size_t cap, size_t *len) {
    (void)ctx;
    (void)cap;
    fp16_codec *c = self;
    terse__fp16_encode(payload, x, c->n);
    *len = c->n * 2;
    return TERSE_OK;
}

static terse_status fp16_decode(void *self, const uint8_t *payload, size_t len, float *dst,
                                float alpha, int accumulate) {
    fp16_codec *c = self;
    if (len != c->n * 2)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "fp16: payload length (header byte 16) is %zu bytes, expected %zu "
                           "(2 per element)",
                           len, c->n * 2);
    terse__fp16_decode(dst, payload, c->n, alpha, accumulate);
    return TERSE_OK;
}

/* Elementwise: any cut leaves every element's code as it was. */
static size_t fp16_segment_align(const void *self) {
    (void)self;
    return 1;
}

const terse_codec_ops terse__codec_fp16 = {
    .size = sizeof(terse_codec_ops),
    .id = TERSE_ID_FP16,
    .name = "fp16",
    .flags = TERSE_CODEC_FIXED_SIZE,
    .create = fp16_create,
    .destroy = fp16_destroy,
    .bound = fp16_bound,
    .bits_per_element = fp16_bits,
    .encode = fp16_encode,
    .decode = fp16_decode,
    .segment_align = fp16_segment_align,
};
