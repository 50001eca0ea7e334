/* The parameter server when ranks fail, over real rank processes: a
 * worker or server killed (SIGKILL) or stopped (SIGSTOP) fails the others
 * naming it, or the job goes on without it (async); with replicas
 * 2 a killed head's replica takes its slot over with the same bits, a
 * replacement process takes its slots back, and what replicas cannot hold
 * is refused. */
#include "ps_jobs.h"

/* ---------------------------------------------------------------- killed */

typedef struct kill_job {
    const char *mode;
    int servers, workers, victim, steps;
} kill_job;

/* A server victim dies mid-run: once every worker (ranks from up to to)
 * completed two steps, each marking u[7]; 20 ms between the workers' steps
 * leave the rest of the run (8 s) after it. */
typedef struct {
    const tr_out *all;
    int from, to;
} kill_when;

static void *die_mid_run(void *arg) {
    const kill_when *w = arg;
    for (int r = w->from; r < w->to; r++) ps_wait_mark(&w->all[r], &w->all[r].u[7]);
    raise(SIGKILL);
    return NULL;
}

/* Set by a test before its job (the ranks inherit it): the victim worker
 * dies right after starting its step-2 pushpull, its partitions on the
 * wire, rather than between requests. */
static int kill_mid_stream;

static int kill_body(terse_comm *c, tr_out *o, const void *arg) {
    const kill_job *k = arg;
    terse_ps *ps = NULL;
    if (sgd_ps(c, o, k->mode, k->servers, 0.1f, 4096, &ps)) return 1;
    int rank = terse_comm_rank(c);
    if (terse_ps_is_server(ps)) {
        if (rank == k->victim) {
            static kill_when when;
            when = (kill_when){o - rank, k->servers, k->servers + k->workers};
            tr_wait_all_ready(c, o);
            pthread_t t;
            pthread_create(&t, NULL, die_mid_run, &when);
        }
        terse_status s = terse_ps_serve(ps);
        o->u[5] = (uint64_t)s;
        snprintf(o->err, sizeof o->err, "%s", terse_last_error());
        terse_ps_free(ps);
        return 0;
    }
    float buf[QN];
    double t0 = tr_now_ms();
    for (int t = 0; t < k->steps; t++) {
        if (rank == k->victim && t == 2) {
            tr_wait_all_ready(c, o);
            if (kill_mid_stream) {
                for (size_t i = 0; i < QN; i++) buf[i] = grad(rank, t, 0, i);
                terse_request *r = NULL;
                if (terse_ps_pushpull(ps, 0, buf, &r) == TERSE_OK) usleep(500);
            }
            raise(SIGKILL);
        }
        for (size_t i = 0; i < QN; i++) buf[i] = grad(rank, t, 0, i);
        t0 = tr_now_ms();
        terse_status s = terse_ps_pushpull(ps, 0, buf, NULL);
        if (s != TERSE_OK) {
            o->val[0] = tr_now_ms() - t0;
            o->u[6] = (uint64_t)t;
            terse_ps_free(ps);
            return tr_fail(o, s, "pushpull");
        }
        TR_CALL(o, terse_ps_clock(ps));
        if (t == 1) ps_mark(&o->u[7]);
        if (k->victim < k->servers) usleep(20000); /* the server dies mid-run */
    }
    TR_CALL(o, terse_ps_finish(ps));
    terse_ps_free(ps);
    return 0;
}

/* A worker's body may fail (that is the point): run it with ranks.h, whose
 * assertion wants exit 0, by reporting failure through o only. */
static int kill_body_soft(terse_comm *c, tr_out *o, const void *arg) {
    kill_body(c, o, arg);
    return 0;
}

/* A worker whose transport the shm watchdog gave up on (a lock the rescue
 * could not release): TIMEOUT, the known limitation, reported. */
static int shm_lock_spun(const tr_out *o, int w) {
    if (o->status != TERSE_ERR_TIMEOUT || !strstr(o->err, TR_SHM_LOCK_SPIN)) return 0;
    fprintf(stderr, "WARNING: KNOWN LIMITATION: worker %d: %s\n", w, o->err);
    return 1;
}

/* Sync, worker 3 SIGKILLed at step 2: the other workers fail naming it,
 * and so does the server. Over shm, where a peer SIGKILLed mid-call can
 * leave a region lock taken (docs/collectives.md), the lock is released
 * and the loss reported as one, or the watchdog gives up (TIMEOUT); never
 * a hang. Over tcp, also the step and the time: before the timeout. */
static void sync_worker_killed(const char *prov) {
    const int shm = !strcmp(prov, "shm");
    kill_job k = {"sync", 1, 3, 3, 5};
    tr_job job = {prov, 4, 5000, 60, 3};
    tr_out *o = tr_run(&job, kill_body_soft, &k);
    for (int w = 1; w <= 2; w++) {
        if (shm && shm_lock_spun(&o[w], w)) continue;
        cr_assert_eq(o[w].status, TERSE_ERR_PEER_LOST, "worker %d: %s", w, o[w].err);
        cr_assert(strstr(o[w].err, "worker rank 3 was lost"), "worker %d: %s", w, o[w].err);
        if (shm) continue;
        /* mid-stream: step 2 may have closed on partitions the victim got out */
        if (kill_mid_stream)
            cr_assert(o[w].u[6] == 2 || o[w].u[6] == 3, "failed at step %llu",
                      (unsigned long long)o[w].u[6]);
        else
            cr_assert_eq(o[w].u[6], 2, "failed at step %llu", (unsigned long long)o[w].u[6]);
        cr_assert_lt(o[w].val[0], 5000.0, "took %.0f ms, beyond the timeout", o[w].val[0]);
    }
    if (!shm) cr_assert_eq(o[0].u[5], TERSE_ERR_PEER_LOST);
    tr_release(o);
}

/* Sync, 2 servers, server 1 SIGKILLed mid-run: the workers fail before
 * the timeout naming it (over tcp, and its slot); over shm, as above. */
static void server_killed(const char *prov) {
    const int shm = !strcmp(prov, "shm");
    kill_job k = {"sync", 2, 2, 1, 400};
    tr_job job = {prov, 4, 5000, 60, 1};
    tr_out *o = tr_run(&job, kill_body_soft, &k);
    for (int w = 2; w <= 3; w++) {
        if (shm && shm_lock_spun(&o[w], w)) continue;
        cr_assert(o[w].status == TERSE_ERR_PEER_LOST, "worker %d: %s", w, o[w].err);
        cr_assert(strstr(o[w].err, "rank 1"), "worker %d does not name server rank 1: %s", w,
                  o[w].err);
        cr_assert_lt(o[w].val[0], 5000.0, "took %.0f ms", o[w].val[0]);
        if (!shm)
            cr_assert(strstr(o[w].err, "the only server of slot 1"),
                      "worker %d does not name the slot: %s", w, o[w].err);
    }
    tr_release(o);
}

