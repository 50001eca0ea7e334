/* Tagged messages over the endpoint: chunking, posting within the
 * provider's queue depths, completion progress, and waiting with a
 * deadline.
 *
 * A message of len bytes travels as chunks of at most chunk_bytes, chunk i
 * tagged (tag | i << 48) so that chunks match their receives whatever order
 * the provider completes them in. Both sides derive the same chunking from
 * len and chunk_bytes (set_peers checked every rank agrees on the latter).
 * Each request keeps at most TERSE__FABRIC_WINDOW chunks in flight; a
 * completion frees a window place, and the next progress round posts the
 * next chunk. Receives are posted through the same window, as early as it
 * allows.
 *
 * Chunk size: 2 ranks ping-ponging 64 MiB on this 2-core machine (median
 * of 9 runs, GB/s one way) gave shm 4.96 / 5.29 / 4.98 and tcp;ofi_rxm
 * 4.24 / 5.80 / 4.61 for 256 KiB / 1 MiB / 4 MiB chunks; at 1 MiB messages
 * the three were within noise. Smaller chunks pay per-chunk rendezvous
 * costs, larger ones fill the pipeline later; TERSE_CHUNK_BYTES therefore
 * defaults to 1 MiB. The window (2..32) made no difference beyond noise.
 *
 * Limits: the per-direction slot pools (the provider's queue depths, at
 * most 1024) bound what is posted at once; with more than pool/window
 * requests active in one direction, later requests wait for earlier ones
 * to free slots (oldest first). Two messages in flight with the same
 * (peer, tag) may match either way round: callers keep concurrent tags
 * distinct. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "transport/fabric_impl.h"

/* Completions read per fi_cq_read call, and calls per progress round
 * (bounded so that new chunks are posted between batches). */
#define CQ_BATCH 16
#define CQ_ROUNDS 8
/* Idle progress rounds before we start yielding the CPU: ranks often share
 * cores, and a peer that is descheduled cannot send us anything. After a
 * longer silence (a straggler, a dead peer awaiting its timeout) we also
 * nap briefly each round, which costs at most that nap in latency. */
#define IDLE_SPINS 16
#define NAP_AFTER_NS 10000000u
#define NAP_NS 20000
#define ALIVE_PERIOD_NS 1000000u

/* One idle round of a progress loop that saw no event for quiet_ns: nap
 * once that reaches nap_after_ns, else yield after `spins` idle rounds. */
static void back_off(uint64_t quiet_ns, uint64_t nap_after_ns, unsigned *idle, unsigned spins) {
    if (quiet_ns >= nap_after_ns) {
        struct timespec nap = {0, NAP_NS};
        nanosleep(&nap, NULL);
    } else if (++*idle >= spins) {
        sched_yield();
    }
}
/* Largest message injected with its MAC (copied to the stack). */
#define INJECT_STAGE 256

static const char *dir_text(const terse__fabric_req *r) {
    return r->is_send ? "sending to" : "receiving from";
}

/* A failure leaves operations posted that point at caller memory, so the
 * fabric refuses everything but close from then on. */
static terse_status fail(terse__fabric *f, terse_status st) {
    if (f->failed == TERSE_OK) f->failed = st;
    return st;
}

/* An error that concerns one request. Ordinarily it fails the fabric; in
 * tolerant mode (terse__fabric_set_tolerant) it fails only r, whose
 * chunks are no longer posted and whose state the next progress round
 * recycles once nothing of it is in flight. */
static terse_status req_fail(terse__fabric *f, terse__fabric_req *r, terse_status st) {
    int first = r && !r->error;
    if (first) r->error = st; /* its first error is the one to report */
    if (f->tolerant && r && !first) return TERSE_OK; /* its other chunks, cancelled, coming back */
    if (f->tolerant && r) {
        /* Its other chunks come back cancelled; the request is idle (its
         * buffer free) once the last one has. */
        for (size_t i = 0; i < f->tx_slots + f->rx_slots; i++)
            if (f->slots[i].op && f->slots[i].op->req == r) {
                terse__fabric_enter(f, r->peer, "fi_cancel");
                (void)fi_cancel(&f->ep->fid, &f->slots[i].ctx);
                terse__fabric_leave(f);
            }
        return TERSE_OK;
    }
    return fail(f, st);
}

/* A watchdog gave up on this fabric while we were inside the provider. */
static terse_status abandoned(terse__fabric *f) {
    return fail(f, TERSE_ERROR(TERSE_ERR_TIMEOUT,
                               "rank %d: the transport was abandoned while inside %s (a peer "
                               "stopped or died holding its lock)",
                               f->rank, f->provider));
}

static size_t chunk_len(const terse__fabric_op *op, size_t i) {
    size_t off = i * op->chunk_bytes, len = op->req->len;
    if (off >= len) return 0;
    return len - off < op->chunk_bytes ? len - off : op->chunk_bytes;
}

static int is_connection_error(int err) {
    switch (err) {
    case FI_EIO:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_ECONNREFUSED:
    case FI_ENOTCONN:
    case FI_ESHUTDOWN:
    case FI_EHOSTUNREACH:
    case FI_ENETUNREACH:
    case FI_ENETDOWN:
    case FI_ETIMEDOUT:
    case EPIPE:
        return 1;
    default:
        return 0;
    }
}

/* ---------------------------------------------------------------- ops */

static terse__fabric_op *op_get(terse__fabric *f) {
    terse__fabric_op *op = f->op_free;
    if (op) f->op_free = op->next;
    else op = malloc(sizeof *op);
    if (op) memset(op, 0, sizeof *op);
    return op;
}

static void op_link(terse__fabric *f, terse__fabric_op *op) {
    op->prev = f->active_tail;
    op->next = NULL;
    if (f->active_tail) f->active_tail->next = op;
    else f->active_head = op;
    f->active_tail = op;
}

/* Unlink, release the registration, recycle. */
static void op_put(terse__fabric *f, terse__fabric_op *op) {
    if (op->prev) op->prev->next = op->next;
    else if (f->active_head == op) f->active_head = op->next;
    if (op->next) op->next->prev = op->prev;
    else if (f->active_tail == op) f->active_tail = op->prev;
    if (op->mr) fi_close(&op->mr->fid);
    op->mr = NULL;
    op->next = f->op_free;
    f->op_free = op;
}

