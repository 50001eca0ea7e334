/* How many coordinates a sparse codec (topk, randk) keeps: the shared
 * "ratio=r | k=K" option pair. */
#ifndef TERSE_COMPRESS_SPARSE_K_H
#define TERSE_COMPRESS_SPARSE_K_H

#include <stddef.h>

#include "terse_plugin.h"

/* The ratio used when neither ratio= nor k= is given. */
#define TERSE_SPARSE_DEFAULT_RATIO 0.01

/*
 * Read ratio= or k= from spec for a tensor of n elements (n >= 1) and set
 * *k: max(1, round(r * n)) for r in (0, 1], or K for K in [1, n]. Neither
 * means ratio=0.01; both is TERSE_ERR_INVALID. The canonical option text
 * ("ratio=0.01" or "k=5", the ratio printed in the fewest digits that read
 * back to the same double) is written to canon (cap bytes).
 */
terse_status terse__sparse_k_parse(terse_spec *spec, const char *codec, size_t n, size_t *k,
                                   char *canon, size_t cap);

#endif
