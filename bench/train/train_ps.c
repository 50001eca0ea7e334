/* terse-bench train --mode ps:M, every rank's role (train_worker.h).
 *
 * Ranks [0, S) are parameter servers: they hold the model (initialised as
 * every rank initialises it) and run SGD with momentum on the gradients
 * the workers push. Ranks [S, S + W) are workers 0..W-1: each computes a
 * gradient on its shard, pushes it (compressed with the run's codec, error
 * feedback on the worker) and pulls the parameters back.
 *
 * Evaluation must not stop the clock of one worker while the others run
 * on (async modes would gain from it), so worker 0 only keeps snapshots
 * of the parameters it pulled (a copy, at every --eval-every steps and at
 * each epoch's end, with its wall time) and evaluates them after training.
 * The time axis is worker 0's wall time: keep the straggler off worker 0
 * (the options refuse --straggler 0). Bytes are worker 0's until the last
 * record, which has the maximum over workers. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <terse.h>

#include "core/bench.h"
#include "train/train.h"
#include "train/train_worker.h"

int train_snap(worker *w, train_snapshots *ss, model *m, long step, int epoch, double wall,
               double bytes, double *loss_sum, double *loss_count) {
    if (ss->n == ss->cap) {
        size_t cap = ss->cap ? 2 * ss->cap : 32;
        train_snapshot *v = realloc(ss->v, cap * sizeof *v);
        if (!v) return train_fail(w, "keeping a snapshot", TERSE_ERR_NOMEM);
        ss->v = v;
        ss->cap = cap;
    }
    train_snapshot *s = &ss->v[ss->n];
    size_t total = model_param_count(m), off = 0;
    if (!(s->params = malloc(total * sizeof(float))))
        return train_fail(w, "keeping a snapshot", TERSE_ERR_NOMEM);
    for (size_t i = 0; i < model_tensor_count(m); i++) {
        const model_tensor *t = model_tensor_at(m, i);
        memcpy(s->params + off, t->value, t->n * sizeof(float));
        off += t->n;
    }
    s->step = step;
    s->epoch = epoch;
    s->wall_s = wall;
    s->bytes = bytes;
    s->loss_sum = *loss_sum;
    s->loss_count = *loss_count;
    *loss_sum = *loss_count = 0;
    ss->n++;
    return 0;
}

double train_wire_sent(const worker *w) {
    terse_comm_stats st = TERSE_COMM_STATS_INIT;
    terse_comm_get_stats(w->comm, &st);
    return (double)st.wire_bytes_sent;
}

/* Push every tensor's gradient, then pull every tensor's parameters, all
 * in flight together: the pushes reach the servers before the first pull
 * waits for its step to close, so a step costs one wait, not one per
 * tensor. A push the server refuses as late or stale (a quorum closed the
 * step without it, or max_staleness) is dropped; the pull that follows
 * brings the newer parameters. */
/* Dense runs: the whole model is one key (DDP buckets its gradients the
 * same way), so a step is one round trip to each server, not one per
 * tensor; flat holds the gradients going out and the parameters coming
 * back. */
/* A push the server dropped as late or stale, or left out as non-finite
 * (a model that diverged under an attack), is counted; the pull then
 * brings the newer parameters. 1 if s was one of those. */
static int dropped(terse_status s, double *sums) {
    if (s == TERSE_ERR_STALE) sums[T_STALE] += 1;
    if (s == TERSE_ERR_NONFINITE) sums[T_NONFINITE] += 1;
    return s == TERSE_ERR_STALE || s == TERSE_ERR_NONFINITE;
}

static int exchange_fused(worker *w, terse_ps *ps, model *m, float *flat, double *sums) {
    size_t off = 0, nt = model_tensor_count(m);
    for (size_t i = 0; i < nt; i++) {
        const model_tensor *t = model_tensor_at(m, i);
        memcpy(flat + off, t->grad, t->n * sizeof(float));
        off += t->n;
    }
    terse_status s = terse_ps_pushpull(ps, 0, flat, NULL);
    if (dropped(s, sums)) s = terse_ps_pull(ps, 0, flat, NULL);
    if (s != TERSE_OK) return train_fail(w, "terse_ps_pushpull", s);
    off = 0;
    for (size_t i = 0; i < nt; i++) {
        model_tensor *t = model_tensor_at(m, i);
        memcpy(t->value, flat + off, t->n * sizeof(float));
        off += t->n;
    }
    return 0;
}

