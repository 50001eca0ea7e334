/* terse-bench train --mode fedavg:E and --fed-sweep: the table, rounds and
 * uplink bytes to the baseline's final accuracy, and the plot (train.h).
 * Bytes are every client's uplink summed (pushes and request headers), as
 * the workers measured them on the wire. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "train/train.h"

#define WHO "terse-bench train"

static const char *mb(double b, char *buf, size_t cap) {
    snprintf(buf, cap, "%.2f MB", b / 1e6);
    return buf;
}

static const train_record *final_of(const train_record *recs, int n, int run) {
    for (int i = 0; i < n; i++)
        if (recs[i].run == run && recs[i].final) return &recs[i];
    return NULL;
}

/* The first evaluation of run at or above target, or NULL. */
static const train_record *first_at(const train_record *recs, int n, int run, double target) {
    for (int i = 0; i < n; i++)
        if (recs[i].run == run && recs[i].test_acc >= target) return &recs[i];
    return NULL;
}

static void print_setup(const train_options *o) {
    int m = train_fed_per_round(o, o->workers);
    printf("# terse-bench train: %s, FedAvg: %d clients (one process each) over %s, %d sampled "
           "a round (fraction %g), %d local epoch%s of plain SGD (lr %g, batch %zu), %d rounds, "
           "seed %llu%s\n",
           model_kind_name(o->model), o->workers, o->provider ? o->provider : "shm", m,
           o->fraction, o->fed_epochs, o->fed_epochs == 1 ? "" : "s", o->lr, o->batch, o->rounds,
           (unsigned long long)o->seed, o->seeds > 1 ? " (and following)" : "");
    printf("# server: sync:quorum=%d%s, the clients' models averaged weighted by their examples "
           "(terse_ps_push_weighted); the change x_r - x_c travels through each run's codec, "
           "its error feedback per client\n",
           m, o->deadline_ms ? "" : " (no deadline)");
    if (o->deadline_ms || o->dropout > 0)
        printf("# round deadline %d ms; a sampled client drops out of its round with probability "
               "%g\n",
               o->deadline_ms, o->dropout);
    for (size_t i = 0; i < o->n_runs; i++)
        if (o->runs[i].fed_epochs == 0 && (i == 0 || o->runs[i].group != o->runs[i - 1].group))
            printf("# baseline \"%s\": synchronous SGD through the server (lr %g, momentum %g), "
                   "all %d clients every step, batch %zu each, iid shards, %d epoch%s\n",
                   o->runs[i].label, o->lr, o->momentum, o->workers, o->batch, o->epochs,
                   o->epochs == 1 ? "" : "s");
    if (o->train_limit || o->test_limit)
        printf("# data limited: train %zu, test %zu examples (0 = all)\n", o->train_limit,
               o->test_limit);
}

