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

# The package is split by concern (_base, _codec, _comm, _ps); every public
# name, and the few private ones the tests and terse.torch read, are here.
from ._base import (STATUS_NAMES, Error, __version__, _lib, library_found_in,  # noqa: F401
                    library_path, version)
from ._codec import Codec, codecs, inspect  # noqa: F401
from ._comm import Comm, Request  # noqa: F401
from ._ps import PS, ps_aggregator_check  # noqa: F401

# Status constants, from the library itself: OK, ERR_INVALID, ... .
globals().update({_n[len("TERSE_"):]: _s for _s, _n in STATUS_NAMES.items()})
