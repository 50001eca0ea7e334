#!/usr/bin/env bash
# ps-stragglers.sh [REPEATS] [OUTDIR] [BATCH] [EPOCHS]
#
# What slow workers cost each way of training, in the setting where they
# matter: compute-bound steps. Trains the Fashion-MNIST MLP with 4 workers
# (2 server ranks besides them in the ps rows), batch BATCH (2048) per
# worker so that compute is most of a synchronous step (the script prints
# the share it measured: allreduce's compute seconds over its training
# wall time, in a run without slowness), lr 0.1, momentum 0.9, the cosine schedule (the parameter
# server runs it too), EPOCHS (8) epochs, over tcp, under two kinds of
# slowness:
#   persistent   worker 3 computes 3x slower (--straggler 3:3)
#   transient    every worker, every step, computes 4x slower with
#                probability 0.1 (--transient 0.1:4: a noisy neighbour)
# Rows: allreduce, ps:sync, ps:sync:quorum=3 (backup workers), ps:ssp:2
# (its default rule for stale pushes), ps:async with each rule (plain,
# step, dc, amom, dana; include/terse.h, Stale pushes) and Local SGD
# (localsgd:4). Repeat r uses seed r. The target is allreduce's final test
# accuracy minus 0.5 point in the same repeat; per kind, prints the
# medians over REPEATS of the time to the target, its ratio to
# allreduce's, the final accuracy and the total time, as a markdown table;
# draws accuracy against wall time (log x, repeat 1) into
# OUTDIR/ps-stragglers-KIND.png when gnuplot is there.
#
#   REPEATS  runs per configuration and kind (5)
#   OUTDIR   where the plots and the raw CSV go (docs)
#
# Needs a build in ./build (./terse.sh build). A long command (about
# 21 x REPEATS runs): not part of the test suite.
set -u
cd "$(dirname "$0")/../.."
reps=${1:-5}
outdir=${2:-docs}
batch=${3:-2048}
epochs=${4:-8}
case "$reps" in -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
[[ $reps =~ ^[1-9][0-9]*$ ]] || { echo "ps-stragglers.sh: REPEATS must be a positive integer" >&2; exit 2; }
bench=build/bench/terse-bench
[[ -x $bench ]] || { echo "ps-stragglers.sh: build first (./terse.sh build)" >&2; exit 1; }
mkdir -p "$outdir"
common=(train --model mlp --workers 4 --epochs "$epochs" --batch "$batch" --lr 0.1 --momentum 0.9
        --schedule cosine --eval-every 4 --provider tcp --csv -q)
configs=("allreduce|--mode allreduce"
         "ps:sync|--mode ps:sync --servers 2"
         "ps:sync:quorum=3|--mode ps:sync:quorum=3 --servers 2"
         "ps:ssp:2|--mode ps:ssp:2 --servers 2"
         "ps:async plain|--mode ps:async:update=plain --servers 2"
         "ps:async step|--mode ps:async:update=step --servers 2"
         "ps:async dc|--mode ps:async:update=dc --servers 2"
         "ps:async amom|--mode ps:async:update=amom --servers 2"
         "ps:async dana|--mode ps:async:update=dana --servers 2"
         "localsgd:4|--mode localsgd:4")
