/* terse-bench train: options, --help, the sweep's list of runs, and the
 * launcher role (train.h): start the workers under terse-run, read back
 * what rank 0 recorded, print the table and draw the plot. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <terse.h>

#include "bench.h"
#include "train.h"

#define WHO "terse-bench train"
/* The sweep's defaults: seeds per configuration (7: the paired 95% intervals
 * of most rows are then within 0.3 point each way, and the sweep within
 * 5 minutes on 2 cores; docs/training.md),
 * and the codec of the small-tensor bucket in compressed runs. */
#define TRAIN_SWEEP_SEEDS 7
#define TRAIN_SWEEP_SMALL_CODEC "int8:ef=1"
#define TRAIN_SWEEP_CNN_SEEDS 4
/* The CNN's default learning rate: at 0.1, seeds 1-3 ended at 87.36, 83.59
 * and 87.85% (one stalls); at 0.05, 87.69, 86.80, 86.89%. */
#define TRAIN_CNN_LR 0.05
/* fedavg's defaults (McMahan et al.'s C = 0.1 of 100 clients is 10 a round;
 * 2 cores hold 10 client processes, 3 of them training at once), the fed
 * sweep's compressed codec and its non-iid partition. */
#define TRAIN_FED_CLIENTS 10
#define TRAIN_FED_FRACTION 0.3
#define TRAIN_FED_ROUNDS 20
#define TRAIN_FED_CODEC "int8:ef=1"
#define TRAIN_FED_ALPHA 0.3
#define TRAIN_FED_ALPHA_TEXT "0.3"

