/* terse-bench train: what runs. Which options go together, the sweeps'
 * lists of runs (--sweep, --robust-sweep, --fed-sweep), every run once per
 * seed, and every codec spec tried on the model's tensors before anything
 * starts (train.h). */
#include <stdio.h>
#include <string.h>

#include <terse.h>

#include "core/bench.h"
#include "train/train.h"

#define WHO "terse-bench train"
/* The sweep's defaults: seeds per configuration (7: the paired 95% intervals
 * of most rows are then within 0.3 point each way, and the sweep within
 * 5 minutes on 2 cores; docs/training.md),
 * and the codec of the small-tensor bucket in compressed runs. */
#define TRAIN_SWEEP_SEEDS 7
#define TRAIN_SWEEP_SMALL_CODEC "int8:ef=1"
#define TRAIN_SWEEP_CNN_SEEDS 4
/* The fed sweep's compressed codec and its non-iid partition. */
#define TRAIN_FED_CODEC "int8:ef=1"
#define TRAIN_FED_ALPHA 0.3
#define TRAIN_FED_ALPHA_TEXT "0.3"

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

/* Options that are each fine but do not go together. */
int train_check_combinations(const train_options *o, const train_parse_state *ps) {
    if (o->csv && o->json) return train_usage_error("%s", "--csv and --json exclude each other");
    if (strlen(ps->codec) >= sizeof o->runs[0].codec || strlen(o->small_codec) >= 128)
        return train_usage_error("%s", "a codec spec is longer than 127 characters");
    for (size_t i = 0; i < o->n_overrides; i++) {
        if (strlen(o->overrides[i]) >= 256)
            return train_usage_error("--codec-for '%s': longer than 255 "
                                     "characters", o->overrides[i]);
        size_t len = strcspn(o->overrides[i], "=");
        for (size_t j = 0; j < i; j++)
            if (strncmp(o->overrides[j], o->overrides[i], len + 1) == 0)
                return train_usage_error("--codec-for '%s': that tensor already has a codec",
                                   o->overrides[i]);
    }
    if (o->sweep && o->n_overrides)
        return train_usage_error("%s", "--sweep chooses the codecs itself; drop --codec-for");
    if (o->sweep && o->workers < 2)
        return train_usage_error("%s", "--sweep compares bytes on the network: it needs --workers "
                                       "2 or more");
    if (o->sweep && (o->local_momentum || o->mask_momentum))
        return train_usage_error("%s", "--sweep sets the momentum of each run (its DGC rows); drop "
                                 "--momentum-at and --mask-momentum");
    if (o->mask_momentum && !o->local_momentum)
        return train_usage_error("%s", "--mask-momentum needs --momentum-at local");
    if (o->local_momentum && o->mode == TRAIN_MODE_LOCALSGD)
        return train_usage_error("%s", "--momentum-at local applies to --mode allreduce and ps "
                                       "only");
    if (o->mask_momentum && o->mode == TRAIN_MODE_PS)
        return train_usage_error("%s", "--mask-momentum applies to --mode allreduce only");
    if ((o->aggregator[0] || o->byz_attack != ATTACK_NONE) && o->mode != TRAIN_MODE_PS &&
        o->mode != TRAIN_MODE_FEDAVG) /* fedavg says why below */
        return train_usage_error("%s", "--aggregator and --byzantine apply to --mode ps:... only");
    if (o->byz_attack != ATTACK_NONE && o->byz_k >= o->workers) {
        char why[128];
        snprintf(why, sizeof why, "%d:%s: at most %d of %d workers", o->byz_k,
                 train_attack_name(o->byz_attack), o->workers - 1, o->workers);
        return train_usage_error("--byzantine %s (worker 0 stays honest: it takes the snapshots "
                                 "the evaluation reads)", why);
    }
    if (o->plot && strpbrk(o->plot, "'\"\n\\"))
        return train_usage_error("--plot '%s': the path may not contain quotes, backslashes or "
                           "line breaks", o->plot);
    if (o->adapt && (o->sweep || ps->have_codec || o->mode != TRAIN_MODE_ALLREDUCE))
        return train_usage_error("%s", "--adapt chooses the codecs of one synchronous run: drop "
                                 "--codec, --sweep and --mode");
    if (o->sweep && ps->have_codec)
        return train_usage_error("%s", "--sweep chooses the codecs itself; drop --codec");
    if (o->sweep && o->mode != TRAIN_MODE_ALLREDUCE)
        return train_usage_error("%s", "--sweep sets the mode of each run; drop --mode");
    if (o->aggregator[0] && terse_ps_aggregator_check(o->aggregator, o->workers) != TERSE_OK)
        return train_usage_error("--aggregator: %s", terse_last_error());
    if (o->byz_attack == ATTACK_ALIE && o->byz_k > o->workers / 2) {
        char why[96];
        snprintf(why, sizeof why, "%d:alie with %d workers", o->byz_k, o->workers);
        return train_usage_error("--byzantine %s: ALIE's z needs the attackers to be at most half "
                           "the workers (s = n/2 + 1 - K >= 1)", why);
    }
    if (o->robust_sweep && (o->sweep || o->aggregator[0] || o->byz_attack != ATTACK_NONE))
        return train_usage_error("%s", "--robust-sweep runs every aggregator against every attack: "
                                 "drop --sweep, --aggregator and --byzantine");
    if (o->robust_sweep && (o->mode != TRAIN_MODE_PS || strcmp(o->ps_mode, "sync") != 0))
        return train_usage_error("%s", "--robust-sweep runs --mode ps:sync (the aggregators "
                                       "combine the pushes of a step)");
    if (o->robust_sweep && o->workers < 7)
        return train_usage_error("%s", "--robust-sweep has 2 Byzantine workers and Krum with f=2, "
                                 "which needs --workers 7 or more");
    if (o->robust_sweep && ps->have_codec && strcmp(ps->codec, TRAIN_DENSE) == 0)
        return train_usage_error("%s", "--robust-sweep's --codec is its compressed half (dense "
                                       "runs anyway): give a codec, e.g. int8:ef=1");
    if (o->colocate && (o->mode != TRAIN_MODE_PS || o->servers))
        return train_usage_error("%s", "--colocate applies to --mode ps:... only, without "
                                       "--servers (every worker is also a server)");
    if (o->servers && o->mode != TRAIN_MODE_PS && o->mode != TRAIN_MODE_FEDAVG)
        return train_usage_error("%s", "--servers applies to --mode ps:... and fedavg:E only");
    if (o->mode != TRAIN_MODE_FEDAVG &&
        (ps->have_clients || o->fraction > 0 || ps->have_partition || o->rounds ||
         o->dropout > 0 || o->deadline_ms))
        return train_usage_error("%s", "--clients, --fraction, --partition, --rounds, --dropout "
                                       "and --deadline-ms apply to --mode fedavg:E (or "
                                       "--fed-sweep) only");
    if (o->mode == TRAIN_MODE_FEDAVG && o->dropout > 0 && !o->deadline_ms)
        return train_usage_error("%s", "--dropout needs --deadline-ms: a round waits for its "
                                       "sampled clients until their deadline");
    if (o->mode == TRAIN_MODE_FEDAVG &&
        (o->aggregator[0] || o->byz_attack != ATTACK_NONE || o->local_momentum ||
         o->straggler >= 0 || o->transient_p > 0 || o->sweep || o->robust_sweep))
        return train_usage_error("%s", "--mode fedavg:E averages the clients' models weighted by "
                                 "examples: it takes neither --aggregator, --byzantine, "
                                 "--momentum-at local, --straggler, --transient nor the other "
                                 "sweeps");
    if (o->fed_sweep && o->mode != TRAIN_MODE_FEDAVG)
        return train_usage_error("%s", "--fed-sweep runs --mode fedavg:E (fedavg:1 unless given)");
    if (o->fed_sweep && ps->have_partition)
        return train_usage_error("%s", "--fed-sweep runs both partitions (iid and dirichlet:"
                                       TRAIN_FED_ALPHA_TEXT "); drop --partition");
    if (o->straggler >= o->workers) {
        char why[96];
        snprintf(why, sizeof why, "%d: there are only %d workers", o->straggler, o->workers);
        return train_usage_error("--straggler %s", why);
    }
    if (o->straggler == 0 && o->mode == TRAIN_MODE_PS)
        return train_usage_error("%s", "--straggler 0: in ps mode worker 0 takes the snapshots the "
                                 "evaluation reads; make another worker the straggler");
    if ((o->mode == TRAIN_MODE_PS || o->mode == TRAIN_MODE_FEDAVG) && (o->dp || o->n_overrides))
        return train_usage_error("%s", "--mode ps:... takes neither --dp nor --codec-for");
    if (o->mode == TRAIN_MODE_FEDAVG && ps->have_schedule && o->schedule != TRAIN_SCHED_NONE)
        return train_usage_error("%s", "fedavg:E runs a constant learning rate: "
                                 "drop --schedule (or give --schedule none)");
    if (o->mode == TRAIN_MODE_PS && o->schedule == TRAIN_SCHED_STEP)
        return train_usage_error("%s", "--mode ps:... runs the server's schedules, constant or "
                                 "cosine: --schedule step is allreduce's only");
    if ((o->mode == TRAIN_MODE_PS || o->mode == TRAIN_MODE_FEDAVG) && o->workers + (o->servers ? o->servers : 1) > 256)
        return train_usage_error("%s", "too many processes");
    if (o->sweep_full && o->model == MODEL_CNN)
        return train_usage_error("%s", "--sweep-full is the MLP's; the cnn's sweep is --sweep");
    if (o->sweep && o->model == MODEL_SOFTMAX)
        return train_usage_error("%s", "--sweep trains the mlp or the cnn, not softmax");
    if (o->plot && !o->sweep && !o->robust_sweep && !o->fed_sweep)
        return train_usage_error("%s", "--plot draws a sweep: add --sweep, --robust-sweep or "
                                 "--fed-sweep");
    return 0;
}

/* The list of runs (the sweep's, or the one --codec asks for), once per
 * seed, and, in the launcher, every codec spec tried before anything runs. */
int train_build_runs(train_options *o, const train_parse_state *ps) {
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
        return train_usage_error("%s", "too many runs: configurations x --seeds exceeds 512");
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
        return train_usage_error("%s", "--adapt: every large tensor has a --codec-for of its own, "
                                       "so none would adapt (the bucket of small tensors never "
                                       "does)");
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

