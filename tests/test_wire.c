/* The message envelope, against every codec in tu_specs.
 *
 * A decoder sees bytes from the network. These tests feed it every
 * truncation of a valid message, every single-bit flip of its header, a few
 * thousand payload flips the CRC must catch, a few thousand crafted payloads
 * whose CRC was recomputed (so only the codec's own validation stands
 * between them and memory), and absurd counts and lengths. Buffers are
 * allocated to their exact size so AddressSanitizer sees any overrun. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/rng.h"
#include "compress/wire.h"
#include "testutil.h"

#define SENTINEL (-1234.5f)

typedef struct {
    const char *spec;
    terse_codec *c;
    size_t n;
    uint32_t id;
    uint8_t *msg[3]; /* valid messages from three kinds of input */
    size_t len[3];
    float *dst; /* exactly n floats */
} fixture;

/* Three inputs with different structure, so crafted payloads start from
 * different index patterns and scales: gaussian, mostly zero with a few
 * spikes, and gaussian with non-finite values mixed in. */
static void make_input(float *x, size_t n, int kind) {
    tu_fill_gauss(x, n, 7 + (uint64_t)kind);
    if (kind == 1)
        for (size_t i = 0; i < n; i++) x[i] = (i % 97 == 5) ? 1e3f * x[i] : 0.0f;
    if (kind == 2) {
        x[3] = INFINITY;
        x[n / 2] = -INFINITY;
        x[n - 2] = NAN;
        x[n - 1] = FLT_MAX;
    }
}

/* 0 if the codec is still a stub (the test then returns). */
static int setup(fixture *f, size_t i) {
    memset(f, 0, sizeof *f);
    f->spec = tu_specs[i];
    f->c = tu_create_or_skip(f->spec, TU_ROWS, TU_COLS);
    if (!f->c) return 0;
    f->n = terse_codec_elements(f->c);
    terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
    cr_assert_eq(terse_codec_get_traits(f->c, &t), TERSE_OK);
    f->id = t.id;
    float *x = malloc(f->n * sizeof *x);
    for (int k = 0; k < 3; k++) {
        make_input(x, f->n, k);
        uint8_t *m;
        f->len[k] = tu_encode(f->c, x, &m);
        f->msg[k] = malloc(f->len[k]); /* exact size */
        memcpy(f->msg[k], m, f->len[k]);
        free(m);
    }
    free(x);
    f->dst = malloc(f->n * sizeof(float));
    return 1;
}

static void teardown(fixture *f) {
    for (int k = 0; k < 3; k++) free(f->msg[k]);
    free(f->dst);
    terse_codec_free(f->c);
}

static void fill_sentinel(fixture *f) {
    for (size_t i = 0; i < f->n; i++) f->dst[i] = SENTINEL;
}

static void expect_sentinel(const fixture *f, const char *what) {
    for (size_t i = 0; i < f->n; i++)
        cr_assert_eq(f->dst[i], SENTINEL, "%s: %s wrote dst[%zu] although it failed", f->spec, what,
                     i);
}

/* Decode len bytes placed at the very end of an exact-size allocation, so
 * reading one byte past the message is an ASan error. */
static terse_status decode_exact(fixture *f, const uint8_t *msg, size_t len, float alpha, int acc) {
    uint8_t *buf = malloc(len ? len : 1);
    if (len) memcpy(buf, msg, len);
    terse_status s = terse_decode(f->c, buf, len, f->dst, alpha, acc);
    free(buf);
    return s;
}

ParameterizedTestParameters(wire, every_truncation_is_refused_as_truncated) {
    return tu_spec_params();
}
ParameterizedTest(size_t *i, wire, every_truncation_is_refused_as_truncated) {
    fixture f;
    if (!setup(&f, *i)) return;
    fill_sentinel(&f);
    size_t len = f.len[0];
    uint8_t *tail = malloc(len);
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *m = tail + (len - cut); /* ends where the allocation ends */
        memcpy(m, f.msg[0], cut);
        terse_status s = terse_decode(f.c, m, cut, f.dst, 1.0f, cut & 1);
        cr_assert_eq(s, TERSE_ERR_TRUNCATED, "%s: %zu of %zu bytes gave %s (%s)", f.spec, cut, len,
                     terse_status_name(s), terse_last_error());
        terse_wire_info info;
        s = terse_wire_inspect(m, cut, &info);
        cr_assert_eq(s, TERSE_ERR_TRUNCATED, "%s: inspect of %zu of %zu bytes gave %s", f.spec, cut,
                     len, terse_status_name(s));
    }
    expect_sentinel(&f, "a truncated decode");
    cr_expect_eq(terse_decode(f.c, NULL, 0, f.dst, 1.0f, 0), TERSE_ERR_TRUNCATED);
    cr_expect_eq(terse_decode(f.c, NULL, 40, f.dst, 1.0f, 0), TERSE_ERR_INVALID);
    /* The untouched message still decodes. */
    cr_expect_eq(decode_exact(&f, f.msg[0], len, 1.0f, 0), TERSE_OK, "%s: %s", f.spec,
                 terse_last_error());
    free(tail);
    teardown(&f);
}

