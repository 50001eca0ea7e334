#!/usr/bin/env bash
# The functional suite under a CPU hog: one busy process per core (at the
# suite's own priority) runs for as long as the suite does, and the suite
# is run RUNS times in a row; every run must pass. This is how "no test
# fails because the machine is slow" is checked (README, "Tests").
#
#   tests/under_load.sh [RUNS] [BUILD_DIR]     (default 5, build)
#
# Prints one line per run (passed/failed, wall seconds) and, for a failed
# run, the failing tests' names; the logs stay in BUILD_DIR/under-load-N.log.
# Exit status: the number of failed runs (0: all passed).
set -u
runs=${1:-5}
build=${2:-build}
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "under_load.sh: RUNS must be a positive integer" >&2; exit 2; }
[[ -f $build/CTestTestfile.cmake ]] || { echo "under_load.sh: no test build in $build (./terse.sh build)" >&2; exit 2; }
cores=$(nproc 2>/dev/null || echo 2)
hogs=()
stop_hogs() { [[ ${#hogs[@]} -gt 0 ]] && kill "${hogs[@]}" 2>/dev/null; wait 2>/dev/null; hogs=(); }
trap stop_hogs EXIT
for _ in $(seq 1 "$cores"); do
    # a pure busy loop, bounded (2 h at most) in case this script is killed -9
    timeout 7200 sh -c 'while :; do :; done' &
    hogs+=($!)
done
echo "under_load.sh: $cores busy processes running; the suite $runs times (ctest -j 2 in $build)"
failed=0
for run in $(seq 1 "$runs"); do
    log="$build/under-load-$run.log"
    t0=$SECONDS
    if (cd "$build" && ctest --output-on-failure -j 2) >"$log" 2>&1; then
        echo "run $run: passed in $((SECONDS - t0)) s"
    else
        failed=$((failed + 1))
        echo "run $run: FAILED in $((SECONDS - t0)) s: $(grep -E '^\s+[0-9]+ - ' "$log" | sed 's/^ *[0-9]* - //' | tr '\n' ' ')"
    fi
done
echo "under_load.sh: $((runs - failed)) passed, $failed failed"
exit "$failed"
