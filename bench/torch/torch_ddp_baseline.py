#!/usr/bin/env python3
"""PyTorch DDP baseline for `terse-bench train`.

The same data-parallel training as `terse-bench train --model mlp`: an MLP
784-256-10 (ReLU, nn.Linear's default initialisation) on Fashion-MNIST
(pixels / 255, nothing else), N worker processes, B examples per worker per
step, SGD with momentum, mean cross-entropy, gradients averaged across the
workers every step -- but trained by PyTorch's DistributedDataParallel over
gloo, so that terse and PyTorch can be measured in the same run, on the same
machine and the same (possibly shaped) network.

The workers are started here with torch.multiprocessing (spawn) and meet at
tcp://127.0.0.1:PORT on a free port: loopback only, so the script runs
unchanged inside bench/core/slow-net.sh's namespace, where loopback is the only
interface.

Timing is the training wall time of each worker, evaluation excluded (the
clock stops around it), summed over epochs; a line reports the maximum over
the workers, as terse-bench does.

Only torch, numpy and the standard library. Debian's python3-torch installs
torch for /usr/bin/python3; another python3 found first on PATH may not see it.
"""

import argparse
import datetime
import gc
import gzip
import importlib
import os
import socket
import sys
import time

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
PROG = "torch_ddp_baseline"

# IDX magic numbers: two zero bytes, the element type (0x08 = unsigned byte)
# and the number of dimensions.
IDX_IMAGES_MAGIC = 0x00000803
IDX_LABELS_MAGIC = 0x00000801
IMAGE_SIDE = 28
CLASSES = 10
HIDDEN = 256


class UsageError(Exception):
    """A bad option or bad input data: reported in one sentence, exit 2 or 1."""


# ---------------------------------------------------------------- options


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="torch_ddp_baseline.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Train the MLP 784-256-10 on Fashion-MNIST with PyTorch DDP over gloo,\n"
            "as `terse-bench train --model mlp` does with terse, and print test\n"
            "accuracy, training loss and training time per evaluation."
        ),
        epilog=(
            "hooks:\n"
            "  none      DDP's built-in fp32 allreduce (no comm hook registered)\n"
            "  fp16      default_hooks.fp16_compress_hook: the bucket travels as fp16\n"
            "  powersgd  powerSGD_hook with matrix_approximation_rank=--rank, error\n"
            "            feedback and warm start; PyTorch allreduces the first\n"
            "            start_powerSGD_iter steps uncompressed (2, the smallest it\n"
            "            accepts with error feedback or warm start; the output says\n"
            "            how many ran so), and keeps tensors dense whose rank-R form\n"
            "            would not be at least 2x smaller (here the biases b1, b2)\n"
            "\n"
            "columns: acc% is test accuracy on the 10,000 test images; train-loss\n"
            "is the mean training loss since the previous line (over all workers);\n"
            "payload is the gradient bytes each worker handed to allreduce (what\n"
            "the hook sends, not TCP wire bytes); ratio is dense fp32 bytes over\n"
            "payload; time is training wall seconds, evaluation excluded, the\n"
            "maximum over workers.\n"
            "\n"
            "example, on a 1 Gbit/s shaped loopback:\n"
            "  bench/core/slow-net.sh 1gbit /usr/bin/python3 bench/torch/torch_ddp_baseline.py \\\n"
            "      --hook powersgd --rank 4\n"
            "\n"
            "exit status: 0 ok, 1 bad data or a failed worker, 2 usage error."
        ),
    )
    p.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    p.add_argument("--epochs", type=int, default=2, help="passes over each worker's shard (2)")
    p.add_argument("--batch", type=int, default=64, help="examples per worker per step (64)")
    p.add_argument("--lr", type=float, default=0.1, help="learning rate (0.1)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (0.9)")
    p.add_argument("--seed", type=int, default=1,
                   help="initialisation, shuffling and PowerSGD's random projections (1)")
    p.add_argument("--hook", choices=("none", "fp16", "powersgd"), default="none",
                   help="DDP communication hook (none)")
    p.add_argument("--rank", type=int, default=4,
                   help="PowerSGD matrix_approximation_rank (4)")
    p.add_argument("--data", default=DEFAULT_DATA,
                   help="directory of the Fashion-MNIST *-idx?-ubyte.gz files (%s)" % DEFAULT_DATA)
    p.add_argument("--eval-every", type=int, default=0, metavar="K",
                   help="also evaluate every K steps (0: only at the end of each epoch)")
    p.add_argument("--target-acc", type=float, default=0.0, metavar="P",
                   help="report the training time until test accuracy first reaches P%%")
    p.add_argument("--csv", action="store_true",
                   help="print CSV (a header and one line per evaluation) on stdout; "
                        "the setup and summary go to stderr as # lines")
    a = p.parse_args(argv)
    checks = [
        (a.workers >= 1, "--workers must be at least 1, not %d" % a.workers),
        (a.epochs >= 1, "--epochs must be at least 1, not %d" % a.epochs),
        (a.batch >= 1, "--batch must be at least 1, not %d" % a.batch),
        (a.lr > 0 and a.lr < float("inf"), "--lr must be a positive number, not %g" % a.lr),
        (0 <= a.momentum < 1, "--momentum must be in [0, 1), not %g" % a.momentum),
        (a.seed >= 0, "--seed must not be negative, not %d" % a.seed),
        (a.rank >= 1, "--rank must be at least 1, not %d" % a.rank),
        (a.eval_every >= 0, "--eval-every must not be negative, not %d" % a.eval_every),
        (0 <= a.target_acc <= 100, "--target-acc must be a percentage in [0, 100] (0: off), not %g"
         % a.target_acc),
    ]
    for ok, message in checks:
        if not ok:
            p.error(message)
    if a.rank != 4 and a.hook != "powersgd":
        p.error("--rank is PowerSGD's rank: it needs --hook powersgd")
    return a


