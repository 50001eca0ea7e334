/* powersgd: one warm-started power iteration, its dense fallback, state,
 * and payload validation. */
#include <criterion/criterion.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/crc32c.h"
#include "compress/wire.h"
#include "compress/state.h"
#include "testutil.h"

#define HDR TERSE_WIRE_HEADER_SIZE

static terse_codec *make(const char *spec, size_t rows, size_t cols) {
    terse_codec *c = NULL;
    cr_assert_eq(terse_codec_create(spec, rows, cols, &c), TERSE_OK, "%s: %s", spec,
                 terse_last_error());
    return c;
}

/* M = A B^T with A rows x r and B cols x r Gaussian: rank exactly r. */
static float *rank_r_matrix(size_t rows, size_t cols, size_t r, uint64_t seed) {
    float *a = malloc(rows * r * sizeof(float)), *b = malloc(cols * r * sizeof(float));
    float *m = malloc(rows * cols * sizeof(float));
    tu_fill_gauss(a, rows * r, seed);
    tu_fill_gauss(b, cols * r, seed + 1000);
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) {
            double s = 0;
            for (size_t k = 0; k < r; k++) s += (double)a[i * r + k] * b[j * r + k];
            m[i * cols + j] = (float)s;
        }
    free(a);
    free(b);
    return m;
}

/* Encode x, decode it (alpha 1, overwrite) into y; return the message. */
static size_t round_trip(terse_codec *c, const float *x, float *y, uint8_t **msg) {
    size_t len = tu_encode(c, x, msg);
    cr_assert_eq(terse_decode(c, *msg, len, y, 1.0f, 0), TERSE_OK, "%s", terse_last_error());
    return len;
}

/* max |(P^T P)_ij - I_ij| for the P (rows x r, column major) in a message. */
static double orthonormality_defect(const uint8_t *msg, size_t rows, size_t r) {
    const uint8_t *p = msg + HDR + 4;
    double worst = 0;
    for (size_t i = 0; i < r; i++)
        for (size_t j = 0; j < r; j++) {
            double s = 0;
            for (size_t k = 0; k < rows; k++)
                s += (double)terse__get_f32(p + 4 * (i * rows + k)) *
                     terse__get_f32(p + 4 * (j * rows + k));
            double e = fabs(s - (i == j ? 1.0 : 0.0));
            if (!(e <= worst)) worst = e; /* NaN sticks */
        }
    return worst;
}

Test(powersgd, exact_rank_r_matrix_is_reconstructed_after_one_encode) {
    size_t rows = 96, cols = 80;
    float *m = rank_r_matrix(rows, cols, 4, 1), *y = malloc(rows * cols * sizeof(float));
    terse_codec *c = make("powersgd:rank=4", rows, cols);
    uint8_t *msg;
    size_t len = round_trip(c, m, y, &msg);
    cr_expect_eq(len, HDR + 4 + 4 * (rows + cols) * 4);
    double e = tu_rel_err(m, y, rows * cols);
    cr_expect_lt(e, 1e-4, "relative error %g", e);
    cr_expect_lt(orthonormality_defect(msg, rows, 4), 1e-5);
    free(msg);
    terse_codec_free(c);
    free(m);
    free(y);
}

Test(powersgd, rank_above_the_matrix_rank_is_still_exact_and_p_orthonormal) {
    /* P = M Q has rank r_true < R: QR must complete the basis, not divide
     * by a zero norm. R = 40 takes LAPACK's blocked QR path (block 32). */
    const struct {
        size_t rows, cols, r_true;
        const char *spec;
        size_t r;
    } cases[] = {{70, 64, 2, "powersgd:rank=6", 6}, {300, 200, 35, "powersgd:rank=40", 40}};
    for (size_t t = 0; t < 2; t++) {
        size_t rows = cases[t].rows, cols = cases[t].cols;
        float *m = rank_r_matrix(rows, cols, cases[t].r_true, 2 + t);
        float *y = malloc(rows * cols * sizeof(float));
        terse_codec *c = make(cases[t].spec, rows, cols);
        uint8_t *msg;
        round_trip(c, m, y, &msg);
        cr_expect_lt(tu_rel_err(m, y, rows * cols), 1e-4, "%s", cases[t].spec);
        cr_expect_lt(orthonormality_defect(msg, rows, cases[t].r), 1e-5, "%s", cases[t].spec);
        free(msg);
        terse_codec_free(c);
        free(m);
        free(y);
    }
}

