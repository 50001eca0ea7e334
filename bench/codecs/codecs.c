/* terse-bench codecs: every codec's compression ratio, error, and encode /
 * decode speed, each speed set against memcpy measured in the same run on
 * the same size. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <terse.h>

#include "core/bench.h"
#include "codecs/codecs.h"

static const char *const default_specs[] = {
    "none",           "fp16",           "bf16",           "int8",     "qsgd:bits=4",
    "qsgd:bits=8",    "terngrad",       "sign",           "topk:ratio=0.01",
    "topk:ratio=0.001", "randk:ratio=0.01", "powersgd:rank=4", "vq",
};
#define N_DEFAULT_SPECS (sizeof default_specs / sizeof default_specs[0])
static const size_t default_sizes[] = {1u << 20, 4u << 20, 16u << 20, 64u << 20};
#define N_DEFAULT_SIZES (sizeof default_sizes / sizeof default_sizes[0])
#define MAX_SIZES 64
#define MAX_REPEATS 1000
#define GRADIENT_SEED 0x7e55eu

typedef struct {
    const char **specs;
    size_t n_specs;
    int user_specs; /* the specs came from -c */
    size_t sizes[MAX_SIZES];
    size_t n_sizes;
    int repeats;
    int csv;
    int quiet;
} options;

static void usage(FILE *f) {
    fprintf(f,
"usage: terse-bench codecs [-c SPEC]... [-s SIZES] [-r N] [--quick] [--csv] [-q]\n"
"\n"
"Encode and decode a fixed pseudo-random gradient with each codec and report\n"
"compression, error and speed. Speeds are set against memcpy measured in the\n"
"same run on the same size, so numbers from different machines compare.\n"
"\n"
"options:\n"
"  -c, --codec SPEC   a codec spec as terse_codec_create takes it, e.g.\n"
"                     'topk:ratio=0.01,ef=1'; repeat for several. A spec\n"
"                     the library rejects as malformed is a usage error; a\n"
"                     codec that fails to create otherwise gets an\n"
"                     'unavailable' row. Default:\n"
"                    ");
    int col = 20;
    for (size_t i = 0; i < N_DEFAULT_SPECS; i++) {
        int w = 1 + (int)strlen(default_specs[i]);
        if (col + w > 78) {
            fprintf(f, "\n                    ");
            col = 20;
        }
        fprintf(f, " %s", default_specs[i]);
        col += w;
    }
    fprintf(f,
"\n"
"  -s, --sizes LIST   comma-separated element counts, each N, NK (x1024) or NM\n"
"                     (x1048576). Default: 1M,4M,16M,64M. A size needs about\n"
"                     16n bytes plus the codec's own (64M: about 1.5 GB)\n"
"  -r, --repeats N    timed samples per measurement, 1..%d (default 5); the\n"
"                     median is reported. A warm-up call before them is not\n"
"                     counted. Calls shorter than %g ms are batched, so a\n"
"                     sample is the mean of enough calls to last that long.\n"
"      --quick        a fast smoke run: -s 1M -r 3 (an explicit -s or -r wins)\n"
"      --csv          machine-readable CSV with a header row instead of the table\n"
"  -q, --quiet        no progress lines on stderr\n"
"  -h, --help         this text\n"
"\n"
"method: for each size, memcpy is timed, then every codec, then memcpy again;\n"
"the memcpy baseline is the median of all those samples (4n bytes between two\n"
"separately allocated buffers whose pages were touched first). Their range,\n"
"printed too, shows how noisy the machine was during the run. Each (codec,\n"
"size) gets one codec object: encode is called repeatedly (its step advances,\n"
"as in training); the first encode gives ratio and rel.err. The input is n\n"
"fp32 values, Gaussian-like with mean 0 and variance 1, from a fixed seed.\n"
"powersgd sees it as a near-square rows x cols matrix (1M -> 1024x1024,\n"
"64M -> 8192x8192); every other codec as n x 1.\n"
"\n"
"columns (table; CSV names in brackets):\n"
"  [size, n, repeats]    the size as labelled, in floats; -r\n"
"  codec [spec]          the spec as given; CSV also has canonical_spec\n"
"  shape [rows, cols]    the tensor shape given to terse_codec_create\n"
"  ratio [ratio]         4n / message bytes, 32-byte header included [bytes]\n"
"  rel.err [rel_err]     ||x - D(E(x))|| / ||x|| of the first encode, in double\n"
"  enc GB/s [enc_gbps]   encode speed in input bytes: 4n / median seconds / 1e9\n"
"  dec GB/s [dec_gbps]   decode (dst = D(m)) speed, likewise\n"
"  acc GB/s [acc_gbps]   decode-accumulate (dst += D(m)) speed, likewise\n"
"  /mc [*_vs_memcpy]     the speed to its left / memcpy GB/s of the same size\n"
"                        [memcpy_gbps; the fastest and slowest copies:\n"
"                        memcpy_min_gbps, memcpy_max_gbps; memcpy_samples]\n"
"  GF/s [enc_gflops]     powersgd only: encode GFLOP/s counting 4*rows*cols*R\n"
"                        flops (P = M Q and Q = M^T P, 2*rows*cols*R each); the\n"
"                        QR orthonormalisation of P is not counted\n"
"  sgemm [sgemm_gflops]  cblas_sgemm GFLOP/s doing the same two products with\n"
"                        the same shapes and OpenBLAS threads, in this run\n"
"  /sg [enc_vs_sgemm]    GF/s / sgemm\n"
"  [status]              ok, unavailable (the codec failed to create: the row\n"
"                        says why, [error]) or failed (encode or decode failed)\n"
"\n"
"exit status: 0 ok (unavailable codecs included), 1 runtime failure (a codec\n"
"failed after it was created, or memory ran out), 2 usage error.\n",
            MAX_REPEATS, 1e3 * BENCH_MIN_SAMPLE_SECONDS);
}

