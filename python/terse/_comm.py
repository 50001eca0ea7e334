"""terse.Comm and terse.Request: the communicator, its collectives (blocking
and started), groups, and the requests they return."""

import ctypes
import ipaddress
import os
import re
import secrets
import socket
import threading

from . import _capi
from ._base import (_Closing, Error, _byte_buffer, _call, _describe, _float_buffer, _last_error, _lib, _op, _raise, _spec)
from ._codec import Codec

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
        # hosts (terse_comm_topology): this rank's host index, local rank,
        # local size, and the number of hosts
        vals = [ctypes.c_int(-1) for _ in range(4)]
        st = _lib.terse_comm_topology(h, *[ctypes.byref(v) for v in vals])
        if st != 0:
            _raise(st, "terse.Comm")
        self.host_index, self.local_rank, self.local_size, self.num_hosts = (
            v.value for v in vals)

    @classmethod
    def from_mpi(cls, comm=None, addr=None, provider=None, token=None,
                 timeout_ms=None, init_timeout_ms=None):
        """A terse.Comm over the ranks of an mpi4py communicator (default
        mpi4py's MPI.COMM_WORLD), for jobs started by mpirun: terse's rank r
        is comm's rank r and its size comm's size. Collective over comm:
        every rank of it calls this, and comm carries the bootstrap store's
        address from comm's rank 0 to the others.

        addr: the store's "host:port", on comm's rank 0 (default:
        127.0.0.1 and a free port when every rank of comm runs on rank 0's
        machine, by MPI.Get_processor_name; else rank 0's host name, which
        must resolve to an address the other hosts reach, and a free port).
        token: the job token, the same on every rank; without it, TERSE_TOKEN
        when every rank has it set; else rank 0 draws 32 random bytes and
        sends them over comm -- in the clear on MPI's network, so this is
        refused under TERSE_WIRE=seal (whose point is a network others can
        read): pass token= or set TERSE_TOKEN then. provider, timeout_ms,
        init_timeout_ms: as for terse.Comm. Raises the same error on every
        rank when rank 0 cannot set up the store's address or the ranks
        disagree on where the token comes from; an error of terse_comm_init
        raises on the ranks that meet it (the others then time out). For a
        communicator other than COMM_WORLD, Open MPI's OMPI_COMM_WORLD_*
        variables (which describe world ranks) are hidden from terse during
        the call, and so are the other launchers' rank claims (Slurm's,
        torchrun's, terse-run's): os.environ changes for that moment, which
        another thread reading the environment then would see."""
        world = None
        try:
            from mpi4py import MPI  # only when asked: terse does not need MPI
            world = MPI.COMM_WORLD
        except ImportError:
            if comm is None:
                raise
        if comm is None:
            comm = world
        for m in ("Get_rank", "Get_size", "bcast", "allgather"):
            if not callable(getattr(comm, m, None)):
                raise TypeError("terse.Comm.from_mpi: comm must be an mpi4py communicator "
                                "(it has no %s)" % m)
        rank, size = comm.Get_rank(), comm.Get_size()
        mine = (_processor_name(), bool(token) or bool(os.environ.get("TERSE_TOKEN")),
                os.environ.get("TERSE_WIRE", "") in ("seal", "encrypt"))
        everyone = comm.allgather(mine)
        plan = None
        if rank == 0:
            try:
                has = [r for r, e in enumerate(everyone) if e[1]]
                if has and len(has) != size:
                    raise ValueError("ranks %s have a token (token= or TERSE_TOKEN) and ranks %s "
                                     "do not: give it to every rank, or to none" % (
                                         has, [r for r in range(size) if r not in has]))
                if not has and any(e[2] for e in everyone):
                    raise ValueError("TERSE_WIRE=seal, but no rank has a token (token= or "
                                     "TERSE_TOKEN), and one drawn here would cross MPI's "
                                     "network in the clear: give every rank the same token")
                one_host = all(e[0] == everyone[0][0] for e in everyone)
                plan = (_store_addr(addr, one_host), None if has else secrets.token_hex(32),
                        None)
            except Exception as e:  # every rank must hear of it, or the others block
                plan = (None, None, "terse.Comm.from_mpi: rank 0 cannot set up the job: %s" % e)
        store, tok, why = comm.bcast(plan, root=0)
        if why:
            raise ValueError(why)
        if token:
            tok = token  # every rank's own; a mismatch fails authentication at init
        hidden = {}
        if world is not None and isinstance(comm, MPI.Comm) and \
                MPI.Comm.Compare(comm, world) != MPI.IDENT:
            for k in _LAUNCHER_CLAIMS:
                if k in os.environ:
                    hidden[k] = os.environ.pop(k)
        try:
            return cls(rank=rank, size=size, addr=store, provider=provider, token=tok,
                       timeout_ms=timeout_ms, init_timeout_ms=init_timeout_ms)
        finally:
            os.environ.update(hidden)

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
        dense): "dense-seg" (the host's shared segment, every rank on one
        host), "dense-rd", "dense-ring", "dense-hier" (hierarchical, several
        hosts), "dense-hier-seg" (the same, each host's part over its shared
        segment), "codec-hier" (a codec's messages between hosts only, fp32
        inside them), "codec-hier-seg" (the same, fp32 in each host's shared
        segment), "rounds", "summable", "gather", "gather-pipe" (the
        all-gather in pieces), "rs" (compressed reduce-scatter) or "local"
        (one rank)."""
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
        stranger_drops, control_bytes_sent/recv (the 64-byte call
        descriptors)."""
        s = _capi.CommStats()
        s.size = ctypes.sizeof(s)
        _call("terse.Comm.stats", _lib.terse_comm_get_stats, self._handle(), ctypes.byref(s))
        return {f: getattr(s, f) for f, _ in _capi.CommStats._fields_ if f != "size"}

    def reset_stats(self):
        _lib.terse_comm_reset_stats(self._handle())