kinds=("persistent|--straggler 3:3" "transient|--transient 0.1:4")
cpu="$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) cores"
cmd="bench/ps/ps-stragglers.sh $reps $outdir $batch $epochs"
raw="$outdir/ps-stragglers.csv"
echo "# $cpu; $cmd"
# PS_STRAGGLERS_SUMMARY=1: only the tables and plots, from an earlier run's raw file
[[ ${PS_STRAGGLERS_SUMMARY:-0} == 1 ]] || echo "kind,rep,label,step,acc,wall,final,compute" >"$raw"
[[ ${PS_STRAGGLERS_SUMMARY:-0} == 1 ]] && reps_run=0 || reps_run=$reps
for rep in $(seq 1 "$reps_run"); do
    # the compute share of a synchronous step, measured without slowness
    # (a straggler's sleep would count as its compute)
    echo "ps-stragglers.sh: repeat $rep/$reps, no slowness: allreduce" >&2
    "$bench" "${common[@]}" --seed "$rep" --mode allreduce 2>&1 |
        awk -F, -v r="$rep" '$8 == 1 { print "none," r ",allreduce," $6 "," $9 "," $18 "," $8 "," $15 }' >>"$raw"
    for k in "${kinds[@]}"; do
        kind=${k%%|*}
        # shellcheck disable=SC2206
        slow=(${k#*|})
        for c in "${configs[@]}"; do
            label=${c%%|*}
            # shellcheck disable=SC2206
            args=(${c#*|})
            echo "ps-stragglers.sh: repeat $rep/$reps, $kind: $label" >&2
            if ! out=$("$bench" "${common[@]}" --seed "$rep" "${slow[@]}" "${args[@]}" 2>&1); then
                # counted (failed runs column) and the repeat goes on
                echo "ps-stragglers.sh: $label failed:" >&2
                echo "$out" >&2
                echo "$kind,$rep,$label,failed" >>"$raw"
                continue
            fi
            awk -F, -v k="$kind" -v r="$rep" -v l="$label" \
                'NR > 1 && $1 ~ /^[0-9]+$/ { print k "," r "," l "," $6 "," $9 "," $18 "," $8 "," $15 }' \
                <<<"$out" >>"$raw"
        done
    done
done

median() { sort -g | awk '$1 != "-" { v[++n] = $1 } END { if (n == 0) print "-"; else print (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2) }'; }
for k in "${kinds[@]}"; do
    kind=${k%%|*}
    # per repeat and label: time to target, ratio, final accuracy, total time
    sum=$(awk -F, -v k="$kind" '
        NR > 1 && $1 == k && $4 != "failed" { rows[++n] = $0 }
        NR > 1 && $1 == k && $3 == "allreduce" && $7 == 1 { target[$2] = $5 - 0.5 }
        END {
            for (i = 1; i <= n; i++) {
                split(rows[i], f, ",")
                r = f[2]; l = f[3]
                if (!((r, l) in reach) && f[5] >= target[r]) reach[r, l] = f[6]
                if (f[7] == 1) { final[r, l] = f[5]; total[r, l] = f[6] }
            }
            for (key in final) {
                split(key, p, SUBSEP)
                t = ((p[1], p[2]) in reach) ? reach[p[1], p[2]] : "-"
                ratio = (t == "-" || !((p[1], "allreduce") in reach)) ? "-" : t / reach[p[1], "allreduce"]
                print p[2] "\t" t "\t" ratio "\t" final[key] "\t" total[key]
            }
        }' "$raw")
    share=$(awk -F, '$1 == "none" { print $8 / $6 }' "$raw" | median)
    echo
    echo "### $kind ($(sed 's/^--//' <<<"${k#*|}")); compute is $(awk -v s="$share" 'BEGIN { printf "%.0f%%", 100 * s }') of allreduce's training wall time without slowness"
    echo
    echo "| config | time to target (s) | vs allreduce | final acc (%) | total (s) | reached | failed runs |"
    echo "| --- | --- | --- | --- | --- | --- | --- |"
    for c in "${configs[@]}"; do
        label=${c%%|*}
        t=$(awk -F'\t' -v l="$label" '$1 == l { print $2 }' <<<"$sum" | median)
        q=$(awk -F'\t' -v l="$label" '$1 == l { print $3 }' <<<"$sum" | median)
        a=$(awk -F'\t' -v l="$label" '$1 == l { print $4 }' <<<"$sum" | median)
        s=$(awk -F'\t' -v l="$label" '$1 == l { print $5 }' <<<"$sum" | median)
        n=$(awk -F'\t' -v l="$label" '$1 == l && $2 != "-" { n++ } END { print n + 0 }' <<<"$sum")
        nf=$(awk -F, -v k="$kind" -v l="$label" '$1 == k && $3 == l && $4 == "failed" { n++ } END { print n + 0 }' "$raw")
        printf '| %s | %s | %s | %s | %s | %s/%s | %s |\n' "$label" "$t" \
            "$(awk -v q="$q" 'BEGIN { if (q == "-") print "-"; else printf "%.2f", q }')" "$a" "$s" "$n" "$reps" "$nf"
    done
    if command -v gnuplot >/dev/null; then
        plotdata=$(mktemp)
        for c in "${configs[@]}"; do
            label=${c%%|*}
            echo "\"$label\""
            awk -F, -v k="$kind" -v l="$label" '$1 == k && $2 == 1 && $3 == l { print $6, $5 }' "$raw"
            printf '\n\n'
        done >"$plotdata"
        gnuplot <<EOF
set terminal pngcairo size 1000,600 noenhanced
set output "$outdir/ps-stragglers-$kind.png"
set title "MLP, 4 workers, batch $batch, $kind slowness ${k#*|}; compute $(awk -v s="$share" 'BEGIN { printf "%.0f%%", 100 * s }') of allreduce's step\n$cpu; $cmd" font ",10"
set xlabel "training wall time of worker 0 (s, log)"
set ylabel "test accuracy (%)"
set logscale x
set yrange [50:90]
set key bottom right
set grid
plot for [i=0:${#configs[@]}-1] "$plotdata" index i using 1:2 with linespoints title columnheader(1)
EOF
        rm -f "$plotdata"
        echo
        echo "plot: $outdir/ps-stragglers-$kind.png"
    fi
done
echo
echo "target: allreduce's final accuracy minus 0.5 point, per repeat (seed = repeat); times are"
echo "worker 0's training wall time in seconds (evaluation excluded), medians over $reps repeats;"
echo "raw records: $raw"
