/* The bootstrap store's file descriptors across fork().
 *
 * A rank that forks after joining (PyTorch's DataLoader workers, a
 * subprocess launched without exec) hands the child a copy of every store
 * socket. If the rank then dies, the child still holds the connection to
 * rank 0 open, the server never reads EOF, and the other ranks are never
 * told the rank was lost. So every store fd is created and closed through
 * this file, which keeps the set of live ones, and a pthread_atfork child
 * handler closes all of them in the child and bumps a generation counter
 * that makes every store object inherited by the child refuse to work.
 *
 * The set is guarded by a spinlock (a C11 atomic_flag) rather than a
 * mutex: the child handler runs in a process that must only make
 * async-signal-safe calls, and clearing an atomic_flag and close() are. The
 * prepare handler takes the lock and the parent/child handlers release it,
 * so the set is consistent at the instant of fork: no fd is ever open but
 * unregistered (creation and registration happen under the lock, as do
 * unregistration and close), so the child neither keeps a store socket nor
 * closes a number that belongs to something else. The lock is held only
 * for a system call and a table update. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/store_wire.h"

static atomic_flag reg_lock = ATOMIC_FLAG_INIT;
static unsigned char *owned; /* owned[fd] != 0: a live store fd */
static size_t owned_cap;     /* entries allocated */
static size_t owned_hi;      /* every owned fd is below this */
static atomic_uint fork_gen;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static int atfork_rc;
/* A descriptor kept spare (on /dev/null, in the set) for refusing a
 * connection at the descriptor limit: given up for the one accept that
 * closes the newcomer, taken again at once. Another thread may take the
 * freed number first; then the refusal fails and is tried again later. */
static int spare = -1;

static void reg_acquire(void) {
    while (atomic_flag_test_and_set_explicit(&reg_lock, memory_order_acquire)) sched_yield();
}

static void reg_release(void) { atomic_flag_clear_explicit(&reg_lock, memory_order_release); }

static void on_prepare(void) { reg_acquire(); }
static void on_parent(void) { reg_release(); }

/* In the child: only close(), plain stores and atomics. The server thread
 * does not exist here; its memory is never touched, only its fds (which are
 * in the set) are closed. */
static void on_child(void) {
    for (size_t fd = 0; fd < owned_hi; fd++) {
        if (!owned[fd]) continue;
        owned[fd] = 0;
        close((int)fd);
    }
    owned_hi = 0;
    spare = -1;
    atomic_fetch_add_explicit(&fork_gen, 1u, memory_order_relaxed);
    reg_release();
}

static void install_atfork(void) { atfork_rc = pthread_atfork(on_prepare, on_parent, on_child); }

unsigned terse__store_fork_gen(void) {
    return atomic_load_explicit(&fork_gen, memory_order_relaxed);
}

/* Under the lock: mark fd as owned. 0, or -1 with errno = ENOMEM. */
static int mark_locked(int fd) {
    size_t i = (size_t)fd;
    if (i >= owned_cap) {
        size_t cap = owned_cap ? owned_cap : 64;
        while (cap <= i) cap *= 2;
        unsigned char *p = realloc(owned, cap);
        if (!p) {
            errno = ENOMEM;
            return -1;
        }
        for (size_t k = owned_cap; k < cap; k++) p[k] = 0;
        owned = p;
        owned_cap = cap;
    }
    owned[i] = 1;
    if (i + 1 > owned_hi) owned_hi = i + 1;
    return 0;
}

/* The fork handlers must exist before the first store fd does. */
static int ensure_atfork(void) {
    pthread_once(&atfork_once, install_atfork);
    if (atfork_rc != 0) {
        errno = atfork_rc;
        return -1;
    }
    return 0;
}

/* Register a fd just created (lock held); on failure close it. */
static int adopt_locked(int fd) {
    if (fd < 0) return -1;
    if (mark_locked(fd) == 0) return fd;
    close(fd);
    errno = ENOMEM;
    return -1;
}

int terse__store_socket(int family, int type) {
    if (ensure_atfork() != 0) return -1;
    reg_acquire();
    int fd = adopt_locked(socket(family, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    int err = errno;
    reg_release();
    errno = err;
    return fd;
}

int terse__store_accept(int lfd) {
    if (ensure_atfork() != 0) return -1;
    reg_acquire();
    int fd = adopt_locked(accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC));
    int err = errno;
    reg_release();
    errno = err;
    return fd;
}

int terse__store_pipe(int fds[2]) {
    if (ensure_atfork() != 0) return -1;
    reg_acquire();
    int rc = pipe2(fds, O_CLOEXEC | O_NONBLOCK);
    if (rc == 0 && adopt_locked(fds[0]) < 0) {
        close(fds[1]);
        rc = -1;
    } else if (rc == 0 && adopt_locked(fds[1]) < 0) {
        owned[fds[0]] = 0;
        close(fds[0]);
        rc = -1;
    }
    int err = errno;
    reg_release();
    errno = err;
    return rc;
}

int terse__store_refuse(int lfd) {
    if (ensure_atfork() != 0) return -1;
    reg_acquire();
    if (spare < 0) spare = adopt_locked(open("/dev/null", O_RDONLY | O_CLOEXEC));
    int ok = -1;
    if (spare >= 0) {
        owned[spare] = 0;
        close(spare);
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            close(fd);
            ok = 0;
        }
        spare = adopt_locked(open("/dev/null", O_RDONLY | O_CLOEXEC));
    }
    int err = errno;
    reg_release();
    errno = err;
    return ok;
}

/* Keep the spare from the start, while descriptors are plentiful. */
void terse__store_keep_spare(void) {
    if (ensure_atfork() != 0) return;
    reg_acquire();
    if (spare < 0) spare = adopt_locked(open("/dev/null", O_RDONLY | O_CLOEXEC));
    reg_release();
}

void terse__store_fds_lock(void) { reg_acquire(); }
void terse__store_fds_unlock(void) { reg_release(); }

void terse__store_close_fd(int fd) {
    if (fd < 0) return;
    reg_acquire();
    if ((size_t)fd < owned_cap) owned[fd] = 0;
    close(fd);
    reg_release();
}
