/* The server loop (terse_ps_serve). It keeps a request header posted
 * from every other rank (servers included, so that a rank which is not a
 * worker gets a refusal rather than silence) and moves each peer through
 *     HDR -> [DATA | DRAIN] -> [PARKED] -> REPLY -> HDR ...
 * one conversation per peer at a time (ps_server.c answers the requests).
 * The fabric runs in tolerant mode: a worker that dies fails only its own
 * requests, and the store's loss notices tell the server which workers
 * are gone, so that quorum, async and ssp go on without them while sync
 * without a quorum fails the steps they never pushed, naming them.
 *
 * Every millisecond it also polls the store for lost workers and, with
 * replicas 2, for servers lost (the replica of a lost head takes its slot
 * over) or back (the slot goes back to its head's replacement), and
 * expires what waited too long. At the end it cancels what is still
 * posted and counts a promoted replica's work as its own. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "algos/engine/engine.h"
#include "algos/ps/ps.h"
#include "algos/ps/ps_server.h"
#include "common/error.h"

#define POLL_NS 1000000ull
/* Silence before the loop naps (20 us a round): short, since a server
 * spinning on a core its workers compute on slows them down (measured with
 * bench/ps/ps-stragglers.sh, docs/ps.md); a nap costs a message at most its
 * length in latency. 50 us, not 200: with partitions in flight the gaps
 * between completions are short, and 4 ranks sharing 2 cores over shaped
 * links spent a third of their CPU time spinning in them (ps-netns.sh, the
 * ranks' CPU seconds: 20.8 -> 15 for the same job); 5 us measured the same
 * as 50 there and no better on loopback. */
#define NAP_AFTER_NS 50000u

/* ---------------------------------------------------------------- losses */

/* Conversations: ps->peers[cv] for cv < NCV(ps); CV_RANK(ps, cv) its rank. */
#define NCV(ps) ((ps)->nranks * (ps)->lanes)
#define CV_RANK(ps, cv) terse__ps_cv_rank(ps, cv)

static void mark_lost(terse_ps *ps, int w, const char *how) {
    terse__ps_peer *p = terse__ps_wk(ps, w);
    if (p->lost || p->finished) return;
    p->lost = 1; /* a server peer too: nothing more is expected from it */
    if (!terse__ps_is_worker(ps, w)) return;
    terse__ps_dana_forget(ps, w);
    ps->stats.workers_lost++;
    if (ps->slot == ps->rank) /* its mirror instance learns it too: one line */
        fprintf(stderr, "terse: parameter server rank %d: worker rank %d was lost (%s)\n",
                ps->rank, w, how);
    if (ps->cfg.mode != TERSE_PS_SYNC || ps->broken[0]) return;
    /* With a quorum the steps close on the workers left. */
    if (!ps->cfg.quorum)
        snprintf(ps->broken, sizeof ps->broken,
                 "worker rank %d was lost (%s); sync mode without a quorum cannot close a step "
                 "without it",
                 w, how);
}

/* After losses: fail the parked requests of a broken job, or go on. */
static terse_status after_loss(terse_ps *ps) {
    for (int cv = 0; cv < NCV(ps); cv++) {
        terse__ps_peer *p = &ps->peers[cv];
        const int w = CV_RANK(ps, cv);
        if (w != ps->rank && !terse__ps_wk(ps, w)->lost && p->state == P_PARKED && ps->broken[0])
            TERSE_CHECK(terse__ps_refuse(ps, cv, R_LOST, "%s", ps->broken));
    }
    if (ps->broken[0]) return TERSE_OK;
    for (size_t k = 0; k < ps->nkeys; k++)
        if (ps->keys[k]->shard) {
            TERSE_CHECK(terse__ps_maybe_close(ps, k));
            if (ps->cfg.mode == TERSE_PS_SSP) TERSE_CHECK(terse__ps_wake(ps, k));
        }
    return TERSE_OK;
}

