/* Bucketed quantization to 2L+1 symmetric levels, stochastic or to
 * nearest: the engine shared by qsgd (scale = L2 norm of the bucket,
 * L = 2^(bits-1) - 1) and terngrad (scale = max |x| of the bucket,
 * bits = 2 so L = 1). A codec file parses its spec and hands the rest to
 * these three calls.
 *
 * Payload (all little endian), for nb = ceil(n / B) buckets, the last one
 * holding n - (nb-1)*B elements:
 *     nb fp32 scales, bucket order
 *     then per bucket ceil(len * bits / 8) code bytes (squant_kernels.h:
 *     LSB-first, code = level + L, spare high bits of the last byte zero)
 * so every bucket's codes start on a byte boundary and the payload size is
 * a function of the shape alone.
 *
 * Element j of bucket b decodes to (scale_b / L) * level, and is encoded by
 * rounding u = |x| / s_b * L up with probability frac(u), using draw
 * terse__rng_u32(terse__rng_subkey(key, b), j) with key =
 * terse__rng_key(seed, step, tensor, rank), where s_b is the bucket's
 * norm (L2 or max). Unbiased up to the 24-bit resolution of that draw.
 *
 * Nearest rounding (round=nearest): the same computation with every draw
 * replaced by one constant just below 1/2, so the level is floor(u + 1/2)
 * (ties up; squant_kernels.h), and the seed and stream are not used.
 * Biased, but |u - l| <= min(u, 1/2) for every element: with the bucket's
 * own scale it never moves an element further from x than 0 would, and
 * it adds no variance. Error feedback wants exactly that: the residual
 * already carries each step's rounding error to the next, so the noise of
 * stochastic rounding buys nothing there (measured: qsgd 4-bit, bucket 512,
 * with ef=1 on a Fashion-MNIST MLP, seeds 1-2: 75-77% accuracy with
 * stochastic rounding against 79-80% with nearest, both with lsq). The codecs default to it with ef=1.
 * The message format is the same: the decoder cannot tell the modes apart.
 *
 * Least-squares rescaling (lsq): the levels are drawn (or rounded) as
 * above, then the scale sent is not s_b but the one that brings the
 * decoded bucket closest to x for those levels,
 *     scale_b = L * sum_j x_j l_j / sum_j l_j^2
 * in double, rounded to fp32 (and capped at FLT_MAX), when some level is
 * nonzero; else s_b, which no level uses. Every l_j has the sign of x_j,
 * so the numerator is positive, and the per-bucket error is
 * ||x||^2 - <x,l>^2 / ||l||^2 <= ||x||^2 up to fp32 rounding: a
 * contraction, which error feedback needs and unbiased rounding is not
 * (its variance exceeds ||x||^2 at few levels). The price is bias. Only
 * the scale changes: the levels, the layout and the decoder are the same
 * with and without it.
 *
 * Special buckets (the same with and without lsq):
 *   - all zeros (+0 or -0): scale 0, every level 0; decodes to zeros.
 *   - a NaN or Inf anywhere in the bucket, or (qsgd) a norm that overflows
 *     fp32: scale is the quiet NaN 0x7fc00000, every level 0; the whole
 *     bucket decodes to NaN, so overflow stays visible downstream (as a
 *     loss scaler expects) without poisoning other buckets.
 * Decode rejects with TERSE_ERR_CORRUPT: a payload of the wrong length, a
 * scale with its sign bit set, the all-ones code 2^bits - 1, and nonzero
 * spare bits. Any other scale (Inf, NaN) decodes to Inf/NaN values. */
#ifndef TERSE_COMPRESS_SQUANT_H
#define TERSE_COMPRESS_SQUANT_H

#include <stddef.h>
#include <stdint.h>

#include "terse_plugin.h"

typedef enum { TERSE_SQUANT_NORM2, TERSE_SQUANT_ABSMAX } terse__squant_scale;

typedef struct terse__squant {
    const char *name; /* codec name, for error sentences */
    terse__squant_scale scale;
    unsigned bits, levels; /* levels = L */
    int lsq;               /* least-squares scales (above) */
    int nearest;           /* round to the nearest level, not stochastically */
    size_t n, bucket, nbuckets, last; /* last: elements in the last bucket */
    size_t stride;                    /* code bytes of a full bucket */
    size_t payload;                   /* exact payload bytes */
} terse__squant;

/* The words of the round= option, indexed by terse__squant.nearest:
 * {"stochastic", "nearest", NULL}, for terse__spec_get_choice. */
extern const char *const terse__squant_rounding[];

/* Lay out a codec for n >= 1 elements, buckets of `bucket` >= 1 (< 2^32)
 * elements, bits in [2, 8]; lsq nonzero for least-squares scales, nearest
 * nonzero for nearest rounding. */
void terse__squant_init(terse__squant *q, const char *name, size_t n, size_t bucket, unsigned bits,
                        terse__squant_scale scale, int lsq, int nearest);

/* Write exactly q->payload bytes. With nearest rounding ctx's seed and
 * stream do not matter: the same x gives the same bytes at every step. */
void terse__squant_encode(const terse__squant *q, const terse_encode_ctx *ctx, const float *x,
                          uint8_t *payload);

/* dst (+)= alpha * decoded, after checking everything listed above. */
terse_status terse__squant_decode(const terse__squant *q, const uint8_t *payload, size_t len,
                                  float *dst, float alpha, int accumulate);

#endif
