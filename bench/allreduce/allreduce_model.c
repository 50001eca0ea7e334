/* terse-bench allreduce --model: an alpha-beta prediction of each
 * algorithm's time from 8 to 1024 ranks, with the codec speeds measured
 * here in the same run and the bytes per rank each algorithm sends, and a
 * check of the model against the rows just measured (allreduce.h).
 *
 * The link: a message of m bytes costs alpha + m / B, one at a time per
 * rank (B is the rank's link: --link-gbps, or that divided by N with
 * --shared-link, as on bench/core/slow-net.sh's one shaped loopback). The codec:
 * encode and decode seconds per element, measured on the whole tensor in
 * this process, scaled linearly to pieces and segments; the reduction of
 * dense fp32 likewise (y += x). The predictions give every rank a core of
 * its own; the check against ranks measured on this machine scales the
 * codec work by N / cores where the ranks outnumbered the cores. Per algorithm, for a codec message of M
 * bytes on n floats (the algorithms in docs/collectives.md):
 *   dense-ring   2 (N-1) alpha + 2 (N-1)/N 4n / B + (N-1)/N n add
 *   gather       2 (N-1) alpha + (N-1) M / B + E + N D
 *   gather-pipe  C = E + N D, W = alpha + (N-1) M_pieces / B,
 *                max(C, W) + min(C, W) / P + alpha (P pieces)
 *   rs           (2 (N-1) + ceil((N-1)/16)) alpha + ((N-1)(N+1) 8 + the
 *                pieces sent + the owners' messages forwarded) / B
 *                + E (1 + 1/N) + 2 D
 * Bytes per rank are exact for fixed-size codecs (every message is its
 * bound: the cuts are recomputed from the codec's traits as the library
 * cuts them); for the others (topk) they scale the message this process
 * encoded, marked '~'. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <terse.h>

#include "allreduce/allreduce.h"
#include "core/bench.h"

#define MODEL_REPEATS 5
#define PIPE_DEFAULT_BYTES ((size_t)256 << 10)
#define WIRE_HEADER 32.0
#define RS_WINDOW 16.0
#define MAX_REQS 64

typedef struct {
    double e, d;       /* encode, decode seconds of the whole tensor */
    double add;        /* seconds per float of y += x */
    double m;          /* bytes of the whole message (bound if fixed) */
    int fixed, options;
    size_t align, n;
    char child[320];   /* the spec of a piece's codec, ef=0 */
    const char *spec;
    size_t rows, cols;
} model_codec;

/* Bytes of a child message for len elements: its bound for fixed-size
 * codecs (exact), else the whole message's share. */
static double piece_bytes(const model_codec *k, size_t len) {
    if (k->fixed) {
        terse_codec *c = NULL;
        double b = 0;
        if (terse_codec_create(k->child, 1, len, &c) == TERSE_OK) b = (double)terse_codec_bound(c);
        terse_codec_free(c);
        if (b > 0) return b;
    }
    return WIRE_HEADER + (k->m - WIRE_HEADER) * (double)len / (double)k->n;
}

static size_t pipe_bytes_setting(void) {
    const char *v = getenv("TERSE_PIPELINE_BYTES");
    size_t b = PIPE_DEFAULT_BYTES;
    if (v && v[0] && bench_parse_bytes(v, &b) != 0) b = PIPE_DEFAULT_BYTES;
    return b;
}

/* The pipelined all-gather's pieces (algos/coll/pipe_allreduce.c): count and
 * the bytes of one copy of all of them; 1 piece when not cut. */
static size_t pieces(const model_codec *k, double *bytes) {
    const size_t elems = pipe_bytes_setting() / 4;
    if (!k->align || k->options || elems == 0) {
        *bytes = k->m;
        return 1;
    }
    const size_t blocks = k->n / k->align + (k->n % k->align != 0);
    const size_t per = elems / k->align > 0 ? elems / k->align : 1;
    const size_t p = blocks / per + (blocks % per != 0);
    if (p < 2) {
        *bytes = k->m;
        return 1;
    }
    const size_t full = per * k->align, last = k->n - (p - 1) * full;
    *bytes = (double)(p - 1) * piece_bytes(k, full) + piece_bytes(k, last);
    return p;
}

/* The reduce-scatter's segments (compress/aggregate.c): ceil(n / align)
 * blocks, the first blocks % N segments one block longer, the last cut at
 * n. The most any rank sends: rank r sends every piece but its own and
 * forwards every owner message but its successor's, 2 T - b_r - b_{r+1}
 * for segment messages b_i totalling T. 0 if the codec is not cut. */
