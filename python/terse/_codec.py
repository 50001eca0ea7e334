"""terse.Codec: one tensor's codec, and the codec registry."""

import ctypes

from . import _capi
from ._base import (_Closing, Error, _byte_buffer, _call, _describe, _float_buffer, _lib, _spec)


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