Test(ps, sync_worker_killed_fails_the_others_naming_it) { sync_worker_killed("tcp"); }
Test(ps, sync_worker_killed_shm) { sync_worker_killed("shm"); }
Test(ps, server_killed_fails_the_workers_naming_it) { server_killed("tcp"); }
/* The same with each key in partitions of one chunk (4 KiB), pipelined:
 * the server dies with partitions in flight, and a worker with its
 * pushpull's partitions on the wire. */
Test(ps, server_killed_with_partitions_in_flight_fails_the_workers_naming_it) {
    setenv("TERSE_PS_PARTITION_BYTES", "4096", 1);
    server_killed("tcp");
    unsetenv("TERSE_PS_PARTITION_BYTES");
}
Test(ps, sync_worker_killed_mid_partition_stream_fails_the_others_naming_it) {
    setenv("TERSE_PS_PARTITION_BYTES", "4096", 1);
    kill_mid_stream = 1;
    sync_worker_killed("tcp");
    kill_mid_stream = 0;
    unsetenv("TERSE_PS_PARTITION_BYTES");
}
Test(ps, server_killed_shm) { server_killed("shm"); }

Test(ps, async_goes_on_without_a_killed_worker) {
    kill_job k = {"async", 1, 3, 3, 12};
    tr_job job = {"tcp", 4, 5000, 60, 3};
    tr_out *o = tr_run(&job, kill_body_soft, &k);
    for (int w = 1; w <= 2; w++) cr_assert_eq(o[w].status, 0, "worker %d: %s", w, o[w].err);
    cr_assert_eq(o[0].u[5], TERSE_ERR_PEER_LOST, "serve: %s", o[0].err);
    tr_release(o);
}

/* Sync: a worker SIGSTOPped before its push holds the step open; the
 * other's pull fails with TERSE_ERR_TIMEOUT naming it (at 3/4 of the
 * timeout), and its communicator stays usable. It then kills the stopped
 * one, and the server ends naming it lost. */
static int stopped_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    tr_out *all = o - terse_comm_rank(c); /* ranks.h's outputs are one shared array */
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    terse_ps *ps = NULL;
    TR_CALL(o, terse_ps_create(c, &cfg, &ps));
    tr_say_ready(o);
    TR_CALL(o, terse_ps_declare(ps, 0, QN, NULL, NULL, NULL));
    int rank = terse_comm_rank(c);
    if (terse_ps_is_server(ps)) {
        o->u[5] = (uint64_t)terse_ps_serve(ps);
        snprintf(o->err, sizeof o->err, "%s", terse_last_error());
        terse_ps_free(ps);
        return 0;
    }
    float buf[QN];
    for (size_t i = 0; i < QN; i++) buf[i] = grad(rank, 0, 0, i);
    if (rank == 2) {
        tr_wait_all_ready(c, o); /* a stop inside another's create would time it out */
        all[2].u[9] = (uint64_t)getpid();
        ps_mark(&all[2].u[8]);
        raise(SIGSTOP);
    }
    ps_wait_mark(&all[2], &all[2].u[8]);
    double t0 = tr_now_ms();
    terse_status s = terse_ps_pushpull(ps, 0, buf, NULL);
    o->val[0] = tr_now_ms() - t0;
    o->u[0] = (uint64_t)s;
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    kill((pid_t)all[2].u[9], SIGKILL);
    o->u[1] = (uint64_t)terse_ps_finish(ps); /* still usable: a refusal fails one request */
    terse_ps_free(ps);
    return 0;
}

Test(ps, sync_stopped_worker_times_out_the_others_naming_it) {
    tr_job job = {"tcp", 3, 4000, 60, 2};
    tr_out *o = tr_run(&job, stopped_body, NULL);
    cr_assert_eq(o[1].u[0], TERSE_ERR_TIMEOUT, "worker 1: %s", o[1].err);
    cr_assert(strstr(o[1].err, "worker ranks 2"), "does not name the stopped worker: %s", o[1].err);
    cr_assert_lt(o[1].val[0], 4000.0, "took %.0f ms, beyond the timeout", o[1].val[0]);
    cr_assert_eq(o[1].u[1], TERSE_OK, "finish after the timeout: %s", o[1].err);
    cr_assert_eq(o[0].u[5], TERSE_ERR_PEER_LOST, "serve: %s", o[0].err);
    tr_release(o);
}

/* ---------------------------------------------------------------- replicas */

/* 2 servers, 3 workers, sync SGD with momentum; key 0 dense across both
 * servers, key 1 pushed through int8 with error feedback. Server rank 1
 * (the head of slot 1) may be SIGKILLed once it closed kill_at shard steps.
 * Every victim dies only once every rank is past its setup (ranks.h), and
 * the workers wait for the events the trials are about instead of timing
 * them: halfway through, for a replacement to have joined (it marks u[45]);
 * before their last step, for kill_at's victim to be dead (it marks u[44]
 * as it dies). */
#define FN 3000
#define FN1 600
#define FSTEPS 30

typedef struct fail_job {
    int replicas;
    int kill_at; /* SIGKILL server rank 1 once it closed this many shard steps (0: never) */
    int worker_dies; /* SIGKILL worker rank 4 at this step (0: never) */
    const char *mode;  /* NULL: sync */
    int nap_us;        /* workers' pause between steps (0: 4 ms) */
    int servers;       /* 0: 2 */
    int victim;        /* the server kill_at kills (0: rank 1) */
    int second;        /* a server SIGKILLed once its replica's replacement caught up and
                          acknowledged 3 more steps (0: none) */
    int third;         /* a server SIGKILLed as soon as it took a slot over (0: none) */
} fail_job;

static float fgrad(int w, int t, size_t i) {
    return sinf((float)(w * 131 + t * 17) * 0.37f + (float)i * 0.011f) * (float)(1 + w);
}

static void *die_at(void *arg) {
    tr_out *o = arg;
    const volatile uint64_t *closed = (const volatile uint64_t *)(uintptr_t)o->u[41];
    while (*closed < o->u[40]) usleep(100); /* the server's own count, read racily: a moment */
    o->val[0] = tr_now_ms(); /* the moment of death, for the recovery time */
    ps_mark(&o->u[44]);
    raise(SIGKILL);
    return NULL;
}

static int failover_body(terse_comm *c, tr_out *o, const void *arg);

