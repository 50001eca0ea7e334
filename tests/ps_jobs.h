/* What the parameter-server tests over real rank processes share
 * (test_ps.c, test_ps_rounds.c, test_ps_robust.c, test_ps_failover.c):
 * the workers' gradients, an SGD server's setup, a rank's statistics, and
 * marks one rank sets in its output for another to wait on. Header-only
 * (static functions), like ranks.h. */
#ifndef TERSE_TESTS_PS_JOBS_H
#define TERSE_TESTS_PS_JOBS_H

#include <math.h>
#include <pthread.h>
#include <signal.h>

#include "algos/ps/ps.h"
#include "ranks.h"

/* The floats of the one key most jobs declare. */
#define QN 2000

/* Worker w's gradient at step t, element i: distinct per worker, exact in
 * float (small integers over a power of two). */
static inline float grad(int w, int t, size_t key, size_t i) {
    return (float)((int)((w * 7 + t * 3 + (int)key * 5 + (int)i) % 17) - 8) / 16.0f;
}

/* One key of QN floats on servers that run SGD at lr, in mode (chunk_bytes
 * 0: the default); the rank says it is ready (ranks.h) once created. */
static inline int sgd_ps(terse_comm *c, tr_out *o, const char *mode, int servers, float lr,
                         size_t chunk_bytes, terse_ps **ps) {
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.num_servers = servers;
    cfg.update = TERSE_PS_UPDATE_SGD;
    cfg.lr = lr;
    cfg.chunk_bytes = chunk_bytes;
    TR_CALL(o, terse_ps_config_parse(mode, &cfg));
    TR_CALL(o, terse_ps_create(c, &cfg, ps));
    tr_say_ready(o);
    TR_CALL(o, terse_ps_declare(*ps, 0, QN, NULL, NULL, NULL));
    return 0;
}

/* A rank's parameter-server statistics. */
static inline terse_ps_stats ps_stats_of(terse_ps *ps) {
    terse_ps_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    terse_ps_get_stats(ps, &st);
    return st;
}

/* An event one rank waits for, instead of sleeping until it has probably
 * happened: the rank it concerns sets a slot of its output (ranks.h's
 * outputs are one shared array), and the waiter waits for that slot, or
 * for that rank to have failed or finished (a failure is then reported as
 * itself). The 120 s bound is only for a rank that crashed and marks
 * nothing, as in tr_wait_all_ready. */
static inline void ps_mark(uint64_t *slot) { __atomic_store_n(slot, 1, __ATOMIC_RELEASE); }
static inline void ps_wait_mark(const tr_out *who, const uint64_t *slot) {
    const double until = tr_now_ms() + 120000;
    while (!__atomic_load_n(slot, __ATOMIC_ACQUIRE) &&
           !__atomic_load_n(&who->status, __ATOMIC_ACQUIRE) &&
           !__atomic_load_n(&who->finished, __ATOMIC_ACQUIRE) && tr_now_ms() < until)
        usleep(1000);
}

#endif