/* The status a header bit flip must produce, by field (terse.h's layout).
 * terse_wire_inspect knows neither codec nor shape, so an id or count flip
 * reaches its checksum instead. */
static terse_status header_flip_status(size_t byte, const uint8_t *flipped, size_t len,
                                       int inspect) {
    if (byte < 4) return TERSE_ERR_MAGIC;
    if (byte == 4) return TERSE_ERR_VERSION;
    if (byte == 5) return TERSE_ERR_CORRUPT; /* flags must be 0 */
    if (byte < 8) return inspect ? TERSE_ERR_CORRUPT : TERSE_ERR_CODEC_MISMATCH;
    if (byte < 16) return inspect ? TERSE_ERR_CORRUPT : TERSE_ERR_SHAPE;
    if (byte < 24) /* a longer claim is truncation, a shorter one leaves stray bytes */
        return terse__get_u64(flipped + 16) > len - TERSE_WIRE_HEADER_SIZE ? TERSE_ERR_TRUNCATED
                                                                           : TERSE_ERR_CORRUPT;
    return TERSE_ERR_CORRUPT; /* crc, reserved */
}

ParameterizedTestParameters(wire, every_header_bit_flip_gets_the_status_of_its_field) {
    return tu_spec_params();
}
ParameterizedTest(size_t *i, wire, every_header_bit_flip_gets_the_status_of_its_field) {
    fixture f;
    if (!setup(&f, *i)) return;
    fill_sentinel(&f);
    size_t len = f.len[0];
    uint8_t *m = malloc(len);
    memcpy(m, f.msg[0], len);
    for (size_t bit = 0; bit < 8 * TERSE_WIRE_HEADER_SIZE; bit++) {
        size_t byte = bit / 8;
        m[byte] ^= (uint8_t)(1u << (bit % 8));
        terse_status want = header_flip_status(byte, m, len, 0);
        terse_status s = terse_decode(f.c, m, len, f.dst, 1.0f, 0);
        cr_assert_eq(s, want, "%s: flipping header bit %zu (byte %zu) gave %s, want %s (%s)",
                     f.spec, bit, byte, terse_status_name(s), terse_status_name(want),
                     terse_last_error());
        cr_assert_neq(terse_last_error()[0], '\0');
        want = header_flip_status(byte, m, len, 1);
        s = terse_wire_inspect(m, len, NULL);
        cr_assert_eq(s, want, "%s: inspect after flipping header bit %zu gave %s, want %s", f.spec,
                     bit, terse_status_name(s), terse_status_name(want));
        m[byte] ^= (uint8_t)(1u << (bit % 8));
    }
    expect_sentinel(&f, "a decode with a flipped header bit");
    terse_wire_info info;
    cr_assert_eq(terse_wire_inspect(m, len, &info), TERSE_OK);
    cr_expect_eq(info.codec_id, f.id);
    cr_expect_eq(info.count, f.n);
    cr_expect_eq(info.payload_len, len - TERSE_WIRE_HEADER_SIZE);
    free(m);
    teardown(&f);
}

