/* The communicator: joining a job, leaving it, statistics, and the
 * services every collective shares (deadline, tags, accounting, waiting,
 * failure).
 *
 * Joining, in order:
 *   1. Resolve rank, size, address, provider, token and timeout from the
 *      config and the launcher's environment (transport/launch_env.h).
 *   2. Connect to rank 0's bootstrap store (rank 0 starts it), which
 *      authenticates us with the job token.
 *   3. Publish our host name through the store; if every rank is on this
 *      host, "auto" may choose shared memory.
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

#include "algos/comm.h"
#include "common/bytes.h"
#include "common/error.h"
#include "transport/launch_env.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>

#define HOST_BYTES 256
#define NAME_BYTES 256

/* After the store reports a lost rank (or its own end), requests already
 * on the wire still get this long to complete: a collective whose data has
 * all been sent may still finish, and the transport, which sees the peer
 * directly, may have a more precise error to give. A quarter of the 1 s
 * within which a notice must fail every call (terse.h), so that the rest
 * covers the store's detection and a loaded or sanitized machine's
 * scheduling: at 0.5 s a call under ASan on a busy two-core machine once
 * failed after 1.06 s. */
#define STORE_LOSS_GRACE_NS 250000000ull
/* How long a transport error waits for the store's notice of the first
 * cause (explain()). */
#define STORE_EXPLAIN_WAIT_NS 500000000ull

/* How often the store is polled for loss notices, across waits and
 * collectives alike: however short the waits, a notice is seen within
 * this period plus the grace. */
#define ALIVE_PERIOD_NS 1000000ull

static terse_status comm_alive(void *arg) {
    terse_comm *c = arg;
    uint64_t now = terse__now_ns();
    if (c->alive_checked_ns && now - c->alive_checked_ns < ALIVE_PERIOD_NS && !c->store_lost_ns)
        return TERSE_OK;
    c->alive_checked_ns = now;
    terse_status s = terse__store_check(c->store);
    if (s == TERSE_OK) return TERSE_OK;
    if (!c->store_lost_ns) c->store_lost_ns = now;
    if (now - c->store_lost_ns < STORE_LOSS_GRACE_NS) return TERSE_OK;
    c->store_said = 1;
    return s;
}

/* What is left of init's deadline, at least 1 ms (a store call given 0
 * would take the whole timeout instead). */
static int left_ms(const terse_comm *c, uint64_t deadline_ns) {
    uint64_t now = terse__now_ns();
    (void)c;
    if (now >= deadline_ns) return 1;
    uint64_t ms = (deadline_ns - now + 999999u) / 1000000u;
    return ms > (uint64_t)INT32_MAX ? INT32_MAX : (int)ms;
}

/* What makes two processes "on the same host" for shared memory: the
 * kernel's boot id (two machines, or containers on two machines, may share
 * a host name, never a boot id), the network namespace, and the host name
 * for the messages. */
static void host_identity(char out[HOST_BYTES]) {
    char boot[64] = "?", ns[64] = "?", name[128] = "?";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) strcpy(boot, "?");
        boot[strcspn(boot, "\n")] = 0;
        fclose(f);
    }
    ssize_t n = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
    ns[n > 0 ? n : 0] = 0;
    if (gethostname(name, sizeof name - 1) != 0) strcpy(name, "?");
    name[sizeof name - 1] = 0;
    memset(out, 0, HOST_BYTES);
    snprintf(out, HOST_BYTES, "%s|%s|%s", boot, ns, name);
}

/* Step 3: 1 if every rank's host identity equals ours. */
static terse_status same_host_check(terse_comm *c, int timeout_ms, int *same) {
    char mine[HOST_BYTES];
    host_identity(mine);
    char *all = malloc((size_t)c->nranks * HOST_BYTES);
    if (!all) return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: allocating host names", c->rank);
    terse_status s = terse__store_allgather(c->store, mine, HOST_BYTES, all, timeout_ms);
    if (s == TERSE_OK) {
        *same = 1;
        for (int r = 0; r < c->nranks; r++)
            if (memcmp(all + (size_t)r * HOST_BYTES, mine, HOST_BYTES) != 0) *same = 0;
    }
    free(all);
    return s;
}

