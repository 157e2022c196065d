"""The CUDA graph double (tests/graph_double.py) does what a capture does, and refuses what a
capture refuses: the GPU-fake graph tests rest on it."""

import pytest
import torch

from tests.graph_double import CaptureStreams, Graph, GraphCaptureError


def test_a_replay_reruns_the_ops_on_new_inputs_and_not_the_python():
    x = torch.zeros(4)
    acc = torch.zeros(4)
    calls = []

    def step():
        calls.append(1)
        y = torch.where(x > 0, x * 2, -1.0)        # functional ops: their results land in the kept tensors
        acc.add_(y)                                  # in place: runs again
        return y.view(2, 2)                          # a view of a kept tensor
    g = Graph()
    out = g.capture(step)
    x.copy_(torch.tensor([1.0, -1.0, 3.0, 0.0]))
    g.replay()
    assert calls == [1]
    assert out.reshape(-1).tolist() == [2.0, -1.0, 6.0, -1.0]
    assert acc.tolist() == [2.0, -1.0, 6.0, -1.0]    # the replay only: no kernel ran at capture


def test_a_capture_runs_no_kernel_before_tensors_keep_their_values_new_ones_are_junk():
    x = torch.arange(4.0)
    cache = {}

    def step():
        x.mul_(2)                                   # a kernel on an old tensor: not run at capture
        cache["iota"] = torch.arange(4)             # a tensor made inside the capture: junk until replay
        return x + 1
    g = Graph()
    out = g.capture(step)
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert out.isnan().all() and (cache["iota"] == -3).all()
    g.replay()
    assert x.tolist() == [0.0, 2.0, 4.0, 6.0] and out.tolist() == [1.0, 3.0, 5.0, 7.0]
    assert cache["iota"].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("bad", [
    lambda t: t.sum().item(), lambda t: bool(t.any()), lambda t: t.tolist(), lambda t: torch.equal(t, t),
    lambda t: t[t > 0], lambda t: t.nonzero(), lambda t: torch.tensor([1, 2]),
    lambda t: torch.repeat_interleave(t.long().clamp(min=0)),
])
def test_a_capture_refuses_host_reads_dynamic_shapes_and_host_values(bad):
    t = torch.arange(4.0)
    with pytest.raises(GraphCaptureError):
        Graph().capture(lambda: bad(t))


def test_stream_rules_fork_join_isolation():
    rt = CaptureStreams()
    side = rt.stream("high")
    x = torch.zeros(2)

    def forked_and_joined():
        rt.wait_stream(side, rt.compute)
        rt.launch(side, lambda: x.add_(1))
        rt.wait_stream(rt.compute, side)
    g = Graph(rt)
    g.capture(forked_and_joined)
    g.replay()
    assert x.tolist() == [1.0, 1.0]                   # the replay's add only

    rt1 = CaptureStreams()
    low = rt1.stream("low")
    with pytest.raises(GraphCaptureError, match="never forked"):      # work outside the graph
        Graph(rt1).capture(lambda: rt1.launch(low, lambda: None))
    rt2 = CaptureStreams()
    s2 = rt2.stream("high")

    def unjoined():
        rt2.wait_stream(s2, rt2.compute)
        rt2.launch(s2, lambda: x.add_(1))
    with pytest.raises(GraphCaptureError, match="not joined"):
        Graph(rt2).capture(unjoined)
    rt3 = CaptureStreams()
    s3 = rt3.stream("high")
    rt3.launch(s3, lambda: None)
    ev = rt3.record(s3)
    rt3.finish()
    with pytest.raises(GraphCaptureError, match="outside the capture"):
        Graph(rt3).capture(lambda: rt3.wait_event(rt3.compute, ev))
    rt4 = CaptureStreams()
    rt4.launch(rt4.stream("high"), lambda: None)
    with pytest.raises(GraphCaptureError, match="pending"):
        Graph(rt4).capture(lambda: None)
    rt5 = CaptureStreams()
    s5 = rt5.stream("high")

    def queried():
        rt5.wait_stream(s5, rt5.compute)
        rt5.record(s5).query()
    with pytest.raises(GraphCaptureError, match="queried"):
        Graph(rt5).capture(queried)