/* ---------------------------------------------------------------- options */

static int usage_error(const char *fmt, const char *what) {
    return bench_usage_error("terse-bench codecs", fmt, what);
}

static int parse_sizes(const char *list, options *o) {
    char buf[1024];
    if (strlen(list) >= sizeof buf) return usage_error("size list '%s' is too long", list);
    strcpy(buf, list);
    o->n_sizes = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (o->n_sizes == MAX_SIZES) return usage_error("too many sizes in '%s'", list);
        if (bench_parse_count(tok, &o->sizes[o->n_sizes]) != 0 ||
            o->sizes[o->n_sizes] > TERSE_MAX_ELEMENTS)
            return usage_error("bad size '%s' in -s (want N, NK or NM)", tok);
        o->n_sizes++;
    }
    if (o->n_sizes == 0) return usage_error("empty size list '%s' in -s", list);
    return 0;
}

/* Returns 0 to run, -1 after --help, or an exit code. Accepts "-c X",
 * "-cX", "--codec X" and "--codec=X" alike. */
static int parse_args(int argc, char **argv, options *o) {
    static const char *specs[256];
    int quick = 0, have_sizes = 0, have_repeats = 0;
    o->specs = specs;
    o->n_specs = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        size_t name_len = eq ? (size_t)(eq - a) : strlen(a);
        char opt = 0;
        if (a[0] == '-' && a[1] && a[1] != '-' && strchr("csr", a[1])) {
            opt = a[1];
            val = a[2] ? a + 2 : NULL;
        } else if (name_len == 7 && strncmp(a, "--codec", 7) == 0) {
            opt = 'c';
        } else if (name_len == 7 && strncmp(a, "--sizes", 7) == 0) {
            opt = 's';
        } else if (name_len == 9 && strncmp(a, "--repeats", 9) == 0) {
            opt = 'r';
        }
        if (opt) {
            if (eq) val = eq + 1;
            if (!val) {
                if (i + 1 >= argc) return usage_error("option '%s' needs a value", a);
                val = argv[++i];
            }
            if (opt == 'c') {
                if (o->n_specs == sizeof specs / sizeof specs[0])
                    return usage_error("too many -c options (at '%s')", val);
                if (!val[0]) return usage_error("empty codec spec in '%s'", a);
                specs[o->n_specs++] = val;
            } else if (opt == 's') {
                int rc = parse_sizes(val, o);
                if (rc) return rc;
                have_sizes = 1;
            } else {
                char *end;
                long r = strtol(val, &end, 10);
                if (*end || end == val || r < 1 || r > MAX_REPEATS)
                    return usage_error("bad repeat count '%s' in -r (want 1..1000)", val);
                o->repeats = (int)r;
                have_repeats = 1;
            }
        } else if (eq) {
            return usage_error("unknown option '%s'", a);
        } else if (strcmp(a, "--quick") == 0) {
            quick = 1;
        } else {
            int rc = bench_common_arg("terse-bench codecs", a, usage, &o->csv, &o->quiet, NULL);
            if (rc) return rc;
        }
    }
    o->user_specs = o->n_specs > 0;
    if (o->n_specs == 0)
        for (size_t i = 0; i < N_DEFAULT_SPECS; i++) specs[o->n_specs++] = default_specs[i];
    if (!have_sizes) {
        o->n_sizes = quick ? 1 : N_DEFAULT_SIZES;
        memcpy(o->sizes, default_sizes, o->n_sizes * sizeof o->sizes[0]);
    }
    if (!have_repeats) o->repeats = quick ? 3 : 5;
    return 0;
}