static int exchange(worker *w, terse_ps *ps, model *m, double *sums) {
    terse_request *req[2 * MODEL_MAX_TENSORS] = {0};
    size_t nt = model_tensor_count(m);
    int rc = 0;
    for (size_t i = 0; i < nt && rc == 0; i++) {
        terse_status s = terse_ps_push(ps, i, model_tensor_at(m, i)->grad, &req[i]);
        if (s != TERSE_OK) rc = train_fail(w, "terse_ps_push", s);
    }
    for (size_t i = 0; i < nt && rc == 0; i++) {
        terse_status s = terse_ps_pull(ps, i, model_tensor_at(m, i)->value, &req[nt + i]);
        if (s != TERSE_OK) rc = train_fail(w, "terse_ps_pull", s);
    }
    for (size_t i = 0; i < 2 * nt; i++) {
        if (!req[i]) continue;
        terse_status s = terse_request_wait(req[i]);
        terse_request_free(req[i]);
        if (i < nt && dropped(s, sums)) continue;
        if (s != TERSE_OK && rc == 0) rc = train_fail(w, i < nt ? "terse_ps_push" : "terse_ps_pull", s);
    }
    return rc;
}

/* --momentum-at local: what a worker pushes is its momentum, v = mu v + g
 * (the server then runs plain SGD). */
static void local_momentum(const train_options *o, run_state *r) {
    for (size_t i = 0; i < model_tensor_count(r->m); i++) {
        model_tensor *t = model_tensor_at(r->m, i);
        const float mu = (float)o->momentum;
        for (size_t j = 0; j < t->n; j++) t->grad[j] = r->velocity[i][j] = mu * r->velocity[i][j] + t->grad[j];
    }
}

int train_ps_pull_all(worker *w, terse_ps *ps, model *m, float *flat, const char *what) {
    size_t nt = model_tensor_count(m);
    if (flat) {
        terse_status s = terse_ps_pull(ps, 0, flat, NULL);
        if (s != TERSE_OK) return train_fail(w, what, s);
        size_t off = 0;
        for (size_t i = 0; i < nt; i++) {
            model_tensor *t = model_tensor_at(m, i);
            memcpy(t->value, flat + off, t->n * sizeof(float));
            off += t->n;
        }
        return 0;
    }
    for (size_t i = 0; i < nt; i++) {
        terse_status s = terse_ps_pull(ps, i, model_tensor_at(m, i)->value, NULL);
        if (s != TERSE_OK) return train_fail(w, what, s);
    }
    return 0;
}

void train_ps_tally(const worker *w, const terse_comm_stats *s0, double start, double *sums) {
    terse_comm_stats s1 = TERSE_COMM_STATS_INIT;
    terse_comm_get_stats(w->comm, &s1);
    sums[T_BYTES] = (double)(s1.wire_bytes_sent - s0->wire_bytes_sent);
    sums[T_CODEC] = s1.codec_seconds - s0->codec_seconds;
    sums[T_NET] = s1.network_seconds - s0->network_seconds;
    sums[T_WALL] = bench_now() - start;
}

