/* terse_comm_init and terse_comm_free: the communicator's public life,
 * the join and the leave (algos/comm/comm_join.c) around the engine's
 * start and shutdown. They live here, above the engine, so that the
 * communicator's services below it never call up into the engine. */
#include <unistd.h>

#include "algos/comm/comm.h"
#include "algos/engine/engine.h"
#include "common/error.h"

terse_status terse_comm_init(const terse_comm_config *config, terse_comm **out) {
    if (!out) return TERSE_ERROR(TERSE_ERR_INVALID, "terse_comm_init: out pointer is NULL");
    *out = NULL;
    terse_comm *c = NULL;
    TERSE_CHECK(terse__comm_join(config, &c));
    terse_status s = terse__engine_init(c);
    if (s != TERSE_OK) {
        c->failed = 1;
        terse_comm_free(c);
        return s;
    }
    *out = c;
    return TERSE_OK;
}

void terse_comm_free(terse_comm *c) {
    if (!c) return;
    /* In a child forked after init the progress thread does not exist and
     * the endpoint and store belong to the parent: touch nothing. */
    if (c->pid != getpid()) return;
    /* Requests first: whatever is still queued or running is aborted and
     * completed, and the progress thread is gone before the endpoint. */
    terse__engine_shutdown(c);
    terse__comm_leave(c);
}
