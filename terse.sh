#!/usr/bin/env bash
# terse.sh -- the quick start: install what is missing, build, and run.
#
#   ./terse.sh bench   the main job: train on Fashion-MNIST with every codec,
#                      with and without error feedback, and print accuracy
#                      against bytes (table, plus terse-sweep.png)
#   ./terse.sh bench SUBCOMMAND [ARGS]
#                      any terse-bench subcommand: codecs, allreduce, train, ps
#   ./terse.sh bench torch [--net RATE] [ARGS]
#                      terse's DDP comm hook against PyTorch's hooks
#                      (bench/torch/torch_ddp.py; --net 1gbit runs it in a shaped
#                      network namespace, as root)
#   ./terse.sh test    the functional suite: one gcc build, every test
#                      (about 6 minutes on 2 cores)
#   ./terse.sh test all
#                      the same, then the sanitizer builds: the suite again
#                      under clang ASan+UBSan, the engine's threads under
#                      clang ThreadSanitizer (what CI runs; about 15 minutes)
#   ./terse.sh build   just configure and build into ./build
#
# Missing Debian packages are installed with apt-get when run as root;
# otherwise the exact apt-get line is printed and the script stops.
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
          libopenblas-dev liblapacke-dev libcriterion-dev zlib1g-dev libfabric-dev
          libfabric-bin libssl-dev iproute2 openmpi-bin libopenmpi-dev dataset-fashion-mnist gnuplot-nox binutils
          python3-torch python3-numpy python3-pytest python3-mpi4py)

usage() {
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
}

need_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -eq 0 ]; then
        echo "terse.sh: installing ${missing[*]}" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "terse.sh: missing Debian packages. Run this, then run me again:" >&2
        echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
}

JOBS=$(nproc 2>/dev/null || echo 2)

# run_ctest DIR [ENV=VALUE...]: the suite in DIR, 2 at a time. On a failure,
# the end of each failed test's output is printed again last, so that the tail
# of a long log (what a CI page keeps) says why.
run_ctest() {
    local dir=$1; shift
    if (cd "$dir" && env "$@" ctest --output-on-failure -j 2); then return 0; fi
    local failed="$dir/Testing/Temporary/LastTestsFailed.log" t
    if [ -f "$failed" ]; then
        for t in $(cut -d: -f2 "$failed"); do
            echo "== the last 60 lines of $t's output ($dir)" >&2
            awk -v t="$t" '$0 ~ "^[0-9]+/[0-9]+ Test: " t "$" { on = 1; next }
                           on && /^<end of output>/ { exit }
                           on { print }' "$dir/Testing/Temporary/LastTest.log" | tail -n 60 >&2
        done
    fi
    return 1
}

build() { # build DIR [cmake args...]
    local dir=$1; shift
    cmake -S . -B "$dir" -G Ninja -DTERSE_WERROR=ON "$@" >/dev/null
    cmake --build "$dir" -j "$JOBS"
}

cmd=${1:-}
case "$cmd" in
    bench)
        shift
        need_packages
        build build
        if [ $# -eq 0 ]; then
            set -- train --sweep
        fi
        if [ "$1" = torch ]; then # bench/torch/torch_ddp.py [--net RATE] ARGS
            shift
            if [ "${1:-}" = --net ]; then
                rate=${2:?--net needs a rate, e.g. 1gbit}
                shift 2
                exec bench/core/slow-net.sh "$rate" /usr/bin/python3 bench/torch/torch_ddp.py \
                     --label "$rate shaped loopback" "$@"
            fi
            exec /usr/bin/python3 bench/torch/torch_ddp.py "$@"
        fi
        exec ./build/bench/terse-bench "$@"
        ;;
    test)
        shift
        tier=${1:-}
        case "$tier" in
            ""|all) ;;
            *) echo "terse.sh test: unknown tier '$tier' (expected nothing or 'all')" >&2; exit 2 ;;
        esac
        need_packages
        t0=$SECONDS
        echo "== gcc release build: the functional suite (unit, multi-process, install, smoke)" >&2
        build build
        run_ctest build
        echo "terse.sh test: the functional suite passed in $((SECONDS - t0)) s" >&2
        [ "$tier" = all ] || exit 0
        echo "== clang build with AddressSanitizer + UndefinedBehaviorSanitizer" >&2
        build build-asan -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
              -DTERSE_SANITIZE=address,undefined
        # LeakSanitizer is on by default; terse-bench-mpi turns it off for Open MPI only,
        # and tests/lsan.supp leaves out what libfabric's net leaks (it says why).
        supp="$PWD/tests/lsan.supp"
        run_ctest build-asan ASAN_OPTIONS=abort_on_error=1 \
            LSAN_OPTIONS="suppressions=$supp:print_suppressions=0" \
            UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
        echo "== clang build with ThreadSanitizer: the engine's threads (tests/tsan_engine.c)" >&2
        cmake -S . -B build-tsan -G Ninja -DTERSE_WERROR=ON -DCMAKE_C_COMPILER=clang \
              -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTERSE_SANITIZE=thread >/dev/null
        cmake --build build-tsan -j "$JOBS" --target tsan_engine
        for run in "thread tcp 2 abort" "thread shm 3 free" "thread tcp 3 free" \
                   "caller tcp 2 free" "caller shm 2 abort" "thread tcp 3 ps" \
                   "caller shm 3 ps" "thread shm 3 colo" "caller shm 2 colo" \
                   "thread tcp 3 colo" "caller tcp 2 colo"; do
            # shellcheck disable=SC2086
            set -- $run
            TERSE_PROGRESS=$1 TSAN_OPTIONS=halt_on_error=1:exitcode=66 \
                ./build-tsan/tests/tsan_engine "$2" "$3" "$4"
        done
        echo "terse.sh test all: all suites passed in $((SECONDS - t0)) s" >&2
        ;;
    build)
        need_packages
        build build
        ;;
    -h|--help|help)
        usage
        ;;
    *)
        usage >&2
        exit 2
        ;;
esac
