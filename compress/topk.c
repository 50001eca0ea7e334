/* topk: the exact k largest magnitudes, their indices and fp32 values.
 *
 * Payload layout (little endian):
 *
 *   offset  size   field
 *        0     1   index coding: 0 = delta varints, 1 = bitmap
 *        1     8   k, u64; must equal the codec's k (the spec fixes it)
 *        9    4k   the kept values, fp32 bit patterns, in index order
 *     9+4k  rest   the kept indices, in the coding of byte 0:
 *                  varints: k unsigned LEB128 numbers, each the distance
 *                    from the previous kept index (the first from -1), so
 *                    every one is >= 1; canonical (no padding bytes), at
 *                    most 6 bytes each (n <= 2^36). Sum of distances <= n.
 *                  bitmap: ceil(n/8) bytes; bit i%8 (LSB first) of byte
 *                    i/8 is set iff element i is kept; bits past n are 0.
 *
 * The index section's length is whatever follows the values: the payload
 * length fixes it, so no field repeats it. Values come before indices so
 * the encoder's final pass can fill them before it knows which index coding
 * will win. The encoder sends the smaller coding (the bitmap only when
 * strictly smaller); the decoder accepts either.
 *
 * Selection (compress/topk_select.c) is a three-level radix select, O(n),
 * with ties to the lower index, so the message is a pure function of x. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/error.h"
#include "compress/codec_internal.h"
#include "compress/sparse_k.h"
#include "compress/topk_select.h"

#define HEAD 9u
#define CODING_VARINT 0u
#define CODING_BITMAP 1u
#define VARINT_MAX_BYTES 6u /* 7 * 6 = 42 bits > 2^36 */

typedef struct {
    size_t n, k;
    size_t bitmap_bytes;  /* ceil(n/8) */
    size_t index_bound;   /* min(bitmap_bytes, worst-case varint bytes) */
    terse_topk_scratch sel;
    uint64_t *idx;        /* k + 1 kept indices; shares memory with sel.cand */
    float *val;           /* k + 1 kept values */
    void *scratch;
    uint32_t sub[4 * TERSE_TOPK_SUB_STRIDE];
    uint64_t hist[TERSE_TOPK_MAX_BINS];
} topk_codec;

/* The most bytes k delta varints can take for indices in [0, n). Each
 * delta d is >= 1 and the deltas sum to at most n. A delta of L bytes needs
 * d >= 128^(L-1), so growing one delta from L to L+1 bytes costs
 * 127 * 128^(L-1) more of the sum -- a cost that rises with L. Growing
 * every delta one byte at a time, cheapest level first, until the budget
 * runs out is therefore optimal, and the bound is attained (deltas of
 * exactly 128^(L-1)). */
static size_t varint_worst(size_t n, size_t k) {
    uint64_t total = k, budget = n - k, step = 127;
    for (unsigned len = 1; len < VARINT_MAX_BYTES; len++, step *= 128) {
        uint64_t grow = budget / step;
        if (grow > k) grow = k;
        total += grow;
        budget -= grow * step;
        if (grow < k) break;
    }
    return (size_t)total;
}

static size_t varint_len(uint64_t v) {
    size_t len = 1;
    while (v >= 0x80) {
        v >>= 7;
        len++;
    }
    return len;
}

static void topk_destroy(void *self) {
    topk_codec *c = self;
    if (!c) return;
    free(c->scratch);
    free(c);
}