/* A replacement: when its head instance got its slot back (val[3]). */
static void *watch_caught_up(void *arg) {
    tr_out *o = arg;
    const volatile uint64_t *psp = &o->u[42];
    while (!*psp) usleep(100);
    const volatile int *awaiting = &((terse_ps *)(uintptr_t)*psp)->awaiting;
    const volatile uint64_t *served = &o->u[43]; /* terse_ps_serve returned */
    while (*awaiting && !*served) usleep(50);
    o->val[3] = tr_now_ms();
    return NULL;
}

/* Set by a victim whose serving ended before its moment came (the job
 * failed first, e.g. on shm's lock): its die thread stops, and is joined,
 * before the parameter server it watches is freed. */
static volatile int die_cancel;

/* fail_job.third: die as soon as this server took its mirror's slot over. */
static void *die_on_takeover(void *arg) {
    terse_ps *ps = arg;
    while (!die_cancel && (!ps->mirror || !*(const volatile int *)&ps->mirror->promoted))
        usleep(100);
    if (!die_cancel) raise(SIGKILL);
    return NULL;
}

/* fail_job.second: die once this head's replica is a caught-up replacement. */
static void *die_after_catch_up(void *arg) {
    terse_ps *ps = arg;
    const volatile int *fresh = &ps->backup_fresh;
    const volatile uint64_t *acked = &ps->stats.replicated;
    while (!die_cancel && !*fresh) usleep(200);
    uint64_t from = *acked;
    while (!die_cancel && *acked < from + 3 + (uint64_t)ps->nkeys) usleep(200);
    if (!die_cancel) raise(SIGKILL);
    return NULL;
}

/* Failures go into o only (the trials sort them). */
static int failover_body_soft(terse_comm *c, tr_out *o, const void *arg) {
    failover_body(c, o, arg);
    return 0;
}

static int failover_body(terse_comm *c, tr_out *o, const void *arg) {
    const fail_job *j = arg;
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.num_servers = j->servers ? j->servers : 2;
    cfg.update = TERSE_PS_UPDATE_SGD;
    cfg.lr = 0.05f;
    cfg.momentum = 0.9f;
    cfg.chunk_bytes = 4096;
    if (j->mode) TR_CALL(o, terse_ps_config_parse(j->mode, &cfg));
    cfg.replicas = j->replicas;
    terse_ps *ps = NULL;
    TR_CALL(o, terse_ps_create(c, &cfg, &ps));
    TR_CALL(o, terse_ps_declare(ps, 0, FN, NULL, NULL, NULL));
    TR_CALL(o, terse_ps_declare(ps, 1, FN1, "int8:ef=1", NULL, NULL));
    tr_say_ready(o);
    int rank = terse_comm_rank(c);
    const int victim = j->victim ? j->victim : 1; /* kill_at's */
    if (terse_ps_is_server(ps)) {
        pthread_t watch, die_thread;
        int dying = 0;
        int watching = getenv("TR_REPLACEMENT") != NULL;
        o->val[2] = tr_now_ms(); /* a replacement: joined */
        if (watching) {
            ps_mark(&o->u[45]);
            pthread_create(&watch, NULL, watch_caught_up, (void *)o);
        }
        o->u[42] = (uint64_t)(uintptr_t)ps;
        if (!watching && ((j->third && rank == j->third) || (j->second && rank == j->second) ||
                          (j->kill_at && rank == victim)))
            tr_wait_all_ready(c, o);
        if (j->third && rank == j->third && !watching) {
            pthread_create(&die_thread, NULL, die_on_takeover, ps);
            dying = 1;
        }
        if (j->second && rank == j->second && !watching) {
            pthread_create(&die_thread, NULL, die_after_catch_up, ps);
            dying = 1;
        }
        if (rank == victim && j->kill_at && !watching) {
            pthread_t t;
            o->u[40] = (uint64_t)j->kill_at;
            o->u[41] = (uint64_t)(uintptr_t)&ps->stats.steps_closed;
            pthread_create(&t, NULL, die_at, o);
        }
        terse_status s = terse_ps_serve(ps);
        ps_mark(&o->u[43]);
        if (watching) pthread_join(watch, NULL);
        if (dying) { /* still alive: the moment never came */
            die_cancel = 1;
            pthread_join(die_thread, NULL);
        }
        o->u[5] = (uint64_t)s;
        snprintf(o->err, sizeof o->err, "%s", terse_last_error());
        if (s != TERSE_OK) fprintf(stderr, "server rank %d: %s\n", rank, o->err);
        terse_ps_stats st = ps_stats_of(ps);
        o->u[0] = st.replicated, o->u[1] = st.takeovers, o->u[2] = st.duplicates;
        o->u[3] = st.steps_closed;
        o->val[1] = tr_now_ms(); /* serving ended */
        /* TR_HOLD_STORE: rank 0 keeps the bootstrap store up until the
         * replacement's serve returned (its output follows the job's ranks),
         * so that a job which fails fast cannot leave before the replacement
         * joins. Not through the store: with a rank lost for good, rank 0's
         * store refuses every request (it waited out its 20 s every time). */
        if (getenv("TR_HOLD_STORE") && rank == 0 && !watching) {
            const tr_out *rp = o - rank + terse_comm_size(c);
            ps_wait_mark(rp, &rp->u[43]);
        }
        terse_ps_free(ps);
        return 0;
    }
    static float x[FN], y[FN1];
    const tr_out *all = o - rank, *rp = all + terse_comm_size(c); /* rp: a replacement's */
    for (int t = 0; t < FSTEPS; t++) {
        if (rank == 4 && j->worker_dies && t == j->worker_dies) {
            tr_wait_all_ready(c, o);
            raise(SIGKILL);
        }
        if (t == FSTEPS / 2 && tr_replace_victim) ps_wait_mark(rp, &rp->u[45]);
        if (t == FSTEPS - 1 && j->kill_at) ps_wait_mark(&all[victim], &all[victim].u[44]);
        for (size_t i = 0; i < FN; i++) x[i] = fgrad(rank, t, i);
        for (size_t i = 0; i < FN1; i++) y[i] = fgrad(rank, t, i + FN);
        /* With a deadline the two servers of key 0 close its steps on their
         * own clocks, so a push can be late on one and ahead on the other:
         * a refusal there (STALE, INVALID) only means pull and go on. */
        const int refusals_ok = j->mode != NULL;
        terse_status s = terse_ps_pushpull(ps, 0, x, NULL);
        if (refusals_ok && (s == TERSE_ERR_STALE || s == TERSE_ERR_INVALID))
            s = terse_ps_pull(ps, 0, x, NULL);
        if (s == TERSE_OK) s = terse_ps_push(ps, 1, y, NULL);
        if (refusals_ok && (s == TERSE_ERR_STALE || s == TERSE_ERR_INVALID)) s = TERSE_OK;
        if (s == TERSE_OK) s = terse_ps_pull(ps, 1, y, NULL);
        if (s != TERSE_OK) {
            tr_fail(o, s, "step");
            terse_ps_free(ps); /* says goodbye to the servers */
            return 1;
        }
        o->val[10 + t] = tr_now_ms(); /* this step complete */
        TR_CALL(o, terse_ps_clock(ps));
        usleep(j->nap_us ? (useconds_t)j->nap_us : 4000);
    }
    memcpy(o->f, x, sizeof x);
    memcpy(o->f + FN, y, sizeof y);
    o->hash[0] = tr_hash(o->f, (FN + FN1) * sizeof(float));
    double f0 = tr_now_ms();
    TR_CALL(o, terse_ps_finish(ps));
    o->val[9] = tr_now_ms() - f0; /* the goodbyes */
    terse_ps_free(ps);
    return 0;
}

