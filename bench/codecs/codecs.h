/* codecs.h -- what `terse-bench codecs` measures for one (codec, size), and
 * the two ways it prints the results (codecs_report.c). */
#ifndef TERSE_BENCH_CODECS_H
#define TERSE_BENCH_CODECS_H

#include <stddef.h>

typedef enum { ROW_OK, ROW_UNAVAILABLE, ROW_FAILED } row_status;

/* One (codec spec, size). */
typedef struct {
    const char *spec;
    row_status status;
    char canon[256];  /* terse_codec_spec(), when created */
    char error[512];  /* why not ROW_OK */
    size_t rows, cols, bytes;
    double ratio, rel_err;
    double enc_s, dec_s, acc_s; /* median seconds per call */
    int has_flops;              /* a PowerSGD low-rank (not dense fallback) row */
    double enc_gflops, sgemm_gflops;
} row;

/* What every row of one size is set against. */
typedef struct {
    const char *label; /* "16M" */
    size_t n;          /* floats */
    double memcpy_gbps;                 /* median */
    double memcpy_min_gbps, memcpy_max_gbps; /* the spread shows the noise */
    int memcpy_samples;
    int repeats;
} size_baseline;

/* The aligned table: an intro once, then one block per size. */
void codecs_report_intro(int repeats);
void codecs_report_table(const size_baseline *b, const row *rows, size_t n_rows, int spec_width);

/* CSV: one header row, then one row per (codec, size). */
void codecs_report_csv_header(void);
void codecs_report_csv(const size_baseline *b, const row *rows, size_t n_rows);

#endif
