/* The public calls of the engine: starts, blocking calls, groups, test,
 * wait, free and abort. The queue, the executor, groups and the watchdog
 * are in engine.c (its top comment narrates how requests run). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "algos/comm/comm.h"
#include "algos/engine/engine.h"
#include "common/error.h"

/* ---------------------------------------------------------------- public */

/* The checks every start shares. A bad argument refuses this and every
 * later start (the other ranks run a collective this rank does not, which
 * cannot end well) while requests already started still run: whether they
 * had begun must not depend on this rank's thread timing, since the other
 * ranks run them too. Freeing the communicator then tells the others this
 * rank is gone. */
/* Refuse a communicator of another process (a fork) or one aborted. */
static terse_status ours(terse_comm *c, const char *what) {
    if (c->pid != getpid())
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "%s: the communicator of rank %d was used in a child process forked "
                           "after terse_comm_init; only the process that created it may use it",
                           what, c->rank);
    if (atomic_load(&c->aborted)) return terse__comm_aborted_error(c, what);
    return TERSE_OK;
}

static terse_status admit(terse_comm *c, const char *what, terse_status arg_check) {
    if (!c) return TERSE_ERROR(TERSE_ERR_INVALID, "%s: communicator is NULL", what);
    TERSE_CHECK(ours(c, what));
    pthread_mutex_lock(&c->lock);
    terse_status s = TERSE_OK;
    if (c->failed || c->refusing) {
        s = TERSE_ERROR(TERSE_ERR_INVALID, "%s on rank %d: communicator failed earlier: %s",
                        what, c->rank, terse__engine_unprefixed(c->failure));
    } else if (arg_check != TERSE_OK) {
        s = arg_check;
        terse__comm_refuse_locked(c);
    }
    pthread_mutex_unlock(&c->lock);
    return s;
}

/* A start that could not be carried out after admission (no request
 * pointer, no memory): this rank skips a collective the others run, so
 * refuse from now on, like a bad argument. */
static terse_status refuse(terse_comm *c, terse_status s) {
    pthread_mutex_lock(&c->lock);
    terse__comm_refuse_locked(c);
    pthread_mutex_unlock(&c->lock);
    return s;
}

/* Queue r (or add it to the open group); lock not held. */
static void submit(terse_comm *c, terse_request *r) {
    pthread_mutex_lock(&c->lock);
    c->inflight++;
    if (c->group_depth > 0) {
        r->in_group = 1;
        r->next = NULL;
        if (c->group_tail) c->group_tail->next = r;
        else c->group_head = r;
        c->group_tail = r;
    } else {
        terse__engine_enqueue(c, r);
    }
    pthread_mutex_unlock(&c->lock);
}

static terse_status start(terse_comm *c, const terse_request *tmpl, terse_request **out) {
    if (!out)
        return refuse(c, TERSE_ERROR(TERSE_ERR_INVALID, "%s_start on rank %d: request pointer is "
                                                        "NULL", terse__engine_kind_name(tmpl->kind), c->rank));
    *out = NULL;
    terse_request *r = malloc(sizeof *r);
    if (!r)
        return refuse(c, TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: no memory for a request",
                                     c->rank));
    memcpy(r, tmpl, sizeof *r);
    submit(c, r);
    *out = r;
    return TERSE_OK;
}

/* A blocking call: inline when the engine is idle, else queued and waited
 * for (a stack request: nothing allocated). */
static terse_status run_blocking(terse_comm *c, terse_request *r) {
    pthread_mutex_lock(&c->lock);
    if (c->group_depth > 0) {
        pthread_mutex_unlock(&c->lock);
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "%s on rank %d: blocking call inside a group; use the _start form",
                           terse__engine_kind_name(r->kind), c->rank);
    }
    c->inflight++;
    if (!c->busy && !c->q_head && (!c->watched || terse__engine_seg_only(c, r))) {
        c->busy = 1;
        c->running = r;
        terse__engine_execute_unlocked(c, r);
    } else {
        terse__engine_enqueue(c, r);
        terse__engine_drive(c, r);
    }
    pthread_mutex_unlock(&c->lock);
    if (r->status != TERSE_OK) terse__error_restore(r->error);
    return r->status;
}

static terse_request make(terse_comm *c, terse__op_kind kind) {
    terse_request r;
    memset(&r, 0, sizeof r);
    r.comm = c;
    r.kind = kind;
    r.pid = c->pid; /* kept in the request: it may outlive the communicator */
    return r;
}

terse_request terse__engine_make(terse_comm *c, terse__op_kind kind) { return make(c, kind); }

/* An extension's request (the parameter server's) on a communicator that
 * failed is refused at once: it would fail when run anyway, and after the
 * watchdog abandoned the progress thread nothing would ever run it. */
