/* The worker's side of replicas 2: each slot's two servers (its head and
 * its replica), the waits that tell a lost server from a slow one, and a
 * slot's moves -- to its replica when its head is lost, back to the head's
 * replacement when the replica says so -- with the pushes no pull has
 * covered resent there; and the goodbye to both servers of every slot. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "algos/ps/ps.h"
#include "common/error.h"

/* replicas 2: how long a failed transfer waits for the store to confirm
 * its server's loss before it fails the request instead */
#define STORE_CONFIRM_NS 2000000000ull
/* How long a goodbye to a slot's other server waits for its answer. */
#define FINISH_OTHER_NS 2000000000ull

static int backup_of(const terse_ps *ps, int s) { return (s + 1) % ps->nservers; }

/* The server of slot s that is not serving it now. */
static int other(const terse_ps *ps, int s) {
    return ps->target[s] == s ? backup_of(ps, s) : s;
}

/* replicas 2: slot s may still move to its other server. */
static int can_fail_over(const terse_ps *ps, int s, const uint8_t *lost) {
    return ps->cfg.replicas == 2 && !(lost && lost[other(ps, s)]);
}

/* replicas 2: take in the replacements the store announced (the fabric
 * learns their addresses). A conversation with a replaced rank starts over
 * from message 0; a slot whose serving rank was replaced lost that process
 * (unnoticed between two polls) and fails over. */
static terse_status take_backs(terse_ps *ps) {
    for (;;) {
        int r = -1;
        TERSE_CHECK(terse__comm_take_back(ps->comm, &r));
        if (r < 0) return TERSE_OK;
        for (int s = 0; s < ps->nservers; s++) {
            if (other(ps, s) == r) ps->mseq[s] = 0;
            if (ps->target[s] == r) ps->stale[s] = 1;
        }
    }
}

/* Post the payload receive of every slot whose reply header is in and
 * announces a pull within bounds; anything else is left to the checks
 * after the wait, which name it. A slot that failed, or whose server is
 * lost or replaced, gets none: its buffer may move before the retry. */
static terse_status post_early_pulls(terse_ps *ps, terse__fabric_req *q, terse__ps_early_pulls *e,
                                     const uint8_t *failed, const uint8_t *lost) {
    for (int s = 0; s < ps->nservers; s++) {
        if (e->rep_at[s] < 0 || e->posted[s] || failed[s]) continue;
        const terse__fabric_req *h = &q[e->rep_at[s]];
        if ((lost && lost[h->peer]) || ps->stale[s]) continue;
        if (h->error || h->done < h->chunks) continue;
        e->posted[s] = 2; /* looked at */
        terse__ps_rep r;
        if (terse__ps_get_rep(ps->wrep + s * TERSE__PS_REP_BYTES, &r) != TERSE_OK ||
            r.seq != ps->seq[s] || r.status != TERSE_OK || r.payload_len == 0 ||
            r.payload_len > e->k->srv_pull_bound[s])
            continue;
        TERSE_CHECK(terse__ps_grow(&ps->rbuf[s], &ps->rbuf_cap[s], r.payload_len));
        e->qslot[e->nq] = s;
        TERSE_CHECK(terse__comm_irecv(ps->comm, h->peer,
                                      terse__ps_tag(s, TERSE__PS_TAG_RDATA, ps->seq[s]),
                                      ps->rbuf[s], r.payload_len, TERSE__BYTES_PAYLOAD,
                                      &q[e->nq++]));
        e->posted[s] = 1;
    }
    return TERSE_OK;
}

/* replicas 2: wait for reqs (qslot[i]: the slot each belongs to) in
 * tolerant mode. A transfer to a server the store announces lost, or one
 * that fails, marks its slot failed[] if the slot has a live replica (its
 * transfers are cancelled and the rest waited for); otherwise the wait
 * fails naming the server and its slot. */