static void usage(FILE *f) {
    fprintf(f,
"usage: terse-bench train [OPTIONS]\n"
"       terse-bench train --sweep [OPTIONS]\n"
"\n"
"Data-parallel training on Fashion-MNIST with N real worker processes (started\n"
"through terse-run), each on its own shard, exchanging gradients with\n"
"terse_allreduce over libfabric. Prints, per epoch, test accuracy, training\n"
"loss, the gradient bytes each worker sent and the time split. --sweep trains\n"
"the MLP once per codec, with and without error feedback, and prints one table\n"
"and an accuracy-against-bytes plot.\n"
"\n"
"model and training:\n"
"  --model M             softmax: 784->10 softmax regression; mlp: 784->256->10\n"
"                        ReLU MLP (default); cnn: two 5x5 convolutions (16 and\n"
"                        32 channels, each ReLU and 2x2 max-pooling), a 512->128\n"
"                        ReLU layer and the 128->10 classifier; tensors: softmax\n"
"                        w b; mlp w1 b1 w2 b2; cnn k1 c1 k2 c2 w3 b3 w4 b4 (a\n"
"                        kernel kN is out-channels x in-channels*25, the matrix\n"
"                        a low-rank codec sees)\n"
"  -n, --workers N       worker processes (2)\n"
"  --epochs E            passes over each worker's shard (2)\n"
"  --batch B             examples per worker per step (64)\n"
"  --lr X                peak learning rate (0.1; cnn 0.05, where 0.1 with\n"
"                        momentum 0.9 leaves some seeds behind in 2 epochs)\n"
"  --schedule S          the learning rate over the run: cosine (default):\n"
"                        linear warm-up, then cosine decay to zero, so the\n"
"                        final iterate is stable; step:F1,F2,...: warm-up, then\n"
"                        x0.1 at each fraction Fi of the steps (e.g.\n"
"                        step:0.5,0.75); none: constant --lr, the setting of\n"
"                        bench/torch_ddp_baseline.py (ps mode: none only)\n"
"  --warmup F            warm-up over the first fraction F of the steps, for\n"
"                        cosine and step (0.05)\n"
"  --momentum X          SGD momentum, PyTorch's form v = m v + g (0.9)\n"
"  --momentum-at W       global (default): momentum on the averaged gradient,\n"
"                        as PyTorch DDP does; local: each worker's momentum is\n"
"                        what travels (EF-SGDM), in allreduce mode and in ps\n"
"                        mode (workers push their momentum; the server runs\n"
"                        plain SGD), as robust aggregation wants (cclip)\n"
"  --mask-momentum       with --momentum-at local: zero the momentum of every\n"
"                        coordinate this worker just sent (DGC's masking);\n"
"                        applies to tensors whose codec is topk or randk with\n"
"                        ef=1, and leaves every other tensor alone\n"
"  --seed N              initialisation, sharding, shuffling, codec draws (1)\n"
"  --seeds K             run every configuration with seeds N..N+K-1 and report\n"
"                        the mean and range (1; the sweep: 7, the cnn's: 4)\n"
"  --mode allreduce      synchronous SGD: average gradients every step (default)\n"
"  --mode localsgd:H     Local SGD: H local steps, then average the models\n"
"                        (what travels is the model change since the last\n"
"                        average, compressed with the codec)\n"
"  --mode ps:M           a parameter server (--servers S ranks besides the\n"
"                        workers) holds the model and runs SGD with momentum;\n"
"                        workers push gradients (--codec compresses them) and\n"
"                        pull the parameters. M: sync, sync:quorum=K (backup\n"
"                        workers: a step closes on the first K pushes), async,\n"
"                        async:max_staleness=S, ssp:S (stale synchronous)\n"
"  --servers S           parameter-server ranks in ps mode (1)\n"
"  --aggregator SPEC     ps:sync: how the server combines a step's pushes: mean\n"
"                        (default), median, trimmed_mean:b=B, krum:f=F[,m=M],\n"
"                        cclip:tau=T[,iters=L], signvote (terse.h, Aggregators)\n"
"  --byzantine K:ATTACK  ps mode: the last K workers (never worker 0) push an\n"
"                        attack instead: signflip (-4x the honest vector),\n"
"                        noise (Gaussian of variance 200), labelflip (trained\n"
"                        on labels 9-y),\n"
"                        alie (mean - z sd of the honest vectors, Baruch et al.\n"
"                        2019) or ipm (-0.1 x their mean, Xie et al. 2019);\n"
"                        alie and ipm know the honest vectors, as in the papers:\n"
"                        the attacker recomputes them (exact in ps:sync)\n"
"  --robust-sweep        every attack (and none) against every aggregator\n"
"                        (mean, median, trimmed_mean:b=2, krum:f=2,\n"
"                        cclip:tau=3,iters=3, signvote at lr x0.01), 2\n"
"                        Byzantine workers, dense and with --codec (default\n"
"                        int8:ef=1): 72 runs of --mode ps:sync, --workers 8\n"
"                        and --momentum-at local unless given; prints one\n"
"                        table per codec and the checks, and draws\n"
"                        terse-robust.png (--plot PATH)\n"
"  --mode fedavg:E       federated averaging (McMahan et al. 2017) on the\n"
"                        parameter server: each worker process is a client\n"
"                        with its own shard (and so its own error feedback);\n"
"                        each round a sample of the clients trains E local\n"
"                        epochs of plain SGD (--lr, --batch) and pushes its\n"
"                        model change through --codec, weighted by its\n"
"                        examples; the server averages the round (sync with\n"
"                        a quorum of the sample, SGD at lr 1)\n"
"  --clients N           fedavg: clients, i.e. worker processes (10)\n"
"  --fraction F          fedavg: clients sampled each round, round(F x N),\n"
"                        at least 1 (0.3)\n"
"  --partition P         fedavg: iid (default) or dirichlet:A, each class split\n"
"                        over the clients by Dirichlet(A) shares (small A:\n"
"                        skewed labels, e.g. dirichlet:0.3)\n"
"  --rounds R            fedavg: rounds (20); evaluated every round unless\n"
"                        --eval-every\n"
"  --dropout P           fedavg: a sampled client drops out of its round (no\n"
"                        push) with probability P; needs --deadline-ms\n"
"  --deadline-ms D       fedavg: a round closes D ms after it opened with the\n"
"                        pushes it has (a later push is refused and counted)\n"
"  --fed-sweep           a baseline (synchronous SGD through the server, every\n"
"                        client every step, --epochs epochs) and fedavg on iid\n"
"                        and dirichlet:0.3 shards, dense and with --codec\n"
"                        (default int8:ef=1); prints the rounds and uplink\n"
"                        bytes each takes to the baseline's final accuracy and\n"
"                        draws terse-fed.png (--plot PATH); fedavg:1 unless\n"
"                        --mode says otherwise\n"
"  --straggler W:F       worker index W computes F times slower (it sleeps\n"
"                        (F-1) x its compute time each step), in every mode\n"
"  --dp clip=C,noise=S   clip each worker's update to L2 norm C, then add\n"
"                        Gaussian noise of standard deviation S*C to every\n"
"                        coordinate, before compression (see DP below)\n"
"\n"
"compression and transport:\n"
"  --codec SPEC          codec for the large tensors (mlp: w1; softmax: w;\n"
"                        cnn: k2 and w3), or\n"
"                        'dense' (default); e.g. topk:ratio=0.01,ef=1 or\n"
"                        powersgd:rank=4,ef=1\n"
"  --small N             tensors under N elements (4096: the MLP's b1, w2 10x256\n"
"                        and b2; the softmax's b; the cnn's k1, w4 and biases)\n"
"                        travel together in one bucket,\n"
"                        as DDP buckets them; 0 puts every tensor under --codec\n"
"  --small-codec SPEC    the bucket's codec in compressed runs (dense; the sweep\n"
"                        uses int8:ef=1); a dense run keeps it dense\n"
"  --codec-for T=SPEC    codec for tensor T alone (tensor names: --model), out\n"
"                        of the bucket; repeatable, once per tensor\n"
"  --adapt accordion:low=SPEC,high=SPEC[,eta=X][,every=K]\n"
"                        Accordion (Agarwal et al., MLSys 2021): every K steps\n"
"                        (a tenth of the run) each tensor under --codec takes\n"
"                        the mild codec low if the norm of its averaged\n"
"                        gradient (with --momentum-at local: of what travels)\n"
"                        summed over the last K steps changed by at least X\n"
"                        (0.5) relative to the K steps before (a critical\n"
"                        regime), else the aggressive codec high; the first\n"
"                        2K steps are mild (a comparison needs two sums). The\n"
"                        bucket and --codec-for tensors keep their codecs.\n"
"                        Every rank decides from the same all-reduced norms; a\n"
"                        switch hands the old codec's error-feedback residual\n"
"                        to the new codec (give both ef=1, or the new one drops\n"
"                        what it cannot send). Replaces --codec\n"
"  --provider P          shm (default), tcp, auto, verbs, efa\n"
"\n"
"data and evaluation:\n"
"  --data DIR            Fashion-MNIST IDX files (" TRAIN_DEFAULT_DATA ")\n"
"  --train-limit N       use only the first N training examples\n"
"  --test-limit N        evaluate on only the first N test examples\n"
"  --eval-every K        also evaluate every K steps (for --target-acc)\n"
"  --target-acc P        report the training time until test accuracy >= P%%\n"
"\n"
"the sweep:\n"
"  --sweep               the MLP with every codec, with and without error\n"
"                        feedback; top-k with DGC's momentum masking; the\n"
"                        library's default qsgd and sign beside the tuned rows;\n"
"                        Accordion (PowerSGD rank 4 / rank 2); Local SGD every 8\n"
"                        steps, dense and with PowerSGD: 28 configurations x 7\n"
"                        seeds, each compared with dense on the same seeds (a\n"
"                        95%% interval); about 4 to 5 minutes on 2 cores\n"
"  --sweep --model cnn   the CNN with dense, qsgd, sign, top-k DGC, PowerSGD\n"
"                        rank 1, 2, 4 and Accordion: 8 configurations x 4\n"
"                        seeds, about 4 minutes on 2 cores\n"
"  --sweep-full          also fp16, bf16 and int8 with error feedback and\n"
"                        PowerSGD rank 2 and 4 without (33, MLP)\n"
"  --plot FILE           where the sweep draws accuracy against bytes as a PNG\n"
"                        (terse-sweep.png, terse-sweep-cnn.png); needs gnuplot\n"
"\n"
"output:\n"
"  --csv                 one CSV line per evaluation\n"
"  --json                one JSON document\n"
"  -q, --quiet           no progress on stderr\n"
"  -h, --help            this text\n"
"\n"
"Columns: acc is test accuracy (%%) on the 10,000 test images (or\n"
"--test-limit); loss is the mean\n"
"training loss since the previous line; sent is the gradient bytes each worker\n"
"handed to the network (terse_comm_stats' wire bytes: payload and terse's\n"
"framing, the maximum over workers); ratio is 4 bytes x parameters x steps x\n"
"2(N-1)/N (what synchronous dense fp32 training sends per worker, by ring) over\n"
"sent; compute, codec and network are seconds of\n"
"forward/backward/update, of encode/decode/reduction, and of waiting on the\n"
"network (maximum over workers); time is the training wall time, evaluation\n"
"excluded. In the sweep's table, sd is the standard deviation of a row's final\n"
"accuracy over its seeds; vs-dense the mean over seeds of (row - dense on the\n"
"same seed), and the 95%% interval its Student-t interval; the summary line\n"
"names the fewest bytes whose whole interval lies above -0.5 point.\n"
"\n"
"Determinism: workers run OpenBLAS single-threaded and every random draw is\n"
"keyed by --seed, so one command prints the same accuracies and byte counts\n"
"on every run on the same machine.\n"
"\n"
"DP: --dp applies the Gaussian mechanism to each worker's whole update per\n"
"step (sensitivity C after clipping, noise S*C). That protects a worker's\n"
"batch as a unit in one step against an observer of the messages; it is not\n"
"per-example DP-SGD (no per-example clipping), it does no privacy accounting\n"
"over steps (epsilon is not computed), and the noise comes from the\n"
"reproducible --seed stream, so anyone who knows the seed can remove it: a\n"
"deployment needs a secret seed. Compression after the noise is\n"
"post-processing and weakens nothing.\n"
"\n"
"Workers are this program started again through terse-run (found as\n"
"TERSE_RUN, beside terse-bench, or on PATH). Exit status: 0 ok, 1 a run\n"
"failed, 2 usage error.\n");
}

/* ---------------------------------------------------------------- parsing */

static int parse_u64(const char *s, uint64_t *v) {
    if (!s || s[0] < '0' || s[0] > '9') return -1;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno || *end) return -1;
    *v = x;
    return 0;
}

static int parse_int(const char *s, long lo, long hi, long *v) {
    uint64_t x;
    if (parse_u64(s, &x) != 0 || x < (uint64_t)lo || x > (uint64_t)hi) return -1;
    *v = (long)x;
    return 0;
}

static int parse_double(const char *s, double lo, double hi, double *v) {
    if (!s || !s[0]) return -1;
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (errno || *end || !isfinite(x) || x < lo || x > hi) return -1;
    *v = x;
    return 0;
}

/* "K1=X,K2=Y" with each key at most once, in either order (an empty text
 * has neither): values into v[0], v[1] within [lo[i], hi[i]], have[i] set
 * for each key seen. -1 on anything else. */
