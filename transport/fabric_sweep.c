/* The sweep of rxm's unexpected queue (TERSE_SWEEP=1): peeks, claims
 * into the early store where a receive finds its message later, and the
 * discarding of messages from addresses that are no rank. fabric_msg.c
 * calls it from its progress rounds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "transport/fabric_impl.h"

/* ---------------------------------------------------------------- strangers
 *
 * rxm only: tcp (libfabric's net) stops reading a connection at a message
 * no posted receive matches, so a stranger's bytes stay in the sockets.
 *
 * tcp;ofi_rxm accepts a connection from any address. A message that
 * arrives on one from an address that is no rank's matches no receive we
 * post (ours name their source), so rxm keeps it in its unexpected queue
 * forever: 100,000 messages of 4 KiB grew a rank by 1.6 GB, and the
 * queue's length made every receive so slow that the peer timed out. rxm
 * cannot be told to refuse them, and the queue is reachable only through
 * peeks, so with TERSE_SWEEP=1 (off by default: SECURITY.md says why) the
 * progress loop sweeps it:
 *
 *  - every SWEEP_NS, a peek at the oldest message (any source). If no
 *    other rank has a message with its tag queued, it is a stranger's (or
 *    a marker of ours, see below): drain.
 *  - A drain sends this rank a marker (an unguessable tag, chunk index
 *    0xffff, which no chunk uses) and, once the marker is queued, moves
 *    every rank's queued message out of the queue into the early store
 *    (terse's memory, at most EARLY_BUDGET bytes, oldest evicted, where
 *    the receive finds it when it is posted and authenticates it as if it
 *    had just arrived). What is left ahead of the marker is strangers'
 *    only: discarding peeks drop the oldest message until the marker.
 *  - After a stranger's message, every progress round drains for
 *    ATTACK_NS.
 *
 * Only eager messages (at most rxm's eager limit) are moved: a claimed
 * larger one makes rxm read it from its sender, and rxm 1.17 crashes when
 * that sender's connection has closed. While a rank's larger message waits
 * in the queue for its receive, the drain waits too. Discarding never
 * reads, so a stranger's message of any size is dropped safely.
 *
 * The peak held during a fast flood is not bounded: every peek also runs
 * rxm's progress, which reads more from the sockets (SECURITY.md). The
 * cost without an attack is one peek per SWEEP_NS. */
#define SWEEP_NS 100000000u
#define SWEEP_MAX 16384
#define EARLY_BUDGET ((size_t)32 << 20)
#define ATTACK_NS 1000000000u   /* drain every round this long after a stranger's message */
#define MARKER_LOST_NS 1000000000u /* a marker not seen this long is given up */

static terse__fabric_early *early_find(terse__fabric *f, int peer, uint64_t tag,
                                       terse__fabric_early **prev) {
    terse__fabric_early *q = NULL;
    for (terse__fabric_early *e = f->early_head; e; q = e, e = e->next)
        if (e->peer == peer && e->tag == tag && e->state != TERSE__EARLY_DISCARDING) {
            if (prev) *prev = q;
            return e;
        }
    return NULL;
}

static void early_unlink(terse__fabric *f, terse__fabric_early *e, terse__fabric_early *prev) {
    if (prev) prev->next = e->next;
    else f->early_head = e->next;
    if (f->early_tail == e) f->early_tail = prev;
    f->early_bytes -= e->len;
}

/* The chunk (peer, tag) from the early store into p (n bytes) and mac:
 * 1 and its length in *got, 0 while its bytes are still
 * coming, -1 when the store has none. */
int terse__fabric_early_take(terse__fabric *f, int peer, uint64_t tag, uint8_t *p, size_t n,
                             uint8_t *mac, size_t *got) {
    terse__fabric_early *prev = NULL, *e = early_find(f, peer, tag, &prev);
    if (!e) return -1;
    if (e->state != TERSE__EARLY_READY) return 0;
    const size_t extra = f->mac ? TERSE__WIRE_MAC : 0;
    size_t body = e->got >= extra ? e->got - extra : 0;
    if (p && body) memcpy(p, e->data, body < n ? body : n);
    if (extra && e->got >= extra) memcpy(mac, e->data + body, extra);
    else if (extra) memset(mac, 0, extra);
    *got = e->got;
    early_unlink(f, e, prev);
    free(e);
    return 1;
}

