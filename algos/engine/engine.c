/* The engine: requests, the progress thread, groups and abort.
 *
 * Every collective is a request. A start checks its arguments on the
 * caller's thread, then appends the request to the communicator's queue;
 * one executor at a time takes requests from the head and runs each with
 * the collective's code (algos/ *_run), so requests run in the order they
 * were started -- the same order on every rank, which keeps their tags and
 * messages paired. The executor is
 *
 *   TERSE_PROGRESS=thread (default)  the communicator's progress thread,
 *       which sleeps on a condition variable while the queue is empty and
 *       runs requests while the caller computes;
 *   TERSE_PROGRESS=caller            the caller's thread, inside
 *       terse_request_test / _wait: they run the queue up to and including
 *       the request asked about.
 *
 * A blocking call is a start and a wait. When nothing is queued or
 * running it runs on the caller's thread directly (no hand-off to the
 * progress thread, no allocation), which gives it the latency it had
 * before the engine.
 *
 * Groups: the requests started between terse_group_start and
 * terse_group_end are queued as one unit. Its dense allreduces (no codec)
 * small enough for recursive doubling are fused, per op, into one
 * recursive-doubling exchange over their concatenation: recursive
 * doubling adds every element in the same fixed order whatever the
 * buffer's length, so each member's result is bitwise the one its own
 * call would give. The other members then run one by one in start order.
 *
 * Failure: the executor that sees a request fail quiesces the transport
 * (cancels and drains what is posted, closes the endpoint) before it marks
 * the request done, so no late receive can write into a caller's buffer
 * after terse_request_wait returns; every request still queued completes
 * with the first failure's status. terse_comm_abort only raises a flag:
 * the executor's wait loop sees it within one progress round. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "algos/comm/comm.h"
#include "algos/engine/engine.h"
#include "common/env.h"
#include "common/error.h"

/* Fused groups stay below this many bytes per exchange: recursive doubling
 * sends the whole buffer log2(N) times. */
#define GROUP_FUSE_MAX_BYTES ((size_t)4 << 20)

/* Waiters look at the executor this often, and give up on one stuck in a
 * single provider call for this long (or the timeout, if shorter). */
#define WATCH_PERIOD_NS 20000000L
/* Handing a request to the progress thread and its completion back costs
 * two thread wake-ups, about 25 us each on a 2-vCPU VM: a 4-byte shm
 * allreduce (whose blocking calls are handed over, for the watchdog) took
 * 62 us against 7 us on the caller's thread. So before sleeping, the
 * progress thread watches the queue, and a waiter its request, for this
 * long, yielding the core between looks (ranks often share cores). */
#define HANDOFF_SPIN_NS 50000u
#define WATCH_LIMIT_NS 1000000000ull

const char *terse__engine_kind_name(terse__op_kind k) { return terse__comm_kind_name((int)k); }

/* ---------------------------------------------------------------- running */

static terse_status run_op(terse_comm *c, terse_request *r, int *keep_usable) {
    switch (r->kind) {
    case TERSE__OP_ALLREDUCE:
        return terse__allreduce_run(c, r->a.ar.buf, r->a.ar.n, r->a.ar.codec, r->a.ar.op);
    case TERSE__OP_BROADCAST:
        return terse__broadcast_run(c, r->a.bc.buf, r->a.bc.bytes, r->a.bc.root);
    case TERSE__OP_ALLGATHER:
        return terse__allgather_run(c, r->a.ag.send, r->a.ag.send_bytes, r->a.ag.recv,
                                    r->a.ag.recv_cap, r->a.ag.counts, keep_usable);
    case TERSE__OP_BARRIER:
        return terse__barrier_run(c);
    case TERSE__OP_EXT:
        return r->a.ext.run(c, r, keep_usable);
    case TERSE__OP_GROUP:
        break;
    }
    return TERSE_ERROR(TERSE_ERR_INTERNAL, "rank %d: request of kind %d", c->rank, (int)r->kind);
}

/* A recorded sentence without its leading status name, for quoting. */
const char *terse__engine_unprefixed(const char *e) {
    const char *colon = strstr(e, ": ");
    return strncmp(e, "TERSE_", 6) == 0 && colon ? colon + 2 : e;
}

/* A request that will not run: the communicator was aborted or failed
 * while it waited in the queue. */
