/* Helpers for the test programs that run without Criterion (tsan_engine,
 * shm_faults): a free loopback port, the clock, and removing what a killed
 * process left in /dev/shm. Header-only, like ranks.h. */
#ifndef TERSE_TESTS_PLAIN_PROCS_H
#define TERSE_TESTS_PLAIN_PROCS_H

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

static inline double plain_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* How much slower than an idle machine this one is right now, for the
 * tests that check a deadline: they assert "within T + slack", and the
 * slack is multiplied by this factor so that a loaded machine (a CPU hog
 * per core, the sanitizers, the suite's own parallel jobs) gets margin.
 * Measured once per process, when the test program starts (before any
 * job of its own runs, so that a slow job cannot raise its own allowance):
 * a 20 ms busy loop's wall time over the CPU time it was given (2 when
 * another process shares the core), and the 1-minute load average over
 * the cores; the larger, at least 1 and at most 3, so that a scaled bound
 * stays far below the failures it guards against (a hang, a timeout of
 * seconds). TERSE_TEST_TIME_SCALE=F (1 to 100) sets it instead (a slow
 * emulator, say). Lower bounds ("not before the timeout") never scale. */
static inline double plain_time_scale(void) {
    static double scale;
    if (scale > 0) return scale;
    const char *e = getenv("TERSE_TEST_TIME_SCALE");
    if (e && *e) {
        double f = strtod(e, NULL);
        scale = f >= 1 && f <= 100 ? f : 1;
        return scale;
    }
    double s = 1;
    struct timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    double w0 = plain_now_ms();
    volatile unsigned spin = 0;
    while (plain_now_ms() - w0 < 20) spin++;
    double wall = plain_now_ms() - w0;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    double cpu = (double)(c1.tv_sec - c0.tv_sec) * 1e3 + (double)(c1.tv_nsec - c0.tv_nsec) / 1e6;
    if (cpu > 0 && wall / cpu > s) s = wall / cpu;
    double load = 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &load) != 1) load = 0;
        fclose(f);
    }
    if (cores > 0 && load / (double)cores > s) s = load / (double)cores;
    scale = s > 3 ? 3 : s;
    return scale;
}
/* Measured at start-up (see above); every test program that includes this
 * header measures once, in its first process. */
__attribute__((constructor)) static void plain_time_scale_at_start(void) {
    (void)plain_time_scale();
}

/* slack_ms scaled for this machine's load (plain_time_scale). */
static inline double plain_slack_ms(double slack_ms) { return slack_ms * plain_time_scale(); }

/* A loopback port nobody listens on right now (-1 if none could be had). */
static inline int plain_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* libfabric shm names its regions /dev/shm/<pid>:<n>:<m>; a process that
 * was killed, or that abandoned its endpoint, cannot remove them. */
static inline void plain_remove_shm_of(pid_t pid) {
    char prefix[32];
    int len = snprintf(prefix, sizeof prefix, "%d:", (int)pid);
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, (size_t)len) == 0) {
            char path[300];
            snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
            unlink(path);
        }
    closedir(d);
}

/* This process's resident memory, MB (/proc/self/statm; 0 if unreadable). */
static inline double plain_rss_mb(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
        fclose(f);
    }
    return (double)res * (double)sysconf(_SC_PAGESIZE) / 1048576.0;
}

#endif
