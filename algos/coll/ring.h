/* The ring pipeline shared by the ring all-reduce and the ring
 * all-gather, and the partitioning arithmetic they both use.
 *
 * A ring collective is a sequence of messages ("ops"): op i sends one
 * chunk to the right neighbour and receives one chunk from the left, with
 * the same tag on both sides, so the left neighbour's op i is what this
 * rank's op i receives. Ops are laid out step by step, K chunks per step:
 * op i = step i / K, chunk i % K. The chunk a step sends is always the
 * chunk the previous step received, i.e. op i sends what op i - K
 * received. The engine keeps up to `depth` <= K ops in flight, so op i - K
 * has completed (and been reduced) before op i is posted, while the
 * reduction of one chunk overlaps the transfer of the next ones.
 *
 * The ring runs in the communicator's ring order (comm.h, ring_at): the
 * neighbours are the ranks before and after this one's position, and a
 * plan numbers its steps by terse__ring_pos(c) (never c->ring_pos itself:
 * a colocated server's twin communicators leave ring_at NULL and ring_pos
 * 0), not c->rank. */
#ifndef TERSE_ALGOS_RING_H
#define TERSE_ALGOS_RING_H

#include <stddef.h>
#include <stdint.h>

#include "algos/coll/coll.h"

/* Part i of `total` items split into `parts` (>= 1) nearly equal parts:
 * the first total % parts parts hold one item more. Parts may be empty
 * when total < parts. */
static inline void terse__part(size_t total, size_t parts, size_t i, size_t *off, size_t *len) {
    size_t q = total / parts, r = total % parts;
    *off = i * q + (i < r ? i : r);
    *len = q + (i < r ? 1 : 0);
}

/* The number of chunks to cut a block of `max_bytes` (the largest block of
 * the collective) into, so each chunk holds at most chunk_bytes: >= 1. */
static inline size_t terse__chunks_for(size_t max_bytes, size_t chunk_bytes) {
    if (chunk_bytes == 0) chunk_bytes = 1;
    size_t k = max_bytes / chunk_bytes + (max_bytes % chunk_bytes != 0);
    return k ? k : 1;
}

/* The chunk size the ring pipelines in (TERSE_RING_CHUNK_BYTES, default
 * 512 KiB, 4 KiB .. 1 GiB, whole cache lines), as agreed at init. */
static inline size_t terse__ring_chunk_bytes(const terse_comm *c) {
    return c->params.ring_chunk_bytes;
}

/* This rank's position in the ring order (comm.h, ring_at): its rank
 * unless the order differs from the rank order. */
static inline size_t terse__ring_pos(const terse_comm *c) {
    return (size_t)(c->ring_at ? c->ring_pos : c->rank);
}

/* What one op moves: byte ranges of the collective's buffer. */
typedef struct terse__ring_op {
    size_t send_off, send_len; /* to the right neighbour */
    size_t recv_off, recv_len; /* from the left neighbour */
    int reduce;                /* stage the receive and add it into buf (fp32) */
    int finish;                /* after the add, divide by the schedule's divisor */
} terse__ring_op;

typedef struct terse__ring_sched {
    size_t nops;   /* steps * nchunks */
    size_t nchunks; /* K: ops per step */
    size_t max_chunk_bytes; /* the largest receive of any reducing op */
    int reduces;    /* some op reduces (a staging buffer is needed) */
    float divisor;  /* for finish ops */
    terse__bytes_kind kind;
    /* Fill *op for op i (0 <= i < nops); the same function on every rank. */
    void (*plan)(const void *ctx, size_t i, terse__ring_op *op);
    const void *ctx;
} terse__ring_sched;

/* Run the schedule over buf. Returns the first error (transport, timeout,
 * lost peer); the caller's terse__comm_end marks the communicator failed. */
terse_status terse__ring_run(terse_comm *c, uint8_t *buf, const terse__ring_sched *s);

/* dst[i] += src[i] (and / divisor if divide) for n floats. */
void terse__reduce_add(float *dst, const float *src, size_t n, int divide, float divisor);

#endif
