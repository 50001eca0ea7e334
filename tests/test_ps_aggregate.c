/* The parameter server's aggregators against reference implementations
 * written here in float64 from the papers' definitions, on random and
 * crafted inputs (ties, outliers, a Byzantine cluster), and their specs:
 * every bad option named, every configuration that cannot hold refused.
 * The server-side behaviour (a NaN push left out, a robust aggregator
 * over real workers) is in test_ps_robust.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "algos/ps/ps.h"
#include "terse_plugin.h"

#define MAXK 16
#define MAXN 64

static const terse__ps_aggregator *agg(const char *spec, terse__ps_agg_params *p) {
    const terse__ps_aggregator *a = NULL;
    cr_assert_eq(terse__ps_parse_aggregator(spec, &a, p), TERSE_OK, "%s: %s", spec,
                 terse_last_error());
    return a;
}

static void run(const char *spec, float in[][MAXN], size_t k, size_t n, float *out,
                float *center) {
    terse__ps_agg_params p;
    const terse__ps_aggregator *a = agg(spec, &p);
    const float *ptr[MAXK];
    for (size_t j = 0; j < k; j++) ptr[j] = in[j];
    cr_assert_eq(a->aggregate(&p, ptr, k, n, out, a->needs_center ? center : NULL), TERSE_OK,
                 "%s", terse_last_error());
}

static unsigned long long lcg = 12345;
static float rnd(void) {
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(lcg >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Reference: mean of sorted values [lo, k - lo) of coordinate i. */
static double ref_middle(float in[][MAXN], size_t k, size_t i, size_t lo) {
    double v[MAXK];
    for (size_t j = 0; j < k; j++) v[j] = in[j][i];
    qsort(v, k, sizeof v[0], cmp_d);
    double s = 0;
    for (size_t j = lo; j < k - lo; j++) s += v[j];
    return s / (double)(k - 2 * lo);
}

Test(ps_aggregate, median_and_trimmed_mean_match_the_reference_for_odd_and_even_counts) {
    float in[MAXK][MAXN], out[MAXN];
    for (size_t k = 1; k <= 9; k++) {
        for (size_t j = 0; j < k; j++)
            for (size_t i = 0; i < MAXN; i++) in[j][i] = rnd();
        run("median", in, k, MAXN, out, NULL);
        for (size_t i = 0; i < MAXN; i++)
            cr_assert_float_eq(out[i], ref_middle(in, k, i, (k - 1) / 2), 1e-6, "k %zu i %zu", k,
                               i);
        if (k >= 5) {
            run("trimmed_mean:b=2", in, k, MAXN, out, NULL);
            for (size_t i = 0; i < MAXN; i++)
                cr_assert_float_eq(out[i], ref_middle(in, k, i, 2), 1e-6, "k %zu i %zu", k, i);
        }
    }
}

Test(ps_aggregate, median_with_ties_and_outliers_keeps_the_honest_value) {
    /* five pushes: three agree exactly, two are huge; median must be the
     * agreed value bit for bit, and trimmed_mean:b=2 too */
    float in[MAXK][MAXN], out[MAXN];
    for (size_t i = 0; i < 8; i++) {
        in[0][i] = in[2][i] = in[4][i] = 0.25f * (float)i;
        in[1][i] = 3e38f;
        in[3][i] = 1e38f;
    }
    run("median", in, 5, 8, out, NULL);
    for (size_t i = 0; i < 8; i++) cr_assert_eq(out[i], 0.25f * (float)i);
    run("trimmed_mean:b=2", in, 5, 8, out, NULL);
    for (size_t i = 0; i < 8; i++) cr_assert_eq(out[i], 0.25f * (float)i);
    /* the mean is carried off: the attack is real */
    run("mean", in, 5, 8, out, NULL);
    cr_assert(fabsf(out[1] - 0.25f) > 1.0f, "mean %g", (double)out[1]);
}

Test(ps_aggregate, trimmed_mean_shrinks_b_when_a_step_has_too_few_pushes) {
    float in[MAXK][MAXN] = {{1}, {2}, {30}}, out[MAXN];
    run("trimmed_mean:b=3", in, 3, 1, out, NULL); /* b -> 1: the middle one */
    cr_assert_eq(out[0], 2.0f);
}

