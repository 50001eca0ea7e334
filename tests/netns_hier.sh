#!/usr/bin/env bash
# netns_hier.sh TERSE_RUN ALLREDUCE_TIME [N] [ITERS] [RATE] [L]
#
# Two "hosts" of L ranks each (default 2), built by
# `terse-run --hosts 2 -n 2L [--link RATE]`: network namespaces with a veth
# each into a bridge (10.78.0.x, existing only inside the namespaces
# terse-run creates and removes), shaped with tbf to RATE each way when
# RATE is given (e.g. 1gbit; "" for none). Ranks 0 .. L-1 run on host 0,
# the next L on host 1. The same job runs three times, with
# TERSE_TOPOLOGY=flat (one provider, the ring over 2L ranks), auto with
# TERSE_SHM_SEGMENT=off (shm inside a namespace, tcp across, the
# hierarchical all-reduce: "shm") and auto (its intra-host phases over each
# host's shared segment instead: "seg"), each a
# dense all-reduce of N floats (default 4 Mi = 16 MiB) ITERS times
# (default 5). Prints each run's median time and the bytes host 0's link
# carried each way (terse-run prints them), and the ratios; fails if a run
# fails, sums wrong, the path is not the expected one, or terse-run leaves
# a namespace behind. Times are shown, never asserted.
#
# Exit 0 pass, 1 fail, 77 skip (not root, no network namespaces or veth).
set -u
tr=${1:?usage: netns_hier.sh path/to/terse-run path/to/allreduce_time [N] [ITERS] [RATE] [L]}
prog=${2:?usage: netns_hier.sh path/to/terse-run path/to/allreduce_time [N] [ITERS] [RATE] [L]}
n=${3:-4194304}
iters=${4:-5}
rate=${5:-}
L=${6:-2}
NR=$((2 * L))
. "$(dirname "$0")/netns_probe.sh"
netns_probe "creating network namespaces"

out=$(mktemp)
err=$(mktemp)
pidf=$(mktemp)
trap 'rm -f "$out" "$err" "$pidf"' EXIT

fail=0
declare -A med bytes_tx bytes_rx alg
for topo in flat shm seg; do
    case $topo in
        flat) t=flat seg=auto ;;
        shm) t=auto seg=off ;;
        seg) t=auto seg=auto ;;
    esac
    # terse-run's own pid names its namespaces (trh<pid>-*): exec keeps it.
    TERSE_TOPOLOGY=$t TERSE_SHM_SEGMENT=$seg timeout -k 5 100 bash -c 'echo $$ >"$0"; exec "$@"' "$pidf" \
        "$tr" --hosts 2 -n "$NR" ${rate:+--link "$rate"} --provider tcp --timeout-ms 30000 \
        "$prog" "$n" "$iters" >"$out" 2>"$err"
    rc=$?
    if [[ $rc != 0 ]]; then
        echo "FAIL: $topo: terse-run exited $rc:"
        sed "s/^/  /" "$out" "$err"
        fail=1
    fi
    line=$(grep '^\[0\] alg ' "$out" | sed 's/^\[0\] //')
    echo "$topo: $line; barrier $(grep '^\[0\] barrier_us ' "$out" | awk '{print $3}') us"
    alg[$topo]=$(awk '{print $2}' <<<"$line")
    med[$topo]=$(awk '{print $6}' <<<"$line")
    link=$(grep "^terse-run: host 0 link: sent " "$err")
    bytes_tx[$topo]=$(awk '{print $6}' <<<"$link")
    bytes_rx[$topo]=$(awk '{print $9}' <<<"$link")
    echo "$topo: host 0 -> 1 ${bytes_tx[$topo]:-?} bytes, 1 -> 0 ${bytes_rx[$topo]:-?} bytes"
    left=$(ip netns list | cut -d" " -f1 | grep "^trh$(cat "$pidf")-")
    if [[ -n $left ]]; then
        echo "FAIL: $topo: terse-run left namespaces behind: $(echo $left)"
        for ns in $left; do ip netns del "$ns"; done
        fail=1
    fi
done
[[ $fail == 0 ]] || exit 1
if [[ ${alg[flat]} != dense-ring || ${alg[shm]} != dense-hier || ${alg[seg]} != dense-hier-seg ]]; then
    echo "FAIL: paths: flat ran ${alg[flat]} (want dense-ring), shm ${alg[shm]} (want" \
         "dense-hier), seg ${alg[seg]} (want dense-hier-seg)"
    exit 1
fi
# bytes model per direction, for (1 + ITERS) all-reduces of S = 4N bytes:
# the flat ring over 2L ranks placed host by host crosses once each way:
# 2(2L-1)/(2L) S; hierarchical: each of the L rails sends its S/L shard across: S.
S=$((4 * n * (iters + 1)))
for h in shm seg; do
awk -v ft="${bytes_tx[flat]}" -v ht="${bytes_tx[$h]}" -v fm="${med[flat]}" -v hm="${med[$h]}" \
    -v S="$S" -v NR="$NR" -v L="$L" -v rate="${rate:-unshaped}" -v h="$h" 'BEGIN {
    f = 2 * (NR - 1) / NR
    printf "2 x %d, link %s: hier (%s)/flat time %.2f (medians %s / %s ms); bytes 0->1 hier/flat %.3f (model %.3f); ", L, rate, h, hm / fm, hm, fm, ht / ft, 1 / f
    printf "measured/model: flat %.3f, hier %.3f\n", ft / (f * S), ht / S }'
done
echo "PASS: flat and hierarchical all-reduce across the hosts terse-run --hosts 2 made"
