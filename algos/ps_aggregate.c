/* The server's aggregator table: how the pushes of a sync step combine,
 * and the spec a user names one with ("median", "trimmed_mean:b=2",
 * "krum:f=2,m=3", "cclip:tau=10,iters=3", "signvote"). The aggregators
 * live one family per file: coordinate-wise (ps_coordwise.c), Krum
 * (ps_krum.c), centered clipping (ps_cclip.c). Each states what it needs
 * of the worker count and refuses a configuration that cannot hold. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algos/ps.h"
#include "common/error.h"

static terse_status need_any(const terse__ps_agg_params *p, int workers) {
    (void)p, (void)workers;
    return TERSE_OK;
}

static terse_status need_trim(const terse__ps_agg_params *p, int workers) {
    if (workers >= 2 * p->b + 1) return TERSE_OK;
    return TERSE_ERROR(TERSE_ERR_INVALID,
                       "aggregator trimmed_mean:b=%d drops the %d largest and %d smallest values "
                       "of every coordinate, so it needs at least 2b+1 = %d workers; the job has "
                       "%d",
                       p->b, p->b, p->b, 2 * p->b + 1, workers);
}

static terse_status need_krum(const terse__ps_agg_params *p, int workers) {
    if (workers < 2 * p->f + 3)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "aggregator krum:f=%d tolerates f Byzantine workers only with n >= "
                           "2f+3 = %d workers (Blanchard et al. 2017); the job has %d",
                           p->f, 2 * p->f + 3, workers);
    if (p->m > workers - p->f)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "aggregator krum:f=%d,m=%d averages the m best-scored pushes, and m "
                           "must be at most n - f = %d (%d workers)",
                           p->f, p->m, workers - p->f, workers);
    return TERSE_OK;
}

static const terse__ps_aggregator table[] = {
    {"mean", "", terse__ps_agg_mean, need_any, 0},
    {"median", "", terse__ps_agg_median, need_any, 0},
    {"trimmed_mean", "b", terse__ps_agg_trimmed_mean, need_trim, 0},
    {"krum", "f, m", terse__ps_agg_krum, need_krum, 0},
    {"cclip", "tau, iters", terse__ps_agg_cclip, need_any, 1},
    {"signvote", "", terse__ps_agg_signvote, need_any, 0},
};

static terse_status parse_int(const char *spec, const char *tok, const char *v, int lo, int hi,
                              int *out) {
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "aggregator \"%s\": %s=%s is not an integer in %d..%d", spec, tok, v,
                           lo, hi);
    *out = (int)x;
    return TERSE_OK;
}

static terse_status parse_option(const char *spec, const char *name, const char *tok,
                                 const char *v, terse__ps_agg_params *p) {
    if (!strcmp(name, "trimmed_mean") && !strcmp(tok, "b"))
        return parse_int(spec, tok, v, 0, 1 << 20, &p->b);
    if (!strcmp(name, "krum") && !strcmp(tok, "f")) return parse_int(spec, tok, v, 0, 1 << 20, &p->f);
    if (!strcmp(name, "krum") && !strcmp(tok, "m")) return parse_int(spec, tok, v, 1, 1 << 20, &p->m);
    if (!strcmp(name, "cclip") && !strcmp(tok, "iters"))
        return parse_int(spec, tok, v, 1, 100, &p->iters);
    if (!strcmp(name, "cclip") && !strcmp(tok, "tau")) {
        char *end = NULL;
        errno = 0;
        double x = strtod(v, &end);
        if (!*v || *end || errno || !(x > 0.0) || !(x <= 3.0e38))
            return TERSE_ERROR(TERSE_ERR_INVALID,
                               "aggregator \"%s\": tau=%s is not a positive finite number", spec,
                               v);
        p->tau = x;
        return TERSE_OK;
    }
    const terse__ps_aggregator *a = terse__ps_find_aggregator_name(name);
    return TERSE_ERROR(TERSE_ERR_INVALID, "aggregator \"%s\": unknown option \"%s\" for %s (%s%s)",
                       spec, tok, name, *a->options ? "options: " : "it takes none",
                       a->options);
}

const terse__ps_aggregator *terse__ps_find_aggregator_name(const char *name) {
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (!strcmp(table[i].name, name)) return &table[i];
    return NULL;
}

terse_status terse__ps_parse_aggregator(const char *spec, const terse__ps_aggregator **agg,
                                        terse__ps_agg_params *p) {
    if (!spec || !*spec) spec = "mean";
    char buf[TERSE__PS_AGG_SPEC_MAX];
    if (strlen(spec) >= sizeof buf)
        return TERSE_ERROR(TERSE_ERR_INVALID, "aggregator spec of %zu characters (at most %d)",
                           strlen(spec), TERSE__PS_AGG_SPEC_MAX - 1);
    memcpy(buf, spec, strlen(spec) + 1);
    terse__ps_agg_params q = {.b = 1, .f = 1, .m = 1, .tau = 10.0, .iters = 1};
    char *opts = strchr(buf, ':');
    if (opts) *opts++ = '\0';
    const terse__ps_aggregator *a = terse__ps_find_aggregator_name(buf);
    if (!a)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "unknown aggregator \"%s\" (mean, median, trimmed_mean:b=B, "
                           "krum:f=F[,m=M], cclip:tau=T[,iters=L], signvote)",
                           buf);
    while (opts && *opts) {
        char *next = strchr(opts, ',');
        if (next) *next++ = '\0';
        char *eq = strchr(opts, '=');
        if (!eq)
            return TERSE_ERROR(TERSE_ERR_INVALID, "aggregator \"%s\": \"%s\" is not name=value",
                               spec, opts);
        *eq = '\0';
        TERSE_CHECK(parse_option(spec, buf, opts, eq + 1, &q));
        opts = next;
    }
    *agg = a;
    *p = q;
    return TERSE_OK;
}

const terse__ps_aggregator *terse__ps_find_aggregator(const char *spec) {
    const terse__ps_aggregator *a = NULL;
    terse__ps_agg_params p;
    return terse__ps_parse_aggregator(spec, &a, &p) == TERSE_OK ? a : NULL;
}

/* A push with a NaN or an infinity never reaches an aggregate: the
 * server leaves it out of its step (ps_server.c). First such index, or n. */
size_t terse__ps_first_nonfinite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return i;
    return n;
}

terse_status terse_ps_aggregator_check(const char *spec, int workers) {
    const terse__ps_aggregator *a = NULL;
    terse__ps_agg_params p;
    TERSE_CHECK(terse__ps_parse_aggregator(spec, &a, &p));
    if (workers < 1)
        return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_aggregator_check: %d workers", workers);
    return a->check(&p, workers);
}
