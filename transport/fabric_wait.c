/* Waiting for requests (with a deadline, an idle limit, an abort flag),
 * one progress round without waiting, tolerant mode's cancel and give up,
 * and the endings: quiesce after a failure, net's flush before an orderly
 * close, dropping every request's state, and the watchdog's abandon. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "transport/fabric_impl.h"

/* Idle progress rounds before we start yielding the CPU: ranks often share
 * cores, and a peer that is descheduled cannot send us anything. After a
 * longer silence (a straggler, a dead peer awaiting its timeout) we also
 * nap briefly each round, which costs at most that nap in latency. */
#define IDLE_SPINS 16
#define NAP_AFTER_NS 10000000u
#define NAP_NS 20000
#define ALIVE_PERIOD_NS 1000000u

/* One idle round of a progress loop that saw no event for quiet_ns: nap
 * once that reaches nap_after_ns, else yield after `spins` idle rounds. */
static void back_off(uint64_t quiet_ns, uint64_t nap_after_ns, unsigned *idle, unsigned spins) {
    if (quiet_ns >= nap_after_ns) {
        struct timespec nap = {0, NAP_NS};
        nanosleep(&nap, NULL);
    } else if (++*idle >= spins) {
        sched_yield();
    }
}

/* ---------------------------------------------------------------- progress, tolerant mode */

/* Tolerant mode: recycle the state of failed requests once nothing of
 * theirs is posted any more. */
static void sweep_failed(terse__fabric *f) {
    terse__fabric_op *op = f->active_head;
    while (op) {
        terse__fabric_op *next = op->next;
        if (op->req->error && op->inflight == 0) terse__fabric_op_put(f, op);
        op = next;
    }
}

void terse__fabric_set_tolerant(terse__fabric *f) {
    if (f) f->tolerant = 1;
    if (f && f->side) f->side->tolerant = 1;
}

/* The side endpoint failed: fail this one with its status and keep its
 * sentence (terse_last_error already holds it). */
static terse_status side_failed(terse__fabric *f) {
    if (!f->failed) f->failed = f->side->failed;
    return f->side->failed;
}

/* One round on the side endpoint, if any. */
static terse_status side_round(terse__fabric *f, size_t *events) {
    if (!f->side) return TERSE_OK;
    if (f->side->failed) return side_failed(f);
    terse_status st = terse__fabric_poll(f->side, events);
    if (st == TERSE_OK) st = terse__fabric_post_pending(f->side);
    if (st != TERSE_OK) {
        if (!f->side->failed) f->side->failed = st;
        return side_failed(f);
    }
    if (f->side->tolerant) sweep_failed(f->side);
    return TERSE_OK;
}

terse_status terse__fabric_progress(terse__fabric *f, size_t *events) {
    if (!f || !events) return TERSE_ERROR(TERSE_ERR_INVALID, "fabric_progress: NULL argument");
    *events = 0;
    if (f->failed)
        return TERSE_ERROR(f->failed, "rank %d: the transport failed earlier; it can only be closed",
                           f->rank);
    TERSE_CHECK(terse__fabric_poll(f, events));
    TERSE_CHECK(terse__fabric_post_pending(f));
    if (f->tolerant) sweep_failed(f);
    return side_round(f, events);
}

/* Give back the slots of op (every op: NULL) waiting in the repost list. */
static void unrepost(terse__fabric *f, terse__fabric_op *op) {
    terse__fabric_slot **pp = &f->repost;
    while (*pp) {
        terse__fabric_slot *s = *pp;
        if (op && s->op != op) {
            pp = &s->next_free;
            continue;
        }
        *pp = s->next_free;
        if (s->op && s->op->inflight) s->op->inflight--;
        terse__fabric_slot_put(f, s, 0);
    }
}


int terse__fabric_req_idle(const terse__fabric *f, const terse__fabric_req *r) {
    if (!r->error) return r->done >= r->chunks;
    f = terse__fabric_route((terse__fabric *)(uintptr_t)f, r->peer);
    return terse__fabric_op_of(f, r) == NULL;
}

