/* vq search kernels: the scalar reference and the run-time choice among it
 * and its SIMD twins (see vq_kernels.h). */
#include "compress/vq_kernels.h"

#include "common/cpu.h"

uint32_t terse__vq_absmax_scalar(const float *s, size_t h) {
    uint32_t m = 0;
    for (size_t k = 0; k < h; k++) {
        uint32_t u = terse__vq_abs_bits(s, k);
        m = u > m ? u : m;
    }
    return m;
}

size_t terse__vq_above_scalar(const float *s, size_t h, uint32_t thr, uint32_t *out) {
    /* Branch free: usually one k of h passes, at an unpredictable place. */
    size_t cnt = 0;
    for (size_t k = 0; k < h; k++) {
        out[cnt] = (uint32_t)k;
        cnt += terse__vq_abs_bits(s, k) >= thr;
    }
    return cnt;
}

typedef struct {
    terse__vq_absmax_fn absmax;
    terse__vq_above_fn above;
} vq_table;

static const vq_table *pick(void) {
    static const vq_table scalar = {terse__vq_absmax_scalar, terse__vq_above_scalar};
#if defined(__x86_64__)
    static const vq_table avx2 = {terse__vq_absmax_avx2, terse__vq_above_avx2};
    static const vq_table avx512 = {terse__vq_absmax_avx512, terse__vq_above_avx512};
    unsigned f = terse__cpu_features();
    if (f & TERSE_CPU_AVX512) return &avx512;
    if (f & TERSE_CPU_AVX2) return &avx2;
#endif
    return &scalar;
}

/* Racing first calls store the same pointer; the atomic makes that legal. */
static const vq_table *table(void) {
    static const vq_table *_Atomic chosen;
    const vq_table *t = chosen;
    if (!t) {
        t = pick();
        chosen = t;
    }
    return t;
}

terse__vq_absmax_fn terse__vq_absmax_kernel(void) { return table()->absmax; }
terse__vq_above_fn terse__vq_above_kernel(void) { return table()->above; }
