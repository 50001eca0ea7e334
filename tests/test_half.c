/* fp16 and bf16: the conversions (against an independent reference computed
 * in double), every SIMD version against the scalar reference, the codecs
 * through the public API, and the shared axpy kernel's SIMD version. */
#include <criterion/criterion.h>
#include <fenv.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cpu.h"
#include "common/rng.h"
#include "compress/codec_internal.h"
#include "compress/half_kernels.h"
#include "compress/kernels.h"
#include "compress/wire.h"
#include "testutil.h"

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- an independent reference: round |x| in double ----
 * p significand bits, smallest normal exponent emin, and the magnitude at
 * and above which the result is Inf (the tie between the largest finite
 * value and the next power of two goes to Inf, whose "mantissa" is even). */
static double ref_round(float x, int p, int emin, double inf_at) {
    double ax = fabs((double)x);
    if (ax >= inf_at) return copysign(INFINITY, (double)x);
    if (ax == 0) return (double)x;
    int e;
    frexp(ax, &e);
    e = e - 1 < emin ? emin : e - 1;
    double ulp = ldexp(1.0, e - (p - 1));
    return copysign(nearbyint(ax / ulp) * ulp, (double)x); /* nearbyint: ties to even */
}

static double ref_fp16(float x) { return ref_round(x, 11, -14, 65520.0); }
static double ref_bf16(float x) { return ref_round(x, 8, -126, 0x1.ffp127); }

/* Check one float against the references: same value and same sign for
 * numbers, a quiet NaN of the same sign for NaNs. */
static void check_fp16(float x) {
    uint16_t h = terse__fp16_from_f32(x);
    float y = terse__fp16_to_f32(h);
    if (isnan(x)) {
        cr_assert(isnan(y) && (h & 0x7c00) == 0x7c00 && (h & 0x200),
                  "fp16(%08x) = %04x is not a quiet NaN", bits_of(x), h);
        cr_assert_eq(h >> 15, bits_of(x) >> 31, "fp16(%08x) lost the NaN's sign", bits_of(x));
        return;
    }
    double r = ref_fp16(x);
    cr_assert((double)y == r && signbit(y) == signbit(x),
              "fp16(%a = %08x) = %04x = %a, reference %a", (double)x, bits_of(x), h, (double)y, r);
}

static void check_bf16(float x) {
    uint16_t h = terse__bf16_from_f32(x);
    float y = terse__bf16_to_f32(h);
    if (isnan(x)) {
        cr_assert(isnan(y) && (h & 0x40), "bf16(%08x) = %04x is not a quiet NaN", bits_of(x), h);
        cr_assert_eq(h >> 15, bits_of(x) >> 31, "bf16(%08x) lost the NaN's sign", bits_of(x));
        return;
    }
    double r = ref_bf16(x);
    cr_assert((double)y == r && signbit(y) == signbit(x),
              "bf16(%a = %08x) = %04x = %a, reference %a", (double)x, bits_of(x), h, (double)y, r);
}

/* A float and its neighbours one and two ulps away on each side. */
static void check_around(void (*check)(float), float x) {
    uint32_t u = bits_of(x);
    for (int d = -2; d <= 2; d++) check(float_of(u + (uint32_t)d));
}

/* ---- conversions ---- */

Test(fp16, every_half_converts_to_float_and_back_unchanged) {
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = terse__fp16_to_f32(h);
        uint16_t back = terse__fp16_from_f32(f);
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
            /* NaN: stays NaN of the same sign and payload; a signalling
             * NaN comes back quiet (IEEE conversion, as F16C does). */
            cr_assert(isnan(f), "half %04x decoded to a non-NaN", h);
            cr_assert_eq(back, h | 0x200, "NaN %04x came back as %04x", h, back);
        } else {
            cr_assert_eq(back, h, "half %04x -> %a -> %04x", h, (double)f, back);
        }
    }
}

