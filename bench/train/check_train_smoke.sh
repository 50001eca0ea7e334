#!/usr/bin/env bash
# ctest bench_train_smoke: `terse-bench train` end to end on the real
# Fashion-MNIST with 2 real worker processes over libfabric.
#   - dense, and two compressed codecs (one over tcp), 300 steps on a
#     subset: accuracy must beat chance (10%) by a wide margin (> 65%), and
#     the byte counts must be what dense and compressed exchanges send;
#   - the same command twice prints the same accuracies and byte counts;
#   - Local SGD, --dp and parameter-server modes train too; a tiny sweep
#     prints every row and a PNG;
#   - bad options, a bad codec spec and a missing dataset fail with exit 2 or
#     1 and a sentence saying what is wrong.
#   check_train_smoke.sh path/to/terse-bench
set -u
bench=${1:?usage: check_train_smoke.sh TERSE_BENCH}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
# 19200 examples over 2 workers at batch 64: 150 steps per epoch, 300 in all.
subset=(--train-limit 19200 --test-limit 2000 --epochs 2 -q)

bad() { echo "FAIL: $*"; fail=1; }

# run NAME ARGS...: CSV into $tmp/NAME.csv; exit status must be 0.
run() {
    local name=$1
    shift
    if ! "$bench" train "${subset[@]}" --csv "$@" >"$tmp/$name.csv" 2>"$tmp/$name.err"; then
        bad "terse-bench train $* exited non-zero"
        cat "$tmp/$name.err" "$tmp/$name.csv"
        return 1
    fi
}

# CSV fields: 1 run, 2 group, 3 seed, 4 ef, 5 epoch, 6 step, 7 steps_total,
# 8 final, 9 test_acc, 10 test_loss, 11 train_loss, 12 bytes_sent,
# 13 dense_bytes, 14 ratio, 15-18 times, 19 label, 20 codec (quoted, last).
final_field() { # file field
    awk -F, -v f="$2" 'NR > 1 && $8 == 1 { v = $f } END { print v }' "$1"
}

# expect_acc NAME MIN: final accuracy above MIN.
expect_acc() {
    local acc
    acc=$(final_field "$tmp/$1.csv" 9)
    if ! awk -v a="$acc" -v m="$2" 'BEGIN { exit !(a + 0 > m) }'; then
        bad "$1: final test accuracy '$acc' is not above $2%"
        cat "$tmp/$1.csv"
    fi
}

# expect_ratio NAME LO HI: dense fp32 bytes / bytes sent within [LO, HI].
expect_ratio() {
    local r
    r=$(final_field "$tmp/$1.csv" 14)
    if ! awk -v r="$r" -v lo="$2" -v hi="$3" 'BEGIN { exit !(r + 0 >= lo && r + 0 <= hi) }'; then
        bad "$1: compression ratio '$r' is outside [$2, $3]"
        cat "$tmp/$1.csv"
    fi
}

# 1. Dense: every worker sends its share of a ring allreduce of the fp32
#    gradient, which for 2 workers is the gradient's size plus framing.
if run dense; then
    expect_acc dense 65
    expect_ratio dense 0.95 1.0
    steps=$(final_field "$tmp/dense.csv" 6)
    [[ $steps == 300 ]] || bad "dense: ran $steps steps, expected 300"
fi

# 2. Compressed: top-k 1% with error feedback over shm, PowerSGD rank 2 over tcp.
if run topk --codec topk:ratio=0.01,ef=1; then
    expect_acc topk 65
    expect_ratio topk 30 100
fi
if run psgd --codec powersgd:rank=2,ef=1 --provider tcp; then
    expect_acc psgd 65
    expect_ratio psgd 20 200
fi

