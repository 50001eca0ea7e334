#!/usr/bin/env bash
# netns_two_hosts.sh ALLREDUCE_CHECK
#
# Two "hosts" made of network namespaces joined by a veth pair, with terse's
# tcp provider (libfabric's net) across the link: rank 0 runs in namespace A,
# rank 1 in namespace B, each started by hand with the variables a launcher
# sets. Passes when both ranks print OK from tests/allreduce_check.c and the
# veth really carried the job's bytes.
#
# The addresses (10.250.X.1/30 and .2/30) exist only inside the two
# namespaces this script creates; nothing is routed anywhere else.
#
# Exit 0 pass, 1 fail, 77 skip (the kernel or container refuses network
# namespaces or veth pairs, or we are not root) -- ctest's SKIP_RETURN_CODE.
set -u

check=${1:?usage: netns_two_hosts.sh path/to/allreduce_check}
skip() {
    echo "SKIP: $*"
    exit 77
}

[[ $(id -u) == 0 ]] || skip "creating network namespaces needs root"
command -v ip >/dev/null 2>&1 || skip "'ip' (iproute2) is not installed"

# Unique names, so concurrent runs never collide: interface names stay
# within 15 characters.
tag="$$"
ns_a="terse-h0-$tag"
ns_b="terse-h1-$tag"
if_a="tva$tag"
if_b="tvb$tag"
octet=$(($$ % 250 + 1))
addr_a="10.250.$octet.1"
addr_b="10.250.$octet.2"
port=$((20000 + RANDOM % 20000))
pids=()
out_a=$(mktemp)
out_b=$(mktemp)

cleanup() {
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    for ns in "$ns_a" "$ns_b"; do
        if ip netns list 2>/dev/null | cut -d" " -f1 | grep -qxF -- "$ns"; then
            for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
            ip netns del "$ns" 2>/dev/null
        fi
    done
    rm -f "$out_a" "$out_b"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add "$ns_a" 2>/dev/null || skip "the kernel refuses network namespaces (ip netns add failed)"
ip netns add "$ns_b" || skip "the kernel refuses a second network namespace"
# Create the pair inside A with its peer placed straight into B: the host's
# own namespace never sees either end.
ip -n "$ns_a" link add "$if_a" type veth peer name "$if_b" netns "$ns_b" 2>/dev/null ||
    skip "the kernel refuses veth pairs (ip link add type veth failed)"
set -e
ip -n "$ns_a" addr add "$addr_a/30" dev "$if_a"
ip -n "$ns_b" addr add "$addr_b/30" dev "$if_b"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "$if_a" up
ip -n "$ns_b" link set "$if_b" up
set +e
# A veth reports carrier a moment after both ends are up, and libfabric's
# tcp provider lists only interfaces that are running: wait for both.
for _ in $(seq 50); do
    state_a=$(ip netns exec "$ns_a" cat "/sys/class/net/$if_a/operstate" 2>/dev/null)
    state_b=$(ip netns exec "$ns_b" cat "/sys/class/net/$if_b/operstate" 2>/dev/null)
    [[ $state_a == up && $state_b == up ]] && break
    sleep 0.1
done
if [[ $state_a != up || $state_b != up ]]; then
    echo "FAIL: the veth pair did not come up ($if_a: $state_a, $if_b: $state_b)"
    exit 1
fi

token=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
# TERSE_IFACE picks the veth as the libfabric domain (transport/fabric_info.c);
# FI_TCP_IFACE says the same to the tcp provider itself. Rank 0's store binds
# to A's veth address, which is also where B finds it.
run_rank() { # rank namespace interface output
    ip netns exec "$2" env TERSE_RANK="$1" TERSE_SIZE=2 TERSE_ADDR="$addr_a:$port" \
        TERSE_TOKEN="$token" TERSE_PROVIDER=tcp TERSE_IFACE="$3" FI_TCP_IFACE="$3" \
        TERSE_TIMEOUT_MS="${TERSE_TIMEOUT_MS:-20000}" \
        timeout -k 5 60 "$check" >"$4" 2>&1 &
    pids+=($!)
}
run_rank 0 "$ns_a" "$if_a" "$out_a"
run_rank 1 "$ns_b" "$if_b" "$out_b"
wait "${pids[0]}"
rc_a=$?
wait "${pids[1]}"
rc_b=$?
pids=()

fail=0
for r in 0 1; do
    if [[ $r == 0 ]]; then rc=$rc_a out=$out_a ns=$ns_a; else rc=$rc_b out=$out_b ns=$ns_b; fi
    sed "s/^/[rank $r in $ns] /" "$out"
    if [[ $rc != 0 ]] || ! grep -q "^OK rank $r of 2 over net" "$out"; then
        echo "FAIL: rank $r (namespace $ns) exited $rc without its OK line"
        fail=1
    fi
done

# The dense checks alone move more than 4 MiB each way; a veth that carried
# less means the ranks did not talk over it.
# (ip netns exec mounts the namespace's own /sys.)
tx=$(ip netns exec "$ns_a" cat "/sys/class/net/$if_a/statistics/tx_bytes" 2>/dev/null)
rx=$(ip netns exec "$ns_a" cat "/sys/class/net/$if_a/statistics/rx_bytes" 2>/dev/null)
echo "veth $if_a ($addr_a): sent ${tx:-?} bytes, received ${rx:-?} bytes"
if [[ -z $tx || -z $rx || $tx -lt 4194304 || $rx -lt 4194304 ]]; then
    echo "FAIL: the veth carried less than 4 MiB each way"
    fail=1
fi
[[ $fail == 0 ]] && echo "PASS: 2 ranks over tcp across namespaces $ns_a and $ns_b"
exit $fail
