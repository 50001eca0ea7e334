/* Child programs: find terse-run, mpirun and terse-bench-mpi, run one to
 * completion while forwarding the signals that would otherwise leave it
 * orphaned, and make the temporary files their results come back in. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/bench.h"

static int is_executable(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

int bench_self_dir(char *out, size_t cap) {
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return -1;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (!slash) return -1;
    *slash = '\0';
    if ((size_t)snprintf(out, cap, "%s", self[0] ? self : "/") >= cap) return -1;
    return 0;
}

int bench_find_program(const char *env_var, const char *const *near_self, const char *name,
                       char *out, size_t cap) {
    /* 1. An explicit override wins, and must be right: silently falling
     *    back to another copy would measure the wrong program. */
    const char *env = env_var ? getenv(env_var) : NULL;
    if (env && env[0]) {
        if (!is_executable(env)) return -1;
        return (size_t)snprintf(out, cap, "%s", env) < cap ? 0 : -1;
    }
    /* 2. Beside this binary (the build tree, or an install's bin/), so a
     *    build measures its own tools rather than whatever PATH holds. */
    char dir[PATH_MAX];
    if (near_self && bench_self_dir(dir, sizeof dir) == 0) {
        for (size_t i = 0; near_self[i]; i++) {
            if ((size_t)snprintf(out, cap, "%s/%s", dir, near_self[i]) >= cap) continue;
            if (is_executable(out)) return 0;
        }
    }
    /* 3. PATH. */
    const char *path = getenv("PATH");
    if (!path || !path[0]) path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        const char *end = strchr(path, ':');
        size_t len = end ? (size_t)(end - path) : strlen(path);
        if (len > 0 && (size_t)snprintf(out, cap, "%.*s/%s", (int)len, path, name) < cap &&
            is_executable(out))
            return 0;
        path += len + (end ? 1 : 0);
    }
    return -1;
}

/* The child being waited for, so a signal aimed at us reaches it too: a
 * SIGTERM sent to the launcher alone would otherwise leave the ranks
 * running. Ctrl-C reaches both anyway (same process group); forwarding it
 * again is harmless. */
static volatile sig_atomic_t child_pid;
static volatile sig_atomic_t got_signal;

static void forward_signal(int sig) {
    got_signal = sig;
    if (child_pid > 0) kill((pid_t)child_pid, sig);
}

int bench_run_child(char *const argv[]) {
    struct sigaction sa, old_int, old_term, old_hup;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGHUP, &sa, &old_hup);
    fflush(NULL); /* or the child inherits our unwritten buffers */

    int status = -1;
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "terse-bench: cannot fork to run %s: %s\n", argv[0], strerror(errno));
        goto restore;
    }
    if (pid == 0) {
        sigaction(SIGINT, &old_int, NULL);
        sigaction(SIGTERM, &old_term, NULL);
        sigaction(SIGHUP, &old_hup, NULL);
        execv(argv[0], argv);
        fprintf(stderr, "terse-bench: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    child_pid = pid;
    if (got_signal) kill(pid, got_signal); /* arrived between fork and now */
    int ws;
    while (waitpid(pid, &ws, 0) < 0) {
        if (errno != EINTR) {
            fprintf(stderr, "terse-bench: waiting for %s: %s\n", argv[0], strerror(errno));
            goto restore;
        }
    }
    if (WIFEXITED(ws))
        status = WEXITSTATUS(ws);
    else if (WIFSIGNALED(ws))
        status = 128 + WTERMSIG(ws);
restore:
    child_pid = 0;
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGHUP, &old_hup, NULL);
    return status;
}

int bench_interrupted(void) {
    return got_signal;
}

int bench_temp_file(const char *tag, char *out, size_t cap) {
    const char *dir = getenv("TMPDIR");
    if (!dir || !dir[0]) dir = "/tmp";
    if ((size_t)snprintf(out, cap, "%s/terse-bench-%s-XXXXXX", dir, tag) >= cap) return -1;
    int fd = mkstemp(out);
    if (fd < 0) return -1;
    close(fd);
    return 0;
}

void bench_share_cores(int nworkers) {
    if (getenv("OPENBLAS_NUM_THREADS")) return;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long per = nworkers > 0 && cores > nworkers ? cores / nworkers : 1;
    char v[24];
    snprintf(v, sizeof v, "%ld", per);
    setenv("OPENBLAS_NUM_THREADS", v, 1);
}
