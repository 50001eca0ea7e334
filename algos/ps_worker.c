/* The worker's side: push, pull, pushpull and finish, each an engine
 * request (TERSE__OP_EXT) that the executor runs like a collective. One
 * request talks to every server holding a chunk of its key at once:
 * encode, send header + payload to each, wait for every reply header,
 * then receive and decode the pull payloads. The waits watch only the
 * servers this request needs: a lost fellow worker is the servers'
 * business (ps_server.c), not a reason to fail here. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "algos/engine.h"
#include "algos/ps.h"
#include "common/error.h"

#define PS_NAP_AFTER_NS 200000u
/* replicas 2: how long a failed transfer waits for the store to confirm
 * its server's loss before it fails the request instead */
#define STORE_CONFIRM_NS 2000000000ull
/* How long a goodbye to a slot's other server waits for its answer. */
#define FINISH_OTHER_NS 2000000000ull

typedef struct wait_ctx {
    terse_ps *ps;
    const uint8_t *need; /* per server: this request waits on it */
} wait_ctx;

static terse_status servers_alive(void *arg) {
    wait_ctx *w = arg;
    terse_ps *ps = w->ps;
    terse_comm *c = ps->comm;
    if (!c->store) return TERSE_OK;
    const uint8_t *lost = NULL;
    TERSE_CHECK(terse__store_poll_lost(c->store, &lost));
    for (int s = 0; s < ps->nservers; s++)
        if (w->need[s] && lost[s])
            return TERSE_ERROR(TERSE_ERR_PEER_LOST,
                               "rank %d: parameter server rank %d, the only server of slot %d "
                               "(replicas 1), was lost (its connection to the bootstrap store "
                               "dropped without a goodbye) while this worker waited for it",
                               ps->rank, s, s);
    return TERSE_OK;
}

static terse_status wait_for(terse_ps *ps, terse__fabric_req *reqs, size_t n,
                             const uint8_t *need) {
    terse_comm *c = ps->comm;
    wait_ctx w = {ps, need};
    /* Nap early: a pull may wait a whole step for a slower worker, and the
     * CPU it would spin on is what the other workers compute with. */
    terse__fabric_wait_opts o = {UINT64_MAX, (uint64_t)c->timeout_ms * 1000000ull, &c->aborted,
                                 servers_alive, &w, 1000000ull, PS_NAP_AFTER_NS};
    uint64_t t0 = terse__now_ns();
    terse_status s = terse__fabric_wait_ex(c->fabric, reqs, n, &o);
    pthread_mutex_lock(&c->stats_lock);
    c->stats.network_seconds += (double)(terse__now_ns() - t0) * 1e-9;
    pthread_mutex_unlock(&c->stats_lock);
    return s;
}

static terse_status grow(uint8_t **buf, size_t *cap, size_t want) {
    if (*cap >= want) return TERSE_OK;
    uint8_t *p = realloc(*buf, want);
    if (!p) return TERSE_ERROR(TERSE_ERR_NOMEM, "no memory for %zu bytes of payload", want);
    *buf = p;
    *cap = want;
    return TERSE_OK;
}

static const char *op_name(int op) {
    switch (op) {
    case TERSE__PS_PUSH: return "terse_ps_push";
    case TERSE__PS_PULL: return "terse_ps_pull";
    case TERSE__PS_PUSHPULL: return "terse_ps_pushpull";
    default: return "terse_ps_finish";
    }
}

/* Encode key's chunks held by server s into sbuf[s]; *len its size. */
static terse_status encode_for(terse_ps *ps, terse__ps_key *k, int s, const float *grad,
                               size_t *len) {
    TERSE_CHECK(grow(&ps->sbuf[s], &ps->sbuf_cap[s], k->srv_push_bound[s]));
    size_t off = 0;
    for (size_t c = 0; c < k->nchunks; c++) {
        if (k->server[c] != s) continue;
        size_t got = 0;
        TERSE_CHECK(terse_encode(k->push_enc[c], grad + c * k->chunk_floats, ps->sbuf[s] + off,
                                 ps->sbuf_cap[s] - off, &got));
        off += got;
    }
    *len = off;
    return TERSE_OK;
}

