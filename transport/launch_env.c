/* Rank, size, address, provider, token and timeout: from the config, else
 * from the variables real launchers set, in a fixed order of precedence.
 * Every malformed value is refused with a sentence naming the variable --
 * except the token, whose value is never printed. */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "transport/launch_env.h"
#include "transport/store_wire.h"

/* Highest precedence first. A launcher that sets neither variable is
 * skipped; rank and size are each taken from the first that sets them. */
static const struct launcher {
    const char *name, *rank, *size;
} launchers[] = {
    {"terse", "TERSE_RANK", "TERSE_SIZE"},
    {"torchrun", "RANK", "WORLD_SIZE"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
    {"PMI", "PMI_RANK", "PMI_SIZE"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS"},
};
enum { NLAUNCHERS = sizeof launchers / sizeof launchers[0] };

/* Does the caller's config (of cfg->size bytes) reach this field? Fields
 * appended after the caller was compiled count as unset. */
#define HAS_FIELD(cfg, f) \
    ((cfg) && (cfg)->size >= offsetof(terse_comm_config, f) + sizeof((cfg)->f))

/* Strict decimal: digits only (no sign, space or suffix), at least min,
 * at most INT_MAX. */
static terse_status parse_int(const char *name, const char *v, int min, int *out) {
    long long x = 0;
    size_t i = 0;
    for (; v[i] >= '0' && v[i] <= '9'; i++) {
        x = x * 10 + (v[i] - '0');
        if (x > INT_MAX)
            return TERSE_ERROR(TERSE_ERR_INVALID, "%s='%.40s' is too large", name, v);
    }
    if (i == 0 || v[i] != '\0')
        return TERSE_ERROR(TERSE_ERR_INVALID, "%s='%.40s' is not a whole number", name, v);
    if (x < min)
        return TERSE_ERROR(TERSE_ERR_INVALID, "%s='%.40s' must be at least %d", name, v, min);
    *out = (int)x;
    return TERSE_OK;
}

/* The first launcher variable (rank or size) that is set; *from names it,
 * *who is its launcher. Absent everywhere: *from stays NULL. */
static terse_status from_env(int want_size, int min, int *val, const char **from,
                             const char **who) {
    for (int i = 0; i < NLAUNCHERS; i++) {
        const char *var = want_size ? launchers[i].size : launchers[i].rank;
        const char *v = getenv(var);
        if (!v) continue;
        TERSE_CHECK(parse_int(var, v, min, val));
        *from = var;
        *who = launchers[i].name;
        return TERSE_OK;
    }
    return TERSE_OK;
}

static terse_status resolve_ranks(const terse_comm_config *cfg, terse__launch *out) {
    const char *rank_from = NULL, *size_from = NULL, *rank_who = "", *size_who = "";
    int rank = -1, size = -1;
    if (HAS_FIELD(cfg, rank) && cfg->rank != -1) {
        if (cfg->rank < 0)
            return TERSE_ERROR(TERSE_ERR_INVALID,
                               "config rank %d is negative (use -1 to take it from the "
                               "environment)",
                               cfg->rank);
        rank = cfg->rank;
        rank_from = rank_who = "the config";
    } else {
        TERSE_CHECK(from_env(0, 0, &rank, &rank_from, &rank_who));
    }
    if (HAS_FIELD(cfg, nranks) && cfg->nranks != -1) {
        if (cfg->nranks < 1)
            return TERSE_ERROR(TERSE_ERR_INVALID,
                               "config nranks %d must be at least 1 (or -1 for the environment)",
                               cfg->nranks);
        size = cfg->nranks;
        size_from = size_who = "the config";
    } else {
        TERSE_CHECK(from_env(1, 1, &size, &size_from, &size_who));
    }
    /* No launcher at all: a single process, as a plain `./train` expects. */
    if (!rank_from && !size_from) {
        out->rank = 0;
        out->nranks = 1;
        snprintf(out->source, sizeof out->source, "no launcher (one process)");
        return TERSE_OK;
    }
    if (!size_from)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "rank %d comes from %s, but no job size is set (config nranks, "
                           "TERSE_SIZE, WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE or "
                           "SLURM_NTASKS)",
                           rank, rank_from);
    if (!rank_from) {
        if (size != 1)
            return TERSE_ERROR(TERSE_ERR_INVALID,
                               "the job size %d comes from %s, but no rank is set (config rank, "
                               "TERSE_RANK, RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or "
                               "SLURM_PROCID)",
                               size, size_from);
        rank = 0;
        rank_from = rank_who = size_who;
    }
    if (rank >= size)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "rank %d (from %s) is not below the job size %d (from %s)", rank,
                           rank_from, size, size_from);
    out->rank = rank;
    out->nranks = size;
    if (strcmp(rank_who, size_who) == 0)
        snprintf(out->source, sizeof out->source, "%s", rank_who);
    else
        snprintf(out->source, sizeof out->source, "%s + %s", rank_from, size_from);
    return TERSE_OK;
}

