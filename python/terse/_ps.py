"""terse.PS: the parameter server's push, pull and serve over a terse.Comm."""

import ctypes

from . import _capi
from ._base import (_Closing, _call, _describe, _float_buffer, _lib, _spec)
from ._comm import Comm


# ---------------------------------------------------------------- parameter server

def ps_aggregator_check(spec, workers):
    """Check a parameter-server aggregator spec ("median", "krum:f=2", ...)
    for steps of `workers` pushes, as terse.PS would; raises terse.Error
    (ERR_INVALID) with the library's sentence if it cannot hold."""
    _call("terse.ps_aggregator_check", _lib.terse_ps_aggregator_check,
          _spec(spec, "aggregator"), int(workers))


class PS(_Closing):
    """A parameter server over a Comm (terse_ps_*; include/terse.h and
    docs/ps.md have the contract). Ranks [0, num_servers) serve; the others
    are workers. Every rank makes it with the same arguments, then declares
    the same keys in the same order.

        ps = terse.PS(comm, num_servers=1, mode="sync", update="sgd", lr=0.1)
        ps.declare(0, n, push="int8:ef=1", init=x0)     # keys 0, 1, 2, ...

    aggregator (sync mode) is "mean", "median", "trimmed_mean:b=B",
    "krum:f=F,m=M", "cclip:tau=T,iters=L" or "signvote": how the server
    combines a step's pushes, robust to Byzantine workers for all but mean
    (include/terse.h, "Aggregators").
        if ps.is_server:
            ps.serve()                                  # until every worker finished
        else:
            ps.pushpull(0, buf); ps.clock(); ...; ps.finish()
        ps.close()

    partition_bytes and window: a key travels in partitions, `window` of
    them in flight per server each way (include/terse.h, "Partitions");
    set_priority(key, p) sends a key's partitions before others'.

    colocate=True makes every rank a worker and a server (BytePS style;
    num_servers is ignored): each rank serves its shards on endpoints and a
    thread of its own while its training loop pushes, so is_server is False
    everywhere, serve() is refused, every key is declared before the first
    push, and close() waits until every worker has finished. replicas 2 is
    refused (include/terse.h, "Colocated servers").

    stale_rule (async and ssp) is how a push applied on arrival is
    corrected for its staleness: "plain", "step", "dc", "amom", several
    joined with "+" ("amom+step"), or "dana"; None is the mode's default; dc_lambda is
    dc's lambda (0: 0.04). The same as "async:update=dc,lambda=0.1" in mode
    (include/terse.h, "Stale pushes").

    lr_schedule "cosine" runs the server's rate as lr (k+1)/lr_warmup over
    the first lr_warmup steps, then a cosine decay to 0 at lr_steps
    ("constant", the default, keeps lr; include/terse.h, "Learning-rate
    schedule").

    While a PS exists its communicator runs nothing else."""

    def __init__(self, comm, num_servers=1, mode="sync", update="none", lr=0.0, momentum=0.0,
                 chunk_bytes=0, vnodes=64, aggregator="mean", partition_bytes=0, window=0,
                 colocate=False, stale_rule=None, dc_lambda=0.0, lr_schedule="constant",
                 lr_steps=0, lr_warmup=0):
        if not isinstance(comm, Comm):
            raise TypeError("comm must be a terse.Comm, not %s" % _describe(comm))
        if update not in ("none", "sgd"):
            raise ValueError("update must be 'none' or 'sgd', not %r" % (update,))
        if lr_schedule not in ("constant", "cosine"):
            raise ValueError("lr_schedule must be 'constant' or 'cosine', not %r" % (lr_schedule,))
        if stale_rule is not None:  # the C parser names what is wrong with it
            if not isinstance(stale_rule, str):
                raise TypeError("stale_rule must be a str, not %s" % _describe(stale_rule))
            mode = "%s%supdate=%s" % (mode, "," if ":" in mode else ":", stale_rule)
        cfg = _capi.PsConfig()
        cfg.size = ctypes.sizeof(cfg)
        cfg.num_servers, cfg.chunk_bytes, cfg.vnodes = int(num_servers), int(chunk_bytes), int(vnodes)
        # partitions on the wire and how many are in flight per server
        # (0: TERSE_PS_PARTITION_BYTES / TERSE_PS_WINDOW, else 1 MiB and 4)
        cfg.partition_bytes, cfg.window = int(partition_bytes), int(window)
        cfg.update = 1 if update == "sgd" else 0
        cfg.lr, cfg.momentum = float(lr), float(momentum)
        self._agg = _spec(aggregator, "aggregator")
        cfg.aggregator = self._agg
        _call("terse.PS(mode=%r)" % (mode,), _lib.terse_ps_config_parse, _spec(mode, "mode"),
              ctypes.byref(cfg))
        if colocate:  # mode text may say colocate=1 too
            cfg.colocate = 1
        if dc_lambda:
            cfg.dc_lambda = float(dc_lambda)
        cfg.lr_schedule = 1 if lr_schedule == "cosine" else 0
        cfg.lr_steps, cfg.lr_warmup = int(lr_steps), int(lr_warmup)
        h = _capi.handle()
        with comm._start_lock:
            _call("terse.PS", _lib.terse_ps_create, comm._handle(), ctypes.byref(cfg),
                  ctypes.byref(h))
        self._h, self.comm, self.num_servers = h, comm, int(num_servers)
        if cfg.colocate:
            self.num_servers = comm.size  # every rank serves
        self._sizes = []
        self.is_server = bool(_lib.terse_ps_is_server(h))

    def _handle(self):
        if not self._h:
            raise ValueError("this terse.PS is closed")
        return self._h

    def set_priority(self, key, priority):
        """Partitions of keys of higher priority go out first (default 0;
        ties: the key declared first). Local, on workers."""
        _call("terse.PS.set_priority", _lib.terse_ps_set_priority, self._handle(), int(key),
              int(priority))

    def declare(self, key, n, push=None, pull=None, init=None):
        """Declare tensor `key` (0, 1, ... in order) of n floats; push/pull
        are codec specs (None: dense); init: the server's initial value
        under update "sgd" (n floats) or None for zeros."""
        iaddr = None
        keep = None
        if init is not None:
            iaddr, _, keep = _float_buffer(init, "init", False, int(n))
        _call("terse.PS.declare", _lib.terse_ps_declare, self._handle(), int(key), int(n),
              None if push is None else _spec(push, "push"),
              None if pull is None else _spec(pull, "pull"), iaddr)
        del keep
        self._sizes.append(int(n))

    def _req(self, what, fn, key, buf, writable, block):
        addr, _, keep = _float_buffer(buf, "buf", writable, self._size(key))
        if block:
            with self.comm._start_lock:
                _call("terse.PS." + what, fn, self._handle(), int(key), addr, None)
            return buf
        return self.comm._start("terse.PS." + what + "_start", _PsStart(fn, self._handle()),
                                (int(key), addr), (keep, self))

    def _size(self, key):
        if not 0 <= int(key) < len(self._sizes):
            raise ValueError("key %r is not declared (declared: 0..%d)" % (key, len(self._sizes) - 1))
        return self._sizes[int(key)]

    def push(self, key, grad, block=True, weight=None):
        """Push grad; with block=False returns a Request. weight: the
        push's weight in its step's mean (terse_ps_push_weighted: sync mode
        with the mean aggregator; e.g. a federated client's example count)."""
        if weight is None:
            return self._req("push", _lib.terse_ps_push, key, grad, False, block)
        w = float(weight)

        def weighted(ps, key, addr, req):
            return _lib.terse_ps_push_weighted(ps, key, addr, w, req)

        return self._req("push", weighted, key, grad, False, block)

    def pull(self, key, out, block=True):
        return self._req("pull", _lib.terse_ps_pull, key, out, True, block)

    def pushpull(self, key, buf, block=True):
        """Push buf and pull the result into it, in one round trip."""
        return self._req("pushpull", _lib.terse_ps_pushpull, key, buf, True, block)

    def clock(self):
        _call("terse.PS.clock", _lib.terse_ps_clock, self._handle())

    @property
    def worker_clock(self):
        return _lib.terse_ps_worker_clock(self._handle())

    def finish(self):
        with self.comm._start_lock:
            _call("terse.PS.finish", _lib.terse_ps_finish, self._handle())

    def serve(self):
        """Serve until every worker finished (or was lost): blocking."""
        with self.comm._start_lock:
            _call("terse.PS.serve", _lib.terse_ps_serve, self._handle())

    def placement(self):
        """Bytes of the declared tensors on each server."""
        arr = (ctypes.c_uint64 * self.num_servers)()
        _call("terse.PS.placement", _lib.terse_ps_placement, self._handle(), arr)
        return list(arr)

    def chunk_server(self, key, chunk):
        return _lib.terse_ps_chunk_server(self._handle(), int(key), int(chunk))

    def stats(self):
        s = _capi.PsStats()
        s.size = ctypes.sizeof(s)
        _call("terse.PS.stats", _lib.terse_ps_get_stats, self._handle(), ctypes.byref(s))
        return {f: getattr(s, f) for f, _ in _capi.PsStats._fields_ if f != "size"}

    def close(self):
        """terse_ps_free (a worker that has not finished finishes first)."""
        if self._h:
            h, self._h = self._h, None
            with self.comm._start_lock:
                _lib.terse_ps_free(h)


class _PsStart:
    """Adapts terse_ps_X(ps, key, buf, &req) to Comm._start's calling shape,
    which passes the communicator first."""

    def __init__(self, fn, ps):
        self._fn, self._ps = fn, ps

    def __call__(self, comm_handle, key, addr, req):
        return self._fn(self._ps, key, addr, req)
