"""The Python blocks of README.md and docs/pytorch.md, as one program.

tests/docs_snippets.sh checks that every ```python block of README.md and
docs/ appears here line for line (leading whitespace ignored), and runs this
file the way docs/pytorch.md says, with 2 ranks:

    PYTHONPATH=python build/tools/terse-run -n 2 /usr/bin/python3 examples/pytorch_snippets.py

Every terse call raises terse.Error on a failed status, so a block that
fails stops the program with a non-zero exit. Each part also checks its
results, and each rank ends by printing "pytorch_snippets: ok, rank R of N".
"""

import collections

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import terse


def api_cheat_sheet():
    """docs/pytorch.md, "The Python API"."""
    import numpy as np, terse

    with terse.Codec("int8:ef=1", 1000) as c:            # rows, cols=1
        msg = c.encode(np.ones(1000, np.float32))        # bytes
        out = c.decode(msg)                              # new float32 array; or out=, alpha=, accumulate=
        s = c.state()                                    # bytes: residual, step, stream
        c.load_state(s); c.traits, c.spec, c.bound, c.step, c.residual()

    x, y = np.ones(1000, np.float32), np.ones(10, np.float32)
    biases, buf = [np.ones(4, np.float32) for _ in range(3)], bytearray(16)
    with terse.Comm() as comm, terse.Codec("int8:ef=1", 1000) as c:  # rank, size, address
        comm.allreduce(x, op="avg")                      # and token from the environment
        comm.allreduce(x, codec=c)                       # compressed, with c's error feedback
        req = comm.allreduce_start(y)                    # non-blocking; req.test() polls
        req.wait()                                       # a failed status raises terse.Error
        with comm.group():                               # starts submitted together
            reqs = [comm.allreduce_start(b) for b in biases]
        for r in reqs: r.wait()
        comm.broadcast(buf, root=0); parts = comm.allgather(b"..."); comm.barrier()
        comm.stats()                                     # dict of terse_comm_stats
        n = comm.size

    assert np.allclose(out, 1.0, atol=0.01), out[:4]
    assert np.allclose(x, n, atol=0.05 * n), x[:4]    # avg of ones, then a sum over n ranks
    assert np.array_equal(y, np.full(10, n, np.float32)), y
    assert all(np.array_equal(b, np.full(4, n, np.float32)) for b in biases)
    assert parts == [b"..."] * n, parts


def make_model():
    torch.manual_seed(0)                                  # the same start on every rank
    return torch.nn.Sequential(collections.OrderedDict(
        features=torch.nn.Linear(32, 64), relu=torch.nn.ReLU(),
        classifier=torch.nn.Linear(64, 10)))


def train(ddp_model, steps=6):
    """Your training loop, unchanged by terse: a few SGD steps on random data
    (each rank its own), past the hook's dense start_iter iterations."""
    opt = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps):
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp_model(x), y).backward()
        opt.step()


def same_on_every_rank(ddp_model):
    flat = torch.cat([p.detach().flatten() for p in ddp_model.parameters()])
    mine = flat.clone()
    dist.broadcast(flat, src=0)
    assert torch.equal(flat, mine), "parameters differ between ranks"


def readme_ddp():
    """README.md, "From Python and PyTorch"."""
    ddp_model = DDP(make_model())
    import terse.torch                                        # PYTHONPATH=python, or installed
    comm = terse.torch.comm_from_process_group()              # after init_process_group
    hook = terse.torch.Hook(comm, "powersgd:rank=4,ef=1")     # or {"*.weight": spec, ...}
    hook.register(ddp_model)                                  # ddp_model = DDP(model)
    train(ddp_model)                                          # your training loop, unchanged
    hook.close(); comm.close()
    same_on_every_rank(ddp_model)


def guide_ddp():
    """docs/pytorch.md, "Add terse to a DDP script"."""
    ddp_model = DDP(make_model())
    import terse.torch
    comm = terse.torch.comm_from_process_group()              # every rank; rank 0 picks port and token
    hook = terse.torch.Hook(comm, "powersgd:rank=4,ef=1")     # a spec, or {"pattern": spec}
    hook.register(ddp_model)                                  # names the parameters, makes the codecs
    train(ddp_model)                                          # train as before; at the end:
    hook.close(); comm.close()
    same_on_every_rank(ddp_model)


def dict_spec():
    """docs/pytorch.md, "Example of a dict spec"."""
    ddp_model = DDP(make_model())
    comm = terse.torch.comm_from_process_group()
    hook = terse.torch.Hook(comm, {"classifier.*": "dense",
                                   "*.weight": "powersgd:rank=4,ef=1"})   # biases: dense by the rule
    hook.register(ddp_model)
    train(ddp_model)
    assert hook.error is None, hook.error
    hook.close(); comm.close()
    same_on_every_rank(ddp_model)


def main():
    dist.init_process_group("gloo")                       # env://, as terse-run sets it
    api_cheat_sheet()
    readme_ddp()
    guide_ddp()
    dict_spec()
    print("pytorch_snippets: ok, rank %d of %d" % (dist.get_rank(), dist.get_world_size()),
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
