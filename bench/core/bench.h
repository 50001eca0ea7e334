/* bench.h -- what the terse-bench subcommands share: the command-line
 * conventions, timing, the synthetic gradient, the records that carry
 * results between processes, child programs, and the launcher of jobs of
 * ranks. terse-bench is a user of the public API (include/terse.h) only. */
#ifndef TERSE_BENCH_H
#define TERSE_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Exit codes of every subcommand. */
enum { BENCH_EXIT_OK = 0, BENCH_EXIT_RUNTIME = 1, BENCH_EXIT_USAGE = 2 };

/* Subcommands: argv[0] is the subcommand name. Each returns an exit code. */
int bench_codecs_main(int argc, char **argv);
int bench_allreduce_main(int argc, char **argv);
int bench_train_main(int argc, char **argv);
int bench_ps_main(int argc, char **argv);

/* ---- command line (main.c) */

/* Parse an element count: decimal digits with an optional K (x1024) or M
 * (x1024^2) suffix, either case. Returns 0 and sets *n (> 0), or -1. */
int bench_parse_count(const char *text, size_t *n);
/* A byte size: decimal digits with an optional K, M or G (x1024^k) suffix
 * and an optional B ("4MB" reads as "4M"). 0 and *out > 0, or -1. */
int bench_parse_bytes(const char *text, size_t *out);
/* A decimal integer in [lo, hi]. 0 or -1. */
int bench_parse_int(const char *text, long lo, long hi, int *out);

/* The shortest label bench_parse_count reads back as n: "64K", "16M",
 * "1000". Writes into buf (cap >= 24). */
const char *bench_count_label(size_t n, char *buf, size_t cap);

/* "WHO: " then fmt with what, then "(try WHO --help)", on stderr; returns
 * BENCH_EXIT_USAGE. who is "terse-bench SUBCOMMAND". */
int bench_usage_error(const char *who, const char *fmt, const char *what);

/* The last resort of a subcommand's argument loop, for what its own
 * options are not: --csv, -q/--quiet and, unless worker is NULL, --worker
 * set their flag (0); -h/--help prints usage on stdout (-1); anything else
 * is a usage error of who (BENCH_EXIT_USAGE). */
int bench_common_arg(const char *who, const char *a, void (*print_usage)(FILE *f),
                     int *csv, int *quiet, int *worker);

/* ---- timing (measure.c) */

/* Monotonic seconds. */
double bench_now(void);

/* Median of v[0..n) (n >= 1); reorders v. */
double bench_median(double *v, size_t n);

/* One timed operation; returns 0 on success, nonzero to abort timing. */
typedef int (*bench_op)(void *arg);

/*
 * Time op: one warm-up call (not counted; skipped when warm_seconds >= 0,
 * meaning the caller already made it and it took that long), then
 * `repeats` samples. Small operations are called several times per sample
 * so a sample lasts at least BENCH_MIN_SAMPLE_SECONDS (a call is never
 * batched more than BENCH_MAX_BATCH times); samples[i] is the mean seconds
 * per call in sample i. Returns 0, or op's nonzero result.
 */
#define BENCH_MIN_SAMPLE_SECONDS 0.005
#define BENCH_MAX_BATCH 100000L
int bench_time(bench_op op, void *arg, int repeats, double warm_seconds, double *samples);

/* Time memcpy(dst, src, bytes) as bench_time does; dst and src must not
 * overlap and should have been touched already. */
void bench_time_memcpy(void *dst, const void *src, size_t bytes, int repeats, double *samples);

/* 64-byte aligned allocation of at least `bytes` (rounded up); free() it.
 * Returns NULL on failure. */
void *bench_alloc(size_t bytes);

/* ---- input (gradient.c) */

/* Fill x[0..n) with a deterministic Gaussian-like sequence (mean 0,
 * variance 1, tails cut at +-3.46) that depends only on seed and i. */
void bench_gradient_fill(float *x, size_t n, uint64_t seed);

/* ---- records (record.c) */

/* Copy src into dst (cap bytes, always terminated) with tabs and line
 * breaks made spaces, so a text stays one field of a record. Returns dst. */
const char *bench_field_copy(char *dst, size_t cap, const char *src);