/* The same training, replicated or not, gives the same bits; every step a
 * head closes is acknowledged by its replica first. */
Test(ps, replicas_keep_each_closed_step_on_both_servers_and_change_no_bits) {
    fail_job one = {1, 0, 0, NULL, 0, 0, 0, 0, 0}, two = {2, 0, 0, NULL, 0, 0, 0, 0, 0};
    tr_job job = {"shm", 5, 20000, 60, -1};
    tr_out *a = tr_run(&job, failover_body, &one);
    tr_out *b = tr_run(&job, failover_body, &two);
    for (int w = 2; w < 5; w++) {
        cr_assert_eq(b[w].status, 0, "worker %d: %s", w, b[w].err);
        cr_assert_eq(a[w].hash[0], b[w].hash[0], "worker %d: replicas changed the result", w);
        cr_assert_eq(b[w].hash[0], b[2].hash[0], "workers differ");
    }
    for (int s = 0; s < 2; s++) {
        cr_assert_eq(a[s].u[0], 0, "replicated without replicas");
        cr_assert_geq(b[s].u[3], FSTEPS, "server %d closed %llu steps", s,
                      (unsigned long long)b[s].u[3]);
        cr_assert_eq(b[s].u[0], b[s].u[3], "server %d: %llu steps closed, %llu acknowledged", s,
                     (unsigned long long)b[s].u[3], (unsigned long long)b[s].u[0]);
    }
    tr_release(a);
    tr_release(b);
}