static terse_status not_run(terse_comm *c, terse_request *r) {
    if (atomic_load(&c->aborted))
        return TERSE_ERROR(TERSE_ERR_ABORTED,
                           "%s on rank %d: the communicator was aborted (terse_comm_abort) "
                           "before this request ran",
                           terse__engine_kind_name(r->kind), c->rank);
    pthread_mutex_lock(&c->lock);
    terse_status s = c->fail_status ? c->fail_status : TERSE_ERR_INVALID;
    char why[512];
    snprintf(why, sizeof why, "%s", terse__engine_unprefixed(c->failure));
    pthread_mutex_unlock(&c->lock);
    return TERSE_ERROR(s, "%s on rank %d: not run, an earlier request failed: %s",
                       terse__engine_kind_name(r->kind), c->rank, why);
}

static int comm_broken(terse_comm *c) {
    if (atomic_load(&c->aborted)) return 1;
    pthread_mutex_lock(&c->lock);
    int f = c->failed;
    pthread_mutex_unlock(&c->lock);
    return f;
}

/* Run one ordinary request between begin and end; after a failure leave
 * nothing posted. */
/* A replacement rank (TERSE_REJOIN) joined after the others' collectives
 * moved on without it: it may serve a parameter server, nothing else. */
static terse_status refuse_rejoined(const terse_comm *c, const char *what) {
    return TERSE_ERROR(TERSE_ERR_INVALID,
                       "%s on rank %d: this rank rejoined a running job as a lost rank's "
                       "replacement; the others' collectives went on without it, so it can "
                       "only serve a parameter server",
                       what, c->rank);
}

/* The call descriptor of a collective (comm_desc.c): what every rank must
 * agree on. An all-gather's sizes may differ by rank: its kind only. */
static terse_status start_desc(terse_comm *c, terse_request *r) {
    /* Over each host's segments a barrier sends nothing through shm (only
     * the first ranks' messages between hosts) and carries no count or op,
     * and it cannot complete unless every rank is in a barrier: it need not
     * wait for the previous rank's word first (comm_desc.c says why shm
     * calls do), one hop less. A dense-hier-seg all-reduce still waits:
     * ranks whose op differs between hosts (sum on one, average on the
     * other) would see nothing wrong in their data, and the ranks whose
     * previous rank agrees would return TERSE_OK before the others found
     * the difference (a review measured it). */
    c->desc_unblocked = c->lseg_on && r->kind == TERSE__OP_BARRIER;
    switch (r->kind) {
    case TERSE__OP_ALLREDUCE:
        return terse__comm_desc_start(c, r->kind, r->a.ar.n, (uint32_t)r->a.ar.op,
                                      r->a.ar.codec ? terse_codec_spec(r->a.ar.codec) : NULL);
    case TERSE__OP_BROADCAST:
        return terse__comm_desc_start(c, r->kind, r->a.bc.bytes, (uint32_t)r->a.bc.root, NULL);
    default:
        return terse__comm_desc_start(c, r->kind, 0, 0, NULL);
    }
}

static terse_status run_one(terse_comm *c, terse_request *r) {
    if (comm_broken(c)) return not_run(c, r);
    if (c->rejoined && r->kind != TERSE__OP_EXT)
        return refuse_rejoined(c, terse__engine_kind_name(r->kind));
    terse_status s = terse__comm_begin(c, terse__engine_kind_name(r->kind));
    if (s != TERSE_OK) return s;
    int keep_usable = 0;
    if (r->kind != TERSE__OP_EXT) {
        s = terse__comm_check_alive(c);
        if (s == TERSE_OK) s = start_desc(c, r);
        if (s == TERSE_OK) s = run_op(c, r, &keep_usable);
        s = terse__comm_desc_end(c, s);
    } else {
        s = run_op(c, r, &keep_usable);
    }
    s = terse__comm_end(c, s, keep_usable);
    /* after a segment call (engine.h), which may be on the caller's thread
     * where no watchdog looks, none: the failed communicator's free closes
     * the endpoint on a helper thread (comm_join.c) */
    if (s != TERSE_OK && !keep_usable && !terse__engine_seg_only(c, r))
        terse__fabric_quiesce(c->fabric);
    return s;
}

static void finish(terse_comm *c, terse_request *r, terse_status s) {
    /* A watchdog completed everything this executor held and gave up on
     * it: r may be gone, touch nothing. */
    if (atomic_load(&c->abandoned)) return;
    pthread_mutex_lock(&c->lock);
    c->inflight--;
    pthread_mutex_unlock(&c->lock);
    if (r->orphan) { /* freed by its owner inside a group before it ran */
        free(r);
        return;
    }
    r->status = s;
    if (s != TERSE_OK) snprintf(r->error, sizeof r->error, "%s", terse_last_error());
    atomic_store_explicit(&r->done, 1, memory_order_release);
}

