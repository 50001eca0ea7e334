/* The dense all-reduce over the host's shared segment (transport/segment.h),
 * for a job whose ranks all share one host (issue 28, item 4: where
 * libfabric's shm, a CMA copy and a region lock per message, is the limit).
 *
 * The buffer goes through in steps of step_floats floats (TERSE_SEGMENT_
 * STEP_BYTES, 256 KiB by default: a step's blocks stay in the caches while
 * the ranks pass them on). Step s (numbered on the communicator, the same on
 * every rank), parity p = s % 2, L ranks, this rank's member index j:
 *   1. wait until every member has finished step s - 2 (its done flag), the
 *      last one that used parity p; copy this rank's slice into its input
 *      block of parity p; publish in = s;
 *   2. wait until every member's in >= s; sum share j of the slice (the
 *      slice cut into L nearly equal shares) over the L input blocks in
 *      member order into the output block (and divide, for an average);
 *      publish out = s;
 *   3. wait until every member's out >= s; copy the output block back into
 *      the buffer; publish done = s.
 * Two parities let a rank run one step ahead of the slowest. Each flag is
 * written by its member alone (release) and read by the others (acquire),
 * so the blocks need no lock. Every rank copies the same output block: every
 * rank ends with the same bits; the sum of each element is formed in rank
 * order, x_0 + x_1 + ... + x_{L-1}, whatever the timing, the same bits from
 * run to run (recursive doubling and the ring it replaces sum in other
 * orders: the bits differ from theirs for L > 2).
 *
 * Memory traffic per rank and step of S bytes: copy in (S read, S written),
 * the sum of its share (S read, S / L written), copy out (S read, S written):
 * about 5 S + S / L, nearly all of it in the caches, and no system call,
 * where libfabric's shm ring moves each chunk with process_vm_readv and
 * stages it (docs/collectives.md).
 *
 * The failure contract. Every step looks at the abort flag. A wait watches
 * the awaited flags; every millisecond of the call it also polls the store
 * (a SIGKILLed rank's store connection drops: the survivors fail with
 * TERSE_ERR_PEER_LOST naming it within the store's grace), the call
 * descriptors (ranks that passed other sizes fail with the descriptor's
 * sentence) and the abort flag. A flag that does not move for the
 * communicator's timeout fails with TERSE_ERR_TIMEOUT naming the rank that
 * did not move (stopped, stuck or far behind). Every member publishes its
 * call's element count and op with its input, and a rank whose call
 * differs fails the step with TERSE_ERR_SHAPE (with TERSE_CHECK_CALLS=off,
 * which sends no call descriptors, nothing else would notice before the
 * data mixed). Nothing here takes a lock, so
 * a rank killed mid-step leaves nothing the others could spin on. After any
 * failure the communicator has failed; the segment's state does not matter.
 *
 * A survivor whose peer was replaced (comm_join.c, terse__comm_take_back)
 * leaves the segment; one that has not heard of the replacement yet still
 * waits in it and times out (naming a rank that has left it), never reads
 * data nobody wrote for this call. Only a parameter server's communicator
 * sees replacements, and a replacement refuses collectives anyway. */
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "algos/coll/coll.h"
#include "algos/coll/ring.h"
#include "common/error.h"
#include "transport/segment.h"

enum { FLAG_IN, FLAG_OUT, FLAG_DONE, FLAG_BAR, FLAG_REL };

static const char *const phase_name[] = {
    "its input", "its share of the sum", "its copy of the result", "its arrival at the barrier",
    "the barrier's release (every host arrived)"};

static _Atomic uint64_t *flag_of(terse__seg_flags *f, int which) {
    switch (which) {
    case FLAG_IN: return &f->in;
    case FLAG_OUT: return &f->out;
    case FLAG_DONE: return &f->done;
    case FLAG_REL: return &f->rel;
    default: return &f->bar;
    }
}

static uint64_t flag_load(terse__seg_flags *f, int which) {
    return atomic_load_explicit(flag_of(f, which), memory_order_acquire);
}

