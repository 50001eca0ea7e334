#include "compress/kernels.h"

#include <string.h>

/* The loop bodies are simple enough that the compiler vectorises them for
 * the baseline ISA (SSE2 / NEON); memcpy keeps unaligned loads legal. */
void terse__kernel_axpy_f32_scalar(float *dst, const uint8_t *src, size_t n, float alpha,
                                   int accumulate) {
    if (!accumulate && alpha == 1.0f) {
        memcpy(dst, src, n * 4);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, src + 4 * i, 4);
        dst[i] = accumulate ? dst[i] + alpha * v : alpha * v;
    }
}

void terse__kernel_axpy_f32(float *dst, const uint8_t *src, size_t n, float alpha, int accumulate) {
    terse__kernel_axpy_f32_scalar(dst, src, n, alpha, accumulate);
}
