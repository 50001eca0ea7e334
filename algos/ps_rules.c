/* The server's two tables: aggregators (how the pushes of a step combine)
 * and update rules (what the aggregate does to the value the server
 * holds). The robust aggregators of DESIGN.md (median, trimmed mean,
 * Krum, ...) join the first table; the server loop does not change. */
#include <string.h>

#include "algos/ps.h"

/* Mean in worker-rank order: the same inputs give the same bits whatever
 * order they arrived in. */
static terse_status mean(const float *const *in, size_t k, size_t n, float *out) {
    const float w = 1.0f / (float)k;
    for (size_t i = 0; i < n; i++) out[i] = in[0][i] * w;
    for (size_t j = 1; j < k; j++) {
        const float *x = in[j];
        for (size_t i = 0; i < n; i++) out[i] += x[i] * w;
    }
    return TERSE_OK;
}

static const terse__ps_aggregator aggregators[] = {{"mean", mean}};

const terse__ps_aggregator *terse__ps_find_aggregator(const char *name) {
    if (!name || !*name) name = "mean";
    for (size_t i = 0; i < sizeof aggregators / sizeof *aggregators; i++)
        if (strcmp(aggregators[i].name, name) == 0) return &aggregators[i];
    return NULL;
}

/* none: the value is the (weighted) aggregate itself. */
static void rule_none(const terse_ps_config *cfg, float *x, float *mom, const float *g, size_t n,
                      float w) {
    (void)cfg, (void)mom;
    for (size_t i = 0; i < n; i++) x[i] = g[i] * w;
}

/* sgd: v = momentum * v + w * g; x -= lr * v. */
static void rule_sgd(const terse_ps_config *cfg, float *x, float *mom, const float *g, size_t n,
                     float w) {
    const float lr = cfg->lr, mu = cfg->momentum;
    if (mu == 0.0f) {
        for (size_t i = 0; i < n; i++) x[i] -= lr * (w * g[i]);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        mom[i] = mu * mom[i] + w * g[i];
        x[i] -= lr * mom[i];
    }
}

static const terse__ps_update_rule rules[] = {{"none", rule_none}, {"sgd", rule_sgd}};

const terse__ps_update_rule *terse__ps_rule(terse_ps_update u) {
    return (unsigned)u < sizeof rules / sizeof *rules ? &rules[u] : NULL;
}
