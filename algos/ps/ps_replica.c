/* Chain replication of the parameter server's shards (replicas = 2;
 * van Renesse and Schneider's chain replication, replicating after
 * aggregation as Li et al.'s parameter server does).
 *
 * Slots. Placement gives every chunk a server index s (its slot). With
 * replicas 2 rank s is the slot's head and rank (s + 1) mod S its replica:
 * each server runs two instances of the server loop's state, its own
 * (slot = rank) and a mirror (slot = rank - 1 mod S) whose shards start
 * from the same declaration and init. Messages carry the slot in their tag
 * (algos/ps/ps.h), so a worker's conversations about two slots with one rank
 * never meet.
 *
 * Steady state. When the head closes a step of a key it sends the shard's
 * new state (parameters, momentum, aggregator center) to the replica, and
 * serves the step's pulls only once the replica acknowledged it: a step a
 * worker has seen is on both servers.
 *   head -> replica  REPL(rseq)      64-byte header: key, version, rseq,
 *                                    payload length, floats, the
 *                                    payload's crc32c, its own crc32c
 *                    REPLDATA(rseq)  the state, value | mom | center
 *   replica -> head  ACK(rseq)       rseq and version, 16 bytes
 * The replica takes a state only if it is the key's next version and
 * checks. A head closes a key's next step only once the last one is
 * acknowledged (its buffers are in use until then).
 *
 * Failure. The store announces the head's loss; the replica's mirror
 * instance is promoted (ps_loop.c) and serves the slot with the state of
 * the last acknowledged step. Workers move the slot to the replica (epoch
 * 1) and resend the pushes no pull has covered; the new head applies each
 * at most once (a resend of a closed step is answered as applied,
 * counted in `duplicates`). Pushes are aggregated in worker-rank order, so
 * the step comes out bit for bit as the dead head would have made it.
 * Pull codecs must be stateless (dense) here: a pull codec's server-side
 * error feedback lives on the head alone. If the replica dies instead, the
 * head goes on alone. A third server's death, or both of a slot's, fails
 * the workers naming the slot.
 *
 * Replacement. A new process that joins as the dead head's rank
 * (TERSE_REJOIN=1; the store announces it, and every rank puts its address
 * in the fabric) gets its slots back from the servers that stood in:
 *   - the acting head (the old replica) hands the slot back: the roster
 *     (which workers finished), then every key's state at its last closed
 *     step, over the replication channel in the other direction, with the
 *     next epoch; from then on it tells requests of older epochs MOVED,
 *     drops the pushes of the open steps (their workers resend them to the
 *     replacement, as after a failover) and is the slot's replica again;
 *   - the head of the slot before (whose replica the dead rank was) sends
 *     the replacement the roster and every key's state: it catches up, and
 *     is that slot's replica again once every key arrived (before that,
 *     the slot cannot fail over to it);
 *   - the replacement holds workers' requests until its slot's state is in.
 * Workers told MOVED wait for the store's announcement, move the slot back
 * (epoch + 1) and resend what no pull covered. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algos/comm/comm.h"
#include "algos/ps/ps.h"
#include "common/bytes.h"
#include "common/crc32c.h"
#include "common/error.h"

#define REPL_MAGIC 0x43535054u /* "TPSC" */
/* Replication messages that carry no key's state. */
#define KEY_ABANDON UINT64_MAX      /* the head stopped replicating here */
#define KEY_ROSTER (UINT64_MAX - 1) /* per rank: bit 0 finished (nranks bytes) */

size_t terse__ps_state_bytes(const terse_ps *ps, const terse__ps_shard *sh) {
    (void)ps;
    size_t parts = 1 + (sh->mom != NULL) + (sh->center != NULL);
    return parts * sh->nfloats * sizeof(float);
}

/* ---------------------------------------------------------------- create */

