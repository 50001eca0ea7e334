/* The server loop. It keeps a request header posted from every other rank
 * (servers included, so that a rank which is not a worker gets a refusal
 * rather than silence) and moves each peer through
 *     HDR -> [DATA | DRAIN] -> [PARKED] -> REPLY -> HDR ...
 * one conversation per peer at a time. The fabric runs in tolerant mode:
 * a worker that dies fails only its own requests, and the store's loss
 * notices tell the server which workers are gone, so that quorum, async
 * and ssp go on without them while sync without a quorum fails the steps
 * they never pushed, naming them.
 *
 * Nothing a worker sends is trusted: the header's lengths are checked
 * against the shard's own bounds before anything is posted, payloads are
 * decoded by the codec's validating decoder before they count, and every
 * refusal is a reply with a status and a sentence, counted and logged
 * once per kind. */
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "algos/engine.h"
#include "algos/ps.h"
#include "common/error.h"

/* P_HOLD: a replica's request before its head was lost (held until the
 * store's notice promotes the replica, or refused at the timeout). */
enum { P_HDR, P_DATA, P_DRAIN, P_PARKED, P_REPLY, P_DONE, P_HOLD };

/* A refused payload is drained (so the worker's send completes) through a
 * buffer of one transport chunk, whatever its size, up to this; a header
 * claiming more is a liar, whose send is left to its own timeout. */
#define DRAIN_MAX ((size_t)1 << 36)
#define POLL_NS 1000000ull
/* Silence before the loop naps (20 us a round): short, since a server
 * spinning on a core its workers compute on slows them down (measured with
 * bench/ps-stragglers.sh, docs/ps.md); a nap costs a message at most its
 * length in latency. */
#define NAP_AFTER_NS 200000u

/* Kinds of refusal, for counting and log-once. */
enum {
    R_KEY, R_SIZE, R_STEP, R_CLOSED, R_ROLE, R_CORRUPT, R_STALE, R_LATE, R_TIMEOUT, R_LOST,
    R_NONFINITE, R_MOVED
};
static const char *const kind_text[] = {"key",     "size",  "step",  "closed step",
                                        "role",    "corrupt", "stale", "late",
                                        "timeout", "lost",  "non-finite", "moved"};
static const terse_status kind_status[] = {
    TERSE_ERR_INVALID, TERSE_ERR_SHAPE,   TERSE_ERR_INVALID, TERSE_ERR_STALE,
    TERSE_ERR_INVALID, TERSE_ERR_CORRUPT, TERSE_ERR_STALE,   TERSE_ERR_STALE,
    TERSE_ERR_TIMEOUT, TERSE_ERR_PEER_LOST, TERSE_ERR_NONFINITE, (terse_status)TERSE__PS_MOVED};

/* ---------------------------------------------------------------- shards */

static void blob_free(terse__ps_blob *b) {
    if (!b) return;
    free(b->data);
    free(b);
}

terse_status terse__ps_shard_init(terse_ps *ps, terse__ps_key *k, const float *init) {
    size_t key = k->index, mine = 0;
    for (size_t c = 0; c < k->nchunks; c++) mine += k->server[c] == ps->slot;
    if (!mine) return TERSE_OK;
    terse__ps_shard *sh = calloc(1, sizeof *sh);
    if (!sh) return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_declare: no memory");
    k->shard = sh;
    size_t N = (size_t)ps->nranks;
    sh->nchunks = mine;
    sh->chunks = calloc(mine, sizeof *sh->chunks);
    sh->offs = calloc(mine, sizeof *sh->offs);
    sh->dec = calloc(mine, sizeof *sh->dec);
    sh->enc = calloc(mine, sizeof *sh->enc);
    sh->rx = calloc(N, sizeof *sh->rx);
    sh->rx_cap = calloc(N, sizeof *sh->rx_cap);
    sh->got = calloc(N, sizeof *sh->got);
    sh->wt = calloc(N, sizeof *sh->wt);
    sh->has = calloc(N, 1);
    sh->pushed = calloc(N, sizeof *sh->pushed);
    sh->pulled = calloc(N, sizeof *sh->pulled);
    if (!sh->chunks || !sh->offs || !sh->dec || !sh->enc || !sh->rx || !sh->rx_cap || !sh->got ||
        !sh->wt || !sh->has || !sh->pushed || !sh->pulled)
        return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_declare: no memory");
    size_t j = 0;
    for (size_t c = 0; c < k->nchunks; c++) {
        if (k->server[c] != ps->slot) continue;
        size_t len = c + 1 < k->nchunks ? k->chunk_floats : k->n - c * k->chunk_floats;
        sh->chunks[j] = c;
        sh->offs[j] = sh->nfloats;
        sh->nfloats += len;
        terse_status s = terse_codec_create(k->push_spec, 1, len, &sh->dec[j]);
        if (s == TERSE_OK) s = terse_codec_create(k->pull_spec, 1, len, &sh->enc[j]);
        if (s != TERSE_OK)
            return TERSE_ERROR(s, "terse_ps_declare of key %zu on server rank %d: %s", key,
                               ps->rank, terse_last_error());
        terse_codec_set_stream(sh->enc[j], (uint64_t)key << 32 | c, (uint32_t)ps->slot);
        sh->push_bound += terse_codec_bound(sh->dec[j]);
        sh->pull_bound += terse_codec_bound(sh->enc[j]);
        j++;
    }
    sh->value = calloc(sh->nfloats, sizeof(float));
    if (ps->cfg.update == TERSE_PS_UPDATE_SGD && ps->cfg.momentum > 0.0f)
        sh->mom = calloc(sh->nfloats, sizeof(float));
    if (ps->agg->needs_center) sh->center = calloc(sh->nfloats, sizeof(float));
    sh->opened_ns = terse__now_ns();
    if (!sh->value || (ps->cfg.update == TERSE_PS_UPDATE_SGD && ps->cfg.momentum > 0.0f && !sh->mom) ||
        (ps->agg->needs_center && !sh->center))
        return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_declare: no memory for %zu floats",
                           sh->nfloats);
    if (init)
        for (size_t i = 0; i < sh->nchunks; i++) {
            size_t c = sh->chunks[i];
            size_t len = c + 1 < k->nchunks ? k->chunk_floats : k->n - c * k->chunk_floats;
            memcpy(sh->value + sh->offs[i], init + c * k->chunk_floats, len * sizeof(float));
        }
    if (sh->nfloats > ps->scratch_cap) {
        float *p = realloc(ps->scratch, sh->nfloats * sizeof(float));
        if (!p) return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_declare: no memory");
        ps->scratch = p;
        ps->scratch_cap = sh->nfloats;
    }
    return TERSE_OK;
}

void terse__ps_shard_free(terse_ps *ps, terse__ps_shard *sh) {
    for (size_t i = 0; i < sh->nchunks; i++) {
        if (sh->dec) terse_codec_free(sh->dec[i]);
        if (sh->enc) terse_codec_free(sh->enc[i]);
    }
    for (int r = 0; r < ps->nranks; r++) {
        if (sh->rx) free(sh->rx[r]);
        if (sh->got) free(sh->got[r]);
    }
    if (sh->cur && sh->cur->refs == 0) blob_free(sh->cur);
    free(sh->chunks), free(sh->offs), free(sh->dec), free(sh->enc);
    free(sh->rx), free(sh->rx_cap), free(sh->got), free(sh->wt), free(sh->has);
    free(sh->pushed), free(sh->pulled), free(sh->value), free(sh->mom), free(sh->center);
    free(sh->repl_buf);
    free(sh);
}

