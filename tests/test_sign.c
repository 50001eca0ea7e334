/* sign: scaled sign, EF-signSGD's compressor (compress/sign.c). */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cpu.h"
#include "compress/codec_internal.h"
#include "compress/sign_kernels.h"
#include "compress/wire.h"
#include "testutil.h"

static terse_codec *make(const char *spec, size_t n) {
    terse_codec *c = NULL;
    terse_status s = terse_codec_create(spec, n, 1, &c);
    cr_assert_eq(s, TERSE_OK, "create '%s': %s", spec, terse_last_error());
    return c;
}

static float scale_of(const uint8_t *msg, size_t b) {
    float s;
    memcpy(&s, msg + TERSE_WIRE_HEADER_SIZE + 4 * b, 4);
    return s;
}

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* The documented summation, written out independently of the library:
 * 16 double lanes by element index mod 16, a fixed halving tree, / len. */
static float documented_mean(const float *x, size_t len) {
    double lane[16] = {0};
    for (size_t i = 0; i < len; i++) lane[i % 16] += fabs((double)x[i]);
    for (size_t w = 8; w; w /= 2)
        for (size_t j = 0; j < w; j++) lane[j] += lane[j + w];
    return (float)(lane[0] / (double)len);
}

Test(sign, decodes_to_the_bucket_mean_magnitude_with_the_input_sign) {
    size_t n = 10007, B = 1024, nb = (n + B - 1) / B; /* last bucket: 791 elements */
    float *x = malloc(n * 4), *y = malloc(n * 4);
    tu_fill_gauss(x, n, 21);
    for (size_t i = 0; i < n; i++) x[i] *= (float)(1 + (i / B) % 5); /* buckets differ */
    terse_codec *c = make("sign", n);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_assert_eq(len, TERSE_WIRE_HEADER_SIZE + 4 * nb + (n + 7) / 8);
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK, "%s", terse_last_error());
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * B, hi = lo + B < n ? lo + B : n;
        double mean = 0;
        for (size_t i = lo; i < hi; i++) mean += fabs((double)x[i]);
        mean /= (double)(hi - lo);
        float s = scale_of(msg, b);
        cr_assert_float_eq(s, mean, 1e-6 * mean, "bucket %zu: scale %g, mean |x| %g", b, s, mean);
        cr_assert_eq(s, documented_mean(x + lo, hi - lo), "bucket %zu: not the documented order",
                     b);
        for (size_t i = lo; i < hi; i++) {
            cr_assert_eq(fabsf(y[i]), s, "element %zu", i);
            cr_assert_eq(y[i] < 0, x[i] < 0, "element %zu: %g -> %g", i, x[i], y[i]);
        }
    }
    free(msg);
    free(x);
    free(y);
    terse_codec_free(c);
}

Test(sign, bits_are_packed_lsb_first_with_one_meaning_negative) {
    float x[12] = {-1, 2, 3, -4, 5, 6, 7, -8, 9, -10, 11, 12};
    terse_codec *c = make("sign:bucket=8", 12);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_assert_eq(len, TERSE_WIRE_HEADER_SIZE + 8 + 2);
    cr_expect_eq(scale_of(msg, 0), 36.0f / 8.0f);
    cr_expect_eq(scale_of(msg, 1), 42.0f / 4.0f);        /* the short last bucket's own mean */
    cr_expect_eq(msg[TERSE_WIRE_HEADER_SIZE + 8], 0x89); /* elements 0, 3, 7 */
    cr_expect_eq(msg[TERSE_WIRE_HEADER_SIZE + 9], 0x02); /* element 9; padding 0 */
    free(msg);
    terse_codec_free(c);
}

Test(sign, buckets_that_do_not_start_on_a_byte_boundary_pack_continuously) {
    size_t n = 50; /* B = 9: buckets start at bits 0, 9, 18, ... */
    float x[50], y[50];
    for (size_t i = 0; i < n; i++) x[i] = (i * 7 % 3 == 0 ? -1.0f : 1.0f) * (float)(i + 1);
    terse_codec *c = make("sign:bucket=9", n);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    const uint8_t *bits = msg + TERSE_WIRE_HEADER_SIZE + 4 * 6;
    for (size_t i = 0; i < n; i++)
        cr_expect_eq((bits[i / 8] >> (i % 8)) & 1, x[i] < 0, "bit %zu", i);
    cr_expect_eq(bits[6] >> 2, 0, "padding bits");
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
    for (size_t i = 0; i < n; i++) {
        cr_expect_eq(fabsf(y[i]), scale_of(msg, i / 9), "element %zu", i);
        cr_expect_eq(y[i] < 0, x[i] < 0, "element %zu", i);
    }
    free(msg);
    terse_codec_free(c);
}

