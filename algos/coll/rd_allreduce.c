/* Recursive-doubling all-reduce for small buffers: log2 rounds of whole-
 * buffer exchanges instead of the ring's 2 (N-1) steps, so latency, not
 * bandwidth, sets its cost (Thakur, Rabenseifner and Gropp, "Optimization
 * of Collective Communication Operations in MPICH", 2005).
 *
 * Any rank count: let p be the largest power of two <= N and rem = N - p.
 *   1. Fold: among the first 2 rem ranks, each even rank sends its buffer
 *      to the odd rank above it, which adds it (x_even + x_odd) and stands
 *      for both; the even rank sits out. The p remaining ranks are
 *      renumbered 0 .. p-1.
 *   2. Rounds, mask = 1, 2, .. p/2: exchange the whole buffer with the
 *      partner whose new number differs in bit `mask`, and add.
 *   3. Unfold: each odd rank of step 1 sends the result to its even rank.
 *
 * Bitwise identity. After round `mask`, every member of an aligned group
 * of 2 mask new ranks holds the sum of that group, computed as
 * (sum of the lower half) + (sum of the upper half). Both halves are, by
 * induction, bit-identical on all their members, and IEEE addition is
 * commutative, so a + b on one partner and b + a on the other give the
 * same bits. The tree is therefore one fixed pairwise tree over the ranks
 * (leaves folded as in step 1), evaluated identically on every rank, and
 * the same n and N always give the same bits. An average divides the
 * final sum by N on every rank: the same operation on the same bits. */
#include <stdlib.h>
#include <string.h>

#include "algos/coll/coll.h"
#include "algos/coll/ring.h"
#include "common/error.h"

/* The real rank standing for new rank v after the fold. */
static int real_rank(int v, int rem) { return v < rem ? 2 * v + 1 : v + rem; }

/* Exchange the whole buffer with `peer` as message `msg`: receive into
 * tmp, send buf. */
static terse_status exchange(terse_comm *c, int peer, uint64_t msg, float *buf, float *tmp,
                             size_t bytes, int do_send, int do_recv) {
    uint64_t tag = terse__comm_tag(c, msg);
    size_t nreq = 0;
    if (do_recv)
        TERSE_CHECK(terse__comm_irecv(c, peer, tag, tmp, bytes, TERSE__BYTES_PAYLOAD,
                                      &c->reqs[nreq++]));
    if (do_send)
        TERSE_CHECK(terse__comm_isend(c, peer, tag, buf, bytes, TERSE__BYTES_PAYLOAD,
                                      &c->reqs[nreq++]));
    return terse__comm_wait(c, c->reqs, nreq);
}

terse_status terse__allreduce_rd(terse_comm *c, float *buf, size_t n, int divide) {
    const int N = c->nranks, r = c->rank;
    if (n == 0 || N == 1) return TERSE_OK;
    terse__comm_next_phase(c);
    const size_t bytes = n * sizeof(float);
    float *tmp = terse__comm_scratch(c, 3, bytes);
    if (!tmp) return TERSE_ERR_NOMEM;
    int p = 1;
    while (p * 2 <= N) p *= 2;
    const int rem = N - p;
    uint64_t msg = 0;

    /* 1. fold the first 2 rem ranks pairwise */
    int v; /* new rank, or -1 while sitting out */
    if (r < 2 * rem) {
        if (r % 2 == 0) {
            TERSE_CHECK(exchange(c, r + 1, msg, buf, tmp, bytes, 1, 0));
            v = -1;
        } else {
            TERSE_CHECK(exchange(c, r - 1, msg, buf, tmp, bytes, 0, 1));
            uint64_t t0 = terse__now_ns();
            terse__reduce_add(buf, tmp, n, 0, 1.0f);
            terse__comm_codec_time(c, t0);
            v = r / 2;
        }
    } else {
        v = r - rem;
    }
    msg++;

    /* 2. recursive doubling among the p remaining ranks */
    for (int mask = 1; mask < p; mask <<= 1, msg++) {
        if (v < 0) continue;
        int peer = real_rank(v ^ mask, rem);
        TERSE_CHECK(exchange(c, peer, msg, buf, tmp, bytes, 1, 1));
        uint64_t t0 = terse__now_ns();
        terse__reduce_add(buf, tmp, n, 0, 1.0f);
        terse__comm_codec_time(c, t0);
    }

    /* 3. the average, then unfold to the ranks that sat out */
    if (v >= 0 && divide) {
        uint64_t t0 = terse__now_ns();
        const float d = (float)N;
        for (size_t i = 0; i < n; i++) buf[i] /= d;
        terse__comm_codec_time(c, t0);
    }
    if (r < 2 * rem) {
        if (r % 2 == 0)
            TERSE_CHECK(exchange(c, r + 1, msg, tmp, buf, bytes, 0, 1));
        else
            TERSE_CHECK(exchange(c, r - 1, msg, buf, tmp, bytes, 1, 0));
    }
    return TERSE_OK;
}
