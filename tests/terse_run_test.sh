#!/usr/bin/env bash
# terse-run, driven as a user would: the environment each rank gets, output
# prefixing, exit status propagation, stopping the job when a rank fails,
# signal forwarding, exec failure and usage errors. Every run is bounded by
# `timeout`, so a launcher that hangs fails the test instead of hanging it.
# Usage: terse_run_test.sh PATH/TO/terse-run
set -uo pipefail
# shellcheck disable=SC2016 # the ranks' shells expand $TERSE_*, not this one
TR=${1:?usage: terse_run_test.sh PATH/TO/terse-run}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
# The ranks' TERSE_PROVIDER / TERSE_TIMEOUT_MS must come from terse-run alone.
unset TERSE_PROVIDER TERSE_TIMEOUT_MS
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "ok: $*"; }
ms() { echo $(($(date +%s%N) / 1000000)); }

# run NAME TERSE-RUN-ARGS...: run terse-run under a 10 s timeout; stdout and
# stderr land in $work/NAME.out and .err, the exit status in $rc, the time
# taken in $elapsed (ms).
run() {
    local name=$1
    shift
    local t0
    t0=$(ms)
    timeout -k 2 10 "$TR" "$@" >"$work/$name.out" 2>"$work/$name.err"
    rc=$?
    elapsed=$(($(ms) - t0))
    if [ "$rc" = 124 ] || { [ "$rc" = 137 ] && [ "$elapsed" -ge 10000 ]; }; then
        fail "$name: terse-run did not finish within 10 s"
    fi
}

# background NAME TERSE-RUN-ARGS...: start terse-run itself in the background
# (so signals reach it, not a wrapper), pid in $bg.
background() {
    local name=$1
    shift
    "$TR" "$@" >"$work/$name.out" 2>"$work/$name.err" &
    bg=$!
}
# finish: wait for $bg at most 10 s (then SIGKILL it); status in $rc.
finish() {
    local i=0
    while kill -0 "$bg" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    if kill -0 "$bg" 2>/dev/null; then
        fail "terse-run pid $bg still running after 10 s"
        kill -9 "$bg"
    fi
    wait "$bg"
    rc=$?
}
# wait_lines FILE N: wait up to 5 s until FILE has N lines.
wait_lines() {
    local i=0
    # (the file may not exist yet: the shell creates it after forking)
    while [ "$(cat "$1" 2>/dev/null | wc -l)" -lt "$2" ] && [ $i -lt 50 ]; do
        sleep 0.1
        i=$((i + 1))
    done
}

# ---------------------------------------------------------------- environment
print_env='echo "rank=$TERSE_RANK size=$TERSE_SIZE local=$TERSE_LOCAL_RANK/$TERSE_LOCAL_SIZE addr=$TERSE_ADDR token=$TERSE_TOKEN provider=${TERSE_PROVIDER-unset} timeout=${TERSE_TIMEOUT_MS-unset}"'
mark=$failures
run env -n 4 sh -c "$print_env"
lines=$(cat "$work/env.out")
if [ "$rc" != 0 ]; then fail "env: exit status $rc, want 0"; fi
if [ "$(echo "$lines" | wc -l)" != 4 ]; then fail "env: want 4 lines, got: $lines"; fi
# Each line is "[r] rank=r ..." with the prefix matching the rank.
if [ "$(echo "$lines" | grep -Ec '^\[([0-3])\] rank=\1 size=4 local=\1/4 ')" != 4 ]; then
    fail "env: prefix, rank, size or local rank wrong: $lines"
fi
if [ "$(echo "$lines" | sed -E 's/.* rank=([0-9]+) .*/\1/' | sort | tr -d '\n')" != 0123 ]; then
    fail "env: ranks are not exactly 0..3: $lines"