/* Print s on stdout as one quoted CSV field (RFC 4180: quotes doubled). */
void bench_csv_quoted(const char *s);

/* Cut line (its newline dropped) at tabs into at most cap fields, in place;
 * returns how many. */
int bench_split_tabs(char *line, char **fields, int cap);

/* Records of one kind in a growing array: n of them, `size` bytes each, at
 * items. Start from {NULL, 0, 0, sizeof (record)}; bench_records_free. */
typedef struct {
    void *items;
    int n, cap;
    size_t size;
} bench_records;

/* Read one line of a results file (its newline may still be on; it may be
 * cut in place) into *record: 0, or -1 to pass the line over. */
typedef int (*bench_record_parse)(char *line, void *record);

/* Append to set every line of the file at path that parse takes (a line
 * longer than 2047 bytes is read in pieces). Returns how many it appended,
 * or -1 if the file cannot be read. Out of memory, it says so on stderr
 * (`who` first) and keeps the records read until then. */
int bench_records_read(const char *who, const char *path, bench_record_parse parse,
                       bench_records *set);
void bench_records_free(bench_records *set);

/* ---- child programs (spawn.c) */

/* The directory holding this executable (from /proc/self/exe). 0 or -1. */
int bench_self_dir(char *out, size_t cap);

/* Find an executable: the environment variable env_var if set (then it
 * must name an executable file, else -1), else the first of near_self
 * (NULL-terminated paths relative to this executable's directory, may be
 * NULL) that exists, else `name` on PATH. 0 with the path in out, or -1. */
int bench_find_program(const char *env_var, const char *const *near_self, const char *name,
                       char *out, size_t cap);

/* Run argv[0] (a path) with argv and wait for it. SIGINT, SIGTERM and SIGHUP
 * that reach us meanwhile are forwarded to it. Returns its exit status,
 * 128 + signal if a signal ended it, or -1 if it could not be run. */
int bench_run_child(char *const argv[]);

/* The signal forwarded by bench_run_child since the start, or 0. */
int bench_interrupted(void);

/* Create an empty private file $TMPDIR/terse-bench-TAG-XXXXXX (mkstemp);
 * its path in out. 0 or -1 (errno). The caller unlinks it. */
int bench_temp_file(const char *tag, char *out, size_t cap);

/* OpenBLAS starts a thread per core in every process by default: N workers
 * on one host would oversubscribe the cores N times over. Unless the user
 * set OPENBLAS_NUM_THREADS, share the cores out (at least one each); the
 * children inherit it. */
void bench_share_cores(int nworkers);

/* ---- the launcher (launch.c) */

/* One job of a benchmark: this program again as nranks ranks,
 *     terse-run -n N [--provider P] terse-bench ARGV... --worker --results F
 * whose rank 0 writes one record per line to the file F. */
typedef struct {
    const char *who;          /* prefixes messages: "terse-bench ps" */
    const char *tag;          /* names F: $TMPDIR/terse-bench-TAG-XXXXXX */
    int nranks;
    const char *provider;     /* terse-run's --provider, or NULL: its default */
    int argc;                 /* the ranks' arguments (argv[0] the subcommand) */
    char **argv;
    int quiet;                /* 1: do not show terse-run's command line */
    const char *title;        /* what the job is, said before it starts unless
                                 quiet (after the file F is made), or NULL */
    bench_record_parse parse; /* reads one line of F */
    int hosts;                /* terse-run's --hosts H, or 0 (one host) */
    const char *link;         /* terse-run's --link RATE with hosts, or NULL */
} bench_job;

/* What bench_job_run returns when the job did not run (it said why). */
enum {
    BENCH_JOB_NOT_RUN = -1, /* terse-run or this program not found, or not started */
    BENCH_JOB_NO_FILE = -2, /* no temporary file for the records */
};

/* Run job to its end (as bench_run_child: signals reach terse-run too) and
 * append the records its rank 0 wrote to set, those of a failed job too;
 * F is removed. Returns terse-run's exit status (128 + signal if a signal
 * ended it), or one of the values above. */
int bench_job_run(const bench_job *job, bench_records *set);

/* A launcher's last step, once its table is printed: flush stdout. 0, or
 * -1 after "WHO: cannot write the results" on stderr. */
int bench_flush_results(const char *who);

#endif
