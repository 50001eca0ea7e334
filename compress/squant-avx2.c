/* AVX2 versions of the stochastic-quantization kernels. They follow the
 * scalar reference in squant_kernels.c operation for operation (intrinsics
 * only, so the compiler cannot contract a multiply and an add into an FMA);
 * ragged ends go through the same vector code on a zero-padded copy. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#include "compress/squant_kernels.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#define GOLDEN 0x9e3779b9u /* terse__rng_u32's counter multiplier */

/* ---------------------------------------------------------------- norms */

double terse__squant_sumsq_avx2(const float *x, size_t n) {
    /* a0..a3 hold lane accumulators 0-3, 4-7, 8-11, 12-15. */
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    float pad[16];
    for (size_t j = 0; j < n; j += 16) {
        const float *p = x + j;
        if (n - j < 16) { /* zeros add +0 to a lane: no change */
            memset(pad, 0, sizeof pad);
            memcpy(pad, p, (n - j) * sizeof(float));
            p = pad;
        }
        __m256 v0 = _mm256_loadu_ps(p), v1 = _mm256_loadu_ps(p + 8);
        __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(v0));
        __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(v0, 1));
        __m256d d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(v1));
        __m256d d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(v1, 1));
        a0 = _mm256_add_pd(a0, _mm256_mul_pd(d0, d0));
        a1 = _mm256_add_pd(a1, _mm256_mul_pd(d1, d1));
        a2 = _mm256_add_pd(a2, _mm256_mul_pd(d2, d2));
        a3 = _mm256_add_pd(a3, _mm256_mul_pd(d3, d3));
    }
    __m256d c = _mm256_add_pd(_mm256_add_pd(a0, a2), _mm256_add_pd(a1, a3));
    __m128d d = _mm_add_pd(_mm256_castpd256_pd128(c), _mm256_extractf128_pd(c, 1));
    return _mm_cvtsd_f64(d) + _mm_cvtsd_f64(_mm_unpackhi_pd(d, d));
}

uint32_t terse__squant_absmax_avx2(const float *x, size_t n) {
    const __m256i abs = _mm256_set1_epi32(0x7fffffff);
    __m256i m0 = _mm256_setzero_si256(), m1 = m0;
    float pad[16];
    for (size_t j = 0; j < n; j += 16) {
        const float *p = x + j;
        if (n - j < 16) {
            memset(pad, 0, sizeof pad);
            memcpy(pad, p, (n - j) * sizeof(float));
            p = pad;
        }
        /* sign cleared, so signed max orders the bit patterns */
        m0 = _mm256_max_epi32(m0, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)p), abs));
        m1 = _mm256_max_epi32(m1,
                              _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(p + 8)), abs));
    }
    __m256i m = _mm256_max_epi32(m0, m1);
    __m128i h = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
    h = _mm_max_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
    return (uint32_t)_mm_cvtsi128_si32(h);
}

/* ---------------------------------------------------------------- encode */

typedef struct {
    __m256 scale, Lf, unit, absmask, half; /* half: TERSE__SQUANT_NEAREST_DRAW */
    __m256i Li, iota_g, g8;
} qconst;

/* terse__rng_u32 on eight counters at once; h = subkey + i * GOLDEN. */
static inline __m256i hash8(__m256i h) {
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
    h = _mm256_mullo_epi32(h, _mm256_set1_epi32(0x7feb352d));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 15));
    h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0x846ca68bu));
    return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

/* Codes l + L of eight elements, as 32-bit lanes (see code_of in the
 * scalar reference for the same steps). `nearest` is a constant after
 * inlining: the nearest variant has no hash in it. */
static inline __m256i quant8(__m256 x, __m256i h, int nearest, const qconst *k) {
    __m256 u = _mm256_mul_ps(_mm256_div_ps(_mm256_and_ps(x, k->absmask), k->scale), k->Lf);
    u = _mm256_min_ps(u, k->Lf); /* NaN -> Lf */
    __m256i f = _mm256_cvttps_epi32(u);
    __m256 frac = _mm256_sub_ps(u, _mm256_cvtepi32_ps(f));
    __m256 r = nearest ? k->half
                       : _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(hash8(h), 8)), k->unit);
    __m256i up = _mm256_castps_si256(_mm256_cmp_ps(r, frac, _CMP_LT_OQ)); /* -1 or 0 */
    __m256i l = _mm256_sub_epi32(f, up);
    __m256i s = _mm256_srai_epi32(_mm256_castps_si256(x), 31); /* -1 if sign bit */
    l = _mm256_sub_epi32(_mm256_xor_si256(l, s), s);
    return _mm256_add_epi32(l, k->Li);
}

