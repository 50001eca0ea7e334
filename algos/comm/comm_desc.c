/* The call descriptor: every collective tells the next rank in a ring what
 * it is -- its kind, its element or byte count, its op or root, its codec's
 * name -- in a 64-byte message of its own, posted before the data moves and
 * checked while it does. Ranks that passed different arguments then fail at
 * once, on every provider and path, with a sentence naming both values and
 * the rank that differs; without it they could wait out the whole timeout
 * (the algorithm is chosen from the size, so two ranks may run different
 * ones whose messages never match) or blame an attacker (a chunk longer than
 * the receive fails its MAC). The rank that finds the mismatch tells the
 * others through the store (terse__store_tell_failed), so the ranks that
 * are not its neighbours fail with the same sentence instead of timing out.
 * Cost: one 64-byte send and receive per call, overlapped with the data
 * (but on shm: see terse__comm_desc_start).
 * Parameter-server requests have their own headers and carry none.
 *
 * With the host's shared segment (every rank on one host: comm_segment.c)
 * the descriptors go through it instead of libfabric: call k's descriptor
 * in slot k % (ranks + 1) of this rank's ring, then its number published
 * (release); the next rank reads it once the number says it is there. A
 * rank publishes call k + 1 only after its previous rank published call k
 * (both waits below), so a rank is at most ranks - 1 calls ahead of the
 * one reading its ring, and a slot is never rewritten while read (the
 * check for it is a guard only). So a
 * dense all-reduce over the segment touches no libfabric at all, and a
 * blocking one can run on the caller's thread (algos/engine/engine_api.c):
 * nothing in it can spin on a dead peer's libfabric lock. */
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "algos/comm/comm.h"
#include "common/bytes.h"
#include "common/error.h"
#include "transport/segment.h"

#define DESC_MAGIC 0x43534544u /* "DESC" */
/* The message index of the descriptor in the tag of the phase the call
 * starts in: the largest, which no algorithm uses. */
#define DESC_MSG ((1ull << TERSE__TAG_MSG_BITS) - 1)

const char *terse__comm_kind_name(int kind) {
    switch ((terse__op_kind)kind) {
    case TERSE__OP_ALLREDUCE: return "terse_allreduce";
    case TERSE__OP_BROADCAST: return "terse_broadcast";
    case TERSE__OP_ALLGATHER: return "terse_allgather";
    case TERSE__OP_BARRIER: return "terse_barrier";
    case TERSE__OP_GROUP: return "terse_group_end";
    case TERSE__OP_EXT: return "terse_ps";
    }
    return "terse request";
}

/* [0,4) magic [4,8) kind [8,16) count [16,20) op or root [20,24) 0
 * [24,64) the codec's name, NUL padded ("" for none) */
static void encode(uint8_t *d, int kind, uint64_t count, uint32_t arg, const char *codec) {
    memset(d, 0, TERSE__COMM_DESC_BYTES);
    terse__put_u32(d, DESC_MAGIC);
    terse__put_u32(d + 4, (uint32_t)kind);
    terse__put_u64(d + 8, count);
    terse__put_u32(d + 16, arg);
    if (codec) {
        size_t n = strcspn(codec, ":");
        if (n > TERSE__COMM_DESC_BYTES - 25) n = TERSE__COMM_DESC_BYTES - 25;
        memcpy(d + 24, codec, n);
    }
}

/* ---- through the segment ---- */

static terse_status compare(terse_comm *c);

static int prev_rank(const terse_comm *c) { return (c->rank + c->nranks - 1) % c->nranks; }

/* Copy the previous rank's descriptor of this call into desc_theirs if it
 * is there: 1 copied, 0 not yet, -1 overwritten already (it ran ahead). */
static int seg_take(terse_comm *c) {
    terse__seg_flags *f = terse__seg_flags_of(c->seg, prev_rank(c));
    const uint64_t k = c->desc_calls, ring = (uint64_t)terse__seg_descs(c->seg);
    uint64_t seen = atomic_load_explicit(&f->desc_seq, memory_order_acquire);
    if (seen < k) return 0;
    if (seen + 1 >= k + ring) return -1; /* cannot happen (above): not compared */
    memcpy(c->desc_theirs, terse__seg_desc(c->seg, prev_rank(c), (int)(k % ring)),
           TERSE__COMM_DESC_BYTES);
    return 1;
}

static terse_status seg_check(terse_comm *c) {
    if (c->desc_checked) return TERSE_OK;
    int got = seg_take(c);
    if (got == 0) return TERSE_OK;
    c->desc_checked = 1;
    if (got < 0) return TERSE_OK; /* ran ahead: not compared */
    terse_status s = compare(c);
    if (s != TERSE_OK) c->desc_failed = 1;
    return s;
}

