/* terse-bench ps: the parameter server's push+pull time per worker, beside
 * the dense ring allreduce of the same bytes among the same number of
 * workers, both measured in the same run and printed as nccl-tests prints.
 *
 * This file holds the command line, picks the role (ps_bench.h) and is the
 * launcher; the ranks are in ps_bench_worker.c, the records and the table
 * in ps_bench_report.c. Public API only (include/terse.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <terse.h>

#include "core/bench.h"
#include "ps/ps_bench.h"

#define DEFAULT_REPEATS 5
#define WHO "terse-bench ps"

static void usage(FILE *f) {
    fprintf(f,
"usage: terse-bench ps [--servers LIST] [--workers LIST] [--sizes LIST]\n"
"                      [--codec SPEC]... [--chunk-bytes N] [--repeats N]\n"
"                      [--provider shm|tcp] [--colocate] [--csv] [--quiet]\n"
"\n"
"Time a parameter-server step, terse_ps_pushpull of one fp32 tensor, per\n"
"worker, beside terse_allreduce (dense, average) of the same bytes among the\n"
"same number of workers, both measured in this run on this machine.\n"
"\n"
"Why: with a parameter server a worker sends the model once and receives it\n"
"once per step; with a ring allreduce each rank sends and receives 2(N-1)/N\n"
"of it. With as many servers as workers, each rank on its own link, a\n"
"server's link carries what a worker's does, so a step moves no more bytes\n"
"per link than the ring; with fewer servers their links are the bottleneck.\n"
"Ranks on one host share its loopback and cores instead: there the\n"
"parameter server moves 2 * workers * size bytes in all, the ring\n"
"2(N-1) * size.\n"
"\n"
"options:\n"
"  --servers LIST      server counts to measure, comma separated, each 1..%d\n"
"                      (default 1,2)\n"
"  --workers LIST      worker counts, each 2..%d (default 2,4). A combination\n"
"                      with servers + workers > %d ranks is skipped, with a note\n"
"  --sizes LIST        tensor sizes in bytes, comma separated, with optional K,\n"
"                      M or G suffixes (x1024), each a multiple of 4 (default\n"
"                      1M,4M,16M,64M,256M). Each worker needs about 3x the\n"
"                      largest size in memory (its buffer, a copy to restore\n"
"                      it from, and the library's send and receive staging);\n"
"                      each server holds every size's aggregate for every codec\n"
"  --codec SPEC        'dense' (NULL specs: fp32 both ways) or a codec spec,\n"
"                      e.g. 'int8', 'qsgd:bits=4,bucket=512' (the spec is one\n"
"                      value, commas included); it is both the push and the\n"
"                      pull spec. Repeat for several (default: dense and int8).\n"
"                      powersgd is refused (it needs two rounds)\n"
"  --chunk-bytes N     the parameter server's chunk size (terse_ps_config's\n"
"                      chunk_bytes: the unit placed on servers), K/M suffixes,\n"
"                      a multiple of 4 in 64..1G (default: the library's, 1M)\n"
"  --repeats N         timed iterations per row, 1..%d (default %d), after %d\n"
"                      warm-up iteration%s that %s not counted\n"
"  --provider P        shm or tcp, passed to terse-run (default tcp)\n"
"  --colocate          also, per worker count W, a job of W ranks each a worker\n"
"                      and a server (terse_ps_config.colocate, BytePS style);\n"
"                      its rows show servers as W*\n"
"  --csv               CSV with a header row instead of the table\n"
"  -q, --quiet         no progress lines on stderr\n"
"  -h, --help          this text\n"
"\n"
"method: for every (servers, workers) one job of servers + workers ranks is\n"
"started through terse-run (this program again, with --worker): ranks\n"
"[0, servers) serve, the rest are workers. Every rank creates one parameter\n"
"server (mode sync, update none: a pull returns the mean of the step's\n"
"pushes) and declares, up front and in the same order, one key per (size,\n"
"codec) -- size/4 floats, init NULL -- then one 16-float dense sync key per\n"
"row. A sync step must push every key once (a key cannot sit a step out),\n"
"so each of the %d warm-up and N timed steps goes through every row in\n"
"turn: the row's sync key is pushed and pulled (untimed; its pull returns\n"
"once every worker pushed it, so the workers start the row together), the\n"
"buffer is restored from a copy of the worker's own Gaussian-like data\n"
"(untimed), and one terse_ps_pushpull + terse_request_wait of the row's key\n"
"is timed; terse_ps_clock (local) ends the step. Servers call\n"
"terse_ps_serve until every worker called terse_ps_finish; then every rank\n"
"frees the parameter server and the times are all-gathered to rank 0. For\n"
"every worker count, one more job of that many ranks times\n"
"terse_allreduce(NULL codec, TERSE_OP_AVG) of each size the same way: the\n"
"same step order, terse_barrier and the restore untimed before each. A row's\n"
"time is the median over the timed steps of the slowest worker's time.\n"
"\n"
"columns (CSV names in brackets):\n"
"  size [bytes]             the fp32 tensor, 4 * floats\n"
"  servers, workers         the job; the allreduce runs among the workers only\n"
"  codec [codec]            push and pull spec ('dense': none)\n"
"  pp(ms) [pushpull_ms]     one push+pull step per worker, as above\n"
"  algbw [algbw_gbps]       size / pp time, GB/s (1e9 B/s)\n"
"  ar(ms) [allreduce_ms]    the dense allreduce of the same size among the\n"
"                           same number of workers [also allreduce_algbw_gbps]\n"
"  ratio [ratio]            pp / ar: below 1 the parameter server is faster\n"
"  balance [balance]        max / mean over servers of the key's bytes placed\n"
"                           on each (terse_ps_placement); 1 is even. A key\n"
"                           smaller than servers x chunk cannot be even\n"
"  pp.sent, ar.sent [pushpull_sent_bytes, pushpull_recv_bytes,\n"
"    allreduce_sent_bytes]  MB (1e6 B) on the wire sent per worker per\n"
"                           iteration, max over workers (terse_comm_stats)\n"
"\n"
"environment: TERSE_RUN names terse-run (default: beside this binary, then\n"
"PATH). TERSE_TIMEOUT_MS and TERSE_PROGRESS reach the ranks through it.\n"
"\n"
"exit status: 0 ok, 1 runtime failure (a job failed or a row is missing), 2\n"
"usage error.\n",
            PSB_MAX_RANKS - 1, PSB_MAX_RANKS - 1, PSB_MAX_RANKS, PSB_MAX_REPEATS,
            DEFAULT_REPEATS, PSB_WARMUP, PSB_WARMUP == 1 ? "" : "s",
            PSB_WARMUP == 1 ? "is" : "are", PSB_WARMUP);
}

/* ---------------------------------------------------------------- options */

