/* The worker's side: push, pull, pushpull and finish, each an engine
 * request (TERSE__OP_EXT) that the executor runs like a collective. One
 * request talks to every server holding a chunk of its key at once:
 * encode, send header + payload to each, wait for every reply header,
 * then receive and decode the pull payloads. The waits watch only the
 * servers this request needs: a lost fellow worker is the servers'
 * business (ps_server.c), not a reason to fail here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algos/engine.h"
#include "algos/ps.h"
#include "common/error.h"

#define PS_NAP_AFTER_NS 200000u

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
                               "rank %d: parameter server rank %d was lost (its connection to "
                               "the bootstrap store dropped without a goodbye) while this worker "
                               "waited for it",
                               ps->rank, s);
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

static terse_status exchange(terse_ps *ps, terse__ps_key *k, int op, size_t key, float *buf,
                             uint64_t clock, float weight, int *keep_usable) {
    terse_comm *c = ps->comm;
    const int S = ps->nservers, push = op == TERSE__PS_PUSH || op == TERSE__PS_PUSHPULL,
              pull = op == TERSE__PS_PULL || op == TERSE__PS_PUSHPULL;
    /* terse_ps_create keeps the servers within what one wait can hold:
     * three requests per server in c->reqs. */
    uint8_t need[TERSE__PS_MAX_SERVERS];
    size_t plen[TERSE__PS_MAX_SERVERS] = {0};
    terse__fabric_req *q = c->reqs;
    size_t nq = 0;
    terse_status st = TERSE_OK;
    uint64_t t0 = terse__now_ns();
    for (int s = 0; s < S; s++) {
        need[s] = k ? k->srv_nchunks[s] > 0 : 1;
        if (!need[s]) continue;
        if (push) TERSE_CHECK(encode_for(ps, k, s, buf, &plen[s]));
        terse__ps_hdr h = {op, key, clock, plen[s], ps->seq[s], k ? k->srv_floats[s] : 0,
                           k ? k->decl_hash : 0, weight};
        terse__ps_put_hdr(ps->whdr + s * TERSE__PS_HDR_BYTES, &h);
    }
    terse__comm_codec_time(c, t0);
    for (int s = 0; s < S; s++) {
        if (!need[s]) continue;
        uint64_t sq = ps->seq[s];
        TERSE_CHECK(terse__comm_irecv(c, s, terse__ps_tag(TERSE__PS_TAG_REP, sq),
                                      ps->wrep + s * TERSE__PS_REP_BYTES, TERSE__PS_REP_BYTES,
                                      TERSE__BYTES_FRAMING, &q[nq++]));
        TERSE_CHECK(terse__comm_isend(c, s, terse__ps_tag(TERSE__PS_TAG_HDR, sq),
                                      ps->whdr + s * TERSE__PS_HDR_BYTES, TERSE__PS_HDR_BYTES,
                                      TERSE__BYTES_FRAMING, &q[nq++]));
        if (plen[s])
            TERSE_CHECK(terse__comm_isend(c, s, terse__ps_tag(TERSE__PS_TAG_DATA, sq), ps->sbuf[s],
                                          plen[s], TERSE__BYTES_PAYLOAD, &q[nq++]));
    }
    TERSE_CHECK(wait_for(ps, q, nq, need));
    /* Every reply is in: the conversation with each server moved on. */
    int first = -1;
    nq = 0;
    for (int s = 0; s < S; s++) {
        if (!need[s]) continue;
        ps->seq[s]++;
        terse__ps_rep *r = &ps->reps[s];
        st = terse__ps_get_rep(ps->wrep + s * TERSE__PS_REP_BYTES, r);
        if (st == TERSE_OK && r->seq != ps->seq[s] - 1)
            st = TERSE_ERROR(TERSE_ERR_CORRUPT, "reply for message %llu, expected %llu",
                             (unsigned long long)r->seq, (unsigned long long)(ps->seq[s] - 1));
        if (st != TERSE_OK)
            return TERSE_ERROR(st, "rank %d: server rank %d's reply to %s: %s", ps->rank, s,
                               op_name(op), terse_last_error());
        if (r->status != TERSE_OK) {
            if (first < 0) first = s;
            if (r->payload_len)
                return TERSE_ERROR(TERSE_ERR_CORRUPT,
                                   "rank %d: server rank %d refused %s but announced %llu bytes",
                                   ps->rank, s, op_name(op), (unsigned long long)r->payload_len);
            continue;
        }
        if (!pull) continue;
        if (r->payload_len == 0 || r->payload_len > k->srv_pull_bound[s])
            return TERSE_ERROR(TERSE_ERR_CORRUPT,
                               "rank %d: server rank %d announced a %llu-byte pull of key %zu; "
                               "its chunks here encode to 1..%zu bytes",
                               ps->rank, s, (unsigned long long)r->payload_len, key,
                               k->srv_pull_bound[s]);
        TERSE_CHECK(grow(&ps->rbuf[s], &ps->rbuf_cap[s], r->payload_len));
        TERSE_CHECK(terse__comm_irecv(c, s, terse__ps_tag(TERSE__PS_TAG_RDATA, ps->seq[s] - 1),
                                      ps->rbuf[s], r->payload_len, TERSE__BYTES_PAYLOAD, &q[nq++]));
    }
    if (nq) TERSE_CHECK(wait_for(ps, q, nq, need));
    if (first >= 0) {
        /* A refusal concerns this request only: the conversation is intact. */
        *keep_usable = 1;
        /* A push dropped as late or stale, or left out as non-finite, went
         * with its step; any other refusal leaves the step open for it. */
        int again = 0; /* any server whose step waits for this worker */
        for (int s = 0; s < S; s++) {
            terse_status why = need[s] ? ps->reps[s].status : TERSE_OK;
            again |= why != TERSE_OK && why != TERSE_ERR_STALE && why != TERSE_ERR_NONFINITE;
        }
        if (push && ps->cfg.mode == TERSE_PS_SYNC && again)
            atomic_store(&ps->step_refused, 1); /* push again */
        return refused(ps, op, key, first, &ps->reps[first]);
    }
    if (pull) {
        t0 = terse__now_ns();
        uint64_t newest = 0;
        for (int s = 0; s < S; s++) {
            if (!need[s]) continue;
            TERSE_CHECK(decode_from(ps, k, s, key, buf, ps->reps[s].payload_len));
            if (ps->reps[s].version > newest) newest = ps->reps[s].version;
        }
        terse__comm_codec_time(c, t0);
        /* Behind a quorum: the next step is the server's. */
        if (ps->cfg.mode == TERSE_PS_SYNC && newest > clock + 1 &&
            newest > atomic_load(&ps->clock_floor))
            atomic_store(&ps->clock_floor, newest);
        ps->stats.pulls++;
    }
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
    TERSE_CHECK(terse__comm_irecv(c, server, terse__ps_tag(TERSE__PS_TAG_REP, h->seq), rb,
                                  sizeof rb, TERSE__BYTES_FRAMING, &q[nq++]));
    TERSE_CHECK(terse__comm_isend(c, server, terse__ps_tag(TERSE__PS_TAG_HDR, h->seq), hb,
                                  sizeof hb, TERSE__BYTES_FRAMING, &q[nq++]));
    if (len)
        TERSE_CHECK(terse__comm_isend(c, server, terse__ps_tag(TERSE__PS_TAG_DATA, h->seq), payload,
                                      len, TERSE__BYTES_PAYLOAD, &q[nq++]));
    TERSE_CHECK(wait_for(ps, q, nq, need));
    ps->seq[server]++;
    TERSE_CHECK(terse__ps_get_rep(rb, rep));
    if (rep->payload_len) {
        uint8_t *junk = malloc(rep->payload_len);
        if (!junk) return TERSE_ERROR(TERSE_ERR_NOMEM, "no memory");
        terse_status s = terse__comm_irecv(c, server, terse__ps_tag(TERSE__PS_TAG_RDATA, h->seq),
                                           junk, rep->payload_len, TERSE__BYTES_PAYLOAD, &q[0]);
        if (s == TERSE_OK) s = wait_for(ps, q, 1, need);
        free(junk);
        TERSE_CHECK(s);
    }
    return TERSE_OK;
}
