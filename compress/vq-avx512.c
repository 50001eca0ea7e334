/* vq search kernels for AVX-512 (F): bit-identical twins of vq_kernels.c
 * (integer max and compare of sign-cleared bit patterns). Masked loads
 * take the tail, so there is no scalar remainder. */
#if defined(__x86_64__)
#include <immintrin.h>

#include "compress/vq_kernels.h"

static __mmask16 tail_mask(size_t left) {
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

uint32_t terse__vq_absmax_avx512(const float *s, size_t h) {
    const __m512i mag = _mm512_set1_epi32(0x7fffffff);
    __m512i m0 = _mm512_setzero_si512(), m1 = m0;
    size_t k = 0;
    for (; k + 32 <= h; k += 32) {
        m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_si512(s + k), mag));
        m1 = _mm512_max_epu32(m1, _mm512_and_si512(_mm512_loadu_si512(s + k + 16), mag));
    }
    for (; k < h; k += 16) { /* masked-off lanes load as 0, the identity of max */
        __m512i a = _mm512_maskz_loadu_epi32(tail_mask(h - k), s + k);
        m0 = _mm512_max_epu32(m0, _mm512_and_si512(a, mag));
    }
    return (uint32_t)_mm512_reduce_max_epu32(_mm512_max_epu32(m0, m1));
}

/* Branch free: the passing indices are compressed into a register and
 * stored whole (hence out's 16 spare entries); cnt advances by their count. */
size_t terse__vq_above_avx512(const float *s, size_t h, uint32_t thr, uint32_t *out) {
    const __m512i mag = _mm512_set1_epi32(0x7fffffff);
    const __m512i t = _mm512_set1_epi32((int)thr);
    const __m512i sixteen = _mm512_set1_epi32(16);
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    size_t cnt = 0;
    for (size_t k = 0; k < h; k += 16) {
        __mmask16 live = tail_mask(h - k);
        __m512i a = _mm512_and_si512(_mm512_maskz_loadu_epi32(live, s + k), mag);
        __mmask16 pass = _mm512_mask_cmpge_epu32_mask(live, a, t);
        _mm512_storeu_si512(out + cnt, _mm512_maskz_compress_epi32(pass, idx));
        cnt += (size_t)__builtin_popcount(pass);
        idx = _mm512_add_epi32(idx, sixteen);
    }
    return cnt;
}
#endif
