/* What engine.c (the queue and its executor) offers engine_api.c (the
 * public calls). Internal to algos/; the lock is c->lock throughout. */
#ifndef TERSE_ALGOS_ENGINE_H
#define TERSE_ALGOS_ENGINE_H

#include "algos/comm.h"

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
/* Complete the members of a group that never ended (lock held). */
void terse__engine_drop_open_group(terse_comm *c);

#endif
