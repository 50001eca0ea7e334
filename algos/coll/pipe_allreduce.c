/* The compressed all-gather all-reduce, pipelined: for codecs whose
 * messages travel as they are (fp16, bf16, int8, qsgd, terngrad, sign, vq,
 * topk, plugins), at rank counts where every rank can talk to every other
 * directly within the communicator's requests (allreduce.c decides; more
 * ranks take the ring all-gather of gather_allreduce.c).
 *
 * The tensor is cut into P pieces of about TERSE_PIPELINE_BYTES of fp32
 * (terse__codec_pieces: on the codec's buckets; P = 1, the codec itself,
 * when it is not cut). For piece s = 0, 1, ... this rank
 *   1. posts the receives of piece s from every other rank,
 *   2. encodes piece s (error feedback through the parent's residual),
 *   3. sends it to every other rank,
 *   4. runs one progress round, then decodes every earlier piece whose
 *      N messages have all arrived, in rank order (message 0 overwrites,
 *      the others accumulate, each scaled by alpha),
 * so piece s travels while s + 1 is encoded and s - 1 decoded. At most W
 * pieces are in flight (the communicator's requests); the oldest is then
 * waited for. Decoding is the same arithmetic on the same bytes on every
 * rank, so every rank holds the same bits, and for a deterministic codec
 * (fp16, bf16, int8, sign, vq) the same bits as with P = 1: a piece's
 * message says what the whole message says of its elements.
 *
 * Agreement: each rank first sends every peer an 8-byte digest of its
 * codec spec, shape and cut, and checks every peer's before it sends its
 * first piece (after encoding it, so the wait costs nothing): a rank
 * with another spec or shape is refused by every rank with
 * TERSE_ERR_CORRUPT before a piece of an unexpected size could fail the
 * transport; never TERSE_OK.
 *
 * Sizes: a fixed-size codec (TERSE_CODEC_FIXED_SIZE) exchanges none; any
 * other sends each piece's 8-byte length before it, and the piece's
 * receive is posted when the length arrives.
 *
 * Bytes per rank: (N - 1) x the message, as for the ring all-gather, plus
 * one wire header per extra piece; framing 8 (N - 1), plus 8 (N - 1) P
 * without fixed sizes. */
#include <stdint.h>
#include <stdio.h>

#include "algos/coll/coll.h"
#include "common/error.h"
#include "compress/aggregate.h"

/* Message indices within the collective's phase. */
#define TAG_HELLO 0
#define TAG_HDR(s) (1 + 2 * (uint64_t)(s))
#define TAG_BODY(s) (2 + 2 * (uint64_t)(s))

typedef struct pipe {
    terse_comm *c;
    terse_codec *codec;
    const terse__pieces *p; /* NULL: one piece, the codec itself */
    float *buf;
    float alpha;
    size_t P, W, per; /* pieces, pieces in flight, requests per piece */
    int N, me, fixed, hello_ok;
    size_t slot;
    uint8_t *msgs;   /* piece s of rank q at msgs + (s N + q) slot */
    uint64_t *hdr;   /* s N + q: the length of a piece's message (not fixed-size) */
    uint64_t *hello; /* [q] peer q's digest, [N] ours */
    size_t *len;     /* s N + q: the message's length once known */
    uint8_t *posted; /* s N + q: its body receive is posted */
    uint64_t digest;
} pipe;

/* Requests: the hellos first (fixed), then W blocks of `per`; in piece s's
 * block, peer j's body receive, body send, header receive, header send. */
static size_t hello_reqs(const pipe *x) { return 2 * (size_t)(x->N - 1); }
static size_t peer_index(const pipe *x, int peer) { /* 0 .. N-2 */
    return (size_t)((peer - x->me - 1 + x->N) % x->N);
}
static terse__fabric_req *req(pipe *x, size_t s, int peer, int k) {
    return &x->c->reqs[hello_reqs(x) + (s % x->W) * x->per + (size_t)k * (x->N - 1) +
                       peer_index(x, peer)];
}
/* The hello receive from peer, the send to it at + 1. */
static terse__fabric_req *hello_req(pipe *x, int peer) {
    return &x->c->reqs[2 * peer_index(x, peer)];
}
enum { BODY_RECV, BODY_SEND, HDR_RECV, HDR_SEND };