static terse_status resolve_addr(const terse_comm_config *cfg, terse__launch *out) {
    char buf[sizeof out->addr + 8];
    const char *name, *v;
    if (HAS_FIELD(cfg, addr) && cfg->addr) {
        name = "config addr";
        v = cfg->addr;
    } else if ((v = getenv("TERSE_ADDR")) != NULL) {
        name = "TERSE_ADDR";
    } else {
        /* torchrun's pair; an IPv6 literal gets brackets so the port stays
         * unambiguous. */
        const char *h = getenv("MASTER_ADDR"), *p = getenv("MASTER_PORT");
        if (!h && !p)
            return TERSE_ERROR(TERSE_ERR_INVALID,
                               "rank %d of %d needs the bootstrap store's address: set "
                               "TERSE_ADDR=host:port (or MASTER_ADDR and MASTER_PORT)",
                               out->rank, out->nranks);
        if (!h || !*h)
            return TERSE_ERROR(TERSE_ERR_INVALID, "MASTER_PORT is set but MASTER_ADDR is %s",
                               h ? "empty" : "not");
        if (!p)
            return TERSE_ERROR(TERSE_ERR_INVALID, "MASTER_ADDR is set but MASTER_PORT is not");
        int port;
        TERSE_CHECK(parse_int("MASTER_PORT", p, 1, &port));
        if (port > 65535)
            return TERSE_ERROR(TERSE_ERR_INVALID, "MASTER_PORT='%.40s' is above 65535", p);
        int v6 = strchr(h, ':') && h[0] != '[';
        snprintf(buf, sizeof buf, v6 ? "[%.*s]:%d" : "%.*s:%d", (int)sizeof out->addr, h, port);
        name = "MASTER_ADDR:MASTER_PORT";
        v = buf;
    }
    if (strlen(v) >= sizeof out->addr)
        return TERSE_ERROR(TERSE_ERR_INVALID, "%s is %zu bytes long; at most %zu are allowed",
                           name, strlen(v), sizeof out->addr - 1);
    char host[sizeof out->addr];
    unsigned port;
    TERSE_CHECK(terse__store_split_addr(v, name, host, sizeof host, &port));
    memcpy(out->addr, v, strlen(v) + 1); /* length checked above */
    return TERSE_OK;
}

static terse_status resolve_token(const terse_comm_config *cfg, terse__launch *out) {
    const char *name = "config token", *v = HAS_FIELD(cfg, token) ? cfg->token : NULL;
    if (!v) {
        name = "TERSE_TOKEN";
        v = getenv(name);
    }
    /* The value is a secret: messages give its length, never its bytes. */
    if (!v)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "rank %d of %d needs the job token: set TERSE_TOKEN (terse-run "
                           "sets a fresh one)",
                           out->rank, out->nranks);
    size_t n = strlen(v);
    if (n == 0) return TERSE_ERROR(TERSE_ERR_INVALID, "%s is empty", name);
    /* Every key of the job derives from the token: a short one can be
     * guessed offline from one recorded handshake. */
    const char *weak = getenv("TERSE_ALLOW_SHORT_TOKEN");
    if (n < TERSE__MIN_TOKEN && !(weak && strcmp(weak, "1") == 0))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "%s is %zu bytes long; at least %d are required (terse-run makes a "
                           "random 64-character one; TERSE_ALLOW_SHORT_TOKEN=1 lifts this for "
                           "tests)",
                           name, n, TERSE__MIN_TOKEN);
    if (n >= sizeof out->token)
        return TERSE_ERROR(TERSE_ERR_INVALID, "%s is %zu bytes long; at most %zu are allowed",
                           name, n, sizeof out->token - 1);
    memcpy(out->token, v, n + 1);
    return TERSE_OK;
}

static terse_status resolve_provider(const terse_comm_config *cfg, terse__launch *out) {
    static const char *const known[] = {"shm", "tcp", "rxm", "verbs", "efa", "net", "auto"};
    const char *name = "config provider", *v = HAS_FIELD(cfg, provider) ? cfg->provider : NULL;
    if (!v) {
        name = "TERSE_PROVIDER";
        v = getenv(name);
    }
    if (!v) v = "auto";
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(v, known[i]) == 0) {
            snprintf(out->provider, sizeof out->provider, "%s", v);
            return TERSE_OK;
        }
    return TERSE_ERROR(TERSE_ERR_INVALID,
                       "%s='%.40s' is not a provider; use shm, tcp, rxm, verbs, efa, net or auto", name, v);
}

