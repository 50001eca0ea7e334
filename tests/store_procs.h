/* Multi-process store tests: start ranks and helper processes with fork(),
 * reap them within a deadline, retry when the port was taken. Shared by
 * test_store.c and test_store_loss.c; the functions are static inline
 * because each test executable is built from its own test_*.c alone. */
#ifndef TERSE_TESTS_STORE_PROCS_H
#define TERSE_TESTS_STORE_PROCS_H

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/bytes.h"
#include "transport/store.h"
#include "transport/store_wire.h"
enum { ADDR_IN_USE = 42, TIMED_OUT = 99, MAX_PROCS = 8 };

static inline uint64_t now_ms(void) { return terse__store_now_ms(); }

static inline void sleep_ms(unsigned ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* A port nobody uses right now: bind port 0, read it back, close. Another
 * process may take it before we do, which the runner handles by retrying. */
static inline int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &sl), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* ---- a job: ranks and helper processes, reaped with a deadline ---- */

typedef struct job job;
typedef int (*proc_fn)(job *j, int idx);
struct job {
    int nranks, nprocs; /* procs[0..nranks) are ranks 0..; the rest are helpers */
    proc_fn fn[MAX_PROCS];
    char addr[64], token[64], log[64];
    int hold[2];   /* rank 0 may wait for EOF here: the parent closes it when the others end */
    int notify[2]; /* a helper may tell rank 0 it is done */
    int codes[MAX_PROCS];
    void *arg;
};

#define REQUIRE(cond, code, ...)                                                                   \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "[proc %d] %s:%d: ", idx, __FILE__, __LINE__);                         \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, " [last error: %s]\n", terse_last_error());                            \
            return (code);                                                                         \
        }                                                                                          \
    } while (0)

#define REQUIRE_OK(call) REQUIRE((call) == TERSE_OK, 10, "%s failed", #call)

static inline int decode(int st) {
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return -1;
}

/* Block until fd reaches EOF or timeout_ms passes. */
static inline void wait_eof(int fd, int timeout_ms) {
    uint64_t end = now_ms() + (uint64_t)timeout_ms;
    char b[16];
    while (now_ms() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 50) > 0 && read(fd, b, sizeof b) <= 0) return;
    }
}

/* Start every process, then reap them within timeout_ms (killing the rest
 * on expiry, recorded as TIMED_OUT). When every process but rank 0 has
 * ended, the hold pipe closes so that a rank 0 waiting on it can leave. */
static inline void run_once(job *j, int timeout_ms) {
    pid_t pid[MAX_PROCS];
    int logfd = -1;
    cr_assert_eq(pipe(j->hold), 0);
    cr_assert_eq(pipe(j->notify), 0);
    if (j->log[0]) {
        logfd = open(j->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        cr_assert_geq(logfd, 0);
    }
    pid_t parent = getpid();
    for (int i = 0; i < j->nprocs; i++) {
        pid[i] = fork();
        cr_assert_geq(pid[i], 0);
        if (pid[i] == 0) {
            /* A child never outlives the test, even if the test dies. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(1);
            alarm(30);
            close(j->hold[1]);
            if (i == 0 && logfd >= 0) dup2(logfd, 2);
            _exit(j->fn[i](j, i));
        }
    }
    close(j->hold[0]);
    if (logfd >= 0) close(logfd);
    int done[MAX_PROCS] = {0}, left = j->nprocs, held = 1;
    uint64_t end = now_ms() + (uint64_t)timeout_ms;
    while (left > 0) {
        for (int i = 0; i < j->nprocs; i++) {
            int st;
            if (done[i] || waitpid(pid[i], &st, WNOHANG) != pid[i]) continue;
            done[i] = 1;
            left--;
            j->codes[i] = decode(st);
            /* Rank 0 could not bind: the others would wait in vain. */
            if (i == 0 && j->codes[0] == ADDR_IN_USE)
                for (int k = 1; k < j->nprocs; k++)
                    if (!done[k]) kill(pid[k], SIGKILL);
        }
        if (held && (left == 0 || (left == 1 && !done[0]))) {
            close(j->hold[1]);
            held = 0;
        }
        if (left > 0 && now_ms() > end) {
            for (int i = 0; i < j->nprocs; i++) {
                if (done[i]) continue;
                kill(pid[i], SIGKILL);
                waitpid(pid[i], NULL, 0);
                j->codes[i] = TIMED_OUT;
            }
            break;
        }
        sleep_ms(2);
    }
    if (held) close(j->hold[1]);
    close(j->notify[0]);
    close(j->notify[1]);
}

/* Run the job on a fresh port, retrying when another process took it. */
static inline void run(job *j, int timeout_ms) {
    for (int attempt = 0; attempt < 5; attempt++) {
        snprintf(j->addr, sizeof j->addr, "127.0.0.1:%d", free_port());
        snprintf(j->token, sizeof j->token, "tok-%d-%d-%llu", (int)getpid(), attempt,
                 (unsigned long long)now_ms());
        run_once(j, timeout_ms);
        if (j->codes[0] != ADDR_IN_USE) return;
    }
    cr_assert_fail("could not find a free port in 5 attempts");
}

/* Open as `rank`, mapping a lost race for the port to ADDR_IN_USE. */
static inline int open_rank(job *j, int rank, terse__store **s) {
    terse_status st = terse__store_open(j->addr, rank, j->nranks, j->token, 5000, s);
    if (st == TERSE_ERR_IO && strstr(terse_last_error(), "in use")) return ADDR_IN_USE;
    if (st != TERSE_OK) {
        fprintf(stderr, "[rank %d] open: %s\n", rank, terse_last_error());
        return 11;
    }
    return 0;
}

static inline void expect_all_zero(const job *j) {
    for (int i = 0; i < j->nprocs; i++)
        cr_expect_eq(j->codes[i], 0, "process %d exited %d", i, j->codes[i]);
}

static inline char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return calloc(1, 1);
    char *b = calloc(1, 65536);
    size_t n = fread(b, 1, 65535, f);
    b[n] = '\0';
    fclose(f);
    return b;
}

#endif