terse_status terse__ps_mirror_create(terse_ps *ps) {
    terse_ps *m = calloc(1, sizeof *m);
    if (!m) return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_create: no memory");
    ps->mirror = m;
    m->comm = ps->comm;
    m->cfg = ps->cfg;
    memcpy(m->aggregator_name, ps->aggregator_name, sizeof m->aggregator_name);
    m->cfg.aggregator = m->aggregator_name;
    m->agg = ps->agg;
    m->agg_params = ps->agg_params;
    m->rule = ps->rule;
    m->stale_rule = ps->stale_rule;
    m->dc_lambda = ps->dc_lambda;
    m->stale_mu = ps->stale_mu;
    m->rank = ps->rank;
    m->nranks = ps->nranks;
    m->nservers = ps->nservers;
    m->nworkers = ps->nworkers;
    m->is_server = 1;
    m->chunk_floats = ps->chunk_floats;
    m->slot = (ps->rank + ps->nservers - 1) % ps->nservers;
    m->backup = -1; /* a promoted replica goes on alone */
    m->epoch_cur = 1;
    m->repl_src = m->slot;
    m->stats.size = sizeof m->stats;
    size_t N = (size_t)ps->nranks;
    m->lanes = 1; /* replicas 2: one conversation per pair */
    m->push_lanes = 1;
    m->peers = calloc(N, sizeof *m->peers);
    m->inputs = calloc(N, sizeof *m->inputs);
    m->wts = calloc(N, sizeof *m->wts);
    if (!m->peers || !m->inputs || !m->wts)
        return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_create: no memory");
    ps->backup = (ps->rank + 1) % ps->nservers;
    return TERSE_OK;
}

terse_status terse__ps_mirror_declare(terse_ps *ps, terse__ps_key *k, const float *init) {
    terse_ps *m = ps->mirror;
    TERSE_CHECK(terse__ps_keys_reserve(m));
    terse__ps_key *c = malloc(sizeof *c);
    if (!c) return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_declare: no memory");
    *c = *k; /* placement and specs are the head's; it owns them */
    c->shard = NULL; /* mirror_free frees a copy's shard and the copy alone */
    c->push_enc = c->pull_dec = NULL;
    c->unacked = NULL;
    terse_status s = terse__ps_shard_init(m, c, init);
    if (s != TERSE_OK) {
        if (c->shard) terse__ps_shard_free(m, c->shard);
        free(c);
        return s;
    }
    if (c->shard && terse__ps_state_bytes(m, c->shard) > m->rstate_cap) {
        size_t want = terse__ps_state_bytes(m, c->shard);
        uint8_t *b = realloc(m->rbuf_state, want);
        if (!b) {
            terse__ps_shard_free(m, c->shard);
            free(c);
            return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_declare: no memory");
        }
        m->rbuf_state = b;
        m->rstate_cap = want;
    }
    m->keys[m->nkeys++] = c;
    return TERSE_OK;
}

void terse__ps_mirror_free(terse_ps *ps) {
    terse_ps *m = ps->mirror;
    if (!m) return;
    for (size_t i = 0; i < m->nkeys; i++) {
        if (m->keys[i]->shard) terse__ps_shard_free(m, m->keys[i]->shard);
        free(m->keys[i]);
    }
    free(m->keys), free(m->peers), free(m->inputs), free(m->wts), free(m->scratch);
    free(m->rbuf_state), free(m->caught), free(m->roster);
    if (m->quorum_log) fclose(m->quorum_log);
    free(m);
    ps->mirror = NULL;
}

/* ---------------------------------------------------------------- head */

static void pack(const terse__ps_shard *sh, uint8_t *out) {
    size_t n = sh->nfloats * sizeof(float);
    memcpy(out, sh->value, n);
    if (sh->mom) memcpy(out += n, sh->mom, n);
    if (sh->center) memcpy(out + n, sh->center, n);
}

static void unpack(terse__ps_shard *sh, const uint8_t *in) {
    size_t n = sh->nfloats * sizeof(float);
    memcpy(sh->value, in, n);
    if (sh->mom) memcpy(sh->mom, in += n, n);
    if (sh->center) memcpy(sh->center, in + n, n);
}

