"""One rank of test_torch.py: OUT SCENARIO [ARGS]. DDP runs on gloo for its
own traffic; terse carries the gradients. Writes a JSON result."""
import copy
import gzip
import hashlib
import json
import os
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import terse
import terse.torch as tt

torch.set_num_threads(1)
out, scenario = sys.argv[1], sys.argv[2]
args = sys.argv[3:]
res = {}
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
provider = os.environ.get("T_PROVIDER", "tcp")
comm = tt.comm_from_process_group(provider=provider,
                                  timeout_ms=int(os.environ.get("T_TIMEOUT", "20000")))
res["provider"] = comm.provider


def done():
    with open(out, "w") as f:
        json.dump(res, f)


def model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 8, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(8 * 12 * 12, 256), nn.ReLU(), nn.Linear(256, 10))


def batch(step, n=32):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def fmnist(count):
    d = "/usr/share/datasets/fashion-mnist"
    with gzip.open(os.path.join(d, "train-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)[:count]
    with gzip.open(os.path.join(d, "train-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)[:count]
    return torch.from_numpy(x.astype(np.float32) / 255.0), torch.from_numpy(y.astype(np.int64))


def digest(m):
    h = hashlib.sha256()
    for p in m.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def step(ddp, opt, x, y):
    loss = nn.functional.cross_entropy(ddp(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


if scenario == "match":
    # Plain DDP (gloo allreduce) against the hook in dense mode, from
    # iteration 0 (one bucket) through the rebuild at iteration 1.
    # With spec "none" (the fp32 passthrough codec) and dense_below=0 every
    # parameter of two or more dimensions is its own exchange at its own
    # offset in the bucket; the biases travel as merged dense ranges.
    overlap = args[0] == "1"
    spec, dense_below = args[1], int(args[2])
    plain = DDP(model(), bucket_cap_mb=0.01)
    hooked = DDP(model(), bucket_cap_mb=0.01)
    h = tt.Hook(comm, spec, start_iter=0, overlap=overlap,
                dense_below=dense_below).register(hooked)
    res["bitwise"], res["maxdiff"], res["buckets"] = [], [], []
    for it in range(4):
        x, y = batch(it)
        for m in (plain, hooked):
            m.zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
        diffs = [(a.grad - b.grad).abs().max().item()
                 for a, b in zip(plain.parameters(), hooked.parameters())]
        res["bitwise"].append(all(torch.equal(a.grad, b.grad)
                                  for a, b in zip(plain.parameters(), hooked.parameters())))
        res["maxdiff"].append(max(diffs))
        res["buckets"].append(len({k[0] for k in h._plans}))
    res["codecs"] = sorted(h._codecs)
    res["exchanges"] = sorted(len(p) for p in h._plans.values())
    h.close()
    done()

elif scenario == "overlap":
    spec = {"4.weight": "powersgd:rank=4,ef=1", "*": "int8:ef=1"}
    ms = [DDP(model(), bucket_cap_mb=0.01) for _ in range(2)]
    hs = [tt.Hook(comm, spec, start_iter=1, overlap=ov).register(m)
          for m, ov in zip(ms, (True, False))]
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in ms]
    for it in range(8):
        x, y = batch(it)
        for m, o in zip(ms, opts):
            step(m, o, x, y)
    res["digests"] = [digest(m) for m in ms]
    res["codecs"] = sorted(hs[0]._codecs)
    res["codec_specs"] = sorted(c.spec for c in hs[0]._codecs.values())
    for h in hs:
        h.close()
    done()

elif scenario == "lossy":
    spec = args[0]
    x_all, y_all = fmnist(4096)
    ddp = DDP(model(), bucket_cap_mb=0.05)
    h = tt.Hook(comm, spec, start_iter=2).register(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for it in range(60):
        idx = torch.arange(64) + (it * 128 + rank * 64) % 4032
        losses.append(step(ddp, opt, x_all[idx], y_all[idx]))
    res["losses"] = losses
    res["digest"] = digest(ddp)
    st = h.stats()
    res["bytes"] = st["payload_bytes_sent"]
    res["residuals"] = sum(1 for c in h._codecs.values() if c.residual() is not None
                           and np.abs(c.residual()).max() > 0)
    h.close()
    done()

elif scenario == "badspec":
    def attempt(fn):
        try:
            fn()
            return "no error", ""
        except terse.Error as e:
            return e.name, e.detail
    res["construct"] = attempt(lambda: tt.Hook(comm, "int8:bogus=1", model=model()))
    res["register"] = attempt(lambda: tt.Hook(comm, {"4.weight": "topk:k=1000000"})
                              .register(DDP(model())))
    # Without the model the codec is made inside backward: it raises there,
    # on the rank whose spec is bad (rank 1 only); the other rank's backward
    # raises too, since the hook aborts the communicator.
    ddp = DDP(model())
    h = tt.Hook(comm, "topk:k=1000000" if rank == 1 else "topk:k=1000",
                start_iter=0)
    ddp.register_comm_hook(h, tt.hook)
    t0 = time.monotonic()
    try:
        x, y = batch(0)
        nn.functional.cross_entropy(ddp(x), y).backward()
        res["backward"] = "no error"
    except Exception as e:
        res["backward"] = type(e).__name__
        res["backward_msg"] = str(e)[:2000]
    res["seconds"] = time.monotonic() - t0
    res["error"] = getattr(h.error, "name", repr(h.error))
    done()
    comm.close()   # tells the other rank at once
    os._exit(0)    # DDP's reducer is mid-iteration: do not run its destructor

elif scenario == "kill":
    ddp = DDP(model())
    h = tt.Hook(comm, "int8:ef=1", start_iter=1).register(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for it in range(3):
        step(ddp, opt, *batch(it))
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        for it in range(3, 1000):
            step(ddp, opt, *batch(it))
        res["backward"] = "no error"
    except Exception as e:
        res["backward"] = type(e).__name__
        res["backward_msg"] = str(e)[:2000]
    res["seconds"] = time.monotonic() - t0
    res["error"] = getattr(h.error, "name", repr(h.error))
    t1 = time.monotonic()
    try:
        step(ddp, opt, *batch(0))
        res["again"] = "no error"
    except Exception as e:
        res["again"] = "%s: %s" % (type(e).__name__, str(e)[:500])
    res["again_seconds"] = time.monotonic() - t1
    done()
    os._exit(0)

elif scenario == "ckpt":
    spec = {"4.weight": "powersgd:rank=2,ef=1", "0.weight": "dense", "*": "topk:ratio=0.1,ef=1"}
    ddp = DDP(model(), bucket_cap_mb=0.02)
    h = tt.Hook(comm, spec, start_iter=1).register(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    for it in range(4):
        step(ddp, opt, *batch(it))
    saved = (copy.deepcopy(ddp.module.state_dict()), copy.deepcopy(opt.state_dict()),
             copy.deepcopy(h.state_dict()))
    for it in range(4, 8):
        step(ddp, opt, *batch(it))
    res["a"] = digest(ddp)
    res["states"] = sorted(saved[2]["codecs"])
    # A fresh model, optimizer and hook from the checkpoint.
    m2 = model(seed=99)
    m2.load_state_dict(saved[0])
    ddp2 = DDP(m2, bucket_cap_mb=0.02)
    h2 = tt.Hook(comm, spec, start_iter=1).register(ddp2)
    h2.load_state_dict(saved[2])
    opt2 = torch.optim.SGD(ddp2.parameters(), lr=0.05, momentum=0.9)
    opt2.load_state_dict(saved[1])
    for it in range(4, 8):
        step(ddp2, opt2, *batch(it))
    res["b"] = digest(ddp2)
    # Without the hook's state (residuals lost) the run differs.
    m3 = model(seed=99)
    m3.load_state_dict(saved[0])
    ddp3 = DDP(m3, bucket_cap_mb=0.02)
    h3 = tt.Hook(comm, spec, start_iter=1).register(ddp3)
    h3.iteration = saved[2]["iteration"]
    opt3 = torch.optim.SGD(ddp3.parameters(), lr=0.05, momentum=0.9)
    opt3.load_state_dict(saved[1])
    for it in range(4, 8):
        step(ddp3, opt3, *batch(it))
    res["c"] = digest(ddp3)
    for hh in (h, h2, h3):
        hh.close()
    done()
else:
    sys.exit("unknown scenario " + scenario)
comm.close()
