/* The one parser of terse's environment variables. Values are parsed
 * strictly: a malformed value, a value out of range or an unknown suffix
 * fails with TERSE_ERR_INVALID and a sentence naming the variable, its value
 * and what it accepts -- a typo is never silently replaced by the default.
 * Unset or empty means the default. Callers read variables when a
 * communicator (or fabric) is created and keep the values in that object:
 * no process-wide caches. */
#ifndef TERSE_COMMON_ENV_H
#define TERSE_COMMON_ENV_H

#include <stddef.h>

#include "terse.h"

/* A byte count: digits with an optional suffix k, m, g (powers of 1024;
 * either case, optionally followed by "b" or "ib": 64k, 1M, 2GiB), within
 * [min, max]. */
terse_status terse__env_bytes(const char *var, size_t dflt, size_t min, size_t max, size_t *out);

/* Parse s (not from the environment) as terse__env_bytes does; var names
 * it in the sentence. */
terse_status terse__parse_bytes(const char *var, const char *s, size_t min, size_t max,
                                size_t *out);

/* One of the NULL-terminated names in choices; *out is its index. */
terse_status terse__env_choice(const char *var, const char *const *choices, int dflt, int *out);

#endif
