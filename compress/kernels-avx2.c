/* AVX2 versions of the shared dense kernels (compress/kernels.h). */
#if defined(__x86_64__)

#include <immintrin.h>
#include <string.h>

#include "compress/kernels.h"

/* Bit-identical to the scalar reference: the same memcpy shortcut (which
 * keeps signalling NaNs as they are), and mul then add as two instructions,
 * never an FMA. */
void terse__kernel_axpy_f32_avx2(float *dst, const uint8_t *src, size_t n, float alpha,
                                 int accumulate) {
    if (!accumulate && alpha == 1.0f) {
        memcpy(dst, src, n * 4);
        return;
    }
    const __m256 va = _mm256_set1_ps(alpha);
    const float *s = (const float *)(const void *)src; /* loadu: any alignment */
    size_t i = 0;
    if (accumulate) {
        for (; i + 16 <= n; i += 16) {
            __m256 p0 = _mm256_mul_ps(va, _mm256_loadu_ps(s + i));
            __m256 p1 = _mm256_mul_ps(va, _mm256_loadu_ps(s + i + 8));
            _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), p0));
            _mm256_storeu_ps(dst + i + 8, _mm256_add_ps(_mm256_loadu_ps(dst + i + 8), p1));
        }
    } else {
        for (; i + 16 <= n; i += 16) {
            _mm256_storeu_ps(dst + i, _mm256_mul_ps(va, _mm256_loadu_ps(s + i)));
            _mm256_storeu_ps(dst + i + 8, _mm256_mul_ps(va, _mm256_loadu_ps(s + i + 8)));
        }
    }
    terse__kernel_axpy_f32_scalar(dst + i, src + 4 * i, n - i, alpha, accumulate);
}

#endif