Test(fp16, decoded_values_are_exact) {
    /* The float of every finite half equals sign * m * 2^(e-25) computed
     * independently; Inf stays Inf. */
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        unsigned e = (h >> 10) & 31, m = h & 0x3ff;
        if (e == 31) {
            if (!m) cr_assert(isinf(terse__fp16_to_f32(h)));
            continue;
        }
        double v = e ? ldexp(1024 + m, (int)e - 25) : ldexp(m, -24);
        if (h & 0x8000) v = -v;
        cr_assert_eq((double)terse__fp16_to_f32(h), v, "half %04x", h);
        cr_assert_eq(signbit(terse__fp16_to_f32(h)) != 0, (h & 0x8000) != 0);
    }
}

Test(fp16, rounds_to_nearest_even_at_ties_boundaries_and_subnormals) {
    cr_expect_eq(terse__fp16_from_f32(65504.0f), 0x7bff);
    cr_expect_eq(terse__fp16_from_f32(65519.996f), 0x7bff);
    cr_expect_eq(terse__fp16_from_f32(65520.0f), 0x7c00); /* the tie goes to Inf */
    cr_expect_eq(terse__fp16_from_f32(-65520.0f), 0xfc00);
    cr_expect_eq(terse__fp16_from_f32(1e10f), 0x7c00);
    cr_expect_eq(terse__fp16_from_f32(INFINITY), 0x7c00);
    cr_expect_eq(terse__fp16_from_f32(-INFINITY), 0xfc00);
    cr_expect_eq(terse__fp16_from_f32(-0.0f), 0x8000);
    cr_expect_eq(terse__fp16_from_f32(0.0f), 0x0000);
    cr_expect_eq(terse__fp16_from_f32(1.0f + 0x1p-11f), 0x3c00); /* tie, even down */
    cr_expect_eq(terse__fp16_from_f32(1.0f + 3 * 0x1p-11f), 0x3c02); /* tie, even up */
    cr_expect_eq(terse__fp16_from_f32(0x1p-24f), 0x0001); /* smallest subnormal */
    cr_expect_eq(terse__fp16_from_f32(0x1p-25f), 0x0000); /* tie to even: 0 */
    cr_expect_eq(terse__fp16_from_f32(-0x1p-25f), 0x8000);
    cr_expect_eq(terse__fp16_from_f32(0x1.000002p-25f), 0x0001); /* just above the tie */
    cr_expect_eq(terse__fp16_from_f32(3 * 0x1p-25f), 0x0002); /* tie to even: 2 */
    cr_expect_eq(terse__fp16_from_f32(0x1p-14f - 0x1p-25f), 0x0400); /* carries to normal */
    cr_expect_eq(terse__fp16_from_f32(FLT_TRUE_MIN), 0x0000); /* float subnormal */
    cr_expect_eq(terse__fp16_from_f32(-FLT_TRUE_MIN), 0x8000);
    cr_expect_eq(terse__fp16_from_f32(float_of(0x7f800001)), 0x7e00); /* payload in low bits */
    cr_expect_eq(terse__fp16_from_f32(float_of(0xffc00000)), 0xfe00);

    /* Every midpoint between adjacent halves, and the floats around it. */
    for (uint32_t h = 0; h < 0x7c00; h++) {
        double lo = terse__fp16_to_f32((uint16_t)h);
        double hi = h + 1 < 0x7c00 ? terse__fp16_to_f32((uint16_t)(h + 1)) : 65536.0;
        float mid = (float)((lo + hi) / 2); /* exact: halves have 11 bits */
        check_around(check_fp16, mid);
        check_around(check_fp16, -mid);
        check_around(check_fp16, (float)lo);
    }
}

Test(fp16, random_floats_round_as_the_double_reference_does) {
    uint64_t key = terse__rng_key(11, 0, 0, 0);
    for (uint64_t i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)terse__rng_u64(key, i);
        if (i & 1) u = (u & 0x87ffffffu) | 0x30000000u; /* concentrate on the half range */
        check_fp16(float_of(u));
    }
}

