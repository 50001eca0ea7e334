/* terse-bench train, the worker role (train.h): load Fashion-MNIST, join the
 * job, and train every configuration of the options in turn, exchanging
 * gradients (or, in Local SGD, model changes) with terse_allreduce. Rank 0
 * records one line per evaluation. Public API only (include/terse.h). */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <terse.h>

#include "core/bench.h"
#include "train/train.h"
#include "train/train_worker.h"


int train_fail(const worker *w, const char *what, terse_status s) {
    fprintf(stderr, WHO ": rank %d: %s: %s (%s)\n", w->rank, what, terse_last_error(),
            terse_status_name(s));
    return -1;
}

/* ---------------------------------------------------------------- data */

int train_load_data(worker *w) {
    const train_options *o = w->o;
    char err[512];
    if (dataset_load(o->data_dir, "train", &w->train, err, sizeof err) != 0 ||
        dataset_load(o->data_dir, "t10k", &w->test, err, sizeof err) != 0) {
        fprintf(stderr, WHO ": rank %d: %s\n", w->rank, err);
        return -1;
    }
    if (w->train.rows * w->train.cols != MODEL_INPUTS ||
        w->test.rows * w->test.cols != MODEL_INPUTS) {
        fprintf(stderr, WHO ": rank %d: images are %zux%zu, the models take 28x28\n", w->rank,
                w->train.rows, w->train.cols);
        return -1;
    }
    size_t n = w->train.n;
    if (o->train_limit && o->train_limit < n) n = o->train_limit;
    size_t t = w->test.n;
    if (o->test_limit && o->test_limit < t) t = o->test_limit;
    w->test.n = t;
    size_t per = n / (size_t)w->nworkers; /* every worker runs the same step count */
    w->steps_per_epoch = (long)(per / o->batch);
    if (w->steps_per_epoch < 1) {
        fprintf(stderr, WHO ": %zu training examples over %d workers is fewer than one batch "
                        "of %zu each\n", n, w->nworkers, o->batch);
        return -1;
    }
    w->perm = malloc(n * sizeof *w->perm);
    w->shard = malloc(per * sizeof *w->shard);
    size_t chunk = o->batch > EVAL_CHUNK ? o->batch : EVAL_CHUNK;
    w->x = bench_alloc(chunk * MODEL_INPUTS * sizeof(float));
    w->y = malloc(chunk);
    if (!w->perm || !w->shard || !w->x || !w->y) {
        fprintf(stderr, WHO ": rank %d: out of memory\n", w->rank);
        return -1;
    }
    w->shard_n = w->shard_cap = per;
    w->n_used = n;
    w->test_lo = t * (size_t)w->rank / (size_t)w->nworkers;
    w->test_hi = t * (size_t)(w->rank + 1) / (size_t)w->nworkers;
    return 0;
}

void train_fill_batch(worker *w, const dataset *d, const size_t *idx, size_t first, size_t b) {
    const float scale = 1.0f / 255.0f;
    for (size_t j = 0; j < b; j++) {
        size_t e = idx ? idx[first + j] : first + j;
        const uint8_t *px = d->pixels + e * MODEL_INPUTS;
        float *xr = w->x + j * MODEL_INPUTS;
        for (size_t p = 0; p < MODEL_INPUTS; p++) xr[p] = (float)px[p] * scale;
        w->y[j] = d->labels[e];
    }
}

/* ---------------------------------------------------------------- a run */

/* The codec spec for tensor t: --codec-for, else NULL (the small bucket)
 * below --small elements, else the run's. */
const char *train_spec_for(const worker *w, const run_state *r, const model_tensor *t) {
    const char *spec = train_override_for(w->o, t->name);
    if (spec) return spec;
    if (t->n < (size_t)w->o->small) return NULL; /* the small bucket */
    return r->cfg->codec;
}

static void run_free(run_state *r) {
    for (size_t i = 0; i < MODEL_MAX_TENSORS; i++) {
        if (r->mild[i]) { /* codec[i] is one of the two */
            terse_codec_free(r->mild[i]);
            terse_codec_free(r->aggressive[i]);
        } else {
            terse_codec_free(r->codec[i]);
        }
        free(r->accum[i]);
        free(r->velocity[i]);
        free(r->anchor[i]);
    }
    terse_codec_free(r->bucket_codec);
    free(r->fused);
    free(r->order);
    model_free(r->m);
    memset(r, 0, sizeof *r);
}

