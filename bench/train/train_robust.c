/* terse-bench train --robust-sweep: the report. Every attack against every
 * aggregator (train_runs.c builds the runs: dense, then the compressed codec;
 * within each, attacks none..ipm; within each, the aggregators below), as
 * a table of final test accuracy per codec, the checks the sweep exists
 * for, and a bar chart (one group of bars per attack, one bar per
 * aggregator, one panel per codec). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/bench.h"
#include "train/train.h"
#include "train/train_worker.h"

const char *const train_robust_aggregators[TRAIN_ROBUST_AGGREGATORS] = {
    "mean", "median", "trimmed_mean:b=2", "krum:f=2", "cclip:tau=3,iters=3", "signvote"};

#define ATTACKS (ATTACK_IPM + 1)
#define CELLS (2 * ATTACKS * TRAIN_ROBUST_AGGREGATORS)

/* Mean final accuracy of each configuration over its seeds (NAN: none). */
static void cell_means(const train_options *o, const train_record *recs, int n, double *acc) {
    int count[CELLS] = {0};
    for (int k = 0; k < CELLS; k++) acc[k] = 0;
    for (int i = 0; i < n; i++) {
        if (!recs[i].final || recs[i].run < 0 || (size_t)recs[i].run >= o->n_runs) continue;
        int g = o->runs[recs[i].run].group;
        if (g < 0 || g >= CELLS) continue;
        acc[g] += recs[i].test_acc;
        count[g]++;
    }
    for (int k = 0; k < CELLS; k++) acc[k] = count[k] ? acc[k] / count[k] : NAN;
}

static double cell(const double *acc, int codec, int attack, int agg) {
    return acc[(codec * ATTACKS + attack) * TRAIN_ROBUST_AGGREGATORS + agg];
}

static const char *codec_name(const train_options *o, int codec) {
    return o->runs[(size_t)codec * ATTACKS * TRAIN_ROBUST_AGGREGATORS * (size_t)o->seeds].codec;
}

/* The goals of the sweep, said as measured: cclip within 1 point of its
 * own no-attack run under every attack; mean collapsing (10 points or
 * more) under every attack; median and Krum under alie and ipm. */
static void print_checks(const double *acc, int c) {
    const int cclip = 4, mean = 0, median = 1, krum = 3;
    double worst = 0;
    int worst_at = ATTACK_NONE;
    for (int a = 1; a < ATTACKS; a++) {
        double drop = cell(acc, c, 0, cclip) - cell(acc, c, a, cclip);
        if (drop > worst || worst_at == ATTACK_NONE) worst = drop, worst_at = a;
    }
    printf("#   cclip: worst drop from its no-attack run %.2f points (%s): %s\n", worst,
           train_attack_name((train_attack)worst_at), worst <= 1.0 ? "within 1 point" : "MISSED");
    printf("#   mean collapses (loses 10 points or more) under:");
    int held = 0;
    for (int a = 1; a < ATTACKS; a++)
        if (cell(acc, c, 0, mean) - cell(acc, c, a, mean) >= 10.0)
            printf(" %s", train_attack_name((train_attack)a));
        else
            held = 1;
    printf("%s", held ? "; holds under:" : " (every attack)");
    for (int a = 1; held && a < ATTACKS; a++)
        if (cell(acc, c, 0, mean) - cell(acc, c, a, mean) < 10.0)
            printf(" %s (%.2f)", train_attack_name((train_attack)a), cell(acc, c, a, mean));
    printf("\n");
    printf("#   median: alie %+.2f, ipm %+.2f; krum: alie %+.2f, ipm %+.2f (points from their "
           "no-attack runs)\n",
           cell(acc, c, ATTACK_ALIE, median) - cell(acc, c, 0, median),
           cell(acc, c, ATTACK_IPM, median) - cell(acc, c, 0, median),
           cell(acc, c, ATTACK_ALIE, krum) - cell(acc, c, 0, krum),
           cell(acc, c, ATTACK_IPM, krum) - cell(acc, c, 0, krum));
}