static terse_status poll_losses(terse_ps *ps) {
    terse_comm *c = ps->comm;
    if (!c->store) return TERSE_OK;
    const uint8_t *lost = NULL;
    terse_status s = terse__comm_poll_lost(c, &lost);
    if (s != TERSE_OK) return s;
    int any = 0;
    for (int w = ps->nservers; w < ps->nranks; w++)
        if (lost[w] && !terse__ps_wk(ps, w)->lost && !terse__ps_wk(ps, w)->finished) {
            /* colocated: a worker lost while its rank's server is not gave up
             * after a failure (terse__store_tell_worker_gone) */
            const int gave_up = c->parent && w - ps->nservers < ps->nservers &&
                                !lost[w - ps->nservers];
            mark_lost(ps, w, gave_up ? "its rank said through the bootstrap store that this "
                                       "colocated worker failed and stopped"
                                     : "its connection to the bootstrap store dropped without a "
                                       "goodbye");
            any = 1;
        }
    /* colocated: this rank's own worker failed and will never finish */
    const int own = ps->nservers + ps->rank;
    if (atomic_load(&ps->colo_worker_gone) && own < ps->nranks && !terse__ps_wk(ps, own)->lost &&
        !terse__ps_wk(ps, own)->finished) {
        mark_lost(ps, own, "it is this rank's own (colocated) worker, which failed and stopped");
        any = 1;
    }
    return any ? after_loss(ps) : TERSE_OK;
}

/* ---------------------------------------------------------------- failovers */

/* An instance that serves a slot from now on (a promoted replica, a
 * replacement with its slot back): its clocks start now. Returns the
 * slot's step (the last key's version). */
static uint64_t start_serving(terse_ps *ps) {
    uint64_t now = terse__now_ns(), step = 0;
    ps->heard_ns = now;
    for (size_t k = 0; k < ps->nkeys; k++)
        if (ps->keys[k]->shard) {
            ps->keys[k]->shard->opened_ns = now;
            step = ps->keys[k]->shard->version;
        }
    return step;
}

/* replicas 2: the head of the mirror's slot was lost, so the mirror
 * serves the slot from its last acknowledged step on (ps_replica.c). */
static terse_status promote(terse_ps *ps) {
    terse_ps *m = ps->mirror;
    terse__fabric *f = ps->comm->fabric;
    if (!terse__fabric_cancel(f, &m->rhreq)) (void)terse__fabric_give_up(f, &m->rhreq);
    if (!terse__fabric_cancel(f, &m->rdreq)) (void)terse__fabric_give_up(f, &m->rdreq);
    terse__ps_stop_handing(m); /* the replacement died while the slot went back to it */
    if (m->catching && !m->abandoned) m->abandoned = 2; /* it never had the whole slot */
    m->promoted = 1;
    m->took_over = 1;
    m->listening = 0;
    m->stats.takeovers += !m->abandoned;
    uint64_t step = start_serving(m);
    if (m->abandoned)
        fprintf(stderr,
                "terse: parameter server rank %d: server rank %d, the head of slot %d, was lost "
                "after it had stopped replicating here: the slot is lost\n",
                ps->rank, m->slot, m->slot);
    else
        fprintf(stderr,
                "terse: parameter server rank %d: server rank %d, the head of slot %d, was lost; "
                "its replica here serves the slot from step %llu on\n",
                ps->rank, m->slot, m->slot, (unsigned long long)step);
    for (int cv = m->nservers * m->lanes; cv < NCV(m); cv++)
        if (m->peers[cv].state == P_HOLD) TERSE_CHECK(terse__ps_handle_header(m, cv));
    return TERSE_OK;
}

/* replicas 2: server rank r is back (a replacement joined as it). The
 * mirror's head: give the slot back; this head's replica: catch it up. A
 * rank lost and back between two polls is both at once. */