Test(powersgd, decoding_does_not_change_the_warm_start) {
    size_t rows = 40, cols = 32, n = rows * cols;
    float *g = malloc(3 * n * sizeof(float)), *y = malloc(n * sizeof(float));
    tu_fill_gauss(g, 3 * n, 61);
    terse_codec *a = make("powersgd:rank=3", rows, cols), *b = make("powersgd:rank=3", rows, cols);
    uint8_t *m1, *other, *ma, *mb;
    free((tu_encode(a, g, &m1), m1));
    free((tu_encode(b, g, &m1), m1));
    terse_codec *o = make("powersgd:rank=3,seed=4", rows, cols);
    size_t olen = tu_encode(o, g + 2 * n, &other);
    /* a decodes a peer's message, twice; that must not touch its Q */
    cr_assert_eq(terse_decode(a, other, olen, y, 1.0f, 0), TERSE_OK);
    cr_assert_eq(terse_decode(a, other, olen, y, 0.5f, 1), TERSE_OK);
    size_t la = tu_encode(a, g + n, &ma), lb = tu_encode(b, g + n, &mb);
    cr_expect(la == lb && memcmp(ma, mb, la) == 0, "decoding changed the codec's state");
    free(other);
    free(ma);
    free(mb);
    terse_codec_free(a);
    terse_codec_free(b);
    terse_codec_free(o);
    free(g);
    free(y);
}

Test(powersgd, warm_start_converges_to_the_best_rank_r_error) {
    /* A full-rank matrix with a decaying spectrum: column j of a Gaussian
     * matrix scaled by 0.85^j. Re-encoding the same matrix (ef=0) is
     * subspace iteration on M M^T, so the error must fall to the optimum
     * sqrt(sum_{i>=r} sigma_i^2), computed here by an SVD. */
    size_t rows = 64, cols = 48, r = 4;
    float *m = malloc(rows * cols * sizeof(float)), *y = malloc(rows * cols * sizeof(float));
    float *a = malloc(rows * cols * sizeof(float)), sv[48], superb[48];
    tu_fill_gauss(m, rows * cols, 5);
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) m[i * cols + j] *= powf(0.85f, (float)j);
    memcpy(a, m, rows * cols * sizeof(float));
    cr_assert_eq(LAPACKE_sgesvd(LAPACK_ROW_MAJOR, 'N', 'N', (int)rows, (int)cols, a, (int)cols, sv,
                                NULL, 1, NULL, 1, superb),
                 0);
    double tail = 0;
    for (size_t i = r; i < cols; i++) tail += (double)sv[i] * sv[i];
    double best = sqrt(tail) / tu_norm2(m, rows * cols);

    terse_codec *c = make("powersgd:rank=4", rows, cols);
    double first = 0, err = 0;
    for (int it = 0; it < 40; it++) {
        uint8_t *msg;
        round_trip(c, m, y, &msg);
        free(msg);
        err = tu_rel_err(m, y, rows * cols);
        cr_assert_geq(err, best * (1 - 1e-4), "iteration %d beat the SVD optimum", it);
        if (it == 0) first = err;
    }
    cr_expect_gt(first, 1.05 * best, "the cold start should not already be optimal");
    cr_expect_lt(err, 1.01 * best, "after 40 warm-started encodes: %g, optimum %g", err, best);
    cr_expect_lt(err, first);
    terse_codec_free(c);
    free(m);
    free(y);
    free(a);
}

