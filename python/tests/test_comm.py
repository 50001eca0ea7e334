"""terse.Comm over real rank processes (tcp, i.e. libfabric's net, and shm on loopback)."""
import numpy as np
import pytest

import terse
from conftest import free_port


@pytest.mark.parametrize("provider,n", [("tcp", 2), ("shm", 2), ("tcp", 3)])
def test_collectives(ranks, provider, n):
    res = ranks("comm_worker.py", n, ["collectives", provider]).results()
    for r in res:
        assert r["size"] == n
        assert r["provider"] == ("shm" if provider == "shm" else "net")
        assert r["topology"] == [0, r["rank"], n, 1]  # one host
        assert r["sum_ok"] and r["avg_err"] < 1e-3
        assert r["int8_err"] < 0.05 and r["int8_residual"]
        assert r["int8_algo"] in ("gather", "gather-pipe")  # below 4 ranks: all-gather
        assert r["bcast_ok"] and r["bcast_bytes"] == "RANK!!"
        assert r["gather_ok"] and r["gather_nb_ok"] and r["nb_ok"] and r["group_ok"]
        assert r["torch_ok"] in (True, "no torch")
        assert r["stats_ops"] >= 10 and r["stats_bytes"] > 0
    # every rank holds bitwise the same results
    assert len({r["avg_digest"] for r in res}) == 1
    assert len({r["int8_digest"] for r in res}) == 1


def test_abort_fails_own_calls_and_tells_the_peer(ranks):
    res = ranks("comm_worker.py", 2, ["abort", "tcp"]).results()
    assert res[0]["status"] == "TERSE_ERR_ABORTED"
    assert res[1]["status"] == "TERSE_ERR_PEER_LOST"
    assert "rank 0" in res[1]["detail"]
    assert res[1]["seconds"] < 15


@pytest.mark.parametrize("provider", ["tcp", "shm"])
def test_killed_peer_raises_within_the_timeout(ranks, provider):
    rk = ranks("comm_worker.py", 2, ["killed", provider], env={"T_TIMEOUT": "3000"})
    res = rk.results(expect_ok=False)
    assert rk.rcs[1] == -9
    assert rk.rcs[0] == 0, rk.logs()
    assert res[0]["status"] in ("TERSE_ERR_PEER_LOST", "TERSE_ERR_TIMEOUT"), res[0]
    assert "rank 1" in res[0]["detail"]
    # far below the 60 s default, with room for a machine the suite loads
    assert res[0]["seconds"] < 3.0 + 7.0


def one_rank():
    return terse.Comm(rank=0, size=1, addr="127.0.0.1:%d" % free_port(), provider="tcp")


def test_single_rank_and_bad_buffers():
    with one_rank() as comm:
        assert comm.size == 1 and comm.rank == 0
        x = np.arange(10, dtype=np.float32)
        comm.allreduce(x, op="avg")
        assert np.array_equal(x, np.arange(10, dtype=np.float32))
        with pytest.raises(TypeError, match="float32"):
            comm.allreduce(np.zeros(4))
        with pytest.raises(TypeError, match="contiguous"):
            comm.allreduce(np.zeros(8, np.float32)[::2])
        ro = np.zeros(4, np.float32)
        ro.flags.writeable = False
        with pytest.raises(TypeError, match="writable"):
            comm.allreduce(ro)
        with pytest.raises(TypeError, match="list"):
            comm.allreduce([1.0, 2.0])
        with pytest.raises(ValueError, match="op"):
            comm.allreduce(x, op="max")
        with terse.Codec("fp16", 5) as c:
            with pytest.raises(ValueError, match="5 elements"):
                comm.allreduce(x, codec=c)
        with pytest.raises(TypeError, match="terse.Codec"):
            comm.allreduce(x, codec="fp16")
        assert comm.allreduce_algorithm(10) == "local"
        with terse.Codec("int8", 10) as c:
            assert comm.allreduce_algorithm(10, c) == "gather"
        with terse.Codec("powersgd:rank=2", 10) as c:
            assert comm.allreduce_algorithm(10, c) == "rounds"
    with pytest.raises(ValueError, match="closed"):
        comm.barrier()


def test_torch_tensor_checks():
    torch = pytest.importorskip("torch")
    with one_rank() as comm:
        comm.allreduce(torch.ones(8))
        with pytest.raises(TypeError, match="float32"):
            comm.allreduce(torch.ones(8, dtype=torch.float64))
        with pytest.raises(TypeError, match="contiguous"):
            comm.allreduce(torch.ones(4, 4).t())
        with pytest.raises(TypeError, match="requires grad"):
            comm.allreduce(torch.ones(4, requires_grad=True))


def test_bad_config_raises_named_status():
    with pytest.raises(terse.Error) as e:
        terse.Comm(rank=0, size=2, addr="127.0.0.1:%d" % free_port(), provider="tcp",
                   token="short", init_timeout_ms=1000)
    assert e.value.name == "TERSE_ERR_INVALID"
    assert "16" in e.value.detail
    with pytest.raises(terse.Error) as e:
        terse.Comm(rank=0, size=1, addr="127.0.0.1:1", provider="carrier-pigeon")
    assert e.value.status == terse.ERR_INVALID


