/* The hierarchical dense all-reduce (issue 28, stage 3; Horovod's
 * hierarchical allreduce, Open MPI's coll/han): with H hosts, the smallest
 * of which holds S ranks, the buffer is cut into S shards (nearly equal
 * parts), and on every host local rank l < S owns shard l (with hosts of
 * equal size, every rank owns one; a host's ranks beyond the S-th own
 * none, and with a host of one rank S is 1: a leader per host):
 *   1. reduce-scatter inside the host: every local rank sends shard j
 *      (j < S) to local rank j, and the owner sums its shard's L_h copies
 *      in local-rank order (shm: the routed side endpoint);
 *   2. across hosts, one "rail" per shard, all rails at once: the owners
 *      of shard l on the H hosts exchange their host sums and each adds
 *      the H of them in host order (the network), dividing by the rank
 *      count for an average;
 *   3. all-gather inside the host: every owner sends its shard to the
 *      other local ranks.
 * Pipelined by segments (each shard of a segment two ring chunks, 1 MiB
 * by default): phase 1 of segment t, phase 2 of t - 1 and phase 3 of
 * t - 2 are posted together, so the intra-host phases overlap the
 * inter-host one.
 * Bytes crossing the host link per owner each way: (H-1)/S of the tensor, per
 * host (H-1) tensors
 * (at H = 2: half a shard-set, against the flat ring's 2(N-1)/N x the
 * share of its hops that cross hosts). Phase 2 is a direct exchange (every
 * rail member sends its shard to every other), the fewest steps at small
 * H; at larger H a ring over the rail would move fewer bytes (not built).
 *
 * Bitwise identity: each shard's sum is (sum over hosts in host order of
 * (sum over local ranks in local-rank order)), computed from the same
 * bits in the same order by every member of its rail, then copied; every
 * rank therefore ends with the same bits, and the same n and host table
 * give the same bits run to run (not the flat ring's bits: another order). */
#include <string.h>

#include "algos/coll/coll.h"
#include "algos/coll/ring.h"
#include "common/error.h"

int terse__hier_rank_at(const terse_comm *c, int h, int l) {
    for (int r = 0, seen = 0; r < c->nranks; r++)
        if (c->host_of[r] == h && seen++ == l) return r;
    return -1;
}

void terse__hier_peers(const terse_comm *c, int *local, int *rail) {
    for (int j = 0; j < c->local_size; j++)
        local[j] = j == c->local_rank ? c->rank : terse__hier_rank_at(c, c->host_index, j);
    for (int g = 0; g < c->nhosts; g++)
        rail[g] = g == c->host_index ? c->rank : terse__hier_rank_at(c, g, c->local_rank);
}

/* Every rank decides alike: from the job's host table, not its own host
 * (comm.h, terse__comm_hier_dense_fits). */
static int dense_fits(const terse_comm *c) { return terse__comm_hier_dense_fits(c); }

int terse__hier_fits(const terse_comm *c) { return dense_fits(c) && c->uniform_hosts; }

int terse__hier_wanted(const terse_comm *c, size_t n) {
    if (!dense_fits(c)) return 0;
    if (c->params.topology == 2) return 1; /* hier: always */
    return n > terse__rd_max_bytes(c) / sizeof(float); /* auto: where the ring would run */
}

/* Sum the k slots of tmp (each `len` floats, `stride` apart) in slot
 * order into dst, dividing the last add by divisor if divide. */
static void sum_slots(float *dst, const float *tmp, int k, size_t stride, size_t len, int divide,
                      float divisor) {
    memcpy(dst, tmp, len * sizeof(float));
    for (int j = 1; j < k; j++)
        terse__reduce_add(dst, tmp + (size_t)j * stride, len, divide && j == k - 1, divisor);
}

/* Segment seg's shard j: offset and length in floats. */
typedef struct {
    size_t n, nseg;
    int L;
} layout;
static void shard(const layout *y, size_t seg, int j, size_t *off, size_t *len) {
    size_t so, sl;
    terse__part(y->n, y->nseg, seg, &so, &sl);
    terse__part(sl, (size_t)y->L, (size_t)j, off, len);
    *off += so;
}