int terse__fabric_cancel(terse__fabric *f, terse__fabric_req *r) {
    if (f && r) f = terse__fabric_route(f, r->peer);
    if (!f || !r || !f->ep) return 1;
    terse__fabric_op *op = terse__fabric_op_of(f, r);
    if (!op) return 1;
    if (!f->tolerant) return 0;
    if (!r->error) r->error = TERSE_ERR_ABORTED; /* post nothing more of it */
    unrepost(f, op);
    for (size_t i = 0; i < f->tx_slots + f->rx_slots; i++)
        if (f->slots[i].op == op) {
            terse__fabric_enter(f, r->peer, "fi_cancel");
            (void)fi_cancel(&f->ep->fid, &f->slots[i].ctx);
            terse__fabric_leave(f);
        }
    uint64_t until = terse__now_ns() + 100000000ull;
    for (;;) {
        op = terse__fabric_op_of(f, r);
        if (!op) return 1; /* it completed meanwhile and was recycled */
        unrepost(f, op);
        if (!op->inflight) {
            terse__fabric_op_put(f, op);
            return 1;
        }
        if (terse__now_ns() >= until || f->failed) return 0;
        size_t ev = 0;
        if (terse__fabric_poll(f, &ev) != TERSE_OK) return 0;
        if (!ev) sched_yield();
    }
}

typedef struct terse__fabric_orphan {
    terse__fabric_req req;
    struct terse__fabric_orphan *next;
} terse__fabric_orphan;

int terse__fabric_give_up(terse__fabric *f, terse__fabric_req *r) {
    if (!f || !r) return 1;
    f = terse__fabric_route(f, r->peer);
    if (!f->tolerant) return 0;
    terse__fabric_op *op = terse__fabric_op_of(f, r);
    if (!op) return 1;
    terse__fabric_orphan *o = malloc(sizeof *o);
    if (!o) return 0;
    o->req = *r; /* what completes of it later counts here */
    if (!o->req.error) o->req.error = TERSE_ERR_ABORTED; /* post nothing more of it */
    o->next = f->orphans;
    f->orphans = o;
    for (; op; op = terse__fabric_op_of(f, r)) {
        unrepost(f, op);
        op->req = &o->req;
    }
    if (!r->error) r->error = TERSE_ERR_ABORTED;
    return 1;
}

int terse__fabric_req_done(const terse__fabric_req *r) {
    return r->error || r->done >= r->chunks;
}

/* ---------------------------------------------------------------- wait */

static size_t bytes_done(const terse__fabric *f, const terse__fabric_req *r) {
    for (const terse__fabric_op *op = f->active_head; op; op = op->next)
        if (op->req == r) return op->bytes_done;
    return r->done == r->chunks ? r->len : 0;
}

static terse_status timed_out(terse__fabric *f, const terse__fabric_req *r, uint64_t start,
                              uint64_t idle_ns) {
    uint64_t forged = f->auth_fail ? f->auth_fail[r->peer] : 0;
    if (forged) {
        /* The MAC covers the length, so a rank that passed another size
         * than this one looks like a forger: say so when the lengths differ. */
        char sizes[200] = "";
        if (f->forged_len_peer == r->peer && f->forged_len_got == SIZE_MAX)
            snprintf(sizes, sizeof sizes,
                     "; or the ranks passed different sizes: the last chunk dropped carried "
                     "more than the %zu bytes expected", f->forged_len_want);
        else if (f->forged_len_peer == r->peer)
            snprintf(sizes, sizeof sizes,
                     "; or the ranks passed different sizes: the last chunk dropped carried "
                     "%zu bytes where %zu were expected",
                     f->forged_len_got, f->forged_len_want);
        return terse__fabric_fail(
            f, TERSE_ERROR(TERSE_ERR_AUTH,
                           "rank %d: %llu chunks claiming to come from rank %d failed "
                           "authentication, and the real rank %d sent nothing that "
                           "checks for %llu ms (tag %#llx, %zu of %zu bytes done, "
                           "provider %s): another process may have taken rank %d's "
                           "place, or a relay is altering its messages%s",
                           f->rank, (unsigned long long)forged, r->peer, r->peer,
                           (unsigned long long)((terse__now_ns() - start) / 1000000u),
                           (unsigned long long)r->tag, bytes_done(f, r), r->len, f->provider,
                           r->peer, sizes));
    }
    char why[96] = "";
    if (idle_ns)
        snprintf(why, sizeof why, " with no progress for the last %llu ms",
                 (unsigned long long)(idle_ns / 1000000u));
    return terse__fabric_fail(
        f, TERSE_ERROR(TERSE_ERR_TIMEOUT,
                       "rank %d: timed out after %llu ms%s %s rank %d (tag %#llx, %zu of "
                       "%zu bytes done, provider %s)",
                       f->rank, (unsigned long long)((terse__now_ns() - start) / 1000000u), why,
                       terse__fabric_dir_text(r), r->peer, (unsigned long long)r->tag,
                       bytes_done(f, r), r->len, f->provider));
}

