/* terse-bench train: the records that carry evaluations from rank 0 to the
 * launcher, and what a person (table), a spreadsheet (CSV), a program (JSON)
 * and gnuplot (the sweep's plot) get from them. Columns are defined in the
 * --help text (train.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/bench.h"
#include "train/train.h"

#define WHO "terse-bench train"

/* ---------------------------------------------------------------- records */

void train_record_write(FILE *f, const train_record *r) {
    char codec[sizeof r->codec], label[sizeof r->label], error[sizeof r->error];
    /* %.17g: every double reads back bit for bit. */
    fprintf(f,
            "train2\t%d\t%d\t%llu\t%d\t%d\t%ld\t%ld\t%.17g\t%.17g\t%.17g\t%.17g\t%.17g\t%.17g\t%.17g\t"
            "%.17g\t%.17g\t%s\t%s\t%d\t%s\n",
            r->run, r->group, (unsigned long long)r->seed, r->final, r->epoch, r->step, r->steps_total, r->test_acc, r->test_loss,
            r->train_loss, r->bytes_sent, r->dense_bytes, r->compute_s, r->codec_s,
            r->network_s, r->wall_s, bench_field_copy(codec, sizeof codec, r->codec),
            bench_field_copy(label, sizeof label, r->label), r->ef,
            bench_field_copy(error, sizeof error, r->error));
}

#define RECORD_FIELDS 21

int train_record_parse(char *line, void *record) {
    train_record *r = record;
    char *f[RECORD_FIELDS];
    int n = bench_split_tabs(line, f, RECORD_FIELDS);
    if (n != RECORD_FIELDS || strcmp(f[0], "train2") != 0) return -1;
    memset(r, 0, sizeof *r);
    r->run = atoi(f[1]);
    r->group = atoi(f[2]);
    r->seed = strtoull(f[3], NULL, 10);
    r->final = atoi(f[4]);
    r->epoch = atoi(f[5]);
    r->step = atol(f[6]);
    r->steps_total = atol(f[7]);
    double *d[] = {&r->test_acc, &r->test_loss, &r->train_loss, &r->bytes_sent, &r->dense_bytes,
                   &r->compute_s, &r->codec_s, &r->network_s, &r->wall_s};
    for (int i = 0; i < 9; i++) {
        char *end;
        *d[i] = strtod(f[8 + i], &end);
        if (end == f[8 + i] || *end) return -1;
    }
    snprintf(r->codec, sizeof r->codec, "%s", f[17]);
    snprintf(r->label, sizeof r->label, "%s", f[18]);
    r->ef = atoi(f[19]);
    snprintf(r->error, sizeof r->error, "%s", f[20]);
    return r->run >= 0 && r->run < TRAIN_MAX_RUNS && r->group >= 0 && r->group <= r->run ? 0
                                                                                          : -1;
}

/* ---------------------------------------------------------------- numbers */

static double ratio(const train_record *r) {
    return r->bytes_sent > 0 ? r->dense_bytes / r->bytes_sent : 0.0;
}

/* The final record of run i, or NULL. */
static const train_record *final_of(const train_record *recs, int n, int run) {
    for (int i = 0; i < n; i++)
        if (recs[i].run == run && recs[i].final) return &recs[i];
    return NULL;
}

/* Training seconds until test accuracy first reached the target, or -1. */
static double time_to(const train_record *recs, int n, int run, double target) {
    for (int i = 0; i < n; i++)
        if (recs[i].run == run && recs[i].test_acc >= target) return recs[i].wall_s;
    return -1.0;
}

static const char *human_bytes(double b, char *buf, size_t cap) {
    if (b >= 1e9)
        snprintf(buf, cap, "%.2f GB", b / 1e9);
    else if (b >= 1e6)
        snprintf(buf, cap, "%.2f MB", b / 1e6);
    else if (b >= 1e3)
        snprintf(buf, cap, "%.1f kB", b / 1e3);
    else
        snprintf(buf, cap, "%.0f B", b);
    return buf;
}

