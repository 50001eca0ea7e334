/* Ring all-gather of variable-size blocks, and terse_allgather on top of it.
 *
 * Block b (rank b's contribution) travels the ring once: at step t = 0 ..
 * N-2 the rank at ring position r (ring.h) sends the block of position
 * r - t to the right and receives that of r - t - 1 from the left into its
 * final place, so the block a step sends
 * is the one the previous step received (algos/coll/ring.h). Blocks are cut into
 * K chunks (K set by the largest block) and pipelined. Every rank sends
 * and receives N-1 blocks: the all-gather's bandwidth optimum.
 *
 * Sizes go first: every rank learns every block's size (and, for
 * terse_allgather, every rank's recv_cap) before any data moves. Receives
 * are therefore always exactly as large as the message they match, and
 * "the result does not fit" is known to all ranks at once, so all of them
 * return TERSE_ERR_DST_TOO_SMALL together and the communicator stays in
 * step. */
#include <string.h>

#include "algos/coll/coll.h"
#include "algos/coll/ring.h"
#include "common/error.h"

typedef struct {
    size_t N, r, K; /* r: this rank's ring position (ring.h) */
    const size_t *off, *len; /* per block; NULL: fixed blocks of `block` bytes */
    size_t block;
    const int *at; /* the ring order (comm.h ring_at); NULL: rank order */
} gather_plan;

/* Chunk k of the block of the rank at ring position q. */
static void block_chunk(const gather_plan *p, size_t q, size_t k, size_t *off, size_t *len) {
    const size_t b = p->at ? (size_t)p->at[q] : q;
    size_t boff = p->off ? p->off[b] : b * p->block;
    size_t blen = p->len ? p->len[b] : p->block;
    size_t coff;
    terse__part(blen, p->K, k, &coff, len);
    *off = boff + coff;
}

static void plan_op(const void *ctx, size_t i, terse__ring_op *op) {
    const gather_plan *p = ctx;
    size_t t = i / p->K, k = i % p->K, base = p->r + 2 * p->N;
    block_chunk(p, (base - t) % p->N, k, &op->send_off, &op->send_len);
    block_chunk(p, (base - t - 1) % p->N, k, &op->recv_off, &op->recv_len);
    op->reduce = 0;
    op->finish = 0;
}

static terse_status run(terse_comm *c, uint8_t *buf, gather_plan *p, size_t max_block,
                        terse__bytes_kind kind) {
    if (p->N == 1) return TERSE_OK;
    terse__comm_next_phase(c);
    p->K = terse__chunks_for(max_block, terse__ring_chunk_bytes(c));
    terse__ring_sched s = {
        .nops = (p->N - 1) * p->K,
        .nchunks = p->K,
        .max_chunk_bytes = 0,
        .reduces = 0,
        .divisor = 1.0f,
        .kind = kind,
        .plan = plan_op,
        .ctx = p,
    };
    return terse__ring_run(c, buf, &s);
}

/* Fixed blocks of `bytes` (framing): all[r * bytes ..] = rank r's `mine`. */
terse_status terse__allgather_fixed(terse_comm *c, const void *mine, size_t bytes, void *all) {
    memcpy((uint8_t *)all + (size_t)c->rank * bytes, mine, bytes);
    gather_plan p = {(size_t)c->nranks, terse__ring_pos(c), 1, NULL, NULL, bytes, c->ring_at};
    return run(c, all, &p, bytes, TERSE__BYTES_FRAMING);
}

terse_status terse__allgather_u64(terse_comm *c, uint64_t mine, uint64_t *all) {
    return terse__allgather_fixed(c, &mine, sizeof mine, all);
}

terse_status terse__allgatherv_ring(terse_comm *c, uint8_t *buf, const size_t *off,
                                    const size_t *len) {
    size_t max_block = 0;
    for (int r = 0; r < c->nranks; r++)
        if (len[r] > max_block) max_block = len[r];
    gather_plan p = {(size_t)c->nranks, terse__ring_pos(c), 1, off, len, 0, c->ring_at};
    return run(c, buf, &p, max_block, TERSE__BYTES_PAYLOAD);
}

terse_status terse__allgather_check(terse_comm *c, const void *send, size_t send_bytes,
                                   void *recv, size_t recv_cap) {
    if (send_bytes > 0 && !send)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_allgather on rank %d: send is NULL, send_bytes = %zu", c->rank,
                           send_bytes);
    if (recv_cap > 0 && !recv)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_allgather on rank %d: recv is NULL, recv_cap = %zu", c->rank,
                           recv_cap);
    return TERSE_OK;
}

terse_status terse__allgather_run(terse_comm *c, const void *send, size_t send_bytes, void *recv,
                                  size_t recv_cap, size_t *counts, int *keep_usable) {
    const int N = c->nranks;
    /* 1. every rank's (send_bytes, recv_cap) */
    uint64_t *pairs = terse__comm_scratch(c, 1, (size_t)N * 4 * sizeof(uint64_t));
    if (!pairs) return TERSE_ERR_NOMEM;
    size_t *off = (size_t *)(void *)(pairs + 2 * (size_t)N), *len = off + N;
    uint64_t mine[2] = {send_bytes, recv_cap};
    TERSE_CHECK(terse__allgather_fixed(c, mine, sizeof mine, pairs));

    /* 2. the layout, and whether it fits everywhere */
    uint64_t total = 0;
    int overflow = 0;
    for (int r = 0; r < N; r++) {
        uint64_t b = pairs[2 * r];
        if (b > SIZE_MAX - total) overflow = 1;
        off[r] = (size_t)total;
        len[r] = (size_t)b;
        total += b;
        if (counts) counts[r] = (size_t)b;
    }
    if (overflow)
        return TERSE_ERROR(TERSE_ERR_INVALID, "terse_allgather: the blocks' total size overflows");
    for (int r = 0; r < N; r++)
        if (pairs[2 * r + 1] < total) {
            *keep_usable = 1;
            return TERSE_ERROR(TERSE_ERR_DST_TOO_SMALL,
                               "terse_allgather on rank %d: the blocks total %llu bytes but rank "
                               "%d's recv_cap is %llu (nothing was gathered; counts are filled)",
                               c->rank, (unsigned long long)total, r,
                               (unsigned long long)pairs[2 * r + 1]);
        }

    /* 3. our block into place, then the ring */
    if (send_bytes) memmove((uint8_t *)recv + off[c->rank], send, send_bytes);
    return terse__allgatherv_ring(c, recv, off, len);
}