/* Steps 4-6 for more than one rank: exchange endpoint names. Every name
 * travels as a u32 length and NAME_BYTES of name, so ranks whose names
 * differ in length are caught here rather than as a mismatched AV. */
static terse_status exchange_names(terse_comm *c, uint64_t deadline) {
    uint8_t mine[4 + NAME_BYTES] = {0};
    size_t len = NAME_BYTES;
    TERSE_CHECK(terse__fabric_name(c->fabric, mine + 4, &len));
    terse__put_u32(mine, (uint32_t)len);
    size_t N = (size_t)c->nranks;
    uint8_t *all = malloc(N * sizeof mine), *names = malloc(N * len + 1);
    terse_status s = TERSE_OK;
    if (!all || !names)
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
    }
    TERSE_CHECK_GOTO(terse__fabric_set_peers(c->fabric, names, len), s, out);
    /* 6: everyone has inserted everyone */
    uint8_t ready = 1;
    TERSE_CHECK_GOTO(terse__store_allgather(c->store, &ready, 1, all, left_ms(c, deadline)), s, out);
out:
    free(all);
    free(names);
    return s;
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

terse_status terse_comm_init(const terse_comm_config *config, terse_comm **out) {
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
            terse_comm_free(c);
            return s;
        }
        if (s != TERSE_OK) goto fail;
        TERSE_CHECK_GOTO(same_host_check(c, left_ms(c, deadline), &same), s, fail);
    }
    TERSE_CHECK_GOTO(terse__fabric_open(L.provider[0] ? L.provider : "auto", same, c->rank,
                                        c->nranks, &c->fabric),
                     s, fail);
    snprintf(c->provider, sizeof c->provider, "%s", terse__fabric_provider(c->fabric));
    if (c->nranks > 1) {
        TERSE_CHECK_GOTO(exchange_names(c, deadline), s, fail);
        TERSE_CHECK_GOTO(setup_wire(c, L.token, deadline), s, fail);
        if (L.rejoin) TERSE_CHECK_GOTO(announce_back(c), s, fail);
    } else {
        uint8_t name[NAME_BYTES];
        size_t len = sizeof name;
        TERSE_CHECK_GOTO(terse__fabric_name(c->fabric, name, &len), s, fail);
        TERSE_CHECK_GOTO(terse__fabric_set_peers(c->fabric, name, len), s, fail);
    }
    TERSE_CHECK_GOTO(terse__engine_init(c), s, fail);
    OPENSSL_cleanse(L.token, sizeof L.token);
    *out = c;
    return TERSE_OK;
fail:
    OPENSSL_cleanse(L.token, sizeof L.token);
    c->failed = 1;
    terse_comm_free(c);
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

/* terse__fabric_flush: a peer the store reports lost reads nothing more.
 * A store that fails gives no news (and leaves no sentence behind). */
static const uint8_t *lost_map(void *arg) {
    terse_comm *c = arg;
    const uint8_t *lost = NULL;
    if (!c->store) return NULL;
    char why[512];
    snprintf(why, sizeof why, "%s", terse_last_error());
    if (terse__store_poll_lost(c->store, &lost) != TERSE_OK) lost = NULL;
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

void terse_comm_free(terse_comm *c) {
    if (!c) return;
    /* In a child forked after init the progress thread does not exist and
     * the endpoint and store belong to the parent: touch nothing. */
    if (c->pid != getpid()) return;
    /* Requests first: whatever is still queued or running is aborted and
     * completed, and the progress thread is gone before the endpoint. */
    terse__engine_shutdown(c);
    if (atomic_load(&c->aborted) || c->refusing) c->failed = 1;
    if (atomic_load(&c->abandoned)) {
        /* The progress thread is stuck inside the provider and may yet
         * touch the communicator and the fabric: tell the others we are
         * gone and leave both allocated. */
        terse__store_abandon(c->store);
        return;
    }
    /* The endpoint first: once it is closed nothing can complete into our
     * requests or buffers. The store last: after a clean run its goodbye
     * tells the others this rank left rather than died; after a failure we
     * leave without one, so that ranks still waiting on us are told at
     * once that we are gone instead of running into their timeout. */
    close_fabric(c);
    if (c->failed)
        terse__store_abandon(c->store);
    else
        terse__store_close(c->store);
    for (int i = 0; i < TERSE__COMM_SCRATCH; i++) free(c->scratch[i]);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->stats_lock);
    free(c);
}

