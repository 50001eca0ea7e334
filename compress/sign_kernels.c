/* sign kernels: the scalar reference that defines every bit of the sign
 * payload (the summation order is spelled out in sign_kernels.h) and of
 * its decoding, and the run-time choice among it and its SIMD twins. */
#include "compress/sign_kernels.h"

#include <math.h>
#include <string.h>

#include "common/cpu.h"

void terse__sign_encode_tail(const float *x, size_t i, size_t len, double *lane, uint8_t *bits,
                             size_t pos) {
    /* Eight elements at a time gather their bits in a register; the lane
     * additions are the same, in the same order, as one at a time. x < 0 is
     * false for +0, -0 and NaN: all three send "positive". */
    for (; i + 8 <= len; i += 8) {
        uint32_t m = 0;
        for (unsigned k = 0; k < 8; k++) {
            lane[(i + k) % TERSE_SIGN_LANES] += (double)fabsf(x[i + k]);
            m |= (uint32_t)(x[i + k] < 0.0f) << k;
        }
        terse__sign_or_bits(bits, pos + i, m, 8);
    }
    for (; i < len; i++) {
        lane[i % TERSE_SIGN_LANES] += (double)fabsf(x[i]);
        bits[(pos + i) >> 3] |= (uint8_t)((unsigned)(x[i] < 0.0f) << ((pos + i) & 7));
    }
}

float terse__sign_scale(double *lane, size_t len) {
    for (unsigned w = TERSE_SIGN_LANES / 2; w; w >>= 1)
        for (unsigned j = 0; j < w; j++) lane[j] = lane[j] + lane[j + w];
    /* The mean is at most max|x| (up to double rounding far below half an
     * fp32 ulp), so the conversion stays in range; Inf stays Inf. */
    float s = (float)(lane[0] / (double)len);
    if (s != s) {
        /* NaN payloads depend on which operand an add happened to return;
         * send one canonical NaN so every kernel writes the same bytes. */
        uint32_t qnan = 0x7fc00000u;
        memcpy(&s, &qnan, 4);
    }
    return s;
}

void terse__sign_encode_scalar(const float *x, size_t n, size_t bucket, uint8_t *scales,
                               uint8_t *bits) {
    memset(bits, 0, (n + 7) / 8);
    for (size_t b = 0, i0 = 0; i0 < n; b++, i0 += bucket) {
        size_t len = n - i0 < bucket ? n - i0 : bucket;
        double lane[TERSE_SIGN_LANES] = {0};
        terse__sign_encode_tail(x + i0, 0, len, lane, bits, i0);
        float s = terse__sign_scale(lane, len);
        memcpy(scales + 4 * b, &s, 4); /* host is little endian (common/bytes.h) */
    }
}

/* dst[i] (+)= a with its sign bit flipped where the element's bit is 1 --
 * exactly -a, as the SIMD xor and blend compute it. */
static inline void put_signed(float *d, uint32_t a_bits, uint32_t bit, int accumulate) {
    uint32_t u = a_bits ^ (bit << 31);
    float v;
    memcpy(&v, &u, 4);
    if (accumulate)
        *d = *d + v;
    else
        *d = v;
}

void terse__sign_decode_tail(const uint8_t *bits, size_t pos, size_t i0, size_t len, float a,
                             int accumulate, float *dst) {
    uint32_t ab;
    memcpy(&ab, &a, 4);
    size_t i = i0;
    for (; i + 8 <= len; i += 8) {
        uint32_t m = terse__sign_get_bits(bits, pos + i, 8);
        for (unsigned k = 0; k < 8; k++) put_signed(dst + i + k, ab, (m >> k) & 1u, accumulate);
    }
    for (; i < len; i++)
        put_signed(dst + i, ab, (uint32_t)(bits[(pos + i) >> 3] >> ((pos + i) & 7)) & 1u,
                   accumulate);
}

void terse__sign_decode_scalar(const uint8_t *scales, const uint8_t *bits, size_t n, size_t bucket,
                               float *dst, float alpha, int accumulate) {
    for (size_t b = 0, i0 = 0; i0 < n; b++, i0 += bucket) {
        size_t len = n - i0 < bucket ? n - i0 : bucket;
        float s;
        memcpy(&s, scales + 4 * b, 4);
        terse__sign_decode_tail(bits, i0, 0, len, alpha * s, accumulate, dst + i0);
    }
}

typedef struct {
    terse__sign_encode_fn encode;
    terse__sign_decode_fn decode;
} sign_table;

static const sign_table *pick(void) {
    static const sign_table scalar = {terse__sign_encode_scalar, terse__sign_decode_scalar};
#if defined(__x86_64__)
    static const sign_table avx2 = {terse__sign_encode_avx2, terse__sign_decode_avx2};
    static const sign_table avx512 = {terse__sign_encode_avx512, terse__sign_decode_avx512};
    unsigned f = terse__cpu_features();
    if (f & TERSE_CPU_AVX512) return &avx512;
    if (f & TERSE_CPU_AVX2) return &avx2;
#endif
    return &scalar;
}

/* Racing first calls store the same pointer; the atomic makes that legal. */
static const sign_table *table(void) {
    static const sign_table *_Atomic chosen;
    const sign_table *t = chosen;
    if (!t) {
        t = pick();
        chosen = t;
    }
    return t;
}

terse__sign_encode_fn terse__sign_encode_kernel(void) { return table()->encode; }
terse__sign_decode_fn terse__sign_decode_kernel(void) { return table()->decode; }
