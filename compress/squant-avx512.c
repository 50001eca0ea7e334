/* AVX-512 (F, BW, DQ, VL) versions of the stochastic-quantization kernels:
 * the AVX2 algorithm at sixteen lanes, with mask registers for ragged ends.
 * Operation for operation the scalar reference of squant_kernels.c. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#include "compress/squant_kernels.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#define GOLDEN 0x9e3779b9u /* terse__rng_u32's counter multiplier */

static inline __mmask16 first16(size_t m) { return (__mmask16)(m >= 16 ? 0xffffu : (1u << m) - 1); }

/* ---------------------------------------------------------------- norms */

double terse__squant_sumsq_avx512(const float *x, size_t n) {
    /* a0 holds lane accumulators 0-7, a1 8-15; masked-off lanes load +0. */
    __m512d a0 = _mm512_setzero_pd(), a1 = a0;
    for (size_t j = 0; j < n; j += 16) {
        __m512 v = _mm512_maskz_loadu_ps(first16(n - j), x + j);
        __m512d d0 = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        __m512d d1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
        a0 = _mm512_add_pd(a0, _mm512_mul_pd(d0, d0));
        a1 = _mm512_add_pd(a1, _mm512_mul_pd(d1, d1));
    }
    __m512d b = _mm512_add_pd(a0, a1);
    __m256d c = _mm256_add_pd(_mm512_castpd512_pd256(b), _mm512_extractf64x4_pd(b, 1));
    __m128d d = _mm_add_pd(_mm256_castpd256_pd128(c), _mm256_extractf128_pd(c, 1));
    return _mm_cvtsd_f64(d) + _mm_cvtsd_f64(_mm_unpackhi_pd(d, d));
}

uint32_t terse__squant_absmax_avx512(const float *x, size_t n) {
    const __m512i abs = _mm512_set1_epi32(0x7fffffff);
    __m512i m0 = _mm512_setzero_si512(), m1 = m0;
    size_t j = 0;
    for (; j + 32 <= n; j += 32) {
        m0 = _mm512_max_epi32(m0, _mm512_and_si512(_mm512_loadu_si512(x + j), abs));
        m1 = _mm512_max_epi32(m1, _mm512_and_si512(_mm512_loadu_si512(x + j + 16), abs));
    }
    for (; j < n; j += 16)
        m0 = _mm512_max_epi32(
            m0, _mm512_and_si512(_mm512_maskz_loadu_epi32(first16(n - j), x + j), abs));
    return (uint32_t)_mm512_reduce_max_epi32(_mm512_max_epi32(m0, m1));
}

/* ---------------------------------------------------------------- encode */

typedef struct {
    __m512 scale, Lf, unit, half; /* half: TERSE__SQUANT_NEAREST_DRAW */
    __m512i Li, iota_g, g16, absmask, one;
} qconst;

static inline __m512i hash16(__m512i h) {
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32(0x7feb352d));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 15));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0x846ca68bu));
    return _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
}

/* `nearest` is a constant after inlining: that variant has no hash. */
static inline __m512i quant16(__m512 x, __m512i h, int nearest, const qconst *k) {
    __m512i xi = _mm512_castps_si512(x);
    __m512 ax = _mm512_castsi512_ps(_mm512_and_si512(xi, k->absmask));
    __m512 u = _mm512_mul_ps(_mm512_div_ps(ax, k->scale), k->Lf);
    u = _mm512_min_ps(u, k->Lf); /* NaN -> Lf */
    __m512i f = _mm512_cvttps_epi32(u);
    __m512 frac = _mm512_sub_ps(u, _mm512_cvtepi32_ps(f));
    __m512 r = nearest
                   ? k->half
                   : _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(hash16(h), 8)), k->unit);
    __m512i l = _mm512_mask_add_epi32(f, _mm512_cmp_ps_mask(r, frac, _CMP_LT_OQ), f, k->one);
    l = _mm512_mask_sub_epi32(l, _mm512_movepi32_mask(xi), _mm512_setzero_si512(), l);
    return _mm512_add_epi32(l, k->Li);
}

