#!/usr/bin/env bash
# slow-net.sh RATE COMMAND [ARGS...]
#
# Run COMMAND inside a fresh network namespace whose only interface, its
# loopback, is rate-limited to RATE with a token bucket filter (tc-tbf(8)).
# This is how `terse-bench allreduce` sees a slow link on one machine: the
# ranks talk over 127.0.0.1 through the shaped loopback. The kernel here has
# tbf but not netem, so the link is slow but adds no latency of its own.
#
# Every rank's traffic crosses the one shaped device in both directions, so
# RATE is the total for the whole job: two ranks exchanging at once each get
# about half of it.
#
# The namespace is always removed (on success, failure, or a signal), and
# the exit status is COMMAND's.
set -u

prog=${0##*/}

usage() {
    cat <<EOF
usage: $prog RATE COMMAND [ARGS...]
       $prog --help

Run COMMAND in a new network namespace whose loopback is shaped to RATE,
with TERSE_PROVIDER=tcp (libfabric's net provider), then remove the
namespace. Needs root (it creates a namespace and a qdisc).

  RATE     as tc(8) reads rates: 1gbit, 100mbit, 10gbit, 500kbit, 125mbps...
           It is the total for every process in the namespace together.

example:
  $prog 1gbit build/bench/terse-bench allreduce -n 2 --provider tcp --vs-mpi

environment:
  SLOW_NET_BURST     tbf burst (default: the larger of 256kb and 2 ms at
                     RATE; it must exceed loopback's 64 KiB segments)
  SLOW_NET_LATENCY   tbf latency, the longest a packet may queue (default 50ms)

Open MPI inside the namespace needs only loopback interfaces:
  mpirun --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo ...
(terse-bench allreduce --vs-mpi passes these itself).

exit status: COMMAND's; 2 usage error; 3 namespace or shaping set-up failed.
EOF
}

if [[ $# -ge 1 && ( $1 == -h || $1 == --help ) ]]; then
    usage
    exit 0
fi
if [[ $# -lt 2 ]]; then
    echo "$prog: need RATE and COMMAND (try $prog --help)" >&2
    exit 2
fi
rate=$1
shift

if [[ $(id -u) != 0 ]]; then
    echo "$prog: must run as root: creating a network namespace and a tc qdisc needs" \
         "CAP_SYS_ADMIN and CAP_NET_ADMIN (try: sudo $prog $rate $*)" >&2
    exit 2
fi
for tool in ip tc; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "$prog: '$tool' not found (Debian: apt-get install iproute2)" >&2
        exit 3
    fi
done

# RATE in bytes per second, for the default burst (rate_bytes).
. "$(dirname "${BASH_SOURCE[0]}")/rate-bytes.sh"

if ! bps=$(rate_bytes "$rate") || [[ $bps == 0 ]]; then
    echo "$prog: cannot read rate '$rate' (want e.g. 1gbit, 100mbit, 125mbps)" >&2
    exit 2
fi
# Loopback hands tbf segments of up to 64 KiB (GSO), and tbf drops any packet
# larger than its burst, so the bucket must hold several; beyond that, 2 ms
# worth of RATE keeps the timer granularity from capping the rate.
burst_default=$(awk -v b="$bps" 'BEGIN { x = b * 0.002; if (x < 262144) x = 262144; printf "%.0f\n", x }')
burst=${SLOW_NET_BURST:-$burst_default}
latency=${SLOW_NET_LATENCY:-50ms}

# A unique name: two runs at once never share (or delete) a namespace.
ns="terse-slow-$$-$RANDOM"
child=

cleanup() {
    if [[ -n $child ]] && kill -0 "$child" 2>/dev/null; then
        kill -TERM "$child" 2>/dev/null
        wait "$child" 2>/dev/null
    fi
    if ip netns list 2>/dev/null | cut -d" " -f1 | grep -qxF -- "$ns"; then
        # Processes COMMAND left behind in the namespace would keep it (and
        # its shaped loopback) alive after its name is gone: end them first.
        local pids
        pids=$(ip netns pids "$ns" 2>/dev/null)
        if [[ -n $pids ]]; then
            # shellcheck disable=SC2086
            kill -KILL $pids 2>/dev/null
        fi
        ip netns del "$ns" 2>/dev/null ||
            echo "$prog: warning: could not remove network namespace $ns" >&2
    fi
}
trap cleanup EXIT
# On a signal: forward it to COMMAND, let EXIT clean up, and exit as a
# process killed by that signal would (128 + number).
on_signal() {
    local sig=$1 code=$2
    if [[ -n $child ]]; then kill -"$sig" "$child" 2>/dev/null; fi
    exit $((128 + code))
}
trap 'on_signal INT 2' INT
trap 'on_signal TERM 15' TERM
trap 'on_signal HUP 1' HUP

if ! ip netns add "$ns"; then
    echo "$prog: cannot create network namespace $ns (does this kernel or" \
         "container allow network namespaces?)" >&2
    exit 3
fi
if ! ip -n "$ns" link set lo up; then
    echo "$prog: cannot bring up loopback in $ns" >&2
    exit 3
fi
if ! ip netns exec "$ns" tc qdisc add dev lo root tbf rate "$rate" burst "$burst" \
        latency "$latency"; then
    echo "$prog: tc refused 'tbf rate $rate burst $burst latency $latency' on lo" \
         "(is sch_tbf available?)" >&2
    exit 3
fi
echo "$prog: namespace $ns, lo shaped: $(ip netns exec "$ns" tc qdisc show dev lo)" >&2

# In the background so this shell can forward signals and clean up; the
# command keeps our stdin, stdout and stderr.
TERSE_PROVIDER=tcp ip netns exec "$ns" "$@" <&0 &
child=$!
wait "$child"
status=$?
# wait returns >128 when a trapped signal interrupted it; the trap has then
# already exited, so reaching here means the command itself finished.
child=
exit "$status"
