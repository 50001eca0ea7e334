/* A server's side of a request (ps_loop.c moves each peer from one to the
 * next): the header checked, a push's payload received (or drained, when
 * refused) and decoded, then applied (async, ssp) or kept for its step
 * (sync, ps_step.c), a pull answered now or parked, a finish taken, and
 * every refusal.
 *
 * Nothing a worker sends is trusted: the header's lengths are checked
 * against the shard's own bounds before anything is posted, payloads are
 * decoded by the codec's validating decoder before they count, and every
 * refusal is a reply with a status and a sentence, counted and logged
 * once per kind. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algos/ps/ps.h"
#include "algos/ps/ps_server.h"
#include "common/error.h"

/* A refused payload is drained (so the worker's send completes) through a
 * buffer of one transport chunk, whatever its size, up to this; a header
 * claiming more is a liar, whose send is left to its own timeout. */
#define DRAIN_MAX ((size_t)1 << 36)

/* Per kind of refusal (ps_server.h): its name in the log, its status. */
static const char *const kind_text[] = {"key",     "size",  "step",  "closed step",
                                        "role",    "corrupt", "stale", "late",
                                        "timeout", "lost",  "non-finite", "moved",
                                        "window"};
static const terse_status kind_status[] = {
    TERSE_ERR_INVALID, TERSE_ERR_SHAPE,   TERSE_ERR_INVALID, TERSE_ERR_STALE,
    TERSE_ERR_INVALID, TERSE_ERR_CORRUPT, TERSE_ERR_STALE,   TERSE_ERR_STALE,
    TERSE_ERR_TIMEOUT, TERSE_ERR_PEER_LOST, TERSE_ERR_NONFINITE, (terse_status)TERSE__PS_MOVED,
    TERSE_ERR_INVALID};

/* ---------------------------------------------------------------- replies */

int terse__ps_is_worker(const terse_ps *ps, int r) { return r >= ps->nservers && r < ps->nranks; }

int terse__ps_active(const terse_ps *ps, int w) {
    return terse__ps_is_worker(ps, w) && !terse__ps_wk_c(ps, w)->lost &&
           !terse__ps_wk_c(ps, w)->finished;
}

static void count(terse_ps *ps, int kind) {
    switch (kind) {
    case R_KEY:
    case R_SIZE: ps->stats.refused_key++; break;
    case R_STEP:
    case R_CLOSED: ps->stats.refused_step++; break;
    case R_ROLE: ps->stats.refused_role++; break;
    case R_CORRUPT: ps->stats.refused_corrupt++; break;
    case R_STALE: ps->stats.refused_stale++; break;
    case R_LATE: ps->stats.late_dropped++; break;
    case R_NONFINITE: ps->stats.refused_nonfinite++; break;
    case R_WINDOW: ps->stats.refused_window++; break;
    default: break;
    }
}

/* cv: a conversation (ps->peers[cv]; its worker rank w and lane l). */
static terse_status send_reply(terse_ps *ps, int cv, terse_status st, uint64_t version,
                               terse__ps_blob *blob, uint64_t staleness, const char *text) {
    terse_comm *c = ps->comm;
    terse__ps_peer *p = &ps->peers[cv];
    const int w = terse__ps_cv_rank(ps, cv), l = terse__ps_cv_lane(ps, cv);
    terse__ps_rep r;
    memset(&r, 0, sizeof r);
    r.status = st;
    r.version = version;
    r.payload_len = blob ? blob->len : 0;
    r.seq = p->seq;
    r.staleness = staleness;
    snprintf(r.text, sizeof r.text, "%s", text ? text : "");
    terse__ps_put_rep(p->rep, &r);
    memset(&p->rpreq, 0, sizeof p->rpreq);
    p->rpreq.chunks = 0; /* done unless a payload follows */
    p->blob = blob;
    if (blob) blob->refs++;
    p->state = P_REPLY;
    p->since_ns = terse__now_ns();
    TERSE_CHECK(terse__comm_isend(c, w, terse__ps_tag_lane(ps->slot, l, TERSE__PS_TAG_REP, p->seq),
                                  p->rep, TERSE__PS_REP_BYTES, TERSE__BYTES_FRAMING, &p->rreq));
    if (blob)
        TERSE_CHECK(terse__comm_isend(c, w,
                                      terse__ps_tag_lane(ps->slot, l, TERSE__PS_TAG_RDATA, p->seq),
                                      blob->data, blob->len, TERSE__BYTES_PAYLOAD, &p->rpreq));
    /* The lane's next header may come before this reply is out (a worker
     * sends its next push once this one's payload went): its receive is
     * posted now, so that the connection never waits on a message nothing
     * matches (net stops reading it until something does). */
    p->hdr_early = 0;
    if (ps->lanes > 1 && !terse__ps_wk(ps, w)->finished && terse__ps_is_worker(ps, w)) {
        memset(p->hdr, 0, sizeof p->hdr);
        TERSE_CHECK(terse__comm_irecv(c, w,
                                      terse__ps_tag_lane(ps->slot, l, TERSE__PS_TAG_HDR, p->seq + 1),
                                      p->hdr, TERSE__PS_HDR_BYTES, TERSE__BYTES_FRAMING, &p->hreq));
        p->hdr_early = 1;
    }
    return TERSE_OK;
}