terse_status terse__ps_replicate(terse_ps *ps, size_t key) {
    if (ps->backup < 0) return TERSE_OK;
    terse__ps_shard *sh = ps->keys[key]->shard;
    size_t len = terse__ps_state_bytes(ps, sh);
    if (sh->repl_cap < len) {
        uint8_t *b = realloc(sh->repl_buf, len);
        if (!b) return TERSE_ERROR(TERSE_ERR_NOMEM, "parameter server rank %d: no memory", ps->rank);
        sh->repl_buf = b;
        sh->repl_cap = len;
    }
    pack(sh, sh->repl_buf);
    uint64_t rseq = ps->rseq++;
    uint8_t *h = sh->repl_hdr;
    memset(h, 0, TERSE__PS_HDR_BYTES);
    terse__put_u32(h, REPL_MAGIC);
    terse__put_u64(h + 8, key);
    terse__put_u64(h + 16, sh->version);
    terse__put_u64(h + 24, rseq);
    terse__put_u64(h + 32, len);
    terse__put_u64(h + 40, sh->nfloats);
    terse__put_u32(h + 48, terse__crc32c_update(0, sh->repl_buf, len));
    terse__put_u32(h + 52, ps->repl_epoch);
    terse__put_u32(h + 60, terse__crc32c_update(0, h, 60));
    memset(&sh->repl_hreq, 0, sizeof sh->repl_hreq);
    memset(&sh->repl_dreq, 0, sizeof sh->repl_dreq);
    memset(&sh->ack_req, 0, sizeof sh->ack_req);
    sh->repl_rseq = rseq;
    sh->repl_ns = terse__now_ns();
    sh->repl_pending = 1;
    terse_comm *c = ps->comm;
    int b = ps->backup;
    TERSE_CHECK(terse__comm_irecv(c, b, terse__ps_tag(ps->slot, TERSE__PS_TAG_ACK, rseq), sh->ack,
                                  sizeof sh->ack, TERSE__BYTES_FRAMING, &sh->ack_req));
    TERSE_CHECK(terse__comm_isend(c, b, terse__ps_tag(ps->slot, TERSE__PS_TAG_REPL, rseq), h,
                                  TERSE__PS_HDR_BYTES, TERSE__BYTES_FRAMING, &sh->repl_hreq));
    return terse__comm_isend(c, b, terse__ps_tag(ps->slot, TERSE__PS_TAG_REPLDATA, rseq),
                             sh->repl_buf, len, TERSE__BYTES_PAYLOAD, &sh->repl_dreq);
}

/* The roster to the replica (all: every worker done, the end of serving):
 * which workers finished, so that a replacement does not wait for their
 * goodbyes. No acknowledgement: the next message's order covers it. */
static terse_status send_roster(terse_ps *ps, int all) {
    terse__fabric *f = ps->comm->fabric;
    if (!terse__fabric_req_idle(f, &ps->roster_hreq) || !terse__fabric_req_idle(f, &ps->roster_dreq))
        return TERSE_ERROR(TERSE_ERR_INTERNAL, "parameter server rank %d: a roster is still on "
                                               "its way", ps->rank);
    size_t N = (size_t)ps->nranks;
    if (!ps->roster && !(ps->roster = malloc(N)))
        return TERSE_ERROR(TERSE_ERR_NOMEM, "parameter server rank %d: no memory", ps->rank);
    for (size_t r = 0; r < N; r++)
        ps->roster[r] = r >= (size_t)ps->nservers && (all || terse__ps_wk(ps, (int)r)->finished);
    uint8_t *h = ps->roster_hdr;
    memset(h, 0, TERSE__PS_HDR_BYTES);
    terse__put_u32(h, REPL_MAGIC);
    terse__put_u64(h + 8, KEY_ROSTER);
    uint64_t rseq = ps->rseq++;
    terse__put_u64(h + 24, rseq);
    terse__put_u64(h + 32, N);
    terse__put_u32(h + 48, terse__crc32c_update(0, ps->roster, N));
    terse__put_u32(h + 52, ps->repl_epoch);
    terse__put_u32(h + 60, terse__crc32c_update(0, h, 60));
    memset(&ps->roster_hreq, 0, sizeof ps->roster_hreq);
    memset(&ps->roster_dreq, 0, sizeof ps->roster_dreq);
    terse_comm *c = ps->comm;
    TERSE_CHECK(terse__comm_isend(c, ps->backup, terse__ps_tag(ps->slot, TERSE__PS_TAG_REPL, rseq),
                                  h, TERSE__PS_HDR_BYTES, TERSE__BYTES_FRAMING, &ps->roster_hreq));
    return terse__comm_isend(c, ps->backup, terse__ps_tag(ps->slot, TERSE__PS_TAG_REPLDATA, rseq),
                             ps->roster, N, TERSE__BYTES_FRAMING, &ps->roster_dreq);
}

