/* Strangers' connections to a net endpoint (TERSE_PROVIDER=tcp, libfabric
 * 1.17's net): the descriptors the provider never lets go, closed here.
 *
 * net accepts every TCP connection to a rank's port and waits for its
 * connection request (prov/net/src/xnet_cm.c). When the socket becomes
 * readable, xnet_run_conn takes it off the provider's epoll set
 * (xnet_halt_sock) and reads the request with xnet_recv_cm_msg. A peer
 * that closed without a word makes recv return 0, and xnet_recv_cm_msg
 * then returns -ofi_sockerr(), which is errno -- not set by a recv that
 * returns 0, so whatever the last failed call left there, in a progress
 * loop nearly always EAGAIN from a nonblocking read. xnet_run_conn takes
 * -FI_EAGAIN for "not all here yet" and returns, without closing the
 * socket or freeing its handle, and without putting the socket back in
 * the epoll set: nothing refers to it any more, and it stays open for the
 * life of the process (the same for a stranger that sent a part of a
 * request). 1,000 such connections cost a rank 1,000 descriptors; at the
 * descriptor limit it accepts nothing more. Nothing in libfabric's API
 * reaches the connections an RDM endpoint accepts (its passive endpoint
 * and event queue are internal), so terse finds them itself:
 *
 *  - At most every SCAN_NS (SCAN_HOT_NS while strangers are about), after
 *    a progress round, look at this process's descriptors: a socket whose
 *    local address is this endpoint's listening address and that is not
 *    listening is one net accepted.
 *  - One that has sent a byte is an endpoint net opened for a peer
 *    (accepting answers the request, so every accepted endpoint has sent
 *    at least the response): never touched.
 *  - One that has sent nothing is a connection whose request net has not
 *    handled. It has either received nothing and is still open on both
 *    sides (silent: net's epoll set holds it, and net reads it the moment
 *    it speaks or closes), or its bytes were read or its stream ended and
 *    it is still here after REAP_PASSES progress rounds and ORPHAN_NS,
 *    which net would have closed or answered by then: orphaned. Orphans
 *    are closed. (net's handle, about 48 bytes of heap, stays lost.)
 *  - A silent connection gets HANDSHAKE_NS to speak; past that, beyond the
 *    MAX_SILENT newest, or when the process is near its descriptor limit,
 *    it is shut down (shutdown(2), not closed: net reads the end of the
 *    stream and closes it itself, or orphans it and the next scans close
 *    it).
 *  - Near the descriptor limit, say so once on stderr; once more when
 *    descriptors are free again.
 *
 * errno is cleared before every fi_cq_read on net (fabric_msg.c), so that
 * a peer's close that is the first event of a progress round is read as
 * the end of the stream and net frees it itself. */
#include <dirent.h>
#include <errno.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "transport/fabric_impl.h"
#include "transport/store_wire.h"

#define SCAN_NS 500000000u        /* a scan every 0.5 s */
#define SCAN_HOT_NS 100000000u    /* every 0.1 s while strangers are about */
#define HOT_NS 10000000000ull     /* "about": one seen in the last 10 s */
#define ORPHAN_NS 250000000u      /* an orphan is closed after 0.25 s ... */
#define REAP_PASSES 3             /* ... and 3 progress rounds */
#define HANDSHAKE_NS 3000000000ull /* a silent connection's time to speak */
#define MAX_SILENT 64             /* silent connections kept at once */
#define NEAR_LIMIT 32             /* "near the descriptor limit": this many left */

typedef struct reap_seen {
    ino_t ino;
    int fd, orphan;
    uint64_t since_ns, since_pass; /* first seen in this state */
} reap_seen;

struct terse__fabric_reap {
    struct sockaddr_storage listen;
    socklen_t listen_len;
    DIR *dir;
    pid_t pid; /* the process dir lists (after a fork, the child reopens) */
    reap_seen *seen, *next;
    size_t nseen, cap;
    uint64_t passes, next_scan_ns, hot_until_ns;
    int at_limit;
    uint64_t closed, shut; /* orphans closed, silent connections shut */
};

