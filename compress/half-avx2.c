/* AVX2 + F16C half-precision kernels (contract in compress/half_kernels.h).
 *
 * fp16 uses F16C, which matches the scalar reference bit for bit: with an
 * explicit round-to-nearest immediate vcvtps2ph ignores MXCSR.RC, handles
 * subnormals exactly, and turns NaN into sign | 0x7e00 | top payload bits;
 * vcvtph2ps is exact and quiets signalling NaNs (checked against the
 * reference over all 2^32 floats and all 2^16 halves). bf16 rounds with integer
 * ops (add 0x7fff + lsb), as the reference does. Tails go to the scalar
 * reference, which computes the same bits. */
#if defined(__x86_64__)

#include <immintrin.h>

#include "compress/half_kernels.h"

#define F16C_RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* Eight 16-bit values at any alignment. */
static __m128i load8_u16(const uint8_t *p) {
    return _mm_loadu_si128((const __m128i *)(const void *)p);
}

void terse__fp16_encode_avx2(uint8_t *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i a = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), F16C_RNE);
        __m128i b = _mm256_cvtps_ph(_mm256_loadu_ps(src + i + 8), F16C_RNE);
        _mm_storeu_si128((__m128i *)(void *)(dst + 2 * i), a);
        _mm_storeu_si128((__m128i *)(void *)(dst + 2 * i + 16), b);
    }
    terse__fp16_encode_scalar(dst + 2 * i, src + i, n - i);
}

/* mul then add as two instructions: never an FMA, to match the reference. */
void terse__fp16_decode_avx2(float *dst, const uint8_t *src, size_t n, float alpha,
                             int accumulate) {
    const __m256 va = _mm256_set1_ps(alpha);
    size_t i = 0;
    if (accumulate) {
        for (; i + 8 <= n; i += 8) {
            __m256 h = _mm256_cvtph_ps(load8_u16(src + 2 * i));
            __m256 p = _mm256_mul_ps(va, h);
            _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), p));
        }
    } else {
        for (; i + 8 <= n; i += 8) {
            __m256 h = _mm256_cvtph_ps(load8_u16(src + 2 * i));
            _mm256_storeu_ps(dst + i, _mm256_mul_ps(va, h));
        }
    }
    terse__fp16_decode_scalar(dst + i, src + 2 * i, n - i, alpha, accumulate);
}

/* Eight floats to eight rounded bf16 values, one per 32-bit lane (low half). */
static __m256i bf16_round8(__m256i x) {
    const __m256i one = _mm256_set1_epi32(1);
    const __m256i bias = _mm256_set1_epi32(0x7fff);
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    const __m256i inf = _mm256_set1_epi32(0x7f800000);
    const __m256i quiet = _mm256_set1_epi32(0x00400000);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
    __m256i rounded = _mm256_add_epi32(x, _mm256_add_epi32(bias, lsb));
    /* |x| and Inf are below 2^31, so the signed compare is exact. */
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
    __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(x, quiet), nan);
    return _mm256_srli_epi32(r, 16);
}

void terse__bf16_encode_avx2(uint8_t *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = bf16_round8(_mm256_loadu_si256((const __m256i *)(const void *)(src + i)));
        __m256i b = bf16_round8(_mm256_loadu_si256((const __m256i *)(const void *)(src + i + 8)));
        /* Values fit 16 bits, so unsigned saturation is a plain narrowing;
         * packus works per 128-bit lane, the permute restores the order. */
        __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
        _mm256_storeu_si256((__m256i *)(void *)(dst + 2 * i), packed);
    }
    terse__bf16_encode_scalar(dst + 2 * i, src + i, n - i);
}

void terse__bf16_decode_avx2(float *dst, const uint8_t *src, size_t n, float alpha,
                             int accumulate) {
    const __m256 va = _mm256_set1_ps(alpha);
    size_t i = 0;
    if (accumulate) {
        for (; i + 8 <= n; i += 8) {
            __m256i w = _mm256_cvtepu16_epi32(load8_u16(src + 2 * i));
            __m256 h = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
            __m256 p = _mm256_mul_ps(va, h);
            _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), p));
        }
    } else {
        for (; i + 8 <= n; i += 8) {
            __m256i w = _mm256_cvtepu16_epi32(load8_u16(src + 2 * i));
            __m256 h = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
            _mm256_storeu_ps(dst + i, _mm256_mul_ps(va, h));
        }
    }
    terse__bf16_decode_scalar(dst + i, src + 2 * i, n - i, alpha, accumulate);
}

#endif
