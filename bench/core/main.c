/* terse-bench: subcommand dispatch and the command-line conventions the
 * subcommands share (exit codes, element counts). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <terse.h>

#include "core/bench.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv); /* NULL: announced, not written yet */
    const char *summary;
} subcommand;

static const subcommand subcommands[] = {
    {"codecs", bench_codecs_main,
     "every codec's compression ratio, error, and encode/decode speed vs memcpy"},
    {"allreduce", bench_allreduce_main,
     "AllReduce time, algbw, busbw and wirebw, dense or compressed, optionally vs Open MPI"},
    {"train", bench_train_main,
     "Fashion-MNIST training over real workers: accuracy against bytes (--sweep)"},
    {"ps", bench_ps_main,
     "parameter-server push+pull time per worker beside the dense allreduce of the same bytes"},
};
#define N_SUBCOMMANDS (sizeof subcommands / sizeof subcommands[0])

static void usage(FILE *f) {
    fprintf(f,
            "usage: terse-bench SUBCOMMAND [OPTIONS]\n"
            "       terse-bench SUBCOMMAND --help\n"
            "       terse-bench --help | --version\n"
            "\n"
            "Benchmarks of the terse library, measured against this machine's memory\n"
            "bandwidth in the same run.\n"
            "\n"
            "subcommands:\n");
    for (size_t i = 0; i < N_SUBCOMMANDS; i++)
        fprintf(f, "  %-10s %s\n", subcommands[i].name, subcommands[i].summary);
    fprintf(f, "\n"
               "exit status: 0 ok, 1 runtime failure, 2 usage error.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "terse-bench: missing subcommand (try terse-bench --help)\n");
        return BENCH_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return fflush(stdout) == 0 ? BENCH_EXIT_OK : BENCH_EXIT_RUNTIME;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) {
        printf("terse-bench %d.%d.%d (libterse %s loaded)\n", TERSE_VERSION_MAJOR,
               TERSE_VERSION_MINOR, TERSE_VERSION_PATCH, terse_version_string());
        return fflush(stdout) == 0 ? BENCH_EXIT_OK : BENCH_EXIT_RUNTIME;
    }
    for (size_t i = 0; i < N_SUBCOMMANDS; i++) {
        if (strcmp(cmd, subcommands[i].name) != 0) continue;
        if (!subcommands[i].run) {
            fprintf(stderr, "terse-bench %s: not implemented yet\n", cmd);
            return BENCH_EXIT_USAGE;
        }
        return subcommands[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "terse-bench: unknown %s '%s' (try terse-bench --help)\n",
            cmd[0] == '-' ? "option" : "subcommand", cmd);
    return BENCH_EXIT_USAGE;
}

/* A positive decimal with a binary suffix (K, M, and with `bytes` also G
 * and a trailing B), into a size_t; -1 on anything else. */
static int parse_scaled(const char *text, int bytes, size_t *out) {
    if (!text || text[0] < '0' || text[0] > '9') return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno) return -1;
    unsigned long long unit = 1;
    switch (*end) {
    case 'K': case 'k': unit = 1ull << 10; end++; break;
    case 'M': case 'm': unit = 1ull << 20; end++; break;
    case 'G': case 'g': if (bytes) { unit = 1ull << 30; end++; } break;
    default: break;
    }
    if (bytes && (*end == 'B' || *end == 'b')) end++; /* "4MB" reads as "4M" */
    if (*end != '\0' || v == 0 || v > (unsigned long long)SIZE_MAX / unit) return -1;
    *out = (size_t)(v * unit);
    return 0;
}

int bench_parse_count(const char *text, size_t *n) { return parse_scaled(text, 0, n); }

const char *bench_count_label(size_t n, char *buf, size_t cap) {
    if (n % (1024 * 1024) == 0)
        snprintf(buf, cap, "%zuM", n / (1024 * 1024));
    else if (n % 1024 == 0)
        snprintf(buf, cap, "%zuK", n / 1024);
    else
        snprintf(buf, cap, "%zu", n);
    return buf;
}

int bench_parse_bytes(const char *text, size_t *out) { return parse_scaled(text, 1, out); }

int bench_parse_int(const char *text, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

int bench_usage_error(const char *who, const char *fmt, const char *what) {
    fprintf(stderr, "%s: ", who);
    fprintf(stderr, fmt, what);
    fprintf(stderr, " (try %s --help)\n", who);
    return BENCH_EXIT_USAGE;
}

int bench_common_arg(const char *who, const char *a, void (*print_usage)(FILE *f),
                     int *csv, int *quiet, int *worker) {
    if (strcmp(a, "--csv") == 0) {
        *csv = 1;
    } else if (strcmp(a, "-q") == 0 || strcmp(a, "--quiet") == 0) {
        *quiet = 1;
    } else if (worker && strcmp(a, "--worker") == 0) {
        *worker = 1;
    } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
        print_usage(stdout);
        return -1;
    } else {
        return bench_usage_error(
            who, a[0] == '-' ? "unknown option '%s'" : "unexpected argument '%s'", a);
    }
    return 0;
}