/* Requests a piece needs, and whether two pieces fit at once. */
static size_t per_piece(int N, int fixed) { return (fixed ? 2 : 4) * (size_t)(N - 1); }

int terse__pipe_fits(int N, int fixed) {
    return N >= 2 && 2 * (size_t)(N - 1) + 2 * per_piece(N, fixed) <= TERSE__COMM_MAX_REQS;
}

static size_t bound_of(const pipe *x, size_t s) {
    return x->p ? terse_codec_bound(x->p->child[s]) : terse_codec_bound(x->codec);
}
static uint8_t *msg_of(const pipe *x, size_t s, int q) {
    return x->msgs + (s * (size_t)x->N + (size_t)q) * x->slot;
}

static terse_status differs(const pipe *x, int q) {
    return TERSE_ERROR(TERSE_ERR_CORRUPT,
                       "rank %d: rank %d's codec or its cut into %zu pieces differs from this "
                       "rank's '%s' for %zu elements (do all ranks use the same spec and shape?)",
                       x->me, q, x->P, terse_codec_spec(x->codec),
                       terse_codec_elements(x->codec));
}

/* Every peer's digest, once, after this rank encoded its first piece and
 * before it posts or sends anything more. All of them are waited for
 * before any is compared: a rank leaves (with CORRUPT) only once every
 * peer's hello reached it, i.e. once every peer has sent all its hellos,
 * so no rank still sends to one that left and each sees the difference
 * itself rather than a lost peer. */
static terse_status check_hellos(pipe *x) {
    if (x->hello_ok) return TERSE_OK;
    for (int q = 0; q < x->N; q++)
        if (q != x->me) TERSE_CHECK(terse__comm_wait(x->c, hello_req(x, q), 1));
    for (int q = 0; q < x->N; q++)
        if (q != x->me && x->hello[q] != x->digest) return differs(x, q);
    x->hello_ok = 1;
    return TERSE_OK;
}

/* Variable size: peer q's header of piece s has arrived; check it and
 * post the body's receive. */
static terse_status take_header(pipe *x, size_t s, int q) {
    const size_t i = s * (size_t)x->N + (size_t)q;
    if (x->posted[i]) return TERSE_OK;
    const uint64_t l = x->hdr[i];
    if (l < TERSE_WIRE_HEADER_SIZE || l > bound_of(x, s))
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "rank %d: rank %d announces a %llu-byte message for piece %zu, but "
                           "codec '%s' writes %u to %zu bytes there",
                           x->me, q, (unsigned long long)l, s, terse_codec_spec(x->codec),
                           TERSE_WIRE_HEADER_SIZE, bound_of(x, s));
    x->len[i] = (size_t)l;
    x->posted[i] = 1;
    return terse__comm_irecv(x->c, q, terse__comm_tag(x->c, TAG_BODY(s)), msg_of(x, s, q),
                             x->len[i], TERSE__BYTES_PAYLOAD, req(x, s, q, BODY_RECV));
}

static terse_status post_receives(pipe *x, size_t s) {
    for (int q = 0; q < x->N; q++) {
        if (q == x->me) continue;
        const size_t i = s * (size_t)x->N + (size_t)q;
        if (x->fixed) {
            x->len[i] = bound_of(x, s);
            x->posted[i] = 1;
            TERSE_CHECK(terse__comm_irecv(x->c, q, terse__comm_tag(x->c, TAG_BODY(s)),
                                          msg_of(x, s, q), x->len[i], TERSE__BYTES_PAYLOAD,
                                          req(x, s, q, BODY_RECV)));
        } else {
            x->posted[i] = 0;
            TERSE_CHECK(terse__comm_irecv(x->c, q, terse__comm_tag(x->c, TAG_HDR(s)),
                                          x->hdr + i, 8, TERSE__BYTES_FRAMING,
                                          req(x, s, q, HDR_RECV)));
        }
    }
    return TERSE_OK;
}

