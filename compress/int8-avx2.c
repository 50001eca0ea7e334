/* int8 kernels for AVX2: bit-identical twins of int8_kernels.c. */
#if defined(__x86_64__)
#include <immintrin.h>

#include "compress/int8_kernels.h"

/* Largest |x| bit pattern: an integer max, so lane order cannot matter. */
static uint32_t absmax_bits(const float *x, size_t len) {
    const __m256i abs = _mm256_set1_epi32(0x7fffffff);
    __m256i m0 = _mm256_setzero_si256(), m1 = m0, m2 = m0, m3 = m0;
    size_t i = 0;
    for (; i + 32 <= len; i += 32) {
        m0 = _mm256_max_epu32(m0, _mm256_and_si256(abs, _mm256_loadu_si256((const void *)(x + i))));
        m1 = _mm256_max_epu32(m1,
                              _mm256_and_si256(abs, _mm256_loadu_si256((const void *)(x + i + 8))));
        m2 = _mm256_max_epu32(
            m2, _mm256_and_si256(abs, _mm256_loadu_si256((const void *)(x + i + 16))));
        m3 = _mm256_max_epu32(
            m3, _mm256_and_si256(abs, _mm256_loadu_si256((const void *)(x + i + 24))));
    }
    for (; i + 8 <= len; i += 8)
        m0 = _mm256_max_epu32(m0, _mm256_and_si256(abs, _mm256_loadu_si256((const void *)(x + i))));
    m0 = _mm256_max_epu32(_mm256_max_epu32(m0, m1), _mm256_max_epu32(m2, m3));
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m0), _mm256_extracti128_si256(m0, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
    uint32_t m = (uint32_t)_mm_cvtsi128_si32(h);
    for (; i < len; i++) {
        uint32_t u;
        memcpy(&u, x + i, 4);
        u &= 0x7fffffffu;
        m = u > m ? u : m;
    }
    return m;
}

/* x / s clamped to [-127, 127] and rounded by cvtps2dq (nearest even). The
 * reference rounds first and clamps the integer; on the range x / s can
 * take (|x / s| <= 254, see int8_kernels.c) the two orders agree. The float
 * clamp also keeps the saturating packs exact. */
static inline __m256i quant8(const float *x, __m256 s) {
    __m256 v = _mm256_div_ps(_mm256_loadu_ps(x), s);
    v = _mm256_max_ps(v, _mm256_set1_ps(-127.0f));
    v = _mm256_min_ps(v, _mm256_set1_ps(127.0f));
    return _mm256_cvtps_epi32(v);
}

static void quantize(const float *x, size_t len, float s, int8_t *q) {
    const __m256 sv = _mm256_set1_ps(s);
    /* packs work within 128-bit lanes: after two rounds the dwords hold
     * a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7; the permute restores
     * element order. */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    size_t i = 0;
    for (; i + 32 <= len; i += 32) {
        __m256i a = quant8(x + i, sv), b = quant8(x + i + 8, sv);
        __m256i c = quant8(x + i + 16, sv), d = quant8(x + i + 24, sv);
        __m256i v = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
        _mm256_storeu_si256((void *)(q + i), _mm256_permutevar8x32_epi32(v, order));
    }
    for (; i + 8 <= len; i += 8) { /* small buckets (B = 8, 9, ...) */
        __m256i a = quant8(x + i, sv);
        __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
        _mm_storel_epi64((void *)(q + i), _mm_packs_epi16(w, w));
    }
    terse__int8_quantize_scalar(x + i, len - i, s, q + i);
}

void terse__int8_encode_avx2(const float *x, size_t n, size_t bucket, uint8_t *scales,
                             int8_t *codes) {
    for (size_t b = 0, i0 = 0; i0 < n; b++, i0 += bucket) {
        size_t len = n - i0 < bucket ? n - i0 : bucket;
        float s = terse__int8_scale(absmax_bits(x + i0, len));
        memcpy(scales + 4 * b, &s, 4);
        if (terse__int8_scale_usable(s))
            quantize(x + i0, len, s, codes + i0);
        else
            memset(codes + i0, 0, len);
    }
}

static inline __m256 dequant8(const int8_t *q, __m256 s, __m256 alpha) {
    __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const void *)q));
    return _mm256_mul_ps(alpha, _mm256_mul_ps(s, _mm256_cvtepi32_ps(w)));
}

static void dequantize(const int8_t *q, size_t len, float s, float alpha, int accumulate,
                       float *dst) {
    const __m256 sv = _mm256_set1_ps(s), av = _mm256_set1_ps(alpha);
    size_t i = 0;
    if (accumulate) {
        for (; i + 8 <= len; i += 8)
            _mm256_storeu_ps(dst + i,
                             _mm256_add_ps(_mm256_loadu_ps(dst + i), dequant8(q + i, sv, av)));
    } else {
        for (; i + 8 <= len; i += 8) _mm256_storeu_ps(dst + i, dequant8(q + i, sv, av));
    }
    terse__int8_dequantize_scalar(q + i, len - i, s, alpha, accumulate, dst + i);
}

void terse__int8_decode_avx2(const uint8_t *scales, const int8_t *codes, size_t n, size_t bucket,
                             float *dst, float alpha, int accumulate) {
    for (size_t b = 0, i0 = 0; i0 < n; b++, i0 += bucket) {
        size_t len = n - i0 < bucket ? n - i0 : bucket;
        float s;
        memcpy(&s, scales + 4 * b, 4);
        dequantize(codes + i0, len, s, alpha, accumulate, dst + i0);
    }
}
#endif
