"""terse: gradient compression and compressed collectives, from Python.

A pure-Python package over libterse's C ABI (ctypes; no build step). The
library is looked for in this order: $TERSE_LIBRARY; beside the package
(in it, or up to three directories above it, which is where
``cmake --install`` puts it); the source tree's ``build/``; the system's
library path. ``terse.library_path`` says which file was loaded.

Every failing call raises :class:`terse.Error`, which carries the status
(``e.status``, ``e.name``), its description (``e.strerror``) and the
library's sentence about this failure (``e.detail``).

Buffers are numpy ``float32`` arrays or CPU ``torch.float32`` tensors,
C-contiguous, and writable where terse writes; anything else raises
``TypeError`` naming what is wrong (``ValueError`` for a wrong size).
ctypes releases the GIL for the duration of every library call, so other
Python threads run while a collective waits on the network.

    import numpy as np, terse
    with terse.Codec("int8:ef=1", 1000) as c:
        msg = c.encode(np.ones(1000, np.float32))
        out = c.decode(msg)

    with terse.Comm() as comm:                # rank, size, address, token
        comm.allreduce(grad, op="avg")        # from the environment
        req = comm.allreduce_start(grad2, codec=c2)
        ...
        req.wait()
"""

import ctypes
import threading

from . import _capi

_lib, library_path, library_found_in = _capi.load()
_capi.declare(_lib)

__version__ = _lib.terse_version_string().decode()


def _check_version():
    v = _lib.terse_version()
    major, minor = v // 10000, (v // 100) % 100
    if major != _capi.ABI_MAJOR or minor < _capi.ABI_MINOR:
        raise ImportError(
            "terse: %s is version %s; this package needs %d.%d or a later %d.x"
            % (library_path, __version__, _capi.ABI_MAJOR, _capi.ABI_MINOR, _capi.ABI_MAJOR))


_check_version()

# Status constants, from the library itself: OK, ERR_INVALID, ... .
STATUS_NAMES = {}
_unknown = _lib.terse_strerror(-1)
for _s in range(256):
    if _lib.terse_strerror(_s) == _unknown:
        break
    _n = _lib.terse_status_name(_s).decode()
    STATUS_NAMES[_s] = _n
    globals()[_n[len("TERSE_"):]] = _s
del _s, _n, _unknown


def version():
    """The loaded library's version string, e.g. "0.1.0"."""
    return __version__


class Error(Exception):
    """A terse call failed.

    status    the terse_status value (e.g. terse.ERR_PEER_LOST == 15)
    name      its symbolic name ("TERSE_ERR_PEER_LOST")
    strerror  the status's description
    detail    the library's sentence about this failure (terse_last_error)
    """

    def __init__(self, status, detail="", where=""):
        self.status = int(status)
        self.name = STATUS_NAMES.get(self.status, "TERSE_STATUS_%d" % self.status)
        self.strerror = _lib.terse_strerror(self.status).decode()
        self.detail = detail
        self.where = where
        if detail.startswith(self.name):
            msg = detail
        else:
            msg = "%s: %s" % (self.name, detail or self.strerror)
        if where:
            msg = "%s: %s" % (where, msg)
        super().__init__(msg)


def _last_error(st):
    return _lib.terse_last_error().decode(errors="replace") if st != 0 else ""


def _raise(st, where):
    raise Error(st, _lib.terse_last_error().decode(errors="replace"), where)


def _call(where, fn, *args):
    st = fn(*args)
    if st != 0:
        _raise(st, where)


# ---------------------------------------------------------------- buffers

def _describe(obj):
    t = type(obj)
    return "%s.%s" % (t.__module__, t.__qualname__)


