/* allreduce.h -- what the pieces of `terse-bench allreduce` share: the
 * options, one measured row, and the record format that carries rows from
 * the ranks (and from the Open MPI peer program) back to the process that
 * prints the table.
 *
 * The subcommand runs in one of two roles:
 *   launcher  TERSE_RANK is unset: it starts the Open MPI baseline (with
 *             --vs-mpi), then itself under terse-run with --worker, reads
 *             both result files and prints the table (allreduce.c).
 *   rank      TERSE_RANK is set (by terse-run or by hand): it joins the job
 *             and measures (allreduce_worker.c). Rank 0 writes records to
 *             --results FILE, or, without it, prints the table itself. */
#ifndef TERSE_BENCH_ALLREDUCE_H
#define TERSE_BENCH_ALLREDUCE_H

#include <stddef.h>
#include <stdio.h>

#define AR_MAX_SPECS 32
#define AR_MAX_SIZES 64
#define AR_MAX_MPI_ARGS 32
#define AR_MAX_ITERS 10000
/* The spec that means "no codec": terse_allreduce(..., NULL, ...). */
#define AR_DENSE "dense"

typedef struct {
    const char *specs[AR_MAX_SPECS]; /* "dense" or a codec spec */
    size_t n_specs;
    size_t sizes[AR_MAX_SIZES]; /* bytes, each a multiple of 4 */
    size_t n_sizes;
    size_t shape_rows, shape_cols; /* --shape, or 0 */
    int nranks;                    /* -n */
    const char *provider;          /* --provider, or NULL */
    int iters, warmup;             /* -r, -w */
    double budget;                 /* -t: seconds of timed iterations per row */
    int op_avg;                    /* --op avg */
    int csv, quiet, vs_mpi;
    const char *mpi_args[AR_MAX_MPI_ARGS]; /* --mpi-arg, appended to mpirun's */
    size_t n_mpi_args;
    int overlap_ms;      /* --overlap MS, or 0 */
    int parts;           /* --parts: time the codec alone and the wire alone */
    int model;           /* --model: the alpha-beta prediction (allreduce_model.c) */
    double model_alpha_us, model_link_gbps; /* --alpha, --link-gbps */
    int model_shared;    /* --shared-link: the link is shared by all N ranks */
    int hosts;           /* --hosts H: terse-run --hosts H (network-namespace hosts), or 0 */
    const char *link;    /* --link RATE: terse-run --link RATE, or NULL */
    int vs_flat;         /* --vs-flat: every row again with TERSE_TOPOLOGY=flat */
    int worker;          /* --worker: started by the launcher through terse-run */
    const char *results; /* --results FILE: where rank 0 writes records */
} ar_options;

/* One measured (spec, size): terse's, or with is_mpi Open MPI's dense. */
typedef struct {
    int is_mpi;
    int ok;                /* 0: failed, error says why */
    char spec[256];        /* as given ("dense" for none) */
    char provider[64];     /* terse_comm_provider(), or the MPI btl */
    char algo[16];         /* terse_allreduce_algorithm(), or "mpi" */
    char topo[16];         /* "HxL" (hosts x rank 0's host's ranks, terse_comm_topology),
                            * "flat" under TERSE_TOPOLOGY=flat, or "" (MPI) */
    int nranks;
    size_t rows, cols;     /* the codec's shape; count = rows * cols */
    size_t bytes;          /* 4 * count: the fp32 buffer reduced */
    int iters;             /* timed iterations */
    double time_s;         /* median over iterations of the slowest rank's time */
    double mean_s;         /* their mean: what codec_s and net_s are shares of */
    double wire_sent;      /* bytes on the wire per rank per op (max over ranks) */
    double payload_sent;   /* the payload part of it */
    double codec_s, net_s; /* per op (max over ranks): codec arithmetic, waiting */
    /* --overlap (all 0 without it): medians over the timed iterations of the
     * slowest rank's seconds for the sgemm loop alone, start + wait alone,
     * and start + the loop + wait; the loop's sgemm call count. */
    long compute_calls;
    double compute_s, alone_s, overlap_s;
    /* --parts (0 without it, or for an algorithm it does not model): the
     * medians of the slowest rank's seconds for this rank's codec work
     * alone (one encode, N decodes) and for its messages' bytes alone
     * (terse_allgather of them, no codec). */
    double codec_alone_s, wire_alone_s;
    char error[512];
} ar_row;

/* ---- options (allreduce.c) */

/* Parse argv (argv[0] is "allreduce"). Returns 0 to run, -1 after --help,
 * or an exit code. */
int ar_parse_args(int argc, char **argv, ar_options *o);

/* The codec shape for a buffer of `bytes`: --shape if given, a near-square
 * matrix for powersgd (whose low rank needs one), else count x 1. */
void ar_shape_for(const ar_options *o, const char *spec, size_t bytes, size_t *rows,
                  size_t *cols);

/* ---- the launcher (allreduce_launch.c) */

/* Run the MPI baseline if asked, then N ranks through terse-run (argv is
 * passed on to them), and print the table. Returns an exit code. */
int ar_launch(int argc, char **argv, const ar_options *o);

/* ---- the ranks (allreduce_worker.c) */

/* Join the job from the environment and measure every (spec, size). */
int ar_worker_main(const ar_options *o);

/* ---- the computation of --overlap (allreduce_overlap.c) */

/* sgemm on AR_COMPUTE_DIM-square fp32 matrices: small enough to stay in a
 * core's caches, large enough that a call is a fraction of a millisecond. */
#define AR_COMPUTE_DIM 256

typedef struct {
    int dim;
    float *a, *b, *c;
    long calls;    /* sgemm calls per ar_compute_run, fixed at calibration */
    double call_s; /* seconds per call as calibrated */
} ar_compute;

/* Allocate the matrices, set OpenBLAS to one thread, and calibrate calls so
 * that ar_compute_run takes about ms milliseconds on this core now. 0, or
 * -1 when out of memory. */
int ar_compute_init(ar_compute *k, int ms);
/* Exactly k->calls sgemm calls: the same work every time. */
void ar_compute_run(const ar_compute *k);
void ar_compute_free(ar_compute *k);

/* ---- --model (allreduce_model.c) */

/* Measure each codec here and print the prediction, checked against the
 * rows measured (n of them). */
void ar_model_report(const ar_options *o, const ar_row *rows, int n);

/* ---- records and output (allreduce_report.c) */

/* One line per row, tab separated (specs contain commas but never tabs). */
void ar_record_write(FILE *f, const ar_row *r);
/* One line into the ar_row at record: 0, or -1 if it is malformed (a
 * bench_record_parse, for bench_records_read and bench_job_run). */
int ar_record_parse(char *line, void *record);

/* The table (or CSV). mpi may be NULL (no --vs-mpi); otherwise the MPI row
 * of the same size, if any, is printed beside each terse row; likewise flat,
 * the same (spec, size) measured with TERSE_TOPOLOGY=flat (--vs-flat). */
void ar_report_begin(const ar_options *o, const char *provider, int nranks, int have_mpi);
void ar_report_spec(const ar_options *o, const char *spec);
void ar_report_row(const ar_options *o, const ar_row *r, const ar_row *mpi,
                   const ar_row *flat);

/* A row's algbw and busbw (nccl-tests': tensor bytes / time, and times
 * 2(N-1)/N) and wirebw (wire bytes sent per rank / time), GB/s, as the help
 * text defines them. */
double ar_algbw(const ar_row *r);
double ar_busbw(const ar_row *r);
double ar_wirebw(const ar_row *r);

#endif