static terse_status on_back(terse_ps *ps, int r) {
    terse_ps *m = ps->mirror;
    if (r >= ps->nservers) return TERSE_OK; /* a worker's replacement is not served */
    if (m && r == m->slot) {
        if (!m->promoted) TERSE_CHECK(promote(ps));
        if (m->abandoned) {
            fprintf(stderr, "terse: parameter server rank %d: server rank %d is back, but slot %d "
                            "was lost here: nothing to give back\n",
                    ps->rank, r, r);
        } else {
            TERSE_CHECK(terse__ps_hand_back(m, terse__store_incarnation(ps->comm->store, r)));
            for (int cv = m->nservers * m->lanes; cv < NCV(m); cv++) {
                terse__ps_peer *p = &m->peers[cv];
                if (terse__ps_wk(m, CV_RANK(m, cv))->lost) continue;
                if (p->state == P_PARKED)
                    TERSE_CHECK(terse__ps_moved(m, cv));
                else if (p->state == P_HOLD)
                    TERSE_CHECK(terse__ps_handle_header(m, cv));
            }
        }
    }
    if (r == (ps->rank + 1) % ps->nservers) {
        if (ps->backup >= 0)
            TERSE_CHECK(terse__ps_backup_lost(ps, "a replacement joined as it", 0));
        TERSE_CHECK(terse__ps_backup_add(ps, r));
    }
    return TERSE_OK;
}

/* replicas 2: a server was lost. The mirror's head: take over; this
 * head's replica: go on alone. A server back: on_back. */
static terse_status poll_servers(terse_ps *ps) {
    if (!ps->comm->store || !ps->mirror) return TERSE_OK;
    const uint8_t *lost = NULL;
    TERSE_CHECK(terse__comm_poll_lost(ps->comm, &lost));
    if (!ps->mirror->promoted && lost[ps->mirror->slot]) TERSE_CHECK(promote(ps));
    if (ps->awaiting && lost[ps->repl_src])
        return TERSE_ERROR(TERSE_ERR_PEER_LOST,
                           "parameter server rank %d (a replacement): slot %d is lost: server "
                           "rank %d, which stood in for it, died before handing it back",
                           ps->rank, ps->slot, ps->repl_src);
    if (ps->backup >= 0 && lost[ps->backup])
        TERSE_CHECK(terse__ps_backup_lost(ps, "the bootstrap store announced its loss", 0));
    for (;;) {
        int r = -1;
        TERSE_CHECK(terse__comm_take_back(ps->comm, &r));
        if (r < 0) return TERSE_OK;
        TERSE_CHECK(on_back(ps, r));
    }
}

/* A roster from the slot's other server: the workers it lists as finished
 * said goodbye there before this instance could hear it. */
terse_status terse__ps_take_roster(terse_ps *ps, const uint8_t *roster) {
    int any = 0;
    for (int w = ps->nservers; w < ps->nranks; w++) {
        terse__ps_peer *p = terse__ps_wk(ps, w);
        if (!(roster[w] & 1) || p->finished || p->lost) continue;
        /* Its header receive stays posted: the worker may yet say goodbye
         * here too (answered as usual), or never (it did not know of this
         * process); either way nothing more is due from it. */
        p->finished = p->by_roster = 1;
        any = 1;
    }
    if (!any || ps->awaiting || (ps->slot != ps->rank && !ps->promoted)) return TERSE_OK;
    for (size_t k = 0; k < ps->nkeys; k++)
        if (ps->keys[k]->shard) TERSE_CHECK(terse__ps_maybe_close(ps, k));
    return TERSE_OK;
}