/* A codec for spec, its random streams keyed by the run's seed (unless the
 * spec names one), the tensor id and this rank. */
static terse_status make_codec(const worker *w, const run_state *r, const char *spec,
                               size_t rows, size_t cols, uint64_t tensor, terse_codec **out) {
    terse_status s = terse_codec_create(spec, rows, cols, out);
    if (s != TERSE_OK) return s;
    terse_codec_traits tr;
    memset(&tr, 0, sizeof tr);
    tr.size = sizeof tr;
    s = terse_codec_get_traits(*out, &tr);
    if (s == TERSE_OK && tr.randomized && !strstr(spec, "seed=")) {
        char seeded[512];
        int len = snprintf(seeded, sizeof seeded, "%s%sseed=%llu", spec,
                           strchr(spec, ':') ? "," : ":", (unsigned long long)r->cfg->seed);
        terse_codec_free(*out);
        *out = NULL;
        if (len < 0 || (size_t)len >= sizeof seeded)
            return TERSE_ERR_INVALID; /* the launcher refuses specs this long */
        s = terse_codec_create(seeded, rows, cols, out);
    }
    if (s == TERSE_OK) s = terse_codec_set_stream(*out, tensor, (uint32_t)w->rank);
    return s;
}

/* 1 if c is topk or randk with error feedback (what --mask-momentum masks). */
static int is_sparsifier(const terse_codec *c) {
    terse_codec_traits tr;
    memset(&tr, 0, sizeof tr);
    tr.size = sizeof tr;
    return terse_codec_get_traits(c, &tr) == TERSE_OK && tr.error_feedback &&
           (strcmp(tr.name, "topk") == 0 || strcmp(tr.name, "randk") == 0);
}

/* Shards: a permutation of the first n examples keyed by the run's seed,
 * dealt round-robin. */
void train_deal_shard(worker *w, uint64_t seed) {
    size_t n = w->n_used;
    for (size_t i = 0; i < n; i++) w->perm[i] = i;
    train_shuffle(w->perm, n, train_stream_key(seed, 0x5ba4d, 0));
    for (size_t i = 0; i < w->shard_n; i++)
        w->shard[i] = w->perm[i * (size_t)w->nworkers + (size_t)w->rank];
}

