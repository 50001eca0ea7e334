/* Coordinate-wise aggregators: each output element depends only on the
 * same element of the k pushes, so sharding a key over servers changes
 * nothing.
 *
 *   mean          sum in worker-rank order, each term weighted 1/k
 *   median        the middle value (k even: the mean of the two middle)
 *   trimmed_mean  drop the b largest and b smallest, average the rest
 *                 (Yin et al., ICML 2018); with fewer than 2b+1 pushes
 *                 in a step (a worker lost), b shrinks to (k-1)/2
 *   signvote      the sign of the sum of the pushes' signs, 0 on a tie
 *                 (signSGD with majority vote, Bernstein et al., ICLR
 *                 2019): every output is -1, 0 or +1, so the server's
 *                 learning rate sets the step
 *
 * median and trimmed_mean sort each coordinate's k values (insertion
 * sort: k is the worker count) and sum what they keep in ascending order
 * in double, so ties and the order pushes arrived in cannot change a bit. */
#include <stdlib.h>

#include "algos/ps/ps.h"
#include "common/error.h"

terse_status terse__ps_agg_mean(const terse__ps_agg_params *p, const float *const *in, size_t k,
                                size_t n, float *out, float *center) {
    (void)p, (void)center;
    const float w = 1.0f / (float)k;
    for (size_t i = 0; i < n; i++) out[i] = in[0][i] * w;
    for (size_t j = 1; j < k; j++) {
        const float *x = in[j];
        for (size_t i = 0; i < n; i++) out[i] += x[i] * w;
    }
    return TERSE_OK;
}

void terse__ps_agg_weighted_mean(const float *const *in, const float *wt, size_t k, size_t n,
                                 float *out) {
    double total = 0;
    for (size_t j = 0; j < k; j++) total += wt[j];
    for (size_t i = 0; i < n; i++) {
        double acc = 0;
        for (size_t j = 0; j < k; j++) acc += (double)wt[j] * in[j][i];
        out[i] = (float)(acc / total);
    }
}

static void sort_floats(float *v, size_t k) {
    for (size_t a = 1; a < k; a++) {
        float x = v[a];
        size_t b = a;
        for (; b > 0 && v[b - 1] > x; b--) v[b] = v[b - 1];
        v[b] = x;
    }
}

/* out[i] = the mean of the sorted values [lo, k - lo) of coordinate i. */
static terse_status middle_mean(const float *const *in, size_t k, size_t n, size_t lo,
                                float *out) {
    float stack[64];
    float *v = k <= 64 ? stack : malloc(k * sizeof *v);
    if (!v) return TERSE_ERROR(TERSE_ERR_NOMEM, "aggregating %zu pushes: no memory", k);
    const size_t hi = k - lo;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < k; j++) v[j] = in[j][i];
        sort_floats(v, k);
        double s = 0;
        for (size_t j = lo; j < hi; j++) s += v[j];
        out[i] = (float)(s / (double)(hi - lo));
    }
    if (v != stack) free(v);
    return TERSE_OK;
}

terse_status terse__ps_agg_median(const terse__ps_agg_params *p, const float *const *in, size_t k,
                                  size_t n, float *out, float *center) {
    (void)p, (void)center;
    return middle_mean(in, k, n, (k - 1) / 2, out);
}

terse_status terse__ps_agg_trimmed_mean(const terse__ps_agg_params *p, const float *const *in,
                                        size_t k, size_t n, float *out, float *center) {
    (void)center;
    size_t b = (size_t)p->b;
    if (2 * b + 1 > k) b = (k - 1) / 2;
    return middle_mean(in, k, n, b, out);
}

terse_status terse__ps_agg_signvote(const terse__ps_agg_params *p, const float *const *in,
                                    size_t k, size_t n, float *out, float *center) {
    (void)p, (void)center;
    for (size_t i = 0; i < n; i++) {
        long votes = 0;
        for (size_t j = 0; j < k; j++) votes += (in[j][i] > 0.0f) - (in[j][i] < 0.0f);
        out[i] = (float)((votes > 0) - (votes < 0));
    }
    return TERSE_OK;
}