static int usage_error(const char *fmt, const char *what) {
    return bench_usage_error(WHO, fmt, what);
}


/* A comma-separated list of ints in [lo, hi], none repeated. */
static int parse_int_list(const char *text, long lo, long hi, int *v, size_t cap, size_t *n) {
    char buf[256];
    if (!text[0] || strlen(text) >= sizeof buf) return -1;
    snprintf(buf, sizeof buf, "%s", text);
    *n = 0;
    char *p = buf;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma) *comma = '\0';
        int x;
        if (*n == cap || bench_parse_int(p, lo, hi, &x) != 0) return -1;
        for (size_t i = 0; i < *n; i++)
            if (v[i] == x) return -1;
        v[(*n)++] = x;
        if (!comma) return 0;
        p = comma + 1;
    }
}

static int parse_sizes(const char *text, psb_options *o) {
    char buf[1024];
    if (!text[0] || strlen(text) >= sizeof buf)
        return usage_error("bad --sizes '%s' (want a comma-separated list of byte sizes)", text);
    snprintf(buf, sizeof buf, "%s", text);
    o->n_sizes = 0;
    char *p = buf;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma) *comma = '\0';
        size_t b;
        if (bench_parse_bytes(p, &b) != 0 || b % 4 != 0 || b / 4 > TERSE_MAX_ELEMENTS)
            return usage_error("bad size in --sizes '%s' (want bytes, each a multiple of 4, "
                               "with an optional K, M or G suffix)", text);
        if (o->n_sizes == PSB_MAX_SIZES)
            return usage_error("--sizes '%s' has too many sizes (at most 32)", text);
        for (size_t i = 0; i < o->n_sizes; i++)
            if (o->sizes[i] == b) return usage_error("--sizes '%s' repeats a size", text);
        o->sizes[o->n_sizes++] = b;
        if (!comma) return 0;
        p = comma + 1;
    }
}

