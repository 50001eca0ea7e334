/* randk: stratified random-k sparsification with indices shared by all
 * ranks, so that messages add linearly.
 *
 * Payload layout (little endian):
 *
 *   offset  size  field
 *        0     8  key, u64: the RNG stream the indices are drawn from
 *        8    4k  one fp32 value per stratum, stratum order
 *
 * Strata: stratum j (0 <= j < k) is [floor(j*n/k), floor((j+1)*n/k)), so
 * sizes differ by at most one and every stratum is non-empty (k <= n).
 * Index: lo_j + the draw terse__rng_u64(key, j) reduced to [0, size_j)
 * without bias (Lemire's multiply-shift with rejection, below).
 *
 * The encoder's key is terse__rng_key(seed, step, tensor, 0): the rank is
 * left out on purpose, so every rank draws the same indices and payloads of
 * one step are summable element-wise. The key travels in the payload
 * (8 bytes) because decode has no encode context; any key is valid, so a
 * decoder needs to check only the length. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/error.h"
#include "common/rng.h"
#include "compress/codec_internal.h"
#include "compress/sparse_k.h"

#define HEAD 8u
/* Redraws after a rejection come from a salted stream at counter
 * j + attempt * 2^36 (j < k <= 2^36), apart from every first draw. */
#define REDRAW_SALT 0xa0761d6478bd642fULL

typedef struct {
    size_t n, k;
    int unbiased;
} randk_codec;

/* The high and low 64 bits of a * b. */
static inline uint64_t mul_64x64(uint64_t a, uint64_t b, uint64_t *lo) {
#if defined(__SIZEOF_INT128__)
    __extension__ typedef unsigned __int128 u128;
    u128 m = (u128)a * b;
    *lo = (uint64_t)m;
    return (uint64_t)(m >> 64);
#else
    uint64_t a0 = a & 0xffffffffu, a1 = a >> 32, b0 = b & 0xffffffffu, b1 = b >> 32;
    uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    uint64_t mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
    *lo = (mid << 32) | (p00 & 0xffffffffu);
    return p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
#endif
}

/* A uniform integer in [0, size) from draw j of stream key. Lemire's
 * method ("Fast random integer generation in an interval", 2019): the high
 * word of x * size is the result, and the low word tells whether x fell in
 * the 2^64 mod size values that would over-represent some results; those
 * are redrawn. With size <= 2^36 that happens with probability < 2^-28. */
static inline uint64_t draw_below(uint64_t key, uint64_t j, uint64_t size) {
    uint64_t lo, hi = mul_64x64(terse__rng_u64(key, j), size, &lo);
    if (lo < size) {
        uint64_t reject = (0 - size) % size; /* 2^64 mod size */
        for (uint64_t attempt = 1; lo < reject; attempt++)
            hi = mul_64x64(terse__rng_u64(key ^ REDRAW_SALT, j + (attempt << 36)), size, &lo);
    }
    return hi;
}

/* Walks the strata in order: floor(j*n/k) is kept as quotient and
 * remainder, so no j*n product (up to 2^72) is ever formed. */
typedef struct {
    uint64_t lo, rem, q, r, k;
} strata;

static inline strata strata_begin(size_t n, size_t k) {
    strata s = {0, 0, n / k, n % k, k};
    return s;
}

/* The size of the current stratum; advances lo to the next one. */
static inline uint64_t strata_next(strata *s) {
    uint64_t size = s->q;
    s->rem += s->r;
    if (s->rem >= s->k) {
        s->rem -= s->k;
        size++;
    }
    s->lo += size;
    return size;
}

static terse_status randk_create(terse_spec *spec, size_t rows, size_t cols, void **self,
                                 char *canon, size_t canon_cap) {
    size_t n = rows * cols, k;
    char kopt[64];
    TERSE_CHECK(terse__sparse_k_parse(spec, "randk", n, &k, kopt, sizeof kopt));
    /* Error feedback wants a contraction, and scaling by the stratum size
     * is not one; without it, unbiasedness is the point. */
    uint64_t unbiased;
    TERSE_CHECK(terse_spec_get_u64(spec, "unbiased", terse_spec_error_feedback(spec) ? 0 : 1, 0,
                                   1, &unbiased));
    randk_codec *c = malloc(sizeof *c);
    if (!c) return TERSE_ERROR(TERSE_ERR_NOMEM, "allocating codec 'randk'");
    c->n = n;
    c->k = k;
    c->unbiased = (int)unbiased;
    snprintf(canon, canon_cap, "%s,unbiased=%d", kopt, c->unbiased);
    *self = c;
    return TERSE_OK;
}