static int parse_two_keys(const char *text, const char *const key[2], const double lo[2],
                          const double hi[2], double v[2], int have[2]) {
    char buf[128];
    if (strlen(text) >= sizeof buf) return -1;
    strcpy(buf, text);
    have[0] = have[1] = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        int k = 0;
        while (k < 2 && (strncmp(tok, key[k], strlen(key[k])) != 0 || tok[strlen(key[k])] != '='))
            k++;
        if (k == 2 || have[k] || parse_double(tok + strlen(key[k]) + 1, lo[k], hi[k], &v[k]) != 0)
            return -1;
        have[k] = 1;
    }
    return 0;
}

/* "clip=C,noise=S" (either order, both required). */
static int parse_dp(const char *text, train_options *o) {
    static const char *const key[2] = {"clip", "noise"};
    static const double lo[2] = {1e-12, 0.0}, hi[2] = {1e12, 1e6};
    double v[2];
    int have[2];
    if (parse_two_keys(text, key, lo, hi, v, have) != 0 || !have[0] || !have[1]) return -1;
    o->dp_clip = v[0];
    o->dp_noise = v[1];
    o->dp = 1;
    return 0;
}

/* "none", "cosine" or "step:F1,F2,..." (increasing fractions in (0, 1)). */
static int parse_schedule(const char *text, train_options *o) {
    o->n_milestones = 0;
    if (strcmp(text, "none") == 0) {
        o->schedule = TRAIN_SCHED_NONE;
        return 0;
    }
    if (strcmp(text, "cosine") == 0) {
        o->schedule = TRAIN_SCHED_COSINE;
        return 0;
    }
    if (strncmp(text, "step:", 5) != 0) return -1;
    char buf[128];
    if (strlen(text + 5) >= sizeof buf) return -1;
    strcpy(buf, text + 5);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        double f;
        if (o->n_milestones == TRAIN_MAX_MILESTONES || parse_double(tok, 1e-9, 1 - 1e-9, &f) != 0 ||
            (o->n_milestones && f <= o->milestones[o->n_milestones - 1]))
            return -1;
        o->milestones[o->n_milestones++] = f;
    }
    if (o->n_milestones == 0) return -1;
    o->schedule = TRAIN_SCHED_STEP;
    return 0;
}

/* "accordion:low=SPEC,high=SPEC[,eta=X][,every=K]" into r's adapt fields
 * and its codec (the mild spec). The specs hold commas themselves: low ends
 * at ",high=", high at the first ",eta=" or ",every=" after it. */
static int parse_adapt(const char *text, train_run *r) {
    static const char head[] = "accordion:low=";
    if (strncmp(text, head, sizeof head - 1) != 0) return -1;
    const char *low = text + sizeof head - 1, *high = strstr(low, ",high=");
    if (!high || high == low || (size_t)(high - low) >= sizeof r->codec) return -1;
    memcpy(r->codec, low, (size_t)(high - low));
    r->codec[high - low] = '\0';
    high += 6;
    const char *end = high + strlen(high), *eta = strstr(high, ",eta="),
               *every = strstr(high, ",every=");
    if (eta && eta < end) end = eta;
    if (every && every < end) end = every;
    if (end == high || (size_t)(end - high) >= sizeof r->adapt_high) return -1;
    memcpy(r->adapt_high, high, (size_t)(end - high));
    r->adapt_high[end - high] = '\0';
    if (strcmp(r->codec, TRAIN_DENSE) == 0 || strcmp(r->adapt_high, TRAIN_DENSE) == 0)
        return -1; /* both must be codecs */
    /* Then ",eta=X" and ",every=K", each optional. */
    static const char *const key[2] = {"eta", "every"};
    static const double lo[2] = {1e-9, 1}, hi[2] = {1e9, 1 << 30};
    double v[2] = {0.5, 0};
    int have[2];
    if (*end && *end++ != ',') return -1;
    if (parse_two_keys(end, key, lo, hi, v, have) != 0 || v[1] != floor(v[1])) return -1;
    r->adapt_eta = v[0];
    r->adapt_every = (int)v[1];
    r->adapt = 1;
    return 0;
}

static int parse_mode(const char *text, train_options *o) {
    if (strncmp(text, "ps:", 3) == 0) {
        terse_ps_config c = TERSE_PS_CONFIG_INIT;
        if (strlen(text + 3) >= sizeof o->ps_mode || terse_ps_config_parse(text + 3, &c) != TERSE_OK) {
            fprintf(stderr, WHO ": --mode '%s': %s (try terse-bench train --help)\n", text,
                    terse_last_error());
            return BENCH_EXIT_USAGE;
        }
        o->mode = TRAIN_MODE_PS;
        snprintf(o->ps_mode, sizeof o->ps_mode, "%s", text + 3);
        return 0;
    }
    if (strcmp(text, "allreduce") == 0) {
        o->mode = TRAIN_MODE_ALLREDUCE;
        return 0;
    }
    long h;
    if (strncmp(text, "fedavg:", 7) == 0 && parse_int(text + 7, 1, 1000, &h) == 0) {
        o->mode = TRAIN_MODE_FEDAVG;
        o->fed_epochs = (int)h;
        return 0;
    }
    if (strncmp(text, "localsgd:", 9) == 0 && parse_int(text + 9, 1, 1000000, &h) == 0) {
        o->mode = TRAIN_MODE_LOCALSGD;
        o->local_steps = (int)h;
        return 0;
    }
    return -1;
}

/* The spec with ef=1 appended (after ':' or ','). */
static void with_ef(char *out, size_t cap, const char *spec) {
    snprintf(out, cap, "%s%sef=1", spec, strchr(spec, ':') ? "," : ":");
}

static train_run *add_run(train_options *o, const char *label, const char *spec, int ef) {
    if (o->n_runs >= TRAIN_MAX_RUNS) return &o->runs[TRAIN_MAX_RUNS - 1];
    train_run *r = &o->runs[o->n_runs++];
    r->local_steps = o->mode == TRAIN_MODE_LOCALSGD ? o->local_steps : 0;
    r->local_momentum = o->local_momentum;
    r->mask_momentum = o->mask_momentum;
    if (ef)
        with_ef(r->codec, sizeof r->codec, spec);
    else
        snprintf(r->codec, sizeof r->codec, "%s", spec);
    snprintf(r->label, sizeof r->label, "%s", label);
    r->ef = ef;
    snprintf(r->aggregator, sizeof r->aggregator, "%s", o->aggregator);
    r->byz_k = o->byz_k;
    r->attack = o->byz_attack;
    r->lr_factor = 1.0;
    r->fed_epochs = o->fed_epochs;
    r->alpha = o->alpha;
    return r;
}

/* Every configuration once per seed (seed, seed+1, ...), grouped; the small
 * bucket's codec is dense in a dense run, --small-codec otherwise. */
static void expand_seeds(train_options *o) {
    size_t n = o->n_runs;
    static train_run base[TRAIN_MAX_RUNS];
    memcpy(base, o->runs, n * sizeof *base);
    o->n_runs = 0;
    for (size_t g = 0; g < n; g++)
        for (int k = 0; k < o->seeds && o->n_runs < TRAIN_MAX_RUNS; k++) {
            train_run *r = &o->runs[o->n_runs++];
            *r = base[g];
            r->seed = o->seed + (uint64_t)k;
            r->group = (int)g;
            snprintf(r->small_codec, sizeof r->small_codec, "%s",
                     strcmp(r->codec, TRAIN_DENSE) == 0 ? TRAIN_DENSE : o->small_codec);
        }
}

/* The sweep (train.h): every codec; error feedback for every lossy codec
 * except, by default, the three near-lossless ones, where it changes nothing
 * measurable; PowerSGD rank 2 and 4 only with it (rank 1 shows what it does
 * without); --sweep-full adds those five. 28 configurations by default. */
