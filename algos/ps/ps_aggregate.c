/* The server's aggregator table: how the pushes of a sync step combine,
 * and the spec a user names one with ("median", "trimmed_mean:b=2",
 * "krum:f=2,m=3", "cclip:tau=10,iters=3", "signvote"). The aggregators
 * live one family per file: coordinate-wise (ps_coordwise.c), Krum
 * (ps_krum.c), centered clipping (ps_cclip.c). Each states what it needs
 * of the worker count and refuses a configuration that cannot hold. Users
 * add their own through terse_ps_register_aggregator (terse_plugin.h):
 * those entries call the plugin's table through the two trampolines
 * below, with the spec's options as text. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algos/ps/ps.h"
#include "common/error.h"
#include "common/names.h"
#include "terse_plugin.h"

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

/* Plugins: entries are only ever added, so a pointer to one stays valid. */
#define MAX_PLUGINS 32
static pthread_mutex_t plugins_lock = PTHREAD_MUTEX_INITIALIZER;
static terse_ps_aggregator_ops plugin_ops[MAX_PLUGINS];
static terse__ps_aggregator plugin_entry[MAX_PLUGINS];
static size_t nplugins;

static terse_status plugin_aggregate(const terse__ps_agg_params *p, const float *const *in,
                                     size_t k, size_t n, float *out, float *center) {
    const terse_ps_aggregator_ops *o = p->plugin;
    terse_status st = o->aggregate(p->options, in, k, n, out, center, o->user);
    if (st != TERSE_OK)
        return TERSE_ERROR(st, "aggregator %s failed over %zu pushes of %zu floats: %s", o->name, k,
                           n, terse_last_error());
    return TERSE_OK;
}

static terse_status plugin_check(const terse__ps_agg_params *p, int workers) {
    const terse_ps_aggregator_ops *o = p->plugin;
    if (o->check) return o->check(p->options, workers, o->user);
    if (p->options[0])
        return TERSE_ERROR(TERSE_ERR_INVALID, "aggregator %s takes no options (\"%s\" given)",
                           o->name, p->options);
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
    return terse__ps_parse_int("aggregator", spec, tok, v, lo, hi, out);
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

static const terse__ps_aggregator *builtin_named(const char *name) {
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (!strcmp(table[i].name, name)) return &table[i];
    return NULL;
}

/* plugins_lock held */
static const terse__ps_aggregator *plugin_named(const char *name) {
    for (size_t i = 0; i < nplugins; i++)
        if (!strcmp(plugin_entry[i].name, name)) return &plugin_entry[i];
    return NULL;
}

const terse__ps_aggregator *terse__ps_find_aggregator_name(const char *name) {
    const terse__ps_aggregator *found = builtin_named(name);
    if (found) return found;
    pthread_mutex_lock(&plugins_lock);
    found = plugin_named(name);
    pthread_mutex_unlock(&plugins_lock);
    return found;
}

terse_status terse_ps_register_aggregator(const terse_ps_aggregator_ops *ops) {
    const size_t v1 = offsetof(terse_ps_aggregator_ops, user) + sizeof(void *);
    if (!ops || ops->size < v1)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_register_aggregator: %s (initialise the table with "
                           "TERSE_PS_AGGREGATOR_OPS_INIT)",
                           ops ? "the table is smaller than the first version's" : "NULL table");
    if (!ops->name || !terse__plugin_name_ok(ops->name))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_register_aggregator: name \"%s\" is not 1..31 of [a-z0-9_]",
                           ops->name ? ops->name : "(null)");
    if (!ops->aggregate)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_register_aggregator: %s has no aggregate function", ops->name);
    terse_status st = TERSE_OK;
    pthread_mutex_lock(&plugins_lock);
    if (builtin_named(ops->name) || plugin_named(ops->name)) {
        st = TERSE_ERROR(TERSE_ERR_EXISTS, "terse_ps_register_aggregator: an aggregator named "
                                           "\"%s\" exists already", ops->name);
    } else if (nplugins == MAX_PLUGINS) {
        st = TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_register_aggregator: %d plugins registered "
                                          "already (the most a process may)", MAX_PLUGINS);
    } else {
        terse_ps_aggregator_ops *o = &plugin_ops[nplugins];
        memcpy(o, ops, v1); /* fields a newer header appends are not known here */
        o->size = sizeof *o;
        plugin_entry[nplugins] = (terse__ps_aggregator){o->name, "(the plugin's)", plugin_aggregate,
                                                        plugin_check, o->needs_center != 0};
        nplugins++;
    }
    pthread_mutex_unlock(&plugins_lock);
    return st;
}

/* The table entry a parsed spec uses, with the plugin's ops if any. */
static const terse_ps_aggregator_ops *ops_of(const terse__ps_aggregator *a) {
    if (a < plugin_entry || a >= plugin_entry + MAX_PLUGINS) return NULL;
    return &plugin_ops[a - plugin_entry];
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
                           "krum:f=F[,m=M], cclip:tau=T[,iters=L], signvote, or one registered "
                           "with terse_ps_register_aggregator)",
                           buf);
    if ((q.plugin = ops_of(a)) != NULL) { /* the plugin reads its options itself */
        snprintf(q.options, sizeof q.options, "%s", opts ? opts : "");
        *agg = a;
        *p = q;
        return TERSE_OK;
    }
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
