#!/usr/bin/env bash
# ps-netns.sh [--rate RATE] [--sizes LIST] [--sw LIST] [--codec SPEC]...
#             [--repeats N] [--runs N] [--chunk-bytes N] [--bench PATH] [--timeout SEC]
#             [--colocate] [--no-wait] [--keep-logs] [-h | --help]
#
# `terse-bench ps` with every rank on its own link. Each rank gets its own
# network namespace with one veth pair; the pair's other end sits in a hub
# namespace, on a Linux bridge. Both directions of every link are shaped to
# RATE with tc tbf: the rank side's egress is the rank's upload, the hub
# side's egress its download. (This kernel has tbf but no netem: the links
# are slow but add no latency of their own.) Addresses 10.77.0.(R+1)/24
# exist only on these veths; nothing is routed anywhere else.
#
# For every value of S=W in --sw, this script itself starts each rank in its
# own namespace, one job after the other (never two at once):
#   ip netns exec NS_R env TERSE_RANK=R TERSE_SIZE=N TERSE_ADDR=10.77.0.1:PORT
#       TERSE_PROVIDER=tcp TERSE_IFACE=psn0 FI_TCP_IFACE=psn0 ...
#       timeout ... terse-bench ps --job JOB ... --worker --results FILE
# (TERSE_TOKEN, a fresh 64-character secret per job, is passed in the
# environment rather than on the command line, so ps(1) does not show it):
#   1. the dense allreduce job of W ranks (--job allreduce);
#   2. the parameter-server job of S servers + W workers (--job ps): ranks
#      [0, S) serve, [S, S+W) are workers, every server on its own link too;
#   3. with --colocate, the parameter-server job of W ranks each a worker and
#      a server (terse_ps_config.colocate; rows "W*"), one link per rank.
# Rank 0 of each job writes terse-bench ps's records (ps_bench_report.c) to
# FILE; this script reads them and prints the table itself (the launcher of
# terse-bench ps reads only the records of jobs it started).
#
# Why: with a parameter server a worker's link carries the model once each
# way per step; with a ring allreduce 2(W-1)/W times. With S = W servers a
# server's link carries the same as a worker's. If the links, not the CPUs,
# are what limits, push+pull / allreduce should approach W / (2(W-1)): 1.0 at
# W=2, 0.75 at W=3 (times the codec's compression for a codec). That takes
# a push+pull whose pull flows back while its push still goes out; one that
# sends all of its push before any of its pull returns (terse_ps_pushpull
# today, algos/ps/ps_worker.c) uses one direction of each link at a time, and
# its model is twice that, W / (W-1). The table prints both.
#
# options:
#   --rate RATE     per link and direction, as tc(8) reads rates: 1gbit,
#                   100mbit, 125mbps... (default 1gbit)
#   --sizes LIST    tensor sizes in bytes, comma separated, K/M/G suffixes
#                   (x1024), multiples of 4 (default 16M,64M)
#   --sw LIST       S=W values, comma or space separated, each 2 or 3
#                   (default "2 3": 4 and 6 ranks; terse-bench ps runs at
#                   most 6 ranks)
#   --codec SPEC    push/pull spec of the parameter server, 'dense' for none;
#                   repeat for several (default: dense and int8)
#   --repeats N     timed iterations per row in every job, after 1 warm-up
#                   (default 5); a row's time is their median of the
#                   slowest worker's time (terse-bench ps's rule)
#   --runs N        run every job N times; report the median of the N
#                   medians (default 1)
#   --chunk-bytes N the parameter server's chunk, the unit placed on servers
#                   (terse-bench ps --chunk-bytes; default the library's, 1M)
#   --bench PATH    terse-bench to run (default: build/bench/terse-bench of
#                   this checkout)
#   --timeout SEC   every rank of every job runs under timeout(1) for SEC
#                   seconds (default 300); when one rank fails or times out,
#                   every rank of the job is killed
#   --colocate      also the colocated job of W ranks per S=W (rows "W*")
#   --no-wait       do not wait for `terse-bench train` runs to end first
#   --keep-logs     keep the per-rank logs and records (the directory is
#                   printed); they are kept anyway when a job fails
#   -h, --help      this text
#
# Before every job the script waits while `pgrep -f "terse-bench train"`
# finds a process (someone is timing training runs): it polls every 10 s
# and gives up after 15 minutes (exit 1). A lock (/tmp/terse-ps-netns.lock)
# keeps two copies of this script from measuring at once.
#
# environment: PS_NETNS_BURST (tbf burst, bytes; default the larger of 256 KiB
# and 2 ms at RATE: it must exceed the veth's 64 KiB GSO segments),
# PS_NETNS_LATENCY (tbf latency, default 50ms), TERSE_TIMEOUT_MS (the
# library's per-operation timeout; default --timeout).
#
# Needs root, ip and tc (iproute2), timeout (coreutils), and a kernel that
# allows network namespaces, veth pairs, bridges and tbf. Every namespace
# (and with it every veth, the bridge and the qdiscs) is removed on exit,
# on success, failure or a signal.
#
# exit status: 0 every row measured; 1 a job failed or timed out, or the
# wait for training runs gave up (what completed is printed); 2 usage error;
# 77 cannot run here (not root, no ip/tc/timeout, or the kernel refuses
# namespaces, veth pairs, bridges or tbf).
set -u

