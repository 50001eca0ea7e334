/* vq: the fixed codebook, the canonical codeword choice (independent of the
 * BLAS kernel), gains, error, payload validation and the search kernels. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/cpu.h"
#include "common/crc32c.h"
#include "compress/vq.h"
#include "compress/vq_kernels.h"
#include "compress/wire.h"
#include "testutil.h"

#define HDR TERSE_WIRE_HEADER_SIZE
#define VQ_ID 11

static terse_codec *make(const char *spec, size_t n) {
    terse_codec *c = NULL;
    cr_assert_eq(terse_codec_create(spec, n, 1, &c), TERSE_OK, "%s: %s", spec, terse_last_error());
    return c;
}

/* The codec's rule, restated: the largest canonical |<x, v_k>| (exact
 * products summed in double, in order) over all base codewords, ties to
 * the lower full index; NaN/Inf blocks take index 0. */
static double canon(const float *x, const float *v, size_t d) {
    double s = 0;
    for (size_t i = 0; i < d; i++) {
        double p = (double)x[i] * (double)v[i];
        s += p;
    }
    return s;
}

/* Reference encoder: the full payload, by brute force. */
static size_t ref_encode(const float *x, size_t n, size_t d, size_t b, size_t g, uint8_t *out) {
    size_t h = (size_t)1 << (b - 1), nblocks = (n + d - 1) / d, nbuckets = (nblocks + g - 1) / g;
    float *v = malloc(h * d * sizeof(float));
    for (size_t k = 0; k < h; k++) terse__vq_codeword(d, (uint32_t)k, v + k * d);
    size_t idx_bytes = (nblocks * b + 7) / 8;
    memset(out + 4 * nbuckets, 0, idx_bytes);
    double sum = 0;
    size_t in_bucket = 0;
    for (size_t j = 0; j < nblocks; j++) {
        float blk[64] = {0};
        size_t e = n - j * d < d ? n - j * d : d;
        memcpy(blk, x + j * d, e * sizeof(float));
        double l1 = 0;
        for (size_t i = 0; i < d; i++) l1 += fabs((double)blk[i]);
        uint32_t bi = 0;
        double best = fabs(canon(blk, v, d));
        if (l1 <= DBL_MAX) {
            best = -1;
            for (size_t k = 0; k < h; k++) {
                double s = canon(blk, v + k * d, d);
                uint32_t idx = (uint32_t)(s >= 0 ? k : k + h);
                if (fabs(s) > best || (fabs(s) == best && idx < bi)) {
                    best = fabs(s);
                    bi = idx;
                }
            }
        }
        for (size_t t = 0; t < b; t++) /* bit j*b + t of the index stream */
            out[4 * nbuckets + (j * b + t) / 8] |= (uint8_t)(((bi >> t) & 1u) << ((j * b + t) % 8));
        sum += best;
        if (++in_bucket == g || j + 1 == nblocks) {
            double m = sum / (double)in_bucket;
            float gain = m != m ? NAN : m > FLT_MAX ? INFINITY : (float)m;
            uint32_t bits;
            memcpy(&bits, &gain, 4);
            terse__put_u32(out + 4 * (j / g), m != m ? 0x7fc00000u : bits);
            sum = 0;
            in_bucket = 0;
        }
    }
    free(v);
    return 4 * nbuckets + idx_bytes;
}

static void expect_matches_reference(const float *x, size_t n, size_t d, size_t b, size_t bucket) {
    char spec[96];
    snprintf(spec, sizeof spec, "vq:dim=%zu,bits=%zu,bucket=%zu", d, b, bucket);
    terse_codec *c = make(spec, n);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    uint8_t *want = malloc(len);
    size_t g = bucket / d ? bucket / d : 1;
    size_t wlen = ref_encode(x, n, d, b, g, want);
    cr_assert_eq(len - HDR, wlen, "%s, n=%zu: length %zu, reference %zu", spec, n, len - HDR, wlen);
    for (size_t i = 0; i < wlen; i++)
        cr_assert_eq(msg[HDR + i], want[i],
                     "%s, n=%zu: payload byte %zu is 0x%02x, reference 0x%02x", spec, n, i,
                     msg[HDR + i], want[i]);
    free(want);
    free(msg);
    terse_codec_free(c);
}

