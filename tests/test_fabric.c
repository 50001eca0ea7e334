/* The libfabric transport, over real providers between real processes.
 *
 * Each multi-rank test forks N ranks. The test process is only the
 * switchboard: it never touches libfabric; it relays the endpoint names the
 * ranks send it over socketpairs, collects one result record per rank, and
 * kills everything still alive at its deadline (each rank also has an
 * alarm), so no failure can hang the suite. */
#include <criterion/criterion.h>

#include "known_limits.h"
#include "plain_procs.h"
#include <glob.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/error.h"
#include "transport/fabric.h"

#define MAX_RANKS 4
#define NAME_CAP 1024
#define JOB_DEADLINE_S 45 /* the switchboard's limit for a whole job */
#define RANK_ALARM_S 50   /* each rank's own watchdog */
#define MiB ((size_t)1 << 20)

typedef struct {
    int status; /* the body's terse_status; -1: no record arrived */
    double wait_s, close_s;
    uint64_t sent, recv;
    uint64_t extra; /* whatever the body wants to report */
    char msg[512];
} rank_result;

/* A test body runs in rank `rank` after the AV is filled. ctl is the
 * rank's socket to the switchboard (see wait_release). */
typedef terse_status (*body_fn)(terse__fabric *f, int rank, int nranks, int ctl,
                                rank_result *res);

static double now_s(void) { return (double)terse__now_ns() * 1e-9; }
static uint64_t in_ms(int ms) { return terse__now_ns() + (uint64_t)ms * 1000000u; }

static int write_full(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        c += k, n -= (size_t)k;
    }
    return 0;
}

static int read_full(int fd, void *p, size_t n) {
    char *c = p;
    while (n) {
        ssize_t k = read(fd, c, n);
        if (k <= 0) return -1;
        c += k, n -= (size_t)k;
    }
    return 0;
}

/* Read n bytes within the switchboard's deadline. */
static int read_until(int fd, void *p, size_t n, double deadline) {
    char *c = p;
    while (n) {
        struct pollfd pfd = {fd, POLLIN, 0};
        int ms = (int)((deadline - now_s()) * 1000);
        if (ms <= 0 || poll(&pfd, 1, ms) <= 0) return -1;
        ssize_t k = read(fd, c, n);
        if (k <= 0) return -1;
        c += k, n -= (size_t)k;
    }
    return 0;
}

/* A silent rank blocks here until another rank has reported its result. */
static void wait_release(int ctl) {
    char b;
    (void)read_full(ctl, &b, 1);
}

static void rank_main(const char *prov, int rank, int nranks, int ctl, body_fn body) {
    alarm(RANK_ALARM_S);
    rank_result res = {.status = 0};
    terse__fabric *f = NULL;
    uint8_t name[NAME_CAP];
    size_t len = sizeof name;
    terse_status st = terse__fabric_open(prov, 1, rank, nranks, &f);
    if (st == TERSE_OK) st = terse__fabric_name(f, name, &len);
    uint32_t len32 = st == TERSE_OK ? (uint32_t)len : 0;
    if (write_full(ctl, &len32, 4) || (len32 && write_full(ctl, name, len32))) _exit(2);
    if (st == TERSE_OK) {
        uint8_t *all = malloc((size_t)nranks * len);
        if (!all || read_full(ctl, all, (size_t)nranks * len)) _exit(3);
        st = terse__fabric_set_peers(f, all, len);
        free(all);
    }
    if (st == TERSE_OK) st = body(f, rank, nranks, ctl, &res);
    if (st != TERSE_OK) snprintf(res.msg, sizeof res.msg, "%s", terse_last_error());
    res.status = st;
    terse__fabric_counters(f, &res.sent, &res.recv);
    double t = now_s();
    terse__fabric_close(f);
    res.close_s = now_s() - t;
    (void)write_full(ctl, &res, sizeof res);
    _exit(0);
}

/* Fork nranks ranks running body over prov; fill res[] and each rank's
 * wait status. */
static pid_t job_pids[MAX_RANKS]; /* of the last run_job */