/* step_bytes (or NULL): this process's bytes sent at each step. */
static int worker_train(worker *w, terse_ps *ps, run_state *r, train_snapshots *ss, double *sums,
                        float *flat, train_attacker *att, double *step_bytes) {
    const train_options *o = w->o;
    model *m = r->m;
    if (train_ps_pull_all(w, ps, m, flat, "the first terse_ps_pull") != 0) return -1;
    double start = bench_now(), loss_sum = 0, loss_count = 0, last_progress = start;
    double b0 = train_wire_sent(w), b_step = b0;
    /* fedavg's baseline: ten evaluations an epoch, for the plot's curve */
    long every = o->eval_every;
    if (!every && o->mode == TRAIN_MODE_FEDAVG)
        every = w->steps_per_epoch >= 10 ? w->steps_per_epoch / 10 : 1;
    terse_comm_stats s0 = TERSE_COMM_STATS_INIT;
    terse_comm_get_stats(w->comm, &s0);
    for (int e = 1; e <= o->epochs; e++) {
        memcpy(r->order, w->shard, w->shard_n * sizeof *r->order);
        train_shuffle(r->order, w->shard_n,
                      train_stream_key(r->cfg->seed, (uint64_t)e, (uint64_t)w->rank + 1));
        for (long k = 0; k < w->steps_per_epoch; k++) {
            double t0 = bench_now();
            train_fill_batch(w, &w->train, r->order, (size_t)k * o->batch, o->batch);
            if (att && r->cfg->attack == ATTACK_LABELFLIP) train_flip_labels(w->y, o->batch);
            loss_sum += model_forward_backward(m, w->x, w->y, o->batch);
            loss_count += 1;
            if (r->cfg->local_momentum) local_momentum(o, r);
            if (att) train_attack_apply(w, r->cfg, att, m, e, k);
            train_straggle(w, t0, r->cfg->seed, r->step);
            sums[T_COMPUTE] += bench_now() - t0;
            int bad = flat ? exchange_fused(w, ps, m, flat, sums) : exchange(w, ps, m, sums);
            if (bad) return -1;
            terse_status s = terse_ps_clock(ps);
            if (s != TERSE_OK) return train_fail(w, "terse_ps_clock", s);
            if (step_bytes) {
                double now = train_wire_sent(w);
                step_bytes[r->step] = now - b_step;
                b_step = now;
            }
            r->step++;
            int last = k + 1 == w->steps_per_epoch;
            if (w->rank == 0 && ((every && r->step % every == 0) || last) &&
                train_snap(w, ss, m, r->step, e, bench_now() - start, train_wire_sent(w) - b0, &loss_sum,
                     &loss_count) != 0)
                return -1;
            if (w->rank == 0 && !o->quiet && bench_now() - last_progress >= PROGRESS_SECONDS) {
                last_progress = bench_now();
                fprintf(stderr, WHO ": [%d/%zu] ps:%s %s: epoch %d, step %ld/%ld\n",
                        r->index + 1, o->n_runs, o->ps_mode, r->cfg->label, e, r->step,
                        r->steps_total);
            }
        }
    }
    train_ps_tally(w, &s0, start, sums);
    return 0;
}

/* Worker 0, after training: evaluate every snapshot on the whole test set. */
/* cum_bytes (fedavg, or NULL): the bytes every process sent up to each
 * step, summed. */
static int evaluate_snapshots(worker *w, run_state *r, const train_snapshots *ss, const double *max,
                              const double *cum_bytes) {
    model *m = r->m;
    for (size_t k = 0; k < ss->n; k++) {
        const train_snapshot *sn = &ss->v[k];
        size_t off = 0;
        for (size_t i = 0; i < model_tensor_count(m); i++) {
            model_tensor *t = model_tensor_at(m, i);
            memcpy(t->value, sn->params + off, t->n * sizeof(float));
            off += t->n;
        }
        size_t correct = 0;
        double loss = 0;
        for (size_t lo = 0; lo < w->test.n; lo += EVAL_CHUNK) {
            size_t b = w->test.n - lo < EVAL_CHUNK ? w->test.n - lo : EVAL_CHUNK, c = 0;
            train_fill_batch(w, &w->test, NULL, lo, b);
            loss += model_evaluate(m, w->x, w->y, b, &c) * (double)b;
            correct += c;
        }
        int final = k + 1 == ss->n;
        train_record rec;
        train_record_begin(&rec, r, final, sn->epoch, sn->step);
        rec.test_acc = 100.0 * (double)correct / (double)w->test.n;
        rec.test_loss = loss / (double)w->test.n;
        rec.train_loss = sn->loss_count > 0 ? sn->loss_sum / sn->loss_count : NAN;
        rec.bytes_sent = final ? max[T_BYTES] : sn->bytes;
        /* What a worker sends with a PS: the model, once per step, dense. */
        rec.dense_bytes = 4.0 * (double)model_param_count(m) * (double)sn->step;
        const train_run *c = r->cfg;
        if (cum_bytes) { /* fedavg: every client's uplink, and dense fp32 pushes of them all */
            rec.bytes_sent = cum_bytes[sn->step - 1];
            rec.dense_bytes *= c->fed_epochs ? train_fed_per_round(w->o, w->nworkers) : w->nworkers;
        }
        rec.compute_s = max[T_COMPUTE];
        rec.codec_s = max[T_CODEC];
        rec.network_s = max[T_NET];
        rec.wall_s = sn->wall_s;
        char attack[24] = "";
        if (c->attack != ATTACK_NONE)
            snprintf(attack, sizeof attack, " %d:%s", c->byz_k, train_attack_name(c->attack));
        if (w->o->mode == TRAIN_MODE_FEDAVG)
            snprintf(rec.label, sizeof rec.label, "%s", c->label);
        else
            snprintf(rec.label, sizeof rec.label, "ps:%.16s %.20s%s %.16s", w->o->ps_mode,
                     c->aggregator[0] ? c->aggregator : "mean", attack, c->label);
        if (!w->o->quiet)
            fprintf(stderr, WHO ": [%d/%zu] %s: epoch %d, step %ld/%ld: test %.2f%%, %.1f s\n",
                    r->index + 1, w->o->n_runs, rec.label, rec.epoch, rec.step, rec.steps_total,
                    rec.test_acc, rec.wall_s);
        if (train_keep_record(w, &rec) != 0) return -1;
    }
    return 0;
}