/* Reference Krum: scores in float64, lowest score (lowest index on ties). */
static void ref_krum(float in[][MAXN], size_t k, size_t n, size_t f, size_t m, double *out) {
    double score[MAXK];
    for (size_t i = 0; i < k; i++) {
        double d[MAXK];
        size_t c = 0;
        for (size_t j = 0; j < k; j++) {
            if (j == i) continue;
            double s = 0;
            for (size_t e = 0; e < n; e++) s += ((double)in[i][e] - in[j][e]) * ((double)in[i][e] - in[j][e]);
            d[c++] = s;
        }
        qsort(d, c, sizeof d[0], cmp_d);
        score[i] = 0;
        for (size_t j = 0; j < k - f - 2; j++) score[i] += d[j];
    }
    int used[MAXK] = {0};
    for (size_t e = 0; e < n; e++) out[e] = 0;
    for (size_t t = 0; t < m; t++) {
        size_t b = k;
        for (size_t i = 0; i < k; i++)
            if (!used[i] && (b == k || score[i] < score[b])) b = i;
        used[b] = 1;
    }
    for (size_t e = 0; e < n; e++) {
        for (size_t i = 0; i < k; i++)
            if (used[i]) out[e] += in[i][e];
        out[e] /= (double)m;
    }
}

Test(ps_aggregate, krum_and_multikrum_match_the_reference) {
    float in[MAXK][MAXN], out[MAXN];
    double ref[MAXN];
    for (int trial = 0; trial < 20; trial++) {
        size_t k = 7 + (size_t)trial % 5, n = 1 + (size_t)trial * 3;
        for (size_t j = 0; j < k; j++)
            for (size_t i = 0; i < n; i++) in[j][i] = rnd() * (j < 2 ? 5.0f : 1.0f);
        run("krum:f=2", in, k, n, out, NULL);
        ref_krum(in, k, n, 2, 1, ref);
        for (size_t i = 0; i < n; i++) cr_assert_eq((double)out[i], ref[i], "trial %d", trial);
        run("krum:f=2,m=3", in, k, n, out, NULL);
        ref_krum(in, k, n, 2, 3, ref);
        for (size_t i = 0; i < n; i++) cr_assert_float_eq(out[i], ref[i], 1e-6, "trial %d", trial);
    }
}

Test(ps_aggregate, krum_rejects_a_byzantine_cluster_and_breaks_ties_by_rank) {
    /* 7 pushes, f = 2: five honest near (1, 1, ...), two colluding at 50 */
    float in[MAXK][MAXN], out[MAXN];
    for (size_t j = 0; j < 7; j++)
        for (size_t i = 0; i < 4; i++) in[j][i] = j >= 5 ? 50.0f : 1.0f + 0.01f * (float)j;
    run("krum:f=2", in, 7, 4, out, NULL);
    cr_assert(out[0] < 1.1f, "krum chose %g", (double)out[0]);
    /* identical pushes: equal scores, the lowest rank wins, bit for bit */
    for (size_t j = 0; j < 5; j++)
        for (size_t i = 0; i < 4; i++) in[j][i] = j == 0 ? -0.0f : 0.0f;
    run("krum:f=1", in, 5, 4, out, NULL);
    cr_assert(signbit(out[0]), "not the lowest rank's push");
}

Test(ps_aggregate, cclip_matches_the_reference_and_bounds_an_outlier) {
    float in[MAXK][MAXN], out[MAXN], center[MAXN];
    const size_t k = 6, n = 32;
    for (size_t j = 0; j < k; j++)
        for (size_t i = 0; i < n; i++) in[j][i] = rnd() + (j == 5 ? 1e6f : 0.0f);
    double v[MAXN];
    for (size_t i = 0; i < n; i++) v[i] = center[i] = 0.5f;
    for (int it = 0; it < 3; it++) { /* reference: three iterations, tau 2 */
        double sc[MAXK], nv[MAXN];
        for (size_t j = 0; j < k; j++) {
            double s = 0;
            for (size_t i = 0; i < n; i++) s += (in[j][i] - v[i]) * (in[j][i] - v[i]);
            sc[j] = sqrt(s) > 2.0 ? 2.0 / sqrt(s) : 1.0;
        }
        for (size_t i = 0; i < n; i++) {
            nv[i] = v[i];
            for (size_t j = 0; j < k; j++) nv[i] += (in[j][i] - v[i]) * sc[j] / (double)k;
        }
        for (size_t i = 0; i < n; i++) v[i] = (float)nv[i];
    }
    run("cclip:tau=2,iters=3", in, k, n, out, center);
    double moved = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert_float_eq(out[i], v[i], 1e-5, "element %zu", i);
        cr_assert_eq(center[i], out[i], "the center is the new aggregate");
        moved += (out[i] - 0.5) * (out[i] - 0.5);
    }
    /* each iteration moves at most tau: the 1e6 outlier cannot drag it */
    cr_assert(sqrt(moved) <= 3 * 2.0 + 1e-4, "moved %g", sqrt(moved));
    /* a radius larger than every distance is the plain mean */
    for (size_t i = 0; i < n; i++) center[i] = 0;
    run("cclip:tau=1e30", in, k, n, out, center);
    for (size_t i = 0; i < n; i++) {
        double m = 0;
        for (size_t j = 0; j < k; j++) m += in[j][i];
        cr_assert_float_eq(out[i], m / (double)k, 1e-1, "element %zu", i);
    }
}