static void run_job(const char *prov, int nranks, body_fn body, rank_result *res, int *wst) {
    int sock[MAX_RANKS][2];
    pid_t *pid = job_pids;
    double deadline = now_s() + JOB_DEADLINE_S;
    cr_assert(nranks <= MAX_RANKS);
    for (int r = 0; r < nranks; r++) {
        cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sock[r]), 0);
        res[r] = (rank_result){.status = -1};
        wst[r] = -1;
    }
    fflush(NULL);
    for (int r = 0; r < nranks; r++) {
        pid[r] = fork();
        cr_assert(pid[r] >= 0);
        if (pid[r] == 0) {
            for (int q = 0; q < nranks; q++) {
                close(sock[q][0]);
                if (q != r) close(sock[q][1]);
            }
            rank_main(prov, r, nranks, sock[r][1], body);
        }
        close(sock[r][1]);
    }
    /* Relay names: everyone's, in rank order, to everyone. */
    uint8_t *all = NULL;
    uint32_t len = 0;
    int ok = 1;
    for (int r = 0; r < nranks && ok; r++) {
        uint32_t l;
        ok = read_until(sock[r][0], &l, 4, deadline) == 0 && l > 0 && l <= NAME_CAP &&
             (r == 0 || l == len);
        if (!ok) break;
        len = l;
        if (!all) all = malloc((size_t)nranks * len);
        ok = all && read_until(sock[r][0], all + (size_t)r * len, len, deadline) == 0;
    }
    for (int r = 0; r < nranks && ok; r++)
        ok = write_full(sock[r][0], all, (size_t)nranks * len) == 0;
    free(all);
    /* Results; each one releases ranks parked in wait_release. */
    for (int r = 0; r < nranks && ok; r++) {
        if (read_until(sock[r][0], &res[r], sizeof res[r], deadline) != 0) {
            res[r].status = -1;
            continue;
        }
        for (int q = 0; q < nranks; q++) (void)write_full(sock[q][0], "x", 1);
    }
    for (int r = 0; r < nranks; r++) {
        while (waitpid(pid[r], &wst[r], WNOHANG) == 0) {
            if (now_s() > deadline) kill(pid[r], SIGKILL);
            usleep(2000);
        }
        close(sock[r][0]);
    }
}

static void expect_all_ok(const rank_result *res, const int *wst, int nranks) {
    for (int r = 0; r < nranks; r++) {
        cr_expect(WIFEXITED(wst[r]) && WEXITSTATUS(wst[r]) == 0, "rank %d died (status %#x)", r,
                  wst[r]);
        cr_expect_eq(res[r].status, TERSE_OK, "rank %d: status %d: %s", r, res[r].status,
                     res[r].msg);
    }
}

/* ---------------------------------------------------------------- content */

static uint8_t pattern(size_t j, int sender, uint64_t tag) {
    return (uint8_t)(j * 131 + (j >> 11) + (size_t)sender * 17 + tag * 7);
}
static void fill(uint8_t *b, size_t n, int sender, uint64_t tag) {
    for (size_t j = 0; j < n; j++) b[j] = pattern(j, sender, tag);
}
/* Index of the first wrong byte, or n. */
static size_t first_bad(const uint8_t *b, size_t n, int sender, uint64_t tag) {
    for (size_t j = 0; j < n; j++)
        if (b[j] != pattern(j, sender, tag)) return j;
    return n;
}

static terse_status check(const uint8_t *b, size_t n, int sender, uint64_t tag,
                          rank_result *res) {
    size_t bad = first_bad(b, n, sender, tag);
    if (bad == n) return TERSE_OK;
    snprintf(res->msg, sizeof res->msg, "message from rank %d tag %llu (%zu bytes) wrong at %zu",
             sender, (unsigned long long)tag, n, bad);
    return TERSE_ERR_INTERNAL;
}

static const size_t sizes[] = {0, 1, 4095, MiB + 3, 64 * MiB};
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* ---------------------------------------------------------------- bodies */

