/* tsan_engine: the engine's threads under ThreadSanitizer.
 *
 * Criterion cannot run under TSan here (its arena allocator fails to
 * start), so this is a plain program: it forks real rank processes over a
 * real provider and exercises every call the header says is thread-safe,
 * from several threads at once -- starts on one thread while the progress
 * thread runs them, tests and waits on different requests from different
 * threads, statistics read from a third thread, a group, and abort from a
 * second thread while a large allreduce is in flight. Built and run by
 * ./terse.sh test in a clang -fsanitize=thread build; TSan's report (and
 * its exit code 66) or a wrong result fails it.
 *
 *   tsan_engine [PROVIDER [NRANKS [abort|free|ps|colo]]]  defaults: tcp 2 abort
 *
 * The last step either aborts from a second thread, or frees the
 * communicator while a second thread waits on a request in flight.
 * TERSE_PROGRESS=caller runs the same in caller mode. */
#include <arpa/inet.h>
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

#include "known_limits.h"
#include "plain_procs.h"
#include "terse.h"

#define NREQ 6
#define N 200000

static int fails;
/* Shared with the parent: each rank marks when it reaches step 3, where
 * ranks tear the job down mid-transfer (the only place the known rxm
 * crash may be allowed). */
static volatile int *in_teardown;

#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "tsan_engine rank %d: ", rank);                 \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, " (%s)\n", terse_last_error());                 \
            fails++;                                                        \
        }                                                                   \
    } while (0)

typedef struct {
    terse_request *req;
    terse_status status;
} waiter;

static void *wait_one(void *arg) {
    waiter *w = arg;
    w->status = terse_request_wait(w->req);
    return NULL;
}

typedef struct {
    terse_comm *c;
    _Atomic int stop;
    unsigned long reads;
} stats_reader;

static void *read_stats(void *arg) {
    stats_reader *s = arg;
    while (!s->stop) {
        terse_comm_stats st = TERSE_COMM_STATS_INIT;
        if (terse_comm_get_stats(s->c, &st) == TERSE_OK) s->reads++;
        usleep(200);
    }
    return NULL;
}

static void *abort_soon(void *arg) {
    usleep(100 * 1000);
    terse_comm_abort(arg);
    return NULL;
}

static void fill(float *x, size_t n, int rank, int k) {
    for (size_t i = 0; i < n; i++) x[i] = (float)((i * 7 + (size_t)k * 13 + (size_t)rank) % 97);
}

