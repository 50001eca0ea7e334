/* terse-run --hosts: "hosts" made of network namespaces on this machine.
 *
 *   hub namespace trh<pid>-hub: bridge br0, one port hv<h> per host
 *   host namespace trh<pid>-<h>: loopback up, veth terse0 = 10.78.0.(h+1)/24,
 *                                its peer hv<h> in the hub
 *   --link RATE: tbf on terse0 (the host's upload) and on hv<h> (its download)
 *
 * The 10.78.0.0/24 addresses exist only inside these namespaces (the repo's
 * scripts use 10.77, 10.250 and 10.251); nothing is routed anywhere else.
 * The commands are iproute2's ip and tc, run by fork/exec and checked one by
 * one; removing the namespaces removes the veths, the bridge and the qdiscs
 * with them. A terse-run killed with SIGKILL cannot remove its namespaces; the
 * next terse-run --hosts removes those whose launcher is gone: its flock on
 * /run/terse-run/<pid> is free (or, without that file, its pid runs no
 * terse-run) and no process is inside any of them. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "terse-run.h"

#define NETNS_DIR "/run/netns/"
/* While its namespaces exist a launcher holds an flock on LOCK_DIR<pid>:
 * the sweep's proof that it is alive, across PID namespaces and renames. */
#define LOCK_DIR "/run/terse-run/"
#define HOST_IF "terse0"
/* how long the links get to report carrier */
#define CARRIER_MS 5000

static char ns_name[TERSE_RUN_MAX_HOSTS + 1][32]; /* [nhosts] is the hub */
static int ns_made[TERSE_RUN_MAX_HOSTS + 1];
static int lock_fd = -1; /* our LOCK_DIR<pid>, held while our namespaces exist */

unsigned long long terse__run_parse_rate(const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v > 0) || s[0] == '-' || s[0] == '+') return 0;
    static const struct {
        const char *unit;
        double bits;
    } units[] = {{"bit", 1},           {"kbit", 1e3},       {"mbit", 1e6}, {"gbit", 1e9},
                 {"tbit", 1e12},       {"bps", 8},          {"kbps", 8e3}, {"mbps", 8e6},
                 {"gbps", 8e9},        {"tbps", 8e12}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(end, units[i].unit) == 0) {
            double b = v * units[i].bits;
            return b >= 8000 && b < 1e15 ? (unsigned long long)b : 0;
        }
    return 0;
}

static const char *find_tool(const char *name) {
    static char path[4][32];
    static const char *const dirs[] = {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"};
    int slot = name[0] == 't';
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        snprintf(path[slot], sizeof path[slot], "%s%s", dirs[i], name);
        if (access(path[slot], X_OK) == 0) return path[slot];
    }
    return NULL;
}

/* Run argv (argv[0] a full path) with stdin from /dev/null, in its own
 * process group (a Ctrl-C at the terminal is ours to handle, not ip's).
 * quiet: its stderr goes to /dev/null. Returns 0 when it exits 0; else
 * says which command failed (unless quiet) and returns -1. */
static int run_cmd(const char *const argv[], int quiet) {
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        static const int sigs[] = TERSE_RUN_SIGNALS;
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], SIG_DFL);
        sigprocmask(SIG_SETMASK, &old, NULL);
        int null = open("/dev/null", O_RDWR);
        if (null >= 0) {
            dup2(null, STDIN_FILENO);
            if (quiet) dup2(null, STDERR_FILENO);
        }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int fork_errno = errno;
    sigprocmask(SIG_SETMASK, &old, NULL);
    int st = 0;
    if (pid > 0)
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
        }
    if (pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
    if (!quiet) {
        fprintf(stderr, "terse-run: --hosts: this command failed");
        if (pid < 0)
            fprintf(stderr, " (cannot fork: %s)", strerror(fork_errno));
        else if (WIFEXITED(st))
            fprintf(stderr, " (exit status %d)", WEXITSTATUS(st));
        else if (WIFSIGNALED(st))
            fprintf(stderr, " (killed by signal %d)", WTERMSIG(st));
        fprintf(stderr, ":");
        for (size_t i = 0; argv[i]; i++) fprintf(stderr, " %s", argv[i]);
        fprintf(stderr, "\n");
    }
    return -1;
}

/* Run fn(h, arg) inside host h's network namespace (the launcher is
 * single-threaded, so it may step in and back out). Returns fn's value, or
 * -1 when the namespace cannot be entered. */
