/* Joining a job and leaving it: everything of terse_comm_init and
 * terse_comm_free but the engine (algos/engine/comm_api.c wraps these two
 * around the engine's start and shutdown), and taking a lost rank's
 * replacement back in.
 *
 * Joining, in order:
 *   1. Resolve rank, size, address, provider, token and timeout from the
 *      config and the launcher's environment (transport/launch_env.h).
 *   2. Connect to rank 0's bootstrap store (rank 0 starts it), which
 *      authenticates us with the job token.
 *   3. Learn every rank's host through the store (comm_hosts.c); if
 *      every rank is on this host, "auto" may choose shared memory.
 *   4. Open the libfabric endpoint and publish its name through the store.
 *   5. Insert every rank's name into the address vector.
 *   6. Wait, through the store, until every rank has done step 5: a
 *      message from a rank we have not inserted yet could not be matched
 *      by a receive directed at that rank.
 * A single rank needs no store and no token; it still opens the endpoint
 * so that the provider it reports is real. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "algos/comm/comm.h"
#include "common/bytes.h"
#include "common/error.h"
#include "transport/launch_env.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>

#define NAME_BYTES 256

/* What is left of init's deadline, at least 1 ms (a store call given 0
 * would take the whole timeout instead). */
static int left_ms(const terse_comm *c, uint64_t deadline_ns) {
    uint64_t now = terse__now_ns();
    (void)c;
    if (now >= deadline_ns) return 1;
    uint64_t ms = (deadline_ns - now + 999999u) / 1000000u;
    return ms > (uint64_t)INT32_MAX ? INT32_MAX : (int)ms;
}

/* Steps 4-6 for more than one rank: exchange endpoint names. Every rank
 * publishes its endpoint's name and, when it opened one, its side (shm)
 * endpoint's name for the peers on its host (per-peer routing, issue 28);
 * every name travels as a u32 length and NAME_BYTES of name, so ranks whose
 * names differ in length are caught here rather than as a mismatched AV. */
#define REC_BYTES (4 + NAME_BYTES + 1 + NAME_BYTES)
static terse_status exchange_names(terse_comm *c, terse__fabric **side, uint64_t deadline) {
    uint8_t mine[REC_BYTES] = {0};
    size_t len = NAME_BYTES, slen = NAME_BYTES;
    TERSE_CHECK(terse__fabric_name(c->fabric, mine + 4, &len));
    terse__put_u32(mine, (uint32_t)len);
    if (*side) {
        TERSE_CHECK(terse__fabric_name(*side, mine + 5 + NAME_BYTES, &slen));
        mine[4 + NAME_BYTES] = 1;
    }
    size_t N = (size_t)c->nranks;
    uint8_t *all = malloc(N * sizeof mine), *names = malloc(N * len + 1);
    uint8_t *snames = malloc(N * slen + 1), *member = calloc(N, 1);
    terse_status s = TERSE_OK;
    if (!all || !names || !snames || !member)
        TERSE_FAIL_GOTO(s, out, TERSE_ERR_NOMEM, "rank %d: allocating endpoint names", c->rank);
    TERSE_CHECK_GOTO(terse__store_allgather(c->store, mine, sizeof mine, all, left_ms(c, deadline)),
                     s, out);
    for (size_t r = 0; r < N; r++) {
        uint32_t l = terse__get_u32(all + r * sizeof mine);
        if (l != len)
            TERSE_FAIL_GOTO(s, out, TERSE_ERR_TRANSPORT,
                            "rank %d: rank %zu's endpoint name is %u bytes, ours is %zu "
                            "(different providers?)",
                            c->rank, r, l, len);
        memcpy(names + r * len, all + r * sizeof mine + 4, len);
        if (!*side || c->host_of[r] != c->host_index) continue;
        if (!all[r * sizeof mine + 4 + NAME_BYTES])
            TERSE_FAIL_GOTO(s, out, TERSE_ERR_TRANSPORT,
                            "rank %d: rank %zu shares its host but opened no shared-memory "
                            "endpoint for its host's ranks (its TERSE_PROVIDER differs?)",
                            c->rank, r);
        memcpy(snames + r * slen, all + r * sizeof mine + 5 + NAME_BYTES, slen);
        member[r] = 1;
    }
    TERSE_CHECK_GOTO(terse__fabric_set_peers(c->fabric, names, len), s, out);
    if (*side) {
        TERSE_CHECK_GOTO(terse__fabric_set_peers_among(*side, snames, slen, member), s, out);
        member[c->rank] = 0; /* a message to itself stays where it was */
        terse__fabric_attach_side(c->fabric, *side, member);
        *side = NULL;
        member = NULL;
    }
    /* 6: everyone has inserted everyone */
    uint8_t ready = 1;
    TERSE_CHECK_GOTO(terse__store_allgather(c->store, &ready, 1, all, left_ms(c, deadline)), s, out);
out:
    free(all);
    free(names);
    free(snames);
    free(member);
    return s;
}

