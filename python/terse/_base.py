"""The package's foundation: the loaded library, its version check, the
status constants, terse.Error, and the checks that turn a numpy array or
a torch tensor into a pointer and a length."""

import ctypes

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
