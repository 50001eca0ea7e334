/* train_worker.h -- what the two worker roles of `terse-bench train` share:
 * train_worker.c (allreduce and Local SGD) and train_ps.c (a parameter
 * server). Internal to bench/. */
#ifndef TERSE_BENCH_TRAIN_WORKER_H
#define TERSE_BENCH_TRAIN_WORKER_H

#include <stdio.h>

#include <terse.h>

#include "train/train.h"

#define WHO "terse-bench train"
#define EVAL_CHUNK 1000
/* Seconds between progress lines on stderr. */
#define PROGRESS_SECONDS 2.0

/* ---------------------------------------------------------------- state */

typedef struct {
    const train_options *o;
    terse_comm *comm;
    int rank, nworkers;
    dataset train, test;
    size_t *shard, shard_n; /* this worker's training examples */
    size_t shard_cap;       /* entries shard has room for */
    size_t *perm, n_used;   /* scratch for dealing shards; examples in use */
    long steps_per_epoch;
    size_t test_lo, test_hi; /* this worker's slice of the test set */
    float *x;
    uint8_t *y;
    FILE *results;
    train_record *kept; /* rank 0 without --results: printed at the end */
    int n_kept, cap_kept;
    double *gathered;   /* nworkers x G_FIELDS, for evaluate() */
    double last_progress;
} worker;

/* What one worker has done so far in one run (sums; rank 0 gathers). */
typedef struct {
    double bytes, compute_s, codec_s, network_s, wall_s;
    double loss_sum, loss_count; /* training loss since the last record */
} tally;

typedef struct {
    const train_run *cfg;
    int index;
    model *m;
    size_t nt;
    terse_codec *codec[MODEL_MAX_TENSORS]; /* NULL: dense, unless in_bucket */
    int in_bucket[MODEL_MAX_TENSORS];       /* packed into the bucket */
    int sparsifier[MODEL_MAX_TENSORS];      /* topk or randk with ef=1 */
    terse_codec *bucket_codec;              /* NULL: the bucket travels dense */
    /* Accordion (train_run.adapt): codec[i] is the active one of mild[i]
     * and aggressive[i]; handover[i], the codec just left, whose residual the
     * next exchange adds to the gradient; accum[i], the averaged gradient
     * summed since the last decision; prev_norm[i], its norm at that one. */
    terse_codec *mild[MODEL_MAX_TENSORS], *aggressive[MODEL_MAX_TENSORS];
    terse_codec *handover[MODEL_MAX_TENSORS];
    float *accum[MODEL_MAX_TENSORS];
    double prev_norm[MODEL_MAX_TENSORS];
    long mild_steps, adapt_every; /* steps the first adaptive tensor spent mild */
    char adapt_log[128];          /* its codec per interval: M mild, a aggressive */
    float *velocity[MODEL_MAX_TENSORS];
    float *anchor[MODEL_MAX_TENSORS]; /* Local SGD: the model at the last average */
    float *fused;                     /* the bucket: small (or dense) tensors, packed */
    size_t fused_n;
    size_t *order; /* this epoch's order of the shard */
    long exchanges, step, steps_total, unsynced;
    double lr; /* this step's learning rate (train_lr_at) */
    uint64_t dp_stream;
    tally t;
} run_state;

int train_fail(const worker *w, const char *what, terse_status s);

/* Byzantine workers (train_attack.c) */
typedef struct train_attacker train_attacker;
int train_is_byzantine(const worker *w, const train_run *cfg);
void train_flip_labels(uint8_t *y, size_t b);
train_attacker *train_attacker_create(worker *w, const train_run *cfg, model *m);
void train_attacker_free(train_attacker *a);
void train_attack_apply(worker *w, const train_run *cfg, train_attacker *a, model *m, int e,
                        long k);
int train_load_data(worker *w);
void train_fill_batch(worker *w, const dataset *d, const size_t *idx, size_t first, size_t b);
const char *train_spec_for(const worker *w, const run_state *r, const model_tensor *t);
void train_deal_shard(worker *w, uint64_t seed);
int train_keep_record(worker *w, const train_record *rec);
/* Zero *rec and fill what names it: run, group, seed, codec, ef, final,
 * epoch, step and steps_total (the caller fills the measurements). */
void train_record_begin(train_record *rec, const run_state *r, int final, int epoch, long step);
void train_straggle(const worker *w, double t0, uint64_t seed, long step);
/* The parameter-server role (train_ps.c): every rank of a --mode ps or
 * fedavg job. */
int train_ps_main(worker *w);

/* What a worker of a ps or fedavg run adds up (train_ps.c, train_fed.c). */
enum {
    T_BYTES, T_COMPUTE, T_CODEC, T_NET, T_WALL, T_STALE, T_NONFINITE, T_DROPPED, T_STEPS, T_FIELDS
};

/* Worker 0's copies of the parameters it pulled, evaluated after training
 * (train_ps.c). */
typedef struct {
    long step;
    int epoch;
    double wall_s, bytes, loss_sum, loss_count;
    float *params; /* every tensor, concatenated */
} train_snapshot;

typedef struct {
    train_snapshot *v;
    size_t n, cap;
} train_snapshots;

int train_snap(worker *w, train_snapshots *ss, model *m, long step, int epoch, double wall,
               double bytes, double *loss_sum, double *loss_count);
double train_wire_sent(const worker *w);
/* The bytes, codec and network seconds since s0, and the wall time since
 * start, into sums. */
void train_ps_tally(const worker *w, const terse_comm_stats *s0, double start, double *sums);
/* Pull every tensor (flat: the one fused key of a dense run, else NULL). */
int train_ps_pull_all(worker *w, terse_ps *ps, model *m, float *flat, const char *what);

/* fedavg (train_fed.c). This client's shard (iid, or Dirichlet over labels
 * with cfg->alpha), into w->shard; every process computes every client's
 * part alike. -1 (said why) if a client would get less than one batch. */
int train_fed_shard(worker *w, const train_run *cfg);
/* The server's mode for a fedavg run: sync with a quorum of the clients
 * sampled each round, and the round's deadline. */
void train_fed_ps_mode(const train_options *o, int clients, char *out, size_t cap);
/* One client's rounds: train E local epochs when sampled, push the model
 * change weighted by its examples, clock, pull the round's average.
 * step_bytes[k]: this process's uplink bytes in round k. */
int train_fed_client(worker *w, terse_ps *ps, run_state *r, train_snapshots *ss, double *sums,
                     float *flat, double *step_bytes);

#endif