static int cmp_d(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* A kill trial on shm in which a survivor spun on the dead process's
 * shared-region lock (libfabric's, not terse's to fix: the watchdog fails
 * it with TIMEOUT, never wrong data): reported as the known limitation, and
 * 1 so the caller skips the trial. dead: the killed ranks (-1: none). */
static int lost_to_shm_lock(const char *prov, const tr_out *o, int nprocs, int dead1, int dead2,
                            int kill_at) {
    int spun = 0;
    for (int q = 0; q < nprocs; q++)
        spun |= q != dead1 && q != dead2 &&
                (!o[q].finished || strstr(o[q].err, TR_SHM_LOCK_SPIN) != NULL);
    if (strcmp(prov, "shm") != 0 || !spun) return 0;
    fprintf(stderr, "WARNING: KNOWN LIMITATION: kill after %d steps: a survivor spun on a dead "
                    "server's shm region lock until the watchdog gave up\n",
            kill_at);
    return 1;
}

/* SIGKILL the head of slot 1 at several moments of a run with replicas 2
 * (after k of its shard steps, k spread over the run): every worker
 * finishes, and with the same bits as the run nobody died in.
 * TERSE_FAILOVER_TRIALS sets the moments (2 here; the campaign runs 10);
 * prints the recovery time, kill to the next step a worker completed. */
static void failover(const char *prov) {
    fail_job ref = {2, 0, 0, NULL, 0, 0, 0, 0, 0};
    tr_job job = {prov, 5, 20000, 90, -1};
    tr_out *r = tr_run(&job, failover_body, &ref);
    cr_assert_eq(r[2].status, 0, "%s", r[2].err);
    uint64_t want = r[2].hash[0], steps = r[1].u[3]; /* server 1's shard steps in a whole run */
    tr_release(r);
    const char *env = getenv("TERSE_FAILOVER_TRIALS");
    int trials = env ? atoi(env) : 2;
    if (trials < 1 || trials > 100) trials = 2;
    double rec[100];
    int n = 0;
    if (!strcmp(prov, "tcp")) tr_known_segv = TR_RXM_TEARDOWN_SEGV;
    int spins = 0, done = 0;
    uint64_t dups = 0; /* resends the new head already had: answered, not applied again */
    /* a trial lost to shm's lock is run again, at the next moment (4 times at most):
     * a sanitized build spends longer inside the provider's lock, and lost both of
     * two trials once in CI */
    for (int k = 0; done < trials && k < trials + 4; k++) {
        /* from the first steps to the last ones */
        double at = ((k % trials) + 0.5 + 0.25 * (k / trials)) / trials;
        fail_job j = {2, 1 + (int)((double)(steps - 3) * (at < 1 ? at : 0.9)), 0, NULL, 0,
                      0, 0, 0, 0};
        tr_job kj = {prov, 5, 20000, 90, 1};
        tr_out *o = tr_run(&kj, failover_body_soft, &j);
        if (lost_to_shm_lock(prov, o, 5, 1, -1, j.kill_at)) {
            spins++;
            tr_release(o);
            continue;
        }
        double best = -1;
        if (o[0].finished)
            cr_assert_eq(o[0].u[5], TERSE_OK, "kill after %d steps, server 0: %s", j.kill_at,
                         o[0].err);
        for (int w = 2; w < 5; w++) {
            if (!o[w].finished) continue; /* rxm's teardown crash, reported */
            cr_assert_eq(o[w].status, 0, "kill after %d steps, worker %d: %s", j.kill_at, w,
                         o[w].err);
            cr_assert_eq(o[w].hash[0], want, "kill after %d steps: worker %d's parameters differ",
                         j.kill_at, w);
            for (int t = 0; t < FSTEPS; t++)
                if (o[w].val[10 + t] > o[1].val[0]) {
                    double d = o[w].val[10 + t] - o[1].val[0];
                    if (best < 0 || d < best) best = d;
                    break;
                }
        }
        if (o[0].finished) dups += o[0].u[2];
        if (o[0].finished) {
            cr_assert_eq(o[0].u[5], TERSE_OK, "server 0: %s", o[0].err);
            if (best >= 0) cr_assert_eq(o[0].u[1], 1, "server 0 took over %llu slots",
                                        (unsigned long long)o[0].u[1]);
        }
        if (best >= 0) rec[n++] = best;
        done++;
        tr_release(o);
    }
    tr_known_segv = NULL;
    if (n) {
        qsort(rec, (size_t)n, sizeof rec[0], cmp_d);
        fprintf(stderr, "failover %s: %d kills, %d bitwise equal (%d lost to shm's lock); "
                        "recovery (kill to the next step completed, in %d of them) min %.1f ms, "
                        "median %.1f ms, max %.1f ms; %llu resent pushes were duplicates\n",
                prov, done + spins, done, spins, n, rec[0], rec[n / 2], rec[n - 1],
                (unsigned long long)dups);
    }
    cr_assert_gt(done, 0, "%s: no kill trial completed (%d lost to shm's lock)", prov, spins);
}

Test(ps, a_killed_head_is_replaced_by_its_replica_with_the_same_bits_tcp) { failover("tcp"); }
/* With keys in partitions (4 KiB: 3 and 1 per key), which replicas 2 sends
 * one at a time per server, through the failover path. */
Test(ps, a_killed_head_with_keys_in_partitions_is_replaced_with_the_same_bits_tcp) {
    setenv("TERSE_PS_PARTITION_BYTES", "4096", 1);
    failover("tcp");
    unsetenv("TERSE_PS_PARTITION_BYTES");
}
Test(ps, a_killed_head_is_replaced_by_its_replica_with_the_same_bits_shm) { failover("shm"); }

/* A killed head's replacement (a new process, rejoin = 1) gets both its
 * slots back: slot 1 from server 0, which stood in, and its replica's place
 * for slot 0. The workers move back, and the result is bit for bit the run
 * nobody died in. Then the replacement itself is killed... no: it serves
 * to the end, closes steps and replicates them to server 0. */
/* For the job over hosts: each process's TERSE_HOST (index nranks: the
 * replacement), set before its init. */
static const char *const *ps_hosts;
static void set_ps_host(int r, const void *arg) {
    (void)arg;
    setenv("TERSE_HOST", ps_hosts[r], 1);
}

static void replacement_on(const char *prov, const char *const *hosts);
static void replacement(const char *prov) { replacement_on(prov, NULL); }

static void replacement_on(const char *prov, const char *const *hosts) {
    ps_hosts = hosts;
    tr_before_init = hosts ? set_ps_host : NULL;
    fail_job ref = {2, 0, 0, NULL, 12000, 0, 0, 0, 0};
    tr_job job = {prov, 5, 20000, 90, -1};
    tr_out *r = tr_run(&job, failover_body, &ref);
    cr_assert_eq(r[2].status, 0, "%s", r[2].err);
    uint64_t want = r[2].hash[0];
    tr_release(r);
    const char *env = getenv("TERSE_REPLACE_TRIALS");
    int trials = env ? atoi(env) : 1;
    if (trials < 1 || trials > 50) trials = 1;
    double join[50], back[50], total[50];
    int n = 0, spins = 0;
    /* a trial lost to shm's lock is run again (3 times at most) */
    for (int k = 0; n < trials && k < trials + 3; k++) {
        if (!strcmp(prov, "tcp")) tr_known_segv = TR_RXM_TEARDOWN_SEGV;
        /* the workers wait halfway for the replacement (a new process,
         * 0.1-0.5 s to join) to have joined; 40 ms between steps leave it
         * the second half of the run (0.6 s) to get its slots back */
        fail_job j = {2, 2 + k % 6, 0, NULL, 40000, 0, 0, 0, 0};
        tr_job kj = {prov, 5, 20000, 60, 1};
        tr_replace_victim = 1;
        tr_out *o = tr_run(&kj, failover_body_soft, &j);
        tr_replace_victim = 0;
        tr_known_segv = NULL;
        if (lost_to_shm_lock(prov, o, 6, 1, -1, j.kill_at)) {
            spins++;
            tr_release(o);
            continue;
        }
        for (int w = 2; w < 5; w++) {
            if (!o[w].finished) continue; /* rxm's teardown crash, reported */
            cr_assert_eq(o[w].status, 0, "kill after %d: worker %d: %s", j.kill_at, w, o[w].err);
            cr_assert_eq(o[w].hash[0], want, "kill after %d: worker %d's parameters differ "
                                             "from the run without the kill", j.kill_at, w);
        }
        tr_out *rp = &o[5]; /* the replacement */
        cr_assert(rp->finished, "the replacement did not finish: %s", rp->err);
        cr_assert_eq(rp->u[5], TERSE_OK, "the replacement's serve: %s", rp->err);
        cr_assert_gt(rp->u[3], 0, "the replacement closed no step (it never got its slot back)");
        cr_assert_eq(rp->u[0], rp->u[3], "the replacement closed %llu steps, its replica "
                                         "acknowledged %llu", (unsigned long long)rp->u[3],
                     (unsigned long long)rp->u[0]);
        cr_assert_eq(o[0].u[5], TERSE_OK, "server 0: %s", o[0].err);
        join[n] = rp->val[2] - o[1].val[0];
        back[n] = rp->val[3] - rp->val[2];
        total[n++] = rp->val[3] - o[1].val[0];
        tr_release(o);
    }
    cr_assert_gt(n, 0, "%s: no replacement trial completed (%d lost to shm's lock)", prov, spins);
    qsort(join, (size_t)n, sizeof join[0], cmp_d);
    qsort(back, (size_t)n, sizeof back[0], cmp_d);
    qsort(total, (size_t)n, sizeof total[0], cmp_d);
    fprintf(stderr, "replacement %s: %d kills, %d bitwise equal (%d lost to shm's lock); kill to the replacement "
                    "joined (its process started by the test): min %.1f / median %.1f / max "
                    "%.1f ms; joined to slot back: %.1f / %.1f / %.1f ms; kill to slot back: "
                    "%.1f / %.1f / %.1f ms\n",
            prov, n + spins, n, spins, join[0], join[n / 2], join[n - 1], back[0], back[n / 2],
            back[n - 1], total[0], total[n / 2], total[n - 1]);
}

/* Three servers. Server 2 dies (the head of slot 2, the replica of slot
 * 1); its replacement takes slot 2 back from server 0 and catches up as
 * slot 1's replica; then (second) server 1 dies, and the replacement takes
 * slot 1 over too. Same bits as the run nobody died in. Without the second
 * death, the end of serving is the test: server 1's last roster to the
 * replacement races the workers' goodbyes to it (which once hung them). */
static void three_servers(const char *prov, int second) {
    fail_job ref = {2, 0, 0, NULL, 15000, 3, 0, 0, 0};
    tr_job job = {prov, 6, 20000, 90, -1};
    tr_out *r = tr_run(&job, failover_body, &ref);
    cr_assert_eq(r[3].status, 0, "%s", r[3].err);
    uint64_t want = r[3].hash[0];
    tr_release(r);
    if (!strcmp(prov, "tcp")) tr_known_segv = TR_RXM_TEARDOWN_SEGV;
    fail_job j = {2, 3, 0, NULL, 40000, 3, 2, second ? 1 : 0, 0};
    tr_job kj = {prov, 6, 20000, 60, 2};
    tr_replace_victim = 1;
    tr_victim2 = second ? 1 : 0;
    tr_out *o = tr_run(&kj, failover_body_soft, &j);
    tr_replace_victim = 0;
    tr_victim2 = 0;
    tr_known_segv = NULL;
    if (lost_to_shm_lock(prov, o, 7, second ? 1 : -1, 2, j.kill_at)) {
        tr_release(o);
        return;
    }
    for (int w = 3; w < 6; w++) {
        if (!o[w].finished) continue; /* rxm's teardown crash, reported */
        cr_assert_eq(o[w].status, 0, "worker %d: %s", w, o[w].err);
        cr_assert_eq(o[w].hash[0], want, "worker %d's parameters differ from the run without "
                                         "the kills", w);
    }
    tr_out *rp = &o[6];
    cr_assert(rp->finished, "the replacement did not finish: %s", rp->err);
    cr_assert_eq(rp->u[5], TERSE_OK, "the replacement's serve: %s", rp->err);
    cr_assert_eq(rp->u[1], (uint64_t)second, "the replacement took %llu slots over",
                 (unsigned long long)rp->u[1]);
    /* nobody waits for a goodbye's answer (the margin scales with the
     * machine's load: plain_slack_ms) */
    for (int w = 3; w < 6 && !second; w++)
        cr_assert_lt(o[w].val[9], plain_slack_ms(1500), "worker %d's terse_ps_finish took %.0f ms",
                     w, o[w].val[9]);
    cr_assert_eq(o[0].u[5], TERSE_OK, "server 0: %s", o[0].err);
    tr_release(o);
}

Test(ps, a_replacement_catches_up_as_a_replica_and_takes_over_when_its_head_dies_tcp) {
    three_servers("tcp", 1);
}
Test(ps, a_replacement_catches_up_as_a_replica_and_takes_over_when_its_head_dies_shm) {
    three_servers("shm", 1);
}
Test(ps, a_replacement_replica_ends_serving_with_everyone_else_tcp) { three_servers("tcp", 0); }

/* Three servers: server 1 dies, server 2 takes slot 1 over and dies too;
 * then server 1's replacement joins. Slot 1 is lost: the replacement ends
 * at once with TERSE_ERR_PEER_LOST saying so (it does not wait for a slot
 * that cannot come back), and the workers fail naming the slot. */
Test(ps, a_replacement_whose_slot_died_with_its_stand_in_says_so_at_once) {
    fail_job j = {2, 3, 0, NULL, 40000, 3, 1, 0, 2};
    tr_job kj = {"tcp", 6, 20000, 60, 1};
    tr_known_segv = TR_RXM_TEARDOWN_SEGV;
    tr_replace_victim = 1;
    tr_victim2 = 2;
    /* over net the job fails fast enough that rank 0, the store, was seen
     * to leave before the replacement joined (fresh-clone CI, 2026-12-03) */
    setenv("TR_HOLD_STORE", "1", 1);
    tr_out *o = tr_run(&kj, failover_body_soft, &j);
    unsetenv("TR_HOLD_STORE");
    tr_replace_victim = 0;
    tr_victim2 = 0;
    tr_known_segv = NULL;
    tr_out *rp = &o[6];
    cr_assert(rp->finished, "the replacement did not finish: %s", rp->err);
    cr_assert_eq(rp->u[5], TERSE_ERR_PEER_LOST, "the replacement's serve: %s", rp->err);
    cr_assert(strstr(rp->err, "slot 1 is lost: server rank 2, which stood in for it, died before "
                              "handing it back"), "%s", rp->err);
    cr_assert_lt(rp->val[1] - rp->val[2], 5000.0, "the replacement took %.0f ms to give up",
                 rp->val[1] - rp->val[2]);
    /* The first worker to fail names the slot; the others may fail first
     * on its loss (sync mode without a quorum cannot go on without it). */
    int named = 0, seen = 0;
    for (int w = 3; w < 6; w++) {
        if (!o[w].finished) continue; /* rxm's teardown crash, reported */
        seen++;
        cr_assert_eq(o[w].status, TERSE_ERR_PEER_LOST, "worker %d: %s", w, o[w].err);
        named += strstr(o[w].err, "slot 1") != NULL;
    }
    cr_assert(!seen || named, "no worker names slot 1 (%s)", o[3].err);
    tr_release(o);
}

/* A replacement can only serve a parameter server with replicas 2: its
 * collectives and a worker's terse_ps_create are refused with a sentence.
 * Rank 2 dies after init; rank 0 (the store) waits for the replacement to
 * say it is done. */
static int rejoin_refusals_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    int rank = terse_comm_rank(c);
    if (getenv("TR_REPLACEMENT")) {
        float x[4] = {1, 2, 3, 4};
        o->u[0] = (uint64_t)terse_allreduce(c, x, 4, NULL, TERSE_OP_SUM);
        snprintf(o->err, sizeof o->err, "%s", terse_last_error());
        terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
        cfg.num_servers = 1;
        terse_ps *ps = NULL;
        o->u[1] = (uint64_t)terse_ps_create(c, &cfg, &ps);
        snprintf((char *)o->f, 512, "%s", terse_last_error());
        TR_CALL(o, terse__store_set(c->store, "replacement/done", "1", 2));
        return 0;
    }
    /* rank 2 dies once the others' terse_comm_init returned (a rank 1
     * whose init failed would exit without a goodbye, lost for good) */
    tr_say_ready(o);
    if (rank == 2) {
        tr_wait_all_ready(c, o);
        raise(SIGKILL);
    }
    if (rank == 1) return 0;
    for (int i = 0; i < 2000; i++) { /* 20 s at most */
        const uint8_t *lost = NULL;
        (void)terse__store_poll_lost(c->store, &lost);
        char v[4];
        size_t len = sizeof v;
        if (terse__store_get(c->store, "replacement/done", v, &len, 10) == TERSE_OK) return 0;
        usleep(10000);
    }
    return tr_fail(o, TERSE_ERR_TIMEOUT, "waiting for the replacement");
}

