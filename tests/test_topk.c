/* topk: exact top-k by magnitude, index coding, and a decoder that trusts
 * nothing. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "compress/codec_internal.h"
#include "compress/topk_select.h"
#include "compress/wire.h"
#include "testutil.h"

#define H TERSE_WIRE_HEADER_SIZE

/* ---- an independent reference and payload reader ---- */

typedef struct {
    uint32_t key;
    size_t i;
} keyed;

static uint32_t key_of(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return u & 0x7fffffffu;
}

static int by_key_desc_index_asc(const void *pa, const void *pb) {
    const keyed *a = pa, *b = pb;
    if (a->key != b->key) return a->key > b->key ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

static int by_u64(const void *pa, const void *pb) {
    uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
    return a < b ? -1 : a > b;
}

/* The k kept indices, increasing, by sorting the whole array. */
static void reference_topk(const float *x, size_t n, size_t k, uint64_t *idx) {
    keyed *kv = malloc(n * sizeof *kv);
    for (size_t i = 0; i < n; i++) kv[i] = (keyed){key_of(x[i]), i};
    qsort(kv, n, sizeof *kv, by_key_desc_index_asc);
    for (size_t j = 0; j < k; j++) idx[j] = kv[j].i;
    qsort(idx, k, sizeof *idx, by_u64);
    free(kv);
}

typedef struct {
    int mode;
    uint64_t k;
    size_t section_len;
    uint64_t *idx; /* k, malloc'd */
    const uint8_t *vals;
} parsed;

/* Read a message as the layout in compress/topk.c describes it. */
static parsed parse_message(const uint8_t *msg, size_t len, size_t n) {
    parsed p;
    const uint8_t *pl = msg + H;
    size_t plen = len - H;
    p.mode = pl[0];
    p.k = terse__get_u64(pl + 1);
    p.vals = pl + 9;
    const uint8_t *sec = pl + 9 + 4 * p.k;
    p.section_len = plen - 9 - 4 * p.k;
    p.idx = malloc((p.k + 1) * sizeof *p.idx);
    size_t j = 0;
    if (p.mode == 1) {
        for (size_t i = 0; i < n; i++)
            if (sec[i / 8] >> (i % 8) & 1) p.idx[j++] = i;
    } else {
        uint64_t next = 0;
        size_t pos = 0;
        while (pos < p.section_len) {
            uint64_t d = 0;
            for (unsigned s = 0;; s += 7) {
                uint8_t b = sec[pos++];
                d |= (uint64_t)(b & 0x7f) << s;
                if (!(b & 0x80)) break;
            }
            next += d;
            p.idx[j++] = next - 1;
        }
    }
    cr_assert_eq(j, p.k, "message holds %zu indices, k is %llu", j, (unsigned long long)p.k);
    return p;
}

static size_t varint_bytes_of(const uint64_t *idx, size_t k) {
    size_t bytes = 0;
    uint64_t next = 0;
    for (size_t j = 0; j < k; j++) {
        uint64_t d = idx[j] + 1 - next;
        next = idx[j] + 1;
        do {
            bytes++;
            d >>= 7;
        } while (d);
    }
    return bytes;
}

static terse_codec *make(const char *spec, size_t n) {
    terse_codec *c = NULL;
    cr_assert_eq(terse_codec_create(spec, n, 1, &c), TERSE_OK, "%s: %s", spec, terse_last_error());
    return c;
}

/* Encode x, and check the message against the sort-based reference: the
 * same indices, the smaller coding, values bit-identical, and a decode
 * that has exactly those values and zeros elsewhere. Returns the coding. */
static int check_against_reference(const char *spec, const float *x, size_t n, size_t want_k) {
    terse_codec *c = make(spec, n);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_assert_leq(len, terse_codec_bound(c));
    parsed p = parse_message(msg, len, n);
    cr_assert_eq(p.k, want_k, "%s: k = %llu", spec, (unsigned long long)p.k);
    uint64_t *ref = malloc(want_k * sizeof *ref);
    reference_topk(x, n, want_k, ref);
    for (size_t j = 0; j < want_k; j++)
        cr_assert_eq(p.idx[j], ref[j], "%s n=%zu: kept index %zu is %llu, reference %llu", spec, n,
                     j, (unsigned long long)p.idx[j], (unsigned long long)ref[j]);
    size_t bitmap = (n + 7) / 8, varints = varint_bytes_of(ref, want_k);
    cr_assert_eq(p.section_len, bitmap < varints ? bitmap : varints, "%s: not the smaller coding",
                 spec);
    cr_assert_eq(p.mode, bitmap < varints ? 1 : 0);

    float *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = 12345.0f; /* stale contents must vanish */
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK, "%s", terse_last_error());
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t got, want = 0;
        memcpy(&got, y + i, 4);
        if (j < want_k && ref[j] == i) {
            memcpy(&want, x + i, 4);
            cr_assert_eq(memcmp(p.vals + 4 * j, x + i, 4), 0, "payload value %zu", j);
            j++;
        }
        cr_assert_eq(got, want, "%s: decoded[%zu] bits 0x%08x, want 0x%08x", spec, i, got, want);
    }
    int mode = p.mode;
    free(y);
    free(ref);
    free(p.idx);
    free(msg);
    terse_codec_free(c);
    return mode;
}

