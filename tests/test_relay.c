/* A fault-injecting TCP relay between two ranks' data endpoints (what an
 * on-path middlebox or attacker could do to tcp;ofi_rxm's connection):
 * it delays the bytes, flips one, or forwards part of the stream and then
 * cuts both sides. Every collective gives the right sum or a specific
 * error naming the other rank -- never TERSE_OK with wrong data, never a
 * hang. (A connection dropped outright is tests/test_conn_drop.c.) A
 * relay that only reads along finds the ranks' data in the stream under
 * TERSE_WIRE=mac and none of it under seal.
 *
 * How the relay gets in between: each rank advertises the relay's port as
 * its own. rxm learns its address from its listening socket, so this test
 * binary interposes getsockname() (linked -rdynamic) and, in a rank's
 * process only, reports the relay port that fronts that rank. Peers then
 * connect to the relay, which connects on to the rank's real port; the
 * claimed ports match the advertised names, so rxm attributes every
 * message correctly. Loopback only; the relay serves this test's ranks. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/syscall.h>

#include "algos/comm/comm.h"
#include "ranks.h"

#define N_FLOATS (1u << 18)
#define MAX_PAIRS 8

/* Shared with the rank processes and the relay (mapped before the forks). */
typedef struct relay_shared {
    int front[2]; /* the relay's listening ports, one per rank */
    int real[2];  /* the ranks' real endpoint ports, once known */
    long forwarded, flipped, cut;
    long clear; /* MODE_WATCH: runs of the ranks' data seen in the stream */
} relay_shared;

static relay_shared *shared;
static int fake_port; /* in a rank's process: the port to report */

__attribute__((visibility("default"))) int getsockname(int fd, struct sockaddr *addr,
                                                     socklen_t *len) {
    long ret = syscall(SYS_getsockname, fd, addr, len);
    if (ret != 0 || !fake_port || !addr || *len < sizeof(struct sockaddr_in) ||
        addr->sa_family != AF_INET)
        return (int)ret;
    int listening = 0;
    socklen_t ol = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ol) != 0 || !listening)
        return (int)ret;
    struct sockaddr_in *in = (struct sockaddr_in *)addr;
    for (int r = 0; r < 2; r++)
        if (shared->front[r] == fake_port && !shared->real[r]) shared->real[r] = ntohs(in->sin_port);
    in->sin_port = htons((uint16_t)fake_port);
    return (int)ret;
}

static void advertise_relay(int rank, const void *arg) {
    (void)arg;
    fake_port = shared->front[rank];
}

typedef enum { MODE_DELAY, MODE_FLIP, MODE_TRUNCATE, MODE_WATCH } relay_mode;

/* MODE_WATCH: how many times the data tr_pattern_allreduce gives a rank
 * (floats b, b + 1, b + 2, ... for b = 0..9) shows in one read: three
 * such floats in a row, 12 bytes, never turn up by chance. */
static long clear_runs(const char *buf, size_t n) {
    long hits = 0;
    for (int b = 0; b <= 9; b++) {
        const float needle[3] = {(float)b, (float)(b + 1), (float)(b + 2)};
        for (const char *p = buf, *end = buf + n;
             (p = memmem(p, (size_t)(end - p), needle, sizeof needle)); p += sizeof needle)
            hits++;
    }
    return hits;
}

static int listen_any(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 8) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &sl) != 0)
        return -1;
    *port = ntohs(a.sin_port);
    return fd;
}

