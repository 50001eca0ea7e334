/* terse_broadcast: root's bytes to every rank.
 *
 * Ranks are renumbered relative to the root, v = (rank - root) mod N, so
 * the root is v = 0.
 *
 * Small buffers (<= TERSE_RD_MAX_BYTES): a binomial tree. Rank v receives
 * from v minus its lowest set bit, then sends to v + 2^j for every 2^j
 * below that bit (MPICH's binomial broadcast): ceil(log2 N) rounds, each
 * rank receiving once.
 *
 * Large buffers: a pipelined chain 0 -> 1 -> ... -> N-1. The buffer is cut
 * into chunks of the ring chunk size; a rank forwards chunk k as soon as it
 * has it, while chunks k+1 .. k+depth-1 are already arriving, so the time
 * is about (bytes + (N-2) chunk) / bandwidth instead of log2 N whole
 * copies. Every rank receives the buffer once and sends it at most once.
 *
 * With several hosts (terse_comm_topology; not under TERSE_TOPOLOGY=flat)
 * both run over the ranks in host order instead of rank order: the root,
 * the other ranks of its host, then each other host's ranks (hosts in
 * index order, ranks ascending). The chain then crosses from one host to
 * the next H - 1 times, once per host, wherever the launcher put the
 * ranks (mpirun --map-by node deals them round-robin: rank order would
 * cross at every hop); the binomial tree's first, largest hops are the
 * ones between hosts. With ranks in blocks (terse-run) and root 0 the order
 * is the rank order, as before. */
#include <stdlib.h>

#include "algos/coll/coll.h"
#include "algos/coll/ring.h"
#include "common/error.h"

#define CHAIN_DEPTH 4

/* at[v]: the rank at position v of the broadcast's order (position 0 the
 * root); returns this rank's position. */
static int order(const terse_comm *c, int root, int *at) {
    const int N = c->nranks;
    if (!c->host_of || c->nhosts < 2 || c->params.topology == 1) {
        for (int v = 0; v < N; v++) at[v] = (v + root) % N;
        return (c->rank - root + N) % N;
    }
    int v = 0, mine = 0;
    const int first = c->host_of[root];
    for (int g = 0; g < c->nhosts; g++) {
        const int h = g == 0 ? first : (g <= first ? g - 1 : g);
        for (int q = 0; q < N; q++) {
            const int r = q == 0 ? root : (q <= root ? q - 1 : q);
            if (c->host_of[r] != h) continue;
            if (r == c->rank) mine = v;
            at[v++] = r;
        }
    }
    return mine;
}

static terse_status binomial(terse_comm *c, uint8_t *buf, size_t bytes, const int *at, int v) {
    const int N = c->nranks;
    const uint64_t tag = terse__comm_tag(c, 0);
    int mask = 1;
    while (mask < N) {
        if (v & mask) {
            int src = at[v - mask];
            TERSE_CHECK(terse__comm_irecv(c, src, tag, buf, bytes, TERSE__BYTES_PAYLOAD,
                                          &c->reqs[0]));
            TERSE_CHECK(terse__comm_wait(c, c->reqs, 1));
            break;
        }
        mask <<= 1;
    }
    size_t nreq = 0;
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (v + mask < N)
            TERSE_CHECK(terse__comm_isend(c, at[v + mask], tag, buf, bytes,
                                          TERSE__BYTES_PAYLOAD, &c->reqs[nreq++]));
    return terse__comm_wait(c, c->reqs, nreq);
}

static terse_status chain(terse_comm *c, uint8_t *buf, size_t bytes, const int *at, int v) {
    const int N = c->nranks;
    const int has_prev = v > 0, has_next = v < N - 1;
    const int prev = has_prev ? at[v - 1] : -1, next = has_next ? at[v + 1] : -1;
    const size_t K = terse__chunks_for(bytes, terse__ring_chunk_bytes(c));
    const size_t D = K < CHAIN_DEPTH ? K : CHAIN_DEPTH;
    terse__fabric_req *rx = c->reqs, *tx = c->reqs + CHAIN_DEPTH;
    size_t off, len;

    if (has_prev)
        for (size_t k = 0; k < D; k++) {
            terse__part(bytes, K, k, &off, &len);
            TERSE_CHECK(terse__comm_irecv(c, prev, terse__comm_tag(c, k), buf + off, len,
                                          TERSE__BYTES_PAYLOAD, &rx[k % D]));
        }
    for (size_t k = 0; k < K; k++) {
        terse__part(bytes, K, k, &off, &len);
        if (has_prev) TERSE_CHECK(terse__comm_wait(c, &rx[k % D], 1));
        if (has_next) {
            if (k >= D) TERSE_CHECK(terse__comm_wait(c, &tx[k % D], 1));
            TERSE_CHECK(terse__comm_isend(c, next, terse__comm_tag(c, k), buf + off, len,
                                          TERSE__BYTES_PAYLOAD, &tx[k % D]));
        }
        if (has_prev && k + D < K) {
            size_t o2, l2;
            terse__part(bytes, K, k + D, &o2, &l2);
            TERSE_CHECK(terse__comm_irecv(c, prev, terse__comm_tag(c, k + D), buf + o2, l2,
                                          TERSE__BYTES_PAYLOAD, &rx[k % D]));
        }
    }
    if (has_next)
        for (size_t k = K > D ? K - D : 0; k < K; k++)
            TERSE_CHECK(terse__comm_wait(c, &tx[k % D], 1));
    return TERSE_OK;
}

terse_status terse__broadcast_check(terse_comm *c, void *buf, size_t bytes, int root) {
    if (root < 0 || root >= c->nranks)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_broadcast on rank %d: root %d is not in [0, %d)", c->rank, root,
                           c->nranks);
    if (bytes > 0 && !buf)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_broadcast on rank %d: buf is NULL, bytes = %zu", c->rank, bytes);
    return TERSE_OK;
}

terse_status terse__broadcast_run(terse_comm *c, void *buf, size_t bytes, int root) {
    if (bytes == 0 || c->nranks == 1) return TERSE_OK;
    terse__comm_next_phase(c);
    int *at = malloc((size_t)c->nranks * sizeof *at);
    if (!at) return TERSE_ERROR(TERSE_ERR_NOMEM, "terse_broadcast on rank %d: %d ranks' order",
                                c->rank, c->nranks);
    const int v = order(c, root, at);
    terse_status s = bytes <= terse__rd_max_bytes(c) ? binomial(c, buf, bytes, at, v)
                                                      : chain(c, buf, bytes, at, v);
    free(at);
    return s;
}