/* A claim's bytes arrived (or failed: the entry goes). */
void terse__fabric_early_done(terse__fabric *f, void *ctx, size_t len, int failed) {
    terse__fabric_early *e = ctx, *prev = NULL;
    for (terse__fabric_early *q = f->early_head; q && q != e; q = q->next) prev = q;
    if (prev ? prev->next != e : f->early_head != e) return; /* not ours: ignore */
    if (e->state == TERSE__EARLY_RECEIVING && f->early_receiving) f->early_receiving--;
    if (failed || e->state == TERSE__EARLY_DISCARDING) {
        early_unlink(f, e, prev);
        free(e);
        return;
    }
    e->state = TERSE__EARLY_READY;
    e->got = len;
}

/* Post a peek (FI_PEEK, with FI_DISCARD or FI_CLAIM in flags) on behalf
 * of ctx and wait for its answer, completing what else the CQ holds
 * meanwhile. 1: found (f->peek_tag, f->peek_len), 0: none, -1: *st. */
static int peek(terse__fabric *f, fi_addr_t src, uint64_t tag, uint64_t ignore, uint64_t flags,
                void *ctx, terse_status *st) {
    struct fi_msg_tagged m;
    memset(&m, 0, sizeof m);
    m.addr = src;
    m.tag = tag;
    m.ignore = ignore;
    m.context = ctx;
    f->peek_wait = ctx;
    f->peek_state = 0;
    terse__fabric_enter(f, -1, "fi_trecvmsg(FI_PEEK)");
    ssize_t ret = fi_trecvmsg(f->ep, &m, flags | FI_PEEK);
    terse__fabric_leave(f);
    if (atomic_load(&f->abandoned)) {
        *st = terse__fabric_fail_abandoned(f);
        return -1;
    }
    /* rxm answers at once (the answer is in the CQ before the call
     * returns); the bound only guards against a provider that does not. */
    for (int k = 0; ret == 0 && f->peek_state == 0 && k < 1000; k++) {
        size_t ev = 0;
        *st = terse__fabric_read_cq(f, &ev);
        if (*st != TERSE_OK) return -1;
    }
    f->peek_wait = NULL;
    int found = ret == 0 && f->peek_state == 1;
    f->peek_state = 0;
    return found;
}

static void early_evict(terse__fabric *f) {
    terse__fabric_early *prev = NULL;
    for (terse__fabric_early *e = f->early_head; e; prev = e, e = e->next) {
        if (e->state != TERSE__EARLY_READY) continue;
        uint64_t n = ++f->early_evicted;
        if ((n & (n - 1)) == 0)
            fprintf(stderr,
                    "terse: rank %d: the store for messages moved out of the provider's queue is "
                    "full (%zu MiB): dropped the oldest, %zu bytes from rank %d (tag %#llx; %llu "
                    "dropped so far); its receive will time out\n",
                    f->rank, EARLY_BUDGET >> 20, e->len, e->peer, (unsigned long long)e->tag,
                    (unsigned long long)n);
        early_unlink(f, e, prev);
        free(e);
        return;
    }
}

/* Post the receive of a claimed message into its entry (or, for one
 * marked DISCARDING, drop it); -FI_EAGAIN (rxm is out of receive entries)
 * leaves it claimed, to be posted again. */
