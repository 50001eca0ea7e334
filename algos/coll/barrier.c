/* terse_barrier: the dissemination barrier (Hensgen, Finkel and Manber,
 * 1988). In round j = 0, 1, .. ceil(log2 N) - 1 each rank sends an empty
 * message to rank + 2^j and waits for one from rank - 2^j (mod N). After
 * round j a rank has heard, directly or through others, from the 2^(j+1)
 * ranks before it; after the last round, from all of them, so nobody
 * leaves before everyone has entered. Any N, no root, log2 N latency.
 * With the host's shared segment (every rank on one host), each rank
 * publishes its arrival there and waits for the others' instead
 * (seg_allreduce.c): no message at all. In a job over several hosts with
 * each host's segment (c->lseg_on), a host's ranks arrive in its segment
 * and only the hosts' first ranks exchange messages (terse__barrier_hier_seg). */
#include "algos/coll/coll.h"
#include "common/error.h"

terse_status terse__barrier_run(terse_comm *c) {
    const int N = c->nranks;
    if (N == 1) return TERSE_OK;
    if (c->seg) return terse__barrier_seg(c);
    if (c->lseg_on) return terse__barrier_hier_seg(c);
    terse__comm_next_phase(c);
    static const char none;
    char sink;
    uint64_t round = 0;
    for (int dist = 1; dist < N; dist *= 2, round++) {
        uint64_t tag = terse__comm_tag(c, round);
        TERSE_CHECK(terse__comm_irecv(c, (c->rank - dist % N + N) % N, tag, &sink, 0,
                                      TERSE__BYTES_FRAMING, &c->reqs[0]));
        TERSE_CHECK(terse__comm_isend(c, (c->rank + dist) % N, tag, &none, 0,
                                      TERSE__BYTES_FRAMING, &c->reqs[1]));
        TERSE_CHECK(terse__comm_wait(c, c->reqs, 2));
    }
    return TERSE_OK;
}