static int body(terse_comm *c, int rank, int nranks, int free_mode) {
    static float buf[NREQ][N];
    terse_request *q[NREQ];
    stats_reader sr = {c, 0, 0};
    pthread_t st;
    pthread_create(&st, NULL, read_stats, &sr);

    /* 1. starts here, waits on two other threads, tests here */
    for (int k = 0; k < NREQ; k++) {
        fill(buf[k], N, rank, k);
        CHECK(terse_allreduce_start(c, buf[k], N, NULL, TERSE_OP_SUM, &q[k]) == TERSE_OK,
              "start %d", k);
    }
    waiter w[2] = {{q[1], TERSE_OK}, {q[4], TERSE_OK}};
    pthread_t wt[2];
    for (int i = 0; i < 2; i++) pthread_create(&wt[i], NULL, wait_one, &w[i]);
    for (int k = NREQ - 1; k >= 0; k--) {
        if (k == 1 || k == 4) continue;
        int done = 0;
        while (!done) CHECK(terse_request_test(q[k], &done) == TERSE_OK, "test %d", k);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(wt[i], NULL);
        CHECK(w[i].status == TERSE_OK, "wait on a second thread");
    }
    for (int k = 0; k < NREQ; k++) {
        terse_request_free(q[k]);
        for (size_t i = 0; i < N; i += 997) {
            float want = 0;
            for (int r = 0; r < nranks; r++)
                want += (float)((i * 7 + (size_t)k * 13 + (size_t)r) % 97);
            if (buf[k][i] != want) {
                CHECK(0, "request %d element %zu: %g, want %g", k, i, buf[k][i], want);
                break;
            }
        }
    }

    /* 2. a group of small ones, then a blocking call */
    CHECK(terse_group_start(c) == TERSE_OK, "group start");
    for (int k = 0; k < NREQ; k++)
        CHECK(terse_allreduce_start(c, buf[k], 100 + (size_t)k, NULL, TERSE_OP_AVG, &q[k]) ==
                  TERSE_OK,
              "group member %d", k);
    CHECK(terse_group_end(c) == TERSE_OK, "group end");
    CHECK(terse_barrier(c) == TERSE_OK, "barrier after the group");
    for (int k = 0; k < NREQ; k++) {
        CHECK(terse_request_wait(q[k]) == TERSE_OK, "group wait %d", k);
        terse_request_free(q[k]);
    }

    sr.stop = 1;
    pthread_join(st, NULL);

    /* 3. abort from a second thread while a big allreduce runs, or free
     *    the communicator while another thread waits on a request */
    in_teardown[rank] = 1;
    const size_t big = (size_t)32 << 20;
    float *x = calloc(big, sizeof(float));
    terse_request *b;
    CHECK(terse_allreduce_start(c, x, big, NULL, TERSE_OP_SUM, &b) == TERSE_OK, "big start");
    pthread_t at;
    waiter bw = {b, TERSE_OK};
    if (free_mode) {
        pthread_create(&at, NULL, wait_one, &bw);
        usleep(50 * 1000);
        terse_comm_free(c); /* aborts b; the waiter returns */
        pthread_join(at, NULL);
        CHECK(bw.status == TERSE_ERR_ABORTED || bw.status == TERSE_OK ||
                  bw.status == TERSE_ERR_PEER_LOST,
              "a wait across terse_comm_free returned %s", terse_status_name(bw.status));
    } else {
        pthread_create(&at, NULL, abort_soon, c);
        terse_status s = terse_request_wait(b);
        pthread_join(at, NULL);
        CHECK(s == TERSE_ERR_ABORTED || s == TERSE_OK || s == TERSE_ERR_PEER_LOST,
              "big allreduce under abort returned %s", terse_status_name(s));
        terse_comm_free(c);
    }
    terse_request_free(b);
    free(x);
    return fails;
}

/* The parameter server's threads: rank 0 serves on its progress thread
 * while its main thread waits; workers start pushes and pulls, end their
 * step (terse_ps_clock) before they complete, and wait for them from a
 * second thread. */
#define PSN 50000
typedef struct {
    terse_request **req;
    int n;
    int bad;
} ps_waiter;

static void *ps_wait_all(void *arg) {
    ps_waiter *w = arg;
    for (int i = 0; i < w->n; i++) w->bad |= terse_request_wait(w->req[i]) != TERSE_OK;
    return NULL;
}

static int body_ps(terse_comm *c, int rank, int nranks, int colo) {
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.update = TERSE_PS_UPDATE_SGD;
    cfg.lr = 0.5f;
    terse_ps *ps = NULL;
    CHECK(terse_ps_config_parse(colo ? "ssp:1,colocate=1" : "ssp:1", &cfg) == TERSE_OK, "parse");
    CHECK(terse_ps_create(c, &cfg, &ps) == TERSE_OK, "terse_ps_create: %s", terse_last_error());
    if (!ps) return 1;
    for (size_t k = 0; k < 3; k++)
        CHECK(terse_ps_declare(ps, k, PSN, k == 1 ? "int8:ef=1" : NULL, NULL, NULL) == TERSE_OK,
              "declare: %s", terse_last_error());
    if (terse_ps_is_server(ps)) {
        CHECK(terse_ps_serve(ps) == TERSE_OK, "serve: %s", terse_last_error());
    } else {
        static float g[3][PSN], p[3][PSN];
        for (int step = 0; step < 6; step++) {
            terse_request *req[6];
            for (int k = 0; k < 3; k++) {
                for (int i = 0; i < PSN; i++) g[k][i] = (float)((rank + step + k + i) % 7) / 8.0f;
                CHECK(terse_ps_push(ps, (size_t)k, g[k], &req[k]) == TERSE_OK, "push");
            }
            for (int k = 0; k < 3; k++)
                CHECK(terse_ps_pull(ps, (size_t)k, p[k], &req[3 + k]) == TERSE_OK, "pull");
            CHECK(terse_ps_clock(ps) == TERSE_OK, "clock"); /* before they complete */
            ps_waiter w = {req, 6, 0};
            pthread_t t;
            pthread_create(&t, NULL, ps_wait_all, &w);
            pthread_join(t, NULL);
            CHECK(!w.bad, "a request failed: %s", terse_last_error());
            for (int i = 0; i < 6; i++) terse_request_free(req[i]);
        }
        CHECK(terse_ps_finish(ps) == TERSE_OK, "finish: %s", terse_last_error());
    }
    terse_ps_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    CHECK(terse_ps_get_stats(ps, &st) == TERSE_OK, "stats");
    if (rank == 0 && !colo) /* colocated: the server's counters once it is done */
        CHECK(st.pushes_applied == (uint64_t)(3 * 6 * (nranks - 1)), "applied %llu",
              (unsigned long long)st.pushes_applied);
    terse_ps_free(ps);
    terse_comm_free(c);
    return fails;
}

