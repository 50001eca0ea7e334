/* Kernels of the vq codec's codeword search (compress/vq.c): a scalar
 * reference in vq_kernels.c and SIMD twins in vq-avx2.c / vq-avx512.c.
 *
 * Both work on one block's row of h fp32 scores from the sgemm and compare
 * |score| as integers: the IEEE bit pattern with the sign bit cleared orders
 * exactly like |score| for every non-NaN value (and puts NaN above Inf), and
 * integer max and compare give the same answer in any order, so the twins
 * are bit-identical to the reference by construction. */
#ifndef TERSE_COMPRESS_VQ_KERNELS_H
#define TERSE_COMPRESS_VQ_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The largest |s_k| of s[0..h), as its bit pattern with the sign cleared. */
typedef uint32_t (*terse__vq_absmax_fn)(const float *s, size_t h);
/* The k with (bits of |s_k|) >= thr, in increasing order, written to out;
 * returns how many. out has room for h + 16 entries (kernels may store
 * whole vectors past the count). */
typedef size_t (*terse__vq_above_fn)(const float *s, size_t h, uint32_t thr, uint32_t *out);

uint32_t terse__vq_absmax_scalar(const float *s, size_t h);
size_t terse__vq_above_scalar(const float *s, size_t h, uint32_t thr, uint32_t *out);
#if defined(__x86_64__)
uint32_t terse__vq_absmax_avx2(const float *s, size_t h);
size_t terse__vq_above_avx2(const float *s, size_t h, uint32_t thr, uint32_t *out);
uint32_t terse__vq_absmax_avx512(const float *s, size_t h);
size_t terse__vq_above_avx512(const float *s, size_t h, uint32_t thr, uint32_t *out);
#endif

/* The best kernels this CPU allows (after TERSE_SIMD), chosen once. */
terse__vq_absmax_fn terse__vq_absmax_kernel(void);
terse__vq_above_fn terse__vq_above_kernel(void);

static inline uint32_t terse__vq_abs_bits(const float *s, size_t k) {
    uint32_t u;
    memcpy(&u, s + k, 4);
    return u & 0x7fffffffu;
}

#endif
