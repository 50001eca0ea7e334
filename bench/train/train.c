/* terse-bench train: the command line and the launcher role (train.h).
 * Here: each option value's grammar, one handler per kind of option, the
 * defaults that depend on other options, and the launcher: start the
 * workers under terse-run, read back what rank 0 recorded, print the table
 * and draw the plot. The --help text is in train_usage.c; which options go
 * together, the sweeps' lists of runs and the codec checks in train_runs.c. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <terse.h>

#include "core/bench.h"
#include "train/train.h"

#define WHO "terse-bench train"
/* The CNN's default learning rate: at 0.1, seeds 1-3 ended at 87.36, 83.59
 * and 87.85% (one stalls); at 0.05, 87.69, 86.80, 86.89%. */
#define TRAIN_CNN_LR 0.05
/* fedavg's defaults (McMahan et al.'s C = 0.1 of 100 clients is 10 a round;
 * 2 cores hold 10 client processes, 3 of them training at once). */
#define TRAIN_FED_CLIENTS 10
#define TRAIN_FED_FRACTION 0.3
#define TRAIN_FED_ROUNDS 20

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

int train_usage_error(const char *fmt, const char *arg) {
    return bench_usage_error(WHO, fmt, arg);
}

/* Options that take a value (the next argument). */
static int takes_value(const char *a) {
    static const char *const names[] = {
        "--model", "-n", "--workers", "--epochs", "--batch", "--lr", "--momentum",
        "--momentum-at", "--schedule", "--warmup", "--seed", "--seeds", "--mode", "--dp", "--codec", "--codec-for",
        "--small", "--small-codec", "--adapt", "--provider", "--servers", "--aggregator", "--byzantine", "--straggler", "--transient", "--data", "--train-limit", "--test-limit",
        "--eval-every", "--target-acc", "--plot", "--results", "--clients", "--fraction",
        "--partition", "--rounds", "--dropout", "--deadline-ms", "--chunk-bytes", NULL};
    for (size_t i = 0; names[i]; i++)
        if (strcmp(a, names[i]) == 0) return 1;
    return 0;
}

/* The model and optimisation options. 0 handled, -1 not one of these, or
 * an exit code. */
