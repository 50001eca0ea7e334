#!/usr/bin/env bash
# ps-stragglers.sh [REPEATS] [PLOT.png]
#
# One worker of four computes 3x slower (--straggler 3:3): how long does
# each way of training take to reach what synchronous allreduce reaches?
# Trains the Fashion-MNIST MLP (4 workers, batch 256, lr 0.1, 2 epochs,
# seed 1, over tcp) with
#   allreduce            synchronous SGD, terse_allreduce every step
#   ps:sync              a parameter server (2 server ranks), every push
#   ps:sync:quorum=3     backup workers: each step closes on the first 3
#   ps:ssp:2             stale synchronous parallel, bound 2
#   ps:async             every push applied on arrival
# with momentum 0.9, and ps:ssp:2 and ps:async also with momentum 0.5
# (asynchrony adds momentum of its own: Mitliagkas et al. 2016). The
# target is allreduce's final test accuracy minus 0.5 point, in the same
# repeat. Prints, per configuration, the medians over REPEATS of the time
# to the target, its ratio to allreduce's time to the same target, and the
# final accuracy; draws accuracy against wall time (first repeat)
# into PLOT.png (ps-stragglers.png) when gnuplot is there.
#
#   REPEATS  runs per configuration (3)
#
# Needs a build in ./build (./terse.sh build). Each run prints its CSV into
# the raw file named at the end.
set -u
cd "$(dirname "$0")/.."
reps=${1:-3}
plot=${2:-ps-stragglers.png}
case "$reps" in -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
[[ $reps =~ ^[1-9][0-9]*$ ]] || { echo "ps-stragglers.sh: REPEATS must be a positive integer" >&2; exit 2; }
bench=build/bench/terse-bench
[[ -x $bench ]] || { echo "ps-stragglers.sh: build first (./terse.sh build)" >&2; exit 1; }
common=(train --model mlp --workers 4 --epochs 2 --batch 256 --lr 0.1 --seed 1
        --eval-every 10 --provider tcp --straggler 3:3 --csv -q)
configs=("allreduce|--mode allreduce --momentum 0.9"
         "ps:sync|--mode ps:sync --servers 2 --momentum 0.9"
         "ps:sync:quorum=3|--mode ps:sync:quorum=3 --servers 2 --momentum 0.9"
         "ps:ssp:2|--mode ps:ssp:2 --servers 2 --momentum 0.9"
         "ps:ssp:2 m=0.5|--mode ps:ssp:2 --servers 2 --momentum 0.5"
         "ps:async|--mode ps:async --servers 2 --momentum 0.9"
         "ps:async m=0.5|--mode ps:async --servers 2 --momentum 0.5")
raw=$(mktemp /tmp/ps-stragglers-XXXXXX.csv)
cpu="$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) cores"
echo "# $cpu; $reps repeats; command: bench/ps-stragglers.sh $reps"
for rep in $(seq 1 "$reps"); do
    for c in "${configs[@]}"; do
        label=${c%%|*}
        # shellcheck disable=SC2206
        args=(${c#*|})
        echo "ps-stragglers.sh: repeat $rep/$reps: $label" >&2
        if ! out=$("$bench" "${common[@]}" "${args[@]}" 2>&1); then
            echo "ps-stragglers.sh: $label failed:" >&2
            echo "$out" >&2
            exit 1
        fi
        # rep,label,step,acc,wall
        awk -F, -v r="$rep" -v l="$label" 'NR > 1 && $1 ~ /^[0-9]+$/ { print r "," l "," $6 "," $9 "," $18 "," $8 }' \
            <<<"$out" >>"$raw"
    done
done

# Per repeat: the target, then each configuration's time to it and final accuracy.
awk -F, '
    $2 == "allreduce" && $6 == 1 { target[$1] = $4 - 0.5 }
    { rows[NR] = $0 }
    END {
        for (i = 1; i <= NR; i++) {
            split(rows[i], f, ",")
            r = f[1]; l = f[2]
            if (!((r, l) in reach) && f[4] >= target[r]) reach[r, l] = f[5]
            if (f[6] == 1) { final[r, l] = f[4]; total[r, l] = f[5] }
        }
        for (k in final) {
            split(k, p, SUBSEP)
            t = ((p[1], p[2]) in reach) ? reach[p[1], p[2]] : "-"
            ratio = (t == "-") ? "-" : t / reach[p[1], "allreduce"]
            print p[2] "\t" t "\t" ratio "\t" final[k] "\t" total[k] "\t" target[p[1]] + 0.5
        }
    }' "$raw" >"$raw.sum"

median() { sort -g | awk '$1 != "-" { v[++n] = $1 } END { if (n == 0) print "-"; else print (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2) }'; }
printf '%-18s %14s %10s %10s %10s %8s\n' config "time-to-target" "vs-allred" "final-acc" "total-s" reached
for c in "${configs[@]}"; do
    label=${c%%|*}
    t=$(awk -F'\t' -v l="$label" '$1 == l { print $2 }' "$raw.sum" | median)
    q=$(awk -F'\t' -v l="$label" '$1 == l { print $3 }' "$raw.sum" | median)
    a=$(awk -F'\t' -v l="$label" '$1 == l { print $4 }' "$raw.sum" | median)
    s=$(awk -F'\t' -v l="$label" '$1 == l { print $5 }' "$raw.sum" | median)
    n=$(awk -F'\t' -v l="$label" '$1 == l && $2 != "-" { n++ } END { print n + 0 }' "$raw.sum")
    printf '%-18s %14s %10s %10s %10s %5s/%s\n' "$label" "$t" "$q" "$a" "$s" "$n" "$reps"
done
tgt=$(awk -F'\t' '$1 == "allreduce" { print $6 }' "$raw.sum" | median)
echo "# target: allreduce's final accuracy ($tgt% median) minus 0.5 point, per repeat; times are"
echo "# worker 0's training wall time in seconds (evaluation excluded), medians over $reps repeats"

if command -v gnuplot >/dev/null; then
    plotdata=$(mktemp)
    for c in "${configs[@]}"; do
        label=${c%%|*}
        echo "\"$label\""
        awk -F, -v l="$label" '$1 == 1 && $2 == l { print $5, $4 }' "$raw"
        printf '\n\n'
    done >"$plotdata"
    gnuplot <<EOF
set terminal pngcairo size 900,560 noenhanced
set output "$plot"
set title "Fashion-MNIST MLP, 4 workers, worker 3 computes 3x slower (tcp, $cpu)"
set xlabel "training wall time of worker 0 (s)"
set ylabel "test accuracy (%)"
set yrange [60:90]
set key bottom right
set grid
plot for [i=0:6] "$plotdata" index i using 1:2 with linespoints title columnheader(1)
EOF
    rm -f "$plotdata"
    echo "# plot: $plot"
fi
echo "# raw records: $raw"