Test(sign, zeros_of_both_signs_send_positive_and_an_all_zero_bucket_decodes_to_zero) {
    float x[16] = {0.0f, -0.0f, 0.0f, -0.0f, 0, 0, 0, -0.0f, -0.0f, 3, -1, 0, 0, 0, 0, 0};
    float y[16];
    terse_codec *c = make("sign:bucket=8", 16);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_expect_eq(bits_of(scale_of(msg, 0)), 0u);
    cr_expect_eq(scale_of(msg, 1), 0.5f);
    cr_expect_eq(msg[TERSE_WIRE_HEADER_SIZE + 8], 0x00);
    cr_expect_eq(msg[TERSE_WIRE_HEADER_SIZE + 9], 0x04); /* only element 10 */
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
    for (size_t i = 0; i < 8; i++) cr_expect_eq(bits_of(y[i]), 0u, "element %zu", i);
    cr_expect_eq(y[8], 0.5f); /* -0 in a nonzero bucket decodes positive */
    cr_expect_eq(y[10], -0.5f);
    free(msg);
    terse_codec_free(c);
}

Test(sign, inf_makes_its_bucket_infinite_and_nan_makes_it_nan) {
    float x[32], y[32];
    tu_fill_gauss(x, 32, 22);
    x[2] = -INFINITY;
    x[9] = NAN;
    x[19] = INFINITY;
    x[20] = NAN; /* bucket 2 holds both */
    terse_codec *c = make("sign:bucket=8", 32);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_expect(isinf(scale_of(msg, 0)) && scale_of(msg, 0) > 0);
    cr_expect_eq(bits_of(scale_of(msg, 1)), 0x7fc00000u);
    cr_expect_eq(bits_of(scale_of(msg, 2)), 0x7fc00000u);
    cr_expect(isfinite(scale_of(msg, 3)));
    cr_expect_eq((msg[TERSE_WIRE_HEADER_SIZE + 16 + 1] >> 1) & 1, 0, "NaN sends positive");
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
    for (size_t i = 0; i < 8; i++)
        cr_expect(isinf(y[i]) && (y[i] < 0) == (x[i] < 0), "element %zu", i);
    for (size_t i = 8; i < 24; i++) cr_expect(isnan(y[i]), "element %zu", i);
    for (size_t i = 24; i < 32; i++) cr_expect(isfinite(y[i]), "element %zu", i);
    free(msg);
    terse_codec_free(c);
}

Test(sign, huge_finite_inputs_do_not_overflow_the_mean) {
    size_t n = 1024;
    float *x = malloc(n * 4);
    for (size_t i = 0; i < n; i++) x[i] = i % 2 ? FLT_MAX : -FLT_MAX;
    terse_codec *c = make("sign", n);
    uint8_t *msg;
    tu_encode(c, x, &msg);
    cr_expect_eq(scale_of(msg, 0), FLT_MAX);
    free(msg);
    free(x);
    terse_codec_free(c);
}

Test(sign, decode_with_accumulate_equals_decode_plus_add_bitwise) {
    size_t n = 4099;
    float *x = malloc(n * 4), *base = malloc(n * 4), *y = malloc(n * 4), *z = malloc(n * 4);
    tu_fill_gauss(x, n, 23);
    tu_fill_gauss(base, n, 24);
    terse_codec *c = make("sign:bucket=100", n);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    const float alphas[] = {1.0f, -1.0f, 0.37f, 1.0f / 3.0f};
    for (size_t a = 0; a < 4; a++) {
        cr_assert_eq(terse_decode(c, msg, len, y, alphas[a], 0), TERSE_OK);
        memcpy(z, base, n * 4);
        cr_assert_eq(terse_decode(c, msg, len, z, alphas[a], 1), TERSE_OK);
        for (size_t i = 0; i < n; i++) {
            float want = base[i] + y[i];
            cr_assert_eq(bits_of(z[i]), bits_of(want), "alpha %g element %zu", alphas[a], i);
        }
    }
    free(msg);
    free(x);
    free(base);
    free(y);
    free(z);
    terse_codec_free(c);
}