/* A timeout on the endpoint that carries r's peer fails both. */
static terse_status routed_timeout(terse__fabric *f, terse__fabric *via,
                                   const terse__fabric_req *r, uint64_t start, uint64_t idle_ns) {
    terse_status st = timed_out(via, r, start, idle_ns);
    return via == f ? st : terse__fabric_fail(f, st);
}

/* Each round: drain completions, post what the windows now allow, check
 * the requests, then abort, the limits and the caller's liveness probe;
 * back off (yield, later nap) while nothing completes. */
terse_status terse__fabric_wait_ex(terse__fabric *f, terse__fabric_req *reqs, size_t n,
                                   const terse__fabric_wait_opts *o) {
    if (!f || (n && !reqs) || !o)
        return TERSE_ERROR(TERSE_ERR_INVALID, "fabric_wait: NULL argument");
    if (f->failed)
        return TERSE_ERROR(f->failed, "rank %d: the transport failed earlier; it can only be closed",
                           f->rank);
    uint64_t start = terse__now_ns(), last_alive = start, last_event = start;
    unsigned idle = 0;
    for (;;) {
        size_t events = 0;
        TERSE_CHECK(terse__fabric_poll(f, &events));
        TERSE_CHECK(terse__fabric_post_pending(f));
        TERSE_CHECK(side_round(f, &events));
        const terse__fabric_req *pending = NULL;
        for (size_t i = 0; i < n; i++) {
            if (reqs[i].error) {
                terse__fabric *via = terse__fabric_route(f, reqs[i].peer);
                if (via != f) terse__fabric_fail(via, (terse_status)reqs[i].error);
                return terse__fabric_fail(f, (terse_status)reqs[i].error);
            }
            if (!pending && reqs[i].done < reqs[i].chunks) pending = &reqs[i];
        }
        if (!pending) return TERSE_OK;
        terse__fabric *pf = terse__fabric_route(f, pending->peer);
        uint64_t now = terse__now_ns();
        if (events) {
            idle = 0;
            last_event = now;
        }
        if (o->abort && atomic_load_explicit(o->abort, memory_order_acquire))
            return terse__fabric_fail(
                f, TERSE_ERROR(TERSE_ERR_ABORTED,
                               "rank %d: aborted (terse_comm_abort) while %s rank %d "
                               "(%zu of %zu bytes done)",
                               f->rank, terse__fabric_dir_text(pending), pending->peer,
                               bytes_done(pf, pending), pending->len));
        if (now >= o->deadline_ns) return routed_timeout(f, pf, pending, start, 0);
        if (o->idle_ns && now - last_event >= o->idle_ns)
            return routed_timeout(f, pf, pending, start, now - last_event);
        if (o->alive && now - last_alive >= o->alive_period_ns) {
            last_alive = now;
            terse_status st = o->alive(o->arg);
            if (st != TERSE_OK) return terse__fabric_fail(f, st);
        }
        if (events) continue;
        back_off(now - last_event, o->nap_after_ns ? o->nap_after_ns : NAP_AFTER_NS, &idle,
                 IDLE_SPINS);
    }
}

terse_status terse__fabric_wait(terse__fabric *f, terse__fabric_req *reqs, size_t n,
                                uint64_t deadline_ns, terse__fabric_alive_fn alive, void *arg) {
    terse__fabric_wait_opts o = {deadline_ns, 0, NULL, alive, arg, ALIVE_PERIOD_NS, 0};
    return terse__fabric_wait_ex(f, reqs, n, &o);
}

/* ---------------------------------------------------------------- endings */

/* Operations still posted that reference caller memory: receives (the
 * provider writes into them) and, on shm, sends too (a live peer pulls a
 * send's bytes out of our memory with process_vm_readv in its own
 * progress, so a late pull would read whatever the caller put there). */
static size_t posted_holding(const terse__fabric *f, int sends_too) {
    size_t n = 0;
    for (const terse__fabric_op *op = f->active_head; op; op = op->next)
        if (!op->req->is_send || sends_too) n += op->inflight;
    return n;
}