/* ---------------------------------------------------------------- shapes */

static int is_powersgd(const char *spec) {
    return strncmp(spec, "powersgd", 8) == 0 && (spec[8] == '\0' || spec[8] == ':');
}

/* The most nearly square rows x cols == n with rows <= cols. */
static void matrix_shape(size_t n, size_t *rows, size_t *cols) {
    size_t r = (size_t)sqrt((double)n);
    while (r > 1 && (r * r > n)) r--;
    while ((r + 1) * (r + 1) <= n) r++;
    while (n % r) r--;
    *rows = r;
    *cols = n / r;
}

static void shape_for(const char *spec, size_t n, size_t *rows, size_t *cols) {
    if (is_powersgd(spec)) {
        matrix_shape(n, rows, cols);
    } else {
        *rows = n;
        *cols = 1;
    }
}

/* R from a canonical "powersgd:rank=R,..." spec; 0 if absent. */
static size_t spec_rank(const char *canon) {
    const char *p = strchr(canon, ':');
    while (p) {
        if (strncmp(p + 1, "rank=", 5) == 0) return (size_t)strtoull(p + 6, NULL, 10);
        p = strchr(p + 1, ',');
    }
    return 0;
}

/* ---------------------------------------------------------------- timing */

typedef struct {
    terse_codec *codec;
    const float *x;
    float *y;
    void *msg;
    size_t cap, len;
    terse_status st;
} codec_job;

static int encode_op(void *arg) {
    codec_job *j = arg;
    j->st = terse_encode(j->codec, j->x, j->msg, j->cap, &j->len);
    return j->st != TERSE_OK;
}

static int decode_op(void *arg) {
    codec_job *j = arg;
    j->st = terse_decode(j->codec, j->msg, j->len, j->y, 1.0f, 0);
    return j->st != TERSE_OK;
}

static int accumulate_op(void *arg) {
    codec_job *j = arg;
    j->st = terse_decode(j->codec, j->msg, j->len, j->y, 1.0f, 1);
    return j->st != TERSE_OK;
}

typedef struct {
    int rows, cols, rank;
    const float *m;
    const float *q;
    float *p, *q_out;
} gemm_job;

/* PowerSGD's two products with the codec's shapes: P = M Q, then
 * Q' = M^T P. Q' goes to its own buffer so repeated calls keep the same
 * input magnitudes. */
static int gemm_op(void *arg) {
    gemm_job *g = arg;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->rows, g->rank, g->cols, 1.0f, g->m,
                g->cols, g->q, g->rank, 0.0f, g->p, g->rank);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, g->cols, g->rank, g->rows, 1.0f, g->m,
                g->cols, g->p, g->rank, 0.0f, g->q_out, g->rank);
    return 0;
}

/* GFLOP/s of gemm_op, or NAN if its buffers cannot be had. */
static double sgemm_gflops(const float *m, size_t rows, size_t cols, size_t rank, int repeats,
                           double *samples) {
    float *p = bench_alloc(rows * rank * sizeof(float));
    float *q = bench_alloc(cols * rank * sizeof(float));
    float *q_out = bench_alloc(cols * rank * sizeof(float));
    double gflops = NAN;
    if (p && q && q_out) {
        bench_gradient_fill(q, cols * rank, GRADIENT_SEED + 1);
        gemm_job g = {(int)rows, (int)cols, (int)rank, m, q, p, q_out};
        bench_time(gemm_op, &g, repeats, -1.0, samples);
        double seconds = bench_median(samples, (size_t)repeats);
        gflops = 4e-9 * (double)rows * (double)cols * (double)rank / seconds;
    }
    free(p);
    free(q);
    free(q_out);
    return gflops;
}

