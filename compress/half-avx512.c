/* AVX-512 half-precision decoders: the AVX2 ones at twice the width
 * (contract in compress/half_kernels.h). Tails go to the scalar reference.
 *
 * There are no AVX-512 encoders on purpose. Measured on Zen 4 (16M floats,
 * 64-byte aligned): 512-bit vcvtps2ph encodes at ~15 GB/s against ~21 for
 * the AVX2 version, and a 512-bit bf16 encoder was no faster than AVX2,
 * while these decoders are ~15-40% faster than AVX2 when the data is in
 * cache and equal from DRAM. (Any bf16 encoder here must avoid
 * AVX512_BF16's vcvtneps2bf16: it flushes subnormal inputs to zero.) */
#if defined(__x86_64__)

#include <immintrin.h>

#include "compress/half_kernels.h"

/* Sixteen 16-bit values at any alignment. */
static __m256i load16_u16(const uint8_t *p) {
    return _mm256_loadu_si256((const __m256i *)(const void *)p);
}

/* mul then add as two instructions: never an FMA, to match the reference. */
void terse__fp16_decode_avx512(float *dst, const uint8_t *src, size_t n, float alpha,
                               int accumulate) {
    const __m512 va = _mm512_set1_ps(alpha);
    size_t i = 0;
    if (accumulate) {
        for (; i + 16 <= n; i += 16) {
            __m512 h = _mm512_cvtph_ps(load16_u16(src + 2 * i));
            __m512 p = _mm512_mul_ps(va, h);
            _mm512_storeu_ps(dst + i, _mm512_add_ps(_mm512_loadu_ps(dst + i), p));
        }
    } else {
        for (; i + 16 <= n; i += 16) {
            __m512 h = _mm512_cvtph_ps(load16_u16(src + 2 * i));
            _mm512_storeu_ps(dst + i, _mm512_mul_ps(va, h));
        }
    }
    terse__fp16_decode_scalar(dst + i, src + 2 * i, n - i, alpha, accumulate);
}

void terse__bf16_decode_avx512(float *dst, const uint8_t *src, size_t n, float alpha,
                               int accumulate) {
    const __m512 va = _mm512_set1_ps(alpha);
    size_t i = 0;
    if (accumulate) {
        for (; i + 16 <= n; i += 16) {
            __m512i w = _mm512_cvtepu16_epi32(load16_u16(src + 2 * i));
            __m512 h = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
            __m512 p = _mm512_mul_ps(va, h);
            _mm512_storeu_ps(dst + i, _mm512_add_ps(_mm512_loadu_ps(dst + i), p));
        }
    } else {
        for (; i + 16 <= n; i += 16) {
            __m512i w = _mm512_cvtepu16_epi32(load16_u16(src + 2 * i));
            __m512 h = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
            _mm512_storeu_ps(dst + i, _mm512_mul_ps(va, h));
        }
    }
    terse__bf16_decode_scalar(dst + i, src + 2 * i, n - i, alpha, accumulate);
}

#endif