Test(ps, a_replacement_serves_a_replicated_parameter_server_and_nothing_else) {
    tr_job job = {"tcp", 3, 20000, 60, 2};
    tr_replace_victim = 1;
    tr_out *o = tr_run(&job, rejoin_refusals_body, NULL);
    tr_replace_victim = 0;
    cr_assert_eq(o[3].status, 0, "%s", o[3].err);
    cr_expect_eq(o[3].u[0], TERSE_ERR_INVALID, "a replacement's allreduce: %s", o[3].err);
    cr_expect(strstr(o[3].err, "rejoined a running job as a lost rank's replacement"), "%s",
              o[3].err);
    cr_expect_eq(o[3].u[1], TERSE_ERR_INVALID, "a replacement worker's terse_ps_create: %s",
                 (const char *)o[3].f);
    cr_expect(strstr((const char *)o[3].f, "only a server of a parameter server with replicas 2"),
              "%s", (const char *)o[3].f);
    tr_release(o);
}

Test(ps, a_killed_heads_replacement_takes_its_slots_back_with_the_same_bits_tcp) {
    replacement("tcp");
}
Test(ps, a_killed_heads_replacement_takes_its_slots_back_with_the_same_bits_shm) {
    replacement("shm");
}
/* Over two hosts (shm inside, tcp between): server 1, on host b with
 * worker 3, dies; its replacement starts on host b again, or on a third
 * host c (the others reach it through the network either way). */
