"""Shared helpers: real rank processes on loopback."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYROOT = os.path.dirname(HERE)
REPO = os.path.dirname(PYROOT)
PYTHON = "/usr/bin/python3"  # Debian's torch imports only here

sys.path.insert(0, PYROOT)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = PYROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    for k in ("TERSE_RANK", "TERSE_SIZE", "TERSE_ADDR", "TERSE_TOKEN", "RANK",
              "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


class Ranks:
    """n processes of PYTHON script args, each with its rank in the
    environment (terse's and torch's variables both), output in tmp."""

    def __init__(self, tmp, script, n, args=(), env=None, torch_dist=False):
        self.n = n
        self.procs, self.outs = [], []
        port = free_port()
        for r in range(n):
            e = base_env()
            e.update({"TERSE_RANK": str(r), "TERSE_SIZE": str(n),
                      "TERSE_ADDR": "127.0.0.1:%d" % port,
                      "TERSE_TOKEN": "pytest-token-0123456789abcdef"})
            if torch_dist:
                # torch's store on MASTER_PORT; terse.torch picks its own port.
                e.update({"RANK": str(r), "WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
                          "MASTER_PORT": str(port)})
                del e["TERSE_ADDR"], e["TERSE_TOKEN"], e["TERSE_RANK"], e["TERSE_SIZE"]
            if env:
                e.update(env)
            out = os.path.join(str(tmp), "rank%d.json" % r)
            log = open(os.path.join(str(tmp), "rank%d.log" % r), "wb")
            self.outs.append((out, log))
            self.procs.append(subprocess.Popen(
                [PYTHON, os.path.join(HERE, script), out] + [str(a) for a in args],
                env=e, stdout=log, stderr=subprocess.STDOUT))

    def remove_shm(self):
        # libfabric shm names its regions /dev/shm/<pid>:<n>:<m>; a process
        # that was killed (or left by os._exit) cannot remove them, and a
        # later process that reuses the pid then fails in fi_enable (EBUSY).
        for p in self.procs:
            if p.poll() is None:
                continue
            prefix = "%d:" % p.pid
            try:
                names = os.listdir("/dev/shm")
            except OSError:
                return
            for n in names:
                if n.startswith(prefix):
                    try:
                        os.unlink(os.path.join("/dev/shm", n))
                    except OSError:
                        pass

    def wait(self, timeout=120):
        deadline = time.monotonic() + timeout
        rcs = []
        for p in self.procs:
            try:
                rcs.append(p.wait(max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                for q in self.procs:
                    q.kill()
                for q in self.procs:
                    q.wait()
                self.remove_shm()
                pytest.fail("rank processes still running after %d s:\n%s" % (timeout, self.logs()))
        self.rcs = rcs
        self.remove_shm()
        return rcs

    def logs(self):
        text = []
        for r, (_, log) in enumerate(self.outs):
            log.flush()
            with open(log.name, "rb") as f:
                text.append("--- rank %d ---\n%s" % (r, f.read().decode(errors="replace")[-4000:]))
        return "\n".join(text)

    def results(self, expect_ok=True, timeout=120):
        rcs = self.wait(timeout)
        if expect_ok and any(rcs):
            pytest.fail("rank exit codes %s:\n%s" % (rcs, self.logs()))
        res = []
        for out, _ in self.outs:
            if os.path.exists(out):
                with open(out) as f:
                    res.append(json.load(f))
            else:
                res.append(None)
        return res


@pytest.fixture
def ranks(tmp_path):
    made = []

    def start(script, n, args=(), env=None, torch_dist=False):
        r = Ranks(tmp_path, script, n, args, env, torch_dist)
        made.append(r)
        return r
    yield start
    for r in made:
        for p in r.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        r.remove_shm()
