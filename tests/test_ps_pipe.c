/* The parameter server's partitions on the wire (algos/ps/ps_pipe.c):
 * pipelined partitions give the serial path's bits whatever order they
 * arrive in, a key of higher priority overtakes the queued partitions of a
 * larger one, and a worker that lies about partitions is refused, counted,
 * and changes nothing. Real rank processes over tcp and shm. */
#include "ps_jobs.h"

/* ---------------------------------------------------------------- bits */

#define BN 10000 /* floats per key: 40 KB, 40 chunks of 1 KiB */
#define BKEYS 3
#define BSTEPS 4

typedef struct {
    size_t partition_bytes;
    int window;
} pipe_cfg;

/* Sync SGD with momentum on 2 servers; keys dense, int8 with error
 * feedback both ways, and dense; each worker starts every key's pushpull
 * at once and orders its keys its own way (rank 2: the last key first,
 * rank 3: the middle, rank 4: as declared), so the partitions reach the
 * servers in different orders from different workers. */
static int bits_body(terse_comm *c, tr_out *o, const void *arg) {
    const pipe_cfg *pc = arg;
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.num_servers = 2;
    cfg.update = TERSE_PS_UPDATE_SGD;
    cfg.lr = 0.25f;
    cfg.momentum = 0.5f;
    cfg.chunk_bytes = 1024;
    cfg.partition_bytes = pc->partition_bytes;
    cfg.window = pc->window;
    terse_ps *ps = NULL;
    TR_CALL(o, terse_ps_create(c, &cfg, &ps));
    static const char *spec[BKEYS] = {NULL, "int8:ef=1", NULL};
    for (size_t k = 0; k < BKEYS; k++)
        TR_CALL(o, terse_ps_declare(ps, k, BN, spec[k], spec[k], NULL));
    if (terse_ps_is_server(ps)) {
        TR_CALL(o, terse_ps_serve(ps));
        terse_ps_free(ps);
        return 0;
    }
    const int rank = terse_comm_rank(c);
    if (rank == 2) TR_CALL(o, terse_ps_set_priority(ps, 2, 5));
    if (rank == 3) TR_CALL(o, terse_ps_set_priority(ps, 1, 5));
    static float buf[BKEYS][BN];
    for (int t = 0; t < BSTEPS; t++) {
        terse_request *r[BKEYS];
        for (size_t k = 0; k < BKEYS; k++) {
            for (size_t i = 0; i < BN; i++) buf[k][i] = grad(rank, t, k, i);
            TR_CALL(o, terse_ps_pushpull(ps, k, buf[k], &r[k]));
        }
        for (size_t k = 0; k < BKEYS; k++) {
            terse_status s = terse_request_wait(r[k]);
            terse_request_free(r[k]);
            TR_CALL(o, s);
        }
        TR_CALL(o, terse_ps_clock(ps));
    }
    for (size_t k = 0; k < BKEYS; k++) o->hash[k] = tr_hash(buf[k], sizeof buf[k]);
    o->u[0] = ps->nkeys; /* partitions in all */
    TR_CALL(o, terse_ps_finish(ps));
    terse_ps_free(ps);
    return 0;
}

static void same_bits(const char *prov) {
    /* The serial path: one partition per key, one request at a time. */
    pipe_cfg serial = {(size_t)1 << 30, 1}, piped = {4096, 4};
    tr_job job = {prov, 5, 20000, 90, -1};
    tr_out *a = tr_run(&job, bits_body, &serial);
    uint64_t want[BKEYS];
    for (size_t k = 0; k < BKEYS; k++) want[k] = a[2].hash[k];
    cr_assert_eq(a[2].u[0], BKEYS, "the serial job has %llu partitions",
                 (unsigned long long)a[2].u[0]);
    for (int w = 3; w < 5; w++)
        for (size_t k = 0; k < BKEYS; k++)
            cr_assert_eq(a[w].hash[k], want[k], "serial: worker %d's key %zu differs", w, k);
    tr_release(a);
    tr_out *b = tr_run(&job, bits_body, &piped);
    cr_assert_eq(b[2].u[0], BKEYS * 10, "the pipelined job has %llu partitions",
                 (unsigned long long)b[2].u[0]);
    for (int w = 2; w < 5; w++)
        for (size_t k = 0; k < BKEYS; k++)
            cr_assert_eq(b[w].hash[k], want[k],
                         "pipelined: worker %d's key %zu differs from the serial path's bits", w,
                         k);
    tr_release(b);
}

