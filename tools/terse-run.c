/* terse-run: start N ranks of a program on this machine with the environment
 * terse_comm_init reads, prefix their output, forward signals, and stop the
 * whole job as soon as one rank fails. The command line and the event loop
 * live here; see terse-run.h for the other files. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../include/terse.h" /* version macros only; terse-run does not link libterse */
#include "terse-run.h"

enum { EXIT_USAGE = 2, EXIT_CANNOT_EXEC = 127 };
/* How long ranks get between SIGTERM and SIGKILL once the job is stopping. */
#define GRACE_MS 2000
/* How long to keep reading output after the last rank has exited: a process
 * the rank left behind may still hold its pipe open. */
#define DRAIN_MS 1000
/* --replace: replacements of one rank, at most */
#define MAX_REPLACEMENTS 3

static void usage(FILE *f) {
    fprintf(f,
            "usage: terse-run -n N [OPTIONS] PROGRAM [ARGS...]\n"
            "       terse-run --help | --version\n"
            "\n"
            "Runs N ranks of PROGRAM on this machine. Each rank gets TERSE_RANK,\n"
            "TERSE_SIZE, TERSE_LOCAL_RANK, TERSE_LOCAL_SIZE, TERSE_ADDR (where rank 0\n"
            "runs the bootstrap store) and TERSE_TOKEN (a fresh random secret for this\n"
            "job, never printed), which is what terse_comm_init reads; and RANK,\n"
            "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (the\n"
            "store's host, another free port), which is what torch.distributed's env://\n"
            "reads: terse-run -n 2 python3 train.py runs a DDP script as torchrun would.\n"
            "\n"
            "options:\n"
            "  -n N              number of ranks, 1 to %d (required)\n"
            "  --provider P      set TERSE_PROVIDER for every rank: shm, tcp, rxm, verbs, efa, net, auto\n"
            "  --timeout-ms T    set TERSE_TIMEOUT_MS for every rank (milliseconds, > 0)\n"
            "  --addr HOST:PORT  address of rank 0's store (default: 127.0.0.1 and a free port)\n"
            "  --no-prefix       pass the ranks' output through untouched instead of\n"
            "                    starting each line with \"[rank] \"\n"
            "  --replace LIST    when one of these ranks (e.g. 1,2; never 0) fails, start it\n"
            "                    again with TERSE_REJOIN=1 instead of stopping the job, up\n"
            "                    to %d times each: a parameter server with replicas 2\n"
            "                    takes it back as the lost server's replacement (not\n"
            "                    after terse-run forwarded a signal: the job is ending)\n"
            "  --hosts H         (root) run the ranks on H \"hosts\" made of network\n"
            "                    namespaces on this machine (trh<pid>-0 .. H-1), each\n"
            "                    with one veth (terse0, 10.78.0.<h+1>/24) into a bridge\n"
            "                    in a hub namespace; ranks are dealt in blocks of\n"
            "                    ceil(N/H): rank r runs on host r / ceil(N/H), with\n"
            "                    TERSE_HOST=<host>, TERSE_IFACE=FI_TCP_IFACE=terse0 and\n"
            "                    the store on host 0 (10.78.0.1). Everything is removed\n"
            "                    when the job ends, fails or is interrupted; each host\n"
            "                    link's byte counts are printed on stderr first\n"
            "  --link RATE       with --hosts: shape both directions of every host's\n"
            "                    link to RATE with tc tbf (tc's units: 1gbit, 100mbit)\n"
            "  -h, --help        show this help\n"
            "  -V, --version     show the version\n"
            "\n"
            "SIGINT, SIGTERM and SIGHUP are forwarded to every rank (and whatever each\n"
            "rank started: every rank runs in its own process group). Only rank 0 reads\n"
            "stdin, and only when it is not a terminal.\n"
            "\n"
            "exit status: 0 when every rank exits 0. When a rank fails, the others get\n"
            "SIGTERM, then SIGKILL after %d s, and terse-run exits with the failed rank's\n"
            "status: its exit code, or 128 + the signal that killed it. 127: PROGRAM\n"
            "cannot be run. 2: usage error. 1: terse-run itself failed.\n",
            TERSE_RUN_MAX_RANKS, MAX_REPLACEMENTS, GRACE_MS / 1000);
}

