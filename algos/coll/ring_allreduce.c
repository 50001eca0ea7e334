/* Dense ring all-reduce: reduce-scatter, then all-gather, pipelined in
 * chunks (NCCL's ring, gloo's allreduce_ring).
 *
 * The buffer of n floats is cut into N segments (N = ranks; terse__part,
 * so any n works: segments differ by at most one element and are empty
 * when n < N), and every segment into K chunks of at most the ring chunk
 * size. With r this rank, and all segment numbers mod N:
 *
 * (r is this rank's position in the ring order, ring.h: its rank when the
 * ranks sit in blocks of hosts.)
 *
 *   Reduce-scatter, steps t = 0 .. N-2: send segment r - t to the right,
 *   receive segment r - t - 1 from the left and add it into our copy.
 *   Segment j thus starts at rank j and travels the ring once, picking up
 *   one term per rank: after step N-2, rank j - 1 holds
 *       (((x_j + x_j+1) + x_j+2) + ... ) + x_j-1
 *   -- a fixed order that depends only on j, n and N, never on timing.
 *   The finishing add divides by N for an average, so the division too
 *   happens exactly once per element.
 *
 *   All-gather, steps t = 0 .. N-2: send segment r + 1 - t (at t = 0 the
 *   segment this rank finished), receive segment r - t into place. Every
 *   rank ends with the finishing rank's bits, so all ranks hold identical
 *   results and reruns reproduce them.
 *
 * Each rank sends 2 (N-1) segments: 2 (N-1)/N of the buffer, the ring's
 * bandwidth optimum. */
#include "algos/coll/coll.h"
#include "algos/coll/ring.h"

typedef struct {
    size_t n;      /* floats */
    size_t N, r, K;
    int divide;
} ring_plan;

/* The byte range of chunk k of segment s. */
static void locate(const ring_plan *p, size_t s, size_t k, size_t *off, size_t *len) {
    size_t soff, slen, coff, clen;
    terse__part(p->n, p->N, s, &soff, &slen);
    terse__part(slen, p->K, k, &coff, &clen);
    *off = (soff + coff) * sizeof(float);
    *len = clen * sizeof(float);
}

static void plan_op(const void *ctx, size_t i, terse__ring_op *op) {
    const ring_plan *p = ctx;
    size_t per_phase = (p->N - 1) * p->K;
    size_t phase = i / per_phase, t = (i % per_phase) / p->K, k = i % p->K;
    /* r + N*2 keeps the subtraction below in range (t <= N - 2). */
    size_t base = p->r + 2 * p->N;
    if (phase == 0) {
        locate(p, (base - t) % p->N, k, &op->send_off, &op->send_len);
        locate(p, (base - t - 1) % p->N, k, &op->recv_off, &op->recv_len);
        op->reduce = 1;
        op->finish = p->divide && t == p->N - 2;
    } else {
        locate(p, (base + 1 - t) % p->N, k, &op->send_off, &op->send_len);
        locate(p, (base - t) % p->N, k, &op->recv_off, &op->recv_len);
        op->reduce = 0;
        op->finish = 0;
    }
}

terse_status terse__allreduce_ring(terse_comm *c, float *buf, size_t n, int divide) {
    size_t N = (size_t)c->nranks;
    if (n == 0 || N == 1) return TERSE_OK; /* x / 1 == x: nothing to divide */
    terse__comm_next_phase(c);
    ring_plan p = {n, N, terse__ring_pos(c), 1, divide}; /* segments by ring position */
    size_t max_seg = n / N + (n % N != 0); /* floats in the largest segment */
    p.K = terse__chunks_for(max_seg * sizeof(float), terse__ring_chunk_bytes(c));
    size_t max_chunk = max_seg / p.K + (max_seg % p.K != 0);
    terse__ring_sched s = {
        .nops = 2 * (N - 1) * p.K,
        .nchunks = p.K,
        .max_chunk_bytes = max_chunk * sizeof(float),
        .reduces = 1,
        .divisor = (float)N,
        .kind = TERSE__BYTES_PAYLOAD,
        .plan = plan_op,
        .ctx = &p,
    };
    return terse__ring_run(c, (uint8_t *)buf, &s);
}