/* One configuration over its seeds: means of the final evaluations, and its
 * paired comparison with dense (group 0) on the seeds both finished. */
typedef struct {
    const train_run *cfg;
    int seeds;                     /* finished runs */
    double acc, acc_min, acc_max;  /* final test accuracy: mean, range */
    double acc_sd;                 /* its sample standard deviation (NAN for 1 seed) */
    int pairs;                     /* seeds finished here and by dense */
    double diff, diff_hw;          /* mean of acc - dense acc over those seeds, and
                                      the half-width of its 95% t-interval (NAN
                                      under 2 pairs) */
    double bytes, dense_bytes, compute_s, codec_s, network_s, wall_s; /* means */
    double t_target;               /* mean time to --target-acc, -1 if any run missed */
} group_sum;

/* The final record of the dense run (group 0) with this seed, or NULL. */
static const train_record *dense_final(const train_options *o, const train_record *recs, int n,
                                       uint64_t seed) {
    for (size_t k = 0; k < o->n_runs && o->runs[k].group == 0; k++)
        if (o->runs[k].seed == seed) return final_of(recs, n, (int)k);
    return NULL;
}

static void summarize(const train_options *o, const train_record *recs, int n, int group,
                      group_sum *g) {
    memset(g, 0, sizeof *g);
    g->t_target = 0;
    int missed = 0;
    /* Per seed: this row's accuracy, and its difference to dense's. */
    double accs[TRAIN_MAX_RUNS], diffs[TRAIN_MAX_RUNS];
    for (size_t k = 0; k < o->n_runs; k++) {
        if (o->runs[k].group != group) continue;
        if (!g->cfg) g->cfg = &o->runs[k];
        const train_record *r = final_of(recs, n, (int)k);
        if (!r) continue;
        accs[g->seeds] = r->test_acc;
        const train_record *d = dense_final(o, recs, n, o->runs[k].seed);
        if (d) diffs[g->pairs++] = r->test_acc - d->test_acc;
        if (g->seeds == 0 || r->test_acc < g->acc_min) g->acc_min = r->test_acc;
        if (g->seeds == 0 || r->test_acc > g->acc_max) g->acc_max = r->test_acc;
        g->seeds++;
        g->acc += r->test_acc;
        g->bytes += r->bytes_sent;
        g->dense_bytes += r->dense_bytes;
        g->compute_s += r->compute_s;
        g->codec_s += r->codec_s;
        g->network_s += r->network_s;
        g->wall_s += r->wall_s;
        double t = o->target_acc > 0 ? time_to(recs, n, (int)k, o->target_acc) : -1;
        if (t < 0)
            missed = 1;
        else
            g->t_target += t;
    }
    if (g->seeds == 0) {
        g->t_target = -1;
        return;
    }
    double mean, hw, sd;
    train_paired(accs, g->seeds, &mean, &g->acc_sd, &hw);
    train_paired(diffs, g->pairs, &g->diff, &sd, &g->diff_hw);
    double *m[] = {&g->acc, &g->bytes, &g->dense_bytes, &g->compute_s, &g->codec_s,
                   &g->network_s, &g->wall_s};
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) *m[i] /= g->seeds;
    g->t_target = missed ? -1 : g->t_target / g->seeds;
}

static int group_count(const train_options *o) {
    return o->n_runs ? o->runs[o->n_runs - 1].group + 1 : 0;
}

static double group_ratio(const group_sum *g) {
    return g->bytes > 0 ? g->dense_bytes / g->bytes : 0.0;
}

/* ---------------------------------------------------------------- table */

/* The schedule as --schedule spells it, with the warm-up. */
static const char *schedule_text(const train_options *o, char *buf, size_t cap) {
    if (o->schedule == TRAIN_SCHED_NONE) return snprintf(buf, cap, "constant"), buf;
    int len = snprintf(buf, cap, "%s", o->schedule == TRAIN_SCHED_COSINE ? "cosine" : "step:");
    for (int i = 0; i < o->n_milestones && len > 0 && (size_t)len < cap; i++)
        len += snprintf(buf + len, cap - (size_t)len, "%s%g", i ? "," : "", o->milestones[i]);
    if (len > 0 && (size_t)len < cap)
        snprintf(buf + len, cap - (size_t)len, ", warm-up %g%%", 100.0 * o->warmup);
    return buf;
}

