#!/usr/bin/env bash
# ctest bench_overlap_slow_net: on a 1 Gbit/s link (slow-net.sh), a 64 MiB
# dense terse_allreduce started before 400 ms of computation and waited for
# after it must hide behind that computation: the overlapped time must be
# at most 0.9 of computing and then reducing one after the other. Perfect
# overlap gives max(compute, allreduce) / (compute + allreduce), about 0.7
# here; no overlap at all gives 1.0. The margin is wide on purpose: the
# ranks, their progress threads and the kernel's tcp copies share the
# machine's cores, so full overlap is not expected, only real overlap.
#
# Needs root and network namespaces (slow-net.sh); without them it prints
# SKIP and passes.
#   check_overlap.sh path/to/terse-bench
set -u
bench=${1:?usage: check_overlap.sh TERSE_BENCH}
here=$(cd "$(dirname "$0")" && pwd)
limit=0.9

if [[ $(id -u) != 0 ]]; then
    echo "SKIP: bench_overlap_slow_net needs root (a network namespace and a tc qdisc)"
    exit 0
fi
probe="terse-overlap-probe-$$"
if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1 ||
   ! ip netns add "$probe" >/dev/null 2>&1; then
    echo "SKIP: bench_overlap_slow_net: 'ip netns' (or tc) is not available here"
    exit 0
fi
ip netns del "$probe" >/dev/null 2>&1

out=$(mktemp)
trap 'rm -f "$out"' EXIT
args=(allreduce -n 2 --provider tcp -b 64M -e 64M -r 3 -w 1 --overlap 400 --csv)

# One attempt: 0 if it overlapped, 1 if not, 2 if the run itself failed.
attempt() {
    echo "running: slow-net.sh 1gbit terse-bench ${args[*]}"
    if ! bash "$here/../core/slow-net.sh" 1gbit "$bench" "${args[@]}" >"$out"; then
        echo "FAIL: slow-net.sh 1gbit terse-bench ${args[*]} exited non-zero"
        cat "$out"
        return 2
    fi
    cat "$out"
    # Columns by name from the CSV header; the one dense row must be ok.
    read -r status compute allreduce overlapped vs_max vs_sum < <(awk -F, '
        NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        { print $col["status"], $col["compute_ms"], $col["allreduce_ms"], $col["overlapped_ms"],
                $col["overlap_vs_max"], $col["overlap_vs_sum"]; exit }' "$out")
    if [[ ${status:-} != ok || -z ${vs_sum:-} ]]; then
        echo "FAIL: no ok row with overlap figures in the output above"
        return 2
    fi
    echo "compute ${compute} ms, allreduce ${allreduce} ms, overlapped ${overlapped} ms:" \
         "${vs_max} of max(compute, allreduce), ${vs_sum} of compute + allreduce"
    if awk -v r="$vs_sum" -v l="$limit" 'BEGIN { exit !(r > l) }'; then
        echo "overlapped / (compute + allreduce) = $vs_sum > $limit: the allreduce did not" \
             "run while the caller computed"
        return 1
    fi
    echo "ok: overlapped / (compute + allreduce) = $vs_sum <= $limit"
    return 0
}

# A second attempt if the first shows no overlap: on a shared 2-core machine
# another job's burst can starve the progress thread for a whole run (seen
# once in CI while other tests ran beside it); a real loss of overlap fails
# both.
attempt
rc=$?
if [[ $rc == 1 ]]; then
    echo "no overlap in the first attempt; trying once more"
    attempt
    rc=$?
fi
[[ $rc == 0 ]] || echo "FAIL: bench_overlap_slow_net"
exit $rc