__attribute__((format(printf, 1, 2))) static _Noreturn void usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "terse-run: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry 'terse-run --help' for more information.\n");
    va_end(ap);
    exit(EXIT_USAGE);
}

/* A whole-string decimal in [lo, hi], or -1. */
static long parse_long(const char *s, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < lo || v > hi) return -1;
    return v;
}

static void parse_args(int argc, char **argv, terse__run_job *job) {
    enum { OPT_PROVIDER = 256, OPT_TIMEOUT, OPT_ADDR, OPT_NO_PREFIX, OPT_REPLACE, OPT_HOSTS,
           OPT_LINK };
    static const struct option longs[] = {
        {"provider", required_argument, NULL, OPT_PROVIDER},
        {"timeout-ms", required_argument, NULL, OPT_TIMEOUT},
        {"addr", required_argument, NULL, OPT_ADDR},
        {"no-prefix", no_argument, NULL, OPT_NO_PREFIX},
        {"replace", required_argument, NULL, OPT_REPLACE},
        {"hosts", required_argument, NULL, OPT_HOSTS},
        {"link", required_argument, NULL, OPT_LINK},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    job->nranks = 0;
    job->prefix = 1;
    job->rejoining = -1;
    const char *replace = NULL;
    opterr = 0;
    int c;
    /* "+": options end at PROGRAM, so its own options are left alone. */
    while ((c = getopt_long(argc, argv, "+:n:hV", longs, NULL)) != -1) {
        switch (c) {
        case 'n':
            job->nranks = (int)parse_long(optarg, 1, TERSE_RUN_MAX_RANKS);
            if (job->nranks < 1)
                usage_error("-n wants a number of ranks from 1 to 1024, not '%s'", optarg);
            break;
        case OPT_PROVIDER:
            if (!*optarg || strlen(optarg) >= 32)
                usage_error("--provider wants a provider name such as shm or tcp, not '%s'",
                            optarg);
            {
                /* the names terse_comm_init accepts (transport/fabric_info.c):
                 * refuse before launching, not in every rank afterwards */
                static const char *const known[] = {"shm", "tcp", "rxm", "verbs", "efa", "net",
                                                     "auto"};
                int ok = 0;
                for (size_t i = 0; i < sizeof known / sizeof *known; i++)
                    ok |= strcmp(optarg, known[i]) == 0;
                if (!ok)
                    usage_error("--provider '%s' is not one of shm, tcp, rxm, verbs, efa, net, "
                                "auto",
                                optarg);
            }
            job->provider = optarg;
            break;
        case OPT_TIMEOUT:
            if (parse_long(optarg, 1, INT_MAX) < 0)
                usage_error("--timeout-ms wants a positive number of milliseconds, not '%s'",
                            optarg);
            job->timeout = optarg;
            break;
        case OPT_ADDR: {
            /* HOST:PORT; the port comes after the last colon ([::1]:29500 works). */
            const char *colon = strrchr(optarg, ':');
            if (!colon || colon == optarg || parse_long(colon + 1, 1, 65535) < 0 ||
                strlen(optarg) >= sizeof job->addr)
                usage_error("--addr wants HOST:PORT with a port from 1 to 65535, not '%s'", optarg);
            strcpy(job->addr, optarg);
            break;
        }
        case OPT_NO_PREFIX: job->prefix = 0; break;
        case OPT_REPLACE: replace = optarg; break;
        case OPT_HOSTS:
            job->nhosts = (int)parse_long(optarg, 1, TERSE_RUN_MAX_HOSTS);
            if (job->nhosts < 1)
                usage_error("--hosts wants a number of hosts from 1 to %d, not '%s'",
                            TERSE_RUN_MAX_HOSTS, optarg);
            break;
        case OPT_LINK:
            if (terse__run_parse_rate(optarg) == 0)
                usage_error("--link wants a rate as tc writes it, such as 1gbit or 100mbit "
                            "(at least 8kbit), not '%s'",
                            optarg);
            job->link = optarg;
            break;
        case 'h':
            usage(stdout);
            exit(fflush(stdout) == 0 ? 0 : 1);
        case 'V':
            printf("terse-run %d.%d.%d\n", TERSE_VERSION_MAJOR, TERSE_VERSION_MINOR,
                   TERSE_VERSION_PATCH);
            exit(fflush(stdout) == 0 ? 0 : 1);
        case ':':
            if (optopt > 0 && optopt < 256) usage_error("option '-%c' needs a value", optopt);
            usage_error("option '%s' needs a value", argv[optind - 1]);
        default:
            if (optopt > 0 && optopt < 256) usage_error("unknown option '-%c'", optopt);
            usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (job->nranks == 0) usage_error("missing -n N, the number of ranks");
    if (replace) {
        job->replace = calloc((size_t)job->nranks, 1);
        if (!job->replace) usage_error("out of memory");
        char list[256];
        if (strlen(replace) >= sizeof list)
            usage_error("--replace wants ranks such as 1,2, not '%.40s...'", replace);
        strcpy(list, replace);
        for (char *save = NULL, *t = strtok_r(list, ",", &save); t;
             t = strtok_r(NULL, ",", &save)) {
            long r = parse_long(t, 1, job->nranks - 1);
            if (r < 0)
                usage_error("--replace wants ranks from 1 to %d separated by commas (rank 0 "
                            "holds the store and cannot be replaced), not '%s'",
                            job->nranks - 1, t);
            job->replace[r] = 1;
        }
    }
    if (job->link && !job->nhosts) usage_error("--link shapes the links of --hosts: add --hosts H");
    if (job->nhosts) {
        job->per_host = (job->nranks + job->nhosts - 1) / job->nhosts;
        if ((job->nhosts - 1) * job->per_host >= job->nranks)
            usage_error("-n %d ranks dealt to %d hosts in blocks of %d leave host %d without a "
                        "rank: use at most %d hosts, or more ranks",
                        job->nranks, job->nhosts, job->per_host, job->nhosts - 1,
                        (job->nranks + job->per_host - 1) / job->per_host);
        if (job->addr[0])
            usage_error("--addr does not go with --hosts: the store listens on host 0's "
                        "address, " TERSE_RUN_HOST0_ADDR);
        if (job->provider && strcmp(job->provider, "shm") == 0)
            usage_error("--provider shm cannot cross --hosts (shared memory does not reach "
                        "another host): use tcp, net or auto");
        if (geteuid() != 0) {
            fprintf(stderr, "terse-run: --hosts creates network namespaces, which needs root: "
                            "run terse-run as root (e.g. with sudo), or leave out --hosts to "
                            "run every rank on this one host\n");
            exit(EXIT_USAGE);
        }
    }
    if (optind >= argc) usage_error("missing the PROGRAM to run");
    job->argv = argv + optind;
}

/* ---------------------------------------------------------------- signals */

/* Signal handlers only write the signal number here; the loop does the rest
 * (the self-pipe trick), so no real work happens in a handler. */
static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig) {
    int e = errno;
    unsigned char b = (unsigned char)sig;
    ssize_t w = write(sig_pipe[1], &b, 1); /* full pipe: a wake-up is pending anyway */
    (void)w;
    errno = e;
}

/* --hosts set-up: a signal that arrived meanwhile (the first one) ends it. */
static int pending_sig;

static int setup_interrupted(void) {
    unsigned char buf[64];
    ssize_t n;
    while ((n = read(sig_pipe[0], buf, sizeof buf)) > 0)
        for (ssize_t i = 0; i < n; i++)
            if (buf[i] != SIGCHLD && !pending_sig) pending_sig = buf[i];
    return pending_sig != 0;
}

static int install_signals(terse__run_job *job) {
    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return -1;
    /* Remember what we were started with ignored. A launcher run under
     * nohup (SIGHUP ignored) or in the background of a script (SIGINT
     * ignored) leaves those signals alone, as a shell would, and so do its
     * ranks. */
    static const int all[] = TERSE_RUN_SIGNALS;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        struct sigaction cur;
        if (sigaction(all[i], NULL, &cur) == 0 && cur.sa_handler == SIG_IGN)
            job->ignored |= 1u << all[i];
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigemptyset(&sa.sa_mask);
    static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
        if (!(job->ignored & (1u << forwarded[i])) && sigaction(forwarded[i], &sa, NULL) != 0)
            return -1;
    /* SIGCHLD always: we must see ranks exit even if started with it ignored. */
    if (sigaction(SIGCHLD, &sa, NULL) != 0) return -1;
    /* A closed stdout must not kill the launcher while ranks still run. */
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

/* ---------------------------------------------------------------- the job */

typedef struct rank_state {
    pid_t pid;
    int alive;
    int replaced; /* --replace: replacements started so far */
    terse__run_stream out, err;
} rank_state;

typedef struct job_state {
    terse__run_job job;
    rank_state *ranks;
    int alive;          /* ranks not yet reaped */
    int stopping;       /* a rank failed: the others have been sent SIGTERM */
    int signalled;      /* a signal was forwarded to the ranks */
    int killed;         /* ...and, after the grace period, SIGKILL */
    int exit_status;    /* the first failed rank's status, else 0 */
    long long kill_at;  /* when stopping: the time to send SIGKILL */
    long long drain_at; /* once no rank is alive: the time to stop reading */
} job_state;

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void signal_ranks(job_state *js, int sig) {
    for (int r = 0; r < js->job.nranks; r++)
        if (js->ranks[r].alive) kill(-js->ranks[r].pid, sig);
}

static void stop_job(job_state *js) {
    if (js->stopping) return;
    js->stopping = 1;
    js->kill_at = now_ms() + GRACE_MS;
    signal_ranks(js, SIGTERM);
}

/* --replace: start rank r again as its own replacement (TERSE_REJOIN=1).
 * 0 when it runs; -1 when it cannot start. */
static int start_replacement(job_state *js, int r, int code) {
    rank_state *k = &js->ranks[r];
    terse__run_stream_close(&k->out);
    terse__run_stream_close(&k->err);
    k->replaced++;
    fprintf(stderr, "terse-run: rank %d exited with status %d; starting its replacement "
                    "(TERSE_REJOIN=1, %d of %d)\n",
            r, code, k->replaced, MAX_REPLACEMENTS);
    int out_fd[2] = {-1, -1}, exec_errno = 0;
    js->job.rejoining = r;
    pid_t pid = terse__run_spawn(&js->job, r, out_fd, &exec_errno);
    js->job.rejoining = -1;
    if (pid < 0) {
        fprintf(stderr, "terse-run: cannot start rank %d's replacement: %s\n", r,
                strerror(exec_errno ? exec_errno : errno));
        return -1;
    }
    k->pid = pid;
    k->alive = 1;
    js->alive++;
    terse__run_stream_init(&k->out, out_fd[0], STDOUT_FILENO, r);
    terse__run_stream_init(&k->err, out_fd[1], STDERR_FILENO, r);
    return 0;
}

/* Reap every rank that has exited. The first to fail sets our exit status,
 * and the others are stopped (unless --replace starts it again). */
static void reap(job_state *js) {
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        int r = 0;
        while (r < js->job.nranks && js->ranks[r].pid != pid) r++;
        if (r == js->job.nranks || !js->ranks[r].alive) continue;
        js->ranks[r].alive = 0;
        if (--js->alive == 0) js->drain_at = now_ms() + DRAIN_MS;
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 1;
        if (code == 0 || js->stopping) continue;
        /* Its last words first, then ours (a bounded amount: something the
         * rank left behind may keep writing). */
        for (int i = 0; i < 64 && terse__run_stream_pump(&js->ranks[r].out) > 0; i++) {
        }
        for (int i = 0; i < 64 && terse__run_stream_pump(&js->ranks[r].err) > 0; i++) {
        }
        if (js->job.replace && js->job.replace[r] && js->ranks[r].replaced < MAX_REPLACEMENTS &&
            js->alive > 0 && !js->signalled && start_replacement(js, r, code) == 0)
            continue;
        js->exit_status = code;
        fprintf(stderr, "terse-run: rank %d exited with status %d", r, code);
        if (WIFSIGNALED(st)) fprintf(stderr, " (killed by signal %d)", WTERMSIG(st));
        fprintf(stderr, js->alive > 0 ? "; stopping the others\n" : "\n");
        stop_job(js);
    }
}

static void handle_signals(job_state *js) {
    unsigned char buf[64];
    ssize_t n;
    while ((n = read(sig_pipe[0], buf, sizeof buf)) > 0)
        for (ssize_t i = 0; i < n; i++)
            if (buf[i] != SIGCHLD) {
                js->signalled = 1; /* a rank that dies of it is not replaced */
                signal_ranks(js, buf[i]);
            }
    reap(js);
}

/* The event loop: wait for output, signals and exits until every rank has
 * exited and its output is written (or the drain time is up). */
static void run_loop(job_state *js, struct pollfd *fds, terse__run_stream **streams) {
    int nr = js->job.nranks;
    for (;;) {
        long long now = now_ms();
        if (js->stopping && !js->killed && now >= js->kill_at) {
            signal_ranks(js, SIGKILL);
            js->killed = 1;
        }
        /* Step 1: collect the streams still open. */
        int nfds = 1, open_streams = 0;
        fds[0] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
        for (int r = 0; r < nr && js->job.prefix; r++) {
            terse__run_stream *two[2] = {&js->ranks[r].out, &js->ranks[r].err};
            for (int k = 0; k < 2; k++) {
                if (two[k]->fd < 0) continue;
                streams[nfds] = two[k];
                fds[nfds++] = (struct pollfd){.fd = two[k]->fd, .events = POLLIN};
                open_streams++;
            }
        }
        /* Step 2: done when no rank is alive and the output is in (or the
         * drain time ran out on a pipe some leftover process holds). */
        if (js->alive == 0 && (open_streams == 0 || now >= js->drain_at)) return;
        /* Step 3: sleep until something happens or a deadline passes. */
        long long wake = -1;
        if (js->stopping && !js->killed) wake = js->kill_at;
        if (js->alive == 0) wake = js->drain_at;
        int timeout = wake < 0 ? -1 : wake <= now ? 0 : (int)(wake - now);
        if (poll(fds, (nfds_t)nfds, timeout) < 0 && errno != EINTR) {
            perror("terse-run: poll");
            stop_job(js);
            if (!js->exit_status) js->exit_status = 1;
        }
        /* Step 4: forward signals, reap, copy output. */
        handle_signals(js);
        for (int i = 1; i < nfds; i++)
            if (fds[i].revents) terse__run_stream_pump(streams[i]);
    }
}

/* Raise the soft file limit to hold two pipes per rank; ranks get the
 * original limit back. */
static int reserve_fds(terse__run_job *job) {
    if (getrlimit(RLIMIT_NOFILE, &job->nofile) != 0) return -1;
    rlim_t need = (rlim_t)job->nranks * 2 + 32;
    if (job->nofile.rlim_cur == RLIM_INFINITY || job->nofile.rlim_cur >= need) return 0;
    struct rlimit raised = job->nofile;
    raised.rlim_cur = job->nofile.rlim_max == RLIM_INFINITY || job->nofile.rlim_max >= need
                          ? need
                          : job->nofile.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) != 0 || raised.rlim_cur < need) {
        fprintf(stderr,
                "terse-run: %d ranks need about %llu open files, but the limit is %llu "
                "(ulimit -n)\n",
                job->nranks, (unsigned long long)need, (unsigned long long)raised.rlim_cur);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    job_state js;
    memset(&js, 0, sizeof js);
    terse__run_job *job = &js.job;
    /* Started with stdin, stdout or stderr closed, our pipes could land on
     * fds 0-2 and the ranks' dup2 onto them would do nothing. */
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) != fd) return 1;
    parse_args(argc, argv, job);
    job->launcher = getpid();
    sigprocmask(SIG_SETMASK, NULL, &job->mask);
    if (!job->addr[0] && terse__run_free_port(job->addr, sizeof job->addr) != 0) {
        perror("terse-run: cannot find a free port on 127.0.0.1");
        return 1;
    }
    {
        /* torch.distributed's env:// rendezvous on the store's host, another
         * free port (its TCPStore binds it in rank 0) */
        char a[300];
        if (terse__run_free_port(a, sizeof a) != 0) {
            perror("terse-run: cannot find a free port on 127.0.0.1");
            return 1;
        }
        const char *colon = strrchr(job->addr, ':'), *pc = strrchr(a, ':');
        size_t hl = (size_t)(colon - job->addr);
        if (hl >= 2 && job->addr[0] == '[' && job->addr[hl - 1] == ']') /* [v6]:port */
            snprintf(job->master_addr, sizeof job->master_addr, "%.*s", (int)(hl - 2),
                     job->addr + 1);
        else
            snprintf(job->master_addr, sizeof job->master_addr, "%.*s", (int)hl, job->addr);
        snprintf(job->master_port, sizeof job->master_port, "%s", pc + 1);
    }
    if (terse__run_make_token(job->token) != 0) {
        perror("terse-run: cannot read random bytes for the job token (getrandom)");
        return 1;
    }
    if (reserve_fds(job) != 0) return 1;
    if (install_signals(job) != 0) {
        perror("terse-run: cannot install signal handlers");
        return 1;
    }
    js.ranks = calloc((size_t)job->nranks, sizeof *js.ranks);
    struct pollfd *fds = calloc((size_t)job->nranks * 2 + 1, sizeof *fds);
    terse__run_stream **streams = calloc((size_t)job->nranks * 2 + 1, sizeof *streams);
    if (!js.ranks || !fds || !streams) {
        fprintf(stderr, "terse-run: out of memory for %d ranks\n", job->nranks);
        return 1;
    }
    if (job->nhosts) {
        /* the store on host 0's veth; the port is free there like any other */
        const char *colon = strrchr(job->addr, ':');
        char port[8];
        snprintf(port, sizeof port, "%s", colon + 1);
        snprintf(job->addr, sizeof job->addr, "%s:%s", TERSE_RUN_HOST0_ADDR, port);
        snprintf(job->master_addr, sizeof job->master_addr, "%s", TERSE_RUN_HOST0_ADDR);
        if (terse__run_hosts_up(job, setup_interrupted) != 0) {
            if (pending_sig)
                fprintf(stderr, "terse-run: interrupted by signal %d while creating the hosts\n",
                        pending_sig);
            return pending_sig ? 128 + pending_sig : 1;
        }
    }
    for (int r = 0; r < job->nranks; r++) {
        terse__run_stream_init(&js.ranks[r].out, -1, STDOUT_FILENO, r);
        terse__run_stream_init(&js.ranks[r].err, -1, STDERR_FILENO, r);
    }

    /* Start the ranks in order. If one cannot start, stop those already
     * running and report why. */
    for (int r = 0; r < job->nranks; r++) {
        int out_fd[2] = {-1, -1}, exec_errno;
        pid_t pid = terse__run_spawn(job, r, out_fd, &exec_errno);
        if (pid < 0) {
            if (exec_errno)
                fprintf(stderr, "terse-run: cannot run '%s' (rank %d): %s\n", job->argv[0], r,
                        strerror(exec_errno));
            else
                fprintf(stderr, "terse-run: cannot start rank %d: %s\n", r, strerror(errno));
            js.exit_status = exec_errno ? EXIT_CANNOT_EXEC : 1;
            stop_job(&js);
            break;
        }
        js.ranks[r].pid = pid;
        js.ranks[r].alive = 1;
        js.alive++;
        terse__run_stream_init(&js.ranks[r].out, out_fd[0], STDOUT_FILENO, r);
        terse__run_stream_init(&js.ranks[r].err, out_fd[1], STDERR_FILENO, r);
    }
    if (js.alive == 0) js.drain_at = now_ms();

    run_loop(&js, fds, streams);
    if (job->nhosts) {
        /* whatever a rank left in its process group would keep its host's
         * namespace alive after ip netns del */
        for (int r = 0; r < job->nranks; r++)
            if (js.ranks[r].pid > 0) kill(-js.ranks[r].pid, SIGKILL);
        if (terse__run_hosts_down(job) != 0 && js.exit_status == 0) js.exit_status = 1;
        free(job->host_ns);
    }
    for (int r = 0; r < job->nranks; r++) {
        terse__run_stream_close(&js.ranks[r].out);
        terse__run_stream_close(&js.ranks[r].err);
    }
    memset(job->token, 0, sizeof job->token);
    free(job->replace);
    free(streams);
    free(fds);
    free(js.ranks);
    return js.exit_status;
}
