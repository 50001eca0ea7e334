/* terse-bench train's arithmetic that the tests check on its own (train.h):
 * the learning-rate schedule, and the t quantile behind the sweep's paired
 * intervals. No terse API; part of terse_train. */
#include <math.h>

#include "train/train.h"

double train_lr_at(const train_options *o, long k, long total) {
    if (o->schedule == TRAIN_SCHED_NONE || total <= 0) return o->lr;
    long warm = (long)(o->warmup * (double)total);
    if (k < warm) return o->lr * (double)(k + 1) / (double)warm;
    if (o->schedule == TRAIN_SCHED_COSINE) {
        double t = (double)(k - warm) / (double)(total - warm);
        return o->lr * 0.5 * (1.0 + cos(M_PI * t));
    }
    double lr = o->lr;
    for (int i = 0; i < o->n_milestones; i++)
        if ((double)k >= o->milestones[i] * (double)total) lr *= 0.1;
    return lr;
}

double train_t975(int df) {
    /* Tabulated to 30 degrees of freedom (three decimals, as printed tables
     * give them), then the Cornish-Fisher expansion in 1/df to second order,
     * whose error there is under 1e-3 and falls with df. */
    static const double table[30] = {
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
        2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
    if (df < 1) return NAN;
    if (df <= 30) return table[df - 1];
    double z = 1.959964, d = (double)df;
    return z + (z * z * z + z) / (4 * d) + (5 * pow(z, 5) + 16 * z * z * z + 3 * z) / (96 * d * d);
}

void train_paired(const double *diff, int n, double *mean, double *sd, double *half_width) {
    double sum = 0, sq = 0;
    for (int i = 0; i < n; i++) sum += diff[i];
    *mean = n > 0 ? sum / n : NAN;
    for (int i = 0; i < n; i++) sq += (diff[i] - *mean) * (diff[i] - *mean);
    *sd = n > 1 ? sqrt(sq / (n - 1)) : NAN;
    *half_width = n > 1 ? train_t975(n - 1) * *sd / sqrt((double)n) : NAN;
}