Test(sign, two_fresh_codecs_encode_identical_bytes) {
    size_t n = 3001;
    float *x = malloc(n * 4);
    tu_fill_gauss(x, n, 25);
    terse_codec *a = make("sign:bucket=100", n), *b = make("sign:bucket=100", n);
    uint8_t *ma, *mb;
    size_t la = tu_encode(a, x, &ma), lb = tu_encode(b, x, &mb);
    cr_assert_eq(la, lb);
    cr_expect_eq(memcmp(ma, mb, la), 0);
    free(mb);
    size_t l2 = tu_encode(a, x, &mb); /* a later step of the same codec: same bytes too */
    cr_expect_eq(l2, la);
    cr_expect_eq(memcmp(ma, mb, la), 0);
    free(ma);
    free(mb);
    free(x);
    terse_codec_free(a);
    terse_codec_free(b);
}

/* ---- SIMD twins ---- */

typedef struct {
    const char *name;
    terse__sign_encode_fn enc;
    terse__sign_decode_fn dec;
} level;

static size_t simd_levels(level *out) {
    size_t k = 0;
#if defined(__x86_64__)
    unsigned f = terse__cpu_features();
    if (f & TERSE_CPU_AVX2)
        out[k++] = (level){"avx2", terse__sign_encode_avx2, terse__sign_decode_avx2};
    if (f & TERSE_CPU_AVX512)
        out[k++] = (level){"avx512", terse__sign_encode_avx512, terse__sign_decode_avx512};
#endif
    static int warned;
    if (k == 0 && !warned++)
        fprintf(stderr, "[NOTE] no SIMD level enabled (CPU or TERSE_SIMD): only the reference ran\n");
    return k;
}

/* Encode with every level (into a dirty buffer) and decode the reference
 * payload with every level (alpha 0.3, plain and accumulating). */
static void expect_levels_agree(const float *x, size_t n, size_t bucket) {
    level lv[2];
    size_t nl = simd_levels(lv), nb = (n + bucket - 1) / bucket, plen = 4 * nb + (n + 7) / 8;
    uint8_t *ref = malloc(plen), *got = malloc(plen);
    float *dref = malloc(n * 4), *dgot = malloc(n * 4);
    memset(ref, 0x5a, plen);
    terse__sign_encode_scalar(x, n, bucket, ref, ref + 4 * nb);
    for (size_t l = 0; l < nl; l++) {
        memset(got, 0xa5, plen);
        lv[l].enc(x, n, bucket, got, got + 4 * nb);
        for (size_t i = 0; i < plen; i++)
            cr_assert_eq(got[i], ref[i], "%s encode n=%zu B=%zu: payload byte %zu differs",
                         lv[l].name, n, bucket, i);
        for (int acc = 0; acc < 2; acc++) {
            for (size_t i = 0; i < n; i++) dref[i] = dgot[i] = (float)(i % 7) - 3.0f;
            terse__sign_decode_scalar(ref, ref + 4 * nb, n, bucket, dref, 0.3f, acc);
            lv[l].dec(ref, ref + 4 * nb, n, bucket, dgot, 0.3f, acc);
            cr_assert_eq(memcmp(dref, dgot, n * 4), 0, "%s decode n=%zu B=%zu acc=%d differs",
                         lv[l].name, n, bucket, acc);
        }
    }
    free(ref);
    free(got);
    free(dref);
    free(dgot);
}

Test(sign, simd_kernels_equal_the_reference_bitwise_at_odd_lengths) {
    const size_t lens[] = {1, 7, 8, 33, 1000003};
    const size_t buckets[] = {8, 13, 1024, 1000};
    float *x = malloc(1000003 * 4);
    tu_fill_gauss(x, 1000003, 26);
    /* Magnitudes over many decades make the summation order visible. */
    for (size_t i = 0; i < 1000003; i++)
        x[i] *= powf(2.0f, (float)((int)(i * 2654435761u % 61) - 30));
    for (size_t a = 0; a < 5; a++)
        for (size_t b = 0; b < 4; b++) expect_levels_agree(x, lens[a], buckets[b]);
    free(x);
}