/* Codes of 64 elements starting at bucket index j0, as 64 bytes in order;
 * lanes whose bit in `keep` is clear read +0 and give code 0. */
static inline __m512i quant64(const float *x, uint32_t j0, uint32_t subkey, uint64_t keep,
                              int nearest, const qconst *k) {
    __m512i h = _mm512_add_epi32(_mm512_set1_epi32((int)(subkey + j0 * GOLDEN)), k->iota_g);
    __m512i c[4];
    for (int i = 0; i < 4; i++) {
        __m512 v = _mm512_maskz_loadu_ps((__mmask16)(keep >> (16 * i)), x + 16 * i);
        c[i] = quant16(v, h, nearest, k);
        h = _mm512_add_epi32(h, k->g16);
    }
    __m512i b = _mm512_packus_epi16(_mm512_packs_epi32(c[0], c[1]), _mm512_packs_epi32(c[2], c[3]));
    b = _mm512_permutexvar_epi32(
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), b);
    return _mm512_maskz_mov_epi8(keep, b);
}

/* Pack 64 code bytes into 8*bits bytes at out, LSB-first. */
static inline void emit64(__m512i b, unsigned bits, uint8_t *out) {
    if (bits == 8) {
        _mm512_storeu_si512(out, b);
    } else if (bits == 4) {
        __m512i w = _mm512_maddubs_epi16(b, _mm512_set1_epi16(0x1001));
        _mm256_storeu_si256((__m256i *)out, _mm512_cvtepi16_epi8(w));
    } else if (bits == 2) {
        __m512i w = _mm512_maddubs_epi16(b, _mm512_set1_epi16(0x0401));
        w = _mm512_madd_epi16(w, _mm512_set1_epi32(0x00100001));
        _mm_storeu_si128((__m128i *)out, _mm512_cvtepi32_epi8(w));
    } else { /* rare widths: eight codes fill exactly `bits` bytes */
        uint8_t c[64];
        _mm512_storeu_si512(c, b);
        for (int g = 0; g < 8; g++) {
            uint64_t w = 0;
            for (int i = 0; i < 8; i++) w |= (uint64_t)c[8 * g + i] << (i * bits);
            for (unsigned i = 0; i < bits; i++) out[g * bits + i] = (uint8_t)(w >> (8 * i));
        }
    }
}

static inline void encode_body(const float *x, size_t n, unsigned bits, uint32_t subkey,
                               int nearest, const qconst *k, uint8_t *out) {
    size_t j = 0;
    for (; j + 64 <= n; j += 64)
        emit64(quant64(x + j, (uint32_t)j, subkey, ~(uint64_t)0, nearest, k), bits,
               out + j / 8 * bits);
    if (j < n) {
        size_t m = n - j;
        uint8_t packed[64];
        emit64(quant64(x + j, (uint32_t)j, subkey, ((uint64_t)1 << m) - 1, nearest, k), bits,
               packed);
        memcpy(out + j / 8 * bits, packed, (m * bits + 7) / 8);
    }
}

void terse__squant_encode_avx512(const float *x, size_t n, float scale, unsigned bits,
                                 uint32_t subkey, int nearest, uint8_t *out) {
    const int L = (1 << (bits - 1)) - 1;
    qconst k;
    k.scale = _mm512_set1_ps(scale);
    k.Lf = _mm512_set1_ps((float)L);
    k.unit = _mm512_set1_ps(1.0f / 16777216.0f);
    k.half = _mm512_set1_ps(TERSE__SQUANT_NEAREST_DRAW);
    k.Li = _mm512_set1_epi32(L);
    k.iota_g = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)GOLDEN));
    k.g16 = _mm512_set1_epi32((int)(16u * GOLDEN));
    k.absmask = _mm512_set1_epi32(0x7fffffff);
    k.one = _mm512_set1_epi32(1);
    if (nearest) { /* constant mode: no hashes in this variant */
        switch (bits) {
        case 8: encode_body(x, n, 8, 0, 1, &k, out); break;
        case 4: encode_body(x, n, 4, 0, 1, &k, out); break;
        case 2: encode_body(x, n, 2, 0, 1, &k, out); break;
        default: encode_body(x, n, bits, 0, 1, &k, out); break;
        }
        return;
    }
    switch (bits) {
    case 8: encode_body(x, n, 8, subkey, 0, &k, out); break;
    case 4: encode_body(x, n, 4, subkey, 0, &k, out); break;
    case 2: encode_body(x, n, 2, subkey, 0, &k, out); break;
    default: encode_body(x, n, bits, subkey, 0, &k, out); break;
    }
}

