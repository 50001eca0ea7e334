/* terngrad: each element becomes s*sign(x) with probability |x|/s, else 0,
 * with s = max|x| per bucket. It runs on the same engine and kernels as
 * qsgd (test_qsgd.c compares those kernels across SIMD levels at every
 * width, 2 bits included); here: the scale, the ternary grid, and the
 * codec's own contract. Fixed seeds throughout. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/cpu.h"
#include "compress/codec_internal.h"
#include "compress/squant_kernels.h"
#include "compress/wire.h"
#include "testutil.h"

static terse_codec *make(const char *spec, size_t n) {
    terse_codec *c = NULL;
    cr_assert_eq(terse_codec_create(spec, n, 1, &c), TERSE_OK, "%s: %s", spec, terse_last_error());
    return c;
}

static float wire_scale(const uint8_t *msg, size_t b) {
    return terse__get_f32(msg + TERSE_WIRE_HEADER_SIZE + 4 * b);
}

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float absmax(const float *x, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

Test(terngrad, canonical_spec_traits_and_exact_bound) {
    terse_codec *c = make("terngrad", 1000);
    cr_expect_str_eq(terse_codec_spec(c), "terngrad:bucket=512,lsq=0,round=stochastic,ef=0,seed=0");
    /* 2 fp32 scales, then 128 + 122 bytes of 2-bit codes */
    cr_expect_eq(terse_codec_bound(c), 32 + 8 + 128 + 122);
    terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
    cr_assert_eq(terse_codec_get_traits(c, &t), TERSE_OK);
    cr_expect(t.randomized);
    cr_expect(!t.summable);
    terse_codec_free(c);
}

Test(terngrad, bad_specs_are_invalid_and_name_the_token) {
    tu_expect_bad_spec("terngrad:bucket=7", "bucket=7");
    tu_expect_bad_spec("terngrad:bucket=0", "bucket=0");
    tu_expect_bad_spec("terngrad:bucket=16777217", "bucket=16777217");
    tu_expect_bad_spec("terngrad:bits=2", "bits");
    tu_expect_bad_spec("terngrad:lsq=2", "lsq=2");
    tu_expect_bad_spec("terngrad:lsq=x", "lsq=x");
    tu_expect_bad_spec("terngrad:ef=1,lsq=yes", "lsq=yes");
    tu_expect_bad_spec("terngrad:round=up", "round=up");
    tu_expect_bad_spec("terngrad:round=", "round=");
    tu_expect_bad_spec("terngrad:ef=1,round=1", "round=1");
}

/* ------------------------------------------------------------ lsq */

Test(terngrad, lsq_and_nearest_are_the_defaults_only_with_ef_and_are_in_the_canonical_spec) {
    static const char *const cases[][2] = {
        {"terngrad:ef=1", "terngrad:bucket=512,lsq=1,round=nearest,ef=1,seed=0"},
        {"terngrad:ef=1,lsq=0", "terngrad:bucket=512,lsq=0,round=nearest,ef=1,seed=0"},
        {"terngrad:lsq=1,bucket=64", "terngrad:bucket=64,lsq=1,round=stochastic,ef=0,seed=0"},
        {"terngrad:ef=1,round=stochastic",
         "terngrad:bucket=512,lsq=1,round=stochastic,ef=1,seed=0"},
        {"terngrad:round=nearest,seed=3", "terngrad:bucket=512,lsq=0,round=nearest,ef=0,seed=3"},
    };
    tu_expect_canonical_specs(cases, sizeof cases / sizeof cases[0], 100);
}

/* Without ef the default is lsq=0 with stochastic rounding, the unbiased
 * encoder the tests below check: the same bytes as an explicit
 * lsq=0,round=stochastic, step after step. With ef=1 the defaults are
 * lsq=1,round=nearest. */
Test(terngrad, the_default_messages_are_those_of_the_explicit_defaults) {
    enum { N = 1300 };
    static float x[N];
    const char *pairs[][2] = {
        {"terngrad:bucket=128,seed=8", "terngrad:bucket=128,seed=8,lsq=0,round=stochastic"},
        {"terngrad:bucket=128,seed=8,ef=1", "terngrad:bucket=128,seed=8,ef=1,lsq=1,round=nearest"},
    };
    for (size_t k = 0; k < 2; k++) {
        terse_codec *a = make(pairs[k][0], N), *b = make(pairs[k][1], N);
        for (uint64_t t = 0; t < 3; t++) {
            tu_fill_gauss(x, N, 40 + t);
            uint8_t *ma, *mb;
            size_t la = tu_encode(a, x, &ma), lb = tu_encode(b, x, &mb);
            cr_assert(la == lb && memcmp(ma, mb, la) == 0, "%s step %llu: messages differ",
                      pairs[k][1], (unsigned long long)t);
            free(ma);
            free(mb);
        }
        terse_codec_free(a);
        terse_codec_free(b);
    }
}