Test(sign, simd_kernels_equal_the_reference_bitwise_on_special_values) {
    const float special[] = {0.0f,     -0.0f,   1e-45f,   -1e-45f, 1e-40f,   -3e-39f,
                             1.2e-38f, FLT_MAX, -FLT_MAX, 3e38f,   INFINITY, -INFINITY,
                             NAN,      -NAN,    1.0f,     -1.0f};
    size_t ns = sizeof special / sizeof special[0], n = 4096 + 77;
    float *x = malloc(n * 4);
    tu_fill_gauss(x, n, 27);
    for (size_t i = 0; i < n; i += 97) x[i] = special[(i / 97) % ns];
    for (size_t i = n - 512; i < n; i++) x[i] = special[i % 8]; /* finite specials only */
    for (size_t i = 2048; i < 2560; i++) x[i] = 1e-41f * (float)((int)(i % 13) - 6);
    expect_levels_agree(x, n, 8);
    expect_levels_agree(x, n, 13);
    expect_levels_agree(x, n, 1024);
    free(x);
}

Test(sign, every_kernel_sums_in_the_documented_lane_order_even_where_it_shows) {
    /* Double lanes make most orders agree after rounding to fp32, so build
     * a bucket where they do not: lane 0 holds m = 1 + 2^-24 (a tie between
     * two floats once divided by 32), lanes 4 and 8 hold t = 2^-53 each.
     * The documented tree adds each t to m alone (a double tie, m stays,
     * the float tie goes to even: 2^-5); a kernel that put element 4 into
     * lane 0 (e.g. swapped AVX2 accumulators) would add t + t first and
     * round up. */
    float x[32] = {0};
    x[0] = 1.0f;
    x[16] = -0x1p-24f;
    x[4] = 0x1p-53f;
    x[8] = -0x1p-53f;
    float want = documented_mean(x, 32);
    cr_assert_eq(want, 0x1p-5f);
    double wrong = ((0x1p-53 + 0x1p-53) + (1.0 + 0x1p-24)) / 32.0;
    cr_assert_neq((float)wrong, want, "the input no longer tells the orders apart");
    uint8_t p[4 + 4];
    terse__sign_encode_scalar(x, 32, 32, p, p + 4);
    float s;
    memcpy(&s, p, 4);
    cr_expect_eq(s, want, "reference: %a", s);
    level lv[2];
    size_t nl = simd_levels(lv);
    for (size_t l = 0; l < nl; l++) {
        lv[l].enc(x, 32, 32, p, p + 4);
        memcpy(&s, p, 4);
        cr_expect_eq(s, want, "%s: %a", lv[l].name, s);
    }
}

Test(sign, simd_decoders_equal_the_reference_on_arbitrary_payload_bytes) {
    size_t n = 1031, bucket = 11, nb = (n + bucket - 1) / bucket, plen = 4 * nb + (n + 7) / 8;
    uint8_t *p = malloc(plen);
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < plen; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (uint8_t)(st >> 56);
    }
    const uint32_t odd[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x00000001u, 0xffc01234u};
    for (size_t k = 0; k < 5; k++) memcpy(p + 4 * k, &odd[k], 4);
    level lv[2];
    size_t nl = simd_levels(lv);
    float *a = malloc(n * 4), *b = malloc(n * 4);
    for (size_t l = 0; l < nl; l++)
        for (int acc = 0; acc < 2; acc++) {
            for (size_t i = 0; i < n; i++) a[i] = b[i] = 1.0f;
            terse__sign_decode_scalar(p, p + 4 * nb, n, bucket, a, -0.5f, acc);
            lv[l].dec(p, p + 4 * nb, n, bucket, b, -0.5f, acc);
            cr_assert_eq(memcmp(a, b, n * 4), 0, "%s acc=%d", lv[l].name, acc);
        }
    free(p);
    free(a);
    free(b);
}

/* ---- hostile input and configuration ---- */

static uint8_t *craft(size_t plen, size_t n, const uint8_t *payload) {
    uint8_t *m = calloc(1, TERSE_WIRE_HEADER_SIZE + plen + 1);
    if (plen) memcpy(m + TERSE_WIRE_HEADER_SIZE, payload, plen);
    terse__wire_seal(m, TERSE_ID_SIGN, n, plen);
    return m;
}

