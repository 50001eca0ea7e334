/* The credit window as a bound on a server's memory (docs/ps.md,
 * "Partitions on the wire"): a worker that ignores its window -- requests
 * on a lane without waiting for the answers, pushes on pull lanes and on
 * lanes beyond the last, pushes that declare huge lengths -- is refused
 * where the server sees it, the server stays up, the honest worker's
 * pushpulls go on right, and the server's resident memory grows by less
 * than the bound the docs state. Real rank processes over tcp (libfabric's
 * net) and shm.
 *
 * Rank 0 serves (async SGD, lr 1, from zeros, the stale rule "plain": each
 * push moves x by -g / 2, so the honest worker needs nobody else), rank 1
 * floods, rank 2 is an honest worker whose every pull is checked bit for
 * bit against its own running sum. The flooder pushes zeros through the
 * API first (they change nothing, and the shard's buffer for its pushes
 * exists before the baseline), then sends by hand (ps.h's tags, the
 * transport's sends), never waiting for an answer. */
#include "ps_jobs.h"
#include "sanitizer.h"

#define WN ((size_t)1 << 16) /* floats: 256 KiB, 4 partitions of 64 KiB */
#define WPART ((size_t)64 << 10)
#define WINDOW 4
#define PIPELINED 1500 /* (1) requests on one lane, none waiting for its answer */
/* (5) requests on the lanes beyond the last. Over shm fewer: libfabric
 * 1.17's shm keeps messages no receive matches in a fixed store, and once
 * that is full it stops taking messages from the server's queue, which
 * every peer shares -- the honest worker's included (measured: with 200
 * such requests the honest worker went on; with 600 the flooder's sends
 * stopped after 233 and the honest worker stalled; docs/ps.md) */
#define BEYOND_TCP 1500
#define BEYOND_SHM 100
#define FLOOD_NS 3000000000ull /* (2) to (5) pushed this long at most */
#define DURING 5       /* pushpulls the honest worker completes during the flood */
#define HUGE_LEN ((uint64_t)1 << 30)
#define MARGIN ((uint64_t)4 << 20) /* allocator and provider noise */

/* u[] slots: server: its pid, serve's status, stats; flooder: 10..19, 23;
 * honest: steps done, steps when the flood started, when it was over;
 * marks: 30 (honest) warmed up, 31 (flooder) flood started, 32 (flooder)
 * flood over and measured. */
enum { U_PID = 0, U_SERVE = 1, U_REFKEY = 2, U_APPLIED = 3, U_LOST = 4, U_REFWIN = 5 };
enum {
    U_RSS0 = 10, U_RSS_MAX = 11, U_RSS1 = 12, U_HWM1 = 13, U_POSTED = 14, U_SENT = 15,
    U_BOUND = 16, U_BYTES = 17, U_LANES = 18, U_SHAPE = 19, U_WINDOWED = 23
};
enum { U_STEPS = 20, U_AT_START = 21, U_AT_END = 22 };
enum { M_WARM = 30, M_STARTED = 31, M_OVER = 32 };

/* VmRSS and VmHWM of process pid, bytes (0: unreadable). */
static void rss_of(pid_t pid, uint64_t *rss, uint64_t *hwm) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    *rss = *hwm = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb = 0;
        if (sscanf(line, "VmRSS: %llu kB", &kb) == 1) *rss = kb << 10;
        if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) *hwm = kb << 10;
    }
    fclose(f);
}

static int window_ps(terse_comm *c, tr_out *o, terse_ps **ps) {
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    TR_CALL(o, terse_ps_config_parse("async", &cfg));
    cfg.update = TERSE_PS_UPDATE_SGD;
    cfg.lr = 1.0f;
    cfg.momentum = 0.0f; /* a push of zeros changes nothing */
    cfg.stale_rule = TERSE_PS_STALE_PLAIN;
    cfg.chunk_bytes = WPART;
    cfg.partition_bytes = WPART;
    cfg.window = WINDOW;
    TR_CALL(o, terse_ps_create(c, &cfg, ps));
    TR_CALL(o, terse_ps_declare(*ps, 0, WN, NULL, NULL, NULL));
    return 0;
}