static terse_status admit_ext(terse_comm *c, const char *what) {
    TERSE_CHECK(ours(c, what));
    pthread_mutex_lock(&c->lock);
    int broken = c->failed || c->refusing;
    char why[512];
    snprintf(why, sizeof why, "%s", terse__engine_unprefixed(c->failure));
    pthread_mutex_unlock(&c->lock);
    if (broken)
        return TERSE_ERROR(TERSE_ERR_INVALID, "%s on rank %d: communicator failed earlier: %s",
                           what, c->rank, why);
    return TERSE_OK;
}

terse_status terse__engine_start_ext(terse_comm *c, const terse_request *tmpl,
                                     terse_request **out) {
    const char *what = tmpl->a.ext.name;
    if (out) *out = NULL;
    if (!out) return TERSE_ERROR(TERSE_ERR_INVALID, "%s: request pointer is NULL", what);
    TERSE_CHECK(admit_ext(c, what));
    terse_request *r = malloc(sizeof *r);
    if (!r) return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: no memory for a request", c->rank);
    memcpy(r, tmpl, sizeof *r);
    submit(c, r);
    *out = r;
    return TERSE_OK;
}

terse_status terse__engine_run_ext(terse_comm *c, terse_request *r) {
    TERSE_CHECK(admit_ext(c, r->a.ext.name));
    return run_blocking(c, r);
}

terse_status terse_allreduce_start(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                   terse_op op, terse_request **req) {
    if (req) *req = NULL;
    TERSE_CHECK(admit(c, "terse_allreduce",
                      c ? terse__allreduce_check(c, buf, n, codec, op) : TERSE_OK));
    terse_request r = make(c, TERSE__OP_ALLREDUCE);
    r.a.ar.buf = buf, r.a.ar.n = n, r.a.ar.codec = codec, r.a.ar.op = op;
    return start(c, &r, req);
}

terse_status terse_allreduce(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                             terse_op op) {
    TERSE_CHECK(admit(c, "terse_allreduce",
                      c ? terse__allreduce_check(c, buf, n, codec, op) : TERSE_OK));
    terse_request r = make(c, TERSE__OP_ALLREDUCE);
    r.a.ar.buf = buf, r.a.ar.n = n, r.a.ar.codec = codec, r.a.ar.op = op;
    return run_blocking(c, &r);
}

terse_status terse_broadcast_start(terse_comm *c, void *buf, size_t bytes, int root,
                                   terse_request **req) {
    if (req) *req = NULL;
    TERSE_CHECK(admit(c, "terse_broadcast",
                      c ? terse__broadcast_check(c, buf, bytes, root) : TERSE_OK));
    terse_request r = make(c, TERSE__OP_BROADCAST);
    r.a.bc.buf = buf, r.a.bc.bytes = bytes, r.a.bc.root = root;
    return start(c, &r, req);
}

terse_status terse_broadcast(terse_comm *c, void *buf, size_t bytes, int root) {
    TERSE_CHECK(admit(c, "terse_broadcast",
                      c ? terse__broadcast_check(c, buf, bytes, root) : TERSE_OK));
    terse_request r = make(c, TERSE__OP_BROADCAST);
    r.a.bc.buf = buf, r.a.bc.bytes = bytes, r.a.bc.root = root;
    return run_blocking(c, &r);
}

static terse_request allgather_req(terse_comm *c, const void *send, size_t send_bytes,
                                   void *recv, size_t recv_cap, size_t *counts) {
    terse_request r = make(c, TERSE__OP_ALLGATHER);
    r.a.ag.send = send, r.a.ag.send_bytes = send_bytes, r.a.ag.recv = recv;
    r.a.ag.recv_cap = recv_cap, r.a.ag.counts = counts;
    return r;
}

terse_status terse_allgather_start(terse_comm *c, const void *send, size_t send_bytes, void *recv,
                                   size_t recv_cap, size_t *counts, terse_request **req) {
    if (req) *req = NULL;
    TERSE_CHECK(admit(c, "terse_allgather",
                      c ? terse__allgather_check(c, send, send_bytes, recv, recv_cap) : TERSE_OK));
    terse_request r = allgather_req(c, send, send_bytes, recv, recv_cap, counts);
    return start(c, &r, req);
}

terse_status terse_allgather(terse_comm *c, const void *send, size_t send_bytes, void *recv,
                             size_t recv_cap, size_t *counts) {
    TERSE_CHECK(admit(c, "terse_allgather",
                      c ? terse__allgather_check(c, send, send_bytes, recv, recv_cap) : TERSE_OK));
    terse_request r = allgather_req(c, send, send_bytes, recv, recv_cap, counts);
    return run_blocking(c, &r);
}

terse_status terse_barrier_start(terse_comm *c, terse_request **req) {
    if (req) *req = NULL;
    TERSE_CHECK(admit(c, "terse_barrier", TERSE_OK));
    terse_request r = make(c, TERSE__OP_BARRIER);
    return start(c, &r, req);
}

