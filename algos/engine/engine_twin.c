/* A colocated parameter server's endpoints (DESIGN.md, "Parameter
 * server": a rank is a server and a worker at once, BytePS style). In the
 * engine's layer: each endpoint is a communicator with an engine of its own.
 *
 * One communicator has one executor, and a server's loop holds its
 * executor until every worker has finished: a rank cannot serve and push
 * through the same communicator. So every rank opens two more endpoints,
 * a server's and a worker's, each its own communicator with its own
 * progress thread, and the two are wired crosswise into one job of 2N
 * virtual ranks: [0, N) are the ranks' server endpoints, [N, 2N) their
 * worker endpoints (rank r's are r and N + r). The parameter server then
 * runs on them exactly as on a job of N servers and N workers, its
 * protocol, placement and failure handling unchanged. The caller's
 * communicator stays the caller's: its collectives never meet the server's
 * traffic.
 *
 * Both share the caller's store (the store locks itself against the three
 * threads) for liveness: a rank lost there is lost as both its virtual
 * ranks (terse__comm_poll_lost, algos/comm/comm_vmap.c). Wire keys come from the caller's endpoint
 * (the same token secret; fresh nonces per endpoint).
 *
 * On shm an endpoint sends to a peer endpoint of its own process by
 * writing into that endpoint's memory: neither may close while the other
 * may still send, so a failure does not close them (terse__fabric_keep_open),
 * and ps_colocate.c stops both executors before it frees either. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "algos/comm/comm.h"
#include "algos/engine/engine.h"
#include "common/bytes.h"
#include "common/error.h"

#define NAME_BYTES 256
#define ENTRY (4 + NAME_BYTES) /* u32 length and the name */

static void free_twin(terse_comm *c) {
    if (!c) return;
    c->failed = 1; /* nothing was sent: no flush */
    terse__engine_shutdown(c);
    terse__comm_leave(c);
}

static terse_comm *new_twin(terse_comm *a, int rank) {
    terse_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->vmap = calloc(4 * (size_t)a->nranks, 1); /* comm_vmap.c */
    if (!c->vmap) {
        free(c);
        return NULL;
    }
    c->rank = rank;
    c->nranks = 2 * a->nranks;
    c->vreal = a->nranks;
    c->parent = a;
    c->store = a->store;
    c->pid = getpid();
    c->timeout_ms = a->timeout_ms;
    c->params = a->params;
    /* the server serves while the caller computes: a thread of its own
     * even under TERSE_PROGRESS=caller (which stays the caller's comm's) */
    c->params.progress_caller = 0;
    c->same_host = a->same_host;
    c->stats = (terse_comm_stats)TERSE_COMM_STATS_INIT;
    pthread_mutex_init(&c->stats_lock, NULL);
    pthread_mutex_init(&c->lock, NULL);
    return c;
}