/* ---------------------------------------------------------------- replies */

static int is_worker(const terse_ps *ps, int r) { return r >= ps->nservers && r < ps->nranks; }

static int active(const terse_ps *ps, int w) {
    return is_worker(ps, w) && !ps->peers[w].lost && !ps->peers[w].finished;
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
    default: break;
    }
}

static terse_status send_reply(terse_ps *ps, int w, terse_status st, uint64_t version,
                               terse__ps_blob *blob, uint64_t staleness, const char *text) {
    terse_comm *c = ps->comm;
    terse__ps_peer *p = &ps->peers[w];
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
    TERSE_CHECK(terse__comm_isend(c, w, terse__ps_tag(ps->slot, TERSE__PS_TAG_REP, p->seq), p->rep,
                                  TERSE__PS_REP_BYTES, TERSE__BYTES_FRAMING, &p->rreq));
    if (blob)
        TERSE_CHECK(terse__comm_isend(c, w, terse__ps_tag(ps->slot, TERSE__PS_TAG_RDATA, p->seq), blob->data,
                                      blob->len, TERSE__BYTES_PAYLOAD, &p->rpreq));
    return TERSE_OK;
}

/* Refuse w's request: count, log the first of each kind, reply. */
static terse_status TERSE__PRINTF(4, 5)
    refuse(terse_ps *ps, int w, int kind, const char *fmt, ...) {
    char text[TERSE__PS_REP_TEXT];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    count(ps, kind);
    if (kind == R_MOVED) /* not a refusal: where the slot went, and who serves it */
        return send_reply(ps, w, (terse_status)TERSE__PS_MOVED, ps->moved_epoch, NULL,
                          ps->moved_inc, text);
    if (!(ps->logged & (1u << kind))) {
        ps->logged |= 1u << kind;
        fprintf(stderr,
                "terse: parameter server rank %d refused a request from rank %d (%s): %s "
                "(counted in terse_ps_stats; logged once per kind)\n",
                ps->rank, w, kind_text[kind], text);
    }
    terse_status st = kind_status[kind];
    terse__ps_shard *sh = NULL;
    terse__ps_peer *p = &ps->peers[w];
    if (p->h.op && p->h.key < ps->nkeys) sh = ps->keys[p->h.key]->shard;
    return send_reply(ps, w, st, sh ? sh->version : 0, NULL, 0, text);
}

/* Refuse after draining the payload the worker already sent. */
static terse_status TERSE__PRINTF(4, 5)
    refuse_drain(terse_ps *ps, int w, int kind, const char *fmt, ...) {
    terse__ps_peer *p = &ps->peers[w];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->pend_text, sizeof p->pend_text, fmt, ap);
    va_end(ap);
    size_t len = (size_t)p->h.payload_len;
    if (!len || p->h.payload_len > DRAIN_MAX) return refuse(ps, w, kind, "%s", p->pend_text);
    size_t want = terse__fabric_sink_bytes(ps->comm->fabric);
    if (want > len) want = len;
    if (p->drain_cap < want) {
        uint8_t *b = realloc(p->drain, want);
        if (!b) return refuse(ps, w, kind, "%s", p->pend_text);
        p->drain = b;
        p->drain_cap = want;
    }
    p->pend = kind;
    p->state = P_DRAIN;
    p->since_ns = terse__now_ns();
    return terse__fabric_irecv_sink(ps->comm->fabric, w, terse__ps_tag(ps->slot, TERSE__PS_TAG_DATA, p->seq),
                                    p->drain, len, &p->preq);
}

/* The slot went back to its head's replacement: say so (MOVED). */
static terse_status moved(terse_ps *ps, int w) {
    return refuse(ps, w, R_MOVED, "slot %d went back to its head's replacement, server rank %d "
                  "(epoch %u)", ps->slot, ps->slot, ps->moved_epoch);
}

/* The current version's pull payload, encoded once and shared by every
 * worker pulling it (server-side error feedback advances once). */
static terse_status current_blob(terse_ps *ps, terse__ps_shard *sh, terse__ps_blob **out) {
    if (sh->cur && sh->cur->version == sh->version) {
        *out = sh->cur;
        return TERSE_OK;
    }
    terse__ps_blob *b = calloc(1, sizeof *b);
    if (b) b->data = malloc(sh->pull_bound);
    if (!b || !b->data) {
        blob_free(b);
        return TERSE_ERROR(TERSE_ERR_NOMEM, "server rank %d: no memory for a pull", ps->rank);
    }
    uint64_t t0 = terse__now_ns();
    size_t off = 0;
    for (size_t i = 0; i < sh->nchunks; i++) {
        size_t got = 0;
        terse_status s = terse_encode(sh->enc[i], sh->value + sh->offs[i], b->data + off,
                                      sh->pull_bound - off, &got);
        if (s != TERSE_OK) {
            blob_free(b);
            return s;
        }
        off += got;
    }
    terse__comm_codec_time(ps->comm, t0);
    b->len = off;
    b->version = sh->version;
    if (sh->cur && sh->cur->refs == 0) blob_free(sh->cur);
    sh->cur = b; /* an old one still being sent is freed when its last send ends */
    *out = b;
    return TERSE_OK;
}

/* The missing workers of a parked request, as text. */
static void missing(terse_ps *ps, terse__ps_shard *sh, uint64_t need, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    for (int w = ps->nservers; w < ps->nranks && n + 12 < cap; w++) {
        int miss = ps->cfg.mode == TERSE_PS_SYNC ? active(ps, w) && !sh->has[w]
                                                 : active(ps, w) && sh->pushed[w] < need;
        if (miss) n += (size_t)snprintf(out + n, cap - n, "%s%d", n ? "," : "", w);
    }
}

static terse_status serve_pull(terse_ps *ps, int w) {
    terse__ps_peer *p = &ps->peers[w];
    terse__ps_shard *sh = ps->keys[p->h.key]->shard;
    terse__ps_blob *b = NULL;
    terse_status s = current_blob(ps, sh, &b);
    if (s != TERSE_OK) return refuse(ps, w, R_CORRUPT, "the server could not encode: %s", terse_last_error());
    uint64_t stale = sh->version - sh->pulled[w];
    sh->pulled[w] = sh->version;
    return send_reply(ps, w, TERSE_OK, sh->version, b, stale, NULL);
}

/* SSP: the clock every active worker must have pushed before a worker at
 * `clock` may read. */
static uint64_t ssp_need(const terse_ps *ps, uint64_t clock) {
    uint64_t s = (uint64_t)ps->cfg.staleness;
    return clock + 1 > s ? clock + 1 - s : 0;
}

static uint64_t ssp_min(const terse_ps *ps, const terse__ps_shard *sh) {
    uint64_t m = UINT64_MAX;
    for (int w = ps->nservers; w < ps->nranks; w++)
        if (active(ps, w) && sh->pushed[w] < m) m = sh->pushed[w];
    return m;
}

/* Pull now, or park until the step closes (sync) or the slowest worker
 * catches up (ssp). */
