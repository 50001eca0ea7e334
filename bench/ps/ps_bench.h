/* ps_bench.h -- what the pieces of `terse-bench ps` share: the options,
 * one measured row, and the records that carry rows from the ranks back to
 * the process that prints the table.
 *
 * The subcommand runs in one of two roles:
 *   launcher  TERSE_RANK is unset: for every (servers, workers) it runs
 *             this program again under terse-run as servers + workers
 *             ranks with --job ps, and for every worker count once more as
 *             `workers` ranks with --job allreduce; it reads the records
 *             they wrote and prints the table (ps_bench.c).
 *   rank      TERSE_RANK is set, or --worker: one rank of one of those
 *             jobs (ps_bench_worker.c). Rank 0 writes records to --results.
 * Public API only (include/terse.h). */
#ifndef TERSE_BENCH_PS_H
#define TERSE_BENCH_PS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define PSB_MAX_LIST 16   /* --servers, --workers: values in a list */
#define PSB_MAX_SIZES 32  /* --sizes */
#define PSB_MAX_SPECS 16  /* --codec */
#define PSB_MAX_RANKS 6   /* servers + workers of one job */
#define PSB_MAX_REPEATS 10000
#define PSB_WARMUP 1      /* untimed iterations before the repeats */
/* The spec that means "no codec": NULL push and pull specs, NULL codec. */
#define PSB_DENSE "dense"

typedef struct {
    int servers[PSB_MAX_LIST];
    size_t n_servers;
    int workers[PSB_MAX_LIST];
    size_t n_workers;
    size_t sizes[PSB_MAX_SIZES]; /* bytes, each a multiple of 4 */
    size_t n_sizes;
    const char *specs[PSB_MAX_SPECS]; /* "dense" or a codec spec */
    size_t n_specs;
    size_t chunk_bytes; /* --chunk-bytes, or 0: the library's default */
    int repeats;        /* timed iterations per row */
    const char *provider; /* "shm" or "tcp" */
    int csv, quiet;
    /* The rank role (internal options, passed by the launcher). */
    int worker;          /* --worker */
    const char *results; /* --results FILE */
    int job_allreduce;   /* --job allreduce (else --job ps) */
    /* --colocate. Launcher: one more job per worker count, of `workers`
     * ranks each a worker and a server (terse_ps_config.colocate). Rank:
     * this job is that one (--servers then equals --workers). */
    int colocate;
} psb_options;

/* One measured row. A ps row has servers > 0; an allreduce row servers 0
 * and spec "dense". */
typedef struct {
    int ok;
    int servers, workers;
    size_t bytes;          /* the fp32 buffer: 4 * floats */
    char spec[256];        /* as given ("dense" for none) */
    char provider[64];     /* terse_comm_provider() */
    int iters;             /* timed iterations */
    double time_s;         /* median over iterations of the slowest worker's time */
    double sent, recv;     /* wire bytes per worker per iteration (max over workers) */
    /* the workers' interfaces (link_meter.c; 0 when not measured): bytes
     * per iteration each way (max over workers), and the duplex share (the
     * share of busy milliseconds with both directions busy; mean over
     * workers and iterations) */
    double link_up, link_down, duplex;
    int colocated;         /* ps: every rank a worker and a server (servers == workers) */
    int n_placed;          /* ps: servers in placed[] */
    uint64_t placed[PSB_MAX_RANKS]; /* ps: bytes of this row's key on each server */
    char error[512];
} psb_row;

/* ---- options (ps_bench.c) */

/* Parse argv (argv[0] is "ps"). Returns 0 to run, -1 after --help, or an
 * exit code. */
int psb_parse_args(int argc, char **argv, psb_options *o);

/* link_meter.c: watch interface iface (a thread reads its counters every
 * millisecond); -1 when it cannot be read (then begin/end give valid 0). */
typedef struct {
    unsigned long long tx, rx; /* the counters at begin */
    double up, down, duplex;   /* at end: bytes each way, the duplex share */
    int valid;
} psb_link;
int psb_link_start(const char *iface);
void psb_link_begin(psb_link *l);
void psb_link_end(psb_link *l);
void psb_link_stop(void);

/* ---- the ranks (ps_bench_worker.c) */

/* Join the job from the environment and run o's job; rank 0 writes the
 * records to o->results. Returns an exit code. */
int psb_worker_main(const psb_options *o);

/* ---- records and output (ps_bench_report.c) */

void psb_record_write(FILE *f, const psb_row *r);
/* One line into the psb_row at record: 0, or -1 if it is malformed (a
 * bench_record_parse). */
int psb_record_parse(char *line, void *record);

/* max/mean of a row's bytes over its servers (1 = even), 0 if none. */
double psb_balance(const psb_row *r);

/* The table (or CSV): a header, then one line per ps row with the
 * allreduce row of the same workers and bytes beside it (ar may be NULL
 * or failed). */
void psb_report_begin(const psb_options *o, const char *cpu, const char *provider);
void psb_report_note(const psb_options *o, const char *note);
void psb_report_row(const psb_options *o, const psb_row *ps, const psb_row *ar);

#endif
