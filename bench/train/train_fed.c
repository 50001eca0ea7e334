/* terse-bench train --mode fedavg:E, the clients' side (train_worker.h).
 *
 * Federated averaging (McMahan et al., AISTATS 2017) on the parameter
 * server: rank 0 serves, and every worker process is one client with its
 * own shard (so the error feedback of its codec is its own: the library
 * keeps a push codec's residual per process). Each round r:
 *   - every process draws the same sample of m = round(F x N) clients
 *     (a shuffle keyed by the seed and r);
 *   - a sampled client trains E epochs of plain SGD (--lr, --batch) from
 *     the round's model x_r and pushes its change x_r - x_c through the
 *     run's codec, weighted by its examples (terse_ps_push_weighted);
 *     with --dropout P it drops out instead (no push: a client that died
 *     or lost its link), and the round closes at --deadline-ms;
 *   - every client moves its clock on and pulls x_{r+1}: the server runs
 *     sync:quorum=m with SGD at lr 1 and no momentum, so
 *     x_{r+1} = x_r - sum(n_c (x_r - x_c)) / sum(n_c), the examples-
 *     weighted average of the models that made the round.
 * Clients that sit a round out only wait in their pull (the server parks
 * it), so N client processes share 2 cores with m of them training. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <terse.h>

#include "core/bench.h"
#include "train/train.h"
#include "train/train_worker.h"

int train_fed_per_round(const train_options *o, int clients) {
    int m = (int)lround(o->fraction * clients);
    return m < 1 ? 1 : m > clients ? clients : m;
}

void train_fed_ps_mode(const train_options *o, int clients, char *out, size_t cap) {
    int m = train_fed_per_round(o, clients);
    if (o->deadline_ms)
        snprintf(out, cap, "sync:quorum=%d,deadline_ms=%d", m, o->deadline_ms);
    else
        snprintf(out, cap, "sync:quorum=%d", m);
}

/* Whether client c is in round r's sample, and whether it drops out. */
static int sampled(const train_options *o, const train_run *cfg, int r, int c, int clients) {
    size_t order[256];
    for (int i = 0; i < clients; i++) order[i] = (size_t)i;
    train_shuffle(order, (size_t)clients, train_stream_key(cfg->seed, 0xfed5, (uint64_t)r));
    int m = train_fed_per_round(o, clients);
    for (int i = 0; i < m; i++)
        if (order[i] == (size_t)c) return 1;
    return 0;
}

static int drops_out(const train_options *o, const train_run *cfg, int r, int c) {
    if (o->dropout <= 0) return 0;
    uint64_t s = train_stream_key(cfg->seed, 0xd209, (uint64_t)r * 256u + (uint64_t)c);
    return train_uniform(&s) < o->dropout;
}

static int grow_shard(worker *w, size_t n) {
    if (n <= w->shard_cap) return 0;
    size_t *p = realloc(w->shard, n * sizeof *p);
    if (!p) return train_fail(w, "allocating the shard", TERSE_ERR_NOMEM);
    w->shard = p;
    w->shard_cap = n;
    return 0;
}

/* Dirichlet over labels (Hsu, Qi and Brown 2019): for each class, the
 * clients' shares p ~ Dir(alpha) cut the class's examples (in a shuffled
 * order) into N runs. Drawn again, up to 100 times, until every client
 * has at least one batch. */