Test(powersgd, vectors_and_small_matrices_fall_back_to_exact_dense) {
    struct {
        size_t rows, cols;
        const char *spec;
    } cases[] = {
        {100, 1, "powersgd:rank=1"},  {1, 100, "powersgd:rank=1"},
        {3, 3, "powersgd:rank=4"},    {8, 8, "powersgd:rank=2"}, /* (8+8)*2*2 = 64 >= 64 */
    };
    for (size_t t = 0; t < 4; t++) {
        size_t n = cases[t].rows * cases[t].cols;
        float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
        tu_fill_gauss(x, n, 10 + t);
        terse_codec *c = make(cases[t].spec, cases[t].rows, cases[t].cols);
        uint8_t *msg;
        size_t len = round_trip(c, x, y, &msg);
        cr_expect_eq(len, HDR + 4 + 4 * n);
        cr_expect_eq(msg[HDR], 0, "case %zu: mode byte %u", t, msg[HDR]);
        cr_expect_eq(memcmp(x, y, n * sizeof(float)), 0, "case %zu is not exact", t);
        terse_codec_traits tr = TERSE_CODEC_TRAITS_INIT;
        cr_assert_eq(terse_codec_get_traits(c, &tr), TERSE_OK);
        cr_expect_float_eq(tr.bits_per_element, 32.0, 1e-12);
        free(msg);
        terse_codec_free(c);
        free(x);
        free(y);
    }
    /* Just past the rule: 9 x 9 at rank 2 is (18)*2*2 = 72 < 81, low rank. */
    terse_codec *c = make("powersgd:rank=2", 9, 9);
    float x[81];
    tu_fill_gauss(x, 81, 3);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_expect_eq(msg[HDR], 1);
    cr_expect_eq(len, HDR + 4 + 4 * 18 * 2);
    free(msg);
    terse_codec_free(c);
}

Test(powersgd, zero_matrix_decodes_to_zeros_with_an_orthonormal_p) {
    size_t rows = 50, cols = 40, n = rows * cols;
    float *x = calloc(n, sizeof(float)), *y = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) y[i] = NAN; /* overwrite mode must not read dst */
    terse_codec *c = make("powersgd:rank=4", rows, cols);
    uint8_t *msg;
    round_trip(c, x, y, &msg);
    for (size_t i = 0; i < n; i++) cr_assert_eq(y[i], 0.0f, "element %zu is %g", i, y[i]);
    cr_expect_lt(orthonormality_defect(msg, rows, 4), 1e-5);
    free(msg);
    terse_codec_free(c);
    free(x);
    free(y);
}

/* A zero or NaN gradient leaves Q = M^T P zero or NaN; kept as the warm
 * start it would make every later P zero or NaN. The codec redraws it. */
static void expect_recovery_after(float fill) {
    size_t rows = 40, cols = 36, n = rows * cols;
    float *bad = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) bad[i] = fill;
    float *m = rank_r_matrix(rows, cols, 3, 7);
    terse_codec *c = make("powersgd:rank=3", rows, cols);
    uint8_t *msg;
    round_trip(c, bad, y, &msg);
    free(msg);
    round_trip(c, m, y, &msg);
    cr_expect_lt(tu_rel_err(m, y, n), 1e-4, "after a gradient of %g: error %g", fill,
                 tu_rel_err(m, y, n));
    free(msg);
    terse_codec_free(c);
    free(bad);
    free(m);
    free(y);
}

Test(powersgd, a_zero_nan_or_inf_gradient_does_not_poison_the_warm_start) {
    expect_recovery_after(0.0f);
    expect_recovery_after(NAN);
    expect_recovery_after(INFINITY);
}