static terse_status topk_create(terse_spec *spec, size_t rows, size_t cols, void **self,
                                char *canon, size_t canon_cap) {
    size_t n = rows * cols, k;
    TERSE_CHECK(terse__sparse_k_parse(spec, "topk", n, &k, canon, canon_cap));
    topk_codec *c = calloc(1, sizeof *c);
    if (!c) return TERSE_ERROR(TERSE_ERR_NOMEM, "allocating codec 'topk'");
    c->n = n;
    c->k = k;
    c->bitmap_bytes = n / 8 + (n % 8 != 0);
    size_t vw = varint_worst(n, k);
    c->index_bound = vw < c->bitmap_bytes ? vw : c->bitmap_bytes;
    /* The candidate bucket of a radix level is usually a few percent of n
     * (1/8 of a binade); n/8 covers it for Gaussian and uniform data, and a
     * larger bucket only costs one more pass over x. */
    size_t cap = n < 4096 ? n : 4096;
    if (n / 8 > cap) cap = n / 8;
    c->sel.cand_cap = cap;
    c->sel.sub = c->sub;
    c->sel.hist = c->hist;
    /* Selection and the final pass never overlap in time: one buffer
     * serves the candidates, then the kept indices and values. */
    size_t cand_bytes = (cap + 1) * sizeof(float);
    size_t kept_bytes = (k + 1) * (sizeof(uint64_t) + sizeof(float));
    size_t bytes = cand_bytes > kept_bytes ? cand_bytes : kept_bytes;
    c->scratch = malloc(bytes);
    if (!c->scratch) {
        free(c);
        return TERSE_ERROR(TERSE_ERR_NOMEM, "allocating %zu bytes of topk scratch", bytes);
    }
    c->sel.cand = c->scratch;
    c->idx = c->scratch;
    c->val = (float *)(c->idx + k + 1);
    *self = c;
    return TERSE_OK;
}

static size_t topk_bound(const void *self) {
    const topk_codec *c = self;
    return HEAD + 4 * c->k + c->index_bound;
}

static double topk_bits(const void *self) {
    const topk_codec *c = self;
    return 8.0 * (double)topk_bound(self) / (double)c->n;
}

static void write_varints(const uint64_t *idx, size_t k, uint8_t *out) {
    uint64_t prev_plus_one = 0;
    for (size_t j = 0; j < k; j++) {
        uint64_t d = idx[j] + 1 - prev_plus_one;
        prev_plus_one = idx[j] + 1;
        while (d >= 0x80) {
            *out++ = (uint8_t)(d | 0x80);
            d >>= 7;
        }
        *out++ = (uint8_t)d;
    }
}

static terse_status topk_encode(void *self, const terse_encode_ctx *ctx, const float *x,
                                uint8_t *p, size_t cap, size_t *len) {
    (void)ctx;
    (void)cap;
    topk_codec *c = self;
    uint32_t threshold;
    size_t take_equal;
    terse__topk_threshold(x, c->n, c->k, &c->sel, &threshold, &take_equal);
    size_t kept = terse__topk_gather(x, c->n, threshold, take_equal, c->idx, c->val);
    if (kept != c->k)
        return TERSE_ERROR(TERSE_ERR_INTERNAL, "topk: kept %zu elements, expected %zu", kept, c->k);

    size_t vbytes = 0;
    uint64_t prev_plus_one = 0;
    for (size_t j = 0; j < c->k; j++) {
        vbytes += varint_len(c->idx[j] + 1 - prev_plus_one);
        prev_plus_one = c->idx[j] + 1;
    }
    int bitmap = c->bitmap_bytes < vbytes;
    p[0] = (uint8_t)(bitmap ? CODING_BITMAP : CODING_VARINT);
    terse__put_u64(p + 1, c->k);
    memcpy(p + HEAD, c->val, 4 * c->k);
    uint8_t *sec = p + HEAD + 4 * c->k;
    if (bitmap) {
        memset(sec, 0, c->bitmap_bytes);
        for (size_t j = 0; j < c->k; j++) sec[c->idx[j] / 8] |= (uint8_t)(1u << (c->idx[j] % 8));
        *len = HEAD + 4 * c->k + c->bitmap_bytes;
    } else {
        write_varints(c->idx, c->k, sec);
        *len = HEAD + 4 * c->k + vbytes;
    }
    return TERSE_OK;
}

/* ---- decode: validate the whole index section, then write ---- */

