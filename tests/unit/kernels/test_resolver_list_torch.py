"""The order-list resolver's torch path against the plain OrderedDict LRU oracle, step by step."""
import pytest
import torch

from sgl_ess.store.hot_buffer import DeviceHotBuffer
from sgl_ess.store.resolver import assign
from tests.unit.kernels.lru_scenarios import SCENARIOS, run_scenario


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_torch_path_matches_oracle(name):
    assert run_scenario(name, backends=("torch",)) > 0


def test_token_map_grows_on_demand_without_max_context():
    buf = DeviceHotBuffer(1, 2, 8, "cpu")                 # no max_context_tokens: CPU path only
    a = assign(buf, 0, torch.tensor([0, 1]), torch.tensor([100, 3000]),
               torch.tensor([[99, 5, 99], [2999, 0, -1]]))
    assert buf.token_map.shape[1] >= 3000 and int(buf.token_map.abs().sum()) == 0
    assert a.miss.sum().item() == 4 and a.hit.sum().item() == 0


def test_k_wider_than_hot_slots_is_refused():
    buf = DeviceHotBuffer(1, 1, 4, "cpu")
    with pytest.raises(ValueError, match="hot-slots-per-request"):
        assign(buf, 0, torch.tensor([0]), torch.tensor([50]), torch.arange(5).unsqueeze(0))


def test_triton_backend_needs_a_fixed_token_map():
    buf = DeviceHotBuffer(1, 1, 8, "cpu")
    with pytest.raises(ValueError, match="max_context_tokens"):
        assign(buf, 0, torch.tensor([0]), torch.tensor([50]), torch.tensor([[1, 2]]), backend="triton")
    with pytest.raises(ValueError, match="backend"):
        assign(buf, 0, torch.tensor([0]), torch.tensor([50]), torch.tensor([[1, 2]]), backend="cuda")


def test_reset_empties_state_and_restores_order():
    buf = DeviceHotBuffer(2, 2, 8, "cpu", max_context_tokens=64)
    assign(buf, 1, torch.tensor([1]), torch.tensor([40]), torch.tensor([[3, 9, 30]]))
    buf.reset(1)
    assert int((buf.slot_to_token >= 0).sum()) == 0
    assert torch.equal(buf.lru_order[1, 1], torch.arange(8, dtype=torch.int32))
    assert int((buf.stamps >= 0).sum()) == 0