static terse_status encode(pipe *x, size_t s) {
    const size_t i = s * (size_t)x->N + (size_t)x->me;
    uint8_t *m = msg_of(x, s, x->me);
    uint64_t t0 = terse__now_ns();
    terse_status st = x->p ? terse__codec_encode_piece(x->codec, s, x->buf, m, x->slot, &x->len[i])
                           : terse_encode(x->codec, x->buf, m, x->slot, &x->len[i]);
    terse__comm_codec_time(x->c, t0);
    TERSE_CHECK(st);
    TERSE_CHECK(terse__codec_check_fixed(x->codec, x->me, x->len[i], bound_of(x, s)));
    x->hdr[i] = x->len[i];
    return TERSE_OK;
}

static terse_status send(pipe *x, size_t s) {
    const size_t i = s * (size_t)x->N + (size_t)x->me;
    uint8_t *m = msg_of(x, s, x->me);
    for (int q = 0; q < x->N; q++) {
        if (q == x->me) continue;
        if (!x->fixed)
            TERSE_CHECK(terse__comm_isend(x->c, q, terse__comm_tag(x->c, TAG_HDR(s)),
                                          x->hdr + i, 8, TERSE__BYTES_FRAMING,
                                          req(x, s, q, HDR_SEND)));
        TERSE_CHECK(terse__comm_isend(x->c, q, terse__comm_tag(x->c, TAG_BODY(s)), m, x->len[i],
                                      TERSE__BYTES_PAYLOAD, req(x, s, q, BODY_SEND)));
    }
    return TERSE_OK;
}

static terse_status decode_one(pipe *x, size_t s, int q) {
    const size_t i = s * (size_t)x->N + (size_t)q;
    uint64_t t0 = terse__now_ns();
    terse_status st =
        x->p ? terse__codec_decode_piece(x->codec, s, msg_of(x, s, q), x->len[i], x->buf,
                                         x->alpha, q > 0)
             : terse_decode(x->codec, msg_of(x, s, q), x->len[i], x->buf, x->alpha, q > 0);
    terse__comm_codec_time(x->c, t0);
    if (st != TERSE_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", terse__comm_last_sentence());
        return TERSE_ERROR(st, "rank %d: decoding rank %d's message of piece %zu: %s", x->me, q,
                           s, why);
    }
    return TERSE_OK;
}

/* Piece s, every rank's message in rank order, waiting for each; then its
 * sends, so that its requests may be reused. */
static terse_status finish_piece(pipe *x, size_t s) {
    for (int q = 0; q < x->N; q++) {
        if (q != x->me) {
            if (!x->fixed) {
                TERSE_CHECK(terse__comm_wait(x->c, req(x, s, q, HDR_RECV), 1));
                TERSE_CHECK(take_header(x, s, q));
            }
            TERSE_CHECK(terse__comm_wait(x->c, req(x, s, q, BODY_RECV), 1));
        }
        TERSE_CHECK(decode_one(x, s, q));
    }
    for (int q = 0; q < x->N; q++) {
        if (q == x->me) continue;
        TERSE_CHECK(terse__comm_wait(x->c, req(x, s, q, BODY_SEND), 1));
        if (!x->fixed) TERSE_CHECK(terse__comm_wait(x->c, req(x, s, q, HDR_SEND), 1));
    }
    return TERSE_OK;
}

/* Without waiting: post the bodies whose headers arrived, and report
 * whether piece s's messages are all in. */
static terse_status piece_ready(pipe *x, size_t s, int *ready) {
    *ready = 1;
    for (int q = 0; q < x->N; q++) {
        if (q == x->me) continue;
        if (!x->fixed && !x->posted[s * (size_t)x->N + (size_t)q]) {
            if (!terse__fabric_req_done(req(x, s, q, HDR_RECV))) {
                *ready = 0;
                continue;
            }
            TERSE_CHECK(take_header(x, s, q));
        }
        if (!terse__fabric_req_done(req(x, s, q, BODY_RECV))) *ready = 0;
    }
    return TERSE_OK;
}