Test(vq, codebook_is_deterministic_unit_norm_and_the_same_on_every_machine) {
    /* The CRC32C of the first 2048 base codewords, fixed forever: a machine
     * or compiler that builds a different codebook decodes garbage. */
    const struct {
        size_t d;
        uint32_t crc;
    } golden[] = {{2, 0xa6c8eecfu}, {8, 0x4658f728u}, {64, 0xe2967e92u}};
    for (size_t t = 0; t < 3; t++) {
        size_t d = golden[t].d;
        float v[64], w[64];
        uint32_t crc = 0;
        for (uint32_t k = 0; k < 2048; k++) {
            terse__vq_codeword(d, k, v);
            terse__vq_codeword(d, k, w);
            cr_assert_eq(memcmp(v, w, d * sizeof(float)), 0);
            double s = 0;
            for (size_t i = 0; i < d; i++) s += (double)v[i] * v[i];
            cr_assert_lt(fabs(s - 1.0), (double)d * 0x1p-23, "d=%zu k=%u: |v|^2 = %.9f", d, k, s);
            crc = terse__crc32c_update(crc, v, d * sizeof(float));
        }
        cr_expect_eq(crc, golden[t].crc, "d=%zu codebook CRC 0x%08x", d, crc);
    }
    /* Codewords are distinct (no two base vectors equal or opposite). */
    float a[8], b[8];
    for (uint32_t i = 0; i < 128; i++) {
        terse__vq_codeword(8, i, a);
        for (uint32_t j = i + 1; j < 128; j++) {
            terse__vq_codeword(8, j, b);
            cr_assert_lt(fabs(canon(a, b, 8)), 0.999, "codewords %u and %u are (anti)parallel", i,
                         j);
        }
    }
}

Test(vq, every_block_decodes_to_its_gain_times_its_codeword) {
    size_t n = 4099, d = 8, b = 5, g = 64 / 8;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    tu_fill_gauss(x, n, 3);
    terse_codec *c = make("vq:dim=8,bits=5,bucket=64", n);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
    size_t nblocks = (n + d - 1) / d, nbuckets = (nblocks + g - 1) / g, h = 16;
    cr_assert_eq(len, HDR + 4 * nbuckets + (nblocks * b + 7) / 8);
    const uint8_t *bits = msg + HDR + 4 * nbuckets;
    for (size_t j = 0; j < nblocks; j++) {
        uint32_t idx = 0;
        for (size_t t = 0; t < b; t++)
            idx |= (uint32_t)((bits[(j * b + t) / 8] >> ((j * b + t) % 8)) & 1) << t;
        float gain = terse__get_f32(msg + HDR + 4 * (j / g)), v[8];
        cr_assert_geq(gain, 0.0f);
        terse__vq_codeword(d, idx % h, v);
        float a = idx >= h ? -gain : gain;
        for (size_t i = 0; i < d && j * d + i < n; i++) {
            float want = a * v[i];
            cr_assert_eq(memcmp(&y[j * d + i], &want, 4), 0, "block %zu element %zu", j, i);
        }
    }
    free(msg);
    terse_codec_free(c);
    free(x);
    free(y);
}

Test(vq, encoder_picks_the_canonical_codeword_and_gain_at_odd_lengths) {
    /* Byte-identical to the brute-force reference: the sgemm only narrows
     * the search, so no BLAS kernel choice can change a message. */
    static const size_t lens[] = {1, 7, 33, 1000};
    float *x = malloc(1000 * sizeof(float));
    tu_fill_gauss(x, 1000, 9);
    for (size_t i = 0; i < 4; i++) {
        expect_matches_reference(x, lens[i], 8, 8, 1024);
        expect_matches_reference(x, lens[i], 3, 1, 7);
        expect_matches_reference(x, lens[i], 64, 12, 200);
        expect_matches_reference(x, lens[i], 5, 7, 1);
    }
    free(x);
    size_t big = 1000003;
    float *z = malloc(big * sizeof(float));
    tu_fill_gauss(z, big, 10);
    expect_matches_reference(z, big, 8, 8, 1024);
    free(z);
}

