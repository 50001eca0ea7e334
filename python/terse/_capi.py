"""The C ABI of libterse, declared for ctypes.

Every function of include/terse.h is declared here with its argument and
result types (tests/test_capi.py checks the list against the header), so a
wrong call is a ctypes.ArgumentError, never a silent truncation. Nothing
here is public: terse/__init__.py wraps it.
"""

import ctypes
import ctypes.util
import os

# The version this package was written against: the library's major version
# must match and its minor version must be at least this one.
ABI_MAJOR = 0
ABI_MINOR = 1

_SONAMES = ("libterse.so.0", "libterse.so")


def _candidates():
    """Where the library is looked for, in order (each with why)."""
    env = os.environ.get("TERSE_LIBRARY")
    if env:
        yield env, "TERSE_LIBRARY"
        return  # an explicit choice is never second-guessed
    here = os.path.dirname(os.path.abspath(__file__))
    # Beside the package: in it, or in one of the three directories above it
    # (an install puts the package in <libdir>/python3/dist-packages/terse and
    # the library in <libdir>).
    d = here
    for _ in range(4):
        for so in _SONAMES:
            yield os.path.join(d, so), "beside the package"
        d = os.path.dirname(d)
    # The build tree: python/terse -> <repo>/build.
    repo = os.path.dirname(os.path.dirname(here))
    for so in _SONAMES:
        yield os.path.join(repo, "build", so), "the build tree"
    # The system's search path.
    for so in _SONAMES:
        yield so, "the system"
    found = ctypes.util.find_library("terse")
    if found:
        yield found, "the system"


def load():
    """Load libterse and return (CDLL, path, where)."""
    # Debian's libfabric links libpsm-infinipath, whose constructor replaces
    # the handlers of SIGINT, SIGTERM, SIGSEGV, ... with one that calls
    # exit(1): Ctrl-C would no longer raise KeyboardInterrupt. It reads this
    # variable when it loads, i.e. with libterse, just below.
    os.environ.setdefault("IPATH_NO_BACKTRACE", "1")
    tried = []
    for path, where in _candidates():
        if os.sep in path and not os.path.exists(path):
            if where == "TERSE_LIBRARY":
                raise ImportError("terse: TERSE_LIBRARY=%s: no such file" % path)
            tried.append(path)
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            if where == "TERSE_LIBRARY":
                raise ImportError("terse: TERSE_LIBRARY=%s cannot be loaded: %s" % (path, e))
            continue
        return lib, path, where
    raise ImportError(
        "terse: libterse not found. Build it (./terse.sh build), install it "
        "(cmake --install build), or set TERSE_LIBRARY to its path. Tried: "
        + ", ".join(tried))


c_size_p = ctypes.POINTER(ctypes.c_size_t)
c_float_p = ctypes.POINTER(ctypes.c_float)
status = ctypes.c_int
handle = ctypes.c_void_p


class CommConfig(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("rank", ctypes.c_int),
        ("nranks", ctypes.c_int),
        ("addr", ctypes.c_char_p),
        ("provider", ctypes.c_char_p),
        ("token", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_int),
        ("init_timeout_ms", ctypes.c_int),
        ("rejoin", ctypes.c_int),
    ]


class CommStats(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("ops", ctypes.c_uint64),
        ("payload_bytes_sent", ctypes.c_uint64),
        ("payload_bytes_recv", ctypes.c_uint64),
        ("wire_bytes_sent", ctypes.c_uint64),
        ("wire_bytes_recv", ctypes.c_uint64),
        ("codec_seconds", ctypes.c_double),
        ("network_seconds", ctypes.c_double),
        ("auth_failures", ctypes.c_uint64),
        ("stranger_drops", ctypes.c_uint64),
        ("control_bytes_sent", ctypes.c_uint64),
        ("control_bytes_recv", ctypes.c_uint64),
    ]


class CodecTraits(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("id", ctypes.c_uint32),
        ("name", ctypes.c_char_p),
        ("summable", ctypes.c_int),
        ("error_feedback", ctypes.c_int),
        ("randomized", ctypes.c_int),
        ("bits_per_element", ctypes.c_double),
        ("fixed_size", ctypes.c_int),
        ("segment_align", ctypes.c_size_t),
        ("segment_options", ctypes.c_int),
    ]


class WireInfo(ctypes.Structure):
    _fields_ = [
        ("codec_id", ctypes.c_uint32),
        ("count", ctypes.c_uint64),
        ("payload_len", ctypes.c_uint64),
    ]


class PsConfig(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("num_servers", ctypes.c_int),
        ("chunk_bytes", ctypes.c_size_t),
        ("vnodes", ctypes.c_int),
        ("mode", ctypes.c_int),
        ("quorum", ctypes.c_int),
        ("staleness", ctypes.c_int),
        ("max_staleness", ctypes.c_int),
        ("lr_scale", ctypes.c_int),
        ("update", ctypes.c_int),
        ("lr", ctypes.c_float),
        ("momentum", ctypes.c_float),
        ("aggregator", ctypes.c_char_p),
        ("deadline_ms", ctypes.c_int),
        ("replicas", ctypes.c_int),
        ("partition_bytes", ctypes.c_size_t),
        ("window", ctypes.c_int),
        ("colocate", ctypes.c_int),
        # appended in 0.5
        ("stale_rule", ctypes.c_int),
        ("dc_lambda", ctypes.c_float),
        ("lr_schedule", ctypes.c_int),
        ("lr_steps", ctypes.c_uint64),
        ("lr_warmup", ctypes.c_uint64),
    ]