/* Options that take a value. */
static const char *const valued[] = {"--servers", "--workers", "--sizes",    "--codec",
                                     "--chunk-bytes", "--repeats", "--provider", "--results",
                                     "--job"};
#define N_VALUED (sizeof valued / sizeof valued[0])

/* The valued option `a` names ("--x" or "--x=value"), or NULL; *inline_val
 * gets the value after '='. */
static const char *valued_option(const char *a, const char **inline_val) {
    *inline_val = NULL;
    if (strncmp(a, "--", 2) != 0) return NULL;
    const char *eq = strchr(a, '=');
    size_t len = eq ? (size_t)(eq - a) : strlen(a);
    for (size_t i = 0; i < N_VALUED; i++)
        if (strlen(valued[i]) == len && strncmp(a, valued[i], len) == 0) {
            *inline_val = eq ? eq + 1 : NULL;
            return valued[i];
        }
    return NULL;
}

static int apply_valued(psb_options *o, const char *opt, const char *val, int *specs_given) {
    if (strcmp(opt, "--servers") == 0) {
        if (parse_int_list(val, 1, PSB_MAX_RANKS - 1, o->servers, PSB_MAX_LIST, &o->n_servers))
            return usage_error("bad --servers '%s' (want a comma-separated list of distinct "
                               "counts, each 1..5)", val);
    } else if (strcmp(opt, "--workers") == 0) {
        if (parse_int_list(val, 2, PSB_MAX_RANKS - 1, o->workers, PSB_MAX_LIST, &o->n_workers))
            return usage_error("bad --workers '%s' (want a comma-separated list of distinct "
                               "counts, each 2..5: an allreduce of one rank moves nothing)", val);
    } else if (strcmp(opt, "--sizes") == 0) {
        return parse_sizes(val, o);
    } else if (strcmp(opt, "--codec") == 0) {
        if (!*specs_given) o->n_specs = 0; /* the first --codec replaces the default */
        *specs_given = 1;
        if (!val[0] || strchr(val, '\t') || strchr(val, '\n') || strlen(val) > 200)
            return usage_error("bad --codec '%s' (want 'dense' or a codec spec of at most 200 "
                               "characters)", val);
        if (o->n_specs == PSB_MAX_SPECS)
            return usage_error("too many --codec options (at most 16; at '%s')", val);
        for (size_t i = 0; i < o->n_specs; i++)
            if (strcmp(o->specs[i], val) == 0)
                return usage_error("--codec '%s' is given twice", val);
        o->specs[o->n_specs++] = val;
    } else if (strcmp(opt, "--chunk-bytes") == 0) {
        if (bench_parse_bytes(val, &o->chunk_bytes) != 0 || o->chunk_bytes % 4 != 0 ||
            o->chunk_bytes < 64 || o->chunk_bytes > ((size_t)1 << 30))
            return usage_error("bad --chunk-bytes '%s' (want bytes, a multiple of 4 from 64 to "
                               "1G, with an optional K, M or G suffix)", val);
    } else if (strcmp(opt, "--repeats") == 0) {
        if (bench_parse_int(val, 1, PSB_MAX_REPEATS, &o->repeats) != 0)
            return usage_error("bad --repeats '%s' (want a count of timed iterations, "
                               "1..10000)", val);
    } else if (strcmp(opt, "--provider") == 0) {
        if (strcmp(val, "shm") != 0 && strcmp(val, "tcp") != 0)
            return usage_error("bad --provider '%s' (want shm or tcp)", val);
        o->provider = val;
    } else if (strcmp(opt, "--results") == 0) {
        if (!val[0]) return usage_error("empty file name in --results%s", "");
        o->results = val;
    } else if (strcmp(opt, "--job") == 0) {
        if (strcmp(val, "ps") == 0)
            o->job_allreduce = 0;
        else if (strcmp(val, "allreduce") == 0)
            o->job_allreduce = 1;
        else
            return usage_error("bad --job '%s' (want ps or allreduce; the launcher sets it)",
                               val);
    }
    return 0;
}