Test(vq, special_values_follow_the_canonical_rule) {
    /* Zeros, -0, denormals (whose fp32 scores are all within rounding of
     * each other), huge values (fp32 scores could overflow: canonical search
     * of every codeword), Inf and NaN (index 0, a non-finite gain for their
     * bucket only). Buckets are two blocks of 8. */
    size_t n = 8 * 16;
    float x[8 * 16];
    tu_fill_gauss(x, n, 12);
    for (size_t i = 0; i < 8; i++) x[i] = 0.0f;
    for (size_t i = 8; i < 16; i++) x[i] = -0.0f;
    for (size_t i = 16; i < 24; i++) x[i] = (float)((int)i - 20) * 0x1p-149f;
    for (size_t i = 32; i < 40; i++) x[i] = (i % 3 ? 1 : -1) * 3e38f * (float)(i - 31) / 8;
    x[48] = INFINITY;
    x[64 + 5] = -INFINITY;
    x[80 + 2] = NAN;
    for (size_t i = 96; i < 104; i++) x[i] = FLT_MAX; /* gain past FLT_MAX: +Inf */
    expect_matches_reference(x, n, 8, 8, 16);
    expect_matches_reference(x, n, 8, 3, 16);
    terse_codec *c = make("vq:dim=8,bits=8,bucket=16", n);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    float y[8 * 16];
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
    cr_expect_eq(terse__get_u32(msg + HDR + 4 * 5), 0x7fc00000u,
                 "NaN bucket gain is the canonical NaN");
    cr_expect(isinf(terse__get_f32(msg + HDR + 4 * 3)), "Inf bucket gain");
    cr_expect(isinf(terse__get_f32(msg + HDR + 4 * 6)), "FLT_MAX bucket gain overflows to Inf");
    for (size_t i = 0; i < 8; i++)
        cr_expect(isfinite(y[i]) && y[i] == 0.0f, "zero bucket, element %zu", i);
    for (size_t i = 112; i < 128; i++) cr_expect(isfinite(y[i]), "clean bucket, element %zu", i);
    free(msg);
    terse_codec_free(c);
}

Test(vq, near_ties_are_broken_by_the_canonical_score) {
    /* x = v_a + v_b (and nearly so) scores a and b within rounding of each
     * other in fp32; the choice must still be the canonical one. */
    size_t d = 8, pairs = 200, n = pairs * d;
    float *x = malloc(n * sizeof(float)), va[8], vb[8];
    for (size_t p = 0; p < pairs; p++) {
        terse__vq_codeword(d, (uint32_t)(p % 128), va);
        terse__vq_codeword(d, (uint32_t)((p * 37 + 1) % 128), vb);
        float scale = (p & 1 ? -1.0f : 1.0f) * (1.0f + (float)p);
        for (size_t i = 0; i < d; i++) x[p * d + i] = scale * (va[i] + vb[i]);
    }
    expect_matches_reference(x, n, d, 8, 64);
    free(x);
}

static double rel_err_of(const char *spec, const float *x, size_t n) {
    terse_codec *c = make(spec, n);
    float *y = malloc(n * sizeof(float));
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
    double e = tu_rel_err(x, y, n);
    free(msg);
    free(y);
    terse_codec_free(c);
    return e;
}

Test(vq, relative_error_is_within_the_documented_bounds) {
    /* Bounds from compress/vq.c's table (measured there on 2^20 elements),
     * plus a little slack for these smaller inputs. */
    size_t n = (size_t)1 << 17;
    float *gs = malloc(n * sizeof(float)), *t3 = malloc(n * sizeof(float));
    float *chi = malloc(3 * n * sizeof(float));
    tu_fill_gauss(gs, n, 21);
    tu_fill_gauss(t3, n, 22);
    tu_fill_gauss(chi, 3 * n, 23);
    for (size_t i = 0; i < n; i++) { /* Student t, 3 degrees of freedom */
        double s = ((double)chi[3 * i] * chi[3 * i] + (double)chi[3 * i + 1] * chi[3 * i + 1] +
                    (double)chi[3 * i + 2] * chi[3 * i + 2]) / 3.0;
        t3[i] = (float)(t3[i] / sqrt(s));
    }
    const struct {
        const char *spec;
        double gauss, heavy;
    } cases[] = {
        {"vq:dim=8,bits=8", 0.61, 0.73},
        {"vq:dim=4,bits=4", 0.67, 0.79},
        {"vq:dim=16,bits=8", 0.79, 0.84},
        {"vq:dim=2,bits=2", 0.71, 0.81},
    };
    for (size_t i = 0; i < 4; i++) {
        double eg = rel_err_of(cases[i].spec, gs, n), eh = rel_err_of(cases[i].spec, t3, n);
        cr_expect_lt(eg, cases[i].gauss, "%s on Gaussian: %.4f", cases[i].spec, eg);
        cr_expect_lt(eh, cases[i].heavy, "%s on Student t3: %.4f", cases[i].spec, eh);
        cr_log_info("%s: relative error %.4f Gaussian, %.4f Student t3", cases[i].spec, eg, eh);
    }
    free(gs);
    free(t3);
    free(chi);
}

