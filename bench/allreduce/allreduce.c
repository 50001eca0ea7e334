/* terse-bench allreduce: terse_allreduce timed as nccl-tests times
 * all_reduce_perf, dense or through a codec, optionally beside Open MPI's
 * MPI_Allreduce measured in the same run.
 *
 * This file holds the command line and picks the role (allreduce.h): one
 * rank of a job (allreduce_worker.c) or the launcher (allreduce_launch.c). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <terse.h>

#include "allreduce/allreduce.h"
#include "core/bench.h"

#define DEFAULT_MIN_BYTES ((size_t)4 << 20)
#define DEFAULT_MAX_BYTES ((size_t)256 << 20)
#define DEFAULT_FACTOR 4
#define DEFAULT_ITERS 20
#define DEFAULT_WARMUP 2
#define DEFAULT_BUDGET 2.0

static void usage(FILE *f) {
    fprintf(f,
"usage: terse-bench allreduce [-c SPEC]... [-b BYTES] [-e BYTES] [-f N]\n"
"                             [-n N] [--provider P] [-r N] [-w N] [-t SEC]\n"
"                             [--shape RxC] [--op sum|avg] [--vs-mpi]\n"
"                             [--mpi-arg ARG]... [--overlap MS] [--parts]\n"
"                             [--model [--alpha US] [--link-gbps G]\n"
"                             [--shared-link]] [--hosts H [--link RATE]]\n"
"                             [--vs-flat] [--csv] [-q]\n"
"\n"
"Time terse_allreduce on fp32 buffers of a sweep of sizes, as nccl-tests'\n"
"all_reduce_perf does: dense, or compressed by a codec. Started by hand, it\n"
"launches N ranks on this host through terse-run (each rank is this program\n"
"again) and prints the table. Started as one rank of a job (TERSE_RANK,\n"
"OMPI_COMM_WORLD_RANK or PMI_RANK set, or --worker), it joins the job as\n"
"terse_comm_init does and rank 0 prints the table.\n"
"\n"
"options:\n"
"  -c, --codec SPEC     'dense' (no codec: the dense ring; the default) or a\n"
"                       codec spec, e.g. 'topk:ratio=0.01', 'powersgd:rank=4',\n"
"                       'sign', 'int8'. Repeat for several; each gets a block.\n"
"  -b, --minbytes N     smallest buffer in bytes, K/M/G suffixes (x1024),\n"
"                       a multiple of 4 (default 4M)\n"
"  -e, --maxbytes N     largest buffer (default 256M)\n"
"  -f, --stepfactor N   multiply the size by N each step (default 4)\n"
"      --shape RxC      the tensor shape, for codecs that see a matrix; it fixes\n"
"                       the one size measured at 4*R*C bytes (no -b/-e then).\n"
"                       Without it powersgd gets the most nearly square shape\n"
"                       (64M -> 4096x4096) and every other codec count x 1\n"
"  -n, --nranks N       ranks to launch (default 2; launcher only)\n"
"      --provider P     shm, tcp, rxm, verbs, efa, net or auto, passed to terse-run\n"
"                       (default: TERSE_PROVIDER, else terse's auto)\n"
"  -r, --iters N        timed iterations per row, at most (default %d)\n"
"  -w, --warmup N       untimed iterations first (default %d)\n"
"  -t, --budget SEC     stop timing a row after about SEC seconds, but not before\n"
"                       3 iterations (default %g): rank 0 sizes the count from\n"
"                       its last warm-up, so slow links finish in time\n"
"      --op sum|avg     the reduction (default sum)\n"
"      --vs-mpi         also run Open MPI's MPI_Allreduce (MPI_FLOAT, MPI_SUM, in\n"
"                       place) on the same sizes, same N, same iteration rules,\n"
"                       with terse-bench-mpi under mpirun, before terse's rows;\n"
"                       btl tcp,self for --provider tcp/verbs/efa, else\n"
"                       vader,self; always pml ob1, loopback only. Off shm,\n"
"                       terse's rows come twice: with its default MAC on every\n"
"                       chunk ([wire mac]) and with TERSE_WIRE=none ([wire none],\n"
"                       what Open MPI sends), unless TERSE_WIRE is set\n"
"      --mpi-arg ARG    one more argument for mpirun (repeat), e.g.\n"
"                       --mpi-arg --bind-to --mpi-arg none\n"
"      --overlap MS     also measure how much of each allreduce hides behind\n"
"                       computation: a fixed loop of cblas_sgemm calls (%dx%d,\n"
"                       one OpenBLAS thread), calibrated once at start to take\n"
"                       about MS milliseconds; each row then times the loop\n"
"                       alone, terse_allreduce_start + terse_request_wait\n"
"                       alone, and start, the loop, wait (see overlap below);\n"
"                       MS is 1..600000\n"
"      --parts          also time, for compressed rows on the all-gather paths\n"
"                       (gather, gather-pipe), the allreduce's two parts\n"
"                       apart, in the same run: its codec work alone (each\n"
"                       rank at once: one terse_encode of its buffer and N\n"
"                       terse_decode of that message, on a second codec of\n"
"                       the same spec) and its bytes alone (terse_allgather\n"
"                       of each rank's message, no codec); /max = time /\n"
"                       max(codec, wire) says how well the pipeline overlaps\n"
"                       them (1 = perfectly; the codec+wire sum = none)\n"
"      --model          after the table, predict each algorithm's time and bytes\n"
"                       per rank for 8 to 1024 ranks from an alpha-beta link\n"
"                       model and the codec speeds measured here in the same\n"
"                       run (encode, decode, fp32 add on the same data), and\n"
"                       check it against the rows just measured at -n ranks:\n"
"                       measured and predicted time and bytes side by side.\n"
"                       Bytes are exact for fixed-size codecs ('~': scaled\n"
"                       from the message encoded here). The formulas are in\n"
"                       bench/allreduce/allreduce_model.c and docs/collectives.md\n"
"      --alpha US       the model's per-message latency (default 10)\n"
"      --link-gbps G    the model's link bandwidth per rank, Gbit/s (default 25)\n"
"      --shared-link    the link is shared by all N ranks (B / N each), as on\n"
"                       bench/core/slow-net.sh's one shaped loopback\n"
"      --hosts H        (root) run the ranks on H \"hosts\" made of network\n"
"                       namespaces: terse-run --hosts H (ranks dealt in blocks\n"
"                       of ceil(N/H)); the topo column says HxL\n"
"      --link RATE      with --hosts: terse-run --link RATE, both directions of\n"
"                       every host link shaped with tc tbf (1gbit, 100mbit)\n"
"      --vs-flat        run every row a second time with TERSE_TOPOLOGY=flat (one\n"
"                       provider for every pair, the flat algorithms; a second\n"
"                       job) and print its time and time / flat time beside\n"
"                       each row (not with --vs-mpi)\n"
"      --worker         be one rank even without the variables above (under\n"
"                       torchrun or srun, say)\n"
"      --csv            CSV with a header row instead of the table\n"
"  -q, --quiet          no progress lines on stderr\n"
"  -h, --help           this text\n"
"\n"
"method: each rank fills its buffer with its own Gaussian-like data (seed +\n"
"rank) and keeps a copy; before every iteration the buffer is restored from\n"
"the copy (untimed) and the ranks meet in terse_barrier, then one\n"
"terse_allreduce is timed. A row's time is the median over iterations of the\n"
"slowest rank's time in that iteration (the ranks' times are all-gathered).\n"
"Byte counts come from terse_comm_get_stats over the timed iterations. Each\n"
"(codec, size) gets fresh codecs, one per rank, with stream rank = rank, so\n"
"error feedback accumulates across the row's iterations as in training.\n"
"\n"
"overlap (--overlap MS): each rank calibrates the sgemm loop (a call count)\n"
"once, before the first row, with every rank computing at once; rank 0's\n"
"count is used by all, and only the count: the measured loops never look at\n"
"the clock. After a row's blocking iterations come as many overlap\n"
"iterations, each three phases with a barrier before each: the loop alone;\n"
"terse_allreduce_start then terse_request_wait (buffer restored first);\n"
"start, the loop, then wait. Each phase's figure is the median over\n"
"iterations of the slowest rank's time, as for time. The progress thread\n"
"(TERSE_PROGRESS=thread, the default) runs the allreduce during the loop;\n"
"with TERSE_PROGRESS=caller it runs only inside wait, so nothing overlaps.\n"
"The loop shares the cores with the progress threads and, on tcp over\n"
"loopback, with the kernel's copies: N ranks on N cores cannot hide the\n"
"allreduce fully there. OpenBLAS is set to one thread in each rank, which\n"
"also applies to powersgd's products.\n"
"\n"
"columns (CSV names in brackets):\n"
"  size [bytes]           the fp32 buffer: 4 * count bytes\n"
"  count [count]          floats; shape [rows, cols] as given to the codec\n"
"  iters [iters]          timed iterations\n"
"  time [time_us]         microseconds per allreduce, as above\n"
"  topo [topology]        hosts x ranks per host from terse_comm_topology\n"
"                         (rank 0's host), or flat under TERSE_TOPOLOGY=flat\n"
"  algbw [algbw_gbps]     size / time, for every row, compressed or not:\n"
"                         nccl-tests' algbw (the tensor's bytes reduced per\n"
"                         second, whatever went on the wire)\n"
"  busbw [busbw_gbps]     algbw * 2(N-1)/N, nccl-tests' busbw: what each rank's\n"
"                         link would carry in a dense ring for the same time\n"
"  wirebw [wirebw_gbps]   wire/rank / time: what each rank's link did carry\n"
"                         (about busbw for dense, far less for a codec)\n"
"  wire/rank [wire_bytes] bytes on the wire sent per rank per allreduce (max\n"
"                         over ranks), payload plus terse's framing [also\n"
"                         payload_bytes]\n"
"  codec%% / net%% [codec_us, net_us]  the mean time per allreduce a rank\n"
"                         (the max over ranks) spent in encode/decode/reduction\n"
"                         and waiting on the network (terse_comm_stats), as a\n"
"                         share of the mean time per allreduce [mean_us]\n"
"  mpi time, mpi busbw [mpi_time_us, mpi_algbw_gbps, mpi_busbw_gbps]\n"
"                         Open MPI's dense MPI_Allreduce on the same size\n"
"  xMPI [vs_mpi]          algbw / MPI's algbw = MPI time / terse time (also\n"
"                         the busbw ratio)\n"
"  with --overlap [sgemm_calls: the loop's calls, the same on every rank]:\n"
"  comp(ms) [compute_ms]  the sgemm loop alone\n"
"  ar(ms) [allreduce_ms]  terse_allreduce_start + terse_request_wait alone\n"
"  ovl(ms) [overlapped_ms]  start, the loop, wait\n"
"  /max [overlap_vs_max]  ovl / max(comp, ar): 1 is perfect overlap\n"
"  /sum [overlap_vs_sum]  ovl / (comp + ar): 1 is no overlap at all\n"
"  with --parts:\n"
"  codec(ms) [codec_alone_ms]  one encode + N decodes, no wire\n"
"  wire(ms) [wire_alone_ms]    the messages' all-gather, no codec\n"
"  /max [parts_vs_max]   time / max(codec, wire)\n"
"  /sum [parts_vs_sum]   time / (codec + wire)\n"
"  with --vs-flat:\n"
"  flat(us) [flat_time_us]  the same row's time with TERSE_TOPOLOGY=flat\n"
"  /flat [vs_flat]        time / flat time: below 1 the topology-aware run wins\n"
"\n"
"environment: TERSE_RUN, TERSE_BENCH_MPI and MPIRUN name the programs to use\n"
"(default: beside this binary, then PATH). TERSE_TIMEOUT_MS reaches the\n"
"ranks through terse-run. OPENBLAS_NUM_THREADS, if unset, is set to cores / N\n"
"(at least 1) for the ranks, so N ranks do not oversubscribe the cores.\n"
"TERSE_PROGRESS (thread or caller) reaches the ranks too.\n"
"\n"
"exit status: 0 ok, 1 runtime failure (a rank or the MPI run failed), 2 usage\n"
"error.\n",
            DEFAULT_ITERS, DEFAULT_WARMUP, DEFAULT_BUDGET, AR_COMPUTE_DIM, AR_COMPUTE_DIM);
}

/* ---------------------------------------------------------------- options */