/* Codes of 32 elements starting at bucket index j0, as 32 bytes in order. */
static inline __m256i quant32(const float *x, uint32_t j0, uint32_t subkey, int nearest,
                              const qconst *k) {
    __m256i h0 = _mm256_add_epi32(_mm256_set1_epi32((int)(subkey + j0 * GOLDEN)), k->iota_g);
    __m256i h1 = _mm256_add_epi32(h0, k->g8);
    __m256i h2 = _mm256_add_epi32(h1, k->g8);
    __m256i h3 = _mm256_add_epi32(h2, k->g8);
    __m256i c0 = quant8(_mm256_loadu_ps(x), h0, nearest, k);
    __m256i c1 = quant8(_mm256_loadu_ps(x + 8), h1, nearest, k);
    __m256i c2 = quant8(_mm256_loadu_ps(x + 16), h2, nearest, k);
    __m256i c3 = quant8(_mm256_loadu_ps(x + 24), h3, nearest, k);
    /* packs interleave 128-bit halves; the permute restores element order */
    __m256i b = _mm256_packus_epi16(_mm256_packs_epi32(c0, c1), _mm256_packs_epi32(c2, c3));
    return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Pack 32 code bytes into 4*bits bytes at out, LSB-first. */
static inline void emit32(__m256i b, unsigned bits, uint8_t *out) {
    if (bits == 8) {
        _mm256_storeu_si256((__m256i *)out, b);
    } else if (bits == 4) { /* even | odd << 4, then bytes */
        __m256i w = _mm256_maddubs_epi16(b, _mm256_set1_epi16(0x1001));
        w = _mm256_permute4x64_epi64(_mm256_packus_epi16(w, w), _MM_SHUFFLE(3, 1, 2, 0));
        _mm_storeu_si128((__m128i *)out, _mm256_castsi256_si128(w));
    } else if (bits == 2) { /* c0 + 4c1, then (..) + 16(c2 + 4c3) */
        __m256i w = _mm256_maddubs_epi16(b, _mm256_set1_epi16(0x0401));
        w = _mm256_madd_epi16(w, _mm256_set1_epi32(0x00100001));
        w = _mm256_packs_epi32(w, w);
        w = _mm256_packus_epi16(w, w);
        w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
        _mm_storel_epi64((__m128i *)out, _mm256_castsi256_si128(w));
    } else { /* rare widths: eight codes fill exactly `bits` bytes */
        uint8_t c[32];
        _mm256_storeu_si256((__m256i *)c, b);
        for (int g = 0; g < 4; g++) {
            uint64_t w = 0;
            for (int i = 0; i < 8; i++) w |= (uint64_t)c[8 * g + i] << (i * bits);
            for (unsigned i = 0; i < bits; i++) out[g * bits + i] = (uint8_t)(w >> (8 * i));
        }
    }
}

static inline void encode_body(const float *x, size_t n, unsigned bits, uint32_t subkey,
                               int nearest, const qconst *k, uint8_t *out) {
    size_t j = 0;
    for (; j + 32 <= n; j += 32)
        emit32(quant32(x + j, (uint32_t)j, subkey, nearest, k), bits, out + j / 8 * bits);
    if (j < n) { /* zero-padded copy; padding codes are zeroed so spare bits stay 0 */
        static const int8_t ones[64] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        -1, -1, -1, -1, -1, -1};
        size_t m = n - j;
        float pad[32] = {0};
        uint8_t packed[32];
        memcpy(pad, x + j, m * sizeof(float));
        __m256i keep = _mm256_loadu_si256((const __m256i *)(ones + 32 - m));
        __m256i b = _mm256_and_si256(quant32(pad, (uint32_t)j, subkey, nearest, k), keep);
        emit32(b, bits, packed);
        memcpy(out + j / 8 * bits, packed, (m * bits + 7) / 8);
    }
}

