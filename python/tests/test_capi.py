"""The ctypes declarations against include/terse.h, and the loader."""
import os
import re
import subprocess

import terse
from terse import _capi
from conftest import REPO, PYTHON, base_env


def test_every_public_function_is_declared():
    with open(os.path.join(REPO, "include", "terse.h")) as f:
        hdr = f.read()
    names = set(re.findall(r"TERSE_API\s+[^;(]*?\b(terse_\w+)\s*\(", hdr))
    assert len(names) > 50
    assert names == set(_capi.PROTOTYPES), (names ^ set(_capi.PROTOTYPES))
    for n in names:
        assert getattr(terse._lib, n).argtypes is not None


def test_struct_sizes_match_the_c_abi():
    # Each struct's size field is checked by the library; a mismatch fails calls.
    s = _capi.CommStats()
    assert _capi.CommStats.size.offset == 0
    assert ctypes_size(s) == 8 + 5 * 8 + 2 * 8 + 8


def ctypes_size(x):
    import ctypes
    return ctypes.sizeof(x)


def test_version_and_statuses():
    assert terse.version() == terse.__version__
    assert re.match(r"\d+\.\d+\.\d+$", terse.version())
    assert terse.OK == 0 and terse.ERR_PEER_LOST == 15 and terse.ERR_STALE == 20
    e = terse.Error(terse.ERR_TIMEOUT, "rank 3 is slow")
    assert e.name == "TERSE_ERR_TIMEOUT" and e.strerror == "operation timed out"
    assert "rank 3 is slow" in str(e)


def test_library_search_order():
    env = base_env()
    env["TERSE_LIBRARY"] = "/nonexistent/libterse.so.0"
    p = subprocess.run([PYTHON, "-c", "import terse"], env=env, capture_output=True, text=True)
    assert p.returncode != 0 and "TERSE_LIBRARY=/nonexistent" in p.stderr
    env.pop("TERSE_LIBRARY")
    p = subprocess.run([PYTHON, "-c", "import terse; print(terse.library_found_in)"], env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