# Rank, size and local-rank claims terse_comm_init checks against its host
# grouping when they name the rank and size it joins as (terse.h, hosts):
# from_mpi hides them for a communicator whose ranks are not world ranks.
_LAUNCHER_CLAIMS = (
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "TERSE_RANK", "TERSE_SIZE", "TERSE_LOCAL_RANK", "TERSE_LOCAL_SIZE")


def _processor_name():
    try:
        from mpi4py import MPI
        return MPI.Get_processor_name()
    except ImportError:  # a stand-in comm: the host name
        return socket.gethostname()


def _store_addr(addr, one_host):
    """from_mpi's store address on rank 0: addr as given, else loopback (one
    host) or this host's name, with a port free right now; checked the way
    terse_comm_init will use it (parsed, resolved, bound)."""
    port = 0
    if addr is not None:  # checked here, so that every rank hears what is wrong
        host, sep, p = str(addr).rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not host or not re.fullmatch(r"[0-9]{1,5}", p) or not 0 < int(p) < 65536:
            raise ValueError("addr=%r is not host:port with a port of 1-65535" % (addr,))
        port = int(p)
    else:
        host = "127.0.0.1" if one_host else socket.gethostname()
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ValueError("the host %r does not resolve (%s)" % (host, e)) from None
    if not one_host:
        for info in infos:
            ip = info[4][0]
            if ipaddress.ip_address(ip.split("%")[0]).is_loopback:
                raise ValueError("the ranks run on several hosts, but %r resolves to the "
                                 "loopback address %s, which the others cannot reach; pass "
                                 "addr='host:port' with an address they can" % (host, ip))
    info = infos[0]
    with socket.socket(info[0], socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(info[4])  # the store binds here next: fails now, with a reason, if it would
        port = s.getsockname()[1]
    if addr is not None:
        return addr
    return "%s:%d" % (host, port)


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