/* Complete r with s without running it (lock held). */
static void complete_as(terse_comm *c, terse_request *r, terse_status s) {
    if (atomic_load_explicit(&r->done, memory_order_acquire)) return;
    c->inflight--;
    if (r->orphan) {
        free(r);
        return;
    }
    r->status = s;
    snprintf(r->error, sizeof r->error, "%s", terse_last_error());
    atomic_store_explicit(&r->done, 1, memory_order_release);
}

static int fusable(const terse_request *m, const terse_comm *c) {
    return m->kind == TERSE__OP_ALLREDUCE && !m->a.ar.codec && m->a.ar.n > 0 &&
           m->a.ar.n * sizeof(float) <= terse__rd_max_bytes(c) && c->nranks > 1;
}

/* One fused batch: members from `first` on with this op, up to the byte
 * cap, marked in `taken`. Copy in, one recursive doubling (or the host's
 * shared segment), copy out. */
static terse_status fuse_batch(terse_comm *c, terse_request **members, size_t count,
                               size_t first, char *taken) {
    terse_op op = members[first]->a.ar.op;
    size_t total = 0;
    for (size_t i = first; i < count; i++) {
        terse_request *m = members[i];
        if (taken[i] || !fusable(m, c) || m->a.ar.op != op) continue;
        if (total && (total + m->a.ar.n) * sizeof(float) > GROUP_FUSE_MAX_BYTES) break;
        taken[i] = 2; /* in this batch */
        total += m->a.ar.n;
    }
    float *buf = terse__comm_scratch(c, TERSE__SCRATCH_GROUP, total * sizeof(float));
    if (!buf) return TERSE_ERR_NOMEM;
    size_t off = 0;
    for (size_t i = first; i < count; i++)
        if (taken[i] == 2) {
            memcpy(buf + off, members[i]->a.ar.buf, members[i]->a.ar.n * sizeof(float));
            off += members[i]->a.ar.n;
        }
    terse_status s = terse__comm_desc_start(c, TERSE__OP_GROUP, total, (uint32_t)op, NULL);
    /* the path a single call of this size takes, so each member gets the
     * bits its own call would give: the segment sums every element in rank
     * order whatever the length; recursive doubling's tree does not depend
     * on it either */
    if (s == TERSE_OK)
        s = c->seg ? terse__allreduce_seg(c, buf, total, op == TERSE_OP_AVG)
                   : terse__allreduce_rd(c, buf, total, op == TERSE_OP_AVG);
    TERSE_CHECK(terse__comm_desc_end(c, s));
    size_t members_in_batch = 0;
    for (size_t i = first; i < count; i++) members_in_batch += taken[i] == 2;
    pthread_mutex_lock(&c->stats_lock);
    c->stats.ops += members_in_batch - 1; /* terse__comm_end counts one */
    pthread_mutex_unlock(&c->stats_lock);
    off = 0;
    for (size_t i = first; i < count; i++)
        if (taken[i] == 2) {
            memcpy(members[i]->a.ar.buf, buf + off, members[i]->a.ar.n * sizeof(float));
            off += members[i]->a.ar.n;
            taken[i] = 1;
        }
    return TERSE_OK;
}

/* The fused part of a group: every fusable member, batch by batch. */
static terse_status run_fused(terse_comm *c, terse_request **members, size_t count,
                              char *taken) {
    for (size_t i = 0; i < count; i++) {
        if (taken[i] || !fusable(members[i], c)) continue;
        if (comm_broken(c)) return not_run(c, members[i]);
        if (c->rejoined) return refuse_rejoined(c, "terse_group_end");
        TERSE_CHECK(terse__comm_begin(c, "terse_group_end"));
        terse_status s = terse__comm_end(c, fuse_batch(c, members, count, i, taken), 0);
        if (s != TERSE_OK) {
            terse__fabric_quiesce(c->fabric);
            return s;
        }
    }
    return TERSE_OK;
}