static terse_status claim_post(terse__fabric *f, terse__fabric_early *e) {
    const int drop = e->state == TERSE__EARLY_DISCARDING;
    struct iovec iov = {e->data, e->len};
    struct fi_msg_tagged m;
    memset(&m, 0, sizeof m);
    m.msg_iov = e->len && !drop ? &iov : NULL;
    m.iov_count = e->len && !drop ? 1 : 0;
    m.addr = f->addrs[e->peer];
    m.tag = e->tag;
    m.context = &e->ctx;
    terse__fabric_enter(f, e->peer, "fi_trecvmsg(FI_CLAIM)");
    ssize_t ret = fi_trecvmsg(f->ep, &m, FI_CLAIM | (drop ? FI_DISCARD : 0));
    terse__fabric_leave(f);
    if (atomic_load(&f->abandoned)) return terse__fabric_fail_abandoned(f);
    if (ret == -FI_EAGAIN && !drop) return TERSE_OK; /* still TERSE__EARLY_CLAIMING */
    if (ret != 0) {
        terse__fabric_early_done(f, e, 0, 1);
        return TERSE_OK;
    }
    if (!drop) {
        e->state = TERSE__EARLY_RECEIVING;
        f->early_receiving++;
    }
    return TERSE_OK;
}

/* Move peer's oldest queued message (tag, len bytes: eager) into the
 * early store; *removed says whether it left the queue. */
static terse_status claim(terse__fabric *f, int peer, uint64_t tag, size_t len, int *removed) {
    terse_status st = TERSE_OK;
    *removed = 0;
    if (len > f->rxm_eager || f->register_mr || f->early_receiving >= TERSE__EARLY_RECEIVING_MAX)
        return TERSE_OK;
    while (f->early_bytes + len > EARLY_BUDGET) {
        size_t before = f->early_bytes;
        early_evict(f);
        if (f->early_bytes == before) return TERSE_OK; /* all still on the way */
    }
    terse__fabric_early *e = malloc(sizeof *e + (len ? len : 1));
    if (!e) return TERSE_OK; /* it stays queued; the next drain tries again */
    memset(e, 0, sizeof *e);
    e->peer = peer;
    e->tag = tag;
    e->len = len;
    e->state = TERSE__EARLY_CLAIMING;
    int got = peek(f, f->addrs[peer], tag, 0, FI_CLAIM, &e->ctx, &st);
    if (got <= 0) {
        free(e);
        return got < 0 ? st : TERSE_OK;
    }
    /* The claim took peer's oldest message with this tag: the one looked
     * at, so of this length. Never receive into less, all the same. */
    if (f->peek_len < len) e->len = f->peek_len;
    if (f->peek_len > len) e->state = TERSE__EARLY_DISCARDING;
    if (f->early_tail) f->early_tail->next = e;
    else f->early_head = e;
    f->early_tail = e;
    f->early_bytes += e->len;
    *removed = 1; /* a DISCARDING one is dropped: its receive times out naming peer */
    return claim_post(f, e);
}

/* Does another rank have a message with this tag queued? *owner: which
 * (-1: none). One scan of the queue per rank. */
static terse_status head_owner(terse__fabric *f, uint64_t tag, int *owner) {
    terse_status st = TERSE_OK;
    *owner = -1;
    for (int p = 0; p < f->nranks; p++) {
        if (p == f->rank) continue; /* ranks send themselves nothing but markers */
        int got = peek(f, f->addrs[p], tag, 0, 0, &f->peek_ctx, &st);
        if (got < 0) return st;
        if (got) {
            *owner = p;
            return TERSE_OK;
        }
    }
    return TERSE_OK;
}

static void count_stranger(terse__fabric *f) {
    uint64_t n = ++f->stranger_drops;
    if (n == 1 || ((n & (n - 1)) == 0 && n >= 1024))
        fprintf(stderr,
                "terse: rank %d: dropped %llu message%s from addresses that are no rank of this "
                "job: a process outside the job is sending to this rank's port\n",
                f->rank, (unsigned long long)n, n == 1 ? "" : "s");
}