static void sweep_runs(train_options *o) {
    static const struct {
        const char *label, *spec;
        int ef_by_default; /* 0: only with --sweep-full */
        int plain;         /* 0: only with error feedback (unless --sweep-full) */
    } codecs[] = {
        {"fp16", "fp16", 0, 1},
        {"bf16", "bf16", 0, 1},
        {"int8", "int8", 0, 1},
        {"qsgd 4-bit", "qsgd:bits=4,bucket=128", 1, 1},
        {"terngrad", "terngrad", 1, 1},
        {"sign", "sign:bucket=256", 1, 1},
        {"topk 1%", "topk:ratio=0.01", 1, 1},
        {"randk 1%", "randk:ratio=0.01", 1, 1},
        {"powersgd r1", "powersgd:rank=1", 1, 1},
        {"powersgd r2", "powersgd:rank=2", 1, 0},
        {"powersgd r4", "powersgd:rank=4", 1, 0},
        {"vq", "vq", 1, 1},
    };
    o->n_runs = 0;
    add_run(o, "dense", TRAIN_DENSE, 0);
    for (size_t i = 0; i < sizeof codecs / sizeof codecs[0]; i++) {
        if (codecs[i].plain || o->sweep_full) add_run(o, codecs[i].label, codecs[i].spec, 0);
        if (codecs[i].ef_by_default || o->sweep_full)
            add_run(o, codecs[i].label, codecs[i].spec, 1);
    }
    /* Top-k with DGC's momentum correction and masking, the published recipe
     * for sparsifiers with error feedback under momentum. */
    for (size_t i = 0; i < 3; i++) {
        static const char *const label[] = {"topk 1% DGC", "topk 0.4% DGC", "topk 0.1% DGC"};
        static const char *const spec[] = {"topk:ratio=0.01", "topk:ratio=0.004",
                                           "topk:ratio=0.001"};
        train_run *r = add_run(o, label[i], spec[i], 1);
        r->local_momentum = r->mask_momentum = 1;
    }
    /* The library's defaults where the rows above use other options, so
     * nobody takes those rows for what the defaults give. */
    add_run(o, "qsgd (default)", "qsgd", 1);
    add_run(o, "sign (default)", "sign", 1);
    /* Accordion: PowerSGD rank 4 in critical regimes, rank 2 otherwise. */
    train_run *acc = add_run(o, "accordion r4/r2", "powersgd:rank=4,ef=1", 0);
    acc->ef = acc->adapt = 1;
    snprintf(acc->adapt_high, sizeof acc->adapt_high, "powersgd:rank=2,ef=1");
    acc->adapt_eta = 0.5;
    /* Fewer exchanges instead of (or as well as) smaller ones. */
    add_run(o, "local8 dense", TRAIN_DENSE, 0)->local_steps = 8;
    add_run(o, "local8 psgd r4", "powersgd:rank=4", 1)->local_steps = 8;
}

/* The robust sweep (--robust-sweep): every attack against every
 * aggregator, dense and with one compressed codec. 72 configurations. */
static void robust_sweep_runs(train_options *o, const char *codec) {
    o->n_runs = 0;
    for (int c = 0; c < 2; c++)
        for (int a = ATTACK_NONE; a <= ATTACK_IPM; a++)
            for (int g = 0; g < TRAIN_ROBUST_AGGREGATORS; g++) {
                const char *spec = c ? codec : TRAIN_DENSE;
                train_run *r = add_run(o, spec, spec, 0);
                r->ef = strstr(spec, "ef=1") != NULL;
                snprintf(r->aggregator, sizeof r->aggregator, "%s", train_robust_aggregators[g]);
                r->attack = (train_attack)a;
                r->byz_k = a == ATTACK_NONE ? 0 : TRAIN_ROBUST_BYZANTINE;
                /* a sign step of lr moves every coordinate by lr */
                if (!strcmp(train_robust_aggregators[g], "signvote"))
                    r->lr_factor = TRAIN_ROBUST_SIGN_LR;
            }
}

/* The fed sweep (--fed-sweep): the baseline, synchronous SGD through the
 * server with every client every step for --epochs epochs; then FedAvg on
 * iid and dirichlet:TRAIN_FED_ALPHA shards, dense and with codec. */
static void fed_sweep_runs(train_options *o, const char *codec) {
    o->n_runs = 0;
    train_run *b = add_run(o, "sync SGD", TRAIN_DENSE, 0);
    b->fed_epochs = 0;
    b->alpha = 0;
    for (int p = 0; p < 2; p++)
        for (int c = 0; c < 2; c++) {
            const char *spec = c ? codec : TRAIN_DENSE;
            char label[64];
            snprintf(label, sizeof label, "fedavg:%d %s %s", o->fed_epochs,
                     p ? "dir" TRAIN_FED_ALPHA_TEXT : "iid", spec);
            train_run *r = add_run(o, label, spec, 0);
            r->ef = strstr(spec, "ef=1") != NULL;
            r->alpha = p ? TRAIN_FED_ALPHA : 0;
        }
}

/* The CNN's sweep (--sweep --model cnn): a run costs about ten times an MLP
 * run, so fewer configurations, and TRAIN_SWEEP_CNN_SEEDS seeds. */
static void cnn_sweep_runs(train_options *o) {
    o->n_runs = 0;
    add_run(o, "dense", TRAIN_DENSE, 0);
    add_run(o, "qsgd 4-bit", "qsgd:bits=4,bucket=128", 1);
    add_run(o, "sign", "sign:bucket=256", 1);
    train_run *r = add_run(o, "topk 1% DGC", "topk:ratio=0.01", 1);
    r->local_momentum = r->mask_momentum = 1;
    add_run(o, "powersgd r1", "powersgd:rank=1", 1);
    add_run(o, "powersgd r2", "powersgd:rank=2", 1);
    add_run(o, "powersgd r4", "powersgd:rank=4", 1);
    r = add_run(o, "accordion r4/r2", "powersgd:rank=4,ef=1", 0);
    r->ef = r->adapt = 1;
    snprintf(r->adapt_high, sizeof r->adapt_high, "powersgd:rank=2,ef=1");
    r->adapt_eta = 0.5;
}

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, WHO ": ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (try terse-bench train --help)\n");
    return BENCH_EXIT_USAGE;
}

/* A codec spec must build a codec for every tensor it will compress (rows x
 * cols; the bucket of small tensors is one column); a tensor name must be
 * one of the model's. Checked here, before any process starts, so a typo
 * costs no launch. */
static int check_shape(const char *spec, const char *where, size_t rows, size_t cols) {
    if (strcmp(spec, TRAIN_DENSE) == 0) return 0;
    terse_codec *c = NULL;
    terse_status s = terse_codec_create(spec, rows, cols, &c);
    if (s != TERSE_OK) {
        fprintf(stderr, WHO ": %s '%s' (for a %zux%zu tensor): %s (%s)\n", where, spec, rows,
                cols, terse_last_error(), terse_status_name(s));
        return -1;
    }
    terse_codec_free(c);
    return 0;
}

const char *train_override_for(const train_options *o, const char *name) {
    size_t len = strlen(name);
    for (size_t i = 0; i < o->n_overrides; i++)
        if (strncmp(o->overrides[i], name, len) == 0 && o->overrides[i][len] == '=')
            return o->overrides[i] + len + 1;
    return NULL;
}

/* large: spec is the run's codec, for the tensors of --small elements and
 * more that no --codec-for takes; otherwise the small-tensor bucket's, for
 * the others that no --codec-for takes (the rule of train_spec_for). *users
 * (if not NULL) gets how many tensors the spec serves. */
