/* The launcher role every benchmark with ranks shares (allreduce, ps,
 * train): start a job of N ranks of this program under terse-run, wait for
 * it, and hand back the records its rank 0 wrote; the caller prints them as
 * its table or CSV. The records' fields and the tables are each
 * benchmark's own. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/bench.h"

/* Run job's ranks, with --results F: terse-run's exit status (as
 * bench_run_child), or -1 if it could not be started (said why). */
static int run_workers(const bench_job *job, const char *results) {
    static const char *const near_self[] = {"../tools/terse-run", "terse-run", NULL};
    char launcher[PATH_MAX], self[PATH_MAX], dir[PATH_MAX], np[16];
    if (bench_find_program("TERSE_RUN", near_self, "terse-run", launcher, sizeof launcher) != 0) {
        fprintf(stderr, "%s: terse-run not found (looked at TERSE_RUN, beside terse-bench, "
                        "../tools/ of its build directory, and PATH)\n", job->who);
        return -1;
    }
    /* Prefer the terse-bench beside us by name, so that a build tree runs
     * its own binary; /proc/self/exe otherwise. */
    if (bench_self_dir(dir, sizeof dir) != 0 ||
        (size_t)snprintf(self, sizeof self, "%s/terse-bench", dir) >= sizeof self ||
        access(self, X_OK) != 0) {
        ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
        if (len <= 0) {
            fprintf(stderr, "%s: cannot find my own executable\n", job->who);
            return -1;
        }
        self[len] = '\0';
    }
    snprintf(np, sizeof np, "%d", job->nranks);
    /* terse-run -n N [--provider P] [--hosts H [--link R]] SELF ARGS... --worker
     * --results F */
    const char **child = calloc((size_t)job->argc + 16, sizeof *child);
    if (!child) {
        fprintf(stderr, "%s: out of memory\n", job->who);
        return -1;
    }
    size_t k = 0;
    child[k++] = launcher;
    child[k++] = "-n";
    child[k++] = np;
    if (job->provider) {
        child[k++] = "--provider";
        child[k++] = job->provider;
    }
    char hosts[16];
    if (job->hosts > 0) {
        snprintf(hosts, sizeof hosts, "%d", job->hosts);
        child[k++] = "--hosts";
        child[k++] = hosts;
        if (job->link) {
            child[k++] = "--link";
            child[k++] = job->link;
        }
    }
    child[k++] = self;
    for (int i = 0; i < job->argc; i++) child[k++] = job->argv[i];
    child[k++] = "--worker";
    child[k++] = "--results";
    child[k++] = results;
    child[k] = NULL;
    if (!job->quiet) {
        fprintf(stderr, "%s: running:", job->who);
        for (size_t i = 0; i < k; i++) fprintf(stderr, " %s", child[i]);
        fprintf(stderr, "\n");
    }
    int rc = bench_run_child((char *const *)child);
    free(child);
    return rc;
}

int bench_job_run(const bench_job *job, bench_records *set) {
    char results[PATH_MAX];
    if (bench_temp_file(job->tag, results, sizeof results) != 0) {
        fprintf(stderr, "%s: cannot create a temporary file: %s\n", job->who, strerror(errno));
        return BENCH_JOB_NO_FILE;
    }
    if (job->title && !job->quiet) fprintf(stderr, "%s: %s\n", job->who, job->title);
    int rc = run_workers(job, results);
    bench_records_read(job->who, results, job->parse, set);
    unlink(results);
    return rc < 0 ? BENCH_JOB_NOT_RUN : rc;
}

int bench_flush_results(const char *who) {
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "%s: cannot write the results\n", who);
        return -1;
    }
    return 0;
}
