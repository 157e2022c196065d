"""The predictor bench's modelled exposure: speculation that lands lowers the immediate tier's exposed
time, staged rows that do not fit in the spare link time land only in part, and nothing used means
no change."""
import numpy as np

from bench.predictor_bench import exposure, trace_label
from sgl_ess.sim.config import OffloadConfig, SimConfig, WorkloadConfig
from sgl_ess.sim.layer_exposure import LayerExposureModel
from sgl_ess.store.trace_replay import ReplayResult

MODEL = LayerExposureModel(SimConfig(work=WorkloadConfig(context_tokens=32768, mtp=1, batch=64),
                                     ess=OffloadConfig(ratio=0.2, overlap="da")))


def _res(staged, used, misses=(400, 400)):
    z = np.asarray
    return ReplayResult("x", 40, 8, steps=1, plans=2, rows_per_layer=z([1, 1]), misses_per_layer=z(misses),
                        staged_per_layer=z(staged), used_per_layer=z(used))


def test_exposure_falls_with_used_rows_and_is_capped_by_spare_link_time():
    off = _res([0, 0], [0, 0])
    base = exposure(MODEL, off, None, k=2048)
    assert base["exposed_us_per_step_without_spec"] > 0
    assert exposure(MODEL, off, _res([0, 0], [0, 0]), 2048)["exposed_us_per_step_with_spec"] == \
        base["exposed_us_per_step_without_spec"]
    good = exposure(MODEL, off, _res([300, 300], [300, 300]), 2048)
    assert good["exposed_us_per_step_with_spec"] < base["exposed_us_per_step_without_spec"]
    assert good["landed_fraction_mean"] == 1.0
    flood = exposure(MODEL, off, _res([200000, 200000], [300, 300]), 2048)
    assert flood["landed_fraction_mean"] < 1.0
    assert good["exposed_us_per_step_with_spec"] < flood["exposed_us_per_step_with_spec"]


def test_trace_labels_say_what_a_trace_is():
    assert trace_label({"source": "synthetic"}).startswith("synthetic")
    assert "RANDOM WEIGHTS" in trace_label({"source": "server", "model": "/x/sgl_ess/models/tiny_dsv32"})
    assert trace_label({"source": "server", "model": "/m/DeepSeek-V3.2"}).startswith("recorded")