static int usage_error(const char *fmt, const char *what) {
    return bench_usage_error("terse-bench allreduce", fmt, what);
}

static int parse_shape(const char *text, size_t *rows, size_t *cols) {
    char *end;
    errno = 0;
    unsigned long long r = strtoull(text, &end, 10);
    if (errno || end == text || (*end != 'x' && *end != 'X')) return -1;
    const char *c_text = end + 1;
    unsigned long long c = strtoull(c_text, &end, 10);
    if (errno || end == c_text || *end || r == 0 || c == 0 || c_text[0] == '-') return -1;
    if (r > TERSE_MAX_ELEMENTS || c > TERSE_MAX_ELEMENTS / r) return -1;
    *rows = (size_t)r;
    *cols = (size_t)c;
    return 0;
}

/* Options that take a value: short letter (0 if none) and long name. */
static const struct {
    char short_name;
    const char *long_name;
} valued[] = {
    {'c', "--codec"},  {'b', "--minbytes"}, {'e', "--maxbytes"}, {'f', "--stepfactor"},
    {'n', "--nranks"}, {'r', "--iters"},    {'w', "--warmup"},   {'t', "--budget"},
    {'P', "--provider"}, {'S', "--shape"},  {'O', "--op"},       {'M', "--mpi-arg"},
    {'R', "--results"}, {'V', "--overlap"}, {'A', "--alpha"}, {'L', "--link-gbps"},
    {'H', "--hosts"},   {'K', "--link"},
};
#define N_VALUED (sizeof valued / sizeof valued[0])

