#!/usr/bin/env bash
# terse-run --hosts: ranks on "hosts" made of network namespaces.
# Usage: terse_run_hosts.sh PATH/TO/terse-run PATH/TO/allreduce_check PATH/TO/allreduce_time
#
# Checks: usage errors (exit 2 with a sentence, also without root); a job of
# 2 hosts x 2 ranks on 1gbit links where every rank reports, through
# terse_comm_topology, host r/2 of 2 and local rank r%2 of 2, the sums are
# right and both host links carried the job; uneven blocks (3 ranks on 2
# hosts: 2 + 1); and that no namespace terse-run created (and with it no
# veth or bridge: they live only inside them) remains after a normal run,
# after a rank is killed mid-run, and after terse-run gets SIGTERM; and
# that those a SIGKILLed terse-run left are removed by the next one, and a
# running one's are not.
# Every run is bounded by `timeout`.
#
# Exit 0 pass, 1 fail, 77 skip (not root, or no network namespaces / veth).
set -uo pipefail
TR=${1:?usage: terse_run_hosts.sh terse-run allreduce_check allreduce_time}
CHECK=${2:?usage}
TIME=${3:?usage}
. "$(dirname "$0")/netns_probe.sh"
netns_probe "terse-run --hosts"

unset TERSE_PROVIDER TERSE_TIMEOUT_MS TERSE_TOPOLOGY TERSE_HOST
work=$(mktemp -d)
launchers=() # terse-run pids whose namespaces must be gone
stale=()     # namespaces this script makes as a killed launcher's leftovers
cleanup() {
    local p ns
    for ns in "${stale[@]}"; do ip netns del "$ns" 2>/dev/null; done
    for p in "${launchers[@]}"; do
        kill -KILL "$p" 2>/dev/null
        for ns in $(ip netns list 2>/dev/null | cut -d" " -f1 | grep "^trh$p-"); do
            ip netns del "$ns" 2>/dev/null
        done
    done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
failures=0
fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}
ok() { echo "ok: $*"; }

# start NAME ARGS...: terse-run ARGS in the background under a 60 s timeout;
# its own pid (for its namespaces' names) in $tr_pid, timeout's in $bg.
start() {
    local name=$1
    shift
    rm -f "$work/$name.pid"
    t0=$SECONDS
    timeout -k 5 60 bash -c 'echo $$ >"$0"; exec "$@"' "$work/$name.pid" "$TR" "$@" \
        >"$work/$name.out" 2>"$work/$name.err" &
    bg=$!
    for _ in $(seq 100); do
        [[ -s $work/$name.pid ]] && break
        sleep 0.05
    done
    tr_pid=$(cat "$work/$name.pid" 2>/dev/null)
    [[ -n $tr_pid ]] && launchers+=("$tr_pid")
}
finish() { # NAME: wait for it; status in $rc
    wait "$bg"
    rc=$?
    if [[ $rc == 124 ]] || [[ $rc == 137 && $((SECONDS - t0)) -ge 60 ]]; then
        fail "$1: terse-run did not finish within 60 s"
    fi
}
# no_leftovers NAME: no namespace of terse-run $tr_pid is left
no_leftovers() {
    local left
    left=$(ip netns list | cut -d" " -f1 | grep "^trh$tr_pid-")
    if [[ -n $left ]]; then
        fail "$1: namespaces left behind: $(echo $left)"
    else
        ok "$1: no namespace of terse-run $tr_pid remains"
    fi
}
show() {
    sed "s/^/  [$1 out] /" "$work/$1.out"
    sed "s/^/  [$1 err] /" "$work/$1.err"
}

