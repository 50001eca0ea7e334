#!/bin/sh
# Run a timed libFuzzer campaign against one fuzz target.
#
#     tests/fuzz/run.sh TARGET SECONDS [libFuzzer options...]
#     e.g. tests/fuzz/run.sh fuzz_decode 180 -jobs=2 -workers=2
#
# TARGET is fuzz_decode, fuzz_state or fuzz_roundtrip. Builds with clang,
# -DTERSE_FUZZ=ON and ASan+UBSan in $TERSE_FUZZ_BUILD (default
# <repo>/build-fuzz), seeds the corpus with make_corpus plus the committed
# inputs in tests/fuzz/corpus/TARGET, and runs for SECONDS. New corpus
# entries go to <build>/fuzz-work/TARGET/corpus, crash inputs to
# <build>/fuzz-work/TARGET/artifacts. Replay one with
#     <build>/tests/fuzz/TARGET_replay FILE
# and, once fixed, commit it to tests/fuzz/corpus/TARGET/ as a regression.
# Not part of the default test run.
set -eu

if [ $# -lt 2 ]; then
    echo "usage: $0 TARGET SECONDS [libFuzzer options...]" >&2
    exit 2
fi
target=$1
seconds=$2
shift 2
case $target in
fuzz_decode | fuzz_state | fuzz_roundtrip) ;;
*)
    echo "$0: unknown target '$target'" >&2
    exit 2
    ;;
esac

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${TERSE_FUZZ_BUILD:-$root/build-fuzz}
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTERSE_FUZZ=ON -DTERSE_SANITIZE=address,undefined -DTERSE_BUILD_BENCH=OFF >/dev/null
ninja -C "$build" "$target" "${target}_replay" make_corpus

work=$build/fuzz-work/$target
mkdir -p "$work/corpus" "$work/artifacts"
"$build/tests/fuzz/make_corpus" "$build/tests/fuzz/corpus" >/dev/null

# OpenBLAS threads would make runs nondeterministic and slower to fork.
OPENBLAS_NUM_THREADS=1 exec "$build/tests/fuzz/$target" \
    -max_total_time="$seconds" -print_final_stats=1 -max_len=8192 \
    -artifact_prefix="$work/artifacts/" "$@" \
    "$work/corpus" "$build/tests/fuzz/corpus/$target" "$root/tests/fuzz/corpus/$target"