static inline unsigned popcount64(uint64_t v) {
#if defined(__GNUC__) || defined(__clang__)
    return (unsigned)__builtin_popcountll(v);
#else
    v = v - ((v >> 1) & 0x5555555555555555ULL);
    v = (v & 0x3333333333333333ULL) + ((v >> 2) & 0x3333333333333333ULL);
    v = (v + (v >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
    return (unsigned)((v * 0x0101010101010101ULL) >> 56);
#endif
}

static inline unsigned ctz64(uint64_t v) { /* v != 0 */
#if defined(__GNUC__) || defined(__clang__)
    return (unsigned)__builtin_ctzll(v);
#else
    unsigned r = 0;
    while (!(v & 1)) v >>= 1, r++;
    return r;
#endif
}

/* Bytes [at, at + len) of the section as a little-endian word, len <= 8. */
static inline uint64_t load_word(const uint8_t *sec, size_t at, size_t len) {
    uint64_t w = 0;
    if (len == 8)
        memcpy(&w, sec + at, 8);
    else
        for (size_t b = 0; b < len; b++) w |= (uint64_t)sec[at + b] << (8 * b);
    return w;
}

static terse_status check_bitmap(const topk_codec *c, const uint8_t *sec, size_t slen, size_t off) {
    if (slen != c->bitmap_bytes)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "topk: bitmap at payload byte %zu is %zu bytes; %zu elements need %zu",
                           off, slen, c->n, c->bitmap_bytes);
    if (c->n % 8 && (sec[slen - 1] >> (c->n % 8)))
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "topk: bitmap byte at payload offset %zu marks indices past the "
                           "tensor's %zu elements",
                           off + slen - 1, c->n);
    uint64_t ones = 0;
    for (size_t at = 0; at < slen; at += 8)
        ones += popcount64(load_word(sec, at, slen - at < 8 ? slen - at : 8));
    if (ones != c->k)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "topk: bitmap at payload byte %zu marks %llu indices, but k is %zu", off,
                           (unsigned long long)ones, c->k);
    return TERSE_OK;
}

static terse_status check_varints(const topk_codec *c, const uint8_t *sec, size_t slen,
                                  size_t off) {
    size_t pos = 0;
    uint64_t next = 0; /* one past the previous index */
    for (size_t j = 0; j < c->k; j++) {
        size_t start = pos;
        uint64_t d = 0;
        for (unsigned shift = 0;; shift += 7) {
            if (pos == slen)
                return TERSE_ERROR(TERSE_ERR_CORRUPT,
                                   "topk: index varint %zu at payload byte %zu runs past the end "
                                   "of the payload",
                                   j, off + start);
            if (shift == 7 * VARINT_MAX_BYTES)
                return TERSE_ERROR(TERSE_ERR_CORRUPT,
                                   "topk: index varint %zu at payload byte %zu is longer than %u "
                                   "bytes",
                                   j, off + start, VARINT_MAX_BYTES);
            uint8_t b = sec[pos++];
            d |= (uint64_t)(b & 0x7f) << shift;
            if (b & 0x80) continue;
            if (b == 0 && pos - start > 1)
                return TERSE_ERROR(TERSE_ERR_CORRUPT,
                                   "topk: index varint %zu at payload byte %zu is overlong (ends "
                                   "in a zero byte)",
                                   j, off + start);
            break;
        }
        if (d == 0)
            return TERSE_ERROR(TERSE_ERR_CORRUPT,
                               "topk: index delta %zu at payload byte %zu is 0; indices must "
                               "strictly increase",
                               j, off + start);
        if (d > c->n - next)
            return TERSE_ERROR(TERSE_ERR_CORRUPT,
                               "topk: index %zu (varint at payload byte %zu) is %llu, past the "
                               "tensor's %zu elements",
                               j, off + start, (unsigned long long)(next + d - 1), c->n);
        next += d;
    }
    if (pos != slen)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "topk: %zu bytes follow the last index varint (payload byte %zu)",
                           slen - pos, off + pos);
    return TERSE_OK;
}

/* How one decoded value lands: a plain decode with alpha = 1 stores the
 * bits untouched (so NaN payloads and -0 survive exactly). */
enum { PUT_COPY, PUT_SCALE, PUT_ADD };

static inline void put(float *d, const uint8_t *v, float alpha, int how) {
    float f;
    memcpy(&f, v, sizeof f);
    if (how == PUT_COPY)
        *d = f;
    else if (how == PUT_SCALE)
        *d = alpha * f;
    else
        *d += alpha * f;
}

/* Zeroing is fused with the scatter (only the gaps between kept indices are
 * cleared), so a plain decode touches dst once, as accumulate does. */