int terse_comm_rank(const terse_comm *c) { return c ? c->rank : -1; }
int terse_comm_size(const terse_comm *c) { return c ? c->nranks : 0; }
const char *terse_comm_provider(const terse_comm *c) { return c ? c->provider : ""; }

terse_status terse_comm_get_stats(const terse_comm *c, terse_comm_stats *stats) {
    if (!c || !stats) return TERSE_ERROR(TERSE_ERR_INVALID, "terse_comm_get_stats: NULL argument");
    if (c->pid != getpid()) /* its locks may have been held at the fork */
        return TERSE_ERROR(TERSE_ERR_INVALID, "terse_comm_get_stats: used in a child process "
                                              "forked after terse_comm_init");
    if (stats->size < sizeof(size_t))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_comm_get_stats: stats->size is %zu; start from "
                           "TERSE_COMM_STATS_INIT",
                           stats->size);
    /* Fill only what the caller's (possibly older) struct holds. */
    size_t size = stats->size < sizeof c->stats ? stats->size : sizeof c->stats;
    terse_comm *m = (terse_comm *)(uintptr_t)c; /* the lock, not the stats, changes */
    pthread_mutex_lock(&m->stats_lock);
    memcpy((char *)stats + sizeof(size_t), (const char *)&c->stats + sizeof(size_t),
           size - sizeof(size_t));
    pthread_mutex_unlock(&m->stats_lock);
    return TERSE_OK;
}

void terse_comm_reset_stats(terse_comm *c) {
    if (!c || c->pid != getpid()) return;
    pthread_mutex_lock(&c->stats_lock);
    c->stats = (terse_comm_stats)TERSE_COMM_STATS_INIT;
    pthread_mutex_unlock(&c->stats_lock);
}

/* ---- services for the algorithms ---- */

void terse__comm_fail_locked(terse_comm *c, terse_status s) {
    if (c->failed) return;
    c->failed = 1;
    c->fail_status = s;
    snprintf(c->failure, sizeof c->failure, "%s", terse_last_error());
}

void terse__comm_refuse_locked(terse_comm *c) {
    if (c->refusing || c->failed) return;
    c->refusing = 1;
    snprintf(c->failure, sizeof c->failure, "%s", terse_last_error());
}

terse_status terse__comm_aborted_error(const terse_comm *c, const char *what) {
    return TERSE_ERROR(TERSE_ERR_ABORTED,
                       "%s on rank %d: the communicator was aborted (terse_comm_abort); it can "
                       "only be freed",
                       what, c->rank);
}

terse_status terse__comm_begin(terse_comm *c, const char *what) {
    if (!c) return TERSE_ERROR(TERSE_ERR_INVALID, "%s: communicator is NULL", what);
    if (atomic_load(&c->aborted)) return terse__comm_aborted_error(c, what);
    pthread_mutex_lock(&c->lock);
    terse_status s = TERSE_OK;
    if (c->failed)
        s = TERSE_ERROR(TERSE_ERR_INVALID, "%s on rank %d: communicator failed earlier: %s", what,
                        c->rank, c->failure);
    pthread_mutex_unlock(&c->lock);
    /* store_lost_ns is kept: a notice's grace runs from its arrival, not
     * from the start of each collective. */
    c->store_said = 0;
    return s;
}

terse_status terse__comm_poll_abort(terse_comm *c, const char *where) {
    if (!atomic_load_explicit(&c->aborted, memory_order_relaxed)) return TERSE_OK;
    return TERSE_ERROR(TERSE_ERR_ABORTED, "rank %d: aborted (terse_comm_abort) while %s", c->rank,
                       where);
}

terse_status terse__comm_check_alive(terse_comm *c) {
    return c->store ? comm_alive(c) : TERSE_OK;
}

