/* The parameter server's life cycle: config, create (every rank checks
 * the others' config through the store), declare (placement, codecs),
 * stats, free. The exchanges live in ps_worker.c and ps_server.c. */
#include <errno.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "algos/engine/engine.h"
#include "algos/ps/ps.h"
#include "common/bytes.h"
#include "common/crc32c.h"
#include "common/env.h"
#include "common/error.h"

/* ---------------------------------------------------------------- config */

/* An integer option of a spec, in lo..hi; what names the spec's kind. */
terse_status terse__ps_parse_int(const char *what, const char *spec, const char *tok,
                                 const char *v, int lo, int hi, int *out) {
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi) {
        if (tok == v) /* a bare value, as in ssp:S */
            return TERSE_ERROR(TERSE_ERR_INVALID, "%s \"%s\": \"%s\" is not an integer in %d..%d",
                               what, spec, v, lo, hi);
        return TERSE_ERROR(TERSE_ERR_INVALID, "%s \"%s\": %s=%s is not an integer in %d..%d", what,
                           spec, tok, v, lo, hi);
    }
    *out = (int)x;
    return TERSE_OK;
}

static terse_status parse_int(const char *spec, const char *tok, const char *v, int lo, int *out) {
    return terse__ps_parse_int("parameter-server mode", spec, tok, v, lo, 1 << 30, out);
}

/* A config of this library's size: a caller built with 0.4's header (its
 * config ends at colocate) gets the defaults of the fields appended since. */
#define CONFIG_SIZE_04 (offsetof(terse_ps_config, colocate) + sizeof(int))
static terse_status widen_config(const char *who, const terse_ps_config *in, terse_ps_config *out) {
    if (in->size < CONFIG_SIZE_04)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "%s: config size %zu is smaller than this library's terse_ps_config "
                           "(%zu): initialise it with TERSE_PS_CONFIG_INIT",
                           who, in->size, sizeof *out);
    const terse_ps_config init = TERSE_PS_CONFIG_INIT;
    *out = init;
    memcpy(out, in, in->size < sizeof *out ? in->size : sizeof *out);
    out->size = sizeof *out;
    return TERSE_OK;
}

terse_status terse_ps_config_parse(const char *spec, terse_ps_config *cfg) {
    if (!spec || !cfg) return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_config_parse: NULL argument");
    char buf[256];
    if (strlen(spec) >= sizeof buf)
        return TERSE_ERROR(TERSE_ERR_INVALID, "parameter-server mode spec is too long");
    snprintf(buf, sizeof buf, "%s", spec);
    terse_ps_config c;
    TERSE_CHECK(widen_config("terse_ps_config_parse", cfg, &c));
    const size_t size = cfg->size < sizeof c ? cfg->size : sizeof c;
    char *opts = strchr(buf, ':');
    if (opts) *opts++ = 0;
    c.quorum = c.staleness = c.max_staleness = c.lr_scale = c.deadline_ms = 0;
    c.stale_rule = 0;
    c.dc_lambda = 0.0f;
    c.replicas = 1; /* colocate is kept unless the spec says colocate=0|1 */
    if (strcmp(buf, "sync") == 0) c.mode = TERSE_PS_SYNC;
    else if (strcmp(buf, "async") == 0) c.mode = TERSE_PS_ASYNC;
    else if (strcmp(buf, "ssp") == 0) c.mode = TERSE_PS_SSP;
    else
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "parameter-server mode \"%s\": unknown mode \"%s\" (sync, async, ssp)",
                           spec, buf);
    if (c.mode == TERSE_PS_SSP) {
        if (!opts)
            return TERSE_ERROR(TERSE_ERR_INVALID,
                               "parameter-server mode \"%s\": ssp needs its bound, e.g. ssp:2",
                               spec);
        char *rest = strchr(opts, ',');
        if (rest) *rest++ = 0;
        TERSE_CHECK(parse_int(spec, opts, opts, 0, &c.staleness));
        opts = rest;
    }
    char *save = NULL;
    for (char *tok = opts ? strtok_r(opts, ",", &save) : NULL; tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq)
            return TERSE_ERROR(TERSE_ERR_INVALID,
                               "parameter-server mode \"%s\": \"%s\" is not name=value", spec, tok);
        *eq = 0;
        const char *v = eq + 1;
        if (strcmp(tok, "colocate") == 0) {
            TERSE_CHECK(terse__ps_parse_int("parameter-server mode", spec, tok, v, 0, 1,
                                            &c.colocate));
        } else if (c.mode == TERSE_PS_SYNC && strcmp(tok, "quorum") == 0) {
            TERSE_CHECK(parse_int(spec, tok, v, 1, &c.quorum));
        } else if (c.mode == TERSE_PS_SYNC && strcmp(tok, "deadline_ms") == 0) {
            TERSE_CHECK(parse_int(spec, tok, v, 1, &c.deadline_ms));
        } else if (c.mode == TERSE_PS_SYNC && strcmp(tok, "replicas") == 0) {
            TERSE_CHECK(terse__ps_parse_int("parameter-server mode", spec, tok, v, 1, 2,
                                            &c.replicas));
        } else if (c.mode == TERSE_PS_ASYNC && strcmp(tok, "max_staleness") == 0) {
            TERSE_CHECK(parse_int(spec, tok, v, 0, &c.max_staleness));
        } else if (c.mode == TERSE_PS_ASYNC && strcmp(tok, "lr_scale") == 0) {
            TERSE_CHECK(parse_int(spec, tok, v, 0, &c.lr_scale));
            if (c.lr_scale > 1)
                return TERSE_ERROR(TERSE_ERR_INVALID,
                                   "parameter-server mode \"%s\": lr_scale is 0 or 1", spec);
        } else if (c.mode != TERSE_PS_SYNC && strcmp(tok, "update") == 0) {
            TERSE_CHECK(terse__ps_parse_stale_rule(spec, v, &c.stale_rule));
        } else if (c.mode != TERSE_PS_SYNC && strcmp(tok, "lambda") == 0) {
            char *end = NULL;
            double x = strtod(v, &end);
            if (!*v || *end || !(x >= 0.0 && x <= 1e6))
                return TERSE_ERROR(TERSE_ERR_INVALID,
                                   "parameter-server mode \"%s\": lambda=%s is not a number in "
                                   "0..1e6",
                                   spec, v);
            c.dc_lambda = (float)x;
        } else {
            return TERSE_ERROR(TERSE_ERR_INVALID,
                               "parameter-server mode \"%s\": unknown option \"%s\" for %s (sync: "
                               "quorum, deadline_ms, replicas; async: max_staleness, lr_scale, "
                               "update, lambda; ssp:S,update=R,lambda=L; any mode: colocate)",
                               spec, tok, buf);
        }
    }
    if (size < sizeof c && (c.stale_rule || c.dc_lambda != 0.0f))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "parameter-server mode \"%s\": update and lambda need a config of "
                           "0.5 or later (this one is %zu bytes)",
                           spec, size);
    c.size = size;
    memcpy(cfg, &c, size);
    return TERSE_OK;
}