Test(powersgd, accumulate_onto_zeros_is_bitwise_decode_and_onto_data_within_rounding) {
    /* What holds exactly: sgemm with beta = 1 on a zero dst runs the same
     * kernel as beta = 0 (which zeroes dst first), so the bits agree. Onto
     * nonzero data, sgemm may fuse dst + alpha*(PQ^T) into one FMA, so it
     * differs from decode-then-add by at most a rounding of each. */
    size_t rows = 64, cols = 56, n = rows * cols;
    float *x = malloc(n * sizeof(float)), *base = malloc(n * sizeof(float));
    float *dec = malloc(n * sizeof(float)), *acc = malloc(n * sizeof(float));
    tu_fill_gauss(x, n, 21);
    tu_fill_gauss(base, n, 22);
    terse_codec *c = make("powersgd:rank=4", rows, cols);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    const float alpha = -0.75f;
    cr_assert_eq(terse_decode(c, msg, len, dec, alpha, 0), TERSE_OK);
    memset(acc, 0, n * sizeof(float));
    cr_assert_eq(terse_decode(c, msg, len, acc, alpha, 1), TERSE_OK);
    cr_expect_eq(memcmp(acc, dec, n * sizeof(float)), 0, "accumulate onto zeros != decode");
    memcpy(acc, base, n * sizeof(float));
    cr_assert_eq(terse_decode(c, msg, len, acc, alpha, 1), TERSE_OK);
    for (size_t i = 0; i < n; i++) {
        float sum = base[i] + dec[i];
        double tol = 0x1p-22 * (fabs(base[i]) + fabs(dec[i]));
        cr_assert_leq(fabs((double)acc[i] - sum), tol, "element %zu: %a vs %a", i, acc[i], sum);
    }
    free(msg);
    terse_codec_free(c);
    /* The dense fallback adds with the plain kernel: bitwise. */
    c = make("powersgd:rank=4", n, 1);
    len = tu_encode(c, x, &msg);
    cr_assert_eq(terse_decode(c, msg, len, dec, alpha, 0), TERSE_OK);
    memcpy(acc, base, n * sizeof(float));
    cr_assert_eq(terse_decode(c, msg, len, acc, alpha, 1), TERSE_OK);
    for (size_t i = 0; i < n; i++) {
        float want = base[i] + dec[i];
        cr_assert_eq(memcmp(&acc[i], &want, 4), 0, "dense element %zu", i);
    }
    free(msg);
    terse_codec_free(c);
    free(x);
    free(base);
    free(dec);
    free(acc);
}

Test(powersgd, messages_are_deterministic_and_the_initial_q_ignores_rank) {
    size_t rows = 48, cols = 40, n = rows * cols;
    float *x = malloc(n * sizeof(float));
    tu_fill_gauss(x, n, 31);
    uint8_t *m[4];
    size_t len[4];
    const uint64_t tensor[4] = {7, 7, 7, 8};
    const uint32_t rank[4] = {0, 0, 5, 0};
    for (int i = 0; i < 4; i++) {
        terse_codec *c = make("powersgd:rank=3,seed=99", rows, cols);
        cr_assert_eq(terse_codec_set_stream(c, tensor[i], rank[i]), TERSE_OK);
        len[i] = tu_encode(c, x, &m[i]);
        terse_codec_free(c);
    }
    cr_expect(len[0] == len[1] && memcmp(m[0], m[1], len[0]) == 0, "same stream differs");
    cr_expect(len[0] == len[2] && memcmp(m[0], m[2], len[0]) == 0, "rank changed the initial Q");
    cr_expect(memcmp(m[0], m[3], len[0]) != 0, "tensor id did not change the initial Q");
    for (int i = 0; i < 4; i++) free(m[i]);
    free(x);
}