Test(bf16, every_bf16_converts_to_float_and_back_unchanged) {
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = terse__bf16_to_f32(h);
        cr_assert_eq(bits_of(f), (uint32_t)h << 16);
        uint16_t back = terse__bf16_from_f32(f);
        if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) {
            cr_assert(isnan(f));
            cr_assert_eq(back, h | 0x40, "NaN %04x came back as %04x", h, back);
        } else {
            cr_assert_eq(back, h, "bf16 %04x -> %a -> %04x", h, (double)f, back);
        }
    }
}

Test(bf16, rounds_to_nearest_even_at_ties_boundaries_and_subnormals) {
    cr_expect_eq(terse__bf16_from_f32(1.0f + 0x1p-8f), 0x3f80); /* tie, even down */
    cr_expect_eq(terse__bf16_from_f32(1.0f + 3 * 0x1p-8f), 0x3f82); /* tie, even up */
    cr_expect_eq(terse__bf16_from_f32(FLT_MAX), 0x7f80); /* above the last tie */
    cr_expect_eq(terse__bf16_from_f32(float_of(0x7f7f8000)), 0x7f80); /* the tie goes to Inf */
    cr_expect_eq(terse__bf16_from_f32(float_of(0x7f7f7fff)), 0x7f7f);
    cr_expect_eq(terse__bf16_from_f32(-FLT_MAX), 0xff80);
    cr_expect_eq(terse__bf16_from_f32(INFINITY), 0x7f80);
    cr_expect_eq(terse__bf16_from_f32(-0.0f), 0x8000);
    cr_expect_eq(terse__bf16_from_f32(float_of(0x00008000)), 0x0000); /* subnormal tie, even */
    cr_expect_eq(terse__bf16_from_f32(float_of(0x00018000)), 0x0002); /* subnormal tie, even up */
    cr_expect_eq(terse__bf16_from_f32(float_of(0x00008001)), 0x0001); /* not flushed */
    cr_expect_eq(terse__bf16_from_f32(float_of(0x007fffff)), 0x0080); /* carries to normal */
    cr_expect_eq(terse__bf16_from_f32(float_of(0x7f800001)), 0x7fc0); /* NaN, never Inf */
    cr_expect_eq(terse__bf16_from_f32(float_of(0xffffffff)), 0xffff);
    cr_expect_eq(terse__bf16_from_f32(float_of(0xff800001)), 0xffc0);

    for (uint32_t h = 0; h < 0x7f80; h += 7) {
        double lo = terse__bf16_to_f32((uint16_t)h);
        double hi = h + 1 < 0x7f80 ? terse__bf16_to_f32((uint16_t)(h + 1)) : 0x1p128;
        float mid = (float)((lo + hi) / 2); /* exact: bf16 has 8 bits */
        check_around(check_bf16, mid);
        check_around(check_bf16, -mid);
    }
    check_around(check_bf16, float_of(0x7f7f8000));
}

Test(bf16, random_floats_round_as_the_double_reference_does) {
    uint64_t key = terse__rng_key(12, 0, 0, 0);
    for (uint64_t i = 0; i < 2000000; i++) check_bf16(float_of((uint32_t)terse__rng_u64(key, i)));
}

Test(half, rounding_ignores_the_floating_point_rounding_mode) {
    enum { N = 4096 };
    static float x[N];
    static uint8_t want[2][2 * N], got[2][2 * N];
    tu_fill_gauss(x, N, 5);
    for (size_t i = 0; i < N; i += 3) x[i] *= 0x1p-20f; /* half subnormals too */
    terse__fp16_encode_scalar(want[0], x, N);
    terse__bf16_encode_scalar(want[1], x, N);
    const int modes[] = {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO};
    for (int m = 0; m < 3; m++) {
        cr_assert_eq(fesetround(modes[m]), 0);
        terse__fp16_encode_scalar(got[0], x, N);
        terse__bf16_encode_scalar(got[1], x, N);
        int same = !memcmp(want, got, sizeof want);
        terse__fp16_encode(got[0], x, N); /* the dispatched (SIMD) version */
        terse__bf16_encode(got[1], x, N);
        same = same && !memcmp(want, got, sizeof want);
        fesetround(FE_TONEAREST);
        cr_assert(same, "rounding mode %d changed the encoding", modes[m]);
    }
}

