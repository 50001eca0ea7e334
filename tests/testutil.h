/* Helpers shared by the tests: deterministic inputs and norms. */
#ifndef TERSE_TESTUTIL_H
#define TERSE_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

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
/* The built-in codec specs the generic tests iterate over. */
extern const char *const tu_specs[];
extern const size_t tu_nspecs;

#endif