/* Refuse w's request: count, log the first of each kind, reply. */
terse_status TERSE__PRINTF(4, 5)
    terse__ps_refuse(terse_ps *ps, int cv, int kind, const char *fmt, ...) {
    char text[TERSE__PS_REP_TEXT];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    count(ps, kind);
    if (kind == R_MOVED) /* not a refusal: where the slot went, and who serves it */
        return send_reply(ps, cv, (terse_status)TERSE__PS_MOVED, ps->moved_epoch, NULL,
                          ps->moved_inc, text);
    if (!(ps->logged & (1u << kind))) {
        ps->logged |= 1u << kind;
        fprintf(stderr,
                "terse: parameter server rank %d refused a request from rank %d (%s): %s "
                "(counted in terse_ps_stats; logged once per kind)\n",
                ps->rank, terse__ps_cv_rank(ps, cv), kind_text[kind], text);
    }
    terse_status st = kind_status[kind];
    terse__ps_shard *sh = NULL;
    terse__ps_peer *p = &ps->peers[cv];
    if (p->h.op && p->h.key < ps->nkeys) sh = ps->keys[p->h.key]->shard;
    TERSE_CHECK(send_reply(ps, cv, st, sh ? sh->version : 0, NULL, 0, text));
    const int w = terse__ps_cv_rank(ps, cv);
    if (sh && terse__ps_is_worker(ps, w) &&
        (p->h.op == TERSE__PS_PUSH || p->h.op == TERSE__PS_PUSHPULL)) {
        /* a pull sent behind this push waits for it no more */
        sh->prefused[w] = 1 + ((uint64_t)terse__ps_cv_lane(ps, cv) << 16 | (p->h.seq & 0xffff));
        TERSE_CHECK(terse__ps_wake(ps, (size_t)p->h.key));
    }
    return TERSE_OK;
}

/* Refuse after draining the payload the worker already sent. */
terse_status TERSE__PRINTF(4, 5)
    terse__ps_refuse_drain(terse_ps *ps, int cv, int kind, const char *fmt, ...) {
    terse__ps_peer *p = &ps->peers[cv];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->pend_text, sizeof p->pend_text, fmt, ap);
    va_end(ap);
    size_t len = (size_t)p->h.payload_len;
    if (!len || p->h.payload_len > DRAIN_MAX)
        return terse__ps_refuse(ps, cv, kind, "%s", p->pend_text);
    size_t want = terse__fabric_sink_bytes(ps->comm->fabric);
    if (want > len) want = len;
    if (p->drain_cap < want) {
        uint8_t *b = realloc(p->drain, want);
        if (!b) return terse__ps_refuse(ps, cv, kind, "%s", p->pend_text);
        p->drain = b;
        p->drain_cap = want;
    }
    p->pend = kind;
    p->state = P_DRAIN;
    p->since_ns = terse__now_ns();
    return terse__fabric_irecv_sink(
        ps->comm->fabric, terse__ps_cv_rank(ps, cv),
        terse__ps_tag_lane(ps->slot, terse__ps_cv_lane(ps, cv), TERSE__PS_TAG_DATA, p->seq),
        p->drain, len, &p->preq);
}