static void row_fail(row *r, row_status st, const char *what) {
    r->status = st;
    snprintf(r->error, sizeof r->error, "%s%s", what, terse_last_error());
}

static double rel_error(const float *x, const float *y, size_t n) {
    double err = 0, nrm = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - (double)y[i];
        err += d * d;
        nrm += (double)x[i] * (double)x[i];
    }
    return sqrt(err / nrm);
}

/* Measure one (spec, size). x and y hold n floats; samples holds repeats. */
static void run_codec(const char *spec, const float *x, float *y, size_t n, int repeats,
                      double *samples, row *r) {
    memset(r, 0, sizeof *r);
    r->spec = spec;
    shape_for(spec, n, &r->rows, &r->cols);
    codec_job j = {0};
    if (terse_codec_create(spec, r->rows, r->cols, &j.codec) != TERSE_OK) {
        row_fail(r, ROW_UNAVAILABLE, "");
        return;
    }
    snprintf(r->canon, sizeof r->canon, "%s", terse_codec_spec(j.codec));
    j.x = x;
    j.y = y;
    j.cap = terse_codec_bound(j.codec);
    j.msg = bench_alloc(j.cap);
    if (!j.msg) {
        r->status = ROW_FAILED;
        snprintf(r->error, sizeof r->error, "cannot allocate a %zu-byte message buffer", j.cap);
        goto done;
    }

    /* The first encode is the warm-up and the one whose error we report. */
    double t0 = bench_now();
    if (encode_op(&j)) {
        row_fail(r, ROW_FAILED, "encode: ");
        goto done;
    }
    double warm = bench_now() - t0;
    r->bytes = j.len;
    r->ratio = 4.0 * (double)n / (double)j.len;
    if (decode_op(&j)) {
        row_fail(r, ROW_FAILED, "decode: ");
        goto done;
    }
    r->rel_err = rel_error(x, y, n);

    if (bench_time(encode_op, &j, repeats, warm, samples)) {
        row_fail(r, ROW_FAILED, "encode: ");
        goto done;
    }
    r->enc_s = bench_median(samples, (size_t)repeats);
    if (bench_time(decode_op, &j, repeats, -1.0, samples)) {
        row_fail(r, ROW_FAILED, "decode: ");
        goto done;
    }
    r->dec_s = bench_median(samples, (size_t)repeats);
    if (bench_time(accumulate_op, &j, repeats, -1.0, samples)) {
        row_fail(r, ROW_FAILED, "decode-accumulate: ");
        goto done;
    }
    r->acc_s = bench_median(samples, (size_t)repeats);

    terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
    size_t rank = spec_rank(r->canon);
    if (terse_codec_get_traits(j.codec, &t) == TERSE_OK && t.name &&
        strcmp(t.name, "powersgd") == 0 && rank > 0 &&
        (r->rows + r->cols) * rank * 2 < r->rows * r->cols) {
        double flops = 4.0 * (double)r->rows * (double)r->cols * (double)rank;
        r->has_flops = 1;
        r->enc_gflops = 1e-9 * flops / r->enc_s;
        r->sgemm_gflops = sgemm_gflops(x, r->rows, r->cols, rank, repeats, samples);
    }
    r->status = ROW_OK;
done:
    free(j.msg);
    terse_codec_free(j.codec);
}

/* ---------------------------------------------------------------- driver */

/* A -c spec the library rejects as malformed is the user's mistake (exit
 * 2); any other creation failure (e.g. a codec not built yet), and every
 * failure of a default spec, is reported in its row. Checked up front so a
 * typo does not cost a whole run. */
static int check_specs(const options *o) {
    if (!o->user_specs) return 0;
    size_t n = o->sizes[0];
    for (size_t i = 1; i < o->n_sizes; i++)
        if (o->sizes[i] < n) n = o->sizes[i];
    for (size_t i = 0; i < o->n_specs; i++) {
        size_t rows, cols;
        terse_codec *c = NULL;
        shape_for(o->specs[i], n, &rows, &cols);
        terse_status s = terse_codec_create(o->specs[i], rows, cols, &c);
        terse_codec_free(c);
        if (s == TERSE_ERR_INVALID || s == TERSE_ERR_NOT_FOUND) {
            fprintf(stderr, "terse-bench codecs: bad codec spec '%s' in -c: %s\n", o->specs[i],
                    terse_last_error());
            return BENCH_EXIT_USAGE;
        }
    }
    return 0;
}