static void apply_varints(const topk_codec *c, const uint8_t *vals, const uint8_t *sec,
                          float *dst, float alpha, int how) {
    size_t pos = 0, next = 0;
    for (size_t j = 0; j < c->k; j++) {
        uint64_t d = 0;
        for (unsigned shift = 0;; shift += 7) {
            uint8_t b = sec[pos++];
            d |= (uint64_t)(b & 0x7f) << shift;
            if (!(b & 0x80)) break;
        }
        size_t i = next + (size_t)d - 1;
        if (how != PUT_ADD) memset(dst + next, 0, (i - next) * sizeof *dst);
        put(dst + i, vals + 4 * j, alpha, how);
        next = i + 1;
    }
    if (how != PUT_ADD) memset(dst + next, 0, (c->n - next) * sizeof *dst);
}

static void apply_bitmap(const topk_codec *c, const uint8_t *vals, const uint8_t *sec,
                         float *dst, float alpha, int how) {
    size_t j = 0;
    for (size_t at = 0; at < c->bitmap_bytes; at += 8) {
        size_t nbytes = c->bitmap_bytes - at < 8 ? c->bitmap_bytes - at : 8;
        size_t base = at * 8, span = c->n - base < 64 ? c->n - base : 64;
        uint64_t w = load_word(sec, at, nbytes);
        if (how != PUT_ADD) memset(dst + base, 0, span * sizeof *dst);
        while (w) {
            put(dst + base + ctz64(w), vals + 4 * j++, alpha, how);
            w &= w - 1;
        }
    }
}

static terse_status topk_decode(void *self, const uint8_t *p, size_t len, float *dst, float alpha,
                                int accumulate) {
    topk_codec *c = self;
    if (len < HEAD)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "topk: payload is %zu bytes, shorter than its %u-byte head", len, HEAD);
    if (p[0] != CODING_VARINT && p[0] != CODING_BITMAP)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "topk: index coding at payload byte 0 is %u; expected 0 (varints) or "
                           "1 (bitmap)",
                           p[0]);
    uint64_t k = terse__get_u64(p + 1);
    if (k != c->k)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "topk: k at payload byte 1 is %llu, but this codec keeps %zu",
                           (unsigned long long)k, c->k);
    size_t vend = HEAD + 4 * c->k;
    if (len < vend)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "topk: payload is %zu bytes, too short for %zu values after byte %u",
                           len, c->k, HEAD);
    const uint8_t *sec = p + vend;
    size_t slen = len - vend;
    int how = accumulate ? PUT_ADD : alpha == 1.0f ? PUT_COPY : PUT_SCALE;
    if (p[0] == CODING_BITMAP) {
        TERSE_CHECK(check_bitmap(c, sec, slen, vend));
        apply_bitmap(c, p + HEAD, sec, dst, alpha, how);
    } else {
        TERSE_CHECK(check_varints(c, sec, slen, vend));
        apply_varints(c, p + HEAD, sec, dst, alpha, how);
    }
    return TERSE_OK;
}

/* Any cut works; a segment keeps its share of k, round(k len / n) but at
 * least 1, so the pieces together keep about k. The owner's re-encode of a
 * summed segment keeps the same share: the sum of N sparse pieces is
 * denser than any of them, and what the re-encode drops stays in the
 * owner's residual (ef=1) or is lost (ef=0). */
static size_t topk_segment_align(const void *self) {
    (void)self;
    return 1;
}

static terse_status topk_segment_options(const void *self, size_t len, char *canon, size_t cap) {
    const topk_codec *c = self;
    double share = (double)c->k * (double)len / (double)c->n;
    size_t k = (size_t)(share + 0.5);
    if (k < 1) k = 1;
    if (k > len) k = len;
    snprintf(canon, cap, "k=%zu", k);
    return TERSE_OK;
}

const terse_codec_ops terse__codec_topk = {
    .size = sizeof(terse_codec_ops),
    .id = TERSE_ID_TOPK,
    .name = "topk",
    .flags = 0,
    .create = topk_create,
    .destroy = topk_destroy,
    .bound = topk_bound,
    .bits_per_element = topk_bits,
    .encode = topk_encode,
    .decode = topk_decode,
    .segment_align = topk_segment_align,
    .segment_options = topk_segment_options,
};