def _is_torch(obj):
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def _float_buffer(obj, what, writable, n=None):
    """(address, element count, keep-alive) of a float32 buffer."""
    if _is_torch(obj):
        import torch
        if obj.dtype != torch.float32:
            raise TypeError("%s must be float32, not a torch tensor of %s" % (what, obj.dtype))
        if obj.device.type != "cpu":
            raise TypeError("%s must be a CPU tensor, not one on %s" % (what, obj.device))
        if not obj.is_contiguous():
            raise TypeError("%s must be contiguous (call .contiguous() first)" % what)
        if writable and obj.requires_grad and obj.is_leaf:
            raise TypeError("%s requires grad: pass its .detach() or .grad" % what)
        addr, count = obj.data_ptr(), obj.numel()
    else:
        try:
            import numpy as np
        except ImportError:  # pragma: no cover
            np = None
        if np is None or not isinstance(obj, np.ndarray):
            raise TypeError("%s must be a numpy float32 array or a CPU torch float32 "
                            "tensor, not %s" % (what, _describe(obj)))
        if obj.dtype != np.float32:
            raise TypeError("%s must be float32, not a numpy array of %s" % (what, obj.dtype))
        if not obj.flags.c_contiguous:
            raise TypeError("%s must be C-contiguous (use numpy.ascontiguousarray)" % what)
        if writable and not obj.flags.writeable:
            raise TypeError("%s must be writable: terse writes its result into it" % what)
        addr, count = obj.ctypes.data, obj.size
    if n is not None and count != n:
        raise ValueError("%s has %d elements, not the %d expected" % (what, count, n))
    return addr, count, obj


def _byte_buffer(obj, what, writable):
    """(address, byte count, keep-alive) of any contiguous buffer."""
    if _is_torch(obj):
        if obj.device.type != "cpu":
            raise TypeError("%s must be a CPU tensor, not one on %s" % (what, obj.device))
        if not obj.is_contiguous():
            raise TypeError("%s must be contiguous" % what)
        return obj.data_ptr(), obj.numel() * obj.element_size(), obj
    try:
        import numpy as np
        if isinstance(obj, np.ndarray):
            if not obj.flags.c_contiguous:
                raise TypeError("%s must be C-contiguous" % what)
            if writable and not obj.flags.writeable:
                raise TypeError("%s must be writable" % what)
            return obj.ctypes.data, obj.nbytes, obj
    except ImportError:  # pragma: no cover
        pass
    if isinstance(obj, (bytes,)) and not writable:
        keep = ctypes.create_string_buffer(obj, len(obj))
        return ctypes.addressof(keep), len(obj), keep
    if isinstance(obj, (bytearray, memoryview)):
        mv = memoryview(obj)
        if not mv.contiguous:
            raise TypeError("%s must be contiguous" % what)
        if writable and mv.readonly:
            raise TypeError("%s must be writable" % what)
        if mv.nbytes == 0:
            return None, 0, obj
        c = (ctypes.c_char * mv.nbytes).from_buffer(mv) if not mv.readonly else \
            ctypes.create_string_buffer(mv.tobytes(), mv.nbytes)
        return ctypes.addressof(c), mv.nbytes, (obj, c)
    raise TypeError("%s must be a numpy array, a CPU torch tensor, bytes or a bytearray, "
                    "not %s" % (what, _describe(obj)))


def _op(op):
    if op in ("sum", 0):
        return 0
    if op in ("avg", "mean", 1):
        return 1
    raise ValueError("op must be 'sum' or 'avg', not %r" % (op,))


def _spec(spec, what="spec"):
    if not isinstance(spec, str):
        raise TypeError("%s must be a str, not %s" % (what, _describe(spec)))
    return spec.encode()


# ---------------------------------------------------------------- codecs

