"""The ctypes declarations against include/terse.h and the compiled ABI,
and the loader's search order."""
import ctypes
import os
import re
import shutil
import subprocess

import pytest

import terse
from terse import _capi
from conftest import REPO, PYROOT, PYTHON, base_env
from test_codec import PIPE

HEADER = os.path.join(REPO, "include", "terse.h")


def prototypes():
    """{name: number of parameters} of every TERSE_API function in terse.h."""
    with open(HEADER) as f:
        hdr = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    out = {}
    for m in re.finditer(r"TERSE_API\s+[^;{]*?\b(terse_\w+)\s*\(([^)]*)\)\s*;", hdr):
        params = m.group(2).strip()
        out[m.group(1)] = 0 if params in ("", "void") else params.count(",") + 1
    return out


def test_every_public_function_is_declared_with_its_arity():
    protos = prototypes()
    assert len(protos) > 50
    assert set(protos) == set(_capi.PROTOTYPES), set(protos) ^ set(_capi.PROTOTYPES)
    for name, nargs in protos.items():
        assert len(_capi.PROTOTYPES[name][1]) == nargs, name
        assert getattr(terse._lib, name).argtypes == _capi.PROTOTYPES[name][1]


STRUCTS = {"terse_comm_config": _capi.CommConfig, "terse_comm_stats": _capi.CommStats,
           "terse_codec_traits": _capi.CodecTraits, "terse_wire_info": _capi.WireInfo,
           "terse_ps_config": _capi.PsConfig, "terse_ps_stats": _capi.PsStats}


def test_struct_layouts_equal_the_compiled_c_structs():
    if not os.path.exists(PIPE):
        pytest.fail("codec_pipe not found at %s (build the tree or set TERSE_CODEC_PIPE)" % PIPE)
    lines = subprocess.run([PIPE, "--abi"], capture_output=True, text=True,
                           check=True).stdout.split("\n")
    seen = {}
    for line in filter(None, lines):
        struct, field, value = line.split()
        seen.setdefault(struct, {})[field] = int(value)
    assert set(seen) == set(STRUCTS)
    for cname, py in STRUCTS.items():
        c = seen[cname]
        assert ctypes.sizeof(py) == c.pop("-"), cname
        assert {f: getattr(py, f).offset for f, _ in py._fields_} == c, cname


def test_version_and_statuses():
    assert terse.version() == terse.__version__
    assert re.match(r"\d+\.\d+\.\d+$", terse.version())
    assert terse.OK == 0 and terse.ERR_PEER_LOST == 15 and terse.ERR_STALE == 20
    with open(HEADER) as f:
        listed = re.findall(r"X\((TERSE_\w+), (\d+),", f.read())
    assert {int(v): n for n, v in listed} == terse.STATUS_NAMES
    assert not hasattr(terse, "ERR_UNKNOWN")
    e = terse.Error(terse.ERR_TIMEOUT, "rank 3 is slow")
    assert e.name == "TERSE_ERR_TIMEOUT" and e.strerror == "operation timed out"
    assert "rank 3 is slow" in str(e)


def found(pkg_parent, env_lib=None):
    env = base_env()
    env["PYTHONPATH"] = pkg_parent
    env.pop("TERSE_LIBRARY", None)
    if env_lib:
        env["TERSE_LIBRARY"] = env_lib
    env["LD_LIBRARY_PATH"] = ""
    p = subprocess.run([PYTHON, "-c", "import terse; print(terse.library_found_in, '|', "
                        "terse.library_path)"], env=env, capture_output=True, text=True,
                       cwd="/")
    return p.returncode, (p.stdout.strip() or p.stderr.strip().splitlines()[-1])


def test_library_search_order(tmp_path):
    lib = terse.library_path
    root = tmp_path / "tree"
    shutil.copytree(os.path.join(PYROOT, "terse"), root / "python" / "terse",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so*"))
    pkg_parent = str(root / "python")
    # nothing anywhere (unless the system has one installed)
    rc, got = found(pkg_parent)
    assert (rc != 0 and "libterse not found" in got) or got.startswith("the system")
    # the build tree
    (root / "build").mkdir()
    shutil.copy(lib, root / "build" / "libterse.so.0")
    rc, got = found(pkg_parent)
    assert rc == 0 and got == "the build tree | %s" % (root / "build" / "libterse.so.0")
    # beside the package beats the build tree
    shutil.copy(lib, root / "python" / "libterse.so.0")
    rc, got = found(pkg_parent)
    assert rc == 0 and got == "beside the package | %s" % (root / "python" / "libterse.so.0")
    # TERSE_LIBRARY beats both, and a bad one is an error, not a fallback
    rc, got = found(pkg_parent, str(root / "build" / "libterse.so.0"))
    assert rc == 0 and got.startswith("TERSE_LIBRARY |")
    rc, got = found(pkg_parent, "/nonexistent/libterse.so.0")
    assert rc != 0 and "TERSE_LIBRARY=/nonexistent/libterse.so.0: no such file" in got
