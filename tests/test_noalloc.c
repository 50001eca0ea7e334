/* terse promises that encode and decode allocate nothing (all scratch is
 * made in create), and that absurd shapes, counts and lengths are refused
 * before anything is allocated. This executable counts allocation calls
 * (alloc_counter.c: the static library's calls through -Wl,--wrap, and in
 * builds without sanitizers every call in the process) around each call
 * under test. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_counter.h"
#include "common/bytes.h"
#include "common/rng.h"
#include "compress/wire.h"
#include "testutil.h"

/* Run `call` with the counters armed; fail if anything was allocated.
 * fmt and its arguments (at least one) say what was called. */
#define EXPECT_NO_ALLOC(call, fmt, ...)                                                            \
    do {                                                                                           \
        size_t all_;                                                                               \
        ac_arm();                                                                                  \
        (void)(call);                                                                              \
        size_t lib_ = ac_disarm(&all_);                                                            \
        cr_assert(lib_ == 0 && all_ == 0,                                                          \
                  fmt ": %zu allocation calls from terse, %zu in the whole process", __VA_ARGS__,  \
                  lib_, all_);                                                                     \
    } while (0)

Test(noalloc, the_counters_see_allocations) {
    size_t all;
    ac_arm();
    void *volatile p = malloc(16); /* this file is wrapped too; volatile keeps the call */
    size_t lib = ac_disarm(&all);
    free(p);
    cr_expect_eq(lib, 1);
    if (ac_counts_shared_libs) cr_expect_geq(all, 1);
    terse_codec *c = NULL;
    ac_arm();
    cr_assert_eq(terse_codec_create("none", 10, 1, &c), TERSE_OK);
    lib = ac_disarm(&all);
    cr_expect_geq(lib, 1, "terse_codec_create allocates, and the lib counter must see it");
    terse_codec_free(c);
}

Test(noalloc, absurd_shapes_are_refused_before_any_allocation) {
    static const size_t shapes[][2] = {
        {UINT32_MAX, UINT32_MAX},
        {SIZE_MAX, 1},
        {1, SIZE_MAX},
        {SIZE_MAX / 2 + 1, 2},
        {(size_t)1 << 18, ((size_t)1 << 18) + 1}, /* 2^36 + 2^18 */
        {((size_t)1 << 36) + 1, 1},
        {0, 5},
        {5, 0},
    };
    for (size_t i = 0; i < tu_nspecs; i++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            terse_codec *c = (terse_codec *)&c;
            terse_status st = TERSE_OK;
            EXPECT_NO_ALLOC(st = terse_codec_create(tu_specs[i], shapes[s][0], shapes[s][1], &c),
                            "creating '%s' as %zu x %zu", tu_specs[i], shapes[s][0], shapes[s][1]);
            cr_expect_eq(st, TERSE_ERR_INVALID, "%s %zu x %zu gave %s", tu_specs[i], shapes[s][0],
                         shapes[s][1], terse_status_name(st));
            cr_expect_null(c);
        }
}

ParameterizedTestParameters(noalloc, absurd_messages_are_refused_before_any_allocation) {
    return tu_spec_params();
}
ParameterizedTest(size_t *i, noalloc, absurd_messages_are_refused_before_any_allocation) {
    const char *spec = tu_specs[*i];
    terse_codec *c;
    TU_CREATE_OR_RETURN(c, spec, TU_ROWS, TU_COLS);
    size_t n = terse_codec_elements(c);
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    tu_fill_gauss(x, n, 1);
    uint8_t *m;
    size_t len = tu_encode(c, x, &m), plen = len - TERSE_WIRE_HEADER_SIZE;
    terse_wire_info info;
    terse_status st = TERSE_OK;
    terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
    cr_assert_eq(terse_codec_get_traits(c, &t), TERSE_OK);
    static const uint64_t huge[] = {UINT32_MAX, UINT64_MAX};
    for (size_t h = 0; h < 2; h++) {
        terse__wire_seal(m, t.id, huge[h], plen); /* claims huge[h] elements */
        EXPECT_NO_ALLOC(st = terse_decode(c, m, len, y, 1.0f, 0), "%s: count %llu", spec,
                        (unsigned long long)huge[h]);
        cr_expect_eq(st, TERSE_ERR_SHAPE);
        EXPECT_NO_ALLOC(st = terse_wire_inspect(m, len, &info), "%s: inspect", spec);
        terse__wire_seal(m, t.id, n, plen);
        terse__put_u64(m + 16, huge[h]); /* claims huge[h] payload bytes */
        EXPECT_NO_ALLOC(st = terse_decode(c, m, len, y, 1.0f, 0), "%s: payload length %llu", spec,
                        (unsigned long long)huge[h]);
        cr_expect_eq(st, TERSE_ERR_TRUNCATED);
        EXPECT_NO_ALLOC(st = terse_wire_inspect(m, len, &info), "%s: inspect", spec);
        cr_expect_eq(st, TERSE_ERR_TRUNCATED);
        terse__wire_seal(m, t.id, n, plen);
    }
    static const size_t cuts[] = {0, 1, 31, 32, 33};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        EXPECT_NO_ALLOC(st = terse_decode(c, m, cuts[k], y, 1.0f, 0), "%s: %zu bytes", spec,
                        cuts[k]);
        cr_expect_eq(st, TERSE_ERR_TRUNCATED);
    }
    EXPECT_NO_ALLOC(st = terse_decode(c, m, len - 1, y, 1.0f, 0), "%s: one byte short", spec);
    m[len - 1] ^= 1;
    EXPECT_NO_ALLOC(st = terse_decode(c, m, len, y, 1.0f, 0), "%s: bad checksum", spec);
    cr_expect_eq(st, TERSE_ERR_CORRUPT);
    free(m), free(x), free(y);
    terse_codec_free(c);
}