# ---------------------------------------------------------------- data


def read_idx(path, magic, dims):
    """The array in IDX file PATH (gzip or plain), checking its magic number,
    its trailing dimensions DIMS and that its length matches its header."""
    import numpy as np

    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise UsageError("%s: cannot read it: %s (Debian ships the data set in "
                         "dataset-fashion-mnist; or pass --data DIR)" % (path, e.strerror))
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise UsageError("%s: not a valid gzip file: %s" % (path, e))
    ndims = 1 + len(dims)
    head = 4 + 4 * ndims
    if len(raw) < head:
        raise UsageError("%s: %d bytes, shorter than the %d-byte IDX header"
                         % (path, len(raw), head))
    got = int.from_bytes(raw[0:4], "big")
    if got != magic:
        raise UsageError("%s: IDX magic is 0x%08x, expected 0x%08x (unsigned bytes, %d "
                         "dimensions)" % (path, got, magic, ndims))
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndims)]
    if shape[1:] != list(dims):
        raise UsageError("%s: IDX dimensions %s, expected N x %s"
                         % (path, "x".join(map(str, shape)), "x".join(map(str, dims))))
    count = 1
    for d in shape:
        count *= d
    if len(raw) != head + count:
        raise UsageError("%s: %d bytes of data, the header %s promises %d"
                         % (path, len(raw) - head, "x".join(map(str, shape)), count))
    if shape[0] == 0:
        raise UsageError("%s: holds no examples" % path)
    return np.frombuffer(raw, dtype=np.uint8, offset=head).reshape(shape)


def load_split(data_dir, prefix):
    """Images (N x 784, uint8) and labels (N, uint8) of one split, checked."""
    images = read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte.gz"),
                      IDX_IMAGES_MAGIC, (IMAGE_SIDE, IMAGE_SIDE))
    labels_path = os.path.join(data_dir, prefix + "-labels-idx1-ubyte.gz")
    labels = read_idx(labels_path, IDX_LABELS_MAGIC, ())
    if images.shape[0] != labels.shape[0]:
        raise UsageError("%s: %d labels for %d images" % (labels_path, labels.shape[0],
                                                          images.shape[0]))
    if int(labels.max()) >= CLASSES:
        raise UsageError("%s: a label is %d, outside 0..%d" % (labels_path, int(labels.max()),
                                                              CLASSES - 1))
    return images.reshape(images.shape[0], -1), labels


# ---------------------------------------------------------------- hooks


