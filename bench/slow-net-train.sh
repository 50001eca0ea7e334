#!/usr/bin/env bash
# slow-net-train.sh [RATE] [REPEATS]
#
# Time to accuracy on a slow link, terse against PyTorch DDP, measured back
# to back in the same session: each run trains the Fashion-MNIST MLP (2
# workers, batch 64, lr 0.1, momentum 0.9, 2 epochs, seed 1) inside a fresh
# network namespace whose loopback is shaped to RATE (bench/slow-net.sh),
# evaluating every 20 steps. Prints one line per run and, per
# configuration, the median over REPEATS of the training time (evaluation
# excluded) and of the time to the first evaluation at or above 84%.
#
#   RATE     tc rate of the shaped loopback (1gbit)
#   REPEATS  runs per configuration (3)
#
# Needs root (namespaces), a build in ./build, and for the PyTorch rows
# Debian's python3-torch and python3-numpy (run by /usr/bin/python3); without
# them the PyTorch rows are skipped with a note.
set -u
cd "$(dirname "$0")/.."
rate=${1:-1gbit}
reps=${2:-3}
case "$rate" in -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
[[ $reps =~ ^[1-9][0-9]*$ ]] || { echo "slow-net-train.sh: REPEATS must be a positive integer" >&2; exit 2; }
bench=build/bench/terse-bench
[[ -x $bench ]] || { echo "slow-net-train.sh: build first (./terse.sh build)" >&2; exit 1; }
target=84
common=(--eval-every 20 --target-acc "$target")
have_torch=1
/usr/bin/python3 -c 'import torch, numpy' 2>/dev/null || {
    have_torch=0
    echo "# PyTorch rows skipped: /usr/bin/python3 cannot import torch and numpy" \
         "(apt-get install python3-torch python3-numpy)"
}

# median of the numbers on stdin ("-" when there are none)
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

# run LABEL COMMAND...: prints "LABEL total reach acc" per repeat into $out
out=$(mktemp)
trap 'rm -f "$out"' EXIT
run_terse() {
    local label=$1
    shift
    for _ in $(seq 1 "$reps"); do
        local text total reach acc
        text=$(bench/slow-net.sh "$rate" "$bench" train --provider tcp -q "${common[@]}" "$@" 2>&1)
        total=$(awk '$1 ~ /^[0-9]+$/ && NF == 13 { t = $13 } END { print t }' <<<"$text")
        acc=$(awk '$1 ~ /^[0-9]+$/ && NF == 13 { a = $4 } END { print a }' <<<"$text")
        reach=$(sed -n 's/^# reached .* after \([0-9.]*\) s.*/\1/p' <<<"$text")
        printf '%s\t%s\t%s\t%s\n' "$label" "${total:--}" "${reach:--}" "${acc:--}" | tee -a "$out"
    done
}
run_torch() {
    local label=$1
    shift
    [[ $have_torch == 1 ]] || return 0
    for _ in $(seq 1 "$reps"); do
        local text total reach acc
        text=$(bench/slow-net.sh "$rate" /usr/bin/python3 bench/torch_ddp_baseline.py "${common[@]}" "$@" 2>&1)
        total=$(sed -n 's/^# final: .* after \([0-9.]*\) s of training.*/\1/p' <<<"$text")
        acc=$(sed -n 's/^# final: \([0-9.]*\)% .*/\1/p' <<<"$text")
        reach=$(sed -n 's/^# reached .* after \([0-9.]*\) s.*/\1/p' <<<"$text")
        printf '%s\t%s\t%s\t%s\n' "$label" "${total:--}" "${reach:--}" "${acc:--}" | tee -a "$out"
    done
}

echo "# run, training seconds, seconds to ${target}%, final accuracy (one line per repeat)"
run_torch "pytorch dense" --hook none
run_torch "pytorch fp16" --hook fp16
run_torch "pytorch powersgd r4" --hook powersgd --rank 4
run_terse "terse dense" --codec dense
run_terse "terse fp16" --codec fp16 --small-codec int8:ef=1
run_terse "terse powersgd r4 +EF" --codec powersgd:rank=4,ef=1 --small-codec int8:ef=1
run_terse "terse topk 1% DGC" --codec topk:ratio=0.01,ef=1 --small-codec int8:ef=1 \
    --momentum-at local --mask-momentum
run_terse "terse local8 psgd r4" --mode localsgd:8 --codec powersgd:rank=4,ef=1 \
    --small-codec int8:ef=1

echo
echo "# medians over $reps run(s) on a $rate link"
printf '%-24s %10s %12s %10s\n' "run" "train s" "to ${target}% s" "final acc"
cut -f1 "$out" | awk '!seen[$0]++' | while IFS= read -r label; do
    rows=$(awk -F'\t' -v l="$label" '$1 == l' "$out")
    printf '%-24s %10s %12s %10s\n' "$label" \
        "$(cut -f2 <<<"$rows" | grep -v '^-$' | median)" \
        "$(cut -f3 <<<"$rows" | grep -v '^-$' | median)" \
        "$(cut -f4 <<<"$rows" | grep -v '^-$' | median)"
done
