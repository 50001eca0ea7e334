/* Krum and Multi-Krum (Blanchard, El Mhamdi, Guerraoui and Stainer,
 * NeurIPS 2017), for k pushes of which at most f are Byzantine:
 *
 *   1. d(i, j) = ||x_i - x_j||^2 for every pair (double, element order).
 *   2. score(i) = the sum of the k - f - 2 smallest d(i, j), j != i: how
 *      tightly x_i sits among its nearest honest-sized neighbourhood.
 *   3. Krum (m = 1) returns the push of lowest score, bit for bit;
 *      Multi-Krum averages the m lowest-scored pushes (in worker-rank
 *      order, in double). Equal scores go to the lower worker rank.
 *
 * The guarantee needs k >= 2f + 3 (terse_ps_create refuses less). When a
 * step has fewer pushes (a worker lost, a push left out), f shrinks to
 * what the step can bear, (k - 3) / 2, and m to k - f.
 *
 * On a key split over several servers each server scores its own part:
 * Krum then picks per shard, which is what a sharded parameter server can
 * do without another round trip (docs/ps.md). Cost: O(k^2 n). */
#include <stdlib.h>
#include <string.h>

#include "algos/ps/ps.h"
#include "common/error.h"

static void pair_distances(const float *const *in, size_t k, size_t n, double *d) {
    for (size_t i = 0; i < k; i++) {
        d[i * k + i] = 0;
        for (size_t j = i + 1; j < k; j++) {
            double s = 0;
            for (size_t e = 0; e < n; e++) {
                double t = (double)in[i][e] - (double)in[j][e];
                s += t * t;
            }
            d[i * k + j] = d[j * k + i] = s;
        }
    }
}

/* The sum of the nb smallest of row i (without d(i, i)). */
static double score_of(const double *d, size_t k, size_t i, size_t nb, double *row) {
    size_t m = 0;
    for (size_t j = 0; j < k; j++)
        if (j != i) row[m++] = d[i * k + j];
    for (size_t a = 1; a < m; a++) { /* insertion sort: k is the worker count */
        double x = row[a];
        size_t b = a;
        for (; b > 0 && row[b - 1] > x; b--) row[b] = row[b - 1];
        row[b] = x;
    }
    double s = 0;
    for (size_t j = 0; j < nb && j < m; j++) s += row[j];
    return s;
}

terse_status terse__ps_agg_krum(const terse__ps_agg_params *p, const float *const *in, size_t k,
                                size_t n, float *out, float *center) {
    (void)center;
    size_t f = (size_t)p->f;
    if (k < 2 * f + 3) f = k >= 3 ? (k - 3) / 2 : 0;
    size_t nb = k >= f + 2 ? k - f - 2 : 0;
    if (nb == 0 && k > 1) nb = 1;
    size_t m = (size_t)p->m;
    if (m > k - f) m = k - f;

    if (k > (size_t)1 << 16) /* k is the worker count: k * k doubles stay small */
        return TERSE_ERROR(TERSE_ERR_UNSUPPORTED, "krum over %zu pushes (at most 65536)", k);
    double *d = malloc(k * k * sizeof *d), *row = malloc(k * sizeof *row),
           *score = malloc(k * sizeof *score);
    unsigned char *chosen = calloc(k, 1);
    terse_status st = TERSE_OK;
    if (!d || !row || !score || !chosen) {
        st = TERSE_ERROR(TERSE_ERR_NOMEM, "krum over %zu pushes: no memory", k);
        goto done;
    }
    pair_distances(in, k, n, d);
    for (size_t i = 0; i < k; i++) score[i] = score_of(d, k, i, nb, row);
    for (size_t pick = 0; pick < m; pick++) {
        size_t best = k;
        for (size_t i = 0; i < k; i++)
            if (!chosen[i] && (best == k || score[i] < score[best])) best = i;
        chosen[best] = 1;
    }
    if (m == 1) {
        for (size_t i = 0; i < k; i++)
            if (chosen[i]) memcpy(out, in[i], n * sizeof *out);
        goto done;
    }
    for (size_t e = 0; e < n; e++) {
        double s = 0;
        for (size_t i = 0; i < k; i++)
            if (chosen[i]) s += in[i][e];
        out[e] = (float)(s / (double)m);
    }
done:
    free(d), free(row), free(score), free(chosen);
    return st;
}