/* See "Strangers" above. */
static terse_status drain(terse__fabric *f) {
    terse_status st = TERSE_OK;
    const uint64_t now = terse__now_ns();
    if (f->marker_pending && now - f->marker_sent_ns > MARKER_LOST_NS) f->marker_pending = 0;
    if (!f->marker_pending) {
        uint64_t x = f->marker_rng ? f->marker_rng : (now | 1) ^ ((uint64_t)f->rank << 32);
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        f->marker_rng = x;
        f->marker_tag = TERSE__MARKER_CHUNK | (x & (((uint64_t)1 << TERSE__TAG_BITS) - 1)) | 1;
        static const uint8_t none = 0;
        terse__fabric_enter(f, f->rank, "fi_tinject");
        ssize_t ret = fi_tinject(f->ep, &none, 0, f->addrs[f->rank], f->marker_tag);
        terse__fabric_leave(f);
        if (atomic_load(&f->abandoned)) return terse__fabric_fail_abandoned(f);
        if (ret != 0) return TERSE_OK; /* -FI_EAGAIN (connecting to ourselves): next round */
        f->marker_pending = 1;
        f->marker_sent_ns = now;
    }
    /* The marker arrives within our own progress: one look per drain
     * (each look scans the queue and reads more from the sockets). Any
     * source: the tag is unguessable. */
    int got = peek(f, FI_ADDR_UNSPEC, f->marker_tag, 0, 0, &f->peek_ctx, &st);
    if (got <= 0) return got < 0 ? st : TERSE_OK;
    /* Claims rxm had no room to post yet go first. */
    for (terse__fabric_early *e = f->early_head; e; e = e->next)
        if (e->state == TERSE__EARLY_CLAIMING) {
            TERSE_CHECK(claim_post(f, e));
            if (e->state == TERSE__EARLY_CLAIMING) return TERSE_OK; /* still no room */
        }
    /* Every rank's queued message into the store. */
    for (int p = 0; p < f->nranks; p++) {
        if (p == f->rank) continue;
        for (int k = 0;; k++) {
            got = peek(f, f->addrs[p], 0, ~(uint64_t)0, 0, &f->peek_ctx, &st);
            if (got < 0) return st;
            if (!got) break;
            int removed = 0;
            TERSE_CHECK(claim(f, p, f->peek_tag, f->peek_len, &removed));
            if (!removed || k > 256) return TERSE_OK; /* it waits for its receive: so do we */
        }
    }
    /* Strangers' only, up to the marker: discard the oldest (a discard
     * never reads from the sender, whatever the size). */
    for (int k = 0; k < SWEEP_MAX; k++) {
        got = peek(f, FI_ADDR_UNSPEC, 0, ~(uint64_t)0, FI_DISCARD, &f->peek_ctx, &st);
        if (got <= 0) return got < 0 ? st : TERSE_OK;
        if (f->peek_tag == f->marker_tag) {
            f->marker_pending = 0;
            return TERSE_OK;
        }
        count_stranger(f);
        f->attack_until_ns = terse__now_ns() + ATTACK_NS;
    }
    return TERSE_OK;
}

terse_status terse__fabric_sweep(terse__fabric *f) {
    uint64_t now = terse__now_ns();
    /* Strangers were seen lately: drain every round, whatever heads the
     * queue (a rank's early message there would shelter them). */
    if (now < f->attack_until_ns) return drain(f);
    if (now - f->sweep_last_ns < SWEEP_NS) return TERSE_OK;
    f->sweep_last_ns = now;
    terse_status st = TERSE_OK;
    int got = peek(f, FI_ADDR_UNSPEC, 0, ~(uint64_t)0, 0, &f->peek_ctx, &st);
    if (got <= 0) return got < 0 ? st : TERSE_OK;
    if ((f->peek_tag & TERSE__MARKER_CHUNK) == TERSE__MARKER_CHUNK) return drain(f);
    int owner;
    TERSE_CHECK(head_owner(f, f->peek_tag, &owner));
    /* A rank's message waits there for its receive; anything else is a
     * stranger's. */
    return owner < 0 ? drain(f) : TERSE_OK;
}

uint64_t terse__fabric_stranger_drops(const terse__fabric *f) {
    return f ? f->stranger_drops + (f->side ? f->side->stranger_drops : 0) : 0;
}