/* With lsq=1 the signs kept are those lsq=0 draws or rounds (same seed,
 * step and rounding mode: the code bytes match), each scale is the mean |x|
 * over the elements kept (the least-squares scale at L = 1), and so every
 * bucket contracts: ||x - D(C(x))|| <= ||x||, and no worse than with
 * s = max|x|. The unbiased scale breaks that bound on a bucket with one
 * spike, so the check can fail; nearest rounding at s = max|x| keeps it
 * (an element is kept only when |x| >= s/2). Buckets: gaussian, a spike,
 * all negative, zeros of both signs among values, then an all-zero and a
 * NaN bucket. */
static void check_lsq_contraction(const char *round) {
    enum { N = 1000, B = 96, NB = 11, T = 8 };
    static float x[N], y0[N], y1[N];
    int nearest = strcmp(round, "nearest") == 0;
    char s0[96], s1[96];
    snprintf(s0, sizeof s0, "terngrad:bucket=96,seed=5,lsq=0,round=%s", round);
    snprintf(s1, sizeof s1, "terngrad:bucket=96,seed=5,lsq=1,round=%s", round);
    terse_codec *c0 = make(s0, N), *c1 = make(s1, N);
    double worst0 = 0, worst1 = 0;
    for (uint64_t t = 0; t < T; t++) {
        tu_fill_gauss(x, N, 60 + t);
        for (size_t i = 0; i < N; i++) {
            size_t b = i / B, j = i % B;
            if (b == 7 || (b % 4 == 3 && j % 3)) x[i] = (j & 1) ? -0.0f : 0.0f;
            if (b == 8 && j == 5) x[i] = NAN;
            if (b % 4 == 1 && j == 3) x[i] *= 50.0f;
            if (b % 4 == 2) x[i] = -fabsf(x[i]);
        }
        uint8_t *m0, *m1;
        size_t len = tu_encode(c0, x, &m0), codes = 32 + 4 * NB;
        cr_assert_eq(tu_encode(c1, x, &m1), len, "lsq changes the message size");
        cr_assert_eq(memcmp(m0 + codes, m1 + codes, len - codes), 0, "%s: lsq changed the signs",
                     s1);
        cr_assert_eq(terse_decode(c0, m0, len, y0, 1.0f, 0), TERSE_OK);
        cr_assert_eq(terse_decode(c1, m1, len, y1, 1.0f, 0), TERSE_OK);
        for (size_t b = 0; b < NB; b++) {
            size_t lo = b * B, hi = lo + B < N ? lo + B : N;
            float sc0 = wire_scale(m0, b), sc1 = wire_scale(m1, b);
            if (sc0 == 0 || isnan(sc0)) { /* special buckets are left alone */
                cr_assert_eq(f2u(sc1), f2u(sc0), "%s bucket %zu", s1, b);
                continue;
            }
            double kept = 0, count = 0, e0 = 0, e1 = 0, x2 = 0;
            for (size_t i = lo; i < hi; i++) {
                if (y0[i] != 0) {
                    kept += fabs((double)x[i]);
                    count++;
                }
                e0 += ((double)x[i] - y0[i]) * ((double)x[i] - y0[i]);
                e1 += ((double)x[i] - y1[i]) * ((double)x[i] - y1[i]);
                x2 += (double)x[i] * x[i];
            }
            /* to one fp32 ulp: the codec sums in another order */
            double want = count > 0 ? kept / count : sc0;
            cr_assert(fabs(sc1 - want) <= 0x1p-23 * want, "%s bucket %zu: scale %a, want %a", s1,
                      b, (double)sc1, want);
            cr_assert(e1 <= x2 * (1 + 1e-6), "%s bucket %zu: ||x-D||^2 %g > ||x||^2 %g", s1, b,
                      e1, x2);
            cr_assert(e1 <= e0 * (1 + 1e-6), "%s bucket %zu: lsq error %g above max|x|'s %g", s1,
                      b, e1, e0);
            if (nearest)
                cr_assert(e0 <= x2 * (1 + 1e-6), "%s bucket %zu: ||x-D||^2 %g > ||x||^2 %g", s0,
                          b, e0, x2);
            worst0 = fmax(worst0, e0 / x2);
            worst1 = fmax(worst1, e1 / x2);
        }
        free(m0);
        free(m1);
    }
    cr_log_info("round=%s: worst ||x-D||^2/||x||^2: max|x| %.3g, lsq %.3g", round, worst0, worst1);
    if (!nearest)
        cr_expect(worst0 > 2, "the unbiased scale contracted (worst ratio %g)", worst0);
    terse_codec_free(c0);
    terse_codec_free(c1);
}

