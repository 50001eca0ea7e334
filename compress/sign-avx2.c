/* sign kernels for AVX2: bit-identical twins of sign_kernels.c. One pass
 * over the input yields both the sign bits and the |x| sums. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#include "compress/sign_kernels.h"

static inline uint32_t negative_bits(__m256 x) {
    /* _CMP_LT_OQ is false for NaN, like the reference's x < 0. */
    return (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
}

/* One bucket starting at tensor index pos. Accumulator k holds lanes
 * 4k..4k+3, i.e. elements i + 4k .. i + 4k + 3 of each 16-element step,
 * which is the reference's lane = element % 16. */
static float encode_bucket(const float *x, size_t len, uint8_t *bits, size_t pos) {
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 16 <= len; i += 16) {
        __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
        terse__sign_or_bits(bits, pos + i, negative_bits(x0) | negative_bits(x1) << 8, 16);
        x0 = _mm256_and_ps(x0, abs);
        x1 = _mm256_and_ps(x1, abs);
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(x0)));
        a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(x0, 1)));
        a2 = _mm256_add_pd(a2, _mm256_cvtps_pd(_mm256_castps256_ps128(x1)));
        a3 = _mm256_add_pd(a3, _mm256_cvtps_pd(_mm256_extractf128_ps(x1, 1)));
    }
    double lane[TERSE_SIGN_LANES];
    _mm256_storeu_pd(lane, a0);
    _mm256_storeu_pd(lane + 4, a1);
    _mm256_storeu_pd(lane + 8, a2);
    _mm256_storeu_pd(lane + 12, a3);
    terse__sign_encode_tail(x, i, len, lane, bits, pos);
    return terse__sign_scale(lane, len);
}

void terse__sign_encode_avx2(const float *x, size_t n, size_t bucket, uint8_t *scales,
                             uint8_t *bits) {
    memset(bits, 0, (n + 7) / 8);
    for (size_t b = 0, i0 = 0; i0 < n; b++, i0 += bucket) {
        size_t len = n - i0 < bucket ? n - i0 : bucket;
        float s = encode_bucket(x + i0, len, bits, i0);
        memcpy(scales + 4 * b, &s, 4);
    }
}

/* +a where the bit is 0, -a (sign bit flipped) where it is 1. */
static inline __m256 signed_scale(uint32_t m, __m256 a) {
    const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)m), sel), sel);
    __m256i flip = _mm256_and_si256(set, _mm256_set1_epi32((int)0x80000000u));
    return _mm256_xor_ps(a, _mm256_castsi256_ps(flip));
}

static void decode_bucket(const uint8_t *bits, size_t pos, size_t len, float a, int accumulate,
                          float *dst) {
    const __m256 av = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 16 <= len; i += 16) {
        uint32_t m = terse__sign_get_bits(bits, pos + i, 16);
        __m256 v0 = signed_scale(m & 0xff, av), v1 = signed_scale(m >> 8, av);
        if (accumulate) {
            v0 = _mm256_add_ps(_mm256_loadu_ps(dst + i), v0);
            v1 = _mm256_add_ps(_mm256_loadu_ps(dst + i + 8), v1);
        }
        _mm256_storeu_ps(dst + i, v0);
        _mm256_storeu_ps(dst + i + 8, v1);
    }
    terse__sign_decode_tail(bits, pos, i, len, a, accumulate, dst);
}

void terse__sign_decode_avx2(const uint8_t *scales, const uint8_t *bits, size_t n, size_t bucket,
                             float *dst, float alpha, int accumulate) {
    for (size_t b = 0, i0 = 0; i0 < n; b++, i0 += bucket) {
        size_t len = n - i0 < bucket ? n - i0 : bucket;
        float s;
        memcpy(&s, scales + 4 * b, 4);
        decode_bucket(bits, i0, len, alpha * s, accumulate, dst + i0);
    }
}
#endif