static int serve(terse_ps *ps, tr_out *o) {
    terse_status s = terse_ps_serve(ps);
    o->u[U_SERVE] = (uint64_t)s;
    /* the flooder dies: async serving goes on without it, then says so */
    if (s != TERSE_OK && s != TERSE_ERR_PEER_LOST) return tr_fail(o, s, "terse_ps_serve");
    terse_ps_stats st = ps_stats_of(ps);
    o->u[U_REFKEY] = st.refused_key;
    o->u[U_APPLIED] = st.pushes_applied;
    o->u[U_LOST] = st.workers_lost;
    o->u[U_REFWIN] = st.refused_window;
    terse_ps_free(ps);
    return 0;
}

/* Rank 2: pushpull until the flooder measured, each pull checked. */
static int honest(terse_ps *ps, tr_out *o) {
    tr_out *fl = o - 1;
    static float x[WN], want[WN];
    for (uint64_t t = 0;; t++) {
        for (size_t i = 0; i < WN; i++) x[i] = grad(2, (int)t, 0, i);
        for (size_t i = 0; i < WN; i++) want[i] -= 0.5f * x[i];
        TR_CALL(o, terse_ps_pushpull(ps, 0, x, NULL));
        if (memcmp(x, want, sizeof x)) {
            size_t i = 0;
            while (x[i] == want[i]) i++;
            snprintf(o->err, sizeof o->err, "step %llu: element %zu pulled %g, not %g",
                     (unsigned long long)t, i, (double)x[i], (double)want[i]);
            o->status = 1;
            return 1;
        }
        TR_CALL(o, terse_ps_clock(ps));
        __atomic_store_n(&o->u[U_STEPS], t + 1, __ATOMIC_RELEASE);
        if (t == 2) ps_mark(&o->u[M_WARM]);
        if (__atomic_load_n(&fl->u[M_STARTED], __ATOMIC_ACQUIRE) && !o->u[U_AT_START])
            o->u[U_AT_START] = t + 1;
        /* and a few more once the flooder is done */
        if (__atomic_load_n(&fl->u[M_OVER], __ATOMIC_ACQUIRE) || fl->finished || fl->status) {
            if (!o->u[U_AT_END]) o->u[U_AT_END] = t + 1;
            if (t + 1 >= o->u[U_AT_END] + 3) break;
        }
    }
    TR_CALL(o, terse_ps_finish(ps));
    terse_ps_free(ps);
    return 0;
}

/* The flooder's traffic: header and payload per request, and the reply
 * receives it posts, all at once. */
typedef struct {
    terse__fabric_req *q, *rq;
    uint8_t *hdr, *rep;
    size_t n, cap, nr;
} flood;

static terse_status flood_send(terse_ps *ps, flood *f, int lane, const terse__ps_hdr *h,
                               const void *payload, size_t len) {
    if (f->n + 2 > f->cap) return TERSE_ERR_INVALID;
    uint8_t *hb = f->hdr + (f->n / 2) * TERSE__PS_HDR_BYTES;
    terse__ps_put_hdr(hb, h);
    terse_status s =
        terse__comm_isend(ps->comm, 0, terse__ps_tag_lane(0, lane, TERSE__PS_TAG_HDR, h->seq), hb,
                          TERSE__PS_HDR_BYTES, TERSE__BYTES_FRAMING, &f->q[f->n++]);
    if (s != TERSE_OK) return s;
    return terse__comm_isend(ps->comm, 0, terse__ps_tag_lane(0, lane, TERSE__PS_TAG_DATA, h->seq),
                             payload, len, TERSE__BYTES_PAYLOAD, &f->q[f->n++]);
}

/* Post the receive of the reply to h (the f->nr-th). */
static terse_status flood_reply(terse_ps *ps, flood *f, int lane, const terse__ps_hdr *h) {
    if (f->nr >= f->cap / 2) return TERSE_ERR_INVALID;
    const size_t i = f->nr++;
    return terse__comm_irecv(ps->comm, 0, terse__ps_tag_lane(0, lane, TERSE__PS_TAG_REP, h->seq),
                             f->rep + i * TERSE__PS_REP_BYTES, TERSE__PS_REP_BYTES,
                             TERSE__BYTES_FRAMING, &f->rq[i]);
}