/* ---- selection ---- */

Test(topk, keeps_exactly_the_k_largest_magnitudes_of_random_input) {
    size_t n = 100003;
    float *x = malloc(n * sizeof *x);
    tu_fill_gauss(x, n, 11);
    check_against_reference("topk:ratio=0.01", x, n, 1000);
    check_against_reference("topk:ratio=0.3", x, n, 30001);
    check_against_reference("topk:k=1", x, n, 1);
    check_against_reference("topk:k=100003", x, n, n);
    tu_fill_uniform(x, n, 12, -1.0f, 1.0f);
    check_against_reference("topk:k=777", x, n, 777);
    free(x);
}

Test(topk, breaks_ties_towards_the_lower_index) {
    /* Five magnitudes only, so every k cuts through a run of equal keys;
     * +v and -v are equal keys too. */
    static const float set[5] = {0.5f, -1.0f, 2.0f, -2.0f, 0.0f};
    size_t n = 5000;
    float *x = malloc(n * sizeof *x);
    uint64_t key = 99;
    for (size_t i = 0; i < n; i++) {
        key = key * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = set[(key >> 33) % 5];
    }
    static const size_t ks[] = {1, 3, 999, 1000, 1001, 2500, 4000, 4999, 5000};
    char spec[64];
    for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
        snprintf(spec, sizeof spec, "topk:k=%zu", ks[t]);
        check_against_reference(spec, x, n, ks[t]);
    }
    for (size_t i = 0; i < n; i++) x[i] = -3.0f; /* all equal: the first k win */
    check_against_reference("topk:k=17", x, n, 17);
    free(x);
}

Test(topk, orders_nan_above_inf_above_finite_and_keeps_their_bits) {
    size_t n = 4099;
    float *x = malloc(n * sizeof *x);
    tu_fill_gauss(x, n, 5);
    uint32_t qnan = 0x7fc00001u, neg_nan = 0xffc00abcu, denorm = 0x00000003u;
    memcpy(x + 10, &qnan, 4);
    memcpy(x + 4000, &neg_nan, 4);
    memcpy(x + 7, &denorm, 4);
    x[20] = INFINITY;
    x[21] = -INFINITY;
    x[22] = -0.0f;
    x[23] = 0.0f;
    x[24] = FLT_MAX;
    x[25] = -FLT_MAX;
    x[26] = 1e-40f;
    for (size_t k = 1; k <= 8; k++) {
        char spec[32];
        snprintf(spec, sizeof spec, "topk:k=%zu", k);
        check_against_reference(spec, x, n, k);
    }
    check_against_reference("topk:k=4099", x, n, n);
    /* Mostly zeros, both signs: the kept zeros are the first ones. */
    for (size_t i = 0; i < n; i++) x[i] = (i % 3) ? 0.0f : -0.0f;
    x[100] = 1e-45f;
    check_against_reference("topk:k=50", x, n, 50);
    free(x);
}

Test(topk, handles_one_element_and_k_equal_to_n) {
    float one[1] = {-2.5f};
    check_against_reference("topk", one, 1, 1);
    check_against_reference("topk:ratio=1", one, 1, 1);
    float nine[9] = {1, -9, 3, 8, -2, 7, 0, 6, 5};
    check_against_reference("topk:k=9", nine, 9, 9);
    check_against_reference("topk:k=4", nine, 9, 4);
}