static void run_group(terse_comm *c, terse_request *g) {
    size_t count = 0;
    for (terse_request *m = g->members; m; m = m->next) count++;
    terse_request **members = calloc(count ? count : 1, sizeof *members);
    char *taken = calloc(count ? count : 1, 1);
    terse_status fused = TERSE_OK;
    if (!members || !taken) {
        fused = TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: no memory for a group of %zu", c->rank,
                            count);
        pthread_mutex_lock(&c->lock);
        terse__comm_fail_locked(c, fused);
        pthread_mutex_unlock(&c->lock);
        for (terse_request *m = g->members, *next; m; m = next) {
            next = m->next;
            finish(c, m, fused);
        }
    } else {
        size_t i = 0;
        for (terse_request *m = g->members; m; m = m->next) members[i++] = m;
        /* A failed fused batch fails the whole group with its status. */
        fused = run_fused(c, members, count, taken);
        for (i = 0; i < count; i++) {
            terse_status s = fused;
            if (s == TERSE_OK && !taken[i]) s = run_one(c, members[i]);
            finish(c, members[i], s);
        }
    }
    free(members);
    free(taken);
    if (!atomic_load(&c->abandoned)) free(g);
}

/* ---------------------------------------------------------------- batching */

terse_request *terse__engine_take_ext(terse_comm *c, terse__ext_fn run, const void *obj) {
    pthread_mutex_lock(&c->lock);
    terse_request *h = c->q_head;
    if (!h || h->kind != TERSE__OP_EXT || h->a.ext.run != run || h->a.ext.obj != obj ||
        atomic_load(&c->abandoned)) {
        pthread_mutex_unlock(&c->lock);
        return NULL;
    }
    c->q_head = h->next;
    if (!c->q_head) c->q_tail = NULL;
    h->next = NULL;
    pthread_mutex_unlock(&c->lock);
    return h;
}

void terse__engine_complete_taken(terse_comm *c, terse_request *r, terse_status s) {
    pthread_mutex_lock(&c->stats_lock);
    c->stats.ops++; /* terse__comm_end counts the request that ran */
    pthread_mutex_unlock(&c->stats_lock);
    finish(c, r, s);
}

void terse__engine_untake(terse_comm *c, terse_request **rs, size_t n) {
    pthread_mutex_lock(&c->lock);
    for (size_t i = n; i-- > 0;) {
        rs[i]->next = c->q_head;
        c->q_head = rs[i];
        if (!c->q_tail) c->q_tail = rs[i];
    }
    if (n) pthread_cond_signal(&c->work);
    pthread_mutex_unlock(&c->lock);
}

/* Run request r (the executor holds busy). A group container is freed
 * here; an ordinary request is marked done. */
static void execute(terse_comm *c, terse_request *r) {
    if (r->kind == TERSE__OP_GROUP) run_group(c, r);
    else finish(c, r, run_one(c, r));
}

/* ---------------------------------------------------------------- queue */

/* Take the head of the queue as the executor; lock held. */
static terse_request *take(terse_comm *c) {
    terse_request *r = c->q_head;
    if (!r) return NULL;
    c->q_head = r->next;
    if (!c->q_head) c->q_tail = NULL;
    r->next = NULL;
    c->busy = 1;
    c->running = r;
    return r;
}

/* Lock held on entry and exit; released while r runs. */
void terse__engine_execute_unlocked(terse_comm *c, terse_request *r) {
    pthread_mutex_unlock(&c->lock);
    execute(c, r);
    pthread_mutex_lock(&c->lock);
    if (atomic_load(&c->abandoned)) return; /* the watchdog owns the state now */
    c->busy = 0;
    c->running = NULL;
    pthread_cond_broadcast(&c->idle);
    if (c->q_head) pthread_cond_signal(&c->work);
}

/* Lock held on entry and exit; released while spinning. Nonzero once
 * cond(c, arg) held, or HANDOFF_SPIN_NS passed. */
static int spin_until(terse_comm *c, int (*cond)(terse_comm *, const void *), const void *arg) {
    pthread_mutex_unlock(&c->lock);
    const uint64_t t0 = terse__now_ns();
    int met = 0;
    while (!(met = cond(c, arg)) && terse__now_ns() - t0 < HANDOFF_SPIN_NS) sched_yield();
    pthread_mutex_lock(&c->lock);
    return met;
}

static int new_work(terse_comm *c, const void *seen) {
    return atomic_load_explicit(&c->enqueued, memory_order_acquire) != *(const unsigned *)seen ||
           atomic_load_explicit(&c->aborted, memory_order_relaxed);
}

static int request_done(terse_comm *c, const void *r) {
    (void)c;
    return terse__engine_is_done(r);
}

