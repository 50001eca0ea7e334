/* terse-run: what one rank starts with -- a rendezvous address, a job token,
 * its environment, its own process group -- and the fork/exec that starts it. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "terse-run.h"

int terse__run_free_port(char *addr, size_t cap) {
    /* Bind port 0 on loopback so the kernel picks a free port, read it back,
     * and release it for rank 0's store. Another process could take it in
     * between; the store then fails to bind and says so. */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    close(fd);
    int w = snprintf(addr, cap, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
    if (w < 0 || (size_t)w >= cap) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return 0;
}

int terse__run_make_token(char hex[65]) {
    unsigned char raw[32];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        got += (size_t)n;
    }
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof raw; i++) {
        hex[2 * i] = digits[raw[i] >> 4];
        hex[2 * i + 1] = digits[raw[i] & 15];
    }
    hex[64] = '\0';
    memset(raw, 0, sizeof raw);
    return 0;
}

/* Report errno to the launcher through the close-on-exec pipe and die. */
static _Noreturn void child_fail(int err_fd) {
    int e = errno;
    ssize_t w = write(err_fd, &e, sizeof e);
    (void)w;
    _exit(127);
}

static void set_env_int(const char *name, int v, int err_fd) {
    char s[16];
    snprintf(s, sizeof s, "%d", v);
    if (setenv(name, s, 1) != 0) child_fail(err_fd);
}

/* In the child, between fork and exec. The launcher is single-threaded, so
 * setenv (which allocates) is safe here. */
static _Noreturn void child_exec(const terse__run_job *job, int rank, const int out[2],
                                 const int err[2], int err_fd) {
    /* Our own process group, so stopping a rank also stops what it started
     * (a shell's children, say); and die with the launcher, so a launcher
     * killed by SIGKILL leaves no ranks behind. */
    setpgid(0, 0);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != job->launcher) _exit(127);

    /* Undo the launcher's signal handling: ranks start as if run directly. */
    static const int sigs[] = TERSE_RUN_SIGNALS;
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        signal(sigs[i], job->ignored & (1u << sigs[i]) ? SIG_IGN : SIG_DFL);
    sigprocmask(SIG_SETMASK, &job->mask, NULL);
    setrlimit(RLIMIT_NOFILE, &job->nofile);

    if (job->prefix) {
        if (dup2(out[1], STDOUT_FILENO) < 0 || dup2(err[1], STDERR_FILENO) < 0)
            child_fail(err_fd);
    }
    /* Only rank 0 reads our stdin, and not from a terminal: a rank outside
     * the terminal's foreground group that reads it would be stopped. */
    if (rank != 0 || isatty(STDIN_FILENO)) {
        int null = open("/dev/null", O_RDONLY);
        if (null < 0 || dup2(null, STDIN_FILENO) < 0) child_fail(err_fd);
        if (null != STDIN_FILENO) close(null);
    }

    /* --hosts: ranks are dealt to hosts in blocks of per_host; the rank
     * runs in its host's network namespace and talks over its veth. */
    int local_rank = rank, local_size = job->nranks;
    if (job->nhosts > 0) {
        int h = rank / job->per_host;
        local_rank = rank % job->per_host;
        local_size = job->nranks - h * job->per_host;
        if (local_size > job->per_host) local_size = job->per_host;
        int fd = open(job->host_ns[h], O_RDONLY | O_CLOEXEC);
        if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) child_fail(err_fd);
        close(fd);
        set_env_int("TERSE_HOST", h, err_fd);
        if (setenv("TERSE_IFACE", job->host_if, 1) != 0 ||
            setenv("FI_TCP_IFACE", job->host_if, 1) != 0)
            child_fail(err_fd);
    }
    set_env_int("TERSE_RANK", rank, err_fd);
    set_env_int("TERSE_SIZE", job->nranks, err_fd);
    set_env_int("TERSE_LOCAL_RANK", local_rank, err_fd);
    set_env_int("TERSE_LOCAL_SIZE", local_size, err_fd);
    /* what torch.distributed's env:// rendezvous reads (torchrun sets them) */
    set_env_int("RANK", rank, err_fd);
    set_env_int("WORLD_SIZE", job->nranks, err_fd);
    set_env_int("LOCAL_RANK", local_rank, err_fd);
    set_env_int("LOCAL_WORLD_SIZE", local_size, err_fd);
    if (setenv("MASTER_ADDR", job->master_addr, 1) != 0 ||
        setenv("MASTER_PORT", job->master_port, 1) != 0)
        child_fail(err_fd);
    /* Debian's libfabric loads libpsm-infinipath, which would turn a rank's
     * crash or SIGTERM into exit(1) (transport/fabric.c): keep signals
     * signals. */
    if (setenv("IPATH_NO_BACKTRACE", "1", 0) != 0) child_fail(err_fd);
    if (setenv("TERSE_ADDR", job->addr, 1) != 0 || setenv("TERSE_TOKEN", job->token, 1) != 0 ||
        (job->provider && setenv("TERSE_PROVIDER", job->provider, 1) != 0) ||
        (job->timeout && setenv("TERSE_TIMEOUT_MS", job->timeout, 1) != 0) ||
        (rank == job->rejoining && setenv("TERSE_REJOIN", "1", 1) != 0))
        child_fail(err_fd);

    execvp(job->argv[0], job->argv);
    child_fail(err_fd);
}

pid_t terse__run_spawn(const terse__run_job *job, int rank, int out_fd[2], int *exec_errno) {
    int out[2] = {-1, -1}, err[2] = {-1, -1}, status_pipe[2] = {-1, -1};
    *exec_errno = 0;
    /* Every launcher-side fd is close-on-exec, so no rank holds another
     * rank's pipe open (which would keep us from ever seeing end of file). */
    if (job->prefix && (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)) goto fail;
    if (pipe2(status_pipe, O_CLOEXEC) != 0) goto fail;

    /* Block our handled signals across fork so the child cannot run the
     * launcher's handlers before it resets them. */
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    pid_t pid = fork();
    if (pid == 0) child_exec(job, rank, out, err, status_pipe[1]);
    int fork_errno = errno;
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        errno = fork_errno;
        goto fail;
    }
    setpgid(pid, pid); /* also from this side, so it holds before we signal the group */

    /* The status pipe closes on a successful exec; an int arrives if it failed. */
    close(status_pipe[1]);
    int child_errno = 0;
    ssize_t n;
    do n = read(status_pipe[0], &child_errno, sizeof child_errno);
    while (n < 0 && errno == EINTR);
    close(status_pipe[0]);
    if (job->prefix) {
        close(out[1]);
        close(err[1]);
    }
    if (n > 0) {
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
        }
        if (job->prefix) {
            close(out[0]);
            close(err[0]);
        }
        *exec_errno = child_errno ? child_errno : EIO;
        return -1;
    }
    if (job->prefix) {
        fcntl(out[0], F_SETFL, O_NONBLOCK);
        fcntl(err[0], F_SETFL, O_NONBLOCK);
        out_fd[0] = out[0];
        out_fd[1] = err[0];
    }
    return pid;

fail:;
    int e = errno;
    int fds[] = {out[0], out[1], err[0], err[1], status_pipe[0], status_pipe[1]};
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
        if (fds[i] >= 0) close(fds[i]);
    errno = e;
    return -1;
}