/* What every rank must agree on, as bytes for the store's allgather. */
#define AGREE_FIELDS 22
static void agree_bytes(const terse_ps_config *c, const char *agg, uint8_t *b) {
    uint64_t v[AGREE_FIELDS] = {(uint64_t)c->num_servers, c->chunk_bytes, (uint64_t)c->vnodes,
                                (uint64_t)c->mode, (uint64_t)c->quorum, (uint64_t)c->staleness,
                                (uint64_t)c->max_staleness, (uint64_t)c->lr_scale,
                                (uint64_t)c->update, 0, 0,
                                terse__crc32c_update(0, agg, strlen(agg)),
                                (uint64_t)c->deadline_ms, (uint64_t)(c->replicas ? c->replicas : 1),
                                c->partition_bytes, (uint64_t)c->window,
                                (uint64_t)c->colocate, (uint64_t)c->stale_rule, 0,
                                (uint64_t)c->lr_schedule, c->lr_steps, c->lr_warmup};
    uint32_t lr, mu, lambda;
    memcpy(&lr, &c->lr, 4);
    memcpy(&mu, &c->momentum, 4);
    memcpy(&lambda, &c->dc_lambda, 4);
    v[9] = lr;
    v[10] = mu;
    v[18] = lambda;
    for (int i = 0; i < AGREE_FIELDS; i++) terse__put_u64(b + 8 * i, v[i]);
}

static const char *const agree_names[AGREE_FIELDS] = {
    "num_servers", "chunk_bytes", "vnodes", "mode", "quorum", "staleness",
    "max_staleness", "lr_scale", "update", "lr", "momentum", "aggregator", "deadline_ms",
    "replicas", "partition_bytes (or TERSE_PS_PARTITION_BYTES)", "window (or TERSE_PS_WINDOW)",
    "colocate", "stale_rule", "dc_lambda", "lr_schedule", "lr_steps", "lr_warmup"};

/* The stale-push rule in force: the config's with lr_scale's step, or
 * without one "step" for lr_scale=1 and else the mode's default; 0 in sync
 * mode. */
static int stale_rule_of(const terse_ps_config *c) {
    if (c->mode == TERSE_PS_SYNC) return 0;
    if (c->stale_rule) return c->stale_rule | (c->lr_scale ? TERSE_PS_STALE_STEP : 0);
    return c->lr_scale ? TERSE_PS_STALE_STEP : TERSE_PS_STALE_DEFAULT_RULE;
}

/* The stale-push rule and the rate schedule (terse.h). */
static terse_status check_rules(const terse_ps_config *c) {
    const int all = TERSE_PS_STALE_PLAIN | TERSE_PS_STALE_STEP | TERSE_PS_STALE_DC |
                    TERSE_PS_STALE_AMOM | TERSE_PS_STALE_DANA;
    if (c->stale_rule & ~all)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_create: stale_rule 0x%x holds flags that are no rule "
                           "(TERSE_PS_STALE_PLAIN, _STEP, _DC, _AMOM, _DANA)",
                           (unsigned)c->stale_rule);
    if (c->stale_rule && c->mode == TERSE_PS_SYNC)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_create: a rule for stale pushes (stale_rule 0x%x) needs "
                           "async or ssp mode: sync mode has no stale pushes",
                           (unsigned)c->stale_rule);
    const int r = stale_rule_of(c);
    static const struct {
        int flag;
        const char *name;
    } alone[] = {{TERSE_PS_STALE_PLAIN, "\"plain\""},
                 {TERSE_PS_STALE_DANA, "\"dana\" (a momentum per worker)"}};
    for (size_t i = 0; i < sizeof alone / sizeof *alone; i++)
        if ((r & alone[i].flag) && r != alone[i].flag)
            return TERSE_ERROR(TERSE_ERR_INVALID,
                               "terse_ps_create: the stale-push rule %s combines with no other "
                               "(stale_rule 0x%x%s)",
                               alone[i].name, (unsigned)c->stale_rule,
                               c->lr_scale ? ", and lr_scale=1 is \"step\"" : "");
    if (!(c->dc_lambda >= 0.0f && c->dc_lambda <= 1e6f))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_create: dc_lambda %g must be a finite number in 0..1e6",
                           (double)c->dc_lambda);
    if (c->dc_lambda != 0.0f && !(r & TERSE_PS_STALE_DC))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_create: dc_lambda %g without the rule \"dc\" (delay "
                           "compensation) would do nothing",
                           (double)c->dc_lambda);
    if ((unsigned)c->lr_schedule > TERSE_PS_LR_COSINE)
        return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_create: unknown lr_schedule %d",
                           (int)c->lr_schedule);
    if (c->lr_schedule == TERSE_PS_LR_COSINE &&
        (c->update != TERSE_PS_UPDATE_SGD || c->lr_steps < 1 || c->lr_warmup >= c->lr_steps))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_create: the cosine schedule needs update sgd, lr_steps >= 1 "
                           "and lr_warmup < lr_steps (lr_steps %llu, lr_warmup %llu)",
                           (unsigned long long)c->lr_steps, (unsigned long long)c->lr_warmup);
    return TERSE_OK;
}