static int run_setup(worker *w, run_state *r, int index) {
    const train_options *o = w->o;
    memset(r, 0, sizeof *r);
    r->cfg = &o->runs[index];
    r->index = index;
    train_deal_shard(w, r->cfg->seed);
    size_t chunk = o->batch > EVAL_CHUNK ? o->batch : EVAL_CHUNK;
    r->m = model_create(o->model, chunk, r->cfg->seed);
    if (!r->m) return train_fail(w, "creating the model", TERSE_ERR_NOMEM);
    r->nt = model_tensor_count(r->m);
    int bucket_dense = strcmp(r->cfg->small_codec, TRAIN_DENSE) == 0;
    for (size_t i = 0; i < r->nt; i++) {
        model_tensor *t = model_tensor_at(r->m, i);
        const char *spec = train_spec_for(w, r, t);
        int dense = spec && strcmp(spec, TRAIN_DENSE) == 0;
        if (!spec || (dense && bucket_dense)) {
            r->in_bucket[i] = 1;
            r->fused_n += t->n;
        } else if (!dense) {
            terse_status s = make_codec(w, r, spec, t->rows, t->cols, i, &r->codec[i]);
            if (s != TERSE_OK) return train_fail(w, spec, s);
            if (r->cfg->adapt && spec == r->cfg->codec) {
                /* Accordion: starts mild (the first interval is critical). */
                r->mild[i] = r->codec[i];
                s = make_codec(w, r, r->cfg->adapt_high, t->rows, t->cols,
                               i + MODEL_MAX_TENSORS + 1, &r->aggressive[i]);
                if (s != TERSE_OK) return train_fail(w, r->cfg->adapt_high, s);
                if (!(r->accum[i] = calloc(t->n, sizeof(float))))
                    return train_fail(w, "allocating Accordion's sums", TERSE_ERR_NOMEM);
            }
            r->sparsifier[i] = is_sparsifier(r->codec[i]);
        }
        r->velocity[i] = calloc(t->n, sizeof(float));
        if (!r->velocity[i]) return train_fail(w, "allocating momentum", TERSE_ERR_NOMEM);
        if (r->cfg->local_steps) {
            r->anchor[i] = malloc(t->n * sizeof(float));
            if (!r->anchor[i]) return train_fail(w, "allocating the anchor", TERSE_ERR_NOMEM);
            memcpy(r->anchor[i], t->value, t->n * sizeof(float));
        }
    }
    if (r->fused_n) {
        if (!(r->fused = malloc(r->fused_n * sizeof(float))))
            return train_fail(w, "allocating the small-tensor bucket", TERSE_ERR_NOMEM);
        if (!bucket_dense) {
            terse_status s = make_codec(w, r, r->cfg->small_codec, r->fused_n, 1,
                                        MODEL_MAX_TENSORS, &r->bucket_codec);
            if (s != TERSE_OK) return train_fail(w, r->cfg->small_codec, s);
        }
    }
    if (!(r->order = malloc(w->shard_n * sizeof *r->order)))
        return train_fail(w, "allocating the epoch order", TERSE_ERR_NOMEM);
    r->steps_total = w->steps_per_epoch * o->epochs;
    r->adapt_every = r->cfg->adapt_every ? r->cfg->adapt_every
                                         : (r->steps_total >= 10 ? r->steps_total / 10 : 1);
    r->dp_stream = train_stream_key(r->cfg->seed, 0xd9, (uint64_t)w->rank);
    return 0;
}

/* Clip the update held in every tensor's grad to L2 norm C and add noise. */
static void privatize(const worker *w, run_state *r) {
    double sq = 0;
    for (size_t i = 0; i < r->nt; i++) {
        const model_tensor *t = model_tensor_at(r->m, i);
        for (size_t j = 0; j < t->n; j++) sq += (double)t->grad[j] * t->grad[j];
    }
    double norm = sqrt(sq), c = w->o->dp_clip;
    float f = norm > c ? (float)(c / norm) : 1.0f;
    for (size_t i = 0; i < r->nt; i++) {
        model_tensor *t = model_tensor_at(r->m, i);
        if (f != 1.0f)
            for (size_t j = 0; j < t->n; j++) t->grad[j] *= f;
        if (w->o->dp_noise > 0) train_add_gaussian(t->grad, t->n, w->o->dp_noise * c, &r->dp_stream);
    }
}

/* Average every tensor's grad over the workers: one call per tensor with its
 * own codec (or dense), one for the bucket of small tensors packed together
 * (as DDP buckets them). Counts bytes and time. */
static int exchange(worker *w, run_state *r) {
    terse_comm_stats s0 = TERSE_COMM_STATS_INIT, s1 = TERSE_COMM_STATS_INIT;
    terse_status s = terse_comm_get_stats(w->comm, &s0);
    if (s != TERSE_OK) return train_fail(w, "reading statistics", s);
    for (size_t i = 0; i < r->nt; i++) {
        if (r->in_bucket[i]) continue;
        model_tensor *t = model_tensor_at(r->m, i);
        if (r->handover[i]) {
            /* Accordion switched codecs: what the old one still owed
             * travels now, with the new one, and nothing is lost. */
            const float *e = terse_codec_residual(r->handover[i]);
            if (e)
                for (size_t j = 0; j < t->n; j++) t->grad[j] += e[j];
            terse_codec_reset_residual(r->handover[i]);
            r->handover[i] = NULL;
        }
        s = terse_allreduce(w->comm, t->grad, t->n, r->codec[i], TERSE_OP_AVG);
        if (s != TERSE_OK) return train_fail(w, "allreduce", s);
    }
    if (r->fused_n) {
        size_t off = 0;
        for (size_t i = 0; i < r->nt; i++) {
            model_tensor *t = model_tensor_at(r->m, i);
            if (!r->in_bucket[i]) continue;
            memcpy(r->fused + off, t->grad, t->n * sizeof(float));
            off += t->n;
        }
        s = terse_allreduce(w->comm, r->fused, r->fused_n, r->bucket_codec, TERSE_OP_AVG);
        if (s != TERSE_OK) return train_fail(w, "allreduce (small-tensor bucket)", s);
        off = 0;
        for (size_t i = 0; i < r->nt; i++) {
            model_tensor *t = model_tensor_at(r->m, i);
            if (!r->in_bucket[i]) continue;
            memcpy(t->grad, r->fused + off, t->n * sizeof(float));
            off += t->n;
        }
    }
    s = terse_comm_get_stats(w->comm, &s1);
    if (s != TERSE_OK) return train_fail(w, "reading statistics", s);
    r->t.bytes += (double)(s1.wire_bytes_sent - s0.wire_bytes_sent);
    r->t.codec_s += s1.codec_seconds - s0.codec_seconds;
    r->t.network_s += s1.network_seconds - s0.network_seconds;
    r->exchanges++;
    return 0;
}