static int in_host(const terse__run_job *job, int h, int (*fn)(int, void *), void *arg) {
    int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    int there = open(job->host_ns[h], O_RDONLY | O_CLOEXEC);
    int rc = -1;
    if (self >= 0 && there >= 0 && setns(there, CLONE_NEWNET) == 0) {
        rc = fn(h, arg);
        if (setns(self, CLONE_NEWNET) != 0) {
            perror("terse-run: cannot return to the launcher's network namespace");
            abort();
        }
    }
    if (self >= 0) close(self);
    if (there >= 0) close(there);
    return rc;
}

static int link_running(int h, void *arg) {
    (void)h;
    (void)arg;
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return 0;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", HOST_IF);
    int ok = ioctl(s, SIOCGIFFLAGS, &ifr) == 0 && (ifr.ifr_flags & IFF_UP) &&
             (ifr.ifr_flags & IFF_RUNNING);
    close(s);
    return ok;
}

/* /proc/self/net/dev of the namespace we are in: terse0's rx and tx bytes. */
static int link_bytes(int h, void *arg) {
    (void)h;
    unsigned long long *rxtx = arg;
    FILE *f = fopen("/proc/self/net/dev", "r");
    if (!f) return -1;
    char line[512];
    int found = -1;
    while (found < 0 && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        *colon = '\0';
        char *name = line + strspn(line, " ");
        unsigned long long v[9];
        if (strcmp(name, HOST_IF) == 0 &&
            sscanf(colon + 1, "%llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                   &v[3], &v[4], &v[5], &v[6], &v[7], &v[8]) == 9) {
            rxtx[0] = v[0];
            rxtx[1] = v[8];
            found = 0;
        }
    }
    fclose(f);
    return found;
}

static long long mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int make_ns(int i) {
    const char *ip = find_tool("ip");
    const char *add[] = {ip, "netns", "add", ns_name[i], NULL};
    if (run_cmd(add, 0) != 0) return -1;
    ns_made[i] = 1;
    const char *lo[] = {ip, "-n", ns_name[i], "link", "set", "lo", "up", NULL};
    return run_cmd(lo, 0);
}

static int shape(const char *ns, const char *dev, const char *rate, const char *burst) {
    const char *tbf[] = {find_tool("tc"), "-n", ns,    "qdisc", "add",   "dev",   dev, "root",
                         "tbf",           "rate", rate, "burst", burst, "latency", "50ms", NULL};
    return run_cmd(tbf, 0);
}

/* Take our lock (LOCK_DIR<pid>, flock) before making namespaces; best
 * effort: without it, the sweeps of other launchers fall back on names. */
static void take_lock(long self) {
    char path[64];
    (void)mkdir(LOCK_DIR, 0700);
    snprintf(path, sizeof path, LOCK_DIR "%ld", self);
    lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (lock_fd >= 0 && flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
        close(lock_fd);
        lock_fd = -1;
    }
}

static void drop_lock(long self) {
    if (lock_fd < 0) return;
    char path[64];
    snprintf(path, sizeof path, LOCK_DIR "%ld", self);
    unlink(path);
    close(lock_fd);
    lock_fd = -1;
}

/* Is launcher pid alive? 1 yes, 0 no (its lock is free: gone, whatever
 * its PID namespace or name), -1 cannot tell (no lock file: a launcher of
 * an older build, or one that could not make it). */
static int lock_says(long pid) {
    char path[64];
    snprintf(path, sizeof path, LOCK_DIR "%ld", pid);
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return -1;
    int alive = flock(fd, LOCK_EX | LOCK_NB) != 0;
    if (!alive) unlink(path); /* its launcher is gone: the lock goes with its namespaces */
    close(fd);
    return alive;
}

/* Without a lock file: is pid a running terse-run? A pid that no longer
 * exists, or that now runs another program (its name and its executable
 * both other than terse-run), is not. */
static int launcher_alive(long pid) {
    int lock = lock_says(pid);
    if (lock >= 0) return lock;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 0;
    char path[64], buf[4096] = "";
    snprintf(path, sizeof path, "/proc/%ld/comm", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 1; /* cannot tell: leave it */
    int got = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    buf[strcspn(buf, "\n")] = 0;
    if (!got || strcmp(buf, "terse-run") == 0) return 1;
    snprintf(path, sizeof path, "/proc/%ld/exe", pid);
    ssize_t n = readlink(path, buf, sizeof buf - 1);
    if (n <= 0) return 0;
    buf[n] = 0;
    const char *base = strrchr(buf, '/');
    return strcmp(base ? base + 1 : buf, "terse-run") == 0;
}

/* Is any process inside the network namespace named `name`? (A launcher
 * in another PID namespace looks gone; its ranks inside are not.) */
static int ns_in_use(const char *name) {
    char path[sizeof NETNS_DIR + 256];
    struct stat ns;
    snprintf(path, sizeof path, NETNS_DIR "%.63s", name);
    if (stat(path, &ns) != 0) return 0;
    DIR *d = opendir("/proc");
    if (!d) return 1;
    int used = 0;
    struct dirent *e;
    while (!used && (e = readdir(d))) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        struct stat st;
        snprintf(path, sizeof path, "/proc/%.32s/ns/net", e->d_name);
        used = stat(path, &st) == 0 && st.st_ino == ns.st_ino && st.st_dev == ns.st_dev;
    }
    closedir(d);
    return used;
}

/* The launcher pid of a namespace terse-run names trh<pid>-<h> or
 * trh<pid>-hub (exactly: the name rebuilt from the pid must match), else 0. */
static long launcher_of(const char *name) {
    long pid = 0;
    int used = 0;
    if (sscanf(name, "trh%ld-%n", &pid, &used) != 1 || used == 0 || pid <= 0) return 0;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "trh%ld-", pid);
    const char *rest = name + used;
    if (strncmp(name, prefix, strlen(prefix)) != 0 || (size_t)used != strlen(prefix)) return 0;
    if (strcmp(rest, "hub") == 0) return pid;
    if (!rest[0] || strlen(rest) > 3 || strspn(rest, "0123456789") != strlen(rest) ||
        (rest[0] == '0' && rest[1]))
        return 0;
    return pid;
}

