/* terse-bench allreduce, the launcher role (allreduce.h): run the Open MPI
 * baseline (--vs-mpi), then this program again as N ranks under terse-run
 * with --worker, and print the rows both wrote back, side by side. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "allreduce.h"
#include "bench.h"

#define MAX_ROWS (AR_MAX_SPECS * AR_MAX_SIZES + AR_MAX_SIZES)

/* tcp-like providers get Open MPI's tcp btl; shm and auto (which picks shm
 * for ranks on one host) get its shared-memory btl, vader. */
static const char *mpi_btl(const ar_options *o) {
    const char *p = o->provider ? o->provider : getenv("TERSE_PROVIDER");
    if (p && (strcmp(p, "tcp") == 0 || strcmp(p, "rxm") == 0 || strcmp(p, "net") == 0 ||
              strcmp(p, "verbs") == 0 || strcmp(p, "efa") == 0))
        return "tcp,self";
    return "vader,self";
}

/* Run Open MPI's baseline. Returns the number of rows read into rows (the
 * rows it finished, even if it then failed), or -1 after printing why
 * none; *failed is set unless it ran and exited 0. */
static int run_mpi(const ar_options *o, ar_row *rows, int cap, int *failed) {
    static const char *const near_self[] = {"terse-bench-mpi", NULL};
    char mpirun[PATH_MAX], peer[PATH_MAX], results[PATH_MAX];
    *failed = 1;
    if (bench_find_program("TERSE_BENCH_MPI", near_self, "terse-bench-mpi", peer,
                           sizeof peer) != 0) {
        fprintf(stderr, "terse-bench allreduce: --vs-mpi needs terse-bench-mpi, which was not "
                        "found beside terse-bench, in TERSE_BENCH_MPI or on PATH (it is built "
                        "only when CMake finds MPI: install libopenmpi-dev and reconfigure)\n");
        return -1;
    }
    if (bench_find_program("MPIRUN", NULL, "mpirun", mpirun, sizeof mpirun) != 0) {
        fprintf(stderr, "terse-bench allreduce: --vs-mpi needs mpirun (set MPIRUN or PATH)\n");
        return -1;
    }
    if (bench_temp_file("mpi", results, sizeof results) != 0) {
        fprintf(stderr, "terse-bench allreduce: cannot create a temporary file: %s\n",
                strerror(errno));
        return -1;
    }
    char np[16], iters[16], warmup[16], budget[32], sizes[AR_MAX_SIZES][24];
    snprintf(np, sizeof np, "%d", o->nranks);
    snprintf(iters, sizeof iters, "%d", o->iters);
    snprintf(warmup, sizeof warmup, "%d", o->warmup);
    snprintf(budget, sizeof budget, "%.17g", o->budget);
    const char *btl = mpi_btl(o);
    /* Loopback only: inside a network namespace that has nothing else,
     * Open MPI's out-of-band channel must be told so too. */
    const char *argv[64 + AR_MAX_MPI_ARGS + AR_MAX_SIZES];
    int k = 0;
    const char *fixed[] = {mpirun, "--allow-run-as-root", "--oversubscribe", "-np", np,
                           "--mca", "pml", "ob1", "--mca", "btl", btl,
                           "--mca", "oob_tcp_if_include", "lo"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) argv[k++] = fixed[i];
    if (strncmp(btl, "tcp", 3) == 0) {
        argv[k++] = "--mca";
        argv[k++] = "btl_tcp_if_include";
        argv[k++] = "lo";
    }
    for (size_t i = 0; i < o->n_mpi_args; i++) argv[k++] = o->mpi_args[i];
    const char *tail[] = {peer, "--results", results, "-r", iters, "-w", warmup, "-t", budget};
    for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++) argv[k++] = tail[i];
    if (o->quiet) argv[k++] = "-q";
    for (size_t i = 0; i < o->n_sizes; i++) {
        snprintf(sizes[i], sizeof sizes[i], "%zu", o->sizes[i]);
        argv[k++] = sizes[i];
    }
    argv[k] = NULL;
    if (!o->quiet) {
        fprintf(stderr, "terse-bench allreduce: Open MPI baseline:");
        for (int i = 0; i < k; i++) fprintf(stderr, " %s", argv[i]);
        fprintf(stderr, "\n");
    }
    int rc = bench_run_child((char *const *)argv);
    int n = ar_record_read_all(results, rows, cap);
    unlink(results);
    if (rc != 0) {
        fprintf(stderr, "terse-bench allreduce: the Open MPI baseline failed (exit status %d)%s\n",
                rc, n > 0 ? "; keeping the rows it finished" : "");
        return n > 0 ? n : -1;
    }
    *failed = 0;
    return n < 0 ? -1 : n;
}