static terse_status handle_pull(terse_ps *ps, int w) {
    terse__ps_peer *p = &ps->peers[w];
    terse__ps_shard *sh = ps->keys[p->h.key]->shard;
    int wait = 0;
    /* sync: for the step it pushed, or (a worker that moved its clock on
     * without pushing: rounds it sat out) until the steps before its clock
     * closed */
    if (ps->cfg.mode == TERSE_PS_SYNC)
        wait = (sh->has[w] && sh->version <= p->h.clock) || sh->version < p->h.clock ||
               sh->repl_pending; /* the step is not on the replica yet */
    if (ps->cfg.mode == TERSE_PS_SSP) {
        uint64_t m = ssp_min(ps, sh);
        wait = m != UINT64_MAX && m < ssp_need(ps, p->h.clock);
    }
    if (!wait) return serve_pull(ps, w);
    if (ps->broken[0]) return refuse(ps, w, R_LOST, "%s", ps->broken);
    if (p->state != P_PARKED) p->parked_ns = terse__now_ns();
    p->state = P_PARKED;
    return TERSE_OK;
}

static void quorum_log(terse_ps *ps, terse__ps_shard *sh, size_t key) {
    if (!ps->quorum_log) {
        const char *path = getenv("TERSE_PS_QUORUM_LOG");
        if (!path || !*path) return;
        ps->quorum_log = fopen(path, "a");
        if (!ps->quorum_log) return;
    }
    FILE *f = ps->quorum_log;
    fprintf(f, "%d %zu %llu ", ps->rank, key, (unsigned long long)sh->version);
    int first = 1;
    for (int w = ps->nservers; w < ps->nranks; w++)
        if (sh->has[w] == 1) { /* the pushes aggregated (2: left out, non-finite) */
            fprintf(f, "%s%d", first ? "" : ",", w);
            first = 0;
        }
    fputc('\n', f);
    fflush(f);
}

/* Sync: aggregate the step's pushes in worker-rank order and apply.
 * has[w] is 1 for a push that counts, 2 for one left out (non-finite). A
 * step with none that counts (all left out, or closed empty by its
 * deadline) changes no parameters; with update none its aggregate is
 * zero. */
static terse_status close_step(terse_ps *ps, size_t key, int by_deadline) {
    terse__ps_shard *sh = ps->keys[key]->shard;
    size_t k = 0;
    int weighted = 0;
    for (int w = ps->nservers; w < ps->nranks; w++)
        if (sh->has[w] == 1) {
            weighted |= sh->wt[w] != 1.0f;
            ps->wts[k] = sh->wt[w];
            ps->inputs[k++] = sh->got[w];
        }
    if (!sh->count && !by_deadline) return TERSE_OK;
    uint64_t t0 = terse__now_ns();
    if (k && weighted) { /* the mean (handle_push refuses weights elsewhere) */
        terse__ps_agg_weighted_mean(ps->inputs, ps->wts, k, sh->nfloats, ps->scratch);
        ps->rule->apply(&ps->cfg, sh->value, sh->mom, ps->scratch, sh->nfloats, 1.0f);
    } else if (k) {
        TERSE_CHECK(ps->agg->aggregate(&ps->agg_params, ps->inputs, k, sh->nfloats, ps->scratch,
                                       sh->center));
        ps->rule->apply(&ps->cfg, sh->value, sh->mom, ps->scratch, sh->nfloats, 1.0f);
    } else if (ps->cfg.update == TERSE_PS_UPDATE_NONE) {
        memset(sh->value, 0, sh->nfloats * sizeof(float)); /* the aggregate of nothing */
    } /* else the parameters (and their momentum) stay as they are */
    terse__comm_codec_time(ps->comm, t0);
    if (ps->cfg.quorum) quorum_log(ps, sh, key);
    sh->version++;
    sh->opened_ns = terse__now_ns();
    ps->stats.steps_closed++;
    ps->stats.deadline_closes += by_deadline != 0;
    ps->stats.pushes_applied += k;
    memset(sh->has, 0, (size_t)ps->nranks);
    sh->count = 0;
    return terse__ps_replicate(ps, key);
}

/* Serve the pulls parked on key that can now go. */
terse_status terse__ps_wake(terse_ps *ps, size_t key) {
    for (int w = 0; w < ps->nranks; w++) {
        terse__ps_peer *p = &ps->peers[w];
        if (w != ps->rank && !p->lost && p->state == P_PARKED && p->h.key == key)
            TERSE_CHECK(handle_pull(ps, w));
    }
    return TERSE_OK;
}

/* Sync: close key's open step if enough workers pushed it. */
terse_status terse__ps_maybe_close(terse_ps *ps, size_t key) {
    terse__ps_shard *sh = ps->keys[key]->shard;
    /* replicas 2: the last step is still on its way to the replica (its
     * buffers are in use); this one closes when the ack is in */
    if (ps->cfg.mode != TERSE_PS_SYNC || !sh->count || sh->repl_pending) return TERSE_OK;
    /* Without a quorum: when every active worker has pushed (pushes of
     * workers that finished or were lost since count too). With a quorum
     * of K: on K pushes, or on every push there can still be, if fewer. */
    int active_missing = 0;
    for (int w = ps->nservers; w < ps->nranks; w++) active_missing += active(ps, w) && !sh->has[w];
    if (ps->cfg.quorum) {
        int possible = sh->count + active_missing;
        int need = ps->cfg.quorum < possible ? ps->cfg.quorum : possible;
        if (sh->count < need) return TERSE_OK;
    } else if (active_missing) {
        return TERSE_OK;
    }

    TERSE_CHECK(close_step(ps, key, 0));
    return terse__ps_wake(ps, key);
}

