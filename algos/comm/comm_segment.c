/* The host's shared segment at init (comm.h; the segment itself is
 * transport/segment.h, the all-reduce over it algos/coll/seg_allreduce.c).
 *
 * Two store rounds, always both, on every rank of a job of several ranks
 * (the segment only when every rank is on one host): rank 0 makes the
 * segment and publishes {want, cookie, name}; every rank publishes whether it wants it; if all
 * do, the others attach; in the second round every rank publishes whether
 * it could; once that round is in, rank 0 removes the name. A replacement
 * (rejoin) runs both rounds too, wanting nothing: the store numbers its
 * all-gathers, and a later one (terse_ps_create's) must carry the same
 * number on the replacement as on the ranks it joins. The segment is used
 * only if every rank attached, so a rank that cannot (a full /dev/shm, a
 * seccomp filter) sends the job back to libfabric's shm, never splits it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algos/comm/comm.h"
#include "common/bytes.h"
#include "common/error.h"
#include "transport/segment.h"

#define REC1 (1 + 8 + TERSE__SEG_NAME)

static int wanted(const terse_comm *c) {
    return c->nhosts == 1 && c->params.shm_segment == 0 && !c->wire_mac &&
           strcmp(c->provider, "shm") == 0;
}

terse_status terse__comm_segment_setup(terse_comm *c, int rejoin, int timeout_ms) {
    /* every rank of a job of several runs both rounds, whatever its own
     * view (a replacement may land on another host) */
    if (c->nranks < 2 || !c->store) return TERSE_OK;
    const size_t step = c->params.segment_step_bytes / sizeof(float);
    uint8_t mine[REC1] = {0};
    terse__seg *seg = NULL;
    int want = !rejoin && wanted(c);
    char why[400] = "";
    if (want && c->rank == 0) {
        char name[TERSE__SEG_NAME] = {0};
        uint64_t cookie = 0;
        if (terse__seg_create(c->rank, c->nranks, step, name, &cookie, &seg) == TERSE_OK) {
            terse__put_u64(mine + 1, cookie);
            memcpy(mine + 9, name, TERSE__SEG_NAME);
        } else {
            snprintf(why, sizeof why, "%s", terse__comm_last_sentence());
            want = 0;
        }
    }
    mine[0] = (uint8_t)want;
    uint8_t *a = malloc((size_t)c->nranks * REC1);
    if (!a) {
        terse__seg_close(seg);
        return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: allocating the shared segment's records",
                           c->rank);
    }
    terse_status s = terse__store_allgather(c->store, mine, REC1, a, timeout_ms);
    int every = s == TERSE_OK;
    for (int r = 0; every && r < c->nranks; r++) every = a[(size_t)r * REC1] == 1;
    uint8_t ok = 0;
    if (rejoin) {
        every = 0; /* the others made theirs long ago; this one is not in it */
    } else if (every && c->rank == 0) {
        ok = 1;
    } else if (every) {
        char name[TERSE__SEG_NAME];
        memcpy(name, a + 9, TERSE__SEG_NAME);
        name[TERSE__SEG_NAME - 1] = 0;
        if (terse__seg_attach(c->rank, name, c->nranks, step, terse__get_u64(a + 1), &seg) ==
            TERSE_OK)
            ok = 1;
        else
            snprintf(why, sizeof why, "%s", terse__comm_last_sentence());
    }
    free(a);
    if (s == TERSE_OK) {
        uint8_t *o = malloc((size_t)c->nranks);
        if (!o) s = TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: allocating", c->rank);
        if (s == TERSE_OK) s = terse__store_allgather(c->store, &ok, 1, o, timeout_ms);
        for (int r = 0; s == TERSE_OK && r < c->nranks; r++) ok = ok && o[r] == 1;
        free(o);
    }
    terse__seg_unlink(seg); /* rank 0: everyone attached, or gave up */
    if (s != TERSE_OK || !every || !ok) {
        terse__seg_close(seg);
        seg = NULL;
    }
    if (why[0])
        fprintf(stderr, "terse: rank %d: no shared segment (libfabric's shm carries the "
                        "all-reduce instead): %s\n", c->rank, why);
    if (s != TERSE_OK) return s;
    c->seg = seg;
    if (seg) {
        terse__seg_flags *f = terse__seg_flags_of(seg, c->rank);
        atomic_store_explicit(&f->pid, (int64_t)c->pid, memory_order_relaxed);
    }
    return TERSE_OK;
}

void terse__comm_segment_close(terse_comm *c) {
    terse__seg_close(c->seg);
    c->seg = NULL;
}