fi
if [ "$(echo "$lines" | sed -E 's/.* (addr=[^ ]*) (token=[^ ]*) .*/\1 \2/' | sort -u | wc -l)" != 1 ]; then
    fail "env: ranks disagree on TERSE_ADDR or TERSE_TOKEN: $lines"
fi
if ! echo "$lines" | head -n1 | grep -Eq ' addr=127\.0\.0\.1:[0-9]+ token=[0-9a-f]{64} provider=unset timeout=unset$'; then
    fail "env: addr, 64-hex-digit token or unset provider/timeout wrong: $lines"
fi
token=$(echo "$lines" | head -n1 | sed -E 's/.*token=([0-9a-f]*).*/\1/')
if grep -q "$token" "$work/env.err"; then fail "env: the token appears on stderr"; fi
run env2 -n 1 sh -c "$print_env"
if grep -q "$token" "$work/env2.out"; then fail "env: two jobs got the same token"; fi
[ "$failures" = "$mark" ] && ok "env: rank, size, local rank/size, shared addr and fresh 64-hex token"

# What torch.distributed's env:// reads (docs/pytorch.md launches DDP with it):
# the same rank and size, and a rendezvous on the store's host at another port.
mark=$failures
run torchenv -n 3 sh -c 'echo "r=$RANK w=$WORLD_SIZE l=$LOCAL_RANK/$LOCAL_WORLD_SIZE t=$TERSE_RANK m=$MASTER_ADDR:$MASTER_PORT a=$TERSE_ADDR"'
lines=$(cat "$work/torchenv.out")
if [ "$rc" != 0 ]; then fail "torch env: exit status $rc, want 0"; fi
if [ "$(echo "$lines" | grep -Ec '^\[([0-2])\] r=\1 w=3 l=\1/3 t=\1 m=127\.0\.0\.1:[0-9]+ a=127\.0\.0\.1:[0-9]+$')" != 3 ]; then
    fail "torch env: RANK, WORLD_SIZE, LOCAL_RANK/LOCAL_WORLD_SIZE or MASTER_ADDR:PORT wrong: $lines"
fi
if [ "$(echo "$lines" | sed -E 's/.* (m=[^ ]*) .*/\1/' | sort -u | wc -l)" != 1 ]; then
    fail "torch env: ranks disagree on MASTER_ADDR:MASTER_PORT: $lines"
fi
if echo "$lines" | head -n1 | grep -Eq 'm=([^ ]*) a=\1$'; then
    fail "torch env: MASTER_PORT is the store's own port: $lines"
fi
[ "$failures" = "$mark" ] && ok "torch env: RANK, WORLD_SIZE, LOCAL_*, MASTER_ADDR and a MASTER_PORT of its own"

run opts -n 2 --provider shm --timeout-ms 3000 --addr 127.0.0.1:29999 sh -c "$print_env"
if [ "$rc" != 0 ] || [ "$(grep -c 'addr=127.0.0.1:29999 token=[0-9a-f]* provider=shm timeout=3000$' "$work/opts.out")" != 2 ]; then
    fail "--provider/--timeout-ms/--addr not passed to both ranks: $(cat "$work/opts.out")"
else ok "--provider, --timeout-ms and --addr reach every rank"; fi

run badprov -n 2 --provider bogus sh -c "echo launched"
if [ "$rc" != 2 ] || grep -q launched "$work/badprov.out" || ! grep -q "bogus" "$work/badprov.err"; then
    fail "--provider bogus: exit $rc (want 2), out: $(cat "$work/badprov.out"), err: $(cat "$work/badprov.err")"
else ok "--provider bogus exits 2 naming it, launching nothing"; fi

# Options end at PROGRAM: its own -n is its business.
run argv -n 1 sh -c 'echo "args:$*"' sh -n 5 --help
if [ "$rc" != 0 ] || [ "$(cat "$work/argv.out")" != "[0] args:-n 5 --help" ]; then
    fail "argv: PROGRAM's arguments were not passed untouched: $(cat "$work/argv.out")"
