/* Exact top-k selection by magnitude in O(n), for the topk codec.
 *
 * Order: an element's key is its fp32 bit pattern with the sign cleared, as
 * a uint32. Keys order finite magnitudes exactly as |x| does, put +-Inf
 * above every finite value and NaN above Inf (NaNs among themselves by
 * payload); -0 and +0 tie. Equal keys go to the lower index. */
#ifndef TERSE_COMPRESS_TOPK_SELECT_H
#define TERSE_COMPRESS_TOPK_SELECT_H

#include <stddef.h>
#include <stdint.h>

/* Scratch for one selection over n elements, allocated once (in create). */
typedef struct terse_topk_scratch {
    float *cand;      /* cand_cap + 1 floats: the candidate bucket */
    size_t cand_cap;  /* bucket sizes above this re-scan x instead */
    uint32_t *sub;    /* 4 * TERSE_TOPK_SUB_STRIDE sub-histogram counters */
    uint64_t *hist;   /* TERSE_TOPK_MAX_BINS merged counters */
} terse_topk_scratch;

#define TERSE_TOPK_MAX_BINS 2048u
#define TERSE_TOPK_SUB_STRIDE (TERSE_TOPK_MAX_BINS + 16u)

/* The key of the k-th largest element (*threshold) and how many of the
 * elements whose key equals it are kept, lowest index first (*take_equal,
 * >= 1). Every element with a larger key is kept. 1 <= k <= n. */
void terse__topk_threshold(const float *x, size_t n, size_t k, terse_topk_scratch *s,
                           uint32_t *threshold, size_t *take_equal);

/* Write the kept indices (increasing) to idx and their values to val,
 * given the threshold; returns how many were kept (k). idx and val hold
 * k + 1 entries: the loop stores before it knows whether to keep. */
size_t terse__topk_gather(const float *x, size_t n, uint32_t threshold, size_t take_equal,
                          uint64_t *idx, float *val);

#endif