/* A replacement's head has its slot's state: serve it from here on. */
terse_status terse__ps_caught_up(terse_ps *ps) {
    if (!ps->awaiting) return TERSE_OK; /* a replica caught up: nothing more */
    ps->awaiting = 0;
    ps->took_over = 1;
    ps->listening = 0;
    ps->backup = (ps->rank + 1) % ps->nservers;
    ps->rseq = 0;
    uint64_t step = start_serving(ps);
    fprintf(stderr,
            "terse: parameter server rank %d (a replacement) has slot %d back from server rank "
            "%d, at step %llu (epoch %u)\n",
            ps->rank, ps->slot, ps->repl_src, (unsigned long long)step, ps->epoch_cur);
    for (int cv = ps->nservers * ps->lanes; cv < NCV(ps); cv++)
        if (ps->peers[cv].state == P_HOLD) TERSE_CHECK(terse__ps_handle_header(ps, cv));
    return TERSE_OK;
}

/* A replacement whose slots did not come back within the timeout: the
 * job ended before it joined, or the server that would send them died.
 * Its own slot: serving fails; the slot it replicates: it stops waiting
 * for that (it cannot take that slot over) and ends with its own. */
static terse_status waited_too_long(terse_ps *ps, uint64_t waited_ns) {
    const uint64_t limit = (uint64_t)ps->comm->timeout_ms * 1000000ull;
    if (waited_ns < limit) return TERSE_OK;
    terse_ps *m = ps->mirror;
    if (m && m->catching && !m->promoted) {
        fprintf(stderr, "terse: parameter server rank %d (a replacement): slot %d's state never "
                        "came from its head, server rank %d; this rank will not take it over\n",
                ps->rank, m->slot, m->slot);
        m->catching = 0;
        m->abandoned = 2;
        for (int w = m->nservers; w < m->nranks; w++)
            if (!terse__ps_wk(m, w)->finished)
                terse__ps_wk(m, w)->finished = terse__ps_wk(m, w)->by_roster = 1;
    }
    if (!ps->awaiting) return TERSE_OK;
    return TERSE_ERROR(TERSE_ERR_TIMEOUT,
                       "parameter server rank %d (a replacement): slot %d never came back from "
                       "server rank %d within %d ms (the job ended before this rank joined, or "
                       "that server died)",
                       ps->rank, ps->slot, ps->repl_src, ps->comm->timeout_ms);
}

/* Held requests: an unpromoted replica's (its head is alive after all),
 * or a replacement's whose slot never came back. */
static terse_status expire_held(terse_ps *ps, uint64_t now) {
    uint64_t limit = (uint64_t)ps->comm->timeout_ms * 750000ull;
    for (int cv = ps->nservers * ps->lanes; cv < NCV(ps); cv++) {
        terse__ps_peer *p = &ps->peers[cv];
        if (p->state != P_HOLD || now < p->parked_ns || now - p->parked_ns < limit) continue;
        if (ps->awaiting)
            TERSE_CHECK(terse__ps_refuse_drain(
                ps, cv, R_LOST,
                "rank %d replaces slot %d's head, and the slot's state never "
                "came back to it from server rank %d",
                ps->rank, ps->slot, ps->repl_src));
        else
            TERSE_CHECK(
                terse__ps_refuse_drain(ps, cv, R_ROLE,
                                       "rank %d holds slot %d's replica, and the slot's head, "
                                       "server rank %d, was not lost: send it there",
                                       ps->rank, ps->slot, ps->slot));
    }
    return TERSE_OK;
}

/* ---------------------------------------------------------------- timeouts */

/* The missing workers of a parked request, as text. */
static void missing(terse_ps *ps, terse__ps_shard *sh, uint64_t need, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    for (int w = ps->nservers; w < ps->nranks && n + 12 < cap; w++) {
        int miss = ps->cfg.mode == TERSE_PS_SYNC ? terse__ps_active(ps, w) && !sh->has[w]
                                                 : terse__ps_active(ps, w) && sh->pushed[w] < need;
        if (miss) n += (size_t)snprintf(out + n, cap - n, "%s%d", n ? "," : "", w);
    }
}

/* Parked pulls older than 3/4 of the timeout: the workers they wait for
 * are stopped or far too slow; tell the waiter which, before its own
 * timeout fires. */
