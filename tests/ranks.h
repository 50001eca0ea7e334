/* Run a job of real rank processes for the collective tests.
 *
 * tr_run forks nranks children. Each joins a communicator over a real
 * libfabric provider (rank 0 runs the bootstrap store on a free loopback
 * port), runs the body, and reports through a shared-memory tr_out, one per
 * rank; the parent reaps them with a deadline and kills them all if it
 * passes, so a broken collective fails the test instead of hanging it.
 * Children never call Criterion's assertions (they are not the process
 * Criterion watches); the parent asserts on what they report.
 *
 * Header-only (static functions) so that each test file that drives ranks
 * gets its own copy without another library target. */
#ifndef TERSE_TESTS_RANKS_H
#define TERSE_TESTS_RANKS_H

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "known_limits.h"
#include "plain_procs.h"
#include "terse.h"

#define TR_MAX_RANKS 8
#define TR_SLOTS 96
#define TR_FLOATS 4096

/* What one rank reports. */
typedef struct tr_out {
    int finished;      /* the body returned */
    int status;        /* the first failing call's status (0: none) */
    int ready;         /* tr_say_ready: past the setup its test is not about */
    double free_ms;    /* how long this rank's terse_comm_free took */
    char err[768];     /* its terse_last_error() */
    uint64_t hash[TR_SLOTS];
    double val[TR_SLOTS];
    uint64_t u[TR_SLOTS];
    float f[TR_FLOATS];
} tr_out;

/* The body: returns 0 on success; on failure records status and err. */
typedef int (*tr_body)(terse_comm *c, tr_out *o, const void *arg);

/* Record a failing call in o and return 1 (for `return tr_fail(...)`). */
static inline int tr_fail(tr_out *o, terse_status s, const char *what) {
    o->status = (int)s;
    snprintf(o->err, sizeof o->err, "%s: %s (%s)", what, terse_status_name(s),
             terse_last_error());
    return 1;
}

