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
 * With several hosts and more than one rank on some (not under
 * TERSE_TOPOLOGY=flat), of any sizes, terse__allgatherv_ring gathers
 * hierarchically instead (hier_gather): first across hosts -- every rank
 * sends its block to one rank on each other host, its holder there (local
 * rank l mod L_g on a host of L_g ranks for the sender's local rank l: the
 * rail, with hosts of equal size) -- then inside the host, where every
 * rank hands the blocks it holds to each other local rank (shm). So each
 * block crosses to each other host once, and a host link carries the other
 * hosts' blocks once, where a ring in host order carries N - 1 at each
 * crossing. The results are copies: the same bytes either way.
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

/* Hosts of any sizes: block q (rank q, host g_q, local rank l_q) is held
 * on its own host by q, and on each other host g by local rank l_q mod L_g
 * (the rail when hosts are of equal size). The plan: for up to
 * GATHER_MAX_RANKS ranks, each rank's local rank, and each host's ranks in
 * rank order (at[start[g] + j] is host g's local rank j). */
#define GATHER_MAX_RANKS 256
typedef struct {
    int lr[GATHER_MAX_RANKS], at[GATHER_MAX_RANKS];
    int start[GATHER_MAX_RANKS + 1], size[GATHER_MAX_RANKS];
} host_plan;

static int holder_on(const terse_comm *c, const host_plan *p, int q, int g) {
    if (c->host_of[q] == g) return q;
    return p->at[p->start[g] + p->lr[q] % p->size[g]];
}

/* Fill the plan; whether the requests of either phase fit the
 * communicator's on every rank (the same answer everywhere: from the host
 * table only). */
static int hier_gather_fits(const terse_comm *c, host_plan *p) {
    const int N = c->nranks, H = c->nhosts;
    if (c->params.topology == 1 || H < 2 || c->local_max < 2 || !c->host_of ||
        N > GATHER_MAX_RANKS || H > TERSE__COMM_MAX_REQS)
        return 0;
    for (int g = 0; g < H; g++) p->size[g] = 0;
    for (int r = 0; r < N; r++) p->lr[r] = p->size[c->host_of[r]]++;
    p->start[0] = 0;
    for (int g = 0; g < H; g++) p->start[g + 1] = p->start[g] + p->size[g];
    for (int r = 0; r < N; r++) p->at[p->start[c->host_of[r]] + p->lr[r]] = r;
    int held[GATHER_MAX_RANKS]; /* blocks each rank holds: its own and those it receives */
    for (int r = 0; r < N; r++) held[r] = 1;
    for (int q = 0; q < N; q++)
        for (int g = 0; g < H; g++)
            if (g != c->host_of[q]) held[holder_on(c, p, q, g)]++;
    /* phase 1: a send to every other host, a receive per block held but its
     * own; phase 2: every held block to every other local rank, and the
     * host's other blocks (N - held) from them */
    for (int r = 0; r < N; r++)
        if ((H - 1) + (held[r] - 1) > TERSE__COMM_MAX_REQS ||
            (p->size[c->host_of[r]] - 1) * held[r] + (N - held[r]) > TERSE__COMM_MAX_REQS)
            return 0;
    return 1;
}

static terse_status hier_gather(terse_comm *c, uint8_t *buf, const size_t *off,
                                const size_t *len, const host_plan *p) {
    const int N = c->nranks, H = c->nhosts, h = c->host_index, me = c->rank;
    /* 1. across hosts: our block to its holder on every other host; the
     * blocks we hold for other hosts' ranks in */
    terse__comm_next_phase(c);
    size_t nreq = 0;
    const uint64_t tag = terse__comm_tag(c, 0);
    for (int g = 0; g < H; g++) {
        if (g == h || !len[me]) continue;
        TERSE_CHECK(terse__comm_isend(c, holder_on(c, p, me, g), tag, buf + off[me],
                                      len[me], TERSE__BYTES_PAYLOAD, &c->reqs[nreq++]));
    }
    for (int q = 0; q < N; q++) {
        if (q == me || c->host_of[q] == h || !len[q] || holder_on(c, p, q, h) != me)
            continue;
        TERSE_CHECK(terse__comm_irecv(c, q, tag, buf + off[q], len[q], TERSE__BYTES_PAYLOAD,
                                      &c->reqs[nreq++]));
    }
    TERSE_CHECK(terse__comm_wait(c, c->reqs, nreq));
    /* 2. inside the host: every block we hold to every other local rank,
     * every block another local rank holds from it (message q carries
     * block q) */
    terse__comm_next_phase(c);
    nreq = 0;
    for (int q = 0; q < N; q++) {
        if (!len[q]) continue;
        const int holder = holder_on(c, p, q, h);
        const uint64_t t = terse__comm_tag(c, (uint64_t)q);
        if (holder == me) {
            for (int j = 0; j < N; j++)
                if (j != me && c->host_of[j] == h)
                    TERSE_CHECK(terse__comm_isend(c, j, t, buf + off[q], len[q],
                                                  TERSE__BYTES_PAYLOAD, &c->reqs[nreq++]));
        } else {
            TERSE_CHECK(terse__comm_irecv(c, holder, t, buf + off[q], len[q],
                                          TERSE__BYTES_PAYLOAD, &c->reqs[nreq++]));
        }
    }
    return terse__comm_wait(c, c->reqs, nreq);
}

terse_status terse__allgatherv_ring(terse_comm *c, uint8_t *buf, const size_t *off,
                                    const size_t *len) {
    host_plan *plan = terse__comm_scratch(c, TERSE__SCRATCH_PLAN, sizeof(host_plan));
    if (!plan) return TERSE_ERR_NOMEM;
    if (c->nranks > 1 && hier_gather_fits(c, plan)) return hier_gather(c, buf, off, len, plan);
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