Test(ps_pipe, partitions_in_any_order_give_the_serial_bits_tcp) { same_bits("tcp"); }
Test(ps_pipe, partitions_in_any_order_give_the_serial_bits_shm) { same_bits("shm"); }

/* ---------------------------------------------------------------- priority */

#define BIG ((size_t)8 << 20) /* floats: 32 MiB, 32 partitions of 1 MiB */
#define SMALL 1000
#define PARTF ((size_t)1 << 18) /* floats per partition */

/* One server (SGD, lr 1, from zeros) and one worker. Two steps: in each,
 * the worker starts the big key's pushpull, then the small key's, and
 * watches both; when the small one completes it counts the big key's
 * partitions already pulled (their first float holds the new parameter).
 * Step 0 with the small key's priority raised, step 1 with it back at 0.
 * u[2t]: 1 if the small key completed first; u[2t+1]: partitions of the
 * big key pulled by then. */
static int prio_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.update = TERSE_PS_UPDATE_SGD;
    cfg.lr = 1.0f;
    terse_ps *ps = NULL;
    TR_CALL(o, terse_ps_create(c, &cfg, &ps));
    TR_CALL(o, terse_ps_declare(ps, 0, BIG, NULL, NULL, NULL));
    TR_CALL(o, terse_ps_declare(ps, 1, SMALL, NULL, NULL, NULL));
    if (terse_ps_is_server(ps)) {
        TR_CALL(o, terse_ps_serve(ps));
        terse_ps_free(ps);
        return 0;
    }
    float *big = malloc(BIG * sizeof(float)), small[SMALL];
    if (!big) return 1;
    for (int t = 0; t < 2; t++) {
        TR_CALL(o, terse_ps_set_priority(ps, 1, t == 0 ? 10 : 0));
        for (size_t i = 0; i < BIG; i++) big[i] = 1.0f;
        for (size_t i = 0; i < SMALL; i++) small[i] = 1.0f;
        const float pulled = -(float)(t + 1); /* x after step t: -(t + 1) */
        terse_request *ra = NULL, *rb = NULL;
        TR_CALL(o, terse_ps_pushpull(ps, 0, big, &ra));
        TR_CALL(o, terse_ps_pushpull(ps, 1, small, &rb));
        int a_done = 0, b_done = 0, first = -1;
        terse_status sa = TERSE_OK, sb = TERSE_OK;
        while (!(a_done && b_done)) {
            int d = 0;
            if (!a_done && ((sa = terse_request_test(ra, &d)) != TERSE_OK || d)) {
                a_done = 1;
                if (first < 0) first = 0;
            }
            if (!b_done && ((sb = terse_request_test(rb, &d)) != TERSE_OK || d)) {
                b_done = 1;
                if (first < 0) first = 1;
                /* the big key's partitions already pulled (read while its
                 * request runs: a partition is either old or new) */
                uint64_t n = 0;
                for (size_t p = 0; p < BIG / PARTF; p++)
                    n += ((volatile float *)big)[p * PARTF] == pulled;
                o->u[2 * t + 1] = n;
            }
            usleep(200);
        }
        TR_CALL(o, sa);
        TR_CALL(o, sb);
        terse_request_free(ra);
        terse_request_free(rb);
        o->u[2 * t] = first == 1;
        if (big[0] != pulled || big[BIG - 1] != pulled || small[0] != pulled) {
            snprintf(o->err, sizeof o->err, "step %d pulled %g, %g, %g, not %g", t,
                     (double)big[0], (double)big[BIG - 1], (double)small[0], (double)pulled);
            o->status = 1;
            return 1;
        }
        TR_CALL(o, terse_ps_clock(ps));
    }
    free(big);
    TR_CALL(o, terse_ps_finish(ps));
    terse_ps_free(ps);
    return 0;
}