/* ---- SIMD versions against the scalar reference ---- */

typedef void enc_fn(uint8_t *, const float *, size_t);
typedef void dec_fn(float *, const uint8_t *, size_t, float, int);

typedef struct {
    const char *name;
    enc_fn *enc[2]; /* fp16, bf16 */
    dec_fn *dec[2];
} level;

static size_t simd_levels(level *out) {
    size_t k = 0;
#if defined(__x86_64__)
    unsigned f = terse__cpu_features();
    if (f & TERSE_CPU_AVX2)
        out[k++] = (level){"avx2",
                           {terse__fp16_encode_avx2, terse__bf16_encode_avx2},
                           {terse__fp16_decode_avx2, terse__bf16_decode_avx2}};
    if (f & TERSE_CPU_AVX512)
        out[k++] = (level){"avx512",
                           {terse__fp16_encode_avx2, terse__bf16_encode_avx2}, /* no 512 encoders */
                           {terse__fp16_decode_avx512, terse__bf16_decode_avx512}};
#endif
    (void)out;
    return k;
}

static enc_fn *const scalar_enc[2] = {terse__fp16_encode_scalar, terse__bf16_encode_scalar};
static dec_fn *const scalar_dec[2] = {terse__fp16_decode_scalar, terse__bf16_decode_scalar};

/* Random bit patterns (so every NaN payload, Inf, subnormal and sign
 * appears) with the interesting values sprinkled in. */
static void fill_special(float *x, size_t n, uint64_t seed) {
    static const uint32_t special[] = {
        0x00000000, 0x80000000, 0x00000001, 0x807fffff, 0x00800000, 0x477fe000, 0x477ff000,
        0x477fefff, 0x33800000, 0x33000000, 0x33000001, 0x387fc000, 0x7f800000, 0xff800000,
        0x7fc00000, 0x7f800001, 0xffbfffff, 0x7f802000, 0x7f7fffff, 0x7f7f8000, 0x7f7f7fff,
        0x3f808000, 0x3f818000, 0x00008000, 0x00018000};
    uint32_t sub = terse__rng_subkey(terse__rng_key(seed, 0, 0, 0), 0);
    for (size_t i = 0; i < n; i++) {
        uint32_t r = terse__rng_u32(sub, (uint32_t)i);
        x[i] = float_of(r % 5 == 0 ? special[(r >> 8) % (sizeof special / sizeof special[0])]
                                   : terse__rng_u32(sub ^ 0xabcdu, (uint32_t)i));
    }
}

static const size_t odd_lengths[] = {1, 7, 15, 16, 17, 31, 33, 1000, 1000003};

Test(half, simd_encode_equals_scalar_bitwise) {
    level lv[2];
    size_t nl = simd_levels(lv);
    if (!nl) cr_skip_test("no SIMD level enabled (CPU or TERSE_SIMD)");
    size_t nmax = 1000003;
    float *x = malloc(nmax * 4 + 4);
    uint8_t *a = malloc(nmax * 2 + 1), *b = malloc(nmax * 2 + 1);
    fill_special(x, nmax + 1, 21);
    for (size_t li = 0; li < nl; li++)
        for (int c = 0; c < 2; c++)
            for (size_t t = 0; t < sizeof odd_lengths / sizeof odd_lengths[0]; t++) {
                size_t n = odd_lengths[t];
                /* Odd offsets: misaligned source and destination. */
                scalar_enc[c](a + 1, x + 1, n);
                lv[li].enc[c](b + 1, x + 1, n);
                cr_assert_eq(memcmp(a + 1, b + 1, 2 * n), 0, "%s %s encode, n = %zu",
                             lv[li].name, c ? "bf16" : "fp16", n);
            }
    free(x);
    free(a);
    free(b);
}