/* A chunk that came back (done, failed or cancelled) during quiesce: it
 * no longer holds caller memory. */
static void returned(terse__fabric *f, terse__fabric_slot *s) {
    if (!s || !terse__fabric_is_slot(f, s) || !s->op)
        return; /* a peek's or claim's: freed at close */
    terse__fabric_op *op = s->op;
    if (op->inflight) op->inflight--;
    terse__fabric_slot_put(f, s, op->req->is_send);
}

/* Cancel what is posted and collect what comes back, for a bounded time;
 * then close the endpoint, which discards whatever the provider would not
 * give back. On tcp only receives must come back (sends move only inside
 * our own progress calls, and there are none after this); on shm sends
 * too (see posted_holding), given up to 50 ms -- a live peer completes
 * them within microseconds, a dead one never reads them. Every call is
 * watched: shm may spin here too. */
void terse__fabric_quiesce(terse__fabric *f) {
    if (f && f->side) terse__fabric_quiesce(f->side);
    if (!f || !f->ep || atomic_load(&f->abandoned)) return;
    if (f->failed == TERSE_OK) f->failed = TERSE_ERR_ABORTED;
    unrepost(f, NULL); /* slots not posted: nothing to cancel */
    while (f->local_done) { /* filled from the early store: never posted */
        terse__fabric_slot *s = f->local_done;
        f->local_done = s->local_next;
        returned(f, s);
    }
    const int sends_too = strcmp(f->provider, "shm") == 0;
    for (size_t i = 0; i < f->tx_slots + f->rx_slots; i++)
        if (f->slots[i].op) {
            terse__fabric_enter(f, f->slots[i].op->req->peer, "fi_cancel");
            (void)fi_cancel(&f->ep->fid, &f->slots[i].ctx);
            terse__fabric_leave(f);
            if (atomic_load(&f->abandoned)) return;
        }
    uint64_t until = terse__now_ns() + (sends_too ? 50000000ull : 20000000ull);
    while (posted_holding(f, sends_too) && terse__now_ns() < until) {
        struct fi_cq_tagged_entry ent[TERSE__CQ_BATCH];
        terse__fabric_enter(f, -1, "fi_cq_read");
        ssize_t got = fi_cq_read(f->cq, ent, TERSE__CQ_BATCH);
        terse__fabric_leave(f);
        if (atomic_load(&f->abandoned)) return;
        for (ssize_t k = 0; k < got; k++) returned(f, ent[k].op_context);
        if (got == -FI_EAVAIL) {
            struct fi_cq_err_entry e;
            memset(&e, 0, sizeof e);
            if (fi_cq_readerr(f->cq, &e, 0) > 0) returned(f, e.op_context);
        } else if (got <= 0) {
            sched_yield();
        }
    }
    if (f->keep_open) return; /* terse__fabric_close closes it, and releases the ops */
    terse__fabric_enter(f, -1, "fi_close");
    int ret = fi_close(&f->ep->fid);
    terse__fabric_leave(f);
    if (atomic_load(&f->abandoned)) return;
    terse__fabric_release_ops(f);
    if (ret == -FI_EBUSY) ret = fi_close(&f->ep->fid);
    if (ret == 0) f->ep = NULL; /* else terse__fabric_close tries once more */
}

void terse__fabric_release_ops(terse__fabric *f) {
    f->repost = NULL; /* their ops go now */
    f->local_done = NULL;
    while (f->early_head) {
        terse__fabric_early *e = f->early_head;
        f->early_head = e->next;
        free(e);
    }
    f->early_tail = NULL;
    f->early_bytes = f->early_receiving = 0;
    for (size_t i = 0; f->stage_mem && i < f->tx_slots + f->rx_slots; i++) f->slots[i].stage = NULL;
    for (size_t i = 0; f->stage_mem && i < f->nstage; i++)
        f->stage_free[i] = (uint8_t *)f->stage_mem + i * f->chunk_bytes;
    if (f->stage_mem) f->nstage_free = f->nstage;
    while (f->active_head) terse__fabric_op_put(f, f->active_head);
    while (f->orphans) {
        terse__fabric_orphan *o = f->orphans;
        f->orphans = o->next;
        free(o);
    }
    while (f->op_free) {
        terse__fabric_op *op = f->op_free;
        f->op_free = op->next;
        free(op);
    }
}