static terse_status decode_push(terse_ps *ps, int w, terse__ps_shard *sh, float *dst) {
    const uint8_t *p = sh->rx[w];
    size_t len = (size_t)ps->peers[w].h.payload_len, off = 0;
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
static terse_status handle_push(terse_ps *ps, int w) {
    terse__ps_peer *p = &ps->peers[w];
    size_t key = (size_t)p->h.key;
    terse__ps_shard *sh = ps->keys[key]->shard;
    const uint64_t clock = p->h.clock;
    const int then_pull = p->h.op == TERSE__PS_PUSHPULL;
    if (ps->broken[0]) return refuse(ps, w, R_LOST, "%s", ps->broken);
    if (ps->moved_epoch && p->h.epoch < ps->moved_epoch) return moved(ps, w);
    if (p->h.weight != 1.0f &&
        (ps->cfg.mode != TERSE_PS_SYNC || ps->agg->aggregate != terse__ps_agg_mean))
        return refuse(ps, w, R_STEP,
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
            if (then_pull) return handle_pull(ps, w);
            return send_reply(ps, w, TERSE_OK, sh->version, NULL, 0, NULL);
        }
        if (clock < sh->version) {
            if (ps->cfg.quorum || ps->cfg.deadline_ms) { /* closed without it, by design */
                char how[64];
                if (ps->cfg.deadline_ms)
                    snprintf(how, sizeof how, " (its quorum or its %d ms deadline; ",
                             ps->cfg.deadline_ms);
                else
                    snprintf(how, sizeof how, " on the first %d pushes (", ps->cfg.quorum);
                return refuse(ps, w, R_LATE,
                              "step %llu of key %zu already closed%sthe server is at step "
                              "%llu); this push was dropped",
                              (unsigned long long)clock, key, how,
                              (unsigned long long)sh->version);
            }
            return refuse(ps, w, R_CLOSED, "step %llu of key %zu is already closed (open: %llu)",
                          (unsigned long long)clock, key, (unsigned long long)sh->version);
        }
        if (clock > sh->version)
            return refuse(ps, w, R_STEP,
                          "a push for step %llu of key %zu while its step %llu is open: in sync "
                          "mode every key is pushed at every step, and a key's result pulled "
                          "before its next push (this key skipped a step, or was not pulled)",
                          (unsigned long long)clock, key, (unsigned long long)sh->version);
        if (sh->has[w])
            return refuse(ps, w, R_STEP, "rank %d already pushed step %llu of key %zu", w,
                          (unsigned long long)clock, key);
        if (!sh->got[w] && !(sh->got[w] = malloc(sh->nfloats * sizeof(float))))
            return refuse(ps, w, R_CORRUPT, "the server has no memory for the push");
        terse_status s = decode_push(ps, w, sh, sh->got[w]);
        if (s != TERSE_OK)
            return refuse(ps, w, R_CORRUPT, "key %zu's payload does not decode: %s", key,
                          terse_last_error());
        size_t bad = terse__ps_first_nonfinite(sh->got[w], sh->nfloats);
        sh->wt[w] = p->h.weight;
        sh->has[w] = bad < sh->nfloats ? 2 : 1; /* a left-out push still counts as pushed */
        sh->count++;
        uint64_t before = sh->version;
        TERSE_CHECK(terse__ps_maybe_close(ps, key));
        if (bad < sh->nfloats)
            return refuse(ps, w, R_NONFINITE,
                          "key %zu's push for step %llu holds %g at element %zu of the server's "
                          "part: it was left out of the step's aggregate",
                          key, (unsigned long long)clock, (double)sh->got[w][bad], bad);
        if (then_pull) return handle_pull(ps, w);
        return send_reply(ps, w, TERSE_OK, before, NULL, 0, NULL);
    }
    /* async and ssp: apply on arrival. */
    if (ps->cfg.mode == TERSE_PS_SSP && clock < sh->pushed[w])
        return refuse(ps, w, R_STEP, "rank %d already pushed clock %llu of key %zu (next: %llu)", w,
                      (unsigned long long)clock, key, (unsigned long long)sh->pushed[w]);
    uint64_t stale = sh->version - sh->pulled[w];
    if (ps->cfg.mode == TERSE_PS_ASYNC && ps->cfg.max_staleness &&
        stale > (uint64_t)ps->cfg.max_staleness)
        return refuse(ps, w, R_STALE,
                      "the push of key %zu is %llu updates stale (rank %d last pulled version "
                      "%llu, the server is at %llu), over max_staleness=%d; pull and push again",
                      key, (unsigned long long)stale, w, (unsigned long long)sh->pulled[w],
                      (unsigned long long)sh->version, ps->cfg.max_staleness);
    terse_status s = decode_push(ps, w, sh, ps->scratch);
    if (s != TERSE_OK)
        return refuse(ps, w, R_CORRUPT, "key %zu's payload does not decode: %s", key,
                      terse_last_error());
    size_t bad = terse__ps_first_nonfinite(ps->scratch, sh->nfloats);
    if (bad < sh->nfloats) {
        /* Not applied, but this clock is over for w (its clock moves on):
         * ssp's slowest-worker bound must not wait for it. */
        if (clock + 1 > sh->pushed[w]) sh->pushed[w] = clock + 1;
        if (ps->cfg.mode == TERSE_PS_SSP) TERSE_CHECK(terse__ps_wake(ps, key));
        return refuse(ps, w, R_NONFINITE,
                      "key %zu's push holds %g at element %zu of the server's part: it was not "
                      "applied",
                      key, (double)ps->scratch[bad], bad);
    }
    float weight = 1.0f / (float)ps->nworkers;
    if (ps->cfg.mode == TERSE_PS_ASYNC && ps->cfg.lr_scale && stale > 1) weight /= (float)stale;
    uint64_t t0 = terse__now_ns();
    ps->rule->apply(&ps->cfg, sh->value, sh->mom, ps->scratch, sh->nfloats, weight);
    terse__comm_codec_time(ps->comm, t0);
    sh->version++;
    if (clock + 1 > sh->pushed[w]) sh->pushed[w] = clock + 1;
    ps->stats.pushes_applied++;
    ps->staleness_sum += stale;
    if (stale > ps->stats.staleness_max) ps->stats.staleness_max = stale;
    if (ps->cfg.mode == TERSE_PS_SSP) TERSE_CHECK(terse__ps_wake(ps, key));
    if (then_pull) return handle_pull(ps, w);
    return send_reply(ps, w, TERSE_OK, sh->version, NULL, stale, NULL);
}

/* A header from w has arrived: check it, then receive the payload, pull,
 * or finish. */
