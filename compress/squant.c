/* The bucket loop of stochastic quantization (layout in squant.h): scale
 * per bucket, special buckets, and decode-side validation. The per-element
 * work is in squant_kernels.c and its SIMD siblings. */
#include "compress/squant.h"

#include <math.h>
#include <string.h>

#include "common/bytes.h"
#include "common/error.h"
#include "common/rng.h"
#include "compress/squant_kernels.h"

#define QNAN_BITS 0x7fc00000u

void terse__squant_init(terse__squant *q, const char *name, size_t n, size_t bucket, unsigned bits,
                        terse__squant_scale scale) {
    q->name = name;
    q->scale = scale;
    q->bits = bits;
    q->levels = (1u << (bits - 1)) - 1;
    q->n = n;
    q->bucket = bucket;
    q->nbuckets = (n + bucket - 1) / bucket;
    q->last = n - (q->nbuckets - 1) * bucket;
    q->stride = (bucket * bits + 7) / 8;
    q->payload = 4 * q->nbuckets + (q->nbuckets - 1) * q->stride + (q->last * bits + 7) / 8;
}

/* Every level 0 (code L) for len elements, spare bits zero. */
static void fill_zero_levels(uint8_t *out, size_t len, unsigned bits, unsigned L) {
    size_t nbytes = (len * bits + 7) / 8;
    if (8 % bits == 0) { /* 2, 4, 8: the code repeats within a byte */
        unsigned byte = 0;
        for (unsigned s = 0; s < 8; s += bits) byte |= L << s;
        memset(out, (int)byte, nbytes);
        if ((len * bits) & 7) out[nbytes - 1] &= (uint8_t)((1u << ((len * bits) & 7)) - 1);
        return;
    }
    uint64_t acc = 0;
    unsigned have = 0;
    size_t o = 0;
    for (size_t j = 0; j < len; j++) {
        acc |= (uint64_t)L << have;
        for (have += bits; have >= 8; have -= 8, acc >>= 8) out[o++] = (uint8_t)acc;
    }
    if (have) out[o] = (uint8_t)acc;
}

void terse__squant_encode(const terse__squant *q, const terse_encode_ctx *ctx, const float *x,
                          uint8_t *payload) {
    const terse__squant_kernels *k = terse__squant_kernels_get();
    uint64_t key = terse__rng_key(ctx->seed, ctx->step, ctx->tensor, ctx->rank);
    uint8_t *codes = payload + 4 * q->nbuckets;
    for (size_t b = 0; b < q->nbuckets; b++) {
        const float *xb = x + b * q->bucket;
        size_t len = b + 1 == q->nbuckets ? q->last : q->bucket;
        uint8_t *out = codes + b * q->stride;
        float s;
        int finite;
        if (q->scale == TERSE_SQUANT_NORM2) {
            /* sumsq is Inf/NaN iff the bucket has Inf/NaN; the float norm
             * may still overflow, which counts as not finite too. */
            s = (float)sqrt(k->sumsq(xb, len));
            finite = isfinite(s);
        } else {
            uint32_t m = k->absmax(xb, len);
            finite = m < 0x7f800000u;
            memcpy(&s, &m, 4);
        }
        if (!finite) {
            terse__put_u32(payload + 4 * b, QNAN_BITS);
            fill_zero_levels(out, len, q->bits, q->levels);
        } else if (s == 0.0f) {
            terse__put_f32(payload + 4 * b, 0.0f);
            fill_zero_levels(out, len, q->bits, q->levels);
        } else {
            terse__put_f32(payload + 4 * b, s);
            k->encode(xb, len, s, q->bits, terse__rng_subkey(key, b), out);
        }
    }
}

/* Index of the first all-ones code among len codes (there is one). */
static size_t first_invalid(const uint8_t *in, size_t len, unsigned bits) {
    unsigned mask = (1u << bits) - 1;
    for (size_t j = 0; j < len; j++) {
        size_t bit = j * bits;
        unsigned w = in[bit / 8];
        if ((bit & 7) + bits > 8) w |= (unsigned)in[bit / 8 + 1] << 8;
        if (((w >> (bit & 7)) & mask) == mask) return j;
    }
    return len;
}

terse_status terse__squant_decode(const terse__squant *q, const uint8_t *payload, size_t len,
                                  float *dst, float alpha, int accumulate) {
    if (len != q->payload)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "%s: payload is %zu bytes, but %zu elements in buckets of %zu at %u "
                           "bits take %zu",
                           q->name, len, q->n, q->bucket, q->bits, q->payload);
    /* Scales first, so a bad one is caught before dst is touched. */
    for (size_t b = 0; b < q->nbuckets; b++)
        if (payload[4 * b + 3] & 0x80)
            return TERSE_ERROR(TERSE_ERR_CORRUPT,
                               "%s: scale of bucket %zu (payload byte %zu) is negative", q->name, b,
                               4 * b);
    const terse__squant_kernels *k = terse__squant_kernels_get();
    const uint8_t *codes = payload + 4 * q->nbuckets;
    const float Lf = (float)q->levels;
    for (size_t b = 0; b < q->nbuckets; b++) {
        size_t blen = b + 1 == q->nbuckets ? q->last : q->bucket;
        const uint8_t *in = codes + b * q->stride;
        size_t nbytes = (blen * q->bits + 7) / 8, spare = (blen * q->bits) & 7;
        if (spare && (in[nbytes - 1] >> spare))
            return TERSE_ERROR(TERSE_ERR_CORRUPT,
                               "%s: spare bits of bucket %zu (payload byte %zu) are not zero",
                               q->name, b, (size_t)(in + nbytes - 1 - payload));
        float step = terse__get_f32(payload + 4 * b) / Lf;
        if (k->decode(in, blen, q->bits, step, alpha, accumulate, dst + b * q->bucket)) {
            size_t j = first_invalid(in, blen, q->bits);
            return TERSE_ERROR(TERSE_ERR_CORRUPT,
                               "%s: element %zu has the invalid code %u (payload byte %zu; codes "
                               "run 0..%u)",
                               q->name, b * q->bucket + j, (1u << q->bits) - 1,
                               (size_t)(in - payload) + j * q->bits / 8, 2 * q->levels);
        }
    }
    return TERSE_OK;
}
