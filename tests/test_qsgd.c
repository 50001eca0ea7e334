/* qsgd: stochastic rounding to 2L+1 levels of the bucket L2 norm. The
 * statistical tests use fixed seeds, so they are deterministic; their
 * thresholds are several standard errors wide and are shown to reject a
 * biased rounding. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/cpu.h"
#include "common/rng.h"
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

/* Both NaN, or the same bits. */
static int same_float(float a, float b) { return (isnan(a) && isnan(b)) || f2u(a) == f2u(b); }

static size_t payload_size(size_t n, size_t B, unsigned bits) {
    size_t nb = (n + B - 1) / B, last = n - (nb - 1) * B;
    return 4 * nb + (nb - 1) * ((B * bits + 7) / 8) + (last * bits + 7) / 8;
}

/* ------------------------------------------------------------ the spec */

Test(qsgd, canonical_spec_traits_and_exact_bound) {
    terse_codec *c = make("qsgd", 1000);
    cr_expect_str_eq(terse_codec_spec(c),
                     "qsgd:bits=4,bucket=512,lsq=0,round=stochastic,norm=l2,ef=0,seed=0");
    cr_expect_eq(terse_codec_bound(c), 32 + payload_size(1000, 512, 4));
    terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
    cr_assert_eq(terse_codec_get_traits(c, &t), TERSE_OK);
    cr_expect(t.randomized);
    cr_expect(!t.summable);
    cr_expect_float_eq(t.bits_per_element, 8.0 * (double)payload_size(1000, 512, 4) / 1000, 1e-12);
    float x[1000];
    tu_fill_gauss(x, 1000, 1);
    uint8_t *msg;
    cr_expect_eq(tu_encode(c, x, &msg), terse_codec_bound(c), "qsgd messages have a fixed size");
    free(msg);
    terse_codec_free(c);
    c = make("qsgd:bits=7,bucket=100,seed=9", 1000);
    cr_expect_str_eq(terse_codec_spec(c),
                     "qsgd:bits=7,bucket=100,lsq=0,round=stochastic,norm=l2,ef=0,seed=9");
    terse_codec_free(c);
}

Test(qsgd, bad_specs_are_invalid_and_name_the_token) {
    tu_expect_bad_spec("qsgd:bits=0", "bits=0");
    tu_expect_bad_spec("qsgd:bits=1", "bits=1");
    tu_expect_bad_spec("qsgd:bits=9", "bits=9");
    tu_expect_bad_spec("qsgd:bucket=4", "bucket=4");
    tu_expect_bad_spec("qsgd:bucket=16777217", "bucket=16777217");
    tu_expect_bad_spec("qsgd:bits=four", "bits=four");
    tu_expect_bad_spec("qsgd:levels=3", "levels");
    tu_expect_bad_spec("qsgd:lsq=2", "lsq=2");
    tu_expect_bad_spec("qsgd:lsq=x", "lsq=x");
    tu_expect_bad_spec("qsgd:ef=1,lsq=-1", "lsq=-1");
    tu_expect_bad_spec("qsgd:round=up", "round=up");
    tu_expect_bad_spec("qsgd:round=", "round=");
    tu_expect_bad_spec("qsgd:ef=1,round=Nearest", "round=Nearest");
    tu_expect_bad_spec("qsgd:round=nearest,round=stochastic", "round");
}

/* ------------------------------------------------------------ statistics */

typedef struct {
    double agg_z;  /* sum of sign(x)*(mean - x) over its standard error */
    double chi2_z; /* (chi2 - k) / sqrt(2k) over coordinates with var > 0 */
    size_t exact_miss; /* zero-variance coordinates whose mean != x */
} bias_stats;

/* Compare means of T independent draws against x, given each coordinate's
 * single-draw variance. Unbiased draws give |agg_z|, |chi2_z| of order 1. */
static bias_stats bias_check(const double *mean, const float *x, const double *var, size_t n,
                             int T) {
    bias_stats r = {0, 0, 0};
    double agg = 0, agg_var = 0, chi2 = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        double d = mean[i] - x[i];
        if (var[i] > 0) {
            agg += (x[i] < 0 ? -d : d);
            agg_var += var[i] / T;
            chi2 += d * d * T / var[i];
            k++;
        } else if (fabs(d) > 1e-6 * fabs(x[i])) {
            r.exact_miss++;
        }
    }
    r.agg_z = agg_var > 0 ? agg / sqrt(agg_var) : 0;
    r.chi2_z = k ? (chi2 - (double)k) / sqrt(2.0 * (double)k) : 0;
    return r;
}

static int passes(bias_stats s) {
    return fabs(s.agg_z) < 4.5 && fabs(s.chi2_z) < 6 && !s.exact_miss;
}

/* u = |x| / norm * L for element i, and the level step norm / L, from the
 * norms on the wire. */
static void levels_of(const float *x, size_t n, size_t B, unsigned L, const uint8_t *msg, double *u,
                      float *step) {
    for (size_t i = 0; i < n; i++) {
        float norm = wire_scale(msg, i / B);
        u[i] = fabs((double)x[i]) / norm * L;
        step[i] = norm / (float)L;
    }
}