static terse_status expire_parked(terse_ps *ps, uint64_t now) {
    uint64_t limit = (uint64_t)ps->comm->timeout_ms * 750000ull;
    for (int cv = 0; cv < NCV(ps); cv++) {
        terse__ps_peer *p = &ps->peers[cv];
        const int w = CV_RANK(ps, cv);
        if (w == ps->rank || terse__ps_wk(ps, w)->lost || p->state != P_PARKED ||
            now < p->parked_ns || now - p->parked_ns < limit)
            continue;
        terse__ps_shard *sh = ps->keys[p->h.key]->shard;
        char who[160];
        missing(ps, sh, terse__ps_ssp_need(ps, p->h.clock), who, sizeof who);
        TERSE_CHECK(
            terse__ps_refuse(ps, cv, R_TIMEOUT,
                             "step %llu of key %llu waited %llu ms for worker ranks %s, which "
                             "neither pushed nor were lost",
                             (unsigned long long)p->h.clock, (unsigned long long)p->h.key,
                             (unsigned long long)((now - p->parked_ns) / 1000000u), who));
    }
    return TERSE_OK;
}

static void release_blob(terse_ps *ps, terse__ps_peer *p) {
    terse__ps_blob *b = p->blob;
    p->blob = NULL;
    if (!b || --b->refs) return;
    terse__ps_shard *sh = p->h.key < ps->nkeys ? ps->keys[p->h.key]->shard : NULL;
    if (!sh || sh->cur != b) terse__ps_blob_free(b);
}

/* A peer that went silent in the middle of a request (a payload or a
 * reply that stopped moving) for the whole timeout: stopped, or a forger
 * whose chunks are dropped. Cancel what it holds and count it lost. */
static terse_status expire_stuck(terse_ps *ps, uint64_t now) {
    uint64_t limit = (uint64_t)ps->comm->timeout_ms * 1000000ull;
    terse__fabric *f = ps->comm->fabric;
    for (int cv = 0; cv < NCV(ps); cv++) {
        terse__ps_peer *p = &ps->peers[cv];
        const int w = CV_RANK(ps, cv);
        if (w == ps->rank || terse__ps_wk(ps, w)->lost || now < p->since_ns ||
            now - p->since_ns < limit ||
            (p->state != P_DATA && p->state != P_DRAIN && p->state != P_REPLY))
            continue;
        int ok = terse__fabric_cancel(f, &p->preq) & terse__fabric_cancel(f, &p->rreq) &
                 terse__fabric_cancel(f, &p->rpreq) & terse__fabric_cancel(f, &p->hreq);
        if (!ok)
            return TERSE_ERROR(TERSE_ERR_TRANSPORT,
                               "parameter server rank %d: rank %d's transfer would not cancel",
                               ps->rank, w);
        release_blob(ps, p);
        if (terse__ps_wk(ps, w)->finished) {
            p->state = P_DONE;
            continue;
        }
        char how[96];
        snprintf(how, sizeof how, "silent for %llu ms in the middle of a request",
                 (unsigned long long)((now - p->since_ns) / 1000000u));
        p->state = P_DONE;
        mark_lost(ps, w, how);
        terse__ps_wk(ps, w)->lost = 1;
        TERSE_CHECK(after_loss(ps));
    }
    return TERSE_OK;
}

/* Every active worker silent (no request, none in progress) for the
 * timeout: a worker that ended without terse_ps_finish, or one stopped
 * between requests. Serving ends with TERSE_ERR_TIMEOUT naming them. */
