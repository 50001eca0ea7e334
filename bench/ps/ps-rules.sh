#!/usr/bin/env bash
# ps-rules.sh [SEEDS] [EXTRA...]
#
# Which update rule for stale pushes converges (terse.h, Stale pushes):
# the Fashion-MNIST MLP, 4 workers, batch 256, lr 0.1, momentum 0.9,
# 2 epochs, cosine schedule (allreduce's default; the parameter server runs
# it too), over tcp, 2 server ranks: allreduce, then ps:async and ps:ssp:2
# with each rule, for seeds 1..SEEDS (3). EXTRA is passed to every run
# (e.g. --straggler 3:3). Prints one line per run: seed|mode|final
# test accuracy|wall seconds; then per mode the median over seeds of the
# final accuracy minus allreduce's of the same seed.
set -u
cd "$(dirname "$0")/../.."
seeds=${1:-3}
shift || true
bench=build/bench/terse-bench
[[ -x $bench ]] || { echo "ps-rules.sh: build first (./terse.sh build)" >&2; exit 1; }
common=(train --model mlp --workers 4 --epochs 2 --batch 256 --lr 0.1 --momentum 0.9
        --schedule cosine --provider tcp --csv -q "$@")
modes=(allreduce ps:async:update=plain ps:async:update=step ps:async:update=dc
       ps:async:update=amom ps:async:update=amom+step ps:async:update=amom+dc
       ps:async:update=dana
       ps:ssp:2,update=plain ps:ssp:2,update=step ps:ssp:2,update=amom ps:ssp:2,update=dana)
echo "# $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) cores; bench/ps/ps-rules.sh $seeds $*"
out=$(mktemp /tmp/ps-rules-XXXXXX)
for s in $(seq 1 "$seeds"); do
    for m in "${modes[@]}"; do
        extra=()
        [[ $m == ps:* ]] && extra=(--servers 2)
        line=$("$bench" "${common[@]}" --seed "$s" --mode "$m" "${extra[@]}" 2>&1 | awk -F, '$8 == 1 { print $9 "|" $18 }')
        echo "$s|$m|${line:-failed}" | tee -a "$out"
    done
done
echo "# mode, median over seeds of (final - allreduce's final of the seed), in points"
awk -F'|' '$2 == "allreduce" { ar[$1] = $3 } { acc[$1, $2] = $3; mode[$2] = 1 }
    END { for (m in mode) { n = 0
            for (k in acc) { split(k, p, SUBSEP); if (p[2] == m) d[++n] = acc[k] - ar[p[1]] }
            for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (d[j] < d[i]) { t = d[i]; d[i] = d[j]; d[j] = t }
            med = (n % 2) ? d[(n + 1) / 2] : (d[n / 2] + d[n / 2 + 1]) / 2
            printf "%s\t%+.2f\n", m, med } }' "$out" | sort
rm -f "$out"