int psb_parse_args(int argc, char **argv, psb_options *o) {
    static const size_t default_sizes[] = {(size_t)1 << 20, (size_t)4 << 20, (size_t)16 << 20,
                                           (size_t)64 << 20, (size_t)256 << 20};
    memset(o, 0, sizeof *o);
    o->servers[0] = 1, o->servers[1] = 2, o->n_servers = 2;
    o->workers[0] = 2, o->workers[1] = 4, o->n_workers = 2;
    for (size_t i = 0; i < sizeof default_sizes / sizeof default_sizes[0]; i++)
        o->sizes[o->n_sizes++] = default_sizes[i];
    o->specs[0] = PSB_DENSE, o->specs[1] = "int8", o->n_specs = 2;
    o->repeats = DEFAULT_REPEATS;
    o->provider = "tcp";
    int specs_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val;
        const char *opt = valued_option(a, &val);
        if (opt) {
            if (!val) {
                if (i + 1 >= argc) return usage_error("option '%s' needs a value", a);
                val = argv[++i];
            }
            int rc = apply_valued(o, opt, val, &specs_given);
            if (rc) return rc;
        } else if (strcmp(a, "--colocate") == 0) {
            o->colocate = 1;
        } else {
            int rc = bench_common_arg(WHO, a, usage, &o->csv, &o->quiet, &o->worker);
            if (rc) return rc;
        }
    }
    return 0;
}

/* A spec the library rejects, or one the parameter server refuses, is the
 * user's mistake: say so before any rank starts. */
static int check_specs(const psb_options *o) {
    for (size_t i = 0; i < o->n_specs; i++) {
        if (strcmp(o->specs[i], PSB_DENSE) == 0) continue;
        terse_codec *c = NULL;
        terse_status s = terse_codec_create(o->specs[i], 1, 64, &c);
        terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
        int two_rounds = s == TERSE_OK && terse_codec_get_traits(c, &t) == TERSE_OK &&
                         t.name && strcmp(t.name, "powersgd") == 0;
        terse_codec_free(c);
        if (s != TERSE_OK) {
            fprintf(stderr, WHO ": --codec '%s' is unusable (%s): %s\n", o->specs[i],
                    terse_status_name(s), terse_last_error());
            return s == TERSE_ERR_INVALID || s == TERSE_ERR_NOT_FOUND ? BENCH_EXIT_USAGE
                                                                       : BENCH_EXIT_RUNTIME;
        }
        if (two_rounds)
            return usage_error("--codec '%s' is refused by the parameter server: powersgd needs "
                               "two rounds of summing, a push is one message", o->specs[i]);
    }
    return 0;
}

/* ---------------------------------------------------------------- launcher */

/* This machine's CPU, from /proc/cpuinfo's first "model name". */
static void cpu_model(char *out, size_t cap) {
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        char *colon = strchr(line, ':');
        if (!colon) continue;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t') v++;
        size_t n = strcspn(v, "\n");
        while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t')) n--;
        if (n > 0) snprintf(out, cap, "%.*s", (int)n, v);
        break;
    }
    fclose(f);
}

static int skipped(int servers, int workers) {
    return servers + workers > PSB_MAX_RANKS;
}

/* Run one job: `nranks` ranks of this program with the options of o, one
 * (servers, workers) and --job. Appends what its rank 0 recorded to rows.
 * Returns 0, or 1 if the job failed (its rows are kept). */