/* Wait for the previous rank's descriptor of this call (and compare it),
 * with the liveness and abort checks of every wait and the timeout. */
static terse_status seg_wait(terse_comm *c) {
    const uint64_t t0 = terse__now_ns(), limit = (uint64_t)c->timeout_ms * 1000000ull;
    uint64_t polled = t0;
    for (unsigned spins = 0; !c->desc_checked; spins++) {
        terse_status s = seg_check(c);
        if (s != TERSE_OK || c->desc_checked) return s;
        if (spins < 64) {
            atomic_signal_fence(memory_order_seq_cst);
            continue;
        }
        uint64_t now = terse__now_ns();
        if (now - polled >= 1000000ull) {
            polled = now;
            s = terse__comm_check_alive(c);
            if (s == TERSE_OK) s = terse__comm_poll_abort(c, "waiting for a call descriptor");
            if (s != TERSE_OK) return s;
        }
        if (now - t0 >= limit) {
            const int lag = terse__seg_laggard(c->seg, c->rank, prev_rank(c));
            char behind[160] = "";
            if (lag >= 0 && lag != prev_rank(c))
                snprintf(behind, sizeof behind, "; the rank furthest behind is rank %d, which "
                         "rank %d may be waiting for", lag, prev_rank(c));
            s = TERSE_ERROR(TERSE_ERR_TIMEOUT,
                            "%s on rank %d: rank %d did not start its collective number %llu "
                            "within %d ms (the host's shared segment says)%s: it is stopped, "
                            "stuck, or no longer running the same collectives",
                            terse__comm_kind_name(c->desc_kind), c->rank, prev_rank(c),
                            (unsigned long long)c->desc_calls, c->timeout_ms, behind);
            return terse__comm_explain(c, s, 0, 0);
        }
        if (now - t0 < 200000ull) {
            sched_yield();
        } else {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
    return TERSE_OK;
}

terse_status terse__comm_desc_start(terse_comm *c, int kind, uint64_t count, uint32_t arg,
                                    const char *codec) {
    const int unblocked = c->desc_unblocked; /* for this call only */
    c->desc_unblocked = 0;
    c->desc_on = 0;
    if (c->nranks < 2 || !c->fabric || c->params.check_calls_off) return TERSE_OK;
    encode(c->desc_mine, kind, count, arg, codec);
    c->desc_kind = kind;
    terse__comm_next_phase(c); /* a tag of its own, whatever the algorithm */
    if (c->seg) {
        const uint64_t k = ++c->desc_calls;
        memcpy(terse__seg_desc(c->seg, c->rank, (int)(k % (uint64_t)terse__seg_descs(c->seg))),
               c->desc_mine, TERSE__COMM_DESC_BYTES);
        atomic_store_explicit(&terse__seg_flags_of(c->seg, c->rank)->desc_seq, k,
                              memory_order_release);
        c->desc_on = 1;
        c->desc_checked = 0;
        /* as over libfabric's shm (below): the data waits for the previous
         * rank's word */
        return seg_wait(c);
    }
    const int next = (c->rank + 1) % c->nranks, prev = (c->rank + c->nranks - 1) % c->nranks;
    uint64_t tag = terse__comm_tag(c, DESC_MSG);
    TERSE_CHECK(terse__comm_irecv(c, prev, tag, c->desc_theirs, TERSE__COMM_DESC_BYTES,
                                  TERSE__BYTES_CONTROL, &c->desc_req[0]));
    TERSE_CHECK(terse__comm_isend(c, next, tag, c->desc_mine, TERSE__COMM_DESC_BYTES,
                                  TERSE__BYTES_CONTROL, &c->desc_req[1]));
    c->desc_on = 1;
    /* shm (libfabric 1.17) spins inside fi_cq_read when a message longer
     * than the posted receive arrives: there the data waits for the
     * previous rank's word. Then a rank whose size differs fails before it
     * sends anything, and so does the next rank, so no rank receives a
     * message of another length; the others hear it from the store. Costs
     * one hop of latency per call on shm only -- and not for a barrier
     * over the hosts' segments (desc_unblocked: it sends nothing through
     * shm, carries no count or op, and completes only if every rank is in
     * a barrier; engine.c). */
    if (!c->desc_block || unblocked) return TERSE_OK;
    TERSE_CHECK(terse__comm_wait(c, &c->desc_req[0], 1));
    return terse__comm_desc_check(c);
}

/* What the previous rank's descriptor says against ours: TERSE_OK, or the
 * error naming both. */
static terse_status compare(terse_comm *c) {
    const uint8_t *a = c->desc_mine, *b = c->desc_theirs;
    const int prev = (c->rank + c->nranks - 1) % c->nranks;
    const char *what = terse__comm_kind_name(c->desc_kind);
    if (terse__get_u32(b) != DESC_MAGIC)
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "%s on rank %d: rank %d's call descriptor is "
                                              "malformed (magic 0x%08x)",
                           what, c->rank, prev, terse__get_u32(b));
    uint32_t kind = terse__get_u32(b + 4), arg = terse__get_u32(b + 16);
    uint64_t count = terse__get_u64(b + 8);
    char codec[TERSE__COMM_DESC_BYTES - 23];
    memcpy(codec, b + 24, sizeof codec - 1);
    codec[sizeof codec - 1] = 0;
    for (char *p = codec; *p; p++)
        if (*p < 0x20 || *p > 0x7e) *p = '?';
    const char *mine = (const char *)a + 24;
    if (kind != (uint32_t)c->desc_kind)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "%s on rank %d: rank %d called %s at this point: every rank must "
                           "start the same collectives in the same order",
                           what, c->rank, prev, terse__comm_kind_name((int)kind));
    if (count != terse__get_u64(a + 8)) {
        const char *unit = c->desc_kind == TERSE__OP_BROADCAST ? "bytes" : "elements";
        return TERSE_ERROR(TERSE_ERR_SHAPE,
                           "%s on rank %d: rank %d passed %llu %s, this rank %llu: every rank "
                           "must pass the same size",
                           what, c->rank, prev, (unsigned long long)count, unit,
                           (unsigned long long)terse__get_u64(a + 8));
    }
    if (arg != terse__get_u32(a + 16))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           c->desc_kind == TERSE__OP_BROADCAST
                               ? "%s on rank %d: rank %d named root %u, this rank root %u: every "
                                 "rank must name the same root"
                               : "%s on rank %d: rank %d passed op %u, this rank op %u: every "
                                 "rank must pass the same op",
                           what, c->rank, prev, arg, terse__get_u32(a + 16));
    if (strcmp(codec, mine) != 0)
        return TERSE_ERROR(TERSE_ERR_CODEC_MISMATCH,
                           "%s on rank %d: rank %d passed codec '%s', this rank '%s': every "
                           "rank must pass the same codec",
                           what, c->rank, prev, codec[0] ? codec : "none",
                           mine[0] ? mine : "none");
    return TERSE_OK;
}