Test(topk, buckets_larger_than_the_scratch_rescan_the_input) {
    /* All magnitudes within one top-level radix bucket (same exponent and
     * leading mantissa bits), far more than the n/8 candidate scratch. */
    size_t n = 70001;
    float *x = malloc(n * sizeof *x);
    tu_fill_uniform(x, n, 3, 1.0f, 1.1f);
    for (size_t i = 0; i < n; i += 2) x[i] = -x[i];
    check_against_reference("topk:ratio=0.01", x, n, 700);
    check_against_reference("topk:ratio=0.9", x, n, 63001);
    for (size_t i = 0; i < n; i++) x[i] = 1.0f + (float)(i % 3) * 1e-7f; /* every level overflows */
    check_against_reference("topk:k=30000", x, n, 30000);
    free(x);
}

Test(topk, select_internals_match_the_reference_on_odd_lengths) {
    static const size_t lens[] = {1, 7, 33, 1000, 40000, 1000003};
    for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++) {
        size_t n = lens[t];
        float *x = malloc(n * sizeof *x);
        tu_fill_gauss(x, n, 40 + t);
        size_t cap = n / 8 + 1; /* small scratch: exercise both paths */
        terse_topk_scratch s;
        s.cand = malloc((cap + 1) * sizeof(float));
        s.cand_cap = cap;
        s.sub = malloc(4 * TERSE_TOPK_SUB_STRIDE * sizeof *s.sub);
        s.hist = malloc(TERSE_TOPK_MAX_BINS * sizeof *s.hist);
        uint64_t *idx = malloc((n + 1) * sizeof *idx), *ref = malloc(n * sizeof *ref);
        float *val = malloc((n + 1) * sizeof *val);
        size_t ks[3] = {1, (n + 1) / 2, n};
        if (n > 100000) ks[0] = ks[1] = ks[2] = n / 100; /* one sort is enough */
        for (int q = 0; q < 3; q++) {
            uint32_t thr;
            size_t take;
            terse__topk_threshold(x, n, ks[q], &s, &thr, &take);
            cr_assert_eq(terse__topk_gather(x, n, thr, take, idx, val), ks[q]);
            reference_topk(x, n, ks[q], ref);
            cr_assert_eq(memcmp(idx, ref, ks[q] * sizeof *idx), 0, "n=%zu k=%zu", n, ks[q]);
        }
        free(x), free(s.cand), free(s.sub), free(s.hist), free(idx), free(ref), free(val);
    }
}

/* ---- coding ---- */

Test(topk, sends_varints_at_small_ratios_and_a_bitmap_at_large_ones) {
    size_t n = 10007;
    float *x = malloc(n * sizeof *x);
    tu_fill_gauss(x, n, 8);
    cr_expect_eq(check_against_reference("topk:ratio=0.01", x, n, 100), 0);
    cr_expect_eq(check_against_reference("topk:ratio=0.5", x, n, 5004), 1);
    /* The k largest sit on adjacent indices ending at 2999: k varints of
     * one byte, plus one more byte for the first (a delta >= 128). The
     * bitmap's 1251 bytes win from k = 1251 on, and not before. */
    for (size_t i = 0; i < n; i++) x[i] = i < 3000 ? 10.0f + (float)i : 1.0f;
    cr_expect_eq(check_against_reference("topk:k=1249", x, n, 1249), 0);
    cr_expect_eq(check_against_reference("topk:k=1250", x, n, 1250), 0); /* a tie: varints */
    cr_expect_eq(check_against_reference("topk:k=1251", x, n, 1251), 1);
    free(x);
}

Test(topk, bound_is_reached_by_the_worst_index_spacing) {
    /* n = 10000, k = 50: every delta can be 128 (2 bytes), no more. */
    size_t n = 10000, k = 50;
    terse_codec *c = make("topk:k=50", n);
    cr_assert_eq(terse_codec_bound(c), H + 9 + 4 * k + 2 * k);
    float *x = calloc(n, sizeof *x);
    for (size_t j = 0; j < k; j++) x[128 * (j + 1) - 1] = 1.0f + (float)j;
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_expect_eq(len, terse_codec_bound(c));
    free(msg);
    terse_codec_free(c);
    /* Where the bitmap is smaller than any varint worst case, it bounds. */
    c = make("topk:ratio=0.5", 1001);
    cr_expect_eq(terse_codec_bound(c), H + 9 + 4 * 501 + 126);
    terse_codec_free(c);
    free(x);
}

