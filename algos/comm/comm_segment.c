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

/* Every rank on this host over shm: one segment for the job. */
static int wanted_one(const terse_comm *c) {
    return c->nhosts == 1 && c->params.shm_segment == 0 && !c->wire_mac &&
           strcmp(c->provider, "shm") == 0;
}

/* Several hosts, several ranks on some, where the hierarchical all-reduce
 * can run over the segments: a segment on each such host, for its
 * intra-host phases (and the barrier). Decided from what every
 * rank shares (agreed parameters, the host table), so all ranks want it
 * alike. The shm side is not authenticated unless TERSE_WIRE asks for mac
 * or seal everywhere (setup_wire in comm_join.c): then neither is this. */
static int wanted_hosts(const terse_comm *c) {
    return terse__comm_hier_seg_fits(c) && c->params.shm_segment == 0 && c->params.wire < 2;
}

/* The rank that makes this rank's segment: rank 0, or its host's first. */
static int creator_of(const terse_comm *c, int hosts) {
    if (!hosts) return 0;
    for (int r = 0; r < c->nranks; r++)
        if (c->host_of[r] == c->host_index) return r;
    return c->rank;
}

terse_status terse__comm_segment_setup(terse_comm *c, int rejoin, int timeout_ms) {
    /* every rank of a job of several runs both rounds, whatever its own
     * view (a replacement may land on another host) */
    if (c->nranks < 2 || !c->store) return TERSE_OK;
    const size_t step = terse__comm_seg_step_bytes(c) / sizeof(float);
    uint8_t mine[REC1] = {0};
    terse__seg *seg = NULL;
    const int hosts = !rejoin && !wanted_one(c) && wanted_hosts(c);
    int want = !rejoin && (wanted_one(c) || hosts);
    /* this rank's group: the job, or its host's ranks (none to share with
     * on a host of one: no segment there, but it takes part) */
    const int members = hosts ? c->local_size : c->nranks, me = hosts ? c->local_rank : c->rank;
    const int creator = creator_of(c, hosts), grouped = members >= 2;
    char why[400] = "";
    if (want && grouped && c->rank == creator) {
        char name[TERSE__SEG_NAME] = {0};
        uint64_t cookie = 0;
        if (terse__seg_create(c->rank, members, step, name, &cookie, &seg) == TERSE_OK) {
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
    } else if (every && (c->rank == creator || !grouped)) {
        ok = 1;
    } else if (every) {
        const uint8_t *rec = a + (size_t)creator * REC1;
        char name[TERSE__SEG_NAME];
        memcpy(name, rec + 9, TERSE__SEG_NAME);
        name[TERSE__SEG_NAME - 1] = 0;
        if (terse__seg_attach(c->rank, name, members, step, terse__get_u64(rec + 1), &seg) ==
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
    terse__seg_unlink(seg); /* the creator: everyone attached, or gave up */
    if (s != TERSE_OK || !every || !ok) {
        terse__seg_close(seg);
        seg = NULL;
    }
    if (why[0])
        fprintf(stderr, "terse: rank %d: no shared segment (libfabric's shm carries the "
                        "%s instead): %s\n", c->rank,
                hosts ? "hierarchical all-reduce's intra-host phases" : "all-reduce", why);
    if (s != TERSE_OK) return s;
    if (hosts) {
        c->lseg = seg;
        c->lseg_on = every && ok;
    } else {
        c->seg = seg;
    }
    if (seg) {
        terse__seg_flags *f = terse__seg_flags_of(seg, me);
        atomic_store_explicit(&f->pid, (int64_t)c->pid, memory_order_relaxed);
    }
    return TERSE_OK;
}

void terse__comm_segment_close(terse_comm *c) {
    terse__seg_close(c->seg);
    c->seg = NULL;
    terse__seg_close(c->lseg);
    c->lseg = NULL;
    c->lseg_on = 0;
}