def test_requests_inside_a_group_stay_owned_until_it_ends():
    with one_rank() as comm:
        x = np.ones(100, np.float32)
        c = terse.Codec("int8", 100)
        comm.group().__enter__()
        r = comm.allreduce_start(x, codec=c)
        with pytest.raises(terse.Error) as e:
            r.wait()
        assert e.value.status == terse.ERR_INVALID and r.status is None
        with pytest.raises(terse.Error):
            r.test()
        assert r.status is None and r._keep is not None
        with pytest.raises(ValueError, match="in flight"):
            c.encode(x)
        with pytest.raises(ValueError, match="group"):
            c.close()
        comm.group().__exit__(None, None, None)  # ends the outer group
        r.wait()
        assert np.allclose(x, 1.0, atol=0.01)
        c.close()


def test_a_request_holding_the_last_reference_to_its_codec():
    with one_rank() as comm:
        x = np.ones(100, np.float32)
        comm.allreduce_start(x, codec=terse.Codec("int8", 100)).wait()
        comm.allreduce_start(np.ones(100, np.float32), codec=terse.Codec("int8", 100))
    # close() waited for it; nothing hung


def test_allgather_capacity_is_checked():
    with one_rank() as comm:
        with pytest.raises(ValueError, match=">= 0"):
            comm.allgather(b"x", recv_cap=-1)
        with pytest.raises(ValueError, match=">= 0"):
            comm.allgather_start(b"x", recv_cap=-1)
        with pytest.raises(terse.Error) as e:
            comm.allgather(b"xyz", recv_cap=2)
        assert e.value.status == terse.ERR_DST_TOO_SMALL
        assert comm.allgather(b"xyz") == [b"xyz"]


def test_a_codec_freed_by_a_started_request_that_completed_without_wait():
    with one_rank() as comm:
        c = terse.Codec("fp16", 10)
        x = np.ones(10, np.float32)
        comm.allreduce_start(x, codec=c)
        import time
        for _ in range(200):   # the request completes on the progress thread
            try:
                c.encode(x)
                break
            except ValueError:
                time.sleep(0.01)
        else:
            pytest.fail("the codec stayed owned by a request that had completed")
        c.close()


@pytest.mark.parametrize("provider", ["tcp", "shm"])
def test_parameter_server_from_python(ranks, provider):
    res = ranks("comm_worker.py", 3, ["ps", provider]).results()
    srv, w1, w2 = res
    assert srv["is_server"] and not w1["is_server"] and not w2["is_server"]
    assert srv["placement"] == [(5000 + 300) * 4]
    for w in (w1, w2):
        assert abs(w["step1"] - (1 - 0.1 * 1.5)) < 1e-6
        assert abs(w["step2"] - (1 - 0.2 * 1.5)) < 1e-6
        assert abs(w["key1"] - (0 - 0.2 * 1.0)) < 0.01 and w["clock"] == 3
        assert abs(w["step3"] - (1 - 0.2 * 1.5 - 0.1 * 5 / 3)) < 1e-6
        assert w["pushes"] == 5
        assert "key 7 is not declared" in w["badkey"]
    assert w1["digest"] == w2["digest"]     # sync: bitwise identical on every worker
    # the server counts per partition: key 0 is 5 of them, 3 steps, 2 workers
    # (30 pushes, 15 steps); key 1 one, pushed at steps 1 and 2 (4, 2)
    assert srv["applied"] == 34 and srv["closed"] == 17


def test_parameter_server_colocated_from_python(ranks):
    res = ranks("comm_worker.py", 3, ["ps_colocate", "tcp"]).results()
    for w in res:
        assert not w["is_server"]
        assert sum(w["placement"]) == 5000 * 4 and len(w["placement"]) == 3
        assert abs(w["step1"] - (1 - 0.1 * 1.0)) < 1e-6
        assert abs(w["step2"] - (1 - 0.2 * 1.0)) < 1e-6
        assert "executor of its own" in w["serve"]
    assert res[0]["digest"] == res[1]["digest"] == res[2]["digest"]


def test_parameter_server_stale_rules_and_schedule_from_python(ranks):
    srv, w1, w2 = ranks("comm_worker.py", 3, ["ps_rules", "tcp"]).results()
    # the server's arithmetic (include/terse.h): weight 1/2, momentum 0.5,
    # rate 0.5 at steps 0 (versions 0, 1: warm-up) and 1 (version 2:
    # cosine's start). Worker 2's two fresh pushes of 0.25:
    v = 0.5 * 0.25
    x = -0.5 * v
    v = 0.5 * v + 0.5 * 0.25
    x -= 0.5 * v
    assert abs(w2["x"] - x) < 1e-6
    # worker 1's push of 0.5, 2 stale (step: weight / 2), computed at 0 (dc)
    g = 0.5 + 1.0 * 0.5 * 0.5 * (x - 0.0)
    v = 0.5 * v + 0.25 * g
    x -= 0.5 * v
    assert abs(w1["x"] - x) < 1e-6
    assert srv["applied"] == 3 and srv["stale_max"] == 2
    assert srv["dc_copy_bytes"] == 2 * 256 * 4     # each worker's pulled copy
    for r in (srv, w1, w2):
        for name, detail in r.items():
            if name.startswith("bad "):
                assert name[4:] in detail, (name, detail)


def test_ps_aggregator_check_names_what_cannot_hold():
    terse.ps_aggregator_check("median", 1)
    terse.ps_aggregator_check("krum:f=2,m=3", 7)
    with pytest.raises(terse.Error) as e:
        terse.ps_aggregator_check("krum:f=2", 6)
    assert e.value.status == terse.ERR_INVALID and "2f+3 = 7" in e.value.detail
    with pytest.raises(terse.Error) as e:
        terse.ps_aggregator_check("cclip:tau=-1", 8)
    assert "tau=-1" in e.value.detail
    assert terse.ERR_NONFINITE == 21