/* The slot went back to its head's replacement: say so (MOVED). */
terse_status terse__ps_moved(terse_ps *ps, int cv) {
    return terse__ps_refuse(ps, cv, R_MOVED,
                            "slot %d went back to its head's replacement, server rank %d "
                            "(epoch %u)",
                            ps->slot, ps->slot, ps->moved_epoch);
}

/* The current version's pull payload, encoded once and shared by every
 * worker pulling it (server-side error feedback advances once). */
static terse_status current_blob(terse_ps *ps, terse__ps_shard *sh, terse__ps_blob **out) {
    if (sh->cur && sh->cur->version == sh->version && !sh->ahead_dirty) {
        *out = sh->cur;
        return TERSE_OK;
    }
    terse__ps_blob *b = calloc(1, sizeof *b);
    if (b) b->data = malloc(sh->pull_bound);
    if (!b || !b->data) {
        terse__ps_blob_free(b);
        return TERSE_ERROR(TERSE_ERR_NOMEM, "server rank %d: no memory for a pull", ps->rank);
    }
    uint64_t t0 = terse__now_ns();
    const float *from = sh->value;
    sh->ahead_dirty = 0;
    if (sh->vsum) { /* update dana: the look-ahead (a push decoded into scratch was applied or
                     * refused, and its sentence written, before any pull is served) */
        const float lr = terse__ps_lr_at(&ps->cfg, sh->version / (uint64_t)ps->nworkers);
        terse__ps_dana_ahead(ps->scratch, sh->value, sh->vsum, sh->nfloats, lr * ps->stale_mu);
        from = ps->scratch;
    }
    size_t off = 0;
    for (size_t i = 0; i < sh->nchunks; i++) {
        size_t got = 0;
        terse_status s = terse_encode(sh->enc[i], from + sh->offs[i], b->data + off,
                                      sh->pull_bound - off, &got);
        if (s != TERSE_OK) {
            terse__ps_blob_free(b);
            return s;
        }
        off += got;
    }
    terse__comm_codec_time(ps->comm, t0);
    b->len = off;
    b->version = sh->version;
    if (sh->cur && sh->cur->refs == 0) terse__ps_blob_free(sh->cur);
    sh->cur = b; /* an old one still being sent is freed when its last send ends */
    *out = b;
    return TERSE_OK;
}

static terse_status serve_pull(terse_ps *ps, int cv) {
    terse__ps_peer *p = &ps->peers[cv];
    const int w = terse__ps_cv_rank(ps, cv);
    terse__ps_shard *sh = ps->keys[p->h.key]->shard;
    terse__ps_blob *b = NULL;
    terse_status s = current_blob(ps, sh, &b);
    if (s != TERSE_OK)
        return terse__ps_refuse(ps, cv, R_CORRUPT, "the server could not encode: %s",
                                terse_last_error());
    uint64_t stale = sh->version - sh->pulled[w];
    sh->pulled[w] = sh->version;
    if (sh->kept) { /* update dc: what this worker now computes at */
        if (!sh->kept[w]) {
            if (!(sh->kept[w] = malloc(sh->nfloats * sizeof(float))))
                return terse__ps_refuse(ps, cv, R_CORRUPT,
                                        "the server has no memory for the worker's pulled copy");
            ps->stats.dc_copy_bytes += sh->nfloats * sizeof(float);
        }
        memcpy(sh->kept[w], sh->value, sh->nfloats * sizeof(float));
    }
    return send_reply(ps, cv, TERSE_OK, sh->version, b, stale, NULL);
}

void terse__ps_dana_forget(terse_ps *ps, int w) {
    for (size_t k = 0; k < ps->nkeys; k++) {
        terse__ps_shard *sh = ps->keys[k]->shard;
        if (!sh || !sh->wmom || !sh->wmom[w]) continue;
        for (size_t i = 0; i < sh->nfloats; i++) sh->vsum[i] -= sh->wmom[w][i];
        free(sh->wmom[w]);
        sh->wmom[w] = NULL;
        sh->ahead_dirty = 1;
    }
}