Test(half, simd_decode_and_accumulate_equal_scalar_bitwise) {
    level lv[2];
    size_t nl = simd_levels(lv);
    if (!nl) cr_skip_test("no SIMD level enabled (CPU or TERSE_SIMD)");
    size_t nmax = 1000003;
    uint8_t *p = malloc(nmax * 2 + 1);
    float *base = malloc(nmax * 4), *a = malloc(nmax * 4), *b = malloc(nmax * 4);
    uint32_t sub = terse__rng_subkey(terse__rng_key(22, 0, 0, 0), 0);
    for (size_t i = 0; i < nmax * 2 + 1; i++) p[i] = (uint8_t)terse__rng_u32(sub, (uint32_t)i);
    /* Accumulate into finite values (Inf, subnormals and -0 included): when
     * both addends are NaN, x86 returns the first operand's payload and a
     * compiler may commute the add, so only NaN + NaN is not pinned. */
    fill_special(base, nmax, 23);
    for (size_t i = 0; i < nmax; i++)
        if (isnan(base[i])) base[i] = (float)i;
    const float alphas[] = {1.0f, -1.0f, 0.37f, 0x1p-130f, 1e30f};
    for (size_t li = 0; li < nl; li++)
        for (int c = 0; c < 2; c++)
            for (size_t t = 0; t < sizeof odd_lengths / sizeof odd_lengths[0]; t++)
                for (size_t ai = 0; ai < sizeof alphas / sizeof alphas[0]; ai++)
                    for (int acc = 0; acc < 2; acc++) {
                        size_t n = odd_lengths[t];
                        if (n > 2000 && ai > 1) continue; /* keep the run short */
                        memcpy(a, base, n * 4);
                        memcpy(b, base, n * 4);
                        scalar_dec[c](a, p + 1, n, alphas[ai], acc);
                        lv[li].dec[c](b, p + 1, n, alphas[ai], acc);
                        cr_assert_eq(memcmp(a, b, 4 * n), 0,
                                     "%s %s decode, n = %zu, alpha = %g, accumulate = %d",
                                     lv[li].name, c ? "bf16" : "fp16", n, (double)alphas[ai], acc);
                    }
    free(p);
    free(base);
    free(a);
    free(b);
}

Test(half, simd_decodes_every_half_pattern_as_scalar_does) {
    level lv[2];
    size_t nl = simd_levels(lv);
    if (!nl) cr_skip_test("no SIMD level enabled (CPU or TERSE_SIMD)");
    uint8_t p[2 * 65536];
    for (uint32_t i = 0; i < 65536; i++) {
        p[2 * i] = (uint8_t)i;
        p[2 * i + 1] = (uint8_t)(i >> 8);
    }
    static float a[65536], b[65536];
    for (size_t li = 0; li < nl; li++)
        for (int c = 0; c < 2; c++) {
            scalar_dec[c](a, p, 65536, 1.0f, 0);
            lv[li].dec[c](b, p, 65536, 1.0f, 0);
            cr_assert_eq(memcmp(a, b, sizeof a), 0, "%s %s", lv[li].name, c ? "bf16" : "fp16");
        }
}

/* ---- the codecs through the public API ---- */

static terse_codec *make(const char *spec, size_t n) {
    terse_codec *c = NULL;
    cr_assert_eq(terse_codec_create(spec, n, 1, &c), TERSE_OK, "%s: %s", spec, terse_last_error());
    return c;
}

