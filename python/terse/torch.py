"""terse for PyTorch: a DDP comm hook that sends compressed gradients.

Five lines added to a DDP script (after init_process_group and DDP(...)):

    import terse.torch
    comm = terse.torch.comm_from_process_group()
    hook = terse.torch.Hook(comm, "powersgd:rank=4,ef=1")
    hook.register(ddp_model)
    ...                               # train as before; at the end:
    hook.close(); comm.close()

DDP keeps its own process group (gloo) for what it does besides gradients
(broadcasting parameters at construction, buffers); terse carries the
gradient buckets.

What the hook does with a bucket (Hook.__call__, run by DDP on the thread
that called backward()):

  * Iterations before start_iter (default 2) all-reduce the whole bucket
    dense. DDP rebuilds its buckets after iteration 0, so this keeps codec
    state from being made for buckets that are about to change (as PyTorch's
    PowerSGD hook does with start_powerSGD_iter).
  * From then on, each parameter's gradient inside the bucket is a tensor of
    its own: a parameter with at most one dimension (biases, norms) or fewer
    than dense_below elements (default 1024) goes dense, like PyTorch's
    PowerSGD hook sends 1-D tensors uncompressed; every other one gets its
    own codec (its own error-feedback residual) from the spec: a string for
    every parameter, or a dict {fnmatch pattern of the parameter's name:
    spec} where the first matching pattern wins and a parameter no pattern
    matches goes dense ("dense", "none" or None also mean dense). A
    parameter of shape (d0, d1, ...) is a d0 x (d1 * ...) matrix to the
    codec, so PowerSGD sees a convolution kernel as out-channels x
    in-channels*k*k, as PyTorch's hook does. Neighbouring dense tensors are
    all-reduced as one range; the bucket's exchanges are started as one
    terse group (small dense ranges fused).
  * Every result is the average over the ranks (op "avg"), as DDP's own
    allreduce gives.
  * overlap=True (default): the hook starts terse requests and returns at
    once a Future that a completion thread fulfils when the bucket's
    requests complete, so backward of earlier layers runs while the bucket
    is on the wire (and terse's progress thread encodes it). overlap=False
    waits inside the hook. Both give bitwise the same results.

Failure: every Future the hook returns ends with set_result or
set_exception, so backward() never hangs, and the hook never raises (which
would leave DDP's reducer mid-iteration): a dead or stopped peer makes the
requests fail within the communicator's timeout (TERSE_TIMEOUT_MS, or
timeout_ms of comm_from_process_group) and backward() raises with terse's
sentence naming the peer. torch 1.13 re-raises a Future's exception as a
RuntimeError ("Unable to cast <terse's sentence> to Tensor"); Hook.error
keeps the terse.Error itself, status included. After a failure the
communicator is aborted (as in the C API, it can only be closed; the
other ranks' calls then fail too) and every later iteration fails the same
way at once. A spec that cannot hold for a parameter raises when the hook
is registered (register(), or model=), where every codec is made; without
the model, codecs are made on first use, keyed by the parameter's storage,
and the error surfaces from backward().

Checkpoints: state_dict() / load_state_dict() carry the iteration and every
codec's state (error-feedback residual, PowerSGD's warm-start Q, random
stream), keyed by parameter name.
"""

import fnmatch
import os
import queue
import secrets
import socket
import threading

import torch
import torch.distributed as dist

import terse

__all__ = ["comm_from_process_group", "Hook", "hook"]


def _free_port(host):
    infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind(sockaddr)
        return s.getsockname()[1]


