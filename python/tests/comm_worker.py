"""One rank of test_comm.py: OUT SCENARIO PROVIDER. Writes a JSON result."""
import hashlib
import json
import os
import signal
import sys
import time

import numpy as np

import terse

out, scenario, provider = sys.argv[1], sys.argv[2], sys.argv[3]
res = {}


def digest(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def done():
    with open(out, "w") as f:
        json.dump(res, f)


comm = terse.Comm(provider=provider, timeout_ms=int(os.environ.get("T_TIMEOUT", "20000")))
r, n = comm.rank, comm.size
res["rank"], res["size"], res["provider"] = r, n, comm.provider
res["topology"] = [comm.host_index, comm.local_rank, comm.local_size, comm.num_hosts]

if scenario == "collectives":
    N = 100003
    base = (np.arange(N) % 4096).astype(np.float32) * 0.5  # sums exact in fp32
    x = base + r
    comm.allreduce(x)                                      # sum
    res["sum_ok"] = bool(np.array_equal(x, base * n + sum(range(n))))
    y = base * (r + 1)
    comm.allreduce(y, op="avg")
    res["avg_err"] = float(np.abs(y - base * (n + 1) / 2).max())
    res["avg_digest"] = digest(y)
    # compressed, with error feedback
    rng = np.random.default_rng(7 + r)
    g = rng.standard_normal(N).astype(np.float32)
    allg = [np.random.default_rng(7 + k).standard_normal(N).astype(np.float32) for k in range(n)]
    with terse.Codec("int8:ef=1", N) as c:
        c.set_stream(0, r)
        res["int8_algo"] = comm.allreduce_algorithm(N, c)
        gg = g.copy()
        comm.allreduce(gg, codec=c, op="avg")
        res["int8_err"] = float(np.abs(gg - sum(allg) / n).max())
        res["int8_digest"] = digest(gg)
        res["int8_residual"] = c.residual() is not None and bool(np.abs(c.residual()).max() > 0)
    # broadcast of other dtypes and byte buffers
    b = np.full(1000, r, dtype=np.int32) if r else np.arange(1000, dtype=np.int32)
    comm.broadcast(b, root=0)
    res["bcast_ok"] = bool(np.array_equal(b, np.arange(1000, dtype=np.int32)))
    ba = bytearray(b"rank%02d" % r) if r != 1 else bytearray(b"RANK!!")
    comm.broadcast(ba, root=1)
    res["bcast_bytes"] = ba.decode()
    # allgather of variable sizes
    parts = comm.allgather(b"x" * (r + 1) + bytes([65 + r]))
    res["gather_ok"] = parts == [b"x" * (k + 1) + bytes([65 + k]) for k in range(n)]
    comm.barrier()
    # non-blocking: four requests, waited in reverse order, equal the blocking calls
    bufs = [base * (k + 1) + r for k in range(4)]
    reqs = [comm.allreduce_start(bb, op="sum") for bb in bufs]
    for q in reversed(reqs):
        assert q.wait() is not None
    res["nb_ok"] = all(np.array_equal(bufs[k], (base * (k + 1)) * n + sum(range(n)))
                       for k in range(4))
    # grouped small dense allreduces, and a torch tensor
    smalls = [np.full(10, float(r + k), np.float32) for k in range(50)]
    with comm.group():
        reqs = [comm.allreduce_start(s) for s in smalls]
    for q in reqs:
        q.wait()
    res["group_ok"] = all(np.all(smalls[k] == sum(range(n)) + n * k) for k in range(50))
    q = comm.barrier_start()
    while not q.test():
        time.sleep(0.001)
    g2 = comm.allgather_start(bytes([r]) * 3, recv_cap=3 * n).wait()
    res["gather_nb_ok"] = g2 == [bytes([k]) * 3 for k in range(n)]
    try:
        import torch
        t = torch.full((1000,), float(r))
        comm.allreduce(t)
        res["torch_ok"] = bool(torch.all(t == sum(range(n))))
    except ImportError:
        res["torch_ok"] = "no torch"
    st = comm.stats()
    res["stats_ops"] = st["ops"]
    res["stats_bytes"] = st["payload_bytes_sent"]
    comm.close()
    done()

elif scenario == "abort":
    x = np.ones(1000, np.float32)
    comm.allreduce(x)
    if r == 0:
        comm.abort()
        try:
            comm.allreduce(x)
            res["status"] = "OK"
        except terse.Error as e:
            res["status"] = e.name
        comm.close()   # tells rank 1 this rank is gone
    else:
        t0 = time.monotonic()
        try:
            comm.allreduce(x)
            res["status"] = "OK"
        except terse.Error as e:
            res["status"] = e.name
            res["detail"] = e.detail
        res["seconds"] = time.monotonic() - t0
        comm.close()
    done()

elif scenario == "killed":
    x = np.ones(1 << 20, np.float32)
    comm.allreduce(x)
    if r == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    res["status"] = "OK"
    try:
        req = comm.allreduce_start(x)
        req.wait()
        for _ in range(1000):
            comm.allreduce(x)
    except terse.Error as e:
        res["status"] = e.name
        res["detail"] = str(e)
    res["seconds"] = time.monotonic() - t0
    comm.close()
    done()
elif scenario == "ps":
    # rank 0 serves; ranks 1 and 2 push rank-valued gradients under sync SGD,
    # key 0 in 5 partitions of 4 KiB, 2 of them in flight each way, key 1 first
    with terse.PS(comm, num_servers=1, mode="sync", update="sgd", lr=0.1, chunk_bytes=4096,
                  partition_bytes=4096, window=2) as ps:
        N = 5000
        ps.declare(0, N, init=np.ones(N, np.float32))
        ps.declare(1, 300, push="int8:ef=1")
        if not ps.is_server:
            ps.set_priority(1, 3)
        res["is_server"] = ps.is_server
        res["placement"] = ps.placement()
        if ps.is_server:
            ps.serve()
            st = ps.stats()
            res["applied"], res["closed"] = st["pushes_applied"], st["steps_closed"]
        else:
            # sync: every key is pushed (and pulled) at every step
            x = np.full(N, float(r), np.float32)
            y = np.ones(300, np.float32)
            ps.pushpull(0, x)                       # x = 1 - 0.1 * mean(1, 2)
            ps.push(1, y)
            ps.pull(1, y)
            res["step1"] = float(x[0])
            ps.clock()
            g = np.full(N, float(r), np.float32)
            y2 = np.ones(300, np.float32)
            reqs = [ps.pushpull(0, g, block=False), ps.pushpull(1, y2, block=False)]
            for q in reversed(reqs):                # requests, waited in any order
                q.wait()
            res["step2"] = float(g[0])
            res["digest"] = digest(g)
            res["key1"] = float(y2[0])
            ps.clock()
            w3 = np.full(N, float(r), np.float32)   # weighted by r: (1*1 + 2*2) / 3
            ps.push(0, w3, weight=r)
            ps.pull(0, w3)
            res["step3"] = float(w3[0])
            ps.clock()
            try:
                ps.push(7, g)
                res["badkey"] = "no error"
            except ValueError as e:
                res["badkey"] = str(e)
            res["clock"] = ps.worker_clock
            res["pushes"] = ps.stats()["pushes"]
            ps.finish()
    comm.close()
    done()
elif scenario == "ps_colocate":
    # every rank a worker and a server: sync SGD, rank-valued gradients
    with terse.PS(comm, mode="sync", update="sgd", lr=0.1, chunk_bytes=4096,
                  partition_bytes=4096, colocate=True) as ps:
        N = 5000
        ps.declare(0, N, init=np.ones(N, np.float32))
        res["is_server"] = ps.is_server
        res["placement"] = ps.placement()
        x = np.full(N, float(r), np.float32)
        ps.pushpull(0, x)                           # 1 - 0.1 * mean(0, 1, 2)
        res["step1"] = float(x[0])
        ps.clock()
        g = np.full(N, float(r), np.float32)
        ps.pushpull(0, g, block=False).wait()
        res["step2"] = float(g[0])
        res["digest"] = digest(g)
        try:
            ps.serve()
            res["serve"] = "no error"
        except terse.Error as e:
            res["serve"] = str(e)
        ps.finish()
    comm.close()
    done()
elif scenario == "ps_rules":
    # rank 0 serves; workers 1 and 2, async with delay compensation and a
    # staleness-aware step, on the server's cosine schedule. Worker 1
    # pulls, worker 2 pushes twice (pushpull), then worker 1 pushes (2
    # stale): each waits for the other's file, not for time.
    N = 256
    mark = os.path.join(os.path.dirname(out), "ps_rules.%d")
    with terse.PS(comm, num_servers=1, mode="async", update="sgd", lr=0.5, momentum=0.5,
                  stale_rule="dc+step", dc_lambda=1.0, lr_schedule="cosine", lr_steps=8,
                  lr_warmup=1) as ps:
        ps.declare(0, N)
        if ps.is_server:
            ps.serve()
            st = ps.stats()
            res["applied"], res["stale_max"] = st["pushes_applied"], st["staleness_max"]
            res["dc_copy_bytes"] = st["dc_copy_bytes"]
        else:
            other = 3 - r
            x = np.zeros(N, np.float32)
            if r == 1:
                ps.pull(0, x)
                open(mark % 1, "w").close()
                while not os.path.exists(mark % other):
                    time.sleep(0.01)
                g = np.full(N, 0.5, np.float32)
                ps.pushpull(0, g)
            else:
                while not os.path.exists(mark % other):
                    time.sleep(0.01)
                ps.pull(0, x)
                for _ in range(2):
                    g = np.full(N, 0.25, np.float32)
                    ps.pushpull(0, g)
                    ps.clock()
                open(mark % 2, "w").close()
            res["x"] = float(g[0])
            ps.finish()
    bad = {"nesterov": dict(mode="async", stale_rule="nesterov"),       # terse_ps_config_parse
           "dc_lambda -1": dict(mode="async", stale_rule="dc", dc_lambda=-1.0),  # create
           "\"update\" for sync": dict(mode="sync", stale_rule="step"),
           "\"dana\" (a momentum per worker) combines": dict(mode="async", stale_rule="dana+step")}
    for name, kw in bad.items():
        try:
            terse.PS(comm, num_servers=1, update="sgd", lr=0.1, **kw).close()
            res["bad " + name] = "accepted"
        except terse.Error as e:
            res["bad " + name] = e.detail
    comm.close()
    done()
else:
    sys.exit("unknown scenario " + scenario)