#define TR_CALL(o, call)                                  \
    do {                                                  \
        terse_status tr_s_ = (call);                      \
        if (tr_s_ != TERSE_OK) return tr_fail((o), tr_s_, #call); \
    } while (0)

/* A victim dies only once every rank is past the setup its test is not
 * about: a rank that finished terse_comm_init or terse_ps_create may race
 * ahead (async steps wait for nobody; a quorum closes without the
 * slowest), and its death then fails a slower rank's setup with PEER_LOST
 * instead of the failure under test (async: once in 6 runs of test_ps; a
 * replacement test: 2 runs in 23). tr_say_ready marks this rank's output;
 * tr_wait_all_ready waits for every rank's mark, or for that rank to have
 * failed or finished (a failed setup is then reported as itself, not as a
 * hang). The 120 s bound is only for a rank that crashed and marks
 * nothing: it is an event wait, never a timing assumption. Only for the
 * job's own ranks: a replacement's output sits at outs[nranks], not at
 * outs + its rank. */
static inline void tr_say_ready(tr_out *o) { __atomic_store_n(&o->ready, 1, __ATOMIC_RELEASE); }
static inline void tr_wait_all_ready(terse_comm *c, tr_out *o) {
    tr_out *all = o - terse_comm_rank(c); /* one shared array */
    const double until = plain_now_ms() + 120000;
    for (int r = 0; r < terse_comm_size(c); r++)
        while (!__atomic_load_n(&all[r].ready, __ATOMIC_ACQUIRE) &&
               !__atomic_load_n(&all[r].status, __ATOMIC_ACQUIRE) &&
               !__atomic_load_n(&all[r].finished, __ATOMIC_ACQUIRE) && plain_now_ms() < until)
            usleep(1000);
}

static inline uint64_t tr_hash(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static inline double tr_now_ms(void) { return plain_now_ms(); }

/* A loopback port nobody listens on right now. */
static inline int tr_free_port(void) {
    int port = plain_free_port();
    cr_assert_gt(port, 0, "no free loopback port");
    return port;
}

/* A rank killed with SIGKILL cannot unlink its shm provider region
 * (/dev/shm/<pid>:<n>:<m>, 16 MiB each in libfabric 1.17): remove what the
 * dead pid left, so repeated runs neither fill /dev/shm nor hand a stale
 * name to a later process that happens to get the same pid. */
static inline void tr_remove_shm_of(pid_t pid) { plain_remove_shm_of(pid); }

typedef struct tr_job {
    const char *provider;
    int nranks;
    int timeout_ms;    /* TERSE_TIMEOUT_MS for the ranks */
    double wall_s;     /* the parent kills everything after this */
    int victim;        /* a rank expected to die by SIGKILL, or -1 */
} tr_job;

/* 1: once the job's victim died, start its replacement (a new process that
 * joins as the same rank with rejoin = 1, TR_REPLACEMENT=1 in its
 * environment); it reports in outs[nranks] and must exit 0. */
static int tr_replace_victim;
/* Nonzero: a second rank expected to die by SIGKILL (its body kills it). */
static int tr_victim2;

/* Non-NULL: called in each rank's process before terse_comm_init (set by
 * the test; a static per test file). */
static void (*tr_before_init)(int rank, const void *arg);
/* Non-NULL: a rank that dies of SIGSEGV is a known limitation outside
 * terse (the sentence says which): reported on stderr and left with
 * finished == 0 for the caller, not a test failure by itself. */
static const char *tr_known_segv;

/* The provider a job's ranks use: TR_TCP_AS=rxm runs the "tcp" jobs
 * (libfabric's net) over another provider. */
static inline const char *tr_provider(const tr_job *job) {
    const char *as = getenv("TR_TCP_AS");
    return !strcmp(job->provider, "tcp") && as ? as : job->provider;
}

/* 1 if a rank reported the shm provider's spin on a dead peer's lock. */
static inline int tr_spun_(const tr_out *outs, int n) {
    for (int r = 0; r < n; r++)
        if (strstr(outs[r].err, TR_SHM_LOCK_SPIN)) return 1;
    return 0;
}

/* Run body on every rank of job; returns the shared outputs (munmap with
 * tr_release). Asserts that every rank (but the victim) exited 0. */
static inline tr_out *tr_run(const tr_job *job, tr_body body, const void *arg) {
    size_t bytes = sizeof(tr_out) * TR_MAX_RANKS;
    tr_out *outs = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(outs, MAP_FAILED);
    memset(outs, 0, bytes);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", tr_free_port());
    pid_t pids[TR_MAX_RANKS + 1];
    cr_assert_leq(job->nranks + (tr_replace_victim != 0), TR_MAX_RANKS);
    cr_assert(!tr_replace_victim || job->victim >= 0, "a replacement needs a victim");
    fflush(NULL);
    const int v = job->victim >= 0 && job->victim < job->nranks ? job->victim : 0;
    const int replacing = tr_replace_victim && job->victim == v;
    const int n = job->nranks + replacing; /* the last: the replacement */
    for (int r = 0; r < n; r++) {
        const int replacement = r == job->nranks;
        if (replacement) { /* once the victim is dead */
            int st = 0, reaped = 0;
            double until = tr_now_ms() + job->wall_s * 1e3;
            while (!(reaped = waitpid(pids[v], &st, WNOHANG) == pids[v]) &&
                   tr_now_ms() < until)
                usleep(1000);
            if (reaped) {
                tr_remove_shm_of(pids[v]);
                pids[v] = -st - 1; /* reaped: its status, encoded */
            }
        }
        fflush(NULL);
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            if (tr_before_init) tr_before_init(r, arg);
            terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
            if (replacement) {
                setenv("TR_REPLACEMENT", "1", 1);
                cfg.rejoin = 1;
            }
            cfg.rank = replacement ? v : r;
            cfg.nranks = job->nranks;
            cfg.addr = addr;
            cfg.provider = tr_provider(job);
            cfg.token = "collectives-test-token";
            cfg.timeout_ms = job->timeout_ms;
            terse_comm *c = NULL;
            terse_status s = terse_comm_init(&cfg, &c);
            if (s != TERSE_OK) {
                tr_fail(&outs[r], s, "terse_comm_init");
                _exit(2);
            }
            int rc = body(c, &outs[r], arg);
            double t_free = tr_now_ms();
            terse_comm_free(c);
            outs[r].free_ms = tr_now_ms() - t_free;
            __atomic_store_n(&outs[r].finished, 1, __ATOMIC_RELEASE);
            _exit(rc ? 1 : 0);
        }
        pids[r] = pid;
    }
    int status[TR_MAX_RANKS + 1], left = n;
    for (int r = 0; r < n; r++) status[r] = -1;
    if (replacing && pids[v] < 0) { /* reaped before the replacement */
        status[v] = -pids[v] - 1;
        pids[v] = 0;
        left--;
    }
    double deadline = tr_now_ms() + job->wall_s * 1e3;
    while (left > 0 && tr_now_ms() < deadline) {
        for (int r = 0; r < n; r++) {
            if (status[r] != -1) continue;
            int st;
            if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
                status[r] = st;
                left--;
            }
        }
        if (left) usleep(2000);
    }
    if (left) {
        for (int r = 0; r < n; r++)
            if (status[r] == -1) kill(pids[r], SIGKILL);
        for (int r = 0; r < n; r++)
            if (status[r] == -1) {
                waitpid(pids[r], &status[r], 0);
                tr_remove_shm_of(pids[r]);
            }
        for (int r = 0; r < n; r++)
            fprintf(stderr, "rank %d: finished %d status %d err %s\n", r, outs[r].finished,
                         outs[r].status, outs[r].err);
        cr_assert_fail("%d of %d processes (%s) still running after %.0f s; killed", left, n,
                       job->provider, job->wall_s);
    }
    for (int r = 0; r < n; r++) {
        /* every crash tests allow is rxm's (known_limits.h): on any other
         * provider a crash fails the test */
        if (tr_known_segv && !strcmp(tr_provider(job), "rxm") && WIFSIGNALED(status[r]) &&
            WTERMSIG(status[r]) == SIGSEGV) {
            fprintf(stderr, "WARNING: KNOWN LIMITATION: rank %d (%s) died of SIGSEGV: %s\n", r,
                    tr_provider(job), tr_known_segv);
            continue;
        }
        if (r == job->victim || (tr_victim2 && r == tr_victim2)) {
            if (pids[r] > 0) tr_remove_shm_of(pids[r]);
            if (r == tr_victim2 && !WIFSIGNALED(status[r]) && tr_spun_(outs, n)) {
                /* the first death left a survivor whose transport the
                 * watchdog gave up on (shm's lock, TR_SHM_LOCK_SPIN): the
                 * job fell apart before the second victim's moment */
                fprintf(stderr, "WARNING: KNOWN LIMITATION: second victim rank %d was never "
                                "killed: a survivor spun on a dead rank's shm lock\n", r);
                continue;
            }
            cr_assert(WIFSIGNALED(status[r]) && WTERMSIG(status[r]) == SIGKILL,
                      "victim rank %d was not killed (status %#x)", r, status[r]);
            continue;
        }
        if (r == job->nranks && !(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) &&
            tr_spun_(outs, n)) {
            /* a survivor's transport was given up on (shm's lock,
             * TR_SHM_LOCK_SPIN): when that survivor hosts the store, the
             * replacement cannot join; the caller sees the spin in outs */
            fprintf(stderr, "WARNING: KNOWN LIMITATION: the replacement failed after a survivor "
                            "spun on a dead rank's shm lock: %s\n", outs[r].err);
            continue;
        }
        cr_assert(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0,
                  "rank %d of %d (%s) failed: status %#x, %s", r, job->nranks, job->provider,
                  status[r], outs[r].err);
    }
    return outs;
}