typedef struct terse__fabric_orphan {
    terse__fabric_req req;
    struct terse__fabric_orphan *next;
} terse__fabric_orphan;

void terse__fabric_release_ops(terse__fabric *f) {
    f->repost = NULL; /* their ops go now */
    f->local_done = NULL;
    while (f->early_head) {
        terse__fabric_early *e = f->early_head;
        f->early_head = e->next;
        free(e);
    }
    f->early_tail = NULL;
    f->early_bytes = f->early_receiving = 0;
    for (size_t i = 0; f->stage_mem && i < f->tx_slots + f->rx_slots; i++) f->slots[i].stage = NULL;
    for (size_t i = 0; f->stage_mem && i < f->nstage; i++)
        f->stage_free[i] = (uint8_t *)f->stage_mem + i * f->chunk_bytes;
    if (f->stage_mem) f->nstage_free = f->nstage;
    while (f->active_head) op_put(f, f->active_head);
    while (f->orphans) {
        terse__fabric_orphan *o = f->orphans;
        f->orphans = o->next;
        free(o);
    }
    while (f->op_free) {
        terse__fabric_op *op = f->op_free;
        f->op_free = op->next;
        free(op);
    }
}

/* Register the request's buffer where the provider demands it
 * (FI_MR_LOCAL), once per request rather than per chunk. */
static terse_status op_register(terse__fabric *f, terse__fabric_op *op) {
    terse__fabric_req *r = op->req;
    uint64_t key = f->mr_prov_key ? 0 : f->next_mr_key++;
    size_t bytes = r->sink && r->len > op->chunk_bytes ? op->chunk_bytes : r->len;
    int ret = fi_mr_reg(f->domain, r->buf, bytes, r->is_send ? FI_SEND : FI_RECV, 0, key, 0,
                        &op->mr, NULL);
    if (ret == 0 && f->mr_endpoint) {
        ret = fi_mr_bind(op->mr, &f->ep->fid, 0);
        if (ret == 0) ret = fi_mr_enable(op->mr);
    }
    if (ret != 0)
        return TERSE_ERROR(TERSE_ERR_TRANSPORT,
                           "rank %d: registering %zu bytes for %s rank %d on %s failed: %s",
                           f->rank, r->len, dir_text(r), r->peer, f->provider, fi_strerror(-ret));
    op->desc = fi_mr_desc(op->mr);
    return TERSE_OK;
}

/* ---------------------------------------------------------------- posting */

