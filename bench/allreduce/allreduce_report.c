/* terse-bench allreduce: the records that carry rows between processes, and
 * the table and CSV a person reads. The column definitions are in the
 * --help text (allreduce.c); the arithmetic for them is here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "allreduce/allreduce.h"
#include "core/bench.h"

/* ---------------------------------------------------------------- numbers */

static int is_dense(const ar_row *r) {
    return r->is_mpi || strcmp(r->spec, AR_DENSE) == 0;
}

/* 2(N-1)/N: the share of the buffer each rank's link carries in a ring
 * all-reduce, which turns algbw into busbw (nccl-tests' PERFORMANCE.md). */
static double bus_factor(int nranks) {
    return nranks > 1 ? 2.0 * (nranks - 1) / nranks : 0.0;
}

/* nccl-tests' algbw and busbw, for every row, compressed or not: size is the
 * fp32 tensor's bytes, whatever the codec put on the wire. */
double ar_algbw(const ar_row *r) {
    return r->time_s > 0 ? 1e-9 * (double)r->bytes / r->time_s : 0.0;
}

double ar_busbw(const ar_row *r) {
    return ar_algbw(r) * bus_factor(r->nranks);
}

/* What each rank's link did carry: wire bytes sent per rank / time. */
double ar_wirebw(const ar_row *r) {
    return r->time_s > 0 ? 1e-9 * r->wire_sent / r->time_s : 0.0;
}

/* t against two parts done apart: against the longer (1: the shorter hid
 * completely behind it) and against both one after the other (1: nothing
 * overlapped). --overlap: the loop and the allreduce; --parts: the codec
 * work and the wire. */
static double vs_max(double t, double a, double b) {
    double m = a > b ? a : b;
    return m > 0 ? t / m : 0.0;
}

static double vs_sum(double t, double a, double b) {
    return a + b > 0 ? t / (a + b) : 0.0;
}

static double overlap_vs_max(const ar_row *r) {
    return vs_max(r->overlap_s, r->compute_s, r->alone_s);
}
static double overlap_vs_sum(const ar_row *r) {
    return vs_sum(r->overlap_s, r->compute_s, r->alone_s);
}
static double parts_vs_max(const ar_row *r) {
    return vs_max(r->time_s, r->codec_alone_s, r->wire_alone_s);
}
static double parts_vs_sum(const ar_row *r) {
    return vs_sum(r->time_s, r->codec_alone_s, r->wire_alone_s);
}

/* ---------------------------------------------------------------- records */

void ar_record_write(FILE *f, const ar_row *r) {
    char spec[sizeof r->spec], provider[sizeof r->provider], error[sizeof r->error];
    /* %.17g: every double reads back bit for bit. The --overlap fields and
     * the algorithm come last, after the error text, so a reader of the
     * first 16 still works. */
    fprintf(f,
            "%s\t%s\t%s\t%d\t%zu\t%zu\t%zu\t%d\t%.17g\t%.17g\t%.17g\t%.17g\t%.17g\t%.17g\t%d\t%s"
            "\t%ld\t%.17g\t%.17g\t%.17g\t%s\t%.17g\t%.17g\t%s\n",
            r->is_mpi ? "mpi" : "terse", bench_field_copy(spec, sizeof spec, r->spec),
            bench_field_copy(provider, sizeof provider, r->provider), r->nranks, r->rows, r->cols,
            r->bytes, r->iters, r->time_s, r->mean_s, r->wire_sent, r->payload_sent, r->codec_s,
            r->net_s, r->ok, bench_field_copy(error, sizeof error, r->error), r->compute_calls,
            r->compute_s, r->alone_s, r->overlap_s, r->algo[0] ? r->algo : "-", r->codec_alone_s,
            r->wire_alone_s, r->topo[0] ? r->topo : "-");
}

int ar_record_parse(char *line, void *record) {
    ar_row *r = record;
    char *f[24];
    int nf = bench_split_tabs(line, f, 24);
    if (nf != 16 && nf != 20 && nf != 21 && nf != 23 && nf != 24) return -1;
    memset(r, 0, sizeof *r);
    if (strcmp(f[0], "mpi") == 0)
        r->is_mpi = 1;
    else if (strcmp(f[0], "terse") != 0)
        return -1;
    bench_field_copy(r->spec, sizeof r->spec, f[1]);
    bench_field_copy(r->provider, sizeof r->provider, f[2]);
    char *end;
    r->nranks = (int)strtol(f[3], &end, 10);
    r->rows = (size_t)strtoull(f[4], &end, 10);
    r->cols = (size_t)strtoull(f[5], &end, 10);
    r->bytes = (size_t)strtoull(f[6], &end, 10);
    r->iters = (int)strtol(f[7], &end, 10);
    r->time_s = strtod(f[8], &end);
    r->mean_s = strtod(f[9], &end);
    r->wire_sent = strtod(f[10], &end);
    r->payload_sent = strtod(f[11], &end);
    r->codec_s = strtod(f[12], &end);
    r->net_s = strtod(f[13], &end);
    r->ok = f[14][0] == '1';
    bench_field_copy(r->error, sizeof r->error, f[15]);
    if (nf >= 21) bench_field_copy(r->algo, sizeof r->algo, f[20]);
    if (nf == 24 && strcmp(f[23], "-") != 0) bench_field_copy(r->topo, sizeof r->topo, f[23]);
    if (nf >= 23) {
        r->codec_alone_s = strtod(f[21], &end);
        r->wire_alone_s = strtod(f[22], &end);
    }
    if (nf >= 20) {
        r->compute_calls = strtol(f[16], &end, 10);
        r->compute_s = strtod(f[17], &end);
        r->alone_s = strtod(f[18], &end);
        r->overlap_s = strtod(f[19], &end);
    }
    if (r->nranks < 1 || r->bytes == 0 || (r->ok && !(r->time_s > 0 && r->mean_s > 0)))
        return -1;
    return 0;
}