/* The roster, then every key's state, to the instance's backup. */
static terse_status send_all(terse_ps *ps) {
    TERSE_CHECK(send_roster(ps, 0));
    for (size_t k = 0; k < ps->nkeys; k++)
        if (ps->keys[k]->shard) TERSE_CHECK(terse__ps_replicate(ps, k));
    return TERSE_OK;
}

terse_status terse__ps_backup_add(terse_ps *ps, int r) {
    ps->backup = r;
    ps->rseq = 0; /* a new conversation with a new process */
    ps->repl_epoch = ps->epoch_cur; /* the slot's: the replica would serve the next one */
    ps->backup_fresh = 1;
    fprintf(stderr,
            "terse: parameter server rank %d: its replica's replacement, server rank %d, "
            "catches up on slot %d\n",
            ps->rank, r, ps->slot);
    return send_all(ps);
}

terse_status terse__ps_hand_back(terse_ps *m, uint32_t inc) {
    const int head = m->slot;
    uint64_t step = 0;
    m->moved_epoch = m->epoch_cur + 1;
    m->moved_inc = inc;
    m->epoch_cur += 2; /* if the replacement dies too, this replica serves again */
    m->promoted = 0;
    m->took_over = 0;
    /* The open steps' pushes are dropped: their workers, told MOVED, resend
     * them to the head, which aggregates them in rank order as this
     * instance would have. */
    for (size_t k = 0; k < m->nkeys; k++) {
        terse__ps_shard *sh = m->keys[k]->shard;
        if (!sh) continue;
        memset(sh->has, 0, (size_t)m->nranks);
        sh->count = 0;
        step = sh->version;
    }
    fprintf(stderr,
            "terse: parameter server rank %d: server rank %d is back (a replacement, "
            "incarnation %u); slot %d goes back to it at step %llu (epoch %u)\n",
            m->rank, head, inc, head, (unsigned long long)step, m->moved_epoch);
    m->backup = head;
    m->rseq = 0;
    m->repl_epoch = m->moved_epoch;
    m->handing = 1;
    m->hand_failed = 0;
    /* and listens to the head again, from its first message */
    m->listening = 0;
    m->rseq_next = 0;
    m->rstate = 0;
    m->abandoned = 0;
    m->repl_src = head;
    return send_all(m);
}

void terse__ps_tell_done(terse_ps *ps) {
    if (ps->backup < 0 || !ps->backup_fresh) return;
    terse_comm *c = ps->comm;
    terse__fabric *f = c->fabric;
    if (send_roster(ps, 1) != TERSE_OK) return;
    /* a second at most: a replacement that is gone needs no goodbye */
    uint64_t until = terse__now_ns() + 1000000000ull;
    while (!(terse__fabric_req_idle(f, &ps->roster_hreq) &&
             terse__fabric_req_idle(f, &ps->roster_dreq)) &&
           terse__now_ns() < until) {
        size_t ev = 0;
        if (terse__fabric_progress(f, &ev) != TERSE_OK) break;
    }
}