class _Closing:
    """A context manager whose exit, like its collection, calls close()."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def codecs():
    """The names of the registered codecs."""
    return [_lib.terse_codec_name(i).decode() for i in range(_lib.terse_codec_count())]


class Codec(_Closing):
    """One tensor's codec: terse_codec_create(spec, rows, cols).

    Keep one per tensor: it owns the tensor's error-feedback residual,
    PowerSGD's warm start and its random stream. Used by one thread at a
    time; one handed to a non-blocking collective belongs to it until the
    request completes.
    """

    def __init__(self, spec, rows, cols=1):
        for name, v in (("rows", rows), ("cols", cols)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError("%s must be an int, not %s" % (name, _describe(v)))
            if v < 1:
                raise ValueError("%s must be at least 1, not %d" % (name, v))
        h = _capi.handle()
        _call("terse.Codec(%r, %d, %d)" % (spec, rows, cols), _lib.terse_codec_create,
              _spec(spec), rows, cols, ctypes.byref(h))
        self._h = h
        self.rows, self.cols = rows, cols
        self._busy = None  # the request that owns the codec, if any

    # life cycle
    def _owner_running(self):
        """True while a request that owns this codec has not completed."""
        b = self._busy
        if b is None or b._finished():
            self._busy = None
            return False
        b._poll()
        if b._finished():
            self._busy = None
            return False
        return True

    def close(self):
        """Free the codec; one owned by a request in flight is waited for
        first (ValueError inside an unended group, where it cannot be)."""
        if self._h:
            if self._owner_running():
                try:
                    self._busy.wait()
                except Error:
                    pass
                if not self._busy._finished():
                    raise ValueError("this terse.Codec belongs to a request in a group that "
                                     "has not ended; end the group first")
            self._busy = None
            _lib.terse_codec_free(self._h)
            self._h = None


    def _handle(self):
        if not self._h:
            raise ValueError("this terse.Codec is closed")
        if self._owner_running():
            raise ValueError("this terse.Codec belongs to a request still in flight")
        return self._h

    # facts
    @property
    def spec(self):
        """The canonical spec, every option spelled out."""
        return _lib.terse_codec_spec(self._handle()).decode()

    @property
    def elements(self):
        return _lib.terse_codec_elements(self._handle())

    @property
    def bound(self):
        """The worst-case size of one message, header included."""
        return _lib.terse_codec_bound(self._handle())

    @property
    def step(self):
        return _lib.terse_codec_step(self._handle())

    @property
    def traits(self):
        """dict: id, name, summable, error_feedback, randomized, bits_per_element,
        fixed_size, segment_align (0: never cut), segment_options."""
        t = _capi.CodecTraits()
        t.size = ctypes.sizeof(t)
        _call("terse.Codec.traits", _lib.terse_codec_get_traits, self._handle(), ctypes.byref(t))
        return {"id": t.id, "name": t.name.decode(), "summable": bool(t.summable),
                "error_feedback": bool(t.error_feedback), "randomized": bool(t.randomized),
                "bits_per_element": t.bits_per_element, "fixed_size": bool(t.fixed_size),
                "segment_align": t.segment_align, "segment_options": bool(t.segment_options)}

    def set_stream(self, tensor, rank):
        """Key the codec's random stream by (seed, step, tensor, rank)."""
        _call("terse.Codec.set_stream", _lib.terse_codec_set_stream, self._handle(),
              int(tensor), int(rank))

    # work
    def encode(self, grad):
        """Encode grad (elements floats) and return the message as bytes."""
        h = self._handle()
        addr, _, keep = _float_buffer(grad, "grad", False, self.elements)
        cap = _lib.terse_codec_bound(h)
        out = ctypes.create_string_buffer(cap)
        n = ctypes.c_size_t(0)
        _call("terse.Codec.encode", _lib.terse_encode, h, addr, out, cap, ctypes.byref(n))
        del keep
        return out.raw[: n.value]

    def decode(self, msg, out=None, alpha=1.0, accumulate=False):
        """Decode msg into out (created as a numpy float32 array if None):
        out = alpha * decoded, or out += alpha * decoded with accumulate.
        Returns out."""
        h = self._handle()
        if out is None:
            import numpy as np
            out = np.zeros(self.elements, np.float32)
        daddr, _, dkeep = _float_buffer(out, "out", True, self.elements)
        saddr, slen, skeep = _byte_buffer(msg, "msg", False)
        _call("terse.Codec.decode", _lib.terse_decode, h, saddr, slen, daddr,
              float(alpha), 1 if accumulate else 0)
        del dkeep, skeep
        return out

    def residual(self):
        """A numpy copy of the error-feedback residual, or None without ef."""
        h = self._handle()
        p = _lib.terse_codec_residual(h)
        if not p:
            return None
        import numpy as np
        return np.ctypeslib.as_array(p, shape=(self.elements,)).copy()

    def reset_residual(self):
        _lib.terse_codec_reset_residual(self._handle())

    def state(self):
        """The codec's state (residual, warm start, step, stream) as bytes."""
        h = self._handle()
        cap = _lib.terse_codec_state_size(h)
        buf = ctypes.create_string_buffer(max(cap, 1))
        n = ctypes.c_size_t(0)
        _call("terse.Codec.state", _lib.terse_codec_state_save, h, buf, cap, ctypes.byref(n))
        return buf.raw[: n.value]

    def load_state(self, state):
        """Restore a state from state(); everything is validated first, and
        on error the codec is unchanged."""
        addr, n, keep = _byte_buffer(state, "state", False)
        _call("terse.Codec.load_state", _lib.terse_codec_state_load, self._handle(), addr, n)
        del keep

    def __repr__(self):
        if not self._h:
            return "<terse.Codec closed>"
        return "<terse.Codec %s %dx%d>" % (self.spec, self.rows, self.cols)