static terse_status check_silence(terse_ps *ps, uint64_t now) {
    uint64_t limit = (uint64_t)ps->comm->timeout_ms * 1000000ull;
    if (ps->awaiting || now < ps->heard_ns || now - ps->heard_ns < limit) return TERSE_OK;
    char who[160];
    size_t n = 0;
    who[0] = 0;
    for (int w = ps->nservers; w < ps->nranks; w++) {
        if (!terse__ps_active(ps, w)) continue;
        for (int l = 0; l < ps->lanes; l++)
            if (ps->peers[w * ps->lanes + l].state != P_HDR)
                return TERSE_OK; /* a conversation is under way */
        if (n + 12 < sizeof who) n += (size_t)snprintf(who + n, sizeof who - n, "%s%d", n ? "," : "", w);
    }
    if (!n) return TERSE_OK;
    return TERSE_ERROR(TERSE_ERR_TIMEOUT,
                       "parameter server rank %d: no request from worker ranks %s for %llu ms, "
                       "and they neither finished (terse_ps_finish) nor were lost",
                       ps->rank, who, (unsigned long long)((now - ps->heard_ns) / 1000000u));
}

/* ---------------------------------------------------------------- loop */


/* Move peer w along as far as its completions allow. */
static terse_status step_peer(terse_ps *ps, int cv) {
    terse__ps_peer *p = &ps->peers[cv], *wk = terse__ps_wk(ps, CV_RANK(ps, cv));
    const int w = CV_RANK(ps, cv);
    const terse__fabric *f = ps->comm->fabric;
    if (wk->lost) return TERSE_OK;
    switch (p->state) {
    case P_HDR:
        if (!terse__fabric_req_idle(f, &p->hreq)) return TERSE_OK;
        if (p->hreq.error == TERSE_ERR_PEER_LOST) {
            mark_lost(ps, w, terse__comm_last_sentence());
            return after_loss(ps);
        }
        if (p->hreq.error && !terse__ps_is_worker(ps, w)) { /* a server that died or was replaced */
            wk->lost = 1;
            return TERSE_OK;
        }
        ps->heard_ns = terse__now_ns();
        if (p->hreq.error)
            return terse__ps_refuse(ps, cv, R_CORRUPT, "a request header of the wrong size");
        return terse__ps_handle_header(ps, cv);
    case P_DATA:
    case P_DRAIN:
        if (!terse__fabric_req_idle(f, &p->preq)) return TERSE_OK;
        if (p->preq.error == TERSE_ERR_PEER_LOST) {
            mark_lost(ps, w, terse__comm_last_sentence());
            return after_loss(ps);
        }
        if (p->state == P_DRAIN || p->preq.error) {
            int kind = p->state == P_DRAIN ? (int)p->pend : R_CORRUPT;
            const char *why = p->state == P_DRAIN ? p->pend_text : "a payload of the wrong size";
            char text[TERSE__PS_REP_TEXT];
            snprintf(text, sizeof text, "%s", why);
            return terse__ps_refuse(ps, cv, kind, "%s", text);
        }
        return terse__ps_handle_push(ps, cv);
    case P_REPLY:
        if (!terse__fabric_req_idle(f, &p->rreq) || !terse__fabric_req_idle(f, &p->rpreq))
            return TERSE_OK;
        release_blob(ps, p);
        if (p->rreq.error || p->rpreq.error) {
            if (wk->finished) { /* it said goodbye and went: nothing more is due */
                p->state = P_DONE;
                return TERSE_OK;
            }
            mark_lost(ps, w, "a reply to it failed");
            return after_loss(ps);
        }
        p->seq++;
        if (wk->finished) {
            p->state = P_DONE;
            return TERSE_OK;
        }
        if (p->hdr_early) { /* already posted with the reply */
            p->hdr_early = 0;
            memset(&p->h, 0, sizeof p->h);
            p->state = P_HDR;
            return TERSE_OK;
        }
        return terse__ps_post_header(ps, cv);
    default:
        return TERSE_OK;
    }
}

/* Every worker lost, or finished with its goodbye answered (lane 0) and
 * no other lane in the middle of a request. */
