/* Kernels of bucketed stochastic quantization (squant.h), the engine behind
 * qsgd and terngrad. Each kernel has a scalar reference (_scalar, always
 * compiled) and x86 versions (_avx2, _avx512) that produce BIT-IDENTICAL
 * results: same float operations in the same order, no FMA anywhere. The
 * tests compare them directly.
 *
 * One bucket's codes are packed LSB-first: element j occupies bits
 * [j*bits, (j+1)*bits) of the byte string, bit k being bit k%8 of byte k/8;
 * the unused high bits of the last byte are zero. With L = 2^(bits-1) - 1,
 * a code is l + L for a signed level l in [-L, L]; the all-ones code
 * 2^bits - 1 (= 2L + 1) is never produced and marks a corrupt message. */
#ifndef TERSE_COMPRESS_SQUANT_KERNELS_H
#define TERSE_COMPRESS_SQUANT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/*
 * sumsq: sum of x[j]^2 in double, in a fixed order every version follows:
 * sixteen lane accumulators, acc[j % 16] += (double)x[j] * x[j] (the product
 * of two floats is exact in double), then reduced pairwise as
 *     b[k] = acc[k] + acc[k+8]   (k < 8)
 *     c[k] = b[k] + b[k+4]       (k < 4)
 *     d[k] = c[k] + c[k+2]       (k < 2)
 *     sum  = d[0] + d[1]
 * which is what four AVX2 or two AVX-512 accumulators reduce to. The result
 * is +Inf or NaN exactly when some x[j] is not finite.
 */
double terse__squant_sumsq_scalar(const float *x, size_t n);

/* absmax: max over j of the bit pattern of |x[j]| (sign cleared), as an
 * integer. For non-NaN values this orders like the magnitudes; any NaN
 * compares above +Inf (0x7f800000), so ">= 0x7f800000" means "not finite".
 * Exact and order-free. 0 for n == 0. */
uint32_t terse__squant_absmax_scalar(const float *x, size_t n);

/*
 * encode: write the ceil(n*bits/8) code bytes of one bucket to out.
 * For each element, with Lf = (float)L and all arithmetic in fp32:
 *     u    = (|x| / scale) * Lf;  u = (u < Lf) ? u : Lf   (MINPS semantics:
 *            a NaN u becomes Lf)
 *     f    = (int)u;  frac = u - (float)f
 *     r    = (float)(terse__rng_u32(subkey, j) >> 8) * 2^-24   (stochastic)
 *            TERSE__SQUANT_NEAREST_DRAW                         (nearest)
 *     l    = f + (r < frac);  negated when the sign bit of x is set
 *     code = l + L
 * nearest (nonzero) replaces every draw by one constant, so subkey is not
 * used and the kernels compute no hashes. frac is exact (u - floor(u) is),
 * so "r < frac" with that r is "frac >= 1/2", and l = floor(u + 1/2) in
 * exact arithmetic on u: round half up; never above L, since f = L leaves
 * frac = 0.
 * Meant for finite x and finite scale > 0 with |x| <= scale, but defined
 * for any x when scale is > 0, +0, +Inf or NaN (u is then NaN, +Inf or 0,
 * and the clamp keeps the integer conversion in range). bits in [2, 8];
 * n < 2^32.
 */
void terse__squant_encode_scalar(const float *x, size_t n, float scale, unsigned bits,
                                 uint32_t subkey, int nearest, uint8_t *out);

/* The draw of nearest rounding: the largest float below 1/2, so that ties
 * (frac exactly 1/2) round up, as floor(u + 1/2) does; plain 0.5f with the
 * strict "<" would round them down. No stochastic draw (a multiple of
 * 2^-24) takes this value. */
#define TERSE__SQUANT_NEAREST_DRAW 0x1.fffffep-2f

/*
 * decode: read the ceil(n*bits/8) code bytes at in; for each element
 *     v = alpha * (step * (float)(code - L))
 *     dst[j] = accumulate ? dst[j] + v : v
 * Returns nonzero if any of the n codes is the invalid all-ones code (those
 * elements are still written, with the value the formula gives). The
 * padding bits after the n-th code are not read as codes.
 */
int terse__squant_decode_scalar(const uint8_t *in, size_t n, unsigned bits, float step,
                                float alpha, int accumulate, float *dst);

#if defined(__x86_64__)
double terse__squant_sumsq_avx2(const float *x, size_t n);
uint32_t terse__squant_absmax_avx2(const float *x, size_t n);
void terse__squant_encode_avx2(const float *x, size_t n, float scale, unsigned bits,
                               uint32_t subkey, int nearest, uint8_t *out);
int terse__squant_decode_avx2(const uint8_t *in, size_t n, unsigned bits, float step, float alpha,
                              int accumulate, float *dst);

double terse__squant_sumsq_avx512(const float *x, size_t n);
uint32_t terse__squant_absmax_avx512(const float *x, size_t n);
void terse__squant_encode_avx512(const float *x, size_t n, float scale, unsigned bits,
                                 uint32_t subkey, int nearest, uint8_t *out);
int terse__squant_decode_avx512(const uint8_t *in, size_t n, unsigned bits, float step,
                                float alpha, int accumulate, float *dst);
#endif

/* The versions chosen for this CPU (terse__cpu_features, so TERSE_SIMD caps
 * it); picked on first use and cached. */
typedef struct terse__squant_kernels {
    const char *level; /* "scalar", "avx2", "avx512" */
    double (*sumsq)(const float *x, size_t n);
    uint32_t (*absmax)(const float *x, size_t n);
    void (*encode)(const float *x, size_t n, float scale, unsigned bits, uint32_t subkey,
                   int nearest, uint8_t *out);
    int (*decode)(const uint8_t *in, size_t n, unsigned bits, float step, float alpha,
                  int accumulate, float *dst);
} terse__squant_kernels;

const terse__squant_kernels *terse__squant_kernels_get(void);

#endif
