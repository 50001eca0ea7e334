/* none: fp32 passthrough, the baseline every other codec is measured
 * against. The payload is the n floats, little endian. */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compress/codec_internal.h"
#include "compress/kernels.h"

typedef struct {
    size_t n;
} none_codec;

static terse_status none_create(terse_spec *spec, size_t rows, size_t cols, void **self,
                                char *canon, size_t canon_cap) {
    (void)spec;
    (void)canon_cap;
    none_codec *c = malloc(sizeof *c);
    if (!c) return TERSE_ERROR(TERSE_ERR_NOMEM, "allocating codec 'none'");
    c->n = rows * cols;
    canon[0] = '\0';
    *self = c;
    return TERSE_OK;
}

static void none_destroy(void *self) { free(self); }

static size_t none_bound(const void *self) { return ((const none_codec *)self)->n * 4; }

static double none_bits(const void *self) {
    (void)self;
    return 32.0;
}

static terse_status none_encode(void *self, const terse_encode_ctx *ctx, const float *x,
                                uint8_t *payload, size_t cap, size_t *len) {
    (void)ctx;
    (void)cap;
    none_codec *c = self;
    memcpy(payload, x, c->n * 4);
    *len = c->n * 4;
    return TERSE_OK;
}

static terse_status none_decode(void *self, const uint8_t *payload, size_t len, float *dst,
                                float alpha, int accumulate) {
    none_codec *c = self;
    if (len != c->n * 4)
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "none: payload is %zu bytes, expected %zu", len,
                           c->n * 4);
    terse__kernel_axpy_f32(dst, payload, c->n, alpha, accumulate);
    return TERSE_OK;
}

/* Aggregation: one round whose vector is the input itself, so a none
 * all-reduce is the dense one with no copy. Error feedback is exact
 * (e = p - D(C(p)) = 0): the residual is folded into the input and
 * cleared, as encode would leave it. */
static unsigned none_rounds(const void *self) {
    (void)self;
    return 1;
}

static terse_status none_round_vector(void *self, const terse_round_ctx *ctx, unsigned round,
                                      float *x, float **vec, size_t *count) {
    (void)round;
    none_codec *c = self;
    if (ctx->residual) {
        for (size_t i = 0; i < c->n; i++) x[i] += ctx->residual[i];
        memset(ctx->residual, 0, c->n * sizeof(float));
    }
    *vec = x;
    *count = c->n;
    return TERSE_OK;
}

/* An average divides by N, as the dense all-reduce does (not a multiply by
 * 1/N, which rounds differently when N is not a power of two): none keeps
 * bitwise the dense path's results. */
static terse_status none_round_finish(void *self, const terse_round_ctx *ctx, float *x,
                                      float alpha) {
    none_codec *c = self;
    if (alpha != 1.0f) {
        const float d = (float)ctx->nranks;
        for (size_t i = 0; i < c->n; i++) x[i] /= d;
    }
    return TERSE_OK;
}

const terse_codec_ops terse__codec_none = {
    .size = sizeof(terse_codec_ops),
    .id = TERSE_ID_NONE,
    .name = "none",
    .flags = TERSE_CODEC_SUMMABLE,
    .create = none_create,
    .destroy = none_destroy,
    .bound = none_bound,
    .bits_per_element = none_bits,
    .encode = none_encode,
    .decode = none_decode,
    .rounds = none_rounds,
    .round_vector = none_round_vector,
    .round_finish = none_round_finish,
};