Test(half, codecs_report_their_shape_and_traits) {
    const char *names[] = {"fp16", "bf16"};
    for (int k = 0; k < 2; k++) {
        terse_codec *c = make(names[k], 1001);
        cr_expect_eq(terse_codec_bound(c), 32 + 2 * 1001);
        char want[32];
        snprintf(want, sizeof want, "%s:ef=0", names[k]);
        cr_expect_str_eq(terse_codec_spec(c), want);
        terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
        cr_assert_eq(terse_codec_get_traits(c, &t), TERSE_OK);
        cr_expect_eq(t.id, k ? TERSE_ID_BF16 : TERSE_ID_FP16);
        cr_expect_str_eq(t.name, names[k]);
        cr_expect_eq(t.summable, 0);
        cr_expect_eq(t.randomized, 0);
        cr_expect_eq(t.bits_per_element, 16.0);
        terse_codec_free(c);
    }
}

Test(fp16, round_trip_error_is_within_half_an_ulp) {
    size_t n = 100003;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    /* Log-uniform magnitudes over the normal range [2^-14, 65504], random
     * signs, then a stretch of subnormal-range values. */
    tu_fill_uniform(x, n, 31, -14.0f, 15.99f);
    for (size_t i = 0; i < n; i++) {
        float m = exp2f(x[i]);
        x[i] = (i & 1) ? -m : m;
        if (i % 10 == 0) x[i] = x[i] * 0x1p-30f; /* below 2^-14 */
    }
    terse_codec *c = make("fp16", n);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_assert_eq(len, 32 + 2 * n);
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK, "%s", terse_last_error());
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)y[i] - x[i]);
        if (fabsf(x[i]) >= 0x1p-14f)
            cr_assert_leq(err, 0x1p-11 * fabs((double)x[i]), "x = %a, y = %a", (double)x[i],
                          (double)y[i]);
        else
            cr_assert_leq(err, 0x1p-25, "x = %a, y = %a", (double)x[i], (double)y[i]);
    }
    free(msg);
    free(x);
    free(y);
    terse_codec_free(c);
}

Test(bf16, round_trip_error_is_within_half_an_ulp) {
    size_t n = 100003;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    tu_fill_uniform(x, n, 32, -126.0f, 127.99f);
    for (size_t i = 0; i < n; i++) x[i] = (i & 1) ? -exp2f(x[i]) : exp2f(x[i]);
    terse_codec *c = make("bf16", n);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK, "%s", terse_last_error());
    for (size_t i = 0; i < n; i++) {
        if (isinf(y[i])) { /* only within half an ulp of FLT_MAX */
            cr_assert_geq(fabsf(x[i]), float_of(0x7f7f8000), "x = %a", (double)x[i]);
            continue;
        }
        cr_assert_leq(fabs((double)y[i] - x[i]), 0x1p-8 * fabs((double)x[i]), "x = %a, y = %a",
                      (double)x[i], (double)y[i]);
    }
    free(msg);
    free(x);
    free(y);
    terse_codec_free(c);
}

Test(half, accumulate_equals_decode_then_add_bitwise) {
    const char *names[] = {"fp16", "bf16"};
    size_t n = 10007;
    float *x = malloc(n * 4), *d = malloc(n * 4), *acc = malloc(n * 4);
    fill_special(x, n, 41);
    for (int k = 0; k < 2; k++) {
        terse_codec *c = make(names[k], n);
        uint8_t *msg;
        size_t len = tu_encode(c, x, &msg);
        tu_fill_gauss(acc, n, 42);
        float *want = malloc(n * 4);
        cr_assert_eq(terse_decode(c, msg, len, d, -0.75f, 0), TERSE_OK);
        for (size_t i = 0; i < n; i++) want[i] = acc[i] + d[i];
        cr_assert_eq(terse_decode(c, msg, len, acc, -0.75f, 1), TERSE_OK);
        cr_expect_eq(memcmp(acc, want, n * 4), 0, "%s", names[k]);
        free(want);
        free(msg);
        terse_codec_free(c);
    }
    free(x);
    free(d);
    free(acc);
}