Test(ps, a_replacement_on_the_dead_ranks_host_takes_its_slots_back_over_hosts) {
    static const char *const hosts[] = {"a", "b", "a", "b", "a", "b"};
    replacement_on("tcp", hosts);
    tr_before_init = NULL;
}
Test(ps, a_replacement_on_another_host_takes_its_slots_back_over_hosts) {
    static const char *const hosts[] = {"a", "b", "a", "b", "a", "c"};
    replacement_on("tcp", hosts);
    tr_before_init = NULL;
}

/* Steps that close on a short deadline while the workers are away (empty
 * steps, one after another): a head never starts replicating a step
 * before the last one is acknowledged, so every step it closed is
 * acknowledged and the replica never gets one it was not sent. */
Test(ps, replicas_with_a_deadline_replicate_every_step_in_order) {
    fail_job j = {2, 0, 0, "sync:deadline_ms=5", 30000, 0, 0, 0, 0};
    tr_job job = {"shm", 5, 20000, 60, -1};
    tr_out *o = tr_run(&job, failover_body, &j);
    for (int s = 0; s < 2; s++) {
        cr_assert_eq(o[s].u[5], TERSE_OK, "server %d: %s", s, o[s].err);
        cr_assert_gt(o[s].u[3], FSTEPS, "server %d: %llu steps closed, expected empty ones too",
                     s, (unsigned long long)o[s].u[3]);
        /* every step a worker pulled was acknowledged; one per key, closed
         * by its deadline after the last pull, may still be on its way when
         * serving ends (2 keys) */
        cr_assert(o[s].u[0] <= o[s].u[3] && o[s].u[3] - o[s].u[0] <= 2,
                  "server %d: %llu closed, %llu acknowledged", s, (unsigned long long)o[s].u[3],
                  (unsigned long long)o[s].u[0]);
    }
    tr_release(o);
}

/* A worker killed under replicas: both instances of every server learn
 * it, the surviving workers fail naming it (sync without a quorum), and
 * serving ends instead of waiting for the dead worker's goodbye. */
Test(ps, replicas_a_killed_worker_ends_serving_on_both_instances) {
    fail_job j = {2, 0, 5, NULL, 0, 0, 0, 0, 0};
    tr_job job = {"tcp", 5, 5000, 60, 4};
    tr_known_segv = TR_RXM_TEARDOWN_SEGV;
    tr_out *o = tr_run(&job, failover_body_soft, &j);
    tr_known_segv = NULL;
    for (int s = 0; s < 2; s++) {
        if (!o[s].finished) continue; /* rxm's teardown crash, reported */
        cr_assert_eq(o[s].u[5], TERSE_ERR_PEER_LOST, "server %d: %s", s, o[s].err);
        cr_assert(strstr(o[s].err, "worker rank 4 was lost"), "server %d: %s", s, o[s].err);
    }
    for (int w = 2; w < 4; w++) {
        if (!o[w].finished) continue;
        cr_assert_eq(o[w].status, TERSE_ERR_PEER_LOST, "worker %d: %s", w, o[w].err);
        cr_assert(strstr(o[w].err, "worker rank 4"), "worker %d: %s", w, o[w].err);
    }
    tr_release(o);
}

/* A replica that stops (SIGSTOP) is dropped by its head after half the
 * timeout and told so; if the head dies later, the stale replica does not
 * take over, and the worker's request fails naming the slot. Rank 2 (the
 * one worker) stops, resumes and kills the servers, whose pids the ranks
 * publish in the shared outputs; it waits for what each step needs, not
 * for time: the replica (rank 0) marks u[51] once it read its head's
 * message, u[52] once it learned of its head's death. */
typedef struct {
    terse_ps *ps;
    tr_out *o;
    volatile int served;
} replica_watch;

static void *watch_replica(void *arg) {
    replica_watch *w = arg;
    if (!w->ps->mirror) return NULL; /* no replica here: the worker's wait says so */
    const volatile int *abandoned = &w->ps->mirror->abandoned, *promoted = &w->ps->mirror->promoted;
    while (!w->served && !*abandoned) usleep(200);
    if (*abandoned) ps_mark(&w->o->u[51]);
    while (!w->served && !*promoted) usleep(200);
    if (*promoted) ps_mark(&w->o->u[52]);
    return NULL;
}

static int abandon_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    int rank = terse_comm_rank(c);
    o->u[50] = (uint64_t)getpid();
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.num_servers = 2;
    cfg.chunk_bytes = 4096;
    cfg.replicas = 2;
    terse_ps *ps = NULL;
    TR_CALL(o, terse_ps_create(c, &cfg, &ps));
    /* one chunk each, until one lands on server 1: key kk, whose head is
     * the victim (rank 0 hosts the store) */
    const int h = 1, r = 0;
    size_t kk = 0;
    for (size_t k = 0; k < 16; k++) {
        TR_CALL(o, terse_ps_declare(ps, k, 256, NULL, NULL, NULL));
        if (terse_ps_chunk_server(ps, k, 0) == h) {
            kk = k;
            break;
        }
    }
    if (terse_ps_chunk_server(ps, kk, 0) != h) return tr_fail(o, TERSE_ERR_INTERNAL, "placement");
    tr_say_ready(o);
    if (terse_ps_is_server(ps)) {
        static replica_watch w;
        pthread_t watch;
        w = (replica_watch){ps, o, 0};
        if (rank == r) pthread_create(&watch, NULL, watch_replica, &w);
        o->u[5] = (uint64_t)terse_ps_serve(ps);
        snprintf(o->err, sizeof o->err, "%s", terse_last_error());
        w.served = 1;
        if (rank == r) pthread_join(watch, NULL);
        terse_ps_free(ps);
        return 0;
    }
    const tr_out *all = o - rank;
    tr_wait_all_ready(c, o); /* and so every pid is published */
    float x[256];
    terse_status s = TERSE_OK;
    for (int t = 0; t < 5 && s == TERSE_OK; t++) {
        if (t == 2) kill((pid_t)all[r].u[50], SIGSTOP);
        if (t == 3) {
            kill((pid_t)all[r].u[50], SIGCONT);
            ps_wait_mark(&all[r], &all[r].u[51]); /* it read its head's message */
        }
        if (t == 4) {
            kill((pid_t)all[h].u[50], SIGKILL);
            ps_wait_mark(&all[r], &all[r].u[52]); /* the replica learned of it */
            const uint8_t *lost = NULL; /* and so did this rank: the store's notice */
            for (double until = tr_now_ms() + 120000; (!lost || !lost[h]) && tr_now_ms() < until;
                 usleep(1000))
                if (terse__store_poll_lost(c->store, &lost) != TERSE_OK) break;
        }
        for (int i = 0; i < 256; i++) x[i] = (float)(t + i);
        double t0 = tr_now_ms();
        s = terse_ps_pushpull(ps, kk, x, NULL); /* the other key, never pushed, stays at 0 */
        o->val[t] = tr_now_ms() - t0;
        o->u[10 + t] = (uint64_t)s;
        if (s == TERSE_OK) s = terse_ps_clock(ps);
    }
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    terse_ps_free(ps);
    return 0;
}