terse_status terse__ps_wait_slots(terse_ps *ps, terse__fabric_req *q, size_t nq, const int *qslot,
                                  uint8_t *failed, int loss_ok, terse__ps_early_pulls *early) {
    terse_comm *c = ps->comm;
    terse__fabric *f = c->fabric;
    const uint64_t t0 = terse__now_ns();
    const uint64_t limit = ps->wait_limit_ns ? ps->wait_limit_ns
                                             : (uint64_t)c->timeout_ms * 1000000ull;
    uint64_t last_event = t0, last_poll = 0, erred_ns = 0;
    const uint8_t *lost = NULL;
    unsigned idle = 0;
    terse_status st = TERSE_OK;
    for (;;) {
        if (atomic_load_explicit(&c->aborted, memory_order_acquire)) {
            st = TERSE_ERROR(TERSE_ERR_ABORTED, "rank %d: aborted (terse_comm_abort)", ps->rank);
            break;
        }
        size_t events = 0;
        st = terse__fabric_progress(f, &events);
        if (st == TERSE_OK && early) {
            st = post_early_pulls(ps, q, early, failed, lost);
            nq = early->nq;
        }
        if (st != TERSE_OK) break;
        uint64_t now = terse__now_ns();
        if (c->store && now - last_poll >= 1000000ull) {
            last_poll = now;
            st = terse__comm_poll_lost(c, &lost);
            if (st == TERSE_OK) st = take_backs(ps);
            if (st != TERSE_OK) break;
        }
        int pending = 0;
        for (size_t i = 0; i < nq && st == TERSE_OK; i++) {
            int s = qslot[i], t = q[i].peer; /* the rank it goes to or comes from */
            if (failed[s]) continue;
            int gone = (lost && lost[t]) || (t == ps->target[s] && ps->stale[s]);
            int idle_req = terse__fabric_req_idle(f, &q[i]);
            if (!gone && !(idle_req && q[i].error)) {
                pending |= !idle_req;
                continue;
            }
            /* A failed transfer moves a slot only once the store confirms
             * the server is gone (within milliseconds of a death): a head
             * that is alive must not be left behind. */
            if (!gone && !loss_ok && can_fail_over(ps, s, lost)) {
                if (!erred_ns) erred_ns = now;
                if (now - erred_ns < STORE_CONFIRM_NS) {
                    pending = 1;
                    continue;
                }
            }
            if (gone ? (loss_ok || can_fail_over(ps, s, lost)) : loss_ok) {
                failed[s] = 1;
                continue;
            }
            if (!gone)
                st = TERSE_ERROR((terse_status)q[i].error,
                                 "rank %d: a transfer with parameter server rank %d (slot %d) "
                                 "failed (%s), and the bootstrap store does not report it lost",
                                 ps->rank, t, s, terse_status_name((terse_status)q[i].error));
            else
                st = TERSE_ERROR(TERSE_ERR_PEER_LOST,
                                 "rank %d: parameter server rank %d, which serves slot %d, was "
                                 "lost (its connection to the bootstrap store dropped without a "
                                 "goodbye)%s",
                                 ps->rank, t, s,
                                 ps->target[s] != s ? " after taking over from the slot's lost "
                                                      "head: both of its servers are gone"
                                                    : ", and its replica is gone too");
        }
        if (st != TERSE_OK || !pending) break;
        if (events) {
            idle = 0;
            last_event = now;
        } else if (now - last_event >= limit) {
            int w = -1; /* the first transfer still waiting */
            for (size_t i = 0; i < nq && w < 0; i++)
                if (!failed[qslot[i]] && !terse__fabric_req_idle(f, &q[i])) w = (int)i;
            st = TERSE_ERROR(TERSE_ERR_TIMEOUT,
                             "rank %d: no progress from the parameter servers for %llu ms (%s "
                             "server rank %d about slot %d, tag %#llx, not done)",
                             ps->rank, (unsigned long long)((now - last_event) / 1000000u),
                             w >= 0 && q[w].is_send ? "a send to" : "a receive from",
                             w >= 0 ? q[w].peer : -1, w >= 0 ? qslot[w] : -1,
                             w >= 0 ? (unsigned long long)q[w].tag : 0ull);
            break;
        } else if (now - last_event >= TERSE__PS_NAP_AFTER_NS) {
            struct timespec nap = {0, 20000};
            nanosleep(&nap, NULL);
        } else if (++idle >= 16) {
            sched_yield();
        }
    }
    char why[512]; /* the cancellations below leave sentences of their own */
    snprintf(why, sizeof why, "%s", terse_last_error());
    int ok = 1;
    for (size_t i = 0; i < nq; i++) {
        if (!failed[qslot[i]] && st == TERSE_OK) continue;
        if (terse__fabric_cancel(f, &q[i])) continue;
        /* shm may hold a transfer to a dead process forever: give it up */
        ok &= failed[qslot[i]] && terse__fabric_give_up(f, &q[i]);
    }
    pthread_mutex_lock(&c->stats_lock);
    c->stats.network_seconds += (double)(terse__now_ns() - t0) * 1e-9;
    pthread_mutex_unlock(&c->stats_lock);
    if (st != TERSE_OK) terse__error_restore(why);
    if (st == TERSE_OK && !ok)
        st = TERSE_ERROR(TERSE_ERR_TRANSPORT, "rank %d: a transfer to a lost server would not "
                                              "cancel", ps->rank);
    return st;
}

/* Send one request to slot s's server (to_replica: to its replica, in
 * their own conversation) and take its reply header (no payload back;
 * into *rep if not NULL): the resends of a failover, replicas 2's finish. */
