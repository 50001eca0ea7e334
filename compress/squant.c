/* The bucket loop of stochastic or nearest quantization (layout in
 * squant.h): scale per bucket, special buckets, least-squares rescaling,
 * and decode-side validation. The per-element work is in squant_kernels.c and its SIMD
 * siblings. */
#include "compress/squant.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "common/bytes.h"
#include "common/error.h"
#include "common/rng.h"
#include "compress/squant_kernels.h"

#define QNAN_BITS 0x7fc00000u

const char *const terse__squant_rounding[] = {"stochastic", "nearest", NULL};

void terse__squant_init(terse__squant *q, const char *name, size_t n, size_t bucket, unsigned bits,
                        terse__squant_scale scale, int lsq, int nearest) {
    q->name = name;
    q->scale = scale;
    q->lsq = lsq != 0;
    q->nearest = nearest != 0;
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

/* The least-squares scale for the len levels the kernel just packed at in
 * (squant.h), or s when every level is 0. A second pass rather than a
 * change to the encode kernels, so it costs only when lsq is on: the
 * decode kernel with step 1 turns a chunk of codes back into its levels
 * (exactly, as floats, at every SIMD level), then plain C sums x_j l_j in
 * double, in LSQ_LANES accumulators (lane j % LSQ_LANES, added in lane
 * order at the end) so the adds do not wait on each other. The order is
 * fixed, so the scale has the same bits at every SIMD level. Each product
 * is exact in double (a 24-bit significand times |l_j| <= 127), so a
 * compiler that fuses multiply and add into an FMA changes nothing.
 * sum l_j^2 is exact throughout: in float within a chunk (integers below
 * 2^24), then in double (below 2^24 * 127^2). Measured, encode with lsq
 * takes about 2.5 times as long as without. */
#define LSQ_LANES 8
#define LSQ_CHUNK 256 /* elements per decode: whole bytes at every width */
static float lsq_scale(const terse__squant_kernels *k, const float *x, size_t len,
                       const uint8_t *in, unsigned bits, unsigned L, float s) {
    float lev[LSQ_CHUNK];
    double dot[LSQ_LANES] = {0}, den = 0;
    for (size_t c = 0; c < len; c += LSQ_CHUNK) {
        size_t m = len - c < LSQ_CHUNK ? len - c : LSQ_CHUNK, j = 0;
        const float *xc = x + c;
        float sq[LSQ_LANES] = {0}; /* below LSQ_CHUNK * 127^2 < 2^24 */
        (void)k->decode(in + c / 8 * bits, m, bits, 1.0f, 1.0f, 0, lev); /* no invalid codes */
        for (; j + LSQ_LANES <= m; j += LSQ_LANES)
            for (unsigned q = 0; q < LSQ_LANES; q++) {
                dot[q] += (double)xc[j + q] * lev[j + q];
                sq[q] += lev[j + q] * lev[j + q];
            }
        for (; j < m; j++) {
            dot[j % LSQ_LANES] += (double)xc[j] * lev[j];
            sq[j % LSQ_LANES] += lev[j] * lev[j];
        }
        for (unsigned q = 0; q < LSQ_LANES; q++) den += sq[q];
    }
    double num = 0;
    for (unsigned q = 0; q < LSQ_LANES; q++) num += dot[q];
    if (!(den > 0)) return s;
    double t = (double)L * num / den;
    /* t > 0 since every l_j has the sign of x_j (-0 and underflowing x get
     * level 0); the check guards against a surprise, and 0 still contracts.
     * t < 2 s (a nonzero |l_j| is at least u_j / 2), so it can pass
     * FLT_MAX only when s is within a factor 2 of it; every scale in
     * [0, 2t] gives error <= ||x||^2, so capping at FLT_MAX keeps the
     * contraction. */
    if (!(t > 0)) return 0.0f;
    return t > FLT_MAX ? FLT_MAX : (float)t;
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
            k->encode(xb, len, s, q->bits, terse__rng_subkey(key, b), q->nearest, out);
            if (q->lsq) s = lsq_scale(k, xb, len, out, q->bits, q->levels, s);
            terse__put_f32(payload + 4 * b, s);
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
