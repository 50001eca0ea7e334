/* vq search kernels for AVX2: bit-identical twins of vq_kernels.c (integer
 * max and compare of sign-cleared bit patterns). */
#if defined(__x86_64__)
#include <immintrin.h>

#include "compress/vq_kernels.h"

uint32_t terse__vq_absmax_avx2(const float *s, size_t h) {
    const __m256i mag = _mm256_set1_epi32(0x7fffffff);
    __m256i m0 = _mm256_setzero_si256(), m1 = m0;
    size_t k = 0;
    for (; k + 16 <= h; k += 16) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + k));
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + k + 8));
        m0 = _mm256_max_epu32(m0, _mm256_and_si256(a, mag));
        m1 = _mm256_max_epu32(m1, _mm256_and_si256(b, mag));
    }
    m0 = _mm256_max_epu32(m0, m1);
    __m128i q = _mm_max_epu32(_mm256_castsi256_si128(m0), _mm256_extracti128_si256(m0, 1));
    q = _mm_max_epu32(q, _mm_shuffle_epi32(q, _MM_SHUFFLE(1, 0, 3, 2)));
    q = _mm_max_epu32(q, _mm_shuffle_epi32(q, _MM_SHUFFLE(2, 3, 0, 1)));
    uint32_t m = (uint32_t)_mm_cvtsi128_si32(q);
    uint32_t t = terse__vq_absmax_scalar(s + k, h - k);
    return t > m ? t : m;
}

size_t terse__vq_above_avx2(const float *s, size_t h, uint32_t thr, uint32_t *out) {
    /* Sign-cleared patterns are non-negative as int32, so a signed compare
     * is the unsigned one; thr above INT32_MAX matches nothing. */
    if (thr > 0x7fffffffu) return 0;
    const __m256i mag = _mm256_set1_epi32(0x7fffffff);
    const __m256i below = _mm256_set1_epi32((int)thr - 1);
    size_t cnt = 0, k = 0;
    for (; k + 8 <= h; k += 8) {
        __m256i a = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(s + k)), mag);
        __m256i pass = _mm256_cmpgt_epi32(a, below);
        unsigned bits = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(pass));
        while (bits) {
            out[cnt++] = (uint32_t)k + (uint32_t)__builtin_ctz(bits);
            bits &= bits - 1;
        }
    }
    for (; k < h; k++) {
        out[cnt] = (uint32_t)k;
        cnt += terse__vq_abs_bits(s, k) >= thr;
    }
    return cnt;
}
#endif