static terse_status resolve_timeout(const terse_comm_config *cfg, terse__launch *out) {
    if (HAS_FIELD(cfg, timeout_ms) && cfg->timeout_ms != 0) {
        if (cfg->timeout_ms < 0)
            return TERSE_ERROR(TERSE_ERR_INVALID,
                               "config timeout_ms %d is negative (0 takes TERSE_TIMEOUT_MS)",
                               cfg->timeout_ms);
        out->timeout_ms = cfg->timeout_ms;
        return TERSE_OK;
    }
    const char *v = getenv("TERSE_TIMEOUT_MS");
    out->timeout_ms = 60000;
    return v ? parse_int("TERSE_TIMEOUT_MS", v, 1, &out->timeout_ms) : TERSE_OK;
}

/* Init waits for ranks that a launcher may start seconds apart, so its
 * deadline is its own: at least 30 s unless set. */
static terse_status resolve_init_timeout(const terse_comm_config *cfg, terse__launch *out) {
    if (HAS_FIELD(cfg, init_timeout_ms) && cfg->init_timeout_ms != 0) {
        if (cfg->init_timeout_ms < 0)
            return TERSE_ERROR(TERSE_ERR_INVALID,
                               "config init_timeout_ms %d is negative (0 takes "
                               "TERSE_INIT_TIMEOUT_MS)",
                               cfg->init_timeout_ms);
        out->init_timeout_ms = cfg->init_timeout_ms;
        return TERSE_OK;
    }
    const char *v = getenv("TERSE_INIT_TIMEOUT_MS");
    out->init_timeout_ms = out->timeout_ms > 30000 ? out->timeout_ms : 30000;
    return v ? parse_int("TERSE_INIT_TIMEOUT_MS", v, 1, &out->init_timeout_ms) : TERSE_OK;
}

static terse_status resolve_rejoin(const terse_comm_config *cfg, terse__launch *out) {
    if (HAS_FIELD(cfg, rejoin) && cfg->rejoin != -1) {
        if (cfg->rejoin != 0 && cfg->rejoin != 1)
            return TERSE_ERROR(TERSE_ERR_INVALID, "config rejoin is %d; it is 0, 1 or -1 (from "
                                                  "TERSE_REJOIN)", cfg->rejoin);
        out->rejoin = cfg->rejoin;
    } else {
        const char *v = getenv("TERSE_REJOIN");
        if (v && *v && strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
            return TERSE_ERROR(TERSE_ERR_INVALID, "TERSE_REJOIN=\"%.32s\": it is 0 or 1", v);
        out->rejoin = v && strcmp(v, "1") == 0;
    }
    if (out->rejoin && out->nranks < 2)
        return TERSE_ERROR(TERSE_ERR_INVALID, "rejoin: a job of one rank has nothing to rejoin");
    return TERSE_OK;
}

terse_status terse__launch_resolve(const terse_comm_config *cfg, terse__launch *out) {
    if (!out) return TERSE_ERROR(TERSE_ERR_INVALID, "terse__launch_resolve: out is NULL");
    memset(out, 0, sizeof *out);
    if (cfg && cfg->size < sizeof cfg->size)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_comm_config.size is %zu; start from TERSE_COMM_CONFIG_INIT",
                           cfg->size);
    terse_status st;
    TERSE_CHECK_GOTO(resolve_ranks(cfg, out), st, fail);
    TERSE_CHECK_GOTO(resolve_provider(cfg, out), st, fail);
    TERSE_CHECK_GOTO(resolve_timeout(cfg, out), st, fail);
    TERSE_CHECK_GOTO(resolve_init_timeout(cfg, out), st, fail);
    TERSE_CHECK_GOTO(resolve_rejoin(cfg, out), st, fail);
    /* One process has nobody to meet: no store, so no address or token. */
    if (out->nranks > 1) {
        TERSE_CHECK_GOTO(resolve_addr(cfg, out), st, fail);
        TERSE_CHECK_GOTO(resolve_token(cfg, out), st, fail);
    }
    return TERSE_OK;
fail:
    /* Leave no copy of a token behind in a result the caller will not use. */
    memset(out->token, 0, sizeof out->token);
    return st;
}
