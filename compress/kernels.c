#include "compress/kernels.h"

#include <string.h>

#include "common/cpu.h"

/* The loop bodies are simple enough that the compiler vectorises them for
 * the baseline ISA (SSE2 / NEON); memcpy keeps unaligned loads legal. The
 * product and the sum are separate statements so no compiler contracts
 * them into an FMA (clang's -ffp-contract=on fuses within one expression):
 * every version computes alpha * v, rounds, then adds. */
void terse__kernel_axpy_f32_scalar(float *dst, const uint8_t *src, size_t n, float alpha,
                                   int accumulate) {
    if (!accumulate && alpha == 1.0f) {
        memcpy(dst, src, n * 4);
        return;
    }
    if (accumulate) {
        for (size_t i = 0; i < n; i++) {
            float v;
            memcpy(&v, src + 4 * i, 4);
            float p = alpha * v;
            dst[i] = dst[i] + p;
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float v;
            memcpy(&v, src + 4 * i, 4);
            dst[i] = alpha * v;
        }
    }
}

typedef void axpy_fn(float *dst, const uint8_t *src, size_t n, float alpha, int accumulate);

/* Racing first calls pick the same function; the pointer store is atomic. */
void terse__kernel_axpy_f32(float *dst, const uint8_t *src, size_t n, float alpha, int accumulate) {
    static axpy_fn *_Atomic chosen; /* NULL until the first call */
    axpy_fn *f = chosen;
    if (!f) {
        f = terse__kernel_axpy_f32_scalar;
#if defined(__x86_64__)
        if (terse__cpu_features() & TERSE_CPU_AVX2) f = terse__kernel_axpy_f32_avx2;
#endif
        chosen = f;
    }
    f(dst, src, n, alpha, accumulate);
}
