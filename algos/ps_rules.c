/* The server's update rules: what the aggregate does to the value the
 * server holds. (The aggregators, how the pushes of a step combine, are
 * in ps_aggregate.c.) */
#include <string.h>

#include "algos/ps.h"

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