# --- usage errors: exit 2 with a sentence, before anything is created
usage() { # NAME WANT-IN-STDERR ARGS...
    local name=$1 want=$2
    shift 2
    timeout -k 2 10 "$TR" "$@" >"$work/$name.out" 2>"$work/$name.err"
    local r=$?
    if [[ $r == 2 ]] && grep -q -- "$want" "$work/$name.err"; then
        ok "$name: exit 2, '$want'"
    else
        fail "$name: exit $r, stderr: $(cat "$work/$name.err")"
    fi
}
usage link-alone "add --hosts" -n 2 --link 1gbit true
usage bad-rate "rate as tc writes it" -n 2 --hosts 2 --link fast true
usage empty-host "without a rank" -n 5 --hosts 4 true
usage too-many-hosts "without a rank" -n 2 --hosts 3 true
usage with-addr "does not go with --hosts" -n 2 --hosts 2 --addr 127.0.0.1:5000 true
usage with-shm "cannot cross --hosts" -n 2 --hosts 2 --provider shm true
if command -v setpriv >/dev/null 2>&1; then
    setpriv --reuid=65534 --regid=65534 --clear-groups "$TR" -n 2 --hosts 2 true \
        >"$work/noroot.out" 2>"$work/noroot.err"
    r=$?
    if [[ $r == 2 ]] && grep -q "needs root" "$work/noroot.err"; then
        ok "without root: exit 2: $(cat "$work/noroot.err")"
    else
        fail "without root: exit $r, stderr: $(cat "$work/noroot.err")"
    fi
fi
grep -q -- "--hosts H" <("$TR" --help) || fail "--help does not describe --hosts"

# --- 2 hosts x 2 ranks on shaped links
start grid --hosts 2 -n 4 --link 1gbit --timeout-ms 30000 "$CHECK"
finish grid
if [[ $rc != 0 ]]; then
    fail "grid: exit $rc"
    show grid
fi
for r in 0 1 2 3; do
    want="[$r] topology rank $r host $((r / 2)) of 2 local $((r % 2)) of 2"
    grep -qxF "$want" "$work/grid.out" || fail "grid: no line '$want'"
    grep -q "^\[$r\] OK rank $r of 4 over " "$work/grid.out" || fail "grid: rank $r has no OK line"
done
for h in 0 1; do
    line=$(grep "^terse-run: host $h link: sent " "$work/grid.err")
    sent=$(awk '{print $6}' <<<"$line")
    recv=$(awk '{print $9}' <<<"$line")
    # the dense checks alone send more than 2 MiB across each way
    if [[ -z $sent || -z $recv || $sent -lt 2097152 || $recv -lt 2097152 ]]; then
        fail "grid: host $h's link carried too little: '$line'"
    fi
done
[[ $failures == 0 ]] && ok "grid: 2 hosts x 2 ranks, sums right, both links carried the job"
no_leftovers grid

# --- uneven: 3 ranks on 2 hosts in blocks of 2
start uneven --hosts 2 -n 3 --timeout-ms 30000 "$CHECK"
finish uneven
[[ $rc == 0 ]] || { fail "uneven: exit $rc"; show uneven; }
for want in "[0] topology rank 0 host 0 of 2 local 0 of 2" \
    "[1] topology rank 1 host 0 of 2 local 1 of 2" "[2] topology rank 2 host 1 of 2 local 0 of 1"; do
    grep -qxF "$want" "$work/uneven.out" || fail "uneven: no line '$want'"
done
no_leftovers uneven

# wait_ranks NAME: until host 1's namespace holds its 2 ranks (bounded)
wait_ranks() {
    local pids
    for _ in $(seq 200); do
        pids=$(ip netns pids "trh$tr_pid-1" 2>/dev/null)
        [[ $(wc -w <<<"$pids") -ge 2 ]] && return 0
        sleep 0.05
    done
    fail "$1: the ranks never appeared in trh$tr_pid-1"
    return 1
}

# --- a rank killed mid-run: the job stops with its status, hosts removed
start killed --hosts 2 -n 4 --timeout-ms 30000 "$TIME" 1048576 1000
if wait_ranks killed; then
    victim=$(ip netns pids "trh$tr_pid-1" | head -1)
    kill -KILL "$victim"