static int training_option(train_options *o, train_parse_state *ps, const char *a,
                           const char *v) {
    long n;
    if (strcmp(a, "--model") == 0) {
        if (model_kind_parse(v, &o->model) != 0)
            return train_usage_error("--model '%s': expected softmax, mlp or cnn", v);
    } else if (strcmp(a, "-n") == 0 || strcmp(a, "--workers") == 0) {
        if (parse_int(v, 1, 256, &n) != 0)
            return train_usage_error("--workers '%s': expected an integer in [1, 256]", v);
        o->workers = (int)n;
        ps->have_workers = 1;
    } else if (strcmp(a, "--epochs") == 0) {
        if (parse_int(v, 1, 1000, &n) != 0)
            return train_usage_error("--epochs '%s': expected an integer in [1, 1000]", v);
        o->epochs = (int)n;
    } else if (strcmp(a, "--batch") == 0) {
        if (parse_int(v, 1, 65536, &n) != 0)
            return train_usage_error("--batch '%s': expected an integer in [1, 65536]", v);
        o->batch = (size_t)n;
    } else if (strcmp(a, "--lr") == 0) {
        if (parse_double(v, 0.0, 1e3, &o->lr) != 0)
            return train_usage_error("--lr '%s': expected a number in [0, 1000]", v);
        ps->have_lr = 1;
    } else if (strcmp(a, "--schedule") == 0) {
        if (parse_schedule(v, o) != 0)
            return train_usage_error("--schedule '%s': expected none, cosine or step:F1,F2,... "
                                     "with increasing fractions in (0, 1) (at most 4)", v);
        ps->have_schedule = 1;
    } else if (strcmp(a, "--warmup") == 0) {
        if (parse_double(v, 0.0, 0.5, &o->warmup) != 0)
            return train_usage_error("--warmup '%s': expected a fraction of the steps in [0, "
                                     "0.5]", v);
    } else if (strcmp(a, "--momentum") == 0) {
        if (parse_double(v, 0.0, 0.999999, &o->momentum) != 0)
            return train_usage_error("--momentum '%s': expected a number in [0, 1)", v);
    } else if (strcmp(a, "--momentum-at") == 0) {
        if (strcmp(v, "local") != 0 && strcmp(v, "global") != 0)
            return train_usage_error("--momentum-at '%s': expected local or global", v);
        o->local_momentum = strcmp(v, "local") == 0;
        ps->have_momentum_at = 1;
    } else if (strcmp(a, "--seed") == 0) {
        if (parse_u64(v, &o->seed) != 0)
            return train_usage_error("--seed '%s': expected an unsigned 64-bit integer", v);
    } else if (strcmp(a, "--seeds") == 0) {
        if (parse_int(v, 1, 100, &n) != 0)
            return train_usage_error("--seeds '%s': expected an integer in [1, 100]", v);
        o->seeds = (int)n;
        ps->have_seeds = 1;
    } else if (strcmp(a, "--mode") == 0) {
        ps->have_mode = 1;
        int rc = parse_mode(v, o);
        if (rc > 0) return rc;
        if (rc != 0)
            return train_usage_error("--mode '%s': expected allreduce, localsgd:H (H >= 1), "
                               "ps:sync|ps:sync:quorum=K|ps:async|ps:ssp:S or fedavg:E "
                               "(E >= 1)", v);
    } else if (strcmp(a, "--chunk-bytes") == 0) {
        if (parse_int(v, 64, 1L << 30, &n) != 0)
            return train_usage_error("--chunk-bytes '%s': expected a byte count in [64, 2^30]", v);
        o->ps_chunk_bytes = n;
    } else if (strcmp(a, "--servers") == 0) {
        if (parse_int(v, 1, 64, &n) != 0)
            return train_usage_error("--servers '%s': expected an integer in [1, 64]", v);
        o->servers = (int)n;
    } else if (strcmp(a, "--straggler") == 0) {
        char *colon = strchr(v, ':'), *end = NULL;
        double f = colon ? strtod(colon + 1, &end) : 0;
        char idx[32] = "";
        if (colon && (size_t)(colon - v) < sizeof idx) memcpy(idx, v, (size_t)(colon - v));
        if (!colon || parse_int(idx, 0, 255, &n) != 0 || !end || *end || !(f >= 1.0 && f <= 100.0))
            return train_usage_error("--straggler '%s': expected W:F, a worker index and a "
                                     "slowdown factor in [1, 100] (e.g. 3:3)", v);
        o->straggler = (int)n;
        o->straggler_factor = f;
    } else if (strcmp(a, "--transient") == 0) {
        char *colon = strchr(v, ':'), *end = NULL, *end2 = NULL;
        double p = strtod(v, &end), f = colon ? strtod(colon + 1, &end2) : 0;
        if (!colon || end != colon || !end2 || *end2 || !(p > 0.0 && p <= 1.0) ||
            !(f >= 1.0 && f <= 100.0))
            return train_usage_error("--transient '%s': expected P:F, a probability in (0, 1] "
                                     "and a slowdown factor in [1, 100] (e.g. 0.1:4)", v);
        o->transient_p = p;
        o->transient_factor = f;
    } else if (strcmp(a, "--aggregator") == 0) {
        if (strlen(v) >= sizeof o->aggregator || !*v)
            return train_usage_error("--aggregator '%s': expected a spec of 1 to 63 characters", v);
        snprintf(o->aggregator, sizeof o->aggregator, "%s", v);
    } else if (strcmp(a, "--byzantine") == 0) {
        if (train_attack_parse(v, &o->byz_k, &o->byz_attack) != 0)
            return train_usage_error("--byzantine '%s': expected K:ATTACK, K >= 1 workers and "
                                     "ATTACK one of signflip, noise, labelflip, alie, ipm", v);
    } else if (strcmp(a, "--clients") == 0) {
        if (parse_int(v, 1, 255, &n) != 0)
            return train_usage_error("--clients '%s': expected an integer in [1, 255]", v);
        if (ps->have_workers && o->workers != (int)n)
            return train_usage_error("%s", "--clients and --workers differ: in fedavg mode each "
                                     "client is a worker process; give one of them");
        o->workers = (int)n;
        ps->have_workers = ps->have_clients = 1;
    } else if (strcmp(a, "--fraction") == 0) {
        if (parse_double(v, 1e-9, 1.0, &o->fraction) != 0)
            return train_usage_error("--fraction '%s': expected a fraction in (0, 1]", v);
    } else if (strcmp(a, "--partition") == 0) {
        if (strcmp(v, "iid") == 0)
            o->alpha = 0;
        else if (strncmp(v, "dirichlet:", 10) != 0 || parse_double(v + 10, 1e-3, 1e6, &o->alpha) != 0)
            return train_usage_error("--partition '%s': expected iid or dirichlet:ALPHA (ALPHA in "
                               "[0.001, 1e6]; small is skewed, e.g. dirichlet:0.3)", v);
        ps->have_partition = 1;
    } else if (strcmp(a, "--rounds") == 0) {
        if (parse_int(v, 1, 100000, &n) != 0)
            return train_usage_error("--rounds '%s': expected an integer in [1, 100000]", v);
        o->rounds = (int)n;
    } else if (strcmp(a, "--dropout") == 0) {
        if (parse_double(v, 0.0, 0.99, &o->dropout) != 0)
            return train_usage_error("--dropout '%s': expected a probability in [0, 0.99]", v);
    } else if (strcmp(a, "--deadline-ms") == 0) {
        if (parse_int(v, 1, 1 << 30, &n) != 0)
            return train_usage_error("--deadline-ms '%s': expected a positive number of "
                                     "milliseconds", v);
        o->deadline_ms = (int)n;
    } else if (strcmp(a, "--dp") == 0) {
        if (parse_dp(v, o) != 0)
            return train_usage_error("--dp '%s': expected clip=C,noise=S with C > 0, S >= 0", v);
    } else {
        return -1;
    }
    return 0;
}

