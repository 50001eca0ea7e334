/* The worker's side: push, pull, pushpull and finish, each an engine
 * request (TERSE__OP_EXT) that the executor runs like a collective. One
 * request talks to every server holding a chunk of its key at once:
 * encode, send header + payload to each, wait for every reply header,
 * then receive and decode the pull payloads. The waits watch only the
 * servers this request needs: a lost fellow worker is the servers'
 * business (ps_loop.c), not a reason to fail here. With replicas 2 the
 * waits, a slot's moves and the goodbye are in ps_failover.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algos/engine/engine.h"
#include "algos/ps/ps.h"
#include "common/error.h"

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
    TERSE_CHECK(terse__comm_poll_lost(c, &lost));
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
                                 servers_alive, &w, 1000000ull, TERSE__PS_NAP_AFTER_NS};
    uint64_t t0 = terse__now_ns();
    terse_status s = terse__fabric_wait_ex(c->fabric, reqs, n, &o);
    pthread_mutex_lock(&c->stats_lock);
    c->stats.network_seconds += (double)(terse__now_ns() - t0) * 1e-9;
    pthread_mutex_unlock(&c->stats_lock);
    return s;
}

terse_status terse__ps_grow(uint8_t **buf, size_t *cap, size_t want) {
    if (*cap >= want) return TERSE_OK;
    uint8_t *p = realloc(*buf, want);
    if (!p) return TERSE_ERROR(TERSE_ERR_NOMEM, "no memory for %zu bytes of payload", want);
    *buf = p;
    *cap = want;
    return TERSE_OK;
}

const char *terse__ps_op_name(int op) {
    switch (op) {
    case TERSE__PS_PUSH: return "terse_ps_push";
    case TERSE__PS_PULL: return "terse_ps_pull";
    case TERSE__PS_PUSHPULL: return "terse_ps_pushpull";
    default: return "terse_ps_finish";
    }
}

terse_status terse__ps_encode_for(terse__ps_key *k, int s, const float *grad, uint8_t **buf,
                                  size_t *cap, size_t *len) {
    TERSE_CHECK(terse__ps_grow(buf, cap, k->srv_push_bound[s]));
    size_t off = 0;
    for (size_t c = 0; c < k->nchunks; c++) {
        if (k->server[c] != s) continue;
        size_t got = 0;
        TERSE_CHECK(terse_encode(k->push_enc[c], grad + c * k->chunk_floats, *buf + off,
                                 *cap - off, &got));
        off += got;
    }
    *len = off;
    return TERSE_OK;
}

/* Encode key's chunks held by server s into sbuf[s]; *len its size. */
static terse_status encode_for(terse_ps *ps, terse__ps_key *k, int s, const float *grad,
                               size_t *len) {
    return terse__ps_encode_for(k, s, grad, &ps->sbuf[s], &ps->sbuf_cap[s], len);
}

static terse_status decode_from(terse_ps *ps, terse__ps_key *k, int s, size_t key, float *out,
                                size_t len) {
    return terse__ps_decode_from(ps, k, s, ps->rbuf[s], key, out, len);
}

