/* The ring pipeline engine (schedule and invariants in algos/coll/ring.h).
 *
 * Window slot w = i % depth holds op i while it is in flight: its two
 * requests (receive first, then send) in comm->reqs[2w .. 2w+1] and, for a
 * reducing op, its staging buffer. The loop below, at iteration i:
 *   1. completes op i - depth: waits for its receive and send, then adds
 *      the staged chunk into the buffer (dividing on the finishing step);
 *   2. posts op i: the receive first (so it is ready before the left
 *      neighbour's matching send arrives, where timing allows), then the
 *      send, whose data op i - K >= op i - depth completed earlier.
 * Completing ops strictly in order means every rank waits only on
 * messages its neighbours post without waiting on anything later, so the
 * ring cannot deadlock. */
#include <stdlib.h>

#include "algos/coll/ring.h"
#include "common/error.h"

/* Ops in flight: enough to overlap one chunk's reduction with the next
 * chunks' transfer in both directions. */
#define RING_DEPTH 4

void terse__reduce_add(float *restrict dst, const float *restrict src, size_t n, int divide,
                       float divisor) {
    if (divide)
        for (size_t i = 0; i < n; i++) dst[i] = (dst[i] + src[i]) / divisor;
    else
        for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

terse_status terse__ring_run(terse_comm *c, uint8_t *buf, const terse__ring_sched *s) {
    if (s->nops == 0) return TERSE_OK;
    const int N = c->nranks, p = (int)terse__ring_pos(c);
    const int right = c->ring_at ? c->ring_at[(p + 1) % N] : (c->rank + 1) % N;
    const int left = c->ring_at ? c->ring_at[(p + N - 1) % N] : (c->rank + N - 1) % N;
    size_t depth = s->nchunks < RING_DEPTH ? s->nchunks : RING_DEPTH;
    if (depth == 0) depth = 1;
    size_t slot_bytes = (s->max_chunk_bytes + 63) & ~(size_t)63;
    uint8_t *stage = NULL;
    if (s->reduces && slot_bytes) {
        stage = terse__comm_scratch(c, 3, depth * slot_bytes);
        if (!stage) return TERSE_ERR_NOMEM;
    }
    terse__ring_op ops[RING_DEPTH];
    size_t posted[RING_DEPTH] = {0};
    terse_status st;

    for (size_t i = 0; i < s->nops + depth; i++) {
        if (i >= depth) {
            /* 1. complete op i - depth */
            size_t w = (i - depth) % depth;
            if (posted[w]) {
                TERSE_CHECK(terse__comm_wait(c, &c->reqs[2 * w], posted[w]));
                posted[w] = 0;
            }
            const terse__ring_op *op = &ops[w];
            if (op->reduce && op->recv_len) {
                uint64_t t0 = terse__now_ns();
                terse__reduce_add((float *)(void *)(buf + op->recv_off),
                                  (const float *)(void *)(stage + w * slot_bytes),
                                  op->recv_len / sizeof(float), op->finish, s->divisor);
                terse__comm_codec_time(c, t0);
            }
        }
        if (i < s->nops) {
            /* 2. post op i */
            size_t w = i % depth;
            terse__ring_op *op = &ops[w];
            s->plan(s->ctx, i, op);
            uint64_t tag = terse__comm_tag(c, i);
            if (op->reduce && op->recv_len > slot_bytes)
                return TERSE_ERROR(TERSE_ERR_INTERNAL,
                                   "ring op %zu receives %zu bytes into a %zu-byte stage", i,
                                   op->recv_len, slot_bytes);
            if (op->recv_len) {
                void *dst = op->reduce ? (void *)(stage + w * slot_bytes)
                                       : (void *)(buf + op->recv_off);
                st = terse__comm_irecv(c, left, tag, dst, op->recv_len, s->kind,
                                       &c->reqs[2 * w + posted[w]]);
                if (st != TERSE_OK) return st;
                posted[w]++;
            }
            if (op->send_len) {
                st = terse__comm_isend(c, right, tag, buf + op->send_off, op->send_len, s->kind,
                                       &c->reqs[2 * w + posted[w]]);
                if (st != TERSE_OK) return st;
                posted[w]++;
            }
        }
    }
    return TERSE_OK;
}