int main(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: tsan_engine [PROVIDER [NRANKS [abort|free|ps|colo]]]  (defaults: tcp 2 abort)\n"
               "Runs the engine's thread-safe calls from several threads in real rank\n"
               "processes (ps: a parameter server, rank 0 serving; colo: every rank a\n"
               "worker and a colocated server); build it with clang\n"
               "-fsanitize=thread. Exit 0: clean.\n");
        return 0;
    }
    const char *provider = argc > 1 ? argv[1] : "tcp";
    int nranks = argc > 2 ? atoi(argv[2]) : 2;
    int free_mode = argc > 3 && strcmp(argv[3], "free") == 0;
    int ps_mode = argc > 3 && strcmp(argv[3], "ps") == 0;
    int colo_mode = argc > 3 && strcmp(argv[3], "colo") == 0; /* every rank both */
    if (nranks < 2 || nranks > 8) {
        fprintf(stderr, "tsan_engine: NRANKS must be 2..8\n");
        return 2;
    }
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", plain_free_port());
    pid_t pid[8];
    in_teardown = mmap(NULL, 8 * sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                       -1, 0);
    if (in_teardown == MAP_FAILED) return 2;
    fflush(NULL);
    for (int r = 0; r < nranks; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            alarm(120); /* never hang CI */
            terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
            cfg.rank = r, cfg.nranks = nranks, cfg.addr = addr, cfg.provider = provider;
            cfg.token = "tsan-engine-token", cfg.timeout_ms = 20000;
            terse_comm *c = NULL;
            int rank = r;
            if (terse_comm_init(&cfg, &c) != TERSE_OK) {
                CHECK(0, "terse_comm_init");
                _exit(1);
            }
            int rc = ps_mode || colo_mode ? body_ps(c, r, nranks, colo_mode)
                                          : body(c, r, nranks, free_mode); /* frees c */
            _exit(rc ? 1 : 0);
        }
    }
    int bad = 0;
    for (int r = 0; r < nranks; r++) {
        int st = 0;
        waitpid(pid[r], &st, 0);
        if (!ps_mode && !strcmp(provider, "rxm") && in_teardown[r] && WIFSIGNALED(st) &&
            WTERMSIG(st) == SIGSEGV) {
            /* seen in the fresh-clone CI, 2026-12-03: step 3 tears the job
             * down mid-transfer, as the kill tests do (SECURITY.md) */
            fprintf(stderr, "WARNING: KNOWN LIMITATION: rank %d (rxm) died of SIGSEGV while the "
                            "job was torn down: %s\n", r, TR_RXM_TEARDOWN_SEGV);
            continue;
        }
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "tsan_engine: rank %d ended with status %#x\n", r, st);
            bad = 1;
        }
    }
    const char *mode = getenv("TERSE_PROGRESS");
    printf("tsan_engine %s x%d %s (progress %s): %s\n", provider, nranks,
           colo_mode ? "colo" : ps_mode ? "ps" : free_mode ? "free" : "abort", mode && *mode ? mode : "thread", bad ? "FAILED" : "clean");
    return bad;
}