/* Per-peer routing (issue 28, stage 2): with several hosts and more than
 * one rank on this one, an shm endpoint for this host's ranks beside the
 * network endpoint for the others. Not for TERSE_TOPOLOGY=flat (today's
 * one provider for every pair), not when the endpoint is shm already, not
 * for a replacement (it announces one name; the others route it through
 * the network: terse__fabric_replace_peer). */
static terse_status open_side(terse_comm *c, int rejoin, terse__fabric **side) {
    *side = NULL;
    if (c->params.topology == 1 || c->nhosts < 2 || c->local_size < 2 || rejoin) return TERSE_OK;
    if (strcmp(terse__fabric_provider(c->fabric), "shm") == 0) return TERSE_OK;
    terse_status s = terse__fabric_open("shm", 1, c->rank, c->nranks, side);
    if (s != TERSE_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", terse__comm_last_sentence());
        return TERSE_ERROR(s, "rank %d: opening the shared-memory endpoint for the %d ranks of "
                              "its host failed (TERSE_TOPOLOGY=flat uses the network for every "
                              "pair): %s",
                           c->rank, c->local_size, why);
    }
    return TERSE_OK;
}

/* TERSE_WIRE: auto is mac except on shm, whose regions only processes of
 * this user can map (SECURITY.md). With mac every rank publishes a fresh
 * random nonce through the store, and the fabric derives a key for every
 * ordered pair from the token and the two nonces (fabric_mac.c). */
static terse_status setup_wire(terse_comm *c, const char *token, uint64_t deadline) {
    int mac = c->params.wire >= 2 || (c->params.wire == 0 && strcmp(c->provider, "shm") != 0);
    c->wire_mac = mac;
    if (!mac) return TERSE_OK;
    uint8_t mine[TERSE__WIRE_NONCE];
    if (RAND_bytes(mine, sizeof mine) != 1)
        return TERSE_ERROR(TERSE_ERR_INTERNAL, "rank %d: the OpenSSL CSPRNG failed", c->rank);
    uint8_t *all = malloc((size_t)c->nranks * sizeof mine);
    if (!all) return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: allocating wire nonces", c->rank);
    terse_status s = terse__store_allgather(c->store, mine, sizeof mine, all, left_ms(c, deadline));
    if (s == TERSE_OK) s = terse__fabric_set_keys(c->fabric, token, all, c->params.wire == 3);
    /* the side (shm) endpoint: as shm alone would be (auto: none) */
    terse__fabric *side = terse__fabric_side(c->fabric);
    if (s == TERSE_OK && side && c->params.wire >= 2)
        s = terse__fabric_set_keys(side, token, all, c->params.wire == 3);
    memcpy(c->wire_nonce, mine, sizeof mine);
    free(all);
    return s;
}