static terse_status handle_header(terse_ps *ps, int w) {
    terse__ps_peer *p = &ps->peers[w];
    terse__ps_hdr h;
    memset(&p->h, 0, sizeof p->h);
    terse_status s = terse__ps_get_hdr(p->hdr, &h);
    if (s != TERSE_OK) return refuse(ps, w, R_CORRUPT, "%s", terse_last_error());
    p->h = h;
    if (h.seq != p->seq)
        return refuse(ps, w, R_CORRUPT, "message number %llu where %llu was due",
                      (unsigned long long)h.seq, (unsigned long long)p->seq);
    if (!is_worker(ps, w))
        return refuse_drain(ps, w, R_ROLE,
                            "rank %d is a server (ranks 0..%d serve), not a worker: only workers "
                            "push and pull",
                            w, ps->nservers - 1);
    if (h.op == TERSE__PS_FINISH && h.payload_len)
        return refuse_drain(ps, w, R_CORRUPT, "a finish with a %llu-byte payload",
                            (unsigned long long)h.payload_len);
    if (!(h.weight > 0.0f && h.weight <= 3.0e38f)) /* NaN fails too */
        return refuse_drain(ps, w, R_CORRUPT, "a push weight of %g is not a positive finite number",
                            (double)h.weight);
    if (h.weight != 1.0f && h.op != TERSE__PS_PUSH && h.op != TERSE__PS_PUSHPULL)
        return refuse_drain(ps, w, R_CORRUPT, "a weight on a request that pushes nothing");
    const int finish = h.op == TERSE__PS_FINISH;
    if (!finish && ps->moved_epoch && h.epoch < ps->moved_epoch)
        return refuse_drain(ps, w, R_MOVED,
                            "slot %d went back to its head's replacement, server rank %d "
                            "(epoch %u)",
                            ps->slot, ps->slot, ps->moved_epoch);
    if (!finish && ps->awaiting) { /* a replacement: until its slot's state is in */
        p->state = P_HOLD;
        p->parked_ns = terse__now_ns();
        return TERSE_OK;
    }
    if (!finish && h.epoch != ps->epoch_cur)
        return refuse_drain(ps, w, R_STEP,
                            "a request of epoch %u for slot %d on rank %d, which is the slot's %s "
                            "(epoch %u)",
                            h.epoch, ps->slot, ps->rank,
                            ps->slot == ps->rank ? "head" : "replica", ps->epoch_cur);
    if (!finish && ps->abandoned && ps->promoted)
        return refuse_drain(ps, w, R_LOST,
                            ps->abandoned == 2
                                ? "slot %d is lost: its head, server rank %d, died before its "
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
        p->finished = 1;
        TERSE_CHECK(send_reply(ps, w, TERSE_OK, 0, NULL, 0, NULL));
        /* Fewer active workers: a sync step may now be complete. */
        for (size_t k = 0; k < ps->nkeys; k++)
            if (ps->keys[k]->shard) {
                TERSE_CHECK(terse__ps_maybe_close(ps, k));
                if (ps->cfg.mode == TERSE_PS_SSP) TERSE_CHECK(terse__ps_wake(ps, k));
            }
        return TERSE_OK;
    }
    if (h.key >= ps->nkeys || !ps->keys[h.key]->shard)
        return refuse_drain(ps, w, R_KEY, "key %llu is %s", (unsigned long long)h.key,
                            h.key >= ps->nkeys ? "not declared on this server"
                                               : "not held by this server");
    terse__ps_key *k = ps->keys[h.key];
    terse__ps_shard *sh = k->shard;
    if (h.nfloats != sh->nfloats)
        return refuse_drain(ps, w, R_SIZE,
                            "key %llu: the worker's part on this server has size %llu floats, the "
                            "server's %zu",
                            (unsigned long long)h.key, (unsigned long long)h.nfloats, sh->nfloats);
    if (h.decl_hash != k->decl_hash)
        return refuse_drain(ps, w, R_KEY,
                            "key %llu was declared differently on rank %d (size, chunking or "
                            "codec specs: here push \"%s\", pull \"%s\")",
                            (unsigned long long)h.key, w, k->push_spec, k->pull_spec);
    if (h.op == TERSE__PS_PULL) {
        if (h.payload_len)
            return refuse_drain(ps, w, R_CORRUPT, "a pull with a %llu-byte payload",
                                (unsigned long long)h.payload_len);
        return handle_pull(ps, w);
    }
    if (h.payload_len == 0 || h.payload_len > sh->push_bound)
        return refuse_drain(ps, w, R_SIZE,
                            "a push of key %llu with a %llu-byte payload; its chunks here encode "
                            "to 1..%zu bytes (wrong size or codec)",
                            (unsigned long long)h.key, (unsigned long long)h.payload_len,
                            sh->push_bound);
    if (sh->rx_cap[w] < h.payload_len) {
        uint8_t *b = realloc(sh->rx[w], (size_t)h.payload_len);
        if (!b) return refuse_drain(ps, w, R_CORRUPT, "the server has no memory for the push");
        sh->rx[w] = b;
        sh->rx_cap[w] = (size_t)h.payload_len;
    }
    p->state = P_DATA;
    p->since_ns = terse__now_ns();

    return terse__comm_irecv(ps->comm, w, terse__ps_tag(ps->slot, TERSE__PS_TAG_DATA, p->seq), sh->rx[w],
                             (size_t)h.payload_len, TERSE__BYTES_PAYLOAD, &p->preq);
}

static terse_status post_header(terse_ps *ps, int w) {
    terse__ps_peer *p = &ps->peers[w];
    memset(&p->h, 0, sizeof p->h);
    p->state = P_HDR;
    return terse__comm_irecv(ps->comm, w, terse__ps_tag(ps->slot, TERSE__PS_TAG_HDR, p->seq), p->hdr,
                             TERSE__PS_HDR_BYTES, TERSE__BYTES_FRAMING, &p->hreq);
}

/* ---------------------------------------------------------------- losses */

static void mark_lost(terse_ps *ps, int w, const char *how) {
    terse__ps_peer *p = &ps->peers[w];
    if (p->lost || p->finished) return;
    p->lost = 1; /* a server peer too: nothing more is expected from it */
    if (!is_worker(ps, w)) return;
    ps->stats.workers_lost++;
    if (ps->slot == ps->rank) /* its mirror instance learns it too: one line */
        fprintf(stderr, "terse: parameter server rank %d: worker rank %d was lost (%s)\n",
                ps->rank, w, how);
    if (ps->cfg.mode != TERSE_PS_SYNC || ps->broken[0]) return;
    /* With a quorum the steps close on the workers left. */
    if (!ps->cfg.quorum)
        snprintf(ps->broken, sizeof ps->broken,
                 "worker rank %d was lost (%s); sync mode without a quorum cannot close a step "
                 "without it",
                 w, how);
}

/* After losses: fail the parked requests of a broken job, or go on. */
static terse_status after_loss(terse_ps *ps) {
    for (int w = 0; w < ps->nranks; w++) {
        terse__ps_peer *p = &ps->peers[w];
        if (w != ps->rank && !p->lost && p->state == P_PARKED && ps->broken[0])
            TERSE_CHECK(refuse(ps, w, R_LOST, "%s", ps->broken));
    }
    if (ps->broken[0]) return TERSE_OK;
    for (size_t k = 0; k < ps->nkeys; k++)
        if (ps->keys[k]->shard) {
            TERSE_CHECK(terse__ps_maybe_close(ps, k));
            if (ps->cfg.mode == TERSE_PS_SSP) TERSE_CHECK(terse__ps_wake(ps, k));
        }
    return TERSE_OK;
}

static terse_status poll_losses(terse_ps *ps) {
    terse_comm *c = ps->comm;
    if (!c->store) return TERSE_OK;
    const uint8_t *lost = NULL;
    terse_status s = terse__store_poll_lost(c->store, &lost);
    if (s != TERSE_OK) return s;
    int any = 0;
    for (int w = ps->nservers; w < ps->nranks; w++)
        if (lost[w] && !ps->peers[w].lost && !ps->peers[w].finished) {
            mark_lost(ps, w, "its connection to the bootstrap store dropped without a goodbye");
            any = 1;
        }
    return any ? after_loss(ps) : TERSE_OK;
}

/* An instance that serves a slot from now on (a promoted replica, a
 * replacement with its slot back): its clocks start now. Returns the
 * slot's step (the last key's version). */
static uint64_t start_serving(terse_ps *ps) {
    uint64_t now = terse__now_ns(), step = 0;
    ps->heard_ns = now;
    for (size_t k = 0; k < ps->nkeys; k++)
        if (ps->keys[k]->shard) {
            ps->keys[k]->shard->opened_ns = now;
            step = ps->keys[k]->shard->version;
        }
    return step;
}

/* replicas 2: the head of the mirror's slot was lost, so the mirror
 * serves the slot from its last acknowledged step on (ps_replica.c). */
static terse_status promote(terse_ps *ps) {
    terse_ps *m = ps->mirror;
    terse__fabric *f = ps->comm->fabric;
    if (!terse__fabric_cancel(f, &m->rhreq)) (void)terse__fabric_give_up(f, &m->rhreq);
    if (!terse__fabric_cancel(f, &m->rdreq)) (void)terse__fabric_give_up(f, &m->rdreq);
    terse__ps_stop_handing(m); /* the replacement died while the slot went back to it */
    if (m->catching && !m->abandoned) m->abandoned = 2; /* it never had the whole slot */
    m->promoted = 1;
    m->took_over = 1;
    m->listening = 0;
    m->stats.takeovers += !m->abandoned;
    uint64_t step = start_serving(m);
    if (m->abandoned)
        fprintf(stderr,
                "terse: parameter server rank %d: server rank %d, the head of slot %d, was lost "
                "after it had stopped replicating here: the slot is lost\n",
                ps->rank, m->slot, m->slot);
    else
        fprintf(stderr,
                "terse: parameter server rank %d: server rank %d, the head of slot %d, was lost; "
                "its replica here serves the slot from step %llu on\n",
                ps->rank, m->slot, m->slot, (unsigned long long)step);
    for (int w = m->nservers; w < m->nranks; w++)
        if (m->peers[w].state == P_HOLD) TERSE_CHECK(handle_header(m, w));
    return TERSE_OK;
}

