/* Properties every codec must have, checked over every spec in tu_specs:
 * every built-in is implemented, determinism (also across SIMD levels and
 * decoder instances), decode-with-accumulate equals decode-then-add,
 * messages within terse_codec_bound for any input, traits that tell the
 * truth, and a canonical spec that recreates the codec. Checkpoint state is
 * in test_codec_state.c, error feedback in test_feedback.c. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define N_STEPS 5

/* Create both variants: ef=0 (the spec as listed) and ef=1. */
static void spec_variant(char *buf, size_t cap, size_t i, int ef) {
    if (ef)
        tu_spec_with(buf, cap, tu_specs[i], "ef=1");
    else
        snprintf(buf, cap, "%s", tu_specs[i]);
}

static int is_powersgd(const char *spec) { return strncmp(spec, "powersgd", 8) == 0; }

/* The input of step t: a different gaussian every step, at a scale that
 * changes from step to step. */
static void step_input(float *x, size_t n, uint64_t t) {
    tu_fill_gauss(x, n, 500 + t);
    float s = 0.25f + 0.5f * (float)(t % 5);
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* ---- every built-in is real ---- */

/* Codecs that are still stubs skip the generic tests (with a warning);
 * this test makes sure that cannot go unnoticed. */
Test(registry, every_builtin_codec_is_implemented) {
    size_t count = terse_codec_count(), stubs = 0;
    char names[512] = "";
    cr_assert_geq(count, 11);
    for (size_t k = 0; k < count; k++) {
        const char *name = terse_codec_name(k);
        const char *spec = NULL;
        for (size_t i = 0; i < tu_nspecs && !spec; i++) {
            size_t l = strlen(name);
            if (strncmp(tu_specs[i], name, l) == 0 &&
                (tu_specs[i][l] == '\0' || tu_specs[i][l] == ':'))
                spec = tu_specs[i];
        }
        cr_expect_not_null(spec, "built-in codec '%s' has no entry in tu_specs (tests/testutil.c)",
                           name);
        if (!spec) continue;
        terse_codec *c = NULL;
        terse_status s = terse_codec_create(spec, TU_ROWS, TU_COLS, &c);
        if (s == TERSE_ERR_UNSUPPORTED) {
            stubs++;
            strncat(names, " ", sizeof names - strlen(names) - 1);
            strncat(names, name, sizeof names - strlen(names) - 1);
        } else {
            cr_expect_eq(s, TERSE_OK, "create '%s': %s", spec, terse_last_error());
        }
        terse_codec_free(c);
    }
    cr_expect_eq(stubs, 0, "%zu built-in codec(s) are still stubs returning UNSUPPORTED:%s", stubs,
                 names);
}

/* ---- determinism ---- */

ParameterizedTestParameters(codec, same_spec_seed_and_stream_give_identical_messages) {
    return tu_spec_params();
}
ParameterizedTest(size_t *i, codec, same_spec_seed_and_stream_give_identical_messages) {
    for (int ef = 0; ef <= 1; ef++) {
        char spec[256];
        spec_variant(spec, sizeof spec, *i, ef);
        terse_codec *a;
        TU_CREATE_OR_RETURN(a, spec, TU_ROWS, TU_COLS);
        terse_codec *b = tu_create(spec, TU_ROWS, TU_COLS);
        terse_codec *d = tu_create(spec, TU_ROWS, TU_COLS); /* decodes only */
        cr_assert_eq(terse_codec_set_stream(a, 9, 2), TERSE_OK);
        cr_assert_eq(terse_codec_set_stream(b, 9, 2), TERSE_OK);
        cr_assert_eq(terse_codec_set_stream(d, 4, 0), TERSE_OK);
        size_t n = terse_codec_elements(a), cap = terse_codec_bound(a);
        float *x = malloc(n * sizeof *x), *ya = malloc(n * sizeof *ya),
              *yd = malloc(n * sizeof *yd);
        uint8_t *ma = malloc(cap), *mb = malloc(cap);
        for (uint64_t t = 0; t < N_STEPS; t++) {
            step_input(x, n, t);
            size_t la, lb;
            cr_assert_eq(terse_encode(a, x, ma, cap, &la), TERSE_OK, "%s: %s", spec,
                         terse_last_error());
            cr_assert_eq(terse_encode(b, x, mb, cap, &lb), TERSE_OK);
            cr_assert_eq(la, lb, "%s step %llu: lengths %zu and %zu", spec, (unsigned long long)t,
                         la, lb);
            cr_assert_eq(memcmp(ma, mb, la), 0, "%s step %llu: messages differ", spec,
                         (unsigned long long)t);
            /* Only a: decode its own message, and a damaged one. Decoding
             * must not change the state the next encode uses. */
            cr_assert_eq(terse_decode(a, ma, la, ya, 1.0f, 0), TERSE_OK);
            ma[la - 1] ^= 0x10;
            cr_assert_eq(terse_decode(a, ma, la, ya, 1.0f, 1), TERSE_ERR_CORRUPT);
            ma[la - 1] ^= 0x10;
            cr_assert_eq(terse_decode(a, ma, la, ya, 1.0f, 0), TERSE_OK);
            /* Any codec of the same spec and shape decodes it identically,
             * whatever its own stream and history (it is another rank). */
            cr_assert_eq(terse_decode(d, ma, la, yd, 1.0f, 0), TERSE_OK);
            cr_assert_eq(memcmp(ya, yd, n * sizeof *ya), 0,
                         "%s step %llu: another codec instance decodes differently", spec,
                         (unsigned long long)t);
        }
        cr_expect_eq(terse_codec_step(a), N_STEPS);
        free(x), free(ya), free(yd), free(ma), free(mb);
        terse_codec_free(a), terse_codec_free(b), terse_codec_free(d);
    }
}

/* For randomized codecs the seed must matter (else seed= is a lie), and
 * randk must ignore the rank (terse.h: every rank draws the same indices). */
ParameterizedTestParameters(codec, randomized_codecs_use_their_seed) { return tu_spec_params(); }
ParameterizedTest(size_t *i, codec, randomized_codecs_use_their_seed) {
    terse_codec *c;
    TU_CREATE_OR_RETURN(c, tu_specs[*i], TU_ROWS, TU_COLS);
    terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
    cr_assert_eq(terse_codec_get_traits(c, &t), TERSE_OK);
    terse_codec_free(c);
    if (!t.randomized) return;
    /* PowerSGD's dense fallback (here rank 16 at 37 x 101) draws nothing. */
    if (is_powersgd(tu_specs[*i]) && t.bits_per_element >= 32.0) return;
    char s1[256], s2[256];
    tu_spec_with(s1, sizeof s1, tu_specs[*i], "seed=1");
    tu_spec_with(s2, sizeof s2, tu_specs[*i], "seed=2");
    terse_codec *a = tu_create(s1, TU_ROWS, TU_COLS);
    terse_codec *b = tu_create(s2, TU_ROWS, TU_COLS);
    terse_codec *r = tu_create(s1, TU_ROWS, TU_COLS);
    cr_assert_eq(terse_codec_set_stream(r, 0, 5), TERSE_OK); /* another rank */
    size_t n = terse_codec_elements(a);
    float *x = malloc(n * sizeof *x);
    int seed_mattered = 0;
    for (uint64_t step = 0; step < N_STEPS; step++) {
        step_input(x, n, step);
        uint8_t *ma, *mb, *mr;
        size_t la = tu_encode(a, x, &ma), lb = tu_encode(b, x, &mb), lr = tu_encode(r, x, &mr);
        seed_mattered |= la != lb || memcmp(ma, mb, la) != 0;
        if (strncmp(tu_specs[*i], "randk", 5) == 0)
            cr_expect(la == lr && memcmp(ma, mr, la) == 0,
                      "%s: rank changed the message at step %llu", tu_specs[*i],
                      (unsigned long long)step);
        free(ma), free(mb), free(mr);
    }
    cr_expect(seed_mattered, "%s: seed=1 and seed=2 gave identical messages for %d steps",
              tu_specs[*i], N_STEPS);
    free(x);
    terse_codec_free(a), terse_codec_free(b), terse_codec_free(r);
}

/* Run in a child process whose SIMD level is capped by TERSE_SIMD: encode
 * three steps (ef=0 and ef=1), decode plainly and with accumulate, and
 * write every byte produced to out. Exit status 2 means "stub". */
static void simd_child(FILE *out, const char *level, size_t i) {
    if (level)
        setenv("TERSE_SIMD", level, 1);
    else
        unsetenv("TERSE_SIMD");
    for (int ef = 0; ef <= 1; ef++) {
        char spec[256];
        spec_variant(spec, sizeof spec, i, ef);
        terse_codec *c = NULL;
        terse_status s = terse_codec_create(spec, TU_ROWS, TU_COLS, &c);
        if (s == TERSE_ERR_UNSUPPORTED) _exit(2);
        if (s != TERSE_OK) _exit(1);
        size_t n = terse_codec_elements(c), cap = terse_codec_bound(c), len;
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
        uint8_t *m = malloc(cap);
        for (uint64_t t = 0; t < 3; t++) {
            step_input(x, n, t);
            if (t == 2) { /* special values where the kernels branch */
                x[0] = 0.0f, x[1] = -0.0f, x[2] = 1e-40f, x[3] = -1e-45f, x[4] = 3e38f;
                x[5] = 65504.0f, x[6] = 65520.0f, x[7] = -1e-8f;
            }
            if (terse_encode(c, x, m, cap, &len) != TERSE_OK) _exit(1);
            fwrite(m, 1, len, out);
            if (terse_decode(c, m, len, y, 0.3f, 0) != TERSE_OK) _exit(1);
            fwrite(y, sizeof *y, n, out);
            if (terse_decode(c, m, len, y, -1.7f, 1) != TERSE_OK) _exit(1);
            fwrite(y, sizeof *y, n, out);
        }
        free(x), free(y), free(m);
        terse_codec_free(c);
    }
    fflush(out);
    _exit(0);
}

/* The bytes a child produced at one SIMD level; NULL (and *stub set) if
 * the codec is a stub. */
static uint8_t *simd_run(const char *level, size_t i, size_t *len, int *stub) {
    FILE *f = tmpfile();
    cr_assert_not_null(f);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) simd_child(f, level, i);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "%s: child at SIMD level %s crashed", tu_specs[i],
              level ? level : "(best)");
    *stub = WEXITSTATUS(status) == 2;
    cr_assert(WEXITSTATUS(status) == 0 || *stub, "%s: child at SIMD level %s failed", tu_specs[i],
              level ? level : "(best)");
    long size = ftell(f);
    cr_assert_geq(size, 0);
    uint8_t *buf = malloc((size_t)size + 1);
    rewind(f);
    cr_assert_eq(fread(buf, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    *len = (size_t)size;
    return buf;
}

/* The kernel choice is cached on first use, so each SIMD level runs in a
 * fresh child process (this worker never calls terse before forking). */
ParameterizedTestParameters(codec, messages_and_decodes_are_identical_at_every_simd_level) {
    return tu_spec_params();
}
ParameterizedTest(size_t *i, codec, messages_and_decodes_are_identical_at_every_simd_level) {
    static const char *const levels[] = {"scalar", "avx2", NULL};
    size_t len0 = 0;
    int stub = 0;
    uint8_t *ref = simd_run(levels[0], *i, &len0, &stub);
    if (stub) {
        free(ref);
        fprintf(stderr, "WARNING: SKIPPED: codec '%s' is still a stub\n", tu_specs[*i]);
        return;
    }
    for (size_t l = 1; l < sizeof levels / sizeof levels[0]; l++) {
        size_t len = 0;
        uint8_t *got = simd_run(levels[l], *i, &len, &stub);
        cr_expect(len == len0 && memcmp(ref, got, len) == 0,
                  "%s: output at SIMD level '%s' differs from scalar", tu_specs[*i],
                  levels[l] ? levels[l] : "(best)");
        free(got);
    }
    free(ref);
}

/* ---- decode ---- */

ParameterizedTestParameters(codec, decode_with_accumulate_equals_decode_then_add) {
    return tu_spec_params();
}
ParameterizedTest(size_t *i, codec, decode_with_accumulate_equals_decode_then_add) {
    const char *spec = tu_specs[*i];
    terse_codec *c;
    TU_CREATE_OR_RETURN(c, spec, TU_ROWS, TU_COLS);
    size_t n = terse_codec_elements(c);
    float *x = malloc(n * sizeof *x), *base = malloc(n * sizeof *base);
    float *plain = malloc(n * sizeof *plain), *acc = malloc(n * sizeof *acc);
    static const float alphas[] = {1.0f, 0.3f, -1.0f, 1e-3f};
    /* PowerSGD decodes P Q^T with sgemm; beta = 1 may sum in another order
     * than beta = 0 followed by an add, so it gets a norm-wise tolerance. */
    int exact = !is_powersgd(spec);
    for (uint64_t t = 0; t < 3; t++) {
        step_input(x, n, t);
        tu_fill_gauss(base, n, 900 + t);
        uint8_t *m;
        size_t len = tu_encode(c, x, &m);
        for (size_t a = 0; a < sizeof alphas / sizeof alphas[0]; a++) {
            cr_assert_eq(terse_decode(c, m, len, plain, alphas[a], 0), TERSE_OK);
            memcpy(acc, base, n * sizeof *acc);
            cr_assert_eq(terse_decode(c, m, len, acc, alphas[a], 1), TERSE_OK);
            double d2 = 0, s2 = 0;
            for (size_t j = 0; j < n; j++) {
                float want = base[j] + plain[j];
                if (exact)
                    cr_assert(memcmp(&want, &acc[j], sizeof want) == 0,
                              "%s alpha %g: dst[%zu] = %a after accumulate, %a = %a + %a after "
                              "decode then add",
                              spec, alphas[a], j, acc[j], want, base[j], plain[j]);
                d2 += ((double)acc[j] - want) * ((double)acc[j] - want);
                s2 += (double)base[j] * base[j] + (double)plain[j] * plain[j];
            }
            cr_assert_leq(sqrt(d2), 1e-6 * sqrt(s2), "%s alpha %g: accumulate differs by %g", spec,
                          alphas[a], sqrt(d2));
        }
        free(m);
    }
    free(x), free(base), free(plain), free(acc);
    terse_codec_free(c);
}

/* Inputs meant to push encoders to their worst case. */
static void hostile_input(float *x, size_t n, int kind) {
    for (size_t i = 0; i < n; i++) {
        float g = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
        switch (kind) {
        case 0: x[i] = 0.0f; break;
        case 1: x[i] = 1.0f; break;
        case 2: x[i] = (i & 1) ? FLT_MAX : -FLT_MAX; break;
        case 3: x[i] = i == n / 3 ? 1e30f : 1e-30f * g; break;
        case 4: x[i] = 1e-42f * g; break; /* denormals */
        case 5: x[i] = NAN; break;
        case 6:
            x[i] = (i % 5 == 0) ? INFINITY : (i % 5 == 1) ? -INFINITY : (i % 5 == 2) ? NAN : g;
            break;
        case 7: x[i] = (i % 2) ? -0.0f : 0.0f; break;
        case 8: x[i] = g; break;
        default: x[i] = (float)(i % 3) - 1.0f; break; /* many exact ties */
        }
    }
}

ParameterizedTestParameters(codec, messages_never_exceed_the_bound) { return tu_spec_params(); }
ParameterizedTest(size_t *i, codec, messages_never_exceed_the_bound) {
    for (int ef = 0; ef <= 1; ef++) {
        char spec[256];
        spec_variant(spec, sizeof spec, *i, ef);
        terse_codec *c;
        TU_CREATE_OR_RETURN(c, spec, TU_ROWS, TU_COLS);
        size_t n = terse_codec_elements(c), bound = terse_codec_bound(c);
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
        uint8_t *m = malloc(bound);
        for (int kind = 0; kind < 10; kind++) {
            hostile_input(x, n, kind);
            size_t len = 0;
            terse_status s = terse_encode(c, x, m, bound, &len);
            cr_assert_eq(s, TERSE_OK, "%s input kind %d: %s", spec, kind, terse_last_error());
            cr_assert_leq(len, bound, "%s input kind %d: %zu bytes > bound %zu", spec, kind, len,
                          bound);
            cr_assert_geq(len, 32);
            s = terse_decode(c, m, len, y, 1.0f, 0);
            cr_assert_eq(s, TERSE_OK, "%s input kind %d: its own message does not decode: %s", spec,
                         kind, terse_last_error());
        }
        /* A buffer one byte short of the bound is refused up front. */
        size_t len = 99;
        cr_expect_eq(terse_encode(c, x, m, bound - 1, &len), TERSE_ERR_DST_TOO_SMALL);
        cr_expect_eq(len, 0);
        free(x), free(y), free(m);
        terse_codec_free(c);
    }
}

/* ---- traits ---- */

ParameterizedTestParameters(codec, traits_tell_the_truth) { return tu_spec_params(); }
ParameterizedTest(size_t *i, codec, traits_tell_the_truth) {
    const char *spec = tu_specs[*i];
    terse_codec *c;
    TU_CREATE_OR_RETURN(c, spec, TU_ROWS, TU_COLS);
    terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
    cr_assert_eq(terse_codec_get_traits(c, &t), TERSE_OK);
    size_t n = terse_codec_elements(c);
    double bound_bits = 8.0 * (double)(terse_codec_bound(c) - 32) / (double)n;
    cr_expect_eq(strncmp(spec, t.name, strlen(t.name)), 0, "%s: traits name '%s'", spec, t.name);
    cr_expect_eq(t.error_feedback, 0);
    cr_expect(t.bits_per_element > 0 && isfinite(t.bits_per_element), "%s: %g bits per element",
              spec, t.bits_per_element);
    cr_expect_leq(t.bits_per_element, 1.1 * bound_bits,
                  "%s: nominal %g bits per element, but the bound allows only %g", spec,
                  t.bits_per_element, bound_bits);
    /* The message carries the id the traits report. */
    float *x = malloc(n * sizeof *x);
    size_t lens[4];
    for (int k = 0; k < 4; k++) {
        if (k < 2)
            step_input(x, n, (uint64_t)k);
        else
            hostile_input(x, n, k == 2 ? 0 : 3);
        uint8_t *m;
        lens[k] = tu_encode(c, x, &m);
        terse_wire_info info;
        cr_assert_eq(terse_wire_inspect(m, lens[k], &info), TERSE_OK);
        cr_expect_eq(info.codec_id, t.id, "%s: message id %u, traits id %u", spec, info.codec_id,
                     t.id);
        free(m);
    }
    /* A codec whose message size does not depend on the input must send
     * about what it advertises. */
    if (lens[0] == lens[1] && lens[1] == lens[2] && lens[2] == lens[3]) {
        double actual = 8.0 * (double)(lens[0] - 32) / (double)n;
        cr_expect(fabs(actual - t.bits_per_element) <= 0.1 * t.bits_per_element,
                  "%s: advertises %g bits per element, sends %g", spec, t.bits_per_element, actual);
    }
    /* randomized <=> accepts seed=. */
    char seeded[256];
    tu_spec_with(seeded, sizeof seeded, spec, "seed=3");
    terse_codec *s = NULL;
    terse_status st = terse_codec_create(seeded, TU_ROWS, TU_COLS, &s);
    cr_expect_eq(st, t.randomized ? TERSE_OK : TERSE_ERR_INVALID,
                 "%s: randomized=%d but seed= gave %s", spec, t.randomized, terse_status_name(st));
    terse_codec_free(s);
    /* ef shows in the traits; a too-small traits struct is refused. */
    char efs[256];
    tu_spec_with(efs, sizeof efs, spec, "ef=1");
    terse_codec *e = tu_create(efs, TU_ROWS, TU_COLS);
    terse_codec_traits te = TERSE_CODEC_TRAITS_INIT;
    cr_assert_eq(terse_codec_get_traits(e, &te), TERSE_OK);
    cr_expect_eq(te.error_feedback, 1);
    cr_expect_eq(te.id, t.id);
    te.size = offsetof(terse_codec_traits, bits_per_element);
    cr_expect_eq(terse_codec_get_traits(e, &te), TERSE_ERR_INVALID);
    terse_codec_free(e);
    free(x);
    terse_codec_free(c);
}

/* The canonical spec names every option, so it recreates the same codec. */
ParameterizedTestParameters(codec, canonical_spec_recreates_an_identical_codec) {
    return tu_spec_params();
}
ParameterizedTest(size_t *i, codec, canonical_spec_recreates_an_identical_codec) {
    terse_codec *a, *b = NULL;
    TU_CREATE_OR_RETURN(a, tu_specs[*i], TU_ROWS, TU_COLS);
    const char *canon = terse_codec_spec(a);
    cr_assert_eq(terse_codec_create(canon, TU_ROWS, TU_COLS, &b), TERSE_OK,
                 "%s: canonical spec '%s' does not parse: %s", tu_specs[*i], canon,
                 terse_last_error());
    cr_expect_str_eq(terse_codec_spec(b), canon);
    cr_expect_eq(terse_codec_bound(a), terse_codec_bound(b));
    size_t n = terse_codec_elements(a);
    float *x = malloc(n * sizeof *x);
    for (uint64_t t = 0; t < 2; t++) {
        step_input(x, n, t);
        uint8_t *ma, *mb;
        size_t la = tu_encode(a, x, &ma), lb = tu_encode(b, x, &mb);
        cr_expect(la == lb && memcmp(ma, mb, la) == 0, "%s: '%s' encodes differently", tu_specs[*i],
                  canon);
        free(ma), free(mb);
    }
    free(x);
    terse_codec_free(a), terse_codec_free(b);
}
