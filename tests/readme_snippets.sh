#!/usr/bin/env bash
# README.md's C code is examples/readme_snippets.c's: every ```c block of the
# README must appear there as consecutive lines (leading whitespace ignored),
# so the README cannot show code the suite does not build and run. Then run
# the program as the README says, with 5 ranks.
# Usage: readme_snippets.sh REPO_DIR PATH/TO/terse-run PATH/TO/readme_snippets
set -uo pipefail
repo=${1:?} tr=${2:?} prog=${3:?}
/usr/bin/python3 - "$repo/README.md" "$repo/examples/readme_snippets.c" <<'PY' || exit 1
import re, sys
readme, src = (open(p).read() for p in sys.argv[1:3])
lines = [l.strip() for l in src.split("\n")]
blocks = re.findall(r"```c\n(.*?)```", readme, re.S)
if len(blocks) < 5:
    sys.exit("README.md has %d C blocks, expected at least 5" % len(blocks))
bad = 0
for i, b in enumerate(blocks, 1):
    want = [l.strip() for l in b.rstrip("\n").split("\n")]
    if not any(lines[k:k + len(want)] == want for k in range(len(lines))):
        print("README C block %d is not in examples/readme_snippets.c:\n%s" % (i, b))
        bad += 1
if bad:
    sys.exit(1)
print("ok: the README's %d C blocks are all in examples/readme_snippets.c" % len(blocks))
PY
out=$(timeout -k 5 120 "$tr" -n 5 "$prog" 2>&1)
rc=$?
if [ "$rc" != 0 ]; then echo "$out"; echo "FAIL: terse-run -n 5 readme_snippets exited $rc"; exit 1; fi
echo "ok: the README's program ran with 5 ranks"