def smallest_powersgd_start(rank):
    """The smallest start_powerSGD_iter this PyTorch accepts with error
    feedback and warm start (2 in 1.13: DDP rebuilds its buckets after the
    first step, so the hook's per-bucket state can only begin after it)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    for start in range(0, 100):
        try:
            ps.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                             start_powerSGD_iter=start, use_error_feedback=True,
                             warm_start=True)
            return start
        except ValueError:
            continue
    raise RuntimeError("PowerSGDState accepted no start_powerSGD_iter below 100")


class Traffic:
    """What the workers hand to allreduce: counted in the hook where there
    is one, else from the bucket size (DDP's own allreduce of all gradients)."""

    def __init__(self):
        self.elements = 0        # fp32 elements allreduced outside PowerSGD's compression
        self.dense_steps = 0     # steps whose gradients went uncompressed
        self.fp16_elements = 0   # elements sent as fp16


def install_hook(ddp, args, traffic):
    """Registers --hook on DDP; returns the PowerSGD state (or None)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    if args.hook == "none":
        return None
    if args.hook == "fp16":
        def fp16(state, bucket):
            traffic.fp16_elements += bucket.buffer().numel()
            return default_hooks.fp16_compress_hook(state, bucket)
        ddp.register_comm_hook(state=None, hook=fp16)
        return None
    state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=args.rank,
                             start_powerSGD_iter=smallest_powersgd_start(args.rank),
                             use_error_feedback=True, warm_start=True,
                             random_seed=args.seed)

    def powersgd(st, bucket):
        # The hook allreduces the whole bucket in fp32 while iter < start;
        # after that its own statistics count the P, Q and dense elements.
        if st.iter < st.start_powerSGD_iter:
            traffic.elements += bucket.buffer().numel()
            if bucket.is_last():
                traffic.dense_steps += 1
        return ps.powerSGD_hook(st, bucket)

    ddp.register_comm_hook(state=state, hook=powersgd)
    return state


def payload_bytes(args, traffic, state, params, steps):
    """Gradient bytes each worker handed to allreduce so far."""
    if args.hook == "none":
        return 4 * params * steps
    if args.hook == "fp16":
        return 2 * traffic.fp16_elements
    return 4 * (traffic.elements + state.total_numel_after_compression)


# ---------------------------------------------------------------- worker


def make_model():
    import torch.nn as nn

    return nn.Sequential(nn.Linear(IMAGE_SIDE * IMAGE_SIDE, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, CLASSES))


def evaluate(model, x, y, lo, hi):
    """Correct predictions and summed loss on test examples [lo, hi)."""
    import torch
    import torch.nn.functional as F

    model.eval()
    with torch.no_grad():
        out = model(x[lo:hi])
        loss = F.cross_entropy(out, y[lo:hi], reduction="sum").item()
        correct = int((out.argmax(dim=1) == y[lo:hi]).sum().item())
    model.train()
    return correct, loss


def out(line, csv_mode, to_stderr=False):
    """Prints LINE on stdout, or on stderr for # lines in CSV mode."""
    stream = sys.stderr if (to_stderr or (csv_mode and line.startswith("#"))) else sys.stdout
    print(line, file=stream, flush=True)


def worker(rank, args, port, train, test):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    # One thread per worker: N workers share the cores without
    # oversubscribing them, and single-threaded kernels are deterministic.
    torch.set_num_threads(1)
    world = args.workers
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=300))

    x_train = torch.from_numpy(train[0]).float().div_(255.0)
    y_train = torch.from_numpy(train[1]).long()
    x_test = torch.from_numpy(test[0]).float().div_(255.0)
    y_test = torch.from_numpy(test[1]).long()

    torch.manual_seed(args.seed)
    model = make_model()
    params = sum(p.numel() for p in model.parameters())
    ddp = DDP(model)
    traffic = Traffic()
    state = install_hook(ddp, args, traffic)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
    sampler = DistributedSampler(TensorDataset(x_train, y_train), num_replicas=world,
                                 rank=rank, shuffle=True, seed=args.seed, drop_last=True)
    steps_per_epoch = len(sampler) // args.batch
    if steps_per_epoch == 0:
        raise UsageError("each worker's shard holds %d examples, fewer than one batch of %d"
                         % (len(sampler), args.batch))
    steps_total = steps_per_epoch * args.epochs
    n_test = x_test.shape[0]
    test_lo, test_hi = n_test * rank // world, n_test * (rank + 1) // world

    if rank == 0:
        header(args, world, len(sampler), steps_per_epoch, n_test, model, state, torch)

    # The buffers of the evaluation's collectives live until the process
    # group is gone: see the teardown at the end.
    sums = torch.zeros(4, dtype=torch.float64)
    t = torch.zeros(1, dtype=torch.float64)
    wall = 0.0
    step = 0
    loss_sum, loss_count = 0.0, 0
    t_target = None
    final_acc = None

    def report(epoch, final):
        nonlocal loss_sum, loss_count, t_target, final_acc
        correct, test_loss = evaluate(model, x_test, y_test, test_lo, test_hi)
        sums.copy_(torch.tensor([correct, test_loss, loss_sum, loss_count]))
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        t.fill_(wall)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        loss_sum, loss_count = 0.0, 0
        acc = 100.0 * sums[0].item() / n_test
        if args.target_acc > 0 and t_target is None and acc >= args.target_acc:
            t_target = t.item()
        if final:
            final_acc = acc
        if rank == 0:
            sent = payload_bytes(args, traffic, state, params, step)
            dense = 4 * params * step
            row = dict(epoch=epoch, step=step, steps_total=steps_total, final=int(final),
                       acc=acc, test_loss=sums[1].item() / n_test,
                       train_loss=sums[2].item() / max(sums[3].item(), 1.0), sent=sent,
                       dense=dense, ratio=dense / sent if sent else 0.0, wall=t.item())
            print_row(args, row)
        return t.item()

    for epoch in range(1, args.epochs + 1):
        # DistributedSampler shuffles with seed + epoch: the same permutation
        # on every worker, each taking every world-th index of it.
        sampler.set_epoch(epoch)
        order = torch.tensor(list(iter(sampler)), dtype=torch.long)
        for k in range(steps_per_epoch):
            t0 = time.perf_counter()
            idx = order[k * args.batch:(k + 1) * args.batch]
            xb, yb = x_train[idx], y_train[idx]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(xb), yb)
            # On CPU, backward returns once DDP's allreduce (or the hook's
            # future) has finished, so the clock covers the exchange.
            loss.backward()
            opt.step()
            wall += time.perf_counter() - t0
            loss_sum += loss.item()
            loss_count += 1
            step += 1
            if args.eval_every and step % args.eval_every == 0 and k + 1 < steps_per_epoch:
                report(epoch, False)
        total = report(epoch, epoch == args.epochs)

    if rank == 0:
        summary(args, final_acc, total, t_target, traffic, state)
    dist.barrier()
    # Teardown order matters in torch 1.13: ~ProcessGroupGloo joins gloo's
    # worker threads while this thread holds the GIL, and a worker thread
    # that drops the last reference to a tensor Python has seen needs the
    # GIL to free it -- a deadlock at exit (seen here in about one run in
    # three). So the process group goes first, dropped by DDP (its reducer
    # holds it) and by the registry, while Python still holds every tensor
    # a collective touched (sums, t, the model's parameters); they are freed
    # afterwards, on this thread, when this function returns.
    opt = ddp = state = None
    gc.collect()
    dist.destroy_process_group()


