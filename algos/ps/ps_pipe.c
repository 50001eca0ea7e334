/* The worker's pipelined requests (replicas 1): BytePS's loop over
 * terse's conversations.
 *
 * A request is cut into units, one per partition of its key and server
 * holding part of it. The executor runs the request together with the
 * parameter-server requests queued behind it (it takes them off the
 * engine's queue while its own units are not all done), and moves every
 * unit through
 *
 *     QUEUED -> PUSH (a push lane) -> PULL (a pull lane) -> DONE
 *
 * (a push skips PULL, a pull skips PUSH). Each worker-server pair has
 * `window` push lanes and `window` pull lanes, each a conversation of its
 * own (ps.h: the lane is in the tag; the server keeps a state per lane).
 * A push is answered on receipt, so push lanes never wait for the other
 * workers; a pull parks on the server until its partition's step closes,
 * on a pull lane, so a parked pull never holds up a push -- with a
 * shared window, workers whose lanes filled with pulls of different
 * partitions would wait for each other for ever. So partition p's pull
 * comes back while p+1's push is on the wire: both directions of the
 * link are busy.
 *
 * Order: among the queued units whose key has no unit in flight on that
 * server (a key's requests keep their start order), the one of the key of
 * highest priority goes first, then the key declared first, then the
 * earlier request, then the lower partition. A request completes when its
 * last unit is done -- one taken from the queue at once (so a small key
 * of high priority can complete before a large one started earlier),
 * the executor's own when the batch ends. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "algos/engine/engine.h"
#include "algos/ps/ps.h"
#include "common/error.h"

/* A unit's two conversations: its push (header, payload, reply) on a
 * push lane and its pull (header, reply, payload) on a pull lane; a
 * pushpull sends both at once, the pull right behind the push
 * (TERSE__PS_PULL_AFTER: the server answers it once the push is in). */
enum { X_IDLE, X_SENT, X_RDATA, X_DONE };
enum { Q_REP, Q_HDR, Q_DATA, NQ };

typedef struct unit {
    terse__ps_key *k;
    float *buf;       /* the partition's floats in the caller's buffer */
    int s, op, owner, eligible, queued;
    int lane[2];      /* [0] push, [1] pull: the lane, or -1 */
    int plane;        /* the lane its push went on, and that message's number */
    uint64_t pseq;
    uint8_t prep[TERSE__PS_REP_BYTES]; /* the push's reply header */
    int st[2];        /* X_*: X_DONE also when the unit has no such part */
    uint64_t order;   /* its request's */
    int prio;
    size_t rlen;      /* the pull payload's length */
    int push_refused;
    terse__fabric_req q[2][NQ];
} unit;

typedef struct owner {
    terse_request *r;
    size_t left;       /* units not done */
    terse_status first;
    int first_pull;    /* the first refusal was a pull's (a push's takes its place) */
    char why[512];
    int again;         /* a push refused for a reason of its own: push the step again */
    int done;
} owner;

typedef struct terse__ps_pipe {
    unit **u;          /* units in request order; each allocated once and kept (the
                        * transport holds its transfers: a unit never moves) */
    size_t nu, ucap;
    owner *o;
    size_t no, ocap;
    size_t *rank;      /* unit indices in scheduling order */
    unit **in_lane;    /* per server and lane: the unit there, or NULL */
    terse_request **untaken;
} terse__ps_pipe;

void terse__ps_pipe_free(terse_ps *ps) {
    terse__ps_pipe *p = ps->pipe;
    if (!p) return;
    for (size_t i = 0; ps->lsbuf && i < (size_t)ps->nservers * (size_t)ps->lanes; i++) {
        free(ps->lsbuf[i]);
        free(ps->lrbuf[i]);
    }
    for (size_t i = 0; i < p->ucap; i++) free(p->u[i]);
    free(p->u), free(p->o), free(p->rank), free(p->in_lane), free(p->untaken);
    free(p);
    ps->pipe = NULL;
}

/* One idle round: nap after 50 us of silence (a pull may wait a whole
 * step for a slower worker, and the CPU it would spin on is what the
 * others compute with; ps_loop.c says why 50), else yield after 16 idle
 * rounds. */