static double rs_sent(const model_codec *k, int N) {
    if (!k->align) return 0;
    const size_t blocks = k->n / k->align + (k->n % k->align != 0);
    if (blocks < (size_t)N) return 0;
    const size_t q = blocks / (size_t)N, rem = blocks % (size_t)N;
    /* the last segment (never one of the longer ones, rem < N) holds q
     * blocks, the last of them cut at n; three lengths at most */
    const size_t last_len = k->n - (blocks - q) * k->align;
    const double b_long = piece_bytes(k, (q + 1) * k->align), b_short = piece_bytes(k, q * k->align);
    const double b_last = piece_bytes(k, last_len);
    double total = 0;
    for (int i = 0; i < N; i++)
        total += i == N - 1 ? b_last : (size_t)i < rem ? b_long : b_short;
    double most = 0;
    for (int r = 0; r < N; r++) {
        const int s = (r + 1) % N;
        double br = r == N - 1 ? b_last : (size_t)r < rem ? b_long : b_short;
        double bs = s == N - 1 ? b_last : (size_t)s < rem ? b_long : b_short;
        if (2 * total - br - bs > most) most = 2 * total - br - bs;
    }
    return most;
}

/* The pipelined all-gather runs at N ranks (algos/coll/pipe_allreduce.c: at
 * least two pieces, and two pieces' requests beside the digests' fit the
 * communicator's 64); *P its pieces, *all one copy of their bytes. */
static int pipe_runs(const model_codec *k, int N, size_t *P, double *all) {
    const size_t per_piece = (k->fixed ? 2u : 4u) * (size_t)(N - 1);
    *P = pieces(k, all);
    return *P > 1 && 2 * (size_t)(N - 1) + 2 * per_piece <= MAX_REQS;
}

typedef struct {
    double t, bytes; /* seconds, payload + framing bytes per rank */
    int ok;
} pred;

static double link_bps(const ar_options *o, int N) {
    double b = o->model_link_gbps * 1e9 / 8;
    return o->model_shared ? b / N : b;
}

static pred predict(const ar_options *o, const model_codec *k, const char *algo, int N) {
    const double a = o->model_alpha_us * 1e-6, B = link_bps(o, N), n = (double)k->n;
    pred p = {0, 0, 1};
    if (!strcmp(algo, "dense-ring")) {
        p.bytes = 2.0 * (N - 1) / N * 4 * n;
        p.t = 2.0 * (N - 1) * a + p.bytes / B + (double)(N - 1) / N * n * k->add;
    } else if (!strcmp(algo, "gather")) {
        p.bytes = (N - 1) * k->m + 8.0 * (N - 1);
        p.t = 2.0 * (N - 1) * a + p.bytes / B + k->e + N * k->d;
    } else if (!strcmp(algo, "gather-pipe")) {
        double all;
        size_t P;
        if (!pipe_runs(k, N, &P, &all)) return (pred){0, 0, 0};
        p.bytes = (N - 1) * all + 8.0 * (N - 1) * (k->fixed ? 1 : 1 + (double)P);
        double C = k->e + N * k->d, W = a + p.bytes / B;
        p.t = fmax(C, W) + fmin(C, W) / (double)P + a;
    } else if (!strcmp(algo, "rs")) {
        double sent = rs_sent(k, N);
        if (sent <= 0 || N < 2) return (pred){0, 0, 0};
        double framing = (N - 1) * (8.0 * N + 16);
        p.bytes = sent + framing;
        p.t = (2.0 * (N - 1) + ceil((N - 1) / RS_WINDOW)) * a + p.bytes / B +
              k->e * (1 + 1.0 / N) + 2 * k->d;
    } else {
        p.ok = 0;
    }
    return p;
}

/* terse's default choice (algos/coll/allreduce.c), for the table's marker. */
static const char *auto_algo(const model_codec *k, int N) {
    const double M = k->m;
    if (N >= 4 && M / N >= 16384 && (double)N * M > 8.0 * (double)k->n && k->align &&
        k->n / k->align + (k->n % k->align != 0) >= (size_t)N)
        return "rs";
    double all;
    size_t P;
    return pipe_runs(k, N, &P, &all) ? "gather-pipe" : "gather";
}

static int measure_codec(const char *spec, size_t rows, size_t cols, model_codec *k) {
    memset(k, 0, sizeof *k);
    k->spec = spec;
    k->rows = rows;
    k->cols = cols;
    k->n = rows * cols;
    terse_codec *c = NULL;
    if (terse_codec_create(spec, rows, cols, &c) != TERSE_OK) return -1;
    terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
    terse_codec_get_traits(c, &t);
    k->fixed = t.fixed_size;
    k->align = t.segment_align;
    k->options = t.segment_options;
    snprintf(k->child, sizeof k->child, "%s", terse_codec_spec(c));
    char *ef = strstr(k->child, "ef=1");
    if (ef) ef[3] = '0';
    const size_t bound = terse_codec_bound(c);
    float *x = bench_alloc(k->n * sizeof(float)), *y = bench_alloc(k->n * sizeof(float));
    unsigned char *msg = malloc(bound);
    int rc = x && y && msg ? 0 : -1;
    double te[MODEL_REPEATS], td[MODEL_REPEATS], ta[MODEL_REPEATS];
    size_t len = 0;
    if (!rc) bench_gradient_fill(x, k->n, 0xa11ed0ceu);
    for (int i = 0; !rc && i < MODEL_REPEATS; i++) {
        double t0 = bench_now();
        if (terse_encode(c, x, msg, bound, &len) != TERSE_OK) rc = -1;
        te[i] = bench_now() - t0;
        t0 = bench_now();
        if (!rc && terse_decode(c, msg, len, y, 1.0f, i > 0) != TERSE_OK) rc = -1;
        td[i] = bench_now() - t0;
        t0 = bench_now();
        for (size_t j = 0; j < k->n; j++) y[j] += x[j];
        ta[i] = bench_now() - t0;
    }
    if (!rc) {
        k->e = bench_median(te, MODEL_REPEATS);
        k->d = bench_median(td, MODEL_REPEATS);
        k->add = bench_median(ta, MODEL_REPEATS) / (double)k->n;
        k->m = k->fixed ? (double)bound : (double)len;
    }
    if (y) {
        volatile float sink = y[0]; /* the adds are used */
        (void)sink;
    }
    terse_codec_free(c);
    free(x);
    free(y);
    free(msg);
    return rc;
}