Test(qsgd, is_unbiased_over_many_steps_and_the_check_rejects_floor_rounding) {
    enum { N = 1000, B = 128, T = 1500 };
    static float x[N], y[N], step[N];
    static double u[N], var[N], mean[N], alt[N];
    tu_fill_gauss(x, N, 42);
    x[5] = 0.0f;
    for (unsigned bits = 2; bits <= 8; bits += 3) {
        unsigned L = (1u << (bits - 1)) - 1;
        char spec[64];
        snprintf(spec, sizeof spec, "qsgd:bits=%u,bucket=%d,seed=3", bits, B);
        terse_codec *c = make(spec, N);
        size_t cap = terse_codec_bound(c), len;
        uint8_t *msg = malloc(cap);
        memset(mean, 0, sizeof mean);
        for (int t = 0; t < T; t++) { /* each encode advances the step: fresh draws */
            cr_assert_eq(terse_encode(c, x, msg, cap, &len), TERSE_OK);
            cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
            for (size_t i = 0; i < N; i++) mean[i] += y[i] / (double)T;
        }
        cr_assert_eq(terse_codec_step(c), T);
        levels_of(x, N, B, L, msg, u, step);
        for (size_t i = 0; i < N; i++) {
            double f = u[i] - floor(u[i]);
            var[i] = (double)step[i] * step[i] * f * (1 - f);
        }
        bias_stats s = bias_check(mean, x, var, N, T);
        cr_expect(passes(s), "bits=%u: agg z %.2f, chi2 z %.2f, %zu exact misses", bits, s.agg_z,
                  s.chi2_z, s.exact_miss);
        /* The same check on deterministic floor and nearest rounding. */
        for (size_t i = 0; i < N; i++)
            alt[i] = copysign(floor(u[i]) * step[i], x[i]);
        s = bias_check(alt, x, var, N, T);
        cr_expect(!passes(s), "floor rounding passed the bias check (agg z %.2f)", s.agg_z);
        for (size_t i = 0; i < N; i++)
            alt[i] = copysign(floor(u[i] + 0.5) * step[i], x[i]);
        s = bias_check(alt, x, var, N, T);
        cr_expect(!passes(s), "nearest rounding passed the bias check (chi2 z %.2f)", s.chi2_z);
        free(msg);
        terse_codec_free(c);
    }
}

/* Mean over T steps of ||Q(x) - x||^2 in one bucket, against QSGD's bound
 * (Alistarh et al., Lemma 3.1) and against its exact expectation. */
static void check_variance(const float *x, size_t n, unsigned bits, int T) {
    unsigned L = (1u << (bits - 1)) - 1;
    char spec[64];
    snprintf(spec, sizeof spec, "qsgd:bits=%u,bucket=%zu,seed=11", bits, n);
    terse_codec *c = make(spec, n);
    size_t cap = terse_codec_bound(c), len;
    uint8_t *msg = malloc(cap);
    float *y = malloc(n * sizeof *y);
    double sum = 0, sum2 = 0;
    for (int t = 0; t < T; t++) {
        cr_assert_eq(terse_encode(c, x, msg, cap, &len), TERSE_OK);
        cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
        double e = 0;
        for (size_t i = 0; i < n; i++) e += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        sum += e;
        sum2 += e * e;
    }
    double mse = sum / T, se = sqrt((sum2 / T - mse * mse) / T);
    double norm = wire_scale(msg, 0), s = norm / L, want = 0, x2 = 0;
    for (size_t i = 0; i < n; i++) {
        double u = fabs((double)x[i]) / norm * L, f = u - floor(u);
        want += s * s * f * (1 - f);
        x2 += (double)x[i] * x[i];
    }
    double bound = fmin((double)n / ((double)L * L), sqrt((double)n) / L) * x2;
    cr_expect(mse <= bound, "bits=%u n=%zu: E||Q(x)-x||^2 = %g exceeds the bound %g", bits, n, mse,
              bound);
    cr_expect(fabs(mse - want) <= 5 * se + 1e-6 * want, "bits=%u: mse %g, expected %g (se %g)",
              bits, mse, want, se);
    free(y);
    free(msg);
    terse_codec_free(c);
}

Test(qsgd, variance_is_within_the_qsgd_bound) {
    enum { N = 512 };
    static float x[N];
    tu_fill_gauss(x, N, 5);
    check_variance(x, N, 4, 400);
    check_variance(x, N, 8, 400);
    /* Equal magnitudes put every u at 1/sqrt(n) for L = 1: within 5% of
     * the sqrt(n)/L bound, so a rounding with extra variance fails. */
    for (size_t i = 0; i < N; i++) x[i] = (i * 7 % 3) ? 0.25f : -0.25f;
    check_variance(x, N, 2, 2000);
}

/* ------------------------------------------------------------ the format */

/* Every decoded value is (norm/L) * l for an integer l in [-L, L], one of
 * the two levels around u, with the sign of x; norms are ||x_b||. */
static void check_grid(const float *x, size_t n, size_t B, unsigned bits, const uint8_t *msg,
                       const float *y) {
    int L = (1 << (bits - 1)) - 1;
    for (size_t b = 0; b * B < n; b++) {
        size_t len = n - b * B < B ? n - b * B : B;
        float norm = wire_scale(msg, b);
        cr_assert(fabs(norm - tu_norm2(x + b * B, len)) <= 1e-6 * norm, "bucket %zu norm %g", b,
                  (double)norm);
        if (norm == 0) continue;
        float step = norm / (float)L;
        for (size_t i = b * B; i < b * B + len; i++) {
            double lv = nearbyint(y[i] / step);
            cr_assert(lv >= -L && lv <= L, "element %zu level %g", i, lv);
            cr_assert_eq(f2u(y[i]), f2u(step * (float)lv), "element %zu = %a is off the grid", i,
                         (double)y[i]);
            double u = fabs((double)x[i]) / norm * L;
            cr_assert(fabs(lv) >= floor(u - 1e-5) && fabs(lv) <= ceil(u + 1e-5),
                      "element %zu: |level| %g is not next to u %g", i, fabs(lv), u);
            cr_assert(lv == 0 || (lv < 0) == (x[i] < 0), "element %zu has the wrong sign", i);
        }
    }
}

Test(qsgd, decoded_values_lie_on_the_level_grid_at_every_width) {
    enum { N = 1000, B = 96 };
    static float x[N], y[N];
    tu_fill_gauss(x, N, 8);
    for (unsigned bits = 2; bits <= 8; bits++) {
        char spec[64];
        snprintf(spec, sizeof spec, "qsgd:bits=%u,bucket=%d", bits, B);
        terse_codec *c = make(spec, N);
        uint8_t *msg;
        size_t len = tu_encode(c, x, &msg);
        cr_assert_eq(len, 32 + payload_size(N, B, bits));
        cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
        check_grid(x, N, B, bits, msg, y);
        free(msg);
        terse_codec_free(c);
    }
}