/* Run the ranks through terse-run. Returns the number of rows read, -1 if
 * none could be had; *failed is set if terse-run exited nonzero. */
static int run_ranks(int argc, char **argv, const ar_options *o, ar_row *rows, int cap,
                     int *failed) {
    char results[PATH_MAX];
    *failed = 1;
    if (bench_temp_file("ranks", results, sizeof results) != 0) {
        fprintf(stderr, "terse-bench allreduce: cannot create a temporary file: %s\n",
                strerror(errno));
        return -1;
    }
    int rc = bench_run_workers("terse-bench allreduce", o->nranks, o->provider, argc, argv,
                               results, o->quiet);
    int n = ar_record_read_all(results, rows, cap);
    unlink(results);
    if (rc < 0) return -1;
    if (rc != 0)
        fprintf(stderr, "terse-bench allreduce: the ranks failed (terse-run exit status %d)\n", rc);
    else
        *failed = 0;
    return n;
}

static const ar_row *mpi_row_for(const ar_row *mpi, int n_mpi, size_t bytes) {
    for (int i = 0; i < n_mpi; i++)
        if (mpi[i].bytes == bytes) return &mpi[i];
    return NULL;
}

int ar_launch(int argc, char **argv, const ar_options *o) {
    static ar_row mpi[AR_MAX_SIZES], rows[MAX_ROWS];
    int n_mpi = 0, mpi_failed = 0, failed = 0;
    if (o->vs_mpi) {
        n_mpi = run_mpi(o, mpi, AR_MAX_SIZES, &mpi_failed);
        if (n_mpi < 0) n_mpi = 0;
        if (bench_interrupted()) return 128 + bench_interrupted();
    }
    /* powersgd's products run in OpenBLAS: share the cores out. */
    bench_share_cores(o->nranks);
    int n = run_ranks(argc, argv, o, rows, MAX_ROWS, &failed);
    if (bench_interrupted()) return 128 + bench_interrupted();
    if (n <= 0) {
        fprintf(stderr, "terse-bench allreduce: no results from the ranks\n");
        return BENCH_EXIT_RUNTIME;
    }

    ar_report_begin(o, rows[0].provider, rows[0].nranks, o->vs_mpi);
    const char *spec = NULL;
    for (int i = 0; i < n; i++) {
        if (rows[i].is_mpi) continue;
        if (!spec || strcmp(spec, rows[i].spec) != 0) {
            spec = rows[i].spec;
            ar_report_spec(o, spec);
        }
        ar_report_row(o, &rows[i], o->vs_mpi ? mpi_row_for(mpi, n_mpi, rows[i].bytes) : NULL);
        if (!rows[i].ok) failed = 1;
    }
    for (int i = 0; i < n_mpi; i++)
        if (!mpi[i].ok) mpi_failed = 1;
    if (o->model) ar_model_report(o, rows, n);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "terse-bench allreduce: cannot write the results\n");
        return BENCH_EXIT_RUNTIME;
    }
    if (n < (int)(o->n_specs * o->n_sizes)) {
        fprintf(stderr, "terse-bench allreduce: only %d of %zu rows were measured\n", n,
                o->n_specs * o->n_sizes);
        failed = 1;
    }
    return failed || mpi_failed ? BENCH_EXIT_RUNTIME : BENCH_EXIT_OK;
}