/* (c->size is checked by widen_config: c is this library's size) */
static terse_status check_config(int n, const terse_ps_config *c) {
    if (c->num_servers > TERSE__PS_MAX_SERVERS)
        return TERSE_ERROR(TERSE_ERR_UNSUPPORTED,
                           "terse_ps_create: %d servers; a request talks to at most %d at once",
                           c->num_servers, TERSE__PS_MAX_SERVERS);
    if (c->num_servers < 1 || c->num_servers >= n)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_create: num_servers %d, but a job of %d ranks needs 1 to %d "
                           "servers and at least one worker",
                           c->num_servers, n, n - 1);
    if (c->vnodes < 1 || c->vnodes > 4096)
        return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_create: vnodes %d is not 1..4096",
                           c->vnodes);
    if (c->chunk_bytes && (c->chunk_bytes < 64 || c->chunk_bytes > ((size_t)1 << 30)))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_create: chunk_bytes %zu is not 64 B .. 1 GiB", c->chunk_bytes);
    if (c->partition_bytes && (c->partition_bytes < 64 || c->partition_bytes > ((size_t)1 << 30)))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_create: partition_bytes %zu is not 64 B .. 1 GiB",
                           c->partition_bytes);
    if (c->window < 0 || c->window > TERSE__PS_MAX_LANES / 2)
        return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_create: window %d is not 1..%d (0: default)",
                           c->window, TERSE__PS_MAX_LANES / 2);
    if ((unsigned)c->mode > TERSE_PS_SSP || (unsigned)c->update > TERSE_PS_UPDATE_SGD)
        return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_create: unknown mode %d or update %d",
                           (int)c->mode, (int)c->update);
    int workers = n - c->num_servers;
    if (c->quorum < 0 || c->quorum > workers || (c->quorum && c->mode != TERSE_PS_SYNC))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_create: quorum %d needs sync mode and 1..%d (the workers)",
                           c->quorum, workers);
    if (c->deadline_ms < 0 || (c->deadline_ms && c->mode != TERSE_PS_SYNC))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_create: deadline_ms %d needs sync mode and a positive value",
                           c->deadline_ms);
    if (c->replicas < 0 || c->replicas > 2)
        return TERSE_ERROR(c->replicas > 2 ? TERSE_ERR_UNSUPPORTED : TERSE_ERR_INVALID,
                           "terse_ps_create: replicas %d: 1 or 2 (a chain longer than a head "
                           "and one replica is not built)",
                           c->replicas);
    if (c->replicas == 2 && (c->mode != TERSE_PS_SYNC || c->num_servers < 2))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_create: replicas 2 needs sync mode (a replica takes over "
                           "at a step boundary) and 2 or more servers (%d here)",
                           c->num_servers);
    if (c->staleness < 0 || c->max_staleness < 0)
        return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_create: negative staleness bound");
    if (c->mode != TERSE_PS_SYNC && c->update != TERSE_PS_UPDATE_SGD)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_create: %s mode applies pushes on the server as they "
                           "arrive, so it needs update TERSE_PS_UPDATE_SGD (the server holds the "
                           "parameters)",
                           c->mode == TERSE_PS_ASYNC ? "async" : "ssp");
    if (!(c->lr >= 0.0f && c->lr < 1e6f) || !(c->momentum >= 0.0f && c->momentum < 1.0f))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_create: lr %g must be >= 0 and momentum %g in [0, 1)",
                           (double)c->lr, (double)c->momentum);
    TERSE_CHECK(check_rules(c));
    const terse__ps_aggregator *agg = NULL;
    terse__ps_agg_params ap;
    if (terse__ps_parse_aggregator(c->aggregator, &agg, &ap) != TERSE_OK)
        return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_create: %s", terse_last_error());
    if (strcmp(agg->name, "mean") != 0 && c->mode != TERSE_PS_SYNC)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_create: aggregator \"%s\" combines the pushes of a step, so "
                           "it needs sync mode (%s applies each push as it arrives)",
                           c->aggregator, c->mode == TERSE_PS_ASYNC ? "async" : "ssp");
    /* With a quorum a step closes on its first K pushes: those are what the
     * aggregator gets. */
    if (agg->check(&ap, c->quorum ? c->quorum : workers) != TERSE_OK)
        return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_create: %s%s", terse_last_error(),
                           c->quorum ? " (counting the quorum's pushes)" : "");
    return TERSE_OK;
}