/* SSP: the clock every active worker must have pushed before a worker at
 * `clock` may read. */
uint64_t terse__ps_ssp_need(const terse_ps *ps, uint64_t clock) {
    uint64_t s = (uint64_t)ps->cfg.staleness;
    return clock + 1 > s ? clock + 1 - s : 0;
}

static uint64_t ssp_min(const terse_ps *ps, const terse__ps_shard *sh) {
    uint64_t m = UINT64_MAX;
    for (int w = ps->nservers; w < ps->nranks; w++)
        if (terse__ps_active(ps, w) && sh->pushed[w] < m) m = sh->pushed[w];
    return m;
}

/* Pull now, or park until the step closes (sync) or the slowest worker
 * catches up (ssp). */
terse_status terse__ps_handle_pull(terse_ps *ps, int cv) {
    terse__ps_peer *p = &ps->peers[cv];
    const int w = terse__ps_cv_rank(ps, cv);
    terse__ps_shard *sh = ps->keys[p->h.key]->shard;
    int wait = 0;
    if (p->h.op == TERSE__PS_PULL_AFTER) { /* behind this worker's push of the clock */
        if (sh->prefused[w] == 1 + ((uint64_t)p->h.after_lane << 16 | p->h.after_seq))
            return terse__ps_refuse(ps, cv, R_STEP,
                                    "the push this pull follows (clock %llu of key %llu) was "
                                    "refused",
                                    (unsigned long long)p->h.clock, (unsigned long long)p->h.key);
        if (ps->cfg.mode == TERSE_PS_SYNC)
            wait = sh->version <= p->h.clock || sh->repl_pending;
        else
            wait = sh->pushed[w] <= p->h.clock;
        if (!wait && ps->cfg.mode == TERSE_PS_SSP) {
            uint64_t m = ssp_min(ps, sh);
            wait = m != UINT64_MAX && m < terse__ps_ssp_need(ps, p->h.clock);
        }
    }
    /* sync: for the step it pushed, or (a worker that moved its clock on
     * without pushing: rounds it sat out) until the steps before its clock
     * closed */
    else if (ps->cfg.mode == TERSE_PS_SYNC)
        wait = (sh->has[w] && sh->version <= p->h.clock) || sh->version < p->h.clock ||
               sh->repl_pending; /* the step is not on the replica yet */
    else if (ps->cfg.mode == TERSE_PS_SSP) {
        uint64_t m = ssp_min(ps, sh);
        wait = m != UINT64_MAX && m < terse__ps_ssp_need(ps, p->h.clock);
    }
    if (!wait) return serve_pull(ps, cv);
    if (ps->broken[0]) return terse__ps_refuse(ps, cv, R_LOST, "%s", ps->broken);
    if (p->state != P_PARKED) p->parked_ns = terse__now_ns();
    p->state = P_PARKED;
    return TERSE_OK;
}

static terse_status decode_push(terse_ps *ps, int cv, terse__ps_shard *sh, float *dst) {
    const uint8_t *p = sh->rx[terse__ps_cv_rank(ps, cv)];
    size_t len = (size_t)ps->peers[cv].h.payload_len, off = 0;
    uint64_t t0 = terse__now_ns();
    for (size_t i = 0; i < sh->nchunks; i++) {
        size_t m = 0;
        terse_status s = terse__ps_msg_len(p + off, len - off, &m);
        if (s == TERSE_OK) s = terse_decode(sh->dec[i], p + off, m, dst + sh->offs[i], 1.0f, 0);
        if (s != TERSE_OK) return s;
        off += m;
    }
    terse__comm_codec_time(ps->comm, t0);
    if (off != len)
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "%zu bytes follow the last chunk's message",
                           len - off);
    return TERSE_OK;
}