static void back_off(uint64_t quiet_ns, unsigned *idle) {
    if (quiet_ns >= 50000u) { /* ps_loop.c's NAP_AFTER_NS */
        struct timespec nap = {0, 20000};
        nanosleep(&nap, NULL);
    } else if (++*idle >= 16) {
        sched_yield();
    }
}

static terse_status grow(void **v, size_t *cap, size_t want, size_t each) {
    if (*cap >= want) return TERSE_OK;
    size_t n = *cap ? 2 * *cap : 64;
    while (n < want) n *= 2;
    void *p = realloc(*v, n * each);
    if (!p) return TERSE_ERROR(TERSE_ERR_NOMEM, "parameter server: no memory for %zu units", n);
    *v = p;
    *cap = n;
    return TERSE_OK;
}

/* Request r's units, queued. */
static terse_status add_request(terse_ps *ps, terse__ps_pipe *p, terse_request *r) {
    terse__ps_key **parts = r->a.ext.item;
    const size_t P = parts[0]->nparts, S = (size_t)ps->nservers;
    size_t ocap = p->ocap;
    TERSE_CHECK(grow((void **)&p->o, &ocap, p->no + 1, sizeof *p->o));
    p->ocap = ocap;
    size_t want = p->nu + P * S;
    if (want > p->ucap) {
        size_t cap = p->ucap, rcap = p->ucap, n;
        TERSE_CHECK(grow((void **)&p->u, &cap, want, sizeof *p->u));
        TERSE_CHECK(grow((void **)&p->rank, &rcap, want, sizeof *p->rank));
        n = cap < rcap ? cap : rcap;
        for (size_t i = p->ucap; i < n; i++) {
            if (!(p->u[i] = calloc(1, sizeof **p->u)))
                return TERSE_ERROR(TERSE_ERR_NOMEM, "parameter server: no memory for a unit");
            p->ucap = i + 1;
        }
    }
    owner *o = &p->o[p->no];
    memset(o, 0, sizeof *o);
    o->r = r;
    const uint64_t order = ps->pipe_order++;
    for (size_t i = 0; i < P; i++)
        for (size_t s = 0; s < S; s++) {
            terse__ps_key *k = parts[i];
            if (!k->srv_nchunks[s]) continue;
            unit *u = p->u[p->nu];
            memset(u, 0, sizeof *u);
            u->k = k;
            u->buf = r->a.ext.buf + k->off;
            u->s = (int)s;
            u->op = r->a.ext.op;
            u->owner = (int)p->no;
            u->order = order;
            u->prio = r->a.ext.prio;
            u->lane[0] = u->lane[1] = -1;
            u->queued = 1;
            u->st[0] = r->a.ext.op == TERSE__PS_PULL ? X_DONE : X_IDLE;
            u->st[1] = r->a.ext.op == TERSE__PS_PUSH ? X_DONE : X_IDLE;
            /* insert into the scheduling order (units are few: a request's
             * partitions times its servers) */
            size_t at = p->nu;
            while (at > 0) {
                const unit *v = p->u[p->rank[at - 1]];
                int before = v->prio > u->prio ||
                             (v->prio == u->prio &&
                              (v->k->ukey < k->ukey ||
                               (v->k->ukey == k->ukey &&
                                (v->order < order || (v->order == order && v->k->part <= k->part)))));
                if (before) break;
                p->rank[at] = p->rank[at - 1];
                at--;
            }
            p->rank[at] = p->nu++;
            o->left++;
        }
    p->no++;
    return TERSE_OK;
}

static uint64_t *lane_seq(terse_ps *ps, int s, int l) {
    return l == 0 ? &ps->seq[s] : &ps->lseq[(size_t)s * (size_t)ps->lanes + (size_t)l];
}