static terse_status one_request(terse_ps *ps, int s, const terse__ps_hdr *h0, const void *payload,
                                uint8_t *failed, int loss_ok, int to_replica, terse__ps_rep *rep) {
    terse_comm *c = ps->comm;
    uint64_t *seq = to_replica ? &ps->mseq[s] : &ps->seq[s];
    terse__ps_hdr h = *h0;
    h.seq = *seq;
    h.epoch = ps->epoch[s] + (to_replica != 0);
    uint8_t hb[TERSE__PS_HDR_BYTES], rb[TERSE__PS_REP_BYTES];
    terse__ps_put_hdr(hb, &h);
    terse__fabric_req q[3];
    int qs[3] = {s, s, s};
    size_t nq = 0;
    int t = to_replica ? other(ps, s) : ps->target[s];
    TERSE_CHECK(terse__comm_irecv(c, t, terse__ps_tag(s, TERSE__PS_TAG_REP, h.seq), rb, sizeof rb,
                                  TERSE__BYTES_FRAMING, &q[nq++]));
    TERSE_CHECK(terse__comm_isend(c, t, terse__ps_tag(s, TERSE__PS_TAG_HDR, h.seq), hb, sizeof hb,
                                  TERSE__BYTES_FRAMING, &q[nq++]));
    if (h.payload_len)
        TERSE_CHECK(terse__comm_isend(c, t, terse__ps_tag(s, TERSE__PS_TAG_DATA, h.seq), payload,
                                      (size_t)h.payload_len, TERSE__BYTES_PAYLOAD, &q[nq++]));
    TERSE_CHECK(terse__ps_wait_slots(ps, q, nq, qs, failed, loss_ok, NULL));
    if (failed[s]) return TERSE_OK;
    (*seq)++;
    terse__ps_rep r;
    TERSE_CHECK(terse__ps_get_rep(rb, &r));
    if (rep) *rep = r;
    if (r.status == (terse_status)TERSE__PS_MOVED) {
        failed[s] = 2; /* the caller moves the slot and asks again */
        return TERSE_OK;
    }
    if (r.payload_len)
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "rank %d: server rank %d answered with a payload",
                           ps->rank, t);
    return r.status == TERSE_OK ? TERSE_OK : TERSE_ERROR(r.status, "%s", r.text);
}

/* Wait until the store has announced rank r's incarnation inc here (a
 * server said the slot went back to it), its address in the fabric. */
static terse_status await_incarnation(terse_ps *ps, int r, uint32_t inc) {
    terse_comm *c = ps->comm;
    const uint64_t until = terse__now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
    for (;;) {
        const uint8_t *lost = NULL;
        TERSE_CHECK(terse__comm_poll_lost(c, &lost));
        TERSE_CHECK(take_backs(ps));
        if (terse__store_incarnation(c->store, r) >= inc) return TERSE_OK;
        if (terse__now_ns() >= until)
            return TERSE_ERROR(TERSE_ERR_TIMEOUT,
                               "rank %d: a server moved slot %d back to server rank %d's "
                               "replacement (incarnation %u), which the bootstrap store never "
                               "announced here",
                               ps->rank, r, r, inc);
        struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
    }
}

/* Slot s moves: its server was lost (why 1: to the slot's other server,
 * next epoch), or it went back to its head's replacement (why 2: the reply
 * gave the epoch and the head's incarnation). Then every push no pull has
 * covered there is resent, in key order, but the one the request under way
 * (key cur, if it pushes) is about to send again; a resend that meets
 * another move moves again. */