else ok "PROGRAM's arguments pass through untouched"; fi

# ---------------------------------------------------------------- output
run out -n 2 sh -c 'echo "out $TERSE_RANK"; echo "err $TERSE_RANK" >&2; printf "tail $TERSE_RANK"'
if [ "$rc" != 0 ] ||
    [ "$(sort "$work/out.out" | tr '\n' '|')" != "[0] out 0|[0] tail 0|[1] out 1|[1] tail 1|" ] ||
    [ "$(sort "$work/out.err" | tr '\n' '|')" != "[0] err 0|[1] err 1|" ]; then
    fail "prefixing: stdout=$(cat "$work/out.out") stderr=$(cat "$work/out.err")"
else ok "each line prefixed, stdout and stderr kept apart, partial last line flushed"; fi

# A line far longer than the launcher's buffer arrives whole, prefixed once.
run long -n 1 sh -c 'head -c 20000 /dev/zero | tr "\0" x; echo; echo next'
if [ "$rc" != 0 ] || [ "$(awk '{print length($0)}' "$work/long.out" | tr '\n' ' ')" != "20004 8 " ] ||
    [ "$(grep -c '^\[0\] x' "$work/long.out")" != 1 ]; then
    fail "long line: lengths $(awk '{print length($0)}' "$work/long.out" | tr '\n' ' ')"
else ok "a 20000-byte line goes through whole"; fi

run raw -n 2 --no-prefix sh -c 'printf "a%s" "$TERSE_RANK"'
if [ "$rc" != 0 ] || { [ "$(cat "$work/raw.out")" != a0a1 ] && [ "$(cat "$work/raw.out")" != a1a0 ]; }; then
    fail "--no-prefix: got '$(cat "$work/raw.out")'"
else ok "--no-prefix passes output through untouched"; fi

# ---------------------------------------------------------------- failures
# Rank 1 exits 3 while the others sleep 30 s in a child of theirs: the ranks
# and their children are stopped at once.
mark=$failures
cat >"$work/exit3.sh" <<'EOF'
cd "$1"
if [ "$TERSE_RANK" = 1 ]; then
    # Fail once ranks 0 and 2 are sleeping (at most 3 s from now).
    i=0
    while { [ ! -s pids.0 ] || [ ! -s pids.2 ]; } && [ $i -lt 60 ]; do sleep 0.05; i=$((i + 1)); done
    exit 3
fi
sleep 30 &
echo "$$ $!" >pids.tmp.$TERSE_RANK && mv pids.tmp.$TERSE_RANK pids.$TERSE_RANK
wait
EOF
run exit3 -n 3 sh "$work/exit3.sh" "$work"
if [ "$(cat "$work"/pids.* | wc -w)" != 4 ]; then fail "exit 3: ranks 0 and 2 did not start"; fi
if [ "$rc" != 3 ]; then fail "exit 3: terse-run exited $rc, want 3"; fi
if [ "$elapsed" -ge 1800 ]; then fail "exit 3: the sleeping ranks took ${elapsed} ms to stop"; fi
if ! grep -q 'terse-run: rank 1 exited with status 3; stopping the others' "$work/exit3.err"; then
    fail "exit 3: no message naming rank 1: $(cat "$work/exit3.err")"
fi
# Leftovers would be the ranks' shells or their sleeps. An orphan that has
# died but that init has not reaped yet is a zombie, which kill -0 still
# sees: it counts as stopped (this machine's init reaps lazily).
running() { # PID: 0 if it exists and is not a zombie
    kill -0 "$1" 2>/dev/null || return 1
    local state
    state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$state" ] && [ "$state" != Z ]
}
for i in $(seq 50); do
    alive=$(for p in $(cat "$work"/pids.* 2>/dev/null); do running "$p" && echo "$p"; done)
    [ -z "$alive" ] && break
    sleep 0.1