static double dropped_clients(const double *all, int servers, int nranks) {
    double n = 0;
    for (int k = servers; k < nranks; k++) n += all[k * T_FIELDS + T_DROPPED];
    return n;
}

/* fedavg: the clients' bytes of each step, summed over the clients and
 * accumulated, into *step_bytes (allocated here on the servers, which
 * learn the step count from the workers' tallies). */
static int sum_step_bytes(worker *w, int servers, const double *all, double **step_bytes) {
    int nranks = terse_comm_size(w->comm);
    size_t steps = (size_t)all[servers * T_FIELDS + T_STEPS];
    if (!*step_bytes && !(*step_bytes = calloc(steps, sizeof(double))))
        return train_fail(w, "allocating", TERSE_ERR_NOMEM);
    double *every = calloc(steps * (size_t)nranks, sizeof(double));
    if (!every) return train_fail(w, "allocating", TERSE_ERR_NOMEM);
    terse_status s = terse_allgather(w->comm, *step_bytes, steps * sizeof(double), every,
                                     steps * (size_t)nranks * sizeof(double), NULL);
    if (s != TERSE_OK) {
        free(every);
        return train_fail(w, "gathering the bytes of each step", s);
    }
    double total = 0;
    for (size_t k = 0; k < steps; k++) {
        for (int q = servers; q < nranks; q++) total += every[(size_t)q * steps + k]; /* uplink */
        (*step_bytes)[k] = total;
    }
    free(every);
    return 0;
}