static int same_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
    if (a->ss_family != b->ss_family) return 0;
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
        return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
        return x->sin6_port == y->sin6_port &&
               memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr) == 0;
    }
    return 0;
}

void terse__fabric_reap_init(terse__fabric *f) {
    if (strcmp(f->provider, "net") != 0) return;
    struct terse__fabric_reap *r = calloc(1, sizeof *r);
    if (!r) return; /* without it, strangers cost what net makes them cost */
    size_t len = sizeof r->listen;
    if (fi_getname(&f->ep->fid, &r->listen, &len) != 0 || len > sizeof r->listen ||
        (r->listen.ss_family != AF_INET && r->listen.ss_family != AF_INET6)) {
        free(r);
        return;
    }
    r->listen_len = (socklen_t)len;
    r->dir = opendir("/proc/self/fd"); /* now, before strangers can use the last one */
    r->pid = getpid();
    f->reap = r;
}

void terse__fabric_reap_free(terse__fabric *f) {
    struct terse__fabric_reap *r = f ? f->reap : NULL;
    if (!r) return;
    if (r->dir) closedir(r->dir);
    free(r->seen);
    free(r->next);
    free(r);
    f->reap = NULL;
}

uint64_t terse__fabric_reaped(const terse__fabric *f) {
    return f && f->reap ? f->reap->closed + f->reap->shut : 0;
}

/* What a socket net accepted is: 0 an endpoint (or not ours), 1 silent,
 * 2 a possible orphan. */
static int classify(const struct terse__fabric_reap *r, int fd) {
    struct sockaddr_storage a;
    socklen_t alen = sizeof a;
    memset(&a, 0, sizeof a);
    if (getsockname(fd, (struct sockaddr *)&a, &alen) != 0 || !same_addr(&a, &r->listen))
        return 0;
    int listening = 0;
    socklen_t ol = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ol) != 0 || listening) return 0;
    struct tcp_info ti;
    memset(&ti, 0, sizeof ti);
    socklen_t tl = sizeof ti;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) != 0 ||
        tl < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received)
        return 0; /* a kernel before 4.1 cannot tell: leave everything */
    if (ti.tcpi_bytes_acked || ti.tcpi_unacked || ti.tcpi_notsent_bytes ||
        (tl >= offsetof(struct tcp_info, tcpi_bytes_sent) + 8 && ti.tcpi_bytes_sent))
        return 0; /* it has answered a request: an endpoint */
    int inq = 0;
    if (ioctl(fd, SIOCINQ, &inq) != 0) return 0;
    if (inq > 0) return 0; /* unread bytes: net reads them in its next round */
    if (ti.tcpi_bytes_received == 0 && ti.tcpi_state == 1 /* TCP_ESTABLISHED */) return 1;
    return 2;
}

static reap_seen *find_seen(struct terse__fabric_reap *r, ino_t ino) {
    for (size_t i = 0; i < r->nseen; i++)
        if (r->seen[i].ino == ino) return &r->seen[i];
    return NULL;
}

static void note_limit(terse__fabric *f, size_t nfds) {
    struct terse__fabric_reap *r = f->reap;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return;
    const size_t lim = (size_t)rl.rlim_cur;
    if (!r->at_limit && nfds + NEAR_LIMIT >= lim) {
        r->at_limit = 1;
        fprintf(stderr,
                "terse: rank %d is near its file-descriptor limit (%zu of %zu open, ulimit -n): "
                "connections to its port %s wait in the kernel until descriptors are free; "
                "silent ones are shut down (SECURITY.md)\n",
                f->rank, nfds, lim, f->provider);
    } else if (r->at_limit && nfds + 2 * NEAR_LIMIT < lim) {
        r->at_limit = 0;
        fprintf(stderr, "terse: rank %d has descriptors free again (%zu of %zu open)\n", f->rank,
                nfds, lim);
    }
}