/* v = m v + g; w -= lr v, for every tensor (PyTorch's SGD with momentum). */
static void sgd_update(const train_options *o, run_state *r) {
    const float lr = (float)r->lr, mu = (float)o->momentum;
    for (size_t i = 0; i < r->nt; i++) {
        model_tensor *t = model_tensor_at(r->m, i);
        float *v = r->velocity[i], *p = t->value;
        const float *g = t->grad;
        for (size_t j = 0; j < t->n; j++) {
            v[j] = mu * v[j] + g[j];
            p[j] -= lr * v[j];
        }
    }
}

/* Momentum before the exchange: v = m v + g, and v is what travels. */
static void local_momentum(const train_options *o, run_state *r) {
    const float mu = (float)o->momentum;
    for (size_t i = 0; i < r->nt; i++) {
        model_tensor *t = model_tensor_at(r->m, i);
        float *v = r->velocity[i], *g = t->grad;
        for (size_t j = 0; j < t->n; j++) g[j] = v[j] = mu * v[j] + g[j];
    }
}

/* DGC's momentum factor masking (Lin et al., "Deep Gradient Compression",
 * ICLR 2018): a coordinate this worker has just sent starts its momentum
 * afresh, so a sparsifier does not send the same stale velocity again. The
 * codec's residual is exactly 0 where a sparsifier sent (its values travel
 * bit-exact). Only topk and randk tensors with error feedback are masked;
 * others (the small bucket, dense tensors, other codecs) are left alone. */
static void mask_momentum(run_state *r) {
    for (size_t i = 0; i < r->nt; i++) {
        if (!r->sparsifier[i]) continue;
        const float *e = terse_codec_residual(r->codec[i]);
        if (!e) continue;
        float *v = r->velocity[i];
        size_t n = model_tensor_at(r->m, i)->n;
        for (size_t j = 0; j < n; j++)
            if (e[j] == 0.0f) v[j] = 0.0f;
    }
}

/* w -= lr d, where d (in grad) is the averaged direction. */
static void apply_direction(run_state *r) {
    const float lr = (float)r->lr;
    for (size_t i = 0; i < r->nt; i++) {
        model_tensor *t = model_tensor_at(r->m, i);
        float *p = t->value;
        const float *d = t->grad;
        for (size_t j = 0; j < t->n; j++) p[j] -= lr * d[j];
    }
}

/* Local SGD's average: what travels is each tensor's change since the last
 * average (in grad), so a codec compresses a difference, as it would a
 * gradient; the model becomes anchor + mean change. */
static int local_average(worker *w, run_state *r) {
    for (size_t i = 0; i < r->nt; i++) {
        model_tensor *t = model_tensor_at(r->m, i);
        for (size_t j = 0; j < t->n; j++) t->grad[j] = t->value[j] - r->anchor[i][j];
    }
    if (w->o->dp) privatize(w, r);
    if (exchange(w, r) != 0) return -1;
    for (size_t i = 0; i < r->nt; i++) {
        model_tensor *t = model_tensor_at(r->m, i);
        for (size_t j = 0; j < t->n; j++) t->value[j] = r->anchor[i][j] + t->grad[j];
        memcpy(r->anchor[i], t->value, t->n * sizeof(float));
    }
    r->unsynced = 0;
    return 0;
}

