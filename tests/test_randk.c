/* randk: stratified random-k with indices shared by every rank. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "compress/codec_internal.h"
#include "compress/wire.h"
#include "testutil.h"

#define H TERSE_WIRE_HEADER_SIZE

static terse_codec *make(const char *spec, size_t n, uint64_t tensor, uint32_t rank) {
    terse_codec *c = NULL;
    cr_assert_eq(terse_codec_create(spec, n, 1, &c), TERSE_OK, "%s: %s", spec, terse_last_error());
    cr_assert_eq(terse_codec_set_stream(c, tensor, rank), TERSE_OK);
    return c;
}

/* An input with no zeros, so the decoded nonzeros are the drawn indices. */
static void fill_nonzero(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * (float)(i + 1);
}

/* Encode x with c and return the drawn indices (k of them, increasing). */
static size_t drawn(terse_codec *c, const float *x, size_t n, uint64_t *idx) {
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    float *y = malloc(n * sizeof *y);
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK, "%s", terse_last_error());
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (y[i] != 0.0f) idx[k++] = i;
    free(y);
    free(msg);
    return k;
}

Test(randk, draws_one_index_in_each_stratum) {
    size_t n = 1003, k = 100; /* strata of 10 and 11 */
    float *x = malloc(n * sizeof *x);
    uint64_t idx[1003];
    fill_nonzero(x, n, 1.0f);
    terse_codec *c = make("randk:k=100", n, 0, 0);
    for (int step = 0; step < 20; step++) {
        cr_assert_eq(drawn(c, x, n, idx), k);
        for (size_t j = 0; j < k; j++) {
            size_t lo = j * n / k, hi = (j + 1) * n / k;
            cr_assert(idx[j] >= lo && idx[j] < hi, "step %d: index %llu not in stratum %zu [%zu, %zu)",
                      step, (unsigned long long)idx[j], j, lo, hi);
        }
    }
    terse_codec_free(c);
    free(x);
}

Test(randk, every_rank_draws_the_same_indices_and_steps_and_tensors_differ) {
    size_t n = 5000;
    float *xa = malloc(n * sizeof *xa), *xb = malloc(n * sizeof *xb);
    fill_nonzero(xa, n, 1.0f);
    fill_nonzero(xb, n, -3.0f);
    uint64_t ia[5000], ib[5000], ic[5000];
    terse_codec *r0 = make("randk:ratio=0.05,seed=9", n, 4, 0);
    terse_codec *r7 = make("randk:ratio=0.05,seed=9", n, 4, 7);
    terse_codec *other = make("randk:ratio=0.05,seed=9", n, 5, 0);
    size_t k = drawn(r0, xa, n, ia);
    cr_assert_eq(k, 250);
    cr_assert_eq(drawn(r7, xb, n, ib), k);
    cr_expect_eq(memcmp(ia, ib, k * sizeof *ia), 0, "ranks 0 and 7 drew different indices");
    cr_assert_eq(drawn(other, xa, n, ic), k);
    cr_expect_neq(memcmp(ia, ic, k * sizeof *ia), 0, "tensors 4 and 5 drew the same indices");
    cr_assert_eq(drawn(r0, xa, n, ic), k); /* step 1 */
    cr_expect_neq(memcmp(ia, ic, k * sizeof *ia), 0, "steps 0 and 1 drew the same indices");
    terse_codec_free(r0);
    terse_codec_free(r7);
    terse_codec_free(other);
    free(xa), free(xb);
}

Test(randk, messages_of_one_step_add_linearly) {
    size_t n = 777;
    float *xa = malloc(n * sizeof *xa), *xb = malloc(n * sizeof *xb);
    float *sum = malloc(n * sizeof *sum), *want = malloc(n * sizeof *want);
    tu_fill_gauss(xa, n, 1);
    tu_fill_gauss(xb, n, 2);
    terse_codec *ca = make("randk:ratio=0.1,seed=3", n, 1, 0);
    terse_codec *cb = make("randk:ratio=0.1,seed=3", n, 1, 1);
    terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
    cr_assert_eq(terse_codec_get_traits(ca, &t), TERSE_OK);
    cr_expect_eq(t.summable, 1);
    cr_expect_eq(t.randomized, 1);
    uint8_t *ma, *mb;
    size_t la = tu_encode(ca, xa, &ma), lb = tu_encode(cb, xb, &mb);
    cr_assert_eq(la, lb);
    cr_assert_eq(memcmp(ma + H, mb + H, 8), 0, "the two ranks' keys differ");
    cr_assert_eq(terse_decode(ca, ma, la, sum, 1.0f, 0), TERSE_OK);
    cr_assert_eq(terse_decode(ca, mb, lb, sum, 1.0f, 1), TERSE_OK);
    /* A payload whose values are the element-wise sums, same key. */
    for (size_t off = H + 8; off < la; off += 4)
        terse__put_f32(ma + off, terse__get_f32(ma + off) + terse__get_f32(mb + off));
    terse__wire_seal(ma, TERSE_ID_RANDK, n, la - H);
    cr_assert_eq(terse_decode(ca, ma, la, want, 1.0f, 0), TERSE_OK, "%s", terse_last_error());
    cr_expect_eq(memcmp(sum, want, n * sizeof *sum), 0);
    free(ma), free(mb), free(xa), free(xb), free(sum), free(want);
    terse_codec_free(ca);
    terse_codec_free(cb);
}