static void *progress_main(void *arg) {
    terse_comm *c = arg;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        terse_request *r = c->busy ? NULL : take(c);
        if (r) {
            terse__engine_execute_unlocked(c, r);
            continue;
        }
        if (c->stop) break;
        const unsigned seen = atomic_load_explicit(&c->enqueued, memory_order_relaxed);
        if (spin_until(c, new_work, &seen)) continue;
        if (c->q_head || c->stop) continue; /* arrived as the spin ended */
        pthread_cond_wait(&c->work, &c->lock);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* Complete a queued request (a group: its members, and free it). */
static void complete_queued(terse_comm *c, terse_request *q, terse_status s) {
    if (q->kind != TERSE__OP_GROUP) {
        complete_as(c, q, s);
        return;
    }
    for (terse_request *m = q->members, *mn; m; m = mn) {
        mn = m->next;
        complete_as(c, m, s);
    }
    free(q);
}

void terse__engine_enqueue(terse_comm *c, terse_request *r) {
    if (atomic_load(&c->abandoned)) { /* nobody would ever run it */
        complete_queued(c, r, TERSE_ERROR(c->fail_status ? c->fail_status : TERSE_ERR_TIMEOUT,
                                          "%s on rank %d: not run: %s",
                                          terse__engine_kind_name(r->kind), c->rank,
                                          terse__engine_unprefixed(c->failure)));
        return;
    }
    r->next = NULL;
    if (c->q_tail) c->q_tail->next = r;
    else c->q_head = r;
    c->q_tail = r;
    atomic_fetch_add_explicit(&c->enqueued, 1u, memory_order_release);
    pthread_cond_signal(&c->work);
}

int terse__engine_is_done(const terse_request *r) {
    return atomic_load_explicit(&r->done, memory_order_acquire);
}

/* The watchdog, run by a thread waiting for a request (lock held). An
 * executor that has been inside one provider call for longer than
 * WATCH_LIMIT (or the timeout, if shorter) is spinning on a lock in a dead
 * or stopped peer's shared-memory region (libfabric shm): it cannot be
 * interrupted, so the waiters give up on it -- every request it holds or
 * that is queued completes with TERSE_ERR_TIMEOUT naming the peer, the
 * communicator fails, and the stuck thread is abandoned (it touches
 * nothing of ours if it ever returns). Other providers never spin, and a
 * provider call otherwise lasts microseconds. */
static void watchdog(terse_comm *c) {
    int peer = -1;
    const char *what = "?";
    uint64_t age = terse__fabric_call_age(c->fabric, &peer, &what);
    uint64_t limit = (uint64_t)c->timeout_ms * 1000000ull;
    if (limit > WATCH_LIMIT_NS) limit = WATCH_LIMIT_NS;
    if (atomic_load(&c->abandoned)) return;
    /* With TERSE_SHM_RESCUE=1 (shm, libfabric 1.17) a lock a dead process
     * held can be released: then the call goes on, and the loss is
     * reported as a loss. */
    if (age < limit && c->watched && terse__fabric_shm_rescue(c->fabric)) return;
    if (age < limit) return;
    char who[32] = "a peer";
    if (peer >= 0) snprintf(who, sizeof who, "rank %d", peer);
    /* The region's lock may be held by its owner or by any rank that died
     * sending into it: what the store knows of lost ranks says which (a
     * copy under the store's own lock; the stuck thread is inside
     * libfabric, not the store). */
    char lost[160] = "";
    uint8_t *map = c->store && !c->parent ? calloc((size_t)c->nranks, 1) : NULL;
    if (map) {
        (void)terse__store_copy_map(c->store, 0, map); /* the map, whatever the poll says */
        size_t l = 0;
        for (int q = 0; q < c->nranks && l + 24 < sizeof lost; q++)
            if (map[q])
                l += (size_t)snprintf(lost + l, sizeof lost - l, "%s%d", l ? ", " : "; the store "
                                      "reports lost: rank ", q);
    }
    free(map);
    terse_status s = TERSE_ERROR(
        TERSE_ERR_TIMEOUT,
        "rank %d: the %s provider has spun inside %s (%s) for %llu ms: %s, or a rank that sent "
        "to it, died or was stopped holding the lock of its shared-memory region%s; this rank "
        "gives up on its transport",
        c->rank, c->provider, what, who, (unsigned long long)(age / 1000000u), who, lost);
    terse__fabric_abandon(c->fabric);
    atomic_store(&c->abandoned, 1);
    terse__comm_fail_locked(c, s);
    /* Complete what the stuck executor holds, then everything queued. */
    terse_request *held = c->running;
    if (held && held->kind == TERSE__OP_GROUP) {
        for (terse_request *m = held->members; m; m = m->next) complete_as(c, m, s);
    } else if (held) {
        complete_as(c, held, s);
    }
    for (terse_request *q = c->q_head, *next; q; q = next) {
        next = q->next;
        complete_queued(c, q, s);
    }
    c->q_head = c->q_tail = NULL;
    c->running = NULL;
    c->busy = 0; /* no one executes any more: every later call fails at admission */
    pthread_cond_broadcast(&c->idle);
}

/* Until r is done: sleep while another executor works, else (caller
 * mode, or the thread is gone) run the queue head ourselves. Lock held. */
void terse__engine_drive(terse_comm *c, terse_request *r) {
    c->waiters++;
    while (!terse__engine_is_done(r)) {
        if (c->busy || (c->has_thread && !c->stop)) {
            if (spin_until(c, request_done, r)) continue;
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += WATCH_PERIOD_NS;
            if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&c->idle, &c->lock, &until);
            if (!terse__engine_is_done(r) && c->busy) watchdog(c);
            continue;
        }
        terse_request *h = take(c);
        if (!h) { /* cannot happen: r is queued, so the queue is not empty */
            complete_as(c, r, TERSE_ERROR(TERSE_ERR_INTERNAL,
                                          "rank %d: a request waited on is in no queue",
                                          c->rank));
            break;
        }
        terse__engine_execute_unlocked(c, h);
    }
    if (--c->waiters == 0 && c->stop) pthread_cond_broadcast(&c->idle);
}