Test(vq, spec_bits_per_element_and_bound) {
    const struct {
        const char *spec, *canon;
        size_t d, b, g;
    } cases[] = {
        {"vq", "vq:dim=8,bits=8,bucket=1024,ef=0", 8, 8, 128},
        {"vq:dim=16,bits=8,bucket=512", "vq:dim=16,bits=8,bucket=512,ef=0", 16, 8, 32},
        {"vq:dim=6,bits=5", "vq:dim=6,bits=5,bucket=1020,ef=0", 6, 5, 170}, /* rounded down */
        {"vq:dim=8,bucket=3", "vq:dim=8,bits=8,bucket=8,ef=0", 8, 8, 1},    /* at least a block */
        {"vq:dim=64,bits=12,ef=1", "vq:dim=64,bits=12,bucket=1024,ef=1", 64, 12, 16},
    };
    size_t n = 10007;
    for (size_t i = 0; i < 5; i++) {
        terse_codec *c = make(cases[i].spec, n);
        cr_expect_str_eq(terse_codec_spec(c), cases[i].canon);
        terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
        cr_assert_eq(terse_codec_get_traits(c, &t), TERSE_OK);
        double want = (double)cases[i].b / cases[i].d + 32.0 / (double)(cases[i].g * cases[i].d);
        cr_expect_float_eq(t.bits_per_element, want, 1e-12, "%s: %g bits", cases[i].spec,
                           t.bits_per_element);
        cr_expect_eq(t.summable, 0);
        cr_expect_eq(t.randomized, 0);
        size_t nblocks = (n + cases[i].d - 1) / cases[i].d;
        size_t nbuckets = (nblocks + cases[i].g - 1) / cases[i].g;
        size_t bound = 4 * nbuckets + (nblocks * cases[i].b + 7) / 8;
        cr_expect_eq(terse_codec_bound(c), HDR + bound, "%s", cases[i].spec);
        terse_codec_free(c);
    }
    const char *bad[] = {"vq:dim=1", "vq:dim=65", "vq:bits=0", "vq:bits=13", "vq:bucket=0",
                         "vq:bucket=16777217", "vq:seed=1", "vq:dim=x"};
    for (size_t i = 0; i < 8; i++) {
        terse_codec *c = (terse_codec *)1;
        cr_expect_eq(terse_codec_create(bad[i], 100, 1, &c), TERSE_ERR_INVALID, "%s", bad[i]);
        cr_expect_null(c);
    }
}

Test(vq, accumulate_equals_decode_plus_add_bitwise_and_encoding_is_deterministic) {
    size_t n = 5003;
    float *x = malloc(n * sizeof(float)), *base = malloc(n * sizeof(float));
    float *dec = malloc(n * sizeof(float)), *acc = malloc(n * sizeof(float));
    tu_fill_gauss(x, n, 31);
    tu_fill_gauss(base, n, 32);
    terse_codec *c = make("vq:dim=8,bits=6,bucket=256", n);
    terse_codec *c2 = make("vq:dim=8,bits=6,bucket=256", n);
    uint8_t *msg, *msg2;
    size_t len = tu_encode(c, x, &msg), len2 = tu_encode(c2, x, &msg2);
    cr_expect(len == len2 && memcmp(msg, msg2, len) == 0, "two fresh codecs disagree");
    const float alphas[] = {1.0f, -1.0f, 0.37f};
    for (size_t a = 0; a < 3; a++) {
        cr_assert_eq(terse_decode(c, msg, len, dec, alphas[a], 0), TERSE_OK);
        memcpy(acc, base, n * sizeof(float));
        cr_assert_eq(terse_decode(c, msg, len, acc, alphas[a], 1), TERSE_OK);
        for (size_t i = 0; i < n; i++) {
            float want = base[i] + dec[i];
            cr_assert_eq(memcmp(&acc[i], &want, 4), 0, "alpha %g element %zu", alphas[a], i);
        }
    }
    free(msg);
    free(msg2);
    terse_codec_free(c);
    terse_codec_free(c2);
    free(x);
    free(base);
    free(dec);
    free(acc);
}