/* A replacement's announcement, relayed by the store to every other rank
 * as a BACK notice: u32 name length, the endpoint name, u8 1 and the wire
 * nonce with mac (0 without). The others take it in take_back(). */
#define BACK_BYTES (4 + NAME_BYTES + 1 + TERSE__WIRE_NONCE)
static terse_status announce_back(terse_comm *c) {
    uint8_t b[BACK_BYTES] = {0};
    size_t len = NAME_BYTES;
    TERSE_CHECK(terse__fabric_name(c->fabric, b + 4, &len));
    terse__put_u32(b, (uint32_t)len);
    b[4 + NAME_BYTES] = (uint8_t)c->wire_mac;
    if (c->wire_mac) memcpy(b + 5 + NAME_BYTES, c->wire_nonce, TERSE__WIRE_NONCE);
    c->rejoined = 1;
    return terse__store_announce_back(c->store, b, sizeof b);
}

terse_status terse__comm_take_back(terse_comm *c, int *rank) {
    *rank = -1;
    if (!c->store) return TERSE_OK;
    terse__store_back *n = terse__store_take_back(c->store);
    if (!n) return TERSE_OK;
    terse_status s = TERSE_OK;
    uint32_t len = n->len == BACK_BYTES ? terse__get_u32(n->blob) : 0;
    int mac = n->len == BACK_BYTES ? n->blob[4 + NAME_BYTES] : -1;
    if (len == 0 || len > NAME_BYTES || mac != c->wire_mac)
        s = TERSE_ERROR(TERSE_ERR_CORRUPT,
                        "rank %d: the announcement of rank %d's replacement is malformed (%zu "
                        "bytes, name %u bytes, mac %d here %d)",
                        c->rank, n->rank, n->len, len, mac, c->wire_mac);
    else
        s = terse__fabric_replace_peer(c->fabric, n->rank, n->blob + 4, len,
                                       n->blob + 5 + NAME_BYTES);
    if (s == TERSE_OK) {
        *rank = n->rank;
        /* The replacement is not in the host's segment: from now on this
         * rank's all-reduces go through the transport (seg_allreduce.c
         * says what a survivor that has not heard yet does). */
        terse__comm_segment_close(c);
        fprintf(stderr, "terse: rank %d: rank %d is back (a replacement, incarnation %u)\n",
                c->rank, n->rank, n->incarnation);
    } else {
        /* One replacement this rank cannot reach is not a reason to stop:
         * it stays lost here, and what needs it fails naming it. */
        fprintf(stderr, "terse: rank %d: rank %d's replacement (incarnation %u) stays lost "
                        "here: %s\n",
                c->rank, n->rank, n->incarnation, terse__comm_last_sentence());
        terse__store_mark_lost(c->store, n->rank);
        s = TERSE_OK;
    }
    free(n);
    return s;
}

