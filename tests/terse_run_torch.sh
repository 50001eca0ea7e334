#!/usr/bin/env bash
# docs/pytorch.md's launch line, as written: terse-run starts two processes
# of Debian's python3 whose torch.distributed joins through env:// (RANK,
# WORLD_SIZE, MASTER_ADDR, MASTER_PORT from terse-run) and all-reduces over
# gloo. Usage: terse_run_torch.sh PATH/TO/terse-run
set -uo pipefail
TR=${1:?usage: terse_run_torch.sh PATH/TO/terse-run}
out=$(timeout -k 5 120 "$TR" -n 2 /usr/bin/python3 -c '
import torch, torch.distributed as d
d.init_process_group("gloo")
t = torch.ones(4) * (d.get_rank() + 1)
d.all_reduce(t)
assert t.tolist() == [3.0] * 4, t
print("sum", t[0].item(), "rank", d.get_rank(), "of", d.get_world_size())
d.destroy_process_group()
' 2>&1)
rc=$?
echo "$out"
if [ "$rc" != 0 ]; then echo "FAIL: terse-run -n 2 /usr/bin/python3 (torch, env://) exited $rc"; exit 1; fi
if [ "$(echo "$out" | grep -Ec '^\[([01])\] sum 3.0 rank \1 of 2$')" != 2 ]; then
    echo "FAIL: want both ranks' sums"; exit 1
fi
echo "ok: torch.distributed joins through terse-run's environment and all-reduces"
