/* train.h -- what the pieces of `terse-bench train` share: the Fashion-MNIST
 * reader (idx.c), the two models (model.c), the options, and the record
 * format that carries results from rank 0 back to the launcher.
 *
 * Roles, as in `terse-bench allreduce` (allreduce.h):
 *   launcher  TERSE_RANK is unset: runs this program again as N workers
 *             under terse-run with --worker --results FILE, then prints the
 *             table (or CSV/JSON) and, for --sweep, draws the plot.
 *   worker    TERSE_RANK is set: loads the data, joins the job, trains every
 *             configuration in turn (one, or the sweep's list), and rank 0
 *             appends one record per evaluation to --results FILE.
 *
 * idx.c and model.c use no terse API: they are compiled into the small
 * static library terse_train that the tests link too. */
#ifndef TERSE_BENCH_TRAIN_H
#define TERSE_BENCH_TRAIN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- IDX files (idx.c) */

/* An IDX file (LeCun's MNIST format, which Fashion-MNIST keeps): big-endian
 * magic 0x0000TTDD (TT = 0x08, unsigned bytes, the only type read here;
 * DD = number of dimensions, 1..4), DD big-endian u32 sizes, then the
 * product of the sizes in bytes. Files may be gzip-compressed (read through
 * zlib) or raw. */
typedef struct {
    unsigned ndims;
    uint32_t dims[4];
    size_t count;  /* product of dims */
    uint8_t *data; /* count bytes; free with idx_free */
} idx_array;

/* Read PATH. On failure returns -1 and writes one sentence into err (cap
 * bytes) naming the file and what is wrong: cannot open, not gzip/IDX,
 * wrong magic, wrong type, bad dimension count, a zero dimension, size
 * overflow, truncated (has fewer bytes than the header promises), trailing
 * bytes after the data, or a gzip stream that is corrupt. Never reads past
 * what it allocated; allocates only after the header is checked, and at
 * most what the header promises (which is capped at IDX_MAX_BYTES). */
#define IDX_MAX_BYTES ((size_t)1 << 32)
int idx_read(const char *path, idx_array *out, char *err, size_t cap);
void idx_free(idx_array *a);

/* A labelled image set: n images of rows x cols pixels (uint8), n labels in
 * [0, 9]. */
typedef struct {
    size_t n, rows, cols;
    uint8_t *pixels; /* n * rows * cols */
    uint8_t *labels; /* n */
} dataset;

/* Load DIR/PREFIX-images-idx3-ubyte[.gz] and DIR/PREFIX-labels-idx1-ubyte[.gz]
 * (PREFIX is "train" or "t10k"; the .gz name is tried first). Checks that
 * images are 3-dimensional, labels 1-dimensional, that the counts agree, and
 * that every label is below 10. -1 with a sentence in err on failure. */
int dataset_load(const char *dir, const char *prefix, dataset *out, char *err, size_t cap);
void dataset_free(dataset *d);

/* Where Debian's dataset-fashion-mnist puts the files. */
#define TRAIN_DEFAULT_DATA "/usr/share/datasets/fashion-mnist"

/* ---- models (model.c) */

typedef enum { MODEL_SOFTMAX, MODEL_MLP, MODEL_CNN } model_kind;

#define MODEL_MAX_TENSORS 8
#define MODEL_INPUTS 784
#define MODEL_CLASSES 10
#define MODEL_HIDDEN 256

/* One parameter tensor: rows x cols floats, row major (a bias is n x 1). */
typedef struct {
    const char *name; /* "w", "b" (softmax); "w1", "b1", "w2", "b2" (MLP);
                         "k1", "c1", "k2", "c2", "w3", "b3", "w4", "b4" (CNN) */
    size_t rows, cols, n;
    float *value, *grad; /* n each, 64-byte aligned */
} model_tensor;