static int check_spec(const train_options *o, const char *spec, const char *where, int large,
                      int *users) {
    if (users) *users = 0;
    model *m = model_create(o->model, 1, 0);
    if (!m) return check_shape(spec, where, MODEL_HIDDEN, MODEL_INPUTS);
    int rc = 0;
    size_t bucket = 0;
    for (size_t i = 0; i < model_tensor_count(m) && rc == 0; i++) {
        const model_tensor *t = model_tensor_at(m, i);
        if (train_override_for(o, t->name)) continue;
        if (t->n < (size_t)o->small) {
            bucket += t->n;
        } else if (large) {
            rc = check_shape(spec, where, t->rows, t->cols);
            if (users) ++*users;
        }
    }
    if (rc == 0 && !large && bucket) {
        rc = check_shape(spec, where, bucket, 1);
        if (users) *users = 1;
    }
    model_free(m);
    return rc;
}

/* 0 if ov is NAME=SPEC for a tensor of the model and SPEC builds for it; -1
 * for a name the model has not (tensor names go into *names), -2 for a
 * spec that does not build. */
static int check_override(const train_options *o, const char *ov, char *names, size_t cap) {
    const char *eq = strchr(ov, '=');
    size_t len = eq ? (size_t)(eq - ov) : 0;
    model *m = model_create(o->model, 1, 0);
    if (!m) return -1;
    int rc = -1;
    names[0] = '\0';
    for (size_t i = 0; i < model_tensor_count(m); i++) {
        const model_tensor *t = model_tensor_at(m, i);
        size_t used = strlen(names);
        snprintf(names + used, cap - used, "%s%s", used ? " " : "", t->name);
        if (rc == -1 && len && strlen(t->name) == len && strncmp(t->name, ov, len) == 0)
            rc = check_shape(eq + 1, "--codec-for", t->rows, t->cols) == 0 ? 0 : -2;
    }
    model_free(m);
    return rc;
}

/* What parsing remembers besides the options themselves. */
typedef struct {
    const char *codec;
    int have_codec, have_seeds, have_small_codec, have_schedule, have_lr;
    int have_workers, have_mode, have_momentum_at, have_clients, have_partition;
    train_run adapt; /* --adapt, parsed */
} parse_state;

/* Options that take a value (the next argument). */
static int takes_value(const char *a) {
    static const char *const names[] = {
        "--model", "-n", "--workers", "--epochs", "--batch", "--lr", "--momentum",
        "--momentum-at", "--schedule", "--warmup", "--seed", "--seeds", "--mode", "--dp", "--codec", "--codec-for",
        "--small", "--small-codec", "--adapt", "--provider", "--servers", "--aggregator", "--byzantine", "--straggler", "--data", "--train-limit", "--test-limit",
        "--eval-every", "--target-acc", "--plot", "--results", "--clients", "--fraction",
        "--partition", "--rounds", "--dropout", "--deadline-ms", NULL};
    for (size_t i = 0; names[i]; i++)
        if (strcmp(a, names[i]) == 0) return 1;
    return 0;
}

/* The model and optimisation options. 0 handled, -1 not one of these, or
 * an exit code. */
static int training_option(train_options *o, parse_state *ps, const char *a, const char *v) {
    long n;
    if (strcmp(a, "--model") == 0) {
        if (model_kind_parse(v, &o->model) != 0)
            return usage_error("--model '%s': expected softmax, mlp or cnn", v);
    } else if (strcmp(a, "-n") == 0 || strcmp(a, "--workers") == 0) {
        if (parse_int(v, 1, 256, &n) != 0)
            return usage_error("--workers '%s': expected an integer in [1, 256]", v);
        o->workers = (int)n;
        ps->have_workers = 1;
    } else if (strcmp(a, "--epochs") == 0) {
        if (parse_int(v, 1, 1000, &n) != 0)
            return usage_error("--epochs '%s': expected an integer in [1, 1000]", v);
        o->epochs = (int)n;
    } else if (strcmp(a, "--batch") == 0) {
        if (parse_int(v, 1, 65536, &n) != 0)
            return usage_error("--batch '%s': expected an integer in [1, 65536]", v);
        o->batch = (size_t)n;
    } else if (strcmp(a, "--lr") == 0) {
        if (parse_double(v, 0.0, 1e3, &o->lr) != 0)
            return usage_error("--lr '%s': expected a number in [0, 1000]", v);
        ps->have_lr = 1;
    } else if (strcmp(a, "--schedule") == 0) {
        if (parse_schedule(v, o) != 0)
            return usage_error("--schedule '%s': expected none, cosine or step:F1,F2,... with "
                               "increasing fractions in (0, 1) (at most 4)", v);
        ps->have_schedule = 1;
    } else if (strcmp(a, "--warmup") == 0) {
        if (parse_double(v, 0.0, 0.5, &o->warmup) != 0)
            return usage_error("--warmup '%s': expected a fraction of the steps in [0, 0.5]", v);
    } else if (strcmp(a, "--momentum") == 0) {
        if (parse_double(v, 0.0, 0.999999, &o->momentum) != 0)
            return usage_error("--momentum '%s': expected a number in [0, 1)", v);
    } else if (strcmp(a, "--momentum-at") == 0) {
        if (strcmp(v, "local") != 0 && strcmp(v, "global") != 0)
            return usage_error("--momentum-at '%s': expected local or global", v);
        o->local_momentum = strcmp(v, "local") == 0;
        ps->have_momentum_at = 1;
    } else if (strcmp(a, "--seed") == 0) {
        if (parse_u64(v, &o->seed) != 0)
            return usage_error("--seed '%s': expected an unsigned 64-bit integer", v);
    } else if (strcmp(a, "--seeds") == 0) {
        if (parse_int(v, 1, 100, &n) != 0)
            return usage_error("--seeds '%s': expected an integer in [1, 100]", v);
        o->seeds = (int)n;
        ps->have_seeds = 1;
    } else if (strcmp(a, "--mode") == 0) {
        ps->have_mode = 1;
        int rc = parse_mode(v, o);
        if (rc > 0) return rc;
        if (rc != 0)
            return usage_error("--mode '%s': expected allreduce, localsgd:H (H >= 1), "
                               "ps:sync|ps:sync:quorum=K|ps:async|ps:ssp:S or fedavg:E "
                               "(E >= 1)", v);
    } else if (strcmp(a, "--servers") == 0) {
        if (parse_int(v, 1, 64, &n) != 0)
            return usage_error("--servers '%s': expected an integer in [1, 64]", v);
        o->servers = (int)n;
    } else if (strcmp(a, "--straggler") == 0) {
        char *colon = strchr(v, ':'), *end = NULL;
        double f = colon ? strtod(colon + 1, &end) : 0;
        char idx[32] = "";
        if (colon && (size_t)(colon - v) < sizeof idx) memcpy(idx, v, (size_t)(colon - v));
        if (!colon || parse_int(idx, 0, 255, &n) != 0 || !end || *end || !(f >= 1.0 && f <= 100.0))
            return usage_error("--straggler '%s': expected W:F, a worker index and a slowdown "
                               "factor in [1, 100] (e.g. 3:3)", v);
        o->straggler = (int)n;
        o->straggler_factor = f;
    } else if (strcmp(a, "--aggregator") == 0) {
        if (strlen(v) >= sizeof o->aggregator || !*v)
            return usage_error("--aggregator '%s': expected a spec of 1 to 63 characters", v);
        snprintf(o->aggregator, sizeof o->aggregator, "%s", v);
    } else if (strcmp(a, "--byzantine") == 0) {
        if (train_attack_parse(v, &o->byz_k, &o->byz_attack) != 0)
            return usage_error("--byzantine '%s': expected K:ATTACK, K >= 1 workers and ATTACK "
                               "one of signflip, noise, labelflip, alie, ipm", v);
    } else if (strcmp(a, "--clients") == 0) {
        if (parse_int(v, 1, 255, &n) != 0)
            return usage_error("--clients '%s': expected an integer in [1, 255]", v);
        if (ps->have_workers && o->workers != (int)n)
            return usage_error("%s", "--clients and --workers differ: in fedavg mode each "
                                     "client is a worker process; give one of them");
        o->workers = (int)n;
        ps->have_workers = ps->have_clients = 1;
    } else if (strcmp(a, "--fraction") == 0) {
        if (parse_double(v, 1e-9, 1.0, &o->fraction) != 0)
            return usage_error("--fraction '%s': expected a fraction in (0, 1]", v);
    } else if (strcmp(a, "--partition") == 0) {
        if (strcmp(v, "iid") == 0)
            o->alpha = 0;
        else if (strncmp(v, "dirichlet:", 10) != 0 || parse_double(v + 10, 1e-3, 1e6, &o->alpha) != 0)
            return usage_error("--partition '%s': expected iid or dirichlet:ALPHA (ALPHA in "
                               "[0.001, 1e6]; small is skewed, e.g. dirichlet:0.3)", v);
        ps->have_partition = 1;
    } else if (strcmp(a, "--rounds") == 0) {
        if (parse_int(v, 1, 100000, &n) != 0)
            return usage_error("--rounds '%s': expected an integer in [1, 100000]", v);
        o->rounds = (int)n;
    } else if (strcmp(a, "--dropout") == 0) {
        if (parse_double(v, 0.0, 0.99, &o->dropout) != 0)
            return usage_error("--dropout '%s': expected a probability in [0, 0.99]", v);
    } else if (strcmp(a, "--deadline-ms") == 0) {
        if (parse_int(v, 1, 1 << 30, &n) != 0)
            return usage_error("--deadline-ms '%s': expected a positive number of milliseconds", v);
        o->deadline_ms = (int)n;
    } else if (strcmp(a, "--dp") == 0) {
        if (parse_dp(v, o) != 0)
            return usage_error("--dp '%s': expected clip=C,noise=S with C > 0, S >= 0", v);
    } else {
        return -1;
    }
    return 0;
}