/* Namespaces an earlier terse-run left behind when it was killed with
 * SIGKILL (which it cannot catch): trh<pid>-<h> and trh<pid>-hub whose
 * launcher is gone and none of which holds a process. Removed, each with a
 * line; those of a terse-run that still runs are left alone. */
static void sweep_stale(long self) {
    DIR *d = opendir(NETNS_DIR);
    if (!d) return;
    const char *ip = find_tool("ip");
    struct stale { char name[64]; long pid; } *v = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) { /* every name first: deleting changes the directory */
        long pid = launcher_of(e->d_name);
        if (!pid || pid == self || strlen(e->d_name) >= sizeof v->name) continue;
        if (n == cap) {
            struct stale *w = realloc(v, (cap = cap ? 2 * cap : 64) * sizeof *v);
            if (!w) { /* a launcher's names cut in two could be judged wrongly: stop */
                free(v);
                closedir(d);
                return;
            }
            v = w;
        }
        snprintf(v[n].name, sizeof v[n].name, "%s", e->d_name);
        v[n++].pid = pid;
    }
    closedir(d);
    for (size_t i = 0; i < n; i++) {
        const long pid = v[i].pid;
        int first = 1, keep;
        for (size_t j = 0; j < i; j++) first &= v[j].pid != pid;
        if (!first) continue; /* this launcher was judged at its first namespace */
        keep = launcher_alive(pid);
        for (size_t j = i; j < n && !keep; j++) /* one namespace in use keeps them all */
            if (v[j].pid == pid) keep = ns_in_use(v[j].name);
        for (size_t j = i; j < n && !keep; j++) {
            if (v[j].pid != pid) continue;
            const char *del[] = {ip, "netns", "del", v[j].name, NULL};
            if (run_cmd(del, 1) == 0)
                fprintf(stderr, "terse-run: removed network namespace %s, left behind by "
                                "terse-run %ld, which is gone\n", v[j].name, pid);
        }
    }
    free(v);
}