Test(ps_aggregate, signvote_is_the_majority_sign_and_zero_on_a_tie) {
    float in[MAXK][MAXN] = {{1, -2, 0, 5}, {3, -1, 0, -5}, {-7, 4, 0, 0}, {2, -3, 1, 0}}, out[MAXN];
    run("signvote", in, 4, 4, out, NULL);
    cr_assert_eq(out[0], 1.0f);  /* + + - + */
    cr_assert_eq(out[1], -1.0f); /* - - + - */
    cr_assert_eq(out[2], 1.0f);  /* 0 0 0 + */
    cr_assert_eq(out[3], 0.0f);  /* + - 0 0: a tie */
}

Test(ps_aggregate, aggregates_do_not_depend_on_anything_but_the_inputs) {
    /* the same inputs twice give the same bits (determinism contract) */
    static const char *const specs[] = {"mean", "median", "trimmed_mean:b=1", "krum:f=1,m=2",
                                        "cclip:tau=0.5,iters=2", "signvote"};
    float in[MAXK][MAXN], a[MAXN], b[MAXN], ca[MAXN] = {0}, cb[MAXN] = {0};
    for (size_t j = 0; j < 6; j++)
        for (size_t i = 0; i < MAXN; i++) in[j][i] = rnd();
    for (size_t s = 0; s < sizeof specs / sizeof *specs; s++) {
        run(specs[s], in, 6, MAXN, a, ca);
        run(specs[s], in, 6, MAXN, b, cb);
        cr_assert(!memcmp(a, b, sizeof a), "%s", specs[s]);
    }
}

static void bad_spec(const char *spec, const char *says) {
    const terse__ps_aggregator *a = NULL;
    terse__ps_agg_params p;
    cr_expect_eq(terse__ps_parse_aggregator(spec, &a, &p), TERSE_ERR_INVALID, "%s", spec);
    cr_expect(strstr(terse_last_error(), says), "%s: %s", spec, terse_last_error());
}

Test(ps_aggregate, bad_specs_are_refused_naming_the_token) {
    bad_spec("medain", "unknown aggregator \"medain\"");
    bad_spec("trimmed_mean:b=x", "b=x is not an integer");
    bad_spec("trimmed_mean:b=-1", "b=-1");
    bad_spec("krum:f=1,q=2", "unknown option \"q\" for krum (options: f, m)");
    bad_spec("krum:m=0", "m=0");
    bad_spec("median:b=1", "it takes none");
    bad_spec("cclip:tau=0", "tau=0 is not a positive finite number");
    bad_spec("cclip:tau=nan", "tau=nan");
    bad_spec("cclip:tau=inf", "tau=inf");
    bad_spec("cclip:iters=101", "iters=101");
    bad_spec("krum:f", "\"f\" is not name=value");
    bad_spec("cclip:tau=1,iters=2,tau=3,iters=4,tau=5,iters=6,tau=7,iters=8,tau=9", "at most");
}

static void cannot_hold(const char *spec, int workers, const char *says) {
    terse__ps_agg_params p;
    const terse__ps_aggregator *a = agg(spec, &p);
    cr_expect_eq(a->check(&p, workers), TERSE_ERR_INVALID, "%s with %d workers", spec, workers);
    cr_expect(strstr(terse_last_error(), says), "%s: %s", spec, terse_last_error());
}

