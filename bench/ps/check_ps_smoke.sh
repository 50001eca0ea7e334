#!/usr/bin/env bash
# ctest bench_ps_smoke: a tiny `terse-bench ps` over tcp and shm must run
# its parameter-server job and its allreduce job through terse-run and
# print, for dense and for int8, a row with a finite positive ratio
# (push+pull time / allreduce time), and with --colocate a colocated row;
# usage errors exit 2 and --help 0.
#   check_ps_smoke.sh path/to/terse-bench
set -u
bench=${1:?usage: check_ps_smoke.sh TERSE_BENCH}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail=0

check() { # provider
    local provider=$1
    local args=(ps --servers 1 --workers 2 --sizes 64K --repeats 2 --provider "$provider")
    if ! "$bench" "${args[@]}" >"$out" 2>/dev/null; then
        echo "FAIL: terse-bench ${args[*]} exited non-zero"
        cat "$out"
        fail=1
        return
    fi
    # Table rows (not '#'): size servers workers codec pp(ms) algbw ar(ms)
    # ar.algbw ratio balance pp.sent ar.sent.
    local codec got
    for codec in dense int8; do
        got=$(awk -v codec="$codec" '
            /^#/ || NF < 12 { next }
            $1 == "64K" && $2 == 1 && $3 == 2 && $4 == codec &&
                $5 > 0 && $7 > 0 && $9 > 0 && $9 < 1e9 && $9 == $9 + 0 && $10 >= 1 { n++ }
            END { print n + 0 }' "$out")
        if [[ $got != 1 ]]; then
            echo "FAIL: $provider: expected one $codec row with a finite positive ratio, got $got"
            cat "$out"
            fail=1
        else
            echo "ok: $provider: $codec row with a finite positive ratio"
        fi
    done
}

check tcp
check shm

# --colocate adds a job of 2 ranks, each a worker and a server: a "2*" row.
if "$bench" ps --servers 1 --workers 2 --sizes 64K --repeats 2 --codec dense --colocate \
        --provider tcp >"$out" 2>/dev/null &&
    [[ $(awk '!/^#/ && $1 == "64K" && $2 == "2*" && $3 == 2 && $5 > 0 && $9 > 0 { n++ }
              END { print n + 0 }' "$out") == 1 ]]; then
    echo "ok: tcp: a colocated row"
else
    echo "FAIL: terse-bench ps --colocate: expected one 2* row"
    cat "$out"
    fail=1
fi

# Usage errors are exit 2 and never start a rank; --help is exit 0.
"$bench" ps --bogus >/dev/null 2>&1
rc=$?
if [[ $rc != 2 ]]; then
    echo "FAIL: terse-bench ps --bogus gave exit status $rc, not 2"
    fail=1
fi
"$bench" ps --help >/dev/null 2>&1
rc=$?
if [[ $rc != 0 ]]; then
    echo "FAIL: terse-bench ps --help gave exit status $rc, not 0"
    fail=1
fi
exit $fail
