/* Tagged messages over the endpoint: chunking, posting within the
 * provider's queue depths, and completion progress. Waiting, cancelling
 * and the endings (quiesce, flush, abandon) are in fabric_wait.c; the
 * sweep of rxm's unexpected queue ("Strangers") in fabric_sweep.c.
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
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "transport/fabric_impl.h"

/* fi_cq_read calls per progress round, of TERSE__CQ_BATCH completions
 * each (bounded so that new chunks are posted between batches). */
#define CQ_ROUNDS 8
/* Largest message injected with its MAC (copied to the stack). */
#define INJECT_STAGE 256

const char *terse__fabric_dir_text(const terse__fabric_req *r) {
    return r->is_send ? "sending to" : "receiving from";
}

/* A failure leaves operations posted that point at caller memory, so the
 * fabric refuses everything but close from then on. */
terse_status terse__fabric_fail(terse__fabric *f, terse_status st) {
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
    return terse__fabric_fail(f, st);
}

/* A watchdog gave up on this fabric while we were inside the provider. */
terse_status terse__fabric_fail_abandoned(terse__fabric *f) {
    return terse__fabric_fail(
        f, TERSE_ERROR(TERSE_ERR_TIMEOUT,
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
void terse__fabric_op_put(terse__fabric *f, terse__fabric_op *op) {
    if (op->prev) op->prev->next = op->next;
    else if (f->active_head == op) f->active_head = op->next;
    if (op->next) op->next->prev = op->prev;
    else if (f->active_tail == op) f->active_tail = op->prev;
    if (op->mr) fi_close(&op->mr->fid);
    op->mr = NULL;
    op->next = f->op_free;
    f->op_free = op;
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
        return TERSE_ERROR(
            TERSE_ERR_TRANSPORT, "rank %d: registering %zu bytes for %s rank %d on %s failed: %s",
            f->rank, r->len, terse__fabric_dir_text(r), r->peer, f->provider, fi_strerror(-ret));
    op->desc = fi_mr_desc(op->mr);
    return TERSE_OK;
}

/* ---------------------------------------------------------------- posting */

static terse_status post_error(terse__fabric *f, terse__fabric_req *r, size_t chunk,
                               int ret) {
    terse_status st = is_connection_error(-ret) ? TERSE_ERR_PEER_LOST : TERSE_ERR_TRANSPORT;
    /* net opens its connection to a peer at the first message: out of
     * descriptors, that fails here (SECURITY.md, strangers on tcp) */
    const int no_fds = ret == -FI_EMFILE || ret == -ENFILE;
    return req_fail(f, r,
                    TERSE_ERROR(st,
                                "rank %d: posting chunk %zu of %zu for %s rank %d (tag %#llx) "
                                "on %s failed: %s%s",
                                f->rank, chunk, r->chunks, terse__fabric_dir_text(r), r->peer,
                                (unsigned long long)r->tag, f->provider, fi_strerror(-ret),
                                no_fds ? "; this process is at its file-descriptor limit "
                                         "(RLIMIT_NOFILE, ulimit -n), so no connection to the "
                                         "peer could be opened"
                                       : ""));
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
        int has = terse__fabric_early_take(f, r->peer, tag, p, n, s->mac, &got);
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
        fprintf(stderr, "terse trace: rank %d (%s) posted %s rank %d tag %#llx (%zu bytes)\n",
                f->rank, f->provider, r->is_send ? "a send to" : "a receive from", r->peer, (unsigned long long)tag, n);
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
        if (atomic_load(&f->abandoned)) return terse__fabric_fail_abandoned(f);
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

/* Give every active request its chance to post, oldest first. */
terse_status terse__fabric_post_pending(terse__fabric *f) {
    /* First the receives a forged chunk consumed (their slots are held,
     * and still counted in their op's inflight). */
    while (f->repost) {
        terse__fabric_slot *s = f->repost;
        terse__fabric_op *op = s->op;
        if (op->req->error) { /* the request failed meanwhile: the slot goes back */
            f->repost = s->next_free;
            op->inflight--;
            terse__fabric_slot_put(f, s, 0);
            continue;
        }
        ssize_t ret = post_one(f, op, s, s->chunk);
        if (atomic_load(&f->abandoned)) return terse__fabric_fail_abandoned(f);
        if (ret == -FI_EAGAIN) {
            s->op = op; /* post_one let go of it: it stays ours, to post later */
            break;
        }
        f->repost = s->next_free;
        if (ret != 0) {
            size_t chunk = s->chunk;
            op->inflight--;
            terse__fabric_slot_put(f, s, 0);
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
        *st = terse__fabric_fail_abandoned(f);
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

terse__fabric_op *terse__fabric_op_of(const terse__fabric *f, const terse__fabric_req *r) {
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
            terse__fabric_op_put(f, op);
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
    return start(terse__fabric_route(f, peer), 1, peer, tag, (void *)(uintptr_t)buf, len, req, 0);
}

terse_status terse__fabric_irecv(terse__fabric *f, int peer, uint64_t tag, void *buf, size_t len,
                                 terse__fabric_req *req) {
    return start(terse__fabric_route(f, peer), 0, peer, tag, buf, len, req, 0);
}

size_t terse__fabric_sink_bytes(const terse__fabric *f) {
    if (!f) return 0;
    /* a sink buffer serves either endpoint: the larger chunk */
    return f->side && f->side->chunk_bytes > f->chunk_bytes ? f->side->chunk_bytes : f->chunk_bytes;
}

terse_status terse__fabric_irecv_sink(terse__fabric *f, int peer, uint64_t tag, void *buf,
                                      size_t len, terse__fabric_req *req) {
    return start(terse__fabric_route(f, peer), 0, peer, tag, buf, len, req, 1);
}

void terse__fabric_keep_open(terse__fabric *f) {
    if (f) f->keep_open = 1;
}

void terse__fabric_small_chunks_on_shm(terse__fabric *f) {
    if (f && f->side) terse__fabric_small_chunks_on_shm(f->side);
    if (!f || strcmp(f->provider, "shm") != 0) return;
    size_t cap = 4096 - ((f->mac || f->encrypt) ? TERSE__WIRE_MAC : 0); /* SMR_INJECT_SIZE */
    if (f->chunk_bytes > cap) f->chunk_bytes = cap;
}

void terse__fabric_test_tamper(terse__fabric *f, unsigned every_k) {
    if (f) f->tamper_every = every_k;
    if (f && f->side) f->side->tamper_every = every_k;
}

/* ---------------------------------------------------------------- completions */

void terse__fabric_slot_put(terse__fabric *f, terse__fabric_slot *s, int is_send) {
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
    terse__fabric_slot_put(f, s, r->is_send);
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
    if (++r->done == r->chunks) terse__fabric_op_put(f, op);
    return TERSE_OK;
}

int terse__fabric_is_slot(const terse__fabric *f, const void *ctx) {
    const terse__fabric_slot *s = ctx;
    return s >= f->slots && s < f->slots + f->tx_slots + f->rx_slots;
}

/* One of terse__fabric_flush's sends: its index, or -1. */
static int flush_index(const terse__fabric *f, const void *ctx) {
    const struct fi_context2 *c = ctx;
    if (!f->flush_ctx || c < f->flush_ctx || c >= f->flush_ctx + f->nranks) return -1;
    return (int)(c - f->flush_ctx);
}

/* A completion that is not a posted chunk's: a peek's answer or a claim's. */
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
    terse__fabric_early_done(f, ent->op_context, ent->len, 0);
}

static terse_status complete_error(terse__fabric *f) {
    struct fi_cq_err_entry e;
    memset(&e, 0, sizeof e);
    ssize_t ret = fi_cq_readerr(f->cq, &e, 0);
    if (ret < 0)
        return terse__fabric_fail(f, TERSE_ERROR(TERSE_ERR_TRANSPORT,
                                                 "rank %d: fi_cq_readerr on %s failed: %s", f->rank,
                                                 f->provider, fi_strerror((int)-ret)));
    char why[160];
    const char *txt = fi_cq_strerror(f->cq, e.prov_errno, e.err_data, why, sizeof why);
    /* Some providers (shm in 1.17) report err negated. */
    int err = e.err < 0 ? -e.err : e.err;
    if (e.op_context && !terse__fabric_is_slot(f, e.op_context)) {
        /* a peek found nothing, or a claim failed */
        int k = flush_index(f, e.op_context);
        if (k >= 0) f->flush_state[k] = 2;
        else if (e.op_context == f->peek_wait && f->peek_state == 0) f->peek_state = 2;
        else terse__fabric_early_done(f, e.op_context, 0, 1);
        return TERSE_OK;
    }
    terse__fabric_slot *s = e.op_context;
    if (!s || !s->op)
        return terse__fabric_fail(
            f, TERSE_ERROR(is_connection_error(err) ? TERSE_ERR_PEER_LOST : TERSE_ERR_TRANSPORT,
                           "rank %d: %s reported an error on no request: %s (%s)", f->rank,
                           f->provider, fi_strerror(err), txt ? txt : ""));
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
                         f->rank, r->peer, terse__fabric_dir_text(r), (unsigned long long)r->tag,
                         s->op->bytes_done, r->len, f->provider, fi_strerror(err),
                         txt ? txt : "",
                         err == FI_ECANCELED && f->sweep
                             ? "; rxm tore the connection down: the peer dropped it, or another "
                               "process connected claiming the peer's address"
                             : "");
    else
        st = TERSE_ERROR(TERSE_ERR_TRANSPORT,
                         "rank %d: %s rank %d (tag %#llx) failed on %s: %s (%s)%s", f->rank,
                         terse__fabric_dir_text(r), r->peer, (unsigned long long)r->tag,
                         f->provider, fi_strerror(err), txt ? txt : "",
                         err == FI_EMFILE || err == ENFILE
                             ? "; this process is at its file-descriptor limit (RLIMIT_NOFILE, "
                               "ulimit -n)"
                             : "");
    if (f->tolerant) { /* the chunk came back: its slot is free */
        s->op->inflight--;
        terse__fabric_slot_put(f, s, r->is_send);
    }
    return req_fail(f, r, st);
}

/* Drain the CQ (manual progress happens inside fi_cq_read). *events
 * counts completions seen. */
terse_status terse__fabric_read_cq(terse__fabric *f, size_t *events) {
    struct fi_cq_tagged_entry ent[TERSE__CQ_BATCH];
    for (int round = 0; round < CQ_ROUNDS; round++) {
        terse__fabric_enter(f, -1, "fi_cq_read");
        /* net reads a stale errno as its own when a connection that never
         * spoke closes; cleared, it frees that connection (fabric_reap.c) */
        if (f->reap) errno = 0;
        ssize_t n = fi_cq_read(f->cq, ent, TERSE__CQ_BATCH);
        terse__fabric_leave(f);
        if (atomic_load(&f->abandoned)) return terse__fabric_fail_abandoned(f);
        if (n == -FI_EAGAIN) return TERSE_OK;
        if (n == -FI_EAVAIL) { /* one error entry; the next round reads on */
            TERSE_CHECK(complete_error(f));
            continue;
        }
        if (n < 0)
            return terse__fabric_fail(f, TERSE_ERROR(TERSE_ERR_TRANSPORT,
                                                     "rank %d: fi_cq_read on %s failed: %s",
                                                     f->rank, f->provider, fi_strerror((int)-n)));
        for (ssize_t k = 0; k < n; k++) {
            /* Only our posted chunks carry a context (inject has none). */
            if (!ent[k].op_context) continue;
            if (terse__fabric_is_slot(f, ent[k].op_context)) {
                TERSE_CHECK(complete(f, ent[k].op_context, ent[k].len));
                (*events)++; /* only our chunks count as progress: a flood must not */
            } else {
                other_done(f, &ent[k]);
            }
        }
        if (n < TERSE__CQ_BATCH) return TERSE_OK;
    }
    return TERSE_OK;
}

/* Receives filled from the early store complete here, then (rxm) the
 * sweep, then the CQ is drained. */
terse_status terse__fabric_poll(terse__fabric *f, size_t *events) {
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
        terse_status st = terse__fabric_sweep(f);
        f->sweeping = 0;
        TERSE_CHECK(st);
    }
    terse_status st = terse__fabric_read_cq(f, events);
    if (st == TERSE_OK) terse__fabric_reap(f);
    return st;
}