# 3. Determinism: accuracy, losses and byte counts (fields 1-14) repeat
#    exactly; only the times (15-18) may differ.
if run dense2 && run topk2 --codec topk:ratio=0.01,ef=1; then
    for name in dense topk; do
        if ! cmp -s <(cut -d, -f1-14 "$tmp/$name.csv") <(cut -d, -f1-14 "$tmp/${name}2.csv"); then
            bad "$name: a rerun printed different accuracies or byte counts"
            diff <(cut -d, -f1-14 "$tmp/$name.csv") <(cut -d, -f1-14 "$tmp/${name}2.csv")
        fi
    done
fi

# 3b. The schedule is applied: a constant lr (--schedule none) ends elsewhere
#     than the default cosine decay, on the same seed and bytes.
if run const --schedule none; then
    a=$(final_field "$tmp/dense.csv" 9)
    b=$(final_field "$tmp/const.csv" 9)
    [[ $a != "$b" ]] || bad "--schedule none ended at the same accuracy as cosine ($a)"
fi

# 3c. The CNN trains, and PowerSGD compresses its kernel k2 and w3.
if run cnn --model cnn --codec powersgd:rank=2,ef=1; then
    expect_acc cnn 65
    expect_ratio cnn 5 100
fi

# 3d. Accordion between PowerSGD rank 4 and rank 1, deciding every 50 steps:
#     the first interval is mild, so it sends more than rank 1 alone; it
#     said which intervals were mild; and it sends less than rank 4 alone.
if run r1 --codec powersgd:rank=1,ef=1 && run r4 --codec powersgd:rank=4,ef=1 &&
   "$bench" train --train-limit 19200 --test-limit 2000 --epochs 2 --csv \
       --adapt accordion:low=powersgd:rank=4,ef=1,high=powersgd:rank=1,ef=1,every=50 \
       >"$tmp/acc.csv" 2>"$tmp/acc.err"; then
    b1=$(final_field "$tmp/r1.csv" 12)
    b4=$(final_field "$tmp/r4.csv" 12)
    ba=$(final_field "$tmp/acc.csv" 12)
    awk -v a="$ba" -v lo="$b1" -v hi="$b4" 'BEGIN { exit !(a > lo && a < hi) }' ||
        bad "accordion sent $ba bytes, not strictly between rank 1's $b1 and rank 4's $b4"
    grep -q "accordion: .*per interval of 50 steps: M[Ma]*a" "$tmp/acc.err" ||
        { bad "accordion: no interval log, or never aggressive"; cat "$tmp/acc.err"; }
    expect_acc acc 65
else
    bad "the accordion runs exited non-zero"
    cat "$tmp/acc.err" 2>/dev/null
fi

# 4. The softmax model, dense.
if run softmax --model softmax; then
    expect_acc softmax 65
    expect_ratio softmax 0.95 1.0
fi

# 5. Local SGD (4 local steps, then the change is averaged) and --dp.
if run local --mode localsgd:4 --codec int8; then
    expect_acc local 65
    # 300 steps in averages of 4: 75 exchanges of int8, so about 4 x 4 = 16x
    #    fewer bytes than dense every step (the small bucket is dense).
    expect_ratio local 14 16.5
fi
if run dp --dp clip=5,noise=0.001; then
    expect_acc dp 65
fi

# 5b. A parameter server: sync (bitwise-identical workers, server-side SGD)
# and async with a straggler and transient slow steps, over tcp; the servers
# are extra ranks.
if run ps_sync --mode ps:sync --servers 1 --provider tcp; then
    expect_acc ps_sync 65
fi
if run ps_async --mode ps:async --servers 2 --workers 3 --straggler 2:2 --momentum 0.5 \
       --transient 0.2:2 --provider tcp; then
    expect_acc ps_async 60
fi
# ... and colocated: every worker also a server, no extra ranks
if run ps_colocated --mode ps:sync --colocate --provider tcp; then
    expect_acc ps_colocated 65
fi

# 5c. Byzantine workers against a robust aggregator: 4 workers, the last
#     signflipping at -4x. The mean ascends; the median does not.
if run ps_median --mode ps:sync --workers 4 --byzantine 1:signflip --aggregator median \
       --momentum-at local; then
    expect_acc ps_median 60
