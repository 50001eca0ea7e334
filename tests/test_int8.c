/* int8: per-bucket absmax quantization (compress/int8.c). */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cpu.h"
#include "compress/codec_internal.h"
#include "compress/int8_kernels.h"
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

/* Buckets of very different magnitudes, so a shared scale would fail. */
static void fill_varied(float *x, size_t n, size_t bucket, uint64_t seed) {
    tu_fill_gauss(x, n, seed);
    for (size_t i = 0; i < n; i++) x[i] *= powf(10.0f, (float)((int)((i / bucket) % 9) - 4));
}

Test(int8, round_trip_error_is_at_most_half_a_scale_step) {
    size_t n = 10007, B = 512, nb = (n + B - 1) / B; /* last bucket: 279 elements */
    float *x = malloc(n * 4), *y = malloc(n * 4);
    fill_varied(x, n, B, 11);
    terse_codec *c = make("int8:bucket=512", n);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_assert_eq(len, TERSE_WIRE_HEADER_SIZE + 4 * nb + n);
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK, "%s", terse_last_error());
    const int8_t *q = (const int8_t *)(msg + TERSE_WIRE_HEADER_SIZE + 4 * nb);
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * B, hi = lo + B < n ? lo + B : n;
        float m = 0;
        for (size_t i = lo; i < hi; i++) m = fmaxf(m, fabsf(x[i]));
        float s = scale_of(msg, b);
        cr_assert_eq(s, m / 127.0f, "bucket %zu: scale %a, max/127 = %a", b, s, m / 127.0f);
        int saw_full = 0;
        for (size_t i = lo; i < hi; i++) {
            cr_assert(q[i] >= -127 && q[i] <= 127, "code %d at %zu", q[i], i);
            saw_full |= q[i] == 127 || q[i] == -127;
            /* s/2 plus the fp32 rounding of x/s and of s*q (< 2 * 127 ulp). */
            cr_assert_leq(fabsf(x[i] - y[i]), s * (0.5f + 2e-5f), "element %zu: %a -> %a, s %a", i,
                          x[i], y[i], s);
        }
        cr_assert(saw_full, "bucket %zu: its max did not map to +-127", b);
    }
    free(msg);
    free(x);
    free(y);
    terse_codec_free(c);
}

Test(int8, short_last_bucket_gets_its_own_scale) {
    float x[520];
    tu_fill_uniform(x, 520, 2, -100.0f, 100.0f);
    for (size_t i = 512; i < 520; i++) x[i] = 1e-3f * ((float)i - 515.0f);
    x[519] = -0.004f; /* the tail's max |x| */
    terse_codec *c = make("int8:bucket=512", 520);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_assert_eq(len, TERSE_WIRE_HEADER_SIZE + 8 + 520);
    cr_expect_eq(scale_of(msg, 1), 0.004f / 127.0f);
    cr_expect_eq((int8_t)msg[TERSE_WIRE_HEADER_SIZE + 8 + 519], -127);
    float y[520];
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
    for (size_t i = 512; i < 520; i++)
        cr_expect_leq(fabsf(x[i] - y[i]), 0.004f / 127.0f * 0.5001f, "tail element %zu", i);
    free(msg);
    terse_codec_free(c);
}

Test(int8, all_zero_bucket_sends_scale_zero_and_decodes_to_zeros) {
    float x[24] = {0}, y[24];
    x[3] = -0.0f;
    x[16] = 5.0f; /* third bucket is not zero */
    terse_codec *c = make("int8:bucket=8", 24);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_expect_eq(bits_of(scale_of(msg, 0)), 0u);
    cr_expect_eq(bits_of(scale_of(msg, 1)), 0u);
    cr_expect_eq(scale_of(msg, 2), 5.0f / 127.0f);
    for (size_t i = 0; i < 16; i++) cr_expect_eq(msg[TERSE_WIRE_HEADER_SIZE + 12 + i], 0);
    for (size_t i = 0; i < 24; i++) y[i] = 9.0f;
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
    for (size_t i = 0; i < 16; i++) cr_expect_eq(bits_of(y[i]), 0u, "element %zu", i);
    cr_expect_eq(y[16], 5.0f);
    free(msg);
    terse_codec_free(c);
}