/* Rank 0 sends each size, rank 1 checks it and echoes it back. */
static terse_status body_pingpong(terse__fabric *f, int rank, int nranks, int ctl,
                                  rank_result *res) {
    (void)nranks, (void)ctl;
    uint8_t *buf = malloc(64 * MiB), *back = malloc(64 * MiB);
    terse_status st = TERSE_OK;
    for (size_t k = 0; k < NSIZES && st == TERSE_OK; k++) {
        size_t n = sizes[k];
        terse__fabric_req q[2];
        if (rank == 0) {
            fill(buf, n, 0, k);
            st = terse__fabric_irecv(f, 1, 100 + k, back, n, &q[0]);
            if (!st) st = terse__fabric_isend(f, 1, k, buf, n, &q[1]);
            if (!st) st = terse__fabric_wait(f, q, 2, in_ms(20000), NULL, NULL);
            if (!st) st = check(back, n, 0, k, res);
        } else {
            st = terse__fabric_irecv(f, 0, k, buf, n, &q[0]);
            if (!st) st = terse__fabric_wait(f, q, 1, in_ms(20000), NULL, NULL);
            if (!st) st = check(buf, n, 0, k, res);
            if (!st) st = terse__fabric_isend(f, 0, 100 + k, buf, n, &q[1]);
            if (!st) st = terse__fabric_wait(f, &q[1], 1, in_ms(20000), NULL, NULL);
        }
    }
    free(buf);
    free(back);
    return st;
}

/* Every rank sends each size to its right neighbour and receives from its
 * left one, all at once. */
static terse_status body_ring(terse__fabric *f, int rank, int nranks, int ctl, rank_result *res) {
    (void)ctl;
    int right = (rank + 1) % nranks, left = (rank + nranks - 1) % nranks;
    uint8_t *out = malloc(64 * MiB), *in = malloc(64 * MiB);
    terse_status st = TERSE_OK;
    for (size_t k = 0; k < NSIZES && st == TERSE_OK; k++) {
        terse__fabric_req q[2];
        fill(out, sizes[k], rank, k);
        memset(in, 0xee, sizes[k]);
        st = terse__fabric_irecv(f, left, k, in, sizes[k], &q[0]);
        if (!st) st = terse__fabric_isend(f, right, k, out, sizes[k], &q[1]);
        if (!st) st = terse__fabric_wait(f, q, 2, in_ms(20000), NULL, NULL);
        if (!st) st = check(in, sizes[k], left, k, res);
    }
    free(out);
    free(in);
    return st;
}

/* Many messages per peer, every one a different size (several chunks with
 * TERSE_CHUNK_BYTES=1000), receives posted in ascending tag order and sends
 * in descending order, all outstanding together. */
#define NTAGS 48
static size_t tag_size(size_t t, int from, int to) {
    return t % 7 == 0 ? 0 : (t * 7919 + (size_t)from * 31 + (size_t)to * 17) % 9000;
}
static terse_status body_many_tags(terse__fabric *f, int rank, int nranks, int ctl,
                                   rank_result *res) {
    (void)ctl;
    size_t nreq = 2 * (size_t)(nranks - 1) * NTAGS, k = 0;
    terse__fabric_req *q = calloc(nreq, sizeof *q);
    uint8_t **bufs = calloc(nreq, sizeof *bufs);
    terse_status st = TERSE_OK;
    uint64_t want_sent = 0, want_recv = 0;
    for (int p = 0; p < nranks && !st; p++)
        for (size_t t = 0; t < NTAGS && !st && p != rank; t++, k++) {
            size_t n = tag_size(t, p, rank);
            bufs[k] = malloc(n + 1);
            st = terse__fabric_irecv(f, p, t, bufs[k], n, &q[k]);
            want_recv += n;
        }
    for (size_t t = NTAGS; t-- > 0 && !st;)
        for (int p = 0; p < nranks && !st; p++) {
            if (p == rank) continue;
            size_t n = tag_size(t, rank, p);
            bufs[k] = malloc(n + 1);
            fill(bufs[k], n, rank, t);
            st = terse__fabric_isend(f, p, t, bufs[k], n, &q[k]);
            want_sent += n;
            k++;
        }
    if (!st) st = terse__fabric_wait(f, q, nreq, in_ms(20000), NULL, NULL);
    for (size_t i = 0; i < nreq / 2 && !st; i++)
        st = check(bufs[i], q[i].len, q[i].peer, q[i].tag, res);
    uint64_t sent, recv;
    terse__fabric_counters(f, &sent, &recv);
    if (!st && (sent != want_sent || recv != want_recv)) {
        snprintf(res->msg, sizeof res->msg, "counters %llu/%llu, expected %llu/%llu",
                 (unsigned long long)sent, (unsigned long long)recv,
                 (unsigned long long)want_sent, (unsigned long long)want_recv);
        st = TERSE_ERR_INTERNAL;
    }
    for (size_t i = 0; i < nreq; i++) free(bufs[i]);
    free(bufs);
    free(q);
    return st;
}