/* The message is the documented layout (norms, then byte-aligned packed
 * codes per bucket) filled by the scalar reference kernels, whatever SIMD
 * level this process dispatched to; so every level sends the same bytes. */
Test(qsgd, message_is_the_documented_layout_of_scalar_reference_codes) {
    enum { N = 300, B = 64, NB = 5 };
    float x[N];
    tu_fill_gauss(x, N, 31);
    memset(x + B, 0, B * sizeof(float));
    for (unsigned bits = 3; bits <= 4; bits++) {
        char spec[64];
        snprintf(spec, sizeof spec, "qsgd:bits=%u,bucket=%d,seed=77", bits, B);
        terse_codec *c = make(spec, N);
        cr_assert_eq(terse_codec_set_stream(c, 5, 2), TERSE_OK);
        uint8_t *m0, *m1;
        size_t len = tu_encode(c, x, &m0);
        cr_assert_eq(tu_encode(c, x, &m1), len);
        uint64_t key = terse__rng_key(77, 1, 5, 2); /* the second message: step 1 */
        uint8_t want[4 * NB + NB * 64] = {0}, *codes = want + 4 * NB;
        for (size_t b = 0; b < NB; b++) {
            size_t lo = b * B, blen = N - lo < B ? N - lo : B;
            uint8_t *out = codes + b * ((B * bits + 7) / 8);
            float norm = (float)sqrt(terse__squant_sumsq_scalar(x + lo, blen));
            terse__put_f32(want + 4 * b, norm);
            if (norm > 0) {
                uint32_t sub = terse__rng_subkey(key, b);
                terse__squant_encode_scalar(x + lo, blen, norm, bits, sub, 0, out);
            } else { /* level 0 everywhere: code L */
                for (size_t j = 0; j < blen; j++)
                    for (unsigned k = 0; k < bits; k++)
                        if ((((1u << (bits - 1)) - 1) >> k) & 1)
                            out[(j * bits + k) / 8] |= (uint8_t)(1u << ((j * bits + k) % 8));
            }
        }
        cr_assert_eq(len - 32, payload_size(N, B, bits));
        cr_expect_eq(memcmp(m1 + 32, want, len - 32), 0, "bits=%u: payload differs from reference",
                     bits);
        free(m0);
        free(m1);
        terse_codec_free(c);
    }
}

Test(qsgd, short_last_bucket_and_zero_bucket) {
    enum { B = 64, N = 3 * B + 5 };
    float x[N], y[N];
    tu_fill_uniform(x, N, 4, -2.0f, 2.0f);
    for (size_t i = B; i < 2 * B; i++) x[i] = (i & 1) ? -0.0f : 0.0f;
    terse_codec *c = make("qsgd:bits=4,bucket=64", N);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_assert_eq(len, 32 + 4 * 4 + 3 * 32 + 3);
    cr_expect_eq(f2u(wire_scale(msg, 1)), 0, "a zero bucket has norm +0");
    for (size_t i = 0; i < N; i++) y[i] = 99.0f;
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
    for (size_t i = B; i < 2 * B; i++) cr_assert_eq(y[i], 0.0f, "element %zu", i);
    check_grid(x, N, B, 4, msg, y);
    free(msg);
    terse_codec_free(c);
}

Test(qsgd, non_finite_buckets_decode_to_nan_and_leave_others_alone) {
    enum { B = 16, N = 5 * B };
    float x[N], y[N];
    tu_fill_gauss(x, N, 6);
    x[3] = INFINITY;                   /* bucket 0 */
    x[2 * B + 7] = NAN;                /* bucket 2 */
    x[3 * B] = x[3 * B + 1] = 3e38f;   /* bucket 3: finite, but the norm overflows fp32 */
    terse_codec *c = make("qsgd:bits=4,bucket=16", N);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
    for (size_t b = 0; b < 5; b++) {
        int bad = b == 0 || b == 2 || b == 3;
        cr_expect_eq(f2u(wire_scale(msg, b)) == 0x7fc00000u, bad, "bucket %zu scale", b);
        for (size_t i = b * B; i < (b + 1) * B; i++)
            cr_assert_eq(isnan(y[i]) != 0, bad, "element %zu = %g", i, (double)y[i]);
    }
    free(msg);
    terse_codec_free(c);
}

Test(qsgd, accumulate_equals_decode_plus_add_bitwise) {
    enum { N = 1237 };
    static float x[N], base[N], y[N], z[N];
    tu_fill_gauss(x, N, 9);
    tu_fill_uniform(base, N, 10, -1.0f, 1.0f);
    const float alphas[] = {1.0f, 0.25f, -1.0f, 3.7f};
    for (unsigned bits = 2; bits <= 8; bits += 2) {
        char spec[64];
        snprintf(spec, sizeof spec, "qsgd:bits=%u,bucket=100", bits);
        terse_codec *c = make(spec, N);
        uint8_t *msg;
        size_t len = tu_encode(c, x, &msg);
        for (size_t a = 0; a < 4; a++) {
            cr_assert_eq(terse_decode(c, msg, len, y, alphas[a], 0), TERSE_OK);
            memcpy(z, base, sizeof z);
            cr_assert_eq(terse_decode(c, msg, len, z, alphas[a], 1), TERSE_OK);
            for (size_t i = 0; i < N; i++)
                cr_assert_eq(f2u(z[i]), f2u(base[i] + y[i]), "bits %u alpha %g element %zu", bits,
                             (double)alphas[a], i);
        }
        free(msg);
        terse_codec_free(c);
    }
}

