/* Sockets for the bootstrap store: address parsing, name resolution and
 * connect with a deadline, listen, peer names. Everything is non-blocking
 * and close-on-exec (a rank that spawns a program must not leak the
 * store's sockets into it), and every socket is made through store_fork.c
 * (a rank that forks must not leak them into the child either). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "transport/store_wire.h"

uint64_t terse__store_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

terse_status terse__store_split_addr(const char *addr, const char *what, char *host,
                                     size_t host_cap, unsigned *port) {
    if (!addr || !*addr)
        return TERSE_ERROR(TERSE_ERR_INVALID, "%s is empty; expected host:port", what);
    /* "[v6]:port" keeps IPv6 literals unambiguous; otherwise the port is
     * after the last colon. */
    const char *h = addr, *he, *p;
    if (addr[0] == '[') {
        h = addr + 1;
        he = strchr(h, ']');
        if (!he || he[1] != ':')
            return TERSE_ERROR(TERSE_ERR_INVALID, "%s='%s' is not [host]:port", what, addr);
        p = he + 2;
    } else {
        he = strrchr(addr, ':');
        if (!he) return TERSE_ERROR(TERSE_ERR_INVALID, "%s='%s' has no :port", what, addr);
        p = he + 1;
    }
    size_t hl = (size_t)(he - h);
    if (hl == 0) return TERSE_ERROR(TERSE_ERR_INVALID, "%s='%s' has an empty host", what, addr);
    if (hl >= host_cap)
        return TERSE_ERROR(TERSE_ERR_INVALID, "%s='%s' has a host name longer than %zu bytes",
                           what, addr, host_cap - 1);
    /* Strict port: 1 to 5 decimal digits, 1..65535, nothing after. */
    unsigned v = 0;
    size_t nd = 0;
    for (; p[nd] >= '0' && p[nd] <= '9' && nd < 6; nd++) v = v * 10u + (unsigned)(p[nd] - '0');
    if (nd == 0 || nd > 5 || p[nd] != '\0' || v > 65535)
        return TERSE_ERROR(TERSE_ERR_INVALID, "%s='%s' has no valid port (expected 1..65535)",
                           what, addr);
    if (v == 0)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "%s='%s' has port 0; the store needs a fixed port the other ranks know",
                           what, addr);
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = v;
    return TERSE_OK;
}

/* ---- name resolution with a deadline ----
 *
 * getaddrinfo has no timeout, and a name service that does not answer can
 * hold it for minutes. A name is therefore looked up on a detached helper
 * thread while the caller waits on a condition variable until its
 * deadline. The job is shared by reference count (caller and helper); the
 * one that drops the last reference frees it, together with the result if
 * the caller gave up and never took it. Numeric addresses skip all this. */

terse__store_gai_fn terse__store_gai_hook;
static atomic_int gai_live;

typedef struct gai_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs, done, rc, err;
    terse__store_gai_fn fn;
    struct addrinfo hints, *res;
    char host[256], port[8];
} gai_job;

int terse__store_resolves_in_flight(void) { return atomic_load(&gai_live); }

static void gai_free(gai_job *j) {
    if (j->res) freeaddrinfo(j->res);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
    atomic_fetch_sub(&gai_live, 1);
}

/* Drop one reference; called with j->mu held, which it releases. */
static void gai_unref(gai_job *j) {
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (last) gai_free(j);
}

static void *gai_thread(void *arg) {
    gai_job *j = arg;
    struct addrinfo *res = NULL;
    int rc = j->fn(j->host, j->port, &j->hints, &res);
    int err = errno;
    pthread_mutex_lock(&j->mu);
    j->rc = rc;
    j->err = err;
    j->res = rc == 0 ? res : NULL;
    j->done = 1;
    pthread_cond_signal(&j->cv);
    gai_unref(j);
    return NULL;
}

/* A job for host:port with its helper thread running (two references). */
static terse_status gai_start(const char *host, const char *port, const struct addrinfo *hints,
                              gai_job **out) {
    gai_job *j = calloc(1, sizeof *j);
    if (!j) return TERSE_ERROR(TERSE_ERR_NOMEM, "cannot allocate a lookup of '%s'", host);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&j->mu, NULL);
    j->refs = 2;
    j->fn = terse__store_gai_hook ? terse__store_gai_hook : getaddrinfo;
    j->hints = *hints;
    snprintf(j->host, sizeof j->host, "%s", host);
    snprintf(j->port, sizeof j->port, "%s", port);
    atomic_fetch_add(&gai_live, 1);
    /* The helper takes no signals (they belong to the application) and is
     * never joined. */
    pthread_attr_t ta;
    pthread_attr_init(&ta);
    pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    pthread_t t;
    int rc = pthread_create(&t, &ta, gai_thread, j);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&ta);
    if (rc != 0) {
        gai_free(j);
        return TERSE_ERROR(TERSE_ERR_INTERNAL, "cannot start a thread to look up '%s': %s", host,
                           strerror(rc));
    }
    *out = j;
    return TERSE_OK;
}

/* Wait for the lookup until deadline_ms; give up our reference either way.
 * 1 and (*rc, *res) if it finished, 0 if it is still running. */