static void randk_destroy(void *self) { free(self); }

static size_t randk_bound(const void *self) {
    const randk_codec *c = self;
    return HEAD + 4 * c->k;
}

static double randk_bits(const void *self) {
    const randk_codec *c = self;
    return 8.0 * (double)randk_bound(self) / (double)c->n;
}

static terse_status randk_encode(void *self, const terse_encode_ctx *ctx, const float *x,
                                 uint8_t *p, size_t cap, size_t *len) {
    (void)cap;
    randk_codec *c = self;
    uint64_t key = terse__rng_key(ctx->seed, ctx->step, ctx->tensor, 0);
    terse__put_u64(p, key);
    uint8_t *out = p + HEAD;
    strata s = strata_begin(c->n, c->k);
    for (size_t j = 0; j < c->k; j++) {
        uint64_t lo = s.lo, size = strata_next(&s);
        float v = x[lo + draw_below(key, j, size)];
        if (c->unbiased) v *= (float)size;
        memcpy(out + 4 * j, &v, sizeof v);
    }
    *len = HEAD + 4 * c->k;
    return TERSE_OK;
}

/* Zeroing is fused with the scatter: only the gaps between drawn indices
 * are cleared, so a plain decode writes dst once. With alpha = 1 a plain
 * decode stores the value bits untouched. */
static terse_status randk_decode(void *self, const uint8_t *p, size_t len, float *dst, float alpha,
                                 int accumulate) {
    randk_codec *c = self;
    if (len != HEAD + 4 * c->k)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "randk: payload is %zu bytes; an 8-byte key and %zu values take %zu",
                           len, c->k, (size_t)(HEAD + 4 * c->k));
    uint64_t key = terse__get_u64(p);
    const uint8_t *vals = p + HEAD;
    strata s = strata_begin(c->n, c->k);
    size_t next = 0; /* dst[0..next) is done */
    for (size_t j = 0; j < c->k; j++) {
        uint64_t lo = s.lo, size = strata_next(&s);
        size_t i = (size_t)(lo + draw_below(key, j, size));
        float v;
        memcpy(&v, vals + 4 * j, sizeof v);
        if (accumulate) {
            dst[i] += alpha * v;
        } else {
            memset(dst + next, 0, (i - next) * sizeof *dst);
            dst[i] = alpha == 1.0f ? v : alpha * v;
            next = i + 1;
        }
    }
    if (!accumulate) memset(dst + next, 0, (c->n - next) * sizeof *dst);
    return TERSE_OK;
}

/* Summable: every rank draws the same indices (the key leaves the rank
 * out), so the k values after the key add element-wise; the key is outside
 * the values, so the collective's check that messages agree there catches
 * ranks whose seed, tensor id or step differ. */
static terse_status randk_summable_view(const void *self, const uint8_t *payload, size_t len,
                                        terse_summable_view *view) {
    (void)payload;
    const randk_codec *c = self;
    if (len != HEAD + 4 * c->k)
        return TERSE_ERROR(TERSE_ERR_INTERNAL, "randk: a %zu-byte payload, expected %zu", len,
                           (size_t)(HEAD + 4 * c->k));
    view->values_off = HEAD;
    view->count = c->k;
    return TERSE_OK;
}

const terse_codec_ops terse__codec_randk = {
    .size = sizeof(terse_codec_ops),
    .id = TERSE_ID_RANDK,
    .name = "randk",
    .flags = TERSE_CODEC_SUMMABLE | TERSE_CODEC_RANDOMIZED,
    .create = randk_create,
    .destroy = randk_destroy,
    .bound = randk_bound,
    .bits_per_element = randk_bits,
    .encode = randk_encode,
    .decode = randk_decode,
    .summable_view = randk_summable_view,
};