Test(qsgd, same_seed_gives_same_bytes_and_each_stream_key_changes_the_draws) {
    enum { N = 777 };
    static float x[N];
    tu_fill_gauss(x, N, 12);
    terse_codec *a = make("qsgd:seed=5", N), *b = make("qsgd:seed=5", N);
    uint8_t *ma[3], *mb[3];
    size_t la[3], lb[3];
    for (int t = 0; t < 3; t++) {
        la[t] = tu_encode(a, x, &ma[t]);
        lb[t] = tu_encode(b, x, &mb[t]);
        cr_assert_eq(la[t], lb[t]);
        cr_expect_eq(memcmp(ma[t], mb[t], la[t]), 0, "step %d differs between fresh codecs", t);
    }
    cr_expect_neq(memcmp(ma[0], ma[1], la[0]), 0, "steps 0 and 1 drew the same levels");
    /* A fresh codec at step 0 with another rank, tensor or seed. */
    const char *specs[] = {"qsgd:seed=5", "qsgd:seed=5", "qsgd:seed=6"};
    const uint64_t tensor[] = {0, 1, 0};
    const uint32_t rank[] = {1, 0, 0};
    for (int v = 0; v < 3; v++) {
        terse_codec *c = make(specs[v], N);
        cr_assert_eq(terse_codec_set_stream(c, tensor[v], rank[v]), TERSE_OK);
        uint8_t *m;
        size_t l = tu_encode(c, x, &m);
        cr_assert_eq(l, la[0]);
        cr_expect_eq(memcmp(m, ma[0], 24), 0, "the header does not depend on the stream");
        cr_expect_eq(memcmp(m + 32, ma[0] + 32, 8), 0, "nor do the norms");
        cr_expect_neq(memcmp(m, ma[0], l), 0, "variant %d drew the same levels as rank 0", v);
        free(m);
        terse_codec_free(c);
    }
    for (int t = 0; t < 3; t++) {
        free(ma[t]);
        free(mb[t]);
    }
    terse_codec_free(a);
    terse_codec_free(b);
}

/* ------------------------------------------------------------ SIMD */

typedef struct {
    const char *name;
    double (*sumsq)(const float *, size_t);
    void (*encode)(const float *, size_t, float, unsigned, uint32_t, int, uint8_t *);
    int (*decode)(const uint8_t *, size_t, unsigned, float, float, int, float *);
} level;

static size_t simd_levels(level *out) {
    size_t k = 0;
#if defined(__x86_64__)
    unsigned f = terse__cpu_features();
    if (f & TERSE_CPU_AVX2)
        out[k++] = (level){"avx2", terse__squant_sumsq_avx2, terse__squant_encode_avx2,
                           terse__squant_decode_avx2};
    if (f & TERSE_CPU_AVX512)
        out[k++] = (level){"avx512", terse__squant_sumsq_avx512, terse__squant_encode_avx512,
                           terse__squant_decode_avx512};
#endif
    if (!k) fprintf(stderr, "[NOTE] no SIMD level on this CPU: nothing to compare\n");
    return k;
}

/* One bucket through every kernel at every width, in both rounding modes;
 * bitwise against scalar. */
static void compare_kernels(const float *x, size_t n, float scale, float step, float alpha) {
    level lv[2];
    size_t nl = simd_levels(lv);
    size_t cap = n + 64;
    uint8_t *ref = malloc(cap), *got = malloc(cap);
    float *dref = malloc((n + 16) * sizeof(float)), *dgot = malloc((n + 16) * sizeof(float));
    double s0 = terse__squant_sumsq_scalar(x, n);
    for (size_t l = 0; l < nl; l++) {
        double s1 = lv[l].sumsq(x, n);
        cr_assert((isnan(s0) && isnan(s1)) || memcmp(&s0, &s1, 8) == 0,
                  "%s sumsq n=%zu: %a vs %a", lv[l].name, n, s0, s1);
    }
    for (unsigned bits = 2; bits <= 8; bits++) {
        size_t nbytes = (n * bits + 7) / 8;
        for (int nearest = 1; nearest >= 0; nearest--) { /* ref keeps the stochastic codes */
            memset(ref, 0xa5, cap);
            terse__squant_encode_scalar(x, n, scale, bits, 0x1234567u, nearest, ref);
            for (size_t l = 0; l < nl; l++) {
                memset(got, 0xa5, cap);
                lv[l].encode(x, n, scale, bits, 0x1234567u, nearest, got);
                cr_assert_eq(memcmp(ref, got, cap), 0,
                             "%s encode n=%zu bits=%u scale=%a nearest=%d", lv[l].name, n, bits,
                             (double)scale, nearest);
            }
        }
        /* Decode the scalar codes (for short inputs scrambled, so that
         * invalid codes and nonzero spare bits occur), with and without
         * accumulation. */
        if (n < 4096)
            for (size_t i = 0; i < nbytes; i += 3) ref[i] = (uint8_t)(ref[i] * 37u + i);
        for (int acc = 0; acc < 2; acc++) {
            for (size_t i = 0; i < n + 16; i++) dref[i] = (float)i - 7.5f;
            int bad0 = terse__squant_decode_scalar(ref, n, bits, step, alpha, acc, dref);
            for (size_t l = 0; l < nl; l++) {
                for (size_t i = 0; i < n + 16; i++) dgot[i] = (float)i - 7.5f;
                int bad1 = lv[l].decode(ref, n, bits, step, alpha, acc, dgot);
                cr_assert_eq(bad0 != 0, bad1 != 0, "%s decode n=%zu bits=%u invalid-code flag",
                             lv[l].name, n, bits);
                for (size_t i = 0; i < n + 16; i++)
                    cr_assert(same_float(dref[i], dgot[i]),
                              "%s decode n=%zu bits=%u acc=%d element %zu: %a vs %a", lv[l].name,
                              n, bits, acc, i, (double)dref[i], (double)dgot[i]);
            }
        }
    }
    free(ref);
    free(got);
    free(dref);
    free(dgot);
}

Test(qsgd, simd_kernels_match_scalar_bitwise_on_odd_lengths) {
    const size_t lens[] = {1, 7, 33, 100, 1000003};
    for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++) {
        size_t n = lens[t];
        float *x = malloc(n * sizeof *x);
        tu_fill_gauss(x, n, 100 + t);
        float norm = (float)sqrt(terse__squant_sumsq_scalar(x, n));
        compare_kernels(x, n, norm, norm / 7, 0.5f);
        free(x);
    }
}

