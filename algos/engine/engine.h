/* The engine: requests, their queue and the executor that runs them
 * (engine.c), offered to the public calls (engine_api.c, comm_api.c) and,
 * through EXT requests, to the parameter server (algos/ps/). It sits on
 * the collectives (algos/coll/coll.h), which know nothing of it. Internal
 * to algos/; the lock is c->lock throughout. */
#ifndef TERSE_ALGOS_ENGINE_H
#define TERSE_ALGOS_ENGINE_H

#include "algos/coll/coll.h"

/* Start the progress thread (unless TERSE_PROGRESS=caller) and the locks. */
terse_status terse__engine_init(terse_comm *c);
/* Abort what is in flight, stop the thread, complete every request still
 * queued with TERSE_ERR_ABORTED. */
void terse__engine_shutdown(terse_comm *c);

/* Start an EXT request (tmpl->kind TERSE__OP_EXT): refused on an aborted,
 * failed or forked communicator, but a refusal does not refuse later
 * starts (EXT operations are not collectives). *out NULL on failure. */
terse_status terse__engine_start_ext(terse_comm *c, const terse_request *tmpl,
                                     terse_request **out);
/* An EXT request as a blocking call. */
terse_status terse__engine_run_ext(terse_comm *c, terse_request *r);
/* A request template for c. */
terse_request terse__engine_make(terse_comm *c, terse__op_kind kind);

/* "terse_allreduce", ... for sentences. */
const char *terse__engine_kind_name(terse__op_kind k);
/* A recorded sentence without its leading status name, for quoting. */
const char *terse__engine_unprefixed(const char *e);
/* 1 once r's status and error are final (acquire). */
int terse__engine_is_done(const terse_request *r);
/* Append r to the queue and wake the progress thread (lock held). */
void terse__engine_enqueue(terse_comm *c, terse_request *r);
/* Run r, which the caller took as executor (lock held on entry and exit). */
void terse__engine_execute_unlocked(terse_comm *c, terse_request *r);
/* Until r is done: sleep while another executor works (watching it), or
 * run the queue's head ourselves (lock held). */
void terse__engine_drive(terse_comm *c, terse_request *r);
/* Batching, for an EXT request that runs the requests queued behind it
 * together with its own (the parameter server's pipelined partitions).
 * The executor, inside run: take the queue's head if it is an EXT request
 * with the same run function and object -- it then belongs to the caller
 * until completed -- else NULL (lock not held). */
terse_request *terse__engine_take_ext(terse_comm *c, terse__ext_fn run, const void *obj);
/* Complete a taken request with s (and, if s fails, terse_last_error()). */
void terse__engine_complete_taken(terse_comm *c, terse_request *r, terse_status s);
/* Give taken requests not completed back to the queue's head, in order
 * (after a failure: the engine then completes them as not run). */
void terse__engine_untake(terse_comm *c, terse_request **rs, size_t n);
/* Complete the members of a group that never ended (lock held). */
void terse__engine_drop_open_group(terse_comm *c);

/* ---- a colocated parameter server's endpoints (engine_twin.c) ---- */

/* Collective over a's ranks (through its store): open two more endpoints
 * on every rank, a server's and a worker's, each a communicator of 2N
 * virtual ranks with an executor of its own (see terse_comm's parent). On
 * failure both are NULL and every rank fails (a rank that cannot open
 * its endpoints says so to the others). */
terse_status terse__comm_colocate(terse_comm *a, terse_comm **srv, terse_comm **wrk);

/* A dense all-reduce or a barrier over the host's shared segment: it makes
 * no libfabric call (its call descriptor goes through the segment too:
 * comm_desc.c), so nothing in it can spin on a dead peer's libfabric
 * lock. On shm such a blocking call need not go to the progress thread for
 * the watchdog's sake (engine_api.c: on the caller's thread it saves the
 * two thread wake-ups of a hand-over, 45-60 us a call here,
 * docs/collectives.md), and after it fails no libfabric call follows
 * (engine.c). */
static inline int terse__engine_seg_only(const terse_comm *c, const terse_request *r) {
    return c->seg && ((r->kind == TERSE__OP_ALLREDUCE && !r->a.ar.codec) ||
                      r->kind == TERSE__OP_BARRIER);
}

#endif