Test(int8, bucket_with_inf_or_nan_decodes_to_nan_and_spares_the_others) {
    float x[32], y[32];
    tu_fill_gauss(x, 32, 4);
    x[1] = INFINITY;
    x[10] = NAN;
    x[17] = -INFINITY;
    x[18] = NAN; /* bucket 2 holds both */
    terse_codec *c = make("int8:bucket=8", 32);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    for (size_t b = 0; b < 3; b++) {
        cr_expect_eq(bits_of(scale_of(msg, b)), 0x7fc00000u, "bucket %zu", b);
        for (size_t i = 0; i < 8; i++)
            cr_expect_eq(msg[TERSE_WIRE_HEADER_SIZE + 16 + 8 * b + i], 0);
    }
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
    for (size_t i = 0; i < 24; i++) cr_expect(isnan(y[i]), "element %zu = %g", i, y[i]);
    for (size_t i = 24; i < 32; i++) cr_expect(isfinite(y[i]), "element %zu = %g", i, y[i]);
    free(msg);
    terse_codec_free(c);
}

Test(int8, tiny_and_huge_buckets_stay_finite_and_within_bound) {
    /* Bucket 0: max/127 underflows to 0. Bucket 1: subnormal scale.
     * Bucket 2: FLT_MAX. Bucket 3: denormals next to a normal max. */
    float x[32] = {1e-44f,  -1e-45f,  0,      3e-45f, 0,      0, 0,  1e-44f,
                   1e-38f,  -5e-39f,  2e-40f, 0,      1e-45f, 0, 0,  -1e-38f,
                   FLT_MAX, -FLT_MAX, 1e30f,  -3e37f, 0,      1, -1, 2e38f,
                   1e-40f,  -1e-41f,  1e-30f, 0,      0,      0, 0,  0};
    float y[32];
    terse_codec *c = make("int8:bucket=8", 32);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_expect_eq(bits_of(scale_of(msg, 0)), 0u);
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
    for (size_t i = 0; i < 32; i++) {
        float s = scale_of(msg, i / 8);
        cr_expect(isfinite(y[i]), "element %zu", i);
        /* The documented slack for subnormal (or flushed) scales. */
        cr_expect_leq(fabsf(x[i] - y[i]), s * (0.5f + 2e-5f) + 0x1.fcp-144f /* 127 * 2^-150 */,
                      "element %zu", i);
    }
    /* 127 * fl(FLT_MAX / 127) would overflow: the scale is one ulp smaller. */
    cr_expect(y[16] > 0.99999f * FLT_MAX && y[16] <= FLT_MAX, "%a", y[16]);
    cr_expect_eq(y[17], -y[16]);
    free(msg);
    terse_codec_free(c);
}

Test(int8, decode_with_accumulate_equals_decode_plus_add_bitwise) {
    size_t n = 4099;
    float *x = malloc(n * 4), *base = malloc(n * 4), *y = malloc(n * 4), *z = malloc(n * 4);
    fill_varied(x, n, 64, 5);
    tu_fill_gauss(base, n, 6);
    terse_codec *c = make("int8:bucket=64", n);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    const float alphas[] = {1.0f, -1.0f, 0.37f, 1.0f / 3.0f};
    for (size_t a = 0; a < 4; a++) {
        cr_assert_eq(terse_decode(c, msg, len, y, alphas[a], 0), TERSE_OK);
        memcpy(z, base, n * 4);
        cr_assert_eq(terse_decode(c, msg, len, z, alphas[a], 1), TERSE_OK);
        for (size_t i = 0; i < n; i++) {
            float want = base[i] + y[i];
            cr_assert_eq(bits_of(z[i]), bits_of(want), "alpha %g element %zu: %a != %a", alphas[a],
                         i, z[i], want);
        }
    }
    free(msg);
    free(x);
    free(base);
    free(y);
    free(z);
    terse_codec_free(c);
}

Test(int8, two_fresh_codecs_encode_identical_bytes) {
    size_t n = 3001;
    float *x = malloc(n * 4);
    fill_varied(x, n, 100, 7);
    terse_codec *a = make("int8:bucket=100", n), *b = make("int8:bucket=100", n);
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
    terse__int8_encode_fn enc;
    terse__int8_decode_fn dec;
} level;