static int run_one(worker *w, int index, int servers, int is_server) {
    const train_options *o = w->o;
    run_state r;
    memset(&r, 0, sizeof r);
    r.cfg = &o->runs[index];
    r.index = index;
    size_t chunk = o->batch > EVAL_CHUNK ? o->batch : EVAL_CHUNK;
    if (!(r.m = model_create(o->model, chunk, r.cfg->seed)))
        return train_fail(w, "creating the model", TERSE_ERR_NOMEM);
    int rc = 0;
    const int fed = o->mode == TRAIN_MODE_FEDAVG && r.cfg->fed_epochs > 0;
    if (!is_server) {
        rc = train_fed_shard(w, r.cfg); /* iid, as train_deal_shard, unless fedavg's alpha */
        if (rc == 0 && !(r.order = malloc(w->shard_n * sizeof *r.order)))
            rc = train_fail(w, "allocating the epoch order", TERSE_ERR_NOMEM);
        r.steps_total = fed ? o->rounds : w->steps_per_epoch * o->epochs;
    }
    /* fedavg: each round's (or the baseline's each step's) bytes sent */
    double *step_bytes = NULL;
    if (rc == 0 && !is_server && o->mode == TRAIN_MODE_FEDAVG &&
        !(step_bytes = calloc((size_t)r.steps_total, sizeof(double))))
        rc = train_fail(w, "allocating", TERSE_ERR_NOMEM);
    train_attacker *att = NULL;
    if (rc == 0 && !is_server && train_is_byzantine(w, r.cfg) &&
        !(att = train_attacker_create(w, r.cfg, r.m)))
        rc = train_fail(w, "allocating the attack", TERSE_ERR_NOMEM);
    for (size_t i = 0; rc == 0 && !is_server && r.cfg->local_momentum && i < model_tensor_count(r.m);
         i++)
        if (!(r.velocity[i] = calloc(model_tensor_at(r.m, i)->n, sizeof(float))))
            rc = train_fail(w, "allocating the momentum", TERSE_ERR_NOMEM);
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.num_servers = servers ? servers : 1;
    cfg.colocate = o->colocate;
    cfg.chunk_bytes = (size_t)o->ps_chunk_bytes;
    if (!cfg.chunk_bytes) { /* the model in about one chunk per server, at most 1 MiB:
                               the MLP fused is 0.8 MB, one default chunk on one server */
        size_t bytes = 0, S = (size_t)(o->colocate ? w->nworkers : (int)cfg.num_servers);
        for (size_t i = 0; i < model_tensor_count(r.m); i++)
            bytes += model_tensor_at(r.m, i)->n * sizeof(float);
        size_t c = ((bytes + S - 1) / S + 4095) / 4096 * 4096;
        cfg.chunk_bytes = c < 4096 ? 4096 : c > ((size_t)1 << 20) ? (size_t)1 << 20 : c;
    }
    cfg.update = TERSE_PS_UPDATE_SGD;
    cfg.lr = (float)(o->lr * r.cfg->lr_factor);
    cfg.momentum = r.cfg->local_momentum ? 0.0f : (float)o->momentum;
    cfg.aggregator = r.cfg->aggregator[0] ? r.cfg->aggregator : NULL;
    if (o->schedule == TRAIN_SCHED_COSINE && !fed) { /* as train_lr_at: the server's step k */
        cfg.lr_schedule = TERSE_PS_LR_COSINE;
        const long total = w->steps_per_epoch * o->epochs; /* servers too (train_ps_main) */
        cfg.lr_steps = (uint64_t)total;
        cfg.lr_warmup = (uint64_t)(o->warmup * (double)total);
    }
    char mode[64];
    snprintf(mode, sizeof mode, "%s", o->mode == TRAIN_MODE_FEDAVG ? "sync" : o->ps_mode);
    if (fed) { /* the new model is the clients' weighted average: x - mean(x - x_c) */
        train_fed_ps_mode(o, w->nworkers, mode, sizeof mode);
        cfg.lr = 1.0f;
        cfg.momentum = 0.0f;
    }
    terse_ps *ps = NULL;
    terse_status s = terse_ps_config_parse(mode, &cfg);
    if (s == TERSE_OK) s = terse_ps_create(w->comm, &cfg, &ps);
    if (s != TERSE_OK) rc = train_fail(w, "terse_ps_create", s);
    /* A dense run fuses the model into one key; a compressed one keeps a
     * key per tensor, each with its codec. */
    int dense = 1;
    for (size_t i = 0; i < model_tensor_count(r.m); i++) {
        const char *spec = train_spec_for(w, &r, model_tensor_at(r.m, i));
        if (spec && strcmp(spec, TRAIN_DENSE) != 0) dense = 0;
    }
    float *flat = NULL;
    if (rc == 0 && dense) {
        size_t total = model_param_count(r.m), off = 0;
        if (!(flat = malloc(total * sizeof(float)))) rc = train_fail(w, "allocating", TERSE_ERR_NOMEM);
        for (size_t i = 0; rc == 0 && i < model_tensor_count(r.m); i++) {
            const model_tensor *t = model_tensor_at(r.m, i);
            memcpy(flat + off, t->value, t->n * sizeof(float));
            off += t->n;
        }
        if (rc == 0) s = terse_ps_declare(ps, 0, total, NULL, NULL, flat);
        if (rc == 0 && s != TERSE_OK) rc = train_fail(w, "terse_ps_declare", s);
    }
    for (size_t i = 0; rc == 0 && !dense && i < model_tensor_count(r.m); i++) {
        model_tensor *t = model_tensor_at(r.m, i);
        const char *spec = train_spec_for(w, &r, t);
        if (spec && strcmp(spec, TRAIN_DENSE) == 0) spec = NULL;
        s = terse_ps_declare(ps, i, t->n, spec, NULL, t->value);
        if (s != TERSE_OK) rc = train_fail(w, "terse_ps_declare", s);
    }
    double mine[T_FIELDS] = {0};
    train_snapshots ss = {0};
    if (rc == 0 && is_server) {
        s = terse_ps_serve(ps);
        if (s != TERSE_OK) rc = train_fail(w, "terse_ps_serve", s);
    } else if (rc == 0) {
        rc = fed ? train_fed_client(w, ps, &r, &ss, mine, flat, step_bytes)
                 : worker_train(w, ps, &r, &ss, mine, flat, att, step_bytes);
        mine[T_STEPS] = (double)r.steps_total;
        s = terse_ps_finish(ps);
        if (s != TERSE_OK && rc == 0) rc = train_fail(w, "terse_ps_finish", s);
    }
    /* Serving has ended everywhere: collectives work again. */
    int nranks = terse_comm_size(w->comm);
    double *all = rc == 0 ? calloc((size_t)nranks * T_FIELDS, sizeof(double)) : NULL;
    if (rc == 0 && !all) rc = train_fail(w, "gathering", TERSE_ERR_NOMEM);
    if (rc == 0) {
        s = terse_allgather(w->comm, mine, sizeof mine, all, (size_t)nranks * sizeof mine, NULL);
        if (s != TERSE_OK) rc = train_fail(w, "gathering the tallies", s);
    }
    if (rc == 0 && o->mode == TRAIN_MODE_FEDAVG) rc = sum_step_bytes(w, servers, all, &step_bytes);
    if (rc == 0 && !is_server && w->rank == 0) {
        double max[T_FIELDS] = {0}, stale = 0, nonfinite = 0;
        for (int k = servers; k < nranks; k++)
            for (int f = 0; f < T_FIELDS; f++) {
                double v = all[k * T_FIELDS + f];
                if (v > max[f]) max[f] = v;
                if (f == T_STALE) stale += v;
                if (f == T_NONFINITE) nonfinite += v;
            }
        if (!o->quiet && stale > 0)
            fprintf(stderr, WHO ": %s: %.0f pushes were refused as late or stale and dropped\n",
                    mode, stale);
        if (!o->quiet && fed)
            fprintf(stderr, WHO ": %s: %.0f sampled clients dropped out of their round\n",
                    r.cfg->label, dropped_clients(all, servers, nranks));
        if (!o->quiet && nonfinite > 0)
            fprintf(stderr, WHO ": ps:%s %s: %.0f pushes held NaN or infinity (the model "
                            "diverged) and the server left them out\n",
                    o->ps_mode, r.cfg->label, nonfinite);
        rc = evaluate_snapshots(w, &r, &ss, max, step_bytes);
    }
    free(step_bytes);
    free(all);
    free(flat);
    for (size_t k = 0; k < ss.n; k++) free(ss.v[k].params);
    free(ss.v);
    terse_ps_free(ps);
    train_attacker_free(att);
    for (size_t i = 0; i < MODEL_MAX_TENSORS; i++) free(r.velocity[i]);
    model_free(r.m);
    free(r.order);
    return rc;
}

