/* sign kernels for AVX-512 (F, DQ, VL): bit-identical twins of
 * sign_kernels.c. Compare-into-mask gives 16 sign bits per instruction and
 * a mask blend expands them back. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#include "compress/sign_kernels.h"

/* Accumulator k holds lanes 8k..8k+7, i.e. elements i + 8k .. i + 8k + 7
 * of each 16-element step: the reference's lane = element % 16. */
static float encode_bucket(const float *x, size_t len, uint8_t *bits, size_t pos) {
    __m512d a0 = _mm512_setzero_pd(), a1 = a0;
    size_t i = 0;
    for (; i + 16 <= len; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        /* _CMP_LT_OQ is false for NaN, like the reference's x < 0. */
        __mmask16 neg = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ);
        terse__sign_or_bits(bits, pos + i, neg, 16);
        v = _mm512_abs_ps(v);
        a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
        a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)));
    }
    double lane[TERSE_SIGN_LANES];
    _mm512_storeu_pd(lane, a0);
    _mm512_storeu_pd(lane + 8, a1);
    terse__sign_encode_tail(x, i, len, lane, bits, pos);
    return terse__sign_scale(lane, len);
}

void terse__sign_encode_avx512(const float *x, size_t n, size_t bucket, uint8_t *scales,
                               uint8_t *bits) {
    memset(bits, 0, (n + 7) / 8);
    for (size_t b = 0, i0 = 0; i0 < n; b++, i0 += bucket) {
        size_t len = n - i0 < bucket ? n - i0 : bucket;
        float s = encode_bucket(x + i0, len, bits, i0);
        memcpy(scales + 4 * b, &s, 4);
    }
}

static void decode_bucket(const uint8_t *bits, size_t pos, size_t len, float a, int accumulate,
                          float *dst) {
    const __m512 pa = _mm512_set1_ps(a);
    /* -a by flipping the sign bit, exactly as the reference's -a. */
    const __m512 na = _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(pa), _mm512_set1_epi32((int)0x80000000u)));
    size_t i = 0;
    for (; i + 16 <= len; i += 16) {
        __mmask16 m = (__mmask16)terse__sign_get_bits(bits, pos + i, 16);
        __m512 v = _mm512_mask_blend_ps(m, pa, na);
        if (accumulate) v = _mm512_add_ps(_mm512_loadu_ps(dst + i), v);
        _mm512_storeu_ps(dst + i, v);
    }
    terse__sign_decode_tail(bits, pos, i, len, a, accumulate, dst);
}

void terse__sign_decode_avx512(const uint8_t *scales, const uint8_t *bits, size_t n, size_t bucket,
                               float *dst, float alpha, int accumulate) {
    for (size_t b = 0, i0 = 0; i0 < n; b++, i0 += bucket) {
        size_t len = n - i0 < bucket ? n - i0 : bucket;
        float s;
        memcpy(&s, scales + 4 * b, 4);
        decode_bucket(bits, i0, len, alpha * s, accumulate, dst + i0);
    }
}
#endif