fi
if run ps_flipped --mode ps:sync --workers 4 --byzantine 1:signflip --momentum-at local; then
    acc=$(final_field "$tmp/ps_flipped.csv" 9)
    awk -v a="$acc" 'BEGIN { exit !(a < 50) }' ||
        bad "a -4x signflip against the mean left $acc% (expected the mean to collapse)"
fi
# 5d. The robust sweep, tiny: 72 runs, two tables of 6 attacks x 6
#     aggregators, the checks, and the plot.
if "$bench" train --robust-sweep --model softmax --epochs 1 --train-limit 4000 --test-limit 500 \
       -q --plot "$tmp/robust.png" >"$tmp/robust.txt" 2>"$tmp/robust.err"; then
    rows=$(grep -cE '^(none|signflip|noise|labelflip|alie|ipm) +[0-9]' "$tmp/robust.txt")
    [[ $rows == 12 ]] || { bad "robust sweep: expected 12 rows, got $rows"; cat "$tmp/robust.txt"; }
    [[ $(grep -c "^#   cclip: worst drop" "$tmp/robust.txt") == 2 ]] ||
        bad "robust sweep: the checks are missing"
    [[ -s "$tmp/robust.png" ]] || bad "robust sweep: no plot"
else
    bad "terse-bench train --robust-sweep exited non-zero"
    cat "$tmp/robust.err"
fi

# 5e. Federated averaging, tiny: the fed sweep's baseline and four FedAvg
#     runs (iid and dirichlet:0.3, dense and int8:ef=1) with 6 clients, 3 a
#     round, and clients that drop out of rounds (each then closes at its
#     deadline): every run trains, int8 sends about a quarter of dense's
#     uplink, the drop-outs are counted, and the plot is drawn. A round with a
#     drop-out waits its whole deadline: 600 ms, where a client's local epoch
#     takes about 100 ms under ASan on a loaded 2-core machine (1,500 ms spent
#     16 of this script's 78 s waiting).
rounds=5 # 8 took 15 s, 5 take 10: each drop-out's round waits its deadline
fed=(--fed-sweep --clients 6 --fraction 0.5 --rounds $rounds --epochs 1 --train-limit 6000
     --test-limit 1000 --dropout 0.2 --deadline-ms 600)