int train_ps_main(worker *w) {
    const train_options *o = w->o;
    /* colocated: no server ranks (every worker serves on its own endpoint) */
    int servers = o->colocate ? 0 : o->servers ? o->servers : 1;
    int grank = terse_comm_rank(w->comm), nranks = terse_comm_size(w->comm);
    int is_server = grank < servers;
    w->nworkers = nranks - servers;
    w->rank = is_server ? -1 - grank : grank - servers; /* servers: never worker 0 */
    int rc = 0;
    if (w->nworkers < 1) {
        fprintf(stderr, WHO ": %d ranks for %d servers: no workers\n", nranks, servers);
        rc = -1;
    }
    if (rc == 0 && !is_server) {
        rc = train_load_data(w);
        w->test_lo = 0; /* worker 0 evaluates the whole test set */
        w->test_hi = w->test.n;
    }
    if (rc == 0 && w->rank == 0 && o->results && !(w->results = fopen(o->results, "w"))) {
        fprintf(stderr, WHO ": cannot write %s\n", o->results);
        rc = -1;
    }
    /* and the servers learn the steps per epoch (their rate schedule's) */
    float agree[2] = {rc == 0 ? 0.0f : 1.0f, is_server ? 0.0f : (float)w->steps_per_epoch};
    terse_status s = terse_allreduce(w->comm, agree, 2, NULL, TERSE_OP_SUM);
    if (s != TERSE_OK || agree[0] != 0.0f) {
        if (s != TERSE_OK) train_fail(w, "agreeing to start", s);
        return -1;
    }
    if (is_server) w->steps_per_epoch = (long)(agree[1] / (float)w->nworkers);
    if (w->rank == 0 && !o->quiet && o->mode == TRAIN_MODE_FEDAVG)
        fprintf(stderr, WHO ": fedavg:%d with %d server%s and %d clients over %s, %d rounds\n",
                o->fed_epochs, servers, servers == 1 ? "" : "s", w->nworkers,
                terse_comm_provider(w->comm), o->rounds);
    else if (w->rank == 0 && !o->quiet)
        fprintf(stderr, WHO ": ps:%s with %d servers%s and %d workers over %s, %zu training "
                        "examples each, %ld steps per epoch\n",
                o->ps_mode, servers ? servers : w->nworkers, servers ? "" : " (colocated)",
                w->nworkers, terse_comm_provider(w->comm), w->shard_n,
                w->steps_per_epoch);
    for (size_t i = 0; i < o->n_runs && rc == 0; i++) rc = run_one(w, (int)i, servers, is_server);
    return rc;
}
