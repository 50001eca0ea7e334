/* int8 kernels for AVX-512 (F, BW, VL): bit-identical twins of
 * int8_kernels.c, 16 elements per instruction. */
#if defined(__x86_64__)
#include <immintrin.h>

#include "compress/int8_kernels.h"

static uint32_t absmax_bits(const float *x, size_t len) {
    const __m512i abs = _mm512_set1_epi32(0x7fffffff);
    __m512i m0 = _mm512_setzero_si512(), m1 = m0;
    size_t i = 0;
    for (; i + 32 <= len; i += 32) {
        m0 = _mm512_max_epu32(m0, _mm512_and_si512(abs, _mm512_loadu_si512(x + i)));
        m1 = _mm512_max_epu32(m1, _mm512_and_si512(abs, _mm512_loadu_si512(x + i + 16)));
    }
    if (i + 16 <= len) {
        m0 = _mm512_max_epu32(m0, _mm512_and_si512(abs, _mm512_loadu_si512(x + i)));
        i += 16;
    }
    /* The rest through a masked load: absent lanes read as 0, which never
     * wins a max of non-negative patterns. */
    __mmask16 k = (__mmask16)((1u << (len - i)) - 1u);
    m1 = _mm512_max_epu32(m1, _mm512_and_si512(abs, _mm512_maskz_loadu_epi32(k, x + i)));
    return (uint32_t)_mm512_reduce_max_epu32(_mm512_max_epu32(m0, m1));
}

static inline __m512i quant16(__m512 x, __m512 s) {
    __m512 v = _mm512_div_ps(x, s);
    v = _mm512_max_ps(v, _mm512_set1_ps(-127.0f));
    v = _mm512_min_ps(v, _mm512_set1_ps(127.0f));
    /* Nearest even; clamping before rounding agrees with the reference's
     * round-then-clamp on the range x / s can take (int8_kernels.c). */
    return _mm512_cvtps_epi32(v);
}

static void quantize(const float *x, size_t len, float s, int8_t *q) {
    const __m512 sv = _mm512_set1_ps(s);
    size_t i = 0;
    for (; i + 16 <= len; i += 16)
        _mm_storeu_si128((void *)(q + i),
                         _mm512_cvtepi32_epi8(quant16(_mm512_loadu_ps(x + i), sv)));
    if (i < len) {
        __mmask16 k = (__mmask16)((1u << (len - i)) - 1u);
        __m512i v = quant16(_mm512_maskz_loadu_ps(k, x + i), sv);
        _mm_mask_storeu_epi8(q + i, k, _mm512_cvtepi32_epi8(v));
    }
}

void terse__int8_encode_avx512(const float *x, size_t n, size_t bucket, uint8_t *scales,
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

static inline __m512 dequant16(__m128i q8, __m512 s, __m512 alpha) {
    __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q8));
    return _mm512_mul_ps(alpha, _mm512_mul_ps(s, v));
}

static void dequantize(const int8_t *q, size_t len, float s, float alpha, int accumulate,
                       float *dst) {
    const __m512 sv = _mm512_set1_ps(s), av = _mm512_set1_ps(alpha);
    size_t i = 0;
    if (accumulate) {
        for (; i + 16 <= len; i += 16) {
            __m512 t = dequant16(_mm_loadu_si128((const void *)(q + i)), sv, av);
            _mm512_storeu_ps(dst + i, _mm512_add_ps(_mm512_loadu_ps(dst + i), t));
        }
    } else {
        for (; i + 16 <= len; i += 16)
            _mm512_storeu_ps(dst + i, dequant16(_mm_loadu_si128((const void *)(q + i)), sv, av));
    }
    if (i < len) {
        __mmask16 k = (__mmask16)((1u << (len - i)) - 1u);
        __m512 t = dequant16(_mm_maskz_loadu_epi8(k, q + i), sv, av);
        if (accumulate) t = _mm512_add_ps(_mm512_maskz_loadu_ps(k, dst + i), t);
        _mm512_mask_storeu_ps(dst + i, k, t);
    }
}

void terse__int8_decode_avx512(const uint8_t *scales, const int8_t *codes, size_t n, size_t bucket,
                               float *dst, float alpha, int accumulate) {
    for (size_t b = 0, i0 = 0; i0 < n; b++, i0 += bucket) {
        size_t len = n - i0 < bucket ? n - i0 : bucket;
        float s;
        memcpy(&s, scales + 4 * b, 4);
        dequantize(codes + i0, len, s, alpha, accumulate, dst + i0);
    }
}
#endif