Test(terngrad, least_squares_scales_make_every_bucket_a_contraction) {
    check_lsq_contraction("stochastic");
}

Test(terngrad, least_squares_scales_of_nearest_signs_make_every_bucket_a_contraction) {
    check_lsq_contraction("nearest");
}

/* The format does not change: a codec created without lsq and with
 * stochastic rounding decodes an lsq, nearest-rounded message to the same
 * bits as one created with both, plain and accumulated (ef=1 turns both
 * on). */
Test(terngrad, an_lsq_nearest_message_decodes_the_same_in_a_stochastic_codec_without_lsq) {
    enum { N = 1111 };
    static float x[N], ya[N], yb[N];
    tu_fill_gauss(x, N, 71);
    terse_codec *enc = make("terngrad:bucket=64,ef=1", N);
    terse_codec *with = make("terngrad:bucket=64,lsq=1,round=nearest", N);
    terse_codec *without = make("terngrad:bucket=64", N);
    cr_assert_eq(terse_codec_bound(enc), terse_codec_bound(without));
    uint8_t *m;
    size_t len = tu_encode(enc, x, &m);
    for (int acc = 0; acc < 2; acc++) {
        for (size_t i = 0; i < N; i++) ya[i] = yb[i] = (float)i;
        cr_assert_eq(terse_decode(with, m, len, ya, -1.0f, acc), TERSE_OK);
        cr_assert_eq(terse_decode(without, m, len, yb, -1.0f, acc), TERSE_OK, "%s",
                     terse_last_error());
        cr_expect_eq(memcmp(ya, yb, sizeof ya), 0, "acc=%d: decodes differ", acc);
    }
    free(m);
    terse_codec_free(enc);
    terse_codec_free(with);
    terse_codec_free(without);
}

/* Sum over coordinates of sign(x)*(mean - x), over its standard error. */
static double magnitude_bias_z(const double *mean, const float *x, const double *var, size_t n,
                               int T) {
    double agg = 0, v = 0;
    for (size_t i = 0; i < n; i++) {
        agg += x[i] < 0 ? x[i] - mean[i] : mean[i] - x[i];
        v += var[i] / T;
    }
    return agg / sqrt(v);
}

/* Largest |mean - x| over its standard error, among coordinates with
 * variance; zero-variance coordinates must be exact (else +Inf). */
static double worst_coordinate_z(const double *mean, const float *x, const double *var, size_t n,
                                 int T) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(mean[i] - x[i]);
        if (var[i] > 0)
            worst = fmax(worst, d / sqrt(var[i] / T));
        else if (d > 1e-6 * fabs(x[i]))
            return INFINITY;
    }
    return worst;
}

