/* Colocated servers (terse_ps_config.colocate; docs/ps.md, "Colocated
 * servers"): every rank is a worker and a server, BytePS style.
 *
 * The server loop holds its communicator's executor until every worker
 * has finished, so a rank cannot serve and push through one executor.
 * terse__comm_colocate (algos/engine/engine_twin.c) gives each rank two more
 * endpoints, each a communicator with a progress thread of its own, wired
 * into one job of 2N virtual ranks: [0, N) the servers, [N, 2N) the
 * workers. This file runs the unchanged parameter server on them: the
 * server instance (virtual rank r) serves on its executor, the worker
 * instance (virtual rank N + r) is the caller's handle. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "algos/engine/engine.h"
#include "algos/ps/ps.h"
#include "common/error.h"

typedef struct terse__ps_colo {
    terse_comm *scomm, *wcomm; /* the server's and the worker's endpoints */
    terse_ps *srv;             /* the server instance */
    terse_request *serve;      /* its terse_ps_serve, once started */
    int stopped;
} terse__ps_colo;

terse_status terse__ps_colo_check(terse_comm *comm, const terse_ps_config *cfg) {
    const int n = comm->nranks;
    if (cfg->colocate != 1)
        return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_create: colocate %d is 0 or 1",
                           cfg->colocate);
    if (n < 2)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_create: colocate=1 needs 2 ranks or more (%d here): a single "
                           "rank has nobody to share a model with",
                           n);
    if (n > TERSE__PS_MAX_SERVERS)
        return TERSE_ERROR(TERSE_ERR_UNSUPPORTED,
                           "terse_ps_create: colocate=1 makes all %d ranks servers; a request "
                           "talks to at most %d at once",
                           n, TERSE__PS_MAX_SERVERS);
    if (cfg->replicas == 2)
        return TERSE_ERROR(TERSE_ERR_UNSUPPORTED,
                           "terse_ps_create: colocate=1 with replicas 2 is not built: a "
                           "colocated rank's death loses a server and a worker at once, and "
                           "failover, its resends and a replacement's hand-back were built and "
                           "tested for servers that are not workers (use separate servers for "
                           "replicas 2)");
    if (comm->rejoined)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_create on rank %d: this rank rejoined as a lost rank's "
                           "replacement (TERSE_REJOIN), which only a server of a parameter "
                           "server with replicas 2 can be (colocate=1 here)",
                           comm->rank);
    return TERSE_OK;
}

static void *leave_comm(void *c) {
    terse__comm_leave(c);
    return NULL;
}

void terse__ps_colo_free(terse__ps_colo *colo) {
    if (!colo) return;
    if (colo->serve) {
        /* done (colo_stop waited), or never waited for: abort it */
        terse_request_free(colo->serve);
    }
    terse_ps_free(colo->srv);
    /* On net a communicator's free first waits until its peers have read
     * what it sent them, and a peer reads only while its endpoint is
     * driven: rank A's worker endpoint waits for B's server endpoint while
     * B's server endpoint waits for A's worker endpoint. Both endpoints
     * are freed at once, each on a thread, so each rank drives both. */
    if (colo->wcomm && colo->wcomm->pid != getpid()) { /* a forked child: the parent's */
        free(colo);
        return;
    }
    /* On shm each endpoint may write into the other's memory (same
     * process): both executors stop before either endpoint closes. */
    if (colo->wcomm) terse__engine_shutdown(colo->wcomm);
    if (colo->scomm) terse__engine_shutdown(colo->scomm);
    pthread_t t;
    int threaded = colo->scomm && pthread_create(&t, NULL, leave_comm, colo->scomm) == 0;
    terse__comm_leave(colo->wcomm);
    if (threaded) pthread_join(t, NULL);
    else terse__comm_leave(colo->scomm);
    free(colo);
}

