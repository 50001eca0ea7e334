/* Checkpoint state (terse_codec_state_*) for every codec in tu_specs: a
 * saved state resumes bit-identically in a fresh codec, and a damaged or
 * mismatched state is refused with the status that names the fault and
 * leaves the codec exactly as it was. Layout: compress/state.c. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "testutil.h"

#include "compress/state.h"
#define STATE_HEAD TERSE__STATE_HEAD

static void spec_variant(char *buf, size_t cap, size_t i, int ef) {
    if (ef)
        tu_spec_with(buf, cap, tu_specs[i], "ef=1");
    else
        snprintf(buf, cap, "%s", tu_specs[i]);
}

static void step_input(float *x, size_t n, uint64_t t) {
    tu_fill_gauss(x, n, 700 + t);
    for (size_t i = 0; i < n; i++) x[i] *= 0.5f + (float)(t % 3);
}

/* Encode steps [from, to) of the standard input sequence; return the
 * concatenated messages (for comparison) in a malloc'd buffer. */
static uint8_t *run_steps(terse_codec *c, uint64_t from, uint64_t to, size_t *total) {
    size_t n = terse_codec_elements(c), cap = terse_codec_bound(c);
    uint8_t *all = malloc(cap * (size_t)(to - from) + 1);
    float *x = malloc(n * sizeof *x);
    *total = 0;
    for (uint64_t t = from; t < to; t++) {
        step_input(x, n, t);
        size_t len;
        cr_assert_eq(terse_encode(c, x, all + *total, cap, &len), TERSE_OK, "%s: %s",
                     terse_codec_spec(c), terse_last_error());
        *total += len;
    }
    free(x);
    return all;
}

static uint8_t *save(const terse_codec *c, size_t *len) {
    size_t size = terse_codec_state_size(c);
    uint8_t *buf = malloc(size);
    cr_assert_eq(terse_codec_state_save(c, buf, size, len), TERSE_OK, "%s: %s", terse_codec_spec(c),
                 terse_last_error());
    cr_assert_eq(*len, size, "%s: state_save wrote %zu bytes, state_size said %zu",
                 terse_codec_spec(c), *len, size);
    return buf;
}

ParameterizedTestParameters(state, save_and_load_resume_bit_identically) {
    return tu_spec_params();
}
ParameterizedTest(size_t *i, state, save_and_load_resume_bit_identically) {
    for (int ef = 0; ef <= 1; ef++) {
        char spec[256];
        spec_variant(spec, sizeof spec, *i, ef);
        terse_codec *a;
        TU_CREATE_OR_RETURN(a, spec, TU_ROWS, TU_COLS);
        terse_codec *b = tu_create(spec, TU_ROWS, TU_COLS);
        cr_assert_eq(terse_codec_set_stream(a, 5, 2), TERSE_OK);
        size_t total, len;
        free(run_steps(a, 0, 3, &total));
        uint8_t *st = save(a, &len);
        size_t small_len = 1;
        cr_expect_eq(terse_codec_state_save(a, st, len - 1, &small_len), TERSE_ERR_DST_TOO_SMALL);
        cr_expect_eq(small_len, 0);
        cr_assert_eq(terse_codec_state_load(b, st, len), TERSE_OK, "%s: %s", spec,
                     terse_last_error());
        cr_expect_eq(terse_codec_step(b), 3);
        /* b got step, stream, residual and codec state from a: the next
         * messages must be byte for byte the same. */
        size_t ta, tb;
        uint8_t *ma = run_steps(a, 3, 7, &ta), *mb = run_steps(b, 3, 7, &tb);
        cr_assert(ta == tb && memcmp(ma, mb, ta) == 0, "%s: the loaded codec diverged", spec);
        size_t la, lb;
        uint8_t *sa = save(a, &la), *sb = save(b, &lb);
        cr_assert(la == lb && memcmp(sa, sb, la) == 0, "%s: states differ after resuming", spec);
        free(st), free(ma), free(mb), free(sa), free(sb);
        terse_codec_free(a), terse_codec_free(b);
    }
}

/* The status flipping state byte `at` must produce, from the layout in
 * compress/state.c and the order its fields are checked in: identity fields
 * first (each with its own status), then the checksum over the rest. */