ParameterizedTestParameters(wire, payload_bit_flips_fail_the_checksum) { return tu_spec_params(); }
ParameterizedTest(size_t *i, wire, payload_bit_flips_fail_the_checksum) {
    fixture f;
    if (!setup(&f, *i)) return;
    fill_sentinel(&f);
    uint64_t key = terse__rng_key(0xf11b, *i, 0, 0);
    for (int k = 0; k < 3; k++) {
        size_t len = f.len[k], plen = len - TERSE_WIRE_HEADER_SIZE;
        if (plen == 0) continue;
        uint8_t *m = f.msg[k];
        for (uint64_t trial = 0; trial < 1000; trial++) {
            /* Half single-bit flips, the rest 2..8 bits anywhere in the
             * payload (possibly the same bit twice: then skip, it cancels). */
            uint64_t base = 100 * trial + (uint64_t)k * 1000000;
            uint64_t r = terse__rng_u64(key, base + 99);
            int nflip = (r & 1) ? 1 : 2 + (int)((r >> 1) % 7);
            size_t pos[8];
            for (int b = 0; b < nflip; b++) {
                pos[b] = (size_t)(terse__rng_u64(key, base + (uint64_t)b) % (8 * plen));
                m[TERSE_WIRE_HEADER_SIZE + pos[b] / 8] ^= (uint8_t)(1u << (pos[b] % 8));
            }
            /* A bit flipped an even number of times is back to its value. */
            int changed = 0;
            for (int b = 0; b < nflip; b++) {
                int times = 0;
                for (int c2 = 0; c2 < nflip; c2++) times += pos[c2] == pos[b];
                changed |= times % 2;
            }
            if (changed) {
                terse_status s = terse_decode(f.c, m, len, f.dst, 1.0f, (int)(trial & 1));
                cr_assert_eq(s, TERSE_ERR_CORRUPT, "%s: %d payload bit flips gave %s", f.spec,
                             nflip, terse_status_name(s));
                cr_assert_eq(terse_wire_inspect(m, len, NULL), TERSE_ERR_CORRUPT);
            }
            for (int b = 0; b < nflip; b++)
                m[TERSE_WIRE_HEADER_SIZE + pos[b] / 8] ^= (uint8_t)(1u << (pos[b] % 8));
        }
    }
    expect_sentinel(&f, "a decode that failed its checksum");
    teardown(&f);
}

/* ---- crafted payloads: the CRC is recomputed, so only the codec's own
 * validation protects it ---- */

/* clang-format off */
static const uint32_t interesting32[] = {
    0u, 1u, 2u, 7u, 8u, 0x7fu, 0x80u, 0xffu, 0x100u, 0xffffu, 0x10000u, 0x7fffffffu, 0x80000000u,
    0xffffffffu, 0xfffffffeu, 3737u, 3736u, 3738u,
    0x7f800000u /* +Inf */, 0xff800000u /* -Inf */, 0x7fc00000u /* NaN */,
    0x7f7fffffu /* FLT_MAX */, 0x00000001u /* smallest denormal */, 0x80000000u /* -0 */, 0x3f800000u /* 1.0f */,
};
/* clang-format on */

typedef struct {
    size_t ok, corrupt, nonfinite;
} crafted_stats;

/* Mutate p[0..*plen) in place (cap bytes available) with 1..3 operators. */
static void mutate(uint8_t *p, size_t *plen, size_t cap, uint64_t key, uint64_t trial) {
    uint64_t ctr = trial * 64;
    uint64_t r0 = terse__rng_u64(key, ctr++);
    int nops = 1 + (int)(r0 % 3);
    for (int op = 0; op < nops; op++) {
        uint64_t r = terse__rng_u64(key, ctr++);
        uint64_t r2 = terse__rng_u64(key, ctr++);
        size_t n = *plen;
        /* Half the edits land in the first 64 bytes, where codecs keep
         * their counts, scales and index headers. */
        size_t span = (r2 & 1) && n > 64 ? 64 : n;
        size_t at = span ? (size_t)((r2 >> 1) % span) : 0;
        switch (r % 9) {
        case 0: /* flip 1..4 bits */
            for (int b = 0; b < 1 + (int)((r >> 8) % 4) && n; b++)
                p[(at + (size_t)((r >> (12 + 8 * b)) & 0xff)) % n] ^=
                    (uint8_t)(1u << ((r >> (40 + 3 * b)) & 7));
            break;
        case 1: /* random bytes */
            for (int b = 0; b < 1 + (int)((r >> 8) % 4) && n; b++)
                p[(at + (size_t)b) % n] = (uint8_t)(r >> (16 + 8 * b));
            break;
        case 2: { /* an interesting byte */
            static const uint8_t v[] = {0x00, 0xff, 0x7f, 0x80, 0x01, 0xfe};
            if (n) p[at] = v[(r >> 8) % sizeof v];
            break;
        }
        case 3: /* an interesting 32-bit word */
            if (n >= 4)
                terse__put_u32(
                    p + (at > n - 4 ? n - 4 : at),
                    interesting32[(r >> 8) % (sizeof interesting32 / sizeof interesting32[0])]);
            break;
        case 4: /* an interesting 64-bit word */
            if (n >= 8) {
                uint64_t v = (r >> 8) & 1 ? UINT64_MAX : (uint64_t)1 << ((r >> 9) % 64);
                terse__put_u64(p + (at > n - 8 ? n - 8 : at), v);
            }
            break;
        case 5: /* shorten: to a tiny length, or by a few bytes */
            if (n)
                *plen = (r >> 8) & 1 ? (size_t)((r >> 9) % (n < 16 ? n : 16))
                                     : n - 1 - (size_t)((r >> 9) % (n < 8 ? n : 8));
            break;
        case 6: { /* lengthen by 1..64 bytes of noise (may exceed the bound) */
            size_t add = 1 + (size_t)((r >> 8) % 64);
            if (n + add > cap) add = cap - n;
            for (size_t b = 0; b < add; b++) p[n + b] = (uint8_t)terse__rng_u64(key, ctr++);
            *plen = n + add;
            break;
        }
        case 7: /* zero a run */
            if (n) memset(p + at, 0, 1 + (size_t)((r >> 8) % (n - at)) % 64);
            break;
        default: /* copy a run from elsewhere (duplicated indices, repeated scales) */
            if (n > 8) {
                size_t from = (size_t)((r >> 8) % (n - 8)), to = (size_t)((r >> 32) % (n - 8));
                memmove(p + to, p + from, 8);
            }
            break;
        }
    }
}