/* ---------------------------------------------------------------- failure bodies */

static int g_rank0_sends; /* direction switch for the failure bodies */

/* Both sides complete one small exchange, so the endpoints are connected
 * before the interesting part starts. */
static terse_status sync_pair(terse__fabric *f, int peer) {
    uint8_t a = 1, b = 0;
    terse__fabric_req q[2];
    TERSE_CHECK(terse__fabric_irecv(f, peer, 999, &b, 1, &q[0]));
    TERSE_CHECK(terse__fabric_isend(f, peer, 999, &a, 1, &q[1]));
    return terse__fabric_wait(f, q, 2, in_ms(20000), NULL, NULL);
}

/* Rank 1 never posts anything; rank 0 sends or receives 4 MiB with a
 * 1.5 s deadline. */
static terse_status body_silent(terse__fabric *f, int rank, int nranks, int ctl,
                                rank_result *res) {
    (void)nranks;
    if (rank == 1) {
        wait_release(ctl);
        return TERSE_OK;
    }
    uint8_t *buf = calloc(4 * MiB, 1);
    terse__fabric_req q;
    terse_status st = g_rank0_sends ? terse__fabric_isend(f, 1, 7, buf, 4 * MiB, &q)
                                    : terse__fabric_irecv(f, 1, 7, buf, 4 * MiB, &q);
    double t = now_s();
    if (!st) st = terse__fabric_wait(f, &q, 1, in_ms(1500), NULL, NULL);
    res->wait_s = now_s() - t;
    free(buf);
    return st;
}

/* Rank 1 starts a 64 MiB transfer with rank 0, progresses it for 5 ms and
 * dies by SIGKILL; rank 0 waits with a 2.5 s deadline. */
static terse_status body_killed(terse__fabric *f, int rank, int nranks, int ctl,
                                rank_result *res) {
    (void)nranks, (void)ctl;
    uint8_t *buf = calloc(64 * MiB, 1);
    terse_status st = sync_pair(f, 1 - rank);
    terse__fabric_req q;
    int sends = (rank == 0) == g_rank0_sends;
    if (!st) st = sends ? terse__fabric_isend(f, 1 - rank, 8, buf, 64 * MiB, &q)
                        : terse__fabric_irecv(f, 1 - rank, 8, buf, 64 * MiB, &q);
    if (st) {
        free(buf);
        return st;
    }
    if (rank == 1) {
        (void)terse__fabric_wait(f, &q, 1, in_ms(5), NULL, NULL);
        raise(SIGKILL);
    }
    double t = now_s();
    st = terse__fabric_wait(f, &q, 1, in_ms(2500), NULL, NULL);
    res->wait_s = now_s() - t;
    free(buf);
    return st;
}

static int alive_calls;
static terse_status alive_probe(void *arg) {
    (void)arg;
    if (++alive_calls < 20) return TERSE_OK;
    return TERSE_ERROR(TERSE_ERR_PEER_LOST, "alive probe: rank 1 is gone after %d calls",
                       alive_calls);
}

/* Rank 0 waits on silent rank 1 with a liveness probe that gives up after
 * 20 calls (about 20 ms); the deadline is far away. */
static terse_status body_alive(terse__fabric *f, int rank, int nranks, int ctl,
                               rank_result *res) {
    (void)nranks;
    if (rank == 1) {
        wait_release(ctl);
        return TERSE_OK;
    }
    uint8_t b[64];
    terse__fabric_req q;
    TERSE_CHECK(terse__fabric_irecv(f, 1, 3, b, sizeof b, &q));
    double t = now_s();
    terse_status st = terse__fabric_wait(f, &q, 1, in_ms(20000), alive_probe, NULL);
    res->wait_s = now_s() - t;
    res->extra = (uint64_t)alive_calls;
    return st;
}

/* Rank 1 sends 2000 bytes (g_rank0_sends == 0) or 500 bytes (== 1) where
 * rank 0 posted a 1000-byte receive. */
