#!/usr/bin/env bash
# allreduce-model.sh [--net RATE] [--bytes SIZE] [--ranks "2 4 8"] [--codecs "..."]
#                    [--provider P] [TERSE_BENCH]
#
# terse-bench allreduce --model, checked: the alpha-beta model's prediction
# against terse_allreduce measured at each rank count, in one run. First
# alpha is measured (the median time of a 4-byte dense allreduce at 2 ranks,
# one exchange), and the link: with --net RATE the shaped namespace's rate
# (bench/core/slow-net.sh; RATE is the total of every rank's traffic, so the model
# shares it: --shared-link); without, loopback's, fitted as twice the dense
# ring's busbw at 64 MiB and 2 ranks, shared by the ranks too (on loopback
# the link is the machine's cores). Then each rank count runs with --model and
# these two numbers, and the script prints every "check" line (measured and
# predicted time and bytes per rank) and the last run's predictions for 8
# to 1024 ranks.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/sweep-args.sh" # bytes=16M, ranks="2 4 8", provider=tcp unless given
codecs="fp16 int8 qsgd:bits=4 sign topk:ratio=0.01,ef=1"
help_lines=2,14
sweep_args "$@"

run() { # terse-bench allreduce arguments -> its stdout
    local cmd=(env OPENBLAS_NUM_THREADS=1 "$bench" allreduce --provider "$provider" -q "$@")
    if [[ -n $net ]]; then bash "$here/../core/slow-net.sh" "$net" "${cmd[@]}" 2>/dev/null; else "${cmd[@]}"; fi
}
col() { # CSV on stdin, column name -> the first data row's value
    awk -F, -v name="$1" 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
                          NR == 2 { print $c[name] }'
}

alpha=$(run -n 2 -b 4 -e 4 -r 200 -w 20 --csv | col time_us)
if [[ -n $net ]]; then
    gbps=$(/usr/bin/python3 -c '
import re, sys
m = re.fullmatch(r"([0-9.]+)\s*([kmg]?)(bit|bps)", sys.argv[1].lower())
if not m: sys.exit("allreduce-model.sh: cannot read the rate " + sys.argv[1])
v = float(m.group(1)) * {"": 1e-9, "k": 1e-6, "m": 1e-3, "g": 1.0}[m.group(2)]
print(v * (8 if m.group(3) == "bps" else 1))' "$net")
    link=(--link-gbps "$gbps" --shared-link)
    how="shaped link $net, shared by the ranks"
else
    # loopback's "link" is the machine's cores, shared by every rank: its
    # total is what 2 ranks' dense ring moves at 64 MiB, both directions
    busbw=$(run -n 2 -b 64M -e 64M -r 5 --csv | col busbw_gbps)
    gbps=$(awk -v b="$busbw" 'BEGIN { printf "%.3f", 2 * 8 * b }')
    link=(--link-gbps "$gbps" --shared-link)
    how="loopback, B fitted: twice the dense ring's busbw at 64 MiB, 2 ranks, shared by the ranks"
fi
echo "# allreduce-model.sh: $bytes, provider $provider, $how"
echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores"
echo "# alpha = $alpha us (4-byte dense allreduce, 2 ranks), B = $gbps Gbit/s"
cargs=()
for c in $codecs; do cargs+=(-c "$c"); done
last=""
for n in $ranks; do
    out=$(run -n "$n" -b "$bytes" -e "$bytes" -r 5 -w 1 -t 4 "${cargs[@]}" --model \
          --alpha "$alpha" "${link[@]}")
    echo "$out" | grep -E '^# (codec |check)' | sed 's/: encode.*//'
    last=$out
done
echo "#"
echo "# predictions (the last run's):"
echo "$last" | sed -n '/^# model/,$p'
