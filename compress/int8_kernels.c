/* int8 kernels: the scalar reference that defines every bit of the int8
 * payload and of its decoding, and the run-time choice among it and its
 * SIMD twins. */
#include "compress/int8_kernels.h"

#include "common/cpu.h"

/* Adding and subtracting 1.5 * 2^23 rounds a float of magnitude < 2^22 to
 * an integer in the current rounding mode (nearest-even by default), which
 * is exactly what cvtps2dq does in the SIMD kernels. lrintf would do too,
 * but compilers call libm for it on baseline x86-64. */
static const float rne_magic = 12582912.0f;

/* Callers pass the bucket's own scale s = terse__int8_scale(max|x|) > 0,
 * so |x / s| <= 254: a normal s is within 2^-22 of max/127, and a
 * subnormal one is at least half of max/127 (rounding to the nearest
 * multiple of 2^-149 of a value >= 2^-150 that does not round to 0). The
 * conversion to int is therefore always in range, and the clamp to
 * [-127, 127] can be done on integers, which compilers vectorize (a float
 * clamp is what the SIMD kernels do; both agree on that range). */
void terse__int8_quantize_scalar(const float *x, size_t len, float s, int8_t *q) {
    for (size_t i = 0; i < len; i++) {
        float v = x[i] / s; /* x / s, not x * (1 / s): the rounding the contract names */
        float r = v + rne_magic;
        r = r - rne_magic;
        int k = (int)r;
        k = k < -127 ? -127 : k;
        k = k > 127 ? 127 : k;
        q[i] = (int8_t)k;
    }
}

void terse__int8_dequantize_scalar(const int8_t *q, size_t len, float s, float alpha,
                                   int accumulate, float *dst) {
    /* One operation per statement: the SIMD kernels do s*q, then alpha*that,
     * then the add, and no compiler may fuse any two of them (an FMA would
     * round differently). */
    if (accumulate) {
        for (size_t i = 0; i < len; i++) {
            float t = s * (float)q[i];
            t = alpha * t;
            dst[i] = dst[i] + t;
        }
    } else {
        for (size_t i = 0; i < len; i++) {
            float t = s * (float)q[i];
            dst[i] = alpha * t;
        }
    }
}

void terse__int8_encode_scalar(const float *x, size_t n, size_t bucket, uint8_t *scales,
                               int8_t *codes) {
    for (size_t b = 0, i0 = 0; i0 < n; b++, i0 += bucket) {
        size_t len = n - i0 < bucket ? n - i0 : bucket;
        uint32_t m = 0;
        for (size_t i = 0; i < len; i++) {
            uint32_t u;
            memcpy(&u, x + i0 + i, 4);
            u &= 0x7fffffffu;
            m = u > m ? u : m;
        }
        float s = terse__int8_scale(m);
        memcpy(scales + 4 * b, &s, 4); /* host is little endian (common/bytes.h) */
        if (terse__int8_scale_usable(s))
            terse__int8_quantize_scalar(x + i0, len, s, codes + i0);
        else
            memset(codes + i0, 0, len);
    }
}

void terse__int8_decode_scalar(const uint8_t *scales, const int8_t *codes, size_t n, size_t bucket,
                               float *dst, float alpha, int accumulate) {
    for (size_t b = 0, i0 = 0; i0 < n; b++, i0 += bucket) {
        size_t len = n - i0 < bucket ? n - i0 : bucket;
        float s;
        memcpy(&s, scales + 4 * b, 4);
        terse__int8_dequantize_scalar(codes + i0, len, s, alpha, accumulate, dst + i0);
    }
}

typedef struct {
    terse__int8_encode_fn encode;
    terse__int8_decode_fn decode;
} int8_table;

static const int8_table *pick(void) {
    static const int8_table scalar = {terse__int8_encode_scalar, terse__int8_decode_scalar};
#if defined(__x86_64__)
    static const int8_table avx2 = {terse__int8_encode_avx2, terse__int8_decode_avx2};
    static const int8_table avx512 = {terse__int8_encode_avx512, terse__int8_decode_avx512};
    unsigned f = terse__cpu_features();
    if (f & TERSE_CPU_AVX512) return &avx512;
    if (f & TERSE_CPU_AVX2) return &avx2;
#endif
    return &scalar;
}

/* Racing first calls store the same pointer; the atomic makes that legal. */
static const int8_table *table(void) {
    static const int8_table *_Atomic chosen;
    const int8_table *t = chosen;
    if (!t) {
        t = pick();
        chosen = t;
    }
    return t;
}

terse__int8_encode_fn terse__int8_encode_kernel(void) { return table()->encode; }
terse__int8_decode_fn terse__int8_decode_kernel(void) { return table()->decode; }
