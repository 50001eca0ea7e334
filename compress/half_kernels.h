/* Half-precision kernels for the fp16 (IEEE binary16) and bf16 (bfloat16)
 * codecs: element conversions, and array encode / fused decode.
 *
 * Rounding contract, identical in every version (the SIMD ones are tested
 * bit for bit against the scalar reference):
 *   float -> half  round to nearest, ties to even, independent of MXCSR /
 *                  fenv; overflow gives +-Inf; a float subnormal or a value
 *                  below the smallest half subnormal rounds (to even) to a
 *                  signed zero; NaN gives a quiet NaN with the same sign and
 *                  the top payload bits (never Inf).
 *   half -> float  exact. A signalling NaN comes out quiet (the quiet bit
 *                  is set, payload kept), as the IEEE conversion and x86
 *                  F16C do.
 * Payloads are n little-endian 16-bit values at any alignment.
 *
 * Decode is fused with the aggregation the codec API asks for:
 *   accumulate == 0:  dst[i]  = alpha * h[i]
 *   accumulate != 0:  dst[i] += alpha * h[i]   (product first, then add)
 * The product is always computed, even for alpha == 1, so every version
 * quiets NaNs the same way. */
#ifndef TERSE_COMPRESS_HALF_KERNELS_H
#define TERSE_COMPRESS_HALF_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* Element conversions (the scalar reference). */
uint16_t terse__fp16_from_f32(float f);
float terse__fp16_to_f32(uint16_t h);
uint16_t terse__bf16_from_f32(float f);
float terse__bf16_to_f32(uint16_t h);

/* Array kernels, dispatched at run time (common/cpu.h). */
void terse__fp16_encode(uint8_t *dst, const float *src, size_t n);
void terse__fp16_decode(float *dst, const uint8_t *src, size_t n, float alpha, int accumulate);
void terse__bf16_encode(uint8_t *dst, const float *src, size_t n);
void terse__bf16_decode(float *dst, const uint8_t *src, size_t n, float alpha, int accumulate);

/* Every version, for tests and for the SIMD files' tails. */
void terse__fp16_encode_scalar(uint8_t *dst, const float *src, size_t n);
void terse__fp16_decode_scalar(float *dst, const uint8_t *src, size_t n, float alpha,
                               int accumulate);
void terse__bf16_encode_scalar(uint8_t *dst, const float *src, size_t n);
void terse__bf16_decode_scalar(float *dst, const uint8_t *src, size_t n, float alpha,
                               int accumulate);

#if defined(__x86_64__)
void terse__fp16_encode_avx2(uint8_t *dst, const float *src, size_t n);
void terse__fp16_decode_avx2(float *dst, const uint8_t *src, size_t n, float alpha,
                             int accumulate);
void terse__bf16_encode_avx2(uint8_t *dst, const float *src, size_t n);
void terse__bf16_decode_avx2(float *dst, const uint8_t *src, size_t n, float alpha,
                             int accumulate);

/* AVX-512 pays only for decode (see half-avx512.c); that level encodes with
 * the AVX2 kernels. */
void terse__fp16_decode_avx512(float *dst, const uint8_t *src, size_t n, float alpha,
                               int accumulate);
void terse__bf16_decode_avx512(float *dst, const uint8_t *src, size_t n, float alpha,
                               int accumulate);
#endif

#endif