terse_status terse__comm_desc_check(terse_comm *c) {
    if (c->desc_on && c->seg) return seg_check(c);
    if (!c->desc_on || c->desc_checked || !terse__fabric_req_done(&c->desc_req[0]))
        return TERSE_OK;
    c->desc_checked = 1;
    terse_status s = compare(c);
    if (s != TERSE_OK) c->desc_failed = 1;
    return s;
}

/* A failure in the data that another rank's disagreement explains: that
 * rank's word through the store, if it comes within TOLD_GRACE_NS (a loss
 * is not that word: the data path's own sentence stays). The rank that
 * compares the descriptor of the rank whose arguments differ may be two
 * hops away and busy: under ASan with 4 ranks on 2 cores its word came 276
 * ms after a rank's own failure, which then left first and was reported
 * lost to the others. The wait ends as soon as the word comes, and only a
 * call whose data already failed (not a timeout or a loss) waits. */
#define TOLD_GRACE_NS 2000000000ull
static terse_status told_cause(terse_comm *c, terse_status s) {
    if (!c->store || c->store_said || s == TERSE_ERR_TIMEOUT || s == TERSE_ERR_PEER_LOST)
        return s; /* the store's word already, or asked for it (comm.c, explain) */
    return terse__comm_explain(c, s, TOLD_GRACE_NS, 1);
}

terse_status terse__comm_desc_end(terse_comm *c, terse_status s) {
    if (!c->desc_on) return s;
    if (s == TERSE_OK && c->seg) {
        s = seg_wait(c);
    } else if (s == TERSE_OK) {
        s = terse__comm_wait(c, c->desc_req, 2);
        if (s == TERSE_OK) s = terse__comm_desc_check(c);
    } else if (!c->desc_failed) {
        /* The data failed first (a timeout, a size the transport refused):
         * a mismatch the descriptor shows is the better cause, and so is
         * one another rank found and told (a moment's grace for it). */
        terse_status d = terse__comm_desc_check(c);
        if (d != TERSE_OK) s = d;
        else if (s != TERSE_ERR_ABORTED) s = told_cause(c, s);
    }
    c->desc_on = 0;
    c->desc_checked = 0;
    if (c->desc_failed) {
        c->desc_failed = 0;
        /* The ranks that are not our neighbours hear it from the store. */
        terse__store_tell_failed(c->store, s, terse__comm_last_sentence());
    }
    return s;
}
