#include "common/env.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/error.h"

/* The suffix at s: its shift (0, 10, 20, 30) or -1 if it is not one. */
static int suffix_shift(const char *s) {
    static const char *const units = "kmg";
    if (*s == '\0') return 0;
    const char *u = strchr(units, s[0] | 0x20);
    if (!u || s[0] == '\0') return -1;
    const char *rest = s + 1;
    if (*rest == '\0' || strcasecmp(rest, "b") == 0 || strcasecmp(rest, "ib") == 0)
        return 10 * (int)(u - units + 1);
    return -1;
}

terse_status terse__parse_bytes(const char *var, const char *s, size_t min, size_t max,
                                size_t *out) {
    const char *p = s;
    if (*p < '0' || *p > '9')
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "%s='%.40s' is not a byte count (digits with an optional k, m or g "
                           "suffix, e.g. 65536 or 64k)",
                           var, s);
    errno = 0;
    char *end;
    unsigned long long v = strtoull(p, &end, 10);
    int shift = suffix_shift(end);
    if (errno || shift < 0)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "%s='%.40s' is not a byte count (digits with an optional k, m or g "
                           "suffix, e.g. 65536 or 64k)",
                           var, s);
    if (v > (SIZE_MAX >> shift) || ((size_t)v << shift) < min || ((size_t)v << shift) > max)
        return TERSE_ERROR(TERSE_ERR_INVALID, "%s='%.40s' is outside [%zu, %zu] bytes", var, s,
                           min, max);
    *out = (size_t)v << shift;
    return TERSE_OK;
}

terse_status terse__env_bytes(const char *var, size_t dflt, size_t min, size_t max,
                              size_t *out) {
    const char *s = getenv(var);
    *out = dflt;
    if (!s || !*s) return TERSE_OK;
    return terse__parse_bytes(var, s, min, max, out);
}

terse_status terse__env_choice(const char *var, const char *const *choices, int dflt, int *out) {
    const char *s = getenv(var);
    *out = dflt;
    if (!s || !*s) return TERSE_OK;
    char list[160] = "";
    for (int i = 0; choices[i]; i++) {
        if (strcmp(s, choices[i]) == 0) {
            *out = i;
            return TERSE_OK;
        }
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : "", choices[i]);
    }
    return TERSE_ERROR(TERSE_ERR_INVALID, "%s='%.40s' is not one of: %s", var, s, list);
}
