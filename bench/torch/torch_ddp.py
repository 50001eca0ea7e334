#!/usr/bin/env python3
"""terse's DDP comm hook against PyTorch's own hooks, in one run.

The same CNN, data and settings, trained by PyTorch DistributedDataParallel
with 2 worker processes, once per configuration:

  gloo           DDP's default: gloo allreduce of the fp32 buckets
  torch-fp16     PyTorch's fp16_compress_hook
  torch-psgd4    PyTorch's powerSGD_hook, rank 4, error feedback, warm start
  terse-dense    terse.torch.Hook, dense (terse's ring allreduce)
  terse-psgd4    terse.torch.Hook, powersgd:rank=4,ef=1
  terse-topk1    terse.torch.Hook, topk:ratio=0.01,ef=1
  terse-int8     terse.torch.Hook, int8:ef=1

Model: conv 5x5 1->32, ReLU, max-pool 2; conv 5x5 32->64, ReLU, max-pool 2;
fully connected 3136->1024, ReLU; 1024->10 (3.27 M parameters, 13 MB of
fp32 gradients per step). Fashion-MNIST (pixels / 255), each worker its own
half of the training set, B examples per worker per step, SGD with
momentum, one torch thread per worker. Both PowerSGDs start after 2 dense
iterations (the smallest PyTorch accepts) and see conv kernels as
out-channels x in-channels*k*k matrices; terse sends biases dense, as
PyTorch's hook does. PyTorch's PowerSGD runs with one DDP bucket: with
more, its hook's chained allreduces can reach gloo in different orders on
the two ranks, which aborts the job (--torch-psgd-buckets to see it).

Per configuration it prints the median step time and its split: compute
(the same steps without DDP, measured in the same worker before training),
the time spent inside the hook's calls, and the rest (communication that
backward did not hide); bytes per worker per step (terse: what its stats
count as sent; PyTorch: the gradient bytes its hook hands to allreduce,
which for 2 workers and a ring is also what each sends); test accuracy on
the 10,000 test images after --steps; and the training seconds until the
test accuracy (checked every --eval-every steps, the clock stopped) first
reaches the gloo run's final accuracy: gloo runs first, and a run that has
not reached it after --steps trains on, up to --max-steps. Step times and
accuracy are those of the first --steps; bytes per step are averaged over
every step run.

Runs on loopback; for a 1 Gbit/s link run it inside bench/core/slow-net.sh:
  sudo bench/core/slow-net.sh 1gbit /usr/bin/python3 bench/torch/torch_ddp.py
terse uses its tcp provider (the ranks share a host, where terse would
otherwise pick shm, which no shaped link slows down).
Needs Debian's python3-torch (/usr/bin/python3) and libterse (./terse.sh build).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "python"))

CONFIGS = {
    "gloo": None,
    "torch-fp16": None,
    "torch-psgd4": None,
    "terse-dense": "dense",
    "terse-psgd4": "powersgd:rank=4,ef=1",
    "terse-topk1": "topk:ratio=0.01,ef=1",
    "terse-int8": "int8:ef=1",
}


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="torch_ddp.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0] + "\n\n" + "\n\n".join(__doc__.split("\n\n")[1:3]))
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help="comma-separated subset of: " + ", ".join(CONFIGS))
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--batch", type=int, default=64, help="examples per worker per step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--eval-every", type=int, default=30, help="steps between accuracy checks")
    p.add_argument("--max-steps", type=int, default=0,
                   help="a run that has not reached the target after --steps trains on, "
                   "up to this many steps (default 2 x --steps), for the time to target")
    p.add_argument("--target", type=float, default=None,
                   help="test accuracy %% for the time to target (default: the gloo run's "
                   "final accuracy; gloo runs first)")
    p.add_argument("--compute-steps", type=int, default=30,
                   help="steps timed without DDP for the compute column")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--provider", default="tcp", help="terse provider (default tcp)")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--test-limit", type=int, default=0,
                   help="evaluate on the first N test images only (default: all 10,000)")
    p.add_argument("--json", help="write every result here")
    p.add_argument("--plot", help="draw test accuracy against training seconds into this PNG "
                   "(needs gnuplot)")
    p.add_argument("--torch-psgd-buckets", action="store_true",
                   help="give PyTorch's PowerSGD hook DDP's default buckets (it can "
                   "crash gloo: see the source)")
    p.add_argument("--label", default="", help="a name for the network, printed in the header")
    p.add_argument("--worker", nargs=2, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.config_list = [c for c in a.configs.split(",") if c]
    for c in a.config_list:
        if c not in CONFIGS:
            p.error("unknown configuration %r (known: %s)" % (c, ", ".join(CONFIGS)))
    if a.steps < 3 or a.batch < 1 or a.eval_every < 1:
        p.error("--steps must be >= 3, --batch and --eval-every >= 1")
    if a.test_limit < 0:
        p.error("--test-limit must be >= 0 (0: every test image)")
    if a.max_steps == 0:
        a.max_steps = 2 * a.steps
    if a.max_steps < a.steps:
        p.error("--max-steps must be >= --steps")
    if "gloo" in a.config_list:  # its final accuracy is the others' target
        a.config_list.remove("gloo")
        a.config_list.insert(0, "gloo")
    return a


# ---------------------------------------------------------------- worker

def make_model(torch):
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 1024), nn.ReLU(), nn.Linear(1024, 10))


def accuracy(torch, model, x, y):
    with torch.no_grad():
        correct = 0
        for i in range(0, len(x), 1000):
            correct += int((model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum())
    return correct


def worker(a, config, out):
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
    import torch_ddp_baseline as base

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    xtr, ytr = base.load_split(a.data, "train")
    xte, yte = base.load_split(a.data, "t10k")
    if a.test_limit:
        xte, yte = xte[:a.test_limit], yte[:a.test_limit]
    shard = len(xtr) // world
    xtr = torch.from_numpy(xtr[rank * shard:(rank + 1) * shard].astype(np.float32) / 255.0)
    ytr = torch.from_numpy(ytr[rank * shard:(rank + 1) * shard].astype(np.int64))
    xtr = xtr.reshape(-1, 1, 28, 28)
    xte = torch.from_numpy(xte.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)
    yte = torch.from_numpy(yte.astype(np.int64))
    g = torch.Generator().manual_seed(a.seed * 1000 + rank)
    order = torch.randperm(shard, generator=g)

    def batch(step):
        i = (step * a.batch) % (shard - a.batch)
        idx = order[i:i + a.batch]
        return xtr[idx], ytr[idx]

    lossf = torch.nn.functional.cross_entropy

    def train_step(m, o, x, y):
        """One step; returns (loss, seconds)."""
        t0 = time.perf_counter()
        loss = lossf(m(x), y)
        o.zero_grad()
        loss.backward()
        o.step()
        return loss, time.perf_counter() - t0
    torch.manual_seed(a.seed)
    model = make_model(torch)
    params = sum(p.numel() for p in model.parameters())

    # Compute alone: the same steps on a copy, no DDP.
    import copy
    local = copy.deepcopy(model)
    lopt = torch.optim.SGD(local.parameters(), lr=a.lr, momentum=a.momentum)
    ct = []
    for s in range(a.compute_steps):
        ct.append(train_step(local, lopt, *batch(s))[1])
    del local, lopt

    if config == "torch-psgd4" and not a.torch_psgd_buckets:
        # One bucket: PyTorch's PowerSGD hook launches its Q allreduce from
        # the callback of its P allreduce, on gloo's thread, while the next
        # bucket's hook launches its P allreduce from backward's thread; the
        # two ranks can then issue them in different orders, and gloo
        # aborts the process ("enforce fail at pair.cc:510
        # op.preamble.length <= op.nbytes", seen here with DDP's default
        # buckets). With one bucket there is one chain per step.
        dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 30
        ddp = DDP(model, bucket_cap_mb=1024)
    else:
        ddp = DDP(model)
    hook_time = [0.0]
    counted = {"fp16": 0}
    comm = thook = state = None

    def timed(fn):
        def wrapped(st, bucket):
            t0 = time.perf_counter()
            f = fn(st, bucket)
            hook_time[0] += time.perf_counter() - t0
            return f
        wrapped.__name__ = fn.__name__
        return wrapped

    if config == "torch-fp16":
        def fp16(st, bucket):
            counted["fp16"] += bucket.buffer().numel()
            return default_hooks.fp16_compress_hook(st, bucket)
        ddp.register_comm_hook(None, timed(fp16))
    elif config == "torch-psgd4":
        state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=4,
                                 start_powerSGD_iter=base.smallest_powersgd_start(4),
                                 use_error_feedback=True, warm_start=True,
                                 random_seed=a.seed)
        dense = [0]

        def psgd(st, bucket):
            if st.iter < st.start_powerSGD_iter:
                dense[0] += bucket.buffer().numel()
            return ps.powerSGD_hook(st, bucket)
        ddp.register_comm_hook(state, timed(psgd))
    elif config.startswith("terse"):
        import terse.torch as tt
        comm = tt.comm_from_process_group(provider=a.provider)
        thook = tt.Hook(comm, CONFIGS[config], start_iter=2, model=ddp)
        ddp.register_comm_hook(thook, timed(tt.hook))
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=a.momentum)

    n_eval = len(xte)
    lo, hi = rank * n_eval // world, (rank + 1) * n_eval // world
    curve, times, train_s = [], [], 0.0
    final = reached = None
    for s in range(a.max_steps):
        if s >= a.steps and (a.target is None or reached is not None):
            break
        loss, dt = train_step(ddp, opt, *batch(s))
        if s < a.steps:
            times.append(dt)
        train_s += dt
        if s + 1 == a.steps:
            train_at_steps = train_s
        if (s + 1) % a.eval_every == 0 or s + 1 == a.steps:
            c = torch.tensor([accuracy(torch, model, xte[lo:hi], yte[lo:hi])])
            dist.all_reduce(c)  # the same decision on every rank
            acc = 100.0 * int(c) / n_eval
            curve.append((s + 1, train_s, acc))
            if s + 1 == a.steps:
                final = acc
            if a.target is not None and reached is None and acc >= a.target:
                reached = train_s
        if rank == 0 and (s + 1) % 50 == 0:
            print("  %s: step %d/%d, %.1f s, loss %.3f" % (config, s + 1, a.steps, train_s,
                                                        loss.item()), file=sys.stderr, flush=True)
    hook_total = hook_time[0]
    steps_run = curve[-1][0]

    if config == "gloo":
        sent = 4 * params * steps_run
    elif config == "torch-fp16":
        sent = 2 * counted["fp16"]
    elif config == "torch-psgd4":
        sent = 4 * (dense[0] + state.total_numel_after_compression)
    else:
        st = comm.stats()
        sent = st["payload_bytes_sent"]
    # The slowest worker's clock is the job's.
    t = torch.tensor([train_at_steps])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    res = {"config": config, "params": params, "steps": a.steps, "steps_run": steps_run,
           "time_to_target": reached,
           "step_ms": 1e3 * statistics.median(times[3:]),
           "compute_ms": 1e3 * statistics.median(ct[2:] if len(ct) > 4 else ct),
           "hook_ms": 1e3 * hook_total / steps_run,
           "bytes_per_step": sent / steps_run, "final_acc": final, "curve": curve,
           "train_s": float(t), "provider": comm.provider if comm else "gloo"}
    if rank == 0:
        with open(out, "w") as f:
            json.dump(res, f)
    if thook is not None:
        thook.close()
        comm.close()
    dist.destroy_process_group()


# ---------------------------------------------------------------- driver

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_config(a, config, argv, target):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "res.json")
        port = free_port()
        procs = []
        for r in range(2):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), OMP_NUM_THREADS=str(a.threads),
                       OPENBLAS_NUM_THREADS="1",
                       PYTHONPATH=os.path.join(REPO, "python") + os.pathsep +
                       os.environ.get("PYTHONPATH", ""))
            extra = [] if target is None else ["--target", repr(target)]
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv +
                                          extra + ["--worker", config, out], env=env))
        rcs = [p.wait() for p in procs]
        if any(rcs) or not os.path.exists(out):
            raise SystemExit("torch_ddp: configuration %s failed (exit codes %s)" % (config, rcs))
        with open(out) as f:
            return json.load(f)


def time_to(curve, target):
    for step, secs, acc in curve:
        if acc >= target:
            return secs
    return None


def plot(a, results, target, cpu):
    import shutil
    if not shutil.which("gnuplot"):
        print("# --plot: gnuplot not found (Debian: gnuplot-nox); no plot", file=sys.stderr)
        return
    with tempfile.NamedTemporaryFile("w", suffix=".dat", delete=False) as f:
        for r in results:
            f.write('"%s"\n' % r["config"])
            f.write("0 10\n")
            for step, secs, acc in r["curve"]:
                f.write("%.3f %.2f\n" % (secs, acc))
            f.write("\n\n")
        data = f.name
    script = """set terminal pngcairo size 900,560 noenhanced