terse_status terse__ps_colo_create(terse_comm *comm, const terse_ps_config *cfg,
                                   terse__ps_create_fn create, terse_ps **out) {
    terse__ps_colo *colo = calloc(1, sizeof *colo);
    if (!colo) return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_ps_create: no memory");
    terse_status s = terse__comm_colocate(comm, &colo->scomm, &colo->wcomm);
    if (s == TERSE_OK) s = create(colo->scomm, cfg, 1, &colo->srv);
    terse_ps *wk = NULL;
    if (s == TERSE_OK) s = create(colo->wcomm, cfg, 1, &wk);
    if (s != TERSE_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", terse_last_error());
        terse_ps_free(wk);
        terse__ps_colo_free(colo);
        terse__error_restore(why);
        return s;
    }
    colo->srv->colo_rank = wk->colo_rank = comm->rank;
    wk->colo = colo;
    *out = wk;
    return TERSE_OK;
}

terse_status terse__ps_colo_declare(terse_ps *ps, size_t key, size_t n, const char *push_spec,
                                    const char *pull_spec, const float *init) {
    terse__ps_colo *colo = ps->colo;
    if (colo->serve)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_declare of key %zu on rank %d: with colocate=1 every key is "
                           "declared before the rank's first push, pull or finish (its server "
                           "is serving since)",
                           key, ps->colo_rank);
    /* the worker's and the server's views of the key, declared alike */
    ps->colo = NULL;
    terse_status s = terse_ps_declare(ps, key, n, push_spec, pull_spec, init);
    ps->colo = colo;
    if (s != TERSE_OK) return s;
    s = terse_ps_declare(colo->srv, key, n, push_spec, pull_spec, init);
    if (s != TERSE_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", terse_last_error());
        /* the worker's half stays declared: nothing can use the pair now */
        colo->stopped = 1;
        terse__error_restore(why);
    }
    return s;
}

terse_status terse__ps_colo_serve(terse_ps *ps) {
    terse__ps_colo *colo = ps->colo;
    if (colo->serve) return TERSE_OK;
    if (colo->stopped)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "rank %d: this colocated parameter server's declarations failed "
                           "half-way (see the failed terse_ps_declare); free it",
                           ps->colo_rank);
    terse_request t = terse__engine_make(colo->scomm, TERSE__OP_EXT);
    t.a.ext.run = terse__ps_serve_run;
    t.a.ext.obj = colo->srv;
    t.a.ext.name = "terse_ps_serve";
    return terse__engine_start_ext(colo->scomm, &t, &colo->serve);
}

void terse__ps_colo_stats(const terse_ps *ps, terse_ps_stats *st) {
    const terse__ps_colo *colo = ps->colo;
    /* The server's counters, once it has finished serving (its executor
     * writes them until then). */
    if (!colo->serve || !terse__engine_is_done(colo->serve)) return;
    const terse_ps *s = colo->srv;
    uint64_t pushes = st->pushes, pulls = st->pulls, stale = st->stale_refused;
    const size_t size = st->size; /* what the caller's struct holds (terse_ps_get_stats) */
    *st = s->stats;
    st->size = size;
    st->pushes = pushes;
    st->pulls = pulls;
    st->stale_refused = stale;
    st->staleness_mean =
        s->stats.pushes_applied ? (double)s->staleness_sum / (double)s->stats.pushes_applied : 0.0;
}

void terse__ps_colo_stop(terse_ps *ps) {
    terse__ps_colo *colo = ps->colo;
    /* Every worker is served until it finishes or is lost, this one's
     * own finish included: started if the worker never made a request. */
    if (!colo->serve && terse__ps_colo_serve(ps) != TERSE_OK) return;
    /* A worker that could not finish (its communicator failed) never will:
     * its own server counts it lost instead of waiting for the timeout, and
     * so do the other ranks' servers, told through the store (their
     * lost maps show this rank's worker, comm_vmap.c). */
    if (!ps->finished) {
        atomic_store(&colo->srv->colo_worker_gone, 1);
        if (ps->comm && ps->comm->store) (void)terse__store_tell_worker_gone(ps->comm->store, ps->comm->vgen);
    }
    terse_status s = terse_request_wait(colo->serve);
    if (s != TERSE_OK)
        fprintf(stderr, "terse: rank %d: its colocated server ended: %s\n", ps->colo_rank,
                terse_last_error());
}