Test(terngrad, is_unbiased_over_many_steps_and_the_check_rejects_biased_rounding) {
    enum { N = 600, B = 200, T = 3000 };
    static float x[N], y[N];
    static double mean[N], var[N], alt[N];
    tu_fill_gauss(x, N, 21);
    x[7] = 0.0f;
    terse_codec *c = make("terngrad:bucket=200,seed=4", N);
    size_t cap = terse_codec_bound(c), len;
    uint8_t *msg = malloc(cap);
    for (int t = 0; t < T; t++) {
        cr_assert_eq(terse_encode(c, x, msg, cap, &len), TERSE_OK);
        cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
        for (size_t i = 0; i < N; i++) mean[i] += y[i] / (double)T;
    }
    for (size_t i = 0; i < N; i++) {
        double s = wire_scale(msg, i / B), a = fabs((double)x[i]);
        var[i] = a * (s - a); /* Bernoulli(|x|/s) scaled by s */
    }
    double z = magnitude_bias_z(mean, x, var, N, T), w = worst_coordinate_z(mean, x, var, N, T);
    cr_expect(fabs(z) < 4.5, "aggregate bias z = %.2f", z);
    /* 600 coordinates: a 5-sigma maximum is already unlikely by chance */
    cr_expect(w < 5.5, "worst coordinate is %.2f standard errors off", w);
    /* Rounding with probability (|x|/s)^0.9 -- slightly too often -- and
     * floor rounding (never up unless |x| = s) both fail the same checks. */
    for (size_t i = 0; i < N; i++) {
        double s = wire_scale(msg, i / B), p = fabs((double)x[i]) / s;
        alt[i] = copysign(s * pow(p, 0.9), x[i]);
    }
    cr_expect(fabs(magnitude_bias_z(alt, x, var, N, T)) >= 4.5, "a 10%% biased rounding passed");
    for (size_t i = 0; i < N; i++)
        alt[i] = fabs(x[i]) == wire_scale(msg, i / B) ? x[i] : 0.0;
    cr_expect(fabs(magnitude_bias_z(alt, x, var, N, T)) >= 4.5, "floor rounding passed");
    free(msg);
    terse_codec_free(c);
}

Test(terngrad, variance_equals_the_ternary_formula) {
    enum { N = 512, T = 1000 };
    static float x[N], y[N];
    tu_fill_gauss(x, N, 22);
    terse_codec *c = make("terngrad:seed=1", N);
    size_t cap = terse_codec_bound(c), len;
    uint8_t *msg = malloc(cap);
    double sum = 0, sum2 = 0;
    for (int t = 0; t < T; t++) {
        cr_assert_eq(terse_encode(c, x, msg, cap, &len), TERSE_OK);
        cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
        double e = 0;
        for (size_t i = 0; i < N; i++) e += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        sum += e;
        sum2 += e * e;
    }
    double mse = sum / T, se = sqrt((sum2 / T - mse * mse) / T), s = wire_scale(msg, 0), want = 0;
    for (size_t i = 0; i < N; i++) want += fabs((double)x[i]) * (s - fabs((double)x[i]));
    cr_expect(fabs(mse - want) <= 5 * se, "mse %g, E||Q(x)-x||^2 = sum |x|(s-|x|) = %g (se %g)",
              mse, want, se);
    free(msg);
    terse_codec_free(c);
}

Test(terngrad, values_are_minus_s_zero_or_s_with_s_the_exact_bucket_max) {
    enum { B = 64, N = 4 * B + 9 };
    float x[N], y[N];
    tu_fill_gauss(x, N, 23);
    for (size_t i = B; i < 2 * B; i++) x[i] = (i & 1) ? -0.0f : 0.0f; /* zero bucket */
    terse_codec *c = make("terngrad:bucket=64", N);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_assert_eq(len, 32 + 5 * 4 + 4 * 16 + 3, "the short last bucket takes ceil(9/4) bytes");
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
    for (size_t b = 0; b < 5; b++) {
        size_t lo = b * B, hi = lo + B < N ? lo + B : N;
        float s = wire_scale(msg, b);
        cr_assert_eq(f2u(s), f2u(absmax(x + lo, hi - lo)), "bucket %zu scale %a", b, (double)s);
        for (size_t i = lo; i < hi; i++) {
            cr_assert(y[i] == 0 || y[i] == copysignf(s, x[i]), "element %zu: %g from %g, s %g", i,
                      (double)y[i], (double)x[i], (double)s);
            if (fabsf(x[i]) == s) cr_assert_eq(y[i], x[i], "the max element %zu is kept", i);
        }
    }
    for (size_t i = B; i < 2 * B; i++) cr_assert_eq(y[i], 0.0f);
    free(msg);
    terse_codec_free(c);
}

Test(terngrad, non_finite_buckets_decode_to_nan_and_leave_others_alone) {
    enum { B = 8, N = 4 * B };
    float x[N], y[N];
    tu_fill_gauss(x, N, 24);
    x[1] = -INFINITY;
    x[2 * B + 3] = NAN;
    x[3 * B] = FLT_MAX; /* finite: s = FLT_MAX is fine for terngrad */
    terse_codec *c = make("terngrad:bucket=8", N);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
    for (size_t i = 0; i < N; i++) {
        int bad = i / B == 0 || i / B == 2;
        cr_assert_eq(isnan(y[i]) != 0, bad, "element %zu = %g", i, (double)y[i]);
    }
    cr_expect_eq(f2u(wire_scale(msg, 0)), 0x7fc00000u);
    cr_expect_eq(y[3 * B], FLT_MAX);
    free(msg);
    terse_codec_free(c);
}

