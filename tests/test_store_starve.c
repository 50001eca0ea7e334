/* The store cannot be starved: while an attacker on the same machine holds
 * up to 1,000 silent or garbage connections to the store's port, reopening
 * them as the store drops them (nine in ten silent), the job's ranks still join within their
 * timeout and run a collective. The attack is bounded (connections, time)
 * and aims only at the store this test starts. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <sys/resource.h>

#include "ranks.h"

#define ATTACK_CONNS 1000
#define ATTACK_S 12.0

/* Keep up to ATTACK_CONNS connections open to port, nine in ten silent, the rest
 * sending garbage; reopen what the store closes; stop after ATTACK_S. */
static void attacker(int port, volatile uint64_t *peak, volatile uint64_t *opened) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < ATTACK_CONNS + 64) {
        rl.rlim_cur = rl.rlim_max < ATTACK_CONNS + 64 ? rl.rlim_max : ATTACK_CONNS + 64;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    static int fd[ATTACK_CONNS];
    for (int i = 0; i < ATTACK_CONNS; i++) fd[i] = -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    double end = tr_now_ms() + ATTACK_S * 1e3;
    while (tr_now_ms() < end) {
        uint64_t open_now = 0;
        for (int i = 0; i < ATTACK_CONNS; i++) {
            if (fd[i] >= 0) {
                char b[256];
                ssize_t r = recv(fd[i], b, sizeof b, MSG_DONTWAIT);
                if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
                    close(fd[i]);
                    fd[i] = -1;
                } else if (i % 10 == 0) {
                    static const char junk[] = "\x10\x00\x00\x00\x02garbage-garbage!";
                    (void)send(fd[i], junk, sizeof junk - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
                }
            }
            if (fd[i] < 0) {
                int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
                if (s < 0) continue;
                if (connect(s, (struct sockaddr *)&a, sizeof a) != 0 && errno != EINPROGRESS) {
                    close(s);
                    continue;
                }
                fd[i] = s;
                (*opened)++;
            }
            open_now++;
        }
        if (open_now > *peak) *peak = open_now;
        usleep(20000);
    }
    for (int i = 0; i < ATTACK_CONNS; i++)
        if (fd[i] >= 0) close(fd[i]);
}

typedef struct {
    int status;
    double join_ms;
    char err[400];
} join_out;

Test(store_starve, ranks_join_while_1000_silent_or_garbage_connections_are_held) {
    const int N = 3;
    join_out *o = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    volatile uint64_t *stats = (volatile uint64_t *)(o + N);
    memset(o, 0, 4096);
    int port = tr_free_port();
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    fflush(NULL);
    pid_t att = fork();
    cr_assert_geq(att, 0);
    if (att == 0) {
        attacker(port, &stats[0], &stats[1]);
        _exit(0);
    }
    usleep(300 * 1000); /* the attack is already running when the job starts */
    pid_t pid[3];
    for (int r = 0; r < N; r++) {
        pid[r] = fork();
        cr_assert_geq(pid[r], 0);
        if (pid[r] == 0) {
            if (r == 0) usleep(200 * 1000); /* let the flood reach the store first */
            terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
            cfg.rank = r, cfg.nranks = N, cfg.addr = addr, cfg.provider = "tcp";
            cfg.token = "store-starvation-test", cfg.timeout_ms = 8000;
            cfg.init_timeout_ms = 8000;
            double t0 = tr_now_ms();
            terse_comm *c = NULL;
            terse_status s = terse_comm_init(&cfg, &c);
            if (s == TERSE_OK) s = terse_barrier(c);
            o[r].join_ms = tr_now_ms() - t0;
            o[r].status = (int)s;
            snprintf(o[r].err, sizeof o[r].err, "%s", terse_last_error());
            terse_comm_free(c);
            _exit(0);
        }
    }
    double deadline = tr_now_ms() + 30000;
    for (int r = 0; r < N; r++) {
        int st;
        while (waitpid(pid[r], &st, WNOHANG) == 0) {
            if (tr_now_ms() > deadline) kill(pid[r], SIGKILL);
            usleep(5000);
        }
        tr_remove_shm_of(pid[r]);
    }
    kill(att, SIGKILL);
    waitpid(att, NULL, 0);
    cr_log_info("attacker: peak %llu connections held, %llu opened in all",
                (unsigned long long)stats[0], (unsigned long long)stats[1]);
    cr_expect_geq(stats[0], 500, "the attack never held many connections (%llu): it proves "
                  "nothing", (unsigned long long)stats[0]);
    for (int r = 0; r < N; r++) {
        cr_expect_eq(o[r].status, TERSE_OK, "rank %d could not join under attack: %s", r,
                     o[r].err);
        if (o[r].status == TERSE_OK)
            cr_log_info("rank %d joined and passed a barrier in %.0f ms", r, o[r].join_ms);
    }
    munmap(o, 4096);
}