/* A transfer that will not cancel is given up (shm may never return it). */
static void let_go(terse__fabric *f, terse__fabric_req *r) {
    if (!terse__fabric_cancel(f, r)) (void)terse__fabric_give_up(f, r);
}

/* The replica is dead: what is posted to it may never come back on shm,
 * so what will not cancel is given up (its buffers stay with the shard). */
static int cancel_repl(terse_ps *ps, terse__ps_shard *sh) {
    terse__fabric *f = ps->comm->fabric;
    terse__fabric_req *r[3] = {&sh->ack_req, &sh->repl_hreq, &sh->repl_dreq};
    int ok = 1;
    for (int i = 0; i < 3; i++) ok &= terse__fabric_cancel(f, r[i]) || terse__fabric_give_up(f, r[i]);
    return ok;
}

terse_status terse__ps_backup_lost(terse_ps *ps, const char *how, int maybe_alive) {
    if (ps->backup < 0) return TERSE_OK;
    fprintf(stderr,
            "terse: parameter server rank %d: its replica, server rank %d, was lost (%s); it "
            "serves its shard alone from now on\n",
            ps->rank, ps->backup, how);
    if (maybe_alive) {
        /* Tell it, for when it runs again: it must never take the slot over
         * with its old state (ABANDON: key UINT64_MAX, the last version). */
        uint8_t *h = ps->abandon_hdr;
        memset(h, 0, TERSE__PS_HDR_BYTES);
        terse__put_u32(h, REPL_MAGIC);
        terse__put_u64(h + 8, UINT64_MAX);
        terse__put_u64(h + 24, ps->rseq);
        terse__put_u32(h + 60, terse__crc32c_update(0, h, 60));
        memset(&ps->abandon_req, 0, sizeof ps->abandon_req);
        TERSE_CHECK(terse__comm_isend(ps->comm, ps->backup,
                                      terse__ps_tag(ps->slot, TERSE__PS_TAG_REPL, ps->rseq++), h,
                                      TERSE__PS_HDR_BYTES, TERSE__BYTES_FRAMING,
                                      &ps->abandon_req));
    }
    ps->backup = -1;
    ps->backup_fresh = 0;
    let_go(ps->comm->fabric, &ps->roster_hreq);
    let_go(ps->comm->fabric, &ps->roster_dreq);
    for (size_t k = 0; k < ps->nkeys; k++) {
        terse__ps_shard *sh = ps->keys[k]->shard;
        if (!sh || !sh->repl_pending) continue;
        if (!cancel_repl(ps, sh))
            return TERSE_ERROR(TERSE_ERR_TRANSPORT,
                               "parameter server rank %d: a transfer to its lost replica would "
                               "not cancel",
                               ps->rank);
        sh->repl_pending = 0;
        TERSE_CHECK(terse__ps_wake(ps, k));
        TERSE_CHECK(terse__ps_maybe_close(ps, k));
    }
    return TERSE_OK;
}

static terse_status head_progress(terse_ps *ps) {
    const terse__fabric *f = ps->comm->fabric;
    /* A replica that stopped (not dead: the store says nothing) must not
     * hold the slot's steps: half the timeout, then the head goes alone. */
    const uint64_t limit = (uint64_t)ps->comm->timeout_ms * 500000ull, now = terse__now_ns();
    for (size_t k = 0; k < ps->nkeys && ps->backup >= 0; k++) {
        terse__ps_shard *sh = ps->keys[k]->shard;
        if (!sh || !sh->repl_pending) continue;
        if (now > sh->repl_ns && now - sh->repl_ns >= limit) {
            char how[96];
            snprintf(how, sizeof how, "it acknowledged nothing for %llu ms",
                     (unsigned long long)((now - sh->repl_ns) / 1000000u));
            return terse__ps_backup_lost(ps, how, 1);
        }
        if (!terse__fabric_req_idle(f, &sh->ack_req) || !terse__fabric_req_idle(f, &sh->repl_hreq) ||
            !terse__fabric_req_idle(f, &sh->repl_dreq))
            continue;
        if (sh->ack_req.error || sh->repl_hreq.error || sh->repl_dreq.error)
            return terse__ps_backup_lost(ps, "a replication transfer failed", 0);
        if (terse__get_u64(sh->ack) != sh->repl_rseq || terse__get_u64(sh->ack + 8) != sh->version)
            return terse__ps_backup_lost(ps, "it acknowledged a step it was not sent", 1);
        sh->repl_pending = 0;
        ps->stats.replicated++;
        TERSE_CHECK(terse__ps_wake(ps, k));
        TERSE_CHECK(terse__ps_maybe_close(ps, k)); /* a step that waited for this ack */
    }
    return TERSE_OK;
}