/* Run every codec on one size between two memcpy measurements and print
 * the block. Returns the number of failed rows, or -1 if memory ran out. */
static int run_size(const options *o, size_t n, size_t *progress, int spec_width) {
    size_t total = o->n_specs * o->n_sizes, bytes = n * sizeof(float);
    int reps = o->repeats, failed = 0;
    char label[24];
    bench_count_label(n, label, sizeof label);
    float *x = bench_alloc(bytes), *y = bench_alloc(bytes);
    void *mc_src = bench_alloc(bytes), *mc_dst = bench_alloc(bytes);
    double *samples = malloc((size_t)reps * sizeof(double));
    double *mc = malloc(2 * (size_t)reps * sizeof(double));
    row *rows = calloc(o->n_specs, sizeof(row));
    if (!x || !y || !mc_src || !mc_dst || !samples || !mc || !rows) {
        fprintf(stderr, "terse-bench codecs: out of memory for size %s (%zu floats)\n", label, n);
        failed = -1;
        goto done;
    }
    bench_gradient_fill(x, n, GRADIENT_SEED);
    memset(y, 0, bytes);
    memset(mc_src, 0x5a, bytes); /* touch every page before timing */
    memset(mc_dst, 0, bytes);

    if (!o->quiet) fprintf(stderr, "memcpy %s (before) ...\n", label);
    bench_time_memcpy(mc_dst, mc_src, bytes, reps, mc);
    for (size_t i = 0; i < o->n_specs; i++) {
        if (!o->quiet)
            fprintf(stderr, "[%zu/%zu] %s %s ...\n", ++*progress, total, o->specs[i], label);
        run_codec(o->specs[i], x, y, n, reps, samples, &rows[i]);
        if (rows[i].status == ROW_FAILED) failed++;
    }
    if (!o->quiet) fprintf(stderr, "memcpy %s (after) ...\n", label);
    bench_time_memcpy(mc_dst, mc_src, bytes, reps, mc + reps);
    double mc_gbps = 4e-9 * (double)n / bench_median(mc, 2 * (size_t)reps);

    /* bench_median sorted the samples: the slowest copy is last. */
    size_baseline b = {label, n, mc_gbps, 4e-9 * (double)n / mc[2 * reps - 1],
                       4e-9 * (double)n / mc[0], 2 * reps, reps};
    if (o->csv)
        codecs_report_csv(&b, rows, o->n_specs);
    else
        codecs_report_table(&b, rows, o->n_specs, spec_width);
    fflush(stdout);
done:
    free(x);
    free(y);
    free(mc_src);
    free(mc_dst);
    free(samples);
    free(mc);
    free(rows);
    return failed;
}

int bench_codecs_main(int argc, char **argv) {
    options o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc < 0) return fflush(stdout) == 0 ? BENCH_EXIT_OK : BENCH_EXIT_RUNTIME;
    if (rc) return rc;
    if ((rc = check_specs(&o)) != 0) return rc;

    int spec_width = 5;
    for (size_t i = 0; i < o.n_specs; i++)
        if ((int)strlen(o.specs[i]) > spec_width) spec_width = (int)strlen(o.specs[i]);
    if (o.csv)
        codecs_report_csv_header();
    else
        codecs_report_intro(o.repeats);

    size_t progress = 0;
    int failed = 0, oom = 0;
    for (size_t s = 0; s < o.n_sizes; s++) {
        int f = run_size(&o, o.sizes[s], &progress, spec_width);
        if (f < 0) {
            oom = 1;
            progress += o.n_specs;
        } else {
            failed += f;
        }
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "terse-bench codecs: cannot write the results\n");
        return BENCH_EXIT_RUNTIME;
    }
    if (failed) fprintf(stderr, "terse-bench codecs: %d codec run(s) failed\n", failed);
    return failed || oom ? BENCH_EXIT_RUNTIME : BENCH_EXIT_OK;
}