/* Compression, data, evaluation and output options: as training_option. */
static int other_option(train_options *o, parse_state *ps, const char *a, const char *v) {
    long n;
    uint64_t u;
    if (strcmp(a, "--codec") == 0) {
        ps->codec = v;
        ps->have_codec = 1;
    } else if (strcmp(a, "--codec-for") == 0) {
        if (o->n_overrides >= TRAIN_MAX_OVERRIDES)
            return usage_error("too many --codec-for options (at most %s)", "8");
        o->overrides[o->n_overrides++] = v;
    } else if (strcmp(a, "--small") == 0) {
        if (parse_int(v, 0, 1L << 30, &n) != 0)
            return usage_error("--small '%s': expected an element count", v);
        o->small = (int)n;
    } else if (strcmp(a, "--adapt") == 0) {
        if (parse_adapt(v, &ps->adapt) != 0)
            return usage_error("--adapt '%s': expected accordion:low=SPEC,high=SPEC with "
                               "optional ,eta=X (> 0) and ,every=K (steps >= 1)", v);
        o->adapt = v;
    } else if (strcmp(a, "--small-codec") == 0) {
        o->small_codec = v;
        ps->have_small_codec = 1;
    } else if (strcmp(a, "--provider") == 0) {
        o->provider = v;
    } else if (strcmp(a, "--data") == 0) {
        o->data_dir = v;
    } else if (strcmp(a, "--train-limit") == 0) {
        if (parse_u64(v, &u) != 0 || u == 0)
            return usage_error("--train-limit '%s': expected a positive count", v);
        o->train_limit = (size_t)u;
    } else if (strcmp(a, "--test-limit") == 0) {
        if (parse_u64(v, &u) != 0 || u == 0)
            return usage_error("--test-limit '%s': expected a positive count", v);
        o->test_limit = (size_t)u;
    } else if (strcmp(a, "--eval-every") == 0) {
        if (parse_int(v, 1, 1L << 30, &n) != 0)
            return usage_error("--eval-every '%s': expected a positive step count", v);
        o->eval_every = (int)n;
    } else if (strcmp(a, "--target-acc") == 0) {
        if (parse_double(v, 1e-9, 100.0, &o->target_acc) != 0)
            return usage_error("--target-acc '%s': expected a percentage in (0, 100]", v);
    } else if (strcmp(a, "--plot") == 0) {
        o->plot = v;
    } else if (strcmp(a, "--results") == 0) {
        o->results = v;
    } else {
        return -1;
    }
    return 0;
}

/* Options without a value. 0 handled, -1 unknown. */
static int flag_option(train_options *o, const char *a) {
    if (strcmp(a, "--mask-momentum") == 0)
        o->mask_momentum = 1;
    else if (strcmp(a, "--sweep") == 0)
        o->sweep = 1;
    else if (strcmp(a, "--sweep-full") == 0)
        o->sweep = o->sweep_full = 1;
    else if (strcmp(a, "--robust-sweep") == 0)
        o->robust_sweep = 1;
    else if (strcmp(a, "--fed-sweep") == 0)
        o->fed_sweep = 1;
    else if (strcmp(a, "--csv") == 0)
        o->csv = 1;
    else if (strcmp(a, "--json") == 0)
        o->json = 1;
    else if (strcmp(a, "-q") == 0 || strcmp(a, "--quiet") == 0)
        o->quiet = 1;
    else if (strcmp(a, "--worker") == 0)
        o->worker = 1;
    else
        return -1;
    return 0;
}