Test(ps, a_replica_its_head_gave_up_on_does_not_take_over) {
    const int h = 1;
    tr_job job = {"tcp", 3, 2000, 60, h};
    tr_known_segv = TR_RXM_TEARDOWN_SEGV;
    tr_out *o = tr_run(&job, abandon_body, NULL);
    tr_known_segv = NULL;
    cr_assert_eq(o[2].status, 0, "%s", o[2].err);
    for (int t = 0; t < 4; t++) cr_assert_eq(o[2].u[10 + t], TERSE_OK, "step %d: %s", t, o[2].err);
    cr_assert(o[2].val[2] >= 900, "the step with the replica stopped took %.0f ms: the head "
                                  "should have waited half the 2 s timeout for its ack",
              o[2].val[2]);
    cr_assert_eq(o[2].u[14], TERSE_ERR_PEER_LOST, "after the head's death: %s", o[2].err);
    char want[64];
    snprintf(want, sizeof want, "slot %d is lost", h);
    cr_assert(strstr(o[2].err, want), "%s", o[2].err);
    tr_release(o);
}

static int replica_refusals_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const char *specs[] = {"sync:replicas=3", "async:replicas=2", "sync:replicas=0"};
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    for (int i = 0; i < 3; i++) o->u[i] = (uint64_t)terse_ps_config_parse(specs[i], &cfg);
    cfg = (terse_ps_config)TERSE_PS_CONFIG_INIT;
    cfg.replicas = 3;
    terse_ps *ps = NULL;
    o->u[3] = (uint64_t)terse_ps_create(c, &cfg, &ps);
    cfg.replicas = 2; /* one server */
    o->u[4] = (uint64_t)terse_ps_create(c, &cfg, &ps);
    o->u[9] = strstr(terse_last_error(), "2 or more servers") != NULL;
    cfg.num_servers = 2;
    TR_CALL(o, terse_ps_create(c, &cfg, &ps));
    o->u[5] = (uint64_t)terse_ps_declare(ps, 0, 100, NULL, "int8:ef=1", NULL);
    TR_CALL(o, terse_ps_declare(ps, 0, 100, NULL, NULL, NULL));
    if (terse_ps_is_server(ps)) {
        o->u[6] = (uint64_t)terse_ps_serve(ps);
        snprintf(o->err, sizeof o->err, "%s", terse_last_error());
        terse_ps_free(ps);
        return 0;
    }
    /* A worker that lies about failover: epoch 1 to a live head, and a
     * pull asked of slot 0's replica while its head lives. */
    int s = terse_ps_chunk_server(ps, 0, 0);
    terse__ps_hdr h = {TERSE__PS_PULL, 0, 1, 0, 0, ps->keys[0]->srv_floats[s],
                       ps->keys[0]->decl_hash, 1.0f, 1, 0, 0};
    terse__ps_rep rep;
    memset(&rep, 0, sizeof rep);
    TR_CALL(o, terse__ps_test_raw(ps, s, &h, NULL, 0, &rep));
    o->u[7] = (uint64_t)rep.status;
    snprintf(o->err, sizeof o->err, "%s", rep.text);
    h.epoch = 1;
    double t0 = tr_now_ms();
    TR_CALL(o, terse__ps_test_raw_replica(ps, s, &h, NULL, 0, &rep));
    o->val[0] = tr_now_ms() - t0;
    o->u[8] = (uint64_t)rep.status;
    snprintf(o->err + strlen(o->err), sizeof o->err - strlen(o->err), " | %s", rep.text);
    terse_ps_free(ps); /* finishes with both servers and the replicas */
    return 0;
}

/* The replica holds the request for 3/4 of the timeout before it refuses
 * it: with a 4 s timeout the refusal (at 3 s) has a whole second before
 * the worker's own timeout to arrive (500 ms with 2 s). */
Test(ps, replicas_refuse_what_they_cannot_hold) {
    tr_job job = {"shm", 3, 4000, 60, -1};
    tr_out *o = tr_run(&job, replica_refusals_body, NULL);
    cr_assert_eq(o[2].u[7], TERSE_ERR_INVALID, "epoch 1 to a live head: %s", o[2].err);
    cr_assert(strstr(o[2].err, "is the slot's head (epoch 0)"), "%s", o[2].err);
    cr_assert_eq(o[2].u[8], TERSE_ERR_INVALID, "a replica served while its head lives: %s",
                 o[2].err);
    cr_assert(strstr(o[2].err, "was not lost: send it there"), "%s", o[2].err);
    cr_assert(o[2].val[0] >= 2000 && o[2].val[0] < 4000, "held for %.0f ms (3/4 of 4000)",
              o[2].val[0]);
    for (int r = 0; r < 2; r++) cr_assert_eq(o[r].u[6], TERSE_OK, "server %d: %s", r, o[r].err);
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(o[r].u[0], TERSE_ERR_INVALID, "replicas=3 parses");
        cr_assert_eq(o[r].u[1], TERSE_ERR_INVALID, "async takes replicas");
        cr_assert_eq(o[r].u[2], TERSE_ERR_INVALID, "replicas=0 parses");
        cr_assert_eq(o[r].u[3], TERSE_ERR_UNSUPPORTED, "replicas 3 created");
        cr_assert_eq(o[r].u[4], TERSE_ERR_INVALID, "replicas 2 on one server created");
        cr_assert(o[r].u[9], "rank %d: the sentence does not say why", r);
        cr_assert_eq(o[r].u[5], TERSE_ERR_UNSUPPORTED, "a stateful pull codec with replicas");
    }
    tr_release(o);
}