terse_status terse__comm_end(terse_comm *c, terse_status s, int keep_usable) {
    if (s != TERSE_OK && s != TERSE_ERR_ABORTED && atomic_load(&c->aborted)) {
        /* This rank aborted: whatever else went wrong meanwhile (a peer
         * that aborted too and closed its end first), the caller asked. */
        char why[400];
        snprintf(why, sizeof why, "%s", terse__comm_last_sentence());
        s = TERSE_ERROR(TERSE_ERR_ABORTED,
                        "rank %d: aborted (terse_comm_abort); the collective also saw: %s",
                        c->rank, why);
    }
    if (s == TERSE_OK) {
        pthread_mutex_lock(&c->stats_lock);
        c->stats.ops++;
        pthread_mutex_unlock(&c->stats_lock);
    } else if (!keep_usable) {
        pthread_mutex_lock(&c->lock);
        terse__comm_fail_locked(c, s);
        pthread_mutex_unlock(&c->lock);
    }
    return s;
}

void terse__comm_next_phase(terse_comm *c) {
    c->seq++;
    /* The tag holds the low 20 bits; the MACs bind the rest. */
    terse__fabric_set_epoch(c->fabric, (uint32_t)(c->seq >> TERSE__TAG_SEQ_BITS));
}

uint64_t terse__comm_tag(const terse_comm *c, uint64_t msg) {
    uint64_t seq = c->seq & ((1u << TERSE__TAG_SEQ_BITS) - 1);
    return (seq << TERSE__TAG_MSG_BITS) | (msg & ((1u << TERSE__TAG_MSG_BITS) - 1));
}

static void count(terse_comm *c, size_t len, terse__bytes_kind kind, int send) {
    pthread_mutex_lock(&c->stats_lock);
    if (send) {
        if (kind == TERSE__BYTES_PAYLOAD) c->stats.payload_bytes_sent += len;
        c->stats.wire_bytes_sent += len;
    } else {
        if (kind == TERSE__BYTES_PAYLOAD) c->stats.payload_bytes_recv += len;
        c->stats.wire_bytes_recv += len;
    }
    pthread_mutex_unlock(&c->stats_lock);
}

terse_status terse__comm_isend(terse_comm *c, int peer, uint64_t tag, const void *buf,
                               size_t len, terse__bytes_kind kind, terse__fabric_req *req) {
    TERSE_CHECK(terse__fabric_isend(c->fabric, peer, tag, buf, len, req));
    count(c, len, kind, 1);
    return TERSE_OK;
}

terse_status terse__comm_irecv(terse_comm *c, int peer, uint64_t tag, void *buf, size_t len,
                               terse__bytes_kind kind, terse__fabric_req *req) {
    TERSE_CHECK(terse__fabric_irecv(c->fabric, peer, tag, buf, len, req));
    count(c, len, kind, 0);
    return TERSE_OK;
}

static void add_seconds(terse_comm *c, double *field, uint64_t t0_ns) {
    double dt = (double)(terse__now_ns() - t0_ns) * 1e-9;
    pthread_mutex_lock(&c->stats_lock);
    *field += dt;
    pthread_mutex_unlock(&c->stats_lock);
}

const char *terse__comm_last_sentence(void) {
    const char *e = terse_last_error(), *colon = strstr(e, ": ");
    return strncmp(e, "TERSE_", 6) == 0 && colon ? colon + 2 : e;
}

/* A transport error names the peer this rank was talking to, which may only
 * be a bystander: when rank 2 dies, rank 0 notices first, gives up and
 * leaves, and rank 1 then sees rank 0 vanish. The store knows the first
 * cause (it reports ranks that dropped without a goodbye), so on a lost
 * peer we ask it, giving its notice a short grace to arrive; on a timeout
 * the store has had the whole timeout already, so we ask once. */