/* net: a send's completion says only that the provider took it (an
 * inject at once, a small send into the connection's staging buffer), and
 * closing the endpoint discards whatever it still holds: a rank that left
 * right after its last allgather lost that message about 1 run in 8
 * (bench_train_smoke's ps:async run, 2026-12-03). So an orderly close
 * first sends each peer this rank sent anything to one empty message with
 * FI_DELIVERY_COMPLETE, whose acknowledgement comes once the peer's
 * provider has read it, and so everything before it on the connection.
 * The peer's net keeps it aside (at most 4 small unmatched messages per
 * connection) or, behind a message it cannot match yet, stalls on it. */
void terse__fabric_flush(terse__fabric *f, uint64_t budget_ns,
                         const uint8_t *(*lost_map)(void *), void *arg) {
    if (!f || !f->ep || f->failed || !f->sent_to || strcmp(f->provider, "net") != 0 ||
        atomic_load(&f->abandoned))
        return;
    f->flush_ctx = calloc((size_t)f->nranks, sizeof *f->flush_ctx);
    f->flush_state = calloc((size_t)f->nranks, 1);
    if (!f->flush_ctx || !f->flush_state) return; /* closed unflushed, as before */
    const uint64_t start = terse__now_ns(), until = start + budget_ns;
    uint64_t last_look = 0, last_event = start;
    unsigned idle = 0;
    for (;;) {
        int left = 0, first = -1; /* peers not flushed yet; the first of them */
        uint64_t now = terse__now_ns();
        const uint8_t *lost = NULL;
        if (lost_map && now - last_look >= 1000000ull) {
            last_look = now;
            lost = lost_map(arg); /* NULL: no news */
        }
        for (int p = 0; p < f->nranks; p++) {
            if (p == f->rank || !f->sent_to[p] || f->flush_state[p] == 2) continue;
            if (lost && lost[p]) {
                f->flush_state[p] = 2;
                continue;
            }
            if (!left++) first = p;
            if (f->flush_state[p]) continue;
            struct fi_msg_tagged m;
            memset(&m, 0, sizeof m);
            m.addr = f->addrs[p];
            m.tag = TERSE__MARKER_CHUNK; /* a marker's low bits are never 0 */
            m.context = &f->flush_ctx[p];
            ssize_t ret = fi_tsendmsg(f->ep, &m, FI_DELIVERY_COMPLETE | FI_COMPLETION);
            if (ret == 0) f->flush_state[p] = 1;
            else if (ret != -FI_EAGAIN) f->flush_state[p] = 2;
        }
        if (left && now >= until)
            fprintf(stderr,
                    "terse: rank %d: closing although %d peer%s (rank %d%s) had not read all it "
                    "was sent after %llu ms: busy outside terse, or stalled on a message no "
                    "receive matched\n",
                    f->rank, left, left == 1 ? "" : "s", first, left > 1 ? " and others" : "",
                    (unsigned long long)(budget_ns / 1000000u));
        if (!left || now >= until) return;
        size_t ev = 0;
        if (terse__fabric_read_cq(f, &ev) != TERSE_OK) return;
        /* after 200 us without news a peer is busy elsewhere: leave it the core */
        if (ev) last_event = now;
        else back_off(now - last_event, 200000u, &idle, 0);
    }
}

uint64_t terse__fabric_call_age(terse__fabric *f, int *peer, const char **what) {
    if (!f) return 0;
    if (f->side) { /* the side (shm) is the one that spins */
        uint64_t age = terse__fabric_call_age(f->side, peer, what);
        if (age) return age;
    }
    uint64_t since = atomic_load_explicit(&f->call_since, memory_order_acquire);
    if (!since) return 0;
    if (peer) *peer = atomic_load_explicit(&f->call_peer, memory_order_relaxed);
    if (what) *what = atomic_load_explicit(&f->call_what, memory_order_relaxed);
    uint64_t now = terse__now_ns();
    return now > since ? now - since : 0;
}

void terse__fabric_abandon(terse__fabric *f) {
    if (f) atomic_store(&f->abandoned, 1);
    if (f && f->side) atomic_store(&f->side->abandoned, 1);
}

int terse__fabric_is_abandoned(const terse__fabric *f) {
    return f && atomic_load(&f->abandoned);
}