Test(ps_aggregate, configurations_that_cannot_hold_are_refused) {
    cannot_hold("krum:f=1", 4, "n >= 2f+3 = 5");
    cannot_hold("krum:f=2", 6, "n >= 2f+3 = 7");
    cannot_hold("krum:f=1,m=5", 5, "at most n - f = 4");
    cannot_hold("trimmed_mean:b=2", 4, "at least 2b+1 = 5 workers");
    terse__ps_agg_params p;
    cr_expect_eq(agg("krum:f=1", &p)->check(&p, 5), TERSE_OK);
    cr_expect_eq(agg("trimmed_mean:b=2", &p)->check(&p, 5), TERSE_OK);
    cr_expect_eq(agg("median", &p)->check(&p, 1), TERSE_OK);
}

Test(ps_aggregate, nonfinite_values_are_found) {
    float x[5] = {1, 2, 3, 4, 5};
    cr_expect_eq(terse__ps_first_nonfinite(x, 5), 5);
    x[3] = NAN;
    cr_expect_eq(terse__ps_first_nonfinite(x, 5), 3);
    x[1] = -INFINITY;
    cr_expect_eq(terse__ps_first_nonfinite(x, 5), 1);
}

/* ---------------------------------------------------------------- plugins */

/* A plugin: the coordinate-wise maximum times "scale=S" (default 1). */
static int calls;
static terse_status max_check(const char *options, int workers, void *user) {
    (void)user;
    if (*options && strncmp(options, "scale=", 6) != 0)
        return terse_plugin_error(TERSE_ERR_INVALID, "maxof: unknown option \"%s\"", options);
    if (workers < 2) return terse_plugin_error(TERSE_ERR_INVALID, "maxof needs 2 workers");
    return TERSE_OK;
}
static terse_status max_aggregate(const char *options, const float *const *in, size_t k,
                                  size_t n, float *out, float *center, void *user) {
    float scale = *options ? strtof(options + 6, NULL) : 1.0f;
    calls += center == NULL && user == (void *)&calls;
    for (size_t i = 0; i < n; i++) {
        out[i] = in[0][i];
        for (size_t j = 1; j < k; j++) out[i] = fmaxf(out[i], in[j][i]);
        out[i] *= scale;
    }
    return TERSE_OK;
}

Test(ps_aggregate, a_registered_aggregator_is_named_like_a_builtin) {
    terse_ps_aggregator_ops ops = TERSE_PS_AGGREGATOR_OPS_INIT;
    ops.name = "maxof";
    ops.check = max_check;
    ops.aggregate = max_aggregate;
    ops.user = &calls;
    cr_assert_eq(terse_ps_register_aggregator(&ops), TERSE_OK, "%s", terse_last_error());
    cr_expect_eq(terse_ps_register_aggregator(&ops), TERSE_ERR_EXISTS);
    ops.name = "median";
    cr_expect_eq(terse_ps_register_aggregator(&ops), TERSE_ERR_EXISTS);
    ops.name = "Bad-Name";
    cr_expect_eq(terse_ps_register_aggregator(&ops), TERSE_ERR_INVALID);
    ops.name = "noagg";
    ops.aggregate = NULL;
    cr_expect_eq(terse_ps_register_aggregator(&ops), TERSE_ERR_INVALID);
    ops.aggregate = max_aggregate;
    ops.size = 8;
    cr_expect_eq(terse_ps_register_aggregator(&ops), TERSE_ERR_INVALID);

    cr_expect_eq(terse_ps_aggregator_check("maxof:scale=2", 3), TERSE_OK, "%s",
                 terse_last_error());
    cr_expect_eq(terse_ps_aggregator_check("maxof:bogus=1", 3), TERSE_ERR_INVALID);
    cr_expect(strstr(terse_last_error(), "unknown option \"bogus=1\""), "%s", terse_last_error());
    cr_expect_eq(terse_ps_aggregator_check("maxof", 1), TERSE_ERR_INVALID);
    float in[MAXK][MAXN] = {{1, -5, 2}, {3, -7, -1}}, out[MAXN];
    run("maxof:scale=2", in, 2, 3, out, NULL);
    cr_expect_eq(out[0], 6.0f);
    cr_expect_eq(out[1], -10.0f);
    cr_expect_eq(out[2], 4.0f);
    cr_expect_eq(calls, 1, "the plugin saw its user pointer and no center");
}