/* Options that are each fine but do not go together. */
static int check_combinations(const train_options *o, const parse_state *ps) {
    if (o->csv && o->json) return usage_error("%s", "--csv and --json exclude each other");
    if (strlen(ps->codec) >= sizeof o->runs[0].codec || strlen(o->small_codec) >= 128)
        return usage_error("%s", "a codec spec is longer than 127 characters");
    for (size_t i = 0; i < o->n_overrides; i++) {
        if (strlen(o->overrides[i]) >= 256)
            return usage_error("--codec-for '%s': longer than 255 characters", o->overrides[i]);
        size_t len = strcspn(o->overrides[i], "=");
        for (size_t j = 0; j < i; j++)
            if (strncmp(o->overrides[j], o->overrides[i], len + 1) == 0)
                return usage_error("--codec-for '%s': that tensor already has a codec",
                                   o->overrides[i]);
    }
    if (o->sweep && o->n_overrides)
        return usage_error("%s", "--sweep chooses the codecs itself; drop --codec-for");
    if (o->sweep && o->workers < 2)
        return usage_error("%s", "--sweep compares bytes on the network: it needs --workers 2 "
                                 "or more");
    if (o->sweep && (o->local_momentum || o->mask_momentum))
        return usage_error("%s", "--sweep sets the momentum of each run (its DGC rows); drop "
                                 "--momentum-at and --mask-momentum");
    if (o->mask_momentum && !o->local_momentum)
        return usage_error("%s", "--mask-momentum needs --momentum-at local");
    if (o->local_momentum && o->mode == TRAIN_MODE_LOCALSGD)
        return usage_error("%s", "--momentum-at local applies to --mode allreduce and ps only");
    if (o->mask_momentum && o->mode == TRAIN_MODE_PS)
        return usage_error("%s", "--mask-momentum applies to --mode allreduce only");
    if ((o->aggregator[0] || o->byz_attack != ATTACK_NONE) && o->mode != TRAIN_MODE_PS &&
        o->mode != TRAIN_MODE_FEDAVG) /* fedavg says why below */
        return usage_error("%s", "--aggregator and --byzantine apply to --mode ps:... only");
    if (o->byz_attack != ATTACK_NONE && o->byz_k >= o->workers) {
        char why[128];
        snprintf(why, sizeof why, "%d:%s: at most %d of %d workers", o->byz_k,
                 train_attack_name(o->byz_attack), o->workers - 1, o->workers);
        return usage_error("--byzantine %s (worker 0 stays honest: it takes the snapshots the "
                           "evaluation reads)", why);
    }
    if (o->plot && strpbrk(o->plot, "'\"\n\\"))
        return usage_error("--plot '%s': the path may not contain quotes, backslashes or "
                           "line breaks", o->plot);
    if (o->adapt && (o->sweep || ps->have_codec || o->mode != TRAIN_MODE_ALLREDUCE))
        return usage_error("%s", "--adapt chooses the codecs of one synchronous run: drop "
                                 "--codec, --sweep and --mode");
    if (o->sweep && ps->have_codec)
        return usage_error("%s", "--sweep chooses the codecs itself; drop --codec");
    if (o->sweep && o->mode != TRAIN_MODE_ALLREDUCE)
        return usage_error("%s", "--sweep sets the mode of each run; drop --mode");
    if (o->aggregator[0] && terse_ps_aggregator_check(o->aggregator, o->workers) != TERSE_OK)
        return usage_error("--aggregator: %s", terse_last_error());
    if (o->byz_attack == ATTACK_ALIE && o->byz_k > o->workers / 2) {
        char why[96];
        snprintf(why, sizeof why, "%d:alie with %d workers", o->byz_k, o->workers);
        return usage_error("--byzantine %s: ALIE's z needs the attackers to be at most half "
                           "the workers (s = n/2 + 1 - K >= 1)", why);
    }
    if (o->robust_sweep && (o->sweep || o->aggregator[0] || o->byz_attack != ATTACK_NONE))
        return usage_error("%s", "--robust-sweep runs every aggregator against every attack: "
                                 "drop --sweep, --aggregator and --byzantine");
    if (o->robust_sweep && (o->mode != TRAIN_MODE_PS || strcmp(o->ps_mode, "sync") != 0))
        return usage_error("%s", "--robust-sweep runs --mode ps:sync (the aggregators combine "
                                 "the pushes of a step)");
    if (o->robust_sweep && o->workers < 7)
        return usage_error("%s", "--robust-sweep has 2 Byzantine workers and Krum with f=2, "
                                 "which needs --workers 7 or more");
    if (o->robust_sweep && ps->have_codec && strcmp(ps->codec, TRAIN_DENSE) == 0)
        return usage_error("%s", "--robust-sweep's --codec is its compressed half (dense runs "
                                 "anyway): give a codec, e.g. int8:ef=1");
    if (o->servers && o->mode != TRAIN_MODE_PS && o->mode != TRAIN_MODE_FEDAVG)
        return usage_error("%s", "--servers applies to --mode ps:... and fedavg:E only");
    if (o->mode != TRAIN_MODE_FEDAVG &&
        (ps->have_clients || o->fraction > 0 || ps->have_partition || o->rounds ||
         o->dropout > 0 || o->deadline_ms))
        return usage_error("%s", "--clients, --fraction, --partition, --rounds, --dropout and "
                                 "--deadline-ms apply to --mode fedavg:E (or --fed-sweep) only");
    if (o->mode == TRAIN_MODE_FEDAVG && o->dropout > 0 && !o->deadline_ms)
        return usage_error("%s", "--dropout needs --deadline-ms: a round waits for its sampled "
                                 "clients until their deadline");
    if (o->mode == TRAIN_MODE_FEDAVG &&
        (o->aggregator[0] || o->byz_attack != ATTACK_NONE || o->local_momentum ||
         o->straggler >= 0 || o->sweep || o->robust_sweep))
        return usage_error("%s", "--mode fedavg:E averages the clients' models weighted by "
                                 "examples: it takes neither --aggregator, --byzantine, "
                                 "--momentum-at local, --straggler nor the other sweeps");
    if (o->fed_sweep && o->mode != TRAIN_MODE_FEDAVG)
        return usage_error("%s", "--fed-sweep runs --mode fedavg:E (fedavg:1 unless given)");
    if (o->fed_sweep && ps->have_partition)
        return usage_error("%s", "--fed-sweep runs both partitions (iid and dirichlet:" TRAIN_FED_ALPHA_TEXT
                                 "); drop --partition");
    if (o->straggler >= o->workers) {
        char why[96];
        snprintf(why, sizeof why, "%d: there are only %d workers", o->straggler, o->workers);
        return usage_error("--straggler %s", why);
    }
    if (o->straggler == 0 && o->mode == TRAIN_MODE_PS)
        return usage_error("%s", "--straggler 0: in ps mode worker 0 takes the snapshots the "
                                 "evaluation reads; make another worker the straggler");
    if ((o->mode == TRAIN_MODE_PS || o->mode == TRAIN_MODE_FEDAVG) && (o->dp || o->n_overrides))
        return usage_error("%s", "--mode ps:... takes neither --dp nor --codec-for");
    if ((o->mode == TRAIN_MODE_PS || o->mode == TRAIN_MODE_FEDAVG) && ps->have_schedule &&
        o->schedule != TRAIN_SCHED_NONE)
        return usage_error("%s", "--mode ps:... and fedavg:E run a constant learning rate: "
                                 "drop --schedule (or give --schedule none)");
    if ((o->mode == TRAIN_MODE_PS || o->mode == TRAIN_MODE_FEDAVG) && o->workers + (o->servers ? o->servers : 1) > 256)
        return usage_error("%s", "too many processes");
    if (o->sweep_full && o->model == MODEL_CNN)
        return usage_error("%s", "--sweep-full is the MLP's; the cnn's sweep is --sweep");
    if (o->sweep && o->model == MODEL_SOFTMAX)
        return usage_error("%s", "--sweep trains the mlp or the cnn, not softmax");
    if (o->plot && !o->sweep && !o->robust_sweep && !o->fed_sweep)
        return usage_error("%s", "--plot draws a sweep: add --sweep, --robust-sweep or "
                                 "--fed-sweep");
    return 0;
}

/* The list of runs (the sweep's, or the one --codec asks for), once per
 * seed, and, in the launcher, every codec spec tried before anything runs. */
