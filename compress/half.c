/* Half-precision conversions: the scalar reference and the run-time
 * dispatch (contract in compress/half_kernels.h).
 *
 * Rounding (float -> half) uses integer arithmetic only, so it is to
 * nearest even whatever the floating-point environment says (rounding mode,
 * DAZ/FTZ), as F16C's vcvtps2ph with an explicit rounding immediate is. The
 * scalar and F16C conversions agree on all 2^32 floats and 2^16 halves. */
#include <string.h>

#include "common/bytes.h"
#include "common/cpu.h"
#include "compress/half_kernels.h"

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* binary32 -> binary16, round to nearest even.
 *
 *   NaN          quiet NaN: sign, quiet bit, top 9 payload bits (F16C's
 *                choice; a payload that lived only in the low bits is lost,
 *                but the quiet bit keeps the result a NaN, never Inf).
 *   |x| >= 65520 Inf. 65520 is the midpoint between 65504 (the largest
 *                half) and 2^16; the tie goes to the even side, which is
 *                Inf (65504's last mantissa bit is 1).
 *   normal       rebias the exponent by 15 - 127 and round away the low 13
 *                mantissa bits by adding 0xfff plus the lsb that survives
 *                (RNE); a carry correctly bumps the exponent, up to Inf.
 *   |x| < 2^-14  half subnormal: shift the 24-bit significand right so its
 *                unit is 2^-24, rounding the bits shifted out to even. A
 *                rounded-up 0x3ff becomes 0x400, which is the encoding of
 *                2^-14: the carry lands in the exponent on its own. */
uint16_t terse__fp16_from_f32(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) {
        ax += 0xc8000fffu + ((ax >> 13) & 1u); /* (15 - 127) << 23, wrapping */
        return (uint16_t)(sign | (ax >> 13));
    }
    uint32_t e = ax >> 23; /* biased, <= 112 here */
    uint32_t shift = 126 - e; /* significand unit 2^(e-150) -> 2^-24: >= 14 */
    /* Float subnormals (e == 0) have no implicit bit and the same unit as
     * e == 1, but they lie far below 2^-25 and round to zero either way. */
    if (shift > 24) return sign;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

/* binary16 -> binary32, exact. Subnormal halves are m * 2^-24 with m < 2^10:
 * the integer converts exactly and the product is a normal float, so this is
 * exact under any rounding mode and under DAZ/FTZ. */
float terse__fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return f32_from_bits(sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0));
    if (e == 0) return f32_from_bits(sign | f32_bits((float)m * 0x1p-24f));
    return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

/* bfloat16 is the top half of a binary32, so rounding is one integer add:
 * 0x7fff plus the surviving lsb carries into bit 16 exactly when the low
 * half is above the midpoint, or at it with an odd lsb. The encoding is
 * monotonic with a uniform step inside each binade and across the
 * subnormal / normal boundary, so subnormals round correctly too (no
 * flush, unlike AVX512_BF16's vcvtneps2bf16), and a carry out of the
 * largest finite values lands exactly on Inf. NaNs are excluded first (the
 * add could carry a NaN into Inf or flip its sign) and keep sign and top
 * payload with the quiet bit set. */
uint16_t terse__bf16_from_f32(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float terse__bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

void terse__fp16_encode_scalar(uint8_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) terse__put_u16(dst + 2 * i, terse__fp16_from_f32(src[i]));
}

void terse__bf16_encode_scalar(uint8_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) terse__put_u16(dst + 2 * i, terse__bf16_from_f32(src[i]));
}

/* The product and the sum are separate statements so that no compiler
 * contracts them into an FMA (clang's default -ffp-contract=on fuses within
 * one expression); the SIMD versions use separate mul and add too. */
void terse__fp16_decode_scalar(float *dst, const uint8_t *src, size_t n, float alpha,
                               int accumulate) {
    if (accumulate) {
        for (size_t i = 0; i < n; i++) {
            float p = alpha * terse__fp16_to_f32(terse__get_u16(src + 2 * i));
            dst[i] = dst[i] + p;
        }
    } else {
        for (size_t i = 0; i < n; i++)
            dst[i] = alpha * terse__fp16_to_f32(terse__get_u16(src + 2 * i));
    }
}

void terse__bf16_decode_scalar(float *dst, const uint8_t *src, size_t n, float alpha,
                               int accumulate) {
    if (accumulate) {
        for (size_t i = 0; i < n; i++) {
            float p = alpha * terse__bf16_to_f32(terse__get_u16(src + 2 * i));
            dst[i] = dst[i] + p;
        }
    } else {
        for (size_t i = 0; i < n; i++)
            dst[i] = alpha * terse__bf16_to_f32(terse__get_u16(src + 2 * i));
    }
}

/* ---- run-time dispatch ---- */

typedef void encode_fn(uint8_t *dst, const float *src, size_t n);
typedef void decode_fn(float *dst, const uint8_t *src, size_t n, float alpha, int accumulate);

typedef struct {
    encode_fn *fp16_encode;
    decode_fn *fp16_decode;
    encode_fn *bf16_encode;
    decode_fn *bf16_decode;
} half_table;

static const half_table scalar_table = {terse__fp16_encode_scalar, terse__fp16_decode_scalar,
                                        terse__bf16_encode_scalar, terse__bf16_decode_scalar};
#if defined(__x86_64__)
static const half_table avx2_table = {terse__fp16_encode_avx2, terse__fp16_decode_avx2,
                                      terse__bf16_encode_avx2, terse__bf16_decode_avx2};
/* AVX-512 decodes only: its encoders measured slower (half-avx512.c). */
static const half_table avx512_table = {terse__fp16_encode_avx2, terse__fp16_decode_avx512,
                                        terse__bf16_encode_avx2, terse__bf16_decode_avx512};
#endif

/* Racing first calls pick the same table; the pointer store is atomic. */
static const half_table *table(void) {
    static const half_table *_Atomic chosen; /* NULL until the first call */
    const half_table *t = chosen;
    if (!t) {
        t = &scalar_table;
#if defined(__x86_64__)
        unsigned f = terse__cpu_features();
        if (f & TERSE_CPU_AVX512)
            t = &avx512_table;
        else if (f & TERSE_CPU_AVX2)
            t = &avx2_table;
#endif
        chosen = t;
    }
    return t;
}

void terse__fp16_encode(uint8_t *dst, const float *src, size_t n) {
    table()->fp16_encode(dst, src, n);
}

void terse__fp16_decode(float *dst, const uint8_t *src, size_t n, float alpha, int accumulate) {
    table()->fp16_decode(dst, src, n, alpha, accumulate);
}

void terse__bf16_encode(uint8_t *dst, const float *src, size_t n) {
    table()->bf16_encode(dst, src, n);
}

void terse__bf16_decode(float *dst, const uint8_t *src, size_t n, float alpha, int accumulate) {
    table()->bf16_decode(dst, src, n, alpha, accumulate);
}