terse_status terse__comm_colocate(terse_comm *a, terse_comm **srv, terse_comm **wrk) {
    *srv = *wrk = NULL;
    if (!a->store || a->nranks < 2)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "rank %d: colocated servers need a job of 2 ranks or more", a->rank);
    const int N = a->nranks;
    terse_comm *t[2] = {new_twin(a, a->rank), new_twin(a, N + a->rank)};
    const uint32_t gen = ++a->colo_gen;
    for (int i = 0; i < 2; i++)
        if (t[i]) t[i]->vgen = gen;
    terse_status s = TERSE_OK, local = TERSE_OK;
    char why[512] = "";
    uint8_t mine[2 * ENTRY] = {0};
    uint8_t *all = malloc((size_t)N * sizeof mine), *names = malloc(2 * (size_t)N * NAME_BYTES);
    if (!t[0] || !t[1] || !all || !names)
        local = TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: no memory for colocated endpoints", a->rank);
    for (int i = 0; i < 2 && local == TERSE_OK; i++) {
        /* the endpoint's own provider ("net", not a routed "shm+net": the
         * twins are not routed per host) */
        local = terse__fabric_open(terse__fabric_provider(a->fabric), a->same_host, t[i]->rank,
                                   2 * N, &t[i]->fabric);
        if (local != TERSE_OK) break;
        snprintf(t[i]->provider, sizeof t[i]->provider, "%s", terse__fabric_provider(t[i]->fabric));
        /* shm writes into a peer endpoint of this process directly: the
         * pair's endpoints close only together, at terse_comm_free */
        terse__fabric_keep_open(t[i]->fabric);
        size_t len = NAME_BYTES;
        local = terse__fabric_name(t[i]->fabric, mine + i * ENTRY + 4, &len);
        if (local == TERSE_OK) terse__put_u32(mine + i * ENTRY, (uint32_t)len);
    }
    if (local != TERSE_OK) {
        snprintf(why, sizeof why, "%s", terse_last_error());
        memset(mine, 0, sizeof mine); /* length 0: the others fail naming us */
    }
    if (!all) { /* cannot take part: the others time out in the exchange */
        s = local;
        goto out;
    }
    /* 1: every rank's two names (or its failure) */
    s = terse__store_allgather(a->store, mine, sizeof mine, all, a->timeout_ms);
    if (s != TERSE_OK) goto out;
    if (local != TERSE_OK) {
        terse__error_restore(why);
        s = local;
        goto out;
    }
    size_t len = terse__get_u32(mine);
    for (int r = 0; r < N && s == TERSE_OK; r++)
        for (int i = 0; i < 2 && s == TERSE_OK; i++) {
            const uint8_t *e = all + (size_t)r * sizeof mine + (size_t)i * ENTRY;
            if (terse__get_u32(e) != len)
                s = TERSE_ERROR(TERSE_ERR_TRANSPORT,
                                "rank %d: rank %d could not open its colocated parameter-server "
                                "endpoints (its own terse_ps_create says why)",
                                a->rank, r);
            else
                memcpy(names + ((size_t)i * (size_t)N + (size_t)r) * len, e + 4, len);
        }
    for (int i = 0; i < 2 && s == TERSE_OK; i++) s = terse__fabric_set_peers(t[i]->fabric, names, len);
    /* 2: wire keys, when the caller's endpoint has them: fresh nonces */
    int mac = a->wire_mac;
    uint8_t nonce[2 * TERSE__WIRE_NONCE] = {0}, ok = s == TERSE_OK;
    if (mac && s == TERSE_OK && RAND_bytes(nonce, sizeof nonce) != 1)
        s = TERSE_ERROR(TERSE_ERR_INTERNAL, "rank %d: the OpenSSL CSPRNG failed", a->rank);
    if (mac) {
        /* every rank takes part, failed or not, so that nobody waits */
        uint8_t *nall = malloc((size_t)N * sizeof nonce), *vn = malloc(2 * (size_t)N * TERSE__WIRE_NONCE);
        terse_status g = nall && vn ? terse__store_allgather(a->store, nonce, sizeof nonce, nall, a->timeout_ms)
                                    : TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: no memory", a->rank);
        if (s == TERSE_OK) s = g;
        for (int r = 0; s == TERSE_OK && r < N; r++)
            for (int i = 0; i < 2; i++)
                memcpy(vn + ((size_t)i * (size_t)N + (size_t)r) * TERSE__WIRE_NONCE,
                       nall + (size_t)r * sizeof nonce + (size_t)i * TERSE__WIRE_NONCE,
                       TERSE__WIRE_NONCE);
        for (int i = 0; i < 2 && s == TERSE_OK; i++) {
            s = terse__fabric_set_keys_from(t[i]->fabric, a->fabric, vn);
            t[i]->wire_mac = 1;
            memcpy(t[i]->wire_nonce, nonce + i * TERSE__WIRE_NONCE, TERSE__WIRE_NONCE);
        }
        OPENSSL_cleanse(nonce, sizeof nonce);
        free(nall);
        free(vn);
    }
    /* 3: everyone has inserted everyone (and says whether it got there) */
    ok = s == TERSE_OK;
    {
        terse_status g = terse__store_allgather(a->store, &ok, 1, all, a->timeout_ms);
        for (int r = 0; s == TERSE_OK && g == TERSE_OK && r < N; r++)
            if (!all[r])
                s = TERSE_ERROR(TERSE_ERR_TRANSPORT,
                                "rank %d: rank %d failed to set up its colocated parameter-server "
                                "endpoints (its own terse_ps_create says why)",
                                a->rank, r);
        if (s == TERSE_OK) s = g;
    }
    for (int i = 0; i < 2 && s == TERSE_OK; i++) s = terse__engine_init(t[i]);
out:
    free(all);
    free(names);
    if (s != TERSE_OK) {
        char keep[512];
        snprintf(keep, sizeof keep, "%s", terse_last_error());
        free_twin(t[0]);
        free_twin(t[1]);
        terse__error_restore(keep);
        return s;
    }
    *srv = t[0];
    *wrk = t[1];
    pthread_mutex_lock(&a->stats_lock);
    a->twin[0] = t[0];
    a->twin[1] = t[1];
    pthread_mutex_unlock(&a->stats_lock);
    return TERSE_OK;
}