static terse_status state_flip_status(size_t at) {
    if (at < 4) return TERSE_ERR_MAGIC;
    if (at < 8) return TERSE_ERR_VERSION;
    if (at < 12) return TERSE_ERR_CODEC_MISMATCH;
    if (at < 16) return TERSE_ERR_CORRUPT; /* flags ^ 0xff: unknown flag bits */
    if (at < 24) return TERSE_ERR_SHAPE;
    if (at < 32) return TERSE_ERR_INVALID; /* another seed: a different configuration */
    if (at >= 64 && at < 72) return TERSE_ERR_SHAPE; /* rows */
    return TERSE_ERR_CORRUPT; /* step/tensor/rank (checksum), reserved, lengths, body */
}

/* Every byte of the header and of the last 8 (the checksum), a
 * sample of the body between. */
static size_t next_flip(size_t at, size_t len) {
    if (at < STATE_HEAD || at + 8 >= len) return at + 1;
    size_t next = at + 1 + at % 61;
    return next > len - 8 ? len - 8 : next;
}

typedef struct {
    terse_codec *target; /* receives the bad states */
    uint8_t *pristine;   /* its state before any of them */
    size_t pristine_len;
    const char *spec;
} victim;

/* Load must refuse with `want` and leave the target as it was. Comparing
 * the saved state after every attempt would cost O(len^2) for the
 * truncations, so `check` says when to compare; a change would persist
 * until the final comparison anyway because bad states differ from it. */
static void expect_refused(victim *v, const uint8_t *st, size_t len, terse_status want,
                           const char *what, int check) {
    terse_status s = terse_codec_state_load(v->target, st, len);
    cr_assert_eq(s, want, "%s: %s gave %s, want %s (%s)", v->spec, what, terse_status_name(s),
                 terse_status_name(want), terse_last_error());
    cr_assert_neq(terse_last_error()[0], '\0');
    if (check) {
        size_t l;
        uint8_t *now = save(v->target, &l);
        cr_assert(l == v->pristine_len && memcmp(now, v->pristine, l) == 0,
                  "%s: a refused load (%s) changed the codec", v->spec, what);
        free(now);
    }
}

ParameterizedTestParameters(state, damaged_state_is_refused_and_changes_nothing) {
    return tu_spec_params();
}
ParameterizedTest(size_t *i, state, damaged_state_is_refused_and_changes_nothing) {
    for (int ef = 0; ef <= 1; ef++) {
        char spec[256], what[96];
        spec_variant(spec, sizeof spec, *i, ef);
        terse_codec *src;
        TU_CREATE_OR_RETURN(src, spec, TU_ROWS, TU_COLS);
        cr_assert_eq(terse_codec_set_stream(src, 5, 2), TERSE_OK);
        size_t total, len;
        free(run_steps(src, 0, 3, &total));
        uint8_t *st = save(src, &len);

        /* The target has a history of its own, so a partial load shows. */
        victim v = {tu_create(spec, TU_ROWS, TU_COLS), NULL, 0, spec};
        terse_codec *twin = tu_create(spec, TU_ROWS, TU_COLS);
        cr_assert_eq(terse_codec_set_stream(v.target, 8, 1), TERSE_OK);
        cr_assert_eq(terse_codec_set_stream(twin, 8, 1), TERSE_OK);
        free(run_steps(v.target, 10, 11, &total));
        free(run_steps(twin, 10, 11, &total));
        v.pristine = save(v.target, &v.pristine_len);

        /* Every truncation. */
        uint8_t *tail = malloc(len);
        for (size_t cut = 0; cut < len; cut++) {
            memcpy(tail + len - cut, st, cut); /* ends at the allocation's end */
            snprintf(what, sizeof what, "a state cut to %zu of %zu bytes", cut, len);
            expect_refused(&v, tail + len - cut, cut, TERSE_ERR_TRUNCATED, what, cut % 509 == 0);
        }
        free(tail);
        /* One longer than it should be. */
        uint8_t *longer = calloc(1, len + 1);
        memcpy(longer, st, len);
        expect_refused(&v, longer, len + 1, TERSE_ERR_CORRUPT, "a state one byte too long", 1);
        free(longer);

        /* A flipped byte: every header byte, the checksum, and a sample of
         * the body. */
        uint8_t *bad = malloc(len);
        memcpy(bad, st, len);
        for (size_t at = 0; at < len; at = next_flip(at, len)) {
            bad[at] ^= 0xff;
            snprintf(what, sizeof what, "a state with byte %zu of %zu flipped", at, len);
            expect_refused(&v, bad, len, state_flip_status(at), what, at % 7 == 0);
            bad[at] ^= 0xff;
        }
        cr_assert_eq(memcmp(bad, st, len), 0);
        free(bad);

        /* Another codec's state (none's, or fp16's for none). */
        const char *other = strncmp(spec, "none", 4) == 0 ? "fp16" : "none";
        char ospec[64];
        snprintf(ospec, sizeof ospec, "%s%s", other, ef ? ":ef=1" : "");
        terse_codec *o = NULL;
        if (terse_codec_create(ospec, TU_ROWS, TU_COLS, &o) == TERSE_OK) {
            size_t ol;
            uint8_t *os = save(o, &ol);
            expect_refused(&v, os, ol, TERSE_ERR_CODEC_MISMATCH, "another codec's state", 1);
            free(os);
            terse_codec_free(o);
        }
        /* Another shape: one row fewer. */
        o = tu_create(spec, TU_ROWS - 1, TU_COLS);
        size_t ol;
        uint8_t *os = save(o, &ol);
        expect_refused(&v, os, ol, TERSE_ERR_SHAPE, "a state for another shape", 1);
        free(os);
        terse_codec_free(o);
        /* The other ef setting. */
        char espec[256];
        spec_variant(espec, sizeof espec, *i, !ef);
        o = tu_create(espec, TU_ROWS, TU_COLS);
        os = save(o, &ol);
        expect_refused(&v, os, ol, TERSE_ERR_INVALID, "a state saved with the other ef", 1);
        free(os);
        terse_codec_free(o);

        /* After all that, the target still encodes exactly like its twin,
         * which saw none of it. */
        size_t ta, tb;
        uint8_t *ma = run_steps(v.target, 11, 13, &ta), *mb = run_steps(twin, 11, 13, &tb);
        cr_assert(ta == tb && memcmp(ma, mb, ta) == 0, "%s: refused loads changed the codec", spec);
        free(ma), free(mb);
        free(st), free(v.pristine);
        terse_codec_free(src), terse_codec_free(v.target), terse_codec_free(twin);
    }
}