/* Which valued option `a` is (0 if none); *inline_val gets "-cX"'s X or
 * "--codec=X"'s X. */
static char valued_option(const char *a, const char **inline_val) {
    *inline_val = NULL;
    if (a[0] != '-') return 0;
    if (a[1] != '-') {
        for (size_t i = 0; i < N_VALUED; i++)
            if (a[1] && a[1] == valued[i].short_name && a[1] >= 'a') {
                *inline_val = a[2] ? a + 2 : NULL;
                return a[1];
            }
        return 0;
    }
    const char *eq = strchr(a, '=');
    size_t len = eq ? (size_t)(eq - a) : strlen(a);
    for (size_t i = 0; i < N_VALUED; i++)
        if (strlen(valued[i].long_name) == len && strncmp(a, valued[i].long_name, len) == 0) {
            *inline_val = eq ? eq + 1 : NULL;
            return valued[i].short_name;
        }
    return 0;
}

/* Apply one valued option. Returns 0 or an exit code. */
static int apply_valued(ar_options *o, char opt, const char *a, const char *val, size_t *b,
                        size_t *e, int *f, int *have_sweep) {
    switch (opt) {
    case 'c':
        if (o->n_specs == AR_MAX_SPECS) return usage_error("too many -c options (at '%s')", val);
        if (!val[0] || strchr(val, '\t')) return usage_error("bad codec spec in '%s'", a);
        o->specs[o->n_specs++] = val;
        return 0;
    case 'b':
    case 'e':
        if (bench_parse_bytes(val, opt == 'b' ? b : e) != 0 || (opt == 'b' ? *b : *e) % 4 != 0 ||
            (opt == 'b' ? *b : *e) / 4 > TERSE_MAX_ELEMENTS)
            return usage_error("bad size '%s' (want bytes, a multiple of 4, with an optional "
                               "K, M or G suffix)", val);
        *have_sweep = 1;
        return 0;
    case 'f':
        if (bench_parse_int(val, 2, 1024, f) != 0)
            return usage_error("bad step factor '%s' in -f (want 2..1024)", val);
        return 0;
    case 'n':
        if (bench_parse_int(val, 1, 1024, &o->nranks) != 0)
            return usage_error("bad rank count '%s' in -n (want 1..1024)", val);
        return 0;
    case 'r':
        if (bench_parse_int(val, 1, AR_MAX_ITERS, &o->iters) != 0)
            return usage_error("bad iteration count '%s' in -r (want 1..10000)", val);
        return 0;
    case 'w':
        if (bench_parse_int(val, 0, AR_MAX_ITERS, &o->warmup) != 0)
            return usage_error("bad warm-up count '%s' in -w (want 0..10000)", val);
        return 0;
    case 't': {
        char *end;
        o->budget = strtod(val, &end);
        if (end == val || *end || !(o->budget > 0) || o->budget > 86400)
            return usage_error("bad time budget '%s' in -t (want seconds > 0)", val);
        return 0;
    }
    case 'P':
        if (!val[0]) return usage_error("empty provider in '%s'", a);
        o->provider = val;
        return 0;
    case 'S':
        if (parse_shape(val, &o->shape_rows, &o->shape_cols) != 0)
            return usage_error("bad shape '%s' in --shape (want RxC, e.g. 4096x4096)", val);
        return 0;
    case 'O':
        if (strcmp(val, "sum") == 0)
            o->op_avg = 0;
        else if (strcmp(val, "avg") == 0)
            o->op_avg = 1;
        else
            return usage_error("bad --op '%s' (want sum or avg)", val);
        return 0;
    case 'M':
        if (o->n_mpi_args == AR_MAX_MPI_ARGS)
            return usage_error("too many --mpi-arg options (at '%s')", val);
        o->mpi_args[o->n_mpi_args++] = val;
        return 0;
    case 'R':
        o->results = val;
        return 0;
    case 'V':
        if (bench_parse_int(val, 1, 600000, &o->overlap_ms) != 0)
            return usage_error("bad --overlap '%s' (want milliseconds, 1..600000)", val);
        return 0;
    case 'A':
    case 'L': {
        char *end;
        double v = strtod(val, &end);
        if (end == val || *end || !(v > 0) || v > 1e9)
            return opt == 'A' ? usage_error("bad --alpha '%s' (want microseconds > 0)", val)
                              : usage_error("bad --link-gbps '%s' (want Gbit/s > 0)", val);
        if (opt == 'A') o->model_alpha_us = v;
        else o->model_link_gbps = v;
        return 0;
    }
    case 'H': {
        char *end;
        long v = strtol(val, &end, 10);
        if (end == val || *end || v < 1 || v > 250)
            return usage_error("bad --hosts '%s' (want 1..250)", val);
        o->hosts = (int)v;
        return 0;
    }
    case 'K':
        /* terse-run checks the rate before it creates anything */
        if (!val[0]) return usage_error("empty rate in '%s'", a);
        o->link = val;
        return 0;
    default:
        return usage_error("unknown option '%s'", a);
    }
}

