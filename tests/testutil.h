/* Helpers shared by the tests: deterministic inputs and norms. */
#ifndef TERSE_TESTUTIL_H
#define TERSE_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include <criterion/parameterized.h>

#include "terse.h"

/* n gaussian-ish floats (sum of uniforms), deterministic in seed. */
void tu_fill_gauss(float *x, size_t n, uint64_t seed);
/* n uniform floats in [lo, hi). */
void tu_fill_uniform(float *x, size_t n, uint64_t seed, float lo, float hi);
double tu_norm2(const float *x, size_t n);
/* ||a - b|| / ||a|| (0 if both are zero). */
double tu_rel_err(const float *a, const float *b, size_t n);
/* Encode x with codec c into a fresh malloc'd buffer (*msg) and return its
 * length; aborts the test on failure. */
size_t tu_encode(terse_codec *c, const float *x, uint8_t **msg);
/* Creating a codec from `spec` (for 100 elements) fails with
 * TERSE_ERR_INVALID, leaves the out pointer NULL, and terse_last_error()
 * contains `token`. */
void tu_expect_bad_spec(const char *spec, const char *token);

/* For each {spec, canonical} pair: a codec of n elements made from spec has
 * exactly that canonical spec (terse_codec_spec). */
void tu_expect_canonical_specs(const char *const (*cases)[2], size_t count, size_t n);
/* The built-in codec specs the generic tests iterate over. Every built-in
 * codec appears at least once (test_codec_props checks it). */
extern const char *const tu_specs[];
extern const size_t tu_nspecs;

/* The shape the generic tests use: non-square (so PowerSGD's P and Q differ
 * in size), 3737 elements, a multiple of no bucket size or block dimension. */
#define TU_ROWS 37u
#define TU_COLS 101u

/* Create spec for rows x cols. A codec that is still a stub (creation
 * returns TERSE_ERR_UNSUPPORTED) gives NULL and a warning on stderr, and
 * the caller returns: the test passes without checking anything, and
 * Test(registry, every_builtin_codec_is_implemented) fails instead, so a
 * stub cannot hide. (Neither cr_skip_test nor cr_log_warn: with either,
 * Criterion 2.4.1 exits nonzero although every test passed.) Any other
 * failure fails the test. */
terse_codec *tu_create_or_skip(const char *spec, size_t rows, size_t cols);
/* Create, failing the test on any error (for a codec already known to
 * exist, e.g. a second instance). */
terse_codec *tu_create(const char *spec, size_t rows, size_t cols);
#define TU_CREATE_OR_RETURN(c, spec, rows, cols)          \
    do {                                                 \
        (c) = tu_create_or_skip((spec), (rows), (cols)); \
        if (!(c)) return;                                \
    } while (0)
/* spec with one more option: ("int8:bucket=8", "ef=1") -> "int8:bucket=8,ef=1",
 * ("fp16", "ef=1") -> "fp16:ef=1". */
void tu_spec_with(char *buf, size_t cap, const char *spec, const char *opt);
/* Criterion parameters: the indices 0..tu_nspecs-1 (size_t), for
 * ParameterizedTest(size_t *i, ...) over every spec. */
struct criterion_test_params tu_spec_params(void);

#endif