/* A push's payload has arrived. */
terse_status terse__ps_handle_push(terse_ps *ps, int cv) {
    terse__ps_peer *p = &ps->peers[cv];
    const int w = terse__ps_cv_rank(ps, cv);
    size_t key = (size_t)p->h.key;
    terse__ps_shard *sh = ps->keys[key]->shard;
    const uint64_t clock = p->h.clock;
    const int then_pull = p->h.op == TERSE__PS_PUSHPULL;
    if (ps->broken[0]) return terse__ps_refuse(ps, cv, R_LOST, "%s", ps->broken);
    if (ps->moved_epoch && p->h.epoch < ps->moved_epoch) return terse__ps_moved(ps, cv);
    if (p->h.weight != 1.0f &&
        (ps->cfg.mode != TERSE_PS_SYNC || ps->agg->aggregate != terse__ps_agg_mean))
        return terse__ps_refuse(ps, cv, R_STEP,
                                "a push weighted %g: weighted pushes need sync mode with the mean "
                                "aggregator",
                                (double)p->h.weight);
    if (ps->cfg.mode == TERSE_PS_SYNC) {
        /* With a quorum or a deadline the dead head may have closed the
         * step without it: a resend of a closed step is then late. */
        if (ps->took_over && (sh->has[w] || (clock < sh->version && !ps->cfg.quorum &&
                                            !ps->cfg.deadline_ms))) {
            /* a resend of a push the dead head applied (or this one has) */
            ps->stats.duplicates++;
            if (then_pull) return terse__ps_handle_pull(ps, cv);
            return send_reply(ps, cv, TERSE_OK, sh->version, NULL, 0, NULL);
        }
        if (clock < sh->version) {
            if (ps->cfg.quorum || ps->cfg.deadline_ms) { /* closed without it, by design */
                char how[64];
                if (ps->cfg.deadline_ms)
                    snprintf(how, sizeof how, " (its quorum or its %d ms deadline; ",
                             ps->cfg.deadline_ms);
                else
                    snprintf(how, sizeof how, " on the first %d pushes (", ps->cfg.quorum);
                return terse__ps_refuse(
                    ps, cv, R_LATE,
                    "step %llu of key %zu already closed%sthe server is at step "
                    "%llu); this push was dropped",
                    (unsigned long long)clock, key, how, (unsigned long long)sh->version);
            }
            return terse__ps_refuse(
                ps, cv, R_CLOSED, "step %llu of key %zu is already closed (open: %llu)",
                (unsigned long long)clock, key, (unsigned long long)sh->version);
        }
        if (clock > sh->version)
            return terse__ps_refuse(
                ps, cv, R_STEP,
                "a push for step %llu of key %zu while its step %llu is open: in sync "
                "mode every key is pushed at every step, and a key's result pulled "
                "before its next push (this key skipped a step, or was not pulled)",
                (unsigned long long)clock, key, (unsigned long long)sh->version);
        if (sh->has[w])
            return terse__ps_refuse(ps, cv, R_STEP, "rank %d already pushed step %llu of key %zu", w,
                                    (unsigned long long)clock, key);
        if (!sh->got[w] && !(sh->got[w] = malloc(sh->nfloats * sizeof(float))))
            return terse__ps_refuse(ps, cv, R_CORRUPT, "the server has no memory for the push");
        terse_status s = decode_push(ps, cv, sh, sh->got[w]);
        if (s != TERSE_OK)
            return terse__ps_refuse(ps, cv, R_CORRUPT, "key %zu's payload does not decode: %s", key,
                                    terse_last_error());
        size_t bad = terse__ps_first_nonfinite(sh->got[w], sh->nfloats);
        sh->wt[w] = p->h.weight;
        sh->has[w] = bad < sh->nfloats ? 2 : 1; /* a left-out push still counts as pushed */
        sh->count++;
        uint64_t before = sh->version;
        TERSE_CHECK(terse__ps_maybe_close(ps, key));
        if (bad < sh->nfloats)
            return terse__ps_refuse(
                ps, cv, R_NONFINITE,
                "key %zu's push for step %llu holds %g at element %zu of the server's "
                "part: it was left out of the step's aggregate",
                key, (unsigned long long)clock, (double)sh->got[w][bad], bad);
        if (then_pull) return terse__ps_handle_pull(ps, cv);
        return send_reply(ps, cv, TERSE_OK, before, NULL, 0, NULL);
    }
    /* async and ssp: apply on arrival. */
    if (ps->cfg.mode == TERSE_PS_SSP && clock < sh->pushed[w])
        return terse__ps_refuse(ps, cv, R_STEP,
                                "rank %d already pushed clock %llu of key %zu (next: %llu)", w,
                                (unsigned long long)clock, key, (unsigned long long)sh->pushed[w]);
    uint64_t stale = sh->version - sh->pulled[w];
    if (ps->cfg.mode == TERSE_PS_ASYNC && ps->cfg.max_staleness &&
        stale > (uint64_t)ps->cfg.max_staleness)
        return terse__ps_refuse(
            ps, cv, R_STALE,
            "the push of key %zu is %llu updates stale (rank %d last pulled version "
            "%llu, the server is at %llu), over max_staleness=%d; pull and push again",
            key, (unsigned long long)stale, w, (unsigned long long)sh->pulled[w],
            (unsigned long long)sh->version, ps->cfg.max_staleness);
    terse_status s = decode_push(ps, cv, sh, ps->scratch);
    if (s != TERSE_OK)
        return terse__ps_refuse(ps, cv, R_CORRUPT, "key %zu's payload does not decode: %s", key,
                                terse_last_error());
    size_t bad = terse__ps_first_nonfinite(ps->scratch, sh->nfloats);
    if (bad < sh->nfloats) {
        /* Not applied, but this clock is over for w (its clock moves on):
         * ssp's slowest-worker bound must not wait for it. The value is
         * read first: the wake may serve pulls, which use scratch. */
        const double badv = (double)ps->scratch[bad];
        if (clock + 1 > sh->pushed[w]) sh->pushed[w] = clock + 1;
        TERSE_CHECK(terse__ps_wake(ps, key)); /* ssp's bound, and pulls behind it */
        return terse__ps_refuse(
            ps, cv, R_NONFINITE,
            "key %zu's push holds %g at element %zu of the server's part: it was not "
            "applied",
            key, badv, bad);
    }
    /* The stale-push rule (terse.h, Stale pushes); amom is in stale_mu. */
    float weight = 1.0f / (float)ps->nworkers;
    if ((ps->stale_rule & TERSE_PS_STALE_STEP) && stale > 1) weight /= (float)stale;
    uint64_t t0 = terse__now_ns();
    if ((ps->stale_rule & TERSE_PS_STALE_DC) && sh->kept[w])
        terse__ps_dc_compensate(ps->scratch, sh->value, sh->kept[w], sh->nfloats, ps->dc_lambda);
    const float lr = terse__ps_lr_at(&ps->cfg, sh->version / (uint64_t)ps->nworkers);
    if (sh->wmom) { /* update dana: this worker's own momentum */
        if (!sh->wmom[w]) {
            if (!(sh->wmom[w] = calloc(sh->nfloats, sizeof(float))))
                return terse__ps_refuse(ps, cv, R_CORRUPT,
                                        "the server has no memory for the worker's momentum");
            ps->stats.dc_copy_bytes += sh->nfloats * sizeof(float);
        }
        terse__ps_dana_apply(lr, ps->stale_mu, sh->value, sh->wmom[w], sh->vsum, ps->scratch,
                             sh->nfloats, weight);
    } else {
        ps->rule->apply(lr, ps->stale_mu, sh->value, sh->mom, ps->scratch, sh->nfloats, weight);
    }
    terse__comm_codec_time(ps->comm, t0);
    sh->version++;
    if (clock + 1 > sh->pushed[w]) sh->pushed[w] = clock + 1;
    ps->stats.pushes_applied++;
    ps->staleness_sum += stale;
    if (stale > ps->stats.staleness_max) ps->stats.staleness_max = stale;
    TERSE_CHECK(terse__ps_wake(ps, key)); /* ssp's bound, and pulls behind this push */
    if (then_pull) return terse__ps_handle_pull(ps, cv);
    return send_reply(ps, cv, TERSE_OK, sh->version, NULL, stale, NULL);
}