/* round=nearest keeps element i, as s * sign(x), exactly when |x| / s
 * (in fp32, as the kernel computes it) is at least 1/2, an exact half
 * included, and sends 0 otherwise; whatever the seed or step. */
Test(terngrad, nearest_keeps_exactly_the_elements_of_at_least_half_the_max) {
    enum { N = 700, B = 100 };
    static float x[N], y[N];
    tu_fill_gauss(x, N, 29);
    x[10] = 4.0f, x[11] = -2.0f, x[12] = 0x1.fffffep0f; /* bucket 0: s = 4, a tie, a near tie */
    terse_codec *a = make("terngrad:bucket=100,round=nearest,seed=1", N);
    terse_codec *b = make("terngrad:bucket=100,round=nearest,seed=2", N);
    uint8_t *ma, *mb;
    size_t len = tu_encode(a, x, &ma);
    free(ma);
    len = tu_encode(a, x, &ma); /* step 1 against b's step 0 */
    cr_assert_eq(tu_encode(b, x, &mb), len);
    cr_assert_eq(memcmp(ma, mb, len), 0, "nearest messages depend on the seed or step");
    cr_assert_eq(terse_decode(a, ma, len, y, 1.0f, 0), TERSE_OK);
    cr_expect_eq(y[11], -4.0f, "the tie |x| = s/2 rounds up");
    cr_expect_eq(y[12], 0.0f, "just below s/2 rounds down");
    for (size_t i = 0; i < N; i++) {
        float s = absmax(x + i / B * B, B);
        float want = fabsf(x[i]) / s >= 0.5f ? copysignf(s, x[i]) : 0.0f;
        cr_assert_eq(f2u(y[i]), f2u(want), "element %zu: x %a, s %a, got %a", i, (double)x[i],
                     (double)s, (double)y[i]);
    }
    free(ma);
    free(mb);
    terse_codec_free(a);
    terse_codec_free(b);
}

Test(terngrad, accumulate_equals_decode_plus_add_bitwise) {
    enum { N = 1001 };
    static float x[N], base[N], y[N], z[N];
    tu_fill_gauss(x, N, 25);
    tu_fill_uniform(base, N, 26, -1.0f, 1.0f);
    terse_codec *c = make("terngrad:bucket=100", N);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    const float alphas[] = {1.0f, 0.125f, -1.0f, 3.3f};
    for (size_t a = 0; a < 4; a++) {
        cr_assert_eq(terse_decode(c, msg, len, y, alphas[a], 0), TERSE_OK);
        memcpy(z, base, sizeof z);
        cr_assert_eq(terse_decode(c, msg, len, z, alphas[a], 1), TERSE_OK);
        for (size_t i = 0; i < N; i++)
            cr_assert_eq(f2u(z[i]), f2u(base[i] + y[i]), "alpha %g element %zu", (double)alphas[a],
                         i);
    }
    free(msg);
    terse_codec_free(c);
}

Test(terngrad, same_seed_gives_same_bytes_and_ranks_draw_differently) {
    enum { N = 999 };
    static float x[N];
    tu_fill_gauss(x, N, 27);
    terse_codec *a = make("terngrad:seed=2", N), *b = make("terngrad:seed=2", N),
                *r = make("terngrad:seed=2", N);
    cr_assert_eq(terse_codec_set_stream(r, 0, 3), TERSE_OK);
    uint8_t *ma, *mb, *mr;
    size_t la = tu_encode(a, x, &ma), lb = tu_encode(b, x, &mb), lr = tu_encode(r, x, &mr);
    cr_assert(la == lb && la == lr);
    cr_expect_eq(memcmp(ma, mb, la), 0, "fresh codecs with the same seed disagree");
    cr_expect_neq(memcmp(ma + 32, mr + 32, la - 32), 0, "rank 3 drew what rank 0 drew");
    free(mb);
    lb = tu_encode(b, x, &mb);
    cr_expect_neq(memcmp(ma + 32, mb + 32, la - 32), 0, "step 1 drew what step 0 drew");
    free(ma);
    free(mb);
    free(mr);
    terse_codec_free(a);
    terse_codec_free(b);
    terse_codec_free(r);
}