/* ---------------------------------------------------------------- output */

void ar_report_begin(const ar_options *o, const char *provider, int nranks, int have_mpi) {
    if (o->csv) {
        printf("spec,provider,nranks,bytes,count,rows,cols,iters,time_us,algbw_gbps,busbw_gbps,"
               "wire_bytes,payload_bytes,wirebw_gbps,mean_us,codec_us,net_us%s%s%s%s,status,error,"
               "algo,topology\n",
               have_mpi ? ",mpi_iters,mpi_time_us,mpi_algbw_gbps,mpi_busbw_gbps,vs_mpi" : "",
               o->overlap_ms > 0 ? ",sgemm_calls,compute_ms,allreduce_ms,overlapped_ms,"
                                   "overlap_vs_max,overlap_vs_sum" : "",
               o->parts ? ",codec_alone_ms,wire_alone_ms,parts_vs_max,parts_vs_sum" : "",
               o->vs_flat ? ",flat_time_us,vs_flat" : "");
        return;
    }
    printf("# terse-bench allreduce: %d rank%s, provider %s, op %s, fp32\n", nranks,
           nranks == 1 ? "" : "s", provider, o->op_avg ? "avg" : "sum");
    printf("# time: median over iterations of the slowest rank's time; GB/s = 1e9 B/s\n");
    printf("# algbw = size / time, size the fp32 tensor's bytes; busbw = algbw * 2(N-1)/N:\n"
           "#   nccl-tests' definitions, for every row, compressed or not (what a dense ring\n"
           "#   would have to carry per rank for the same result in the same time)\n"
           "# wirebw = wire/rank / time: the bytes each rank did send (payload and framing)\n");
    if (have_mpi)
        printf("# mpi: Open MPI MPI_Allreduce (dense, in place), same sizes and iteration rules;\n"
               "#   xMPI = algbw / MPI algbw = MPI time / terse time\n");
    if (have_mpi && strcmp(provider, "shm") != 0 && !getenv("TERSE_WIRE"))
        printf("# wire mac (terse's default off shm): every chunk carries a Poly1305 tag, so a\n"
               "#   process on the path or a relay can neither alter nor inject data; wire none\n"
               "#   (TERSE_WIRE=none): no MAC, which is what Open MPI sends; same run\n");
    if (o->overlap_ms > 0) {
        const char *progress = getenv("TERSE_PROGRESS");
        printf("# overlap (--overlap %d, TERSE_PROGRESS=%s): comp = a fixed sgemm loop\n"
               "#   alone, ar = allreduce_start + wait alone, ovl = start, the loop, wait;\n"
               "#   ms, medians of the slowest rank; /max = ovl / max(comp, ar) (1 = perfect\n"
               "#   overlap), /sum = ovl / (comp + ar) (1 = none)\n",
               o->overlap_ms, progress && progress[0] ? progress : "thread (default)");
    }
    if (o->vs_flat)
        printf("# topo: hosts x ranks per host (terse_comm_topology); flat(us): the same row\n"
               "#   with TERSE_TOPOLOGY=flat (one provider, flat algorithms), second job;\n"
               "#   /flat = time / flat time (< 1: the topology-aware run is faster)\n");
    if (o->parts)
        printf("# parts (--parts): codec = one encode + N decodes alone, wire = the messages'\n"
               "#   all-gather alone (ms, medians of the slowest rank, same run); /max = time /\n"
               "#   max(codec, wire) (1 = the pipeline hides the shorter fully), /sum = time /\n"
               "#   (codec + wire)\n");
}

void ar_report_spec(const ar_options *o, const char *spec) {
    if (o->csv) return;
    printf("#\n# codec: %s\n", spec);
    printf("#%12s %10s %11s %10s %6s %5s %11s %7s %7s %7s %11s %6s %5s", "size", "count",
           "shape", "algo", "topo", "iters", "time(us)", "algbw", "busbw", "wirebw", "wire/rank", "codec%",
           "net%");
    if (o->vs_mpi) printf("  | %11s %7s %6s", "mpi(us)", "mpibus", "xMPI");
    if (o->overlap_ms > 0)
        printf("  | %9s %9s %9s %5s %5s", "comp(ms)", "ar(ms)", "ovl(ms)", "/max", "/sum");
    if (o->parts) printf("  | %9s %9s %5s %5s", "codec(ms)", "wire(ms)", "/max", "/sum");
    if (o->vs_flat) printf("  | %11s %6s", "flat(us)", "/flat");
    printf("\n");
}