/* Sum D(E(x)) over many steps and compare with x coordinate by coordinate.
 * Coordinate i of a stratum of `size` decodes to size * x_i with
 * probability 1/size, else 0. Let c_i count its draws over T steps: if the
 * codec is unbiased, the c_i of one stratum are multinomial(T, 1/size) and
 * Pearson's sum over all coordinates of (c_i - T/size)^2 / (T/size) is
 * chi-square with n - k degrees of freedom. The mean's error shows as
 * c_i = acc_i / (size * x_i) moving off T/size, whether the scale is wrong
 * or some index is drawn too often. `fudge` scales every decode, to show a
 * biased codec fails. Returns the chi-square; *zmax gets the largest
 * per-coordinate |mean - x| / standard error. */
static double bias_chi2(const char *spec, size_t n, size_t k, int steps, double fudge,
                        double *zmax) {
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    double *acc = calloc(n, sizeof *acc);
    tu_fill_uniform(x, n, 77, 0.5f, 2.0f);
    for (size_t i = 0; i < n; i += 2) x[i] = -x[i];
    terse_codec *c = make(spec, n, 0, 0);
    size_t cap = terse_codec_bound(c), len;
    uint8_t *msg = malloc(cap);
    for (int s = 0; s < steps; s++) {
        cr_assert_eq(terse_encode(c, x, msg, cap, &len), TERSE_OK);
        cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
        for (size_t i = 0; i < n; i++) acc[i] += fudge * y[i];
    }
    double chi2 = 0;
    *zmax = 0;
    for (size_t j = 0; j < k; j++) {
        size_t lo = j * n / k, hi = (j + 1) * n / k;
        double size = (double)(hi - lo), expect = steps / size;
        for (size_t i = lo; i < hi; i++) {
            double count = acc[i] / (size * x[i]);
            chi2 += (count - expect) * (count - expect) / expect;
            double z = (acc[i] / steps - x[i]) / (fabs(x[i]) * sqrt((size - 1) / steps));
            if (fabs(z) > *zmax) *zmax = fabs(z);
        }
    }
    free(x), free(y), free(acc), free(msg);
    terse_codec_free(c);
    return chi2;
}

Test(randk, unbiased_decodes_average_to_the_input) {
    /* n = 67, k = 8: strata of 8 and 9, 59 degrees of freedom. P(chi2(59)
     * > 110) is about 6e-5; seeds 1..6 give 53..83 here, a 3 % bias 200+. */
    double zmax, chi2 = bias_chi2("randk:k=8,seed=5", 67, 8, 20000, 1.0, &zmax);
    cr_expect_lt(chi2, 110.0, "chi-square %g on 59 degrees of freedom", chi2);
    cr_expect_lt(zmax, 5.0, "largest per-coordinate z = %g", zmax);
    /* The same test rejects a 3 % scale bias and the unscaled variant. */
    chi2 = bias_chi2("randk:k=8,seed=5", 67, 8, 20000, 1.03, &zmax);
    cr_expect_gt(chi2, 110.0, "a 3%% bias went unnoticed (chi-square %g)", chi2);
    chi2 = bias_chi2("randk:k=8,seed=5,unbiased=0", 67, 8, 20000, 1.0, &zmax);
    cr_expect_gt(chi2, 110.0, "unbiased=0 went unnoticed (chi-square %g)", chi2);
    cr_expect_gt(zmax, 5.0);
}

Test(randk, unbiased_scales_by_the_stratum_size_and_biased_sends_values_verbatim) {
    size_t n = 10, k = 3; /* strata [0,3) [3,6) [6,10) */
    float x[10];
    fill_nonzero(x, n, 0.1f);
    const char *specs[] = {"randk:k=3,unbiased=1", "randk:k=3,unbiased=0", "randk:k=3,ef=1"};
    const float want_scale[3][3] = {{3, 3, 4}, {1, 1, 1}, {1, 1, 1}};
    for (int s = 0; s < 3; s++) {
        terse_codec *c = make(specs[s], n, 0, 0);
        uint8_t *msg;
        size_t len = tu_encode(c, x, &msg);
        cr_assert_eq(len, H + 8 + 4 * k);
        float y[10];
        cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
        size_t j = 0;
        for (size_t i = 0; i < n; i++) {
            if (y[i] == 0.0f) continue;
            cr_assert_lt(j, k);
            cr_expect_eq(y[i], x[i] * want_scale[s][j], "%s: y[%zu] = %g", specs[s], i, y[i]);
            j++;
        }
        cr_expect_eq(j, k);
        free(msg);
        terse_codec_free(c);
    }
}

