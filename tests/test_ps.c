/* The parameter server over real rank processes (shm and tcp;ofi_rxm):
 * sync against a float64 reference and bitwise across workers, quorum,
 * async and ssp bounds, placement, compression both ways, bad input, and
 * a worker or server killed. */
#include <math.h>
#include <signal.h>

#include "algos/ps.h"
#include "ranks.h"

/* What a job runs: servers serve, workers train. */
typedef struct ps_job {
    int servers;
    const char *mode;
    terse_ps_update update;
    float lr;
    size_t n;       /* floats per key */
    int keys;
    int steps;
    const char *push, *pull;
    size_t chunk_bytes;
    int victim;     /* a worker that SIGKILLs itself at victim_step, or -1 */
    int victim_step;
} ps_job;

/* Worker w's gradient at step t, element i: distinct per worker, exact in
 * float (small integers over a power of two). */
static float grad(int w, int t, size_t key, size_t i) {
    return (float)((int)((w * 7 + t * 3 + (int)key * 5 + (int)i) % 17) - 8) / 16.0f;
}

static int make_ps(terse_comm *c, tr_out *o, const ps_job *j, terse_ps **ps) {
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.num_servers = j->servers;
    cfg.update = j->update;
    cfg.lr = j->lr;
    if (j->chunk_bytes) cfg.chunk_bytes = j->chunk_bytes;
    TR_CALL(o, terse_ps_config_parse(j->mode, &cfg));
    TR_CALL(o, terse_ps_create(c, &cfg, ps));
    for (int k = 0; k < j->keys; k++) TR_CALL(o, terse_ps_declare(*ps, (size_t)k, j->n, j->push, j->pull, NULL));
    return 0;
}

/* Sync training: every worker pushpulls each key each step; the final
 * value of key 0 and a hash of every step's result are reported. */
static int sync_body(terse_comm *c, tr_out *o, const void *arg) {
    const ps_job *j = arg;
    terse_ps *ps = NULL;
    if (make_ps(c, o, j, &ps)) return 1;
    int rank = terse_comm_rank(c);
    if (terse_ps_is_server(ps)) {
        TR_CALL(o, terse_ps_serve(ps));
        terse_ps_stats st;
        memset(&st, 0, sizeof st);
        st.size = sizeof st;
        terse_ps_get_stats(ps, &st);
        o->u[0] = st.steps_closed;
        o->u[1] = st.pushes_applied;
        terse_ps_free(ps);
        return 0;
    }
    float *buf = malloc(j->n * sizeof(float));
    uint64_t h = 0;
    for (int t = 0; t < j->steps; t++) {
        for (int k = 0; k < j->keys; k++) {
            for (size_t i = 0; i < j->n; i++) buf[i] = grad(rank, t, (size_t)k, i);
            terse_request *r = NULL;
            TR_CALL(o, terse_ps_pushpull(ps, (size_t)k, buf, &r));
            terse_status s = terse_request_wait(r);
            terse_request_free(r);
            TR_CALL(o, s);
            h = h * 31 + tr_hash(buf, j->n * sizeof(float));
            if (k == 0 && t == j->steps - 1)
                for (size_t i = 0; i < j->n && i < TR_FLOATS; i++) o->f[i] = buf[i];
        }
        TR_CALL(o, terse_ps_clock(ps));
    }
    o->hash[0] = h;
    TR_CALL(o, terse_ps_finish(ps));
    terse_ps_free(ps);
    free(buf);
    return 0;
}

static void sync_dense(const char *prov, int servers, int workers) {
    ps_job j = {servers, "sync", TERSE_PS_UPDATE_NONE, 0, 3000, 3, 4, NULL, NULL, 4096, -1, 0};
    tr_job job = {prov, servers + workers, 20000, 60, -1, NULL};
    tr_out *o = tr_run(&job, sync_body, &j);
    int W = workers, last = j.steps - 1;
    for (size_t i = 0; i < j.n; i++) {
        double ref = 0;
        for (int w = servers; w < servers + W; w++) ref += grad(w, last, 0, i);
        ref /= W;
        cr_assert(fabs(o[servers].f[i] - ref) <= 1e-6, "element %zu: %g, reference %g", i,
                  (double)o[servers].f[i], ref);
    }
    for (int w = servers + 1; w < servers + W; w++)
        cr_assert_eq(o[w].hash[0], o[servers].hash[0], "worker %d's results differ bitwise", w);
    uint64_t closed = 0;
    for (int s = 0; s < servers; s++) closed += o[s].u[0];
    /* 3 keys of 3000 floats in 1024-float chunks: each key is on 1 or more servers. */
    cr_assert_geq(closed, (uint64_t)(j.keys * j.steps));
    tr_release(o);
}

Test(ps, sync_dense_tcp_1x2) { sync_dense("tcp", 1, 2); }
Test(ps, sync_dense_shm_2x2) { sync_dense("shm", 2, 2); }