/* ---------------------------------------------------------------- decode */

typedef struct {
    __m512i ctl, shift, mask, Li;
    __m512 step, alpha;
} dconst;

/* Sixteen codes from the 2*bits bytes at p, of which `have` are readable.
 * Each 128-bit lane holds the same 16 source bytes; code i takes the two
 * bytes holding bit i*bits and shifts itself down. */
static inline __m512i codes16(const uint8_t *p, size_t have, unsigned bits, const dconst *k) {
    __mmask16 bm = first16(have);
    __m128i raw = _mm_maskz_loadu_epi8(bm, p);
    if (bits == 8) return _mm512_cvtepu8_epi32(raw);
    __m512i v = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(raw), k->ctl);
    return _mm512_and_si512(_mm512_srlv_epi32(v, k->shift), k->mask);
}

static inline __mmask16 group16(const uint8_t *p, size_t have, float *dst, __mmask16 lanes,
                                unsigned bits, int accumulate, const dconst *k) {
    __m512i c = codes16(p, have, bits, k);
    __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(c, k->Li));
    v = _mm512_mul_ps(k->alpha, _mm512_mul_ps(k->step, v));
    if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, dst), v);
    _mm512_mask_storeu_ps(dst, lanes, v);
    return _mm512_mask_cmpeq_epi32_mask(lanes, c, k->mask);
}

static inline int decode_body(const uint8_t *in, size_t n, unsigned bits, int accumulate,
                              const dconst *k, float *dst) {
    size_t nbytes = (n * bits + 7) / 8, j = 0, o = 0;
    __mmask16 bad = 0;
    for (; j + 16 <= n && o + 16 <= nbytes; j += 16, o += 2 * bits)
        bad |= group16(in + o, 16, dst + j, 0xffff, bits, accumulate, k);
    /* The last few groups load only the bytes that exist; lanes past n
     * neither store nor count as bad. */
    for (; j < n; j += 16, o += 2 * bits)
        bad |= group16(in + o, nbytes - o, dst + j, first16(n - j), bits, accumulate, k);
    return bad != 0;
}

int terse__squant_decode_avx512(const uint8_t *in, size_t n, unsigned bits, float step,
                                float alpha, int accumulate, float *dst) {
    const int L = (1 << (bits - 1)) - 1;
    uint8_t ctl[64];
    int32_t shift[16];
    for (int i = 0; i < 16; i++) {
        unsigned bit = (unsigned)i * bits;
        uint8_t *c = ctl + 4 * i;
        c[0] = (uint8_t)(bit >> 3);
        c[1] = (uint8_t)(((bit >> 3) + 1) & 15); /* wraps only when unused */
        c[2] = c[3] = 0x80;
        shift[i] = (int32_t)(bit & 7);
    }
    dconst k;
    k.ctl = _mm512_loadu_si512(ctl);
    k.shift = _mm512_loadu_si512(shift);
    k.mask = _mm512_set1_epi32((1 << bits) - 1);
    k.Li = _mm512_set1_epi32(L);
    k.step = _mm512_set1_ps(step);
    k.alpha = _mm512_set1_ps(alpha);
    if (bits == 8)
        return accumulate ? decode_body(in, n, 8, 1, &k, dst) : decode_body(in, n, 8, 0, &k, dst);
    return accumulate ? decode_body(in, n, bits, 1, &k, dst) : decode_body(in, n, bits, 0, &k, dst);
}

#endif