Test(randk, keeping_every_element_is_exact) {
    size_t n = 513;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    tu_fill_gauss(x, n, 6);
    x[3] = -0.0f;
    x[4] = INFINITY;
    terse_codec *c = make("randk:ratio=1", n, 0, 0);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
    cr_expect_eq(memcmp(x, y, n * sizeof *x), 0);
    free(msg), free(x), free(y);
    terse_codec_free(c);
}

Test(randk, decode_with_accumulate_equals_decode_plus_add) {
    size_t n = 2049;
    float *x = malloc(n * sizeof *x), *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b),
          *d = malloc(n * sizeof *d);
    tu_fill_gauss(x, n, 7);
    terse_codec *c = make("randk:ratio=0.2", n, 0, 0);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    tu_fill_uniform(a, n, 8, -1, 1);
    memcpy(b, a, n * sizeof *a);
    cr_assert_eq(terse_decode(c, msg, len, a, 0.3f, 1), TERSE_OK);
    for (size_t i = 0; i < n; i++) d[i] = 99.0f;
    cr_assert_eq(terse_decode(c, msg, len, d, 0.3f, 0), TERSE_OK);
    for (size_t i = 0; i < n; i++) b[i] += d[i];
    cr_expect_eq(memcmp(a, b, n * sizeof *a), 0);
    free(msg), free(x), free(a), free(b), free(d);
    terse_codec_free(c);
}

Test(randk, encoding_is_deterministic_and_depends_on_the_seed) {
    size_t n = 10000;
    float *x = malloc(n * sizeof *x);
    tu_fill_gauss(x, n, 9);
    terse_codec *c1 = make("randk:ratio=0.01,seed=42", n, 3, 1);
    terse_codec *c2 = make("randk:ratio=0.01,seed=42", n, 3, 1);
    terse_codec *c3 = make("randk:ratio=0.01,seed=43", n, 3, 1);
    uint8_t *m1, *m2, *m3;
    size_t l1 = tu_encode(c1, x, &m1), l2 = tu_encode(c2, x, &m2), l3 = tu_encode(c3, x, &m3);
    cr_assert(l1 == l2 && l1 == l3);
    cr_expect_eq(memcmp(m1, m2, l1), 0);
    cr_expect_neq(memcmp(m1 + H, m3 + H, l1 - H), 0);
    free(m1), free(m2), free(m3), free(x);
    terse_codec_free(c1);
    terse_codec_free(c2);
    terse_codec_free(c3);
}

Test(randk, payloads_of_the_wrong_length_are_corrupt) {
    size_t n = 1000;
    float x[1000], y[1000];
    tu_fill_gauss(x, n, 10);
    terse_codec *c = make("randk:k=10", n, 0, 0);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_assert_eq(len, H + 8 + 40);
    /* One value short, sealed with a valid CRC. */
    terse__wire_seal(msg, TERSE_ID_RANDK, n, len - H - 4);
    for (size_t i = 0; i < n; i++) y[i] = 5.0f;
    cr_expect_eq(terse_decode(c, msg, len - 4, y, 1.0f, 0), TERSE_ERR_CORRUPT);
    cr_expect_not_null(strstr(terse_last_error(), "randk"), "%s", terse_last_error());
    for (size_t i = 0; i < n; i++) cr_assert_eq(y[i], 5.0f);
    /* The codec itself refuses any other length the core might pass. */
    static const size_t lens[] = {0, 7, 8, 47, 49};
    for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++)
        cr_expect_eq(c->ops.decode(c->self, msg + H, lens[t], y, 1.0f, 0), TERSE_ERR_CORRUPT,
                     "length %zu", lens[t]);
    free(msg);
    terse_codec_free(c);
}

Test(randk, bad_specs_are_invalid_and_name_the_token) {
    tu_expect_bad_spec("randk:ratio=0", "ratio=0");
    tu_expect_bad_spec("randk:ratio=1.5", "ratio=1.5");
    tu_expect_bad_spec("randk:k=0", "k=0");
    tu_expect_bad_spec("randk:k=101", "k=101");
    tu_expect_bad_spec("randk:ratio=0.1,k=5", "'ratio' or 'k'");
    tu_expect_bad_spec("randk:unbiased=2", "unbiased=2");
    tu_expect_bad_spec("randk:seed=x", "seed=x");
}

Test(randk, canonical_spec_defaults_unbiased_to_the_opposite_of_ef) {
    struct {
        const char *spec, *canon;
    } t[] = {
        {"randk", "randk:ratio=0.01,unbiased=1,ef=0,seed=0"},
        {"randk:ef=1", "randk:ratio=0.01,unbiased=0,ef=1,seed=0"},
        {"randk:ef=1,unbiased=1", "randk:ratio=0.01,unbiased=1,ef=1,seed=0"},
        {"randk:k=5,seed=12", "randk:k=5,unbiased=1,ef=0,seed=12"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        terse_codec *c = make(t[i].spec, 100, 0, 0);
        cr_expect_str_eq(terse_codec_spec(c), t[i].canon);
        terse_codec_free(c);
    }
    terse_codec *c = make("randk:k=5", 100, 0, 0);
    cr_expect_eq(terse_codec_bound(c), H + 8 + 20);
    terse_codec_free(c);
}