static size_t done_of(const terse__fabric_req *q, size_t from, size_t to) {
    size_t n = 0;
    for (size_t i = from; i < to; i++) n += terse__fabric_req_done(&q[i]) && !q[i].error;
    return n;
}

/* Rank 1. What it sends, in this order (over tcp nothing after the first
 * message no receive matches is read: the order puts first what the
 * server can see):
 *  (1) PIPELINED pushes on push lane 1, message numbers in turn, none
 *      waiting for the answer to the one before: each declares a size the
 *      server refuses (TERSE_ERR_SHAPE, refused_key), so the server drains
 *      its payload and answers; the flooder receives the answers;
 *  (2) on each pull lane a push declaring HUGE_LEN bytes, of which one
 *      transport chunk comes (TERSE_ERR_INVALID, refused_window, its
 *      payload not received -- drained, each would cost a chunk-sized
 *      buffer; over tcp the connection stalls on the first one's payload,
 *      so the server sees nothing after it);
 *  (3) on push lane 3 a push declaring 2^40 bytes (refused at once, its
 *      payload never received);
 *  (4) on push lane 2 a push declaring HUGE_LEN bytes, of which 4 MiB come
 *      (drained one transport chunk at a time; then the drain waits);
 *  (5) nbeyond requests with payloads on the lanes beyond the last (never
 *      received: the server posts no receive there).
 * It waits until the answers to (1) came and the honest worker completed
 * DURING pushpulls meanwhile, and goes on pushing (2) to (5) into the
 * transport until they all went and (2)'s first was answered, or for
 * FLOOD_NS, the server's memory sampled all along. */
