"""terse.torch: the DDP comm hook with 2 real processes (gloo for DDP's own
traffic, terse for the gradients)."""
import pytest

pytest.importorskip("torch")


def run(ranks, scenario, *args, provider="tcp", timeout_ms=20000, expect_ok=True):
    rk = ranks("ddp_worker.py", 2, [scenario] + list(args), torch_dist=True,
               env={"T_PROVIDER": provider, "T_TIMEOUT": str(timeout_ms)})
    return rk, rk.results(expect_ok=expect_ok, timeout=180)


@pytest.mark.parametrize("overlap,spec,dense_below", [("0", "dense", 1024),
                                                      ("1", "dense", 1024),
                                                      ("1", "none:ef=0", 0)])
def test_hook_gives_plain_ddp_gradients_through_the_bucket_rebuild(ranks, overlap, spec,
                                                                   dense_below):
    _, res = run(ranks, "match", overlap, spec, dense_below)
    for r in res:
        assert r["bitwise"] == [True] * 4, r["maxdiff"]
        # one bucket at iteration 0, rebuilt into two before iteration 1
        assert r["buckets"][0] == 1 and r["buckets"][-1] == 2
        if spec.startswith("none"):
            # every weight its own codec at its own offset; biases merged
            assert r["codecs"] == ["0.weight", "4.weight", "6.weight"]
            assert max(r["exchanges"]) >= 4


@pytest.mark.parametrize("provider", ["tcp", "shm"])
def test_overlapped_hook_equals_synchronous_hook(ranks, provider):
    _, res = run(ranks, "overlap", provider=provider)
    assert res[0]["provider"] == ("shm" if provider == "shm" else "net")
    for r in res:
        assert r["digests"][0] == r["digests"][1]
        # per-tensor rule: 0.weight (200 elements) and the biases stay dense
        assert r["codecs"] == ["4.weight", "6.weight"]
        assert r["codec_specs"][0].startswith("int8") and r["codec_specs"][1].startswith("powersgd")
    assert res[0]["digests"] == res[1]["digests"]


@pytest.mark.parametrize("spec", ["int8:ef=1", "topk:ratio=0.01,ef=1", "powersgd:rank=4,ef=1"])
def test_lossy_codec_keeps_ranks_bitwise_equal_and_the_loss_falls(ranks, spec):
    _, res = run(ranks, "lossy", spec)
    assert res[0]["digest"] == res[1]["digest"]
    for r in res:
        first, last = r["losses"][:10], r["losses"][-10:]
        assert sum(last) / 10 < 0.6 * sum(first) / 10, r["losses"]
        assert r["residuals"] >= 1  # error feedback is at work
    # fewer bytes than dense: 60 iterations x ~300k floats x 4 bytes
    assert res[0]["bytes"] < 60 * 4 * 300000 * 0.6


def test_bad_spec_raises_instead_of_hanging(ranks):
    _, res = run(ranks, "badspec", timeout_ms=10000)
    for r in res:
        assert r["construct"][0] == "TERSE_ERR_INVALID" and "bogus" in r["construct"][1]
        assert r["register"][0] == "TERSE_ERR_INVALID" and "out of range" in r["register"][1]
        assert r["backward"] == "RuntimeError"
        assert r["seconds"] < 9  # the timeout is 10 s: it raised, it did not wait
    assert res[1]["error"] == "TERSE_ERR_INVALID" and "k=1000000" in res[1]["backward_msg"]
    # the rank whose spec was fine learns that its peer gave up
    assert res[0]["error"] in ("TERSE_ERR_PEER_LOST", "TERSE_ERR_TIMEOUT")


def test_killed_peer_raises_from_backward_within_the_timeout(ranks):
    rk, res = run(ranks, "kill", timeout_ms=3000, expect_ok=False)
    assert rk.rcs[1] == -9 and rk.rcs[0] == 0, rk.logs()
    r = res[0]
    assert r["backward"] == "RuntimeError"
    assert r["error"] in ("TERSE_ERR_PEER_LOST", "TERSE_ERR_TIMEOUT")
    assert "rank 1" in r["backward_msg"]
    # far below the 60 s default, with room for a machine the suite loads
    assert r["seconds"] < 3.0 + 7.0
    # and every later iteration fails at once: well within one 3 s timeout
    assert r["error"] in r["again"] and r["again_seconds"] < 2.5


def test_state_dict_round_trips(ranks):
    _, res = run(ranks, "ckpt")
    for r in res:
        assert r["states"] == ["4.weight", "6.weight"]
        assert r["a"] == r["b"]      # resumed bitwise from the checkpoint
        assert r["a"] != r["c"]      # and the hook's state is what made it so
    assert res[0]["a"] == res[1]["a"]