static terse_status body_mismatch(terse__fabric *f, int rank, int nranks, int ctl,
                                  rank_result *res) {
    (void)nranks, (void)ctl, (void)res;
    uint8_t buf[2000] = {0};
    terse__fabric_req q;
    if (rank == 1) {
        terse_status st = terse__fabric_isend(f, 0, 5, buf, g_rank0_sends ? 500 : 2000, &q);
        if (!st) (void)terse__fabric_wait(f, &q, 1, in_ms(3000), NULL, NULL);
        return TERSE_OK; /* this side's fate is the provider's business */
    }
    TERSE_CHECK(terse__fabric_irecv(f, 1, 5, buf, 1000, &q));
    return terse__fabric_wait(f, &q, 1, in_ms(3000), NULL, NULL);
}

/* ---------------------------------------------------------------- multi-process tests */

static uint64_t sum_sizes(void) {
    uint64_t s = 0;
    for (size_t k = 0; k < NSIZES; k++) s += sizes[k];
    return s;
}

static void pingpong(const char *prov) {
    rank_result res[2];
    int wst[2];
    run_job(prov, 2, body_pingpong, res, wst);
    expect_all_ok(res, wst, 2);
    /* sizes 0 .. 64 MiB each way: the counters count exactly the payload */
    cr_expect_eq(res[0].sent, sum_sizes());
    cr_expect_eq(res[0].recv, sum_sizes());
    cr_expect_eq(res[1].recv, sum_sizes());
}

Test(fabric, shm_pingpong_of_every_size_arrives_intact, .timeout = 60) { pingpong("shm"); }
Test(fabric, tcp_pingpong_of_every_size_arrives_intact, .timeout = 60) { pingpong("tcp"); }

Test(fabric, tcp_pingpong_with_registered_buffers, .timeout = 60) {
    /* Exercises the FI_MR_LOCAL path (fi_mr_reg + desc) that verbs and efa
     * demand, on a provider this machine has. */
    setenv("TERSE_FABRIC_REGISTER", "1", 1);
    pingpong("tcp");
}

static void ring3(const char *prov) {
    rank_result res[3];
    int wst[3];
    run_job(prov, 3, body_ring, res, wst);
    expect_all_ok(res, wst, 3);
}

Test(fabric, shm_three_rank_ring_of_every_size, .timeout = 60) { ring3("shm"); }
Test(fabric, tcp_three_rank_ring_of_every_size, .timeout = 60) { ring3("tcp"); }

static void many_tags(const char *prov) {
    rank_result res[3];
    int wst[3];
    setenv("TERSE_CHUNK_BYTES", "1000", 1);
    run_job(prov, 3, body_many_tags, res, wst);
    expect_all_ok(res, wst, 3);
}

Test(fabric, shm_many_outstanding_tags_match_out_of_order, .timeout = 60) { many_tags("shm"); }
Test(fabric, tcp_many_outstanding_tags_match_out_of_order, .timeout = 60) { many_tags("tcp"); }

static void silent(const char *prov, int rank0_sends) {
    rank_result res[2];
    int wst[2];
    g_rank0_sends = rank0_sends;
    run_job(prov, 2, body_silent, res, wst);
    cr_assert_eq(res[0].status, TERSE_ERR_TIMEOUT, "%d: %s", res[0].status, res[0].msg);
    cr_expect(res[0].wait_s >= 1.4 && res[0].wait_s < 1.5 + plain_slack_ms(1500) / 1e3, "waited %.3f s",
              res[0].wait_s);
    cr_expect(strstr(res[0].msg, rank0_sends ? "sending to rank 1" : "receiving from rank 1"),
              "%s", res[0].msg);
    cr_expect(res[0].close_s < plain_slack_ms(2000) / 1e3, "close took %.3f s", res[0].close_s);
    cr_expect_eq(res[1].status, TERSE_OK, "%s", res[1].msg);
}

Test(fabric, shm_silent_sender_times_out_naming_it, .timeout = 60) { silent("shm", 0); }
Test(fabric, shm_silent_receiver_times_out_naming_it, .timeout = 60) { silent("shm", 1); }
Test(fabric, tcp_silent_sender_times_out_naming_it, .timeout = 60) { silent("tcp", 0); }
Test(fabric, tcp_silent_receiver_times_out_naming_it, .timeout = 60) { silent("tcp", 1); }