/* Expand -b/-e/-f (or --shape) into o->sizes. */
static int make_sweep(ar_options *o, size_t b, size_t e, int f, int have_sweep) {
    o->n_sizes = 0;
    if (o->shape_rows) {
        if (have_sweep) return usage_error("%s fixes the size: drop -b and -e", "--shape");
        o->sizes[o->n_sizes++] = 4 * o->shape_rows * o->shape_cols;
        return 0;
    }
    if (b > e) return usage_error("-b is larger than -e%s", "");
    for (size_t s = b; s <= e; s *= (size_t)f) {
        if (o->n_sizes == AR_MAX_SIZES) return usage_error("the sweep has too many sizes%s", "");
        o->sizes[o->n_sizes++] = s;
        if (s > SIZE_MAX / (size_t)f) break;
    }
    return 0;
}

int ar_parse_args(int argc, char **argv, ar_options *o) {
    memset(o, 0, sizeof *o);
    o->nranks = 2;
    o->iters = DEFAULT_ITERS;
    o->warmup = DEFAULT_WARMUP;
    o->budget = DEFAULT_BUDGET;
    o->model_alpha_us = 10;
    o->model_link_gbps = 25;
    size_t b = DEFAULT_MIN_BYTES, e = DEFAULT_MAX_BYTES;
    int f = DEFAULT_FACTOR, have_sweep = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val;
        char opt = valued_option(a, &val);
        if (opt) {
            if (!val) {
                if (i + 1 >= argc) return usage_error("option '%s' needs a value", a);
                val = argv[++i];
            }
            int rc = apply_valued(o, opt, a, val, &b, &e, &f, &have_sweep);
            if (rc) return rc;
        } else if (strcmp(a, "--vs-mpi") == 0) {
            o->vs_mpi = 1;
        } else if (strcmp(a, "--model") == 0) {
            o->model = 1;
        } else if (strcmp(a, "--shared-link") == 0) {
            o->model_shared = 1;
        } else if (strcmp(a, "--vs-flat") == 0) {
            o->vs_flat = 1;
        } else if (strcmp(a, "--parts") == 0) {
            o->parts = 1;
        } else {
            int rc = bench_common_arg("terse-bench allreduce", a, usage, &o->csv, &o->quiet,
                                      &o->worker);
            if (rc) return rc;
        }
    }
    if (o->n_specs == 0) o->specs[o->n_specs++] = AR_DENSE;
    if (o->link && !o->hosts) return usage_error("%s shapes the links of --hosts: add --hosts H",
                                                 "--link");
    if (o->vs_flat && o->vs_mpi)
        return usage_error("%s and --vs-mpi do not go together yet: run them apart",
                           "--vs-flat");
    return make_sweep(o, b, e, f, have_sweep);
}