static void flag_store(terse__seg_flags *f, int which, uint64_t v) {
    atomic_store_explicit(flag_of(f, which), v, memory_order_release);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* How long a wait spins before it yields the core, yields before it naps,
 * and how often it runs a progress round. */
#define SPIN_NS 2000ull
#define YIELD_NS 200000ull
#define NAP_NS 20000
#define PROGRESS_NS 1000000ull
/* With messages in flight (the hierarchical path), a libfabric progress
 * round this often while a wait spins. */
#define PROGRESS_NET_NS 50000ull

/* A wait's context: the segment, this rank's member index, each member's
 * rank (NULL: member m is rank m, the one-host segment), and whether
 * libfabric has requests of the call in flight (the hierarchical path's
 * network phase: a progress round then drives them too, on the progress
 * thread). `polled`: when the call last polled; the clock runs across the
 * call's waits, so a call of many quick steps still polls the store and
 * the abort flag every PROGRESS_NS. */
typedef struct {
    terse_comm *c;
    terse__seg *g;
    int me;
    const int *rank_of;
    int net;
    uint64_t polled;
} seg_wait;

static int rank_of(const seg_wait *w, int m) { return w->rank_of ? w->rank_of[m] : m; }

/* The store's loss notices and told failures, the call descriptors (in the
 * segment too) and the abort flag -- not libfabric's progress unless the
 * call has messages in flight: a blocking call over the one-host segment
 * runs on the caller's thread, where no libfabric call may spin
 * (engine_api.c). */
static terse_status progress(seg_wait *w, uint64_t now) {
    w->polled = now;
    if (w->net) return terse__comm_progress(w->c);
    terse_status s = terse__comm_check_alive(w->c);
    if (s == TERSE_OK) s = terse__comm_poll_abort(w->c, "in the shared segment's all-reduce");
    return s;
}

/* Wait until the flag `which` of members 0 .. upto - 1 is >= want. */
static terse_status wait_members(seg_wait *w, int which, uint64_t want, int upto) {
    terse_comm *c = w->c;
    terse__seg *g = w->g;
    const int L = upto;
    int next = 0; /* members below `next` are there */
    uint64_t moved = terse__now_ns();
    const uint64_t limit = (uint64_t)c->timeout_ms * 1000000ull;
    const uint64_t every = w->net ? PROGRESS_NET_NS : PROGRESS_NS;
    for (uint64_t spins = 0;; spins++) {
        while (next < L && flag_load(terse__seg_flags_of(g, next), which) >= want) {
            next++;
            moved = 0; /* set below, with the clock */
        }
        if (next == L) break;
        if (spins < 64) {
            cpu_relax();
            continue;
        }
        uint64_t now = terse__now_ns();
        if (moved == 0) moved = now;
        if (now - w->polled >= every) {
            terse_status s = progress(w, now);
            if (s != TERSE_OK) return s;
        }
        if (now - moved >= limit) {
            terse__seg_flags *f = terse__seg_flags_of(g, next);
            /* the rank awaited may itself wait for one further behind
             * (a call descriptor from a stopped rank): name that one too */
            const int lag = terse__seg_laggard(g, w->me, next);
            char behind[200] = "";
            if (lag >= 0 && lag != next)
                snprintf(behind, sizeof behind, "; the rank furthest behind is rank %d (pid %lld), "
                         "which rank %d may be waiting for",
                         rank_of(w, lag),
                         (long long)atomic_load_explicit(&terse__seg_flags_of(g, lag)->pid,
                                                         memory_order_relaxed),
                         rank_of(w, next));
            terse_status s = TERSE_ERROR(
                TERSE_ERR_TIMEOUT,
                "rank %d: waited %d ms in the shared segment's %s (step %llu) for rank %d (pid "
                "%lld) to publish %s, and it did not%s: %s",
                c->rank, c->timeout_ms,
                which >= FLAG_BAR ? "barrier" : w->rank_of ? "hierarchical all-reduce" : "all-reduce",
                (unsigned long long)want, rank_of(w, next),
                (long long)atomic_load_explicit(&f->pid, memory_order_relaxed),
                phase_name[which], behind,
                which == FLAG_REL
                    ? "it waits for this host's ranks, then for the other hosts' first ranks: "
                      "it, or a rank it waits for, is stopped, stuck, or no longer running the "
                      "same collectives"
                    : "it is stopped, stuck, or no longer running the same collectives");
            return terse__comm_explain(c, s, 0, 0);
        }
        if (now - moved < SPIN_NS) {
            cpu_relax();
        } else if (now - moved < YIELD_NS) {
            sched_yield();
        } else {
            struct timespec ts = {0, NAP_NS};
            nanosleep(&ts, NULL);
        }
    }
    return TERSE_OK;
}

/* Wait until every member's flag `which` is >= want. */
static terse_status wait_all(seg_wait *w, int which, uint64_t want) {
    return wait_members(w, which, want, terse__seg_members(w->g));
}

/* Publish this member's call (before its input's release). */
static void publish_call(terse__seg_flags *mine, uint64_t n, uint64_t op, uint64_t codec) {
    atomic_store_explicit(&mine->call_n, n, memory_order_relaxed);
    atomic_store_explicit(&mine->call_op, op, memory_order_relaxed);
    atomic_store_explicit(&mine->call_codec, codec, memory_order_relaxed);
}

/* After the inputs of a step are in: every member runs the same call (its
 * element count and op), else TERSE_ERR_SHAPE naming the first that does
 * not -- with TERSE_CHECK_CALLS=off nothing else would notice, and ranks
 * with other counts would run other numbers of steps and mix their data;
 * and the same codec (its cut digest: the spec, element count and cut; 0
 * for none), else TERSE_ERR_CODEC_MISMATCH naming the first member whose
 * codec or cut differs. */
static terse_status same_call_codec(const seg_wait *w, uint64_t n, uint64_t op, uint64_t codec) {
    terse_comm *c = w->c;
    terse__seg *g = w->g;
    const int L = terse__seg_members(g);
    for (int q = 0; q < L; q++) {
        terse__seg_flags *f = terse__seg_flags_of(g, q);
        uint64_t qn = atomic_load_explicit(&f->call_n, memory_order_relaxed);
        uint64_t qop = atomic_load_explicit(&f->call_op, memory_order_relaxed);
        uint64_t qc = atomic_load_explicit(&f->call_codec, memory_order_relaxed);
        if (qn == n && qop == op && qc != codec) {
            c->desc_failed = c->desc_on;
            return TERSE_ERROR(TERSE_ERR_CODEC_MISMATCH,
                               "rank %d: rank %d's codec or its cut differs from this rank's "
                               "in the shared segment's compressed all-reduce (do all ranks "
                               "use the same spec and shape?)",
                               c->rank, rank_of(w, q));
        }
        if (qn != n || qop != op) {
            /* a mismatch found here, as by the call descriptors: told to
             * the other ranks through the store (comm_desc.c), so that
             * ranks on other hosts fail with this sentence, not a loss */
            c->desc_failed = c->desc_on;
            return TERSE_ERROR(TERSE_ERR_SHAPE,
                               "rank %d: terse_allreduce of %llu floats (%s) in the shared "
                               "segment, but rank %d's call is of %llu floats (%s): pass the "
                               "same count and op on every rank",
                               c->rank, (unsigned long long)n, op ? "average" : "sum",
                               rank_of(w, q), (unsigned long long)qn, qop ? "average" : "sum");
        }
    }
    return TERSE_OK;
}

/* dst[i] = sum over the L blocks (member order), divided by `divisor` if
 * divide. */
static void sum_share(terse__seg *g, int parity, size_t off, size_t len, float *restrict dst,
                      int divide, float divisor) {
    const int L = terse__seg_members(g);
    const float *restrict a = terse__seg_in(g, parity, 0) + off;
    const float *restrict b = terse__seg_in(g, parity, 1) + off;
    for (size_t i = 0; i < len; i++) dst[i] = a[i] + b[i];
    for (int q = 2; q < L; q++) {
        const float *restrict x = terse__seg_in(g, parity, q) + off;
        for (size_t i = 0; i < len; i++) dst[i] += x[i];
    }
    if (divide)
        for (size_t i = 0; i < len; i++) dst[i] /= divisor;
}

/* A step's way in, on every path over a segment: once every member has
 * finished step s - 2 (the last one of this parity), copy len floats from
 * src into this member's input block, publish the call (count, op, codec
 * digest) and in = s, wait for every member's input, and check that every
 * member runs the same call. */
static terse_status step_in(seg_wait *w, uint64_t s, const float *src, size_t len, uint64_t n,
                            uint64_t op, uint64_t codec) {
    terse__seg_flags *mine = terse__seg_flags_of(w->g, w->me);
    terse_status st = s > 2 ? wait_all(w, FLAG_DONE, s - 2) : TERSE_OK;
    if (st != TERSE_OK) return st;
    memcpy(terse__seg_in(w->g, (int)(s & 1), w->me), src, len * sizeof(float));
    publish_call(mine, n, op, codec);
    flag_store(mine, FLAG_IN, s);
    st = wait_all(w, FLAG_IN, s);
    return st == TERSE_OK ? same_call_codec(w, n, op, codec) : st;
}

/* ... and its way out, once this member's part of the output block is
 * written: out = s, wait for every member's, copy len floats of the output
 * block to dst, done = s. */
static terse_status step_out(seg_wait *w, uint64_t s, float *dst, size_t len) {
    terse__seg_flags *mine = terse__seg_flags_of(w->g, w->me);
    flag_store(mine, FLAG_OUT, s);
    terse_status st = wait_all(w, FLAG_OUT, s);
    if (st != TERSE_OK) return st;
    memcpy(dst, terse__seg_out(w->g, (int)(s & 1)), len * sizeof(float));
    flag_store(mine, FLAG_DONE, s);
    return TERSE_OK;
}

terse_status terse__allreduce_seg(terse_comm *c, float *buf, size_t n, int divide) {
    terse__seg *g = c->seg;
    const int L = terse__seg_members(g), me = c->rank;
    const size_t B = terse__seg_step_floats(g);
    const uint64_t t_start = terse__now_ns();
    seg_wait w = {c, g, me, NULL, 0, t_start};
    double busy = 0;
    terse_status st = TERSE_OK;
    for (size_t off = 0; off < n && st == TERSE_OK; off += B) {
        const size_t m = n - off < B ? n - off : B;
        const uint64_t s = ++c->seg_step;
        const int p = (int)(s & 1);
        /* the abort flag at every step, however quick the waits */
        st = terse__comm_poll_abort(c, "in the shared segment's all-reduce");
        if (st == TERSE_OK) st = step_in(&w, s, buf + off, m, (uint64_t)n, (uint64_t)divide, 0);
        if (st != TERSE_OK) break;
        size_t po, pl;
        terse__part(m, (size_t)L, (size_t)me, &po, &pl);
        uint64_t t0 = terse__now_ns();
        sum_share(g, p, po, pl, terse__seg_out(g, p) + po, divide, (float)c->nranks);
        busy += (double)(terse__now_ns() - t0) * 1e-9;
        st = step_out(&w, s, buf + off, m);
    }
    /* the sums count as codec time, the rest (copies, waits, the store's
     * polls) as network time, as the transport's paths count them */
    double all = (double)(terse__now_ns() - t_start) * 1e-9;
    pthread_mutex_lock(&c->stats_lock);
    c->stats.codec_seconds += busy;
    c->stats.network_seconds += all > busy ? all - busy : 0;
    pthread_mutex_unlock(&c->stats_lock);
    return st;
}

/* The barrier over the segment: publish this rank's arrival (its barrier
 * count, the same on every rank), wait for every member's. No libfabric:
 * on the caller's thread like the all-reduce (engine_api.c). */
terse_status terse__barrier_seg(terse_comm *c) {
    terse__seg *g = c->seg;
    const uint64_t k = ++c->seg_bar;
    flag_store(terse__seg_flags_of(g, c->rank), FLAG_BAR, k);
    seg_wait w = {c, g, c->rank, NULL, 0, terse__now_ns()};
    return wait_all(&w, FLAG_BAR, k);
}

/* ---- the hierarchical dense all-reduce over each host's segment ----
 *
 * In a job over several hosts (hier_allreduce.c has the plan and the
 * bytes), with each host's segment (c->lseg, members its local ranks):
 * the intra-host phases become the segment's, and only the rail between
 * hosts goes through the transport. The buffer goes through in steps of
 * the segment's step (B floats); with H hosts, L ranks on this one, S the
 * fewest on any host, step s (numbered per host, the same on all of them:
 * every rank runs the same steps), parity p = s % 2:
 *   1. as the one-host path: wait until every local member finished step
 *      s - 2; copy the slice into this member's input block; in = s; wait
 *      for every member's input;
 *   2. local rank l < S (the owner of shard l: the slice cut into S nearly
 *      equal shards) sums its shard over the L input blocks in local-rank
 *      order into the output block, then sends that host sum to the owners
 *      of shard l on the other hosts and posts the receives of theirs (the
 *      rail: the network);
 *   3. one step later (so that step s + 1's copy-in and local sums run
 *      while step s's shards cross the link): wait for the rail's messages,
 *      sum the H host sums in host order into the output block (dividing
 *      by the rank count for an average), out = s; every member waits for
 *      every member's out, copies the output block back, done = s.
 * A host of one rank (no segment) sends its slice itself and sums into its
 * buffer. Each element's result is (sum over hosts in host order of (sum
 * over local ranks in local-rank order)), formed once per rail member from
 * the same bits and copied: every rank ends with the same bits, the same
 * ones hier_allreduce.c's order gives.
 *
 * The failure contract: a wait on the segment also runs libfabric's
 * progress (the rail's messages are in flight) with the store's loss
 * notices and the abort flag; a local member that does not move for the
 * timeout is named as on one host; the rail's waits are the transport's
 * (terse__comm_wait). Members of a host that pass other counts or ops fail
 * with TERSE_ERR_SHAPE as on one host; hosts that differ as a whole are
 * the call descriptors' to find -- under TERSE_CHECK_CALLS=off a count
 * that differs makes the rail's messages differ in length, which the
 * transport refuses, but an op that differs between hosts goes unnoticed
 * (terse.h: off trades that check away, "a mismatch showing up as a
 * timeout, a MAC failure or corrupt data"). */

/* dst = sum over hosts in host order, the own host's term being dst
 * itself (an element at a time: it is read before it is written). */
static void sum_hosts(float *restrict dst, float *const *from, int H, int h, size_t len,
                      int divide, float divisor) {
    for (size_t i = 0; i < len; i++) {
        float acc = h == 0 ? dst[i] : from[0][i];
        for (int k = 1; k < H; k++) acc += k == h ? dst[i] : from[k][i];
        dst[i] = divide ? acc / divisor : acc;
    }
}

/* The time of a call over the hosts' segments: the codec's sums and the
 * transport's waits count themselves (codec_seconds, network_seconds);
 * the rest -- the copies and the waits in the segment -- counts as network
 * time, as on one host, so that the two add up to the call's wall time. */
typedef struct {
    uint64_t t0;
    double net0, codec0;
} call_clock;

static call_clock clock_start(terse_comm *c) {
    call_clock k = {terse__now_ns(), 0, 0};
    pthread_mutex_lock(&c->stats_lock);
    k.net0 = c->stats.network_seconds;
    k.codec0 = c->stats.codec_seconds;
    pthread_mutex_unlock(&c->stats_lock);
    return k;
}

static void clock_end(terse_comm *c, const call_clock *k) {
    const double all = (double)(terse__now_ns() - k->t0) * 1e-9;
    pthread_mutex_lock(&c->stats_lock);
    const double counted =
        (c->stats.network_seconds - k->net0) + (c->stats.codec_seconds - k->codec0);
    if (all > counted) c->stats.network_seconds += all - counted;
    pthread_mutex_unlock(&c->stats_lock);
}

typedef struct {
    uint64_t s;  /* its step number */
    size_t off, m; /* its slice of the buffer */
    float *hsum; /* this owner's shard of it: its host sum, then the result */
    size_t hlen;
    size_t req0, nreq; /* its rail requests in c->reqs */
} hier_step;

terse_status terse__allreduce_hier_seg(terse_comm *c, float *buf, size_t n, int divide) {
    terse__seg *g = c->lseg; /* NULL on a host of one rank */
    const int S = c->local_min, H = c->nhosts, l = c->local_rank, h = c->host_index;
    const int owner = l < S;
    const size_t B = terse__comm_seg_step_bytes(c) / sizeof(float);
    /* the rail's receives: a shard of a step, or of n if less */
    const size_t shard_max = (n < B ? n : B) / (size_t)S + 1;
    int local[TERSE__COMM_MAX_REQS] = {0}, rail[TERSE__COMM_MAX_REQS] = {0};
    terse__hier_peers(c, local, rail);
    /* two steps' rail receives, H slots of a shard each */
    float *tmp = terse__comm_scratch(c, 3, 2 * (size_t)H * shard_max * sizeof(float));
    if (!tmp) return TERSE_ERR_NOMEM;
    seg_wait w = {c, g, l, local, 1, terse__now_ns()};
    const size_t nsteps = (n + B - 1) / B;
    const call_clock clk = clock_start(c);
    hier_step st[2] = {{0}, {0}};
    terse_status rc = TERSE_OK;
    for (size_t t = 0; t <= nsteps && rc == TERSE_OK; t++) {
        /* phases 1 and 2 of step t */
        if (t < nsteps) {
            hier_step *x = &st[t & 1];
            x->s = ++c->lseg_step;
            x->off = t * B;
            x->m = n - x->off < B ? n - x->off : B;
            const int p = (int)(x->s & 1);
            rc = terse__comm_poll_abort(c, "in the hierarchical all-reduce");
            if (rc == TERSE_OK && g)
                rc = step_in(&w, x->s, buf + x->off, x->m, (uint64_t)n, (uint64_t)divide, 0);
            if (rc != TERSE_OK) break;
            terse__comm_next_phase(c); /* every rank, owner or not: the tags agree */
            x->nreq = 0;
            x->req0 = (t & 1) ? TERSE__COMM_MAX_REQS / 2 : 0;
            if (owner) {
                size_t so, sl;
                terse__part(x->m, (size_t)S, (size_t)l, &so, &sl);
                x->hlen = sl;
                if (g) {
                    uint64_t t0 = terse__now_ns();
                    x->hsum = terse__seg_out(g, p) + so;
                    sum_share(g, p, so, sl, x->hsum, 0, 1.0f);
                    terse__comm_codec_time(c, t0);
                } else {
                    x->hsum = buf + x->off + so;
                }
                const uint64_t tag = terse__comm_tag(c, 0);
                float *in = tmp + (size_t)(t & 1) * (size_t)H * shard_max;
                for (int k = 0; k < H && rc == TERSE_OK; k++) {
                    if (k == h) continue;
                    rc = terse__comm_irecv(c, rail[k], tag, in + (size_t)k * shard_max,
                                           sl * sizeof(float), TERSE__BYTES_PAYLOAD,
                                           &c->reqs[x->req0 + x->nreq++]);
                    if (rc == TERSE_OK)
                        rc = terse__comm_isend(c, rail[k], tag, x->hsum, sl * sizeof(float),
                                               TERSE__BYTES_PAYLOAD,
                                               &c->reqs[x->req0 + x->nreq++]);
                }
                if (rc != TERSE_OK) break;
            }
        }
        /* phase 3 of step t - 1 */
        if (t >= 1) {
            hier_step *x = &st[(t - 1) & 1];
            if (owner) {
                rc = terse__comm_wait(c, &c->reqs[x->req0], x->nreq);
                if (rc != TERSE_OK) break;
                float *in = tmp + (size_t)((t - 1) & 1) * (size_t)H * shard_max, *from[64];
                for (int k = 0; k < H; k++) from[k] = in + (size_t)k * shard_max;
                uint64_t t0 = terse__now_ns();
                sum_hosts(x->hsum, from, H, h, x->hlen, divide, (float)c->nranks);
                terse__comm_codec_time(c, t0);
            }
            if (g) rc = step_out(&w, x->s, buf + x->off, x->m);
        }
    }
    clock_end(c, &clk);
    return rc;
}

/* Every rank alike (lseg_on is the job's, the rest its host table; the
 * segments exist only where terse__comm_hier_seg_fits holds). */
int terse__hier_seg_fits(const terse_comm *c) {
    return c->lseg_on && terse__comm_hier_seg_fits(c);
}

/* The barrier in a job over several hosts, with each host's segment: every
 * local rank publishes its arrival in the segment; each host's first rank
 * waits for its host's, then the first ranks run the dissemination barrier
 * among themselves (barrier.c; ceil(log2 H) rounds across hosts instead of
 * ceil(log2 N) over the routed pairs), then release their hosts through the
 * segment. Nobody leaves before everyone has entered: a host's release
 * follows every host's first rank's arrival, which followed its host's. */
terse_status terse__barrier_hier_seg(terse_comm *c) {
    terse__seg *g = c->lseg; /* NULL on a host of one rank */
    const int H = c->nhosts, h = c->host_index, l = c->local_rank;
    const uint64_t k = ++c->lseg_bar;
    int local[TERSE__COMM_MAX_REQS] = {0}, rail[TERSE__COMM_MAX_REQS] = {0};
    terse__hier_peers(c, local, rail);
    seg_wait w = {c, g, l, local, 1, terse__now_ns()};
    terse__comm_next_phase(c); /* every rank: the phases stay in step */
    if (g) flag_store(terse__seg_flags_of(g, l), FLAG_BAR, k);
    if (l != 0) return wait_members(&w, FLAG_REL, k, 1);
    if (g) TERSE_CHECK(wait_all(&w, FLAG_BAR, k));
    static const char none;
    char sink;
    uint64_t round = 0;
    for (int dist = 1; dist < H; dist *= 2, round++) {
        const uint64_t tag = terse__comm_tag(c, round);
        TERSE_CHECK(terse__comm_irecv(c, terse__hier_rank_at(c, (h - dist % H + H) % H, 0), tag,
                                      &sink, 0, TERSE__BYTES_FRAMING, &c->reqs[0]));
        TERSE_CHECK(terse__comm_isend(c, terse__hier_rank_at(c, (h + dist) % H, 0), tag, &none,
                                      0, TERSE__BYTES_FRAMING, &c->reqs[1]));
        TERSE_CHECK(terse__comm_wait(c, c->reqs, 2));
    }
    if (g) flag_store(terse__seg_flags_of(g, 0), FLAG_REL, k);
    return TERSE_OK;
}

/* ---- the compressed hierarchical all-reduce over each host's segment ----
 *
 * codec-hier (codec_hier_allreduce.c: the plan, the error bound, the error
 * feedback per segment on its owner) for fixed-size codecs with each
 * host's segment: the tensor is cut into T chunks of S segments, each
 * chunk no larger than a segment step (terse__codec_hier_parts), and chunk
 * t is a step of the segment:
 *   1. every local rank copies chunk t into its input block (with its
 *      count, op and the codec's cut digest: a member whose codec or cut
 *      differs fails the step with TERSE_ERR_CODEC_MISMATCH);
 *   2. the owner of segment t S + l sums it over the input blocks in
 *      local-rank order into the output block, encodes that host sum
 *      (through its residual) and exchanges the message with its rail;
 *   3. one step later it decodes the H messages in host order into the
 *      output block, and every local rank copies the chunk out.
 * The same arithmetic per segment as codec-hier, on another cut (chunks of
 * half a segment step, not of two ring chunks a shard): every rank ends
 * with the same bits. */
#include "compress/aggregate.h"

#define CSEG(t, j) ((size_t)(t) * (size_t)S + (size_t)(j))

/* Chunk t's span of the buffer. */
static void chunk_span(const terse__segments *g, int S, size_t t, size_t *off, size_t *len) {
    *off = g->off[CSEG(t, 0)];
    *len = g->off[CSEG(t, S - 1)] + g->len[CSEG(t, S - 1)] - *off;
}

typedef struct {
    uint64_t s;
    size_t off, len; /* the chunk's span */
    float *hs;       /* this owner's segment: its host sum, then the result */
    size_t req0, nreq;
} codec_step;

int terse__codec_hier_seg_fits(const terse_comm *c, const terse__segments *g) {
    const int S = c->local_min;
    if (!g || g->nranks % (uint32_t)S) return 0;
    const size_t B = terse__comm_seg_step_bytes(c) / sizeof(float), T = g->nranks / (size_t)S;
    for (size_t t = 0; t < T; t++) {
        size_t off, len;
        chunk_span(g, S, t, &off, &len);
        if (len > B) return 0;
    }
    return 1;
}

terse_status terse__allreduce_codec_hier_seg(terse_comm *c, float *buf, terse_codec *codec,
                                             terse_op op, const terse__segments *g) {
    terse__seg *sg = c->lseg; /* NULL on a host of one rank */
    const int S = c->local_min, H = c->nhosts, l = c->local_rank, h = c->host_index;
    const int owner = l < S;
    const size_t T = g->nranks / (size_t)S;
    const size_t slot = (g->max_bound + 63) & ~(size_t)63;
    if (slot > SIZE_MAX / (2 * (size_t)H))
        return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: scratch for %d messages overflows",
                           c->rank, H);
    /* chunk t's H messages at msg + (t % 2) H slot; the rail's digests */
    uint8_t *msg = terse__comm_scratch(c, 0, 2 * (size_t)H * slot);
    uint64_t *rh = terse__comm_scratch(c, 2, (size_t)H * sizeof(uint64_t));
    if (!msg || !rh) return TERSE_ERR_NOMEM;
#define CMSG(t, q) (msg + ((size_t)((t) % 2) * (size_t)H + (size_t)(q)) * slot)
    int local[TERSE__COMM_MAX_REQS] = {0}, rail[TERSE__COMM_MAX_REQS] = {0};
    terse__hier_peers(c, local, rail);
    const uint64_t digest = terse__codec_cut_digest(codec);
    const float alpha = op == TERSE_OP_AVG ? 1.0f / (float)c->nranks : 1.0f;
    const uint64_t n = terse_codec_elements(codec), opv = op == TERSE_OP_AVG;
    seg_wait w = {c, sg, l, local, 1, terse__now_ns()};
    const call_clock clk = clock_start(c);

    /* the rail's digests (the host's are checked in the segment) */
    terse__comm_next_phase(c);
    size_t nreq = 0;
    rh[h] = digest;
    for (int q = 0; q < H && owner; q++) {
        if (q == h) continue;
        TERSE_CHECK(terse__comm_irecv(c, rail[q], terse__comm_tag(c, 0), &rh[q], sizeof(uint64_t),
                                      TERSE__BYTES_FRAMING, &c->reqs[nreq++]));
        TERSE_CHECK(terse__comm_isend(c, rail[q], terse__comm_tag(c, 0), &rh[h], sizeof(uint64_t),
                                      TERSE__BYTES_FRAMING, &c->reqs[nreq++]));
    }
    TERSE_CHECK(terse__comm_wait(c, c->reqs, nreq));
    for (int q = 0; q < H && owner; q++)
        if (rh[q] != digest) {
            c->desc_failed = c->desc_on; /* told to the others through the store */
            return TERSE_ERROR(TERSE_ERR_CORRUPT,
                               "rank %d: rank %d's codec or its cut into %u segments differs "
                               "from this rank's '%s' (do all ranks use the same spec and "
                               "shape?)",
                               c->rank, rail[q], g->nranks, terse_codec_spec(codec));
        }

    codec_step st[2] = {{0}, {0}};
    terse_status rc = TERSE_OK;
    for (size_t t = 0; t <= T && rc == TERSE_OK; t++) {
        if (t < T) { /* chunk t: in, the host sum, encode, the rail */
            codec_step *x = &st[t & 1];
            x->s = ++c->lseg_step;
            chunk_span(g, S, t, &x->off, &x->len);
            const int p = (int)(x->s & 1);
            rc = terse__comm_poll_abort(c, "in the compressed hierarchical all-reduce");
            if (rc == TERSE_OK && sg) rc = step_in(&w, x->s, buf + x->off, x->len, n, opv, digest);
            if (rc != TERSE_OK) break;
            terse__comm_next_phase(c); /* every rank: the tags agree */
            x->nreq = 0;
            x->req0 = (t & 1) ? TERSE__COMM_MAX_REQS / 2 : 0;
            if (owner) {
                const size_t sgi = CSEG(t, l), rel = g->off[sgi] - x->off, len = g->len[sgi];
                uint64_t t0 = terse__now_ns();
                if (sg) {
                    x->hs = terse__seg_out(sg, p) + rel;
                    sum_share(sg, p, rel, len, x->hs, 0, 1.0f);
                } else {
                    x->hs = buf + g->off[sgi];
                }
                size_t mlen = 0;
                rc = terse__codec_encode_segment(codec, (uint32_t)sgi, x->hs, CMSG(t, h), slot,
                                                 &mlen);
                const size_t mb = terse_codec_bound(g->child[sgi]);
                if (rc == TERSE_OK) rc = terse__codec_check_fixed(codec, c->rank, mlen, mb);
                terse__comm_codec_time(c, t0);
                const uint64_t tag = terse__comm_tag(c, 0);
                for (int q = 0; q < H && rc == TERSE_OK; q++) {
                    if (q == h) continue;
                    rc = terse__comm_irecv(c, rail[q], tag, CMSG(t, q), mb, TERSE__BYTES_PAYLOAD,
                                           &c->reqs[x->req0 + x->nreq++]);
                    if (rc == TERSE_OK)
                        rc = terse__comm_isend(c, rail[q], tag, CMSG(t, h), mb,
                                               TERSE__BYTES_PAYLOAD,
                                               &c->reqs[x->req0 + x->nreq++]);
                }
                if (rc != TERSE_OK) break;
            }
        }
        if (t >= 1) { /* chunk t - 1: decode in host order, out */
            codec_step *x = &st[(t - 1) & 1];
            if (owner) {
                rc = terse__comm_wait(c, &c->reqs[x->req0], x->nreq);
                if (rc != TERSE_OK) break;
                const size_t sgi = CSEG(t - 1, l);
                const size_t mb = terse_codec_bound(g->child[sgi]);
                uint64_t t0 = terse__now_ns();
                for (int q = 0; q < H && rc == TERSE_OK; q++) {
                    rc = terse__codec_decode_segment(codec, (uint32_t)sgi, CMSG(t - 1, q), mb,
                                                     x->hs, alpha, q > 0);
                    if (rc != TERSE_OK) {
                        char why[400];
                        snprintf(why, sizeof why, "%s", terse__comm_last_sentence());
                        rc = TERSE_ERROR(rc, "rank %d: decoding rank %d's message for segment "
                                             "%zu: %s",
                                         c->rank, rail[q], sgi, why);
                    }
                }
                terse__comm_codec_time(c, t0);
                if (rc != TERSE_OK) break;
            }
            if (sg) rc = step_out(&w, x->s, buf + x->off, x->len);
        }
    }
#undef CMSG
    if (rc == TERSE_OK) terse__codec_segments_done(codec);
    clock_end(c, &clk);
    return rc;
}
#undef CSEG