static void priority(const char *prov) {
    tr_job job = {prov, 2, 20000, 90, -1};
    tr_out *o = tr_run(&job, prio_body, NULL);
    const uint64_t parts = BIG / PARTF;
    fprintf(stderr,
            "priority (%s): raised, the small key completed %s with %llu of %llu big partitions "
            "pulled; not raised, with %llu\n",
            prov, o[1].u[0] ? "first" : "second", (unsigned long long)o[1].u[1],
            (unsigned long long)parts, (unsigned long long)o[1].u[3]);
    cr_assert_eq(o[1].u[0], 1, "the small key of high priority did not complete first");
    cr_assert_lt(o[1].u[1], parts / 2,
                 "raised: %llu of %llu partitions of the big key were pulled before the small "
                 "key completed",
                 (unsigned long long)o[1].u[1], (unsigned long long)parts);
    /* The control: at equal priority the key declared first goes first. */
    cr_assert_geq(o[1].u[3], parts / 2,
                  "not raised: only %llu of %llu partitions of the big key were pulled before the "
                  "small key (declared second) completed",
                  (unsigned long long)o[1].u[3], (unsigned long long)parts);
    tr_release(o);
}

Test(ps_pipe, a_small_key_of_high_priority_overtakes_a_large_one_started_first_tcp) {
    priority("tcp");
}
Test(ps_pipe, a_small_key_of_high_priority_overtakes_a_large_one_started_first_shm) {
    priority("shm");
}

/* ---------------------------------------------------------------- bad input */

#define LN 1024 /* 4 partitions of 256 floats */
#define FLOOD 50

/* Rank 1 lies (hand-made requests, ps.h's terse__ps_test_raw); rank 2 is
 * an honest worker. Sync, update none: the pull is the mean. The liar
 * pushes every partition of step 0 with 1.0 -- partition 1 twice, the
 * second time with 100.0 -- then a partition that does not exist, one
 * whose length disagrees, one whose payload is too long, and once the
 * step closed, a flood of pushes for it. The honest worker must pull 2.0
 * everywhere: (1 + 3) / 2, nothing of the refused pushes. */
static int liar_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.chunk_bytes = 1024;
    cfg.partition_bytes = 1024;
    terse_ps *ps = NULL;
    TR_CALL(o, terse_ps_create(c, &cfg, &ps));
    TR_CALL(o, terse_ps_declare(ps, 0, LN, NULL, NULL, NULL));
    if (terse_ps_is_server(ps)) {
        TR_CALL(o, terse_ps_serve(ps));
        terse_ps_stats st = ps_stats_of(ps);
        o->u[0] = st.refused_key;
        o->u[1] = st.refused_step;
        o->u[2] = st.pushes_applied;
        terse_ps_free(ps);
        return 0;
    }
    static float x[LN];
    const int rank = terse_comm_rank(c);
    if (rank == 2) {
        ps_wait_mark(o - 1, &o[-1].u[21]); /* after the liar's pushes of step 0 */
        for (size_t i = 0; i < LN; i++) x[i] = 3.0f;
        TR_CALL(o, terse_ps_pushpull(ps, 0, x, NULL));
        ps_mark(&o->u[20]); /* step 0 is closed */
        for (size_t i = 0; i < LN; i++)
            if (x[i] != 2.0f) {
                snprintf(o->err, sizeof o->err, "element %zu pulled %g, not 2", i, (double)x[i]);
                o->status = 1;
                return 1;
            }
        TR_CALL(o, terse_ps_finish(ps));
        terse_ps_free(ps);
        return 0;
    }
    uint8_t *pay = NULL;
    size_t cap = 0, len = 0;
    terse__ps_rep rep;
    int n = 0; /* refusals seen, in order, in u[] */
    for (size_t p = 0; p < ps->nkeys; p++) {
        terse__ps_key *k = ps->keys[p];
        for (size_t i = 0; i < LN; i++) x[i] = 1.0f;
        TR_CALL(o, terse__ps_encode_for(k, 0, x, &pay, &cap, &len));
        terse__ps_hdr h = {TERSE__PS_PUSH, p, 0, len, 0, k->srv_floats[0], k->decl_hash, 1.0f,
                           0, 0, 0};
        TR_CALL(o, terse__ps_test_raw(ps, 0, &h, pay, len, &rep));
        if (rep.status != TERSE_OK) {
            snprintf(o->err, sizeof o->err, "partition %zu refused: %s", p, rep.text);
            o->status = 1;
            return 1;
        }
        if (p == 1) { /* the same partition again, other values */
            for (size_t i = 0; i < LN; i++) x[i] = 100.0f;
            TR_CALL(o, terse__ps_encode_for(k, 0, x, &pay, &cap, &len));
            TR_CALL(o, terse__ps_test_raw(ps, 0, &h, pay, len, &rep));
            o->u[n] = (uint64_t)rep.status;
            snprintf(o->err, sizeof o->err, "%s", rep.text); /* the duplicate's sentence */
            n++;
        }
    }
    ps_mark(&o->u[21]);
    terse__ps_key *k = ps->keys[2];
    terse__ps_hdr out_of_range = {TERSE__PS_PUSH, ps->nkeys, 0, len, 0, k->srv_floats[0],
                                  k->decl_hash, 1.0f, 0, 0, 0};
    terse__ps_hdr wrong_floats = {TERSE__PS_PUSH, 2, 0, len, 0, k->srv_floats[0] - 1,
                                  k->decl_hash, 1.0f, 0, 0, 0};
    const size_t long_len = k->srv_push_bound[0] + 4;
    terse__ps_hdr too_long = {TERSE__PS_PUSH, 2, 0, long_len, 0, k->srv_floats[0],
                              k->decl_hash, 1.0f, 0, 0, 0};
    terse__ps_hdr *bad[] = {&out_of_range, &wrong_floats, &too_long};
    uint8_t *junk = calloc(1, long_len);
    if (!junk) return 1;
    for (int i = 0; i < 3; i++) {
        TR_CALL(o, terse__ps_test_raw(ps, 0, bad[i], i == 2 ? junk : pay, i == 2 ? long_len : len,
                                      &rep));
        o->u[n] = (uint64_t)rep.status;
        snprintf((char *)o->f + 256 * i, 256, "%s", rep.text);
        n++;
    }
    free(junk);
    /* Once the honest worker pulled, step 0 is closed: a flood for it. */
    ps_wait_mark(o + 1, &o[1].u[20]);
    uint64_t stale = 0;
    for (int i = 0; i < FLOOD; i++) {
        terse__ps_hdr h = {TERSE__PS_PUSH, 3, 0, len, 0, ps->keys[3]->srv_floats[0],
                           ps->keys[3]->decl_hash, 1.0f, 0, 0, 0};
        TR_CALL(o, terse__ps_test_raw(ps, 0, &h, pay, len, &rep));
        stale += rep.status == TERSE_ERR_STALE;
    }
    o->u[10] = stale;
    free(pay);
    TR_CALL(o, terse_ps_finish(ps));
    terse_ps_free(ps);
    return 0;
}