static terse_status explain(terse_comm *c, terse_status s) {
    char here[400];
    snprintf(here, sizeof here, "%s", terse__comm_last_sentence());
    uint64_t until = terse__now_ns() + (s == TERSE_ERR_PEER_LOST ? STORE_EXPLAIN_WAIT_NS : 0);
    for (;;) {
        if (terse__store_check(c->store) != TERSE_OK) {
            char cause[400];
            snprintf(cause, sizeof cause, "%s", terse__comm_last_sentence());
            return TERSE_ERROR(TERSE_ERR_PEER_LOST, "%s; on rank %d this surfaced as: %s", cause,
                               c->rank, here);
        }
        if (terse__now_ns() >= until || atomic_load(&c->aborted)) break;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    return s; /* terse_last_error() still holds `here` */
}

/* A failure after forged chunks arrived: the forgery is the cause to
 * report (the real peer, displaced, may have failed or gone since). */
static terse_status forged_cause(terse_comm *c, terse_status s) {
    char why[400];
    snprintf(why, sizeof why, "%s", terse__comm_last_sentence());
    char who[128] = "";
    for (int r = 0; r < c->nranks; r++) {
        uint64_t k = terse__fabric_auth_failures(c->fabric, r);
        size_t l = strlen(who);
        if (k && l < sizeof who - 32)
            snprintf(who + l, sizeof who - l, "%s%llu from rank %d", l ? ", " : "",
                     (unsigned long long)k, r);
    }
    return TERSE_ERROR(TERSE_ERR_AUTH,
                       "rank %d: chunks that failed authentication arrived (%s): another process "
                       "may have taken that rank's place, or a relay is altering its messages; "
                       "then: %s (%s)",
                       c->rank, who, why, terse_status_name(s));
}

/* After a wait or a progress round: the store's view of a failure, the
 * transport's counts, an authentication failure as the cause, the time. */
static terse_status wait_done(terse_comm *c, terse_status s, uint64_t t0) {
    if ((s == TERSE_ERR_PEER_LOST || s == TERSE_ERR_TIMEOUT) && c->store && !c->store_said &&
        !terse__fabric_is_abandoned(c->fabric))
        s = explain(c, s);
    /* The transport's own counts, mirrored into the stats. */
    uint64_t forged = terse__fabric_auth_failures(c->fabric, -1);
    uint64_t strangers = terse__fabric_stranger_drops(c->fabric);
    if (forged != c->stats.auth_failures || strangers != c->stats.stranger_drops) {
        pthread_mutex_lock(&c->stats_lock);
        c->stats.auth_failures = forged;
        c->stats.stranger_drops = strangers;
        pthread_mutex_unlock(&c->stats_lock);
    }
    if (forged && s != TERSE_OK && s != TERSE_ERR_AUTH && s != TERSE_ERR_ABORTED)
        s = forged_cause(c, s);
    add_seconds(c, &c->stats.network_seconds, t0);
    return s;
}

terse_status terse__comm_wait(terse_comm *c, terse__fabric_req *reqs, size_t n) {
    if (n == 0) return TERSE_OK;
    uint64_t t0 = terse__now_ns();
    terse__fabric_wait_opts o = {UINT64_MAX, (uint64_t)c->timeout_ms * 1000000ull, &c->aborted,
                                 c->store ? comm_alive : NULL, c, 0, 0};
    return wait_done(c, terse__fabric_wait_ex(c->fabric, reqs, n, &o), t0);
}

terse_status terse__comm_progress(terse_comm *c) {
    uint64_t t0 = terse__now_ns();
    terse__fabric_wait_opts o = {UINT64_MAX, 0, &c->aborted, NULL, NULL, 0, 0};
    terse_status s = terse__fabric_wait_ex(c->fabric, NULL, 0, &o); /* one round */
    if (s == TERSE_OK) s = terse__comm_check_alive(c);
    if (s == TERSE_OK) s = terse__comm_poll_abort(c, "between two pieces of a collective");
    return wait_done(c, s, t0);
}

void *terse__comm_scratch(terse_comm *c, int slot, size_t bytes) {
    if (bytes == 0) bytes = 64;
    if (c->scratch_cap[slot] >= bytes) return c->scratch[slot];
    free(c->scratch[slot]);
    c->scratch[slot] = NULL;
    c->scratch_cap[slot] = 0;
    size_t want = (bytes + 63) & ~(size_t)63;
    void *p = NULL;
    if (want < bytes || posix_memalign(&p, 64, want) != 0) {
        TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: allocating %zu bytes of collective scratch",
                    c->rank, bytes);
        return NULL;
    }
    c->scratch[slot] = p;
    c->scratch_cap[slot] = want;
    return p;
}

void terse__comm_codec_time(terse_comm *c, uint64_t t0_ns) {
    add_seconds(c, &c->stats.codec_seconds, t0_ns);
}