static void print_setup(const train_options *o) {
    char sched[96];
    printf("# terse-bench train: %s, %d workers over %s, batch %zu per worker, lr %g (%s), "
           "momentum %g%s%s, %d epoch%s, ",
           model_kind_name(o->model), o->workers, o->provider ? o->provider : "shm", o->batch,
           o->lr, schedule_text(o, sched, sizeof sched), o->momentum,
           o->local_momentum ? " (local)" : "",
           o->mask_momentum ? " masked" : "", o->epochs,
           o->epochs == 1 ? "" : "s");
    if (o->seeds > 1)
        printf("seeds %llu..%llu, ", (unsigned long long)o->seed,
               (unsigned long long)(o->seed + (uint64_t)o->seeds - 1));
    else
        printf("seed %llu, ", (unsigned long long)o->seed);
    if (o->mode == TRAIN_MODE_LOCALSGD)
        printf("Local SGD (average every %d steps)\n", o->local_steps);
    else if (o->mode == TRAIN_MODE_PS)
        if (o->colocate)
            printf("parameter server ps:%s, colocated: every worker also a server (SGD with "
                   "momentum on the servers)\n",
                   o->ps_mode);
        else
            printf("parameter server ps:%s, %d server%s (SGD with momentum on the server)\n",
                   o->ps_mode, o->servers ? o->servers : 1, o->servers > 1 ? "s" : "");
    else
        printf("synchronous SGD\n");
    if (o->straggler >= 0)
        printf("# straggler: worker %d computes %gx slower (it sleeps the difference)\n",
               o->straggler, o->straggler_factor);
    if (o->transient_p > 0)
        printf("# transient stragglers: each worker computes %gx slower at a step with "
               "probability %g\n",
               o->transient_factor, o->transient_p);
    if (o->mode == TRAIN_MODE_PS)
        printf("# ps: one key per tensor (small tensors dense), pulls dense; accuracy of the "
               "parameters worker 0 pulled, at worker 0's wall time\n");
    else if (o->small > 0) {
        /* Name the tensors the threshold catches, from the model itself. */
        char names[64] = "";
        model *m = model_create(o->model, 1, 0);
        for (size_t i = 0; m && i < model_tensor_count(m); i++) {
            const model_tensor *t = model_tensor_at(m, i);
            if (t->n >= (size_t)o->small) continue;
            size_t len = strlen(names);
            snprintf(names + len, sizeof names - len, "%s%s %zux%zu", len ? "," : "", t->name,
                     t->rows, t->cols);
        }
        model_free(m);
        printf("# tensors under %d elements (%s) travel together in one bucket: %s in "
               "compressed runs, dense in dense runs\n",
               o->small, names[0] ? names : "none here",
               strcmp(o->small_codec, TRAIN_DENSE) == 0 ? "dense" : o->small_codec);
    }
    for (size_t i = 0; i < o->n_overrides; i++) printf("# --codec-for %s\n", o->overrides[i]);
    if (o->dp)
        printf("# --dp: updates clipped to L2 norm %g, Gaussian noise sd %g added\n", o->dp_clip,
               o->dp_noise * o->dp_clip);
    if (o->train_limit || o->test_limit)
        printf("# data limited: train %zu, test %zu examples (0 = all)\n", o->train_limit,
               o->test_limit);
}

