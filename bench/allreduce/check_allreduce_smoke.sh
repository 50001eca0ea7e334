#!/usr/bin/env bash
# ctest bench_allreduce_smoke: a tiny `terse-bench allreduce` over shm and
# tcp must launch its ranks, measure every (codec, size) and print rows that
# are ok, with positive times and byte counts -- and, when the Open MPI peer
# was built (second argument "mpi"), MPI columns beside them.
#   check_allreduce_smoke.sh path/to/terse-bench mpi|nompi
set -u
bench=${1:?usage: check_allreduce_smoke.sh TERSE_BENCH mpi|nompi}
mpi=${2:-nompi}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail=0

check() { # provider extra-args...
    local provider=$1
    shift
    local args=(allreduce -n 2 --provider "$provider" -b 64K -e 1M -f 4 -r 3 -w 1 -t 0.5 --csv -q
                -c dense -c topk:ratio=0.01 -c int8 "$@")
    if ! "$bench" "${args[@]}" >"$out"; then
        echo "FAIL: terse-bench ${args[*]} exited non-zero"
        cat "$out"
        fail=1
        return
    fi
    # 3 codecs x 3 sizes (64K, 256K, 1M), each 'ok' with time > 0 and, for
    # two ranks, bytes on the wire > 0 (none for dense over the host's shared
    # segment, dense-seg); columns by their header names. Two ranks: dense
    # takes the segment (shm), recursive doubling or the ring, topk and int8 the
    # all-gather of messages. algbw and busbw are nccl-tests' on every row,
    # compressed or not (bytes / time, then x 2(N-1)/N), and wirebw is the
    # wire bytes per rank / time (within the CSV's rounding).
    # With --vs-mpi over tcp every row comes twice, "CODEC [wire mac]" and
    # "CODEC [wire none]" (terse's MAC against Open MPI's nothing).
    local want=9
    [[ $provider == tcp && $* == *--vs-mpi* ]] && want=18
    local got
    got=$(awk -F, -v mpi="$*" '
        function near(a, b) { d = a - b; if (d < 0) d = -d; return d <= 1e-5 + 1e-3 * (b < 0 ? -b : b) }
        NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        { status = $col["status"]; algo = $col["algo"]; t = $col["time_us"]
          n_ranks = $col["nranks"]; alg = $col["algbw_gbps"]; bus = $col["busbw_gbps"]
          wire = $col["wire_bytes"]; wbw = $col["wirebw_gbps"] }
        status == "ok" && t > 0 &&
            ((wire > 0 && wbw > 0) || (algo == "dense-seg" && wire == 0 && wbw == 0)) &&
            near(alg, 1e-3 * $col["bytes"] / t) &&
            near(bus, alg * 2 * (n_ranks - 1) / n_ranks) && near(wbw, 1e-3 * wire / t) &&
            (mpi == "" || ($col["mpi_time_us"] > 0 && $col["vs_mpi"] > 0 &&
                           near($col["mpi_busbw_gbps"],
                                $col["mpi_algbw_gbps"] * 2 * (n_ranks - 1) / n_ranks))) &&
            (($1 ~ /^"dense( \[wire (mac|none)\])?"$/ && algo ~ /^dense-(rd|ring|seg)$/) ||
             ($1 !~ /^"dense/ && algo ~ /^gather(-pipe)?$/)) { n++ }
        END { print n + 0 }' "$out")
    if [[ $got != "$want" ]]; then
        echo "FAIL: $provider: expected $want ok rows, got $got"
        cat "$out"
        fail=1
    else
        echo "ok: $provider: $got rows${*:+ (with $*)}"
    fi
}

if [[ $mpi == mpi ]]; then
    check shm --vs-mpi
    check tcp --vs-mpi
else
    check shm
    check tcp
fi

# Six ranks: fp16 at 1 MiB (512 KiB messages, 85 KiB pieces; gathering them
# would move 3x dense) takes the compressed reduce-scatter by default, the
# all-gather when told, and the reduce-scatter sends about a third of the
# gather's bytes.
algo_bytes() { # env... -> "algo wire_bytes" of the one fp16 row
    env "$@" "$bench" allreduce -n 6 --provider shm -b 1M -e 1M -r 3 -w 1 -t 0.5 --csv -q \
        -c fp16 | awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
                           $col["status"] == "ok" { print $col["algo"], $col["wire_bytes"] }'
}
read -r a_rs b_rs < <(algo_bytes -u TERSE_COMPRESSED_ALGO)
read -r a_g b_g < <(algo_bytes TERSE_COMPRESSED_ALGO=gather)
if [[ ${a_rs:-} != rs || ! ${a_g:-} =~ ^gather(-pipe)?$ ]] ||
   ! awk -v r="${b_rs:-0}" -v g="${b_g:-0}" 'BEGIN { exit !(r > 0 && g > 0 && r < 0.45 * g) }'; then
    echo "FAIL: 6 ranks fp16 1M: default '${a_rs:-none}' ${b_rs:-?} B, gather '${a_g:-none}' ${b_g:-?} B"
    fail=1
else
    echo "ok: 6 ranks fp16 1M: rs sends $b_rs B per rank, gather $b_g B"
fi

# --vs-flat: every row again with TERSE_TOPOLOGY=flat, its time and the
# ratio beside it; the topology column names hosts x ranks per host.
# vs_flat_rows EXPECT-TOPOLOGY EXPECT-ALGO ARGS...: how many rows are ok with
# that topology and algorithm, flat_time_us > 0 and vs_flat = time / flat.
vs_flat_rows() {
    local topo=$1 algo=$2
    shift 2
    "$bench" allreduce "$@" -r 3 -w 1 -t 0.5 --csv -q --vs-flat >"$out" || { cat "$out"; return; }
    awk -F, -v topo="$topo" -v algo="$algo" '
        NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        { t = $col["time_us"]; f = $col["flat_time_us"]; v = $col["vs_flat"]; d = v - t / f }
        $col["status"] == "ok" && $col["topology"] == topo && $col["algo"] ~ algo && f > 0 &&
            d < 1e-3 && d > -1e-3 { n++ }
        END { print n + 0 }' "$out"
}
got=$(vs_flat_rows 1x2 '^dense-(rd|ring|seg)$' -n 2 --provider shm -b 64K -e 1M -f 4)
if [[ $got != 3 ]]; then
    echo "FAIL: --vs-flat over shm: expected 3 ok rows (topology 1x2, flat time, ratio), got $got"
    cat "$out"
    fail=1
else
    echo "ok: --vs-flat over shm: 3 rows, topology 1x2"
fi
# With root and network namespaces: 2 hosts x 2 ranks (terse-run --hosts 2),
# the hierarchical all-reduce against the flat ring.
if [[ $(id -u) == 0 ]] && ip netns add "trh-probe-$$" 2>/dev/null; then
    ip netns del "trh-probe-$$"
    got=$(vs_flat_rows 2x2 '^dense-hier-seg$' -n 4 --hosts 2 --link 1gbit --provider tcp -b 1M -e 1M)
    if [[ $got != 1 ]]; then
        echo "FAIL: --hosts 2 --vs-flat: expected 1 ok dense-hier-seg row on 2x2, got $got"
        cat "$out"
        fail=1
    else
        echo "ok: --hosts 2 -n 4 --vs-flat: dense-hier-seg on 2x2, $(awk -F, 'NR == 1 {
            for (i = 1; i <= NF; i++) col[$i] = i; next } { print "hier/flat", $col["vs_flat"] }' "$out")"
    fi
else
    echo "ok: --hosts part skipped: needs root and network namespaces"
fi
"$bench" allreduce -n 2 --link 1gbit >/dev/null 2>&1
rc=$?
[[ $rc == 2 ]] || { echo "FAIL: --link without --hosts gave exit status $rc, not 2"; fail=1; }
"$bench" allreduce -n 2 --vs-flat --vs-mpi >/dev/null 2>&1
rc=$?
[[ $rc == 2 ]] || { echo "FAIL: --vs-flat with --vs-mpi gave exit status $rc, not 2"; fail=1; }

# Usage errors are exit 2 and never start a rank.
"$bench" allreduce -c 'nosuchcodec' >/dev/null 2>&1
rc=$?
if [[ $rc != 2 ]]; then
    echo "FAIL: a bad codec spec gave exit status $rc, not 2"
    fail=1
fi
"$bench" allreduce -b 6 >/dev/null 2>&1
rc=$?
if [[ $rc != 2 ]]; then
    echo "FAIL: a size that is not a multiple of 4 gave exit status $rc, not 2"
    fail=1
fi
exit $fail
