/* terse-bench ps: the records that carry rows from the ranks to the
 * launcher, and the table and CSV a person reads. The columns are defined
 * in the --help text (ps_bench.c); the arithmetic is here. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bench.h"
#include "ps/ps_bench.h"

/* ---------------------------------------------------------------- numbers */

double psb_balance(const psb_row *r) {
    if (r->n_placed < 1) return 0.0;
    double sum = 0, max = 0;
    for (int i = 0; i < r->n_placed; i++) {
        sum += (double)r->placed[i];
        max = fmax(max, (double)r->placed[i]);
    }
    return sum > 0 ? max / (sum / r->n_placed) : 0.0;
}

static double algbw(const psb_row *r) {
    return r && r->ok && r->time_s > 0 ? 1e-9 * (double)r->bytes / r->time_s : 0.0;
}

static int usable(const psb_row *r) {
    return r && r->ok && r->time_s > 0;
}

/* ---------------------------------------------------------------- records */

void psb_record_write(FILE *f, const psb_row *r) {
    char spec[sizeof r->spec], provider[sizeof r->provider], error[sizeof r->error];
    char placed[PSB_MAX_RANKS * 24 + 1];
    size_t len = 0;
    placed[0] = '\0';
    for (int i = 0; i < r->n_placed && i < PSB_MAX_RANKS; i++)
        len += (size_t)snprintf(placed + len, sizeof placed - len, "%s%" PRIu64, i ? "," : "",
                                r->placed[i]);
    /* %.17g: every double reads back bit for bit. */
    fprintf(f,
            "%s\t%d\t%d\t%d\t%zu\t%s\t%s\t%d\t%.17g\t%.17g\t%.17g\t%d\t%s\t%s\t%.17g\t%.17g\t"
            "%.17g\n",
            r->servers ? (r->colocated ? "pc" : "ps") : "ar", r->ok, r->servers, r->workers, r->bytes,
            bench_field_copy(spec, sizeof spec, r->spec),
            bench_field_copy(provider, sizeof provider, r->provider), r->iters, r->time_s, r->sent,
            r->recv, r->n_placed, placed[0] ? placed : "-",
            bench_field_copy(error, sizeof error, r->error), r->link_up, r->link_down, r->duplex);
}

int psb_record_parse(char *line, void *record) {
    psb_row *r = record;
    char *f[17];
    if (bench_split_tabs(line, f, 17) != 17) return -1;
    memset(r, 0, sizeof *r);
    if (strcmp(f[0], "ps") != 0 && strcmp(f[0], "pc") != 0 && strcmp(f[0], "ar") != 0) return -1;
    r->colocated = strcmp(f[0], "pc") == 0;
    char *end;
    r->ok = f[1][0] == '1';
    r->servers = (int)strtol(f[2], &end, 10);
    r->workers = (int)strtol(f[3], &end, 10);
    r->bytes = (size_t)strtoull(f[4], &end, 10);
    bench_field_copy(r->spec, sizeof r->spec, f[5]);
    bench_field_copy(r->provider, sizeof r->provider, f[6]);
    r->iters = (int)strtol(f[7], &end, 10);
    r->time_s = strtod(f[8], &end);
    r->sent = strtod(f[9], &end);
    r->recv = strtod(f[10], &end);
    r->n_placed = (int)strtol(f[11], &end, 10);
    if (r->n_placed < 0 || r->n_placed > PSB_MAX_RANKS) return -1;
    const char *p = f[12];
    for (int i = 0; i < r->n_placed; i++) {
        r->placed[i] = (uint64_t)strtoull(p, &end, 10);
        if (end == p) return -1;
        p = *end == ',' ? end + 1 : end;
    }
    bench_field_copy(r->error, sizeof r->error, f[13]);
    r->link_up = strtod(f[14], &end);
    r->link_down = strtod(f[15], &end);
    r->duplex = strtod(f[16], &end);
    if ((strcmp(f[0], "ar") != 0) != (r->servers > 0)) return -1;
    if (r->workers < 1 || r->bytes == 0 || (r->ok && !(r->time_s > 0))) return -1;
    return 0;
}

/* ---------------------------------------------------------------- output */

static const char *chunk_label(const psb_options *o, char *buf, size_t cap) {
    if (!o->chunk_bytes) return "the library's default (1M)";
    return bench_count_label(o->chunk_bytes, buf, cap);
}

/* The cpu of psb_report_begin, which the CSV repeats on every row. */
static char report_cpu[256];