# ---------------------------------------------------------------- output


def header(args, world, shard, steps_per_epoch, n_test, model, state, torch):
    csv = args.csv
    out("# torch_ddp_baseline: mlp 784-%d-%d, %d workers, DDP over gloo (tcp 127.0.0.1), "
        "batch %d per worker, lr %g, momentum %g, %d epoch%s, seed %d, hook %s"
        % (HIDDEN, CLASSES, world, args.batch, args.lr, args.momentum, args.epochs,
           "" if args.epochs == 1 else "s", args.seed, args.hook), csv)
    out("# torch %s, %d thread per worker, %d training examples per worker, %d steps per "
        "epoch, %d test examples" % (torch.__version__, torch.get_num_threads(), shard,
                                     steps_per_epoch, n_test), csv)
    if state is not None:
        kept = []
        packed = []
        for name, p in model.named_parameters():
            m = p.view(p.shape[0], -1)
            r = min(m.shape[0], m.shape[1], state.matrix_approximation_rank)
            small = (m.shape[0] + m.shape[1]) * r * state.min_compression_rate
            dims = "x".join(map(str, p.shape))
            (packed if small < m.numel() else kept).append("%s %s" % (name, dims))
        out("# powersgd: rank %d, error feedback, warm start, start_powerSGD_iter %d (the "
            "smallest this PyTorch accepts): the first %d steps allreduce fp32 uncompressed"
            % (state.matrix_approximation_rank, state.start_powerSGD_iter,
               state.start_powerSGD_iter), csv)
        out("# powersgd compresses %s; keeps dense %s (min_compression_rate %g)"
            % (", ".join(packed) or "nothing", ", ".join(kept) or "nothing",
               state.min_compression_rate), csv)
    if csv:
        print("seed,epoch,step,steps_total,final,test_acc,test_loss,train_loss,"
              "payload_bytes,dense_bytes,ratio,wall_s,hook,rank", flush=True)
    else:
        print("%5s %7s %7s %9s %10s %12s %8s %8s" % ("epoch", "step", "acc%", "test-loss",
                                                    "train-loss", "payload", "ratio", "time"),
              flush=True)


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return ("%.0f %s" if unit == "B" else "%.1f %s") % (n, unit)
        n /= 1024.0
    return "%.1f GiB" % n


