"""Issue 32 item 7: a decode graph's replay counted its host writes with one scalar add per layer (61 on
DeepSeek-V3.2, each a kernel launch on the GPU) before every replay. EssPoolAdapter.graph_replay now adds
them with one tensor op; the counters still say every layer wrote the replay's real rows."""

import threading
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.pools.pool_adapter import EssPoolAdapter  # noqa: E402
from sgl_ess.obs.counters import StoreCounters  # noqa: E402

LAYERS = 61


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _adapter(counters):
    """What graph_replay touches of an EssPoolAdapter, with the real counters."""
    graphs = SimpleNamespace(replay=lambda size, n_real: {}, width=lambda size: 2)
    store = SimpleNamespace(counters=counters, graph_boundary=lambda: None)
    return SimpleNamespace(has_pending=lambda: False, _lock=threading.Lock(), _end_capture=lambda: None,
                           store=store, graphs=graphs, layers=LAYERS, _host_counts=lambda: {},
                           _set_counts=lambda c: None)


def test_a_replay_counts_every_layers_writes_with_one_op():
    counters = StoreCounters(LAYERS, 8, 656, torch.device("cpu"))
    fake = _adapter(counters)
    fake.note_host_write = lambda layer, rows: counters.add_d2h(layer, rows)
    with CountOps() as mode:
        EssPoolAdapter.graph_replay(fake, None, 4, 3)
    assert counters.rows_d2h.tolist() == [3 * 2] * LAYERS        # n_real x the graph's rows per request
    adds = [op for op in mode.ops if "add" in op]
    assert len(adds) <= 1, f"{len(adds)} adds before a replay of a {LAYERS}-layer model: {adds[:3]} ..."