static void report_csv(const ar_options *o, const ar_row *r, const ar_row *mpi,
                       const ar_row *flat) {
    bench_csv_quoted(r->spec);
    putchar(',');
    bench_csv_quoted(r->provider);
    printf(",%d,%zu,%zu,%zu,%zu,%d,%.3f,%.6f,%.6f,%.0f,%.0f,%.6f,%.3f,%.3f,%.3f", r->nranks,
           r->bytes, r->bytes / 4, r->rows, r->cols, r->iters, 1e6 * r->time_s, ar_algbw(r),
           ar_busbw(r), r->wire_sent, r->payload_sent, ar_wirebw(r), 1e6 * r->mean_s,
           1e6 * r->codec_s, 1e6 * r->net_s);
    if (o->vs_mpi) {
        if (mpi && mpi->ok)
            printf(",%d,%.3f,%.6f,%.6f,%.4f", mpi->iters, 1e6 * mpi->time_s, ar_algbw(mpi),
                   ar_busbw(mpi), r->ok ? mpi->time_s / r->time_s : 0.0);
        else
            printf(",,,,,");
    }
    if (o->overlap_ms > 0) {
        if (r->ok && r->compute_calls > 0)
            printf(",%ld,%.3f,%.3f,%.3f,%.4f,%.4f", r->compute_calls, 1e3 * r->compute_s,
                   1e3 * r->alone_s, 1e3 * r->overlap_s, overlap_vs_max(r), overlap_vs_sum(r));
        else
            printf(",,,,,,");
    }
    if (o->parts) {
        if (r->ok && r->codec_alone_s > 0)
            printf(",%.3f,%.3f,%.4f,%.4f", 1e3 * r->codec_alone_s, 1e3 * r->wire_alone_s,
                   parts_vs_max(r), parts_vs_sum(r));
        else
            printf(",,,,");
    }
    if (o->vs_flat) {
        if (r->ok && flat && flat->ok)
            printf(",%.3f,%.4f", 1e6 * flat->time_s, r->time_s / flat->time_s);
        else
            printf(",,");
    }
    printf(",%s,", r->ok ? "ok" : "failed");
    bench_csv_quoted(r->ok ? "" : r->error);
    printf(",%s,%s\n", r->algo[0] ? r->algo : "-", r->topo[0] ? r->topo : "-");
}

void ar_report_row(const ar_options *o, const ar_row *r, const ar_row *mpi,
                   const ar_row *flat) {
    if (o->csv) {
        report_csv(o, r, mpi, flat);
        return;
    }
    char shape[48];
    if (is_dense(r))
        snprintf(shape, sizeof shape, "-");
    else
        snprintf(shape, sizeof shape, "%zux%zu", r->rows, r->cols);
    if (!r->ok) {
        printf(" %12zu %10zu %11s  failed: %s\n", r->bytes, r->bytes / 4, shape, r->error);
        return;
    }
    printf(" %12zu %10zu %11s %10s %6s %5d %11.1f %7.3f %7.3f %7.3f %11.0f %6.1f %5.1f",
           r->bytes, r->bytes / 4, shape, r->algo[0] ? r->algo : "-",
           r->topo[0] ? r->topo : "-", r->iters, 1e6 * r->time_s,
           ar_algbw(r), ar_busbw(r), ar_wirebw(r), r->wire_sent, 100.0 * r->codec_s / r->mean_s,
           100.0 * r->net_s / r->mean_s);
    if (o->vs_mpi) {
        if (mpi && mpi->ok)
            printf("  | %11.1f %7.3f %6.2f", 1e6 * mpi->time_s, ar_busbw(mpi),
                   mpi->time_s / r->time_s);
        else
            printf("  | %11s %7s %6s", "-", "-", "-");
    }
    if (o->overlap_ms > 0) {
        if (r->compute_calls > 0)
            printf("  | %9.1f %9.1f %9.1f %5.2f %5.2f", 1e3 * r->compute_s, 1e3 * r->alone_s,
                   1e3 * r->overlap_s, overlap_vs_max(r), overlap_vs_sum(r));
        else
            printf("  | %9s %9s %9s %5s %5s", "-", "-", "-", "-", "-");
    }
    if (o->parts) {
        if (r->codec_alone_s > 0)
            printf("  | %9.1f %9.1f %5.2f %5.2f", 1e3 * r->codec_alone_s, 1e3 * r->wire_alone_s,
                   parts_vs_max(r), parts_vs_sum(r));
        else
            printf("  | %9s %9s %5s %5s", "-", "-", "-", "-");
    }
    if (o->vs_flat) {
        if (flat && flat->ok)
            printf("  | %11.1f %6.2f", 1e6 * flat->time_s, r->time_s / flat->time_s);
        else
            printf("  | %11s %6s", "-", "-");
    }
    printf("\n");
}