/* Decode server s's pull payload (its chunks of key, in order) into out. */
static terse_status decode_from(terse_ps *ps, terse__ps_key *k, int s, size_t key, float *out,
                                size_t len) {
    const uint8_t *p = ps->rbuf[s];
    size_t off = 0;
    for (size_t c = 0; c < k->nchunks; c++) {
        if (k->server[c] != s) continue;
        size_t m = 0;
        terse_status st = terse__ps_msg_len(p + off, len - off, &m);
        if (st == TERSE_OK)
            st = terse_decode(k->pull_dec[c], p + off, m, out + c * k->chunk_floats, 1.0f, 0);
        if (st != TERSE_OK)
            return TERSE_ERROR(st,
                               "rank %d: the pull of key %zu from server rank %d has a bad "
                               "message for chunk %zu at byte %zu: %s",
                               ps->rank, key, s, c, off, terse_last_error());
        off += m;
    }
    if (off != len)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "rank %d: the pull of key %zu from server rank %d has %zu bytes "
                           "after its last chunk",
                           ps->rank, key, s, len - off);
    return TERSE_OK;
}

/* The first refusal among the replies, as this worker's error. */
static terse_status refused(terse_ps *ps, int op, size_t key, int s, const terse__ps_rep *r) {
    if (r->status == TERSE_ERR_STALE) ps->stats.stale_refused++;
    return TERSE_ERROR(r->status, "%s of key %zu on rank %d: server rank %d refused it: %s",
                       op_name(op), key, ps->rank, s, r->text);
}

/* ---------------------------------------------------------------- replicas */

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

/* replicas 2: the pull payloads a wait posts as their reply headers come
 * in. After a failover one server serves two slots, and its reply header
 * for the second follows the first's payload on the same connection: a
 * provider that stops reading a connection at a message no receive
 * matches yet (net) would wait for ever if that payload's receive were
 * posted only once every header is in (rxm queues it instead). */
typedef struct early_pulls {
    terse__ps_key *k;
    int *qslot;
    size_t nq;                          /* the wait's requests, these included */
    int rep_at[TERSE__PS_MAX_SERVERS];  /* slot s's reply header in the wait, or -1 */
    uint8_t posted[TERSE__PS_MAX_SERVERS]; /* 1: its payload's receive is in the wait */
} early_pulls;

/* Post the payload receive of every slot whose reply header is in and
 * announces a pull within bounds; anything else is left to the checks
 * after the wait, which name it. A slot that failed, or whose server is
 * lost or replaced, gets none: its buffer may move before the retry. */