static terse_status run(pipe *x) {
    terse_comm *c = x->c;
    x->hello[x->N] = x->digest;
    for (int q = 0; q < x->N; q++) {
        if (q == x->me) continue;
        terse__fabric_req *r = hello_req(x, q);
        uint64_t tag = terse__comm_tag(c, TAG_HELLO);
        TERSE_CHECK(terse__comm_irecv(c, q, tag, &x->hello[q], 8, TERSE__BYTES_FRAMING, r));
        TERSE_CHECK(terse__comm_isend(c, q, tag, &x->hello[x->N], 8, TERSE__BYTES_FRAMING, r + 1));
    }
    /* pieces [next, P) are not decoded yet, [0, posted) have receives */
    size_t next = 0, posted = 0;
    for (size_t s = 0; s < x->P; s++) {
        while (s - next >= x->W) TERSE_CHECK(finish_piece(x, next++));
        TERSE_CHECK(encode(x, s));
        if (s == 0) TERSE_CHECK(check_hellos(x));
        while (posted <= s) TERSE_CHECK(post_receives(x, posted++));
        TERSE_CHECK(send(x, s));
        /* the next piece's receives now, if its requests are free */
        if (posted < x->P && posted - next < x->W) TERSE_CHECK(post_receives(x, posted++));
        TERSE_CHECK(terse__comm_progress(c));
        int ready = 1;
        while (next < s && ready) {
            TERSE_CHECK(piece_ready(x, next, &ready));
            if (ready) TERSE_CHECK(finish_piece(x, next++));
        }
    }
    while (next < x->P) TERSE_CHECK(finish_piece(x, next++));
    for (int q = 0; q < x->N; q++) /* the hellos we sent */
        if (q != x->me) TERSE_CHECK(terse__comm_wait(c, hello_req(x, q) + 1, 1));
    if (x->p) terse__codec_segments_done(x->codec);
    return TERSE_OK;
}

terse_status terse__allreduce_pipe(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                   terse_op op, const terse__pieces *p) {
    (void)n; /* the codec is bound to n elements (terse_allreduce checked) */
    pipe x = {0};
    x.c = c;
    x.codec = codec;
    x.p = p;
    x.buf = buf;
    x.N = c->nranks;
    x.me = c->rank;
    x.alpha = op == TERSE_OP_AVG ? 1.0f / (float)c->nranks : 1.0f;
    x.fixed = terse__codec_fixed_size(codec);
    x.P = p ? p->count : 1;
    x.per = per_piece(x.N, x.fixed);
    x.W = (TERSE__COMM_MAX_REQS - hello_reqs(&x)) / x.per;
    if (x.W < 2 || !terse__pipe_fits(x.N, x.fixed))
        return TERSE_ERROR(TERSE_ERR_INTERNAL, "rank %d: the pipelined all-gather does not fit "
                           "%d ranks", x.me, x.N);
    const size_t bound = p ? p->max_bound : terse_codec_bound(codec);
    x.slot = (bound + 63) & ~(size_t)63;
    const size_t cells = x.P * (size_t)x.N;
    if (x.slot < bound || x.slot > SIZE_MAX / cells)
        return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: %zu messages of %zu bytes overflow", x.me,
                           cells, bound);
    x.msgs = terse__comm_scratch(c, 0, cells * x.slot);
    x.hdr = terse__comm_scratch(c, 1, (cells + (size_t)x.N + 1) * sizeof(uint64_t));
    x.len = terse__comm_scratch(c, 2, cells * sizeof(size_t) + cells);
    if (!x.msgs || !x.hdr || !x.len) return TERSE_ERR_NOMEM;
    x.posted = (uint8_t *)(x.len + cells);
    x.hello = x.hdr + cells;
    x.digest = terse__codec_pieces_digest(codec, p);
    terse__comm_next_phase(c);
    return run(&x);
}