terse_status terse__comm_join(const terse_comm_config *config, terse_comm **out) {
    if (!out) return TERSE_ERROR(TERSE_ERR_INVALID, "terse_comm_init: out pointer is NULL");
    *out = NULL;
    terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
    if (config) {
        if (config->size < sizeof(size_t) || config->size > 4096)
            return TERSE_ERROR(TERSE_ERR_INVALID,
                               "terse_comm_init: config->size is %zu; start from "
                               "TERSE_COMM_CONFIG_INIT",
                               config->size);
        /* An older, shorter config leaves the newer fields at their defaults. */
        memcpy(&cfg, config, config->size < sizeof cfg ? config->size : sizeof cfg);
        cfg.size = sizeof cfg;
    }
    terse__launch L;
    TERSE_CHECK(terse__launch_resolve(&cfg, &L));

    terse_status s = TERSE_OK;
    terse_comm *c = calloc(1, sizeof *c);
    if (!c) return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: allocating a communicator", L.rank);
    c->rank = L.rank;
    c->nranks = L.nranks;
    c->pid = getpid();
    c->timeout_ms = L.timeout_ms > 0 ? L.timeout_ms : 60000;
    c->stats = (terse_comm_stats)TERSE_COMM_STATS_INIT;
    pthread_mutex_init(&c->stats_lock, NULL);
    pthread_mutex_init(&c->lock, NULL);
    TERSE_CHECK_GOTO(terse__params_read(c->rank, &c->params), s, fail);

    /* One deadline for every step of init. */
    const uint64_t deadline = terse__now_ns() + (uint64_t)L.init_timeout_ms * 1000000ull;
    int same = 1;
    if (c->nranks > 1) {
        TERSE_CHECK_GOTO(terse__store_open_ex(L.addr, c->rank, c->nranks, L.token,
                                              left_ms(c, deadline), L.rejoin, &c->store),
                         s, fail);
        s = terse__params_agree(c, left_ms(c, deadline));
        if (s == TERSE_ERR_INVALID) {
            /* Every rank saw the same values and fails alike: leave with a
             * goodbye, so that rank 0's store waits for the others to read
             * them instead of vanishing under them. */
            terse__comm_leave(c);
            return s;
        }
        if (s != TERSE_OK) goto fail;
        s = terse__comm_hosts(c, left_ms(c, deadline));
        if (s == TERSE_ERR_INVALID) {
            /* every rank judged the same table: leave alike, as above */
            terse__comm_leave(c);
            return s;
        }
        if (s != TERSE_OK) goto fail;
        same = c->nhosts == 1 ? 1 : c->one_net ? 2 : 0;
    } else {
        terse__comm_hosts_single(c);
    }
    c->same_host = same;
    TERSE_CHECK_GOTO(terse__fabric_open(L.provider[0] ? L.provider : "auto", same, c->rank,
                                        c->nranks, &c->fabric),
                     s, fail);
    snprintf(c->provider, sizeof c->provider, "%s", terse__fabric_provider(c->fabric));
    c->desc_block = strcmp(c->provider, "shm") == 0; /* comm_desc.c says why */
    if (c->nranks > 1) {
        terse__fabric *side = NULL;
        TERSE_CHECK_GOTO(open_side(c, L.rejoin, &side), s, fail);
        s = exchange_names(c, &side, deadline);
        terse__fabric_close(side); /* still ours only if the exchange failed */
        if (s != TERSE_OK) goto fail;
        if (terse__fabric_side(c->fabric)) {
            snprintf(c->provider, sizeof c->provider, "shm+%s",
                     terse__fabric_provider(c->fabric));
            c->desc_block = 1; /* some peers are on shm: comm_desc.c says why */
        }
        TERSE_CHECK_GOTO(setup_wire(c, L.token, deadline), s, fail);
        TERSE_CHECK_GOTO(terse__comm_segment_setup(c, L.rejoin, left_ms(c, deadline)), s, fail);
        if (L.rejoin) TERSE_CHECK_GOTO(announce_back(c), s, fail);
    } else {
        uint8_t name[NAME_BYTES];
        size_t len = sizeof name;
        TERSE_CHECK_GOTO(terse__fabric_name(c->fabric, name, &len), s, fail);
        TERSE_CHECK_GOTO(terse__fabric_set_peers(c->fabric, name, len), s, fail);
    }
    OPENSSL_cleanse(L.token, sizeof L.token);
    *out = c;
    return TERSE_OK;
fail:
    OPENSSL_cleanse(L.token, sizeof L.token);
    c->failed = 1;
    terse__comm_leave(c);
    return s;
}

/* Closing an shm endpoint after a failure may spin on a dead peer's lock
 * like any shm call (see the engine's watchdog): close it on a helper
 * thread and give it a second; if it is stuck, leave it. */
typedef struct {
    terse__fabric *f;
    pthread_mutex_t m;
    pthread_cond_t cv;
    int done, detached;
} closer;

static void *close_main(void *arg) {
    closer *k = arg;
    terse__fabric_close(k->f);
    pthread_mutex_lock(&k->m);
    k->done = 1;
    int detached = k->detached;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->m);
    if (detached) free(k); /* the waiter gave up on us */
    return NULL;
}