Test(powersgd, state_save_and_load_resume_bit_identically) {
    size_t rows = 40, cols = 32, n = rows * cols;
    float *g = malloc(3 * n * sizeof(float));
    tu_fill_gauss(g, 3 * n, 41);
    const char *specs[] = {"powersgd:rank=2,seed=5", "powersgd:rank=2,seed=5,ef=1"};
    for (int s = 0; s < 2; s++) {
        terse_codec *a = make(specs[s], rows, cols), *b = make(specs[s], rows, cols);
        uint8_t *msg;
        /* b has encoded once, so loading must also overwrite a live Q. */
        free((tu_encode(b, g + 2 * n, &msg), msg));
        free((tu_encode(a, g, &msg), msg));
        free((tu_encode(a, g + n, &msg), msg));
        size_t cap = terse_codec_state_size(a), slen;
        uint8_t *st = malloc(cap);
        cr_assert_eq(terse_codec_state_save(a, st, cap, &slen), TERSE_OK);
        cr_assert_eq(terse_codec_state_load(b, st, slen), TERSE_OK, "%s", terse_last_error());
        uint8_t *ma, *mb;
        size_t la = tu_encode(a, g + 2 * n, &ma), lb = tu_encode(b, g + 2 * n, &mb);
        cr_expect(la == lb && memcmp(ma, mb, la) == 0, "%s: resumed codec diverged", specs[s]);
        free(ma);
        free(mb);
        free(st);
        terse_codec_free(a);
        terse_codec_free(b);
    }
    free(g);
}

Test(powersgd, state_of_a_fresh_codec_resumes_as_uninitialised) {
    size_t rows = 40, cols = 32, n = rows * cols;
    float *g = malloc(n * sizeof(float));
    tu_fill_gauss(g, n, 43);
    terse_codec *a = make("powersgd:rank=2", rows, cols), *b = make("powersgd:rank=2", rows, cols);
    uint8_t *msg;
    free((tu_encode(b, g, &msg), msg)); /* b's Q is now warm */
    size_t cap = terse_codec_state_size(a), slen;
    cr_expect_eq(cap, TERSE__STATE_HEAD + 8 + 4 * cols * 2 + 4);
    uint8_t *st = malloc(cap);
    cr_assert_eq(terse_codec_state_save(a, st, cap, &slen), TERSE_OK);
    cr_expect_eq(terse__get_u32(st + TERSE__STATE_HEAD), 0u, "a fresh codec reports initialised");
    cr_assert_eq(terse_codec_state_load(b, st, slen), TERSE_OK);
    uint8_t *ma, *mb;
    size_t la = tu_encode(a, g, &ma), lb = tu_encode(b, g, &mb);
    cr_expect(la == lb && memcmp(ma, mb, la) == 0);
    /* An 'initialised' flag other than 0/1 is refused, even with a valid CRC. */
    st[TERSE__STATE_HEAD] = 2;
    terse__put_u32(st + slen - 4, terse__crc32c_update(0, st, slen - 4));
    cr_expect_eq(terse_codec_state_load(b, st, slen), TERSE_ERR_CORRUPT);
    free(ma);
    free(mb);
    free(st);
    terse_codec_free(a);
    terse_codec_free(b);
    free(g);
}

/* Copy a message, let `edit` change its payload (and maybe its length),
 * reseal it with a valid CRC, and decode. */
static terse_status decode_crafted(terse_codec *c, const uint8_t *msg, size_t len, size_t new_plen,
                                   size_t off, uint8_t value) {
    size_t plen = len - HDR;
    size_t cap = HDR + (new_plen > plen ? new_plen : plen);
    uint8_t *m = calloc(1, cap);
    memcpy(m, msg, len);
    if (off < new_plen) m[HDR + off] = value;
    terse__wire_seal(m, 10, terse_codec_elements(c), new_plen);
    float *y = malloc(terse_codec_elements(c) * sizeof(float));
    terse_status s = terse_decode(c, m, HDR + new_plen, y, 1.0f, 0);
    free(y);
    free(m);
    return s;
}

