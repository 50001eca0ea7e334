/* Centered clipping (Karimireddy, He and Jaggi, "Learning from History
 * for Byzantine Robust Optimization", ICML 2021). Starting from the last
 * step's aggregate v (zero at the first step), each of L iterations moves
 * v by the mean of the pushes' differences from it, each difference
 * clipped to length tau:
 *
 *   v <- v + (1/k) sum_i (x_i - v) min(1, tau / ||x_i - v||)
 *
 * A Byzantine push moves v by at most tau / k whatever it holds, and with
 * worker momentum the honest pushes stay close to v, so they pass
 * unclipped. Norms are taken in double, sums in worker-rank order in
 * double: the same pushes give the same bits. The paper's settings: one
 * iteration, tau chosen for the model (here 10 by default).
 *
 * On a key split over several servers each server clips its own part
 * (norms per shard): a sharded server cannot see the whole vector without
 * another round trip (docs/ps.md). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "algos/ps/ps.h"
#include "common/error.h"

terse_status terse__ps_agg_cclip(const terse__ps_agg_params *p, const float *const *in, size_t k,
                                 size_t n, float *out, float *center) {
    double *scale = malloc(k * sizeof *scale);
    if (!scale || !center) {
        free(scale);
        return TERSE_ERROR(TERSE_ERR_NOMEM, "centered clipping over %zu pushes: no memory", k);
    }
    for (int it = 0; it < p->iters; it++) {
        for (size_t j = 0; j < k; j++) {
            double s = 0;
            for (size_t e = 0; e < n; e++) {
                double t = (double)in[j][e] - (double)center[e];
                s += t * t;
            }
            double norm = sqrt(s);
            scale[j] = norm > p->tau ? p->tau / norm : 1.0;
        }
        for (size_t e = 0; e < n; e++) {
            double v = center[e], s = 0;
            for (size_t j = 0; j < k; j++) s += ((double)in[j][e] - v) * scale[j];
            out[e] = (float)(v + s / (double)k);
        }
        memcpy(center, out, n * sizeof *out);
    }
    free(scale);
    return TERSE_OK;
}
