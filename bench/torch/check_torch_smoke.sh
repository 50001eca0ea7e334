#!/usr/bin/env bash
# Smoke: bench/torch/torch_ddp.py end to end, tiny (4 steps, 3 configurations,
# accuracy on 1,000 test images: evaluating on all 10,000 took 64 of 82 s),
# so that the benchmark of docs/pytorch.md keeps running: every row is
# there, byte counts are right in order, bad options fail with a sentence.
# Usage: check_torch_smoke.sh LIBTERSE
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export TERSE_LIBRARY=$1 PYTHONDONTWRITEBYTECODE=1 OPENBLAS_NUM_THREADS=1
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" "$here/torch_ddp.py" --help | grep -q -- "--max-steps"
if "$py" "$here/torch_ddp.py" --configs gloo,bogus >"$tmp/err" 2>&1; then
    echo "an unknown configuration was accepted"; exit 1
fi
grep -q "unknown configuration 'bogus'" "$tmp/err"
if "$py" "$here/torch_ddp.py" --test-limit -1 >"$tmp/err" 2>&1; then
    echo "a negative --test-limit was accepted"; exit 1
fi
grep -q -- "--test-limit must be >= 0" "$tmp/err"
"$py" "$here/torch_ddp.py" --steps 4 --max-steps 4 --eval-every 2 --compute-steps 2 --test-limit 1000 \
    --configs terse-int8,gloo,torch-psgd4 --json "$tmp/r.json" >"$tmp/out" 2>"$tmp/log" ||
    { cat "$tmp/log"; exit 1; }
"$py" - "$tmp/r.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
r = {x["config"]: x for x in d["results"]}
assert [x["config"] for x in d["results"]] == ["gloo", "terse-int8", "torch-psgd4"], r.keys()
for x in r.values():
    assert x["steps_run"] == 4 and len(x["curve"]) == 2, x
    assert 0 <= x["final_acc"] <= 100 and x["step_ms"] > 0 and x["compute_ms"] > 0
assert r["gloo"]["bytes_per_step"] == 4 * r["gloo"]["params"]
# int8: about a quarter of dense after the 2 dense steps; PowerSGD less still
assert r["terse-int8"]["bytes_per_step"] < 0.8 * r["gloo"]["bytes_per_step"]
assert r["terse-int8"]["provider"] == "net"
print("bench_torch_smoke: ok")
PY
grep -q "^| terse-int8 |" "$tmp/out"