static terse_status post_error(terse__fabric *f, terse__fabric_req *r, size_t chunk,
                               int ret) {
    terse_status st = is_connection_error(-ret) ? TERSE_ERR_PEER_LOST : TERSE_ERR_TRANSPORT;
    return req_fail(f, r, TERSE_ERROR(st, "rank %d: posting chunk %zu of %zu for %s rank %d (tag %#llx) "
                                   "on %s failed: %s",
                               f->rank, chunk, r->chunks, dir_text(r), r->peer,
                               (unsigned long long)r->tag, f->provider, fi_strerror(-ret)));
}

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
static int early_take(terse__fabric *f, int peer, uint64_t tag, uint8_t *p, size_t n,
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

/* Post chunk i of op into slot s: one iov, or with TERSE_WIRE=mac two --
 * the bytes and the slot's MAC (computed here for a send). */
static ssize_t post_one(terse__fabric *f, terse__fabric_op *op, terse__fabric_slot *s,
                        size_t i) {
    terse__fabric_req *r = op->req;
    size_t n = chunk_len(op, i);
    uint8_t *p = r->buf ? r->buf + (r->sink ? 0 : i * op->chunk_bytes) : NULL;
    uint64_t tag = r->tag | ((uint64_t)i << TERSE__TAG_BITS);
    uint8_t *stage = NULL;
    if (f->encrypt && r->is_send) { /* the ciphertext goes out of a staging buffer */
        if (n > f->chunk_bytes) return -FI_EMSGSIZE; /* chunks grew past 2^16 per message */
        if (!f->nstage_free) return -FI_EAGAIN;
        stage = f->stage_free[--f->nstage_free];
    }
    if (!r->is_send && f->early_head) { /* claimed out of the provider's queue already? */
        size_t got = 0;
        int has = early_take(f, r->peer, tag, p, n, s->mac, &got);
        if (has == 0) return -FI_EAGAIN; /* its bytes are still on the way */
        if (has > 0) {                   /* completes in the next progress round */
            s->local_got = got;
            s->op = op;
            s->chunk = i;
            s->stage = NULL;
            s->local_next = f->local_done; /* not next_free: the caller still unlinks s by it */
            f->local_done = s;
            return 0;
        }
    }
    s->op = op;
    s->chunk = i;
    s->stage = stage;
    ssize_t ret;
    terse__fabric_enter(f, r->peer, r->is_send ? "fi_tsend" : "fi_trecv");
    if (!f->mac) {
        ret = r->is_send ? fi_tsend(f->ep, p, n, op->desc, f->addrs[r->peer], tag, &s->ctx)
                         : fi_trecv(f->ep, p, n, op->desc, f->addrs[r->peer], tag, 0, &s->ctx);
    } else {
        int sealed = !r->is_send ? 1
                     : stage     ? terse__fabric_seal(f, r, i, p, n, stage, s->mac)
                                 : terse__fabric_mac(f, r, i, p, n, s->mac);
        if (!sealed) {
            terse__fabric_leave(f);
            if (stage) f->stage_free[f->nstage_free++] = stage, s->stage = NULL;
            s->op = NULL;
            return -FI_EOTHER;
        }
        if (stage) p = stage;
        if (r->is_send && f->tamper_every && ++f->tamper_count % f->tamper_every == 0)
            s->mac[0] ^= 0x5a; /* tests: a relay that flips bits */
        struct iovec iov[2] = {{p, n}, {s->mac, TERSE__WIRE_MAC}};
        void *desc[2] = {op->desc, f->slots_desc};
        size_t k = n ? 0 : 1; /* no zero-length iov entries */
        ret = r->is_send
                  ? fi_tsendv(f->ep, iov + k, desc + k, 2 - k, f->addrs[r->peer], tag, &s->ctx)
                  : fi_trecvv(f->ep, iov + k, desc + k, 2 - k, f->addrs[r->peer], tag, 0,
                              &s->ctx);
    }
    terse__fabric_leave(f);
    if (f->trace_tags && ret == 0)
        fprintf(stderr, "terse trace: rank %d posted %s rank %d tag %#llx (%zu bytes)\n", f->rank,
                r->is_send ? "a send to" : "a receive from", r->peer, (unsigned long long)tag, n);
    if (ret != 0 && stage) { /* not posted: the staging buffer goes back */
        f->stage_free[f->nstage_free++] = stage;
        s->stage = NULL;
    }
    if (ret != 0) s->op = NULL;
    return ret;
}

/* Post op's next chunks while its window, the direction's slot pool and
 * the provider (-FI_EAGAIN) allow. *full is set when the provider or pool
 * is out of room, so the caller stops trying this direction this round. */
static terse_status post_chunks(terse__fabric *f, terse__fabric_op *op, int *full) {
    terse__fabric_req *r = op->req;
    terse__fabric_slot **pool = r->is_send ? &f->tx_free : &f->rx_free;
    const size_t window = r->sink ? 1 : TERSE__FABRIC_WINDOW;
    while (!r->error && r->posted < r->chunks && op->inflight < window) {
        terse__fabric_slot *s = *pool;
        if (!s) {
            *full = 1;
            return TERSE_OK;
        }
        size_t i = r->posted, n = chunk_len(op, i);
        ssize_t ret = post_one(f, op, s, i);
        if (atomic_load(&f->abandoned)) return abandoned(f);
        if (ret == -FI_EAGAIN) {
            *full = 1;
            return TERSE_OK;
        }
        if (ret != 0) return post_error(f, r, i, (int)ret);
        *pool = s->next_free;
        r->posted++;
        op->inflight++;
        if (r->is_send) f->bytes_sent += n;
    }
    return TERSE_OK;
}

static void slot_put(terse__fabric *f, terse__fabric_slot *s, int is_send);

/* Give every active request its chance to post, oldest first. */
static terse_status post_pending(terse__fabric *f) {
    /* First the receives a forged chunk consumed (their slots are held,
     * and still counted in their op's inflight). */
    while (f->repost) {
        terse__fabric_slot *s = f->repost;
        terse__fabric_op *op = s->op;
        if (op->req->error) { /* the request failed meanwhile: the slot goes back */
            f->repost = s->next_free;
            op->inflight--;
            slot_put(f, s, 0);
            continue;
        }
        ssize_t ret = post_one(f, op, s, s->chunk);
        if (atomic_load(&f->abandoned)) return abandoned(f);
        if (ret == -FI_EAGAIN) {
            s->op = op; /* post_one let go of it: it stays ours, to post later */
            break;
        }
        f->repost = s->next_free;
        if (ret != 0) {
            size_t chunk = s->chunk;
            op->inflight--;
            slot_put(f, s, 0);
            TERSE_CHECK(post_error(f, op->req, chunk, (int)ret)); /* tolerant: it failed alone */
        }
    }
    int tx_full = 0, rx_full = 0;
    for (terse__fabric_op *op = f->active_head; op && !(tx_full && rx_full); op = op->next) {
        if (op->req->posted == op->req->chunks || op->req->error) continue;
        int *full = op->req->is_send ? &tx_full : &rx_full;
        if (!*full) TERSE_CHECK(post_chunks(f, op, full));
    }
    return TERSE_OK;
}

/* A small single-chunk send needs no completion: fi_tinject copies it out
 * at once. Returns 1 when injected, 0 to fall back to a normal send. */
static int try_inject(terse__fabric *f, terse__fabric_req *r, terse_status *st) {
    static const uint8_t none = 0; /* some providers dislike NULL even for 0 bytes */
    *st = TERSE_OK;
    const size_t extra = f->mac ? TERSE__WIRE_MAC : 0;
    if (!r->is_send || r->chunks != 1 || f->inject_bytes == 0 || r->len + extra > f->inject_bytes ||
        (extra && r->len > INJECT_STAGE))
        return 0; /* an inject size of 0 means the provider cannot inject at all */
    uint8_t stage[INJECT_STAGE + TERSE__WIRE_MAC];
    const void *src = r->len ? r->buf : &none;
    if (extra) { /* bytes || MAC, one contiguous message the receiver scatters */
        if (f->encrypt) {
            if (!terse__fabric_seal(f, r, 0, r->buf, r->len, stage, stage + r->len)) return 0;
        } else {
            if (r->len) memcpy(stage, r->buf, r->len);
            if (!terse__fabric_mac(f, r, 0, r->buf, r->len, stage + r->len)) return 0;
        }
        if (f->tamper_every && ++f->tamper_count % f->tamper_every == 0) stage[r->len] ^= 0x5a;
        src = stage;
    }
    terse__fabric_enter(f, r->peer, "fi_tinject");
    ssize_t ret = fi_tinject(f->ep, src, r->len + extra, f->addrs[r->peer], r->tag);
    terse__fabric_leave(f);
    if (atomic_load(&f->abandoned)) {
        *st = abandoned(f);
        return 1;
    }
    if (ret == -FI_EAGAIN) return 0;
    if (ret != 0) {
        *st = post_error(f, r, 0, (int)ret);
        return 1;
    }
    r->posted = r->done = 1;
    f->bytes_sent += r->len;
    if (f->trace_tags)
        fprintf(stderr, "terse trace: rank %d injected a send to rank %d tag %#llx (%zu bytes)\n",
                f->rank, r->peer, (unsigned long long)r->tag, r->len);
    return 1;
}

static terse__fabric_op *op_of(const terse__fabric *f, const terse__fabric_req *r) {
    for (terse__fabric_op *op = f->active_head; op; op = op->next)
        if (op->req == r) return op;
    return NULL;
}

static terse_status start(terse__fabric *f, int is_send, int peer, uint64_t tag, void *buf,
                          size_t len, terse__fabric_req *req, int sink) {
    const char *what = is_send ? "isend" : "irecv";
    if (!f || !req) return TERSE_ERROR(TERSE_ERR_INVALID, "fabric %s: NULL argument", what);
    if (f->failed)
        return TERSE_ERROR(f->failed, "rank %d: the transport failed earlier; it can only be closed",
                           f->rank);
    if (!f->addrs)
        return TERSE_ERROR(TERSE_ERR_INVALID, "rank %d: fabric %s before set_peers", f->rank, what);
    if (peer < 0 || peer >= f->nranks)
        return TERSE_ERROR(TERSE_ERR_INVALID, "rank %d: fabric %s to rank %d of %d", f->rank, what,
                           peer, f->nranks);
    if (tag >> TERSE__TAG_BITS)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "rank %d: tag %#llx uses the top 16 bits the transport reserves",
                           f->rank, (unsigned long long)tag);
    if (!buf && len)
        return TERSE_ERROR(TERSE_ERR_INVALID, "rank %d: fabric %s of %zu bytes from NULL", f->rank,
                           what, len);

    /* Chunking: chunk_bytes unless that needs more chunk indices than the
     * tag has room for; then the fewest equal chunks that fit, which both
     * sides compute alike from len. */
    size_t cb = f->chunk_bytes;
    if (len / cb >= TERSE__MAX_CHUNKS) cb = len / TERSE__MAX_CHUNKS + 1;
    if (cb > f->max_msg)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "rank %d: a %zu-byte message exceeds what %s can carry in %zu chunks",
                           f->rank, len, f->provider, TERSE__MAX_CHUNKS);
    memset(req, 0, sizeof *req);
    req->peer = peer;
    req->is_send = is_send;
    req->tag = tag;
    req->buf = buf;
    req->len = len;
    req->chunks = len ? (len - 1) / cb + 1 : 1;
    req->epoch = f->epoch;
    req->sink = sink;
    if (is_send) f->sent_to[peer] = 1;

    terse_status st;
    if (try_inject(f, req, &st)) return st;
    terse__fabric_op *op = op_get(f);
    if (!op) return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: no memory for a request", f->rank);
    op->req = req;
    op->chunk_bytes = cb;
    op_link(f, op);
    if (f->register_mr && len) {
        st = op_register(f, op);
        if (st != TERSE_OK) {
            op_put(f, op);
            return st;
        }
    }
    int full = 0;
    return post_chunks(f, op, &full);
}