/* Compression, data, evaluation and output options: as training_option. */
static int other_option(train_options *o, train_parse_state *ps, const char *a,
                        const char *v) {
    long n;
    uint64_t u;
    if (strcmp(a, "--codec") == 0) {
        ps->codec = v;
        ps->have_codec = 1;
    } else if (strcmp(a, "--codec-for") == 0) {
        if (o->n_overrides >= TRAIN_MAX_OVERRIDES)
            return train_usage_error("too many --codec-for options (at most %s)", "8");
        o->overrides[o->n_overrides++] = v;
    } else if (strcmp(a, "--small") == 0) {
        if (parse_int(v, 0, 1L << 30, &n) != 0)
            return train_usage_error("--small '%s': expected an element count", v);
        o->small = (int)n;
    } else if (strcmp(a, "--adapt") == 0) {
        if (parse_adapt(v, &ps->adapt) != 0)
            return train_usage_error("--adapt '%s': expected accordion:low=SPEC,high=SPEC with "
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
            return train_usage_error("--train-limit '%s': expected a positive count", v);
        o->train_limit = (size_t)u;
    } else if (strcmp(a, "--test-limit") == 0) {
        if (parse_u64(v, &u) != 0 || u == 0)
            return train_usage_error("--test-limit '%s': expected a positive count", v);
        o->test_limit = (size_t)u;
    } else if (strcmp(a, "--eval-every") == 0) {
        if (parse_int(v, 1, 1L << 30, &n) != 0)
            return train_usage_error("--eval-every '%s': expected a positive step count", v);
        o->eval_every = (int)n;
    } else if (strcmp(a, "--target-acc") == 0) {
        if (parse_double(v, 1e-9, 100.0, &o->target_acc) != 0)
            return train_usage_error("--target-acc '%s': expected a percentage in (0, 100]", v);
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
    else if (strcmp(a, "--colocate") == 0)
        o->colocate = 1;
    else
        return -1;
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
    static train_parse_state ps;
    memset(&ps, 0, sizeof ps);
    ps.codec = TRAIN_DENSE;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            train_usage(stdout);
            return -1;
        }
        int rc;
        if (takes_value(a)) {
            if (i + 1 >= argc) return train_usage_error("option '%s' needs a value", a);
            const char *v = argv[++i];
            rc = training_option(o, &ps, a, v);
            if (rc == -1) rc = other_option(o, &ps, a, v);
        } else {
            rc = flag_option(o, a);
        }
        if (rc == -1) return train_usage_error("unknown option '%s'", a);
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
    int rc = train_check_combinations(o, &ps);
    if (rc != 0) return rc;
    /* fedavg, and ps without --schedule: a constant rate (ps:...
     * --schedule cosine runs the server's schedule) */
    if (o->mode == TRAIN_MODE_FEDAVG || (o->mode == TRAIN_MODE_PS && !ps.have_schedule))
        o->schedule = TRAIN_SCHED_NONE;
    if (o->model == MODEL_CNN && !ps.have_lr) o->lr = TRAIN_CNN_LR;
    if (o->target_acc > 0 && o->eval_every == 0 && !o->worker && !o->quiet)
        fprintf(stderr, WHO ": note: without --eval-every the time to --target-acc is only "
                        "measured at epoch ends\n");
    return train_build_runs(o, &ps);
}

/* ---------------------------------------------------------------- launcher */

int train_launch(int argc, char **argv, const train_options *o) {
    /* Workers run OpenBLAS on one thread each (train_worker.c), for
     * determinism; nothing to share out. */
    bench_records set = {NULL, 0, 0, sizeof(train_record)};
    bench_job job = {WHO, "train", train_processes(o), o->provider ? o->provider : "shm", argc,
                     argv, 1, NULL, train_record_parse, 0, NULL};
    int rc = bench_job_run(&job, &set);
    if (rc == BENCH_JOB_NO_FILE) return BENCH_EXIT_RUNTIME;
    train_record *recs = set.items;
    int n = set.n;
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
    if (bench_flush_results(WHO) != 0) return BENCH_EXIT_RUNTIME;
    return failed ? BENCH_EXIT_RUNTIME : BENCH_EXIT_OK;
}

int train_processes(const train_options *o) {
    int ps = o->mode == TRAIN_MODE_PS || o->mode == TRAIN_MODE_FEDAVG;
    return o->workers + (ps && !o->colocate ? (o->servers ? o->servers : 1) : 0);
}

int bench_train_main(int argc, char **argv) {
    static train_options o;
    int rc = train_parse_args(argc, argv, &o);
    if (rc < 0) return fflush(stdout) == 0 ? BENCH_EXIT_OK : BENCH_EXIT_RUNTIME;
    if (rc > 0) return rc;
    /* The bytes columns count what the workers send, the point of this
     * benchmark: dense all-reduces go through the transport on one host too
     * (the host's shared segment sends nothing), unless the caller set
     * TERSE_SHM_SEGMENT. Set before the workers start: they inherit it. */
    setenv("TERSE_SHM_SEGMENT", "off", 0);
    if (o.worker || getenv("TERSE_RANK")) return train_worker_main(&o);
    return train_launch(argc, argv, &o);
}