Test(vq, crafted_payloads_with_bad_length_or_padding_are_corrupt) {
    /* 1001 elements, d = 8: 126 blocks of 5 bits = 630 bits, 2 padding bits. */
    size_t n = 1001;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    tu_fill_gauss(x, n, 41);
    terse_codec *c = make("vq:dim=8,bits=5,bucket=256", n);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg), plen = len - HDR;
    cr_assert_eq(plen, 4 * 4 + 79);
    uint8_t *m = malloc(len);
    memcpy(m, msg, len);
    terse__wire_seal(m, VQ_ID, n, plen - 1); /* one byte short */
    cr_expect_eq(terse_decode(c, m, len - 1, y, 1.0f, 0), TERSE_ERR_CORRUPT);
    terse__wire_seal(m, VQ_ID, n, 0);
    cr_expect_eq(terse_decode(c, m, HDR, y, 1.0f, 0), TERSE_ERR_CORRUPT);
    memcpy(m, msg, len);
    m[len - 1] |= 0x80; /* a padding bit */
    terse__wire_seal(m, VQ_ID, n, plen);
    cr_expect_eq(terse_decode(c, m, len, y, 1.0f, 0), TERSE_ERR_CORRUPT);
    cr_expect_not_null(strstr(terse_last_error(), "padding"), "%s", terse_last_error());

    /* Non-finite gains are legal (a NaN gradient makes them): their bucket
     * decodes to NaN/Inf, the others are untouched. */
    memcpy(m, msg, len);
    terse__put_f32(m + HDR + 4, NAN);
    terse__put_f32(m + HDR + 8, INFINITY);
    terse__wire_seal(m, VQ_ID, n, plen);
    float *ref = malloc(n * sizeof(float));
    cr_assert_eq(terse_decode(c, msg, len, ref, 1.0f, 0), TERSE_OK);
    cr_assert_eq(terse_decode(c, m, len, y, 1.0f, 0), TERSE_OK);
    for (size_t i = 0; i < n; i++) {
        if (i >= 256 && i < 512)
            cr_assert(isnan(y[i]), "element %zu of the NaN bucket is %g", i, y[i]);
        else if (i >= 512 && i < 768)
            cr_assert(!isfinite(y[i]) || y[i] == 0.0f, "element %zu of the Inf bucket", i);
        else
            cr_assert_eq(memcmp(&y[i], &ref[i], 4), 0, "element %zu", i);
    }
    free(ref);
    free(m);
    free(msg);
    terse_codec_free(c);
    free(x);
    free(y);
}

/* Rows of scores with special bit patterns at odd lengths. */
static void fill_scores(float *s, size_t h, uint64_t seed) {
    tu_fill_gauss(s, h, seed);
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu,
                                       0x7f7fffffu, 0xff800000u, 0x7fc00000u, 0xffffffffu};
    for (size_t i = 0; i < h; i += 7) memcpy(&s[i], &special[(i / 7 + seed) % 8], 4);
}

Test(vq, simd_search_kernels_equal_the_scalar_reference) {
    static const size_t lens[] = {1, 7, 15, 16, 17, 33, 128, 1000, 2048};
    unsigned f = terse__cpu_features();
    uint32_t *o1 = malloc((2048 + 16) * 4), *o2 = malloc((2048 + 16) * 4);
    float *s = malloc(2048 * sizeof(float));
    for (size_t li = 0; li < 9; li++) {
        size_t h = lens[li];
        for (uint64_t seed = 0; seed < 8; seed++) {
            fill_scores(s, h, seed);
            if (seed & 1) /* without specials too: NaN would dominate the max */
                for (size_t i = 0; i < h; i++)
                    if (!isfinite(s[i])) s[i] = 1.0f;
            uint32_t m = terse__vq_absmax_scalar(s, h);
            uint32_t thr[4] = {0, m, m ? m - 12345 : 0, 0x3f000000u};
            for (int lvl = 0; lvl < 2; lvl++) {
#if defined(__x86_64__)
                if (!(f & (lvl ? TERSE_CPU_AVX512 : TERSE_CPU_AVX2))) continue;
                terse__vq_absmax_fn amax = lvl ? terse__vq_absmax_avx512 : terse__vq_absmax_avx2;
                terse__vq_above_fn above = lvl ? terse__vq_above_avx512 : terse__vq_above_avx2;
                cr_assert_eq(amax(s, h), m, "level %d h %zu seed %llu", lvl, h,
                             (unsigned long long)seed);
                for (int t = 0; t < 4; t++) {
                    size_t c1 = terse__vq_above_scalar(s, h, thr[t], o1);
                    size_t c2 = above(s, h, thr[t], o2);
                    cr_assert_eq(c1, c2, "level %d h %zu thr %08x", lvl, h, thr[t]);
                    cr_assert_eq(memcmp(o1, o2, c1 * 4), 0);
                }
#else
                (void)f;
                (void)thr;
#endif
            }
        }
    }
    free(o1);
    free(o2);
    free(s);
}
