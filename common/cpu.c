#include "common/cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* clang 14's __builtin_cpu_supports does not know "f16c": read CPUID.1:ECX
 * bit 29 directly (the AVX check below already covers OS support for ymm). */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

static unsigned detect(void) {
    unsigned f = 0;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) f |= TERSE_CPU_SSE42;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        has_f16c())
        f |= TERSE_CPU_AVX2;
    if ((f & TERSE_CPU_AVX2) && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
        f |= TERSE_CPU_AVX512;
#endif
    /* The environment may only take features away, never add them. */
    const char *cap = getenv("TERSE_SIMD");
    if (cap && *cap) {
        if (strcmp(cap, "scalar") == 0)
            f &= TERSE_CPU_SSE42;
        else if (strcmp(cap, "avx2") == 0)
            f &= ~(unsigned)TERSE_CPU_AVX512;
        else /* codecs cannot fail over this; terse_comm_init refuses it */
            fprintf(stderr, "terse: TERSE_SIMD='%.40s' is neither 'scalar' nor 'avx2'; "
                            "ignored\n", cap);
    }
    return f;
}

unsigned terse__cpu_features(void) {
    /* Racing first calls compute the same value; the store is atomic. */
    static _Atomic unsigned cached = 0x80000000u;
    unsigned v = cached;
    if (v == 0x80000000u) {
        v = detect();
        cached = v;
    }
    return v;
}

const char *terse__cpu_level_name(void) {
    unsigned f = terse__cpu_features();
    if (f & TERSE_CPU_AVX512) return "avx512";
    if (f & TERSE_CPU_AVX2) return "avx2";
    return "scalar";
}