/*
 * softmax: logits = x W^T + b, W 10 x 784.
 * mlp:     h = relu(x W1^T + b1), W1 256 x 784; logits = h W2^T + b2, W2 10 x 256.
 * cnn:     x as a 28 x 28 image of one channel, then
 *            5x5 convolution 1 -> 16 channels (stride 1, no padding: 24 x 24)
 *              + c1, ReLU, 2x2 max-pool with stride 2 (12 x 12);
 *            5x5 convolution 16 -> 32 channels (8 x 8) + c2, ReLU, 2x2 max-pool (4 x 4);
 *            flattened channel-major to f, 512 features (feature c*16 + y*4 + x, as
 *              PyTorch flattens NCHW);
 *            h = relu(f W3^T + b3), W3 128 x 512; logits = h W4^T + b4, W4 10 x 128.
 *          A kernel is an out x (in*5*5) matrix, element [oc][ic*25 + ky*5 + kx]
 *          (PyTorch's weight.view(out, -1), the matrix its PowerSGD hook
 *          compresses): k1 16 x 25, k2 32 x 400; the biases c1 16 x 1, c2 32 x 1.
 *          Max-pool passes its gradient to the first maximum of its window in
 *          scan order. Images pass through the network 8 at a time, so its
 *          workspace (about 2 MB) does not grow with max_batch.
 * Loss: mean over the batch of softmax cross-entropy. Initialised as
 * PyTorch's nn.Linear and nn.Conv2d are: weights and biases uniform in
 * +-1/sqrt(fan_in) (fan_in = in_channels*25 for a convolution), drawn from a
 * generator keyed by seed (the same on every machine).
 */
typedef struct model model;

/* NULL on allocation failure. max_batch bounds every later batch size. */
model *model_create(model_kind kind, size_t max_batch, uint64_t seed);
void model_free(model *m);
size_t model_tensor_count(const model *m);
model_tensor *model_tensor_at(model *m, size_t i);
size_t model_param_count(const model *m);

/* Forward and backward over b examples x (b x 784, row major, values in
 * [0, 1]) with labels y: fills every tensor's grad with d(mean loss)/d(param)
 * (overwriting), returns the mean loss. b in [1, max_batch]. The loss is
 * accumulated in double. */
double model_forward_backward(model *m, const float *x, const uint8_t *y, size_t b);

/* Forward only: the mean loss over b examples, and how many of them the
 * arg-max of the logits classifies correctly (ties go to the lower class).
 * b in [1, max_batch]. */
double model_evaluate(model *m, const float *x, const uint8_t *y, size_t b, size_t *correct);

/* "softmax", "mlp" or "cnn" -> kind; -1 for anything else. */
int model_kind_parse(const char *text, model_kind *kind);
const char *model_kind_name(model_kind kind);

/* ---- random streams (train_random.c) */

/* A stream key for (seed, a, b): different purposes get unrelated streams. */
uint64_t train_stream_key(uint64_t seed, uint64_t a, uint64_t b);
/* Shuffle v[0..n) in place (Fisher-Yates), drawing from key. */
void train_shuffle(size_t *v, size_t n, uint64_t key);
/* x[i] += N(0, sd^2) for i < n, drawing from the stream *s (advanced). */
void train_add_gaussian(float *x, size_t n, double sd, uint64_t *s);
/* A Gamma(a, 1) draw (a > 0; Marsaglia and Tsang), and a uniform in (0, 1),
 * from the stream *s. */
double train_gamma(double a, uint64_t *s);
double train_uniform(uint64_t *s);

/* ---- training options and records (train.c, train_runs.c, train_worker.c) */

#define TRAIN_MAX_RUNS 512
#define TRAIN_MAX_OVERRIDES 8
#define TRAIN_DENSE "dense" /* the spec meaning "no codec" */

typedef enum { TRAIN_MODE_ALLREDUCE, TRAIN_MODE_LOCALSGD, TRAIN_MODE_PS, TRAIN_MODE_FEDAVG } train_mode;

/* --byzantine K:ATTACK (train_attack.c) */
typedef enum {
    ATTACK_NONE, ATTACK_SIGNFLIP, ATTACK_NOISE, ATTACK_LABELFLIP, ATTACK_ALIE, ATTACK_IPM
} train_attack;
int train_attack_parse(const char *text, int *k, train_attack *a);
const char *train_attack_name(train_attack a);
double train_alie_z(int workers, int byzantine);

/* --robust-sweep (train_robust.c): its aggregators, Byzantine workers, the
 * compressed codec unless --codec, and signvote's factor on --lr */
#define TRAIN_ROBUST_AGGREGATORS 6
extern const char *const train_robust_aggregators[TRAIN_ROBUST_AGGREGATORS];
#define TRAIN_ROBUST_BYZANTINE 2
#define TRAIN_ROBUST_CODEC "int8:ef=1"
#define TRAIN_ROBUST_SIGN_LR 0.01

/* The learning-rate schedule (--schedule): constant; linear warm-up then
 * cosine decay to zero; or linear warm-up then x0.1 at each milestone. */
typedef enum { TRAIN_SCHED_NONE, TRAIN_SCHED_COSINE, TRAIN_SCHED_STEP } train_schedule;
#define TRAIN_MAX_MILESTONES 4

