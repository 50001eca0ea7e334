#!/usr/bin/env bash
# seal-cost.sh: what TERSE_WIRE=seal (ChaCha20-Poly1305: every chunk
# encrypted and authenticated) costs against mac (authenticated only),
# measured in the same run.
#
# For each setting and size, alternately REPEATS times: `terse-bench
# allreduce` (dense fp32, tcp = libfabric's net) with TERSE_WIRE=mac, then
# with TERSE_WIRE=seal. Prints the median busbw of each and seal / mac
# (issue 28's goal: >= 0.8 at 16-64 MiB over net between hosts).
# Settings:
#   loopback   2 ranks on this host over tcp, no link limit: the CPU is the
#              limit, so this is the cost of the cipher itself
#   2x1:RATE   2 "hosts" (network namespaces, terse-run --hosts 2 --link
#              RATE), one rank each: the setting seal is for, a link others
#              can read (root)
#   2x2:RATE   2 hosts x 2 ranks: hierarchical, shm inside a host (sealed too,
#              as the side endpoint follows TERSE_WIRE) and the link between
#              (root)
set -euo pipefail

prog=${0##*/}
usage() {
    cat <<EOF
usage: $prog [--settings "loopback 2x1:1gbit 2x2:1gbit"] [--sizes "16M 64M"]
             [--repeats N] [--bench PATH]

Times terse-bench allreduce (dense, tcp) under TERSE_WIRE=mac and =seal,
alternating, N times each (default 3), per setting and size, and prints
the medians of busbw (GB/s) and seal / mac as a markdown table. Settings
with hosts (HxL:RATE) need root, iproute2 and tc; without root they are
skipped with a line saying so.
EOF
}

here=$(cd "$(dirname "$0")" && pwd)
bench=$here/../../build/bench/terse-bench
settings="loopback 2x1:1gbit 2x2:1gbit"
sizes="16M 64M"
repeats=3
while [ $# -gt 0 ]; do
    case $1 in
        -h|--help) usage; exit 0 ;;
        --settings) settings=$2; shift 2 ;;
        --sizes) sizes=$2; shift 2 ;;
        --repeats) repeats=$2; shift 2 ;;
        --bench) bench=$2; shift 2 ;;
        *) usage >&2; exit 2 ;;
    esac
done
[[ $repeats =~ ^[1-9][0-9]*$ ]] || { echo "$prog: --repeats must be a positive integer" >&2; exit 2; }
[ -x "$bench" ] || { echo "$prog: $bench is not built (./terse.sh build)" >&2; exit 1; }

log=$(mktemp /tmp/seal-cost.XXXXXX.log)
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

run() { # wire setting size -> busbw GB/s (or "failed")
    local wire=$1 set=$2 size=$3 args=(-n 2)
    if [ "$set" != loopback ]; then
        local shape=${set%%:*} rate=${set#*:}
        local h=${shape%%x*} l=${shape#*x}
        args=(-n $((h * l)) --hosts "$h" --link "$rate")
    fi
    # a failed run prints "failed" (its stderr goes to $log) and the script goes on
    { TERSE_WIRE=$wire "$bench" allreduce "${args[@]}" --provider tcp -b "$size" -e "$size" \
        -r 10 -t 3 --csv -q 2>>"$log" || true; } |
        awk -F, 'NR == 2 && $18 == "ok" { print $11; ok = 1 } END { if (!ok) print "failed" }'
}

echo "# $prog: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores; medians of $repeats alternating runs; $(date -u +%F)"
echo
echo "| setting | size | mac busbw (GB/s) | seal busbw (GB/s) | seal / mac |"
echo "| --- | --- | --- | --- | --- |"
for set in $settings; do
    if [ "$set" != loopback ] && [ "$(id -u)" != 0 ]; then
        echo "$prog: $set needs root (network namespaces); skipped" >&2
        continue
    fi
    for s in $sizes; do
        mac=() seal=()
        for _ in $(seq "$repeats"); do
            mac+=("$(run mac "$set" "$s")")
            seal+=("$(run seal "$set" "$s")")
        done
        if printf '%s\n' "${mac[@]}" "${seal[@]}" | grep -q failed; then
            echo "| $set | $s | ${mac[*]} | ${seal[*]} | a run failed (stderr: $log) |"
            continue
        fi
        mm=$(printf '%s\n' "${mac[@]}" | median)
        sm=$(printf '%s\n' "${seal[@]}" | median)
        printf "| %s | %s | %.3f | %.3f | %.2f |\n" "$set" "$s" "$mm" "$sm" \
            "$(awk -v a="$sm" -v b="$mm" 'BEGIN { print (b > 0) ? a / b : 0 }')"
    done
done