static void print_run_table(const train_options *o, const train_record *recs, int n) {
    print_setup(o);
    if (o->runs[0].adapt) {
        char every[32] = "a tenth of the run's";
        if (o->runs[0].adapt_every) snprintf(every, sizeof every, "%d", o->runs[0].adapt_every);
        printf("# codec: Accordion, mild %s, aggressive %s, eta %g, deciding every %s steps\n",
               o->runs[0].codec, o->runs[0].adapt_high, o->runs[0].adapt_eta, every);
    } else
        printf("# codec: %s\n", o->runs[0].codec);
    printf("%5s %5s %7s %7s %9s %10s %12s %8s %8s %8s %8s %8s\n", "seed", "epoch", "step",
           "acc%", "test-loss", "train-loss", "sent/worker", "ratio", "compute", "codec",
           "network", "time");
    for (int i = 0; i < n; i++) {
        const train_record *r = &recs[i];
        char b[32];
        printf("%5llu %5d %7ld %7.2f %9.4f %10.4f %12s %8.1f %8.2f %8.2f %8.2f %8.2f\n",
               (unsigned long long)r->seed, r->epoch, r->step, r->test_acc, r->test_loss,
               r->train_loss, human_bytes(r->bytes_sent, b, sizeof b), ratio(r), r->compute_s,
               r->codec_s, r->network_s, r->wall_s);
    }
    group_sum g;
    summarize(o, recs, n, 0, &g);
    if (o->seeds > 1 && g.seeds > 0)
        printf("# mean over %d seeds: %.2f%% (%.2f..%.2f)\n", g.seeds, g.acc, g.acc_min,
               g.acc_max);
    if (o->target_acc > 0) {
        if (g.t_target >= 0)
            printf("# reached %.2f%% test accuracy after %.2f s of training%s\n", o->target_acc,
                   g.t_target, o->seeds > 1 ? " (mean over seeds)" : "");
        else
            printf("# did not reach %.2f%% test accuracy%s\n", o->target_acc,
                   o->seeds > 1 ? " in every seed" : "");
    }
}

/* The sweep's rule for "as good as dense": a row's whole 95% interval of
 * the paired difference lies above -TRAIN_WITHIN points. */
#define TRAIN_WITHIN 0.5

static void print_sweep_table(const train_options *o, const train_record *recs, int n) {
    /* Local SGD rows say so in their label ("local8 ..."). */
    print_setup(o);
    int ng = group_count(o);
    group_sum dense;
    summarize(o, recs, n, 0, &dense);
    printf("%-15s %3s %7s %5s %8s %15s %12s %7s %7s %7s %7s %7s", "codec", "EF", "acc%", "sd",
           "vs-dense", "95% interval", "sent/worker", "ratio", "compute", "codec", "network",
           "time");
    if (o->target_acc > 0) printf(" %9s", "t-target");
    printf("\n");
    const group_sum *best = NULL;
    double widest = 0;
    static group_sum gs[TRAIN_MAX_RUNS];
    for (int k = 0; k < ng; k++) {
        group_sum *g = &gs[k];
        summarize(o, recs, n, k, g);
        if (!g->cfg) continue;
        if (g->seeds == 0) {
            printf("%-15s %3s  did not finish\n", g->cfg->label, g->cfg->ef ? "yes" : "no");
            continue;
        }
        char b[32], d[16] = "-", ci[32] = "-", sd[16] = "-";
        if (k > 0 && g->pairs) snprintf(d, sizeof d, "%+.2f", g->diff);
        if (k > 0 && g->pairs > 1) {
            snprintf(ci, sizeof ci, "[%+.2f,%+.2f]", g->diff - g->diff_hw, g->diff + g->diff_hw);
            if (g->diff_hw > widest) widest = g->diff_hw;
        }
        if (g->seeds > 1) snprintf(sd, sizeof sd, "%.2f", g->acc_sd);
        printf("%-15s %3s %7.2f %5s %8s %15s %12s %7.1f %7.2f %7.2f %7.2f %7.2f", g->cfg->label,
               g->cfg->ef ? "yes" : "no", g->acc, sd, d, ci, human_bytes(g->bytes, b, sizeof b),
               group_ratio(g), g->compute_s, g->codec_s, g->network_s, g->wall_s);
        if (o->target_acc > 0) {
            if (g->t_target >= 0)
                printf(" %9.2f", g->t_target);
            else
                printf(" %9s", "never");
        }
        printf("\n");
        if (k > 0 && g->pairs > 1 && g->diff - g->diff_hw >= -TRAIN_WITHIN &&
            (!best || group_ratio(g) > group_ratio(best)))
            best = g;
    }
    if (o->seeds > 1) {
        printf("# acc%%: mean final test accuracy over %d seeds, sd its standard deviation; "
               "vs-dense: the mean over seeds of (row - dense) on the same seed, and its 95%% "
               "t-interval (widest half-width here: %.2f)\n", o->seeds, widest);
        if (best)
            printf("# fewest bytes with the whole interval above -%.1f point: %s%s, %.1fx "
                   "fewer, %.2f%% (%+.2f, interval [%+.2f,%+.2f]; dense %.2f%%)\n",
                   TRAIN_WITHIN, best->cfg->label, best->cfg->ef ? " +EF" : "",
                   group_ratio(best), best->acc, best->diff, best->diff - best->diff_hw,
                   best->diff + best->diff_hw, dense.acc);
        else
            printf("# no row has its whole interval above -%.1f point\n", TRAIN_WITHIN);
    } else {
        printf("# one seed: no intervals (give --seeds 2 or more to compare rows)\n");
    }
}