Test(terngrad, simd_absmax_and_ternary_encode_match_scalar_bitwise) {
#if defined(__x86_64__)
    unsigned f = terse__cpu_features();
    const float special[] = {0.0f, -0.0f, 1e-45f, -3e-39f, FLT_MAX, -FLT_MAX, INFINITY,
                             -INFINITY, NAN, -NAN, 1.0f, -0.75f};
    const size_t lens[] = {1, 7, 33, 1000003};
    for (size_t t = 0; t < 4; t++) {
        size_t n = lens[t];
        float *x = malloc(n * sizeof *x);
        uint8_t *r = malloc(n / 4 + 8), *g = malloc(n / 4 + 8);
        tu_fill_gauss(x, n, 30 + t);
        for (int pass = 0; pass < 4; pass++) {
            int nearest = pass & 1; /* each input in both rounding modes */
            uint32_t m0 = terse__squant_absmax_scalar(x, n);
            float s;
            memcpy(&s, &m0, 4);
            memset(r, 0, n / 4 + 8);
            terse__squant_encode_scalar(x, n, s, 2, 99u, nearest, r);
            if (f & TERSE_CPU_AVX2) {
                cr_assert_eq(terse__squant_absmax_avx2(x, n), m0, "avx2 n=%zu", n);
                memset(g, 0, n / 4 + 8);
                terse__squant_encode_avx2(x, n, s, 2, 99u, nearest, g);
                cr_assert_eq(memcmp(r, g, n / 4 + 8), 0, "avx2 encode n=%zu nearest=%d", n,
                             nearest);
            }
            if (f & TERSE_CPU_AVX512) {
                cr_assert_eq(terse__squant_absmax_avx512(x, n), m0, "avx512 n=%zu", n);
                memset(g, 0, n / 4 + 8);
                terse__squant_encode_avx512(x, n, s, 2, 99u, nearest, g);
                cr_assert_eq(memcmp(r, g, n / 4 + 8), 0, "avx512 encode n=%zu nearest=%d", n,
                             nearest);
            }
            if (!nearest) continue;
            /* then the same with special values (the last one wins the max) */
            for (size_t i = 0; i < n; i += 1 + i / 3) x[i] = special[i % 12];
        }
        free(x);
        free(r);
        free(g);
    }
#else
    fprintf(stderr, "[NOTE] no SIMD kernels on this architecture\n");
#endif
}

/* Reseal msg with byte `at` set to val and payload length plen; decode must
 * say TERSE_ERR_CORRUPT and name `what`. */
static void expect_corrupt(terse_codec *c, const uint8_t *msg, size_t len, size_t at, uint8_t val,
                           size_t plen, const char *what) {
    uint8_t *m = malloc(len);
    memcpy(m, msg, len);
    if (at < len) m[at] = val;
    terse__wire_seal(m, TERSE_ID_TERNGRAD, terse_codec_elements(c), plen);
    float *y = calloc(terse_codec_elements(c), sizeof *y);
    terse_status st = terse_decode(c, m, 32 + plen, y, 1.0f, 0);
    cr_expect_eq(st, TERSE_ERR_CORRUPT, "%s: got %s", what, terse_status_name(st));
    cr_expect_not_null(strstr(terse_last_error(), what), "'%s' lacks '%s'", terse_last_error(),
                       what);
    free(y);
    free(m);
}

Test(terngrad, crafted_payloads_with_bad_fields_are_corrupt) {
    enum { N = 45, B = 16 }; /* buckets of 16, 16, 13: the last has 6 spare bits */
    float x[N];
    tu_fill_gauss(x, N, 28);
    terse_codec *c = make("terngrad:bucket=16", N);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg), plen = len - 32, codes = 32 + 12;
    cr_assert_eq(plen, 12 + 4 + 4 + 4);
    expect_corrupt(c, msg, len, codes + 5, (uint8_t)(msg[codes + 5] | 0x30), plen, "invalid code");
    expect_corrupt(c, msg, len, 32 + 8 + 3, 0x80, plen, "negative");
    expect_corrupt(c, msg, len, len, 0, plen - 1, "payload is");
    expect_corrupt(c, msg, len, len - 1, (uint8_t)(msg[len - 1] | 0x40), plen, "spare bits");
    float y[N];
    cr_expect_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
    free(msg);
    terse_codec_free(c);
}