done
if [ -n "$alive" ]; then fail "exit 3: processes $alive still running"; for p in $alive; do kill -9 "$p"; done; fi
[ "$failures" = "$mark" ] && ok "a rank exiting 3 -> status 3, others and their children stopped in ${elapsed} ms"

run sigkill -n 2 sh -c 'if [ "$TERSE_RANK" = 0 ]; then kill -9 $$; fi; sleep 30'
if [ "$rc" != 137 ] || [ "$elapsed" -ge 1800 ] ||
    ! grep -q 'rank 0 exited with status 137' "$work/sigkill.err"; then
    fail "SIGKILL: status $rc after ${elapsed} ms, stderr: $(cat "$work/sigkill.err")"
else ok "a rank killed by SIGKILL -> status 137"; fi

# Ranks that ignore SIGTERM get SIGKILL after the ~2 s grace period.
# (rank 1 fails only once rank 0 ignores SIGTERM, at most 3 s from now)
run stubborn -n 2 sh -c 'trap "" TERM; cd "$0"
    if [ "$TERSE_RANK" = 0 ]; then touch stubborn.ready; exec sleep 30; fi
    i=0; while [ ! -e stubborn.ready ] && [ $i -lt 60 ]; do sleep 0.05; i=$((i + 1)); done
    exit 5' "$work"
if [ "$rc" != 5 ] || [ "$elapsed" -lt 1500 ] || [ "$elapsed" -ge 5000 ]; then
    fail "grace: status $rc after ${elapsed} ms, want 5 after about 2000 ms"
else ok "ranks ignoring SIGTERM are killed after the grace period (${elapsed} ms)"; fi

run noexec -n 2 "$work/no-such-program" arg
if [ "$rc" != 127 ] || ! grep -q "cannot run '$work/no-such-program'.*No such file" "$work/noexec.err"; then
    fail "exec failure: status $rc, stderr: $(cat "$work/noexec.err")"
else ok "a program that cannot be run -> 127 with a clear message"; fi

# ---------------------------------------------------------------- signals
# SIGTERM to terse-run reaches every rank, which here exits 0 on it.
background fwd -n 2 sh -c 'trap "echo got TERM; exit 0" TERM; echo ready; sleep 30 & wait'
wait_lines "$work/fwd.out" 2
kill -TERM "$bg"
finish
if [ "$rc" != 0 ] || [ "$(sort "$work/fwd.out" | tr '\n' '|')" != "[0] got TERM|[0] ready|[1] got TERM|[1] ready|" ]; then
    fail "SIGTERM forwarding: status $rc, output: $(cat "$work/fwd.out")"
else ok "SIGTERM is forwarded to every rank"; fi

# SIGHUP likewise; ranks that die of it give 128 + 1.
background hup -n 2 sh -c 'echo ready; exec sleep 30'
wait_lines "$work/hup.out" 2
kill -HUP "$bg"
finish
if [ "$rc" != 129 ]; then fail "SIGHUP forwarding: status $rc, want 129"; else ok "SIGHUP is forwarded (status 129)"; fi

# Started with SIGHUP ignored (nohup), terse-run and its ranks keep ignoring it.
# (a plain sh, not a bash subshell, which could run this script's EXIT trap)
sh -c 'trap "" HUP; exec "$0" -n 2 sh -c "echo ready; sleep 1; echo alive"' "$TR" \
    >"$work/nohup.out" 2>&1 &
bg=$!
wait_lines "$work/nohup.out" 2
kill -HUP "$bg"
finish
if [ "$rc" != 0 ] || [ "$(grep -c alive "$work/nohup.out")" != 2 ]; then
    fail "nohup: status $rc, output: $(cat "$work/nohup.out")"
else ok "an ignored SIGHUP stays ignored"; fi