/* Every rank's config, compared with ours: the first difference names the
 * rank and the field. */
static terse_status agree(terse_comm *c, const terse_ps_config *cfg, const char *aggregator) {
    uint8_t mine[8 * AGREE_FIELDS];
    agree_bytes(cfg, aggregator, mine);
    uint8_t *all = malloc((size_t)c->nranks * sizeof mine);
    if (!all) return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_create: no memory");
    terse_status s = terse__store_allgather(c->store, mine, sizeof mine, all, c->timeout_ms);
    static const uint8_t refused[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    for (int r = 0; s == TERSE_OK && r < c->nranks; r++) {
        if (memcmp(all + r * sizeof mine, refused, 8) == 0) {
            s = TERSE_ERROR(TERSE_ERR_INVALID,
                            "terse_ps_create on rank %d: rank %d refused its config (its own "
                            "terse_ps_create says why)",
                            c->rank, r);
            break;
        }
        for (int i = 0; i < AGREE_FIELDS; i++)
            if (memcmp(all + r * sizeof mine + 8 * i, mine + 8 * i, 8) != 0) {
                s = TERSE_ERROR(TERSE_ERR_INVALID,
                                "terse_ps_create on rank %d: rank %d's config differs in %s "
                                "(%llu here, %llu there)",
                                c->rank, r, agree_names[i],
                                (unsigned long long)terse__get_u64(mine + 8 * i),
                                (unsigned long long)terse__get_u64(all + r * sizeof mine + 8 * i));
                break;
            }
    }
    free(all);
    return s;
}

/* Partition size and window: the config's, else the environment's, else
 * the defaults (docs/ps.md says how they were chosen). */
#define DEFAULT_PARTITION_BYTES ((size_t)1 << 20)
#define DEFAULT_WINDOW 4
static terse_status resolve_pipeline(terse_ps_config *c) {
    if (!c->partition_bytes)
        TERSE_CHECK(terse__env_bytes("TERSE_PS_PARTITION_BYTES", DEFAULT_PARTITION_BYTES, 64,
                                     (size_t)1 << 30, &c->partition_bytes));
    if (!c->window) {
        size_t w = 0;
        TERSE_CHECK(terse__env_bytes("TERSE_PS_WINDOW", DEFAULT_WINDOW, 1, TERSE__PS_MAX_LANES / 2, &w));
        c->window = (int)w;
    }
    return TERSE_OK;
}

/* A rank that refuses its config still takes part in the comparison, so
 * the other ranks fail at once naming it rather than waiting for it. */
static terse_status refuse_config(terse_comm *comm, terse_status bad) {
    char why[512];
    snprintf(why, sizeof why, "%s", terse_last_error());
    if (comm->nranks > 1 && comm->store) {
        uint8_t mine[8 * AGREE_FIELDS];
        uint8_t *all = malloc((size_t)comm->nranks * sizeof mine);
        memset(mine, 0xff, sizeof mine);
        if (all) (void)terse__store_allgather(comm->store, mine, sizeof mine, all, comm->timeout_ms);
        free(all);
    }
    terse__error_restore(why);
    return bad;
}

static terse_status create_on(terse_comm *comm, const terse_ps_config *cfg, int inner,
                              terse_ps **out);

terse_status terse_ps_create(terse_comm *comm, const terse_ps_config *cfg, terse_ps **out) {
    if (out) *out = NULL;
    if (!comm || !cfg || !out) return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_create: NULL argument");
    terse_ps_config wide = TERSE_PS_CONFIG_INIT;
    terse_status wbad = widen_config("terse_ps_create", cfg, &wide);
    if (wbad != TERSE_OK) return refuse_config(comm, wbad);
    cfg = &wide;
    if (cfg->colocate) {
        /* ps_colocate.c: two instances on endpoints of their own, each
         * created by create_on with the config it builds here */
        terse_ps_config ic = *cfg, rc;
        ic.colocate = 0;
        ic.num_servers = comm->nranks;
        terse_status bad = terse__ps_colo_check(comm, cfg);
        if (bad == TERSE_OK) bad = check_config(2 * comm->nranks, &ic);
        rc = *cfg;
        if (bad == TERSE_OK) bad = resolve_pipeline(&rc);
        if (bad != TERSE_OK) return refuse_config(comm, bad);
        TERSE_CHECK(agree(comm, &rc, cfg->aggregator && *cfg->aggregator ? cfg->aggregator : "mean"));
        ic.partition_bytes = rc.partition_bytes;
        ic.window = rc.window;
        return terse__ps_colo_create(comm, &ic, create_on, out);
    }
    return create_on(comm, cfg, 0, out);
}

static terse_status create_on(terse_comm *comm, const terse_ps_config *cfg, int inner,
                              terse_ps **out) {
    terse_ps_config rc = *cfg;
    terse_status bad = check_config(comm->nranks, cfg);
    if (bad == TERSE_OK) bad = resolve_pipeline(&rc);
    if (bad != TERSE_OK && inner) return bad;
    if (bad != TERSE_OK) return refuse_config(comm, bad);
    terse_ps *ps = calloc(1, sizeof *ps);
    if (!ps) return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_create: no memory");
    ps->comm = comm;
    ps->cfg = *cfg;
    ps->cfg.size = sizeof ps->cfg;
    if (!ps->cfg.chunk_bytes) ps->cfg.chunk_bytes = (size_t)1 << 20;
    if (!ps->cfg.replicas) ps->cfg.replicas = 1;
    ps->cfg.partition_bytes = rc.partition_bytes;
    ps->cfg.window = rc.window;
    snprintf(ps->aggregator_name, sizeof ps->aggregator_name, "%s",
             cfg->aggregator && *cfg->aggregator ? cfg->aggregator : "mean");
    ps->cfg.aggregator = ps->aggregator_name;
    ps->rule = terse__ps_rule(ps->cfg.update);
    ps->stale_rule = stale_rule_of(&ps->cfg);
    ps->dc_lambda = ps->cfg.dc_lambda > 0.0f ? ps->cfg.dc_lambda : 0.04f;
    ps->stale_mu = ps->cfg.momentum;
    if (ps->stale_rule & TERSE_PS_STALE_AMOM) {
        const float implicit = 1.0f - 1.0f / (float)(comm->nranks - cfg->num_servers);
        ps->stale_mu = ps->cfg.momentum > implicit ? ps->cfg.momentum - implicit : 0.0f;
    }
    ps->rank = comm->rank;
    ps->nranks = comm->nranks;
    ps->nservers = cfg->num_servers;
    ps->nworkers = comm->nranks - cfg->num_servers;
    ps->is_server = ps->rank < ps->nservers;
    ps->slot = ps->rank;
    ps->chunk_floats = ps->cfg.chunk_bytes / sizeof(float);
    ps->stats.size = sizeof ps->stats;
    terse_status s = TERSE_OK;
    /* whole chunks: a chunk is the unit of placement and of a codec */
    ps->part_floats = (ps->cfg.partition_bytes + ps->cfg.chunk_bytes - 1) / ps->cfg.chunk_bytes *
                      ps->chunk_floats;
    /* replicas 1: a window of pushes and, on lanes of their own, up to 7
     * times as many pulls per pair (a pull parked on its step never holds
     * up a push, and costs the server a conversation's state, no buffer;
     * with pulls scarce, a pull's header would wait for a lane and then
     * behind the pushes queued since: ps_pipe.c, docs/ps.md) */
    ps->push_lanes = ps->cfg.window;
    ps->lanes = ps->cfg.replicas == 2 ? 1
                : ps->cfg.window * 8 <= TERSE__PS_MAX_LANES ? 8 * ps->cfg.window
                                                             : TERSE__PS_MAX_LANES;
    if (ps->cfg.replicas == 2) ps->push_lanes = 1;
    /* check_config parsed it (and refused specs the name buffer cannot hold) */
    TERSE_CHECK_GOTO(terse__ps_parse_aggregator(ps->aggregator_name, &ps->agg, &ps->agg_params), s,
                     fail);
    size_t S = (size_t)ps->nservers, N = (size_t)ps->nranks;
    ps->placed = calloc(S, sizeof *ps->placed);
    ps->seq = calloc(S, sizeof *ps->seq);
    ps->sbuf = calloc(S, sizeof *ps->sbuf);
    ps->sbuf_cap = calloc(S, sizeof *ps->sbuf_cap);
    ps->rbuf = calloc(S, sizeof *ps->rbuf);
    ps->rbuf_cap = calloc(S, sizeof *ps->rbuf_cap);
    ps->whdr = calloc(S, TERSE__PS_HDR_BYTES);
    ps->wrep = calloc(S, TERSE__PS_REP_BYTES);
    ps->reps = calloc(S, sizeof *ps->reps);
    size_t SL = S * (size_t)ps->lanes;
    ps->peers = ps->is_server ? calloc(N * (size_t)ps->lanes, sizeof *ps->peers) : NULL;
    ps->lseq = calloc(SL, sizeof *ps->lseq);
    ps->lsbuf = calloc(SL, sizeof *ps->lsbuf);
    ps->lrbuf = calloc(SL, sizeof *ps->lrbuf);
    ps->lsbuf_cap = calloc(SL, sizeof *ps->lsbuf_cap);
    ps->lrbuf_cap = calloc(SL, sizeof *ps->lrbuf_cap);
    ps->lhdr = calloc(SL, TERSE__PS_HDR_BYTES);
    ps->lrep = calloc(SL, TERSE__PS_REP_BYTES);
    if (!ps->lseq || !ps->lsbuf || !ps->lrbuf || !ps->lsbuf_cap || !ps->lrbuf_cap || !ps->lhdr ||
        !ps->lrep) {
        s = TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_create: no memory");
        goto fail;
    }
    ps->inputs = calloc(N, sizeof *ps->inputs);
    ps->wts = calloc(N, sizeof *ps->wts);
    ps->target = calloc(S, sizeof *ps->target);
    ps->epoch = calloc(S, sizeof *ps->epoch);
    ps->mseq = calloc(S, sizeof *ps->mseq);
    ps->stale = calloc(S, 1);
    ps->backup = -1;
    for (size_t i = 0; ps->target && i < S; i++) ps->target[i] = (int)i;
    if (!ps->target || !ps->epoch || !ps->mseq || !ps->stale || !ps->placed || !ps->seq || !ps->sbuf || !ps->sbuf_cap || !ps->rbuf || !ps->rbuf_cap ||
        !ps->whdr || !ps->wrep || !ps->reps || (ps->is_server && !ps->peers) || !ps->inputs ||
        !ps->wts) {
        s = TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_create: no memory");
        goto fail;
    }
    TERSE_CHECK_GOTO(terse__ps_ring_build(ps), s, fail);
    if (comm->rejoined && !(ps->is_server && ps->cfg.replicas == 2))
        TERSE_FAIL_GOTO(s, fail, TERSE_ERR_INVALID,
                        "terse_ps_create on rank %d: this rank rejoined as a lost rank's "
                        "replacement (TERSE_REJOIN), which only a server of a parameter server "
                        "with replicas 2 can be (this rank is a %s, replicas %d)",
                        ps->rank, ps->is_server ? "server" : "worker", ps->cfg.replicas);
    if (comm->nranks > 1 && !inner)
        TERSE_CHECK_GOTO(agree(comm, &ps->cfg, ps->aggregator_name), s, fail);
    if (ps->is_server && ps->cfg.replicas == 2) TERSE_CHECK_GOTO(terse__ps_mirror_create(ps), s, fail);
    if (comm->rejoined) {
        /* Its slot comes back from its replica, its mirror's from that
         * slot's head (ps_replica.c); until then it holds requests. */
        ps->awaiting = ps->catching = 1;
        ps->repl_src = (ps->rank + 1) % ps->nservers;
        ps->mirror->catching = 1;
    }
    /* A worker with replicas survives a server's death: its failed
     * transfers must not fail the fabric (ps_failover.c). */
    if (ps->is_server || ps->cfg.replicas == 2) terse__fabric_set_tolerant(comm->fabric);
    if (ps->cfg.replicas == 2) terse__fabric_small_chunks_on_shm(comm->fabric);
    ps->created = 1;
    *out = ps;
    return TERSE_OK;
fail:
    terse_ps_free(ps);
    return s;
}

int terse_ps_is_server(const terse_ps *ps) { return ps && ps->is_server; }

/* ---------------------------------------------------------------- declare */

static terse_status make_codecs(terse__ps_key *k, const char *spec, terse_codec ***out,
                                size_t key, uint32_t rank, const char *what) {
    terse_codec **v = calloc(k->nchunks, sizeof *v);
    if (!v) return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_declare: no memory");
    *out = v;
    for (size_t c = 0; c < k->nchunks; c++) {
        size_t len = c + 1 < k->nchunks ? k->chunk_floats : k->n - c * k->chunk_floats;
        terse_status s = terse_codec_create(spec, 1, len, &v[c]);
        if (s != TERSE_OK)
            return TERSE_ERROR(s, "terse_ps_declare of key %zu: %s spec: %s", key, what,
                               terse_last_error());
        terse_codec_set_stream(v[c], (uint64_t)key << 32 | c, rank);
    }
    return TERSE_OK;
}

static void free_codecs(terse_codec **v, size_t n) {
    for (size_t i = 0; v && i < n; i++) terse_codec_free(v[i]);
    free(v);
}

static void key_free(terse_ps *ps, terse__ps_key *k) {
    for (size_t i = 0; k->unacked && i < (size_t)ps->nservers; i++) free(k->unacked[i].buf);
    free(k->unacked);
    free_codecs(k->push_enc, k->nchunks);
    free_codecs(k->pull_dec, k->nchunks);
    if (k->shard) terse__ps_shard_free(ps, k->shard);
    free(k->server), free(k->srv_nchunks), free(k->srv_floats);
    free(k->srv_push_bound), free(k->srv_pull_bound);
    free(k->pipe_busy), free(k->pipe_mark);
    free(k);
}

/* The canonical spec, and refuse codecs that need more than one message. */
static terse_status canon(const char *spec, size_t key, const char *what, char *out, size_t cap) {
    terse_codec *c = NULL;
    TERSE_CHECK(terse_codec_create(spec && *spec ? spec : "none", 1, 64, &c));
    terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
    terse_codec_get_traits(c, &t);
    snprintf(out, cap, "%s", terse_codec_spec(c));
    terse_codec_free(c);
    if (strcmp(t.name, "powersgd") == 0)
        return TERSE_ERROR(TERSE_ERR_UNSUPPORTED,
                           "terse_ps_declare of key %zu: the %s codec powersgd needs two rounds "
                           "of summing (P, then Q), which a parameter server's one message per "
                           "push does not give; use it with terse_allreduce",
                           key, what);
    return TERSE_OK;
}

terse_status terse__ps_keys_reserve(terse_ps *ps) {
    if (ps->nkeys < ps->keys_cap) return TERSE_OK;
    size_t cap = ps->keys_cap ? 2 * ps->keys_cap : 16;
    terse__ps_key **v = realloc(ps->keys, cap * sizeof *v);
    if (!v) return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_declare: no memory");
    ps->keys = v;
    ps->keys_cap = cap;
    return TERSE_OK;
}

/* One partition of declared key ukey: internal key ps->nkeys, n floats
 * from float off of the declared key. */
static terse_status declare_part(terse_ps *ps, size_t ukey, size_t part, size_t off, size_t n,
                                 const char *push_spec, const char *pull_spec,
                                 const float *init) {
    const size_t key = ps->nkeys;
    TERSE_CHECK(terse__ps_keys_reserve(ps));
    terse__ps_key *k = calloc(1, sizeof *k);
    if (!k) return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_declare: no memory");
    k->index = key;
    k->ukey = ukey;
    k->part = part;
    k->off = off;
    k->n = n;
    k->chunk_floats = ps->chunk_floats;
    k->nchunks = (n - 1) / k->chunk_floats + 1;
    terse_status s;
    TERSE_CHECK_GOTO(canon(push_spec, ukey, "push", k->push_spec, sizeof k->push_spec), s, fail);
    TERSE_CHECK_GOTO(canon(pull_spec, ukey, "pull", k->pull_spec, sizeof k->pull_spec), s, fail);
    /* Chained over every earlier key: placement depends on them all, so a
     * worker that declared any earlier key differently places this one
     * differently too, and must be refused here as well. */
    uint8_t nb[20];
    terse__put_u64(nb, n);
    terse__put_u64(nb + 8, k->chunk_floats);
    terse__put_u32(nb + 16, key ? ps->keys[key - 1]->decl_hash : 0);
    k->decl_hash = terse__crc32c_update(terse__crc32c_update(terse__crc32c_update(0, nb, 20),
                                                             k->push_spec, strlen(k->push_spec)),
                                        k->pull_spec, strlen(k->pull_spec));
    size_t S = (size_t)ps->nservers;
    k->server = calloc(k->nchunks, sizeof *k->server);
    k->srv_nchunks = calloc(S, sizeof *k->srv_nchunks);
    k->srv_floats = calloc(S, sizeof *k->srv_floats);
    k->srv_push_bound = calloc(S, sizeof *k->srv_push_bound);
    k->srv_pull_bound = calloc(S, sizeof *k->srv_pull_bound);
    if (!k->server || !k->srv_nchunks || !k->srv_floats || !k->srv_push_bound ||
        !k->srv_pull_bound) {
        s = TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_declare: no memory");
        goto fail;
    }
    uint64_t *saved = malloc(S * sizeof *saved);
    if (!saved) {
        s = TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_declare: no memory");
        goto fail;
    }
    memcpy(saved, ps->placed, S * sizeof *saved);
    s = terse__ps_place(ps, k);
    if (s == TERSE_OK && !ps->is_server) {
        s = make_codecs(k, k->push_spec, &k->push_enc, key, (uint32_t)ps->rank, "push");
        if (s == TERSE_OK)
            s = make_codecs(k, k->pull_spec, &k->pull_dec, key, (uint32_t)ps->rank, "pull");
    }
    for (size_t c = 0; s == TERSE_OK && c < k->nchunks; c++) {
        int sv = k->server[c];
        size_t len = c + 1 < k->nchunks ? k->chunk_floats : n - c * k->chunk_floats;
        k->srv_nchunks[sv]++;
        k->srv_floats[sv] += len;
        if (k->push_enc) k->srv_push_bound[sv] += terse_codec_bound(k->push_enc[c]);
        if (k->pull_dec) k->srv_pull_bound[sv] += terse_codec_bound(k->pull_dec[c]);
    }
    if (s == TERSE_OK && ps->cfg.replicas == 2 &&
        !(strncmp(k->pull_spec, "none", 4) == 0 && (!k->pull_spec[4] || k->pull_spec[4] == ':')))
        s = TERSE_ERROR(TERSE_ERR_UNSUPPORTED,
                        "terse_ps_declare of key %zu: pull spec \"%s\" with replicas 2: a pull "
                        "codec's server-side state (error feedback, random stream) lives on the "
                        "head alone, so a replica taking over would not pull the same bytes; "
                        "pull dense (NULL)",
                        ukey, k->pull_spec);
    if (s == TERSE_OK && ps->is_server) s = terse__ps_shard_init(ps, k, init);
    if (s == TERSE_OK && ps->mirror) s = terse__ps_mirror_declare(ps, k, init);
    if (s == TERSE_OK && !ps->is_server && ps->cfg.replicas == 2 &&
        !(k->unacked = calloc(S, sizeof *k->unacked)))
        s = TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_declare: no memory");
    if (s == TERSE_OK && !ps->is_server &&
        (!(k->pipe_busy = calloc(S, 1)) || !(k->pipe_mark = calloc(S, sizeof *k->pipe_mark))))
        s = TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_declare: no memory");
    if (s != TERSE_OK) {
        memcpy(ps->placed, saved, S * sizeof *saved);
        free(saved);
        goto fail;
    }
    free(saved);
    ps->keys[ps->nkeys++] = k;
    return TERSE_OK;
fail:
    key_free(ps, k);
    return s;
}

terse_status terse_ps_declare(terse_ps *ps, size_t key, size_t n, const char *push_spec,
                              const char *pull_spec, const float *init) {
    if (!ps) return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_declare: ps is NULL");
    if (ps->colo) return terse__ps_colo_declare(ps, key, n, push_spec, pull_spec, init);
    if (key != ps->nukeys)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_declare: key %zu, but keys are declared in order and the "
                           "next is %zu",
                           key, ps->nukeys);
    if (n == 0 || n > TERSE_MAX_ELEMENTS)
        return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_declare of key %zu: %zu elements", key, n);
    if (ps->nukeys == ps->ukeys_cap) {
        size_t cap = ps->ukeys_cap ? 2 * ps->ukeys_cap : 16;
        terse__ps_ukey *v = realloc(ps->ukeys, cap * sizeof *v);
        if (!v) return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_declare: no memory");
        ps->ukeys = v;
        ps->ukeys_cap = cap;
    }
    /* Its partitions, each an internal key of its own (placement, shard,
     * step, codecs, replication): the unit a worker pipelines. */
    const size_t first = ps->nkeys, P = (n - 1) / ps->part_floats + 1;
    uint64_t *saved = malloc((size_t)ps->nservers * sizeof *saved);
    if (!saved) return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_declare: no memory");
    memcpy(saved, ps->placed, (size_t)ps->nservers * sizeof *saved);
    size_t *mine = calloc((size_t)ps->nservers, sizeof *mine);
    terse_status s = mine ? TERSE_OK : TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_declare: no memory");
    ps->place_mine = mine; /* placement spreads the key's chunks over all its partitions */
    ps->place_chunks = (n - 1) / ps->chunk_floats + 1;
    for (size_t p = 0; p < P && s == TERSE_OK; p++) {
        size_t off = p * ps->part_floats, len = n - off < ps->part_floats ? n - off : ps->part_floats;
        s = declare_part(ps, key, p, off, len, push_spec, pull_spec, init ? init + off : NULL);
    }
    ps->place_mine = NULL;
    free(mine);
    if (s != TERSE_OK) { /* undo the partitions declared */
        while (ps->nkeys > first) key_free(ps, ps->keys[--ps->nkeys]);
        memcpy(ps->placed, saved, (size_t)ps->nservers * sizeof *saved);
        free(saved);
        return s;
    }
    free(saved);
    terse__ps_key **parts = malloc(P * sizeof *parts);
    if (!parts) {
        while (ps->nkeys > first) key_free(ps, ps->keys[--ps->nkeys]);
        return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_declare: no memory");
    }
    for (size_t p = 0; p < P; p++) {
        parts[p] = ps->keys[first + p];
        parts[p]->nparts = P;
    }
    ps->ukeys[ps->nukeys++] = (terse__ps_ukey){first, P, n, parts, 0};
    return TERSE_OK;
}