Test(qsgd, simd_kernels_match_scalar_bitwise_on_special_values) {
    enum { N = 71 };
    float x[N];
    const float special[] = {0.0f,     -0.0f,     1e-45f,    -1e-40f,  FLT_MIN,  -FLT_MAX,
                             FLT_MAX,  3e38f,     INFINITY,  -INFINITY, NAN,     1.0f,
                             -1.0f,    0.5f,      1e-30f,    -2.5f};
    for (size_t i = 0; i < N; i++) x[i] = special[(i * 5) % 16];
    const float scales[] = {1.0f, 1e-45f, 1e-38f, FLT_MAX, 0.0f, INFINITY, NAN, 3.0f};
    for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++)
        compare_kernels(x, N, scales[s], scales[s], s & 1 ? -1.0f : 0.75f);
    /* a bucket of denormals only: its norm is tiny but positive */
    for (size_t i = 0; i < N; i++) x[i] = (i & 1 ? -1e-44f : 3e-42f) * (float)(i % 5);
    float norm = (float)sqrt(terse__squant_sumsq_scalar(x, N));
    cr_assert(norm > 0);
    compare_kernels(x, N, norm, norm / 7, 1.0f);
}

/* With L = 1 and scale 1, x = r makes frac(u) equal the draw exactly: only
 * a strict "r < frac" in every version keeps these levels at 0. */
Test(qsgd, simd_kernels_break_ties_between_draw_and_fraction_like_scalar) {
    enum { N = 77 };
    float x[N];
    for (size_t j = 0; j < N; j++)
        x[j] = (j & 1 ? -1.0f : 1.0f) * terse__rng_unit(terse__rng_u32(0x1234567u, (uint32_t)j));
    uint8_t codes[(N * 2 + 7) / 8];
    terse__squant_encode_scalar(x, N, 1.0f, 2, 0x1234567u, 0, codes);
    for (size_t j = 0; j < N; j++)
        cr_assert_eq((codes[j / 4] >> (2 * (j % 4))) & 3, 1, "element %zu rounded up on a tie", j);
    compare_kernels(x, N, 1.0f, 1.0f, 1.0f);
}

/* ------------------------------------------------------------ lsq */

/* lsq=1 and round=nearest are the defaults with ef=1 only, each can be
 * set either way, and the canonical spec spells both out. */
Test(qsgd, lsq_and_nearest_are_the_defaults_only_with_ef_and_are_in_the_canonical_spec) {
    static const char *const cases[][2] = {
        {"qsgd", "qsgd:bits=4,bucket=512,lsq=0,round=stochastic,norm=l2,ef=0,seed=0"},
        {"qsgd:ef=1", "qsgd:bits=4,bucket=512,lsq=1,round=nearest,norm=max,ef=1,seed=0"},
        {"qsgd:ef=1,lsq=0", "qsgd:bits=4,bucket=512,lsq=0,round=nearest,norm=max,ef=1,seed=0"},
        {"qsgd:lsq=1,bits=3", "qsgd:bits=3,bucket=512,lsq=1,round=stochastic,norm=l2,ef=0,seed=0"},
        {"qsgd:ef=1,round=stochastic",
         "qsgd:bits=4,bucket=512,lsq=1,round=stochastic,norm=l2,ef=1,seed=0"},
        {"qsgd:round=nearest,seed=4", "qsgd:bits=4,bucket=512,lsq=0,round=nearest,norm=max,ef=0,seed=4"},
        {"qsgd:ef=1,norm=l2", "qsgd:bits=4,bucket=512,lsq=1,round=nearest,norm=l2,ef=1,seed=0"},
    };
    tu_expect_canonical_specs(cases, sizeof cases / sizeof cases[0], 100);
}

/* The default without ef is lsq=0 with stochastic rounding, the unbiased
 * encoder that message_is_the_documented_layout_of_scalar_reference_codes
 * pins down: the same bytes as an explicit lsq=0,round=stochastic, step
 * after step. With ef=1 the defaults are lsq=1,round=nearest. */
Test(qsgd, the_default_messages_are_those_of_the_explicit_defaults) {
    enum { N = 1500 };
    static float x[N];
    for (unsigned v = 0; v < 8; v++) {
        unsigned bits = 2 + 2 * (v % 4);
        const char *ef = v < 4 ? "" : ",ef=1", *set = v < 4 ? "lsq=0,round=stochastic"
                                                            : "lsq=1,round=nearest";
        char s0[96], s1[96];
        snprintf(s0, sizeof s0, "qsgd:bits=%u,bucket=128,seed=8%s", bits, ef);
        snprintf(s1, sizeof s1, "qsgd:bits=%u,bucket=128,seed=8%s,%s", bits, ef, set);
        terse_codec *a = make(s0, N), *b = make(s1, N);
        for (uint64_t t = 0; t < 3; t++) {
            tu_fill_gauss(x, N, 40 + t);
            uint8_t *ma, *mb;
            size_t la = tu_encode(a, x, &ma), lb = tu_encode(b, x, &mb);
            cr_assert(la == lb && memcmp(ma, mb, la) == 0, "%s step %llu: messages differ", s1,
                      (unsigned long long)t);
            free(ma);
            free(mb);
        }
        terse_codec_free(a);
        terse_codec_free(b);
    }
}

/* Bucket b of an n-element input: gaussian with a twist per bucket, so the
 * buckets cover spikes, one sign, zeros of both signs among values, and
 * (two fixed buckets) an all-zero and a NaN bucket. */
static void lsq_input(float *x, size_t n, size_t B, uint64_t seed) {
    tu_fill_gauss(x, n, seed);
    for (size_t i = 0; i < n; i++) {
        size_t b = i / B, j = i % B;
        if (b == 7)
            x[i] = (j & 1) ? -0.0f : 0.0f;
        else if (b == 8 && j == 5)
            x[i] = NAN;
        else if (b % 5 == 1 && j == 3)
            x[i] *= 50.0f;
        else if (b % 5 == 2)
            x[i] = -fabsf(x[i]);
        else if (b % 5 == 3 && (j % 3))
            x[i] = (j & 1) ? -0.0f : 0.0f;
        else if (b % 5 == 4)
            x[i] = fabsf(x[i]) * 1e-30f;
    }
}

