/* Kernels of the int8 codec (compress/int8.c): a scalar reference in
 * int8_kernels.c and SIMD twins in int8-avx2.c / int8-avx512.c that must
 * produce bit-identical payloads and decoded floats.
 *
 * Every kernel works on a whole tensor of n elements cut into buckets of
 * `bucket` elements (the last one may be short). The payload is
 *     scales  nb = ceil(n / bucket) fp32, little endian, one per bucket
 *     codes   n int8, element order
 * so that the codes of a bucket are contiguous and SIMD loads need no
 * gathering. */
#ifndef TERSE_COMPRESS_INT8_KERNELS_H
#define TERSE_COMPRESS_INT8_KERNELS_H

#include <float.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Quantize x[0..n) into nb scales and n codes. */
typedef void (*terse__int8_encode_fn)(const float *x, size_t n, size_t bucket, uint8_t *scales,
                                      int8_t *codes);
/* dst (+)= alpha * (s * q), bucket by bucket. */
typedef void (*terse__int8_decode_fn)(const uint8_t *scales, const int8_t *codes, size_t n,
                                      size_t bucket, float *dst, float alpha, int accumulate);

void terse__int8_encode_scalar(const float *x, size_t n, size_t bucket, uint8_t *scales,
                               int8_t *codes);
void terse__int8_decode_scalar(const uint8_t *scales, const int8_t *codes, size_t n, size_t bucket,
                               float *dst, float alpha, int accumulate);
#if defined(__x86_64__)
void terse__int8_encode_avx2(const float *x, size_t n, size_t bucket, uint8_t *scales,
                             int8_t *codes);
void terse__int8_decode_avx2(const uint8_t *scales, const int8_t *codes, size_t n, size_t bucket,
                             float *dst, float alpha, int accumulate);
void terse__int8_encode_avx512(const float *x, size_t n, size_t bucket, uint8_t *scales,
                               int8_t *codes);
void terse__int8_decode_avx512(const uint8_t *scales, const int8_t *codes, size_t n, size_t bucket,
                               float *dst, float alpha, int accumulate);
#endif

/* The best kernels this CPU allows (after TERSE_SIMD), chosen once. */
terse__int8_encode_fn terse__int8_encode_kernel(void);
terse__int8_decode_fn terse__int8_decode_kernel(void);

/* Pieces the SIMD kernels share with the reference so that edges of a
 * bucket (tails shorter than a vector) go through the very same code. */

/* q[i] = round_even(clamp(x[i] / s, -127, 127)) for a finite s > 0. */
void terse__int8_quantize_scalar(const float *x, size_t len, float s, int8_t *q);
/* dst[i] (+)= alpha * (s * q[i]). */
void terse__int8_dequantize_scalar(const int8_t *q, size_t len, float s, float alpha,
                                   int accumulate, float *dst);

/* The scale sent for a bucket whose largest |x| has the bit pattern
 * absmax_bits (sign cleared). Comparing bit patterns as integers orders
 * non-negative floats correctly and puts every NaN above +Inf, so the
 * maximum is exact and independent of the order lanes are combined in.
 * A bucket holding Inf or NaN gets the canonical quiet NaN (0x7fc00000):
 * every element of it then decodes to NaN, so an overflow upstream stays
 * visible downstream (e.g. to a loss scaler) instead of being clipped. */
static inline float terse__int8_scale(uint32_t absmax_bits) {
    float f;
    if (absmax_bits >= 0x7f800000u) {
        absmax_bits = 0x7fc00000u;
        memcpy(&f, &absmax_bits, 4);
        return f;
    }
    memcpy(&f, &absmax_bits, 4);
    float s = f / 127.0f;
    /* Only for max|x| = FLT_MAX does s round up so far that 127 s
     * overflows; step s down one ulp so the max decodes finite. */
    if (s * 127.0f > FLT_MAX) {
        uint32_t u;
        memcpy(&u, &s, 4);
        u -= 1;
        memcpy(&s, &u, 4);
    }
    return s;
}

/* Codes are computed only when this holds; otherwise (all-zero bucket, a
 * max|x| so small that max/127 underflows to 0, or a non-finite bucket)
 * every code is 0. */
static inline int terse__int8_scale_usable(float s) { return s > 0.0f; /* false for NaN */ }

#endif
