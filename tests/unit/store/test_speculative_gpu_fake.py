"""The speculative tier on a device-ordered engine (issue 19: predictors on CUDA), as GPU fakes: the
side-stream engine with its streams late and out of order (tests/stream_doubles.py), torch kernels.

  * the stager reads no device value on the host (no item(), no data-dependent shape) while it
    predicts, stages and claims - what would sync a CUDA step every layer;
  * the precision gate still acts, fed its counts through a HostFeed a window late;
  * HostFeed hands entries over only after their copy's event completed, in order;
  * the last layer's prediction for layer 0 never lands in rows the last layer is still reading
    (an odd layer count, as DeepSeek-V3.2's 61): failed on the main of 2026-12-02 on every engine.
"""
import pytest
import torch

from sgl_ess.prefetch.predictors import Predictor
from sgl_ess.store.host_feed import HostFeed
from sgl_ess.store.speculative import SpeculativeStager
from tests.host_reads import watch
from tests.unit.store import test_overlap_levels as loop

@pytest.mark.parametrize("predictor", ["next_layer", "score_ema"])
def test_gpu_fake_stager_reads_no_device_value_on_the_host(predictor, monkeypatch):
    watcher = watch(monkeypatch)
    calls = {"after_plan": 0, "claim": 0}
    for name in calls:
        fn = getattr(SpeculativeStager, name)

        def wrapped(self, *a, _fn=fn, _name=name, **k):
            if not self._ordered:
                return _fn(self, *a, **k)
            calls[_name] += 1
            with watcher:
                return _fn(self, *a, **k)

        monkeypatch.setattr(SpeculativeStager, name, wrapped)
    snap, _, _ = loop._run("da", engine="stream_gpu_fake", seed=3, speculative=predictor, cross_layer=0.7)
    assert calls["after_plan"] > 0 and calls["claim"] > 0
    assert snap["prefetch"]["speculative"]["rows_staged"] > 0
    assert watcher.seen == [], f"the stager read device values on the host: {sorted(set(watcher.seen))}"


class _Wrong(Predictor):
    """Predicts each request's newest 4 positions for the next layer: rows the loop writes into the
    hot buffer as they are produced (reserve), so never a miss there - precision 0."""
    name = "wrong"
    host_inputs = False

    def predict(self, layer, num_layers, reqs, seq_lens, topk):
        if layer + 1 >= num_layers:
            return None
        return layer + 1, torch.arange(4, device=topk.device).expand(topk.shape[0], 4) + seq_lens.unsqueeze(1) - 4


def test_gpu_fake_precision_gate_falls_back_from_counts_read_a_window_late(monkeypatch):
    """Nothing the wrong predictor names is ever a miss (precision 0): the gate must fall back to
    plain LRU although its counts reach the host only through the HostFeed."""
    from sgl_ess.store import latent_store

    real = latent_store.make_predictor
    monkeypatch.setattr(latent_store, "make_predictor", lambda name, ctx=None: _Wrong(ctx) if name == "next_layer"
                        else real(name, ctx))
    seen = {}
    orig = SpeculativeStager.stats

    def stats(self):
        s = orig(self)
        seen.update(s)
        return s

    monkeypatch.setattr(SpeculativeStager, "stats", stats)
    monkeypatch.setattr(loop, "STEPS", 40)
    loop._run("none", engine="stream_gpu_fake", seed=4, speculative="next_layer")
    gate = seen["gate"]
    assert seen["predictor"] == "wrong" and gate["fallbacks"] >= 1 and gate["mode"] == "lru_fallback"
    assert gate["plans_live"] >= gate["window"]


class _Event:
    def __init__(self):
        self.finished = False

    def query(self):
        return self.finished


class _Runtime:
    def __init__(self):
        self.events = []

    def current(self):
        return "compute"

    def record(self, stream):
        self.events.append(_Event())
        return self.events[-1]


def test_host_feed_hands_over_only_landed_copies_in_order():
    rt = _Runtime()
    feed = HostFeed(rt, "cpu")
    a, b = torch.arange(3), torch.arange(5)
    feed.push("a", (a,))
    feed.push("b", (b,))
    a += 100                                     # the feed holds a copy made at push time
    assert feed.ready() == [] and len(feed) == 2
    rt.events[1].finished = True                 # the newer copy landed first: still held back
    assert feed.ready() == []
    rt.events[0].finished = True
    got = feed.ready()
    assert [k for k, _ in got] == ["a", "b"] and got[0][1][0].tolist() == [0, 1, 2]
    assert feed.pushed == 2 and feed.delivered == 2 and len(feed) == 0
    feed.push("c", (a,))
    feed.clear()
    assert feed.ready() == [] and len(feed) == 0


def test_host_feed_without_streams_is_ready_at_once():
    feed = HostFeed(None, "cpu")
    feed.push(1, (torch.ones(2),))
    assert [k for k, _ in feed.ready()] == [1]


@pytest.mark.parametrize("engine", ["inline", "stream_gpu_fake"])
@pytest.mark.parametrize("mode", ["none", "da", "dba"])
def test_wrapping_prediction_never_lands_in_rows_still_being_read(engine, mode):
    """With an odd layer count the last layer's prediction for the next step's layer 0 has the
    last layer's parity; it was staged (after_plan) between that layer's claim and its commit,
    into the rows its attention was about to read."""
    assert loop.LAYERS % 2 == 1
    snap, _, _ = loop._run(mode, engine=engine, seed=5, speculative="score_ema", cross_layer=0.7)
    assert snap["prefetch"]["speculative"]["rows_used"] > 0


@pytest.mark.parametrize("mode", ["none", "dba"])
def test_gpu_fake_host_predictor_learns_late_and_still_stages_for_the_next_layer(mode):
    """On a GPU the top-k of layer l reaches the host a few layers later. A host predictor
    (score_ema) then learns late but still forecasts the layer about to run, for its micro-batch's
    latest batch: its stagings are used about as well as with no lag (same trace). Forecasting from
    each late plan for that plan's own next layer instead (mostly planned already) dropped DBA's
    precision to a fifth in this loop."""
    def run(lag):
        snap, _, _ = loop._run(mode, engine="stream_gpu_fake", seed=6, speculative="score_ema", cross_layer=0.7,
                               host_lag=lag)
        return snap["prefetch"]["speculative"]

    late, now = run(2), run(0)
    assert late["lagged_inputs"]["in_flight"] > 0 and now["lagged_inputs"]["in_flight"] == 0
    assert late["rows_staged"] > 0 and late["rows_used"] > 0
    assert late["precision"] >= 0.8 * now["precision"]
