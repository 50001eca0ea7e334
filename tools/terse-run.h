/* terse-run: the pieces the launcher's files share. terse-run.c parses the
 * command line and runs the event loop; terse-run-spawn.c starts one rank
 * with its environment; terse-run-output.c prefixes the ranks' output. */
#ifndef TERSE_TOOLS_TERSE_RUN_H
#define TERSE_TOOLS_TERSE_RUN_H

#include <signal.h>
#include <stddef.h>
#include <sys/resource.h>
#include <sys/types.h>

#define TERSE_RUN_MAX_RANKS 1024
/* A line longer than this is written in pieces (only the first piece gets the
 * prefix), so one endless line can never stall the launcher. */
#define TERSE_RUN_LINE_MAX 4096

/* The signals the launcher handles, so the ranks' dispositions of them
 * must be restored before exec. */
#define TERSE_RUN_SIGNALS {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}

/* Everything every rank gets; filled by main, read by terse__run_spawn. */
typedef struct terse__run_job {
    int nranks;
    char **argv;          /* PROGRAM ARGS..., NULL-terminated */
    char addr[300];       /* TERSE_ADDR, host:port */
    char token[65];       /* TERSE_TOKEN, 64 hex digits */
    char master_addr[300], master_port[8]; /* MASTER_ADDR, MASTER_PORT (torch.distributed's
                                            * rendezvous: another free port than the store's) */
    const char *provider; /* TERSE_PROVIDER, or NULL to leave the environment alone */
    const char *timeout;  /* TERSE_TIMEOUT_MS, or NULL likewise */
    int prefix;           /* 1: the rank's stdout/stderr go to pipes we read */
    pid_t launcher;       /* our pid, so a rank can tell that we died */
    struct rlimit nofile; /* the file limit to give back to ranks */
    sigset_t mask;        /* the signal mask to give back to ranks */
    unsigned ignored;     /* 1u << sig for each of TERSE_RUN_SIGNALS we were started
                           * with ignored (nohup): ranks inherit that, not our handlers */
    unsigned char *replace; /* --replace: per rank, restart it as a replacement when it dies */
    int rejoining;          /* the rank being started as a replacement (TERSE_REJOIN=1), or -1 */
    int nhosts;             /* --hosts H: ranks run in H network namespaces; 0 without */
    const char *link;       /* --link RATE (tc's syntax), or NULL */
    int per_host;           /* --hosts: ranks per host, ceil(nranks / nhosts) */
    char (*host_ns)[64];    /* --hosts: per host, the path of its namespace (/run/netns/...) */
    char host_if[16];       /* --hosts: the veth's name inside every host namespace */
} terse__run_job;

/* --hosts: the namespace plumbing (terse-run-hosts.c). */
#define TERSE_RUN_MAX_HOSTS 250

/* A tc rate ("1gbit", "100mbit", "500kbit", "1gbps", ...) in bits per
 * second, or 0 when `s` is not one. */
unsigned long long terse__run_parse_rate(const char *s);

/* Create the hosts: a hub namespace with a bridge, one namespace per host
 * with a veth into the bridge, 10.78.0.(h+1)/24, loopback up, tbf on both
 * directions of every host link when job->link is set; wait for every link
 * to carry. Fills job->host_ns, job->host_if. `interrupted` is asked
 * between steps (a signal arrived: give up). Returns 0; or -1 after saying
 * which command failed and removing whatever it had created. */
int terse__run_hosts_up(terse__run_job *job, int (*interrupted)(void));

/* Print each host link's byte counters (stderr), then remove every
 * namespace terse__run_hosts_up created (and with them the veths, the
 * bridge and the qdiscs). Returns 0, or -1 after saying what is left. */
int terse__run_hosts_down(terse__run_job *job);

/* Host 0's address, where rank 0's store listens: "10.78.0.1". */
#define TERSE_RUN_HOST0_ADDR "10.78.0.1"

/* Write "127.0.0.1:PORT" for a port the kernel just handed out for
 * 127.0.0.1 and we released again. Returns 0, or -1 with errno set. */
int terse__run_free_port(char *addr, size_t cap);

/* 32 bytes from getrandom() as 64 lower-case hex digits. 0 or -1 (errno). */
int terse__run_make_token(char hex[65]);

/* Start rank `rank` in its own process group. With job->prefix, out_fd[0]
 * and out_fd[1] receive the read ends (non-blocking, close-on-exec) of its
 * stdout and stderr. Returns the pid once PROGRAM has been exec'd. On
 * failure returns -1 and sets *exec_errno to why execvp (or the set-up just
 * before it) failed in the child, which has been reaped -- or to 0 when the
 * launcher itself could not fork or make pipes (errno says why). */
pid_t terse__run_spawn(const terse__run_job *job, int rank, int out_fd[2], int *exec_errno);

/* One of a rank's output pipes, and the part of a line not yet written. */
typedef struct terse__run_stream {
    int fd;            /* read end; -1 once closed */
    int dest;          /* 1 (stdout) or 2 (stderr) */
    int at_line_start; /* the next byte written starts a line: prefix it */
    size_t prefix_len;
    char prefix[16]; /* "[rank] " */
    size_t len;
    char buf[TERSE_RUN_LINE_MAX];
} terse__run_stream;

void terse__run_stream_init(terse__run_stream *s, int fd, int dest, int rank);

/* Read once from a readable stream and write every complete line. Returns
 * the number of bytes read; 0 when nothing was waiting or the stream just
 * reached end of file (then it is flushed and closed, s->fd == -1). */
size_t terse__run_stream_pump(terse__run_stream *s);

/* Write what is left (ending an unfinished line with a newline, so the next
 * rank's line starts on its own) and close. Safe to call twice. */
void terse__run_stream_close(terse__run_stream *s);

#endif