/* The seed is configuration, not state: a state saved under another seed
 * is refused (a randomized codec would otherwise silently change streams). */
ParameterizedTestParameters(state, a_state_saved_with_another_seed_is_refused) {
    return tu_spec_params();
}
ParameterizedTest(size_t *i, state, a_state_saved_with_another_seed_is_refused) {
    terse_codec *c;
    TU_CREATE_OR_RETURN(c, tu_specs[*i], TU_ROWS, TU_COLS);
    terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
    cr_assert_eq(terse_codec_get_traits(c, &t), TERSE_OK);
    if (!t.randomized) {
        terse_codec_free(c);
        return;
    }
    char s1[256];
    tu_spec_with(s1, sizeof s1, tu_specs[*i], "seed=11");
    terse_codec *o = tu_create(s1, TU_ROWS, TU_COLS);
    size_t l, lc;
    uint8_t *os = save(o, &l), *cs = save(c, &lc);
    cr_assert_eq(terse__get_u64(os + 24), 11);
    cr_assert_eq(terse_codec_state_load(c, os, l), TERSE_ERR_INVALID, "%s: %s", tu_specs[*i],
                 terse_last_error());
    size_t ln;
    uint8_t *now = save(c, &ln);
    cr_expect(ln == lc && memcmp(now, cs, ln) == 0, "%s: a refused load changed the codec",
              tu_specs[*i]);
    free(os), free(cs), free(now);
    terse_codec_free(o), terse_codec_free(c);
}

Test(state, transposed_shape_is_refused_as_shape) {
    terse_codec *a, *b;
    cr_assert_eq(terse_codec_create("int8:ef=1", 37, 101, &a), TERSE_OK);
    cr_assert_eq(terse_codec_create("int8:ef=1", 101, 37, &b), TERSE_OK);
    size_t len;
    uint8_t *st = save(a, &len);
    cr_expect_eq(terse_codec_state_load(b, st, len), TERSE_ERR_SHAPE, "%s", terse_last_error());
    cr_expect_not_null(strstr(terse_last_error(), "101 x 37"), "%s", terse_last_error());
    free(st);
    terse_codec_free(a), terse_codec_free(b);
}