/* Send u's push (x 0, its payload encoded now) or pull (x 1) on lane l. */
static terse_status send_part(terse_ps *ps, unit *u, int x, int l) {
    terse_comm *c = ps->comm;
    const owner *o = &ps->pipe->o[u->owner];
    const size_t at = (size_t)u->s * (size_t)ps->lanes + (size_t)l;
    const uint64_t sq = *lane_seq(ps, u->s, l);
    size_t plen = 0;
    int op = x == 0 ? TERSE__PS_PUSH : u->op == TERSE__PS_PUSHPULL ? TERSE__PS_PULL_AFTER
                                                                  : TERSE__PS_PULL;
    if (x == 0) {
        uint64_t t0 = terse__now_ns();
        TERSE_CHECK(terse__ps_encode_for(u->k, u->s, u->buf, &ps->lsbuf[at], &ps->lsbuf_cap[at],
                                         &plen));
        terse__comm_codec_time(c, t0);
    }
    terse__ps_hdr h = {op, u->k->index, o->r->a.ext.clock, plen, sq, u->k->srv_floats[u->s],
                       u->k->decl_hash, x == 0 ? o->r->a.ext.weight : 1.0f, 0, 0, 0};
    if (x == 0) {
        u->plane = l;
        u->pseq = sq;
    } else if (op == TERSE__PS_PULL_AFTER) { /* the push it follows (sent before it) */
        h.after_lane = (uint8_t)u->plane;
        h.after_seq = (uint16_t)(u->pseq & 0xffff);
    }
    terse__ps_put_hdr(ps->lhdr + at * TERSE__PS_HDR_BYTES, &h);
    terse__fabric_req *q = u->q[x];
    memset(q, 0, sizeof u->q[x]);
    u->lane[x] = l;
    u->st[x] = X_SENT;
    ps->pipe->in_lane[at] = u;
    TERSE_CHECK(terse__comm_irecv(c, u->s, terse__ps_tag_lane(u->s, l, TERSE__PS_TAG_REP, sq),
                                  x == 0 ? u->prep : ps->lrep + at * TERSE__PS_REP_BYTES,
                                  TERSE__PS_REP_BYTES, TERSE__BYTES_FRAMING, &q[Q_REP]));
    TERSE_CHECK(terse__comm_isend(c, u->s, terse__ps_tag_lane(u->s, l, TERSE__PS_TAG_HDR, sq),
                                  ps->lhdr + at * TERSE__PS_HDR_BYTES, TERSE__PS_HDR_BYTES,
                                  TERSE__BYTES_FRAMING, &q[Q_HDR]));
    if (plen)
        TERSE_CHECK(terse__comm_isend(c, u->s, terse__ps_tag_lane(u->s, l, TERSE__PS_TAG_DATA, sq),
                                      ps->lsbuf[at], plen, TERSE__BYTES_PAYLOAD, &q[Q_DATA]));
    return TERSE_OK;
}

/* A free lane of server s in [lo, hi), or -1. */
static int free_lane(terse_ps *ps, int s, int lo, int hi) {
    for (int l = lo; l < hi; l++)
        if (!ps->pipe->in_lane[(size_t)s * (size_t)ps->lanes + (size_t)l]) return l;
    return -1;
}

/* Start what the windows allow, in scheduling order. A unit starts when
 * its key has nothing in flight on that server: its push goes out on a
 * free push lane (a pull-only unit waits for a pull lane instead); a
 * pull goes out on a free pull lane once its push went. Pushes depend on
 * push lanes alone, which free up at once (the server acknowledges a push
 * on receipt): so every push goes out, every step closes, and a parked
 * pull always ends -- even when every worker orders its keys its own way. */