int terse__run_hosts_up(terse__run_job *job, int (*interrupted)(void)) {
    const int H = job->nhosts;
    const char *ip = find_tool("ip");
    if (!ip) {
        fprintf(stderr, "terse-run: --hosts needs iproute2's 'ip', found in none of /usr/sbin, "
                        "/sbin, /usr/bin, /bin (apt-get install iproute2)\n");
        return -1;
    }
    if (job->link && !find_tool("tc")) {
        fprintf(stderr, "terse-run: --link needs iproute2's 'tc', found in none of /usr/sbin, "
                        "/sbin, /usr/bin, /bin (apt-get install iproute2)\n");
        return -1;
    }
    job->host_ns = calloc((size_t)H, sizeof *job->host_ns);
    if (!job->host_ns) {
        fprintf(stderr, "terse-run: out of memory for %d hosts\n", H);
        return -1;
    }
    sweep_stale((long)job->launcher);
    take_lock((long)job->launcher);
    snprintf(job->host_if, sizeof job->host_if, "%s", HOST_IF);
    for (int i = 0; i <= H; i++) {
        if (i < H)
            snprintf(ns_name[i], sizeof ns_name[i], "trh%ld-%d", (long)job->launcher, i);
        else
            snprintf(ns_name[i], sizeof ns_name[i], "trh%ld-hub", (long)job->launcher);
        if (i < H) snprintf(job->host_ns[i], sizeof job->host_ns[i], NETNS_DIR "%.31s", ns_name[i]);
    }
    /* tbf's burst: the larger of 256 KiB and 2 ms at the rate (as
     * bench/ps/ps-netns.sh and bench/core/slow-net.sh do). */
    char burst[32] = "";
    if (job->link) {
        double b = (double)terse__run_parse_rate(job->link) / 8 * 0.002;
        snprintf(burst, sizeof burst, "%.0f", b < 262144 ? 262144 : b);
    }
    const char *hub = ns_name[H];
    if (make_ns(H) != 0 || interrupted()) goto fail;
    {
        const char *br[] = {ip, "-n", hub, "link", "add", "br0", "type", "bridge", "stp_state",
                            "0", "forward_delay", "0", NULL};
        const char *up[] = {ip, "-n", hub, "link", "set", "br0", "up", NULL};
        if (run_cmd(br, 0) != 0 || run_cmd(up, 0) != 0) goto fail;
    }
    for (int h = 0; h < H; h++) {
        if (interrupted() || make_ns(h) != 0) goto fail;
        const char *ns = ns_name[h];
        char hv[16], addr[32];
        snprintf(hv, sizeof hv, "hv%d", h);
        snprintf(addr, sizeof addr, "10.78.0.%d/24", h + 1);
        const char *pair[] = {ip,     "-n",   hub,     "link", "add",  hv, "type",
                              "veth", "peer", "name",  HOST_IF, "netns", ns, NULL};
        const char *port[] = {ip, "-n", hub, "link", "set", hv, "master", "br0", NULL};
        const char *hub_up[] = {ip, "-n", hub, "link", "set", hv, "up", NULL};
        const char *set_addr[] = {ip, "-n", ns, "addr", "add", addr, "dev", HOST_IF, NULL};
        const char *host_up[] = {ip, "-n", ns, "link", "set", HOST_IF, "up", NULL};
        if (run_cmd(pair, 0) != 0 || run_cmd(port, 0) != 0 || run_cmd(hub_up, 0) != 0 ||
            run_cmd(set_addr, 0) != 0 || run_cmd(host_up, 0) != 0)
            goto fail;
        if (job->link &&
            (shape(ns, HOST_IF, job->link, burst) != 0 || shape(hub, hv, job->link, burst) != 0))
            goto fail;
    }
    /* A veth reports carrier a moment after both ends are up, and
     * libfabric's tcp provider lists only running interfaces. */
    long long deadline = mono_ms() + CARRIER_MS;
    for (int h = 0; h < H; h++) {
        while (in_host(job, h, link_running, NULL) != 1) {
            if (interrupted()) goto fail;
            if (mono_ms() > deadline) {
                fprintf(stderr, "terse-run: --hosts: %s in %s did not come up within %d ms\n",
                        HOST_IF, ns_name[h], CARRIER_MS);
                goto fail;
            }
            nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
        }
    }
    return 0;
fail:
    terse__run_hosts_down(job);
    return -1;
}

int terse__run_hosts_down(terse__run_job *job) {
    const int H = job->nhosts;
    const char *ip = find_tool("ip");
    int rc = 0;
    for (int h = 0; h < H && job->host_ns; h++) {
        unsigned long long rxtx[2];
        if (ns_made[h] && in_host(job, h, link_bytes, rxtx) == 0)
            fprintf(stderr, "terse-run: host %d link: sent %llu bytes, received %llu bytes\n", h,
                    rxtx[1], rxtx[0]);
    }
    /* hosts first, the hub last: each host's veth pair goes with its host */
    for (int i = 0; i <= H; i++) {
        if (!ns_made[i]) continue;
        const char *del[] = {ip, "netns", "del", ns_name[i], NULL};
        if (run_cmd(del, 0) != 0) {
            fprintf(stderr, "terse-run: network namespace %s is left behind: remove it with "
                            "'ip netns del %s'\n",
                    ns_name[i], ns_name[i]);
            rc = -1;
        } else {
            ns_made[i] = 0;
        }
    }
    if (rc == 0) drop_lock((long)job->launcher); /* kept while a namespace is left */
    return rc;
}
