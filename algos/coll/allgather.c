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
 * With several hosts of equal size and more than one rank on each (not
 * under TERSE_TOPOLOGY=flat), terse__allgatherv_ring gathers
 * hierarchically instead (hier_gather): first along the rails -- every
 * rank sends its block to the ranks of its local rank on the other hosts,
 * so each block crosses to each other host once -- then inside the host,
 * where every rank hands the H blocks of its rail to each other local rank
 * (shm). A host link then carries the other hosts' blocks once, (H-1) L
 * blocks, where a ring in host order carries N - 1 at each crossing. The
 * results are copies: the same bytes either way.
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

/* The requests of either phase must fit the communicator's. */
static int hier_gather_fits(const terse_comm *c) {
    return terse__hier_fits(c) && 2 * (c->nhosts - 1) <= TERSE__COMM_MAX_REQS &&
           2 * (c->local_size - 1) * c->nhosts <= TERSE__COMM_MAX_REQS;
}

static terse_status hier_gather(terse_comm *c, uint8_t *buf, const size_t *off,
                                const size_t *len) {
    const int H = c->nhosts, L = c->local_size, h = c->host_index, l = c->local_rank;
    int local[TERSE__COMM_MAX_REQS] = {0}, rail[TERSE__COMM_MAX_REQS] = {0};
    terse__hier_peers(c, local, rail);
    /* 1. along the rail: our block out, the rail's blocks in */
    terse__comm_next_phase(c);
    size_t nreq = 0;
    const uint64_t tag = terse__comm_tag(c, 0);
    for (int g = 0; g < H; g++) {
        const int q = rail[g];
        if (g == h) continue;
        if (len[q])
            TERSE_CHECK(terse__comm_irecv(c, q, tag, buf + off[q], len[q], TERSE__BYTES_PAYLOAD,
                                          &c->reqs[nreq++]));
        if (len[c->rank])
            TERSE_CHECK(terse__comm_isend(c, q, tag, buf + off[c->rank], len[c->rank],
                                          TERSE__BYTES_PAYLOAD, &c->reqs[nreq++]));
    }
    TERSE_CHECK(terse__comm_wait(c, c->reqs, nreq));
    /* 2. inside the host: the rail's H blocks to every other local rank,
     * theirs from them; message g carries host g's block */
    terse__comm_next_phase(c);
    nreq = 0;
    for (int j = 0; j < L; j++) {
        if (j == l) continue;
        for (int g = 0; g < H; g++) {
            const int mine = g == h ? c->rank : rail[g];
            const int theirs = terse__hier_rank_at(c, g, j);
            const uint64_t t = terse__comm_tag(c, (uint64_t)g);
            if (len[theirs])
                TERSE_CHECK(terse__comm_irecv(c, local[j], t, buf + off[theirs], len[theirs],
                                              TERSE__BYTES_PAYLOAD, &c->reqs[nreq++]));
            if (len[mine])
                TERSE_CHECK(terse__comm_isend(c, local[j], t, buf + off[mine], len[mine],
                                              TERSE__BYTES_PAYLOAD, &c->reqs[nreq++]));
        }
    }
    return terse__comm_wait(c, c->reqs, nreq);
}

terse_status terse__allgatherv_ring(terse_comm *c, uint8_t *buf, const size_t *off,
                                    const size_t *len) {
    if (c->nranks > 1 && hier_gather_fits(c)) return hier_gather(c, buf, off, len);
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