ParameterizedTestParameters(wire, crafted_payloads_with_a_valid_checksum_never_crash) {
    return tu_spec_params();
}
ParameterizedTest(size_t *i, wire, crafted_payloads_with_a_valid_checksum_never_crash) {
    fixture f;
    if (!setup(&f, *i)) return;
    size_t bound = terse_codec_bound(f.c) - TERSE_WIRE_HEADER_SIZE;
    size_t cap = bound + 64; /* room to lengthen past the bound */
    uint8_t *work = malloc(cap);
    uint64_t key = terse__rng_key(0xc4af7, *i, 0, 0);
    crafted_stats st = {0, 0, 0};
    static const float alphas[] = {1.0f, -1.0f, 0.5f, 0.0f};
    /* Resealing an untouched payload must give back a valid message. */
    {
        size_t plen = f.len[0] - TERSE_WIRE_HEADER_SIZE;
        uint8_t *m = malloc(f.len[0]);
        memcpy(m, f.msg[0], f.len[0]);
        terse__wire_seal(m, f.id, f.n, plen);
        cr_assert_eq(memcmp(m, f.msg[0], f.len[0]), 0, "%s: terse__wire_seal differs from encode",
                     f.spec);
        free(m);
    }
    for (uint64_t trial = 0; trial < 3000; trial++) {
        int k = (int)(trial % 3);
        size_t plen = f.len[k] - TERSE_WIRE_HEADER_SIZE;
        memcpy(work, f.msg[k] + TERSE_WIRE_HEADER_SIZE, plen);
        mutate(work, &plen, cap, key, trial);
        uint8_t *m = malloc(TERSE_WIRE_HEADER_SIZE + plen); /* exact size */
        memcpy(m + TERSE_WIRE_HEADER_SIZE, work, plen);
        terse__wire_seal(m, f.id, f.n, plen);
        cr_assert_eq(terse_wire_inspect(m, TERSE_WIRE_HEADER_SIZE + plen, NULL), TERSE_OK);
        int acc = (int)((trial >> 2) & 1);
        if (acc)
            for (size_t j = 0; j < f.n; j++) f.dst[j] = 1.0f;
        terse_status s =
            terse_decode(f.c, m, TERSE_WIRE_HEADER_SIZE + plen, f.dst, alphas[trial % 4], acc);
        cr_assert(s == TERSE_OK || s == TERSE_ERR_CORRUPT,
                  "%s: crafted payload (trial %llu, %zu bytes) gave %s (%s)", f.spec,
                  (unsigned long long)trial, plen, terse_status_name(s), terse_last_error());
        if (plen > bound)
            cr_assert_eq(s, TERSE_ERR_CORRUPT, "%s: a payload longer than the bound decoded",
                         f.spec);
        if (s == TERSE_OK) {
            st.ok++;
            for (size_t j = 0; j < f.n; j++)
                if (!isfinite(f.dst[j])) {
                    st.nonfinite++;
                    break;
                }
        } else {
            st.corrupt++;
            cr_assert_neq(terse_last_error()[0], '\0', "%s: CORRUPT without a sentence", f.spec);
        }
        free(m);
    }
    cr_log_info("%s: 3000 crafted payloads: %zu decoded (%zu of them to non-finite values), "
                "%zu refused as corrupt",
                f.spec, st.ok, st.nonfinite, st.corrupt);
    free(work);
    teardown(&f);
}

