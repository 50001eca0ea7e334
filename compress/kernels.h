/* Shared dense kernels used by several codecs. Each has a scalar reference
 * (the _scalar name) and is dispatched at run time (common/cpu.h). */
#ifndef TERSE_COMPRESS_KERNELS_H
#define TERSE_COMPRESS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* dst (+)= alpha * src, src being n little-endian fp32 at any alignment. */
void terse__kernel_axpy_f32(float *dst, const uint8_t *src, size_t n, float alpha, int accumulate);
void terse__kernel_axpy_f32_scalar(float *dst, const uint8_t *src, size_t n, float alpha,
                                   int accumulate);
#if defined(__x86_64__)
void terse__kernel_axpy_f32_avx2(float *dst, const uint8_t *src, size_t n, float alpha,
                                 int accumulate);
#endif

#endif