static size_t simd_levels(level *out) {
    size_t k = 0;
#if defined(__x86_64__)
    unsigned f = terse__cpu_features();
    if (f & TERSE_CPU_AVX2)
        out[k++] = (level){"avx2", terse__int8_encode_avx2, terse__int8_decode_avx2};
    if (f & TERSE_CPU_AVX512)
        out[k++] = (level){"avx512", terse__int8_encode_avx512, terse__int8_decode_avx512};
#endif
    static int warned;
    if (k == 0 && !warned++)
        fprintf(stderr, "[NOTE] no SIMD level enabled (CPU or TERSE_SIMD): only the reference ran\n");
    return k;
}

/* Encode with every level and decode the reference payload with every
 * level (alpha 0.3, plain and accumulating); all bytes must agree. */
static void expect_levels_agree(const float *x, size_t n, size_t bucket) {
    level lv[2];
    size_t nl = simd_levels(lv), nb = (n + bucket - 1) / bucket, plen = 4 * nb + n;
    uint8_t *ref = malloc(plen), *got = malloc(plen);
    float *dref = malloc(n * 4), *dgot = malloc(n * 4);
    terse__int8_encode_scalar(x, n, bucket, ref, (int8_t *)(ref + 4 * nb));
    for (size_t l = 0; l < nl; l++) {
        memset(got, 0xa5, plen);
        lv[l].enc(x, n, bucket, got, (int8_t *)(got + 4 * nb));
        for (size_t i = 0; i < plen; i++)
            cr_assert_eq(got[i], ref[i], "%s encode n=%zu B=%zu: payload byte %zu differs",
                         lv[l].name, n, bucket, i);
        for (int acc = 0; acc < 2; acc++) {
            for (size_t i = 0; i < n; i++) dref[i] = dgot[i] = (float)(i % 7) - 3.0f;
            terse__int8_decode_scalar(ref, (const int8_t *)(ref + 4 * nb), n, bucket, dref, 0.3f,
                                      acc);
            lv[l].dec(ref, (const int8_t *)(ref + 4 * nb), n, bucket, dgot, 0.3f, acc);
            cr_assert_eq(memcmp(dref, dgot, n * 4), 0, "%s decode n=%zu B=%zu acc=%d differs",
                         lv[l].name, n, bucket, acc);
        }
    }
    free(ref);
    free(got);
    free(dref);
    free(dgot);
}

Test(int8, simd_kernels_equal_the_reference_bitwise_at_odd_lengths) {
    const size_t lens[] = {1, 7, 8, 33, 1000003};
    const size_t buckets[] = {8, 9, 512, 1000};
    float *x = malloc(1000003 * 4);
    fill_varied(x, 1000003, 37, 8);
    for (size_t a = 0; a < 5; a++)
        for (size_t b = 0; b < 4; b++) expect_levels_agree(x, lens[a], buckets[b]);
    free(x);
}

Test(int8, simd_kernels_equal_the_reference_bitwise_on_special_values) {
    const float special[] = {0.0f,     -0.0f,   1e-45f,   -1e-45f, 1e-40f,   -3e-39f,
                             1.2e-38f, FLT_MAX, -FLT_MAX, 3e38f,   INFINITY, -INFINITY,
                             NAN,      -NAN,    1.0f,     -1.0f,   127.5f,   0.5f};
    size_t ns = sizeof special / sizeof special[0], n = 4096 + 77;
    float *x = malloc(n * 4);
    tu_fill_gauss(x, n, 9);
    /* Sparse specials keep most buckets finite; the last 512 are all special. */
    for (size_t i = 0; i < n; i += 97) x[i] = special[(i / 97) % ns];
    for (size_t i = n - 512; i < n; i++) x[i] = special[i % 8] * (i % 3 ? 1.0f : 1e-3f);
    for (size_t i = 2048; i < 2560; i++) x[i] = 1e-41f * (float)((int)(i % 13) - 6);
    expect_levels_agree(x, n, 8);
    expect_levels_agree(x, n, 64);
    expect_levels_agree(x, n, 512);
    free(x);
}