/* --straggler W:F: worker W's compute since t0 takes F times as long, and
 * --transient P:F: any worker's, with probability P at each step (it
 * sleeps the difference: a slow machine, not a busy one). */
void train_straggle(const worker *w, double t0, uint64_t seed, long step) {
    double f = w->rank == w->o->straggler ? w->o->straggler_factor : 1.0;
    if (w->o->transient_p > 0) { /* --transient P:F: this step's draw */
        uint64_t k = train_stream_key(seed ^ 0x7472616e7369656eull, (uint64_t)step,
                                      (uint64_t)w->rank + 1);
        if ((double)(k >> 11) * 0x1.0p-53 < w->o->transient_p) f *= w->o->transient_factor;
    }
    if (f <= 1.0) return;
    double extra = (f - 1.0) * (bench_now() - t0);
    if (extra > 0) {
        struct timespec ts = {(time_t)extra, (long)((extra - (double)(time_t)extra) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* Accordion (Agarwal et al., "Accordion: Adaptive Gradient Communication
 * via Critical Learning Regime Identification", MLSys 2021), after an
 * exchange: sum each adaptive tensor's averaged gradient, and every
 * adapt_every steps compare the sum's norm with the previous interval's. A
 * relative change of at least eta marks a critical regime: the mild codec
 * for the next interval; otherwise the aggressive one. The first decision
 * has nothing to compare with and counts as critical, so the first two
 * intervals are mild. The sums come from
 * all-reduced gradients, and rank 0 broadcasts its norms too, so every
 * rank takes the same decision whatever its arithmetic. */
static int adapt(worker *w, run_state *r) {
    float norm[MODEL_MAX_TENSORS] = {0};
    int any = 0;
    for (size_t i = 0; i < r->nt; i++) {
        if (!r->mild[i]) continue;
        /* The step counts as mild by the first adaptive tensor's codec. */
        if (!any && r->codec[i] == r->mild[i]) r->mild_steps++;
        any = 1;
        float *a = r->accum[i];
        const float *g = model_tensor_at(r->m, i)->grad;
        size_t n = model_tensor_at(r->m, i)->n;
        for (size_t j = 0; j < n; j++) a[j] += g[j];
    }
    if (!any || (r->step + 1) % r->adapt_every != 0) return 0;
    for (size_t i = 0; i < r->nt; i++) {
        if (!r->mild[i]) continue;
        double sq = 0;
        size_t n = model_tensor_at(r->m, i)->n;
        for (size_t j = 0; j < n; j++) sq += (double)r->accum[i][j] * r->accum[i][j];
        norm[i] = (float)sqrt(sq);
        memset(r->accum[i], 0, n * sizeof(float));
    }
    /* The broadcast's bytes count as the run's, like the exchanges'. */
    terse_comm_stats s0 = TERSE_COMM_STATS_INIT, s1 = TERSE_COMM_STATS_INIT;
    terse_status s = terse_comm_get_stats(w->comm, &s0);
    if (s == TERSE_OK) s = terse_broadcast(w->comm, norm, r->nt * sizeof *norm, 0);
    if (s == TERSE_OK) s = terse_comm_get_stats(w->comm, &s1);
    if (s != TERSE_OK) return train_fail(w, "agreeing on Accordion's norms", s);
    r->t.bytes += (double)(s1.wire_bytes_sent - s0.wire_bytes_sent);
    int logged = 0;
    for (size_t i = 0; i < r->nt; i++) {
        if (!r->mild[i]) continue;
        size_t len = strlen(r->adapt_log);
        if (!logged++ && len + 1 < sizeof r->adapt_log) {
            r->adapt_log[len] = r->codec[i] == r->mild[i] ? 'M' : 'a';
            r->adapt_log[len + 1] = '\0';
        }
        double prev = r->prev_norm[i], now = norm[i];
        int critical = prev <= 0 || fabs(now - prev) / prev >= r->cfg->adapt_eta;
        r->prev_norm[i] = now;
        terse_codec *next = critical ? r->mild[i] : r->aggressive[i];
        if (next != r->codec[i]) {
            r->handover[i] = r->codec[i];
            r->codec[i] = next;
            r->sparsifier[i] = is_sparsifier(next);
        }
    }
    return 0;
}

/* One step: forward/backward on the next batch, then exchange and update. */
static int train_step(worker *w, run_state *r, const size_t *order, long k) {
    const train_options *o = w->o;
    double t0 = bench_now();
    r->lr = train_lr_at(o, r->step, r->steps_total);
    train_fill_batch(w, &w->train, order, (size_t)k * o->batch, o->batch);
    double loss = model_forward_backward(r->m, w->x, w->y, o->batch);
    train_straggle(w, t0, r->cfg->seed, r->step);
    r->t.loss_sum += loss;
    r->t.loss_count += 1;
    if (!r->cfg->local_steps) {
        if (o->dp) privatize(w, r);
        if (r->cfg->local_momentum) local_momentum(o, r);
        double t1 = bench_now();
        r->t.compute_s += t1 - t0;
        if (exchange(w, r) != 0) return -1;
        double t2 = bench_now();
        if (r->cfg->mask_momentum) mask_momentum(r);
        if (r->cfg->local_momentum)
            apply_direction(r);
        else
            sgd_update(o, r);
        /* After the masking, which reads the residual of the codec that just
         * sent; the update leaves the averaged gradient in grad. */
        if (r->cfg->adapt && adapt(w, r) != 0) return -1;
        double t3 = bench_now();
        r->t.compute_s += t3 - t2;
        r->t.wall_s += t3 - t0;
    } else {
        sgd_update(o, r);
        r->unsynced++;
        double t1 = bench_now();
        r->t.compute_s += t1 - t0;
        r->t.wall_s += t1 - t0;
        if (r->unsynced == r->cfg->local_steps) {
            if (local_average(w, r) != 0) return -1;
            r->t.wall_s += bench_now() - t1;
        }
    }
    r->step++;
    return 0;
}

/* ---------------------------------------------------------------- evaluation */

/* Rank 0 keeps a record: into --results (flushed, so a launcher reading
 * after a failure still has every finished evaluation), or in memory. */
int train_keep_record(worker *w, const train_record *rec) {
    if (w->results) {
        train_record_write(w->results, rec);
        if (fflush(w->results) != 0 || ferror(w->results)) {
            fprintf(stderr, WHO ": rank 0: cannot write %s\n", w->o->results);
            return -1;
        }
        return 0;
    }
    if (w->n_kept == w->cap_kept) {
        int cap = w->cap_kept ? 2 * w->cap_kept : 64;
        train_record *k = realloc(w->kept, (size_t)cap * sizeof *k);
        if (!k) {
            fprintf(stderr, WHO ": rank 0: out of memory keeping records\n");
            return -1;
        }
        w->kept = k;
        w->cap_kept = cap;
    }
    w->kept[w->n_kept++] = *rec;
    return 0;
}

enum { G_CORRECT, G_LOSS, G_TRAIN_LOSS, G_TRAIN_COUNT, G_BYTES, G_COMPUTE, G_CODEC, G_NET,
       G_WALL, G_FIELDS };

void train_record_begin(train_record *rec, const run_state *r, int final, int epoch, long step) {
    memset(rec, 0, sizeof *rec);
    rec->run = r->index;
    rec->group = r->cfg->group;
    rec->seed = r->cfg->seed;
    rec->final = final;
    rec->epoch = epoch;
    rec->step = step;
    rec->steps_total = r->steps_total;
    snprintf(rec->codec, sizeof rec->codec, "%s", r->cfg->codec);
    rec->ef = r->cfg->ef;
}

static int evaluate(worker *w, run_state *r, int epoch, int final) {
    double mine[G_FIELDS] = {0};
    size_t correct = 0;
    double loss = 0;
    for (size_t lo = w->test_lo; lo < w->test_hi; lo += EVAL_CHUNK) {
        size_t b = w->test_hi - lo < EVAL_CHUNK ? w->test_hi - lo : EVAL_CHUNK, c = 0;
        train_fill_batch(w, &w->test, NULL, lo, b);
        loss += model_evaluate(r->m, w->x, w->y, b, &c) * (double)b;
        correct += c;
    }
    mine[G_CORRECT] = (double)correct;
    mine[G_LOSS] = loss;
    mine[G_TRAIN_LOSS] = r->t.loss_sum;
    mine[G_TRAIN_COUNT] = r->t.loss_count;
    mine[G_BYTES] = r->t.bytes;
    mine[G_COMPUTE] = r->t.compute_s;
    mine[G_CODEC] = r->t.codec_s;
    mine[G_NET] = r->t.network_s;
    mine[G_WALL] = r->t.wall_s;
    r->t.loss_sum = r->t.loss_count = 0;

    double *all = w->gathered;
    terse_status s = terse_allgather(w->comm, mine, sizeof mine, all,
                                     (size_t)w->nworkers * sizeof mine, NULL);
    if (s != TERSE_OK) return train_fail(w, "gathering evaluation results", s);
    if (w->rank == 0) {
        double sum[G_FIELDS] = {0}, max[G_FIELDS] = {0};
        for (int k = 0; k < w->nworkers; k++)
            for (int f = 0; f < G_FIELDS; f++) {
                double v = all[k * G_FIELDS + f];
                sum[f] += v;
                if (v > max[f]) max[f] = v;
            }
        train_record rec;
        train_record_begin(&rec, r, final, epoch, r->step);
        rec.test_acc = 100.0 * sum[G_CORRECT] / (double)w->test.n;
        rec.test_loss = sum[G_LOSS] / (double)w->test.n;
        rec.train_loss = sum[G_TRAIN_COUNT] > 0 ? sum[G_TRAIN_LOSS] / sum[G_TRAIN_COUNT] : NAN;
        rec.bytes_sent = max[G_BYTES];
        /* A ring allreduce sends 2(N-1)/N of the buffer from every rank. */
        rec.dense_bytes = 4.0 * (double)model_param_count(r->m) * (double)r->step * 2.0 *
                          (double)(w->nworkers - 1) / (double)w->nworkers;
        rec.compute_s = max[G_COMPUTE];
        rec.codec_s = max[G_CODEC];
        rec.network_s = max[G_NET];
        rec.wall_s = max[G_WALL];
        snprintf(rec.label, sizeof rec.label, "%s", r->cfg->label);
        if (!w->o->quiet)
            fprintf(stderr, WHO ": [%d/%zu] %s%s: epoch %d, step %ld/%ld: test %.2f%%, "
                            "loss %.4f, %.0f bytes sent, %.1f s\n",
                    r->index + 1, w->o->n_runs, r->cfg->label, r->cfg->ef ? " +EF" : "", epoch,
                    r->step, r->steps_total, rec.test_acc, rec.train_loss, rec.bytes_sent,
                    rec.wall_s);
        w->last_progress = bench_now();
        if (train_keep_record(w, &rec) != 0) return -1;
    }
    return 0;
}

static void progress(worker *w, const run_state *r, int epoch) {
    if (w->rank != 0 || w->o->quiet) return;
    double now = bench_now();
    if (now - w->last_progress < PROGRESS_SECONDS) return;
    w->last_progress = now;
    fprintf(stderr, WHO ": [%d/%zu] %s%s: epoch %d, step %ld/%ld\n", r->index + 1, w->o->n_runs,
            r->cfg->label, r->cfg->ef ? " +EF" : "", epoch, r->step, r->steps_total);
}

static int train_run_one(worker *w, int index) {
    const train_options *o = w->o;
    run_state r;
    int rc = run_setup(w, &r, index);
    /* Every worker says whether it is ready, so one failing setup never
     * leaves the others inside a collective. */
    float not_ready = rc == 0 ? 0.0f : 1.0f;
    terse_status s = terse_allreduce(w->comm, &not_ready, 1, NULL, TERSE_OP_SUM);
    if (s != TERSE_OK || not_ready != 0.0f) {
        if (s != TERSE_OK) train_fail(w, "agreeing to start", s);
        run_free(&r);
        return -1;
    }
    size_t *order = r.order;
    for (int e = 1; e <= o->epochs && rc == 0; e++) {
        memcpy(order, w->shard, w->shard_n * sizeof *order);
        train_shuffle(order, w->shard_n,
                train_stream_key(r.cfg->seed, (uint64_t)e, (uint64_t)w->rank + 1));
        int eval_due = 0;
        for (long k = 0; k < w->steps_per_epoch && rc == 0; k++) {
            rc = train_step(w, &r, order, k);
            if (rc != 0) break;
            if (o->eval_every && r.step % o->eval_every == 0) eval_due = 1;
            if (eval_due && r.unsynced == 0 && k + 1 < w->steps_per_epoch) {
                rc = evaluate(w, &r, e, 0);
                eval_due = 0;
            }
            progress(w, &r, e);
        }
        if (rc == 0 && r.unsynced > 0) {
            double t0 = bench_now();
            rc = local_average(w, &r);
            r.t.wall_s += bench_now() - t0;
        }
        if (rc == 0) rc = evaluate(w, &r, e, e == o->epochs);
    }
    if (rc == 0 && r.cfg->adapt && w->rank == 0 && !o->quiet)
        fprintf(stderr, WHO ": [%d/%zu] accordion: the first adaptive tensor was mild on %ld "
                        "of %ld steps; per interval of %ld steps: %s (M mild, a aggressive)\n",
                r.index + 1, o->n_runs, r.mild_steps, r.step, r.adapt_every, r.adapt_log);
    run_free(&r);
    return rc;
}

/* ---------------------------------------------------------------- main */

int train_worker_main(const train_options *o) {
    static worker w;
    memset(&w, 0, sizeof w);
    w.o = o;
    /* Single-threaded BLAS: deterministic results, and N workers share the
     * cores without oversubscribing them. */
    openblas_set_num_threads(1);
    terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
    terse_status s = terse_comm_init(&cfg, &w.comm);
    if (s != TERSE_OK) {
        fprintf(stderr, WHO ": joining the job: %s (%s)\n", terse_last_error(),
                terse_status_name(s));
        return BENCH_EXIT_RUNTIME;
    }
    int rc = 0;
    if (o->mode == TRAIN_MODE_PS || o->mode == TRAIN_MODE_FEDAVG) {
        rc = train_ps_main(&w);
    } else {
        w.rank = terse_comm_rank(w.comm);
        w.nworkers = terse_comm_size(w.comm);
        rc = train_load_data(&w);
        if (rc == 0 && !(w.gathered = calloc((size_t)w.nworkers * G_FIELDS, sizeof(double)))) {
            fprintf(stderr, WHO ": rank %d: out of memory\n", w.rank);
            rc = -1;
        }
        if (rc == 0 && w.rank == 0 && o->results && !(w.results = fopen(o->results, "w"))) {
            fprintf(stderr, WHO ": rank 0: cannot write %s: %s\n", o->results, strerror(errno));
            rc = -1;
        }
        /* Agree that every worker is ready (data, memory, the results file)
         * before training starts, so none fails alone inside a collective. */
        float bad = rc == 0 ? 0.0f : 1.0f;
        s = terse_allreduce(w.comm, &bad, 1, NULL, TERSE_OP_SUM);
        if (s != TERSE_OK || bad != 0.0f) {
            if (s != TERSE_OK) train_fail(&w, "agreeing to start", s);
            rc = -1;
        }
        if (rc == 0 && w.rank == 0 && !o->quiet)
            fprintf(stderr, WHO ": %d workers over %s, %zu training examples each, %ld steps "
                            "per epoch, %zu test examples\n",
                    w.nworkers, terse_comm_provider(w.comm), w.shard_n, w.steps_per_epoch,
                    w.test.n);
        for (size_t i = 0; i < o->n_runs && rc == 0; i++) rc = train_run_one(&w, (int)i);
    }
    if (w.results && fclose(w.results) != 0) rc = -1;
    if (rc == 0 && w.rank == 0 && !o->results) train_report(o, w.kept, w.n_kept);
    free(w.kept);
    free(w.gathered);
    terse_comm_free(w.comm);
    dataset_free(&w.train);
    dataset_free(&w.test);
    free(w.shard);
    free(w.perm);
    free(w.x);
    free(w.y);
    return rc == 0 ? BENCH_EXIT_OK : BENCH_EXIT_RUNTIME;
}