static inline void tr_release(tr_out *outs) { munmap(outs, sizeof(tr_out) * TR_MAX_RANKS); }

/* ---- ranks whose codecs differ (the refusal tests) ---- */

/* Every rank but odd_rank creates spec, odd_rank odd_spec, for rows x cols,
 * and all run one terse_allreduce (sum): u[0] its status, err its
 * sentence. The caller expects no rank to get TERSE_OK. */
typedef struct {
    const char *spec, *odd_spec; /* everyone's, and rank odd_rank's */
    int odd_rank;
    size_t rows, cols;
} tr_mismatch;

static inline int tr_mismatch_body(terse_comm *c, tr_out *o, const void *arg) {
    const tr_mismatch *m = arg;
    const int r = terse_comm_rank(c);
    const size_t n = m->rows * m->cols;
    terse_codec *codec = NULL;
    TR_CALL(o, terse_codec_create(r == m->odd_rank ? m->odd_spec : m->spec, m->rows, m->cols,
                                  &codec));
    float *y = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) y[i] = (float)((int)((i * 7 + (size_t)r) % 13) - 6);
    /* every rank past init: the call descriptors find the mismatch at
     * once, and a rank that fails and leaves must not fail another's init */
    tr_say_ready(o);
    tr_wait_all_ready(c, o);
    o->u[0] = (uint64_t)terse_allreduce(c, y, n, codec, TERSE_OP_SUM);
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    free(y);
    terse_codec_free(codec);
    return 0;
}

