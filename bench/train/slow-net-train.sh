#!/usr/bin/env bash
# slow-net-train.sh [RATE] [REPEATS] [PLOT]
#
# Time to accuracy on a slow link, terse against PyTorch DDP, measured back
# to back in the same session: each run trains the Fashion-MNIST MLP (2
# workers, batch 64, constant lr 0.1 (--schedule none, PyTorch's setting),
# momentum 0.9, 2 epochs, seed 1) inside a fresh network namespace whose
# loopback is shaped to RATE (bench/core/slow-net.sh), evaluating every 20 steps.
# Prints one line per run and, per configuration, the median over REPEATS
# of the training time (evaluation excluded) and of the time to the first
# evaluation at or above 84%; then draws PLOT: test accuracy against
# training seconds, one line per configuration (its median-time repeat).
#
#   RATE     tc rate of the shaped loopback (1gbit)
#   REPEATS  runs per configuration (3)
#   PLOT     PNG to draw (slow-net-train.png; needs gnuplot, else skipped);
#            the curves it draws go beside it as PLOT's name with .tsv
#            (configuration, seconds, accuracy per line)
#
# Needs root (namespaces), a build in ./build, and for the PyTorch rows
# Debian's python3-torch and python3-numpy (run by /usr/bin/python3); without
# them the PyTorch rows are skipped with a note.
set -u
case "${1:-}" in -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
plot=${3:-slow-net-train.png}
[[ $plot == /* ]] || plot=$PWD/$plot
cd "$(dirname "$0")/.."
rate=${1:-1gbit}
reps=${2:-3}
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

# Each repeat's evaluations go to $curves/N.dat as "seconds accuracy"
# lines; $out gets "LABEL total reach acc N" per repeat.
out=$(mktemp)
curves=$(mktemp -d)
trap 'rm -rf "$out" "$curves"' EXIT
nrun=0
# record LABEL TEXT ACC_FIELD WALL_FIELD FINAL_FIELD: one repeat's CSV
record() {
    local label=$1 text=$2 fa=$3 fw=$4 ff=$5 total reach acc
    nrun=$((nrun + 1))
    awk -F, -v a="$fa" -v w="$fw" '$1 ~ /^[0-9]+$/ { print $w, $a }' <<<"$text" >"$curves/$nrun.dat"
    total=$(awk -F, -v w="$fw" -v f="$ff" '$1 ~ /^[0-9]+$/ && $f == 1 { t = $w } END { print t }' <<<"$text")
    acc=$(awk -F, -v a="$fa" -v f="$ff" '$1 ~ /^[0-9]+$/ && $f == 1 { v = $a } END { print v }' <<<"$text")
    reach=$(awk -v t="$target" '$2 >= t { print $1; exit }' "$curves/$nrun.dat")
    printf '%s\t%s\t%s\t%s\t%s\n' "$label" "${total:--}" "${reach:--}" "${acc:--}" "$nrun" >>"$out"
    printf '%s\t%s\t%s\t%s\n' "$label" "${total:--}" "${reach:--}" "${acc:--}"
}
# terse CSV: 8 final, 9 test_acc, 18 wall_s
run_terse() {
    local label=$1
    shift
    for _ in $(seq 1 "$reps"); do
        record "$label" "$(bench/core/slow-net.sh "$rate" "$bench" train --provider tcp -q --csv \
            --schedule none "${common[@]}" "$@" 2>&1)" 9 18 8
    done
}
# PyTorch CSV: 5 final, 6 test_acc, 12 wall_s
run_torch() {
    local label=$1
    shift
    [[ $have_torch == 1 ]] || return 0
    for _ in $(seq 1 "$reps"); do
        record "$label" "$(bench/core/slow-net.sh "$rate" /usr/bin/python3 bench/torch/torch_ddp_baseline.py \
            --csv "${common[@]}" "$@" 2>&1)" 6 12 5
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

# The plot: per configuration, the repeat with the median training time.
# The drawn curves also go into a TSV beside it, for those who would rather
# read numbers.
tsv=${plot%.png}.tsv
: >"$tsv"
gp=$(command -v gnuplot) || { echo "# no plot: gnuplot not found (apt-get install gnuplot-nox)"; exit 0; }
{
    echo "set terminal png size 1100,700"
    echo "set output '$plot'"
    echo "set title 'Fashion-MNIST MLP, 2 workers over tcp on a $rate link: test accuracy against training time'"
    echo "set xlabel 'training seconds, evaluation excluded (log scale)'"
    echo "set logscale x 10"
    echo "set xrange [0.05:*]"
    echo "set ylabel 'test accuracy (%)'"
    echo "set yrange [70:88]"
    echo "set grid"
    echo "set key bottom right"
    echo "set arrow from graph 0, first $target to graph 1, first $target nohead dt 3 lc rgb 'gray50'"
    sep="plot"
    cut -f1 "$out" | awk '!seen[$0]++' | while IFS= read -r label; do
        n=$(awk -F'\t' -v l="$label" '$1 == l && $2 != "-" { print $2, $5 }' "$out" | sort -g |
            awk '{ v[NR] = $2 } END { if (NR) print v[int((NR + 1) / 2)] }')
        [[ -n $n ]] || continue
        awk -v l="$label" '{ print l "\t" $1 "\t" $2 }' "$curves/$n.dat" >>"$tsv"
        style="lw 2"
        [[ $label == pytorch* ]] && style="lw 2 dt 2"
        printf "%s '%s' using 1:2 with linespoints pt 7 ps 0.5 %s title '%s'" "$sep" "$curves/$n.dat" "$style" "$label"
        sep=","
    done
    echo
} >"$curves/plot.gp"
if "$gp" "$curves/plot.gp"; then echo "# plot: $plot, its curves: $tsv"; else echo "# no plot: gnuplot failed"; fi
