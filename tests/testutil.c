#include "testutil.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "common/rng.h"

const char *const tu_specs[] = {
    "none",
    "fp16",
    "bf16",
    "int8:bucket=512",
    "qsgd:bits=4,bucket=512",
    "qsgd:bits=8,bucket=128",
    "terngrad",
    "sign:bucket=1024",
    "topk:ratio=0.01",
    "topk:ratio=0.5",
    "randk:ratio=0.01",
    "powersgd:rank=4",
    "vq:dim=8,bits=8",
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

size_t tu_encode(terse_codec *c, const float *x, uint8_t **msg) {
    size_t cap = terse_codec_bound(c), len = 0;
    *msg = malloc(cap);
    cr_assert_not_null(*msg);
    terse_status s = terse_encode(c, x, *msg, cap, &len);
    cr_assert_eq(s, TERSE_OK, "encode with %s: %s", terse_codec_spec(c), terse_last_error());
    return len;
}