static int run_job(const psb_options *o, int allreduce, int colocate, int servers, int workers,
                   bench_records *rows) {
    char s_arg[16], w_arg[16], r_arg[16], c_arg[32], sizes[1024], title[128];
    snprintf(s_arg, sizeof s_arg, "%d", servers);
    snprintf(w_arg, sizeof w_arg, "%d", workers);
    snprintf(r_arg, sizeof r_arg, "%d", o->repeats);
    snprintf(c_arg, sizeof c_arg, "%zu", o->chunk_bytes);
    size_t len = 0;
    sizes[0] = '\0';
    for (size_t i = 0; i < o->n_sizes; i++)
        len += (size_t)snprintf(sizes + len, sizeof sizes - len, "%s%zu", i ? "," : "",
                                o->sizes[i]);
    const char *argv[32 + 2 * PSB_MAX_SPECS];
    int k = 0;
    argv[k++] = "ps";
    argv[k++] = "--job";
    argv[k++] = allreduce ? "allreduce" : "ps";
    if (!allreduce) {
        argv[k++] = "--servers";
        argv[k++] = s_arg;
    }
    argv[k++] = "--workers";
    argv[k++] = w_arg;
    argv[k++] = "--sizes";
    argv[k++] = sizes;
    argv[k++] = "--repeats";
    argv[k++] = r_arg;
    argv[k++] = "--provider";
    argv[k++] = o->provider;
    if (!allreduce) {
        if (o->chunk_bytes) {
            argv[k++] = "--chunk-bytes";
            argv[k++] = c_arg;
        }
        for (size_t i = 0; i < o->n_specs; i++) {
            argv[k++] = "--codec";
            argv[k++] = o->specs[i];
        }
    }
    if (o->quiet) argv[k++] = "--quiet";
    if (colocate) argv[k++] = "--colocate";
    argv[k] = NULL;
    int nranks = allreduce ? workers : colocate ? workers : servers + workers;
    if (allreduce)
        snprintf(title, sizeof title, "dense allreduce among %d workers", workers);
    else if (colocate)
        snprintf(title, sizeof title, "parameter server, %d colocated ranks", workers);
    else
        snprintf(title, sizeof title, "parameter server, %d server%s and %d workers", servers,
                 servers == 1 ? "" : "s", workers);
    bench_job job = {WHO, "ps", nranks, o->provider, k, (char **)argv, o->quiet, title,
                     psb_record_parse, 0, NULL};
    int rc = bench_job_run(&job, rows);
    if (rc != 0) {
        if (rc > 0)
            fprintf(stderr, WHO ": the %s job (%d ranks) failed (terse-run exit status %d)\n",
                    allreduce ? "allreduce" : "parameter-server", nranks, rc);
        return 1;
    }
    return 0;
}

static const psb_row *find_row(const psb_row *rows, int n, int colocated, int servers,
                               int workers, size_t bytes, const char *spec) {
    for (int i = 0; i < n; i++)
        if (rows[i].colocated == colocated && rows[i].servers == servers &&
            rows[i].workers == workers && rows[i].bytes == bytes &&
            strcmp(rows[i].spec, spec) == 0)
            return &rows[i];
    return NULL;
}