terse_status terse__engine_init(terse_comm *c) {
    pthread_cond_init(&c->work, NULL);
    pthread_cond_init(&c->idle, NULL);
    c->engine_ready = 1;
    if (c->params.progress_caller) return TERSE_OK;
    if (pthread_create(&c->thread, NULL, progress_main, c) != 0)
        return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: cannot start the progress thread",
                           c->rank);
    c->has_thread = 1;
    /* shm can spin forever inside a provider call (see watchdog): there,
     * blocking calls also run on the progress thread so that the caller's
     * thread stays free to notice. */
    c->watched = strncmp(c->provider, "shm", 3) == 0 && c->nranks > 1; /* shm, shm+net */
    return TERSE_OK;
}

/* Members of a group that never ended; lock held. */
void terse__engine_drop_open_group(terse_comm *c) {
    for (terse_request *m = c->group_head, *next; m; m = next) {
        next = m->next;
        m->in_group = 0;
        complete_as(c, m, TERSE_ERROR(TERSE_ERR_ABORTED,
                                      "rank %d: the communicator was freed inside a group",
                                      c->rank));
    }
    c->group_head = c->group_tail = NULL;
    c->group_depth = 0;
}

/* Requests still in flight are aborted (a free is not collective: the
 * others cannot be waited for); then the thread stops, the queue empties,
 * and we wait until no other thread is inside terse__engine_drive() before anything is
 * destroyed. */
void terse__engine_shutdown(terse_comm *c) {
    if (!c->engine_ready) return;
    pthread_mutex_lock(&c->lock);
    if (c->inflight > 0) atomic_store(&c->aborted, 1);
    c->stop = 1;
    pthread_cond_broadcast(&c->work);
    pthread_cond_broadcast(&c->idle);
    pthread_mutex_unlock(&c->lock);
    if (atomic_load(&c->abandoned)) {
        /* The progress thread is stuck inside the provider: never join it,
         * and leave everything it might touch allocated (terse_comm_free
         * leaks the communicator). */
        pthread_detach(c->thread);
        c->has_thread = 0;
        pthread_mutex_lock(&c->lock);
        terse__engine_drop_open_group(c);
        pthread_mutex_unlock(&c->lock);
        return;
    }
    if (c->has_thread) pthread_join(c->thread, NULL);
    c->has_thread = 0;
    pthread_mutex_lock(&c->lock);
    while (c->busy) pthread_cond_wait(&c->idle, &c->lock); /* a caller-mode executor */
    terse_request *r;
    while ((r = take(c)) != NULL) terse__engine_execute_unlocked(c, r);
    terse__engine_drop_open_group(c);
    pthread_cond_broadcast(&c->idle);
    while (c->waiters > 0) pthread_cond_wait(&c->idle, &c->lock);
    pthread_mutex_unlock(&c->lock);
    pthread_cond_destroy(&c->work);
    pthread_cond_destroy(&c->idle);
    c->engine_ready = 0;
}