/* A header from w has arrived: check it, then receive the payload, pull,
 * or finish. */
terse_status terse__ps_handle_header(terse_ps *ps, int cv) {
    terse__ps_peer *p = &ps->peers[cv];
    const int w = terse__ps_cv_rank(ps, cv), lane = terse__ps_cv_lane(ps, cv);
    terse__ps_hdr h;
    memset(&p->h, 0, sizeof p->h);
    terse_status s = terse__ps_get_hdr(p->hdr, &h);
    if (s != TERSE_OK) return terse__ps_refuse(ps, cv, R_CORRUPT, "%s", terse_last_error());
    p->h = h;
    if (h.seq != p->seq)
        return terse__ps_refuse(ps, cv, R_CORRUPT, "message number %llu where %llu was due",
                                (unsigned long long)h.seq, (unsigned long long)p->seq);
    /* A payload on a pull lane: a worker past its window of pushes (its
     * pipeline pushes on lanes [0, push_lanes) only). Refused without
     * receiving the payload -- it stays with the transport, the sender's
     * problem -- so a pull lane never holds a buffer: what a worker's
     * pushes in flight cost the server is bounded by the window, not by
     * the lanes (docs/ps.md, "Partitions on the wire"). */
    if (lane > 0 && lane >= ps->push_lanes && h.payload_len)
        return terse__ps_refuse(ps, cv, R_WINDOW,
                                "a %llu-byte payload on lane %d, a pull lane: rank %d has %d push "
                                "lanes (the window, lanes 0..%d); pulls carry no payload; "
                                "the payload was not received",
                                (unsigned long long)h.payload_len, lane, w, ps->push_lanes,
                                ps->push_lanes - 1);
    if (!terse__ps_is_worker(ps, w))
        return terse__ps_refuse_drain(
            ps, cv, R_ROLE,
            "rank %d is a server (ranks 0..%d serve), not a worker: only workers "
            "push and pull",
            w, ps->nservers - 1);
    if (h.op == TERSE__PS_FINISH && h.payload_len)
        return terse__ps_refuse_drain(ps, cv, R_CORRUPT, "a finish with a %llu-byte payload",
                                      (unsigned long long)h.payload_len);
    if (!(h.weight > 0.0f && h.weight <= 3.0e38f)) /* NaN fails too */
        return terse__ps_refuse_drain(ps, cv, R_CORRUPT,
                                      "a push weight of %g is not a positive finite number",
                                      (double)h.weight);
    if (h.weight != 1.0f && h.op != TERSE__PS_PUSH && h.op != TERSE__PS_PUSHPULL)
        return terse__ps_refuse_drain(ps, cv, R_CORRUPT,
                                      "a weight on a request that pushes nothing");
    const int finish = h.op == TERSE__PS_FINISH;
    if (!finish && ps->moved_epoch && h.epoch < ps->moved_epoch)
        return terse__ps_refuse_drain(ps, cv, R_MOVED,
                                      "slot %d went back to its head's replacement, server rank %d "
                                      "(epoch %u)",
                                      ps->slot, ps->slot, ps->moved_epoch);
    if (!finish && ps->awaiting) { /* a replacement: until its slot's state is in */
        p->state = P_HOLD;
        p->parked_ns = terse__now_ns();
        return TERSE_OK;
    }
    if (!finish && h.epoch != ps->epoch_cur)
        return terse__ps_refuse_drain(
            ps, cv, R_STEP,
            "a request of epoch %u for slot %d on rank %d, which is the slot's %s "
            "(epoch %u)",
            h.epoch, ps->slot, ps->rank, ps->slot == ps->rank ? "head" : "replica", ps->epoch_cur);
    if (!finish && ps->abandoned && ps->promoted)
        return terse__ps_refuse_drain(
            ps, cv, R_LOST,
            ps->abandoned == 2 ? "slot %d is lost: its head, server rank %d, died before its "
                                 "replica here (rank %d, a replacement) had caught up"
                               : "slot %d is lost: its head, server rank %d, stopped "
                                 "replicating to its replica here (rank %d did not acknowledge "
                                 "in time) and then died",
            ps->slot, ps->slot, ps->rank);
    if (!finish && ps->slot != ps->rank && !ps->promoted) {
        p->state = P_HOLD; /* until the head's loss is announced */
        p->parked_ns = terse__now_ns();
        return TERSE_OK;
    }
    if (h.op == TERSE__PS_FINISH) {
        terse__ps_wk(ps, w)->finished = 1;
        terse__ps_dana_forget(ps, w);
        TERSE_CHECK(send_reply(ps, cv, TERSE_OK, 0, NULL, 0, NULL));
        /* Fewer active workers: a sync step may now be complete. */
        for (size_t k = 0; k < ps->nkeys; k++)
            if (ps->keys[k]->shard) {
                TERSE_CHECK(terse__ps_maybe_close(ps, k));
                if (ps->cfg.mode == TERSE_PS_SSP) TERSE_CHECK(terse__ps_wake(ps, k));
            }
        return TERSE_OK;
    }
    if (h.key >= ps->nkeys || !ps->keys[h.key]->shard)
        return terse__ps_refuse_drain(ps, cv, R_KEY, "key %llu is %s", (unsigned long long)h.key,
                                      h.key >= ps->nkeys ? "not declared on this server"
                                                         : "not held by this server");
    terse__ps_key *k = ps->keys[h.key];
    terse__ps_shard *sh = k->shard;
    if (h.nfloats != sh->nfloats)
        return terse__ps_refuse_drain(
            ps, cv, R_SIZE,
            "key %llu: the worker's part on this server has size %llu floats, the "
            "server's %zu",
            (unsigned long long)h.key, (unsigned long long)h.nfloats, sh->nfloats);
    if (h.decl_hash != k->decl_hash)
        return terse__ps_refuse_drain(
            ps, cv, R_KEY,
            "key %llu was declared differently on rank %d (size, chunking or "
            "codec specs: here push \"%s\", pull \"%s\")",
            (unsigned long long)h.key, w, k->push_spec, k->pull_spec);
    if (h.op == TERSE__PS_PULL || h.op == TERSE__PS_PULL_AFTER) {
        if (h.payload_len)
            return terse__ps_refuse_drain(ps, cv, R_CORRUPT, "a pull with a %llu-byte payload",
                                          (unsigned long long)h.payload_len);
        return terse__ps_handle_pull(ps, cv);
    }
    if (h.payload_len == 0 || h.payload_len > sh->push_bound)
        return terse__ps_refuse_drain(
            ps, cv, R_SIZE,
            "a push of key %llu with a %llu-byte payload; its chunks here encode "
            "to 1..%zu bytes (wrong size or codec)",
            (unsigned long long)h.key, (unsigned long long)h.payload_len, sh->push_bound);
    /* One push of a key at a time from a worker: its payload lands in the
     * shard's buffer for that worker (a second lane pushing the same key at
     * once would have it reallocated under a posted receive). */
    for (int l = 0; l < ps->lanes; l++) {
        const terse__ps_peer *q = &ps->peers[(size_t)w * (size_t)ps->lanes + (size_t)l];
        if (l != lane && q->state == P_DATA && q->h.key == h.key)
            return terse__ps_refuse_drain(
                ps, cv, R_STEP,
                "rank %d pushes key %llu on two lanes at once (lanes %d and %d): a worker "
                "pushes a key once at a time",
                w, (unsigned long long)h.key, l, lane);
    }
    if (sh->rx_cap[w] < h.payload_len) {
        uint8_t *b = realloc(sh->rx[w], (size_t)h.payload_len);
        if (!b)
            return terse__ps_refuse_drain(ps, cv, R_CORRUPT,
                                          "the server has no memory for the push");
        sh->rx[w] = b;
        sh->rx_cap[w] = (size_t)h.payload_len;
    }
    p->state = P_DATA;
    p->since_ns = terse__now_ns();
    return terse__comm_irecv(ps->comm, w, terse__ps_tag_lane(ps->slot, lane, TERSE__PS_TAG_DATA, p->seq),
                             sh->rx[w], (size_t)h.payload_len, TERSE__BYTES_PAYLOAD, &p->preq);
}

terse_status terse__ps_post_header(terse_ps *ps, int cv) {
    terse__ps_peer *p = &ps->peers[cv];
    memset(&p->h, 0, sizeof p->h);
    p->state = P_HDR;
    return terse__comm_irecv(
        ps->comm, terse__ps_cv_rank(ps, cv),
        terse__ps_tag_lane(ps->slot, terse__ps_cv_lane(ps, cv), TERSE__PS_TAG_HDR, p->seq), p->hdr,
        TERSE__PS_HDR_BYTES, TERSE__BYTES_FRAMING, &p->hreq);
}
