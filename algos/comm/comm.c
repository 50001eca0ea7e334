/* The communicator's state as the algorithms see it: statistics, and the
 * services every collective shares (deadline, tags, accounting, waiting,
 * failure). Joining and leaving are in comm_join.c. */
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
    terse_status d = terse__comm_desc_check(c); /* the arguments agree? */
    if (d != TERSE_OK) return d;
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
    terse_comm_stats all = c->stats;
    /* A colocated parameter server's endpoints (algos/engine/engine_twin.c): their
     * traffic is this rank's too. */
    for (int i = 0; i < 2; i++) {
        terse_comm *t = c->twin[i];
        if (!t) continue;
        pthread_mutex_lock(&t->stats_lock);
        all.payload_bytes_sent += t->stats.payload_bytes_sent;
        all.payload_bytes_recv += t->stats.payload_bytes_recv;
        all.wire_bytes_sent += t->stats.wire_bytes_sent;
        all.wire_bytes_recv += t->stats.wire_bytes_recv;
        all.codec_seconds += t->stats.codec_seconds;
        all.network_seconds += t->stats.network_seconds;
        all.auth_failures += t->stats.auth_failures;
        all.stranger_drops += t->stats.stranger_drops;
        all.control_bytes_sent += t->stats.control_bytes_sent;
        all.control_bytes_recv += t->stats.control_bytes_recv;
        pthread_mutex_unlock(&t->stats_lock);
    }
    memcpy((char *)stats + sizeof(size_t), (const char *)&all + sizeof(size_t),
           size - sizeof(size_t));
    pthread_mutex_unlock(&m->stats_lock);
    return TERSE_OK;
}

void terse_comm_reset_stats(terse_comm *c) {
    if (!c || c->pid != getpid()) return;
    pthread_mutex_lock(&c->stats_lock);
    c->stats = (terse_comm_stats)TERSE_COMM_STATS_INIT;
    for (int i = 0; i < 2; i++) {
        terse_comm *t = c->twin[i];
        if (!t) continue;
        pthread_mutex_lock(&t->stats_lock);
        t->stats = (terse_comm_stats)TERSE_COMM_STATS_INIT;
        pthread_mutex_unlock(&t->stats_lock);
    }
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
    if (kind == TERSE__BYTES_CONTROL) {
        if (send) c->stats.control_bytes_sent += len;
        else c->stats.control_bytes_recv += len;
    } else if (send) {
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
terse_status terse__comm_explain(terse_comm *c, terse_status s, uint64_t grace_ns,
                                 int told_only) {
    char here[400], full[512];
    snprintf(here, sizeof here, "%s", terse__comm_last_sentence());
    snprintf(full, sizeof full, "%s", terse_last_error());
    uint64_t until = terse__now_ns() + grace_ns;
    for (;;) {
        terse_status st = terse__store_check(c->store);
        if (st == TERSE_ERR_PEER_LOST && told_only) {
            terse__error_restore(full); /* the loss's sentence is not ours */
            break;
        }
        if (st != TERSE_OK) { /* PEER_LOST, or the status a failed rank told */
            char cause[400];
            snprintf(cause, sizeof cause, "%s", terse__comm_last_sentence());
            /* this rank's sentence is already the cause (it heard it from
             * the store first), or the cause with a location added: say it
             * once, the longer form */
            const size_t lc = strlen(cause), lh = strlen(here);
            if (lc && lh && strncmp(cause, here, lc < lh ? lc : lh) == 0) {
                if (lh >= lc) {
                    terse__error_restore(full);
                    return st;
                }
                return TERSE_ERROR(st, "%s", cause);
            }
            return TERSE_ERROR(st, "%s; on rank %d this surfaced as: %s", cause, c->rank, here);
        }
        if (terse__now_ns() >= until || atomic_load(&c->aborted)) break;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    return s; /* terse_last_error() still holds `full` */
}

static terse_status explain(terse_comm *c, terse_status s) {
    return terse__comm_explain(c, s, s == TERSE_ERR_PEER_LOST ? STORE_EXPLAIN_WAIT_NS : 0, 0);
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
    /* ... unless the ranks' arguments disagree (the call descriptors, or
     * another rank's word through the store): a chunk of another length
     * fails its MAC, and the disagreement is the cause */
    if (forged && s != TERSE_OK && s != TERSE_ERR_AUTH && s != TERSE_ERR_ABORTED &&
        !c->desc_failed && s != TERSE_ERR_SHAPE && s != TERSE_ERR_CODEC_MISMATCH)
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
