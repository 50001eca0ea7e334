#include "testutil.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string.h>

#include "common/rng.h"

const char *const tu_specs[] = {
    "none",
    "fp16",
    "bf16",
    "int8:bucket=512",
    "int8:bucket=8", /* many buckets and a 1-element tail */
    "qsgd:bits=4,bucket=512",
    "qsgd:bits=8,bucket=128",
    "qsgd:bits=2,bucket=8",
    "terngrad",
    "sign:bucket=1024",
    "sign:bucket=64",
    "topk:ratio=0.01",
    "topk:ratio=0.5", /* the bitmap index encoding */
    "topk:k=1",
    "randk:ratio=0.01",
    "randk:ratio=0.3,unbiased=0",
    "powersgd:rank=4",
    "powersgd:rank=16", /* (37 + 101) * 16 * 2 >= 37 * 101: dense fallback */
    "vq:dim=8,bits=8",
    "vq:dim=3,bits=5", /* blocks straddle rows and the tail is partial */
};
const size_t tu_nspecs = sizeof tu_specs / sizeof tu_specs[0];

void tu_fill_uniform(float *x, size_t n, uint64_t seed, float lo, float hi) {
    uint64_t key = terse__rng_key(seed, 0, 0, 0);
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * (float)((double)(terse__rng_u64(key, i) >> 11) / 9007199254740992.0);
}

void tu_fill_gauss(float *x, size_t n, uint64_t seed) {
    uint64_t key = terse__rng_key(seed, 1, 0, 0);
    for (size_t i = 0; i < n; i++) {
        double s = 0;
        for (int j = 0; j < 4; j++) s += (double)(terse__rng_u64(key, 4 * i + (uint64_t)j) >> 11) / 9007199254740992.0;
        x[i] = (float)((s - 2.0) * 1.7320508);
    }
}

double tu_norm2(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return sqrt(s);
}

double tu_rel_err(const float *a, const float *b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)a[i] * a[i];
    }
    return s == 0 ? sqrt(d) : sqrt(d / s);
}

terse_codec *tu_create_or_skip(const char *spec, size_t rows, size_t cols) {
    terse_codec *c = NULL;
    terse_status s = terse_codec_create(spec, rows, cols, &c);
    if (s == TERSE_ERR_UNSUPPORTED) {
        fprintf(stderr, "WARNING: SKIPPED: codec '%s' is still a stub (%s)\n", spec,
                terse_last_error());
        return NULL;
    }
    cr_assert_eq(s, TERSE_OK, "create '%s' %zu x %zu: %s", spec, rows, cols, terse_last_error());
    return c;
}

terse_codec *tu_create(const char *spec, size_t rows, size_t cols) {
    terse_codec *c = NULL;
    terse_status s = terse_codec_create(spec, rows, cols, &c);
    cr_assert_eq(s, TERSE_OK, "create '%s' %zu x %zu: %s", spec, rows, cols, terse_last_error());
    return c;
}

void tu_spec_with(char *buf, size_t cap, const char *spec, const char *opt) {
    int w = snprintf(buf, cap, "%s%s%s", spec, strchr(spec, ':') ? "," : ":", opt);
    cr_assert(w > 0 && (size_t)w < cap, "spec '%s' + '%s' does not fit", spec, opt);
}

static void free_params(struct criterion_test_params *p) { cr_free(p->params); }

struct criterion_test_params tu_spec_params(void) {
    size_t *idx = cr_malloc(tu_nspecs * sizeof *idx);
    for (size_t i = 0; i < tu_nspecs; i++) idx[i] = i;
    return cr_make_param_array(size_t, idx, tu_nspecs, free_params);
}

size_t tu_encode(terse_codec *c, const float *x, uint8_t **msg) {
    size_t cap = terse_codec_bound(c), len = 0;
    *msg = malloc(cap);
    cr_assert_not_null(*msg);
    terse_status s = terse_encode(c, x, *msg, cap, &len);
    cr_assert_eq(s, TERSE_OK, "encode with %s: %s", terse_codec_spec(c), terse_last_error());
    return len;
}

void tu_expect_bad_spec(const char *spec, const char *token) {
    terse_codec *c = (terse_codec *)1;
    terse_status st = terse_codec_create(spec, 100, 1, &c);
    cr_expect_eq(st, TERSE_ERR_INVALID, "spec '%s' gave %s", spec, terse_status_name(st));
    cr_expect_null(c);
    cr_expect_not_null(strstr(terse_last_error(), token), "spec '%s': error '%s' does not name '%s'",
                       spec, terse_last_error(), token);
}

void tu_expect_canonical_specs(const char *const (*cases)[2], size_t count, size_t n) {
    for (size_t k = 0; k < count; k++) {
        terse_codec *c = NULL;
        cr_assert_eq(terse_codec_create(cases[k][0], n, 1, &c), TERSE_OK, "%s: %s", cases[k][0],
                     terse_last_error());
        cr_expect_str_eq(terse_codec_spec(c), cases[k][1], "from '%s'", cases[k][0]);
        terse_codec_free(c);
    }
}