void train_robust_report(const train_options *o, const train_record *recs, int n) {
    double acc[CELLS];
    cell_means(o, recs, n, acc);
    int servers = o->servers ? o->servers : 1;
    printf("# terse-bench train --robust-sweep: %s, %d workers (%d Byzantine: the last), %d "
           "server%s, ps:sync, batch %zu, %d epoch%s, lr %g constant (signvote: x%g), momentum "
           "%g %s, %d seed%s from %llu\n",
           model_kind_name(o->model), o->workers, TRAIN_ROBUST_BYZANTINE, servers,
           servers == 1 ? "" : "s", o->batch, o->epochs,
           o->epochs == 1 ? "" : "s", o->lr, TRAIN_ROBUST_SIGN_LR, o->momentum,
           o->local_momentum ? "on each worker (what it pushes)" : "on the server", o->seeds,
           o->seeds == 1 ? "" : "s", (unsigned long long)o->seed);
    printf("# attacks: signflip -4x, noise N(0, 200), labelflip 9-y, alie z=%.3f, ipm eps 0.1; "
           "test accuracy (%%) of the final parameters, mean over seeds\n",
           train_alie_z(o->workers, TRAIN_ROBUST_BYZANTINE));
    printf("# dense runs push the model as one key; compressed runs one key per tensor (each "
           "with its codec; tensors under --small dense), so there Krum picks and cclip clips "
           "per tensor\n");
    for (int c = 0; c < 2; c++) {
        printf("\n# pushes: %s\n%-10s", codec_name(o, c), "attack");
        for (int g = 0; g < TRAIN_ROBUST_AGGREGATORS; g++)
            printf(" %16s", train_robust_aggregators[g]);
        printf("\n");
        for (int a = 0; a < ATTACKS; a++) {
            printf("%-10s", train_attack_name((train_attack)a));
            for (int g = 0; g < TRAIN_ROBUST_AGGREGATORS; g++)
                printf(" %16.2f", cell(acc, c, a, g));
            printf("\n");
        }
        print_checks(acc, c);
    }
}

int train_robust_plot(const train_options *o, const train_record *recs, int n) {
    char gp[4096], script[4096];
    FILE *f = train_plot_open(gp, sizeof gp, script, sizeof script);
    if (!f) return -1;
    double acc[CELLS];
    cell_means(o, recs, n, acc);
    for (int c = 0; c < 2; c++) {
        fprintf(f, "$C%d << EOD\nattack", c);
        for (int g = 0; g < TRAIN_ROBUST_AGGREGATORS; g++)
            fprintf(f, " \"%s\"", train_robust_aggregators[g]);
        fprintf(f, "\n");
        for (int a = 0; a < ATTACKS; a++) {
            fprintf(f, "%s", train_attack_name((train_attack)a));
            for (int g = 0; g < TRAIN_ROBUST_AGGREGATORS; g++) {
                double v = cell(acc, c, a, g);
                fprintf(f, " %.3f", isnan(v) ? 0.0 : v);
            }
            fprintf(f, "\n");
        }
        fprintf(f, "EOD\n");
    }
    fprintf(f,
            "set terminal png size 1300,900 noenhanced\n"
            "set output '%s'\n"
            "set multiplot layout 2,1 title 'terse parameter server under attack: Fashion-MNIST "
            "%s, %d workers of which %d Byzantine, %d epoch%s, %d seed%s'\n"
            "set style data histograms\n"
            "set style histogram clustered gap 1\n"
            "set style fill solid 0.85 border -1\n"
            "set boxwidth 0.9\n"
            "set yrange [0:100]\n"
            "set ylabel 'test accuracy (%%)'\n"
            "set grid ytics\n"
            "set key outside right top vertical\n",
            o->plot, model_kind_name(o->model), o->workers, TRAIN_ROBUST_BYZANTINE, o->epochs,
            o->epochs == 1 ? "" : "s", o->seeds, o->seeds == 1 ? "" : "s");
    for (int c = 0; c < 2; c++) {
        fprintf(f, "set title 'pushes: %s'\nplot ", codec_name(o, c));
        for (int g = 0; g < TRAIN_ROBUST_AGGREGATORS; g++)
            fprintf(f, "%s$C%d using %d:xtic(1) title columnheader(%d)", g ? ", " : "", c, g + 2,
                    g + 2);
        fprintf(f, "\n");
    }
    fprintf(f, "unset multiplot\n");
    return train_plot_close(o, f, gp, script);
}