void terse__ps_stop_handing(terse_ps *m) {
    if (!m->handing) return;
    for (size_t k = 0; k < m->nkeys; k++) {
        terse__ps_shard *sh = m->keys[k]->shard;
        if (!sh) continue;
        (void)cancel_repl(m, sh); /* what will not cancel is given up */
        sh->repl_pending = 0;
    }
    m->handing = 0;
    m->backup = -1;
}

/* A mirror handing its slot back: collect the replacement's acks. A
 * transfer that fails leaves it to the store's notice (the replacement
 * died: the slot comes back here at the next epoch). */
static terse_status handing_progress(terse_ps *m) {
    const terse__fabric *f = m->comm->fabric;
    int pending = 0;
    for (size_t k = 0; k < m->nkeys; k++) {
        terse__ps_shard *sh = m->keys[k]->shard;
        if (!sh || !sh->repl_pending) continue;
        if (!terse__fabric_req_idle(f, &sh->ack_req) || !terse__fabric_req_idle(f, &sh->repl_hreq) ||
            !terse__fabric_req_idle(f, &sh->repl_dreq)) {
            pending = 1;
            continue;
        }
        if (sh->ack_req.error || sh->repl_hreq.error || sh->repl_dreq.error ||
            terse__get_u64(sh->ack) != sh->repl_rseq || terse__get_u64(sh->ack + 8) != sh->version) {
            /* Left as it is: if the replacement died, the store's notice
             * promotes this instance again (which lets these transfers go);
             * if it lives, it never has the whole slot and refuses its
             * held requests, naming this server, after 3/4 of the timeout. */
            if (!m->hand_failed)
                fprintf(stderr, "terse: parameter server rank %d: handing slot %d back to server "
                                "rank %d failed at key %zu\n",
                        m->rank, m->slot, m->slot, k);
            m->hand_failed = 1;
            pending = 1;
            continue;
        }
        sh->repl_pending = 0;
    }
    if (pending) return TERSE_OK;
    m->handing = 0;
    m->backup = -1;
    return TERSE_OK;
}

/* ---------------------------------------------------------------- replica */

static terse_status post_repl_header(terse_ps *m) {
    memset(&m->rhreq, 0, sizeof m->rhreq);
    m->rstate = 0;
    return terse__comm_irecv(m->comm, m->repl_src,
                             terse__ps_tag(m->slot, TERSE__PS_TAG_REPL, m->rseq_next), m->rhdr,
                             TERSE__PS_HDR_BYTES, TERSE__BYTES_FRAMING, &m->rhreq);
}

/* A replication header from the head: checked against what this replica
 * holds before its payload is received. */