terse_status terse__fabric_isend(terse__fabric *f, int peer, uint64_t tag, const void *buf,
                                 size_t len, terse__fabric_req *req) {
    /* The buffer is only read; req->buf is non-const because it serves both
     * directions. */
    return start(f, 1, peer, tag, (void *)(uintptr_t)buf, len, req, 0);
}

terse_status terse__fabric_irecv(terse__fabric *f, int peer, uint64_t tag, void *buf, size_t len,
                                 terse__fabric_req *req) {
    return start(f, 0, peer, tag, buf, len, req, 0);
}

size_t terse__fabric_sink_bytes(const terse__fabric *f) { return f ? f->chunk_bytes : 0; }

terse_status terse__fabric_irecv_sink(terse__fabric *f, int peer, uint64_t tag, void *buf,
                                      size_t len, terse__fabric_req *req) {
    return start(f, 0, peer, tag, buf, len, req, 1);
}

/* ---------------------------------------------------------------- completions */

static void slot_put(terse__fabric *f, terse__fabric_slot *s, int is_send) {
    terse__fabric_slot **pool = is_send ? &f->tx_free : &f->rx_free;
    s->op = NULL; /* not posted: quiesce cancels only slots with an op */
    if (s->stage) { /* encrypt: a send's staging buffer is free again */
        f->stage_free[f->nstage_free++] = s->stage;
        s->stage = NULL;
    }
    s->next_free = *pool;
    *pool = s;
}

/* A received chunk that failed authentication (or arrived with a length
 * only a forger would send): count it, log it (the first from each peer,
 * then at every power of two), and post its receive again -- the slot
 * keeps its op and chunk -- so the request waits on for the real one. */
static terse_status drop_forged(terse__fabric *f, terse__fabric_slot *s, size_t got,
                                int overran) {
    terse__fabric_req *r = s->op->req;
    uint64_t n = ++f->auth_fail[r->peer];
    size_t want = chunk_len(s->op, s->chunk);
    int wrong_len = overran || got != want + TERSE__WIRE_MAC;
    if (wrong_len) {
        f->forged_len_peer = r->peer;
        /* SIZE_MAX: more than posted (the provider may not say how much) */
        f->forged_len_got = overran ? SIZE_MAX
                                    : got >= TERSE__WIRE_MAC ? got - TERSE__WIRE_MAC : 0;
        f->forged_len_want = want;
    }
    if ((n & (n - 1)) == 0)
        fprintf(stderr,
                "terse: rank %d: dropped a chunk of %s%zu bytes claiming to come from rank %d "
                "(tag %#llx, chunk %zu): it failed authentication (%llu from rank %d so "
                "far)%s\n",
                f->rank, overran ? "more than " : "", got, r->peer, (unsigned long long)r->tag,
                s->chunk, (unsigned long long)n, r->peer,
                wrong_len ? "; its length is not the expected one: do the ranks pass the "
                            "same size?" : "");
    /* Still counted in op->inflight: the slot stays the op's until posted
     * again (or returned, if the request failed meanwhile). */
    s->next_free = f->repost;
    f->repost = s;
    return TERSE_OK;
}

static terse_status complete(terse__fabric *f, terse__fabric_slot *s, size_t got) {
    terse__fabric_op *op = s->op;
    terse__fabric_req *r = op->req;
    size_t want = chunk_len(op, s->chunk);
    if (f->mac && !r->is_send) {
        const uint8_t *p = r->buf ? r->buf + (r->sink ? 0 : s->chunk * op->chunk_bytes) : NULL;
        int ok = got == want + TERSE__WIRE_MAC &&
                 (f->encrypt ? terse__fabric_open_sealed(f, r, s->chunk, (uint8_t *)p, want, s->mac)
                             : terse__fabric_mac_ok(f, r, s->chunk, p, want, s->mac));
        if (!ok) return drop_forged(f, s, got, 0);
        got = want;
    }
    if (f->trace_tags)
        fprintf(stderr, "terse trace: rank %d completed %s rank %d tag %#llx\n", f->rank,
                r->is_send ? "a send to" : "a receive from", r->peer,
                (unsigned long long)(r->tag | ((uint64_t)s->chunk << TERSE__TAG_BITS)));
    slot_put(f, s, r->is_send);
    op->inflight--;
    if (!r->is_send) {
        /* Equal lengths are the contract; a shorter message means the
         * sides disagree about the size. */
        if (got != want) {
            op->bytes_done += got < want ? got : want;
            r->done++;
            return req_fail(f, r, TERSE_ERROR(TERSE_ERR_CORRUPT,
                                       "rank %d: rank %d sent %zu bytes for chunk %zu of tag "
                                       "%#llx where %zu were expected (message of %zu bytes)",
                                       f->rank, r->peer, got, s->chunk,
                                       (unsigned long long)r->tag, want, r->len));
        }
        f->bytes_recv += got;
    }
    op->bytes_done += want;
    if (++r->done == r->chunks) op_put(f, op);
    return TERSE_OK;
}