set output "%s"
set title "CNN on Fashion-MNIST, 2 workers, DDP: %s (%s); dashed: PyTorch"
set xlabel "training seconds (evaluation excluded)"
set ylabel "test accuracy (%%)"
set yrange [70:90]
set key bottom right
set grid
plot %s%s
""" % (a.plot, a.label or "loopback", cpu,
       ", ".join('"%s" index %d using 1:2 with lines lw 2 dt %d title columnheader(1)'
                 % (data, i, 1 if r["config"].startswith("terse") else 2)
                 for i, r in enumerate(results)),
       (', %g with lines dt 3 lc "black" title "gloo final"' % target) if target else "")
    subprocess.run(["gnuplot"], input=script, text=True, check=True)
    os.unlink(data)
    print("# plot: %s" % a.plot)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main(argv):
    a = parse_args(argv)
    if a.worker:
        return worker(a, *a.worker)
    import torch
    print("# torch_ddp: CNN 3.27M params, 2 workers x %d threads, batch %d/worker, %d steps, "
          "lr %g momentum %g, seed %d; %s, %d cpus; torch %s; network: %s"
          % (a.threads, a.batch, a.steps, a.lr, a.momentum, a.seed, cpu_name(),
             os.cpu_count(), torch.__version__, a.label or "loopback"), flush=True)
    results = []
    target = a.target
    for c in a.config_list:
        t0 = time.monotonic()
        r = run_config(a, c, argv, target)
        if c == "gloo" and target is None:
            target = r["final_acc"]
            r["time_to_target"] = time_to(r["curve"], target)
        r["wall_s"] = time.monotonic() - t0
        results.append(r)
        print("# %s done in %.0f s" % (c, r["wall_s"]), file=sys.stderr, flush=True)
    by = {r["config"]: r for r in results}
    print("| config | step ms | compute ms | in hook ms | rest ms | MB/worker/step | "
          "test acc %% | s to %s |" % ("%.2f%%" % target if target else "target"))
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        tt = r["time_to_target"]
        rest = r["step_ms"] - r["compute_ms"] - r["hook_ms"]
        print("| %s | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f | %s |"
              % (r["config"], r["step_ms"], r["compute_ms"], r["hook_ms"], rest,
                 r["bytes_per_step"] / 1e6, r["final_acc"],
                 "%.1f" % tt if tt is not None else
                 ("not in %d steps" % r["steps_run"] if target else "-")))
    # The goals, computed from this run.
    lines = []
    if "gloo" in by and "terse-dense" in by:
        q = by["terse-dense"]["step_ms"] / by["gloo"]["step_ms"]
        lines.append("terse dense / gloo step time: %.2fx (goal <= 1.0)" % q)
    if "torch-psgd4" in by and "terse-psgd4" in by:
        q = by["torch-psgd4"]["step_ms"] / by["terse-psgd4"]["step_ms"]
        d = by["terse-psgd4"]["final_acc"] - by["torch-psgd4"]["final_acc"]
        lines.append("PyTorch PowerSGD / terse PowerSGD step time: %.2fx (goal >= 2), accuracy "
                     "terse - PyTorch %+.2f points (goal within 0.5)" % (q, d))
    tb = [(r["time_to_target"], r["config"]) for r in results
          if r["config"].startswith("terse") and r.get("time_to_target") is not None]
    pb = [(r["time_to_target"], r["config"]) for r in results
          if not r["config"].startswith("terse") and r.get("time_to_target") is not None]
    if tb and pb:
        lines.append("time to %.2f%%: terse's best (%s) %.1f s / PyTorch's best (%s) %.1f s = "
                     "%.2fx (goal <= 0.5 on 1 Gbit/s)" % (target, min(tb)[1], min(tb)[0],
                                                         min(pb)[1], min(pb)[0],
                                                         min(tb)[0] / min(pb)[0]))
    for line in lines:
        print("# " + line)
    print("# command: %s" % " ".join([os.path.basename(sys.argv[0])] + argv))
    if a.plot:
        plot(a, results, target, cpu_name())
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "cpu": cpu_name(), "label": a.label,
                       "results": results, "goals": lines}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