if "$bench" train "${fed[@]}" --plot "$tmp/fed.png" >"$tmp/fed.txt" 2>"$tmp/fed.err"; then
    rows=$(sed -n "/^# to the final accuracy of the baseline/,\$p" "$tmp/fed.txt" |
           grep -cE '^fedavg:1 (iid|dir0.3) (dense|int8:ef=1) +1 +[0-9.]+ +([0-9]+|-) ')
    [[ $rows == 4 ]] || { bad "fed sweep: expected 4 rows to the baseline's accuracy, got $rows"; cat "$tmp/fed.txt"; }
    # the last round's uplink of each fedavg run: int8 against dense
    ratio=$(awk -v n=$rounds '/^fedavg:1 iid (dense|int8)/ && $5 == n && $9 == "MB" { mb[$3] = $8 }
                 END { if (mb["int8:ef=1"] > 0) printf "%.2f", mb["dense"] / mb["int8:ef=1"] }' "$tmp/fed.txt")
    awk -v r="$ratio" 'BEGIN { exit !(r + 0 > 3.0 && r + 0 < 4.2) }' ||
        { bad "fed sweep: dense / int8 uplink is '$ratio', expected about 4"; cat "$tmp/fed.txt"; }
    acc=$(awk -v n=$rounds '/^fedavg:1 iid dense/ && $5 == n { print $6 }' "$tmp/fed.txt")
    awk -v a="$acc" 'BEGIN { exit !(a + 0 > 60) }' || bad "fed sweep: iid dense ended at '$acc'%"
    grep -qE 'fedavg:1 iid dense: [1-9][0-9]* sampled clients dropped out of their round' "$tmp/fed.err" ||
        { bad "fed sweep: no drop-outs counted"; cat "$tmp/fed.err"; }
    grep -q 'dirichlet:0.3 shards hold [0-9]* to [0-9]* examples' "$tmp/fed.err" ||
        bad "fed sweep: the dirichlet shards were not reported"
    [[ -s "$tmp/fed.png" ]] || bad "fed sweep: no plot"
else
    bad "terse-bench train --fed-sweep exited non-zero"
    cat "$tmp/fed.err"
fi

# 6. A tiny sweep over 3 seeds: every configuration gets a row, the plot is
#    drawn, and a row's paired interval is what the same runs' CSV gives
#    (the runs are deterministic) by hand: mean of (row - dense) per seed,
#    +- t(0.975, 2) = 4.303 x sd / sqrt(3).
tiny=(--sweep --seeds 3 --train-limit 2560 --test-limit 500 --epochs 1 -q)
if "$bench" train "${tiny[@]}" --plot "$tmp/sweep.png" >"$tmp/sweep.txt" 2>"$tmp/sweep.err" &&
   "$bench" train "${tiny[@]}" --csv --plot "$tmp/sweep2.png" >"$tmp/sweep.csv" 2>>"$tmp/sweep.err"; then
    rows=$(grep -cE '^[a-z].* (no|yes) ' "$tmp/sweep.txt")
    [[ $rows == 28 ]] || { bad "sweep: expected 28 rows, got $rows"; cat "$tmp/sweep.txt"; }
    # CSV: 2 group (0 is dense), 3 seed, 4 ef, 8 final, 9 test_acc, 19 label.
    want=$(awk -F, 'NR > 1 && $8 == 1 && $2 == 0 { d[$3] = $9 }
                    NR > 1 && $8 == 1 && $4 == 1 && $19 == "\"qsgd 4-bit\"" { r[$3] = $9 }
                    END { n = 0; for (s in r) { x[++n] = r[s] - d[s]; m += x[n] } m /= n
                          for (i = 1; i <= n; i++) v += (x[i] - m) ^ 2
                          h = 4.303 * sqrt(v / (n - 1) / n)
                          printf "%+.2f [%+.2f,%+.2f]", m, m - h, m + h }' "$tmp/sweep.csv")
    got=$(awk '/^qsgd 4-bit +yes / { print $(NF - 8), $(NF - 7) }' "$tmp/sweep.txt")
    [[ $got == "$want" ]] ||
        { bad "sweep: qsgd 4-bit +EF shows '$got', the CSV gives '$want'"; cat "$tmp/sweep.txt"; }
    # The row's sd: the standard deviation of its own accuracies over seeds.
    want=$(awk -F, 'NR > 1 && $8 == 1 && $4 == 1 && $19 == "\"qsgd 4-bit\"" { x[++n] = $9; m += $9 }
                    END { m /= n; for (i = 1; i <= n; i++) v += (x[i] - m) ^ 2
                          printf "%.2f", sqrt(v / (n - 1)) }' "$tmp/sweep.csv")
    got=$(awk '/^qsgd 4-bit +yes / { print $(NF - 9) }' "$tmp/sweep.txt")
    [[ $got == "$want" ]] || bad "sweep: qsgd 4-bit +EF's sd is '$got', the CSV gives '$want'"
    grep -q "^# fewest bytes with the whole interval above -0.5 point\|^# no row has its whole interval" \
        "$tmp/sweep.txt" || bad "sweep: no summary line"
    grep -q "^accordion r4/r2 " "$tmp/sweep.txt" || bad "sweep: no accordion row"
    if [[ ! -s $tmp/sweep.png ]] || [[ $(head -c 4 "$tmp/sweep.png" | od -An -tx1 | tr -d ' ') != 89504e47 ]]; then
        bad "sweep: no PNG written"
        cat "$tmp/sweep.err"
    fi
else
    bad "the tiny sweep exited non-zero"
    cat "$tmp/sweep.err" "$tmp/sweep.txt"
fi

# 7. A worker killed mid-run: the launcher returns 1 within seconds, saying
#    the workers failed, instead of hanging.
"$bench" train --epochs 100 --train-limit 19200 --test-limit 2000 \
    >"$tmp/kill.out" 2>"$tmp/kill.err" &
launcher=$!
# The launcher's child is terse-run; its children are the workers. Kill a
# worker (not terse-run, which would test something else).
victim=
for _ in $(seq 1 100); do
    runner=$(pgrep -P "$launcher" | head -n 1)
    [[ -n $runner ]] && victim=$(pgrep -P "$runner" | tail -n 1)
    [[ -n $victim ]] && break
    sleep 0.1
done
if [[ -z $victim ]]; then
    bad "kill: no worker process appeared"
    kill "$launcher" 2>/dev/null
else
    # Kill once the first evaluation is recorded (its progress line says
    # "test NN%"), not after a fixed sleep: on a loaded machine the first
    # epoch can take longer than any fixed guess, and a run killed before
    # its first record has nothing to report.
    for _ in $(seq 1 300); do grep -q "test [0-9]" "$tmp/kill.err" && break; sleep 0.1; done
    kill -9 "$victim"
    for _ in $(seq 1 300); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$launcher" 2>/dev/null; then
        bad "kill: the launcher still runs 30 s after a worker was killed"
        kill -9 "$launcher"
    fi
    wait "$launcher"
    got=$?
    # libfabric's shm provider names its region after the pid
    # (/dev/shm/<pid>:<n>:<m>, 16 MiB) and a SIGKILLed process cannot remove
    # it; left behind, a later process that reuses the pid fails fi_enable
    # with "Device or resource busy". Remove what the dead worker left.
    rm -f /dev/shm/"$victim":*
    [[ $got == 1 ]] || { bad "kill: launcher exit status $got, expected 1"; cat "$tmp/kill.err"; }
    grep -q "workers failed" "$tmp/kill.err" ||
        { bad "kill: no 'workers failed' message"; cat "$tmp/kill.err"; }
    grep -q "killed by signal 9" "$tmp/kill.err" ||
        { bad "kill: terse-run did not report a worker killed by signal 9"; cat "$tmp/kill.err"; }
fi

# 8. Errors: status and a sentence that names the problem.
expect_fail() { # status pattern args...
    local want=$1 pattern=$2
    shift 2
    "$bench" train "$@" >"$tmp/out" 2>"$tmp/err"
    local got=$?
    if [[ $got != "$want" ]]; then
        bad "terse-bench train $*: exit status $got, expected $want"
        cat "$tmp/err"
    elif ! grep -q -- "$pattern" "$tmp/err"; then
        bad "terse-bench train $*: message does not mention '$pattern'"
        cat "$tmp/err"
    fi
}
expect_fail 2 "bogus" --codec bogus:ratio=1
expect_fail 2 "frobnicate" --codec topk:frobnicate=1
expect_fail 2 "--codec-for" --codec-for w9=int8
expect_fail 2 "expected softmax, mlp or cnn" --model resnet
expect_fail 2 "expected none, cosine or step" --schedule linear
expect_fail 2 "expected none, cosine or step" --schedule step:0.7,0.5
expect_fail 2 "--warmup" --warmup 0.9
expect_fail 2 "applies to --mode ps:... only" --mode allreduce --colocate
expect_fail 2 "runs a constant learning rate" --mode fedavg:1 --schedule cosine
expect_fail 2 "allreduce's only" --mode ps:sync --schedule step:0.5
expect_fail 2 "expected P:F" --transient 0:4
expect_fail 2 "expected P:F" --transient 0.1:0.5
expect_fail 2 "expected P:F" --transient 0.1
expect_fail 2 "expected accordion:low=SPEC,high=SPEC" --adapt accordion:low=int8
expect_fail 2 "expected accordion:low=SPEC,high=SPEC" --adapt accordion:low=int8,high=dense
expect_fail 2 "drop --codec" --adapt accordion:low=int8,high=sign --codec fp16
expect_fail 2 "adapt high" --adapt accordion:low=int8,high=bogus
expect_fail 2 "tensor of the cnn model (k1 c1" --model cnn --codec-for w1=int8
# The launcher checks each codec against the tensors it will really serve:
# b1 leaves the bucket, so the bucket is 2570 values, too few for k=2700 ...
expect_fail 2 "for a 2570x1 tensor" --codec int8 --small-codec topk:k=2700 --codec-for b1=int8
# ... and a tensor moved out of --codec's reach no longer has to fit it.
run moved --small 0 --codec topk:k=500 --codec-for b1=dense --codec-for b2=dense ||
    bad "a --codec that fits every tensor it serves was refused"
expect_fail 2 "none would adapt" --codec-for w1=int8 \
    --adapt accordion:low=powersgd:rank=4,ef=1,high=powersgd:rank=1,ef=1
expect_fail 2 "the cnn's sweep is --sweep" --sweep-full --model cnn
expect_fail 2 "localsgd" --mode localsgd:0
expect_fail 2 "clip=C,noise=S" --dp clip=1
expect_fail 2 "unknown option" --frobnicate
expect_fail 2 "unknown mode" --mode ps:bsp
expect_fail 2 "needs its bound" --mode ps:ssp
expect_fail 2 "--servers applies" --servers 2
expect_fail 2 "there are only 2 workers" --straggler 2:3
expect_fail 2 "worker 0 takes the snapshots" --mode ps:sync --straggler 0:3
expect_fail 2 "expected W:F" --straggler 1:0.5
expect_fail 2 "already has a codec" --codec-for w2=int8 --codec-for w2=fp16
expect_fail 2 "needs --workers 2" --sweep --workers 1
expect_fail 2 "too many runs" --sweep --seeds 100
expect_fail 2 "quotes" --sweep --plot "it's.png"
expect_fail 2 "needs --momentum-at local" --mask-momentum
expect_fail 2 "drop --momentum-at" --sweep --momentum-at local
expect_fail 2 "at most 1 of 2 workers" --mode ps:sync --byzantine 2:alie
expect_fail 2 "expected K:ATTACK" --mode ps:sync --byzantine 1:bitflip
expect_fail 2 "at most half" --mode ps:sync --workers 5 --byzantine 3:alie
expect_fail 2 "apply to --mode ps" --aggregator median
expect_fail 2 "needs --workers 7" --robust-sweep --workers 4
expect_fail 2 "drop --sweep, --aggregator" --robust-sweep --aggregator median
expect_fail 2 "runs --mode ps:sync" --robust-sweep --mode ps:async
expect_fail 2 "compressed half" --robust-sweep --codec dense
expect_fail 2 "n >= 2f+3" --mode ps:sync --workers 4 --aggregator krum:f=1
expect_fail 2 "unknown aggregator" --mode ps:sync --aggregator mode
expect_fail 2 "needs --deadline-ms" --mode fedavg:1 --dropout 0.1
expect_fail 2 "apply to --mode fedavg:E" --fraction 0.5
expect_fail 2 "expected iid or dirichlet:ALPHA" --mode fedavg:1 --partition dirichlet:x
expect_fail 2 "fedavg:E (E >= 1)" --mode fedavg:0
expect_fail 2 "neither --aggregator" --mode fedavg:1 --aggregator median
expect_fail 2 "--fed-sweep runs --mode fedavg" --fed-sweep --mode ps:sync
expect_fail 2 "--clients and --workers differ" --workers 4 --clients 6
expect_fail 1 "dataset-fashion-mnist" --data "$tmp/nowhere" "${subset[@]}"
"$bench" train --help >"$tmp/help" || bad "--help exited non-zero"
grep -q -- "--sweep" "$tmp/help" || bad "--help does not document --sweep"

[[ $fail == 0 ]] && echo "bench_train_smoke: all checks passed"
exit $fail
