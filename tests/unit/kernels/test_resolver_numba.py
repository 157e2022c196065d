"""The numba CPU resolver: every scenario against the LRU oracle step by step, in lockstep with
the torch path (identical slots, flags, slot_to_token, lru_order; token map cleared), and
alternating numba/torch steps on one buffer (they leave the same state)."""
import pytest
import torch

from sgl_ess.store.hot_buffer import DeviceHotBuffer
from sgl_ess.store.resolver import assign
from tests.unit.kernels.lru_scenarios import SCENARIOS, run_scenario

pytest.importorskip("numba")


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_numba_in_lockstep_with_torch(name):
    assert run_scenario(name, backends=("torch", "numba"), lockstep=True) > 0


@pytest.mark.parametrize("name", ("fast_to_slow", "padded_rows", "duplicates_and_padding"))
def test_numba_and_torch_alternating_on_one_buffer(name):
    assert run_scenario(name, backends=("numba", "torch")) > 0


def test_numba_grows_the_token_map_without_max_context():
    buf = DeviceHotBuffer(1, 2, 8, "cpu")
    a = assign(buf, 0, torch.tensor([0, 1]), torch.tensor([100, 3000]),
               torch.tensor([[99, 5, 99], [2999, 0, -1]]), backend="numba")
    assert buf.token_map.shape[1] >= 3000 and int(buf.token_map.abs().sum()) == 0
    assert a.miss.sum().item() == 4 and a.hit.sum().item() == 0


def test_numba_backend_is_the_cpu_default_and_refused_off_the_cpu():
    from sgl_ess.store import LatentStore, StoreConfig

    kw = dict(num_layers=1, row_bytes=16, host_capacity_tokens=256, hot_slots_per_request=8, max_requests=2,
              topk=4, max_context_tokens=256)
    assert LatentStore(StoreConfig(**kw), transfer_backend="torch").resolver_backend == "numba"
    with pytest.raises(ValueError, match="numba"):
        LatentStore(StoreConfig(**kw, device="meta", resolver_backend="numba"), transfer_backend="torch")