def inspect(msg):
    """Validate a message's header and checksum: dict(codec_id, count, payload_len)."""
    addr, n, keep = _byte_buffer(msg, "msg", False)
    info = _capi.WireInfo()
    _call("terse.inspect", _lib.terse_wire_inspect, addr, n, ctypes.byref(info))
    del keep
    return {"codec_id": info.codec_id, "count": info.count, "payload_len": info.payload_len}


# ---------------------------------------------------------------- requests

class Request:
    """A collective in flight (terse_X_start). It keeps its buffers and
    codec alive until it completes; wait() raises terse.Error on failure."""

    def __init__(self, comm, h, keep, what):
        self._comm = comm
        self._h = h
        self._keep = keep
        self._what = what
        self._status = None
        self._detail = ""
        self._lock = threading.Lock()
        self.result = None

    def _finished(self):
        return self._status is not None

    def _complete(self, st, detail):
        # With the lock held, once the library said the request is done.
        self._status = st
        self._detail = detail
        _lib.terse_request_free(self._h)
        self._h = None
        keep, self._keep = self._keep, None
        self._comm._requests.discard(self)
        return keep  # dropped by the caller once the lock is released

    def _poll(self):
        """Test without raising (and without blocking on another waiter)."""
        if self._status is not None or not self._lock.acquire(blocking=False):
            return
        keep = None
        try:
            if self._status is None:
                done = ctypes.c_int(0)
                st = _lib.terse_request_test(self._h, ctypes.byref(done))
                if done.value:
                    keep = self._complete(st, _last_error(st))
        finally:
            self._lock.release()
        del keep

    def test(self):
        """True once complete (raises terse.Error if it failed, or if it
        cannot be tested now, e.g. inside its unended group)."""
        keep = None
        with self._lock:
            if self._status is None:
                done = ctypes.c_int(0)
                st = _lib.terse_request_test(self._h, ctypes.byref(done))
                if done.value:
                    keep = self._complete(st, _last_error(st))
                elif st != 0:
                    raise Error(st, _last_error(st), self._what + " (test)")
        del keep
        if self._status is None:
            return False
        self._check()
        return True

    def wait(self, raise_error=True):
        """Block until complete (the GIL is released meanwhile); return the
        result (for allgather: a list of bytes per rank), or raise
        terse.Error. Inside its unended group a request cannot be waited
        for: that raises ERR_INVALID and leaves the request in flight."""
        keep = None
        with self._lock:
            if self._status is None:
                st = _lib.terse_request_wait(self._h)
                detail = _last_error(st)
                done = ctypes.c_int(0)
                _lib.terse_request_test(self._h, ctypes.byref(done))
                if done.value:
                    keep = self._complete(st, detail)
                else:
                    raise Error(st, detail, self._what + " (wait)")
        del keep
        if raise_error:
            self._check()
        return self.result

    @property
    def status(self):
        """None while in flight, else the terse status."""
        return self._status

    def _check(self):
        if self._status != 0:
            raise Error(self._status, self._detail, self._what)

    def __del__(self):
        try:
            if self._h:
                self.wait(raise_error=False)
        except Exception:
            pass