static terse_status post_early_pulls(terse_ps *ps, terse__fabric_req *q, early_pulls *e,
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
        TERSE_CHECK(grow(&ps->rbuf[s], &ps->rbuf_cap[s], r.payload_len));
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
static terse_status wait_slots(terse_ps *ps, terse__fabric_req *q, size_t nq, const int *qslot,
                               uint8_t *failed, int loss_ok, early_pulls *early) {
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
            st = terse__store_poll_lost(c->store, &lost);
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
        } else if (now - last_event >= PS_NAP_AFTER_NS) {
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
    TERSE_CHECK(wait_slots(ps, q, nq, qs, failed, loss_ok, NULL));
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
        TERSE_CHECK(terse__store_poll_lost(c->store, &lost));
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
static terse_status move_slot(terse_ps *ps, int s, int why, uint32_t epoch, uint32_t inc,
                              size_t cur, int cur_pushes) {
    for (int moves = 0;; moves++) {
        if (moves == 8)
            return TERSE_ERROR(TERSE_ERR_PEER_LOST, "rank %d: slot %d moved 8 times in one "
                                                    "request; giving up", ps->rank, s);
        if (why == 1) {
            const uint8_t *lost = NULL;
            if (ps->comm->store) TERSE_CHECK(terse__store_poll_lost(ps->comm->store, &lost));
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
                               k->decl_hash, u->weight, 0};
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
static terse_status finish_replicated(terse_ps *ps) {
    for (int s = 0; s < ps->nservers; s++)
        for (int to_other = 0; to_other < 2; to_other++) {
            const uint8_t *lost = NULL;
            TERSE_CHECK(terse__store_poll_lost(ps->comm->store, &lost));
            TERSE_CHECK(take_backs(ps));
            if (to_other && lost[other(ps, s)]) break; /* dead: nothing to tell it */
            if (!to_other && ps->stale[s]) TERSE_CHECK(move_slot(ps, s, 1, 0, 0, SIZE_MAX, 0));
            terse__ps_hdr h = {TERSE__PS_FINISH, 0, 0, 0, 0, 0, 0, 1.0f, 0};
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
                TERSE_CHECK(move_slot(ps, s, failed[s], (uint32_t)rep.version,
                                      (uint32_t)rep.staleness, SIZE_MAX, 0));
                to_other = -1;
                continue;
            }
            if (!failed[s] && st != TERSE_OK) return st; /* lost: nothing to tell it */
        }
    return TERSE_OK;
}

/* ---------------------------------------------------------------- exchange */

/* replicas 1: wait_for, and a server the transport found dead before the
 * store said so is named with its slot all the same. */
static terse_status wait_unreplicated(terse_ps *ps, terse__fabric_req *q, size_t nq,
                                      const uint8_t *mask) {
    terse_status st = wait_for(ps, q, nq, mask);
    if (st != TERSE_ERR_PEER_LOST || strstr(terse_last_error(), "the only server of slot"))
        return st;
    int s = -1; /* the first server whose transfer failed */
    for (size_t i = 0; i < nq && s < 0; i++)
        if (q[i].error) s = q[i].peer;
    if (s < 0 || s >= ps->nservers) return st;
    char why[512];
    snprintf(why, sizeof why, "%s", terse_last_error());
    return TERSE_ERROR(st, "rank %d: parameter server rank %d, the only server of slot %d "
                           "(replicas 1), was lost: %s",
                       ps->rank, s, s, why);
}

/* The slots in mask: send the requests, take the replies, receive and
 * decode the pulls. replicas 2: a slot whose server is lost comes back in
 * failed[] with nothing of it done (the caller moves it to the replica
 * and runs it again). plen[s]: the push payload in sbuf[s]. */
static terse_status exchange_mask(terse_ps *ps, terse__ps_key *k, int op, size_t key, float *buf,
                                  uint64_t clock, float weight, const uint8_t *mask,
                                  const size_t *plen, uint8_t *failed, int *keep_usable) {
    terse_comm *c = ps->comm;
    const int S = ps->nservers, pull = op == TERSE__PS_PULL || op == TERSE__PS_PUSHPULL;
    const int replicated = ps->cfg.replicas == 2;
    terse__fabric_req *q = replicated ? ps->wq : c->reqs;
    int qslot[4 * TERSE__PS_MAX_SERVERS];
    size_t nq = 0;
    early_pulls early = {k, qslot, 0, {0}, {0}};
    terse_status st = TERSE_OK;
    for (int s = 0; s < S; s++) {
        early.rep_at[s] = -1;
        if (!mask[s]) continue;
        terse__ps_hdr h = {op, key, clock, plen[s], ps->seq[s], k ? k->srv_floats[s] : 0,
                           k ? k->decl_hash : 0, weight, ps->epoch[s]};
        terse__ps_put_hdr(ps->whdr + s * TERSE__PS_HDR_BYTES, &h);
    }
    for (int s = 0; s < S; s++) {
        if (!mask[s]) continue;
        uint64_t sq = ps->seq[s];
        int t = ps->target[s];
        early.rep_at[s] = pull ? (int)nq : -1;
        qslot[nq] = s;
        TERSE_CHECK(terse__comm_irecv(c, t, terse__ps_tag(s, TERSE__PS_TAG_REP, sq),
                                      ps->wrep + s * TERSE__PS_REP_BYTES, TERSE__PS_REP_BYTES,
                                      TERSE__BYTES_FRAMING, &q[nq++]));
        qslot[nq] = s;
        TERSE_CHECK(terse__comm_isend(c, t, terse__ps_tag(s, TERSE__PS_TAG_HDR, sq),
                                      ps->whdr + s * TERSE__PS_HDR_BYTES, TERSE__PS_HDR_BYTES,
                                      TERSE__BYTES_FRAMING, &q[nq++]));
        if (plen[s]) {
            qslot[nq] = s;
            TERSE_CHECK(terse__comm_isend(c, t, terse__ps_tag(s, TERSE__PS_TAG_DATA, sq),
                                          ps->sbuf[s], plen[s], TERSE__BYTES_PAYLOAD, &q[nq++]));
        }
    }
    early.nq = nq;
    if (replicated)
        TERSE_CHECK(wait_slots(ps, q, nq, qslot, failed, 0, &early));
    else
        TERSE_CHECK(wait_unreplicated(ps, q, nq, mask));
    /* Every reply is in: the conversation with each server moved on. */
    int first = -1;
    nq = 0;
    for (int s = 0; s < S; s++) {
        if (!mask[s] || failed[s]) continue;
        ps->seq[s]++;
        terse__ps_rep *r = &ps->reps[s];
        int t = ps->target[s];
        st = terse__ps_get_rep(ps->wrep + s * TERSE__PS_REP_BYTES, r);
        if (st == TERSE_OK && r->seq != ps->seq[s] - 1)
            st = TERSE_ERROR(TERSE_ERR_CORRUPT, "reply for message %llu, expected %llu",
                             (unsigned long long)r->seq, (unsigned long long)(ps->seq[s] - 1));
        if (st != TERSE_OK)
            return TERSE_ERROR(st, "rank %d: server rank %d's reply to %s: %s", ps->rank, t,
                               op_name(op), terse_last_error());
        if (r->status == (terse_status)TERSE__PS_MOVED && replicated) {
            failed[s] = 2; /* the slot went back to its head's replacement */
            continue;
        }
        if (r->status != TERSE_OK) {
            if (first < 0) first = s;
            if (r->payload_len)
                return TERSE_ERROR(TERSE_ERR_CORRUPT,
                                   "rank %d: server rank %d refused %s but announced %llu bytes",
                                   ps->rank, t, op_name(op), (unsigned long long)r->payload_len);
            continue;
        }
        if (!pull) continue;
        if (r->payload_len == 0 || r->payload_len > k->srv_pull_bound[s])
            return TERSE_ERROR(TERSE_ERR_CORRUPT,
                               "rank %d: server rank %d announced a %llu-byte pull of key %zu; "
                               "its chunks here encode to 1..%zu bytes",
                               ps->rank, t, (unsigned long long)r->payload_len, key,
                               k->srv_pull_bound[s]);
        if (early.posted[s] == 1) continue; /* in already */
        TERSE_CHECK(grow(&ps->rbuf[s], &ps->rbuf_cap[s], r->payload_len));
        qslot[nq] = s;
        TERSE_CHECK(terse__comm_irecv(c, t, terse__ps_tag(s, TERSE__PS_TAG_RDATA, ps->seq[s] - 1),
                                      ps->rbuf[s], r->payload_len, TERSE__BYTES_PAYLOAD, &q[nq++]));
    }
    if (nq && replicated)
        TERSE_CHECK(wait_slots(ps, q, nq, qslot, failed, 0, NULL));
    else if (nq)
        TERSE_CHECK(wait_unreplicated(ps, q, nq, mask));
    if (first >= 0) {
        /* A refusal concerns this request only: the conversation is intact. */
        *keep_usable = 1;
        /* A push dropped as late or stale, or left out as non-finite, went
         * with its step; any other refusal leaves the step open for it. */
        int again = 0; /* any server whose step waits for this worker */
        for (int s = 0; s < S; s++) {
            terse_status why = mask[s] && !failed[s] ? ps->reps[s].status : TERSE_OK;
            again |= why != TERSE_OK && why != TERSE_ERR_STALE && why != TERSE_ERR_NONFINITE;
        }
        if ((op == TERSE__PS_PUSH || op == TERSE__PS_PUSHPULL) && ps->cfg.mode == TERSE_PS_SYNC &&
            again)
            atomic_store(&ps->step_refused, 1); /* push again */
        return refused(ps, op, key, first, &ps->reps[first]);
    }
    if (pull) {
        uint64_t t0 = terse__now_ns();
        uint64_t newest = 0;
        for (int s = 0; s < S; s++) {
            if (!mask[s] || failed[s]) continue;
            TERSE_CHECK(decode_from(ps, k, s, key, buf, ps->reps[s].payload_len));
            if (ps->reps[s].version > newest) newest = ps->reps[s].version;
            /* a later step's result: the push before it is on both servers */
            terse__ps_unacked *u = k->unacked ? &k->unacked[s] : NULL;
            if (u && u->valid && ps->reps[s].version > u->clock) u->valid = 0;
        }
        terse__comm_codec_time(c, t0);
        /* Behind a quorum: the next step is the server's. */
        if (ps->cfg.mode == TERSE_PS_SYNC && newest > clock + 1 &&
            newest > atomic_load(&ps->clock_floor))
            atomic_store(&ps->clock_floor, newest);
    }
    return TERSE_OK;
}

static terse_status exchange(terse_ps *ps, terse__ps_key *k, int op, size_t key, float *buf,
                             uint64_t clock, float weight, int *keep_usable) {
    const int S = ps->nservers, push = op == TERSE__PS_PUSH || op == TERSE__PS_PUSHPULL,
              pull = op == TERSE__PS_PULL || op == TERSE__PS_PUSHPULL;
    if (op == TERSE__PS_FINISH && ps->cfg.replicas == 2) return finish_replicated(ps);
    /* terse_ps_create keeps the servers within what one wait can hold:
     * three requests per server in c->reqs. */
    uint8_t mask[TERSE__PS_MAX_SERVERS];
    size_t plen[TERSE__PS_MAX_SERVERS] = {0};
    uint64_t t0 = terse__now_ns();
    for (int s = 0; s < S; s++) {
        mask[s] = k ? k->srv_nchunks[s] > 0 : 1;
        if (!mask[s] || !push) continue;
        TERSE_CHECK(encode_for(ps, k, s, buf, &plen[s]));
        terse__ps_unacked *u = k->unacked ? &k->unacked[s] : NULL;
        if (u) { /* kept until a pull of a later step: resent to a replica */
            TERSE_CHECK(grow(&u->buf, &u->cap, plen[s]));
            memcpy(u->buf, ps->sbuf[s], plen[s]);
            u->len = plen[s];
            u->clock = clock;
            u->weight = weight;
            u->valid = 1;
        }
    }
    terse__comm_codec_time(ps->comm, t0);
    terse_status refusal = TERSE_OK;
    char why[512] = "";
    for (int s = 0; s < S; s++) /* its server's process was replaced: it died */
        if (mask[s] && ps->stale[s]) TERSE_CHECK(move_slot(ps, s, 1, 0, 0, key, push));
    for (;;) {
        uint8_t failed[TERSE__PS_MAX_SERVERS] = {0};
        int usable = 0; /* this pass's: a refusal, not a failure */
        terse_status st = exchange_mask(ps, k, op, key, buf, clock, weight, mask, plen, failed,
                                        &usable);
        if (st != TERSE_OK && !usable) return st;
        if (st != TERSE_OK && refusal == TERSE_OK) {
            refusal = st;
            snprintf(why, sizeof why, "%s", terse_last_error());
            *keep_usable = 1;
        }
        int any = 0;
        for (int s = 0; s < S; s++)
            if (failed[s]) {
                any = 1;
                TERSE_CHECK(move_slot(ps, s, failed[s], (uint32_t)ps->reps[s].version,
                                      (uint32_t)ps->reps[s].staleness, key, push));
            }
        if (!any) break;
        memcpy(mask, failed, sizeof mask); /* run the moved slots again */
    }
    if (refusal != TERSE_OK) {
        /* a push refused for a reason of its own is not to be resent */
        for (int s = 0; push && k->unacked && s < S && refusal != TERSE_ERR_STALE &&
                        refusal != TERSE_ERR_NONFINITE;
             s++)
            k->unacked[s].valid = 0;
        return TERSE_ERROR(refusal, "%s", why);
    }
    if (pull) ps->stats.pulls++;
    if (push) ps->stats.pushes++;
    return TERSE_OK;
}

terse_status terse__ps_worker_run(terse_comm *c, terse_request *r, int *keep_usable) {
    (void)c;
    return exchange(r->a.ext.obj, r->a.ext.item, r->a.ext.op, r->a.ext.key, r->a.ext.buf,
                    r->a.ext.clock, r->a.ext.weight, keep_usable);
}

static terse_status start(terse_ps *ps, int op, size_t key, float *buf, float weight,
                          terse_request **req) {
    const char *what = op_name(op);
    if (!ps) return TERSE_ERROR(TERSE_ERR_INVALID, "%s: ps is NULL", what);
    if (ps->is_server)
        return TERSE_ERROR(TERSE_ERR_INVALID, "%s on rank %d: this rank is a server, not a worker",
                           what, ps->rank);
    if (ps->finished)
        return TERSE_ERROR(TERSE_ERR_INVALID, "%s on rank %d: this worker already finished", what,
                           ps->rank);
    if (op != TERSE__PS_FINISH) {
        if (key >= ps->nkeys)
            return TERSE_ERROR(TERSE_ERR_INVALID,
                               "%s on rank %d: key %zu was never declared (%zu keys)", what,
                               ps->rank, key, ps->nkeys);
        if (!buf) return TERSE_ERROR(TERSE_ERR_INVALID, "%s on rank %d: buffer is NULL", what, ps->rank);
    }
    terse_request t = terse__engine_make(ps->comm, TERSE__OP_EXT);
    t.a.ext.run = terse__ps_worker_run;
    t.a.ext.obj = ps;
    t.a.ext.item = op == TERSE__PS_FINISH ? NULL : ps->keys[key]; /* resolved now, on this thread */
    t.a.ext.op = op;
    t.a.ext.key = key;
    t.a.ext.buf = buf;
    t.a.ext.clock = ps->clock; /* the step this request belongs to, as started */
    t.a.ext.weight = weight;
    t.a.ext.name = what;
    if (!req) return terse__engine_run_ext(ps->comm, &t);
    return terse__engine_start_ext(ps->comm, &t, req);
}

terse_status terse_ps_push(terse_ps *ps, size_t key, const float *grad, terse_request **req) {
    /* Only read (the buffer field serves pull too). */
    return start(ps, TERSE__PS_PUSH, key, (float *)(uintptr_t)grad, 1.0f, req);
}

terse_status terse_ps_push_weighted(terse_ps *ps, size_t key, const float *grad, double weight,
                                    terse_request **req) {
    if (!ps) return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_push_weighted: ps is NULL");
    if (!(weight > 0.0 && weight <= 3.0e38))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_push_weighted on rank %d: weight %g is not a positive finite "
                           "number",
                           ps->rank, weight);
    if (ps->cfg.mode != TERSE_PS_SYNC || ps->agg->aggregate != terse__ps_agg_mean)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_push_weighted on rank %d: weighted pushes need sync mode "
                           "with the mean aggregator (this job runs %s mode with %s)",
                           ps->rank,
                           ps->cfg.mode == TERSE_PS_SYNC    ? "sync"
                           : ps->cfg.mode == TERSE_PS_ASYNC ? "async"
                                                            : "ssp",
                           ps->aggregator_name[0] ? ps->aggregator_name : "mean");
    return start(ps, TERSE__PS_PUSH, key, (float *)(uintptr_t)grad, (float)weight, req);
}

terse_status terse_ps_pull(terse_ps *ps, size_t key, float *out, terse_request **req) {
    return start(ps, TERSE__PS_PULL, key, out, 1.0f, req);
}

terse_status terse_ps_pushpull(terse_ps *ps, size_t key, float *buf, terse_request **req) {
    return start(ps, TERSE__PS_PUSHPULL, key, buf, 1.0f, req);
}

terse_status terse_ps_finish(terse_ps *ps) {
    if (!ps) return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_finish: ps is NULL");
    if (ps->finished) return TERSE_OK;
    terse_status s = start(ps, TERSE__PS_FINISH, (size_t)-1, NULL, 1.0f, NULL);
    if (s == TERSE_OK) ps->finished = 1;
    return s;
}

void terse__ps_worker_free(terse_ps *ps) {
    for (int s = 0; s < ps->nservers; s++) {
        if (ps->sbuf) free(ps->sbuf[s]);
        if (ps->rbuf) free(ps->rbuf[s]);
    }
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

terse_status terse__ps_test_raw(terse_ps *ps, int server, terse__ps_hdr *h, const void *payload,
                                size_t len, terse__ps_rep *rep) {
    terse_comm *c = ps->comm;
    uint8_t need[TERSE__PS_MAX_SERVERS] = {0};
    if (server < 0 || server >= ps->nservers)
        return TERSE_ERROR(TERSE_ERR_INVALID, "test_raw: no server %d", server);
    need[server] = 1;
    h->seq = ps->seq[server];
    uint8_t hb[TERSE__PS_HDR_BYTES], rb[TERSE__PS_REP_BYTES];
    terse__ps_put_hdr(hb, h);
    terse__fabric_req *q = c->reqs;
    size_t nq = 0;
    TERSE_CHECK(terse__comm_irecv(c, server, terse__ps_tag(server, TERSE__PS_TAG_REP, h->seq), rb,
                                  sizeof rb, TERSE__BYTES_FRAMING, &q[nq++]));
    TERSE_CHECK(terse__comm_isend(c, server, terse__ps_tag(server, TERSE__PS_TAG_HDR, h->seq), hb,
                                  sizeof hb, TERSE__BYTES_FRAMING, &q[nq++]));
    if (len)
        TERSE_CHECK(terse__comm_isend(c, server, terse__ps_tag(server, TERSE__PS_TAG_DATA, h->seq), payload,
                                      len, TERSE__BYTES_PAYLOAD, &q[nq++]));
    TERSE_CHECK(wait_for(ps, q, nq, need));
    ps->seq[server]++;
    TERSE_CHECK(terse__ps_get_rep(rb, rep));
    if (rep->payload_len) {
        uint8_t *junk = malloc(rep->payload_len);
        if (!junk) return TERSE_ERROR(TERSE_ERR_NOMEM, "no memory");
        terse_status s = terse__comm_irecv(c, server, terse__ps_tag(server, TERSE__PS_TAG_RDATA, h->seq),
                                           junk, rep->payload_len, TERSE__BYTES_PAYLOAD, &q[0]);
        if (s == TERSE_OK) s = wait_for(ps, q, 1, need);
        free(junk);
        TERSE_CHECK(s);
    }
    return TERSE_OK;
}
