"""The learning-augmented LRU fallback: a predictor whose precision drops is switched off (plain LRU,
nothing staged, predictions scored in shadow) and switched back on when it is right again."""
from collections import defaultdict

import numpy as np
import pytest

from sgl_ess.prefetch.precision_gate import PrecisionGate
from sgl_ess.prefetch.predictors import Predictor, as_numpy, pad_rows
from sgl_ess.prefetch.synthetic_trace import SyntheticTraceConfig, generate
from sgl_ess.store.speculative import SpeculativeOptions
from sgl_ess.store.trace_replay import replay


def test_gate_switches_to_lru_below_the_threshold_and_back():
    g = PrecisionGate(min_precision=0.5, window=4)
    for _ in range(3):
        g.record(10, 1, shadow=False)
    assert g.live                                   # the window is not full yet
    g.record(10, 1, shadow=False)
    assert not g.live and g.fallbacks == 1
    g.record(10, 10, shadow=False)                  # a late live outcome after the switch is ignored
    for _ in range(3):
        g.record(10, 9, shadow=True)
    assert not g.live
    g.record(10, 9, shadow=True)
    assert g.live and g.resumes == 1
    s = g.stats()
    assert s["plans_shadow"] == 4 and s["rows_shadow"] == 40 and s["rows_shadow_used"] == 36


def test_gate_at_zero_never_falls_back_and_refuses_bad_settings():
    g = PrecisionGate(min_precision=0.0, window=2)
    for _ in range(10):
        g.record(10, 0, shadow=False)
    assert g.live and g.fallbacks == 0
    with pytest.raises(ValueError, match="--ess-predictor-min-precision"):
        PrecisionGate(min_precision=1.5)


class ScriptedPredictor(Predictor):
    """Knows the trace: predicts the target layer's next selection exactly while the step is in a
    good phase, and positions that are never selected while it is in a bad one."""
    name = "scripted"

    def __init__(self, trace, bad_steps: range):
        super().__init__(None)
        self.sets = defaultdict(list)
        for ev in trace.plans():
            for r, row in zip(ev["reqs"].tolist(), ev["topk"]):
                self.sets[(r, ev["layer"])].append(row[row >= 0])
        used = np.unique(np.concatenate([s for v in self.sets.values() for s in v]))
        self.never = np.setdiff1d(np.arange(int(trace.header["max_context_tokens"]) - 8), used)[:64]
        self.seen = defaultdict(int)
        self.bad_steps = bad_steps

    def predict(self, layer, num_layers, reqs, seq_lens, topk):
        target = (layer + 1) % num_layers
        rows = []
        for r in as_numpy(reqs).tolist():
            self.seen[(r, layer)] += 1
            nxt = self.seen[(r, target)]
            future = self.sets[(r, target)]
            bad = self.seen[(r, 0)] in self.bad_steps
            rows.append(self.never if bad else future[nxt] if nxt < len(future) else np.empty(0, np.int64))
        return target, pad_rows(rows)


def test_stager_falls_back_to_lru_and_resumes_on_a_replayed_trace():
    trace = generate(SyntheticTraceConfig(num_layers=2, topk=16, context_tokens=256, steps=90, requests=1,
                                          hot_slots_per_request=40, seed=3))
    off = replay(trace, "off")
    res = replay(trace, hot_slots=40, spec_rows_per_request=16, predictor=ScriptedPredictor(trace, range(30, 60)),
                 options=SpeculativeOptions(min_precision=0.5, window=8))
    assert res.misses == off.misses                 # speculation never changes the LRU
    g = res.gate
    assert g["fallbacks"] == 1 and g["resumes"] == 1 and g["mode"] == "live", g
    assert g["plans_shadow"] >= 8 and g["rows_shadow_used"] > 0     # the good phase was seen in shadow
    # the bad phase staged at most one window of plans before the gate closed
    assert res.staged - res.used <= 8 * 16
    assert res.used > 0.5 * res.staged