Test(half, encodes_are_deterministic_across_fresh_codecs) {
    const char *names[] = {"fp16", "bf16", "fp16:ef=1", "bf16:ef=1"};
    size_t n = 5003;
    float *x = malloc(n * 4);
    tu_fill_gauss(x, n, 51);
    for (int k = 0; k < 4; k++) {
        terse_codec *c1 = make(names[k], n), *c2 = make(names[k], n);
        uint8_t *m1, *m2;
        size_t l1 = tu_encode(c1, x, &m1), l2 = tu_encode(c2, x, &m2);
        cr_assert_eq(l1, l2);
        cr_expect_eq(memcmp(m1, m2, l1), 0, "%s", names[k]);
        free(m1);
        free(m2);
        terse_codec_free(c1);
        terse_codec_free(c2);
    }
    free(x);
}

Test(half, payload_of_the_wrong_length_is_corrupt_and_leaves_dst_alone) {
    const char *names[] = {"fp16", "bf16"};
    size_t n = 100;
    const size_t bad_lengths[] = {0, 1, 2 * n - 2, 2 * n - 1};
    for (int k = 0; k < 2; k++) {
        terse_codec *c = make(names[k], n);
        for (size_t t = 0; t < sizeof bad_lengths / sizeof bad_lengths[0]; t++) {
            size_t plen = bad_lengths[t];
            uint8_t msg[32 + 200];
            memset(msg + 32, 0x3c, plen);
            /* A valid CRC: only the length is wrong. */
            terse__wire_seal(msg, k ? TERSE_ID_BF16 : TERSE_ID_FP16, n, plen);
            float dst[100];
            for (size_t i = 0; i < n; i++) dst[i] = 7.0f;
            terse_status s = terse_decode(c, msg, 32 + plen, dst, 1.0f, 1);
            cr_expect_eq(s, TERSE_ERR_CORRUPT, "%s, %zu-byte payload: %s", names[k], plen,
                         terse_status_name(s));
            cr_expect_not_null(strstr(terse_last_error(), "payload length"), "%s",
                               terse_last_error());
            for (size_t i = 0; i < n; i++) cr_assert_eq(dst[i], 7.0f);
        }
        terse_codec_free(c);
    }
}

/* ---- the shared axpy kernel (the `none` codec's decode) ---- */

Test(kernels, axpy_simd_equals_scalar_bitwise) {
#if defined(__x86_64__)
    if (!(terse__cpu_features() & TERSE_CPU_AVX2)) cr_skip_test("AVX2 not enabled (CPU or TERSE_SIMD)");
    size_t nmax = 1000003;
    float *src = malloc(nmax * 4 + 4), *base = malloc(nmax * 4), *a = malloc(nmax * 4),
          *b = malloc(nmax * 4);
    fill_special(src, nmax + 1, 61);
    fill_special(base, nmax, 62);
    for (size_t i = 0; i < nmax; i++)
        if (isnan(base[i])) base[i] = -(float)i; /* see simd_decode_and_accumulate */
    const float alphas[] = {1.0f, -1.0f, 0.37f, 0x1p-130f};
    for (size_t t = 0; t < sizeof odd_lengths / sizeof odd_lengths[0]; t++)
        for (size_t ai = 0; ai < sizeof alphas / sizeof alphas[0]; ai++)
            for (int acc = 0; acc < 2; acc++) {
                size_t n = odd_lengths[t];
                const uint8_t *s = (const uint8_t *)src + 2; /* misaligned */
                memcpy(a, base, n * 4);
                memcpy(b, base, n * 4);
                terse__kernel_axpy_f32_scalar(a, s, n, alphas[ai], acc);
                terse__kernel_axpy_f32_avx2(b, s, n, alphas[ai], acc);
                cr_assert_eq(memcmp(a, b, 4 * n), 0, "n = %zu, alpha = %g, accumulate = %d", n,
                             (double)alphas[ai], acc);
            }
    free(src);
    free(base);
    free(a);
    free(b);
#else
    cr_skip_test("no SIMD version off x86-64");
#endif
}
