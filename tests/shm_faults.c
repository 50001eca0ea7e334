/* shm_faults: the failure contract on libfabric's shm provider, trial by
 * trial. Each trial starts a job of real rank processes that run
 * all-reduces of varying sizes in a loop; at a random moment the parent
 * SIGKILLs or SIGSTOPs one rank. Every survivor must return
 * TERSE_ERR_PEER_LOST or TERSE_ERR_TIMEOUT, naming a rank, within the
 * timeout plus a slack; a survivor still running after that is a hang.
 * (libfabric 1.17's shm spins on a lock inside the peer's shared region,
 * and a peer killed or stopped while holding it never lets go: terse's
 * watchdog gives up on the spinning thread; this program proves it.)
 *
 *   shm_faults [--trials N] [--seed S] [--timeout-ms T] [-q]
 *
 * runs N trials (default 10) of each of: SIGKILL x 2 ranks, SIGKILL x 3,
 * SIGSTOP x 2, SIGSTOP x 3 -- alternating between the host's shared segment
 * (even trials; the default all-reduce path) and libfabric's shm
 * (TERSE_SHM_SEGMENT=off, odd trials) -- and prints one line per
 * configuration and path:
 * trials, hangs, wrong results, and the survivors' min / median / max time
 * from the signal to their return. Exit 0 only with no hang and no wrong
 * result. `ctest` runs the default; 100 trials is the long campaign. */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "plain_procs.h"
#include "terse.h"

#define MAX_RANKS 3
#define SLACK_MS 2500.0

typedef struct {
    volatile int started;   /* the loop is running */
    volatile int finished;  /* the survivor returned */
    int status;
    double end_ms;
    char err[400];
    int segment;            /* its all-reduces took the host's shared segment */
} rank_out;

static void rank_main(int r, int nranks, const char *addr, int timeout_ms, unsigned seed,
                      int path, rank_out *o) {
    /* path 0: the host's shared segment (terse's own, the default);
     * 1: libfabric's shm carries the all-reduces too */
    setenv("TERSE_SHM_SEGMENT", path ? "off" : "auto", 1);
    terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
    cfg.rank = r, cfg.nranks = nranks, cfg.addr = addr, cfg.provider = "shm";
    cfg.token = "shm-faults-trial-token", cfg.timeout_ms = timeout_ms;
    terse_comm *c = NULL;
    terse_status s = terse_comm_init(&cfg, &c);
    if (s != TERSE_OK) { /* the victim may die while a survivor still finishes init */
        o->end_ms = plain_now_ms();
        o->status = (int)s;
        snprintf(o->err, sizeof o->err, "init: %s", terse_last_error());
        o->finished = 1;
        _exit(2);
    }
    const size_t max_n = (size_t)1 << 20;
    float *x = calloc(max_n, sizeof(float));
    o->segment = !strcmp(terse_allreduce_algorithm(c, NULL, max_n), "dense-seg");
    o->started = 1;
    for (unsigned i = 0;; i++) {
        size_t n = (size_t)1 << ((seed + i * 7) % 21); /* 1 .. 1M floats */
        s = terse_allreduce(c, x, n, NULL, TERSE_OP_SUM);
        if (s != TERSE_OK) break;
    }
    o->end_ms = plain_now_ms();
    o->status = (int)s;
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    o->finished = 1;
    terse_comm_free(c);
    free(x);
    _exit(0);
}

