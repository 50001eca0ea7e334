/* Kernels of the sign codec (compress/sign.c): a scalar reference in
 * sign_kernels.c and SIMD twins in sign-avx2.c / sign-avx512.c that must
 * produce bit-identical payloads and decoded floats.
 *
 * Every kernel works on a whole tensor of n elements cut into buckets of
 * `bucket` elements (the last one may be short). The payload is
 *     scales  nb = ceil(n / bucket) fp32, little endian, one per bucket
 *     bits    ceil(n / 8) bytes: bit i of the tensor is bit (i % 8) of byte
 *             i / 8 (LSB first), 1 = negative; bits past n are 0
 * Bits run continuously across buckets, so a bucket need not start on a
 * byte boundary when bucket % 8 != 0.
 *
 * The scale of a bucket is its mean |x|, summed in a fixed order that
 * every kernel reproduces exactly: 16 double-precision lanes, lane j
 * adding |x[j]|, |x[j+16]|, |x[j+32]|, ... (indices relative to the bucket
 * start) in increasing order, then combined as a fixed tree
 * (lane[j] += lane[j+8], then +4, +2, +1) and divided by the bucket length.
 * Double lanes make the sum exact enough and unable to overflow (2^24 *
 * FLT_MAX is far below DBL_MAX); 16 lanes are four AVX2 or two AVX-512
 * accumulators, enough to hide the add latency. */
#ifndef TERSE_COMPRESS_SIGN_KERNELS_H
#define TERSE_COMPRESS_SIGN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#define TERSE_SIGN_LANES 16

/* Write nb scales and ceil(n / 8) bytes of bits (the kernel zeroes them). */
typedef void (*terse__sign_encode_fn)(const float *x, size_t n, size_t bucket, uint8_t *scales,
                                      uint8_t *bits);
/* dst (+)= (bit ? -(alpha * s) : alpha * s), bucket by bucket. */
typedef void (*terse__sign_decode_fn)(const uint8_t *scales, const uint8_t *bits, size_t n,
                                      size_t bucket, float *dst, float alpha, int accumulate);

void terse__sign_encode_scalar(const float *x, size_t n, size_t bucket, uint8_t *scales,
                               uint8_t *bits);
void terse__sign_decode_scalar(const uint8_t *scales, const uint8_t *bits, size_t n, size_t bucket,
                               float *dst, float alpha, int accumulate);
#if defined(__x86_64__)
void terse__sign_encode_avx2(const float *x, size_t n, size_t bucket, uint8_t *scales,
                             uint8_t *bits);
void terse__sign_decode_avx2(const uint8_t *scales, const uint8_t *bits, size_t n, size_t bucket,
                             float *dst, float alpha, int accumulate);
void terse__sign_encode_avx512(const float *x, size_t n, size_t bucket, uint8_t *scales,
                               uint8_t *bits);
void terse__sign_decode_avx512(const uint8_t *scales, const uint8_t *bits, size_t n, size_t bucket,
                               float *dst, float alpha, int accumulate);
#endif

/* The best kernels this CPU allows (after TERSE_SIMD), chosen once. */
terse__sign_encode_fn terse__sign_encode_kernel(void);
terse__sign_decode_fn terse__sign_decode_kernel(void);

/* Pieces the SIMD kernels share with the reference, so that the parts
 * shorter than a vector go through the very same code. */

/* Elements [i, len) of a bucket starting at tensor index pos: add |x| to
 * lane (element % 16) and OR the sign bits into the (zeroed) bit array. */
void terse__sign_encode_tail(const float *x, size_t i, size_t len, double *lane, uint8_t *bits,
                             size_t pos);
/* The scale of a bucket of len elements from its 16 lanes (which it
 * clobbers): the tree sum / len as fp32; NaN becomes 0x7fc00000. */
float terse__sign_scale(double *lane, size_t len);
/* dst[i] (+)= bit(pos + i) ? -a : a for i in [i0, len). */
void terse__sign_decode_tail(const uint8_t *bits, size_t pos, size_t i0, size_t len, float a,
                             int accumulate, float *dst);

/* OR the nbits (<= 24) low bits of v into the bit array at tensor index
 * pos, touching only the bytes those bits live in. */
static inline void terse__sign_or_bits(uint8_t *bits, size_t pos, uint32_t v, unsigned nbits) {
    uint8_t *p = bits + (pos >> 3);
    unsigned r = (unsigned)(pos & 7);
    uint32_t w = v << r;
    for (unsigned k = 0; k < (r + nbits + 7) >> 3; k++) p[k] |= (uint8_t)(w >> (8 * k));
}

/* The nbits (<= 24) bits at tensor index pos, reading only their bytes. */
static inline uint32_t terse__sign_get_bits(const uint8_t *bits, size_t pos, unsigned nbits) {
    const uint8_t *p = bits + (pos >> 3);
    unsigned r = (unsigned)(pos & 7);
    uint32_t w = 0;
    for (unsigned k = 0; k < (r + nbits + 7) >> 3; k++) w |= (uint32_t)p[k] << (8 * k);
    return (w >> r) & ((1u << nbits) - 1u);
}

#endif
