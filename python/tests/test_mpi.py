"""terse.Comm.from_mpi: real rank processes started by Open MPI's mpirun
(Debian's openmpi-bin and python3-mpi4py), each joining terse through its
mpi4py communicator."""
import glob
import json
import os
import shutil
import subprocess

import pytest

from conftest import HERE, PYTHON, base_env

MPIRUN = shutil.which("mpirun")


def have_mpi4py():
    r = subprocess.run([PYTHON, "-c", "import mpi4py"], capture_output=True)
    return r.returncode == 0


pytestmark = pytest.mark.skipif(
    not MPIRUN or not have_mpi4py(),
    reason="needs mpirun and mpi4py (apt-get install openmpi-bin python3-mpi4py)")


def mpirun(tmp_path, n, scenario, timeout=90):
    env = base_env()
    for k in list(env):
        if k.startswith(("OMPI_", "PMIX_")):
            del env[k]
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(n),
           "--mca", "btl", "self,vader,tcp", PYTHON,
           os.path.join(HERE, "mpi_worker.py"), str(tmp_path), scenario]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    res = {}
    for f in glob.glob(os.path.join(str(tmp_path), "rank*.json")):
        with open(f) as fh:
            r = json.load(fh)
        res[r["world_rank"]] = r
    assert len(res) == n, "mpirun exit %d, %d of %d ranks reported:\n%s\n%s" % (
        p.returncode, len(res), n, p.stdout[-3000:], p.stderr[-3000:])
    return res


def test_from_mpi_joins_the_world_with_mpis_ranks(tmp_path):
    res = mpirun(tmp_path, 3, "world")
    for w, r in res.items():
        assert "error" not in r, r
        assert (r["rank"], r["size"]) == (w, 3)
        assert r["topology"] == [0, w, 3, 1]  # one host; local ranks as MPI's
        assert r["sum_ok"]


def test_from_mpi_over_a_split_communicator_makes_one_job_per_half(tmp_path):
    res = mpirun(tmp_path, 4, "split")
    for w, r in res.items():
        assert "error" not in r, r
        assert (r["rank"], r["size"], r["mpi_rank"]) == (w // 2, 2, w // 2)
        assert r["sum_ok"]
        # the even half sums world ranks 0 + 2, the odd one 1 + 3
        assert r["half_sum"] == (2.0 if w % 2 == 0 else 4.0)


def test_from_mpi_rank_0s_bad_address_is_every_ranks_error(tmp_path):
    res = mpirun(tmp_path, 2, "bad-addr")
    for r in res.values():
        assert r.get("error", "").startswith("ValueError: terse.Comm.from_mpi: rank 0 cannot "
                                             "set up the job: the host 'no-such-host.invalid' "
                                             "does not resolve"), r


def test_from_mpi_refuses_what_is_no_communicator(tmp_path):
    res = mpirun(tmp_path, 1, "not-a-comm")
    assert res[0]["error"].startswith("TypeError: terse.Comm.from_mpi: comm must be an mpi4py "
                                      "communicator"), res[0]


def test_from_mpi_will_not_send_a_token_over_mpi_under_seal(tmp_path):
    res = mpirun(tmp_path, 2, "seal-no-token")
    for r in res.values():
        assert "TERSE_WIRE=seal, but no rank has a token" in r.get("error", ""), r


def test_from_mpi_refuses_a_token_that_only_some_ranks_have(tmp_path):
    res = mpirun(tmp_path, 3, "token-on-rank-0-only")
    for r in res.values():
        assert "ranks [0] have a token (token= or TERSE_TOKEN) and ranks [1, 2] do not" in \
            r.get("error", ""), r


def test_from_mpi_under_seal_with_every_ranks_terse_token(tmp_path):
    res = mpirun(tmp_path, 2, "seal-env-token")
    for w, r in res.items():
        assert "error" not in r, r
        assert r["rank"] == w and r["sum_ok"]
