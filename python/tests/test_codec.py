"""terse.Codec from numpy, against the C library's own results (codec_pipe)."""
import os
import re
import struct
import subprocess

import numpy as np
import pytest

import terse
from conftest import REPO

PIPE = os.environ.get("TERSE_CODEC_PIPE") or os.path.join(REPO, "build", "tests", "codec_pipe")

SPECS = ["none", "fp16", "bf16", "int8", "int8:bucket=64,ef=1", "qsgd", "qsgd:bits=2,ef=1",
         "terngrad", "sign:ef=1", "topk:ratio=0.05,ef=1", "randk:ratio=0.1,seed=3",
         "powersgd:rank=2,ef=1", "vq:ef=1"]


def c_side(spec, x, rows, cols, tensor, rank, steps):
    if not os.path.exists(PIPE):
        pytest.fail("codec_pipe not found at %s: build the tree (./terse.sh build) or set "
                    "TERSE_CODEC_PIPE" % PIPE)
    p = subprocess.run([PIPE, spec, str(rows), str(cols), str(tensor), str(rank), str(steps)],
                       input=x.tobytes(), capture_output=True, check=True)
    data, msgs, off = p.stdout, [], 0
    for _ in range(steps):
        (n,) = struct.unpack_from("<Q", data, off)
        msgs.append(data[off + 8: off + 8 + n])
        off += 8 + n
    return msgs, np.frombuffer(data[off:], np.float32)


@pytest.mark.parametrize("spec", SPECS)
def test_messages_and_decodes_equal_the_c_library(spec):
    rows, cols = 48, 40
    x = np.random.default_rng(1).standard_normal(rows * cols).astype(np.float32)
    want, want_dec = c_side(spec, x, rows, cols, 5, 1, 3)
    with terse.Codec(spec, rows, cols) as c:
        c.set_stream(5, 1)
        got = [c.encode(x) for _ in range(3)]
        assert c.step == 3
        assert got == want  # bitwise, error feedback and streams included
        dec = c.decode(got[-1])
        assert np.array_equal(dec, want_dec)
        # alpha and accumulate
        acc = np.ones(rows * cols, np.float32)
        c.decode(got[-1], out=acc, alpha=0.5, accumulate=True)
        assert np.allclose(acc, 1 + 0.5 * want_dec, atol=1e-6)
        assert len(got[0]) <= c.bound


def test_fp16_equals_numpy():
    x = np.random.default_rng(2).standard_normal(1000).astype(np.float32) * 100
    with terse.Codec("fp16", 1000) as c:
        assert np.array_equal(c.decode(c.encode(x)), x.astype(np.float16).astype(np.float32))


def test_traits_spec_and_registry():
    assert "powersgd" in terse.codecs() and "topk" in terse.codecs()
    with terse.Codec("randk:ratio=0.1", 100) as c:
        t = c.traits
        assert t["name"] == "randk" and t["summable"] and not t["error_feedback"]
    with terse.Codec("qsgd:ef=1", 100) as c:
        assert c.spec.startswith("qsgd:bits=4,bucket=512,lsq=1,round=nearest")
        assert c.traits["error_feedback"] and c.elements == 100
        assert re.match(r"<terse.Codec qsgd:.* 100x1>", repr(c))


def test_state_save_load_resumes_bitwise():
    x = np.random.default_rng(3).standard_normal(2000).astype(np.float32)
    with terse.Codec("topk:ratio=0.01,ef=1", 40, 50) as a, \
            terse.Codec("topk:ratio=0.01,ef=1", 40, 50) as b:
        a.encode(x)
        a.encode(x * 2)
        b.load_state(a.state())
        assert np.array_equal(a.residual(), b.residual())
        assert a.encode(x) == b.encode(x)
        a.reset_residual()
        assert not a.residual().any()


def test_bad_input_raises_specific_errors():
    x = np.zeros(100, np.float32)
    with pytest.raises(terse.Error) as e:
        terse.Codec("int8:bucket=3", 100)
    assert e.value.name == "TERSE_ERR_INVALID" and "bucket" in e.value.detail
    with pytest.raises(terse.Error, match="unknown codec 'zstd'") as e:
        terse.Codec("zstd", 100)
    # the sentence lists the codecs there are
    assert "known: none, fp16, bf16, int8, qsgd" in e.value.detail, e.value.detail
    with pytest.raises(ValueError, match="rows"):
        terse.Codec("fp16", 0)
    with pytest.raises(TypeError, match="rows"):
        terse.Codec("fp16", 2.5)
    with pytest.raises(TypeError, match="spec"):
        terse.Codec(None, 10)
    with terse.Codec("int8", 100) as c:
        m = c.encode(np.arange(100, dtype=np.float32))
        with pytest.raises(ValueError, match="99 elements, not the 100"):
            c.encode(np.zeros(99, np.float32))
        with pytest.raises(TypeError, match="float32"):
            c.encode(np.zeros(100, np.float64))
        with pytest.raises(TypeError, match="numpy"):
            c.encode(list(range(100)))
        with pytest.raises(terse.Error) as e:
            c.decode(m[:-1], x)
        assert e.value.status == terse.ERR_TRUNCATED
        bad = bytearray(m)
        bad[40] ^= 1
        with pytest.raises(terse.Error) as e:
            c.decode(bytes(bad), x)
        assert e.value.status == terse.ERR_CORRUPT
        assert not x.any()  # a message that fails its checksum never touches dst
        with pytest.raises(terse.Error) as e:
            c.decode(b"garbage" * 10, x)
        assert e.value.status == terse.ERR_MAGIC
        with pytest.raises(terse.Error) as e:
            c.load_state(b"\0" * 64)
        assert e.value.status in (terse.ERR_MAGIC, terse.ERR_TRUNCATED, terse.ERR_CORRUPT)
        with terse.Codec("fp16", 100) as other:
            with pytest.raises(terse.Error) as e:
                other.decode(m, x)
            assert e.value.status == terse.ERR_CODEC_MISMATCH
    with pytest.raises(ValueError, match="closed"):
        c.encode(x)
    assert terse.inspect(m)["count"] == 100
