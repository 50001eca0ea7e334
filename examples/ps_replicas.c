/* A parameter server that survives a server's death and takes a
 * replacement back: sync SGD with replicas 2, nothing but the public API.
 * Ranks [0, S) serve, the others push a made-up gradient every step and
 * pull the result; at the end each worker prints a checksum of what it
 * pulled last. Run it under terse-run, naming the servers that may be
 * replaced (never rank 0, which holds the store):
 *
 *   terse-run -n 5 --provider tcp --replace 1 ps_replicas --steps 1000 --die-after-ms 500
 *
 * Rank 1 SIGKILLs itself half a second into serving (or kill it yourself
 * while it runs): its slot moves to its replica, terse-run starts a
 * replacement (TERSE_REJOIN=1), which takes the slot back, and the
 * checksums are those of a run without the kill. */
#define _POSIX_C_SOURCE 200809L /* nanosleep, sigaction, setitimer */
#include <math.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <terse.h>

static void usage(FILE *f, const char *me) {
    fprintf(f,
            "usage: %s [--servers S] [--steps T] [--floats N] [--nap-ms M] [--die-after-ms D]\n"
            "A sync parameter server with replicas 2 (ranks 0..S-1 serve, S >= 2; the\n"
            "others are workers), T steps over N floats, M ms between steps. Each worker\n"
            "prints 'rank R: checksum H' at the end. Run under terse-run; a server rank\n"
            "given to terse-run --replace comes back as a replacement if it dies.\n"
            "--die-after-ms D: server rank 1 SIGKILLs itself D ms after it starts serving\n"
            "(a crash to recover from; its replacement does not).\n"
            "defaults: --servers 2 --steps 200 --floats 100000 --nap-ms 2 (no death)\n",
            me);
}

static void die(int sig) {
    (void)sig;
    kill(getpid(), SIGKILL); /* async-signal-safe: a crash, no exit handlers */
}

/* Rank 1's crash, D ms from now, unless it is a replacement. */
static void die_after(long ms) {
    if (ms <= 0 || getenv("TERSE_REJOIN")) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = die;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 0}, {ms / 1000, (ms % 1000) * 1000}};
    setitimer(ITIMER_REAL, &it, NULL);
}

static int fail(const char *what, terse_status s) {
    fprintf(stderr, "ps_replicas: %s: %s (%s)\n", what, terse_last_error(), terse_status_name(s));
    return 1;
}

int main(int argc, char **argv) {
    long servers = 2, steps = 200, n = 100000, nap_ms = 2, die_ms = 0;
    for (int i = 1; i < argc; i += 2) { /* option, value */
        long *v = !strcmp(argv[i], "--servers")  ? &servers
                  : !strcmp(argv[i], "--steps")  ? &steps
                  : !strcmp(argv[i], "--floats") ? &n
                  : !strcmp(argv[i], "--nap-ms") ? &nap_ms
                  : !strcmp(argv[i], "--die-after-ms") ? &die_ms
                                                 : NULL;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout, argv[0]);
            return 0;
        }
        char *end = NULL;
        if (!v || i + 1 == argc || (*v = strtol(argv[i + 1], &end, 10), *end) || *v < 0) {
            fprintf(stderr, "ps_replicas: %s '%s'%s\n", v ? "bad value for" : "unknown option",
                    argv[i], v && i + 1 < argc ? " (a number >= 0)" : v ? " (needs a value)" : "");
            usage(stderr, argv[0]);
            return 2;
        }
    }
    terse_comm *c = NULL;
    terse_status s = terse_comm_init(NULL, &c);
    if (s != TERSE_OK) return fail("terse_comm_init", s);
    terse_ps_config cfg = TERSE_PS_CONFIG_INIT;
    cfg.num_servers = (int)servers;
    cfg.update = TERSE_PS_UPDATE_SGD;
    cfg.lr = 0.01f;
    cfg.momentum = 0.9f;
    cfg.replicas = 2;
    terse_ps *ps = NULL;
    int rc = 0;
    if ((s = terse_ps_create(c, &cfg, &ps)) != TERSE_OK ||
        (s = terse_ps_declare(ps, 0, (size_t)n, NULL, NULL, NULL)) != TERSE_OK) {
        rc = fail("terse_ps_create / terse_ps_declare", s);
    } else if (terse_ps_is_server(ps)) {
        fprintf(stderr, "ps_replicas: rank %d ready (serving)\n", terse_comm_rank(c));
        if (terse_comm_rank(c) == 1) die_after(die_ms);
        if ((s = terse_ps_serve(ps)) != TERSE_OK) rc = fail("terse_ps_serve", s);
    } else {
        int rank = terse_comm_rank(c);
        fprintf(stderr, "ps_replicas: rank %d ready (training)\n", rank);
        float *x = malloc((size_t)n * sizeof *x);
        for (long t = 0; x && t < steps && rc == 0; t++) {
            for (long i = 0; i < n; i++) x[i] = sinf(0.37f * (float)(rank * 131 + t) + 0.01f * (float)i);
            if ((s = terse_ps_pushpull(ps, 0, x, NULL)) != TERSE_OK) rc = fail("terse_ps_pushpull", s);
            if (rc == 0 && (s = terse_ps_clock(ps)) != TERSE_OK) rc = fail("terse_ps_clock", s);
            struct timespec ts = {0, nap_ms * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (rc == 0 && (s = terse_ps_finish(ps)) != TERSE_OK) rc = fail("terse_ps_finish", s);
        if (rc == 0 && x) {
            uint64_t h = 1469598103934665603ull;
            const unsigned char *b = (const unsigned char *)x;
            for (size_t i = 0; i < (size_t)n * sizeof *x; i++) h = (h ^ b[i]) * 1099511628211ull;
            printf("rank %d: checksum %016llx\n", rank, (unsigned long long)h);
        }
        free(x);
    }
    terse_ps_free(ps);
    terse_comm_free(c);
    return rc;
}
