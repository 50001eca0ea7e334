/* The server's update rules: what the aggregate does to the value the
 * server holds; the rate schedule; and the corrections for stale pushes
 * (terse.h, Stale pushes). (The aggregators, how the pushes of a step
 * combine, are in ps_aggregate.c.) */
#include <math.h>
#include <string.h>

#include "algos/ps/ps.h"
#include "common/error.h"

/* none: the value is the (weighted) aggregate itself. */
static void rule_none(float lr, float mu, float *x, float *mom, const float *g, size_t n, float w) {
    (void)lr, (void)mu, (void)mom;
    for (size_t i = 0; i < n; i++) x[i] = g[i] * w;
}

/* sgd: v = mu * v + w * g; x -= lr * v. */
static void rule_sgd(float lr, float mu, float *x, float *mom, const float *g, size_t n, float w) {
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

float terse__ps_lr_at(const terse_ps_config *c, uint64_t k) {
    if (c->lr_schedule != TERSE_PS_LR_COSINE) return c->lr;
    const uint64_t T = c->lr_steps, U = c->lr_warmup;
    if (k >= T) return 0.0f;
    if (k < U) return (float)((double)c->lr * (double)(k + 1) / (double)U);
    const double t = (double)(k - U) / (double)(T - U);
    return (float)((double)c->lr * 0.5 * (1.0 + cos(3.14159265358979323846 * t)));
}

void terse__ps_dc_compensate(float *g, const float *x, const float *kept, size_t n, float lambda) {
    for (size_t i = 0; i < n; i++) g[i] += lambda * g[i] * g[i] * (x[i] - kept[i]);
}

void terse__ps_dana_apply(float lr, float mu, float *x, float *v, float *vsum, const float *g,
                          size_t n, float w) {
    for (size_t i = 0; i < n; i++) {
        const float old = v[i];
        v[i] = mu * old + w * g[i];
        vsum[i] += v[i] - old;
        x[i] -= lr * v[i];
    }
}

void terse__ps_dana_ahead(float *out, const float *x, const float *vsum, size_t n, float lr_mu) {
    for (size_t i = 0; i < n; i++) out[i] = x[i] - lr_mu * vsum[i];
}

terse_status terse__ps_parse_stale_rule(const char *spec, const char *v, int *out) {
    static const struct {
        const char *name;
        int flag;
    } words[] = {{"plain", TERSE_PS_STALE_PLAIN},
                 {"step", TERSE_PS_STALE_STEP},
                 {"dc", TERSE_PS_STALE_DC},
                 {"amom", TERSE_PS_STALE_AMOM},
                 {"dana", TERSE_PS_STALE_DANA}};
    int r = 0;
    const char *p = v;
    for (;;) {
        size_t len = strcspn(p, "+");
        int flag = 0;
        for (size_t i = 0; i < sizeof words / sizeof *words; i++)
            if (len == strlen(words[i].name) && strncmp(p, words[i].name, len) == 0)
                flag = words[i].flag;
        if (!flag)
            return TERSE_ERROR(TERSE_ERR_INVALID,
                               "parameter-server mode \"%s\": update \"%.*s\" is not a rule for "
                               "stale pushes (plain, step, dc, amom, joined with +; or dana)",
                               spec, (int)len, p);
        r |= flag;
        if (!p[len]) break;
        p += len + 1;
    }
    *out = r;
    return TERSE_OK;
}
