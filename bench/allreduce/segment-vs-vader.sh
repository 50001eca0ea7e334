#!/usr/bin/env bash
# segment-vs-vader.sh: the dense all-reduce of ranks on one host over
# terse's own shared segment (TERSE_SHM_SEGMENT=auto, the default) against
# the same over libfabric's shm (TERSE_SHM_SEGMENT=off) and against Open
# MPI's vader (`terse-bench allreduce --vs-mpi`, MPI_Allreduce with
# --mca btl vader,self), all in the same run.
#
# For each rank count, REPEATS times, alternating: one terse-bench job with
# the segment, one without; each job also times Open MPI over the same sizes.
# Prints, per rank count and size, the medians of the three times (us) and
# the ratios issue 28 asks for: Open MPI's time / the segment's (>= 1.0:
# the segment is at least as fast as vader) and libfabric shm's time / the
# segment's (>= 1.0: no slower than before).
set -euo pipefail

prog=${0##*/}
usage() {
    cat <<EOF
usage: $prog [--ranks "2 3 4"] [-b 256K] [-e 16M] [-f 4] [--repeats N]
             [--progress thread|caller] [--bench PATH]

Times terse-bench allreduce -n R --provider shm --vs-mpi with and without
the shared segment, alternating, N times each (default 3), and prints a
markdown table of medians: segment, libfabric shm and Open MPI (vader)
times in us, MPI / segment and shm / segment. --progress caller runs the
collectives on the caller's thread (TERSE_PROGRESS=caller) instead of the
progress thread.
EOF
}

here=$(cd "$(dirname "$0")" && pwd)
bench=$here/../../build/bench/terse-bench
ranks="2 3 4"
b=256K e=16M f=4 repeats=3 progress=thread
while [ $# -gt 0 ]; do
    case $1 in
        -h|--help) usage; exit 0 ;;
        --ranks) ranks=$2; shift 2 ;;
        -b) b=$2; shift 2 ;;
        -e) e=$2; shift 2 ;;
        -f) f=$2; shift 2 ;;
        --repeats) repeats=$2; shift 2 ;;
        --progress) progress=$2; shift 2 ;;
        --bench) bench=$2; shift 2 ;;
        *) usage >&2; exit 2 ;;
    esac
done
[[ $repeats =~ ^[1-9][0-9]*$ ]] || { echo "$prog: --repeats must be a positive integer" >&2; exit 2; }
case $progress in thread|caller) ;; *) echo "$prog: --progress is thread or caller" >&2; exit 2 ;; esac
[ -x "$bench" ] || { echo "$prog: $bench is not built (./terse.sh build)" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "$prog: mpirun (openmpi-bin) is needed" >&2; exit 1; }

rows=$(mktemp /tmp/segment-vs-vader.XXXXXX)
trap 'rm -f "$rows"' EXIT
for n in $ranks; do
    for rep in $(seq 1 "$repeats"); do
        for mode in auto off; do
            echo "$prog: $n ranks, repeat $rep of $repeats, TERSE_SHM_SEGMENT=$mode" >&2
            # size algo time(us) mpi(us), one line per size
            TERSE_PROGRESS=$progress TERSE_SHM_SEGMENT=$mode OPENBLAS_NUM_THREADS=1 \
                "$bench" allreduce -n "$n" --provider shm --vs-mpi -b "$b" -e "$e" -f "$f" \
                2>/dev/null | awk -v n="$n" -v mode="$mode" \
                '$1 ~ /^[0-9]+$/ && $14 == "|" {
                    # a row on the other path than asked (no segment made) is no data point
                    if ((mode == "auto") != ($4 == "dense-seg")) {
                        print "'"$prog"': " $1 " B took " $4 " under TERSE_SHM_SEGMENT=" mode "; dropped" > "/dev/stderr"
                        next
                    }
                    print n, mode, $1, $4, $7, $15 }' >>"$rows"
        done
    done
done

echo "# $prog: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) CPUs), $(date -u +%F), progress $progress, medians of $repeats"
echo
echo "| ranks | size | segment (us) | libfabric shm (us) | Open MPI vader (us) | MPI / segment | shm / segment |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
/usr/bin/python3 - "$rows" <<'EOF'
import statistics, sys
seg, off, mpi = {}, {}, {}
for line in open(sys.argv[1]):
    n, mode, size, algo, t, m = line.split()
    key = (int(n), int(size))
    (seg if mode == "auto" else off).setdefault(key, []).append(float(t))
    mpi.setdefault(key, []).append(float(m))
for key in sorted(seg):
    if key not in off:
        continue
    s, o, m = (statistics.median(d[key]) for d in (seg, off, mpi))
    print(f"| {key[0]} | {key[1]} | {s:.1f} | {o:.1f} | {m:.1f} | {m / s:.2f} | {o / s:.2f} |")
EOF
