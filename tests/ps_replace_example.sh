#!/usr/bin/env bash
# examples/ps_replicas under terse-run --replace 1, as a user would run it:
# once undisturbed, then with server rank 1 SIGKILLed mid-run (terse-run
# starts its replacement with TERSE_REJOIN=1). Every worker's checksum must
# equal the undisturbed run's, over tcp and shm; and over tcp the README's
# line, where rank 1 kills itself (--die-after-ms).
# Usage: ps_replace_example.sh PATH/TO/terse-run PATH/TO/ps_replicas
set -uo pipefail
TR=${1:?usage: ps_replace_example.sh TERSE-RUN PS_REPLICAS}
EX=${2:?usage: ps_replace_example.sh TERSE-RUN PS_REPLICAS}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
args=(--servers 2 --steps 400 --floats 50000 --nap-ms 4)
# The ranks' inactivity timeout and the runs' wall limit only bound a hang:
# a killed server is noticed through the store at once, whatever they are.
# On a loaded two-core machine (a busy process per core) an undisturbed run's
# server once saw no request for 20 s, so both are wide. Worst case, two
# providers of one reference run and three kill attempts (150 s each, plus
# 120 s waiting for readiness): 1,920 s, under ctest's 2,000 s, so the
# script's own diagnostics are printed rather than cut off.
TIMEOUT_MS=60000
LIMIT_S=150

# The pid of rank R of the ps_replicas job started by terse-run pid $2, or
# nothing (not yet started, or a replacement).
rank_pid() {
    local r=$1 p
    for p in $(pgrep -f "$EX" 2>/dev/null); do
        local env
        env=$({ tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null) || continue
        if echo "$env" | grep -qx "TERSE_RANK=$r" && ! echo "$env" | grep -q '^TERSE_REJOIN='; then
            echo "$p"
            return
        fi
    done
}

# One run with rank 1 killed once it serves: 0 ok, 1 failed, 2 lost to a
# known libfabric limitation (shm's lock of the dead process, rxm's teardown
# crash: tests/known_limits.h), in $known.
kill_run() {
    local prov=$1 ref=$2 victim="" rc got
    timeout -k 5 "$LIMIT_S" "$TR" -n 5 --provider "$prov" --timeout-ms "$TIMEOUT_MS" --replace 1 \
        "$EX" "${args[@]}" \
        >"$work/kill.out" 2>"$work/kill.err" &
    local job=$!
    # Kill only once every rank is past init and terse_ps_create: a rank lost
    # while another is still in init's store exchanges fails that init (as
    # it should: the job has not started).
    for _ in $(seq 2400); do # an event wait: 120 s only bounds a job that never got ready
        kill -0 "$job" 2>/dev/null || break # the job ended before it was ready
        [ "$(grep -c 'ps_replicas: rank [0-9] ready' "$work/kill.err" 2>/dev/null)" = 5 ] &&
            victim=$(rank_pid 1)
        [ -n "$victim" ] && break
        sleep 0.05
    done
    sleep 0.3 # into the run
    if [ -n "$victim" ]; then kill -9 "$victim"; fi
    wait "$job"
    rc=$?
    got=$(sed -n 's/.*checksum //p' "$work/kill.out" | sort -u)
    if [ -n "$victim" ] && [ "$rc" = 0 ] && [ "$(grep -c checksum "$work/kill.out")" = 3 ] &&
        [ "$got" = "$ref" ] && grep -q 'starting its replacement' "$work/kill.err" &&
        grep -q 'slot 1 goes back to it' "$work/kill.err"; then
        return 0
    fi
    known=""
    if grep -q 'spun inside' "$work/kill.err"; then
        known="a survivor spun on the dead server's shm region lock"
    elif grep -q 'killed by signal 11' "$work/kill.err"; then
        known="rxm crashed tearing down the dead server's connection"
    fi
    [ -n "$known" ] && return 2
    echo "FAIL $prov: killed pid '${victim}', status $rc, checksums '$got' (want '$ref')"
    tail -n 30 "$work/kill.err"
    return 1
}

for prov in tcp shm; do
    timeout -k 5 "$LIMIT_S" "$TR" -n 5 --provider "$prov" --timeout-ms "$TIMEOUT_MS" "$EX" "${args[@]}" \
        >"$work/ref.out" 2>"$work/ref.err"
    rc=$?
    want=$(grep -c 'checksum' "$work/ref.out")
    if [ "$rc" != 0 ] || [ "$want" != 3 ] || [ "$(sed 's/.*checksum //' "$work/ref.out" | sort -u | wc -l)" != 1 ]; then
        echo "FAIL $prov: the undisturbed run (status $rc): $(cat "$work/ref.out" "$work/ref.err")"
        failures=$((failures + 1))
        continue
    fi
    ref=$(sed 's/.*checksum //' "$work/ref.out" | sort -u)
    res=2
    for attempt in 1 2 3; do
        kill_run "$prov" "$ref"
        res=$?
        case $res in
        0) echo "ok $prov: rank 1 killed and replaced; the 3 workers' checksums equal the undisturbed run's"
           break ;;
        2) echo "WARNING: KNOWN LIMITATION ($prov, attempt $attempt): $known; running again" ;;
        *) failures=$((failures + 1))
           break ;;
        esac
    done
    if [ "$res" = 2 ]; then
        echo "FAIL $prov: no attempt completed (each lost to a known limitation)"
        failures=$((failures + 1))
    fi
    # The README's line: rank 1 kills itself (--die-after-ms), nobody else does.
    [ "$prov" = tcp ] || continue
    timeout -k 5 "$LIMIT_S" "$TR" -n 5 --provider tcp --timeout-ms "$TIMEOUT_MS" --replace 1 \
        "$EX" "${args[@]}" --die-after-ms 300 >"$work/die.out" 2>"$work/die.err"
    rc=$?
    got=$(sed -n 's/.*checksum //p' "$work/die.out" | sort -u)
    if [ "$rc" = 0 ] && [ "$(grep -c checksum "$work/die.out")" = 3 ] && [ "$got" = "$ref" ] &&
        grep -q 'starting its replacement' "$work/die.err"; then
        echo "ok tcp: --die-after-ms 300: rank 1 died and was replaced; the checksums equal the undisturbed run's"
    else
        echo "FAIL tcp: --die-after-ms 300: status $rc, checksums '$got' (want '$ref')"
        tail -n 30 "$work/die.err"
        failures=$((failures + 1))
    fi
done
[ "$failures" = 0 ] && echo "ps_replace_example: ok" && exit 0
exit 1