terse_status terse__ps_move_slot(terse_ps *ps, int s, int why, uint32_t epoch, uint32_t inc,
                                 size_t cur, int cur_pushes) {
    for (int moves = 0;; moves++) {
        if (moves == 8)
            return TERSE_ERROR(TERSE_ERR_PEER_LOST, "rank %d: slot %d moved 8 times in one "
                                                    "request; giving up", ps->rank, s);
        if (why == 1) {
            const uint8_t *lost = NULL;
            if (ps->comm->store) TERSE_CHECK(terse__comm_poll_lost(ps->comm, &lost));
            if (!can_fail_over(ps, s, lost))
                return TERSE_ERROR(TERSE_ERR_PEER_LOST,
                                   "rank %d: both servers of slot %d (ranks %d and %d) are lost",
                                   ps->rank, s, s, backup_of(ps, s));
            fprintf(stderr,
                    "terse: rank %d: parameter server rank %d (slot %d) was lost; server rank %d "
                    "serves the slot from now on\n",
                    ps->rank, ps->target[s], s, other(ps, s));
            ps->target[s] = other(ps, s);
            ps->epoch[s]++;
            ps->seq[s] = ps->mseq[s]; /* the conversation with the other server */
            ps->mseq[s] = 0;          /* a replacement of the dead one starts over */
        } else {
            TERSE_CHECK(await_incarnation(ps, s, inc));
            fprintf(stderr,
                    "terse: rank %d: slot %d went back to server rank %d (a replacement, epoch "
                    "%u)\n",
                    ps->rank, s, s, epoch);
            uint64_t q = ps->seq[s];
            ps->seq[s] = ps->mseq[s]; /* 0 unless it already spoke to the replacement */
            ps->mseq[s] = q;
            ps->target[s] = s;
            ps->epoch[s] = epoch;
        }
        ps->stale[s] = 0;
        why = 0;
        for (size_t key = 0; key < ps->nkeys && !why; key++) {
            terse__ps_key *k = ps->keys[key];
            terse__ps_unacked *u = k->unacked ? &k->unacked[s] : NULL;
            if (!u || !u->valid || (key == cur && cur_pushes)) continue;
            terse__ps_hdr h = {TERSE__PS_PUSH, key, u->clock, u->len, 0, k->srv_floats[s],
                               k->decl_hash, u->weight, 0, 0, 0};
            uint8_t failed[TERSE__PS_MAX_SERVERS] = {0};
            terse__ps_rep rep;
            memset(&rep, 0, sizeof rep);
            terse_status st = one_request(ps, s, &h, u->buf, failed, 1, 0, &rep);
            why = failed[s];
            epoch = (uint32_t)rep.version;
            inc = (uint32_t)rep.staleness;
            /* A refusal (a quorum that closed the step without it) drops it,
             * as the earlier server would have. */
            if (!why && st != TERSE_OK && st != TERSE_ERR_STALE && st != TERSE_ERR_NONFINITE)
                return st;
        }
        if (!why) return TERSE_OK;
    }
}

/* replicas 2: finish with every slot's server, and with each live head's
 * replica too (it waits for every worker's goodbye, in case it takes
 * over). A server found lost has nothing to be told. */
terse_status terse__ps_finish_replicated(terse_ps *ps) {
    for (int s = 0; s < ps->nservers; s++)
        for (int to_other = 0; to_other < 2; to_other++) {
            const uint8_t *lost = NULL;
            TERSE_CHECK(terse__comm_poll_lost(ps->comm, &lost));
            TERSE_CHECK(take_backs(ps));
            if (to_other && lost[other(ps, s)]) break; /* dead: nothing to tell it */
            if (!to_other && ps->stale[s])
                TERSE_CHECK(terse__ps_move_slot(ps, s, 1, 0, 0, SIZE_MAX, 0));
            terse__ps_hdr h = {TERSE__PS_FINISH, 0, 0, 0, 0, 0, 0, 1.0f, 0, 0, 0};
            uint8_t failed[TERSE__PS_MAX_SERVERS] = {0};
            terse__ps_rep rep;
            memset(&rep, 0, sizeof rep);
            /* The other server may have ended already: one that is a
             * replacement ends on the word of the slot's head (its roster),
             * not on this goodbye, and does not answer a late one. A live
             * server answers a goodbye at once, so a short wait will do. */
            if (to_other) ps->wait_limit_ns = FINISH_OTHER_NS;
            terse_status st = one_request(ps, s, &h, NULL, failed, 1, to_other, &rep);
            ps->wait_limit_ns = 0;
            if (to_other && st == TERSE_ERR_TIMEOUT) continue;
            if (failed[s] == 2 || (failed[s] == 1 && !to_other)) {
                /* the slot moved: tell both of its servers where it is now */
                TERSE_CHECK(terse__ps_move_slot(ps, s, failed[s], (uint32_t)rep.version,
                                                (uint32_t)rep.staleness, SIZE_MAX, 0));
                to_other = -1;
                continue;
            }
            if (!failed[s] && st != TERSE_OK) return st; /* lost: nothing to tell it */
        }
    return TERSE_OK;
}

terse_status terse__ps_test_raw_replica(terse_ps *ps, int slot, terse__ps_hdr *h,
                                        const void *payload, size_t len, terse__ps_rep *rep) {
    if (ps->cfg.replicas != 2 || slot < 0 || slot >= ps->nservers || ps->target[slot] != slot)
        return TERSE_ERROR(TERSE_ERR_INVALID, "test_raw_replica: no replica conversation for "
                                              "slot %d", slot);
    uint8_t failed[TERSE__PS_MAX_SERVERS] = {0};
    h->payload_len = len;
    memset(rep, 0, sizeof *rep);
    rep->status = (terse_status)-1; /* until a reply fills it */
    terse_status st = one_request(ps, slot, h, payload, failed, 1, 1, rep);
    if (failed[slot])
        return TERSE_ERROR(TERSE_ERR_PEER_LOST, "test_raw_replica: rank %d lost",
                           backup_of(ps, slot));
    return rep->status == (terse_status)-1 ? st : TERSE_OK; /* a refusal is in *rep */
}
