/* Run-time CPU feature detection for SIMD dispatch.
 *
 * Kernels are written as a scalar reference plus sibling files compiled for
 * one instruction set each (name-avx2.c, name-avx512.c). At first use a
 * kernel table picks the best version this CPU supports. TERSE_SIMD=scalar,
 * avx2 or avx512 caps the choice (for tests and comparisons). */
#ifndef TERSE_COMMON_CPU_H
#define TERSE_COMMON_CPU_H

enum {
    TERSE_CPU_SSE42 = 1u << 0,  /* crc32 instruction */
    TERSE_CPU_AVX2 = 1u << 1,   /* AVX2 + FMA + F16C */
    TERSE_CPU_AVX512 = 1u << 2, /* AVX-512 F, BW, DQ, VL */
};

/* Features of this CPU, after the TERSE_SIMD cap. Cached; thread safe. */
unsigned terse__cpu_features(void);

/* "avx512", "avx2" or "scalar": the widest level terse__cpu_features allows. */
const char *terse__cpu_level_name(void);

#endif