fi
finish killed
[[ $rc == 137 ]] && ok "killed: terse-run exited 137" || { fail "killed: exit $rc, want 137"; show killed; }
no_leftovers killed

# --- stale namespaces: what a SIGKILLed launcher left is swept by the next
# terse-run --hosts, a running launcher's is kept. Made here: namespaces
# named after a pid that is gone (one with a process inside, which keeps
# them), and after this script's shell (no terse-run), beside an idle job.
start idle --hosts 2 -n 2 sleep 50
idle_pid=$tr_pid idle_bg=$bg idle_t0=$t0
for _ in $(seq 200); do
    [[ -n $(ip netns pids "trh$idle_pid-1" 2>/dev/null) ]] && break
    sleep 0.05
done
sleep 0 &
gone=$!
wait "$gone"
sleep 0 &
gone2=$!
wait "$gone2"
sleep 0 &
gone3=$!
wait "$gone3"
stale=("trh$gone-0" "trh$gone-hub" "trh$$-1" "trh$gone2-0" "trh$gone2-1" "trh$gone3-hub")
for ns in "${stale[@]}"; do ip netns add "$ns" || fail "sweep: cannot make $ns"; done
# a launcher whose pid looks gone (another PID namespace) but that holds its
# lock: its namespaces stay
mkdir -p /run/terse-run
flock "/run/terse-run/$gone3" sleep 30 &
holder=$!
for _ in $(seq 100); do
    flock -n "/run/terse-run/$gone3" true 2>/dev/null || break
    sleep 0.05
done
ip netns exec "trh$gone2-1" sleep 30 &
inside=$!
for _ in $(seq 100); do
    [[ -n $(ip netns pids "trh$gone2-1" 2>/dev/null) ]] && break
    sleep 0.05
done
start sweep --hosts 2 -n 2 --timeout-ms 30000 "$CHECK"
finish sweep
[[ $rc == 0 ]] || { fail "sweep: exit $rc"; show sweep; }
for ns in "trh$gone-0" "trh$gone-hub" "trh$$-1"; do
    if ip netns list | cut -d" " -f1 | grep -qx "$ns"; then
        fail "sweep: the stale namespace $ns is still there"
    elif ! grep -q "removed network namespace $ns, left behind by terse-run" "$work/sweep.err"; then
        fail "sweep: $ns went without its line"
    fi
done
for ns in "trh$gone2-0" "trh$gone2-1" "trh$gone3-hub" "trh$idle_pid-0" "trh$idle_pid-1" \
    "trh$idle_pid-hub"; do
    ip netns list | cut -d" " -f1 | grep -qx "$ns" ||
        fail "sweep: removed $ns, which was in use (a process inside, or a running terse-run)"
done
kill "$inside" "$holder" 2>/dev/null
wait "$inside" "$holder" 2>/dev/null
rm -f "/run/terse-run/$gone3"
[[ -e /run/terse-run/$idle_pid ]] || fail "sweep: the running launcher $idle_pid holds no lock file"
[[ $failures == 0 ]] && ok "sweep: stale namespaces removed with a line each; those in use kept"
tr_pid=$idle_pid bg=$idle_bg t0=$idle_t0
kill -TERM "$tr_pid"
finish idle
[[ $rc == 143 ]] || { fail "idle: exit $rc, want 143"; show idle; }
no_leftovers idle
[[ -e /run/terse-run/$idle_pid ]] && fail "idle: its lock file /run/terse-run/$idle_pid is left"

# --- SIGTERM to terse-run mid-run: forwarded, hosts removed
start term --hosts 2 -n 4 --timeout-ms 30000 "$TIME" 1048576 1000
wait_ranks term && kill -TERM "$tr_pid"
finish term
[[ $rc == 143 ]] && ok "term: terse-run exited 143" || { fail "term: exit $rc, want 143"; show term; }
no_leftovers term

if [[ $failures == 0 ]]; then
    echo "PASS: terse-run --hosts"
    exit 0
fi
echo "$failures check(s) failed"
exit 1