void psb_report_begin(const psb_options *o, const char *cpu, const char *provider) {
    snprintf(report_cpu, sizeof report_cpu, "%s", cpu);
    if (o->csv) {
        printf("bytes,servers,workers,codec,cpu,provider,iters,pushpull_ms,algbw_gbps,"
               "allreduce_ms,allreduce_algbw_gbps,ratio,balance,pushpull_sent_bytes,"
               "pushpull_recv_bytes,allreduce_sent_bytes,placement_bytes,status,error,colocated\n");
        return;
    }
    char chunk[32];
    printf("# terse-bench ps: cpu %s, provider %s (%s), fp32, mode sync, update none\n", cpu,
           o->provider, provider);
    printf("# chunk %s; %d timed iteration%s after %d warm-up\n", chunk_label(o, chunk, sizeof chunk),
           o->repeats, o->repeats == 1 ? "" : "s", PSB_WARMUP);
    printf("# pp: terse_ps_pushpull + wait of one key per worker, after the workers met on\n"
           "#   a tiny sync key; ar: dense terse_allreduce (avg) of the same bytes among the\n"
           "#   same number of workers, after a terse_barrier\n"
           "# time: median over iterations of the slowest worker; algbw = size / time,\n"
           "#   GB/s = 1e9 B/s; ratio = pp / ar (below 1: the parameter server is faster)\n"
           "# balance: max / mean over servers of the key's bytes; sent: MB (1e6 B) on the\n"
           "#   wire sent per worker per iteration\n");
    if (o->colocate)
        printf("# servers N*: a colocated job (--colocate), N ranks each a worker and a server;\n"
               "#   its pp.sent counts what the rank sent as both\n");
    printf("#\n#%11s %7s %7s %-12s %9s %7s %9s %8s %6s %7s %8s %8s\n", "size", "servers",
           "workers", "codec", "pp(ms)", "algbw", "ar(ms)", "ar.algbw", "ratio", "balance",
           "pp.sent", "ar.sent");
}

void psb_report_note(const psb_options *o, const char *note) {
    if (!o->csv) printf("# %s\n", note);
}

void psb_report_row(const psb_options *o, const psb_row *r, const psb_row *ar) {
    int both = usable(r) && usable(ar);
    if (o->csv) {
        printf("%zu,%d,%d,", r->bytes, r->servers, r->workers);
        bench_csv_quoted(r->spec);
        putchar(',');
        bench_csv_quoted(report_cpu);
        putchar(',');
        bench_csv_quoted(r->provider[0] ? r->provider : o->provider);
        char placed[PSB_MAX_RANKS * 24 + 1];
        size_t len = 0;
        placed[0] = '\0';
        for (int i = 0; i < r->n_placed; i++)
            len += (size_t)snprintf(placed + len, sizeof placed - len, "%s%" PRIu64,
                                    i ? ";" : "", r->placed[i]);
        if (usable(r))
            printf(",%d,%.6f,%.6f", r->iters, 1e3 * r->time_s, algbw(r));
        else
            printf(",,,");
        if (usable(ar))
            printf(",%.6f,%.6f", 1e3 * ar->time_s, algbw(ar));
        else
            printf(",,");
        if (both)
            printf(",%.6f", r->time_s / ar->time_s);
        else
            printf(",");
        if (r->n_placed > 0)
            printf(",%.4f", psb_balance(r));
        else
            printf(",");
        if (usable(r))
            printf(",%.0f,%.0f", r->sent, r->recv);
        else
            printf(",,");
        if (usable(ar))
            printf(",%.0f", ar->sent);
        else
            printf(",");
        printf(",%s,", placed);
        const char *status = !r->ok ? "failed" : !usable(ar) ? "no_allreduce" : "ok";
        printf("%s,", status);
        bench_csv_quoted(!r->ok    ? r->error
                         : !ar     ? "the allreduce job failed"
                         : !ar->ok ? ar->error
                                   : "");
        printf(",%d", r->colocated);
        putchar('\n');
        return;
    }
    char size[24];
    bench_count_label(r->bytes, size, sizeof size);
    char servers[16];
    snprintf(servers, sizeof servers, "%d%s", r->servers, r->colocated ? "*" : "");
    printf(" %11s %7s %7d %-12s", size, servers, r->workers, r->spec);
    if (!r->ok) {
        printf(" failed: %s\n", r->error);
        return;
    }
    printf(" %9.3f %7.3f", 1e3 * r->time_s, algbw(r));
    if (usable(ar))
        printf(" %9.3f %8.3f %6.3f", 1e3 * ar->time_s, algbw(ar), r->time_s / ar->time_s);
    else
        printf(" %9s %8s %6s", "-", "-", "-");
    printf(" %7.3f %8.2f", psb_balance(r), 1e-6 * r->sent);
    if (usable(ar))
        printf(" %8.2f", 1e-6 * ar->sent);
    else
        printf(" %8s", "-");
    if (!usable(ar))
        printf("  allreduce %s", !ar ? "not measured (its job failed)" : ar->error);
    printf("\n");
}
