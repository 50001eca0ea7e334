/* The output of `terse-bench codecs`: an aligned table for people, CSV for
 * scripts. Every speed is printed next to its ratio to the memcpy baseline
 * of the same size. */
#include <cblas.h>
#include <stdio.h>
#include <string.h>

#include <terse.h>

#include "codecs/codecs.h"
#include "core/bench.h"

void codecs_report_intro(int repeats) {
    printf("terse-bench codecs: libterse %s, OpenBLAS %d thread(s), median of %d repeat(s) "
           "(warm-up not counted)\n",
           terse_version_string(), openblas_get_num_threads(), repeats);
    printf("  input    n fp32 values, Gaussian-like N(0,1), fixed seed; powersgd: a near-square "
           "rows x cols matrix, others n x 1\n"
           "  ratio    4n / message bytes (32-byte header included)\n"
           "  rel.err  ||x - D(E(x))|| / ||x|| of the first encode\n"
           "  GB/s     input bytes (4n) / median seconds / 1e9, for encode (enc), decode (dec) "
           "and decode-accumulate dst += D (acc)\n"
           "  /mc      the GB/s to its left / memcpy GB/s of 4n bytes, same size, same run\n"
           "  GF/s     powersgd encode GFLOP/s, 4*rows*cols*R flops (P = M Q, Q = M^T P; QR not "
           "counted); sgemm: cblas_sgemm on the same two products; /sg = GF/s / sgemm\n");
}

/* A speed with about three significant digits in fixed notation (16.0,
 * 4.81, 0.0512), as %g would drop trailing zeros or switch to exponents. */
static void speed(double gbps, double memcpy_gbps) {
    int decimals = gbps >= 100 ? 0 : gbps >= 10 ? 1 : gbps >= 1 ? 2 : gbps >= 0.1 ? 3 : 4;
    printf(" %9.*f %6.3f", decimals, gbps, gbps / memcpy_gbps);
}

void codecs_report_table(const size_baseline *b, const row *rows, size_t n_rows, int w) {
    double mc = b->memcpy_gbps, g = 4e-9 * (double)b->n;
    printf("\nsize %s = %zu floats (%.1f MB): memcpy %.2f GB/s (median of %d samples taken "
           "before and after the codecs; range %.2f..%.2f)\n",
           b->label, b->n, 4e-6 * (double)b->n, mc, b->memcpy_samples, b->memcpy_min_gbps,
           b->memcpy_max_gbps);
    printf("%-*s  %-11s %8s %9s %9s %6s %9s %6s %9s %6s %7s %7s %5s\n", w, "codec", "shape",
           "ratio", "rel.err", "enc GB/s", "/mc", "dec GB/s", "/mc", "acc GB/s", "/mc", "GF/s",
           "sgemm", "/sg");
    for (size_t i = 0; i < n_rows; i++) {
        const row *r = &rows[i];
        char shape[48];
        snprintf(shape, sizeof shape, "%zux%zu", r->rows, r->cols);
        printf("%-*s  %-11s", w, r->spec, shape);
        if (r->status != ROW_OK) {
            printf(" %s: %s\n", r->status == ROW_UNAVAILABLE ? "unavailable" : "FAILED",
                   r->error);
            continue;
        }
        printf(" %8.2f %9.2e", r->ratio, r->rel_err);
        speed(g / r->enc_s, mc);
        speed(g / r->dec_s, mc);
        speed(g / r->acc_s, mc);
        if (r->has_flops)
            printf(" %7.2f %7.2f %5.2f\n", r->enc_gflops, r->sgemm_gflops,
                   r->enc_gflops / r->sgemm_gflops);
        else
            printf(" %7s %7s %5s\n", "-", "-", "-");
    }
}

/* RFC 4180: quote a field that holds a comma, quote or line break. */
static void csv_text(const char *s) {
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, stdout);
        return;
    }
    bench_csv_quoted(s);
}

/* Fields that may hold a comma (canonical_spec, error) come last, so a
 * script can split the fixed-format prefix naively. */
void codecs_report_csv_header(void) {
    puts("size,n,rows,cols,spec,status,bytes,ratio,rel_err,enc_gbps,enc_vs_memcpy,dec_gbps,"
         "dec_vs_memcpy,acc_gbps,acc_vs_memcpy,memcpy_gbps,memcpy_min_gbps,memcpy_max_gbps,"
         "memcpy_samples,repeats,enc_gflops,"
         "sgemm_gflops,enc_vs_sgemm,canonical_spec,error");
}

void codecs_report_csv(const size_baseline *b, const row *rows, size_t n_rows) {
    static const char *const status_names[] = {"ok", "unavailable", "failed"};
    double mc = b->memcpy_gbps, g = 4e-9 * (double)b->n;
    for (size_t i = 0; i < n_rows; i++) {
        const row *r = &rows[i];
        printf("%s,%zu,%zu,%zu,", b->label, b->n, r->rows, r->cols);
        csv_text(r->spec);
        printf(",%s,", status_names[r->status]);
        if (r->status == ROW_OK)
            printf("%zu,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,", r->bytes, r->ratio, r->rel_err,
                   g / r->enc_s, g / r->enc_s / mc, g / r->dec_s, g / r->dec_s / mc,
                   g / r->acc_s, g / r->acc_s / mc);
        else
            printf(",,,,,,,,,");
        printf("%.6g,%.6g,%.6g,%d,%d,", mc, b->memcpy_min_gbps, b->memcpy_max_gbps,
               b->memcpy_samples, b->repeats);
        if (r->has_flops)
            printf("%.6g,%.6g,%.6g,", r->enc_gflops, r->sgemm_gflops,
                   r->enc_gflops / r->sgemm_gflops);
        else
            printf(",,,");
        csv_text(r->canon);
        putchar(',');
        csv_text(r->error);
        putchar('\n');
    }
}