static int connect_to(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The relay process: accept on both fronts, connect on to the real port,
 * pump bytes both ways, inject the fault once; exit after `seconds`. A
 * flip hits the byte at offset `after` of the first direction of any
 * connection to carry that many; a cut comes once a connection carried
 * `after` bytes both ways together. (rxm keeps one connection per pair of
 * ranks; which of the two ranks opens it varies.) */
static void relay_run(int lfd[2], relay_mode mode, long after, double seconds) {
    struct { int a, b; long n[2]; int dead; } pr[MAX_PAIRS];
    int npairs = 0;
    double end = tr_now_ms() + seconds * 1e3;
    char buf[65536];
    while (tr_now_ms() < end) {
        struct pollfd p[2 + 2 * MAX_PAIRS];
        int np = 0;
        for (int r = 0; r < 2; r++) p[np++] = (struct pollfd){lfd[r], POLLIN, 0};
        for (int i = 0; i < npairs; i++) {
            p[np++] = (struct pollfd){pr[i].dead ? -1 : pr[i].a, POLLIN, 0};
            p[np++] = (struct pollfd){pr[i].dead ? -1 : pr[i].b, POLLIN, 0};
        }
        if (poll(p, (nfds_t)np, 50) <= 0) continue;
        for (int r = 0; r < 2; r++) {
            if (!(p[r].revents & POLLIN) || npairs == MAX_PAIRS) continue;
            int a = accept(lfd[r], NULL, NULL);
            if (a < 0) continue;
            while (!shared->real[r] && tr_now_ms() < end) usleep(1000);
            int b = shared->real[r] ? connect_to(shared->real[r]) : -1;
            if (b < 0) {
                close(a);
                continue;
            }
            pr[npairs].a = a, pr[npairs].b = b, pr[npairs].n[0] = pr[npairs].n[1] = 0;
            pr[npairs].dead = 0;
            npairs++;
        }
        for (int i = 0; i < npairs; i++) {
            for (int d = 0; d < 2 && !pr[i].dead; d++) {
                if (!(p[2 + 2 * i + d].revents & (POLLIN | POLLHUP | POLLERR))) continue;
                int from = d ? pr[i].b : pr[i].a, to = d ? pr[i].a : pr[i].b;
                ssize_t got = read(from, buf, sizeof buf);
                if (got <= 0) {
                    pr[i].dead = 1;
                    shutdown(pr[i].a, SHUT_RDWR), shutdown(pr[i].b, SHUT_RDWR);
                    continue;
                }
                long before = pr[i].n[d];
                pr[i].n[d] += got;
                if (mode == MODE_FLIP && before < after && pr[i].n[d] >= after &&
                    !shared->flipped) {
                    buf[after - before] ^= 0x10;
                    shared->flipped = 1;
                }
                const long both = pr[i].n[0] + pr[i].n[1], both_before = both - got;
                if (mode == MODE_TRUNCATE && both >= after && !shared->cut) {
                    /* either way round: forward up to `after` bytes of the pair, then cut */
                    size_t part = (size_t)(after - both_before > 0 ? after - both_before : 0);
                    if (part && write(to, buf, part) < 0) part = 0;
                    shared->cut = 1;
                    pr[i].dead = 1;
                    shutdown(pr[i].a, SHUT_RDWR), shutdown(pr[i].b, SHUT_RDWR);
                    continue;
                }
                if (mode == MODE_DELAY) usleep(2000); /* 2 ms per read: tens of MB/s */
                if (mode == MODE_WATCH) shared->clear += clear_runs(buf, (size_t)got);
                for (ssize_t off = 0; off < got;) {
                    ssize_t w = write(to, buf + off, (size_t)(got - off));
                    if (w <= 0) break;
                    off += w;
                }
                shared->forwarded += got;
            }
        }
    }
    _exit(0);
}

/* u[0]: first failing status; u[1]: OK calls with a wrong sum; u[2]: calls. */
static int relay_body(terse_comm *c, tr_out *o, const void *arg) {
    const double end = tr_now_ms() + *(const double *)arg * 1e3;
    float *x = malloc(N_FLOATS * sizeof(float));
    for (int k = 0; tr_pattern_allreduce(c, o, x, N_FLOATS, k, tr_now_ms() > end) == 0; k++) {
    }
    free(x);
    return 0;
}

static void run_relay(relay_mode mode, long after, const char *what, const char *wire) {
    if (wire)
        setenv("TERSE_WIRE", wire, 1);
    else
        unsetenv("TERSE_WIRE");
    shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(shared, MAP_FAILED);
    memset(shared, 0, sizeof *shared);
    int lfd[2];
    for (int r = 0; r < 2; r++) {
        lfd[r] = listen_any(&shared->front[r]);
        cr_assert_geq(lfd[r], 0, "no listening socket for the relay");
    }
    const double seconds = 2.0;
    fflush(NULL);
    pid_t relay = fork();
    cr_assert_geq(relay, 0);
    if (relay == 0) relay_run(lfd, mode, after, seconds + 20);
    close(lfd[0]), close(lfd[1]);
    tr_job job = {"tcp", 2, 3000, 40, -1};
    tr_before_init = advertise_relay;
    tr_out *o = tr_run(&job, relay_body, &seconds);
    tr_before_init = NULL;
    unsetenv("TERSE_WIRE");
    kill(relay, SIGKILL);
    waitpid(relay, NULL, 0);
    cr_log_info("%s: relay forwarded %ld bytes (flipped %ld, cut %ld, %ld runs of data in the "
                "clear)", what, shared->forwarded, shared->flipped, shared->cut, shared->clear);
    cr_expect_gt(shared->forwarded, 1 << 20, "%s: the traffic did not go through the relay", what);
    for (int r = 0; r < 2; r++) {
        terse_status s = (terse_status)o[r].u[0];
        cr_log_info("%s: rank %d: %llu calls, then %s: %s", what, r,
                    (unsigned long long)o[r].u[2], terse_status_name(s), o[r].err);
        cr_expect_eq(o[r].u[1], 0, "%s: rank %d: %llu calls returned TERSE_OK with a wrong sum",
                     what, r, (unsigned long long)o[r].u[1]);
        if (mode == MODE_DELAY || mode == MODE_WATCH) {
            cr_expect_eq(s, TERSE_OK, "%s: rank %d failed: %s", what, r, o[r].err);
        } else if (s != TERSE_OK) {
            cr_expect(s == TERSE_ERR_PEER_LOST || s == TERSE_ERR_TIMEOUT || s == TERSE_ERR_AUTH ||
                          s == TERSE_ERR_CORRUPT,
                      "%s: rank %d: %s: %s", what, r, terse_status_name(s), o[r].err);
            cr_expect(strstr(o[r].err, r ? "rank 0" : "rank 1"),
                      "%s: rank %d does not name its peer: %s", what, r, o[r].err);
        }
    }
    if (mode == MODE_WATCH && wire && strcmp(wire, "seal") == 0)
        cr_expect_eq(shared->clear, 0, "%s: a relay read the ranks' data %ld times", what,
                     shared->clear);
    else if (mode == MODE_WATCH) /* the control: it does find the data when it is there */
        cr_expect_gt(shared->clear, 100, "%s: the relay found the ranks' data only %ld times",
                     what, shared->clear);
    const int faulty = mode == MODE_FLIP || mode == MODE_TRUNCATE;
    if (faulty)
        cr_expect(shared->flipped || shared->cut, "%s: the fault was never injected", what);
    if (faulty)
        cr_expect(o[0].u[0] != TERSE_OK || o[1].u[0] != TERSE_OK,
                  "%s: no rank noticed the fault", what);
    tr_release(o);
    munmap(shared, sizeof *shared);
}

Test(relay, a_relay_that_delays_every_read_changes_no_result_tcp) {
    run_relay(MODE_DELAY, 0, "delay", NULL);
}

Test(relay, a_relay_reads_the_data_under_mac_and_none_of_it_under_seal_tcp) {
    run_relay(MODE_WATCH, 0, "watch, mac", "mac");
    run_relay(MODE_WATCH, 0, "watch, seal", "seal");
}

Test(relay, a_flipped_byte_mid_stream_gives_a_named_error_never_a_wrong_sum_tcp) {
    run_relay(MODE_FLIP, 3 << 20, "flip", NULL);
}

Test(relay, a_stream_cut_mid_message_gives_a_named_error_tcp) {
    run_relay(MODE_TRUNCATE, (5 << 20) + 777, "truncate", NULL);
}