class PsStats(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t)] + [
        (n, ctypes.c_uint64) for n in (
            "pushes", "pulls", "stale_refused", "pushes_applied", "steps_closed",
            "late_dropped", "refused_stale", "refused_key", "refused_step",
            "refused_role", "refused_corrupt", "staleness_max")
    ] + [("staleness_mean", ctypes.c_double), ("workers_lost", ctypes.c_uint64),
         ("refused_nonfinite", ctypes.c_uint64), ("deadline_closes", ctypes.c_uint64),
         ("replicated", ctypes.c_uint64), ("takeovers", ctypes.c_uint64),
         ("duplicates", ctypes.c_uint64), ("dc_copy_bytes", ctypes.c_uint64),
         ("refused_window", ctypes.c_uint64)]


P = ctypes.POINTER
_vp = ctypes.c_void_p
_sz = ctypes.c_size_t
_int = ctypes.c_int
_u64 = ctypes.c_uint64
_str = ctypes.c_char_p

# name: (restype, [argtypes]) -- every TERSE_API function of terse.h.
PROTOTYPES = {
    "terse_version": (ctypes.c_uint, []),
    "terse_version_string": (_str, []),
    "terse_strerror": (_str, [status]),
    "terse_status_name": (_str, [status]),
    "terse_last_error": (_str, []),
    # codecs
    "terse_codec_create": (status, [_str, _sz, _sz, P(handle)]),
    "terse_codec_free": (None, [handle]),
    "terse_codec_bound": (_sz, [handle]),
    "terse_codec_elements": (_sz, [handle]),
    "terse_codec_spec": (_str, [handle]),
    "terse_codec_set_stream": (status, [handle, _u64, ctypes.c_uint32]),
    "terse_codec_step": (_u64, [handle]),
    "terse_encode": (status, [handle, _vp, _vp, _sz, c_size_p]),
    "terse_decode": (status, [handle, _vp, _sz, _vp, ctypes.c_float, _int]),
    "terse_codec_get_traits": (status, [handle, P(CodecTraits)]),
    "terse_codec_state_size": (_sz, [handle]),
    "terse_codec_state_save": (status, [handle, _vp, _sz, c_size_p]),
    "terse_codec_state_load": (status, [handle, _vp, _sz]),
    "terse_codec_reset_residual": (None, [handle]),
    "terse_codec_residual": (c_float_p, [handle]),
    "terse_wire_inspect": (status, [_vp, _sz, P(WireInfo)]),
    # communicator
    "terse_comm_init": (status, [P(CommConfig), P(handle)]),
    "terse_comm_free": (None, [handle]),
    "terse_comm_rank": (_int, [handle]),
    "terse_comm_size": (_int, [handle]),
    "terse_comm_provider": (_str, [handle]),
    "terse_comm_topology": (status, [handle, P(_int), P(_int), P(_int), P(_int)]),
    "terse_comm_host_of": (_int, [handle, _int]),
    "terse_allreduce": (status, [handle, _vp, _sz, handle, _int]),
    "terse_allreduce_algorithm": (_str, [handle, handle, _sz]),
    "terse_broadcast": (status, [handle, _vp, _sz, _int]),
    "terse_allgather": (status, [handle, _vp, _sz, _vp, _sz, c_size_p]),
    "terse_barrier": (status, [handle]),
    "terse_allreduce_start": (status, [handle, _vp, _sz, handle, _int, P(handle)]),
    "terse_broadcast_start": (status, [handle, _vp, _sz, _int, P(handle)]),
    "terse_allgather_start": (status, [handle, _vp, _sz, _vp, _sz, c_size_p, P(handle)]),
    "terse_barrier_start": (status, [handle, P(handle)]),
    "terse_request_test": (status, [handle, P(_int)]),
    "terse_request_wait": (status, [handle]),
    "terse_request_free": (None, [handle]),
    "terse_group_start": (status, [handle]),
    "terse_group_end": (status, [handle]),
    "terse_comm_abort": (None, [handle]),
    "terse_comm_get_stats": (status, [handle, P(CommStats)]),
    "terse_comm_reset_stats": (None, [handle]),
    # parameter server
    "terse_ps_config_parse": (status, [_str, P(PsConfig)]),
    "terse_ps_aggregator_check": (status, [_str, ctypes.c_int]),
    "terse_ps_create": (status, [handle, P(PsConfig), P(handle)]),
    "terse_ps_is_server": (_int, [handle]),
    "terse_ps_declare": (status, [handle, _sz, _sz, _str, _str, _vp]),
    "terse_ps_set_priority": (status, [handle, _sz, ctypes.c_int]),
    "terse_ps_push": (status, [handle, _sz, _vp, P(handle)]),
    "terse_ps_push_weighted": (status, [handle, _sz, _vp, ctypes.c_double, P(handle)]),
    "terse_ps_pull": (status, [handle, _sz, _vp, P(handle)]),
    "terse_ps_pushpull": (status, [handle, _sz, _vp, P(handle)]),
    "terse_ps_clock": (status, [handle]),
    "terse_ps_worker_clock": (_u64, [handle]),
    "terse_ps_finish": (status, [handle]),
    "terse_ps_serve": (status, [handle]),
    "terse_ps_placement": (status, [handle, P(_u64)]),
    "terse_ps_chunk_server": (_int, [handle, _sz, _sz]),
    "terse_ps_get_stats": (status, [handle, P(PsStats)]),
    "terse_ps_free": (None, [handle]),
    # registry
    "terse_codec_count": (_sz, []),
    "terse_codec_name": (_str, [_sz]),
}


def declare(lib):
    missing = []
    for name, (res, args) in PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.restype = res
        fn.argtypes = args
    if missing:
        raise ImportError("terse: the loaded library lacks " + ", ".join(missing)
                          + " (an older libterse?)")