/* One training configuration: what a row of the sweep is. */
typedef struct {
    char codec[128];       /* the spec for the large tensors, or "dense" */
    char small_codec[128]; /* the spec for the bucket of small tensors */
    char label[64];        /* what the table calls it */
    int ef;                /* 1 if codec has ef=1 (for the table) */
    uint64_t seed;         /* initialisation, sharding, shuffling, codec seeds */
    int local_steps;       /* 0: synchronous SGD; H: Local SGD, average every H */
    int local_momentum, mask_momentum; /* as the options of the same names */
    int group;             /* runs that differ only in seed share a group */
    /* Accordion (--adapt): codec is the mild spec, adapt_high the aggressive
     * one; every adapt_every steps each compressed tensor takes the mild codec
     * if the norm of its gradient summed over the interval changed by at
     * least adapt_eta (relative), the aggressive one otherwise. */
    int adapt;
    char adapt_high[128];
    double adapt_eta;
    int adapt_every;       /* 0: a tenth of the run's steps */
    /* ps mode: the servers' aggregator ("" = mean), the Byzantine workers
     * and their attack, and a factor on --lr (the robust sweep's signvote
     * rows: a sign step wants a smaller rate) */
    char aggregator[64];
    int byz_k;
    train_attack attack;
    double lr_factor;
    /* fedavg mode (train_fed.c): local epochs per round (0: the fed sweep's
     * baseline, synchronous SGD through the server for --epochs epochs),
     * and the partition's Dirichlet alpha (0: iid) */
    int fed_epochs;
    double alpha;
} train_run;

typedef struct {
    model_kind model;
    int workers;
    int epochs;
    size_t batch;          /* per worker */
    double lr, momentum;
    train_schedule schedule;
    double warmup;         /* --warmup: fraction of the steps (cosine, step) */
    double milestones[TRAIN_MAX_MILESTONES]; /* step: fractions of the steps */
    int n_milestones;
    int local_momentum;    /* --momentum-at local: momentum before the exchange */
    int mask_momentum;     /* --mask-momentum: DGC's momentum factor masking */
    uint64_t seed;
    const char *provider;  /* NULL: shm */
    const char *data_dir;
    train_mode mode;
    int local_steps;       /* H for localsgd:H */
    char ps_mode[64];      /* --mode ps:SPEC: SPEC (terse_ps_config_parse) */
    int servers;           /* --servers S: parameter-server ranks (1) */
    int colocate;          /* --colocate: ps mode, every worker also a server */
    long ps_chunk_bytes;   /* --chunk-bytes N: ps mode (0: spread the model over the servers) */
    char aggregator[64];   /* --aggregator SPEC: the servers' (ps mode; "" = mean) */
    int byz_k;             /* --byzantine K:ATTACK: the last K workers attack */
    train_attack byz_attack;
    int robust_sweep;      /* --robust-sweep */
    /* --mode fedavg:E: every worker process is one client */
    int fed_epochs;        /* E */
    double fraction;       /* --fraction F: clients sampled each round */
    double alpha;          /* --partition dirichlet:A (0: iid) */
    int rounds;            /* --rounds R */
    double dropout;        /* --dropout P: a sampled client drops out of its round */
    int deadline_ms;       /* --deadline-ms D: the round's deadline (0: none) */
    int fed_sweep;         /* --fed-sweep */
    int straggler;         /* --straggler W:F: worker index W is F times slower (-1: none) */
    double straggler_factor;
    double transient_p;    /* --transient P:F: every step each worker is F times */
    double transient_factor; /* slower with probability P (0: never) */
    int dp;                /* --dp given */
    double dp_clip, dp_noise;
    const char *overrides[TRAIN_MAX_OVERRIDES]; /* "NAME=SPEC" for --codec-for */
    size_t n_overrides;
    const char *adapt;     /* --adapt's text, or NULL */
    int small;             /* tensors of fewer elements go into the small bucket */
    const char *small_codec; /* its codec (--small-codec), "dense" by default */
    int seeds;             /* --seeds K: every configuration with K seeds */
    size_t train_limit, test_limit; /* 0: all */
    int eval_every;        /* steps between evaluations, 0: once per epoch */
    double target_acc;     /* report the time to reach it; 0: not asked */
    int sweep, sweep_full;
    train_run runs[TRAIN_MAX_RUNS];
    size_t n_runs;
    int csv, json, quiet;
    const char *plot;      /* PNG path for the sweep's plot, or NULL */
    int worker;
    const char *results;
} train_options;