Test(sign, payload_of_wrong_length_with_valid_crc_is_corrupt) {
    size_t n = 100;
    float x[100], y[100];
    tu_fill_gauss(x, n, 28);
    terse_codec *c = make("sign:bucket=32", n); /* 4 scales + 13 bytes of bits */
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_assert_eq(len - TERSE_WIRE_HEADER_SIZE, 29);
    const size_t bad[] = {0, 1, 16, 28};
    for (size_t k = 0; k < 4; k++) {
        uint8_t *m = craft(bad[k], n, msg + TERSE_WIRE_HEADER_SIZE);
        for (size_t i = 0; i < n; i++) y[i] = 7.0f;
        terse_status s = terse_decode(c, m, TERSE_WIRE_HEADER_SIZE + bad[k], y, 1.0f, 0);
        cr_expect_eq(s, TERSE_ERR_CORRUPT, "payload of %zu bytes gave %s", bad[k],
                     terse_status_name(s));
        cr_expect_not_null(strstr(terse_last_error(), "sign"), "%s", terse_last_error());
        cr_expect_not_null(strstr(terse_last_error(), "29"), "%s", terse_last_error());
        for (size_t i = 0; i < n; i++) cr_expect_eq(y[i], 7.0f);
        free(m);
    }
    free(msg);
    terse_codec_free(c);
}

Test(sign, nonzero_padding_bits_are_corrupt_and_named) {
    size_t n = 100; /* 12.5 bytes of bits: the high nibble of byte 12 is padding */
    float x[100], y[100];
    tu_fill_gauss(x, n, 29);
    terse_codec *c = make("sign:bucket=32", n);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    uint8_t *p = msg + TERSE_WIRE_HEADER_SIZE;
    p[16 + 12] |= 0x10;
    uint8_t *m = craft(len - TERSE_WIRE_HEADER_SIZE, n, p);
    cr_expect_eq(terse_decode(c, m, len, y, 1.0f, 0), TERSE_ERR_CORRUPT);
    cr_expect_not_null(strstr(terse_last_error(), "padding"), "%s", terse_last_error());
    cr_expect_not_null(strstr(terse_last_error(), "28"), "%s", terse_last_error());
    free(m);
    /* Arbitrary scales (Inf, NaN) are not faults: they decode. */
    p[16 + 12] &= 0x0f;
    uint32_t inf = 0x7f800000u, nan = 0x7fc00001u;
    memcpy(p, &inf, 4);
    memcpy(p + 4, &nan, 4);
    m = craft(len - TERSE_WIRE_HEADER_SIZE, n, p);
    cr_expect_eq(terse_decode(c, m, len, y, 1.0f, 0), TERSE_OK, "%s", terse_last_error());
    cr_expect(isinf(y[0]));
    cr_expect(isnan(y[32]));
    free(m);
    free(msg);
    terse_codec_free(c);
}

Test(sign, bucket_outside_8_to_2_pow_24_is_invalid_and_named) {
    tu_expect_bad_spec("sign:bucket=abc", "bucket=abc");
    tu_expect_bad_spec("sign:bucket=0", "bucket=0");
    tu_expect_bad_spec("sign:bucket=7", "bucket=7");
    tu_expect_bad_spec("sign:bucket=16777217", "bucket=16777217");
    tu_expect_bad_spec("sign:bucket=1e3", "bucket=1e3");
    tu_expect_bad_spec("sign:ratio=0.5", "ratio");
    tu_expect_bad_spec("sign:seed=3", "seed");
}

Test(sign, spec_is_canonical_and_bound_is_exact) {
    terse_codec *c = make("sign", 3000);
    cr_expect_str_eq(terse_codec_spec(c), "sign:bucket=1024,ef=0");
    cr_expect_eq(terse_codec_bound(c), TERSE_WIRE_HEADER_SIZE + 3 * 4 + 375);
    terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
    cr_assert_eq(terse_codec_get_traits(c, &t), TERSE_OK);
    cr_expect_eq(t.summable, 0);
    cr_expect_eq(t.randomized, 0);
    cr_expect_float_eq(t.bits_per_element, 8.0 * 387 / 3000, 1e-12);
    terse_codec_free(c);
    c = make("sign:bucket=8,ef=1", 1);
    cr_expect_str_eq(terse_codec_spec(c), "sign:bucket=8,ef=1");
    cr_expect_eq(terse_codec_bound(c), TERSE_WIRE_HEADER_SIZE + 4 + 1);
    terse_codec_free(c);
}