/* ---------------------------------------------------------------- shapes */

static int is_powersgd(const char *spec) {
    return strncmp(spec, "powersgd", 8) == 0 && (spec[8] == '\0' || spec[8] == ':');
}

void ar_shape_for(const ar_options *o, const char *spec, size_t bytes, size_t *rows,
                  size_t *cols) {
    size_t n = bytes / 4;
    if (o->shape_rows) {
        *rows = o->shape_rows;
        *cols = o->shape_cols;
    } else if (is_powersgd(spec)) {
        /* The most nearly square rows x cols == n with rows <= cols. */
        size_t r = (size_t)sqrt((double)n);
        while (r > 1 && r * r > n) r--;
        while ((r + 1) * (r + 1) <= n) r++;
        while (n % r) r--;
        *rows = r;
        *cols = n / r;
    } else {
        *rows = n;
        *cols = 1;
    }
}

/* A spec the library rejects is the user's mistake: say so before any rank
 * starts, rather than after the MPI baseline has run. */
static int check_specs(const ar_options *o) {
    for (size_t i = 0; i < o->n_specs; i++) {
        if (strcmp(o->specs[i], AR_DENSE) == 0) continue;
        size_t rows, cols;
        ar_shape_for(o, o->specs[i], o->sizes[0], &rows, &cols);
        terse_codec *c = NULL;
        terse_status s = terse_codec_create(o->specs[i], rows, cols, &c);
        terse_codec_free(c);
        if (s != TERSE_OK) {
            fprintf(stderr, "terse-bench allreduce: codec '%s' unusable (%s): %s\n",
                    o->specs[i], terse_status_name(s), terse_last_error());
            return s == TERSE_ERR_INVALID || s == TERSE_ERR_NOT_FOUND ? BENCH_EXIT_USAGE
                                                                       : BENCH_EXIT_RUNTIME;
        }
    }
    return 0;
}

int bench_allreduce_main(int argc, char **argv) {
    ar_options o;
    int rc = ar_parse_args(argc, argv, &o);
    if (rc < 0) return fflush(stdout) == 0 ? BENCH_EXIT_OK : BENCH_EXIT_RUNTIME;
    if (rc) return rc;
    if ((rc = check_specs(&o)) != 0) return rc;
    /* A launcher made us one rank of a job: measure. Otherwise we are the
     * launcher. torchrun's RANK and Slurm's SLURM_PROCID are not taken as
     * the sign: they are also set in shells that are not one rank of a job
     * (--worker says it there). */
    static const char *const rank_vars[] = {"TERSE_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"};
    int is_rank = o.worker;
    for (size_t i = 0; i < sizeof rank_vars / sizeof rank_vars[0]; i++) {
        const char *v = getenv(rank_vars[i]);
        if (v && v[0]) is_rank = 1;
    }
    return is_rank ? ar_worker_main(&o) : ar_launch(argc, argv, &o);
}