static int is_slot(const terse__fabric *f, const void *ctx) {
    const terse__fabric_slot *s = ctx;
    return s >= f->slots && s < f->slots + f->tx_slots + f->rx_slots;
}

/* A claim's bytes arrived (or failed: the entry goes). */
static void early_done(terse__fabric *f, void *ctx, size_t len, int failed) {
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

/* A completion that is not a posted chunk's: a peek's answer or a claim's. */
/* One of terse__fabric_flush's sends: its index, or -1. */
static int flush_index(const terse__fabric *f, const void *ctx) {
    const struct fi_context2 *c = ctx;
    if (!f->flush_ctx || c < f->flush_ctx || c >= f->flush_ctx + f->nranks) return -1;
    return (int)(c - f->flush_ctx);
}

static void other_done(terse__fabric *f, const struct fi_cq_tagged_entry *ent) {
    int k = flush_index(f, ent->op_context);
    if (k >= 0) {
        f->flush_state[k] = 2;
        return;
    }
    if (ent->op_context == f->peek_wait && f->peek_state == 0) {
        f->peek_state = 1;
        f->peek_tag = ent->tag;
        f->peek_len = ent->len;
        return;
    }
    early_done(f, ent->op_context, ent->len, 0);
}

static terse_status complete_error(terse__fabric *f) {
    struct fi_cq_err_entry e;
    memset(&e, 0, sizeof e);
    ssize_t ret = fi_cq_readerr(f->cq, &e, 0);
    if (ret < 0)
        return fail(f, TERSE_ERROR(TERSE_ERR_TRANSPORT, "rank %d: fi_cq_readerr on %s failed: %s",
                                   f->rank, f->provider, fi_strerror((int)-ret)));
    char why[160];
    const char *txt = fi_cq_strerror(f->cq, e.prov_errno, e.err_data, why, sizeof why);
    /* Some providers (shm in 1.17) report err negated. */
    int err = e.err < 0 ? -e.err : e.err;
    if (e.op_context && !is_slot(f, e.op_context)) { /* a peek found nothing, or a claim failed */
        int k = flush_index(f, e.op_context);
        if (k >= 0) f->flush_state[k] = 2;
        else if (e.op_context == f->peek_wait && f->peek_state == 0) f->peek_state = 2;
        else early_done(f, e.op_context, 0, 1);
        return TERSE_OK;
    }
    terse__fabric_slot *s = e.op_context;
    if (!s || !s->op)
        return fail(f, TERSE_ERROR(is_connection_error(err) ? TERSE_ERR_PEER_LOST
                                                            : TERSE_ERR_TRANSPORT,
                                   "rank %d: %s reported an error on no request: %s (%s)",
                                   f->rank, f->provider, fi_strerror(err), txt ? txt : ""));
    terse__fabric_req *r = s->op->req;
    terse_status st;
    if (err == FI_ETRUNC && f->mac && !r->is_send)
        return drop_forged(f, s, chunk_len(s->op, s->chunk) + TERSE__WIRE_MAC + e.olen, 1);
    if (err == FI_ETRUNC)
        st = TERSE_ERROR(TERSE_ERR_CORRUPT,
                         "rank %d: rank %d sent more than the %zu bytes posted for chunk %zu of "
                         "tag %#llx (%zu bytes over; message of %zu bytes): sizes disagree",
                         f->rank, r->peer, chunk_len(s->op, s->chunk), s->chunk,
                         (unsigned long long)r->tag, e.olen, r->len);
    else if (is_connection_error(err) || err == FI_ECANCELED)
        /* We never cancel, so a cancelled operation means the provider
         * tore down its path to the peer (tcp;ofi_rxm does this when the
         * peer's connection drops). */
        st = TERSE_ERROR(TERSE_ERR_PEER_LOST,
                         "rank %d: lost rank %d while %s it (tag %#llx, %zu of %zu bytes done) "
                         "on %s: %s (%s)%s",
                         f->rank, r->peer, dir_text(r), (unsigned long long)r->tag,
                         s->op->bytes_done, r->len, f->provider, fi_strerror(err),
                         txt ? txt : "",
                         err == FI_ECANCELED && f->sweep
                             ? "; rxm tore the connection down: the peer dropped it, or another "
                               "process connected claiming the peer's address"
                             : "");
    else
        st = TERSE_ERROR(TERSE_ERR_TRANSPORT,
                         "rank %d: %s rank %d (tag %#llx) failed on %s: %s (%s)", f->rank,
                         dir_text(r), r->peer, (unsigned long long)r->tag, f->provider,
                         fi_strerror(err), txt ? txt : "");
    if (f->tolerant) { /* the chunk came back: its slot is free */
        s->op->inflight--;
        slot_put(f, s, r->is_send);
    }
    return req_fail(f, r, st);
}

/* Drain the CQ (manual progress happens inside fi_cq_read). *events
 * counts completions seen. */
static terse_status read_cq(terse__fabric *f, size_t *events) {
    struct fi_cq_tagged_entry ent[CQ_BATCH];
    for (int round = 0; round < CQ_ROUNDS; round++) {
        terse__fabric_enter(f, -1, "fi_cq_read");
        ssize_t n = fi_cq_read(f->cq, ent, CQ_BATCH);
        terse__fabric_leave(f);
        if (atomic_load(&f->abandoned)) return abandoned(f);
        if (n == -FI_EAGAIN) return TERSE_OK;
        if (n == -FI_EAVAIL) { /* one error entry; the next round reads on */
            TERSE_CHECK(complete_error(f));
            continue;
        }
        if (n < 0)
            return fail(f, TERSE_ERROR(TERSE_ERR_TRANSPORT, "rank %d: fi_cq_read on %s failed: %s",
                                       f->rank, f->provider, fi_strerror((int)-n)));
        for (ssize_t k = 0; k < n; k++) {
            /* Only our posted chunks carry a context (inject has none). */
            if (!ent[k].op_context) continue;
            if (is_slot(f, ent[k].op_context)) {
                TERSE_CHECK(complete(f, ent[k].op_context, ent[k].len));
                (*events)++; /* only our chunks count as progress: a flood must not */
            } else {
                other_done(f, &ent[k]);
            }
        }
        if (n < CQ_BATCH) return TERSE_OK;
    }
    return TERSE_OK;
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
        *st = abandoned(f);
        return -1;
    }
    /* rxm answers at once (the answer is in the CQ before the call
     * returns); the bound only guards against a provider that does not. */
    for (int k = 0; ret == 0 && f->peek_state == 0 && k < 1000; k++) {
        size_t ev = 0;
        *st = read_cq(f, &ev);
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
    if (atomic_load(&f->abandoned)) return abandoned(f);
    if (ret == -FI_EAGAIN && !drop) return TERSE_OK; /* still TERSE__EARLY_CLAIMING */
    if (ret != 0) {
        early_done(f, e, 0, 1);
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
        if (atomic_load(&f->abandoned)) return abandoned(f);
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

static terse_status sweep(terse__fabric *f) {
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

/* Receives filled from the early store complete here, then (rxm) the
 * sweep, then the CQ is drained. */
static terse_status progress(terse__fabric *f, size_t *events) {
    while (f->local_done) {
        terse__fabric_slot *s = f->local_done;
        f->local_done = s->local_next;
        (*events)++;
        TERSE_CHECK(complete(f, s, s->local_got));
    }
    /* The sweep first: its peeks run the provider's progress, which may
     * tear down a dead peer's connection; the CQ read after it sees the
     * errors that leaves before anything more is posted (rxm 1.17 crashes
     * when a new receive matches a queued message of a torn-down
     * connection). */
    if (f->sweep && f->addrs && !f->sweeping) {
        f->sweeping = 1;
        terse_status st = sweep(f);
        f->sweeping = 0;
        TERSE_CHECK(st);
    }
    return read_cq(f, events);
}

uint64_t terse__fabric_stranger_drops(const terse__fabric *f) { return f ? f->stranger_drops : 0; }

/* Tolerant mode: recycle the state of failed requests once nothing of
 * theirs is posted any more. */
static void sweep_failed(terse__fabric *f) {
    terse__fabric_op *op = f->active_head;
    while (op) {
        terse__fabric_op *next = op->next;
        if (op->req->error && op->inflight == 0) op_put(f, op);
        op = next;
    }
}

void terse__fabric_set_tolerant(terse__fabric *f) {
    if (f) f->tolerant = 1;
}

terse_status terse__fabric_progress(terse__fabric *f, size_t *events) {
    if (!f || !events) return TERSE_ERROR(TERSE_ERR_INVALID, "fabric_progress: NULL argument");
    *events = 0;
    if (f->failed)
        return TERSE_ERROR(f->failed, "rank %d: the transport failed earlier; it can only be closed",
                           f->rank);
    TERSE_CHECK(progress(f, events));
    TERSE_CHECK(post_pending(f));
    if (f->tolerant) sweep_failed(f);
    return TERSE_OK;
}

/* Give back the slots of op (every op: NULL) waiting in the repost list. */
static void unrepost(terse__fabric *f, terse__fabric_op *op) {
    terse__fabric_slot **pp = &f->repost;
    while (*pp) {
        terse__fabric_slot *s = *pp;
        if (op && s->op != op) {
            pp = &s->next_free;
            continue;
        }
        *pp = s->next_free;
        if (s->op && s->op->inflight) s->op->inflight--;
        slot_put(f, s, 0);
    }
}


int terse__fabric_req_idle(const terse__fabric *f, const terse__fabric_req *r) {
    if (!r->error) return r->done >= r->chunks;
    return op_of(f, r) == NULL;
}

int terse__fabric_cancel(terse__fabric *f, terse__fabric_req *r) {
    if (!f || !r || !f->ep) return 1;
    terse__fabric_op *op = op_of(f, r);
    if (!op) return 1;
    if (!f->tolerant) return 0;
    if (!r->error) r->error = TERSE_ERR_ABORTED; /* post nothing more of it */
    unrepost(f, op);
    for (size_t i = 0; i < f->tx_slots + f->rx_slots; i++)
        if (f->slots[i].op == op) {
            terse__fabric_enter(f, r->peer, "fi_cancel");
            (void)fi_cancel(&f->ep->fid, &f->slots[i].ctx);
            terse__fabric_leave(f);
        }
    uint64_t until = terse__now_ns() + 100000000ull;
    for (;;) {
        op = op_of(f, r);
        if (!op) return 1; /* it completed meanwhile and was recycled */
        unrepost(f, op);
        if (!op->inflight) {
            op_put(f, op);
            return 1;
        }
        if (terse__now_ns() >= until || f->failed) return 0;
        size_t ev = 0;
        if (progress(f, &ev) != TERSE_OK) return 0;
        if (!ev) sched_yield();
    }
}

void terse__fabric_small_chunks_on_shm(terse__fabric *f) {
    if (!f || strcmp(f->provider, "shm") != 0) return;
    size_t cap = 4096 - ((f->mac || f->encrypt) ? TERSE__WIRE_MAC : 0); /* SMR_INJECT_SIZE */
    if (f->chunk_bytes > cap) f->chunk_bytes = cap;
}

int terse__fabric_give_up(terse__fabric *f, terse__fabric_req *r) {
    if (!f || !r) return 1;
    if (!f->tolerant) return 0;
    terse__fabric_op *op = op_of(f, r);
    if (!op) return 1;
    terse__fabric_orphan *o = malloc(sizeof *o);
    if (!o) return 0;
    o->req = *r; /* what completes of it later counts here */
    if (!o->req.error) o->req.error = TERSE_ERR_ABORTED; /* post nothing more of it */
    o->next = f->orphans;
    f->orphans = o;
    for (; op; op = op_of(f, r)) {
        unrepost(f, op);
        op->req = &o->req;
    }
    if (!r->error) r->error = TERSE_ERR_ABORTED;
    return 1;
}

int terse__fabric_req_done(const terse__fabric_req *r) {
    return r->error || r->done >= r->chunks;
}

/* ---------------------------------------------------------------- wait */

static size_t bytes_done(const terse__fabric *f, const terse__fabric_req *r) {
    for (const terse__fabric_op *op = f->active_head; op; op = op->next)
        if (op->req == r) return op->bytes_done;
    return r->done == r->chunks ? r->len : 0;
}

static terse_status timed_out(terse__fabric *f, const terse__fabric_req *r, uint64_t start,
                              uint64_t idle_ns) {
    uint64_t forged = f->auth_fail ? f->auth_fail[r->peer] : 0;
    if (forged) {
        /* The MAC covers the length, so a rank that passed another size
         * than this one looks like a forger: say so when the lengths differ. */
        char sizes[200] = "";
        if (f->forged_len_peer == r->peer && f->forged_len_got == SIZE_MAX)
            snprintf(sizes, sizeof sizes,
                     "; or the ranks passed different sizes: the last chunk dropped carried "
                     "more than the %zu bytes expected", f->forged_len_want);
        else if (f->forged_len_peer == r->peer)
            snprintf(sizes, sizeof sizes,
                     "; or the ranks passed different sizes: the last chunk dropped carried "
                     "%zu bytes where %zu were expected",
                     f->forged_len_got, f->forged_len_want);
        return fail(f, TERSE_ERROR(TERSE_ERR_AUTH,
                                   "rank %d: %llu chunks claiming to come from rank %d failed "
                                   "authentication, and the real rank %d sent nothing that "
                                   "checks for %llu ms (tag %#llx, %zu of %zu bytes done, "
                                   "provider %s): another process may have taken rank %d's "
                                   "place, or a relay is altering its messages%s",
                                   f->rank, (unsigned long long)forged, r->peer, r->peer,
                                   (unsigned long long)((terse__now_ns() - start) / 1000000u),
                                   (unsigned long long)r->tag, bytes_done(f, r), r->len,
                                   f->provider, r->peer, sizes));
    }
    char why[96] = "";
    if (idle_ns)
        snprintf(why, sizeof why, " with no progress for the last %llu ms",
                 (unsigned long long)(idle_ns / 1000000u));
    return fail(f, TERSE_ERROR(TERSE_ERR_TIMEOUT,
                               "rank %d: timed out after %llu ms%s %s rank %d (tag %#llx, %zu of "
                               "%zu bytes done, provider %s)",
                               f->rank, (unsigned long long)((terse__now_ns() - start) / 1000000u),
                               why, dir_text(r), r->peer, (unsigned long long)r->tag,
                               bytes_done(f, r), r->len, f->provider));
}

/* Each round: drain completions, post what the windows now allow, check
 * the requests, then abort, the limits and the caller's liveness probe;
 * back off (yield, later nap) while nothing completes. */
terse_status terse__fabric_wait_ex(terse__fabric *f, terse__fabric_req *reqs, size_t n,
                                   const terse__fabric_wait_opts *o) {
    if (!f || (n && !reqs) || !o)
        return TERSE_ERROR(TERSE_ERR_INVALID, "fabric_wait: NULL argument");
    if (f->failed)
        return TERSE_ERROR(f->failed, "rank %d: the transport failed earlier; it can only be closed",
                           f->rank);
    uint64_t start = terse__now_ns(), last_alive = start, last_event = start;
    unsigned idle = 0;
    for (;;) {
        size_t events = 0;
        TERSE_CHECK(progress(f, &events));
        TERSE_CHECK(post_pending(f));
        const terse__fabric_req *pending = NULL;
        for (size_t i = 0; i < n; i++) {
            if (reqs[i].error) return fail(f, (terse_status)reqs[i].error);
            if (!pending && reqs[i].done < reqs[i].chunks) pending = &reqs[i];
        }
        if (!pending) return TERSE_OK;
        uint64_t now = terse__now_ns();
        if (events) {
            idle = 0;
            last_event = now;
        }
        if (o->abort && atomic_load_explicit(o->abort, memory_order_acquire))
            return fail(f, TERSE_ERROR(TERSE_ERR_ABORTED,
                                       "rank %d: aborted (terse_comm_abort) while %s rank %d "
                                       "(%zu of %zu bytes done)",
                                       f->rank, dir_text(pending), pending->peer,
                                       bytes_done(f, pending), pending->len));
        if (now >= o->deadline_ns) return timed_out(f, pending, start, 0);
        if (o->idle_ns && now - last_event >= o->idle_ns)
            return timed_out(f, pending, start, now - last_event);
        if (o->alive && now - last_alive >= o->alive_period_ns) {
            last_alive = now;
            terse_status st = o->alive(o->arg);
            if (st != TERSE_OK) return fail(f, st);
        }
        if (events) continue;
        back_off(now - last_event, o->nap_after_ns ? o->nap_after_ns : NAP_AFTER_NS, &idle,
                 IDLE_SPINS);
    }
}

terse_status terse__fabric_wait(terse__fabric *f, terse__fabric_req *reqs, size_t n,
                                uint64_t deadline_ns, terse__fabric_alive_fn alive, void *arg) {
    terse__fabric_wait_opts o = {deadline_ns, 0, NULL, alive, arg, ALIVE_PERIOD_NS, 0};
    return terse__fabric_wait_ex(f, reqs, n, &o);
}

/* Operations still posted that reference caller memory: receives (the
 * provider writes into them) and, on shm, sends too (a live peer pulls a
 * send's bytes out of our memory with process_vm_readv in its own
 * progress, so a late pull would read whatever the caller put there). */
static size_t posted_holding(const terse__fabric *f, int sends_too) {
    size_t n = 0;
    for (const terse__fabric_op *op = f->active_head; op; op = op->next)
        if (!op->req->is_send || sends_too) n += op->inflight;
    return n;
}

/* A chunk that came back (done, failed or cancelled) during quiesce: it
 * no longer holds caller memory. */
static void returned(terse__fabric *f, terse__fabric_slot *s) {
    if (!s || !is_slot(f, s) || !s->op) return; /* a peek's or claim's: freed at close */
    terse__fabric_op *op = s->op;
    if (op->inflight) op->inflight--;
    slot_put(f, s, op->req->is_send);
}

/* Cancel what is posted and collect what comes back, for a bounded time;
 * then close the endpoint, which discards whatever the provider would not
 * give back. On tcp only receives must come back (sends move only inside
 * our own progress calls, and there are none after this); on shm sends
 * too (see posted_holding), given up to 50 ms -- a live peer completes
 * them within microseconds, a dead one never reads them. Every call is
 * watched: shm may spin here too. */
void terse__fabric_quiesce(terse__fabric *f) {
    if (!f || !f->ep || atomic_load(&f->abandoned)) return;
    if (f->failed == TERSE_OK) f->failed = TERSE_ERR_ABORTED;
    unrepost(f, NULL); /* slots not posted: nothing to cancel */
    while (f->local_done) { /* filled from the early store: never posted */
        terse__fabric_slot *s = f->local_done;
        f->local_done = s->local_next;
        returned(f, s);
    }
    const int sends_too = strcmp(f->provider, "shm") == 0;
    for (size_t i = 0; i < f->tx_slots + f->rx_slots; i++)
        if (f->slots[i].op) {
            terse__fabric_enter(f, f->slots[i].op->req->peer, "fi_cancel");
            (void)fi_cancel(&f->ep->fid, &f->slots[i].ctx);
            terse__fabric_leave(f);
            if (atomic_load(&f->abandoned)) return;
        }
    uint64_t until = terse__now_ns() + (sends_too ? 50000000ull : 20000000ull);
    while (posted_holding(f, sends_too) && terse__now_ns() < until) {
        struct fi_cq_tagged_entry ent[CQ_BATCH];
        terse__fabric_enter(f, -1, "fi_cq_read");
        ssize_t got = fi_cq_read(f->cq, ent, CQ_BATCH);
        terse__fabric_leave(f);
        if (atomic_load(&f->abandoned)) return;
        for (ssize_t k = 0; k < got; k++) returned(f, ent[k].op_context);
        if (got == -FI_EAVAIL) {
            struct fi_cq_err_entry e;
            memset(&e, 0, sizeof e);
            if (fi_cq_readerr(f->cq, &e, 0) > 0) returned(f, e.op_context);
        } else if (got <= 0) {
            sched_yield();
        }
    }
    terse__fabric_enter(f, -1, "fi_close");
    int ret = fi_close(&f->ep->fid);
    terse__fabric_leave(f);
    if (atomic_load(&f->abandoned)) return;
    terse__fabric_release_ops(f);
    if (ret == -FI_EBUSY) ret = fi_close(&f->ep->fid);
    if (ret == 0) f->ep = NULL; /* else terse__fabric_close tries once more */
}

/* net: a send's completion says only that the provider took it (an
 * inject at once, a small send into the connection's staging buffer), and
 * closing the endpoint discards whatever it still holds: a rank that left
 * right after its last allgather lost that message about 1 run in 8
 * (bench_train_smoke's ps:async run, 2026-12-03). So an orderly close
 * first sends each peer this rank sent anything to one empty message with
 * FI_DELIVERY_COMPLETE, whose acknowledgement comes once the peer's
 * provider has read it, and so everything before it on the connection.
 * The peer's net keeps it aside (at most 4 small unmatched messages per
 * connection) or, behind a message it cannot match yet, stalls on it. */
void terse__fabric_flush(terse__fabric *f, uint64_t budget_ns,
                         const uint8_t *(*lost_map)(void *), void *arg) {
    if (!f || !f->ep || f->failed || !f->sent_to || strcmp(f->provider, "net") != 0 ||
        atomic_load(&f->abandoned))
        return;
    f->flush_ctx = calloc((size_t)f->nranks, sizeof *f->flush_ctx);
    f->flush_state = calloc((size_t)f->nranks, 1);
    if (!f->flush_ctx || !f->flush_state) return; /* closed unflushed, as before */
    const uint64_t start = terse__now_ns(), until = start + budget_ns;
    uint64_t last_look = 0, last_event = start;
    unsigned idle = 0;
    for (;;) {
        int left = 0, first = -1; /* peers not flushed yet; the first of them */
        uint64_t now = terse__now_ns();
        const uint8_t *lost = NULL;
        if (lost_map && now - last_look >= 1000000ull) {
            last_look = now;
            lost = lost_map(arg); /* NULL: no news */
        }
        for (int p = 0; p < f->nranks; p++) {
            if (p == f->rank || !f->sent_to[p] || f->flush_state[p] == 2) continue;
            if (lost && lost[p]) {
                f->flush_state[p] = 2;
                continue;
            }
            if (!left++) first = p;
            if (f->flush_state[p]) continue;
            struct fi_msg_tagged m;
            memset(&m, 0, sizeof m);
            m.addr = f->addrs[p];
            m.tag = TERSE__MARKER_CHUNK; /* a marker's low bits are never 0 */
            m.context = &f->flush_ctx[p];
            ssize_t ret = fi_tsendmsg(f->ep, &m, FI_DELIVERY_COMPLETE | FI_COMPLETION);
            if (ret == 0) f->flush_state[p] = 1;
            else if (ret != -FI_EAGAIN) f->flush_state[p] = 2;
        }
        if (left && now >= until)
            fprintf(stderr,
                    "terse: rank %d: closing although %d peer%s (rank %d%s) had not read all it "
                    "was sent after %llu ms: busy outside terse, or stalled on a message no "
                    "receive matched\n",
                    f->rank, left, left == 1 ? "" : "s", first, left > 1 ? " and others" : "",
                    (unsigned long long)(budget_ns / 1000000u));
        if (!left || now >= until) return;
        size_t ev = 0;
        if (read_cq(f, &ev) != TERSE_OK) return;
        /* after 200 us without news a peer is busy elsewhere: leave it the core */
        if (ev) last_event = now;
        else back_off(now - last_event, 200000u, &idle, 0);
    }
}

uint64_t terse__fabric_call_age(terse__fabric *f, int *peer, const char **what) {
    if (!f) return 0;
    uint64_t since = atomic_load_explicit(&f->call_since, memory_order_acquire);
    if (!since) return 0;
    if (peer) *peer = atomic_load_explicit(&f->call_peer, memory_order_relaxed);
    if (what) *what = atomic_load_explicit(&f->call_what, memory_order_relaxed);
    uint64_t now = terse__now_ns();
    return now > since ? now - since : 0;
}

void terse__fabric_abandon(terse__fabric *f) {
    if (f) atomic_store(&f->abandoned, 1);
}

int terse__fabric_is_abandoned(const terse__fabric *f) {
    return f && atomic_load(&f->abandoned);
}

void terse__fabric_test_tamper(terse__fabric *f, unsigned every_k) {
    if (f) f->tamper_every = every_k;
}