/* replicas 2: server rank r is back (a replacement joined as it). The
 * mirror's head: give the slot back; this head's replica: catch it up. A
 * rank lost and back between two polls is both at once. */
static terse_status on_back(terse_ps *ps, int r) {
    terse_ps *m = ps->mirror;
    if (r >= ps->nservers) return TERSE_OK; /* a worker's replacement is not served */
    if (m && r == m->slot) {
        if (!m->promoted) TERSE_CHECK(promote(ps));
        if (m->abandoned) {
            fprintf(stderr, "terse: parameter server rank %d: server rank %d is back, but slot %d "
                            "was lost here: nothing to give back\n",
                    ps->rank, r, r);
        } else {
            TERSE_CHECK(terse__ps_hand_back(m, terse__store_incarnation(ps->comm->store, r)));
            for (int w = m->nservers; w < m->nranks; w++) {
                terse__ps_peer *p = &m->peers[w];
                if (p->lost) continue;
                if (p->state == P_PARKED) TERSE_CHECK(moved(m, w));
                else if (p->state == P_HOLD) TERSE_CHECK(handle_header(m, w));
            }
        }
    }
    if (r == (ps->rank + 1) % ps->nservers) {
        if (ps->backup >= 0)
            TERSE_CHECK(terse__ps_backup_lost(ps, "a replacement joined as it", 0));
        TERSE_CHECK(terse__ps_backup_add(ps, r));
    }
    return TERSE_OK;
}

/* replicas 2: a server was lost. The mirror's head: take over; this
 * head's replica: go on alone. A server back: on_back. */
static terse_status poll_servers(terse_ps *ps) {
    if (!ps->comm->store || !ps->mirror) return TERSE_OK;
    const uint8_t *lost = NULL;
    TERSE_CHECK(terse__store_poll_lost(ps->comm->store, &lost));
    if (!ps->mirror->promoted && lost[ps->mirror->slot]) TERSE_CHECK(promote(ps));
    if (ps->awaiting && lost[ps->repl_src])
        return TERSE_ERROR(TERSE_ERR_PEER_LOST,
                           "parameter server rank %d (a replacement): slot %d is lost: server "
                           "rank %d, which stood in for it, died before handing it back",
                           ps->rank, ps->slot, ps->repl_src);
    if (ps->backup >= 0 && lost[ps->backup])
        TERSE_CHECK(terse__ps_backup_lost(ps, "the bootstrap store announced its loss", 0));
    for (;;) {
        int r = -1;
        TERSE_CHECK(terse__comm_take_back(ps->comm, &r));
        if (r < 0) return TERSE_OK;
        TERSE_CHECK(on_back(ps, r));
    }
}

/* A roster from the slot's other server: the workers it lists as finished
 * said goodbye there before this instance could hear it. */
terse_status terse__ps_take_roster(terse_ps *ps, const uint8_t *roster) {
    int any = 0;
    for (int w = ps->nservers; w < ps->nranks; w++) {
        terse__ps_peer *p = &ps->peers[w];
        if (!(roster[w] & 1) || p->finished || p->lost) continue;
        /* Its header receive stays posted: the worker may yet say goodbye
         * here too (answered as usual), or never (it did not know of this
         * process); either way nothing more is due from it. */
        p->finished = p->by_roster = 1;
        any = 1;
    }
    if (!any || ps->awaiting || (ps->slot != ps->rank && !ps->promoted)) return TERSE_OK;
    for (size_t k = 0; k < ps->nkeys; k++)
        if (ps->keys[k]->shard) TERSE_CHECK(terse__ps_maybe_close(ps, k));
    return TERSE_OK;
}

/* A replacement's head has its slot's state: serve it from here on. */
terse_status terse__ps_caught_up(terse_ps *ps) {
    if (!ps->awaiting) return TERSE_OK; /* a replica caught up: nothing more */
    ps->awaiting = 0;
    ps->took_over = 1;
    ps->listening = 0;
    ps->backup = (ps->rank + 1) % ps->nservers;
    ps->rseq = 0;
    uint64_t step = start_serving(ps);
    fprintf(stderr,
            "terse: parameter server rank %d (a replacement) has slot %d back from server rank "
            "%d, at step %llu (epoch %u)\n",
            ps->rank, ps->slot, ps->repl_src, (unsigned long long)step, ps->epoch_cur);
    for (int w = ps->nservers; w < ps->nranks; w++)
        if (ps->peers[w].state == P_HOLD) TERSE_CHECK(handle_header(ps, w));
    return TERSE_OK;
}

/* A replacement whose slots did not come back within the timeout: the
 * job ended before it joined, or the server that would send them died.
 * Its own slot: serving fails; the slot it replicates: it stops waiting
 * for that (it cannot take that slot over) and ends with its own. */
static terse_status waited_too_long(terse_ps *ps, uint64_t waited_ns) {
    const uint64_t limit = (uint64_t)ps->comm->timeout_ms * 1000000ull;
    if (waited_ns < limit) return TERSE_OK;
    terse_ps *m = ps->mirror;
    if (m && m->catching && !m->promoted) {
        fprintf(stderr, "terse: parameter server rank %d (a replacement): slot %d's state never "
                        "came from its head, server rank %d; this rank will not take it over\n",
                ps->rank, m->slot, m->slot);
        m->catching = 0;
        m->abandoned = 2;
        for (int w = m->nservers; w < m->nranks; w++)
            if (!m->peers[w].finished) m->peers[w].finished = m->peers[w].by_roster = 1;
    }
    if (!ps->awaiting) return TERSE_OK;
    return TERSE_ERROR(TERSE_ERR_TIMEOUT,
                       "parameter server rank %d (a replacement): slot %d never came back from "
                       "server rank %d within %d ms (the job ended before this rank joined, or "
                       "that server died)",
                       ps->rank, ps->slot, ps->repl_src, ps->comm->timeout_ms);
}

/* Held requests: an unpromoted replica's (its head is alive after all),
 * or a replacement's whose slot never came back. */
static terse_status expire_held(terse_ps *ps, uint64_t now) {
    uint64_t limit = (uint64_t)ps->comm->timeout_ms * 750000ull;
    for (int w = ps->nservers; w < ps->nranks; w++) {
        terse__ps_peer *p = &ps->peers[w];
        if (p->state != P_HOLD || now < p->parked_ns || now - p->parked_ns < limit) continue;
        if (ps->awaiting)
            TERSE_CHECK(refuse_drain(ps, w, R_LOST,
                                     "rank %d replaces slot %d's head, and the slot's state never "
                                     "came back to it from server rank %d",
                                     ps->rank, ps->slot, ps->repl_src));
        else
            TERSE_CHECK(refuse_drain(ps, w, R_ROLE,
                                     "rank %d holds slot %d's replica, and the slot's head, "
                                     "server rank %d, was not lost: send it there",
                                     ps->rank, ps->slot, ps->slot));
    }
    return TERSE_OK;
}