def comm_from_process_group(group=None, provider=None, timeout_ms=None, host=None):
    """A terse.Comm over the ranks of an initialised torch process group.

    Rank 0 of the group picks a free port on host (default MASTER_ADDR, else
    127.0.0.1) and a fresh 256-bit token, and shares both over the group
    (torch.distributed.broadcast_object_list, so whoever can read the
    group's traffic can read the token: the job's trust domain is the torch
    group's); then every rank joins. provider: as TERSE_PROVIDER ("tcp",
    "shm", "auto"...; None reads the environment). Collective: every rank of
    the group calls it.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("terse.torch.comm_from_process_group: call "
                           "torch.distributed.init_process_group first")
    rank = dist.get_rank(group)
    size = dist.get_world_size(group)
    info = [None, None, None]
    if rank == 0:
        h = host or os.environ.get("MASTER_ADDR") or "127.0.0.1"
        try:
            info = ["%s:%d" % (h, _free_port(h)), secrets.token_hex(32), None]
        except OSError as e:
            # Every rank must leave the broadcast, not only this one.
            info = [None, None, "rank 0 found no free port on %r: %s" % (h, e)]
    src = 0 if group is None else dist.distributed_c10d._get_global_rank(group, 0)
    dist.broadcast_object_list(info, src=src, group=group)
    addr, token, err = info
    info[1] = None
    if err:
        raise RuntimeError("terse.torch.comm_from_process_group: " + err
                           + " (pass host= an address of rank 0's machine)")
    return terse.Comm(rank=rank, size=size, addr=addr, provider=provider, token=token,
                      timeout_ms=timeout_ms)


_DENSE = (None, "", "dense", "none")


def hook(state, bucket):
    """The function to give DDP: ddp.register_comm_hook(hook_obj, hook)."""
    return state(bucket)


class Hook:
    """A DDP comm hook over a terse.Comm (see the module's documentation).

    comm         a terse.Comm over the same ranks as the DDP group
    spec         a codec spec for every parameter, or {pattern: spec}
    start_iter   iterations run dense before the codecs start (>= 0)
    overlap      return before the exchange completes (default True)
    dense_below  parameters with fewer elements go dense (default 1024)
    model        the DDP model (or its module), to name parameters; else
                 given by register(). Without names, codecs are keyed by
                 bucket position, which state_dict() cannot carry across
                 processes reliably.
    """

    def __init__(self, comm, spec="none", start_iter=2, overlap=True, dense_below=1024,
                 model=None):
        if not isinstance(comm, terse.Comm):
            raise TypeError("comm must be a terse.Comm, not %s" % type(comm).__name__)
        if isinstance(spec, str) or spec is None:
            spec = {"*": spec}
        if not isinstance(spec, dict):
            raise TypeError("spec must be a str or a dict {pattern: spec}, not %s"
                            % type(spec).__name__)
        for pat, s in spec.items():
            if not isinstance(pat, str):
                raise TypeError("spec patterns must be str, not %s" % type(pat).__name__)
            if s not in _DENSE and not isinstance(s, str):
                raise TypeError("a spec must be a str or None, not %s" % type(s).__name__)
        if int(start_iter) < 0:
            raise ValueError("start_iter must be >= 0, not %d" % start_iter)
        self.comm = comm
        self.specs = dict(spec)
        self.start_iter = int(start_iter)
        self.overlap = bool(overlap)
        self.dense_below = int(dense_below)
        self.iteration = 0
        self._names = {}       # parameter data_ptr -> (name, index)
        self._named = False    # names came from the model
        self._codecs = {}      # key -> terse.Codec
        self._plans = {}       # (bucket index, numel, params) -> plan
        self._pending = {}     # key -> state bytes from load_state_dict
        self._failed = None
        self._queue = None
        self._thread = None
        self._lock = threading.Lock()
        if model is not None:
            self._name_parameters(model)

    # -- setup
    def _name_parameters(self, model):
        module = getattr(model, "module", model)
        named = list(module.named_parameters())
        self._names = {p.data_ptr(): (n, i) for i, (n, p) in enumerate(named)}
        self._named = True
        self._plans.clear()
        # Make every codec now, on every rank alike, so that a spec that
        # cannot hold for a parameter (a bad option, top-k of more elements
        # than it has) raises here and not inside backward.
        for i, (n, p) in enumerate(named):
            if p.requires_grad:
                self._codec_for(n, i, p)

    def _codec_for(self, name, index, p):
        """The codec of parameter p (made on first use), or None for dense."""
        s = self._spec_for(name)
        n = p.numel()
        if s is None or p.dim() < 2 or n < self.dense_below:
            return None
        rows = p.shape[0]
        codec = self._codecs.get(name)
        if codec is None or codec.rows != rows or codec.elements != n:
            try:
                codec = terse.Codec(s, rows, n // rows)
            except terse.Error as e:
                d = e.detail[len(e.name) + 2:] if e.detail.startswith(e.name + ": ") else e.detail
                raise terse.Error(e.status, "parameter %s (%s), spec %r: %s"
                                  % (name, "x".join(map(str, p.shape)), s, d),
                                  "terse.torch.Hook") from None
            codec.set_stream(index, self.comm.rank)
            pend = self._pending.pop(name, None)
            if pend is not None:
                self._load(name, codec, pend)
            self._codecs[name] = codec
        return codec

    def register(self, ddp):
        """Name the parameters from ddp and register the hook on it."""
        self._name_parameters(ddp)
        ddp.register_comm_hook(self, hook)
        return self

    def _spec_for(self, name):
        for pat, s in self.specs.items():
            if fnmatch.fnmatchcase(name, pat):
                return None if s in _DENSE else s
        return None

    def _plan(self, bucket, params):
        """[(offset, count, codec or None)], dense neighbours merged."""
        key = (bucket.index(), bucket.buffer().numel(), tuple(p.data_ptr() for p in params))
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        plan, off = [], 0
        for p in params:
            n = p.numel()
            ent = self._names.get(p.data_ptr())
            if ent is None:
                # Not named (no model given): keyed by the parameter's
                # storage, which DDP's bucket rebuild does not move.
                ent = ("param@%x" % p.data_ptr(), (1 << 32) + len(self._names))
                self._names[p.data_ptr()] = ent
            name, index = ent
            codec = self._codec_for(name, index, p)
            if codec is None and plan and plan[-1][2] is None and plan[-1][0] + plan[-1][1] == off:
                plan[-1] = (plan[-1][0], plan[-1][1] + n, None)
            else:
                plan.append((off, n, codec))
            off += n
        if off != bucket.buffer().numel():
            raise RuntimeError("terse.torch.Hook: bucket %d holds %d elements but its "
                               "parameters %d" % (bucket.index(), bucket.buffer().numel(), off))
        self._plans[key] = plan
        return plan

    # -- the hook
    @property
    def error(self):
        """The first failure (a terse.Error, or what the hook raised), or
        None. torch 1.13 re-raises a Future's exception from backward() as a
        RuntimeError ("Unable to cast <terse's sentence> to Tensor"); this
        keeps the status."""
        return self._failed

    def __call__(self, bucket):
        # Failures are returned as failed Futures, never raised: an exception
        # raised here would leave DDP's reducer mid-iteration, and the next
        # forward() would fail with DDP's complaint instead of terse's.
        fut = torch.futures.Future()
        f = self._failed
        if f is not None:
            fut.set_exception(terse.Error(f.status, f.detail, f.where)
                              if isinstance(f, terse.Error)
                              else RuntimeError("terse.torch.Hook failed earlier: %s" % f))
            return fut
        buf = bucket.buffer()
        it = self.iteration
        if bucket.is_last():
            self.iteration += 1
        reqs = []
        try:
            if buf.dtype != torch.float32:
                raise TypeError("terse.torch.Hook handles float32 gradients, not %s" % buf.dtype)
            if it < self.start_iter:
                reqs.append(self.comm.allreduce_start(buf, None, "avg"))
            else:
                plan = self._plan(bucket, bucket.parameters())
                with self.comm.group():
                    for off, n, codec in plan:
                        reqs.append(self.comm.allreduce_start(buf[off:off + n], codec, "avg"))
        except Exception as e:
            self._fail(e)
            fut.set_exception(e)
            return fut
        if self.overlap:
            self._submit((reqs, fut, buf))
        else:
            self._complete(reqs, fut, buf)
        return fut

    def _fail(self, e):
        with self._lock:
            if self._failed is None:
                self._failed = e
                # The other ranks must not wait for this one until their
                # timeout: an aborted communicator tells them once closed.
                self.comm.abort()

    def _complete(self, reqs, fut, buf):
        err = None
        for r in reqs:
            try:
                r.wait()
            except terse.Error as e:
                err = err or e
        if err is None:
            fut.set_result(buf)
        else:
            self._fail(err)
            fut.set_exception(err)

    def _submit(self, item):
        if self._thread is None:
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._loop, name="terse-hook", daemon=True)
            self._thread.start()
        self._queue.put(item)

    def _loop(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self._complete(*item)
            except BaseException as e:  # never leave a Future unfulfilled
                if not item[1].done():
                    item[1].set_exception(e)

    # -- checkpoints
    def state_dict(self):
        """The iteration and every codec's state, keyed by parameter name.
        Call it between iterations (no bucket in flight)."""
        return {"iteration": self.iteration,
                "codecs": {name: {"spec": c.spec, "rows": c.rows, "cols": c.cols,
                                  "state": c.state()}
                           for name, c in self._codecs.items()}}

    def load_state_dict(self, sd):
        """Restore what state_dict() returned. Each codec's state is checked
        by terse and loaded now (or, without the model, when the codec is
        made); a state saved under another spec or shape, or for a
        parameter the model does not have, raises ValueError."""
        known = {n for n, _ in self._names.values()} if self._named else set()
        for name, ent in sd.get("codecs", {}).items():
            if known and name not in known:
                raise ValueError("terse.torch.Hook.load_state_dict: the checkpoint has codec "
                                 "state for %r, which this model has no parameter of" % name)
            c = self._codecs.get(name)
            if c is None and known:
                raise ValueError("terse.torch.Hook.load_state_dict: the checkpoint has codec "
                                 "state for %r, which this hook's spec sends dense" % name)
        for name, ent in sd.get("codecs", {}).items():
            c = self._codecs.get(name)
            if c is not None:
                self._load(name, c, ent)
            else:
                self._pending[name] = ent
        self.iteration = int(sd["iteration"])

    @staticmethod
    def _load(name, codec, ent):
        if ent["spec"] != codec.spec or (ent["rows"], ent["cols"]) != (codec.rows, codec.cols):
            raise ValueError("terse.torch.Hook.load_state_dict: %s was saved as %s %dx%d, but "
                             "is now %s %dx%d" % (name, ent["spec"], ent["rows"], ent["cols"],
                                                 codec.spec, codec.rows, codec.cols))
        codec.load_state(ent["state"])

    def stats(self):
        """terse's communicator statistics plus the hook's iteration."""
        s = self.comm.stats()
        s["iteration"] = self.iteration
        return s

    def close(self):
        """Stop the completion thread and free the codecs."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        for c in self._codecs.values():
            c.close()
        self._codecs.clear()
        self._plans.clear()