Test(int8, simd_decoders_equal_the_reference_on_arbitrary_payload_bytes) {
    /* A peer may send any scale (Inf, NaN, subnormal) and code -128. */
    size_t n = 1031, bucket = 16, nb = (n + bucket - 1) / bucket, plen = 4 * nb + n;
    uint8_t *p = malloc(plen);
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < plen; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (uint8_t)(st >> 56);
    }
    const uint32_t odd[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x00000001u, 0x7f7fffffu};
    for (size_t k = 0; k < 5; k++) memcpy(p + 4 * k, &odd[k], 4);
    level lv[2];
    size_t nl = simd_levels(lv);
    float *a = malloc(n * 4), *b = malloc(n * 4);
    for (size_t l = 0; l < nl; l++)
        for (int acc = 0; acc < 2; acc++) {
            for (size_t i = 0; i < n; i++) a[i] = b[i] = 1.0f;
            terse__int8_decode_scalar(p, (const int8_t *)(p + 4 * nb), n, bucket, a, -0.5f, acc);
            lv[l].dec(p, (const int8_t *)(p + 4 * nb), n, bucket, b, -0.5f, acc);
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
    terse__wire_seal(m, TERSE_ID_INT8, n, plen);
    return m;
}

Test(int8, payload_of_wrong_length_with_valid_crc_is_corrupt) {
    size_t n = 100;
    float x[100], y[100];
    tu_fill_gauss(x, n, 10);
    terse_codec *c = make("int8:bucket=32", n); /* 4 scales + 100 codes */
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    size_t plen = len - TERSE_WIRE_HEADER_SIZE;
    cr_assert_eq(plen, 116);
    const size_t bad[] = {0, 1, 16, 115};
    for (size_t k = 0; k < 4; k++) {
        uint8_t *m = craft(bad[k], n, msg + TERSE_WIRE_HEADER_SIZE);
        for (size_t i = 0; i < n; i++) y[i] = 7.0f;
        terse_status s = terse_decode(c, m, TERSE_WIRE_HEADER_SIZE + bad[k], y, 1.0f, 0);
        cr_expect_eq(s, TERSE_ERR_CORRUPT, "payload of %zu bytes gave %s", bad[k],
                     terse_status_name(s));
        cr_expect_not_null(strstr(terse_last_error(), "int8"), "%s", terse_last_error());
        cr_expect_not_null(strstr(terse_last_error(), "116"), "%s", terse_last_error());
        for (size_t i = 0; i < n; i++) cr_expect_eq(y[i], 7.0f);
        free(m);
    }
    /* Non-finite scales and code -128 are not length faults: they decode. */
    uint8_t *p = malloc(plen);
    memcpy(p, msg + TERSE_WIRE_HEADER_SIZE, plen);
    uint32_t inf = 0x7f800000u, nan = 0x7fc00001u;
    memcpy(p, &inf, 4);
    memcpy(p + 4, &nan, 4);
    memset(p + 16, 0x80, 100);
    uint8_t *m = craft(plen, n, p);
    cr_expect_eq(terse_decode(c, m, len, y, 1.0f, 0), TERSE_OK, "%s", terse_last_error());
    cr_expect(isinf(y[0]) && y[0] < 0);
    cr_expect(isnan(y[32]));
    free(m);
    free(p);
    free(msg);
    terse_codec_free(c);
}

Test(int8, bucket_outside_8_to_2_pow_24_is_invalid_and_named) {
    tu_expect_bad_spec("int8:bucket=0", "bucket=0");
    tu_expect_bad_spec("int8:bucket=7", "bucket=7");
    tu_expect_bad_spec("int8:bucket=16777217", "bucket=16777217");
    tu_expect_bad_spec("int8:bucket=abc", "bucket=abc");
    tu_expect_bad_spec("int8:bucket=-8", "bucket=-8");
    tu_expect_bad_spec("int8:bits=8", "bits");
    tu_expect_bad_spec("int8:seed=1", "seed"); /* deterministic: no seed */
}

Test(int8, spec_is_canonical_and_bound_is_exact) {
    terse_codec *c = make("int8", 1000);
    cr_expect_str_eq(terse_codec_spec(c), "int8:bucket=512,ef=0");
    cr_expect_eq(terse_codec_bound(c), TERSE_WIRE_HEADER_SIZE + 2 * 4 + 1000);
    terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
    cr_assert_eq(terse_codec_get_traits(c, &t), TERSE_OK);
    cr_expect_eq(t.summable, 0);
    cr_expect_eq(t.randomized, 0);
    cr_expect_float_eq(t.bits_per_element, 8.0 * 1008 / 1000, 1e-12);
    terse_codec_free(c);
    c = make("int8:bucket=16777216,ef=1", 8);
    cr_expect_str_eq(terse_codec_spec(c), "int8:bucket=16777216,ef=1");
    cr_expect_eq(terse_codec_bound(c), TERSE_WIRE_HEADER_SIZE + 4 + 8);
    terse_codec_free(c);
}