/* Valid and crafted messages, with and without error feedback. The first
 * step is a warm-up only for the process-wide counter (a BLAS library may
 * set up per-thread buffers on its first call); the library's own calls
 * must allocate nothing from the very first one. */
ParameterizedTestParameters(noalloc, encode_and_decode_allocate_nothing) {
    return tu_spec_params();
}
ParameterizedTest(size_t *i, noalloc, encode_and_decode_allocate_nothing) {
    for (int ef = 0; ef <= 1; ef++) {
        char spec[256];
        if (ef)
            tu_spec_with(spec, sizeof spec, tu_specs[*i], "ef=1");
        else
            strcpy(spec, tu_specs[*i]);
        terse_codec *c;
        TU_CREATE_OR_RETURN(c, spec, TU_ROWS, TU_COLS);
        size_t n = terse_codec_elements(c), cap = terse_codec_bound(c), len = 0;
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
        uint8_t *m = malloc(cap), *w = malloc(cap);
        terse_status st = TERSE_OK;
        for (uint64_t t = 0; t < 4; t++) {
            tu_fill_gauss(x, n, 40 + t);
            size_t all;
            ac_arm();
            st = terse_encode(c, x, m, cap, &len);
            if (st == TERSE_OK) st = terse_decode(c, m, len, y, 1.0f, 0);
            if (st == TERSE_OK) st = terse_decode(c, m, len, y, 0.5f, 1);
            size_t lib = ac_disarm(&all);
            cr_assert_eq(st, TERSE_OK, "%s: %s", spec, terse_last_error());
            cr_assert_eq(lib, 0, "%s step %llu: the library allocated %zu times in encode/decode",
                         spec, (unsigned long long)t, lib);
            if (t == 0 && all)
                cr_log_info("%s: first encode/decode made %zu allocations outside terse "
                            "(warm-up, allowed)",
                            spec, all);
            else
                cr_assert_eq(all, 0,
                             "%s step %llu: %zu allocation calls in encode/decode, all from "
                             "shared libraries (terse itself made none): OpenBLAS, LAPACKE or libc",
                             spec, (unsigned long long)t, all);
        }
        /* Crafted payloads (valid checksum) take the codec's error paths. */
        terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
        cr_assert_eq(terse_codec_get_traits(c, &t), TERSE_OK);
        uint64_t key = terse__rng_key(77, *i, 0, 0);
        size_t plen0 = len - TERSE_WIRE_HEADER_SIZE;
        for (uint64_t k = 0; k < 200; k++) {
            uint64_t r = terse__rng_u64(key, k);
            size_t plen = (k % 4 == 0) ? (size_t)(r >> 40) % (plen0 + 1) : plen0;
            memcpy(w, m, len);
            if (plen)
                for (int b = 0; b < 3; b++)
                    w[TERSE_WIRE_HEADER_SIZE + (size_t)(r >> (8 * b)) % (plen < 64 ? plen : 64)] ^=
                        (uint8_t)(r >> (24 + 8 * b));
            terse__wire_seal(w, t.id, n, plen);
            EXPECT_NO_ALLOC(
                st = terse_decode(c, w, TERSE_WIRE_HEADER_SIZE + plen, y, 1.0f, (int)(k & 1)),
                "%s: crafted payload %llu", spec, (unsigned long long)k);
            cr_assert(st == TERSE_OK || st == TERSE_ERR_CORRUPT);
        }
        /* A refused encode too. */
        EXPECT_NO_ALLOC(st = terse_encode(c, x, m, cap - 1, &len), "%s: small buffer", spec);
        cr_assert_eq(st, TERSE_ERR_DST_TOO_SMALL);
        free(x), free(y), free(m), free(w);
        terse_codec_free(c);
    }
}