# ---------------------------------------------------------------- communicator

class Comm(_Closing):
    """A communicator (terse_comm_init). Every argument left None is taken
    from the environment as the C library does (TERSE_RANK/RANK,
    TERSE_SIZE/WORLD_SIZE, TERSE_ADDR or MASTER_ADDR:MASTER_PORT,
    TERSE_PROVIDER, TERSE_TOKEN, TERSE_TIMEOUT_MS, TERSE_REJOIN). Collective
    calls are made by every rank in the same order, from one thread at a
    time. rejoin=True joins a running job as the replacement of a lost
    parameter server (replicas 2; see terse_comm_config.rejoin in terse.h)."""

    def __init__(self, rank=None, size=None, addr=None, provider=None, token=None,
                 timeout_ms=None, init_timeout_ms=None, rejoin=None):
        cfg = _capi.CommConfig()
        cfg.size = ctypes.sizeof(cfg)
        cfg.rank = -1 if rank is None else int(rank)
        cfg.nranks = -1 if size is None else int(size)
        cfg.addr = None if addr is None else _spec(addr, "addr")
        cfg.provider = None if provider is None else _spec(provider, "provider")
        tok = None if token is None else (token.encode() if isinstance(token, str) else bytes(token))
        cfg.token = tok
        cfg.timeout_ms = 0 if timeout_ms is None else int(timeout_ms)
        cfg.init_timeout_ms = 0 if init_timeout_ms is None else int(init_timeout_ms)
        cfg.rejoin = -1 if rejoin is None else int(bool(rejoin))
        h = _capi.handle()
        st = _lib.terse_comm_init(ctypes.byref(cfg), ctypes.byref(h))
        cfg.token = None
        del tok
        if st != 0:
            _raise(st, "terse.Comm")
        self._h = h
        self._requests = set()
        # Start calls come from one thread at a time (terse.h): this lock
        # makes it so when several Python threads share a Comm.
        self._start_lock = threading.RLock()
        self.rank = _lib.terse_comm_rank(h)
        self.size = _lib.terse_comm_size(h)
        self.provider = _lib.terse_comm_provider(h).decode()

    def _handle(self):
        if not self._h:
            raise ValueError("this terse.Comm is closed")
        return self._h

    def close(self):
        """terse_comm_free. Requests still in flight are aborted first and
        waited for (also those another thread is waiting on), so that no
        thread is inside the library with this communicator when it goes."""
        h = self._h
        if not h:
            return
        with self._start_lock:
            pending = [r for r in list(self._requests) if not r._finished()]
            if pending:
                _lib.terse_comm_abort(h)
            for r in pending:
                try:
                    r.wait(raise_error=False)
                except Error:
                    pass  # inside an unended group: terse_comm_free aborts it
            self._h = None
            _lib.terse_comm_free(h)

    def abort(self):
        """terse_comm_abort: from any thread; everything in flight and every
        later call fails with ERR_ABORTED. Then only close() is left."""
        h = self._h
        if h:
            _lib.terse_comm_abort(h)

    def __repr__(self):
        if not self._h:
            return "<terse.Comm closed>"
        return "<terse.Comm rank %d of %d on %s>" % (self.rank, self.size, self.provider)

    # -- helpers
    def _codec(self, codec, n):
        if codec is None:
            return None
        if not isinstance(codec, Codec):
            raise TypeError("codec must be a terse.Codec or None, not %s" % _describe(codec))
        h = codec._handle()
        if codec.elements != n:
            raise ValueError("the codec is for %d elements; the buffer has %d"
                             % (codec.elements, n))
        return h

    def _start(self, what, fn, args, keep, codec=None):
        r = _capi.handle()
        with self._start_lock:
            _call(what, fn, self._handle(), *args, ctypes.byref(r))
            req = Request(self, r, keep, what)
            self._requests.add(req)
        if codec is not None:
            codec._busy = req
        return req

    def _blocking(self, what, fn, *args):
        with self._start_lock:
            _call(what, fn, self._handle(), *args)

    # -- collectives
    def allreduce(self, buf, codec=None, op="sum"):
        """All-reduce buf in place (dense fp32 without a codec; with one, the
        codec's compressed exchange). op: "sum" or "avg". Returns buf."""
        addr, n, keep = _float_buffer(buf, "buf", True)
        ch = self._codec(codec, n)
        self._blocking("terse.Comm.allreduce", _lib.terse_allreduce, addr, n, ch, _op(op))
        del keep
        return buf

    def allreduce_algorithm(self, n, codec=None):
        """The algorithm allreduce runs for n floats with this codec (None:
        dense): "dense-rd", "dense-ring", "rounds", "summable", "gather",
        "gather-pipe" (the all-gather in pieces), "rs" (compressed
        reduce-scatter) or "local" (one rank)."""
        ch = self._codec(codec, int(n))
        return _lib.terse_allreduce_algorithm(self._handle(), ch, int(n)).decode()

    def allreduce_start(self, buf, codec=None, op="sum"):
        addr, n, keep = _float_buffer(buf, "buf", True)
        ch = self._codec(codec, n)
        req = self._start("terse.Comm.allreduce_start", _lib.terse_allreduce_start,
                          (addr, n, ch, _op(op)), (keep, codec), codec)
        req.result = buf
        return req

    def broadcast(self, buf, root=0):
        """Copy root's buf (any contiguous buffer) into every rank's buf."""
        addr, n, keep = _byte_buffer(buf, "buf", True)
        self._blocking("terse.Comm.broadcast", _lib.terse_broadcast, addr, n, int(root))
        del keep
        return buf

    def broadcast_start(self, buf, root=0):
        addr, n, keep = _byte_buffer(buf, "buf", True)
        req = self._start("terse.Comm.broadcast_start", _lib.terse_broadcast_start,
                          (addr, n, int(root)), keep)
        req.result = buf
        return req

    def _gather_sizes(self, send):
        # Sizes first (a barrier-like exchange of 8 bytes per rank), so the
        # caller does not need to know the total.
        import struct
        mine = struct.pack("<Q", send[1])
        out = ctypes.create_string_buffer(8 * self.size)
        counts = (ctypes.c_size_t * self.size)()
        sa = ctypes.create_string_buffer(mine, 8)
        self._blocking("terse.Comm.allgather", _lib.terse_allgather, sa, 8, out,
                       8 * self.size, counts)
        return sum(struct.unpack("<%dQ" % self.size, out.raw))

    def allgather(self, send, recv_cap=None):
        """Gather every rank's bytes: returns (list of bytes per rank).
        recv_cap (total bytes) skips the size exchange when known."""
        sa = _byte_buffer(send, "send", False)
        total = self._gather_sizes(sa) if recv_cap is None else _cap(recv_cap)
        out = ctypes.create_string_buffer(max(total, 1))
        counts = (ctypes.c_size_t * self.size)()
        self._blocking("terse.Comm.allgather", _lib.terse_allgather, sa[0], sa[1],
                       out, total, counts)
        return _split(out.raw, counts)

    def allgather_start(self, send, recv_cap):
        """Non-blocking allgather; recv_cap is the total byte count (every
        rank's contribution). wait() returns a list of bytes per rank."""
        sa = _byte_buffer(send, "send", False)
        cap = _cap(recv_cap)
        out = ctypes.create_string_buffer(max(cap, 1))
        counts = (ctypes.c_size_t * self.size)()
        req = self._start("terse.Comm.allgather_start", _lib.terse_allgather_start,
                          (sa[0], sa[1], out, cap, counts), (sa, out, counts))
        orig = req._complete

        def complete(st, detail, req=req, orig=orig, out=out, counts=counts):
            if st == 0:
                req.result = _split(out.raw, counts)
            return orig(st, detail)
        req._complete = complete
        return req

    def barrier(self):
        self._blocking("terse.Comm.barrier", _lib.terse_barrier)

    def barrier_start(self):
        return self._start("terse.Comm.barrier_start", _lib.terse_barrier_start, (), None)

    def group(self):
        """A context manager around terse_group_start/_end: the starts
        inside are submitted together (small dense allreduces fused)."""
        return _Group(self)

    def stats(self):
        """dict of terse_comm_stats: ops, payload/wire bytes sent and
        received, codec_seconds, network_seconds, auth_failures,
        stranger_drops."""
        s = _capi.CommStats()
        s.size = ctypes.sizeof(s)
        _call("terse.Comm.stats", _lib.terse_comm_get_stats, self._handle(), ctypes.byref(s))
        return {f: getattr(s, f) for f, _ in _capi.CommStats._fields_ if f != "size"}

    def reset_stats(self):
        _lib.terse_comm_reset_stats(self._handle())