static int newest_first(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Shut down the silent connections past their time, beyond the newest
 * MAX_SILENT, or (near the limit) all of them. */
static void shut_silent(struct terse__fabric_reap *r, reap_seen *s, size_t n, uint64_t now) {
    const size_t keep = r->at_limit ? 0 : MAX_SILENT;
    uint64_t *when = malloc((n ? n : 1) * sizeof *when);
    size_t live = 0;
    for (size_t i = 0; when && i < n; i++)
        if (!s[i].orphan) when[live++] = s[i].since_ns;
    uint64_t oldest_kept = 0; /* silent ones that came before this are shut */
    if (when && live > keep) {
        qsort(when, live, sizeof *when, newest_first);
        oldest_kept = keep ? when[keep - 1] : UINT64_MAX;
    }
    free(when);
    for (size_t i = 0; i < n; i++) {
        if (s[i].orphan) continue;
        if (now - s[i].since_ns >= HANDSHAKE_NS || s[i].since_ns < oldest_kept) {
            (void)shutdown(s[i].fd, SHUT_RDWR);
            r->shut++;
        }
    }
}

static int grow(struct terse__fabric_reap *r, size_t n) {
    if (n < r->cap) return 1;
    size_t cap = r->cap ? 2 * r->cap : 64;
    reap_seen *a = realloc(r->seen, cap * sizeof *a), *b;
    if (!a) return 0;
    r->seen = a;
    if (!(b = realloc(r->next, cap * sizeof *b))) return 0;
    r->next = b;
    r->cap = cap;
    return 1;
}

/* One look at the process's descriptors. */
static void scan(terse__fabric *f, uint64_t now) {
    struct terse__fabric_reap *r = f->reap;
    if (r->dir && r->pid != getpid()) closedir(r->dir), r->dir = NULL;
    if (!r->dir) { /* kept open: at the descriptor limit a scan must still run */
        r->dir = opendir("/proc/self/fd");
        r->pid = getpid();
        if (!r->dir) return;
    }
    rewinddir(r->dir);
    size_t nfds = 0, n = 0;
    struct dirent *e;
    terse__store_fds_lock(); /* the store's thread opens and closes none meanwhile */
    while ((e = readdir(r->dir)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        nfds++;
        int fd = atoi(e->d_name);
        /* Is it a socket, and which (its inode)? From the descriptor's
         * link, not fstat(fd): most descriptors here are not this
         * endpoint's -- the application's, a colocated twin endpoint's
         * that its own thread opens and closes meanwhile. Of those a scan
         * reads the link and, for sockets, the local address (classify),
         * and leaves them alone; the ones it closes are this endpoint's
         * own, which only this thread's progress opens. (ThreadSanitizer
         * counted an fstat of another thread's new descriptor as a race:
         * benign, for that reason.) */
        char link[64];
        unsigned long long ino;
        ssize_t ln = readlinkat(dirfd(r->dir), e->d_name, link, sizeof link - 1);
        if (fd == dirfd(r->dir) || ln <= 0) continue;
        link[ln] = 0;
        if (sscanf(link, "socket:[%llu]", &ino) != 1) continue;
        int kind = classify(r, fd);
        if (!kind || !grow(r, n + 1)) continue;
        reap_seen *old = find_seen(r, (ino_t)ino), *s = &r->next[n];
        *s = (reap_seen){(ino_t)ino, fd, kind == 2, now, r->passes};
        if (old && old->orphan == s->orphan) {
            s->since_ns = old->since_ns;
            s->since_pass = old->since_pass;
        }
        if (s->orphan && now - s->since_ns >= ORPHAN_NS &&
            r->passes - s->since_pass >= REAP_PASSES) {
            close(fd); /* nothing in net refers to it any more */
            r->closed++;
            nfds--;
            continue;
        }
        n++;
    }
    terse__store_fds_unlock();
    note_limit(f, nfds);
    shut_silent(r, r->next, n, now);
    reap_seen *t = r->seen;
    r->seen = r->next;
    r->next = t;
    r->nseen = n;
    if (n) r->hot_until_ns = now + HOT_NS;
}

void terse__fabric_reap(terse__fabric *f) {
    struct terse__fabric_reap *r = f->reap;
    if (!r) return;
    r->passes++;
    uint64_t now = terse__now_ns();
    if (now < r->next_scan_ns) return;
    int err = errno;
    scan(f, now);
    errno = err;
    r->next_scan_ns = now + (now < r->hot_until_ns || r->at_limit ? SCAN_HOT_NS : SCAN_NS);
}