/* ---- decode ---- */

Test(topk, round_trip_error_is_at_most_the_dropped_share_of_energy) {
    size_t n = 20000;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    tu_fill_gauss(x, n, 21);
    terse_codec *c = make("topk:ratio=0.1", n);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
    double err = tu_rel_err(x, y, n);
    cr_expect_leq(err * err, 1.0 - 0.1, "rel err %g", err);
    cr_expect_gt(err, 0.0);
    free(msg), free(x), free(y);
    terse_codec_free(c);
}

Test(topk, decode_with_accumulate_equals_decode_plus_add) {
    size_t n = 3001;
    float *x = malloc(n * sizeof *x), *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    tu_fill_gauss(x, n, 31);
    const char *specs[] = {"topk:ratio=0.02", "topk:ratio=0.6"}; /* both codings */
    for (int s = 0; s < 2; s++) {
        terse_codec *c = make(specs[s], n);
        uint8_t *msg;
        size_t len = tu_encode(c, x, &msg);
        tu_fill_uniform(a, n, 32, -1, 1);
        memcpy(b, a, n * sizeof *a);
        cr_assert_eq(terse_decode(c, msg, len, a, -0.75f, 1), TERSE_OK);
        float *d = malloc(n * sizeof *d);
        cr_assert_eq(terse_decode(c, msg, len, d, -0.75f, 0), TERSE_OK);
        for (size_t i = 0; i < n; i++) b[i] += d[i];
        cr_expect_eq(memcmp(a, b, n * sizeof *a), 0, "%s", specs[s]);
        free(d), free(msg);
        terse_codec_free(c);
    }
    free(x), free(a), free(b);
}

Test(topk, encoding_is_deterministic_across_fresh_codecs) {
    size_t n = 50000;
    float *x = malloc(n * sizeof *x);
    tu_fill_gauss(x, n, 41);
    uint8_t *m1, *m2;
    terse_codec *c1 = make("topk:ratio=0.01", n), *c2 = make("topk:ratio=0.01", n);
    size_t l1 = tu_encode(c1, x, &m1), l2 = tu_encode(c2, x, &m2);
    cr_assert_eq(l1, l2);
    cr_expect_eq(memcmp(m1, m2, l1), 0);
    free(m1), free(m2), free(x);
    terse_codec_free(c1);
    terse_codec_free(c2);
}

/* ---- crafted payloads (valid CRC) ---- */

/* n = 100000, k = 10: the index section may be up to 26 bytes, room for
 * every malformed varint below. */
#define CN 100000u
#define CK 10u

/* Build a payload (mode, k, CK values of 1.0, then sec), seal it, decode
 * it; dst must be left untouched on error. */
static terse_status craft(terse_codec *c, uint8_t mode, uint64_t k, const uint8_t *sec,
                          size_t slen) {
    size_t plen = 9 + 4 * CK + slen;
    uint8_t *msg = calloc(1, H + plen);
    msg[H] = mode;
    terse__put_u64(msg + H + 1, k);
    for (size_t j = 0; j < CK; j++) terse__put_f32(msg + H + 9 + 4 * j, 1.0f);
    memcpy(msg + H + 9 + 4 * CK, sec, slen);
    terse__wire_seal(msg, TERSE_ID_TOPK, CN, plen);
    float *dst = malloc(CN * sizeof *dst);
    for (size_t i = 0; i < CN; i++) dst[i] = 7.0f;
    terse_status st = terse_decode(c, msg, H + plen, dst, 1.0f, 0);
    if (st != TERSE_OK)
        for (size_t i = 0; i < CN; i++) cr_assert_eq(dst[i], 7.0f, "dst[%zu] written on error", i);
    free(dst);
    free(msg);
    return st;
}