static void print_csv(const train_options *o, const train_record *recs, int n) {
    (void)o;
    printf("run,group,seed,ef,epoch,step,steps_total,final,test_acc,test_loss,train_loss,"
           "bytes_sent,dense_bytes,ratio,compute_s,codec_s,network_s,wall_s,label,codec\n");
    for (int i = 0; i < n; i++) {
        const train_record *r = &recs[i];
        /* Numbers first, the two text fields (which hold commas) last. */
        printf("%d,%d,%llu,%d,%d,%ld,%ld,%d,%.4f,%.6f,%.6f,%.0f,%.0f,%.4f,%.4f,%.4f,%.4f,%.4f,"
               "\"%s\",\"%s\"\n",
               r->run, r->group, (unsigned long long)r->seed, r->ef, r->epoch, r->step,
               r->steps_total, r->final, r->test_acc, r->test_loss, r->train_loss, r->bytes_sent,
               r->dense_bytes, ratio(r), r->compute_s, r->codec_s, r->network_s, r->wall_s,
               r->label, r->codec);
    }
}

/* JSON strings here are codec specs and labels: printable ASCII; escape the
 * two characters JSON requires anyway. */
static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') putchar('\\');
        if ((unsigned char)*s >= 0x20) putchar(*s);
    }
    putchar('"');
}

static void json_number(double v) {
    if (isfinite(v))
        printf("%.6g", v);
    else
        printf("null");
}