prog=${0##*/}
here=$(cd "$(dirname "$0")" && pwd)

usage() {
    awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
}
die_usage() {
    echo "$prog: $* (try $prog --help)" >&2
    exit 2
}
cannot() {
    echo "$prog: cannot run here: $*" >&2
    exit 77
}
say() { echo "$prog: $*" >&2; }

# ---------------------------------------------------------------- options

rate=1gbit
sizes_arg=16M,64M
sw_arg="2 3"
codecs=()
repeats=5
runs=1
bench="$here/../../build/bench/terse-bench"
job_timeout=300
no_wait=0
colocate=0
keep_logs=0
chunk_args=()

while [[ $# -gt 0 ]]; do
    opt=$1
    val=
    case $opt in
        --*=*) val=${opt#*=}; opt=${opt%%=*}; set -- "$opt" "$val" "${@:2}" ;;
    esac
    case $opt in
        -h | --help) usage; exit 0 ;;
        --no-wait) no_wait=1; shift; continue ;;
        --colocate) colocate=1; shift; continue ;;
        --keep-logs) keep_logs=1; shift; continue ;;
        --rate | --sizes | --sw | --codec | --repeats | --runs | --chunk-bytes | --bench | --timeout)
            [[ $# -ge 2 ]] || die_usage "option '$opt' needs a value"
            val=$2
            shift 2 ;;
        *) die_usage "unknown argument '$opt'" ;;
    esac
    case $opt in
        --rate) rate=$val ;;
        --sizes) sizes_arg=$val ;;
        --sw) sw_arg=$val ;;
        --codec)
            [[ -n $val && $val != *[[:space:]]* ]] || die_usage "bad --codec '$val'"
            codecs+=("$val") ;;
        --repeats) repeats=$val ;;
        --runs) runs=$val ;;
        --chunk-bytes)
            [[ $val =~ ^[0-9]+[KkMmGg]?[Bb]?$ ]] || die_usage "bad --chunk-bytes '$val'"
            chunk_args=(--chunk-bytes "$val") ;;
        --bench) bench=$val ;;
        --timeout) job_timeout=$val ;;
    esac