terse_status terse__ps_decode_from(terse_ps *ps, terse__ps_key *k, int s, const uint8_t *p,
                                   size_t key, float *out, size_t len) {
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
                       terse__ps_op_name(op), key, ps->rank, s, r->text);
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
    terse__ps_early_pulls early = {k, qslot, 0, {0}, {0}};
    terse_status st = TERSE_OK;
    for (int s = 0; s < S; s++) {
        early.rep_at[s] = -1;
        if (!mask[s]) continue;
        terse__ps_hdr h = {op, key, clock, plen[s], ps->seq[s], k ? k->srv_floats[s] : 0,
                           k ? k->decl_hash : 0, weight, ps->epoch[s], 0, 0};
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
        TERSE_CHECK(terse__ps_wait_slots(ps, q, nq, qslot, failed, 0, &early));
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
                               terse__ps_op_name(op), terse_last_error());
        if (r->status == (terse_status)TERSE__PS_MOVED && replicated) {
            failed[s] = 2; /* the slot went back to its head's replacement */
            continue;
        }
        if (r->status != TERSE_OK) {
            if (first < 0) first = s;
            if (r->payload_len)
                return TERSE_ERROR(TERSE_ERR_CORRUPT,
                                   "rank %d: server rank %d refused %s but announced %llu bytes",
                                   ps->rank, t, terse__ps_op_name(op), (unsigned long long)r->payload_len);
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
        TERSE_CHECK(terse__ps_grow(&ps->rbuf[s], &ps->rbuf_cap[s], r->payload_len));
        qslot[nq] = s;
        TERSE_CHECK(terse__comm_irecv(c, t, terse__ps_tag(s, TERSE__PS_TAG_RDATA, ps->seq[s] - 1),
                                      ps->rbuf[s], r->payload_len, TERSE__BYTES_PAYLOAD, &q[nq++]));
    }
    if (nq && replicated)
        TERSE_CHECK(terse__ps_wait_slots(ps, q, nq, qslot, failed, 0, NULL));
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
    if (op == TERSE__PS_FINISH && ps->cfg.replicas == 2) return terse__ps_finish_replicated(ps);
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
            TERSE_CHECK(terse__ps_grow(&u->buf, &u->cap, plen[s]));
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
        if (mask[s] && ps->stale[s]) TERSE_CHECK(terse__ps_move_slot(ps, s, 1, 0, 0, key, push));
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
                TERSE_CHECK(terse__ps_move_slot(ps, s, failed[s], (uint32_t)ps->reps[s].version,
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
    terse_ps *ps = r->a.ext.obj;
    if (r->a.ext.op == TERSE__PS_FINISH)
        return exchange(ps, NULL, TERSE__PS_FINISH, (size_t)-1, NULL, r->a.ext.clock, 1.0f,
                        keep_usable);
    if (ps->cfg.replicas != 2) return terse__ps_pipe_run(ps, r, keep_usable);
    /* replicas 2: a key's partitions one after another, each through the
     * failover-aware exchange; a refusal of one does not undo the others */
    terse__ps_key **parts = r->a.ext.item;
    terse_status first = TERSE_OK;
    char why[512] = "";
    for (size_t p = 0; p < parts[0]->nparts; p++) {
        terse__ps_key *k = parts[p];
        int usable = 0;
        terse_status s = exchange(ps, k, r->a.ext.op, k->index, r->a.ext.buf + k->off,
                                  r->a.ext.clock, r->a.ext.weight, &usable);
        if (s != TERSE_OK && !usable) return s;
        if (s != TERSE_OK && first == TERSE_OK) {
            first = s;
            snprintf(why, sizeof why, "%s", terse_last_error());
        }
    }
    if (first == TERSE_OK) return TERSE_OK;
    *keep_usable = 1;
    terse__error_restore(why);
    return first;
}

static terse_status start(terse_ps *ps, int op, size_t key, float *buf, float weight,
                          terse_request **req) {
    const char *what = terse__ps_op_name(op);
    if (!ps) return TERSE_ERROR(TERSE_ERR_INVALID, "%s: ps is NULL", what);
    if (ps->is_server)
        return TERSE_ERROR(TERSE_ERR_INVALID, "%s on rank %d: this rank is a server, not a worker",
                           what, ps->rank);
    if (ps->finished)
        return TERSE_ERROR(TERSE_ERR_INVALID, "%s on rank %d: this worker already finished", what,
                           ps->rank);
    if (ps->colo) TERSE_CHECK(terse__ps_colo_serve(ps));
    if (op != TERSE__PS_FINISH) {
        if (key >= ps->nukeys)
            return TERSE_ERROR(TERSE_ERR_INVALID,
                               "%s on rank %d: key %zu was never declared (%zu keys)", what,
                               ps->rank, key, ps->nukeys);
        if (!buf) return TERSE_ERROR(TERSE_ERR_INVALID, "%s on rank %d: buffer is NULL", what, ps->rank);
    }
    terse_request t = terse__engine_make(ps->comm, TERSE__OP_EXT);
    t.a.ext.run = terse__ps_worker_run;
    t.a.ext.obj = ps;
    /* resolved now, on this thread: a declare may grow the tables meanwhile */
    t.a.ext.item = op == TERSE__PS_FINISH ? NULL : ps->ukeys[key].parts;
    t.a.ext.prio = op == TERSE__PS_FINISH ? 0 : ps->ukeys[key].priority;
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