terse_status terse_barrier(terse_comm *c) {
    TERSE_CHECK(admit(c, "terse_barrier", TERSE_OK));
    terse_request r = make(c, TERSE__OP_BARRIER);
    return run_blocking(c, &r);
}

terse_status terse_group_start(terse_comm *c) {
    TERSE_CHECK(admit(c, "terse_group_start", TERSE_OK));
    pthread_mutex_lock(&c->lock);
    c->group_depth++;
    pthread_mutex_unlock(&c->lock);
    return TERSE_OK;
}

terse_status terse_group_end(terse_comm *c) {
    if (!c) return TERSE_ERROR(TERSE_ERR_INVALID, "terse_group_end: communicator is NULL");
    if (c->pid != getpid() || atomic_load(&c->aborted)) return admit(c, "terse_group_end", 0);
    pthread_mutex_lock(&c->lock);
    if (c->group_depth == 0) {
        pthread_mutex_unlock(&c->lock);
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_group_end on rank %d without terse_group_start", c->rank);
    }
    terse_status s = TERSE_OK;
    if (--c->group_depth == 0 && c->group_head) {
        terse_request *g = calloc(1, sizeof *g);
        if (!g) {
            /* Its members can never run here: fail them, refuse later starts. */
            s = TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: no memory to end a group", c->rank);
            terse__comm_refuse_locked(c); /* before the drop rewrites the sentence */
            terse__engine_drop_open_group(c);
        } else {
            g->comm = c;
            g->kind = TERSE__OP_GROUP;
            g->members = c->group_head;
            for (terse_request *m = g->members; m; m = m->next) m->in_group = 0;
            c->group_head = c->group_tail = NULL;
            terse__engine_enqueue(c, g);
        }
    }
    pthread_mutex_unlock(&c->lock);
    return s;
}

/* A request of a communicator created by another process (a fork). */
static int foreign(const terse_request *r) { return r->pid != getpid(); }

static terse_status foreign_error(const char *what) {
    return TERSE_ERROR(TERSE_ERR_INVALID,
                       "%s: the request belongs to a communicator of the parent process "
                       "(this process was forked after terse_comm_init)",
                       what);
}

terse_status terse_request_test(terse_request *r, int *done) {
    if (!r || !done) return TERSE_ERROR(TERSE_ERR_INVALID, "terse_request_test: NULL argument");
    *done = 0;
    if (foreign(r)) return foreign_error("terse_request_test");
    if (!terse__engine_is_done(r)) {
        terse_comm *c = r->comm;
        pthread_mutex_lock(&c->lock);
        int open = r->in_group;
        if (!open && !c->has_thread) terse__engine_drive(c, r);
        pthread_mutex_unlock(&c->lock);
        if (open)
            return TERSE_ERROR(TERSE_ERR_INVALID,
                               "terse_request_test on rank %d: the request's group has not "
                               "ended (terse_group_end)", c->rank);
        if (!terse__engine_is_done(r)) return TERSE_OK;
    }
    *done = 1;
    if (r->status != TERSE_OK) terse__error_restore(r->error);
    return r->status;
}

terse_status terse_request_wait(terse_request *r) {
    if (!r) return TERSE_ERROR(TERSE_ERR_INVALID, "terse_request_wait: request is NULL");
    if (foreign(r)) return foreign_error("terse_request_wait");
    if (!terse__engine_is_done(r)) {
        terse_comm *c = r->comm;
        pthread_mutex_lock(&c->lock);
        int open = r->in_group;
        if (!open) terse__engine_drive(c, r);
        pthread_mutex_unlock(&c->lock);
        if (open)
            return TERSE_ERROR(TERSE_ERR_INVALID,
                               "terse_request_wait on rank %d: the request's group has not "
                               "ended (terse_group_end); waiting would never return", c->rank);
    }
    if (r->status != TERSE_OK) terse__error_restore(r->error);
    return r->status;
}

void terse_request_free(terse_request *r) {
    if (!r) return;
    if (foreign(r)) return; /* the parent's: not ours to free or wait for */
    if (!terse__engine_is_done(r)) {
        terse_comm *c = r->comm;
        pthread_mutex_lock(&c->lock);
        if (r->in_group) {
            /* Its group has not ended: the others will still run it, so
             * it stays queued and is freed once it has run. */
            r->orphan = 1;
            pthread_mutex_unlock(&c->lock);
            return;
        }
        terse__engine_drive(c, r);
        pthread_mutex_unlock(&c->lock);
    }
    free(r);
}

void terse_comm_abort(terse_comm *c) {
    if (!c || c->pid != getpid()) return;
    atomic_store(&c->aborted, 1);
    if (!c->engine_ready) return;
    pthread_mutex_lock(&c->lock);
    pthread_cond_broadcast(&c->work);
    pthread_cond_broadcast(&c->idle);
    pthread_mutex_unlock(&c->lock);
}