static terse_status schedule(terse_ps *ps, terse__ps_pipe *p) {
    const int W = ps->push_lanes;
    /* the earliest queued unit of each key and server is the one eligible */
    uint32_t pass = ++ps->pipe_pass;
    for (size_t i = 0; i < p->nu; i++) {
        unit *u = p->u[i];
        u->eligible = 0;
        if (!u->queued || u->k->pipe_mark[u->s] == pass) continue;
        u->k->pipe_mark[u->s] = pass;
        u->eligible = !u->k->pipe_busy[u->s];
    }
    for (size_t j = 0; j < p->nu; j++) {
        unit *u = p->u[p->rank[j]];
        if (u->queued) {
            if (!u->eligible) continue;
            if (u->st[0] == X_IDLE) {
                int lp = free_lane(ps, u->s, 0, W);
                if (lp < 0) continue;
                u->queued = 0;
                u->k->pipe_busy[u->s] = 1;
                TERSE_CHECK(send_part(ps, u, 0, lp));
            } else { /* a pull alone */
                int ll = free_lane(ps, u->s, W, ps->lanes);
                if (ll < 0) continue;
                u->queued = 0;
                u->k->pipe_busy[u->s] = 1;
                TERSE_CHECK(send_part(ps, u, 1, ll));
                continue;
            }
        }
        if (u->st[1] == X_IDLE && u->st[0] != X_IDLE && !u->push_refused) {
            int ll = free_lane(ps, u->s, W, ps->lanes);
            if (ll >= 0) TERSE_CHECK(send_part(ps, u, 1, ll));
        }
    }
    return TERSE_OK;
}

static void release_lane(terse_ps *ps, unit *u, int x) {
    ps->pipe->in_lane[(size_t)u->s * (size_t)ps->lanes + (size_t)u->lane[x]] = NULL;
    u->lane[x] = -1;
}

/* The first refusal of u's request is its owner's. */
static void refused(terse_ps *ps, unit *u, int x, const terse__ps_rep *r) {
    owner *o = &ps->pipe->o[u->owner];
    if (x == 0 && r->status == TERSE_ERR_STALE) ps->stats.stale_refused++;
    if (x == 0 && r->status != TERSE_ERR_STALE && r->status != TERSE_ERR_NONFINITE) o->again = 1;
    if (x == 0) u->push_refused = 1;
    /* a pull refused because its push was: the push's refusal says why */
    if (x == 1 && u->push_refused) return;
    if (o->first == TERSE_OK || (x == 0 && o->first_pull)) {
        o->first = r->status;
        o->first_pull = x == 1;
        snprintf(o->why, sizeof o->why, "%s of key %zu on rank %d: server rank %d refused it: %s",
                 terse__ps_op_name(o->r->a.ext.op), o->r->a.ext.key, ps->rank, u->s, r->text);
    }
}

/* Part x of u has its reply header: move it on. A push's lane went free
 * when its payload was sent (its reply header has a buffer of the unit's
 * own), a pull's is free once its payload is in. */
static terse_status take_reply(terse_ps *ps, unit *u, int x) {
    terse_comm *c = ps->comm;
    const int lane = x == 0 ? u->plane : u->lane[x];
    const size_t at = (size_t)u->s * (size_t)ps->lanes + (size_t)lane;
    uint64_t *sq = lane_seq(ps, u->s, lane);
    const uint64_t want = x == 0 ? u->pseq : *sq;
    terse__ps_rep r;
    terse_status st = terse__ps_get_rep(x == 0 ? u->prep : ps->lrep + at * TERSE__PS_REP_BYTES, &r);
    if (st == TERSE_OK && r.seq != want)
        st = TERSE_ERROR(TERSE_ERR_CORRUPT, "reply for message %llu, expected %llu",
                         (unsigned long long)r.seq, (unsigned long long)want);
    if (st == TERSE_OK && (r.status != TERSE_OK || x == 0) && r.payload_len)
        st = TERSE_ERROR(TERSE_ERR_CORRUPT, "a reply without data that announced %llu bytes",
                         (unsigned long long)r.payload_len);
    if (st == TERSE_OK && r.status == TERSE_OK && x == 1 &&
        (r.payload_len == 0 || r.payload_len > u->k->srv_pull_bound[u->s]))
        st = TERSE_ERROR(TERSE_ERR_CORRUPT,
                         "a %llu-byte pull of partition %zu of key %zu; its chunks there encode to "
                         "1..%zu bytes",
                         (unsigned long long)r.payload_len, u->k->part, u->k->ukey,
                         u->k->srv_pull_bound[u->s]);
    if (st != TERSE_OK)
        return TERSE_ERROR(st, "rank %d: server rank %d's reply on lane %d: %s", ps->rank, u->s,
                           lane, terse_last_error());
    if (x == 0) {
        if (r.status != TERSE_OK) refused(ps, u, x, &r);
        u->st[0] = X_DONE;
        if (u->push_refused && u->st[1] == X_IDLE) u->st[1] = X_DONE; /* not sent */
        return TERSE_OK;
    }
    if (r.status != TERSE_OK) {
        (*sq)++;
        refused(ps, u, x, &r);
        release_lane(ps, u, x);
        u->st[x] = X_DONE;
        if (x == 0 && u->push_refused && u->st[1] == X_IDLE) u->st[1] = X_DONE; /* not sent */
        return TERSE_OK;
    }
    /* a pull: its payload follows on the same lane */
    TERSE_CHECK(terse__ps_grow(&ps->lrbuf[at], &ps->lrbuf_cap[at], (size_t)r.payload_len));
    u->rlen = (size_t)r.payload_len;
    TERSE_CHECK(terse__comm_irecv(c, u->s, terse__ps_tag_lane(u->s, u->lane[1], TERSE__PS_TAG_RDATA, *sq),
                                  ps->lrbuf[at], u->rlen, TERSE__BYTES_PAYLOAD, &u->q[1][Q_DATA]));
    u->st[1] = X_RDATA;
    /* Behind a quorum: the next step is the server's. */
    const uint64_t clock = ps->pipe->o[u->owner].r->a.ext.clock;
    if (ps->cfg.mode == TERSE_PS_SYNC && r.version > clock + 1 &&
        r.version > atomic_load(&ps->clock_floor))
        atomic_store(&ps->clock_floor, r.version);
    return TERSE_OK;
}