static int all_done(const terse_ps *ps) {
    for (int w = ps->nservers; w < ps->nranks; w++) {
        const terse__ps_peer *p = terse__ps_wk_c(ps, w);
        int done = p->state == P_DONE || (p->by_roster && p->state == P_HDR);
        for (int l = 1; l < ps->lanes; l++) {
            int st = ps->peers[w * ps->lanes + l].state;
            done &= st == P_HDR || st == P_DONE;
        }
        if (!p->lost && !(p->finished && done)) return 0;
    }
    return 1;
}

/* Cancel what is still posted to each peer (other servers' headers,
 * lost workers' receives); 0 if something would not come back. */
static int cancel_all(terse_ps *ps) {
    terse__fabric *f = ps->comm->fabric;
    int ok = 1;
    for (int cv = 0; cv < NCV(ps); cv++) {
        if (CV_RANK(ps, cv) == ps->rank) continue;
        terse__ps_peer *p = &ps->peers[cv];
        ok &= terse__fabric_cancel(f, &p->hreq);
        ok &= terse__fabric_cancel(f, &p->preq);
        ok &= terse__fabric_cancel(f, &p->rreq);
        ok &= terse__fabric_cancel(f, &p->rpreq);
        release_blob(ps, p);
    }
    return ok;
}

/* A promoted replica's work counts as this server's. */
static void fold_stats(terse_ps *ps, const terse_ps *m) {
    terse_ps_stats *a = &ps->stats;
    const terse_ps_stats *b = &m->stats;
    a->pushes_applied += b->pushes_applied;
    a->steps_closed += b->steps_closed;
    a->late_dropped += b->late_dropped;
    a->refused_key += b->refused_key;
    a->refused_step += b->refused_step;
    a->refused_role += b->refused_role;
    a->refused_corrupt += b->refused_corrupt;
    a->refused_nonfinite += b->refused_nonfinite;
    a->refused_window += b->refused_window;
    a->deadline_closes += b->deadline_closes;
    a->takeovers += b->takeovers;
    a->duplicates += b->duplicates;
    if (b->workers_lost > a->workers_lost) a->workers_lost = b->workers_lost;
}