static int flooder(terse_ps *ps, tr_out *o, int nbeyond) {
    tr_out *srv = o - 1, *hon = o + 1;
    static float zero[WN];
    for (int t = 0; t < 3; t++) {
        memset(zero, 0, sizeof zero); /* the pull wrote it */
        TR_CALL(o, terse_ps_pushpull(ps, 0, zero, NULL));
        TR_CALL(o, terse_ps_clock(ps));
    }
    memset(zero, 0, sizeof zero);
    ps_wait_mark(hon, &hon->u[M_WARM]);
    const pid_t spid = (pid_t)srv->u[U_PID];
    uint64_t rss0 = 0, hwm = 0;
    rss_of(spid, &rss0, &hwm);
    terse__ps_key *k = ps->keys[0];
    uint8_t *pay = NULL;
    size_t cap = 0, len = 0;
    TR_CALL(o, terse__ps_encode_for(k, 0, zero, &pay, &cap, &len));
    const size_t huge_sent = (size_t)4 << 20, chunk = terse__fabric_sink_bytes(ps->comm->fabric);
    uint8_t *junk = calloc(1, huge_sent);
    flood f = {0};
    f.cap = 2 * (PIPELINED + 2 + TERSE__PS_MAX_LANES + (size_t)nbeyond);
    f.q = calloc(f.cap, sizeof *f.q);
    f.rq = calloc(f.cap / 2, sizeof *f.rq);
    f.hdr = calloc(f.cap / 2, TERSE__PS_HDR_BYTES);
    f.rep = calloc(f.cap / 2, TERSE__PS_REP_BYTES);
    if (!junk || !f.q || !f.rq || !f.hdr || !f.rep)
        return tr_fail(o, TERSE_ERR_NOMEM, "flood buffers");
    /* The bound (docs/ps.md): per push lane one payload, in the shard's
     * buffer for this worker (at most the push bound; allocated by the
     * warm-up already) or the lane's drain buffer (one transport chunk). */
    size_t per = chunk;
    for (size_t p = 0; p < ps->nkeys; p++)
        if (ps->keys[p]->srv_push_bound[0] > per) per = ps->keys[p]->srv_push_bound[0];
    o->u[U_BOUND] = (uint64_t)ps->push_lanes * per + MARGIN;
    o->u[U_LANES] = (uint64_t)ps->lanes;
    o->u[U_RSS0] = rss0;
    ps_mark(&o->u[M_STARTED]);
    const uint64_t t0 = terse__now_ns();
    uint64_t bytes = 0;
    for (int i = 0; i < PIPELINED; i++) { /* (1)'s answers, all expected */
        terse__ps_hdr h = {0};
        h.seq = ps->lseq[1] + (uint64_t)i;
        TR_CALL(o, flood_reply(ps, &f, 1, &h));
    }
    const size_t first_pull = f.nr;
    size_t next = 0; /* (1): the next request to send */
    int rest = 0;    /* (2) to (5) posted */
    uint64_t rss_max = rss0, last_sample = 0, sent = 0, t_rest = 0;
    const uint64_t hon0 = __atomic_load_n(&hon->u[U_STEPS], __ATOMIC_ACQUIRE);
    for (;;) {
        /* (1): a request once the one before went (a header is injected
         * at once, a payload queued: a header that overtook the payload
         * before it would stall this connection over tcp before the server
         * saw the rest) -- never waiting for an answer */
        while (next < PIPELINED && (next == 0 || terse__fabric_req_done(&f.q[2 * next - 1]))) {
            const int i = (int)next++;
            const terse__ps_key *ki = ps->keys[i % 4];
            terse__ps_hdr h = {TERSE__PS_PUSH, (uint64_t)(i % 4), 0, len,
                               ps->lseq[1] + (uint64_t)i, ki->srv_floats[0] + 1, ki->decl_hash,
                               1.0f, 0, 0, 0};
            TR_CALL(o, flood_send(ps, &f, 1, &h, pay, len));
            bytes += len;
        }
        if (!rest && next == PIPELINED && terse__fabric_req_done(&f.q[2 * next - 1])) {
            rest = 1;
            t_rest = terse__now_ns();
            for (int l = ps->push_lanes; l < ps->lanes; l++) { /* (2) */
                terse__ps_hdr h = {TERSE__PS_PUSH, 0, 0, HUGE_LEN, ps->lseq[l], k->srv_floats[0],
                                   k->decl_hash, 1.0f, 0, 0, 0};
                TR_CALL(o, flood_reply(ps, &f, l, &h));
                TR_CALL(o, flood_send(ps, &f, l, &h, junk, chunk));
                bytes += chunk;
            }
            terse__ps_hdr liar = {TERSE__PS_PUSH, 0, 0, (uint64_t)1 << 40, ps->lseq[3],
                                  k->srv_floats[0], k->decl_hash, 1.0f, 0, 0, 0};
            TR_CALL(o, flood_send(ps, &f, 3, &liar, pay, len)); /* (3) */
            bytes += len;
            terse__ps_hdr huge = {TERSE__PS_PUSH, 0, 0, HUGE_LEN, ps->lseq[2], k->srv_floats[0],
                                  k->decl_hash, 1.0f, 0, 0, 0};
            TR_CALL(o, flood_send(ps, &f, 2, &huge, junk, huge_sent)); /* (4) */
            bytes += huge_sent;
            const int beyond = TERSE__PS_MAX_LANES - ps->lanes;
            for (int i = 0; i < nbeyond; i++) { /* (5) */
                terse__ps_hdr h = {TERSE__PS_PUSH, 0, 0, len, (uint64_t)(i / beyond),
                                   k->srv_floats[0], k->decl_hash, 1.0f, 0, 0, 0};
                TR_CALL(o, flood_send(ps, &f, ps->lanes + i % beyond, &h, pay, len));
                bytes += len;
            }
        }
        size_t ev = 0;
        TR_CALL(o, terse__fabric_progress(ps->comm->fabric, &ev));
        const uint64_t now = terse__now_ns();
        if (now - last_sample > 20000000ull) {
            last_sample = now;
            uint64_t r = 0, h = 0;
            rss_of(spid, &r, &h);
            if (r > rss_max) rss_max = r;
        }
        sent = done_of(f.q, 0, f.n);
        const uint64_t went = __atomic_load_n(&hon->u[U_STEPS], __ATOMIC_ACQUIRE) - hon0;
        const int seen = rest && done_of(f.rq, 0, first_pull) == first_pull && went > DURING;
        const int all = sent == f.n && done_of(f.rq, first_pull, first_pull + 1) == 1;
        if (seen && (all || now - t_rest >= FLOOD_NS)) break;
        if (hon->status || hon->finished) break; /* reported by the parent */
        if (now - t0 > 60 * 1000000000ull) {
            snprintf(o->err, sizeof o->err,
                     "after 60 s, %zu of %d pipelined pushes sent, %zu of %zu answered, %zu "
                     "answer to the first on a pull lane; the honest worker completed %llu "
                     "pushpulls",
                     next, PIPELINED, done_of(f.rq, 0, first_pull), first_pull,
                     rest ? done_of(f.rq, first_pull, first_pull + 1) : 0,
                     (unsigned long long)(hon->u[U_STEPS] - hon0));
            o->status = TERSE_ERR_TIMEOUT;
            return 1;
        }
        if (!ev) usleep(100);
    }
    o->u[U_SENT] = sent;
    o->u[U_POSTED] = f.n;
    o->u[U_BYTES] = bytes + (uint64_t)(f.n / 2) * TERSE__PS_HDR_BYTES;
    uint64_t rss1 = 0, hwm1 = 0;
    rss_of(spid, &rss1, &hwm1);
    o->u[U_RSS_MAX] = rss_max > rss1 ? rss_max : rss1;
    o->u[U_RSS1] = rss1;
    o->u[U_HWM1] = hwm1;
    /* What it was told: (1)'s answers, (2)'s (the first's sentence kept) */
    for (size_t i = 0; i < f.nr; i++) {
        terse__ps_rep r;
        if (!terse__fabric_req_done(&f.rq[i]) || f.rq[i].error ||
            terse__ps_get_rep(f.rep + i * TERSE__PS_REP_BYTES, &r) != TERSE_OK)
            continue;
        if (i < first_pull) o->u[U_SHAPE] += r.status == TERSE_ERR_SHAPE;
        else o->u[U_WINDOWED] += r.status == TERSE_ERR_INVALID;
        if (i == first_pull) snprintf((char *)o->f, 256, "%s", r.text);
    }
    return 0;
}