/* The pull payload is in: decode it (unless the push before it was
 * refused: then the caller's buffer keeps what it had, as after any
 * refusal). */
static terse_status take_pull(terse_ps *ps, unit *u) {
    const size_t at = (size_t)u->s * (size_t)ps->lanes + (size_t)u->lane[1];
    terse_status st = TERSE_OK;
    if (!u->push_refused && u->st[0] == X_DONE) {
        uint64_t t0 = terse__now_ns();
        st = terse__ps_decode_from(ps, u->k, u->s, ps->lrbuf[at], u->k->ukey, u->buf, u->rlen);
        terse__comm_codec_time(ps->comm, t0);
    }
    (*lane_seq(ps, u->s, u->lane[1]))++;
    TERSE_CHECK(st);
    release_lane(ps, u, 1);
    u->st[1] = X_DONE;
    return TERSE_OK;
}

static int reply_in(const terse__fabric_req *q) {
    return terse__fabric_req_done(&q[Q_REP]) && terse__fabric_req_done(&q[Q_HDR]) &&
           terse__fabric_req_done(&q[Q_DATA]);
}

/* Move every unit on as far as its completions allow; *moved if any did. */
static terse_status advance(terse_ps *ps, terse__ps_pipe *p, int *moved) {
    for (size_t i = 0; i < p->nu; i++) {
        unit *u = p->u[i];
        if (u->queued || (u->st[0] == X_DONE && u->st[1] == X_DONE)) continue;
        /* A push's lane is free once its header and payload are sent: the
         * lane's next message may follow before the reply comes back
         * (behind the pulls the server is sending), so the window of pushes
         * is not held up by the way back. The server takes a lane's
         * messages one at a time. */
        if (u->st[0] == X_SENT && u->lane[0] >= 0 && terse__fabric_req_done(&u->q[0][Q_HDR]) &&
            terse__fabric_req_done(&u->q[0][Q_DATA])) {
            *moved = 1;
            (*lane_seq(ps, u->s, u->lane[0]))++;
            release_lane(ps, u, 0);
        }
        /* the push's reply first: a pull's payload is decoded only after it */
        if (u->st[0] == X_SENT && u->lane[0] < 0 && reply_in(u->q[0])) {
            *moved = 1;
            TERSE_CHECK(take_reply(ps, u, 0));
        }
        if (u->st[1] == X_SENT && reply_in(u->q[1])) {
            *moved = 1;
            TERSE_CHECK(take_reply(ps, u, 1));
        }
        if (u->st[1] == X_RDATA && u->st[0] == X_DONE && terse__fabric_req_done(&u->q[1][Q_DATA])) {
            *moved = 1;
            TERSE_CHECK(take_pull(ps, u));
        }
        if (u->st[0] == X_DONE && u->st[1] == X_DONE) {
            u->k->pipe_busy[u->s] = 0;
            p->o[u->owner].left--;
        }
    }
    return TERSE_OK;
}

