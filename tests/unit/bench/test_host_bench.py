"""`python -m bench host` at its smallest size: it runs every eager mode (decode, verify, draft) and every
graph replay (decode, verify, draft), ESS off and on, in one run, and writes a result of the documented
structure. No timing is checked (the machine is shared); only that each number is there, finite and positive
where it must be, and that each side ran what it says: ESS off SGLang's own DSA backend (and its own
multi-step draft container), ESS on ESS's CUDA class (and ESS's container), whose graphs were captured once
and replayed through ESS's hook."""
import json
import math

import pytest
import torch

pytest.importorskip("sglang")

from bench import host_bench  # noqa: E402
from bench.meta import RESULTS_ENV  # noqa: E402

SIDES = ("ess_off", "ess_on")


def _name(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("host")
    mp = pytest.MonkeyPatch()
    mp.setenv(RESULTS_ENV, str(out))
    mp.setattr("sys.argv", ["bench host", "--layers", "1", "--batch", "2", "--reps", "1"])
    threads = torch.get_num_threads()
    try:
        assert host_bench.main() == 0                 # sets torch to one thread (the bench's clock)
    finally:
        torch.set_num_threads(threads)
        mp.undo()
    return json.loads((out / "host_cpu.json").read_text())


@pytest.fixture(scope="module")
def classes():
    from sglang.srt.layers.attention import dsa_backend as mod

    from sgl_ess.integration.sglang.backends.cuda_backend import backend_class
    from sgl_ess.integration.sglang.backends.cuda_multistep import multistep_class
    return {"sglang": _name(mod.DeepseekSparseAttnBackend), "sglang_ms": _name(mod.DeepseekSparseAttnMultiStepBackend),
            "ess": _name(backend_class()), "ess_ms": _name(multistep_class())}


def test_bench_host_writes_every_eager_mode_with_both_sides(result, classes):
    res = result
    assert res["meta"]["command"] and res["meta"]["commit"] and "sglang" in res["meta"]["versions"]
    assert (res["suite"], res["layers"], res["batch"]) == ("host", 1, 2)
    assert "not_measured" not in res
    eager = res["eager"]
    for side in SIDES:
        assert set(eager[side]) == set(host_bench.EAGER_MODES) == {"decode", "verify", "draft"}
        for mode, r in eager[side].items():
            assert r["steps"] == 1, (side, mode)
            assert r["host_us_per_layer_median"] > 0 and r["launches_per_layer"] >= 1, (side, mode, r)
            assert r["backend"] == classes["sglang" if side == "ess_off" else "ess"], (side, mode, r["backend"])
    for mode, ratio in eager["ratio_eager_ess_over_sglang"].items():
        assert math.isfinite(ratio) and ratio > 0, mode
        assert ratio == eager["ess_on"][mode]["host_us_per_layer_median"] / eager["ess_off"][mode][
            "host_us_per_layer_median"]


@pytest.mark.parametrize("mode", ["decode", "verify", "draft"])
def test_bench_host_replays_each_mode_with_sglangs_backend_off_and_esss_on(result, classes, mode):
    assert tuple(host_bench.REPLAY_MODES) == ("decode", "verify", "draft")
    rp = result["replay"][mode]
    steps = host_bench.DRAFT_STEPS if mode == "draft" else result["layers"]
    for side in SIDES:
        r = rp[side]
        assert r["replays"] == 1 and r["python_per_layer_in_replay"] == 0, (side, r)
        assert r["layer_steps_per_replay"] == steps, (side, r)
        assert r["pre_replay_us_per_step_median"] > 0, (side, r)
        assert r["pre_replay_us_per_layer_median"] == pytest.approx(r["pre_replay_us_per_step_median"] / steps)
        assert r["graph_device_ops_per_layer"] >= 1, (side, r)
        assert r["graph_stand_in_launches_per_layer"] >= 1, (side, r)     # attention ran inside the capture
    off, on = rp["ess_off"], rp["ess_on"]
    # ESS off: SGLang's own backend (its container for the draft steps), no ESS store in the graph
    assert off["attention_backends"] == [classes["sglang"]], off
    assert off["hooks"] == classes["sglang_ms" if mode == "draft" else "sglang"], off
    assert "ess_graph_replays" not in off
    # ESS on: ESS's class, one capture, every replay (2 warm-up + reps) through ESS's replay hook
    assert on["attention_backends"] == [classes["ess"]], on
    assert on["hooks"] == classes["ess_ms" if mode == "draft" else "ess"], on
    assert on["ess_graph_replays"] == on["replays"] + 2, on
    assert on["graph_device_ops_per_layer"] > off["graph_device_ops_per_layer"], (on, off)   # the store's ops
    ratio = rp["ratio_pre_replay_ess_over_sglang"]
    assert math.isfinite(ratio) and ratio == on["pre_replay_us_per_step_median"] / off["pre_replay_us_per_step_median"]