static void expect_corrupt(terse_codec *c, uint8_t mode, uint64_t k, const uint8_t *sec,
                           size_t slen, const char *what, const char *says) {
    terse_status st = craft(c, mode, k, sec, slen);
    cr_expect_eq(st, TERSE_ERR_CORRUPT, "%s: got %s", what, terse_status_name(st));
    cr_expect_not_null(strstr(terse_last_error(), says), "%s: error '%s' lacks '%s'", what,
                       terse_last_error(), says);
}

Test(topk, crafted_varint_payloads_are_corrupt_never_a_crash) {
    terse_codec *c = make("topk:k=10", CN);
    uint8_t ok[CK];
    for (size_t j = 0; j < CK; j++) ok[j] = 5;
    cr_assert_eq(craft(c, 0, CK, ok, CK), TERSE_OK, "%s", terse_last_error());

    uint8_t sec[32];
    memcpy(sec, ok, CK);
    sec[4] = 0; /* delta 0: index repeats */
    expect_corrupt(c, 0, CK, sec, CK, "repeated index", "strictly increase");
    memcpy(sec, ok, CK);
    /* the last delta lands on index n: 44 + (n - 44) */
    uint64_t d = CN - 44;
    sec[9] = (uint8_t)(d | 0x80), sec[10] = (uint8_t)((d >> 7) | 0x80), sec[11] = (uint8_t)(d >> 14);
    expect_corrupt(c, 0, CK, sec, 12, "index == n", "past the tensor");
    memcpy(sec, ok, CK);
    sec[3] = 0x85, sec[4] = 0x00; /* 5 as two bytes, then 8 more */
    memcpy(sec + 5, ok, 6);
    expect_corrupt(c, 0, CK, sec, 11, "overlong varint", "overlong");
    memcpy(sec, ok, CK);
    sec[9] = 0x85; /* last varint never ends */
    expect_corrupt(c, 0, CK, sec, CK, "unterminated varint", "past the end");
    memcpy(sec, ok, 9);
    memset(sec + 9, 0x80, 6);
    sec[15] = 0x01; /* seven bytes */
    expect_corrupt(c, 0, CK, sec, 16, "seven-byte varint", "longer than 6");
    memcpy(sec, ok, CK);
    sec[CK] = 1; /* an eleventh index */
    expect_corrupt(c, 0, CK, sec, CK + 1, "trailing bytes", "follow the last");
    expect_corrupt(c, 0, CK, ok, CK - 1, "too few varints", "past the end");
    expect_corrupt(c, 0, CK + 1, ok, CK, "wrong k", "k at payload byte 1");
    expect_corrupt(c, 0, UINT64_MAX, ok, CK, "huge k", "k at payload byte 1");
    expect_corrupt(c, 2, CK, ok, CK, "bad coding", "index coding");
    expect_corrupt(c, 0xff, CK, ok, CK, "bad coding", "index coding");
    terse_codec_free(c);
}

Test(topk, crafted_bitmap_payloads_are_corrupt_never_a_crash) {
    /* n = 100003 so the last bitmap byte has 3 valid bits. */
    size_t n = 100003, k = 50001;
    terse_codec *c = make("topk:k=50001", n);
    size_t bm = (n + 7) / 8, plen = 9 + 4 * k + bm;
    uint8_t *msg = calloc(1, H + plen + 1);
    float *dst = malloc(n * sizeof *dst);
    uint8_t *sec = msg + H + 9 + 4 * k;
    msg[H] = 1;
    terse__put_u64(msg + H + 1, k);
    for (size_t j = 0; j < k; j++) terse__put_f32(msg + H + 9 + 4 * j, 1.0f);
    for (size_t i = 0; i < 2 * k - 1; i += 2) sec[i / 8] |= (uint8_t)(1u << (i % 8)); /* evens */
    struct {
        const char *what, *says;
        size_t byte;
        uint8_t xor_mask;
        size_t len_delta; /* 1 = one byte short */
    } cases[] = {
        {"valid", NULL, 0, 0, 0},
        {"bit past n", "past the", bm - 1, 0x08, 0},
        {"high bit past n", "past the", bm - 1, 0x80, 0},
        {"one bit too many", "marks", 3, 0x02, 0},
        {"one bit too few", "marks", 3, 0x01, 0},
        {"short bitmap", "bitmap at payload byte", 0, 0, 1},
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        sec[cases[t].byte] ^= cases[t].xor_mask;
        size_t l = plen - cases[t].len_delta;
        terse__wire_seal(msg, TERSE_ID_TOPK, n, l);
        for (size_t i = 0; i < n; i++) dst[i] = 7.0f;
        terse_status st = terse_decode(c, msg, H + l, dst, 1.0f, 0);
        sec[cases[t].byte] ^= cases[t].xor_mask;
        if (!cases[t].says) {
            cr_assert_eq(st, TERSE_OK, "%s", terse_last_error());
            for (size_t i = 0; i < n; i++) cr_assert_eq(dst[i], i % 2 == 0 && i < 2 * k ? 1.0f : 0.0f);
            continue;
        }
        cr_expect_eq(st, TERSE_ERR_CORRUPT, "%s: %s", cases[t].what, terse_status_name(st));
        cr_expect_not_null(strstr(terse_last_error(), cases[t].says), "%s: '%s'", cases[t].what,
                           terse_last_error());
        for (size_t i = 0; i < n; i++) cr_assert_eq(dst[i], 7.0f, "%s wrote dst", cases[t].what);
    }
    free(msg), free(dst);
    terse_codec_free(c);
}