/* Owners whose units are all done: complete the ones taken from the
 * queue (the executor's own ends with the batch). */
static void complete_owners(terse_ps *ps, terse__ps_pipe *p) {
    for (size_t i = 0; i < p->no; i++) {
        owner *o = &p->o[i];
        if (o->done || o->left) continue;
        o->done = 1;
        if (o->again) atomic_store(&ps->step_refused, 1); /* push again */
        if (o->first == TERSE_OK) {
            int op = o->r->a.ext.op;
            if (op == TERSE__PS_PULL || op == TERSE__PS_PUSHPULL) ps->stats.pulls++;
            if (op == TERSE__PS_PUSH || op == TERSE__PS_PUSHPULL) ps->stats.pushes++;
        }
        if (i == 0) continue;
        if (o->first != TERSE_OK) terse__error_restore(o->why);
        terse__engine_complete_taken(ps->comm, o->r, o->first);
    }
}

/* The servers with a unit in flight, as text (for a timeout). */
static void in_flight(terse_ps *ps, terse__ps_pipe *p, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    for (int s = 0; s < ps->nservers && n + 16 < cap; s++) {
        int any = 0;
        for (int l = 0; l < ps->lanes; l++) any |= p->in_lane[(size_t)s * (size_t)ps->lanes + (size_t)l] != NULL;
        for (size_t i = 0; !any && i < p->nu; i++) any = p->u[i]->s == s && p->u[i]->st[1] == X_RDATA;
        if (any) n += (size_t)snprintf(out + n, cap - n, "%s%d", n ? "," : "", s);
    }
}

/* A server lost (the store says so): its slot's only server (replicas 1). */
static terse_status servers_alive(terse_ps *ps, terse__ps_pipe *p) {
    terse_comm *c = ps->comm;
    if (!c->store) return TERSE_OK;
    const uint8_t *lost = NULL;
    TERSE_CHECK(terse__comm_poll_lost(c, &lost));
    for (size_t i = 0; i < p->nu; i++) {
        const unit *u = p->u[i];
        if (!u->queued && (u->st[0] != X_DONE || u->st[1] != X_DONE) && lost[u->s])
            return TERSE_ERROR(TERSE_ERR_PEER_LOST,
                               "rank %d: parameter server rank %d, the only server of slot %d "
                               "(replicas 1), was lost (its connection to the bootstrap store "
                               "dropped without a goodbye) while this worker waited for it",
                               ps->rank, u->s, u->s);
    }
    return TERSE_OK;
}

/* A transfer failed with the peer lost before the store said so: name
 * the server with its slot all the same. */
static terse_status name_lost_server(terse_ps *ps, terse__ps_pipe *p, terse_status st) {
    if (st != TERSE_ERR_PEER_LOST) return st;
    int s = -1;
    for (size_t i = 0; i < p->nu && s < 0; i++)
        for (int j = 0; j < 2 * NQ && s < 0; j++)
            if (p->u[i]->q[j / NQ][j % NQ].error) s = p->u[i]->s;
    if (s < 0) return st;
    char why[512];
    snprintf(why, sizeof why, "%s", terse_last_error());
    return TERSE_ERROR(st, "rank %d: parameter server rank %d, the only server of slot %d "
                           "(replicas 1), was lost: %s",
                       ps->rank, s, s, why);
}

static int batch_left(const terse__ps_pipe *p) {
    for (size_t i = 0; i < p->no; i++)
        if (p->o[i].left) return 1;
    return 0;
}

/* The loop: take queued requests while the first is running, start what
 * the windows allow, progress, move units on. */