typedef struct {
    int trials, hangs, wrong, watchdog;
    double t[2 * 100 * MAX_RANKS];
    int nt;
} tally;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One trial; returns 0 if every survivor returned as the contract says. */
static void trial(int nranks, int sig, int timeout_ms, unsigned seed, int path, int quiet,
                  tally *t) {
    rank_out *o = mmap(NULL, sizeof(rank_out) * MAX_RANKS, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(o, 0, sizeof(rank_out) * MAX_RANKS);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", plain_free_port());
    pid_t pid[MAX_RANKS];
    fflush(NULL);
    for (int r = 0; r < nranks; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            alarm((unsigned)(timeout_ms / 1000 + 30)); /* a hang never outlives us */
            rank_main(r, nranks, addr, timeout_ms, seed, path, &o[r]);
        }
    }
    const int victim = 1 + (int)(seed % (unsigned)(nranks - 1));
    double t0 = plain_now_ms();
    while (!o[victim].started && plain_now_ms() - t0 < 20000) usleep(1000);
    usleep(10000 + (useconds_t)(seed * 7919u % 290000u)); /* 10 .. 300 ms into the loop */
    double sent = plain_now_ms();
    kill(pid[victim], sig);
    double limit = sent + timeout_ms + SLACK_MS;
    int bad = 0;
    for (int r = 0; r < nranks; r++) {
        if (r == victim) continue;
        while (!o[r].finished && plain_now_ms() < limit) usleep(2000);
        if (!o[r].finished) {
            t->hangs++;
            bad = 1;
            fprintf(stderr, "HANG: %s x%d trial seed %u: rank %d still running %.0f ms after the "
                            "signal\n", strsignal(sig), nranks, seed, r, plain_now_ms() - sent);
            continue;
        }
        int ok = (o[r].status == TERSE_ERR_PEER_LOST || o[r].status == TERSE_ERR_TIMEOUT) &&
                 strstr(o[r].err, "rank ") != NULL;
        if (o[r].segment != !path) { /* the trial ran on the other path */
            ok = 0;
            snprintf(o[r].err, sizeof o[r].err, "its all-reduces %s the shared segment",
                     path ? "took" : "did not take");
        }
        if (!ok) {
            t->wrong++;
            bad = 1;
            fprintf(stderr, "WRONG: %s x%d seed %u: rank %d returned %s: %s\n", strsignal(sig),
                    nranks, seed, r, terse_status_name((terse_status)o[r].status), o[r].err);
        }
        t->watchdog += strstr(o[r].err, "spun inside") != NULL;
        t->t[t->nt++] = o[r].end_ms - sent;
    }
    for (int r = 0; r < nranks; r++) kill(pid[r], SIGKILL);
    for (int r = 0; r < nranks; r++) {
        waitpid(pid[r], NULL, 0);
        plain_remove_shm_of(pid[r]);
    }
    if (!quiet && !bad)
        fprintf(stderr, "  %s x%d seed %u: ok\n", strsignal(sig), nranks, seed);
    t->trials++;
    munmap(o, sizeof(rank_out) * MAX_RANKS);
}

static void usage(FILE *f) {
    fprintf(f, "usage: shm_faults [--trials N] [--seed S] [--timeout-ms T] [-q]\n"
               "  N trials (default 10, at most 100) of each of SIGKILL and SIGSTOP, with 2 and\n"
               "  3 ranks, on libfabric's shm provider (the trials alternate between terse's shared\n"
               "  segment and libfabric's shm for the all-reduces); T is the communicator's timeout (default\n"
               "  1000). Exit 0 only if every survivor returned PEER_LOST or TIMEOUT naming a\n"
               "  rank within T + %.0f ms.\n", SLACK_MS);
}

int main(int argc, char **argv) {
    int trials = 10, timeout_ms = 1000, quiet = 0;
    unsigned seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-q")) {
            quiet = 1;
        } else if (i + 1 < argc && !strcmp(argv[i], "--trials")) {
            trials = atoi(argv[++i]);
        } else if (i + 1 < argc && !strcmp(argv[i], "--seed")) {
            seed = (unsigned)strtoul(argv[++i], NULL, 10);
        } else if (i + 1 < argc && !strcmp(argv[i], "--timeout-ms")) {
            timeout_ms = atoi(argv[++i]);
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (trials < 1 || trials > 100 || timeout_ms < 100) {
        usage(stderr);
        return 2;
    }
    int failed = 0;
    const int sigs[2] = {SIGKILL, SIGSTOP};
    for (int si = 0; si < 2; si++)
        for (int nranks = 2; nranks <= MAX_RANKS; nranks++) {
            /* the trials alternate between the two all-reduce paths */
            static tally t[2];
            memset(t, 0, sizeof t);
            for (int k = 0; k < trials; k++)
                trial(nranks, sigs[si], timeout_ms, seed * 1000u + (unsigned)k, k % 2, quiet,
                      &t[k % 2]);
            for (int p = 0; p < 2; p++) {
                tally *u = &t[p];
                if (!u->trials) continue;
                qsort(u->t, (size_t)u->nt, sizeof u->t[0], cmp_double);
                printf("shm %s x%d (%s): %d trials, %d hangs, %d wrong, %d survivors freed by "
                       "the watchdog; survivors returned %.0f / %.0f / %.0f ms (min / median / "
                       "max) after the signal, timeout %d ms\n",
                       strsignal(sigs[si]), nranks, p ? "libfabric's shm" : "shared segment",
                       u->trials, u->hangs, u->wrong, u->watchdog, u->nt ? u->t[0] : 0.0,
                       u->nt ? u->t[u->nt / 2] : 0.0, u->nt ? u->t[u->nt - 1] : 0.0, timeout_ms);
                fflush(stdout);
                failed |= u->hangs || u->wrong;
            }
        }
    return failed;
}