terse_status terse_ps_set_priority(terse_ps *ps, size_t key, int priority) {
    if (!ps) return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_set_priority: ps is NULL");
    if (key >= ps->nukeys)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_set_priority on rank %d: key %zu was never declared (%zu "
                           "keys)",
                           ps->rank, key, ps->nukeys);
    ps->ukeys[key].priority = priority;
    return TERSE_OK;
}

terse_status terse_ps_placement(const terse_ps *ps, uint64_t *bytes) {
    if (!ps || !bytes) return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_placement: NULL argument");
    memcpy(bytes, ps->placed, (size_t)ps->nservers * sizeof *bytes);
    return TERSE_OK;
}

int terse_ps_chunk_server(const terse_ps *ps, size_t key, size_t chunk) {
    if (!ps || key >= ps->nukeys) return -1;
    const terse__ps_ukey *u = &ps->ukeys[key];
    const size_t per = ps->part_floats / ps->chunk_floats; /* chunks per partition */
    if (chunk / per >= u->nparts) return -1;
    const terse__ps_key *k = ps->keys[u->first + chunk / per];
    return chunk % per < k->nchunks ? k->server[chunk % per] : -1;
}

terse_status terse_ps_get_stats(const terse_ps *ps, terse_ps_stats *st) {
    if (!ps || !st) return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_get_stats: NULL argument");
    /* Fields are only appended: a caller built with an older header gets
     * the fields it knows. */
    const size_t first = offsetof(terse_ps_stats, refused_nonfinite);
    if (st->size < first)
        return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_get_stats: stats size %zu < %zu", st->size,
                           first);
    terse_ps_stats all = ps->stats;
    all.size = st->size < sizeof all ? st->size : sizeof all;
    all.staleness_mean = ps->stats.pushes_applied
                             ? (double)ps->staleness_sum / (double)ps->stats.pushes_applied
                             : 0.0;
    if (ps->colo) terse__ps_colo_stats(ps, &all);
    memcpy(st, &all, all.size);
    return TERSE_OK;
}