static void print_json(const train_options *o, const train_record *recs, int n) {
    printf("{\"model\": ");
    json_string(model_kind_name(o->model));
    printf(", \"workers\": %d, \"provider\": ", o->workers);
    json_string(o->provider ? o->provider : "shm");
    printf(", \"batch\": %zu, \"lr\": %g, \"momentum\": %g, \"epochs\": %d, \"seed\": %llu,\n",
           o->batch, o->lr, o->momentum, o->epochs, (unsigned long long)o->seed);
    char sched[96];
    printf(" \"schedule\": ");
    json_string(schedule_text(o, sched, sizeof sched));
    printf(", \"mode\": ");
    json_string(o->mode == TRAIN_MODE_LOCALSGD ? "localsgd" : "allreduce");
    printf(", \"local_steps\": %d, \"small\": %d, \"small_codec\": ", o->local_steps, o->small);
    json_string(o->small_codec);
    printf(",\n \"runs\": [\n");
    for (size_t k = 0; k < o->n_runs; k++) {
        printf("  {\"label\": ");
        json_string(o->runs[k].label);
        printf(", \"codec\": ");
        json_string(o->runs[k].codec);
        printf(", \"bucket_codec\": ");
        json_string(o->runs[k].small_codec);
        if (o->runs[k].adapt) {
            printf(", \"adapt\": {\"method\": \"accordion\", \"high\": ");
            json_string(o->runs[k].adapt_high);
            /* every: null for the default, a tenth of the run's steps. */
            printf(", \"eta\": %g, \"every\": ", o->runs[k].adapt_eta);
            if (o->runs[k].adapt_every)
                printf("%d}", o->runs[k].adapt_every);
            else
                printf("null}");
        }
        printf(", \"ef\": %s, \"seed\": %llu, \"group\": %d, \"local_steps\": %d, "
               "\"local_momentum\": %s, \"mask_momentum\": %s, \"evaluations\": [",
               o->runs[k].ef ? "true" : "false", (unsigned long long)o->runs[k].seed,
               o->runs[k].group, o->runs[k].local_steps,
               o->runs[k].local_momentum ? "true" : "false",
               o->runs[k].mask_momentum ? "true" : "false");
        int first = 1;
        for (int i = 0; i < n; i++) {
            const train_record *r = &recs[i];
            if (r->run != (int)k) continue;
            printf("%s\n    {\"epoch\": %d, \"step\": %ld, \"final\": %s, \"test_acc\": ",
                   first ? "" : ",", r->epoch, r->step, r->final ? "true" : "false");
            json_number(r->test_acc);
            printf(", \"test_loss\": ");
            json_number(r->test_loss);
            printf(", \"train_loss\": ");
            json_number(r->train_loss);
            printf(", \"bytes_sent\": %.0f, \"dense_bytes\": %.0f, \"ratio\": ", r->bytes_sent,
                   r->dense_bytes);
            json_number(ratio(r));
            printf(", \"compute_s\": ");
            json_number(r->compute_s);
            printf(", \"codec_s\": ");
            json_number(r->codec_s);
            printf(", \"network_s\": ");
            json_number(r->network_s);
            printf(", \"wall_s\": ");
            json_number(r->wall_s);
            printf("}");
            first = 0;
        }
        printf("]}%s\n", k + 1 < o->n_runs ? "," : "");
    }
    printf(" ]\n}\n");
}

void train_report(const train_options *o, const train_record *recs, int n) {
    if (o->csv)
        print_csv(o, recs, n);
    else if (o->json)
        print_json(o, recs, n);
    else if (o->sweep)
        print_sweep_table(o, recs, n);
    else if (o->robust_sweep)
        train_robust_report(o, recs, n);
    else if (o->mode == TRAIN_MODE_FEDAVG)
        train_fed_report(o, recs, n);
    else
        print_run_table(o, recs, n);
}

/* ---------------------------------------------------------------- plot */

/* What the plot's title calls the model. */
static const char *model_title(model_kind kind) {
    switch (kind) {
    case MODEL_SOFTMAX: return "softmax regression 784-10";
    case MODEL_MLP: return "MLP 784-256-10";
    default: return "CNN conv5x5x16-conv5x5x32-fc128-10";
    }
}

/* A gnuplot script in a temporary file: open it (NULL, said why, when
 * gnuplot or the file cannot be had), then close and run it. */
FILE *train_plot_open(char *gp, size_t gp_cap, char *script, size_t script_cap) {
    if (bench_find_program("GNUPLOT", NULL, "gnuplot", gp, gp_cap) != 0) {
        fprintf(stderr, WHO ": gnuplot not found (apt-get install gnuplot-nox); no plot drawn\n");
        return NULL;
    }
    if (bench_temp_file("plot", script, script_cap) != 0) {
        fprintf(stderr, WHO ": cannot create a temporary file for the plot\n");
        return NULL;
    }
    FILE *f = fopen(script, "w");
    if (!f) {
        unlink(script);
        fprintf(stderr, WHO ": cannot write %s\n", script);
    }
    return f;
}