/* The levels of bucket b of a message (n elements, buckets of B), as
 * floats: the scalar decoder with step 1 gives code - L exactly. */
static void wire_levels(const uint8_t *msg, size_t n, size_t B, unsigned bits, size_t b,
                        float *lev) {
    size_t nb = (n + B - 1) / B, blen = b + 1 == nb ? n - b * B : B;
    const uint8_t *in = msg + TERSE_WIRE_HEADER_SIZE + 4 * nb + b * ((B * bits + 7) / 8);
    cr_assert_eq(terse__squant_decode_scalar(in, blen, bits, 1.0f, 1.0f, 0, lev), 0);
}

/* ||x - y||^2 and ||x||^2 over len elements, in double. */
static void err_and_norm(const float *x, const float *y, size_t len, double *e2, double *x2) {
    *e2 = *x2 = 0;
    for (size_t i = 0; i < len; i++) {
        *e2 += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        *x2 += (double)x[i] * x[i];
    }
}

/* With lsq=1 the levels are those lsq=0 draws or rounds (same seed, step
 * and rounding mode: the code bytes match), each scale is L <x,l> / ||l||^2
 * for them (recomputed here from the wire, to fp32 rounding), and so every
 * bucket contracts: ||x - D(C(x))|| <= ||x||, and no worse than with the
 * norm as scale. At 2 bits the unbiased scale breaks that bound, so the
 * check can fail; nearest levels at the norm keep it (|u - l| <= u for
 * each element), and least squares only improves on them. */
static void check_lsq_contraction(unsigned bits, const char *round) {
    enum { N = 1000, B = 96, NB = 11, T = 6 };
    static float x[N], y0[N], y1[N], lev[B];
    unsigned L = (1u << (bits - 1)) - 1;
    int nearest = strcmp(round, "nearest") == 0;
    char s0[96], s1[96];
    snprintf(s0, sizeof s0, "qsgd:bits=%u,bucket=%d,seed=5,lsq=0,round=%s", bits, B, round);
    snprintf(s1, sizeof s1, "qsgd:bits=%u,bucket=%d,seed=5,lsq=1,round=%s", bits, B, round);
    terse_codec *c0 = make(s0, N), *c1 = make(s1, N);
    double worst0 = 0, worst1 = 0;
    for (uint64_t t = 0; t < T; t++) {
        lsq_input(x, N, B, 60 + t);
        uint8_t *m0, *m1;
        size_t len = tu_encode(c0, x, &m0), codes = 32 + 4 * NB;
        cr_assert_eq(tu_encode(c1, x, &m1), len, "lsq changes the message size");
        cr_assert_eq(memcmp(m0 + codes, m1 + codes, len - codes), 0, "%s: lsq changed the levels",
                     s1);
        cr_assert_eq(terse_decode(c0, m0, len, y0, 1.0f, 0), TERSE_OK);
        cr_assert_eq(terse_decode(c1, m1, len, y1, 1.0f, 0), TERSE_OK);
        for (size_t b = 0; b < NB; b++) {
            size_t lo = b * B, blen = b + 1 == NB ? N - lo : B;
            float sc0 = wire_scale(m0, b), sc1 = wire_scale(m1, b);
            if (sc0 == 0 || isnan(sc0)) { /* special buckets are left alone */
                cr_assert_eq(f2u(sc1), f2u(sc0), "%s bucket %zu", s1, b);
                continue;
            }
            wire_levels(m1, N, B, bits, b, lev);
            double dot = 0, sq = 0;
            for (size_t j = 0; j < blen; j++) {
                dot += (double)x[lo + j] * lev[j];
                sq += (double)lev[j] * lev[j];
            }
            /* to one fp32 ulp: the codec sums in another order */
            double want = sq > 0 ? L * dot / sq : sc0;
            cr_assert(fabs(sc1 - want) <= 0x1p-23 * want, "%s bucket %zu: scale %a, want %a", s1,
                      b, (double)sc1, want);
            double e0, e1, x2;
            err_and_norm(x + lo, y0 + lo, blen, &e0, &x2);
            err_and_norm(x + lo, y1 + lo, blen, &e1, &x2);
            cr_assert(e1 <= x2 * (1 + 1e-6), "%s bucket %zu: ||x-D||^2 %g > ||x||^2 %g", s1, b,
                      e1, x2);
            cr_assert(e1 <= e0 * (1 + 1e-6) + 1e-9 * x2,
                      "%s bucket %zu: lsq error %g above the norm scale's %g", s1, b, e1, e0);
            if (nearest)
                cr_assert(e0 <= x2 * (1 + 1e-6), "%s bucket %zu: ||x-D||^2 %g > ||x||^2 %g", s0,
                          b, e0, x2);
            worst0 = fmax(worst0, e0 / x2);
            worst1 = fmax(worst1, e1 / x2);
        }
        free(m0);
        free(m1);
    }
    cr_log_info("bits=%u round=%s: worst ||x-D||^2/||x||^2 norm scale %.3g, lsq %.3g", bits,
                round, worst0, worst1);
    if (bits == 2 && !nearest)
        cr_expect(worst0 > 2, "the unbiased 2-bit scale contracted (worst ratio %g)", worst0);
    terse_codec_free(c0);
    terse_codec_free(c1);
}

Test(qsgd, least_squares_scales_make_every_bucket_a_contraction) {
    for (unsigned bits = 2; bits <= 8; bits++) check_lsq_contraction(bits, "stochastic");
}

Test(qsgd, least_squares_scales_of_nearest_levels_make_every_bucket_a_contraction) {
    for (unsigned bits = 2; bits <= 8; bits++) check_lsq_contraction(bits, "nearest");
}

/* The least-squares scale is below 2 norms, so it can pass FLT_MAX when
 * the norm is near it; it is capped there, which still contracts. At
 * L = 3 with u = (2.9, 0.768), the levels (2, 0) and (2, -1) give scales
 * of 1.45 and 1.31 norms, 4.3e38 and 3.9e38 for a norm of 3e38. */
