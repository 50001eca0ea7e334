"""One rank of test_mpi.py, started by mpirun: OUTDIR SCENARIO. Writes
OUTDIR/rank<world rank>.json."""
import json
import os
import sys

import numpy as np
from mpi4py import MPI

import terse

outdir, scenario = sys.argv[1], sys.argv[2]
world = MPI.COMM_WORLD
res = {"world_rank": world.Get_rank()}


def allreduce_check(comm, tc):
    n = 100003
    base = (np.arange(n) % 4096).astype(np.float32)
    x = base + tc.rank
    tc.allreduce(x)
    return bool(np.array_equal(x, base * tc.size + sum(range(tc.size))))


try:
    if scenario == "world":
        with terse.Comm.from_mpi(timeout_ms=20000) as tc:
            res.update(rank=tc.rank, size=tc.size, provider=tc.provider,
                       topology=[tc.host_index, tc.local_rank, tc.local_size, tc.num_hosts],
                       sum_ok=allreduce_check(world, tc))
    elif scenario == "split":
        # two jobs at once, one per half of the world (even and odd ranks)
        half = world.Split(world.Get_rank() % 2, world.Get_rank())
        with terse.Comm.from_mpi(half, timeout_ms=20000) as tc:
            res.update(rank=tc.rank, size=tc.size, mpi_rank=half.Get_rank(),
                       sum_ok=allreduce_check(half, tc))
            # what rank 0 of this half contributes identifies the half
            y = np.full(4, float(world.Get_rank()), dtype=np.float32)
            tc.allreduce(y)
            res["half_sum"] = float(y[0])
        half.Free()
    elif scenario == "bad-addr":
        # rank 0 cannot bind this address: every rank raises the same sentence
        terse.Comm.from_mpi(addr=None if world.Get_rank() else "no-such-host.invalid:1")
    elif scenario == "not-a-comm":
        terse.Comm.from_mpi(comm=object())
    elif scenario == "seal-no-token":
        # a drawn token would cross MPI's network in the clear: refused everywhere
        os.environ["TERSE_WIRE"] = "seal"
        terse.Comm.from_mpi(timeout_ms=20000)
    elif scenario == "token-on-rank-0-only":
        terse.Comm.from_mpi(token="a-token-of-rank-0-only-0123" if world.Get_rank() == 0 else None)
    elif scenario == "seal-env-token":
        # every rank has TERSE_TOKEN: nothing secret crosses MPI, and seal works
        os.environ["TERSE_WIRE"] = "seal"
        os.environ["TERSE_TOKEN"] = "a-token-every-rank-has-0123456789"
        with terse.Comm.from_mpi(timeout_ms=20000) as tc:
            res.update(rank=tc.rank, sum_ok=allreduce_check(world, tc))
except Exception as e:  # reported, not raised: the test reads it
    res["error"] = "%s: %s" % (type(e).__name__, e)
with open(os.path.join(outdir, "rank%d.json" % world.Get_rank()), "w") as f:
    json.dump(res, f)
