#!/usr/bin/env bash
# netns_hier.sh ALLREDUCE_TIME [N] [ITERS] [RATE] [L]
#
# Two "hosts" of two ranks each: network namespaces A and B joined by a
# veth pair (10.251.X.1/30 and .2/30, existing only inside the namespaces
# this script creates; nothing is routed anywhere else), shaped with tbf to
# RATE each way when RATE is given (e.g. 1gbit; "" for none). L ranks
# (default 2) run in each: ranks 0 .. L-1 in A (TERSE_HOST=A), the next L
# in B. The same job runs twice, with
# TERSE_TOPOLOGY=flat (one provider, the ring over 4 ranks) and auto (shm
# inside a namespace, tcp across, the hierarchical all-reduce), each a
# dense all-reduce of N floats (default 4 Mi = 16 MiB) ITERS times
# (default 5). Prints each run's median time and the bytes the veth
# carried each way, and the ratios; fails if a run fails, sums wrong, or
# the path is not the expected one. Times are shown, never asserted.
#
# Exit 0 pass, 1 fail, 77 skip (not root, no network namespaces or veth).
set -u
prog=${1:?usage: netns_hier.sh path/to/allreduce_time [N] [ITERS] [RATE]}
n=${2:-4194304}
iters=${3:-5}
rate=${4:-}
L=${5:-2}
NR=$((2 * L))
skip() {
    echo "SKIP: $*"
    exit 77
}
[[ $(id -u) == 0 ]] || skip "creating network namespaces needs root"
command -v ip >/dev/null 2>&1 || skip "'ip' (iproute2) is not installed"

tag="$$"
ns_a="terse-ha-$tag"
ns_b="terse-hb-$tag"
if_a="hva$tag"
if_b="hvb$tag"
octet=$(($$ % 250 + 1))
addr_a="10.251.$octet.1"
addr_b="10.251.$octet.2"
pids=()
outs=()
cleanup() {
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    for ns in "$ns_a" "$ns_b"; do
        if ip netns list 2>/dev/null | cut -d" " -f1 | grep -qxF -- "$ns"; then
            for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
            ip netns del "$ns" 2>/dev/null
        fi
    done
    rm -f "${outs[@]}"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add "$ns_a" 2>/dev/null || skip "the kernel refuses network namespaces"
ip netns add "$ns_b" || skip "the kernel refuses a second network namespace"
ip -n "$ns_a" link add "$if_a" type veth peer name "$if_b" netns "$ns_b" 2>/dev/null ||
    skip "the kernel refuses veth pairs"
set -e
ip -n "$ns_a" addr add "$addr_a/30" dev "$if_a"
ip -n "$ns_b" addr add "$addr_b/30" dev "$if_b"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "$if_a" up
ip -n "$ns_b" link set "$if_b" up
if [[ -n $rate ]]; then
    ip netns exec "$ns_a" tc qdisc add dev "$if_a" root tbf rate "$rate" burst 256kb latency 50ms
    ip netns exec "$ns_b" tc qdisc add dev "$if_b" root tbf rate "$rate" burst 256kb latency 50ms
fi
set +e
for _ in $(seq 50); do
    sa=$(ip netns exec "$ns_a" cat "/sys/class/net/$if_a/operstate" 2>/dev/null)
    sb=$(ip netns exec "$ns_b" cat "/sys/class/net/$if_b/operstate" 2>/dev/null)
    [[ $sa == up && $sb == up ]] && break
    sleep 0.1
done
[[ $sa == up && $sb == up ]] || { echo "FAIL: the veth pair did not come up"; exit 1; }

counter() { ip netns exec "$ns_a" cat "/sys/class/net/$if_a/statistics/$1_bytes"; }
fail=0
declare -A med bytes_tx bytes_rx alg
for topo in flat auto; do
    token=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
    port=$((20000 + RANDOM % 20000))
    tx0=$(counter tx)
    rx0=$(counter rx)
    pids=()
    outs=()
    for ((r = 0; r < NR; r++)); do
        if ((r < L)); then ns=$ns_a ifc=$if_a host=A; else ns=$ns_b ifc=$if_b host=B; fi
        out=$(mktemp)
        outs+=("$out")
        ip netns exec "$ns" env TERSE_RANK=$r TERSE_SIZE=$NR TERSE_ADDR="$addr_a:$port" \
            TERSE_TOKEN="$token" TERSE_PROVIDER=tcp TERSE_IFACE="$ifc" FI_TCP_IFACE="$ifc" \
            TERSE_HOST=$host TERSE_TOPOLOGY=$topo TERSE_TIMEOUT_MS=30000 \
            timeout -k 5 100 "$prog" "$n" "$iters" >"$out" 2>&1 &
        pids+=($!)
    done
    for ((r = 0; r < NR; r++)); do
        wait "${pids[$r]}"
        rc=$?
        if [[ $rc != 0 ]]; then
            echo "FAIL: $topo: rank $r exited $rc:"
            sed "s/^/  [rank $r] /" "${outs[$r]}"
            fail=1
        fi
    done
    pids=()
    line=$(grep '^alg ' "${outs[0]}")
    echo "$topo: $line"
    alg[$topo]=$(awk '{print $2}' <<<"$line")
    med[$topo]=$(awk '{print $6}' <<<"$line")
    bytes_tx[$topo]=$(($(counter tx) - tx0))
    bytes_rx[$topo]=$(($(counter rx) - rx0))
    echo "$topo: veth A->B ${bytes_tx[$topo]} bytes, B->A ${bytes_rx[$topo]} bytes"
    rm -f "${outs[@]}"
    outs=()
done
[[ $fail == 0 ]] || exit 1
if [[ ${alg[flat]} != dense-ring || ${alg[auto]} != dense-hier ]]; then
    echo "FAIL: paths: flat ran ${alg[flat]} (want dense-ring), auto ${alg[auto]} (want dense-hier)"
    exit 1
fi
# bytes model per direction, for (1 + ITERS) all-reduces of S = 4N bytes:
# the flat ring over 2L ranks placed host by host crosses once each way:
# 2(2L-1)/(2L) S; hierarchical: each of the L rails sends its S/L shard across: S.
S=$((4 * n * (iters + 1)))
awk -v ft="${bytes_tx[flat]}" -v ht="${bytes_tx[auto]}" -v fm="${med[flat]}" -v hm="${med[auto]}" \
    -v S="$S" -v NR="$NR" -v L="$L" -v rate="${rate:-unshaped}" 'BEGIN {
    f = 2 * (NR - 1) / NR
    printf "2 x %d, link %s: hier/flat time %.2f (medians %s / %s ms); bytes A->B hier/flat %.3f (model %.3f); ", L, rate, hm / fm, hm, fm, ht / ft, 1 / f
    printf "measured/model: flat %.3f, hier %.3f\n", ft / (f * S), ht / S }'
echo "PASS: flat and hierarchical all-reduce across namespaces $ns_a and $ns_b"
