/* Scalar reference of the stochastic-quantization kernels, and the run-time
 * choice among them. The SIMD versions must match these bit for bit, so
 * every expression here is the contract (see squant_kernels.h). */
#include "compress/squant_kernels.h"

#include <string.h>

#include "common/cpu.h"
#include "common/rng.h"

/* a*b+c must stay two roundings on every target (clang contracts by
 * default, and aarch64 has scalar FMA); GCC in ISO mode already does this. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

double terse__squant_sumsq_scalar(const float *x, size_t n) {
    double acc[16] = {0};
    for (size_t j = 0; j < n; j++) {
        double d = (double)x[j];
        acc[j & 15] += d * d;
    }
    double b[8], c[4];
    for (int k = 0; k < 8; k++) b[k] = acc[k] + acc[k + 8];
    for (int k = 0; k < 4; k++) c[k] = b[k] + b[k + 4];
    return (c[0] + c[2]) + (c[1] + c[3]);
}

uint32_t terse__squant_absmax_scalar(const float *x, size_t n) {
    uint32_t m = 0;
    for (size_t j = 0; j < n; j++) {
        uint32_t b;
        memcpy(&b, &x[j], 4);
        b &= 0x7fffffffu;
        m = b > m ? b : m;
    }
    return m;
}

static inline unsigned code_of(float x, float scale, int L, float Lf, float r) {
    uint32_t xb;
    memcpy(&xb, &x, 4);
    float ax;
    uint32_t ab = xb & 0x7fffffffu;
    memcpy(&ax, &ab, 4);
    float u = (ax / scale) * Lf;
    u = u < Lf ? u : Lf; /* NaN -> Lf, as MINPS does */
    int f = (int)u;      /* u in [0, L]: truncation is floor, and defined */
    float frac = u - (float)f;
    int l = f + (r < frac);
    if (xb >> 31) l = -l;
    return (unsigned)(l + L);
}

/* One loop for both modes; `nearest` is a constant at each call below, so
 * the nearest loop computes no draws. */
static inline void encode_body(const float *x, size_t n, float scale, unsigned bits,
                               uint32_t subkey, int nearest, uint8_t *out) {
    const int L = (1 << (bits - 1)) - 1;
    const float Lf = (float)L;
    uint64_t acc = 0;
    unsigned have = 0;
    size_t o = 0;
    for (size_t j = 0; j < n; j++) {
        float r = nearest ? TERSE__SQUANT_NEAREST_DRAW
                          : terse__rng_unit(terse__rng_u32(subkey, (uint32_t)j));
        acc |= (uint64_t)code_of(x[j], scale, L, Lf, r) << have;
        have += bits;
        while (have >= 8) {
            out[o++] = (uint8_t)acc;
            acc >>= 8;
            have -= 8;
        }
    }
    if (have) out[o] = (uint8_t)acc;
}

void terse__squant_encode_scalar(const float *x, size_t n, float scale, unsigned bits,
                                 uint32_t subkey, int nearest, uint8_t *out) {
    if (nearest)
        encode_body(x, n, scale, bits, 0, 1, out);
    else
        encode_body(x, n, scale, bits, subkey, 0, out);
}

int terse__squant_decode_scalar(const uint8_t *in, size_t n, unsigned bits, float step,
                                float alpha, int accumulate, float *dst) {
    const int L = (1 << (bits - 1)) - 1;
    const unsigned mask = (1u << bits) - 1;
    uint64_t acc = 0;
    unsigned have = 0, bad = 0;
    size_t o = 0;
    for (size_t j = 0; j < n; j++) {
        while (have < bits) {
            acc |= (uint64_t)in[o++] << have;
            have += 8;
        }
        unsigned c = (unsigned)acc & mask;
        acc >>= bits;
        have -= bits;
        bad |= c == mask;
        float v = alpha * (step * (float)((int)c - L));
        dst[j] = accumulate ? dst[j] + v : v;
    }
    return (int)bad;
}

static const terse__squant_kernels scalar_kernels = {
    "scalar", terse__squant_sumsq_scalar, terse__squant_absmax_scalar,
    terse__squant_encode_scalar, terse__squant_decode_scalar,
};
#if defined(__x86_64__)
static const terse__squant_kernels avx2_kernels = {
    "avx2", terse__squant_sumsq_avx2, terse__squant_absmax_avx2, terse__squant_encode_avx2,
    terse__squant_decode_avx2,
};
static const terse__squant_kernels avx512_kernels = {
    "avx512", terse__squant_sumsq_avx512, terse__squant_absmax_avx512,
    terse__squant_encode_avx512, terse__squant_decode_avx512,
};
#endif

const terse__squant_kernels *terse__squant_kernels_get(void) {
    /* Racing first calls store the same pointer. */
    static const terse__squant_kernels *_Atomic chosen;
    const terse__squant_kernels *k = chosen;
    if (k) return k;
    k = &scalar_kernels;
#if defined(__x86_64__)
    unsigned f = terse__cpu_features();
    if (f & TERSE_CPU_AVX512)
        k = &avx512_kernels;
    else if (f & TERSE_CPU_AVX2)
        k = &avx2_kernels;
#endif
    chosen = k;
    return k;
}