static terse_status pump(terse_ps *ps, terse__ps_pipe *p) {
    terse_comm *c = ps->comm;
    const uint64_t idle_limit = (uint64_t)c->timeout_ms * 1000000ull;
    uint64_t last_event = terse__now_ns(), last_alive = last_event;
    unsigned idle = 0;
    int changed = 1;
    while (batch_left(p)) {
        if (p->o[0].left) { /* the executor's own request is running: take more */
            terse_request *q;
            while ((q = terse__engine_take_ext(c, terse__ps_worker_run, ps))) {
                if (q->a.ext.op == TERSE__PS_FINISH) { /* runs alone, after */
                    terse__engine_untake(c, &q, 1);
                    break;
                }
                TERSE_CHECK(add_request(ps, p, q));
                changed = 1;
            }
        }
        if (changed) TERSE_CHECK(schedule(ps, p));
        changed = 0;
        if (atomic_load_explicit(&c->aborted, memory_order_acquire))
            return TERSE_ERROR(TERSE_ERR_ABORTED,
                               "rank %d: aborted (terse_comm_abort) during a parameter-server "
                               "request",
                               ps->rank);
        size_t events = 0;
        terse_status st = terse__fabric_progress(c->fabric, &events);
        if (st != TERSE_OK) return name_lost_server(ps, p, st);
        int moved = 0;
        TERSE_CHECK(advance(ps, p, &moved));
        if (moved) {
            complete_owners(ps, p);
            changed = 1;
        }
        uint64_t now = terse__now_ns();
        if (events || moved) {
            last_event = now;
            idle = 0;
        } else {
            if (now - last_alive >= 1000000ull) {
                last_alive = now;
                TERSE_CHECK(servers_alive(ps, p));
            }
            if (now - last_event >= idle_limit) {
                char who[160];
                in_flight(ps, p, who, sizeof who);
                return TERSE_ERROR(TERSE_ERR_TIMEOUT,
                                   "rank %d: no progress for %llu ms with parameter-server "
                                   "requests in flight to server ranks %s",
                                   ps->rank, (unsigned long long)((now - last_event) / 1000000u),
                                   who);
            }
            back_off(now - last_event, &idle);
        }
    }
    return TERSE_OK;
}

/* After a failure: the requests taken and not completed go back to the
 * queue (the engine completes them as not run, after it quiesced the
 * transport, so nothing writes into their buffers afterwards). */
static void untake_rest(terse_ps *ps, terse__ps_pipe *p) {
    size_t n = 0;
    for (size_t i = 1; i < p->no; i++)
        if (!p->o[i].done) p->untaken[n++] = p->o[i].r;
    terse__engine_untake(ps->comm, p->untaken, n);
}

terse_status terse__ps_pipe_run(terse_ps *ps, terse_request *r, int *keep_usable) {
    terse_comm *c = ps->comm;
    terse__ps_pipe *p = ps->pipe;
    if (!p) {
        p = calloc(1, sizeof *p);
        if (!p) return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: no memory for requests", ps->rank);
        ps->pipe = p;
        p->in_lane = calloc((size_t)ps->nservers * (size_t)ps->lanes, sizeof *p->in_lane);
        if (!p->in_lane) return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: no memory", ps->rank);
    }
    p->nu = p->no = 0;
    memset(p->in_lane, 0, (size_t)ps->nservers * (size_t)ps->lanes * sizeof *p->in_lane);
    uint64_t t0 = terse__now_ns();
    terse_status s = add_request(ps, p, r);
    if (s == TERSE_OK) s = pump(ps, p);
    pthread_mutex_lock(&c->stats_lock);
    c->stats.network_seconds += (double)(terse__now_ns() - t0) * 1e-9;
    pthread_mutex_unlock(&c->stats_lock);
    if (s != TERSE_OK) {
        /* in-flight units keep their keys busy: clear them for the next try */
        for (size_t i = 0; i < p->nu; i++) p->u[i]->k->pipe_busy[p->u[i]->s] = 0;
        size_t cap = 0;
        if (grow((void **)&p->untaken, &cap, p->no ? p->no : 1, sizeof *p->untaken) == TERSE_OK)
            untake_rest(ps, p);
        return s;
    }
    owner *o = &p->o[0];
    if (o->first == TERSE_OK) return TERSE_OK;
    *keep_usable = 1; /* a refusal concerns this request only */
    terse__error_restore(o->why);
    return o->first;
}