/* terse__fabric_flush: a peer the store reports lost, or gone with a
 * goodbye (it closed its endpoint before its store connection), reads
 * nothing more. A store that fails gives no news (and leaves no sentence
 * behind). */
static const uint8_t *lost_map(void *arg) {
    terse_comm *c = arg;
    const uint8_t *lost = NULL;
    if (!c->store) return NULL;
    char why[512];
    snprintf(why, sizeof why, "%s", terse_last_error());
    if (terse__comm_poll_gone(c, &lost) != TERSE_OK) lost = NULL;
    terse__error_restore(why);
    return lost;
}

static void close_fabric(terse_comm *c) {
    if (!c->failed || !c->watched) {
        /* after a clean run, what this rank sent reaches its peers first
         * (net; at most the timeout, 5 s at most) */
        uint64_t budget_ms = c->timeout_ms < 5000 ? c->timeout_ms : 5000;
        if (!c->failed) terse__fabric_flush(c->fabric, budget_ms * 1000000ull, lost_map, c);
        terse__fabric_close(c->fabric);
        return;
    }
    closer *k = calloc(1, sizeof *k);
    pthread_t t;
    if (!k) return; /* leak the fabric rather than risk a spin */
    k->f = c->fabric;
    pthread_mutex_init(&k->m, NULL);
    pthread_cond_init(&k->cv, NULL);
    if (pthread_create(&t, NULL, close_main, k) != 0) {
        free(k);
        return;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 1;
    pthread_mutex_lock(&k->m);
    while (!k->done && pthread_cond_timedwait(&k->cv, &k->m, &until) == 0) {}
    int done = k->done;
    if (!done) k->detached = 1;
    pthread_mutex_unlock(&k->m);
    if (done) {
        pthread_join(t, NULL);
        pthread_mutex_destroy(&k->m);
        pthread_cond_destroy(&k->cv);
        free(k);
    } else {
        pthread_detach(t);
        fprintf(stderr, "terse: rank %d: closing the %s endpoint is stuck on a dead peer's lock; "
                        "left open\n", c->rank, c->provider);
    }
}

void terse__comm_leave(terse_comm *c) {
    if (!c) return;
    if (c->parent) { /* its parent's stats stop adding it in */
        pthread_mutex_lock(&c->parent->stats_lock);
        for (int i = 0; i < 2; i++)
            if (c->parent->twin[i] == c) c->parent->twin[i] = NULL;
        pthread_mutex_unlock(&c->parent->stats_lock);
    }
    if (atomic_load(&c->aborted) || c->refusing) c->failed = 1;
    if (atomic_load(&c->abandoned)) {
        /* The progress thread is stuck inside the provider and may yet
         * touch the communicator and the fabric: tell the others we are
         * gone and leave both allocated (a colocated communicator's
         * store is its parent's: the parent leaves it). */
        if (!c->parent) terse__store_abandon(c->store);
        return;
    }
    /* The endpoint first: once it is closed nothing can complete into our
     * requests or buffers. The store last: after a clean run its goodbye
     * tells the others this rank left rather than died; after a failure we
     * leave without one, so that ranks still waiting on us are told at
     * once that we are gone instead of running into their timeout. */
    close_fabric(c);
    terse__comm_segment_close(c);
    if (c->parent) { /* the store is its parent's: tell the peers' flushes */
        if (!c->failed && c->store)
            (void)terse__store_tell_endpoint_closed(c->store, c->vgen, c->rank >= c->vreal);
    }
    else if (c->failed)
        terse__store_abandon(c->store);
    else
        terse__store_close(c->store);
    for (int i = 0; i < TERSE__COMM_SCRATCH; i++) free(c->scratch[i]);
    free(c->vmap);
    free(c->host_of);
    free(c->ring_at);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->stats_lock);
    free(c);
}