/* Parked pulls older than 3/4 of the timeout: the workers they wait for
 * are stopped or far too slow; tell the waiter which, before its own
 * timeout fires. */
/* sync deadline_ms: close every step open for longer, with what it has. */
static terse_status close_overdue(terse_ps *ps, uint64_t now) {
    if (ps->cfg.mode != TERSE_PS_SYNC || !ps->cfg.deadline_ms || ps->awaiting) return TERSE_OK;
    const uint64_t limit = (uint64_t)ps->cfg.deadline_ms * 1000000ull;
    for (size_t key = 0; key < ps->nkeys; key++) {
        terse__ps_shard *sh = ps->keys[key]->shard;
        if (!sh || sh->repl_pending || now < sh->opened_ns || now - sh->opened_ns < limit)
            continue;
        TERSE_CHECK(close_step(ps, key, 1));
        TERSE_CHECK(terse__ps_wake(ps, key));
    }
    return TERSE_OK;
}

static terse_status expire_parked(terse_ps *ps, uint64_t now) {
    uint64_t limit = (uint64_t)ps->comm->timeout_ms * 750000ull;
    for (int w = 0; w < ps->nranks; w++) {
        terse__ps_peer *p = &ps->peers[w];
        if (w == ps->rank || p->lost || p->state != P_PARKED || now < p->parked_ns ||
            now - p->parked_ns < limit)
            continue;
        terse__ps_shard *sh = ps->keys[p->h.key]->shard;
        char who[160];
        missing(ps, sh, ssp_need(ps, p->h.clock), who, sizeof who);
        TERSE_CHECK(refuse(ps, w, R_TIMEOUT,
                           "step %llu of key %llu waited %llu ms for worker ranks %s, which "
                           "neither pushed nor were lost",
                           (unsigned long long)p->h.clock, (unsigned long long)p->h.key,
                           (unsigned long long)((now - p->parked_ns) / 1000000u), who));
    }
    return TERSE_OK;
}

static void release_blob(terse_ps *ps, terse__ps_peer *p) {
    terse__ps_blob *b = p->blob;
    p->blob = NULL;
    if (!b || --b->refs) return;
    terse__ps_shard *sh = p->h.key < ps->nkeys ? ps->keys[p->h.key]->shard : NULL;
    if (!sh || sh->cur != b) blob_free(b);
}

/* A peer that went silent in the middle of a request (a payload or a
 * reply that stopped moving) for the whole timeout: stopped, or a forger
 * whose chunks are dropped. Cancel what it holds and count it lost. */
static terse_status expire_stuck(terse_ps *ps, uint64_t now) {
    uint64_t limit = (uint64_t)ps->comm->timeout_ms * 1000000ull;
    terse__fabric *f = ps->comm->fabric;
    for (int w = 0; w < ps->nranks; w++) {
        terse__ps_peer *p = &ps->peers[w];
        if (w == ps->rank || p->lost || now < p->since_ns || now - p->since_ns < limit ||
            (p->state != P_DATA && p->state != P_DRAIN && p->state != P_REPLY))
            continue;
        int ok = terse__fabric_cancel(f, &p->preq) & terse__fabric_cancel(f, &p->rreq) &
                 terse__fabric_cancel(f, &p->rpreq);
        if (!ok)
            return TERSE_ERROR(TERSE_ERR_TRANSPORT,
                               "parameter server rank %d: rank %d's transfer would not cancel",
                               ps->rank, w);
        release_blob(ps, p);
        if (p->finished) {
            p->state = P_DONE;
            continue;
        }
        char how[96];
        snprintf(how, sizeof how, "silent for %llu ms in the middle of a request",
                 (unsigned long long)((now - p->since_ns) / 1000000u));
        p->state = P_DONE;
        mark_lost(ps, w, how);
        p->lost = 1;
        TERSE_CHECK(after_loss(ps));
    }
    return TERSE_OK;
}

/* Every active worker silent (no request, none in progress) for the
 * timeout: a worker that ended without terse_ps_finish, or one stopped
 * between requests. Serving ends with TERSE_ERR_TIMEOUT naming them. */
static terse_status check_silence(terse_ps *ps, uint64_t now) {
    uint64_t limit = (uint64_t)ps->comm->timeout_ms * 1000000ull;
    if (ps->awaiting || now < ps->heard_ns || now - ps->heard_ns < limit) return TERSE_OK;
    char who[160];
    size_t n = 0;
    who[0] = 0;
    for (int w = ps->nservers; w < ps->nranks; w++) {
        if (!active(ps, w)) continue;
        if (ps->peers[w].state != P_HDR) return TERSE_OK; /* a conversation is under way */
        if (n + 12 < sizeof who) n += (size_t)snprintf(who + n, sizeof who - n, "%s%d", n ? "," : "", w);
    }
    if (!n) return TERSE_OK;
    return TERSE_ERROR(TERSE_ERR_TIMEOUT,
                       "parameter server rank %d: no request from worker ranks %s for %llu ms, "
                       "and they neither finished (terse_ps_finish) nor were lost",
                       ps->rank, who, (unsigned long long)((now - ps->heard_ns) / 1000000u));
}

/* ---------------------------------------------------------------- loop */


/* Move peer w along as far as its completions allow. */
static terse_status step_peer(terse_ps *ps, int w) {
    terse__ps_peer *p = &ps->peers[w];
    const terse__fabric *f = ps->comm->fabric;
    if (p->lost) return TERSE_OK;
    switch (p->state) {
    case P_HDR:
        if (!terse__fabric_req_idle(f, &p->hreq)) return TERSE_OK;
        if (p->hreq.error == TERSE_ERR_PEER_LOST) {
            mark_lost(ps, w, terse__comm_last_sentence());
            return after_loss(ps);
        }
        if (p->hreq.error && !is_worker(ps, w)) { /* a server that died or was replaced */
            p->lost = 1;
            return TERSE_OK;
        }
        ps->heard_ns = terse__now_ns();
        if (p->hreq.error) return refuse(ps, w, R_CORRUPT, "a request header of the wrong size");
        return handle_header(ps, w);
    case P_DATA:
    case P_DRAIN:
        if (!terse__fabric_req_idle(f, &p->preq)) return TERSE_OK;
        if (p->preq.error == TERSE_ERR_PEER_LOST) {
            mark_lost(ps, w, terse__comm_last_sentence());
            return after_loss(ps);
        }
        if (p->state == P_DRAIN || p->preq.error) {
            int kind = p->state == P_DRAIN ? (int)p->pend : R_CORRUPT;
            const char *why = p->state == P_DRAIN ? p->pend_text : "a payload of the wrong size";
            char text[TERSE__PS_REP_TEXT];
            snprintf(text, sizeof text, "%s", why);
            return refuse(ps, w, kind, "%s", text);
        }
        return handle_push(ps, w);
    case P_REPLY:
        if (!terse__fabric_req_idle(f, &p->rreq) || !terse__fabric_req_idle(f, &p->rpreq))
            return TERSE_OK;
        release_blob(ps, p);
        if (p->rreq.error || p->rpreq.error) {
            if (p->finished) { /* it said goodbye and went: nothing more is due */
                p->state = P_DONE;
                return TERSE_OK;
            }
            mark_lost(ps, w, "a reply to it failed");
            return after_loss(ps);
        }
        p->seq++;
        if (p->finished) {
            p->state = P_DONE;
            return TERSE_OK;
        }
        return post_header(ps, w);
    default:
        return TERSE_OK;
    }
}