/* The launcher: every job, then the table. */
static int launch(const psb_options *o, bench_records *ps_rows, bench_records *ar_rows) {
    int failed = 0, runnable = 0, max_ranks = 0;
    for (size_t w = 0; w < o->n_workers; w++)
        for (size_t s = 0; s < o->n_servers; s++)
            if (!skipped(o->servers[s], o->workers[w])) {
                runnable++;
                if (o->servers[s] + o->workers[w] > max_ranks)
                    max_ranks = o->servers[s] + o->workers[w];
            }
    if (!runnable)
        return usage_error("every combination of --servers and --workers needs more than %s "
                           "ranks", "6");
    char notes[PSB_MAX_LIST * PSB_MAX_LIST][128];
    size_t n_notes = 0;
    for (size_t s = 0; s < o->n_servers; s++)
        for (size_t w = 0; w < o->n_workers; w++)
            if (skipped(o->servers[s], o->workers[w])) {
                snprintf(notes[n_notes], sizeof notes[n_notes],
                         "skipped: %d server%s + %d workers is more than %d ranks",
                         o->servers[s], o->servers[s] == 1 ? "" : "s", o->workers[w],
                         PSB_MAX_RANKS);
                fprintf(stderr, WHO ": %s\n", notes[n_notes]);
                n_notes++;
            }
    bench_share_cores(max_ranks);

    /* Worker count outermost, so each allreduce runs next to the parameter
     * servers it is compared with. */
    for (size_t w = 0; w < o->n_workers; w++) {
        int workers = o->workers[w], any = 0;
        for (size_t s = 0; s < o->n_servers; s++) any |= !skipped(o->servers[s], workers);
        if (!any) continue;
        failed |= run_job(o, 1, 0, 0, workers, ar_rows);
        if (bench_interrupted()) return 128 + bench_interrupted();
        for (size_t s = 0; s < o->n_servers; s++) {
            if (skipped(o->servers[s], workers)) continue;
            failed |= run_job(o, 0, 0, o->servers[s], workers, ps_rows);
            if (bench_interrupted()) return 128 + bench_interrupted();
        }
        if (o->colocate) {
            failed |= run_job(o, 0, 1, workers, workers, ps_rows);
            if (bench_interrupted()) return 128 + bench_interrupted();
        }
    }

    const psb_row *ps = ps_rows->items, *ar = ar_rows->items;
    int n_ps = ps_rows->n, n_ar = ar_rows->n;
    char cpu[256];
    cpu_model(cpu, sizeof cpu);
    const char *provider = n_ps > 0 ? ps[0].provider : n_ar > 0 ? ar[0].provider : o->provider;
    psb_report_begin(o, cpu, provider);
    for (size_t i = 0; i < n_notes; i++) psb_report_note(o, notes[i]);
    for (size_t s = 0; s < o->n_servers + (o->colocate ? 1 : 0); s++)
        for (size_t w = 0; w < o->n_workers; w++) {
            const int colocated = s == o->n_servers;
            int servers = colocated ? o->workers[w] : o->servers[s], workers = o->workers[w];
            if (!colocated && skipped(servers, workers)) continue;
            for (size_t z = 0; z < o->n_sizes; z++)
                for (size_t c = 0; c < o->n_specs; c++) {
                    const psb_row *r =
                        find_row(ps, n_ps, colocated, servers, workers, o->sizes[z], o->specs[c]);
                    const psb_row *a = find_row(ar, n_ar, 0, 0, workers, o->sizes[z], PSB_DENSE);
                    psb_row missing;
                    if (!r) {
                        memset(&missing, 0, sizeof missing);
                        missing.servers = servers;
                        missing.colocated = colocated;
                        missing.workers = workers;
                        missing.bytes = o->sizes[z];
                        snprintf(missing.spec, sizeof missing.spec, "%s", o->specs[c]);
                        snprintf(missing.error, sizeof missing.error,
                                 "not measured: the parameter-server job failed (see above)");
                        r = &missing;
                    }
                    if (!r->ok || !a || !a->ok) failed = 1;
                    psb_report_row(o, r, a);
                }
        }
    if (bench_flush_results(WHO) != 0) return BENCH_EXIT_RUNTIME;
    return failed ? BENCH_EXIT_RUNTIME : BENCH_EXIT_OK;
}

int bench_ps_main(int argc, char **argv) {
    psb_options o;
    int rc = psb_parse_args(argc, argv, &o);
    if (rc < 0) return fflush(stdout) == 0 ? BENCH_EXIT_OK : BENCH_EXIT_RUNTIME;
    if (rc) return rc;
    if ((rc = check_specs(&o)) != 0) return rc;
    const char *rank = getenv("TERSE_RANK");
    if (!o.worker && !(rank && rank[0])) {
        bench_records ps = {NULL, 0, 0, sizeof(psb_row)}, ar = {NULL, 0, 0, sizeof(psb_row)};
        rc = launch(&o, &ps, &ar);
        bench_records_free(&ps);
        bench_records_free(&ar);
        return rc;
    }
    /* One rank of a job the launcher started. */
    if (!o.results)
        return usage_error("a rank needs --results FILE, which the launcher passes: start "
                           "terse-bench ps without terse-run (TERSE_RANK is set%s)",
                           rank && rank[0] ? "" : ", or --worker given");
    if ((!o.job_allreduce && o.n_servers != 1) || o.n_workers != 1)
        return usage_error("a rank measures one job: give one --servers and one --workers "
                           "value%s", "");
    return psb_worker_main(&o);
}
