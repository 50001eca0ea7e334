/* Helpers for the test programs that run without Criterion (tsan_engine,
 * shm_faults): a free loopback port, the clock, and removing what a killed
 * process left in /dev/shm. Header-only, like ranks.h. */
#ifndef TERSE_TESTS_PLAIN_PROCS_H
#define TERSE_TESTS_PLAIN_PROCS_H

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <stdio.h>
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

#endif