Test(powersgd, crafted_payloads_with_wrong_mode_rank_or_length_are_corrupt) {
    size_t rows = 32, cols = 24, n = rows * cols;
    float *x = malloc(n * sizeof(float));
    tu_fill_gauss(x, n, 51);
    terse_codec *c = make("powersgd:rank=2", rows, cols);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg), plen = len - HDR;
    cr_assert_eq(decode_crafted(c, msg, len, plen, plen, 0), TERSE_OK); /* unchanged */
    cr_expect_eq(decode_crafted(c, msg, len, plen, 0, 0), TERSE_ERR_CORRUPT);  /* dense mode */
    cr_expect_not_null(strstr(terse_last_error(), "offset 0"));
    cr_expect_eq(decode_crafted(c, msg, len, plen, 0, 7), TERSE_ERR_CORRUPT);  /* unknown mode */
    cr_expect_eq(decode_crafted(c, msg, len, plen, 1, 1), TERSE_ERR_CORRUPT);  /* reserved */
    cr_expect_eq(decode_crafted(c, msg, len, plen, 2, 3), TERSE_ERR_CORRUPT);  /* rank 3 */
    cr_expect_eq(decode_crafted(c, msg, len, plen - 4, plen, 0), TERSE_ERR_CORRUPT); /* short */
    cr_expect_eq(decode_crafted(c, msg, len, 3, plen, 0), TERSE_ERR_CORRUPT); /* no header */
    cr_expect_eq(decode_crafted(c, msg, len, 0, plen, 0), TERSE_ERR_CORRUPT);
    free(msg);
    terse_codec_free(c);
    /* A dense codec refuses a low-rank mode byte. */
    c = make("powersgd:rank=2", n, 1);
    len = tu_encode(c, x, &msg);
    plen = len - HDR;
    cr_expect_eq(decode_crafted(c, msg, len, plen, 0, 1), TERSE_ERR_CORRUPT);
    cr_expect_eq(decode_crafted(c, msg, len, plen, 2, 1), TERSE_ERR_CORRUPT);
    free(msg);
    terse_codec_free(c);
    free(x);
}

Test(powersgd, crafted_non_finite_factors_decode_without_failing) {
    size_t rows = 32, cols = 24, n = rows * cols;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    tu_fill_gauss(x, n, 52);
    terse_codec *c = make("powersgd:rank=2", rows, cols);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    terse__put_f32(msg + HDR + 4, NAN);       /* P[0][0] */
    terse__put_f32(msg + len - 4, INFINITY); /* Q[cols-1][1] */
    terse__wire_seal(msg, 10, n, len - HDR);
    cr_expect_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
    cr_expect(isnan(y[0]), "row 0 should carry P's NaN");
    free(msg);
    terse_codec_free(c);
    free(x);
    free(y);
}

Test(powersgd, spec_traits_and_rank_limits) {
    terse_codec *c = make("powersgd", 300, 200);
    cr_expect_str_eq(terse_codec_spec(c), "powersgd:rank=4,ef=0,seed=0");
    terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
    cr_assert_eq(terse_codec_get_traits(c, &t), TERSE_OK);
    cr_expect_eq(t.summable, 0);
    cr_expect_eq(t.randomized, 1);
    cr_expect_float_eq(t.bits_per_element, 32.0 * 500 * 4 / 60000, 1e-12);
    cr_expect_eq(terse_codec_bound(c), HDR + 4 + 4 * 500 * 4);
    terse_codec_free(c);
    c = make("powersgd:rank=1024", 5000, 3000); /* 8000*1024*2 >= 1.5e7: dense */
    cr_expect_eq(terse_codec_bound(c), HDR + 4 + 4 * 5000 * 3000);
    terse_codec_free(c);
    const char *bad[] = {"powersgd:rank=0", "powersgd:rank=1025", "powersgd:rank=x",
                         "powersgd:bits=4"};
    for (int i = 0; i < 4; i++) {
        terse_codec *d = (terse_codec *)1;
        cr_expect_eq(terse_codec_create(bad[i], 64, 64, &d), TERSE_ERR_INVALID, "%s", bad[i]);
        cr_expect_null(d);
    }
}