static int gai_wait(gai_job *j, uint64_t deadline_ms, int *rc, int *err, struct addrinfo **res) {
    struct timespec until = {(time_t)(deadline_ms / 1000), (long)(deadline_ms % 1000) * 1000000L};
    pthread_mutex_lock(&j->mu);
    while (!j->done && terse__store_now_ms() < deadline_ms)
        (void)pthread_cond_timedwait(&j->cv, &j->mu, &until);
    int done = j->done;
    if (done) {
        *rc = j->rc;
        *err = j->err;
        *res = j->res;
        j->res = NULL;
    }
    gai_unref(j);
    return done;
}

terse_status terse__store_resolve(const char *addr, int passive, uint64_t deadline_ms,
                                  struct addrinfo **out) {
    char host[256], port[8];
    unsigned p = 0;
    TERSE_CHECK(terse__store_split_addr(addr, "the store address", host, sizeof host, &p));
    snprintf(port, sizeof port, "%u", p);
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | AI_NUMERICHOST | (passive ? AI_PASSIVE : 0);
    /* A numeric address never consults the name service: no thread. */
    int rc = getaddrinfo(host, port, &hints, out), err = errno;
    if (rc == EAI_NONAME) {
        hints.ai_flags &= ~AI_NUMERICHOST;
        uint64_t t0 = terse__store_now_ms();
        gai_job *j = NULL;
        TERSE_CHECK(gai_start(host, port, &hints, &j));
        if (!gai_wait(j, deadline_ms, &rc, &err, out))
            return TERSE_ERROR(TERSE_ERR_TIMEOUT,
                               "cannot resolve the store host '%s' (address %s): the name "
                               "lookup gave no answer in %llu ms",
                               host, addr, (unsigned long long)(terse__store_now_ms() - t0));
    }
    if (rc != 0)
        return TERSE_ERROR(TERSE_ERR_INVALID, "cannot resolve the store address %s: %s", addr,
                           rc == EAI_SYSTEM ? strerror(err) : gai_strerror(rc));
    return TERSE_OK;
}

static void set_nodelay(int fd) {
    /* Store traffic is small request/reply; Nagle would add 40 ms stalls. */
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

terse_status terse__store_listen(const char *addr, uint64_t deadline_ms, int *fd_out) {
    struct addrinfo *ai = NULL;
    TERSE_CHECK(terse__store_resolve(addr, 1, deadline_ms, &ai));
    int err = 0;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        int fd = terse__store_socket(a->ai_family, a->ai_socktype);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        /* Bind to exactly the address given (never a wildcard we chose). */
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
            freeaddrinfo(ai);
            *fd_out = fd;
            return TERSE_OK;
        }
        err = errno;
        terse__store_close_fd(fd);
    }
    freeaddrinfo(ai);
    return TERSE_ERROR(TERSE_ERR_IO, "rank 0 cannot listen on the store address %s: %s", addr,
                       strerror(err));
}

static int connect_one(const struct addrinfo *a, uint64_t deadline, int *fd_out, int *err) {
    int fd = terse__store_socket(a->ai_family, a->ai_socktype);
    if (fd < 0) {
        *err = errno;
        return 0;
    }
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) {
            *err = errno;
            terse__store_close_fd(fd);
            return 0;
        }
        int r = terse__store_wait_fd(fd, POLLOUT, deadline);
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (r <= 0) {
            *err = r == 0 ? ETIMEDOUT : errno;
            terse__store_close_fd(fd);
            return 0;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr != 0) {
            *err = soerr ? soerr : errno;
            terse__store_close_fd(fd);
            return 0;
        }
    }
    set_nodelay(fd);
    *fd_out = fd;
    return 1;
}

terse_status terse__store_connect(const char *addr, uint64_t deadline_ms, int *fd, int *connected,
                                  char *why, size_t why_cap) {
    struct addrinfo *ai = NULL;
    *connected = 0;
    TERSE_CHECK(terse__store_resolve(addr, 0, deadline_ms, &ai));
    int err = ECONNREFUSED;
    for (struct addrinfo *a = ai; a && !*connected; a = a->ai_next)
        *connected = connect_one(a, deadline_ms, fd, &err);
    freeaddrinfo(ai);
    if (!*connected) snprintf(why, why_cap, "%s", strerror(err));
    return TERSE_OK;
}

void terse__store_peer_name(int fd, char *buf, size_t cap) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char host[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            const struct sockaddr_in *s4 = (const struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &s4->sin_addr, host, sizeof host);
            port = ntohs(s4->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof host);
            port = ntohs(s6->sin6_port);
        }
        snprintf(buf, cap, "%s:%u", host, port);
    } else {
        snprintf(buf, cap, "unknown peer");
    }
}

int terse__store_wait_fd(int fd, short events, uint64_t deadline_ms) {
    for (;;) {
        uint64_t now = terse__store_now_ms();
        int ms = now >= deadline_ms ? 0
                 : deadline_ms - now > 1000000 ? 1000000
                                                : (int)(deadline_ms - now);
        struct pollfd p = {.fd = fd, .events = events, .revents = 0};
        int r = poll(&p, 1, ms);
        if (r > 0) return 1;
        if (r == 0) {
            if (terse__store_now_ms() >= deadline_ms) return 0;
            continue;
        }
        if (errno != EINTR) return -1;
    }
}
