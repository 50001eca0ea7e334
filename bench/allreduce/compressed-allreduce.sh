#!/usr/bin/env bash
# compressed-allreduce.sh [--net RATE] [--bytes SIZE] [--ranks "2 4 8"] [--codecs "..."]
#                         [--provider P] [--repeats N] [TERSE_BENCH]
#
# The compressed allreduce's table per rank count: every codec through the
# all-gather of whole messages (TERSE_COMPRESSED_ALGO=gather) and through
# the compressed reduce-scatter (=rs), dense beside them, in one run per
# rank count. Columns: codec, algorithm, wire bytes per rank, codec s, wire
# s (time waiting on the network), total s (median of the slowest rank),
# algbw (nccl-tests': fp32 bytes / time), x dense (dense time / this time),
# x mpi (Open MPI's dense MPI_Allreduce time, same size and ranks, measured
# in the gather run / this time).
# --net RATE runs everything inside bench/core/slow-net.sh's shaped namespace
# (root; RATE is the total of every rank's traffic on the one loopback).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/sweep-args.sh" # bytes=16M, ranks="2 4 8", provider=tcp unless given
codecs="fp16 int8 qsgd sign topk:ratio=0.01,ef=1 vq"
repeats=5
take_repeats=1
help_lines=2,13
sweep_args "$@"

cargs=(-c dense)
for c in $codecs; do cargs+=(-c "$c"); done
run() { # algo nranks -> CSV on stdout
    local algo=$1 n=$2
    local mpi=()
    [[ $algo == gather ]] && mpi=(--vs-mpi) # Open MPI's dense allreduce, once per rank count
    # TERSE_WIRE set: --vs-mpi then runs the ranks once, with the wire given
    local cmd=(env TERSE_COMPRESSED_ALGO="$algo" TERSE_WIRE="${TERSE_WIRE:-auto}"
               OPENBLAS_NUM_THREADS=1 "$bench" allreduce
               -n "$n" --provider "$provider" -b "$bytes" -e "$bytes" -r "$repeats" -w 1 -t 4
               --csv -q "${mpi[@]}" "${cargs[@]}")
    if [[ -n $net ]]; then
        bash "$here/../core/slow-net.sh" "$net" "${cmd[@]}"
    else
        "${cmd[@]}"
    fi
}

echo "# compressed allreduce, $bytes fp32, provider $provider${net:+, shaped link $net (total)}"
echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores"
for n in $ranks; do
    echo "#"
    echo "# $n ranks"
    printf '%-24s %-11s %12s %9s %9s %9s %9s %8s %7s\n' codec algo bytes/rank codec_s wire_s \
        total_s algbw x_dense x_mpi
    for algo in gather rs; do
        run "$algo" "$n"
    done | /usr/bin/python3 -c '
import csv, sys
dense = mpi = None
header = None
for fields in csv.reader(sys.stdin):
    if fields and fields[0] == "spec":  # each run has its own header (columns differ)
        header = fields
        continue
    if not header or len(fields) != len(header):
        continue
    row = dict(zip(header, fields))
    spec, algo = row["spec"], row["algo"]
    if row["status"] != "ok":
        print("%-24s %-11s failed: %s" % (spec, algo, row["error"]))
        continue
    t = float(row["time_us"]) / 1e6
    if row.get("mpi_time_us"):
        mpi = float(row["mpi_time_us"]) / 1e6
    if spec == "dense":
        if dense is not None:
            continue
        dense = t
    print("%-24s %-11s %12.0f %9.4f %9.4f %9.4f %9.3f %8.2f %7s" % (
        spec, algo, float(row["wire_bytes"]), float(row["codec_us"]) / 1e6,
        float(row["net_us"]) / 1e6, t, float(row["algbw_gbps"]), dense / t if dense else 0,
        "%.2f" % (mpi / t) if mpi else "-"))
'
done
