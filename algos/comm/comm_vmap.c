/* The lost and gone maps as a communicator's ranks see them: for a
 * colocated parameter server's endpoints (algos/engine/engine_twin.c) a job
 * of 2N virtual ranks over the caller's store of N, rank r's endpoints
 * being r and N + r, so a rank lost there is lost as both. */
#include <string.h>

#include "algos/comm/comm.h"

static terse_status map_virtual(terse_comm *c, int gone, const uint8_t **map) {
    *map = NULL;
    if (!c->store) return TERSE_OK;
    if (!c->parent)
        return gone ? terse__store_poll_gone(c->store, map) : terse__store_poll_lost(c->store, map);
    const int N = c->vreal;
    uint8_t *real = c->vmap + 2 * (size_t)N, *wgone = real + N;
    terse_status s = terse__store_copy_map(c->store, gone, real);
    for (int v = 0; v < 2 * N; v++) c->vmap[v] = real[v % N];
    /* A rank whose worker failed and gave up (terse__store_tell_worker_gone)
     * is lost as a worker (N + r), not as a server (r): its endpoint reads
     * nothing more, so it is gone for the close's flush too. An endpoint
     * closed after a clean run (terse__store_tell_endpoint_closed) is gone. */
    terse_status w = terse__store_copy_wgone(c->store, c->vgen, wgone);
    for (int r = 0; r < N; r++) {
        c->vmap[N + r] |= wgone[r] & 1;
        if (gone) { /* endpoints closed after a clean run: gone, not lost */
            c->vmap[r] |= (wgone[r] >> 1) & 1;
            c->vmap[N + r] |= (wgone[r] >> 2) & 1;
        }
    }
    *map = c->vmap;
    return s != TERSE_OK ? s : w;
}

terse_status terse__comm_poll_lost(terse_comm *c, const uint8_t **map) {
    return map_virtual(c, 0, map);
}
terse_status terse__comm_poll_gone(terse_comm *c, const uint8_t **map) {
    return map_virtual(c, 1, map);
}
