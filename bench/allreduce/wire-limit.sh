#!/usr/bin/env bash
# wire-limit.sh: terse's dense allreduce against libfabric's own wire limit,
# fi_pingpong over the same provider, in the same run.
#
# For each provider and size, alternately REPEATS times: fi_pingpong (rdm
# endpoint, tagged messages, one message of SIZE bytes each way per
# iteration; bandwidth = SIZE / its usec/xfer) and `terse-bench allreduce`
# (2 ranks, dense fp32, busbw = SIZE / time, which for 2 ranks is what each
# rank's link carries each way). Prints the medians and their ratio; the
# issue's goal is busbw >= 0.8 x the ping-pong bandwidth at 16 MB and up.
#
# A ping-pong moves one direction at a time; the ring moves both at once,
# so on a link with independent directions busbw can exceed it.
set -euo pipefail

prog=${0##*/}
usage() {
    cat <<EOF
usage: $prog [--providers "shm tcp"] [--sizes "16M 64M 256M"] [--repeats N] [--bench PATH]

Times fi_pingpong and terse-bench allreduce (dense, 2 ranks) on each provider
(shm, tcp = net, rxm = tcp;ofi_rxm) and size, alternating, N times each (default 3), and
prints the medians: ping-pong GB/s, terse busbw GB/s, and terse / ping-pong.
Loopback only. Needs fi_pingpong (Debian: libfabric-bin).
EOF
}

here=$(cd "$(dirname "$0")" && pwd)
bench=$here/../../build/bench/terse-bench
providers="shm tcp"
sizes="16M 64M 256M"
repeats=3
while [ $# -gt 0 ]; do
    case $1 in
        -h|--help) usage; exit 0 ;;
        --providers) providers=$2; shift 2 ;;
        --sizes) sizes=$2; shift 2 ;;
        --repeats) repeats=$2; shift 2 ;;
        --bench) bench=$2; shift 2 ;;
        *) usage >&2; exit 2 ;;
    esac
done
command -v fi_pingpong >/dev/null || { echo "$prog: fi_pingpong not found (apt-get install libfabric-bin)" >&2; exit 1; }
[ -x "$bench" ] || { echo "$prog: $bench is not built (./terse.sh build)" >&2; exit 1; }

bytes() { # 16M -> 16777216
    local v=${1%[KkMmGg]} u=${1##*[0-9]}
    case $u in K|k) echo $((v << 10)) ;; M|m) echo $((v << 20)) ;; G|g) echo $((v << 30)) ;; *) echo "$v" ;; esac
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

port=$((47000 + RANDOM % 1000))
pingpong() { # provider bytes -> GB/s (1e9 B/s)
    local prov=$1 n=$2 iters out
    iters=$(( n >= 1 << 28 ? 5 : 20 ))
    port=$((port + 1))
    timeout 120 fi_pingpong -p "$prov" -e rdm -m tagged -S "$n" -I "$iters" -B "$port" >/dev/null 2>&1 &
    local srv=$!
    sleep 0.5
    out=$(timeout 120 fi_pingpong -p "$prov" -e rdm -m tagged -S "$n" -I "$iters" -P "$port" 127.0.0.1 2>&1 | tail -1)
    wait "$srv" 2>/dev/null || true
    # bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
    echo "$out" | awk -v n="$n" '{ if ($7 + 0 > 0) printf "%.4f\n", n / ($7 * 1e-6) / 1e9; else print "nan" }'
}

terse() { # provider bytes -> busbw GB/s
    "$bench" allreduce -n 2 --provider "$1" -b "$2" -e "$2" -r 10 -t 3 --csv -q 2>/dev/null |
        awk -F, 'NR == 2 { print $11 }'
}

echo "# $prog: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores; medians of $repeats alternating runs"
printf "%-6s %10s %12s %12s %8s\n" provider size "pingpong" "terse busbw" "ratio"
for p in $providers; do
    lf=$p
    [ "$p" = tcp ] && lf="net"
    [ "$p" = rxm ] && lf="tcp;ofi_rxm"
    for s in $sizes; do
        n=$(bytes "$s")
        pp=() tb=()
        for _ in $(seq "$repeats"); do
            pp+=("$(pingpong "$lf" "$n")")
            tb+=("$(terse "$p" "$n")")
        done
        ppm=$(printf '%s\n' "${pp[@]}" | median)
        tbm=$(printf '%s\n' "${tb[@]}" | median)
        printf "%-6s %10s %9.3f GB/s %9.3f GB/s %7.2fx\n" "$p" "$s" "$ppm" "$tbm" \
            "$(awk -v a="$tbm" -v b="$ppm" 'BEGIN { print (b > 0) ? a / b : 0 }')"
    done
done
