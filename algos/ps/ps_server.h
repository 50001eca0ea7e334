/* What the server's files share, for them only: ps_server.c (a request,
 * from its header to its reply), ps_step.c (shards and steps), ps_loop.c
 * (the loop, losses, failovers, timeouts). */
#ifndef TERSE_ALGOS_PS_SERVER_H
#define TERSE_ALGOS_PS_SERVER_H

#include <stdint.h>

#include "algos/ps/ps.h"
#include "common/error.h"

/* A peer's state (terse__ps_peer.state). P_HOLD: a replica's request before its head was lost (held until the
 * store's notice promotes the replica, or refused at the timeout). */
enum { P_HDR, P_DATA, P_DRAIN, P_PARKED, P_REPLY, P_DONE, P_HOLD };

/* Kinds of refusal, for counting and log-once. */
enum {
    R_KEY, R_SIZE, R_STEP, R_CLOSED, R_ROLE, R_CORRUPT, R_STALE, R_LATE, R_TIMEOUT, R_LOST,
    R_NONFINITE, R_MOVED, R_WINDOW
};

/* ps_server.c */
int terse__ps_is_worker(const terse_ps *ps, int r);
int terse__ps_active(const terse_ps *ps, int w); /* a worker neither lost nor finished */
terse_status TERSE__PRINTF(4, 5)
    terse__ps_refuse(terse_ps *ps, int w, int kind, const char *fmt, ...);
terse_status TERSE__PRINTF(4, 5)
    terse__ps_refuse_drain(terse_ps *ps, int w, int kind, const char *fmt, ...);
terse_status terse__ps_moved(terse_ps *ps, int w);
uint64_t terse__ps_ssp_need(const terse_ps *ps, uint64_t clock);
terse_status terse__ps_post_header(terse_ps *ps, int w);
terse_status terse__ps_handle_header(terse_ps *ps, int w);
terse_status terse__ps_handle_push(terse_ps *ps, int w);
terse_status terse__ps_handle_pull(terse_ps *ps, int w);

/* ps_step.c */
void terse__ps_blob_free(terse__ps_blob *b);
terse_status terse__ps_close_overdue(terse_ps *ps, uint64_t now);

#endif