/* ---- a rank killed mid-loop (the failure tests) ---- */

static inline void *tr_killer_(void *arg) {
    usleep((useconds_t)(intptr_t)arg * 1000);
    kill(getpid(), SIGKILL);
    return NULL;
}

/* On the last rank only: SIGKILL this process ms milliseconds from now. */
static inline void tr_last_rank_dies_in(terse_comm *c, int ms) {
    if (terse_comm_rank(c) != terse_comm_size(c) - 1) return;
    pthread_t t;
    pthread_create(&t, NULL, tr_killer_, (void *)(intptr_t)ms);
}

/* Call terse_allreduce(c, y, n, codec, op) up to max times until one
 * fails: then o->u[0] is its status, o->val[0] its milliseconds and o->err
 * its sentence, and 1 is returned; 0 if every call succeeded. With keep
 * (n floats), the codec's residual is copied there before each call. */
static inline int tr_allreduce_until_failure(terse_comm *c, tr_out *o, float *y, size_t n,
                                             terse_codec *codec, terse_op op, int max,
                                             float *keep) {
    for (int i = 0; i < max; i++) {
        if (keep) memcpy(keep, terse_codec_residual(codec), n * sizeof(float));
        double t0 = tr_now_ms();
        terse_status s = terse_allreduce(c, y, n, codec, op);
        if (s == TERSE_OK) continue;
        o->val[0] = tr_now_ms() - t0;
        o->u[0] = (uint64_t)s;
        snprintf(o->err, sizeof o->err, "%s", terse_last_error());
        return 1;
    }
    return 0;
}

/* One allreduce of a 2-rank job with a pattern only the right sum matches.
 * Rank 0's request to stop (stop != 0) travels inside the data, so both
 * ranks make the same calls. Counts the call in o->u[2] and a wrong sum
 * returned with TERSE_OK in o->u[1]; a failure goes to o->u[0] and o->err.
 * Returns 1 when rank 0 asked to stop, -1 when the call failed, else 0. */
static inline int tr_pattern_allreduce(terse_comm *c, tr_out *o, float *x, size_t n, int k,
                                       int stop) {
    const int r = terse_comm_rank(c);
    for (size_t i = 0; i < n; i++) x[i] = (float)((int)(i % 5) + r * 3 + k % 7);
    if (r == 0 && stop) x[0] += 1000.0f;
    terse_status s = terse_allreduce(c, x, n, NULL, TERSE_OP_SUM);
    o->u[2]++;
    if (s != TERSE_OK) {
        o->u[0] = (uint64_t)s;
        snprintf(o->err, sizeof o->err, "%s", terse_last_error());
        return -1;
    }
    const int stopping = x[0] >= 1000.0f;
    if (stopping) x[0] -= 1000.0f;
    for (size_t i = 0; i < n; i++)
        if (x[i] != (float)(2 * (int)(i % 5) + 3 + 2 * (k % 7))) {
            o->u[1]++;
            break;
        }
    return stopping;
}

#endif