static terse_status take_header(terse_ps *m, size_t *len) {
    const uint8_t *h = m->rhdr;
    if (terse__get_u32(h) != REPL_MAGIC || terse__get_u32(h + 60) != terse__crc32c_update(0, h, 60))
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "a replication header that fails its checks");
    uint64_t key = terse__get_u64(h + 8), version = terse__get_u64(h + 16);
    if (terse__get_u64(h + 24) != m->rseq_next)
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "replication message %llu out of order (%llu due)",
                           (unsigned long long)terse__get_u64(h + 24),
                           (unsigned long long)m->rseq_next);
    if (key == KEY_ABANDON) {
        m->abandoned = 1;
        *len = 0;
        return TERSE_OK;
    }
    if (key == KEY_ROSTER) {
        *len = (size_t)m->nranks;
        if (terse__get_u64(h + 32) != *len)
            return TERSE_ERROR(TERSE_ERR_CORRUPT, "a roster of %llu bytes for %d ranks",
                               (unsigned long long)terse__get_u64(h + 32), m->nranks);
        m->rkey = SIZE_MAX;
        m->rversion = terse__get_u32(h + 52); /* the epoch it hands back at */
        m->rcrc = terse__get_u32(h + 48);
        return TERSE_OK;
    }
    if (key >= m->nkeys || !m->keys[key]->shard)
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "replication of key %llu, not held here",
                           (unsigned long long)key);
    terse__ps_shard *sh = m->keys[key]->shard;
    *len = terse__ps_state_bytes(m, sh);
    /* catching up, a key's first state may be of any step */
    int first = m->catching && !m->caught[key];
    if (terse__get_u64(h + 32) != *len || terse__get_u64(h + 40) != sh->nfloats ||
        (!first && version != sh->version + 1))
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "replication of key %llu: version %llu after %llu, or a wrong size",
                           (unsigned long long)key, (unsigned long long)version,
                           (unsigned long long)sh->version);
    m->rkey = (size_t)key;
    m->rversion = version;
    m->rcrc = terse__get_u32(h + 48);
    return TERSE_OK;
}

/* Room for the largest replication payload: a state or a roster. */
static terse_status state_room(terse_ps *m, size_t len) {
    if (len <= m->rstate_cap) return TERSE_OK;
    uint8_t *b = realloc(m->rbuf_state, len);
    if (!b) return TERSE_ERROR(TERSE_ERR_NOMEM, "parameter server rank %d: no memory", m->rank);
    m->rbuf_state = b;
    m->rstate_cap = len;
    return TERSE_OK;
}

static size_t shards_held(const terse_ps *m) {
    size_t n = 0;
    for (size_t k = 0; k < m->nkeys; k++) n += m->keys[k]->shard != NULL;
    return n;
}

/* Catching up: one more message in; all keys in ends it. */
static terse_status caught_one(terse_ps *m) {
    if (m->ncaught < shards_held(m)) return TERSE_OK;
    m->catching = 0;
    return terse__ps_caught_up(m);
}