/* A rank killed by SIGKILL cannot unlink its shm provider region
 * (/dev/shm/<pid>:<...>, 16 MiB of RAM each in libfabric 1.17); remove
 * it so the suite does not leak memory. */
static void remove_shm_regions(pid_t pid) {
    char pat[64];
    glob_t g;
    snprintf(pat, sizeof pat, "/dev/shm/%d:*", (int)pid);
    if (glob(pat, 0, NULL, &g) != 0) return;
    for (size_t i = 0; i < g.gl_pathc; i++) unlink(g.gl_pathv[i]);
    globfree(&g);
}

static void killed(const char *prov, int rank0_sends) {
    rank_result res[2];
    int wst[2];
    g_rank0_sends = rank0_sends;
    run_job(prov, 2, body_killed, res, wst);
    remove_shm_regions(job_pids[1]);
    cr_expect(WIFSIGNALED(wst[1]) && WTERMSIG(wst[1]) == SIGKILL, "rank 1 status %#x", wst[1]);
    if (!strcmp(prov, "rxm") && WIFSIGNALED(wst[0]) && WTERMSIG(wst[0]) == SIGSEGV) {
        /* seen in the fresh-clone CI, 2026-12-02 (SECURITY.md) */
        fprintf(stderr, "WARNING: KNOWN LIMITATION: rank 0 (tcp) died of SIGSEGV: %s\n",
                TR_RXM_TEARDOWN_SEGV);
        return;
    }
    cr_assert(res[0].status == TERSE_ERR_PEER_LOST || res[0].status == TERSE_ERR_TIMEOUT,
              "%d: %s", res[0].status, res[0].msg);
    cr_expect(strstr(res[0].msg, "rank 1"), "%s", res[0].msg);
    cr_expect(res[0].wait_s < 2.5 + plain_slack_ms(1500) / 1e3, "waited %.3f s", res[0].wait_s);
    cr_expect(res[0].close_s < plain_slack_ms(2000) / 1e3, "close took %.3f s", res[0].close_s);
}

Test(fabric, shm_sender_killed_mid_transfer_is_reported_in_time, .timeout = 60) {
    killed("shm", 0);
}
Test(fabric, shm_receiver_killed_mid_transfer_is_reported_in_time, .timeout = 60) {
    killed("shm", 1);
}
Test(fabric, tcp_sender_killed_mid_transfer_is_reported_in_time, .timeout = 60) {
    killed("tcp", 0);
}
Test(fabric, tcp_receiver_killed_mid_transfer_is_reported_in_time, .timeout = 60) {
    killed("tcp", 1);
}

Test(fabric, alive_probe_aborts_the_wait_at_once_with_its_status, .timeout = 60) {
    rank_result res[2];
    int wst[2];
    run_job("shm", 2, body_alive, res, wst);
    cr_assert_eq(res[0].status, TERSE_ERR_PEER_LOST, "%d: %s", res[0].status, res[0].msg);
    cr_expect(strstr(res[0].msg, "alive probe"), "%s", res[0].msg);
    cr_expect_eq(res[0].extra, 20); /* called until it said no, then never again */
    /* about once per millisecond: 20 calls take >= 19 ms, and far less
     * than a second */
    cr_expect(res[0].wait_s >= 0.019 && res[0].wait_s < plain_slack_ms(1000) / 1e3, "waited %.3f s",
              res[0].wait_s);
}

static void mismatch(int shorter) {
    rank_result res[2];
    int wst[2];
    g_rank0_sends = shorter;
    run_job("shm", 2, body_mismatch, res, wst);
    cr_assert_eq(res[0].status, TERSE_ERR_CORRUPT, "%d: %s", res[0].status, res[0].msg);
    cr_expect(strstr(res[0].msg, "rank 1 sent"), "%s", res[0].msg);
    cr_expect(strstr(res[0].msg, shorter ? "500" : "1000"), "%s", res[0].msg);
}

Test(fabric, a_longer_message_than_posted_is_corrupt, .timeout = 60) { mismatch(0); }
Test(fabric, a_shorter_message_than_posted_is_corrupt, .timeout = 60) { mismatch(1); }