Test(qsgd, a_least_squares_scale_past_flt_max_is_capped_and_still_contracts) {
    enum { N = 8, T = 200 };
    float x[N] = {2.9e38f, -0.768e38f}, y[N];
    terse_codec *c = make("qsgd:bits=3,bucket=8,lsq=1,seed=1", N);
    int capped = 0;
    for (int t = 0; t < T; t++) {
        uint8_t *m;
        size_t len = tu_encode(c, x, &m);
        cr_assert_eq(terse_decode(c, m, len, y, 1.0f, 0), TERSE_OK);
        float sc = wire_scale(m, 0);
        cr_assert(isfinite(sc) && sc > 0, "step %d: scale %g", t, (double)sc);
        capped += sc == FLT_MAX;
        double e2, x2;
        err_and_norm(x, y, N, &e2, &x2);
        cr_assert(e2 <= x2 * (1 + 1e-6), "step %d: ||x-D||^2 %g > ||x||^2 %g", t, e2, x2);
        free(m);
    }
    cr_expect(capped > 0, "no step drew levels whose scale passes FLT_MAX");
    terse_codec_free(c);
}

/* The format does not change: a codec created without lsq and with
 * stochastic rounding decodes an lsq, nearest-rounded message to the same
 * bits as one created with both, plain and accumulated (ef=1 turns both
 * on). */
Test(qsgd, an_lsq_nearest_message_decodes_the_same_in_a_stochastic_codec_without_lsq) {
    enum { N = 1111 };
    static float x[N], ya[N], yb[N];
    tu_fill_gauss(x, N, 70);
    terse_codec *enc = make("qsgd:bits=3,bucket=64,ef=1", N);
    terse_codec *with = make("qsgd:bits=3,bucket=64,lsq=1,round=nearest", N);
    terse_codec *without = make("qsgd:bits=3,bucket=64,lsq=0,round=stochastic", N);
    cr_assert_eq(terse_codec_bound(enc), terse_codec_bound(without));
    uint8_t *m;
    size_t len = tu_encode(enc, x, &m);
    for (int acc = 0; acc < 2; acc++) {
        for (size_t i = 0; i < N; i++) ya[i] = yb[i] = (float)i;
        cr_assert_eq(terse_decode(with, m, len, ya, 0.5f, acc), TERSE_OK);
        cr_assert_eq(terse_decode(without, m, len, yb, 0.5f, acc), TERSE_OK, "%s",
                     terse_last_error());
        cr_expect_eq(memcmp(ya, yb, sizeof ya), 0, "acc=%d: decodes differ", acc);
    }
    free(m);
    terse_codec_free(enc);
    terse_codec_free(with);
    terse_codec_free(without);
}

/* ------------------------------------------------------------ round=nearest */

/* The level of element j of one bucket of codes, from the scalar decoder. */
static int code_level(const uint8_t *codes, size_t n, unsigned bits, size_t j) {
    float lev[512];
    cr_assert(n <= 512);
    cr_assert_eq(terse__squant_decode_scalar(codes, n, bits, 1.0f, 1.0f, 0, lev), 0);
    return (int)lev[j];
}

/* At scale 1, u = |x| * L is exact for these x, so the nearest level is
 * floor(u + 1/2) by hand: u = 0.49 -> 0, 0.5 -> 1 (ties up), 2.51 -> 3,
 * and the float just below 1/2 -> 0. Every SIMD level agrees, with each
 * value at every lane position and in the ragged tail. */
Test(qsgd, nearest_rounds_u_half_up_at_known_points_in_every_kernel) {
    static const struct {
        unsigned bits;
        float x;
        int level;
    } pts[] = {
        /* L = 1: u = |x| */
        {2, 0.49f, 0}, {2, 0.5f, 1}, {2, 0x1.fffffep-2f, 0}, {2, 0.51f, 1}, {2, -0.5f, -1},
        {2, 1.0f, 1}, {2, 0.0f, 0}, {2, -0.0f, 0},
        /* L = 3: u = 1.5, 2.5078125, 2.484375, -2.5078125, 0.4921875, 6 (clamped) */
        {3, 0.5f, 2}, {3, 0.8359375f, 3}, {3, 0.828125f, 2}, {3, -0.8359375f, -3},
        {3, 0.1640625f, 0}, {3, 2.0f, 3},
        /* L = 7: u = 3.5, 3.0078125; L = 127: u = 63.5, 0.49609375, 1.48828125 */
        {4, 0.5f, 4}, {4, 0.4296875f, 3}, {8, 0.5f, 64}, {8, 0.00390625f, 0},
        {8, 0.01171875f, 1},
    };
    enum { N = 83 }; /* past one AVX-512 block of 64, with a tail */
    level lv[2];
    size_t nl = simd_levels(lv);
    float x[N];
    uint8_t ref[N], got[N + 64];
    for (size_t p = 0; p < sizeof pts / sizeof pts[0]; p++) {
        unsigned bits = pts[p].bits;
        for (size_t j = 0; j < N; j++) x[j] = pts[p].x;
        terse__squant_encode_scalar(x, N, 1.0f, bits, 0x1234567u, 1, ref);
        for (size_t j = 0; j < N; j += 9)
            cr_assert_eq(code_level(ref, N, bits, j), pts[p].level,
                         "bits=%u x=%a element %zu: level %d, want %d", bits, (double)pts[p].x, j,
                         code_level(ref, N, bits, j), pts[p].level);
        for (size_t l = 0; l < nl; l++) {
            memset(got, 0xa5, sizeof got);
            lv[l].encode(x, N, 1.0f, bits, 0x1234567u, 1, got);
            cr_assert_eq(memcmp(ref, got, (N * bits + 7) / 8), 0, "%s bits=%u x=%a", lv[l].name,
                         bits, (double)pts[p].x);
        }
    }
}

/* Through the codec (lsq=0, so the scale on the wire is the norm): every
 * level is floor(u + 1/2) for u computed as the kernel does, in fp32. */
