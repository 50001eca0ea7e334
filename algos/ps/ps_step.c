/* A key's part on a server and its steps: the shard (made by
 * terse_ps_declare, freed with the server), and in sync mode the closing
 * of a step -- the pushes aggregated, the update applied, the pulls parked
 * on it answered -- once enough workers pushed it, or at its deadline. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algos/ps/ps.h"
#include "algos/ps/ps_server.h"
#include "common/error.h"

/* ---------------------------------------------------------------- shards */

void terse__ps_blob_free(terse__ps_blob *b) {
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
    sh->prefused = calloc(N, sizeof *sh->prefused);
    if ((ps->stale_rule & TERSE_PS_STALE_DC) && !(sh->kept = calloc(N, sizeof *sh->kept)))
        return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_declare: no memory");
    if ((ps->stale_rule & TERSE_PS_STALE_DANA) && !(sh->wmom = calloc(N, sizeof *sh->wmom)))
        return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_declare: no memory");
    if (!sh->chunks || !sh->offs || !sh->dec || !sh->enc || !sh->rx || !sh->rx_cap || !sh->got ||
        !sh->wt || !sh->has || !sh->pushed || !sh->pulled || !sh->prefused)
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
    if (sh->wmom && !(sh->vsum = calloc(sh->nfloats, sizeof(float))))
        return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_declare: no memory for %zu floats",
                           sh->nfloats);
    const int shared_mom = ps->cfg.update == TERSE_PS_UPDATE_SGD && ps->cfg.momentum > 0.0f &&
                           !sh->wmom; /* dana: per worker */
    if (shared_mom) sh->mom = calloc(sh->nfloats, sizeof(float));
    if (ps->agg->needs_center) sh->center = calloc(sh->nfloats, sizeof(float));
    sh->opened_ns = terse__now_ns();
    if (!sh->value || (shared_mom && !sh->mom) ||
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
        if (sh->kept) free(sh->kept[r]);
        if (sh->wmom) free(sh->wmom[r]);
    }
    free(sh->kept), free(sh->wmom), free(sh->vsum);
    if (sh->cur && sh->cur->refs == 0) terse__ps_blob_free(sh->cur);
    free(sh->chunks), free(sh->offs), free(sh->dec), free(sh->enc);
    free(sh->rx), free(sh->rx_cap), free(sh->got), free(sh->wt), free(sh->has);
    free(sh->pushed), free(sh->pulled), free(sh->prefused), free(sh->value), free(sh->mom), free(sh->center);
    free(sh->repl_buf);
    free(sh);
}

/* ---------------------------------------------------------------- steps */

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
    const float lr = terse__ps_lr_at(&ps->cfg, sh->version);
    if (k && weighted) { /* the mean (handle_push refuses weights elsewhere) */
        terse__ps_agg_weighted_mean(ps->inputs, ps->wts, k, sh->nfloats, ps->scratch);
        ps->rule->apply(lr, ps->cfg.momentum, sh->value, sh->mom, ps->scratch, sh->nfloats, 1.0f);
    } else if (k) {
        TERSE_CHECK(ps->agg->aggregate(&ps->agg_params, ps->inputs, k, sh->nfloats, ps->scratch,
                                       sh->center));
        ps->rule->apply(lr, ps->cfg.momentum, sh->value, sh->mom, ps->scratch, sh->nfloats, 1.0f);
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
    for (int cv = 0; cv < ps->nranks * ps->lanes; cv++) {
        terse__ps_peer *p = &ps->peers[cv];
        const int w = terse__ps_cv_rank(ps, cv);
        if (w != ps->rank && !terse__ps_wk(ps, w)->lost && p->state == P_PARKED && p->h.key == key)
            TERSE_CHECK(terse__ps_handle_pull(ps, cv));
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
    for (int w = ps->nservers; w < ps->nranks; w++)
        active_missing += terse__ps_active(ps, w) && !sh->has[w];
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

/* sync deadline_ms: close every step open for longer, with what it has. */
terse_status terse__ps_close_overdue(terse_ps *ps, uint64_t now) {
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
