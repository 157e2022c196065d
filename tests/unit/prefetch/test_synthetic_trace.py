"""The synthetic trace generator: the adjacent-step overlap and the miss-profile peak MEASURED from the
generated trace match what it was configured for (the configured values are inputs), and the trace
says it is synthetic."""
import numpy as np
import pytest

from sgl_ess.prefetch.synthetic_trace import SyntheticTraceConfig, generate, layer_overlap
from sgl_ess.prefetch.trace_format import FORMAT, read_trace, write_trace
from sgl_ess.prefetch.trace_stats import adjacent_overlap, lru_misses
from tests.unit.prefetch.scratch import scratch  # noqa: F401 (a fixture)

SMALL = dict(topk=64, context_tokens=1024, steps=40, requests=2, hot_slots_per_request=205)


def _peak(misses: np.ndarray, first: int) -> int:
    smooth = np.convolve(misses, np.ones(3) / 3, mode="same")
    return first + int(np.argmax(smooth[first:-1]))


def test_deepseek_v32_targets_are_what_the_trace_measures():
    cfg = SyntheticTraceConfig(**SMALL)
    trace = generate(cfg)
    measured = adjacent_overlap(trace)
    configured = layer_overlap(cfg)
    assert configured[0] == configured[1] == 0.015                  # the GVR study: layers 0-1
    assert abs(configured[20:].mean() - 0.44) < 0.01 and configured[20:].min() >= 0.35 and configured[20:].max() <= 0.5
    np.testing.assert_allclose(measured, configured, atol=0.03)      # per layer
    assert abs(measured[:2].mean() - 0.015) < 0.01                   # per band
    assert abs(measured[20:].mean() - 0.44) < 0.02
    assert 0.35 <= measured[20:].min() and measured[20:].max() <= 0.52
    assert abs(_peak(lru_misses(trace), 2) - 17) <= 2                # the ESS paper: misses peak near layer 17


def test_other_targets_are_met_too():
    """The check follows the configuration, not constants: other overlaps and another peak layer."""
    cfg = SyntheticTraceConfig(num_layers=40, low_overlap=0.1, low_layers=3, high_overlap=0.7, high_spread=0.02,
                               high_from=10, peak_layer=28, seed=5, **SMALL)
    trace = generate(cfg)
    np.testing.assert_allclose(adjacent_overlap(trace), layer_overlap(cfg), atol=0.03)
    assert abs(_peak(lru_misses(trace), cfg.low_layers) - 28) <= 2


def test_the_trace_is_labelled_synthetic_and_round_trips(scratch):
    cfg = SyntheticTraceConfig(num_layers=3, topk=16, context_tokens=128, steps=5, requests=2, hot_slots_per_request=40)
    trace = generate(cfg)
    assert trace.header["source"] == "synthetic" and "SYNTHETIC" in trace.header["note"]
    assert trace.header["synthetic"]["steps"] == 5 and trace.header["format"] == FORMAT
    path = str(scratch / "t.jsonl")
    write_trace(path, trace)
    back = read_trace(path)
    assert back.header == trace.header and len(back.events) == len(trace.events)
    for a, b in zip(back.events, trace.events):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]))
    kinds = [e["ev"] for e in back.events]
    assert kinds[:2] == ["open", "open"] and kinds.count("warmup") == 3 and kinds.count("plan") == 15
    assert kinds[-2:] == ["close", "close"]


def test_bad_configurations_and_files_are_refused(scratch):
    with pytest.raises(ValueError, match="at least 4 x topk"):
        SyntheticTraceConfig(topk=512, context_tokens=1024)
    bad = scratch / "bad.jsonl"
    bad.write_text('{"format": "something/2"}\n')
    with pytest.raises(ValueError, match="expected 'sgl_ess.topk_trace/1'"):
        read_trace(str(bad))