/* One evaluation of one run, written by rank 0 (one line per record). */
typedef struct {
    int run;               /* index into runs */
    int group;             /* runs[run].group */
    uint64_t seed;         /* runs[run].seed */
    int final;             /* 1 on the last evaluation of the run */
    int epoch;             /* 1-based; fractional progress is in step */
    long step, steps_total;
    double test_acc;       /* percent */
    double test_loss, train_loss; /* train loss: mean since the last record */
    double bytes_sent;     /* gradient (or model-delta) wire bytes per worker,
                              since the start of the run, max over workers;
                              in fedavg mode, the uplink of every client
                              summed (pushes and request headers) */
    double dense_bytes;    /* 4 * parameters * steps: what synchronous dense
                              fp32 training sends per worker (2 workers) */
    double compute_s, codec_s, network_s; /* since the start, max over workers */
    double wall_s;         /* training wall time since the start (no eval) */
    char codec[128];
    char label[64];
    int ef;
    char error[256];       /* reserved: empty (a failed run writes no record; its
                              worker says why on stderr) */
} train_record;

/* ---- arithmetic (train_stats.c) */

/* The learning rate of step k (0-based) of a run of `total` steps under the
 * options' schedule: --lr times the warm-up ramp (k+1)/W over the first
 * W = warmup x total steps, then, for cosine, (1 + cos(pi (k-W)/(total-W)))/2,
 * for step, 0.1 per milestone passed (k >= milestone x total). */
double train_lr_at(const train_options *o, long k, long total);
/* The two-sided 95% quantile of Student's t with df >= 1 degrees of freedom
 * (NAN below 1). */
double train_t975(int df);
/* The mean of diff[0..n), its sample standard deviation sd, and the
 * half-width of the mean's 95% t-interval, t975(n-1) x sd / sqrt(n) (sd and
 * half-width NAN when n < 2). */
void train_paired(const double *diff, int n, double *mean, double *sd, double *half_width);

void train_record_write(FILE *f, const train_record *r);
/* One line into the train_record at record: 0, or -1 if it is malformed
 * (a bench_record_parse). */
int train_record_parse(char *line, void *record);

/* Parse argv (argv[0] is "train") into o, runs included (train.c). 0 to
 * run, -1 after --help, or an exit code. */
int train_parse_args(int argc, char **argv, train_options *o);
/* The --help text (train_usage.c). */
void train_usage(FILE *f);
/* "terse-bench train: " then fmt with arg, then a pointer to --help, on
 * stderr; returns the usage exit code (train.c). */
int train_usage_error(const char *fmt, const char *arg);

/* What parsing remembers besides the options themselves (train.c), for the
 * checks and the list of runs (train_runs.c). */
typedef struct {
    const char *codec;
    int have_codec, have_seeds, have_small_codec, have_schedule, have_lr;
    int have_workers, have_mode, have_momentum_at, have_clients, have_partition;
    train_run adapt; /* --adapt, parsed */
} train_parse_state;

/* train_runs.c: options that are each fine but do not go together (0, or
 * an exit code after saying why); the list of runs (the sweep's, or the one
 * --codec asks for) once per seed, and, in the launcher, every codec spec
 * tried before anything runs (0 or an exit code). */
int train_check_combinations(const train_options *o, const train_parse_state *ps);
int train_build_runs(train_options *o, const train_parse_state *ps);
/* The --codec-for spec of tensor `name`, or NULL. */
const char *train_override_for(const train_options *o, const char *name);

int train_worker_main(const train_options *o);
/* Processes a run needs: the workers, plus the servers in ps mode. */
int train_processes(const train_options *o);
int train_launch(int argc, char **argv, const train_options *o);
void train_report(const train_options *o, const train_record *recs, int n);
int train_plot(const train_options *o, const train_record *recs, int n);
FILE *train_plot_open(char *gp, size_t gp_cap, char *script, size_t script_cap);
int train_plot_close(const train_options *o, FILE *f, char *gp, char *script);
void train_robust_report(const train_options *o, const train_record *recs, int n);
int train_robust_plot(const train_options *o, const train_record *recs, int n);

/* The fed sweep's report (train_fed_report.c): rounds and uplink bytes to
 * the baseline's final accuracy, and the plot. */
void train_fed_report(const train_options *o, const train_record *recs, int n);
int train_fed_plot(const train_options *o, const train_record *recs, int n);
/* Clients sampled each round: round(F x N), at least 1. */
int train_fed_per_round(const train_options *o, int clients);

int bench_train_main(int argc, char **argv);

#endif