static terse_status replica_progress(terse_ps *m) {
    const terse__fabric *f = m->comm->fabric;
    if (m->abandoned) return TERSE_OK;
    if (m->rstate == 0) {
        if (!terse__fabric_req_idle(f, &m->rhreq) || m->rhreq.error) return TERSE_OK;
        size_t len = 0;
        terse_status s = take_header(m, &len);
        if (s == TERSE_OK && m->abandoned) {
            fprintf(stderr,
                    "terse: parameter server rank %d: the head of slot %d stopped replicating "
                    "to it (it did not acknowledge in time); it will not take the slot over\n",
                    m->rank, m->slot);
            return TERSE_OK; /* listens no more */
        }
        if (s == TERSE_OK) s = state_room(m, len);
        if (s != TERSE_OK) {
            /* The head's acknowledgement never comes: it stops replicating
             * (its own timeout), and this replica stays at its last step. */
            fprintf(stderr, "terse: parameter server rank %d, replica of slot %d: %s; ignored\n",
                    m->rank, m->slot, terse_last_error());
            m->rseq_next++;
            return post_repl_header(m);
        }
        memset(&m->rdreq, 0, sizeof m->rdreq);
        m->rstate = 1;
        return terse__comm_irecv(m->comm, m->repl_src,
                                 terse__ps_tag(m->slot, TERSE__PS_TAG_REPLDATA, m->rseq_next),
                                 m->rbuf_state, len, TERSE__BYTES_PAYLOAD, &m->rdreq);
    }
    if (!terse__fabric_req_idle(f, &m->rdreq) || m->rdreq.error) return TERSE_OK;
    if (m->rkey == SIZE_MAX) { /* a roster */
        if (terse__crc32c_update(0, m->rbuf_state, (size_t)m->nranks) != m->rcrc) {
            fprintf(stderr, "terse: parameter server rank %d, replica of slot %d: a roster fails "
                            "its checksum; ignored\n", m->rank, m->slot);
        } else {
            /* the epoch: the one a replacement's head serves at, or the
             * one before the one a replica catching up would take over at */
            if (m->awaiting) m->epoch_cur = (uint32_t)m->rversion;
            else if (m->catching) m->epoch_cur = (uint32_t)m->rversion + 1;
            TERSE_CHECK(terse__ps_take_roster(m, m->rbuf_state));
        }
        m->rseq_next++;
        TERSE_CHECK(post_repl_header(m));
        return m->catching ? caught_one(m) : TERSE_OK;
    }
    terse__ps_shard *sh = m->keys[m->rkey]->shard;
    if (!terse__fabric_req_idle(f, &sh->rack_req)) return TERSE_OK; /* its last ack still going */
    if (terse__crc32c_update(0, m->rbuf_state, terse__ps_state_bytes(m, sh)) != m->rcrc) {
        fprintf(stderr, "terse: parameter server rank %d, replica of slot %d: the state of key "
                        "%zu fails its checksum; ignored\n",
                m->rank, m->slot, m->rkey);
        m->rseq_next++;
        return post_repl_header(m);
    }
    unpack(sh, m->rbuf_state);
    sh->version = m->rversion;
    sh->opened_ns = terse__now_ns();
    terse__put_u64(sh->rack, m->rseq_next);
    terse__put_u64(sh->rack + 8, sh->version);
    memset(&sh->rack_req, 0, sizeof sh->rack_req);
    TERSE_CHECK(terse__comm_isend(m->comm, m->repl_src,
                                  terse__ps_tag(m->slot, TERSE__PS_TAG_ACK, m->rseq_next), sh->rack,
                                  sizeof sh->rack, TERSE__BYTES_FRAMING, &sh->rack_req));
    m->rseq_next++;
    TERSE_CHECK(post_repl_header(m));
    if (!m->catching || m->caught[m->rkey]) return TERSE_OK;
    m->caught[m->rkey] = 1;
    m->ncaught++;
    return caught_one(m);
}

/* Take the replication messages of m's head (or, for a replacement's head
 * awaiting its slot, of the server handing it back). */
static terse_status listen(terse_ps *m) {
    if (m->listening) return replica_progress(m);
    m->listening = 1;
    if (m->catching && !m->caught) {
        m->caught = calloc(m->nkeys ? m->nkeys : 1, 1);
        if (!m->caught)
            return TERSE_ERROR(TERSE_ERR_NOMEM, "parameter server rank %d: no memory", m->rank);
    }
    return post_repl_header(m);
}

terse_status terse__ps_repl_progress(terse_ps *ps) {
    TERSE_CHECK(head_progress(ps));
    if (ps->awaiting) TERSE_CHECK(listen(ps));
    terse_ps *m = ps->mirror;
    if (!m) return TERSE_OK;
    if (m->handing) TERSE_CHECK(handing_progress(m));
    if (m->promoted) return TERSE_OK;
    return listen(m);
}

void terse__ps_repl_cancel(terse_ps *ps) {
    terse__fabric *f = ps->comm->fabric;
    terse_ps *inst[2] = {ps, ps->mirror};
    for (int i = 0; i < 2; i++) {
        terse_ps *x = inst[i];
        if (!x) continue;
        let_go(f, &x->abandon_req);
        let_go(f, &x->roster_hreq);
        let_go(f, &x->roster_dreq);
        let_go(f, &x->rhreq);
        let_go(f, &x->rdreq);
        for (size_t k = 0; k < x->nkeys; k++) {
            terse__ps_shard *sh = x->keys[k]->shard;
            if (!sh) continue;
            (void)cancel_repl(x, sh);
            let_go(f, &sh->rack_req);
        }
    }
}