# --replace: rank 1 is killed the first time; its replacement gets
# TERSE_REJOIN=1 and the same rank, size, address and token, and the job
# ends 0. A rank not listed still stops the job.
mark=$failures
cat >"$work/replace.sh" <<'EOF'
echo "rank=$TERSE_RANK rejoin=${TERSE_REJOIN:-unset} addr=$TERSE_ADDR token=$TERSE_TOKEN"
if [ "$TERSE_RANK" = 1 ] && [ -z "${TERSE_REJOIN:-}" ]; then kill -9 $$; fi
sleep 0.3
EOF
run replace -n 3 --replace 1 sh "$work/replace.sh"
if [ "$rc" != 0 ]; then fail "--replace: status $rc: $(cat "$work/replace.err")"; fi
if [ "$(grep -c '^\[1\] rank=1 rejoin=1 ' "$work/replace.out")" != 1 ] ||
    [ "$(grep -c '^\[1\] rank=1 rejoin=unset ' "$work/replace.out")" != 1 ] ||
    [ "$(grep -c 'rejoin=1' "$work/replace.out")" != 1 ]; then
    fail "--replace: rank 1 not started again with TERSE_REJOIN=1 alone: $(cat "$work/replace.out")"
fi
if [ "$(sed -E 's/.* addr=([^ ]*) token=([0-9a-f]*)$/\1 \2/' "$work/replace.out" | sort -u | wc -l)" != 1 ]; then
    fail "--replace: the replacement got another address or token"
fi
if ! grep -q 'terse-run: rank 1 exited with status 137; starting its replacement (TERSE_REJOIN=1, 1 of 3)' "$work/replace.err"; then
    fail "--replace: no message: $(cat "$work/replace.err")"
fi
run replace2 -n 3 --replace 2 sh "$work/replace.sh"
if [ "$rc" != 137 ]; then fail "--replace 2: rank 1's death should stop the job (status $rc)"; fi
[ "$failures" = "$mark" ] && ok "--replace starts a dead rank again with TERSE_REJOIN=1, others still stop the job"

# ---------------------------------------------------------------- usage
usage_case() {
    local want=$1
    shift
    run usage "$@"
    if [ "$rc" != 2 ] || ! grep -q '^terse-run: ' "$work/usage.err" ||
        ! grep -q -- "--help" "$work/usage.err" || [ -s "$work/usage.out" ]; then
        fail "usage [$*]: status $rc, stderr: $(cat "$work/usage.err")"
    elif ! grep -q -- "$want" "$work/usage.err"; then
        fail "usage [$*]: message does not mention '$want': $(cat "$work/usage.err")"
    fi
}
mark=$failures
usage_case "missing -n"
usage_case "missing -n" true
usage_case "'0'" -n 0 true
usage_case "'1025'" -n 1025 true
usage_case "'x'" -n x true
usage_case "needs a value" -n
usage_case "unknown option '--bogus'" -n 2 --bogus true
usage_case "unknown option '-q'" -n 2 -q true
usage_case "missing the PROGRAM" -n 2
usage_case "--timeout-ms" -n 2 --timeout-ms 0 true
usage_case "--addr" -n 2 --addr nocolon true
usage_case "rank 0 holds the store" -n 2 --replace 0 true
usage_case "--replace wants ranks from 1 to 1" -n 2 --replace 2 true
[ "$failures" = "$mark" ] && ok "usage errors -> status 2 with a one-line message and a --help hint"

run help --help
if [ "$rc" != 0 ] || ! grep -q '^usage: terse-run -n N' "$work/help.out"; then
    fail "--help: status $rc"
else ok "--help exits 0"; fi
run version --version
if [ "$rc" != 0 ] || ! grep -Eq '^terse-run [0-9]+\.[0-9]+\.[0-9]+$' "$work/version.out"; then
    fail "--version: status $rc, output $(cat "$work/version.out")"
else ok "--version exits 0"; fi

if [ "$failures" != 0 ]; then
    echo "terse_run_test: $failures failure(s)"
    exit 1
fi
echo "terse_run_test: ok"
