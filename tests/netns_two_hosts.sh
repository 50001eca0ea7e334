#!/usr/bin/env bash
# netns_two_hosts.sh TERSE_RUN ALLREDUCE_CHECK
#
# Two "hosts" made of network namespaces, with terse's tcp provider
# (libfabric's net) across the link between them: `terse-run --hosts 2 -n 2`
# builds them (namespaces trh<pid>-0 and -1, each with a veth into a bridge
# in a hub namespace, addresses 10.78.0.1 and .2 that exist only inside
# them) and starts rank 0 on host 0, rank 1 on host 1. Passes when both
# ranks print OK from tests/allreduce_check.c, the link really carried the
# job's bytes (terse-run prints each host link's counters), and terse-run
# left no namespace behind.
#
# Exit 0 pass, 1 fail, 77 skip (the kernel or container refuses network
# namespaces or veth pairs, or we are not root) -- ctest's SKIP_RETURN_CODE.
set -u

tr=${1:?usage: netns_two_hosts.sh path/to/terse-run path/to/allreduce_check}
check=${2:?usage: netns_two_hosts.sh path/to/terse-run path/to/allreduce_check}
. "$(dirname "$0")/netns_probe.sh"
netns_probe "creating network namespaces"

out=$(mktemp)
err=$(mktemp)
pidf=$(mktemp)
trap 'rm -f "$out" "$err" "$pidf"' EXIT
# terse-run's own pid names its namespaces (trh<pid>-*): exec keeps it.
timeout -k 5 60 bash -c 'echo $$ >"$0"; exec "$@"' "$pidf" "$tr" --hosts 2 -n 2 --provider tcp \
    --timeout-ms "${TERSE_TIMEOUT_MS:-20000}" "$check" >"$out" 2>"$err"
rc=$?
pid=$(cat "$pidf")
cat "$out" "$err"

fail=0
[[ $rc == 0 ]] || { echo "FAIL: terse-run exited $rc"; fail=1; }
for r in 0 1; do
    if ! grep -q "^\[$r\] OK rank $r of 2 over net" "$out"; then
        echo "FAIL: rank $r (host $r) has no OK line over net"
        fail=1
    fi
done
# The dense checks alone move more than 4 MiB each way; a link that carried
# less means the ranks did not talk over it.
line=$(grep "^terse-run: host 0 link: sent " "$err")
tx=$(awk '{print $6}' <<<"$line")
rx=$(awk '{print $9}' <<<"$line")
if [[ -z $tx || -z $rx || $tx -lt 4194304 || $rx -lt 4194304 ]]; then
    echo "FAIL: host 0's link carried less than 4 MiB each way (${tx:-?} sent, ${rx:-?} received)"
    fail=1
fi
left=$(ip netns list | cut -d" " -f1 | grep "^trh$pid-")
if [[ -n $left ]]; then
    echo "FAIL: terse-run left namespaces behind: $(echo $left)"
    for ns in $left; do ip netns del "$ns"; done
    fail=1
fi
[[ $fail == 0 ]] && echo "PASS: 2 ranks over tcp across the hosts terse-run --hosts 2 made"
exit $fail
