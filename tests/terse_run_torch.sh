#!/usr/bin/env bash
# docs/pytorch.md's launch line, as written, from the repository's top:
# terse-run starts two processes of Debian's python3 running
# examples/pytorch_snippets.py (every Python block of the README and
# docs/pytorch.md), whose torch.distributed joins through env:// (RANK,
# WORLD_SIZE, MASTER_ADDR, MASTER_PORT from terse-run) for DDP over gloo,
# with terse carrying the gradients and the API cheat sheet's collectives.
# Each rank checks its own results; both must say so.
# Usage: terse_run_torch.sh PATH/TO/terse-run REPO_DIR
set -uo pipefail
TR=${1:?usage: terse_run_torch.sh PATH/TO/terse-run REPO_DIR}
repo=${2:?usage: terse_run_torch.sh PATH/TO/terse-run REPO_DIR}
line='PYTHONPATH=python build/tools/terse-run -n 2 /usr/bin/python3 examples/pytorch_snippets.py'
if ! grep -qxF "$line" "$repo/docs/pytorch.md"; then
    echo "FAIL: docs/pytorch.md no longer gives the launch line: $line"; exit 1
fi
out=$(cd "$repo" && PYTHONPATH=python timeout -k 5 120 "$TR" -n 2 /usr/bin/python3 \
      examples/pytorch_snippets.py 2>&1)
rc=$?
echo "$out"
if [ "$rc" != 0 ]; then echo "FAIL: terse-run -n 2 /usr/bin/python3 examples/pytorch_snippets.py exited $rc"; exit 1; fi
if [ "$(echo "$out" | grep -Ec '^\[([01])\] pytorch_snippets: ok, rank \1 of 2$')" != 2 ]; then
    echo "FAIL: want both ranks' 'pytorch_snippets: ok'"; exit 1
fi
echo "ok: docs/pytorch.md's launch line runs the Python snippets with 2 ranks"