static void print_bytes(double b, int exact) {
    if (b >= 1e9) printf(" %s%8.3f GB", exact ? " " : "~", b / 1e9);
    else if (b >= 1e6) printf(" %s%8.3f MB", exact ? " " : "~", b / 1e6);
    else printf(" %s%8.1f kB", exact ? " " : "~", b / 1e3);
}

void ar_model_report(const ar_options *o, const ar_row *rows, int n_rows) {
    static const char *const algos[] = {"dense-ring", "gather", "gather-pipe", "rs"};
    static const int counts[] = {8, 16, 32, 64, 128, 256, 512, 1024};
    printf("\n# model (--model): a message of m bytes costs alpha + m / B; alpha %.1f us, B %.3g "
           "Gbit/s per rank%s;\n#   codec speeds measured in this process on the same data; "
           "pipeline pieces of %zu bytes (TERSE_PIPELINE_BYTES)\n",
           o->model_alpha_us, o->model_link_gbps,
           o->model_shared ? " shared by all N ranks (B / N each)" : "", pipe_bytes_setting());
    for (size_t si = 0; si < o->n_specs; si++) {
        if (!strcmp(o->specs[si], AR_DENSE)) continue;
        for (size_t zi = 0; zi < o->n_sizes; zi++) {
            size_t r, c;
            ar_shape_for(o, o->specs[si], o->sizes[zi], &r, &c);
            model_codec k;
            if (measure_codec(o->specs[si], r, c, &k) != 0) {
                printf("# %s, %zu bytes: cannot be measured here: %s\n", o->specs[si],
                       o->sizes[zi], terse_last_error());
                continue;
            }
            printf("#\n# codec %s, %zu bytes (%zu x %zu): encode %.2f ms, decode %.2f ms, message "
                   "%s%.0f bytes; fp32 add %.2f ms\n",
                   k.spec, o->sizes[zi], r, c, 1e3 * k.e, 1e3 * k.d, k.fixed ? "" : "~", k.m,
                   1e3 * k.add * (double)k.n);
            /* the check: the rows measured in this run at N = -n */
            for (int i = 0; i < n_rows; i++) {
                const ar_row *m = &rows[i];
                if (m->is_mpi || !m->ok || strcmp(m->spec, o->specs[si]) || m->bytes != o->sizes[zi])
                    continue;
                /* the measured ranks shared this machine's cores: their
                 * codec work ran up to N / cores times slower than here */
                model_codec kc = k;
                const long cores = sysconf(_SC_NPROCESSORS_ONLN);
                const double share = cores > 0 && m->nranks > cores
                                         ? (double)m->nranks / (double)cores : 1.0;
                kc.e *= share;
                kc.d *= share;
                kc.add *= share;
                pred p = predict(o, &kc, m->algo, m->nranks);
                if (!p.ok) {
                    printf("# check, %d ranks: measured %s %.3f ms, %.0f bytes/rank (not modelled)\n",
                           m->nranks, m->algo, 1e3 * m->time_s, m->wire_sent);
                    continue;
                }
                printf("# check, %d ranks, %s: measured %.3f ms, predicted %.3f ms (x%.2f; "
                       "codec x%.1f for %d ranks on %ld cores); bytes/rank measured %.0f, "
                       "predicted %s%.0f\n",
                       m->nranks, m->algo, 1e3 * m->time_s, 1e3 * p.t, p.t / m->time_s, share,
                       m->nranks, cores, m->wire_sent, k.fixed ? "" : "~", p.bytes);
            }
            printf("# %6s %12s", "ranks", "auto");
            for (size_t a = 0; a < 4; a++) printf(" | %11s %12s", algos[a], "bytes/rank");
            printf("\n");
            for (size_t ni = 0; ni < sizeof counts / sizeof counts[0]; ni++) {
                const int N = counts[ni];
                printf("  %6d %12s", N, auto_algo(&k, N));
                for (size_t a = 0; a < 4; a++) {
                    pred p = predict(o, &k, algos[a], N);
                    if (!p.ok) {
                        printf(" | %11s %12s", "-", "-");
                        continue;
                    }
                    printf(" | %8.3f ms", 1e3 * p.t);
                    print_bytes(p.bytes, k.fixed || a == 0);
                }
                printf("\n");
            }
        }
    }
}
