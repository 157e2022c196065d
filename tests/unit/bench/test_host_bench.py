"""`python -m bench host` at its smallest size: it runs every eager mode (decode, verify, draft) and the
decode replay, ESS off and on, in one run, and writes a result of the documented structure. No timing is
checked (the machine is shared); only that each number is there, finite and positive where it must be."""
import json
import math

import pytest
import torch

pytest.importorskip("sglang")

from bench import host_bench  # noqa: E402
from bench.meta import RESULTS_ENV  # noqa: E402

SIDES = ("ess_off", "ess_on")


def test_bench_host_writes_every_mode_and_the_replay(tmp_path, monkeypatch):
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path))
    monkeypatch.setattr("sys.argv", ["bench host", "--layers", "1", "--batch", "2", "--reps", "1"])
    threads = torch.get_num_threads()
    try:
        assert host_bench.main() == 0                 # sets torch to one thread (the bench's clock)
    finally:
        torch.set_num_threads(threads)
    res = json.loads((tmp_path / "host_cpu.json").read_text())
    assert res["meta"]["command"] and res["meta"]["commit"] and "sglang" in res["meta"]["versions"]
    assert (res["suite"], res["layers"], res["batch"]) == ("host", 1, 2)
    eager = res["eager"]
    for side in SIDES:
        assert set(eager[side]) == set(host_bench.EAGER_MODES) == {"decode", "verify", "draft"}
        for mode, r in eager[side].items():
            assert r["steps"] == 1, (side, mode)
            assert r["host_us_per_layer_median"] > 0 and r["launches_per_layer"] >= 1, (side, mode, r)
    for mode, ratio in eager["ratio_eager_ess_over_sglang"].items():
        assert math.isfinite(ratio) and ratio > 0, mode
        assert ratio == eager["ess_on"][mode]["host_us_per_layer_median"] / eager["ess_off"][mode][
            "host_us_per_layer_median"]
    rp = res["replay"]["decode"]
    for side in SIDES:
        r = rp[side]
        assert r["replays"] == 1 and r["python_per_layer_in_replay"] == 0
        assert r["pre_replay_us_per_step_median"] > 0 and r["graph_device_ops_per_layer"] >= 1, (side, r)
        assert r["graph_stand_in_launches_per_layer"] >= 1, (side, r)     # attention ran inside the capture
    assert math.isfinite(rp["ratio_pre_replay_ess_over_sglang"])
    assert set(res["not_measured"]) == {"verify_replay", "draft_replay"}