done
[[ ${#codecs[@]} -gt 0 ]] || codecs=(dense int8)

[[ $repeats =~ ^[1-9][0-9]*$ && $repeats -le 10000 ]] || die_usage "bad --repeats '$repeats' (1..10000)"
[[ $runs =~ ^[1-9][0-9]*$ && $runs -le 100 ]] || die_usage "bad --runs '$runs' (1..100)"
[[ $job_timeout =~ ^[1-9][0-9]*$ ]] || die_usage "bad --timeout '$job_timeout' (seconds, > 0)"

# S=W values.
sws=()
for v in ${sw_arg//,/ }; do
    [[ $v == 2 || $v == 3 ]] || die_usage "bad --sw value '$v' (each 2 or 3: S + W ranks, at most 6)"
    for u in "${sws[@]}"; do [[ $u != "$v" ]] || die_usage "--sw repeats $v"; done
    sws+=("$v")
done
[[ ${#sws[@]} -gt 0 ]] || die_usage "empty --sw"

# Sizes in bytes (K, M, G are x1024, as terse-bench ps reads them).
sizes=()
for s in ${sizes_arg//,/ }; do
    u=${s^^}
    u=${u%B}
    [[ $u =~ ^([0-9]+)([KMG]?)$ ]] || die_usage "bad size '$s' in --sizes"
    n=$((10#${BASH_REMATCH[1]}))
    case ${BASH_REMATCH[2]} in K) n=$((n << 10)) ;; M) n=$((n << 20)) ;; G) n=$((n << 30)) ;; esac
    ((n > 0 && n % 4 == 0)) || die_usage "bad size '$s' in --sizes (want a positive multiple of 4)"
    sizes+=("$n")
done
[[ ${#sizes[@]} -gt 0 ]] || die_usage "empty --sizes"
sizes_csv=$(IFS=,; echo "${sizes[*]}")

# RATE in bytes per second (rate_bytes).
. "$here/../core/rate-bytes.sh"
if ! bps=$(rate_bytes "$rate") || [[ $bps == 0 ]]; then
    die_usage "cannot read --rate '$rate' (want e.g. 1gbit, 100mbit, 125mbps)"
fi
burst_default=$(awk -v b="$bps" 'BEGIN { x = b * 0.002; if (x < 262144) x = 262144; printf "%.0f\n", x }')
burst=${PS_NETNS_BURST:-$burst_default}
latency=${PS_NETNS_LATENCY:-50ms}
op_timeout_ms=${TERSE_TIMEOUT_MS:-$((job_timeout * 1000))}

[[ -x $bench ]] || die_usage "terse-bench not found at '$bench' (build first, or give --bench PATH)"
bench=$(cd "$(dirname "$bench")" && pwd)/$(basename "$bench")

[[ $(id -u) == 0 ]] || cannot "must run as root (network namespaces and tc qdiscs need CAP_SYS_ADMIN and CAP_NET_ADMIN)"
for tool in ip tc timeout; do
    command -v "$tool" >/dev/null 2>&1 || cannot "'$tool' not found (Debian: apt-get install iproute2 coreutils)"
done

max_sw=0
for v in "${sws[@]}"; do ((v > max_sw)) && max_sw=$v; done
nslots=$((2 * max_sw)) # ranks of the largest job: S + W

# ---------------------------------------------------------------- state and cleanup

tag="tpsn$$"
hub="$tag-hub"
ifname=psn0 # the rank side of every veth, inside its own namespace
ns_rank=()
addr=()
for ((r = 0; r < nslots; r++)); do
    ns_rank+=("$tag-r$r")
    addr+=("10.77.0.$((r + 1))")
done
workdir=$(mktemp -d /tmp/ps-netns-XXXXXX)
rank_pids=()
created=()
failed_any=0

kill_ranks() {
    local p
    for p in "${rank_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${rank_pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    rank_pids=()
    # Anything else left in a rank namespace (a child a rank started).
    local ns pids
    for ns in "${created[@]}"; do
        pids=$(ip netns pids "$ns" 2>/dev/null)
        # shellcheck disable=SC2086
        [[ -z $pids ]] || kill -KILL $pids 2>/dev/null
    done
}

# shellcheck disable=SC2317 # (called by the EXIT trap)
cleanup() {
    kill_ranks
    local ns
    for ns in "${created[@]}"; do
        ip netns del "$ns" 2>/dev/null || say "warning: could not remove network namespace $ns"
    done
    created=()
    if [[ $keep_logs == 1 || $failed_any == 1 ]]; then
        say "logs and records kept in $workdir"
    else
        rm -rf "$workdir"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# ---------------------------------------------------------------- one lock, no training runs

exec 9>/tmp/terse-ps-netns.lock
if ! flock -n 9 2>/dev/null; then
    say "another $prog is measuring; waiting for it (lock /tmp/terse-ps-netns.lock)"
    flock 9
fi

wait_for_quiet() {
    [[ $no_wait == 1 ]] && return 0
    local waited=0
    while pgrep -f "terse-bench train" >/dev/null 2>&1; do
        if ((waited >= 900)); then
            say "a 'terse-bench train' process is still running after 15 minutes; giving up" \
                "(measuring beside it would disturb both; --no-wait skips this check)"
            return 1
        fi
        ((waited == 0)) && say "waiting for 'terse-bench train' to finish (pgrep -f every 10 s, at most 15 min)"
        sleep 10
        waited=$((waited + 10))
    done
    return 0
}

# ---------------------------------------------------------------- the network

add_ns() {
    ip netns add "$1" 2>/dev/null || return 1
    created+=("$1")
    ip -n "$1" link set lo up
    # No IPv6 chatter (router solicitations, DAD) on the shaped links.
    ip netns exec "$1" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 >/dev/null 2>&1 || true
    ip netns exec "$1" sysctl -qw net.ipv6.conf.default.disable_ipv6=1 >/dev/null 2>&1 || true
}

shape() { # namespace device
    ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$rate" burst "$burst" \
        latency "$latency"
}

add_ns "$hub" || cannot "the kernel refuses network namespaces (ip netns add $hub failed)"
ip -n "$hub" link add br0 type bridge stp_state 0 forward_delay 0 2>/dev/null ||
    cannot "the kernel refuses a Linux bridge (ip link add br0 type bridge failed)"
ip -n "$hub" link set br0 up
for ((r = 0; r < nslots; r++)); do
    ns=${ns_rank[r]}
    add_ns "$ns" || cannot "the kernel refuses network namespace $ns"
    # Made inside the rank's namespace with its peer placed straight into the
    # hub: the host's own namespace never sees either end.
    ip -n "$ns" link add "$ifname" type veth peer name "h$r" netns "$hub" 2>/dev/null ||
        cannot "the kernel refuses veth pairs (ip link add type veth failed)"
    ip -n "$hub" link set "h$r" master br0 || cannot "cannot attach h$r to the bridge"
    ip -n "$ns" addr add "${addr[r]}/24" dev "$ifname"
    ip -n "$hub" link set "h$r" up
    ip -n "$ns" link set "$ifname" up
    shape "$ns" "$ifname" || cannot "tc refused 'tbf rate $rate burst $burst latency $latency' on $ifname in $ns"
    shape "$hub" "h$r" || cannot "tc refused 'tbf rate $rate burst $burst latency $latency' on h$r in $hub"
done
# A veth reports carrier a moment after both ends are up, and libfabric's tcp
# provider lists only interfaces that are running.
for ((r = 0; r < nslots; r++)); do
    state=
    for _ in $(seq 50); do
        state=$(ip netns exec "${ns_rank[r]}" cat "/sys/class/net/$ifname/operstate" 2>/dev/null)
        [[ $state == up ]] && break
        sleep 0.1
    done
    [[ $state == up ]] || { say "veth of rank $r did not come up ($state)"; exit 77; }
done
say "$nslots namespaces ($tag-r0..$((nslots - 1))) on bridge br0 in $hub; every link" \
    "tbf rate $rate burst $burst latency $latency, both ways"

# ---------------------------------------------------------------- one job

# cpu_now = CPU seconds (user + system) of this shell's waited-for children
# (and theirs) so far. Not in $(...): a subshell has its own children.
child_cpu() {
    times >"$workdir/times.txt" # line 2: "0m1.234s 0m0.567s"
    cpu_now=$(awk 'NR == 2 {
        for (i = 1; i <= NF; i++) { split($i, m, "m"); sub(/s$/, "", m[2]); t += m[1] * 60 + m[2] }
        printf "%.1f\n", t }' "$workdir/times.txt")
}

# run_job_once NAME NRANKS RESULTS ARGS...: start NRANKS ranks, rank R in
# namespace R, wait for all; the first rank that fails gets the others
# killed. Returns 0 when every rank exited 0, 1 when one did not.
run_job_once() {
    local name=$1 n=$2 res=$3
    shift 3
    local token port r t0=$SECONDS cpu0 cpu_now
    child_cpu
    cpu0=$cpu_now
    token=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
    port=$((20000 + RANDOM % 20000))
    rank_pids=()
    : >"$res"
    for ((r = 0; r < n; r++)); do
        TERSE_TOKEN=$token ip netns exec "${ns_rank[r]}" env TERSE_RANK="$r" TERSE_SIZE="$n" \
            TERSE_ADDR="${addr[0]}:$port" TERSE_PROVIDER=tcp TERSE_IFACE="$ifname" \
            FI_TCP_IFACE="$ifname" TERSE_TIMEOUT_MS="$op_timeout_ms" OPENBLAS_NUM_THREADS=1 \
            timeout -k 5 "$job_timeout" "$bench" ps "$@" --worker --results "$res" \
            </dev/null >"$workdir/$name.rank$r.log" 2>&1 &
        rank_pids+=($!)
    done
    local left=("${rank_pids[@]}") pid rc bad=0 why=
    while [[ ${#left[@]} -gt 0 ]]; do
        pid=
        wait -n -p pid "${left[@]}"
        rc=$?
        [[ -n $pid ]] || break
        local rest=() p
        for p in "${left[@]}"; do [[ $p == "$pid" ]] || rest+=("$p"); done
        left=("${rest[@]}")
        if [[ $rc != 0 && $bad == 0 ]]; then
            bad=1
            for ((r = 0; r < n; r++)); do [[ ${rank_pids[r]} == "$pid" ]] && break; done
            if [[ $rc == 124 || $rc == 137 ]]; then
                why="rank $r timed out after $job_timeout s"
            else
                why="rank $r exited $rc"
            fi
            say "$name: $why; killing the other ranks"
            for p in "${left[@]}"; do kill -TERM "$p" 2>/dev/null; done
        fi
    done
    kill_ranks
    if [[ $bad == 1 ]]; then
        failed_any=1
        for ((r = 0; r < n; r++)); do
            echo "---- $name rank $r (namespace ${ns_rank[r]}), last lines of its log:" >&2
            tail -n 8 "$workdir/$name.rank$r.log" >&2
        done
        printf '%s\t%s\n' "$name" "$why" >>"$workdir/failed.tsv"
        return 1
    fi
    child_cpu
    say "$name: done in $((SECONDS - t0)) s; the ranks used" \
        "$(awk -v a="$cpu0" -v b="$cpu_now" 'BEGIN { printf "%.1f", b - a }') CPU s on $(nproc) cores"
    return 0
}

# run_job NAME NRANKS RESULTS ARGS...: run_job_once after no training run
# is left; measured again (up to 3 times) when one started meanwhile.
# Returns 0, 1 (the job failed) or 2 (the wait for training runs gave up).
run_job() {
    local attempt
    for attempt in 1 2 3; do
        wait_for_quiet || return 2
        run_job_once "$@" || return 1
        if [[ $no_wait == 1 ]] || ! pgrep -f "terse-bench train" >/dev/null 2>&1; then
            return 0
        fi
        say "$1: a 'terse-bench train' process started during this job (attempt $attempt);" \
            "its times are not kept"
    done
    say "$1: every attempt overlapped a training run; giving up"
    return 2
}

# ---------------------------------------------------------------- the jobs

: >"$workdir/records.tsv"
: >"$workdir/failed.tsv"
: >"$workdir/order.tsv"
codec_args=()
for c in "${codecs[@]}"; do codec_args+=(--codec "$c"); done
gave_up=0
for w in "${sws[@]}"; do
    s=$w
    for z in "${sizes[@]}"; do
        for c in "${codecs[@]}"; do printf '%s\t%s\t%s\t%s\n' "$s" "$w" "$z" "$c" >>"$workdir/order.tsv"; done
    done
    if [[ $colocate == 1 ]]; then
        for z in "${sizes[@]}"; do
            for c in "${codecs[@]}"; do printf '%s*\t%s\t%s\t%s\n' "$w" "$w" "$z" "$c" >>"$workdir/order.tsv"; done
        done
    fi
    for ((run = 1; run <= runs; run++)); do
        # The allreduce first, then the parameter server it is compared with.
        say "S=W=$w, run $run of $runs: dense allreduce among $w ranks"
        res="$workdir/ar-w$w-run$run.tsv"
        run_job "ar-w$w-run$run" "$w" "$res" --job allreduce --workers "$w" --sizes "$sizes_csv" \
            --repeats "$repeats" --provider tcp
        rc=$?
        [[ $rc == 2 ]] && { gave_up=1; break 2; }
        cat "$res" >>"$workdir/records.tsv" 2>/dev/null
        say "S=W=$w, run $run of $runs: parameter server, $s servers + $w workers ($((s + w)) ranks)"
        res="$workdir/ps-s$s-w$w-run$run.tsv"
        run_job "ps-s$s-w$w-run$run" "$((s + w))" "$res" --job ps --servers "$s" --workers "$w" \
            --sizes "$sizes_csv" --repeats "$repeats" --provider tcp "${codec_args[@]}" "${chunk_args[@]}"
        rc=$?
        [[ $rc == 2 ]] && { gave_up=1; break 2; }
        cat "$res" >>"$workdir/records.tsv" 2>/dev/null
        [[ $colocate == 1 ]] || continue
        say "S=W=$w, run $run of $runs: parameter server, $w colocated ranks (each a worker and a server)"
        res="$workdir/pc-w$w-run$run.tsv"
        run_job "pc-w$w-run$run" "$w" "$res" --job ps --servers "$w" --workers "$w" --colocate \
            --sizes "$sizes_csv" --repeats "$repeats" --provider tcp "${codec_args[@]}" "${chunk_args[@]}"
        rc=$?
        [[ $rc == 2 ]] && { gave_up=1; break 2; }
        cat "$res" >>"$workdir/records.tsv" 2>/dev/null
    done
done

# ---------------------------------------------------------------- the table

cpu=$(awk -F: '/^model name/ { sub(/^[ \t]+/, "", $2); print $2; exit }' /proc/cpuinfo)
echo "# $prog: cpu ${cpu:-unknown} ($(nproc) cores), rate $rate per link each way" \
     "(tbf burst $burst B, latency $latency), provider tcp, one netns + veth per rank on one bridge"
echo "# $repeats timed iterations (+1 warm-up) per job, $runs run(s) per job; time = median of the slowest worker" \
     "(median over runs of the per-run medians); ps chunk ${chunk_args[1]:-1M (the library default)}"
echo "# pp: terse_ps_pushpull + wait, S servers + W workers; ar: dense terse_allreduce (avg) among W ranks"
echo "# ratio = pp / ar (below 1: the parameter server is faster); model = W / (2(W-1)) x (pp.MB / size):"
echo "#   the per-link model (PS: the model once per link each way; ring: 2(W-1)/W), with the codec's"
echo "#   measured compression; +bal: the same x max(1, W/S x balance), the busiest server's link;"
echo "#   serial: 2 x +bal, the same links if a push+pull sends all of its push before any of its"
echo "#   pull comes back (one link direction idle at a time), as terse_ps_pushpull did before"
echo "#   partitions (TERSE_PS_WINDOW=1 TERSE_PS_PARTITION_BYTES=1G comes close to it again)"
echo "# pp.MB, ar.MB: MB (1e6 B) on the wire per worker per step, the busier direction; pp.line, ar.line:"
echo "#   ms that many bytes take at RATE on the busiest link (payload only; TCP/IP headers add ~4%)"
echo "# up, down: MB a worker's link carried each way per step (its interface's counters, TCP/IP"
echo "#   included; max over workers); duplex: the share of the milliseconds in which the link was"
echo "#   busy that both directions were (mean over workers and steps; 0: one way at a time)"
[[ $colocate == 1 ]] && echo "# W*: W colocated ranks, each a worker and a server (--colocate); its pp.MB is what a" \
    "rank sent as both, its link carries 2(W-1)/W of the model each way like the ring's (no model column)"
echo "#"
awk -F'\t' -v Bps="$bps" -v runs="$runs" '
function label(b) {
    if (b % 1073741824 == 0) return (b / 1073741824) "G"
    if (b % 1048576 == 0) return (b / 1048576) "M"
    if (b % 1024 == 0) return (b / 1024) "K"
    return b
}
function median(list,    a, n, i, j, t) {
    n = split(list, a, " ")
    for (i = 2; i <= n; i++)
        for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function max(a, b) { return a > b ? a : b }
FILENAME == ARGV[1] { order[++no] = $0; next }
FILENAME == ARGV[2] { next } # failed.tsv: listed after the table
NF >= 17 && ($1 == "ps" || $1 == "pc" || $1 == "ar") {
    k = $1 SUBSEP $4 SUBSEP $5 SUBSEP $6
    if ($2 == 1) {
        times[k] = times[k] " " $9
        nok[k]++
        wire[k] = max(wire[k], max($10, $11))
        up[k] = max(up[k], $15); down[k] = max(down[k], $16); dup[k] += $17 / runs
    } else if (!(k in err)) {
        err[k] = $14
    }
    if ($1 != "ar" && $12 > 0) {
        m = split($13, p, ",")
        sum = 0; mx = 0
        for (i = 1; i <= m; i++) { sum += p[i]; mx = max(mx, p[i] + 0) }
        bal[k] = sum > 0 ? mx / (sum / m) : 1
    }
}
END {
    printf "#%4s %7s %-10s %9s %9s %6s %6s %6s %6s %7s %7s %8s %8s %7s %7s %6s %6s\n", "S=W",
           "size", "codec", "pp(ms)", "ar(ms)", "ratio", "model", "+bal", "serial", "pp.MB", "ar.MB",
           "pp.line", "ar.line", "pp.up", "pp.down", "pp.dup", "ar.dup"
    for (i = 1; i <= no; i++) {
        split(order[i], o, "\t")
        s = o[1]; w = o[2]; z = o[3]; c = o[4]
        kp = (s ~ /\*$/ ? "pc" : "ps") SUBSEP w SUBSEP z SUBSEP c
        sl = s; s += 0 # "3*": 3 servers, colocated
        ka = "ar" SUBSEP w SUBSEP z SUBSEP "dense"
        printf " %4s %7s %-10s", sl, label(z), c
        if (nok[kp] < runs) {
            e = (kp in err) ? err[kp] : "the parameter-server job failed (see above)"
            printf " failed (%d of %d runs measured): %s\n", nok[kp] + 0, runs, e
            continue
        }
        pp = median(times[kp])
        printf " %9.3f", 1e3 * pp
        f = w / (2 * (w - 1)) * wire[kp] / z
        fb = f * max(1, w / s * bal[kp])
        if (nok[ka] < runs) {
            e = (ka in err) ? err[ka] : "the allreduce job failed (see above)"
            printf " %9s %6s %6.3f %6.3f %6.3f %7.2f %7s %8.1f %8s  allreduce: %s\n", "-", "-", f,
                   fb, 2 * fb,
                   wire[kp] / 1e6, "-", 1e3 * wire[kp] * max(1, w / s * bal[kp]) / Bps, "-", e
            continue
        }
        ar = median(times[ka])
        if (sl ~ /\*$/) { # colocated: pp.MB counts a rank as worker and server; its link carries what the ring does
            printf " %9.3f %6.3f %6s %6s %6s %7.2f %7.2f %8s %8.1f %7.2f %7.2f %6.2f %6.2f\n",
                   1e3 * ar, pp / ar, "-", "-", "-", wire[kp] / 1e6, wire[ka] / 1e6, "-",
                   1e3 * wire[ka] / Bps, up[kp] / 1e6, down[kp] / 1e6, dup[kp], dup[ka]
            continue
        }
        printf " %9.3f %6.3f %6.3f %6.3f %6.3f %7.2f %7.2f %8.1f %8.1f %7.2f %7.2f %6.2f %6.2f\n",
               1e3 * ar, pp / ar, f, fb, 2 * fb,
               wire[kp] / 1e6, wire[ka] / 1e6, 1e3 * wire[kp] * max(1, w / s * bal[kp]) / Bps,
               1e3 * wire[ka] / Bps, up[kp] / 1e6, down[kp] / 1e6, dup[kp], dup[ka]
    }
}' "$workdir/order.tsv" "$workdir/failed.tsv" "$workdir/records.tsv"

if [[ $gave_up == 1 ]]; then
    echo "# stopped early: 'terse-bench train' runs kept this machine busy (see the messages above)"
    failed_any=1
fi
if [[ -s $workdir/failed.tsv ]]; then
    while IFS=$'\t' read -r job why; do echo "# job $job failed: $why"; done <"$workdir/failed.tsv"
    failed_any=1
fi
[[ $failed_any == 0 ]] && exit 0
exit 1