ParameterizedTestParameters(wire, absurd_counts_and_lengths_are_refused) {
    return tu_spec_params();
}
ParameterizedTest(size_t *i, wire, absurd_counts_and_lengths_are_refused) {
    fixture f;
    if (!setup(&f, *i)) return;
    fill_sentinel(&f);
    size_t len = f.len[0], plen = len - TERSE_WIRE_HEADER_SIZE;
    uint8_t *m = malloc(len);
    static const uint64_t huge[] = {UINT32_MAX, UINT64_MAX, (uint64_t)1 << 36, 0};
    for (size_t h = 0; h < sizeof huge / sizeof huge[0]; h++) {
        /* A count the codec is not bound to, with a valid checksum. */
        memcpy(m, f.msg[0], len);
        terse__wire_seal(m, f.id, huge[h], plen);
        terse_status s = terse_decode(f.c, m, len, f.dst, 1.0f, 0);
        cr_expect_eq(s, TERSE_ERR_SHAPE, "%s: count %llu gave %s", f.spec,
                     (unsigned long long)huge[h], terse_status_name(s));
        terse_wire_info info;
        cr_expect_eq(terse_wire_inspect(m, len, &info), TERSE_OK);
        cr_expect_eq(info.count, huge[h]);
        if (huge[h] == 0 || huge[h] == (uint64_t)1 << 36) continue;
        /* A payload length beyond the buffer (the checksum cannot even be
         * computed: the length must be refused first). */
        memcpy(m, f.msg[0], len);
        terse__put_u64(m + 16, huge[h]);
        s = terse_decode(f.c, m, len, f.dst, 1.0f, 0);
        cr_expect_eq(s, TERSE_ERR_TRUNCATED, "%s: payload length %llu gave %s", f.spec,
                     (unsigned long long)huge[h], terse_status_name(s));
        cr_expect_eq(terse_wire_inspect(m, len, NULL), TERSE_ERR_TRUNCATED);
    }
    /* A payload one byte longer than the codec's bound, checksum valid. */
    size_t bound = terse_codec_bound(f.c) - TERSE_WIRE_HEADER_SIZE;
    uint8_t *big = calloc(1, TERSE_WIRE_HEADER_SIZE + bound + 1);
    memcpy(big, f.msg[0], len);
    terse__wire_seal(big, f.id, f.n, bound + 1);
    cr_expect_eq(terse_decode(f.c, big, TERSE_WIRE_HEADER_SIZE + bound + 1, f.dst, 1.0f, 0),
                 TERSE_ERR_CORRUPT, "%s: a payload past the bound was not refused", f.spec);
    cr_expect_eq(terse_wire_inspect(big, TERSE_WIRE_HEADER_SIZE + bound + 1, NULL), TERSE_OK);
    expect_sentinel(&f, "a decode of an absurd header");
    free(big);
    free(m);
    teardown(&f);
}

ParameterizedTestParameters(wire, messages_of_another_codec_or_shape_are_refused) {
    return tu_spec_params();
}
ParameterizedTest(size_t *i, wire, messages_of_another_codec_or_shape_are_refused) {
    fixture f;
    if (!setup(&f, *i)) return;
    fill_sentinel(&f);
    float *x = malloc(f.n * sizeof *x);
    tu_fill_gauss(x, f.n, 3);
    /* Same shape, other codec. */
    const char *other = f.id == 1 ? "fp16" : "none";
    terse_codec *o = NULL;
    if (terse_codec_create(other, TU_ROWS, TU_COLS, &o) == TERSE_OK) {
        uint8_t *m;
        size_t len = tu_encode(o, x, &m);
        terse_status s = decode_exact(&f, m, len, 1.0f, 0);
        cr_expect_eq(s, TERSE_ERR_CODEC_MISMATCH, "%s: a '%s' message gave %s", f.spec, other,
                     terse_status_name(s));
        /* the sentence names both codecs, not only their ids */
        char quoted[40];
        snprintf(quoted, sizeof quoted, "('%s')", other);
        cr_expect(strstr(terse_last_error(), quoted) != NULL, "%s: '%s' does not name '%s'",
                  f.spec, terse_last_error(), other);
        free(m);
        terse_codec_free(o);
    }
    /* Same codec, other shape (one row fewer). */
    o = tu_create(f.spec, TU_ROWS - 1, TU_COLS);
    uint8_t *m;
    size_t len = tu_encode(o, x, &m);
    terse_status s = decode_exact(&f, m, len, 1.0f, 0);
    cr_expect_eq(s, TERSE_ERR_SHAPE, "%s: a message for %u x %u gave %s", f.spec, TU_ROWS - 1,
                 TU_COLS, terse_status_name(s));
    expect_sentinel(&f, "a decode of a foreign message");
    free(m);
    terse_codec_free(o);
    free(x);
    teardown(&f);
}