void terse__squant_encode_avx2(const float *x, size_t n, float scale, unsigned bits,
                               uint32_t subkey, int nearest, uint8_t *out) {
    const int L = (1 << (bits - 1)) - 1;
    qconst k;
    k.scale = _mm256_set1_ps(scale);
    k.Lf = _mm256_set1_ps((float)L);
    k.unit = _mm256_set1_ps(1.0f / 16777216.0f);
    k.absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    k.half = _mm256_set1_ps(TERSE__SQUANT_NEAREST_DRAW);
    k.Li = _mm256_set1_epi32(L);
    k.iota_g = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                  _mm256_set1_epi32((int)GOLDEN));
    k.g8 = _mm256_set1_epi32((int)(8u * GOLDEN));
    /* Constant widths let the compiler drop the emit32 branches, and a
     * constant mode the hashes. */
    if (nearest) {
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
    __m256i ctl, shift, mask, bad, Li;
    __m256 step, alpha;
} dconst;

/* Eight codes whose `bits`-byte group starts at p; 8 bytes must be readable.
 * Lane i takes the two bytes holding bit i*bits and shifts the code down. */
static inline __m256i codes8(const uint8_t *p, unsigned bits, const dconst *k) {
    if (bits == 8) return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    uint64_t w;
    memcpy(&w, p, 8);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi64x((long long)w), k->ctl);
    return _mm256_and_si256(_mm256_srlv_epi32(v, k->shift), k->mask);
}

static inline __m256i group8(const uint8_t *p, float *dst, unsigned bits, int accumulate,
                             const dconst *k, __m256i bad) {
    __m256i c = codes8(p, bits, k);
    __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(c, k->Li));
    v = _mm256_mul_ps(k->alpha, _mm256_mul_ps(k->step, v));
    if (accumulate) v = _mm256_add_ps(_mm256_loadu_ps(dst), v);
    _mm256_storeu_ps(dst, v);
    return _mm256_or_si256(bad, _mm256_cmpeq_epi32(c, k->bad));
}

static inline int decode_body(const uint8_t *in, size_t n, unsigned bits, int accumulate,
                              const dconst *k, float *dst) {
    size_t nbytes = (n * bits + 7) / 8, j = 0, o = 0;
    __m256i bad = _mm256_setzero_si256();
    for (; j + 8 <= n && o + 8 <= nbytes; j += 8, o += bits)
        bad = group8(in + o, dst + j, bits, accumulate, k, bad);
    if (j < n) {
        /* At most 8 code bytes and 32 elements remain (the loop stops when
         * fewer than 8 bytes are left). Padding bits are cleared so that
         * lanes past n read code 0, which is valid. */
        uint8_t tb[24] = {0};
        float tf[40];
        size_t m = n - j, rb = nbytes - o;
        memcpy(tb, in + o, rb);
        if ((n * bits) & 7) tb[rb - 1] &= (uint8_t)((1u << ((n * bits) & 7)) - 1);
        if (accumulate) memcpy(tf, dst + j, m * sizeof(float));
        for (size_t t = 0, to = 0; t < m; t += 8, to += bits)
            bad = group8(tb + to, tf + t, bits, accumulate, k, bad);
        memcpy(dst + j, tf, m * sizeof(float));
    }
    return !_mm256_testz_si256(bad, bad);
}

int terse__squant_decode_avx2(const uint8_t *in, size_t n, unsigned bits, float step, float alpha,
                              int accumulate, float *dst) {
    const int L = (1 << (bits - 1)) - 1;
    dconst k;
    uint8_t ctl[32];
    int32_t shift[8];
    for (int i = 0; i < 8; i++) {
        unsigned bit = (unsigned)i * bits;
        shift[i] = (int32_t)(bit & 7);
        /* lanes 0-3 sit in the low 128-bit half, 4-7 in the high one; both
         * halves see the same eight source bytes after the broadcast */
        uint8_t *c = ctl + 4 * i;
        c[0] = (uint8_t)(bit >> 3);
        c[1] = (uint8_t)((bit >> 3) + 1);
        c[2] = c[3] = 0x80;
    }
    k.ctl = _mm256_loadu_si256((const __m256i *)ctl);
    k.shift = _mm256_loadu_si256((const __m256i *)shift);
    k.mask = _mm256_set1_epi32((1 << bits) - 1);
    k.bad = k.mask;
    k.Li = _mm256_set1_epi32(L);
    k.step = _mm256_set1_ps(step);
    k.alpha = _mm256_set1_ps(alpha);
    if (bits == 8)
        return accumulate ? decode_body(in, n, 8, 1, &k, dst) : decode_body(in, n, 8, 0, &k, dst);
    return accumulate ? decode_body(in, n, bits, 1, &k, dst) : decode_body(in, n, bits, 0, &k, dst);
}

#endif