Test(qsgd, nearest_levels_are_u_rounded_half_up_at_every_width) {
    enum { N = 1000, B = 96, NB = 11 };
    static float x[N], lev[B];
    tu_fill_gauss(x, N, 90);
    for (unsigned bits = 2; bits <= 8; bits++) {
        unsigned L = (1u << (bits - 1)) - 1;
        char spec[64];
        snprintf(spec, sizeof spec, "qsgd:bits=%u,bucket=%d,lsq=0,round=nearest", bits, B);
        terse_codec *c = make(spec, N);
        uint8_t *m;
        tu_encode(c, x, &m);
        for (size_t b = 0; b < NB; b++) {
            size_t lo = b * B, blen = b + 1 == NB ? N - lo : B;
            float norm = wire_scale(m, b);
            wire_levels(m, N, B, bits, b, lev);
            for (size_t j = 0; j < blen; j++) {
                float u = (fabsf(x[lo + j]) / norm) * (float)L;
                double want = copysign(floor((double)u + 0.5), x[lo + j]);
                cr_assert_eq(lev[j], (float)want, "bits=%u element %zu: u %a, level %g", bits,
                             lo + j, (double)u, (double)lev[j]);
            }
        }
        free(m);
        terse_codec_free(c);
    }
}

/* Nearest rounding draws nothing: two codecs with other seeds, tensors and
 * ranks send the same bytes as each other, at every step, with and
 * without lsq; seed= is still accepted. */
Test(qsgd, nearest_messages_do_not_depend_on_seed_step_or_stream) {
    enum { N = 777 };
    static float x[N];
    tu_fill_gauss(x, N, 91);
    for (int lsq = 0; lsq < 2; lsq++) {
        char sa[64], sb[64];
        snprintf(sa, sizeof sa, "qsgd:bits=3,round=nearest,lsq=%d,seed=1", lsq);
        snprintf(sb, sizeof sb, "qsgd:bits=3,round=nearest,lsq=%d,seed=2", lsq);
        terse_codec *a = make(sa, N), *b = make(sb, N);
        cr_assert_eq(terse_codec_set_stream(b, 4, 3), TERSE_OK);
        uint8_t *first = NULL;
        for (int t = 0; t < 3; t++) {
            uint8_t *ma, *mb;
            size_t la = tu_encode(a, x, &ma), lb = tu_encode(b, x, &mb);
            cr_assert(la == lb && memcmp(ma, mb, la) == 0, "lsq=%d step %d: seeds differ", lsq, t);
            if (first)
                cr_assert_eq(memcmp(first, ma, la), 0, "lsq=%d: step %d differs from step 0", lsq,
                             t);
            else
                first = ma, ma = NULL;
            free(ma);
            free(mb);
        }
        free(first);
        terse_codec_free(a);
        terse_codec_free(b);
    }
}

/* ------------------------------------------------------------ crafted */

/* Decode a resealed copy of msg whose payload was changed by `edit` and
 * expect TERSE_ERR_CORRUPT with `what` in the sentence. */
static void expect_corrupt(terse_codec *c, const uint8_t *msg, size_t len, size_t at, uint8_t val,
                           size_t new_plen, const char *what) {
    uint8_t *m = malloc(len);
    memcpy(m, msg, len);
    if (at < len) m[at] = val;
    terse__wire_seal(m, TERSE_ID_QSGD, terse_codec_elements(c), new_plen);
    float *y = calloc(terse_codec_elements(c), sizeof *y);
    terse_status st = terse_decode(c, m, 32 + new_plen, y, 1.0f, 0);
    cr_expect_eq(st, TERSE_ERR_CORRUPT, "%s: got %s", what, terse_status_name(st));
    cr_expect_not_null(strstr(terse_last_error(), what), "'%s' lacks '%s'", terse_last_error(),
                       what);
    free(y);
    free(m);
}

Test(qsgd, crafted_payloads_with_bad_fields_are_corrupt) {
    enum { N = 37, B = 16 };
    float x[N];
    tu_fill_gauss(x, N, 13);
    for (unsigned bits = 2; bits <= 8; bits++) {
        char spec[64];
        snprintf(spec, sizeof spec, "qsgd:bits=%u,bucket=%d", bits, B);
        terse_codec *c = make(spec, N);
        uint8_t *msg;
        size_t len = tu_encode(c, x, &msg), plen = len - 32;
        size_t codes = 32 + 3 * 4; /* first code byte */
        /* element 0 (or 1 for odd widths' low bits) gets the all-ones code */
        uint8_t allones = (uint8_t)(msg[codes] | ((1u << bits) - 1));
        expect_corrupt(c, msg, len, codes, allones, plen, "invalid code");
        expect_corrupt(c, msg, len, 32 + 4 + 3, 0x80, plen, "negative");
        expect_corrupt(c, msg, len, len, 0, plen - 1, "payload is");
        if ((5 * bits) & 7) /* the last bucket holds 5 elements */
            expect_corrupt(c, msg, len, len - 1, (uint8_t)(msg[len - 1] | 0x80), plen,
                           "spare bits");
        /* the untouched message still decodes */
        float y[N];
        cr_expect_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
        free(msg);
        terse_codec_free(c);
    }
}

Test(qsgd, crafted_non_finite_norms_decode_without_faults) {
    enum { N = 40 };
    float x[N], y[N];
    tu_fill_gauss(x, N, 14);
    terse_codec *c = make("qsgd:bits=4,bucket=20", N);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    terse__put_f32(msg + 32, INFINITY);
    terse__put_u32(msg + 36, 0x7fbfffffu); /* signalling NaN, sign clear */
    terse__wire_seal(msg, TERSE_ID_QSGD, N, len - 32);
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK, "%s", terse_last_error());
    for (size_t i = 0; i < N; i++)
        cr_expect(i < 20 ? (isinf(y[i]) || isnan(y[i]) || y[i] == 0) : isnan(y[i]),
                  "element %zu", i);
    free(msg);
    terse_codec_free(c);
}