static int build_runs(train_options *o, const parse_state *ps) {
    if (o->fed_sweep) {
        fed_sweep_runs(o, ps->have_codec ? ps->codec : TRAIN_FED_CODEC);
        if (!o->plot) o->plot = "terse-fed.png";
        if (!ps->have_seeds) o->seeds = 1;
    } else if (o->robust_sweep) {
        robust_sweep_runs(o, ps->have_codec ? ps->codec : TRAIN_ROBUST_CODEC);
        if (!o->plot) o->plot = "terse-robust.png";
        if (!ps->have_seeds) o->seeds = 1;
    } else if (o->sweep) {
        int cnn = o->model == MODEL_CNN;
        if (cnn)
            cnn_sweep_runs(o);
        else
            sweep_runs(o);
        if (!o->plot) o->plot = cnn ? "terse-sweep-cnn.png" : "terse-sweep.png";
        if (!ps->have_seeds) o->seeds = cnn ? TRAIN_SWEEP_CNN_SEEDS : TRAIN_SWEEP_SEEDS;
        if (!ps->have_small_codec) o->small_codec = TRAIN_SWEEP_SMALL_CODEC;
    } else {
        /* Label what runs: the codec, or "custom" when --codec-for changes it. */
        if (o->adapt) {
            train_run *r = add_run(o, "accordion", ps->adapt.codec, 0);
            snprintf(r->adapt_high, sizeof r->adapt_high, "%s", ps->adapt.adapt_high);
            r->adapt = 1;
            r->adapt_eta = ps->adapt.adapt_eta;
            r->adapt_every = ps->adapt.adapt_every;
        } else {
            char label[64];
            if (o->mode == TRAIN_MODE_FEDAVG)
            {
                char part[32] = "iid";
                if (o->alpha > 0) snprintf(part, sizeof part, "dir%g", o->alpha);
                snprintf(label, sizeof label, "fedavg:%d %s %.40s", o->fed_epochs, part, ps->codec);
            }
            add_run(o, o->mode == TRAIN_MODE_FEDAVG ? label : o->n_overrides ? "custom" : ps->codec,
                    ps->codec, 0);
        }
        o->runs[0].ef = strstr(o->runs[0].codec, "ef=1") != NULL;
        if (!ps->have_seeds) o->seeds = 1;
    }
    if (o->n_runs * (size_t)o->seeds > TRAIN_MAX_RUNS)
        return usage_error("%s", "too many runs: configurations x --seeds exceeds 512");
    expand_seeds(o);
    if (o->worker) return 0;
    /* Once per configuration: seeds of a group share its spec. */
    for (size_t i = 0; i < o->n_runs; i++)
        if ((i == 0 || o->runs[i].group != o->runs[i - 1].group) &&
            (check_spec(o, o->runs[i].codec, "--codec", 1, NULL) != 0 ||
             (o->runs[i].adapt &&
              check_spec(o, o->runs[i].adapt_high, "--adapt high", 1, NULL) != 0)))
            return BENCH_EXIT_USAGE;
    if (check_spec(o, o->small_codec, "--small-codec", 0, NULL) != 0) return BENCH_EXIT_USAGE;
    int adaptive = 0;
    if (o->adapt && check_spec(o, o->runs[0].codec, "--adapt low", 1, &adaptive) == 0 &&
        adaptive == 0)
        return usage_error("%s", "--adapt: every large tensor has a --codec-for of its own, so "
                                 "none would adapt (the bucket of small tensors never does)");
    for (size_t i = 0; i < o->n_overrides; i++) {
        char names[128];
        int rc = check_override(o, o->overrides[i], names, sizeof names);
        if (rc == -1) {
            fprintf(stderr, WHO ": --codec-for '%s': expected TENSOR=SPEC with a tensor of the "
                            "%s model (%s) (try terse-bench train --help)\n",
                    o->overrides[i], model_kind_name(o->model), names);
            return BENCH_EXIT_USAGE;
        }
        if (rc != 0) return BENCH_EXIT_USAGE;
    }
    return 0;
}

int train_parse_args(int argc, char **argv, train_options *o) {
    memset(o, 0, sizeof *o);
    o->model = MODEL_MLP;
    o->workers = 2;
    o->epochs = 2;
    o->batch = 64;
    o->lr = 0.1;
    o->momentum = 0.9;
    o->seed = 1;
    o->data_dir = TRAIN_DEFAULT_DATA;
    o->small = 4096;
    o->small_codec = TRAIN_DENSE;
    o->straggler = -1;
    o->schedule = TRAIN_SCHED_COSINE;
    o->warmup = 0.05;
    static parse_state ps;
    memset(&ps, 0, sizeof ps);
    ps.codec = TRAIN_DENSE;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return -1;
        }
        int rc;
        if (takes_value(a)) {
            if (i + 1 >= argc) return usage_error("option '%s' needs a value", a);
            const char *v = argv[++i];
            rc = training_option(o, &ps, a, v);
            if (rc == -1) rc = other_option(o, &ps, a, v);
        } else {
            rc = flag_option(o, a);
        }
        if (rc == -1) return usage_error("unknown option '%s'", a);
        if (rc != 0) return rc;
    }
    if (o->robust_sweep) { /* its defaults: 8 workers, ps:sync, worker momentum */
        if (!ps.have_workers) o->workers = 8;
        if (!ps.have_mode) {
            o->mode = TRAIN_MODE_PS;
            snprintf(o->ps_mode, sizeof o->ps_mode, "sync");
        }
        if (!ps.have_momentum_at) o->local_momentum = 1;
    }
    if (o->fed_sweep && !ps.have_mode) {
        o->mode = TRAIN_MODE_FEDAVG;
        o->fed_epochs = 1;
    }
    if (o->mode == TRAIN_MODE_FEDAVG) { /* its defaults */
        if (!ps.have_workers) o->workers = TRAIN_FED_CLIENTS;
        if (o->fraction == 0) o->fraction = TRAIN_FED_FRACTION;
        if (!o->rounds) o->rounds = TRAIN_FED_ROUNDS;
    }
    int rc = check_combinations(o, &ps);
    if (rc != 0) return rc;
    if (o->mode == TRAIN_MODE_PS || o->mode == TRAIN_MODE_FEDAVG) o->schedule = TRAIN_SCHED_NONE;
    if (o->model == MODEL_CNN && !ps.have_lr) o->lr = TRAIN_CNN_LR;
    if (o->target_acc > 0 && o->eval_every == 0 && !o->worker && !o->quiet)
        fprintf(stderr, WHO ": note: without --eval-every the time to --target-acc is only "
                        "measured at epoch ends\n");
    return build_runs(o, &ps);
}

/* ---------------------------------------------------------------- launcher */

int train_launch(int argc, char **argv, const train_options *o) {
    char results[PATH_MAX];
    if (bench_temp_file("train", results, sizeof results) != 0) {
        fprintf(stderr, WHO ": cannot create a temporary file: %s\n", strerror(errno));
        return BENCH_EXIT_RUNTIME;
    }
    /* Workers run OpenBLAS on one thread each (train_worker.c), for
     * determinism; nothing to share out. */
    int rc = bench_run_workers(WHO, train_processes(o), o->provider ? o->provider : "shm", argc,
                               argv, results, 1);
    train_record *recs = NULL;
    int n = train_record_read_all(results, &recs);
    unlink(results);
    if (bench_interrupted()) {
        free(recs);
        return 128 + bench_interrupted();
    }
    if (n <= 0) {
        fprintf(stderr, WHO ": no results from the workers (terse-run exit status %d)\n", rc);
        free(recs);
        return BENCH_EXIT_RUNTIME;
    }
    train_report(o, recs, n);
    int failed = rc != 0;
    if (rc != 0) fprintf(stderr, WHO ": the workers failed (terse-run exit status %d)\n", rc);
    int finals = 0;
    for (int i = 0; i < n; i++) finals += recs[i].final;
    if (finals < (int)o->n_runs) {
        fprintf(stderr, WHO ": only %d of %zu runs finished\n", finals, o->n_runs);
        failed = 1;
    }
    if (o->sweep && o->plot && train_plot(o, recs, n) != 0) failed = 1;
    if (o->robust_sweep && o->plot && train_robust_plot(o, recs, n) != 0) failed = 1;
    if (o->fed_sweep && o->plot && train_fed_plot(o, recs, n) != 0) failed = 1;
    free(recs);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, WHO ": cannot write the results\n");
        return BENCH_EXIT_RUNTIME;
    }
    return failed ? BENCH_EXIT_RUNTIME : BENCH_EXIT_OK;
}

int train_processes(const train_options *o) {
    int ps = o->mode == TRAIN_MODE_PS || o->mode == TRAIN_MODE_FEDAVG;
    return o->workers + (ps ? (o->servers ? o->servers : 1) : 0);
}

int bench_train_main(int argc, char **argv) {
    static train_options o;
    int rc = train_parse_args(argc, argv, &o);
    if (rc < 0) return fflush(stdout) == 0 ? BENCH_EXIT_OK : BENCH_EXIT_RUNTIME;
    if (rc > 0) return rc;
    if (o.worker || getenv("TERSE_RANK")) return train_worker_main(&o);
    return train_launch(argc, argv, &o);
}
