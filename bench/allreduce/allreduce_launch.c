/* terse-bench allreduce, the launcher role (allreduce.h): run the Open MPI
 * baseline (--vs-mpi), then this program again as N ranks under terse-run
 * with --worker, and print the rows both wrote back, side by side. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "allreduce/allreduce.h"
#include "core/bench.h"

#define WHO "terse-bench allreduce"

/* tcp-like providers get Open MPI's tcp btl; shm and auto (which picks shm
 * for ranks on one host) get its shared-memory btl, vader. */
static const char *mpi_btl(const ar_options *o) {
    const char *p = o->provider ? o->provider : getenv("TERSE_PROVIDER");
    if (p && (strcmp(p, "tcp") == 0 || strcmp(p, "rxm") == 0 || strcmp(p, "net") == 0 ||
              strcmp(p, "verbs") == 0 || strcmp(p, "efa") == 0))
        return "tcp,self";
    return "vader,self";
}

/* Run Open MPI's baseline and append the rows it wrote to rows (the rows
 * it finished, even if it then failed); after printing why, none. *failed
 * is set unless it ran and exited 0. */
static void run_mpi(const ar_options *o, bench_records *rows, int *failed) {
    static const char *const near_self[] = {"terse-bench-mpi", NULL};
    char mpirun[PATH_MAX], peer[PATH_MAX], results[PATH_MAX];
    *failed = 1;
    if (bench_find_program("TERSE_BENCH_MPI", near_self, "terse-bench-mpi", peer,
                           sizeof peer) != 0) {
        fprintf(stderr, "terse-bench allreduce: --vs-mpi needs terse-bench-mpi, which was not "
                        "found beside terse-bench, in TERSE_BENCH_MPI or on PATH (it is built "
                        "only when CMake finds MPI: install libopenmpi-dev and reconfigure)\n");
        return;
    }
    if (bench_find_program("MPIRUN", NULL, "mpirun", mpirun, sizeof mpirun) != 0) {
        fprintf(stderr, "terse-bench allreduce: --vs-mpi needs mpirun (set MPIRUN or PATH)\n");
        return;
    }
    if (bench_temp_file("mpi", results, sizeof results) != 0) {
        fprintf(stderr, "terse-bench allreduce: cannot create a temporary file: %s\n",
                strerror(errno));
        return;
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
    int n = bench_records_read(WHO, results, ar_record_parse, rows);
    unlink(results);
    if (rc != 0) {
        fprintf(stderr, "terse-bench allreduce: the Open MPI baseline failed (exit status %d)%s\n",
                rc, n > 0 ? "; keeping the rows it finished" : "");
        return;
    }
    *failed = 0;
}

static const ar_row *flat_row_for(const ar_row *flat, int n_flat, const ar_row *r) {
    for (int i = 0; i < n_flat; i++)
        if (flat[i].bytes == r->bytes && strcmp(flat[i].spec, r->spec) == 0) return &flat[i];
    return NULL;
}

static const ar_row *mpi_row_for(const ar_row *mpi, int n_mpi, size_t bytes) {
    for (int i = 0; i < n_mpi; i++)
        if (mpi[i].bytes == bytes) return &mpi[i];
    return NULL;
}

/* Print the table of the ranks' rows (n of them), each beside Open MPI's
 * of the same size with --vs-mpi. Returns 1 if a row failed. */
static int report(const ar_options *o, const ar_row *rows, int n, const ar_row *mpi,
                  int n_mpi, const ar_row *flat, int n_flat) {
    int failed = 0;
    ar_report_begin(o, rows[0].provider, rows[0].nranks, o->vs_mpi);
    const char *spec = NULL;
    for (int i = 0; i < n; i++) {
        if (rows[i].is_mpi) continue;
        if (!spec || strcmp(spec, rows[i].spec) != 0) {
            spec = rows[i].spec;
            ar_report_spec(o, spec);
        }
        ar_report_row(o, &rows[i], o->vs_mpi ? mpi_row_for(mpi, n_mpi, rows[i].bytes) : NULL,
                      o->vs_flat ? flat_row_for(flat, n_flat, &rows[i]) : NULL);
        if (!rows[i].ok) failed = 1;
    }
    if (o->model) ar_model_report(o, rows, n);
    return failed;
}

/* Name the wire in each row's codec ("dense [wire mac]"), so that the two
 * runs of --vs-mpi print as blocks of their own. */
static void tag_wire(bench_records *rows, int from, const char *wire) {
    ar_row *r = rows->items;
    for (int i = from; i < rows->n; i++) {
        char spec[sizeof r[i].spec];
        snprintf(spec, sizeof spec, "%s [wire %s]", r[i].spec, wire);
        memcpy(r[i].spec, spec, sizeof spec);
    }
}

/* --vs-mpi compares terse, which authenticates every chunk over the network
 * by default (TERSE_WIRE=auto: mac but on shm), with an Open MPI that
 * authenticates nothing. So the ranks run a second time with TERSE_WIRE=none
 * and both blocks are printed beside MPI -- unless the caller chose
 * TERSE_WIRE, or the provider is shm (no MAC there already). Returns the
 * terse-run status of the second run (0 when there was none). */
static int run_without_mac(const bench_job *job, bench_records *rank_rows) {
    const ar_row *r = rank_rows->items;
    const char *chosen = getenv("TERSE_WIRE");
    if (rank_rows->n <= 0 || (chosen && chosen[0]) || strcmp(r[0].provider, "shm") == 0)
        return 0;
    int first = rank_rows->n;
    tag_wire(rank_rows, 0, "mac");
    if (!job->quiet) fprintf(stderr, WHO ": the same rows again with TERSE_WIRE=none (no MAC, as Open MPI)\n");
    setenv("TERSE_WIRE", "none", 1);
    int rc = bench_job_run(job, rank_rows);
    unsetenv("TERSE_WIRE");
    if (rc > 0) fprintf(stderr, WHO ": the ranks failed with TERSE_WIRE=none (terse-run exit status %d)\n", rc);
    tag_wire(rank_rows, first, "none");
    return rc;
}

/* The launcher: the MPI baseline, then the ranks, then the table. */
static int launch(int argc, char **argv, const ar_options *o, bench_records *mpi_rows,
                  bench_records *rank_rows, bench_records *flat_rows) {
    int mpi_failed = 0;
    if (o->vs_mpi) {
        run_mpi(o, mpi_rows, &mpi_failed);
        if (bench_interrupted()) return 128 + bench_interrupted();
    }
    /* powersgd's products run in OpenBLAS: share the cores out. */
    bench_share_cores(o->nranks);
    bench_job job = {WHO, "ranks", o->nranks, o->provider, argc, argv, o->quiet, NULL,
                     ar_record_parse, o->hosts, o->link};
    int rc = bench_job_run(&job, rank_rows);
    if (rc > 0) fprintf(stderr, WHO ": the ranks failed (terse-run exit status %d)\n", rc);
    if (bench_interrupted()) return 128 + bench_interrupted();
    size_t want = o->n_specs * o->n_sizes;
    if (o->vs_mpi && rc == 0) {
        int n1 = rank_rows->n;
        rc = run_without_mac(&job, rank_rows);
        if (rank_rows->n > n1) want *= 2;
        if (bench_interrupted()) return 128 + bench_interrupted();
    }
    if (o->vs_flat && rc == 0) {
        /* the same rows with one provider and the flat algorithms */
        if (!o->quiet) fprintf(stderr, WHO ": the same rows again with TERSE_TOPOLOGY=flat\n");
        char *was = getenv("TERSE_TOPOLOGY") ? strdup(getenv("TERSE_TOPOLOGY")) : NULL;
        setenv("TERSE_TOPOLOGY", "flat", 1);
        rc = bench_job_run(&job, flat_rows);
        if (was) setenv("TERSE_TOPOLOGY", was, 1);
        else unsetenv("TERSE_TOPOLOGY");
        free(was);
        if (rc > 0)
            fprintf(stderr, WHO ": the ranks failed with TERSE_TOPOLOGY=flat (terse-run exit "
                            "status %d)\n", rc);
        if (bench_interrupted()) return 128 + bench_interrupted();
        if (flat_rows->n < (int)want) {
            fprintf(stderr, WHO ": only %d of %zu rows were measured with TERSE_TOPOLOGY=flat\n",
                    flat_rows->n, want);
            if (rc == 0) rc = BENCH_EXIT_RUNTIME;
        }
    }
    int n = rc < 0 ? 0 : rank_rows->n;
    if (n <= 0) {
        fprintf(stderr, WHO ": no results from the ranks\n");
        return BENCH_EXIT_RUNTIME;
    }
    const ar_row *mpi = mpi_rows->items;
    int failed = report(o, rank_rows->items, n, mpi, mpi_rows->n, flat_rows->items,
                        flat_rows->n) || rc != 0;
    for (int i = 0; i < mpi_rows->n; i++)
        if (!mpi[i].ok) mpi_failed = 1;
    if (bench_flush_results(WHO) != 0) return BENCH_EXIT_RUNTIME;
    if (n < (int)want) {
        fprintf(stderr, WHO ": only %d of %zu rows were measured\n", n, want);
        failed = 1;
    }
    return failed || mpi_failed ? BENCH_EXIT_RUNTIME : BENCH_EXIT_OK;
}

int ar_launch(int argc, char **argv, const ar_options *o) {
    bench_records mpi = {NULL, 0, 0, sizeof(ar_row)}, ranks = {NULL, 0, 0, sizeof(ar_row)},
                  flat = {NULL, 0, 0, sizeof(ar_row)};
    int rc = launch(argc, argv, o, &mpi, &ranks, &flat);
    bench_records_free(&flat);
    bench_records_free(&mpi);
    bench_records_free(&ranks);
    return rc;
}
