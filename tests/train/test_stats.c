/* terse-bench train's arithmetic (bench/train/train_stats.c): the learning-rate
 * schedules at their corners, the t quantile against published values, and
 * the paired interval against a hand computation. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "train/train.h"

static train_options opts(train_schedule s, double warmup) {
    train_options o;
    memset(&o, 0, sizeof o);
    o.lr = 0.1;
    o.schedule = s;
    o.warmup = warmup;
    return o;
}

Test(schedule, none_is_constant) {
    train_options o = opts(TRAIN_SCHED_NONE, 0.05);
    for (long k = 0; k < 1000; k += 37) cr_expect_eq(train_lr_at(&o, k, 1000), 0.1);
}

Test(schedule, cosine_warms_up_peaks_and_decays_to_zero) {
    train_options o = opts(TRAIN_SCHED_COSINE, 0.05);
    /* 1000 steps: 50 of warm-up, ramping (k+1)/50. */
    cr_expect_float_eq(train_lr_at(&o, 0, 1000), 0.1 / 50, 1e-15);
    cr_expect_float_eq(train_lr_at(&o, 24, 1000), 0.1 * 25 / 50, 1e-15);
    cr_expect_float_eq(train_lr_at(&o, 49, 1000), 0.1, 1e-15);
    cr_expect_float_eq(train_lr_at(&o, 50, 1000), 0.1, 1e-15); /* the peak */
    /* Halfway through the decay: half the peak; the last step: nearly 0. */
    cr_expect_float_eq(train_lr_at(&o, 50 + 475, 1000), 0.05, 1e-12);
    double last = train_lr_at(&o, 999, 1000);
    cr_expect(last > 0 && last < 1e-5, "last step's lr %g", last);
    /* Monotone after the peak. */
    for (long k = 51; k < 1000; k++)
        cr_expect(train_lr_at(&o, k, 1000) <= train_lr_at(&o, k - 1, 1000), "step %ld", k);
    /* Without warm-up the first step is the peak. */
    o.warmup = 0;
    cr_expect_float_eq(train_lr_at(&o, 0, 1000), 0.1, 1e-15);
}

Test(schedule, step_divides_by_ten_at_each_milestone) {
    train_options o = opts(TRAIN_SCHED_STEP, 0.0);
    o.milestones[0] = 0.5;
    o.milestones[1] = 0.75;
    o.n_milestones = 2;
    cr_expect_float_eq(train_lr_at(&o, 499, 1000), 0.1, 1e-15);
    cr_expect_float_eq(train_lr_at(&o, 500, 1000), 0.01, 1e-15);
    cr_expect_float_eq(train_lr_at(&o, 749, 1000), 0.01, 1e-15);
    cr_expect_float_eq(train_lr_at(&o, 750, 1000), 0.001, 1e-15);
    cr_expect_float_eq(train_lr_at(&o, 999, 1000), 0.001, 1e-15);
}

Test(schedule, step_warms_up_first_and_short_runs_have_no_warm_up) {
    train_options o = opts(TRAIN_SCHED_STEP, 0.1);
    o.milestones[0] = 0.5;
    o.n_milestones = 1;
    /* 100 steps: 10 of warm-up, then 0.1 until step 50, then 0.01. */
    cr_expect_float_eq(train_lr_at(&o, 0, 100), 0.01, 1e-15);
    cr_expect_float_eq(train_lr_at(&o, 9, 100), 0.1, 1e-15);
    cr_expect_float_eq(train_lr_at(&o, 49, 100), 0.1, 1e-15);
    cr_expect_float_eq(train_lr_at(&o, 50, 100), 0.01, 1e-15);
    /* A warm-up under one step (0.1 x 5 steps) rounds to none: step 0 runs
     * at the peak instead of dividing by zero. */
    o.schedule = TRAIN_SCHED_COSINE;
    cr_expect_float_eq(train_lr_at(&o, 0, 5), 0.1, 1e-15);
    for (long k = 0; k < 5; k++) cr_expect(isfinite(train_lr_at(&o, k, 5)), "step %ld", k);
}

Test(t_quantile, matches_published_values) {
    /* From printed tables (two-sided 95%). */
    static const struct {
        int df;
        double t;
    } known[] = {{1, 12.706}, {2, 4.303}, {5, 2.571}, {6, 2.447}, {10, 2.228},
                 {30, 2.042}, {40, 2.021}, {60, 2.000}, {120, 1.980}, {1000, 1.962}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        cr_expect(fabs(train_t975(known[i].df) - known[i].t) < 1.5e-3, "df %d: %g, expected %g",
                  known[i].df, train_t975(known[i].df), known[i].t);
    cr_expect(isnan(train_t975(0)));
    /* Decreasing towards the normal quantile. */
    for (int df = 2; df < 500; df++) cr_expect(train_t975(df) < train_t975(df - 1), "df %d", df);
    cr_expect(train_t975(100000) > 1.95996 && train_t975(100000) < 1.96001);
}

Test(paired, interval_by_hand) {
    /* Differences 0.1, -0.2, 0.3, 0.0: mean 0.05. */
    const double d[] = {0.1, -0.2, 0.3, 0.0};
    double mean, sd, hw;
    train_paired(d, 4, &mean, &sd, &hw);
    cr_expect_float_eq(mean, 0.05, 1e-15);
    /* Squared deviations: 0.0025 + 0.0625 + 0.0625 + 0.0025 = 0.13; var 0.13/3. */
    double want = 3.182 * sqrt(0.13 / 3.0 / 4.0);
    cr_expect_float_eq(hw, want, 1e-12, "half-width %g, expected %g", hw, want);
    train_paired(d, 1, &mean, &sd, &hw);
    cr_expect_float_eq(mean, 0.1, 1e-15);
    cr_expect(isnan(hw));
    train_paired(d, 0, &mean, &sd, &hw);
    cr_expect(isnan(mean) && isnan(hw));
}
