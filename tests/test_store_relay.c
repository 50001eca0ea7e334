/* A relay between a rank and the bootstrap store that passes the
 * handshake through untouched and then alters one byte of a later frame
 * (what an on-path attacker who cannot forge the handshake could still
 * do): every frame after WELCOME is authenticated, so the altered frame is
 * refused -- the rank is reported lost -- and no rank ever accepts the
 * altered value. Real processes over loopback only. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "transport/store.h"

#define TOKEN "store-relay-test-token"
#define VALUE_LEN 64

static int listen_on(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(fd, 4), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &sl), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

static int free_port(void) {
    int p, fd = listen_on(&p);
    close(fd);
    return p;
}

/* Forward one connection both ways; flip the byte at client->server
 * offset `flip_at` (past the 77-byte AUTH frame). Ends after 10 s. */
static void relay(int lfd, int store_port, size_t flip_at) {
    int c = accept(lfd, NULL, NULL);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)store_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < 200 && connect(s, (struct sockaddr *)&a, sizeof a) != 0; i++) {
        close(s);
        s = socket(AF_INET, SOCK_STREAM, 0);
        usleep(10000);
    }
    size_t up = 0;
    struct pollfd p[2] = {{c, POLLIN, 0}, {s, POLLIN, 0}};
    for (int rounds = 0; rounds < 1000; rounds++) {
        if (poll(p, 2, 10) < 0) break;
        uint8_t b[4096];
        if (p[0].revents & (POLLIN | POLLHUP)) {
            ssize_t n = recv(c, b, sizeof b, 0);
            if (n <= 0) break;
            if (flip_at >= up && flip_at < up + (size_t)n) b[flip_at - up] ^= 0x01;
            up += (size_t)n;
            (void)send(s, b, (size_t)n, MSG_NOSIGNAL);
        }
        if (p[1].revents & (POLLIN | POLLHUP)) {
            ssize_t n = recv(s, b, sizeof b, 0);
            if (n <= 0) break;
            (void)send(c, b, (size_t)n, MSG_NOSIGNAL);
        }
    }
}

typedef struct {
    int status[2];
    int wrong[2]; /* the rank accepted a value that differs from what was sent */
    char err[2][400];
} relay_out;

static void rank_main(int r, const char *addr, relay_out *o) {
    terse__store *st = NULL;
    terse_status s = terse__store_open(addr, r, 2, TOKEN, 5000, &st);
    if (s == TERSE_OK) {
        uint8_t mine[VALUE_LEN], all[2 * VALUE_LEN];
        memset(mine, 'a' + r, sizeof mine);
        s = terse__store_allgather(st, mine, sizeof mine, all, 5000);
        if (s == TERSE_OK)
            for (int q = 0; q < 2; q++)
                for (int i = 0; i < VALUE_LEN; i++)
                    o->wrong[r] |= all[q * VALUE_LEN + i] != 'a' + q;
    }
    o->status[r] = (int)s;
    snprintf(o->err[r], sizeof o->err[r], "%s", terse_last_error());
    if (s == TERSE_OK) terse__store_close(st);
    else terse__store_abandon(st);
    _exit(0);
}

Test(store_relay, a_byte_altered_after_the_handshake_is_refused_never_accepted) {
    /* Client -> server: AUTH is 5 + 72 bytes; the SET of "ag/0/1" follows
     * (5-byte header, u32 id, u16 key length, 6-byte key, then the value):
     * offset 77 + 5 + 6 + 6 + 10 is inside the value. */
    const size_t flip_at = 77 + 5 + 6 + 6 + 10;
    relay_out *o = mmap(NULL, sizeof *o, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
                        0);
    memset(o, 0, sizeof *o);
    int store_port = free_port(), relay_port;
    int lfd = listen_on(&relay_port);
    char store_addr[64], relay_addr[64];
    snprintf(store_addr, sizeof store_addr, "127.0.0.1:%d", store_port);
    snprintf(relay_addr, sizeof relay_addr, "127.0.0.1:%d", relay_port);
    fflush(NULL);
    pid_t rel = fork();
    if (rel == 0) {
        relay(lfd, store_port, flip_at);
        _exit(0);
    }
    close(lfd);
    pid_t p0 = fork();
    if (p0 == 0) rank_main(0, store_addr, o);
    pid_t p1 = fork();
    if (p1 == 0) rank_main(1, relay_addr, o);
    waitpid(p0, NULL, 0);
    waitpid(p1, NULL, 0);
    kill(rel, SIGKILL);
    waitpid(rel, NULL, 0);
    for (int r = 0; r < 2; r++) {
        cr_expect_eq(o->wrong[r], 0, "rank %d accepted an altered value", r);
        cr_expect_neq(o->status[r], TERSE_OK, "rank %d's allgather succeeded through a relay "
                      "that altered a frame", r);
    }
    cr_expect(strstr(o->err[0], "rank 1"), "rank 0 does not name rank 1: %s", o->err[0]);
    munmap(o, sizeof *o);
}