int train_plot_close(const train_options *o, FILE *f, char *gp, char *script) {
    if (fclose(f) != 0) {
        unlink(script);
        fprintf(stderr, WHO ": cannot write %s\n", script);
        return -1;
    }
    char *argv[] = {gp, script, NULL};
    int rc = bench_run_child(argv);
    unlink(script);
    if (rc != 0) {
        fprintf(stderr, WHO ": gnuplot failed (exit status %d); no plot drawn\n", rc);
        return -1;
    }
    if (!o->quiet) fprintf(stderr, WHO ": plot written to %s\n", o->plot);
    return 0;
}

int train_plot(const train_options *o, const train_record *recs, int n) {
    char gp[4096], script[4096];
    FILE *f = train_plot_open(gp, sizeof gp, script, sizeof script);
    if (!f) return -1;
    group_sum dense;
    summarize(o, recs, n, 0, &dense);
    /* One data block per series: error feedback or not; group means. */
    /* One data block per series: without error feedback ($S0), with it
     * ($S1), Accordion ($S2); group means. */
    double lowest = dense.seeds ? dense.acc : 100.0;
    for (int series = 0; series <= 2; series++) {
        fprintf(f, "$S%d << EOD\n", series);
        for (int k = 0; k < group_count(o); k++) {
            group_sum g;
            summarize(o, recs, n, k, &g);
            if (!g.cfg || g.seeds == 0 || g.bytes <= 0) continue;
            if (g.cfg->adapt ? series != 2 : series != g.cfg->ef) continue;
            double hw = g.pairs > 1 ? g.diff_hw : 0.0;
            fprintf(f, "%.6g %.4f %.4f %.4f \"%s\"\n", g.bytes, g.acc, g.acc - hw, g.acc + hw,
                    g.cfg->label);
            if (g.acc - hw < lowest) lowest = g.acc - hw;
        }
        fprintf(f, "EOD\n");
    }
    fprintf(f,
            "set terminal png size 1200,760\n"
            "set output '%s'\n"
            "set title 'terse, Fashion-MNIST: %s, %d workers, batch %zu, %d epoch%s, %d seeds'\n"
            "set logscale x 10\n"
            "set format x '10^{%%L}'\n"
            "set xlabel 'gradient bytes sent per worker (log scale)'\n"
            "set ylabel 'test accuracy (%%)'\n"
            "set grid\n"
            "set key bottom right\n",
            o->plot, model_title(o->model), o->workers, o->batch, o->epochs,
            o->epochs == 1 ? "" : "s", o->seeds);
    if (dense.seeds) {
        fprintf(f, "set yrange [%g:%g]\n", floor(lowest - 0.5), ceil(dense.acc + 1));
        fprintf(f, "set arrow from graph 0, first %.4f to graph 1, first %.4f nohead dt 2 "
                   "lc rgb 'gray40'\n", dense.acc, dense.acc);
        fprintf(f, "set label 'dense' at graph 0.01, first %.4f offset 0,0.6 font ',9'\n",
                dense.acc);
    }
    /* Points at the seed mean; bars: the 95% interval of the paired difference
     * to dense, drawn around the mean. */
    fprintf(f, "plot $S0 using 1:2:3:4 with yerrorbars pt 6 ps 1.6 lc rgb '#c0392b' title "
               "'without error feedback', \\\n"
               "     $S1 using 1:2:3:4 with yerrorbars pt 7 ps 1.6 lc rgb '#1f618d' title "
               "'with error feedback', \\\n"
               "     $S2 using 1:2:3:4 with yerrorbars pt 5 ps 1.8 lc rgb '#1e8449' title "
               "'Accordion (adaptive, with error feedback)', \\\n"
               "     $S0 using 1:2:5 with labels left offset char 1,-0.6 font ',8' "
               "tc rgb '#c0392b' notitle, \\\n"
               "     $S1 using 1:2:5 with labels left offset char 1,0.6 font ',8' "
               "tc rgb '#1f618d' notitle, \\\n"
               "     $S2 using 1:2:5 with labels right offset char -1,0.8 font ',8' "
               "tc rgb '#1e8449' notitle\n");
    return train_plot_close(o, f, gp, script);
}