terse_status terse__ps_serve_run(terse_comm *c, terse_request *r, int *keep_usable) {
    terse_ps *ps = r->a.ext.obj;
    terse_status s = TERSE_OK;
    if (ps->served) {
        *keep_usable = 1;
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_serve on rank %d: this server already served its workers "
                           "(it runs once per terse_ps)",
                           ps->rank);
    }
    ps->served = 1;
    terse_ps *m = ps->mirror; /* replicas 2: the slot this rank is the replica of */
    for (int cv = 0; cv < NCV(ps) && s == TERSE_OK; cv++)
        if (CV_RANK(ps, cv) != ps->rank) s = terse__ps_post_header(ps, cv);
    for (int cv = m ? m->nservers * m->lanes : 0; m && cv < NCV(m) && s == TERSE_OK; cv++)
        s = terse__ps_post_header(m, cv);
    uint64_t last_poll = 0, last_event = terse__now_ns();
    const uint64_t started = last_event;
    ps->heard_ns = last_event;
    if (m) m->heard_ns = last_event;
    unsigned idle = 0;
    while (s == TERSE_OK && !(all_done(ps) && (!m || all_done(m)))) {
        if (atomic_load_explicit(&c->aborted, memory_order_acquire)) {
            s = TERSE_ERROR(TERSE_ERR_ABORTED, "parameter server rank %d: aborted "
                                               "(terse_comm_abort) while serving", ps->rank);
            break;
        }
        size_t events = 0;
        s = terse__fabric_progress(c->fabric, &events);
        for (int cv = 0; s == TERSE_OK && cv < NCV(ps); cv++)
            if (CV_RANK(ps, cv) != ps->rank) s = step_peer(ps, cv);
        for (int cv = m ? m->nservers * m->lanes : 0; m && s == TERSE_OK && cv < NCV(m); cv++)
            s = step_peer(m, cv);
        if (s == TERSE_OK && (m || ps->backup >= 0)) s = terse__ps_repl_progress(ps);
        uint64_t now = terse__now_ns();
        if (s == TERSE_OK && now - last_poll >= POLL_NS) {
            last_poll = now;
            s = poll_losses(ps);
            if (s == TERSE_OK) s = poll_servers(ps);
            if (s == TERSE_OK) s = terse__ps_close_overdue(ps, now);
            if (s == TERSE_OK) s = expire_parked(ps, now);
            if (s == TERSE_OK) s = expire_stuck(ps, now);
            /* a request to either instance is a worker heard */
            if (m && m->heard_ns > ps->heard_ns) ps->heard_ns = m->heard_ns;
            if (m && ps->heard_ns > m->heard_ns) m->heard_ns = ps->heard_ns;
            if (s == TERSE_OK) s = check_silence(ps, now);
            /* the mirror learns losses too: a dead worker's goodbye never comes */
            if (s == TERSE_OK && m) s = poll_losses(m);
            if (s == TERSE_OK && m && !m->promoted) s = expire_held(m, now);
            if (s == TERSE_OK && ps->awaiting) s = expire_held(ps, now);
            if (s == TERSE_OK && (ps->awaiting || (m && m->catching)))
                s = waited_too_long(ps, now - started);
            if (s == TERSE_OK && m && m->promoted) s = terse__ps_close_overdue(m, now);
            if (s == TERSE_OK && m && m->promoted) s = expire_parked(m, now);
            if (s == TERSE_OK && m) s = expire_stuck(m, now);
            if (s == TERSE_OK && m && m->promoted) s = check_silence(m, now);
        }
        if (events) {
            idle = 0;
            last_event = now;
        } else if (now - last_event >= NAP_AFTER_NS) {
            struct timespec nap = {0, 20000};
            nanosleep(&nap, NULL);
        } else if (++idle >= 16) {
            sched_yield();
        }
    }
    if (s == TERSE_OK) terse__ps_tell_done(ps);
    char why[512];
    snprintf(why, sizeof why, "%s", terse_last_error());
    terse__ps_repl_cancel(ps);
    int clean = cancel_all(ps); /* its cancellations leave sentences of their own */
    if (m) {
        clean &= cancel_all(m);
        fold_stats(ps, m);
    }
    if (s != TERSE_OK) terse__error_restore(why);
    if (s != TERSE_OK || !clean) {
        if (s == TERSE_OK)
            s = TERSE_ERROR(TERSE_ERR_TRANSPORT,
                            "parameter server rank %d: a receive would not cancel", ps->rank);
        return s; /* the engine quiesces the fabric */
    }
    *keep_usable = 1;
    for (int w = ps->nservers; w < ps->nranks; w++)
        if (terse__ps_wk(ps, w)->lost)
            return TERSE_ERROR(TERSE_ERR_PEER_LOST,
                               "parameter server rank %d: worker rank %d was lost; %s", ps->rank,
                               w,
                               ps->broken[0] ? "its steps failed (sync without enough workers)"
                                             : "serving went on without it");
    return TERSE_OK;
}

terse_status terse_ps_serve(terse_ps *ps) {
    if (!ps) return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_serve: ps is NULL");
    if (ps->colo)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "terse_ps_serve on rank %d: with colocate=1 this rank's server runs on "
                           "an executor of its own from its worker's first request; "
                           "terse_ps_free waits for it to finish serving",
                           ps->colo_rank);
    if (!ps->is_server)
        return TERSE_ERROR(TERSE_ERR_INVALID, "terse_ps_serve on rank %d: this rank is a worker",
                           ps->rank);
    terse_request t = terse__engine_make(ps->comm, TERSE__OP_EXT);
    t.a.ext.run = terse__ps_serve_run;
    t.a.ext.obj = ps;
    t.a.ext.name = "terse_ps_serve";
    return terse__engine_run_ext(ps->comm, &t);
}