void train_fed_report(const train_options *o, const train_record *recs, int n) {
    print_setup(o);
    printf("%-28s %5s %7s %7s %9s %14s %8s %8s\n", "run", "seed", "round", "acc%", "test-loss",
           "uplink (all)", "vs dense", "time");
    for (int i = 0; i < n; i++) {
        const train_record *r = &recs[i];
        char b[32];
        printf("%-28.28s %5llu %7ld %7.2f %9.4f %14s %7.1fx %8.2f\n", r->label,
               (unsigned long long)r->seed, r->step, r->test_acc, r->test_loss,
               mb(r->bytes_sent, b, sizeof b), r->bytes_sent > 0 ? r->dense_bytes / r->bytes_sent : 0,
               r->wall_s);
    }
    /* The target of each run: the final accuracy of the baseline with its
     * seed, else --target-acc. */
    int have_base = 0;
    for (size_t i = 0; i < o->n_runs; i++) have_base |= o->runs[i].fed_epochs == 0;
    if (!have_base && o->target_acc <= 0) return;
    char b1[32], b2[32];
    for (size_t i = 0; i < o->n_runs; i++) {
        if (o->runs[i].fed_epochs != 0) continue;
        const train_record *bf = final_of(recs, n, (int)i);
        if (bf)
            printf("# baseline, seed %llu: %ld steps (rounds) and %s of uplink to its final "
                   "%.2f%%\n",
                   (unsigned long long)o->runs[i].seed, bf->step,
                   mb(bf->bytes_sent, b1, sizeof b1), bf->test_acc);
    }
    printf("# to %s:\n", have_base ? "the final accuracy of the baseline with the same seed"
                                    : "--target-acc");
    printf("%-28s %5s %8s %8s %14s %12s %12s %8s\n", "run", "seed", "target%", "rounds",
           "uplink", "rounds-x", "bytes-x", "final%");
    for (size_t i = 0; i < o->n_runs; i++) {
        if (o->runs[i].fed_epochs == 0) continue;
        const train_record *bf = NULL;
        for (size_t j = 0; j < o->n_runs && !bf; j++)
            if (o->runs[j].fed_epochs == 0 && o->runs[j].seed == o->runs[i].seed)
                bf = final_of(recs, n, (int)j);
        double target = bf ? bf->test_acc : o->target_acc;
        const train_record *fin = final_of(recs, n, (int)i);
        if (!fin || target <= 0) continue;
        const train_record *at = first_at(recs, n, (int)i, target);
        if (!at) {
            printf("%-28.28s %5llu %8.2f %8s %14s %12s %12s %8.2f   (not reached in %ld rounds)\n",
                   o->runs[i].label, (unsigned long long)o->runs[i].seed, target, "-", "-", "-",
                   "-", fin->test_acc, fin->step);
            continue;
        }
        char rx[32] = "-", bx[32] = "-";
        if (bf) {
            snprintf(rx, sizeof rx, "%.1fx fewer", (double)bf->step / (double)at->step);
            snprintf(bx, sizeof bx, "%.1fx fewer", bf->bytes_sent / at->bytes_sent);
        }
        printf("%-28.28s %5llu %8.2f %8ld %14s %12s %12s %8.2f\n", o->runs[i].label,
               (unsigned long long)o->runs[i].seed, target, at->step,
               mb(at->bytes_sent, b2, sizeof b2), rx, bx, fin->test_acc);
    }
    if (o->eval_every > 1)
        printf("# rounds to the target are counted at evaluations (every %d rounds)\n",
               o->eval_every);
}

int train_fed_plot(const train_options *o, const train_record *recs, int n) {
    char gp[4096], script[4096];
    FILE *f = train_plot_open(gp, sizeof gp, script, sizeof script);
    if (!f) return -1;
    /* One data block per run of the first seed: round, accuracy, MB. */
    int blocks = 0;
    for (size_t i = 0; i < o->n_runs; i++) {
        if (o->runs[i].seed != o->seed) continue;
        fprintf(f, "$R%zu << EOD\n", i);
        for (int k = 0; k < n; k++)
            if (recs[k].run == (int)i)
                fprintf(f, "%ld %.3f %.6f\n", recs[k].step, recs[k].test_acc,
                        recs[k].bytes_sent / 1e6);
        fprintf(f, "EOD\n");
        blocks++;
    }
    fprintf(f,
            "set terminal png size 1300,560 noenhanced\n"
            "set output '%s'\n"
            "set multiplot layout 1,2 title 'FedAvg on the terse parameter server: Fashion-MNIST "
            "%s, %d clients, %d a round, %d local epoch%s (seed %llu)'\n"
            "set logscale x\n"
            "set ylabel 'test accuracy (%%)'\n"
            "set grid\n"
            "set key right bottom\n",
            o->plot, model_kind_name(o->model), o->workers, train_fed_per_round(o, o->workers),
            o->fed_epochs, o->fed_epochs == 1 ? "" : "s", (unsigned long long)o->seed);
    for (int panel = 0; panel < 2; panel++) {
        fprintf(f, "set xlabel '%s'\nplot ",
                panel ? "uplink of all clients (MB, log)" : "rounds (steps for sync SGD), log");
        int first = 1;
        for (size_t i = 0; i < o->n_runs; i++) {
            if (o->runs[i].seed != o->seed) continue;
            fprintf(f, "%s$R%zu using %d:2 with lines lw 2 title '%s'", first ? "" : ", ", i,
                    panel ? 3 : 1, o->runs[i].label);
            first = 0;
        }
        fprintf(f, "\n");
    }
    fprintf(f, "unset multiplot\n");
    (void)blocks;
    return train_plot_close(o, f, gp, script);
}