static int all_done(const terse_ps *ps) {
    for (int w = ps->nservers; w < ps->nranks; w++) {
        const terse__ps_peer *p = &ps->peers[w];
        int done = p->state == P_DONE || (p->by_roster && p->state == P_HDR);
        if (!p->lost && !(p->finished && done)) return 0;
    }
    return 1;
}

/* Cancel what is still posted to each peer (other servers' headers,
 * lost workers' receives); 0 if something would not come back. */
static int cancel_all(terse_ps *ps) {
    terse__fabric *f = ps->comm->fabric;
    int ok = 1;
    for (int w = 0; w < ps->nranks; w++) {
        if (w == ps->rank) continue;
        terse__ps_peer *p = &ps->peers[w];
        ok &= terse__fabric_cancel(f, &p->hreq);
        ok &= terse__fabric_cancel(f, &p->preq);
        ok &= terse__fabric_cancel(f, &p->rreq);
        ok &= terse__fabric_cancel(f, &p->rpreq);
        release_blob(ps, p);
    }
    return ok;
}

/* A promoted replica's work counts as this server's. */
static void fold_stats(terse_ps *ps, const terse_ps *m) {
    terse_ps_stats *a = &ps->stats;
    const terse_ps_stats *b = &m->stats;
    a->pushes_applied += b->pushes_applied;
    a->steps_closed += b->steps_closed;
    a->late_dropped += b->late_dropped;
    a->refused_key += b->refused_key;
    a->refused_step += b->refused_step;
    a->refused_role += b->refused_role;
    a->refused_corrupt += b->refused_corrupt;
    a->refused_nonfinite += b->refused_nonfinite;
    a->deadline_closes += b->deadline_closes;
    a->takeovers += b->takeovers;
    a->duplicates += b->duplicates;
    if (b->workers_lost > a->workers_lost) a->workers_lost = b->workers_lost;
}

terse_status terse__ps_serve_run(terse_comm *c, terse_request *r, int *keep_usable) {
    terse_ps *ps = r->a.ext.obj;
    terse_status s = TERSE_OK;
    if (ps->served) {
        *keep_usable = 1;
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_serve on rank %d: this server already served its workers "
                           "(it runs once per terse_ps)",
                           ps->rank);
    }
    ps->served = 1;
    terse_ps *m = ps->mirror; /* replicas 2: the slot this rank is the replica of */
    for (int w = 0; w < ps->nranks && s == TERSE_OK; w++)
        if (w != ps->rank) s = post_header(ps, w);
    for (int w = ps->nservers; m && w < ps->nranks && s == TERSE_OK; w++) s = post_header(m, w);
    uint64_t last_poll = 0, last_event = terse__now_ns();
    const uint64_t started = last_event;
    ps->heard_ns = last_event;
    if (m) m->heard_ns = last_event;
    unsigned idle = 0;
    while (s == TERSE_OK && !(all_done(ps) && (!m || all_done(m)))) {
        if (atomic_load_explicit(&c->aborted, memory_order_acquire)) {
            s = TERSE_ERROR(TERSE_ERR_ABORTED, "parameter server rank %d: aborted "
                                               "(terse_comm_abort) while serving", ps->rank);
            break;
        }
        size_t events = 0;
        s = terse__fabric_progress(c->fabric, &events);
        for (int w = 0; s == TERSE_OK && w < ps->nranks; w++)
            if (w != ps->rank) s = step_peer(ps, w);
        for (int w = ps->nservers; m && s == TERSE_OK && w < ps->nranks; w++) s = step_peer(m, w);
        if (s == TERSE_OK && (m || ps->backup >= 0)) s = terse__ps_repl_progress(ps);
        uint64_t now = terse__now_ns();
        if (s == TERSE_OK && now - last_poll >= POLL_NS) {
            last_poll = now;
            s = poll_losses(ps);
            if (s == TERSE_OK) s = poll_servers(ps);
            if (s == TERSE_OK) s = close_overdue(ps, now);
            if (s == TERSE_OK) s = expire_parked(ps, now);
            if (s == TERSE_OK) s = expire_stuck(ps, now);
            /* a request to either instance is a worker heard */
            if (m && m->heard_ns > ps->heard_ns) ps->heard_ns = m->heard_ns;
            if (m && ps->heard_ns > m->heard_ns) m->heard_ns = ps->heard_ns;
            if (s == TERSE_OK) s = check_silence(ps, now);
            /* the mirror learns losses too: a dead worker's goodbye never comes */
            if (s == TERSE_OK && m) s = poll_losses(m);
            if (s == TERSE_OK && m && !m->promoted) s = expire_held(m, now);
            if (s == TERSE_OK && ps->awaiting) s = expire_held(ps, now);
            if (s == TERSE_OK && (ps->awaiting || (m && m->catching)))
                s = waited_too_long(ps, now - started);
            if (s == TERSE_OK && m && m->promoted) s = close_overdue(m, now);
            if (s == TERSE_OK && m && m->promoted) s = expire_parked(m, now);
            if (s == TERSE_OK && m) s = expire_stuck(m, now);
            if (s == TERSE_OK && m && m->promoted) s = check_silence(m, now);
        }
        if (events) {
            idle = 0;
            last_event = now;
        } else if (now - last_event >= NAP_AFTER_NS) {
            struct timespec nap = {0, 20000};
            nanosleep(&nap, NULL);
        } else if (++idle >= 16) {
            sched_yield();
        }
    }
    if (s == TERSE_OK) terse__ps_tell_done(ps);
    char why[512];
    snprintf(why, sizeof why, "%s", terse_last_error());
    terse__ps_repl_cancel(ps);
    int clean = cancel_all(ps); /* its cancellations leave sentences of their own */
    if (m) {
        clean &= cancel_all(m);
        fold_stats(ps, m);
    }
    if (s != TERSE_OK) terse__error_restore(why);
    if (s != TERSE_OK || !clean) {
        if (s == TERSE_OK)
            s = TERSE_ERROR(TERSE_ERR_TRANSPORT,
                            "parameter server rank %d: a receive would not cancel", ps->rank);
        return s; /* the engine quiesces the fabric */
    }
    *keep_usable = 1;
    for (int w = ps->nservers; w < ps->nranks; w++)
        if (ps->peers[w].lost)
            return TERSE_ERROR(TERSE_ERR_PEER_LOST,
                               "parameter server rank %d: worker rank %d was lost; %s", ps->rank,
                               w,
                               ps->broken[0] ? "its steps failed (sync without enough workers)"
                                             : "serving went on without it");
    return TERSE_OK;
}

terse_status terse_ps_serve(terse_ps *ps) {
    if (!ps) return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_serve: ps is NULL");
    if (!ps->is_server)
        return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_serve on rank %d: this rank is a worker",
                           ps->rank);
    terse_request t = terse__engine_make(ps->comm, TERSE__OP_EXT);
    t.a.ext.run = terse__ps_serve_run;
    t.a.ext.obj = ps;
    t.a.ext.name = "terse_ps_serve";
    return terse__engine_run_ext(ps->comm, &t);
}