Test(topk, payloads_too_short_for_head_or_values_are_corrupt) {
    terse_codec *c = make("topk:k=10", CN);
    float *dst = malloc(CN * sizeof *dst);
    uint8_t pl[64] = {0};
    terse__put_u64(pl + 1, CK);
    /* The core lets any length <= bound through; the codec must cope. */
    static const size_t lens[] = {0, 1, 8, 9, 20, 48};
    for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++)
        cr_expect_eq(c->ops.decode(c->self, pl, lens[t], dst, 1.0f, 0), TERSE_ERR_CORRUPT, "len %zu",
                     lens[t]);
    free(dst);
    terse_codec_free(c);
}

/* ---- spec ---- */

Test(topk, bad_specs_are_invalid_and_name_the_token) {
    tu_expect_bad_spec("topk:ratio=2", "ratio=2");
    tu_expect_bad_spec("topk:ratio=0", "ratio=0");
    tu_expect_bad_spec("topk:ratio=-0.5", "ratio=-0.5");
    tu_expect_bad_spec("topk:ratio=", "ratio=");
    tu_expect_bad_spec("topk:ratio=abc", "ratio=abc");
    tu_expect_bad_spec("topk:k=0", "k=0");
    tu_expect_bad_spec("topk:k=101", "k=101");
    tu_expect_bad_spec("topk:ratio=0.1,k=5", "'ratio' or 'k'");
    tu_expect_bad_spec("topk:seed=1", "seed");
    tu_expect_bad_spec("topk:bucket=4", "bucket");
}

Test(topk, canonical_spec_spells_out_k_or_ratio) {
    struct {
        const char *spec, *canon;
        size_t bound_k;
    } t[] = {
        {"topk", "topk:ratio=0.01,ef=0", 1},
        {"topk:ratio=0.3,ef=1", "topk:ratio=0.3,ef=1", 30},
        {"topk:k=7", "topk:k=7,ef=0", 7},
        {"topk:ratio=0.001", "topk:ratio=0.001,ef=0", 1},
        {"topk:ratio=0.125", "topk:ratio=0.125,ef=0", 13}, /* round(12.5) */
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        terse_codec *c = make(t[i].spec, 100);
        cr_expect_str_eq(terse_codec_spec(c), t[i].canon);
        /* n = 100 leaves no room for a 2-byte delta: varints take at most
         * k bytes, the bitmap 13. */
        size_t vw = t[i].bound_k, bm = 13;
        cr_expect_eq(terse_codec_bound(c), H + 9 + 4 * t[i].bound_k + (vw < bm ? vw : bm), "%s",
                     t[i].spec);
        terse_codec *again = make(terse_codec_spec(c), 100);
        cr_expect_str_eq(terse_codec_spec(again), t[i].canon);
        terse_codec_free(again);
        terse_codec_free(c);
    }
    terse_codec_traits tr = TERSE_CODEC_TRAITS_INIT;
    terse_codec *c = make("topk", 100);
    cr_assert_eq(terse_codec_get_traits(c, &tr), TERSE_OK);
    cr_expect_eq(tr.summable, 0);
    cr_expect_eq(tr.randomized, 0);
    terse_codec_free(c);
}