static void liar(const char *prov) {
    tr_job job = {prov, 3, 20000, 60, -1};
    tr_out *o = tr_run(&job, liar_body, NULL);
    const tr_out *l = &o[1];
    cr_assert_eq(l->u[0], TERSE_ERR_INVALID, "duplicate partition: %s", l->err);
    cr_assert(strstr(l->err, "already pushed"), "duplicate partition: %s", l->err);
    const char *text = (const char *)l->f;
    cr_assert_eq(l->u[1], TERSE_ERR_INVALID, "partition out of range: %s", text);
    cr_assert(strstr(text, "not declared"), "partition out of range: %s", text);
    cr_assert_eq(l->u[2], TERSE_ERR_SHAPE, "length that disagrees: %s", text + 256);
    cr_assert(strstr(text + 256, "floats"), "length that disagrees: %s", text + 256);
    cr_assert_eq(l->u[3], TERSE_ERR_SHAPE, "payload too long: %s", text + 512);
    cr_assert(strstr(text + 512, "bytes"), "payload too long: %s", text + 512);
    cr_assert_eq(l->u[10], FLOOD, "%llu of %d pushes for a closed step refused as stale",
                 (unsigned long long)l->u[10], FLOOD);
    /* counted: key (out of range, length, too long), step (duplicate, flood) */
    cr_assert_eq(o[0].u[0], 3, "refused_key %llu", (unsigned long long)o[0].u[0]);
    cr_assert_eq(o[0].u[1], 1 + FLOOD, "refused_step %llu", (unsigned long long)o[0].u[1]);
    /* applied: 4 partitions x 2 workers, nothing else */
    cr_assert_eq(o[0].u[2], 8, "pushes_applied %llu", (unsigned long long)o[0].u[2]);
    tr_release(o);
}

Test(ps_pipe, lies_about_partitions_are_refused_counted_and_change_nothing_tcp) { liar("tcp"); }
Test(ps_pipe, lies_about_partitions_are_refused_counted_and_change_nothing_shm) { liar("shm"); }