static int dirichlet_shard(worker *w, const train_run *cfg) {
    const int N = w->nworkers;
    const size_t n = w->n_used, batch = w->o->batch;
    size_t *perm = w->perm;
    for (int attempt = 0; attempt < 100; attempt++) {
        uint64_t s = train_stream_key(cfg->seed, 0xd1c1, (uint64_t)attempt);
        for (size_t i = 0; i < n; i++) perm[i] = i;
        train_shuffle(perm, n, train_stream_key(cfg->seed, 0xd1c2, (uint64_t)attempt));
        size_t count[256] = {0}, mine = 0;
        if (grow_shard(w, n) != 0) return -1;
        for (int k = 0; k < MODEL_CLASSES; k++) {
            double p[256], total = 0;
            for (int c = 0; c < N; c++) total += p[c] = train_gamma(cfg->alpha, &s);
            size_t nk = 0;
            for (size_t i = 0; i < n; i++) nk += w->train.labels[perm[i]] == k;
            /* cut points: floor of the cumulative share, the last exactly nk */
            double cum = 0;
            size_t lo = 0, seen = 0, i = 0;
            for (int c = 0; c < N; c++) {
                cum += p[c];
                size_t hi = c + 1 == N ? nk : (size_t)floor(cum / total * (double)nk);
                if (hi > nk) hi = nk;
                if (hi < lo) hi = lo;
                count[c] += hi - lo;
                for (; seen < hi && i < n; i++) {
                    if (w->train.labels[perm[i]] != k) continue;
                    if (c == w->rank) w->shard[mine++] = perm[i];
                    seen++;
                }
                lo = hi;
            }
        }
        size_t least = n;
        for (int c = 0; c < N; c++)
            if (count[c] < least) least = count[c];
        if (least >= batch) {
            w->shard_n = mine;
            if (w->rank == 0 && !w->o->quiet) {
                size_t most = 0;
                for (int c = 0; c < N; c++)
                    if (count[c] > most) most = count[c];
                fprintf(stderr, WHO ": %s: dirichlet:%g shards hold %zu to %zu examples\n",
                        cfg->label, cfg->alpha, least, most);
            }
            return 0;
        }
    }
    fprintf(stderr, WHO ": --partition dirichlet:%g over %d clients left a client with fewer "
                    "than one batch of %zu examples in 100 draws: raise alpha or lower --clients "
                    "or --batch\n",
            cfg->alpha, N, batch);
    return -1;
}

int train_fed_shard(worker *w, const train_run *cfg) {
    if (w->o->mode != TRAIN_MODE_FEDAVG || cfg->alpha == 0) {
        w->shard_n = w->n_used / (size_t)w->nworkers;
        train_deal_shard(w, cfg->seed);
        return 0;
    }
    return dirichlet_shard(w, cfg);
}

/* Push every tensor's change (in the grads), weighted by the client's
 * examples; 1 if a push came too late for its round (counted). */
static int push_change(worker *w, terse_ps *ps, model *m, float *flat, double weight,
                       double *sums) {
    size_t nt = model_tensor_count(m);
    terse_request *req[MODEL_MAX_TENSORS] = {0};
    int rc = 0, late = 0;
    if (flat) {
        size_t off = 0;
        for (size_t i = 0; i < nt; i++) {
            const model_tensor *t = model_tensor_at(m, i);
            memcpy(flat + off, t->grad, t->n * sizeof(float));
            off += t->n;
        }
        terse_status s = terse_ps_push_weighted(ps, 0, flat, weight, NULL);
        late = s == TERSE_ERR_STALE;
        if (s != TERSE_OK && !late) rc = train_fail(w, "terse_ps_push_weighted", s);
    }
    for (size_t i = 0; !flat && i < nt && rc == 0; i++) {
        terse_status s = terse_ps_push_weighted(ps, i, model_tensor_at(m, i)->grad, weight, &req[i]);
        if (s != TERSE_OK) rc = train_fail(w, "terse_ps_push_weighted", s);
    }
    for (size_t i = 0; i < nt; i++) {
        if (!req[i]) continue;
        terse_status s = terse_request_wait(req[i]);
        terse_request_free(req[i]);
        if (s == TERSE_ERR_STALE) late = 1;
        else if (s != TERSE_OK && rc == 0) rc = train_fail(w, "terse_ps_push_weighted", s);
    }
    sums[T_STALE] += late;
    return rc;
}

/* E epochs of plain SGD on the shard from the model as pulled; the grads
 * then hold the change, anchor - local. */