static int window_body(terse_comm *c, tr_out *o, const void *arg) {
    const int nbeyond = *(const int *)arg;
    const int rank = terse_comm_rank(c);
    if (rank == 0) o->u[U_PID] = (uint64_t)getpid();
    terse_ps *ps = NULL;
    if (window_ps(c, o, &ps)) return 1;
    if (terse_ps_is_server(ps)) return serve(ps, o);
    if (rank == 2) return honest(ps, o);
    flooder(ps, o, nbeyond);
    /* The flooder cannot say goodbye (over tcp its connection to the
     * server is stalled on a message nothing will receive): it dies, and
     * the server counts it lost. A failure is in its output. */
    ps_mark(&o->u[M_OVER]);
    kill(getpid(), SIGKILL);
    return 1;
}

static void ignores_window(const char *prov, int nbeyond) {
    tr_job job = {prov, 3, 20000, 90, 1};
    tr_out *o = tr_run(&job, window_body, &nbeyond);
    const tr_out *s = &o[0], *f = &o[1], *h = &o[2];
    cr_assert_eq(f->status, 0, "flooder: %s", f->err);
    const double mib = 1.0 / (1 << 20);
    const uint64_t grew = f->u[U_RSS_MAX] > f->u[U_RSS0] ? f->u[U_RSS_MAX] - f->u[U_RSS0] : 0;
    fprintf(stderr,
            "window (%s): the flooder posted %llu messages (%.1f MiB) past its window (%llu lanes, "
            "%llu of them push lanes), %llu of them completed at its end; %llu of %d pipelined "
            "pushes answered TERSE_ERR_SHAPE, pushes on pull lanes answered: %llu (server: "
            "refused_window %llu, refused_key %llu); the server's VmRSS %.1f MiB before, %.1f MiB "
            "after, %.1f MiB at most during (VmHWM %.1f), grew %.2f MiB, bound %.1f MiB; the "
            "honest worker completed %llu pushpulls during the flood, %llu in all\n",
            prov, (unsigned long long)f->u[U_POSTED], (double)f->u[U_BYTES] * mib,
            (unsigned long long)f->u[U_LANES], (unsigned long long)(f->u[U_LANES] / 8),
            (unsigned long long)f->u[U_SENT], (unsigned long long)f->u[U_SHAPE], PIPELINED,
            (unsigned long long)f->u[U_WINDOWED], (unsigned long long)s->u[U_REFWIN],
            (unsigned long long)s->u[U_REFKEY], (double)f->u[U_RSS0] * mib,
            (double)f->u[U_RSS1] * mib, (double)f->u[U_RSS_MAX] * mib,
            (double)f->u[U_HWM1] * mib, (double)grew * mib, (double)f->u[U_BOUND] * mib,
            (unsigned long long)(h->u[U_AT_END] - h->u[U_AT_START]),
            (unsigned long long)h->u[U_STEPS]);
    cr_assert_gt(f->u[U_RSS0], 0, "the server's VmRSS could not be read");
    /* Under AddressSanitizer freed memory sits in its quarantine (256 MiB
     * by default) and the resident size grows with every payload freed
     * (134 and 312 MiB here; 0.08 and 2.2 MiB with quarantine_size_mb=0):
     * the bound is the gcc build's to check (the functional suite). */
    if (!UNDER_ASAN) {
        cr_assert_lt(grew, f->u[U_BOUND],
                     "the server's resident memory grew by %.2f MiB under the flood, over the "
                     "bound %.2f MiB",
                     (double)grew * mib, (double)f->u[U_BOUND] * mib);
    }
    /* the flood offered far more than the bound */
    cr_assert_gt(f->u[U_BYTES], 8 * f->u[U_BOUND]);
    /* the honest worker went on, every pull right */
    cr_assert_geq(h->u[U_AT_END], h->u[U_AT_START] + DURING,
                  "the honest worker completed %llu pushpulls during the flood",
                  (unsigned long long)(h->u[U_AT_END] - h->u[U_AT_START]));
    /* what the flooder was told: every pipelined push refused for its size,
     * and a push on a pull lane refused for the window, with a sentence */
    cr_assert_eq(f->u[U_SHAPE], PIPELINED, "%llu of %d pipelined pushes answered SHAPE",
                 (unsigned long long)f->u[U_SHAPE], PIPELINED);
    const char *text = (const char *)f->f;
    cr_assert_geq(f->u[U_WINDOWED], 1);
    cr_assert(strstr(text, "pull lane") && strstr(text, "window"), "window refusal: %s", text);
    cr_assert_geq(s->u[U_REFWIN], f->u[U_WINDOWED], "refused_window %llu",
                  (unsigned long long)s->u[U_REFWIN]);
    cr_assert_geq(s->u[U_REFKEY], PIPELINED, "refused_key %llu",
                  (unsigned long long)s->u[U_REFKEY]);
    /* the server took the flooder's loss and served on */
    cr_assert_eq(s->u[U_SERVE], TERSE_ERR_PEER_LOST, "serve: %s", s->err);
    cr_assert_eq(s->u[U_LOST], 1);
    /* applied: nothing of the flood (the flooder's 3 API pushes and the
     * honest worker's, 4 partitions each) */
    cr_assert_eq(s->u[U_APPLIED], 4 * (3 + h->u[U_STEPS]), "pushes_applied %llu",
                 (unsigned long long)s->u[U_APPLIED]);
    tr_release(o);
}

Test(ps_window, a_worker_that_ignores_the_window_costs_the_server_a_bounded_memory_tcp) {
    ignores_window("tcp", BEYOND_TCP);
}
Test(ps_window, a_worker_that_ignores_the_window_costs_the_server_a_bounded_memory_shm) {
    ignores_window("shm", BEYOND_SHM);
}