def _cap(v):
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError("recv_cap must be an int, not %s" % _describe(v))
    if v < 0:
        raise ValueError("recv_cap must be >= 0, not %d" % v)
    return v


def _split(raw, counts):
    out, off = [], 0
    for c in counts:
        out.append(raw[off: off + c])
        off += c
    return out


class _Group:
    def __init__(self, comm):
        self._comm = comm

    def __enter__(self):
        c = self._comm
        c._start_lock.acquire()
        try:
            _call("terse.Comm.group", _lib.terse_group_start, c._handle())
        except BaseException:
            c._start_lock.release()
            raise
        return c

    def __exit__(self, *exc):
        c = self._comm
        try:
            _call("terse.Comm.group", _lib.terse_group_end, c._handle())
        finally:
            c._start_lock.release()


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

    While a PS exists its communicator runs nothing else."""

    def __init__(self, comm, num_servers=1, mode="sync", update="none", lr=0.0, momentum=0.0,
                 chunk_bytes=0, vnodes=64, aggregator="mean"):
        if not isinstance(comm, Comm):
            raise TypeError("comm must be a terse.Comm, not %s" % _describe(comm))
        if update not in ("none", "sgd"):
            raise ValueError("update must be 'none' or 'sgd', not %r" % (update,))
        cfg = _capi.PsConfig()
        cfg.size = ctypes.sizeof(cfg)
        cfg.num_servers, cfg.chunk_bytes, cfg.vnodes = int(num_servers), int(chunk_bytes), int(vnodes)
        cfg.update = 1 if update == "sgd" else 0
        cfg.lr, cfg.momentum = float(lr), float(momentum)
        self._agg = _spec(aggregator, "aggregator")
        cfg.aggregator = self._agg
        _call("terse.PS(mode=%r)" % (mode,), _lib.terse_ps_config_parse, _spec(mode, "mode"),
              ctypes.byref(cfg))
        h = _capi.handle()
        with comm._start_lock:
            _call("terse.PS", _lib.terse_ps_create, comm._handle(), ctypes.byref(cfg),
                  ctypes.byref(h))
        self._h, self.comm, self.num_servers = h, comm, int(num_servers)
        self._sizes = []
        self.is_server = bool(_lib.terse_ps_is_server(h))

    def _handle(self):
        if not self._h:
            raise ValueError("this terse.PS is closed")
        return self._h

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