static void local_epochs(worker *w, run_state *r, int round, double *loss_sum, double *loss_count) {
    const train_options *o = w->o;
    model *m = r->m;
    size_t nt = model_tensor_count(m);
    for (size_t i = 0; i < nt; i++) {
        const model_tensor *t = model_tensor_at(m, i);
        memcpy(r->anchor[i], t->value, t->n * sizeof(float));
    }
    const long steps = (long)(w->shard_n / o->batch);
    const float lr = (float)o->lr;
    for (int e = 0; e < r->cfg->fed_epochs; e++) {
        memcpy(r->order, w->shard, w->shard_n * sizeof *r->order);
        train_shuffle(r->order, w->shard_n,
                      train_stream_key(r->cfg->seed, (uint64_t)round * 1000u + (uint64_t)e + 1,
                                       (uint64_t)w->rank + 1));
        for (long k = 0; k < steps; k++) {
            train_fill_batch(w, &w->train, r->order, (size_t)k * o->batch, o->batch);
            *loss_sum += model_forward_backward(m, w->x, w->y, o->batch);
            *loss_count += 1;
            for (size_t i = 0; i < nt; i++) {
                model_tensor *t = model_tensor_at(m, i);
                for (size_t j = 0; j < t->n; j++) t->value[j] -= lr * t->grad[j];
            }
        }
    }
    for (size_t i = 0; i < nt; i++) {
        model_tensor *t = model_tensor_at(m, i);
        for (size_t j = 0; j < t->n; j++) t->grad[j] = r->anchor[i][j] - t->value[j];
    }
}

int train_fed_client(worker *w, terse_ps *ps, run_state *r, train_snapshots *ss, double *sums,
                     float *flat, double *step_bytes) {
    const train_options *o = w->o;
    model *m = r->m;
    size_t nt = model_tensor_count(m);
    int rc = 0;
    for (size_t i = 0; i < nt && rc == 0; i++)
        if (!(r->anchor[i] = malloc(model_tensor_at(m, i)->n * sizeof(float))))
            rc = train_fail(w, "allocating", TERSE_ERR_NOMEM);
    if (rc == 0) rc = train_ps_pull_all(w, ps, m, flat, "the first terse_ps_pull");
    double start = bench_now(), loss_sum = 0, loss_count = 0, last_progress = start;
    terse_comm_stats s0 = TERSE_COMM_STATS_INIT;
    terse_comm_get_stats(w->comm, &s0);
    const double examples = (double)w->shard_n;
    for (int rd = 0; rd < o->rounds && rc == 0; rd++) {
        double b0 = train_wire_sent(w);
        if (sampled(o, r->cfg, rd, w->rank, w->nworkers)) {
            if (drops_out(o, r->cfg, rd, w->rank)) {
                sums[T_DROPPED] += 1; /* gone for this round: no training, no push */
            } else {
                double t0 = bench_now();
                local_epochs(w, r, rd, &loss_sum, &loss_count);
                sums[T_COMPUTE] += bench_now() - t0;
                rc = push_change(w, ps, m, flat, examples, sums);
            }
        }
        terse_status s = rc == 0 ? terse_ps_clock(ps) : TERSE_OK;
        if (s != TERSE_OK) rc = train_fail(w, "terse_ps_clock", s);
        if (rc == 0) rc = train_ps_pull_all(w, ps, m, flat, "terse_ps_pull of the round's model");
        step_bytes[rd] = train_wire_sent(w) - b0;
        r->step = rd + 1;
        int last = rd + 1 == o->rounds;
        /* every round, unless --eval-every says otherwise */
        if (rc == 0 && w->rank == 0 && (!o->eval_every || r->step % o->eval_every == 0 || last))
            rc = train_snap(w, ss, m, r->step, rd + 1, bench_now() - start, 0, &loss_sum,
                            &loss_count);
        if (w->rank == 0 && !o->quiet && bench_now() - last_progress >= PROGRESS_SECONDS) {
            last_progress = bench_now();
            fprintf(stderr, WHO ": [%d/%zu] %s: round %d/%d\n", r->index + 1, o->n_runs,
                    r->cfg->label, rd + 1, o->rounds);
        }
    }
    train_ps_tally(w, &s0, start, sums);
    for (size_t i = 0; i < nt; i++) {
        free(r->anchor[i]);
        r->anchor[i] = NULL;
    }
    return rc;
}