terse_status terse__allreduce_hier(terse_comm *c, float *buf, size_t n, int divide) {
    const int L = c->local_size, S = c->local_min, H = c->nhosts, l = c->local_rank,
              h = c->host_index;
    const int owner = l < S; /* of shard l */
    if (n == 0) return TERSE_OK;
    /* segments whose shards hold two ring chunks each: phase 1 of segment
     * t, phase 2 of t - 1 and phase 3 of t - 2 travel together, so the
     * shm phases hide behind the network's */
    size_t per_shard = 2 * terse__ring_chunk_bytes(c) / sizeof(float);
    layout y = {n, (n + (size_t)S * per_shard - 1) / ((size_t)S * per_shard), S};
    if (y.nseg == 0) y.nseg = 1;
    size_t stride = (n / y.nseg + 1) / (size_t)S + 1;
    stride = (stride + 15) & ~(size_t)15; /* whole cache lines, and above any shard */
    float *tmp_a = terse__comm_scratch(c, 3, (size_t)(L + H) * stride * sizeof(float));
    if (!tmp_a) return TERSE_ERR_NOMEM;
    float *tmp_b = tmp_a + (size_t)L * stride;
    int local[TERSE__COMM_MAX_REQS] = {0}, rail[TERSE__COMM_MAX_REQS] = {0};
    terse__hier_peers(c, local, rail);
    const float divisor = (float)c->nranks;

    for (size_t t = 0; t < y.nseg + 2; t++) {
        terse__comm_next_phase(c);
        size_t nreq = 0, off, len, moff = 0, mlen = 0;
        /* 1. segment t: every local rank's copy of a shard goes to its
         * owner; an owner receives its shard's */
        if (t < y.nseg) {
            const uint64_t tag = terse__comm_tag(c, 0);
            if (owner) {
                shard(&y, t, l, &moff, &mlen);
                for (int j = 0; j < L; j++) {
                    if (j == l) continue;
                    TERSE_CHECK(terse__comm_irecv(c, local[j], tag, tmp_a + (size_t)j * stride,
                                                  mlen * sizeof(float), TERSE__BYTES_PAYLOAD,
                                                  &c->reqs[nreq++]));
                }
                memcpy(tmp_a + (size_t)l * stride, buf + moff, mlen * sizeof(float));
            }
            for (int k = 0; k < S; k++) {
                if (k == l) continue;
                shard(&y, t, k, &off, &len);
                TERSE_CHECK(terse__comm_isend(c, local[k], tag, buf + off, len * sizeof(float),
                                              TERSE__BYTES_PAYLOAD, &c->reqs[nreq++]));
            }
        }
        /* 2. segment t - 1: our shard's host sums across the rail */
        if (owner && t >= 1 && t - 1 < y.nseg) {
            const uint64_t tag = terse__comm_tag(c, 1);
            shard(&y, t - 1, l, &moff, &mlen);
            for (int g = 0; g < H; g++) {
                if (g == h) continue;
                TERSE_CHECK(terse__comm_irecv(c, rail[g], tag, tmp_b + (size_t)g * stride,
                                              mlen * sizeof(float), TERSE__BYTES_PAYLOAD,
                                              &c->reqs[nreq++]));
                TERSE_CHECK(terse__comm_isend(c, rail[g], tag, buf + moff, mlen * sizeof(float),
                                              TERSE__BYTES_PAYLOAD, &c->reqs[nreq++]));
            }
            memcpy(tmp_b + (size_t)h * stride, buf + moff, mlen * sizeof(float));
        }
        /* 3. segment t - 2: the final shards go round the host */
        if (t >= 2) {
            const uint64_t tag = terse__comm_tag(c, 2);
            for (int k = 0; k < S; k++) { /* every other owner's shard comes here */
                if (k == l) continue;
                shard(&y, t - 2, k, &off, &len);
                TERSE_CHECK(terse__comm_irecv(c, local[k], tag, buf + off, len * sizeof(float),
                                              TERSE__BYTES_PAYLOAD, &c->reqs[nreq++]));
            }
            if (owner) {
                shard(&y, t - 2, l, &moff, &mlen);
                for (int j = 0; j < L; j++) {
                    if (j == l) continue;
                    TERSE_CHECK(terse__comm_isend(c, local[j], tag, buf + moff,
                                                  mlen * sizeof(float), TERSE__BYTES_PAYLOAD,
                                                  &c->reqs[nreq++]));
                }
            }
        }
        TERSE_CHECK(terse__comm_wait(c, c->reqs, nreq));
        uint64_t t0 = terse__now_ns();
        if (owner && t < y.nseg) {
            shard(&y, t, l, &moff, &mlen);
            sum_slots(buf + moff, tmp_a, L, stride, mlen, 0, 1.0f);
        }
        if (owner && t >= 1 && t - 1 < y.nseg) {
            shard(&y, t - 1, l, &moff, &mlen);
            sum_slots(buf + moff, tmp_b, H, stride, mlen, divide, divisor);
        }
        terse__comm_codec_time(c, t0);
    }
    return TERSE_OK;
}