uint64_t terse_ps_worker_clock(const terse_ps *ps) { return ps ? ps->clock : 0; }

terse_status terse_ps_clock(terse_ps *ps) {
    if (!ps) return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_clock: ps is NULL");
    if (ps->is_server)
        return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_clock on rank %d: this rank is a server",
                           ps->rank);
    if (atomic_exchange(&ps->step_refused, 0)) return TERSE_OK; /* push that step again */
    uint64_t floor = atomic_load(&ps->clock_floor);
    ps->clock = ps->clock + 1 > floor ? ps->clock + 1 : floor;
    return TERSE_OK;
}

void terse_ps_free(terse_ps *ps) {
    if (!ps) return;
    if (ps->created && !ps->is_server && !ps->finished) (void)terse_ps_finish(ps);
    struct terse__ps_colo *colo = ps->colo;
    if (colo) terse__ps_colo_stop(ps); /* its server done serving */
    terse__ps_mirror_free(ps);
    for (size_t i = 0; i < ps->nkeys; i++) key_free(ps, ps->keys[i]);
    terse__ps_worker_free(ps);
    terse__ps_pipe_free(ps);
    for (size_t i = 0; i < ps->nukeys; i++) free(ps->ukeys[i].parts);
    free(ps->ukeys);
    free(ps->target), free(ps->epoch), free(ps->mseq), free(ps->stale);
    free(ps->keys);
    free(ps->placed), free(ps->seq);
    free(ps->lseq), free(ps->lsbuf), free(ps->lrbuf), free(ps->lsbuf_cap), free(ps->lrbuf_cap);
    free(ps->lhdr), free(ps->lrep);
    free(ps->sbuf_cap), free(ps->rbuf_cap), free(ps->sbuf), free(ps->rbuf);
    free(ps->whdr), free(ps->wrep), free(ps->reps);
    free(ps->peers), free(ps->inputs), free(ps->wts), free(ps->scratch);
    free(ps->caught), free(ps->roster), free(ps->rbuf_state);
    free(ps->ring_hash), free(ps->ring_server);
    if (ps->quorum_log) fclose(ps->quorum_log);
    free(ps);
    if (colo) terse__ps_colo_free(colo); /* the server instance, then the endpoints */
}
