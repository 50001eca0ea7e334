#include "compress/sparse_k.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"

/* The ratio goes back into the canonical spec, which a user (or another
 * rank) parses again: it must read back to the very same double, or the
 * two codecs could disagree on k. */
static void print_shortest(char *buf, size_t cap, double r) {
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(buf, cap, "ratio=%.*g", digits, r);
        if (strtod(buf + 6, NULL) == r) return;
    }
}

terse_status terse__sparse_k_parse(terse_spec *spec, const char *codec, size_t n, size_t *k,
                                   char *canon, size_t cap) {
    if (terse_spec_has(spec, "ratio") && terse_spec_has(spec, "k"))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "codec '%s' takes either 'ratio' or 'k', not both; drop one of them",
                           codec);
    if (terse_spec_has(spec, "k")) {
        uint64_t kk;
        TERSE_CHECK(terse_spec_get_u64(spec, "k", 1, 1, (uint64_t)n, &kk));
        *k = (size_t)kk;
        snprintf(canon, cap, "k=%llu", (unsigned long long)kk);
        return TERSE_OK;
    }
    double r;
    TERSE_CHECK(terse_spec_get_double(spec, "ratio", TERSE_SPARSE_DEFAULT_RATIO, 0.0, 1.0, &r));
    if (!(r > 0.0))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "option 'ratio=%g' of codec '%s' keeps nothing; ratio must be in (0, 1]",
                           r, codec);
    /* r * n <= n <= 2^36 is exact enough in a double and converts safely. */
    double kr = round(r * (double)n);
    size_t kk = kr < 1.0 ? 1 : (size_t)kr;
    *k = kk > n ? n : kk;
    print_shortest(canon, cap, r);
    return TERSE_OK;
}