def print_row(args, r):
    if args.csv:
        print("%d,%d,%d,%d,%d,%.4f,%.6f,%.6f,%d,%d,%.4f,%.4f,%s,%d"
              % (args.seed, r["epoch"], r["step"], r["steps_total"], r["final"], r["acc"],
                 r["test_loss"], r["train_loss"], r["sent"], r["dense"], r["ratio"], r["wall"],
                 args.hook, args.rank if args.hook == "powersgd" else 0), flush=True)
    else:
        print("%5d %7d %7.2f %9.4f %10.4f %12s %8.1f %8.2f"
              % (r["epoch"], r["step"], r["acc"], r["test_loss"], r["train_loss"],
                 human_bytes(r["sent"]), r["ratio"], r["wall"]), flush=True)


def summary(args, final_acc, total, t_target, traffic, state):
    csv = args.csv
    if state is not None:
        out("# powersgd: %d step%s ran uncompressed (fp32 allreduce) before compression began"
            % (traffic.dense_steps, "" if traffic.dense_steps == 1 else "s"), csv)
    out("# final: %.2f%% test accuracy after %.2f s of training (evaluation excluded, "
        "maximum over workers)" % (final_acc, total), csv)
    if args.target_acc > 0:
        if t_target is not None:
            out("# reached %.2f%% test accuracy after %.2f s of training"
                % (args.target_acc, t_target), csv)
        else:
            out("# did not reach %.2f%% test accuracy" % args.target_acc, csv)


# ---------------------------------------------------------------- main


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago (rank 0 binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv):
    args = parse_args(argv)
    try:
        importlib.import_module("numpy")
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
    except ImportError as e:
        print("%s: %s under %s: Debian's python3-torch and python3-numpy install for "
              "/usr/bin/python3 (apt-get install python3-torch python3-numpy)"
              % (PROG, e, sys.executable), file=sys.stderr)
        return 1
    if not dist.is_available() or not dist.is_gloo_available():
        print("%s: this torch (%s) was built without torch.distributed's gloo backend"
              % (PROG, torch.__version__), file=sys.stderr)
        return 1
    try:
        train = load_split(args.data, "train")
        test = load_split(args.data, "t10k")
    except UsageError as e:
        print("%s: %s" % (PROG, e), file=sys.stderr)
        return 1
    if train[0].shape[0] // args.workers < args.batch:
        print("%s: %d training examples over %d workers leave fewer than one batch of %d each"
              % (PROG, train[0].shape[0], args.workers, args.batch), file=sys.stderr)
        return 2
    # gloo picks its interface from the hostname unless told; inside a
    # namespace only loopback exists, so name it.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        mp.spawn(worker, args=(args, free_port(), train, test), nprocs=args.workers,
                 join=True)
    except mp.ProcessRaisedException as e:
        # The worker's traceback ends with the exception; show its last line.
        last = str(e).strip().splitlines()[-1] if str(e).strip() else "unknown error"
        print("%s: a worker failed: %s" % (PROG, last), file=sys.stderr)
        return 1
    except mp.ProcessExitedException as e:
        print("%s: a worker died: %s" % (PROG, e), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("%s: interrupted" % PROG, file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
